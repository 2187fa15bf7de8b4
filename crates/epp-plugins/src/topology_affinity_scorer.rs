//! `topology-affinity-scorer`: in a P/D prefill profile, prefer candidates
//! close to the decode pick (the profile handler's peer), on llm-d's fixed
//! curve, shaped by KV-transfer bandwidth:
//!
//! ```text
//! level(peer, c)   host   rack   zone   region   none
//! score            1.00   0.20   0.05   0.02     0
//! ```
//!
//! Every candidate scores 0 with no peer or a peer whose locality is
//! unknown. Locality comes from the topology source named by
//! `topologyProducerName` (`topology-extractor`).

use epp_core::{BuildError, Candidate, CycleContext, Plugin, PluginRef, Scorer, TopologyLevel};

use crate::{Builtin, topology_extractor::TopologySource};

/// Parameters (llm-d's names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TopologyScorerParams {
    /// The topology source (default `topology-extractor`).
    pub topology_producer_name: Option<String>,
}

/// The score of a level.
#[must_use]
pub fn proximity(level: TopologyLevel) -> f64 {
    match level {
        TopologyLevel::Host => 1.0,
        TopologyLevel::Rack => 0.20,
        TopologyLevel::Zone => 0.05,
        TopologyLevel::Region => 0.02,
        TopologyLevel::None => 0.0,
    }
}

/// `topology-affinity-scorer`: see the module docs.
#[derive(Debug)]
pub struct TopologyAffinityScorer {
    name: String,
    source: TopologySource,
}

impl Builtin for TopologyAffinityScorer {
    const TYPE: &'static str = "topology-affinity-scorer";
    type Params = TopologyScorerParams;

    fn build(name: impl Into<String>, p: TopologyScorerParams) -> Result<Self, BuildError> {
        Ok(Self {
            name: name.into(),
            source: TopologySource::new(p.topology_producer_name),
        })
    }
}

impl Plugin for TopologyAffinityScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn named_plugins(&self) -> Vec<(&'static str, String)> {
        self.source.named()
    }
    fn bind_plugins(&self, plugins: &[PluginRef]) -> Result<(), (usize, String)> {
        self.source.bind(plugins)
    }
}

impl Scorer for TopologyAffinityScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let (Some(topology), Some(peer)) = (self.source.get(), cx.state.peer.as_ref()) else {
            return;
        };
        if !topology.known(peer) {
            return;
        }
        for (o, c) in out.iter_mut().zip(candidates) {
            *o = proximity(topology.level(peer, &c.endpoint));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use epp_core::{Candidate, Filter, InferenceRequest};

    use super::*;
    use crate::{
        TopologyAffinityFilter, TopologyExtractor, TopologyFilterParams, TopologyLabels,
        testing::{labelled, with_cx},
    };

    const HOST: &str = "kubernetes.io/hostname";
    const ZONE: &str = "topology.kubernetes.io/zone";

    fn source() -> PluginRef {
        PluginRef::new(Arc::new(
            TopologyExtractor::build("topology-extractor", TopologyLabels::default()).unwrap(),
        ))
    }

    #[test]
    fn curve_and_no_peer() {
        let s = TopologyAffinityScorer::build("s", TopologyScorerParams::default()).unwrap();
        s.bind_plugins(&[source()]).unwrap();
        let peer = labelled(0, &[(HOST, "h1"), (ZONE, "z1")]);
        let cands: Vec<Candidate> = [
            labelled(1, &[(HOST, "h1")]),
            labelled(2, &[(ZONE, "z1")]),
            labelled(3, &[(ZONE, "z2")]),
        ]
        .iter()
        .map(Candidate::new)
        .collect();
        let req = InferenceRequest::builder("m").build();
        let scored = |peer: Option<Arc<epp_core::Endpoint>>| {
            with_cx(&req, 1, |cx| {
                cx.state.peer = peer;
                let mut out = vec![0.0; 3];
                s.score(cx, &cands, &mut out);
                out
            })
        };
        assert_eq!(scored(Some(peer)), vec![1.0, 0.05, 0.0]);
        assert_eq!(scored(None), vec![0.0; 3]);
        assert_eq!(
            scored(Some(labelled(4, &[]))),
            vec![0.0; 3],
            "peer locality unknown"
        );
    }

    #[test]
    fn filter_keeps_close_ones_and_fails_open() {
        let f = TopologyAffinityFilter::build(
            "f",
            TopologyFilterParams {
                min_affinity: Some("zone".into()),
                topology_producer_name: None,
            },
        )
        .unwrap();
        f.bind_plugins(&[source()]).unwrap();
        let req = InferenceRequest::builder("m").build();
        let kept = |peer: Arc<epp_core::Endpoint>, zones: &[&str]| {
            let mut cands: Vec<Candidate> = (1..)
                .zip(zones)
                .map(|(i, z)| Candidate::new(&labelled(i, &[(ZONE, z)])))
                .collect();
            with_cx(&req, 1, |cx| {
                cx.state.peer = Some(peer);
                Filter::filter(&f, cx, &mut cands);
            });
            cands.iter().map(|c| c.id().0).collect::<Vec<_>>()
        };
        let peer = labelled(0, &[(ZONE, "z1")]);
        assert_eq!(kept(peer.clone(), &["z1", "z2", "z1"]), vec![1, 3]);
        assert_eq!(
            kept(peer, &["z2", "z3"]),
            vec![1, 2],
            "none close: all stay"
        );
        assert!(
            TopologyAffinityFilter::build(
                "f",
                TopologyFilterParams {
                    min_affinity: Some("planet".into()),
                    topology_producer_name: None
                }
            )
            .is_err()
        );
    }
}
