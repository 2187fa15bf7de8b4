//! Data-layer roles: where metrics come from and how a page becomes
//! [`EndpointMetrics`]. The data layer runs the I/O; these traits stay
//! synchronous so extractors are easy to write and test.

use std::{fmt, time::Duration};

use crate::{Endpoint, EndpointMetrics, Plugin};

/// An HTTP metrics endpoint on each model server (`scheme://ip:port/path`).
pub trait MetricsSource: Plugin {
    /// `http` or `https`.
    fn scheme(&self) -> &str;
    /// Path of the metrics page, e.g. `/metrics`.
    fn path(&self) -> &str;
    /// Accept any TLS certificate (self-signed model servers).
    fn insecure_skip_verify(&self) -> bool;

    /// The port to scrape instead of the endpoint's own, for an exporter
    /// beside the model server (DCGM's 9400). Default: the endpoint's port.
    fn port(&self) -> Option<u16> {
        None
    }

    /// How often to scrape this source, rounded to the nearest multiple of
    /// the data layer's refresh interval (at least one), as llm-d rounds
    /// it. Default: every refresh.
    fn interval(&self) -> Option<Duration> {
        None
    }

    /// PEM files for HTTPS: a CA bundle verifying the server, and a client
    /// certificate and key (mutual TLS). Default: none (the system roots).
    fn tls_files(&self) -> TlsFiles<'_> {
        TlsFiles::default()
    }

    /// Whether the endpoint's metrics are fresh only when this source
    /// succeeded. `false` for a hardware exporter beside the model server:
    /// where it is absent (no GPU), the model server's own metrics must not
    /// look stale. Default `true`.
    fn counts_for_freshness(&self) -> bool {
        true
    }
}

/// PEM file paths of a metrics source's TLS settings
/// ([`MetricsSource::tls_files`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlsFiles<'a> {
    /// CA bundle that verifies the server's certificate.
    pub ca_cert: Option<&'a str>,
    /// Client certificate chain presented to the server.
    pub client_cert: Option<&'a str>,
    /// The client certificate's private key.
    pub client_key: Option<&'a str>,
}

/// Turns one scraped page into attributes of one endpoint.
///
/// Called on every successful scrape (20 times a second per endpoint by
/// default): implementations should scan selectively (see
/// `epp_promtext::SelectorSet`) and must not block.
pub trait Extractor: Plugin {
    /// Reads `page` (scraped from `endpoint`) into `metrics`, which holds the
    /// endpoint's previous values (so several sources can each fill their
    /// part): overwrite every field this extractor owns, and remove what the
    /// page no longer has.
    ///
    /// # Errors
    /// When the page lacks what the extractor needs or cannot be read; the
    /// data layer counts and logs it (once per change), and keeps the
    /// endpoint's previous metrics.
    fn extract(
        &self,
        endpoint: &Endpoint,
        page: &str,
        metrics: &mut EndpointMetrics,
    ) -> Result<(), ExtractError>;

    /// The keys this extractor fills in [`EndpointMetrics::custom`]:
    /// `Some` of exactly those (empty: none), or `None` when it cannot say
    /// (config loading then assumes it may fill any). Config loading refuses
    /// a plugin that reads a custom metric
    /// ([`Plugin::reads_custom_metric`]) no extractor fills.
    fn custom_metrics(&self) -> Option<&[String]> {
        None
    }
}

/// Why a page could not be extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractError(pub String);

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExtractError {}

/// Where endpoints come from when a config names a discovery plugin
/// (llm-d's `dataLayer.discovery`): it replaces Kubernetes discovery. The
/// binary starts the discovery the plugin describes.
pub trait EndpointDiscovery: Plugin {
    /// The endpoints file to read and follow (llm-d's `file-discovery`).
    fn endpoints_file(&self) -> Option<&std::path::Path>;
}
