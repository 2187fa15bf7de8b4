//! Pools and pods on a running API server: readiness, scaling, ports,
//! selectors, pool deletion, the older pool shape.

use std::time::Duration;

use serde_json::json;

use super::{Running, selector_spec};
use crate::kube_env::{KubeCluster, Ns, POOL_V1ALPHA2, until};

#[tokio::test]
async fn ready_pods_of_the_pool_are_the_endpoints() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "pods").await;
    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    ns.pod(
        "a",
        &[("app", "m"), ("llm-d.ai/role", "decode")],
        "127.0.0.2",
        true,
    )
    .await;
    ns.pod("b", &[("app", "m")], "127.0.0.3", false).await;
    ns.pod("other", &[("app", "x")], "127.0.0.4", true).await;
    // A pod bound to a node stays, terminating, when deleted (no kubelet).
    ns.pod_on("held", &[("app", "m")], "127.0.0.5", true, Some("node-1"))
        .await;

    let run = Running::pool(
        &cluster.kubeconfig,
        &ns.name,
        "pool",
        "inference.networking.k8s.io",
    )
    .await;
    assert!(run.discovery.is_ready(), "ready after the first sync");
    run.until_addrs("a and held", &["127.0.0.2:8000", "127.0.0.5:8000"])
        .await;
    let snap = epp_core::EndpointSource::snapshot(&*run.store);
    let a = snap.by_addr("127.0.0.2:8000".parse().unwrap()).unwrap();
    assert_eq!(
        a.label("llm-d.ai/role"),
        Some("decode"),
        "pod labels become endpoint labels"
    );
    assert_eq!(a.label("app"), Some("m"));
    assert!(
        run.names().contains("a@127.0.0.2:8000"),
        "{:?}",
        run.names()
    );

    ns.delete_pod("held").await;
    run.until_addrs("a terminating pod is dropped", &["127.0.0.2:8000"])
        .await;
    ns.set_ready("b", true).await;
    run.until_addrs("b turned Ready", &["127.0.0.2:8000", "127.0.0.3:8000"])
        .await;
    ns.set_ready("a", false).await;
    run.until_addrs("a turned NotReady", &["127.0.0.3:8000"])
        .await;
    ns.pod("c", &[("app", "m")], "127.0.0.6", true).await;
    run.until_addrs("scaled up", &["127.0.0.3:8000", "127.0.0.6:8000"])
        .await;
    ns.delete_pod("b").await;
    run.until_addrs("b deleted", &["127.0.0.6:8000"]).await;
    // A pod that gains the pool's label joins.
    let patch = json!({"metadata": {"labels": {"app": "m"}}});
    ns.pods()
        .patch(
            "other",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    run.until_addrs(
        "relabelled pod joins",
        &["127.0.0.4:8000", "127.0.0.6:8000"],
    )
    .await;
}

#[tokio::test]
async fn target_ports_and_selector_change_live() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "ports").await;
    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    ns.pod("a", &[("app", "m"), ("gen", "1")], "127.0.0.2", true)
        .await;
    ns.pod("b", &[("app", "n"), ("gen", "1")], "127.0.0.3", true)
        .await;
    let run = Running::pool(
        &cluster.kubeconfig,
        &ns.name,
        "pool",
        "inference.networking.k8s.io",
    )
    .await;
    run.until_addrs("one port", &["127.0.0.2:8000"]).await;
    assert_eq!(
        run.names(),
        ["a@127.0.0.2:8000".to_owned()].into(),
        "one port: the pod's name"
    );

    ns.apply_pool("pool", &[("app", "m")], &[8000, 8001, 8002])
        .await;
    run.until_addrs(
        "three ranks",
        &["127.0.0.2:8000", "127.0.0.2:8001", "127.0.0.2:8002"],
    )
    .await;
    let names: Vec<String> = run.names().into_iter().collect();
    assert_eq!(
        names,
        [
            "a-rank-0@127.0.0.2:8000",
            "a-rank-1@127.0.0.2:8001",
            "a-rank-2@127.0.0.2:8002"
        ]
    );
    let snap = epp_core::EndpointSource::snapshot(&*run.store);
    let rank1 = snap.by_addr("127.0.0.2:8001".parse().unwrap()).unwrap();
    assert_eq!(
        rank1.name(),
        "a-rank-1",
        "the store's endpoint carries the rank name"
    );

    ns.apply_pool("pool", &[("gen", "1")], &[9000]).await;
    run.until_addrs("new selector", &["127.0.0.2:9000", "127.0.0.3:9000"])
        .await;
    ns.apply_pool("pool", &[("app", "n")], &[9000]).await;
    run.until_addrs("narrower selector", &["127.0.0.3:9000"])
        .await;
    assert!(run.discovery.is_ready());
}

#[tokio::test]
async fn deleted_pool_empties_the_set_and_a_new_one_is_picked_up() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "recreate").await;
    ns.pod("a", &[("app", "m")], "127.0.0.2", true).await;
    // No pool yet: synced, empty, not ready.
    let run = Running::pool(
        &cluster.kubeconfig,
        &ns.name,
        "pool",
        "inference.networking.k8s.io",
    )
    .await;
    assert!(run.addrs().is_empty());
    assert!(!run.discovery.is_ready(), "no pool: not ready");

    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    run.until_addrs("pool created", &["127.0.0.2:8000"]).await;
    until("ready", Duration::from_secs(5), || run.discovery.is_ready()).await;

    ns.delete_pool("pool").await;
    run.until_addrs("pool deleted", &[]).await;
    assert!(!run.discovery.is_ready(), "deleted pool: not ready");

    ns.apply_pool("pool", &[("app", "m")], &[8100]).await;
    run.until_addrs("pool re-created", &["127.0.0.2:8100"])
        .await;
    until("ready again", Duration::from_secs(5), || {
        run.discovery.is_ready()
    })
    .await;
}

#[tokio::test]
async fn selector_mode_without_a_pool() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "selector").await;
    ns.pod("a", &[("app", "m"), ("tier", "gpu")], "127.0.0.2", true)
        .await;
    ns.pod("b", &[("app", "n"), ("tier", "gpu")], "127.0.0.3", true)
        .await;
    ns.pod(
        "c",
        &[("app", "m"), ("tier", "gpu"), ("canary", "yes")],
        "127.0.0.4",
        true,
    )
    .await;
    ns.pod("d", &[("app", "o"), ("tier", "cpu")], "127.0.0.5", true)
        .await;
    let run = Running::start(
        &cluster.kubeconfig,
        &ns.name,
        selector_spec("app in (m,n),tier!=cpu,!canary", &[9000, 9001]),
    )
    .await
    .unwrap();
    assert!(run.discovery.is_ready());
    run.until_addrs(
        "set-based selector",
        &[
            "127.0.0.2:9000",
            "127.0.0.2:9001",
            "127.0.0.3:9000",
            "127.0.0.3:9001",
        ],
    )
    .await;
    assert!(
        run.names().contains("b-rank-1@127.0.0.3:9001"),
        "{:?}",
        run.names()
    );
    ns.pod("e", &[("app", "n"), ("tier", "gpu")], "127.0.0.6", true)
        .await;
    run.until_addrs(
        "new matching pod",
        &[
            "127.0.0.2:9000",
            "127.0.0.2:9001",
            "127.0.0.3:9000",
            "127.0.0.3:9001",
            "127.0.0.6:9000",
            "127.0.0.6:9001",
        ],
    )
    .await;
}

#[tokio::test]
async fn older_pool_shape_from_the_x_k8s_group() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "alpha").await;
    ns.apply_object(
        ns.pools(POOL_V1ALPHA2),
        "InferencePool",
        POOL_V1ALPHA2,
        "old",
        json!({"selector": {"app": "m"}, "targetPortNumber": 8000,
               "extensionRef": {"name": "epp"}}),
    )
    .await;
    ns.pod("a", &[("app", "m")], "127.0.0.2", true).await;
    let run = Running::pool(
        &cluster.kubeconfig,
        &ns.name,
        "old",
        "inference.networking.x-k8s.io",
    )
    .await;
    run.until_addrs("v1alpha2 pool", &["127.0.0.2:8000"]).await;
    assert!(run.discovery.is_ready());
}
