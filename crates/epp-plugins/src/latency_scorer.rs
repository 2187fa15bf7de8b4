//! `latency-scorer`: prefer the endpoint predicted to answer first (or, with
//! latency objectives, the one whose predicted latencies fit them best).
//!
//! Reads the predictions of a latency predictor
//! ([`epp_core::CycleState::latency`], filled by
//! `predicted-latency-producer`). With `h` a candidate's headroom (objective
//! − predicted, or 0 − predicted without an objective) — for TTFT less
//! `delayToOthersWeight ·` the delay the request would cause others
//! ([`epp_core::LatencyPrediction::delay_to_others_ms`]: its own work times
//! the requests already there, plus the cached prompts it would displace
//! and, weighted, its wait in the queue, which later requests wait behind,
//! and the waits for a place in the batch it adds to them)
//! (plus it, for `least`, whose scale is inverted) —
//! each latency's headroom is scaled to the candidates' range,
//! `n = (h − min) / (max − min)`, and blended:
//!
//! ```text
//! score = (ttftWeight · s(n_ttft) + tpotWeight · s(n_tpot)) / (ttftWeight + tpotWeight)
//! s(n)  = 1 − n   for strategy `least` among candidates that meet every objective
//!                 (the tightest fit: capacity stays free for bursts)
//!         n       otherwise: strategy `most`, and always among candidates that miss
//!                 an objective (the smallest deficit)
//! ```
//!
//! A latency whose headroom is the same for every candidate (range 0, e.g.
//! TPOT when the request states no TPOT objective) gets weight 0. When some
//! candidates meet every objective, the others score 0. When none does and
//! the request states objectives, an endpoint with nothing in flight is
//! preferred (the others score 0), then candidates are bucketed by what they
//! miss (only TPOT, better than only TTFT, better than both) and only the
//! best bucket scores. Without objectives every candidate's headroom is
//! negative and the score is simply the lowest predicted latency first.
//!
//! Without predictions (no predictor, or its models not yet warm) the score
//! is the heuristic blend
//! `(kvW · (1 − kv) + queueW · (1 − q / q_max) + prefixW · prefix) / (kvW + queueW + prefixW)`
//! with `q` the waiting queue plus this picker's dispatches since the scrape.

use epp_core::{BuildError, Candidate, CycleContext, LatencyPrediction, Plugin, Scorer};

use crate::{Builtin, invalid, non_negative_weights};

/// How positive headroom is preferred.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeadroomStrategy {
    /// The endpoint closest to its objectives (bin-packing).
    #[default]
    Least,
    /// The endpoint with the most headroom.
    Most,
}

/// Parameters of `latency-scorer` (llm-d's names).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LatencyScorerParams {
    /// Weight of TTFT headroom. Default 0.8.
    #[serde(default = "default_ttft_weight", rename = "ttftWeight")]
    pub ttft_weight: f64,
    /// Weight of TPOT headroom. Default 0.2.
    #[serde(default = "default_tpot_weight", rename = "tpotWeight")]
    pub tpot_weight: f64,
    /// `least` (default) or `most`.
    #[serde(default)]
    pub headroom_selection_strategy: HeadroomStrategy,
    /// KV weight of the heuristic fallback. Default 1.
    #[serde(default = "one", rename = "compositeKVWeight")]
    pub composite_kv_weight: f64,
    /// Queue weight of the heuristic fallback. Default 1.
    #[serde(default = "one")]
    pub composite_queue_weight: f64,
    /// Prefix-cache weight of the heuristic fallback. Default 1.
    #[serde(default = "one")]
    pub composite_prefix_weight: f64,
    /// Weight of the delay a request would cause other requests at an
    /// endpoint ([`LatencyPrediction::delay_to_others_ms`]),
    /// counted against its TTFT headroom. Default 1; 0 ranks by the
    /// request's own latency alone, as llm-d does.
    #[serde(default = "one")]
    pub delay_to_others_weight: f64,
    /// llm-d's latency predictor to read; this picker keeps one set of
    /// predictions per request, so any name reads them. Accepted for llm-d's
    /// configs.
    #[serde(default)]
    pub latency_prediction_info_producer_name: Option<String>,
    /// llm-d's prefix-match producer for the heuristic fallback's prefix
    /// term; the fallback reads the cycle's prefix matches, whichever
    /// producer made them. Accepted for llm-d's configs.
    #[serde(default)]
    pub prefix_match_info_producer_name: Option<String>,
}

fn default_ttft_weight() -> f64 {
    0.8
}
fn default_tpot_weight() -> f64 {
    0.2
}
fn one() -> f64 {
    1.0
}

impl Default for LatencyScorerParams {
    fn default() -> Self {
        Self {
            ttft_weight: default_ttft_weight(),
            tpot_weight: default_tpot_weight(),
            headroom_selection_strategy: HeadroomStrategy::Least,
            composite_kv_weight: 1.0,
            composite_queue_weight: 1.0,
            composite_prefix_weight: 1.0,
            delay_to_others_weight: 1.0,
            latency_prediction_info_producer_name: None,
            prefix_match_info_producer_name: None,
        }
    }
}

/// `latency-scorer`: see the module docs for the formula.
#[derive(Debug, Clone)]
pub struct LatencyScorer {
    name: String,
    params: LatencyScorerParams,
}

impl Builtin for LatencyScorer {
    const TYPE: &'static str = "latency-scorer";
    type Params = LatencyScorerParams;

    /// # Errors
    /// A negative or non-finite weight, or TTFT and TPOT weights both 0.
    fn build(name: impl Into<String>, params: LatencyScorerParams) -> Result<Self, BuildError> {
        non_negative_weights(
            Self::TYPE,
            &[
                ("ttftWeight", params.ttft_weight),
                ("tpotWeight", params.tpot_weight),
                ("compositeKVWeight", params.composite_kv_weight),
                ("compositeQueueWeight", params.composite_queue_weight),
                ("compositePrefixWeight", params.composite_prefix_weight),
                ("delayToOthersWeight", params.delay_to_others_weight),
            ],
        )?;
        if params.ttft_weight + params.tpot_weight == 0.0 {
            return Err(invalid(
                Self::TYPE,
                "ttftWeight",
                0,
                "ttftWeight and tpotWeight cannot both be 0",
            ));
        }
        Ok(Self {
            name: name.into(),
            params,
        })
    }
}

impl Plugin for LatencyScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn reads_latency_predictions(&self) -> bool {
        true
    }
}

/// Which objectives a prediction misses: 0 none, 1 only TPOT, 2 only TTFT,
/// 3 both.
fn deficit(p: &LatencyPrediction) -> u8 {
    match (p.ttft_headroom_ms < 0.0, p.tpot_headroom_ms < 0.0) {
        (false, false) => 0,
        (false, true) => 1,
        (true, false) => 2,
        (true, true) => 3,
    }
}

/// A range that holds nothing yet.
const EMPTY: (f64, f64) = (f64::INFINITY, f64::NEG_INFINITY);

/// The range `(lo, hi)` widened to hold `v` (a NaN leaves it as it is).
fn widen((lo, hi): (f64, f64), v: f64) -> (f64, f64) {
    (lo.min(v), hi.max(v))
}

impl LatencyScorer {
    /// The heuristic blend used when there are no predictions.
    fn composite(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let p = &self.params;
        let total = p.composite_kv_weight + p.composite_queue_weight + p.composite_prefix_weight;
        let queue = |c: &Candidate| {
            (i64::from(c.metrics.waiting) + c.since_scrape().requests.max(0)).max(0) as f64
        };
        let q_max = candidates.iter().map(queue).fold(0.0, f64::max);
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            if total == 0.0 {
                *s = 0.0;
                continue;
            }
            let kv = 1.0 - c.metrics.kv_usage.clamp(0.0, 1.0);
            let q = if q_max > 0.0 {
                1.0 - queue(c) / q_max
            } else {
                1.0
            };
            let prefix = cx.state.prefix.ratio(c.id());
            *s = (p.composite_kv_weight * kv
                + p.composite_queue_weight * q
                + p.composite_prefix_weight * prefix)
                / total;
        }
    }
}

impl Scorer for LatencyScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let latency = &cx.state.latency;
        let prediction = |c: &Candidate| latency.get(c.id());
        // Which candidates compete: those meeting every objective when any
        // does; else (with objectives) the idle ones when any is, then the
        // best deficit bucket; without objectives, all with a prediction.
        // What that takes is read in one pass (this runs every cycle, over
        // every candidate), with the ranges of the scores over all the
        // predictions: without objectives met anywhere, they are the
        // competitors' (the usual case: no objective stated).
        let has_slo = latency.slo.is_set();
        let w = self.params.delay_to_others_weight;
        // TTFT headroom, less the delay the request would cause others.
        let less_delay = |p: &LatencyPrediction| p.ttft_headroom_ms - w * p.delay_to_others_ms;
        let (mut any_prediction, mut any_positive, mut any_idle) = (false, false, false);
        let mut all_ranges = (EMPTY, EMPTY);
        for c in candidates {
            if let Some(p) = prediction(c) {
                any_prediction = true;
                any_positive |= p.meets_slo();
                any_idle |= has_slo && c.endpoint.inflight().requests() == 0;
                all_ranges = (
                    widen(all_ranges.0, less_delay(p)),
                    widen(all_ranges.1, p.tpot_headroom_ms),
                );
            }
        }
        if !any_prediction {
            self.composite(cx, candidates, out);
            return;
        }
        let any_idle = any_idle && !any_positive;
        let best_bucket = if has_slo && !any_positive {
            candidates
                .iter()
                .filter(|c| !any_idle || c.endpoint.inflight().requests() == 0)
                .filter_map(|c| prediction(c).map(deficit))
                .min()
                .unwrap_or(3)
        } else {
            0
        };
        let competes = |c: &Candidate| -> Option<&LatencyPrediction> {
            let p = prediction(c)?;
            let ok = if any_positive {
                p.meets_slo()
            } else if has_slo {
                (!any_idle || c.endpoint.inflight().requests() == 0) && deficit(p) == best_bucket
            } else {
                true
            };
            ok.then_some(p)
        };
        let tight =
            any_positive && self.params.headroom_selection_strategy == HeadroomStrategy::Least;
        // For `least`, whose scale is inverted, the delay is added.
        let ttft = |p: &LatencyPrediction| {
            if tight {
                p.ttft_headroom_ms + w * p.delay_to_others_ms
            } else {
                less_delay(p)
            }
        };
        let ((t_lo, t_hi), (p_lo, p_hi)) = if !has_slo && !any_positive {
            // Every prediction competes, scored as above.
            all_ranges
        } else {
            candidates
                .iter()
                .filter_map(competes)
                .fold((EMPTY, EMPTY), |(t, p), c| {
                    (widen(t, ttft(c)), widen(p, c.tpot_headroom_ms))
                })
        };
        let mut wt = if t_hi > t_lo {
            self.params.ttft_weight
        } else {
            0.0
        };
        let mut wp = if p_hi > p_lo {
            self.params.tpot_weight
        } else {
            0.0
        };
        if wt + wp == 0.0 {
            // Nothing tells the competitors apart (or the only varying
            // latency has weight 0): all equal.
            (wt, wp) = (1.0, 0.0);
        }
        let scale = |h: f64, lo: f64, hi: f64| {
            let n = if hi > lo { (h - lo) / (hi - lo) } else { 1.0 };
            if tight { 1.0 - n } else { n }
        };
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = match competes(c) {
                Some(p) => {
                    let t = scale(ttft(p), t_lo, t_hi);
                    let q = scale(p.tpot_headroom_ms, p_lo, p_hi);
                    ((wt * t + wp * q) / (wt + wp)).clamp(0.0, 1.0)
                }
                None => 0.0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest, LatencySlo};

    use super::*;
    use crate::testing::{endpoints, with_cx};

    /// Scores with `predictions[i]` = (TTFT ms, TPOT ms) for candidate `i`
    /// (`None` = no prediction) under objectives `slo`.
    fn score_with(
        scorer: &LatencyScorer,
        predictions: &[Option<(f64, f64)>],
        slo: LatencySlo,
        inflight: &[u32],
    ) -> Vec<f64> {
        let eps = endpoints(predictions.iter().map(|_| EndpointMetrics::fresh()));
        for (e, &n) in eps.iter().zip(inflight) {
            for _ in 0..n {
                e.inflight().start(1);
            }
        }
        let candidates: Vec<Candidate> = eps.iter().map(Candidate::new).collect();
        let request = InferenceRequest::builder("m").build();
        with_cx(&request, 1, |cx| {
            cx.state.latency.slo = slo;
            for (c, p) in candidates.iter().zip(predictions) {
                if let Some((ttft, tpot)) = *p {
                    cx.state
                        .latency
                        .set(c.id(), LatencyPrediction::new(ttft, Some(tpot), slo));
                }
            }
            let mut out = vec![f64::NAN; candidates.len()];
            scorer.score(cx, &candidates, &mut out);
            out
        })
    }

    fn scorer(strategy: HeadroomStrategy) -> LatencyScorer {
        LatencyScorer::build(
            "s",
            LatencyScorerParams {
                headroom_selection_strategy: strategy,
                ..LatencyScorerParams::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn without_objectives_the_lowest_predicted_ttft_scores_highest_by_its_range() {
        // TTFT 100, 200, 300: headroom −100, −200, −300 → n = 1, 0.5, 0.
        // TPOT has no objective: its headroom is 0 everywhere, weight 0.
        let s = score_with(
            &scorer(HeadroomStrategy::Least),
            &[Some((100.0, 9.0)), Some((200.0, 1.0)), Some((300.0, 5.0))],
            LatencySlo::default(),
            &[3, 3, 3],
        );
        assert_eq!(s, vec![1.0, 0.5, 0.0]);
    }

    #[test]
    fn among_endpoints_meeting_the_objectives_least_packs_and_most_spreads() {
        let slo = LatencySlo {
            ttft_ms: Some(500.0),
            tpot_ms: Some(50.0),
        };
        // Headrooms: TTFT 400, 200, 100 (all positive); TPOT 40, 40, 40
        // (range 0, weight 0); the fourth misses TTFT and scores 0.
        let preds = [
            Some((100.0, 10.0)),
            Some((300.0, 10.0)),
            Some((400.0, 10.0)),
            Some((900.0, 10.0)),
        ];
        let least = score_with(&scorer(HeadroomStrategy::Least), &preds, slo, &[1; 4]);
        // n = (h − 100) / 300 → 1, 1/3, 0; least = 1 − n.
        assert_eq!(least[0], 0.0);
        assert!((least[1] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(least[2..], [1.0, 0.0]);
        let most = score_with(&scorer(HeadroomStrategy::Most), &preds, slo, &[1; 4]);
        assert_eq!(most[0], 1.0);
        assert!((most[1] - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(most[2..], [0.0, 0.0]);
    }

    #[test]
    fn ttft_and_tpot_blend_by_their_weights() {
        let slo = LatencySlo {
            ttft_ms: Some(1000.0),
            tpot_ms: Some(100.0),
        };
        // TTFT headroom 900 / 500 → n 1 / 0; TPOT headroom 50 / 90 → n 0 / 1.
        let s = score_with(
            &scorer(HeadroomStrategy::Most),
            &[Some((100.0, 50.0)), Some((500.0, 10.0))],
            slo,
            &[1, 1],
        );
        assert!(
            (s[0] - 0.8).abs() < 1e-12 && (s[1] - 0.2).abs() < 1e-12,
            "{s:?}"
        );
    }

    #[test]
    fn when_every_endpoint_misses_an_idle_one_then_the_smallest_deficit_wins() {
        let slo = LatencySlo {
            ttft_ms: Some(100.0),
            tpot_ms: Some(10.0),
        };
        let preds = [
            Some((150.0, 20.0)), // misses both
            Some((50.0, 30.0)),  // misses only TPOT: the best bucket
            Some((60.0, 12.0)),  // misses only TPOT, by less
            Some((500.0, 5.0)),  // misses only TTFT
        ];
        let busy = score_with(&scorer(HeadroomStrategy::Least), &preds, slo, &[2, 2, 2, 2]);
        // Bucket "only TPOT": TTFT headroom 50 / 40 → n 1 / 0; TPOT −20 / −2
        // → n 0 / 1; blended 0.8 / 0.2.
        assert_eq!(busy[0], 0.0);
        assert!((busy[1] - 0.8).abs() < 1e-12 && (busy[2] - 0.2).abs() < 1e-12);
        assert_eq!(busy[3], 0.0);
        let one_idle = score_with(&scorer(HeadroomStrategy::Least), &preds, slo, &[2, 2, 2, 0]);
        assert_eq!(one_idle, vec![0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn the_delay_a_request_would_cause_others_counts_against_its_ttft() {
        // Endpoint 0: TTFT 300 ms, its prompt cached (causes 50 ms of delay);
        // endpoint 1: TTFT 200 ms, but its 100 ms prefill holds up 8
        // requests (800 ms). Own latency alone prefers 1; with the delay, 0.
        let eps = endpoints([EndpointMetrics::fresh(), EndpointMetrics::fresh()]);
        let candidates: Vec<Candidate> = eps.iter().map(Candidate::new).collect();
        let request = InferenceRequest::builder("m").build();
        let run = |weight: f64| {
            let s = LatencyScorer::build(
                "s",
                LatencyScorerParams {
                    delay_to_others_weight: weight,
                    ..LatencyScorerParams::default()
                },
            )
            .unwrap();
            with_cx(&request, 1, |cx| {
                let slo = LatencySlo::default();
                for (c, (ttft, delay)) in candidates.iter().zip([(300.0, 50.0), (200.0, 800.0)]) {
                    let p = LatencyPrediction::new(ttft, None, slo).with_delay_to_others(delay);
                    cx.state.latency.set(c.id(), p);
                }
                let mut out = vec![0.0; 2];
                s.score(cx, &candidates, &mut out);
                out
            })
        };
        // h = −(300 + 50) = −350 and −(200 + 800) = −1000.
        assert_eq!(run(1.0), vec![1.0, 0.0]);
        assert_eq!(run(0.0), vec![0.0, 1.0], "llm-d's ranking");
    }

    #[test]
    fn without_predictions_it_blends_kv_queue_and_prefix() {
        let s = LatencyScorer::build("s", LatencyScorerParams::default()).unwrap();
        let eps = endpoints([
            EndpointMetrics {
                kv_usage: 0.5,
                waiting: 4,
                ..EndpointMetrics::fresh()
            },
            EndpointMetrics {
                kv_usage: 0.0,
                waiting: 0,
                ..EndpointMetrics::fresh()
            },
        ]);
        let candidates: Vec<Candidate> = eps.iter().map(Candidate::new).collect();
        let request = InferenceRequest::builder("m").build();
        let out = with_cx(&request, 1, |cx| {
            cx.state.prefix.hashes = vec![1, 2];
            cx.state.prefix.set_matched(eps[0].id(), 2);
            let mut out = vec![0.0; 2];
            s.score(cx, &candidates, &mut out);
            out
        });
        // (0.5 + 0 + 1) / 3 and (1 + 1 + 0) / 3.
        assert!((out[0] - 0.5).abs() < 1e-12 && (out[1] - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn candidates_without_a_prediction_score_zero_beside_predicted_ones() {
        let s = score_with(
            &scorer(HeadroomStrategy::Least),
            &[None, Some((100.0, 1.0)), Some((200.0, 1.0))],
            LatencySlo::default(),
            &[0, 0, 0],
        );
        assert_eq!(s, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn bad_weights_are_refused() {
        for yaml in [
            "ttftWeight: -1",
            "{ttftWeight: 0, tpotWeight: 0}",
            "compositeKVWeight: .nan",
        ] {
            let p: LatencyScorerParams = serde_yaml_ng::from_str(yaml).unwrap();
            assert!(LatencyScorer::build("s", p).is_err(), "{yaml}");
        }
        let p: LatencyScorerParams =
            serde_yaml_ng::from_str("headroomSelectionStrategy: most").unwrap();
        assert_eq!(p.headroom_selection_strategy, HeadroomStrategy::Most);
    }
}
