//! The benchmark's cycle, checked for what it promises: no heap allocation per
//! steady-state cycle (counted per thread by a counting global allocator) and
//! at most 50 bytes per indexed block.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use epp_plugins::{
    Builtin, PrefixCacheParams, PrefixCacheScorer, PrefixCacheScorerParams, RecordMode,
    builtin_registry,
};
use epp_test_support::workload::Workload;

/// The benchmark's workload: 64 endpoints, 16 KiB prompts, the prefix index
/// remembering `capacity` blocks per endpoint, recording as by default
/// (`auto`: in the decision or after it, by what records cost).
fn workload(capacity: usize) -> Workload<PrefixCacheScorer> {
    workload_recording(capacity, RecordMode::default())
}

/// [`workload`], recording as `mode` says.
fn workload_recording(capacity: usize, mode: RecordMode) -> Workload<PrefixCacheScorer> {
    let params = PrefixCacheScorerParams {
        index: PrefixCacheParams {
            lru_capacity_per_server: capacity,
            record_mode: mode,
            ..PrefixCacheParams::default()
        },
        ..PrefixCacheScorerParams::default()
    };
    let prefix = PrefixCacheScorer::build(PrefixCacheScorer::TYPE, params).unwrap();
    Workload::new(64, 16, &builtin_registry(), Arc::new(prefix))
}

/// Allocations over `cycles` cycles (request preparation and load changes,
/// which are the client's and the data layer's work, not counted).
fn allocations(w: &mut Workload<PrefixCacheScorer>, cycles: usize) -> u64 {
    let mut total = 0;
    for _ in 0..cycles {
        w.next();
        total += allocation_counter::measure(|| w.cycle()).count_total;
    }
    total
}

#[test]
fn a_full_index_schedules_without_allocating() {
    // 64 endpoints, 16 KiB prompts; each endpoint remembers 2,048 blocks, so
    // after 4,000 requests every LRU is full and each record evicts. Nothing
    // runs the deferred records here: each decision's read applies its
    // predecessor's, in the count.
    for mode in [
        RecordMode::InPlace,
        RecordMode::AfterReply,
        RecordMode::Auto,
    ] {
        let mut w = workload_recording(2_048, mode);
        w.warm(4_000);
        assert!(w.prefix.index().entries() >= 64 * 2_000, "index is full");
        let growths = w.prefix.index().growths();
        assert_eq!(allocations(&mut w, 1_000), 0, "{mode:?}");
        // Nor memory the allocator does not see (a table in huge pages).
        assert_eq!(w.prefix.index().growths(), growths);
        // The counter does count: a fresh result allocates its vectors.
        w.next();
        let fresh = allocation_counter::measure(|| {
            let r = w.scheduler.schedule(&Default::default(), &w.snapshot);
            assert!(r.is_ok());
        });
        assert!(fresh.count_total > 0);
    }
}

#[test]
fn queueing_records_allocates_nothing() {
    for mode in [RecordMode::AfterReply, RecordMode::Writer, RecordMode::Auto] {
        let mut w = workload_recording(2_048, mode);
        w.warm(4_000);
        w.prefix.index().flush();
        assert!(w.prefix.index().entries() >= 64 * 2_000, "index is full");
        let mut total = 0;
        for _ in 0..1_000 {
            w.next();
            // The decision copies its blocks into a buffer an applied record
            // left; the record is applied after, outside the count (as the
            // server does after its reply).
            total += allocation_counter::measure(|| w.cycle()).count_total;
            w.scheduler.run_deferred();
            w.prefix.index().flush();
        }
        assert_eq!(total, 0, "{mode:?}");
    }
}

#[test]
fn the_benchmark_setup_allocates_only_to_grow_the_index() {
    // The setup: the default capacity (31,250 blocks per endpoint) is
    // not reached by 10,000 requests, so the index still grows: one 96 KiB
    // slab chunk per 4,096 new blocks and a table doubling now and then, and
    // nothing else allocates.
    let mut w = workload(PrefixCacheParams::default().lru_capacity_per_server);
    w.warm(10_000);
    let per_block = w.prefix.index().bytes_per_entry();
    assert!(per_block <= 50.0, "{per_block:.1} bytes per indexed block");
    let growths = w.prefix.index().growths();
    let allocs = allocations(&mut w, 1_000);
    let growths = w.prefix.index().growths() - growths;
    eprintln!(
        "{per_block:.1} bytes per indexed block, {} entries; {allocs} allocations and {growths} index \
         growths in 1,000 cycles",
        w.prefix.index().entries()
    );
    // 1,000 requests add ≤ 64 blocks each: ≤ 16 chunks, ≤ 1 table growth
    // (a table in huge pages is mapped, not allocated: counted by the index).
    assert!(allocs <= 20, "{allocs} allocations in 1,000 cycles");
    assert!(
        allocs <= growths + 4,
        "{allocs} allocations for {growths} growths"
    );
    assert!(growths <= 20, "{growths} growths in 1,000 cycles");
}
