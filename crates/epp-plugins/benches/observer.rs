//! What the per-plugin latency observer costs per cycle: the cycle benchmark's
//! setup (default profile, 64 endpoints, 16 KiB prompts, warmed index) run
//! without an observer and with one recording every plugin call into
//! Prometheus histograms, as the binary's
//! `inference_extension_plugin_duration_seconds` does. Both variants run in
//! the same process, alternating, so their ratio is measured under the same
//! machine load.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench observer
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use epp_core::{CallSite, SchedulerObserver};
use epp_plugins::{Builtin, PrefixCacheScorer, PrefixCacheScorerParams, builtin_registry};
use epp_test_support::workload::Workload;
use prometheus_client::{
    metrics::histogram::{Histogram, exponential_buckets},
    registry::Registry,
};

/// One histogram per call site, with the binary's buckets (1 µs … ~0.5 s).
#[derive(Debug)]
struct Histograms {
    sites: Vec<Histogram>,
}

impl Histograms {
    fn new(registry: &mut Registry, sites: &[CallSite]) -> Self {
        let sites: Vec<Histogram> = sites
            .iter()
            .map(|_| Histogram::new(exponential_buckets(0.000_001, 2.0, 20)))
            .collect();
        for (i, h) in sites.iter().enumerate() {
            registry.register(format!("plugin_{i}_duration_seconds"), "bench", h.clone());
        }
        Self { sites }
    }
}

impl SchedulerObserver for Histograms {
    fn plugin_call(&self, site: usize, took: Duration) {
        if let Some(h) = self.sites.get(site) {
            h.observe(took.as_secs_f64());
        }
    }
}

fn workload(observed: bool) -> Workload<PrefixCacheScorer> {
    let prefix =
        PrefixCacheScorer::build(PrefixCacheScorer::TYPE, PrefixCacheScorerParams::default())
            .expect("default parameters are valid");
    let mut w = Workload::new(64, 16, &builtin_registry(), Arc::new(prefix));
    if observed {
        let mut registry = Registry::default();
        let histograms = Arc::new(Histograms::new(&mut registry, &w.scheduler.call_sites()));
        eprintln!("observer: {} call sites", histograms.sites.len());
        w.scheduler = w.scheduler.with_observer(histograms);
    }
    w.warm(10_000);
    eprintln!(
        "observer={observed}: index {} entries, {:.1} bytes per block",
        w.prefix.index().entries(),
        w.prefix.index().bytes_per_entry()
    );
    w
}

fn observer(c: &mut Criterion) {
    let mut plain = workload(false);
    let mut observed = workload(true);
    let mut g = c.benchmark_group("observer");
    g.bench_function("64ep-16KiB/none", |b| {
        b.iter_custom(|n| plain.time_cycles(n))
    });
    g.bench_function("64ep-16KiB/prometheus", |b| {
        b.iter_custom(|n| observed.time_cycles(n))
    });
    g.finish();

    // The same two, alternating in rounds, for a ratio under equal load.
    let (mut none, mut prom) = (Duration::ZERO, Duration::ZERO);
    let (rounds, per_round) = (20_u32, 2_000_u32);
    for _ in 0..rounds {
        none += plain.time_cycles(u64::from(per_round));
        prom += observed.time_cycles(u64::from(per_round));
    }
    let n = f64::from(rounds * per_round);
    let (none_us, prom_us) = (none.as_secs_f64() * 1e6 / n, prom.as_secs_f64() * 1e6 / n);
    eprintln!(
        "observer alternating {rounds}×{per_round} cycles: none {none_us:.2} µs, prometheus \
         {prom_us:.2} µs per cycle: +{:.2} µs ({:+.1}%)",
        prom_us - none_us,
        (prom_us / none_us - 1.0) * 100.0
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = observer
}
criterion_main!(benches);
