//! Timing of plugin calls, for whoever exports it (the binary's Prometheus
//! histograms). The core has no metrics dependency: it reports each call's
//! duration to an optional [`SchedulerObserver`] by *call site*, a dense index
//! the observer resolves once, up front, to its own storage. One cycle can
//! also be recorded in detail ([`CycleRecorder`]): its calls' times, and what
//! each filter, scorer and picker made of the candidates.

use std::{
    fmt,
    time::{Duration, Instant},
};

use crate::{Candidate, PluginRef};

/// Where in a scheduling cycle (or the response path) a plugin was called.
/// [`Self::as_str`] gives the reference picker's `extension_point` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExtensionPoint {
    /// The profile handler choosing the next profile.
    ProfilePicker,
    /// The saturation detector judging whether to shed a sheddable request.
    SaturationDetector,
    /// A data producer filling per-cycle state.
    DataProducer,
    /// An admitter deciding whether the request is admitted.
    Admitter,
    /// A filter.
    Filter,
    /// A scorer (including applying its weight).
    Scorer,
    /// A picker.
    Picker,
    /// A pre-request hook after the decision.
    PreRequest,
    /// Response hooks when the response headers arrive.
    ResponseReceived,
    /// Response hooks when the response completes (usage and outcome).
    ResponseComplete,
}

impl ExtensionPoint {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProfilePicker => "ProfilePicker",
            Self::SaturationDetector => "SaturationDetector",
            Self::DataProducer => "DataProducer",
            Self::Admitter => "Admitter",
            Self::Filter => "Filter",
            Self::Scorer => "Scorer",
            Self::Picker => "Picker",
            Self::PreRequest => "PreRequest",
            Self::ResponseReceived => "ResponseReceived",
            Self::ResponseComplete => "ResponseComplete",
        }
    }
}

impl fmt::Display for ExtensionPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One place a plugin is called from: the extension point and the plugin.
/// [`crate::Scheduler::call_sites`] lists them; an observer receives their
/// index.
#[derive(Debug, Clone)]
pub struct CallSite {
    /// The extension point.
    pub point: ExtensionPoint,
    /// The plugin called there.
    pub plugin: PluginRef,
}

/// Receives the duration of every plugin call of a scheduler that has one
/// ([`crate::Scheduler::with_observer`]).
///
/// Called on the scheduling hot path, from any thread: implementations must
/// be cheap, must not block and should not allocate (resolve
/// [`crate::Scheduler::call_sites`] to storage once, then index it).
pub trait SchedulerObserver: Send + Sync + fmt::Debug {
    /// The plugin at call site `site` (an index into
    /// [`crate::Scheduler::call_sites`]) ran for `took`.
    fn plugin_call(&self, site: usize, took: Duration);
}

/// One profile run of a recorded cycle ([`CycleRecorder::profile_run`]).
#[derive(Debug, Clone, Copy)]
pub struct ProfileRun {
    /// Index of the profile in [`crate::Scheduler::profiles`].
    pub profile: usize,
    /// When the run started (its filters, or its scorers when it has none).
    pub start: Instant,
    /// When its picker returned.
    pub end: Instant,
    /// Candidates the run started with.
    pub candidates: usize,
    /// Candidates left after its filters (what was scored and picked from).
    pub filtered: usize,
}

/// Records one scheduling cycle in detail: every plugin call with its start
/// and end, and every profile run ([`crate::Scheduler::schedule_recorded`]).
/// For tracing or inspecting a sampled request; a cycle without a recorder
/// reads no clock for it and copies nothing.
///
/// A recorder that also wants the candidates says so with
/// [`Self::records_candidates`]; it is then told, in this order, the
/// endpoints the profile runs start from ([`Self::cycle_candidates`]) and,
/// for each profile run, what each filter kept ([`Self::filtered`]), what
/// each scorer gave ([`Self::scored`]), what the picker chose
/// ([`Self::picked`]), then the run itself ([`Self::profile_run`]). The time
/// spent in these calls is counted in no plugin's call.
///
/// Called on the scheduling path of that one request: implementations should
/// only store what they are given.
pub trait CycleRecorder {
    /// The plugin at call site `site` (an index into
    /// [`crate::Scheduler::call_sites`]) ran from `start` to `end`.
    fn plugin_call(&mut self, site: usize, start: Instant, end: Instant);
    /// A profile run ended.
    fn profile_run(&mut self, run: ProfileRun);

    /// Whether to be told the candidates, each filter's survivors and each
    /// scorer's scores (asked once per cycle; `false` unless overridden).
    fn records_candidates(&self) -> bool {
        false
    }

    /// The endpoints every profile run starts from: the snapshot's, less
    /// those outside the request's subset hint and, when a fresh one
    /// remains, those with stale metrics. Told once, before the saturation
    /// detector and the data producers run; not told when the snapshot is
    /// empty or the subset matches nothing.
    fn cycle_candidates(&mut self, candidates: &[Candidate]) {
        let _ = candidates;
    }

    /// The filter at call site `site` left `kept` (in the order the next
    /// plugin sees them). A filter that leaves none ends its profile run:
    /// neither scorers nor the picker run, and [`Self::picked`] is told an
    /// empty set.
    fn filtered(&mut self, site: usize, kept: &[Candidate]) {
        let _ = (site, kept);
    }

    /// The scorer at call site `site`, of weight `weight` in its profile,
    /// wrote `scores[i]` for `candidates[i]`, as it wrote them: the profile
    /// adds `weight` times each, clamped to `[0, 1]` (NaN as 0).
    fn scored(&mut self, site: usize, candidates: &[Candidate], weight: f64, scores: &[f64]) {
        let _ = (site, candidates, weight, scores);
    }

    /// The picker of profile `profile` (an index into
    /// [`crate::Scheduler::profiles`]) chose `picks` (indices into
    /// `candidates`, target first, then fallbacks) from `candidates`, whose
    /// weighted totals are `totals`.
    fn picked(
        &mut self,
        profile: usize,
        candidates: &[Candidate],
        totals: &[f64],
        picks: &[usize],
    ) {
        let _ = (profile, candidates, totals, picks);
    }
}

/// Chains clock reads so each timed call costs one: a lap ends at the read
/// that starts the next. Without an observer or a recorder nothing reads the
/// clock.
pub(crate) struct Laps<'o, 'r> {
    observer: Option<&'o dyn SchedulerObserver>,
    recorder: Option<&'r mut dyn CycleRecorder>,
    last: Option<Instant>,
    /// The recorder wants the candidates ([`CycleRecorder::records_candidates`]).
    candidates: bool,
}

impl<'o, 'r> Laps<'o, 'r> {
    /// Laps starting at `start`.
    pub(crate) fn new(
        observer: Option<&'o dyn SchedulerObserver>,
        recorder: Option<&'r mut dyn CycleRecorder>,
        start: Instant,
    ) -> Self {
        let candidates = recorder
            .as_deref()
            .is_some_and(CycleRecorder::records_candidates);
        Self {
            observer,
            recorder,
            last: Some(start),
            candidates,
        }
    }

    /// Laps starting now (the clock is read only with an observer).
    pub(crate) fn now(observer: Option<&'o dyn SchedulerObserver>) -> Self {
        Self {
            last: observer.map(|_| Instant::now()),
            observer,
            recorder: None,
            candidates: false,
        }
    }

    /// Whether calls are timed.
    pub(crate) fn active(&self) -> bool {
        self.observer.is_some() || self.recorder.is_some()
    }

    /// Restarts the lap (after work that belongs to no plugin).
    pub(crate) fn restart(&mut self) {
        if self.active() {
            self.last = Some(Instant::now());
        }
    }

    /// The plugin at `site` ran since the last lap.
    pub(crate) fn lap(&mut self, site: usize) {
        if !self.active() {
            return;
        }
        let now = Instant::now();
        if let Some(last) = self.last {
            if let Some(o) = self.observer {
                o.plugin_call(site, now.saturating_duration_since(last));
            }
            if let Some(r) = self.recorder.as_deref_mut() {
                r.plugin_call(site, last, now);
            }
        }
        self.last = Some(now);
    }

    /// When the last lap ended (with a recorder: the clock was read).
    pub(crate) fn last(&self) -> Option<Instant> {
        self.last
    }

    /// Tells the recorder what `tell` says when it records candidates. The
    /// time it takes goes to no plugin: the next lap starts after it.
    #[inline]
    pub(crate) fn candidates(&mut self, tell: impl FnOnce(&mut dyn CycleRecorder)) {
        if !self.candidates {
            return;
        }
        if let Some(r) = self.recorder.as_deref_mut() {
            tell(r);
            self.last = Some(Instant::now());
        }
    }

    /// Tells the recorder, if any, of a profile run.
    pub(crate) fn profile_run(&mut self, run: impl FnOnce() -> ProfileRun) {
        if let Some(r) = self.recorder.as_deref_mut() {
            r.profile_run(run());
        }
    }
}

/// A metric family a plugin reports ([`PluginMetrics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricFamily {
    /// Prometheus name (a counter's without `_total`, which the exporter adds).
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
}

/// Receives the series a plugin reports, at scrape time. The exporter groups
/// series by family; labels are `(name, value)` pairs.
pub trait MetricSink {
    /// A gauge.
    fn gauge(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: f64);
    /// A counter (monotonic).
    fn counter(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: u64);
    /// A histogram: `buckets` are `(upper bound, count in that bucket)`,
    /// ascending, not cumulative; the last bound is `f64::MAX` (+Inf).
    fn histogram(
        &mut self,
        family: MetricFamily,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    );
}

/// Metrics a plugin keeps itself (how well it predicts, how much it holds),
/// read whenever the picker's metrics are scraped. The core does not format
/// them: whoever exports metrics (the binary) gives a [`MetricSink`].
pub trait PluginMetrics {
    /// Reports every series now.
    fn report(&self, out: &mut dyn MetricSink);
}
