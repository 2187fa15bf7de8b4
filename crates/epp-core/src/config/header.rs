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
            let (name, value) = split_gate(gate);
            if !FEATURE_GATES.contains(&name) {
                return Err(self.err(
                    format!("featureGates[{i}]"),
                    format!("unknown feature gate {name:?}, known: {FEATURE_GATES:?}"),
                ));
            }
            if let Some(v) = value
                && go_bool(v).is_none()
            {
                return Err(self.err(
                    format!("featureGates[{i}]"),
                    format!("{v:?} is not a value for feature gate {name:?} (true or false)"),
                ));
            }
        }
        Ok(())
    }

    /// The feature gates that are on: each entry is `name` (on) or
    /// `name=true|false` as in llm-d, the last entry for a name wins, and a
    /// gate not written is off (every gate here defaults to off).
    pub(super) fn enabled_gates(&self) -> Vec<String> {
        let mut on: Vec<String> = Vec::new();
        for gate in &self.raw.feature_gates {
            let (name, value) = split_gate(gate);
            on.retain(|g| g != name);
            if value.and_then(go_bool).unwrap_or(true) {
                on.push(name.to_owned());
            }
        }
        on
    }
}

/// `name` or `name=value`.
fn split_gate(gate: &str) -> (&str, Option<&str>) {
    match gate.split_once('=') {
        Some((name, value)) => (name.trim(), Some(value.trim())),
        None => (gate.trim(), None),
    }
}

/// Go's `strconv.ParseBool` of the lower-cased value, as llm-d reads a
/// gate's value.
fn go_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" => Some(true),
        "0" | "f" | "false" => Some(false),
        _ => None,
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
