//! Graceful shutdown: on SIGTERM health turns NOT_SERVING first, a response
//! still streaming completes within the grace period, then epp exits 0.

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use epp_test_support::{
    http,
    process::{BodyMode, Stack, sim_admin},
    wait::poll,
};

async fn health(port: u16) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let r = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "readiness".into(),
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
        &["--shutdown-grace-period", "60s"],
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
