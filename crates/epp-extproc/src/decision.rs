//! The routing decision for one request, as a plain value: no protobuf, no
//! gRPC. The ext_proc state machine (`exchange.rs`) collects headers and
//! body, asks [`Decider::decide`], and encodes the [`Decision`] for Envoy.
//!
//! A decision runs in stages, each a method of its own:
//! 1. [`Decider::prepare`]: parse the body, apply the model rewrite, read
//!    the objective and fairness headers → an [`InferenceRequest`].
//! 2. [`Decider::route`]: schedule over the current endpoints, commit the
//!    pick as an [`epp_core::Dispatch`] (the endpoint's in-flight counters
//!    count it from here), and say how the request must be changed: headers
//!    to set and remove, the body spliced when the model was rewritten.
//!
//! Flow control is a stage between the two ([`Decider::start`] queues the
//! prepared request when it runs, `crate::flow` holds the wait, and
//! [`Decider::finish_wait`] routes or refuses it once it leaves the queue);
//! a disaggregated (prefill/decode) decision is a `route` that makes two
//! picks and adds a header.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    ops::Range,
    sync::Arc,
    time::Instant,
};

use arc_swap::{ArcSwap, ArcSwapOption};
use epp_core::{
    ApiKind, Dispatch, EndpointSnapshot, EndpointSource, InferenceRequest, Scheduler,
    SchedulingError,
};

use crate::{
    body::{ParsedBody, parse_body, splice_model},
    decision_log::{CycleDetail, DecisionLog, DecisionRecord, Recorders},
    error::ExtProcError,
    flow::{Admitted, Controllers, FlowKick, Waited, Waiting},
    metrics::{FlowMetrics, Metrics, RequestSeries},
    options::ExtProcOptions,
    trace::{ActiveTrace, AttrValue, CycleEvents, TRACEPARENT_HEADER, TRACESTATE_HEADER},
};

/// Header carrying the chosen endpoint (and the `envoy.lb` metadata key).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Dynamic-metadata namespace Envoy's load balancer reads.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// Metadata key (in [`DESTINATION_NAMESPACE`], on the response) where the
/// gateway reports the endpoint that really served the request.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// Envoy attribute (`response_attributes` of the ext_proc filter) naming the
/// upstream host, read when the gateway does not set [`SERVED_KEY`].
pub const UPSTREAM_ADDRESS_ATTRIBUTE: &str = "upstream.address";
/// Metadata namespace of the gateway's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// Metadata key of the subset hint (a list of `ip:port`).
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Header overriding the model a request is routed for (the Gateway API
/// Inference Extension's name; llm-d's is [`LLM_D_MODEL_REWRITE_HEADER`]).
pub const MODEL_REWRITE_HEADER: &str = "x-gateway-model-name-rewrite";
/// Header naming the request's objective (→ priority) (llm-d:
/// [`LLM_D_OBJECTIVE_HEADER`]).
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// Header naming the request's fairness flow (llm-d:
/// [`LLM_D_FAIRNESS_HEADER`]).
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
/// llm-d's name for [`MODEL_REWRITE_HEADER`], read first when both are sent
/// (llm-d keeps the Gateway API names as deprecated aliases).
pub const LLM_D_MODEL_REWRITE_HEADER: &str = "x-llm-d-model-name-rewrite";
/// llm-d's name for [`OBJECTIVE_HEADER`], read first.
pub const LLM_D_OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";
/// llm-d's name for [`FAIRNESS_HEADER`], read first.
pub const LLM_D_FAIRNESS_HEADER: &str = "x-llm-d-inference-fairness-id";
/// Control headers removed before the request is forwarded: both names of
/// each.
pub const CONTROL_HEADERS: [&str; 6] = [
    LLM_D_MODEL_REWRITE_HEADER,
    MODEL_REWRITE_HEADER,
    LLM_D_OBJECTIVE_HEADER,
    OBJECTIVE_HEADER,
    LLM_D_FAIRNESS_HEADER,
    FAIRNESS_HEADER,
];

/// The fairness flow of requests that name none.
const DEFAULT_FLOW: &str = "default-flow";

/// What the edge learnt of a request before its body: headers (names
/// lower-case, pseudo-headers included) and the gateway's subset hint.
#[derive(Debug, Default)]
pub(crate) struct RequestParts {
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) subset: Option<Vec<String>>,
}

impl RequestParts {
    /// The value of header `name` (lower-case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The request path (`:path`, or the gateway's original path).
    pub(crate) fn path(&self) -> &str {
        [":path", "x-original-path", "x-forwarded-path"]
            .iter()
            .find_map(|h| self.header(h).filter(|v| !v.is_empty()))
            .unwrap_or("")
    }

    /// The client's `x-request-id`, if it sent one.
    pub(crate) fn request_id(&self) -> Option<&str> {
        self.header("x-request-id").filter(|v| !v.is_empty())
    }
}

/// A request understood and not yet scheduled.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) request: InferenceRequest,
    /// Where the body's `model` value is (empty for a body-less request).
    model_span: Range<usize>,
    /// The request id was made here (the client sent none): forward it.
    generated_id: bool,
    /// A body was parsed (the request is not headers-only).
    has_body: bool,
}

/// The outcome of deciding one request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Send the request on, changed as said.
    Route(Box<Route>),
    /// Answer locally with the error's status and JSON body.
    Reject(ExtProcError),
}

/// A routed request and the changes to forward it with.
#[derive(Debug)]
pub(crate) struct Route {
    /// The committed pick: holds the target's in-flight count until the
    /// response completes or the route is dropped.
    pub(crate) dispatch: Dispatch,
    /// Where the gateway sends the request when not to the pick's own
    /// address (`ip:forward_port`; data parallelism).
    pub(crate) destination: Option<String>,
    /// The port every target is reached on instead of its own.
    pub(crate) forward_port: Option<u16>,
    /// Target then fallbacks, `ip:port` comma-separated (Envoy's
    /// `envoy.lb` metadata value).
    pub(crate) targets: String,
    /// Headers to set besides the destination (see [`Route::set_headers`]):
    /// empty unless an id is generated or the body rewritten.
    pub(crate) extra_headers: Vec<(&'static str, String)>,
    /// Control headers to remove before forwarding.
    pub(crate) remove_headers: Vec<&'static str>,
    /// The body to forward.
    pub(crate) body: BodyEdit,
    /// The model the client asked for, when the body was rewritten to another:
    /// the response's `model` is restored to it.
    pub(crate) restore_model: Option<String>,
    /// The request's metric series.
    pub(crate) series: Arc<RequestSeries>,
    /// Kicks flow control when the request ends (`None`: flow control off).
    pub(crate) flow_kick: Option<FlowKick>,
}

impl Route {
    /// Every header to set: the destination first, then the extra ones.
    pub(crate) fn set_headers(&self) -> impl Iterator<Item = (&str, &str)> {
        let destination = self
            .destination
            .as_deref()
            .unwrap_or_else(|| self.dispatch.endpoint().addr_str());
        std::iter::once((DESTINATION_HEADER, destination))
            .chain(self.extra_headers.iter().map(|(k, v)| (*k, v.as_str())))
    }
}

/// What happens to the request body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyEdit {
    /// Forwarded byte for byte.
    Unchanged,
    /// Replaced by these bytes (the model value spliced).
    Replace(Vec<u8>),
}

/// Decides requests: the scheduler, the endpoints, the options and the
/// metrics shared by every stream. Swapping the scheduler or options
/// affects decisions made after the swap only.
pub(crate) struct Decider {
    pub(crate) scheduler: ArcSwap<Scheduler>,
    pub(crate) endpoints: Arc<dyn EndpointSource>,
    pub(crate) options: ArcSwap<ExtProcOptions>,
    pub(crate) metrics: Metrics,
    /// The flow controllers (none runs unless the `flowControl` gate is on).
    pub(crate) flow: Controllers,
    pub(crate) flow_metrics: Arc<FlowMetrics>,
    /// Where sampled decisions are kept for the decision view (none: off).
    pub(crate) decision_log: ArcSwapOption<DecisionLog>,
}

/// The first step of a decision: decided, or waiting in flow control.
#[derive(Debug)]
pub(crate) enum Started {
    Decided(Decision),
    Queued(Box<Waiting>),
}

impl fmt::Debug for Decider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decider")
            .field("endpoints", &self.endpoints)
            .field("options", &self.options.load())
            .finish_non_exhaustive()
    }
}

impl Decider {
    /// A decider over `endpoints` with no metrics registered yet.
    pub(crate) fn new(
        scheduler: Arc<Scheduler>,
        endpoints: Arc<dyn EndpointSource>,
        options: ExtProcOptions,
    ) -> Self {
        let metrics = Metrics::default();
        Self {
            scheduler: ArcSwap::new(scheduler),
            endpoints,
            options: ArcSwap::from_pointee(options),
            flow_metrics: Arc::new(FlowMetrics::with_caps(
                metrics.fairness_ids(),
                metrics.models(),
            )),
            metrics,
            flow: Controllers::default(),
            decision_log: ArcSwapOption::empty(),
        }
    }

    /// Decides a request as [`Self::decide`] does, unless flow control
    /// runs: then the prepared request is queued (`received`: when the
    /// exchange began) and [`Self::finish_wait`] decides it once it leaves
    /// the queue.
    pub(crate) fn start(
        &self,
        options: &ExtProcOptions,
        parts: &mut RequestParts,
        body: Option<&[u8]>,
        received: Instant,
        trace: Option<&mut ActiveTrace>,
    ) -> Started {
        let holds = self.scheduler.load().holds_requests();
        if self.flow.current().is_none()
            && !holds
            && options.renderer.is_none()
            && options.prefix_lookup.is_none()
        {
            return Started::Decided(self.decide(options, parts, body, trace));
        }
        let mut prepared = match self.prepare(options, parts, body) {
            Ok(p) => p,
            Err(e) => {
                return Started::Decided(self.reject(e, parts.request_id().unwrap_or(""), None));
            }
        };
        // The prompt's token ids first, when the engine renders them (and
        // the client did not send ids).
        if prepared.request.prompt_token_ids.is_none()
            && let (Some(renderer), Some(b)) = (&options.renderer, body)
            && let Some(render) =
                renderer.render(prepared.request.api, b, prepared.request.media_parts)
        {
            return Started::Queued(Box::new(Waiting::rendering(
                prepared,
                render,
                options.prefix_lookup.clone(),
            )));
        }
        // Then the shared prefix index, when one is configured: a completions
        // prompt is tokenized here for it (in process, no I/O), else the
        // cycle would tokenize it after the lookup and match it in this
        // replica's own view only.
        if options.prefix_lookup.is_some()
            && prepared.request.prompt_token_ids.is_none()
            && prepared.request.api == ApiKind::Completions
            && let Some(renderer) = &options.renderer
        {
            prepared.request.prompt_token_ids = renderer.tokenize_prompt(&prepared.request.prompt);
        }
        if let Some(lookup) = options
            .prefix_lookup
            .as_ref()
            .and_then(|l| l.lookup(&prepared.request))
        {
            return Started::Queued(Box::new(Waiting::looking_up(prepared, lookup)));
        }
        self.resume(prepared, received, parts.subset.as_deref(), body, trace)
    }

    /// Takes a prepared request on from its render: any plugin hold, then
    /// flow control, then routing.
    pub(crate) fn resume(
        &self,
        prepared: Prepared,
        received: Instant,
        subset: Option<&[String]>,
        body: Option<&[u8]>,
        trace: Option<&mut ActiveTrace>,
    ) -> Started {
        let holds = self.scheduler.load().holds_requests();
        // A plugin's hold (a batching window) comes first; with flow control
        // on, requests are not held (they leave the queue one by one).
        if holds
            && self.flow.current().is_none()
            && let Some(until) = self
                .scheduler
                .load()
                .hold_until(&prepared.request, Instant::now())
        {
            return Started::Queued(Box::new(Waiting::held(prepared, until)));
        }
        if self.flow.current().is_none() {
            return Started::Decided(self.route(prepared, subset, body, trace));
        }
        match self.admit(prepared, received) {
            Admitted::Now(p) => Started::Decided(self.route(p, subset, body, trace)),
            Admitted::Refused(p, e) => Started::Decided(self.refuse_unscheduled(e, &p.request)),
            Admitted::Queued(w) => Started::Queued(Box::new(w)),
        }
    }

    /// Decides a request that left the flow-control queue.
    pub(crate) fn finish_wait(
        &self,
        waited: Waited,
        subset: Option<&[String]>,
        body: Option<&[u8]>,
        trace: Option<&mut ActiveTrace>,
    ) -> Decision {
        match waited {
            Waited::Released(prepared, mut release) => {
                let in_flight = release.in_flight();
                let mut decision = self.route(prepared, subset, body, trace);
                if let Decision::Route(route) = &mut decision
                    && let Some(kick) = &mut route.flow_kick
                {
                    // Its flow counts it in flight until the response ends.
                    kick.hold(in_flight);
                }
                // Routed (or refused): the next request may be released.
                drop(release);
                decision
            }
            Waited::Evicted(prepared, err) => self.refuse_unscheduled(err, &prepared.request),
            Waited::Held(prepared) => self.route(prepared, subset, body, trace),
            // The exchange resumes a rendered request ([`Self::resume`]).
            Waited::Rendered(prepared) => self.route(prepared, subset, body, trace),
        }
    }

    /// Decides a request whose headers are `parts` and whose whole body is
    /// `body` (`None`: a request without a body). Takes the headers. A
    /// recorded request's `trace` gets the decision's spans.
    pub(crate) fn decide(
        &self,
        options: &ExtProcOptions,
        parts: &mut RequestParts,
        body: Option<&[u8]>,
        mut trace: Option<&mut ActiveTrace>,
    ) -> Decision {
        let started = trace.is_some().then(Instant::now);
        let decision = match self.prepare(options, parts, body) {
            Ok(prepared) => self.route(
                prepared,
                parts.subset.as_deref(),
                body,
                trace.as_deref_mut(),
            ),
            Err(e) => self.reject(e, parts.request_id().unwrap_or(""), None),
        };
        if let (Some(t), Some(start)) = (trace, started) {
            let error = match &decision {
                Decision::Route(route) => {
                    let a = &mut t.orchestration_attributes;
                    a.push(("llm_d.epp.outcome", AttrValue::Str("routed".into())));
                    a.push((
                        "llm_d.epp.picked_endpoint",
                        AttrValue::Str(route.dispatch.endpoint().addr_str().to_owned()),
                    ));
                    a.push((
                        "llm_d.epp.fallback_endpoints",
                        AttrValue::StrList(
                            route
                                .targets
                                .split(',')
                                .skip(1)
                                .map(str::to_owned)
                                .collect(),
                        ),
                    ));
                    None
                }
                Decision::Reject(err) => {
                    let a = &mut t.orchestration_attributes;
                    a.push(("llm_d.epp.outcome", AttrValue::Str("rejected".into())));
                    a.push((
                        "http.response.status_code",
                        AttrValue::Int(i64::from(err.http_status())),
                    ));
                    Some(err.to_string())
                }
            };
            t.orchestrated(start, error);
        }
        decision
    }

    /// Stage 1: the scheduler's view of the request. Takes the headers.
    ///
    /// # Errors
    /// A body that is not a JSON object with a `model` (400).
    pub(crate) fn prepare(
        &self,
        options: &ExtProcOptions,
        parts: &mut RequestParts,
        body: Option<&[u8]>,
    ) -> Result<Prepared, ExtProcError> {
        let api = options.parsers.route(parts.path()).ok_or_else(|| {
            ExtProcError::BadBody(format!(
                "no request parser of this picker reads path {:?}",
                parts.path()
            ))
        })?;
        let parsed = match body {
            Some(b) => parse_body(api, b)?,
            None => ParsedBody::default(),
        };
        let headers = std::mem::take(&mut parts.headers);
        // llm-d's name first, then the Gateway API's.
        let nonempty = |names: [&str; 2]| {
            names
                .into_iter()
                .find_map(|name| header(&headers, name).filter(|v| !v.is_empty()))
        };
        let model = parsed.model;
        let target_model = match nonempty([LLM_D_MODEL_REWRITE_HEADER, MODEL_REWRITE_HEADER]) {
            Some(t) => {
                if t != model {
                    self.metrics.rewritten("header", &model, t);
                }
                t.to_owned()
            }
            None => match options
                .model_rewrite
                .as_ref()
                .and_then(|r| r.rewrite(&model, &headers))
            {
                Some(t) => {
                    if t != model {
                        self.metrics.rewritten("rule", &model, &t);
                    }
                    t
                }
                None => model.clone(),
            },
        };
        let objective = nonempty([LLM_D_OBJECTIVE_HEADER, OBJECTIVE_HEADER]).map(str::to_owned);
        let priority = objective
            .as_ref()
            .and_then(|o| match &options.objective_priority {
                Some(live) => live.priority(o),
                None => options.objectives.get(o).copied(),
            })
            .unwrap_or(0);
        let fairness_id = nonempty([LLM_D_FAIRNESS_HEADER, FAIRNESS_HEADER])
            .unwrap_or(DEFAULT_FLOW)
            .to_owned();
        let (request_id, generated_id) =
            match header(&headers, "x-request-id").filter(|v| !v.is_empty()) {
                Some(id) => (id.to_owned(), false),
                None => (new_request_id(), true),
            };
        Ok(Prepared {
            request: InferenceRequest {
                request_id,
                model,
                target_model,
                api,
                headers,
                prompt: parsed.prompt,
                cache_salt: parsed.cache_salt,
                stream: parsed.stream,
                priority,
                objective,
                fairness_id,
                max_tokens: parsed.max_tokens,
                subset: None,
                body_len: body.map_or(0, <[u8]>::len),
                media_parts: parsed.media_parts,
                prompt_token_ids: parsed.token_ids,
                media_items: Vec::new(),
                shared_prefix: None,
            },
            model_span: parsed.model_span,
            generated_id,
            has_body: body.is_some(),
        })
    }

    /// Stage 2: schedules the prepared request over the current endpoints
    /// (limited to `subset` when the gateway gave one) and commits the pick.
    /// `body` is the one `prepare` parsed.
    pub(crate) fn route(
        &self,
        prepared: Prepared,
        subset: Option<&[String]>,
        body: Option<&[u8]>,
        mut trace: Option<&mut ActiveTrace>,
    ) -> Decision {
        let Prepared {
            mut request,
            model_span,
            generated_id,
            has_body,
        } = prepared;
        let scheduler = self.scheduler.load_full();
        let snapshot = self.endpoints.snapshot();
        request.subset = subset.map(|s| resolve_subset(s, &snapshot));

        let t0 = Instant::now();
        let log = self.decision_log.load();
        let mut detail = log
            .as_deref()
            .filter(|log| log.claim(t0))
            .map(|_| CycleDetail::default());
        let mut events = trace.is_some().then(CycleEvents::default);
        let result = if events.is_none() && detail.is_none() {
            scheduler.schedule(&request, &snapshot)
        } else {
            let mut recorders = Recorders {
                events: events.as_mut(),
                detail: detail.as_mut(),
            };
            scheduler.schedule_recorded(&request, &snapshot, &mut recorders)
        };
        let took = t0.elapsed();
        // Kept once the outcome is known (refused or routed, below).
        let mut view = detail
            .map(|d| d.into_record(&scheduler, &snapshot, &request, result.as_ref().ok(), took));
        self.metrics.scheduling_took(took);
        let primary = result.as_ref().ok().and_then(|r| r.primary());
        self.metrics
            .attempt(&request.target_model, primary.map(|e| &**e));
        if let Ok(r) = &result {
            self.metrics
                .prefix_match(r.primary_prefix_hit, request.prompt.len());
        }
        if let (Some(t), Some(events)) = (trace.as_deref_mut(), &events) {
            t.note_request(&request);
            let mut attrs = vec![(
                "llm_d.epp.scheduling.candidate_endpoints",
                AttrValue::Int(i64::try_from(snapshot.endpoints().len()).unwrap_or(i64::MAX)),
            )];
            if let Some(e) = result.as_ref().ok().and_then(|r| r.primary()) {
                attrs.push((
                    "llm_d.epp.picked_endpoint",
                    AttrValue::Str(e.addr_str().to_owned()),
                ));
            }
            let error = result.as_ref().err().map(ToString::to_string);
            let parent = t.orchestration;
            let id = t.span(
                Some(parent),
                "llm_d.epp.scheduling",
                t0,
                t0 + took,
                attrs,
                error,
            );
            events.record(t, id, &scheduler, &request, result.as_ref().ok());
        }
        let mut result = match result {
            Ok(r) => r,
            Err(e) => {
                let err = match (e, snapshot.empty_reason()) {
                    (SchedulingError::NoEndpoints, Some(why)) => {
                        ExtProcError::NoEndpoints(why.into())
                    }
                    (e, _) => e.into(),
                };
                keep(log.as_deref(), view, Some(&err));
                return self.reject_request(err, &request);
            }
        };
        let forward_port = result.edits.forward_port;
        let targets = result
            .primary_run()
            .map(|run| match forward_port {
                None => run
                    .targets
                    .iter()
                    .map(|e| e.addr_str())
                    .collect::<Vec<_>>()
                    .join(","),
                Some(port) => run
                    .targets
                    .iter()
                    .map(|e| SocketAddr::new(e.addr().ip(), port).to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            })
            .unwrap_or_default();
        let destination = forward_port.and_then(|port| {
            Some(SocketAddr::new(result.primary()?.addr().ip(), port).to_string())
        });
        tracing::debug!(
            request_id = %request.request_id,
            model = %request.model,
            target_model = %request.target_model,
            endpoint = %result.primary().map(|e| e.addr_str()).unwrap_or_default(),
            targets = %targets,
            scores = ?result.primary_run().map(|r| &r.scores),
            priority = request.priority,
            prompt_bytes = request.prompt.len(),
            took_us = took.as_micros() as u64,
            "scheduled"
        );
        if tracing::enabled!(tracing::Level::TRACE) {
            tracing::trace!(request_id = %request.request_id, prompt = %request.prompt, "prompt");
        }

        // Body: byte for byte, unless the model is rewritten (splice only it).
        // Only a model epp found in the body can be replaced in it.
        let rewritten = has_body && !model_span.is_empty() && request.target_model != request.model;
        let body = match body {
            Some(b) if rewritten => {
                BodyEdit::Replace(splice_model(b, &model_span, &request.target_model))
            }
            _ => BodyEdit::Unchanged,
        };
        let edits = &result.edits;
        let remove_headers = CONTROL_HEADERS
            .into_iter()
            .chain(edits.owned_headers.iter().copied())
            .filter(|h| request.header(h).is_some() && !edits.headers.iter().any(|(k, _)| k == h))
            .collect();
        // The result is not needed past the dispatch: its headers move out.
        let handler_headers = std::mem::take(&mut result.edits.headers);
        let series = self.metrics.series(
            &request.model,
            &request.target_model,
            &request.fairness_id,
            request.priority,
        );
        let restore_model = rewritten.then(|| request.model.clone());
        let request_id = generated_id.then(|| request.request_id.clone());
        let body_len = request.body_len;
        let dispatch = match result.dispatch(scheduler, request) {
            Ok(d) => d,
            // A handler naming a primary without targets: nothing to serve.
            Err(e) => {
                let err: ExtProcError = e.into();
                tracing::debug!(status = err.http_status(), error = %err, "request refused");
                self.metrics.series_error(&series, err.code());
                keep(log.as_deref(), view.take(), Some(&err));
                return Decision::Reject(err);
            }
        };
        keep(log.as_deref(), view, None);
        let mut extra_headers = handler_headers;
        extra_headers.extend(request_id.map(|id| ("x-request-id", id)));
        if let Some(t) = trace {
            // The model server continues the trace under epp's span.
            extra_headers.push((TRACEPARENT_HEADER, t.traceparent()));
            if let Some(state) = t.tracestate() {
                extra_headers.push((TRACESTATE_HEADER, state.to_owned()));
            }
        }
        if let BodyEdit::Replace(b) = &body {
            extra_headers.push(("content-length", b.len().to_string()));
        }
        self.metrics.scheduled(&series, body_len);
        Decision::Route(Box::new(Route {
            dispatch,
            destination,
            forward_port,
            targets,
            extra_headers,
            remove_headers,
            body,
            restore_model,
            series,
            flow_kick: self.flow.current().map(FlowKick::new),
        }))
    }

    /// The gateway reports `served` (`ip:port`) as the endpoint serving the
    /// request: when it is not the pick (a fallback after the primary
    /// failed), the dispatch's accounting moves there. An address epp does
    /// not know is logged and left alone.
    pub(crate) fn served_by(
        &self,
        dispatch: &mut Dispatch,
        served: &str,
        forward_port: Option<u16>,
    ) {
        let Ok(addr) = served.parse::<SocketAddr>() else {
            tracing::debug!(served, "served endpoint is not ip:port; ignored");
            return;
        };
        let picked = dispatch.endpoint().addr();
        if addr == picked || (forward_port == Some(addr.port()) && addr.ip() == picked.ip()) {
            return;
        }
        let snapshot = self.endpoints.snapshot();
        let Some(endpoint) = snapshot.by_addr(addr) else {
            tracing::debug!(
                request_id = %dispatch.request().request_id,
                picked = %dispatch.endpoint().addr_str(),
                served,
                "served by an endpoint outside the pool; accounting stays on the pick"
            );
            return;
        };
        let picked = dispatch.endpoint().addr_str().to_owned();
        if dispatch.served_by(Arc::clone(endpoint)) {
            self.metrics.served_by_fallback();
            tracing::debug!(
                request_id = %dispatch.request().request_id,
                picked = %picked,
                served,
                "served by a fallback endpoint; in-flight accounting moved there"
            );
        }
    }

    /// Refuses a request (any stage): logs it and counts the error, under
    /// the request's labels once it was parsed.
    pub(crate) fn reject(
        &self,
        err: ExtProcError,
        request_id: &str,
        request: Option<&InferenceRequest>,
    ) -> Decision {
        tracing::debug!(request_id, status = err.http_status(), error = %err, "request refused");
        match request {
            Some(r) => self.metrics.error(
                &r.model,
                &r.target_model,
                &r.fairness_id,
                r.priority,
                err.code(),
            ),
            None => self.metrics.error("", "", "", 0, err.code()),
        }
        Decision::Reject(err)
    }

    fn reject_request(&self, err: ExtProcError, request: &InferenceRequest) -> Decision {
        self.reject(err, &request.request_id, Some(request))
    }

    /// Refuses a request that was never scheduled (flow control), keeping
    /// the refusal in the decision log when it samples the request.
    fn refuse_unscheduled(&self, err: ExtProcError, request: &InferenceRequest) -> Decision {
        if let Some(log) = self.decision_log.load().as_deref()
            && log.claim(Instant::now())
        {
            log.push(DecisionRecord::unscheduled(request, &err));
        }
        self.reject_request(err, request)
    }
}

/// Keeps a sampled decision's record in `log`, refused with `err` if any.
fn keep(log: Option<&DecisionLog>, record: Option<DecisionRecord>, err: Option<&ExtProcError>) {
    if let (Some(log), Some(mut record)) = (log, record) {
        if let Some(err) = err {
            record.refuse(err);
        }
        log.push(record);
    }
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The endpoints a subset hint allows: `ip:port` entries match exactly; a
/// bare `ip` matches every port of that address. Unparseable entries match
/// nothing, so an all-garbage hint is an empty subset (503).
fn resolve_subset(entries: &[String], snapshot: &EndpointSnapshot) -> Vec<SocketAddr> {
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        if let Ok(addr) = e.parse::<SocketAddr>() {
            out.push(addr);
        } else if let Ok(ip) = e.trim_matches(['[', ']']).parse::<IpAddr>() {
            out.extend(
                snapshot
                    .endpoints()
                    .iter()
                    .map(|ep| ep.addr())
                    .filter(|a| a.ip() == ip),
            );
        }
    }
    out
}

/// A random UUID v4 for requests that arrive without `x-request-id`.
fn new_request_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests;
