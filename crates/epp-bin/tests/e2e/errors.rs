//! Errors a client sees from epp through Envoy.

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Epp, Stack, scratch_dir, start_envoy, start_epp},
};

async fn malformed_bodies_get_400(mode: BodyMode) {
    let stack = Stack::start("bad-body", 1, &[], &[], mode);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let port = stack.envoy.port;

    let r = http::send(
        port,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        "{not json",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"].is_string(), "{}", r.text());

    let r = http::post_json(
        port,
        "/v1/completions",
        &serde_json::json!({"prompt": "hi"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("model not found in request body"),
        "{}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_400_buffered() {
    malformed_bodies_get_400(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_400_streamed() {
    malformed_bodies_get_400(BodyMode::Streamed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoints_gets_503() {
    let dir = scratch_dir("no-endpoints");
    let epp: Epp = start_epp(&dir, &[]);
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    let body = serde_json::json!({"model": "m", "prompt": "hello"});
    let r = http::post_json(envoy.port, "/v1/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
}
