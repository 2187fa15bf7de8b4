//! `slo-headroom-tier-filter`: keep the endpoints predicted to meet the
//! request's latency objectives, exploring the others now and then.
//!
//! With the predictions of a latency predictor
//! ([`epp_core::CycleState::latency`]), candidates fall in two tiers:
//! positive (every objective's headroom ≥ 0) and negative (any below 0, or
//! no prediction). When both tiers are present, the positive tier is kept
//! with probability `1 − epsilonExploreNeg` and the negative tier otherwise,
//! so an endpoint recovering from overload still gets traffic that
//! re-measures it; when only one is, it is kept. Without predictions every
//! candidate is kept. Without objectives every headroom is negative, so the
//! filter keeps everything.

use epp_core::{BuildError, Candidate, CycleContext, Filter, LatencyPrediction, Plugin};
use rand::Rng;

use crate::{Builtin, invalid};

/// Parameters of `slo-headroom-tier-filter` (llm-d's names).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SloTierParams {
    /// Chance of keeping the negative tier when both exist. Default 0.01.
    #[serde(default = "default_epsilon")]
    pub epsilon_explore_neg: f64,
    /// llm-d's latency predictor to read; this picker keeps one set of
    /// predictions per request, so any name reads them. Accepted for llm-d's
    /// configs.
    #[serde(default)]
    pub latency_prediction_info_producer_name: Option<String>,
}

fn default_epsilon() -> f64 {
    0.01
}

impl Default for SloTierParams {
    fn default() -> Self {
        Self {
            epsilon_explore_neg: default_epsilon(),
            latency_prediction_info_producer_name: None,
        }
    }
}

/// `slo-headroom-tier-filter`: see the module docs.
#[derive(Debug, Clone)]
pub struct SloHeadroomTierFilter {
    name: String,
    epsilon: f64,
}

impl Builtin for SloHeadroomTierFilter {
    const TYPE: &'static str = "slo-headroom-tier-filter";
    type Params = SloTierParams;

    /// # Errors
    /// `epsilonExploreNeg` outside [0, 1].
    fn build(name: impl Into<String>, params: SloTierParams) -> Result<Self, BuildError> {
        if !(0.0..=1.0).contains(&params.epsilon_explore_neg) {
            return Err(invalid(
                Self::TYPE,
                "epsilonExploreNeg",
                params.epsilon_explore_neg,
                "must be in [0, 1]",
            ));
        }
        Ok(Self {
            name: name.into(),
            epsilon: params.epsilon_explore_neg,
        })
    }
}

impl Plugin for SloHeadroomTierFilter {
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
        true
    }
}

impl Filter for SloHeadroomTierFilter {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        let latency = &cx.state.latency;
        if !latency.any() {
            return;
        }
        let positive = |c: &Candidate| {
            latency
                .get(c.id())
                .is_some_and(LatencyPrediction::meets_slo)
        };
        let n_positive = candidates.iter().filter(|c| positive(c)).count();
        if n_positive == 0 || n_positive == candidates.len() {
            return;
        }
        let keep_positive = cx.rng.random::<f64>() >= self.epsilon;
        let latency = &cx.state.latency;
        candidates.retain(|c| {
            latency
                .get(c.id())
                .is_some_and(LatencyPrediction::meets_slo)
                == keep_positive
        });
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest, LatencySlo};

    use super::*;
    use crate::testing::{endpoints, with_cx};

    /// The ids kept from candidates predicted at `ttft` ms (`None`: no
    /// prediction) against a 100 ms objective, with RNG `seed`.
    fn kept(filter: &SloHeadroomTierFilter, ttft: &[Option<f64>], seed: u64) -> Vec<usize> {
        let eps = endpoints(ttft.iter().map(|_| EndpointMetrics::fresh()));
        let mut candidates: Vec<Candidate> = eps.iter().map(Candidate::new).collect();
        let request = InferenceRequest::builder("m").build();
        let slo = LatencySlo {
            ttft_ms: Some(100.0),
            tpot_ms: None,
        };
        with_cx(&request, seed, |cx| {
            cx.state.latency.slo = slo;
            for (c, t) in candidates.iter().zip(ttft) {
                if let Some(t) = t {
                    cx.state
                        .latency
                        .set(c.id(), LatencyPrediction::new(*t, None, slo));
                }
            }
            filter.filter(cx, &mut candidates);
        });
        candidates.iter().map(|c| c.id().index()).collect()
    }

    fn filter(epsilon: f64) -> SloHeadroomTierFilter {
        SloHeadroomTierFilter::build(
            "f",
            SloTierParams {
                epsilon_explore_neg: epsilon,
                ..SloTierParams::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn keeps_the_positive_tier_and_explores_the_negative_one_at_epsilon() {
        let ttft = [Some(50.0), Some(150.0), None, Some(90.0)];
        assert_eq!(kept(&filter(0.0), &ttft, 1), vec![0, 3]);
        assert_eq!(kept(&filter(1.0), &ttft, 1), vec![1, 2]);
        let negative = (0..2000)
            .filter(|&seed| kept(&filter(0.1), &ttft, seed) == vec![1, 2])
            .count();
        assert!((120..=280).contains(&negative), "{negative} of 2000");
    }

    #[test]
    fn one_tier_or_no_prediction_keeps_everything() {
        assert_eq!(kept(&filter(0.0), &[Some(10.0), Some(20.0)], 1), vec![0, 1]);
        assert_eq!(kept(&filter(0.0), &[Some(500.0), None], 1), vec![0, 1]);
        assert_eq!(kept(&filter(0.0), &[None, None], 1), vec![0, 1]);
    }

    #[test]
    fn epsilon_outside_0_1_is_refused() {
        for e in [-0.1, 1.5, f64::NAN] {
            let p = SloTierParams {
                epsilon_explore_neg: e,
                ..SloTierParams::default()
            };
            assert!(SloHeadroomTierFilter::build("f", p).is_err(), "{e}");
        }
    }
}
