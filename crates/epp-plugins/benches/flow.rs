//! Flow control with 10,000 queued requests: the cost of one dispatch
//! decision (pick the band, the flow by the fairness policy, the head by the
//! ordering policy; hand it over; release the next when it is routed), and
//! the memory a queued request holds in the controller.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench flow
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use epp_plugins::builtin_registry;
use epp_test_support::flow::{Queued, controller};

const QUEUED: usize = 10_000;

fn dispatch(c: &mut Criterion) {
    let registry = builtin_registry();
    let mut g = c.benchmark_group("flow_dispatch");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for (name, fairness, ordering, flows, bands) in [
        (
            "10k/1flow/strict-fcfs",
            "global-strict-fairness-policy",
            "fcfs-ordering-policy",
            1,
            1,
        ),
        (
            "10k/100flows/strict-fcfs",
            "global-strict-fairness-policy",
            "fcfs-ordering-policy",
            100,
            1,
        ),
        (
            "10k/100flows/round-robin-edf",
            "round-robin-fairness-policy",
            "edf-ordering-policy",
            100,
            1,
        ),
        (
            "10k/100flows/4bands/round-robin-fcfs",
            "round-robin-fairness-policy",
            "fcfs-ordering-policy",
            100,
            4,
        ),
    ] {
        // One "iteration" = one request released (per-request figure).
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0u64;
                while done < iters {
                    let (fc, switch) = controller(&registry, fairness, ordering);
                    let mut q = Queued::fill(fc, switch, QUEUED, flows, bands);
                    let t0 = Instant::now();
                    let order = q.drain();
                    let took = t0.elapsed();
                    assert_eq!(order.len(), QUEUED);
                    // Scale to the iterations asked for.
                    let n = (iters - done).min(QUEUED as u64);
                    total += took.mul_f64(n as f64 / QUEUED as f64);
                    done += n;
                }
                total
            });
        });
    }
    g.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
