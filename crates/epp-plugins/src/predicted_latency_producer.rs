//! `predicted-latency-producer`: learns each endpoint's time to first token
//! (TTFT) and time per output token (TPOT) from the responses it serves, and
//! predicts both for every candidate of a request.
//!
//! Each endpoint has two [`LatencyModel`]s over the load it carried when a
//! request was dispatched to it ([`epp_core::DispatchLoad`]: scraped queue,
//! running requests and KV use, this picker's dispatches since the scrape,
//! uncached and cached prompt tokens, a cold LoRA adapter) and the requests
//! ahead of it for a place in the endpoint's running batch, whose size limit
//! is learned from the scrapes (see `Models::slots`). The fleet has one
//! pair more, fitted on every endpoint's samples. What each response teaches
//! ([`epp_core::ResponseTiming`], 2xx only):
//!
//! ```text
//! streamed (server-sent events):  TTFT ← first body bytes − dispatch
//!                                 TPOT ← (end − first bytes) / (output tokens − 1)   (≥ 2 tokens)
//! whole body, TPOT model warm:    TTFT ← (end − dispatch) − (output tokens − 1) · predicted TPOT
//! whole body, TPOT model cold:    TTFT ← end − dispatch        (the end-to-end time, as llm-d
//!                                                               trains without streaming)
//! ```
//!
//! A prediction for a candidate comes from its endpoint's model once that
//! has seen `minSamples` samples, else from the fleet's scaled to how the
//! endpoint's own samples compare with it (`FleetRatio`); a new endpoint's
//! model starts from the fleet's coefficients. While the fleet's model is not
//! warm either there is no prediction, and readers fall back (the
//! `latency-scorer` to its heuristic blend). Headroom is
//! `objective − predicted` per the request's `x-llm-d-slo-ttft-ms`, and
//! `objective · sloBufferFactor − predicted` per its `x-llm-d-slo-tpot-ms`,
//! as llm-d buffers only the TPOT objective (0 − predicted without one).
//!
//! Predicting reads each model's published coefficients without locking or
//! allocating; fitting runs on the response path, one short lock per model.
//! Prediction quality is exported per endpoint
//! (`epp_latency_prediction_relative_error`: |predicted − observed| /
//! observed of each sample, predicted before the sample is learned), and
//! llm-d's per-model series of predictions and objectives are kept too
//! ([`request_metrics`]).

mod request_metrics;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
};

use epp_core::{
    AtomicHistogram, BuildError, Candidate, CycleContext, DEFAULT_PREFIX_PRODUCER, DataProducer,
    DispatchLoad, Endpoint, EndpointId, InferenceRequest, LatencyPrediction, LatencySlo,
    MetricFamily, MetricSink, Plugin, PluginMetrics, ResponseHooks, ResponseTiming,
};
use parking_lot::{Mutex, RwLock};

use crate::{Builtin, Features, LatencyModel, ModelSettings, invalid, non_negative_weights};

/// Parameters of `predicted-latency-producer` (llm-d's names where they have
/// a meaning here).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PredictedLatencyParams {
    /// Multiplies the request's TPOT objective before headroom is computed
    /// (above 1 loosens it); the TTFT objective is used as stated, as in
    /// llm-d. Default 1.
    #[serde(default = "one")]
    pub slo_buffer_factor: f64,
    /// Label naming an endpoint's role in disaggregated serving: endpoints
    /// whose role is `prefill` get no TPOT prediction (their TPOT neither
    /// helps nor hurts). Empty = no roles.
    #[serde(default)]
    pub endpoint_role_label: String,
    /// Whether to predict at all; `false` only learns. Default true.
    #[serde(default = "yes")]
    pub predict_in_produce: bool,
    /// llm-d's switch between TTFT at the first chunk and at the end. Here
    /// every response is judged on its own (streamed or not), so the value
    /// changes nothing; it is accepted so llm-d's configs load.
    #[serde(default)]
    pub streaming_mode: bool,
    /// llm-d's decode-token sampling of its predictor sidecar; accepted,
    /// no effect (every response's TPOT is learned).
    #[serde(default)]
    pub sampling_mean: Option<f64>,
    /// As `samplingMean`.
    #[serde(default)]
    pub max_decode_token_samples_for_prediction: Option<u64>,
    /// llm-d's per-request context TTL; accepted, no effect (the dispatch
    /// carries its own context).
    #[serde(default, rename = "contextTTL")]
    pub context_ttl: Option<String>,
    /// Multimodal encoder-cache features: not supported (a load error when
    /// true).
    #[serde(default)]
    pub use_encoder_cache_features: bool,
    /// As `useEncoderCacheFeatures`.
    #[serde(default)]
    pub encoder_cache_match_info_producer_name: Option<String>,
    /// Producer whose prefix matches say how much of the prompt an endpoint
    /// holds (default `approx-prefix-cache-producer`).
    #[serde(default)]
    pub prefix_match_info_producer_name: Option<String>,
    /// llm-d's in-flight load producer to read; this picker counts every
    /// endpoint's in-flight requests and tokens itself, so the name is
    /// accepted for llm-d's configs and changes nothing.
    #[serde(default)]
    pub in_flight_load_producer_name: Option<String>,
    /// Samples a model needs before it predicts. Default 32.
    #[serde(default = "default_min_samples")]
    pub min_samples: u64,
    /// Forgetting factor λ in (0, 1]: the models weigh roughly the last
    /// 1 / (1 − λ) samples. Default 0.995.
    #[serde(default = "default_forgetting")]
    pub forgetting: f64,
    /// Weight of the cached prompts a request would displace, counted in
    /// its delay to others: the prefill its uncached tokens would save
    /// were they cached, as the fleet's model predicts it (the same for
    /// every candidate), times this. An engine whose cache is full (as a
    /// busy one always is) evicts about as many cached tokens as it
    /// computes, which a later request must compute again; without this
    /// cost a cache miss on an idle endpoint looks free, and hot prompts
    /// get copied onto endpoints whose own prompts they evict. 0 counts
    /// only the requests already there. Default 1 (epp's own; llm-d has no
    /// such term).
    #[serde(default = "one")]
    pub displaced_cache_weight: f64,
    /// Weight of the queue a request would lengthen, counted in its delay
    /// to others: its own predicted wait in the endpoint's queue (the
    /// queue and slot-wait terms) times this, for the requests that will
    /// queue behind it. A waiting request holds each later one up by
    /// about its own service time while the queue lasts, but the queue
    /// drains, so only some of the wait is theirs; without this cost
    /// misses are charged for what they do to others and queueing is not,
    /// and a tenant stays on its cached, queued endpoint while another has
    /// places free. 0 counts no such delay. Default 0.5 (epp's own; llm-d
    /// has no such term).
    #[serde(default = "default_queue_delay_weight")]
    pub queue_delay_weight: f64,
    /// Weight of the wait for a place in the batch a request would add to
    /// the requests sent to its endpoint while it is there
    /// ([`PredictedLatencyProducer::later_wait`]), counted in its delay to
    /// others times this. The model's own prediction is flat below an
    /// engine's batch limit, so without this cost an endpoint with two
    /// places free ranks with one that has five, and under load the batches
    /// fill unevenly; unlike a count of requests it costs nothing while
    /// places stay free, and it is priced in the same milliseconds as a
    /// cached prompt or a warm adapter. 0 counts no such delay. Default 0
    /// (epp's own; llm-d has no such term).
    #[serde(default)]
    pub place_delay_weight: f64,
}

fn default_queue_delay_weight() -> f64 {
    0.5
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_min_samples() -> u64 {
    ModelSettings::default().min_samples
}
fn default_forgetting() -> f64 {
    ModelSettings::default().forgetting
}

impl Default for PredictedLatencyParams {
    fn default() -> Self {
        Self {
            slo_buffer_factor: 1.0,
            endpoint_role_label: String::new(),
            predict_in_produce: true,
            streaming_mode: false,
            sampling_mean: None,
            max_decode_token_samples_for_prediction: None,
            context_ttl: None,
            use_encoder_cache_features: false,
            encoder_cache_match_info_producer_name: None,
            prefix_match_info_producer_name: None,
            min_samples: default_min_samples(),
            forgetting: default_forgetting(),
            displaced_cache_weight: 1.0,
            queue_delay_weight: default_queue_delay_weight(),
            place_delay_weight: 0.0,
            in_flight_load_producer_name: None,
        }
    }
}

/// Upper bounds of the relative-error histogram (`+Inf` follows).
const ERROR_BOUNDS: &[f64] = &[0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0];

/// Counts |predicted − observed| / observed (a sample with no positive
/// observation or no finite prediction is not counted).
fn observe_error(errors: &AtomicHistogram, predicted: f64, observed: f64) {
    if observed > 0.0 && predicted.is_finite() {
        errors.observe(((predicted - observed).abs() / observed).min(1e6));
    }
}

const RELATIVE_ERROR: MetricFamily = MetricFamily {
    name: "epp_latency_prediction_relative_error",
    help: "|predicted - observed| / observed of each learned sample, predicted before learning \
           it, per endpoint and latency (ttft, tpot)",
};
const SAMPLES: MetricFamily = MetricFamily {
    name: "epp_latency_model_samples",
    help: "Samples each latency model learned from, per endpoint and latency",
};
const WARM: MetricFamily = MetricFamily {
    name: "epp_latency_model_warm",
    help: "1 when the endpoint's own latency model predicts (enough samples), else 0 \
           (the fleet's model predicts for it)",
};
const MEAN_ERROR: MetricFamily = MetricFamily {
    name: "epp_latency_model_mean_abs_error_seconds",
    help: "Recent mean absolute residual of each latency model, in seconds",
};

const FLEET_RATIO: MetricFamily = MetricFamily {
    name: "epp_latency_model_fleet_ratio",
    help: "How an endpoint's observed latency compares with what the fleet's model predicts now for \
           the loads of its recent samples: above 1 slower than the fleet; scales the fleet's \
           predictions for it until its own model is warm",
};

/// How one endpoint's latency compares with what the fleet's model
/// predicts for it: the mean latency of its recent samples over the fleet's
/// current prediction for their mean inputs (the model is linear, so that is
/// the mean of its predictions for them), pulled towards 1 by
/// [`Self::PSEUDO_SAMPLES`] samples of no difference. It scales the fleet's
/// predictions for an endpoint whose own model is not warm yet. The fleet's
/// model learns mostly from the endpoints that serve most; unscaled, it
/// priced a server four times slower than the rest at the others' speed
/// until the server had served its own `minSamples` — and how many it
/// served depended on that price. Against the fleet's model as it was when
/// each sample came, the ratio went stale as that model drifted towards the
/// others' speed (1.15 for the four-times-slower server): while it scales
/// predictions it is recomputed against the current model on every
/// response ([`Self::refresh`]); once the endpoint's own model is warm, only
/// for `/metrics`.
#[derive(Debug)]
struct FleetRatio {
    sums: Mutex<RatioSums>,
    /// The ratio as readers see it (f64 bits).
    ratio: AtomicU64,
}

/// Exponentially weighted sums of an endpoint's samples.
#[derive(Debug, Default)]
struct RatioSums {
    inputs: [f64; crate::FEATURES],
    observed: f64,
    weight: f64,
}

impl Default for FleetRatio {
    fn default() -> Self {
        Self {
            sums: Mutex::new(RatioSums::default()),
            ratio: AtomicU64::new(1f64.to_bits()),
        }
    }
}

impl FleetRatio {
    /// Samples of ratio 1 the estimate starts with: one slow sample moves
    /// it a third of the way in log terms, not all of it.
    const PSEUDO_SAMPLES: f64 = 2.0;
    /// Per-sample forgetting: about the last 20 samples count.
    const FORGETTING: f64 = 0.95;
    /// A sample is taken within [1/this, this] times what the fleet's model
    /// predicted for it (when it predicted), and the ratio within the same
    /// bounds, so one stalled request moves it boundedly.
    const MAX_RATIO: f64 = 10.0;

    /// Adds a sample: its inputs, the latency observed and what the fleet's
    /// model predicted for it, if it did.
    fn observe(&self, features: &Features, observed: f64, fleet_predicted: Option<f64>) {
        if !(observed.is_finite() && observed >= 0.0) {
            return;
        }
        let observed = match fleet_predicted {
            Some(p) if p > 0.0 => observed.clamp(p / Self::MAX_RATIO, p * Self::MAX_RATIO),
            _ => observed,
        };
        let x = features.vector();
        if !x.iter().all(|v| v.is_finite()) {
            return;
        }
        let mut sums = self.sums.lock();
        for (sum, v) in sums.inputs.iter_mut().zip(x) {
            *sum = Self::FORGETTING * *sum + v;
        }
        sums.observed = Self::FORGETTING * sums.observed + observed;
        sums.weight = Self::FORGETTING * sums.weight + 1.0;
    }

    /// Recomputes the ratio against `fleet` as it predicts now (no change
    /// while it is not warm or there are no samples).
    fn refresh(&self, fleet: &LatencyModel) {
        if !fleet.is_warm() {
            return;
        }
        let sums = self.sums.lock();
        let predicted = fleet.predict_sum(&sums.inputs);
        if !(sums.weight > 0.0 && predicted > 0.0 && sums.observed > 0.0) {
            return;
        }
        let bound = Self::MAX_RATIO.ln();
        let ln = (sums.observed / predicted).ln().clamp(-bound, bound);
        let ratio = (ln * sums.weight / (sums.weight + Self::PSEUDO_SAMPLES)).exp();
        self.ratio.store(ratio.to_bits(), Ordering::Relaxed);
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.ratio.load(Ordering::Relaxed))
    }
}

/// One latency's model, its error record and, for an endpoint, how it
/// compares with the fleet's model.
#[derive(Debug)]
#[repr(C)]
struct Learner {
    model: LatencyModel,
    errors: AtomicHistogram,
    /// Unused in the fleet's own learners.
    to_fleet: FleetRatio,
}

impl Learner {
    fn new(settings: ModelSettings, prior: [f64; crate::FEATURES]) -> Self {
        Self {
            model: LatencyModel::with_prior(settings, prior),
            errors: AtomicHistogram::new(ERROR_BOUNDS),
            to_fleet: FleetRatio::default(),
        }
    }
}

/// An endpoint's (or the fleet's) two models.
///
/// What every cycle reads of each candidate comes first, in one cache line
/// (the TTFT model's own first two lines follow it): the cycle finds them
/// cold.
#[derive(Debug)]
#[repr(C)]
struct Models {
    addr: Option<SocketAddr>,
    /// Seconds since the producer started when the endpoint was last a
    /// candidate or served: endpoints gone for [`FORGET_AFTER_SECS`] are
    /// forgotten (and their series leave `/metrics`).
    seen: AtomicU64,
    /// The last metrics version ([`Candidate::metrics_version`]) a cycle
    /// read the scrape time of: the same version is the same scrape, so
    /// [`Self::note_batch`] is skipped without reading the clock.
    metrics_seen: AtomicU64,
    /// The size limit of the endpoint's running batch (vLLM's
    /// `max_num_seqs`, or fewer when its KV cache filled first), as
    /// [`Self::slots`] reads it: the most requests seen running with
    /// requests waiting at two scrapes in a row (requests that arrive
    /// during a long prefill wait with places free, for a scrape or two)…
    /// (In the fleet's models: the largest limit any endpoint learned.)
    slots: AtomicU32,
    /// …if no scrape ever showed more running than that.
    most_running: AtomicU32,
    ttft: Learner,
    tpot: Learner,
    /// The last scrape [`Self::note_batch`] read (its time, in nanoseconds
    /// since the producer started) and, when it had requests waiting, its
    /// running count + 1 (else 0).
    last_scrape: AtomicU64,
    last_queued_running: AtomicU32,
    name: String,
}

/// An endpoint neither a candidate nor serving for this long is forgotten.
const FORGET_AFTER_SECS: u64 = 600;

impl Models {
    fn new(settings: ModelSettings, endpoint: Option<&Endpoint>, fleet: Option<&Models>) -> Self {
        let prior = |pick: fn(&Models) -> &Learner| {
            fleet.map_or([0.0; crate::FEATURES], |f| pick(f).model.coefficients())
        };
        Self {
            addr: endpoint.map(Endpoint::addr),
            name: endpoint.map_or_else(|| "fleet".to_owned(), |e| e.name().to_owned()),
            ttft: Learner::new(settings, prior(|m| &m.ttft)),
            tpot: Learner::new(settings, prior(|m| &m.tpot)),
            seen: AtomicU64::new(0),
            slots: AtomicU32::new(0),
            most_running: AtomicU32::new(0),
            last_scrape: AtomicU64::new(0),
            last_queued_running: AtomicU32::new(0),
            metrics_seen: AtomicU64::new(u64::MAX),
        }
    }

    /// Learns the batch limit from a scrape of the endpoint taken `at`
    /// nanoseconds after the producer started: requests still waiting at
    /// the next scrape with the same number running suggest the batch is
    /// full, and a scrape with more running proves a smaller suggestion
    /// wrong. Each scrape counts once, however many cycles read it.
    /// Returns the limit this scrape suggested (0: none).
    fn note_batch(&self, at: u64, running: u32, waiting: u32) -> u32 {
        let last = self.last_scrape.load(Ordering::Relaxed);
        if at <= last
            || self
                .last_scrape
                .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return 0;
        }
        self.most_running.fetch_max(running, Ordering::Relaxed);
        let queued = if waiting > 0 {
            running.saturating_add(1)
        } else {
            0
        };
        let before = self.last_queued_running.swap(queued, Ordering::Relaxed);
        if queued != 0 && before == queued {
            self.slots.fetch_max(running, Ordering::Relaxed);
            running
        } else {
            0
        }
    }

    /// The batch limit learned so far: 0 while none is known (no queue
    /// seen at two scrapes, or more running seen since than the largest
    /// batch a queue was seen at).
    fn slots(&self) -> u32 {
        let slots = self.slots.load(Ordering::Relaxed);
        if slots >= self.most_running.load(Ordering::Relaxed) {
            slots
        } else {
            0
        }
    }

    /// [`Self::slots`], or while the endpoint has none, `fleet`'s (the
    /// largest any endpoint learned) if no scrape of this one showed more
    /// running. A fleet's servers mostly share one limit, and one learns
    /// it only from a queue of its own: in the routing benchmark's
    /// decode-bound workload two servers in four had not seen one when
    /// the rate first filled their batches, so their predictions had no
    /// wait in them at eight running and one queued, and they kept being
    /// picked while requests waited seconds for a place.
    fn slots_or(&self, fleet: u32) -> u32 {
        match self.slots() {
            0 if fleet >= self.most_running.load(Ordering::Relaxed) => fleet,
            own => own,
        }
    }

    /// Recomputes the endpoint's ratios to the fleet's models (`fleet`):
    /// only those that scale predictions (its own model not warm) unless
    /// `all`.
    fn refresh_ratios(&self, fleet: &Models, all: bool) {
        for (own, fleet) in [(&self.ttft, &fleet.ttft), (&self.tpot, &fleet.tpot)] {
            if all || !own.model.is_warm() {
                own.to_fleet.refresh(&fleet.model);
            }
        }
    }

    /// Notes that the endpoint is still around at `now` (seconds); a write
    /// only when the second changed, so concurrent cycles mostly read.
    fn touch(&self, now: u64) {
        if self.seen.load(Ordering::Relaxed) != now {
            self.seen.store(now, Ordering::Relaxed);
        }
    }

    fn gone(&self, now: u64) -> bool {
        now.saturating_sub(self.seen.load(Ordering::Relaxed)) > FORGET_AFTER_SECS
    }
}

/// `predicted-latency-producer`: see the module docs for the model.
#[derive(Debug)]
pub struct PredictedLatencyProducer {
    name: String,
    params: PredictedLatencyParams,
    settings: ModelSettings,
    fleet: Models,
    /// By endpoint id; an entry whose address differs belongs to another
    /// endpoint and is replaced.
    endpoints: RwLock<Vec<Option<Arc<Models>>>>,
    /// When the producer was built (the clock of [`Models::seen`]).
    started: std::time::Instant,
    /// llm-d's per-model prediction and objective series.
    requests: request_metrics::RequestMetrics,
}

impl Builtin for PredictedLatencyProducer {
    const TYPE: &'static str = "predicted-latency-producer";
    type Params = PredictedLatencyParams;

    /// # Errors
    /// A non-positive or non-finite `sloBufferFactor`, `forgetting` outside
    /// (0, 1], `minSamples` of 0, a negative or non-finite
    /// `displacedCacheWeight` or `queueDelayWeight`, or
    /// `useEncoderCacheFeatures: true`.
    fn build(name: impl Into<String>, params: PredictedLatencyParams) -> Result<Self, BuildError> {
        if !(params.slo_buffer_factor.is_finite() && params.slo_buffer_factor > 0.0) {
            return Err(invalid(
                Self::TYPE,
                "sloBufferFactor",
                params.slo_buffer_factor,
                "must be a finite number > 0",
            ));
        }
        if !(params.forgetting > 0.0 && params.forgetting <= 1.0) {
            return Err(invalid(
                Self::TYPE,
                "forgetting",
                params.forgetting,
                "must be in (0, 1]",
            ));
        }
        if params.min_samples == 0 {
            return Err(invalid(Self::TYPE, "minSamples", 0, "must be at least 1"));
        }
        non_negative_weights(
            Self::TYPE,
            &[
                ("displacedCacheWeight", params.displaced_cache_weight),
                ("queueDelayWeight", params.queue_delay_weight),
                ("placeDelayWeight", params.place_delay_weight),
            ],
        )?;
        if params.use_encoder_cache_features {
            return Err(invalid(
                Self::TYPE,
                "useEncoderCacheFeatures",
                true,
                "multimodal encoder-cache features are not supported by this picker",
            ));
        }
        let settings = ModelSettings {
            forgetting: params.forgetting,
            min_samples: params.min_samples,
            ..ModelSettings::default()
        };
        Ok(Self {
            name: name.into(),
            settings,
            fleet: Models::new(settings, None, None),
            endpoints: RwLock::new(Vec::new()),
            started: std::time::Instant::now(),
            requests: request_metrics::RequestMetrics::default(),
            params,
        })
    }
}

impl Plugin for PredictedLatencyProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_response_hooks(&self) -> Option<&dyn ResponseHooks> {
        Some(self)
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        Some(self)
    }
    fn prefix_match_source(&self) -> Option<&str> {
        Some(
            self.params
                .prefix_match_info_producer_name
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(DEFAULT_PREFIX_PRODUCER),
        )
    }
}

/// What a model pair predicts for one load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Predicted {
    /// Time to first token, milliseconds.
    pub ttft_ms: f64,
    /// Of it, the request's own work: the engine time others at the
    /// endpoint wait through (its prompt's prefill, a cold adapter).
    pub own_work_ms: f64,
    /// Of it, the wait in the endpoint's queue (for a place in its batch).
    pub queue_wait_ms: f64,
    /// Time per output token, milliseconds, when known.
    pub tpot_ms: Option<f64>,
}

impl PredictedLatencyProducer {
    /// The models of `id` when they belong to the endpoint at `addr`.
    fn models_of(&self, id: EndpointId, addr: SocketAddr) -> Option<Arc<Models>> {
        let map = self.endpoints.read();
        map.get(id.index())
            .and_then(Option::as_ref)
            .filter(|m| m.addr == Some(addr))
            .cloned()
    }

    /// Seconds since the producer was built.
    fn now(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The models of `endpoint`, created from the fleet's when missing
    /// (forgetting, then, endpoints long gone).
    fn models_for(&self, endpoint: &Endpoint) -> Arc<Models> {
        let now = self.now();
        if let Some(m) = self.models_of(endpoint.id(), endpoint.addr()) {
            m.touch(now);
            return m;
        }
        let mut map = self.endpoints.write();
        for slot in map.iter_mut() {
            if slot.as_ref().is_some_and(|m| m.gone(now)) {
                *slot = None;
            }
        }
        let i = endpoint.id().index();
        if map.len() <= i {
            map.resize(i + 1, None);
        }
        match &map[i] {
            Some(m) if m.addr == Some(endpoint.addr()) => Arc::clone(m),
            _ => {
                let m = Arc::new(Models::new(
                    self.settings,
                    Some(endpoint),
                    Some(&self.fleet),
                ));
                m.touch(now);
                map[i] = Some(Arc::clone(&m));
                m
            }
        }
    }

    /// The batch limit predictions use for an endpoint with models `own`:
    /// its own, or the fleet's ([`Models::slots_or`]); the fleet's for an
    /// endpoint with no models yet.
    fn slots_of(&self, own: Option<&Models>) -> u32 {
        let fleet = self.fleet.slots();
        own.map_or(fleet, |m| m.slots_or(fleet))
    }

    /// Whether `endpoint` only prefills (TPOT means nothing there).
    fn prefill_only(&self, endpoint: &Endpoint) -> bool {
        !self.params.endpoint_role_label.is_empty()
            && endpoint.label(&self.params.endpoint_role_label) == Some("prefill")
    }

    /// What the endpoint with these models (or the fleet, where they are
    /// not warm) predicts for `load` (TPOT only when `tpot`); `None` while
    /// neither is warm.
    // Always inlined into the cycle's loop: returned through memory, its
    // result stalled the loop on every candidate.
    #[inline(always)]
    fn predict_with(
        &self,
        own: Option<&Models>,
        load: &DispatchLoad,
        tpot: bool,
    ) -> Option<Predicted> {
        let f = Features::at(load, self.slots_of(own));
        let (ttft, scale) = self.warm(own, |m| &m.ttft)?;
        let parts = ttft.predict_parts(&f)?;
        Some(Predicted {
            ttft_ms: scale * parts.total,
            own_work_ms: scale * parts.own_work,
            queue_wait_ms: scale * parts.queue_wait,
            tpot_ms: if tpot {
                self.warm(own, |m| &m.tpot)
                    .and_then(|(m, scale)| Some(scale * m.predict_unchecked(&f)?))
            } else {
                None
            },
        })
    }

    /// The model that predicts one latency (`get`) for an endpoint with
    /// models `own`, and the factor its predictions take: the endpoint's
    /// own, or the fleet's scaled to how the endpoint compares; `None`
    /// while neither is warm.
    #[inline(always)]
    fn warm<'a>(
        &'a self,
        own: Option<&'a Models>,
        get: fn(&Models) -> &Learner,
    ) -> Option<(&'a LatencyModel, f64)> {
        match own.map(get) {
            Some(l) if l.model.is_warm() => Some((&l.model, 1.0)),
            own => Some(&get(&self.fleet).model)
                .filter(|m| m.is_warm())
                .map(|m| (m, own.map_or(1.0, |l| l.to_fleet.get()))),
        }
    }

    /// [`Self::later_wait`] for an endpoint with models `own`.
    // Out of the cycle's loop: only `placeDelayWeight` above 0 calls it.
    #[inline(never)]
    fn later_wait_with(&self, own: Option<&Models>, load: &DispatchLoad) -> Option<f64> {
        let (ttft, scale) = self.warm(own, |m| &m.ttft)?;
        let (there, slots) = (load.requests_there(), self.slots_of(own));
        let full = Features::batch_wait(there.saturating_mul(2), slots)
            - Features::batch_wait(there, slots);
        Some(scale * ttft.slot_wait_ms(full as f64))
    }

    /// How much longer the requests sent to `endpoint` while a request
    /// with `load` is there would wait for a place in its batch with it
    /// sent before them, in milliseconds (`None` while no model is warm):
    /// as many are taken to come as are there now (Little's law, in a
    /// steady state), and the `j`-th of them finds `there + j` requests
    /// ahead with it and `there + j − 1` without, so the places they wait
    /// for sum (telescoping) to
    /// [`Features::batch_wait`]`(2 · there) − batch_wait(there)`, each
    /// priced by the endpoint's model ([`LatencyModel::slot_wait_ms`]).
    /// Convex in the load: nothing while places stay free for all of
    /// them, then one place's wait for each that finds the batch full.
    /// Only the batch's places: the room in the KV cache a later request
    /// needs depends on its prompt and what of it is cached there, which
    /// is not known yet (priced as this one's prompt, misses made every
    /// many-tenants request costlier: p50 1.14× at 8 req/s in one run).
    #[must_use]
    pub fn later_wait(&self, endpoint: &Endpoint, load: &DispatchLoad) -> Option<f64> {
        let own = self.models_of(endpoint.id(), endpoint.addr());
        self.later_wait_with(own.as_deref(), load)
    }

    /// The prediction for `endpoint` carrying `load` (for tests and tools).
    #[must_use]
    pub fn predict(&self, endpoint: &Endpoint, load: &DispatchLoad) -> Option<Predicted> {
        let own = self.models_of(endpoint.id(), endpoint.addr());
        self.predict_with(own.as_deref(), load, true)
    }

    /// Learns one observation of an endpoint into its learner `own` and the
    /// fleet's `fleet` (recording each model's error first when it already
    /// predicts, and how the endpoint compares with the fleet's model).
    fn learn(own: &Learner, fleet: &Learner, features: &Features, observed_ms: f64) {
        if let Some(p) = own.model.predict(features) {
            observe_error(&own.errors, p, observed_ms);
        }
        let fleet_predicted = fleet.model.predict(features);
        if let Some(p) = fleet_predicted {
            observe_error(&fleet.errors, p, observed_ms);
        }
        own.to_fleet.observe(features, observed_ms, fleet_predicted);
        own.model.observe(features, observed_ms);
        fleet.model.observe(features, observed_ms);
    }
}

impl DataProducer for PredictedLatencyProducer {
    fn produces_latency_predictions(&self) -> bool {
        true
    }

    fn produce(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) {
        let factor = self.params.slo_buffer_factor;
        let stated = LatencySlo::of(cx.request);
        let slo = LatencySlo {
            ttft_ms: stated.ttft_ms,
            tpot_ms: stated.tpot_ms.map(|v| v * factor),
        };
        let state = &mut *cx.state;
        state.latency.slo = slo;
        state.latency.computed = true;
        if !self.params.predict_in_produce {
            return;
        }
        let debug = tracing::enabled!(tracing::Level::DEBUG);
        // TPOT only matters against a TPOT objective (else its headroom is
        // 0 everywhere); the debug log shows it anyway.
        let want_tpot = slo.tpot_ms.is_some() || debug;
        let place_weight = self.params.place_delay_weight;
        // One read lock for the whole cycle: fitting only takes it to add
        // an endpoint.
        let map = self.endpoints.read();
        // One clock read for the cycle: when it started (the prediction
        // time recorded below), and the models' `seen` second.
        let started = std::time::Instant::now();
        let now = started.saturating_duration_since(self.started).as_secs();
        // The prefill of the cached tokens a miss evicts, priced by the
        // fleet's model for every candidate alike, as what a hit saves
        // (identifiable even when every prompt has one length): an
        // endpoint's own model has fewer hits and misses to tell them apart.
        let displaced_per_token = self.params.displaced_cache_weight
            * self.fleet.ttft.model.prefill_a_hit_saves_per_1k()
            / 1000.0;
        let mut predicted = false;
        for c in candidates {
            let load = DispatchLoad::of(c, cx.request, state.prefix.ratio(c.id()));
            let own = map
                .get(c.id().index())
                .and_then(Option::as_deref)
                .filter(|m| m.addr == Some(c.endpoint.addr()));
            if let Some(m) = own {
                m.touch(now);
                let version = c.metrics_version();
                if m.metrics_seen.load(Ordering::Relaxed) != version
                    && let Some(at) = c.metrics.updated_at
                {
                    m.metrics_seen.store(version, Ordering::Relaxed);
                    let at = at.saturating_duration_since(self.started).as_nanos();
                    let at = u64::try_from(at).unwrap_or(u64::MAX).max(1);
                    let learned = m.note_batch(at, c.metrics.running, c.metrics.waiting);
                    // A locked read-modify-write only when there is
                    // something to raise it with: run for every candidate,
                    // it took over a quarter of this loop's own time.
                    if learned > self.fleet.slots.load(Ordering::Relaxed) {
                        self.fleet.slots.fetch_max(learned, Ordering::Relaxed);
                    }
                }
            }
            let Some(p) = self.predict_with(own, &load, want_tpot) else {
                continue;
            };
            let tpot = if self.prefill_only(&c.endpoint) {
                None
            } else {
                p.tpot_ms
            };
            // A miss holds up every request there by its prefill and
            // evicts cached prompts; a request that waits in the queue
            // lengthens the waits of the requests that will queue behind
            // it, and one that takes a last place makes later ones wait.
            let displaced = displaced_per_token * load.uncached_tokens as f64;
            let mut queued_behind = self.params.queue_delay_weight * p.queue_wait_ms;
            if place_weight > 0.0 {
                queued_behind += place_weight * self.later_wait_with(own, &load).unwrap_or(0.0);
            }
            let prediction = LatencyPrediction::new(p.ttft_ms, tpot, slo).with_delay_to_others(
                p.own_work_ms * load.requests_there() as f64 + displaced + queued_behind,
            );
            state.latency.set(c.id(), prediction);
            predicted = true;
            if debug {
                self.log_prediction(cx.request, c, own, &load, prediction);
            }
        }
        if predicted {
            self.requests.predicted(cx.request, started.elapsed());
        }
    }
}

impl PredictedLatencyProducer {
    /// The debug log's line for one candidate's prediction (out of the
    /// cycle's loop, which then keeps each prediction in registers).
    #[cold]
    #[inline(never)]
    fn log_prediction(
        &self,
        request: &InferenceRequest,
        c: &Candidate,
        own: Option<&Models>,
        load: &DispatchLoad,
        prediction: LatencyPrediction,
    ) {
        tracing::debug!(
            request_id = %request.request_id,
            endpoint = %c.endpoint.addr_str(),
            ttft_ms = prediction.ttft_ms,
            tpot_ms = prediction.tpot_ms,
            ttft_headroom_ms = prediction.ttft_headroom_ms,
            tpot_headroom_ms = prediction.tpot_headroom_ms,
            delay_to_others_ms = prediction.delay_to_others_ms,
            own_model = own.is_some_and(|m| m.ttft.model.is_warm()),
            waiting = load.waiting,
            running = load.running,
            dispatched = load.dispatched,
            unanswered = load.unanswered,
            unanswered_uncached_tokens = load.unanswered_uncached_tokens,
            kv_usage = load.kv_usage,
            uncached_tokens = load.uncached_tokens,
            cached_tokens = load.cached_tokens(),
            slots = self.slots_of(own),
            kv_wait = load.kv_wait(),
            "latency prediction"
        );
    }
}

impl PredictedLatencyProducer {
    /// Records a completed response in llm-d's per-model series
    /// ([`request_metrics`]), before it is learned: its observed TTFT (as
    /// the client saw it) and `tpot`, what was predicted for it when its
    /// endpoint was picked, and whether it met the request's objectives.
    /// A TPOT the cycle did not predict (it does only against a TPOT
    /// objective) is what `models` predict now for the same load.
    fn record_response(
        &self,
        request: &InferenceRequest,
        models: &Models,
        timing: &ResponseTiming,
        tpot: Option<f64>,
    ) {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let ttft_ms = match timing.first_byte {
            Some(first) if timing.streamed => ms(first),
            _ => ms(timing.total),
        };
        let predicted_tpot_ms = tpot.and_then(|_| {
            timing
                .predicted
                .map(|p| p.tpot_ms)
                .filter(|t| *t > 0.0)
                .or_else(|| {
                    self.predict_with(Some(models), &timing.load, true)
                        .and_then(|p| p.tpot_ms)
                })
        });
        let slo = LatencySlo::of(request);
        self.requests.completed(
            request,
            &request_metrics::Observed {
                ttft_ms,
                tpot_ms: tpot,
                predicted_ttft_ms: timing.predicted.map(|p| p.ttft_ms),
                predicted_tpot_ms,
                ttft_objective_ms: slo.ttft_ms,
                tpot_objective_ms: slo.tpot_ms,
            },
        );
    }
}

impl ResponseHooks for PredictedLatencyProducer {
    fn response_timing(
        &self,
        request: &InferenceRequest,
        endpoint: &Endpoint,
        timing: &ResponseTiming,
    ) {
        if !(200..300).contains(&timing.status) {
            return;
        }
        let models = self.models_for(endpoint);
        let slots = self.slots_of(Some(&models));
        let f = Features::at(&timing.load, slots);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let total = ms(timing.total);
        let tokens = timing.output_tokens.unwrap_or(0);
        let prefill_only = self.prefill_only(endpoint);
        let (ttft, tpot) = match timing.first_byte {
            Some(first) if timing.streamed => {
                let first = ms(first);
                let tpot = (tokens >= 2 && !prefill_only)
                    .then(|| (total - first).max(0.0) / (tokens - 1) as f64);
                (first, tpot)
            }
            _ => {
                let decode = self
                    .predict_with(Some(&models), &timing.load, true)
                    .and_then(|p| p.tpot_ms)
                    .filter(|_| tokens >= 2 && !prefill_only)
                    .map_or(0.0, |tpot| (tokens - 1) as f64 * tpot);
                ((total - decode).max(0.0), None)
            }
        };
        tracing::debug!(
            endpoint = %endpoint.addr_str(),
            ttft_ms = ttft,
            predicted_ttft_ms = models.ttft.model.predict(&f),
            fleet_predicted_ttft_ms = self.fleet.ttft.model.predict(&f),
            tpot_ms = tpot,
            streamed = timing.streamed,
            waiting = timing.load.waiting,
            running = timing.load.running,
            dispatched = timing.load.dispatched,
            unanswered = timing.load.unanswered,
            unanswered_uncached_tokens = timing.load.unanswered_uncached_tokens,
            kv_usage = timing.load.kv_usage,
            uncached_tokens = timing.load.uncached_tokens,
            cached_tokens = timing.load.cached_tokens(),
            adapter_cold = timing.load.adapter_cold,
            adapter_blocked = timing.load.adapter_blocked,
            adapter_release_ms = timing.load.adapter_release_ms,
            slots,
            kv_wait = timing.load.kv_wait(),
            "latency sample"
        );
        self.record_response(request, &models, timing, tpot);
        Self::learn(&models.ttft, &self.fleet.ttft, &f, ttft);
        if let Some(tpot) = tpot {
            Self::learn(&models.tpot, &self.fleet.tpot, &f, tpot);
        }
        // The fleet's models moved: the ratios predictions use follow them
        // (those of endpoints whose own model is not warm, a few
        // multiply-adds each); the others are refreshed for `/metrics`.
        for m in self.endpoints.read().iter().flatten() {
            m.refresh_ratios(&self.fleet, false);
        }
    }
}

impl PluginMetrics for PredictedLatencyProducer {
    fn report(&self, out: &mut dyn MetricSink) {
        let map = self.endpoints.read();
        let now = self.now();
        let current = map.iter().flatten().filter(|m| !m.gone(now)).map(|m| &**m);
        let all = std::iter::once(&self.fleet).chain(current);
        for m in all {
            for (latency, learner) in [("ttft", &m.ttft), ("tpot", &m.tpot)] {
                let labels = [("endpoint", m.name.as_str()), ("latency", latency)];
                learner.errors.report(out, RELATIVE_ERROR, &labels);
                out.counter(SAMPLES, &labels, learner.model.samples());
                out.gauge(WARM, &labels, f64::from(u8::from(learner.model.is_warm())));
                out.gauge(MEAN_ERROR, &labels, learner.model.mean_abs_error() / 1e3);
            }
            if m.addr.is_some() {
                m.refresh_ratios(&self.fleet, true);
                for (latency, learner) in [("ttft", &m.ttft), ("tpot", &m.tpot)] {
                    let labels = [("endpoint", m.name.as_str()), ("latency", latency)];
                    out.gauge(FLEET_RATIO, &labels, learner.to_fleet.get());
                }
            }
        }
        drop(map);
        self.requests.report(
            out,
            [("plugin_name", &self.name), ("plugin_type", Self::TYPE)],
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use epp_core::{EndpointMetrics, TPOT_SLO_HEADER, TTFT_SLO_HEADER};

    use super::*;
    use crate::testing::{endpoint, with_cx};

    fn producer(min_samples: u64) -> PredictedLatencyProducer {
        producer_with(PredictedLatencyParams {
            min_samples,
            ..PredictedLatencyParams::default()
        })
    }

    fn producer_with(params: PredictedLatencyParams) -> PredictedLatencyProducer {
        PredictedLatencyProducer::build("p", params).unwrap()
    }

    fn load(waiting: u32, prompt_tokens: u64) -> DispatchLoad {
        DispatchLoad {
            waiting,
            prompt_tokens,
            uncached_tokens: prompt_tokens,
            ..DispatchLoad::default()
        }
    }

    /// A streamed response: TTFT `ttft_ms`, then `tokens` tokens `tpot_ms` apart.
    fn streamed(load: DispatchLoad, ttft_ms: f64, tpot_ms: f64, tokens: u64) -> ResponseTiming {
        let first = Duration::from_secs_f64(ttft_ms / 1e3);
        ResponseTiming {
            load,
            predicted: None,
            first_byte: Some(first),
            total: first + Duration::from_secs_f64(tpot_ms * (tokens - 1) as f64 / 1e3),
            streamed: true,
            output_tokens: Some(tokens),
            status: 200,
        }
    }

    fn request() -> InferenceRequest {
        InferenceRequest::builder("m").build()
    }

    /// Server `i`'s TTFT: `base` + 20 ms per queued request + 50 ms per
    /// thousand prompt tokens.
    fn ttft(base: f64, l: &DispatchLoad) -> f64 {
        base + 20.0 * f64::from(l.waiting) + 0.05 * l.uncached_tokens as f64
    }

    #[test]
    fn learns_each_endpoints_speed_from_streamed_responses() {
        let p = producer(16);
        let fast = endpoint(0, EndpointMetrics::fresh());
        let slow = endpoint(1, EndpointMetrics::fresh());
        for i in 0..400u32 {
            let l = load(i % 7, u64::from(i % 13) * 300);
            p.response_timing(&request(), &fast, &streamed(l, ttft(10.0, &l), 5.0, 20));
            p.response_timing(&request(), &slow, &streamed(l, ttft(80.0, &l), 15.0, 20));
        }
        let probe = load(3, 2000);
        let f = p.predict(&fast, &probe).unwrap();
        let s = p.predict(&slow, &probe).unwrap();
        let want_fast = ttft(10.0, &probe);
        let want_slow = ttft(80.0, &probe);
        assert!((f.ttft_ms - want_fast).abs() / want_fast < 0.05, "{f:?}");
        assert!((s.ttft_ms - want_slow).abs() / want_slow < 0.05, "{s:?}");
        assert!((f.tpot_ms.unwrap() - 5.0).abs() < 0.25, "{f:?}");
        assert!((s.tpot_ms.unwrap() - 15.0).abs() < 0.75, "{s:?}");
    }

    #[test]
    fn nothing_is_predicted_until_a_model_is_warm_then_new_endpoints_use_the_fleets() {
        let p = producer(8);
        let seen = endpoint(0, EndpointMetrics::fresh());
        let new = endpoint(1, EndpointMetrics::fresh());
        let l = load(1, 1000);
        for i in 0..8 {
            assert_eq!(p.predict(&seen, &l), None, "after {i} samples");
            p.response_timing(&request(), &seen, &streamed(l, 70.0, 5.0, 10));
        }
        assert!(p.predict(&seen, &l).is_some());
        let fleet = p.predict(&new, &l).expect("the fleet's model answers");
        assert!((fleet.ttft_ms - 70.0).abs() < 1.0, "{fleet:?}");
    }

    #[test]
    fn an_endpoint_not_warm_yet_gets_the_fleets_prediction_scaled_to_its_own_speed() {
        // The fleet's model learns from a fast server only; a server four
        // times slower has served five requests, too few for its own model.
        let p = producer(32);
        let fast = endpoint(0, EndpointMetrics::fresh());
        let slow = endpoint(1, EndpointMetrics::fresh());
        let unseen = endpoint(2, EndpointMetrics::fresh());
        for i in 0..200u32 {
            let l = load(i % 5, u64::from(i % 9) * 400);
            p.response_timing(&request(), &fast, &streamed(l, ttft(10.0, &l), 5.0, 20));
        }
        for i in 0..5u32 {
            let l = load(i % 3, u64::from(i % 4) * 500);
            let slower = 4.0 * ttft(10.0, &l);
            p.response_timing(&request(), &slow, &streamed(l, slower, 20.0, 20));
        }
        let probe = load(2, 1500);
        let fleet = ttft(10.0, &probe);
        let f = p.predict(&fast, &probe).unwrap();
        let s = p.predict(&slow, &probe).unwrap();
        let u = p.predict(&unseen, &probe).unwrap();
        assert!((f.ttft_ms - fleet).abs() / fleet < 0.05, "{f:?}");
        assert!(
            (u.ttft_ms - fleet).abs() / fleet < 0.05,
            "no samples, no scaling: {u:?}"
        );
        // Five samples of ratio 4 against two of no difference: 4^(5/7)
        // (the forgetting aside), between 2.5 and 4 times the fleet's.
        let ratio = s.ttft_ms / fleet;
        assert!((2.5..4.0).contains(&ratio), "{ratio}: {s:?}");
        let tpot = s.tpot_ms.unwrap() / 5.0;
        assert!((2.5..4.0).contains(&tpot), "{tpot}: {s:?}");
        // Every part is scaled alike.
        assert!(
            (s.own_work_ms / s.ttft_ms - u.own_work_ms / u.ttft_ms).abs() < 1e-9,
            "{s:?} {u:?}"
        );
        assert!(
            (s.queue_wait_ms / s.ttft_ms - u.queue_wait_ms / u.ttft_ms).abs() < 1e-9,
            "{s:?} {u:?}"
        );
    }

    #[test]
    fn the_scale_follows_the_fleets_model_as_it_drifts() {
        // The fleet's model first learns from both servers alike, then from
        // the fast one alone; the slow one (20 samples, its own model not
        // warm) is still priced at four times the fast one.
        let p = producer(32);
        let fast = endpoint(0, EndpointMetrics::fresh());
        let slow = endpoint(1, EndpointMetrics::fresh());
        for i in 0..20u32 {
            let l = load(i % 3, u64::from(i % 4) * 500);
            p.response_timing(&request(), &fast, &streamed(l, ttft(10.0, &l), 5.0, 20));
            let slower = 4.0 * ttft(10.0, &l);
            p.response_timing(&request(), &slow, &streamed(l, slower, 20.0, 20));
        }
        for i in 0..300u32 {
            let l = load(i % 5, u64::from(i % 9) * 400);
            p.response_timing(&request(), &fast, &streamed(l, ttft(10.0, &l), 5.0, 20));
        }
        let probe = load(2, 1500);
        let f = p.predict(&fast, &probe).unwrap();
        let s = p.predict(&slow, &probe).unwrap();
        // 4 shrunk by the two pseudo-samples: 4^(12.8 / 14.8) ≈ 3.3.
        let ratio = s.ttft_ms / f.ttft_ms;
        assert!((2.8..4.0).contains(&ratio), "{ratio}: {s:?} {f:?}");
    }

    #[test]
    fn whole_bodies_teach_ttft_net_of_the_decode_the_tpot_model_expects() {
        let p = producer(4);
        let e = endpoint(0, EndpointMetrics::fresh());
        let l = load(0, 500);
        // Streamed responses teach TPOT = 10 ms and TTFT = 40 ms.
        for _ in 0..40 {
            p.response_timing(&request(), &e, &streamed(l, 40.0, 10.0, 11));
        }
        // A whole body of 101 tokens in 1040 ms: TTFT 40 ms once the
        // expected decode (100 · 10 ms) is taken off.
        let whole = ResponseTiming {
            load: l,
            predicted: None,
            first_byte: Some(Duration::from_millis(1039)),
            total: Duration::from_millis(1040),
            streamed: false,
            output_tokens: Some(101),
            status: 200,
        };
        for _ in 0..40 {
            p.response_timing(&request(), &e, &whole);
        }
        let got = p.predict(&e, &l).unwrap().ttft_ms;
        assert!((got - 40.0).abs() < 2.0, "{got}");
    }

    #[test]
    fn failures_teach_nothing() {
        let p = producer(1);
        let e = endpoint(0, EndpointMetrics::fresh());
        let mut t = streamed(load(0, 100), 5000.0, 1.0, 2);
        t.status = 503;
        p.response_timing(&request(), &e, &t);
        assert_eq!(p.predict(&e, &load(0, 100)), None);
    }

    #[test]
    fn produce_fills_predictions_with_headroom_against_the_requests_objective() {
        let p = producer(4);
        let fast = endpoint(0, EndpointMetrics::fresh());
        let slow = endpoint(1, EndpointMetrics::fresh());
        for _ in 0..20 {
            p.response_timing(&request(), &fast, &streamed(load(0, 25), 50.0, 5.0, 3));
            p.response_timing(&request(), &slow, &streamed(load(0, 25), 300.0, 5.0, 3));
        }
        let req = InferenceRequest::builder("m")
            .prompt("x".repeat(100))
            .header(TTFT_SLO_HEADER, "200")
            .build();
        let candidates = vec![Candidate::new(&fast), Candidate::new(&slow)];
        with_cx(&req, 1, |cx| {
            p.produce(cx, &candidates);
            let l = &cx.state.latency;
            assert!(l.computed);
            assert_eq!(l.slo.ttft_ms, Some(200.0));
            let (f, s) = (l.get(fast.id()).unwrap(), l.get(slow.id()).unwrap());
            assert!((f.ttft_headroom_ms - 150.0).abs() < 2.0, "{f:?}");
            assert!((s.ttft_headroom_ms + 100.0).abs() < 2.0, "{s:?}");
            assert!(f.meets_slo() && !s.meets_slo());
        });
        // The buffer factor loosens the TPOT objective alone (llm-d's rule).
        let p = producer_with(PredictedLatencyParams {
            min_samples: 4,
            slo_buffer_factor: 2.0,
            ..PredictedLatencyParams::default()
        });
        let req = InferenceRequest::builder("m")
            .header(TTFT_SLO_HEADER, "200")
            .header(TPOT_SLO_HEADER, "10")
            .build();
        with_cx(&req, 1, |cx| {
            p.produce(cx, &[]);
            assert_eq!(cx.state.latency.slo.ttft_ms, Some(200.0));
            assert_eq!(cx.state.latency.slo.tpot_ms, Some(20.0));
        });
    }

    #[test]
    fn a_miss_counts_the_cached_prompts_it_displaces_in_its_delay_to_others() {
        let idle = endpoint(0, EndpointMetrics::fresh());
        let req = InferenceRequest::builder("m")
            .prompt("x".repeat(8000))
            .build();
        let uncached = DispatchLoad::of(&Candidate::new(&idle), &req, 0.0).uncached_tokens;
        assert!(uncached > 1000, "{uncached}");
        let delay_with = |weight: f64| {
            let p = producer_with(PredictedLatencyParams {
                min_samples: 4,
                displaced_cache_weight: weight,
                ..PredictedLatencyParams::default()
            });
            // Hits and misses, so that the uncached tokens' prefill is told
            // apart from the fixed cost.
            for i in 0..400u32 {
                let l = DispatchLoad {
                    uncached_tokens: u64::from(i % 2) * u64::from(i % 13) * 300,
                    ..load(i % 7, u64::from(i % 13) * 300)
                };
                p.response_timing(&request(), &idle, &streamed(l, ttft(10.0, &l), 5.0, 20));
            }
            let mut delay = f64::NAN;
            with_cx(&req, 1, |cx| {
                p.produce(cx, &[Candidate::new(&idle)]);
                delay = cx.state.latency.get(idle.id()).unwrap().delay_to_others_ms;
            });
            delay
        };
        // Nobody is there to wait behind it: the delay is the prefill of
        // what it would evict (50 ms per thousand uncached tokens).
        let want = 0.05 * uncached as f64;
        let got = delay_with(1.0);
        assert!((got - want).abs() / want < 0.05, "{got} against {want}");
        let halved = delay_with(0.5);
        assert!((halved - want / 2.0).abs() / want < 0.05, "{halved}");
        assert_eq!(delay_with(0.0), 0.0);
    }

    /// A server of eight batch places: 40 ms for a cached prompt while a
    /// place is free, 80 ms more per request ahead of it for one.
    fn eight_places(l: &DispatchLoad) -> f64 {
        40.0 + 80.0 * (l.requests_there() + 1).saturating_sub(8) as f64
    }

    /// A scrape, just taken, showing `running` and `waiting` requests.
    fn scraped(running: u32, waiting: u32) -> EndpointMetrics {
        EndpointMetrics {
            running,
            waiting,
            ..EndpointMetrics::fresh()
        }
    }

    /// Endpoint `id`, just scraped with `running` and `waiting` requests.
    fn busy(id: u32, running: u32, waiting: u32) -> Arc<Endpoint> {
        endpoint(id, scraped(running, waiting))
    }

    #[test]
    fn a_full_batch_is_learned_from_scrapes_and_its_wait_predicted() {
        let server = |running: u32, waiting: u32| busy(0, running, waiting);
        let truth = eight_places;
        let full = server(8, 2);
        let sample = |running: u32, waiting: u32| DispatchLoad {
            running,
            waiting,
            prompt_tokens: 100,
            uncached_tokens: 100,
            ..DispatchLoad::default()
        };
        // Responses at every batch size, and queues at the full one.
        let learn = |p: &PredictedLatencyProducer| {
            for i in 0..600u32 {
                let running = i % 9;
                let l = sample(running, if running == 8 { i % 4 } else { 0 });
                p.response_timing(&request(), &full, &streamed(l, truth(&l), 5.0, 20));
            }
        };
        let p = producer(8);
        p.response_timing(&request(), &full, &streamed(sample(0, 0), 40.0, 5.0, 20));
        let m = p.models_of(full.id(), full.addr()).unwrap();
        assert_eq!(m.slots(), 0, "no scrape has shown a queue yet");
        // Scrapes without a queue say nothing of the limit; nor does a
        // queue seen once (a request that arrived during an engine step),
        // however many cycles read that scrape; one still there at the
        // next scrape with as many running does, until more are seen
        // running (requests that waited through a long prefill).
        let read = || {
            with_cx(&request(), 1, |cx| p.produce(cx, &[Candidate::new(&full)]));
            m.slots()
        };
        let scrape = |running: u32, waiting: u32| {
            full.set_metrics(scraped(running, waiting));
            read()
        };
        assert_eq!(scrape(1, 1), 0);
        assert_eq!(scrape(1, 1), 1);
        assert_eq!(scrape(5, 0), 0);
        assert_eq!(scrape(3, 1), 0);
        assert_eq!(scrape(4, 1), 0);
        assert_eq!(scrape(8, 2), 0);
        assert_eq!(read(), 0, "the same scrape read again");
        assert_eq!(scrape(8, 1), 8);
        assert_eq!(scrape(2, 0), 8, "the limit stays");
        learn(&p);
        // The requests that will be sent there while it is (as many as
        // are there now) and find the batch full wait for one more place
        // each with it there: none of the three later ones with three
        // there (places stay free for all), and every later one with
        // seven, eight or ten there.
        for ((running, waiting), later) in [(3, 0), (7, 0), (8, 0), (8, 2)].into_iter().zip([
            0.0,
            7.0 * 80.0,
            8.0 * 80.0,
            10.0 * 80.0,
        ]) {
            let l = sample(running, waiting);
            let got = p.predict(&full, &l).unwrap();
            let want = truth(&l);
            assert!(
                (got.ttft_ms - want).abs() / want < 0.1,
                "{running}/{waiting}: {got:?}"
            );
            let wait = want - 40.0;
            assert!((got.queue_wait_ms - wait).abs() <= 0.1 * want, "{got:?}");
            let got = p.later_wait(&full, &l).unwrap();
            assert!((got - later).abs() <= 8.0 + 0.1 * later, "{got}");
        }
        // The wait counts, weighted, in the delay to others: those who
        // will queue behind it wait longer too; and so, weighted apart,
        // do the ten later requests that find the batch full.
        let wait = 80.0 * 3.0;
        let later = 80.0 * 10.0;
        for (weight, place_weight) in [(0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.5, 1.0)] {
            let p = producer_with(PredictedLatencyParams {
                min_samples: 8,
                queue_delay_weight: weight,
                place_delay_weight: place_weight,
                ..PredictedLatencyParams::default()
            });
            p.response_timing(&request(), &full, &streamed(sample(0, 0), 40.0, 5.0, 20));
            for _ in 0..2 {
                full.set_metrics(scraped(8, 1));
                with_cx(&request(), 1, |cx| p.produce(cx, &[Candidate::new(&full)]));
            }
            learn(&p);
            full.set_metrics(scraped(8, 2));
            with_cx(&request(), 1, |cx| {
                p.produce(cx, &[Candidate::new(&full)]);
                let delay = cx.state.latency.get(full.id()).unwrap().delay_to_others_ms;
                let want = weight * wait + place_weight * later;
                assert!(
                    (delay - want).abs() <= 0.1 * want.max(wait),
                    "{weight}: {delay}"
                );
            });
        }
    }

    #[test]
    fn an_endpoint_without_a_limit_of_its_own_borrows_the_fleets() {
        // Three servers of one fleet, eight batch places each. Server 0
        // has shown a queue at two scrapes, server 1 has never run more
        // than five, server 2 was seen running twelve.
        let sample = |running: u32| DispatchLoad {
            running,
            prompt_tokens: 100,
            uncached_tokens: 100,
            ..DispatchLoad::default()
        };
        let p = producer(8);
        let servers = [busy(0, 0, 0), busy(1, 0, 0), busy(2, 0, 0)];
        let scrape = |i: usize, running: u32, waiting: u32| {
            let e = &servers[i];
            e.set_metrics(scraped(running, waiting));
            p.response_timing(&request(), e, &streamed(sample(0), 40.0, 5.0, 20));
            with_cx(&request(), 1, |cx| p.produce(cx, &[Candidate::new(e)]));
        };
        scrape(1, 5, 0);
        scrape(2, 12, 0);
        assert_eq!(p.fleet.slots(), 0, "no server knows its limit yet");
        scrape(0, 8, 1);
        scrape(0, 8, 1);
        assert_eq!(p.fleet.slots(), 8);
        // The fleet's model learns the limit's wait from server 0.
        let full = busy(0, 8, 0);
        for i in 0..600u32 {
            let l = sample(i % 9);
            p.response_timing(&request(), &full, &streamed(l, eight_places(&l), 5.0, 20));
        }
        let at_limit = sample(8);
        let with_wait = p.predict(&busy(1, 5, 0), &at_limit).unwrap().ttft_ms;
        assert!((with_wait - 120.0).abs() < 12.0, "{with_wait}");
        // Server 2 runs more than that limit: not its own, not borrowed.
        let without = p.predict(&busy(2, 12, 0), &at_limit).unwrap().ttft_ms;
        assert!(without < 80.0, "{without}");
    }

    #[test]
    fn an_endpoint_id_reused_by_another_address_starts_afresh() {
        let p = producer(2);
        let old = endpoint(0, EndpointMetrics::fresh());
        for _ in 0..4 {
            p.response_timing(&request(), &old, &streamed(load(0, 10), 900.0, 1.0, 2));
        }
        let replacement = Arc::new(Endpoint::new(0, "10.9.9.9:8000".parse().unwrap()));
        assert!(p.models_of(replacement.id(), replacement.addr()).is_none());
        let m = p.models_for(&replacement);
        assert_eq!(m.ttft.model.samples(), 0);
    }

    #[test]
    fn endpoints_long_gone_are_forgotten() {
        // A producer started long ago, so "last seen at second 0" is old.
        let p = PredictedLatencyProducer {
            started: std::time::Instant::now() - Duration::from_secs(FORGET_AFTER_SECS + 5),
            ..producer(2)
        };
        let gone = endpoint(0, EndpointMetrics::fresh());
        let fresh = Arc::new(Endpoint::new(1, "10.9.9.8:8000".parse().unwrap()));
        p.response_timing(&request(), &gone, &streamed(load(0, 10), 50.0, 1.0, 2));
        let m = p.models_of(gone.id(), gone.addr()).unwrap();
        assert!(!m.gone(p.now()), "just seen");
        m.seen.store(0, Ordering::Relaxed);
        assert!(m.gone(p.now()));
        drop(m);
        // The next endpoint to arrive sweeps it out.
        p.response_timing(&request(), &fresh, &streamed(load(0, 10), 50.0, 1.0, 2));
        assert!(p.models_of(gone.id(), gone.addr()).is_none(), "forgotten");
        assert!(p.models_of(fresh.id(), fresh.addr()).is_some());
    }

    #[test]
    fn reports_errors_per_endpoint() {
        let p = producer(2);
        let e = endpoint(0, EndpointMetrics::fresh());
        for _ in 0..5 {
            p.response_timing(&request(), &e, &streamed(load(0, 10), 50.0, 2.0, 4));
        }
        let mut sink = crate::test_sink::Sink::default();
        p.report(&mut sink);
        let get = |name: &str, who: &str| sink.get(name, &[who, "ttft"]);
        let who = e.name().to_owned();
        assert_eq!(get("epp_latency_model_samples", &who), Some(5.0));
        // Errors are recorded once the model predicts: samples 3 to 5.
        assert_eq!(
            get("epp_latency_prediction_relative_error", &who),
            Some(3.0)
        );
        assert_eq!(get("epp_latency_model_samples", "fleet"), Some(5.0));
    }

    #[test]
    fn reports_llm_ds_prediction_and_objective_series_per_model() {
        let p = producer(2);
        let e = endpoint(0, EndpointMetrics::fresh());
        for _ in 0..3 {
            p.response_timing(&request(), &e, &streamed(load(0, 10), 50.0, 2.0, 4));
        }
        let req = InferenceRequest::builder("m")
            .target_model("m-lora")
            .header(TTFT_SLO_HEADER, "40")
            .header(TPOT_SLO_HEADER, "10")
            .build();
        // A cycle that predicts records how long predicting took; one
        // that predicts nothing (no candidates) records nothing.
        let mut picked = None;
        with_cx(&req, 1, |cx| {
            p.produce(cx, &[Candidate::new(&e)]);
            picked = cx.state.latency.get(e.id()).copied();
        });
        with_cx(&req, 1, |cx| p.produce(cx, &[]));
        let picked = picked.expect("a prediction");
        // Streamed, 55 ms to the first token (over the 40 ms objective),
        // then 2 ms per token (within 10).
        let timing = ResponseTiming {
            predicted: Some(picked),
            ..streamed(load(0, 10), 55.0, 2.0, 4)
        };
        p.response_timing(&req, &e, &timing);
        // Whole, 30 ms: within the TTFT objective, no TPOT observed.
        let whole = ResponseTiming {
            streamed: false,
            first_byte: None,
            total: Duration::from_millis(30),
            ..streamed(load(0, 10), 30.0, 2.0, 4)
        };
        p.response_timing(&req, &e, &whole);

        let mut sink = crate::test_sink::Sink::default();
        p.report(&mut sink);
        let full = ["p", PredictedLatencyProducer::TYPE, "m", "m-lora"];
        let get = |name: &str, ty: Option<&str>| {
            let labels: Vec<&str> = full.iter().copied().chain(ty).collect();
            sink.get(name, &labels)
        };
        let deprecated = |name: &str, ty: &str| sink.get(name, &["m", "m-lora", ty]);
        // Histogram values are counts here.
        assert_eq!(
            get("llm_d_epp_request_predicted_ttft_seconds", None),
            Some(1.0)
        );
        assert_eq!(
            get("llm_d_epp_request_predicted_tpot_seconds", None),
            Some(1.0)
        );
        for latency in ["ttft", "tpot"] {
            let name = format!("llm_d_epp_request_{latency}_prediction_duration_seconds");
            assert_eq!(get(&name, None), Some(1.0), "{name}");
        }
        assert_eq!(
            get("llm_d_epp_request_slo_violation", Some("ttft")),
            Some(1.0)
        );
        assert_eq!(get("llm_d_epp_request_slo_violation", Some("tpot")), None);
        assert_eq!(
            deprecated("inference_objective_request_slo_violation", "ttft"),
            Some(1.0)
        );
        let last = |ty: &str| get("llm_d_epp_inference_request_metric", Some(ty));
        // The last response met the TTFT objective; the last one with a
        // TPOT met that one.
        assert_eq!(last("ttft_slo_violation"), Some(0.0));
        assert_eq!(last("tpot_slo_violation"), Some(0.0));
        assert_eq!(last("ttft"), Some(0.03));
        assert_eq!(last("tpot"), Some(0.002));
        assert_eq!(last("predicted_ttft"), Some(picked.ttft_ms / 1e3));
        assert!(last("ttft_prediction_duration").is_some_and(|d| d > 0.0));
        assert_eq!(
            deprecated("inference_objective_inference_request_metric", "ttft"),
            Some(0.03)
        );
    }

    #[test]
    fn bad_parameters_are_refused() {
        for (yaml, field) in [
            ("sloBufferFactor: 0", "sloBufferFactor"),
            ("forgetting: 1.5", "forgetting"),
            ("minSamples: 0", "minSamples"),
            ("displacedCacheWeight: -1", "displacedCacheWeight"),
            ("queueDelayWeight: -0.5", "queueDelayWeight"),
            ("queueDelayWeight: .nan", "queueDelayWeight"),
            ("placeDelayWeight: -1", "placeDelayWeight"),
            ("placeDelayWeight: .inf", "placeDelayWeight"),
            ("useEncoderCacheFeatures: true", "useEncoderCacheFeatures"),
        ] {
            let params: PredictedLatencyParams = serde_yaml_ng::from_str(yaml).unwrap();
            let err = PredictedLatencyProducer::build("p", params).unwrap_err();
            assert!(err.to_string().contains(field), "{yaml}: {err}");
        }
        let llm_d: PredictedLatencyParams = serde_yaml_ng::from_str(
            "{samplingMean: 1000, maxDecodeTokenSamplesForPrediction: 0, contextTTL: 5m, \
             streamingMode: true, endpointRoleLabel: llm-d.ai/role}",
        )
        .unwrap();
        assert!(PredictedLatencyProducer::build("p", llm_d).is_ok());
    }
}
