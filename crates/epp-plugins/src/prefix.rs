//! `prefix-cache-scorer`: prefer endpoints that likely hold the request's
//! prompt prefix in their KV cache, from an approximate index of what this
//! picker sent where.
//!
//! The prompt is cut into blocks of `blockSizeTokens × 4` characters; each
//! block's 64-bit hash is chained to the previous one and seeded with the
//! target model and `cache_salt`, so equal blocks only match after an equal
//! prefix, for the same model and tenant. The score is the number of blocks
//! matched CONTIGUOUSLY from the start, over the request's blocks (the
//! reference can count non-contiguous blocks; a block after a gap is never
//! cached by a real engine). After each decision the request's blocks are
//! recorded for the chosen endpoint in a bounded per-endpoint LRU.

use std::collections::{HashMap, VecDeque};

use epp_core::{
    BuildError, CHARS_PER_TOKEN, Candidate, CycleContext, DataProducer, EndpointId, Plugin,
    PreRequest, PrefixMatch, SchedulingResult, Scorer,
};
use parking_lot::RwLock;

/// Parameters (REFERENCE §4 defaults).
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixCacheParams {
    /// Tokens per block (× 4 characters). Default 16.
    #[serde(default = "default_block")]
    pub block_size_tokens: usize,
    /// Blocks of a prompt considered at most. Default 256.
    #[serde(default = "default_max_blocks")]
    pub max_prefix_blocks_to_match: usize,
    /// Blocks remembered per endpoint. Default 31250.
    #[serde(default = "default_capacity")]
    pub lru_capacity_per_server: usize,
    /// Take each endpoint's capacity from the cache geometry it reports.
    #[serde(default = "default_true")]
    pub auto_tune: bool,
}

fn default_block() -> usize {
    16
}
fn default_max_blocks() -> usize {
    256
}
fn default_capacity() -> usize {
    31_250
}
fn default_true() -> bool {
    true
}

impl Default for PrefixCacheParams {
    fn default() -> Self {
        Self {
            block_size_tokens: default_block(),
            max_prefix_blocks_to_match: default_max_blocks(),
            lru_capacity_per_server: default_capacity(),
            auto_tune: true,
        }
    }
}

impl PrefixCacheParams {
    /// Checks ranges.
    ///
    /// # Errors
    /// Any of the sizes being zero.
    pub fn validated(self) -> Result<Self, BuildError> {
        for (field, v) in [
            ("blockSizeTokens", self.block_size_tokens),
            ("maxPrefixBlocksToMatch", self.max_prefix_blocks_to_match),
            ("lruCapacityPerServer", self.lru_capacity_per_server),
        ] {
            if v == 0 {
                return Err(BuildError::InvalidValue {
                    plugin: PrefixCacheScorer::TYPE.into(),
                    field: field.into(),
                    value: "0".into(),
                    reason: "must be at least 1".into(),
                });
            }
        }
        Ok(self)
    }
}

/// Chained block hashes of `text` (full blocks only, at most `max_blocks`),
/// appended to `out`.
pub fn block_hashes(
    text: &[u8],
    block_chars: usize,
    max_blocks: usize,
    seed: u64,
    out: &mut Vec<u64>,
) {
    let mut prev = seed;
    for block in text.chunks_exact(block_chars.max(1)).take(max_blocks) {
        prev = hash_block(block, prev);
        out.push(prev);
    }
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(K).rotate_left(29)
}

/// Hashes a block with the previous hash as the seed, a word at a time.
fn hash_block(block: &[u8], seed: u64) -> u64 {
    let mut h = seed ^ (block.len() as u64).wrapping_mul(K);
    let mut words = block.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = mix(h, u64::from_le_bytes(b));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = mix(h, u64::from_le_bytes(tail));
    // Final avalanche.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Seed for a request: target model and cache salt.
fn seed(model: &str, salt: Option<&str>) -> u64 {
    let mut h = hash_block(model.as_bytes(), 0x5eed);
    if let Some(salt) = salt {
        h = hash_block(salt.as_bytes(), h);
    }
    h
}

#[derive(Debug, Default)]
struct EndpointLru {
    /// Live blocks → the tick of their last use.
    live: HashMap<u64, u64>,
    /// Uses in order; entries whose tick is no longer live are skipped.
    order: VecDeque<(u64, u64)>,
    tick: u64,
}

/// The approximate index: which endpoint was sent which blocks, bounded per
/// endpoint. Safe to share; reads take a read lock only.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<u64, Vec<EndpointId>>,
    endpoints: HashMap<EndpointId, EndpointLru>,
}

impl PrefixIndex {
    /// Records `hashes` as cached on `id`, evicting its least recently used
    /// blocks beyond `capacity`.
    pub fn record(&self, id: EndpointId, hashes: &[u64], capacity: usize) {
        let mut inner = self.inner.write();
        let Inner { blocks, endpoints } = &mut *inner;
        let lru = endpoints.entry(id).or_default();
        for &h in hashes {
            lru.tick += 1;
            if lru.live.insert(h, lru.tick).is_none() {
                blocks.entry(h).or_default().push(id);
            }
            lru.order.push_back((h, lru.tick));
        }
        while lru.live.len() > capacity {
            let Some((h, t)) = lru.order.pop_front() else {
                break;
            };
            if lru.live.get(&h) == Some(&t) {
                lru.live.remove(&h);
                if let Some(ids) = blocks.get_mut(&h) {
                    ids.retain(|&e| e != id);
                    if ids.is_empty() {
                        blocks.remove(&h);
                    }
                }
            }
        }
        if lru.order.len() > 2 * lru.live.len() + 1024 {
            let mut order: Vec<(u64, u64)> = lru.live.iter().map(|(&h, &t)| (h, t)).collect();
            order.sort_unstable_by_key(|&(_, t)| t);
            lru.order = order.into();
        }
    }

    /// Forgets everything recorded for `id` (an endpoint that left).
    pub fn forget(&self, id: EndpointId) {
        let mut inner = self.inner.write();
        let Inner { blocks, endpoints } = &mut *inner;
        if let Some(lru) = endpoints.remove(&id) {
            for h in lru.live.keys() {
                if let Some(ids) = blocks.get_mut(h) {
                    ids.retain(|&e| e != id);
                    if ids.is_empty() {
                        blocks.remove(h);
                    }
                }
            }
        }
    }

    /// Writes into `m`, per endpoint, how many leading blocks of `hashes` it
    /// holds (contiguously from the first block).
    pub fn match_prefix(&self, hashes: &[u64], m: &mut PrefixMatch) {
        let inner = self.inner.read();
        for (i, h) in hashes.iter().enumerate() {
            let Some(ids) = inner.blocks.get(h) else {
                break;
            };
            let mut advanced = false;
            for &id in ids {
                if m.matched(id) as usize == i {
                    m.set_matched(id, i as u32 + 1);
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
        }
    }

    /// Blocks remembered for `id`.
    #[must_use]
    pub fn len_for(&self, id: EndpointId) -> usize {
        self.inner
            .read()
            .endpoints
            .get(&id)
            .map_or(0, |l| l.live.len())
    }

    /// Endpoints with any block remembered.
    #[must_use]
    pub fn endpoint_count(&self) -> usize {
        self.inner.read().endpoints.len()
    }
}

/// `prefix-cache-scorer` with its own approximate index: computes the
/// request's block hashes once per cycle (unless another producer already
/// did), matches them, scores, and records the pick.
#[derive(Debug)]
pub struct PrefixCacheScorer {
    name: String,
    params: PrefixCacheParams,
    index: PrefixIndex,
}

impl PrefixCacheScorer {
    /// YAML type.
    pub const TYPE: &'static str = "prefix-cache-scorer";

    /// A scorer named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>, params: PrefixCacheParams) -> Self {
        Self {
            name: name.into(),
            params,
            index: PrefixIndex::default(),
        }
    }

    /// The index (for inspection and tests).
    #[must_use]
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    fn capacity_for(&self, c: &Candidate) -> usize {
        match (self.params.auto_tune, c.metrics.cache) {
            (true, Some(g)) if g.num_blocks > 0 => {
                // The server's blocks, in our block size.
                let tokens = g.num_blocks.saturating_mul(u64::from(g.block_size_tokens));
                usize::try_from(tokens / self.params.block_size_tokens as u64)
                    .unwrap_or(usize::MAX)
                    .max(1)
            }
            _ => self.params.lru_capacity_per_server,
        }
    }
}

impl Plugin for PrefixCacheScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
}

impl DataProducer for PrefixCacheScorer {
    fn produce(&self, cx: &mut CycleContext<'_>, _candidates: &[Candidate]) {
        let prefix = &mut cx.state.prefix;
        if prefix.computed {
            return;
        }
        let req = cx.request;
        block_hashes(
            req.prompt.as_bytes(),
            self.params.block_size_tokens * CHARS_PER_TOKEN,
            self.params.max_prefix_blocks_to_match,
            seed(&req.target_model, req.cache_salt.as_deref()),
            &mut prefix.hashes,
        );
        prefix.computed = true;
        let hashes = std::mem::take(&mut prefix.hashes);
        self.index.match_prefix(&hashes, prefix);
        prefix.hashes = hashes;
    }
}

impl Scorer for PrefixCacheScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = cx.state.prefix.ratio(c.id());
        }
    }
}

impl PreRequest for PrefixCacheScorer {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        let Some(target) = result.primary() else {
            return;
        };
        let hashes = &cx.state.prefix.hashes;
        if hashes.is_empty() {
            return;
        }
        let capacity = self.capacity_for(&Candidate::new(target));
        self.index.record(target.id(), hashes, capacity);
    }
}

#[cfg(test)]
mod tests;
