//! The `/metrics` page, in the names of the engine being simulated.

use std::fmt::Write as _;

use crate::{
    config::{Engine, SimConfig},
    engine::State,
};

/// vLLM's time-to-first-token buckets (seconds).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's end-to-end latency buckets (seconds).
pub const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's inter-token latency buckets (seconds).
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// A cumulative histogram with fixed buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram.
    #[must_use]
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {c}.0");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {}.0",
            self.count
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {}.0", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
    }
}

fn gauge(out: &mut String, name: &str, help: &str, series: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (labels, v) in series {
        let _ = writeln!(out, "{name}{{{labels}}} {v:?}");
    }
}

fn counter(out: &mut String, name: &str, help: &str, labels: &str, v: u64, created: f64) {
    let _ = writeln!(
        out,
        "# HELP {name}_total {help}\n# TYPE {name}_total counter"
    );
    let _ = writeln!(out, "{name}_total{{{labels}}} {v}.0");
    let _ = writeln!(
        out,
        "# HELP {name}_created {help}\n# TYPE {name}_created gauge"
    );
    let _ = writeln!(out, "{name}_created{{{labels}}} {created:?}");
}

/// Renders the page for `st` under `cfg`'s engine.
#[must_use]
pub fn render(cfg: &SimConfig, st: &State, created: f64) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let waiting = (st.waiting as u64 + u64::from(st.extra_waiting)) as f64;
    let running = st.running as f64;
    let kv = st.kv_usage(cfg.num_gpu_blocks);
    let model = &cfg.model;
    match cfg.engine {
        Engine::Vllm => {
            let l = format!("engine=\"0\",model_name=\"{model}\"");
            gauge(
                &mut out,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                &[(l.clone(), running)],
            );
            gauge(
                &mut out,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                &[(l.clone(), waiting)],
            );
            gauge(
                &mut out,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                &[(l.clone(), kv)],
            );
            counter(
                &mut out,
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                &l,
                st.prefix_queries_total,
                created,
            );
            counter(
                &mut out,
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                &l,
                st.prefix_hits_total,
                created,
            );
            counter(
                &mut out,
                "vllm:prompt_tokens",
                "Number of prefill tokens processed.",
                &l,
                st.prompt_tokens_total,
                created,
            );
            counter(
                &mut out,
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                &l,
                st.generation_tokens_total,
                created,
            );
            counter(
                &mut out,
                "vllm:request_success",
                "Count of successfully processed requests.",
                &format!("{l},finished_reason=\"length\""),
                st.request_success_total,
                created,
            );
            st.ttft.render(
                &mut out,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &l,
            );
            st.e2e.render(
                &mut out,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &l,
            );
            st.itl.render(
                &mut out,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &l,
            );
            let info = format!(
                "block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",num_gpu_blocks_override=\"None\",sliding_window=\"None\",swap_space_bytes=\"4294967296\"",
                cfg.block_size, cfg.num_gpu_blocks
            );
            gauge(
                &mut out,
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                &[(info, 1.0)],
            );
            if !cfg.lora_modules.is_empty() {
                let running: Vec<&str> = st
                    .loras
                    .iter()
                    .filter(|(_, r)| *r > 0)
                    .map(|(n, _)| n.as_str())
                    .collect();
                let waiting: Vec<&str> = st.lora_waiting.keys().map(String::as_str).collect();
                let labels = format!(
                    "max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"",
                    cfg.max_loras,
                    running.join(","),
                    waiting.join(",")
                );
                gauge(
                    &mut out,
                    "vllm:lora_requests_info",
                    "Running stats on lora requests.",
                    &[(labels, st.lora_changed)],
                );
            }
        }
        Engine::Sglang => {
            let l = format!("model_name=\"{model}\"");
            gauge(
                &mut out,
                "sglang:num_running_reqs",
                "The number of running requests.",
                &[(l.clone(), running)],
            );
            gauge(
                &mut out,
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                &[(l.clone(), waiting)],
            );
            gauge(
                &mut out,
                "sglang:token_usage",
                "The token usage.",
                &[(l.clone(), kv)],
            );
            let info = format!(
                "model_name=\"{model}\",num_pages=\"{}\",page_size=\"{}\"",
                cfg.num_gpu_blocks, cfg.block_size
            );
            gauge(
                &mut out,
                "sglang:cache_config_info",
                "Cache configuration.",
                &[(info, 1.0)],
            );
            counter(
                &mut out,
                "sglang:prompt_tokens",
                "Number of prefill tokens processed.",
                &l,
                st.prompt_tokens_total,
                created,
            );
            counter(
                &mut out,
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                &l,
                st.generation_tokens_total,
                created,
            );
            st.ttft.render(
                &mut out,
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &l,
            );
        }
        Engine::TrtllmServe => {
            let l = format!("model_name=\"{model}\"");
            gauge(
                &mut out,
                "trtllm_num_requests_running",
                "Running requests.",
                &[(l.clone(), running)],
            );
            gauge(
                &mut out,
                "trtllm_num_requests_waiting",
                "Waiting requests.",
                &[(l.clone(), waiting)],
            );
            gauge(
                &mut out,
                "trtllm_kv_cache_utilization",
                "KV-cache utilization.",
                &[(l.clone(), kv)],
            );
            gauge(
                &mut out,
                "trtllm_kv_cache_tokens_per_block",
                "Tokens per KV block.",
                &[(l.clone(), cfg.block_size as f64)],
            );
            gauge(
                &mut out,
                "trtllm_kv_cache_max_blocks",
                "KV blocks.",
                &[(l.clone(), cfg.num_gpu_blocks as f64)],
            );
            st.ttft.render(
                &mut out,
                "trtllm_time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &l,
            );
        }
        Engine::Triton => {
            // Triton's C++ client library prints integers without ".0".
            let m = "model=\"tensorrt_llm\",version=\"1\"";
            let _ = writeln!(
                out,
                "# HELP nv_trt_llm_request_metrics TRT LLM request metrics\n# TYPE nv_trt_llm_request_metrics gauge"
            );
            for (kind, v) in [
                ("waiting", waiting),
                ("scheduled", running),
                ("active", running),
                ("max", cfg.max_num_seqs as f64),
            ] {
                let _ = writeln!(
                    out,
                    "nv_trt_llm_request_metrics{{{m},request_type=\"{kind}\"}} {v}"
                );
            }
            let used = st.blocks_in_use.min(cfg.num_gpu_blocks);
            let _ = writeln!(
                out,
                "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics\n# TYPE nv_trt_llm_kv_cache_block_metrics gauge"
            );
            for (kind, v) in [
                ("max", cfg.num_gpu_blocks.to_string()),
                ("free", (cfg.num_gpu_blocks - used).to_string()),
                ("used", used.to_string()),
                ("tokens_per", cfg.block_size.to_string()),
                ("fraction", format!("{kv}")),
            ] {
                let _ = writeln!(
                    out,
                    "nv_trt_llm_kv_cache_block_metrics{{{m},kv_cache_block_type=\"{kind}\"}} {v}"
                );
            }
        }
    }
    // Admin-set gauges, grouped by family so each family is declared once.
    let mut families: std::collections::BTreeMap<&str, Vec<(&str, f64)>> = Default::default();
    for (series, v) in &st.gauges {
        let name = series.split('{').next().unwrap_or(series);
        families.entry(name).or_default().push((series, *v));
    }
    for (name, series) in families {
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (s, v) in series {
            let _ = writeln!(out, "{s} {v:?}");
        }
    }
    out
}
