//! gRPC load generator for the ext_proc server alone: plays Envoy's part
//! (request headers, a chat body, response headers) on many concurrent
//! streams and reports decisions per second, decision latency, and — given
//! the server's pid — decisions per second of server CPU time.
//!
//! ```text
//! cargo run --release -p epp-extproc --example serve -- 19002 synthetic:64 &
//! cargo run --release -p epp-extproc --example loadgen -- --target 127.0.0.1:19002 \
//!     --server-pid <pid> --concurrency 64 --duration 10 --body 4096 --mode duplex
//! ```
//! Works against any ext_proc server, e.g. the `epp` binary.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
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
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone)]
struct Args {
    target: String,
    concurrency: usize,
    connections: usize,
    duration: Duration,
    warmup: Duration,
    body: usize,
    duplex: bool,
    server_pid: Option<u32>,
}

fn args() -> Result<Args, BoxError> {
    let mut m: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        m.insert(k.trim_start_matches('-').to_owned(), v);
    }
    let get = |k: &str, d: &str| m.get(k).cloned().unwrap_or_else(|| d.to_owned());
    Ok(Args {
        target: get("target", "127.0.0.1:9002"),
        concurrency: get("concurrency", "64").parse()?,
        connections: get("connections", "4").parse()?,
        duration: Duration::from_secs_f64(get("duration", "10").parse()?),
        warmup: Duration::from_secs_f64(get("warmup", "2").parse()?),
        body: get("body", "4096").parse()?,
        duplex: get("mode", "duplex") == "duplex",
        server_pid: m.get("server-pid").map(|p| p.parse()).transpose()?,
    })
}

/// `utime + stime` of a process, in seconds (clock ticks at 100 Hz).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn headers(duplex: bool) -> ProcessingRequest {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.to_owned(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    };
    let mode = if duplex { 4 } else { 2 };
    ProcessingRequest {
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: mode,
            response_body_mode: 0,
            send_body_without_waiting_for_header_response: false,
        }),
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    h(":method", "POST"),
                    h(":path", "/v1/chat/completions"),
                    h(":authority", "gateway"),
                    h("content-type", "application/json"),
                    h("x-request-id", "loadgen"),
                ],
            }),
            end_of_stream: false,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// Chat bodies of `size` bytes: one of 16 shared system prompts (half the
/// size) and a unique user turn, so the prefix index sees realistic hits.
fn bodies(size: usize, n: usize) -> Vec<Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(7);
    let words = [
        "alpha", "beta", "gamma", "delta", "kv", "cache", "token", "route",
    ];
    let text = |len: usize, rng: &mut SmallRng| {
        let mut s = String::with_capacity(len + 8);
        while s.len() < len {
            s.push_str(words[rng.random_range(0..words.len())]);
            s.push(' ');
        }
        s.truncate(len);
        s
    };
    let systems: Vec<String> = (0..16).map(|_| text(size / 2, &mut rng)).collect();
    (0..n)
        .map(|i| {
            let user = text(size.saturating_sub(size / 2 + 120), &mut rng);
            serde_json::json!({
                "model": "llama-3-8b",
                "stream": false,
                "max_tokens": 128,
                "messages": [
                    {"role": "system", "content": systems[i % systems.len()]},
                    {"role": "user", "content": user},
                ],
            })
            .to_string()
            .into_bytes()
        })
        .collect()
}

fn is_destination(r: &ProcessingResponse) -> bool {
    let common = match &r.response {
        Some(Response::RequestHeaders(h)) | Some(Response::ResponseHeaders(h)) => {
            h.response.as_ref()
        }
        Some(Response::RequestBody(b)) => b.response.as_ref(),
        _ => None,
    };
    common
        .and_then(|c| c.header_mutation.as_ref())
        .is_some_and(|m| {
            m.set_headers.iter().any(|h| {
                h.header
                    .as_ref()
                    .is_some_and(|h| h.key == "x-gateway-destination-endpoint")
            })
        })
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

/// One exchange; returns the decision latency.
async fn exchange(
    client: &mut ExternalProcessorClient<Channel>,
    duplex: bool,
    body: &[u8],
) -> Result<Duration, BoxError> {
    let (tx, rx) = mpsc::channel(4);
    let t0 = Instant::now();
    tx.send(headers(duplex)).await?;
    let mut replies = client.process(ReceiverStream::new(rx)).await?.into_inner();
    if !duplex {
        replies.message().await?.ok_or("stream ended")?;
    }
    tx.send(ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: body.to_vec(),
            end_of_stream: true,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    })
    .await?;
    let mut routed = false;
    loop {
        let r = replies.message().await?.ok_or("stream ended")?;
        if matches!(r.response, Some(Response::ImmediateResponse(_))) {
            return Err(format!("refused: {r:?}").into());
        }
        routed |= is_destination(&r);
        if routed && (!duplex || body_end(&r)) {
            break;
        }
    }
    let latency = t0.elapsed();
    tx.send(ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: ":status".into(),
                    value: String::new(),
                    raw_value: b"200".to_vec(),
                }],
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
    Ok(latency)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let a = args()?;
    let bodies = Arc::new(bodies(a.body, 1024));
    let mut clients = Vec::new();
    for _ in 0..a.connections.max(1) {
        let ch = Channel::from_shared(format!("http://{}", a.target))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(
            ExternalProcessorClient::new(ch)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        );
    }
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..a.concurrency {
        let mut client = clients[w % clients.len()].clone();
        let (bodies, measuring, stop, errors) = (
            bodies.clone(),
            measuring.clone(),
            stop.clone(),
            errors.clone(),
        );
        let duplex = a.duplex;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = w * 7;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % bodies.len();
                match exchange(&mut client, duplex, &bodies[i]).await {
                    Ok(l) if measuring.load(Ordering::Relaxed) => {
                        lat.push(u32::try_from(l.as_micros()).unwrap_or(u32::MAX));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("first error: {e}");
                        }
                    }
                }
            }
            lat
        }));
    }
    tokio::time::sleep(a.warmup).await;
    let pid = a.server_pid.map(|p| p.to_string());
    let server_cpu0 = pid.as_deref().and_then(cpu_seconds);
    let self_cpu0 = cpu_seconds("self");
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(a.duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let server_cpu = pid
        .as_deref()
        .and_then(cpu_seconds)
        .zip(server_cpu0)
        .map(|(b, a)| b - a);
    let self_cpu = cpu_seconds("self").zip(self_cpu0).map(|(b, a)| b - a);
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?);
    }
    lat.sort_unstable();
    let n = lat.len();
    let pct = |p: f64| {
        lat.get(((n as f64 * p) as usize).min(n.saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "mode={} body={}B concurrency={} connections={} duration={:.1}s",
        if a.duplex {
            "FULL_DUPLEX_STREAMED"
        } else {
            "BUFFERED"
        },
        bodies[0].len(),
        a.concurrency,
        a.connections,
        elapsed
    );
    println!(
        "decisions={n} rate={:.0}/s errors={} latency_us p50={} p90={} p99={} max={}",
        n as f64 / elapsed,
        errors.load(Ordering::Relaxed),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        lat.last().copied().unwrap_or(0)
    );
    if let Some(cpu) = server_cpu {
        println!(
            "server_cpu={cpu:.2}s ({:.2} cores) decisions_per_server_cpu_second={:.0}",
            cpu / elapsed,
            n as f64 / cpu.max(1e-9)
        );
    }
    if let Some(cpu) = self_cpu {
        println!("loadgen_cpu={cpu:.2}s ({:.2} cores)", cpu / elapsed);
    }
    Ok(())
}
