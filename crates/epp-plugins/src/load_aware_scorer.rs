//! `load-aware-scorer`: prefer short waiting queues, against a fixed threshold.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::{Builtin, invalid};

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

impl Builtin for LoadAwareScorer {
    const TYPE: &'static str = "load-aware-scorer";
    type Params = LoadAwareParams;

    /// # Errors
    /// A zero threshold.
    fn build(name: impl Into<String>, p: LoadAwareParams) -> Result<Self, BuildError> {
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

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::testing::{candidates, scores};

    #[test]
    fn load_aware() {
        let m = |waiting| EndpointMetrics {
            waiting,
            ..Default::default()
        };
        let c = candidates(vec![m(0), m(64), m(500)]);
        let s = LoadAwareScorer::build("l", LoadAwareParams::default()).unwrap();
        assert_eq!(scores(&s, &c), vec![0.5, 0.25, 0.0]);
    }
}
