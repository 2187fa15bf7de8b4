//! Objectives from the config: `x-gateway-inference-objective` → priority;
//! sheddable (negative priority) requests get 429 while the pool is saturated.

use epp_test_support::{
    http,
    process::{BodyMode, Stack, sim_admin},
    wait::poll,
};

const CONFIG: &str = "objectives:\n- {name: batch, priority: -1}\n- {name: live, priority: 10}\n";

async fn send(stack: &Stack, objective: Option<&str>) -> http::Response {
    let header = objective.map(|o| ("x-gateway-inference-objective", o));
    http::post_hello(stack.envoy.port, header).await.unwrap()
}

async fn sheddable_requests_get_429_when_saturated(mode: BodyMode) {
    let stack = Stack::start("objectives", 2, &[], &["--config-text", CONFIG], mode);
    // Idle pool: even sheddable requests are served.
    poll("a served batch request", 100, || async {
        (send(&stack, Some("batch")).await.status == 200).then_some(())
    })
    .await;

    // Queues far above the utilization detector's threshold (5).
    for sim in &stack.sims {
        sim_admin(sim.port, serde_json::json!({"extra_waiting": 40})).await;
    }
    let shed = poll("batch shed with 429", 100, || async {
        let r = send(&stack, Some("batch")).await;
        (r.status == 429).then_some(r)
    })
    .await;
    assert_eq!(
        shed.json()["error"]["type"],
        "ResourceExhausted",
        "{}",
        shed.text()
    );
    // Non-sheddable requests still go through: a declared positive priority,
    // an unknown objective and no objective all count as priority >= 0.
    for objective in [Some("live"), Some("not-declared"), None] {
        let r = send(&stack, objective).await;
        assert_eq!(r.status, 200, "{objective:?}: {}", r.text());
    }

    for sim in &stack.sims {
        sim_admin(sim.port, serde_json::json!({"extra_waiting": 0})).await;
    }
    poll("batch served again", 100, || async {
        (send(&stack, Some("batch")).await.status == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_requests_get_429_when_saturated_buffered() {
    sheddable_requests_get_429_when_saturated(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_requests_get_429_when_saturated_streamed() {
    sheddable_requests_get_429_when_saturated(BodyMode::Streamed).await;
}
