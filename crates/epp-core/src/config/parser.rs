//! The request parsers: llm-d's `requestHandler.parsers` wins over the older
//! `parser`; when neither is given, the registry's default parser (if any).

use super::{ConfigError, EndpointPickerConfig, Wiring, raw::PluginRefDecl};
use crate::{Registry, RequestParsers, Role};

impl EndpointPickerConfig {
    /// Checks that every referenced parser is declared, or adds the default
    /// one to the effective config; returns what the parsers claim.
    ///
    /// `requestHandler.parsers` is used as given (llm-d): their claims, and
    /// a fallback only if a parser that claims nothing (`passthrough-parser`)
    /// is listed; parsers after that one are never reached, which is an
    /// error. The older single `parser:` and no parser at all read llm-d's
    /// default list ([`RequestParsers::default`]).
    pub(super) fn check_parsers(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<RequestParsers, ConfigError> {
        let explicit = matches!(&self.raw.request_handler, Some(h) if !h.parsers.is_empty());
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
            return Ok(RequestParsers::default());
        }
        let mut parsers = RequestParsers {
            kinds: Vec::new(),
            fallback: false,
        };
        for (field, r) in &parser_refs {
            let p = self.referenced_as(wiring, field, &r.plugin_ref, "a request parser", |p| {
                p.as_request_parser().is_some()
            })?;
            if parsers.fallback {
                return Err(self.err(
                    field,
                    "comes after a parser that claims every path (passthrough-parser): it would \
                     never be used; list the fallback last",
                ));
            }
            let claims = p
                .plugin()
                .as_request_parser()
                .map_or(&[][..], |rp| rp.claims());
            if claims.is_empty() {
                parsers.fallback = true;
            }
            for &k in claims {
                if !parsers.kinds.contains(&k) {
                    parsers.kinds.push(k);
                }
            }
        }
        if !explicit {
            return Ok(RequestParsers::default());
        }
        Ok(parsers)
    }
}
