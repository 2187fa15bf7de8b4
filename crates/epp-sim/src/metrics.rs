//! The `/metrics` page, in the names and shape the simulated engine prints
//! (Prometheus text format 0.0.4, as `prometheus_client` writes it for vLLM
//! and SGLang).

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    config::Engine,
    engine_core::{Core, unix_now},
    stats::{FinishReason, Histogram},
};

/// A page being written. Labels are passed pre-rendered (`a="1",b="2"`).
struct Page {
    out: String,
    created: f64,
}

impl Page {
    fn head(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &str, v: f64) {
        self.head(name, help, "gauge");
        self.sample(name, labels, v);
    }

    fn sample(&mut self, name: &str, labels: &str, v: f64) {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {v:?}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {v:?}");
        }
    }

    /// A counter family `{name}_total` with one series per label set, and the
    /// `{name}_created` gauge `prometheus_client` adds.
    fn counter(&mut self, name: &str, help: &str, series: &[(String, u64)]) {
        self.head(&format!("{name}_total"), help, "counter");
        for (labels, v) in series {
            self.sample(&format!("{name}_total"), labels, *v as f64);
        }
        self.head(&format!("{name}_created"), help, "gauge");
        for (labels, _) in series {
            self.sample(&format!("{name}_created"), labels, self.created);
        }
    }

    fn histogram(&mut self, name: &str, help: &str, labels: &str, h: &Histogram) {
        self.head(name, help, "histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        for (le, c) in h.cumulative() {
            let _ = writeln!(
                self.out,
                "{name}_bucket{{{labels}{sep}le=\"{le:?}\"}} {:?}",
                c as f64
            );
        }
        let count = h.count() as f64;
        let _ = writeln!(
            self.out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count:?}"
        );
        self.sample(&format!("{name}_count"), labels, count);
        self.sample(&format!("{name}_sum"), labels, h.sum());
        self.head(&format!("{name}_created"), help, "gauge");
        self.sample(&format!("{name}_created"), labels, self.created);
    }
}

/// Renders the page for `core` in its engine's names. `created` is the
/// process start (Unix seconds).
#[must_use]
pub fn render(core: &Core, created: f64) -> String {
    let mut p = Page {
        out: String::with_capacity(24 * 1024),
        created,
    };
    match core.cfg().engine {
        Engine::Vllm => vllm(&mut p, core),
        Engine::Sglang => sglang(&mut p, core),
        Engine::TrtllmServe => trtllm(&mut p, core),
        Engine::Triton => triton(&mut p, core),
    }
    let cfg = core.cfg();
    p.gauge(
        "epp_sim_info",
        "The simulated server.",
        &format!(
            "engine=\"{}\",pod=\"{}\"",
            match cfg.engine {
                Engine::Vllm => "vllm",
                Engine::Sglang => "sglang",
                Engine::TrtllmServe => "trtllm-serve",
                Engine::Triton => "triton",
            },
            escape(&cfg.pod_name)
        ),
        1.0,
    );
    if core.kv_events_on() {
        p.counter(
            "epp_sim_kv_events_dropped",
            "KV event batches dropped because the publisher's queue was full.",
            &[(String::new(), core.stats.kv_events_dropped)],
        );
    }
    extra_gauges(&mut p, &core.knobs.gauges);
    p.out
}

/// Waiting requests as reported: real ones plus the admin's synthetic ones.
fn waiting(core: &Core) -> f64 {
    (core.waiting() as u64 + u64::from(core.knobs.extra_waiting)) as f64
}

fn vllm(p: &mut Page, core: &Core) {
    let cfg = core.cfg();
    let l = format!("engine=\"0\",model_name=\"{}\"", escape(&cfg.model));
    let s = &core.stats;
    p.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &l,
        core.running() as f64,
    );
    p.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &l,
        waiting(core),
    );
    p.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &l,
        core.kv_usage(),
    );
    let one = |v: u64| [(l.clone(), v)];
    p.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &one(s.prefix_queries),
    );
    p.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &one(s.prefix_hits),
    );
    p.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &one(s.preemptions),
    );
    p.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &one(s.prompt_tokens),
    );
    p.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &one(s.generation_tokens),
    );
    let by_reason: Vec<(String, u64)> = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
    ]
    .into_iter()
    .map(|r| {
        (
            format!(
                "engine=\"0\",finished_reason=\"{}\",model_name=\"{}\"",
                r.as_str(),
                escape(&cfg.model)
            ),
            s.finished(r),
        )
    })
    .collect();
    p.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        &by_reason,
    );
    for (name, help, h) in [
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &s.request_prompt_tokens,
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &s.request_generation_tokens,
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &s.iteration_tokens,
        ),
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &s.ttft,
        ),
        (
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            &s.itl,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &s.itl,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &s.e2e,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &s.queue,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &s.inference,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &s.prefill,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &s.decode,
        ),
    ] {
        p.histogram(name, help, &l, h);
    }
    let info = format!(
        "block_size=\"{}\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",\
         enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",\
         is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",\
         num_gpu_blocks_override=\"None\",prefix_caching_hash_algo=\"builtin\",\
         sliding_window=\"None\",swap_space=\"4\",swap_space_bytes=\"4294967296\"",
        cfg.block_size, cfg.num_gpu_blocks
    );
    p.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &info,
        1.0,
    );
    if !cfg.lora_modules.is_empty() {
        p.head(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            "gauge",
        );
        // Every label set ever current stays, valued at the time it was last
        // current; readers take the highest value.
        let n = core.lora_history.len();
        for (i, (labels, at)) in core.lora_history.iter().enumerate() {
            let v = if i + 1 == n { unix_now() } else { *at };
            p.sample("vllm:lora_requests_info", labels, v);
        }
    }
}

fn sglang(p: &mut Page, core: &Core) {
    let cfg = core.cfg();
    let l = format!("model_name=\"{}\"", escape(&cfg.model));
    let s = &core.stats;
    p.gauge(
        "sglang:num_running_reqs",
        "The number of running requests.",
        &l,
        core.running() as f64,
    );
    p.gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        &l,
        waiting(core),
    );
    p.gauge(
        "sglang:num_used_tokens",
        "The number of used tokens.",
        &l,
        (core.pool().used() * cfg.block_size) as f64,
    );
    p.gauge(
        "sglang:token_usage",
        "The token usage.",
        &l,
        core.kv_usage(),
    );
    let hit_rate = if s.prefix_queries == 0 {
        0.0
    } else {
        s.prefix_hits as f64 / s.prefix_queries as f64
    };
    p.gauge(
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        &l,
        hit_rate,
    );
    p.gauge(
        "sglang:cache_config_info",
        "Cache configuration.",
        &format!(
            "model_name=\"{}\",num_pages=\"{}\",page_size=\"{}\"",
            escape(&cfg.model),
            cfg.num_gpu_blocks,
            cfg.block_size
        ),
        1.0,
    );
    let one = |v: u64| [(l.clone(), v)];
    p.counter(
        "sglang:prompt_tokens",
        "Number of prefill tokens processed.",
        &one(s.prompt_tokens),
    );
    p.counter(
        "sglang:generation_tokens",
        "Number of generation tokens processed.",
        &one(s.generation_tokens),
    );
    p.counter(
        "sglang:cached_tokens",
        "Number of cached prompt tokens.",
        &one(s.prefix_hits),
    );
    p.counter(
        "sglang:num_requests",
        "Number of requests processed.",
        &one(s.finished(FinishReason::Length)),
    );
    p.histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
        &s.ttft,
    );
    p.histogram(
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &l,
        &s.itl,
    );
    p.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        &l,
        &s.e2e,
    );
}

fn trtllm(p: &mut Page, core: &Core) {
    let cfg = core.cfg();
    let l = format!("model_name=\"{}\"", escape(&cfg.model));
    let s = &core.stats;
    for (name, help, v) in [
        (
            "trtllm_num_requests_running",
            "Number of running requests.",
            core.running() as f64,
        ),
        (
            "trtllm_num_requests_waiting",
            "Number of waiting requests.",
            waiting(core),
        ),
        (
            "trtllm_kv_cache_utilization",
            "KV cache utilization.",
            core.kv_usage(),
        ),
        (
            "trtllm_kv_cache_tokens_per_block",
            "Tokens per KV cache block.",
            cfg.block_size as f64,
        ),
        (
            "trtllm_kv_cache_max_blocks",
            "Maximum KV cache blocks.",
            cfg.num_gpu_blocks as f64,
        ),
        (
            "trtllm_kv_cache_used_blocks",
            "Used KV cache blocks.",
            core.pool().used() as f64,
        ),
    ] {
        p.gauge(name, help, &l, v);
    }
    p.counter(
        "trtllm_request_success",
        "Count of successfully processed requests.",
        &[(
            format!(
                "finished_reason=\"length\",model_name=\"{}\"",
                escape(&cfg.model)
            ),
            s.finished(FinishReason::Length),
        )],
    );
    p.histogram(
        "trtllm_time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
        &s.ttft,
    );
    p.histogram(
        "trtllm_e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        &l,
        &s.e2e,
    );
}

fn triton(p: &mut Page, core: &Core) {
    // Triton's C++ metrics library prints integers without a decimal point.
    let cfg = core.cfg();
    let m = "model=\"tensorrt_llm\",version=\"1\"";
    let out = &mut p.out;
    let _ = writeln!(
        out,
        "# HELP nv_trt_llm_request_metrics TRT LLM request metrics\n\
         # TYPE nv_trt_llm_request_metrics gauge"
    );
    let running = core.running() as u64;
    let waiting = core.waiting() as u64 + u64::from(core.knobs.extra_waiting);
    for (kind, v) in [
        ("context", 0),
        ("scheduled", running),
        ("max", cfg.max_num_seqs as u64),
        ("active", running),
        ("waiting", waiting),
    ] {
        let _ = writeln!(
            out,
            "nv_trt_llm_request_metrics{{{m},request_type=\"{kind}\"}} {v}"
        );
    }
    let used = core.pool().used();
    let _ = writeln!(
        out,
        "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics\n\
         # TYPE nv_trt_llm_kv_cache_block_metrics gauge"
    );
    for (kind, v) in [
        ("max", cfg.num_gpu_blocks.to_string()),
        ("free", (cfg.num_gpu_blocks - used).to_string()),
        ("used", used.to_string()),
        ("tokens_per", cfg.block_size.to_string()),
        ("fraction", format!("{}", core.kv_usage())),
    ] {
        let _ = writeln!(
            out,
            "nv_trt_llm_kv_cache_block_metrics{{{m},kv_cache_block_type=\"{kind}\"}} {v}"
        );
    }
}

/// Admin-set gauges, grouped by family so each family is declared once.
fn extra_gauges(p: &mut Page, gauges: &BTreeMap<String, f64>) {
    let mut families: BTreeMap<&str, Vec<(&str, f64)>> = BTreeMap::new();
    for (series, v) in gauges {
        let name = series.split('{').next().unwrap_or(series);
        families.entry(name).or_default().push((series, *v));
    }
    for (name, series) in families {
        let _ = writeln!(p.out, "# TYPE {name} gauge");
        for (s, v) in series {
            let _ = writeln!(p.out, "{s} {v:?}");
        }
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
