//! Streaming responses make it through the whole path, chunk by chunk.

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
};

async fn streams_through(mode: BodyMode) {
    // 20 tokens at 10 ms each: the response must arrive in several chunks.
    let stack = Stack::start(
        "stream",
        2,
        &["--itl-ms", "10", "--ttft-ms", "5"],
        &[],
        mode,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "count to twenty"}],
        "max_tokens": 20,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let r = http::post_json(stack.envoy.port, "/v1/chat/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .unwrap_or_default()
            .contains("text/event-stream"),
        "{:?}",
        r.headers
    );
    let text = r.text();
    let events: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    assert!(events.len() >= 20, "one event per token at least: {text}");
    let usage = events
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l[6..]).ok())
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 20, "{usage}");
    if mode == BodyMode::Streamed {
        // Tokens were not buffered up: they arrived spread over time.
        assert!(r.chunks.len() > 2, "got {} chunk(s)", r.chunks.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_works_through_envoy_streamed() {
    streams_through(BodyMode::Streamed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_works_through_envoy_buffered() {
    streams_through(BodyMode::Buffered).await;
}
