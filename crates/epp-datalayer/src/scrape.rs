//! Scraping (run by [`crate::DataLayer`]): one task per endpoint, on the refresh interval with a random
//! phase, a per-scrape deadline and a page-size cap, so a hanging, slow or
//! huge server costs bounded time and memory and never delays the others.
//!
//! Each task owns its connections (one per source) and is the only writer of
//! its endpoint's metrics: a scrape clones the current values, lets each
//! source's extractors update the copy, and swaps it in. `updated_at` moves
//! only when every source of the endpoint succeeded, so staleness is never
//! understated; a failed source keeps its previous values.

use std::{
    borrow::Cow,
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use epp_core::{
    Endpoint, EndpointId, EndpointMetrics, EndpointSource, InflightSample, config::SourceWiring,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use rand::Rng;
use tokio::{task::JoinHandle, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::{
    EndpointStore, Result,
    client::{self, Conn, FetchError, Target, Tls},
    status::{StatusCell, StatusTable},
};

/// Settings of the scrapers.
#[derive(Debug, Clone)]
pub struct DataLayerOptions {
    /// Time between scrapes of one endpoint. Default 50 ms.
    pub refresh_interval: Duration,
    /// Deadline of one scrape, connection to last byte. Default 1 s.
    pub scrape_timeout: Duration,
    /// Largest page read; a larger one fails the scrape. Default 16 MiB.
    pub max_page_bytes: usize,
    /// Told after each scrape that stored new metrics (flow control
    /// re-checks the pool then). Default none.
    pub listener: Option<Arc<dyn epp_core::flow::MetricsListener>>,
}

impl Default for DataLayerOptions {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_millis(50),
            scrape_timeout: Duration::from_secs(1),
            max_page_bytes: 16 << 20,
            listener: None,
        }
    }
}

/// Outcomes counted in `epp_metrics_scrapes_total`.
const OUTCOMES: [&str; 6] = [
    "ok",
    "connect_error",
    "http_error",
    "timeout",
    "too_large",
    "extract_error",
];

/// `endpoint`, `outcome` of `epp_metrics_scrapes_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ScrapeLabels {
    endpoint: String,
    outcome: &'static str,
}

/// What every scraper of one data layer shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) opts: DataLayerOptions,
    pub(crate) tls: Tls,
    pub(crate) scrapes: Family<ScrapeLabels, Counter>,
    pub(crate) status: StatusTable,
    /// llm-d's `datalayer_poll_errors_total{source_type}`.
    pub(crate) poll_errors: Family<SourceLabels, Counter>,
    /// llm-d's `datalayer_extract_errors_total{source_type,extractor_type}`.
    pub(crate) extract_errors: Family<ExtractLabels, Counter>,
    /// Auxiliary sources ([`WiredSource::counts`] false) whose failure was
    /// logged: they warn once, not once per endpoint.
    pub(crate) warned: parking_lot::Mutex<std::collections::HashSet<String>>,
}

/// `source_type`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    source_type: String,
}

/// `source_type`, `extractor_type`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ExtractLabels {
    source_type: String,
    extractor_type: String,
}

/// A metrics source as the scrapers use it.
#[derive(Debug)]
pub(crate) struct WiredSource {
    pub(crate) wiring: SourceWiring,
    /// Its own TLS connectors (PEM files given), else the shared ones.
    pub(crate) tls: Option<Tls>,
    /// Scraped on every `every`-th refresh (at least 1).
    pub(crate) every: u64,
    /// The port scraped instead of the endpoint's.
    pub(crate) port: Option<u16>,
    /// Whether the endpoint's metrics are fresh only when it succeeded.
    pub(crate) counts: bool,
}

impl WiredSource {
    /// Scrapes of `source` happen every `interval` rounded to the nearest
    /// multiple of `refresh` (at least one refresh), as llm-d rounds it.
    pub(crate) fn every(interval: Option<Duration>, refresh: Duration) -> u64 {
        let Some(i) = interval else { return 1 };
        let refresh = refresh.as_secs_f64().max(1e-3);
        (i.as_secs_f64() / refresh).round().max(1.0) as u64
    }
}

/// Keeps one scraper per endpoint while the endpoint exists.
pub(crate) async fn supervise(
    store: Arc<EndpointStore>,
    sources: Vec<Arc<WiredSource>>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut changes = store.subscribe();
    let mut running: HashMap<EndpointId, (Arc<Endpoint>, JoinHandle<()>)> = HashMap::new();
    loop {
        changes.borrow_and_update();
        let snapshot = store.snapshot();
        running.retain(|id, (endpoint, task)| {
            let current = snapshot.get(*id);
            let keep = current.is_some_and(|e| Arc::ptr_eq(e, endpoint));
            if !keep {
                task.abort();
                if current.is_none() {
                    // Gone (not relabelled): forget its counters.
                    shared.status.remove(*id);
                    for outcome in OUTCOMES {
                        shared.scrapes.remove(&ScrapeLabels {
                            endpoint: endpoint.addr_str().to_owned(),
                            outcome,
                        });
                    }
                }
            }
            keep
        });
        if !sources.is_empty() {
            for e in snapshot.endpoints() {
                running.entry(e.id()).or_insert_with(|| {
                    let status = shared.status.cell(e.id(), e.addr());
                    let task = tokio::spawn(scrape_loop(
                        Arc::clone(e),
                        status,
                        sources.clone(),
                        Arc::clone(&shared),
                        stop.clone(),
                    ));
                    (Arc::clone(e), task)
                });
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            changed = changes.changed() => if changed.is_err() { break },
        }
    }
    for (_, (_, task)) in running {
        task.abort();
        let _ = task.await;
    }
}

/// Why one scrape of one source failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Fetch(FetchError),
    Timeout,
    /// The message, and the type of the extractor that failed.
    Extract(String, String),
}

impl Failure {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Fetch(FetchError::Connect(_)) => "connect_error",
            Self::Fetch(FetchError::Http(_)) => "http_error",
            Self::Fetch(FetchError::TooLarge) => "too_large",
            Self::Timeout => "timeout",
            Self::Extract(..) => "extract_error",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fetch(e) => write!(f, "{e}"),
            Self::Timeout => f.write_str("timed out"),
            Self::Extract(e, _) => f.write_str(e),
        }
    }
}

/// One source of one endpoint: its connection, buffer and last outcome.
struct SourceRun {
    wiring: Arc<WiredSource>,
    target: Result<Target, String>,
    url: String,
    conn: Option<Conn>,
    page: Vec<u8>,
    /// The last outcome kind, to log changes only (`Some("ok")` after a success).
    last: Option<&'static str>,
}

impl SourceRun {
    fn new(endpoint: &Endpoint, wiring: Arc<WiredSource>, tls: &Tls) -> Self {
        let (scheme, path, skip) = wiring
            .wiring
            .source
            .plugin()
            .as_metrics_source()
            .map_or(("http", "/metrics", false), |s| {
                (s.scheme(), s.path(), s.insecure_skip_verify())
            });
        let mut addr = endpoint.addr();
        if let Some(port) = wiring.port {
            addr.set_port(port);
        }
        let url = format!("{scheme}://{addr}{path}");
        let tls = wiring.tls.as_ref().unwrap_or(tls);
        let target = Target::new(addr, scheme == "https", skip, path, tls);
        Self {
            wiring,
            target,
            url,
            conn: None,
            page: Vec::new(),
            last: None,
        }
    }

    /// Fetches the page; returns when it arrived.
    async fn fetch(&mut self, opts: &DataLayerOptions) -> Result<Instant, Failure> {
        let target = match &self.target {
            Ok(t) => t,
            Err(e) => return Err(Failure::Fetch(FetchError::Connect(e.clone()))),
        };
        let fetched = tokio::time::timeout(
            opts.scrape_timeout,
            client::fetch(target, &mut self.conn, opts.max_page_bytes, &mut self.page),
        )
        .await;
        match fetched {
            Ok(Ok(())) => Ok(Instant::now()),
            Ok(Err(e)) => Err(Failure::Fetch(e)),
            Err(_) => {
                // Abandon the connection mid-response; the next scrape reconnects.
                self.conn = None;
                Err(Failure::Timeout)
            }
        }
    }

    /// Runs the source's extractors over the fetched page into `metrics`.
    fn extract(&self, endpoint: &Endpoint, metrics: &mut EndpointMetrics) -> Result<(), Failure> {
        let text = match std::str::from_utf8(&self.page) {
            Ok(t) => Cow::Borrowed(t),
            Err(_) => String::from_utf8_lossy(&self.page),
        };
        for x in &self.wiring.wiring.extractors {
            if let Some(extractor) = x.plugin().as_extractor() {
                extractor.extract(endpoint, &text, metrics).map_err(|e| {
                    Failure::Extract(
                        format!("{}: {e}", x.plugin().name()),
                        x.plugin().type_name().to_owned(),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Logs a change of outcome (not every failed scrape); an auxiliary
    /// source's failure once for all endpoints.
    fn log_change(
        &mut self,
        endpoint: &Endpoint,
        outcome: &Result<Instant, Failure>,
        shared: &Shared,
    ) {
        let kind = match outcome {
            Ok(_) => "ok",
            Err(f) => f.outcome(),
        };
        if self.last == Some(kind) {
            return;
        }
        let source = self.wiring.wiring.source.plugin().name();
        match outcome {
            Ok(_) => {
                tracing::info!(endpoint = endpoint.addr_str(), source, url = %self.url, "metrics scrape ok");
            }
            Err(f) if !self.wiring.counts => {
                if shared.warned.lock().insert(source.to_owned()) {
                    tracing::warn!(endpoint = endpoint.addr_str(), source, url = %self.url, error = %f,
                        "auxiliary metrics source unavailable (e.g. no GPU exporter at this port); \
                         endpoints stay fresh without it and plugins reading its metrics see none; \
                         logged once for this source");
                } else {
                    tracing::debug!(endpoint = endpoint.addr_str(), source, url = %self.url, error = %f,
                        "auxiliary metrics source unavailable");
                }
            }
            Err(f) => {
                tracing::warn!(endpoint = endpoint.addr_str(), source, url = %self.url, error = %f,
                    "metrics scrape failing; keeping the last values, which age");
            }
        }
        self.last = Some(kind);
    }
}

async fn scrape_loop(
    endpoint: Arc<Endpoint>,
    status: Arc<StatusCell>,
    sources: Vec<Arc<WiredSource>>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut runs: Vec<SourceRun> = sources
        .into_iter()
        .map(|w| SourceRun::new(&endpoint, w, &shared.tls))
        .collect();
    // Look the counters up once, not per scrape.
    let counters = OUTCOMES.map(|outcome| {
        shared
            .scrapes
            .get_or_create(&ScrapeLabels {
                endpoint: endpoint.addr_str().to_owned(),
                outcome,
            })
            .clone()
    });
    let interval = shared.opts.refresh_interval.max(Duration::from_millis(1));
    // A random phase so servers are not all hit in the same instant.
    let phase = interval.mul_f64(rand::rng().random::<f64>());
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(phase) => {}
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut outcomes: Vec<Option<Result<Instant, Failure>>> = Vec::with_capacity(runs.len());
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        outcomes.clear();
        // What this picker has in flight as the request leaves: the scraped
        // values will include these, and scorers add what is dispatched later.
        let inflight = endpoint.inflight().sample();
        if let [run] = runs.as_mut_slice() {
            let due = n.is_multiple_of(run.wiring.every);
            outcomes.push(if due {
                Some(run.fetch(&shared.opts).await)
            } else {
                None
            });
        } else {
            let opts = &shared.opts;
            outcomes.extend(
                futures::future::join_all(runs.iter_mut().map(|r| async move {
                    if n.is_multiple_of(r.wiring.every) {
                        Some(r.fetch(opts).await)
                    } else {
                        None
                    }
                }))
                .await,
            );
        }
        n = n.wrapping_add(1);
        apply(
            &endpoint,
            inflight,
            &mut runs,
            &mut outcomes,
            &counters,
            &status,
            &shared,
        );
        count_errors(&shared, &runs, &outcomes);
        if let Some(l) = &shared.opts.listener {
            l.metrics_updated();
        }
    }
}

/// Counts failed scrapes by source type, and failed extractions by source
/// and extractor type (rare: a lookup per failure is fine).
fn count_errors(
    shared: &Shared,
    runs: &[SourceRun],
    outcomes: &[Option<Result<Instant, Failure>>],
) {
    for (run, outcome) in runs.iter().zip(outcomes) {
        let Some(Err(f)) = outcome else { continue };
        let source_type = run.wiring.wiring.source.plugin().type_name().to_owned();
        match f {
            Failure::Extract(_, extractor_type) => {
                shared
                    .extract_errors
                    .get_or_create(&ExtractLabels {
                        source_type,
                        extractor_type: extractor_type.clone(),
                    })
                    .inc();
            }
            _ => {
                shared
                    .poll_errors
                    .get_or_create(&SourceLabels { source_type })
                    .inc();
            }
        }
    }
}

/// Extracts what was fetched (sources not due this time have no outcome),
/// publishes it, and counts and logs outcomes. The metrics' age moves only
/// when every due source that counts for freshness succeeded.
fn apply(
    endpoint: &Endpoint,
    inflight: InflightSample,
    runs: &mut [SourceRun],
    outcomes: &mut [Option<Result<Instant, Failure>>],
    counters: &[Counter; OUTCOMES.len()],
    status: &StatusCell,
    shared: &Shared,
) {
    let current = endpoint.metrics();
    let mut next: Option<EndpointMetrics> = None;
    let mut oldest_page: Option<Instant> = None;
    let mut first_failure: Option<usize> = None;
    for (i, (run, outcome)) in runs.iter_mut().zip(outcomes.iter_mut()).enumerate() {
        let Some(outcome) = outcome else {
            continue;
        };
        if let Ok(at) = *outcome {
            // A failed extraction must not leave half-written values: work on a copy.
            let mut copy = next.as_ref().unwrap_or(&current).clone();
            match run.extract(endpoint, &mut copy) {
                Ok(()) => {
                    next = Some(copy);
                    if run.wiring.counts {
                        oldest_page = Some(oldest_page.map_or(at, |o| o.min(at)));
                    }
                }
                Err(f) => *outcome = Err(f),
            }
        }
        let label = match outcome {
            Ok(_) => "ok",
            Err(f) => {
                if run.wiring.counts {
                    first_failure.get_or_insert(i);
                }
                f.outcome()
            }
        };
        if let Some(i) = OUTCOMES.iter().position(|o| *o == label) {
            counters[i].inc();
        }
        run.log_change(endpoint, outcome, shared);
    }
    match first_failure {
        None if oldest_page.is_some() => status.record_ok(),
        None => {}
        Some(i) => status.record_failure(|| match &outcomes[i] {
            Some(Err(f)) => format!("{}: {f}", runs[i].url),
            _ => String::new(),
        }),
    }
    if let Some(mut m) = next {
        if first_failure.is_none() && oldest_page.is_some() {
            m.updated_at = oldest_page;
        }
        if oldest_page.is_some() {
            // The counts the model server's own numbers include.
            m.inflight_at_scrape = inflight;
        }
        endpoint.set_metrics(m);
    }
}
