//! Routing quality on a simulated fleet: the same open-loop workload through
//! Envoy + epp (default config) and through Envoy round-robin, on fresh
//! simulators per point, sweeping the request rate.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo bench -p epp-bin --bench routing              # full sweep
//! cargo bench -p epp-bin --bench routing -- --quick   # one short point
//! ```
//!
//! Workload "shared prefix": 16 tenants, each with a ~6,000-token system
//! prompt, asking short questions (streamed chat, 16 output tokens). Four
//! simulators with room for about five tenants' prefixes each, so a router
//! that spreads a tenant over all servers thrashes their caches.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use common::{
    BodyMode, http, scratch_dir, start_envoy, start_envoy_round_robin, start_epp, start_sims,
};

const SIM_ARGS: [&str; 10] = [
    "--max-num-seqs",
    "16",
    "--num-gpu-blocks",
    "2048",
    "--prefill-us-per-token",
    "20",
    "--itl-ms",
    "5",
    "--seed",
    "1",
];

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

/// Sum of a counter over simulators' /metrics.
fn counter(ports: &[u16], name: &str) -> f64 {
    ports
        .iter()
        .filter_map(|&p| http::get_blocking(p, "/metrics").ok())
        .flat_map(|(_, text)| {
            text.lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

struct Point {
    ttft: Vec<Duration>,
    errors: usize,
    tokens: u64,
    elapsed: Duration,
}

async fn run(port: u16, rate: f64, secs: f64, seed: u64) -> Point {
    let prompts: Arc<Vec<String>> = Arc::new(
        (0..16)
            .map(|t| {
                format!(
                    "You are the assistant of tenant {t}. Follow the house style guide carefully. "
                )
                .repeat(300)
            })
            .collect(),
    );
    let start = Instant::now();
    let n = (rate * secs) as u64;
    let mut tasks = Vec::new();
    // Deterministic exponential inter-arrival times (Poisson arrivals).
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut at = 0.0;
    for i in 0..n {
        at += -(1.0 - next()).ln() / rate;
        let tenant = (next() * 16.0) as usize % 16;
        tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
        let prompts = Arc::clone(&prompts);
        tasks.push(tokio::spawn(async move {
            let body = serde_json::json!({
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "messages": [
                    {"role": "system", "content": prompts[tenant]},
                    {"role": "user", "content": format!("Question {i}: summarise your instructions.")}
                ],
                "max_tokens": 16,
                "stream": true,
            });
            let r = http::post_json(port, "/v1/chat/completions", &body).await;
            match r {
                Ok(r) if r.status == 200 => Some(r.chunks.first().map_or(r.total, |c| c.0)),
                _ => None,
            }
        }));
    }
    let mut p = Point {
        ttft: Vec::new(),
        errors: 0,
        tokens: 0,
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        match t.await.unwrap() {
            Some(d) => {
                p.ttft.push(d);
                p.tokens += 16;
            }
            None => p.errors += 1,
        }
    }
    p.elapsed = start.elapsed();
    p.ttft.sort();
    p
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rates, secs): (&[f64], f64) = if quick {
        (&[8.0], 8.0)
    } else {
        (&[4.0, 8.0, 16.0, 24.0, 32.0], 20.0)
    };
    println!(
        "\nshared-prefix workload: 16 tenants x ~6,000-token system prompts, 4 simulators, streamed chat"
    );
    println!(
        "{:<22} {:>6} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "contender", "req/s", "TTFT p50", "TTFT p90", "TTFT p99", "out tok/s", "hit rate", "errors"
    );
    for &rate in rates {
        for contender in ["envoy + epp", "envoy round-robin"] {
            let dir = scratch_dir("routing");
            let sims = start_sims(&dir, 4, &SIM_ARGS);
            let ports: Vec<u16> = sims.iter().map(|s| s.port).collect();
            let endpoints = sims
                .iter()
                .map(common::Sim::addr)
                .collect::<Vec<_>>()
                .join(",");
            let (_epp, envoy) = if contender == "envoy + epp" {
                let epp = start_epp(&dir, &["--endpoints", &endpoints]);
                let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
                (Some(epp), envoy)
            } else {
                (None, start_envoy_round_robin(&dir, &ports))
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            let p = run(envoy.port, rate, secs, 7).await;
            let hits = counter(&ports, "vllm:prefix_cache_hits_total");
            let queries = counter(&ports, "vllm:prefix_cache_queries_total");
            println!(
                "{contender:<22} {rate:>6.1} {:>7.0}ms {:>7.0}ms {:>7.0}ms {:>9.0} {:>10.3} {:>7}",
                pct(&p.ttft, 50.0),
                pct(&p.ttft, 90.0),
                pct(&p.ttft, 99.0),
                p.tokens as f64 / p.elapsed.as_secs_f64(),
                if queries > 0.0 {
                    hits / queries
                } else {
                    f64::NAN
                },
                p.errors
            );
        }
    }
}
