//! `metric-scorer`: score any Prometheus metric a `prometheus-metric`
//! extractor reads (stored in `EndpointMetrics::custom` under `metricName`).

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::Builtin;

/// Lower or higher is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum OptimizationMode {
    /// Lower values are better (latency, temperature, queue).
    Minimize,
    /// Higher values are better (free memory, throughput).
    Maximize,
}

/// How values become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
pub enum NormalizationAlgo {
    /// `(v − min) / (max − min)` (inverted for Minimize).
    #[default]
    Linear,
    /// A softmax over the candidates' linear scores, scaled so the best is 1:
    /// `exp(z_i − z_max)`, with `z = linear · 4`; it separates near-equal values
    /// less and punishes outliers more than Linear.
    Softmax,
}

/// Parameters.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricScorerParams {
    /// Key the extractor stores the value under (its `metricName`).
    pub metric_name: String,
    /// Minimize or Maximize.
    pub optimization_mode: OptimizationMode,
    /// Linear (default) or Softmax.
    #[serde(default)]
    pub normalization_algo: NormalizationAlgo,
    /// Lower end of the expected range (values below are clamped). Default:
    /// the lowest value among the candidates.
    #[serde(default)]
    pub min: Option<f64>,
    /// Upper end of the expected range. Default: the highest among the candidates.
    #[serde(default)]
    pub max: Option<f64>,
}

/// `metric-scorer`. A candidate without the metric scores 0 (worst).
#[derive(Debug, Clone)]
pub struct MetricScorer {
    name: String,
    params: MetricScorerParams,
}

/// Softmax sharpness applied to linear scores in [0, 1].
const SOFTMAX_SCALE: f64 = 4.0;

impl Builtin for MetricScorer {
    const TYPE: &'static str = "metric-scorer";
    type Params = MetricScorerParams;

    /// # Errors
    /// `min >= max`, non-finite bounds, or an empty metric name.
    fn build(name: impl Into<String>, params: MetricScorerParams) -> Result<Self, BuildError> {
        let name = name.into();
        let bad = |field: &str, value: String, reason: &str| BuildError::InvalidValue {
            plugin: name.clone(),
            field: field.into(),
            value,
            reason: reason.into(),
        };
        if params.metric_name.is_empty() {
            return Err(bad("metricName", String::new(), "must name a metric"));
        }
        for (f, v) in [("min", params.min), ("max", params.max)] {
            if let Some(v) = v
                && !v.is_finite()
            {
                return Err(bad(f, v.to_string(), "must be a finite number"));
            }
        }
        if let (Some(lo), Some(hi)) = (params.min, params.max)
            && lo >= hi
        {
            return Err(bad("min", lo.to_string(), "must be below max"));
        }
        Ok(Self { name, params })
    }
}

impl Plugin for MetricScorer {
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
        Some(&self.params.metric_name)
    }
}

impl Scorer for MetricScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let key = self.params.metric_name.as_str();
        let value = |c: &Candidate| c.metrics.custom.get(key).copied().filter(|v| v.is_finite());
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in candidates.iter().filter_map(value) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        let lo = self.params.min.unwrap_or(lo);
        let hi = self.params.max.unwrap_or(hi);
        // Linear preference in [0, 1]; -1 marks a missing value.
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = match value(c) {
                None => -1.0,
                Some(_) if hi <= lo => 1.0,
                Some(v) => {
                    let x = (v.clamp(lo, hi) - lo) / (hi - lo);
                    match self.params.optimization_mode {
                        OptimizationMode::Maximize => x,
                        OptimizationMode::Minimize => 1.0 - x,
                    }
                }
            };
        }
        if self.params.normalization_algo == NormalizationAlgo::Softmax {
            let best = out.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            for s in out.iter_mut().filter(|s| **s >= 0.0) {
                *s = (SOFTMAX_SCALE * (*s - best)).exp();
            }
        }
        for s in out.iter_mut() {
            if *s < 0.0 {
                *s = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::testing::{candidates, scores};

    fn with(v: Option<f64>) -> EndpointMetrics {
        let mut m = EndpointMetrics::default();
        if let Some(v) = v {
            m.custom.insert("temp".into(), v);
        }
        m
    }

    fn scorer(
        mode: OptimizationMode,
        algo: NormalizationAlgo,
        min: Option<f64>,
        max: Option<f64>,
    ) -> MetricScorer {
        MetricScorer::build(
            "m",
            MetricScorerParams {
                metric_name: "temp".into(),
                optimization_mode: mode,
                normalization_algo: algo,
                min,
                max,
            },
        )
        .unwrap()
    }

    #[test]
    fn linear_with_clamping_and_missing_as_worst() {
        let c = candidates(vec![
            with(Some(40.0)),
            with(Some(70.0)),
            with(Some(120.0)),
            with(None),
        ]);
        let s = scorer(
            OptimizationMode::Minimize,
            NormalizationAlgo::Linear,
            Some(40.0),
            Some(100.0),
        );
        assert_eq!(scores(&s, &c), vec![1.0, 0.5, 0.0, 0.0]);
        let s = scorer(
            OptimizationMode::Maximize,
            NormalizationAlgo::Linear,
            None,
            None,
        );
        assert_eq!(scores(&s, &c), vec![0.0, 0.375, 1.0, 0.0]);
    }

    #[test]
    fn softmax_keeps_order_and_best_is_one() {
        let c = candidates(vec![
            with(Some(0.0)),
            with(Some(50.0)),
            with(Some(100.0)),
            with(None),
        ]);
        let s = scores(
            &scorer(
                OptimizationMode::Minimize,
                NormalizationAlgo::Softmax,
                Some(0.0),
                Some(100.0),
            ),
            &c,
        );
        assert_eq!(s[0], 1.0);
        assert!(s[0] > s[1] && s[1] > s[2] && s[2] > s[3], "{s:?}");
        assert!((s[1] - (-2.0f64).exp()).abs() < 1e-12);
        assert_eq!(s[3], 0.0);
    }

    #[test]
    fn params_are_validated() {
        let p: MetricScorerParams = serde_yaml_ng::from_str(
            "metricName: x\noptimizationMode: Sideways\n",
        )
        .unwrap_or_else(|_| MetricScorerParams {
            metric_name: "x".into(),
            optimization_mode: OptimizationMode::Minimize,
            normalization_algo: NormalizationAlgo::Linear,
            min: Some(5.0),
            max: Some(1.0),
        });
        assert!(MetricScorer::build("m", p).is_err());
        assert!(
            serde_yaml_ng::from_str::<MetricScorerParams>(
                "metricName: x\noptimizationMode: Sideways\n"
            )
            .is_err()
        );
    }
}
