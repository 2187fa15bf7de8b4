use std::sync::Arc;

use epp_core::{
    CacheGeometry, EndpointMetrics, EndpointSnapshot, InferenceRequest, PluginRef, Scheduler,
    SchedulingProfile, SingleProfileHandler,
};

use super::*;
use crate::{MaxScorePicker, PickerParams, testing::candidates};

#[test]
fn hashes_chain_and_depend_on_seed() {
    let mut a = Vec::new();
    block_hashes(b"aaaabbbbcc", 4, 10, 1, &mut a);
    assert_eq!(a.len(), 2, "partial block ignored");
    let mut b = Vec::new();
    block_hashes(b"xxxxbbbb", 4, 10, 1, &mut b);
    assert_ne!(a[1], b[1], "same block after another prefix differs");
    let mut c = Vec::new();
    block_hashes(b"aaaabbbb", 4, 10, 2, &mut c);
    assert_ne!(a[0], c[0], "seed separates models and tenants");
    let mut d = Vec::new();
    block_hashes(&[b'z'; 400], 4, 7, 1, &mut d);
    assert_eq!(d.len(), 7, "bounded by maxPrefixBlocksToMatch");
}

#[test]
fn matches_are_contiguous_from_the_start() {
    let index = PrefixIndex::default();
    let e0 = EndpointId(0);
    let e1 = EndpointId(1);
    index.record(e0, &[1, 2, 3, 4], 100);
    index.record(e1, &[1, 3, 4], 100); // holds 3 and 4 but not 2
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2, 3, 4, 5], &mut m);
    assert_eq!(m.matched(e0), 4);
    assert_eq!(m.matched(e1), 1, "blocks after a gap do not count");
}

#[test]
fn lru_is_bounded_and_forgets_endpoints() {
    let index = PrefixIndex::default();
    let e = EndpointId(3);
    index.record(e, &[1, 2, 3], 3);
    index.record(e, &[1], 3); // 1 is now the most recent
    index.record(e, &[4], 3); // evicts 2
    assert_eq!(index.len_for(e), 3);
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2], &mut m);
    assert_eq!(m.matched(e), 1);
    index.forget(e);
    assert_eq!(index.len_for(e), 0);
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1], &mut m);
    assert_eq!(m.matched(e), 0);
}

#[test]
fn auto_tune_takes_capacity_from_the_server() {
    let s = PrefixCacheScorer::new("p", PrefixCacheParams::default());
    let c = candidates(vec![EndpointMetrics {
        cache: Some(CacheGeometry {
            block_size_tokens: 32,
            num_blocks: 1000,
        }),
        ..Default::default()
    }]);
    assert_eq!(
        s.capacity_for(&c[0]),
        2000,
        "1000 blocks of 32 tokens = 2000 of 16"
    );
    let off = PrefixCacheScorer::new(
        "p",
        PrefixCacheParams {
            auto_tune: false,
            ..Default::default()
        },
    );
    assert_eq!(off.capacity_for(&c[0]), 31_250);
}

#[test]
fn a_scheduled_prefix_sticks_to_its_endpoint() {
    let scorer = Arc::new(PrefixCacheScorer::new(
        "prefix",
        PrefixCacheParams::default(),
    ));
    let picker = Arc::new(MaxScorePicker::new("pick", PickerParams::default()));
    let profile = SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(scorer.clone()), 1.0)
        .with_picker(PluginRef::new(picker));
    let scheduler = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
        .unwrap()
        .with_hooks([PluginRef::new(scorer.clone())]);
    let snapshot = EndpointSnapshot::new(
        candidates(vec![EndpointMetrics::default(); 8])
            .into_iter()
            .map(|c| c.endpoint)
            .collect(),
    );
    let system = "You are a helpful assistant. ".repeat(40);
    let first = scheduler
        .schedule(
            &InferenceRequest::builder("m")
                .prompt(format!("{system} Q1"))
                .build(),
            &snapshot,
        )
        .unwrap();
    let home = first.primary().unwrap().id();
    for q in 2..20 {
        let r = scheduler
            .schedule(
                &InferenceRequest::builder("m")
                    .prompt(format!("{system} Q{q}"))
                    .build(),
                &snapshot,
            )
            .unwrap();
        assert_eq!(r.primary().unwrap().id(), home);
        assert!(r.primary_run().unwrap().scores[0] > 0.9);
    }
    // Another tenant's salt does not share the cache.
    let other = scheduler
        .schedule(
            &InferenceRequest::builder("m")
                .prompt(format!("{system} Q1"))
                .cache_salt("t2")
                .build(),
            &snapshot,
        )
        .unwrap();
    assert_eq!(other.primary_run().unwrap().scores[0], 0.0);
}
