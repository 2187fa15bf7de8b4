//! llm-d's GPU-aware sample config (`sim-epp-gpu-config.yaml`) through the
//! real binary and Envoy: simulators stand in for the model servers and, on
//! a port of their own at the same addresses, for NVIDIA's DCGM exporter
//! (`DCGM_FI_DEV_GPU_UTIL` set through the simulator's admin gauges); and
//! the same config with no exporter at all, as on a machine without GPUs.
//! The endpoints come from a `file-discovery` plugin named by
//! `dataLayer.discovery`, in llm-d's file shape.

use std::{path::Path, time::Duration};

use epp_test_support::{
    http,
    process::{
        BodyMode, Sim, scratch_dir, shared_loopback_port, start_envoy, start_epp, start_sim,
        start_sim_at, workspace_root,
    },
};

const IPS: [&str; 3] = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];

/// llm-d's GPU sample with the exporter at `exporter_port` scraped every
/// 100 ms, and the endpoints read from `endpoints_file`.
fn config(dir: &Path, exporter_port: u16, endpoints_file: &Path) -> String {
    let sample = std::fs::read_to_string(
        workspace_root().join("../shared/reference/llm-d-configs/sim-epp-gpu-config.yaml"),
    )
    .unwrap();
    let text = sample
        .replace("port: 9400", &format!("port: {exporter_port}"))
        .replace("interval: \"1s\"", "interval: \"100ms\"")
        .replacen(
            "\nplugins:\n",
            &format!(
                "\nplugins:\n- type: file-discovery\n  parameters: {{path: {}}}\n",
                endpoints_file.display()
            ),
            1,
        )
        .replace(
            "dataLayer:\n",
            "dataLayer:\n  discovery: {pluginRef: file-discovery}\n",
        );
    assert!(text.contains(&format!("port: {exporter_port}")), "{text}");
    let path = dir.join("gpu.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// llm-d's endpoints-file shape, naming each simulator's pod.
fn endpoints_file(dir: &Path, port: u16) -> std::path::PathBuf {
    let mut text = String::from("endpoints:\n");
    for (i, ip) in IPS.iter().enumerate() {
        text.push_str(&format!(
            "- name: gpu-{i}\n  namespace: default\n  address: {ip}\n  port: \"{port}\"\n"
        ));
    }
    let path = dir.join("endpoints.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Which pod served each of `n` requests.
async fn served(envoy_port: u16, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..n {
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "prompt": format!("request {i}"),
            "max_tokens": 1
        });
        let r = http::post_json(envoy_port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        out.push(r.header("x-inference-pod").unwrap().to_owned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_least_utilized_gpu() {
    let dir = scratch_dir("llm-d-gpu");
    let port = shared_loopback_port();
    let exporter_port = shared_loopback_port();
    let _models: Vec<Sim> = IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| start_sim_at(&dir, &format!("gpu-{i}"), ip, port, &[]))
        .collect();
    // GPU utilization 95 % (filtered out: > 90 %), 60 % and 20 %.
    let mut _exporters = Vec::new();
    for (i, (ip, util)) in IPS.iter().zip([95.0, 60.0, 20.0]).enumerate() {
        _exporters.push(start_sim_at(
            &dir,
            &format!("dcgm-{i}"),
            ip,
            exporter_port,
            &[],
        ));
        let gauges = serde_json::json!({"gauges": {"DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}": util}});
        let r = http::post_json_at(ip, exporter_port, "/admin/state", &gauges)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let file = endpoints_file(&dir, port);
    let config = config(&dir, exporter_port, &file);
    let epp = start_epp(&dir, &["--config-file", &config]);
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods = served(envoy.port, 8).await;
    assert!(pods.iter().all(|p| p == "gpu-2"), "{pods:?}");

    // The busiest GPU frees up and the idle one fills: routing follows.
    for (ip, util) in [(IPS[0], 5.0), (IPS[2], 99.0)] {
        let gauges = serde_json::json!({"gauges": {"DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}": util}});
        http::post_json_at(ip, exporter_port, "/admin/state", &gauges)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods = served(envoy.port, 8).await;
    assert!(pods.iter().all(|p| p == "gpu-0"), "{pods:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_exporter_it_loads_routes_and_warns_once() {
    let dir = scratch_dir("llm-d-no-gpu");
    let port = shared_loopback_port();
    let closed = shared_loopback_port();
    let _models: Vec<Sim> = IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| start_sim_at(&dir, &format!("gpu-{i}"), ip, port, &[]))
        .collect();
    let file = endpoints_file(&dir, port);
    let config = config(&dir, closed, &file);
    let mut epp = start_epp(&dir, &["--config-file", &config]);
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods = served(envoy.port, 9).await;
    let mut distinct = pods.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "no GPU signal: other scorers spread them: {pods:?}"
    );
    // Every model server stays fresh without its exporter.
    let (status, page) = http::get_blocking(epp.metrics_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        page.contains("inference_pool_ready_pods{name=\"epp-pool\"} 3"),
        "{page}"
    );
    let log = epp.proc.stop_and_collect_stderr(Duration::from_secs(40));
    assert_eq!(
        log.matches("auxiliary metrics source unavailable").count(),
        1,
        "one warning for the DCGM source:\n{log}"
    );
}

/// llm-d's `epp-burst-prefix-cache-config.yaml` (its vLLM `token-producer`
/// taken out: epp has no `/render` backend) through Envoy: two bursts of
/// identical prompts sent at once, each burst lands on one simulator, the
/// two on different ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_prompt_is_served_by_one_replica() {
    let dir = scratch_dir("llm-d-burst");
    let sample = std::fs::read_to_string(
        workspace_root()
            .join("../shared/reference/llm-d-configs/epp-burst-prefix-cache-config.yaml"),
    )
    .unwrap();
    let start = sample.find("  - type: token-producer").unwrap();
    let end = start
        + sample[start..]
            .find("  - type: single-profile-handler")
            .unwrap();
    let config = dir.join("burst.yaml");
    std::fs::write(&config, format!("{}{}", &sample[..start], &sample[end..])).unwrap();
    let stack_sims: Vec<Sim> = (0..3).map(|i| start_sim(&dir, i, &[])).collect();
    let endpoints = stack_sims
        .iter()
        .map(Sim::addr)
        .collect::<Vec<_>>()
        .join(",");
    let epp = start_epp(
        &dir,
        &[
            "--endpoints",
            &endpoints,
            "--config-file",
            config.to_str().unwrap(),
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Two prompts of 1,050 characters (4 blocks of 64 tokens), 4 copies
    // each, sent at once.
    let a = "rollout step A ".repeat(70);
    let b = "rollout step B ".repeat(70);
    let port = envoy.port;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8usize {
        let prompt = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move {
            let body = serde_json::json!({
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "prompt": prompt,
                "max_tokens": 1
            });
            let r = http::post_json(port, "/v1/completions", &body)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            (i, r.header("x-inference-pod").unwrap().to_owned())
        });
    }
    let mut pods = vec![String::new(); 8];
    while let Some(done) = tasks.join_next().await {
        let (i, pod) = done.unwrap();
        pods[i] = pod;
    }
    let (on_a, on_b): (Vec<_>, Vec<_>) = pods.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    assert!(on_a.iter().all(|(_, p)| *p == on_a[0].1), "{pods:?}");
    assert!(on_b.iter().all(|(_, p)| *p == on_b[0].1), "{pods:?}");
    assert_ne!(on_a[0].1, on_b[0].1, "{pods:?}");
}
