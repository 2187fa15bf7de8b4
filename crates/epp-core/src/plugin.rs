//! Plugin traits. All are object-safe; a plugin object implements [`Plugin`]
//! and exposes the roles it plays through the `as_*` accessors (never by
//! downcasting).
//!
//! Contract shared by every role: implementations are `Send + Sync`, must not
//! block or perform I/O (async work belongs to the data layer), must not panic,
//! and must not allocate per candidate on the hot path.

use std::{fmt::Debug, sync::Arc};

use crate::{
    Candidate, CycleContext, Endpoint, InferenceRequest, ResponseTiming, SchedulingResult, Usage,
    scheduler::{ProfilePicks, SchedulingProfile},
};

/// Base trait of every plugin.
pub trait Plugin: Send + Sync + Debug {
    /// The YAML `type:` the plugin was built from (e.g. `queue-scorer`).
    fn type_name(&self) -> &str;
    /// The instance name (defaults to the type name in configs).
    fn name(&self) -> &str;

    /// This plugin as a filter.
    fn as_filter(&self) -> Option<&dyn Filter> {
        None
    }
    /// This plugin as a scorer.
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        None
    }
    /// This plugin as a picker.
    fn as_picker(&self) -> Option<&dyn Picker> {
        None
    }
    /// This plugin as a profile handler.
    fn as_profile_handler(&self) -> Option<&dyn ProfileHandler> {
        None
    }
    /// This plugin as a per-cycle data producer.
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        None
    }
    /// This plugin as a pre-request hook (runs after a decision, before forwarding).
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        None
    }
    /// This plugin as response / completion hooks.
    fn as_response_hooks(&self) -> Option<&dyn ResponseHooks> {
        None
    }
    /// This plugin as the holder of work left from decisions for after
    /// their replies went out.
    fn as_deferred_work(&self) -> Option<&dyn DeferredWork> {
        None
    }
    /// This plugin as a request hold (waits before scheduling).
    fn as_request_hold(&self) -> Option<&dyn RequestHold> {
        None
    }
    /// How this plugin asks dispatches to count their tokens in the
    /// endpoints' in-flight counters ([`crate::InflightAccounting`]), if it
    /// does. The scheduler follows the first plugin that answers; without
    /// one, a request's prompt tokens count until its response ends.
    fn inflight_accounting(&self) -> Option<crate::InflightAccounting> {
        None
    }
    /// This plugin as an admitter (admission after data producers).
    fn as_admitter(&self) -> Option<&dyn Admitter> {
        None
    }
    /// This plugin as a saturation detector.
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        None
    }
    /// This plugin as a metrics source (data layer).
    fn as_metrics_source(&self) -> Option<&dyn crate::MetricsSource> {
        None
    }
    /// This plugin as a metrics extractor (data layer).
    fn as_extractor(&self) -> Option<&dyn crate::Extractor> {
        None
    }
    /// As an endpoint-discovery plugin (llm-d's `dataLayer.discovery`).
    fn as_endpoint_discovery(&self) -> Option<&dyn crate::EndpointDiscovery> {
        None
    }
    /// As an event-stream source (`endpoint-notification-source`).
    fn as_notification_source(&self) -> Option<&dyn crate::NotificationSource> {
        None
    }
    /// As a consumer of engines' KV-cache events.
    fn as_kv_event_sink(&self) -> Option<&dyn crate::KvEventSink> {
        None
    }
    /// As a flow-control fairness policy (which flow of a band goes next).
    fn as_fairness_policy(&self) -> Option<&dyn crate::flow::FairnessPolicy> {
        None
    }
    /// As a flow-control ordering policy (which request of a flow goes next).
    fn as_ordering_policy(&self) -> Option<&dyn crate::flow::OrderingPolicy> {
        None
    }
    /// As a flow-control usage-limit policy (how full each band may fill
    /// the pool).
    fn as_usage_limit_policy(&self) -> Option<&dyn crate::flow::UsageLimitPolicy> {
        None
    }
    /// As a cross-replica syncer (llm-d's `crossReplicaSyncerPluginRef`).
    fn as_replica_syncer(&self) -> Option<&dyn crate::replicas::ReplicaSyncer> {
        None
    }
    /// As a peer-discovery plugin (llm-d's `dataLayer.peerDiscovery`).
    fn as_peer_discovery(&self) -> Option<&dyn crate::replicas::PeerDiscovery> {
        None
    }
    /// As a plugin that shares its picks with the other replicas.
    fn as_shares_picks(&self) -> Option<&dyn crate::replicas::SharesPicks> {
        None
    }
    /// The metrics this plugin keeps itself, if any.
    fn as_plugin_metrics(&self) -> Option<&dyn crate::PluginMetrics> {
        None
    }
    /// As a disaggregation decider (whether a request runs an extra stage,
    /// such as a separate prefill).
    fn as_decider(&self) -> Option<&dyn Decider> {
        None
    }
    /// As a source of endpoint locality (host, rack, zone, region).
    fn as_topology(&self) -> Option<&dyn Topology> {
        None
    }
    /// As a request parser (which APIs' bodies are read).
    fn as_request_parser(&self) -> Option<&dyn RequestParser> {
        None
    }
    /// The service this plugin wants prompts rendered by before scheduling
    /// (a token producer's remote backend); the binary creates the
    /// [`crate::PromptRenderer`] and the edge awaits it.
    fn render_service(&self) -> Option<crate::RenderService> {
        None
    }
    /// A renderer this plugin provides itself (a token producer that renders
    /// chat templates in process); the edge awaits it before scheduling, as
    /// it would a [`Self::render_service`]'s client, and prefers it.
    fn prompt_renderer(&self) -> Option<std::sync::Arc<dyn crate::PromptRenderer>> {
        None
    }
    /// The shared index this plugin keeps its blocks in (llm-d's
    /// `redisConfig`): the binary connects to it and hands the store back
    /// through [`Self::bind_shared_index`].
    fn shared_index(&self) -> Option<crate::SharedIndexSpec> {
        None
    }
    /// Receives the store [`Self::shared_index`] asked for.
    fn bind_shared_index(&self, _index: std::sync::Arc<dyn crate::SharedBlockIndex>) {}
    /// A lookup the edge runs for each request before its cycle (in a
    /// shared index), whose answer the plugin reads in the cycle from
    /// [`crate::InferenceRequest::shared_prefix`].
    fn prefix_lookup(&self) -> Option<std::sync::Arc<dyn crate::PrefixLookup>> {
        None
    }

    /// Other plugins this one names in its parameters (llm-d's
    /// `pluginRef` fields), as `(parameter path, plugin name)`, e.g.
    /// `("deciders.prefill", "prefix-based-pd-decider")`. Config loading
    /// resolves each name among the declared plugins (an unknown name is an
    /// error at that parameter) and passes them to [`Self::bind_plugins`].
    fn named_plugins(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Receives the plugins [`Self::named_plugins`] names, in the same
    /// order. Called once, at load, before any request.
    ///
    /// # Errors
    /// `(index, reason)` when the plugin at `index` cannot play the part it
    /// was named for (e.g. it is not a decider).
    fn bind_plugins(&self, _plugins: &[PluginRef]) -> Result<(), (usize, String)> {
        Ok(())
    }

    /// For a plugin that reads prefix-cache matches
    /// ([`crate::CycleState::prefix`]): the name of the plugin it reads them
    /// from (llm-d's `prefixMatchInfoProducerName`, by default
    /// [`DEFAULT_PREFIX_PRODUCER`]). Config loading checks that plugin exists
    /// and produces prefix matches, and makes it the one producer that fills
    /// them.
    fn prefix_match_source(&self) -> Option<&str> {
        None
    }

    /// Binds a prefix-match reader or producer to the cycle's prefix-match
    /// set `slot` ([`crate::CycleState::prefix_at`]; called with `slot ≥ 1`
    /// only, when readers name different producers). Returns whether the
    /// plugin can use a set other than the first; config loading refuses a
    /// config that needs one from a plugin that cannot.
    fn bind_prefix_slot(&self, _slot: usize) -> bool {
        false
    }

    /// For a plugin keeping per-endpoint state that notices by itself when
    /// an endpoint leaves the pool: llm-d wires such plugins as extractors
    /// of `endpoint-notification-source` to hear of deletions; config
    /// loading accepts that wiring (and delivers nothing to it).
    fn follows_endpoint_lifecycle(&self) -> bool {
        false
    }

    /// Whether this plugin reads latency predictions
    /// ([`crate::CycleState::latency`]). Config loading makes sure a plugin
    /// produces them ([`DataProducer::produces_latency_predictions`]),
    /// creating the registry's default latency predictor when none is
    /// declared.
    fn reads_latency_predictions(&self) -> bool {
        false
    }

    /// For a plugin that reads [`crate::EndpointMetrics::custom`]: the key it
    /// reads. Config loading checks an extractor of the data layer fills it
    /// ([`crate::Extractor::custom_metrics`]).
    fn reads_custom_metric(&self) -> Option<&str> {
        None
    }
}

/// The producer prefix-match readers read from unless told otherwise: an
/// `approx-prefix-cache-producer` of that name, created when none is
/// declared (as llm-d does).
pub const DEFAULT_PREFIX_PRODUCER: &str = "approx-prefix-cache-producer";

/// A shared, type-erased plugin.
#[derive(Debug, Clone)]
pub struct PluginRef(pub Arc<dyn Plugin>);

impl PluginRef {
    /// Wraps a plugin.
    #[must_use]
    pub fn new(plugin: Arc<dyn Plugin>) -> Self {
        Self(plugin)
    }

    /// The plugin.
    #[must_use]
    pub fn plugin(&self) -> &dyn Plugin {
        &*self.0
    }
}

/// Removes candidates that must not serve the request.
pub trait Filter: Plugin {
    /// Shrinks `candidates` in place (e.g. with `retain`). Leaving it empty
    /// means no endpoint can serve the request under this profile.
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>);

    /// Appends to `out` (empty on entry) the candidates of `base` that
    /// [`Self::filter`] leaves of a copy of `base`, in order: a profile's
    /// first filter is called this way. The default copies `base` and
    /// filters the copy; a filter that judges each candidate on its own can
    /// copy only those it keeps, sparing the reference counts of the rest
    /// (two per candidate, each way).
    fn filter_from(&self, cx: &mut CycleContext<'_>, base: &[Candidate], out: &mut Vec<Candidate>) {
        out.extend_from_slice(base);
        self.filter(cx, out);
    }
}

/// Rates candidates.
pub trait Scorer: Plugin {
    /// Writes a score in `[0, 1]` for each candidate into `out` (same length
    /// as `candidates`, pre-filled with 0). The profile applies weights and
    /// clamps; scorers never see weights.
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]);
}

/// Chooses endpoints from scored candidates.
pub trait Picker: Plugin {
    /// Appends indices into `candidates` to `out` (empty on entry) in
    /// preference order: the first is the target, the rest are fallbacks.
    /// Indices must be distinct. `scores[i]` is the weighted total of
    /// candidate `i`.
    fn pick(
        &self,
        cx: &mut CycleContext<'_>,
        candidates: &[Candidate],
        scores: &[f64],
        out: &mut Vec<usize>,
    );
}

/// Fills per-cycle state ([`crate::CycleState`]) before filters and scorers run,
/// e.g. prefix-cache matches.
pub trait DataProducer: Plugin {
    /// Computes state for the request over all candidates.
    fn produce(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]);

    /// Whether this producer fills [`crate::CycleState::prefix`].
    fn produces_prefix_matches(&self) -> bool {
        false
    }

    /// Whether this producer fills [`crate::CycleState::latency`].
    fn produces_latency_predictions(&self) -> bool {
        false
    }

    /// Whether this producer fills [`crate::CycleState::tokens`]; such
    /// producers run before all others.
    fn produces_tokens(&self) -> bool {
        false
    }

    /// Whether this producer reads [`crate::CycleState::tokens`].
    fn reads_tokens(&self) -> bool {
        false
    }
}

/// Decides which profiles run and how their results combine.
pub trait ProfileHandler: Plugin {
    /// Checks the declared profiles (by name, in order) suit this handler;
    /// called once at load.
    ///
    /// # Errors
    /// Why they do not (e.g. a required profile is missing).
    fn check_profiles(&self, _names: &[&str]) -> Result<(), String> {
        Ok(())
    }

    /// The next profile (index into `profiles`) to run given the runs so far,
    /// or `None` when done. Called repeatedly. A handler may leave data for
    /// the next profile's plugins in `cx.state` (e.g. the endpoint an earlier
    /// run picked, [`crate::CycleState::peer`]).
    fn next_profile(
        &self,
        cx: &mut CycleContext<'_>,
        profiles: &[SchedulingProfile],
        runs: &[ProfilePicks],
    ) -> Option<usize>;

    /// Which run holds the primary target (index into `runs`), or `None` if
    /// the request cannot be served.
    fn primary(&self, profiles: &[SchedulingProfile], runs: &[ProfilePicks]) -> Option<usize>;

    /// Once the primary is chosen: what the forwarded request carries besides
    /// its destination (headers for the model server's sidecar, another port
    /// on the target, which run picked a prefill endpoint). Does nothing by
    /// default.
    fn route(
        &self,
        _cx: &CycleContext<'_>,
        _profiles: &[SchedulingProfile],
        _runs: &[ProfilePicks],
        _edits: &mut RouteEdits,
    ) {
    }
}

/// What a profile handler adds to a routed request ([`ProfileHandler::route`]).
/// Kept in [`SchedulingResult::edits`]; cleared each cycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteEdits {
    /// Request headers to set (llm-d's `x-prefiller-host-port`,
    /// `x-data-parallel-host-port`, ...).
    pub headers: Vec<(&'static str, String)>,
    /// Forward to this port of each target's address instead of the
    /// target's own port (data parallelism: the rank is named in a header
    /// and the pod's primary port receives the request).
    pub forward_port: Option<u16>,
    /// Index into the runs of the run that picked a prefill endpoint (P/D
    /// disaggregation), so hooks account for the work done there too.
    pub prefill_run: Option<usize>,
    /// Headers the handler owns: a client's own values are dropped before
    /// [`Self::headers`] are set (a client must not name a prefill server).
    pub owned_headers: &'static [&'static str],
}

impl RouteEdits {
    /// Clears for a new cycle, keeping capacity.
    pub fn clear(&mut self) {
        self.headers.clear();
        self.forward_port = None;
        self.prefill_run = None;
        self.owned_headers = &[];
    }
}

/// A request parser (llm-d's `requestHandler.parsers` entries): the APIs it
/// reads. The ext_proc service reads every body itself; parsers decide which
/// paths are read as which API ([`crate::RequestParsers`]).
pub trait RequestParser: Plugin {
    /// The kinds it claims; none: it is the fallback for paths no parser
    /// claims (`passthrough-parser`).
    fn claims(&self) -> &[crate::ApiKind];
}

/// How close two endpoints are, tightest first (llm-d's topology levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TopologyLevel {
    /// The same host (NVLink-class KV transfer).
    Host,
    /// The same rack (one switch).
    Rack,
    /// The same zone (several switch hops).
    Zone,
    /// The same region (between data centres).
    Region,
    /// Nothing in common, or unknown.
    None,
}

/// Where endpoints sit (llm-d's `Topology` attribute and its
/// `topology-extractor`), for plugins that place one pick near another.
pub trait Topology: Plugin {
    /// Whether `e`'s locality is known at all.
    fn known(&self, e: &Endpoint) -> bool;
    /// How close `candidate` is to `peer`; a missing value never matches.
    fn level(&self, peer: &Endpoint, candidate: &Endpoint) -> TopologyLevel;
}

/// Decides whether a request runs an extra scheduling stage (llm-d's
/// disaggregation deciders: a separate prefill, a separate encode).
pub trait Decider: Plugin {
    /// Whether the stage runs. `decode` is the endpoint the decode stage
    /// picked when it ran first. Must not allocate.
    fn disaggregate(&self, cx: &CycleContext<'_>, decode: Option<&Arc<Endpoint>>) -> bool;
}

/// Runs once a decision is made, before the request is forwarded (e.g. record
/// the prompt's prefix blocks for the chosen endpoint, count in-flight load).
pub trait PreRequest: Plugin {
    /// Observes the decision.
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult);
}

/// Work a plugin leaves from its decisions for after their replies are sent
/// (the prefix index's records, when it records after the reply): the
/// decision returns sooner, and the work runs when
/// [`crate::Scheduler::run_deferred`] is called, which a server does once it
/// has written the replies it had. A host that never calls it loses
/// nothing: the plugin does what is left itself, at the latest when its
/// next decision needs the result.
pub trait DeferredWork: Plugin {
    /// Does the work left so far. Cheap (no lock, no system call) when
    /// there is none; may be called from any thread, concurrently.
    fn run_deferred(&self);
}

/// Decides, once the data producers ran and before any profile, whether a
/// request is admitted at all (llm-d's `Admitter`). A refused request is
/// answered by the picker with 429 ([`crate::SchedulingError::NotAdmitted`]).
pub trait Admitter: Plugin {
    /// `Err(reason)` refuses the request. Allocates only when refusing.
    /// `cx` is mutable for its seedable RNG (a probabilistic admitter).
    ///
    /// # Errors
    /// Why the request is refused, for the client's error message.
    fn admit(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) -> Result<(), String>;
}

/// Holds a request for a moment before it is scheduled, so that requests
/// arriving together can be placed together (llm-d's
/// `burst-prefix-cache-producer` waits for its batching window). The edge
/// waits without blocking; a request whose stream ends meanwhile is dropped.
pub trait RequestHold: Plugin {
    /// When `request` may be scheduled: `None` at once, else the instant to
    /// wait for. Called once per request, before scheduling.
    fn hold(
        &self,
        request: &InferenceRequest,
        now: std::time::Instant,
    ) -> Option<std::time::Instant>;
}

/// What happened to a request at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestOutcome {
    /// The model server answered (any status).
    Completed {
        /// HTTP status from the model server.
        status: u16,
    },
    /// The stream ended before a response (client gone, gateway reset).
    Aborted,
}

/// Hooks on the response path, for plugins that learn from responses.
pub trait ResponseHooks: Plugin {
    /// Response headers arrived from `endpoint`.
    fn response_headers(
        &self,
        _request: &InferenceRequest,
        _endpoint: &Endpoint,
        _status: u16,
        _headers: &[(String, String)],
    ) {
    }
    /// Adds headers to the response the client receives (e.g. a session
    /// token naming `endpoint`). Called once per response, right after
    /// [`Self::response_headers`]; a hook with nothing to add does nothing.
    fn add_response_headers(
        &self,
        _request: &InferenceRequest,
        _endpoint: &Endpoint,
        _out: &mut dyn ResponseHeaderSink,
    ) {
    }
    /// Token usage was read from the response body.
    fn response_usage(&self, _request: &InferenceRequest, _endpoint: &Endpoint, _usage: &Usage) {}
    /// The request finished.
    fn request_completed(
        &self,
        _request: &InferenceRequest,
        _endpoint: &Endpoint,
        _outcome: RequestOutcome,
    ) {
    }
    /// The response completed (any status) and this is how long it took,
    /// with the endpoint's load when the request was dispatched: what a
    /// latency model learns from. Called before [`Self::request_completed`];
    /// not called for aborted requests.
    fn response_timing(
        &self,
        _request: &InferenceRequest,
        _endpoint: &Endpoint,
        _timing: &ResponseTiming,
    ) {
    }
}

/// Receives headers a response hook sets on the client's response. The
/// edge (ext_proc) turns them into a header mutation; nothing is allocated
/// unless a hook sets something.
pub trait ResponseHeaderSink {
    /// Sets `name` (lower-case) to `value`, replacing what the model server sent.
    fn set_header(&mut self, name: &str, value: &str);
}

impl ResponseHeaderSink for Vec<(String, String)> {
    fn set_header(&mut self, name: &str, value: &str) {
        self.push((name.to_owned(), value.to_owned()));
    }
}

/// Judges whether the pool is saturated (used to shed sheddable requests and
/// as a filter).
pub trait SaturationDetector: Plugin {
    /// Pool saturation: `>= 1.0` means saturated.
    fn saturation(&self, cx: &CycleContext<'_>, endpoints: &[Candidate]) -> f64;

    /// Whether one endpoint has room for more work.
    fn has_capacity(&self, cx: &CycleContext<'_>, endpoint: &Candidate) -> bool;

    /// How many of `endpoints` [`Self::saturation`] scores as saturated
    /// only because their metrics are missing or stale (fail-closed), for a
    /// detector that judges staleness; `None` (the default) for one that
    /// does not.
    fn stale_endpoints(&self, cx: &CycleContext<'_>, endpoints: &[Candidate]) -> Option<usize> {
        let _ = (cx, endpoints);
        None
    }
}
