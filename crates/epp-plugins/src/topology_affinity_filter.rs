//! `topology-affinity-filter`: in a P/D prefill profile, keep the candidates
//! close enough to the decode pick (the profile handler's peer) for a fast
//! KV transfer.
//!
//! ```text
//! keep c ⇔ level(peer, c) ≤ minAffinity       (host < rack < zone < region)
//! ```
//!
//! It fails open: with no peer, a peer whose locality is unknown, or no
//! candidate close enough, every candidate stays. Locality comes from the
//! topology source named by `topologyProducerName` (`topology-extractor`).

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin, PluginRef, TopologyLevel};

use crate::{
    Builtin,
    topology_extractor::{TopologySource, parse_level},
};

/// Parameters (llm-d's names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TopologyFilterParams {
    /// The loosest level kept: `host` (default), `rack`, `zone` or `region`.
    pub min_affinity: Option<String>,
    /// The topology source (default `topology-extractor`).
    pub topology_producer_name: Option<String>,
}

/// `topology-affinity-filter`: see the module docs.
#[derive(Debug)]
pub struct TopologyAffinityFilter {
    name: String,
    min: TopologyLevel,
    source: TopologySource,
}

impl Builtin for TopologyAffinityFilter {
    const TYPE: &'static str = "topology-affinity-filter";
    type Params = TopologyFilterParams;

    fn build(name: impl Into<String>, p: TopologyFilterParams) -> Result<Self, BuildError> {
        let name = name.into();
        let min = match p.min_affinity.as_deref() {
            None | Some("") => TopologyLevel::Host,
            Some(s) => parse_level(s).ok_or_else(|| {
                crate::invalid(&name, "minAffinity", s, "host, rack, zone or region")
            })?,
        };
        Ok(Self {
            name,
            min,
            source: TopologySource::new(p.topology_producer_name),
        })
    }
}

impl Plugin for TopologyAffinityFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
    fn named_plugins(&self) -> Vec<(&'static str, String)> {
        self.source.named()
    }
    fn bind_plugins(&self, plugins: &[PluginRef]) -> Result<(), (usize, String)> {
        self.source.bind(plugins)
    }
}

impl Filter for TopologyAffinityFilter {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        let (Some(topology), Some(peer)) = (self.source.get(), cx.state.peer.as_ref()) else {
            return;
        };
        if !topology.known(peer) {
            return;
        }
        let close = |c: &Candidate| topology.level(peer, &c.endpoint) <= self.min;
        if candidates.iter().any(close) {
            candidates.retain(close);
        }
    }
}
