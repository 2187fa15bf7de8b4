use std::{collections::VecDeque, sync::Arc};

use epp_core::{Endpoint, EndpointId, PrefixMatch};
use proptest::prelude::*;

use super::PrefixIndex;

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
    let per = index.heap_bytes() as f64 / index.entries() as f64;
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

proptest! {
    #[test]
    fn behaves_like_a_naive_lru(
        ops in prop::collection::vec((0usize..5, prop::collection::vec(0u64..40, 1..30), 0u8..8), 1..80),
        cap in 1usize..30,
        query in prop::collection::vec(0u64..40, 1..20),
    ) {
        let index = PrefixIndex::default();
        let mut model = Model::default();
        for (e, hashes, op) in ops {
            if op == 0 {
                index.forget(EndpointId(e as u32));
                if let Some(l) = model.0.get_mut(e) { l.clear(); }
            } else {
                index.record(EndpointId(e as u32), &hashes, cap);
                model.record(e, &hashes, cap);
            }
            prop_assert!(index.len_for(EndpointId(e as u32)) <= cap);
        }
        let mut m = PrefixMatch::default();
        index.match_prefix(&query, &mut m);
        // The index stops at the first block no endpoint extends; per endpoint
        // that equals the model's contiguous match.
        for e in 0..5 {
            prop_assert_eq!(m.matched(EndpointId(e as u32)), model.matched(e, &query), "endpoint {}", e);
            prop_assert_eq!(index.len_for(EndpointId(e as u32)), model.0.get(e).map_or(0, VecDeque::len));
        }
    }
}
