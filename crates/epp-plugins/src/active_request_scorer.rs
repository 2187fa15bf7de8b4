//! `active-request-scorer`: prefer endpoints with few requests in flight
//! from this picker.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::{Builtin, invalid};

/// Parameters of `active-request-scorer`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ActiveRequestParams {
    /// In-flight requests at or below which an endpoint counts as idle. Default 0.
    #[serde(default)]
    pub idle_threshold: u32,
    /// Highest score a busy endpoint can get. Default 1.0.
    #[serde(default = "default_busy")]
    pub max_busy_score: f64,
    /// Accepted for llm-d configs and ignored, as llm-d ignores it (deprecated
    /// there: in-flight counts end with the request, not after a timeout).
    #[serde(default, rename = "requestTimeout")]
    pub request_timeout: Option<String>,
    /// llm-d's in-flight load producer to read; this picker counts every
    /// endpoint's in-flight requests and tokens itself (as a declared
    /// `inflight-load-producer` says), so the name is accepted for llm-d's
    /// configs and changes nothing.
    #[serde(default)]
    pub in_flight_load_producer_name: Option<String>,
}

fn default_busy() -> f64 {
    1.0
}

impl Default for ActiveRequestParams {
    fn default() -> Self {
        Self {
            idle_threshold: 0,
            max_busy_score: default_busy(),
            request_timeout: None,
            in_flight_load_producer_name: None,
        }
    }
}

/// `active-request-scorer`, from the requests this picker has in flight on
/// each endpoint: idle endpoints (count ≤ `idleThreshold`) score 1; busy ones
/// `maxBusyScore · (max − count) / max`, `max` being the busiest candidate's
/// count (llm-d's formula).
#[derive(Debug, Clone)]
pub struct ActiveRequestScorer {
    name: String,
    params: ActiveRequestParams,
}

impl Builtin for ActiveRequestScorer {
    const TYPE: &'static str = "active-request-scorer";
    type Params = ActiveRequestParams;

    /// # Errors
    /// `maxBusyScore` outside [0, 1].
    fn build(name: impl Into<String>, params: ActiveRequestParams) -> Result<Self, BuildError> {
        if !(0.0..=1.0).contains(&params.max_busy_score) {
            return Err(invalid(
                Self::TYPE,
                "maxBusyScore",
                params.max_busy_score,
                "must be in [0, 1]",
            ));
        }
        Ok(Self {
            name: name.into(),
            params,
        })
    }
}

impl Plugin for ActiveRequestScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}

impl Scorer for ActiveRequestScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let idle = self.params.idle_threshold;
        let max = candidates
            .iter()
            .map(|c| c.endpoint.inflight().requests())
            .max()
            .unwrap_or(0);
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let n = c.endpoint.inflight().requests();
            *s = if n <= idle {
                1.0
            } else {
                // n > idle ≥ 0, so max ≥ n > 0.
                self.params.max_busy_score * f64::from(max - n) / f64::from(max)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::testing::{candidates, scores};

    #[test]
    fn active_requests() {
        let c = candidates(vec![EndpointMetrics::default(); 4]);
        for (i, n) in [0, 1, 3, 5].into_iter().enumerate() {
            for _ in 0..n {
                c[i].endpoint.inflight().start(1);
            }
        }
        let s = ActiveRequestScorer::build(
            "a",
            ActiveRequestParams {
                idle_threshold: 1,
                max_busy_score: 0.5,
                ..ActiveRequestParams::default()
            },
        )
        .unwrap();
        // Busy: 0.5 · (5 − n) / 5, as llm-d (not / (5 − idleThreshold)).
        assert_eq!(scores(&s, &c), vec![1.0, 1.0, 0.2, 0.0]);
    }
}
