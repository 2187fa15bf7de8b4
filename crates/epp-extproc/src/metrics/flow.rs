//! Flow control's metrics, under the reference's names
//! (`inference_extension_flow_control_*`) and llm-d's
//! (`llm_d_epp_flow_control_*`).
//!
//! Observed as requests pass ([`FlowObserver`]), per flow (fairness id,
//! priority) and the requests' models (model and target model, as the
//! reference and llm-d label them): the requests and bytes queued, the time
//! requests spent in flow control and the time their enqueue took, by
//! outcome; and the controller's dispatch cycles. A request's models travel
//! through the controller as its tag (an index of the pair, [`FlowMetrics::
//! models_tag`]); a series is found by the hash of its labels, so an
//! observation allocates nothing once its flow and models were seen. Requests per
//! priority and outcome (`llm_d_epp_flow_control_requests_total`) are the
//! time-in-flow-control counts added together at scrape time.
//!
//! Read from the running controller at scrape time (nothing on the request
//! path): the pool's saturation as dispatch reads it, each band's share of
//! its capacity, and the saturation detector's stale endpoints.

use std::{
    collections::BTreeMap,
    fmt,
    hash::BuildHasher,
    sync::{
        Arc, PoisonError, RwLock, Weak,
        atomic::{AtomicI64, Ordering::Relaxed},
    },
    time::Duration,
};

use epp_core::{
    LabelCap,
    flow::{FlowObserver, FlowUsage, Outcome},
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{
    Interned, MetricGenerations,
    encode::{LabelValues, encode_counters, encode_gauges, encode_histograms},
    hist::{self, AtomicHistogram, HistogramValue},
};
use crate::decision::Decider;

/// The `outcome` of an enqueue that queued the request (llm-d's: the
/// request's outcome is not final yet).
const QUEUED: &str = "NotYetFinalized";

/// The labels of one flow (the fairness id capped) and models.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct FlowKey {
    fairness: String,
    priority: i32,
    /// The models' tag ([`FlowMetrics::models_tag`]; 0: none known).
    tag: u64,
}

/// A (model, target model) pair, its labels capped, and its tag.
#[derive(Debug)]
struct Models {
    tag: u64,
    model: String,
    target: String,
}

/// Every observation of one flow.
#[derive(Debug)]
struct FlowSeries {
    key: FlowKey,
    models: Option<Arc<Models>>,
    requests: AtomicI64,
    bytes: AtomicI64,
    /// Time in flow control, per [`Outcome::ALL`].
    waited: [AtomicHistogram; Outcome::ALL.len()],
    /// Time to enqueue: queued first, then refused per [`Outcome::ALL`].
    enqueue: [AtomicHistogram; Outcome::ALL.len() + 1],
}

impl FlowSeries {
    fn new(key: FlowKey, models: Option<Arc<Models>>) -> Self {
        Self {
            key,
            models,
            requests: AtomicI64::new(0),
            bytes: AtomicI64::new(0),
            waited: std::array::from_fn(|_| AtomicHistogram::new(hist::QUEUE)),
            enqueue: std::array::from_fn(|_| AtomicHistogram::new(hist::FLOW_STEP)),
        }
    }

    /// Its labels, in `pool`.
    fn labels(&self, pool: &str) -> LabelValues {
        let (model, target) = self
            .models
            .as_deref()
            .map_or(("", ""), |m| (m.model.as_str(), m.target.as_str()));
        vec![
            ("fairness_id", self.key.fairness.clone()),
            ("priority", self.key.priority.to_string()),
            ("inference_pool", pool.to_owned()),
            ("model_name", model.to_owned()),
            ("target_model_name", target.to_owned()),
        ]
    }
}

fn flow_is(fairness: &str, priority: i32, tag: u64) -> impl Fn(&FlowSeries) -> bool + '_ {
    move |s| s.key.priority == priority && s.key.tag == tag && s.key.fairness == fairness
}

fn outcome_index(outcome: Outcome) -> Option<usize> {
    Outcome::ALL.iter().position(|o| *o == outcome)
}

/// The flow-control observations of the service's controllers.
#[derive(Debug)]
pub(crate) struct FlowMetrics {
    fairness_ids: Arc<LabelCap>,
    model_names: Arc<LabelCap>,
    flows: Interned<FlowSeries>,
    /// Model pairs by the hash of their labels, and by tag (tag − 1).
    models: Interned<Models>,
    by_tag: RwLock<Vec<Arc<Models>>>,
    dispatch_cycles: AtomicHistogram,
}

impl Default for FlowMetrics {
    fn default() -> Self {
        Self::with_caps(Arc::default(), Arc::default())
    }
}

impl FlowMetrics {
    /// Metrics whose `fairness_id` label takes `fairness_ids`' cap and
    /// whose model labels take `model_names`' (the request metrics' own, so
    /// a value keeps one label everywhere).
    pub(crate) fn with_caps(fairness_ids: Arc<LabelCap>, model_names: Arc<LabelCap>) -> Self {
        Self {
            fairness_ids,
            model_names,
            flows: Interned::default(),
            models: Interned::default(),
            by_tag: RwLock::new(Vec::new()),
            dispatch_cycles: AtomicHistogram::new(hist::FLOW_STEP),
        }
    }

    /// The tag of a request for `model` routed as `target`, to give the
    /// controller ([`epp_core::flow::FlowRequest::tag`]): found without
    /// allocating once the pair was seen.
    pub(crate) fn models_tag(&self, model: &str, target: &str) -> u64 {
        let (m, t) = (
            self.model_names.label(model),
            self.model_names.label(target),
        );
        let hash = self.models.hasher.hash_one((m, t));
        let is = |p: &Models| p.model == m && p.target == t;
        if let Some(p) = self.models.get(hash, is) {
            return p.tag;
        }
        // Under the tag list's lock, so tags stay dense and unique.
        let mut by_tag = self.by_tag.write().unwrap_or_else(PoisonError::into_inner);
        let next = by_tag.len() as u64 + 1;
        let p = self.models.get_or_insert(hash, is, || Models {
            tag: next,
            model: m.to_owned(),
            target: t.to_owned(),
        });
        if p.tag == next {
            by_tag.push(Arc::clone(&p));
        }
        p.tag
    }

    /// The pair a tag stands for.
    fn models_of(&self, tag: u64) -> Option<Arc<Models>> {
        let i = usize::try_from(tag.checked_sub(1)?).ok()?;
        let by_tag = self.by_tag.read().unwrap_or_else(PoisonError::into_inner);
        by_tag.get(i).cloned()
    }

    /// The series of a flow: found without allocating once it exists; a
    /// new one takes the fairness-id cap first.
    fn flow(&self, fairness: &str, priority: i32, tag: u64) -> Arc<FlowSeries> {
        let raw = self.flows.hasher.hash_one((fairness, priority, tag));
        if let Some(s) = self.flows.get(raw, flow_is(fairness, priority, tag)) {
            return s;
        }
        let f = self.fairness_ids.label(fairness);
        let hash = self.flows.hasher.hash_one((f, priority, tag));
        self.flows
            .get_or_insert(hash, flow_is(f, priority, tag), || {
                FlowSeries::new(
                    FlowKey {
                        fairness: f.to_owned(),
                        priority,
                        tag,
                    },
                    self.models_of(tag),
                )
            })
    }
}

impl FlowObserver for FlowMetrics {
    fn queue_changed(&self, fairness_id: &str, priority: i32, tag: u64, requests: i64, bytes: i64) {
        let s = self.flow(fairness_id, priority, tag);
        s.requests.fetch_add(requests, Relaxed);
        s.bytes.fetch_add(bytes, Relaxed);
    }

    fn finished(
        &self,
        fairness_id: &str,
        priority: i32,
        tag: u64,
        outcome: Outcome,
        waited: Duration,
    ) {
        if let Some(i) = outcome_index(outcome) {
            self.flow(fairness_id, priority, tag).waited[i].observe(waited.as_secs_f64());
        }
    }

    fn enqueued(
        &self,
        fairness_id: &str,
        priority: i32,
        tag: u64,
        refused: Option<Outcome>,
        took: Duration,
    ) {
        let i = match refused {
            None => Some(0),
            Some(o) => outcome_index(o).map(|i| i + 1),
        };
        if let Some(i) = i {
            self.flow(fairness_id, priority, tag).enqueue[i].observe(took.as_secs_f64());
        }
    }

    fn dispatch_cycle(&self, took: Duration) {
        self.dispatch_cycles.observe(took.as_secs_f64());
    }
}

/// Writes [`FlowMetrics`] and the running controller's state at scrape
/// time.
#[derive(Debug)]
pub(crate) struct FlowCollector {
    pub(crate) metrics: Arc<FlowMetrics>,
    pub(crate) decider: Weak<Decider>,
    pub(crate) generations: MetricGenerations,
}

/// The running controller's state at one scrape.
#[derive(Debug)]
struct Live {
    pool: String,
    saturation: f64,
    usage: FlowUsage,
    max_requests: u64,
    max_bytes: u64,
    /// The saturation detector's name and stale endpoints.
    stale: Option<(String, usize)>,
}

impl Live {
    /// `None` while flow control is off.
    fn read(d: &Decider) -> Option<Self> {
        let fc = d.flow.current()?;
        let snapshot = d.endpoints.snapshot();
        let stale = d
            .scheduler
            .load()
            .pool_stale_endpoints(&snapshot)
            .map(|(name, n)| (name.to_owned(), n));
        Some(Self {
            pool: d.options.load().pool_name.clone(),
            // Without an endpoint nothing is released: saturated (llm-d
            // reads an empty pool as 1.0 too).
            saturation: fc.saturation().unwrap_or(1.0),
            usage: fc.usage(),
            max_requests: fc.settings().max_requests,
            max_bytes: fc.settings().max_bytes,
            stale,
        })
    }
}

impl Collector for FlowCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let g = self.generations;
        let mut flows = self.metrics.flows.all();
        flows.sort_by(|a, b| a.key.cmp(&b.key));
        let decider = self.decider.upgrade();
        let live = decider.as_deref().and_then(Live::read);
        let pool = decider
            .map(|d| d.options.load().pool_name.clone())
            .unwrap_or_default();
        let prefixes = [
            ("inference_extension", g.reference()),
            ("llm_d_epp", g.llm_d),
        ];
        for (prefix, _) in prefixes.into_iter().filter(|(_, on)| *on) {
            self.encode_flows(&mut enc, prefix, &pool, &flows)?;
            let mut saturation = BTreeMap::new();
            if let Some(l) = &live {
                let labels = vec![
                    ("inference_pool", l.pool.clone()),
                    ("stage", "effective".to_owned()),
                ];
                saturation.insert(labels, l.saturation);
            }
            encode_gauges(
                &mut enc,
                &format!("{prefix}_flow_control_pool_saturation"),
                "Pool saturation gating flow-control dispatch: the saturation detector's reading \
                 of the whole pool (stage effective); 1.0 is the set point, an empty pool reads 1.0",
                &saturation,
            )?;
        }
        if g.llm_d {
            encode_requests(&mut enc, &flows, live.as_ref())?;
            encode_capacity(&mut enc, live.as_ref())?;
        }
        Ok(())
    }
}

impl FlowCollector {
    /// The per-flow families and the dispatch cycles under `prefix`.
    fn encode_flows(
        &self,
        enc: &mut DescriptorEncoder,
        prefix: &str,
        pool: &str,
        flows: &[Arc<FlowSeries>],
    ) -> fmt::Result {
        let gauge = |of: fn(&FlowSeries) -> i64| {
            flows
                .iter()
                .map(|s| (s.labels(pool), of(s)))
                .collect::<BTreeMap<_, _>>()
        };
        encode_gauges(
            enc,
            &format!("{prefix}_flow_control_queue_size"),
            "Requests held in the flow-control queues, per flow and priority",
            &gauge(|s| s.requests.load(Relaxed)),
        )?;
        encode_gauges(
            enc,
            &format!("{prefix}_flow_control_queue_bytes"),
            "Bytes of the requests held in the flow-control queues, per flow and priority",
            &gauge(|s| s.bytes.load(Relaxed)),
        )?;
        let by_outcome = |of: fn(&FlowSeries) -> Vec<(&'static str, &AtomicHistogram)>| {
            let mut out = BTreeMap::new();
            for s in flows {
                for (outcome, h) in of(s) {
                    let mut v = HistogramValue::default();
                    h.add_to(&mut v);
                    if v.count() > 0 {
                        let mut l = s.labels(pool);
                        l.push(("outcome", outcome.to_owned()));
                        out.insert(l, v);
                    }
                }
            }
            out
        };
        encode_histograms(
            enc,
            &format!("{prefix}_flow_control_request_queue_duration_seconds"),
            "Time requests spent in flow control, from enqueue to their outcome \
             (Dispatched, RejectedCapacity, RejectedNoEndpoints, EvictedTTL, \
             EvictedNoEndpoints, EvictedContextCancelled)",
            &by_outcome(|s| {
                Outcome::ALL
                    .iter()
                    .map(|o| o.as_str())
                    .zip(&s.waited)
                    .collect()
            }),
        )?;
        encode_histograms(
            enc,
            &format!("{prefix}_flow_control_request_enqueue_duration_seconds"),
            "Time taken to enqueue requests into flow control, by outcome \
             (NotYetFinalized: queued; RejectedCapacity, RejectedNoEndpoints: refused)",
            &by_outcome(|s| {
                std::iter::once(QUEUED)
                    .chain(Outcome::ALL.iter().map(|o| o.as_str()))
                    .zip(&s.enqueue)
                    .collect()
            }),
        )?;
        let mut cycles = HistogramValue::default();
        self.metrics.dispatch_cycles.add_to(&mut cycles);
        let name = format!("{prefix}_flow_control_dispatch_cycle_duration_seconds");
        let mut m = enc.encode_descriptor(
            &name,
            "Time of each flow-control dispatch cycle (a look for a request to release, \
             made while requests wait)",
            None,
            MetricType::Histogram,
        )?;
        if cycles.count() > 0 {
            m.encode_histogram::<NoLabelSet>(cycles.sum, cycles.count(), &cycles.buckets(), None)?;
        }
        Ok(())
    }
}

/// `llm_d_epp_flow_control_requests_total{outcome,priority,inference_pool}`:
/// the time-in-flow-control counts per priority and outcome.
fn encode_requests(
    enc: &mut DescriptorEncoder,
    flows: &[Arc<FlowSeries>],
    live: Option<&Live>,
) -> fmt::Result {
    let pool = live.map(|l| l.pool.clone()).unwrap_or_default();
    let mut sums: BTreeMap<LabelValues, u64> = BTreeMap::new();
    for s in flows {
        for (outcome, h) in Outcome::ALL.iter().zip(&s.waited) {
            let mut v = HistogramValue::default();
            h.add_to(&mut v);
            if v.count() > 0 {
                let l = vec![
                    ("outcome", outcome.as_str().to_owned()),
                    ("priority", s.key.priority.to_string()),
                    ("inference_pool", pool.clone()),
                ];
                *sums.entry(l).or_default() += v.count();
            }
        }
    }
    encode_counters(
        enc,
        "llm_d_epp_flow_control_requests",
        "Requests that left flow control, by outcome and priority",
        &sums,
    )
}

/// Each band's and the whole queue's share of their capacity, and the
/// saturation detector's stale endpoints (llm-d's names only).
fn encode_capacity(enc: &mut DescriptorEncoder, live: Option<&Live>) -> fmt::Result {
    let share = |have: u64, max: u64| (max > 0).then(|| have as f64 / max as f64);
    let mut band_requests = BTreeMap::new();
    let mut band_bytes = BTreeMap::new();
    let mut global_requests = BTreeMap::new();
    let mut global_bytes = BTreeMap::new();
    let mut stale = BTreeMap::new();
    if let Some(l) = live {
        let pool = || ("inference_pool", l.pool.clone());
        for b in &l.usage.bands {
            let labels = vec![("priority", b.priority.to_string()), pool()];
            if let Some(v) = share(b.requests, b.max_requests) {
                band_requests.insert(labels.clone(), v);
            }
            if let Some(v) = share(b.bytes, b.max_bytes) {
                band_bytes.insert(labels, v);
            }
        }
        if let Some(v) = share(l.usage.requests, l.max_requests) {
            global_requests.insert(vec![pool()], v);
        }
        if let Some(v) = share(l.usage.bytes, l.max_bytes) {
            global_bytes.insert(vec![pool()], v);
        }
        if let Some((detector, n)) = &l.stale {
            stale.insert(
                vec![("detector", detector.clone())],
                i64::try_from(*n).unwrap_or(i64::MAX),
            );
        }
    }
    for (name, help, values) in [
        (
            "llm_d_epp_flow_control_capacity_utilization_requests",
            "Share of a priority band's request capacity (maxRequests) its queued requests occupy",
            &band_requests,
        ),
        (
            "llm_d_epp_flow_control_capacity_utilization_bytes",
            "Share of a priority band's byte capacity (maxBytes) its queued requests occupy",
            &band_bytes,
        ),
        (
            "llm_d_epp_flow_control_global_capacity_utilization_requests",
            "Share of the global request capacity (maxRequests) occupied over every band \
             (only when one is configured)",
            &global_requests,
        ),
        (
            "llm_d_epp_flow_control_global_capacity_utilization_bytes",
            "Share of the global byte capacity (maxBytes) occupied over every band \
             (only when one is configured)",
            &global_bytes,
        ),
    ] {
        encode_gauges(enc, name, help, values)?;
    }
    encode_gauges(
        enc,
        "llm_d_epp_flow_control_stale_endpoints",
        "Endpoints the saturation detector scores as fully saturated because their metrics \
         are missing or older than its staleness threshold",
        &stale,
    )
}

#[cfg(test)]
mod tests;
