//! CPU cost of keeping a fleet of endpoints fresh: the real data layer
//! (connections, scrapers, `core-metrics-extractor`) scraping a local server
//! farm that serves a ~100 KB vLLM page, every 50 ms.
//!
//! The farm runs in a child process (this executable re-run with
//! `EPP_BENCH_FARM=<n>`), so the CPU measured here is the scraper's alone.
//! Reported per fleet size: achieved scrapes/s, process CPU (cores), and CPU
//! µs per scrape split into parsing (extraction, measured alone on the same
//! page) and the rest (HTTP, timers, publishing).
//!
//! ```text
//! cargo bench -p epp-datalayer --bench scrape_fleet            # 256 and 1024 endpoints
//! EPP_BENCH_ENDPOINTS=256 EPP_BENCH_SECS=20 cargo bench -p epp-datalayer --bench scrape_fleet
//! ```

#![expect(clippy::unwrap_used, reason = "a benchmark panics on setup failure")]

use std::{
    io::{BufRead, Write},
    net::SocketAddr,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use epp_core::{Endpoint, EndpointMetrics, Extractor};
use epp_datalayer::{
    CoreMetricsExtractor, DataLayer, DataLayerOptions, EndpointSpec, EndpointStore,
    default_source_wiring,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The first ~100 KiB (whole lines) of the parser crate's large vLLM fixture:
/// a data-parallel vLLM page with three engine ranks and their histograms
/// (the page the side-by-side data-layer bench serves too).
fn page() -> String {
    epp_test_support::metrics_farm::vllm_page()
}

// === The farm (child process) ===

fn farm(n: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let body = page();
        let response: Arc<[u8]> = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
        .into();
        let mut ports = Vec::with_capacity(n);
        for _ in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ports.push(listener.local_addr().unwrap().port().to_string());
            let response = Arc::clone(&response);
            tokio::spawn(async move {
                while let Ok((mut s, _)) = listener.accept().await {
                    let response = Arc::clone(&response);
                    tokio::spawn(async move {
                        let mut buf = [0u8; 2048];
                        let mut head = Vec::new();
                        loop {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => head.extend_from_slice(&buf[..k]),
                            }
                            while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                                head.drain(..end + 4);
                                if s.write_all(&response).await.is_err() {
                                    return;
                                }
                            }
                        }
                    });
                }
            });
        }
        let mut out = std::io::stdout();
        writeln!(out, "ports {}", ports.join(",")).unwrap();
        out.flush().unwrap();
        // Until the parent closes our stdin.
        let mut stdin = tokio::io::stdin();
        let mut sink = [0u8; 64];
        while stdin.read(&mut sink).await.is_ok_and(|k| k > 0) {}
    });
}

// === Measurement (parent) ===

/// User + system CPU time of this process.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // CLK_TCK is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// CPU µs of one extraction of `page` (what a successful scrape parses).
fn parse_cost(page: &str) -> f64 {
    let x = CoreMetricsExtractor::builtin("core");
    let e = Endpoint::new(0, "10.0.0.1:8000".parse().unwrap());
    let mut m = EndpointMetrics::default();
    x.extract(&e, page, &mut m).unwrap();
    assert!(
        m.waiting > 0 && m.kv_usage > 0.0,
        "the page has the core gauges"
    );
    let n = 2000;
    let start = Instant::now();
    for _ in 0..n {
        let text = std::str::from_utf8(std::hint::black_box(page.as_bytes())).unwrap();
        x.extract(&e, text, &mut m).unwrap();
        std::hint::black_box(&m);
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn run_fleet(n: usize, secs: u64, parse_us: f64) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .env("EPP_BENCH_FARM", n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addrs: Vec<SocketAddr> = line
        .trim()
        .strip_prefix("ports ")
        .unwrap()
        .split(',')
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p.parse().unwrap())))
        .collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(EndpointStore::new());
        store.replace_source("bench", addrs.iter().copied().map(EndpointSpec::new).collect());
        let opts = DataLayerOptions::default();
        let interval = opts.refresh_interval;
        let dl = DataLayer::start(
            Arc::clone(&store),
            &[default_source_wiring()],
            opts,
            CancellationToken::new(),
        )
        .unwrap();
        let scrapes = |dl: &DataLayer| dl.status().iter().map(|s| s.ok + s.failed).sum::<u64>();
        let failed = |dl: &DataLayer| dl.status().iter().map(|s| s.failed).sum::<u64>();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (c0, s0, f0, t0) = (process_cpu(), scrapes(&dl), failed(&dl), Instant::now());
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let (c1, s1, f1, t1) = (process_cpu(), scrapes(&dl), failed(&dl), Instant::now());
        dl.stop().await;

        let wall = (t1 - t0).as_secs_f64();
        let cpu = (c1 - c0).as_secs_f64();
        let done = (s1 - s0) as f64;
        let target = n as f64 / interval.as_secs_f64();
        let per_scrape = cpu * 1e6 / done.max(1.0);
        println!(
            "endpoints {n:>5}  scrapes/s {:>7.0} (target {target:>6.0})  failed {:>4}  CPU {:>5.1}% of one core  \
             per scrape {per_scrape:>6.1} µs = parse {parse_us:>5.1} + HTTP/other {:>5.1}  \
             → at target rate {:>5.1}% of one core",
            done / wall,
            f1 - f0,
            cpu / wall * 100.0,
            per_scrape - parse_us,
            per_scrape * target / 1e4,
        );
    });
    drop(child.stdin.take());
    let _ = child.wait();
}

fn main() {
    if let Ok(n) = std::env::var("EPP_BENCH_FARM") {
        farm(n.parse().unwrap());
        return;
    }
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = std::env::var("EPP_BENCH_ENDPOINTS")
        .unwrap_or_else(|_| if quick { "8".into() } else { "256,1024".into() })
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let secs: u64 = std::env::var("EPP_BENCH_SECS")
        .ok()
        .map_or(if quick { 1 } else { 10 }, |s| s.parse().unwrap());
    let page = page();
    let parse_us = parse_cost(&page);
    println!(
        "page {} bytes; extraction alone {parse_us:.1} µs ({:.2} GB/s)",
        page.len(),
        page.len() as f64 / parse_us / 1e3
    );
    for n in sizes {
        run_fleet(n, secs, parse_us);
    }
}
