//! Logs: `-v` gives one debug line per request with the decision and its
//! scores, `--log-json` makes every line a JSON object, and the prompt only
//! ever appears at trace level (`-vvv`).

use std::time::Duration;

use epp_test_support::{
    http,
    process::{BodyMode, Proc, epp_command, scratch_dir, spawn_epp, start_envoy, start_sims},
    wait::poll,
};

/// epp with `flags` and no RUST_LOG (the flags alone choose the level).
fn epp(dir: &std::path::Path, endpoints: &str, flags: &[&str]) -> (Proc, u16) {
    let mut cmd = epp_command();
    cmd.args(["--secure-serving=false", "--endpoints", endpoints])
        .args(["--drain-timeout", "0s"])
        .args(flags)
        .env_remove("RUST_LOG");
    let (epp, _) = spawn_epp("epp", cmd, dir.join("epp.log"));
    (epp.proc, epp.grpc_port)
}

async fn send(port: u16, id: &str, prompt: &str) {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": prompt,
        "max_tokens": 2,
    })
    .to_string();
    let headers = [("content-type", "application/json"), ("x-request-id", id)];
    let r = http::send(port, "POST", "/v1/completions", &headers, body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The log once a line contains `marker` (stderr is copied to a file as it comes).
async fn log_with(proc: &Proc, marker: &str) -> String {
    let path = proc.log.with_extension("stderr");
    poll(marker, 200, || async {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        text.contains(marker).then_some(text)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v_logs_one_json_line_per_request_without_the_prompt() {
    let dir = scratch_dir("logs-json");
    let sims = start_sims(&dir, 2, &[]);
    let endpoints = format!("{},{}", sims[0].addr(), sims[1].addr());
    let (epp, port) = epp(&dir, &endpoints, &["-v", "--log-json"]);
    let envoy = start_envoy(&dir, BodyMode::Streamed, port);

    send(envoy.port, "req-a", "SECRET-PROMPT-A tell me").await;
    send(envoy.port, "req-b", "SECRET-PROMPT-B tell me").await;
    // Lines are written in order: once req-b's decision is logged, anything
    // logged for req-a is in the file.
    let text = log_with(&epp, "req-b").await;
    assert!(
        !text.contains("SECRET-PROMPT"),
        "prompt logged at -v:\n{text}"
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let about_a: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["request_id"] == "req-a")
        .collect();
    assert_eq!(about_a.len(), 1, "one line per request: {about_a:?}");
    let a = about_a[0];
    assert_eq!(a["level"], "DEBUG", "{a}");
    assert_eq!(a["fields"]["message"], "scheduled", "{a}");
    let endpoint = a["fields"]["endpoint"].as_str().unwrap();
    assert!(
        sims.iter().any(|s| s.addr() == endpoint),
        "endpoint {endpoint} in {a}"
    );
    let targets = a["fields"]["targets"].as_str().unwrap();
    assert!(targets.starts_with(endpoint), "{a}");
    assert!(
        a["fields"]["scores"]
            .as_str()
            .is_some_and(|s| s.contains('.')),
        "{a}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vvv_traces_the_prompt_and_default_logs_no_requests() {
    let dir = scratch_dir("logs-levels");
    let sims = start_sims(&dir, 1, &[]);
    let (mut quiet, quiet_port) = epp(&dir.join(""), &sims[0].addr(), &[]);
    let trace_dir = dir.join("trace");
    std::fs::create_dir_all(&trace_dir).unwrap();
    let (loud, loud_port) = epp(&trace_dir, &sims[0].addr(), &["-vvv"]);
    let quiet_envoy = start_envoy(&dir, BodyMode::Buffered, quiet_port);
    let loud_envoy = start_envoy(&trace_dir, BodyMode::Buffered, loud_port);

    send(quiet_envoy.port, "req-q", "SECRET-PROMPT-Q").await;
    send(loud_envoy.port, "req-t", "SECRET-PROMPT-T").await;
    let text = log_with(&loud, "SECRET-PROMPT-T").await;
    assert!(text.contains("TRACE"), "{text}");
    // The default level logs no request: the quiet log has no request id.
    // Read only once the quiet epp has exited and its whole stderr is copied;
    // its shutdown line (info level) proves the file is not just empty.
    let quiet_text = quiet.stop_and_collect_stderr(Duration::from_secs(10));
    assert!(quiet_text.contains("shutting down"), "{quiet_text}");
    assert!(!quiet_text.contains("req-q"), "{quiet_text}");
}
