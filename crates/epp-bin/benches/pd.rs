//! Disaggregated prefill/decode against the same fleet without it, through
//! Envoy, in one run: four simulated servers either way.
//!
//! ```sh
//! cargo build --release -p epp-bin -p epp-sim --bins
//! scripts/reference-epp.sh build-sidecar
//! cargo bench -p epp-bin --bench pd
//! ```
//!
//! - **aggregated**: 4 servers that prefill and decode; epp runs the decode
//!   profile of llm-d's `pd-epp-config.yaml` as its one profile;
//! - **P/D**: 2 prefill servers (`--kv-role kv_producer`) and 2 decode
//!   servers (`kv_consumer`), each decode server behind llm-d's routing
//!   sidecar (`pd-sidecar`); epp runs `pd-epp-config.yaml` unchanged
//!   (`prefix-based-pd-decider`, `nonCachedTokens: 16`).
//!
//! The servers: 100 µs prefill per token (an 8k-token prompt takes ~0.8 s),
//! 10 ms per decode step, chunked prefill of 2,048 tokens per step (so a
//! server that prefills slows the decode steps of everything it runs, as
//! vLLM's mixed batches do), KV transfer 5 µs per token.
//!
//! Two workloads, open loop, streamed completions, every prompt unique:
//! - long prompts, short outputs: ~8,000 tokens in, 16 out;
//! - short prompts, long outputs: ~256 tokens in, 256 out.
//!
//! Per request at the client: TTFT (first streamed bytes) and time per
//! output token ((last − first bytes) / (tokens − 1)).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{path::Path, time::Duration};

use epp_test_support::{
    http,
    process::{
        BodyMode, Envoy, Epp, Proc, Sim, free_port_on, scratch_dir, start_envoy, start_epp,
        start_sim, wait_scraped, workspace_root,
    },
    reference::start_sidecar,
    stats::percentile,
};

const SECONDS: f64 = 20.0;
const SIM: &[&str] = &[
    "--ttft-ms",
    "10",
    "--prefill-us-per-token",
    "100",
    "--itl-ms",
    "10",
    "--max-num-batched-tokens",
    "2048",
    "--kv-transfer-us-per-token",
    "5",
];

struct Fleet {
    _sims: Vec<Sim>,
    _sidecars: Vec<Proc>,
    _epp: Epp,
    envoy: Envoy,
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn pd_config_text() -> String {
    let path = workspace_root().join("../shared/reference/llm-d-configs/pd-epp-config.yaml");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (shared/ sits beside the checkout)", path.display()))
}

/// The decode profile of pd-epp-config.yaml, alone.
const AGGREGATED: &str = r#"apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}
- type: prefix-cache-scorer
- type: queue-scorer
- type: decode-filter
- type: max-score-picker
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
"#;

fn aggregated() -> Fleet {
    let dir = scratch_dir("bench-pd-aggregated");
    let sims: Vec<Sim> = (0..4).map(|i| start_sim(&dir, i, SIM)).collect();
    let endpoints: String = sims
        .iter()
        .map(|s| format!("- {{address: 127.0.0.1, port: {}}}\n", s.port))
        .collect();
    let endpoints = write(&dir, "endpoints.yaml", &endpoints);
    let config = write(&dir, "aggregated.yaml", AGGREGATED);
    let epp = start_epp(
        &dir,
        &["--endpoints-file", &endpoints, "--config-file", &config],
    );
    let addrs: Vec<String> = sims.iter().map(Sim::addr).collect();
    wait_scraped(epp.metrics_port, &addrs);
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    Fleet {
        _sims: sims,
        _sidecars: Vec::new(),
        _epp: epp,
        envoy,
    }
}

fn disaggregated() -> Fleet {
    let dir = scratch_dir("bench-pd-disaggregated");
    let mut args = SIM.to_vec();
    args.extend(["--kv-role", "kv_producer"]);
    let mut sims: Vec<Sim> = (0..2).map(|i| start_sim(&dir, i, &args)).collect();
    let mut args = SIM.to_vec();
    args.extend(["--kv-role", "kv_consumer"]);
    let mut endpoints: String = sims
        .iter()
        .map(|s| {
            format!(
                "- {{address: 127.0.0.1, port: {}, labels: {{llm-d.ai/role: prefill}}}}\n",
                s.port
            )
        })
        .collect();
    let mut sidecars = Vec::new();
    let mut addrs: Vec<String> = sims.iter().map(Sim::addr).collect();
    for i in 2..4 {
        let sim = start_sim(&dir, i, &args);
        let port = free_port_on("0.0.0.0");
        sidecars.push(start_sidecar(
            &dir,
            &format!("sidecar-{i}"),
            port,
            sim.port,
            "127.0.0.1",
            &[],
        ));
        addrs.push(format!("127.0.0.1:{port}"));
        endpoints.push_str(&format!(
            "- {{address: 127.0.0.1, port: {port}, labels: {{llm-d.ai/role: decode}}}}\n"
        ));
        sims.push(sim);
    }
    let endpoints = write(&dir, "endpoints.yaml", &endpoints);
    let config = write(&dir, "pd.yaml", &pd_config_text());
    let epp = start_epp(
        &dir,
        &["--endpoints-file", &endpoints, "--config-file", &config],
    );
    wait_scraped(epp.metrics_port, &addrs);
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    Fleet {
        _sims: sims,
        _sidecars: sidecars,
        _epp: epp,
        envoy,
    }
}

/// One request's result: status, TTFT, time per output token.
type Outcome = (u16, Duration, Duration);

async fn complete(port: u16, prompt: String, max_tokens: u32) -> Outcome {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": true,
    })
    .to_string();
    match http::send(
        port,
        "POST",
        "/v1/completions",
        &[("content-type", "application/json")],
        body,
    )
    .await
    {
        Ok(r) if r.status == 200 => {
            let first = r.chunks.first().map_or(r.total, |c| c.0);
            let last = r.chunks.last().map_or(r.total, |c| c.0);
            let tpot = (last.saturating_sub(first)) / max_tokens.saturating_sub(1).max(1);
            (200, first, tpot)
        }
        Ok(r) => (r.status, Duration::ZERO, Duration::ZERO),
        Err(_) => (0, Duration::ZERO, Duration::ZERO),
    }
}

/// A unique prompt of about `tokens` tokens (4 characters each).
fn prompt(seed: usize, tokens: usize) -> String {
    let mut s = format!("request {seed}: ");
    let mut x = seed as u64 * 2_654_435_761 + 1;
    while s.len() < tokens * 4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(char::from(b'a' + (x % 26) as u8));
        if x.is_multiple_of(6) {
            s.push(' ');
        }
    }
    s
}

async fn open_loop(port: u16, rate: f64, prompt_tokens: usize, max_tokens: u32) -> Vec<Outcome> {
    let n = (rate * SECONDS).round() as usize;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + gap.mul_f64(i as f64)).await;
        let p = prompt(i + prompt_tokens * 1000, prompt_tokens);
        tasks.push(tokio::spawn(complete(port, p, max_tokens)));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn report(name: &str, results: &[Outcome]) {
    let ok: Vec<&Outcome> = results.iter().filter(|r| r.0 == 200).collect();
    let mut ttft: Vec<Duration> = ok.iter().map(|r| r.1).collect();
    let mut tpot: Vec<Duration> = ok.iter().map(|r| r.2).collect();
    ttft.sort();
    tpot.sort();
    let ms = |v: &[Duration], p: f64| percentile(v, p).unwrap_or_default().as_secs_f64() * 1000.0;
    println!(
        "  {name:<34} ok {:>3}/{:<3}  TTFT p50 {:>7.0} p90 {:>7.0} ms   TPOT p50 {:>6.1} p90 {:>6.1} ms",
        ok.len(),
        results.len(),
        ms(&ttft, 50.0),
        ms(&ttft, 90.0),
        ms(&tpot, 50.0),
        ms(&tpot, 90.0),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let workloads: [(&str, f64, usize, u32); 2] = [
        ("long prompts, short outputs", 2.0, 8000, 16),
        ("short prompts, long outputs", 4.0, 256, 256),
    ];
    for (name, rate, prompt_tokens, max_tokens) in workloads {
        println!("{name}: {prompt_tokens} tokens in, {max_tokens} out, {rate} req/s, {SECONDS} s");
        for (fleet_name, start) in [
            ("aggregated (4 servers)", aggregated as fn() -> Fleet),
            ("P/D (2 prefill + 2 decode)", disaggregated as fn() -> Fleet),
        ] {
            let fleet = start();
            let results = open_loop(fleet.envoy.port, rate, prompt_tokens, max_tokens).await;
            report(fleet_name, &results);
        }
    }
}
