//! Routing by learned latency through Envoy: of two servers that differ only
//! in speed, the faster one is found and preferred.

use epp_test_support::{
    http,
    process::{BodyMode, scratch_dir, start_envoy, start_epp, start_sim, workspace_root},
};

/// Sends `n` streamed completions one after another; returns how many each
/// simulator served.
async fn serve(envoy_port: u16, n: usize, offset: usize) -> [usize; 2] {
    let mut served = [0; 2];
    for i in 0..n {
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "prompt": format!("request {} ", i + offset).repeat(40),
            "max_tokens": 4,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let r = http::post_json(envoy_port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let pod = r.header("x-inference-pod").unwrap();
        served[usize::from(pod == "sim-1")] += 1;
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_faster_of_two_servers_wins_once_learned() {
    let dir = scratch_dir("latency");
    // The same model server, one with a four times slower prefill.
    let fast = start_sim(&dir, 0, &["--ttft-ms", "15"]);
    let slow = start_sim(&dir, 1, &["--ttft-ms", "60"]);
    let config = workspace_root().join("examples/configs/predicted-latency.yaml");
    let endpoints = format!("{},{}", fast.addr(), slow.addr());
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

    // Learning: until each endpoint's model has its samples, the
    // heuristic blend spreads the requests.
    let learning = serve(envoy.port, 90, 0).await;
    assert!(learning[1] > 0, "both servers were tried: {learning:?}");
    let learned = serve(envoy.port, 30, 1000).await;
    eprintln!("served while learning {learning:?}, once learned {learned:?}");
    assert!(learned[0] >= 28, "the faster server wins: {learned:?}");

    let metrics = http::send(epp.metrics_port, "GET", "/metrics", &[], &b""[..])
        .await
        .unwrap()
        .text();
    for series in [
        "epp_latency_prediction_relative_error_bucket{le=\"0.25\",endpoint=\"",
        "epp_latency_model_samples_total{endpoint=\"fleet\",latency=\"ttft\"}",
        "epp_latency_model_warm{endpoint=\"",
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from:\n{metrics}"
        );
    }
}
