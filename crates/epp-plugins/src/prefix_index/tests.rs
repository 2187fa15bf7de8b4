use std::{collections::VecDeque, sync::Arc};

use epp_core::{Endpoint, EndpointId, PrefixMatch};
use proptest::prelude::*;

use super::PrefixIndex;

#[test]
fn matches_count_leading_blocks_per_endpoint() {
    let index = PrefixIndex::default();
    let (e0, e1, e2) = (EndpointId(0), EndpointId(1), EndpointId(2));
    // Two prompts sharing blocks 1 and 2, then diverging.
    index.record(e0, &[1, 2, 3, 4], 100);
    index.record(e1, &[1, 2, 30, 40], 100);
    index.record(e2, &[1], 100);
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2, 3, 4, 5], &mut m);
    assert_eq!((m.matched(e0), m.matched(e1), m.matched(e2)), (4, 2, 1));
    let mut m = PrefixMatch::default();
    index.match_prefix(&[9, 10, 11], &mut m);
    assert!(!m.any_hit());
}

#[test]
fn eviction_never_leaves_a_gap() {
    // The reference can count blocks after a gap; here the head of a prompt
    // is always the last of its blocks to go.
    let index = PrefixIndex::default();
    let e = EndpointId(0);
    index.record(e, &[1, 2, 3, 4], 4);
    index.record(e, &[1, 2], 4); // the shared head is used again
    index.record(e, &[7], 4); // evicts 4, the oldest
    index.record(e, &[8], 4); // evicts 3
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2, 3, 4], &mut m);
    assert_eq!(m.matched(e), 2);
}

#[test]
fn lru_is_bounded_and_forgets_endpoints() {
    let index = PrefixIndex::default();
    let e = EndpointId(3);
    index.record(e, &[1, 2, 3], 3);
    index.record(e, &[1], 3); // 1 is now the most recent
    index.record(e, &[4], 3); // evicts 3: blocks are touched last-to-first, so 2 is newer than 3
    assert_eq!(index.len_for(e), 3);
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2, 3], &mut m);
    assert_eq!(m.matched(e), 2);
    index.forget(e);
    assert_eq!(index.len_for(e), 0);
    assert_eq!(index.entries(), 0);
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1], &mut m);
    assert_eq!(m.matched(e), 0);
}

#[test]
fn a_prompt_longer_than_the_capacity_keeps_its_head() {
    let index = PrefixIndex::default();
    let e = EndpointId(0);
    let prompt: Vec<u64> = (100..200).collect();
    index.record(e, &prompt, 10);
    let mut m = PrefixMatch::default();
    index.match_prefix(&prompt, &mut m);
    assert_eq!(
        m.matched(e),
        10,
        "the first 10 blocks survive, not the last 10"
    );
}

#[test]
fn departed_endpoints_are_swept() {
    let index = PrefixIndex::default();
    let gone = Arc::new(Endpoint::new(5, "10.0.0.5:8000".parse().unwrap()));
    let stays = Arc::new(Endpoint::new(6, "10.0.0.6:8000".parse().unwrap()));
    index.record_for(&gone, &[1, 2, 3], 100);
    drop(gone);
    for i in 0..super::SWEEP_EVERY {
        index.record_for(&stays, &[u64::from(i) + 1000], 100);
    }
    assert_eq!(index.len_for(EndpointId(5)), 0);
    assert_eq!(index.len_for(EndpointId(6)), super::SWEEP_EVERY as usize);
}

#[test]
fn an_entry_costs_under_fifty_bytes() {
    let index = PrefixIndex::default();
    // 64 endpoints × 20,000 distinct blocks each.
    for e in 0..64u32 {
        let hashes: Vec<u64> = (0..20_000u64)
            .map(|i| (u64::from(e) << 32 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        index.record(EndpointId(e), &hashes, 31_250);
    }
    let per = index.bytes_per_entry();
    assert!(per <= 50.0, "{per:.1} bytes per entry");
}

/// A naive model: per endpoint, a deque of hashes, most recent at the front.
#[derive(Default)]
struct Model(Vec<VecDeque<u64>>);

impl Model {
    fn record(&mut self, e: usize, hashes: &[u64], cap: usize) {
        if self.0.len() <= e {
            self.0.resize_with(e + 1, VecDeque::new);
        }
        let l = &mut self.0[e];
        for &h in hashes.iter().rev() {
            l.retain(|&x| x != h);
            l.push_front(h);
            l.truncate(cap);
        }
    }

    fn matched(&self, e: usize, hashes: &[u64]) -> u32 {
        let Some(l) = self.0.get(e) else { return 0 };
        hashes.iter().take_while(|h| l.contains(h)).count() as u32
    }
}

/// Chain-consistent prompts: a hash stands for its whole prefix, as
/// `block_hashes` guarantees. Prompt `p` shares its first 6 blocks with the
/// other prompts of group `p % 3`, then has blocks of its own.
fn prompt(p: u64, len: usize) -> Vec<u64> {
    (0..len as u64)
        .map(|k| {
            if k < 6 {
                (p % 3) * 1000 + k
            } else {
                100_000 + p * 1000 + k
            }
        })
        .collect()
}

proptest! {
    #[test]
    fn behaves_like_a_naive_lru(
        ops in prop::collection::vec((0usize..5, 0u64..8, 1usize..20, 0u8..8), 1..80),
        cap in 1usize..30,
        query in (0u64..8, 1usize..20),
    ) {
        let index = PrefixIndex::default();
        let mut model = Model::default();
        for (e, p, len, op) in ops {
            if op == 0 {
                index.forget(EndpointId(e as u32));
                if let Some(l) = model.0.get_mut(e) { l.clear(); }
            } else {
                let hashes = prompt(p, len);
                index.record(EndpointId(e as u32), &hashes, cap);
                model.record(e, &hashes, cap);
            }
            prop_assert!(index.len_for(EndpointId(e as u32)) <= cap);
        }
        let query = prompt(query.0, query.1);
        let mut m = PrefixMatch::default();
        index.match_prefix(&query, &mut m);
        for e in 0..5 {
            prop_assert_eq!(m.matched(EndpointId(e as u32)), model.matched(e, &query), "endpoint {}", e);
            prop_assert_eq!(index.len_for(EndpointId(e as u32)), model.0.get(e).map_or(0, VecDeque::len));
        }
    }
}

proptest! {
    /// Any hashes at all — repeated within a prompt, not chained, shared
    /// across endpoints, with capacities changing between records — keep
    /// the lists and chains consistent and every endpoint within capacity.
    #[test]
    fn arbitrary_hashes_keep_the_structure_sound(
        ops in prop::collection::vec((0u32..4, prop::collection::vec(0u64..24, 0..24), 1usize..16, 0u8..10), 1..60),
    ) {
        let index = PrefixIndex::default();
        for (e, hashes, cap, op) in ops {
            if op == 0 {
                index.forget(EndpointId(e));
            } else {
                index.record(EndpointId(e), &hashes, cap);
                prop_assert!(index.len_for(EndpointId(e)) <= cap);
                // The first block, the most recent, is held.
                let mut m = PrefixMatch::default();
                index.match_prefix(&hashes[..hashes.len().min(1)], &mut m);
                prop_assert_eq!(m.matched(EndpointId(e)), u32::from(!hashes.is_empty()));
            }
            index.check();
        }
    }
}

#[test]
fn a_block_held_by_more_endpoints_than_a_slot_counts_still_matches() {
    // 300 holders of the shared head: more than the slot's count holds
    // (`MANY`), so matching and evicting fall back to the chain.
    let index = PrefixIndex::default();
    for e in 0..300u32 {
        let len = if e < 150 { 3 } else { 2 };
        index.record(EndpointId(e), &[1, 2, 3 + u64::from(e / 150)][..len], 10);
    }
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2, 3], &mut m);
    assert_eq!(m.matched(EndpointId(0)), 3);
    assert_eq!(m.matched(EndpointId(149)), 3);
    assert_eq!(m.matched(EndpointId(150)), 2);
    assert_eq!(m.matched(EndpointId(299)), 2);
    index.check();
    // Down through the count's ceiling and back: the count follows the chain.
    for e in 0..100u32 {
        index.forget(EndpointId(e));
    }
    index.check();
    let mut m = PrefixMatch::default();
    index.match_prefix(&[1, 2, 3], &mut m);
    assert_eq!(
        (m.matched(EndpointId(99)), m.matched(EndpointId(100))),
        (0, 3)
    );
    assert_eq!(m.matched(EndpointId(200)), 2);
}

proptest! {
    /// A hint from a match, true or stale, records exactly what no hint does.
    #[test]
    fn a_hint_changes_nothing_but_the_search(
        ops in prop::collection::vec((0usize..4, 0u64..6, 1usize..16, 0usize..18), 1..60),
        cap in 1usize..24,
    ) {
        let (hinted, plain) = (PrefixIndex::default(), PrefixIndex::default());
        let endpoints: Vec<_> = (0..4).map(|i| Arc::new(Endpoint::new(i, format!("10.0.0.{i}:8000").parse().unwrap()))).collect();
        for (e, p, len, stale) in ops {
            let hashes = prompt(p, len);
            let mut m = PrefixMatch::default();
            hinted.match_prefix(&hashes, &mut m);
            // Every other record uses an arbitrary (likely wrong) hint.
            let hint = if stale % 2 == 0 { m.matched(EndpointId(e as u32)) } else { stale as u32 };
            hinted.record_matched(&endpoints[e], &hashes, cap, hint);
            plain.record_for(&endpoints[e], &hashes, cap);
            hinted.check();
        }
        for p in 0..6 {
            let query = prompt(p, 16);
            let (mut a, mut b) = (PrefixMatch::default(), PrefixMatch::default());
            hinted.match_prefix(&query, &mut a);
            plain.match_prefix(&query, &mut b);
            for e in 0..4 {
                prop_assert_eq!(a.matched(EndpointId(e)), b.matched(EndpointId(e)));
                prop_assert_eq!(hinted.len_for(EndpointId(e)), plain.len_for(EndpointId(e)));
            }
        }
    }
}

proptest! {
    /// Records applied by the writer thread, however short its queue (full
    /// queues make the recording caller apply the oldest record), leave the
    /// index exactly as the same records applied in place, in the same
    /// order; every match sees every record made before it, without a
    /// flush (a read applies what the writer has not yet).
    #[test]
    fn background_records_apply_in_order_like_in_place_ones(
        ops in prop::collection::vec((0usize..4, 0u64..6, 1usize..16, 0u8..6), 1..80),
        cap in 1usize..24,
        bound in 1usize..4,
    ) {
        let (background, plain) = (PrefixIndex::in_background(bound), PrefixIndex::default());
        prop_assert!(background.is_background() && !plain.is_background());
        let endpoints: Vec<_> = (0..4).map(|i| Arc::new(Endpoint::new(i, format!("10.0.0.{i}:8000").parse().unwrap()))).collect();
        let compare = |query: &[u64]| {
            let (mut a, mut b) = (PrefixMatch::default(), PrefixMatch::default());
            background.match_prefix(query, &mut a);
            plain.match_prefix(query, &mut b);
            for e in 0..4 {
                assert_eq!(a.matched(EndpointId(e)), b.matched(EndpointId(e)), "endpoint {e}");
                assert_eq!(background.len_for(EndpointId(e)), plain.len_for(EndpointId(e)));
            }
        };
        for (e, p, len, op) in ops {
            let hashes = prompt(p, len);
            match op {
                0 => {
                    background.forget(EndpointId(e as u32));
                    plain.forget(EndpointId(e as u32));
                }
                1 => compare(&hashes),
                // A P/D decision: two endpoints, one queued copy.
                5 => {
                    let f = (e + 1) % 4;
                    let mut m = PrefixMatch::default();
                    background.match_prefix(&hashes, &mut m);
                    let hint = |i: usize| m.matched(EndpointId(i as u32));
                    background.record_matched_both(&hashes, (&endpoints[e], cap, hint(e)), (&endpoints[f], cap, hint(f)));
                    plain.record_for(&endpoints[e], &hashes, cap);
                    plain.record_for(&endpoints[f], &hashes, cap);
                }
                _ => {
                    let mut m = PrefixMatch::default();
                    background.match_prefix(&hashes, &mut m);
                    // The hint may be stale by the time the writer applies it.
                    background.record_matched(&endpoints[e], &hashes, cap, m.matched(EndpointId(e as u32)));
                    plain.record_for(&endpoints[e], &hashes, cap);
                }
            }
        }
        for p in 0..6 {
            compare(&prompt(p, 16));
        }
        background.check();
        prop_assert_eq!(background.entries(), plain.entries());
    }
}

/// Matches taken while the writer applies records always find every
/// endpoint's blocks prefix-closed and the lists and chains whole.
#[test]
fn readers_never_see_a_half_applied_record() {
    let index = PrefixIndex::in_background(8);
    let endpoints: Vec<_> = (0..3)
        .map(|i| {
            Arc::new(Endpoint::new(
                i,
                format!("10.0.0.{i}:8000").parse().unwrap(),
            ))
        })
        .collect();
    // Capacity 40 against 60-block prompts of 20 groups: every record evicts.
    for round in 0..400u64 {
        let e = &endpoints[(round % 3) as usize];
        index.record_for(e, &prompt(round % 20, 60), 40);
        if round % 4 == 0 {
            index.check_prefix_closed(&prompt(round % 20, 60));
            index.check();
        }
    }
    index.flush();
    index.check();
    for p in 0..20 {
        index.check_prefix_closed(&prompt(p, 60));
    }
}

/// More distinct match lengths than a match walks chains side by side: each
/// endpoint still gets its own length, whichever batch its level falls in.
#[test]
fn many_distinct_lengths_each_get_their_own() {
    let index = PrefixIndex::default();
    let full = prompt(1, 40);
    // Endpoint e holds the first 2e + 1 blocks (20 lengths); endpoints 20..30
    // hold the whole prompt, and 30 another group's prompt.
    for e in 0..20u32 {
        index.record(EndpointId(e), &full[..2 * e as usize + 1], 100);
    }
    for e in 20..30u32 {
        index.record(EndpointId(e), &full, 100);
    }
    index.record(EndpointId(30), &prompt(2, 40), 100);
    let mut m = PrefixMatch::default();
    index.match_prefix(&full, &mut m);
    for e in 0..20u32 {
        assert_eq!(m.matched(EndpointId(e)), 2 * e + 1, "endpoint {e}");
    }
    for e in 20..30u32 {
        assert_eq!(m.matched(EndpointId(e)), 40, "endpoint {e}");
    }
    assert_eq!(m.matched(EndpointId(30)), 0, "another group's prompt");
}

proptest! {
    /// Holder bits (ids below 64) and chain walks (the rest) find the same
    /// matches as walking every chain, through records, evictions and
    /// departures that move blocks between one holder and many.
    #[test]
    fn holder_bits_match_like_walking_the_chains(
        ops in prop::collection::vec((0usize..8, 0u64..6, 1usize..16, 0u8..8), 1..80),
        cap in 1usize..24,
        queries in prop::collection::vec((0u64..6, 1usize..16), 1..4),
    ) {
        // Both sides of the 64-bit boundary.
        const IDS: [u32; 8] = [0, 1, 2, 62, 63, 64, 65, 130];
        let index = PrefixIndex::default();
        for (e, p, len, op) in ops {
            let id = EndpointId(IDS[e]);
            if op == 0 {
                index.forget(id);
            } else {
                index.record(id, &prompt(p, len), cap);
            }
            index.check();
            for &(q, qlen) in &queries {
                let query = prompt(q, qlen);
                let expected = index.match_by_chains(&query);
                let mut m = PrefixMatch::default();
                index.match_prefix(&query, &mut m);
                for id in IDS {
                    let want = expected.get(id as usize).copied().unwrap_or(0);
                    prop_assert_eq!(m.matched(EndpointId(id)), want, "endpoint {}", id);
                }
            }
        }
    }
}
