//! `topology-extractor`: where each endpoint sits — host, rack, zone,
//! region — read from its labels, for the topology-affinity plugins that
//! place a P/D prefill pick near its decode pick.
//!
//! ```text
//! host   = label `hostname` (default kubernetes.io/hostname)
//! rack   = label `rack`     (default topology.kubernetes.io/rack)
//! zone   = label `zone`     (default topology.kubernetes.io/zone)
//! region = label `region`   (default topology.kubernetes.io/region)
//!
//! level(peer, c) = host    if both have the same non-empty host
//!                  rack    else if the same non-empty rack
//!                  zone    else if the same non-empty zone
//!                  region  else if the same non-empty region
//!                  none    otherwise (a missing value never matches,
//!                                     not even another missing one)
//! ```
//!
//! llm-d falls back to the pod's `spec.hostname` when the host label is
//! absent; epp's endpoints carry their pod's labels only, so the host is the
//! label's.

use std::sync::OnceLock;

use epp_core::{BuildError, Endpoint, Plugin, PluginRef, Topology, TopologyLevel};

use crate::Builtin;

/// A `minAffinity` value (`host`, `rack`, `zone`, `region`).
pub(crate) fn parse_level(s: &str) -> Option<TopologyLevel> {
    match s {
        "host" => Some(TopologyLevel::Host),
        "rack" => Some(TopologyLevel::Rack),
        "zone" => Some(TopologyLevel::Zone),
        "region" => Some(TopologyLevel::Region),
        _ => None,
    }
}

/// Parameters (llm-d's names): the label each field is read from.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyLabels {
    /// Host label (default `kubernetes.io/hostname`).
    pub hostname: Option<String>,
    /// Rack label (default `topology.kubernetes.io/rack`).
    pub rack: Option<String>,
    /// Zone label (default `topology.kubernetes.io/zone`).
    pub zone: Option<String>,
    /// Region label (default `topology.kubernetes.io/region`).
    pub region: Option<String>,
}

/// `topology-extractor`: see the module docs.
#[derive(Debug, Clone)]
pub struct TopologyExtractor {
    name: String,
    /// Host, rack, zone, region label names.
    labels: [String; 4],
}

impl Builtin for TopologyExtractor {
    const TYPE: &'static str = "topology-extractor";
    type Params = TopologyLabels;

    fn build(name: impl Into<String>, p: TopologyLabels) -> Result<Self, BuildError> {
        let label = |v: Option<String>, default: &str| {
            v.filter(|s| !s.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        Ok(Self {
            name: name.into(),
            labels: [
                label(p.hostname, "kubernetes.io/hostname"),
                label(p.rack, "topology.kubernetes.io/rack"),
                label(p.zone, "topology.kubernetes.io/zone"),
                label(p.region, "topology.kubernetes.io/region"),
            ],
        })
    }
}

impl Topology for TopologyExtractor {
    fn known(&self, e: &Endpoint) -> bool {
        self.labels
            .iter()
            .any(|l| e.label(l).is_some_and(|v| !v.is_empty()))
    }

    fn level(&self, peer: &Endpoint, candidate: &Endpoint) -> TopologyLevel {
        const LEVELS: [TopologyLevel; 4] = [
            TopologyLevel::Host,
            TopologyLevel::Rack,
            TopologyLevel::Zone,
            TopologyLevel::Region,
        ];
        for (label, level) in self.labels.iter().zip(LEVELS) {
            if let (Some(a), Some(b)) = (peer.label(label), candidate.label(label))
                && !a.is_empty()
                && a == b
            {
                return level;
            }
        }
        TopologyLevel::None
    }
}

impl Plugin for TopologyExtractor {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_topology(&self) -> Option<&dyn Topology> {
        Some(self)
    }
}

/// The topology source a topology plugin reads (`topologyProducerName`,
/// default `topology-extractor`), bound at load.
#[derive(Debug)]
pub(crate) struct TopologySource {
    name: String,
    bound: OnceLock<PluginRef>,
}

impl TopologySource {
    pub(crate) fn new(name: Option<String>) -> Self {
        Self {
            name: name
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| TopologyExtractor::TYPE.to_owned()),
            bound: OnceLock::new(),
        }
    }

    /// For [`Plugin::named_plugins`].
    pub(crate) fn named(&self) -> Vec<(&'static str, String)> {
        vec![("topologyProducerName", self.name.clone())]
    }

    /// For [`Plugin::bind_plugins`].
    pub(crate) fn bind(&self, plugins: &[PluginRef]) -> Result<(), (usize, String)> {
        let p = plugins
            .first()
            .ok_or((0, "no topology source".to_owned()))?;
        if p.plugin().as_topology().is_none() {
            return Err((
                0,
                format!(
                    "plugin {:?} ({}) does not produce endpoint topology",
                    p.plugin().name(),
                    p.plugin().type_name()
                ),
            ));
        }
        // Bound once at load; a second binding (never done) keeps the first.
        let _ = self.bound.set(p.clone());
        Ok(())
    }

    /// The source, once bound.
    pub(crate) fn get(&self) -> Option<&dyn Topology> {
        self.bound.get().and_then(|p| p.plugin().as_topology())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::labelled;

    #[test]
    fn levels_tightest_first_and_missing_never_matches() {
        let t = TopologyExtractor::build("t", TopologyLabels::default()).unwrap();
        let host = "kubernetes.io/hostname";
        let rack = "topology.kubernetes.io/rack";
        let zone = "topology.kubernetes.io/zone";
        let region = "topology.kubernetes.io/region";
        let peer = labelled(
            0,
            &[(host, "h1"), (rack, "r1"), (zone, "z1"), (region, "eu")],
        );
        let same_host = labelled(1, &[(host, "h1"), (rack, "r9")]);
        let same_rack = labelled(2, &[(host, "h2"), (rack, "r1"), (zone, "z1")]);
        let same_zone = labelled(3, &[(zone, "z1"), (region, "eu")]);
        let same_region = labelled(4, &[(zone, "z2"), (region, "eu")]);
        let far = labelled(5, &[(region, "us")]);
        let bare = labelled(6, &[]);
        assert_eq!(t.level(&peer, &same_host), TopologyLevel::Host);
        assert_eq!(t.level(&peer, &same_rack), TopologyLevel::Rack);
        assert_eq!(t.level(&peer, &same_zone), TopologyLevel::Zone);
        assert_eq!(t.level(&peer, &same_region), TopologyLevel::Region);
        assert_eq!(t.level(&peer, &far), TopologyLevel::None);
        assert_eq!(t.level(&bare, &labelled(7, &[])), TopologyLevel::None);
        assert!(t.known(&far) && !t.known(&bare));
        let custom = TopologyExtractor::build(
            "t",
            TopologyLabels {
                hostname: Some("node".into()),
                ..TopologyLabels::default()
            },
        )
        .unwrap();
        let a = labelled(8, &[("node", "n1")]);
        assert_eq!(
            custom.level(&a, &labelled(9, &[("node", "n1")])),
            TopologyLevel::Host
        );
    }
}
