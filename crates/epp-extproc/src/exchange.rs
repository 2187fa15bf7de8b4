//! One ext_proc stream = one HTTP exchange: the state machine turning Envoy's
//! messages into a scheduling decision and response accounting.
//!
//! Handling is synchronous (parsing and scheduling are CPU work of
//! microseconds); the gRPC stream wrapper in `service.rs` drives it.

use std::{
    collections::VecDeque,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use envoy_types::pb::envoy::service::ext_proc::v3::{
    HeaderMutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    processing_request::Request,
};
use epp_core::{
    ApiKind, Endpoint, EndpointSnapshot, InferenceRequest, RequestOutcome, Scheduler,
    SchedulingError,
};

use crate::{
    error::ExtProcError,
    metrics::ModelLabels,
    options::{BodyMode, ExtProcOptions},
    parse::{ParsedBody, parse_body, splice_model},
    proto,
    restore::ModelRestorer,
    service::Shared,
    usage::UsageReader,
};

/// Header carrying the chosen endpoint (and the `envoy.lb` metadata key).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Dynamic-metadata namespace Envoy's load balancer reads.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// Metadata namespace of the gateway's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// Metadata key of the subset hint (a list of `ip:port`).
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Header overriding the model a request is routed for.
pub const MODEL_REWRITE_HEADER: &str = "x-gateway-model-name-rewrite";
/// Header naming the request's objective (→ priority).
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// Header naming the request's fairness flow.
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
/// Control headers removed before the request is forwarded.
pub const CONTROL_HEADERS: [&str; 3] = [MODEL_REWRITE_HEADER, OBJECTIVE_HEADER, FAIRNESS_HEADER];

/// Which message the decision answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Request headers that end the stream (GET, or body mode NONE).
    Headers,
    /// The one body message of BUFFERED mode (or the last of STREAMED).
    BufferedBody,
    /// FULL_DUPLEX_STREAMED: headers reply, then the body streamed back.
    /// `end` = the body's last chunk carried `end_of_stream` (no trailers).
    DuplexBody { end: bool },
}

/// A routed request, until its response completes (or the stream dies).
#[derive(Debug)]
struct Routed {
    scheduler: Arc<Scheduler>,
    request: InferenceRequest,
    endpoint: Arc<Endpoint>,
    tokens: u64,
    uncached_tokens: u64,
    labels: ModelLabels,
    status: Option<u16>,
    response_bytes: usize,
    usage: Option<UsageReader>,
    restorer: Option<ModelRestorer>,
    done: bool,
}

/// State of one ext_proc stream.
#[derive(Debug)]
pub(crate) struct Exchange {
    shared: Arc<Shared>,
    options: Arc<ExtProcOptions>,
    req_mode: BodyMode,
    resp_mode: BodyMode,
    first_message: bool,
    started: Instant,
    headers: Vec<(String, String)>,
    request_id: String,
    generated_id: bool,
    subset: Option<Vec<String>>,
    /// The whole request body, contiguous for parsing.
    body: Vec<u8>,
    /// FULL_DUPLEX_STREAMED, body in several messages: the messages' own
    /// buffers, streamed back as they came when the body is unchanged (no
    /// second copy of a long prompt to re-chunk it).
    chunks: Vec<Vec<u8>>,
    closed: bool,
    routed: Option<Routed>,
}

impl Exchange {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let options = shared.options.load_full();
        Self {
            req_mode: options.assumed_request_body_mode,
            resp_mode: options.assumed_response_body_mode,
            shared,
            options,
            first_message: true,
            started: Instant::now(),
            headers: Vec::new(),
            request_id: String::new(),
            generated_id: false,
            subset: None,
            body: Vec::new(),
            chunks: Vec::new(),
            closed: false,
            routed: None,
        }
    }

    /// Whether the exchange was answered locally: nothing more will be processed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Handles one message from Envoy, queueing the replies in `out`.
    pub(crate) fn handle(
        &mut self,
        msg: ProcessingRequest,
        out: &mut VecDeque<ProcessingResponse>,
    ) {
        if std::mem::take(&mut self.first_message)
            && let Some(pc) = msg.protocol_config
        {
            self.req_mode = BodyMode::from_proto(pc.request_body_mode);
            self.resp_mode = BodyMode::from_proto(pc.response_body_mode);
        }
        if self.subset.is_none()
            && let Some(hint) = msg
                .metadata_context
                .as_ref()
                .and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE))
                .and_then(|s| s.fields.get(SUBSET_KEY))
        {
            self.subset = Some(proto::string_list(hint));
        }
        if self.closed {
            return;
        }
        let before = out.len();
        match msg.request {
            Some(Request::RequestHeaders(h)) => self.request_headers(h, out),
            Some(Request::RequestBody(b)) => self.request_body(b, out),
            Some(Request::RequestTrailers(_)) => {
                if self.routed.is_none() && self.req_mode == BodyMode::FullDuplexStreamed {
                    self.decide(Phase::DuplexBody { end: false }, out);
                }
                if !self.closed {
                    out.push_back(proto::reply(proto::request_trailers()));
                }
            }
            Some(Request::ResponseHeaders(h)) => self.response_headers(&h, out),
            Some(Request::ResponseBody(b)) => self.response_body(b, out),
            Some(Request::ResponseTrailers(_)) => {
                self.complete(true);
                out.push_back(proto::reply(proto::response_trailers()));
            }
            None => {}
        }
        if msg.observability_mode {
            out.truncate(before);
        }
    }

    /// The gateway closed the stream cleanly.
    pub(crate) fn end(&mut self) {
        self.complete(true);
    }

    // === request path ===

    fn request_headers(&mut self, h: HttpHeaders, out: &mut VecDeque<ProcessingResponse>) {
        if self.routed.is_some() {
            // A repeated headers message: answer it and change nothing.
            out.push_back(proto::reply(proto::request_headers(proto::common(
                None, false,
            ))));
            return;
        }
        self.headers = proto::header_pairs(h.headers.as_ref());
        match self
            .header("x-request-id")
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
        {
            Some(id) => self.request_id = id,
            None => {
                self.request_id = new_request_id();
                self.generated_id = true;
            }
        }
        if h.end_of_stream || self.req_mode == BodyMode::None {
            self.decide(Phase::Headers, out);
        } else if self.req_mode != BodyMode::FullDuplexStreamed {
            out.push_back(proto::reply(proto::request_headers(proto::common(
                None, false,
            ))));
        }
        // FULL_DUPLEX_STREAMED: the headers are answered with the decision,
        // once the whole body is here.
    }

    fn request_body(&mut self, b: HttpBody, out: &mut VecDeque<ProcessingResponse>) {
        if self.routed.is_some() {
            // Body after the decision (out of order): pass it through.
            let reply = if self.req_mode == BodyMode::FullDuplexStreamed {
                proto::streamed(b.body, b.end_of_stream)
            } else {
                proto::common(None, false)
            };
            out.push_back(proto::reply(proto::request_body(reply)));
            return;
        }
        let limit = self.options.max_body_bytes;
        if self.body.is_empty() && self.chunks.is_empty() && b.end_of_stream {
            // The whole body in one message: no copy.
            self.body = b.body;
        } else {
            if self.body.is_empty() {
                // A body in several chunks: take the announced length at once
                // (up to the limit) instead of growing by doubling, which
                // copied a 220 KB prompt about twice over.
                let announced = self
                    .header("content-length")
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let cap = if limit > 0 {
                    announced.min(limit + 1)
                } else {
                    announced
                };
                // A claimed length is not trusted beyond what a prompt needs.
                self.body
                    .reserve_exact(cap.min(PRESIZE_MAX).max(b.body.len()));
            }
            self.body.extend_from_slice(&b.body);
            if self.req_mode == BodyMode::FullDuplexStreamed {
                self.chunks.push(b.body);
            }
        }
        if limit > 0 && self.body.len() > limit {
            let err = ExtProcError::BodyTooLarge {
                size: self.body.len(),
                limit,
            };
            self.reject(err, "", "", out);
            return;
        }
        match self.req_mode {
            BodyMode::FullDuplexStreamed => {
                if b.end_of_stream {
                    self.decide(Phase::DuplexBody { end: true }, out);
                }
            }
            BodyMode::Buffered | BodyMode::BufferedPartial => {
                self.decide(Phase::BufferedBody, out);
            }
            _ => {
                if b.end_of_stream {
                    self.decide(Phase::BufferedBody, out);
                } else {
                    out.push_back(proto::reply(proto::request_body(proto::common(
                        None, false,
                    ))));
                }
            }
        }
    }

    fn decide(&mut self, phase: Phase, out: &mut VecDeque<ProcessingResponse>) {
        let api = ApiKind::from_path(self.path());
        let parsed = if phase == Phase::Headers {
            ParsedBody::default()
        } else {
            match parse_body(api, &self.body) {
                Ok(p) => p,
                Err(e) => return self.reject(e, "", "", out),
            }
        };
        let model_span = parsed.model_span.clone();
        let mut request = self.build_request(api, parsed);
        let scheduler = self.shared.scheduler.load_full();
        let snapshot = self.shared.endpoints.snapshot();
        request.subset = self.subset.as_ref().map(|s| resolve_subset(s, &snapshot));

        let t0 = Instant::now();
        let result = scheduler.schedule(&request, &snapshot);
        let took = t0.elapsed();
        self.shared.metrics.scheduling_took(took);
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                let (m, t) = (request.model.clone(), request.target_model.clone());
                return self.reject(e.into(), &m, &t, out);
            }
        };
        let Some(endpoint) = result.primary().cloned() else {
            let (m, t) = (request.model.clone(), request.target_model.clone());
            return self.reject(SchedulingError::NoEndpoints.into(), &m, &t, out);
        };
        let targets = result
            .primary_run()
            .map(|run| {
                run.targets
                    .iter()
                    .map(|e| e.addr_str())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        tracing::debug!(
            request_id = %request.request_id,
            model = %request.model,
            target_model = %request.target_model,
            endpoint = %endpoint.addr_str(),
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

        // Body: byte-for-byte, unless the model is rewritten (splice only it).
        let rewritten = phase != Phase::Headers && request.target_model != request.model;
        let body = if rewritten {
            splice_model(&self.body, &model_span, &request.target_model)
        } else {
            std::mem::take(&mut self.body)
        };
        self.body = Vec::new();
        let chunks = std::mem::take(&mut self.chunks);

        let mut mutation = HeaderMutation {
            set_headers: vec![proto::set_header(DESTINATION_HEADER, endpoint.addr_str())],
            remove_headers: CONTROL_HEADERS
                .iter()
                .filter(|h| request.header(h).is_some())
                .map(|h| (*h).to_owned())
                .collect(),
        };
        if self.generated_id {
            mutation
                .set_headers
                .push(proto::set_header("x-request-id", &request.request_id));
        }
        if rewritten {
            mutation
                .set_headers
                .push(proto::set_header("content-length", &body.len().to_string()));
        }
        let metadata = proto::metadata(DESTINATION_NAMESPACE, DESTINATION_HEADER, targets);

        let tokens = request.prompt_tokens_estimate();
        // What the target must compute: the part its prefix cache lacks.
        let uncached_tokens = (tokens as f64 * (1.0 - result.primary_prefix_hit)).ceil() as u64;
        endpoint.inflight().start_with(tokens, uncached_tokens);
        let labels = ModelLabels {
            model_name: request.model.clone(),
            target_model_name: request.target_model.clone(),
        };
        self.shared.metrics.scheduled(&labels, request.body_len);
        let client_model = request.model.clone();
        self.routed = Some(Routed {
            scheduler,
            request,
            endpoint,
            tokens,
            uncached_tokens,
            labels,
            status: None,
            response_bytes: 0,
            usage: None,
            restorer: rewritten.then(|| ModelRestorer::new(client_model, false, 0)),
            done: false,
        });

        let decision = proto::common(Some(mutation), true);
        match phase {
            Phase::Headers => {
                let mut r = proto::reply(proto::request_headers(decision));
                r.dynamic_metadata = Some(metadata);
                out.push_back(r);
            }
            Phase::BufferedBody => {
                let c = if rewritten {
                    proto::replace_body(decision, body)
                } else {
                    decision
                };
                let mut r = proto::reply(proto::request_body(c));
                r.dynamic_metadata = Some(metadata);
                out.push_back(r);
            }
            Phase::DuplexBody { end } => {
                let mut r = proto::reply(proto::request_headers(decision));
                r.dynamic_metadata = Some(metadata);
                out.push_back(r);
                let size = self.options.stream_chunk_bytes.max(1);
                if rewritten || chunks.is_empty() {
                    stream_back(body, size, end, out);
                } else {
                    // Unchanged: the body goes back in the messages it came in.
                    let n = chunks.len();
                    for (i, chunk) in chunks.into_iter().enumerate() {
                        let last = i + 1 == n;
                        if !chunk.is_empty() || last {
                            stream_back(chunk, size, end && last, out);
                        }
                    }
                }
            }
        }
    }

    /// The scheduler's view of the request; takes the remembered headers.
    fn build_request(&mut self, api: ApiKind, parsed: ParsedBody) -> InferenceRequest {
        let model = parsed.model;
        let target = self
            .header(MODEL_REWRITE_HEADER)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .or_else(|| {
                self.options
                    .model_rewrite
                    .as_ref()
                    .and_then(|r| r.rewrite(&model, &self.headers))
            })
            .unwrap_or_else(|| model.clone());
        let objective = self
            .header(OBJECTIVE_HEADER)
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        let priority = objective
            .as_ref()
            .and_then(|o| match &self.options.objective_priority {
                Some(live) => live.priority(o),
                None => self.options.objectives.get(o).copied(),
            })
            .unwrap_or(0);
        let fairness_id = self
            .header(FAIRNESS_HEADER)
            .filter(|v| !v.is_empty())
            .unwrap_or("default-flow")
            .to_owned();
        InferenceRequest {
            request_id: self.request_id.clone(),
            model,
            target_model: target,
            api,
            headers: std::mem::take(&mut self.headers),
            prompt: parsed.prompt,
            cache_salt: parsed.cache_salt,
            stream: parsed.stream,
            priority,
            objective,
            fairness_id,
            max_tokens: parsed.max_tokens,
            subset: None,
            body_len: self.body.len(),
        }
    }

    fn reject(
        &mut self,
        err: ExtProcError,
        model: &str,
        target: &str,
        out: &mut VecDeque<ProcessingResponse>,
    ) {
        tracing::debug!(request_id = %self.request_id, status = err.http_status(), error = %err, "request refused");
        self.shared.metrics.error(model, target, err.code());
        out.push_back(proto::immediate(&err));
        self.closed = true;
        self.body = Vec::new();
        self.chunks = Vec::new();
    }

    // === response path ===

    fn response_headers(&mut self, h: &HttpHeaders, out: &mut VecDeque<ProcessingResponse>) {
        let pairs = proto::header_pairs(h.headers.as_ref());
        let status = pairs
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| v.trim().parse::<u16>().ok())
            .unwrap_or(200);
        let sse = pairs
            .iter()
            .any(|(k, v)| k == "content-type" && v.contains("text/event-stream"));
        let mut mutation = None;
        let limit = self.options.max_response_buffer_bytes;
        if let Some(r) = self.routed.as_mut() {
            r.status = Some(status);
            let streaming = sse || r.request.stream;
            let mut added: Vec<(String, String)> = Vec::new();
            r.scheduler
                .response_received(&r.request, &r.endpoint, status, &pairs, &mut added);
            if !added.is_empty() {
                mutation = Some(HeaderMutation {
                    set_headers: added.iter().map(|(k, v)| proto::set_header(k, v)).collect(),
                    remove_headers: Vec::new(),
                });
            }
            r.usage = Some(UsageReader::new(streaming, limit));
            if r.restorer.is_some() {
                r.restorer = Some(ModelRestorer::new(
                    r.request.model.clone(),
                    streaming,
                    limit,
                ));
                if matches!(
                    self.resp_mode,
                    BodyMode::FullDuplexStreamed | BodyMode::Streamed
                ) {
                    // The length changes with the model name; Envoy re-frames.
                    // (BUFFERED sets it with the body; NONE leaves the body.)
                    mutation
                        .get_or_insert_with(HeaderMutation::default)
                        .remove_headers
                        .push("content-length".to_owned());
                }
            }
        }
        out.push_back(proto::reply(proto::response_headers(proto::common(
            mutation, false,
        ))));
        if h.end_of_stream {
            self.complete(true);
        }
    }

    fn response_body(&mut self, b: HttpBody, out: &mut VecDeque<ProcessingResponse>) {
        let buffered = matches!(
            self.resp_mode,
            BodyMode::Buffered | BodyMode::BufferedPartial
        );
        let end = b.end_of_stream || buffered;
        let mut replaced = None;
        if let Some(r) = self.routed.as_mut() {
            r.response_bytes += b.body.len();
            if let Some(u) = r.usage.as_mut() {
                u.feed(&b.body);
            }
            if let Some(rs) = r.restorer.as_mut() {
                replaced = Some(rs.feed(&b.body, end));
            }
        }
        let c = match self.resp_mode {
            BodyMode::FullDuplexStreamed => {
                proto::streamed(replaced.unwrap_or(b.body), b.end_of_stream)
            }
            _ => match replaced {
                Some(body) => {
                    let mut c = proto::common(None, false);
                    if buffered {
                        c.header_mutation = Some(HeaderMutation {
                            set_headers: vec![proto::set_header(
                                "content-length",
                                &body.len().to_string(),
                            )],
                            remove_headers: Vec::new(),
                        });
                    }
                    proto::replace_body(c, body)
                }
                None => proto::common(None, false),
            },
        };
        out.push_back(proto::reply(proto::response_body(c)));
        if b.end_of_stream {
            self.complete(true);
        }
    }

    /// Ends the request's accounting exactly once: in-flight counters,
    /// response hooks, metrics. `clean` = the response was seen to its end
    /// (or the gateway closed the stream normally).
    fn complete(&mut self, clean: bool) {
        let Some(r) = self.routed.as_mut() else {
            return;
        };
        if r.done {
            return;
        }
        r.done = true;
        r.endpoint
            .inflight()
            .finish_with(r.tokens, r.uncached_tokens);
        let usage = r.usage.as_mut().and_then(UsageReader::finish);
        let outcome = match r.status {
            Some(status) if clean => RequestOutcome::Completed { status },
            _ => RequestOutcome::Aborted,
        };
        r.scheduler
            .response_complete(&r.request, &r.endpoint, usage.as_ref(), outcome);
        let elapsed = self.started.elapsed();
        self.shared
            .metrics
            .completed(&r.labels, elapsed, r.response_bytes, usage);
        if let RequestOutcome::Completed { status } = outcome
            && status >= 500
        {
            self.shared.metrics.error(
                &r.labels.model_name,
                &r.labels.target_model_name,
                "ModelServerError",
            );
        }
        tracing::trace!(
            request_id = %r.request.request_id,
            endpoint = %r.endpoint.addr_str(),
            outcome = ?outcome,
            elapsed_ms = elapsed.as_secs_f64() * 1e3,
            prompt_tokens = usage.map(|u| u.prompt_tokens),
            completion_tokens = usage.map(|u| u.completion_tokens),
            "request completed"
        );
    }

    // === helpers ===

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn path(&self) -> &str {
        [":path", "x-original-path", "x-forwarded-path"]
            .iter()
            .find_map(|h| self.header(h).filter(|v| !v.is_empty()))
            .unwrap_or("")
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // Stream reset or server shutdown: release what the request holds.
        self.complete(false);
    }
}

/// Most a body buffer is sized from `content-length` before the bytes arrive.
const PRESIZE_MAX: usize = 8 << 20;

/// Queues `body` as FULL_DUPLEX_STREAMED body replies of at most `size`
/// bytes; `end` marks the last. One that fits is moved, not copied.
fn stream_back(body: Vec<u8>, size: usize, end: bool, out: &mut VecDeque<ProcessingResponse>) {
    if body.len() <= size {
        out.push_back(proto::reply(proto::request_body(proto::streamed(
            body, end,
        ))));
        return;
    }
    let n = body.len().div_ceil(size);
    for (i, chunk) in body.chunks(size).enumerate() {
        out.push_back(proto::reply(proto::request_body(proto::streamed(
            chunk.to_vec(),
            end && i + 1 == n,
        ))));
    }
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
