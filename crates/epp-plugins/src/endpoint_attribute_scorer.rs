//! `endpoint-attribute-scorer` (llm-d's): score endpoints by one numeric
//! attribute, linearly.
//!
//! ```text
//! n(e) = (value(e) − min) / (max − min)
//! score = n (linear_higher_is_better) or 1 − n (linear_lower_is_better)
//! adaptiveRange (default): min, max over the candidates that have the
//!   attribute; all equal → 1 for each of them
//! fixedRange {min, max}: the configured bounds, n clamped to [0, 1]
//! no value → 0
//! ```
//!
//! The attribute is read as `endpoint-attribute-filter` reads it
//! (`attributeKey` and `producer`: the custom metric `attributeKey`, or
//! `attributeKey/producer`).

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::{Builtin, endpoint_attribute_filter::attribute_key, invalid};

/// `normalization.fixedRange`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedRange {
    /// Lower bound.
    pub min: f64,
    /// Upper bound (> min).
    pub max: f64,
}

/// `normalization.adaptiveRange` (no settings).
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveRange {}

/// `algorithm.normalization`: at most one strategy.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Normalization {
    /// Configured bounds.
    #[serde(default)]
    pub fixed_range: Option<FixedRange>,
    /// The candidates' range (the default).
    #[serde(default)]
    pub adaptive_range: Option<AdaptiveRange>,
}

/// `algorithm`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScorerAlgorithm {
    /// `linear_lower_is_better` or `linear_higher_is_better`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The range.
    #[serde(default)]
    pub normalization: Normalization,
}

/// Parameters of `endpoint-attribute-scorer` (llm-d's names).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointAttributeScorerParams {
    /// The attribute (required).
    pub attribute_key: String,
    /// The plugin publishing it.
    #[serde(default)]
    pub producer: Option<String>,
    /// The rule.
    pub algorithm: ScorerAlgorithm,
}

/// `endpoint-attribute-scorer`: see the module docs.
#[derive(Debug, Clone)]
pub struct EndpointAttributeScorer {
    name: String,
    key: String,
    lower_is_better: bool,
    fixed: Option<FixedRange>,
}

impl Builtin for EndpointAttributeScorer {
    const TYPE: &'static str = "endpoint-attribute-scorer";
    type Params = EndpointAttributeScorerParams;

    /// # Errors
    /// No attribute, an attribute with `/` and no producer, an unknown
    /// algorithm, both normalizations, or a fixed range with min ≥ max.
    fn build(
        name: impl Into<String>,
        p: EndpointAttributeScorerParams,
    ) -> Result<Self, BuildError> {
        let key = attribute_key(
            Self::TYPE,
            "attributeKey",
            &p.attribute_key,
            p.producer.as_deref(),
        )?;
        let lower_is_better = match p.algorithm.kind.as_str() {
            "linear_lower_is_better" => true,
            "linear_higher_is_better" => false,
            other => {
                return Err(invalid(
                    Self::TYPE,
                    "algorithm.type",
                    other,
                    "must be linear_lower_is_better or linear_higher_is_better",
                ));
            }
        };
        let n = p.algorithm.normalization;
        if n.fixed_range.is_some() && n.adaptive_range.is_some() {
            return Err(invalid(
                Self::TYPE,
                "algorithm.normalization",
                "fixedRange, adaptiveRange",
                "give at most one",
            ));
        }
        if let Some(r) = n.fixed_range
            && (r.min >= r.max || !r.min.is_finite() || !r.max.is_finite())
        {
            return Err(invalid(
                Self::TYPE,
                "algorithm.normalization.fixedRange",
                format!("min {}, max {}", r.min, r.max),
                "min must be less than max",
            ));
        }
        Ok(Self {
            name: name.into(),
            key,
            lower_is_better,
            fixed: n.fixed_range,
        })
    }
}

impl Plugin for EndpointAttributeScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn reads_custom_metric(&self) -> Option<&str> {
        Some(&self.key)
    }
}

impl Scorer for EndpointAttributeScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let value = |c: &Candidate| c.metrics.custom.get(&self.key).copied();
        let (lo, hi) = match self.fixed {
            Some(r) => (r.min, r.max),
            None => candidates
                .iter()
                .filter_map(value)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                }),
        };
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = match value(c) {
                None => 0.0,
                Some(_) if self.fixed.is_none() && lo == hi => 1.0,
                Some(v) => {
                    let n = ((v - lo) / (hi - lo)).clamp(0.0, 1.0);
                    if self.lower_is_better { 1.0 - n } else { n }
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::testing::{candidates, scores};

    fn with(values: &[Option<f64>]) -> Vec<Candidate> {
        candidates(
            values
                .iter()
                .map(|&v| {
                    let mut m = EndpointMetrics::fresh();
                    if let Some(v) = v {
                        m.custom.insert("GPUUtilization/dcgm-extractor".into(), v);
                    }
                    m
                })
                .collect(),
        )
    }

    fn scorer(algorithm: &str) -> Result<EndpointAttributeScorer, BuildError> {
        EndpointAttributeScorer::build(
            "s",
            serde_yaml_ng::from_str(&format!(
                "{{attributeKey: GPUUtilization, producer: dcgm-extractor, algorithm: {algorithm}}}"
            ))
            .unwrap(),
        )
    }

    #[test]
    fn fixed_range_lower_is_better_as_llm_ds_gpu_config() {
        let s = scorer(
            "{type: linear_lower_is_better, normalization: {fixedRange: {min: 0.0, max: 1.0}}}",
        )
        .unwrap();
        assert_eq!(
            scores(&s, &with(&[Some(0.25), Some(1.0), None, Some(1.5)])),
            vec![0.75, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn adaptive_range_over_the_candidates_having_the_value() {
        let s = scorer("{type: linear_higher_is_better}").unwrap();
        assert_eq!(
            scores(&s, &with(&[Some(2.0), Some(4.0), None, Some(3.0)])),
            vec![0.0, 1.0, 0.0, 0.5]
        );
        let low =
            scorer("{type: linear_lower_is_better, normalization: {adaptiveRange: {}}}").unwrap();
        assert_eq!(scores(&low, &with(&[Some(2.0), Some(4.0)])), vec![1.0, 0.0]);
        assert_eq!(
            scores(&low, &with(&[Some(7.0), None, Some(7.0)])),
            vec![1.0, 0.0, 1.0],
            "all equal: 1 each"
        );
    }

    #[test]
    fn bad_parameters() {
        assert!(scorer("{type: softmax}").is_err());
        assert!(
            scorer("{type: linear_lower_is_better, normalization: {fixedRange: {min: 1, max: 1}}}")
                .is_err()
        );
        assert!(
            scorer(
                "{type: linear_lower_is_better, normalization: {fixedRange: {min: 0, max: 1}, adaptiveRange: {}}}"
            )
            .is_err()
        );
    }
}
