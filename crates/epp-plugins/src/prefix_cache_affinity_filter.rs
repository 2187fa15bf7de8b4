//! `prefix-cache-affinity-filter`: keep only endpoints holding most of the
//! prompt, when some do.

use epp_core::{BuildError, Candidate, CycleContext, DEFAULT_PREFIX_PRODUCER, Filter, Plugin};
use rand::Rng;

use crate::Builtin;

/// Parameters of `prefix-cache-affinity-filter`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixAffinityParams {
    /// Matched fraction of the prompt that makes an endpoint "affine". Default 0.8.
    #[serde(default = "default_affinity")]
    pub affinity_threshold: f64,
    /// Chance of ignoring affinity, to keep exploring. Default 0.01.
    #[serde(default = "default_exploration")]
    pub exploration_probability: f64,
    /// Producer whose prefix matches are read (default
    /// `approx-prefix-cache-producer`).
    #[serde(default)]
    pub prefix_match_info_producer_name: Option<String>,
    /// Stickiness is broken (every candidate kept) when the best affine
    /// endpoint's estimated TTFT exceeds the best other endpoint's by more
    /// than this many milliseconds; 0 = always stick. Default 18000 (llm-d).
    #[serde(default = "default_penalty", rename = "maxTTFTPenaltyMs")]
    pub max_ttft_penalty_ms: f64,
    /// Where the TTFT estimate comes from: `prefillThroughput` (in-flight
    /// tokens / `peakPrefillThroughput`, the default) or `latencyPredictor`
    /// (the cycle's latency predictions).
    #[serde(default, rename = "ttftSource")]
    pub ttft_source: TtftSource,
    /// Prefill tokens per second for the TTFT estimate. Default 15928 (llm-d).
    #[serde(default = "default_throughput")]
    pub peak_prefill_throughput: f64,
    /// llm-d's latency predictor to read; this picker keeps one set of
    /// predictions per request, so any name reads them. Accepted for llm-d's
    /// configs.
    #[serde(default)]
    pub latency_prediction_info_producer_name: Option<String>,
    /// llm-d's in-flight load producer to read; this picker counts every
    /// endpoint's in-flight requests and tokens itself, so the name is
    /// accepted for llm-d's configs and changes nothing.
    #[serde(default)]
    pub in_flight_load_producer_name: Option<String>,
}

/// `ttftSource` values (llm-d's names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub enum TtftSource {
    /// TTFT = in-flight tokens / `peakPrefillThroughput` (the default).
    #[default]
    #[serde(rename = "prefillThroughput")]
    PrefillThroughput,
    /// The latency predictor's TTFT (`predicted-latency-producer`).
    #[serde(rename = "latencyPredictor")]
    LatencyPredictor,
}

fn default_penalty() -> f64 {
    18_000.0
}
fn default_throughput() -> f64 {
    15_928.0
}

fn default_affinity() -> f64 {
    0.8
}
fn default_exploration() -> f64 {
    0.01
}

impl Default for PrefixAffinityParams {
    fn default() -> Self {
        Self {
            affinity_threshold: default_affinity(),
            exploration_probability: default_exploration(),
            prefix_match_info_producer_name: None,
            max_ttft_penalty_ms: default_penalty(),
            ttft_source: TtftSource::PrefillThroughput,
            peak_prefill_throughput: default_throughput(),
            latency_prediction_info_producer_name: None,
            in_flight_load_producer_name: None,
        }
    }
}

/// `prefix-cache-affinity-filter` (llm-d's behaviour): when some candidates
/// hold at least `affinityThreshold` of the prompt, keep only those — except
/// with probability `explorationProbability`, or when the best of them is
/// estimated to reach its first token more than `maxTTFTPenaltyMs` later
/// than the best of the others (estimate: in-flight tokens /
/// `peakPrefillThroughput`). A threshold ≤ 0 turns the filter off.
#[derive(Debug, Clone)]
pub struct PrefixCacheAffinityFilter {
    name: String,
    params: PrefixAffinityParams,
}

impl Builtin for PrefixCacheAffinityFilter {
    const TYPE: &'static str = "prefix-cache-affinity-filter";
    type Params = PrefixAffinityParams;

    /// # Errors
    /// Threshold above 1, probability outside [0, 1], a negative penalty or
    /// throughput, or a zero throughput with a positive penalty.
    fn build(name: impl Into<String>, params: PrefixAffinityParams) -> Result<Self, BuildError> {
        let bad = |field: &str, v: f64, reason: &str| BuildError::InvalidValue {
            plugin: Self::TYPE.into(),
            field: field.into(),
            value: v.to_string(),
            reason: reason.into(),
        };
        if params.affinity_threshold.is_nan() || params.affinity_threshold > 1.0 {
            return Err(bad(
                "affinityThreshold",
                params.affinity_threshold,
                "must be at most 1 (0 or less turns the filter off)",
            ));
        }
        if !(params.max_ttft_penalty_ms.is_finite() && params.max_ttft_penalty_ms >= 0.0) {
            return Err(bad(
                "maxTTFTPenaltyMs",
                params.max_ttft_penalty_ms,
                "must be >= 0",
            ));
        }
        if !(params.peak_prefill_throughput.is_finite() && params.peak_prefill_throughput >= 0.0) {
            return Err(bad(
                "peakPrefillThroughput",
                params.peak_prefill_throughput,
                "must be >= 0",
            ));
        }
        // The throughput estimates TTFT only with `prefillThroughput` (as in
        // llm-d, which checks it for that source alone).
        if params.ttft_source == TtftSource::PrefillThroughput
            && params.max_ttft_penalty_ms > 0.0
            && params.peak_prefill_throughput == 0.0
        {
            return Err(bad(
                "peakPrefillThroughput",
                0.0,
                "must be > 0 when maxTTFTPenaltyMs > 0 and ttftSource is prefillThroughput",
            ));
        }
        if !(0.0..=1.0).contains(&params.exploration_probability) {
            return Err(bad(
                "explorationProbability",
                params.exploration_probability,
                "must be in [0, 1]",
            ));
        }
        Ok(Self {
            name: name.into(),
            params,
        })
    }
}

impl Plugin for PrefixCacheAffinityFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
    fn reads_latency_predictions(&self) -> bool {
        self.params.ttft_source == TtftSource::LatencyPredictor
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

impl PrefixCacheAffinityFilter {
    /// Estimated time to first token: from the endpoint's in-flight tokens,
    /// or the latency predictor's (none without a prediction).
    fn ttft_ms(&self, cx: &CycleContext<'_>, c: &Candidate) -> Option<f64> {
        match self.params.ttft_source {
            TtftSource::PrefillThroughput => Some(
                c.endpoint.inflight().uncached_tokens() as f64
                    / self.params.peak_prefill_throughput
                    * 1000.0,
            ),
            TtftSource::LatencyPredictor => cx.state.latency.get(c.id()).map(|p| p.ttft_ms),
        }
    }
}

impl Filter for PrefixCacheAffinityFilter {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        let t = self.params.affinity_threshold;
        if candidates.len() <= 1 || t <= 0.0 {
            return;
        }
        let prefix = &cx.state.prefix;
        if !candidates.iter().any(|c| prefix.ratio(c.id()) >= t) {
            return;
        }
        if cx.rng.random::<f64>() < self.params.exploration_probability {
            return;
        }
        let prefix = &cx.state.prefix;
        if self.params.max_ttft_penalty_ms > 0.0 {
            // Without any estimate (no prediction yet) the gate is skipped.
            let (mut sticky, mut other) = (f64::INFINITY, f64::INFINITY);
            for c in candidates.iter() {
                let Some(ttft) = self.ttft_ms(cx, c) else {
                    continue;
                };
                let best = if prefix.ratio(c.id()) >= t {
                    &mut sticky
                } else {
                    &mut other
                };
                *best = best.min(ttft);
            }
            if sticky.is_finite()
                && other.is_finite()
                && sticky - other > self.params.max_ttft_penalty_ms
            {
                return;
            }
        }
        candidates.retain(|c| prefix.ratio(c.id()) >= t);
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn run(f: &PrefixCacheAffinityFilter, c: &[Candidate], matched: &[u32]) -> Vec<u32> {
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            cx.state.prefix.hashes = vec![1, 2, 3, 4];
            cx.state.prefix.computed = true;
            for (c, &m) in c.iter().zip(matched) {
                cx.state.prefix.set_matched(c.id(), m);
            }
            let mut kept = c.to_vec();
            f.filter(cx, &mut kept);
            kept.iter().map(|c| c.id().0).collect()
        })
    }

    #[test]
    fn a_busy_affine_endpoint_breaks_stickiness_as_in_llm_d() {
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let f = PrefixCacheAffinityFilter::build(
            "f",
            PrefixAffinityParams {
                exploration_probability: 0.0,
                max_ttft_penalty_ms: 1000.0,
                peak_prefill_throughput: 1000.0,
                ..Default::default()
            },
        )
        .unwrap();
        // Endpoint 0 holds the prompt; 1500 tokens in flight = 1.5 s of prefill.
        c[0].endpoint.inflight().start(1500);
        c[1].endpoint.inflight().start(400);
        assert_eq!(
            run(&f, &c, &[4, 0]),
            vec![0, 1],
            "1.5 s − 0.4 s > 1 s: keep all"
        );
        c[0].endpoint.inflight().finish(600);
        assert_eq!(run(&f, &c, &[4, 0]), vec![0], "0.9 s − 0.4 s: stick");
    }

    #[test]
    fn with_ttft_from_the_predictor_a_slow_affine_endpoint_breaks_stickiness() {
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let f = PrefixCacheAffinityFilter::build(
            "f",
            PrefixAffinityParams {
                exploration_probability: 0.0,
                max_ttft_penalty_ms: 500.0,
                ttft_source: TtftSource::LatencyPredictor,
                ..Default::default()
            },
        )
        .unwrap();
        let run_predicted = |ttft: Option<[f64; 2]>| {
            let req = InferenceRequest::builder("m").build();
            with_cx(&req, 0, |cx| {
                cx.state.prefix.hashes = vec![1, 2, 3, 4];
                cx.state.prefix.set_matched(c[0].id(), 4);
                for (c, t) in c.iter().zip(ttft.iter().flatten()) {
                    let p = epp_core::LatencyPrediction::new(*t, None, Default::default());
                    cx.state.latency.set(c.id(), p);
                }
                let mut kept = c.to_vec();
                f.filter(cx, &mut kept);
                kept.iter().map(|c| c.id().0).collect::<Vec<_>>()
            })
        };
        assert_eq!(
            run_predicted(Some([900.0, 300.0])),
            vec![0, 1],
            "600 ms > 500 ms"
        );
        assert_eq!(
            run_predicted(Some([700.0, 300.0])),
            vec![0],
            "400 ms: stick"
        );
        assert_eq!(run_predicted(None), vec![0], "no prediction: no gate");
    }

    #[test]
    fn llm_d_parameters_and_limits() {
        let p: PrefixAffinityParams = serde_yaml_ng::from_str(
            "{affinityThreshold: 0, maxTTFTPenaltyMs: 0, ttftSource: prefillThroughput, \
             peakPrefillThroughput: 5000, prefixMatchInfoProducerName: p}",
        )
        .unwrap();
        let f = PrefixCacheAffinityFilter::build("f", p).unwrap();
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        assert_eq!(run(&f, &c, &[4, 0]), vec![0, 1], "threshold 0: filter off");
        let p: PrefixAffinityParams =
            serde_yaml_ng::from_str("{ttftSource: latencyPredictor}").unwrap();
        let f = PrefixCacheAffinityFilter::build("f", p).unwrap();
        assert!(f.reads_latency_predictions());
        let p: PrefixAffinityParams =
            serde_yaml_ng::from_str("{peakPrefillThroughput: 0}").unwrap();
        assert!(PrefixCacheAffinityFilter::build("f", p).is_err());
    }

    #[test]
    fn affinity_filter_keeps_affine_endpoints() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let f = PrefixCacheAffinityFilter::build(
            "f",
            PrefixAffinityParams {
                affinity_threshold: 0.5,
                exploration_probability: 0.0,
                ..Default::default()
            },
        )
        .unwrap();
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            cx.state.prefix.hashes = vec![1, 2, 3, 4];
            cx.state.prefix.computed = true;
            cx.state.prefix.set_matched(c[1].id(), 3);
            cx.state.prefix.set_matched(c[2].id(), 1);
            let mut kept = c.clone();
            f.filter(cx, &mut kept);
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0].id(), c[1].id());
        });
    }
}
