//! Routing by learned latency through Envoy: of two servers that differ only
//! in speed, the faster one is found and preferred.

use epp_test_support::{
    http,
    process::{BodyMode, scratch_dir, start_envoy, start_epp, start_sim, workspace_root},
};

/// Sends `n` streamed completions one after another; returns how many each
/// simulator served.
async fn serve(envoy_port: u16, n: usize, offset: usize) -> [usize; 2] {
    serve_with(envoy_port, n, offset, &[]).await
}

/// [`serve`], each request with `headers` too.
async fn serve_with(
    envoy_port: u16,
    n: usize,
    offset: usize,
    headers: &[(&str, &str)],
) -> [usize; 2] {
    let mut served = [0; 2];
    for i in 0..n {
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "prompt": format!("request {} ", i + offset).repeat(40),
            "max_tokens": 4,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        let r = http::send(
            envoy_port,
            "POST",
            "/v1/completions",
            &all,
            body.to_string(),
        )
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

    // Three requests stating a TTFT objective no server meets and a TPOT
    // one every server meets.
    let objectives = [
        ("x-llm-d-slo-ttft-ms", "1"),
        ("x-llm-d-slo-tpot-ms", "10000"),
    ];
    serve_with(envoy.port, 3, 2000, &objectives).await;

    let metrics = http::send(epp.metrics_port, "GET", "/metrics", &[], &b""[..])
        .await
        .unwrap()
        .text();
    // Each server's speed against the fleet's model, which learned mostly
    // from the fast one: the slow one's, which scaled the fleet's
    // predictions for it while its own model was not warm, is well above
    // (about 1.4 against 1.0 here: the fleet's model learned from both, and
    // the ratio is pulled towards 1 by two samples of no difference; 1.0
    // unscaled, and 1.15 when it was kept against the fleet's model as it
    // was at each sample).
    // The value of the series whose line starts with `series`.
    let value = |series: &str| {
        let line = metrics.lines().find(|l| l.starts_with(series));
        let value = line.and_then(|l| l[series.len()..].trim().parse::<f64>().ok());
        value.unwrap_or_else(|| panic!("{series} missing from:\n{metrics}"))
    };
    let ratio = |addr: String| {
        value(&format!(
            "epp_latency_model_fleet_ratio{{endpoint=\"{addr}\",latency=\"ttft\"}} "
        ))
    };
    let (fast_ratio, slow_ratio) = (ratio(fast.addr()), ratio(slow.addr()));
    assert!(
        slow_ratio > 1.25 * fast_ratio,
        "fleet ratios: fast {fast_ratio}, slow {slow_ratio}"
    );
    // llm-d's per-model series: every response once the models predicted
    // was routed by a prediction; the three objectives were missed for
    // TTFT, never for TPOT.
    let model = "meta-llama/Llama-3.1-8B-Instruct";
    let plugin =
        "plugin_name=\"predicted-latency-producer\",plugin_type=\"predicted-latency-producer\"";
    let models = format!("model_name=\"{model}\",target_model_name=\"{model}\"");
    let predicted = value(&format!(
        "llm_d_epp_request_predicted_ttft_seconds_count{{{plugin},{models}}} "
    ));
    assert!(
        (33.0..=123.0).contains(&predicted),
        "responses routed by a prediction: {predicted}"
    );
    let violations =
        format!("llm_d_epp_request_slo_violation_total{{{plugin},{models},type=\"ttft\"}} ");
    assert_eq!(value(&violations), 3.0);
    let deprecated =
        format!("inference_objective_request_slo_violation_total{{{models},type=\"ttft\"}} ");
    assert_eq!(value(&deprecated), 3.0);
    let tpot_violations = metrics
        .lines()
        .filter(|l| l.contains("slo_violation_total{") && l.contains("type=\"tpot\""));
    assert_eq!(tpot_violations.count(), 0, "no TPOT objective was missed");
    let last = format!(
        "llm_d_epp_inference_request_metric{{{plugin},{models},type=\"tpot_slo_violation\"}} "
    );
    assert_eq!(value(&last), 0.0);
    let durations =
        format!("llm_d_epp_request_ttft_prediction_duration_seconds_count{{{plugin},{models}}} ");
    assert!(
        value(&durations) >= predicted,
        "a prediction per routed request"
    );
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
