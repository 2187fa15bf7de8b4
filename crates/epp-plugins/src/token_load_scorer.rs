//! `token-load-scorer`: prefer endpoints with few prompt tokens in flight
//! from this picker.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::invalid;

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
}
