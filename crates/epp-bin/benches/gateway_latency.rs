//! Latency epp adds through Envoy, measured against the same Envoy routing
//! straight to the simulators (round-robin, no ext_proc), in one run.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo bench -p epp-bin --bench gateway_latency            # both scenarios
//! cargo bench -p epp-bin --bench gateway_latency -- --quick # shorter runs
//! ```
//!
//! Scenario 1: a fixed moderate rate (open loop) of 4 KiB chat requests.
//! Scenario 2: 220 KB prompts at concurrency 150 (closed loop), streamed,
//! time to first token measured at the client.
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

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Stats {
    lat: Vec<Duration>,
    errors: usize,
}

impl Stats {
    fn row(&mut self, name: &str) -> (Duration, Duration) {
        self.lat.sort();
        let (p50, p90, p99) = (
            pct(&self.lat, 50.0),
            pct(&self.lat, 90.0),
            pct(&self.lat, 99.0),
        );
        println!(
            "  {name:<28} n={:<6} errors={:<4} p50 {:>8.3} ms   p90 {:>8.3} ms   p99 {:>8.3} ms",
            self.lat.len(),
            self.errors,
            ms(p50),
            ms(p90),
            ms(p99)
        );
        (p50, p99)
    }
}

/// Open loop: one request every 1/rate seconds for `secs`, latency to the
/// full response.
async fn fixed_rate(port: u16, body: Arc<serde_json::Value>, rate: u32, secs: u64) -> Stats {
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let n = rate as u64 * secs;
    for i in 0..n {
        let due = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let body = Arc::clone(&body);
        tasks.push(tokio::spawn(async move {
            let r = http::post_json(port, "/v1/chat/completions", &body).await;
            match r {
                Ok(r) if r.status == 200 => Ok(r.total),
                _ => Err(()),
            }
        }));
    }
    let mut stats = Stats {
        lat: Vec::new(),
        errors: 0,
    };
    for t in tasks {
        match t.await.unwrap() {
            Ok(d) => stats.lat.push(d),
            Err(()) => stats.errors += 1,
        }
    }
    stats
}

/// Closed loop: `concurrency` clients each sending streamed requests; latency
/// to the first body chunk (time to first token).
async fn closed_loop(port: u16, body: Arc<String>, concurrency: usize, total: usize) -> Stats {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let body = Arc::clone(&body);
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                let mut out = Stats {
                    lat: Vec::new(),
                    errors: 0,
                };
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                    let r = http::send(
                        port,
                        "POST",
                        "/v1/chat/completions",
                        &[("content-type", "application/json")],
                        body.as_bytes().to_vec(),
                    )
                    .await;
                    match r {
                        Ok(r) if r.status == 200 => {
                            out.lat.push(r.chunks.first().map_or(r.total, |c| c.0));
                        }
                        _ => out.errors += 1,
                    }
                }
                out
            })
        })
        .collect();
    let mut stats = Stats {
        lat: Vec::new(),
        errors: 0,
    };
    for w in workers {
        let s = w.await.unwrap();
        stats.lat.extend(s.lat);
        stats.errors += s.errors;
    }
    stats
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes --bench; ignore everything else.
    let dir = scratch_dir("gateway-latency");
    let sims = start_sims(
        &dir,
        4,
        &["--ttft-ms", "0", "--itl-ms", "0", "--max-num-seqs", "256"],
    );
    let endpoints = sims
        .iter()
        .map(common::Sim::addr)
        .collect::<Vec<_>>()
        .join(",");
    let epp = start_epp(&dir, &["--endpoints", &endpoints]);
    let via_epp = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    let ports: Vec<u16> = sims.iter().map(|s| s.port).collect();
    let direct = start_envoy_round_robin(&dir, &ports);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let question = "Summarise the following text in one sentence. ".repeat(85); // ~4 KiB
    let body = Arc::new(serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 1,
    }));
    let (rate, secs) = if quick { (100, 3) } else { (200, 10) };
    println!("\nScenario 1: {rate} req/s for {secs} s, 4 KiB chat body, full response latency");
    // Warm both paths (connections, caches).
    let _ = fixed_rate(direct.port, Arc::clone(&body), rate, 1).await;
    let _ = fixed_rate(via_epp.port, Arc::clone(&body), rate, 1).await;
    let mut added = Vec::new();
    for round in 1..=2 {
        let d = fixed_rate(direct.port, Arc::clone(&body), rate, secs)
            .await
            .row(&format!("round {round}: Envoy direct (RR)"));
        let e = fixed_rate(via_epp.port, Arc::clone(&body), rate, secs)
            .await
            .row(&format!("round {round}: Envoy + epp"));
        added.push((ms(e.0) - ms(d.0), ms(e.1) - ms(d.1)));
    }
    for (i, (p50, p99)) in added.iter().enumerate() {
        println!(
            "  added by epp, round {}: p50 {p50:+.3} ms, p99 {p99:+.3} ms",
            i + 1
        );
    }

    let (conc, total) = if quick { (150, 300) } else { (150, 1500) };
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(5000); // ~220 KB
    let long_body = Arc::new(
        serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": [{"role": "user", "content": long}],
            "max_tokens": 1,
            "stream": true,
        })
        .to_string(),
    );
    println!(
        "\nScenario 2: {} KB prompts, concurrency {conc}, {total} requests, time to first token",
        long_body.len() / 1000
    );
    let mut added = Vec::new();
    for round in 1..=2 {
        let d = closed_loop(direct.port, Arc::clone(&long_body), conc, total)
            .await
            .row(&format!("round {round}: Envoy direct (RR)"));
        let e = closed_loop(via_epp.port, Arc::clone(&long_body), conc, total)
            .await
            .row(&format!("round {round}: Envoy + epp"));
        added.push((ms(e.0) - ms(d.0), ms(e.1) - ms(d.1)));
    }
    for (i, (p50, p99)) in added.iter().enumerate() {
        println!(
            "  added by epp, round {}: p50 {p50:+.3} ms, p99 {p99:+.3} ms",
            i + 1
        );
    }
}
