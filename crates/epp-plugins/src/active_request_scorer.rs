//! `active-request-scorer`: prefer endpoints with few requests in flight
//! from this picker.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::invalid;

/// Parameters of `active-request-scorer`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ActiveRequestParams {
    /// In-flight requests at or below which an endpoint counts as idle. Default 0.
    #[serde(default)]
    pub idle_threshold: u32,
    /// Highest score a busy endpoint can get. Default 1.0.
    #[serde(default = "default_busy")]
    pub max_busy_score: f64,
}

fn default_busy() -> f64 {
    1.0
}

impl Default for ActiveRequestParams {
    fn default() -> Self {
        Self {
            idle_threshold: 0,
            max_busy_score: default_busy(),
        }
    }
}

/// `active-request-scorer`, from the requests this picker has in flight on
/// each endpoint: idle endpoints (count ≤ `idleThreshold`) score 1; busy ones
/// `maxBusyScore · (max − count) / (max − idleThreshold)`, `max` being the
/// busiest candidate's count.
#[derive(Debug, Clone)]
pub struct ActiveRequestScorer {
    name: String,
    params: ActiveRequestParams,
}

impl ActiveRequestScorer {
    /// YAML type.
    pub const TYPE: &'static str = "active-request-scorer";

    /// A scorer named `name`.
    ///
    /// # Errors
    /// `maxBusyScore` outside [0, 1].
    pub fn new(name: impl Into<String>, params: ActiveRequestParams) -> Result<Self, BuildError> {
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
                self.params.max_busy_score * f64::from(max - n) / f64::from(max - idle)
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
        let s = ActiveRequestScorer::new(
            "a",
            ActiveRequestParams {
                idle_threshold: 1,
                max_busy_score: 0.5,
            },
        )
        .unwrap();
        assert_eq!(scores(&s, &c), vec![1.0, 1.0, 0.25, 0.0]);
    }
}
