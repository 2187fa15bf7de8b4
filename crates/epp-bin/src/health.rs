//! gRPC health: tells the truth about whether this picker can route.

use std::{sync::Arc, time::Duration};

use epp_core::EndpointSource;
use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};

/// Services reported. `liveness` is SERVING while the process runs; the others
/// only while a config is loaded and at least one endpoint has fresh metrics.
pub(crate) const READY_SERVICES: [&str; 3] = [
    "",
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// Whether the picker can route now: some endpoint has metrics younger than
/// `staleness`.
pub(crate) fn can_route(source: &dyn EndpointSource, staleness: Duration) -> bool {
    let now = std::time::Instant::now();
    source
        .snapshot()
        .endpoints()
        .iter()
        .any(|e| !e.metrics().is_stale(now, staleness))
}

/// A further condition for readiness (Kubernetes discovery synced, ...).
pub(crate) type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// Keeps the readiness services in step with [`can_route`] and `gate` until `shutdown`,
/// then reports NOT_SERVING everywhere (before the servers stop accepting).
pub(crate) async fn track(
    reporter: HealthReporter,
    source: Arc<dyn EndpointSource>,
    staleness: Duration,
    gate: Gate,
    shutdown: CancellationToken,
) {
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let mut last = None;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let ready = gate() && can_route(&*source, staleness);
        if last != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for svc in READY_SERVICES {
                reporter.set_service_status(svc, status).await;
            }
            tracing::info!(ready, "readiness changed");
            last = Some(ready);
        }
    }
    for svc in READY_SERVICES.into_iter().chain(["liveness"]) {
        reporter
            .set_service_status(svc, ServingStatus::NotServing)
            .await;
    }
}
