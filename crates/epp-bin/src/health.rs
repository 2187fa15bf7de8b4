//! gRPC health, as the reference's probes ask for it.
//!
//! - `liveness`: SERVING while the process runs, through the drain after
//!   SIGTERM, until ext_proc stops accepting. It never depends on model
//!   servers, so a liveness probe cannot restart epp in a loop while they
//!   load.
//! - `""`, `readiness`, `inference-extension` (the reference chart's probe
//!   name) and `envoy.service.ext_proc.v3.ExternalProcessor`: SERVING once the
//!   config is loaded, discovery has published its first complete endpoint
//!   set (on Kubernetes: synced, the pool present, nothing forbidden), and
//!   this replica leads (when leader election is on).
//!
//! Whether any endpoint has fresh metrics is not readiness (a picker with
//! stale endpoints still routes, and restarting it fixes nothing): it is the
//! `inference_pool_ready_pods` gauge and a log line when it changes between
//! none and some.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use epp_core::EndpointSource;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};

/// Services reported SERVING when the picker is ready.
pub(crate) const READY_SERVICES: [&str; 4] = [
    "",
    "readiness",
    "inference-extension",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// A further condition for readiness, polled: Kubernetes discovery synced
/// with nothing forbidden, and this replica leading when leader election is
/// on (see `kube.rs`).
pub(crate) type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// What readiness waits for besides the config (loaded before the servers
/// start): discovery's first complete sync, and the [`Gate`]. Set from
/// anywhere; the health task follows.
pub(crate) struct Readiness {
    synced: AtomicBool,
    gate: Gate,
    changed: Notify,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("synced", &self.synced)
            .finish_non_exhaustive()
    }
}

impl Readiness {
    /// Not synced yet; ready once synced while `gate` holds.
    pub(crate) fn new(gate: Gate) -> Self {
        Self {
            synced: AtomicBool::new(false),
            gate,
            changed: Notify::new(),
        }
    }

    /// Discovery has (or no longer has) a complete endpoint set.
    pub(crate) fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Release);
        self.changed.notify_one();
    }

    /// Whether the picker should receive traffic.
    pub(crate) fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Acquire) && (self.gate)()
    }
}

/// How many endpoints have metrics younger than `staleness`.
fn fresh_endpoints(source: &dyn EndpointSource, staleness: Duration) -> usize {
    let now = std::time::Instant::now();
    source
        .snapshot()
        .endpoints()
        .iter()
        .filter(|e| !e.metrics().is_stale(now, staleness))
        .count()
}

/// Keeps the health services in step with `readiness` until `shutdown`,
/// then reports the readiness services NOT_SERVING (before the drain).
/// Logs when the fleet goes from some fresh endpoints to none and back.
pub(crate) async fn track(
    reporter: HealthReporter,
    readiness: Arc<Readiness>,
    source: Arc<dyn EndpointSource>,
    staleness: Duration,
    shutdown: CancellationToken,
) {
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let mut last_ready = None;
    let mut last_fresh = None;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        let ready = readiness.is_ready();
        if last_ready != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for svc in READY_SERVICES {
                reporter.set_service_status(svc, status).await;
            }
            tracing::info!(ready, "readiness changed");
            last_ready = Some(ready);
        }
        let fresh = fresh_endpoints(&*source, staleness) > 0;
        if last_fresh != Some(fresh) {
            if fresh {
                tracing::info!("endpoints with fresh metrics available");
            } else if ready {
                tracing::warn!(
                    ?staleness,
                    "no endpoint has fresh metrics: routing on stale or no values"
                );
            }
            last_fresh = Some(fresh);
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = readiness.changed.notified() => {}
            _ = tick.tick() => {}
        }
    }
    // Liveness stays SERVING through the drain: the process is alive and
    // serving; main turns it off when ext_proc stops accepting.
    for svc in READY_SERVICES {
        reporter
            .set_service_status(svc, ServingStatus::NotServing)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_sync_and_the_gate() {
        let r = Readiness::new(Arc::new(|| true));
        assert!(!r.is_ready(), "not before discovery's first sync");
        r.set_synced(true);
        assert!(r.is_ready());

        let leading = Arc::new(AtomicBool::new(false));
        let gate = Arc::clone(&leading);
        let ha = Readiness::new(Arc::new(move || gate.load(Ordering::Acquire)));
        ha.set_synced(true);
        assert!(!ha.is_ready(), "a follower takes no traffic");
        leading.store(true, Ordering::Release);
        assert!(ha.is_ready());
        leading.store(false, Ordering::Release);
        assert!(!ha.is_ready());
    }
}
