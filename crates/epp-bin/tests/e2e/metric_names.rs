//! The three generations of metric names after real traffic through Envoy:
//! plain and streamed responses (streamed with `include_usage`), and a
//! rewritten model.

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
    wait::poll,
};

/// The largest value among the samples of `name` (any labels), or `None`
/// when the page has none.
fn largest(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

/// The sum of the samples of `name` (any labels).
fn sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every EPP metric of the seed's list (the first reference releases'
/// names), and whether it must have counted something after traffic
/// (gauges such as running requests are back to 0 once responses ended).
const SEED: &[(&str, bool)] = &[
    ("inference_model_request_total", true),
    ("inference_model_request_error_total", true),
    ("inference_model_request_duration_seconds_count", true),
    ("normalized_time_per_output_token_seconds_count", true),
    ("inference_model_request_sizes_count", true),
    ("inference_model_response_sizes_count", true),
    ("inference_model_input_tokens_count", true),
    ("inference_model_output_tokens_count", true),
    ("inference_model_running_requests", false),
    ("inference_pool_average_kv_cache_utilization", false),
    ("inference_pool_average_queue_size", false),
    ("inference_pool_per_pod_queue_size", false),
    ("inference_pool_ready_pods", true),
    ("inference_extension_info", true),
];

/// What llm-d has that the seed's list lacks, fed by the same traffic
/// (flow control's are checked in `flow_control.rs`, with it on).
const LLM_D: &[(&str, bool)] = &[
    ("llm_d_epp_request_total", true),
    ("llm_d_epp_request_error_total", true),
    ("llm_d_epp_request_duration_seconds_count", true),
    ("llm_d_epp_request_ttft_seconds_count", true),
    ("llm_d_epp_request_streaming_tpot_seconds_count", true),
    ("llm_d_epp_request_streaming_itl_seconds_count", true),
    ("llm_d_epp_request_cached_tokens_count", true),
    ("llm_d_epp_request_ntpot_seconds_count", true),
    ("llm_d_epp_request_running", false),
    ("llm_d_epp_scheduler_attempts_total", true),
    ("llm_d_epp_scheduler_e2e_duration_seconds_count", true),
    ("llm_d_epp_plugin_duration_seconds_count", true),
    ("llm_d_epp_model_rewrite_decisions_total", true),
    ("llm_d_epp_ready_endpoints", true),
    ("llm_d_epp_average_running_requests", false),
    ("llm_d_epp_std_dev_kv_cache_utilization", false),
    ("llm_d_epp_per_endpoint_queue_size", false),
    ("llm_d_epp_info", true),
    ("llm_d_epp_request_processing_duration_seconds_count", true),
    ("llm_d_epp_response_processing_duration_seconds_count", true),
    ("llm_d_epp_extproc_streams_inflight", false),
    ("llm_d_epp_extproc_stream_duration_seconds_count", true),
    ("llm_d_epp_extproc_streams_total", true),
    ("inference_objective_request_total", true),
    ("inference_objective_prompt_cached_tokens_count", true),
    ("inference_extension_scheduler_attempts_total", true),
    ("inference_extension_prefix_indexer_hit_ratio_count", true),
    ("inference_extension_prefix_indexer_hit_bytes_count", true),
    ("inference_extension_prefix_indexer_size", true),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generation_of_names_is_served_with_data_after_traffic() {
    let stack = Stack::start(
        "metric-names",
        2,
        // 10 ms between tokens: a streamed response reaches epp in several
        // body chunks (inter-token latency), even on a loaded machine.
        &["--itl-ms", "10", "--ttft-ms", "5"],
        &["--pool-name", "names-pool"],
        BodyMode::Streamed,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let model = "meta-llama/Llama-3.1-8B-Instruct";
    let prompt =
        "the same long system prompt, again and again, so the server caches it. ".repeat(8);
    for i in 0..3 {
        // Plain.
        let body =
            serde_json::json!({"model": model, "prompt": format!("{prompt}{i}"), "max_tokens": 4});
        let r = http::post_json(stack.envoy.port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        // Streamed, with the usage chunk.
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": format!("{prompt}{i}")}],
            "max_tokens": 8,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let r = http::post_json(stack.envoy.port, "/v1/chat/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("\"usage\""), "{}", r.text());
    }
    // A rewritten model, and a refused request (no model: 400).
    let r = http::send(
        stack.envoy.port,
        "POST",
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-model-name-rewrite", model),
        ],
        serde_json::json!({"model": "chat", "prompt": "hi", "max_tokens": 2}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http::post_json(
        stack.envoy.port,
        "/v1/completions",
        &serde_json::json!({"prompt": "no model"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());

    let (status, page) = http::get_blocking(stack.epp.metrics_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    for (name, counted) in SEED.iter().chain(LLM_D) {
        let v = largest(&page, name).unwrap_or_else(|| panic!("no {name} in\n{page}"));
        if *counted {
            assert!(v > 0.0, "{name} served but never counted ({v}) in\n{page}");
        }
    }
    // The seed's labels.
    for sample in [
        format!("inference_model_request_total{{model_name=\"{model}\",target_model_name=\"{model}\"}} 6"),
        format!("inference_model_request_total{{model_name=\"chat\",target_model_name=\"{model}\"}} 1"),
        "inference_model_request_error_total{model_name=\"\",target_model_name=\"\",error_code=\"BadRequest\"} 1".to_owned(),
        format!("inference_model_running_requests{{model_name=\"{model}\"}} 0"),
        "inference_pool_ready_pods{name=\"names-pool\"} 2".to_owned(),
        format!("llm_d_epp_model_rewrite_decisions_total{{model_rewrite_name=\"header\",model_name=\"chat\",target_model=\"{model}\"}} 1"),
    ] {
        assert!(page.contains(&sample), "missing {sample} in\n{page}");
    }
    // Eight requests, one stream each, every one decided (routed or
    // refused); the seven routed ones had a response, counted when their
    // stream ends (Envoy closes it just after the response).
    let page = poll("every ext_proc stream ended", 100, || async {
        let (_, page) = http::get_blocking(stack.epp.metrics_port, "/metrics").ok()?;
        (sum(&page, "llm_d_epp_extproc_streams_total") == 8.0).then_some(page)
    })
    .await;
    for (name, want) in [
        ("llm_d_epp_extproc_streams_inflight", 0.0),
        ("llm_d_epp_request_processing_duration_seconds_count", 8.0),
        ("llm_d_epp_response_processing_duration_seconds_count", 7.0),
    ] {
        assert_eq!(sum(&page, name), want, "{name} in\n{page}");
    }
    // Three streamed responses: their first tokens, and the gaps between
    // their chunks.
    let streamed_ttft = format!(
        "llm_d_epp_request_ttft_seconds_count{{model_name=\"{model}\",target_model_name=\"{model}\",fairness_id=\"default-flow\",priority=\"0\",streaming=\"true\"}} 3"
    );
    assert!(
        page.contains(&streamed_ttft),
        "missing {streamed_ttft} in\n{page}"
    );
    assert!(
        page.lines()
            .any(|l| l.starts_with("inference_extension_info{commit=\"") && l.ends_with(" 1")),
        "{page}"
    );
}
