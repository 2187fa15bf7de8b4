//! The picker's own Prometheus metrics: plugin durations, the pool gauges
//! computed from the endpoint set at scrape time, and what plugins report
//! themselves (served by `metrics_server.rs`).

use std::time::Duration;

use epp_core::{CallSite, EndpointSource, MetricFamily, MetricSink, PluginRef, SchedulerObserver};
use epp_extproc::MetricGenerations;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet},
    metrics::MetricType,
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
    pub(crate) fn register(
        registry: &mut Registry,
        sites: &[CallSite],
        generations: MetricGenerations,
    ) -> Self {
        // 1 µs … ~0.5 s.
        let family =
            Family::<PluginLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_001, 2.0, 20))
            });
        let help = "Time spent in each plugin call, per extension point and plugin";
        if generations.reference() {
            registry.register(
                "inference_extension_plugin_duration_seconds",
                help,
                family.clone(),
            );
        }
        if generations.llm_d {
            registry.register("llm_d_epp_plugin_duration_seconds", help, family.clone());
        }
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

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// `name`, `model_server_endpoint` (llm-d's per-endpoint label).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    name: String,
    model_server_endpoint: String,
}

/// Pool-level gauges (REFERENCE §7, and llm-d's `llm_d_epp_*` names for
/// the same values), refreshed from the endpoint set whenever metrics are
/// scraped so they are never older than the scrape.
#[derive(Debug)]
pub(crate) struct PoolGauges {
    pool: String,
    staleness: Duration,
    avg_kv: Family<PoolLabels, FloatGauge>,
    avg_queue: Family<PoolLabels, FloatGauge>,
    avg_running: Family<PoolLabels, FloatGauge>,
    std_kv: Family<PoolLabels, FloatGauge>,
    std_queue: Family<PoolLabels, FloatGauge>,
    std_running: Family<PoolLabels, FloatGauge>,
    ready: Family<PoolLabels, Gauge>,
    per_pod_queue: Family<PodLabels, Gauge>,
    per_endpoint_queue: Family<EndpointLabels, Gauge>,
}

impl PoolGauges {
    pub(crate) fn register(
        registry: &mut Registry,
        pool: &str,
        staleness: Duration,
        generations: MetricGenerations,
    ) -> Self {
        let g = Self {
            pool: pool.to_owned(),
            staleness,
            avg_kv: Family::default(),
            avg_queue: Family::default(),
            avg_running: Family::default(),
            std_kv: Family::default(),
            std_queue: Family::default(),
            std_running: Family::default(),
            ready: Family::default(),
            per_pod_queue: Family::default(),
            per_endpoint_queue: Family::default(),
        };
        // (reference name, llm-d name, help, family)
        let pool_families = [
            (
                Some("inference_pool_average_kv_cache_utilization"),
                "llm_d_epp_average_kv_cache_utilization",
                "Average KV-cache utilisation of the pool's fresh endpoints",
                &g.avg_kv,
            ),
            (
                Some("inference_pool_average_queue_size"),
                "llm_d_epp_average_queue_size",
                "Average waiting-queue length of the pool's fresh endpoints",
                &g.avg_queue,
            ),
            (
                Some("inference_pool_average_running_requests"),
                "llm_d_epp_average_running_requests",
                "Average running requests of the pool's fresh endpoints",
                &g.avg_running,
            ),
            (
                None,
                "llm_d_epp_std_dev_kv_cache_utilization",
                "Standard deviation of the KV-cache utilisation of the pool's fresh endpoints",
                &g.std_kv,
            ),
            (
                None,
                "llm_d_epp_std_dev_queue_size",
                "Standard deviation of the waiting-queue length of the pool's fresh endpoints",
                &g.std_queue,
            ),
            (
                None,
                "llm_d_epp_std_dev_running_requests",
                "Standard deviation of the running requests of the pool's fresh endpoints",
                &g.std_running,
            ),
        ];
        for (reference, llm_d, help, family) in pool_families {
            if let Some(name) = reference.filter(|_| generations.reference()) {
                registry.register(name, help, family.clone());
            }
            if generations.llm_d {
                registry.register(llm_d, help, family.clone());
            }
        }
        if generations.reference() {
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
        }
        if generations.llm_d {
            registry.register(
                "llm_d_epp_ready_endpoints",
                "Endpoints with fresh metrics",
                g.ready.clone(),
            );
            registry.register(
                "llm_d_epp_per_endpoint_queue_size",
                "Waiting-queue length per endpoint",
                g.per_endpoint_queue.clone(),
            );
        }
        g
    }

    pub(crate) fn refresh(&self, source: &dyn EndpointSource) {
        let snapshot = source.snapshot();
        let now = std::time::Instant::now();
        let labels = PoolLabels {
            name: self.pool.clone(),
        };
        self.per_pod_queue.clear();
        self.per_endpoint_queue.clear();
        let mut kv = Moments::default();
        let mut queue = Moments::default();
        let mut running = Moments::default();
        for e in snapshot.endpoints() {
            let m = e.metrics();
            self.per_pod_queue
                .get_or_create(&PodLabels {
                    name: self.pool.clone(),
                    model_server_pod: e.name().to_owned(),
                })
                .set(i64::from(m.waiting));
            self.per_endpoint_queue
                .get_or_create(&EndpointLabels {
                    name: self.pool.clone(),
                    model_server_endpoint: e.name().to_owned(),
                })
                .set(i64::from(m.waiting));
            if !m.is_stale(now, self.staleness) {
                kv.add(m.kv_usage);
                queue.add(f64::from(m.waiting));
                running.add(f64::from(m.running));
            }
        }
        self.avg_kv.get_or_create(&labels).set(kv.mean());
        self.avg_queue.get_or_create(&labels).set(queue.mean());
        self.avg_running.get_or_create(&labels).set(running.mean());
        self.std_kv.get_or_create(&labels).set(kv.std_dev());
        self.std_queue.get_or_create(&labels).set(queue.std_dev());
        self.std_running
            .get_or_create(&labels)
            .set(running.std_dev());
        self.ready
            .get_or_create(&labels)
            .set(i64::try_from(kv.n).unwrap_or(i64::MAX));
    }
}

/// Count, sum and sum of squares of one signal over the fresh endpoints.
#[derive(Debug, Default)]
struct Moments {
    n: u64,
    sum: f64,
    squares: f64,
}

impl Moments {
    fn add(&mut self, v: f64) {
        self.n += 1;
        self.sum += v;
        self.squares += v * v;
    }
    fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / self.n as f64
        }
    }
    /// Population standard deviation (0 without endpoints).
    fn std_dev(&self) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let mean = self.mean();
        (self.squares / self.n as f64 - mean * mean).max(0.0).sqrt()
    }
}

/// `commit`, `build_ref`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    commit: String,
    build_ref: String,
}

/// `inference_extension_info{commit,build_ref}` and `llm_d_epp_info`: 1,
/// labelled with the commit epp was built from and its version.
pub(crate) fn register_info(registry: &mut Registry, generations: MetricGenerations) {
    let family = Family::<InfoLabels, Gauge>::default();
    family
        .get_or_create(&InfoLabels {
            commit: env!("EPP_BUILD_COMMIT").to_owned(),
            build_ref: env!("EPP_BUILD_REF").to_owned(),
        })
        .set(1);
    let help = "Build information: the commit and the version epp was built from";
    if generations.reference() {
        registry.register("inference_extension_info", help, family.clone());
    }
    if generations.llm_d {
        registry.register("llm_d_epp_info", help, family);
    }
}

/// What one plugin series is.
#[derive(Debug)]
enum Value {
    Gauge(f64),
    Counter(u64),
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
        count: u64,
    },
}

/// One family's series as reported, in report order.
type Series = Vec<(Vec<(String, String)>, Value)>;

/// Gathers what plugins report into families (a family's series must be
/// written together).
#[derive(Debug, Default)]
struct Gathered {
    families: Vec<(MetricFamily, Series)>,
}

impl Gathered {
    fn push(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: Value) {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        match self
            .families
            .iter_mut()
            .find(|(f, _)| f.name == family.name)
        {
            Some((_, series)) => series.push((labels, value)),
            None => self.families.push((family, vec![(labels, value)])),
        }
    }
}

impl MetricSink for Gathered {
    fn gauge(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: f64) {
        self.push(family, labels, Value::Gauge(value));
    }
    fn counter(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: u64) {
        self.push(family, labels, Value::Counter(value));
    }
    fn histogram(
        &mut self,
        family: MetricFamily,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    ) {
        let value = Value::Histogram {
            buckets: buckets.to_vec(),
            sum,
            count,
        };
        self.push(family, labels, value);
    }
}

/// The metrics plugins keep themselves ([`epp_core::PluginMetrics`]), read at every
/// scrape.
#[derive(Debug)]
pub(crate) struct PluginReports {
    plugins: Vec<PluginRef>,
}

impl PluginReports {
    /// Registers the plugins among `plugins` that report metrics.
    pub(crate) fn register(registry: &mut Registry, plugins: &[(String, PluginRef)]) {
        let plugins: Vec<PluginRef> = plugins
            .iter()
            .filter(|(_, p)| p.plugin().as_plugin_metrics().is_some())
            .map(|(_, p)| p.clone())
            .collect();
        if !plugins.is_empty() {
            registry.register_collector(Box::new(Self { plugins }));
        }
    }
}

impl Collector for PluginReports {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut gathered = Gathered::default();
        for p in &self.plugins {
            if let Some(m) = p.plugin().as_plugin_metrics() {
                m.report(&mut gathered);
            }
        }
        for (family, series) in &gathered.families {
            let Some((_, first)) = series.first() else {
                continue;
            };
            let kind = std::mem::discriminant(first);
            let metric_type = match first {
                Value::Counter(_) => MetricType::Counter,
                Value::Histogram { .. } => MetricType::Histogram,
                Value::Gauge(_) => MetricType::Gauge,
            };
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, metric_type)?;
            // A plugin reporting one family as two kinds: the stray series
            // are dropped rather than break the page.
            for (labels, value) in series
                .iter()
                .filter(|(_, v)| std::mem::discriminant(v) == kind)
            {
                let mut m = metric.encode_family(labels)?;
                match value {
                    Value::Gauge(v) => m.encode_gauge(v)?,
                    Value::Counter(v) => m.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                    Value::Histogram {
                        buckets,
                        sum,
                        count,
                    } => m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use epp_core::PluginMetrics;

    use super::*;

    #[derive(Debug)]
    struct Reporting;
    impl epp_core::Plugin for Reporting {
        fn type_name(&self) -> &str {
            "r"
        }
        fn name(&self) -> &str {
            "r"
        }
        fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
            Some(self)
        }
    }
    const F: MetricFamily = MetricFamily {
        name: "demo_error",
        help: "Demo",
    };
    const C: MetricFamily = MetricFamily {
        name: "demo_samples",
        help: "Samples",
    };
    impl PluginMetrics for Reporting {
        fn report(&self, out: &mut dyn MetricSink) {
            for who in ["a", "b"] {
                out.histogram(F, &[("endpoint", who)], &[(0.5, 2), (f64::MAX, 1)], 1.5, 3);
                out.counter(C, &[("endpoint", who)], 7);
            }
        }
    }

    #[test]
    fn plugin_reports_are_grouped_by_family_in_the_text_format() {
        let mut registry = Registry::default();
        let plugins = vec![(
            "r".to_owned(),
            PluginRef::new(std::sync::Arc::new(Reporting)),
        )];
        PluginReports::register(&mut registry, &plugins);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert_eq!(
            text.matches("# TYPE demo_error histogram").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("demo_error_bucket{le=\"0.5\",endpoint=\"a\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("demo_error_bucket{le=\"+Inf\",endpoint=\"b\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("demo_samples_total{endpoint=\"b\"} 7"),
            "{text}"
        );
    }
}
