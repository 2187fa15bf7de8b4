//! The data layer: keeps every endpoint's metrics fresh by scraping its
//! sources (see `scrape.rs`), following the endpoint store as discovery
//! changes it, and reports how scraping goes (metrics and status).

use std::sync::Arc;

use epp_core::{EndpointSource, config::SourceWiring};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, family::Family, gauge::ConstGauge},
    registry::Registry,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    EndpointStore, Error, Result,
    client::{Target, Tls},
    kv_events::{FeedMetrics, SinkGroup, start_feeds},
    scrape::{DataLayerOptions, Shared, WiredSource, supervise},
    status::{ScrapeStatus, StatusTable},
};

/// The running data layer. Dropping it does not stop the tasks: call
/// [`DataLayer::stop`] or cancel the token given to [`DataLayer::start`].
#[derive(Debug)]
pub struct DataLayer {
    stop: CancellationToken,
    supervisor: JoinHandle<()>,
    /// The KV-event subscribers' supervisors.
    feeds: Vec<JoinHandle<()>>,
    feed_metrics: Arc<FeedMetrics>,
    shared: Arc<Shared>,
}

impl DataLayer {
    /// Starts scraping every endpoint of `store` (following its changes) for
    /// each metrics source in `sources`, and subscribing to its KV-cache
    /// events for each notification source, until [`Self::stop`] or `stop`
    /// is cancelled. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// A source that is neither, a metrics source with an unsupported scheme
    /// or path, or that asks for verified HTTPS when no CA roots can be
    /// found; a notification source's extractor that consumes no KV events
    /// or wants an engine other than vLLM.
    pub fn start(
        store: Arc<EndpointStore>,
        sources: &[SourceWiring],
        opts: DataLayerOptions,
        stop: CancellationToken,
    ) -> Result<Self> {
        let tls = Tls::new();
        let probe = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let mut wired = Vec::new();
        let mut sinks = Vec::new();
        for s in sources {
            let name = s.source.plugin().name().to_owned();
            let bad = |reason: String| Error::Source {
                source_name: name.clone(),
                reason,
            };
            if s.source.plugin().as_notification_source().is_some() {
                for e in &s.extractors {
                    let Some(sink) = e.plugin().as_kv_event_sink() else {
                        return Err(bad(format!(
                            "{:?} does not consume KV-cache events",
                            e.plugin().name()
                        )));
                    };
                    if sink.kv_events_config().engine_type != "vllm" {
                        return Err(bad(format!(
                            "{:?}: engineType {:?} is not supported (only vllm)",
                            e.plugin().name(),
                            sink.kv_events_config().engine_type
                        )));
                    }
                    sinks.push(e.clone());
                }
                continue;
            }
            let Some(src) = s.source.plugin().as_metrics_source() else {
                return Err(bad("not a metrics source".into()));
            };
            let https = match src.scheme() {
                "http" => false,
                "https" => true,
                other => return Err(bad(format!("scheme {other:?} is not http or https"))),
            };
            let files = src.tls_files();
            let own = (files != epp_core::TlsFiles::default())
                .then(|| Tls::with_files(files))
                .transpose()
                .map_err(bad)?;
            Target::new(
                probe,
                https,
                src.insecure_skip_verify(),
                src.path(),
                own.as_ref().unwrap_or(&tls),
            )
            .map_err(bad)?;
            wired.push(WiredSource {
                wiring: s.clone(),
                tls: own,
                every: WiredSource::every(src.interval(), opts.refresh_interval),
                port: src.port(),
                counts: src.counts_for_freshness(),
            });
        }
        // With no source that counts for freshness, every source does (else
        // the endpoints would never be fresh).
        if !wired.iter().any(|w| w.counts) {
            for w in &mut wired {
                w.counts = true;
            }
        }
        let wired: Vec<Arc<WiredSource>> = wired.into_iter().map(Arc::new).collect();
        let shared = Arc::new(Shared {
            opts,
            tls,
            scrapes: Family::default(),
            status: StatusTable::default(),
            poll_errors: Family::default(),
            extract_errors: Family::default(),
            warned: parking_lot::Mutex::default(),
        });
        if !wired.is_empty() {
            // Listed in `status()` from the start, not once the tasks first run.
            for e in store.snapshot().endpoints() {
                shared.status.cell(e.id(), e.addr());
            }
        }
        let feed_metrics = Arc::new(FeedMetrics::default());
        let feeds = start_feeds(
            Arc::clone(&store),
            SinkGroup::group(sinks),
            Arc::clone(&feed_metrics),
            stop.clone(),
        );
        let supervisor = tokio::spawn(supervise(store, wired, Arc::clone(&shared), stop.clone()));
        Ok(Self {
            stop,
            supervisor,
            feeds,
            feed_metrics,
            shared,
        })
    }

    /// Registers the scrape counters
    /// (`epp_metrics_scrapes_total{endpoint,outcome}`) and whether each
    /// endpoint's latest scrape succeeded (`epp_metrics_scrape_up{endpoint}`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "epp_metrics_scrapes",
            "Scrapes of model-server metrics by endpoint and outcome (ok, connect_error, http_error, timeout, too_large, extract_error)",
            self.shared.scrapes.clone(),
        );
        registry.register_collector(Box::new(UpCollector(Arc::clone(&self.shared))));
        self.feed_metrics.register(registry);
    }

    /// Registers llm-d's data-layer error counters: failed scrapes per
    /// source type (`llm_d_epp_datalayer_poll_errors_total{source_type}`)
    /// and failed extractions per source and extractor type
    /// (`llm_d_epp_datalayer_extract_errors_total{source_type,extractor_type}`).
    pub fn register_llm_d_metrics(&self, registry: &mut Registry) {
        registry.register(
            "llm_d_epp_datalayer_poll_errors",
            "Failed scrapes of model-server metrics, per data source type",
            self.shared.poll_errors.clone(),
        );
        registry.register(
            "llm_d_epp_datalayer_extract_errors",
            "Failed extractions from scraped pages, per data source and extractor type",
            self.shared.extract_errors.clone(),
        );
    }

    /// Scrape counters and the current error of every endpoint.
    #[must_use]
    pub fn status(&self) -> Vec<ScrapeStatus> {
        self.shared.status.snapshot()
    }

    /// Stops every scraper and waits until they have ended.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.supervisor.await;
        for f in self.feeds {
            let _ = f.await;
        }
    }
}

/// `epp_metrics_scrape_up{endpoint}`, read from [`DataLayer::status`] at
/// each scrape of the picker's metrics.
#[derive(Debug)]
struct UpCollector(Arc<Shared>);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

impl Collector for UpCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut metric = encoder.encode_descriptor(
            "epp_metrics_scrape_up",
            "1 if the latest scrape of the endpoint's metrics succeeded, 0 if it failed or none has finished yet",
            None,
            MetricType::Gauge,
        )?;
        for s in self.0.status.snapshot() {
            let labels = EndpointLabel {
                endpoint: s.addr.to_string(),
            };
            let up = s.ok > 0 && s.last_error.is_none();
            ConstGauge::new(i64::from(up)).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
