//! The picker's per-request metrics, recorded once and served under three
//! generations of names ([`MetricGenerations`]): the first reference
//! releases' `inference_model_*`, the Gateway API Inference Extension's
//! `inference_objective_*`, and llm-d's `llm_d_epp_*`.
//!
//! A request's observations go to one [`RequestSeries`] (atomics and
//! lock-free histograms) keyed by its full label set (model, target model,
//! fairness id, priority), found once when it is routed and held by the
//! exchange until the response ends. The collector (`encode.rs`) adds
//! series together at scrape time for generations with fewer labels, so a
//! request costs the same whichever generations are served.

mod encode;
mod flow;
mod hist;
mod stream;

use std::{
    collections::HashMap,
    fmt,
    hash::BuildHasher,
    str::FromStr,
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use epp_core::{Endpoint, Usage};
pub(crate) use flow::{FlowCollector, FlowMetrics};
use hist::AtomicHistogram;
use prometheus_client::{
    metrics::{
        counter::Counter,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
pub(crate) use stream::{OpenStream, StreamEnd, StreamMetrics};

use epp_core::LabelCap;

/// Which generations of metric names are served. Every generation is fed by
/// the same observations; turning one off only leaves its names out of the
/// page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricGenerations {
    /// `inference_model_*`, `normalized_time_per_output_token_seconds`
    /// (the reference's first releases), with the shared `inference_pool_*`
    /// and `inference_extension_*` names.
    pub inference_model: bool,
    /// `inference_objective_*` (the Gateway API Inference Extension), with
    /// the shared `inference_pool_*` and `inference_extension_*` names.
    pub inference_objective: bool,
    /// `llm_d_epp_*` (llm-d's router).
    pub llm_d: bool,
}

impl MetricGenerations {
    /// Every generation (the default).
    pub const ALL: Self = Self {
        inference_model: true,
        inference_objective: true,
        llm_d: true,
    };

    /// Whether the names both reference generations share
    /// (`inference_pool_*`, `inference_extension_*`) are served.
    #[must_use]
    pub fn reference(self) -> bool {
        self.inference_model || self.inference_objective
    }
}

impl Default for MetricGenerations {
    fn default() -> Self {
        Self::ALL
    }
}

impl FromStr for MetricGenerations {
    type Err = String;

    /// A comma-separated list of `inference-model`, `inference-objective`,
    /// `llm-d` (or `all`).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut g = Self {
            inference_model: false,
            inference_objective: false,
            llm_d: false,
        };
        for name in s.split(',').map(str::trim) {
            match name {
                "inference-model" => g.inference_model = true,
                "inference-objective" => g.inference_objective = true,
                "llm-d" => g.llm_d = true,
                "all" => g = Self::ALL,
                other => {
                    return Err(format!(
                        "unknown metrics generation {other:?}: expected a comma-separated list of \
                         inference-model, inference-objective, llm-d (or all)"
                    ));
                }
            }
        }
        if g == (Self {
            inference_model: false,
            inference_objective: false,
            llm_d: false,
        }) {
            return Err("give at least one metrics generation".to_owned());
        }
        Ok(g)
    }
}

impl fmt::Display for MetricGenerations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (self.inference_model, "inference-model"),
            (self.inference_objective, "inference-objective"),
            (self.llm_d, "llm-d"),
        ];
        let on: Vec<&str> = names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        f.write_str(&on.join(","))
    }
}

/// The full label set of a request's series (request-derived values capped).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SeriesKey {
    pub(crate) model: String,
    pub(crate) target: String,
    pub(crate) fairness: String,
    pub(crate) priority: i32,
}

/// Every observation of the requests sharing one [`SeriesKey`].
#[derive(Debug)]
pub(crate) struct RequestSeries {
    pub(crate) key: SeriesKey,
    requests: AtomicU64,
    running: AtomicI64,
    duration: AtomicHistogram,
    request_bytes: AtomicHistogram,
    response_bytes: AtomicHistogram,
    input_tokens: AtomicHistogram,
    output_tokens: AtomicHistogram,
    cached_tokens: AtomicHistogram,
    ntpot: AtomicHistogram,
    /// `[non-streaming, streaming]`.
    ttft: [AtomicHistogram; 2],
    tpot: AtomicHistogram,
    itl: AtomicHistogram,
}

impl RequestSeries {
    fn new(key: SeriesKey) -> Self {
        Self {
            key,
            requests: AtomicU64::new(0),
            running: AtomicI64::new(0),
            duration: AtomicHistogram::new(hist::LATENCY),
            request_bytes: AtomicHistogram::new(hist::REQUEST_BYTES),
            response_bytes: AtomicHistogram::new(hist::RESPONSE_BYTES),
            input_tokens: AtomicHistogram::new(hist::INPUT_TOKENS),
            output_tokens: AtomicHistogram::new(hist::OUTPUT_TOKENS),
            cached_tokens: AtomicHistogram::new(hist::INPUT_TOKENS),
            ntpot: AtomicHistogram::new(hist::NTPOT),
            ttft: [
                AtomicHistogram::new(hist::TTFT),
                AtomicHistogram::new(hist::TTFT),
            ],
            tpot: AtomicHistogram::new(hist::TPOT),
            itl: AtomicHistogram::new(hist::ITL),
        }
    }

    /// A streamed response's first body bytes came `ttft` after the request.
    pub(crate) fn first_token(&self, ttft: Duration) {
        self.ttft[1].observe(ttft.as_secs_f64());
    }

    /// Two consecutive streamed body chunks came `gap` apart.
    pub(crate) fn inter_token(&self, gap: Duration) {
        self.itl.observe(gap.as_secs_f64());
    }

    /// The response ended: `streamed_ttft` is when its first bytes came when
    /// it was streamed (already observed by [`Self::first_token`]).
    pub(crate) fn completed(
        &self,
        elapsed: Duration,
        response_bytes: usize,
        usage: Option<Usage>,
        streamed_ttft: Option<Duration>,
    ) {
        self.running.fetch_sub(1, Relaxed);
        let e2e = elapsed.as_secs_f64();
        self.duration.observe(e2e);
        self.response_bytes.observe(response_bytes as f64);
        if streamed_ttft.is_none() {
            // Not streamed: the first token comes with the whole response.
            self.ttft[0].observe(e2e);
        }
        let Some(u) = usage else { return };
        self.input_tokens.observe(u.prompt_tokens as f64);
        self.output_tokens.observe(u.completion_tokens as f64);
        self.cached_tokens.observe(u.cached_tokens as f64);
        if u.completion_tokens > 0 {
            self.ntpot.observe(e2e / u.completion_tokens as f64);
        }
        if let Some(ttft) = streamed_ttft
            && u.completion_tokens > 1
        {
            let rest = (elapsed.saturating_sub(ttft)).as_secs_f64();
            self.tpot.observe(rest / (u.completion_tokens - 1) as f64);
        }
    }
}

/// `status`, target model, endpoint of one scheduling attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct AttemptKey {
    pub(crate) status: &'static str,
    pub(crate) target: String,
    pub(crate) addr: Option<std::net::SocketAddr>,
    pub(crate) endpoint: String,
    pub(crate) namespace: String,
    pub(crate) port: String,
}

/// Series found by the hash of their label values, so a lookup of one that
/// exists allocates nothing.
#[derive(Debug)]
struct Interned<V> {
    hasher: std::hash::RandomState,
    map: RwLock<HashMap<u64, Vec<Arc<V>>>>,
}

impl<V> Default for Interned<V> {
    fn default() -> Self {
        Self {
            hasher: std::hash::RandomState::new(),
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl<V> Interned<V> {
    fn get(&self, hash: u64, eq: impl Fn(&V) -> bool) -> Option<Arc<V>> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&hash)?.iter().find(|v| eq(v)).cloned()
    }

    fn get_or_insert(
        &self,
        hash: u64,
        eq: impl Fn(&V) -> bool,
        make: impl FnOnce() -> V,
    ) -> Arc<V> {
        if let Some(v) = self.get(hash, &eq) {
            return v;
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let bucket = map.entry(hash).or_default();
        if let Some(v) = bucket.iter().find(|v| eq(v)) {
            return Arc::clone(v);
        }
        let v = Arc::new(make());
        bucket.push(Arc::clone(&v));
        v
    }

    fn all(&self) -> Vec<Arc<V>> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.values().flatten().cloned().collect()
    }
}

/// What the collector reads.
#[derive(Debug, Default)]
pub(crate) struct Store {
    models: Arc<LabelCap>,
    fairness_ids: Arc<LabelCap>,
    series: Interned<RequestSeries>,
    attempts: Interned<(AttemptKey, AtomicU64)>,
    /// `(model, target model, fairness id, priority, error code)`.
    errors: Mutex<HashMap<(SeriesKey, &'static str), u64>>,
    /// `(rewrite source, model, target model)`.
    rewrites: Mutex<HashMap<(&'static str, String, String), u64>>,
    prefix_hit_ratio: PrefixHistograms,
    streams: StreamMetrics,
}

#[derive(Debug)]
struct PrefixHistograms {
    ratio: AtomicHistogram,
    bytes: AtomicHistogram,
}

impl Default for PrefixHistograms {
    fn default() -> Self {
        Self {
            ratio: AtomicHistogram::new(hist::RATIO),
            bytes: AtomicHistogram::new(hist::HIT_BYTES),
        }
    }
}

/// The metric handles (cheap to clone: they share their values).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    store: Arc<Store>,
    scheduler_e2e: Histogram,
    served_by_fallback: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            store: Arc::default(),
            // 10 µs … ~5 s: epp decides in microseconds, so the reference's
            // 100 µs first bucket would hold nearly everything.
            scheduler_e2e: Histogram::new(exponential_buckets(0.000_01, 2.0, 20)),
            served_by_fallback: Counter::default(),
        }
    }
}

impl Metrics {
    /// The cap of the `fairness_id` label, shared with flow control's
    /// metrics so one id keeps one label everywhere.
    pub(crate) fn fairness_ids(&self) -> Arc<LabelCap> {
        Arc::clone(&self.store.fairness_ids)
    }

    /// The cap of the model labels, shared with flow control's metrics.
    pub(crate) fn models(&self) -> Arc<LabelCap> {
        Arc::clone(&self.store.models)
    }

    pub(crate) fn register(&self, r: &mut Registry, generations: MetricGenerations) {
        r.register_collector(Box::new(encode::RequestCollector {
            store: Arc::clone(&self.store),
            generations,
        }));
        if generations.reference() {
            r.register(
                "inference_extension_scheduler_e2e_duration_seconds",
                "Time spent in one scheduling decision",
                self.scheduler_e2e.clone(),
            );
        }
        if generations.llm_d {
            r.register(
                "llm_d_epp_scheduler_e2e_duration_seconds",
                "Time spent in one scheduling decision",
                self.scheduler_e2e.clone(),
            );
        }
        r.register(
            "epp_requests_served_by_fallback",
            "Responses the gateway reported from an endpoint other than the pick \
             (x-gateway-destination-endpoint-served); their in-flight accounting moved there",
            self.served_by_fallback.clone(),
        );
    }

    pub(crate) fn served_by_fallback(&self) {
        self.served_by_fallback.inc();
    }

    /// An ext_proc stream opened at `opened`: it counts as open until the
    /// returned value is dropped.
    pub(crate) fn stream_opened(&self, opened: Instant) -> OpenStream {
        OpenStream::new(Arc::clone(&self.store), opened)
    }

    /// What requests and responses cost epp.
    pub(crate) fn streams(&self) -> &StreamMetrics {
        &self.store.streams
    }

    /// The series of a request's labels. One that exists is found without
    /// allocating; a new one takes the label caps first.
    pub(crate) fn series(
        &self,
        model: &str,
        target: &str,
        fairness: &str,
        priority: i32,
    ) -> Arc<RequestSeries> {
        let s = &self.store;
        let raw = s
            .series
            .hasher
            .hash_one((model, target, fairness, priority));
        if let Some(v) = s
            .series
            .get(raw, series_is(model, target, fairness, priority))
        {
            return v;
        }
        let (m, t) = (s.models.label(model), s.models.label(target));
        let f = s.fairness_ids.label(fairness);
        let hash = s.series.hasher.hash_one((m, t, f, priority));
        s.series
            .get_or_insert(hash, series_is(m, t, f, priority), || {
                RequestSeries::new(SeriesKey {
                    model: m.to_owned(),
                    target: t.to_owned(),
                    fairness: f.to_owned(),
                    priority,
                })
            })
    }

    /// A request was routed.
    pub(crate) fn scheduled(&self, series: &RequestSeries, body_len: usize) {
        series.requests.fetch_add(1, Relaxed);
        series.running.fetch_add(1, Relaxed);
        series.request_bytes.observe(body_len as f64);
    }

    /// A request was refused, or its response failed.
    pub(crate) fn error(
        &self,
        model: &str,
        target: &str,
        fairness: &str,
        priority: i32,
        code: &'static str,
    ) {
        let s = &self.store;
        let key = SeriesKey {
            model: s.models.label(model).to_owned(),
            target: s.models.label(target).to_owned(),
            fairness: s.fairness_ids.label(fairness).to_owned(),
            priority,
        };
        let mut errors = s.errors.lock().unwrap_or_else(PoisonError::into_inner);
        *errors.entry((key, code)).or_default() += 1;
    }

    /// A routed request's response failed.
    pub(crate) fn series_error(&self, series: &RequestSeries, code: &'static str) {
        let mut errors = self
            .store
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *errors.entry((series.key.clone(), code)).or_default() += 1;
    }

    pub(crate) fn scheduling_took(&self, took: Duration) {
        self.scheduler_e2e.observe(took.as_secs_f64());
    }

    /// One scheduling attempt for `target`: the endpoint picked, or `None`
    /// when none could be.
    pub(crate) fn attempt(&self, target: &str, picked: Option<&Endpoint>) {
        let s = &self.store;
        let status = if picked.is_some() {
            "success"
        } else {
            "failure"
        };
        let addr = picked.map(Endpoint::addr);
        let raw = s.attempts.hasher.hash_one((status, target, addr));
        let found = s
            .attempts
            .get(raw, attempt_is(status, target, addr))
            .or_else(|| {
                let t = s.models.label(target);
                let hash = s.attempts.hasher.hash_one((status, t, addr));
                Some(
                    s.attempts
                        .get_or_insert(hash, attempt_is(status, t, addr), || {
                            let key = AttemptKey {
                                status,
                                target: t.to_owned(),
                                addr,
                                endpoint: picked.map(|e| e.name().to_owned()).unwrap_or_default(),
                                namespace: picked
                                    .and_then(|e| e.label("namespace"))
                                    .unwrap_or_default()
                                    .to_owned(),
                                port: picked
                                    .map(|e| e.addr().port().to_string())
                                    .unwrap_or_default(),
                            };
                            (key, AtomicU64::new(0))
                        }),
                )
            });
        if let Some(a) = found {
            a.1.fetch_add(1, Relaxed);
        }
    }

    /// A request for `model` is sent for `target` instead; `source` is what
    /// chose it (`header` or `rule`).
    pub(crate) fn rewritten(&self, source: &'static str, model: &str, target: &str) {
        let s = &self.store;
        let key = (
            source,
            s.models.label(model).to_owned(),
            s.models.label(target).to_owned(),
        );
        *s.rewrites
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    /// The picked endpoint has `ratio` of a prompt of `prompt_bytes` cached.
    pub(crate) fn prefix_match(&self, ratio: f64, prompt_bytes: usize) {
        let p = &self.store.prefix_hit_ratio;
        p.ratio.observe(ratio);
        p.bytes.observe((ratio * prompt_bytes as f64).round());
    }
}

fn series_is<'a>(
    model: &'a str,
    target: &'a str,
    fairness: &'a str,
    priority: i32,
) -> impl Fn(&RequestSeries) -> bool + 'a {
    move |v| {
        v.key.priority == priority
            && v.key.model == model
            && v.key.target == target
            && v.key.fairness == fairness
    }
}

fn attempt_is<'a>(
    status: &'static str,
    target: &'a str,
    addr: Option<std::net::SocketAddr>,
) -> impl Fn(&(AttemptKey, AtomicU64)) -> bool + 'a {
    move |(k, _)| k.status == status && k.addr == addr && k.target == target
}

#[cfg(test)]
mod tests;
