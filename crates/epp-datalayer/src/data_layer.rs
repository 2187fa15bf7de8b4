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
    scrape::{DataLayerOptions, Shared, supervise},
    status::{ScrapeStatus, StatusTable},
};

/// The running data layer. Dropping it does not stop the tasks: call
/// [`DataLayer::stop`] or cancel the token given to [`DataLayer::start`].
#[derive(Debug)]
pub struct DataLayer {
    stop: CancellationToken,
    supervisor: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl DataLayer {
    /// Starts scraping every endpoint of `store` (following its changes) for
    /// each source in `sources`, until [`Self::stop`] or `stop` is cancelled.
    /// Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// A source that is not a metrics source, has an unsupported scheme or
    /// path, or asks for verified HTTPS when no CA roots can be found.
    pub fn start(
        store: Arc<EndpointStore>,
        sources: &[SourceWiring],
        opts: DataLayerOptions,
        stop: CancellationToken,
    ) -> Result<Self> {
        let tls = Tls::new();
        let probe = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let mut wired = Vec::new();
        for s in sources {
            let name = s.source.plugin().name().to_owned();
            let bad = |reason: String| Error::Source {
                source_name: name.clone(),
                reason,
            };
            let Some(src) = s.source.plugin().as_metrics_source() else {
                return Err(bad("not a metrics source".into()));
            };
            let https = match src.scheme() {
                "http" => false,
                "https" => true,
                other => return Err(bad(format!("scheme {other:?} is not http or https"))),
            };
            Target::new(probe, https, src.insecure_skip_verify(), src.path(), &tls).map_err(bad)?;
            wired.push(Arc::new(s.clone()));
        }
        let shared = Arc::new(Shared {
            opts,
            tls,
            scrapes: Family::default(),
            status: StatusTable::default(),
        });
        if !wired.is_empty() {
            // Listed in `status()` from the start, not once the tasks first run.
            for e in store.snapshot().endpoints() {
                shared.status.cell(e.id(), e.addr());
            }
        }
        let supervisor = tokio::spawn(supervise(store, wired, Arc::clone(&shared), stop.clone()));
        Ok(Self {
            stop,
            supervisor,
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
