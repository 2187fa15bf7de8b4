//! Domain types, plugin traits and the scheduler of the epp-rs endpoint picker.
//!
//! The crate has no I/O and no async runtime: it is the vocabulary every other
//! epp crate speaks. A gateway asks, per inference request, which model-server
//! endpoint should serve it; the [`Scheduler`] answers by running scheduling
//! profiles (filters → weighted scorers → picker) over a consistent
//! [`EndpointSnapshot`].
//!
//! ```
//! use std::sync::Arc;
//! use epp_core::{
//!     Candidate, CycleContext, Endpoint, EndpointMetrics, EndpointSnapshot, InferenceRequest,
//!     Picker, Plugin, PluginRef, Scheduler, SchedulingProfile, Scorer, SingleProfileHandler,
//! };
//!
//! // A scorer preferring the shortest waiting queue, and a picker taking the best total.
//! #[derive(Debug)]
//! struct ShortQueue;
//! impl Plugin for ShortQueue {
//!     fn type_name(&self) -> &str { "short-queue" }
//!     fn name(&self) -> &str { "short-queue" }
//!     fn as_scorer(&self) -> Option<&dyn Scorer> { Some(self) }
//! }
//! impl Scorer for ShortQueue {
//!     fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
//!         for (c, s) in candidates.iter().zip(out.iter_mut()) {
//!             *s = 1.0 / (1.0 + f64::from(c.metrics.waiting));
//!         }
//!     }
//! }
//! #[derive(Debug)]
//! struct Best;
//! impl Plugin for Best {
//!     fn type_name(&self) -> &str { "best" }
//!     fn name(&self) -> &str { "best" }
//!     fn as_picker(&self) -> Option<&dyn Picker> { Some(self) }
//! }
//! impl Picker for Best {
//!     fn pick(&self, _cx: &mut CycleContext<'_>, _c: &[Candidate], scores: &[f64], out: &mut Vec<usize>) {
//!         let best = (0..scores.len()).max_by(|&a, &b| scores[a].total_cmp(&scores[b]));
//!         out.extend(best);
//!     }
//! }
//!
//! let busy = Arc::new(Endpoint::new(0, "10.0.0.1:8000".parse().unwrap()));
//! busy.set_metrics(EndpointMetrics { waiting: 9, ..EndpointMetrics::fresh() });
//! let idle = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
//! idle.set_metrics(EndpointMetrics { waiting: 0, ..EndpointMetrics::fresh() });
//! let snapshot = EndpointSnapshot::new(vec![busy, idle]);
//!
//! let profile = SchedulingProfile::new("default")
//!     .with_scorer(PluginRef::new(Arc::new(ShortQueue)), 1.0)
//!     .with_picker(PluginRef::new(Arc::new(Best)));
//! let scheduler = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default())).unwrap();
//!
//! let request = InferenceRequest::builder("llama").prompt("Hello").build();
//! let result = scheduler.schedule(&request, &snapshot).unwrap();
//! assert_eq!(result.primary().unwrap().addr().to_string(), "10.0.0.2:8000");
//! ```
#![warn(missing_docs)]

mod adapter_inflight;
pub mod config;
mod cycle;
mod dispatch;
mod endpoint;
mod error;
mod extract;
pub mod flow;
mod histogram;
mod kv_events;
mod label_cap;
mod latency;
mod observe;
mod plugin;
mod registry;
pub mod replicas;
mod request;
mod scheduler;
mod shared_index;

pub use adapter_inflight::{AdapterInflight, AdapterTicket};
pub use cycle::{
    Candidate, CycleContext, CycleState, MultimodalMatch, PrefixMatch, PrefixSlot, SinceScrape,
    TokenizedPrompt,
};
pub use dispatch::{Dispatch, InflightAccounting, OutputEstimate, uncached_tokens};
pub use endpoint::{
    CacheGeometry, Endpoint, EndpointId, EndpointMetrics, EndpointRole, EndpointSnapshot,
    EndpointSource, Extensions, InflightCounters, InflightSample, LoraInfo, ROLE_LABEL,
};
pub use error::{Result, SchedulingError};
pub use extract::{EndpointDiscovery, ExtractError, Extractor, MetricsSource, TlsFiles};
pub use histogram::{AtomicHistogram, HistogramValue};
pub use kv_events::{
    BlockStored, ExtraKey, KvEvent, KvEventBatch, KvEventSink, KvEventsConfig, NotificationSource,
    PodDiscoveryConfig,
};
pub use label_cap::{FOLDED_LABEL, LabelCap, MAX_LABEL_VALUES};
pub use latency::{
    DispatchLoad, LEGACY_TPOT_SLO_HEADER, LEGACY_TTFT_SLO_HEADER, LatencyPrediction,
    LatencyPredictions, LatencySlo, ResponseTiming, TPOT_SLO_HEADER, TTFT_SLO_HEADER,
};
pub use observe::{
    CallSite, CycleRecorder, ExtensionPoint, MetricFamily, MetricSink, PluginMetrics, ProfileRun,
    SchedulerObserver,
};
pub use plugin::{
    Admitter, DEFAULT_PREFIX_PRODUCER, DataProducer, Decider, DeferredWork, Filter, Picker, Plugin,
    PluginRef, PreRequest, ProfileHandler, RequestHold, RequestOutcome, RequestParser,
    ResponseHeaderSink, ResponseHooks, RouteEdits, SaturationDetector, Scorer, Topology,
    TopologyLevel,
};
pub use registry::{BuildError, Factory, PluginSpec, Registry, Role};
pub use request::{
    ApiKind, CHARS_PER_TOKEN, InferenceRequest, InferenceRequestBuilder, MediaItem, OPENAI_KINDS,
    Placeholder, PromptRenderer, RenderFuture, RenderService, RenderedPrompt, RequestParsers,
    Usage,
};
pub use scheduler::{
    ProfilePicks, Scheduler, SchedulingProfile, SchedulingResult, Scratch, SingleProfileHandler,
    WeightedScorer,
};
pub use shared_index::{
    HolderCounts, PrefixLookup, PrefixLookupFuture, RedisAddress, SharedBlockIndex,
    SharedIndexSpec, SharedIndexStats, SharedLookupFuture, SharedPrefixMatch, Snapshot,
};
