//! llm-d's `inflight-load-producer` through the real Envoy: while a streamed
//! answer is still coming, the endpoint's in-flight load (as the decision
//! view shows it) holds the request and its estimated output, and no longer
//! its prompt; without the plugin it holds the prompt until the end.

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Stack, wait_scraped},
};
use serde_json::{Value, json};

fn config(producer: &str) -> String {
    format!(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
{producer}- type: token-load-scorer
  parameters: {{inFlightLoadProducerName: inflight-load}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: token-load-scorer
  - pluginRef: max-score-picker
"
    )
}

/// The one endpoint's in-flight (requests, tokens) halfway through a
/// streamed answer of 10 tokens at 150 ms each, and once it ended.
async fn load_mid_stream_and_after(producer: &str) -> ((u64, u64), (u64, u64)) {
    let stack = Stack::start(
        "inflight-load",
        1,
        &["--itl-ms", "150", "--ttft-ms", "5"],
        &["--config-text", &config(producer)],
        BodyMode::Streamed,
    );
    let addrs: Vec<String> = stack.sims.iter().map(|s| s.addr()).collect();
    wait_scraped(stack.epp.metrics_port, &addrs);
    let metrics_port = stack.epp.metrics_port;
    let inflight = || async move {
        let r = http::send(metrics_port, "GET", "/debug/decisions.json", &[], "")
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        let e = &v["endpoints"][0];
        (
            e["inflight_requests"].as_u64().unwrap(),
            e["inflight_tokens"].as_u64().unwrap(),
        )
    };
    let body = json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        // About 100 tokens of prompt as epp estimates them.
        "messages": [{"role": "user", "content": "count slowly ".repeat(32)}],
        "max_tokens": 10,
        "stream": true,
    });
    let port = stack.envoy.port;
    let answer =
        tokio::spawn(async move { http::post_json(port, "/v1/chat/completions", &body).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mid = inflight().await;
    let r = answer.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("data: [DONE]"), "{}", r.text());
    // The counts are released as the response ends at epp, just after.
    let mut after = inflight().await;
    for _ in 0..50 {
        if after == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = inflight().await;
    }
    (mid, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_d_producer_counts_the_output_estimate_not_the_prompt_once_streaming() {
    let (mid, after) = load_mid_stream_and_after(
        "- type: inflight-load-producer
  name: inflight-load
  parameters: {addEstimatedOutputTokens: true}
",
    )
    .await;
    // 1.5 × ~100 prompt tokens, capped by the request's max_tokens.
    assert_eq!(mid, (1, 10), "the request and its estimated output");
    assert_eq!(after, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_it_the_prompt_counts_until_the_answer_ends() {
    let (mid, after) = load_mid_stream_and_after("").await;
    assert_eq!(mid.0, 1);
    assert!(mid.1 > 50, "the prompt's ~100 tokens still count: {mid:?}");
    assert_eq!(after, (0, 0));
}
