//! Records applied off the request path. The recording caller copies the
//! blocks into a bounded queue and returns; the queued records are applied,
//! in order, either by a writer thread the index starts (as llm-d's producer
//! applies its records in a `PreRequest` goroutine), or, with no writer, by
//! whoever calls [`super::PrefixIndex::flush`]: a server once it has sent
//! the decision's reply (`Scheduler::run_deferred`), so the record follows
//! the reply instead of delaying it.
//!
//! Unlike llm-d's, no read sees a stale index: every read of the index
//! (a match, an inspection) first applies, helping the writer, the records
//! still queued (see [`Background::settle`]; nothing queued costs two atomic
//! loads). A decision therefore sees every record made before it, as when
//! recording in place; what it saves is the records applied since the last
//! decision: all of them when requests arrive further apart than the
//! writer's lag, or when the server applies them after each reply; none
//! when they come back to back (a decision then applies its predecessor's
//! record, as it would have waited for it in place).
//!
//! This moves the work, it does not remove it: a record costs whoever
//! applies it what it cost the caller, plus the copy and, when a writer
//! sleeps, a wake-up. What the request path gains is the record's time.
//! Readers (matches) still take the index's read lock, and a record holds
//! the write lock throughout (see [`super::apply`]): a match that meets a
//! record being applied waits for the rest of it.
//!
//! Waking a sleeping thread is a system call, and on a busy machine the woken
//! writer may take the caller's core: measured, it cost a decision more than
//! the record it saved. So the caller never wakes a writer that is merely
//! between records: once the queue is empty the writer looks again every
//! [`POLL`] (a record waits that long at most) and only after [`LINGER`]
//! without records does it sleep until woken, flagging that the next record
//! must wake it. Under dense traffic (records less than [`LINGER`] apart)
//! the request path makes no system call; sparser traffic pays one wake-up
//! per record. Each look costs the writer a timer and a context switch, so
//! the linger is kept short: lingering 10 ms, as this writer first did, cost
//! 2.5–3.7 times the CPU of recording in place at 200 decisions a second (50
//! looks a record); 400 µs, 0.7–1.4 times (the `record_modes` benchmark,
//! whose CPU figures are noisy). Without a writer there is no wake-up at
//! all: the records are applied on the server's own thread, after the write
//! of its replies.
//!
//! When the queue is full the caller waits for the writer (or a flushing
//! server) to take a record from it, if one is applying a record; else it
//! applies the oldest queued record itself. Either way it then queues its
//! own: back-pressure, nothing dropped, and the request path pays again only
//! while the records are not applied as fast as they come. (Helping while
//! another applies would queue the caller behind that record and then make
//! it apply a second one.) Records are taken from the queue and applied
//! under one mutex, so whoever applies them applies them in queue order.
//!
//! An adaptive queue ([`Adaptive`], `recordMode: auto`) decides per record:
//! it times one record in [`SAMPLE_EVERY`], wherever it is applied, and
//! queues records only while their recent average costs more than its
//! threshold, applying them in place (after anything still queued) when
//! they are cheaper. A record of a few blocks in an index that fits the
//! processor's caches takes a microsecond or two, and queueing it saves the
//! reply little; one that moves hundreds of cold entries costs several
//! times the rest of the decision.

use std::{
    collections::VecDeque,
    fmt,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use epp_core::{Endpoint, EndpointId};
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use super::Inner;

/// How often an idle writer looks for records before it sleeps.
const POLL: Duration = Duration::from_micros(200);

/// How long a writer keeps looking after its last record: two looks.
const LINGER: Duration = Duration::from_micros(400);

/// One record in this many is timed by an [`Adaptive`] queue (timing one
/// takes two clock reads, ~70 ns on the 2-vCPU benchmark machine, against
/// the microsecond or more a record costs).
const SAMPLE_EVERY: u32 = 4;

/// How an adaptive queue ([`super::PrefixIndex::adaptive`]) chooses: the
/// moving average of the sampled records' application times (each sample
/// weighs 1/8), against a threshold, with hysteresis: records are queued
/// once the average is above the threshold, and applied in place again once
/// it is below half of it.
#[derive(Debug)]
pub(super) struct Adaptive {
    defer_above_ns: u64,
    /// Nanoseconds; 0 before the first sample.
    average_ns: AtomicU64,
    deferring: AtomicBool,
    calls: AtomicU32,
}

impl Adaptive {
    pub(super) fn new(defer_above: Duration) -> Self {
        Self {
            defer_above_ns: u64::try_from(defer_above.as_nanos()).unwrap_or(u64::MAX),
            average_ns: AtomicU64::new(0),
            deferring: AtomicBool::new(false),
            calls: AtomicU32::new(0),
        }
    }

    fn deferring(&self) -> bool {
        self.deferring.load(Ordering::Relaxed)
    }

    /// The average record's time, once one was timed.
    fn average(&self) -> Option<Duration> {
        match self.average_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Applies one record, timing it if it is the sampled one.
    fn apply(&self, index: &RwLock<Inner>, hashes: &[u64], target: &super::Target<'_>) {
        if !self
            .calls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SAMPLE_EVERY)
        {
            super::apply(index, hashes, target);
            return;
        }
        let start = Instant::now();
        super::apply(index, hashes, target);
        self.observe(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }

    /// Folds one record's time into the average (updates from concurrent
    /// callers may overwrite each other: a sample lost, nothing worse). A
    /// sample counts as at most four times the threshold: a record stalled
    /// by preemption (hundreds of microseconds on a busy machine) alone
    /// does not tip records that cost half the threshold or less over it;
    /// two in a row may.
    fn observe(&self, ns: u64) {
        let ns = ns.clamp(1, self.defer_above_ns.saturating_mul(4).max(1));
        let old = self.average_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.average_ns.store(new.max(1), Ordering::Relaxed);
        let deferring = if new > self.defer_above_ns {
            true
        } else if new < self.defer_above_ns / 2 {
            false
        } else {
            return;
        };
        if self.deferring.swap(deferring, Ordering::Relaxed) != deferring {
            tracing::debug!(
                average_us = new as f64 / 1e3,
                after_reply = deferring,
                "prefix index: records now applied {}",
                if deferring {
                    "after the reply"
                } else {
                    "in the decision"
                }
            );
        }
    }
}

/// The queue, and writer if any, of a [`super::PrefixIndex::in_background`]
/// or [`super::PrefixIndex::after_reply`] index.
pub(super) struct Background {
    shared: Arc<Shared>,
    /// Whether a writer thread applies the records.
    threaded: bool,
    /// The writer, started on the first record; `None` inside when it could
    /// not be started (every record is then applied by its caller).
    writer: OnceLock<Option<JoinHandle<()>>>,
}

struct Shared {
    index: Arc<RwLock<Inner>>,
    queue: Mutex<Queue>,
    /// Signalled when a record is queued or the queue closes.
    work: Condvar,
    /// Signalled when a record is taken from the queue.
    space: Condvar,
    /// Held while one record is taken from the queue and applied.
    apply: Mutex<()>,
    /// Records the queue holds at most.
    bound: usize,
    /// Records applied by a caller because the queue was full.
    by_callers: AtomicU64,
    /// Records queued since the start (changed under the queue's lock,
    /// read without it: a read finds "nothing queued" in two loads).
    queued: AtomicU64,
    /// Records applied since the start (by the writer or a caller); raised
    /// under the queue's lock after the record's write lock was let go, so
    /// a read that sees it raised sees the record.
    applied: AtomicU64,
    /// Whether each record is queued by its cost (no writer then).
    adaptive: Option<Adaptive>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Pending>,
    /// Emptied buffers of applied records, reused so that queueing
    /// allocates nothing once the queue has been full once.
    spare: Vec<Pending>,
    /// The index is being dropped: the writer stops.
    closed: bool,
    /// The writer sleeps until woken (it stopped looking after [`LINGER`]).
    asleep: bool,
}

/// A prompt's blocks waiting to be recorded for one or more endpoints (a
/// P/D decision's decode and prefill endpoints share one copy).
#[derive(Default)]
struct Pending {
    hashes: Vec<u64>,
    targets: Vec<Target>,
}

/// One endpoint to record the blocks for.
struct Target {
    id: EndpointId,
    endpoint: Option<Arc<Endpoint>>,
    capacity: usize,
    matched: u32,
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pending = self.shared.queue.lock().pending.len();
        f.debug_struct("Background")
            .field("bound", &self.shared.bound)
            .field("threaded", &self.threaded)
            .field("pending", &pending)
            .field("queued", &self.shared.queued.load(Ordering::Relaxed))
            .field("applied", &self.shared.applied.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Background {
    /// A queue of at most `bound` records (at least one), applied by a
    /// writer thread when `threaded`, else by flushes and reads; when
    /// `adaptive`, only the records that cost more than its threshold are
    /// queued (no writer then).
    pub(super) fn new(
        index: Arc<RwLock<Inner>>,
        bound: usize,
        threaded: bool,
        adaptive: Option<Adaptive>,
    ) -> Self {
        let bound = bound.max(1);
        let threaded = threaded && adaptive.is_none();
        Self {
            shared: Arc::new(Shared {
                index,
                queue: Mutex::new(Queue {
                    pending: VecDeque::with_capacity(bound),
                    ..Queue::default()
                }),
                work: Condvar::new(),
                space: Condvar::new(),
                apply: Mutex::new(()),
                bound,
                by_callers: AtomicU64::new(0),
                queued: AtomicU64::new(0),
                applied: AtomicU64::new(0),
                adaptive,
            }),
            threaded,
            writer: OnceLock::new(),
        }
    }

    /// Whether a writer thread applies the records.
    pub(super) fn is_threaded(&self) -> bool {
        self.threaded
    }

    /// Queues `hashes` to be recorded for each of `targets` in turn (or,
    /// when the writer thread could not be started, or an adaptive queue
    /// finds records cheap, records them at once).
    pub(super) fn submit(&self, hashes: &[u64], targets: &[super::Target<'_>]) {
        if let Some(adaptive) = &self.shared.adaptive
            && !adaptive.deferring()
        {
            // After the records queued before, so that order holds.
            self.settle();
            for t in targets {
                adaptive.apply(&self.shared.index, hashes, t);
            }
            return;
        }
        if !self.threaded {
            self.shared.submit(hashes, targets);
            return;
        }
        let started = self.writer.get_or_init(|| {
            let shared = Arc::clone(&self.shared);
            std::thread::Builder::new()
                .name("epp-prefix-index".into())
                .spawn(move || shared.run())
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "no prefix-index writer thread: recording in place");
                })
                .ok()
        });
        if started.is_none() {
            for t in targets {
                super::apply(&self.shared.index, hashes, t);
            }
            return;
        }
        self.shared.submit(hashes, targets);
    }

    /// Applies, helping the writer, every record queued before the call.
    pub(super) fn flush(&self) {
        self.shared.flush();
    }

    /// [`Self::flush`], for a read: costs two atomic loads when nothing is
    /// queued (the writer keeping up, or recording in the caller's thread).
    pub(super) fn settle(&self) {
        if self.unapplied() > 0 {
            self.shared.flush();
        }
    }

    /// Records queued and not yet applied.
    pub(super) fn unapplied(&self) -> usize {
        // Queued first: records are applied in queue order, so `applied`
        // read after it reaching it means all of those are applied.
        let queued = self.shared.queued.load(Ordering::Acquire);
        let applied = self.shared.applied.load(Ordering::Acquire);
        usize::try_from(queued.saturating_sub(applied)).unwrap_or(usize::MAX)
    }

    pub(super) fn applied_by_callers(&self) -> u64 {
        self.shared.by_callers.load(Ordering::Relaxed)
    }

    /// For an adaptive queue, the recent average time of a record, once
    /// one was timed.
    pub(super) fn record_cost(&self) -> Option<Duration> {
        self.shared.adaptive.as_ref().and_then(Adaptive::average)
    }

    /// Whether an adaptive queue is queueing records now (always true for
    /// any other queue).
    pub(super) fn deferring(&self) -> bool {
        self.shared
            .adaptive
            .as_ref()
            .is_none_or(Adaptive::deferring)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.shared.queue.lock().closed = true;
        self.shared.work.notify_all();
        if let Some(Some(writer)) = self.writer.take() {
            // The writer only returns or applies a record: it cannot fail
            // short of a bug, which its own panic message reports.
            let _ = writer.join();
        }
    }
}

// === impl Shared ===

impl Shared {
    /// The writer: applies queued records until the queue closes.
    fn run(&self) {
        // When a record was last seen queued, and how many had been then (a
        // caller that flushes may apply records before the writer sees them:
        // they count as traffic all the same).
        let (mut last, mut seen) = (Instant::now(), 0);
        loop {
            {
                let mut q = self.queue.lock();
                while q.pending.is_empty() && !q.closed {
                    let queued = self.queued.load(Ordering::Relaxed);
                    if queued != seen {
                        (last, seen) = (Instant::now(), queued);
                    }
                    if last.elapsed() < LINGER {
                        self.work.wait_for(&mut q, POLL);
                    } else {
                        q.asleep = true;
                        self.work.wait(&mut q);
                        q.asleep = false;
                    }
                }
                if q.closed {
                    return;
                }
            }
            self.apply_next();
        }
    }

    fn submit(&self, hashes: &[u64], targets: &[super::Target<'_>]) {
        let mut q = self.queue.lock();
        while q.pending.len() >= self.bound {
            // Whoever holds `apply` takes a record from the queue, under
            // its lock, before it lets `apply` go: waiting cannot miss it.
            let Some(in_order) = self.apply.try_lock() else {
                self.space.wait(&mut q);
                continue;
            };
            drop(q);
            self.by_callers.fetch_add(1, Ordering::Relaxed);
            self.apply_next_holding(in_order);
            q = self.queue.lock();
        }
        let mut p = q.spare.pop().unwrap_or_default();
        p.hashes.extend_from_slice(hashes);
        p.targets.extend(targets.iter().map(|t| Target {
            id: t.id,
            endpoint: t.endpoint.cloned(),
            capacity: t.capacity,
            matched: t.matched,
        }));
        q.pending.push_back(p);
        self.queued.fetch_add(1, Ordering::Release);
        // The flag is read under the lock the writer set it under, before
        // waiting: a writer that is asleep is waiting by now.
        let asleep = q.asleep;
        drop(q);
        if asleep {
            self.work.notify_one();
        }
    }

    /// Applies the oldest queued record, if any (waiting for the one being
    /// applied first).
    fn apply_next(&self) {
        self.apply_next_holding(self.apply.lock());
    }

    /// [`Self::apply_next`], `apply` already held.
    fn apply_next_holding(&self, in_order: MutexGuard<'_, ()>) {
        let Some(mut p) = self.queue.lock().pending.pop_front() else {
            return;
        };
        self.space.notify_one();
        for t in &p.targets {
            let target = super::Target {
                id: t.id,
                endpoint: t.endpoint.as_ref(),
                capacity: t.capacity,
                matched: t.matched,
            };
            match &self.adaptive {
                Some(adaptive) => adaptive.apply(&self.index, &p.hashes, &target),
                None => super::apply(&self.index, &p.hashes, &target),
            }
        }
        p.hashes.clear();
        p.targets.clear();
        let mut q = self.queue.lock();
        self.applied.fetch_add(1, Ordering::Release);
        if q.spare.len() < self.bound {
            q.spare.push(p);
        }
        drop(q);
        drop(in_order);
        // A caller waiting for a place may apply the next record itself now.
        self.space.notify_one();
    }

    /// Applies, helping the writer, until every record queued before the
    /// call is applied.
    fn flush(&self) {
        let target = self.queued.load(Ordering::Acquire);
        while self.applied.load(Ordering::Acquire) < target {
            self.apply_next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PrefixIndex;

    /// The queue without its writer thread: what a caller does alone.
    fn unattended(bound: usize) -> (Arc<RwLock<Inner>>, Shared) {
        let index = PrefixIndex::default();
        let inner = Arc::clone(&index.inner);
        let shared = Shared {
            index: Arc::clone(&inner),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            space: Condvar::new(),
            apply: Mutex::new(()),
            bound,
            by_callers: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            adaptive: None,
        };
        (inner, shared)
    }

    /// Endpoint `e`, no endpoint object, room for 100 blocks, no hint.
    fn target(e: u32) -> crate::prefix_index::Target<'static> {
        crate::prefix_index::Target {
            id: EndpointId(e),
            endpoint: None,
            capacity: 100,
            matched: 0,
        }
    }

    fn len(inner: &RwLock<Inner>, e: u32) -> u32 {
        inner.read().lrus.get(e as usize).map_or(0, |l| l.len)
    }

    #[test]
    fn a_full_queue_makes_the_caller_apply_the_oldest_record() {
        let (inner, shared) = unattended(2);
        // Endpoint i records i + 1 blocks, so each one's length tells
        // which records were applied.
        let record = |e: u32| {
            let hashes: Vec<u64> = (0..=u64::from(e)).map(|k| 100 * u64::from(e) + k).collect();
            shared.submit(&hashes, &[target(e)]);
        };
        record(0);
        record(1);
        assert_eq!(
            (len(&inner, 0), len(&inner, 1)),
            (0, 0),
            "queued, not applied"
        );
        record(2);
        assert_eq!(shared.by_callers.load(Ordering::Relaxed), 1);
        assert_eq!(
            (len(&inner, 0), len(&inner, 1), len(&inner, 2)),
            (1, 0, 0),
            "the oldest applied first, the new one queued"
        );
        record(3);
        assert_eq!((len(&inner, 1), len(&inner, 2), len(&inner, 3)), (2, 0, 0));
        let counts = |s: &Shared| {
            (
                s.queued.load(Ordering::Relaxed),
                s.applied.load(Ordering::Relaxed),
            )
        };
        assert_eq!(counts(&shared), (4, 2));
        let q = shared.queue.lock();
        assert_eq!(q.pending.len(), 2);
        // The applied records' buffers are kept for the next ones.
        assert_eq!(q.spare.len(), 0, "both spares reused by records 2 and 3");
        drop(q);
        shared.flush();
        assert_eq!((len(&inner, 2), len(&inner, 3)), (3, 4));
        assert_eq!(counts(&shared), (4, 4));
        let q = shared.queue.lock();
        assert_eq!((q.pending.len(), q.spare.len()), (0, 2));
    }

    #[test]
    fn a_full_queue_waits_for_a_record_being_applied() {
        let (inner, shared) = unattended(1);
        let shared = Arc::new(shared);
        shared.submit(&[1], &[target(0)]);
        // Stands for the writer, in the middle of applying a record.
        let writer = shared.apply.lock();
        let caller = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || shared.submit(&[2, 3], &[target(1)]))
        };
        // Likely, not needed, for the caller to be waiting by now.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(len(&inner, 1), 0);
        shared.apply_next_holding(writer);
        caller.join().unwrap();
        assert_eq!(
            shared.by_callers.load(Ordering::Relaxed),
            0,
            "the caller waited for the writer's record instead of applying another"
        );
        assert_eq!((len(&inner, 0), len(&inner, 1)), (1, 0));
        shared.flush();
        assert_eq!(len(&inner, 1), 2);
    }

    #[test]
    fn after_the_reply_no_thread_applies_the_records() {
        let index = PrefixIndex::after_reply(4);
        let e = Arc::new(Endpoint::new(0, "10.0.0.1:8000".parse().unwrap()));
        for k in 0..100 {
            index.record_for(&e, &[k, k + 1000], 1000);
        }
        let b = index.background.as_ref().unwrap();
        assert!(b.writer.get().is_none(), "no writer was started");
        // The queue full, each recording caller applied the oldest record.
        assert_eq!(index.queued_records(), 4);
        assert_eq!(index.applied_by_callers(), 96);
        assert_eq!(len(&index.inner, 0), 192);
        // What the server does once its reply is written.
        index.flush();
        assert_eq!(index.queued_records(), 0);
        assert_eq!(len(&index.inner, 0), 200);
    }

    #[test]
    fn an_adaptive_index_queues_records_only_above_its_threshold() {
        let e = Arc::new(Endpoint::new(0, "10.0.0.1:8000".parse().unwrap()));
        // Any record costs more than nothing: queued from the first timed one.
        let index = PrefixIndex::adaptive(4, Duration::ZERO);
        assert!(index.records_after_reply() && !index.is_background());
        assert!(!index.defers_records(), "nothing timed yet");
        index.record_for(&e, &[1, 2], 1000);
        assert_eq!(
            index.queued_records(),
            0,
            "the first record is timed in place"
        );
        assert!(index.defers_records() && index.record_cost().is_some());
        index.record_for(&e, &[3, 4], 1000);
        assert_eq!(index.queued_records(), 1);
        index.flush();
        assert_eq!((index.queued_records(), len(&index.inner, 0)), (0, 4));
        // No record costs that much: always in place, never a queue.
        let index = PrefixIndex::adaptive(4, Duration::MAX);
        for k in 0..20 {
            index.record_for(&e, &[k, k + 1000], 1000);
            assert_eq!(index.queued_records(), 0);
        }
        assert!(!index.defers_records() && index.record_cost().is_some());
        assert_eq!(len(&index.inner, 0), 40);
    }

    #[test]
    fn an_adaptive_queue_switches_with_hysteresis() {
        let a = Adaptive::new(Duration::from_nanos(4_000));
        let after = |ns: &[u64]| {
            for &n in ns {
                a.observe(n);
            }
            (a.average().map(|d| d.as_nanos()), a.deferring())
        };
        // The first sample is the average; then each weighs 1/8.
        assert_eq!(after(&[3_000]), (Some(3_000), false));
        assert_eq!(after(&[11_000]), (Some(4_000), false), "not above");
        assert_eq!(after(&[12_000]), (Some(5_000), true));
        // Below the threshold, not yet below half of it: still queueing.
        assert!(after(&[0; 3]).1);
        let (avg, deferring) = after(&[0; 4]);
        assert!(avg.unwrap() < 2_000 && !deferring, "{avg:?}");
        // Between half and the threshold: in place stays in place.
        assert!(!after(&[3_000; 40]).1);
        // One stalled record counts as four times the threshold at most:
        // alone it does not tip records of half the threshold over it; a
        // second one does.
        let (avg, deferring) = after(&[2_000; 60]);
        assert!(avg.unwrap() <= 2_100 && !deferring, "{avg:?}");
        let (avg, deferring) = after(&[1_000_000]);
        assert!(avg.unwrap() < 4_000 && !deferring, "{avg:?}");
        assert!(after(&[1_000_000]).1);
    }

    #[test]
    fn dropping_the_index_stops_its_writer() {
        let index = PrefixIndex::in_background(4);
        let e = Arc::new(Endpoint::new(0, "10.0.0.1:8000".parse().unwrap()));
        for k in 0..100 {
            index.record_for(&e, &[k, k + 1000], 10);
        }
        let shared = Arc::downgrade(&index.background.as_ref().unwrap().shared);
        drop(index);
        assert!(
            shared.upgrade().is_none(),
            "the writer thread has returned and let go of the queue"
        );
    }
}
