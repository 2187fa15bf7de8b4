//! The scheduler: runs scheduling profiles over a snapshot of endpoints.

use std::{
    cell::RefCell,
    sync::Arc,
    time::{Duration, Instant},
};

use rand::{SeedableRng, rngs::SmallRng};

use crate::{
    Candidate, CycleContext, CycleState, DataProducer, Endpoint, EndpointSnapshot,
    InferenceRequest, InflightAccounting, LatencyPrediction, Plugin, PluginRef, ProfileHandler,
    RequestOutcome, ResponseHeaderSink, ResponseTiming, Result, RouteEdits, SchedulingError, Usage,
    observe::{CallSite, CycleRecorder, ExtensionPoint, Laps, ProfileRun, SchedulerObserver},
};

/// A scorer and its weight in a profile.
#[derive(Debug, Clone)]
pub struct WeightedScorer {
    /// The scorer plugin.
    pub plugin: PluginRef,
    /// Its weight (default 1).
    pub weight: f64,
}

/// A named pipeline: filters in order, weighted scorers, one picker.
#[derive(Debug, Clone)]
pub struct SchedulingProfile {
    name: String,
    filters: Vec<PluginRef>,
    scorers: Vec<WeightedScorer>,
    picker: Option<PluginRef>,
}

impl SchedulingProfile {
    /// An empty profile.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            filters: Vec::new(),
            scorers: Vec::new(),
            picker: None,
        }
    }

    /// Appends a filter (the plugin must implement [`crate::Filter`]).
    #[must_use]
    pub fn with_filter(mut self, plugin: PluginRef) -> Self {
        self.filters.push(plugin);
        self
    }

    /// Appends a scorer (the plugin must implement [`crate::Scorer`]).
    #[must_use]
    pub fn with_scorer(mut self, plugin: PluginRef, weight: f64) -> Self {
        self.scorers.push(WeightedScorer { plugin, weight });
        self
    }

    /// Sets the picker (the plugin must implement [`crate::Picker`]).
    #[must_use]
    pub fn with_picker(mut self, plugin: PluginRef) -> Self {
        self.picker = Some(plugin);
        self
    }

    /// The profile's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Filters in order.
    #[must_use]
    pub fn filters(&self) -> &[PluginRef] {
        &self.filters
    }

    /// Weighted scorers.
    #[must_use]
    pub fn scorers(&self) -> &[WeightedScorer] {
        &self.scorers
    }

    /// The picker.
    #[must_use]
    pub fn picker(&self) -> Option<&PluginRef> {
        self.picker.as_ref()
    }

    fn check(&self) -> Result<()> {
        let bad = |role: &str, p: &PluginRef| {
            SchedulingError::Invalid(format!(
                "profile {:?}: plugin {:?} ({}) is not a {role}",
                self.name,
                p.plugin().name(),
                p.plugin().type_name()
            ))
        };
        for f in &self.filters {
            f.plugin().as_filter().ok_or_else(|| bad("filter", f))?;
        }
        for s in &self.scorers {
            s.plugin
                .plugin()
                .as_scorer()
                .ok_or_else(|| bad("scorer", &s.plugin))?;
            if !s.weight.is_finite() || s.weight < 0.0 {
                return Err(SchedulingError::Invalid(format!(
                    "profile {:?}: scorer {:?} has weight {}, expected a finite number >= 0",
                    self.name,
                    s.plugin.plugin().name(),
                    s.weight
                )));
            }
        }
        let picker = self.picker.as_ref().ok_or_else(|| {
            SchedulingError::Invalid(format!("profile {:?} has no picker", self.name))
        })?;
        picker
            .plugin()
            .as_picker()
            .ok_or_else(|| bad("picker", picker))?;
        Ok(())
    }
}

/// What one profile run chose.
#[derive(Debug, Clone, Default)]
pub struct ProfilePicks {
    /// Index of the profile in the scheduler.
    pub profile: usize,
    /// Chosen endpoints, target first then fallbacks; empty if the profile's
    /// filters removed every candidate.
    pub targets: Vec<Arc<Endpoint>>,
    /// Weighted total score of each target (same order).
    pub scores: Vec<f64>,
    /// Whether any candidate this profile scored (after its filters) matched
    /// at least one prefix block in the cycle's prefix matches.
    pub prefix_hit: bool,
    /// The same for every prefix-match set: bit `k` for slot `k`
    /// ([`crate::CycleState::prefix_at`]; bit 0 is `prefix_hit`). Read it
    /// with [`Self::prefix_hit_in`].
    pub prefix_hits: u64,
}

impl ProfilePicks {
    /// Whether a candidate this profile scored matched a block in the
    /// cycle's prefix-match set `slot`.
    #[must_use]
    pub fn prefix_hit_in(&self, slot: usize) -> bool {
        if slot == 0 {
            return self.prefix_hit;
        }
        slot < 64 && self.prefix_hits & (1 << slot) != 0
    }
}

/// The outcome of scheduling one request.
#[derive(Debug, Clone, Default)]
pub struct SchedulingResult {
    /// Each profile run, in the order they ran.
    pub runs: Vec<ProfilePicks>,
    /// Index into `runs` of the run holding the primary target.
    pub primary: usize,
    /// Fraction of the prompt's prefix blocks the primary target holds by the
    /// cycle's prefix match, in `[0, 1]`; 0 when no prefix producer ran.
    pub primary_prefix_hit: f64,
    /// What the profile handler adds to the forwarded request
    /// ([`crate::ProfileHandler::route`]).
    pub edits: RouteEdits,
    /// As [`Self::primary_prefix_hit`], for the prefill pick of a P/D
    /// decision (0 without one).
    pub prefill_prefix_hit: f64,
    /// The primary target's latency prediction in the cycle that picked it
    /// (`None` when no predictor ran or it predicted nothing for it):
    /// what the request was routed by, which its response is compared with.
    pub primary_prediction: Option<LatencyPrediction>,
}

impl SchedulingResult {
    /// The primary target endpoint.
    #[must_use]
    pub fn primary(&self) -> Option<&Arc<Endpoint>> {
        self.runs.get(self.primary)?.targets.first()
    }

    /// The primary run (target and fallbacks in preference order).
    #[must_use]
    pub fn primary_run(&self) -> Option<&ProfilePicks> {
        self.runs.get(self.primary)
    }

    fn clear(&mut self) {
        // Keep the inner vectors' capacity for the next cycle.
        for run in &mut self.runs {
            run.targets.clear();
            run.scores.clear();
            run.prefix_hit = false;
            run.prefix_hits = 0;
        }
        self.primary = 0;
        self.primary_prefix_hit = 0.0;
        self.prefill_prefix_hit = 0.0;
        self.primary_prediction = None;
        self.edits.clear();
    }

    /// The endpoint a prefill stage picked (P/D disaggregation), if one ran.
    #[must_use]
    pub fn prefill(&self) -> Option<&Arc<Endpoint>> {
        self.runs.get(self.edits.prefill_run?)?.targets.first()
    }
}

/// Reusable buffers for scheduling cycles. One per thread is enough; the
/// scheduler keeps one per thread itself unless the caller passes its own
/// (e.g. a seeded one in tests).
#[derive(Debug)]
pub struct Scratch {
    rng: SmallRng,
    state: CycleState,
    /// Every endpoint of the last snapshot as a candidate, kept across
    /// cycles with the metrics version it was loaded at: refreshing it costs
    /// a pointer compare and a plain load per endpoint, and reference-count
    /// traffic only for what changed.
    pool: Vec<Candidate>,
    /// The candidates when the request's subset or staleness narrows the pool.
    base: Vec<Candidate>,
    candidates: Vec<Candidate>,
    totals: Vec<f64>,
    partial: Vec<f64>,
    picks: Vec<usize>,
    used_runs: usize,
}

impl Scratch {
    /// Buffers with randomness seeded from the OS.
    #[must_use]
    pub fn new() -> Self {
        Self::with_rng(SmallRng::from_os_rng())
    }

    /// Buffers with deterministic randomness.
    #[must_use]
    pub fn seeded(seed: u64) -> Self {
        Self::with_rng(SmallRng::seed_from_u64(seed))
    }

    fn with_rng(rng: SmallRng) -> Self {
        Self {
            rng,
            state: CycleState::default(),
            pool: Vec::new(),
            base: Vec::new(),
            candidates: Vec::new(),
            totals: Vec::new(),
            partial: Vec::new(),
            picks: Vec::new(),
            used_runs: 0,
        }
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `f` over every endpoint of `snapshot` as candidates, outside any
/// request (no request, this thread's scratch when it is free).
fn over_pool<R>(
    snapshot: &EndpointSnapshot,
    f: impl Fn(&CycleContext<'_>, &[Candidate]) -> R,
) -> R {
    static NO_REQUEST: std::sync::LazyLock<InferenceRequest> =
        std::sync::LazyLock::new(InferenceRequest::default);
    let measure = |scratch: &mut Scratch| {
        let Scratch {
            rng, state, pool, ..
        } = scratch;
        refresh_pool(pool, snapshot.endpoints());
        let cx = CycleContext {
            request: &NO_REQUEST,
            now: Instant::now(),
            rng,
            state,
        };
        f(&cx, pool)
    };
    let borrowed = SCRATCH.with(|cell| cell.try_borrow_mut().ok().map(|mut s| measure(&mut s)));
    borrowed.unwrap_or_else(|| measure(&mut Scratch::new()))
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// Runs profiles over endpoints. Cheap to share (`Arc<Scheduler>`); all
/// methods take `&self`.
#[derive(Debug)]
pub struct Scheduler {
    profiles: Vec<SchedulingProfile>,
    handler: Arc<dyn Plugin>,
    producers: Vec<PluginRef>,
    admitters: Vec<PluginRef>,
    pre_request: Vec<PluginRef>,
    deferred: Vec<PluginRef>,
    holds: Vec<PluginRef>,
    response: Vec<PluginRef>,
    saturation: Option<PluginRef>,
    staleness: Option<Duration>,
    observer: Option<Arc<dyn SchedulerObserver>>,
    replicas: Option<Arc<dyn crate::replicas::ReplicaFeed>>,
    /// The first hook plugin's [`Plugin::inflight_accounting`].
    inflight: Option<InflightAccounting>,
}

impl Scheduler {
    /// A scheduler for `profiles`, combined by `handler` (which must implement
    /// [`ProfileHandler`]).
    ///
    /// # Errors
    /// When a profile lacks a picker, a plugin is used in a role it does not
    /// implement, or the handler is not a profile handler.
    pub fn new(profiles: Vec<SchedulingProfile>, handler: Arc<dyn Plugin>) -> Result<Self> {
        if profiles.is_empty() {
            return Err(SchedulingError::Invalid("no scheduling profile".into()));
        }
        for p in &profiles {
            p.check()?;
        }
        if handler.as_profile_handler().is_none() {
            return Err(SchedulingError::Invalid(format!(
                "plugin {:?} ({}) is not a profile handler",
                handler.name(),
                handler.type_name()
            )));
        }
        Ok(Self {
            profiles,
            handler,
            producers: Vec::new(),
            admitters: Vec::new(),
            pre_request: Vec::new(),
            deferred: Vec::new(),
            holds: Vec::new(),
            response: Vec::new(),
            saturation: None,
            staleness: None,
            observer: None,
            replicas: None,
            inflight: None,
        })
    }

    /// Adds plugins whose hooks run around each cycle: data producers run
    /// before the profiles, then admitters (any may refuse the request),
    /// pre-request hooks after a decision, deferred work when the host asks
    /// for it ([`Self::run_deferred`]), response hooks when the edge reports
    /// the response (see [`Self::response_hooks`]). A plugin that plays none
    /// of these roles is ignored.
    ///
    /// Producers run in the order given, except that pure producers (not also
    /// scorers) run before scorers that produce their own data: a declared
    /// `approx-prefix-cache-producer` fills the prefix state before a
    /// `prefix-cache-scorer` would compute it again; and producers that read
    /// prefix matches ([`Plugin::prefix_match_source`]) without producing
    /// them run after both.
    #[must_use]
    pub fn with_hooks(mut self, plugins: impl IntoIterator<Item = PluginRef>) -> Self {
        for p in plugins {
            if p.plugin().as_data_producer().is_some() {
                self.producers.push(p.clone());
            }
            if p.plugin().as_admitter().is_some() {
                self.admitters.push(p.clone());
            }
            if p.plugin().as_request_hold().is_some() {
                self.holds.push(p.clone());
            }
            if p.plugin().as_pre_request().is_some() {
                self.pre_request.push(p.clone());
            }
            if p.plugin().as_deferred_work().is_some() {
                self.deferred.push(p.clone());
            }
            if self.inflight.is_none() {
                self.inflight = p.plugin().inflight_accounting();
            }
            if p.plugin().as_response_hooks().is_some() {
                self.response.push(p);
            }
        }
        // Stable: keeps declaration order within each group. Producers that
        // read prefix matches without producing them (a latency predictor)
        // run last, once the matches exist.
        // Token producers run first: prefix producers may read the tokens.
        self.producers.sort_by_key(|p| {
            let plugin = p.plugin();
            let producer = plugin.as_data_producer();
            let produces_prefix = producer.is_some_and(DataProducer::produces_prefix_matches);
            if producer.is_some_and(DataProducer::produces_tokens) {
                0
            } else if plugin.prefix_match_source().is_some() && !produces_prefix {
                3
            } else {
                1 + u8::from(plugin.as_scorer().is_some())
            }
        });
        self
    }

    /// How dispatches count their tokens in the endpoints' in-flight
    /// counters: as the first hook plugin that asks
    /// ([`Plugin::inflight_accounting`]), else the default (a request's
    /// prompt tokens count until its response ends, no output estimate).
    #[must_use]
    pub fn inflight_accounting(&self) -> InflightAccounting {
        self.inflight.unwrap_or_default()
    }

    /// Whether a plugin may hold requests before scheduling
    /// ([`crate::RequestHold`]).
    #[must_use]
    pub fn holds_requests(&self) -> bool {
        !self.holds.is_empty()
    }

    /// The instant until which `request` must wait before it is scheduled
    /// (the latest any [`crate::RequestHold`] asks for), or `None`.
    #[must_use]
    pub fn hold_until(&self, request: &InferenceRequest, now: Instant) -> Option<Instant> {
        self.holds
            .iter()
            .filter_map(|p| p.plugin().as_request_hold()?.hold(request, now))
            .max()
    }

    /// Sets the saturation detector: sheddable requests are refused with
    /// [`SchedulingError::Saturated`] while it reports saturation.
    ///
    /// # Errors
    /// When the plugin is not a saturation detector.
    pub fn with_saturation_detector(mut self, plugin: PluginRef) -> Result<Self> {
        if plugin.plugin().as_saturation_detector().is_none() {
            return Err(SchedulingError::Invalid(format!(
                "plugin {:?} is not a saturation detector",
                plugin.plugin().name()
            )));
        }
        self.saturation = Some(plugin);
        Ok(self)
    }

    /// Endpoints whose metrics are older than `threshold` (or never scraped)
    /// are dropped from the candidates whenever a fresher endpoint exists.
    #[must_use]
    pub fn with_staleness_threshold(mut self, threshold: Duration) -> Self {
        self.staleness = Some(threshold);
        self
    }

    /// Reports the duration of every plugin call to `observer`, by index into
    /// [`Self::call_sites`]. Without an observer no clock is read for plugins.
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn SchedulerObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Tells `feed` whenever a [`crate::Dispatch`] of this scheduler changes
    /// an endpoint's in-flight counts, for the other replicas (see
    /// [`crate::replicas`]).
    #[must_use]
    pub fn with_replica_feed(mut self, feed: Arc<dyn crate::replicas::ReplicaFeed>) -> Self {
        self.replicas = Some(feed);
        self
    }

    /// The feed [`Self::with_replica_feed`] set.
    #[must_use]
    pub fn replica_feed(&self) -> Option<&Arc<dyn crate::replicas::ReplicaFeed>> {
        self.replicas.as_ref()
    }

    /// Every place a plugin is called from, in a fixed order; the index of a
    /// site is what a [`SchedulerObserver`] receives. A plugin playing several
    /// roles (or used in several profiles) has one site per call.
    #[must_use]
    pub fn call_sites(&self) -> Vec<CallSite> {
        let site = |point, plugin: &PluginRef| CallSite {
            point,
            plugin: plugin.clone(),
        };
        let mut out = vec![site(
            ExtensionPoint::ProfilePicker,
            &PluginRef(Arc::clone(&self.handler)),
        )];
        out.extend(
            self.saturation
                .iter()
                .map(|p| site(ExtensionPoint::SaturationDetector, p)),
        );
        out.extend(
            self.producers
                .iter()
                .map(|p| site(ExtensionPoint::DataProducer, p)),
        );
        out.extend(
            self.admitters
                .iter()
                .map(|p| site(ExtensionPoint::Admitter, p)),
        );
        for profile in &self.profiles {
            out.extend(
                profile
                    .filters
                    .iter()
                    .map(|p| site(ExtensionPoint::Filter, p)),
            );
            out.extend(
                profile
                    .scorers
                    .iter()
                    .map(|s| site(ExtensionPoint::Scorer, &s.plugin)),
            );
            out.extend(
                profile
                    .picker
                    .iter()
                    .map(|p| site(ExtensionPoint::Picker, p)),
            );
        }
        out.extend(
            self.pre_request
                .iter()
                .map(|p| site(ExtensionPoint::PreRequest, p)),
        );
        out.extend(
            self.response
                .iter()
                .map(|p| site(ExtensionPoint::ResponseReceived, p)),
        );
        out.extend(
            self.response
                .iter()
                .map(|p| site(ExtensionPoint::ResponseComplete, p)),
        );
        out
    }

    /// First call site of the data producers.
    fn producer_sites(&self) -> usize {
        1 + usize::from(self.saturation.is_some())
    }

    /// First call site of profile `pi` (of the pre-request hooks when `pi`
    /// is the number of profiles).
    fn profile_sites(&self, pi: usize) -> usize {
        self.producer_sites()
            + self.producers.len()
            + self.admitters.len()
            + self.profiles[..pi.min(self.profiles.len())]
                .iter()
                .map(|p| p.filters.len() + p.scorers.len() + 1)
                .sum::<usize>()
    }

    /// Plugins with response hooks, for the edge to call as responses arrive
    /// (prefer [`Self::response_received`] and [`Self::response_complete`],
    /// which also time the calls).
    pub fn response_hooks(&self) -> impl Iterator<Item = &dyn crate::ResponseHooks> {
        self.response
            .iter()
            .filter_map(|p| p.plugin().as_response_hooks())
    }

    /// Runs every response hook for response headers from `endpoint`, letting
    /// them add headers for the client to `out`.
    pub fn response_received(
        &self,
        request: &InferenceRequest,
        endpoint: &Endpoint,
        status: u16,
        headers: &[(String, String)],
        out: &mut dyn ResponseHeaderSink,
    ) {
        if self.response.is_empty() {
            return;
        }
        let first = self.profile_sites(self.profiles.len()) + self.pre_request.len();
        let mut laps = Laps::now(self.observer.as_deref());
        for (i, hook) in self.response_hooks().enumerate() {
            hook.response_headers(request, endpoint, status, headers);
            hook.add_response_headers(request, endpoint, out);
            laps.lap(first + i);
        }
    }

    /// Runs every response hook for the end of a request: the usage read
    /// from the response (if any), the timing (when the response
    /// completed), then the outcome.
    pub fn response_complete(
        &self,
        request: &InferenceRequest,
        endpoint: &Endpoint,
        usage: Option<&Usage>,
        timing: Option<&ResponseTiming>,
        outcome: RequestOutcome,
    ) {
        if self.response.is_empty() {
            return;
        }
        let first =
            self.profile_sites(self.profiles.len()) + self.pre_request.len() + self.response.len();
        let mut laps = Laps::now(self.observer.as_deref());
        for (i, hook) in self.response_hooks().enumerate() {
            if let Some(u) = usage {
                hook.response_usage(request, endpoint, u);
            }
            if let Some(t) = timing {
                hook.response_timing(request, endpoint, t);
            }
            hook.request_completed(request, endpoint, outcome);
            laps.lap(first + i);
        }
    }

    /// The profiles.
    #[must_use]
    pub fn profiles(&self) -> &[SchedulingProfile] {
        &self.profiles
    }

    /// Schedules `request` over `snapshot`, using this thread's buffers.
    ///
    /// # Errors
    /// See [`SchedulingError`].
    pub fn schedule(
        &self,
        request: &InferenceRequest,
        snapshot: &EndpointSnapshot,
    ) -> Result<SchedulingResult> {
        let mut result = SchedulingResult::default();
        let borrowed = SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                Some(self.schedule_into(request, snapshot, &mut scratch, &mut result))
            }
            Err(_) => None,
        });
        match borrowed {
            Some(r) => r.map(|()| result),
            // Re-entered from a plugin: use fresh buffers rather than fail.
            None => self
                .schedule_into(request, snapshot, &mut Scratch::new(), &mut result)
                .map(|()| result),
        }
    }

    /// Schedules `request` as [`Self::schedule`] does, telling `recorder`
    /// when each plugin call and each profile run started and ended (for a
    /// traced request) and, when it asks, what each filter kept, each scorer
    /// gave and each picker chose ([`CycleRecorder`]). The decision is the
    /// same as unrecorded.
    ///
    /// # Errors
    /// See [`SchedulingError`].
    pub fn schedule_recorded(
        &self,
        request: &InferenceRequest,
        snapshot: &EndpointSnapshot,
        recorder: &mut dyn CycleRecorder,
    ) -> Result<SchedulingResult> {
        let mut result = SchedulingResult::default();
        let borrowed = SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => Some(self.run_cycle(
                request,
                snapshot,
                &mut scratch,
                &mut result,
                Some(&mut *recorder),
            )),
            Err(_) => None,
        });
        match borrowed {
            Some(r) => r.map(|()| result),
            None => self
                .run_cycle(
                    request,
                    snapshot,
                    &mut Scratch::new(),
                    &mut result,
                    Some(recorder),
                )
                .map(|()| result),
        }
    }

    /// The saturation detector's reading of the whole pool now (flow
    /// control's gate): `None` when `snapshot` has no endpoint, `0.0` when
    /// no detector is set.
    #[must_use]
    pub fn pool_saturation(&self, snapshot: &EndpointSnapshot) -> Option<f64> {
        if snapshot.is_empty() {
            return None;
        }
        let Some(det) = self
            .saturation
            .as_ref()
            .and_then(|p| p.plugin().as_saturation_detector())
        else {
            return Some(0.0);
        };
        Some(over_pool(snapshot, |cx, pool| det.saturation(cx, pool)))
    }

    /// The saturation detector's name and how many of `snapshot`'s
    /// endpoints it scores as saturated because their metrics are missing
    /// or stale ([`crate::SaturationDetector::stale_endpoints`]). `None` without a
    /// detector, or when it does not judge staleness.
    #[must_use]
    pub fn pool_stale_endpoints(&self, snapshot: &EndpointSnapshot) -> Option<(&str, usize)> {
        let plugin = self.saturation.as_ref()?.plugin();
        let det = plugin.as_saturation_detector()?;
        let stale = over_pool(snapshot, |cx, pool| det.stale_endpoints(cx, pool))?;
        Some((plugin.name(), stale))
    }

    /// Runs the work plugins left from decisions already made for after
    /// their replies ([`crate::DeferredWork`]). A server calls it once it has
    /// written the replies it had, so that the work follows the replies
    /// instead of delaying them; without the call nothing is lost (each
    /// plugin does what is left when it next needs it). Costs an atomic load
    /// or two per such plugin when there is nothing to do.
    pub fn run_deferred(&self) {
        for p in &self.deferred {
            if let Some(work) = p.plugin().as_deferred_work() {
                work.run_deferred();
            }
        }
    }

    /// Whether any plugin leaves work for [`Self::run_deferred`].
    #[must_use]
    pub fn has_deferred_work(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Schedules `request` with caller-owned buffers, writing into `result`
    /// (whose vectors are reused). In steady state this does not allocate
    /// unless a plugin does.
    ///
    /// # Errors
    /// See [`SchedulingError`].
    pub fn schedule_into(
        &self,
        request: &InferenceRequest,
        snapshot: &EndpointSnapshot,
        scratch: &mut Scratch,
        result: &mut SchedulingResult,
    ) -> Result<()> {
        self.run_cycle(request, snapshot, scratch, result, None)
    }

    fn run_cycle(
        &self,
        request: &InferenceRequest,
        snapshot: &EndpointSnapshot,
        scratch: &mut Scratch,
        result: &mut SchedulingResult,
        recorder: Option<&mut dyn CycleRecorder>,
    ) -> Result<()> {
        result.clear();
        scratch.used_runs = 0;
        scratch.state.reset();
        let now = Instant::now();

        let Scratch {
            rng,
            state,
            pool,
            base,
            candidates,
            totals,
            partial,
            picks,
            used_runs,
        } = scratch;

        base.clear();
        if snapshot.is_empty() {
            return Err(SchedulingError::NoEndpoints);
        }
        refresh_pool(pool, snapshot.endpoints());
        let fresh = |c: &Candidate| {
            self.staleness
                .is_none_or(|threshold| !c.metrics.is_stale(now, threshold))
        };
        // Stale endpoints are dropped only when a fresh one remains.
        let base: &[Candidate] = match &request.subset {
            None if pool.iter().all(fresh) || !pool.iter().any(fresh) => pool,
            subset => {
                let wanted = |c: &&Candidate| {
                    subset
                        .as_ref()
                        .is_none_or(|s| s.contains(&c.endpoint.addr()))
                };
                base.extend(pool.iter().filter(wanted).cloned());
                if base.is_empty() {
                    return Err(SchedulingError::EmptySubset);
                }
                if base.iter().any(fresh) {
                    base.retain(fresh);
                }
                base
            }
        };

        let mut cx = CycleContext {
            request,
            now,
            rng,
            state,
        };

        let mut laps = Laps::new(self.observer.as_deref(), recorder, now);
        laps.candidates(|r| r.cycle_candidates(base));
        if request.is_sheddable()
            && let Some(det) = &self.saturation
            && let Some(det) = det.plugin().as_saturation_detector()
        {
            laps.restart();
            let saturation = det.saturation(&cx, base);
            laps.lap(1);
            if saturation >= 1.0 {
                return Err(SchedulingError::Saturated);
            }
        }

        laps.restart();
        let first_producer = self.producer_sites();
        for (i, p) in self.producers.iter().enumerate() {
            if let Some(producer) = p.plugin().as_data_producer() {
                producer.produce(&mut cx, base);
                laps.lap(first_producer + i);
            }
        }
        let first_admitter = first_producer + self.producers.len();
        for (i, p) in self.admitters.iter().enumerate() {
            if let Some(admitter) = p.plugin().as_admitter() {
                let admitted = admitter.admit(&mut cx, base);
                laps.lap(first_admitter + i);
                if let Err(reason) = admitted {
                    return Err(SchedulingError::NotAdmitted {
                        plugin: p.plugin().name().to_owned(),
                        reason,
                    });
                }
            }
        }

        let Some(handler) = self.handler.as_profile_handler() else {
            return Err(SchedulingError::Invalid("profile handler missing".into()));
        };
        let mut last_empty = None;
        loop {
            laps.restart();
            let next = handler.next_profile(&mut cx, &self.profiles, &result.runs[..*used_runs]);
            laps.lap(0);
            let Some(pi) = next else {
                break;
            };
            let Some(profile) = self.profiles.get(pi) else {
                break;
            };
            if *used_runs == result.runs.len() {
                result.runs.push(ProfilePicks::default());
            }
            let run = &mut result.runs[*used_runs];
            *used_runs += 1;
            run.profile = pi;
            let sites = if laps.active() {
                self.profile_sites(pi)
            } else {
                0
            };
            let started = laps.last();
            let mut timing = Timing {
                laps: &mut laps,
                first: sites,
            };
            let scored = run_profile(
                profile,
                &mut cx,
                base,
                candidates,
                totals,
                partial,
                picks,
                &mut timing,
            );
            let scored: &[Candidate] = if scored { candidates } else { base };
            let ended = laps.last();
            laps.candidates(|r| {
                // The scorers did not run (nor resize `totals`) when the
                // filters left nothing.
                let totals = totals.get(..scored.len()).unwrap_or_default();
                r.picked(pi, scored, totals, picks);
            });
            if let (Some(start), Some(end)) = (started, ended) {
                laps.profile_run(|| ProfileRun {
                    profile: pi,
                    start,
                    end,
                    candidates: base.len(),
                    filtered: scored.len(),
                });
            }
            let hit = |p: &crate::PrefixMatch| {
                p.any_hit() && scored.iter().any(|c| p.matched(c.id()) > 0)
            };
            run.prefix_hit = hit(&cx.state.prefix);
            run.prefix_hits = u64::from(run.prefix_hit);
            for (k, p) in cx.state.more_prefix.iter().enumerate().take(63) {
                if hit(p) {
                    run.prefix_hits |= 1 << (k + 1);
                }
            }
            for &i in picks.iter() {
                run.targets.push(Arc::clone(&scored[i].endpoint));
                run.scores.push(totals[i]);
            }
            if run.targets.is_empty() {
                last_empty = Some(pi);
            }
            if *used_runs > self.profiles.len() * 2 {
                // A handler that never says "done" must not loop forever.
                break;
            }
        }
        result.runs.truncate(*used_runs);

        match handler.primary(&self.profiles, &result.runs) {
            Some(p) if result.runs.get(p).is_some_and(|r| !r.targets.is_empty()) => {
                result.primary = p;
                if let Some(target) = result.primary().map(|t| t.id()) {
                    result.primary_prefix_hit = cx.state.prefix.ratio(target);
                    result.primary_prediction = cx.state.latency.get(target).copied();
                }
                handler.route(&cx, &self.profiles, &result.runs, &mut result.edits);
                if let Some(prefill) = result.prefill() {
                    result.prefill_prefix_hit = cx.state.prefix.ratio(prefill.id());
                }
            }
            _ => {
                let profile = last_empty
                    .and_then(|i| self.profiles.get(i))
                    .map_or_else(String::new, |p| p.name().to_owned());
                return Err(SchedulingError::AllFiltered { profile });
            }
        }

        laps.restart();
        let first_pre = if laps.active() {
            self.profile_sites(self.profiles.len())
        } else {
            0
        };
        for (i, p) in self.pre_request.iter().enumerate() {
            if let Some(hook) = p.plugin().as_pre_request() {
                hook.pre_request(&cx, result);
                laps.lap(first_pre + i);
            }
        }
        Ok(())
    }
}

/// Brings `pool` up to date with `endpoints`: an endpoint already pooled at
/// its place keeps its entry, reloading metrics only when their version
/// moved; anything else is replaced.
fn refresh_pool(pool: &mut Vec<Candidate>, endpoints: &[Arc<Endpoint>]) {
    pool.truncate(endpoints.len());
    for (i, e) in endpoints.iter().enumerate() {
        match pool.get_mut(i) {
            Some(c) if Arc::ptr_eq(&c.endpoint, e) => c.refresh(),
            Some(c) => *c = Candidate::new(e),
            None => pool.push(Candidate::new(e)),
        }
    }
}

/// The laps of one profile run and the call site of its first plugin
/// (filters, then scorers, then the picker).
struct Timing<'l, 'o, 'r> {
    laps: &'l mut Laps<'o, 'r>,
    first: usize,
}

/// One profile: filters → weighted, clamped scores → picker. Leaves the chosen
/// indices in `picks` (distinct, in preference order) over `candidates` when
/// it returns true, over `base` when false (a profile without filters scores
/// `base` in place, saving two reference-count updates per candidate).
#[expect(
    clippy::too_many_arguments,
    reason = "the scratch buffers are borrowed separately"
)]
fn run_profile(
    profile: &SchedulingProfile,
    cx: &mut CycleContext<'_>,
    base: &[Candidate],
    candidates: &mut Vec<Candidate>,
    totals: &mut Vec<f64>,
    partial: &mut Vec<f64>,
    picks: &mut Vec<usize>,
    timing: &mut Timing<'_, '_, '_>,
) -> bool {
    picks.clear();
    candidates.clear();
    timing.laps.restart();
    if profile.filters.is_empty() {
        score_and_pick(profile, cx, base, totals, partial, picks, timing);
        return false;
    }
    // The first filter copies from `base` what it keeps (`filter_from`).
    let mut copied = false;
    for (i, f) in profile.filters.iter().enumerate() {
        if let Some(filter) = f.plugin().as_filter() {
            if copied {
                filter.filter(cx, candidates);
            } else {
                filter.filter_from(cx, base, candidates);
                copied = true;
            }
            timing.laps.lap(timing.first + i);
            timing
                .laps
                .candidates(|r| r.filtered(timing.first + i, candidates));
            if candidates.is_empty() {
                return true;
            }
        }
    }
    if !copied {
        candidates.extend_from_slice(base);
    }
    score_and_pick(profile, cx, candidates, totals, partial, picks, timing);
    true
}

fn score_and_pick(
    profile: &SchedulingProfile,
    cx: &mut CycleContext<'_>,
    candidates: &[Candidate],
    totals: &mut Vec<f64>,
    partial: &mut Vec<f64>,
    picks: &mut Vec<usize>,
    timing: &mut Timing<'_, '_, '_>,
) {
    let n = candidates.len();
    totals.clear();
    totals.resize(n, 0.0);
    let first_scorer = timing.first + profile.filters.len();
    for (i, ws) in profile.scorers.iter().enumerate() {
        let Some(scorer) = ws.plugin.plugin().as_scorer() else {
            continue;
        };
        partial.clear();
        partial.resize(n, 0.0);
        scorer.score(cx, candidates, partial);
        for (t, s) in totals.iter_mut().zip(partial.iter()) {
            // NaN (a scorer bug) counts as the worst score, not as poison.
            let s = if s.is_nan() { 0.0 } else { s.clamp(0.0, 1.0) };
            *t += ws.weight * s;
        }
        timing.laps.lap(first_scorer + i);
        timing
            .laps
            .candidates(|r| r.scored(first_scorer + i, candidates, ws.weight, partial));
    }
    if let Some(picker) = profile.picker.as_ref().and_then(|p| p.plugin().as_picker()) {
        picker.pick(cx, candidates, totals, picks);
        timing.laps.lap(first_scorer + profile.scorers.len());
    }
    // Enforce the picker contract: in range and distinct, first wins.
    let mut w = 0;
    for r in 0..picks.len() {
        let i = picks[r];
        if i < n && !picks[..w].contains(&i) {
            picks[w] = i;
            w += 1;
        }
    }
    picks.truncate(w);
}

/// Runs the one profile there is; its result is the primary.
#[derive(Debug, Clone)]
pub struct SingleProfileHandler {
    name: String,
}

impl SingleProfileHandler {
    /// The YAML type name.
    pub const TYPE: &'static str = "single-profile-handler";

    /// A handler with instance name `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Default for SingleProfileHandler {
    fn default() -> Self {
        Self::new(Self::TYPE)
    }
}

impl Plugin for SingleProfileHandler {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_profile_handler(&self) -> Option<&dyn ProfileHandler> {
        Some(self)
    }
}

impl ProfileHandler for SingleProfileHandler {
    fn next_profile(
        &self,
        _cx: &mut CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize> {
        (runs.is_empty() && !profiles.is_empty()).then_some(0)
    }

    fn primary(&self, _profiles: &[SchedulingProfile], runs: &[ProfilePicks]) -> Option<usize> {
        (!runs.is_empty()).then_some(0)
    }
}

#[cfg(test)]
mod tests;
