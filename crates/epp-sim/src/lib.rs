//! A model-server simulator that behaves like a small vLLM deployment under
//! load: continuous batching with a waiting queue, prefill time proportional
//! to uncached prompt tokens, a block-level prefix cache, decode steps that
//! slow with batch size, LoRA adapters, failure injection, and the metrics
//! vLLM (or SGLang, TensorRT-LLM, Triton) prints. See docs/simulator.md.
//!
//! ```
//! use epp_sim::{config::SimConfig, engine::count_tokens};
//! assert_eq!(count_tokens("Hello, world"), 3); // 12 characters / 4
//! let cfg = SimConfig::defaults();
//! assert_eq!(cfg.max_num_seqs, 16);
//! ```
#![warn(missing_docs)]

pub mod blocks;
pub mod config;
pub mod engine;
pub mod metrics;
mod openai;
pub mod sched;
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
