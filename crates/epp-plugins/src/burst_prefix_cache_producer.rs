//! `burst-prefix-cache-producer` (llm-d's): co-locate a burst of requests
//! that share a prompt, so the shared prefix is prefilled once instead of on
//! every replica whose cache is still cold.
//!
//! Each request is held until its window (`windowDurationMs`, opened by the
//! first request of the burst) closes ([`RequestHold`]); the window's
//! requests are then placed jointly, when the first of them is scheduled:
//!
//! ```text
//! prompt → prefix blocks (blockSizeTokens × 4 characters, at most 2048 or
//!          maxPrefixTokensToMatch / blockSizeTokens, chained hashes)
//! units: requests with an identical prefix (≥ 2 of them) form a group;
//!        with minColocateBlocks > 0 a single request sharing its first
//!        minColocateBlocks blocks with another request is a unit too;
//!        other requests get no affinity
//! order: groups, then single units; longer prefixes first
//! fair share = ⌈units' total / replicas⌉   (total in requests, or in prefix
//!              blocks with balanceBy: tokens)
//! placing a unit: its first replica is, with minColocateBlocks > 0, the one
//!   holding the longest prefix of it (≥ minColocateBlocks blocks) among
//!   replicas below their fair share and under maxPerReplica for the unit;
//!   else the least loaded (load in this window, then running requests, then
//!   address); the unit fills a replica up to maxPerReplica (-1: no limit)
//!   and spills to the next least loaded
//! load: +1 per request, or with balanceBy: tokens the unit's blocks minus
//!   those the replica already holds, once per replica
//! the producer's prefix matches: the whole prompt on the assigned replica,
//!   nothing elsewhere — a prefix-cache-scorer that names this producer
//!   scores it 1 there
//! ```
//!
//! As in llm-d, a window holds at most `maxBatchSize` requests (-1: no
//! limit); later ones are not held and get no affinity. With flow control on
//! requests are not held (the queue releases them one by one), so they get
//! no affinity either.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use epp_core::{
    BuildError, CHARS_PER_TOKEN, Candidate, CycleContext, DataProducer, EndpointId,
    InferenceRequest, Plugin, PrefixSlot, RequestHold,
};
use parking_lot::Mutex;

use crate::{Builtin, approx_prefix_cache_producer::seed, block_hashes, invalid};

const UNLIMITED: i64 = -1;
const MAX_WINDOW_MS: i64 = 10_000;
const DEFAULT_MAX_BLOCKS: usize = 2048;

/// Parameters of `burst-prefix-cache-producer` (llm-d's names and defaults).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BurstPrefixParams {
    /// The batching window in milliseconds, 1–10000. Default 100.
    #[serde(default = "window")]
    pub window_duration_ms: i64,
    /// Requests of one unit per replica; -1 (default) = no limit.
    #[serde(default = "unlimited")]
    pub max_per_replica: i64,
    /// Tokens per prefix block. Default 64.
    #[serde(default = "block")]
    pub block_size_tokens: i64,
    /// Cap on matched prefix tokens; 0 (default) = 2048 blocks.
    #[serde(default)]
    pub max_prefix_tokens_to_match: i64,
    /// Shared leading blocks that co-locate different prompts; 0 (default)
    /// places only identical groups.
    #[serde(default)]
    pub min_colocate_blocks: i64,
    /// Requests one window may hold; -1 = no limit. Default 1000.
    #[serde(default = "batch")]
    pub max_batch_size: i64,
    /// `requests` (default) or `tokens`.
    #[serde(default = "requests")]
    pub balance_by: String,
}

fn window() -> i64 {
    100
}
fn unlimited() -> i64 {
    UNLIMITED
}
fn block() -> i64 {
    64
}
fn batch() -> i64 {
    1000
}
fn requests() -> String {
    "requests".into()
}

/// One held request.
#[derive(Debug)]
struct Entry {
    request_id: String,
    hashes: Vec<u64>,
    assigned: Option<EndpointId>,
}

/// One batching window.
#[derive(Debug)]
struct Window {
    end: Instant,
    entries: Vec<Entry>,
    placed: bool,
}

/// `burst-prefix-cache-producer`: see the module docs.
#[derive(Debug)]
pub struct BurstPrefixCacheProducer {
    name: String,
    window: Duration,
    max_per_replica: i64,
    block_tokens: usize,
    max_blocks: usize,
    min_colocate: usize,
    max_batch: i64,
    by_tokens: bool,
    id: u64,
    windows: Mutex<Vec<Window>>,
    slot: PrefixSlot,
}

impl Builtin for BurstPrefixCacheProducer {
    const TYPE: &'static str = "burst-prefix-cache-producer";
    type Params = BurstPrefixParams;

    /// # Errors
    /// llm-d's checks: a window outside 1–10000 ms, `maxPerReplica` or
    /// `maxBatchSize` neither -1 nor ≥ 1, a block size ≤ 0, a token cap
    /// below one block, a negative `minColocateBlocks`, or `balanceBy` not
    /// `requests` or `tokens`.
    fn build(name: impl Into<String>, p: BurstPrefixParams) -> Result<Self, BuildError> {
        let bad = |field: &str, v: i64, why: &str| Err(invalid(Self::TYPE, field, v, why));
        if !(1..=MAX_WINDOW_MS).contains(&p.window_duration_ms) {
            return bad(
                "windowDurationMs",
                p.window_duration_ms,
                "must be 1 to 10000",
            );
        }
        if p.max_per_replica != UNLIMITED && p.max_per_replica < 1 {
            return bad(
                "maxPerReplica",
                p.max_per_replica,
                "must be -1 (no limit) or >= 1",
            );
        }
        if p.block_size_tokens <= 0 {
            return bad("blockSizeTokens", p.block_size_tokens, "must be > 0");
        }
        if p.max_prefix_tokens_to_match < 0
            || (p.max_prefix_tokens_to_match > 0
                && p.max_prefix_tokens_to_match < p.block_size_tokens)
        {
            return bad(
                "maxPrefixTokensToMatch",
                p.max_prefix_tokens_to_match,
                "must be 0 or at least blockSizeTokens",
            );
        }
        if p.min_colocate_blocks < 0 {
            return bad("minColocateBlocks", p.min_colocate_blocks, "must be >= 0");
        }
        if p.max_batch_size != UNLIMITED && p.max_batch_size < 1 {
            return bad(
                "maxBatchSize",
                p.max_batch_size,
                "must be -1 (no limit) or >= 1",
            );
        }
        let by_tokens = match p.balance_by.as_str() {
            "requests" | "" => false,
            "tokens" => true,
            other => {
                return Err(invalid(
                    Self::TYPE,
                    "balanceBy",
                    other,
                    "must be requests or tokens",
                ));
            }
        };
        let as_usize = |v: i64| usize::try_from(v).unwrap_or(usize::MAX);
        let max_blocks = if p.max_prefix_tokens_to_match > 0 {
            as_usize(p.max_prefix_tokens_to_match / p.block_size_tokens)
        } else {
            DEFAULT_MAX_BLOCKS
        };
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 40);
        Ok(Self {
            name: name.into(),
            window: Duration::from_millis(p.window_duration_ms.unsigned_abs()),
            max_per_replica: p.max_per_replica,
            block_tokens: as_usize(p.block_size_tokens),
            max_blocks,
            min_colocate: as_usize(p.min_colocate_blocks),
            max_batch: p.max_batch_size,
            by_tokens,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            windows: Mutex::new(Vec::new()),
            slot: PrefixSlot::default(),
        })
    }
}

impl BurstPrefixCacheProducer {
    fn hashes(&self, request: &InferenceRequest) -> Vec<u64> {
        let mut out = Vec::new();
        block_hashes(
            request.prompt.as_bytes(),
            self.block_tokens * CHARS_PER_TOKEN,
            self.max_blocks,
            seed(&request.target_model, request.cache_salt.as_deref()),
            &mut out,
        );
        out
    }

    /// Places a closed window's units over `replicas` (see the module docs).
    fn place(&self, entries: &mut [Entry], replicas: &[Candidate]) {
        if replicas.is_empty() {
            return;
        }
        // Units: identical prefixes, in arrival order.
        let mut order: Vec<&[u64]> = Vec::new();
        let mut groups: HashMap<&[u64], Vec<usize>> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            if e.hashes.is_empty() {
                continue;
            }
            let g = groups.entry(&e.hashes).or_default();
            if g.is_empty() {
                order.push(&e.hashes);
            }
            g.push(i);
        }
        let mut shared: HashSet<&[u64]> = HashSet::new();
        if self.min_colocate > 0 {
            let mut count: HashMap<&[u64], usize> = HashMap::new();
            for key in order.iter().filter(|k| k.len() >= self.min_colocate) {
                *count.entry(&key[..self.min_colocate]).or_default() += groups[key].len();
            }
            shared.extend(
                order.iter().filter(|k| {
                    k.len() >= self.min_colocate && count[&k[..self.min_colocate]] >= 2
                }),
            );
        }
        let mut group_units: Vec<&[u64]> = order
            .iter()
            .copied()
            .filter(|k| groups[k].len() >= 2)
            .collect();
        let mut single_units: Vec<&[u64]> = order
            .iter()
            .copied()
            .filter(|k| groups[k].len() == 1 && shared.contains(k))
            .collect();
        group_units.sort_by_key(|k| std::cmp::Reverse(k.len()));
        single_units.sort_by_key(|k| std::cmp::Reverse(k.len()));
        let units: Vec<&[u64]> = group_units.into_iter().chain(single_units).collect();
        if units.is_empty() {
            return;
        }
        let total: usize = units
            .iter()
            .map(|k| {
                if self.by_tokens {
                    k.len()
                } else {
                    groups[k].len()
                }
            })
            .sum();
        let max_share = total.div_ceil(replicas.len());
        let mut placement = Placement {
            producer: self,
            replicas,
            holders: HashMap::new(),
            load: vec![0; replicas.len()],
            max_share,
        };
        let mut assigned: Vec<(usize, usize)> = Vec::new();
        for key in units {
            placement.place_unit(key, &groups[key], &mut assigned);
        }
        for (entry, replica) in assigned {
            entries[entry].assigned = Some(replicas[replica].id());
        }
    }
}

/// The state of placing one window.
struct Placement<'a> {
    producer: &'a BurstPrefixCacheProducer,
    replicas: &'a [Candidate],
    /// Which replicas hold each block placed so far.
    holders: HashMap<u64, HashSet<usize>>,
    /// Load per replica in this window (requests, or blocks).
    load: Vec<usize>,
    max_share: usize,
}

impl Placement<'_> {
    /// Leading blocks of `hashes` each replica holds already.
    fn longest_prefix(&self, hashes: &[u64]) -> Vec<usize> {
        let mut out = vec![0; self.replicas.len()];
        for h in hashes {
            let Some(holders) = self.holders.get(h).filter(|s| !s.is_empty()) else {
                break;
            };
            for &r in holders {
                out[r] += 1;
            }
        }
        out
    }

    /// Whether replica `a` is preferred to `b`: less load in this window,
    /// then fewer running requests, then the lower address (llm-d's order).
    fn less(&self, a: usize, b: usize) -> bool {
        let key = |r: usize| {
            let c = &self.replicas[r];
            (self.load[r], c.metrics.running, c.endpoint.addr())
        };
        key(a) < key(b)
    }

    fn has_room(&self, per: &[usize], r: usize) -> bool {
        let k = self.producer.max_per_replica;
        k == UNLIMITED || (per[r] as i64) < k
    }

    fn pick(&self, per: &[usize], matches: &[usize], prefer_match: bool) -> usize {
        let n = self.replicas.len();
        if prefer_match {
            let min = self.producer.min_colocate;
            let best = (0..n)
                .filter(|&r| self.has_room(per, r) && self.load[r] < self.max_share)
                .filter(|&r| matches[r] >= min)
                .reduce(|b, r| {
                    if matches[r] > matches[b] || (matches[r] == matches[b] && self.less(r, b)) {
                        r
                    } else {
                        b
                    }
                });
            if let Some(r) = best {
                return r;
            }
        }
        let least = |rs: &mut dyn Iterator<Item = usize>| {
            rs.reduce(|b, r| if self.less(r, b) { r } else { b })
        };
        least(&mut (0..n).filter(|&r| self.has_room(per, r)))
            .or_else(|| least(&mut (0..n)))
            .unwrap_or(0)
    }

    /// Places the requests `members` sharing the prefix `hashes`.
    fn place_unit(&mut self, hashes: &[u64], members: &[usize], out: &mut Vec<(usize, usize)>) {
        let p = self.producer;
        let mut prefer_match = p.min_colocate > 0;
        let matches = if prefer_match || p.by_tokens {
            self.longest_prefix(hashes)
        } else {
            vec![0; self.replicas.len()]
        };
        let mut per = vec![0usize; self.replicas.len()];
        let mut targets: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < members.len() {
            let r = self.pick(&per, &matches, prefer_match);
            let mut run = members.len() - i;
            if p.max_per_replica != UNLIMITED {
                let left = (p.max_per_replica - per[r] as i64).max(1);
                run = run.min(usize::try_from(left).unwrap_or(usize::MAX));
            }
            for &m in &members[i..i + run] {
                out.push((m, r));
            }
            let first_touch = per[r] == 0;
            per[r] += run;
            if !p.by_tokens {
                self.load[r] += run;
            } else if first_touch {
                self.load[r] += hashes.len().saturating_sub(matches[r]);
            }
            if !targets.contains(&r) {
                targets.push(r);
            }
            i += run;
            prefer_match = false;
        }
        for r in targets {
            for &h in hashes {
                self.holders.entry(h).or_default().insert(r);
            }
        }
    }
}

impl Plugin for BurstPrefixCacheProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_request_hold(&self) -> Option<&dyn RequestHold> {
        Some(self)
    }
    fn bind_prefix_slot(&self, slot: usize) -> bool {
        self.slot.set(slot);
        true
    }
}

impl RequestHold for BurstPrefixCacheProducer {
    fn hold(&self, request: &InferenceRequest, now: Instant) -> Option<Instant> {
        let hashes = self.hashes(request);
        let mut windows = self.windows.lock();
        // Windows nobody came back for (streams that ended while held).
        windows.retain(|w| {
            now.saturating_duration_since(w.end) < self.window * 10 + Duration::from_secs(10)
        });
        let open = windows
            .last()
            .filter(|w| now < w.end && !w.placed)
            .is_some();
        if !open {
            windows.push(Window {
                end: now + self.window,
                entries: Vec::new(),
                placed: false,
            });
        }
        let w = windows.last_mut()?;
        if self.max_batch != UNLIMITED && w.entries.len() as i64 >= self.max_batch {
            return None;
        }
        w.entries.push(Entry {
            request_id: request.request_id.clone(),
            hashes,
            assigned: None,
        });
        Some(w.end)
    }
}

impl DataProducer for BurstPrefixCacheProducer {
    fn produce(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) {
        let id = &cx.request.request_id;
        let found = {
            let mut windows = self.windows.lock();
            let at = windows
                .iter()
                .rposition(|w| w.entries.iter().any(|e| &e.request_id == id));
            at.and_then(|wi| {
                let w = &mut windows[wi];
                if !w.placed {
                    w.placed = true;
                    self.place(&mut w.entries, candidates);
                }
                let ei = w.entries.iter().position(|e| &e.request_id == id)?;
                let entry = w.entries.swap_remove(ei);
                if w.entries.is_empty() {
                    windows.remove(wi);
                }
                Some(entry)
            })
        };
        let prefix = cx.state.prefix_at_mut(self.slot.get());
        if prefix.computed {
            return;
        }
        prefix.computed = true;
        prefix.producer = self.id;
        prefix.block_size_tokens = u32::try_from(self.block_tokens).unwrap_or(u32::MAX);
        let Some(entry) = found else {
            return;
        };
        let total = u32::try_from(entry.hashes.len()).unwrap_or(u32::MAX);
        prefix.hashes = entry.hashes;
        if let Some(target) = entry.assigned {
            prefix.set_matched(target, total);
        }
    }
    fn produces_prefix_matches(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
