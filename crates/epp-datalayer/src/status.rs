//! Scrape counters per endpoint, for the binary's own metrics and for tests.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use epp_core::EndpointId;
use parking_lot::Mutex;

/// How scraping one endpoint has gone so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeStatus {
    /// The endpoint.
    pub id: EndpointId,
    /// Its address.
    pub addr: SocketAddr,
    /// Scrapes that refreshed the endpoint's metrics (every source succeeded).
    pub ok: u64,
    /// Scrapes where at least one source failed.
    pub failed: u64,
    /// Why the latest scrape failed; `None` when it succeeded (or none ran yet).
    pub last_error: Option<String>,
}

/// The live counters behind one [`ScrapeStatus`].
#[derive(Debug)]
pub(crate) struct StatusCell {
    addr: SocketAddr,
    ok: AtomicU64,
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl StatusCell {
    pub(crate) fn record_ok(&self) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        let mut e = self.last_error.lock();
        if e.is_some() {
            *e = None;
        }
    }

    pub(crate) fn record_failure(&self, why: impl FnOnce() -> String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let why = why();
        let mut e = self.last_error.lock();
        if e.as_deref() != Some(why.as_str()) {
            *e = Some(why);
        }
    }
}

/// Every endpoint's counters, by id (kept while the endpoint exists).
#[derive(Debug, Default)]
pub(crate) struct StatusTable(Mutex<HashMap<EndpointId, Arc<StatusCell>>>);

impl StatusTable {
    /// The cell of `id`, created on first use.
    pub(crate) fn cell(&self, id: EndpointId, addr: SocketAddr) -> Arc<StatusCell> {
        Arc::clone(self.0.lock().entry(id).or_insert_with(|| {
            Arc::new(StatusCell {
                addr,
                ok: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                last_error: Mutex::new(None),
            })
        }))
    }

    pub(crate) fn remove(&self, id: EndpointId) {
        self.0.lock().remove(&id);
    }

    /// A copy of every endpoint's status, ordered by id.
    pub(crate) fn snapshot(&self) -> Vec<ScrapeStatus> {
        let mut out: Vec<ScrapeStatus> = self
            .0
            .lock()
            .iter()
            .map(|(id, c)| ScrapeStatus {
                id: *id,
                addr: c.addr,
                ok: c.ok.load(Ordering::Relaxed),
                failed: c.failed.load(Ordering::Relaxed),
                last_error: c.last_error.lock().clone(),
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }
}
