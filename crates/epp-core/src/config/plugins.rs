//! Every declared plugin, built by the registry and named (the name defaults
//! to the type; names are unique).

use super::{ConfigError, EndpointPickerConfig, Wiring};
use crate::{BuildError, PluginRef, PluginSpec, Registry};

impl EndpointPickerConfig {
    /// Builds the `plugins:` list in order; the effective config names each.
    pub(super) fn build_plugins(&self, registry: &Registry) -> Result<Wiring, ConfigError> {
        let mut effective = self.raw.clone();
        let mut plugins: Vec<(String, PluginRef)> = Vec::new();
        for (i, d) in effective.plugins.iter_mut().enumerate() {
            let name = d.name.clone().unwrap_or_else(|| d.type_name.clone());
            d.name = Some(name.clone());
            if plugins.iter().any(|(n, _)| *n == name) {
                let field = if self.raw.plugins[i].name.is_some() {
                    "name"
                } else {
                    "type"
                };
                return Err(self.err(
                    format!("plugins[{i}].{field}"),
                    format!("duplicate plugin name {name:?}"),
                ));
            }
            let spec = PluginSpec {
                type_name: d.type_name.clone(),
                name: name.clone(),
                parameters: d.parameters.clone().unwrap_or(serde_yaml_ng::Value::Null),
            };
            let plugin = registry
                .build(&spec)
                .map_err(|e| self.plugin_error(i, &d.type_name, &e))?;
            plugins.push((name, PluginRef::new(plugin)));
        }
        Ok(Wiring { plugins, effective })
    }

    /// Where and why `plugins[i]` (of `type_name`) could not be built.
    fn plugin_error(&self, i: usize, type_name: &str, e: &BuildError) -> ConfigError {
        let field = match e {
            BuildError::UnknownType { .. } => format!("plugins[{i}].type"),
            BuildError::InvalidValue { field, .. } => format!("plugins[{i}].parameters.{field}"),
            _ => format!("plugins[{i}].parameters"),
        };
        let message = match e {
            BuildError::Parameters { reason, .. } => {
                format!("bad parameters for {type_name:?}: {reason}")
            }
            BuildError::InvalidValue { value, reason, .. } => format!("{value}: {reason}"),
            other => other.to_string(),
        };
        self.err(field, message)
    }
}
