//! The config's header: `apiVersion`, `kind` and `featureGates` are checked
//! first, and written into the effective config last.

use super::{API_VERSIONS, ConfigError, EndpointPickerConfig, FEATURE_GATES, raw::RawConfig};

/// The only `kind` accepted.
const KIND: &str = "EndpointPickerConfig";

impl EndpointPickerConfig {
    /// A known `apiVersion` and `kind` when given, and known feature gates.
    pub(super) fn check_header(&self) -> Result<(), ConfigError> {
        let raw = &self.raw;
        if let Some(v) = &raw.api_version
            && !API_VERSIONS.contains(&v.as_str())
        {
            return Err(self.err(
                "apiVersion",
                format!("unsupported apiVersion {v:?}, expected one of {API_VERSIONS:?}"),
            ));
        }
        if let Some(k) = &raw.kind
            && k != KIND
        {
            return Err(self.err("kind", format!("kind must be {KIND}, not {k:?}")));
        }
        for (i, gate) in raw.feature_gates.iter().enumerate() {
            if !FEATURE_GATES.contains(&gate.as_str()) {
                return Err(self.err(
                    format!("featureGates[{i}]"),
                    format!("unknown feature gate {gate:?}, known: {FEATURE_GATES:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// The effective config as YAML, with `apiVersion` and `kind` filled in.
pub(super) fn render(mut effective: RawConfig) -> String {
    effective
        .api_version
        .get_or_insert_with(|| API_VERSIONS[0].to_owned());
    effective.kind.get_or_insert_with(|| KIND.to_owned());
    serde_yaml_ng::to_string(&effective).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}
