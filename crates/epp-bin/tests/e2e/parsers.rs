//! Request parsers through real Envoy: the engines' own APIs are read (their
//! prompts meet the prefix index), a body epp does not read is routed on load
//! alone and forwarded byte for byte (`passthrough-parser`, in llm-d's
//! default list), and an explicit parser list without a fallback refuses
//! paths it does not claim.

use epp_test_support::{
    http,
    process::{BodyMode, scratch_dir, sim_requests, start_envoy, start_epp, start_sims},
};
use serde_json::{Value, json};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

async fn post(port: u16, path: &str, body: &Value) -> http::Response {
    http::send(
        port,
        "POST",
        path,
        &[("content-type", "application/json")],
        serde_json::to_vec(body).unwrap(),
    )
    .await
    .unwrap()
}

/// Sends `body` to `path` `n` times; the pods that served, in order.
async fn pods(port: u16, path: &str, body: &Value, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = post(port, path, body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        out.push(r.header("x-inference-pod").unwrap().to_owned());
    }
    out
}

fn kserve_body() -> Value {
    json!({"id": "42", "inputs": [
        {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["what is a KV cache?"]},
        {"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [3]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_parsers_read_vllm_generate_and_pass_kserve_through() {
    let dir = scratch_dir("parsers-default");
    // Triton's model names have no `/`: the base model is also `llama`.
    let sims = start_sims(
        &dir,
        3,
        &["--record-requests", "64", "--served-model-name", "llama"],
    );
    let endpoints = sims.iter().map(|s| s.addr()).collect::<Vec<_>>().join(",");
    let epp = start_epp(&dir, &["--endpoints", &endpoints]);
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);

    // vLLM's token-id API: read, so a long shared prompt sticks to one server.
    let ids: Vec<u32> = (0..2000).map(|i| (i * 7919) % 32000).collect();
    let generate = json!({"model": MODEL, "token_ids": ids, "sampling_params": {"max_tokens": 2}});
    let served = pods(envoy.port, "/inference/v1/generate", &generate, 6).await;
    assert!(
        served.iter().all(|p| *p == served[0]),
        "prefix affinity: {served:?}"
    );

    // KServe v2 (Triton): not read, routed, forwarded byte for byte.
    let body = kserve_body();
    let sent = serde_json::to_vec(&body).unwrap();
    let path = "/v2/models/llama/infer";
    let r = post(envoy.port, path, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["outputs"][0]["name"], json!("text_output"));
    let received: Vec<Value> = sims
        .iter()
        .flat_map(|s| sim_requests(s.port))
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/infer")))
        .collect();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0]["body"].as_str().unwrap().as_bytes(),
        sent.as_slice(),
        "forwarded untouched"
    );

    // SGLang's /generate is not in llm-d's default list: passed through too.
    let sglang = json!({"text": "hello there", "sampling_params": {"max_new_tokens": 2}});
    let r = post(envoy.port, "/generate", &sglang).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_parser_list_reads_sglang_and_refuses_what_it_does_not_claim() {
    let dir = scratch_dir("parsers-explicit");
    let sims = start_sims(&dir, 3, &[]);
    let endpoints = sims.iter().map(|s| s.addr()).collect::<Vec<_>>().join(",");
    let config = dir.join("parsers.yaml");
    std::fs::write(
        &config,
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
         - type: openai-parser\n- type: sglanghttp-parser\n- type: prefix-cache-scorer\n\
         - type: queue-scorer\n\
         schedulingProfiles:\n- name: default\n  plugins:\n  - {pluginRef: prefix-cache-scorer, weight: 3}\n  - {pluginRef: queue-scorer}\n\
         requestHandler:\n  parsers:\n  - pluginRef: openai-parser\n  - pluginRef: sglanghttp-parser\n",
    )
    .unwrap();
    let epp = start_epp(
        &dir,
        &[
            "--endpoints",
            &endpoints,
            "--config-file",
            config.to_str().unwrap(),
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);

    let ids: Vec<u32> = (0..2000).map(|i| (i * 104_729) % 32000).collect();
    let sglang = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 2}});
    let served = pods(envoy.port, "/generate", &sglang, 6).await;
    assert!(
        served.iter().all(|p| *p == served[0]),
        "prefix affinity: {served:?}"
    );

    let r = post(envoy.port, "/v2/models/llama/infer", &kserve_body()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("no request parser"), "{}", r.text());
    // OpenAI paths still work.
    let r = post(
        envoy.port,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "hi", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}
