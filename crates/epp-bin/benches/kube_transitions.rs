//! Pod transitions through the whole path: a real kube-apiserver, epp
//! following an InferencePool, Envoy, and simulators listening on the pods'
//! loopback IPs. Measures what a client sees:
//!
//! - pod Ready → first request routed to it: from the start of the status
//!   update to the first response the pod served;
//! - pod deleted → last request routed to it: from the start of the delete
//!   call to the send time of the last request the pod still served (0 when
//!   none was), watched until no request reached it for 500 ms.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo bench -p epp-bin --bench kube_transitions            # 100 transitions each
//! cargo bench -p epp-bin --bench kube_transitions -- --quick # 20
//! ```
//!
//! One client sends requests back to back (each a distinct chat, so prefix
//! affinity does not pin them); with two Ready pods the default profile
//! spreads them, so the measured time includes waiting for the pod's first
//! metrics scrape (a pod without metrics is a last resort) and the chance
//! that the next few picks still go to the other pod.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use epp_test_support::{
    http,
    kube::{KubeCluster, Ns},
    process::{
        BodyMode, Sim, epp_command, free_port_on, scratch_dir, spawn_epp, start_envoy,
        start_pod_sim,
    },
    stats::percentile,
};

const LABELS: &[(&str, &str)] = &[("app", "model")];
/// How long the deleted pod must go unpicked before its last pick counts as the last.
const QUIET: Duration = Duration::from_millis(500);
/// Give up on one transition after this long (counted as a failure).
const GIVE_UP: Duration = Duration::from_secs(10);

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 20 } else { 100 };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(n));
}

/// One request through Envoy: the pod that served it, or the status.
async fn send(envoy_port: u16, i: usize) -> Result<String, u16> {
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": format!("request {i}: tell me something new")}],
        "max_tokens": 1,
    });
    let r = http::post_json(envoy_port, "/v1/chat/completions", &body)
        .await
        .unwrap();
    if r.status == 200 {
        Ok(r.header("x-inference-pod").unwrap_or_default().to_owned())
    } else {
        Err(r.status)
    }
}

fn row(what: &str, mut lat: Vec<Duration>, failed: usize) {
    lat.sort();
    let ms = |p: f64| percentile(&lat, p).unwrap_or_default().as_secs_f64() * 1e3;
    println!(
        "  {what:<44} n={:<4} failed={failed:<3} p50 {:>7.1}  p90 {:>7.1}  p99 {:>7.1}  max {:>7.1} ms",
        lat.len(),
        ms(50.0),
        ms(90.0),
        ms(99.0),
        ms(100.0),
    );
}

async fn run(n: usize) {
    let cluster = KubeCluster::start("bench-transitions");
    let ns = Ns::create(&cluster, "bench").await;
    let dir = scratch_dir("kube-transitions");
    let port = free_port_on("127.0.0.2");
    let _sims: Vec<Sim> = [("pod-a", "127.0.0.2"), ("pod-b", "127.0.0.3")]
        .iter()
        .map(|(pod, ip)| start_pod_sim(&dir, pod, ip, port, &["--ttft-ms", "0", "--itl-ms", "0"]))
        .collect();
    ns.apply_pool("pool", LABELS, &[port]).await;
    ns.pod("pod-a", LABELS, "127.0.0.2", true).await;

    let mut cmd = epp_command();
    cmd.args([
        "--secure-serving=false",
        "--pool-name",
        "pool",
        "--pool-namespace",
    ])
    .arg(&ns.name)
    .arg("--kubeconfig")
    .arg(&cluster.kubeconfig)
    .env("RUST_LOG", "warn");
    let (epp, _) = spawn_epp("epp", cmd, dir.join("epp.log"));
    let envoy = start_envoy(&dir, BodyMode::Buffered, epp.grpc_port);

    println!("kube_transitions: {n} transitions each, one client back to back, release build");
    let (mut ready, mut deleted) = (Vec::new(), Vec::new());
    let (mut ready_failed, mut deleted_failed, mut errors) = (0, 0, 0);
    let mut i = 0;
    for _ in 0..n {
        // A NotReady pod-b, known to epp before it turns Ready.
        ns.pod("pod-b", LABELS, "127.0.0.3", false).await;
        tokio::time::sleep(Duration::from_millis(100)).await;

        let t0 = Instant::now();
        ns.set_ready("pod-b", true).await;
        loop {
            i += 1;
            match send(envoy.port, i).await {
                Ok(pod) if pod == "pod-b" => {
                    ready.push(t0.elapsed());
                    break;
                }
                Ok(_) => {}
                Err(_) => errors += 1,
            }
            if t0.elapsed() > GIVE_UP {
                ready_failed += 1;
                break;
            }
        }

        let t0 = Instant::now();
        ns.delete_pod("pod-b").await;
        let mut last_b = None;
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < QUIET && t0.elapsed() < GIVE_UP {
            i += 1;
            let sent = Instant::now();
            match send(envoy.port, i).await {
                Ok(pod) if pod == "pod-b" => {
                    last_b = Some(sent.duration_since(t0));
                    quiet_since = Instant::now();
                }
                Ok(_) => {}
                Err(_) => errors += 1,
            }
        }
        if quiet_since.elapsed() < QUIET {
            deleted_failed += 1;
        } else {
            deleted.push(last_b.unwrap_or_default());
        }
        // Deletion of a pod no kubelet runs is immediate; wait until the
        // name is free for the next round.
        while ns.pods().get_opt("pod-b").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    row(
        "pod Ready -> first request routed to it",
        ready,
        ready_failed,
    );
    row(
        "pod deleted -> last request routed to it",
        deleted,
        deleted_failed,
    );
    println!("  requests sent {i}, answered with an error {errors}");
}
