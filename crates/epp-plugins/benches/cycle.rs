//! The scheduling cycle as the reference defines it: hash the prompt, match
//! it against the prefix index, run the default profile's scorers over every
//! candidate, pick, and record the pick in the index. `cycle-latency` runs
//! the learned-latency profile (`examples/configs/predicted-latency.yaml`:
//! the default profile's scorers with a prediction per candidate and
//! `latency-scorer` beside them) on the same requests, its models trained,
//! for the side-by-side figure;
//! `cycle-default+latency` adds the predictor and a weight-0 `latency-scorer`
//! to the default profile: the same picks as `cycle`, so the difference is
//! the latency plugins' own cost, without the prefix-index churn their
//! different picks cause. `cycle-pd` is a P/D decision (decode pick, then a
//! prefill pick for each prompt whose uncached part is long enough: here
//! every prompt's unique quarter) on a fleet of 32 prefill and 32 decode
//! servers; `cycle-decode-only` the same fleet and decode profile alone.
//!
//! Every group without a suffix records in the decision (`recordMode:
//! inPlace`): the whole cycle's work, the figure compared with the
//! reference's. `…-auto` is `recordMode: auto`, the default: records in the
//! decision while they are cheap, queued and applied as for `…-after-reply`
//! while they are not. `…-after-reply` is `recordMode: afterReply`:
//! the decision queues its record, and after each timed cycle the bench runs
//! the scheduler's deferred work, untimed, as the server does once its reply
//! is written: the time a request waits for its decision. `…-background`
//! is `recordMode: writer`, the records applied off the decision by the
//! index's writer thread: after each timed cycle the bench applies them,
//! untimed (helping the writer), as in a server whose requests arrive
//! slower than the writer applies their records; the cycle still pays
//! queueing them and waking the writer. `…-background-closed-loop` does not
//! wait: each decision's match applies the previous decision's record
//! unless the writer took it first (then it waits for the writer's).
//! `benches/record_modes.rs` has the paced figures in which the writer, on
//! the other core, applies every record.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench cycle
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use epp_plugins::{
    Builtin, PrefixCacheScorer, PrefixCacheScorerParams, RecordMode, builtin_registry,
};
use epp_test_support::workload::{Profile, Workload};

fn bench(c: &mut Criterion, group: &str, endpoints: usize, kib: usize) {
    bench_profile(c, group, endpoints, kib, Profile::Default);
}

fn bench_profile(c: &mut Criterion, group: &str, endpoints: usize, kib: usize, profile: Profile) {
    bench_recording(c, group, endpoints, kib, profile, Recording::InPlace);
}

/// How the prefix scorer's index records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recording {
    /// Within the cycle (`recordMode: inPlace`).
    InPlace,
    /// Queued, applied after each cycle, untimed, by the scheduler's
    /// deferred work (`recordMode: afterReply`).
    AfterReply,
    /// In the cycle or queued as the last records' cost says, the queued
    /// ones applied as for `AfterReply` (`recordMode: auto`, the default).
    Auto,
    /// In the background, the records applied after each cycle, untimed.
    Background,
    /// In the background, never waited for.
    BackgroundClosedLoop,
}

fn bench_recording(
    c: &mut Criterion,
    group: &str,
    endpoints: usize,
    kib: usize,
    profile: Profile,
    recording: Recording,
) {
    // Built on first use, so a filtered-out setup costs nothing.
    let mut setup: Option<Workload<PrefixCacheScorer>> = None;
    let mut g = c.benchmark_group(group);
    g.bench_function(BenchmarkId::new(format!("{endpoints}ep"), format!("{kib}KiB")), |b| {
        let w = setup.get_or_insert_with(|| {
            let mut params = PrefixCacheScorerParams::default();
            params.index.record_mode = match recording {
                Recording::InPlace => RecordMode::InPlace,
                Recording::AfterReply => RecordMode::AfterReply,
                Recording::Auto => RecordMode::Auto,
                Recording::Background | Recording::BackgroundClosedLoop => RecordMode::Writer,
            };
            let prefix = PrefixCacheScorer::build(PrefixCacheScorer::TYPE, params)
                .expect("default parameters are valid");
            let mut w =
                Workload::with_profile(endpoints, kib, &builtin_registry(), Arc::new(prefix), profile);
            w.warm(10_000);
            w.prefix.index().flush();
            eprintln!(
                "{group} {endpoints} endpoints × {kib} KiB: index {} entries, {:.1} bytes per block",
                w.prefix.index().entries(),
                w.prefix.index().bytes_per_entry()
            );
            w
        });
        b.iter_custom(|iters| match recording {
            Recording::AfterReply | Recording::Auto => {
                w.time_cycles_then(iters, |w| w.scheduler.run_deferred())
            }
            Recording::Background => w.time_cycles_then(iters, |w| w.prefix.index().flush()),
            Recording::InPlace | Recording::BackgroundClosedLoop => w.time_cycles(iters),
        });
    });
    g.finish();
    if let Some(w) = &setup
        && let Some(cost) = w.prefix.index().record_cost()
    {
        eprintln!(
            "{group}: a record {:.2} µs on average, {}",
            cost.as_secs_f64() * 1e6,
            if w.prefix.index().defers_records() {
                "applied after the reply"
            } else {
                "applied in the decision"
            }
        );
    }
    if let Some(w) = &setup
        && recording == Recording::BackgroundClosedLoop
    {
        eprintln!(
            "{group}: records applied in a cycle because the queue was full: {}",
            w.prefix.index().applied_by_callers()
        );
    }
}

fn cycle(c: &mut Criterion) {
    bench(c, "cycle", 64, 16);
    bench_profile(c, "cycle-latency", 64, 16, Profile::Latency);
    bench_profile(
        c,
        "cycle-default+latency",
        64,
        16,
        Profile::DefaultPlusLatency,
    );
    bench_profile(c, "cycle-pd", 64, 16, Profile::Disaggregated);
    bench_profile(c, "cycle-decode-only", 64, 16, Profile::DecodeOnly);
    bench_recording(
        c,
        "cycle-after-reply",
        64,
        16,
        Profile::Default,
        Recording::AfterReply,
    );
    for (suffix, recording) in [
        ("auto", Recording::Auto),
        ("after-reply", Recording::AfterReply),
        ("background", Recording::Background),
        ("background-closed-loop", Recording::BackgroundClosedLoop),
    ] {
        for (name, profile) in [
            ("cycle-pd", Profile::Disaggregated),
            ("cycle-decode-only", Profile::DecodeOnly),
        ] {
            bench_recording(c, &format!("{name}-{suffix}"), 64, 16, profile, recording);
        }
    }
}

fn scaling(c: &mut Criterion) {
    for endpoints in [8, 64, 512] {
        for kib in [1, 16, 256] {
            bench(c, "scaling", endpoints, kib);
        }
    }
    // What a record costs by fleet and prompt size, and where `auto` moves
    // it after the reply (printed once each group is done).
    for endpoints in [4, 8, 64, 512] {
        for kib in [1, 4, 16, 256] {
            bench_recording(
                c,
                "scaling-auto",
                endpoints,
                kib,
                Profile::Default,
                Recording::Auto,
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = cycle, scaling
}
criterion_main!(benches);
