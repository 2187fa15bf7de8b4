//! Requests follow the load the simulators report.

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
};

fn chat(i: usize) -> serde_json::Value {
    serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": format!("unrelated question number {i}")}],
        "max_tokens": 4,
    })
}

async fn set_extra_waiting(port: u16, n: u32) {
    let r = http::post_json(
        port,
        "/admin/state",
        &serde_json::json!({"extra_waiting": n}),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "admin call failed: {}", r.text());
}

/// Sends `n` requests one after another; returns how many each simulator served.
async fn serve_counts(stack: &Stack, n: usize) -> Vec<usize> {
    let mut counts = vec![0; stack.sims.len()];
    for i in 0..n {
        let r = http::post_json(stack.envoy.port, "/v1/chat/completions", &chat(i))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "request {i} failed: {}", r.text());
        let pod = r.header("x-inference-pod").expect("simulator names itself");
        counts[stack.sim_index(pod).expect("known simulator")] += 1;
    }
    counts
}

async fn avoids_the_busy_simulator(mode: BodyMode) {
    let stack = Stack::start("avoid-busy", 3, &[], &[], mode);
    set_extra_waiting(stack.sims[0].port, 50).await;
    // Two scrape intervals are 100 ms; leave room for a slow CI machine.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counts = serve_counts(&stack, 30).await;
    assert_eq!(counts[0], 0, "the busy simulator got traffic: {counts:?}");
    assert!(
        counts[1] > 0 && counts[2] > 0,
        "idle simulators share the load: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_avoid_a_simulator_reporting_a_long_queue_buffered() {
    avoids_the_busy_simulator(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_avoid_a_simulator_reporting_a_long_queue_streamed() {
    avoids_the_busy_simulator(BodyMode::Streamed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_the_busy_simulator_switches_routing_within_a_second() {
    let stack = Stack::start("switch-busy", 2, &[], &[], BodyMode::Streamed);
    set_extra_waiting(stack.sims[0].port, 50).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = serve_counts(&stack, 10).await;
    assert_eq!(before, vec![0, 10], "sim-0 is busy: {before:?}");

    set_extra_waiting(stack.sims[0].port, 0).await;
    set_extra_waiting(stack.sims[1].port, 50).await;
    // The requirement: within one second of the switch, routing has followed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = serve_counts(&stack, 10).await;
    assert_eq!(after, vec![10, 0], "sim-1 is busy now: {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_less_requests_are_routed_too() {
    let stack = Stack::start("get-models", 2, &[], &[], BodyMode::Buffered);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = http::send(stack.envoy.port, "GET", "/v1/models", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["data"].is_array(), "{}", r.text());
}
