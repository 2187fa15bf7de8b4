//! `latency-slo-admitter`: refuse a sheddable request no endpoint is
//! predicted to serve within its latency objectives.
//!
//! Runs after the data producers, before any profile. A request is admitted
//! when any of these holds:
//!
//! ```text
//! priority ≥ 0                                   (only sheddable requests are refused)
//! no objective (x-llm-d-slo-ttft-ms / -tpot-ms)  (nothing to miss)
//! no prediction for any candidate                (nothing known yet)
//! some candidate is predicted to meet every objective
//! some candidate is idle: nothing running at the last scrape and nothing
//!   in flight from this picker
//! some candidate is cold: KV-cache use below 2 % (predictions are least
//!   reliable there)
//! ```
//!
//! Otherwise it is refused with 429 (as llm-d's admitter does), rather than
//! sent to a guaranteed miss.

use epp_core::{Admitter, BuildError, Candidate, CycleContext, LatencyPrediction, Plugin};

use crate::Builtin;

/// KV-cache use below which an endpoint counts as cold.
const COLD_KV: f64 = 0.02;

/// Parameters of `latency-slo-admitter` (llm-d's names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LatencyAdmitterParams {
    /// The predictor whose predictions are read; this picker keeps one set
    /// of predictions per request, so any name reads them. Accepted for
    /// llm-d's configs.
    #[serde(default)]
    pub latency_prediction_info_producer_name: Option<String>,
}

/// `latency-slo-admitter`: see the module docs.
#[derive(Debug, Clone)]
pub struct LatencySloAdmitter {
    name: String,
}

impl Builtin for LatencySloAdmitter {
    const TYPE: &'static str = "latency-slo-admitter";
    type Params = LatencyAdmitterParams;

    fn build(name: impl Into<String>, _params: LatencyAdmitterParams) -> Result<Self, BuildError> {
        Ok(Self { name: name.into() })
    }
}

impl Plugin for LatencySloAdmitter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_admitter(&self) -> Option<&dyn Admitter> {
        Some(self)
    }
    fn reads_latency_predictions(&self) -> bool {
        true
    }
}

impl Admitter for LatencySloAdmitter {
    fn admit(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) -> Result<(), String> {
        let latency = &cx.state.latency;
        if !cx.request.is_sheddable() || !latency.slo.is_set() || !latency.any() {
            return Ok(());
        }
        let admissible = |c: &Candidate| {
            latency
                .get(c.id())
                .is_some_and(LatencyPrediction::meets_slo)
                || (c.metrics.running == 0 && c.endpoint.inflight().requests() == 0)
                || c.metrics.kv_usage < COLD_KV
        };
        if candidates.iter().any(admissible) {
            Ok(())
        } else {
            Err("no endpoint is predicted to meet the request's latency objective".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest, LatencySlo};

    use super::*;
    use crate::testing::{endpoints, with_cx};

    /// Whether a request of `priority` is admitted over endpoints running
    /// `running` requests at KV use `kv`, predicted at `ttft` ms against
    /// objectives `slo`.
    fn admitted(priority: i32, slo: LatencySlo, eps: &[(u32, f64, Option<f64>)]) -> bool {
        let admitter = LatencySloAdmitter::build("a", LatencyAdmitterParams::default()).unwrap();
        let endpoints = endpoints(eps.iter().map(|&(running, kv, _)| EndpointMetrics {
            running,
            kv_usage: kv,
            ..EndpointMetrics::fresh()
        }));
        let candidates: Vec<Candidate> = endpoints.iter().map(Candidate::new).collect();
        let request = InferenceRequest::builder("m").priority(priority).build();
        with_cx(&request, 1, |cx| {
            cx.state.latency.slo = slo;
            for (c, &(_, _, t)) in candidates.iter().zip(eps) {
                if let Some(t) = t {
                    cx.state
                        .latency
                        .set(c.id(), LatencyPrediction::new(t, None, slo));
                }
            }
            admitter.admit(cx, &candidates).is_ok()
        })
    }

    const SLO: LatencySlo = LatencySlo {
        ttft_ms: Some(100.0),
        tpot_ms: None,
    };

    #[test]
    fn a_sheddable_request_everyone_would_miss_is_refused() {
        let busy_and_slow = [(4, 0.5, Some(300.0)), (6, 0.7, Some(200.0))];
        assert!(!admitted(-1, SLO, &busy_and_slow));
        assert!(
            admitted(0, SLO, &busy_and_slow),
            "critical: always admitted"
        );
        assert!(
            admitted(-1, LatencySlo::default(), &busy_and_slow),
            "no objective"
        );
        assert!(
            admitted(-1, SLO, &[(4, 0.5, None), (6, 0.7, None)]),
            "no prediction"
        );
    }

    #[test]
    fn one_endpoint_meeting_it_idle_or_cold_admits() {
        assert!(admitted(
            -1,
            SLO,
            &[(4, 0.5, Some(300.0)), (6, 0.7, Some(80.0))]
        ));
        assert!(admitted(
            -1,
            SLO,
            &[(4, 0.5, Some(300.0)), (0, 0.7, Some(200.0))]
        ));
        assert!(admitted(
            -1,
            SLO,
            &[(4, 0.5, Some(300.0)), (6, 0.01, Some(200.0))]
        ));
    }
}
