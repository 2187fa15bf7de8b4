//! A downstream crate extending epp-rs without touching it: an extractor that
//! reads a GPU-temperature gauge from each model server's metrics page into a
//! typed attribute, and a scorer that prefers cool GPUs, both registered
//! through the plugin registry and used from YAML:
//!
//! ```yaml
//! plugins:
//! - type: metrics-data-source
//! - type: core-metrics-extractor
//! - type: gpu-temperature-extractor
//!   parameters: {metricName: DCGM_FI_DEV_GPU_TEMP}
//! - type: cool-gpu-scorer
//!   parameters: {coolCelsius: 40, hotCelsius: 90}
//! dataLayer:
//!   sources:
//!   - pluginRef: metrics-data-source
//!     extractors: [{pluginRef: core-metrics-extractor}, {pluginRef: gpu-temperature-extractor}]
//! ```
//!
//! ```
//! let mut registry = epp_core::Registry::new();
//! gpu_temperature::register(&mut registry);
//! assert!(registry.contains("gpu-temperature-extractor"));
//! assert!(registry.contains("cool-gpu-scorer"));
//! ```
#![warn(missing_docs)]

use std::sync::Arc;

use epp_core::{
    BuildError, Candidate, CycleContext, Endpoint, EndpointMetrics, ExtractError, Extractor,
    Plugin, PluginSpec, Registry, Scorer,
};
use epp_promtext::{Selector, SelectorSet};

/// The hottest GPU of an endpoint, as last scraped (a typed attribute stored
/// with [`EndpointMetrics::insert_extension`]). `None` when the page had no
/// such gauge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTemperature {
    /// Degrees Celsius.
    pub hottest_celsius: Option<f64>,
}

/// Parameters of [`GpuTemperatureExtractor`].
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuTemperatureParams {
    /// The gauge, optionally with label matchers (`name{gpu="0"}`).
    #[serde(default = "default_metric")]
    pub metric_name: String,
}

fn default_metric() -> String {
    "gpu_temperature_celsius".to_owned()
}

/// `gpu-temperature-extractor`: the hottest of the selected series.
#[derive(Debug)]
pub struct GpuTemperatureExtractor {
    name: String,
    set: SelectorSet,
}

impl GpuTemperatureExtractor {
    /// YAML type.
    pub const TYPE: &'static str = "gpu-temperature-extractor";

    /// Builds from a config entry.
    ///
    /// # Errors
    /// An unparsable `metricName`.
    pub fn from_spec(spec: &PluginSpec) -> Result<Self, BuildError> {
        let params: GpuTemperatureParams = spec.params()?;
        let selector = Selector::parse(&params.metric_name)
            .map_err(|e| spec.invalid("metricName", &params.metric_name, &e.to_string()))?;
        Ok(Self {
            name: spec.name.clone(),
            set: SelectorSet::new(vec![selector]),
        })
    }
}

impl Plugin for GpuTemperatureExtractor {
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

impl Extractor for GpuTemperatureExtractor {
    fn extract(
        &self,
        _endpoint: &Endpoint,
        page: &str,
        metrics: &mut EndpointMetrics,
    ) -> Result<(), ExtractError> {
        let mut hottest: Option<f64> = None;
        self.set.scan(page, |_, sample| {
            if sample.value.is_finite() {
                hottest = Some(hottest.map_or(sample.value, |h| h.max(sample.value)));
            }
        });
        metrics.insert_extension(GpuTemperature {
            hottest_celsius: hottest,
        });
        Ok(())
    }
}

/// Parameters of [`CoolGpuScorer`].
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CoolGpuParams {
    /// At or below this, score 1. Default 40.
    #[serde(default = "default_cool")]
    pub cool_celsius: f64,
    /// At or above this, score 0. Default 90.
    #[serde(default = "default_hot")]
    pub hot_celsius: f64,
}

fn default_cool() -> f64 {
    40.0
}
fn default_hot() -> f64 {
    90.0
}

/// `cool-gpu-scorer`: linear from 1 (cool) to 0 (hot); an endpoint without a
/// temperature scores 0.
#[derive(Debug)]
pub struct CoolGpuScorer {
    name: String,
    params: CoolGpuParams,
}

impl CoolGpuScorer {
    /// YAML type.
    pub const TYPE: &'static str = "cool-gpu-scorer";

    /// Builds from a config entry.
    ///
    /// # Errors
    /// `hotCelsius` not above `coolCelsius`.
    pub fn from_spec(spec: &PluginSpec) -> Result<Self, BuildError> {
        let params: CoolGpuParams = spec.params()?;
        if params.hot_celsius.partial_cmp(&params.cool_celsius) != Some(std::cmp::Ordering::Greater)
        {
            return Err(spec.invalid(
                "hotCelsius",
                params.hot_celsius,
                "must be above coolCelsius",
            ));
        }
        Ok(Self {
            name: spec.name.clone(),
            params,
        })
    }
}

impl Plugin for CoolGpuScorer {
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

impl Scorer for CoolGpuScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let (cool, hot) = (self.params.cool_celsius, self.params.hot_celsius);
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = match c
                .metrics
                .extension::<GpuTemperature>()
                .and_then(|t| t.hottest_celsius)
            {
                Some(t) => (1.0 - (t - cool) / (hot - cool)).clamp(0.0, 1.0),
                None => 0.0,
            };
        }
    }
}

/// Registers `gpu-temperature-extractor` and `cool-gpu-scorer`.
pub fn register(registry: &mut Registry) {
    registry.register(GpuTemperatureExtractor::TYPE, |spec| {
        Ok(Arc::new(GpuTemperatureExtractor::from_spec(spec)?))
    });
    registry.register(CoolGpuScorer::TYPE, |spec| {
        Ok(Arc::new(CoolGpuScorer::from_spec(spec)?))
    });
}
