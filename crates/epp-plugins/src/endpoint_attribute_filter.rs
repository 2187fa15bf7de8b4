//! `endpoint-attribute-filter` (llm-d's): keep the endpoints whose numeric
//! attribute passes a threshold.
//!
//! ```text
//! keep e  ⇔  value(e) <op> threshold.value       op ∈ LessThan, LessThanOrEqual,
//!                                                     GreaterThan, GreaterThanOrEqual,
//!                                                     Equal, NotEqual
//! no value: kept with onMissing Pass (default), dropped with Fail
//! none kept and fallbackOnEmpty: every candidate is kept
//! ```
//!
//! The attribute is a custom metric ([`epp_core::EndpointMetrics::custom`]):
//! with `producer` left out (or `""`), the key is `attribute` itself, as a
//! `prometheus-metric` extractor fills it; with `producer` set, the key is
//! `attribute/producer`, as `dcgm-extractor` fills `GPUUtilization/dcgm-extractor`.
//! Config loading checks an extractor of the data layer fills it.

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin};

use crate::{Builtin, invalid};

/// The custom-metric key of `attribute` published by `producer` (llm-d's
/// rule: an attribute containing `/` needs an explicit producer, so the
/// combined `Attribute/Producer` spelling is not taken for a name).
pub(crate) fn attribute_key(
    plugin: &str,
    field: &str,
    attribute: &str,
    producer: Option<&str>,
) -> Result<String, BuildError> {
    if attribute.is_empty() {
        return Err(invalid(plugin, field, "", "required"));
    }
    match producer {
        Some("") => Ok(attribute.to_owned()),
        Some(p) => Ok(format!("{attribute}/{p}")),
        None => match attribute.rsplit_once('/') {
            Some((a, p)) => Err(invalid(
                plugin,
                field,
                attribute,
                &format!(
                    "contains \"/\" but no producer is set: write `{field}: {a}` and \
                     `producer: {p}`, or set `producer` when the name itself has a \"/\""
                ),
            )),
            None => Ok(attribute.to_owned()),
        },
    }
}

/// What to do with an endpoint that lacks the attribute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub enum OnMissing {
    /// Keep it (default).
    #[default]
    Pass,
    /// Drop it.
    Fail,
}

/// A threshold comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum ThresholdOperator {
    /// `<`
    LessThan,
    /// `≤`
    LessThanOrEqual,
    /// `>`
    GreaterThan,
    /// `≥`
    GreaterThanOrEqual,
    /// `=`
    Equal,
    /// `≠`
    NotEqual,
}

impl ThresholdOperator {
    fn holds(self, v: f64, t: f64) -> bool {
        match self {
            Self::LessThan => v < t,
            Self::LessThanOrEqual => v <= t,
            Self::GreaterThan => v > t,
            Self::GreaterThanOrEqual => v >= t,
            Self::Equal => v == t,
            Self::NotEqual => v != t,
        }
    }
}

/// `algorithm.threshold`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Threshold {
    /// The comparison.
    pub operator: ThresholdOperator,
    /// The value compared against.
    pub value: f64,
}

/// `algorithm`: `type: threshold` (the only one llm-d has) and its settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilterAlgorithm {
    /// `threshold`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Required with `type: threshold`.
    #[serde(default)]
    pub threshold: Option<Threshold>,
}

/// Parameters of `endpoint-attribute-filter` (llm-d's names).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointAttributeFilterParams {
    /// The attribute (required).
    pub attribute: String,
    /// The plugin publishing it (see the module docs).
    #[serde(default)]
    pub producer: Option<String>,
    /// `Pass` (default) or `Fail`.
    #[serde(default)]
    pub on_missing: OnMissing,
    /// Keep every candidate when none passes. Default false.
    #[serde(default)]
    pub fallback_on_empty: bool,
    /// The rule.
    pub algorithm: FilterAlgorithm,
}

/// `endpoint-attribute-filter`: see the module docs.
#[derive(Debug, Clone)]
pub struct EndpointAttributeFilter {
    name: String,
    key: String,
    threshold: Threshold,
    on_missing: OnMissing,
    fallback_on_empty: bool,
}

impl Builtin for EndpointAttributeFilter {
    const TYPE: &'static str = "endpoint-attribute-filter";
    type Params = EndpointAttributeFilterParams;

    /// # Errors
    /// No attribute, an attribute with `/` and no producer, an algorithm
    /// other than `threshold`, or `threshold` without its settings.
    fn build(
        name: impl Into<String>,
        p: EndpointAttributeFilterParams,
    ) -> Result<Self, BuildError> {
        let key = attribute_key(Self::TYPE, "attribute", &p.attribute, p.producer.as_deref())?;
        if p.algorithm.kind != "threshold" {
            return Err(invalid(
                Self::TYPE,
                "algorithm.type",
                &p.algorithm.kind,
                "only threshold is supported (as in llm-d)",
            ));
        }
        let threshold = p.algorithm.threshold.ok_or_else(|| {
            invalid(
                Self::TYPE,
                "algorithm.threshold",
                "",
                "required with type threshold",
            )
        })?;
        if !threshold.value.is_finite() {
            return Err(invalid(
                Self::TYPE,
                "algorithm.threshold.value",
                threshold.value,
                "must be finite",
            ));
        }
        Ok(Self {
            name: name.into(),
            key,
            threshold,
            on_missing: p.on_missing,
            fallback_on_empty: p.fallback_on_empty,
        })
    }
}

impl EndpointAttributeFilter {
    fn keeps(&self, c: &Candidate) -> bool {
        match c.metrics.custom.get(&self.key) {
            Some(&v) => self.threshold.operator.holds(v, self.threshold.value),
            None => self.on_missing == OnMissing::Pass,
        }
    }
}

impl Plugin for EndpointAttributeFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
    fn reads_custom_metric(&self) -> Option<&str> {
        Some(&self.key)
    }
}

impl Filter for EndpointAttributeFilter {
    fn filter(&self, _cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        if self.fallback_on_empty && !candidates.iter().any(|c| self.keeps(c)) {
            return;
        }
        candidates.retain(|c| self.keeps(c));
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn gpu(v: Option<f64>) -> EndpointMetrics {
        let mut m = EndpointMetrics::fresh();
        if let Some(v) = v {
            m.custom.insert("GPUUtilization/dcgm-extractor".into(), v);
        }
        m
    }

    fn filter(yaml: &str) -> Result<EndpointAttributeFilter, BuildError> {
        EndpointAttributeFilter::build("f", serde_yaml_ng::from_str(yaml).unwrap())
    }

    fn kept(f: &EndpointAttributeFilter, values: &[Option<f64>]) -> Vec<usize> {
        let all = candidates(values.iter().map(|&v| gpu(v)).collect());
        let mut c = all.clone();
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| f.filter(cx, &mut c));
        c.iter()
            .map(|k| all.iter().position(|a| a.id() == k.id()).unwrap())
            .collect()
    }

    const GPU: &str = "{attribute: GPUUtilization, producer: dcgm-extractor, ";

    #[test]
    fn keeps_endpoints_passing_the_threshold_and_missing_ones_by_default() {
        let f = filter(&format!(
            "{GPU}algorithm: {{type: threshold, threshold: {{operator: LessThanOrEqual, value: 0.9}}}}}}"
        ))
        .unwrap();
        assert_eq!(
            kept(&f, &[Some(0.5), Some(0.95), None, Some(0.9)]),
            vec![0, 2, 3]
        );
    }

    #[test]
    fn on_missing_fail_and_fallback_on_empty() {
        let fail = filter(&format!(
            "{GPU}onMissing: Fail, algorithm: {{type: threshold, threshold: {{operator: LessThan, value: 0.5}}}}}}"
        ))
        .unwrap();
        assert_eq!(kept(&fail, &[None, Some(0.2), Some(0.7)]), vec![1]);
        assert!(
            kept(&fail, &[None, Some(0.9)]).is_empty(),
            "none pass: none kept"
        );
        let fallback = filter(&format!(
            "{GPU}onMissing: Fail, fallbackOnEmpty: true, \
             algorithm: {{type: threshold, threshold: {{operator: LessThan, value: 0.5}}}}}}"
        ))
        .unwrap();
        assert_eq!(kept(&fallback, &[None, Some(0.9)]), vec![0, 1]);
        assert_eq!(kept(&fallback, &[None, Some(0.1)]), vec![1]);
    }

    #[test]
    fn every_operator() {
        for (op, want) in [
            ("LessThan", vec![0]),
            ("LessThanOrEqual", vec![0, 1]),
            ("GreaterThan", vec![2]),
            ("GreaterThanOrEqual", vec![1, 2]),
            ("Equal", vec![1]),
            ("NotEqual", vec![0, 2]),
        ] {
            let f = filter(&format!(
                "{GPU}onMissing: Fail, algorithm: {{type: threshold, threshold: {{operator: {op}, value: 0.5}}}}}}"
            ))
            .unwrap();
            assert_eq!(kept(&f, &[Some(0.25), Some(0.5), Some(0.75)]), want, "{op}");
        }
    }

    #[test]
    fn keys_and_bad_parameters() {
        let t = "algorithm: {type: threshold, threshold: {operator: Equal, value: 1}}}";
        let key = |y: &str| filter(y).map(|f| f.key);
        assert_eq!(key(&format!("{{attribute: q, {t}")).unwrap(), "q");
        assert_eq!(
            key(&format!("{{attribute: a/b, producer: \"\", {t}")).unwrap(),
            "a/b"
        );
        assert_eq!(
            key(&format!("{{attribute: u, producer: p, {t}")).unwrap(),
            "u/p"
        );
        let combined =
            key(&format!("{{attribute: GPUUtilization/dcgm-extractor, {t}")).unwrap_err();
        assert!(
            combined.to_string().contains("producer: dcgm-extractor"),
            "{combined}"
        );
        assert!(filter("{attribute: q, algorithm: {type: topK}}").is_err());
        assert!(filter("{attribute: q, algorithm: {type: threshold}}").is_err());
        assert!(
            serde_yaml_ng::from_str::<EndpointAttributeFilterParams>(
                "{attribute: q, onMissing: Maybe, algorithm: {type: threshold}}"
            )
            .is_err()
        );
    }
}
