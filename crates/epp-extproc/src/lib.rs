//! The Envoy external-processing (`ext_proc`) service of the epp-rs endpoint
//! picker.
//!
//! Envoy opens one bidirectional gRPC stream per HTTP request. The service
//! reads the request headers and body (BUFFERED or FULL_DUPLEX_STREAMED),
//! parses the body without re-serialising it, asks the [`epp_core::Scheduler`]
//! for an endpoint, and answers with the `x-gateway-destination-endpoint`
//! header plus `envoy.lb` dynamic metadata (primary first, then fallbacks).
//! On the way back it reads the status and token usage (plain JSON or SSE),
//! feeds the scheduler's response hooks, keeps the endpoints' in-flight
//! counters, and writes the client-facing model name back when the model was
//! rewritten. Refusals are `ImmediateResponse`s with a JSON error body
//! (400, 413, 429, 503).
//!
//! ```
//! use epp_core::ApiKind;
//! use epp_extproc::{parse_body, splice_model};
//!
//! let body = br#"{"model":"llama","messages":[{"role":"user","content":"Hi"}],"n":12345678901234567890}"#;
//! let parsed = parse_body(ApiKind::ChatCompletions, body).unwrap();
//! assert_eq!(parsed.model, "llama");
//! assert_eq!(parsed.prompt, "user:\nHi\n");
//! // A model rewrite splices only the model value; every other byte stays.
//! let rewritten = splice_model(body, &parsed.model_span, "llama-lora");
//! assert_eq!(
//!     std::str::from_utf8(&rewritten).unwrap(),
//!     r#"{"model":"llama-lora","messages":[{"role":"user","content":"Hi"}],"n":12345678901234567890}"#
//! );
//! ```
//!
//! Serving it on its own HTTP/2 server (the binary adds TLS, health and the
//! drain before shutdown): one task per connection, the streams polled
//! inside it ([`ExtProcService::serve_incoming`],
//! [`ExtProcService::serve_connection`]).
//!
//! ```no_run
//! # async fn serve(scheduler: std::sync::Arc<epp_core::Scheduler>,
//! #                endpoints: std::sync::Arc<dyn epp_core::EndpointSource>) {
//! use tokio_stream::{StreamExt, wrappers::TcpListenerStream};
//!
//! let service = epp_extproc::ExtProcService::new(scheduler, endpoints, Default::default());
//! let mut registry = prometheus_client::registry::Registry::default();
//! service.register_metrics(&mut registry);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9002").await.unwrap();
//! let incoming = TcpListenerStream::new(listener)
//!     .map(|conn| conn.inspect(|tcp| tcp.set_nodelay(true).unwrap_or_default()));
//! // Until Ctrl-C, then GOAWAY and the streams in flight finish.
//! let stop = async {
//!     tokio::signal::ctrl_c().await.ok();
//! };
//! service
//!     .serve_incoming(incoming, epp_extproc::H2Options::default(), stop)
//!     .await;
//! # }
//! ```
//!
//! Or mounted on a tonic router, beside other gRPC services:
//!
//! ```no_run
//! # async fn serve(service: epp_extproc::ExtProcService) {
//! tonic::transport::Server::builder()
//!     .add_service(service.into_server())
//!     .serve("127.0.0.1:9002".parse().unwrap())
//!     .await
//!     .unwrap();
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod body;
mod decision;
mod decision_log;
mod error;
mod exchange;
mod flow;
mod metrics;
mod options;
mod proto;
mod restore;
mod server;
mod service;
mod trace;
mod usage;
mod wire;

pub use body::{ParsedBody, parse_body, rewrite_model_field, splice_model};
pub use decision::{
    CONTROL_HEADERS, DESTINATION_HEADER, DESTINATION_NAMESPACE, FAIRNESS_HEADER,
    LLM_D_FAIRNESS_HEADER, LLM_D_MODEL_REWRITE_HEADER, LLM_D_OBJECTIVE_HEADER,
    MODEL_REWRITE_HEADER, OBJECTIVE_HEADER, SERVED_KEY, SUBSET_KEY, SUBSET_NAMESPACE,
    UPSTREAM_ADDRESS_ATTRIBUTE,
};
pub use decision_log::{
    CandidateRecord, DecisionLog, DecisionRecord, EndpointRef, Excluded, PluginId, Refusal,
    RunRecord, ScorerId,
};
pub use epp_core::FOLDED_LABEL;
pub use error::{DROPPED_REASON_HEADER, ExtProcError, Result};
pub use flow::{EXPECTED_TIMEOUT_HEADER, FOLDED_FAIRNESS_ID};
pub use metrics::MetricGenerations;
pub use options::{BodyMode, ExtProcOptions, ModelRewrite, ObjectivePriority};
pub use restore::ModelRestorer;
pub use server::{H2Options, ServeError};
pub use service::{ExtProcServer, ExtProcService};
pub use trace::{
    AttrValue, RequestTrace, RequestTracer, SpanKind, SpanRecord, TRACEPARENT_HEADER,
    TRACESTATE_HEADER, TraceParent,
};
pub use usage::UsageReader;
