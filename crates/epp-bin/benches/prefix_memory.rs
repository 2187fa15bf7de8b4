//! Resident memory of epp and of the reference picker on a 64-pod pool,
//! cold (started, scraping, no traffic) and with the approximate prefix index
//! warm: thousands of distinct 16 KiB chat prompts sent straight to each
//! picker's ext_proc port, as Envoy would in FULL_DUPLEX_STREAMED mode.
//!
//! ```sh
//! cargo build --release -p epp-bin -p epp-sim --bins
//! cargo bench -p epp-bin --bench prefix_memory            # 20,000 prompts per picker
//! cargo bench -p epp-bin --bench prefix_memory -- --quick # 3,000
//! EPP_BENCH_PROMPTS=20000 cargo bench -p epp-bin --bench prefix_memory
//! # extra flags for the reference:
//! EPP_BENCH_REFERENCE_ARGS=--v=1 cargo bench -p epp-bin --bench prefix_memory
//! ```
//!
//! The pool, the pickers and their config are the `scrape_cpu` bench's
//! (`epp_plugins::DEFAULT_CONFIG`, `--refresh-metrics-interval 50ms` for
//! both), at 64 pods. The pods' metrics come from the same farm process, here
//! serving one vLLM server's core gauges (`metrics_farm::vllm_core_page`:
//! queue, running, KV usage and `vllm:cache_config_info` with block size 16
//! and 27,912 GPU blocks) rather than the 100 KB page, so that scraping does
//! not take the machine's two cores from the warm-up.
//!
//! With that config both pickers run their approximate prefix index at its
//! defaults: 16-token blocks of 64 characters, at most 256 blocks per prompt,
//! and `autoTune` on, so each pod's LRU holds the pod's reported GPU blocks
//! (27,912), not `lruCapacityPerServer` (31,250). Full, the index holds
//! 64 × 27,912 = 1,786,368 (block, pod) entries. Each prompt is 16.5 KiB of
//! distinct text from its first character (no prefix is shared), so it adds
//! 256 blocks to the pod it is sent to. With no prefix match and identical
//! pods the picks spread over the pool as each picker's load scorers see it
//! (unevenly for epp, whose queue score counts its own dispatches between
//! scrapes), and 20,000 prompts (≈ 2.9× the capacity) fill most of every
//! pod's LRU; the bench prints the spread, the fill it implies, and the fill
//! each picker reports. Both pickers report the index's size as
//! `inference_extension_prefix_indexer_size`, read from their metrics.
//!
//! The pickers are warmed one after the other (epp first); memory is
//! `VmRSS` / `VmHWM` from `/proc/<pid>/status`, cold after both scrape every
//! pod, warm 5 s after the picker's last prompt.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use envoy_types::pb::envoy::{
    config::core::v3::{HeaderMap, HeaderValue},
    service::ext_proc::v3::{
        HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
        body_mutation::Mutation, external_processor_client::ExternalProcessorClient,
        processing_request::Request, processing_response::Response,
    },
};
use epp_test_support::{
    http,
    metrics_farm::{MetricsFarm, serve_if_child, vllm_core_page},
    process::{Epp, load_average, memory_mib, scratch_dir},
    side_by_side::{PoolPickers, start_pool_pickers},
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const PODS: usize = 64;
/// Both pickers' defaults: 16 tokens × 4 characters per block, 256 blocks.
const BLOCK_CHARS: usize = 64;
const MAX_BLOCKS: usize = 256;
/// Per-pod LRU capacity with `autoTune`: the page's `num_gpu_blocks`.
const GPU_BLOCKS: usize = 27_912;
const PROMPT_BYTES: usize = 16 * 1024 + 512;
const CONCURRENCY: usize = 16;
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const DESTINATION: &str = "x-gateway-destination-endpoint";

/// A chat body whose text is distinct from its first character: the
/// prompt's number, then words drawn by a generator seeded with it.
fn prompt_body(i: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "alpha", "beta", "gamma", "delta", "kernel", "cache", "token", "route", "prefix", "block",
        "server", "queue", "model", "picker", "window", "layer",
    ];
    let mut state = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut text = format!("Request {i:08}: ");
    while text.len() < PROMPT_BYTES {
        text.push_str(WORDS[(next() % 16) as usize]);
        text.push(' ');
    }
    serde_json::json!({
        "model": MODEL,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
    .into_bytes()
}

fn header(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.to_owned(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

/// The picked endpoint, if `r` sets the destination header.
fn destination(r: &ProcessingResponse) -> Option<String> {
    let common = match &r.response {
        Some(Response::RequestHeaders(h)) => h.response.as_ref(),
        Some(Response::RequestBody(b)) => b.response.as_ref(),
        _ => None,
    }?;
    common
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == DESTINATION)
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}

fn body_end(r: &ProcessingResponse) -> bool {
    match &r.response {
        Some(Response::RequestBody(b)) => b
            .response
            .as_ref()
            .and_then(|c| c.body_mutation.as_ref())
            .and_then(|m| m.mutation.as_ref())
            .is_some_and(|m| matches!(m, Mutation::StreamedResponse(s) if s.end_of_stream)),
        _ => false,
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One request as Envoy sends it in FULL_DUPLEX_STREAMED mode: headers, the
/// whole body, and once routed (and the body streamed back), a 200's headers.
/// Returns the picked endpoint.
async fn exchange(
    client: &mut ExternalProcessorClient<Channel>,
    body: Vec<u8>,
) -> Result<String, BoxError> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(ProcessingRequest {
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: 4,
            response_body_mode: 0,
            send_body_without_waiting_for_header_response: false,
        }),
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":method", "POST"),
                    header(":path", "/v1/chat/completions"),
                    header(":authority", "gateway"),
                    header("content-type", "application/json"),
                    header("content-length", &body.len().to_string()),
                ],
            }),
            end_of_stream: false,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    })
    .await?;
    tx.send(ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body,
            end_of_stream: true,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    })
    .await?;
    let mut replies = client.process(ReceiverStream::new(rx)).await?.into_inner();
    let mut picked = None;
    loop {
        let r = replies.message().await?.ok_or("stream ended")?;
        if let Some(Response::ImmediateResponse(i)) = &r.response {
            return Err(format!("refused: {:?}", i.status).into());
        }
        if picked.is_none() {
            picked = destination(&r);
        }
        if picked.is_some() && body_end(&r) {
            break;
        }
    }
    tx.send(ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![header(":status", "200")],
            }),
            end_of_stream: true,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    })
    .await?;
    replies.message().await?;
    drop(tx);
    while replies.message().await?.is_some() {}
    Ok(picked.unwrap_or_default())
}

/// Sends prompts `0..n` to the ext_proc server on `port`, `CONCURRENCY` at a
/// time; returns the picks per endpoint and the errors.
async fn warm(port: u16, n: usize) -> (BTreeMap<String, usize>, usize) {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("the picker's ext_proc port");
    let client = ExternalProcessorClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let next = Arc::new(AtomicUsize::new(0));
    let picks = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let errors = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (mut client, next, picks, errors) = (
                client.clone(),
                Arc::clone(&next),
                Arc::clone(&picks),
                Arc::clone(&errors),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let r = tokio::time::timeout(
                        Duration::from_secs(30),
                        exchange(&mut client, prompt_body(i)),
                    )
                    .await;
                    match r {
                        Ok(Ok(pod)) => *picks.lock().unwrap().entry(pod).or_default() += 1,
                        Ok(Err(e)) => {
                            if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("first error: {e}");
                            }
                        }
                        Err(_) => {
                            if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("first error: no answer in 30 s");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let picks = picks.lock().unwrap().clone();
    (picks, errors.load(Ordering::Relaxed))
}

/// The sum of the series of family `name` on a picker's metrics page, if it
/// has any.
fn metric_sum(metrics_port: u16, name: &str) -> Option<f64> {
    let (_, page) = http::get_unchunked(metrics_port, "/metrics", Duration::from_secs(10)).ok()?;
    let values: Vec<f64> = page
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The size of the approximate prefix index, as both pickers report it.
fn indexer_size(metrics_port: u16) -> Option<f64> {
    metric_sum(metrics_port, "inference_extension_prefix_indexer_size")
}

/// The Go heap of a Go picker (the reference): bytes in live and
/// not-yet-collected objects, and bytes in spans holding objects.
fn go_heap_mib(metrics_port: u16) -> Option<(f64, f64)> {
    let alloc = metric_sum(metrics_port, "go_memstats_heap_alloc_bytes")?;
    let inuse = metric_sum(metrics_port, "go_memstats_heap_inuse_bytes")?;
    Some((alloc / 1048576.0, inuse / 1048576.0))
}

struct Picker {
    label: &'static str,
    epp: Epp,
}

/// One picker's figures.
#[derive(Clone, Copy, Default)]
struct Figures {
    cold: (f64, f64),
    warm: (f64, f64),
    /// Index entries reported, and expected from the picks.
    entries: Option<f64>,
    expected: f64,
    prompts_per_s: f64,
    errors: usize,
    pods_picked: usize,
    min_picks: usize,
    max_picks: usize,
    /// Go heap allocated when cold, MiB: the reference only.
    cold_heap: Option<f64>,
    /// Go heap (alloc, in use) when warm, MiB: the reference only.
    go_heap: Option<(f64, f64)>,
}

async fn run() {
    let quick = std::env::args().any(|a| a == "--quick");
    let prompts: usize = std::env::var("EPP_BENCH_PROMPTS")
        .map_or(if quick { 3_000 } else { 20_000 }, |v| {
            v.parse().expect("EPP_BENCH_PROMPTS")
        });
    let dir = scratch_dir("prefix-memory");
    let config = dir.join("endpoint-picker-config.yaml");
    std::fs::write(&config, epp_plugins::DEFAULT_CONFIG).unwrap();
    println!("load average at start: {}", load_average());

    let page = vllm_core_page();
    let farm = MetricsFarm::start(&dir, &page);
    println!("farm page {} bytes", page.len());
    let PoolPickers {
        epp,
        reference,
        ns: _ns,
        cluster: _cluster,
        ..
    } = start_pool_pickers(&dir, "prefix-memory", &farm, PODS, &config).await;
    let pickers = [
        Picker { label: "epp", epp },
        Picker {
            label: "reference",
            epp: reference,
        },
    ];
    // Both scrape every pod; let start-up settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut figures: Vec<Figures> = pickers
        .iter()
        .map(|p| Figures {
            cold: memory_mib(p.epp.proc.pid()),
            cold_heap: go_heap_mib(p.epp.metrics_port).map(|h| h.0),
            ..Figures::default()
        })
        .collect();
    for (p, f) in pickers.iter().zip(&figures) {
        println!(
            "{}: cold VmRSS {:.1} MiB, VmHWM {:.1} MiB, index entries {:?}",
            p.label,
            f.cold.0,
            f.cold.1,
            indexer_size(p.epp.metrics_port)
        );
    }

    let capacity = PODS * GPU_BLOCKS;
    println!(
        "\nwarming: {prompts} distinct prompts of {PROMPT_BYTES} bytes ({MAX_BLOCKS} blocks of \
         {BLOCK_CHARS} characters each) per picker, concurrency {CONCURRENCY}; index capacity \
         {PODS} × {GPU_BLOCKS} = {capacity} entries"
    );
    for (p, f) in pickers.iter().zip(&mut figures) {
        let t = Instant::now();
        let (picks, errors) = warm(p.epp.grpc_port, prompts).await;
        let secs = t.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(5)).await;
        f.warm = memory_mib(p.epp.proc.pid());
        f.entries = indexer_size(p.epp.metrics_port);
        f.go_heap = go_heap_mib(p.epp.metrics_port);
        // epp's recent decisions, every candidate's scores (the reference has
        // no such page), for a look at how the picks spread.
        if let Ok((200, view)) = http::get_unchunked(
            p.epp.metrics_port,
            "/debug/decisions.json",
            Duration::from_secs(5),
        ) {
            std::fs::write(dir.join(format!("{}-decisions.json", p.label)), view).unwrap();
        }
        f.expected = picks
            .values()
            .map(|&n| (n * MAX_BLOCKS).min(GPU_BLOCKS) as f64)
            .sum();
        f.prompts_per_s = prompts as f64 / secs;
        f.errors = errors;
        f.pods_picked = picks.len();
        f.min_picks = picks.values().copied().min().unwrap_or(0);
        f.max_picks = picks.values().copied().max().unwrap_or(0);
        println!(
            "{}: {prompts} prompts in {secs:.1} s ({:.0}/s), {errors} errors, {} pods picked \
             ({}–{} prompts each); index entries reported {:?}, expected from the picks {:.0} \
             ({:.0} % of capacity); VmRSS {:.1} MiB, VmHWM {:.1} MiB; load {}",
            p.label,
            f.prompts_per_s,
            f.pods_picked,
            f.min_picks,
            f.max_picks,
            f.entries,
            f.expected,
            f.expected * 100.0 / capacity as f64,
            f.warm.0,
            f.warm.1,
            load_average()
        );
    }

    println!(
        "\nSide by side: {PODS} endpoints, {prompts} distinct 16 KiB prompts each \
         (ratio = epp ÷ reference; target for warm VmRSS ≤ 0.2)"
    );
    println!(
        "  {:<46} {:>12} {:>12} {:>10}",
        "figure", "epp", "reference", "ratio"
    );
    let line = |name: &str, f: &dyn Fn(&Figures) -> f64, prec: usize| {
        let (a, b) = (f(&figures[0]), f(&figures[1]));
        println!("  {name:<46} {a:>12.prec$} {b:>12.prec$} {:>10.3}", a / b);
    };
    line("cold: resident memory, VmRSS MiB", &|f| f.cold.0, 1);
    line("cold: peak resident memory, VmHWM MiB", &|f| f.cold.1, 1);
    line("warm: resident memory, VmRSS MiB", &|f| f.warm.0, 1);
    line("warm: peak resident memory, VmHWM MiB", &|f| f.warm.1, 1);
    line(
        "warm: index entries reported",
        &|f| f.entries.unwrap_or(f64::NAN),
        0,
    );
    line(
        "warm: index fill reported, % of capacity",
        &|f| f.entries.unwrap_or(f64::NAN) * 100.0 / capacity as f64,
        1,
    );
    line(
        "warm: RSS growth per reported entry, bytes",
        &|f| (f.warm.0 - f.cold.0) * 1048576.0 / f.entries.unwrap_or(f64::NAN),
        1,
    );
    line("warm-up prompts per second", &|f| f.prompts_per_s, 0);
    for (p, f) in pickers.iter().zip(&figures) {
        if let Some((alloc, inuse)) = f.go_heap {
            println!(
                "  {}: Go heap when warm: {alloc:.1} MiB allocated (live and not yet collected), \
                 {inuse:.1} MiB in use; {:.0} bytes allocated per reported entry",
                p.label,
                (alloc - f.cold_heap.unwrap_or(0.0)) * 1048576.0 / f.entries.unwrap_or(f64::NAN)
            );
        }
    }
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
