//! CPU each picker spends keeping a pool's endpoints fresh, idle (no
//! requests): epp and the reference picker, both following the same
//! InferencePool of 256 Ready pods whose metrics pages (the ~100 KB vLLM page
//! of `epp-datalayer`'s `scrape_fleet` bench) come from one farm process, each
//! refreshing every 50 ms.
//!
//! ```sh
//! cargo build --release -p epp-bin -p epp-sim --bins
//! cargo bench -p epp-bin --bench scrape_cpu            # 3 rounds of 10 s windows
//! cargo bench -p epp-bin --bench scrape_cpu -- --quick # 3 rounds of 4 s windows
//! EPP_BENCH_PODS=64 cargo bench -p epp-bin --bench scrape_cpu # another pool size
//! # extra flags for the reference:
//! EPP_BENCH_REFERENCE_ARGS=--v=1 cargo bench -p epp-bin --bench scrape_cpu
//! ```
//!
//! The reference (`scripts/reference-epp.sh`, built on first use and cached)
//! and the control plane (`scripts/kube-env.sh`) are the gateway_latency
//! bench's. Pods have IPs 127.1.0.1, 127.1.0.2, … (all loopback on Linux);
//! the farm, a child process (this executable run again), listens on one port
//! of every address and counts the scrapes it answers per client
//! `User-Agent` and the distinct pod IPs each client reached. epp starts
//! first and the farm tells its user agent apart once it has reached every
//! pod; then the reference starts, likewise. Both get the same config file
//! (`epp_plugins::DEFAULT_CONFIG`) and `--refresh-metrics-interval 50ms`
//! (both pickers' default, passed explicitly).
//!
//! Measurement: 3 rounds; in each, every picker in turn (the order reversed
//! every other round) gets a window alone: the other picker is stopped
//! (SIGSTOP) for it and resumed (SIGCONT) after, and the window starts after
//! a settling pause. On 2 cores shared with the farm, running both at once
//! would make each picker's figures depend on how much CPU the other takes
//! (the reference alone can use both cores); alone, each gets the same
//! machine. Per window: scrapes/s the farm answered that picker, the
//! picker's CPU (utime + stime, `/proc/<pid>/stat`) in cores and per scrape,
//! its VmRSS. One more window with both running follows, for information.
//! The run ends with a side-by-side table of medians and epp ÷ reference.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::BTreeMap,
    process::Command,
    time::{Duration, Instant},
};

use epp_test_support::{
    metrics_farm::{ClientCount, MetricsFarm, serve_if_child, vllm_page},
    process::{Epp, cpu_seconds, load_average, memory_mib, scratch_dir},
    side_by_side::{PoolPickers, REFRESH, start_pool_pickers},
    stats::median,
};

const ROUNDS: usize = 3;

struct Picker {
    label: &'static str,
    epp: Epp,
    /// Its `User-Agent` at the farm.
    agent: String,
}

impl Picker {
    fn pid(&self) -> u32 {
        self.epp.proc.pid()
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid} failed");
}

/// One picker's figures over one window.
#[derive(Clone, Copy)]
struct Window {
    scrapes_per_s: f64,
    cores: f64,
    us_per_scrape: f64,
    rss: f64,
    hwm: f64,
}

fn scrapes(counts: &BTreeMap<String, ClientCount>, agent: &str) -> u64 {
    counts.get(agent).map_or(0, |c| c.scrapes)
}

/// Measures `pickers` over `window` after `settle`: scrapes/s per picker at
/// the farm, CPU per picker, the farm's CPU.
fn measure(
    farm: &MetricsFarm,
    pickers: &[&Picker],
    settle: Duration,
    window: Duration,
) -> (Vec<Window>, f64, BTreeMap<String, ClientCount>) {
    std::thread::sleep(settle);
    let (c0, t0) = (farm.counts(), Instant::now());
    let cpu0: Vec<f64> = pickers.iter().map(|p| cpu_seconds(p.pid())).collect();
    let farm0 = cpu_seconds(farm.proc.pid());
    std::thread::sleep(window);
    let cpu1: Vec<f64> = pickers.iter().map(|p| cpu_seconds(p.pid())).collect();
    let farm1 = cpu_seconds(farm.proc.pid());
    let (c1, wall) = (farm.counts(), t0.elapsed().as_secs_f64());
    let delta: BTreeMap<String, ClientCount> = c1
        .iter()
        .map(|(ua, c)| {
            let before = c0.get(ua).copied().unwrap_or_default();
            (
                ua.clone(),
                ClientCount {
                    scrapes: c.scrapes - before.scrapes,
                    pod_ips: c.pod_ips,
                },
            )
        })
        .collect();
    let windows = pickers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n = scrapes(&c1, &p.agent) - scrapes(&c0, &p.agent);
            let cpu = cpu1[i] - cpu0[i];
            let (rss, hwm) = memory_mib(p.pid());
            Window {
                scrapes_per_s: n as f64 / wall,
                cores: cpu / wall,
                us_per_scrape: cpu * 1e6 / (n.max(1) as f64),
                rss,
                hwm,
            }
        })
        .collect();
    (windows, (farm1 - farm0) / wall, delta)
}

async fn run() {
    let quick = std::env::args().any(|a| a == "--quick");
    let pods: usize =
        std::env::var("EPP_BENCH_PODS").map_or(256, |v| v.parse().expect("EPP_BENCH_PODS"));
    assert!((1..=60_000).contains(&pods), "EPP_BENCH_PODS: 1 to 60000");
    let (settle, window) = if quick {
        (Duration::from_secs(2), Duration::from_secs(4))
    } else {
        (Duration::from_secs(3), Duration::from_secs(10))
    };
    let dir = scratch_dir("scrape-cpu");
    let config = dir.join("endpoint-picker-config.yaml");
    std::fs::write(&config, epp_plugins::DEFAULT_CONFIG).unwrap();
    println!("load average at start: {}", load_average());

    let page = vllm_page();
    let farm = MetricsFarm::start(&dir, &page);
    println!(
        "farm: {} bytes per page on port {} of every address",
        page.len(),
        farm.port
    );
    let PoolPickers {
        epp,
        epp_agent,
        reference,
        reference_agent,
        ns: _ns,
        cluster: _cluster,
    } = start_pool_pickers(&dir, "scrape-cpu", &farm, pods, &config).await;
    let pickers = [
        Picker {
            label: "epp",
            epp,
            agent: epp_agent,
        },
        Picker {
            label: "reference",
            epp: reference,
            agent: reference_agent,
        },
    ];
    let target = pods as f64 / 0.050;
    println!(
        "\n{ROUNDS} rounds, each picker alone (the other stopped) for {:.0} s after {:.0} s; \
         target {target:.0} scrapes/s each",
        window.as_secs_f64(),
        settle.as_secs_f64()
    );
    let mut samples: Vec<Vec<Window>> = vec![Vec::new(); pickers.len()];
    for round in 1..=ROUNDS {
        let mut order: Vec<usize> = (0..pickers.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let others: Vec<&Picker> = (0..pickers.len())
                .filter(|&j| j != i)
                .map(|j| &pickers[j])
                .collect();
            for o in &others {
                signal(o.pid(), "STOP");
            }
            let (w, farm_cores, delta) = measure(&farm, &[&pickers[i]], settle, window);
            for o in &others {
                signal(o.pid(), "CONT");
            }
            let w = w[0];
            let strays: u64 = others
                .iter()
                .map(|o| delta.get(&o.agent).map_or(0, |c| c.scrapes))
                .sum();
            println!(
                "  round {round}: {:<10} scrapes/s {:>6.0}  CPU {:>5.2} cores  {:>6.1} µs/scrape  \
                 VmRSS {:>6.1} MiB  (farm {:.2} cores; stopped picker's scrapes {strays}; load {})",
                pickers[i].label,
                w.scrapes_per_s,
                w.cores,
                w.us_per_scrape,
                w.rss,
                farm_cores,
                load_average()
            );
            samples[i].push(w);
        }
    }
    println!(
        "\nboth running at once for {:.0} s (information only: they share the cores)",
        window.as_secs_f64()
    );
    let all: Vec<&Picker> = pickers.iter().collect();
    let (both, farm_cores, _) = measure(&farm, &all, settle, window);
    for (p, w) in pickers.iter().zip(&both) {
        println!(
            "  {:<10} scrapes/s {:>6.0}  CPU {:>5.2} cores  {:>6.1} µs/scrape",
            p.label, w.scrapes_per_s, w.cores, w.us_per_scrape
        );
    }
    println!("  farm {farm_cores:.2} cores; load {}", load_average());

    println!(
        "\nSide by side: {pods} endpoints at {REFRESH}, ~{} KB pages, idle; medians of {ROUNDS} \
         windows alone (ratio = epp ÷ reference)",
        page.len() / 1000
    );
    println!(
        "  {:<44} {:>12} {:>12} {:>10}",
        "figure", "epp", "reference", "ratio"
    );
    let line = |name: &str, f: fn(&Window) -> f64, prec: usize| {
        let v: Vec<f64> = samples
            .iter()
            .map(|s| median(s.iter().map(f).collect()))
            .collect();
        println!(
            "  {name:<44} {:>12.prec$} {:>12.prec$} {:>10.3}",
            v[0],
            v[1],
            v[0] / v[1]
        );
    };
    line("scrapes/s achieved (at the farm)", |w| w.scrapes_per_s, 0);
    line("CPU, cores", |w| w.cores, 3);
    line("CPU per scrape, µs", |w| w.us_per_scrape, 1);
    println!(
        "  {:<44} {:>12.2} {:>12.2} {:>10.3}",
        "cores at the target rate (µs/scrape × target)",
        median(samples[0].iter().map(|w| w.us_per_scrape).collect()) * target / 1e6,
        median(samples[1].iter().map(|w| w.us_per_scrape).collect()) * target / 1e6,
        median(samples[0].iter().map(|w| w.us_per_scrape).collect())
            / median(samples[1].iter().map(|w| w.us_per_scrape).collect()),
    );
    line("resident memory, VmRSS MiB", |w| w.rss, 1);
    line("peak resident memory, VmHWM MiB", |w| w.hwm, 1);
    println!("load average at the end: {}", load_average());
}

fn main() {
    serve_if_child();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}
