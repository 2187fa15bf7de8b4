//! The decision view on the metrics port (`/debug/decisions` and its JSON):
//! requests through the real Envoy show up with each candidate's scores, the
//! filter that dropped the others, the pick, or why nothing was picked; the
//! page, loaded in a real headless Chromium, shows the fleet and updates
//! after a request. No prompt ever appears.

use std::time::Duration;

use epp_test_support::{
    chromium::{chromium_bin, dump_dom},
    http,
    plugins::STEERED_CONFIG,
    process::{BodyMode, Stack, scratch_dir, start_epp, start_sims, wait_scraped},
};
use serde_json::json;

/// Words no page or JSON of epp may ever show: they are only in prompts.
const PROMPT_MARK: &str = "VIEW-PROMPT-9d1c";

fn chat(words: &str) -> String {
    json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": format!("{PROMPT_MARK} {words}")}],
        "max_tokens": 4,
    })
    .to_string()
}

async fn send_chat(port: u16, headers: &[(&str, &str)], words: &str) -> http::Response {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    http::send(port, "POST", "/v1/chat/completions", &all, chat(words))
        .await
        .unwrap()
}

async fn get(port: u16, path: &str) -> http::Response {
    http::send(port, "GET", path, &[], "").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_shows_each_candidates_scores_the_filter_that_dropped_it_and_refusals() {
    let stack = Stack::start(
        "decision-view-json",
        2,
        &[],
        &[
            "--decision-log-interval",
            "0",
            "--config-text",
            STEERED_CONFIG,
        ],
        BodyMode::Streamed,
    );
    let addrs: Vec<String> = stack.sims.iter().map(|s| s.addr()).collect();
    wait_scraped(stack.epp.metrics_port, &addrs);

    let routed = send_chat(
        stack.envoy.port,
        &[
            ("x-request-id", "view-routed"),
            ("test-epp-endpoint-selection", &addrs[1]),
        ],
        "purple giraffe",
    )
    .await;
    assert_eq!(routed.status, 200, "{}", routed.text());
    assert_eq!(routed.header("x-inference-pod"), Some("sim-1"));
    // Without a selection the testing filter keeps nothing: 503.
    let refused = send_chat(
        stack.envoy.port,
        &[("x-request-id", "view-refused")],
        "orange elephant",
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.text());

    let reply = get(stack.epp.metrics_port, "/debug/decisions.json").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let text = reply.text();
    assert!(
        !text.contains(PROMPT_MARK) && !text.contains("giraffe"),
        "{text}"
    );
    let v = reply.json();

    let endpoints = v["endpoints"].as_array().unwrap();
    let mut shown: Vec<&str> = endpoints
        .iter()
        .map(|e| e["address"].as_str().unwrap())
        .collect();
    shown.sort_unstable();
    let mut want: Vec<&str> = addrs.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(shown, want);
    for e in endpoints {
        assert_eq!(e["stale"], false, "{e}");
        assert!(e["scraped_ms_ago"].is_u64(), "{e}");
        assert!(e["waiting"].is_u64() && e["kv_usage"].is_f64(), "{e}");
    }

    let decisions = v["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 2, "{v}");
    // Newest first: the refusal, with its status and why.
    let no = &decisions[0];
    assert_eq!(no["request_id"], "view-refused");
    assert_eq!(no["refused"]["status"], 503, "{no}");
    assert!(no["targets"].as_array().unwrap().is_empty());
    for c in no["runs"][0]["candidates"].as_array().unwrap() {
        assert_eq!(
            c["dropped_by"]["type"], "header-based-testing-filter",
            "{c}"
        );
    }

    let yes = &decisions[1];
    assert_eq!(yes["request_id"], "view-routed");
    assert_eq!(yes["model"], "meta-llama/Llama-3.1-8B-Instruct");
    assert!(yes["refused"].is_null(), "{yes}");
    assert_eq!(yes["targets"][0]["address"], addrs[1].as_str());
    let run = &yes["runs"][0];
    assert_eq!(run["profile"], "steered");
    assert_eq!(run["scorers"][0]["type"], "queue-scorer");
    assert_eq!(run["scorers"][0]["weight"], 2.0);
    let candidates = run["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 2);
    let at = |addr: &str| {
        candidates
            .iter()
            .find(|c| c["address"] == addr)
            .unwrap_or_else(|| panic!("{addr} in {run}"))
    };
    assert_eq!(
        at(&addrs[0])["dropped_by"]["type"],
        "header-based-testing-filter"
    );
    let picked = at(&addrs[1]);
    assert!(picked["dropped_by"].is_null(), "{picked}");
    assert_eq!(picked["pick"], 0);
    let scores: Vec<f64> = picked["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    assert_eq!(scores.len(), 2, "{picked}");
    let total = picked["total"].as_f64().unwrap();
    assert!(
        (total - (2.0 * scores[0] + scores[1])).abs() < 1e-9,
        "{picked}"
    );

    let page = get(stack.epp.metrics_port, "/debug/decisions").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.header("content-security-policy")
            .is_some_and(|p| p.starts_with("default-src 'none'")),
        "{:?}",
        page.headers
    );
    assert!(!page.text().contains(PROMPT_MARK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_log_size_of_zero_turns_the_view_off() {
    let dir = scratch_dir("decision-view-off");
    let sims = start_sims(&dir, 1, &[]);
    let epp = start_epp(
        &dir,
        &["--endpoints", &sims[0].addr(), "--decision-log-size", "0"],
    );
    for path in ["/debug/decisions", "/debug/decisions.json"] {
        assert_eq!(get(epp.metrics_port, path).await.status, 404, "{path}");
    }
    assert_eq!(get(epp.metrics_port, "/metrics").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_chromium_shows_the_fleet_and_a_request_right_after_it_is_made() {
    // Missing Chromium fails here, before anything starts.
    chromium_bin();
    // Default flags: an idle picker records the next request.
    let stack = Stack::start("decision-view-page", 2, &[], &[], BodyMode::Streamed);
    let addrs: Vec<String> = stack.sims.iter().map(|s| s.addr()).collect();
    wait_scraped(stack.epp.metrics_port, &addrs);
    let url = format!(
        "http://127.0.0.1:{}/debug/decisions",
        stack.epp.metrics_port
    );
    let budget = Duration::from_secs(3);

    let before = dump_dom(&stack.dir, &url, budget);
    assert!(before.contains(r#"data-state="loaded""#), "{before}");
    for a in &addrs {
        assert!(
            before.contains(&format!(r#"<td class="name">{a}</td>"#)),
            "{a} in {before}"
        );
    }
    assert!(before.contains("no decision recorded yet"), "{before}");

    let r = send_chat(
        stack.envoy.port,
        &[("x-request-id", "page-req-1")],
        "blue whale",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let pod = r
        .header("x-inference-pod")
        .expect("the simulator names itself");
    let served = &addrs[stack.sim_index(pod).expect("a known simulator")];

    let after = dump_dom(&stack.dir, &url, budget);
    assert!(after.contains(r#"data-state="loaded""#), "{after}");
    assert!(after.contains(r#"data-request-id="page-req-1""#), "{after}");
    assert!(
        after.contains(&format!(r#"<strong class="pick">{served}</strong>"#)),
        "the pick, {served}, in {after}"
    );
    assert!(after.contains(">picked<"), "{after}");
    assert!(
        !after.contains(PROMPT_MARK) && !after.contains("whale"),
        "{after}"
    );
}
