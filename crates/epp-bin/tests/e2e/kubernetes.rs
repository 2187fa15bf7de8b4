//! The whole path on Kubernetes: a real kube-apiserver says which pods are
//! Ready; simulators listen on those pods' IPs (127.0.0.2, 127.0.0.3, ...);
//! epp follows the InferencePool and Envoy routes through it.

use std::{
    collections::BTreeMap,
    process::Command,
    time::{Duration, Instant},
};

use epp_test_support::{
    http,
    kube::{KubeCluster, Ns},
    process::{
        BodyMode, Sim, epp_command, free_port_on, scratch_dir, spawn_epp, start_envoy,
        start_envoy_tls, start_pod_sim, workspace_root,
    },
};

/// A port free on every loopback address the simulators use.
fn shared_port() -> u16 {
    free_port_on("127.0.0.2")
}

/// epp following the InferencePool `pool` of `ns` as `kubeconfig`'s user,
/// serving ext_proc in plaintext, logging at info.
fn pool_epp(ns: &Ns, kubeconfig: &std::path::Path) -> Command {
    let mut cmd = epp_command();
    cmd.args([
        "--secure-serving=false",
        "--pool-name",
        "pool",
        "--pool-namespace",
        &ns.name,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ])
    .env("RUST_LOG", "info");
    cmd
}

/// `/metrics` read with the admin's token: against a cluster the metrics
/// port reviews tokens (tests/e2e/metrics_auth.rs).
async fn admin_metrics(cluster: &KubeCluster, port: u16) -> String {
    let auth = format!("Bearer {}", cluster.admin_token());
    let r = http::send(port, "GET", "/metrics", &[("authorization", &auth)], "")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

fn chat(i: usize) -> serde_json::Value {
    serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": format!("question number {i}")}],
        "max_tokens": 2,
    })
}

/// Sends `n` requests; returns how many each pod served. Every one must succeed.
pub(super) async fn served(envoy_port: u16, n: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for i in 0..n {
        let r = http::post_json(envoy_port, "/v1/chat/completions", &chat(i))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "request {i} failed: {}", r.text());
        let pod = r.header("x-inference-pod").expect("simulator names itself");
        *counts.entry(pod.to_owned()).or_insert(0) += 1;
    }
    counts
}

/// Sends requests until `cond` holds on the pod that served one; returns
/// how long that took.
async fn until_served(envoy_port: u16, what: &str, cond: impl Fn(&str) -> bool) -> Duration {
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(10) {
        let r = http::post_json(envoy_port, "/v1/chat/completions", &chat(i))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "request {i} failed: {}", r.text());
        if cond(r.header("x-inference-pod").unwrap_or_default()) {
            return start.elapsed();
        }
        i += 1;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_to_the_ready_pods_of_the_pool() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "e2e").await;
    let dir = scratch_dir("kube-e2e");
    let port = shared_port();
    let _sims: Vec<Sim> = [
        ("pod-a", "127.0.0.2"),
        ("pod-b", "127.0.0.3"),
        ("pod-c", "127.0.0.4"),
    ]
    .iter()
    .map(|(pod, ip)| start_pod_sim(&dir, pod, ip, port, &[]))
    .collect();
    ns.apply_pool("pool", &[("app", "model")], &[port]).await;
    ns.pod("pod-a", &[("app", "model")], "127.0.0.2", true)
        .await;
    ns.pod("pod-b", &[("app", "model")], "127.0.0.3", true)
        .await;
    ns.pod("pod-c", &[("app", "model")], "127.0.0.4", false)
        .await;

    let mut cmd = epp_command();
    cmd.args([
        "--secure-serving=false",
        "--pool-name",
        "pool",
        "--kubeconfig",
        cluster.kubeconfig.to_str().unwrap(),
    ])
    .env("NAMESPACE", &ns.name)
    .env("RUST_LOG", "info");
    let (epp, _) = spawn_epp("epp", cmd, dir.join("epp.log"));
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let counts = served(envoy.port, 20).await;
    assert!(
        !counts.contains_key("pod-c"),
        "a NotReady pod got traffic: {counts:?}"
    );
    assert!(
        counts.contains_key("pod-a") && counts.contains_key("pod-b"),
        "{counts:?}"
    );
    let metrics = admin_metrics(cluster, epp.metrics_port).await;
    assert!(
        metrics.contains("epp_kubernetes_discovery_ready 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("inference_pool_ready_pods{name=\"pool\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("model_server_pod=\"pod-a\""),
        "per-pod metrics name the pod: {metrics}"
    );

    // Ready -> first request routed to it.
    ns.set_ready("pod-c", true).await;
    let took = until_served(envoy.port, "pod-c picked once Ready", |p| p == "pod-c").await;
    eprintln!("pod Ready -> first request routed to it: {took:?}");

    // NotReady, deleted: no longer picked.
    ns.set_ready("pod-a", false).await;
    ns.delete_pod("pod-b").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counts = served(envoy.port, 20).await;
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["pod-c"], "{counts:?}");

    // The pool deleted: nothing to route to, and the answer says so.
    ns.delete_pool("pool").await;
    let start = Instant::now();
    loop {
        let r = http::post_json(envoy.port, "/v1/chat/completions", &chat(0))
            .await
            .unwrap();
        if r.status == 503 {
            let want = format!("InferencePool {}/pool was deleted", ns.name);
            assert!(r.text().contains(&want), "{}", r.text());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still routing after the pool was deleted"
        );
    }
    let metrics = admin_metrics(cluster, epp.metrics_port).await;
    assert!(
        metrics.contains("epp_kubernetes_discovery_ready 0"),
        "{metrics}"
    );

    // Re-created: its pods are routed to again.
    ns.apply_pool("pool", &[("app", "model")], &[port]).await;
    let start = Instant::now();
    loop {
        let r = http::post_json(envoy.port, "/v1/chat/completions", &chat(0))
            .await
            .unwrap();
        if r.status == 200 {
            assert_eq!(r.header("x-inference-pod"), Some("pod-c"));
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the re-created pool is not followed: {}",
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = admin_metrics(cluster, epp.metrics_port).await;
    assert!(
        metrics.contains("epp_kubernetes_discovery_ready 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn missing_rbac_stops_epp_at_start_with_the_permission_named() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "e2e-rbac").await;
    ns.apply_pool("pool", &[("app", "model")], &[8000]).await;
    let mut cmd = pool_epp(&ns, &cluster.kubeconfig_for("restricted"));
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "epp must not run without RBAC");
    assert!(
        stderr.contains("forbidden to list, watch pods") && stderr.contains(&ns.name),
        "{stderr}"
    );
}

/// InferenceModelRewrite and InferenceObjective resources of the pool (from
/// both API groups) take effect while epp runs; those of another pool do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_and_objectives_from_the_cluster_take_effect() {
    resources_take_effect(false).await;
}

/// The same in selector mode: no InferencePool object, and the resources
/// naming `--pool-name` apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_mode_reads_the_resources_naming_its_pool_name() {
    resources_take_effect(true).await;
}

async fn resources_take_effect(selector_mode: bool) {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "e2e-res").await;
    let dir = scratch_dir("kube-resources");
    // The pod's IP is 127.0.0.1 so the test can read what the simulator received.
    let port = free_port_on("127.0.0.1");
    let _sim = start_pod_sim(
        &dir,
        "pod-r",
        "127.0.0.1",
        port,
        &[
            "--record-requests",
            "100",
            "--served-model-name",
            "chat,chat-v2",
        ],
    );
    if !selector_mode {
        ns.apply_pool("pool", &[("app", "model")], &[port]).await;
    }
    ns.pod("pod-r", &[("app", "model")], "127.0.0.1", true)
        .await;

    let mut cmd = pool_epp(&ns, &cluster.kubeconfig);
    cmd.args([
        "--config-text",
        "objectives:\n- {name: batch, priority: 5}\n",
    ]);
    if selector_mode {
        cmd.args([
            "--endpoint-selector",
            "app=model",
            "--endpoint-target-ports",
        ])
        .arg(port.to_string());
    }
    let (epp, _) = spawn_epp("epp", cmd, dir.join("epp.log"));
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);

    let send = |model: &'static str, objective: &'static str| async move {
        http::chat_for_objective(envoy.port, model, objective)
            .await
            .unwrap()
    };
    let last_model = || {
        epp_test_support::process::sim_requests(port)
            .pop()
            .map(|r| {
                serde_json::from_str::<serde_json::Value>(r["body"].as_str().unwrap_or("{}"))
                    .unwrap_or_default()["model"]
                    .clone()
            })
            .unwrap_or_default()
    };
    poll_status(&send, "chat", "batch", 200).await;
    assert_eq!(last_model(), "chat");

    // A rewrite for another pool is ignored; one for ours applies.
    let rewrite = |pool: &str, target: &str| {
        serde_json::json!({"poolRef": {"name": pool}, "rules": [
            {"matches": [{"model": {"type": "Exact", "value": "chat"}}],
             "targets": [{"modelRewrite": target, "weight": 1}]}]})
    };
    let llm_d = ns.custom(
        "llm-d.ai",
        "v1alpha2",
        "InferenceModelRewrite",
        "inferencemodelrewrites",
    );
    ns.apply_object(
        llm_d.clone(),
        "InferenceModelRewrite",
        ("llm-d.ai", "v1alpha2"),
        "other",
        rewrite("other-pool", "wrong"),
    )
    .await;
    let created = Instant::now();
    ns.apply_object(
        llm_d,
        "InferenceModelRewrite",
        ("llm-d.ai", "v1alpha2"),
        "canary",
        rewrite("pool", "chat-v2"),
    )
    .await;
    loop {
        assert_eq!(send("chat", "batch").await.status, 200);
        if last_model() == "chat-v2" {
            break;
        }
        assert!(
            created.elapsed() < Duration::from_secs(10),
            "the rewrite never applied: {}",
            last_model()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "InferenceModelRewrite created -> applied: {:?}",
        created.elapsed()
    );

    // The cluster's objective overrides the config's: batch becomes
    // sheddable, so a saturated pool answers 429.
    epp_test_support::process::sim_admin(port, serde_json::json!({"extra_waiting": 40})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        send("chat", "batch").await.status,
        200,
        "priority 5 from the config: not shed"
    );
    let x_k8s = ns.custom(
        "inference.networking.x-k8s.io",
        "v1alpha2",
        "InferenceObjective",
        "inferenceobjectives",
    );
    ns.apply_object(
        x_k8s,
        "InferenceObjective",
        ("inference.networking.x-k8s.io", "v1alpha2"),
        "batch",
        serde_json::json!({"poolRef": {"name": "pool"}, "priority": -1}),
    )
    .await;
    poll_status(&send, "chat", "batch", 429).await;
    assert_eq!(
        send("chat", "live").await.status,
        200,
        "undeclared objectives are not shed"
    );
}

async fn poll_status<F, Fut>(send: &F, model: &'static str, objective: &'static str, want: u16)
where
    F: Fn(&'static str, &'static str) -> Fut,
    Fut: std::future::Future<Output = http::Response>,
{
    let start = Instant::now();
    loop {
        let r = send(model, objective).await;
        if r.status == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never {want}: {} {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn health_of(
    port: u16,
    service: &str,
) -> Option<tonic_health::pb::health_check_response::ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let r = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    Some(r.into_inner().status())
}

async fn serving(epps: &[&epp_test_support::process::Epp]) -> Vec<bool> {
    let mut out = Vec::new();
    for e in epps {
        out.push(
            health_of(e.health_port, "readiness").await
                == Some(tonic_health::pb::health_check_response::ServingStatus::Serving),
        );
    }
    out
}

/// Waits until exactly one of `epps` is ready; returns its index and the time taken.
async fn one_leader(
    epps: &[&epp_test_support::process::Epp],
    within: Duration,
) -> (usize, Duration) {
    let start = Instant::now();
    loop {
        let s = serving(epps).await;
        if s.iter().filter(|r| **r).count() == 1 {
            return (s.iter().position(|r| *r).unwrap(), start.elapsed());
        }
        assert!(start.elapsed() < within, "no single ready leader: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two epp processes with leader election: only the leader is ready; when
/// it is killed the other takes over after the lease expires, and when it is
/// stopped with SIGTERM the lease is released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_makes_one_replica_ready() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "e2e-ha").await;
    let dir = scratch_dir("kube-ha");
    let port = shared_port();
    let _sim = start_pod_sim(&dir, "pod-a", "127.0.0.2", port, &[]);
    ns.apply_pool("pool", &[("app", "model")], &[port]).await;
    ns.pod("pod-a", &[("app", "model")], "127.0.0.2", true)
        .await;
    ns.grant_discovery("epp", "epp").await;
    let start = |name: &str| {
        let mut cmd = pool_epp(&ns, &cluster.kubeconfig_for("epp"));
        cmd.args(["--ha-enable-leader-election", "--ha-lease-duration", "3s"])
            .env("POD_NAME", name);
        spawn_epp(name, cmd, dir.join(format!("{name}.log"))).0
    };
    let mut a = start("epp-a");
    let mut b = start("epp-b");
    let (leader, _) = one_leader(&[&a, &b], Duration::from_secs(15)).await;
    for _ in 0..10 {
        let s = serving(&[&a, &b]).await;
        assert_eq!(
            s.iter().filter(|r| **r).count(),
            1,
            "exactly one ready: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Killed without a chance to release: the other waits out the lease (3 s).
    let (killed, survivor) = if leader == 0 {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    Command::new("kill")
        .args(["-9", &killed.proc.pid().to_string()])
        .status()
        .unwrap();
    let (_, took) = one_leader(&[survivor], Duration::from_secs(15)).await;
    eprintln!("leader killed -> the other ready: {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "took over before the lease could expire: {took:?}"
    );

    // SIGTERM: the lease is released at once, a new replica takes over fast.
    let c = start("epp-c");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        serving(&[&c]).await,
        [false],
        "a second replica is not ready"
    );
    survivor.proc.signal_term();
    let (_, took) = one_leader(&[&c], Duration::from_secs(10)).await;
    eprintln!("leader SIGTERM -> the other ready: {took:?}");
    // Released, not expired: the stopping leader says it gave the lease up.
    let log = survivor.proc.log.with_extension("stderr");
    epp_test_support::wait::eventually("the stopping leader releases the lease", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::future::ready(text.contains("lease released"))
    })
    .await;
}

/// The API server stopped for 10 s under load: no request fails, and changes
/// made after it returns reach the routing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_outage_under_load_fails_no_request() {
    let cluster = KubeCluster::start("e2e-outage");
    let ns = Ns::create(&cluster, "e2e-outage").await;
    let dir = scratch_dir("kube-outage");
    let port = shared_port();
    let _sims: Vec<Sim> = [("pod-a", "127.0.0.2"), ("pod-b", "127.0.0.3")]
        .iter()
        .map(|(pod, ip)| start_pod_sim(&dir, pod, ip, port, &[]))
        .collect();
    ns.apply_pool("pool", &[("app", "model")], &[port]).await;
    ns.pod("pod-a", &[("app", "model")], "127.0.0.2", true)
        .await;
    ns.pod("pod-b", &[("app", "model")], "127.0.0.3", true)
        .await;
    let (epp, _) = spawn_epp(
        "epp",
        pool_epp(&ns, &cluster.kubeconfig),
        dir.join("epp.log"),
    );
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);
    until_served(envoy.port, "pod-a serves", |p| p == "pod-a").await;

    // Load: 4 clients sending back to back until told to stop.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut clients = Vec::new();
    for c in 0..4 {
        let stop = stop.clone();
        let port = envoy.port;
        clients.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0usize, Vec::new());
            let mut i = c * 1_000_000;
            while !stop.is_cancelled() {
                let r = http::post_json(port, "/v1/chat/completions", &chat(i))
                    .await
                    .unwrap();
                if r.status == 200 {
                    ok += 1;
                } else {
                    failed.push((r.status, r.text()));
                }
                i += 1;
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = &cluster;
    tokio::task::block_in_place(|| c.stop_apiserver());
    tokio::time::sleep(Duration::from_secs(10)).await;
    tokio::task::block_in_place(|| c.start_apiserver());
    let admin = Ns {
        client: cluster.admin().await,
        name: ns.name.clone(),
    };
    admin.set_ready("pod-a", false).await;
    let changed = Instant::now();
    // Once the change is seen, only pod-b serves.
    let mut streak = 0;
    while streak < 20 {
        let r = http::post_json(envoy.port, "/v1/chat/completions", &chat(0))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        streak = if r.header("x-inference-pod") == Some("pod-b") {
            streak + 1
        } else {
            0
        };
        assert!(
            changed.elapsed() < Duration::from_secs(15),
            "the change after the outage was never seen"
        );
    }
    eprintln!(
        "change after the API server returned seen within {:?}",
        changed.elapsed()
    );
    stop.cancel();
    let mut total = 0;
    for c in clients {
        let (ok, failed) = c.await.unwrap();
        assert!(
            failed.is_empty(),
            "requests failed during the outage: {failed:?}"
        );
        total += ok;
    }
    eprintln!("{total} requests during the test, none failed");
    assert!(total > 100, "the load ran: {total}");
}

/// Editing the pool's `targetPorts` moves traffic between the ranks of a pod
/// (one simulator per port on the pod's IP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_ports_edits_move_traffic() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "e2e-ports").await;
    let dir = scratch_dir("kube-ports");
    let (p0, p1) = (shared_port(), shared_port());
    let _r0 = start_pod_sim(&dir, "rank-0", "127.0.0.2", p0, &[]);
    let _r1 = start_pod_sim(&dir, "rank-1", "127.0.0.2", p1, &[]);
    ns.apply_pool("pool", &[("app", "model")], &[p0]).await;
    ns.pod("pod-a", &[("app", "model")], "127.0.0.2", true)
        .await;
    let (epp, _) = spawn_epp(
        "epp",
        pool_epp(&ns, &cluster.kubeconfig),
        dir.join("epp.log"),
    );
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);
    until_served(envoy.port, "rank 0 serves", |p| p == "rank-0").await;
    let counts = served(envoy.port, 10).await;
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["rank-0"], "{counts:?}");

    ns.apply_pool("pool", &[("app", "model")], &[p0, p1]).await;
    until_served(envoy.port, "rank 1 added", |p| p == "rank-1").await;
    ns.apply_pool("pool", &[("app", "model")], &[p1]).await;
    let start = Instant::now();
    let mut streak = 0;
    while streak < 10 {
        let c = served(envoy.port, 1).await;
        streak = if c.contains_key("rank-1") {
            streak + 1
        } else {
            0
        };
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rank 0 still served"
        );
    }
    let counts = served(envoy.port, 10).await;
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["rank-1"], "{counts:?}");
}

/// The reference Helm chart as rendered (`shared/reference/gie-chart`, beside
/// the checkout): every document, parsed.
fn reference_chart() -> Vec<serde_yaml_ng::Value> {
    let path =
        workspace_root().join("../shared/reference/gie-chart/inferencepool-v1.5.0-rendered.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    yaml_documents(&text)
}

/// Every non-empty document of a multi-document YAML stream (what
/// `helm template` prints).
pub(super) fn yaml_documents(text: &str) -> Vec<serde_yaml_ng::Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

pub(super) fn of_kind<'a>(
    docs: &'a [serde_yaml_ng::Value],
    kind: &str,
) -> &'a serde_yaml_ng::Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in the chart"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_charts_deployment_runs_unchanged() {
    use tonic_health::pb::health_check_response::ServingStatus;

    let chart = reference_chart();
    let deployment = of_kind(&chart, "Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let config_map = of_kind(&chart, "ConfigMap");
    let pool = of_kind(&chart, "InferencePool");

    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "chart").await;
    let dir = scratch_dir("kube-chart");
    // The chart's InferencePool, as rendered (selector app=vllm, port 8000).
    let pool_name = pool["metadata"]["name"].as_str().unwrap();
    let spec: serde_json::Value = serde_json::to_value(&pool["spec"]).unwrap();
    let port = u16::try_from(spec["targetPorts"][0]["number"].as_u64().unwrap()).unwrap();
    ns.apply_object(
        ns.pools(epp_test_support::kube::POOL_V1),
        "InferencePool",
        epp_test_support::kube::POOL_V1,
        pool_name,
        spec,
    )
    .await;
    let _sims: Vec<Sim> = [("vllm-0", "127.0.0.5"), ("vllm-1", "127.0.0.6")]
        .iter()
        .map(|(pod, ip)| start_pod_sim(&dir, pod, ip, port, &[]))
        .collect();
    ns.pod("vllm-0", &[("app", "vllm")], "127.0.0.5", true)
        .await;
    ns.pod("vllm-1", &[("app", "vllm")], "127.0.0.6", true)
        .await;

    // The ConfigMap where the chart mounts it; the chart's namespace is
    // this test's. Every other argument is the chart's own.
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let (file, text) = config_map["data"]
        .as_mapping()
        .unwrap()
        .iter()
        .next()
        .map(|(k, v)| (k.as_str().unwrap(), v.as_str().unwrap()))
        .unwrap();
    std::fs::write(dir.join(file), text).unwrap();
    let chart_path = format!("{mount}/{file}");
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            if *a == chart_path {
                dir.join(file).to_str().unwrap().to_owned()
            } else if a == "default" {
                ns.name.clone()
            } else {
                a.clone()
            }
        })
        .collect();
    assert!(args.iter().any(|a| a == "--zap-encoder"), "{args:?}");
    let mut cmd = epp_command();
    cmd.args(&args)
        .args(["--kubeconfig", cluster.kubeconfig.to_str().unwrap()]);
    let (epp, line) = spawn_epp("epp", cmd, dir.join("epp.log"));
    assert!(line.contains("tls=true"), "the chart serves TLS: {line}");

    // The chart's probes, by their service names.
    for probe in ["livenessProbe", "readinessProbe"] {
        let service = container[probe]["grpc"]["service"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut status = None;
        for _ in 0..200 {
            status = health_of(epp.health_port, &service).await;
            if status == Some(ServingStatus::Serving) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(status, Some(ServingStatus::Serving), "{probe} ({service})");
    }

    // Envoy routes through it to the pool's pods.
    let envoy = start_envoy_tls(&dir, epp.grpc_port);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = served(envoy.port, 12).await;
    assert!(
        counts.keys().all(|p| p.starts_with("vllm-")) && !counts.is_empty(),
        "{counts:?}"
    );
    // --zap-encoder json: the log is JSON lines.
    let log = std::fs::read_to_string(dir.join("epp.stderr")).unwrap();
    let first = log.lines().next().expect("epp logged something");
    assert!(
        serde_json::from_str::<serde_json::Value>(first).is_ok(),
        "not a JSON line: {first}"
    );
}
