//! Scraping: one task per endpoint and source, on the refresh interval with
//! jitter, a per-scrape deadline and a page-size cap, so a hanging, slow or
//! huge server costs bounded time and memory and never delays the others.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use epp_core::{Endpoint, EndpointId, EndpointMetrics, EndpointSource, config::SourceWiring};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use rand::Rng;
use tokio::{task::JoinHandle, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::{EndpointStore, Error, Result};

/// Settings of the scrapers.
#[derive(Debug, Clone)]
pub struct DataLayerOptions {
    /// Time between scrapes of one endpoint. Default 50 ms.
    pub refresh_interval: Duration,
    /// Deadline of one scrape, connection to last byte. Default 1 s.
    pub scrape_timeout: Duration,
    /// Largest page read; a larger one fails the scrape. Default 16 MiB.
    pub max_page_bytes: usize,
}

impl Default for DataLayerOptions {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_millis(50),
            scrape_timeout: Duration::from_secs(1),
            max_page_bytes: 16 << 20,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScrapeLabels {
    endpoint: String,
    outcome: &'static str,
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

#[derive(Debug)]
struct Shared {
    client: HttpClient,
    opts: DataLayerOptions,
    scrapes: Family<ScrapeLabels, Counter>,
}

/// The running data layer. Dropping it does not stop the tasks: call
/// [`DataLayer::stop`] or cancel the token given to [`DataLayer::start`].
#[derive(Debug)]
pub struct DataLayer {
    stop: CancellationToken,
    supervisor: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl DataLayer {
    /// Starts scraping every endpoint of `store` (as it changes) for each
    /// source in `sources`.
    ///
    /// # Errors
    /// A source whose scheme this build cannot scrape.
    pub fn start(
        store: Arc<EndpointStore>,
        sources: &[SourceWiring],
        opts: DataLayerOptions,
        stop: CancellationToken,
    ) -> Result<Self> {
        let mut wired = Vec::new();
        for s in sources {
            let Some(src) = s.source.plugin().as_metrics_source() else {
                return Err(Error::Source {
                    source_name: s.source.plugin().name().to_owned(),
                    reason: "not a metrics source".into(),
                });
            };
            if src.scheme() != "http" {
                return Err(Error::Source {
                    source_name: s.source.plugin().name().to_owned(),
                    reason: format!("scheme {:?} is not supported", src.scheme()),
                });
            }
            wired.push(Arc::new(s.clone()));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(opts.scrape_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1)
            .build(connector);
        let shared = Arc::new(Shared {
            client,
            opts,
            scrapes: Family::default(),
        });
        let supervisor = tokio::spawn(supervise(store, wired, Arc::clone(&shared), stop.clone()));
        Ok(Self {
            stop,
            supervisor,
            shared,
        })
    }

    /// Registers the scrape counters (`epp_metrics_scrapes_total{endpoint,outcome}`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "epp_metrics_scrapes",
            "Scrapes of model-server metrics by endpoint and outcome (ok, http_error, timeout, too_large, extract_error)",
            self.shared.scrapes.clone(),
        );
    }

    /// Stops every scraper and waits for them.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.supervisor.await;
    }
}

/// Keeps one scraper per (endpoint, source) while the endpoint exists.
async fn supervise(
    store: Arc<EndpointStore>,
    sources: Vec<Arc<SourceWiring>>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut running: HashMap<EndpointId, (Arc<Endpoint>, Vec<JoinHandle<()>>)> = HashMap::new();
    // Check for membership changes at the refresh rate (cheap: pointer compares).
    let mut tick =
        tokio::time::interval(shared.opts.refresh_interval.min(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let snapshot = store.snapshot();
        running.retain(|id, (endpoint, tasks)| {
            let keep = snapshot.get(*id).is_some_and(|e| Arc::ptr_eq(e, endpoint));
            if !keep {
                tasks.iter().for_each(JoinHandle::abort);
            }
            keep
        });
        for e in snapshot.endpoints() {
            running.entry(e.id()).or_insert_with(|| {
                let tasks = sources
                    .iter()
                    .map(|s| {
                        tokio::spawn(scrape_loop(
                            Arc::clone(e),
                            Arc::clone(s),
                            Arc::clone(&shared),
                            stop.clone(),
                        ))
                    })
                    .collect();
                (Arc::clone(e), tasks)
            });
        }
    }
    for (_, (_, tasks)) in running {
        tasks.iter().for_each(JoinHandle::abort);
    }
}

/// Why one scrape failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Http(String),
    Timeout,
    TooLarge,
    Extract(String),
}

impl Failure {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Http(_) => "http_error",
            Self::Timeout => "timeout",
            Self::TooLarge => "too_large",
            Self::Extract(_) => "extract_error",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http(e) => write!(f, "{e}"),
            Self::Timeout => f.write_str("timed out"),
            Self::TooLarge => f.write_str("page too large"),
            Self::Extract(e) => write!(f, "{e}"),
        }
    }
}

async fn scrape_loop(
    endpoint: Arc<Endpoint>,
    source: Arc<SourceWiring>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let Some(src) = source.source.plugin().as_metrics_source() else {
        return;
    };
    let url = format!("http://{}{}", endpoint.addr_str(), src.path());
    let Ok(uri) = url.parse::<http::Uri>() else {
        tracing::error!(%url, "cannot scrape: invalid URL");
        return;
    };
    let interval = shared.opts.refresh_interval.max(Duration::from_millis(1));
    // Spread servers over the interval so they are not hit in lockstep.
    let jitter = interval.mul_f64(rand::rng().random::<f64>());
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(jitter) => {}
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last: Option<Result<(), Failure>> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let outcome = scrape_once(&shared, &uri, &endpoint, &source).await;
        let label = match &outcome {
            Ok(()) => "ok",
            Err(f) => f.outcome(),
        };
        shared
            .scrapes
            .get_or_create(&ScrapeLabels {
                endpoint: endpoint.addr_str().to_owned(),
                outcome: label,
            })
            .inc();
        // Log state changes only, not every failed scrape.
        let changed = match (&last, &outcome) {
            (Some(Ok(())), Ok(())) => false,
            (Some(Err(a)), Err(b)) => a.outcome() != b.outcome(),
            _ => true,
        };
        if changed {
            match &outcome {
                Ok(()) => tracing::info!(endpoint = endpoint.addr_str(), %url, "metrics scrape ok"),
                Err(f) => {
                    tracing::warn!(endpoint = endpoint.addr_str(), %url, error = %f, "metrics scrape failing; keeping the last values, which age")
                }
            }
        }
        last = Some(outcome);
    }
}

async fn scrape_once(
    shared: &Shared,
    uri: &http::Uri,
    endpoint: &Endpoint,
    source: &SourceWiring,
) -> Result<(), Failure> {
    let page = tokio::time::timeout(shared.opts.scrape_timeout, fetch(shared, uri))
        .await
        .map_err(|_| Failure::Timeout)??;
    let text = match std::str::from_utf8(&page) {
        Ok(t) => std::borrow::Cow::Borrowed(t),
        Err(_) => String::from_utf8_lossy(&page),
    };
    let now = Instant::now();
    let mut metrics: EndpointMetrics = (*endpoint.metrics()).clone();
    for x in &source.extractors {
        if let Some(extractor) = x.plugin().as_extractor() {
            extractor
                .extract(endpoint, &text, &mut metrics)
                .map_err(|e| Failure::Extract(format!("{}: {e}", x.plugin().name())))?;
        }
    }
    metrics.updated_at = Some(now);
    endpoint.set_metrics(metrics);
    Ok(())
}

async fn fetch(shared: &Shared, uri: &http::Uri) -> Result<Vec<u8>, Failure> {
    let req = http::Request::get(uri.clone())
        .header(http::header::ACCEPT, "text/plain;version=0.0.4")
        .body(Empty::<Bytes>::new())
        .map_err(|e| Failure::Http(e.to_string()))?;
    let resp = shared
        .client
        .request(req)
        .await
        .map_err(|e| Failure::Http(format!("request failed: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(Failure::Http(format!("HTTP {status}")));
    }
    let max = shared.opts.max_page_bytes;
    if let Some(len) = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        && len > max
    {
        return Err(Failure::TooLarge);
    }
    let mut body = resp.into_body();
    let mut page = Vec::with_capacity(64 * 1024);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Failure::Http(format!("reading body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if page.len() + data.len() > max {
                return Err(Failure::TooLarge);
            }
            page.extend_from_slice(&data);
        }
    }
    Ok(page)
}
