//! A block-level prefix cache: chained block hashes, reference counts for
//! blocks in use, LRU eviction of unreferenced blocks.

use std::collections::{BTreeSet, HashMap};

/// Hashes `text` in blocks of `block_chars` characters (bytes), each hash
/// chained to the previous one so a block only matches after the same prefix.
/// A trailing partial block is not cached (as in vLLM).
#[must_use]
pub fn block_hashes(text: &[u8], block_chars: usize, seed: u64) -> Vec<u64> {
    let block_chars = block_chars.max(1);
    let mut prev = seed ^ 0x9e37_79b9_7f4a_7c15;
    text.chunks_exact(block_chars)
        .map(|block| {
            // FNV-1a over the block, mixed with the previous hash.
            let mut h = prev ^ 0xcbf2_9ce4_8422_2325;
            for &b in block {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            prev = h.rotate_left(17) ^ prev.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            prev
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    refs: u32,
    tick: u64,
}

/// The cache. Capacity is in blocks; referenced blocks are never evicted, so
/// the cache can temporarily exceed capacity when every block is in use.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    entries: HashMap<u64, Entry>,
    /// Unreferenced blocks by last use.
    lru: BTreeSet<(u64, u64)>,
    tick: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity` blocks.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
            lru: BTreeSet::new(),
            tick: 0,
        }
    }

    /// Contiguous blocks from the start already cached.
    #[must_use]
    pub fn hits(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    /// Pins `hashes` for a running request (inserting missing ones), then
    /// evicts unreferenced blocks beyond capacity.
    pub fn acquire(&mut self, hashes: &[u64]) {
        for &h in hashes {
            match self.entries.get_mut(&h) {
                Some(e) => {
                    if e.refs == 0 {
                        self.lru.remove(&(e.tick, h));
                    }
                    e.refs += 1;
                }
                None => {
                    self.entries.insert(h, Entry { refs: 1, tick: 0 });
                }
            }
        }
        while self.entries.len() > self.capacity {
            let Some((_, h)) = self.lru.pop_first() else {
                break;
            };
            self.entries.remove(&h);
        }
    }

    /// Unpins `hashes` when a request finishes; they stay cached until evicted.
    pub fn release(&mut self, hashes: &[u64]) {
        for &h in hashes {
            if let Some(e) = self.entries.get_mut(&h) {
                e.refs = e.refs.saturating_sub(1);
                if e.refs == 0 {
                    self.tick += 1;
                    e.tick = self.tick;
                    self.lru.insert((e.tick, h));
                }
            }
        }
    }

    /// Blocks cached (referenced or not).
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
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
        assert_ne!(a, block_hashes(b"aaaabbbb", 4, 2), "seed separates");
    }

    #[test]
    fn hits_are_contiguous_and_eviction_is_lru_of_unreferenced() {
        let mut c = PrefixCache::new(4);
        let a = block_hashes(b"1111222233334444", 4, 0);
        c.acquire(&a);
        assert_eq!(c.hits(&a), 4);
        c.release(&a);
        let b = block_hashes(b"5555666677778888", 4, 0);
        c.acquire(&b[..2]);
        // Two of a's blocks (the least recently released first) were evicted.
        assert_eq!(c.len(), 4);
        assert_eq!(
            c.hits(&a),
            0,
            "a's first block went first: no contiguous hit"
        );
        c.release(&b[..2]);
    }

    #[test]
    fn referenced_blocks_are_never_evicted() {
        let mut c = PrefixCache::new(2);
        let a = block_hashes(b"11112222", 4, 0);
        let b = block_hashes(b"33334444", 4, 0);
        c.acquire(&a);
        c.acquire(&b);
        assert_eq!(c.len(), 4, "over capacity while everything is pinned");
        assert_eq!(c.hits(&a), 2);
        c.release(&a);
        c.acquire(&[]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.hits(&b), 2);
    }
}
