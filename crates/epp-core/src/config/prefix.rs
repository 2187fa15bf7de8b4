//! Wiring prefix-match readers to their producers (llm-d's
//! `prefixMatchInfoProducerName`).
//!
//! Every reader (`prefix-cache-scorer`, `no-hit-lru-scorer`,
//! `prefix-cache-affinity-filter`, …) names the producer it reads. Each
//! named producer must exist and produce prefix matches; the default name,
//! when no plugin has it, means a reader's own index (a `prefix-cache-scorer`
//! keeps one, as the reference picker's does) or else the registry's default
//! prefix-match producer created here under the default name, as llm-d
//! creates its `approx-prefix-cache-producer`.
//!
//! The producer the first reader names fills the cycle's first set of
//! matches ([`crate::CycleState::prefix`]); each further producer named
//! fills a set of its own (slot 1, 2, …), and it and its readers are bound
//! to that slot ([`crate::Plugin::bind_prefix_slot`]) — as in llm-d, where
//! each producer writes its own data key. A plugin that can only use the
//! first set makes such a config an error. Prefix producers nobody reads
//! stay idle.

use super::{ConfigError, EndpointPickerConfig, Wiring};
use crate::{BuildError, DEFAULT_PREFIX_PRODUCER, PluginRef, Registry, Role};

const FIELD: &str = "prefixMatchInfoProducerName";

fn produces_prefix(p: &PluginRef) -> bool {
    p.plugin()
        .as_data_producer()
        .is_some_and(|d| d.produces_prefix_matches())
}

impl EndpointPickerConfig {
    /// Where a reader's producer name is written: its parameter when given,
    /// else its `type`.
    fn reader_field(&self, i: usize) -> String {
        let explicit = self
            .raw
            .plugins
            .get(i)
            .and_then(|d| d.parameters.as_ref())
            .and_then(|p| p.get(FIELD))
            .is_some();
        if explicit {
            format!("plugins[{i}].parameters.{FIELD}")
        } else {
            format!("plugins[{i}].type")
        }
    }

    /// Resolves the prefix-match producers the readers name and binds
    /// each to a slot; returns their names, slot 0 first (empty when
    /// nothing reads prefix matches). May add the registry's default
    /// producer, named [`DEFAULT_PREFIX_PRODUCER`].
    pub(super) fn wire_prefix_matches(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<Vec<String>, ConfigError> {
        let readers: Vec<(usize, String)> = wiring
            .plugins
            .iter()
            .enumerate()
            .filter_map(|(i, (_, p))| p.plugin().prefix_match_source().map(|s| (i, s.to_owned())))
            .collect();
        // Producer names in the order their first reader is declared.
        let mut wanted: Vec<String> = Vec::new();
        for (_, w) in &readers {
            if !wanted.contains(w) {
                wanted.push(w.clone());
            }
        }
        let mut producers: Vec<String> = Vec::with_capacity(wanted.len());
        for w in &wanted {
            let own: Vec<usize> = readers
                .iter()
                .filter(|(_, s)| s == w)
                .map(|&(i, _)| i)
                .collect();
            let producer = self.resolve_producer(registry, wiring, w, &own)?;
            // Two names may resolve to one producer (the default name to a
            // reader's own index): one set.
            let known = producers.iter().position(|p| *p == producer);
            let slot = known.unwrap_or(producers.len());
            if slot > 0 {
                let p = wiring.find(&producer).map(|p| p.0);
                let bound = known.is_some() || p.is_some_and(|p| p.bind_prefix_slot(slot));
                if !bound {
                    return Err(self.err(
                        self.reader_field(own[0]),
                        format!(
                            "reads prefix matches from {w:?}, while plugin {:?} reads them \
                             from {:?}; the producer {producer:?} cannot fill a second set of \
                             matches: name the same producer in both",
                            wiring.plugins[readers[0].0].0, wanted[0]
                        ),
                    ));
                }
                for &i in &own {
                    let (name, p) = &wiring.plugins[i];
                    if !p.plugin().bind_prefix_slot(slot) {
                        return Err(self.err(
                            self.reader_field(i),
                            format!(
                                "plugin {name:?} ({}) can only read the prefix matches of the \
                                 producer the first reader names ({:?}), not {w:?}",
                                p.plugin().type_name(),
                                wanted[0]
                            ),
                        ));
                    }
                }
            }
            if known.is_none() {
                producers.push(producer);
            }
        }
        Ok(producers)
    }

    /// The plugin that produces the matches readers `own` (indices into the
    /// plugins) read under the name `wanted`.
    fn resolve_producer(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
        wanted: &str,
        own: &[usize],
    ) -> Result<String, ConfigError> {
        let first = own[0];
        if let Some(p) = wiring.find(wanted) {
            if !produces_prefix(&p) {
                return Err(self.err(
                    self.reader_field(first),
                    format!(
                        "plugin {wanted:?} ({}) does not produce prefix-cache matches",
                        p.plugin().type_name()
                    ),
                ));
            }
            return Ok(wanted.to_owned());
        }
        if wanted != DEFAULT_PREFIX_PRODUCER {
            return Err(self.err(
                self.reader_field(first),
                format!("no plugin named {wanted:?} is declared"),
            ));
        }
        // The default producer: a reader with an index of its own, else the
        // registry's default producer.
        if let Some((name, _)) = own
            .iter()
            .map(|&i| &wiring.plugins[i])
            .find(|(_, p)| produces_prefix(p))
        {
            return Ok(name.clone());
        }
        let cannot = |e: BuildError| {
            self.err(
                self.reader_field(first),
                format!(
                    "reads prefix matches from {DEFAULT_PREFIX_PRODUCER:?}, which is not \
                     declared and cannot be created: {e}"
                ),
            )
        };
        let mut spec = registry
            .default_spec(Role::PrefixProducer)
            .map_err(cannot)?;
        DEFAULT_PREFIX_PRODUCER.clone_into(&mut spec.name);
        let p = wiring.add(registry, &spec).map_err(cannot)?;
        if !produces_prefix(&p) {
            return Err(self.err(
                self.reader_field(first),
                format!(
                    "the registered default {:?} does not produce prefix-cache matches",
                    spec.type_name
                ),
            ));
        }
        Ok(DEFAULT_PREFIX_PRODUCER.to_owned())
    }
}

/// Whether `p` (named `name`) runs its hooks: every plugin except prefix
/// producers no reader reads.
pub(super) fn runs_hooks(sources: &[String], name: &str, p: &PluginRef) -> bool {
    sources.iter().any(|s| s == name) || !produces_prefix(p)
}
