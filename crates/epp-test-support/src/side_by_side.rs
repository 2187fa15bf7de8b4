//! epp and the reference picker side by side on one InferencePool whose
//! pods are a [`MetricsFarm`]'s addresses: what the benchmarks that compare
//! the two pickers' own costs (scraping, memory) share.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use crate::{
    kube::{KubeCluster, Ns},
    metrics_farm::MetricsFarm,
    process::{Epp, start_epp_on_pool, workspace_bin},
    reference::{reference_version, start_reference},
};

/// Metrics refresh of both pickers (their shared default, given explicitly).
pub const REFRESH: &str = "50ms";

/// The IP of pod `i`: 127.1.0.1 … 127.1.0.250, 127.1.1.1 …
#[must_use]
pub fn pod_ip(i: usize) -> String {
    format!("127.1.{}.{}", i / 250, i % 250 + 1)
}

/// The control plane holding pool `pool`, and both pickers following it,
/// each already scraping every pod.
pub struct PoolPickers {
    /// The epp release binary.
    pub epp: Epp,
    /// epp's `User-Agent` at the farm (none: empty).
    pub epp_agent: String,
    /// The reference picker.
    pub reference: Epp,
    /// The reference's `User-Agent` at the farm.
    pub reference_agent: String,
    /// The namespace holding the pool (kept alive with the pickers).
    pub ns: Ns,
    /// The control plane.
    pub cluster: KubeCluster,
}

/// Creates pool `pool` of `pods` Ready pods at the farm's port (pod `i` at
/// [`pod_ip`]`(i)`) in a cluster tagged `tag`, then starts epp and then the
/// reference on it with `config` and [`REFRESH`], each returning once the
/// farm has seen it scrape every pod. `EPP_BENCH_REFERENCE_ARGS` adds flags
/// to the reference. Prints what it did.
pub async fn start_pool_pickers(
    dir: &Path,
    tag: &str,
    farm: &MetricsFarm,
    pods: usize,
    config: &Path,
) -> PoolPickers {
    let cluster = KubeCluster::start(tag);
    let ns = Ns::create(&cluster, "bench").await;
    ns.apply_pool("pool", &[("app", "model")], &[farm.port])
        .await;
    let t = Instant::now();
    for i in 0..pods {
        ns.pod(&format!("pod-{i}"), &[("app", "model")], &pod_ip(i), true)
            .await;
    }
    println!(
        "pool: {pods} Ready pods {} … {} ({:.1} s to create)",
        pod_ip(0),
        pod_ip(pods - 1),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let epp = start_epp_on_pool(
        dir,
        "epp",
        &workspace_bin("epp"),
        &cluster.kubeconfig,
        &ns.name,
        "pool",
        config,
        &[
            "--refresh-metrics-interval",
            REFRESH,
            // As the reference is started: metrics readable without a token.
            "--metrics-endpoint-auth=false",
            "--enable-pprof=false",
        ],
    );
    let epp_agent = farm.wait_new_client(&[], pods, Duration::from_secs(120));
    println!(
        "epp: scraping all {pods} pods {:.1} s after start (user agent {})",
        t.elapsed().as_secs_f64(),
        agent_name(&epp_agent)
    );
    let mut reference_args = vec![format!("--refresh-metrics-interval={REFRESH}")];
    reference_args.extend(
        std::env::var("EPP_BENCH_REFERENCE_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned),
    );
    println!("reference: {} {reference_args:?}", reference_version());
    let t = Instant::now();
    let reference = start_reference(
        dir,
        &cluster.kubeconfig,
        &ns.name,
        "pool",
        config,
        &reference_args,
    );
    let reference_agent = farm.wait_new_client(
        std::slice::from_ref(&epp_agent),
        pods,
        Duration::from_secs(120),
    );
    println!(
        "reference: scraping all {pods} pods {:.1} s after start (user agent {})",
        t.elapsed().as_secs_f64(),
        agent_name(&reference_agent)
    );
    PoolPickers {
        epp,
        epp_agent,
        reference,
        reference_agent,
        ns,
        cluster,
    }
}

impl std::fmt::Debug for PoolPickers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolPickers")
            .field("epp", &self.epp)
            .field("reference", &self.reference)
            .field("namespace", &self.ns.name)
            .finish_non_exhaustive()
    }
}

fn agent_name(agent: &str) -> &str {
    if agent.is_empty() { "(none)" } else { agent }
}
