use std::time::Duration;

use prometheus_client::encoding::text::encode;

use super::*;
use epp_core::{FOLDED_LABEL, MAX_LABEL_VALUES};

fn page(metrics: &Metrics, generations: MetricGenerations) -> String {
    let mut registry = Registry::default();
    metrics.register(&mut registry, generations);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text
}

fn usage(prompt: u64, completion: u64, cached: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cached_tokens: cached,
    }
}

/// One request through every observation, streamed or not.
fn serve(m: &Metrics, model: &str, fairness: &str, priority: i32, streamed: bool) {
    let s = m.series(model, model, fairness, priority);
    m.scheduled(&s, 100);
    let ttft = streamed.then(|| Duration::from_millis(30));
    if let Some(t) = ttft {
        s.first_token(t);
        s.inter_token(Duration::from_millis(10));
    }
    s.completed(
        Duration::from_millis(130),
        400,
        Some(usage(20, 11, 16)),
        ttft,
    );
}

#[test]
fn one_observation_is_served_under_every_generation_with_its_labels() {
    let m = Metrics::default();
    serve(&m, "llama", "tenant-a", 0, false);
    serve(&m, "llama", "tenant-b", 2, true);
    m.error("llama", "llama", "tenant-a", 0, "BadRequest");
    let text = page(&m, MetricGenerations::ALL);
    // Seed generation: summed over fairness id and priority.
    assert!(
        text.contains(
            "inference_model_request_total{model_name=\"llama\",target_model_name=\"llama\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains("inference_model_running_requests{model_name=\"llama\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("normalized_time_per_output_token_seconds_count{model_name=\"llama\",target_model_name=\"llama\"} 2"),
        "{text}"
    );
    // GIE: the request counter per priority.
    assert!(
        text.contains("inference_objective_request_total{model_name=\"llama\",target_model_name=\"llama\",priority=\"2\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("inference_objective_request_error_total{model_name=\"llama\",target_model_name=\"llama\",error_code=\"BadRequest\"} 1"),
        "{text}"
    );
    // llm-d: every label, TTFT split by streaming, the streaming-only series.
    assert!(
        text.contains("llm_d_epp_request_total{model_name=\"llama\",target_model_name=\"llama\",fairness_id=\"tenant-b\",priority=\"2\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("llm_d_epp_request_ttft_seconds_count{model_name=\"llama\",target_model_name=\"llama\",fairness_id=\"tenant-b\",priority=\"2\",streaming=\"true\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("llm_d_epp_request_ttft_seconds_count{model_name=\"llama\",target_model_name=\"llama\",fairness_id=\"tenant-a\",priority=\"0\",streaming=\"false\"} 1"),
        "{text}"
    );
    // (130 ms - 30 ms) / (11 - 1) tokens = 10 ms: the 0.01 bucket.
    assert!(
        text.contains("llm_d_epp_request_streaming_tpot_seconds_bucket{le=\"0.01\",model_name=\"llama\",target_model_name=\"llama\",fairness_id=\"tenant-b\",priority=\"2\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("llm_d_epp_request_cached_tokens_sum{model_name=\"llama\",target_model_name=\"llama\",fairness_id=\"tenant-a\",priority=\"0\"} 16"),
        "{text}"
    );
}

#[test]
fn a_generation_turned_off_leaves_only_its_names_out() {
    let m = Metrics::default();
    serve(&m, "llama", "t", 0, true);
    let only_llm_d: MetricGenerations = "llm-d".parse().unwrap();
    let text = page(&m, only_llm_d);
    assert!(text.contains("llm_d_epp_request_total{"), "{text}");
    assert!(!text.contains("inference_model_"), "{text}");
    assert!(!text.contains("inference_objective_"), "{text}");
    assert!(!text.contains("inference_extension_scheduler"), "{text}");
    let reference: MetricGenerations = "inference-model, inference-objective".parse().unwrap();
    let text = page(&m, reference);
    assert!(!text.contains("llm_d_epp_"), "{text}");
    assert!(text.contains("inference_model_request_total{"), "{text}");
    assert!(
        text.contains("inference_objective_request_total{"),
        "{text}"
    );
    // Same observations whichever names are served.
    let all = page(&m, MetricGenerations::ALL);
    let count = |t: &str, prefix: &str| {
        t.lines()
            .find(|l| l.starts_with(prefix))
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
    };
    assert_eq!(
        count(&all, "inference_model_request_duration_seconds_count"),
        count(&text, "inference_model_request_duration_seconds_count")
    );
}

#[test]
fn the_generations_flag_parses_names_and_refuses_others() {
    assert_eq!(
        "all".parse::<MetricGenerations>(),
        Ok(MetricGenerations::ALL)
    );
    let g: MetricGenerations = "llm-d,inference-objective".parse().unwrap();
    assert!(g.llm_d && g.inference_objective && !g.inference_model);
    assert_eq!(g.to_string(), "inference-objective,llm-d");
    let err = "llm-d,v2".parse::<MetricGenerations>().unwrap_err();
    assert!(err.contains("\"v2\""), "{err}");
    assert!("".parse::<MetricGenerations>().is_err());
}

#[test]
fn model_names_past_the_cap_fold_into_other() {
    let m = Metrics::default();
    for i in 0..MAX_LABEL_VALUES + 5 {
        serve(&m, &format!("model-{i}"), "t", 0, false);
    }
    // A name kept before the cap keeps its series.
    serve(&m, "model-0", "t", 0, false);
    m.error("model-999999", "model-999999", "t", 0, "BadRequest");
    let text = page(&m, MetricGenerations::ALL);
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("inference_model_request_total{"))
        .collect();
    assert_eq!(
        series.len(),
        MAX_LABEL_VALUES + 1,
        "kept names and one folded series"
    );
    assert!(text.contains(
        "inference_model_request_total{model_name=\"model-0\",target_model_name=\"model-0\"} 2"
    ));
    assert!(text.contains(&format!(
        "inference_model_request_total{{model_name=\"{FOLDED_LABEL}\",target_model_name=\"{FOLDED_LABEL}\"}} 5"
    )));
    assert!(text.contains(&format!(
        "inference_model_request_error_total{{model_name=\"{FOLDED_LABEL}\",target_model_name=\"{FOLDED_LABEL}\",error_code=\"BadRequest\"}} 1"
    )));
}

#[test]
fn fairness_ids_share_one_cap_with_flow_control() {
    let m = Metrics::default();
    let cap = m.fairness_ids();
    for i in 0..MAX_LABEL_VALUES {
        assert_eq!(cap.label(&format!("f-{i}")), format!("f-{i}"));
    }
    serve(&m, "llama", "late-tenant", 0, false);
    let text = page(&m, MetricGenerations::ALL);
    assert!(
        text.contains("llm_d_epp_request_total{model_name=\"llama\",target_model_name=\"llama\",fairness_id=\"other\",priority=\"0\"} 1"),
        "{text}"
    );
}

#[test]
fn attempts_rewrites_and_prefix_matches_are_counted() {
    let m = Metrics::default();
    let e = Endpoint::new(0, "10.0.0.1:8000".parse().unwrap());
    m.attempt("llama", Some(&e));
    m.attempt("llama", Some(&e));
    m.attempt("llama", None);
    m.rewritten("header", "chat", "chat-v2");
    m.prefix_match(0.5, 1000);
    let text = page(&m, MetricGenerations::ALL);
    assert!(
        text.contains("llm_d_epp_scheduler_attempts_total{status=\"success\",target_model_name=\"llama\",endpoint_name=\"10.0.0.1:8000\",namespace=\"\",port=\"8000\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("inference_extension_scheduler_attempts_total{status=\"failure\",target_model_name=\"llama\",pod_name=\"\",namespace=\"\",port=\"\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("llm_d_epp_model_rewrite_decisions_total{model_rewrite_name=\"header\",model_name=\"chat\",target_model=\"chat-v2\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("inference_extension_prefix_indexer_hit_bytes_sum 500"),
        "{text}"
    );
}

#[test]
fn streams_count_as_open_until_dropped_then_by_how_they_ended() {
    let m = Metrics::default();
    let plain = m.stream_opened(Instant::now());
    let mut reset = m.stream_opened(Instant::now());
    reset.end(StreamEnd::read_failed(tonic::Code::Cancelled));
    let mut broken = m.stream_opened(Instant::now());
    broken.end(StreamEnd::read_failed(tonic::Code::Internal));
    let mut done = m.stream_opened(Instant::now());
    done.end(StreamEnd::Ok);
    let text = page(&m, MetricGenerations::ALL);
    assert!(
        text.contains("llm_d_epp_extproc_streams_inflight 4"),
        "{text}"
    );
    assert!(!text.contains("llm_d_epp_extproc_streams_total{"), "{text}");
    drop((plain, reset, broken, done));
    // 3 ms and 300 µs: the 5 ms and 0.5 ms buckets.
    m.streams().request_processed(Duration::from_millis(3));
    m.streams().response_processed(Duration::from_micros(300));
    let text = page(&m, MetricGenerations::ALL);
    for want in [
        "llm_d_epp_extproc_streams_inflight 0",
        "llm_d_epp_extproc_stream_duration_seconds_count 4",
        // A gateway's reset ends a stream normally (as llm-d counts it);
        // one dropped before its end was cancelled.
        "llm_d_epp_extproc_streams_total{code=\"OK\"} 2",
        "llm_d_epp_extproc_streams_total{code=\"Canceled\"} 1",
        "llm_d_epp_extproc_streams_total{code=\"Unknown\"} 1",
        "llm_d_epp_request_processing_duration_seconds_bucket{le=\"0.002\"} 0",
        "llm_d_epp_request_processing_duration_seconds_bucket{le=\"0.005\"} 1",
        "llm_d_epp_response_processing_duration_seconds_bucket{le=\"0.00025\"} 0",
        "llm_d_epp_response_processing_duration_seconds_bucket{le=\"0.0005\"} 1",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
    let reference: MetricGenerations = "inference-model,inference-objective".parse().unwrap();
    let text = page(&m, reference);
    assert!(!text.contains("extproc"), "{text}");
    assert!(!text.contains("processing_duration"), "{text}");
}
