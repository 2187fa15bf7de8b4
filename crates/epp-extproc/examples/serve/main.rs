//! Serves ext_proc on a port with a static endpoint list and a stand-in for
//! the default profile, to try the service behind a real Envoy or to drive it
//! with the `loadgen` example, without the `epp` binary.
//!
//! `cargo run -p epp-extproc --example serve -- 9002 127.0.0.1:8001,127.0.0.1:8002`
//! `cargo run -p epp-extproc --example serve -- 9002 synthetic:64` (fake
//! endpoints with random queue and KV figures). It schedules as the `epp`
//! binary does by default (the built-in plugins, the default profile); a
//! third argument `trivial` replaces that by a first-endpoint picker. Logs
//! go through a `tracing` subscriber at `warn` (`RUST_LOG` to change), as in
//! the binary: without one, every span the HTTP/2 stack opens would be
//! offered to the `log` crate, a cost the binary does not pay.
//! `SERVE_TRACE=none|all` installs a tracer that samples no request (the
//! cost of tracing on for a request not sampled) or every one (the cost of
//! recording its spans; they are then dropped, not exported).
//! `SERVE_DECISIONS=sampled|every` keeps decisions in a 50-entry
//! `DecisionLog`, as the binary's decision view does, recording at most one
//! request per 100 ms (the binary's default) or every request (the cost of
//! recording one).
//! `SERVE_SERVER=lean|tonic` picks the server: the lean one on `h2`
//! (`serve_incoming`, what the binary runs; the default) or the tonic
//! service (`into_server()` on tonic's transport), so both are measured
//! from one build.

use std::{net::SocketAddr, sync::Arc};

use arc_swap::ArcSwap;
use epp_core::{Endpoint, EndpointMetrics, EndpointSnapshot};
use epp_extproc::{
    DecisionLog, ExtProcOptions, ExtProcService, H2Options, RequestTrace, RequestTracer,
    TraceParent,
};
use rand::Rng;
use tokio_stream::{StreamExt, wrappers::TcpListenerStream};

mod profile;

/// The allocator the `epp` binary uses, so the figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // `SERVE_THREADS=1` pins the server to one runtime thread (per-core figures).
    let threads = std::env::var("SERVE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?
        .block_on(serve())
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().unwrap_or_else(|| "9002".into()).parse()?;
    let list = args.next().unwrap_or_else(|| "127.0.0.1:8000".into());
    let addrs: Vec<SocketAddr> = match list.strip_prefix("synthetic:") {
        Some(n) => (0..n.parse::<u32>()?)
            .map(|i| SocketAddr::from(([10, 1, (i / 250) as u8, (i % 250) as u8 + 1], 8000)))
            .collect(),
        None => list
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?,
    };
    let mut rng = rand::rng();
    let mut endpoints = Vec::new();
    for (i, addr) in addrs.into_iter().enumerate() {
        let ep = Arc::new(Endpoint::new(u32::try_from(i)?, addr));
        ep.set_metrics(EndpointMetrics {
            waiting: rng.random_range(0..8),
            kv_usage: rng.random_range(0.0..0.9),
            ..EndpointMetrics::fresh()
        });
        endpoints.push(ep);
    }
    let source = Arc::new(ArcSwap::from_pointee(EndpointSnapshot::new(endpoints)));
    let scheduler = match args.next().as_deref() {
        Some("trivial") => profile::trivial()?,
        _ => profile::default()?,
    };
    let tracer: Option<Arc<dyn RequestTracer>> = match std::env::var("SERVE_TRACE").as_deref() {
        Ok("none") => Some(Arc::new(Sample(false))),
        Ok("all") => Some(Arc::new(Sample(true))),
        _ => None,
    };
    let options = ExtProcOptions {
        tracer,
        ..ExtProcOptions::default()
    };
    let service = ExtProcService::new(Arc::new(scheduler), source, options);
    let interval = match std::env::var("SERVE_DECISIONS").as_deref() {
        Ok("sampled") => Some(std::time::Duration::from_millis(100)),
        Ok("every") => Some(std::time::Duration::ZERO),
        _ => None,
    };
    service.set_decision_log(interval.map(|i| Arc::new(DecisionLog::new(50, i))));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let lean = std::env::var("SERVE_SERVER").as_deref() != Ok("tonic");
    println!(
        "ext_proc listening on {addr} (pid {}, {} server)",
        std::process::id(),
        if lean { "lean" } else { "tonic" }
    );
    if lean {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            conn.inspect(|tcp| {
                let _ = tcp.set_nodelay(true);
            })
        });
        service
            .serve_incoming(incoming, H2Options::default(), std::future::pending())
            .await;
    } else {
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(service.into_server())
            .serve(addr)
            .await?;
    }
    Ok(())
}

/// Samples every request or none; drops what it records.
#[derive(Debug)]
struct Sample(bool);

impl RequestTracer for Sample {
    fn should_sample(&self, _: &[u8; 16], _: Option<&TraceParent>) -> bool {
        self.0
    }
    fn export(&self, trace: RequestTrace) {
        std::hint::black_box(trace);
    }
}
