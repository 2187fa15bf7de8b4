//! Throughput of our full parse and selective extraction against the Rust
//! crates users have today, on the same fixture bytes, in one run:
//! `cargo bench -p epp-promtext`. `prometheus-parse` drops every metric whose
//! name has a colon (all of vLLM's and SGLang's), so it is also timed on a
//! colon-free copy of each page. A memchr newline count is the floor.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use epp_promtext::{Selector, SelectorSet, families, samples};

const VLLM: &[&str] = &[
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:cache_config_info",
];

const TRITON: &[&str] = &[
    "nv_trt_llm_request_metrics{request_type=\"waiting\"}",
    "nv_trt_llm_request_metrics{request_type=\"scheduled\"}",
    "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}",
    "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"}",
    "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"}",
];

/// Each fixture with the core metric specs of its engine (as the data
/// layer's defaults use them).
const FIXTURES: [(&str, &[&str]); 7] = [
    ("vllm.txt", VLLM),
    ("vllm-multiprocess.txt", VLLM),
    ("vllm-data-parallel.txt", VLLM),
    (
        "sglang.txt",
        &[
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            "sglang:token_usage",
            "sglang:cache_config_info",
        ],
    ),
    (
        "trtllm-serve.txt",
        &[
            "trtllm_num_requests_waiting",
            "trtllm_num_requests_running",
            "trtllm_kv_cache_utilization",
            "trtllm_kv_cache_tokens_per_block",
            "trtllm_kv_cache_max_blocks",
        ],
    ),
    ("triton-trtllm.txt", TRITON),
    ("vllm-1mb.txt", VLLM),
];

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    for (name, specs) in FIXTURES {
        let page = fixture(name);
        let colon_free = page.replace(':', "_");
        let set = SelectorSet::new(
            specs
                .iter()
                .filter_map(|s| Selector::parse(s).ok())
                .collect(),
        );
        report_coverage(name, &page, &colon_free);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(page.len() as u64));
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
        g.sample_size(30);
        g.bench_function("memchr newline scan (floor)", |b| {
            b.iter(|| memchr::memchr_iter(b'\n', black_box(page.as_bytes())).count())
        });
        g.bench_function("epp-promtext full parse with labels", |b| {
            b.iter(|| {
                let mut n = 0usize;
                for s in samples(black_box(&page)).flatten() {
                    n += s.labels().map(|(k, v)| k.len() + v.len()).sum::<usize>()
                        + s.value.to_bits() as usize % 2;
                }
                n
            });
        });
        g.bench_function("epp-promtext selective (core metrics)", |b| {
            b.iter(|| {
                let mut total = 0.0;
                set.scan(black_box(&page), |_, s| total += s.value);
                total
            });
        });
        g.bench_function("epp-promtext families (allocates)", |b| {
            b.iter(|| families(black_box(&page)).map(|f| f.len()).unwrap_or(0));
        });
        g.bench_function("prom_text_format_parser", |b| {
            b.iter(|| prom_text_format_parser::Scrape::parse(black_box(&page)).is_ok())
        });
        g.bench_function("prometheus-exposition-format-rs", |b| {
            b.iter(|| {
                prometheus_exposition_format_rs::parse_complete(black_box(&page))
                    .map(|m| m.len())
                    .unwrap_or(0)
            });
        });
        g.bench_function("prometheus-parse (drops colon names)", |b| {
            b.iter(|| {
                prometheus_parse::Scrape::parse(black_box(&page).lines().map(|l| Ok(l.to_owned())))
                    .map(|s| s.samples.len())
                    .unwrap_or(0)
            });
        });
        g.bench_function("prometheus-parse (colon-free copy)", |b| {
            b.iter(|| {
                prometheus_parse::Scrape::parse(
                    black_box(&colon_free).lines().map(|l| Ok(l.to_owned())),
                )
                .map(|s| s.samples.len())
                .unwrap_or(0)
            });
        });
        g.finish();
    }
}

/// What each parser made of the page, so a fast error is not mistaken for
/// a fast parse.
fn report_coverage(name: &str, page: &str, colon_free: &str) {
    let ours = samples(page).filter(Result::is_ok).count();
    let ptfp = prom_text_format_parser::Scrape::parse(page)
        .map(|s| {
            s.metrics
                .iter()
                .map(|m| m.samples.len())
                .sum::<usize>()
                .to_string()
        })
        .unwrap_or_else(|e| format!("error: {e:?}"));
    let pefr = prometheus_exposition_format_rs::parse_complete(page)
        .map(|m| m.iter().map(|m| m.samples.len()).sum::<usize>().to_string())
        .unwrap_or_else(|e| format!("error: {e:?}"));
    let pp = |text: &str| {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .map(|s| s.samples.len().to_string())
            .unwrap_or_else(|e| format!("error: {e}"))
    };
    eprintln!(
        "{name}: samples read: epp-promtext {ours}, prom_text_format_parser {ptfp}, \
         prometheus-exposition-format-rs {pefr}, prometheus-parse {} (colon-free {})",
        pp(page),
        pp(colon_free)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
