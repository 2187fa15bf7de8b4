//! The data layer (`dataLayer`, or `data` as the reference docs say): metrics
//! sources, each with its extractors. When neither key is given, the
//! registry's default source feeding its default extractor (none when either
//! default is missing).

use super::{
    ConfigError, EndpointPickerConfig, SourceWiring, Wiring,
    raw::{DataLayerDecl, PluginRefDecl, SourceDecl},
};
use crate::{Registry, Role};

impl EndpointPickerConfig {
    /// Resolves every source and extractor reference and checks each plays
    /// its role; the effective config gets the layer under `dataLayer`.
    pub(super) fn build_data_layer(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<Vec<SourceWiring>, ConfigError> {
        let (layer, key) = match (&self.raw.data_layer, &self.raw.data) {
            (Some(_), Some(_)) => {
                return Err(self.err("data", "give either `dataLayer` or `data`, not both"));
            }
            (Some(d), None) => (d.clone(), "dataLayer"),
            (None, Some(d)) => (d.clone(), "data"),
            (None, None) => (self.default_data_layer(registry, wiring)?, "dataLayer"),
        };
        let mut data_layer = Vec::new();
        for (si, s) in layer.sources.iter().enumerate() {
            let at = format!("{key}.sources[{si}]");
            let source = self.referenced_as(
                wiring,
                &format!("{at}.pluginRef"),
                &s.plugin_ref,
                "a data source",
                |p| p.as_metrics_source().is_some(),
            )?;
            let extractors = s
                .extractors
                .iter()
                .enumerate()
                .map(|(ei, e)| {
                    self.referenced_as(
                        wiring,
                        &format!("{at}.extractors[{ei}].pluginRef"),
                        &e.plugin_ref,
                        "an extractor",
                        |p| p.as_extractor().is_some(),
                    )
                })
                .collect::<Result<_, _>>()?;
            data_layer.push(SourceWiring { source, extractors });
        }
        wiring.effective.data = None;
        wiring.effective.data_layer = Some(layer);
        Ok(data_layer)
    }

    /// The registry's default source feeding its default extractor.
    fn default_data_layer(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<DataLayerDecl, ConfigError> {
        let source = self.default_plugin(registry, Role::MetricsSource, wiring)?;
        let extractor = self.default_plugin(registry, Role::MetricsExtractor, wiring)?;
        Ok(match (source, extractor) {
            (Some(s), Some(e)) => DataLayerDecl {
                sources: vec![SourceDecl {
                    plugin_ref: s.plugin().name().to_owned(),
                    extractors: vec![PluginRefDecl {
                        plugin_ref: e.plugin().name().to_owned(),
                    }],
                }],
            },
            _ => DataLayerDecl::default(),
        })
    }
}
