//! Latency epp adds through Envoy, measured against the same Envoy routing
//! straight to the simulators (round-robin, no ext_proc), in one run.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo bench -p epp-bin --bench gateway_latency            # both scenarios
//! cargo bench -p epp-bin --bench gateway_latency -- --quick # shorter runs
//! # and an older build side by side, alternating in the same run:
//! EPP_BENCH_BASELINE=/tmp/old/epp cargo bench -p epp-bin --bench gateway_latency
//! ```
//!
//! Scenario 1: a fixed moderate rate (open loop) of 4 KiB chat requests.
//! Scenario 2: 220 KB prompts at concurrency 150 (closed loop), streamed,
//! time to first token measured at the client.
//!
//! Each epp build is measured behind two Envoys, FULL_DUPLEX_STREAMED and
//! BUFFERED bodies. Besides latencies, each row gives the CPU time epp and
//! Envoy spent per request (from `/proc/<pid>/stat` around the run): on a
//! machine shared with other work the latencies move with the load, the CPU
//! per request much less.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use epp_test_support::{
    http,
    process::{
        BodyMode, Envoy, Epp, Sim, epp_command_at, scratch_dir, spawn_epp, start_envoy,
        start_envoy_round_robin, start_epp, start_sims,
    },
    stats::percentile,
};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    percentile(sorted, p).unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Stats {
    lat: Vec<Duration>,
    errors: usize,
}

impl Stats {
    /// Prints the row; `cpu` = (epp, Envoy) CPU seconds spent during the run.
    fn row(&mut self, name: &str, cpu: (Option<f64>, f64)) -> (Duration, Duration) {
        self.lat.sort();
        let (p50, p90, p99) = (
            pct(&self.lat, 50.0),
            pct(&self.lat, 90.0),
            pct(&self.lat, 99.0),
        );
        let n = self.lat.len() + self.errors;
        let per = |secs: f64| secs * 1e6 / n.max(1) as f64;
        let epp = cpu
            .0
            .map_or_else(|| "-".to_owned(), |s| format!("{:.0}", per(s)));
        println!(
            "  {name:<32} n={:<5} err={:<3} p50 {:>8.3}  p90 {:>8.3}  p99 {:>8.3} ms   \
             CPU/req epp {epp:>5} µs, Envoy {:>5.0} µs",
            self.lat.len(),
            self.errors,
            ms(p50),
            ms(p90),
            ms(p99),
            per(cpu.1),
        );
        (p50, p99)
    }
}

/// `utime + stime` of a process in seconds (100 Hz clock ticks).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// One way through to the simulators: an Envoy, and the epp behind it if any.
struct Route {
    name: String,
    envoy: Envoy,
    epp_pid: Option<u32>,
}

impl Route {
    fn cpu(&self) -> (Option<f64>, f64) {
        (
            self.epp_pid.map(cpu_seconds),
            cpu_seconds(self.envoy.proc.pid()),
        )
    }

    /// Runs `load` through this route and prints its row.
    async fn measure<F: Future<Output = Stats>>(
        &self,
        round: usize,
        load: impl FnOnce(u16) -> F,
    ) -> (Duration, Duration) {
        let before = self.cpu();
        let mut stats = load(self.envoy.port).await;
        let after = self.cpu();
        let spent = (
            before.0.zip(after.0).map(|(b, a)| a - b),
            after.1 - before.1,
        );
        stats.row(&format!("round {round}: {}", self.name), spent)
    }
}

/// Runs every route in turn, `rounds` times (the order reversed every other
/// round), then prints what each epp route added to the direct one.
async fn compare<F: Future<Output = Stats>>(
    routes: &[Route],
    rounds: usize,
    load: impl Fn(u16) -> F,
) {
    let mut added: Vec<Vec<(f64, f64)>> = vec![Vec::new(); routes.len()];
    for round in 1..=rounds {
        let direct = routes[0].measure(round, &load).await;
        let mut order: Vec<usize> = (1..routes.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let e = routes[i].measure(round, &load).await;
            added[i].push((ms(e.0) - ms(direct.0), ms(e.1) - ms(direct.1)));
        }
    }
    for (route, added) in routes.iter().zip(&added).skip(1) {
        let text: Vec<String> = added
            .iter()
            .map(|(p50, p99)| format!("p50 {p50:+.2} / p99 {p99:+.2} ms"))
            .collect();
        println!("  added by {:<28} {}", route.name, text.join(",  "));
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
    let endpoints = sims.iter().map(Sim::addr).collect::<Vec<_>>().join(",");
    let ports: Vec<u16> = sims.iter().map(|s| s.port).collect();
    let mut routes = vec![Route {
        name: "Envoy direct (RR)".to_owned(),
        envoy: start_envoy_round_robin(&dir, &ports),
        epp_pid: None,
    }];
    let mut epps: Vec<(&str, Epp)> = vec![("epp", start_epp(&dir, &["--endpoints", &endpoints]))];
    if let Some(bin) = std::env::var_os("EPP_BENCH_BASELINE") {
        let mut cmd = epp_command_at(std::path::Path::new(&bin));
        cmd.arg("--secure-serving=false")
            .args(["--endpoints", &endpoints])
            .env("RUST_LOG", "info");
        let (epp, _) = spawn_epp("epp-baseline", cmd, dir.join("epp-baseline.log"));
        epps.push(("baseline epp", epp));
    }
    for (label, epp) in &epps {
        let sub = dir.join(label.replace(' ', "-"));
        std::fs::create_dir_all(&sub).unwrap();
        for (mode, mode_name) in [
            (BodyMode::Streamed, "FULL_DUPLEX"),
            (BodyMode::Buffered, "BUFFERED"),
        ] {
            routes.push(Route {
                name: format!("Envoy + {label}, {mode_name}"),
                envoy: start_envoy(&sub, mode, epp.grpc_port),
                epp_pid: Some(epp.proc.pid()),
            });
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let question = "Summarise the following text in one sentence. ".repeat(85); // ~4 KiB
    let body = Arc::new(serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 1,
    }));
    let (rate, secs) = if quick { (100, 3) } else { (200, 10) };
    println!("\nScenario 1: {rate} req/s for {secs} s, 4 KiB chat body, full response latency");
    // Warm every path (connections, caches).
    for r in &routes {
        let _ = fixed_rate(r.envoy.port, Arc::clone(&body), rate, 1).await;
    }
    compare(&routes, 2, |port| {
        fixed_rate(port, Arc::clone(&body), rate, secs)
    })
    .await;

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
    compare(&routes, 2, |port| {
        closed_loop(port, Arc::clone(&long_body), conc, total)
    })
    .await;
}
