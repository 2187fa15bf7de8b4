//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go does
//! it: the holder renews the lease every retry period; a candidate takes it
//! over once it has seen no renewal for a whole lease duration (measured on
//! its own clock, so clocks need not agree); the holder steps down when it
//! cannot renew within the renew deadline, and releases the lease (empty
//! holder) when told to stop, so a successor takes over at once.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{PostParams, Resource},
};
use tokio_util::sync::CancellationToken;

use super::check_access;
use crate::{Error, Result};

/// Timing of the election (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// How long a lease holds without renewal.
    pub duration: Duration,
    /// How long the holder keeps leading while renewals fail.
    pub renew_deadline: Duration,
    /// How often to renew or try to acquire.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self::from_duration(Duration::from_secs(15))
    }
}

impl LeaseTiming {
    /// Timing scaled from a lease duration: renew deadline 2/3 of it, retry
    /// period 2/15 of it (15 s → 10 s, 2 s).
    #[must_use]
    pub fn from_duration(duration: Duration) -> Self {
        let duration = duration.max(Duration::from_secs(1));
        Self {
            duration,
            renew_deadline: duration * 2 / 3,
            retry_period: duration * 2 / 15,
        }
    }
}

/// One candidate in an election.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    leader: Arc<AtomicBool>,
    released: Arc<tokio::sync::Notify>,
}

impl fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElector")
            .field("lease", &self.name)
            .field("identity", &self.identity)
            .field("leader", &self.is_leader())
            .finish_non_exhaustive()
    }
}

/// What this candidate last saw of the lease.
#[derive(Debug)]
struct Observed {
    /// The lease's resourceVersion.
    version: String,
    /// When (our clock) it was first seen at that version.
    at: Instant,
}

impl LeaderElector {
    /// A candidate for the Lease `name` in `namespace`, known as `identity`.
    ///
    /// # Errors
    /// [`Error::Forbidden`] when it may not get, create and update leases.
    pub async fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
    ) -> Result<Self> {
        check_access(
            &client,
            namespace,
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
        )
        .await?;
        Ok(Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            leader: Arc::new(AtomicBool::new(false)),
            released: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Whether this candidate leads now.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// Runs the election until `stop`; then, if leading, releases the
    /// lease before [`LeaderElector::wait_released`] returns.
    pub fn spawn(self: &Arc<Self>, stop: CancellationToken) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut observed: Option<Observed> = None;
            let mut last_renew = Instant::now();
            loop {
                let attempt = tokio::time::timeout(
                    this.timing.retry_period.max(Duration::from_millis(200)),
                    this.try_acquire_or_renew(&mut observed),
                )
                .await
                .unwrap_or_else(|_| Err(Error::Kubernetes("lease request timed out".into())));
                match attempt {
                    Ok(true) => {
                        last_renew = Instant::now();
                        if !this.leader.swap(true, Ordering::SeqCst) {
                            tracing::info!(lease = %this.name, identity = %this.identity, "became the leader");
                        }
                    }
                    Ok(false) => {
                        if this.leader.swap(false, Ordering::SeqCst) {
                            tracing::warn!(lease = %this.name, "another replica holds the lease; not leading");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(lease = %this.name, error = %e, "lease renewal failed");
                        if this.is_leader() && last_renew.elapsed() > this.timing.renew_deadline {
                            this.leader.store(false, Ordering::SeqCst);
                            tracing::warn!(lease = %this.name, "renew deadline passed; not leading");
                        }
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(this.timing.retry_period) => {}
                }
            }
            if this.leader.swap(false, Ordering::SeqCst) {
                match this.release().await {
                    Ok(()) => tracing::info!(lease = %this.name, "lease released"),
                    Err(e) => {
                        tracing::warn!(lease = %this.name, error = %e, "cannot release the lease")
                    }
                }
            }
            this.released.notify_waiters();
            this.released.notify_one();
        });
    }

    /// Waits until the loop has ended (and released the lease if it led).
    pub async fn wait_released(&self) {
        self.released.notified().await;
    }

    /// One round: `Ok(true)` when this candidate holds the lease after it.
    async fn try_acquire_or_renew(&self, observed: &mut Option<Observed>) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::Kubernetes(format!("cannot read lease {}: {e}", self.name)))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration_secs()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(Error::Kubernetes(format!(
                    "cannot create lease {}: {e}",
                    self.name
                ))),
            };
        };
        let version = lease.meta().resource_version.clone().unwrap_or_default();
        if observed.as_ref().is_none_or(|o| o.version != version) {
            *observed = Some(Observed {
                version,
                at: Instant::now(),
            });
        }
        let spec = lease.spec.get_or_insert_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        let held_for = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.timing.duration, Duration::from_secs);
        let expired = observed.as_ref().is_some_and(|o| o.at.elapsed() > held_for);
        if !mine && !holder.is_empty() && !expired {
            return Ok(false);
        }
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.duration_secs());
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            // Someone else wrote it first (resourceVersion changed).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::Kubernetes(format!(
                "cannot update lease {}: {e}",
                self.name
            ))),
        }
    }

    /// Gives the lease up: no holder, so a candidate takes it at once.
    async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::Kubernetes(e.to_string()))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(drop)
            .map_err(|e| Error::Kubernetes(e.to_string()))
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.timing.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}
