//! `deploy/observability/`: the alert rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), and every query of the Grafana
//! dashboard returns data from a real Prometheus scraping a running demo
//! (simulators, Envoy, epp). Prometheus and promtool are built from the
//! `prometheus` Go module by `scripts/prometheus.sh`.

use std::{path::PathBuf, process::Command, time::Duration};

use epp_test_support::{
    http,
    process::{BodyMode, Stack, workspace_root},
    prometheus::{promtool_bin, start_prometheus},
};

fn observability_dir() -> PathBuf {
    workspace_root().join("deploy/observability")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new(promtool_bin())
        .args(args)
        .current_dir(observability_dir())
        .output()
        .expect("cannot run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(checked.contains("SUCCESS: 15 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every PromQL expression of the dashboard, with the dashboard's variables
/// given the values a viewer would pick ("All", and a rate window).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(observability_dir().join("dashboard.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for panel in doc["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let expr = expr
                .replace("$__rate_interval", "30s")
                .replace("$model", ".*")
                .replace("$pool", ".*");
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            out.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 19, "{queries:?}");
    let stack = Stack::start(
        "dashboard",
        2,
        // 10 ms between tokens: streamed responses come in several chunks.
        &["--itl-ms", "10", "--ttft-ms", "5"],
        &["--pool-name", "demo-pool"],
        BodyMode::Streamed,
    );
    let prometheus = start_prometheus(
        &stack.dir,
        &[("epp", vec![format!("127.0.0.1:{}", stack.epp.metrics_port)])],
        Duration::from_millis(500),
    );
    // Traffic for a few scrapes: plain and streamed completions from a few
    // tenants sharing prompts, and a malformed request now and then.
    let model = "meta-llama/Llama-3.1-8B-Instruct";
    let start = std::time::Instant::now();
    let mut round = 0;
    while start.elapsed() < Duration::from_secs(6) {
        round += 1;
        let prompt = format!("tenant {} system prompt. ", round % 3).repeat(20);
        let plain = serde_json::json!({"model": model, "prompt": prompt, "max_tokens": 4});
        let r = http::post_json(stack.envoy.port, "/v1/completions", &plain)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let streamed = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let r = http::post_json(stack.envoy.port, "/v1/chat/completions", &streamed)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        if round % 5 == 0 {
            let bad = serde_json::json!({"prompt": "no model"});
            let r = http::post_json(stack.envoy.port, "/v1/completions", &bad)
                .await
                .unwrap();
            assert_eq!(r.status, 400, "{}", r.text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A last scrape after the traffic, then every query within its window.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let result = prometheus.query(expr);
        let finite = result.as_array().into_iter().flatten().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        });
        if !finite {
            empty.push(format!("{title}: {expr} -> {result}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
}
