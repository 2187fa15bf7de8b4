//! `file-discovery` (llm-d's): endpoints from a YAML file, named by
//! `dataLayer.discovery`, in place of Kubernetes discovery.
//!
//! The file is llm-d's shape, `{endpoints: [{name, namespace, address, port,
//! labels}]}` (port a string or a number), or this picker's own list of
//! `{address, port, labels}` ([`crate::parse_endpoints_file`] reads both).
//! The `epp` binary watches it as it watches `--endpoints-file`: a change is
//! applied once read twice the same, a file that becomes unreadable or
//! invalid keeps the last good endpoints. llm-d's `watchFile: false` (read
//! once) is accepted; here the file is always followed.

use std::path::{Path, PathBuf};

use epp_core::{BuildError, EndpointDiscovery, Plugin};

/// Parameters of `file-discovery` (llm-d's names).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileDiscoveryParams {
    /// The endpoints file (required).
    #[serde(default)]
    pub path: String,
    /// llm-d: follow changes (default false there). Accepted; changes are
    /// always followed here.
    #[serde(default)]
    pub watch_file: bool,
}

/// `file-discovery`: see the module docs.
#[derive(Debug, Clone)]
pub struct FileDiscoveryPlugin {
    name: String,
    path: PathBuf,
}

impl FileDiscoveryPlugin {
    /// YAML type.
    pub const TYPE: &'static str = "file-discovery";

    /// A plugin named `name`.
    ///
    /// # Errors
    /// No `path` (llm-d requires it too).
    pub fn new(name: impl Into<String>, params: FileDiscoveryParams) -> Result<Self, BuildError> {
        let name = name.into();
        if params.path.is_empty() {
            return Err(BuildError::InvalidValue {
                plugin: name,
                field: "path".into(),
                value: String::new(),
                reason: "required".into(),
            });
        }
        Ok(Self {
            name,
            path: PathBuf::from(params.path),
        })
    }
}

impl Plugin for FileDiscoveryPlugin {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_endpoint_discovery(&self) -> Option<&dyn EndpointDiscovery> {
        Some(self)
    }
}

impl EndpointDiscovery for FileDiscoveryPlugin {
    fn endpoints_file(&self) -> Option<&Path> {
        Some(&self.path)
    }
}
