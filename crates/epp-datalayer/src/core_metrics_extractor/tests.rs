use std::collections::BTreeMap;

use super::*;

fn endpoint(engine: Option<&str>) -> Endpoint {
    let mut labels = BTreeMap::new();
    if let Some(e) = engine {
        labels.insert("llm-d.ai/engine-type".to_owned(), e.to_owned());
    }
    Endpoint::with_labels(
        epp_core::EndpointId(0),
        "10.0.0.1:8000".parse().unwrap(),
        labels,
    )
}

fn extract(engine: Option<&str>, page: &str) -> Result<EndpointMetrics, ExtractError> {
    let x = CoreMetricsExtractor::new("core", &CoreMetricsParams::default()).unwrap();
    let mut m = EndpointMetrics::default();
    x.extract(&endpoint(engine), page, &mut m).map(|()| m)
}

const VLLM_DP: &str = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:num_requests_running{engine="1",model_name="m"} 6.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql, chat",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters="x"} 1.6e+09
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27912",swap_space_bytes="4294967296"} 1.0
"#;

#[test]
fn vllm_data_parallel_lora_and_geometry() {
    let m = extract(None, VLLM_DP).unwrap();
    assert_eq!((m.waiting, m.running), (7, 14), "summed over engines");
    assert!((m.kv_usage - 0.375).abs() < 1e-12, "averaged over engines");
    assert_eq!(m.lora.active, vec!["sql", "chat"], "newest series, trimmed");
    assert!(m.lora.waiting.is_empty());
    assert_eq!(m.lora.max_loras, 2);
    assert_eq!(
        m.cache,
        Some(CacheGeometry {
            block_size_tokens: 16,
            num_blocks: 27912
        })
    );
}

#[test]
fn old_vllm_kv_name_is_a_fallback() {
    let page = "vllm:num_requests_waiting 1\nvllm:gpu_cache_usage_perc 0.9\n";
    let m = extract(Some("vllm"), page).unwrap();
    assert!((m.kv_usage - 0.9).abs() < 1e-12);
}

#[test]
fn other_engines() {
    let sglang = "sglang:num_queue_reqs{model_name=\"m\"} 5\nsglang:num_running_reqs{model_name=\"m\"} 2\nsglang:token_usage{model_name=\"m\"} 0.3\nsglang:cache_config_info{num_pages=\"1000\",page_size=\"32\"} 1\n";
    let m = extract(Some("sglang"), sglang).unwrap();
    assert_eq!((m.waiting, m.running), (5, 2));
    assert_eq!(
        m.cache,
        Some(CacheGeometry {
            block_size_tokens: 32,
            num_blocks: 1000
        })
    );

    let trt = "trtllm_num_requests_waiting 2\ntrtllm_num_requests_running 1\ntrtllm_kv_cache_utilization 0.1\ntrtllm_kv_cache_tokens_per_block 64\ntrtllm_kv_cache_max_blocks 512\n";
    let m = extract(Some("trtllm-serve"), trt).unwrap();
    assert_eq!(
        m.cache,
        Some(CacheGeometry {
            block_size_tokens: 64,
            num_blocks: 512
        })
    );

    // Triton prints integers without ".0"; older releases say _statistics.
    let triton_old = "nv_trt_llm_request_statistics{model=\"t\",request_type=\"waiting\",version=\"1\"} 9\n\
                      nv_trt_llm_request_statistics{model=\"t\",request_type=\"scheduled\",version=\"1\"} 3\n\
                      nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"fraction\",model=\"t\",version=\"1\"} 0.75\n\
                      nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"tokens_per\",model=\"t\",version=\"1\"} 32\n\
                      nv_trt_llm_kv_cache_block_statistics{kv_cache_block_type=\"max\",model=\"t\",version=\"1\"} 4096\n";
    let m = extract(Some("triton-tensorrt-llm"), triton_old).unwrap();
    assert_eq!((m.waiting, m.running), (9, 3));
    assert!((m.kv_usage - 0.75).abs() < 1e-12);
    assert_eq!(
        m.cache,
        Some(CacheGeometry {
            block_size_tokens: 32,
            num_blocks: 4096
        })
    );
}

#[test]
fn garbage_is_an_error_and_unknown_engines_use_the_default() {
    let e = extract(None, "<html>502 Bad Gateway</html>").unwrap_err();
    assert!(e.0.contains("none of the vllm"), "{e}");
    let e = extract(None, "vllm:num_requests_waiting{engine=\"0\" 1\n").unwrap_err();
    assert!(e.0.contains("first malformed line: line 1"), "{e}");
    // As in the reference: an engine without an entry is read as the default.
    let m = extract(Some("tgi"), VLLM_DP).unwrap();
    assert_eq!(m.waiting, 7);
}

fn params(yaml: &str) -> CoreMetricsParams {
    serde_yaml_ng::from_str(yaml).unwrap()
}

#[test]
fn an_engine_entry_replaces_the_builtin_one_and_adds_engines() {
    let x = CoreMetricsExtractor::new(
        "core",
        &params(
            "engineConfigs:\n- name: vllm\n  queuedRequestsSpec: 'my_queue{pool=\"a\"}'\n- name: tgi\n  queuedRequestsSpec: tgi_queue_size\n",
        ),
    )
    .unwrap();
    let mut m = EndpointMetrics::default();
    x.extract(
        &endpoint(None),
        "my_queue{pool=\"a\"} 11\nmy_queue{pool=\"b\"} 99\nvllm:num_requests_running 1\n",
        &mut m,
    )
    .unwrap();
    assert_eq!(
        (m.waiting, m.running),
        (11, 0),
        "the entry replaces the built-in vllm one: running is not scraped"
    );
    x.extract(&endpoint(Some("tgi")), "tgi_queue_size 4\n", &mut m)
        .unwrap();
    assert_eq!(m.waiting, 4);
    // Engines the config does not name keep their built-in entries.
    x.extract(
        &endpoint(Some("sglang")),
        "sglang:num_queue_reqs 6\nsglang:num_running_reqs 2\n",
        &mut m,
    )
    .unwrap();
    assert_eq!((m.waiting, m.running), (6, 2));
}

/// The reference's documented parameters load unchanged and mean the same.
#[test]
fn reference_parameters_load_unchanged() {
    let x = CoreMetricsExtractor::new(
        "core",
        &params(
            r#"
engineLabelKey: "example.com/server"
defaultEngine: "sglang"
engineConfigs:
  - name: vllm
    queuedRequestsSpec:  "vllm:num_requests_waiting"
    runningRequestsSpec: "vllm:num_requests_running"
    kvUsageSpec:         "vllm:kv_cache_usage_perc"
    loraSpec:            ""    # empty string disables LoRA extraction
    cacheInfoSpec:       "vllm:cache_config_info"
    cacheBlockSizeLabelName: "bs"
    cacheNumBlocksLabelName: "nb"
  - name: triton
    queuedRequestsSpec: "nv_trt_llm_request_metrics{request_type=waiting}"
    runningRequestsSpec: "nv_trt_llm_request_metrics{request_type=scheduled}"
    kvUsageSpec: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"
    cacheBlockSizeSpec: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"
    cacheNumBlocksSpec: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"
"#,
        ),
    )
    .unwrap();
    let labelled = |key: &str, engine: &str| {
        Endpoint::with_labels(
            epp_core::EndpointId(0),
            "10.0.0.1:8000".parse().unwrap(),
            BTreeMap::from([(key.to_owned(), engine.to_owned())]),
        )
    };
    let mut m = EndpointMetrics::default();
    let vllm = "vllm:num_requests_waiting 2\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n\
                vllm:lora_requests_info{running_lora_adapters=\"a\"} 1\nvllm:cache_config_info{bs=\"16\",nb=\"100\"} 1\n";
    x.extract(&labelled("example.com/server", "vllm"), vllm, &mut m)
        .unwrap();
    assert_eq!((m.waiting, m.running), (2, 1));
    assert!(m.lora.active.is_empty(), "loraSpec \"\" is not scraped");
    assert_eq!(
        m.cache,
        Some(CacheGeometry {
            block_size_tokens: 16,
            num_blocks: 100
        })
    );
    let triton = "nv_trt_llm_request_metrics{request_type=\"waiting\"} 3\nnv_trt_llm_request_metrics{request_type=\"scheduled\"} 4\n\
                  nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"} 0.5\n\
                  nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"} 64\n\
                  nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 8\n";
    let mut m = EndpointMetrics::default();
    x.extract(&labelled("example.com/server", "triton"), triton, &mut m)
        .unwrap();
    assert_eq!((m.waiting, m.running), (3, 4));
    assert_eq!(
        m.cache,
        Some(CacheGeometry {
            block_size_tokens: 64,
            num_blocks: 8
        })
    );
    // Only the configured key names the engine; without it, defaultEngine.
    let mut m = EndpointMetrics::default();
    x.extract(
        &endpoint(Some("vllm")),
        "sglang:num_queue_reqs 9\nvllm:num_requests_waiting 1\n",
        &mut m,
    )
    .unwrap();
    assert_eq!(
        m.waiting, 9,
        "llm-d.ai/engine-type is ignored when engineLabelKey is set"
    );
}

#[test]
fn bad_parameters_are_clear_errors() {
    let err = |yaml: &str| {
        CoreMetricsExtractor::new("core", &params(yaml))
            .unwrap_err()
            .to_string()
    };
    let e = err("engineConfigs:\n- {name: vllm, kvUsageSpec: '9bad'}\n");
    assert!(e.contains("engineConfigs[vllm].kvUsageSpec"), "{e}");
    let e = err("engineConfigs:\n- {name: vllm, kvUsageSpec: 'kv{a=\"1\",a=\"2\"}'}\n");
    assert!(e.contains("not already matched"), "{e}");
    let e = err("defaultEngine: tgi\n");
    assert!(
        e.contains("defaultEngine") && e.contains("not found in engineConfigs"),
        "{e}"
    );
    let e = err(
        "engineConfigs:\n- {name: x, queuedRequestsSpec: a}\n- {name: x, queuedRequestsSpec: b}\n",
    );
    assert!(
        e.contains("engineConfigs[1].name") && e.contains("already has an entry"),
        "{e}"
    );
    let e = err("engineConfigs:\n- {name: '', queuedRequestsSpec: a}\n");
    assert!(e.contains("needs a name"), "{e}");
    let e =
        serde_yaml_ng::from_str::<CoreMetricsParams>("engineConfigs:\n- {queuedRequestsSpec: a}\n")
            .unwrap_err()
            .to_string();
    assert!(e.contains("missing field `name`"), "{e}");
    assert!(
        serde_yaml_ng::from_str::<CoreMetricsParams>("engineConfigs:\n- {name: a, queueSpec: b}\n")
            .is_err()
    );
    // A bar inside a quoted value is not an alternative.
    let x = CoreMetricsExtractor::new(
        "core",
        &params("engineConfigs:\n- {name: vllm, queuedRequestsSpec: 'q{a=\"x|y\"}|q2'}\n"),
    )
    .unwrap();
    let mut m = EndpointMetrics::default();
    x.extract(&endpoint(None), "q{a=\"x|y\"} 5\n", &mut m)
        .unwrap();
    assert_eq!(m.waiting, 5);
}

#[test]
fn builtin_table_parses() {
    let x = CoreMetricsExtractor::builtin("core");
    assert_eq!(x.engines.len(), 4);
    for engine in ["vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"] {
        assert!(x.engines.contains_key(engine), "{engine}");
    }
}
