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
pub mod config;
pub mod engine;
pub mod engine_core;
pub mod metrics;
mod openai;
pub mod server;
pub mod stats;

/// Binds `cfg.host:cfg.port` and serves until the future is dropped. Returns
/// the bound address through `on_bound` first (useful with port 0).
///
/// # Errors
/// When the address cannot be bound or the server fails.
pub async fn serve(
    cfg: config::SimConfig,
    on_bound: impl FnOnce(std::net::SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)).await?;
    on_bound(listener.local_addr()?);
    let sim = engine::Sim::new(cfg);
    axum::serve(listener, server::router(sim)).await
}
