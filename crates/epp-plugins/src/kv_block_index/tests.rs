use super::*;
use proptest::test_runner::TestCaseError;
use std::time::{Duration, Instant};

const A: EndpointId = EndpointId(0);
const B: EndpointId = EndpointId(1);

fn batch(model: Option<&str>, events: Vec<KvEvent>) -> KvEventBatch {
    KvEventBatch {
        events,
        model: model.map(str::to_owned),
        ..KvEventBatch::default()
    }
}

/// Blocks `hashes` (the engine's, `size` tokens each) of `tokens`.
fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], size: u32) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: size,
        medium: Some("GPU".into()),
        ..BlockStored::default()
    })
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: Some("GPU".into()),
    }
}

fn matched(index: &KvBlockIndex, model: &str, tokens: &[u32]) -> (u32, u32, usize) {
    let mut keys = Vec::new();
    index.keys_of(model, None, &[], tokens, 1000, &mut keys);
    let mut m = PrefixMatch::default();
    index.lookup(&keys, &mut m);
    (m.matched(A), m.matched(B), keys.len())
}

fn seq(n: u32) -> Vec<u32> {
    (0..n).map(|i| i * 7 + 1).collect()
}

#[test]
fn stored_blocks_match_leading_blocks_and_removals_unmatch() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(12);
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[10, 11], None, &t[..8], 4)]),
    );
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[12], Some(11), &t[8..], 4)]),
    );
    // A request with the same 12 tokens and 2 more (a partial block).
    let mut req = t.clone();
    req.extend([5, 5]);
    assert_eq!(matched(&ix, "m", &req), (3, 0, 3));
    // Only the leading blocks count: a different first block matches nothing.
    let mut other = t.clone();
    other[0] = 999;
    assert_eq!(matched(&ix, "m", &other).0, 0);
    // The middle block evicted: only the first matches (contiguously).
    ix.apply(A, &batch(Some("m"), vec![removed(&[11])]));
    assert_eq!(matched(&ix, "m", &req).0, 1);
    ix.apply(A, &batch(Some("m"), vec![KvEvent::AllBlocksCleared]));
    assert_eq!(matched(&ix, "m", &req).0, 0);
    assert!(ix.is_empty());
    assert_eq!(ix.engine_blocks(A), 0);
}

#[test]
fn engine_blocks_smaller_than_the_index_carry_over() {
    // Engine: 4-token blocks; index: 8-token blocks.
    let ix = KvBlockIndex::new(8, 1, 1000);
    let t = seq(16);
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[1, 2, 3], None, &t[..12], 4)]),
    );
    assert_eq!(
        matched(&ix, "m", &t),
        (1, 0, 2),
        "12 tokens hold one 8-block"
    );
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[4], Some(3), &t[12..], 4)]),
    );
    assert_eq!(matched(&ix, "m", &t).0, 2);
    // Evicting the engine block that completed the second key unmatches it.
    ix.apply(A, &batch(Some("m"), vec![removed(&[4])]));
    assert_eq!(matched(&ix, "m", &t).0, 1);
    // The keys equal those of an engine with the index's own block size.
    let same = KvBlockIndex::new(8, 1, 1000);
    same.apply(B, &batch(Some("m"), vec![stored(&[7, 8], None, &t, 8)]));
    let mut k1 = Vec::new();
    let mut k2 = Vec::new();
    ix.keys_of("m", None, &[], &t, 10, &mut k1);
    same.keys_of("m", None, &[], &t, 10, &mut k2);
    assert_eq!(k1, k2);
    assert_eq!(matched(&same, "m", &t).1, 2);
}

#[test]
fn engine_blocks_larger_than_the_index_complete_several_keys() {
    let ix = KvBlockIndex::new(2, 1, 1000);
    let t = seq(8);
    ix.apply(A, &batch(Some("m"), vec![stored(&[1, 2], None, &t, 4)]));
    assert_eq!(matched(&ix, "m", &t).0, 4);
    ix.apply(A, &batch(Some("m"), vec![removed(&[2])]));
    assert_eq!(matched(&ix, "m", &t).0, 2);
}

#[test]
fn an_unknown_parent_is_an_orphan_and_indexes_nothing() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[5], Some(404), &seq(4), 4)]),
    );
    assert!(ix.is_empty());
    assert_eq!(ix.counters().orphans.load(Ordering::Relaxed), 1);
    // Fewer tokens than the hashes claim: the blocks without tokens are not keyed.
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[1, 2], None, &seq(6), 4)]),
    );
    assert_eq!(ix.engine_blocks(A), 1);
}

#[test]
fn a_parent_of_zero_is_llm_ds_no_parent() {
    // llm-d's simulator and KV-cache library send their empty block hash, 0,
    // as the first block's parent.
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(8);
    ix.apply(A, &batch(Some("m"), vec![stored(&[7, 8], Some(0), &t, 4)]));
    assert_eq!(matched(&ix, "m", &t), (2, 0, 2));
    assert_eq!(ix.counters().orphans.load(Ordering::Relaxed), 0);
    // A known block hashed 0 is still a parent like any other.
    let ix = KvBlockIndex::new(4, 1, 1000);
    ix.apply(A, &batch(Some("m"), vec![stored(&[0], None, &t[..4], 4)]));
    ix.apply(
        A,
        &batch(Some("m"), vec![stored(&[9], Some(0), &t[4..], 4)]),
    );
    assert_eq!(matched(&ix, "m", &t), (2, 0, 2));
}

#[test]
fn the_root_is_the_lora_name_else_the_topics_model() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(4);
    let mut lora = BlockStored {
        block_hashes: vec![1],
        token_ids: t.clone(),
        block_size: 4,
        lora_id: Some(1),
        lora_name: Some("sql".into()),
        ..BlockStored::default()
    };
    ix.apply(
        A,
        &batch(Some("base"), vec![KvEvent::BlockStored(lora.clone())]),
    );
    assert_eq!(matched(&ix, "sql", &t).0, 1);
    assert_eq!(matched(&ix, "base", &t).0, 0);
    lora.lora_name = None;
    lora.block_hashes = vec![2];
    ix.apply(B, &batch(Some("base"), vec![KvEvent::BlockStored(lora)]));
    assert_eq!(matched(&ix, "base", &t), (0, 1, 1));
    // Seeds separate indexes.
    let other = KvBlockIndex::new(4, 2, 1000);
    let (mut k1, mut k2) = (Vec::new(), Vec::new());
    ix.keys_of("base", None, &[], &t, 9, &mut k1);
    other.keys_of("base", None, &[], &t, 9, &mut k2);
    assert_ne!(k1, k2);
}

#[test]
fn a_block_on_two_mediums_stays_until_both_are_evicted() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(4);
    let mut cpu = stored(&[1], None, &t, 4);
    if let KvEvent::BlockStored(s) = &mut cpu {
        s.medium = Some("CPU".into());
    }
    ix.apply(A, &batch(Some("m"), vec![stored(&[1], None, &t, 4), cpu]));
    ix.apply(A, &batch(Some("m"), vec![removed(&[1])]));
    assert_eq!(matched(&ix, "m", &t).0, 1, "still on CPU");
    ix.apply(
        A,
        &batch(
            Some("m"),
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![1],
                medium: Some("CPU".into()),
            }],
        ),
    );
    assert_eq!(matched(&ix, "m", &t).0, 0);
}

#[test]
fn endpoints_hold_keys_independently() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(8);
    ix.apply(A, &batch(Some("m"), vec![stored(&[1, 2], None, &t, 4)]));
    ix.apply(B, &batch(Some("m"), vec![stored(&[9], None, &t[..4], 4)]));
    assert_eq!(matched(&ix, "m", &t), (2, 1, 2));
    ix.clear(A);
    assert_eq!(matched(&ix, "m", &t), (0, 1, 2));
    // Storing the same engine block twice counts it once.
    ix.apply(B, &batch(Some("m"), vec![stored(&[9], None, &t[..4], 4)]));
    ix.apply(B, &batch(Some("m"), vec![removed(&[9])]));
    assert_eq!(matched(&ix, "m", &t), (0, 0, 2));
    assert!(ix.is_empty());
}

#[test]
fn a_publisher_that_never_evicts_costs_bounded_memory() {
    let ix = KvBlockIndex::new(1, 1, 100);
    for h in 0..250u32 {
        ix.apply(
            A,
            &batch(None, vec![stored(&[u64::from(h)], None, &[h], 1)]),
        );
        assert!(ix.engine_blocks(A) <= 100);
    }
    assert!(ix.counters().clears.load(Ordering::Relaxed) >= 2);
    assert!(ix.len() <= 100);
}

proptest::proptest! {
    /// Against a model: after any interleaving of stores (chains off known
    /// blocks) and removals on two endpoints, each endpoint matches exactly
    /// the leading blocks of a sequence whose every block it still holds.
    #[test]
    fn matches_what_the_engines_hold(ops in proptest::collection::vec((0u8..2, 0u8..3, 0usize..6, 1usize..4), 1..60)) {
        let ix = KvBlockIndex::new(2, 7, 10_000);
        let tokens: Vec<u32> = (0..12).collect();
        // Engine hash of block j of the sequence on endpoint e: its own.
        let hash = |e: usize, j: usize| (e as u64 + 1) * 1000 + j as u64;
        let mut held = [[false; 6]; 2];
        for (e, op, j, n) in ops {
            let id = EndpointId(u32::from(e));
            let e = usize::from(e);
            if op < 2 {
                // Store blocks j..j+n if their parent is held (else orphan).
                let end = (j + n).min(6);
                let parent = (j > 0).then(|| hash(e, j - 1));
                if j == 0 || held[e][j - 1] {
                    let hashes: Vec<u64> = (j..end).map(|k| hash(e, k)).collect();
                    ix.apply(id, &batch(Some("m"), vec![stored(&hashes, parent, &tokens[j * 2..end * 2], 2)]));
                    held[e][j..end].fill(true);
                } else {
                    ix.apply(id, &batch(Some("m"), vec![stored(&[hash(e, j)], parent, &tokens[j * 2..j * 2 + 2], 2)]));
                }
            } else {
                ix.apply(id, &batch(Some("m"), vec![removed(&[hash(e, j)])]));
                held[e][j] = false;
            }
        }
        let (a, b, _) = matched(&ix, "m", &tokens);
        let lead = |h: &[bool; 6]| h.iter().take_while(|&&x| x).count() as u32;
        proptest::prop_assert_eq!(a, lead(&held[0]));
        proptest::prop_assert_eq!(b, lead(&held[1]));
    }
}

/// Endpoints `ids` each hold a whole 40-block sequence, then lose the
/// blocks in `holes` (one list per endpoint); a request for the first `len`
/// blocks must match, for each, exactly the leading blocks it still holds.
fn check_long_matches(ids: &[u32], holes: &[Vec<usize>], len: usize) -> Result<(), TestCaseError> {
    let ix = KvBlockIndex::new(2, 7, 10_000);
    let tokens: Vec<u32> = (0..80).collect();
    let mut held = vec![[true; 40]; ids.len()];
    for ((&id, holes), held) in ids.iter().zip(holes).zip(&mut held) {
        let hashes: Vec<u64> = (0..40).map(|j| u64::from(id) * 1000 + j).collect();
        ix.apply(
            EndpointId(id),
            &batch(Some("m"), vec![stored(&hashes, None, &tokens, 2)]),
        );
        for &j in holes {
            ix.apply(
                EndpointId(id),
                &batch(Some("m"), vec![removed(&[hashes[j]])]),
            );
            held[j] = false;
        }
    }
    let mut keys = Vec::new();
    ix.keys_of("m", None, &[], &tokens[..len * 2], 1000, &mut keys);
    let mut m = PrefixMatch::default();
    ix.lookup(&keys, &mut m);
    for (&id, held) in ids.iter().zip(&held) {
        let lead = held[..len].iter().take_while(|&&x| x).count() as u32;
        proptest::prop_assert_eq!(m.matched(EndpointId(id)), lead, "endpoint {}", id);
    }
    Ok(())
}

proptest::proptest! {
    /// Against a model, on prompts long enough for the lookup's groups of
    /// keys, with ids below and from 64 on, whatever the depths where
    /// matches end.
    #[test]
    fn long_matches_end_where_each_endpoint_stops_holding(
        holes in proptest::collection::vec(proptest::collection::vec(0usize..40, 0..3), 6),
        len in 1usize..=40,
    ) {
        check_long_matches(&[0, 1, 5, 63, 64, 70], &holes, len)?;
    }

    /// The same with ids below 64 only (the lookup's fast path throughout).
    #[test]
    fn long_matches_of_low_ids_end_where_each_stops_holding(
        holes in proptest::collection::vec(proptest::collection::vec(0usize..40, 0..3), 4),
    ) {
        check_long_matches(&[0, 3, 9, 62], &holes, 40)?;
    }
}

#[test]
fn ids_past_64_match_like_the_first_ones() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(12);
    let (low, high, higher) = (EndpointId(3), EndpointId(70), EndpointId(200));
    ix.apply(
        low,
        &batch(Some("m"), vec![stored(&[1, 2], None, &t[..8], 4)]),
    );
    ix.apply(
        high,
        &batch(Some("m"), vec![stored(&[1, 2, 3], None, &t, 4)]),
    );
    ix.apply(
        higher,
        &batch(Some("m"), vec![stored(&[1], None, &t[..4], 4)]),
    );
    let mut keys = Vec::new();
    ix.keys_of("m", None, &[], &t, 10, &mut keys);
    let mut m = PrefixMatch::default();
    ix.lookup(&keys, &mut m);
    assert_eq!(
        (m.matched(low), m.matched(high), m.matched(higher)),
        (2, 3, 1)
    );
    ix.apply(high, &batch(Some("m"), vec![removed(&[2])]));
    let mut m = PrefixMatch::default();
    ix.lookup(&keys, &mut m);
    assert_eq!(
        (m.matched(low), m.matched(high), m.matched(higher)),
        (2, 1, 1)
    );
    ix.clear(low);
    ix.clear(higher);
    ix.clear(high);
    assert!(ix.is_empty());
}

/// The keys of `tokens` for model "m".
fn keys_m(ix: &KvBlockIndex, tokens: &[u32]) -> Vec<u64> {
    let mut keys = Vec::new();
    ix.keys_of("m", None, &[], tokens, 10, &mut keys);
    keys
}

/// Keys of `seq(4)` shifted by `by`: a prompt sharing no block with `seq`.
fn other_keys(ix: &KvBlockIndex, by: u32) -> Vec<u64> {
    keys_m(ix, &seq(4).iter().map(|x| x + by).collect::<Vec<_>>())
}

#[test]
fn speculation_holds_until_its_time_is_up_and_real_blocks_outlive_it() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(8);
    let keys = keys_m(&ix, &t);
    let t0 = Instant::now();
    let ttl = Duration::from_secs(1);
    ix.speculate(A, &keys, t0, ttl);
    assert_eq!(matched(&ix, "m", &t).0, 2);
    // The engine reports the first block for real.
    ix.apply(A, &batch(Some("m"), vec![stored(&[1], None, &t[..4], 4)]));
    // Time is up (the next speculation on A expires the first).
    ix.speculate(A, &other_keys(&ix, 1), t0 + Duration::from_secs(2), ttl);
    assert_eq!(
        matched(&ix, "m", &t).0,
        1,
        "only the reported block is left"
    );
    assert_eq!(ix.counters().speculated.load(Ordering::Relaxed), 2);
    ix.clear(A);
    assert!(ix.is_empty());
}

#[test]
fn an_eviction_the_engine_reports_ends_a_speculation_at_once() {
    // Without this, a tenant picked every few seconds kept being "held" by
    // one speculation after another on a server that had evicted it.
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(8);
    let keys = keys_m(&ix, &t);
    let t0 = Instant::now();
    let ttl = Duration::from_secs(60);
    ix.speculate(A, &keys, t0, ttl);
    assert_eq!(matched(&ix, "m", &t).0, 2);
    // The engine reports the prompt, then evicts it, well within the TTL.
    ix.apply(A, &batch(Some("m"), vec![stored(&[1, 2], None, &t, 4)]));
    assert_eq!(matched(&ix, "m", &t).0, 2);
    ix.apply(A, &batch(Some("m"), vec![removed(&[2])]));
    assert_eq!(matched(&ix, "m", &t).0, 1);
    ix.apply(A, &batch(Some("m"), vec![removed(&[1])]));
    assert_eq!(matched(&ix, "m", &t).0, 0, "gone when the engine says so");
    assert!(ix.is_empty());
    // Sent there again: held on speculation again (it will be recomputed).
    ix.speculate(A, &keys, t0 + Duration::from_secs(1), ttl);
    assert_eq!(matched(&ix, "m", &t).0, 2);
}

#[test]
fn a_pick_of_what_the_engine_holds_adds_no_speculation() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(8);
    let keys = keys_m(&ix, &t);
    let t0 = Instant::now();
    let ttl = Duration::from_secs(60);
    // The engine holds the first block; a pick covers both.
    ix.apply(A, &batch(Some("m"), vec![stored(&[1], None, &t[..4], 4)]));
    ix.speculate(A, &keys, t0, ttl);
    assert_eq!(matched(&ix, "m", &t).0, 2);
    // The engine evicts the first block: nothing leads any more.
    ix.apply(A, &batch(Some("m"), vec![removed(&[1])]));
    assert_eq!(matched(&ix, "m", &t).0, 0);
    // The second block is still speculated until its time is up.
    ix.speculate(A, &other_keys(&ix, 1), t0 + ttl, ttl);
    ix.apply(A, &batch(Some("m"), vec![stored(&[1], None, &t[..4], 4)]));
    assert_eq!(
        matched(&ix, "m", &t).0,
        1,
        "the second block's speculation ended"
    );
}

#[test]
fn a_key_picked_again_holds_until_the_later_picks_time() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(8);
    let keys = keys_m(&ix, &t);
    let t0 = Instant::now();
    let ttl = Duration::from_secs(1);
    let at = |ms| t0 + Duration::from_millis(ms);
    ix.speculate(A, &keys, t0, ttl);
    ix.speculate(A, &keys, at(800), ttl);
    // The first pick's time is up (a speculation elsewhere on A expires it).
    ix.speculate(A, &other_keys(&ix, 1), at(1_500), ttl);
    assert_eq!(matched(&ix, "m", &t).0, 2, "the second pick still holds");
    ix.speculate(A, &other_keys(&ix, 2), at(1_900), ttl);
    assert_eq!(matched(&ix, "m", &t).0, 0);
    ix.clear(A);
    assert!(ix.is_empty());
}

fn matched_salted(index: &KvBlockIndex, model: &str, salt: Option<&str>, tokens: &[u32]) -> u32 {
    let mut keys = Vec::new();
    index.keys_of(model, salt, &[], tokens, 1000, &mut keys);
    let mut m = PrefixMatch::default();
    index.lookup(&keys, &mut m);
    m.matched(A)
}

/// vLLM hashes a request's `cache_salt` into its first block (after the
/// LoRA adapter and any multimodal items of that block) and reports it in
/// the event's `extra_keys`: salted blocks match only requests with the
/// same salt, their children follow, and an empty salt is no salt.
#[test]
fn a_salt_in_the_first_blocks_extra_keys_matches_only_the_same_salt() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(12);
    let text = |s: &str| ExtraKey::Text(s.into());
    let root = BlockStored {
        block_hashes: vec![1, 2],
        token_ids: t[..8].to_vec(),
        block_size: 4,
        extra_keys: vec![vec![text("tenant-a")], vec![]],
        ..BlockStored::default()
    };
    let child = BlockStored {
        block_hashes: vec![3],
        parent_block_hash: Some(2),
        token_ids: t[8..].to_vec(),
        block_size: 4,
        ..BlockStored::default()
    };
    ix.apply(
        A,
        &batch(
            Some("m"),
            vec![KvEvent::BlockStored(root), KvEvent::BlockStored(child)],
        ),
    );
    assert_eq!(matched_salted(&ix, "m", Some("tenant-a"), &t), 3);
    assert_eq!(matched_salted(&ix, "m", Some("tenant-b"), &t), 0);
    assert_eq!(matched_salted(&ix, "m", None, &t), 0);
    assert_eq!(matched_salted(&ix, "m", Some(""), &t), 0);

    // A LoRA adapter's name comes first and is already the root; an empty
    // salt is not hashed by vLLM, so the unsalted request matches.
    let lora = BlockStored {
        block_hashes: vec![7],
        token_ids: t[..4].to_vec(),
        block_size: 4,
        lora_name: Some("sql".into()),
        lora_id: Some(3),
        extra_keys: vec![vec![text("sql")]],
        ..BlockStored::default()
    };
    ix.apply(
        A,
        &batch(Some("m"), vec![KvEvent::BlockStored(lora.clone())]),
    );
    assert_eq!(matched_salted(&ix, "sql", Some(""), &t), 1);
    // The same with vLLM's older integer adapter ids, and a salt after it.
    let old = BlockStored {
        block_hashes: vec![8],
        extra_keys: vec![vec![ExtraKey::Int(3), text("t")]],
        lora_name: None,
        ..lora
    };
    ix.clear(A);
    ix.apply(A, &batch(Some("sql"), vec![KvEvent::BlockStored(old)]));
    assert_eq!(matched_salted(&ix, "sql", Some("t"), &t), 1);
    assert_eq!(matched_salted(&ix, "sql", None, &t), 0);

    // A multimodal item in the first block: a request matches it only with
    // the same item at a place in that block.
    let image = BlockStored {
        block_hashes: vec![9],
        token_ids: t[..4].to_vec(),
        block_size: 4,
        extra_keys: vec![vec![ExtraKey::Media {
            id: "img".into(),
            offset: 0,
        }]],
        ..BlockStored::default()
    };
    ix.clear(A);
    ix.apply(A, &batch(Some("m"), vec![KvEvent::BlockStored(image)]));
    assert_eq!(matched_salted(&ix, "m", None, &t), 0);
    assert_eq!(matched_media(&ix, &t, &[media("img", 1, 2)]), 1);
    assert_eq!(matched_media(&ix, &t, &[media("other", 1, 2)]), 0);
}

fn media(hash: &str, offset: u32, length: u32) -> MediaItem {
    MediaItem {
        modality: "image".into(),
        hash: hash.into(),
        placeholder: Some(epp_core::Placeholder { offset, length }),
    }
}

fn matched_media(index: &KvBlockIndex, tokens: &[u32], items: &[MediaItem]) -> u32 {
    let mut keys = Vec::new();
    index.keys_of("m", None, items, tokens, 1000, &mut keys);
    let mut m = PrefixMatch::default();
    index.lookup(&keys, &mut m);
    m.matched(A)
}

/// An image after the first block (its placeholder tokens are the same
/// whatever the image): the engine hashes its identifier into each block
/// the placeholder overlaps, and a request matches those blocks only with
/// the same image at the same place. Before, any image matched them.
#[test]
fn an_image_keys_the_blocks_it_overlaps() {
    let ix = KvBlockIndex::new(4, 1, 1000);
    let t = seq(16);
    let text = |s: &str| ExtraKey::Text(s.into());
    let stored = BlockStored {
        block_hashes: vec![1, 2, 3, 4],
        token_ids: t.clone(),
        block_size: 4,
        // Tokens 5..11 stand for the image: engine blocks 1 and 2.
        extra_keys: vec![vec![], vec![text("imgA")], vec![text("imgA")], vec![]],
        ..BlockStored::default()
    };
    ix.apply(A, &batch(Some("m"), vec![KvEvent::BlockStored(stored)]));
    assert_eq!(matched_media(&ix, &t, &[media("imgA", 5, 6)]), 4);
    assert_eq!(
        matched_media(&ix, &t, &[media("imgB", 5, 6)]),
        1,
        "another image"
    );
    assert_eq!(matched_media(&ix, &t, &[]), 1, "no image named");
    assert_eq!(
        matched_media(&ix, &t, &[media("imgA", 9, 2)]),
        1,
        "elsewhere"
    );
    let unplaced = MediaItem {
        placeholder: None,
        ..media("imgA", 5, 6)
    };
    let mut keys = vec![1];
    ix.keys_of("m", None, &[unplaced], &t, 1000, &mut keys);
    assert!(keys.is_empty(), "an item without a place: no keys at all");
}

/// Per engine block, vLLM's extra keys for `items` (`(hash, offset,
/// length)`, sorted by offset) as its `_gen_mm_extra_hash_keys` walks them:
/// the adapter's name first, the items whose placeholder the block
/// overlaps, the salt in the first block. Written from vLLM's rule, apart
/// from the index's code, for the test below to hold that code to it.
fn vllm_extra_keys(
    blocks: usize,
    size: usize,
    items: &[(String, usize, usize)],
    lora: Option<&str>,
    salt: Option<&str>,
) -> Vec<Vec<ExtraKey>> {
    let mut next = 0;
    (0..blocks)
        .map(|b| {
            let (start, end) = (b * size, (b + 1) * size);
            let mut keys: Vec<ExtraKey> =
                lora.map(|l| ExtraKey::Text(l.into())).into_iter().collect();
            let mut i = next;
            while i < items.len() {
                let (id, offset, length) = &items[i];
                if end <= *offset {
                    break;
                }
                if start > offset + length {
                    i += 1;
                    continue;
                }
                keys.push(ExtraKey::Text(id.clone()));
                if end >= offset + length {
                    i += 1;
                } else {
                    break;
                }
            }
            next = i;
            if b == 0
                && let Some(salt) = salt
            {
                keys.push(ExtraKey::Text(salt.into()));
            }
            keys
        })
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Whatever the block sizes (the engine's and the index's apart), the
    /// images (several, adjacent, repeated), a LoRA adapter and a salt: a
    /// request keyed from its items' places matches every block the engine
    /// reported for it, and with one image swapped for another it matches
    /// none from the first block holding that image on.
    #[test]
    fn requests_key_media_as_the_engine_hashes_it(
        engine in 1usize..9,
        index in 1usize..9,
        len in 1usize..120,
        images in proptest::collection::vec((0u8..3, 0usize..6, 1usize..20), 0..4),
        lora in proptest::bool::ANY,
        salt in proptest::option::of("[a-c]{0,2}"),
        swap in 0usize..4,
    ) {
        let tokens: Vec<u32> = (0..len as u32).map(|i| i % 5).collect();
        // Placeholders one after another from the gaps drawn, within the prompt.
        let mut items = Vec::new();
        let mut at = 0;
        for (which, gap, length) in images {
            let offset = at + gap;
            if offset + length > len {
                break;
            }
            items.push((format!("img{which}"), offset, length));
            at = offset + length;
        }
        let blocks = len / engine;
        let lora_name = lora.then_some("sql");
        let salt = salt.filter(|s| !s.is_empty());
        let ix = KvBlockIndex::new(index, 1, 1_000_000);
        let event = BlockStored {
            block_hashes: (1..=blocks as u64).collect(),
            token_ids: tokens[..blocks * engine].to_vec(),
            block_size: engine as u32,
            lora_name: lora_name.map(str::to_owned),
            extra_keys: vllm_extra_keys(blocks, engine, &items, lora_name, salt.as_deref()),
            ..BlockStored::default()
        };
        ix.apply(A, &batch(Some("m"), vec![KvEvent::BlockStored(event)]));
        let model = lora_name.unwrap_or("m");
        let request = |items: &[(String, usize, usize)]| {
            let media: Vec<MediaItem> = items
                .iter()
                .map(|(id, offset, length)| media(id, *offset as u32, *length as u32))
                .collect();
            let mut keys = Vec::new();
            ix.keys_of(model, salt.as_deref(), &media, &tokens, 1000, &mut keys);
            let mut m = PrefixMatch::default();
            ix.lookup(&keys, &mut m);
            (m.matched(A) as usize, keys.len())
        };
        let whole = blocks * engine / index;
        let (matched, keys) = request(&items);
        proptest::prop_assert_eq!(matched, whole);
        if !items.is_empty() {
            // Keyed by whole engine blocks (a partial one is never stored).
            proptest::prop_assert_eq!(keys, whole);
        }
        if let Some(i) = (!items.is_empty()).then(|| swap % items.len()) {
            let mut other = items.clone();
            other[i].0 = "another".into();
            // The first index block with a token of the engine block where
            // the image's placeholder starts keys it (the first engine
            // block's keys sit in the root).
            let (_, offset, _) = items[i];
            let first = if offset < engine { 0 } else { (offset / engine) * engine / index };
            let (matched, _) = request(&other);
            proptest::prop_assert_eq!(matched, first.min(whole));
        }
    }
}

/// Block keys depend on the parent, on every token and on where it sits
/// (groups of a block swapped, or a token moved, give another key), and
/// near-identical blocks spread over a table's low bits, which the index
/// uses as they are.
#[test]
fn block_keys_depend_on_order_and_parent_and_spread() {
    let block: Vec<u32> = (0..64).map(|i| 1000 + i).collect();
    let k = block_key(7, &block);
    assert_ne!(k, block_key(8, &block), "parent");
    let mut swapped = block.clone();
    swapped[..4].copy_from_slice(&block[16..20]);
    swapped[16..20].copy_from_slice(&block[..4]);
    assert_ne!(k, block_key(7, &swapped), "groups four apart swapped");
    let mut moved = block.clone();
    moved.swap(0, 1);
    assert_ne!(k, block_key(7, &moved), "two tokens swapped");
    assert_ne!(
        block_key(7, &[1, 2, 3]),
        block_key(7, &[1, 2, 3, 0]),
        "length"
    );
    assert_ne!(
        block_key(7, &[]),
        block_key(8, &[]),
        "an empty block still chains"
    );

    const BUCKETS: usize = 1024;
    let mut counts = vec![0u32; BUCKETS];
    let mut seen = std::collections::HashSet::new();
    let mut b = vec![5u32; 16];
    for i in 0..64 * BUCKETS as u32 {
        b[0] = i;
        let key = block_key(0, &b);
        counts[key as usize % BUCKETS] += 1;
        seen.insert(key);
    }
    assert_eq!(seen.len(), 64 * BUCKETS, "no collision");
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(
        *min > 30 && *max < 110,
        "buckets between {min} and {max} (64 expected)"
    );
}

/// Structured near-misses keep distinct keys: every block that differs from
/// a base block in one token (any position of 16, any of 4,096 values), in
/// two tokens that share a product (positions j and j + 8), or in the
/// order of the 16-token chunks of a 64-token block.
#[test]
fn block_keys_tell_apart_one_and_two_token_changes() {
    let base: Vec<u32> = (0..16).map(|i| 100 + 37 * i).collect();
    let mut seen = std::collections::HashSet::new();
    seen.insert(block_key(0, &base));
    for pos in 0..16 {
        for v in 0..4096u32 {
            if v == base[pos] {
                continue;
            }
            let mut b = base.clone();
            b[pos] = v;
            assert!(seen.insert(block_key(0, &b)), "token {pos} = {v}");
        }
    }
    // Both tokens of one product changed together.
    for j in 0..8 {
        for (a, c) in (0..64u32).flat_map(|a| (0..64u32).map(move |c| (a, c))) {
            let mut b = base.clone();
            b[j] = 5000 + a;
            b[j + 8] = 5000 + c;
            assert!(seen.insert(block_key(0, &b)), "pair {j}: {a}, {c}");
        }
    }
    let long: Vec<u32> = (0..64).map(|i| 7 * i + 3).collect();
    let mut chunks_swapped = long.clone();
    chunks_swapped[..16].copy_from_slice(&long[16..32]);
    chunks_swapped[16..32].copy_from_slice(&long[..16]);
    assert_ne!(
        block_key(0, &long),
        block_key(0, &chunks_swapped),
        "chunks swapped"
    );
}
