//! The approximate prefix index: which endpoint was sent which prompt blocks,
//! bounded per endpoint, in at most 46 bytes per (block, endpoint) entry.
//!
//! Layout (the reference keeps a map of maps and a linked-list LRU per server,
//! ~490 bytes per block):
//! - one slab of 24-byte entries `{hash, endpoint, lru prev/next, chain
//!   next}`, allocated in chunks of 4,096 so growing never copies and never
//!   leaves more than one chunk of slack;
//! - one open-addressing table of 8-byte slots `{entry or holders index, low
//!   24 bits of the hash, number of holders}` (load ≤ 3/4, linear probing,
//!   backward-shift deletion), keyed by the block hash itself — block hashes
//!   are already uniformly mixed, so the low bits are the home slot; keeping
//!   them in the slot lets probes, deletions and growth run without reading
//!   any entry (up to 2^24 slots), and the holder count lets a match count
//!   a block's holders without walking its chain;
//! - entries holding the same hash on different endpoints form a singly-linked
//!   chain (chains are as long as the number of endpoints holding a block, so
//!   unlinking walks one); each endpoint's entries form a doubly-linked LRU
//!   list in which a recorded prompt is one run, head first;
//! - a block held by one or two endpoints has its chain's first entry in the
//!   table slot; a block held by three or more has a 24-byte [`holders`]
//!   record there instead `{hash, bit per holder below id 64, chain head}`,
//!   so that a match learns its holders from one word rather than a walk of
//!   its chain (one cache miss per holder), and a record learns whether an
//!   endpoint holds it from one bit; only holders with ids of 64 and above
//!   are found by walking. The record costs at most 8 bytes per entry of the
//!   block, whose table slot is shared by as many entries, so an entry costs
//!   at most 46 bytes whatever the sharing (35–46 with one holder per block,
//!   at most 40 with three or more).
//!
//! Recording touches the table only for blocks the endpoint did not hold and
//! for the blocks it evicts: held blocks are reached through the run's links
//! (see `Inner::record_run`). Once every endpoint's LRU is full, recording
//! evicts one entry per new one and reuses its slot: the index then allocates
//! nothing.
//!
//! An index made with [`PrefixIndex::in_background`] applies records on a
//! writer thread of its own (see [`background`]); every read still sees
//! every record made before it.

use std::sync::{Arc, Weak};

use bytemuck::{Pod, Zeroable};
use epp_core::{Endpoint, EndpointId, PrefixMatch};
use parking_lot::{RwLock, RwLockReadGuard};

use self::{
    background::Background,
    holders::{Holders, bit},
    pages::Pages,
    slab::{Record, Slab},
};

mod background;
mod holders;
mod pages;
mod slab;

const NIL: u32 = u32::MAX;
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// One block held by one endpoint.
#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: u64,
    endpoint: u32,
    /// Towards the most recently used entry of the same endpoint.
    prev: u32,
    /// Towards the least recently used (or the next free entry).
    next: u32,
    /// Next entry with the same hash (another endpoint).
    chain: u32,
}

const EMPTY: Entry = Entry {
    hash: 0,
    endpoint: NIL,
    prev: NIL,
    next: NIL,
    chain: NIL,
};

impl Record for Entry {
    /// Free entries are linked through `next`.
    fn freed(next_free: u32) -> Self {
        Self {
            next: next_free,
            ..EMPTY
        }
    }
    fn next_free(&self) -> u32 {
        self.next
    }
}

/// A table slot: the block's entry when one endpoint holds it, else its
/// [`holders`] record; in `tag` the hash's low [`FP_BITS`] bits (its home
/// slot in tables of up to 2^`FP_BITS` slots) under the chain's length (how
/// many endpoints hold the block), saturating at [`MANY`].
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
struct Slot {
    idx: u32,
    tag: u32,
}

const FP_BITS: u32 = 24;
const FP_MASK: u32 = (1 << FP_BITS) - 1;
/// A holder count of `MANY` means "`MANY` or more": the chain says how many.
const MANY: u32 = u32::MAX >> FP_BITS;

/// The largest table mask whose home slots the fingerprint holds. Tests
/// lower it so that their larger tables take the other path, through the
/// entry's hash.
const FP_HOME_MAX: usize = if cfg!(test) { 255 } else { FP_MASK as usize };

const FREE: Slot = Slot { idx: NIL, tag: 0 };

/// Holders from which a block has a [`holders`] record. Below, its chain is
/// short enough to walk: a record for two would cost a P/D decision's
/// records (whose every new block gets a second holder, the other role's
/// endpoint) a record made and one dropped per block, for a walk of one
/// entry more.
const SHARED: u32 = 3;

impl Slot {
    fn fp(self) -> u32 {
        self.tag & FP_MASK
    }

    /// Endpoints holding the block, or [`MANY`] for that many or more.
    fn holders(self) -> u32 {
        self.tag >> FP_BITS
    }

    fn set_holders(&mut self, n: u32) {
        self.tag = self.fp() | (n.min(MANY) << FP_BITS);
    }

    /// Whether `idx` names a [`holders`] record ([`SHARED`] holders or
    /// more) rather than the chain's first entry.
    fn shared(self) -> bool {
        self.holders() >= SHARED
    }
}

fn fingerprint(hash: u64) -> u32 {
    hash as u32 & FP_MASK
}

/// One endpoint's LRU list.
#[derive(Debug)]
struct Lru {
    /// Most recently used.
    head: u32,
    /// Least recently used (evicted first).
    tail: u32,
    len: u32,
    /// The endpoint, to notice when it is gone (no strong reference left).
    endpoint: Weak<Endpoint>,
}

impl Default for Lru {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
            endpoint: Weak::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: Slab<Entry>,
    /// Each hash's entry or holders record; `idx == NIL` = empty slot.
    /// Probed at random, so in huge pages once it is large (see [`pages`]).
    table: Pages<Slot>,
    /// The holders of blocks held by two endpoints or more.
    holders: Slab<Holders>,
    /// Occupied table slots (distinct hashes).
    distinct: usize,
    /// Per endpoint, by id.
    lrus: Vec<Lru>,
    /// Records since the last sweep for departed endpoints.
    since_sweep: u32,
    /// Times the index took more memory: slab chunks and table doublings
    /// (the table's may come from the kernel rather than the allocator).
    growths: u64,
}

/// The approximate index: which endpoint was sent which blocks, bounded per
/// endpoint. Safe to share: matching takes a read lock, recording a write lock.
#[derive(Debug)]
pub struct PrefixIndex {
    /// Shared with the writer thread, when there is one.
    inner: Arc<RwLock<Inner>>,
    /// Queued records and their writer (see [`Self::in_background`]).
    background: Option<Background>,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner::default())),
            background: None,
        }
    }
}

/// How many records pass between sweeps for endpoints that left the pool.
const SWEEP_EVERY: u32 = 64;

impl PrefixIndex {
    /// An empty index whose records are applied off the caller's path: each
    /// record is copied into a queue of at most `queue` records (at least
    /// one) and applied, in the order queued, by a writer thread the index
    /// starts on its first record and stops when dropped.
    ///
    /// Every read (a match, or one of the inspection methods) first applies
    /// the records still queued, helping the writer, so it sees every record
    /// made before it, as with an index that records in place. A caller
    /// gains a record's time when the writer has applied it before the next
    /// read: requests further apart than the writer's lag (one record's
    /// application when it is awake, up to 200 µs while it polls). When the
    /// queue is full, the recording caller applies the oldest queued record
    /// itself before queueing its own, so nothing is lost and the order
    /// holds; [`Self::applied_by_callers`] counts those. If the thread cannot
    /// be started, every record is applied by its caller.
    #[must_use]
    pub fn in_background(queue: usize) -> Self {
        Self::queued(queue, true)
    }

    /// An empty index whose records are queued, as with
    /// [`Self::in_background`], but with no writer thread: they are applied
    /// by [`Self::flush`], which a server calls once it has sent the
    /// decision's reply, or else by the next read, which applies whatever is
    /// still queued before it reads. A decision then returns without its
    /// record's time and without waking any thread; the server pays the
    /// record after its reply went. When the queue of at most `queue`
    /// records is full, the recording caller applies the oldest first.
    #[must_use]
    pub fn after_reply(queue: usize) -> Self {
        Self::queued(queue, false)
    }

    /// An empty index that applies each record in place while records are
    /// cheap and queues it for [`Self::flush`], as [`Self::after_reply`]
    /// does, while they are not: one record in four is timed, wherever it
    /// is applied, and records are queued once their moving average (a
    /// sample counting as four times `defer_above` at most) is above
    /// `defer_above`, in place again once it is below half of that.
    /// A record that moves a few blocks of an index held in the processor's
    /// caches costs about what queueing it would; one that moves hundreds
    /// of cold entries costs several times the rest of a decision, and is
    /// then better paid after the reply.
    #[must_use]
    pub fn adaptive(queue: usize, defer_above: std::time::Duration) -> Self {
        let index = Self::default();
        let adaptive = background::Adaptive::new(defer_above);
        let background = Background::new(Arc::clone(&index.inner), queue, false, Some(adaptive));
        Self {
            background: Some(background),
            ..index
        }
    }

    fn queued(queue: usize, threaded: bool) -> Self {
        let index = Self::default();
        let background = Background::new(Arc::clone(&index.inner), queue, threaded, None);
        Self {
            background: Some(background),
            ..index
        }
    }

    /// Whether records are applied by a writer thread.
    #[must_use]
    pub fn is_background(&self) -> bool {
        self.background
            .as_ref()
            .is_some_and(Background::is_threaded)
    }

    /// Whether records are, or may be, queued for [`Self::flush`] after the
    /// reply ([`Self::after_reply`], [`Self::adaptive`]).
    #[must_use]
    pub fn records_after_reply(&self) -> bool {
        self.background.as_ref().is_some_and(|b| !b.is_threaded())
    }

    /// Whether a record made now would be queued rather than applied in
    /// place: always for [`Self::after_reply`] and [`Self::in_background`],
    /// never for an index that records in place, and for
    /// [`Self::adaptive`] while recent records cost more than its threshold.
    #[must_use]
    pub fn defers_records(&self) -> bool {
        self.background.as_ref().is_some_and(Background::deferring)
    }

    /// For an [`Self::adaptive`] index, the moving average of the timed
    /// records' application times, once one was timed.
    #[must_use]
    pub fn record_cost(&self) -> Option<std::time::Duration> {
        self.background.as_ref().and_then(Background::record_cost)
    }

    /// Applies every record queued before the call (helping the writer
    /// with them, if there is one). Reads do this themselves; it is for a
    /// caller that wants the records' cost paid now rather than by the next
    /// read: a server after its reply, for an [`Self::after_reply`] index.
    /// Costs two atomic loads when nothing is queued; immediate for an index
    /// that records in place.
    pub fn flush(&self) {
        if let Some(b) = &self.background {
            b.flush();
        }
    }

    /// Records queued and not yet applied (0 for an index that records in
    /// place).
    #[must_use]
    pub fn queued_records(&self) -> usize {
        self.background.as_ref().map_or(0, Background::unapplied)
    }

    /// The index to read, once the records queued before are applied.
    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        if let Some(b) = &self.background {
            b.settle();
        }
        self.inner.read()
    }

    /// Records queued for the writer thread that a recording caller applied
    /// because the queue was full (0 for an index that records in place).
    #[must_use]
    pub fn applied_by_callers(&self) -> u64 {
        self.background
            .as_ref()
            .map_or(0, Background::applied_by_callers)
    }

    /// Records `hashes` (a prompt's chained block hashes, in prompt order, as
    /// [`crate::block_hashes`] makes them: each hash stands for its whole
    /// prefix) as cached on `id`, evicting its least recently used blocks
    /// beyond `capacity`. The blocks are touched last-to-first, so the prompt's head
    /// is the most recent and the last to be evicted: a tail without its
    /// head can never match, a head without its tail still does.
    pub fn record(&self, id: EndpointId, hashes: &[u64], capacity: usize) {
        self.record_inner(id, None, hashes, capacity, 0);
    }

    /// Like [`Self::record`], remembering `endpoint` so that its blocks are
    /// dropped once nothing else holds it (it left the pool).
    pub fn record_for(&self, endpoint: &Arc<Endpoint>, hashes: &[u64], capacity: usize) {
        self.record_inner(endpoint.id(), Some(endpoint), hashes, capacity, 0);
    }

    /// Like [`Self::record_for`], told how many leading blocks of `hashes`
    /// the endpoint held when they were matched ([`Self::match_prefix`] in
    /// the same cycle). The number is a hint: it saves the search for the
    /// held part when it is still true, and is checked, so a stale one (the
    /// index changed since the match) costs only that search.
    pub fn record_matched(
        &self,
        endpoint: &Arc<Endpoint>,
        hashes: &[u64],
        capacity: usize,
        matched: u32,
    ) {
        self.record_inner(endpoint.id(), Some(endpoint), hashes, capacity, matched);
    }

    /// [`Self::record_matched`] for two endpoints in turn (a P/D decision's
    /// decode and prefill endpoints): in the background, one copy of
    /// `hashes` is queued for both. Each is `(endpoint, capacity, matched)`.
    pub fn record_matched_both(
        &self,
        hashes: &[u64],
        first: (&Arc<Endpoint>, usize, u32),
        second: (&Arc<Endpoint>, usize, u32),
    ) {
        fn target((endpoint, capacity, matched): (&Arc<Endpoint>, usize, u32)) -> Target<'_> {
            Target {
                id: endpoint.id(),
                endpoint: Some(endpoint),
                capacity,
                matched,
            }
        }
        self.record_targets(hashes, &[target(first), target(second)]);
    }

    fn record_inner(
        &self,
        id: EndpointId,
        endpoint: Option<&Arc<Endpoint>>,
        hashes: &[u64],
        capacity: usize,
        matched: u32,
    ) {
        let target = Target {
            id,
            endpoint,
            capacity,
            matched,
        };
        self.record_targets(hashes, &[target]);
    }

    fn record_targets(&self, hashes: &[u64], targets: &[Target<'_>]) {
        match &self.background {
            Some(b) => b.submit(hashes, targets),
            None => {
                for t in targets {
                    apply(&self.inner, hashes, t);
                }
            }
        }
    }

    /// Forgets everything recorded for `id` (an endpoint that left), after
    /// applying the records queued before.
    pub fn forget(&self, id: EndpointId) {
        self.flush();
        let Ok(ep) = u32::try_from(id.index()) else {
            return;
        };
        let mut inner = self.inner.write();
        if id.index() < inner.lrus.len() {
            inner.forget(ep);
        }
    }
}

/// An endpoint to record a prompt's blocks for, with the LRU capacity to
/// keep and the matched-blocks hint (see [`PrefixIndex::record_matched`]).
struct Target<'a> {
    id: EndpointId,
    endpoint: Option<&'a Arc<Endpoint>>,
    capacity: usize,
    matched: u32,
}

/// Records `hashes` for `target` in `index`.
fn apply(index: &RwLock<Inner>, hashes: &[u64], target: &Target<'_>) {
    let Target {
        id,
        endpoint,
        capacity,
        matched,
    } = *target;
    let capacity = u32::try_from(capacity).unwrap_or(u32::MAX - 1).max(1);
    let Ok(ep) = u32::try_from(id.index()) else {
        return;
    };
    if ep == NIL {
        return;
    }
    // One hold of the write lock for the whole record. (Letting waiting
    // readers in between slices of evictions was tried: in a closed loop on
    // a busy machine each hand-over cost the writer a context switch, and
    // decisions took twice as long.)
    let mut inner = index.write();
    let inner = &mut *inner;
    if inner.lrus.len() <= id.index() {
        inner.lrus.resize_with(id.index() + 1, Lru::default);
    }
    // Track the endpoint object last recorded for this id: a relabelled
    // endpoint is a new object with the same id, and only the object in
    // the current snapshot tells whether it is still in the pool. (Between
    // a relabel and its next pick a sweep may drop its blocks: only
    // affinity is lost, and relabels are rare.)
    if let Some(e) = endpoint
        && inner.lrus[id.index()].endpoint.as_ptr() != Arc::as_ptr(e)
    {
        inner.lrus[id.index()].endpoint = Arc::downgrade(e);
    }
    // Blocks past the capacity would be evicted again at once.
    let hashes = &hashes[..hashes.len().min(capacity as usize)];
    // Out of entries or table slots (2^32): record what fitted, then
    // still enforce the capacity.
    let _ = inner.record_run(ep, hashes, matched as usize);
    let over = inner.lrus[id.index()].len.saturating_sub(capacity);
    inner.warm_tail(ep, over as usize);
    for _ in 0..over {
        inner.evict_tail(ep);
    }
    inner.since_sweep += 1;
    if inner.since_sweep >= SWEEP_EVERY {
        inner.since_sweep = 0;
        inner.sweep();
    }
}

impl PrefixIndex {
    /// Writes into `m`, per endpoint, how many leading blocks of `hashes` it
    /// holds, contiguously from the first block.
    ///
    /// Every endpoint's set of blocks is prefix-closed along any chain: a
    /// chained hash is only ever recorded together with the hashes before it,
    /// and those are touched after it, so they are evicted after it. Holding
    /// block `i` therefore implies holding blocks `0..i`, the number of
    /// endpoints holding block `i` never grows with `i`, and the matches are
    /// found by binary search: about `log2(blocks)` lookups per distinct match
    /// length instead of one per block.
    pub fn match_prefix(&self, hashes: &[u64], m: &mut PrefixMatch) {
        let inner = self.read();
        // Whether more than `n` endpoints hold block `i`: the slot's count
        // answers without reading the chain, unless both are [`MANY`] or more.
        let held_by_more = |i: usize, n: usize| -> bool {
            inner.find_slot(hashes[i]).is_some_and(|slot| {
                let slot = inner.table[slot];
                let counted = slot.holders() as usize;
                if counted < MANY as usize || n < MANY as usize {
                    return counted > n;
                }
                inner.chain_len(inner.head(slot), n + 1) > n
            })
        };
        // Endpoints assigned so far all hold every block below `end`; `seen`
        // has the bits of those below id 64.
        let (mut end, mut assigned, mut seen) = (hashes.len(), 0, 0u64);
        loop {
            // The last block below `end` held by more than `assigned` endpoints.
            let (mut lo, mut hi) = (0, end);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if held_by_more(mid, assigned) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if lo == 0 {
                break;
            }
            let i = lo - 1;
            let Ok(len) = u32::try_from(lo) else {
                break;
            };
            let mut assign = |ep: u32| {
                let id = EndpointId(ep);
                if m.matched(id) == 0 {
                    m.set_matched(id, len);
                }
            };
            assigned = 0;
            if let Some(slot) = inner.find_slot(hashes[i]) {
                let slot = inner.table[slot];
                if slot.shared() {
                    let holders = inner.holders.get(slot.idx);
                    let mut fresh = holders.mask & !seen;
                    seen |= holders.mask;
                    while fresh != 0 {
                        assign(fresh.trailing_zeros());
                        fresh &= fresh - 1;
                    }
                    let bits = holders.mask.count_ones();
                    if slot.holders() < MANY {
                        assigned = slot.holders() as usize;
                    }
                    // Holders the bits do not name (ids of 64 and above),
                    // or too many to count: walk the chain for them.
                    if slot.holders() > bits {
                        let mut idx = holders.head;
                        let mut walked = 0;
                        while idx != NIL {
                            let e = inner.entry(idx);
                            if bit(e.endpoint) == 0 {
                                assign(e.endpoint);
                            }
                            walked += 1;
                            idx = e.chain;
                        }
                        assigned = walked;
                    }
                } else {
                    let mut idx = slot.idx;
                    while idx != NIL {
                        let e = inner.entry(idx);
                        seen |= bit(e.endpoint);
                        assign(e.endpoint);
                        assigned += 1;
                        idx = e.chain;
                    }
                }
            }
            end = i;
        }
    }

    /// Blocks remembered for `id`.
    #[must_use]
    pub fn len_for(&self, id: EndpointId) -> usize {
        self.read()
            .lrus
            .get(id.index())
            .map_or(0, |l| l.len as usize)
    }

    /// Endpoints with any block remembered.
    #[must_use]
    pub fn endpoint_count(&self) -> usize {
        self.read().lrus.iter().filter(|l| l.len > 0).count()
    }

    /// (block, endpoint) entries held.
    #[must_use]
    pub fn entries(&self) -> usize {
        self.read().lrus.iter().map(|l| l.len as usize).sum()
    }

    /// How many times the index has taken more memory (a slab chunk or a
    /// larger table). An index whose endpoints' LRUs are full takes none:
    /// each new block reuses an evicted one's entry and slot.
    #[must_use]
    pub fn growths(&self) -> u64 {
        self.read().growths
    }

    /// Bytes the index holds (slab chunks, table — on the heap or in its own
    /// mapping —, shared blocks' holders records and per-endpoint lists).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        let inner = self.read();
        inner.entries.bytes()
            + inner.table.bytes()
            + inner.holders.bytes()
            + inner.lrus.capacity() * size_of::<Lru>()
    }

    /// [`heap_bytes`](Self::heap_bytes) per (block, endpoint) entry: what
    /// remembering one block on one endpoint costs (0 entries count as 1).
    #[must_use]
    pub fn bytes_per_entry(&self) -> f64 {
        self.heap_bytes() as f64 / self.entries().max(1) as f64
    }
}

#[cfg(test)]
impl PrefixIndex {
    /// Checks that every endpoint holds a leading run of `hashes` (chained
    /// hashes) and nothing after a gap: what `match_prefix`'s search needs.
    fn check_prefix_closed(&self, hashes: &[u64]) {
        let inner = self.inner.read();
        for ep in 0..inner.lrus.len() {
            let ep = u32::try_from(ep).expect("few endpoints");
            let held = hashes
                .iter()
                .take_while(|&&h| inner.held(h, ep).is_some())
                .count();
            assert!(
                hashes[held..].iter().all(|&h| inner.held(h, ep).is_none()),
                "endpoint {ep}: a block held after a gap at {held}"
            );
        }
    }

    /// Per endpoint id, how many leading blocks of `hashes` it holds, found
    /// by walking every block's chain of entries (what matching did before
    /// shared blocks had holder bits): the reference for `match_prefix`.
    fn match_by_chains(&self, hashes: &[u64]) -> Vec<u32> {
        let inner = self.inner.read();
        let mut matched = vec![0u32; inner.lrus.len()];
        let mut alive: Vec<bool> = vec![true; inner.lrus.len()];
        for (i, &h) in hashes.iter().enumerate() {
            let mut holding = vec![false; inner.lrus.len()];
            if let Some(s) = inner.find_slot(h) {
                let mut idx = inner.head(inner.table[s]);
                while idx != NIL {
                    holding[inner.entry(idx).endpoint as usize] = true;
                    idx = inner.entry(idx).chain;
                }
            }
            for ep in 0..matched.len() {
                alive[ep] &= holding[ep];
                if alive[ep] {
                    matched[ep] = u32::try_from(i + 1).expect("few blocks");
                }
            }
        }
        matched
    }

    /// Checks the structure: every endpoint's list is consistently linked
    /// with its length, every listed entry is findable through its hash's
    /// chain, and every chained entry is listed.
    fn check(&self) {
        let inner = self.inner.read();
        let mut listed = 0;
        for (ep, lru) in inner.lrus.iter().enumerate() {
            let (mut idx, mut prev, mut n) = (lru.head, NIL, 0);
            while idx != NIL {
                let e = inner.entry(idx);
                assert_eq!(e.prev, prev, "endpoint {ep}: back link");
                assert_eq!(e.endpoint as usize, ep, "endpoint {ep}: owner");
                assert_eq!(
                    inner.held(e.hash, e.endpoint),
                    Some(idx),
                    "endpoint {ep}: chained"
                );
                prev = idx;
                idx = e.next;
                n += 1;
                assert!(n <= lru.len, "endpoint {ep}: list longer than its length");
            }
            assert_eq!(lru.tail, prev, "endpoint {ep}: tail");
            assert_eq!(n, lru.len, "endpoint {ep}: length");
            listed += n as usize;
        }
        let (mut chained, mut shared) = (0, 0);
        for &slot in inner.table.iter().filter(|s| s.idx != NIL) {
            let hash = inner.slot_hash(slot);
            assert_eq!(fingerprint(hash), slot.fp());
            let (mut idx, mut n, mut mask) = (inner.head(slot), 0, 0);
            while idx != NIL {
                let e = inner.entry(idx);
                assert_eq!(e.hash, hash, "a chain holds one hash");
                mask |= bit(e.endpoint);
                n += 1;
                idx = e.chain;
            }
            assert_eq!(slot.holders(), n.min(MANY), "the slot counts its chain");
            if n >= SHARED {
                assert_eq!(
                    inner.holders.get(slot.idx).mask,
                    mask,
                    "the bits name the holders"
                );
                shared += 1;
            }
            chained += n as usize;
        }
        assert_eq!(listed, chained, "every entry is both listed and chained");
        assert_eq!(
            inner.holders.live(),
            shared,
            "a record per shared block, no more"
        );
    }
}

// === impl Inner ===

impl Inner {
    fn entry(&self, idx: u32) -> &Entry {
        self.entries.get(idx)
    }

    fn entry_mut(&mut self, idx: u32) -> &mut Entry {
        self.entries.get_mut(idx)
    }

    fn mask(&self) -> usize {
        self.table.len().wrapping_sub(1)
    }

    /// The hash of an occupied slot's block.
    fn slot_hash(&self, slot: Slot) -> u64 {
        if slot.shared() {
            self.holders.get(slot.idx).hash
        } else {
            self.entry(slot.idx).hash
        }
    }

    /// The first entry of an occupied slot's chain.
    fn head(&self, slot: Slot) -> u32 {
        if slot.shared() {
            self.holders.get(slot.idx).head
        } else {
            slot.idx
        }
    }

    /// The table slot of `hash`'s chain.
    fn find_slot(&self, hash: u64) -> Option<usize> {
        let table: &[Slot] = &self.table;
        if table.is_empty() {
            return None;
        }
        let mask = table.len() - 1;
        let fp = fingerprint(hash);
        let mut s = hash as usize & mask;
        loop {
            let slot = table[s];
            if slot.idx == NIL {
                return None;
            }
            if slot.fp() == fp && self.slot_hash(slot) == hash {
                return Some(s);
            }
            s = (s + 1) & mask;
        }
    }

    /// Loads the table slots and chain heads of `hashes` with independent
    /// reads, so the processor overlaps their cache misses instead of taking
    /// them one after another in the dependent walk that follows.
    fn warm(&self, hashes: &[u64]) {
        let table: &[Slot] = &self.table;
        if table.is_empty() {
            return;
        }
        let mask = table.len() - 1;
        let mut acc = 0u64;
        for &h in hashes {
            // The home slot's entry only if it may hold this hash: reading a
            // colliding one would be a wasted miss.
            let slot = table[h as usize & mask];
            if slot.idx != NIL && slot.fp() == fingerprint(h) {
                acc ^= self.slot_hash(slot);
            }
        }
        std::hint::black_box(acc);
    }

    /// Loads the table slots of the `n` blocks `ep` would evict next, for the
    /// same reason as [`Self::warm`].
    fn warm_tail(&self, ep: u32, n: usize) {
        let table: &[Slot] = &self.table;
        if table.is_empty() {
            return;
        }
        let mask = table.len() - 1;
        let mut acc = 0u32;
        let mut idx = self.lrus[ep as usize].tail;
        for _ in 0..n {
            if idx == NIL {
                break;
            }
            let e = self.entry(idx);
            acc ^= table[e.hash as usize & mask].idx;
            idx = e.prev;
        }
        // Then the holders records of shared blocks (found at their home
        // slot, now loaded), which unlinking reads before the chain.
        let mut idx = self.lrus[ep as usize].tail;
        for _ in 0..n {
            if idx == NIL {
                break;
            }
            let e = self.entry(idx);
            let slot = table[e.hash as usize & mask];
            if slot.idx != NIL && slot.shared() && slot.fp() == fingerprint(e.hash) {
                acc ^= self.holders.get(slot.idx).head;
            }
            idx = e.prev;
        }
        std::hint::black_box(acc);
    }

    /// Entries in the chain from `idx`, counting at most `limit`.
    fn chain_len(&self, mut idx: u32, limit: usize) -> usize {
        let mut n = 0;
        while idx != NIL && n < limit {
            n += 1;
            idx = self.entry(idx).chain;
        }
        n
    }

    /// `slot`'s home in a table of `mask + 1` slots: from its fingerprint
    /// while the table is small enough, else from its entry's hash.
    fn home(&self, slot: Slot, mask: usize) -> usize {
        if mask <= FP_HOME_MAX {
            slot.fp() as usize & mask
        } else {
            self.slot_hash(slot) as usize & mask
        }
    }

    /// Whether endpoint `ep` holds `hash`: for a shared block and an id
    /// below 64, from its bit alone.
    fn holds(&self, hash: u64, ep: u32) -> bool {
        let Some(s) = self.find_slot(hash) else {
            return false;
        };
        let slot = self.table[s];
        if slot.shared() && bit(ep) != 0 {
            return self.holders.get(slot.idx).mask & bit(ep) != 0;
        }
        self.held(hash, ep).is_some()
    }

    /// The entry holding `hash` for endpoint `ep`.
    fn held(&self, hash: u64, ep: u32) -> Option<u32> {
        let slot = self.table[self.find_slot(hash)?];
        // The bits answer "no" for ids below 64 without a walk.
        if slot.shared() && bit(ep) != 0 && self.holders.get(slot.idx).mask & bit(ep) == 0 {
            return None;
        }
        let mut idx = self.head(slot);
        while idx != NIL {
            let e = self.entry(idx);
            if e.endpoint == ep {
                return Some(idx);
            }
            idx = e.chain;
        }
        None
    }

    /// Makes `hashes` the `hashes.len()` most recent blocks of `ep`, in
    /// prompt order (the head most recent), without evicting. None when the
    /// index is out of entries or table slots.
    ///
    /// Cost is what makes this the hot path: an endpoint that was sent this
    /// prefix before holds its blocks as one run of its LRU list (a record
    /// leaves them so, and later records move other runs, not split this
    /// one). So the held part is found by a binary search over the blocks
    /// (`log2(blocks)` lookups), walked towards the head through the list's
    /// `prev` links (entries allocated together, checked against the block
    /// hash; a table lookup only where the run was broken), and moved to the
    /// front; only the blocks the endpoint never held touch the table, each
    /// linked right after its predecessor.
    ///
    /// `hint` (0 for none) claims that `ep` holds the first `hint` blocks
    /// and not the next: checked with two lookups instead of the search.
    fn record_run(&mut self, ep: u32, hashes: &[u64], hint: usize) -> Option<()> {
        // Blocks held contiguously from the first (holding block `i` implies
        // holding the blocks before it; see `match_prefix`).
        let (mut lo, mut hi) = (0, hashes.len());
        if (1..=hashes.len()).contains(&hint) && self.holds(hashes[hint - 1], ep) {
            // True when the next block is not held: the search is done.
            lo = hint;
            if hint == hashes.len() || !self.holds(hashes[hint], ep) {
                hi = hint;
            }
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.holds(hashes[mid], ep) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let held = lo;
        // The deepest held block's entry: the walk below starts there.
        let last_held = match held {
            0 => NIL,
            _ => self.held(hashes[held - 1], ep).unwrap_or(NIL),
        };
        self.warm(&hashes[held..]);
        // Held blocks, deepest first, each moved to the front.
        let mut cur = last_held;
        for i in (0..held).rev() {
            let idx = if cur != NIL && self.entry(cur).hash == hashes[i] {
                cur
            } else if let Some(idx) = self.held(hashes[i], ep) {
                idx
            } else {
                // Not prefix-closed after all (hashes that are not chained).
                let idx = self.new_entry(hashes[i], ep)?;
                self.push_front(idx);
                cur = NIL;
                continue;
            };
            cur = self.entry(idx).prev;
            self.unlink_lru(idx);
            self.push_front(idx);
        }
        // New blocks, each right behind its predecessor.
        // The deepest held block, found by the search and still linked.
        let mut last = last_held;
        for &h in &hashes[held..] {
            let idx = match self.held(h, ep) {
                // A repeated block of this prompt (not chained hashes).
                Some(idx) if idx == last => continue,
                Some(idx) => {
                    self.unlink_lru(idx);
                    idx
                }
                None => self.new_entry(h, ep)?,
            };
            if last == NIL {
                self.push_front(idx);
            } else {
                self.insert_after(last, idx);
            }
            last = idx;
        }
        Some(())
    }

    /// A fresh entry for `hash` on `ep`, linked into its hash chain but not
    /// into the endpoint's LRU list.
    fn new_entry(&mut self, hash: u64, ep: u32) -> Option<u32> {
        let (idx, grew) = self.entries.alloc(Entry {
            hash,
            endpoint: ep,
            ..EMPTY
        })?;
        self.growths += u64::from(grew);
        if self.link_chain(idx) {
            return Some(idx);
        }
        self.entries.free(idx);
        None
    }

    /// Puts `idx` at the head of its hash's chain, adding the hash to the
    /// table if new. False when the table cannot take another hash (2^32
    /// slots: not reachable in practice, but never loop on a full table).
    fn link_chain(&mut self, idx: u32) -> bool {
        let Entry {
            hash, endpoint: ep, ..
        } = *self.entry(idx);
        if let Some(s) = self.find_slot(hash) {
            let slot = self.table[s];
            if slot.shared() {
                let holders = self.holders.get_mut(slot.idx);
                let head = std::mem::replace(&mut holders.head, idx);
                holders.mask |= bit(ep);
                self.entry_mut(idx).chain = head;
            } else if slot.holders() + 1 < SHARED {
                self.entry_mut(idx).chain = slot.idx;
                self.table[s].idx = idx;
            } else {
                // Enough holders for the block to get its holders record.
                let (mut mask, mut other) = (bit(ep), slot.idx);
                while other != NIL {
                    mask |= bit(self.entry(other).endpoint);
                    other = self.entry(other).chain;
                }
                let Some((record, grew)) = self.holders.alloc(Holders::new(hash, mask, idx)) else {
                    return false;
                };
                self.growths += u64::from(grew);
                self.entry_mut(idx).chain = slot.idx;
                self.table[s].idx = record;
            }
            let slot = &mut self.table[s];
            slot.set_holders(slot.holders() + 1);
            return true;
        }
        if (self.distinct + 1) * 4 > self.table.len() * 3 {
            self.grow();
        }
        if self.distinct + 1 >= self.table.len() {
            return false;
        }
        let mask = self.mask();
        let mut s = hash as usize & mask;
        while self.table[s].idx != NIL {
            s = (s + 1) & mask;
        }
        self.entry_mut(idx).chain = NIL;
        self.table[s] = Slot {
            idx,
            tag: fingerprint(hash) | (1 << FP_BITS),
        };
        self.distinct += 1;
        true
    }

    fn grow(&mut self) {
        let size = (self.table.len() * 2).max(64);
        if size > 1 << 32 {
            return;
        }
        let old = std::mem::replace(&mut self.table, Pages::filled(size, FREE));
        self.growths += 1;
        let mask = size - 1;
        for &slot in old.iter().filter(|s| s.idx != NIL) {
            let mut s = self.home(slot, mask);
            while self.table[s].idx != NIL {
                s = (s + 1) & mask;
            }
            self.table[s] = slot;
        }
    }

    /// Removes `idx` from its hash's chain, and the hash from the table when
    /// no endpoint holds it any more.
    fn unlink_chain(&mut self, idx: u32) {
        let Entry {
            hash,
            endpoint: ep,
            chain: next,
            ..
        } = *self.entry(idx);
        let Some(s) = self.find_slot(hash) else {
            return;
        };
        let slot = self.table[s];
        let head = self.head(slot);
        if !slot.shared() {
            if head == idx {
                if next == NIL {
                    self.remove_slot(s);
                    return;
                }
                self.table[s].idx = next;
            } else if !self.unlink_after(head, idx, next) {
                return;
            }
            self.table[s].set_holders(slot.holders() - 1);
            return;
        }
        if head == idx {
            self.holders.get_mut(slot.idx).head = next;
        } else if !self.unlink_after(head, idx, next) {
            return;
        }
        self.holders.get_mut(slot.idx).mask &= !bit(ep);
        self.uncount(s);
    }

    /// Unlinks `idx` (followed by `next`) from the chain after `head`;
    /// false if it is not there.
    fn unlink_after(&mut self, head: u32, idx: u32, next: u32) -> bool {
        let mut prev = head;
        while prev != NIL {
            let after = self.entry(prev).chain;
            if after == idx {
                self.entry_mut(prev).chain = next;
                return true;
            }
            prev = after;
        }
        false
    }

    /// One holder fewer in the shared block of `slot` (recounted when it
    /// was [`MANY`]); below [`SHARED`], the slot names the chain's first
    /// entry again.
    fn uncount(&mut self, s: usize) {
        let slot = self.table[s];
        let head = self.holders.get(slot.idx).head;
        let n = match slot.holders() {
            MANY => self.chain_len(head, MANY as usize) as u32,
            n => n - 1,
        };
        if n < SHARED {
            self.holders.free(slot.idx);
            self.table[s].idx = head;
        }
        self.table[s].set_holders(n);
    }

    /// Backward-shift deletion: later members of the probe run move into the
    /// hole when their home slot allows, so lookups never need tombstones.
    fn remove_slot(&mut self, slot: usize) {
        let mask = self.mask();
        let mut hole = slot;
        let mut j = (slot + 1) & mask;
        loop {
            let slot = self.table[j];
            if slot.idx == NIL {
                break;
            }
            let home = self.home(slot, mask);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.table[hole] = slot;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.table[hole] = FREE;
        self.distinct -= 1;
    }

    fn push_front(&mut self, idx: u32) {
        let ep = self.entry(idx).endpoint as usize;
        let head = self.lrus[ep].head;
        {
            let e = self.entry_mut(idx);
            e.prev = NIL;
            e.next = head;
        }
        if head != NIL {
            self.entry_mut(head).prev = idx;
        } else {
            self.lrus[ep].tail = idx;
        }
        self.lrus[ep].head = idx;
        self.lrus[ep].len += 1;
    }

    /// Links `idx` into its endpoint's list right behind `after` (same endpoint).
    fn insert_after(&mut self, after: u32, idx: u32) {
        let ep = self.entry(idx).endpoint as usize;
        let next = self.entry(after).next;
        {
            let e = self.entry_mut(idx);
            e.prev = after;
            e.next = next;
        }
        self.entry_mut(after).next = idx;
        if next != NIL {
            self.entry_mut(next).prev = idx;
        } else {
            self.lrus[ep].tail = idx;
        }
        self.lrus[ep].len += 1;
    }

    fn unlink_lru(&mut self, idx: u32) {
        let Entry {
            endpoint,
            prev,
            next,
            ..
        } = *self.entry(idx);
        let lru = &mut self.lrus[endpoint as usize];
        if prev == NIL {
            lru.head = next;
        }
        if next == NIL {
            lru.tail = prev;
        }
        lru.len -= 1;
        if prev != NIL {
            self.entry_mut(prev).next = next;
        }
        if next != NIL {
            self.entry_mut(next).prev = prev;
        }
    }

    fn release(&mut self, idx: u32) {
        self.unlink_chain(idx);
        self.entries.free(idx);
    }

    fn evict_tail(&mut self, ep: u32) {
        let idx = self.lrus[ep as usize].tail;
        if idx == NIL {
            return;
        }
        self.unlink_lru(idx);
        self.release(idx);
    }

    fn forget(&mut self, ep: u32) {
        let mut idx = self.lrus[ep as usize].head;
        while idx != NIL {
            let next = self.entry(idx).next;
            self.release(idx);
            idx = next;
        }
        self.lrus[ep as usize] = Lru::default();
    }

    /// Drops the blocks of endpoints recorded with [`PrefixIndex::record_for`]
    /// that nothing holds any more.
    fn sweep(&mut self) {
        for ep in 0..self.lrus.len() {
            let lru = &self.lrus[ep];
            // `Weak::new()` (never given an endpoint) has no strong count either.
            let gone = lru.len > 0
                && lru.endpoint.strong_count() == 0
                && !Weak::ptr_eq(&lru.endpoint, &Weak::new());
            if gone && let Ok(ep) = u32::try_from(ep) {
                self.forget(ep);
            }
        }
    }
}

#[cfg(test)]
mod tests;
