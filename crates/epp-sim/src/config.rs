//! Simulator settings (one server).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::kv_events::KvEventsConfig;

/// Which engine's metric names the simulator exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Engine {
    /// vLLM (`vllm:*`).
    #[default]
    Vllm,
    /// SGLang (`sglang:*`).
    Sglang,
    /// TensorRT-LLM's `trtllm-serve` (`trtllm_*`).
    #[value(name = "trtllm-serve")]
    TrtllmServe,
    /// Triton with the TensorRT-LLM backend (`nv_trt_llm_*`).
    Triton,
}

/// The server's part in disaggregated serving (vLLM's `kv_role` of its KV
/// transfer config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum KvRole {
    /// Prefills for others and takes prefilled requests (and serves whole
    /// requests too).
    #[default]
    #[value(name = "kv_both")]
    Both,
    /// A prefill server: refuses requests whose KV was prefilled elsewhere.
    #[value(name = "kv_producer")]
    Producer,
    /// A decode server: refuses to prefill for another server.
    #[value(name = "kv_consumer")]
    Consumer,
}

/// A simulated model server. Every flag has a default that behaves like a
/// small vLLM deployment; see docs/simulator.md for the model.
#[derive(Debug, Clone, Parser)]
#[command(name = "epp-sim", version, about)]
pub struct SimConfig {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 = any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name served.
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,
    /// Path reported by `/model_info` and `/server_info` (routers that load a
    /// tokenizer read it; point it at a local directory). Defaults to --model.
    #[arg(long)]
    pub model_path: Option<String>,
    /// Extra names the model answers to (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub served_model_name: Vec<String>,
    /// LoRA adapters this server can load (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub lora_modules: Vec<String>,
    /// Adapters resident at once.
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// Time to load an adapter, milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub lora_load_ms: f64,
    /// Requests processed concurrently (continuous batch size); more wait.
    #[arg(long, default_value_t = 16)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step: prompts longer than this are
    /// prefilled in chunks over several steps (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: u64,
    /// Longest prompt + output accepted, tokens (0 = what the KV pool holds).
    #[arg(long, default_value_t = 0)]
    pub max_model_len: u64,
    /// Fixed cost of an engine step that prefills anything, milliseconds: the
    /// time to first token of a short prompt on an idle server.
    #[arg(long, default_value_t = 10.0)]
    pub ttft_ms: f64,
    /// Prefill time per UNCACHED prompt token, microseconds.
    #[arg(long, default_value_t = 20.0)]
    pub prefill_us_per_token: f64,
    /// Decode step time with a batch of one, milliseconds (the inter-token
    /// latency of a lone request).
    #[arg(long, default_value_t = 5.0)]
    pub itl_ms: f64,
    /// Extra decode-step time per additional running request, as a fraction of
    /// --itl-ms (0.02 = each extra sequence slows a step by 2 %).
    #[arg(long, default_value_t = 0.02)]
    pub batch_slowdown: f64,
    /// Output tokens when the request names no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub max_tokens_default: u64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks the server holds.
    #[arg(long, default_value_t = 8192)]
    pub num_gpu_blocks: usize,
    /// Which engine's metric names to expose.
    #[arg(long, value_enum, default_value_t = Engine::Vllm)]
    pub engine: Engine,
    /// Name reported in the `x-inference-pod` response header.
    #[arg(long, default_value = "sim")]
    pub pod_name: String,
    /// Keep the last N generation requests as received (method, path,
    /// headers, body) for `GET /admin/requests` (tests). 0 = record nothing.
    #[arg(long, default_value_t = 0)]
    pub record_requests: usize,
    /// Fraction of requests answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Fraction of requests that hang (never answer).
    #[arg(long, default_value_t = 0.0)]
    pub hang_rate: f64,
    /// Every generation request hangs (the engine looks alive but is stuck).
    #[arg(long)]
    pub hang: bool,
    /// Delay before every /metrics answer, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub slow_metrics_ms: f64,
    /// Seed for failure injection, ids and generated text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A Hugging Face `tokenizer.json`, or a directory holding one: prompts
    /// are then tokenized for real (`encode(text, add_special_tokens=true)`)
    /// and the prefix cache keys blocks of --block-size token ids. Without
    /// it, text prompts count 4 characters per token.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// A Jinja chat template: chat requests are rendered through it (with
    /// `bos_token`/`eos_token` from the `tokenizer_config.json` beside the
    /// --tokenizer) and the text tokenized without special tokens, as vLLM
    /// does. Without it, chat is the flattened `role: text` transcript.
    #[arg(long, value_name = "FILE", requires = "tokenizer")]
    pub chat_template: Option<PathBuf>,
    /// Placeholder tokens each media part of a chat stands for, as a
    /// multimodal model's processor expands an image into N tokens: where
    /// the --chat-template renders `<image>`, `<audio>` or `<video>` for a
    /// part, N placeholder tokens (id 0) replace it; the prefix cache hashes
    /// the item into every block they overlap, KV events carry its
    /// identifier in those blocks' extra keys and renders report the places
    /// (`mm_placeholders`), as vLLM does. 0: media parts add no tokens.
    #[arg(long, default_value_t = 0, requires = "chat_template")]
    pub mm_tokens: u32,
    /// Cache generated tokens' blocks too, as vLLM's prefix caching does:
    /// each block of output that fills up is hashed (never matching another
    /// request), kept cached after the request like its prompt's blocks (and
    /// evicted before them: a request's blocks are freed last to first) and
    /// announced in KV events. Long outputs then crowd cached prompts out of
    /// the cache, as they do in vLLM. Off by default: earlier figures were
    /// measured without it.
    #[arg(long)]
    pub cache_output_blocks: bool,
    /// vLLM's KVEventsConfig as JSON, e.g. `{"enable_kv_cache_events": true,
    /// "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint":
    /// "tcp://*:5558", "buffer_steps": 10000, "topic": ""}`: publish KV cache
    /// events over ZeroMQ as vLLM does.
    #[arg(long, value_name = "JSON", value_parser = KvEventsConfig::parse)]
    pub kv_events_config: Option<KvEventsConfig>,
    /// Send block hashes in KV events as 32-byte msgpack `bin` values (the
    /// u64 big-endian in the last 8 bytes), as newer vLLM does, instead of
    /// unsigned integers.
    #[arg(long)]
    pub kv_events_hash_bytes: bool,
    /// Role in P/D disaggregation (`kv_transfer_params` in requests): a
    /// request with `do_remote_decode` is prefilled here and answered with
    /// the parameters a decode server needs; one with `do_remote_prefill`
    /// takes its prompt's KV from the prefill server instead of computing it.
    #[arg(long, value_enum, default_value_t = KvRole::Both)]
    pub kv_role: KvRole,
    /// Time to pull one prompt token's KV from the prefill server,
    /// microseconds (an 8B model's ~128 KiB per token at ~25 GB/s is ~5 µs).
    /// The pull does not use the engine's compute.
    #[arg(long, default_value_t = 5.0)]
    pub kv_transfer_us_per_token: f64,
}

impl SimConfig {
    /// Defaults, as if started with no flags.
    #[must_use]
    pub fn defaults() -> Self {
        Self::parse_from(["epp-sim"])
    }

    /// Longest prompt + output accepted, in tokens.
    #[must_use]
    pub fn model_len(&self) -> u64 {
        let pool = (self.num_gpu_blocks * self.block_size.max(1)) as u64;
        if self.max_model_len == 0 {
            pool
        } else {
            self.max_model_len.min(pool)
        }
    }

    /// Whether `name` is served (base model or adapter).
    #[must_use]
    pub fn serves(&self, name: &str) -> bool {
        name == self.model
            || self.served_model_name.iter().any(|n| n == name)
            || self.lora_modules.iter().any(|n| n == name)
    }
}
