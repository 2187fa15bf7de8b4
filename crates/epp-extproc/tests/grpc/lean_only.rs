//! What only the lean server has: its message-size limit.

use epp_extproc::{ExtProcOptions, H2Options};

use super::harness::*;

const RESOURCE_EXHAUSTED: i32 = 8;

#[tokio::test]
async fn a_message_over_the_limit_is_resource_exhausted() {
    let h2 = H2Options {
        max_message_bytes: Some(1024),
        ..H2Options::default()
    };
    let fx = start_with(Server::Lean, &[0], ExtProcOptions::default(), h2).await;
    let headers = framed(&request_headers(
        &pairs(&post("/v1/completions")),
        false,
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    let body = framed(&request_body(&chat_body("m", &"x".repeat(2000)), true));
    let mut raw = fx.raw(PROCESS).await;
    // The headers message fits; the body does not, and is refused from its
    // prefix (sent alone), before its bytes come.
    raw.data(&headers, false);
    raw.data(&body[..5], false);
    let reply = raw.reply().await;
    assert_eq!(reply.grpc_status, Some(RESOURCE_EXHAUSTED), "{reply:?}");
    assert!(
        reply
            .grpc_message
            .as_deref()
            .unwrap_or_default()
            .contains("limit"),
        "{reply:?}"
    );
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
}

#[tokio::test]
async fn the_default_limit_follows_the_body_limit() {
    // 64 MiB bodies by default: a 5 MiB message is read (and answered).
    let fx = start(&[0], ExtProcOptions::default()).await;
    let headers = framed(&request_headers(
        &pairs(&post("/v1/completions")),
        false,
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    let body = framed(&request_body(&chat_body("m", &"y".repeat(5 << 20)), true));
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&headers, false);
    for piece in body.chunks(1 << 20) {
        raw.data(piece, false);
    }
    let replies = raw.messages(1).await;
    assert!(destination(&replies[0]).is_some(), "{:?}", replies[0]);
}

#[tokio::test]
async fn keepalive_pings_leave_an_answering_connection_open() {
    let h2 = H2Options {
        keepalive_interval: Some(std::time::Duration::from_millis(20)),
        keepalive_timeout: std::time::Duration::from_millis(500),
        ..H2Options::default()
    };
    let fx = start_with(Server::Lean, &[0], ExtProcOptions::default(), h2).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", FULL_DUPLEX, FULL_DUPLEX)
        .await;
    // Several PINGs come and are answered by the client's h2 meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    envoy
        .send(request_body(br#"{"model":"m","prompt":"p"}"#, true))
        .await;
    assert!(destination(&envoy.recv().await).is_some());
}
