//! gRPC framing and HTTP/2 edges, with frames laid out by a bare `h2`
//! client: other methods, messages split across DATA frames or packed in
//! one, compressed messages, resets and graceful shutdown.

use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use epp_extproc::ExtProcOptions;

use super::harness::*;

const UNIMPLEMENTED: i32 = 12;
const INTERNAL: i32 = 13;

/// The status a stream whose message could not be read ends with: INTERNAL
/// on the lean server; the tonic service ends it as if Envoy had closed it.
const BROKEN: i32 = match SERVER {
    Server::Lean => INTERNAL,
    Server::Tonic => 0,
};

fn chat_request() -> (Vec<u8>, Vec<u8>) {
    let headers = framed(&request_headers(
        &pairs(&post("/v1/chat/completions")),
        false,
        FULL_DUPLEX,
        FULL_DUPLEX,
    ));
    let body = framed(&request_body(&chat_body("m", "Hello there"), true));
    (headers, body)
}

#[tokio::test]
async fn other_methods_are_unimplemented() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut raw = fx
        .raw("/envoy.service.ext_proc.v3.ExternalProcessor/Other")
        .await;
    raw.data(b"", true);
    let reply = raw.reply().await;
    assert_eq!(reply.grpc_status, Some(UNIMPLEMENTED), "{reply:?}");
    assert_eq!(reply.http, http::StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "application/grpc");
    assert!(reply.messages.is_empty());
}

#[tokio::test]
async fn a_stream_the_client_resets_is_released_at_once() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let (headers, body) = chat_request();
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&[headers, body].concat(), false);
    assert_eq!(raw.messages(2).await.len(), 2);
    assert_eq!(fx.inflight(), vec![1], "routed: held until the response");
    raw.send.send_reset(h2::Reason::CANCEL);
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
    assert_eq!(
        fx.recorder.0.lock().unwrap().outcomes,
        vec![epp_core::RequestOutcome::Aborted]
    );
}

#[tokio::test]
async fn messages_split_across_frames_or_packed_in_one_are_read() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let (headers, body) = chat_request();
    let all = [headers.as_slice(), body.as_slice()].concat();
    // Every cut of the two messages into three frames: mid-prefix,
    // mid-message, two messages in one frame.
    for cut in [
        1,
        3,
        5,
        headers.len() - 1,
        headers.len(),
        headers.len() + 2,
        headers.len() + 7,
    ] {
        let mut raw = fx.raw(PROCESS).await;
        raw.data(&all[..cut], false);
        raw.data(&all[cut..cut + (all.len() - cut) / 2], false);
        raw.data(&all[cut + (all.len() - cut) / 2..], false);
        let replies = raw.messages(2).await;
        assert_eq!(replies.len(), 2, "cut at {cut}");
        assert!(destination(&replies[0]).is_some(), "{:?}", replies[0]);
        assert_eq!(streamed(&replies[1]).0, chat_body("m", "Hello there"));
        raw.data(b"", true);
        let reply = raw.reply().await;
        assert_eq!(reply.grpc_status, Some(0), "cut at {cut}: {reply:?}");
    }
    // Both messages in one frame, and the request side closed with them.
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&all, true);
    let reply = raw.reply().await;
    assert_eq!(reply.messages.len(), 2, "{reply:?}");
    assert_eq!(reply.grpc_status, Some(0));
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
}

#[tokio::test]
async fn a_compressed_message_is_an_error() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let (mut headers, _) = chat_request();
    headers[0] = 1;
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&headers, false);
    let reply = raw.reply().await;
    assert_eq!(reply.grpc_status, Some(BROKEN), "{reply:?}");
    assert!(reply.messages.is_empty());
}

#[tokio::test]
async fn garbage_is_an_error_not_a_crash() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&[0, 0, 0, 0, 3, 0xff, 0xff, 0xff], false);
    let reply = raw.reply().await;
    assert_eq!(reply.grpc_status, Some(BROKEN), "{reply:?}");
    // The server carries on.
    fx.still_serves().await;
}

#[tokio::test]
async fn a_lost_connection_releases_its_streams() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut metrics = prometheus_client::registry::Registry::default();
    fx.service.register_metrics(&mut metrics);
    let (headers, body) = chat_request();
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&[headers, body].concat(), false);
    assert_eq!(raw.messages(2).await.len(), 2);
    assert_eq!(fx.inflight(), vec![1]);
    raw.disconnect();
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
    assert!(
        text.contains("llm_d_epp_extproc_streams_inflight 0"),
        "{text}"
    );
}

#[tokio::test]
async fn a_reset_while_queued_in_flow_control_leaves_the_queue() {
    // Every endpoint has a queue: saturated, so requests wait in flow control.
    let fx = start(&[3, 3], ExtProcOptions::default()).await;
    fx.flow_control_on();
    let mut metrics = prometheus_client::registry::Registry::default();
    fx.service.register_metrics(&mut metrics);
    let page = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
        text
    };
    let (headers, body) = chat_request();
    let mut raw = fx.raw(PROCESS).await;
    raw.data(&[headers, body].concat(), false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !page().contains("outcome=\"EvictedContextCancelled\"} 1"),
        "still queued"
    );
    raw.send.send_reset(h2::Reason::CANCEL);
    fx.eventually("left the queue as cancelled", |_| {
        page().contains("outcome=\"EvictedContextCancelled\"} 1")
    })
    .await;
    fx.eventually("the stream is closed", |_| {
        page().contains("llm_d_epp_extproc_streams_inflight 0")
    })
    .await;
    assert_eq!(fx.inflight(), vec![0, 0]);
}

#[tokio::test]
async fn graceful_shutdown_lets_the_stream_in_flight_finish() {
    let mut fx = start(&[0], ExtProcOptions::default()).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post_headers("/v1/completions", FULL_DUPLEX, FULL_DUPLEX)
        .await;
    // Let the stream reach the server before it starts shutting down.
    tokio::time::sleep(Duration::from_millis(50)).await;
    fx.stop.cancel();
    let server = fx.server.take().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!server.is_finished(), "waits for the stream in flight");
    // No new connection is served.
    let refused = async {
        let mut client = ExternalProcessorClient::connect(format!("http://{}", fx.addr)).await?;
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        client
            .process(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(2), refused)
            .await
            .map_or(true, |r| r.is_err()),
        "a new stream after the shutdown began"
    );
    // The stream in flight is still answered.
    envoy
        .send(request_body(br#"{"model":"m","prompt":"p"}"#, true))
        .await;
    assert!(destination(&envoy.recv().await).is_some());
    envoy.recv().await;
    envoy.close();
    envoy.expect_end().await;
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server ends once its stream ended")
        .unwrap();
}

#[tokio::test]
async fn random_frames_never_take_the_server_down() {
    use rand::{Rng, SeedableRng, rngs::SmallRng};
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut rng = SmallRng::seed_from_u64(14);
    let (headers, body) = chat_request();
    for _ in 0..40 {
        let mut raw = fx.raw(PROCESS).await;
        // A valid start, sometimes, then bytes at random: flipped prefixes,
        // lengths past the end, protobuf garbage.
        let mut bytes = if rng.random_bool(0.5) {
            [headers.clone(), body.clone()].concat()
        } else {
            Vec::new()
        };
        let n = rng.random_range(0..300);
        bytes.extend((0..n).map(|_| rng.random::<u8>()));
        if !bytes.is_empty() {
            let flip = rng.random_range(0..bytes.len());
            bytes[flip] ^= rng.random::<u8>();
        }
        for piece in bytes.chunks(rng.random_range(1..64)) {
            raw.data(piece, false);
        }
        raw.data(b"", true);
        // Whatever the verdict, the stream ends (or is reset) and nothing panics.
        let _ = tokio::time::timeout(Duration::from_secs(5), raw.reply()).await;
    }
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
    fx.still_serves().await;
}
