//! `queue-scorer`: min-max normalised preference for short waiting queues.

use epp_core::{Candidate, CycleContext, Plugin, Scorer};

use crate::load_signal::LoadSignalParams;

/// Writes `(max − v) / (max − min)` per candidate; 1 for all when all equal.
pub(crate) fn min_max_low_is_good(
    candidates: &[Candidate],
    out: &mut [f64],
    value: impl Fn(&Candidate) -> u32,
) {
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    for c in candidates {
        let v = value(c);
        lo = lo.min(v);
        hi = hi.max(v);
    }
    for (c, s) in candidates.iter().zip(out.iter_mut()) {
        *s = if hi == lo {
            1.0
        } else {
            f64::from(hi - value(c)) / f64::from(hi - lo)
        };
    }
}

/// `queue-scorer`: `(max − q) / (max − min)` of the waiting queue across the
/// candidates; 1 when all are equal.
#[derive(Debug, Clone)]
pub struct QueueScorer {
    name: String,
    signal: LoadSignalParams,
}

impl QueueScorer {
    /// YAML type.
    pub const TYPE: &'static str = "queue-scorer";

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

impl Plugin for QueueScorer {
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

impl Scorer for QueueScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        min_max_low_is_good(candidates, out, |c| self.signal.waiting(c));
    }
}

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::testing::{candidates, scores};

    #[test]
    fn formula() {
        let m = |waiting| EndpointMetrics {
            waiting,
            ..Default::default()
        };
        let c = candidates(vec![m(0), m(5), m(10)]);
        assert_eq!(scores(&QueueScorer::new("q"), &c), vec![1.0, 0.5, 0.0]);
        let equal = candidates(vec![m(4), m(4)]);
        assert_eq!(scores(&QueueScorer::new("q"), &equal), vec![1.0, 1.0]);
    }
}
