//! `approx-prefix-cache-producer`: hashes the request's prompt into chained
//! blocks once per cycle, matches them against an approximate index of what
//! this picker sent where, and records the chosen endpoint's blocks after the
//! decision. Scorers and filters read the result from `CycleState::prefix`.
//!
//! The prompt is cut into blocks of `blockSizeTokens × 4` characters; each
//! block's 64-bit hash is chained to the previous one and seeded with the
//! target model and `cache_salt`, so equal blocks only match after an equal
//! prefix, for the same model and tenant. Matches count CONTIGUOUSLY from the
//! first block (the reference can count non-contiguous blocks; a block after a
//! gap is never cached by a real engine).

use std::sync::{
    Arc, OnceLock,
    atomic::{AtomicU64, Ordering},
};

use epp_core::{
    BuildError, CHARS_PER_TOKEN, Candidate, CycleContext, DataProducer, DeferredWork, Endpoint,
    MetricFamily, MetricSink, Plugin, PluginMetrics, PreRequest, PrefixSlot, SchedulingResult,
    replicas::{ReplicaFeed, SharesPicks},
};

use crate::{Builtin, PrefixIndex};

/// Parameters (REFERENCE §4 defaults); also accepted by `prefix-cache-scorer`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixCacheParams {
    /// Tokens per block (× 4 characters). Default 16.
    #[serde(default = "default_block")]
    pub block_size_tokens: usize,
    /// Blocks of a prompt considered at most. Default 256; 0 means llm-d's
    /// default token cap, 131072 tokens (`131072 / blockSizeTokens` blocks).
    #[serde(default = "default_max_blocks")]
    pub max_prefix_blocks_to_match: usize,
    /// llm-d's cap in tokens; when set (> 0) it replaces
    /// `maxPrefixBlocksToMatch` with `maxPrefixTokensToMatch / blockSizeTokens`
    /// blocks. Default 0 = unset.
    #[serde(default)]
    pub max_prefix_tokens_to_match: usize,
    /// Blocks remembered per endpoint. Default 31250.
    #[serde(default = "default_capacity")]
    pub lru_capacity_per_server: usize,
    /// Size each endpoint's LRU from the KV-cache geometry it reports.
    #[serde(default = "default_true")]
    pub auto_tune: bool,
    /// Deprecated llm-d name for the block size. As in llm-d, a value > 0
    /// is logged as deprecated and, when `blockSizeTokens` is at its default
    /// (16), taken as `blockSizeTokens` (tokens, although the name once
    /// meant characters). Default 0 = unset.
    #[serde(default)]
    pub block_size: usize,
    /// When each decision's record is applied to the index: `recordMode`
    /// (`auto`, `inPlace`, `afterReply`, `writer`; see [`RecordMode`]), or
    /// its older spelling `recordInBackground` (`true` is `writer`, `false`
    /// is `inPlace`). Default `auto`.
    #[serde(default, alias = "recordInBackground")]
    pub record_mode: RecordMode,
}

/// When a decision's prefix-index record is applied. Whichever it is, every
/// decision sees every earlier decision's record: a read applies the records
/// still queued before it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordMode {
    /// In the decision while records are cheap, after the reply (as
    /// [`Self::AfterReply`]) while a record costs more than 8 µs on average
    /// (in place again below 4 µs; see [`PrefixIndex::adaptive`]).
    /// The default: with short prompts and a small fleet a record takes a
    /// microsecond or two and stays in the decision; with long prompts and
    /// a large fleet it takes several times the rest of the decision (two in
    /// a P/D decision), and the reply no longer waits for it.
    #[default]
    Auto,
    /// In the decision, before it returns (the reference's order).
    InPlace,
    /// Queued by the decision and applied once the server has written the
    /// decision's reply (`Scheduler::run_deferred`; see
    /// [`PrefixIndex::after_reply`]), or else by the next decision: the reply
    /// does not wait for the record, and no thread is woken.
    AfterReply,
    /// Queued and applied by a writer thread of the index (see
    /// [`PrefixIndex::in_background`]): off the server's threads too, at the
    /// cost of a thread to wake.
    Writer,
}

/// Under `recordMode: auto`, the average record time above which records
/// are applied after the reply (in place again below half of it).
const DEFER_RECORDS_ABOVE: std::time::Duration = std::time::Duration::from_micros(8);

impl RecordMode {
    const NAMES: &'static [&'static str] = &["auto", "inPlace", "afterReply", "writer"];
}

impl<'de> serde::Deserialize<'de> for RecordMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RecordMode;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "one of auto, inPlace, afterReply, writer (or, as recordInBackground, a boolean)",
                )
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<RecordMode, E> {
                Ok(if v {
                    RecordMode::Writer
                } else {
                    RecordMode::InPlace
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RecordMode, E> {
                match v {
                    "auto" => Ok(RecordMode::Auto),
                    "inPlace" => Ok(RecordMode::InPlace),
                    "afterReply" => Ok(RecordMode::AfterReply),
                    "writer" => Ok(RecordMode::Writer),
                    other => Err(E::unknown_variant(other, RecordMode::NAMES)),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Records a queued index holds at most before its recording callers apply
/// them themselves.
const BACKGROUND_QUEUE: usize = 64;

/// llm-d's default `maxPrefixTokensToMatch` (128 Ki tokens), which applies
/// there when `maxPrefixBlocksToMatch` is 0.
const LLM_D_MAX_PREFIX_TOKENS: usize = 131_072;

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
            max_prefix_tokens_to_match: 0,
            lru_capacity_per_server: default_capacity(),
            auto_tune: true,
            block_size: 0,
            record_mode: RecordMode::default(),
        }
    }
}

impl PrefixCacheParams {
    /// Checks ranges and resolves `maxPrefixTokensToMatch` into blocks;
    /// `plugin` names the plugin in errors.
    ///
    /// # Errors
    /// Any size zero, a block larger than 1 MiB of text, or a token cap
    /// smaller than one block.
    pub(crate) fn validated(mut self, plugin: &str) -> Result<Self, BuildError> {
        if self.block_size > 0 {
            tracing::warn!(
                plugin,
                block_size = self.block_size,
                "'blockSize' is deprecated; use 'blockSizeTokens' instead"
            );
            if self.block_size_tokens == default_block() {
                self.block_size_tokens = self.block_size;
            }
            self.block_size = 0;
        }
        let bad = |field: &str, v: usize, reason: &str| BuildError::InvalidValue {
            plugin: plugin.to_owned(),
            field: field.into(),
            value: v.to_string(),
            reason: reason.into(),
        };
        for (field, v) in [
            ("blockSizeTokens", self.block_size_tokens),
            ("lruCapacityPerServer", self.lru_capacity_per_server),
        ] {
            if v == 0 {
                return Err(bad(field, v, "must be at least 1"));
            }
        }
        if self.block_size_tokens > (1 << 18) {
            return Err(bad(
                "blockSizeTokens",
                self.block_size_tokens,
                "must be at most 262144",
            ));
        }
        let tokens = self.max_prefix_tokens_to_match;
        if tokens > 0 {
            if tokens < self.block_size_tokens {
                return Err(bad(
                    "maxPrefixTokensToMatch",
                    tokens,
                    "must be at least blockSizeTokens (one block)",
                ));
            }
            self.max_prefix_blocks_to_match = tokens / self.block_size_tokens;
        } else if self.max_prefix_blocks_to_match == 0 {
            // llm-d: a block cap of 0 leaves its default token cap, one large
            // context window.
            self.max_prefix_blocks_to_match = LLM_D_MAX_PREFIX_TOKENS / self.block_size_tokens;
        }
        Ok(self)
    }
}

/// Chained block hashes of `text` (full blocks only, at most `max_blocks`),
/// appended to `out`.
///
/// Each block's content is hashed on its own, then folded into the chain
/// with one short step: the content hashes do not wait for each other, so
/// the processor overlaps them, and only the fold (one multiply) runs in
/// sequence.
pub fn block_hashes(
    text: &[u8],
    block_chars: usize,
    max_blocks: usize,
    seed: u64,
    out: &mut Vec<u64>,
) {
    let mut prev = seed;
    for block in text.chunks_exact(block_chars.max(1)).take(max_blocks) {
        prev = chain(prev, content_hash(block));
        out.push(prev);
    }
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Per-position constants for [`content_hash`] (digits of pi).
const SECRET: [u64; 8] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6c,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
];

/// The hash of a block given the hash of everything before it: bijective in
/// `prev` for a fixed block, so two different prefixes never merge into one
/// chain by the fold itself. The rotation brings the product's high bits,
/// which depend on every lower input bit, down to where the index takes its
/// table slot and fingerprint.
fn chain(prev: u64, block: u64) -> u64 {
    (prev ^ block).wrapping_mul(K).rotate_left(29)
}

/// Folds a full 128-bit product to 64 bits.
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Up to 8 bytes, little-endian, zero-padded.
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = bytes.len().min(8);
    w[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(w)
}

/// A block's content hash: each 16-byte pair of words, keyed by its
/// position, multiplied into 128 bits and folded, the products summed. The
/// products are independent of each other (and of other blocks), so they
/// overlap; the length separates blocks that differ only in zero padding.
fn content_hash(block: &[u8]) -> u64 {
    let mut acc = (block.len() as u64).wrapping_mul(K);
    let mut pairs = block.chunks_exact(16);
    for (i, p) in (&mut pairs).enumerate() {
        let s = (i * 2) & 7;
        acc = acc.wrapping_add(fold_mul(
            word(&p[..8]) ^ SECRET[s],
            word(&p[8..]) ^ SECRET[s + 1],
        ));
    }
    let rest = pairs.remainder();
    if !rest.is_empty() {
        let (a, b) = rest.split_at(rest.len().min(8));
        acc = acc.wrapping_add(fold_mul(word(a) ^ SECRET[6], word(b) ^ SECRET[7]));
    }
    acc
}

/// Seed for a request: target model and cache salt.
pub(crate) fn seed(model: &str, salt: Option<&str>) -> u64 {
    let mut h = chain(0x5eed, content_hash(model.as_bytes()));
    if let Some(salt) = salt {
        h = chain(h ^ 0x5a17, content_hash(salt.as_bytes()));
    }
    h
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `approx-prefix-cache-producer`: fills `CycleState::prefix` (hashes and
/// per-endpoint contiguous matches) and records each decision.
#[derive(Debug)]
pub struct ApproxPrefixCacheProducer {
    name: String,
    params: PrefixCacheParams,
    /// Tells this producer's matches from another's in `CycleState::prefix`.
    id: u64,
    index: PrefixIndex,
    /// The cycle's prefix-match set this producer fills.
    slot: PrefixSlot,
    /// Where picks go for the other replicas, when they share them.
    feed: OnceLock<Arc<dyn ReplicaFeed>>,
    /// How many blocks an engine caches per block this index records.
    footprint: Footprint,
}

/// The blocks this index records of recent prompts against the blocks an
/// engine caches for them: a prompt longer than `maxPrefixBlocksToMatch`
/// blocks is recorded by its first blocks only, but the engine that
/// computes it holds all of them, and they evict other prompts there. So
/// that an endpoint's list holds the prompts its engine holds, not more,
/// its capacity (the engine's, in blocks) is scaled by recorded ÷ cached
/// blocks over recent records (the ratio of their sums, each sum decaying
/// by 1/256 per record: where lengths vary, an entry stands for that many
/// of the engine's blocks on average).
///
/// Without it, prompts of 6,000 tokens and the default cap of 256 blocks
/// of 16 tokens filled a server's 2,048-block list with eight prompts
/// where its engine held five: three in eight believed hits were misses
/// (the reference's index has the same flaw).
#[derive(Debug, Default)]
struct Footprint(AtomicU64);

impl Footprint {
    /// Weight kept per record: the sums follow about the last 256 records.
    const KEEP: f32 = 1.0 - 1.0 / 256.0;

    /// Notes a prompt of `cached` blocks of which `recorded` are recorded.
    fn add(&self, recorded: usize, cached: usize) {
        let (recorded, cached) = (recorded as f32, cached.max(1) as f32);
        // Both sums in one word, so a reader never sees one without the other.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let (r, c) = Self::unpack(v);
                Some(Self::pack(
                    r.mul_add(Self::KEEP, recorded),
                    c.mul_add(Self::KEEP, cached),
                ))
            });
    }

    /// `capacity` engine blocks in recorded entries (at least 1; all of
    /// them until a prompt longer than the cap has been recorded).
    fn entries(&self, capacity: usize) -> usize {
        let (r, c) = Self::unpack(self.0.load(Ordering::Relaxed));
        if !(c > 0.0 && r < c) {
            return capacity;
        }
        // The ratio is below 1: the product fits.
        ((capacity as f64 * f64::from(r / c)).round() as usize).max(1)
    }

    fn pack(recorded: f32, cached: f32) -> u64 {
        (u64::from(recorded.to_bits()) << 32) | u64::from(cached.to_bits())
    }

    fn unpack(v: u64) -> (f32, f32) {
        (f32::from_bits((v >> 32) as u32), f32::from_bits(v as u32))
    }
}

impl Builtin for ApproxPrefixCacheProducer {
    const TYPE: &'static str = "approx-prefix-cache-producer";
    type Params = PrefixCacheParams;

    /// # Errors
    /// See [`PrefixCacheParams`]: a size of zero, a block larger than 1 MiB
    /// of text, or a token cap smaller than one block.
    fn build(name: impl Into<String>, params: PrefixCacheParams) -> Result<Self, BuildError> {
        let name = name.into();
        let params = params.validated(&name)?;
        Ok(Self::with_valid(name, params))
    }
}

impl ApproxPrefixCacheProducer {
    /// A producer named `name` with parameters already validated.
    pub(crate) fn with_valid(name: impl Into<String>, params: PrefixCacheParams) -> Self {
        Self {
            name: name.into(),
            params,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            index: match params.record_mode {
                RecordMode::Auto => PrefixIndex::adaptive(BACKGROUND_QUEUE, DEFER_RECORDS_ABOVE),
                RecordMode::InPlace => PrefixIndex::default(),
                RecordMode::AfterReply => PrefixIndex::after_reply(BACKGROUND_QUEUE),
                RecordMode::Writer => PrefixIndex::in_background(BACKGROUND_QUEUE),
            },
            slot: PrefixSlot::default(),
            feed: OnceLock::new(),
            footprint: Footprint::default(),
        }
    }

    /// The index (for inspection and tests).
    #[must_use]
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// The parameters.
    #[must_use]
    pub fn params(&self) -> &PrefixCacheParams {
        &self.params
    }

    /// Blocks to remember for an endpoint: with `autoTune`, its reported KV
    /// capacity converted to this index's block size; else `lruCapacityPerServer`.
    #[must_use]
    pub fn capacity_for(&self, c: &Candidate) -> usize {
        match (self.params.auto_tune, c.metrics.cache) {
            (true, Some(g)) if g.num_blocks > 0 && g.block_size_tokens > 0 => {
                let tokens = g.num_blocks.saturating_mul(u64::from(g.block_size_tokens));
                usize::try_from(tokens / self.params.block_size_tokens as u64)
                    .unwrap_or(usize::MAX)
                    .max(1)
            }
            _ => self.params.lru_capacity_per_server,
        }
    }

    /// Entries to keep for an endpoint: [`Self::capacity_for`] scaled by the
    /// blocks recorded per block its engine caches, lower where prompts are
    /// longer than `maxPrefixBlocksToMatch` (see [`Footprint`]).
    fn entries_for(&self, c: &Candidate) -> usize {
        self.footprint.entries(self.capacity_for(c))
    }

    /// Hashes and matches the request unless a producer already did.
    pub(crate) fn produce_once(&self, cx: &mut CycleContext<'_>) {
        let req = cx.request;
        let prefix = cx.state.prefix_at_mut(self.slot.get());
        if prefix.computed {
            return;
        }
        block_hashes(
            req.prompt.as_bytes(),
            self.params.block_size_tokens * CHARS_PER_TOKEN,
            self.params.max_prefix_blocks_to_match,
            seed(&req.target_model, req.cache_salt.as_deref()),
            &mut prefix.hashes,
        );
        prefix.computed = true;
        prefix.producer = self.id;
        prefix.block_size_tokens = u32::try_from(self.params.block_size_tokens).unwrap_or(u32::MAX);
        let hashes = std::mem::take(&mut prefix.hashes);
        self.index.match_prefix(&hashes, prefix);
        prefix.hashes = hashes;
    }

    /// Records the primary target's blocks, if this producer matched them.
    pub(crate) fn record_pick(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        let prefix = cx.state.prefix_at(self.slot.get());
        if prefix.producer != self.id {
            return;
        }
        let Some(target) = result.primary() else {
            return;
        };
        let hashes = &prefix.hashes;
        if hashes.is_empty() {
            return;
        }
        let block_chars = self.params.block_size_tokens * CHARS_PER_TOKEN;
        let cached = cx.request.prompt.len() / block_chars;
        self.footprint.add(hashes.len(), cached.max(hashes.len()));
        // What the match found held saves the index searching again.
        let what = |endpoint| {
            let capacity = self.entries_for(&Candidate::new(endpoint));
            (endpoint, capacity, prefix.matched(endpoint.id()))
        };
        // P/D: the prefill endpoint computed the prompt's KV too.
        let prefill = result.prefill().filter(|p| !Arc::ptr_eq(p, target));
        match prefill {
            Some(prefill) => self
                .index
                .record_matched_both(hashes, what(target), what(prefill)),
            None => {
                let (endpoint, capacity, matched) = what(target);
                self.index
                    .record_matched(endpoint, hashes, capacity, matched);
            }
        }
        if let Some(feed) = self.feed.get() {
            feed.picked(&self.name, target, hashes);
            if let Some(prefill) = prefill {
                feed.picked(&self.name, prefill, hashes);
            }
        }
    }
}

/// The reference's `inference_extension_prefix_indexer_size`, per index.
const INDEXER_SIZE: MetricFamily = MetricFamily {
    name: "inference_extension_prefix_indexer_size",
    help: "(block, endpoint) entries the approximate prefix index holds, per plugin",
};

impl ApproxPrefixCacheProducer {
    /// Reports the index's size under `plugin` (read at scrape time).
    pub(crate) fn report_size(&self, plugin: &str, out: &mut dyn MetricSink) {
        out.gauge(
            INDEXER_SIZE,
            &[("plugin_name", plugin)],
            self.index.entries() as f64,
        );
    }
}

impl PluginMetrics for ApproxPrefixCacheProducer {
    fn report(&self, out: &mut dyn MetricSink) {
        self.report_size(&self.name, out);
    }
}

impl Plugin for ApproxPrefixCacheProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        Some(self)
    }
    fn bind_prefix_slot(&self, slot: usize) -> bool {
        self.slot.set(slot);
        true
    }
    fn as_shares_picks(&self) -> Option<&dyn SharesPicks> {
        Some(self)
    }
    fn as_deferred_work(&self) -> Option<&dyn DeferredWork> {
        self.index
            .records_after_reply()
            .then_some(self as &dyn DeferredWork)
    }
}

/// `recordMode: afterReply`: the records the decisions queued.
impl DeferredWork for ApproxPrefixCacheProducer {
    fn run_deferred(&self) {
        self.index.flush();
    }
}

impl SharesPicks for ApproxPrefixCacheProducer {
    fn share_picks(&self, feed: Arc<dyn ReplicaFeed>) {
        let _ = self.feed.set(feed);
    }

    /// Records the blocks on `endpoint` as a pick of this replica would,
    /// with the endpoint's capacity as this replica estimates it.
    fn peer_picked(&self, endpoint: &Arc<Endpoint>, keys: &[u64]) {
        let capacity = self.entries_for(&Candidate::new(endpoint));
        self.index.record_for(endpoint, keys, capacity);
    }
}

impl DataProducer for ApproxPrefixCacheProducer {
    fn produce(&self, cx: &mut CycleContext<'_>, _candidates: &[Candidate]) {
        self.produce_once(cx);
    }
    fn produces_prefix_matches(&self) -> bool {
        true
    }
}

impl PreRequest for ApproxPrefixCacheProducer {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        self.record_pick(cx, result);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use epp_core::{CacheGeometry, EndpointMetrics};
    use parking_lot::Mutex;

    use super::*;
    use crate::testing::candidates;

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
        assert_ne!(
            seed("m", None),
            seed("m", Some("")),
            "an empty salt is a salt"
        );
        assert_ne!(seed("m", Some("a")), seed("n", Some("a")));
    }

    /// The index takes its table slot from a hash's low bits and its
    /// fingerprint from the low 32: near-identical prompts (one byte apart,
    /// as numbered tenants' prompts are) must still spread over every slot.
    #[test]
    fn low_bits_spread_over_near_identical_blocks() {
        const BUCKETS: usize = 1024;
        const N: usize = 64 * BUCKETS;
        let mut counts = vec![0u32; BUCKETS];
        let mut fps = std::collections::HashSet::new();
        let mut block = [b'a'; 64];
        let mut out = Vec::new();
        for i in 0..N {
            block[..8].copy_from_slice(&(i as u64).to_le_bytes());
            out.clear();
            block_hashes(&block, 64, 1, 42, &mut out);
            counts[out[0] as usize % BUCKETS] += 1;
            fps.insert(out[0] as u32);
        }
        // Binomial(N, 1/1024): mean 64, sd 8; six sd either side.
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(min >= Some(&16) && max <= Some(&112), "{min:?}..{max:?}");
        assert!(fps.len() > N - 4, "{} distinct fingerprints", fps.len());
        // One flipped bit anywhere changes about half the hash.
        let base = {
            out.clear();
            block_hashes(&[7u8; 64], 64, 1, 42, &mut out);
            out[0]
        };
        for bit in 0..64 * 8 {
            let mut b = [7u8; 64];
            b[bit / 8] ^= 1 << (bit % 8);
            out.clear();
            block_hashes(&b, 64, 1, 42, &mut out);
            let d = (out[0] ^ base).count_ones();
            assert!((12..=52).contains(&d), "bit {bit}: {d} bits changed");
        }
    }

    #[test]
    fn auto_tune_takes_capacity_from_the_server() {
        let p = ApproxPrefixCacheProducer::build("p", PrefixCacheParams::default()).unwrap();
        let c = candidates(vec![
            EndpointMetrics {
                cache: Some(CacheGeometry {
                    block_size_tokens: 32,
                    num_blocks: 1000,
                }),
                ..Default::default()
            },
            EndpointMetrics::default(),
        ]);
        assert_eq!(
            p.capacity_for(&c[0]),
            2000,
            "1000 blocks of 32 tokens = 2000 of 16"
        );
        assert_eq!(p.capacity_for(&c[1]), 31_250, "no geometry reported");
        let off = ApproxPrefixCacheProducer::build(
            "p",
            PrefixCacheParams {
                auto_tune: false,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(off.capacity_for(&c[0]), 31_250);
    }

    #[test]
    fn params_are_range_checked() {
        let zero = PrefixCacheParams {
            block_size_tokens: 0,
            ..Default::default()
        };
        let err = zero.validated("p").unwrap_err();
        assert!(err.to_string().contains("blockSizeTokens = 0"), "{err}");
        assert!(PrefixCacheParams::default().validated("p").is_ok());
    }

    /// A log sink for one test.
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn deprecated_block_size_maps_to_tokens_as_in_llm_d() {
        let p: PrefixCacheParams = serde_yaml_ng::from_str("{blockSize: 64}").unwrap();
        let p = p.validated("p").unwrap();
        assert_eq!(p.block_size_tokens, 64);
        assert_eq!(p.block_size, 0);
        // llm-d logs the deprecation; so do we.
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || SharedBuf(Arc::clone(&sink)))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let p: PrefixCacheParams = serde_yaml_ng::from_str("{blockSize: 32}").unwrap();
            assert_eq!(p.validated("p").unwrap().block_size_tokens, 32);
        });
        let text = String::from_utf8(log.lock().clone()).unwrap();
        assert!(
            text.contains("WARN") && text.contains("'blockSize' is deprecated"),
            "{text}"
        );
        // An explicit non-default blockSizeTokens wins.
        let p: PrefixCacheParams =
            serde_yaml_ng::from_str("{blockSize: 64, blockSizeTokens: 32}").unwrap();
        assert_eq!(p.validated("p").unwrap().block_size_tokens, 32);
    }

    #[test]
    fn token_cap_replaces_the_block_cap() {
        let p = PrefixCacheParams {
            max_prefix_tokens_to_match: 16_384,
            block_size_tokens: 64,
            ..Default::default()
        };
        assert_eq!(p.validated("p").unwrap().max_prefix_blocks_to_match, 256);
        let unset = PrefixCacheParams::default().validated("p").unwrap();
        assert_eq!(unset.max_prefix_blocks_to_match, 256);
        let zero: PrefixCacheParams =
            serde_yaml_ng::from_str("{maxPrefixBlocksToMatch: 0}").unwrap();
        assert_eq!(
            zero.validated("p").unwrap().max_prefix_blocks_to_match,
            8192,
            "llm-d's 131072-token cap in 16-token blocks"
        );
        let below_one_block = PrefixCacheParams {
            max_prefix_tokens_to_match: 15,
            ..Default::default()
        };
        let err = below_one_block.validated("p").unwrap_err().to_string();
        assert!(err.contains("maxPrefixTokensToMatch = 15"), "{err}");
    }
}
