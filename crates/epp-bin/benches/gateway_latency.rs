//! Latency epp adds through Envoy, measured against the same Envoy routing
//! straight to the simulators (round-robin, no ext_proc), and against the
//! reference endpoint picker behind the same Envoy, all in one run.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo bench -p epp-bin --bench gateway_latency            # every scenario
//! cargo bench -p epp-bin --bench gateway_latency -- --quick # shorter runs
//! # without the reference (no Go, no Kubernetes control plane):
//! EPP_BENCH_REFERENCE=off cargo bench -p epp-bin --bench gateway_latency
//! # extra flags for the reference (here: no log line per request):
//! EPP_BENCH_REFERENCE_ARGS=--v=1 cargo bench -p epp-bin --bench gateway_latency
//! # and an older build side by side, alternating in the same run:
//! EPP_BENCH_BASELINE=/tmp/old/epp cargo bench -p epp-bin --bench gateway_latency
//! # and both pickers again with a config that only picks at random (the
//! # floor: what the ext_proc hop costs when the decision costs nothing):
//! EPP_BENCH_FLOOR=on cargo bench -p epp-bin --bench gateway_latency
//! ```
//!
//! The fleet is 4 simulators (`EPP_BENCH_SIMS` to change) on 127.0.0.2,
//! 127.0.0.3, ..., one shared port. With
//! the reference on (the default), a kube-apiserver from
//! `scripts/kube-env.sh` holds an InferencePool over 4 Ready pods with those
//! IPs, and every picker follows that pool, the reference (built by
//! `scripts/reference-epp.sh`; it has no static mode) and epp alike, with the
//! same EndpointPickerConfig file (epp's default, which is the reference's
//! default profile). Without it, epp gets the same addresses as `--endpoints`.
//!
//! Scenario 1: a fixed moderate rate (open loop) of 4 KiB chat requests.
//! Scenario 2: 220 KB prompts at concurrency 150 (closed loop), streamed,
//! time to first token measured at the client.
//! Scenario 3: 4 KiB chat requests at concurrency 32 (closed loop): the
//! pickers busy, for decisions per picker CPU-second.
//!
//! Each picker is measured behind two Envoys, FULL_DUPLEX_STREAMED and
//! BUFFERED bodies, every route in turn, three rounds, the order reversed
//! every other round.
//! Besides latencies, each row gives the CPU time the picker and Envoy spent
//! per request (from `/proc/<pid>/stat` around the run, background work such
//! as metrics scraping included): on a machine shared with other work the
//! latencies move with the load, the CPU per request much less. The run ends
//! with a side-by-side table of epp and the reference and their ratio.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    net::SocketAddr,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use epp_test_support::{
    http,
    kube::{KubeCluster, Ns},
    process::{
        BodyMode, Envoy, Epp, Sim, cpu_seconds, epp_command_at, memory_mib, scratch_dir,
        shared_loopback_port, spawn_epp, start_envoy, start_envoy_round_robin_at,
        start_epp_on_pool, start_sim_at, workspace_bin,
    },
    reference::{reference_version, start_reference},
    stats::{median, percentile},
};

/// With `EPP_BENCH_FLOOR=on`, epp and the reference also run this config: a
/// random pick among the pool's endpoints, no filter, scorer or producer.
const FLOOR_CONFIG: &str = "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
";

/// Rounds per scenario: odd, so that the side-by-side medians are a round's
/// own figures, not the mean of two (one CPU stall moves a p99 by 100 ms here).
const ROUNDS: usize = 3;

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

/// One route's figures in one round.
#[derive(Clone, Copy, Default)]
struct Sample {
    p50: f64,
    p99: f64,
    /// Requests sent (answered or not).
    n: usize,
    errors: usize,
    /// CPU seconds the picker spent during the run, if the route has one.
    picker_cpu: Option<f64>,
}

impl Stats {
    /// Prints the row; `cpu` = (picker, Envoy) CPU seconds spent during the run.
    fn row(&mut self, name: &str, cpu: (Option<f64>, f64)) -> Sample {
        self.lat.sort();
        let (p50, p90, p99) = (
            pct(&self.lat, 50.0),
            pct(&self.lat, 90.0),
            pct(&self.lat, 99.0),
        );
        let n = self.lat.len() + self.errors;
        let per = |secs: f64| secs * 1e6 / n.max(1) as f64;
        let picker = cpu
            .0
            .map_or_else(|| "-".to_owned(), |s| format!("{:.0}", per(s)));
        println!(
            "  {name:<40} n={:<5} err={:<3} p50 {:>8.3}  p90 {:>8.3}  p99 {:>8.3} ms   \
             CPU/req picker {picker:>5} µs, Envoy {:>5.0} µs",
            self.lat.len(),
            self.errors,
            ms(p50),
            ms(p90),
            ms(p99),
            per(cpu.1),
        );
        Sample {
            p50: ms(p50),
            p99: ms(p99),
            n,
            errors: self.errors,
            picker_cpu: cpu.0,
        }
    }
}

/// A picker under test.
struct Picker {
    label: &'static str,
    epp: Epp,
    /// Whether it works behind Envoy with BUFFERED bodies. The reference does
    /// not: it answers the request-headers message only once it has the body,
    /// which Envoy in BUFFERED mode sends only after that answer, so every
    /// request waits for Envoy's `message_timeout` and gets a 504.
    buffered: bool,
}

/// One way through to the simulators: an Envoy, and the picker behind it if any.
struct Route {
    name: String,
    envoy: Envoy,
    /// Index into the pickers, and the body mode's name.
    picker: Option<(usize, &'static str)>,
    picker_pid: Option<u32>,
}

impl Route {
    fn cpu(&self) -> (Option<f64>, f64) {
        (
            self.picker_pid.map(cpu_seconds),
            cpu_seconds(self.envoy.proc.pid()),
        )
    }

    /// Runs `load` through this route and prints its row.
    async fn measure<F: Future<Output = Stats>>(
        &self,
        round: usize,
        load: impl FnOnce(u16) -> F,
    ) -> Sample {
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

/// Every route's samples of one scenario: `[route][round]`.
type Results = Vec<Vec<Sample>>;

/// Runs every route in turn, `rounds` times (the order reversed every other
/// round), then prints what each picker route added to the direct one.
async fn compare<F: Future<Output = Stats>>(
    routes: &[Route],
    rounds: usize,
    load: impl Fn(u16) -> F,
) -> Results {
    let mut results: Results = vec![Vec::new(); routes.len()];
    for round in 1..=rounds {
        results[0].push(routes[0].measure(round, &load).await);
        let mut order: Vec<usize> = (1..routes.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for i in order {
            results[i].push(routes[i].measure(round, &load).await);
        }
    }
    for (route, samples) in routes.iter().zip(&results).skip(1) {
        let text: Vec<String> = samples
            .iter()
            .zip(&results[0])
            .map(|(s, d)| format!("p50 {:+.2} / p99 {:+.2} ms", s.p50 - d.p50, s.p99 - d.p99))
            .collect();
        println!("  added by {:<36} {}", route.name, text.join(",  "));
    }
    results
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

/// Closed loop: `concurrency` clients each sending requests; latency to the
/// first body chunk (time to first token when streamed).
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

/// Sends small requests through `port` until one is answered 200 (a picker
/// on a pool routes only after its first pod sync and metrics scrape).
async fn wait_routing(port: u16, what: &str) {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 1,
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last;
    loop {
        match http::post_json(port, "/v1/chat/completions", &body).await {
            Ok(r) if r.status == 200 => return,
            Ok(r) => last = format!("{}: {}", r.status, r.text()),
            Err(e) => last = e.to_string(),
        }
        assert!(
            Instant::now() < deadline,
            "{what} never routed a request; last answer {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One picker's figures in one scenario and body mode, medians over rounds.
#[derive(Clone, Copy)]
struct Figures {
    added_p50: f64,
    added_p99: f64,
    /// Decisions per picker CPU-second: requests over the picker's CPU time.
    per_cpu_second: f64,
    errors: usize,
}

fn figures(results: &Results, route: usize) -> Figures {
    let direct = &results[0];
    let own = &results[route];
    Figures {
        added_p50: median(own.iter().zip(direct).map(|(s, d)| s.p50 - d.p50).collect()),
        added_p99: median(own.iter().zip(direct).map(|(s, d)| s.p99 - d.p99).collect()),
        per_cpu_second: median(
            own.iter()
                .filter_map(|s| s.picker_cpu.map(|c| s.n as f64 / c.max(0.01)))
                .collect(),
        ),
        errors: own.iter().map(|s| s.errors).sum(),
    }
}

/// The side-by-side table: one row per figure, a column per picker, and the
/// ratio of the first picker (epp) to each other.
fn side_by_side(
    pickers: &[Picker],
    routes: &[Route],
    scenarios: &[(&str, &Results)],
    memory: &[[(f64, f64); 2]],
) {
    let labels: Vec<&str> = pickers.iter().map(|p| p.label).collect();
    println!(
        "\nSide by side (medians over rounds; ratio = {} ÷ other)",
        labels[0]
    );
    let mut header = format!("  {:<58}", "figure");
    for l in &labels {
        header += &format!(" {l:>14}");
    }
    for l in labels.iter().skip(1) {
        header += &format!(" {:>14}", format!("÷ {l}"));
    }
    println!("{header}");
    // NaN: the picker has no such route.
    let line = |name: String, values: Vec<f64>, unit: &str, prec: usize| {
        let mut s = format!("  {name:<58}");
        for v in &values {
            let text = if v.is_nan() {
                "n/a".to_owned()
            } else {
                format!("{v:.prec$}{unit}")
            };
            s += &format!(" {text:>14}");
        }
        for v in values.iter().skip(1) {
            // A ratio of a negative added latency (a noisy baseline) means nothing.
            let text = if values[0] > 0.0 && *v > 0.0 {
                let ratio = values[0] / v;
                if ratio < 0.1 {
                    format!("{ratio:.3}")
                } else {
                    format!("{ratio:.2}")
                }
            } else {
                "n/a".to_owned()
            };
            s += &format!(" {text:>14}");
        }
        println!("{s}");
    };
    let none = Figures {
        added_p50: f64::NAN,
        added_p99: f64::NAN,
        per_cpu_second: f64::NAN,
        errors: 0,
    };
    for (scenario, results) in scenarios {
        for mode in ["FULL_DUPLEX", "BUFFERED"] {
            let per_picker: Vec<Figures> = (0..pickers.len())
                .map(|p| {
                    routes
                        .iter()
                        .position(|r| r.picker == Some((p, mode)))
                        .map_or(none, |route| figures(results, route))
                })
                .collect();
            let col = |f: fn(&Figures) -> f64| per_picker.iter().map(f).collect::<Vec<_>>();
            line(
                format!("{scenario}, {mode}: added p50"),
                col(|f| f.added_p50),
                " ms",
                2,
            );
            line(
                format!("{scenario}, {mode}: added p99"),
                col(|f| f.added_p99),
                " ms",
                2,
            );
            line(
                format!("{scenario}, {mode}: decisions per CPU-second"),
                col(|f| f.per_cpu_second),
                "",
                0,
            );
            let errors = col(|f| f.errors as f64);
            if errors.iter().any(|&e| e > 0.0) {
                println!("  {scenario}, {mode}: errors {errors:?}");
            }
        }
    }
    line(
        format!("{}: resident memory, VmRSS", scenarios[0].0),
        memory.iter().map(|m| m[0].0).collect(),
        " MiB",
        1,
    );
    line(
        "after every scenario: resident memory, VmRSS".to_owned(),
        memory.iter().map(|m| m[1].0).collect(),
        " MiB",
        1,
    );
    line(
        "after every scenario: peak resident memory, VmHWM".to_owned(),
        memory.iter().map(|m| m[1].1).collect(),
        " MiB",
        1,
    );
}

/// The pool's pods, the simulators on their IPs, and where the pickers find them.
struct Fleet {
    _sims: Vec<Sim>,
    addrs: Vec<SocketAddr>,
    /// The control plane and namespace holding pool `pool`, when on.
    kube: Option<(KubeCluster, Ns)>,
}

async fn start_fleet(dir: &Path, n: usize, with_kube: bool) -> Fleet {
    let port = shared_loopback_port();
    let ips: Vec<String> = (0..n).map(|i| format!("127.0.0.{}", i + 2)).collect();
    let sims: Vec<Sim> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            start_sim_at(
                dir,
                &format!("sim-{i}"),
                ip,
                port,
                &["--ttft-ms", "0", "--itl-ms", "0", "--max-num-seqs", "256"],
            )
        })
        .collect();
    let addrs = ips
        .iter()
        .map(|ip| format!("{ip}:{port}").parse().unwrap())
        .collect();
    let kube = if with_kube {
        let cluster = KubeCluster::start("gateway-latency");
        let ns = Ns::create(&cluster, "bench").await;
        ns.apply_pool("pool", &[("app", "model")], &[port]).await;
        for (i, ip) in ips.iter().enumerate() {
            ns.pod(&format!("sim-{i}"), &[("app", "model")], ip, true)
                .await;
        }
        Some((cluster, ns))
    } else {
        None
    };
    Fleet {
        _sims: sims,
        addrs,
        kube,
    }
}

/// Starts an epp build (`bin`) on the fleet: on the pool when there is one,
/// else with static `--endpoints`; with `config` as its config file.
fn start_epp_on(dir: &Path, name: &str, bin: &Path, fleet: &Fleet, config: &Path) -> Epp {
    if let Some((cluster, ns)) = &fleet.kube {
        return start_epp_on_pool(
            dir,
            name,
            bin,
            &cluster.kubeconfig,
            &ns.name,
            "pool",
            config,
            &[],
        );
    }
    let endpoints: Vec<String> = fleet.addrs.iter().map(ToString::to_string).collect();
    let mut cmd = epp_command_at(bin);
    cmd.arg("--secure-serving=false")
        .arg("--config-file")
        .arg(config)
        .args(["--endpoints", &endpoints.join(",")])
        .env("RUST_LOG", "info");
    spawn_epp(name, cmd, dir.join(format!("{name}.log"))).0
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `cargo bench` passes --bench; ignore everything else.
    let with_reference = std::env::var("EPP_BENCH_REFERENCE").map_or(true, |v| v != "off");
    let dir = scratch_dir("gateway-latency");
    let config = dir.join("endpoint-picker-config.yaml");
    std::fs::write(&config, epp_plugins::DEFAULT_CONFIG).unwrap();
    let sims = std::env::var("EPP_BENCH_SIMS").map_or(4, |v| v.parse().expect("EPP_BENCH_SIMS"));
    assert!(
        (1..=250).contains(&sims),
        "EPP_BENCH_SIMS: 1 to 250 simulators"
    );
    let fleet = start_fleet(&dir, sims, with_reference).await;

    let mut pickers = vec![Picker {
        label: "epp",
        epp: start_epp_on(&dir, "epp", &workspace_bin("epp"), &fleet, &config),
        buffered: true,
    }];
    // Extra flags for the reference, e.g. `--v=1` to drop its per-request
    // log lines.
    let reference_args: Vec<String> = std::env::var("EPP_BENCH_REFERENCE_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if let Some((cluster, ns)) = &fleet.kube {
        println!("reference: {} {reference_args:?}", reference_version());
        pickers.push(Picker {
            label: "reference",
            epp: start_reference(
                &dir,
                &cluster.kubeconfig,
                &ns.name,
                "pool",
                &config,
                &reference_args,
            ),
            buffered: false,
        });
    }
    if let Some(bin) = std::env::var_os("EPP_BENCH_BASELINE") {
        pickers.push(Picker {
            label: "baseline epp",
            epp: start_epp_on(&dir, "epp-baseline", Path::new(&bin), &fleet, &config),
            buffered: true,
        });
    }
    if std::env::var("EPP_BENCH_FLOOR").is_ok_and(|v| v == "on") {
        // The same pickers deciding (almost) nothing: what is left of their
        // added latency is the ext_proc hop itself (Envoy's side and the
        // picker's protocol work), which no scoring change can remove.
        let floor = dir.join("floor-config.yaml");
        std::fs::write(&floor, FLOOR_CONFIG).unwrap();
        pickers.push(Picker {
            label: "epp floor",
            epp: start_epp_on(&dir, "epp-floor", &workspace_bin("epp"), &fleet, &floor),
            buffered: true,
        });
        if let Some((cluster, ns)) = &fleet.kube {
            // A directory of its own: the log file is named after the binary.
            let own = dir.join("reference-floor");
            std::fs::create_dir_all(&own).unwrap();
            pickers.push(Picker {
                label: "reference floor",
                epp: start_reference(
                    &own,
                    &cluster.kubeconfig,
                    &ns.name,
                    "pool",
                    &floor,
                    &reference_args,
                ),
                buffered: false,
            });
        }
    }
    let mut routes = vec![Route {
        name: "Envoy direct (RR)".to_owned(),
        envoy: start_envoy_round_robin_at(&dir, &fleet.addrs),
        picker: None,
        picker_pid: None,
    }];
    for (p, picker) in pickers.iter().enumerate() {
        let sub = dir.join(picker.label.replace(' ', "-"));
        std::fs::create_dir_all(&sub).unwrap();
        for (mode, mode_name) in [
            (BodyMode::Streamed, "FULL_DUPLEX"),
            (BodyMode::Buffered, "BUFFERED"),
        ] {
            if mode == BodyMode::Buffered && !picker.buffered {
                println!(
                    "{}: not behind a BUFFERED Envoy (it cannot route there)",
                    picker.label
                );
                continue;
            }
            let envoy = start_envoy(&sub, mode, picker.epp.grpc_port);
            wait_routing(envoy.port, picker.label).await;
            routes.push(Route {
                name: format!("Envoy + {}, {mode_name}", picker.label),
                envoy,
                picker: Some((p, mode_name)),
                picker_pid: Some(picker.epp.proc.pid()),
            });
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let question = "Summarise the following text in one sentence. ".repeat(85); // ~4 KiB
    let chat = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 1,
    });
    let body = Arc::new(chat.clone());
    let (rate, secs) = if quick { (100, 3) } else { (200, 10) };
    println!("\nScenario 1: {rate} req/s for {secs} s, 4 KiB chat body, full response latency");
    // Warm every path (connections, caches).
    for r in &routes {
        let _ = fixed_rate(r.envoy.port, Arc::clone(&body), rate, 1).await;
    }
    let moderate = compare(&routes, ROUNDS, |port| {
        fixed_rate(port, Arc::clone(&body), rate, secs)
    })
    .await;
    let memory_moderate: Vec<(f64, f64)> = pickers
        .iter()
        .map(|p| memory_mib(p.epp.proc.pid()))
        .collect();

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
    let kb = long_body.len() / 1000;
    println!(
        "\nScenario 2: {kb} KB prompts, concurrency {conc}, {total} requests, time to first token"
    );
    // Warm every path with a first wave of large bodies: the first one on a
    // route otherwise gives a tail of its own (buffers and windows growing).
    for r in &routes {
        let _ = closed_loop(r.envoy.port, Arc::clone(&long_body), conc, conc).await;
    }
    let large = compare(&routes, ROUNDS, |port| {
        closed_loop(port, Arc::clone(&long_body), conc, total)
    })
    .await;

    let (conc, total) = if quick { (32, 1000) } else { (32, 4000) };
    let small_body = Arc::new(chat.to_string());
    println!("\nScenario 3: 4 KiB chat body, concurrency {conc}, {total} requests, full response");
    let busy = compare(&routes, ROUNDS, |port| {
        closed_loop(port, Arc::clone(&small_body), conc, total)
    })
    .await;

    let memory: Vec<[(f64, f64); 2]> = pickers
        .iter()
        .zip(memory_moderate)
        .map(|(p, m)| [m, memory_mib(p.epp.proc.pid())])
        .collect();
    side_by_side(
        &pickers,
        &routes,
        &[
            (&format!("{rate} req/s, 4 KiB"), &moderate),
            (&format!("{kb} KB, concurrency 150, TTFT"), &large),
            ("4 KiB, concurrency 32", &busy),
        ],
        &memory,
    );
}
