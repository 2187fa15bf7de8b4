//! Faults: RBAC missing at start or revoked later, the API server away.

use std::time::{Duration, Instant};

use epp_datalayer::{Error, kubernetes::KubeTarget};

use super::{Running, kube_env::until};
use crate::kube_env::{KubeCluster, Ns};

#[tokio::test]
async fn missing_rbac_at_start_is_an_error_naming_it() {
    let cluster = KubeCluster::shared();
    let ns = Ns::create(cluster, "rbac").await;
    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    let target = KubeTarget::Pool {
        name: "pool".into(),
        group: epp_datalayer::kubernetes::PoolGroup::V1,
    };
    let err = Running::start(
        &cluster.kubeconfig_for("restricted"),
        &ns.name,
        target.clone(),
    )
    .await
    .err()
    .expect("a user without RBAC cannot start discovery");
    let text = err.to_string();
    assert!(matches!(err, Error::Forbidden { .. }), "{text}");
    assert!(
        text.contains("forbidden to list, watch pods") && text.contains(&ns.name),
        "{text}"
    );

    // Pods alone are not enough: the pool's resource is named too.
    ns.grant_discovery("restricted", "partial").await;
    ns.custom("rbac.authorization.k8s.io", "v1", "Role", "roles")
        .patch(
            "epp-discovery",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
            ]})),
        )
        .await
        .unwrap();
    let err = Running::start(
        &cluster.kubeconfig_for("restricted"),
        &ns.name,
        target.clone(),
    )
    .await
    .err()
    .expect("no access to the pool");
    assert!(
        err.to_string()
            .contains("forbidden to list, watch inferencepools.inference.networking.k8s.io"),
        "{err}"
    );

    // The rules docs/kubernetes.md gives are enough.
    ns.grant_discovery("epp", "epp").await;
    ns.pod("a", &[("app", "m")], "127.0.0.2", true).await;
    let run = Running::start(&cluster.kubeconfig_for("epp"), &ns.name, target)
        .await
        .unwrap();
    run.until_addrs("with the documented Role", &["127.0.0.2:8000"])
        .await;
}

#[tokio::test]
async fn api_server_away_keeps_endpoints_then_converges() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("epp_datalayer=info")
        .with_test_writer()
        .try_init();
    let cluster = KubeCluster::start("outage");
    let ns = Ns::create(&cluster, "outage").await;
    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    ns.pod("a", &[("app", "m")], "127.0.0.2", true).await;
    ns.pod("b", &[("app", "m")], "127.0.0.3", true).await;
    ns.grant_discovery("epp", "epp").await;
    let run = Running::pool(
        &cluster.kubeconfig_for("epp"),
        &ns.name,
        "pool",
        "inference.networking.k8s.io",
    )
    .await;
    run.until_addrs("both pods", &["127.0.0.2:8000", "127.0.0.3:8000"])
        .await;

    // Every set the store publishes from here on must keep b: neither the
    // outage nor the re-list after it (the restarted API server answers the
    // old watch with 410 Expired) may leave a gap.
    let store = std::sync::Arc::clone(&run.store);
    let mut changes = store.subscribe();
    let b: std::net::SocketAddr = "127.0.0.3:8000".parse().unwrap();
    let watch_b = tokio::spawn(async move {
        let mut published = 0;
        while changes.changed().await.is_ok() {
            published += 1;
            assert!(
                epp_core::EndpointSource::snapshot(&*store)
                    .by_addr(b)
                    .is_some(),
                "b dropped from the store at publication {published}"
            );
        }
    });
    cluster.stop_apiserver();
    let away = Instant::now();
    while away.elapsed() < Duration::from_secs(4) {
        assert_eq!(
            run.addrs().len(),
            2,
            "the endpoints stay while the API server is away"
        );
        assert!(
            run.discovery.is_ready(),
            "an absent control plane is not a reason to stop routing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.start_apiserver();
    let back = Instant::now();
    let admin = Ns {
        client: cluster.admin().await,
        name: ns.name.clone(),
    };
    admin.set_ready("a", false).await;
    run.until_addrs("a change after the return", &["127.0.0.3:8000"])
        .await;
    eprintln!(
        "converged {:?} after the API server returned; re-lists: {}",
        back.elapsed(),
        run.discovery.relists()
    );
    assert!(
        run.discovery.relists() >= 1,
        "the restarted API server expired the watch (410): re-listed"
    );
    assert!(!watch_b.is_finished(), "b stayed through the re-list");
    watch_b.abort();

    // RBAC revoked: the next list or watch is refused. The endpoints stay,
    // readiness goes, the refusal is counted once.
    admin.revoke("epp").await;
    cluster.stop_apiserver();
    cluster.start_apiserver();
    until("the refusal is seen", Duration::from_secs(15), || {
        run.discovery.forbidden_errors() >= 1
    })
    .await;
    assert!(!run.discovery.is_ready(), "forbidden: not ready");
    assert_eq!(run.addrs().len(), 1, "the last endpoints stay");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        run.discovery.forbidden_errors() <= 2,
        "counted once per feed while it lasts, not per retry: {}",
        run.discovery.forbidden_errors()
    );
    admin.grant_discovery("epp", "epp").await;
    admin.set_ready("a", true).await;
    run.until_addrs("access back", &["127.0.0.2:8000", "127.0.0.3:8000"])
        .await;
    until("ready again", Duration::from_secs(10), || {
        run.discovery.is_ready()
    })
    .await;
}
