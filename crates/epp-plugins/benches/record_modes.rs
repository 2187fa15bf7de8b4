//! Where a decision's prefix-index record is applied, and what a P/D
//! decision (two picks, two records) costs against a single pick, with the
//! record made in place and by the index's writer thread
//! (`recordInBackground`), side by side in one run.
//!
//! The fleet and requests are the cycle benchmark's P/D setup (64 endpoints,
//! 32 prefill and 32 decode, 16 KiB prompts ¾ shared within 256 groups, warm
//! index): `decode only` runs the decode profile alone, `P/D` the decode pick
//! then the prefill pick. Each cycle is timed on its own; the figures are
//! medians and 90th percentiles of 20,000 cycles.
//!
//! - **paced**: after each cycle the bench waits, untimed, until the writer
//!   has applied the cycle's records (it does not help), then until 300 µs
//!   have passed since the cycle began: requests that arrive further apart
//!   than the writer's lag (3,300 decisions a second). The next decision
//!   reads an index the writer changed on the other core. In place, the
//!   same pauses.
//! - **closed loop**: back to back, never waiting: each decision's reads
//!   apply the previous decision's record, unless the writer took it first.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench record_modes
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use epp_plugins::{Builtin, PrefixCacheScorer, PrefixCacheScorerParams, builtin_registry};
use epp_test_support::workload::{Profile, Workload};

const CYCLES: usize = 20_000;
const PACE: Duration = Duration::from_micros(300);

/// Median and 90th percentile of a cycle, µs.
fn quantiles(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort_unstable();
    let at = |q: f64| t[((t.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.9))
}

fn run(profile: Profile, background: bool, paced: bool) -> (f64, f64) {
    let mut params = PrefixCacheScorerParams::default();
    params.index.record_in_background = background;
    let prefix = PrefixCacheScorer::build(PrefixCacheScorer::TYPE, params).expect("valid");
    let mut w = Workload::with_profile(64, 16, &builtin_registry(), Arc::new(prefix), profile);
    w.warm(10_000);
    w.prefix.index().flush();
    let mut times = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        w.next();
        let t = Instant::now();
        w.cycle();
        times.push(t.elapsed());
        black_box(&w.result);
        if paced {
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
        "{:<12} {:<10} {:>22} {:>22} {:>14}",
        "loop", "record", "decode only p50 / p90", "P/D p50 / p90", "ratio of p50s"
    );
    for paced in [true, false] {
        for background in [false, true] {
            let single = run(Profile::DecodeOnly, background, paced);
            let pd = run(Profile::Disaggregated, background, paced);
            println!(
                "{:<12} {:<10} {:>13.2} / {:>6.2} {:>13.2} / {:>6.2} {:>14.2}",
                if paced { "paced" } else { "closed loop" },
                if background { "writer" } else { "in place" },
                single.0,
                single.1,
                pd.0,
                pd.1,
                pd.0 / single.0
            );
        }
    }
}
