//! The scheduling cycle the cycle benchmark and its allocation test measure:
//! the default profile (queue ×2, KV ×2, prefix ×3, max-score picker) over
//! endpoints whose load varies between requests, and completion prompts made
//! of a prefix shared within one of [`GROUPS`] groups (¾ of the prompt) plus
//! a unique tail (¼).
//!
//! The plugins come from the registry the caller passes (epp-plugins'
//! built-ins), by their YAML types, as the `epp` binary builds them; only the
//! prefix scorer is the caller's own instance, so that it can look at its
//! index.

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use epp_core::{
    DispatchLoad, Endpoint, EndpointMetrics, EndpointSnapshot, InferenceRequest, Plugin, PluginRef,
    PluginSpec, Registry, RequestOutcome, ResponseTiming, Scheduler, SchedulingProfile,
    SchedulingResult, Scratch, SingleProfileHandler,
};
use rand::{Rng, SeedableRng, rngs::SmallRng};

use crate::endpoints::{endpoints, labelled};

/// Prefix groups.
pub const GROUPS: usize = 256;

/// The model every workload request asks for.
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// The default profile: `queue-scorer` ×2, `kv-cache-utilization-scorer` ×2
/// (both built by `registry`), `prefix` ×3 and as a pre-request hook,
/// `max-score-picker` (from `registry`).
///
/// # Panics
/// If `registry` lacks one of those types.
#[must_use]
pub fn default_profile(registry: &Registry, prefix: PluginRef) -> Scheduler {
    default_with(registry, prefix, None)
}

/// The weight of `latency-scorer` in `examples/configs/predicted-latency.yaml`.
pub const EXAMPLE_LATENCY_WEIGHT: f64 = 4.0;

/// [`default_profile`], with a `predicted-latency-producer` hook and a
/// `latency-scorer` of weight `latency` added when given.
fn default_with(registry: &Registry, prefix: PluginRef, latency: Option<f64>) -> Scheduler {
    let build = |type_name: &str| {
        let plugin = registry
            .build(&PluginSpec::new(type_name))
            .unwrap_or_else(|e| panic!("{type_name}: {e}"));
        PluginRef::new(plugin)
    };
    let mut profile = SchedulingProfile::new("default")
        .with_scorer(build("queue-scorer"), 2.0)
        .with_scorer(build("kv-cache-utilization-scorer"), 2.0)
        .with_scorer(prefix.clone(), 3.0);
    let mut hooks = vec![prefix];
    if let Some(weight) = latency {
        profile = profile.with_scorer(build("latency-scorer"), weight);
        hooks.push(build("predicted-latency-producer"));
    }
    Scheduler::new(
        vec![profile.with_picker(build("max-score-picker"))],
        Arc::new(SingleProfileHandler::default()),
    )
    .expect("a valid profile")
    .with_hooks(hooks)
}

/// The learned-latency profile of `examples/configs/predicted-latency.yaml`:
/// [`default_profile`] with `latency-scorer` beside its scorers at
/// [`EXAMPLE_LATENCY_WEIGHT`] and a `predicted-latency-producer` (both built
/// by `registry`) predicting.
///
/// # Panics
/// If `registry` lacks one of those types.
#[must_use]
pub fn latency_profile(registry: &Registry, prefix: PluginRef) -> Scheduler {
    default_with(registry, prefix, Some(EXAMPLE_LATENCY_WEIGHT))
}

/// Which profile a [`Workload`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// [`default_profile`].
    Default,
    /// [`latency_profile`], its models trained until every endpoint's own
    /// model predicts.
    Latency,
    /// [`default_profile`] plus the trained predictor and a `latency-scorer`
    /// of weight 0: the default profile's picks, with the latency plugins'
    /// work done on every cycle (their cost alone, index churn aside).
    DefaultPlusLatency,
    /// P/D: half the endpoints `llm-d.ai/role: prefill`, half `decode`;
    /// `disagg-profile-handler` with a `prefix-based-pd-decider`
    /// (`nonCachedTokens: 16`) runs a decode profile (`decode-filter` then
    /// the default profile's scorers and picker) and, for every prompt whose
    /// uncached part is long enough, a prefill profile (`prefill-filter`,
    /// the same scorers): two picks per request.
    Disaggregated,
    /// The same fleet and decode profile alone (one pick): the baseline of
    /// [`Profile::Disaggregated`].
    DecodeOnly,
}

/// A profile named `name`: `filter` (built by `registry`), then the default
/// profile's scorers with `prefix`, and `max-score-picker`.
fn filtered_default(
    registry: &Registry,
    name: &str,
    filter: &str,
    prefix: PluginRef,
) -> SchedulingProfile {
    let build = |type_name: &str| {
        let plugin = registry
            .build(&PluginSpec::new(type_name))
            .unwrap_or_else(|e| panic!("{type_name}: {e}"));
        PluginRef::new(plugin)
    };
    SchedulingProfile::new(name)
        .with_filter(build(filter))
        .with_scorer(build("queue-scorer"), 2.0)
        .with_scorer(build("kv-cache-utilization-scorer"), 2.0)
        .with_scorer(prefix, 3.0)
        .with_picker(build("max-score-picker"))
}

/// [`Profile::Disaggregated`] (`disaggregated`) or [`Profile::DecodeOnly`].
fn pd_scheduler(registry: &Registry, prefix: PluginRef, disaggregated: bool) -> Scheduler {
    let decode = filtered_default(registry, "decode", "decode-filter", prefix.clone());
    if !disaggregated {
        return Scheduler::new(vec![decode], Arc::new(SingleProfileHandler::default()))
            .expect("a valid profile")
            .with_hooks([prefix]);
    }
    let prefill = filtered_default(registry, "prefill", "prefill-filter", prefix.clone());
    let yaml = |text: &str| serde_yaml_ng::from_str(text).expect("valid YAML");
    let decider = registry
        .build(
            &PluginSpec::new("prefix-based-pd-decider")
                .with_parameters(yaml("{nonCachedTokens: 16}")),
        )
        .expect("a decider");
    let handler = registry
        .build(
            &PluginSpec::new("disagg-profile-handler")
                .with_parameters(yaml("{deciders: {prefill: prefix-based-pd-decider}}")),
        )
        .expect("a handler");
    handler
        .bind_plugins(&[PluginRef::new(decider)])
        .expect("a decider binds");
    Scheduler::new(vec![prefill, decode], handler)
        .expect("valid profiles")
        .with_hooks([prefix])
}

/// One benchmark setup: the scheduler, the endpoints and the reused buffers.
#[derive(Debug)]
pub struct Workload<P> {
    /// The default profile's scheduler.
    pub scheduler: Scheduler,
    /// The caller's prefix scorer, the one the scheduler runs.
    pub prefix: Arc<P>,
    /// The endpoints.
    pub snapshot: EndpointSnapshot,
    /// Per-thread scratch, reused across cycles.
    pub scratch: Scratch,
    /// The last cycle's result, reused.
    pub result: SchedulingResult,
    prefixes: Vec<String>,
    tail_len: usize,
    request: InferenceRequest,
    rng: SmallRng,
    /// Pre-built metric values, so varying load costs no allocation beyond
    /// the data layer's own `Arc` swap.
    metrics: Vec<EndpointMetrics>,
}

fn text(rng: &mut SmallRng, out: &mut String, len: usize) {
    const WORDS: [&str; 16] = [
        "the ", "model ", "server ", "cache ", "prefix ", "token ", "query ", "answer ", "route ",
        "block ", "tenant ", "system ", "prompt ", "user ", "tool ", "data ",
    ];
    let end = out.len() + len;
    while out.len() < end {
        let w = WORDS[rng.random_range(0..WORDS.len())];
        let take = w.len().min(end - out.len());
        out.push_str(&w[..take]);
    }
}

/// Completes one streamed 200 response of `endpoint` dispatched at `load`:
/// first bytes after `ttft_ms`, all after `total_ms`, `output_tokens` long
/// (what a latency predictor learns from).
pub fn complete_streamed(
    scheduler: &Scheduler,
    request: &InferenceRequest,
    endpoint: &Arc<Endpoint>,
    load: DispatchLoad,
    ttft_ms: f64,
    total_ms: f64,
    output_tokens: u64,
) {
    let timing = ResponseTiming {
        load,
        predicted: None,
        first_byte: Some(Duration::from_secs_f64(ttft_ms / 1e3)),
        total: Duration::from_secs_f64(total_ms / 1e3),
        streamed: true,
        output_tokens: Some(output_tokens),
        status: 200,
    };
    scheduler.response_complete(
        request,
        endpoint,
        None,
        Some(&timing),
        RequestOutcome::Completed { status: 200 },
    );
}

/// Teaches `scheduler`'s latency predictor 64 responses per endpoint, each
/// endpoint with its own speed, so every endpoint's model predicts.
fn train(scheduler: &Scheduler, snapshot: &EndpointSnapshot, rng: &mut SmallRng) {
    let request = InferenceRequest::builder(MODEL).build();
    for (i, e) in snapshot.endpoints().iter().enumerate() {
        let base = 20.0 + (i % 7) as f64 * 10.0;
        for _ in 0..64 {
            let load = DispatchLoad {
                waiting: rng.random_range(0..20),
                running: rng.random_range(0..64),
                kv_usage: rng.random_range(0.0..1.0),
                dispatched: rng.random_range(0..4),
                unanswered: 0,
                unanswered_uncached_tokens: 0,
                prompt_tokens: 4096,
                uncached_tokens: rng.random_range(0..4096),
                adapter_cold: false,
                adapter_blocked: false,
                adapter_release_ms: None,
                kv_capacity_tokens: 0,
                dispatched_uncached_tokens: 0,
            };
            let ttft = base
                + 25.0 * f64::from(load.waiting)
                + 0.04 * load.uncached_tokens as f64
                + rng.random_range(0.0..5.0);
            complete_streamed(scheduler, &request, e, load, ttft, ttft + 150.0, 16);
        }
    }
}

impl<P: Plugin + 'static> Workload<P> {
    /// `endpoints` endpoints and prompts of `prompt_kib` KiB, scheduled by
    /// [`default_profile`] with `prefix` as its prefix scorer.
    ///
    /// # Panics
    /// If `registry` lacks one of the default profile's types.
    #[must_use]
    pub fn new(endpoints_n: usize, prompt_kib: usize, registry: &Registry, prefix: Arc<P>) -> Self {
        Self::with_profile(endpoints_n, prompt_kib, registry, prefix, Profile::Default)
    }

    /// As [`Self::new`], scheduled by `profile`.
    ///
    /// # Panics
    /// If `registry` lacks one of the profile's types.
    #[must_use]
    pub fn with_profile(
        endpoints_n: usize,
        prompt_kib: usize,
        registry: &Registry,
        prefix: Arc<P>,
        profile: Profile,
    ) -> Self {
        let mut rng = SmallRng::seed_from_u64(7);
        let metrics: Vec<EndpointMetrics> = (0..64)
            .map(|_| EndpointMetrics {
                waiting: rng.random_range(0..20),
                running: rng.random_range(0..64),
                kv_usage: rng.random_range(0.0..1.0),
                ..EndpointMetrics::fresh()
            })
            .collect();
        let pd = matches!(profile, Profile::Disaggregated | Profile::DecodeOnly);
        let snapshot = EndpointSnapshot::new(if pd {
            (0..endpoints_n)
                .map(|i| {
                    let role = if i < endpoints_n / 2 {
                        "prefill"
                    } else {
                        "decode"
                    };
                    let id = u32::try_from(i).expect("fewer than 2^32 endpoints");
                    let e = labelled(id, &[("llm-d.ai/role", role)]);
                    e.set_metrics(metrics[i % metrics.len()].clone());
                    e
                })
                .collect()
        } else {
            endpoints((0..endpoints_n).map(|i| metrics[i % metrics.len()].clone()))
        });
        let prompt = prompt_kib * 1024;
        let prefix_len = prompt * 3 / 4;
        let prefixes = (0..GROUPS)
            .map(|_| {
                let mut s = String::with_capacity(prefix_len);
                text(&mut rng, &mut s, prefix_len);
                s
            })
            .collect();
        let scheduler = match profile {
            Profile::Default => default_profile(registry, PluginRef::new(prefix.clone())),
            Profile::Latency => {
                let scheduler = latency_profile(registry, PluginRef::new(prefix.clone()));
                train(&scheduler, &snapshot, &mut rng);
                scheduler
            }
            Profile::DefaultPlusLatency => {
                let scheduler = default_with(registry, PluginRef::new(prefix.clone()), Some(0.0));
                train(&scheduler, &snapshot, &mut rng);
                scheduler
            }
            Profile::Disaggregated | Profile::DecodeOnly => pd_scheduler(
                registry,
                PluginRef::new(prefix.clone()),
                profile == Profile::Disaggregated,
            ),
        };
        let mut request = InferenceRequest::builder(MODEL).build();
        request.prompt = String::with_capacity(prompt);
        Self {
            scheduler,
            prefix,
            snapshot,
            scratch: Scratch::seeded(1),
            result: SchedulingResult::default(),
            prefixes,
            tail_len: prompt - prefix_len,
            request,
            rng,
            metrics,
        }
    }

    /// Changes the load of 8 endpoints (what the data layer does between
    /// requests) and writes the next prompt into the reused request.
    pub fn next(&mut self) {
        let n = self.snapshot.len();
        for _ in 0..8 {
            let e = &self.snapshot.endpoints()[self.rng.random_range(0..n)];
            let m = &self.metrics[self.rng.random_range(0..self.metrics.len())];
            e.set_metrics(m.clone());
        }
        let group = self.rng.random_range(0..GROUPS);
        let prompt = &mut self.request.prompt;
        prompt.clear();
        prompt.push_str(&self.prefixes[group]);
        text(&mut self.rng, prompt, self.tail_len);
    }

    /// One scheduling cycle on the current request: hash, match, score, pick,
    /// record.
    ///
    /// # Panics
    /// If no endpoint is picked (the profile has no filter, so never).
    pub fn cycle(&mut self) {
        self.scheduler
            .schedule_into(
                &self.request,
                &self.snapshot,
                &mut self.scratch,
                &mut self.result,
            )
            .expect("an endpoint");
    }

    /// Runs `n` full requests and returns the time their cycles took: load
    /// changes and prompt assembly are the data layer's and the client's
    /// work, so they are left untimed. Each result is passed through
    /// [`black_box`] so the cycle cannot be optimised away.
    pub fn time_cycles(&mut self, n: u64) -> Duration {
        self.time_cycles_then(n, |_| ())
    }

    /// [`Self::time_cycles`], calling `after` with the workload after each
    /// cycle, untimed (e.g. to run the work the cycle left for after its
    /// reply, as the server does once the reply is written, or to wait for
    /// work it left to a background thread, as a server whose requests
    /// arrive slower than that thread's work would).
    pub fn time_cycles_then(&mut self, n: u64, mut after: impl FnMut(&Self)) -> Duration {
        let mut spent = Duration::ZERO;
        for _ in 0..n {
            self.next();
            let t = Instant::now();
            self.cycle();
            spent += t.elapsed();
            black_box(&self.result);
            after(self);
        }
        spent
    }

    /// Runs `n` full requests (load change, prompt, cycle).
    pub fn warm(&mut self, n: usize) {
        for _ in 0..n {
            self.next();
            self.cycle();
        }
    }
}
