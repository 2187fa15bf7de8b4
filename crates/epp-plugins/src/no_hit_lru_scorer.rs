//! `no-hit-lru-scorer`: spread requests nobody has cached over the pool.

use std::collections::VecDeque;

use epp_core::{
    BuildError, Candidate, CycleContext, DEFAULT_PREFIX_PRODUCER, EndpointId, Plugin, PreRequest,
    PrefixSlot, SchedulingResult, Scorer,
};
use parking_lot::Mutex;

use crate::Builtin;

/// Parameters of `no-hit-lru-scorer` (llm-d's names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NoHitLruParams {
    /// Endpoints remembered. Default 1024; as in llm-d, 0 or less means the
    /// default.
    #[serde(default)]
    pub lru_size: i64,
    /// Producer whose prefix matches tell a cold request (default
    /// `approx-prefix-cache-producer`).
    #[serde(default)]
    pub prefix_match_info_producer_name: Option<String>,
    /// Deprecated in llm-d, which never used it; accepted and ignored.
    #[serde(default)]
    pub prefix_plugin_type: Option<String>,
    /// Deprecated in llm-d, which never used it; accepted and ignored.
    #[serde(default)]
    pub prefix_plugin_name: Option<String>,
}

const DEFAULT_LRU: usize = 1024;

/// `no-hit-lru-scorer`, with llm-d's formula. A request is cold when no
/// candidate matched a prefix block. For a cold request, with `n`
/// candidates: the candidates that never received a cold request rank
/// 0, 1, … in candidate order; the others rank (number of never-used) +
/// their position in the LRU of cold picks, oldest first. Score =
/// max(0, 1 − rank / (n − 1)); a lone candidate scores 1. Requests with a
/// prefix hit score 0.5 everywhere (neutral). After a cold request the
/// chosen endpoint becomes the most recent entry.
///
/// Cold or not is judged on the matches of the producer
/// `prefixMatchInfoProducerName` names, by default
/// `approx-prefix-cache-producer` (created when not declared), as in llm-d —
/// also when a `prefix-cache-scorer` of the same config reads another
/// producer (llm-d's `sim-epp-no-hit-lru.yaml`: the scorer reads the precise
/// index, this scorer the approximate one). Config loading then binds this
/// scorer to that producer's set of matches ([`Plugin::bind_prefix_slot`]).
#[derive(Debug)]
pub struct NoHitLruScorer {
    name: String,
    size: usize,
    source: Option<String>,
    /// Endpoints that received cold requests, oldest first.
    recent: Mutex<VecDeque<EndpointId>>,
    /// The cycle's prefix-match set `source` fills.
    slot: PrefixSlot,
}

impl Builtin for NoHitLruScorer {
    const TYPE: &'static str = "no-hit-lru-scorer";
    type Params = NoHitLruParams;

    /// # Errors
    /// None: an unset or non-positive `lruSize` means the default size.
    fn build(name: impl Into<String>, p: NoHitLruParams) -> Result<Self, BuildError> {
        let size = usize::try_from(p.lru_size)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_LRU);
        Ok(Self {
            name: name.into(),
            size,
            source: p.prefix_match_info_producer_name.filter(|n| !n.is_empty()),
            recent: Mutex::new(VecDeque::new()),
            slot: PrefixSlot::default(),
        })
    }
}

impl NoHitLruScorer {
    /// Cold: no candidate matched any block (or no matches were produced).
    fn cold(&self, cx: &CycleContext<'_>, candidates: &[Candidate]) -> bool {
        let prefix = cx.state.prefix_at(self.slot.get());
        !candidates.iter().any(|c| prefix.matched(c.id()) > 0)
    }
}

impl Plugin for NoHitLruScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
    fn prefix_match_source(&self) -> Option<&str> {
        Some(self.source.as_deref().unwrap_or(DEFAULT_PREFIX_PRODUCER))
    }
    fn bind_prefix_slot(&self, slot: usize) -> bool {
        self.slot.set(slot);
        true
    }
}

impl Scorer for NoHitLruScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        if !self.cold(cx, candidates) {
            out.fill(0.5);
            return;
        }
        if candidates.len() == 1 {
            out.fill(1.0);
            return;
        }
        let recent = self.recent.lock();
        let position = |id: EndpointId| recent.iter().position(|&e| e == id);
        let never_used = candidates
            .iter()
            .filter(|c| position(c.id()).is_none())
            .count();
        let span = (candidates.len() - 1) as f64;
        let mut next_unused = 0usize;
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let rank = match position(c.id()) {
                Some(p) => never_used + p,
                None => {
                    next_unused += 1;
                    next_unused - 1
                }
            };
            *s = (1.0 - rank as f64 / span).max(0.0);
        }
    }
}

impl PreRequest for NoHitLruScorer {
    fn pre_request(&self, _cx: &CycleContext<'_>, result: &SchedulingResult) {
        let Some(target) = result.primary() else {
            return;
        };
        // Cold as judged when scoring: no candidate of the primary profile
        // matched a block (llm-d keeps the verdict from Score).
        let slot = self.slot.get();
        if result
            .primary_run()
            .is_none_or(|run| run.prefix_hit_in(slot))
        {
            return;
        }
        let mut recent = self.recent.lock();
        recent.retain(|&e| e != target.id());
        recent.push_back(target.id());
        while recent.len() > self.size {
            recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn cold_scores(s: &NoHitLruScorer, c: &[Candidate]) -> Vec<f64> {
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            cx.state.prefix.computed = true;
            cx.state.prefix.hashes = vec![9];
            let mut out = vec![0.0; c.len()];
            s.score(cx, c, &mut out);
            out
        })
    }

    #[test]
    fn cold_requests_go_to_least_recently_used() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let s = NoHitLruScorer::build("n", NoHitLruParams::default()).unwrap();
        s.recent.lock().extend([c[0].id(), c[2].id()]);
        assert_eq!(
            cold_scores(&s, &c),
            vec![0.5, 1.0, 0.0],
            "c1 never used, c2 most recent"
        );
    }

    #[test]
    fn never_used_endpoints_rank_in_candidate_order_as_in_llm_d() {
        // llm-d: the i-th never-used candidate scores 1 − i/(n−1); used ones
        // follow by LRU position, oldest first.
        let c = candidates(vec![EndpointMetrics::default(); 5]);
        let s = NoHitLruScorer::build("n", NoHitLruParams::default()).unwrap();
        s.recent.lock().extend([c[3].id(), c[1].id()]);
        // never used: c0, c2, c4 → ranks 0, 1, 2; c3 (oldest) rank 3; c1 rank 4.
        assert_eq!(cold_scores(&s, &c), vec![1.0, 0.0, 0.75, 0.25, 0.5]);
    }

    #[test]
    fn lru_positions_count_endpoints_outside_the_candidates() {
        // The LRU holds endpoints filtered out of this request; positions
        // are global, clamped at 0 (llm-d).
        let all = candidates(vec![EndpointMetrics::default(); 4]);
        let s = NoHitLruScorer::build("n", NoHitLruParams::default()).unwrap();
        s.recent
            .lock()
            .extend([all[0].id(), all[1].id(), all[2].id(), all[3].id()]);
        let c = vec![all[3].clone(), all[1].clone()];
        // ranks 3 and 1 over n − 1 = 1.
        assert_eq!(cold_scores(&s, &c), vec![0.0, 0.0]);
    }

    #[test]
    fn a_hit_on_a_filtered_out_endpoint_leaves_the_request_cold() {
        let all = candidates(vec![EndpointMetrics::default(); 3]);
        let s = NoHitLruScorer::build("n", NoHitLruParams::default()).unwrap();
        let req = InferenceRequest::builder("m").build();
        let out = with_cx(&req, 0, |cx| {
            cx.state.prefix.computed = true;
            cx.state.prefix.hashes = vec![9];
            cx.state.prefix.set_matched(all[0].id(), 1);
            let mut out = vec![0.0; 2];
            s.score(cx, &all[1..], &mut out);
            out
        });
        assert_eq!(out, vec![1.0, 0.0], "cold among the candidates scored");
    }

    #[test]
    fn the_lru_records_picks_cold_among_the_scored_candidates() {
        let all = candidates(vec![EndpointMetrics::default(); 3]);
        let s = NoHitLruScorer::build("n", NoHitLruParams::default()).unwrap();
        let req = InferenceRequest::builder("m").build();
        let result = |prefix_hit| SchedulingResult {
            runs: vec![epp_core::ProfilePicks {
                profile: 0,
                targets: vec![Arc::clone(&all[1].endpoint)],
                scores: vec![1.0],
                prefix_hit,
                prefix_hits: u64::from(prefix_hit),
            }],
            primary: 0,
            ..Default::default()
        };
        with_cx(&req, 0, |cx| {
            // Endpoint 0 holds a block but was filtered out of the profile.
            cx.state.prefix.computed = true;
            cx.state.prefix.hashes = vec![9];
            cx.state.prefix.set_matched(all[0].id(), 1);
            s.pre_request(cx, &result(true));
            assert!(s.recent.lock().is_empty(), "a hit among the candidates");
            s.pre_request(cx, &result(false));
            assert_eq!(
                s.recent.lock().iter().copied().collect::<Vec<_>>(),
                vec![all[1].id()]
            );
        });
    }

    #[test]
    fn bound_to_another_set_it_judges_cold_on_that_set() {
        // sim-epp-no-hit-lru.yaml: the first set (the precise producer, which
        // prefix-cache-scorer reads) has a hit; this scorer's set has none.
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let s = NoHitLruScorer::build("n", NoHitLruParams::default()).unwrap();
        assert!(s.bind_prefix_slot(1));
        s.recent.lock().extend([c[0].id()]);
        let req = InferenceRequest::builder("m").build();
        let (cold, warm) = with_cx(&req, 0, |cx| {
            cx.state.prefix.computed = true;
            cx.state.prefix.hashes = vec![9];
            cx.state.prefix.set_matched(c[0].id(), 1);
            let mine = cx.state.prefix_at_mut(1);
            mine.computed = true;
            mine.hashes = vec![7];
            let mut cold = vec![0.0; 3];
            s.score(cx, &c, &mut cold);
            cx.state.prefix_at_mut(1).set_matched(c[2].id(), 1);
            let mut warm = vec![0.0; 3];
            s.score(cx, &c, &mut warm);
            (cold, warm)
        });
        assert_eq!(
            cold,
            vec![0.0, 1.0, 0.5],
            "cold: c0 is the LRU's only entry"
        );
        assert_eq!(warm, vec![0.5; 3], "a hit in its own set");
        // The pick is recorded when the primary run had no hit in slot 1,
        // whatever slot 0 says.
        let run = |hits: u64| SchedulingResult {
            runs: vec![epp_core::ProfilePicks {
                profile: 0,
                targets: vec![Arc::clone(&c[1].endpoint)],
                scores: vec![1.0],
                prefix_hit: true,
                prefix_hits: hits,
            }],
            primary: 0,
            ..Default::default()
        };
        with_cx(&req, 0, |cx| {
            s.pre_request(cx, &run(0b11));
            assert_eq!(s.recent.lock().len(), 1, "slot 1 had a hit");
            s.pre_request(cx, &run(0b01));
            assert_eq!(s.recent.lock().back(), Some(&c[1].id()));
        });
    }

    #[test]
    fn llm_d_parameters_load() {
        let p: NoHitLruParams = serde_yaml_ng::from_str(
            "{lruSize: 0, prefixPluginType: prefix-cache-scorer, prefixPluginName: p, \
             prefixMatchInfoProducerName: my-producer}",
        )
        .unwrap();
        let s = NoHitLruScorer::build("n", p).unwrap();
        assert_eq!(s.size, DEFAULT_LRU, "0 means the default, as in llm-d");
        assert_eq!(s.prefix_match_source(), Some("my-producer"));
    }
}
