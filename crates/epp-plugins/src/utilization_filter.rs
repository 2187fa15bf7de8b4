//! `utilization-filter` (llm-d): keep endpoints whose load metrics are all
//! at or below configured ceilings.

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin};

use crate::{Builtin, invalid};

/// A metric a condition bounds (llm-d's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum UtilizationMetric {
    /// Requests this picker routed to the endpoint and not yet completed.
    #[serde(rename = "active-requests")]
    ActiveRequests,
    /// The server's running requests (scraped).
    #[serde(rename = "running-requests")]
    RunningRequests,
    /// The server's waiting queue (scraped).
    #[serde(rename = "waiting-queue")]
    WaitingQueue,
    /// The server's KV-cache usage, a fraction (scraped).
    #[serde(rename = "kv-cache-utilization")]
    KvCacheUtilization,
}

/// `{metric, maxValue}`: the endpoint passes when `metric ≤ maxValue`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UtilizationCondition {
    /// The metric.
    pub metric: UtilizationMetric,
    /// Ceiling (≥ 0; ≤ 1 for `kv-cache-utilization`). Required.
    pub max_value: Option<f64>,
}

/// Parameters of `utilization-filter`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UtilizationFilterParams {
    /// Conditions, all of which must hold (at least one).
    #[serde(default)]
    pub conditions: Vec<UtilizationCondition>,
    /// Keep every candidate when none passes. Default false.
    #[serde(default)]
    pub fallback_on_empty: bool,
    /// llm-d's in-flight load producer for `active-requests`; this picker
    /// counts every endpoint's in-flight requests itself, so the name is
    /// accepted for llm-d's configs and changes nothing.
    #[serde(default)]
    pub in_flight_load_producer_name: Option<String>,
}

/// `utilization-filter`: keeps the candidates meeting every condition; when
/// none does, keeps all of them if `fallbackOnEmpty`, else none (the request
/// then gets 503), as in llm-d.
#[derive(Debug, Clone)]
pub struct UtilizationFilter {
    name: String,
    /// `(metric, ceiling)`, validated.
    conditions: Vec<(UtilizationMetric, f64)>,
    fallback_on_empty: bool,
}

impl Builtin for UtilizationFilter {
    const TYPE: &'static str = "utilization-filter";
    type Params = UtilizationFilterParams;

    /// # Errors
    /// No condition, a condition without `maxValue`, a negative ceiling, or a
    /// KV ceiling above 1.
    fn build(name: impl Into<String>, p: UtilizationFilterParams) -> Result<Self, BuildError> {
        if p.conditions.is_empty() {
            return Err(invalid(
                Self::TYPE,
                "conditions",
                "[]",
                "at least one condition is required",
            ));
        }
        let mut conditions = Vec::with_capacity(p.conditions.len());
        for (i, c) in p.conditions.iter().enumerate() {
            let field = format!("conditions[{i}].maxValue");
            let Some(max) = c.max_value else {
                return Err(invalid(Self::TYPE, &field, "none", "maxValue is required"));
            };
            if !(max.is_finite() && max >= 0.0) {
                return Err(invalid(Self::TYPE, &field, max, "must be >= 0"));
            }
            if c.metric == UtilizationMetric::KvCacheUtilization && max > 1.0 {
                return Err(invalid(
                    Self::TYPE,
                    &field,
                    max,
                    "kv-cache-utilization is a fraction: at most 1",
                ));
            }
            conditions.push((c.metric, max));
        }
        Ok(Self {
            name: name.into(),
            conditions,
            fallback_on_empty: p.fallback_on_empty,
        })
    }
}

impl UtilizationFilter {
    fn passes(&self, c: &Candidate) -> bool {
        self.conditions.iter().all(|&(metric, max)| {
            let v = match metric {
                UtilizationMetric::ActiveRequests => f64::from(c.endpoint.inflight().requests()),
                UtilizationMetric::RunningRequests => f64::from(c.metrics.running),
                UtilizationMetric::WaitingQueue => f64::from(c.metrics.waiting),
                UtilizationMetric::KvCacheUtilization => c.metrics.kv_usage,
            };
            v <= max
        })
    }
}

impl Plugin for UtilizationFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}

impl Filter for UtilizationFilter {
    fn filter(&self, _cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        if self.fallback_on_empty && !candidates.iter().any(|c| self.passes(c)) {
            return;
        }
        candidates.retain(|c| self.passes(c));
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn kept(f: &UtilizationFilter, c: &[Candidate]) -> Vec<u32> {
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            let mut kept = c.to_vec();
            f.filter(cx, &mut kept);
            kept.iter().map(|c| c.id().0).collect()
        })
    }

    fn filter(yaml: &str) -> Result<UtilizationFilter, BuildError> {
        UtilizationFilter::build("u", serde_yaml_ng::from_str(yaml).unwrap())
    }

    #[test]
    fn every_condition_must_hold() {
        let m = |waiting, running, kv_usage| EndpointMetrics {
            waiting,
            running,
            kv_usage,
            ..Default::default()
        };
        let c = candidates(vec![
            m(2, 10, 0.5),
            m(3, 10, 0.5),
            m(0, 11, 0.5),
            m(0, 0, 0.91),
        ]);
        c[0].endpoint.inflight().start(0);
        let f = filter(
            "conditions:\n\
             - {metric: waiting-queue, maxValue: 2}\n\
             - {metric: running-requests, maxValue: 10}\n\
             - {metric: kv-cache-utilization, maxValue: 0.9}\n",
        )
        .unwrap();
        assert_eq!(kept(&f, &c), vec![0], "values equal to the ceiling pass");
        let active = filter("conditions: [{metric: active-requests, maxValue: 0}]").unwrap();
        assert_eq!(kept(&active, &c), vec![1, 2, 3]);
    }

    #[test]
    fn empty_result_unless_fallback() {
        let c = candidates(vec![
            EndpointMetrics {
                waiting: 5,
                ..Default::default()
            };
            2
        ]);
        let strict = filter("conditions: [{metric: waiting-queue, maxValue: 1}]").unwrap();
        assert!(kept(&strict, &c).is_empty());
        let lenient =
            filter("conditions: [{metric: waiting-queue, maxValue: 1}]\nfallbackOnEmpty: true")
                .unwrap();
        assert_eq!(kept(&lenient, &c), vec![0, 1]);
    }

    #[test]
    fn bad_conditions_are_load_errors() {
        for (yaml, want) in [
            ("{}", "at least one condition"),
            (
                "conditions: [{metric: waiting-queue}]",
                "maxValue is required",
            ),
            (
                "conditions: [{metric: waiting-queue, maxValue: -1}]",
                "must be >= 0",
            ),
            (
                "conditions: [{metric: kv-cache-utilization, maxValue: 80}]",
                "at most 1",
            ),
        ] {
            let err = filter(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        assert!(
            serde_yaml_ng::from_str::<UtilizationFilterParams>(
                "conditions: [{metric: gpu-temperature, maxValue: 1}]"
            )
            .is_err()
        );
    }
}
