//! The tonic service: one [`Exchange`] per gRPC stream, driven by a hand-made
//! `Stream` (no task spawned, no channel: replies are produced while tonic
//! polls for the next one).

use std::{
    collections::VecDeque,
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse,
    external_processor_server::{ExternalProcessor, ExternalProcessorServer},
};
use epp_core::{EndpointSource, Scheduler};
use prometheus_client::registry::Registry;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::{decision::Decider, exchange::Exchange, options::ExtProcOptions};

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

    /// Registers the per-request metrics (REFERENCE §7 names:
    /// `inference_objective_*` and
    /// `inference_extension_scheduler_e2e_duration_seconds`) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.decider.metrics.register(registry);
        self.decider.flow_metrics.register(registry);
    }

    /// The tonic server to mount (`Server::builder().add_service(...)`).
    /// Message size limits are lifted: the body limit is
    /// [`ExtProcOptions::max_body_bytes`], answered with a 413.
    #[must_use]
    pub fn into_server(self) -> ExternalProcessorServer<Self> {
        ExternalProcessorServer::new(self)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
}

#[tonic::async_trait]
impl ExternalProcessor for ExtProcService {
    type ProcessStream = ProcessStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        Ok(Response::new(ProcessStream {
            inbound: request.into_inner(),
            exchange: Exchange::new(Arc::clone(&self.decider)),
            pending: VecDeque::with_capacity(4),
            done: false,
        }))
    }
}

/// The reply stream of one ext_proc exchange. Dropping it (stream reset)
/// releases what the request holds (in-flight counters) exactly once.
pub struct ProcessStream {
    inbound: Streaming<ProcessingRequest>,
    exchange: Exchange,
    pending: VecDeque<ProcessingResponse>,
    done: bool,
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
                    this.done = true;
                }
                continue;
            }
            match Pin::new(&mut this.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(msg))) => {
                    this.exchange.handle(msg, &mut this.pending);
                    if this.exchange.is_closed() {
                        // Answered locally: send the reply and end the stream.
                        this.done = true;
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    tracing::debug!(%status, "ext_proc stream broken");
                    this.exchange.abandon();
                    this.done = true;
                }
                Poll::Ready(None) => {
                    this.exchange.end();
                    this.done = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
