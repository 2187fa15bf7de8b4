//! Kubernetes discovery against a real kube-apiserver (built and started by
//! `scripts/kube-env.sh`): pools, pods made Ready or not through the status
//! subresource, selectors, RBAC and the API server going away.

#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

use epp_test_support::kube as kube_env;

#[path = "kubernetes/faults.rs"]
mod faults;
#[path = "kubernetes/pool.rs"]
mod pool;

use std::{collections::BTreeSet, path::Path, sync::Arc, time::Duration};

use epp_core::EndpointSource;
use epp_datalayer::{
    Discovery, EndpointStore,
    kubernetes::{
        KubeOptions, KubeTarget, KubernetesDiscovery, LabelSelector, PoolGroup, PoolSpec,
    },
};
use tokio_util::sync::CancellationToken;

/// A running discovery writing into its own store.
struct Running {
    discovery: KubernetesDiscovery,
    store: Arc<EndpointStore>,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Running {
    async fn pool(kubeconfig: &Path, ns: &str, name: &str, group: &str) -> Self {
        Self::start(
            kubeconfig,
            ns,
            KubeTarget::Pool {
                name: name.into(),
                group: PoolGroup::parse(group).unwrap(),
            },
        )
        .await
        .unwrap()
    }

    async fn start(kubeconfig: &Path, ns: &str, target: KubeTarget) -> epp_datalayer::Result<Self> {
        let discovery = KubernetesDiscovery::connect(KubeOptions {
            namespace: ns.into(),
            target,
            kubeconfig: Some(kubeconfig.to_path_buf()),
        })
        .await?;
        let store = Arc::new(EndpointStore::new());
        let stop = CancellationToken::new();
        discovery.start(Arc::clone(&store), stop.clone())?;
        discovery.wait_synced(Duration::from_secs(20)).await?;
        Ok(Self {
            discovery,
            store,
            stop,
        })
    }

    /// `name@addr` of every endpoint published.
    fn names(&self) -> BTreeSet<String> {
        self.discovery
            .endpoints()
            .iter()
            .map(|(name, addr)| format!("{name}@{addr}"))
            .collect()
    }

    /// The addresses in the store.
    fn addrs(&self) -> BTreeSet<String> {
        self.store
            .snapshot()
            .endpoints()
            .iter()
            .map(|e| e.addr().to_string())
            .collect()
    }

    async fn until_addrs(&self, what: &str, want: &[&str]) -> Duration {
        let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
        kube_env::until(what, Duration::from_secs(10), || {
            let have = self.addrs();
            have == want
        })
        .await
    }
}

fn selector_spec(selector: &str, ports: &[u16]) -> KubeTarget {
    KubeTarget::Selector(PoolSpec {
        selector: LabelSelector::parse(selector).unwrap(),
        ports: ports.to_vec(),
    })
}
