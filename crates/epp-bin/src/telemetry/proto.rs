//! The OTLP trace messages epp sends, written out with prost (the stable
//! `opentelemetry/proto` v1 schema: `collector/trace/v1/trace_service.proto`,
//! `trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`). Only the fields epp fills or reads; the
//! tags are the schema's, so any OTLP receiver decodes them.

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_spans: Vec<ResourceSpans>,
}

/// `ExportTraceServiceResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) partial_success: Option<ExportTracePartialSuccess>,
}

/// `ExportTracePartialSuccess`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub(crate) rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub(crate) error_message: String,
}

/// `ResourceSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_spans: Vec<ScopeSpans>,
}

/// `Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub(crate) attributes: Vec<KeyValue>,
}

/// `ScopeSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) spans: Vec<Span>,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) version: String,
}

/// `Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub(crate) trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub(crate) name: String,
    /// `SpanKind`: 1 internal, 2 server.
    #[prost(int32, tag = "6")]
    pub(crate) kind: i32,
    #[prost(fixed64, tag = "7")]
    pub(crate) start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub(crate) end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub(crate) status: Option<Status>,
    /// W3C trace flags (bit 0: sampled) and, bits 8-9, whether the parent is remote.
    #[prost(fixed32, tag = "16")]
    pub(crate) flags: u32,
}

/// `Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Status {
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    /// `StatusCode`: 0 unset, 1 ok, 2 error.
    #[prost(int32, tag = "3")]
    pub(crate) code: i32,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
}

/// `AnyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4, 5")]
    pub(crate) value: Option<Value>,
}

/// `AnyValue.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Value {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
    #[prost(message, tag = "5")]
    Array(ArrayValue),
}

/// `ArrayValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub(crate) values: Vec<AnyValue>,
}
