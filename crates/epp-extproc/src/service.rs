//! The tonic service: one [`Exchange`] per gRPC stream, driven by a hand-made
//! `Stream` (no task spawned, no channel: replies are produced while tonic
//! polls for the next one).

use std::{
    collections::VecDeque,
    convert::Infallible,
    fmt,
    future::{Future, Ready, ready},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use epp_core::{EndpointSource, Scheduler};
use prometheus_client::registry::Registry;
use tokio_stream::Stream;
use tonic::{
    Request, Response, Status, Streaming,
    body::Body,
    codegen::{Body as HttpBody, Service, StdError, http},
    server::{Grpc, NamedService, StreamingService},
};

use crate::{
    decision::Decider,
    exchange::Exchange,
    metrics::{FlowCollector, MetricGenerations, OpenStream, StreamEnd},
    options::ExtProcOptions,
    wire::{ProcessingRequest, ProcessingResponse},
};

/// The `envoy.service.ext_proc.v3.ExternalProcessor` service.
///
/// Cheap to clone; clones share the scheduler, options and metrics, so a
/// clone kept by the binary can swap the scheduler or options at runtime
/// (config reload) while the server runs.
#[derive(Debug, Clone)]
pub struct ExtProcService {
    pub(crate) decider: Arc<Decider>,
}

impl ExtProcService {
    /// A service scheduling with `scheduler` over the endpoints of `endpoints`.
    #[must_use]
    pub fn new(
        scheduler: Arc<Scheduler>,
        endpoints: Arc<dyn EndpointSource>,
        options: ExtProcOptions,
    ) -> Self {
        Self {
            decider: Arc::new(Decider::new(scheduler, endpoints, options)),
        }
    }

    /// Replaces the scheduler; streams already past their decision keep the
    /// one that routed them (for their response hooks).
    pub fn set_scheduler(&self, scheduler: Arc<Scheduler>) {
        self.decider.scheduler.store(scheduler);
    }

    /// The current scheduler.
    #[must_use]
    pub fn scheduler(&self) -> Arc<Scheduler> {
        self.decider.scheduler.load_full()
    }

    /// Replaces the options; new streams use them.
    pub fn set_options(&self, options: ExtProcOptions) {
        self.decider.options.store(Arc::new(options));
    }

    /// The current options.
    #[must_use]
    pub fn options(&self) -> Arc<ExtProcOptions> {
        self.decider.options.load_full()
    }

    /// Keeps sampled decisions in `log` from now on (`None`: stops), for a
    /// view of why requests went where they did ([`crate::DecisionLog`]).
    pub fn set_decision_log(&self, log: Option<Arc<crate::DecisionLog>>) {
        self.decider.decision_log.store(log);
    }

    /// Registers the per-request, ext_proc stream and flow-control metrics
    /// in `registry` under every generation of names
    /// ([`MetricGenerations::ALL`]).
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.register_metrics_as(registry, MetricGenerations::ALL);
    }

    /// Registers the per-request, ext_proc stream and flow-control metrics
    /// in `registry` under the names of `generations` (each fed by the same
    /// observations). Flow control's pool-level series (saturation, band
    /// utilisation, stale endpoints) are read from the running controller
    /// at each scrape, labelled with [`ExtProcOptions::pool_name`].
    pub fn register_metrics_as(&self, registry: &mut Registry, generations: MetricGenerations) {
        self.decider.metrics.register(registry, generations);
        registry.register_collector(Box::new(FlowCollector {
            metrics: Arc::clone(&self.decider.flow_metrics),
            decider: Arc::downgrade(&self.decider),
            generations,
        }));
    }

    /// The tonic service to mount (`Server::builder().add_service(...)`),
    /// for an embedder serving other gRPC services on the same port.
    /// Message size limits are lifted: the body limit is
    /// [`ExtProcOptions::max_body_bytes`], answered with a 413. Serving
    /// ext_proc alone, [`Self::serve_incoming`] costs fewer instructions per
    /// request (no per-stream task or body channel).
    #[must_use]
    pub fn into_server(self) -> ExtProcServer {
        ExtProcServer { service: self }
    }
}

/// The gRPC service `envoy.service.ext_proc.v3.ExternalProcessor`, method
/// `Process`, over epp's own message types (`wire.rs`): request bodies are
/// slices of the receive buffer, replies are encoded straight from them, and
/// the replies one message produces leave in one write.
#[derive(Debug, Clone)]
pub struct ExtProcServer {
    service: ExtProcService,
}

/// The one method's path.
pub(crate) const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

impl NamedService for ExtProcServer {
    const NAME: &'static str = "envoy.service.ext_proc.v3.ExternalProcessor";
}

impl<B> Service<http::Request<B>> for ExtProcServer
where
    B: HttpBody + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PROCESS_PATH {
            return Box::pin(ready(Ok(unimplemented())));
        }
        let method = Process(Arc::clone(&self.service.decider));
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::<
                ProcessingResponse,
                ProcessingRequest,
            >::default())
            .apply_max_message_size_config(Some(usize::MAX), Some(usize::MAX));
            Ok(grpc.streaming(method, req).await)
        })
    }
}

/// gRPC `UNIMPLEMENTED` for any other path.
fn unimplemented() -> http::Response<Body> {
    let mut response = http::Response::new(Body::default());
    let headers = response.headers_mut();
    headers.insert(
        Status::GRPC_STATUS,
        http::HeaderValue::from(tonic::Code::Unimplemented as i32),
    );
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The `Process` method: one [`ProcessStream`] per gRPC stream.
struct Process(Arc<Decider>);

impl StreamingService<ProcessingRequest> for Process {
    type Response = ProcessingResponse;
    type ResponseStream = ProcessStream;
    type Future = Ready<Result<Response<ProcessStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<ProcessingRequest>>) -> Self::Future {
        let exchange = Exchange::new(Arc::clone(&self.0));
        let stream = self.0.metrics.stream_opened(exchange.started());
        ready(Ok(Response::new(ProcessStream {
            inbound: request.into_inner(),
            exchange,
            pending: VecDeque::with_capacity(4),
            done: false,
            stream,
        })))
    }
}

/// The reply stream of one ext_proc exchange. Dropping it (stream reset)
/// releases what the request holds (in-flight counters) exactly once.
pub(crate) struct ProcessStream {
    inbound: Streaming<ProcessingRequest>,
    exchange: Exchange,
    pending: VecDeque<ProcessingResponse>,
    done: bool,
    /// Counted open until dropped (last: after the exchange's accounting).
    stream: OpenStream,
}

impl fmt::Debug for ProcessStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessStream")
            .field("exchange", &self.exchange)
            .field("pending", &self.pending.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl ProcessStream {
    /// Nothing more is read; the stream ends (after the replies left)
    /// this way.
    fn finish(&mut self, end: StreamEnd) {
        self.done = true;
        self.stream.end(end);
    }
}

impl Stream for ProcessStream {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(reply) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(reply)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            // A request waiting in flow control first (its replies, if it
            // left the queue); Envoy's messages are still read meanwhile so
            // a reset or end removes it from its queue at once.
            if this.exchange.poll_wait(cx, &mut this.pending) {
                if this.exchange.is_closed() {
                    this.finish(StreamEnd::Ok);
                }
                continue;
            }
            match Pin::new(&mut this.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(msg))) => {
                    this.exchange.handle(msg, &mut this.pending);
                    if this.exchange.is_closed() {
                        // Answered locally: send the reply and end the stream.
                        this.finish(StreamEnd::Ok);
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    tracing::debug!(%status, "ext_proc stream broken");
                    this.exchange.abandon();
                    this.finish(StreamEnd::read_failed(status.code()));
                }
                Poll::Ready(None) => {
                    this.exchange.end();
                    this.finish(StreamEnd::Ok);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
