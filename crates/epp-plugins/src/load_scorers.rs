//! Scorers on load this picker tracks itself or the server reports:
//! `token-load-scorer`, `load-aware-scorer`, `active-request-scorer`.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

fn invalid(plugin: &str, field: &str, value: impl ToString, reason: &str) -> BuildError {
    BuildError::InvalidValue {
        plugin: plugin.into(),
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Parameters of `token-load-scorer`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenLoadParams {
    /// In-flight tokens at which an endpoint scores 0. Default 4194304.
    #[serde(default = "default_tokens")]
    pub queue_threshold_tokens: u64,
}

fn default_tokens() -> u64 {
    4_194_304
}

impl Default for TokenLoadParams {
    fn default() -> Self {
        Self {
            queue_threshold_tokens: default_tokens(),
        }
    }
}

/// `token-load-scorer`: `1 − min(in-flight tokens, thr) / thr`, from the
/// prompt tokens of requests this picker routed and that have not completed.
#[derive(Debug, Clone)]
pub struct TokenLoadScorer {
    name: String,
    threshold: u64,
}

impl TokenLoadScorer {
    /// YAML type.
    pub const TYPE: &'static str = "token-load-scorer";

    /// A scorer named `name`.
    ///
    /// # Errors
    /// A zero threshold.
    pub fn new(name: impl Into<String>, p: TokenLoadParams) -> Result<Self, BuildError> {
        if p.queue_threshold_tokens == 0 {
            return Err(invalid(
                Self::TYPE,
                "queueThresholdTokens",
                0,
                "must be at least 1",
            ));
        }
        Ok(Self {
            name: name.into(),
            threshold: p.queue_threshold_tokens,
        })
    }
}

impl Plugin for TokenLoadScorer {
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

impl Scorer for TokenLoadScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let t = c.endpoint.inflight().tokens().min(self.threshold);
            *s = 1.0 - t as f64 / self.threshold as f64;
        }
    }
}

/// Parameters of `load-aware-scorer`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadAwareParams {
    /// Waiting requests at which an endpoint scores 0. Default 128.
    #[serde(default = "default_queue")]
    pub threshold: u32,
}

fn default_queue() -> u32 {
    128
}

impl Default for LoadAwareParams {
    fn default() -> Self {
        Self {
            threshold: default_queue(),
        }
    }
}

/// `load-aware-scorer`: 0.5 for an empty queue, else `0.5 · (1 − min(q, thr) / thr)`.
#[derive(Debug, Clone)]
pub struct LoadAwareScorer {
    name: String,
    threshold: u32,
}

impl LoadAwareScorer {
    /// YAML type.
    pub const TYPE: &'static str = "load-aware-scorer";

    /// A scorer named `name`.
    ///
    /// # Errors
    /// A zero threshold.
    pub fn new(name: impl Into<String>, p: LoadAwareParams) -> Result<Self, BuildError> {
        if p.threshold == 0 {
            return Err(invalid(Self::TYPE, "threshold", 0, "must be at least 1"));
        }
        Ok(Self {
            name: name.into(),
            threshold: p.threshold,
        })
    }
}

impl Plugin for LoadAwareScorer {
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

impl Scorer for LoadAwareScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let q = c.metrics.waiting;
            *s = if q == 0 {
                0.5
            } else {
                0.5 * (1.0 - f64::from(q.min(self.threshold)) / f64::from(self.threshold))
            };
        }
    }
}

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
    fn token_load() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        c[1].endpoint.inflight().start(50);
        c[2].endpoint.inflight().start(500);
        let s = TokenLoadScorer::new(
            "t",
            TokenLoadParams {
                queue_threshold_tokens: 100,
            },
        )
        .unwrap();
        assert_eq!(scores(&s, &c), vec![1.0, 0.5, 0.0]);
        assert!(
            TokenLoadScorer::new(
                "t",
                TokenLoadParams {
                    queue_threshold_tokens: 0
                }
            )
            .is_err()
        );
    }

    #[test]
    fn load_aware() {
        let m = |waiting| EndpointMetrics {
            waiting,
            ..Default::default()
        };
        let c = candidates(vec![m(0), m(64), m(500)]);
        let s = LoadAwareScorer::new("l", LoadAwareParams::default()).unwrap();
        assert_eq!(scores(&s, &c), vec![0.5, 0.25, 0.0]);
    }

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
