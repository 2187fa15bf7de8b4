//! Kubernetes discovery against a real kube-apiserver (`scripts/kube-env.sh`):
//!
//! 1. latency: a pod turns Ready → its endpoint is in the store, and a pod is
//!    deleted → its endpoint is gone, 100 transitions each (p50/p99/max,
//!    measured from the start of the API call that makes the change, so the
//!    API server's own write and watch fan-out are included);
//! 2. cost: 1,000 matching pods among 5,000 in the namespace, 50 pod status
//!    updates per second for 20 s: CPU of the discovery thread (its own
//!    runtime, read from /proc/thread-self/stat) and the process's RSS growth
//!    from before discovery started.
//!
//! `cargo bench -p epp-datalayer --bench kube_discovery` (quick mode:
//! `-- --quick`, 20 transitions and 1,000 pods).

#![expect(clippy::unwrap_used, reason = "a benchmark program panics on failure")]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use epp_core::EndpointSource;
use epp_datalayer::{
    Discovery, EndpointStore,
    kubernetes::{KubeOptions, KubeTarget, KubernetesDiscovery, PoolGroup},
};
use epp_test_support::kube::{KubeCluster, Ns};
use futures::{StreamExt, stream};
use tokio_util::sync::CancellationToken;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what}: n={} p50={:.1?} p99={:.1?} max={:.1?}",
        samples.len(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples.last().copied().unwrap_or_default()
    );
}

/// utime + stime of the calling thread, from /proc/thread-self/stat.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3) here.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024.0
}

/// Discovery of `pool` on a runtime of its own, in a thread of its own.
struct Isolated {
    store: Arc<EndpointStore>,
    stop: CancellationToken,
    cpu: std::sync::mpsc::Receiver<Duration>,
    ask: tokio::sync::mpsc::UnboundedSender<()>,
}

impl Isolated {
    fn start(kubeconfig: std::path::PathBuf, ns: String) -> Self {
        let store = Arc::new(EndpointStore::new());
        let stop = CancellationToken::new();
        let (cpu_tx, cpu) = std::sync::mpsc::channel();
        let (ask, mut asks) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (s, st) = (Arc::clone(&store), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let d = KubernetesDiscovery::connect(KubeOptions {
                    namespace: ns,
                    target: KubeTarget::Pool {
                        name: "pool".into(),
                        group: PoolGroup::V1,
                    },
                    kubeconfig: Some(kubeconfig),
                })
                .await
                .unwrap();
                d.start(s, st.clone()).unwrap();
                d.wait_synced(Duration::from_secs(120)).await.unwrap();
                ready_tx.send(()).unwrap();
                loop {
                    tokio::select! {
                        () = st.cancelled() => return,
                        Some(()) = asks.recv() => cpu_tx.send(thread_cpu()).unwrap(),
                    }
                }
            });
        });
        ready.recv().unwrap();
        Self {
            store,
            stop,
            cpu,
            ask,
        }
    }

    fn cpu(&self) -> Duration {
        self.ask.send(()).unwrap();
        self.cpu.recv().unwrap()
    }
}

async fn wait_store(store: &EndpointStore, addr: &str, present: bool) {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut changes = store.subscribe();
    loop {
        if store.snapshot().by_addr(addr).is_some() == present {
            return;
        }
        tokio::time::timeout(Duration::from_secs(10), changes.changed())
            .await
            .expect("discovery never applied the change")
            .unwrap();
    }
}

async fn latency(cluster: &KubeCluster, transitions: usize) {
    let ns = Ns::create(cluster, "bench-lat").await;
    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    ns.pod("p", &[("app", "m")], "127.0.0.2", false).await;
    let d = Isolated::start(cluster.kubeconfig.clone(), ns.name.clone());
    let mut ready = Vec::new();
    let mut gone = Vec::new();
    for i in 0..transitions {
        let t = Instant::now();
        ns.set_status("p", "127.0.0.2", true).await;
        wait_store(&d.store, "127.0.0.2:8000", true).await;
        ready.push(t.elapsed());
        ns.set_status("p", "127.0.0.2", false).await;
        wait_store(&d.store, "127.0.0.2:8000", false).await;

        let name = format!("d{i}");
        ns.pod(&name, &[("app", "m")], "127.0.0.3", true).await;
        wait_store(&d.store, "127.0.0.3:8000", true).await;
        let t = Instant::now();
        ns.delete_pod(&name).await;
        wait_store(&d.store, "127.0.0.3:8000", false).await;
        gone.push(t.elapsed());
    }
    report(
        "pod Ready -> endpoint in the store (from the API call)",
        ready,
    );
    report("pod deleted -> endpoint gone (from the API call)", gone);
    d.stop.cancel();
}

async fn cost(cluster: &KubeCluster, matching: usize, total: usize, seconds: u64) {
    let ns = Ns::create(cluster, "bench-cost").await;
    ns.apply_pool("pool", &[("app", "m")], &[8000]).await;
    let t = Instant::now();
    stream::iter(0..total)
        .for_each_concurrent(16, |i| {
            let ns = ns.clone();
            async move {
                let app = if i < matching { "m" } else { "other" };
                let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
                ns.pod(
                    &format!("pod-{i}"),
                    &[("app", app), ("n", &i.to_string())],
                    &ip,
                    true,
                )
                .await;
            }
        })
        .await;
    println!(
        "created {total} pods ({matching} matching) in {:.1?}",
        t.elapsed()
    );
    let rss_before = rss_mb();
    let d = Isolated::start(cluster.kubeconfig.clone(), ns.name.clone());
    let synced_cpu = d.cpu();
    assert_eq!(d.store.snapshot().len(), matching);
    let rss_synced = rss_mb();
    // 50 status updates per second, flipping Ready on matching pods.
    let updates = seconds * 50;
    let start = Instant::now();
    let cpu0 = d.cpu();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for u in 0..updates {
        tick.tick().await;
        let i = (u as usize * 7) % matching;
        let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        let ns = ns.clone();
        tokio::spawn(async move {
            ns.set_status(&format!("pod-{i}"), &ip, u % 2 == 0).await;
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wall = start.elapsed();
    let cpu = d.cpu() - cpu0;
    println!(
        "first sync of {matching}/{total} pods: {:.0?} CPU, RSS +{:.1} MB",
        synced_cpu,
        rss_synced - rss_before
    );
    println!(
        "{updates} updates in {wall:.1?}: discovery thread {cpu:.0?} CPU = {:.1} % of a core; RSS +{:.1} MB over the start",
        cpu.as_secs_f64() / wall.as_secs_f64() * 100.0,
        rss_mb() - rss_before
    );
    d.stop.cancel();
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing we need.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cluster = KubeCluster::start("bench");
        if quick {
            latency(&cluster, 20).await;
            cost(&cluster, 200, 1_000, 5).await;
        } else {
            latency(&cluster, 100).await;
            cost(&cluster, 1_000, 5_000, 20).await;
        }
    });
}
