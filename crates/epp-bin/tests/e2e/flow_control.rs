//! Flow control through real Envoy: with the `flowControl` gate on, a
//! request that arrives while the pool is saturated waits in epp (Envoy's
//! ext_proc `message_timeout` is long enough) and is served once the pool
//! frees; a full queue answers 429, a request past its TTL 503, and a
//! client that gives up leaves the queue at once (counted).

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Stack, sim_admin},
    wait::poll,
};

fn config(flow: &str) -> String {
    format!(
        "featureGates: [flowControl]\nobjectives:\n- {{name: batch, priority: -1}}\n\
         flowControl:\n{flow}"
    )
}

/// Sets every simulator's waiting queue and waits until epp has scraped it
/// (40 is far above the utilization detector's threshold of 5: saturated).
async fn saturate(stack: &Stack, waiting: u64) {
    for sim in &stack.sims {
        sim_admin(sim.port, serde_json::json!({"extra_waiting": waiting})).await;
    }
    let want = waiting as f64;
    poll("epp scraped the new queue lengths", 200, || async {
        let avg = http::metric_sum(
            stack.epp.metrics_port,
            "inference_pool_average_queue_size",
            &[],
        )
        .await;
        ((avg - want).abs() < 0.5).then_some(())
    })
    .await;
}

async fn hello(stack: &Stack, fairness: &str) -> http::Response {
    http::post_hello(
        stack.envoy.port,
        Some(("x-gateway-inference-fairness-id", fairness)),
    )
    .await
    .unwrap()
}

const QUEUE: &str = "inference_extension_flow_control_queue_size";
const WAITED: &str = "inference_extension_flow_control_request_queue_duration_seconds_count";
const REQUESTS: &str = "llm_d_epp_flow_control_requests_total";
const ENQUEUED: &str = "llm_d_epp_flow_control_request_enqueue_duration_seconds_count";

/// Whether the page has a sample of `name` (any labels, any value).
async fn served(stack: &Stack, name: &str) -> bool {
    let r = http::send(stack.epp.metrics_port, "GET", "/metrics", &[], "")
        .await
        .unwrap();
    r.text()
        .lines()
        .any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
}

async fn a_queued_request_is_served_when_the_pool_frees(mode: BodyMode) {
    let cfg = config("  defaultRequestTTL: 60s\n");
    let stack = Stack::start("flow-served", 2, &[], &["--config-text", &cfg], mode);
    // Unsaturated: straight through, counted as dispatched.
    assert_eq!(hello(&stack, "tenant-a").await.status, 200);
    saturate(&stack, 40).await;
    // Wait until epp sees the saturation (a request queues).
    let port = stack.envoy.port;
    let queued = tokio::spawn(async move {
        http::post_hello(port, Some(("x-gateway-inference-fairness-id", "tenant-a")))
            .await
            .unwrap()
    });
    poll("the request queued in epp", 200, || async {
        (http::metric_sum(stack.epp.metrics_port, QUEUE, &["fairness_id=\"tenant-a\""]).await
            == 1.0)
            .then_some(())
    })
    .await;
    // Several seconds in the queue: still waiting, still held by Envoy.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !queued.is_finished(),
        "answered while the pool was saturated"
    );
    assert_eq!(
        http::metric_sum(stack.epp.metrics_port, QUEUE, &["fairness_id=\"tenant-a\""]).await,
        1.0
    );
    // What dispatch is gated by, read while the request waits: the pool is
    // saturated (40 waiting against a threshold of 5), and the default band
    // holds one request of its 5,000.
    for prefix in ["inference_extension", "llm_d_epp"] {
        let saturation = http::metric_sum(
            stack.epp.metrics_port,
            &format!("{prefix}_flow_control_pool_saturation"),
            &["inference_pool=\"epp-pool\"", "stage=\"effective\""],
        )
        .await;
        assert!(saturation >= 1.0, "{prefix}: saturation {saturation}");
    }
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            "llm_d_epp_flow_control_capacity_utilization_requests",
            &["priority=\"0\""]
        )
        .await,
        1.0 / 5000.0
    );
    assert!(served(&stack, "llm_d_epp_flow_control_capacity_utilization_bytes").await);
    assert!(
        served(
            &stack,
            "llm_d_epp_flow_control_stale_endpoints{detector=\"utilization-detector\"}"
        )
        .await
    );
    // No global limit configured: no global series.
    assert!(
        !served(
            &stack,
            "llm_d_epp_flow_control_global_capacity_utilization_requests"
        )
        .await
    );

    saturate(&stack, 0).await;
    let r = queued.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        http::metric_sum(stack.epp.metrics_port, QUEUE, &[]).await,
        0.0
    );
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            WAITED,
            &["fairness_id=\"tenant-a\"", "outcome=\"Dispatched\""]
        )
        .await,
        2.0
    );
    // Both were enqueued (and not refused), both dispatched, each through
    // dispatch cycles.
    for prefix in ["inference_extension", "llm_d_epp"] {
        let enqueued = http::metric_sum(
            stack.epp.metrics_port,
            &format!("{prefix}_flow_control_request_enqueue_duration_seconds_count"),
            &["fairness_id=\"tenant-a\"", "outcome=\"NotYetFinalized\""],
        )
        .await;
        assert_eq!(enqueued, 2.0, "{prefix}");
        let cycles = http::metric_sum(
            stack.epp.metrics_port,
            &format!("{prefix}_flow_control_dispatch_cycle_duration_seconds_count"),
            &[],
        )
        .await;
        assert!(cycles >= 2.0, "{prefix}: {cycles} dispatch cycles");
    }
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            REQUESTS,
            &[
                "outcome=\"Dispatched\"",
                "priority=\"0\"",
                "inference_pool=\"epp-pool\""
            ]
        )
        .await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_is_served_when_the_pool_frees_buffered() {
    a_queued_request_is_served_when_the_pool_frees(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_is_served_when_the_pool_frees_streamed() {
    a_queued_request_is_served_when_the_pool_frees(BodyMode::Streamed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_ttl_gets_503() {
    let cfg = config("  defaultRequestTTL: 1s\n");
    let stack = Stack::start(
        "flow-ttl",
        2,
        &[],
        &["--config-text", &cfg],
        BodyMode::Buffered,
    );
    saturate(&stack, 40).await;
    let r = poll("a request evicted by its TTL", 100, || async {
        let r = hello(&stack, "t").await;
        (r.status == 503).then_some(r)
    })
    .await;
    let body = r.json();
    assert_eq!(body["error"]["type"], "ServiceUnavailable", "{}", r.text());
    assert_eq!(
        body["error"]["message"],
        "flow control: the request timed out waiting in the queue"
    );
    assert_eq!(
        r.header("x-llm-d-request-dropped-reason"),
        Some("rejected-ttl-expired")
    );
    assert!(
        http::metric_sum(stack.epp.metrics_port, WAITED, &["outcome=\"EvictedTTL\""]).await >= 1.0
    );
    assert_eq!(
        http::metric_sum(stack.epp.metrics_port, QUEUE, &[]).await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_band_answers_429_and_the_others_still_queue() {
    // The sheddable band holds one request; the default band is unbounded.
    let cfg =
        config("  defaultRequestTTL: 60s\n  priorityBands:\n  - {priority: -1, maxRequests: 1}\n");
    let stack = Stack::start(
        "flow-capacity",
        2,
        &[],
        &["--config-text", &cfg],
        BodyMode::Buffered,
    );
    saturate(&stack, 40).await;
    let port = stack.envoy.port;
    let batch = ("x-gateway-inference-objective", "batch");
    let first = tokio::spawn(async move { http::post_hello(port, Some(batch)).await.unwrap() });
    poll("the first batch request queued", 200, || async {
        (http::metric_sum(stack.epp.metrics_port, QUEUE, &["priority=\"-1\""]).await == 1.0)
            .then_some(())
    })
    .await;
    // llm-d's name of the objective header lands in the same band.
    let r = http::post_hello(port, Some(("x-llm-d-inference-objective", "batch")))
        .await
        .unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "ResourceExhausted");
    assert_eq!(
        r.header("x-llm-d-request-dropped-reason"),
        Some("rejected-saturated")
    );
    assert_eq!(
        r.json()["error"]["message"],
        "flow control: the request queue is full"
    );
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            WAITED,
            &["priority=\"-1\"", "outcome=\"RejectedCapacity\""]
        )
        .await,
        1.0
    );
    for (name, labels) in [
        (
            ENQUEUED,
            ["priority=\"-1\"", "outcome=\"RejectedCapacity\""],
        ),
        (
            REQUESTS,
            ["priority=\"-1\"", "outcome=\"RejectedCapacity\""],
        ),
        // The band is full: one request of one.
        (
            "llm_d_epp_flow_control_capacity_utilization_requests",
            ["priority=\"-1\"", "inference_pool=\"epp-pool\""],
        ),
    ] {
        assert_eq!(
            http::metric_sum(stack.epp.metrics_port, name, &labels).await,
            1.0,
            "{name}"
        );
    }
    // Priority 0 has room: it queues (not refused) and both are served.
    let other = tokio::spawn(async move { http::post_hello(port, None).await.unwrap() });
    poll("the default-band request queued", 200, || async {
        (http::metric_sum(stack.epp.metrics_port, QUEUE, &["priority=\"0\""]).await == 1.0)
            .then_some(())
    })
    .await;
    saturate(&stack, 0).await;
    assert_eq!(other.await.unwrap().status, 200);
    assert_eq!(first.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_leaves_the_queue() {
    let cfg = config("  defaultRequestTTL: 60s\n");
    let stack = Stack::start(
        "flow-cancel",
        2,
        &[],
        &["--config-text", &cfg],
        BodyMode::Buffered,
    );
    saturate(&stack, 40).await;
    let port = stack.envoy.port;
    let client = tokio::spawn(async move {
        http::post_hello(port, Some(("x-gateway-inference-fairness-id", "quitter"))).await
    });
    poll("the request queued", 200, || async {
        (http::metric_sum(stack.epp.metrics_port, QUEUE, &["fairness_id=\"quitter\""]).await == 1.0)
            .then_some(())
    })
    .await;
    // The client goes away: its connection closes, Envoy resets the stream.
    client.abort();
    poll(
        "the request left the queue, counted as cancelled",
        200,
        || async {
            let cancelled = http::metric_sum(
                stack.epp.metrics_port,
                WAITED,
                &[
                    "fairness_id=\"quitter\"",
                    "outcome=\"EvictedContextCancelled\"",
                ],
            )
            .await;
            (cancelled == 1.0 && http::metric_sum(stack.epp.metrics_port, QUEUE, &[]).await == 0.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            REQUESTS,
            &["outcome=\"EvictedContextCancelled\""]
        )
        .await,
        1.0
    );
    // Its processing ended when it was given up (no decision was answered).
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            "llm_d_epp_request_processing_duration_seconds_count",
            &[]
        )
        .await,
        1.0
    );
    // Nothing was sent to a model server for it.
    saturate(&stack, 0).await;
    assert_eq!(hello(&stack, "other").await.status, 200);
    assert_eq!(
        http::metric_sum(
            stack.epp.metrics_port,
            WAITED,
            &["fairness_id=\"quitter\"", "outcome=\"Dispatched\""]
        )
        .await,
        0.0
    );
}

/// A long body (several ext_proc messages when streamed) whose model is
/// rewritten, held in the queue: once released it reaches the model server
/// byte for byte, with only the model value changed.
async fn a_long_rewritten_body_survives_the_queue(mode: BodyMode) {
    let cfg = config("  defaultRequestTTL: 60s\n");
    let stack = Stack::start(
        "flow-long",
        2,
        &["--record-requests", "16"],
        &["--config-text", &cfg],
        mode,
    );
    saturate(&stack, 40).await;
    let prompt = "lighthouse keeper ".repeat(20_000);
    let body = format!(
        r#"{{"model" : "chat", "prompt": "{prompt}", "max_tokens": 2, "seed": 12345678901234567890}}"#
    );
    let target = "meta-llama/Llama-3.1-8B-Instruct";
    let want = body.replace(r#""model" : "chat""#, &format!(r#""model" : "{target}""#));
    let port = stack.envoy.port;
    let sent = body.clone();
    let client = tokio::spawn(async move {
        http::send(
            port,
            "POST",
            "/v1/completions",
            &[
                ("content-type", "application/json"),
                ("x-gateway-model-name-rewrite", target),
            ],
            sent,
        )
        .await
        .unwrap()
    });
    poll("the long request queued", 200, || async {
        (http::metric_sum(stack.epp.metrics_port, QUEUE, &[]).await == 1.0).then_some(())
    })
    .await;
    saturate(&stack, 0).await;
    let r = client.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let recorded: Vec<serde_json::Value> = stack
        .sims
        .iter()
        .flat_map(|s| epp_test_support::process::sim_requests(s.port))
        .collect();
    assert!(
        recorded
            .iter()
            .any(|req| req["body"].as_str() == Some(want.as_str())),
        "no simulator received the body with only its model rewritten: {:?}",
        recorded
            .iter()
            .map(|r| {
                let b = r["body"].as_str().unwrap_or("");
                let diff = b.bytes().zip(want.bytes()).position(|(x, y)| x != y);
                (
                    b.len(),
                    want.len(),
                    diff,
                    b.get(..80).unwrap_or(b).to_owned(),
                )
            })
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_rewritten_body_survives_the_queue_buffered() {
    a_long_rewritten_body_survives_the_queue(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_rewritten_body_survives_the_queue_streamed() {
    a_long_rewritten_body_survives_the_queue(BodyMode::Streamed).await;
}
