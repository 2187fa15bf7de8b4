//! Model rewrites through Envoy: by header and by the config's rules. The
//! model server receives the body byte-for-byte except the spliced `model`
//! (with `content-length` fixed) and no control headers; the client gets its
//! own model name back, in plain and streamed responses. A weighted rule
//! splits traffic in proportion to its weights, and a zero weight is never
//! drawn.

use epp_test_support::{
    http,
    process::{BodyMode, Stack, recorded_header, sim_requests},
};

const CONFIG: &str = "modelRewrites:
- name: canary
  rules:
  - matches: [{model: {type: Exact, value: chat}}]
    targets: [{modelRewrite: chat-v2}]
- name: split
  rules:
  - matches: [{model: {type: Exact, value: split}}]
    targets:
    - {modelRewrite: chat-v1, weight: 3}
    - {modelRewrite: chat-v2, weight: 1}
    - {modelRewrite: chat-v3, weight: 0}
";

/// Requests sent for the weighted rule.
const SPLIT_REQUESTS: usize = 200;

/// Odd spacing, key order and a number no f64 holds: only a splice keeps them.
fn body(stream: bool) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"bytes stay put"}}],  "model" : "chat", "max_tokens":3,"seed":12345678901234567890,"temperature":0.50,"stream":{stream}}}"#
    )
}

async fn send(stack: &Stack, stream: bool, extra: &[(&str, &str)]) -> http::Response {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("x-gateway-inference-objective", "anything"),
        ("x-gateway-inference-fairness-id", "tenant-7"),
    ];
    headers.extend_from_slice(extra);
    let r = http::send(
        stack.envoy.port,
        "POST",
        "/v1/chat/completions",
        &headers,
        body(stream),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

/// What the simulator received last: checks the body is the client's with
/// only the model changed to `target`, and the headers were cleaned.
fn check_forwarded(stack: &Stack, stream: bool, target: &str) -> serde_json::Value {
    let last = sim_requests(stack.sims[0].port)
        .pop()
        .expect("the simulator recorded the request");
    let want = body(stream).replace(r#""model" : "chat""#, &format!(r#""model" : "{target}""#));
    assert_eq!(last["body"].as_str(), Some(want.as_str()), "{last}");
    // Never a stale length: the new one, or (FULL_DUPLEX_STREAMED, where
    // Envoy streams the body on) chunked framing.
    match recorded_header(&last, "content-length") {
        Some(len) => assert_eq!(len, want.len().to_string(), "{last}"),
        None => assert_eq!(
            recorded_header(&last, "transfer-encoding"),
            Some("chunked"),
            "{last}"
        ),
    }
    for control in [
        "x-gateway-model-name-rewrite",
        "x-gateway-inference-objective",
        "x-gateway-inference-fairness-id",
    ] {
        assert_eq!(
            recorded_header(&last, control),
            None,
            "{control} forwarded: {last}"
        );
    }
    last
}

async fn rewrites(mode: BodyMode) {
    let stack = Stack::start(
        "rewrite",
        1,
        &[
            "--lora-modules",
            "chat-v1,chat-v2",
            "--record-requests",
            "256",
        ],
        &["--config-text", CONFIG],
        mode,
    );

    // A config rule, plain response: the client sees its own model name.
    let r = send(&stack, false, &[]).await;
    assert_eq!(r.json()["model"], "chat", "{}", r.text());
    let last = check_forwarded(&stack, false, "chat-v2");
    let id = recorded_header(&last, "x-request-id").expect("x-request-id generated");
    assert_eq!(id.len(), 36, "a UUID: {id}");

    // The header takes precedence over the rule; a client's request id stays.
    let r = send(
        &stack,
        false,
        &[
            ("x-gateway-model-name-rewrite", "chat-v1"),
            ("x-request-id", "client-id-1"),
        ],
    )
    .await;
    assert_eq!(r.json()["model"], "chat", "{}", r.text());
    let last = check_forwarded(&stack, false, "chat-v1");
    assert_eq!(recorded_header(&last, "x-request-id"), Some("client-id-1"));

    // Streamed: every event names the client's model.
    let r = send(&stack, true, &[]).await;
    let text = r.text();
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(events.len() >= 3, "{text}");
    assert!(events.iter().all(|e| e["model"] == "chat"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    check_forwarded(&stack, true, "chat-v2");

    // The weighted rule: 3 : 1, and the zero-weight target (an adapter the
    // server does not have, so drawing it would fail the request) never.
    let before = sim_requests(stack.sims[0].port).len();
    for _ in 0..SPLIT_REQUESTS {
        let body = serde_json::json!({"model": "split", "prompt": "hi", "max_tokens": 1});
        let r = http::post_json(stack.envoy.port, "/v1/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["model"], "split", "{}", r.text());
    }
    let recorded = sim_requests(stack.sims[0].port);
    assert_eq!(
        recorded.len(),
        before + SPLIT_REQUESTS,
        "every request recorded"
    );
    let v1 = recorded[before..]
        .iter()
        .filter(|r| {
            let body: serde_json::Value =
                serde_json::from_str(r["body"].as_str().unwrap_or("")).unwrap();
            body["model"] == "chat-v1"
        })
        .count();
    // Binomial(200, 3/4): mean 150, sd 6.1; ±5 sd keeps out both an even
    // split (100) and always the first target (200).
    assert!(
        (120..=180).contains(&v1),
        "{v1} of {SPLIT_REQUESTS} to chat-v1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_buffered() {
    rewrites(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_streamed() {
    rewrites(BodyMode::Streamed).await;
}
