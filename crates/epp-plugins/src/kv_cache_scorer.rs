//! `kv-cache-utilization-scorer`: prefer free KV cache.

use epp_core::{Candidate, CycleContext, Plugin, Scorer};

use crate::load_signal::LoadSignalParams;

/// `kv-cache-utilization-scorer`: `1 − KV usage`.
#[derive(Debug, Clone)]
pub struct KvCacheUtilizationScorer {
    name: String,
    signal: LoadSignalParams,
}

impl KvCacheUtilizationScorer {
    /// YAML type.
    pub const TYPE: &'static str = "kv-cache-utilization-scorer";

    /// A scorer named `name` that counts what was dispatched since the last
    /// scrape (see [`LoadSignalParams`]).
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self::with_params(name, LoadSignalParams::default())
    }

    /// A scorer named `name` with parameters.
    #[must_use]
    pub fn with_params(name: impl Into<String>, signal: LoadSignalParams) -> Self {
        Self {
            name: name.into(),
            signal,
        }
    }
}

impl Plugin for KvCacheUtilizationScorer {
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

impl Scorer for KvCacheUtilizationScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let kv = self.signal.kv_usage(c);
            // An unreadable usage counts as full rather than poisoning the total.
            *s = if kv.is_nan() {
                0.0
            } else {
                1.0 - kv.clamp(0.0, 1.0)
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
    fn formula() {
        let m = |kv_usage| EndpointMetrics {
            kv_usage,
            ..Default::default()
        };
        let c = candidates(vec![m(0.0), m(0.25), m(1.0), m(1.7), m(f64::NAN)]);
        assert_eq!(
            scores(&KvCacheUtilizationScorer::new("kv"), &c),
            vec![1.0, 0.75, 0.0, 0.0, 0.0]
        );
    }
}
