//! Disaggregated serving and data-parallel ranks through real Envoy, with
//! llm-d's own routing sidecar (`pd-sidecar`, built from its Go module) in
//! front of the decode server, as llm-d deploys it: epp picks, the sidecar
//! reads epp's headers and runs the prefill / rank hop, our simulators speak
//! vLLM's `kv_transfer_params`.

use std::path::Path;

use epp_test_support::{
    http,
    process::{
        BodyMode, Sim, free_port_on, recorded_header, scratch_dir, sim_requests, start_envoy,
        start_epp, start_sim, start_sim_at, wait_scraped, workspace_root,
    },
    reference::start_sidecar,
};
use serde_json::{Value, json};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn llm_d_config(file: &str) -> String {
    let path = workspace_root()
        .join("../shared/reference/llm-d-configs")
        .join(file);
    assert!(
        path.exists(),
        "{} (shared/ sits beside the checkout)",
        path.display()
    );
    path.to_str().unwrap().to_owned()
}

fn write_endpoints(dir: &Path, entries: &[(String, u16, &str)]) -> String {
    let file = dir.join("endpoints.yaml");
    let text: String = entries
        .iter()
        .map(|(ip, port, labels)| {
            format!("- {{address: {ip}, port: {port}, labels: {{{labels}}}}}\n")
        })
        .collect();
    std::fs::write(&file, text).unwrap();
    file.to_str().unwrap().to_owned()
}

/// The generation requests a simulator received.
fn generations(sim: &Sim) -> Vec<Value> {
    sim_requests(sim.port)
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("completions"))
        })
        .collect()
}

fn body_of(recorded: &Value) -> Value {
    serde_json::from_str(recorded["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

async fn complete(envoy_port: u16, prompt: &str, extra: &[(&str, &str)]) -> http::Response {
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": true,
        "stream_options": {"include_usage": true}});
    let r = http::send(
        envoy_port,
        "POST",
        "/v1/completions",
        &[&[("content-type", "application/json")], extra].concat(),
        serde_json::to_vec(&body).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

/// llm-d's sim-pd-epp-config.yaml, unchanged: a long prompt nobody holds is
/// prefilled on the prefill server and decoded on the decode server (the
/// sidecar carries vLLM's transfer parameters between them); the same
/// prompt again is cached on the decode server, which then serves it alone;
/// a client cannot name a prefill server itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_is_prefilled_on_one_server_and_decoded_on_another_when_the_decider_says_so() {
    let dir = scratch_dir("pd");
    let prefill = start_sim(
        &dir,
        0,
        &["--kv-role", "kv_producer", "--record-requests", "64"],
    );
    let decode = start_sim(
        &dir,
        1,
        &["--kv-role", "kv_consumer", "--record-requests", "64"],
    );
    let sidecar_port = free_port_on("0.0.0.0");
    let _sidecar = start_sidecar(
        &dir,
        "pd-sidecar",
        sidecar_port,
        decode.port,
        "127.0.0.1",
        &[],
    );
    let endpoints = write_endpoints(
        &dir,
        &[
            ("127.0.0.1".into(), prefill.port, "llm-d.ai/role: prefill"),
            ("127.0.0.1".into(), sidecar_port, "llm-d.ai/role: decode"),
        ],
    );
    let config = llm_d_config("sim-pd-epp-config.yaml");
    let epp = start_epp(
        &dir,
        &["--endpoints-file", &endpoints, "--config-file", &config],
    );
    wait_scraped(
        epp.metrics_port,
        &[prefill.addr(), format!("127.0.0.1:{sidecar_port}")],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);

    // ~1,000 tokens, none cached anywhere: 1,000 ≥ nonCachedTokens 16.
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(90);
    let r = complete(envoy.port, &prompt, &[]).await;
    assert_eq!(
        r.header("x-inference-pod"),
        Some("sim-1"),
        "decoded on the decode server"
    );
    let p = generations(&prefill);
    assert_eq!(p.len(), 1, "prefilled once on the prefill server");
    let pb = body_of(&p[0]);
    assert_eq!(
        pb["kv_transfer_params"]["do_remote_decode"],
        json!(true),
        "{pb}"
    );
    assert_eq!(pb["max_tokens"], json!(1));
    let d = generations(&decode);
    assert_eq!(d.len(), 1);
    let db = body_of(&d[0]);
    assert_eq!(
        db["kv_transfer_params"]["do_remote_prefill"],
        json!(true),
        "{db}"
    );
    assert_eq!(db["kv_transfer_params"]["remote_engine_id"], json!("sim-0"));
    assert_eq!(
        recorded_header(&d[0], "x-prefiller-host-port"),
        Some(prefill.addr().as_str()),
        "epp named the prefill pick"
    );

    // Again: the decode server holds the prompt now (its KV was transferred
    // there), the uncached rest is under 16 tokens: no prefill hop.
    let r = complete(envoy.port, &prompt, &[]).await;
    assert_eq!(r.header("x-inference-pod"), Some("sim-1"));
    assert_eq!(generations(&prefill).len(), 1, "not prefilled again");
    let d = generations(&decode);
    assert_eq!(d.len(), 2);
    assert!(body_of(&d[1]).get("kv_transfer_params").is_none());
    assert_eq!(recorded_header(&d[1], "x-prefiller-host-port"), None);
    let usage = r.text();
    assert!(
        usage.contains("\"cached_tokens\":9"),
        "the decode server served the prompt from the transferred blocks: {usage}"
    );

    // A short prompt with a client-chosen prefill server: epp drops the
    // header (the decider says no), so the sidecar never calls that address.
    let r = complete(
        envoy.port,
        "hello",
        &[("x-prefiller-host-port", "127.0.0.1:9")],
    )
    .await;
    assert_eq!(r.header("x-inference-pod"), Some("sim-1"));
    let d = generations(&decode);
    assert_eq!(recorded_header(&d[2], "x-prefiller-host-port"), None);
    assert_eq!(generations(&prefill).len(), 1);
}

/// llm-d's dp-epp-config.yaml with its `primaryPort` set to the pod's: one
/// pod, two data-parallel ranks (each its own endpoint, as Kubernetes
/// discovery makes them), llm-d's sidecar in front. epp picks a rank, sends
/// the request to the primary port and names the rank; every rank serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_data_parallel_rank_of_a_pod_receives_traffic() {
    let dir = scratch_dir("dp");
    // The pod: sidecar ranks on 127.0.0.3:base and :base+1, the engine's
    // ranks on localhost:vllm and :vllm+1.
    let (base, vllm) = (free_pair(), free_pair());
    let ranks = [
        start_sim_at(
            &dir,
            "rank-0",
            "127.0.0.1",
            vllm,
            &["--record-requests", "64"],
        ),
        start_sim_at(
            &dir,
            "rank-1",
            "127.0.0.1",
            vllm + 1,
            &["--record-requests", "64"],
        ),
    ];
    let sidecar = start_sidecar(
        &dir,
        "dp-sidecar",
        base,
        vllm,
        "127.0.0.3",
        &["--data-parallel-size", "2"],
    );
    let endpoints = write_endpoints(
        &dir,
        &[
            ("127.0.0.3".into(), base, ""),
            ("127.0.0.3".into(), base + 1, ""),
        ],
    );
    let config = dir.join("dp.yaml");
    let shipped = std::fs::read_to_string(llm_d_config("dp-epp-config.yaml")).unwrap();
    std::fs::write(
        &config,
        shipped.replace("primaryPort: 8000", &format!("primaryPort: {base}")),
    )
    .unwrap();
    let epp = start_epp(
        &dir,
        &[
            "--endpoints-file",
            &endpoints,
            "--config-file",
            config.to_str().unwrap(),
        ],
    );
    wait_scraped(
        epp.metrics_port,
        &[
            format!("127.0.0.3:{base}"),
            format!("127.0.0.3:{}", base + 1),
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    // Distinct prompts share no block, so the prefix scorer ties and the
    // picker breaks ties at random: with 12 requests all would land on one
    // rank once in 2,048 runs (seen once); with 24, once in ~8 million.
    const REQUESTS: usize = 24;
    let mut served = [0usize; 2];
    for i in 0..REQUESTS {
        let r = complete(envoy.port, &format!("request {i} ").repeat(30), &[]).await;
        let pod = r.header("x-inference-pod").unwrap().to_owned();
        served[usize::from(pod == "rank-1")] += 1;
    }
    assert!(
        served[0] > 0 && served[1] > 0,
        "both ranks served: {served:?}"
    );
    // The primary port's listener took every request and routed it by the
    // header (it logs each such request; a rank's own listener does not).
    let log = std::fs::read_to_string(&sidecar.log).unwrap();
    let by_header = log
        .lines()
        .filter(|l| l.contains("x-data-parallel-host-port is deprecated"))
        .count();
    assert_eq!(by_header, REQUESTS, "{log}");
    // Every request reached the pod's primary port, naming its rank.
    for (i, rank) in ranks.iter().enumerate() {
        for r in generations(rank) {
            assert_eq!(
                recorded_header(&r, "x-data-parallel-host-port"),
                Some(format!("127.0.0.3:{}", base + i as u16).as_str())
            );
        }
    }
}

/// A port `p` with `p + 1` free too (a pod's two ranks).
fn free_pair() -> u16 {
    loop {
        let p = free_port_on("0.0.0.0");
        if p < u16::MAX && std::net::TcpListener::bind(("0.0.0.0", p + 1)).is_ok() {
            return p;
        }
    }
}
