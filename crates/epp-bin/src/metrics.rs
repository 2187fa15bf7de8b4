//! The picker's own Prometheus metrics: plugin durations, and the pool
//! gauges computed from the endpoint set at scrape time (served by
//! `metrics_server.rs`).

use std::time::Duration;

use epp_core::{CallSite, EndpointSource, SchedulerObserver};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    name: String,
    model_server_pod: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    extension_point: &'static str,
    plugin_type: String,
    plugin_name: String,
}

/// `inference_extension_plugin_duration_seconds`: one histogram per
/// (extension point, plugin), resolved once per call site so observing a
/// call is an index and a histogram update.
#[derive(Debug)]
pub(crate) struct PluginDurations {
    sites: Vec<Histogram>,
}

impl PluginDurations {
    pub(crate) fn register(registry: &mut Registry, sites: &[CallSite]) -> Self {
        // 1 µs … ~0.5 s.
        let family =
            Family::<PluginLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_001, 2.0, 20))
            });
        registry.register(
            "inference_extension_plugin_duration_seconds",
            "Time spent in each plugin call, per extension point and plugin",
            family.clone(),
        );
        let sites = sites
            .iter()
            .map(|s| {
                let labels = PluginLabels {
                    extension_point: s.point.as_str(),
                    plugin_type: s.plugin.plugin().type_name().to_owned(),
                    plugin_name: s.plugin.plugin().name().to_owned(),
                };
                family.get_or_create(&labels).clone()
            })
            .collect();
        Self { sites }
    }
}

impl SchedulerObserver for PluginDurations {
    fn plugin_call(&self, site: usize, took: Duration) {
        if let Some(h) = self.sites.get(site) {
            h.observe(took.as_secs_f64());
        }
    }
}

/// Pool-level gauges (REFERENCE §7), refreshed from the endpoint set whenever
/// metrics are scraped so they are never older than the scrape.
#[derive(Debug)]
pub(crate) struct PoolGauges {
    pool: String,
    staleness: Duration,
    avg_kv: Family<PoolLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    avg_queue: Family<PoolLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    ready: Family<PoolLabels, Gauge>,
    per_pod_queue: Family<PodLabels, Gauge>,
}

impl PoolGauges {
    pub(crate) fn register(registry: &mut Registry, pool: &str, staleness: Duration) -> Self {
        let g = Self {
            pool: pool.to_owned(),
            staleness,
            avg_kv: Family::default(),
            avg_queue: Family::default(),
            ready: Family::default(),
            per_pod_queue: Family::default(),
        };
        registry.register(
            "inference_pool_average_kv_cache_utilization",
            "Average KV-cache utilisation of the pool's fresh endpoints",
            g.avg_kv.clone(),
        );
        registry.register(
            "inference_pool_average_queue_size",
            "Average waiting-queue length of the pool's fresh endpoints",
            g.avg_queue.clone(),
        );
        registry.register(
            "inference_pool_ready_pods",
            "Endpoints with fresh metrics",
            g.ready.clone(),
        );
        registry.register(
            "inference_pool_per_pod_queue_size",
            "Waiting-queue length per endpoint",
            g.per_pod_queue.clone(),
        );
        g
    }

    pub(crate) fn refresh(&self, source: &dyn EndpointSource) {
        let snapshot = source.snapshot();
        let now = std::time::Instant::now();
        let labels = PoolLabels {
            name: self.pool.clone(),
        };
        self.per_pod_queue.clear();
        let (mut n, mut kv, mut queue) = (0u32, 0.0, 0.0);
        for e in snapshot.endpoints() {
            let m = e.metrics();
            self.per_pod_queue
                .get_or_create(&PodLabels {
                    name: self.pool.clone(),
                    model_server_pod: e.name().to_owned(),
                })
                .set(i64::from(m.waiting));
            if !m.is_stale(now, self.staleness) {
                n += 1;
                kv += m.kv_usage;
                queue += f64::from(m.waiting);
            }
        }
        let avg = |sum: f64| if n == 0 { 0.0 } else { sum / f64::from(n) };
        self.avg_kv.get_or_create(&labels).set(avg(kv));
        self.avg_queue.get_or_create(&labels).set(avg(queue));
        self.ready.get_or_create(&labels).set(i64::from(n));
    }
}
