//! The request parsers: llm-d's `requestHandler.parsers` wins over the older
//! `parser`; when neither is given, the registry's default parser (if any).

use super::{ConfigError, EndpointPickerConfig, Wiring, raw::PluginRefDecl};
use crate::{Registry, Role};

impl EndpointPickerConfig {
    /// Checks that every referenced parser is declared, or adds the default
    /// one to the effective config.
    pub(super) fn check_parsers(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<(), ConfigError> {
        let raw = &self.raw;
        let parser_refs: Vec<(String, &PluginRefDecl)> = match &raw.request_handler {
            Some(h) if !h.parsers.is_empty() => h
                .parsers
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("requestHandler.parsers[{i}].pluginRef"), r))
                .collect(),
            _ => raw
                .parser
                .iter()
                .map(|r| ("parser.pluginRef".to_owned(), r))
                .collect(),
        };
        if parser_refs.is_empty() {
            if let Some(p) = self.default_plugin(registry, Role::Parser, wiring)? {
                wiring.effective.parser = Some(PluginRefDecl {
                    plugin_ref: p.plugin().name().to_owned(),
                });
            }
            return Ok(());
        }
        for (field, r) in &parser_refs {
            self.referenced(wiring, field, &r.plugin_ref)?;
        }
        Ok(())
    }
}
