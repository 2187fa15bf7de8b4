//! What only the lean server has: its message-size limit, its keep-alive
//! PINGs, its flow control of replies.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::SeqCst},
    },
    time::Duration,
};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;
use epp_extproc::{ExtProcOptions, H2Options, ServeError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

// === keep-alive ===

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const ACK: u8 = 1;

fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("a small frame")
        .to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
    f.extend_from_slice(payload);
    f
}

/// A bare HTTP/2 peer: the preface and an empty SETTINGS, the server's
/// SETTINGS acknowledged, its PINGs counted in `pings` and answered only
/// when `answer`. Returns once the server closed the connection.
async fn bare_peer(io: tokio::io::DuplexStream, answer: bool, pings: Arc<AtomicUsize>) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let _ = wr.write_all(PREFACE).await;
    let _ = wr.write_all(&frame(SETTINGS, 0, &[])).await;
    loop {
        let mut head = [0u8; 9];
        if rd.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; len];
        if rd.read_exact(&mut payload).await.is_err() {
            return;
        }
        match (head[3], head[4] & ACK) {
            (SETTINGS, 0) => {
                let _ = wr.write_all(&frame(SETTINGS, ACK, &[])).await;
            }
            (PING, 0) => {
                pings.fetch_add(1, SeqCst);
                if answer {
                    let _ = wr.write_all(&frame(PING, ACK, &payload)).await;
                }
            }
            _ => {}
        }
    }
}

fn keepalive(timeout: Duration) -> H2Options {
    H2Options {
        keepalive_interval: Some(Duration::from_millis(100)),
        keepalive_timeout: timeout,
        ..H2Options::default()
    }
}

#[tokio::test]
async fn a_peer_that_leaves_a_ping_unanswered_is_closed() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let (server_io, client_io) = tokio::io::duplex(64 << 10);
    let service = fx.service.clone();
    let serving = tokio::spawn(async move {
        let options = keepalive(Duration::from_millis(100));
        service.serve_connection(server_io, &options).await
    });
    let pings = Arc::new(AtomicUsize::new(0));
    let peer = tokio::spawn(bare_peer(client_io, false, Arc::clone(&pings)));
    let ended = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the connection is still open after 10 s")
        .unwrap();
    assert!(
        matches!(ended, Err(ServeError::KeepaliveTimeout)),
        "{ended:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), peer)
        .await
        .expect("the peer did not see the close")
        .unwrap();
    // One PING, unanswered, then the close.
    assert_eq!(pings.load(SeqCst), 1);
}

#[tokio::test]
async fn a_peer_that_answers_pings_is_kept_open() {
    let fx = start(&[0], ExtProcOptions::default()).await;
    let (server_io, client_io) = tokio::io::duplex(64 << 10);
    let service = fx.service.clone();
    // A timeout generous enough for a loaded machine; each PING answered
    // restarts the interval, so five PINGs need five answers.
    let serving = tokio::spawn(async move {
        let options = keepalive(Duration::from_secs(2));
        service.serve_connection(server_io, &options).await
    });
    let pings = Arc::new(AtomicUsize::new(0));
    let peer = tokio::spawn(bare_peer(client_io, true, Arc::clone(&pings)));
    let five = async {
        while pings.load(SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), five)
        .await
        .expect("five PINGs within 20 s");
    assert!(!serving.is_finished(), "{:?}", serving.await);
    assert!(!peer.is_finished());
    serving.abort();
    peer.abort();
}

// === flow control of replies ===

/// The replies of one stream as a client reads them, releasing its window
/// as it goes.
struct Replies {
    body: h2::RecvStream,
    buf: Vec<u8>,
}

impl Replies {
    async fn next(&mut self) -> ProcessingResponse {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    let msg = prost::Message::decode(&self.buf[5..5 + len]).expect("a reply");
                    self.buf.drain(..5 + len);
                    return msg;
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.data())
                .await
                .expect("no reply data within 10 s")
                .expect("the stream ended before its replies")
                .expect("reply data");
            let _ = self.body.flow_control().release_capacity(chunk.len());
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// `grpc-status` of the trailers, once every reply was read.
    async fn status(mut self) -> Option<String> {
        assert!(self.buf.is_empty(), "a partial reply");
        let more = tokio::time::timeout(Duration::from_secs(10), self.body.data())
            .await
            .expect("no end within 10 s");
        assert!(more.is_none(), "replies beyond those expected");
        let trailers = tokio::time::timeout(Duration::from_secs(10), self.body.trailers())
            .await
            .expect("no trailers within 10 s")
            .expect("trailers")?;
        Some(trailers.get("grpc-status")?.to_str().ok()?.to_owned())
    }
}

/// Waits until `send` may send `len` bytes within the server's window:
/// `false` if that did not happen within `patience`.
async fn window_for(send: &mut h2::SendStream<Bytes>, len: usize, patience: Duration) -> bool {
    send.reserve_capacity(len);
    let granted = async {
        while send.capacity() < len {
            std::future::poll_fn(|cx| send.poll_capacity(cx))
                .await
                .expect("the stream is open")
                .expect("capacity");
        }
    };
    tokio::time::timeout(patience, granted).await.is_ok()
}

/// A client letting the server send `window` bytes ahead of its reading,
/// on each stream and on the connection; the server's windows are the
/// default 1 MiB (stream) and 4 MiB.
async fn slow_reader(addr: std::net::SocketAddr, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.expect("ready")
}

/// Opens a stream with a routed FULL_DUPLEX request and its response
/// headers (small replies, read): the server now echoes each response
/// body chunk in a reply as large.
async fn at_response_body(
    client: &mut h2::client::SendRequest<Bytes>,
) -> (h2::SendStream<Bytes>, Replies) {
    let request = http::Request::post(format!("http://epp{PROCESS}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request");
    let (response, mut send) = client
        .send_request(request, false)
        .expect("send the request");
    let opening = [
        request_headers(
            &pairs(&post("/v1/completions")),
            false,
            FULL_DUPLEX,
            FULL_DUPLEX,
        ),
        request_body(&chat_body("m", "hello"), true),
        response_headers(
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        ),
    ];
    for msg in &opening {
        send.send_data(Bytes::from(framed(msg)), false)
            .expect("send");
    }
    let head = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("no response head within 10 s")
        .expect("a response head");
    let mut replies = Replies {
        body: head.into_body(),
        buf: Vec::new(),
    };
    assert!(destination(&replies.next().await).is_some());
    assert_eq!(streamed(&replies.next().await).0, chat_body("m", "hello"));
    let _response_headers = replies.next().await;
    (send, replies)
}

/// Sends `chunks[from..]` (of `len` bytes each) and the stream's end while
/// reading every reply, which must echo each chunk in order; the stream's
/// `grpc-status`.
async fn read_to_the_end(
    mut send: h2::SendStream<Bytes>,
    mut replies: Replies,
    chunks: &[Bytes],
    from: usize,
    len: usize,
) -> Option<String> {
    let sending = async {
        for chunk in &chunks[from..] {
            assert!(
                window_for(&mut send, chunk.len(), Duration::from_secs(20)).await,
                "the window did not reopen"
            );
            send.send_data(chunk.clone(), false).expect("send");
        }
        send.send_data(Bytes::new(), true).expect("send the end");
    };
    let reading = async {
        for i in 0..chunks.len() {
            let (body, eos) = streamed(&replies.next().await);
            assert_eq!(body.len(), len, "reply {i}");
            assert!(body.iter().all(|&b| usize::from(b) == i % 251), "reply {i}");
            assert_eq!(eos, i + 1 == chunks.len());
        }
        replies.status().await
    };
    let ((), status) = tokio::join!(sending, reading);
    status
}

/// The `i`-th of `n` response body chunks of `len` bytes, framed.
fn body_chunk(i: usize, n: usize, len: usize) -> Bytes {
    let body = vec![(i % 251) as u8; len];
    Bytes::from(framed(&response_body(&body, i + 1 == n)))
}

#[tokio::test]
async fn a_peer_that_reads_no_reply_is_stopped_by_its_own_window() {
    const WINDOW: u32 = 64 << 10;
    const CHUNK: usize = 32 << 10;
    const CHUNKS: usize = 128; // 4 MiB of response body, echoed as much
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut client = slow_reader(fx.addr, WINDOW).await;
    let (mut send, replies) = at_response_body(&mut client).await;

    // The response body in 32 KiB chunks, each echoed in a reply as large;
    // the client reads none. The server, its replies held for the client's
    // window, must stop reading, and its own window stops the client.
    let chunks: Vec<Bytes> = (0..CHUNKS).map(|i| body_chunk(i, CHUNKS, CHUNK)).collect();
    let mut sent = 0;
    while sent < CHUNKS && window_for(&mut send, chunks[sent].len(), Duration::from_secs(1)).await {
        send.send_data(chunks[sent].clone(), false).unwrap();
        sent += 1;
    }
    assert!(
        sent < CHUNKS,
        "the server took all {CHUNKS} chunks with none of its replies read: it holds them all"
    );
    // What it took: its 1 MiB stream window, what it held and what the
    // client's window took (~1 MiB measured), not its 4 MiB connection
    // window.
    assert!(sent * CHUNK < 3 << 20, "{sent} chunks taken");

    // Once the client reads, the rest goes and every reply comes, in order.
    let status = read_to_the_end(send, replies, &chunks, sent, CHUNK).await;
    assert_eq!(status.as_deref(), Some("0"));
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
}

/// Many streams, none of whose replies the peer reads: what the server
/// holds for them is bounded for the connection (1 MiB), not only per
/// stream (64 KiB and a reply: two 60 KiB replies, which 24 streams would
/// multiply to 2.8 MiB), so the peer is stopped sooner; once it reads,
/// every stream carries on, those stopped while holding nothing included,
/// and every reply comes.
#[tokio::test]
async fn a_peer_reading_none_of_many_streams_is_stopped_for_the_connection() {
    const WINDOW: u32 = 64 << 10;
    const STREAMS: usize = 24;
    const CHUNK: usize = 60 << 10;
    const CHUNKS: usize = 24; // per stream
    let fx = start(&[0], ExtProcOptions::default()).await;
    let mut client = slow_reader(fx.addr, WINDOW).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        streams.push(at_response_body(&mut client).await);
    }
    let chunks: Vec<Bytes> = (0..CHUNKS).map(|i| body_chunk(i, CHUNKS, CHUNK)).collect();
    // Round after round, a chunk on every stream that takes one, until a
    // whole round takes none.
    let mut sent = [0usize; STREAMS];
    loop {
        let mut took = false;
        for (k, (send, _)) in streams.iter_mut().enumerate() {
            if sent[k] < CHUNKS
                && window_for(send, chunks[sent[k]].len(), Duration::from_millis(150)).await
            {
                send.send_data(chunks[sent[k]].clone(), false).unwrap();
                sent[k] += 1;
                took = true;
            }
        }
        if !took {
            break;
        }
    }
    // Taken: the server's 4 MiB connection window of unread data, what it
    // holds (~1 MiB and a chunk; bounded per stream only, 2.8 MiB) and what
    // the client's 64 KiB window took.
    let taken: usize = sent.iter().sum::<usize>() * CHUNK;
    assert!(
        taken < (5 << 20) + (512 << 10),
        "{taken} bytes taken: {sent:?}"
    );

    // The client reads: every stream goes on to its end, in order.
    let mut all = Vec::new();
    for (k, (send, replies)) in streams.into_iter().enumerate() {
        let chunks = chunks.clone();
        let from = sent[k];
        all.push(tokio::spawn(async move {
            read_to_the_end(send, replies, &chunks, from, CHUNK).await
        }));
    }
    for s in all {
        assert_eq!(s.await.unwrap().as_deref(), Some("0"));
    }
    fx.eventually("released", |f| f.inflight() == vec![0]).await;
}

#[tokio::test]
async fn the_prefix_record_is_applied_after_the_reply() {
    use epp_core::PluginRef;
    use epp_plugins::{Builtin, PrefixCacheScorer, PrefixCacheScorerParams, RecordMode};

    // Records wait for the server to have replied.
    let mut params = PrefixCacheScorerParams::default();
    params.index.record_mode = RecordMode::AfterReply;
    let prefix = Arc::new(PrefixCacheScorer::build("prefix", params).unwrap());
    assert!(prefix.index().records_after_reply());
    let fx = start_hooked(Server::Lean, &[0, 0], vec![PluginRef::new(prefix.clone())]).await;
    let mut envoy = fx.envoy().await;
    envoy
        .send_post(
            "/v1/chat/completions",
            &chat_body("m", &"x".repeat(2000)),
            FULL_DUPLEX,
            NONE,
        )
        .await;
    let reply = envoy.recv().await;
    assert!(destination(&reply).is_some(), "{reply:?}");
    // Nothing reads the index after this one decision: only the server,
    // once its reply was written, applies the record.
    fx.eventually("the record applied", |_| {
        prefix.index().queued_records() == 0
    })
    .await;
    assert!(prefix.index().entries() > 0);
}
