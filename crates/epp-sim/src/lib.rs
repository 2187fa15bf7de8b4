//! A model-server simulator that behaves like a small vLLM deployment under
//! load: continuous batching with a waiting queue, prefill time proportional
//! to uncached prompt tokens, a block-level prefix cache, decode steps that
//! slow with batch size, LoRA adapters, failure injection, and the metrics
//! vLLM (or SGLang, TensorRT-LLM, Triton) prints. See docs/simulator.md.
//!
//! ```
//! use clap::Parser;
//! use epp_sim::{config::SimConfig, engine::{NewRequest, Sim, count_tokens}};
//!
//! assert_eq!(count_tokens("Hello, world"), 3); // 12 characters / 4
//! // On tokio's paused clock the model's time passes instantly.
//! let rt = tokio::runtime::Builder::new_current_thread()
//!     .enable_time()
//!     .start_paused(true)
//!     .build()?;
//! rt.block_on(async {
//!     let sim = Sim::new(SimConfig::parse_from(["epp-sim", "--max-num-seqs", "8"]));
//!     let prompt = "You are a helpful assistant. ".repeat(20); // 580 chars
//!     let req = NewRequest {
//!         model: sim.cfg.model.clone(),
//!         prompt_tokens: count_tokens(&prompt), // 145
//!         prompt,
//!         max_tokens: 4,
//!         ..NewRequest::default()
//!     };
//!     let (text, cold) = sim.submit(req.clone())?.collect().await.expect("served");
//!     let (_, warm) = sim.submit(req)?.collect().await.expect("served");
//!     assert_eq!((text.len(), cold.completion_tokens), (16, 4));
//!     // Nine full 16-token blocks are cached; the last token is recomputed.
//!     assert_eq!((cold.cached_tokens, warm.cached_tokens), (0, 144));
//!     Ok::<_, epp_sim::engine::Rejected>(())
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod apis;
pub mod blocks;
pub mod chat_template;
pub mod config;
pub mod engine;
pub mod engine_core;
pub mod error;
pub mod kv_events;
pub mod metrics;
mod native;
mod openai;
pub mod server;
pub mod stats;
pub mod tokens;

/// Where a started simulator listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The HTTP address (the real port, also with port 0).
    pub http: std::net::SocketAddr,
    /// The KV events PUB endpoint as bound, when events are on.
    pub kv_events: Option<String>,
    /// The KV events replay (ROUTER) endpoint as bound, when configured.
    pub kv_events_replay: Option<String>,
}

/// Loads the `--tokenizer`, binds the KV event sockets and
/// `cfg.host:cfg.port`, and serves until the future is dropped. Says where
/// it listens through `on_bound` first (useful with port 0).
///
/// # Errors
/// A bad tokenizer, a KV events endpoint or the address that cannot be
/// bound, or a failed server.
pub async fn serve(cfg: config::SimConfig, on_bound: impl FnOnce(&Bound)) -> error::Result<()> {
    let tokenizer = cfg.tokenizer.as_deref().map(tokens::load).transpose()?;
    let chat_template = cfg
        .chat_template
        .as_deref()
        .map(|t| chat_template::ChatTemplate::load(t, cfg.tokenizer.as_deref()))
        .transpose()?;
    let hashes = if cfg.kv_events_hash_bytes {
        kv_events::HashEncoding::Bytes
    } else {
        kv_events::HashEncoding::Int
    };
    let publisher = match cfg.kv_events_config.as_ref().filter(|k| k.is_on()) {
        Some(k) => Some(kv_events::start(k, cfg.block_size, hashes).await?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)).await?;
    on_bound(&Bound {
        http: listener.local_addr()?,
        kv_events: publisher.as_ref().map(|p| p.endpoint.clone()),
        kv_events_replay: publisher.as_ref().and_then(|p| p.replay_endpoint.clone()),
    });
    let attachments = engine::Attachments {
        tokenizer,
        chat_template,
        kv_events: publisher.map(|p| p.sink),
    };
    let sim = engine::Sim::with(cfg, attachments);
    // Every write goes out at once, as vLLM's server (asyncio sets
    // TCP_NODELAY on every accepted socket) sends them: with Nagle's
    // algorithm on, a streamed token written while the response's headers
    // were not yet acknowledged waited for the peer's delayed ACK, ~40 ms
    // on Linux, which a busy client or proxy (Envoy) sends late.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    Ok(axum::serve(listener, server::router(sim)).await?)
}
