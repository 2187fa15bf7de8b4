//! The data layer of the epp-rs endpoint picker: the endpoint set, discovery
//! (a static list, a watched file or a Kubernetes InferencePool — see
//! [`kubernetes`] — behind the [`Discovery`] trait), and
//! scrapers that keep each endpoint's metrics fresh — and honest about their
//! age — through pluggable extractors.
//!
//! - [`EndpointStore`]: the endpoint set; discovery sources replace their own
//!   part, readers get an immutable snapshot without locking
//!   ([`epp_core::EndpointSource`]). Ids are dense and never reused for
//!   another address.
//! - [`DataLayer::start`]: one task per endpoint scraping each configured
//!   source (`metrics-data-source`) every refresh interval over a kept-alive
//!   HTTP or HTTPS connection, with a per-scrape deadline and a page-size cap,
//!   then running the source's extractors. A failed scrape keeps the previous
//!   values and their age; [`DataLayer::status`] and
//!   [`DataLayer::register_metrics`] expose counters and the current error.
//! - [`register`]: the plugin types `metrics-data-source`,
//!   `core-metrics-extractor` (every engine of the reference table) and
//!   `prometheus-metric`.
//!
//! ```
//! use std::sync::Arc;
//! use epp_core::EndpointSource;
//! use epp_datalayer::{
//!     DataLayer, DataLayerOptions, Discovery, EndpointStore, StaticDiscovery, default_source_wiring,
//! };
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Arc::new(EndpointStore::new());
//! let stop = CancellationToken::new();
//! StaticDiscovery::parse(&["127.0.0.1:9,127.0.0.1:10"])
//!     .unwrap()
//!     .start(Arc::clone(&store), stop.clone())
//!     .unwrap();
//! assert_eq!(store.snapshot().len(), 2);
//!
//! let layer = DataLayer::start(
//!     Arc::clone(&store),
//!     &[default_source_wiring()],
//!     DataLayerOptions::default(),
//!     stop.clone(),
//! )
//! .unwrap();
//! assert_eq!(layer.status().len(), 2);
//! layer.stop().await;
//! # }
//! ```
#![warn(missing_docs)]

mod client;
mod core_metrics_extractor;
mod data_layer;
mod dcgm;
mod discovery;
mod error;
mod file_discovery_plugin;
pub mod kubernetes;
pub mod kv_events;
mod prometheus_metric;
mod redis_index;
mod render;
mod replicas;
mod scrape;
mod source;
mod status;
mod store;

use std::sync::Arc;

use epp_core::{PluginRef, PluginSpec, Registry, Role, config::SourceWiring};

pub use core_metrics_extractor::{
    CoreMetricsExtractor, CoreMetricsParams, DEFAULT_ENGINE, ENGINE_LABELS, EngineConfig,
    builtin_engine,
};
pub use data_layer::DataLayer;
pub use dcgm::{
    DcgmDataSource, DcgmDataSourceParams, DcgmExtractor, GPU_UTIL_METRIC, GPU_UTILIZATION,
};
pub use discovery::{Discovery, FileDiscovery, StaticDiscovery, parse_endpoints_file};
pub use error::{Error, Result};
pub use file_discovery_plugin::{FileDiscoveryParams, FileDiscoveryPlugin};
pub use prometheus_metric::{PrometheusMetricExtractor, PrometheusMetricParams};
pub use redis_index::RedisBlockIndex;
pub use render::VllmRenderer;
pub use replicas::{
    LocalSyncer, MAX_PICK_KEYS, PeerSync, RESOLVE_EVERY, StaticPeerDiscovery,
    StaticPeerDiscoveryParams, UdpPeerSyncer, UdpPeerSyncerParams, WireError,
};
pub use scrape::DataLayerOptions;
pub use source::{MetricsDataSource, MetricsDataSourceParams};
pub use status::ScrapeStatus;
pub use store::{EndpointSpec, EndpointStore, parse_endpoint_list};

/// Registers the data layer's plugin types: `metrics-data-source`,
/// `core-metrics-extractor`, `prometheus-metric`, `dcgm-data-source`,
/// `dcgm-extractor`, `file-discovery`, `endpoint-notification-source`,
/// `udp-peer-syncer`, `local-syncer`, `static-peer-discovery`; the first two are the
/// defaults for [`Role::MetricsSource`] and [`Role::MetricsExtractor`] (the
/// data layer a config gets when it names none).
pub fn register(registry: &mut Registry) {
    registry
        .set_default(Role::MetricsSource, MetricsDataSource::TYPE)
        .set_default(Role::MetricsExtractor, CoreMetricsExtractor::TYPE);
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
    registry.set_default(
        Role::NotificationSource,
        kv_events::EndpointNotificationSource::TYPE,
    );
    registry.register(
        kv_events::EndpointNotificationSource::TYPE,
        |spec: &PluginSpec| {
            /// No parameters.
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct NoParams {}
            let NoParams {} = spec.params()?;
            Ok(Arc::new(kv_events::EndpointNotificationSource::new(
                spec.name.clone(),
            )))
        },
    );
    registry.register(FileDiscoveryPlugin::TYPE, |spec: &PluginSpec| {
        Ok(Arc::new(FileDiscoveryPlugin::new(
            spec.name.clone(),
            spec.params()?,
        )?))
    });
    registry.register(DcgmDataSource::TYPE, |spec: &PluginSpec| {
        Ok(Arc::new(DcgmDataSource::new(
            spec.name.clone(),
            spec.params()?,
        )?))
    });
    registry.register(DcgmExtractor::TYPE, |spec: &PluginSpec| {
        /// No parameters.
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoParams {}
        let NoParams {} = spec.params()?;
        Ok(Arc::new(DcgmExtractor::new(spec.name.clone())))
    });
    registry.register(replicas::UdpPeerSyncer::TYPE, |spec: &PluginSpec| {
        Ok(Arc::new(replicas::UdpPeerSyncer::new(
            spec.name.clone(),
            &spec.params()?,
        )?))
    });
    registry.register(replicas::LocalSyncer::TYPE, |spec: &PluginSpec| {
        /// No parameters (llm-d's takes none).
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoParams {}
        let NoParams {} = spec.params()?;
        Ok(Arc::new(replicas::LocalSyncer::new(spec.name.clone())))
    });
    registry.register(replicas::StaticPeerDiscovery::TYPE, |spec: &PluginSpec| {
        Ok(Arc::new(replicas::StaticPeerDiscovery::new(
            spec.name.clone(),
            spec.params()?,
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
