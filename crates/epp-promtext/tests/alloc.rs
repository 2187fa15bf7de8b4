//! The promise to the data layer, measured: scanning a page with a selector
//! set and iterating every sample and label allocate nothing (counted per
//! thread by a counting global allocator).

use epp_promtext::{Selector, SelectorSet, lines, samples};

mod common;

use common::fixture;

#[test]
fn hot_paths_allocate_nothing() {
    let pages: Vec<String> = ["vllm.txt", "vllm-data-parallel.txt", "triton-trtllm.txt"]
        .into_iter()
        .map(fixture)
        .collect();
    let set = SelectorSet::new(vec![
        Selector::name("vllm:num_requests_waiting"),
        Selector::name("vllm:num_requests_running"),
        Selector::name("vllm:kv_cache_usage_perc").with_label("engine", "0"),
        Selector::name("vllm:lora_requests_info"),
        Selector::name("vllm:cache_config_info"),
        Selector::parse("nv_trt_llm_request_metrics{request_type=\"waiting\"}").expect("spec"),
    ]);
    let (mut matched, mut label_bytes, mut n_lines) = (0, 0, 0);
    let info = allocation_counter::measure(|| {
        for page in &pages {
            let report = set.scan(page, |_, s| {
                matched += 1;
                label_bytes += s.label("running_lora_adapters").map_or(0, |v| v.len());
            });
            assert_eq!(report.errors, 0);
            for s in samples(page) {
                let s = s.expect("clean page");
                label_bytes += s.labels().map(|(k, v)| k.len() + v.len()).sum::<usize>();
            }
            n_lines += lines(page).count();
        }
    });
    assert!(matched > 10 && label_bytes > 10_000 && n_lines > 1_000);
    assert_eq!(info.count_total, 0, "{info:?}");
    // The counter does count: an escaped label value is unescaped into a String.
    let escaped = allocation_counter::measure(|| {
        let page = "m{a=\"x\\\"y\"} 1\n";
        let s = samples(page).next().expect("one").expect("clean");
        assert_eq!(s.label("a").as_deref(), Some("x\"y"));
    });
    assert_eq!(escaped.count_total, 1);
}
