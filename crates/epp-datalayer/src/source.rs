//! `metrics-data-source`: where each endpoint's metrics page is.

use epp_core::{BuildError, MetricsSource, Plugin};

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
        }
    }
}

/// `metrics-data-source`.
#[derive(Debug, Clone)]
pub struct MetricsDataSource {
    name: String,
    params: MetricsDataSourceParams,
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
        match params.scheme.as_str() {
            "http" | "https" => {}
            other => return Err(bad("scheme", other, "must be http or https")),
        }
        if !params.path.starts_with('/') {
            return Err(bad("path", &params.path, "must start with /"));
        }
        Ok(Self { name, params })
    }
}

impl MetricsDataSource {
    /// A source from parameters known to be valid (the defaults).
    pub(crate) fn from_valid(name: &str, params: MetricsDataSourceParams) -> Self {
        Self {
            name: name.to_owned(),
            params,
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
}
