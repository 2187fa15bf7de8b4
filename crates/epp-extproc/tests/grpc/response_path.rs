//! Response headers and bodies: usage, model restore, in-flight accounting.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use epp_core::{Candidate, CycleContext, Plugin, PluginRef, RequestOutcome, SaturationDetector};
use epp_extproc::ExtProcOptions;
use epp_test_support::plugins::{BestScoresPicker, short_queue_profile};

use super::harness::*;

/// Routes one streamed chat request in FULL_DUPLEX mode; returns the client.
async fn routed(fx: &Fixture, extra: &[(&'static str, String)], model: &str) -> Envoy {
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/chat/completions");
    h.extend(extra.iter().cloned());
    envoy
        .send(request_headers(&pairs(&h), false, FULL_DUPLEX, FULL_DUPLEX))
        .await;
    let body = serde_json::json!({
        "model": model, "stream": true,
        "messages": [{"role": "user", "content": "count"}],
    })
    .to_string();
    envoy.send(request_body(body.as_bytes(), true)).await;
    let r = envoy.recv().await;
    assert!(destination(&r).is_some(), "{r:?}");
    let (_, eos) = streamed(&envoy.recv().await);
    assert!(eos);
    envoy
}

#[tokio::test]
async fn streamed_usage_with_split_sse_lines_feeds_hooks() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = routed(&fx, &[], "m").await;
    assert_eq!(fx.inflight(), vec![1]);
    envoy
        .send(response_headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        ))
        .await;
    let r = envoy.recv().await;
    assert!(removed_headers(&r).is_empty());

    let sse = concat!(
        "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"1\"}}]}\n\n",
        "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\"total_tokens\":16}}\n\n",
        "data: [DONE]\n\n"
    )
    .as_bytes();
    // Cut inside the usage line, twice.
    let cuts = [70, 120, sse.len()];
    let mut from = 0;
    let mut echoed = Vec::new();
    for (i, &to) in cuts.iter().enumerate() {
        let last = i + 1 == cuts.len();
        envoy.send(response_body(&sse[from..to], last)).await;
        let (chunk, eos) = streamed(&envoy.recv().await);
        assert_eq!(eos, last);
        echoed.extend(chunk);
        from = to;
    }
    assert_eq!(echoed, sse, "passed through unchanged");
    fx.eventually("completed", |f| f.inflight() == vec![0])
        .await;
    let seen = fx.recorder.0.lock().unwrap();
    assert_eq!(seen.usage.len(), 1);
    let u = seen.usage[0];
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.total_tokens),
        (12, 4, 16)
    );
    assert_eq!(
        seen.outcomes,
        vec![RequestOutcome::Completed { status: 200 }]
    );
}

#[tokio::test]
async fn rewritten_model_is_restored_in_sse_and_plain_responses() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let rewrite = [("x-gateway-model-name-rewrite", "lora-1".to_owned())];

    // SSE.
    let mut envoy = routed(&fx, &rewrite, "base").await;
    envoy
        .send(response_headers(
            &[
                (":status", "200"),
                ("content-type", "text/event-stream"),
                ("content-length", "99"),
            ],
            false,
        ))
        .await;
    let r = envoy.recv().await;
    assert_eq!(removed_headers(&r), vec!["content-length".to_owned()]);
    let part1 = b"data: {\"id\":1,\"model\":\"lo";
    let part2 = b"ra-1\"}\n\ndata: [DONE]\n\n";
    envoy.send(response_body(part1, false)).await;
    let (c1, _) = streamed(&envoy.recv().await);
    envoy.send(response_body(part2, true)).await;
    let (c2, eos) = streamed(&envoy.recv().await);
    assert!(eos);
    let mut all = c1;
    all.extend(c2);
    assert_eq!(
        String::from_utf8(all).unwrap(),
        "data: {\"id\":1,\"model\":\"base\"}\n\ndata: [DONE]\n\n"
    );

    // Plain JSON, non-streamed request.
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/completions");
    h.extend(rewrite.iter().cloned());
    envoy
        .send(request_headers(&pairs(&h), false, FULL_DUPLEX, FULL_DUPLEX))
        .await;
    envoy
        .send(request_body(br#"{"model":"base","prompt":"x"}"#, true))
        .await;
    envoy.recv().await;
    let (forwarded, _) = streamed(&envoy.recv().await);
    assert_eq!(forwarded, br#"{"model":"lora-1","prompt":"x"}"#);
    envoy
        .send(response_headers(
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        ))
        .await;
    envoy.recv().await;
    envoy
        .send(response_body(
            br#"{"model":"lora-1","usage":{"prompt_tokens":1,"#,
            false,
        ))
        .await;
    let (held, _) = streamed(&envoy.recv().await);
    assert!(held.is_empty(), "held until the end to rewrite");
    envoy
        .send(response_body(br#""completion_tokens":2}}"#, true))
        .await;
    let (body, eos) = streamed(&envoy.recv().await);
    assert!(eos);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"{"model":"base","usage":{"prompt_tokens":1,"completion_tokens":2}}"#
    );
    fx.eventually("both completed", |f| f.inflight() == vec![0])
        .await;
    let seen = fx.recorder.0.lock().unwrap();
    assert_eq!(seen.requests[0].target_model, "lora-1");
    assert_eq!(seen.requests[0].model, "base");
}

#[tokio::test]
async fn stream_reset_mid_request_releases_inflight_once() {
    let fx = start(&[0, 0], ExtProcOptions::default()).await;
    let envoy = routed(&fx, &[], "m").await;
    assert_eq!(fx.inflight().iter().sum::<u32>(), 1);
    drop(envoy); // the gateway resets the stream
    fx.eventually("released after reset", |f| f.inflight() == vec![0, 0])
        .await;
    fx.eventually("aborted reported", |f| {
        f.recorder.0.lock().unwrap().outcomes == vec![RequestOutcome::Aborted]
    })
    .await;

    // Reset during the response body: still exactly one release.
    let mut envoy = routed(&fx, &[], "m").await;
    envoy
        .send(response_headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        ))
        .await;
    envoy.recv().await;
    envoy.send(response_body(b"data: {}\n", false)).await;
    envoy.recv().await;
    drop(envoy);
    fx.eventually("released again", |f| f.inflight() == vec![0, 0])
        .await;
    fx.eventually("two outcomes", |f| {
        f.recorder.0.lock().unwrap().outcomes.len() == 2
    })
    .await;
    assert_eq!(
        fx.recorder.0.lock().unwrap().outcomes,
        vec![RequestOutcome::Aborted, RequestOutcome::Aborted]
    );
}

#[tokio::test]
async fn scheduler_can_be_swapped_at_runtime() {
    let fx = start(&[0, 5], ExtProcOptions::default()).await;
    // New scheduler reading a new endpoint set: the busy/idle roles swap.
    for (ep, q) in fx.endpoints.iter().zip([7, 0]) {
        ep.set_metrics(epp_core::EndpointMetrics {
            waiting: q,
            ..epp_core::EndpointMetrics::fresh()
        });
    }
    let recorder = std::sync::Arc::new(Recorder::default());
    fx.service
        .set_scheduler(std::sync::Arc::new(scheduler(&recorder)));
    let mut envoy = fx.envoy().await;
    envoy
        .send(request_headers(
            &[(":method", "GET"), (":path", "/x")],
            true,
            BUFFERED,
            NONE,
        ))
        .await;
    assert_eq!(
        destination(&envoy.recv().await).as_deref(),
        Some("10.0.0.2:8000")
    );
    let _ = &fx.source;
}

#[tokio::test]
async fn metrics_carry_the_reference_names() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut registry = prometheus_client::registry::Registry::default();
    fx.service.register_metrics(&mut registry);

    let mut envoy = routed(&fx, &[], "m").await;
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    envoy
        .send(response_body(
            br#"data: {"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
            true,
        ))
        .await;
    envoy.recv().await;
    let mut bad = fx.envoy().await;
    bad.send_post_headers("/v1/completions", FULL_DUPLEX, NONE)
        .await;
    bad.send(request_body(b"{}", true)).await;
    bad.recv().await;
    fx.eventually("completed", |f| f.inflight() == vec![0])
        .await;

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for want in [
        // The current reference counts requests per priority too; the first
        // releases' name per model and target only.
        r#"inference_objective_request_total{model_name="m",target_model_name="m",priority="0"} 1"#,
        r#"inference_model_request_total{model_name="m",target_model_name="m"} 1"#,
        r#"inference_objective_request_error_total{model_name="",target_model_name="",error_code="BadRequest"} 1"#,
        r#"inference_objective_running_requests{model_name="m"} 0"#,
        r#"inference_objective_input_tokens_sum{model_name="m",target_model_name="m"} 3.0"#,
        r#"inference_objective_output_tokens_count{model_name="m",target_model_name="m"} 1"#,
        "inference_objective_request_duration_seconds_count",
        "inference_objective_normalized_time_per_output_token_seconds_count",
        "inference_objective_request_sizes_count",
        "inference_objective_response_sizes_count",
        "inference_extension_scheduler_e2e_duration_seconds_count 1",
    ] {
        assert!(text.contains(want), "missing {want}\n{text}");
    }
}

/// The sum of the samples of `name` (any labels) on the page.
fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn streams_and_the_time_spent_on_requests_carry_llm_d_names() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut registry = prometheus_client::registry::Registry::default();
    fx.service.register_metrics(&mut registry);
    let page = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };

    // Routed, answered, and closed by the gateway.
    let mut envoy = routed(&fx, &[], "m").await;
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    envoy.send(response_body(b"data: [DONE]\n\n", true)).await;
    envoy.recv().await;
    envoy.close();
    envoy.expect_end().await;
    // Refused (no model): epp answers and ends the stream.
    let mut bad = fx.envoy().await;
    bad.send_post("/v1/completions", b"{}", FULL_DUPLEX, NONE)
        .await;
    bad.recv().await;
    bad.expect_end().await;
    epp_test_support::wait::eventually("both streams ended", || {
        std::future::ready(sum(&page(), "llm_d_epp_extproc_streams_total") == 2.0)
    })
    .await;
    let text = page();
    for (name, want) in [
        ("llm_d_epp_extproc_streams_inflight", 0.0),
        ("llm_d_epp_extproc_stream_duration_seconds_count", 2.0),
        // Both decisions were answered; only the routed one had a response.
        ("llm_d_epp_request_processing_duration_seconds_count", 2.0),
        ("llm_d_epp_response_processing_duration_seconds_count", 1.0),
    ] {
        assert_eq!(sum(&text, name), want, "{name} in\n{text}");
    }
    assert!(
        text.contains("llm_d_epp_extproc_streams_total{code=\"OK\"} 2"),
        "{text}"
    );

    // A stream the gateway drops before the request was decided: open
    // until then, never processed.
    let open = fx.envoy().await;
    open.send_post_headers("/v1/completions", FULL_DUPLEX, NONE)
        .await;
    epp_test_support::wait::eventually("the stream is open", || {
        std::future::ready(sum(&page(), "llm_d_epp_extproc_streams_inflight") == 1.0)
    })
    .await;
    drop(open);
    epp_test_support::wait::eventually("the dropped stream ended", || {
        std::future::ready(sum(&page(), "llm_d_epp_extproc_streams_total") == 3.0)
    })
    .await;
    let text = page();
    assert_eq!(sum(&text, "llm_d_epp_extproc_streams_inflight"), 0.0);
    assert_eq!(
        sum(&text, "llm_d_epp_request_processing_duration_seconds_count"),
        2.0,
        "{text}"
    );
}

#[tokio::test]
async fn buffered_response_rewrite_sets_content_length() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/completions");
    h.push(("x-gateway-model-name-rewrite", "lora-xyz".to_owned()));
    envoy
        .send(request_headers(&pairs(&h), false, BUFFERED, BUFFERED))
        .await;
    envoy.recv().await;
    envoy
        .send(request_body(br#"{"model":"m","prompt":"x"}"#, true))
        .await;
    envoy.recv().await;
    envoy
        .send(response_headers(
            &[(":status", "200"), ("content-length", "30")],
            false,
        ))
        .await;
    let r = envoy.recv().await;
    assert!(
        removed_headers(&r).is_empty(),
        "BUFFERED: set with the body"
    );
    envoy
        .send(response_body(br#"{"model":"lora-xyz","usage":{}}"#, true))
        .await;
    let r = envoy.recv().await;
    let body = replaced_body(&r).expect("rewritten body");
    assert_eq!(body, br#"{"model":"m","usage":{}}"#);
    assert!(set_headers(&r).contains(&("content-length".to_owned(), body.len().to_string())));
}

/// The gateway fell back to another endpoint (it reports the one that served
/// in `envoy.lb` metadata, or Envoy's `upstream.address` attribute): the
/// in-flight count moves there and is released there.
#[tokio::test]
async fn a_fallback_reported_by_the_gateway_moves_the_accounting() {
    for metadata in [true, false] {
        let fx = start(&[0, 5], ExtProcOptions::default()).await;
        let mut envoy = routed(&fx, &[], "m").await;
        assert_eq!(fx.inflight(), vec![1, 0], "the short queue is picked");
        let fallback = fx.endpoints[1].addr().to_string();
        envoy
            .send(served(
                response_headers(&[(":status", "200")], false),
                &fallback,
                metadata,
            ))
            .await;
        envoy.recv().await;
        assert_eq!(fx.inflight(), vec![0, 1], "metadata: {metadata}");
        envoy.send(response_body(b"{}", true)).await;
        envoy.recv().await;
        fx.eventually("released on the fallback", |f| f.inflight() == vec![0, 0])
            .await;
    }
}

/// A served endpoint equal to the pick, outside the pool, or not an address
/// leaves the accounting where it is.
#[tokio::test]
async fn a_served_endpoint_that_is_the_pick_or_unknown_changes_nothing() {
    for reported in ["", "10.9.9.9:8000", "not an address"] {
        let fx = start(&[0, 5], ExtProcOptions::default()).await;
        let mut envoy = routed(&fx, &[], "m").await;
        let reported = if reported.is_empty() {
            fx.endpoints[0].addr().to_string()
        } else {
            reported.to_owned()
        };
        envoy
            .send(served(
                response_headers(&[(":status", "200")], false),
                &reported,
                true,
            ))
            .await;
        envoy.recv().await;
        assert_eq!(fx.inflight(), vec![1, 0], "{reported}");
    }
}

/// A pool saturation the test sets.
#[derive(Debug, Default)]
struct Saturation(AtomicU64);

impl Saturation {
    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

impl Plugin for Saturation {
    fn type_name(&self) -> &str {
        "set-saturation"
    }
    fn name(&self) -> &str {
        "set-saturation"
    }
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        Some(self)
    }
}

impl SaturationDetector for Saturation {
    fn saturation(&self, _: &CycleContext<'_>, _: &[Candidate]) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    fn has_capacity(&self, _: &CycleContext<'_>, _: &Candidate) -> bool {
        true
    }
}

/// Ends a routed request's response (200, one body message).
async fn respond(envoy: &mut Envoy) {
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    envoy.send(response_body(b"{}", true)).await;
    let (_, eos) = streamed(&envoy.recv().await);
    assert!(eos);
}

/// No reply within 300 ms: the request still waits in flow control.
async fn waits(envoy: &mut Envoy) -> bool {
    tokio::time::timeout(Duration::from_millis(300), envoy.recv())
        .await
        .is_err()
}

/// A request released from flow control counts among its flow's requests
/// in flight until its response ends, not only until it is routed: past the
/// band's `busiestFlowCeiling`, the busier flow's next request waits until
/// its earlier responses end.
#[tokio::test]
async fn a_released_request_counts_in_its_flow_until_its_response_ends() {
    let fx = start(&[0, 0], ExtProcOptions::default()).await;
    let saturation = Arc::new(Saturation::default());
    let scheduler =
        epp_test_support::plugins::scheduler(short_queue_profile(BestScoresPicker::new(2)))
            .with_saturation_detector(PluginRef::new(saturation.clone()))
            .unwrap();
    fx.service.set_scheduler(Arc::new(scheduler));
    let (fc, _) = epp_test_support::flow::controller(
        &epp_plugins::builtin_registry(),
        "round-robin-fairness-policy",
        "fcfs-ordering-policy",
    );
    let mut settings = fc.settings().clone();
    settings.default_band.busiest_flow_ceiling = Some(0.5);
    fx.service.set_flow_control(Some(settings));
    saturation.set(0.6);
    let tenant = |id: &str| [("x-gateway-inference-fairness-id", id.to_owned())];

    // Heavy alone: nobody to hold back for. Then light's goes too.
    let mut heavy = [
        routed(&fx, &tenant("heavy"), "m").await,
        routed(&fx, &tenant("heavy"), "m").await,
    ];
    let _light = routed(&fx, &tenant("light"), "m").await;
    // Heavy has 2 in flight, light 1: heavy's third waits.
    let mut third = fx.envoy().await;
    let mut h = post("/v1/chat/completions");
    h.extend(tenant("heavy"));
    third
        .send(request_headers(&pairs(&h), false, FULL_DUPLEX, FULL_DUPLEX))
        .await;
    third
        .send(request_body(&chat_body("m", "again"), true))
        .await;
    assert!(waits(&mut third).await, "heavy is the busiest flow");
    // One of heavy's responses ends: 1 each, both the busiest: still waits.
    respond(&mut heavy[0]).await;
    assert!(waits(&mut third).await, "heavy and light both have 1");
    // The other ends: heavy has fewer in flight than light now.
    respond(&mut heavy[1]).await;
    let r = third.recv().await;
    assert!(destination(&r).is_some(), "released: {r:?}");
    assert_eq!(fx.service.flow_queued(), 0);
}
