//! `prometheus-metric`: any metric a user names, for `metric-scorer`.

use std::collections::BTreeMap;

use epp_core::{BuildError, Endpoint, EndpointMetrics, ExtractError, Extractor, Plugin};
use epp_promtext::{Selector, SelectorSet};

/// Parameters.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusMetricParams {
    /// The metric's exact name.
    pub metric_name: String,
    /// Labels a series must carry (series selection).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `prometheus-metric`: writes the selected series' value into
/// `EndpointMetrics::custom[metricName]` (the sum when several series match).
/// A page without the metric leaves it absent, which scorers treat as worst.
#[derive(Debug, Clone)]
pub struct PrometheusMetricExtractor {
    name: String,
    key: String,
    set: SelectorSet,
}

impl PrometheusMetricExtractor {
    /// YAML type.
    pub const TYPE: &'static str = "prometheus-metric";

    /// An extractor named `name`.
    ///
    /// # Errors
    /// An invalid metric or label name.
    pub fn new(
        name: impl Into<String>,
        params: PrometheusMetricParams,
    ) -> Result<Self, BuildError> {
        let name = name.into();
        let mut sel =
            Selector::parse(&params.metric_name).map_err(|e| BuildError::InvalidValue {
                plugin: name.clone(),
                field: "metricName".into(),
                value: params.metric_name.clone(),
                reason: e.to_string(),
            })?;
        if !sel.matchers.is_empty() {
            return Err(BuildError::InvalidValue {
                plugin: name,
                field: "metricName".into(),
                value: params.metric_name,
                reason: "give a bare metric name and put label matchers under `labels`".into(),
            });
        }
        for (k, v) in params.labels {
            sel = sel.with_label(k, v);
        }
        Ok(Self {
            name,
            key: params.metric_name,
            set: SelectorSet::new(vec![sel]),
        })
    }
}

impl Plugin for PrometheusMetricExtractor {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_extractor(&self) -> Option<&dyn Extractor> {
        Some(self)
    }
}

impl Extractor for PrometheusMetricExtractor {
    fn custom_metrics(&self) -> Option<&[String]> {
        Some(std::slice::from_ref(&self.key))
    }

    fn extract(
        &self,
        _endpoint: &Endpoint,
        page: &str,
        m: &mut EndpointMetrics,
    ) -> Result<(), ExtractError> {
        let mut total: Option<f64> = None;
        self.set.scan(page, |_, s| {
            if s.value.is_finite() {
                *total.get_or_insert(0.0) += s.value;
            }
        });
        match total {
            Some(v) => {
                m.custom.insert(self.key.clone(), v);
            }
            None => {
                m.custom.remove(&self.key);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_by_labels() {
        let params: PrometheusMetricParams =
            serde_yaml_ng::from_str("metricName: gpu_temp\nlabels: {gpu: \"0\"}\n").unwrap();
        let x = PrometheusMetricExtractor::new("t", params).unwrap();
        let e = Endpoint::new(0, "1.1.1.1:1".parse().unwrap());
        let mut m = EndpointMetrics::default();
        x.extract(
            &e,
            "gpu_temp{gpu=\"1\"} 90\ngpu_temp{gpu=\"0\"} 71.5\n",
            &mut m,
        )
        .unwrap();
        assert_eq!(m.custom["gpu_temp"], 71.5);
        x.extract(&e, "other 1\n", &mut m).unwrap();
        assert!(!m.custom.contains_key("gpu_temp"), "missing stays missing");
        let bad = PrometheusMetricParams {
            metric_name: "a{b=\"c\"}".into(),
            labels: BTreeMap::new(),
        };
        assert!(PrometheusMetricExtractor::new("t", bad).is_err());
    }
}
