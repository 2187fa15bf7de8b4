//! The KV block pool with automatic prefix caching, the way vLLM's block
//! manager behaves: one pool of `--num-gpu-blocks` blocks; full prompt blocks
//! are identified by a chained hash and shared between requests; blocks no
//! request references stay cached but are free, and are evicted least recently
//! freed first when a new block is needed.
//!
//! Blocks are keyed by characters ([`block_hashes`]) or, when the request's
//! token ids are known, by tokens ([`token_block_hashes`]). With events on
//! ([`BlockPool::record_events`]) the pool notes, in order, every token block
//! it caches and every one it evicts, the way vLLM's block pool queues its KV
//! cache events; the engine drains them once per step.

use std::collections::{BTreeMap, HashMap};

use crate::engine::MediaPlace;

/// Hashes `text` in blocks of `block_chars` bytes, each hash chained to the
/// previous one (and to `salt`) so a block only matches after the same prefix.
/// A trailing partial block gets no hash: only full blocks are cached.
#[must_use]
pub fn block_hashes(text: &[u8], block_chars: usize, salt: u64) -> Vec<u64> {
    let block_chars = block_chars.max(1);
    let mut prev = splitmix(salt);
    text.chunks_exact(block_chars)
        .map(|block| {
            // FNV-1a over the block, seeded with the parent's hash.
            let mut h = prev ^ 0xcbf2_9ce4_8422_2325;
            for &b in block {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            prev = splitmix(h);
            prev
        })
        .collect()
}

/// Hashes `tokens` in blocks of `block_size` token ids, chained like
/// [`block_hashes`]: a block's hash covers its parent's hash, its own ids,
/// the identifiers of the `media` items whose placeholder it overlaps (as
/// vLLM's extra keys) and (through the first parent) `salt`. A trailing
/// partial block gets no hash.
#[must_use]
pub fn token_block_hashes(
    tokens: &[u32],
    block_size: usize,
    salt: u64,
    media: &[MediaPlace],
) -> Vec<u64> {
    let block_size = block_size.max(1);
    // A different seed than the character path: the two key spaces never meet.
    let mut prev = splitmix(salt ^ 0x746f_6b65_6e73_0000);
    tokens
        .chunks_exact(block_size)
        .enumerate()
        .map(|(i, block)| {
            let mut h = prev ^ 0xcbf2_9ce4_8422_2325;
            let extras = block_media(media, i, block_size).flat_map(str::bytes);
            for b in block.iter().flat_map(|t| t.to_le_bytes()).chain(extras) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            prev = splitmix(h);
            prev
        })
        .collect()
}

/// The identifiers of the `media` items whose placeholder has a token in
/// block `index` (of `block_size` tokens), in order.
fn block_media(
    media: &[MediaPlace],
    index: usize,
    block_size: usize,
) -> impl Iterator<Item = &str> {
    let (start, end) = (index * block_size, (index + 1) * block_size);
    media
        .iter()
        .filter(move |m| m.overlaps(start, end))
        .map(|m| m.hash.as_str())
}

/// The hash of block `index` of a request's generated tokens after the
/// block hashed `parent` (its prompt's last full block, or the output block
/// before): `nonce` is the request's own, so no other request's block has
/// it, as no other request generates the same tokens after the same prefix.
#[must_use]
pub fn output_block_hash(parent: u64, nonce: u64, index: usize) -> u64 {
    splitmix(parent ^ splitmix(nonce ^ index as u64) ^ 0x6f75_7470_7574_0000)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Debug, Clone, Copy)]
struct Cached {
    refs: u32,
    /// Position in the free list while `refs == 0`.
    freed_at: u64,
    /// A token block announced with a stored event (its eviction is too).
    announced: bool,
}

/// The LoRA adapter a block was computed with, as KV events name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraTag {
    /// 1-based position in `--lora-modules`.
    pub id: u32,
    /// The adapter's name.
    pub name: String,
}

/// Where the blocks handed to [`BlockPool::take_from`] come from: a request's
/// token ids, so newly cached blocks can be announced.
#[derive(Debug, Clone, Copy)]
pub struct BlockSource<'a> {
    /// The request's prompt token ids.
    pub tokens: &'a [u32],
    /// Tokens per block.
    pub block_size: usize,
    /// All the request's block hashes (those taken are a slice of them).
    pub hashes: &'a [u64],
    /// Index in `hashes` of the first block taken.
    pub first: usize,
    /// The request's adapter.
    pub lora: Option<&'a LoraTag>,
    /// The request's `cache_salt` (never empty: vLLM ignores an empty one).
    pub salt: Option<&'a str>,
    /// The request's media items placed among `tokens`.
    pub media: &'a [MediaPlace],
}

/// A change of the cached token blocks, in vLLM's KV event terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// Consecutive blocks of one request became cached.
    Stored {
        /// Their hashes, in prompt order.
        hashes: Vec<u64>,
        /// The hash of the block before the first one (`None`: the prompt's
        /// first block).
        parent: Option<u64>,
        /// All their token ids, concatenated.
        token_ids: Vec<u32>,
        /// The adapter they were computed with.
        lora: Option<LoraTag>,
        /// The request's cache salt, hashed into the prompt's first block:
        /// set only when that block is the first of this event.
        salt: Option<String>,
        /// Per block (empty, or one list per hash): the identifiers of the
        /// media items it overlaps, hashed into it.
        media: Vec<Vec<String>>,
    },
    /// Cached blocks were evicted.
    Removed {
        /// Their hashes.
        hashes: Vec<u64>,
    },
    /// Every cached block was dropped.
    AllCleared,
}

/// The pool. Invariant: `cached.len() + private <= capacity`.
#[derive(Debug)]
pub struct BlockPool {
    capacity: usize,
    cached: HashMap<u64, Cached>,
    /// Unreferenced cached blocks, oldest free first (eviction order).
    free_list: BTreeMap<u64, u64>,
    /// Blocks without a hash (partial prompt blocks, generated tokens).
    private: usize,
    clock: u64,
    /// Changes not yet drained, when events are on.
    events: Option<Vec<PoolEvent>>,
}

impl BlockPool {
    /// An empty pool of `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            cached: HashMap::new(),
            free_list: BTreeMap::new(),
            private: 0,
            clock: 0,
            events: None,
        }
    }

    /// Starts noting cache changes for [`BlockPool::take_events`].
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// Whether changes are noted.
    #[must_use]
    pub fn records_events(&self) -> bool {
        self.events.is_some()
    }

    /// The changes noted since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Total blocks.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks referenced by at least one request.
    #[must_use]
    pub fn used(&self) -> usize {
        self.cached.len() - self.free_list.len() + self.private
    }

    /// Blocks a request could still take (empty or evictable).
    #[must_use]
    pub fn free(&self) -> usize {
        self.capacity - self.used()
    }

    /// Blocks holding a hash (referenced or cached for reuse).
    #[must_use]
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// How many leading blocks of `hashes` are cached.
    #[must_use]
    pub fn hits(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Free blocks that taking `hashes` plus `private` new blocks would use.
    fn cost(&self, hashes: &[u64], private: usize) -> usize {
        let shared_in_use = hashes
            .iter()
            .filter(|h| self.cached.get(h).is_some_and(|c| c.refs > 0))
            .count();
        hashes.len() - shared_in_use + private
    }

    /// References `hashes` (sharing cached ones, caching new ones) and takes
    /// `private` unhashed blocks. All or nothing: returns false, changing
    /// nothing, when the pool has too few free blocks.
    pub fn take(&mut self, hashes: &[u64], private: usize) -> bool {
        self.take_from(hashes, private, None)
    }

    /// [`BlockPool::take`] for blocks of a request whose token ids are known
    /// (`source`): each newly cached block is noted as stored.
    pub fn take_from(
        &mut self,
        hashes: &[u64],
        private: usize,
        source: Option<&BlockSource<'_>>,
    ) -> bool {
        if self.cost(hashes, private) > self.free() {
            return false;
        }
        for (k, &h) in hashes.iter().enumerate() {
            if let Some(c) = self.cached.get_mut(&h) {
                if c.refs == 0 {
                    self.free_list.remove(&c.freed_at);
                }
                c.refs += 1;
            } else {
                self.make_room();
                let announced = match (source, self.events.as_mut()) {
                    (Some(src), Some(events)) => note_stored(events, src, src.first + k),
                    _ => false,
                };
                self.cached.insert(
                    h,
                    Cached {
                        refs: 1,
                        freed_at: 0,
                        announced,
                    },
                );
            }
        }
        for _ in 0..private {
            self.make_room();
            self.private += 1;
        }
        true
    }

    /// Evicts the least recently freed block if the pool is full.
    fn make_room(&mut self) {
        if self.cached.len() + self.private >= self.capacity
            && let Some((_, h)) = self.free_list.pop_first()
            && self.cached.remove(&h).is_some_and(|c| c.announced)
            && let Some(events) = self.events.as_mut()
        {
            match events.last_mut() {
                Some(PoolEvent::Removed { hashes }) => hashes.push(h),
                _ => events.push(PoolEvent::Removed { hashes: vec![h] }),
            }
        }
    }

    /// Drops every cached block, as vLLM's `reset_prefix_cache` does: only
    /// when no request holds a block (returns false, changing nothing,
    /// otherwise). Notes one [`PoolEvent::AllCleared`].
    pub fn reset(&mut self) -> bool {
        if self.used() > 0 {
            return false;
        }
        self.cached.clear();
        self.free_list.clear();
        if let Some(events) = self.events.as_mut() {
            events.push(PoolEvent::AllCleared);
        }
        true
    }

    /// Drops a request's references. Hashed blocks stay cached, freed in
    /// reverse so a prompt's tail is evicted before its head (as vLLM does).
    pub fn give_back(&mut self, hashes: &[u64], private: usize) {
        for &h in hashes.iter().rev() {
            if let Some(c) = self.cached.get_mut(&h) {
                c.refs = c.refs.saturating_sub(1);
                if c.refs == 0 {
                    self.clock += 1;
                    c.freed_at = self.clock;
                    self.free_list.insert(self.clock, h);
                }
            }
        }
        self.private = self.private.saturating_sub(private);
    }
}

/// Notes block `index` of `src` as stored, extending the last stored event
/// when it ends with this block's parent. False when the block has no tokens.
fn note_stored(events: &mut Vec<PoolEvent>, src: &BlockSource<'_>, index: usize) -> bool {
    let bs = src.block_size.max(1);
    let (Some(&hash), Some(ids)) = (
        src.hashes.get(index),
        src.tokens.get(index * bs..(index + 1) * bs),
    ) else {
        return false;
    };
    let parent = index
        .checked_sub(1)
        .and_then(|p| src.hashes.get(p))
        .copied();
    let here: Vec<String> = block_media(src.media, index, bs)
        .map(str::to_owned)
        .collect();
    if let Some(PoolEvent::Stored {
        hashes,
        token_ids,
        lora,
        media,
        ..
    }) = events.last_mut()
        && parent.is_some()
        && hashes.last().copied() == parent
        && lora.as_ref() == src.lora
    {
        if !here.is_empty() || !media.is_empty() {
            media.resize(hashes.len(), Vec::new());
            media.push(here);
        }
        hashes.push(hash);
        token_ids.extend_from_slice(ids);
        return true;
    }
    events.push(PoolEvent::Stored {
        hashes: vec![hash],
        parent,
        token_ids: ids.to_vec(),
        lora: src.lora.cloned(),
        salt: if index == 0 {
            src.salt.map(str::to_owned)
        } else {
            None
        },
        media: if here.is_empty() {
            Vec::new()
        } else {
            vec![here]
        },
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_skip_partial_blocks() {
        let a = block_hashes(b"aaaabbbbcc", 4, 1);
        let b = block_hashes(b"xxxxbbbb", 4, 1);
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1], "same block after a different prefix differs");
        assert_eq!(a, block_hashes(b"aaaabbbbzz", 4, 1));
        assert_ne!(a, block_hashes(b"aaaabbbb", 4, 2), "salt separates");
    }

    #[test]
    fn shared_blocks_count_once_and_freed_blocks_stay_cached() {
        let mut p = BlockPool::new(8);
        let a = block_hashes(b"1111222233334444", 4, 0);
        assert!(p.take(&a, 1));
        assert!(p.take(&a[..2], 1), "a second request shares two blocks");
        assert_eq!((p.used(), p.free()), (6, 2));
        p.give_back(&a, 1);
        p.give_back(&a[..2], 1);
        assert_eq!((p.used(), p.free(), p.cached_blocks()), (0, 8, 4));
        assert_eq!(p.hits(&a), 4);
    }

    #[test]
    fn eviction_takes_the_least_recently_freed_tail_first() {
        let mut p = BlockPool::new(4);
        let a = block_hashes(b"1111222233334444", 4, 0);
        assert!(p.take(&a, 0));
        p.give_back(&a, 0);
        assert!(
            p.take(&[], 2),
            "two private blocks evict a's two tail blocks"
        );
        assert_eq!(p.hits(&a), 2, "a's head survives");
        p.give_back(&[], 2);
    }

    #[test]
    fn referenced_blocks_are_never_evicted_and_take_is_all_or_nothing() {
        let mut p = BlockPool::new(4);
        let a = block_hashes(b"11112222", 4, 0);
        let b = block_hashes(b"333344445555", 4, 0);
        assert!(p.take(&a, 0));
        assert!(!p.take(&b, 0), "three blocks do not fit in two");
        assert_eq!((p.used(), p.cached_blocks()), (2, 2), "nothing changed");
        assert!(p.take(&b[..2], 0));
        assert_eq!(p.free(), 0);
        p.give_back(&a, 0);
        assert!(p.take(&b[2..], 0));
        assert_eq!(p.hits(&a), 1, "only a's tail was evicted");
    }

    fn src<'a>(tokens: &'a [u32], hashes: &'a [u64], first: usize) -> BlockSource<'a> {
        BlockSource {
            tokens,
            block_size: 2,
            hashes,
            first,
            lora: None,
            salt: None,
            media: &[],
        }
    }

    #[test]
    fn token_blocks_are_announced_once_chained_and_their_eviction_too() {
        let mut p = BlockPool::new(3);
        p.record_events();
        let tokens = [1, 2, 3, 4, 5, 6, 7];
        let h = token_block_hashes(&tokens, 2, 0, &[]);
        assert_eq!(h.len(), 3, "the partial block has no hash");
        assert!(p.take_from(&h[..1], 0, Some(&src(&tokens, &h, 0))));
        assert!(p.take_from(&h[1..], 0, Some(&src(&tokens, &h, 1))));
        let stored = PoolEvent::Stored {
            hashes: h.clone(),
            parent: None,
            token_ids: tokens[..6].to_vec(),
            lora: None,
            salt: None,
            media: Vec::new(),
        };
        assert_eq!(p.take_events(), [stored], "consecutive blocks, one event");
        assert!(p.take_from(&h, 0, Some(&src(&tokens, &h, 0))));
        assert_eq!(p.take_events(), [], "shared blocks are not stored again");
        p.give_back(&h, 0);
        p.give_back(&h, 0);
        assert!(p.take(&[], 2), "two private blocks evict the tail");
        assert_eq!(
            p.take_events(),
            [PoolEvent::Removed {
                hashes: vec![h[2], h[1]]
            }]
        );
        p.give_back(&[], 2);
        assert!(p.take_from(&h[1..2], 0, Some(&src(&tokens, &h, 1))));
        assert_eq!(
            p.take_events(),
            [PoolEvent::Stored {
                hashes: vec![h[1]],
                parent: Some(h[0]),
                token_ids: vec![3, 4],
                lora: None,
                salt: None,
                media: Vec::new(),
            }]
        );
        // A salted prompt: the salt goes with its first block only.
        let mut p = BlockPool::new(4);
        p.record_events();
        let salted = BlockSource {
            salt: Some("t"),
            ..src(&tokens, &h, 1)
        };
        assert!(p.take_from(&h[1..2], 0, Some(&salted)));
        assert!(p.take_from(&h[..1], 0, Some(&BlockSource { first: 0, ..salted })));
        let events = p.take_events();
        let salts: Vec<Option<&str>> = events
            .iter()
            .map(|e| match e {
                PoolEvent::Stored { salt, .. } => salt.as_deref(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(salts, [None, Some("t")]);
    }

    /// An image standing for tokens 3..6: it is hashed into blocks 1 and 2
    /// (of 2 tokens), which another image at the same place does not share,
    /// and their stored event names it per block.
    #[test]
    fn media_items_are_hashed_into_and_announced_with_the_blocks_they_overlap() {
        let tokens = [1, 2, 0, 0, 0, 6, 7, 8];
        let image = |hash: &str| MediaPlace {
            modality: "image",
            hash: hash.into(),
            offset: 2,
            length: 3,
        };
        let a = [image("a")];
        let h = token_block_hashes(&tokens, 2, 0, &a);
        let other = token_block_hashes(&tokens, 2, 0, &[image("b")]);
        let plain = token_block_hashes(&tokens, 2, 0, &[]);
        assert_eq!(h[0], other[0]);
        assert_eq!(h[0], plain[0]);
        assert!((1..4).all(|i| h[i] != other[i] && h[i] != plain[i]));
        let mut p = BlockPool::new(8);
        p.record_events();
        let source = BlockSource {
            media: &a,
            ..src(&tokens, &h, 0)
        };
        assert!(p.take_from(&h, 0, Some(&source)));
        let events = p.take_events();
        let [PoolEvent::Stored { media, .. }] = &events[..] else {
            panic!("{events:?}");
        };
        let a = || vec!["a".to_owned()];
        assert_eq!(media, &[vec![], a(), a(), vec![]]);
    }

    #[test]
    fn char_blocks_make_no_events_and_reset_waits_for_free_blocks() {
        let mut p = BlockPool::new(2);
        p.record_events();
        let a = block_hashes(b"11112222", 4, 0);
        assert!(p.take(&a, 0));
        assert!(!p.reset(), "blocks in use: nothing reset");
        p.give_back(&a, 0);
        assert!(p.take(&[], 2));
        assert_eq!(p.take_events(), [], "evicting char blocks says nothing");
        p.give_back(&[], 2);
        assert!(p.reset());
        assert_eq!(p.take_events(), [PoolEvent::AllCleared]);
        assert_eq!(p.cached_blocks(), 0);
    }
}
