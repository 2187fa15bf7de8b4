//! Request headers and bodies: routing replies, errors, subset hints.

use std::{collections::HashMap, sync::Arc};

use epp_extproc::ExtProcOptions;

use super::harness::*;

#[tokio::test]
async fn buffered_body_gets_destination_metadata_and_header_cleanup() {
    let fx = start(&[5, 0, 3], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/chat/completions");
    h.push(("x-gateway-inference-fairness-id", "tenant-a".to_owned()));
    h.push(("x-gateway-inference-objective", "batch".to_owned()));
    envoy
        .send(request_headers(&pairs(&h), false, BUFFERED, NONE))
        .await;
    let r = envoy.recv().await;
    assert!(is_request_headers(&r), "{r:?}");
    assert!(destination(&r).is_none(), "BUFFERED: decided on the body");

    let body = chat_body("llama", "hello there");
    envoy.send(request_body(&body, true)).await;
    let r = envoy.recv().await;
    assert!(is_request_body(&r), "{r:?}");
    assert!(common(&r).clear_route_cache);
    assert_eq!(destination(&r).as_deref(), Some("10.0.0.2:8000"));
    assert_eq!(
        lb_metadata(&r).as_deref(),
        Some("10.0.0.2:8000,10.0.0.3:8000")
    );
    assert!(replaced_body(&r).is_none(), "body forwarded untouched");
    let set = set_headers(&r);
    assert!(set.iter().all(|(k, _)| !k.starts_with(':')), "{set:?}");
    let id = set
        .iter()
        .find(|(k, _)| k == "x-request-id")
        .expect("a generated id");
    assert_eq!(id.1.len(), 36);
    let removed = removed_headers(&r);
    assert!(removed.contains(&"x-gateway-inference-fairness-id".to_owned()));
    assert!(removed.contains(&"x-gateway-inference-objective".to_owned()));
    assert_eq!(fx.inflight(), vec![0, 1, 0]);

    // Response headers end the exchange (response body mode NONE).
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    envoy.close();
    envoy.expect_end().await;
    fx.eventually("in-flight released", |f| f.inflight() == vec![0, 0, 0])
        .await;
    let seen = fx.recorder.0.lock().unwrap();
    assert_eq!(seen.statuses, vec![200]);
    assert_eq!(seen.requests[0].fairness_id, "tenant-a");
    assert_eq!(seen.requests[0].prompt, "user:\nhello there\n");
    assert_eq!(
        seen.outcomes,
        vec![epp_core::RequestOutcome::Completed { status: 200 }]
    );
}

#[tokio::test]
async fn full_duplex_body_is_collected_then_streamed_back_in_chunks() {
    let fx = start(&[0, 4], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/completions");
    h.push(("x-request-id", "req-1".to_owned()));
    envoy
        .send(request_headers(&pairs(&h), false, FULL_DUPLEX, FULL_DUPLEX))
        .await;
    let prompt = "x".repeat(150_000);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":3}}"#).into_bytes();
    let (a, rest) = body.split_at(40_000);
    let (b, c) = rest.split_at(70_000);
    envoy.send(request_body(b"", false)).await;
    envoy.send(request_body(a, false)).await;
    envoy.send(request_body(b, false)).await;
    envoy.send(request_body(c, true)).await;

    let r = envoy.recv().await;
    assert!(is_request_headers(&r), "headers reply first: {r:?}");
    assert_eq!(destination(&r).as_deref(), Some("10.0.0.1:8000"));
    assert!(common(&r).clear_route_cache);
    assert!(!set_headers(&r).iter().any(|(k, _)| k == "x-request-id"));
    let (sizes, echoed) = envoy.recv_streamed_body().await;
    assert_eq!(echoed, body, "byte-for-byte");
    // Back in the messages it came in (the empty one dropped), only the one
    // above 62,000 bytes cut in two.
    assert_eq!(sizes, [40_000, 62_000, 8_000, c.len()]);
    assert_eq!(fx.inflight(), vec![1, 0]);
}

#[tokio::test]
async fn full_duplex_rewrite_splices_a_body_that_came_in_several_messages() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/completions");
    h.push(("x-gateway-model-name-rewrite", "llama-lora".to_owned()));
    envoy
        .send(request_headers(&pairs(&h), false, FULL_DUPLEX, NONE))
        .await;
    let prompt = "z".repeat(100_000);
    let body = format!(r#"{{"model":"llama","prompt":"{prompt}"}}"#);
    let (a, b) = body.as_bytes().split_at(12);
    envoy.send(request_body(a, false)).await;
    envoy.send(request_body(b, true)).await;
    let r = envoy.recv().await;
    assert!(is_request_headers(&r), "headers reply first: {r:?}");
    let want = format!(r#"{{"model":"llama-lora","prompt":"{prompt}"}}"#);
    assert!(
        set_headers(&r).contains(&("content-length".to_owned(), want.len().to_string())),
        "{:?}",
        set_headers(&r)
    );
    let (_, echoed) = envoy.recv_streamed_body().await;
    assert!(echoed == want.as_bytes(), "only the model spliced");
}

#[tokio::test]
async fn full_duplex_with_trailers_decides_on_trailers() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", FULL_DUPLEX, NONE)
        .await;
    envoy
        .send(request_body(br#"{"model":"m","prompt":"p"}"#, false))
        .await;
    envoy.send(request_trailers()).await;
    let r = envoy.recv().await;
    assert_eq!(destination(&r).as_deref(), Some("10.0.0.1:8000"));
    let (chunk, eos) = streamed(&envoy.recv().await);
    assert_eq!(chunk, br#"{"model":"m","prompt":"p"}"#);
    assert!(!eos, "trailers end the stream, not the body");
    let t = envoy.recv().await;
    assert!(matches!(
        t.response,
        Some(envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response::RequestTrailers(_))
    ));
}

#[tokio::test]
async fn get_is_routed_on_headers() {
    let fx = start(&[2, 1], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send(request_headers(
            &[(":method", "GET"), (":path", "/v1/models")],
            true,
            FULL_DUPLEX,
            FULL_DUPLEX,
        ))
        .await;
    let r = envoy.recv().await;
    assert!(is_request_headers(&r));
    assert_eq!(destination(&r).as_deref(), Some("10.0.0.2:8000"));
    assert!(lb_metadata(&r).is_some());
}

#[tokio::test]
async fn malformed_and_model_less_bodies_get_400() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    for (body, message) in [
        (&b"{not json"[..], None),
        (
            br#"{"prompt":"hi"}"#,
            Some("model not found in request body"),
        ),
    ] {
        for mode in [BUFFERED, FULL_DUPLEX] {
            let mut envoy = fx.envoy().await;
            envoy.send_post_headers("/v1/completions", mode, NONE).await;
            if mode == BUFFERED {
                envoy.recv().await;
            }
            envoy.send(request_body(body, true)).await;
            let (status, json) = immediate(&envoy.recv().await);
            assert_eq!(status, 400);
            assert_eq!(json["error"]["code"], 400);
            if let Some(m) = message {
                assert_eq!(json["error"]["message"], m);
            }
            envoy.expect_end().await;
        }
    }
    assert_eq!(fx.inflight(), vec![0]);
}

#[tokio::test]
async fn no_endpoints_and_empty_subsets_get_503() {
    let fx = start(&[], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/chat/completions", BUFFERED, NONE)
        .await;
    envoy.recv().await;
    envoy.send(request_body(&chat_body("m", "hi"), true)).await;
    let (status, json) = immediate(&envoy.recv().await);
    assert_eq!(status, 503);
    assert_eq!(json["error"]["type"], "ServiceUnavailable");

    let fx = start(&[0, 0], ExtProcOptions::default()).await;
    for subset in [&[][..], &["10.0.0.1:9999"], &["garbage"]] {
        let mut envoy = fx.envoy().await;
        let h = with_subset(
            request_headers(
                &pairs(&post("/v1/chat/completions")),
                false,
                FULL_DUPLEX,
                NONE,
            ),
            subset,
        );
        envoy.send(h).await;
        envoy.send(request_body(&chat_body("m", "hi"), true)).await;
        let (status, _) = immediate(&envoy.recv().await);
        assert_eq!(status, 503, "subset {subset:?}");
    }
}

#[tokio::test]
async fn subset_hint_matches_ip_and_port() {
    let fx = start(&[9, 0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    let h = with_subset(
        request_headers(
            &pairs(&post("/v1/chat/completions")),
            false,
            FULL_DUPLEX,
            NONE,
        ),
        &["10.0.0.2:1234", "10.0.0.1:8000"],
    );
    envoy.send(h).await;
    envoy.send(request_body(&chat_body("m", "hi"), true)).await;
    let r = envoy.recv().await;
    assert_eq!(
        destination(&r).as_deref(),
        Some("10.0.0.1:8000"),
        "the busy one, as hinted"
    );
    assert_eq!(lb_metadata(&r).as_deref(), Some("10.0.0.1:8000"));
}

#[tokio::test]
async fn oversized_body_gets_413() {
    let options = ExtProcOptions {
        max_body_bytes: 1000,
        ..ExtProcOptions::default()
    };
    let fx = start(&[0], options).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", FULL_DUPLEX, NONE)
        .await;
    envoy.send(request_body(&[b' '; 600], false)).await;
    envoy.send(request_body(&[b' '; 600], false)).await;
    let (status, json) = immediate(&envoy.recv().await);
    assert_eq!(status, 413);
    assert_eq!(json["error"]["code"], 413);
    envoy.expect_end().await;
}

#[tokio::test]
async fn sheddable_objective_gets_429_under_saturation() {
    let options = ExtProcOptions {
        objectives: HashMap::from([("batch".to_owned(), -1), ("chat".to_owned(), 5)]),
        ..ExtProcOptions::default()
    };
    let fx = start(&[3, 4], options).await;
    for (objective, want) in [("batch", Some(429)), ("chat", None), ("unknown", None)] {
        let mut envoy = fx.envoy().await;
        let mut h = post("/v1/chat/completions");
        h.push(("x-gateway-inference-objective", objective.to_owned()));
        envoy
            .send(request_headers(&pairs(&h), false, FULL_DUPLEX, NONE))
            .await;
        envoy.send(request_body(&chat_body("m", "hi"), true)).await;
        let r = envoy.recv().await;
        match want {
            Some(code) => {
                let (status, json) = immediate(&r);
                assert_eq!(status, code);
                assert_eq!(json["error"]["type"], "ResourceExhausted");
            }
            None => assert_eq!(destination(&r).as_deref(), Some("10.0.0.1:8000")),
        }
    }
    let seen = fx.recorder.0.lock().unwrap();
    assert!(seen.requests.is_empty());
}

#[tokio::test]
async fn model_rewrite_splices_only_the_model() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    let mut h = post("/v1/completions");
    h.push(("content-length", "70".to_owned()));
    h.push(("x-gateway-model-name-rewrite", "llama-lora".to_owned()));
    envoy
        .send(request_headers(&pairs(&h), false, BUFFERED, NONE))
        .await;
    envoy.recv().await;
    let body = br#"{ "prompt" : "p", "model":"llama", "seed": 18446744073709551615 }"#;
    envoy.send(request_body(body, true)).await;
    let r = envoy.recv().await;
    let new = replaced_body(&r).expect("spliced body");
    let want = br#"{ "prompt" : "p", "model":"llama-lora", "seed": 18446744073709551615 }"#;
    assert_eq!(String::from_utf8_lossy(&new), String::from_utf8_lossy(want));
    let set = set_headers(&r);
    assert!(set.contains(&("content-length".to_owned(), want.len().to_string())));
    assert!(removed_headers(&r).contains(&"x-gateway-model-name-rewrite".to_owned()));
}

#[tokio::test]
async fn out_of_order_messages_do_not_break_the_stream() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    // Response headers before anything: answered, nothing routed.
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    // A body before headers (assumed full duplex): routed on end of stream.
    envoy.send(request_body(&chat_body("m", "x"), true)).await;
    let r = envoy.recv().await;
    assert!(is_request_headers(&r));
    let _ = envoy.recv().await;
    // A second body after the decision is passed through.
    envoy.send(request_body(b"tail", true)).await;
    let (chunk, eos) = streamed(&envoy.recv().await);
    assert_eq!((chunk.as_slice(), eos), (&b"tail"[..], true));
    envoy.close();
    envoy.expect_end().await;
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
}

/// A renderer that answers `ids` (or fails) after a short wait, counting
/// its calls.
#[derive(Debug)]
struct TestRenderer {
    ids: Result<Vec<u32>, String>,
    calls: std::sync::atomic::AtomicUsize,
}

impl epp_core::PromptRenderer for TestRenderer {
    fn render(
        &self,
        api: epp_core::ApiKind,
        _body: &[u8],
        _media_parts: u32,
    ) -> Option<epp_core::RenderFuture> {
        if api != epp_core::ApiKind::ChatCompletions {
            return None;
        }
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ids = self.ids.clone();
        Some(Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            ids.map(|token_ids| epp_core::RenderedPrompt {
                token_ids,
                media: vec![epp_core::MediaItem {
                    modality: "image".into(),
                    hash: "h1".into(),
                    placeholder: None,
                }],
            })
        }))
    }
}

/// Routes one chat request through `fx`, completes it, and returns the
/// request the hooks saw.
async fn route_chat(fx: &Fixture) -> epp_core::InferenceRequest {
    let mut envoy = fx.envoy().await;
    envoy
        .send(request_headers(
            &pairs(&post("/v1/chat/completions")),
            false,
            BUFFERED,
            NONE,
        ))
        .await;
    envoy.recv().await;
    envoy.send(request_body(&chat_body("m", "hi"), true)).await;
    let r = envoy.recv().await;
    assert!(destination(&r).is_some(), "routed: {r:?}");
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    envoy.close();
    envoy.expect_end().await;
    fx.eventually("completed", |f| f.inflight().iter().all(|&n| n == 0))
        .await;
    fx.recorder
        .seen(|seen| seen.requests.last().cloned())
        .expect("a completed request")
}

/// The render stage: the request waits for its token ids, is routed with
/// them, and with flow control on goes on into the queue's admission; a
/// failed render routes it without ids.
#[tokio::test]
async fn rendered_ids_reach_the_scheduler_with_and_without_flow_control() {
    let renderer = Arc::new(TestRenderer {
        ids: Ok(vec![1, 2, 3]),
        calls: Default::default(),
    });
    let options = ExtProcOptions {
        renderer: Some(renderer.clone()),
        ..ExtProcOptions::default()
    };
    let fx = start(&[0, 0], options).await;
    let seen = route_chat(&fx).await;
    assert_eq!(seen.prompt_token_ids, Some(vec![1, 2, 3]));
    assert_eq!(seen.media_items.len(), 1, "the rendered media items too");

    fx.flow_control_on();
    let seen = route_chat(&fx).await;
    assert_eq!(seen.prompt_token_ids, Some(vec![1, 2, 3]));
    assert_eq!(renderer.calls.load(std::sync::atomic::Ordering::Relaxed), 2);

    let failing = ExtProcOptions {
        renderer: Some(Arc::new(TestRenderer {
            ids: Err("render service down".into()),
            calls: Default::default(),
        })),
        ..ExtProcOptions::default()
    };
    let fx = start(&[0, 0], failing).await;
    let seen = route_chat(&fx).await;
    assert_eq!(seen.prompt_token_ids, None, "routed without ids");
}
