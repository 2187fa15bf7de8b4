//! Test fixtures: endpoints, a small scheduler, the server on a free port,
//! and an "Envoy" client that sends messages and reads replies.
#![expect(
    clippy::unwrap_used,
    reason = "test harness: a failed set-up is a failed test"
)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use epp_core::{Endpoint, EndpointSnapshot, Plugin, PluginRef, Scheduler};
// Envoy's generated types: the client speaks an encoding epp's own message
// types did not write.
use envoy_types::pb::{
    envoy::{
        config::core::v3::{HeaderMap, HeaderValue, Metadata},
        service::ext_proc::v3::{
            CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest,
            ProcessingResponse, ProtocolConfiguration,
            external_processor_client::ExternalProcessorClient, processing_request::Request,
            processing_response::Response,
        },
    },
    google::protobuf::{ListValue, Struct, Value, value::Kind},
};
use epp_extproc::{ExtProcOptions, ExtProcService, H2Options};
pub(crate) use epp_test_support::plugins::Recorder;
use epp_test_support::{
    endpoints::with_queues,
    plugins::{self, BestScoresPicker, QueueSaturationDetector, short_queue_profile},
    wait,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::Streaming;

pub(crate) const BUFFERED: i32 = 2;
pub(crate) const FULL_DUPLEX: i32 = 4;
pub(crate) const NONE: i32 = 0;

// === fixture ===

pub(crate) struct Fixture {
    pub(crate) endpoints: Vec<Arc<Endpoint>>,
    pub(crate) source: Arc<ArcSwap<EndpointSnapshot>>,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) service: ExtProcService,
    pub(crate) addr: SocketAddr,
    /// Shuts the server down gracefully (no new streams, in-flight ones finish).
    pub(crate) stop: tokio_util::sync::CancellationToken,
    /// The server's task: ends after `stop`, once its streams ended.
    pub(crate) server: Option<tokio::task::JoinHandle<()>>,
}

/// The scheduler of every fixture: shortest queue first with one fallback,
/// `recorder` as response hooks, saturated when every endpoint has a queue.
pub(crate) fn scheduler(recorder: &Arc<Recorder>) -> Scheduler {
    plugins::scheduler(short_queue_profile(BestScoresPicker::new(2)))
        .with_hooks([PluginRef::new(recorder.clone() as Arc<dyn Plugin>)])
        .with_saturation_detector(PluginRef::new(Arc::new(QueueSaturationDetector)))
        .unwrap()
}

/// Which server drives the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    /// `into_server()` mounted on tonic's transport.
    Tonic,
    /// The lean server on `h2` (`serve_incoming`).
    Lean,
}

/// Starts the service on a free loopback port, served by `server`.
pub(crate) async fn start_on(server: Server, queues: &[u32], options: ExtProcOptions) -> Fixture {
    start_with(server, queues, options, H2Options::default()).await
}

/// [`start_on`] with the lean server's settings (ignored by tonic's).
pub(crate) async fn start_with(
    server: Server,
    queues: &[u32],
    options: ExtProcOptions,
    h2: H2Options,
) -> Fixture {
    start_scheduled(server, queues, options, h2, Vec::new()).await
}

/// [`start_with`], the fixture's scheduler given `hooks` too.
pub(crate) async fn start_hooked(server: Server, queues: &[u32], hooks: Vec<PluginRef>) -> Fixture {
    start_scheduled(
        server,
        queues,
        ExtProcOptions::default(),
        H2Options::default(),
        hooks,
    )
    .await
}

async fn start_scheduled(
    server: Server,
    queues: &[u32],
    options: ExtProcOptions,
    h2: H2Options,
    hooks: Vec<PluginRef>,
) -> Fixture {
    let eps = with_queues(queues);
    let source = Arc::new(ArcSwap::from_pointee(EndpointSnapshot::new(eps.clone())));
    let recorder = Arc::new(Recorder::default());
    let scheduler = scheduler(&recorder).with_hooks(hooks);
    let service = ExtProcService::new(Arc::new(scheduler), source.clone(), options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let served = service.clone();
    let task = tokio::spawn(async move {
        match server {
            Server::Tonic => tonic::transport::Server::builder()
                .add_service(served.into_server())
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped)
                .await
                .unwrap(),
            Server::Lean => {
                served
                    .serve_incoming(TcpListenerStream::new(listener), h2, stopped)
                    .await;
            }
        }
    });
    Fixture {
        endpoints: eps,
        source,
        recorder,
        service,
        addr,
        stop,
        server: Some(task),
    }
}

impl Fixture {
    pub(crate) async fn envoy(&self) -> Envoy {
        let mut client = ExternalProcessorClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(64);
        let replies = client
            .process(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Envoy {
            tx: Some(tx),
            replies,
        }
    }

    /// Waits (bounded) until `cond` holds; the server finishes streams asynchronously.
    pub(crate) async fn eventually(&self, what: &str, cond: impl Fn(&Self) -> bool) {
        wait::eventually(what, || std::future::ready(cond(self))).await;
    }

    /// Turns flow control on: one band, global strict fairness, first come
    /// first served.
    pub(crate) fn flow_control_on(&self) {
        let (fc, _) = epp_test_support::flow::controller(
            &epp_plugins::builtin_registry(),
            "global-strict-fairness-policy",
            "fcfs-ordering-policy",
        );
        self.service.set_flow_control(Some(fc.settings().clone()));
    }

    /// A completion on a new stream is still routed: the server carried on.
    pub(crate) async fn still_serves(&self) {
        let mut envoy = self.envoy().await;
        envoy
            .send_post(
                "/v1/completions",
                br#"{"model":"m","prompt":"p"}"#,
                FULL_DUPLEX,
                FULL_DUPLEX,
            )
            .await;
        assert!(destination(&envoy.recv().await).is_some());
    }

    pub(crate) fn inflight(&self) -> Vec<u32> {
        self.endpoints
            .iter()
            .map(|e| e.inflight().requests())
            .collect()
    }
}

/// The client side of one ext_proc stream.
pub(crate) struct Envoy {
    tx: Option<mpsc::Sender<ProcessingRequest>>,
    pub(crate) replies: Streaming<ProcessingResponse>,
}

impl Envoy {
    pub(crate) async fn send(&self, msg: ProcessingRequest) {
        self.tx.as_ref().unwrap().send(msg).await.unwrap();
    }

    pub(crate) async fn recv(&mut self) -> ProcessingResponse {
        tokio::time::timeout(Duration::from_secs(5), self.replies.message())
            .await
            .expect("no reply within 5 s")
            .unwrap()
            .expect("stream ended")
    }

    /// A FULL_DUPLEX request body streamed back, up to its end: the chunk
    /// sizes (each within the 62,000-byte limit) and the bytes joined.
    pub(crate) async fn recv_streamed_body(&mut self) -> (Vec<usize>, Vec<u8>) {
        let (mut sizes, mut body) = (Vec::new(), Vec::new());
        loop {
            let r = self.recv().await;
            assert!(is_request_body(&r), "{r:?}");
            let (chunk, eos) = streamed(&r);
            assert!(chunk.len() <= 62_000, "chunk of {}", chunk.len());
            sizes.push(chunk.len());
            body.extend(chunk);
            if eos {
                return (sizes, body);
            }
        }
    }

    /// The next reply must not come: the stream ends (or stays silent).
    pub(crate) async fn expect_end(&mut self) {
        match tokio::time::timeout(Duration::from_secs(5), self.replies.message()).await {
            Ok(Ok(None)) => {}
            other => panic!("expected the stream to end, got {other:?}"),
        }
    }

    /// Sends the headers of a POST to `path` whose body follows, announcing
    /// the body modes.
    pub(crate) async fn send_post_headers(&self, path: &str, req_mode: i32, resp_mode: i32) {
        self.send(request_headers(
            &pairs(&post(path)),
            false,
            req_mode,
            resp_mode,
        ))
        .await;
    }

    /// Sends a whole POST to `path`: its headers (announcing the body modes),
    /// then `body` in one message that ends the request.
    pub(crate) async fn send_post(&self, path: &str, body: &[u8], req_mode: i32, resp_mode: i32) {
        self.send_post_headers(path, req_mode, resp_mode).await;
        self.send(request_body(body, true)).await;
    }

    /// Half-closes the request side (Envoy done).
    pub(crate) fn close(&mut self) {
        self.tx = None;
    }
}

// === messages ===

pub(crate) fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// Request headers as Envoy sends them first, announcing the body modes.
pub(crate) fn request_headers(
    pairs: &[(&str, &str)],
    eos: bool,
    req_mode: i32,
    resp_mode: i32,
) -> ProcessingRequest {
    ProcessingRequest {
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: req_mode,
            response_body_mode: resp_mode,
            send_body_without_waiting_for_header_response: false,
        }),
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(pairs)),
            end_of_stream: eos,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn with_subset(mut msg: ProcessingRequest, entries: &[&str]) -> ProcessingRequest {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: entries
                .iter()
                .map(|e| Value {
                    kind: Some(Kind::StringValue((*e).to_owned())),
                })
                .collect(),
        })),
    };
    let hint = Struct {
        fields: [(epp_extproc::SUBSET_KEY.to_owned(), list)]
            .into_iter()
            .collect(),
    };
    msg.metadata_context = Some(Metadata {
        filter_metadata: [(epp_extproc::SUBSET_NAMESPACE.to_owned(), hint)]
            .into_iter()
            .collect(),
        ..Metadata::default()
    });
    msg
}

pub(crate) fn request_body(body: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: body.to_vec(),
            end_of_stream: eos,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn request_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestTrailers(HttpTrailers {
            trailers: Some(header_map(&[("x-t", "1")])),
        })),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn response_headers(pairs: &[(&str, &str)], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(pairs)),
            end_of_stream: eos,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// `msg` reporting `served` as the endpoint that served the request: in the
/// `envoy.lb` metadata (`metadata: true`, the protocol's way) or as Envoy's
/// `upstream.address` attribute.
pub(crate) fn served(
    mut msg: ProcessingRequest,
    served: &str,
    metadata: bool,
) -> ProcessingRequest {
    let value = |key: &str| Struct {
        fields: [(
            key.to_owned(),
            Value {
                kind: Some(Kind::StringValue(served.to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    };
    if metadata {
        msg.metadata_context = Some(Metadata {
            filter_metadata: [(
                epp_extproc::DESTINATION_NAMESPACE.to_owned(),
                value(epp_extproc::SERVED_KEY),
            )]
            .into_iter()
            .collect(),
            ..Metadata::default()
        });
    } else {
        msg.attributes = [(
            "envoy.filters.http.ext_proc".to_owned(),
            value(epp_extproc::UPSTREAM_ADDRESS_ATTRIBUTE),
        )]
        .into_iter()
        .collect();
    }
    msg
}

pub(crate) fn response_body(body: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody {
            body: body.to_vec(),
            end_of_stream: eos,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub(crate) fn chat_body(model: &str, text: &str) -> Vec<u8> {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
    .into_bytes()
}

pub(crate) fn post(path: &str) -> Vec<(&'static str, String)> {
    vec![
        (":method", "POST".to_owned()),
        (":path", path.to_owned()),
        (":authority", "gw".to_owned()),
        ("content-type", "application/json".to_owned()),
    ]
}

// === reading replies ===

pub(crate) fn common(r: &ProcessingResponse) -> &CommonResponse {
    match r.response.as_ref().expect("a response") {
        Response::RequestHeaders(h) | Response::ResponseHeaders(h) => h.response.as_ref().unwrap(),
        Response::RequestBody(b) | Response::ResponseBody(b) => b.response.as_ref().unwrap(),
        other => panic!("not a headers/body response: {other:?}"),
    }
}

/// Headers set by a reply, as `(key, value)`.
pub(crate) fn set_headers(r: &ProcessingResponse) -> Vec<(String, String)> {
    common(r)
        .header_mutation
        .as_ref()
        .map(|m| {
            m.set_headers
                .iter()
                .map(|h| {
                    let h = h.header.as_ref().unwrap();
                    (
                        h.key.clone(),
                        String::from_utf8(h.raw_value.clone()).unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn removed_headers(r: &ProcessingResponse) -> Vec<String> {
    common(r)
        .header_mutation
        .as_ref()
        .map(|m| m.remove_headers.clone())
        .unwrap_or_default()
}

pub(crate) fn destination(r: &ProcessingResponse) -> Option<String> {
    set_headers(r)
        .into_iter()
        .find(|(k, _)| k == epp_extproc::DESTINATION_HEADER)
        .map(|(_, v)| v)
}

pub(crate) fn lb_metadata(r: &ProcessingResponse) -> Option<String> {
    let md = r.dynamic_metadata.as_ref()?;
    let Some(Kind::StructValue(ns)) = md.fields.get("envoy.lb")?.kind.as_ref() else {
        return None;
    };
    match ns
        .fields
        .get("x-gateway-destination-endpoint")?
        .kind
        .as_ref()?
    {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// The streamed body chunk of a FULL_DUPLEX reply: `(bytes, end_of_stream)`.
pub(crate) fn streamed(r: &ProcessingResponse) -> (Vec<u8>, bool) {
    use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
    match common(r)
        .body_mutation
        .as_ref()
        .and_then(|m| m.mutation.as_ref())
    {
        Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not a streamed body: {other:?}"),
    }
}

/// The replaced body of a BUFFERED reply, if any.
pub(crate) fn replaced_body(r: &ProcessingResponse) -> Option<Vec<u8>> {
    use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
    match common(r)
        .body_mutation
        .as_ref()
        .and_then(|m| m.mutation.as_ref())
    {
        Some(Mutation::Body(b)) => Some(b.clone()),
        _ => None,
    }
}

/// `(status, parsed JSON body)` of an immediate response.
pub(crate) fn immediate(r: &ProcessingResponse) -> (i32, serde_json::Value) {
    match r.response.as_ref() {
        Some(Response::ImmediateResponse(i)) => (
            i.status.as_ref().unwrap().code,
            serde_json::from_slice(&i.body).expect("a JSON error body"),
        ),
        other => panic!("not an immediate response: {other:?}"),
    }
}

pub(crate) fn is_request_headers(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Response::RequestHeaders(_)))
}

pub(crate) fn is_request_body(r: &ProcessingResponse) -> bool {
    matches!(r.response, Some(Response::RequestBody(_)))
}

pub(crate) fn pairs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

// === raw HTTP/2: frames as the test lays them out ===

/// The ext_proc method's path.
pub(crate) const PROCESS: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

/// One stream opened with a bare `h2` client: DATA frames are exactly the
/// `send_data` calls, so messages can be split or packed at will.
pub(crate) struct RawStream {
    pub(crate) send: h2::SendStream<bytes::Bytes>,
    response: Option<h2::client::ResponseFuture>,
    body: Option<h2::RecvStream>,
    /// Reply bytes read, not yet a whole message.
    partial: Vec<u8>,
    /// The client's connection task (aborting it closes the socket).
    conn: Option<tokio::task::JoinHandle<()>>,
}

/// The server's answer on a [`RawStream`]: status, headers, the messages,
/// the trailers (the headers again for a trailers-only reply).
#[derive(Debug)]
pub(crate) struct RawReply {
    pub(crate) http: http::StatusCode,
    /// Any response header besides the status.
    pub(crate) headers: http::HeaderMap,
    pub(crate) messages: Vec<ProcessingResponse>,
    pub(crate) grpc_status: Option<i32>,
    pub(crate) grpc_message: Option<String>,
}

impl Fixture {
    /// A raw stream on a new connection to `path`.
    pub(crate) async fn raw(&self, path: &str) -> RawStream {
        self.raw_with(path, "application/grpc").await
    }

    pub(crate) async fn raw_with(&self, path: &str, content_type: &str) -> RawStream {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut raw = raw_on(client, path, content_type).await;
        raw.conn = Some(conn);
        raw
    }
}

/// A raw stream on `client`'s connection.
async fn raw_on(
    mut client: h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    content_type: &str,
) -> RawStream {
    client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://epp{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, send) = client.send_request(request, false).unwrap();
    RawStream {
        send,
        response: Some(response),
        body: None,
        partial: Vec::new(),
        conn: None,
    }
}

/// `msg` with gRPC's 5-byte prefix.
pub(crate) fn framed(msg: &ProcessingRequest) -> Vec<u8> {
    let body = prost::Message::encode_to_vec(msg);
    let mut v = vec![0];
    v.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    v.extend(body);
    v
}

impl RawStream {
    /// Drops the connection without a word (no RST_STREAM, no GOAWAY).
    pub(crate) fn disconnect(mut self) {
        if let Some(conn) = self.conn.take() {
            conn.abort();
        }
    }

    /// Sends `bytes` as one DATA frame (`eos`: and ends the request side).
    pub(crate) fn data(&mut self, bytes: &[u8], eos: bool) {
        self.send
            .send_data(bytes::Bytes::copy_from_slice(bytes), eos)
            .unwrap();
    }

    /// The response head, then the replies as they come, until `n` were
    /// read; `None` if the stream ended first.
    pub(crate) async fn messages(&mut self, n: usize) -> Vec<ProcessingResponse> {
        let mut buf = std::mem::take(&mut self.partial);
        let mut out = Vec::new();
        loop {
            while buf.len() >= 5 && out.len() < n {
                let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
                if buf.len() < 5 + len {
                    break;
                }
                out.push(prost::Message::decode(&buf[5..5 + len]).unwrap());
                buf.drain(..5 + len);
            }
            if out.len() >= n {
                break;
            }
            let Some(chunk) = self.next_data().await else {
                assert!(buf.is_empty(), "a partial reply");
                break;
            };
            buf.extend_from_slice(&chunk);
        }
        self.partial = buf;
        out
    }

    async fn head(&mut self) -> Option<http::Response<h2::RecvStream>> {
        let response = self.response.take()?;
        let r = tokio::time::timeout(Duration::from_secs(5), response)
            .await
            .expect("no response head within 5 s")
            .unwrap();
        Some(r)
    }

    async fn next_data(&mut self) -> Option<bytes::Bytes> {
        if let Some(head) = self.head().await {
            self.body = Some(head.into_body());
        }
        let body = self.body.as_mut()?;
        let chunk = tokio::time::timeout(Duration::from_secs(5), body.data())
            .await
            .expect("no data within 5 s")?
            .unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        Some(chunk)
    }

    /// Everything up to the stream's end.
    pub(crate) async fn reply(mut self) -> RawReply {
        let head = self.head().await;
        let (http, headers, status_in_head) = match head {
            Some(head) => {
                let (parts, body) = head.into_parts();
                self.body = Some(body);
                let status = grpc_status(&parts.headers);
                (parts.status, parts.headers, status)
            }
            None => (http::StatusCode::OK, http::HeaderMap::new(), None),
        };
        let messages = self.messages(usize::MAX).await;
        let trailers = match self.body.as_mut() {
            Some(b) => tokio::time::timeout(Duration::from_secs(5), b.trailers())
                .await
                .expect("no trailers within 5 s")
                .unwrap(),
            None => None,
        };
        let (grpc_status, grpc_message) = match status_in_head {
            Some(s) => (Some(s.0), s.1),
            None => trailers
                .as_ref()
                .and_then(grpc_status)
                .map_or((None, None), |s| (Some(s.0), s.1)),
        };
        RawReply {
            http,
            headers,
            messages,
            grpc_status,
            grpc_message,
        }
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<(i32, Option<String>)> {
    let status = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .map(|m| m.to_str().unwrap().to_owned());
    Some((status, message))
}
