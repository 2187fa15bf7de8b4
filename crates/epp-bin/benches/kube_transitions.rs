//! Pod transitions through the whole path: a real kube-apiserver, epp
//! following an InferencePool, Envoy, and simulators listening on the pods'
//! loopback IPs. Measures what a client sees:
//!
//! - pod Ready → first request routed to it: from the start of the status
//!   update to the send time of the first request the pod served;
//! - pod deleted → last request routed to it: from the start of the delete
//!   call to the send time of the last request the pod still served (0 when
//!   none was), watched until no request reached it for 500 ms.
//!
//! Both are read from one client that sends all the time (also while the
//! API call is under way), logging each request's send time and pod.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo bench -p epp-bin --bench kube_transitions            # 100 transitions each
//! cargo bench -p epp-bin --bench kube_transitions -- --quick # 20
//! ```
//!
//! The client's requests are distinct chats, so prefix affinity does not
//! pin them; with two Ready pods the default profile
//! spreads them, so the measured time includes waiting for the pod's first
//! metrics scrape (a pod without metrics is a last resort) and the chance
//! that the next few picks still go to the other pod.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

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

/// When a request was sent, and whether pod-b served it (or the status of
/// a failed one).
type Sent = (Instant, Result<bool, u16>);

/// One request through Envoy: the pod that served it, or the status.
async fn send(envoy_port: u16, i: usize) -> Result<String, u16> {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
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
        "--drain-timeout",
        "0s",
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

    println!(
        "kube_transitions: {n} transitions each, one client sending back to back, release build"
    );
    // A request must work before anything is measured.
    match send(envoy.port, 0).await {
        Ok(pod) => assert_eq!(pod, "pod-a"),
        Err(status) => panic!("a request through Envoy failed with {status} before any transition"),
    }
    // One client sends all the time, also while an API call is under way,
    // logging when each request was sent and which pod served it.
    let log: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let client = tokio::spawn({
        let (log, stop, port) = (Arc::clone(&log), Arc::clone(&stop), envoy.port);
        async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let sent = Instant::now();
                let served = send(port, i).await.map(|pod| pod == "pod-b");
                log.lock().unwrap().push((sent, served));
            }
        }
    });
    // Send times of requests pod-b served, sent at or after `t0`.
    let to_b_since = |t0: Instant| -> Vec<Duration> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|(sent, served)| *sent >= t0 && *served == Ok(true))
            .map(|(sent, _)| sent.duration_since(t0))
            .collect()
    };

    let (mut ready, mut deleted) = (Vec::new(), Vec::new());
    let (mut ready_failed, mut deleted_failed) = (0, 0);
    for _ in 0..n {
        // A NotReady pod-b, known to epp before it turns Ready.
        ns.pod("pod-b", LABELS, "127.0.0.3", false).await;
        tokio::time::sleep(Duration::from_millis(100)).await;

        let t0 = Instant::now();
        ns.set_ready("pod-b", true).await;
        loop {
            if let Some(first) = to_b_since(t0).first() {
                ready.push(*first);
                break;
            }
            if t0.elapsed() > GIVE_UP {
                ready_failed += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let t0 = Instant::now();
        ns.delete_pod("pod-b").await;
        loop {
            let last = to_b_since(t0).last().copied().unwrap_or_default();
            if t0.elapsed() > last + QUIET {
                deleted.push(last);
                break;
            }
            if t0.elapsed() > GIVE_UP {
                deleted_failed += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Deletion of a pod no kubelet runs is immediate; wait until the
        // name is free for the next round.
        while ns.pods().get_opt("pod-b").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    client.await.unwrap();
    let log = std::mem::take(&mut *log.lock().unwrap());
    let errors = log.iter().filter(|(_, served)| served.is_err()).count();
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
    println!(
        "  requests sent {}, answered with an error {errors}",
        log.len()
    );
}
