//! The demo behind `scripts/demo.sh`: four simulated model servers, epp and
//! Envoy on loopback, a burst of requests through Envoy, and a report of which
//! server served how many with latency percentiles. Everything is shut down
//! at the end.
//!
//! Flags: `--requests N` (default 400), `--concurrency C` (default 32),
//! `--mode streamed|buffered` (Envoy body mode, default streamed).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
    stats::percentile,
};

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let requests: usize = flag("--requests").map_or(400, |v| v.parse().expect("--requests N"));
    let concurrency: usize =
        flag("--concurrency").map_or(32, |v| v.parse().expect("--concurrency C"));
    let mode = match flag("--mode").as_deref() {
        None | Some("streamed") => BodyMode::Streamed,
        Some("buffered") => BodyMode::Buffered,
        Some(other) => panic!("--mode streamed|buffered, not {other}"),
    };

    println!("starting 4 simulators, epp and Envoy ({mode:?} bodies) on loopback ...");
    let stack = Stack::start(
        "demo",
        4,
        &["--max-num-seqs", "8", "--ttft-ms", "20", "--itl-ms", "2"],
        &[],
        mode,
    );
    for (i, s) in stack.sims.iter().enumerate() {
        println!("  sim-{i}   127.0.0.1:{}", s.port);
    }
    println!(
        "  epp     ext_proc 127.0.0.1:{}  health :{}  metrics :{}",
        stack.epp.grpc_port, stack.epp.health_port, stack.epp.metrics_port
    );
    println!(
        "  envoy   127.0.0.1:{} (admin :{})",
        stack.envoy.port, stack.envoy.admin_port
    );
    // Let the first scrapes land so epp is ready.
    tokio::time::sleep(Duration::from_millis(300)).await;

    println!("\nsending {requests} chat requests through Envoy, {concurrency} at a time:");
    println!("  16 tenants, each with its own 2 KB system prompt; every 4th request streams");
    let results = Arc::new(Mutex::new(Vec::with_capacity(requests)));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let port = stack.envoy.port;
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let results = Arc::clone(&results);
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= requests {
                        break;
                    }
                    let tenant = i % 16;
                    let system = format!("You are assistant #{tenant}. ").repeat(80);
                    let stream = i.is_multiple_of(4);
                    let body = serde_json::json!({
                        "model": "meta-llama/Llama-3.1-8B-Instruct",
                        "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": format!("Question {i}: what is {i} squared?")}
                        ],
                        "max_tokens": 16,
                        "stream": stream,
                    });
                    let r = http::post_json(port, "/v1/chat/completions", &body).await;
                    results.lock().unwrap().push(r.map(|r| {
                        let pod = r.header("x-inference-pod").unwrap_or("?").to_owned();
                        let first = r.chunks.first().map_or(r.total, |c| c.0);
                        (r.status, pod, r.total, first)
                    }));
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let elapsed = started.elapsed();

    let results = results.lock().unwrap();
    let mut per_pod = std::collections::BTreeMap::<String, usize>::new();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    let mut totals = Vec::new();
    let mut firsts = Vec::new();
    for r in results.iter() {
        match r {
            Ok((status, pod, total, first)) => {
                *statuses.entry(status.to_string()).or_default() += 1;
                if *status == 200 {
                    *per_pod.entry(pod.clone()).or_default() += 1;
                    totals.push(*total);
                    firsts.push(*first);
                }
            }
            Err(e) => *statuses.entry(format!("error: {e}")).or_default() += 1,
        }
    }
    totals.sort();
    firsts.sort();
    println!(
        "\ndone in {:.2} s ({:.0} req/s); statuses: {statuses:?}",
        elapsed.as_secs_f64(),
        results.len() as f64 / elapsed.as_secs_f64()
    );
    println!("\nserved by:");
    for (pod, n) in &per_pod {
        println!(
            "  {pod:<8} {n:>5}  {}",
            "#".repeat(n * 40 / requests.max(1))
        );
    }
    println!("\nlatency (client-side, through Envoy)   p50        p90        p99        max");
    for (name, v) in [
        ("  first byte of body", &firsts),
        ("  full response     ", &totals),
    ] {
        println!(
            "{name}                 {:<10} {:<10} {:<10} {}",
            ms(percentile(v, 50.0).unwrap_or_default()),
            ms(percentile(v, 90.0).unwrap_or_default()),
            ms(percentile(v, 99.0).unwrap_or_default()),
            ms(v.last().copied().unwrap_or_default())
        );
    }
    drop(results);
    drop(stack);
    println!("\nall processes shut down.");
}
