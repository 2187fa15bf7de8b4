//! `running-requests-size-scorer`: min-max normalised preference for few
//! running requests.

use epp_core::{Candidate, CycleContext, Plugin, Scorer};

use crate::{load_signal::LoadSignalParams, queue_scorer::min_max_low_is_good};

/// `running-requests-size-scorer`: the same normalisation on running requests.
#[derive(Debug, Clone)]
pub struct RunningRequestsSizeScorer {
    name: String,
    signal: LoadSignalParams,
}

impl RunningRequestsSizeScorer {
    /// YAML type.
    pub const TYPE: &'static str = "running-requests-size-scorer";

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

impl Plugin for RunningRequestsSizeScorer {
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

impl Scorer for RunningRequestsSizeScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        min_max_low_is_good(candidates, out, |c| self.signal.running(c));
    }
}

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::testing::{candidates, scores};

    #[test]
    fn formula() {
        let m = |running| EndpointMetrics {
            running,
            ..Default::default()
        };
        let c = candidates(vec![m(9), m(3), m(3)]);
        assert_eq!(
            scores(&RunningRequestsSizeScorer::new("r"), &c),
            vec![0.0, 1.0, 1.0]
        );
    }
}
