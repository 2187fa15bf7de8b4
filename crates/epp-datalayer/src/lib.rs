//! The data layer of the epp-rs endpoint picker: the endpoint set, discovery
//! (a static list or a watched file), and scrapers that keep each endpoint's
//! metrics fresh (and honest about their age) through pluggable extractors.
//!
//! ```
//! use std::sync::Arc;
//! use epp_core::EndpointSource;
//! use epp_datalayer::{EndpointStore, parse_endpoint_list};
//!
//! let store = Arc::new(EndpointStore::new());
//! store.replace_source("flag", parse_endpoint_list(&["10.0.0.1:8000", "10.0.0.2:8000"]).unwrap());
//! assert_eq!(store.snapshot().len(), 2);
//! ```
#![warn(missing_docs)]

mod client;
mod core_extractor;
mod discovery;
mod error;
mod prometheus_metric;
mod scrape;
mod source;
mod status;
mod store;

use std::sync::Arc;

use epp_core::{PluginRef, PluginSpec, Registry, config::SourceWiring};

pub use core_extractor::{
    CoreMetricsExtractor, CoreMetricsParams, DEFAULT_ENGINE, ENGINE_LABELS, EngineConfig,
};
pub use discovery::{Discovery, FileDiscovery, StaticDiscovery, parse_endpoints_file};
pub use error::{Error, Result};
pub use prometheus_metric::{PrometheusMetricExtractor, PrometheusMetricParams};
pub use scrape::{DataLayer, DataLayerOptions};
pub use source::{MetricsDataSource, MetricsDataSourceParams};
pub use status::ScrapeStatus;
pub use store::{EndpointSpec, EndpointStore, parse_endpoint_list};

/// Registers the data layer's plugin types: `metrics-data-source`,
/// `core-metrics-extractor`, `prometheus-metric`.
pub fn register(registry: &mut Registry) {
    registry.register(MetricsDataSource::TYPE, |spec: &PluginSpec| {
        Ok(Arc::new(MetricsDataSource::new(
            spec.name.clone(),
            spec.params()?,
        )?))
    });
    registry.register(CoreMetricsExtractor::TYPE, |spec: &PluginSpec| {
        let params: CoreMetricsParams = spec.params()?;
        Ok(Arc::new(CoreMetricsExtractor::new(
            spec.name.clone(),
            &params,
        )?))
    });
    registry.register(PrometheusMetricExtractor::TYPE, |spec: &PluginSpec| {
        Ok(Arc::new(PrometheusMetricExtractor::new(
            spec.name.clone(),
            spec.params()?,
        )?))
    });
}

/// The wiring used when a config names no data layer: `metrics-data-source`
/// (`http`, `/metrics`) feeding `core-metrics-extractor` with the built-in
/// engine table.
#[must_use]
pub fn default_source_wiring() -> SourceWiring {
    let source =
        MetricsDataSource::from_valid(MetricsDataSource::TYPE, MetricsDataSourceParams::default());
    let extractor = CoreMetricsExtractor::builtin(CoreMetricsExtractor::TYPE);
    SourceWiring {
        source: PluginRef::new(Arc::new(source)),
        extractors: vec![PluginRef::new(Arc::new(extractor))],
    }
}
