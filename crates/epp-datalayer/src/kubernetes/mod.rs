//! Kubernetes discovery: the endpoints are the Ready pods an `InferencePool`
//! selects, one per pod and target port — or, without a pool object, the
//! pods a label selector picks on fixed ports.
//!
//! [`KubernetesDiscovery::connect`] builds the client (a kubeconfig file,
//! `KUBECONFIG`, `~/.kube/config` or the in-cluster service account) and
//! checks up front that it may list and watch what it needs, so a missing
//! RBAC rule is an error at start that names it. [`Discovery::start`] then
//! follows the pool and its pods; [`KubernetesDiscovery::wait_synced`]
//! returns once the first complete list is applied.
//!
//! Faults: while the API server is away the last endpoints stay (the loop
//! retries every 100 ms to 2 s and re-lists on return); an expired watch is
//! re-listed and applied at once when complete; a list or watch forbidden
//! later is logged once, counted, and makes [`KubernetesDiscovery::is_ready`]
//! false; a deleted pool empties the set until it is re-created.

mod lease;
mod model;
mod resources;
mod selector;
mod watch;

use std::{
    fmt,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec},
    core::v1::Pod,
};
use kube::{
    Api, Client, Config,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};
pub use lease::{LeaderElector, LeaseTiming};
pub use model::{MAX_TARGET_PORTS, NamedEndpoint, PodView, PoolGroup, PoolSpec, check_ports};
use parking_lot::Mutex;
use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
pub use resources::{
    ClusterObjective, ClusterResources, ClusterRewrite, OnResources, PoolResources, RESOURCE_GROUPS,
};
pub use selector::LabelSelector;
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;
use watch::{Failure, Feed, Problem, Runner, Target};

use crate::{Discovery, EndpointStore, Error, Result};

/// What Kubernetes discovery follows.
#[derive(Debug, Clone)]
pub enum KubeTarget {
    /// An InferencePool object (`--pool-name`, `--pool-group`).
    Pool {
        /// The pool's name.
        name: String,
        /// Its API group (and so its shape).
        group: PoolGroup,
    },
    /// Pods matching a label selector on fixed ports, without a pool
    /// object (`--endpoint-selector`, `--endpoint-target-ports`).
    Selector(PoolSpec),
}

/// How to reach the cluster and what to follow.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Namespace of the pool and its pods.
    pub namespace: String,
    /// The pool or the selector.
    pub target: KubeTarget,
    /// A kubeconfig file; `None` infers (`KUBECONFIG`, `~/.kube/config`,
    /// then the in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
}

/// Builds a client from a kubeconfig file, or the inferred configuration.
///
/// # Errors
/// An unreadable kubeconfig or no configuration at all.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| {
                Error::Kubernetes(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    Error::Kubernetes(format!("invalid kubeconfig {}: {e}", path.display()))
                })?
        }
        None => Config::infer().await.map_err(|e| {
            Error::Kubernetes(format!(
                "no cluster configuration (give --kubeconfig, set KUBECONFIG, or run in a pod): {e}"
            ))
        })?,
    };
    Client::try_from(config)
        .map_err(|e| Error::Kubernetes(format!("cannot build the Kubernetes client: {e}")))
}

/// Checks with SelfSubjectAccessReviews that this client may do `verbs` on
/// `resource` (of `group`) in `namespace`.
///
/// # Errors
/// [`Error::Forbidden`] naming the missing verbs; [`Error::Kubernetes`] when
/// the API server cannot be asked.
pub async fn check_access(
    client: &Client,
    namespace: &str,
    group: &str,
    resource: &str,
    verbs: &[&str],
) -> Result<()> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for verb in verbs {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_owned()),
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    verb: Some((*verb).to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Error::Kubernetes(format!(
                    "cannot ask the API server whether {verb} {resource} is allowed: {e}"
                ))
            })?;
        if !answer.status.is_some_and(|s| s.allowed) {
            missing.push(*verb);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Forbidden {
        verbs: missing.join(", "),
        resource: qualified(resource, group),
        namespace: namespace.to_owned(),
    })
}

fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// The first sync's outcome, as [`KubernetesDiscovery::wait_synced`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SyncState {
    Pending,
    Synced,
    Failed(String),
}

/// State the loop shares with the handle: readiness inputs and metrics.
#[derive(Debug)]
pub(crate) struct Shared {
    namespace: String,
    pool_resource: String,
    sync: tokio_watch::Sender<SyncState>,
    pool_present: AtomicBool,
    problems: Mutex<[Option<Problem>; 2]>,
    /// Names and addresses of the endpoints published.
    endpoints: Mutex<Vec<(String, std::net::SocketAddr)>>,
    forbidden: Counter,
    watch_errors: Counter,
    relists: Counter,
    endpoint_count: Gauge,
    ready_gauge: Gauge,
}

impl Shared {
    fn feed_index(feed: Feed) -> usize {
        match feed {
            Feed::Pool => 0,
            Feed::Pods => 1,
        }
    }

    fn what(&self, feed: Feed) -> (String, &'static str) {
        match feed {
            Feed::Pool => (self.pool_resource.clone(), "the InferencePool"),
            Feed::Pods => ("pods".to_owned(), "pods"),
        }
    }

    /// A list or watch failed: log and count a new problem once.
    fn failed(&self, feed: Feed, e: &kube::runtime::watcher::Error, kept: usize) {
        let failure = Failure::classify(e);
        if failure == Failure::Expired {
            tracing::debug!(error = %e, "watch expired; re-listing");
            return;
        }
        let mut problems = self.problems.lock();
        let slot = &mut problems[Self::feed_index(feed)];
        if slot.as_ref().is_some_and(|p| p.failure == failure) {
            return;
        }
        let (resource, what) = self.what(feed);
        match &failure {
            Failure::Forbidden => {
                self.forbidden.inc();
                let err = Error::Forbidden {
                    verbs: "list, watch".into(),
                    resource,
                    namespace: self.namespace.clone(),
                };
                tracing::error!(error = %err, kept, "cannot follow {what}; keeping the last endpoints, not ready");
                self.sync.send_if_modified(|s| {
                    if *s == SyncState::Pending {
                        *s = SyncState::Failed(err.to_string());
                        true
                    } else {
                        false
                    }
                });
            }
            Failure::Unavailable(why) => {
                self.watch_errors.inc();
                tracing::warn!(error = %why, kept, "cannot follow {what} (API server away?); keeping the last endpoints and retrying");
            }
            Failure::Expired => {}
        }
        *slot = Some(Problem {
            failure,
            since: Instant::now(),
        });
        drop(problems);
        self.update_ready();
    }

    /// An event arrived: the feed works again.
    fn recovered(&self, feed: Feed) {
        let mut problems = self.problems.lock();
        if let Some(p) = problems[Self::feed_index(feed)].take() {
            let (_, what) = self.what(feed);
            tracing::info!(after = ?p.since.elapsed(), "following {what} again");
            drop(problems);
            self.update_ready();
        }
    }

    fn set_pool_present(&self, present: bool) {
        self.pool_present.store(present, Ordering::Relaxed);
        self.update_ready();
    }

    fn set_endpoints(&self, endpoints: &std::collections::BTreeMap<String, NamedEndpoint>) {
        self.endpoint_count
            .set(i64::try_from(endpoints.len()).unwrap_or(i64::MAX));
        let mut names = self.endpoints.lock();
        names.clear();
        names.extend(endpoints.values().map(|e| (e.name.clone(), e.spec.addr)));
    }

    fn synced(&self) {
        let first = self.sync.send_if_modified(|s| {
            if *s == SyncState::Synced {
                false
            } else {
                *s = SyncState::Synced;
                true
            }
        });
        if first {
            tracing::info!(
                endpoints = self.endpoints.lock().len(),
                "kubernetes discovery synced"
            );
            self.update_ready();
        }
    }

    fn is_ready(&self) -> bool {
        *self.sync.borrow() == SyncState::Synced
            && self.pool_present.load(Ordering::Relaxed)
            && !self
                .problems
                .lock()
                .iter()
                .flatten()
                .any(|p| p.failure == Failure::Forbidden)
    }

    fn update_ready(&self) {
        self.ready_gauge.set(i64::from(self.is_ready()));
    }
}

/// Kubernetes discovery (see the [module docs](self)).
pub struct KubernetesDiscovery {
    options: KubeOptions,
    client: Client,
    shared: Arc<Shared>,
    started: AtomicBool,
}

impl fmt::Debug for KubernetesDiscovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesDiscovery")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl KubernetesDiscovery {
    /// Connects and checks permissions: `list` and `watch` on pods, and on
    /// the InferencePool resource when following a pool.
    ///
    /// # Errors
    /// No cluster configuration, an unreachable API server, or a missing
    /// permission ([`Error::Forbidden`], naming it).
    pub async fn connect(options: KubeOptions) -> Result<Self> {
        let client = client(options.kubeconfig.as_deref()).await?;
        Self::with_client(client, options).await
    }

    /// As [`KubernetesDiscovery::connect`], with a client already built.
    ///
    /// # Errors
    /// As [`KubernetesDiscovery::connect`].
    pub async fn with_client(client: Client, options: KubeOptions) -> Result<Self> {
        let ns = &options.namespace;
        check_access(&client, ns, "", "pods", &["list", "watch"]).await?;
        let pool_resource = match &options.target {
            KubeTarget::Pool { group, .. } => {
                check_access(
                    &client,
                    ns,
                    group.group(),
                    "inferencepools",
                    &["list", "watch"],
                )
                .await?;
                qualified("inferencepools", group.group())
            }
            KubeTarget::Selector(_) => String::new(),
        };
        let selector_mode = matches!(options.target, KubeTarget::Selector(_));
        let shared = Arc::new(Shared {
            namespace: ns.clone(),
            pool_resource,
            sync: tokio_watch::Sender::new(SyncState::Pending),
            pool_present: AtomicBool::new(selector_mode),
            problems: Mutex::new([None, None]),
            endpoints: Mutex::new(Vec::new()),
            forbidden: Counter::default(),
            watch_errors: Counter::default(),
            relists: Counter::default(),
            endpoint_count: Gauge::default(),
            ready_gauge: Gauge::default(),
        });
        Ok(Self {
            options,
            client,
            shared,
            started: AtomicBool::new(false),
        })
    }

    /// The client (shared with other Kubernetes readers, e.g. objectives).
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Waits for the first complete sync (the pool, if any, and its pods
    /// listed and applied), at most `timeout`.
    ///
    /// # Errors
    /// A list forbidden before that, or no sync within `timeout` (the API
    /// server unreachable).
    pub async fn wait_synced(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.shared.sync.subscribe();
        let outcome =
            tokio::time::timeout(timeout, rx.wait_for(|s| *s != SyncState::Pending)).await;
        match outcome {
            Ok(Ok(state)) => match &*state {
                SyncState::Failed(why) => Err(Error::Kubernetes(why.clone())),
                _ => Ok(()),
            },
            Ok(Err(_)) => Err(Error::Kubernetes(
                "discovery stopped before its first sync".into(),
            )),
            Err(_) => {
                let problems: Vec<String> = self
                    .shared
                    .problems
                    .lock()
                    .iter()
                    .flatten()
                    .map(|p| format!("{:?}", p.failure))
                    .collect();
                Err(Error::Kubernetes(format!(
                    "no complete list of the pool and its pods within {timeout:?}{}",
                    if problems.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", problems.join("; "))
                    }
                )))
            }
        }
    }

    /// Ready: the first sync is done, the pool exists (pool mode), and no
    /// list or watch is currently forbidden.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// The endpoints last published: name (`<pod>` or `<pod>-rank-<i>`) and
    /// address, sorted by name.
    #[must_use]
    pub fn endpoints(&self) -> Vec<(String, std::net::SocketAddr)> {
        self.shared.endpoints.lock().clone()
    }

    /// Lists or watches refused by RBAC since start (each refusal counted
    /// once while it lasts).
    #[must_use]
    pub fn forbidden_errors(&self) -> u64 {
        self.shared.forbidden.get()
    }

    /// Complete re-lists of the pods after the first one (reconnects and
    /// expired watches).
    #[must_use]
    pub fn relists(&self) -> u64 {
        self.shared.relists.get()
    }
}

impl Discovery for KubernetesDiscovery {
    fn source_name(&self) -> String {
        match &self.options.target {
            KubeTarget::Pool { name, group } => {
                format!(
                    "kubernetes:{}/{name}.{}",
                    self.options.namespace,
                    group.group()
                )
            }
            KubeTarget::Selector(spec) => {
                format!(
                    "kubernetes:{}/selector({})",
                    self.options.namespace, spec.selector
                )
            }
        }
    }

    /// Starts following on the current runtime; returns at once (see
    /// [`KubernetesDiscovery::wait_synced`] for the first set).
    fn start(&self, store: Arc<EndpointStore>, stop: CancellationToken) -> Result<()> {
        if self.started.swap(true, Ordering::SeqCst) {
            return Err(Error::Kubernetes("discovery already started".into()));
        }
        let ns = &self.options.namespace;
        let target = match &self.options.target {
            KubeTarget::Pool { name, group } => Target::Pool {
                api: Box::new(Api::namespaced_with(
                    self.client.clone(),
                    ns,
                    &group.resource(),
                )),
                name: name.clone(),
            },
            KubeTarget::Selector(spec) => Target::Fixed(spec.clone()),
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let runner = Runner::new(
            target,
            pods,
            store,
            self.source_name(),
            Arc::clone(&self.shared),
            ns.to_owned(),
        );
        tokio::spawn(runner.run(stop));
        Ok(())
    }

    fn register_metrics(&self, registry: &mut Registry) {
        let s = &self.shared;
        registry.register(
            "epp_kubernetes_forbidden_errors",
            "Lists or watches of the pool or its pods refused by RBAC (each refusal once while it lasts)",
            s.forbidden.clone(),
        );
        registry.register(
            "epp_kubernetes_watch_errors",
            "Times the API server became unreachable or failing for discovery (the last endpoints were kept)",
            s.watch_errors.clone(),
        );
        registry.register(
            "epp_kubernetes_relists",
            "Complete re-lists of the pool's pods after the first (reconnects, expired watches)",
            s.relists.clone(),
        );
        registry.register(
            "epp_kubernetes_endpoints",
            "Endpoints Kubernetes discovery currently publishes",
            s.endpoint_count.clone(),
        );
        registry.register(
            "epp_kubernetes_discovery_ready",
            "1 when discovery has synced, the pool exists and nothing is forbidden",
            s.ready_gauge.clone(),
        );
    }
}
