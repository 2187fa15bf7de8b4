//! The scheduling cycle as the reference defines it: hash the prompt, match
//! it against the prefix index, run the default profile's scorers over every
//! candidate, pick, and record the pick in the index.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench cycle
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use epp_plugins::{Builtin, PrefixCacheScorer, PrefixCacheScorerParams, builtin_registry};
use epp_test_support::workload::Workload;

fn bench(c: &mut Criterion, group: &str, endpoints: usize, kib: usize) {
    // Built on first use, so a filtered-out setup costs nothing.
    let mut setup: Option<Workload<PrefixCacheScorer>> = None;
    let mut g = c.benchmark_group(group);
    g.bench_function(BenchmarkId::new(format!("{endpoints}ep"), format!("{kib}KiB")), |b| {
        let w = setup.get_or_insert_with(|| {
            let prefix = PrefixCacheScorer::build(PrefixCacheScorer::TYPE, PrefixCacheScorerParams::default())
                .expect("default parameters are valid");
            let mut w = Workload::new(endpoints, kib, &builtin_registry(), Arc::new(prefix));
            w.warm(10_000);
            eprintln!(
                "{group} {endpoints} endpoints × {kib} KiB: index {} entries, {:.1} bytes per block",
                w.prefix.index().entries(),
                w.prefix.index().bytes_per_entry()
            );
            w
        });
        b.iter_custom(|iters| w.time_cycles(iters));
    });
    g.finish();
}

fn cycle(c: &mut Criterion) {
    bench(c, "cycle", 64, 16);
}

fn scaling(c: &mut Criterion) {
    for endpoints in [8, 64, 512] {
        for kib in [1, 16, 256] {
            bench(c, "scaling", endpoints, kib);
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
