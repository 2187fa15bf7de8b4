//! Real-shaped pages from each engine parse without error, and selective
//! extraction reads the values the data layer needs.

use epp_promtext::{Selector, SelectorSet, samples};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture file")
}

const ALL: [&str; 8] = [
    "vllm.txt",
    "vllm-multiprocess.txt",
    "vllm-data-parallel.txt",
    "sglang.txt",
    "trtllm-serve.txt",
    "triton-trtllm.txt",
    "triton-trtllm-statistics.txt",
    "vllm-1mb.txt",
];

#[test]
fn every_fixture_parses_cleanly() {
    for name in ALL {
        let page = fixture(name);
        let mut n = 0;
        for s in samples(&page) {
            let s = s.unwrap_or_else(|e| panic!("{name}: {e}: {:?}", e));
            assert!(!s.name.is_empty());
            for (k, _) in s.labels() {
                assert!(!k.is_empty(), "{name} line {}", s.line);
            }
            n += 1;
        }
        assert!(n > 15, "{name}: only {n} samples");
    }
}

fn sum(page: &str, spec: &str) -> (f64, usize) {
    let set = SelectorSet::new(vec![Selector::parse(spec).expect("valid spec")]);
    let (mut total, mut n) = (0.0, 0);
    let report = set.scan(page, |_, s| {
        total += s.value;
        n += 1;
    });
    assert_eq!(report.errors, 0);
    (total, n)
}

#[test]
fn core_metrics_of_each_engine() {
    let vllm = fixture("vllm.txt");
    assert_eq!(sum(&vllm, "vllm:num_requests_waiting"), (3.0, 1));
    assert_eq!(sum(&vllm, "vllm:num_requests_running"), (12.0, 1));
    assert_eq!(sum(&vllm, "vllm:kv_cache_usage_perc").0, 0.4215);

    let dp = fixture("vllm-data-parallel.txt");
    assert_eq!(
        sum(&dp, "vllm:num_requests_waiting"),
        (7.0, 2),
        "3 + 4 over two engines"
    );
    assert_eq!(
        sum(&dp, "vllm:num_requests_waiting{engine=\"1\"}"),
        (4.0, 1)
    );

    let mp = fixture("vllm-multiprocess.txt");
    assert_eq!(
        sum(&mp, "vllm:prompt_tokens_created").1,
        0,
        "multiprocess mode has no _created"
    );
    assert_eq!(sum(&mp, "vllm:num_requests_running").0, 12.0);

    assert_eq!(sum(&fixture("sglang.txt"), "sglang:num_queue_reqs").0, 2.0);
    assert_eq!(
        sum(&fixture("trtllm-serve.txt"), "trtllm_kv_cache_max_blocks").0,
        8192.0
    );
    let triton = fixture("triton-trtllm.txt");
    assert_eq!(
        sum(
            &triton,
            "nv_trt_llm_request_metrics{request_type=\"waiting\"}"
        )
        .0,
        4.0
    );
    assert_eq!(
        sum(
            &triton,
            "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}"
        )
        .0,
        0.75
    );
    let old = fixture("triton-trtllm-statistics.txt");
    assert_eq!(
        sum(
            &old,
            "nv_trt_llm_request_statistics{request_type=\"scheduled\"}"
        )
        .0,
        9.0
    );
}

#[test]
fn labels_of_info_series() {
    let page = fixture("vllm.txt");
    let set = SelectorSet::new(vec![
        Selector::name("vllm:lora_requests_info"),
        Selector::name("vllm:cache_config_info"),
    ]);
    let mut newest = (0.0, String::new());
    let mut geometry = None;
    set.scan(&page, |i, s| {
        if i == 0 && s.value > newest.0 {
            newest = (
                s.value,
                s.label("running_lora_adapters").unwrap().into_owned(),
            );
        } else if i == 1 {
            geometry = Some((
                s.label("block_size").unwrap().into_owned(),
                s.label("num_gpu_blocks").unwrap().into_owned(),
            ));
        }
    });
    assert_eq!(
        newest.1, "sql-lora, chat-lora",
        "the newest series is listed first"
    );
    assert_eq!(geometry, Some(("16".into(), "27912".into())));
}
