//! `session-affinity-scorer` through Envoy: every response carries an
//! `x-session-token` naming the endpoint that served it; a client echoing the
//! token sticks to that endpoint even when it becomes the busiest.

use epp_test_support::{
    http,
    process::{BodyMode, Stack, sim_admin},
    wait::poll,
};

const CONFIG: &str = "plugins:\n- type: session-affinity-scorer\n- type: queue-scorer\n- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - {pluginRef: session-affinity-scorer, weight: 10}\n  - {pluginRef: queue-scorer, weight: 1}\n  - {pluginRef: max-score-picker}\n";

async fn send(stack: &Stack, token: Option<&str>) -> http::Response {
    let r = http::post_hello(stack.envoy.port, token.map(|t| ("x-session-token", t)))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

fn served_by(stack: &Stack, r: &http::Response) -> usize {
    stack
        .sim_index(r.header("x-inference-pod").expect("pod header"))
        .expect("known simulator")
}

async fn sessions_stick(mode: BodyMode) {
    let stack = Stack::start("session", 3, &[], &["--config-text", CONFIG], mode);
    let first = send(&stack, None).await;
    let token = first
        .header("x-session-token")
        .expect("x-session-token on the response")
        .to_owned();
    let home = served_by(&stack, &first);
    // The token is base64 of the serving endpoint's ip:port.
    let expected = stack.sims[home].addr();
    let decoded = base64_decode(&token);
    assert_eq!(decoded, expected, "token {token}");

    // The home endpoint becomes the busiest; without a token traffic leaves it.
    sim_admin(
        stack.sims[home].port,
        serde_json::json!({"extra_waiting": 50}),
    )
    .await;
    poll(
        "a tokenless request avoiding the busy endpoint",
        100,
        || async {
            let r = send(&stack, None).await;
            (served_by(&stack, &r) != home).then_some(())
        },
    )
    .await;
    // With the token, the session stays home, and keeps getting its token.
    for _ in 0..10 {
        let r = send(&stack, Some(&token)).await;
        assert_eq!(served_by(&stack, &r), home);
        assert_eq!(r.header("x-session-token"), Some(token.as_str()));
    }
}

fn base64_decode(s: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = A.iter().position(|&a| a == c).expect("base64 alphabet") as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_buffered() {
    sessions_stick(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_streamed() {
    sessions_stick(BodyMode::Streamed).await;
}
