//! Protocol edges not covered elsewhere: a reset in the middle of a request
//! body, and one body chunk larger than gRPC's default 4 MiB message limit.

use epp_extproc::ExtProcOptions;

use super::harness::*;

#[tokio::test]
async fn reset_mid_request_body_holds_nothing_and_the_server_carries_on() {
    let fx = start(&[0, 0], ExtProcOptions::default()).await;
    let envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", FULL_DUPLEX, FULL_DUPLEX)
        .await;
    envoy
        .send(request_body(br#"{"model":"m","prompt":"half a bo"#, false))
        .await;
    drop(envoy); // the client went away before the body ended
    // Nothing was routed, so nothing is held and no outcome is reported.
    assert_eq!(fx.inflight(), vec![0, 0]);

    // The next stream is served normally, and releases what it takes.
    let mut envoy = fx.envoy().await;
    envoy
        .send_post(
            "/v1/completions",
            br#"{"model":"m","prompt":"whole"}"#,
            FULL_DUPLEX,
            FULL_DUPLEX,
        )
        .await;
    let r = envoy.recv().await;
    assert!(destination(&r).is_some(), "{r:?}");
    envoy.recv().await; // the body streamed back
    assert_eq!(fx.inflight().iter().sum::<u32>(), 1);
    drop(envoy);
    fx.eventually("released", |f| f.inflight() == vec![0, 0])
        .await;
    assert_eq!(
        fx.recorder.0.lock().unwrap().outcomes,
        vec![epp_core::RequestOutcome::Aborted],
        "only the routed request has an outcome"
    );
}

#[tokio::test]
async fn a_chunk_above_the_grpc_default_limit_is_accepted_and_rechunked() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", FULL_DUPLEX, FULL_DUPLEX)
        .await;
    let prompt = "y".repeat(5 << 20);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#).into_bytes();
    envoy.send(request_body(&body, true)).await;
    let r = envoy.recv().await;
    assert!(destination(&r).is_some(), "{r:?}");
    let (_, echoed) = envoy.recv_streamed_body().await;
    assert!(echoed == body, "byte-for-byte");

    // Above the configured body limit, a single chunk is a 413 (below the
    // lean server's 4 MiB message floor: above it, its stream would end with
    // RESOURCE_EXHAUSTED).
    let options = ExtProcOptions {
        max_body_bytes: 1 << 20,
        ..ExtProcOptions::default()
    };
    let prompt = "z".repeat(3 << 20);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#).into_bytes();
    fx.service.set_options(options);
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", BUFFERED, NONE)
        .await;
    envoy.recv().await; // headers answered in BUFFERED mode
    envoy.send(request_body(&body, true)).await;
    let (status, _) = immediate(&envoy.recv().await);
    assert_eq!(status, 413);
}

#[tokio::test]
async fn response_trailers_pass_and_complete_the_request() {
    use envoy_types::pb::envoy::service::ext_proc::v3::{
        HttpTrailers, ProcessingRequest, processing_request::Request, processing_response::Response,
    };
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post(
            "/v1/completions",
            br#"{"model":"m","prompt":"p"}"#,
            FULL_DUPLEX,
            FULL_DUPLEX,
        )
        .await;
    envoy.recv().await;
    envoy.recv().await;
    envoy
        .send(response_headers(&[(":status", "200")], false))
        .await;
    envoy.recv().await;
    // The body does not end the stream: trailers do (gRPC-style upstreams).
    envoy
        .send(response_body(br#"{"usage":{"prompt_tokens":1}}"#, false))
        .await;
    let (chunk, eos) = streamed(&envoy.recv().await);
    assert_eq!(chunk, br#"{"usage":{"prompt_tokens":1}}"#);
    assert!(!eos);
    assert_eq!(fx.inflight(), vec![1], "not complete before the trailers");
    envoy
        .send(ProcessingRequest {
            request: Some(Request::ResponseTrailers(HttpTrailers {
                trailers: Some(header_map(&[("grpc-status", "0")])),
            })),
            ..ProcessingRequest::default()
        })
        .await;
    let r = envoy.recv().await;
    match r.response {
        Some(Response::ResponseTrailers(t)) => {
            assert!(
                t.header_mutation.is_none(),
                "trailers pass unchanged: {t:?}"
            );
        }
        other => panic!("expected a trailers reply, got {other:?}"),
    }
    assert_eq!(fx.inflight(), vec![0]);
    assert_eq!(
        fx.recorder.0.lock().unwrap().outcomes,
        vec![epp_core::RequestOutcome::Completed { status: 200 }]
    );
}
