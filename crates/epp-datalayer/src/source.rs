//! `metrics-data-source`: where each endpoint's metrics page is.

use std::time::Duration;

use epp_core::{BuildError, MetricsSource, Plugin, TlsFiles};

/// Parameters.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsDataSourceParams {
    /// `http` (default) or `https`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Path of the page. Default `/metrics`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Accept any TLS certificate.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// llm-d: scrape this port instead of the endpoint's (1–65535).
    #[serde(default)]
    pub port: Option<u32>,
    /// llm-d: how often to scrape, a Go duration (`1s`), rounded to the
    /// nearest multiple of `--refresh-metrics-interval`. Default: every
    /// refresh.
    #[serde(default)]
    pub interval: Option<String>,
    /// llm-d: PEM CA bundle verifying the server (HTTPS).
    #[serde(default)]
    pub ca_cert_path: Option<String>,
    /// llm-d: PEM client certificate for mutual TLS (with `clientKeyPath`).
    #[serde(default)]
    pub client_cert_path: Option<String>,
    /// llm-d: PEM key of the client certificate (with `clientCertPath`).
    #[serde(default)]
    pub client_key_path: Option<String>,
}

fn default_scheme() -> String {
    "http".into()
}
fn default_path() -> String {
    "/metrics".into()
}

impl Default for MetricsDataSourceParams {
    fn default() -> Self {
        Self {
            scheme: default_scheme(),
            path: default_path(),
            insecure_skip_verify: false,
            port: None,
            interval: None,
            ca_cert_path: None,
            client_cert_path: None,
            client_key_path: None,
        }
    }
}

/// `metrics-data-source`.
#[derive(Debug, Clone)]
pub struct MetricsDataSource {
    name: String,
    params: MetricsDataSourceParams,
    port: Option<u16>,
    interval: Option<Duration>,
}

/// Checks the `scheme` (`http` or `https`), `path` (starting with `/`) and
/// llm-d's `port`, `interval` and certificate paths of an HTTP source named
/// `plugin`; returns the port and interval.
pub(crate) fn http_options(
    plugin: &str,
    scheme: &str,
    path: &str,
    port: Option<u32>,
    interval: Option<&str>,
    client_cert: Option<&str>,
    client_key: Option<&str>,
) -> Result<(Option<u16>, Option<Duration>), BuildError> {
    let bad = |field: &str, value: &str, reason: &str| BuildError::InvalidValue {
        plugin: plugin.to_owned(),
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    };
    if !matches!(scheme, "http" | "https") {
        return Err(bad("scheme", scheme, "must be http or https"));
    }
    if !path.starts_with('/') {
        return Err(bad("path", path, "must start with /"));
    }
    let port = port
        .map(|p| {
            u16::try_from(p)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| bad("port", &p.to_string(), "must be between 1 and 65535"))
        })
        .transpose()?;
    let interval = interval
        .filter(|i| !i.is_empty())
        .map(|i| {
            epp_core::config::parse_duration(i)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| bad("interval", i, "must be a positive Go duration, e.g. 1s"))
        })
        .transpose()?;
    match (client_cert, client_key) {
        (Some(_), None) => {
            return Err(bad("clientKeyPath", "", "give it with clientCertPath"));
        }
        (None, Some(_)) => {
            return Err(bad("clientCertPath", "", "give it with clientKeyPath"));
        }
        _ => {}
    }
    Ok((port, interval))
}

impl MetricsDataSource {
    /// YAML type.
    pub const TYPE: &'static str = "metrics-data-source";

    /// A source named `name`.
    ///
    /// # Errors
    /// A scheme other than `http` or `https`, or a path not starting with `/`.
    pub fn new(
        name: impl Into<String>,
        params: MetricsDataSourceParams,
    ) -> Result<Self, BuildError> {
        let name = name.into();
        let bad = |field: &str, value: &str, reason: &str| BuildError::InvalidValue {
            plugin: name.clone(),
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        };
        let (port, interval) = http_options(
            &name,
            &params.scheme,
            &params.path,
            params.port,
            params.interval.as_deref(),
            params.client_cert_path.as_deref(),
            params.client_key_path.as_deref(),
        )?;
        let source = Self {
            name: name.clone(),
            params,
            port,
            interval,
        };
        // Read the PEM files now, so a bad path fails at load, naming it.
        let files = source.tls_files();
        if files != TlsFiles::default() {
            crate::client::Tls::with_files(files).map_err(|e| {
                let field = if e.starts_with("caCertPath") {
                    "caCertPath"
                } else {
                    "clientCertPath"
                };
                bad(field, "", &e)
            })?;
        }
        Ok(source)
    }
}

impl MetricsDataSource {
    /// A source from parameters known to be valid (the defaults).
    pub(crate) fn from_valid(name: &str, params: MetricsDataSourceParams) -> Self {
        Self {
            name: name.to_owned(),
            params,
            port: None,
            interval: None,
        }
    }
}

impl Plugin for MetricsDataSource {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_metrics_source(&self) -> Option<&dyn MetricsSource> {
        Some(self)
    }
}

impl MetricsSource for MetricsDataSource {
    fn scheme(&self) -> &str {
        &self.params.scheme
    }
    fn path(&self) -> &str {
        &self.params.path
    }
    fn insecure_skip_verify(&self) -> bool {
        self.params.insecure_skip_verify
    }
    fn port(&self) -> Option<u16> {
        self.port
    }
    fn interval(&self) -> Option<Duration> {
        self.interval
    }
    fn tls_files(&self) -> TlsFiles<'_> {
        TlsFiles {
            ca_cert: self.params.ca_cert_path.as_deref(),
            client_cert: self.params.client_cert_path.as_deref(),
            client_key: self.params.client_key_path.as_deref(),
        }
    }
}
