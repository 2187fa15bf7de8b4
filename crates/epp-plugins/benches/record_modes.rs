//! Where a decision's prefix-index record is applied, and what a P/D
//! decision (two picks, two records) costs against a single pick, with the
//! record made in place (`recordMode: inPlace`), in place or after the reply
//! by what records cost (`auto`, the default), after the reply
//! (`afterReply`) and by the index's writer thread (`writer`), side by side
//! in one run.
//!
//! The fleet and requests are the cycle benchmark's P/D setup (64 endpoints,
//! 32 prefill and 32 decode, 16 KiB prompts ¾ shared within 256 groups, warm
//! index): `decode only` runs the decode profile alone, `P/D` the decode pick
//! then the prefill pick. Each cycle is timed on its own; the figures are
//! medians and 90th percentiles of 20,000 cycles.
//!
//! - **paced**: after each cycle the bench runs, untimed, the scheduler's
//!   deferred work (after the reply, the server applies the cycle's records
//!   there) and waits until every record is applied (the writer's: the
//!   bench does not help), then until 300 µs have passed since the cycle
//!   began: requests that arrive further apart than the writer's lag (3,300
//!   decisions a second). In place, the same pauses.
//! - **closed loop**: back to back, never waiting and never running the
//!   deferred work: each decision's reads apply the previous decision's
//!   record, unless the writer took it first (a library user that never
//!   calls `Scheduler::run_deferred` gets this).
//! - **CPU at 200/s**: one decision every 5 ms (the thread sleeps between
//!   them), the deferred work run after each, 2,000 decisions: the process's
//!   CPU time (every thread's, `/proc/<pid>/stat`) per decision, the
//!   writer's polls and wake-ups included.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench record_modes
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use common::warmed_workload;
use epp_plugins::RecordMode;
use epp_test_support::{process::cpu_seconds, stats::percentile, workload::Profile};

const CYCLES: usize = 20_000;
const PACE: Duration = Duration::from_micros(300);

/// Median and 90th percentile of a cycle, µs.
fn quantiles(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort_unstable();
    let at = |p: f64| percentile(&t, p).unwrap_or_default().as_secs_f64() * 1e6;
    (at(50.0), at(90.0))
}

const MODES: [RecordMode; 4] = [
    RecordMode::InPlace,
    RecordMode::Auto,
    RecordMode::AfterReply,
    RecordMode::Writer,
];

fn label(mode: RecordMode) -> &'static str {
    match mode {
        RecordMode::InPlace => "in place",
        RecordMode::Auto => "auto",
        RecordMode::AfterReply => "after reply",
        RecordMode::Writer => "writer",
    }
}

/// CPU µs per decision, all threads, at one decision every 5 ms; and the
/// median decision, µs.
fn cpu_at_200(profile: Profile, mode: RecordMode) -> (Option<f64>, f64) {
    const N: usize = 2_000;
    let mut w = warmed_workload(profile, mode);
    // Let a writer that was busy warming the index settle into its pace.
    std::thread::sleep(Duration::from_millis(50));
    let before = cpu_seconds(std::process::id());
    let mut times = Vec::with_capacity(N);
    for _ in 0..N {
        std::thread::sleep(Duration::from_millis(5));
        w.next();
        let t = Instant::now();
        w.cycle();
        times.push(t.elapsed());
        black_box(&w.result);
        w.scheduler.run_deferred();
    }
    // 0 when `/proc` cannot be read (not Linux).
    let spent = cpu_seconds(std::process::id()) - before;
    let cpu = (spent > 0.0).then(|| spent * 1e6 / N as f64);
    (cpu, quantiles(times).0)
}

fn run(profile: Profile, mode: RecordMode, paced: bool) -> (f64, f64) {
    let mut w = warmed_workload(profile, mode);
    let mut times = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        w.next();
        let t = Instant::now();
        w.cycle();
        times.push(t.elapsed());
        black_box(&w.result);
        if paced {
            w.scheduler.run_deferred();
            while w.prefix.index().queued_records() > 0 {
                std::hint::spin_loop();
            }
            while t.elapsed() < PACE {
                std::hint::spin_loop();
            }
        }
    }
    quantiles(times)
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter, if any, is ignored.
    println!(
        "{:<12} {:<11} {:>22} {:>22} {:>14}",
        "loop", "record", "decode only p50 / p90", "P/D p50 / p90", "ratio of p50s"
    );
    for paced in [true, false] {
        for mode in MODES {
            let single = run(Profile::DecodeOnly, mode, paced);
            let pd = run(Profile::Disaggregated, mode, paced);
            println!(
                "{:<12} {:<11} {:>13.2} / {:>6.2} {:>13.2} / {:>6.2} {:>14.2}",
                if paced { "paced" } else { "closed loop" },
                label(mode),
                single.0,
                single.1,
                pd.0,
                pd.1,
                pd.0 / single.0
            );
        }
    }
    println!(
        "\nCPU at 200 decisions/s (all threads, µs per decision; the load change and prompt assembly included)"
    );
    println!(
        "{:<11} {:>30} {:>30}",
        "record", "decode only: CPU / p50 cycle", "P/D: CPU / p50 cycle"
    );
    for mode in MODES {
        let show = |(cpu, p50): (Option<f64>, f64)| {
            cpu.map_or_else(
                || format!("n/a / {p50:.2}"),
                |c| format!("{c:.1} / {p50:.2}"),
            )
        };
        println!(
            "{:<11} {:>30} {:>30}",
            label(mode),
            show(cpu_at_200(Profile::DecodeOnly, mode)),
            show(cpu_at_200(Profile::Disaggregated, mode)),
        );
    }
}
