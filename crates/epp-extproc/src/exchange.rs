//! One ext_proc stream = one HTTP exchange: the state machine that collects
//! Envoy's request messages, asks the [`Decider`] for a [`Decision`],
//! encodes it for Envoy, and keeps the response's accounting.
//!
//! Handling is synchronous (parsing and scheduling are CPU work of
//! microseconds); the gRPC stream wrapper in `service.rs` drives it.

use std::{
    collections::VecDeque,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use epp_core::{Dispatch, RequestOutcome};

use crate::{
    decision::{
        BodyEdit, DESTINATION_HEADER, DESTINATION_NAMESPACE, Decider, Decision, RequestParts,
        Route, SUBSET_KEY, SUBSET_NAMESPACE, Started,
    },
    error::ExtProcError,
    flow::{FlowKick, Waited, Waiting},
    metrics::RequestSeries,
    options::{BodyMode, ExtProcOptions},
    proto,
    restore::ModelRestorer,
    trace::{ActiveTrace, AttrValue},
    usage::UsageReader,
    wire::{
        HeaderMutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, Request,
        struct_of,
    },
};

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
    /// `None` once completed: the accounting ran.
    dispatch: Option<Dispatch>,
    series: Arc<RequestSeries>,
    /// The response is streamed (server-sent events, or `stream: true`).
    streaming: bool,
    /// When a streamed response's first body bytes came, after the start.
    ttft: Option<Duration>,
    /// When its latest body chunk came.
    last_chunk: Option<Instant>,
    /// The client's model name, when the body's model was rewritten.
    restore_model: Option<String>,
    status: Option<u16>,
    /// The response is server-sent events (its first body bytes carry the
    /// first token).
    sse: bool,
    response_bytes: usize,
    usage: Option<UsageReader>,
    restorer: Option<ModelRestorer>,
    /// Kicks flow control once the response is done (last: after the
    /// dispatch's counters are released).
    flow_kick: Option<FlowKick>,
    /// Targets are reached on this port instead of their own.
    forward_port: Option<u16>,
    /// Time spent handling the response's messages.
    response_spent: Duration,
    /// A plain JSON body held to write the model back: since its headers,
    /// until its end.
    held: Option<(Instant, Option<Instant>)>,
}

/// State of one ext_proc stream.
#[derive(Debug)]
pub(crate) struct Exchange {
    decider: Arc<Decider>,
    options: Arc<ExtProcOptions>,
    req_mode: BodyMode,
    resp_mode: BodyMode,
    first_message: bool,
    started: Instant,
    parts: RequestParts,
    /// The request body as it came: the messages' own buffers (slices of
    /// the gRPC receive buffer), joined once for parsing when there are
    /// several, and streamed back as they came when the body is unchanged.
    chunks: Vec<Bytes>,
    /// Their total length.
    body_len: usize,
    closed: bool,
    routed: Option<Routed>,
    /// The request's spans, when it is traced and sampled.
    trace: Option<Box<ActiveTrace>>,
    /// Waiting in flow control, with the message its decision answers and
    /// the messages that came meanwhile (handled after the decision).
    waiting: Option<(Box<Waiting>, Phase, Vec<ProcessingRequest>)>,
    /// The request's processing time was recorded.
    processed: bool,
}

impl Exchange {
    pub(crate) fn new(decider: Arc<Decider>) -> Self {
        let options = decider.options.load_full();
        Self {
            req_mode: options.assumed_request_body_mode,
            resp_mode: options.assumed_response_body_mode,
            decider,
            options,
            first_message: true,
            started: Instant::now(),
            parts: RequestParts::default(),
            chunks: Vec::new(),
            body_len: 0,
            closed: false,
            routed: None,
            trace: None,
            waiting: None,
            processed: false,
        }
    }

    /// Polls a request waiting in flow control: once it leaves the queue,
    /// answers Envoy with its decision (into `out`), handles the messages
    /// that came meanwhile, and returns `true`. `false` while it waits (the
    /// waker of `cx` is woken when it may progress) or when nothing waits.
    pub(crate) fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut VecDeque<ProcessingResponse>,
    ) -> bool {
        loop {
            let Some((waiting, _, _)) = self.waiting.as_mut() else {
                return false;
            };
            let Poll::Ready(waited) = waiting.poll(cx) else {
                return false;
            };
            let Some((_, phase, deferred)) = self.waiting.take() else {
                return false;
            };
            let joined =
                (phase != Phase::Headers).then(|| joined_body(&self.chunks, self.body_len));
            let decision = match waited {
                // Rendered: on to any hold and flow control, which may wait.
                Waited::Rendered(prepared) => match self.decider.resume(
                    prepared,
                    self.started,
                    self.parts.subset.as_deref(),
                    joined.as_deref(),
                    self.trace.as_deref_mut(),
                ) {
                    Started::Decided(decision) => decision,
                    Started::Queued(w) => {
                        self.waiting = Some((w, phase, deferred));
                        continue;
                    }
                },
                waited => self.decider.finish_wait(
                    waited,
                    self.parts.subset.as_deref(),
                    joined.as_deref(),
                    self.trace.as_deref_mut(),
                ),
            };
            self.answer(decision, phase, out);
            for msg in deferred {
                self.handle(msg, out);
            }
            return true;
        }
    }

    /// The body limit of the options the stream started with.
    pub(crate) fn max_body_bytes(&self) -> usize {
        self.options.max_body_bytes
    }

    /// When the stream began.
    pub(crate) fn started(&self) -> Instant {
        self.started
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
        if self.parts.subset.is_none()
            && let Some(hint) = msg
                .metadata_context
                .as_ref()
                .and_then(|m| struct_of(&m.filter_metadata, SUBSET_NAMESPACE))
                .and_then(|s| s.get(SUBSET_KEY))
        {
            self.parts.subset = Some(proto::string_list(hint));
        }
        if self.closed {
            return;
        }
        if let Some((_, _, deferred)) = self.waiting.as_mut() {
            deferred.push(msg);
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
            Some(Request::ResponseHeaders(ref h)) => {
                let t = Instant::now();
                self.response_headers(h, proto::served_endpoint(&msg), out);
                self.response_took(t);
            }
            Some(Request::ResponseBody(b)) => {
                let t = Instant::now();
                self.response_body(b, out);
                self.response_took(t);
            }
            Some(Request::ResponseTrailers(_)) => {
                let t = Instant::now();
                self.complete(true);
                out.push_back(proto::reply(proto::response_trailers()));
                self.response_took(t);
            }
            None => {}
        }
        if msg.observability_mode {
            out.truncate(before);
        }
    }

    /// The stream broke (reset, gateway timeout): a request waiting in flow
    /// control leaves its queue now, counted as cancelled.
    pub(crate) fn abandon(&mut self) {
        self.give_up_waiting();
    }

    /// The gateway closed the stream cleanly.
    pub(crate) fn end(&mut self) {
        // A request still waiting in flow control leaves its queue now.
        self.give_up_waiting();
        self.complete(true);
    }

    /// A request still waiting (in flow control, a hold or its render)
    /// goes: its processing ends here.
    fn give_up_waiting(&mut self) {
        if self.waiting.is_some() {
            // Recorded before the wait ends, which counts it as cancelled.
            self.processed();
            self.waiting = None;
        }
    }

    /// The request's processing ended (its decision answered, or it was
    /// given up while waiting): recorded once.
    fn processed(&mut self) {
        if !std::mem::replace(&mut self.processed, true) {
            let took = self.started.elapsed();
            self.decider.metrics.streams().request_processed(took);
        }
    }

    /// Adds the time since `since` to the response's handling time.
    fn response_took(&mut self, since: Instant) {
        if let Some(r) = self.routed.as_mut() {
            r.response_spent += since.elapsed();
        }
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
        self.parts.headers = proto::header_pairs(h.headers.as_ref());
        if let Some(tracer) = &self.options.tracer {
            self.trace = ActiveTrace::start(tracer, &self.parts.headers, self.started);
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
        self.body_len += b.body.len();
        if !b.body.is_empty() || self.chunks.is_empty() {
            self.chunks.push(b.body);
        }
        if limit > 0 && self.body_len > limit {
            let err = ExtProcError::BodyTooLarge {
                size: self.body_len,
                limit,
            };
            let request_id = self.parts.request_id().unwrap_or("");
            let refused = self.decider.reject(err, request_id, None);
            self.answer(refused, Phase::BufferedBody, out);
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

    /// Asks for the decision and answers Envoy with it.
    fn decide(&mut self, phase: Phase, out: &mut VecDeque<ProcessingResponse>) {
        let joined = (phase != Phase::Headers).then(|| joined_body(&self.chunks, self.body_len));
        match self.decider.start(
            &self.options,
            &mut self.parts,
            joined.as_deref(),
            self.started,
            self.trace.as_deref_mut(),
        ) {
            Started::Decided(decision) => self.answer(decision, phase, out),
            Started::Queued(w) => self.waiting = Some((w, phase, Vec::new())),
        }
    }

    /// Encodes `decision` as the reply to the message of `phase`.
    fn answer(&mut self, decision: Decision, phase: Phase, out: &mut VecDeque<ProcessingResponse>) {
        self.processed();
        let chunks = std::mem::take(&mut self.chunks);
        let route = match decision {
            Decision::Route(route) => *route,
            Decision::Reject(err) => {
                out.push_back(proto::immediate(&err));
                self.closed = true;
                if let Some(t) = self.trace.as_mut() {
                    t.root_attributes
                        .push(("llm_d.epp.outcome", AttrValue::Str("rejected".into())));
                    t.root_attributes.push((
                        "http.response.status_code",
                        AttrValue::Int(i64::from(err.http_status())),
                    ));
                    t.error = Some(err.to_string());
                }
                self.finish_trace();
                return;
            }
        };
        if let Some(t) = self.trace.as_mut() {
            t.root_attributes.push((
                "llm_d.epp.picked_endpoint",
                AttrValue::Str(route.dispatch.endpoint().addr_str().to_owned()),
            ));
        }
        let mutation = HeaderMutation {
            set_headers: route
                .set_headers()
                .map(|(k, v)| proto::set_header(k, v))
                .collect(),
            remove_headers: route
                .remove_headers
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
        };
        let Route {
            dispatch,
            targets,
            body: edit,
            restore_model,
            series,
            flow_kick,
            forward_port,
            ..
        } = route;
        let metadata = proto::metadata(DESTINATION_NAMESPACE, DESTINATION_HEADER, targets);
        self.routed = Some(Routed {
            dispatch: Some(dispatch),
            series,
            streaming: false,
            ttft: None,
            last_chunk: None,
            restore_model,
            status: None,
            sse: false,
            response_bytes: 0,
            usage: None,
            restorer: None,
            flow_kick,
            forward_port,
            response_spent: Duration::ZERO,
            held: None,
        });

        let decision = proto::common(Some(mutation), true);
        match phase {
            Phase::Headers => {
                let mut r = proto::reply(proto::request_headers(decision));
                r.dynamic_metadata = Some(metadata);
                out.push_back(r);
            }
            Phase::BufferedBody => {
                let c = match edit {
                    BodyEdit::Replace(b) => proto::replace_body(decision, Bytes::from(b)),
                    BodyEdit::Unchanged => decision,
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
                match edit {
                    BodyEdit::Replace(b) => stream_back(Bytes::from(b), size, end, out),
                    BodyEdit::Unchanged if chunks.is_empty() => {
                        stream_back(Bytes::new(), size, end, out);
                    }
                    BodyEdit::Unchanged => {
                        // The body goes back in the messages it came in.
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
    }

    // === response path ===

    fn response_headers(
        &mut self,
        h: &HttpHeaders,
        served: Option<&str>,
        out: &mut VecDeque<ProcessingResponse>,
    ) {
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
        if let Some(r) = self.routed.as_mut()
            && let Some(dispatch) = r.dispatch.as_mut()
        {
            if let Some(served) = served {
                self.decider.served_by(dispatch, served, r.forward_port);
            }
            // P/D: the decode server answers once the prefill is done.
            dispatch.prefill_done();
            r.status = Some(status);
            r.sse = sse;
            let streaming = sse || dispatch.request().stream;
            r.streaming = streaming;
            let mut added: Vec<(String, String)> = Vec::new();
            dispatch.response_received(status, &pairs, &mut added);
            if !added.is_empty() {
                mutation = Some(HeaderMutation {
                    set_headers: added.iter().map(|(k, v)| proto::set_header(k, v)).collect(),
                    remove_headers: Vec::new(),
                });
            }
            r.usage = Some(UsageReader::new(streaming, limit));
            if let Some(model) = &r.restore_model {
                r.restorer = Some(ModelRestorer::new(model.clone(), streaming, limit));
                if !streaming
                    && matches!(
                        self.resp_mode,
                        BodyMode::FullDuplexStreamed | BodyMode::Streamed
                    )
                {
                    // Its chunks stay here until the end (Envoy buffers a
                    // BUFFERED body itself).
                    r.held = Some((Instant::now(), None));
                }
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
            if !b.body.is_empty()
                && let Some(dispatch) = r.dispatch.as_mut()
            {
                dispatch.first_body_bytes(r.sse);
                if r.streaming {
                    let now = Instant::now();
                    match r.last_chunk {
                        None => {
                            let ttft = now.saturating_duration_since(self.started);
                            r.ttft = Some(ttft);
                            r.series.first_token(ttft);
                        }
                        Some(last) => r.series.inter_token(now.saturating_duration_since(last)),
                    }
                    r.last_chunk = Some(now);
                }
            }
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
                proto::streamed(replaced.map_or(b.body, Bytes::from), b.end_of_stream)
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
                    proto::replace_body(c, Bytes::from(body))
                }
                None => proto::common(None, false),
            },
        };
        out.push_back(proto::reply(proto::response_body(c)));
        if b.end_of_stream {
            self.complete(true);
        }
    }

    /// Ends the request's accounting exactly once: the dispatch (in-flight
    /// counters, response hooks), then metrics. `clean` = the response was
    /// seen to its end (or the gateway closed the stream normally).
    fn complete(&mut self, clean: bool) {
        let Some(r) = self.routed.as_mut() else {
            return;
        };
        let Some(dispatch) = r.dispatch.take() else {
            return;
        };
        if clean && let Some((from, None)) = r.held {
            r.held = Some((from, Some(Instant::now())));
        }
        let usage = r.usage.as_mut().and_then(UsageReader::finish);
        let outcome = match r.status {
            Some(status) if clean => RequestOutcome::Completed { status },
            _ => RequestOutcome::Aborted,
        };
        let endpoint = dispatch.endpoint().addr_str().to_owned();
        let request = dispatch.complete(usage.as_ref(), outcome);
        // The endpoint's slot is free: a queued request may go.
        drop(r.flow_kick.take());
        let elapsed = self.started.elapsed();
        r.series.completed(elapsed, r.response_bytes, usage, r.ttft);
        if let RequestOutcome::Completed { status } = outcome
            && status >= 500
        {
            self.decider
                .metrics
                .series_error(&r.series, "ModelServerError");
        }
        if let Some(t) = self.trace.as_mut() {
            let a = &mut t.root_attributes;
            match outcome {
                RequestOutcome::Completed { status } => {
                    a.push(("llm_d.epp.outcome", AttrValue::Str("completed".into())));
                    a.push((
                        "http.response.status_code",
                        AttrValue::Int(i64::from(status)),
                    ));
                    if status >= 500 {
                        t.error = Some(format!("the model server answered {status}"));
                    }
                }
                _ => {
                    a.push(("llm_d.epp.outcome", AttrValue::Str("aborted".into())));
                    t.error = Some("the request ended before its response".into());
                }
            }
            if let Some(u) = usage {
                let a = &mut t.root_attributes;
                a.push((
                    "gen_ai.usage.input_tokens",
                    AttrValue::Int(i64::try_from(u.prompt_tokens).unwrap_or(i64::MAX)),
                ));
                a.push((
                    "gen_ai.usage.output_tokens",
                    AttrValue::Int(i64::try_from(u.completion_tokens).unwrap_or(i64::MAX)),
                ));
            }
        }
        self.finish_trace();
        tracing::trace!(
            request_id = %request.request_id,
            endpoint = %endpoint,
            outcome = ?outcome,
            elapsed_ms = elapsed.as_secs_f64() * 1e3,
            prompt_tokens = usage.map(|u| u.prompt_tokens),
            completion_tokens = usage.map(|u| u.completion_tokens),
            "request completed"
        );
    }
}

impl Exchange {
    /// Hands a traced request's spans over, once.
    fn finish_trace(&mut self) {
        if let Some(t) = self.trace.take() {
            t.finish();
        }
    }
}

impl Exchange {
    /// Records the time spent on a routed request's response, once its
    /// stream ends (aborted responses too; none for a request whose
    /// response never came).
    fn record_response(&self) {
        let Some(r) = &self.routed else {
            return;
        };
        let spent = response_time(r.response_spent, r.held);
        if !spent.is_zero() {
            self.decider.metrics.streams().response_processed(spent);
        }
    }
}

/// The time epp spent on a response: `spent` handling its messages, or,
/// when it held a plain JSON body to its end, the whole hold (which covers
/// those slices; a hold cut short by a reset counts only the slices).
fn response_time(spent: Duration, held: Option<(Instant, Option<Instant>)>) -> Duration {
    match held {
        Some((from, Some(until))) => spent.max(until.saturating_duration_since(from)),
        _ => spent,
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // A request still waiting: its processing ends with the stream.
        if self.waiting.is_some() {
            self.processed();
        }
        // Stream reset or server shutdown: release what the request holds.
        self.complete(false);
        self.record_response();
        // A traced request that never got a decision still has its span.
        if let Some(t) = self.trace.as_mut() {
            t.error
                .get_or_insert_with(|| "the stream ended before a decision".into());
        }
        self.finish_trace();
    }
}

/// Queues `body` as FULL_DUPLEX_STREAMED body replies of at most `size`
/// bytes; `end` marks the last. The pieces are slices of `body`: no copy.
fn stream_back(body: Bytes, size: usize, end: bool, out: &mut VecDeque<ProcessingResponse>) {
    if body.len() <= size {
        out.push_back(proto::reply(proto::request_body(proto::streamed(
            body, end,
        ))));
        return;
    }
    let n = body.len().div_ceil(size);
    for i in 0..n {
        let piece = body.slice(i * size..((i + 1) * size).min(body.len()));
        out.push_back(proto::reply(proto::request_body(proto::streamed(
            piece,
            end && i + 1 == n,
        ))));
    }
}

/// The request body as one slice: borrowed when it came in one message
/// (or none), joined (the one copy) when it came in several.
fn joined_body(chunks: &[Bytes], len: usize) -> std::borrow::Cow<'_, [u8]> {
    match chunks {
        [] => std::borrow::Cow::Borrowed(&[][..]),
        [one] => std::borrow::Cow::Borrowed(&one[..]),
        many => {
            let mut all = Vec::with_capacity(len);
            for chunk in many {
                all.extend_from_slice(chunk);
            }
            std::borrow::Cow::Owned(all)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_body_counts_its_whole_hold_and_a_cut_one_its_slices() {
        let from = Instant::now();
        let ms = Duration::from_millis;
        let slices = ms(2);
        assert_eq!(response_time(slices, None), slices);
        assert_eq!(
            response_time(slices, Some((from, Some(from + ms(40))))),
            ms(40)
        );
        assert_eq!(response_time(slices, Some((from, None))), slices);
        // A hold shorter than the slices (clock granularity): the slices.
        assert_eq!(
            response_time(slices, Some((from, Some(from + ms(1))))),
            slices
        );
    }
}
