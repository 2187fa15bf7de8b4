//! Kubernetes wiring: the flags that pick an InferencePool or a label
//! selector, starting discovery, and the readiness it contributes.

use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use arc_swap::ArcSwap;
use clap::Args as ClapArgs;
use epp_core::config::{ModelRewriteDecl, ModelRewriteRules};
use epp_datalayer::{
    Discovery, EndpointStore,
    kubernetes::{
        ClusterResources, KubeOptions, KubeTarget, KubernetesDiscovery, LabelSelector,
        LeaderElector, LeaseTiming, PoolGroup, PoolResources, PoolSpec, check_ports,
    },
};
use epp_extproc::{ExtProcOptions, ModelRewrite, ObjectivePriority};
use tokio_util::sync::CancellationToken;

/// Flags of Kubernetes discovery.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct KubeArgs {
    /// API group of the InferencePool: `inference.networking.k8s.io` (v1) or
    /// the older `inference.networking.x-k8s.io` (v1alpha2).
    #[arg(long, default_value = "inference.networking.k8s.io")]
    pub(crate) pool_group: String,

    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account).
    #[arg(long)]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// Standalone selector mode: the Ready pods matching this label selector
    /// (`k=v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`) in
    /// --pool-namespace, without an InferencePool object.
    #[arg(long, conflicts_with_all = ["endpoints", "endpoints_file"],
          requires = "endpoint_target_ports")]
    pub(crate) endpoint_selector: Option<String>,

    /// Ports of each selected pod for --endpoint-selector (1 to 8,
    /// comma-separated; with several, endpoints are named `<pod>-rank-<i>`).
    #[arg(long, value_delimiter = ',', requires = "endpoint_selector")]
    pub(crate) endpoint_target_ports: Vec<i64>,

    /// How long to wait at start for the first complete list of the pool and
    /// its pods before giving up.
    #[arg(long, default_value = "30s", value_parser = crate::args::parse_duration)]
    pub(crate) kube_sync_timeout: Duration,

    /// Elect a leader among replicas with a Lease `<pool-name>-epp-leader` in
    /// --pool-namespace: only the leader reports ready; the lease is released
    /// at once on SIGTERM.
    #[arg(long)]
    pub(crate) ha_enable_leader_election: bool,

    /// How long a lease holds without renewal (renewed every 2/15 of it; the
    /// leader steps down after failing to renew for 2/3 of it).
    #[arg(long, default_value = "15s", value_parser = crate::args::parse_duration)]
    pub(crate) ha_lease_duration: Duration,
}

/// What Kubernetes discovery follows, from the flags; `None` when the
/// endpoints come from `--endpoints` or `--endpoints-file`.
fn options(
    kube: &KubeArgs,
    pool_name: Option<&str>,
    namespace: &str,
    static_endpoints: bool,
) -> Result<Option<KubeOptions>> {
    let target = if let Some(selector) = &kube.endpoint_selector {
        let selector = LabelSelector::parse(selector).context("invalid --endpoint-selector")?;
        let ports = check_ports(&kube.endpoint_target_ports)
            .map_err(anyhow::Error::msg)
            .context("invalid --endpoint-target-ports")?;
        KubeTarget::Selector(PoolSpec { selector, ports })
    } else if let (Some(name), false) = (pool_name, static_endpoints) {
        if name.is_empty() {
            bail!("--pool-name is empty");
        }
        KubeTarget::Pool {
            name: name.to_owned(),
            group: PoolGroup::parse(&kube.pool_group).context("invalid --pool-group")?,
        }
    } else {
        return Ok(None);
    };
    Ok(Some(KubeOptions {
        namespace: namespace.to_owned(),
        target,
        kubeconfig: kube.kubeconfig.clone(),
    }))
}

/// Running Kubernetes discovery, if configured.
#[derive(Debug, Default)]
pub(crate) struct Kube {
    discovery: Option<Arc<KubernetesDiscovery>>,
    /// The objectives and rewrites naming the pool (`--pool-name`, also in
    /// selector mode).
    resources: Option<PoolResources>,
    /// This replica's candidacy, with `--ha-enable-leader-election`.
    elector: Option<(Arc<LeaderElector>, CancellationToken)>,
}

impl Kube {
    /// Connects, checks RBAC, starts following and waits for the first
    /// complete sync; a missing permission or an unreachable API server is an
    /// error (the process exits non-zero).
    pub(crate) async fn start(
        args: &crate::args::Args,
        config_discovery: bool,
        store: &Arc<EndpointStore>,
        stop: &CancellationToken,
        prom: &mut prometheus_client::registry::Registry,
    ) -> Result<Self> {
        // The config's `dataLayer.discovery` replaces the pool's discovery,
        // as in llm-d, like static endpoints do.
        let static_endpoints =
            !args.endpoints.is_empty() || args.endpoints_file.is_some() || config_discovery;
        let Some(options) = options(
            &args.kube,
            args.pool_name.as_deref(),
            &args.pool_namespace,
            static_endpoints,
        )?
        else {
            if args.kube.ha_enable_leader_election {
                bail!(
                    "--ha-enable-leader-election needs Kubernetes (--pool-name without static endpoints, or --endpoint-selector)"
                );
            }
            return Ok(Self::default());
        };
        // Whose InferenceObjectives and InferenceModelRewrites apply: the
        // pool's; in selector mode, those naming --pool-name (if given).
        let pool = match &options.target {
            KubeTarget::Pool { name, group } => Some((name.clone(), *group)),
            KubeTarget::Selector(_) => match args.pool_name.as_deref() {
                Some(name) if !name.is_empty() => Some((
                    name.to_owned(),
                    PoolGroup::parse(&args.kube.pool_group).context("invalid --pool-group")?,
                )),
                _ => {
                    tracing::info!(
                        "selector mode without --pool-name: no InferenceObjective or InferenceModelRewrite is read from the cluster"
                    );
                    None
                }
            },
        };
        let namespace = options.namespace.clone();
        let discovery = KubernetesDiscovery::connect(options)
            .await
            .context("cannot start Kubernetes discovery")?;
        discovery.start(Arc::clone(store), stop.child_token())?;
        discovery.register_metrics(prom);
        discovery
            .wait_synced(args.kube.kube_sync_timeout)
            .await
            .context("Kubernetes discovery")?;
        tracing::info!(
            source = %discovery.source_name(),
            endpoints = discovery.endpoints().len(),
            ready = discovery.is_ready(),
            "kubernetes discovery running"
        );
        let resources = pool.map(|(name, group)| {
            PoolResources::new(discovery.client().clone(), &namespace, &name, group)
        });
        let elector = if args.kube.ha_enable_leader_election {
            let identity = format!(
                "{}-{}",
                std::env::var("POD_NAME")
                    .or_else(|_| std::env::var("HOSTNAME"))
                    .unwrap_or_else(|_| "epp".into()),
                std::process::id()
            );
            let lease = format!("{}-epp-leader", args.pool_label());
            let elector = LeaderElector::new(
                discovery.client().clone(),
                &namespace,
                &lease,
                &identity,
                LeaseTiming::from_duration(args.kube.ha_lease_duration),
            )
            .await
            .context("cannot take part in leader election")?;
            let elector = Arc::new(elector);
            let token = CancellationToken::new();
            elector.spawn(token.clone());
            tracing::info!(%lease, %identity, "leader election on");
            Some((elector, token))
        } else {
            None
        };
        Ok(Self {
            discovery: Some(Arc::new(discovery)),
            resources,
            elector,
        })
    }

    /// A client of the cluster, when epp runs against one.
    pub(crate) fn client(&self) -> Option<::kube::Client> {
        self.discovery.as_ref().map(|d| d.client().clone())
    }

    /// Releases the lease at once (on SIGTERM) when leading, so another
    /// replica takes over without waiting for it to expire.
    pub(crate) async fn step_down(&self) {
        if let Some((elector, token)) = &self.elector {
            token.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), elector.wait_released()).await;
        }
    }

    /// Adds the pool's InferenceObjective and InferenceModelRewrite resources
    /// to the config's objectives and rules (see [`Directives`]); options
    /// are unchanged without a pool.
    pub(crate) async fn with_cluster_directives(
        &self,
        mut options: ExtProcOptions,
        stop: &CancellationToken,
    ) -> Result<ExtProcOptions> {
        let Some(resources) = &self.resources else {
            return Ok(options);
        };
        let directives = Arc::new(Directives::new(
            options.objectives.clone(),
            options.model_rewrite.clone(),
        ));
        let live = Arc::clone(&directives);
        resources
            .start(Arc::new(move |set| live.apply(set)), stop.child_token())
            .await
            .context(
                "cannot follow the pool's InferenceObjective and InferenceModelRewrite resources",
            )?;
        options.objective_priority = Some(directives.clone() as Arc<dyn ObjectivePriority>);
        options.model_rewrite = Some(directives as Arc<dyn ModelRewrite>);
        Ok(options)
    }

    /// What readiness needs from Kubernetes: always true without it;
    /// otherwise synced, pool present, nothing forbidden, and leading when
    /// leader election is on.
    pub(crate) fn gate(&self) -> crate::health::Gate {
        let elector = self.elector.as_ref().map(|(e, _)| Arc::clone(e));
        match &self.discovery {
            Some(d) => {
                let d = Arc::clone(d);
                Arc::new(move || d.is_ready() && elector.as_ref().is_none_or(|e| e.is_leader()))
            }
            None => Arc::new(|| true),
        }
    }
}

/// Objectives and rewrite rules from the config file and from the pool's
/// resources. The cluster's answer comes first: an InferenceObjective
/// overrides a config objective of the same name, and an
/// InferenceModelRewrite rule matching the model (a catch-all included)
/// wins over the config's rules. Among resources whose rules conflict (the
/// same model twice, two catch-alls), the oldest wins and the others are
/// ignored with a warning.
#[derive(Debug)]
pub(crate) struct Directives {
    config_objectives: HashMap<String, i32>,
    config_rewrite: Option<Arc<dyn ModelRewrite>>,
    cluster: ArcSwap<(HashMap<String, i32>, ModelRewriteRules)>,
}

impl Directives {
    fn new(
        config_objectives: HashMap<String, i32>,
        config_rewrite: Option<Arc<dyn ModelRewrite>>,
    ) -> Self {
        Self {
            config_objectives,
            config_rewrite,
            cluster: ArcSwap::default(),
        }
    }

    /// Replaces the cluster's part.
    fn apply(&self, set: &ClusterResources) {
        let mut objectives = HashMap::with_capacity(set.objectives.len());
        for o in &set.objectives {
            objectives.entry(o.name.clone()).or_insert(o.priority);
        }
        let mut accepted: Vec<ModelRewriteDecl> = Vec::new();
        let mut rules = ModelRewriteRules::default();
        for r in &set.rewrites {
            accepted.push(ModelRewriteDecl {
                name: Some(r.name.clone()),
                rules: r.rules.clone(),
            });
            match ModelRewriteRules::from_decls(&accepted) {
                Ok(built) => rules = built,
                Err(why) => {
                    tracing::warn!(rewrite = %r.name, error = %why, "InferenceModelRewrite ignored: it conflicts with an older one or is invalid");
                    accepted.pop();
                }
            }
        }
        tracing::info!(
            objectives = objectives.len(),
            rewrites = accepted.len(),
            "cluster objectives and rewrites updated"
        );
        self.cluster.store(Arc::new((objectives, rules)));
    }
}

impl ObjectivePriority for Directives {
    fn priority(&self, objective: &str) -> Option<i32> {
        self.cluster
            .load()
            .0
            .get(objective)
            .or_else(|| self.config_objectives.get(objective))
            .copied()
    }
}

impl ModelRewrite for Directives {
    fn rewrite(&self, model: &str, headers: &[(String, String)]) -> Option<String> {
        let cluster = self.cluster.load();
        if let Some(target) = cluster.1.choose(model, &mut rand::rng()) {
            return Some(target.to_owned());
        }
        self.config_rewrite
            .as_ref()
            .and_then(|r| r.rewrite(model, headers))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::Args;

    fn opts(argv: &[&str]) -> Result<Option<KubeOptions>> {
        let a = Args::try_parse_from(argv)?;
        let static_endpoints = !a.endpoints.is_empty() || a.endpoints_file.is_some();
        options(
            &a.kube,
            a.pool_name.as_deref(),
            &a.pool_namespace,
            static_endpoints,
        )
    }

    #[test]
    fn which_discovery_the_flags_choose() {
        assert!(
            opts(&["epp", "--endpoints", "1.2.3.4:1"])
                .unwrap()
                .is_none()
        );
        assert!(
            opts(&["epp", "--endpoints", "1.2.3.4:1", "--pool-name", "p"])
                .unwrap()
                .is_none(),
            "with static endpoints --pool-name only names the pool in metrics"
        );
        let o = opts(&["epp", "--pool-name", "p", "--pool-namespace", "ns"])
            .unwrap()
            .unwrap();
        assert_eq!(o.namespace, "ns");
        assert!(
            matches!(o.target, KubeTarget::Pool { ref name, group: PoolGroup::V1 } if name == "p")
        );
        let o = opts(&[
            "epp",
            "--pool-name",
            "p",
            "--pool-group",
            "inference.networking.x-k8s.io",
        ])
        .unwrap()
        .unwrap();
        assert!(matches!(
            o.target,
            KubeTarget::Pool {
                group: PoolGroup::XV1Alpha2,
                ..
            }
        ));
        let o = opts(&[
            "epp",
            "--endpoint-selector",
            "app in (a,b),!canary",
            "--endpoint-target-ports",
            "8000,8001",
        ])
        .unwrap()
        .unwrap();
        let KubeTarget::Selector(spec) = o.target else {
            panic!("selector mode")
        };
        assert_eq!(spec.ports, vec![8000, 8001]);
        assert_eq!(spec.selector.as_str(), "app in (a,b),!canary");
    }

    #[test]
    fn bad_kubernetes_flags_are_errors() {
        for (argv, needle) in [
            (
                vec!["epp", "--pool-name", "p", "--pool-group", "x.io"],
                "--pool-group",
            ),
            (
                vec![
                    "epp",
                    "--endpoint-selector",
                    "a in (",
                    "--endpoint-target-ports",
                    "1",
                ],
                "--endpoint-selector",
            ),
            (
                vec![
                    "epp",
                    "--endpoint-selector",
                    "a",
                    "--endpoint-target-ports",
                    "0",
                ],
                "--endpoint-target-ports",
            ),
            (
                vec![
                    "epp",
                    "--endpoint-selector",
                    "a",
                    "--endpoint-target-ports",
                    "1,2,3,4,5,6,7,8,9",
                ],
                "9 target ports",
            ),
            (
                vec!["epp", "--endpoint-selector", "a"],
                "--endpoint-target-ports",
            ),
            (
                vec![
                    "epp",
                    "--endpoint-selector",
                    "a",
                    "--endpoint-target-ports",
                    "1",
                    "--endpoints",
                    "1.2.3.4:5",
                ],
                "cannot be used with",
            ),
        ] {
            let e = format!("{:#}", opts(&argv).unwrap_err());
            assert!(e.contains(needle), "{argv:?}: {e}");
        }
    }
}
