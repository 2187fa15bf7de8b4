//! The discovery loop: follows the InferencePool (or a fixed selector) and
//! the pods it selects, and keeps the endpoint store's Kubernetes part equal
//! to the Ready pods × target ports.
//!
//! Re-lists (after a reconnect or an expired watch) are buffered and applied
//! at once when complete, so the set never drops to what a half-read list
//! shows; while the API server is away the last set stays in place.

use std::{
    collections::BTreeMap,
    fmt,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::DynamicObject,
    runtime::{
        WatchStreamExt,
        utils::Backoff,
        watcher::{self, Event},
    },
};
use tokio_util::sync::CancellationToken;

use super::{
    Shared,
    model::{NamedEndpoint, PodView, PoolSpec, endpoint_name, endpoints, pod_endpoints},
    selector::LabelSelector,
};
use crate::EndpointStore;

type EventStream<K> = Pin<Box<dyn Stream<Item = watcher::Result<Event<K>>> + Send>>;

/// Retries after a failed list or watch: 100 ms, doubling, at most 2 s, so
/// the set converges within about two seconds of the API server's return.
#[derive(Debug, Clone)]
pub(super) struct RetryBackoff {
    next: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(100),
        }
    }
}

impl Iterator for RetryBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(Duration::from_secs(2));
        Some(now)
    }
}

impl Backoff for RetryBackoff {
    fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Which stream an event or error came from (for messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Feed {
    Pool,
    Pods,
}

/// Where the endpoints' selector and ports come from.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Pool {
        api: Box<Api<DynamicObject>>,
        name: String,
    },
    Fixed(PoolSpec),
}

/// The loop's state.
pub(super) struct Runner {
    pub(super) target: Target,
    pub(super) pods_api: Api<Pod>,
    pub(super) store: Arc<EndpointStore>,
    pub(super) source: String,
    pub(super) shared: Arc<Shared>,
    namespace: String,
    /// Whether the pool was ever seen (to say "deleted" rather than "does
    /// not exist" when it is gone).
    pool_seen: bool,
    pool_stream: Option<EventStream<DynamicObject>>,
    /// The pool's spec (`None`: no such pool, or not listed yet).
    pool: Option<PoolSpec>,
    /// A pool re-list in progress: what it found so far.
    pool_relist: Option<Option<PoolSpec>>,
    pool_synced: bool,
    pod_stream: Option<(LabelSelector, EventStream<Pod>)>,
    /// Pods of the last complete list and the events since.
    pods: BTreeMap<String, PodView>,
    /// A pod re-list in progress.
    pods_relist: Option<BTreeMap<String, PodView>>,
    pods_synced: bool,
    /// The endpoints in the store, by name.
    published: BTreeMap<String, NamedEndpoint>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("source", &self.source)
            .field("pool", &self.pool)
            .field("pods", &self.pods.len())
            .field("published", &self.published.len())
            .finish_non_exhaustive()
    }
}

impl Runner {
    pub(super) fn new(
        target: Target,
        pods_api: Api<Pod>,
        store: Arc<EndpointStore>,
        source: String,
        shared: Arc<Shared>,
        namespace: String,
    ) -> Self {
        let (pool, pool_synced, pool_stream) = match &target {
            Target::Pool { api, name } => {
                let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
                let stream: EventStream<DynamicObject> = Box::pin(
                    watcher::watcher((**api).clone(), config)
                        .filter(not_init)
                        .backoff(RetryBackoff::default()),
                );
                (None, false, Some(stream))
            }
            Target::Fixed(spec) => (Some(spec.clone()), true, None),
        };
        let mut runner = Self {
            target,
            pods_api,
            store,
            source,
            shared,
            namespace,
            pool_seen: false,
            pool_stream,
            pool,
            pool_relist: None,
            pool_synced,
            pod_stream: None,
            pods: BTreeMap::new(),
            pods_relist: None,
            pods_synced: false,
            published: BTreeMap::new(),
        };
        runner.follow_selector();
        runner
    }

    /// Runs until `stop`.
    pub(super) async fn run(mut self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                Some(item) = next(&mut self.pool_stream) => match item {
                    Ok(event) => {
                        self.shared.recovered(Feed::Pool);
                        self.on_pool(event);
                    }
                    Err(e) => self.shared.failed(Feed::Pool, &e, self.published.len()),
                },
                Some(item) = next_pods(&mut self.pod_stream) => match item {
                    Ok(event) => {
                        self.shared.recovered(Feed::Pods);
                        self.on_pods(event);
                    }
                    Err(e) => self.shared.failed(Feed::Pods, &e, self.published.len()),
                },
            }
            self.update_sync();
        }
    }

    fn on_pool(&mut self, event: Event<DynamicObject>) {
        let name = match &self.target {
            Target::Pool { name, .. } => name.clone(),
            Target::Fixed(_) => return,
        };
        let parse = |obj: &DynamicObject| match PoolSpec::from_object(&name, &obj.data) {
            Ok(spec) => Some(spec),
            Err(e) => {
                tracing::error!(error = %e, "InferencePool unusable; treating it as absent");
                None
            }
        };
        match event {
            Event::Init => {}
            Event::InitApply(obj) => self.pool_relist = Some(parse(&obj)),
            Event::InitDone => {
                let found = self.pool_relist.take().flatten();
                self.pool_synced = true;
                self.set_pool(found);
            }
            Event::Apply(obj) => {
                let spec = parse(&obj);
                self.set_pool(spec);
            }
            Event::Delete(_) => self.set_pool(None),
        }
    }

    fn set_pool(&mut self, spec: Option<PoolSpec>) {
        if spec == self.pool {
            return;
        }
        match (&self.pool, &spec) {
            (None, Some(s)) => {
                tracing::info!(selector = %s.selector, ports = ?s.ports, "InferencePool found");
            }
            (Some(_), None) => tracing::warn!("InferencePool gone: no endpoints until it returns"),
            (Some(old), Some(s)) => tracing::info!(
                old_selector = %old.selector, selector = %s.selector,
                old_ports = ?old.ports, ports = ?s.ports,
                "InferencePool changed"
            ),
            (None, None) => {}
        }
        self.shared.set_pool_present(spec.is_some());
        self.pool_seen |= spec.is_some();
        self.pool = spec;
        self.follow_selector();
        self.publish();
    }

    /// (Re)starts the pod watch when the selector changed. Until the new
    /// list is complete, the pods already known stay, filtered by the new
    /// selector.
    fn follow_selector(&mut self) {
        let Some(spec) = &self.pool else {
            self.pod_stream = None;
            self.pods.clear();
            self.pods_relist = None;
            self.pods_synced = false;
            return;
        };
        if self
            .pod_stream
            .as_ref()
            .is_some_and(|(s, _)| *s == spec.selector)
        {
            return;
        }
        let config = watcher::Config::default().labels(spec.selector.as_str());
        let stream: EventStream<Pod> = Box::pin(
            watcher::watcher(self.pods_api.clone(), config)
                .modify(|pod| {
                    // Discovery reads neither: drop them before they are kept anywhere.
                    pod.metadata.managed_fields = None;
                    pod.spec = None;
                })
                .filter(not_init)
                .backoff(RetryBackoff::default()),
        );
        self.pod_stream = Some((spec.selector.clone(), stream));
        self.pods_relist = None;
    }

    fn on_pods(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => {}
            Event::InitApply(pod) => {
                let view = PodView::from_pod(&pod);
                self.pods_relist
                    .get_or_insert_default()
                    .insert(view.name.clone(), view);
            }
            Event::InitDone => {
                if self.pods_synced {
                    self.shared.relists.inc();
                }
                self.pods = self.pods_relist.take().unwrap_or_default();
                self.pods_synced = true;
                self.publish();
            }
            Event::Apply(pod) => {
                let view = PodView::from_pod(&pod);
                // Most pod updates change nothing discovery reads: skip them.
                if self.pods.get(&view.name) == Some(&view) {
                    return;
                }
                let old = self.pods.insert(view.name.clone(), view.clone());
                self.update_pod(old.as_ref(), Some(&view));
            }
            Event::Delete(pod) => {
                let name = pod.metadata.name.unwrap_or_default();
                let old = self.pods.remove(&name);
                self.update_pod(old.as_ref(), None);
            }
        }
    }

    /// Applies one pod's change to the published set without recomputing
    /// the others (a pod update costs O(log n) here, plus the store's copy).
    fn update_pod(&mut self, old: Option<&PodView>, new: Option<&PodView>) {
        let Some(spec) = &self.pool else {
            return;
        };
        let mut changed = false;
        if let Some(old) = old {
            for rank in 0..spec.ports.len() {
                let name = endpoint_name(&old.name, rank, spec.ports.len());
                if let Some(gone) = self.published.remove(&name) {
                    changed = true;
                    if new.is_none_or(|n| !n.serves()) {
                        tracing::debug!(endpoint = %gone.name, addr = %gone.spec.addr, "endpoint removed");
                    }
                }
            }
        }
        if let Some(new) = new {
            for e in pod_endpoints(new, &spec.selector, &spec.ports) {
                changed = true;
                tracing::debug!(endpoint = %e.name, addr = %e.spec.addr, "endpoint added or updated");
                self.published.insert(e.name.clone(), e);
            }
        }
        if changed {
            self.flush();
        }
    }

    /// Recomputes the whole set (pool changed, a re-list completed) and
    /// writes it to the store when it changed.
    fn publish(&mut self) {
        let next: BTreeMap<String, NamedEndpoint> = match &self.pool {
            Some(spec) => endpoints(self.pods.values(), &spec.selector, &spec.ports)
                .into_iter()
                .map(|e| (e.name.clone(), e))
                .collect(),
            None => BTreeMap::new(),
        };
        if next == self.published {
            // Unchanged endpoints, but maybe a new reason for having none
            // (the pool deleted while no pod was Ready).
            self.explain(next.is_empty());
            return;
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let old: Vec<&NamedEndpoint> = self.published.values().collect();
            let new: Vec<&NamedEndpoint> = next.values().collect();
            log_changes(&old, &new);
        }
        self.published = next;
        self.flush();
    }

    /// Writes the published set to the store.
    fn flush(&self) {
        // The reason first: the empty set is published with it.
        self.explain(self.published.is_empty());
        tracing::info!(
            endpoints = self.published.len(),
            "kubernetes endpoints changed"
        );
        self.store.replace_source(
            &self.source,
            self.published.values().map(|e| e.spec.clone()).collect(),
        );
        self.shared.set_endpoints(&self.published);
    }

    /// Tells the store why the Kubernetes part of the set is empty (when it
    /// is and the lists are complete), so a refused request says why.
    fn explain(&self, empty: bool) {
        let ns = &self.namespace;
        let reason = match (&self.target, &self.pool) {
            _ if !empty => None,
            (Target::Pool { name, .. }, None) if self.pool_synced => Some(if self.pool_seen {
                format!("InferencePool {ns}/{name} was deleted")
            } else {
                format!("InferencePool {ns}/{name} does not exist")
            }),
            (target, Some(spec)) if self.pods_synced => {
                let whose = match target {
                    Target::Pool { name, .. } => format!("InferencePool {ns}/{name}'s selector"),
                    Target::Fixed(_) => "--endpoint-selector".to_owned(),
                };
                Some(format!(
                    "no Ready pod with an IP in namespace {ns} matches {whose} {}",
                    spec.selector
                ))
            }
            _ => None,
        };
        self.store.set_empty_reason(&self.source, reason);
    }

    fn update_sync(&self) {
        let complete = self.pool_synced && (self.pool.is_none() || self.pods_synced);
        if complete {
            self.shared.synced();
        }
    }
}

/// Drops the `Init` marker: the watcher sends it before each list attempt,
/// even one that then fails, so it says nothing about the API server's
/// health and must not reset the retry backoff. A re-list is recognised by
/// its first `InitApply` (or an `InitDone` alone, for an empty list).
fn not_init<K>(item: &watcher::Result<Event<K>>) -> std::future::Ready<bool> {
    std::future::ready(!matches!(item, Ok(Event::Init)))
}

/// Logs endpoints added and removed; both lists are sorted by name, so one
/// merge pass finds them.
fn log_changes(old: &[&NamedEndpoint], new: &[&NamedEndpoint]) {
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (Some(a), Some(b)) if a == b => {
                o.next();
                n.next();
            }
            (Some(a), Some(b)) if a.name <= b.name => {
                tracing::debug!(endpoint = %a.name, addr = %a.spec.addr, "endpoint removed or changed");
                o.next();
            }
            (Some(_), Some(b)) | (None, Some(b)) => {
                tracing::debug!(endpoint = %b.name, addr = %b.spec.addr, "endpoint added or changed");
                n.next();
            }
            (Some(a), None) => {
                tracing::debug!(endpoint = %a.name, addr = %a.spec.addr, "endpoint removed");
                o.next();
            }
            (None, None) => return,
        }
    }
}

async fn next<K>(stream: &mut Option<EventStream<K>>) -> Option<watcher::Result<Event<K>>> {
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn next_pods(
    stream: &mut Option<(LabelSelector, EventStream<Pod>)>,
) -> Option<watcher::Result<Event<Pod>>> {
    match stream {
        Some((_, s)) => s.next().await,
        None => std::future::pending().await,
    }
}

/// How an error from a list or watch is reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// RBAC refuses it.
    Forbidden,
    /// The watch's resource version expired (410): re-listed, no gap.
    Expired,
    /// Anything else: the API server is away or failing.
    Unavailable(String),
}

impl Failure {
    pub(super) fn classify(e: &watcher::Error) -> Self {
        let status = match e {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref()),
            watcher::Error::WatchError(s) => Some(s.as_ref()),
            _ => None,
        };
        match status.map(|s| s.code) {
            Some(403) => Self::Forbidden,
            Some(410) => Self::Expired,
            _ => Self::Unavailable(e.to_string()),
        }
    }
}

/// When the last problem of a feed started (for "unavailable for N s").
#[derive(Debug, Clone)]
pub(super) struct Problem {
    pub(super) failure: Failure,
    pub(super) since: Instant,
}
