//! Every engine's realistic page (the parser crate's fixtures) extracts.

use std::collections::BTreeMap;

use epp_core::{CacheGeometry, Endpoint, EndpointId, EndpointMetrics, Extractor};
use epp_datalayer::{CoreMetricsExtractor, CoreMetricsParams};

fn page(name: &str) -> String {
    let path = format!(
        "{}/../epp-promtext/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn extract(engine: &str, fixture: &str) -> EndpointMetrics {
    let labels = BTreeMap::from([("llm-d.ai/engine-type".to_owned(), engine.to_owned())]);
    let e = Endpoint::with_labels(EndpointId(0), "10.0.0.1:8000".parse().unwrap(), labels);
    let x = CoreMetricsExtractor::new("core", &CoreMetricsParams::default()).unwrap();
    let mut m = EndpointMetrics::default();
    x.extract(&e, &page(fixture), &mut m)
        .unwrap_or_else(|err| panic!("{fixture}: {err}"));
    m
}

#[test]
fn every_engine_fixture_extracts() {
    for (engine, fixture) in [
        ("vllm", "vllm.txt"),
        ("vllm", "vllm-multiprocess.txt"),
        ("vllm", "vllm-data-parallel.txt"),
        ("vllm", "vllm-1mb.txt"),
        ("sglang", "sglang.txt"),
        ("trtllm-serve", "trtllm-serve.txt"),
        ("triton-tensorrt-llm", "triton-trtllm.txt"),
        ("triton-tensorrt-llm", "triton-trtllm-statistics.txt"),
    ] {
        let m = extract(engine, fixture);
        assert!((0.0..=1.0).contains(&m.kv_usage), "{fixture}: {m:?}");
        println!(
            "{fixture}: waiting {} running {} kv {} lora {:?} cache {:?}",
            m.waiting, m.running, m.kv_usage, m.lora, m.cache
        );
    }
}

#[test]
fn fixture_values() {
    let geometry = |b, n| {
        Some(CacheGeometry {
            block_size_tokens: b,
            num_blocks: n,
        })
    };
    let m = extract("vllm", "vllm.txt");
    assert_eq!((m.waiting, m.running), (3, 12));
    assert!((m.kv_usage - 0.4215).abs() < 1e-9);
    assert_eq!(
        m.lora.active,
        ["sql-lora", "chat-lora"],
        "newest series, spaces trimmed"
    );
    assert_eq!(
        (m.lora.waiting.as_slice(), m.lora.max_loras),
        (&["summarize".to_owned()][..], 4)
    );
    assert_eq!(m.cache, geometry(16, 27912));
    // The model adapters apply to: the model_name label of the core series.
    assert_eq!(
        m.lora.base_model.as_deref(),
        Some("meta-llama/Llama-3.1-8B-Instruct")
    );

    // Two data-parallel engine ranks: queues summed, KV averaged.
    let m = extract("vllm", "vllm-data-parallel.txt");
    assert_eq!((m.waiting, m.running), (7, 25));
    assert!((m.kv_usage - (0.4215 + 0.21075) / 2.0).abs() < 1e-9);

    let m = extract("sglang", "sglang.txt");
    assert_eq!((m.waiting, m.running), (2, 7));
    assert!((m.kv_usage - 0.28).abs() < 1e-9);
    assert_eq!(m.cache, geometry(1, 65536));
    assert_eq!(
        m.lora.base_model.as_deref(),
        Some("meta-llama/Llama-3.1-8B-Instruct")
    );

    let m = extract("trtllm-serve", "trtllm-serve.txt");
    assert_eq!((m.waiting, m.running), (1, 5));
    assert_eq!(
        m.lora.base_model.as_deref(),
        Some("meta-llama/Llama-3.1-8B-Instruct")
    );
    assert_eq!(m.cache, geometry(32, 8192));

    for fixture in ["triton-trtllm.txt", "triton-trtllm-statistics.txt"] {
        let m = extract("triton-tensorrt-llm", fixture);
        assert_eq!((m.waiting, m.running), (4, 9), "{fixture}");
        assert!((m.kv_usage - 0.75).abs() < 1e-9, "{fixture}");
        assert_eq!(m.cache, geometry(64, 4096), "{fixture}");
        assert_eq!(m.lora.base_model, None, "{fixture}: no model_name label");
    }
}
