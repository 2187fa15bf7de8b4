//! `concurrency-detector`: saturation from the requests this picker has in
//! flight per endpoint.

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin, SaturationDetector};

/// Parameters.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConcurrencyDetectorParams {
    /// In-flight requests at which an endpoint is full. Default 100.
    #[serde(default = "default_max")]
    pub max_concurrency: u32,
}

fn default_max() -> u32 {
    100
}

impl Default for ConcurrencyDetectorParams {
    fn default() -> Self {
        Self {
            max_concurrency: default_max(),
        }
    }
}

/// `concurrency-detector`: saturation = mean of `in-flight / maxConcurrency`;
/// as a filter, keeps endpoints below the limit (all, when none is).
#[derive(Debug, Clone)]
pub struct ConcurrencyDetector {
    name: String,
    max: u32,
}

impl ConcurrencyDetector {
    /// YAML type.
    pub const TYPE: &'static str = "concurrency-detector";

    /// A detector named `name`.
    ///
    /// # Errors
    /// A zero limit.
    pub fn new(name: impl Into<String>, p: ConcurrencyDetectorParams) -> Result<Self, BuildError> {
        if p.max_concurrency == 0 {
            return Err(BuildError::InvalidValue {
                plugin: Self::TYPE.into(),
                field: "maxConcurrency".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(Self {
            name: name.into(),
            max: p.max_concurrency,
        })
    }
}

impl Plugin for ConcurrencyDetector {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        Some(self)
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}

impl SaturationDetector for ConcurrencyDetector {
    fn saturation(&self, _cx: &CycleContext<'_>, endpoints: &[Candidate]) -> f64 {
        if endpoints.is_empty() {
            return 1.0;
        }
        let total: f64 = endpoints
            .iter()
            .map(|c| f64::from(c.endpoint.inflight().requests()) / f64::from(self.max))
            .sum();
        total / endpoints.len() as f64
    }

    fn has_capacity(&self, _cx: &CycleContext<'_>, endpoint: &Candidate) -> bool {
        endpoint.endpoint.inflight().requests() < self.max
    }
}

impl Filter for ConcurrencyDetector {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        crate::keep_with_capacity(self, cx, candidates);
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn saturation_and_filter() {
        let d = ConcurrencyDetector::new("c", ConcurrencyDetectorParams { max_concurrency: 2 })
            .unwrap();
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        c[0].endpoint.inflight().start(1);
        c[0].endpoint.inflight().start(1);
        c[1].endpoint.inflight().start(1);
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            assert!((d.saturation(cx, &c) - 0.75).abs() < 1e-12);
            let mut kept = c.clone();
            d.filter(cx, &mut kept);
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0].id(), c[1].id());
        });
    }
}
