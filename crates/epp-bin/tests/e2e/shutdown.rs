//! Graceful shutdown: on SIGTERM health turns NOT_SERVING first; for the
//! drain timeout ext_proc still takes new requests; then a response still
//! streaming completes within the grace period, and epp exits 0.

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use epp_test_support::{
    http,
    process::{BodyMode, Stack, sim_admin},
    wait::poll,
};

async fn health(port: u16) -> Option<ServingStatus> {
    health_of(port, "readiness").await
}

async fn health_of(port: u16, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let r = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .ok()?;
    Some(r.into_inner().status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_in_flight_stream_then_exits_0() {
    let mut stack = Stack::start(
        "shutdown",
        1,
        &["--itl-ms", "5", "--ttft-ms", "5"],
        &["--shutdown-grace-period", "60s", "--drain-timeout", "0s"],
        BodyMode::Streamed,
    );
    poll("readiness SERVING", 100, || async {
        (health(stack.epp.health_port).await == Some(ServingStatus::Serving)).then_some(())
    })
    .await;

    // The model server stops stepping: the request is routed and stays in
    // flight until we let it go.
    sim_admin(stack.sims[0].port, serde_json::json!({"stall": true})).await;
    let port = stack.envoy.port;
    let request = tokio::spawn(async move {
        let body = serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": [{"role": "user", "content": "a long answer please"}],
            "max_tokens": 30,
            "stream": true,
        });
        http::post_json(port, "/v1/chat/completions", &body).await
    });
    let metrics = stack.epp.metrics_port;
    poll("the request in flight", 200, || async {
        let (_, text) = http::get_blocking(metrics, "/metrics").ok()?;
        text.lines()
            .any(|l| l.starts_with("inference_objective_running_requests{") && l.ends_with(" 1"))
            .then_some(())
    })
    .await;

    stack.epp.proc.signal_term();
    poll("readiness NOT_SERVING after SIGTERM", 200, || async {
        (health(stack.epp.health_port).await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await;
    assert!(
        !request.is_finished(),
        "the stalled stream is still in flight"
    );
    assert_eq!(stack.epp.proc.exited(), None, "epp waits for the stream");

    // The model server resumes: the stream completes through the draining epp.
    sim_admin(stack.sims[0].port, serde_json::json!({"stall": false})).await;
    let r = request.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let tokens = text
        .lines()
        .filter(|l| l.starts_with("data: {") && l.contains("\"content\""))
        .count();
    assert!(tokens >= 30, "{tokens} content events: {text}");

    let code = poll("epp to exit", 400, || {
        let code = stack.epp.proc.exited();
        async move { code }
    })
    .await;
    assert_eq!(code, Some(0), "epp exits 0 after draining");
}

/// The reference's drain: after SIGTERM, readiness is NOT_SERVING (so Envoy
/// and Kubernetes stop sending) but a request that still arrives is routed;
/// liveness holds; after the drain timeout epp exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_serving_new_requests_for_the_drain_timeout() {
    let mut stack = Stack::start(
        "drain",
        1,
        &[],
        &["--drain-timeout", "5s", "--shutdown-grace-period", "1s"],
        BodyMode::Buffered,
    );
    poll("readiness SERVING", 100, || async {
        (health(stack.epp.health_port).await == Some(ServingStatus::Serving)).then_some(())
    })
    .await;
    let r = http::post_hello(stack.envoy.port, None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    stack.epp.proc.signal_term();
    poll("readiness NOT_SERVING after SIGTERM", 200, || async {
        (health(stack.epp.health_port).await == Some(ServingStatus::NotServing)).then_some(())
    })
    .await;
    // A new request (a new ext_proc stream) during the drain is still routed.
    let r = http::post_hello(stack.envoy.port, None).await.unwrap();
    assert_eq!(r.status, 200, "routed during the drain: {}", r.text());
    assert_eq!(r.header("x-inference-pod"), Some("sim-0"));
    assert_eq!(
        health_of(stack.epp.health_port, "liveness").await,
        Some(ServingStatus::Serving),
        "alive while draining"
    );
    assert_eq!(stack.epp.proc.exited(), None, "still draining");

    let code = poll("epp to exit after the drain", 400, || {
        let code = stack.epp.proc.exited();
        async move { code }
    })
    .await;
    assert_eq!(code, Some(0), "epp exits 0 after draining");
    let log = std::fs::read_to_string(stack.dir.join("epp.stderr")).unwrap();
    assert!(log.contains("drain over"), "{log}");
}
