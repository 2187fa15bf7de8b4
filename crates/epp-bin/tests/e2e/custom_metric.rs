//! Scheduling on any Prometheus metric, configured from YAML alone.

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Stack, workspace_root},
};

async fn set_gauge(port: u16, value: f64) {
    let body = serde_json::json!({"gauges": {"gpu_temperature_celsius{gpu=\"0\"}": value}});
    let r = http::post_json(port, "/admin/state", &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

async fn counts(stack: &Stack, model: &str, n: usize) -> Vec<usize> {
    let mut counts = vec![0; stack.sims.len()];
    for i in 0..n {
        let body = serde_json::json!({"model": model, "prompt": format!("p{i}"), "max_tokens": 1});
        let r = http::post_json(stack.envoy.port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        counts[stack
            .sim_index(r.header("x-inference-pod").unwrap())
            .unwrap()] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_follows_a_custom_gauge() {
    let config = workspace_root().join("examples/configs/gpu-temperature.yaml");
    let config = config.to_str().unwrap();
    let stack = Stack::start(
        "custom-gauge",
        3,
        &[],
        &["--config-file", config],
        BodyMode::Streamed,
    );
    for (sim, temp) in stack.sims.iter().zip([85.0, 45.0, 60.0]) {
        set_gauge(sim.port, temp).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let model = "meta-llama/Llama-3.1-8B-Instruct";
    assert_eq!(
        counts(&stack, model, 10).await,
        vec![0, 10, 0],
        "coolest GPU wins"
    );

    set_gauge(stack.sims[1].port, 88.0).await;
    set_gauge(stack.sims[2].port, 41.0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        counts(&stack, model, 10).await,
        vec![0, 0, 10],
        "routing follows the gauge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_custom_metric_example_runs_unchanged() {
    let config = workspace_root().join("examples/configs/custom-metric-seed.yaml");
    let config = config.to_str().unwrap();
    let stack = Stack::start(
        "custom-seed",
        2,
        &["--model", "llama-3-8b"],
        &["--config-file", config],
        BodyMode::Buffered,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let served = counts(&stack, "llama-3-8b", 6).await;
    assert_eq!(served.iter().sum::<usize>(), 6);
}

/// `epp --check-config` on `text`: whether it loaded, and what it printed.
fn check_config(tag: &str, text: &str) -> (bool, String) {
    let dir = epp_test_support::process::scratch_dir(tag);
    let path = dir.join("epp.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(epp_test_support::process::workspace_bin("epp"))
        .args(["--check-config", "--config-file", path.to_str().unwrap()])
        .output()
        .unwrap();
    let printed =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), printed)
}

#[test]
fn a_metric_scorer_whose_metric_no_extractor_fills_is_a_config_error() {
    let scorer_only = "\
plugins:
- type: metric-scorer
  parameters: {metricName: gpu_temperature_celsius, optimizationMode: Minimize}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: metric-scorer
";
    let (ok, printed) = check_config("metric-scorer-unfed", scorer_only);
    assert!(!ok, "loaded: {printed}");
    assert!(
        printed.contains("epp.yaml:3:3: plugins[0].parameters")
            && printed.contains("\"gpu_temperature_celsius\"")
            && printed.contains("metric-scorer"),
        "{printed}"
    );
    // The same with an extractor filling it: loads.
    let fed = scorer_only.replace(
        "schedulingProfiles:",
        "- type: metrics-data-source
- type: core-metrics-extractor
- type: prometheus-metric
  name: gpu-temp
  parameters: {metricName: gpu_temperature_celsius}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
    - pluginRef: gpu-temp
schedulingProfiles:",
    );
    let (ok, printed) = check_config("metric-scorer-fed", &fed);
    assert!(ok, "{printed}");
}
