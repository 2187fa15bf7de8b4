//! Our Helm chart (`deploy/charts/epp`), rendered by the real helm (built
//! from its Go module by `scripts/helm.sh`), installed into the test
//! cluster, and its epp run as the Deployment would run it.
//!
//! There is no kubelet: the test does what it would do. It runs the epp
//! binary with exactly the rendered container's arguments and environment
//! (field references resolved as the kubelet resolves them), the rendered
//! ConfigMap's files where the Deployment mounts them (the one path in the
//! arguments that points into the mount is moved to the test's directory),
//! and the rendered ServiceAccount's token, issued by the API server, where
//! in-cluster config would find it (`KUBECONFIG`, as no token is mounted).

use std::{
    collections::BTreeSet,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use epp_test_support::{
    helm, http,
    kube::{KubeCluster, Ns},
    process::{
        Epp, free_port_on, scratch_dir, sim_admin, spawn_epp, start_envoy_tls, start_pod_sim,
        workspace_bin, workspace_root,
    },
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;
use tonic_health::pb::health_check_response::ServingStatus;

use super::kubernetes::{health_of, of_kind, served, yaml_documents};
use super::metrics_auth::get as metrics_get;

/// The reference chart's own values file (v1.5.0), beside the checkout.
fn reference_values() -> std::path::PathBuf {
    let path =
        workspace_root().join("../shared/reference/gie-chart/inferencepool-v1.5.0-values.yaml");
    assert!(path.is_file(), "missing {}", path.display());
    path
}

/// A port free on every address (epp binds 0.0.0.0 unless told otherwise,
/// and the chart does not tell it).
fn free_port() -> u16 {
    free_port_on("0.0.0.0")
}

/// Renders the chart as release `release` in `namespace` with the reference
/// values file, then `values` over it.
fn render(dir: &Path, release: &str, namespace: &str, values: &Value) -> Vec<Yaml> {
    let ours = helm::values_file(dir, "values.json", values);
    let text = helm::template(
        &helm::chart_dir("epp"),
        release,
        namespace,
        &[&reference_values(), &ours],
    );
    std::fs::write(dir.join("rendered.yaml"), &text).unwrap();
    yaml_documents(&text)
}

fn strings(v: &Yaml) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|a| a.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// The container's environment as the kubelet would set it.
fn resolved_env(container: &Yaml, namespace: &str, pod: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in container["env"].as_sequence().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => namespace.to_owned(),
                Some("metadata.name") => pod.to_owned(),
                _ => panic!(
                    "env {name}: the test resolves only metadata.namespace and metadata.name: {e:?}"
                ),
            }
        };
        assert!(
            !value.contains("$("),
            "env {name}={value}: the test does not expand $(VAR) references"
        );
        out.push((name, value));
    }
    out
}

fn kinds(docs: &[Yaml]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A release of the chart applied to the test cluster, and how its epp
/// container runs.
struct Installed {
    ns: Ns,
    dir: std::path::PathBuf,
    docs: Vec<Yaml>,
    /// The rendered arguments, the mounted config path moved to `dir`.
    args: Vec<String>,
    /// The ServiceAccount's name, its token and a kubeconfig holding it.
    sa: String,
    token: String,
    kubeconfig: std::path::PathBuf,
}

impl Installed {
    /// Renders release `release` with the reference's values file and
    /// `values` over it, into a new namespace; applies every object.
    async fn new(cluster: &KubeCluster, release: &str, values: &Value) -> Self {
        let ns = Ns::create(cluster, "helm").await;
        let dir = scratch_dir("helm-chart");
        let docs = render(&dir, release, &ns.name, values);
        // Every object, the Deployment included (nothing runs it, but the API
        // server validates it).
        for doc in &docs {
            ns.apply_manifest(&serde_json::to_value(doc).unwrap()).await;
        }
        let deployment = of_kind(&docs, "Deployment");
        let pod_spec = &deployment["spec"]["template"]["spec"];
        let container = &pod_spec["containers"][0];
        assert_eq!(container["name"].as_str(), Some("epp"));

        // The ConfigMap's files where the Deployment mounts them.
        let mount = container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"].as_str() == Some("plugins-config"))
            .expect("the config is mounted");
        let mount_path = mount["mountPath"].as_str().unwrap();
        let volume = pod_spec["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let config_map = of_kind(&docs, "ConfigMap");
        assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
        let config_dir = dir.join("config");
        std::fs::create_dir_all(&config_dir).unwrap();
        for (file, text) in config_map["data"].as_mapping().unwrap() {
            std::fs::write(
                config_dir.join(file.as_str().unwrap()),
                text.as_str().unwrap(),
            )
            .unwrap();
        }
        let mut moved = 0;
        let args: Vec<String> = strings(&container["args"])
            .into_iter()
            .map(|a| match a.split_once('=') {
                Some((flag, path)) if path.starts_with(&format!("{mount_path}/")) => {
                    moved += 1;
                    format!(
                        "{flag}={}{}",
                        config_dir.display(),
                        &path[mount_path.len()..]
                    )
                }
                _ => a,
            })
            .collect();
        assert_eq!(moved, 1, "one argument names the mounted config: {args:?}");

        // The rendered ServiceAccount's token, issued by the API server.
        let sa = pod_spec["serviceAccountName"].as_str().unwrap().to_owned();
        assert!(
            docs.iter()
                .any(|d| d["kind"].as_str() == Some("ServiceAccount")
                    && d["metadata"]["name"].as_str() == Some(sa.as_str())),
            "the chart renders the pod's ServiceAccount {sa}"
        );
        let token = ns.token_of_service_account(&sa).await;
        let kubeconfig = cluster.kubeconfig_with_token(&dir, &sa, &token);
        Self {
            ns,
            dir,
            docs,
            args,
            sa,
            token,
            kubeconfig,
        }
    }

    fn container(&self) -> &Yaml {
        &of_kind(&self.docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    }

    /// epp as the pod `<deployment>-0` would run it: the rendered arguments
    /// and environment only, and the ServiceAccount's token.
    fn run_epp(&self) -> Epp {
        let deployment = of_kind(&self.docs, "Deployment");
        let pod_name = format!("{}-0", deployment["metadata"]["name"].as_str().unwrap());
        let mut cmd = Command::new(workspace_bin("epp"));
        cmd.args(&self.args)
            .env_clear()
            .envs(resolved_env(self.container(), &self.ns.name, &pod_name))
            .env("KUBECONFIG", &self.kubeconfig);
        let (epp, line) = spawn_epp("epp", cmd, self.dir.join("epp.log"));
        eprintln!("epp {:?}\n{line}", self.args);
        epp
    }
}

/// The test's values over the reference's: an image never pulled, free ports.
fn test_values(pool_labels: Value, model_port: u16) -> Value {
    json!({
        "inferenceExtension": {
            // Never pulled: no kubelet runs the Deployment.
            "image": {"registry": "", "repository": "epp-under-test", "tag": "test"},
            "extProcPort": free_port(),
            "healthPort": free_port(),
            "metricsPort": free_port(),
        },
        "inferencePool": {
            "modelServers": {"matchLabels": pool_labels},
            "targetPorts": [{"number": model_port}],
        },
    })
}

/// Polls gRPC health `service` until SERVING, at most 15 s.
async fn until_serving(port: u16, service: &str, what: &str) {
    let start = Instant::now();
    loop {
        let status = health_of(port, service).await;
        if status == Some(ServingStatus::Serving) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what} ({service}): {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The chart with the reference's values file, a pool selector pointing at
/// the test's pods and free ports: every rendered object applied to the
/// cluster; epp run under the rendered ServiceAccount's token with the
/// rendered arguments, environment and config; traffic through Envoy reaches
/// exactly the Ready pods the pool selects; the chart's InferenceObjective
/// takes effect; the probes' services answer SERVING; the metrics port lets
/// the chart's metrics reader in and no one else; epp's token cannot read
/// Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_epp_routes_through_envoy() {
    let cluster = KubeCluster::shared();
    let model_port = free_port_on("127.0.0.1");
    let mut values = test_values(json!({"app": "chart-model"}), model_port);
    values["inferenceObjectives"] = json!([{"name": "batch", "priority": -1}]);
    values["inferenceExtension"]["monitoring"] = json!({"prometheus": {"enabled": true}});
    let release = Installed::new(cluster, "chat", &values).await;
    let (ns, dir, docs) = (&release.ns, &release.dir, &release.docs);
    assert_eq!(
        kinds(docs),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "InferenceObjective",
            "InferencePool",
            "Role",
            "RoleBinding",
            "Secret",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
        ]
        .map(String::from)
        .into(),
        "the objects of an install with monitoring"
    );

    // Model servers: a Ready pod the pool selects (on 127.0.0.1, so the test
    // can reach its admin endpoint), a NotReady one it selects, and a Ready
    // one it does not select. Only the first may ever serve.
    let _sims: Vec<_> = [
        ("chart-model-0", "127.0.0.1"),
        ("chart-model-1", "127.0.0.9"),
        ("other-0", "127.0.0.10"),
    ]
    .iter()
    .map(|(pod, ip)| start_pod_sim(dir, pod, ip, model_port, &[]))
    .collect();
    ns.pod(
        "chart-model-0",
        &[("app", "chart-model")],
        "127.0.0.1",
        true,
    )
    .await;
    ns.pod(
        "chart-model-1",
        &[("app", "chart-model")],
        "127.0.0.9",
        false,
    )
    .await;
    ns.pod("other-0", &[("app", "other")], "127.0.0.10", true)
        .await;

    let epp = release.run_epp();
    let container = release.container();
    let sa = release.sa.as_str();

    // It listens where the Deployment, Service and pool say.
    let container_port = |name: &str| {
        container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {name}"))
    };
    assert_eq!(container_port("grpc"), u64::from(epp.grpc_port));
    assert_eq!(container_port("metrics"), u64::from(epp.metrics_port));
    let service = of_kind(docs, "Service");
    for port in service["spec"]["ports"].as_sequence().unwrap() {
        let target = port["targetPort"].as_str().unwrap();
        assert_eq!(
            port["port"].as_u64(),
            Some(container_port(target)),
            "{port:?}"
        );
    }
    let pool = of_kind(docs, "InferencePool");
    let picker = &pool["spec"]["endpointPickerRef"];
    assert_eq!(picker["name"], service["metadata"]["name"]);
    assert_eq!(
        picker["port"]["number"].as_u64(),
        Some(u64::from(epp.grpc_port))
    );

    // The probes: on the health port, services epp answers SERVING.
    for probe in ["livenessProbe", "readinessProbe"] {
        let grpc = &container[probe]["grpc"];
        assert_eq!(
            grpc["port"].as_u64(),
            Some(u64::from(epp.health_port)),
            "{probe}"
        );
        until_serving(epp.health_port, grpc["service"].as_str().unwrap(), probe).await;
    }

    // Envoy (TLS to epp: the chart keeps --secure-serving on) reaches only
    // the pods the pool selects.
    let envoy = start_envoy_tls(dir, epp.grpc_port);
    let counts = served(envoy.port, 16).await;
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["chart-model-0"],
        "{counts:?}"
    );

    // The chart's InferenceObjective reaches epp through the ServiceAccount's
    // rights: `batch` (priority -1) is shed once the pool is saturated, an
    // undeclared objective is not.
    let send = |objective: &'static str| async move {
        http::chat_for_objective(envoy.port, "meta-llama/Llama-3.1-8B-Instruct", objective)
            .await
            .unwrap()
            .status
    };
    assert_eq!(send("batch").await, 200, "not saturated: served");
    sim_admin(model_port, json!({"extra_waiting": 40})).await;
    let start = Instant::now();
    while send("batch").await != 429 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "batch never shed: the InferenceObjective did not reach epp"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        send("live").await,
        200,
        "undeclared objectives are not shed"
    );

    // The metrics port under --metrics-endpoint-auth (on: the chart leaves
    // the default): epp reviews tokens with the rights the chart gave it; the
    // metrics reader the ServiceMonitor's Secret names may read, epp's own
    // token may not, no token is 401. The Secret's token would come from the
    // token controller, which this cluster lacks: TokenRequest stands in.
    let secret = of_kind(docs, "Secret");
    let reader = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        .as_str()
        .unwrap();
    assert_ne!(reader, sa, "Prometheus gets a token of its own");
    let reader_token = ns.token_of_service_account(reader).await;
    let r = metrics_get(epp.metrics_port, "/metrics", Some(&reader_token)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("inference_pool_ready_pods"),
        "{}",
        r.text()
    );
    let r = metrics_get(epp.metrics_port, "/metrics", Some(&release.token)).await;
    assert_eq!(r.status, 403, "epp's own token: {}", r.text());
    let r = metrics_get(epp.metrics_port, "/metrics", None).await;
    assert_eq!(r.status, 401, "{}", r.text());

    // The same token is refused what epp does not need.
    let as_epp = cluster.client_with_token(dir, sa, &release.token).await;
    for (scope, secrets) in [
        (
            "namespace",
            Api::<Secret>::namespaced(as_epp.clone(), &ns.name),
        ),
        ("cluster", Api::<Secret>::all(as_epp.clone())),
    ] {
        match secrets.list(&Default::default()).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{scope}: {s:?}"),
            other => panic!("listing Secrets ({scope}) as {sa}: {other:?}"),
        }
    }
}

/// With two replicas the chart turns on leader election: its epp, under the
/// rendered ServiceAccount's rights (leases included), takes the Lease and
/// reports ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_ha_install_leads_under_its_rbac() {
    let cluster = KubeCluster::shared();
    let mut values = test_values(json!({"app": "ha-model"}), free_port());
    values["inferenceExtension"]["replicas"] = json!(2);
    let release = Installed::new(cluster, "ha", &values).await;
    assert!(
        release
            .args
            .contains(&"--ha-enable-leader-election".to_owned()),
        "{:?}",
        release.args
    );
    let epp = release.run_epp();
    until_serving(epp.health_port, "readiness", "the only replica leads").await;
    let leases = release
        .ns
        .custom("coordination.k8s.io", "v1", "Lease", "leases");
    let lease = leases
        .get("ha-epp-leader")
        .await
        .expect("the leader's Lease");
    let holder = lease.data["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default();
    assert!(
        holder.starts_with("ha-epp-0-"),
        "held by POD_NAME-pid: {holder}"
    );
}

fn args_of(docs: &[Yaml]) -> Vec<String> {
    strings(&of_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])
}

fn rules_of(docs: &[Yaml], kind: &str) -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    of_kind(docs, kind)["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            (
                strings(&r["apiGroups"]),
                strings(&r["resources"]),
                strings(&r["verbs"]),
            )
        })
        .collect()
}

fn render_in(dir: &Path, name: &str, values: &Value) -> Result<Vec<Yaml>, String> {
    let file = helm::values_file(dir, &format!("{name}.json"), values);
    let chart = helm::chart_dir("epp");
    let (ok, stdout, stderr) = helm::run(&[
        "template",
        "pool",
        chart.to_str().unwrap(),
        "--namespace",
        "prod",
        "-f",
        reference_values().to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
    ]);
    if ok {
        Ok(yaml_documents(&stdout))
    } else {
        Err(stderr)
    }
}

/// What the values select, rendered by helm without a cluster: the
/// reference's values honoured, RBAC following HA and metrics auth, flags
/// replacing computed ones, values epp cannot honour refused with the reason,
/// `helm lint --strict` clean, and every generated config loadable by epp.
#[test]
fn the_charts_values_select_what_is_rendered() {
    let dir = scratch_dir("helm-values");
    let selector = json!({"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}});
    let with = |extra: Value| {
        let mut v = selector.clone();
        merge(&mut v, extra);
        v
    };

    // The reference's values file, only the required selector added.
    let docs = render_in(&dir, "reference", &selector).unwrap();
    let deployment = of_kind(&docs, "Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"].as_str(),
        Some("registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0")
    );
    assert_eq!(container["imagePullPolicy"].as_str(), Some("Always"));
    assert_eq!(
        container["resources"]["requests"]["cpu"].as_str(),
        Some("4")
    );
    let args = args_of(&docs);
    for want in [
        "--pool-name=pool",
        "--pool-namespace=prod",
        "--pool-group=inference.networking.k8s.io",
        "--config-file=/config/default-plugins.yaml",
        "--v=1",
        "--tracing=false",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.contains("metrics-endpoint-auth")),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a.contains("leader")), "{args:?}");
    assert_eq!(
        deployment["spec"]["strategy"]["type"].as_str(),
        Some("RollingUpdate")
    );
    let pool = of_kind(&docs, "InferencePool");
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["failureMode"].as_str(),
        Some("FailOpen")
    );
    assert_eq!(
        pool["spec"]["targetPorts"][0]["number"].as_u64(),
        Some(8000)
    );
    let role = rules_of(&docs, "Role");
    assert!(
        !role
            .iter()
            .any(|(_, r, _)| r.contains(&"leases".to_owned())),
        "{role:?}"
    );
    let auth = rules_of(&docs, "ClusterRole");
    assert_eq!(
        auth,
        [
            (
                vec!["authentication.k8s.io".into()],
                vec!["tokenreviews".into()],
                vec!["create".into()]
            ),
            (
                vec!["authorization.k8s.io".into()],
                vec!["subjectaccessreviews".into()],
                vec!["create".into()]
            ),
        ]
    );
    assert!(!kinds(&docs).contains("ServiceMonitor"));

    // HA: leader election, lease rights, replaced rather than rolled.
    let docs = render_in(
        &dir,
        "ha",
        &with(json!({"inferenceExtension": {"replicas": 2}})),
    )
    .unwrap();
    assert!(args_of(&docs).contains(&"--ha-enable-leader-election".to_owned()));
    assert!(rules_of(&docs, "Role").contains(&(
        vec!["coordination.k8s.io".into()],
        vec!["leases".into()],
        vec!["get".into(), "create".into(), "update".into()]
    )));
    assert_eq!(
        of_kind(&docs, "Deployment")["spec"]["strategy"]["type"].as_str(),
        Some("Recreate")
    );

    // Peer sync: every replica serves (no leader election, rolled), a
    // headless Service names them all, ready or not, and the generated
    // config shares state with them; it loads in epp.
    let docs = render_in(
        &dir,
        "peers",
        &with(json!({"inferenceExtension": {"replicas": 3, "peerSync": {"enabled": true}}})),
    )
    .unwrap();
    assert!(
        !args_of(&docs).iter().any(|a| a.contains("leader")),
        "{:?}",
        args_of(&docs)
    );
    let deployment = of_kind(&docs, "Deployment");
    assert_eq!(
        deployment["spec"]["strategy"]["type"].as_str(),
        Some("RollingUpdate")
    );
    let ports = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"];
    assert!(
        ports
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p["name"].as_str() == Some("peer-sync")
                && p["protocol"].as_str() == Some("UDP")
                && p["containerPort"].as_u64() == Some(9005)),
        "{ports:?}"
    );
    let peers = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("Service") && d["spec"]["clusterIP"].as_str() == Some("None")
        })
        .expect("a headless Service");
    assert_eq!(peers["metadata"]["name"].as_str(), Some("pool-epp-peers"));
    assert_eq!(
        peers["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true)
    );
    assert_eq!(peers["spec"]["ports"][0]["protocol"].as_str(), Some("UDP"));
    assert_eq!(
        peers["spec"]["ports"][0]["targetPort"].as_str(),
        Some("peer-sync")
    );
    let text = of_kind(&docs, "ConfigMap")["data"]["default-plugins.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    for want in [
        "type: udp-peer-syncer",
        "address: \"0.0.0.0:9005\"",
        "\"pool-epp-peers.prod.svc:9005\"",
        "crossReplicaSyncerPluginRef: udp-peer-syncer",
        "crossReplicaSyncInterval: \"200ms\"",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
    check_config(&dir, "peers", &text);
    // Asked for, leader election still comes with peer sync.
    let docs = render_in(
        &dir,
        "peers-ha",
        &with(json!({"inferenceExtension": {"replicas": 2, "enableLeaderElection": true, "peerSync": {"enabled": true}}})),
    )
    .unwrap();
    assert!(args_of(&docs).contains(&"--ha-enable-leader-election".to_owned()));

    // Metrics auth off: no review rights, and epp is told.
    let docs = render_in(
        &dir,
        "noauth",
        &with(json!({"inferenceExtension": {"monitoring": {"prometheus": {"auth": {"enabled": false}}}}})),
    )
    .unwrap();
    assert!(args_of(&docs).contains(&"--metrics-endpoint-auth=false".to_owned()));
    assert!(!kinds(&docs).contains("ClusterRole"), "{:?}", kinds(&docs));

    // Monitoring: a ServiceMonitor scraping with a reader's token.
    let docs = render_in(
        &dir,
        "monitoring",
        &with(json!({"inferenceExtension": {"monitoring": {"prometheus": {"enabled": true, "extraLabels": {"release": "prom"}}}}})),
    )
    .unwrap();
    let monitor = of_kind(&docs, "ServiceMonitor");
    assert_eq!(
        monitor["metadata"]["labels"]["release"].as_str(),
        Some("prom")
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"].as_str(), Some("http-metrics"));
    assert_eq!(endpoint["interval"].as_str(), Some("10s"));
    let secret = of_kind(&docs, "Secret");
    assert_eq!(
        endpoint["authorization"]["credentials"]["name"],
        secret["metadata"]["name"]
    );
    assert_eq!(
        secret["metadata"]["name"].as_str(),
        Some("inference-gateway-sa-metrics-reader-secret")
    );
    let readers: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some("ClusterRole"))
        .filter(|d| d["rules"][0]["nonResourceURLs"][0].as_str() == Some("/metrics"))
        .collect();
    assert_eq!(readers.len(), 1, "one /metrics reader role");

    // Metrics over TLS: the ServiceMonitor scrapes https.
    let docs = render_in(
        &dir,
        "metrics-tls",
        &with(json!({"inferenceExtension": {
            "monitoring": {"prometheus": {"enabled": true}},
            "flags": {"metrics-cert-dir": "/certs"},
        }})),
    )
    .unwrap();
    let endpoint = &of_kind(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"].as_str(), Some("https"));
    assert!(args_of(&docs).contains(&"--metrics-cert-dir=/certs".to_owned()));

    // Flags replace what the chart computes; a map of env works as a list.
    let docs = render_in(
        &dir,
        "flags",
        &with(json!({"inferenceExtension": {
            "flags": {"v": 3, "grpc-port": 9100, "secure-serving": false, "enable-pprof": true},
            "env": {"RUST_BACKTRACE": "1"},
        }})),
    )
    .unwrap();
    let args = args_of(&docs);
    let count = |prefix: &str| args.iter().filter(|a| a.starts_with(prefix)).count();
    assert_eq!((count("--v="), count("--grpc-port=")), (1, 1), "{args:?}");
    for want in [
        "--v=3",
        "--grpc-port=9100",
        "--secure-serving=false",
        "--enable-pprof",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    let env = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_sequence()
            .unwrap()
            .iter()
            .any(|e| e["name"].as_str() == Some("RUST_BACKTRACE")
                && e["value"].as_str() == Some("1")),
        "{env:?}"
    );

    // Tracing: the reference chart's flag and environment, name for name.
    let docs = render_in(
        &dir,
        "tracing",
        &with(json!({"inferenceExtension": {"tracing": {
            "enabled": true,
            "otelExporterEndpoint": "http://collector:4317",
            "sampling": {"sampler": "parentbased_traceidratio", "samplerArg": "0.25"},
        }}})),
    )
    .unwrap();
    assert!(args_of(&docs).contains(&"--tracing".to_owned()));
    let env = &of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"];
    let names: Vec<&str> = env
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("OTEL_"))
        .collect();
    assert_eq!(
        names,
        [
            "OTEL_SERVICE_NAME",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_TRACES_EXPORTER",
            "OTEL_RESOURCE_ATTRIBUTES_NODE_NAME",
            "OTEL_RESOURCE_ATTRIBUTES_POD_NAME",
            "OTEL_RESOURCE_ATTRIBUTES",
            "OTEL_TRACES_SAMPLER",
            "OTEL_TRACES_SAMPLER_ARG",
        ]
    );
    let value = |name: &str| {
        env.as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(
        value("OTEL_SERVICE_NAME").as_deref(),
        Some("gateway-api-inference-extension/epp")
    );
    assert_eq!(
        value("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://collector:4317")
    );
    assert_eq!(value("OTEL_TRACES_SAMPLER_ARG").as_deref(), Some("0.25"));

    // Istio: a DestinationRule originating TLS to the picker's Service.
    let docs = render_in(&dir, "istio", &with(json!({"provider": {"name": "istio"}}))).unwrap();
    let rule = &of_kind(&docs, "DestinationRule")["spec"];
    assert_eq!(
        rule["host"].as_str(),
        Some("pool-epp.prod.svc.cluster.local")
    );
    assert_eq!(
        rule["trafficPolicy"]["tls"]["mode"].as_str(),
        Some("SIMPLE")
    );

    // Values epp cannot honour fail with the reason.
    for (name, values, reason) in [
        ("noselector", json!({}), "matchLabels is required"),
        (
            "predictor",
            with(json!({"inferenceExtension": {"latencyPredictor": {"enabled": true}}})),
            "needs no predictor sidecars",
        ),
        (
            "grpc",
            with(json!({"inferencePool": {"modelServerProtocol": "grpc"}})),
            "parses HTTP",
        ),
        (
            "gke",
            with(json!({"provider": {"name": "gke"}})),
            "provider.name \"gke\"",
        ),
        (
            "nofile",
            with(json!({"inferenceExtension": {"pluginsConfigFile": "missing.yaml"}})),
            "missing.yaml",
        ),
    ] {
        let err = render_in(&dir, name, &values).expect_err(name);
        assert!(err.contains(reason), "{name}: {err}");
    }

    // helm lint --strict, with the reference's values.
    let file = helm::values_file(&dir, "lint.json", &selector);
    let chart = helm::chart_dir("epp");
    let (ok, out, err) = helm::run(&[
        "lint",
        "--strict",
        chart.to_str().unwrap(),
        "-f",
        reference_values().to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(ok, "helm lint:\n{out}\n{err}");

    // Every generated default config, and a custom one, loads in epp.
    for (engine, parser) in [
        ("vllm", ""),
        ("sglang", "openai-parser"),
        ("triton-tensorrt-llm", ""),
        ("trtllm-serve", ""),
    ] {
        let docs = render_in(
            &dir,
            engine,
            &with(json!({"inferencePool": {"modelServerType": engine, "parser": parser}})),
        )
        .unwrap();
        let text = of_kind(&docs, "ConfigMap")["data"]["default-plugins.yaml"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            text.contains(&format!("defaultEngine: \"{engine}\"")),
            "{text}"
        );
        check_config(&dir, engine, &text);
    }
    let custom = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n";
    let docs = render_in(
        &dir,
        "custom",
        &with(json!({"inferenceExtension": {
            "pluginsConfigFile": "custom.yaml",
            "pluginsCustomConfig": {"custom.yaml": custom},
        }})),
    )
    .unwrap();
    assert!(args_of(&docs).contains(&"--config-file=/config/custom.yaml".to_owned()));
    let data = &of_kind(&docs, "ConfigMap")["data"];
    assert_eq!(data["custom.yaml"].as_str(), Some(custom));
    assert!(data["default-plugins.yaml"].is_string());
}

/// `epp --check-config` on `text`.
fn check_config(dir: &Path, name: &str, text: &str) {
    let path = dir.join(format!("{name}-config.yaml"));
    std::fs::write(&path, text).unwrap();
    let out = Command::new(workspace_bin("epp"))
        .args(["--check-config", "--config-file", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Merges `extra` into `base`, objects key by key.
fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}
