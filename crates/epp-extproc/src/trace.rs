//! Tracing of one request, protocol-free: the W3C trace context read from
//! the request's headers, and the spans of a sampled request as plain
//! values. Whoever embeds the service decides which requests are recorded
//! and where their spans go ([`RequestTracer`]; the `epp` binary exports
//! them over OTLP). A request that is not recorded costs a header lookup.
//!
//! The spans of a request, by name (the reference picker's names where it has
//! the span):
//! - `gateway.request` (server): the whole exchange, the caller's span as
//!   parent;
//!   - `gateway.request_orchestration`: the decision (parsing, scheduling,
//!     commit), with the decision's attributes;
//!     - `llm_d.epp.scheduling`: the scheduling cycle;
//!       - one span per plugin call outside profiles
//!         (`llm_d.epp.profile_picker.<type>`, `…saturation_detector.<type>`,
//!         `…data_producer.<type>`, `…pre_request.<type>`);
//!       - `run_scheduler_profile` per profile run: `filter_endpoints`
//!         (children `llm_d.epp.filter.<type>`), `llm_d.epp.scoring`
//!         (children `llm_d.epp.scorer.<type>`), `pick_endpoints` (the picker).

use std::{
    borrow::Cow,
    fmt,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use epp_core::{
    CycleRecorder, ExtensionPoint, InferenceRequest, ProfileRun, Scheduler, SchedulingResult,
};

/// The `traceparent` header.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The `tracestate` header.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// A W3C `traceparent`: the caller's trace, its span, and whether it sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The caller's span id (never all zero).
    pub span_id: [u8; 8],
    /// The caller's `sampled` flag.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`; a later
    /// version may append fields). `None` for anything invalid, as the W3C
    /// spec says: the request then starts a new trace.
    #[must_use]
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim().as_bytes();
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex_byte(v[0], v[1])?;
        // Version 255 is invalid; version 0 has exactly four fields.
        if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(v[3 + 2 * i], v[4 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(v[36 + 2 * i], v[37 + 2 * i])?;
        }
        let flags = hex_byte(v[53], v[54])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }
}

/// Lower-case hex only, as the spec requires.
fn hex_byte(hi: u8, lo: u8) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(hi)? << 4 | d(lo)?)
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Decides which requests are recorded and receives their spans.
///
/// Both methods are called on the request path: `should_sample` for every
/// request (keep it to arithmetic), `export` once per recorded request, at
/// its end (hand the trace over, e.g. to a bounded queue; never block).
pub trait RequestTracer: Send + Sync + fmt::Debug {
    /// Whether to record a request of trace `trace_id` whose caller is
    /// `parent` (`None`: no valid `traceparent`, a new trace).
    fn should_sample(&self, trace_id: &[u8; 16], parent: Option<&TraceParent>) -> bool;

    /// The spans of a recorded request, once it ended.
    fn export(&self, trace: RequestTrace);
}

/// The spans of one recorded request.
#[derive(Debug, Clone)]
pub struct RequestTrace {
    /// The trace id (the caller's, or a new one).
    pub trace_id: [u8; 16],
    /// The caller's `tracestate`, passed on unchanged.
    pub trace_state: String,
    /// The spans, children before parents.
    pub spans: Vec<SpanRecord>,
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// Its id.
    pub span_id: [u8; 8],
    /// Its parent: another span of the trace, or the caller's span.
    pub parent_span_id: Option<[u8; 8]>,
    /// Its name.
    pub name: Cow<'static, str>,
    /// Server (the request) or internal (everything within).
    pub kind: SpanKind,
    /// Start, nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_unix_nanos: u64,
    /// Attributes. Never the prompt or the body.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// The error status's message, when the span failed.
    pub error: Option<String>,
}

/// The kind of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpanKind {
    /// Work within epp.
    Internal,
    /// The request epp serves.
    Server,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AttrValue {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A list of strings.
    StrList(Vec<String>),
    /// A list of floats.
    FloatList(Vec<f64>),
}

/// The reference's picker span lists this many best endpoints.
const TOP_ENDPOINTS: usize = 5;

/// A request being recorded: the root span's ids and times, the spans
/// finished so far, and what the root span reports at the end.
#[derive(Debug)]
pub(crate) struct ActiveTrace {
    tracer: std::sync::Arc<dyn RequestTracer>,
    trace_id: [u8; 16],
    trace_state: String,
    parent: Option<[u8; 8]>,
    root: [u8; 8],
    /// The id of the decision's span (`gateway.request_orchestration`).
    pub(crate) orchestration: [u8; 8],
    /// Its attributes, noted as the decision goes.
    pub(crate) orchestration_attributes: Vec<(&'static str, AttrValue)>,
    started: Instant,
    started_unix: u64,
    spans: Vec<SpanRecord>,
    /// Attributes of the root span, added as the request goes.
    pub(crate) root_attributes: Vec<(&'static str, AttrValue)>,
    pub(crate) error: Option<String>,
}

impl ActiveTrace {
    /// Starts recording the request with `headers` (received at `started`)
    /// when `tracer` samples it.
    pub(crate) fn start(
        tracer: &std::sync::Arc<dyn RequestTracer>,
        headers: &[(String, String)],
        started: Instant,
    ) -> Option<Box<Self>> {
        let mut parent = None;
        let mut state = None;
        for (k, v) in headers {
            if k == TRACEPARENT_HEADER {
                parent = TraceParent::parse(v);
            } else if k == TRACESTATE_HEADER {
                state = Some(v);
            }
        }
        let trace_id = parent.map_or_else(new_trace_id, |p| p.trace_id);
        if !tracer.should_sample(&trace_id, parent.as_ref()) {
            return None;
        }
        let now_unix = unix_nanos(SystemTime::now());
        let since = started.elapsed().as_nanos();
        Some(Box::new(Self {
            tracer: std::sync::Arc::clone(tracer),
            trace_id,
            // A tracestate only belongs with the caller's traceparent.
            trace_state: parent
                .and(state)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            parent: parent.map(|p| p.span_id),
            root: new_span_id(),
            orchestration: new_span_id(),
            orchestration_attributes: Vec::with_capacity(12),
            started,
            started_unix: now_unix.saturating_sub(u64::try_from(since).unwrap_or(u64::MAX)),
            spans: Vec::with_capacity(16),
            root_attributes: Vec::with_capacity(8),
            error: None,
        }))
    }

    /// The `traceparent` to forward: the trace continues under epp's span.
    pub(crate) fn traceparent(&self) -> String {
        format!("00-{}-{}-01", hex(&self.trace_id), hex(&self.root))
    }

    /// The `tracestate` to forward with it, if the caller sent one.
    pub(crate) fn tracestate(&self) -> Option<&str> {
        (!self.trace_state.is_empty()).then_some(self.trace_state.as_str())
    }

    fn unix(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.started) {
            Some(d) => self
                .started_unix
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            None => self.started_unix.saturating_sub(
                u64::try_from(self.started.duration_since(t).as_nanos()).unwrap_or(u64::MAX),
            ),
        }
    }

    /// Adds a finished span under `parent` (the root when `None`); returns its id.
    pub(crate) fn span(
        &mut self,
        parent: Option<[u8; 8]>,
        name: impl Into<Cow<'static, str>>,
        start: Instant,
        end: Instant,
        attributes: Vec<(&'static str, AttrValue)>,
        error: Option<String>,
    ) -> [u8; 8] {
        self.span_with_id(new_span_id(), parent, name, start, end, attributes, error)
    }

    /// Adds the decision's span, from `start` to now, with the attributes
    /// noted and `error` when it was refused.
    pub(crate) fn orchestrated(&mut self, start: Instant, error: Option<String>) {
        let attributes = std::mem::take(&mut self.orchestration_attributes);
        self.span_with_id(
            self.orchestration,
            None,
            "gateway.request_orchestration",
            start,
            Instant::now(),
            attributes,
            error,
        );
    }

    /// Notes the request as understood: on the decision's span and the root.
    pub(crate) fn note_request(&mut self, request: &InferenceRequest) {
        let a = &mut self.orchestration_attributes;
        a.push(("target_model", AttrValue::Str(request.target_model.clone())));
        a.push(("request_prio", AttrValue::Int(i64::from(request.priority))));
        a.extend(request_attributes(request));
        a.push((
            "llm_d.epp.incoming_model",
            AttrValue::Str(request.model.clone()),
        ));
        if let Some(o) = &request.objective {
            a.push(("llm_d.epp.objective", AttrValue::Str(o.clone())));
        }
        a.push((
            "llm_d.epp.fairness_id",
            AttrValue::Str(request.fairness_id.clone()),
        ));
        self.root_attributes.extend(request_attributes(request));
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "a span's fields, each given once"
    )]
    fn span_with_id(
        &mut self,
        id: [u8; 8],
        parent: Option<[u8; 8]>,
        name: impl Into<Cow<'static, str>>,
        start: Instant,
        end: Instant,
        attributes: Vec<(&'static str, AttrValue)>,
        error: Option<String>,
    ) -> [u8; 8] {
        let (start_unix_nanos, end_unix_nanos) = (self.unix(start), self.unix(end));
        self.spans.push(SpanRecord {
            span_id: id,
            parent_span_id: Some(parent.unwrap_or(self.root)),
            name: name.into(),
            kind: SpanKind::Internal,
            start_unix_nanos,
            end_unix_nanos,
            attributes,
            error,
        });
        id
    }

    /// Ends the root span now and hands the trace to the tracer.
    pub(crate) fn finish(mut self: Box<Self>) {
        let end = self.unix(Instant::now());
        let root = SpanRecord {
            span_id: self.root,
            parent_span_id: self.parent,
            name: Cow::Borrowed("gateway.request"),
            kind: SpanKind::Server,
            start_unix_nanos: self.started_unix,
            end_unix_nanos: end,
            attributes: std::mem::take(&mut self.root_attributes),
            error: self.error.take(),
        };
        self.spans.push(root);
        let trace = RequestTrace {
            trace_id: self.trace_id,
            trace_state: std::mem::take(&mut self.trace_state),
            spans: std::mem::take(&mut self.spans),
        };
        self.tracer.export(trace);
    }
}

/// The raw events of one recorded scheduling cycle.
#[derive(Debug, Default)]
pub(crate) struct CycleEvents {
    calls: Vec<(usize, Instant, Instant)>,
    runs: Vec<ProfileRun>,
}

impl CycleRecorder for CycleEvents {
    fn plugin_call(&mut self, site: usize, start: Instant, end: Instant) {
        self.calls.push((site, start, end));
    }
    fn profile_run(&mut self, run: ProfileRun) {
        self.runs.push(run);
    }
}

/// Attributes every scheduling span carries (the reference's).
fn request_attributes(request: &InferenceRequest) -> Vec<(&'static str, AttrValue)> {
    vec![
        (
            "gen_ai.request.model",
            AttrValue::Str(request.target_model.clone()),
        ),
        (
            "gen_ai.request.id",
            AttrValue::Str(request.request_id.clone()),
        ),
    ]
}

fn count(n: usize) -> AttrValue {
    AttrValue::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

impl CycleEvents {
    /// Turns the events into spans under `scheduling` (the cycle's span).
    pub(crate) fn record(
        &self,
        trace: &mut ActiveTrace,
        scheduling: [u8; 8],
        scheduler: &Scheduler,
        request: &InferenceRequest,
        result: Option<&SchedulingResult>,
    ) {
        let sites = scheduler.call_sites();
        // The profile runs first, so their plugins can be put under them.
        let mut runs = Vec::with_capacity(self.runs.len());
        for (i, run) in self.runs.iter().enumerate() {
            let name = scheduler
                .profiles()
                .get(run.profile)
                .map_or("", |p| p.name())
                .to_owned();
            let id = trace.span(
                Some(scheduling),
                "run_scheduler_profile",
                run.start,
                run.end,
                vec![("llm_d.epp.scheduling.profile.name", AttrValue::Str(name))],
                None,
            );
            let picks = result.and_then(|r| r.runs.get(i));
            runs.push((run, id, picks));
        }
        // Filters and scorers of each run, grouped under one span each.
        let sites = &sites;
        for &(run, run_id, _) in &runs {
            let of = |point| {
                self.calls
                    .iter()
                    .filter(|&&(site, start, end)| {
                        run.start <= start
                            && end <= run.end
                            && sites.get(site).is_some_and(|s| s.point == point)
                    })
                    .collect::<Vec<_>>()
            };
            let filters = of(ExtensionPoint::Filter);
            if let (Some(first), Some(last)) = (filters.first(), filters.last()) {
                let mut attrs = vec![
                    (
                        "llm_d.epp.filter.candidate_endpoints",
                        count(run.candidates),
                    ),
                    ("llm_d.epp.filter.filtered_endpoints", count(run.filtered)),
                ];
                attrs.extend(request_attributes(request));
                let group = trace.span(
                    Some(run_id),
                    "filter_endpoints",
                    first.1,
                    last.2,
                    attrs,
                    None,
                );
                for &&(site, start, end) in &filters {
                    plugin_span(trace, group, &sites[site], start, end, Vec::new());
                }
            }
            let scorers = of(ExtensionPoint::Scorer);
            if let (Some(first), Some(last)) = (scorers.first(), scorers.last()) {
                let mut attrs = vec![
                    ("llm_d.epp.scorer.count", count(scorers.len())),
                    ("llm_d.epp.scoring.candidate_endpoints", count(run.filtered)),
                ];
                attrs.extend(request_attributes(request));
                let group = trace.span(
                    Some(run_id),
                    "llm_d.epp.scoring",
                    first.1,
                    last.2,
                    attrs,
                    None,
                );
                let profile = scheduler.profiles().get(run.profile);
                for (i, &&(site, start, end)) in scorers.iter().enumerate() {
                    let p = sites[site].plugin.plugin();
                    let weight = profile
                        .and_then(|p| p.scorers().get(i))
                        .map_or(1.0, |s| s.weight);
                    let attrs = vec![
                        (
                            "llm_d.epp.scorer.type",
                            AttrValue::Str(p.type_name().into()),
                        ),
                        ("llm_d.epp.scorer.name", AttrValue::Str(p.name().into())),
                        ("llm_d.epp.scorer.weight", AttrValue::Float(weight)),
                        ("llm_d.epp.scorer.candidate_endpoints", count(run.filtered)),
                    ];
                    plugin_span(trace, group, &sites[site], start, end, attrs);
                }
            }
        }
        // Everything else: the picker under its run, the rest under the cycle.
        for &(site, start, end) in &self.calls {
            let Some(call) = sites.get(site) else {
                continue;
            };
            match call.point {
                ExtensionPoint::Filter | ExtensionPoint::Scorer => {}
                ExtensionPoint::Picker => {
                    let Some(&(run, run_id, picks)) = runs
                        .iter()
                        .find(|(r, _, _)| r.start <= start && end <= r.end)
                    else {
                        continue;
                    };
                    let mut attrs =
                        vec![("llm_d.epp.picker.candidate_endpoints", count(run.filtered))];
                    if let Some(picks) = picks.filter(|p| !p.targets.is_empty()) {
                        let n = picks.targets.len().min(TOP_ENDPOINTS);
                        attrs.push((
                            "llm_d.epp.picker.top_endpoints",
                            AttrValue::StrList(
                                picks.targets[..n]
                                    .iter()
                                    .map(|e| e.addr_str().to_owned())
                                    .collect(),
                            ),
                        ));
                        attrs.push((
                            "llm_d.epp.picker.top_scores",
                            AttrValue::FloatList(picks.scores.iter().take(n).copied().collect()),
                        ));
                    }
                    attrs.extend(request_attributes(request));
                    let p = call.plugin.plugin();
                    attrs.push((
                        "llm_d.epp.plugin.type",
                        AttrValue::Str(p.type_name().into()),
                    ));
                    attrs.push(("llm_d.epp.plugin.name", AttrValue::Str(p.name().into())));
                    attrs.push((
                        "llm_d.epp.extension_point",
                        AttrValue::Str(call.point.as_str().into()),
                    ));
                    trace.span(Some(run_id), "pick_endpoints", start, end, attrs, None);
                }
                _ => plugin_span(trace, scheduling, call, start, end, Vec::new()),
            }
        }
    }
}

/// A span for one plugin call: `llm_d.epp.<point>.<type>`.
fn plugin_span(
    trace: &mut ActiveTrace,
    parent: [u8; 8],
    call: &epp_core::CallSite,
    start: Instant,
    end: Instant,
    mut attrs: Vec<(&'static str, AttrValue)>,
) {
    let p = call.plugin.plugin();
    let point = match call.point {
        ExtensionPoint::ProfilePicker => "profile_picker",
        ExtensionPoint::SaturationDetector => "saturation_detector",
        ExtensionPoint::DataProducer => "data_producer",
        ExtensionPoint::Filter => "filter",
        ExtensionPoint::Scorer => "scorer",
        ExtensionPoint::Picker => "picker",
        ExtensionPoint::PreRequest => "pre_request",
        _ => "response",
    };
    attrs.push((
        "llm_d.epp.plugin.type",
        AttrValue::Str(p.type_name().into()),
    ));
    attrs.push(("llm_d.epp.plugin.name", AttrValue::Str(p.name().into())));
    attrs.push((
        "llm_d.epp.extension_point",
        AttrValue::Str(call.point.as_str().into()),
    ));
    let name = format!("llm_d.epp.{point}.{}", p.type_name());
    trace.span(Some(parent), name, start, end, attrs, None);
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_the_spec_examples_and_refuses_the_rest() {
        let p = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("valid");
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        let p = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
            .expect("valid");
        assert!(!p.sampled);
        // A future version may add fields after a dash.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }
}
