//! Wiring prefix-match readers to their producer (llm-d's
//! `prefixMatchInfoProducerName`).
//!
//! A request carries one set of prefix matches ([`crate::CycleState::prefix`]),
//! filled by one producer. Every reader (`prefix-cache-scorer`,
//! `no-hit-lru-scorer`, `prefix-cache-affinity-filter`, …) names the producer
//! it reads; they must all name the same one. That producer must exist and
//! produce prefix matches; the default name, when no plugin has it, means a
//! reader's own index (a `prefix-cache-scorer` keeps one, as the reference
//! picker's does) or else the registry's default prefix-match producer
//! created here under the default name, as llm-d creates its
//! `approx-prefix-cache-producer`. Other prefix producers then stay idle.

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

    /// Resolves the prefix-match producer every reader names; returns its
    /// name, or `None` when nothing reads prefix matches. May add the
    /// registry's default producer, named [`DEFAULT_PREFIX_PRODUCER`].
    pub(super) fn wire_prefix_matches(
        &self,
        registry: &Registry,
        wiring: &mut Wiring,
    ) -> Result<Option<String>, ConfigError> {
        let plugins = &wiring.plugins;
        let readers: Vec<(usize, String)> = plugins
            .iter()
            .enumerate()
            .filter_map(|(i, (_, p))| p.plugin().prefix_match_source().map(|s| (i, s.to_owned())))
            .collect();
        let Some((first, wanted)) = readers.first().cloned() else {
            return Ok(None);
        };
        if let Some((i, other)) = readers.iter().find(|(_, s)| *s != wanted) {
            return Err(self.err(
                self.reader_field(*i),
                format!(
                    "reads prefix matches from {other:?}, but plugin {:?} reads them from \
                     {wanted:?}: this picker keeps one set of prefix matches per request, so \
                     every reader must name the same producer",
                    plugins[first].0
                ),
            ));
        }
        if let Some(p) = wiring.find(&wanted) {
            if !produces_prefix(&p) {
                return Err(self.err(
                    self.reader_field(first),
                    format!(
                        "plugin {wanted:?} ({}) does not produce prefix-cache matches",
                        p.plugin().type_name()
                    ),
                ));
            }
            return Ok(Some(wanted));
        }
        if wanted != DEFAULT_PREFIX_PRODUCER {
            return Err(self.err(
                self.reader_field(first),
                format!("no plugin named {wanted:?} is declared"),
            ));
        }
        // The default producer: a reader with an index of its own, else the
        // registry's default producer.
        if let Some((_, (name, _))) = readers
            .iter()
            .map(|&(i, _)| (i, &plugins[i]))
            .find(|(_, (_, p))| produces_prefix(p))
        {
            return Ok(Some(name.clone()));
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
        Ok(Some(DEFAULT_PREFIX_PRODUCER.to_owned()))
    }
}

/// Whether `p` (named `name`) runs its hooks: every plugin except prefix
/// producers other than the chosen one.
pub(super) fn runs_hooks(source: Option<&str>, name: &str, p: &PluginRef) -> bool {
    match source {
        Some(s) => name == s || !produces_prefix(p),
        None => true,
    }
}
