//! Real-shaped pages from each engine parse cleanly in every view, and
//! selective extraction reads the values the data layer needs.

use std::borrow::Cow;

use epp_promtext::{
    ErrorKind, Line, MetricType, Mode, Selector, SelectorSet, families, lines, samples,
};

mod common;

use common::fixture;

const ALL: [&str; 9] = [
    "vllm.txt",
    "vllm-multiprocess.txt",
    "vllm-data-parallel.txt",
    "sglang.txt",
    "trtllm-serve.txt",
    "triton-trtllm.txt",
    "triton-trtllm-statistics.txt",
    "vllm-1mb.txt",
    "openmetrics.txt",
];

#[test]
fn every_fixture_parses_strictly_in_every_view() {
    for name in ALL {
        let page = fixture(name);
        let mut n = 0;
        for line in lines(&page).strict() {
            match line.unwrap_or_else(|e| panic!("{name}: {e}")) {
                Line::Sample(s) => {
                    for (k, _) in s.labels() {
                        assert!(!k.is_empty(), "{name} line {}", s.line);
                    }
                    n += 1;
                }
                Line::Type { kind, .. } => assert_ne!(kind, MetricType::Unknown, "{name}"),
                _ => {}
            }
        }
        assert!(n > 15, "{name}: only {n} samples");
        // CRLF line ends give the same samples.
        let crlf = page.replace('\n', "\r\n");
        assert_eq!(samples(&crlf).strict().filter(Result::is_ok).count(), n);
        // Every histogram is whole: buckets ascend to +Inf == _count.
        for f in families(&page).unwrap_or_else(|e| panic!("{name}: {e}")) {
            if f.kind != MetricType::Histogram {
                continue;
            }
            for m in &f.metrics {
                let last = m
                    .buckets
                    .last()
                    .unwrap_or_else(|| panic!("{name} {}", f.name));
                assert_eq!(last.0, f64::INFINITY, "{name} {}", f.name);
                assert_eq!(Some(last.1), m.count, "{name} {}", f.name);
                assert!(m.buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{name}");
                assert!(m.sum.is_some(), "{name} {}", f.name);
            }
        }
    }
}

fn sum(page: &str, spec: &str) -> (f64, usize) {
    let set = SelectorSet::new(vec![Selector::parse(spec).expect("valid spec")]);
    let (mut total, mut n) = (0.0, 0);
    let report = set
        .scan_strict(page, |_, s| {
            total += s.value;
            n += 1;
        })
        .expect("clean page");
    assert_eq!(report.errors, 0);
    (total, n)
}

#[test]
fn core_metrics_of_each_engine() {
    let vllm = fixture("vllm.txt");
    assert_eq!(sum(&vllm, "vllm:num_requests_waiting"), (3.0, 1));
    assert_eq!(sum(&vllm, "vllm:num_requests_running"), (12.0, 1));
    assert_eq!(sum(&vllm, "vllm:kv_cache_usage_perc").0, 0.4215);
    assert_eq!(sum(&vllm, "vllm:prompt_tokens_created").1, 1);

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
    assert_eq!(sum(&dp, "vllm:kv_cache_usage_perc").1, 2);

    let mp = fixture("vllm-multiprocess.txt");
    assert_eq!(sum(&mp, "vllm:prompt_tokens_created").1, 0, "no _created");
    assert_eq!(sum(&mp, "vllm:num_requests_running").0, 12.0);

    let sglang = fixture("sglang.txt");
    assert_eq!(sum(&sglang, "sglang:num_queue_reqs").0, 2.0);
    assert_eq!(sum(&sglang, "sglang:num_running_reqs").0, 7.0);
    assert_eq!(sum(&sglang, "sglang:token_usage").0, 0.28);

    let trt = fixture("trtllm-serve.txt");
    assert!(!trt.ends_with('\n'), "this page has no final newline");
    assert_eq!(sum(&trt, "trtllm_kv_cache_max_blocks").0, 8192.0);
    assert_eq!(sum(&trt, "trtllm_num_requests_waiting").0, 1.0);

    let triton = fixture("triton-trtllm.txt");
    let spec = |k: &str, v: &str| format!("nv_trt_llm_{k}{{{v}}}");
    let waiting = spec("request_metrics", "request_type=\"waiting\"");
    assert_eq!(sum(&triton, &waiting), (4.0, 1));
    let fraction = spec("kv_cache_block_metrics", "kv_cache_block_type=fraction");
    assert_eq!(sum(&triton, &fraction), (0.75, 1));
    let old = fixture("triton-trtllm-statistics.txt");
    let scheduled = spec("request_statistics", "request_type=scheduled");
    assert_eq!(sum(&old, &scheduled), (9.0, 1));
    assert_eq!(
        sum(&old, &waiting).1,
        0,
        "older Triton names end in _statistics"
    );
}

#[test]
fn labels_of_info_series() {
    let page = fixture("vllm.txt");
    let set = SelectorSet::from_specs(&["vllm:lora_requests_info", "vllm:cache_config_info"])
        .expect("valid specs");
    let mut newest = (0.0, String::new(), 0);
    let mut geometry = None;
    set.scan(&page, |i, s| {
        if i == 0 && s.value > newest.0 {
            let running = s.label("running_lora_adapters").expect("label");
            assert!(matches!(running, Cow::Borrowed(_)), "no escapes, no copy");
            let max = s
                .label("max_lora")
                .and_then(|v| v.parse().ok())
                .expect("max_lora");
            newest = (s.value, running.into_owned(), max);
        } else if i == 1 {
            geometry = Some((
                s.label("block_size").expect("label").into_owned(),
                s.label("num_gpu_blocks").expect("label").into_owned(),
            ));
        }
    });
    assert_eq!(
        (newest.1.as_str(), newest.2),
        ("sql-lora, chat-lora", 4),
        "the newest series is listed first"
    );
    assert_eq!(geometry, Some(("16".into(), "27912".into())));
}

#[test]
fn openmetrics_page() {
    let page = fixture("openmetrics.txt");
    let all: Vec<_> = lines(&page)
        .strict()
        .collect::<Result<_, _>>()
        .expect("clean");
    assert_eq!(all.last(), Some(&Line::Eof));
    assert!(all.contains(&Line::Unit {
        name: "vllm:e2e_request_latency_seconds",
        unit: "seconds"
    }));
    let exemplars: Vec<_> = samples(&page)
        .filter_map(|s| s.ok()?.exemplar)
        .map(|e| (e.value, e.timestamp, e.labels().next().map(|(k, _)| k)))
        .collect();
    assert_eq!(
        exemplars,
        [
            (0.812, Some(1.7624001e9), Some("trace_id")),
            (7.25, None, Some("trace_id"))
        ]
    );
    let fams = families(&page).expect("clean");
    let by_name = |n: &str| fams.iter().find(|f| f.name == n).expect(n);
    let counter = by_name("vllm:prompt_tokens");
    assert_eq!(counter.kind, MetricType::Counter);
    assert_eq!(counter.metrics[0].value, Some(8.812345e6));
    assert_eq!(counter.metrics[0].created, Some(1.7624e9));
    let hist = by_name("vllm:e2e_request_latency_seconds");
    assert_eq!((hist.unit, hist.metrics.len()), (Some("seconds"), 1));
    assert_eq!(hist.metrics[0].buckets.len(), 4);
    let summary = by_name("http_request_size_bytes");
    assert_eq!(
        summary.metrics[0].quantiles,
        [(0.5, 2048.0), (0.99, 16384.0)]
    );
    assert_eq!(
        by_name("vllm:cache_config").metrics[0].label("block_size"),
        Some("16")
    );
    assert_eq!(by_name("engine_state").metrics.len(), 2);
    let esc = by_name("help_with_escapes");
    assert_eq!(
        esc.help.as_deref(),
        Some("A \"quoted\" help with a \\ backslash and a \n newline.")
    );
    assert_eq!(esc.metrics[0].label("path"), Some("C:\\models\\llama"));
    assert_eq!(esc.metrics[0].label("note"), Some("say \"hi\"\nbye"));
    assert!(esc.metrics[1].value.is_some_and(f64::is_nan));
    // Anything after # EOF is an error, in both modes.
    let more = format!("{page}late 1\n");
    let last = lines(&more).last().expect("items");
    assert_eq!(
        last.map(|_| ()).unwrap_err().kind,
        ErrorKind::ContentAfterEof
    );
}

#[test]
fn selective_scan_agrees_with_the_full_parse() {
    for name in ALL {
        let page = fixture(name);
        // Every distinct sample name as a selector, plus one with a matcher.
        let mut names: Vec<&str> = samples(&page).map(|s| s.expect("clean").name).collect();
        names.sort_unstable();
        names.dedup();
        let set: SelectorSet = names.iter().map(|&n| Selector::name(n)).collect();
        let mut seen = Vec::new();
        set.scan(&page, |i, s| {
            seen.push((names[i], s.line, s.value.to_bits()))
        });
        let want: Vec<_> = samples(&page)
            .map(|s| s.expect("clean"))
            .map(|s| (s.name, s.line, s.value.to_bits()))
            .collect();
        assert_eq!(seen, want, "{name}");
    }
}

#[test]
fn corrupted_pages_strict_stops_lenient_skips() {
    let page = fixture("vllm.txt");
    let target = "vllm:num_requests_running{";
    let at = page.find(target).expect("present") + target.len();
    let broken = format!("{}engine=0,{}", &page[..at], &page[at..]);
    let bad_line = u32::try_from(broken[..at].lines().count()).expect("small");

    let lenient: Vec<_> = samples(&broken).collect();
    let errors: Vec<_> = lenient.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].line, errors[0].kind),
        (bad_line, ErrorKind::ExpectedQuote)
    );
    assert!(errors[0].snippet().contains("engine=0"), "{}", errors[0]);
    assert_eq!(lenient.len(), samples(&page).count());

    let strict: Vec<_> = lines(&broken).mode(Mode::Strict).collect();
    assert!(strict.last().is_some_and(Result::is_err));

    let set = SelectorSet::from_specs(&["vllm:num_requests_running", "vllm:num_requests_waiting"])
        .expect("valid");
    let mut got = Vec::new();
    let report = set.scan(&broken, |i, s| got.push((i, s.value)));
    assert_eq!(
        got,
        [(1, 3.0)],
        "the broken series is skipped, the other read"
    );
    assert_eq!(report.first_error.map(|e| e.line), Some(bad_line));
    assert!(set.scan_strict(&broken, |_, _| {}).is_err());
}
