//! The scheduling cycle the issue defines, shared by the criterion bench and
//! the allocation test: the default profile (queue ×2, KV ×2, prefix ×3,
//! max-score picker) over endpoints whose load varies between requests, and
//! completion prompts made of a prefix shared within one of 256 groups (¾ of
//! the prompt) plus a unique tail (¼).

use std::{net::SocketAddr, sync::Arc};

use epp_core::{
    Endpoint, EndpointMetrics, EndpointSnapshot, InferenceRequest, PluginRef, Scheduler,
    SchedulingProfile, SchedulingResult, Scratch, SingleProfileHandler,
};
use epp_plugins::{
    LoadSignalParams, LoadSignalScorer, MaxScorePicker, PickerParams, PrefixCacheParams,
    PrefixCacheScorer, Signal,
};
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Prefix groups.
pub(crate) const GROUPS: usize = 256;

/// One benchmark setup.
pub(crate) struct Workload {
    pub(crate) scheduler: Scheduler,
    pub(crate) prefix: Arc<PrefixCacheScorer>,
    pub(crate) snapshot: EndpointSnapshot,
    pub(crate) scratch: Scratch,
    pub(crate) result: SchedulingResult,
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

impl Workload {
    /// `endpoints` endpoints, prompts of `prompt_kib` KiB, the prefix index
    /// remembering `capacity` blocks per endpoint (31,250 by default).
    pub(crate) fn new(endpoints: usize, prompt_kib: usize, capacity: Option<usize>) -> Self {
        let mut rng = SmallRng::seed_from_u64(7);
        let snapshot = EndpointSnapshot::new(
            (0..endpoints)
                .map(|i| {
                    let addr: SocketAddr =
                        format!("10.{}.{}.{}:8000", i >> 16, (i >> 8) & 255, i & 255)
                            .parse()
                            .expect("address");
                    Arc::new(Endpoint::new(u32::try_from(i).expect("id"), addr))
                })
                .collect(),
        );
        let metrics: Vec<EndpointMetrics> = (0..64)
            .map(|_| EndpointMetrics {
                waiting: rng.random_range(0..20),
                running: rng.random_range(0..64),
                kv_usage: rng.random_range(0.0..1.0),
                ..EndpointMetrics::fresh()
            })
            .collect();
        for (i, e) in snapshot.endpoints().iter().enumerate() {
            e.set_metrics(metrics[i % metrics.len()].clone());
        }
        let prompt = prompt_kib * 1024;
        let prefix_len = prompt * 3 / 4;
        let prefixes = (0..GROUPS)
            .map(|_| {
                let mut s = String::with_capacity(prefix_len);
                text(&mut rng, &mut s, prefix_len);
                s
            })
            .collect();
        let params = PrefixCacheParams {
            lru_capacity_per_server: capacity.unwrap_or(31_250),
            ..PrefixCacheParams::default()
        };
        let prefix = Arc::new(PrefixCacheScorer::new("prefix-cache-scorer", params));
        let profile = SchedulingProfile::new("default")
            .with_scorer(
                PluginRef::new(Arc::new(LoadSignalScorer::new(
                    "queue-scorer",
                    Signal::Waiting,
                    LoadSignalParams::default(),
                ))),
                2.0,
            )
            .with_scorer(
                PluginRef::new(Arc::new(LoadSignalScorer::new(
                    "kv-cache-utilization-scorer",
                    Signal::KvUsage,
                    LoadSignalParams::default(),
                ))),
                2.0,
            )
            .with_scorer(PluginRef::new(prefix.clone()), 3.0)
            .with_picker(PluginRef::new(Arc::new(MaxScorePicker::new(
                "max-score-picker",
                PickerParams::default(),
            ))));
        let scheduler = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
            .expect("valid profile")
            .with_hooks([PluginRef::new(prefix.clone())]);
        let mut request = InferenceRequest::builder("meta-llama/Llama-3.1-8B-Instruct").build();
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
    pub(crate) fn next(&mut self) {
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
    pub(crate) fn cycle(&mut self) {
        self.scheduler
            .schedule_into(
                &self.request,
                &self.snapshot,
                &mut self.scratch,
                &mut self.result,
            )
            .expect("an endpoint");
    }

    /// Runs `n` full requests (load change, prompt, cycle).
    pub(crate) fn warm(&mut self, n: usize) {
        for _ in 0..n {
            self.next();
            self.cycle();
        }
    }

    /// Heap bytes of the prefix index per (block, endpoint) entry.
    pub(crate) fn bytes_per_block(&self) -> f64 {
        let index = self.prefix.index();
        index.heap_bytes() as f64 / index.entries().max(1) as f64
    }
}
