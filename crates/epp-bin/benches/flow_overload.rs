//! Flow control under overload, through Envoy, on a small simulated fleet
//! (2 simulators, `--max-num-seqs 4`): every scenario in one run.
//!
//! ```sh
//! cargo build --release -p epp-bin -p epp-sim --bins
//! cargo bench -p epp-bin --bench flow_overload
//! cargo bench -p epp-bin --bench flow_overload -- tenants  # scenario 5 only
//! ```
//!
//! The fleet's capacity is measured first (closed loop, 8 clients = every
//! batch slot). Then, open loop, streamed chat requests of 16 output tokens,
//! time to first token at the client:
//! 1. critical requests alone at 0.5× capacity (the unloaded reference);
//! 2. the same critical load plus sheddable requests at 1.5× capacity
//!    (2× in all), flow control on (critical band first; sheddable band
//!    of 20 requests, TTL 5 s);
//! 3. the same load with `priority-holdback-policy` (`minCeiling` 0.75, 0.5
//!    and 0.25: the sheddable band is released only below that share of
//!    the slots);
//! 4. the same load, flow control off (sheddable requests refused with 429
//!    while the pool is saturated);
//! 5. one light tenant at 0.1× capacity alone, then with a heavy tenant at
//!    10× its rate in the same band, flow control on with
//!    `round-robin-fairness-policy`, the same with the band's
//!    `busiestFlowCeiling` 0.875, 0.75, 0.5, 0.25 and 0.125 (the heavy
//!    tenant waits once 7, 6, 4, 2 or 1 of the 8 slots are taken while the
//!    light one is active), and with `global-strict-fairness-policy`; and,
//!    as the floor no queueing policy can go below, with the heavy tenant
//!    at 1×, 2×, 4× and 8× its rate (0.2× to 0.9× capacity in all: nothing
//!    queued), where the light tenant's requests prefill into running
//!    batches.
//!
//! Saturation is `concurrency-detector` with `maxConcurrency` = the batch
//! size, so "saturated" means every batch slot is taken by epp's requests.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
    stats::percentile,
};

const SECONDS: u64 = 15;

fn config(flow: bool, fairness: &str, holdback: Option<f64>, busiest: Option<f64>) -> String {
    let gate = if flow {
        "featureGates: [flowControl]\n"
    } else {
        ""
    };
    let usage = if holdback.is_some() {
        "  usageLimitPolicyPluginRef: holdback\n"
    } else {
        ""
    };
    let min_ceiling = holdback.unwrap_or(0.75);
    let busiest = busiest.map_or(String::new(), |c| format!(", busiestFlowCeiling: {c}"));
    format!(
        "{gate}objectives:\n- {{name: critical, priority: 10}}\n- {{name: batch, priority: -1}}\n\
         plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n\
         - type: prefix-cache-scorer\n- type: max-score-picker\n\
         - type: concurrency-detector\n  parameters: {{maxConcurrency: 4}}\n\
         - type: round-robin-fairness-policy\n\
         - type: priority-holdback-policy\n  name: holdback\n  parameters: {{minCeiling: {min_ceiling}}}\n\
         schedulingProfiles:\n- name: default\n  plugins:\n\
         \x20 - {{pluginRef: queue-scorer, weight: 2}}\n\
         \x20 - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}\n\
         \x20 - {{pluginRef: prefix-cache-scorer, weight: 3}}\n\
         \x20 - {{pluginRef: max-score-picker}}\n\
         saturationDetector: {{pluginRef: concurrency-detector}}\n\
         flowControl:\n  defaultRequestTTL: 5s\n{usage}\
         \x20 defaultPriorityBand: {{fairnessPolicyRef: {fairness}{busiest}}}\n\
         \x20 priorityBands:\n  - {{priority: -1, maxRequests: 20}}\n\
         \x20 - {{priority: 10, fairnessPolicyRef: {fairness}}}\n"
    )
}

/// One request's result: status and time to first token.
type Outcome = (u16, Duration);

async fn chat(port: u16, headers: Vec<(&'static str, String)>) -> Outcome {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": 16,
        "stream": true,
    })
    .to_string();
    let mut h: Vec<(&str, &str)> = vec![("content-type", "application/json")];
    h.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
    match http::send(port, "POST", "/v1/chat/completions", &h, body).await {
        Ok(r) => {
            let first = r.chunks.first().map_or(r.total, |c| c.0);
            (r.status, first)
        }
        Err(_) => (0, Duration::ZERO),
    }
}

/// Open loop: `rate` requests/s for `secs` with `headers`; results in order.
async fn open_loop(
    port: u16,
    rate: f64,
    secs: u64,
    headers: Vec<(&'static str, String)>,
) -> Vec<Outcome> {
    let n = (rate * secs as f64).round() as usize;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tokio::time::sleep_until(start + gap.mul_f64(i as f64)).await;
        tasks.push(tokio::spawn(chat(port, headers.clone())));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Closed loop with `clients` for `secs`: completed requests per second.
async fn capacity(port: u16, clients: usize, secs: u64) -> f64 {
    let end = Instant::now() + Duration::from_secs(secs);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                if chat(port, vec![]).await.0 == 200 {
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs as f64
}

fn report(name: &str, results: &[Outcome]) -> f64 {
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut ok: Vec<Duration> = Vec::new();
    for (s, t) in results {
        *statuses.entry(*s).or_default() += 1;
        if *s == 200 {
            ok.push(*t);
        }
    }
    ok.sort();
    let ms = |p: f64| percentile(&ok, p).unwrap_or_default().as_secs_f64() * 1000.0;
    let p90 = ms(90.0);
    println!(
        "  {name:<52} n={:<5} statuses {statuses:?}  TTFT p50 {:>7.1}  p90 {:>7.1}  p99 {:>7.1} ms",
        results.len(),
        ms(50.0),
        p90,
        ms(99.0),
    );
    p90
}

/// A flow's requests dispatched so far and their total time queued in epp,
/// seconds (its `flow_control_request_queue_duration_seconds`).
async fn queued(metrics_port: u16, flow: &str) -> (f64, f64) {
    const WAITED: &str = "inference_extension_flow_control_request_queue_duration_seconds";
    let labels = [
        &format!("fairness_id=\"{flow}\"") as &str,
        "outcome=\"Dispatched\"",
    ];
    (
        http::metric_sum(metrics_port, &format!("{WAITED}_count"), &labels).await,
        http::metric_sum(metrics_port, &format!("{WAITED}_sum"), &labels).await,
    )
}

fn header(name: &'static str, value: &str) -> (&'static str, String) {
    (name, value.to_owned())
}

fn stack(
    tag: &str,
    flow: bool,
    fairness: &str,
    holdback: Option<f64>,
    busiest: Option<f64>,
) -> Stack {
    let cfg = config(flow, fairness, holdback, busiest);
    Stack::start(
        tag,
        2,
        &["--max-num-seqs", "4"],
        &["--config-text", &cfg],
        BodyMode::Streamed,
    )
}

/// Scenarios 1-4: a critical band and a sheddable one at 2x capacity.
async fn bands(s: Stack, cap: f64) {
    let critical = || vec![header("x-gateway-inference-objective", "critical")];
    let batch = || vec![header("x-gateway-inference-objective", "batch")];
    println!("critical and sheddable, 2x capacity:");
    let alone = open_loop(s.envoy.port, cap * 0.5, SECONDS, critical()).await;
    let base = report("critical alone, 0.5x capacity", &alone);
    let port = s.envoy.port;
    let shed = tokio::spawn(open_loop(port, cap * 1.5, SECONDS, batch()));
    let crit = open_loop(port, cap * 0.5, SECONDS, critical()).await;
    let shed = shed.await.unwrap();
    let on = report("critical, with 1.5x sheddable, flow control on", &crit);
    report("sheddable, flow control on", &shed);
    drop(s);

    let mut held = Vec::new();
    for ceiling in [0.75, 0.5, 0.25] {
        let s = stack(
            "flow-overload-holdback",
            true,
            "global-strict-fairness-policy",
            Some(ceiling),
            None,
        );
        let port = s.envoy.port;
        let shed = tokio::spawn(open_loop(port, cap * 1.5, SECONDS, batch()));
        let crit = open_loop(port, cap * 0.5, SECONDS, critical()).await;
        let shed = shed.await.unwrap();
        let p90 = report(
            &format!("critical, with 1.5x sheddable, on + priority-holdback {ceiling}"),
            &crit,
        );
        report(
            &format!("sheddable, on + priority-holdback {ceiling}"),
            &shed,
        );
        held.push(format!("on + holdback {ceiling} {:.2}x", p90 / base));
        drop(s);
    }

    let s = stack(
        "flow-overload-off",
        false,
        "global-strict-fairness-policy",
        None,
        None,
    );
    let port = s.envoy.port;
    let shed = tokio::spawn(open_loop(port, cap * 1.5, SECONDS, batch()));
    let crit = open_loop(port, cap * 0.5, SECONDS, critical()).await;
    let shed = shed.await.unwrap();
    let off = report("critical, with 1.5x sheddable, flow control off", &crit);
    report("sheddable, flow control off", &shed);
    drop(s);
    println!(
        "  critical TTFT p90 / unloaded: flow control on {:.2}x, {}, off {:.2}x",
        on / base,
        held.join(", "),
        off / base
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let s = stack(
        "flow-overload-on",
        true,
        "global-strict-fairness-policy",
        None,
        None,
    );
    let cap = capacity(s.envoy.port, 8, 5).await;
    println!("fleet capacity (closed loop, 8 clients): {cap:.1} requests/s");

    if std::env::args().any(|a| a == "tenants") {
        drop(s);
    } else {
        bands(s, cap).await;
    }

    println!("two tenants in one band, 10:1:");
    let light = || vec![header("x-gateway-inference-fairness-id", "light")];
    let heavy = || vec![header("x-gateway-inference-fairness-id", "heavy")];
    // `busiestFlowCeiling` from none (llm-d) down to one slot in eight:
    // the light tenant's p90 against how much of the fleet the heavy one
    // keeps (its 200s in the report).
    for (fairness, busiest) in [
        ("round-robin-fairness-policy", None),
        ("round-robin-fairness-policy", Some(0.875)),
        ("round-robin-fairness-policy", Some(0.75)),
        ("round-robin-fairness-policy", Some(0.5)),
        ("round-robin-fairness-policy", Some(0.25)),
        ("round-robin-fairness-policy", Some(0.125)),
        ("global-strict-fairness-policy", None),
    ] {
        let s = stack("flow-tenants", true, fairness, None, busiest);
        let policy = match busiest {
            Some(c) => format!("{fairness}, busiestFlowCeiling {c}"),
            None => fairness.to_owned(),
        };
        let port = s.envoy.port;
        let alone = open_loop(port, cap * 0.1, SECONDS, light()).await;
        let base = report(&format!("light alone ({policy})"), &alone);
        let before = queued(s.epp.metrics_port, "light").await;
        let h = tokio::spawn(open_loop(port, cap, SECONDS, heavy()));
        let l = open_loop(port, cap * 0.1, SECONDS, light()).await;
        let h = h.await.unwrap();
        let after = queued(s.epp.metrics_port, "light").await;
        let with = report(&format!("light, with heavy at 10x ({policy})"), &l);
        report(&format!("heavy ({policy})"), &h);
        println!(
            "  light: {:.0} dispatched, {:.2} ms queued in epp on average",
            after.0 - before.0,
            1000.0 * (after.1 - before.1) / (after.0 - before.0).max(1.0)
        );
        println!("  light TTFT p90 / alone ({policy}): {:.2}x", with / base);
        if fairness == "round-robin-fairness-policy" && busiest.is_none() {
            // No request queued at any of these loads: what the light
            // tenant meets on a fleet that busy, whatever the policy.
            for k in [1.0, 2.0, 4.0, 8.0] {
                let h = tokio::spawn(open_loop(port, cap * 0.1 * k, SECONDS, heavy()));
                let l = open_loop(port, cap * 0.1, SECONDS, light()).await;
                let h = h.await.unwrap();
                let busy = report(
                    &format!(
                        "light, with heavy at {k}x ({:.1}x capacity in all)",
                        0.1 * (k + 1.0)
                    ),
                    &l,
                );
                report(&format!("heavy at {k}x"), &h);
                println!(
                    "  light TTFT p90 with heavy at {k}x, not queued / alone: {:.2}x",
                    busy / base
                );
            }
        }
        drop(s);
    }
}
