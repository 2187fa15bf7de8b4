//! OpenTelemetry tracing: the sampler the ext_proc service asks for every
//! request, and a background exporter sending sampled requests' spans to a
//! collector over OTLP (gRPC or HTTP/protobuf).
//!
//! The request path never waits for the collector: a recorded request's
//! spans go into a queue bounded in spans (`OTEL_BSP_MAX_QUEUE_SIZE`); when
//! it is full they are dropped and counted, and a failed export drops its
//! batch (counted too; the change between failing and working is logged
//! once each way). On shutdown what is queued is sent, within a bound.
//!
//! A small exporter of our own rather than the OpenTelemetry SDK: the spans
//! already exist as plain values (`epp_extproc::RequestTrace`), so the SDK's
//! span machinery would be a second copy on the request path, and the OTLP
//! messages are a dozen stable prost structs (`proto.rs`).

mod config;
mod proto;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use epp_extproc::{AttrValue, RequestTrace, RequestTracer, SpanKind, TraceParent};
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub(crate) use self::config::{Protocol, TraceConfig, configure};

/// The instrumentation scope of epp's spans.
const SCOPE: &str = "epp-rs/epp-extproc";
/// How long shutdown waits for the last export.
const FLUSH_BOUND: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

/// Span counters on the metrics port.
#[derive(Debug, Clone, Default)]
struct Counters {
    exported: Counter,
    dropped: Family<DropLabels, Counter>,
}

impl Counters {
    fn drop_spans(&self, reason: &'static str, n: usize) {
        self.dropped
            .get_or_create(&DropLabels { reason })
            .inc_by(n as u64);
    }
}

/// The tracer handed to the ext_proc service: samples, and queues what it
/// records for the exporter.
#[derive(Debug)]
pub(crate) struct Tracer {
    sampler: config::Sampler,
    queue: mpsc::UnboundedSender<RequestTrace>,
    /// Spans in the queue (the bound is in spans, as the SDK's).
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    counters: Counters,
}

impl RequestTracer for Tracer {
    fn should_sample(&self, trace_id: &[u8; 16], parent: Option<&TraceParent>) -> bool {
        self.sampler.should_sample(trace_id, parent)
    }

    fn export(&self, trace: RequestTrace) {
        let n = trace.spans.len();
        let before = self.queued.fetch_add(n, Ordering::Relaxed);
        if before + n > self.max_queue {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.counters.drop_spans("queue_full", n);
            return;
        }
        if self.queue.send(trace).is_err() {
            // The exporter has stopped (shutdown).
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.counters.drop_spans("shutdown", n);
        }
    }
}

/// The running exporter, to flush on shutdown.
#[derive(Debug)]
pub(crate) struct Exporter {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Exporter {
    /// Sends what is queued (waiting at most a few seconds) and stops.
    pub(crate) async fn shutdown(self) {
        self.stop.cancel();
        if tokio::time::timeout(FLUSH_BOUND, self.task).await.is_err() {
            tracing::warn!("tracing: the last spans were not sent within {FLUSH_BOUND:?}");
        }
    }
}

/// Starts the exporter for `config`; returns the tracer for the ext_proc
/// options and the exporter to shut down. Registers the span counters.
pub(crate) fn start(config: TraceConfig, registry: &mut Registry) -> (Arc<Tracer>, Exporter) {
    let counters = Counters::default();
    registry.register(
        "epp_trace_spans_exported",
        "Spans the collector accepted",
        counters.exported.clone(),
    );
    registry.register(
        "epp_trace_spans_dropped",
        "Spans not exported, by reason: queue_full (the collector is slower than the traffic), export_failed (the collector is unreachable or refused them), shutdown",
        counters.dropped.clone(),
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let tracer = Arc::new(Tracer {
        sampler: config.sampler.clone(),
        queue: tx,
        queued: Arc::clone(&queued),
        max_queue: config.max_queue,
        counters: counters.clone(),
    });
    tracing::info!(
        endpoint = %config.endpoint,
        protocol = ?config.protocol,
        sampler = ?config.sampler,
        service = %config.resource[0].1,
        "tracing: exporting sampled requests' spans over OTLP"
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(
        Batcher {
            client: Client::new(&config),
            resource: resource(&config.resource),
            rx,
            queued,
            counters,
            failing: AtomicBool::new(false),
            max_batch: config.max_batch,
            delay: config.delay,
        }
        .run(stop.clone()),
    );
    (tracer, Exporter { stop, task })
}

/// Collects traces into batches and exports them, one request at a time.
struct Batcher {
    client: Client,
    resource: proto::Resource,
    rx: mpsc::UnboundedReceiver<RequestTrace>,
    queued: Arc<AtomicUsize>,
    counters: Counters,
    failing: AtomicBool,
    max_batch: usize,
    delay: Duration,
}

impl Batcher {
    async fn run(mut self, stop: CancellationToken) {
        let mut batch: Vec<proto::Span> = Vec::new();
        let mut deadline = None;
        loop {
            let timer = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = timer => {
                    self.send(&mut batch).await;
                    deadline = None;
                }
                trace = self.rx.recv() => {
                    let Some(trace) = trace else { break };
                    self.take(trace, &mut batch);
                    deadline.get_or_insert_with(|| tokio::time::Instant::now() + self.delay);
                    if batch.len() >= self.max_batch {
                        self.send(&mut batch).await;
                        deadline = None;
                    }
                }
            }
        }
        // Shutdown: what is queued goes out now.
        self.rx.close();
        while let Ok(trace) = self.rx.try_recv() {
            self.take(trace, &mut batch);
            if batch.len() >= self.max_batch {
                self.send(&mut batch).await;
            }
        }
        self.send(&mut batch).await;
    }

    fn take(&self, trace: RequestTrace, batch: &mut Vec<proto::Span>) {
        self.queued.fetch_sub(trace.spans.len(), Ordering::Relaxed);
        batch.extend(spans(trace));
    }

    async fn send(&self, batch: &mut Vec<proto::Span>) {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::take(batch);
        let n = spans.len();
        let request = proto::ExportTraceServiceRequest {
            resource_spans: vec![proto::ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![proto::ScopeSpans {
                    scope: Some(proto::InstrumentationScope {
                        name: SCOPE.to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                    }),
                    spans,
                }],
            }],
        };
        match self.client.export(request).await {
            Ok(rejected) => {
                let rejected = usize::try_from(rejected).unwrap_or(0).min(n);
                self.counters.exported.inc_by((n - rejected) as u64);
                if rejected > 0 {
                    self.counters.drop_spans("export_failed", rejected);
                }
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("tracing: the collector accepts spans again");
                }
            }
            Err(e) => {
                self.counters.drop_spans("export_failed", n);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "tracing: cannot export spans; dropping them (counted in epp_trace_spans_dropped_total) until the collector answers");
                }
            }
        }
    }
}

/// One OTLP client: gRPC or HTTP.
enum Client {
    Grpc {
        channel: tonic::transport::Channel,
        headers: Vec<(String, String)>,
        timeout: Duration,
    },
    Http {
        client: Box<
            hyper_util::client::legacy::Client<
                hyper_util::client::legacy::connect::HttpConnector,
                Full<Bytes>,
            >,
        >,
        url: Uri,
        headers: Vec<(String, String)>,
        timeout: Duration,
    },
}

impl Client {
    fn new(config: &TraceConfig) -> Self {
        match config.protocol {
            Protocol::Grpc => Self::Grpc {
                // Connects on first use and reconnects after failures.
                channel: tonic::transport::Endpoint::from(config.endpoint.clone())
                    .connect_timeout(config.timeout)
                    .timeout(config.timeout)
                    .connect_lazy(),
                headers: config.headers.clone(),
                timeout: config.timeout,
            },
            Protocol::HttpProtobuf => Self::Http {
                client: Box::new(
                    hyper_util::client::legacy::Client::builder(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .build_http(),
                ),
                url: config.endpoint.clone(),
                headers: config.headers.clone(),
                timeout: config.timeout,
            },
        }
    }

    /// Exports; returns how many spans the collector rejected.
    async fn export(&self, request: proto::ExportTraceServiceRequest) -> Result<i64, String> {
        match self {
            Self::Grpc {
                channel,
                headers,
                timeout,
            } => {
                let mut grpc = tonic::client::Grpc::new(channel.clone());
                grpc.ready().await.map_err(|e| e.to_string())?;
                let mut req = tonic::Request::new(request);
                req.set_timeout(*timeout);
                for (k, v) in headers {
                    if let (Ok(k), Ok(v)) = (
                        k.parse::<tonic::metadata::MetadataKey<_>>(),
                        v.parse::<tonic::metadata::MetadataValue<_>>(),
                    ) {
                        req.metadata_mut().insert(k, v);
                    }
                }
                let codec = tonic_prost::ProstCodec::<
                    proto::ExportTraceServiceRequest,
                    proto::ExportTraceServiceResponse,
                >::default();
                let path = hyper::http::uri::PathAndQuery::from_static(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                );
                let reply = grpc
                    .unary(req, path, codec)
                    .await
                    .map_err(|s| format!("{}: {}", s.code(), s.message()))?;
                Ok(reply
                    .into_inner()
                    .partial_success
                    .map_or(0, |p| p.rejected_spans))
            }
            Self::Http {
                client,
                url,
                headers,
                timeout,
            } => {
                let mut req = hyper::Request::post(url.clone())
                    .header("content-type", "application/x-protobuf");
                for (k, v) in headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let req = req
                    .body(Full::new(Bytes::from(request.encode_to_vec())))
                    .map_err(|e| e.to_string())?;
                let reply = tokio::time::timeout(*timeout, async {
                    let reply = client.request(req).await.map_err(|e| e.to_string())?;
                    let status = reply.status();
                    let body = reply
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| e.to_string())?
                        .to_bytes();
                    Ok::<_, String>((status, body))
                })
                .await
                .map_err(|_| format!("no answer within {timeout:?}"))??;
                if !reply.0.is_success() {
                    return Err(format!("the collector answered {}", reply.0));
                }
                Ok(proto::ExportTraceServiceResponse::decode(reply.1)
                    .ok()
                    .and_then(|r| r.partial_success)
                    .map_or(0, |p| p.rejected_spans))
            }
        }
    }
}

fn resource(attributes: &[(String, String)]) -> proto::Resource {
    proto::Resource {
        attributes: attributes
            .iter()
            .map(|(k, v)| proto::KeyValue {
                key: k.clone(),
                value: Some(value(AttrValue::Str(v.clone()))),
            })
            .collect(),
    }
}

fn value(v: AttrValue) -> proto::AnyValue {
    use proto::Value as V;
    let array = |values: Vec<proto::AnyValue>| V::Array(proto::ArrayValue { values });
    let value = match v {
        AttrValue::Str(s) => V::String(s),
        AttrValue::Int(i) => V::Int(i),
        AttrValue::Float(f) => V::Double(f),
        AttrValue::Bool(b) => V::Bool(b),
        AttrValue::StrList(l) => array(l.into_iter().map(|s| value(AttrValue::Str(s))).collect()),
        AttrValue::FloatList(l) => {
            array(l.into_iter().map(|f| value(AttrValue::Float(f))).collect())
        }
        // A kind added later: its debug form rather than nothing.
        other => V::String(format!("{other:?}")),
    };
    proto::AnyValue { value: Some(value) }
}

/// The OTLP spans of one request.
fn spans(trace: RequestTrace) -> impl Iterator<Item = proto::Span> {
    let RequestTrace {
        trace_id,
        trace_state,
        spans,
    } = trace;
    spans.into_iter().map(move |s| {
        let remote_parent = s.kind == SpanKind::Server;
        proto::Span {
            trace_id: trace_id.to_vec(),
            span_id: s.span_id.to_vec(),
            trace_state: trace_state.clone(),
            parent_span_id: s.parent_span_id.map(|p| p.to_vec()).unwrap_or_default(),
            name: s.name.into_owned(),
            kind: if s.kind == SpanKind::Server { 2 } else { 1 },
            start_time_unix_nano: s.start_unix_nanos,
            end_time_unix_nano: s.end_unix_nanos,
            attributes: s
                .attributes
                .into_iter()
                .map(|(k, v)| proto::KeyValue {
                    key: k.to_owned(),
                    value: Some(value(v)),
                })
                .collect(),
            status: s.error.map(|message| proto::Status { message, code: 2 }),
            // Sampled; bit 8 says whether bit 9 (parent is remote) is known.
            flags: 0x01
                | 0x100
                | if remote_parent && s.parent_span_id.is_some() {
                    0x200
                } else {
                    0
                },
        }
    })
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use epp_extproc::SpanRecord;

    use super::*;

    fn trace(n: usize) -> RequestTrace {
        RequestTrace {
            trace_id: [7; 16],
            trace_state: "k=v".into(),
            spans: (0..n)
                .map(|i| SpanRecord {
                    span_id: [u8::try_from(i + 1).unwrap(); 8],
                    parent_span_id: (i > 0).then_some([9; 8]),
                    name: Cow::Borrowed("s"),
                    kind: if i == 0 {
                        SpanKind::Server
                    } else {
                        SpanKind::Internal
                    },
                    start_unix_nanos: 1,
                    end_unix_nanos: 2,
                    attributes: vec![("a", AttrValue::StrList(vec!["x".into()]))],
                    error: (i == 0).then(|| "failed".into()),
                })
                .collect(),
        }
    }

    #[test]
    fn a_full_queue_drops_whole_traces_and_counts_their_spans() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let counters = Counters::default();
        let tracer = Tracer {
            sampler: config::Sampler::AlwaysOn,
            queue: tx,
            queued: Arc::new(AtomicUsize::new(0)),
            max_queue: 10,
            counters: counters.clone(),
        };
        tracer.export(trace(6));
        tracer.export(trace(6));
        tracer.export(trace(4));
        let dropped = |reason| counters.dropped.get_or_create(&DropLabels { reason }).get();
        assert_eq!(dropped("queue_full"), 6);
        assert_eq!(rx.try_recv().unwrap().spans.len(), 6);
        assert_eq!(rx.try_recv().unwrap().spans.len(), 4);
        assert!(rx.try_recv().is_err());
        assert_eq!(tracer.queued.load(Ordering::Relaxed), 10);
        drop(rx);
        tracer.export(trace(0));
        tracer.export(trace(2));
        assert_eq!(dropped("queue_full"), 8, "still full: nothing was taken");
    }

    #[test]
    fn spans_become_otlp_spans() {
        let out: Vec<proto::Span> = spans(trace(2)).collect();
        assert_eq!(out.len(), 2);
        let (root, child) = (&out[0], &out[1]);
        assert_eq!(root.trace_id, vec![7; 16]);
        assert_eq!(root.trace_state, "k=v");
        assert_eq!(root.kind, 2);
        assert!(root.parent_span_id.is_empty());
        assert_eq!(root.flags, 0x101, "sampled; a root has no remote parent");
        assert_eq!(
            root.status.as_ref().map(|s| (s.code, s.message.as_str())),
            Some((2, "failed"))
        );
        assert_eq!((child.kind, child.parent_span_id.clone()), (1, vec![9; 8]));
        assert_eq!(child.flags, 0x101);
        assert!(child.status.is_none());
        assert_eq!(
            child.attributes[0].value,
            Some(proto::AnyValue {
                value: Some(proto::Value::Array(proto::ArrayValue {
                    values: vec![proto::AnyValue {
                        value: Some(proto::Value::String("x".into()))
                    }]
                }))
            })
        );
        // The server span under a caller's span: the parent is remote.
        let mut t = trace(1);
        t.spans[0].parent_span_id = Some([3; 8]);
        assert_eq!(spans(t).next().unwrap().flags, 0x301);
        // The request survives encoding (that the tags are the schema's, the
        // real collector shows: tests/e2e/tracing.rs).
        let req = proto::ExportTraceServiceRequest {
            resource_spans: vec![proto::ResourceSpans {
                resource: Some(resource(&[("service.name".into(), "epp".into())])),
                scope_spans: vec![proto::ScopeSpans {
                    scope: None,
                    spans: out,
                }],
            }],
        };
        let back =
            proto::ExportTraceServiceRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, req);
    }
}
