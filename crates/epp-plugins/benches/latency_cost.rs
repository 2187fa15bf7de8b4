//! The learned-latency profile's scheduling cycle beside the default
//! profile's, measured in one process, interleaved.
//!
//! Issue 15's target is a ratio (the cycle with the latency scorer ≤ 1.2×
//! the default profile's). Criterion measures each group in turn, so on a
//! shared VM the two figures of a ratio come from different minutes, and
//! between processes the same default profile has measured 25–35 µs. Here
//! three workloads of `benches/cycle.rs` (64 endpoints, 16 KiB prompts,
//! records in the decision) are built once and timed in rounds of
//! [`PER_ROUND`] cycles each, the order rotated every round, so that a
//! slow minute slows all three alike:
//!
//! - `default`: the default profile (queue ×2, KV ×2, prefix ×3);
//! - `example`: `examples/configs/predicted-latency.yaml` (the same plus
//!   `latency-scorer` ×4 and `predicted-latency-producer`, models trained);
//! - `default+latency`: the default profile with the trained predictor and
//!   a weight-0 `latency-scorer`, so its picks, and so its index churn, are
//!   the default's: the latency plugins' own cost.
//!
//! It prints each workload's median and p10–p90 per cycle over the rounds,
//! and each ratio to `default` as the median of the per-round ratios with
//! their p10–p90.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench latency_cost            # 40 rounds
//! cargo bench -p epp-plugins --bench latency_cost -- 100     # 100 rounds
//! cargo bench -p epp-plugins --bench latency_cost -- --only example   # one, for perf
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::warmed_workload;
use epp_plugins::RecordMode;
use epp_test_support::{stats::percentile, workload::Profile};

/// Cycles timed per workload per round.
const PER_ROUND: u64 = 400;

/// The 10th, 50th and 90th percentiles of `v`.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |p| percentile(&v, p).unwrap_or(f64::NAN);
    (at(10.0), at(50.0), at(90.0))
}

fn main() {
    // `cargo bench` passes `--bench`; the first plain number is the rounds.
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(40);
    // `--only NAME` times one workload alone (for a profiler).
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let all = [
        ("default", Profile::Default),
        ("example", Profile::Latency),
        ("default+latency", Profile::DefaultPlusLatency),
    ];
    let (names, mut workloads): (Vec<&str>, Vec<_>) = all
        .into_iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
        .map(|(name, profile)| (name, warmed_workload(profile, RecordMode::InPlace)))
        .unzip();
    assert!(
        !names.is_empty(),
        "--only takes default, example or default+latency"
    );
    // One untimed round each, so every workload starts with warm caches.
    for w in &mut workloads {
        w.time_cycles(PER_ROUND);
    }
    let mut per_cycle = vec![Vec::with_capacity(rounds); workloads.len()];
    for round in 0..rounds {
        for k in 0..workloads.len() {
            let i = (round + k) % workloads.len();
            let spent = workloads[i].time_cycles(PER_ROUND);
            per_cycle[i].push(spent.as_secs_f64() * 1e6 / PER_ROUND as f64);
        }
    }
    println!(
        "latency_cost: 64 endpoints × 16 KiB, {rounds} rounds of {PER_ROUND} \
         cycles each, interleaved; µs per cycle"
    );
    println!(
        "{:<16} {:>8} {:>16} {:>14} {:>16}",
        "profile", "median", "p10–p90", "÷ default", "ratio p10–p90"
    );
    for (i, name) in names.iter().enumerate() {
        let ratios: Vec<f64> = per_cycle[i]
            .iter()
            .zip(&per_cycle[0])
            .map(|(x, d)| x / d)
            .collect();
        let (p10, p50, p90) = spread(&per_cycle[i]);
        let (r10, r50, r90) = spread(&ratios);
        println!(
            "{name:<16} {p50:>8.2} {:>16} {r50:>13.3}× {:>16}",
            format!("{p10:.2}–{p90:.2}"),
            format!("{r10:.3}–{r90:.3}")
        );
    }
}
