//! The precise prefix index: which endpoint holds which prompt blocks,
//! according to the engines' own KV-cache events.
//!
//! Keys are computed here, from token ids, for both sides: the lookup
//! chunks a request's tokens into blocks of `block_size` tokens, the event
//! side re-chunks each `BlockStored`'s token ids the same way. Each key
//! chains its parent key, the block's tokens and, at the root, the model
//! the blocks were computed for (the LoRA adapter's name, else the base
//! model named in the event topic). The engine's own block hashes serve only
//! to find, for a later event, the chain a child continues and the keys an
//! eviction removes, so neither the engine's hash function nor its block
//! size has to be reproduced: an engine with 16-token blocks feeds an index
//! of 64-token blocks (partial blocks carry over to the child).
//!
//! What else the engine hashed into a block (its `extra_keys`) goes into
//! the keys too, so a key matches only what the engine would reuse: the
//! first block's (multimodal items, then the cache salt) into the root;
//! a later block's (the multimodal items its tokens overlap) into the index
//! block(s) its tokens fall in. A request's keys take the same from its
//! salt and from its media items' places in the rendered prompt
//! ([`epp_core::Placeholder`]), chunked by the engine's block size as the
//! engine does; a request whose media items have no place gets no keys
//! (its placeholder tokens alone would match another image's blocks).
//!
//! Reads are lock-free (`papaya`, epoch-based reclamation): a lookup never
//! waits for the event tasks. Writes for one endpoint come from one task
//! (its subscriber) and take that endpoint's own lock.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    hash::{BuildHasher, Hasher},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use epp_core::{BlockStored, EndpointId, ExtraKey, KvEvent, KvEventBatch, MediaItem, PrefixMatch};
use parking_lot::{Mutex, RwLock};

/// Keys are already uniformly mixed: hash them as themselves.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeyHash;

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

/// See [`KeyHash`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 32;
    x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^= x >> 32;
    x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^ (x >> 32)
}

/// Secrets of [`block_key`]: odd, with both 32-bit halves far above any
/// token id, so a word of two token ids never cancels one (which would zero
/// a product).
const SECRETS: [u64; 8] = [
    0xa076_1d64_78bd_642f,
    0xe703_7ed1_a0b4_28db,
    0x8ebc_6af0_9c88_c6e3,
    0x5899_65cc_7537_4cc3,
    0xd6e8_feb8_6659_fd93,
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0xb492_b66f_be98_f273,
];

/// The 128-bit product of `a` and `b`, folded to 64 bits.
#[inline]
fn mum(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Per-position secrets of a 16-token chunk, two to a pair of tokens: the
/// halves of [`SECRETS`] with the top bit set, so `token ^ secret` is never
/// zero for a token id (ids stay far below 2^31; a zero factor would make
/// the other token of its pair count for nothing).
const PAIR_SECRETS: [u32; 16] = {
    let mut out = [0u32; 16];
    let mut i = 0;
    while i < 8 {
        out[2 * i] = (SECRETS[i] >> 32) as u32 | 1 << 31;
        out[2 * i + 1] = SECRETS[i] as u32 | 1 << 31;
        i += 1;
    }
    out
};

/// The key of a block of `tokens` after the block keyed `parent`.
///
/// The block's content is hashed without the parent, 16 tokens at a time:
/// tokens j and j + 8, each xored with its position's secret, are
/// multiplied 32 by 32 into 64 bits and the eight products summed (an NH
/// hash, as in UMAC: plain integer work the compiler turns into vector
/// multiplies, so a block of 16 costs a few instructions). Chunks after the first fold in
/// with a 128-bit multiply, so their order matters. Only the last step, one
/// multiply, mixes in the parent: the content hashes of a prompt's blocks
/// run side by side and the chain from block to block is one multiply long.
#[must_use]
#[inline(always)]
pub fn block_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut sixteens = tokens.chunks_exact(16);
    let mut content = SECRETS[4];
    for (i, c) in (&mut sixteens).enumerate() {
        let sum = nh16(c);
        content = if i == 0 {
            sum
        } else {
            mum(content ^ SECRETS[6], sum ^ SECRETS[7])
        };
    }
    let rest = sixteens.remainder();
    if !rest.is_empty() {
        content = fold_rest(rest, content, tokens.len() > 16);
    }
    mum(
        parent ^ SECRETS[2],
        content ^ (tokens.len() as u64) ^ SECRETS[3],
    )
}

/// The sum of a 16-token chunk's eight pair products (see [`block_key`]).
#[inline(always)]
fn nh16(c: &[u32]) -> u64 {
    let c: &[u32; 16] = c.try_into().unwrap_or(&[0; 16]);
    let mut sum = 0u64;
    for j in 0..8 {
        let a = c[j] ^ PAIR_SECRETS[j];
        let b = c[j + 8] ^ PAIR_SECRETS[j + 8];
        sum = sum.wrapping_add(u64::from(a) * u64::from(b));
    }
    sum
}

/// The last tokens of a block whose size is not a multiple of 16, padded
/// with zeros (the block's length, which [`block_key`] mixes in, tells a
/// zero token from padding), folded into `content` when chunks came before.
#[cold]
#[inline(never)]
fn fold_rest(rest: &[u32], content: u64, after_chunks: bool) -> u64 {
    let mut chunk = [0u32; 16];
    chunk[..rest.len()].copy_from_slice(rest);
    let sum = nh16(&chunk);
    if after_chunks {
        mum(content ^ SECRETS[6], sum ^ SECRETS[7])
    } else {
        sum
    }
}

/// The root key of every sequence computed for `model` (a LoRA adapter's
/// name or the base model's) with hash seed `seed`.
#[must_use]
pub fn root_key(seed: u64, model: &str) -> u64 {
    let mut h = KeyHasher(seed ^ 0x7f4a_7c15_9e37_79b9);
    h.write(model.as_bytes());
    mix(h.finish() ^ model.len() as u64)
}

/// `root` with one of the first block's extra keys folded in (a cache salt,
/// a multimodal item's identifier): the engine hashed it into that block,
/// so every key of the sequence depends on it.
#[must_use]
pub fn fold_extra(root: u64, extra: &[u8]) -> u64 {
    let mut h = KeyHasher(root ^ 0x5a17_5a17_c0de_c0de);
    h.write(extra);
    mix(h.finish() ^ (extra.len() as u64).rotate_left(32))
}

/// The digest of one of a later block's extra keys (a multimodal item's
/// identifier), as [`Chain::push`] folds it into index keys.
fn extra_digest(extra: &[u8]) -> u64 {
    let mut h = KeyHasher(0x6d6d_6974_656d_7321);
    h.write(extra);
    mix(h.finish() ^ (extra.len() as u64).rotate_left(32))
}

/// An engine block's extra keys as digests: all but a LoRA adapter's name
/// or id first (the root already names it).
fn block_extras(s: &BlockStored, i: usize, out: &mut Vec<u64>) {
    out.clear();
    let Some(keys) = s.extra_keys.get(i) else {
        return;
    };
    let skip = usize::from(keys.first().is_some_and(|k| is_adapter(s, k)));
    out.extend(keys[skip..].iter().map(|k| match k {
        ExtraKey::Text(t) => extra_digest(t.as_bytes()),
        ExtraKey::Media { id, .. } => extra_digest(id.as_bytes()),
        ExtraKey::Int(i) => extra_digest(&i.to_le_bytes()),
        // Unknown to requests: nothing they send can match it.
        _ => extra_digest(&[0xff; 9]),
    }));
}

/// Whether `k` names `s`'s LoRA adapter (vLLM puts it first in every
/// block's extra keys).
fn is_adapter(s: &BlockStored, k: &ExtraKey) -> bool {
    match k {
        ExtraKey::Text(name) => s.lora_name.as_deref() == Some(name.as_str()),
        ExtraKey::Int(id) => s.lora_id == Some(*id),
        _ => false,
    }
}

/// The root of a sequence whose first block is `s`'s first: the model's
/// root, then the extra keys the engine hashed into that block after the
/// LoRA adapter (which vLLM puts first and the root already names) —
/// multimodal items and the cache salt, in the engine's order.
fn event_root(seed: u64, model: &str, s: &BlockStored) -> u64 {
    let mut key = root_key(seed, model);
    let Some(first) = s.extra_keys.first() else {
        return key;
    };
    let skip = usize::from(first.first().is_some_and(|k| is_adapter(s, k)));
    for k in &first[skip..] {
        key = match k {
            ExtraKey::Text(t) => fold_extra(key, t.as_bytes()),
            ExtraKey::Media { id, .. } => fold_extra(key, id.as_bytes()),
            ExtraKey::Int(i) => fold_extra(key, &i.to_le_bytes()),
            // Unknown to requests: nothing they send can match it.
            _ => fold_extra(key, &[0xff; 9]),
        };
    }
    key
}

/// The endpoints holding one key: ids below 64 as bits (no allocation, one
/// AND per lookup step), the rest sorted in a slice (empty: no allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Holders {
    low: u64,
    rest: Box<[u32]>,
}

impl Holders {
    fn with(&self, id: u32) -> Self {
        match 1u64.checked_shl(id) {
            Some(bit) => Self {
                low: self.low | bit,
                rest: self.rest.clone(),
            },
            None => {
                let mut v = self.rest.to_vec();
                if let Err(at) = v.binary_search(&id) {
                    v.insert(at, id);
                }
                Self {
                    low: self.low,
                    rest: v.into_boxed_slice(),
                }
            }
        }
    }

    /// Without `id` (possibly empty).
    fn without(&self, id: u32) -> Self {
        match 1u64.checked_shl(id) {
            Some(bit) => Self {
                low: self.low & !bit,
                rest: self.rest.clone(),
            },
            None => Self {
                low: self.low,
                rest: self.rest.iter().copied().filter(|&x| x != id).collect(),
            },
        }
    }

    fn is_empty(&self) -> bool {
        self.low == 0 && self.rest.is_empty()
    }
}

/// Where a chain stands after an engine block: the last full key, the
/// tokens since it (fewer than a block) and the extra keys of the engine
/// blocks those came from.
#[derive(Debug, Default)]
struct Chain {
    key: u64,
    carry: Vec<u32>,
    extras: Vec<u64>,
}

impl Chain {
    fn new(root: u64) -> Self {
        Self {
            key: root,
            ..Self::default()
        }
    }

    /// Goes on with an engine block of `tokens` whose extra keys are
    /// `extras` (digests), emitting the key of every index block of `size`
    /// tokens it completes. An index block's key folds in the extra keys of
    /// every engine block with tokens in it, in order, a repeat of the one
    /// before left out. Requests and events key through here alike.
    fn push(&mut self, tokens: &[u32], extras: &[u64], size: usize, mut emit: impl FnMut(u64)) {
        fn add(to: &mut Vec<u64>, extras: &[u64]) {
            for &d in extras {
                if to.last() != Some(&d) {
                    to.push(d);
                }
            }
        }
        add(&mut self.extras, extras);
        self.carry.extend_from_slice(tokens);
        let mut start = 0;
        while self.carry.len() - start >= size {
            let mut key = block_key(self.key, &self.carry[start..start + size]);
            for &d in &self.extras {
                key = mum(key ^ SECRETS[0], d ^ SECRETS[1]);
            }
            self.key = key;
            start += size;
            // What is left is this engine block's own (the carry held less
            // than a block before it): its extra keys go on with it.
            self.extras.clear();
            if self.carry.len() > start {
                add(&mut self.extras, extras);
            }
            emit(key);
        }
        self.carry.drain(..start);
    }
}

/// What one engine block contributed on one endpoint.
#[derive(Debug)]
struct EngineBlock {
    /// Index keys the block completed (usually one).
    keys: Box<[u64]>,
    /// The chain after it, for its children.
    chain: SavedChain,
}

/// A [`Chain`] kept with its engine block: boxed slices, 16 bytes less than
/// the vectors (one such per engine block held).
#[derive(Debug)]
struct SavedChain {
    key: u64,
    carry: Box<[u32]>,
    extras: Box<[u64]>,
}

impl From<&Chain> for SavedChain {
    fn from(c: &Chain) -> Self {
        Self {
            key: c.key,
            carry: c.carry.as_slice().into(),
            extras: c.extras.as_slice().into(),
        }
    }
}

impl From<&SavedChain> for Chain {
    fn from(c: &SavedChain) -> Self {
        Self {
            key: c.key,
            carry: c.carry.to_vec(),
            extras: c.extras.to_vec(),
        }
    }
}

/// One endpoint's blocks.
#[derive(Debug, Default)]
struct EndpointBlocks {
    /// By (engine hash, medium).
    engine: HashMap<(u64, u8), EngineBlock>,
    /// Index keys held, with the number of engine blocks completing each.
    held: HashMap<u64, u32>,
    /// Mediums other than none/GPU, interned to their code - 1.
    mediums: Vec<String>,
    /// Picks held on speculation (their keys, when sent there), oldest
    /// first: the queue that ends speculations whose time is up.
    speculative: VecDeque<(Instant, Box<[u64]>)>,
    /// Keys held on speculation and not reported by the engine, each with
    /// the time of its latest pick; counted once in `held`. The engine's
    /// own report of a key ends its speculation (it holds it from then on,
    /// until it says it evicted it), so a speculation never keeps a key the
    /// engine has dropped.
    speculated: HashMap<u64, Instant>,
    /// With a mirror: keys that became held / stopped being held since the
    /// last flush (see [`KvBlockIndex::flush`]).
    added: Vec<u64>,
    removed: Vec<u64>,
}

impl EndpointBlocks {
    fn medium(&mut self, m: Option<&str>) -> u8 {
        match m {
            None => 0,
            Some(m) if m.eq_ignore_ascii_case("gpu") => 0,
            Some(m) => {
                let i = match self.mediums.iter().position(|k| k == m) {
                    Some(i) => i,
                    None if self.mediums.len() < 250 => {
                        self.mediums.push(m.to_owned());
                        self.mediums.len() - 1
                    }
                    None => 249,
                };
                u8::try_from(i + 1).unwrap_or(u8::MAX)
            }
        }
    }
}

/// Counters of the index, read by the plugin's metrics.
#[derive(Debug, Default)]
pub struct IndexCounters {
    /// Blocks stored (engine blocks).
    pub stored: AtomicU64,
    /// Blocks removed (engine blocks known to the index).
    pub removed: AtomicU64,
    /// Events whose parent block was unknown (stored blocks not indexed).
    pub orphans: AtomicU64,
    /// Times an endpoint's blocks were all forgotten (cleared, resynced or
    /// over the per-endpoint cap).
    pub clears: AtomicU64,
    /// Lookups.
    pub lookups: AtomicU64,
    /// Blocks looked up.
    pub lookup_blocks: AtomicU64,
    /// Of those, blocks some endpoint held.
    pub hit_blocks: AtomicU64,
    /// Picks held on speculation.
    pub speculated: AtomicU64,
}

/// Told of every change to which keys an endpoint holds: the writer of a
/// shared index ([`KvBlockIndex::set_mirror`]).
pub trait IndexMirror: Send + Sync + fmt::Debug {
    /// Endpoint `id` now holds `added` and no longer holds `removed`. Called
    /// under that endpoint's lock, so one endpoint's changes arrive in order;
    /// it must not block.
    fn changed(&self, id: EndpointId, added: &[u64], removed: &[u64]);
}

/// The index.
#[derive(Debug)]
pub struct KvBlockIndex {
    block_size: usize,
    seed: u64,
    max_blocks_per_endpoint: usize,
    /// Key → the endpoint ids holding it (sorted, no duplicates).
    keys: papaya::HashMap<u64, Holders, KeyHash>,
    /// How long speculation holds (see [`Self::speculate`]).
    speculative_ttl: Duration,
    /// Each endpoint's blocks: found under a shared lock (the request path's
    /// speculation and every event batch), created under the exclusive one.
    endpoints: RwLock<HashMap<EndpointId, Arc<Mutex<EndpointBlocks>>>>,
    counters: IndexCounters,
    /// Told of every change, when set.
    mirror: OnceLock<Arc<dyn IndexMirror>>,
    /// The engines' block size, from their last event (0: none yet): a
    /// request with media is chunked by it as the engine chunks it.
    engine_block_size: AtomicUsize,
}

impl KvBlockIndex {
    /// An empty index of blocks of `block_size` tokens (at least 1), keys
    /// seeded with `seed`, remembering at most `max_blocks_per_endpoint`
    /// engine blocks per endpoint (an endpoint over it is forgotten: a
    /// publisher that stores and never removes costs bounded memory).
    #[must_use]
    pub fn new(block_size: usize, seed: u64, max_blocks_per_endpoint: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            seed,
            max_blocks_per_endpoint,
            keys: papaya::HashMap::builder().hasher(KeyHash).build(),
            speculative_ttl: Duration::from_secs(2),
            endpoints: RwLock::new(HashMap::new()),
            counters: IndexCounters::default(),
            mirror: OnceLock::new(),
            engine_block_size: AtomicUsize::new(0),
        }
    }

    /// Has `mirror` told of every later change of the keys an endpoint
    /// holds (once; a second mirror is refused and returned).
    ///
    /// # Errors
    /// A mirror was set before.
    pub fn set_mirror(&self, mirror: Arc<dyn IndexMirror>) -> Result<(), Arc<dyn IndexMirror>> {
        self.mirror.set(mirror)
    }

    /// Calls `f` with every endpoint and the keys it holds now.
    pub fn for_each_endpoint(&self, mut f: impl FnMut(EndpointId, &[u64])) {
        let all: Vec<_> = self
            .endpoints
            .read()
            .iter()
            .map(|(id, b)| (*id, Arc::clone(b)))
            .collect();
        let mut keys = Vec::new();
        for (id, blocks) in all {
            keys.clear();
            keys.extend(blocks.lock().held.keys().copied());
            f(id, &keys);
        }
    }

    /// Tells the mirror what changed for `id` since the last flush: the
    /// keys held now among those that became held, and the keys not held
    /// now among those that stopped (a key stored and removed in one batch
    /// is told in its final state only).
    fn flush(&self, id: EndpointId, b: &mut EndpointBlocks) {
        let Some(mirror) = self.mirror.get() else {
            return;
        };
        if b.added.is_empty() && b.removed.is_empty() {
            return;
        }
        let (mut added, mut removed) =
            (std::mem::take(&mut b.added), std::mem::take(&mut b.removed));
        added.retain(|k| b.held.contains_key(k));
        removed.retain(|k| !b.held.contains_key(k));
        if !added.is_empty() || !removed.is_empty() {
            mirror.changed(id, &added, &removed);
        }
        added.clear();
        removed.clear();
        b.added = added;
        b.removed = removed;
    }

    /// Records, for the mirror, that `id` started (`true`) or stopped
    /// holding `key`.
    fn note(&self, b: &mut EndpointBlocks, key: u64, held: bool) {
        if self.mirror.get().is_some() {
            if held {
                b.added.push(key);
            } else {
                b.removed.push(key);
            }
        }
    }

    /// Sets how long speculation holds (default 2 s).
    #[must_use]
    pub fn with_speculative_ttl(mut self, ttl: Duration) -> Self {
        self.speculative_ttl = ttl;
        self
    }

    /// How long speculation holds.
    #[must_use]
    pub fn speculative_ttl(&self) -> Duration {
        self.speculative_ttl
    }

    /// Tokens per block.
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> &IndexCounters {
        &self.counters
    }

    /// Distinct keys held by any endpoint.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no endpoint holds anything.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys of `tokens` for `model`, a request's `cache_salt` and its
    /// `media` items: one per full block, at most `max_blocks`, written to
    /// `out` (cleared first). As vLLM, an empty salt is no salt. None when
    /// a media item has no place in the prompt.
    pub fn keys_of(
        &self,
        model: &str,
        salt: Option<&str>,
        media: &[MediaItem],
        tokens: &[u32],
        max_blocks: usize,
        out: &mut Vec<u64>,
    ) {
        out.clear();
        let salt = salt.filter(|s| !s.is_empty());
        if !media.is_empty() {
            self.keys_with_media(model, salt, media, tokens, max_blocks, out);
            return;
        }
        let mut key = root_key(self.seed, model);
        if let Some(salt) = salt {
            key = fold_extra(key, salt.as_bytes());
        }
        // One reservation, then no capacity check per key.
        out.extend(
            tokens
                .chunks_exact(self.block_size)
                .take(max_blocks)
                .map(|block| {
                    key = block_key(key, block);
                    key
                }),
        );
    }

    /// [`Self::keys_of`] for a prompt with media: the engine's blocks in
    /// turn, each with the items it overlaps, as the engine hashes them
    /// (the first block's into the root, before the salt).
    fn keys_with_media(
        &self,
        model: &str,
        salt: Option<&str>,
        media: &[MediaItem],
        tokens: &[u32],
        max_blocks: usize,
        out: &mut Vec<u64>,
    ) {
        let Some(mut items) = media
            .iter()
            .map(|m| m.placeholder.map(|p| (p, m.hash.as_str())))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        items.sort_by_key(|(p, _)| p.offset);
        let engine = match self.engine_block_size.load(Ordering::Relaxed) {
            0 => self.block_size,
            n => n,
        };
        let mut root = root_key(self.seed, model);
        for (_, hash) in items.iter().filter(|(p, _)| p.overlaps(0, engine)) {
            root = fold_extra(root, hash.as_bytes());
        }
        if let Some(salt) = salt {
            root = fold_extra(root, salt.as_bytes());
        }
        let mut chain = Chain::new(root);
        let mut extras = Vec::new();
        for (b, block) in tokens.chunks_exact(engine).enumerate() {
            extras.clear();
            if b > 0 {
                let (start, end) = (b * engine, (b + 1) * engine);
                extras.extend(
                    items
                        .iter()
                        .filter(|(p, _)| p.overlaps(start, end))
                        .map(|(_, hash)| extra_digest(hash.as_bytes())),
                );
            }
            chain.push(block, &extras, self.block_size, |k| out.push(k));
            if out.len() >= max_blocks {
                out.truncate(max_blocks);
                break;
            }
        }
    }

    /// Fills `m` with each endpoint's contiguous matched blocks of `keys`
    /// (which `keys_of` computed), counting from the first.
    pub fn lookup(&self, keys: &[u64], m: &mut PrefixMatch) {
        let map = self.keys.pin();
        let mut walk = Walk::new();
        loop {
            // The common case, deep in a prompt: every endpoint still
            // matching holds this block too, and all of them are below 64
            // (ids from 64 on that stopped matching cannot start again). A
            // tight loop, nothing but the table's reads, until that changes.
            if !walk.rest_alive {
                let alive = walk.alive;
                let mut at = walk.depth as usize;
                // Eight keys at a time, one branch for the eight: the reads
                // of a group overlap.
                while let Some(group) = keys.get(at..at + 8) {
                    let mut all = u64::MAX;
                    for k in group {
                        all &= map.get(k).map_or(0, |h| h.low);
                    }
                    if alive & !all != 0 {
                        break;
                    }
                    at += 8;
                }
                while let Some(k) = keys.get(at) {
                    match map.get(k) {
                        Some(h) if alive & !h.low == 0 => at += 1,
                        _ => break,
                    }
                }
                walk.depth = u32::try_from(at).unwrap_or(u32::MAX);
            }
            let Some(k) = keys.get(walk.depth as usize) else {
                break;
            };
            if !walk.step(map.get(k), m) {
                break;
            }
        }
        self.count_lookup(keys.len(), walk.finish(m));
    }

    fn count_lookup(&self, blocks: usize, hit: u32) {
        let c = &self.counters;
        c.lookups.fetch_add(1, Ordering::Relaxed);
        c.lookup_blocks.fetch_add(blocks as u64, Ordering::Relaxed);
        c.hit_blocks.fetch_add(u64::from(hit), Ordering::Relaxed);
    }

    fn blocks_of(&self, id: EndpointId) -> Arc<Mutex<EndpointBlocks>> {
        if let Some(b) = self.endpoints.read().get(&id) {
            return Arc::clone(b);
        }
        Arc::clone(self.endpoints.write().entry(id).or_default())
    }

    /// Applies one batch from `id`'s engine. Blocks without a LoRA name were
    /// computed for the base model the batch's topic names.
    pub fn apply(&self, id: EndpointId, batch: &KvEventBatch) {
        let model = batch.model.as_deref();
        let blocks = self.blocks_of(id);
        let mut b = blocks.lock();
        if !b.speculative.is_empty() {
            self.expire(id, &mut b, Instant::now(), self.speculative_ttl);
        }
        for e in &batch.events {
            match e {
                KvEvent::BlockStored(s) => self.stored(id, &mut b, model, s),
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                } => {
                    let medium = b.medium(medium.as_deref());
                    for h in block_hashes {
                        self.removed(id, &mut b, (*h, medium));
                    }
                }
                KvEvent::AllBlocksCleared => self.clear_locked(id, &mut b),
            }
        }
        if b.engine.len() > self.max_blocks_per_endpoint {
            tracing::warn!(
                endpoint = id.index(),
                blocks = b.engine.len(),
                "an engine reported more blocks than maxBlocksPerEndpoint without evicting; \
                 forgetting them"
            );
            self.clear_locked(id, &mut b);
        }
        self.flush(id, &mut b);
    }

    fn stored(&self, id: EndpointId, b: &mut EndpointBlocks, model: Option<&str>, s: &BlockStored) {
        let medium = b.medium(s.medium.as_deref());
        let root = || {
            Chain::new(event_root(
                self.seed,
                s.lora_name.as_deref().or(model).unwrap_or_default(),
                s,
            ))
        };
        // A sequence's first block: its extra keys are in the root.
        let mut from_root = true;
        let mut chain = match s.parent_block_hash {
            None => root(),
            Some(p) => match b.engine.get(&(p, medium)).or_else(|| b.engine.get(&(p, 0))) {
                Some(parent) => {
                    from_root = false;
                    Chain::from(&parent.chain)
                }
                // llm-d's publishers (its simulator, its KV-cache library)
                // send 0, their empty block hash, for "no parent".
                None if p == 0 => root(),
                None => {
                    // Evicted or never seen: its children cannot be keyed.
                    self.counters.orphans.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
        };
        let engine_size = usize::try_from(s.block_size).unwrap_or(usize::MAX).max(1);
        if s.block_size > 0 {
            self.engine_block_size.store(engine_size, Ordering::Relaxed);
        }
        let map = self.keys.pin();
        let mut extras = Vec::new();
        for (i, &h) in s.block_hashes.iter().enumerate() {
            let Some(tokens) = s.token_ids.get(i * engine_size..(i + 1) * engine_size) else {
                // Fewer tokens than blocks: nothing more can be keyed.
                self.counters.orphans.fetch_add(1, Ordering::Relaxed);
                break;
            };
            if i == 0 && from_root {
                extras.clear();
            } else {
                block_extras(s, i, &mut extras);
            }
            let mut keys = Vec::new();
            chain.push(tokens, &extras, self.block_size, |k| keys.push(k));
            for &k in &keys {
                if !b.speculated.is_empty() && b.speculated.remove(&k).is_some() {
                    // Speculation's holding becomes this block's.
                    continue;
                }
                let n = b.held.entry(k).or_insert(0);
                *n += 1;
                if *n == 1 {
                    let raw = id.0;
                    hold(&map, k, raw);
                    self.note(b, k, true);
                }
            }
            self.counters.stored.fetch_add(1, Ordering::Relaxed);
            let old = b.engine.insert(
                (h, medium),
                EngineBlock {
                    keys: keys.into_boxed_slice(),
                    chain: SavedChain::from(&chain),
                },
            );
            if let Some(old) = old {
                // Stored again without a removal: its keys were counted twice.
                self.release(id, b, &old.keys);
            }
        }
    }

    fn removed(&self, id: EndpointId, b: &mut EndpointBlocks, key: (u64, u8)) {
        if let Some(block) = b.engine.remove(&key) {
            self.counters.removed.fetch_add(1, Ordering::Relaxed);
            self.release(id, b, &block.keys);
        }
    }

    /// Drops one holding of each key, unindexing those no engine block of
    /// `id` completes any more.
    fn release(&self, id: EndpointId, b: &mut EndpointBlocks, keys: &[u64]) {
        let map = self.keys.pin();
        for k in keys {
            let Some(n) = b.held.get_mut(k) else { continue };
            *n -= 1;
            if *n == 0 {
                b.held.remove(k);
                unhold(&map, *k, id.0);
                self.note(b, *k, false);
            }
        }
    }

    fn clear_locked(&self, id: EndpointId, b: &mut EndpointBlocks) {
        let map = self.keys.pin();
        for k in b.held.keys() {
            unhold(&map, *k, id.0);
        }
        if self.mirror.get().is_some() {
            b.removed.extend(b.held.keys().copied());
        }
        b.held.clear();
        b.engine.clear();
        b.speculative.clear();
        b.speculated.clear();
        b.held.shrink_to(0);
        b.engine.shrink_to(0);
        self.counters.clears.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets everything `id` held.
    pub fn clear(&self, id: EndpointId) {
        let blocks = self.endpoints.write().remove(&id);
        if let Some(blocks) = blocks {
            let mut b = blocks.lock();
            self.clear_locked(id, &mut b);
            self.flush(id, &mut b);
        }
    }

    /// Holds `keys` on `id` on speculation until `ttl` after `now` (llm-d's
    /// `speculativeIndexing`): a request just sent there will have its prompt
    /// cached once prefilled, which the engine reports only then; requests
    /// with the same prefix arriving meanwhile should follow it. A key ends
    /// its speculation when its time is up or when the engine reports it,
    /// whichever comes first; a key the engine already holds is not
    /// speculated (its own report governs it, eviction included), and a key
    /// picked again holds until the later pick's time is up. Expired
    /// speculation is dropped first. At most 4,096 speculations per endpoint.
    pub fn speculate(&self, id: EndpointId, keys: &[u64], now: Instant, ttl: Duration) {
        if keys.is_empty() {
            return;
        }
        let blocks = self.blocks_of(id);
        let mut b = blocks.lock();
        self.expire(id, &mut b, now, ttl);
        if b.speculative.len() >= 4096
            && let Some((at, old)) = b.speculative.pop_front()
        {
            self.end_speculation(id, &mut b, at, &old);
        }
        let map = self.keys.pin();
        for &k in keys {
            if let Some(at) = b.speculated.get_mut(&k) {
                *at = (*at).max(now);
            } else if !b.held.contains_key(&k) {
                b.speculated.insert(k, now);
                b.held.insert(k, 1);
                hold(&map, k, id.0);
                self.note(&mut b, k, true);
            }
            // else the engine holds it: when this pick's time is up,
            // `end_speculation` finds no speculation of it to end.
        }
        b.speculative.push_back((now, keys.into()));
        self.counters.speculated.fetch_add(1, Ordering::Relaxed);
        self.flush(id, &mut b);
    }

    fn expire(&self, id: EndpointId, b: &mut EndpointBlocks, now: Instant, ttl: Duration) {
        while let Some((at, _)) = b.speculative.front() {
            if now.saturating_duration_since(*at) < ttl {
                break;
            }
            if let Some((at, keys)) = b.speculative.pop_front() {
                self.end_speculation(id, b, at, &keys);
            }
        }
    }

    /// Ends the speculation of the pick made at `at` on the keys no later
    /// pick renewed and the engine has not reported.
    fn end_speculation(&self, id: EndpointId, b: &mut EndpointBlocks, at: Instant, keys: &[u64]) {
        for k in keys {
            if b.speculated.get(k).is_some_and(|latest| *latest <= at) {
                b.speculated.remove(k);
                self.release(id, b, std::slice::from_ref(k));
            }
        }
    }

    /// Engine blocks known for `id`.
    #[must_use]
    pub fn engine_blocks(&self, id: EndpointId) -> usize {
        self.endpoints
            .read()
            .get(&id)
            .map_or(0, |b| b.lock().engine.len())
    }
}

/// A lookup's walk down a request's keys: which endpoints still match
/// contiguously from the first block, and how deep.
struct Walk {
    /// Ids below 64 still matching, as bits: when a key drops some, their
    /// match ends at that depth.
    alive: u64,
    depth: u32,
    /// Whether an id from 64 on (rare; one by one) still matches.
    rest_alive: bool,
}

impl Walk {
    fn new() -> Self {
        Self {
            alive: u64::MAX,
            depth: 0,
            rest_alive: true,
        }
    }

    /// Takes the next key's holders (None: nobody holds it); false once no
    /// endpoint matches any more.
    #[inline(never)]
    fn step(&mut self, holders: Option<&Holders>, m: &mut PrefixMatch) -> bool {
        let Some(h) = holders else { return false };
        let dropped = self.alive & !h.low;
        if self.depth > 0 {
            set_bits(m, dropped, self.depth);
        }
        self.alive &= h.low;
        let mut rest_any = false;
        if self.rest_alive {
            for &id in h.rest.iter() {
                let id = EndpointId(id);
                if m.matched(id) == self.depth {
                    m.set_matched(id, self.depth + 1);
                    rest_any = true;
                }
            }
            self.rest_alive = rest_any;
        }
        if self.alive == 0 && !rest_any {
            return false;
        }
        self.depth += 1;
        true
    }

    /// Sets the match of the endpoints that held every key walked; returns
    /// the depth reached.
    fn finish(self, m: &mut PrefixMatch) -> u32 {
        if self.depth > 0 {
            set_bits(m, self.alive, self.depth);
        }
        self.depth
    }
}

/// Sets the match of every endpoint whose bit is in `bits` to `depth`.
fn set_bits(m: &mut PrefixMatch, mut bits: u64, depth: u32) {
    while bits != 0 {
        let id = bits.trailing_zeros();
        m.set_matched(EndpointId(id), depth);
        bits &= bits - 1;
    }
}

/// Adds `raw` to the holders of `key`. `update` and `try_insert`, not
/// `compute` or `update_or_insert`: those leave later lookups of the key
/// ~40x slower in papaya 0.2 (measured: 3 → 90-130 ns a lookup).
fn hold<G: papaya::Guard>(
    map: &papaya::HashMapRef<'_, u64, Holders, KeyHash, G>,
    key: u64,
    raw: u32,
) {
    loop {
        if map.update(key, |holders| holders.with(raw)).is_some() {
            return;
        }
        if map.try_insert(key, Holders::default().with(raw)).is_ok() {
            return;
        }
        // Inserted by another endpoint meanwhile (or removed again): retry.
    }
}

fn unhold<G: papaya::Guard>(
    map: &papaya::HashMapRef<'_, u64, Holders, KeyHash, G>,
    key: u64,
    raw: u32,
) {
    if map.update(key, |holders| holders.without(raw)).is_some() {
        // Whoever empties it removes it, unless an endpoint came meanwhile.
        let _ = map.remove_if(&key, |_, holders| holders.is_empty());
    }
}

#[cfg(test)]
mod tests;
