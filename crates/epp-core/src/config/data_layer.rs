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
        let mut layer = layer;
        if self.raw.data_layer.is_some() || self.raw.data.is_some() {
            self.check_data_layer_refs(wiring, &layer, key)?;
            if layer.inject_defaults != Some(false) {
                self.inject_default_source(registry, wiring, &mut layer)?;
            }
        }
        let mut data_layer = Vec::new();
        for (si, s) in layer.sources.iter().enumerate() {
            let at = format!("{key}.sources[{si}]");
            let source = self.referenced_as(
                wiring,
                &format!("{at}.pluginRef"),
                &s.plugin_ref,
                "a data source",
                |p| p.as_metrics_source().is_some() || p.as_notification_source().is_some(),
            )?;
            let events = source.plugin().as_notification_source().is_some();
            let (role, plays): (&str, fn(&dyn crate::Plugin) -> bool) = if events {
                (
                    "a KV-event consumer (the source delivers engine events)",
                    |p| p.as_kv_event_sink().is_some() || p.follows_endpoint_lifecycle(),
                )
            } else {
                ("an extractor", |p| p.as_extractor().is_some())
            };
            let extractors: Vec<crate::PluginRef> = s
                .extractors
                .iter()
                .enumerate()
                .map(|(ei, e)| {
                    self.referenced_as(
                        wiring,
                        &format!("{at}.extractors[{ei}].pluginRef"),
                        &e.plugin_ref,
                        role,
                        plays,
                    )
                })
                .collect::<Result<_, _>>()?;
            // Endpoint-lifecycle listeners need nothing delivered: only the
            // KV-event consumers are fed.
            let extractors = extractors
                .into_iter()
                .filter(|p| !events || p.plugin().as_kv_event_sink().is_some())
                .collect();
            data_layer.push(SourceWiring { source, extractors });
        }
        self.wire_kv_event_sinks(registry, wiring, &mut layer, &mut data_layer)?;
        wiring.effective.data = None;
        wiring.effective.data_layer = Some(layer);
        Ok(data_layer)
    }

    /// A declared KV-event consumer no source feeds (llm-d's configs that
    /// predate `endpoint-notification-source` declare only the producer)
    /// gets the registry's default notification source, as llm-d starts its
    /// subscribers itself; without such a default it would never see an
    /// event, which is an error.
    fn wire_kv_event_sinks(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
        layer: &mut DataLayerDecl,
        data_layer: &mut Vec<SourceWiring>,
    ) -> Result<(), ConfigError> {
        let fed = |name: &str, data_layer: &[SourceWiring]| {
            data_layer
                .iter()
                .filter(|s| s.source.plugin().as_notification_source().is_some())
                .flat_map(|s| &s.extractors)
                .any(|e| e.plugin().name() == name)
        };
        let unfed: Vec<(usize, String, crate::PluginRef)> = wiring
            .plugins
            .iter()
            .enumerate()
            .filter(|(_, (name, p))| {
                p.plugin().as_kv_event_sink().is_some() && !fed(name, data_layer)
            })
            .map(|(i, (name, p))| (i, name.clone(), p.clone()))
            .collect();
        if unfed.is_empty() {
            return Ok(());
        }
        let Some(source) = self.default_plugin(registry, Role::NotificationSource, wiring)? else {
            let (i, name, _) = &unfed[0];
            return Err(self.err(
                format!("plugins[{i}]"),
                format!(
                    "plugin {name:?} consumes KV-cache events, but no data source delivers \
                     them and this build has no default event source"
                ),
            ));
        };
        layer.sources.push(SourceDecl {
            plugin_ref: source.plugin().name().to_owned(),
            extractors: unfed
                .iter()
                .map(|(_, name, _)| PluginRefDecl {
                    plugin_ref: name.clone(),
                })
                .collect(),
        });
        data_layer.push(SourceWiring {
            source,
            extractors: unfed.into_iter().map(|(_, _, p)| p).collect(),
        });
        Ok(())
    }

    /// Every custom metric a plugin reads must be filled by an extractor of
    /// the data layer (seed 000: the names must match); otherwise the plugin
    /// would load and read nothing, for ever. Without any extractor the
    /// metrics come from elsewhere (an embedding application sets them), so
    /// nothing is checked.
    pub(super) fn check_custom_metrics(
        &self,
        wiring: &Wiring,
        data_layer: &[SourceWiring],
    ) -> Result<(), ConfigError> {
        let metrics = || {
            data_layer
                .iter()
                .filter(|s| s.source.plugin().as_metrics_source().is_some())
        };
        if metrics().all(|s| s.extractors.is_empty()) {
            return Ok(());
        }
        let mut filled: Vec<&str> = Vec::new();
        for p in metrics().flat_map(|s| &s.extractors) {
            match p
                .plugin()
                .as_extractor()
                .map(crate::Extractor::custom_metrics)
            {
                Some(Some(keys)) => filled.extend(keys.iter().map(String::as_str)),
                // An extractor that cannot say what it fills may fill anything.
                _ => return Ok(()),
            }
        }
        for (i, (name, p)) in wiring.plugins.iter().enumerate() {
            let Some(key) = p.plugin().reads_custom_metric() else {
                continue;
            };
            if filled.contains(&key) {
                continue;
            }
            let field = if self
                .raw
                .plugins
                .get(i)
                .is_some_and(|d| d.parameters.is_some())
            {
                format!("plugins[{i}].parameters")
            } else {
                format!("plugins[{i}]")
            };
            let have = if filled.is_empty() {
                "the data layer's extractors fill no custom metric".to_owned()
            } else {
                format!("the data layer's extractors fill {filled:?}")
            };
            return Err(self.err(
                field,
                format!(
                    "plugin {name:?} ({}) reads the metric {key:?}, which no extractor of the \
                     data layer fills ({have}); add an extractor for it (a `prometheus-metric` \
                     extractor with `metricName: {key}`) to a data source",
                    p.plugin().type_name()
                ),
            ));
        }
        Ok(())
    }

    /// llm-d's `injectDefaults` (true unless written `false`): a data layer
    /// that lists no source of the registry's default source type
    /// (`metrics-data-source`) gets that source feeding the default
    /// extractor (`core-metrics-extractor`) as well, so listing, say, only a
    /// GPU exporter's source does not leave the model servers unscraped.
    fn inject_default_source(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
        layer: &mut DataLayerDecl,
    ) -> Result<(), ConfigError> {
        let Some(source_type) = registry.default_type(Role::MetricsSource) else {
            return Ok(());
        };
        let listed = layer.sources.iter().any(|s| {
            wiring
                .find(&s.plugin_ref)
                .is_some_and(|p| p.plugin().type_name() == source_type)
        });
        if listed {
            return Ok(());
        }
        let mut defaults = self.default_data_layer(registry, wiring)?;
        layer.sources.append(&mut defaults.sources);
        Ok(())
    }

    /// llm-d's `discovery`, `peerDiscovery` and `crossReplicaSyncerPluginRef`
    /// name declared plugins; a dangling name is an error, as everywhere.
    fn check_data_layer_refs(
        &self,
        wiring: &Wiring,
        layer: &DataLayerDecl,
        key: &str,
    ) -> Result<(), ConfigError> {
        let refs = [
            (
                "discovery.pluginRef",
                layer.discovery.as_ref().map(|d| &d.plugin_ref),
            ),
            (
                "peerDiscovery.pluginRef",
                layer.peer_discovery.as_ref().map(|d| &d.plugin_ref),
            ),
            (
                "crossReplicaSyncerPluginRef",
                layer.cross_replica_syncer_plugin_ref.as_ref(),
            ),
        ];
        for (field, name) in refs {
            if let Some(name) = name {
                self.referenced(wiring, &format!("{key}.{field}"), name)?;
            }
        }
        if let Some(d) = &layer.discovery {
            self.referenced_as(
                wiring,
                &format!("{key}.discovery.pluginRef"),
                &d.plugin_ref,
                "an endpoint-discovery plugin",
                |p| p.as_endpoint_discovery().is_some(),
            )?;
        }
        if let Some(d) = &layer.peer_discovery {
            self.referenced_as(
                wiring,
                &format!("{key}.peerDiscovery.pluginRef"),
                &d.plugin_ref,
                "a peer-discovery plugin",
                |p| p.as_peer_discovery().is_some(),
            )?;
        }
        if let Some(name) = &layer.cross_replica_syncer_plugin_ref {
            self.referenced_as(
                wiring,
                &format!("{key}.crossReplicaSyncerPluginRef"),
                name,
                "a cross-replica syncer",
                |p| p.as_replica_syncer().is_some(),
            )?;
        }
        if let Some(d) = &layer.cross_replica_sync_interval {
            match super::parse_duration(d) {
                Some(i) if !i.is_zero() => {}
                _ => {
                    return Err(self.err(
                        format!("{key}.crossReplicaSyncInterval"),
                        format!("{d:?} is not a positive duration (e.g. 200ms, 1s)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The cross-replica syncer `dataLayer.crossReplicaSyncerPluginRef`
    /// names, with the peer discovery and interval that go with it (checked
    /// by [`Self::build_data_layer`]).
    pub(super) fn replicas(&self, wiring: &Wiring) -> Option<crate::replicas::ReplicaSync> {
        let layer = self.raw.data_layer.as_ref().or(self.raw.data.as_ref())?;
        let syncer = wiring.find(layer.cross_replica_syncer_plugin_ref.as_ref()?)?;
        let peers = layer
            .peer_discovery
            .as_ref()
            .and_then(|d| wiring.find(&d.plugin_ref));
        let interval = layer
            .cross_replica_sync_interval
            .as_deref()
            .and_then(super::parse_duration)
            .unwrap_or(crate::replicas::DEFAULT_SYNC_INTERVAL);
        Some(crate::replicas::ReplicaSync {
            syncer,
            peers,
            interval,
        })
    }

    /// The discovery plugin `dataLayer.discovery` names (checked by
    /// [`Self::build_data_layer`]).
    pub(super) fn discovery(&self, wiring: &Wiring) -> Option<crate::PluginRef> {
        let layer = self.raw.data_layer.as_ref().or(self.raw.data.as_ref())?;
        wiring.find(&layer.discovery.as_ref()?.plugin_ref)
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
                ..DataLayerDecl::default()
            },
            _ => DataLayerDecl::default(),
        })
    }
}
