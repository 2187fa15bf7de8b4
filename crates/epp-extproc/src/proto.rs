//! Small builders for the ext_proc protobuf messages.

use bytes::Bytes;

use crate::{
    error::ExtProcError,
    wire::{
        BodyMutation, BodyResponse, CommonResponse, FieldEntry, HeaderMap, HeaderMutation,
        HeaderValue, HeaderValueOption, HeadersResponse, HttpStatus, ImmediateResponse, Kind,
        ListValue, Mutation, OVERWRITE_IF_EXISTS_OR_ADD, ProcessingRequest, ProcessingResponse,
        Response, StreamedBodyResponse, Struct, TrailersResponse, Value, struct_of,
    },
};

/// Headers as `(lower-case name, value)`; values from `raw_value` (Envoy's
/// encoding) or `value`.
pub(crate) fn header_pairs(map: Option<&HeaderMap>) -> Vec<(String, String)> {
    let Some(map) = map else { return Vec::new() };
    map.headers
        .iter()
        .map(|h| {
            let mut key = String::from_utf8_lossy(&h.key).into_owned();
            key.make_ascii_lowercase();
            let value = String::from_utf8_lossy(h.value_bytes()).into_owned();
            (key, value)
        })
        .collect()
}

/// A header set (overwriting any existing value), value in `raw_value`.
pub(crate) fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::new(),
            raw_value: Bytes::copy_from_slice(value.as_bytes()),
        }),
        append_action: OVERWRITE_IF_EXISTS_OR_ADD,
    }
}

pub(crate) fn common(mutation: Option<HeaderMutation>, clear_route_cache: bool) -> CommonResponse {
    CommonResponse {
        header_mutation: mutation,
        clear_route_cache,
        ..CommonResponse::default()
    }
}

pub(crate) fn reply(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        dynamic_metadata: None,
    }
}

pub(crate) fn request_headers(c: CommonResponse) -> Response {
    Response::RequestHeaders(HeadersResponse { response: Some(c) })
}

pub(crate) fn response_headers(c: CommonResponse) -> Response {
    Response::ResponseHeaders(HeadersResponse { response: Some(c) })
}

pub(crate) fn request_body(c: CommonResponse) -> Response {
    Response::RequestBody(BodyResponse { response: Some(c) })
}

pub(crate) fn response_body(c: CommonResponse) -> Response {
    Response::ResponseBody(BodyResponse { response: Some(c) })
}

pub(crate) fn request_trailers() -> Response {
    Response::RequestTrailers(TrailersResponse {})
}

pub(crate) fn response_trailers() -> Response {
    Response::ResponseTrailers(TrailersResponse {})
}

/// A FULL_DUPLEX_STREAMED body chunk sent back to Envoy.
pub(crate) fn streamed(body: Bytes, end_of_stream: bool) -> CommonResponse {
    CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                body,
                end_of_stream,
            })),
        }),
        ..CommonResponse::default()
    }
}

/// A whole-body replacement (BUFFERED / STREAMED modes).
pub(crate) fn replace_body(mut c: CommonResponse, body: Bytes) -> CommonResponse {
    c.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::Body(body)),
    });
    c
}

/// The local reply for a refused request: status, JSON body, content type,
/// and why it was dropped where llm-d says so
/// ([`crate::error::DROPPED_REASON_HEADER`]).
pub(crate) fn immediate(err: &ExtProcError) -> ProcessingResponse {
    let mut set_headers = vec![set_header("content-type", "application/json")];
    if let Some(reason) = err.dropped_reason() {
        set_headers.push(set_header(crate::error::DROPPED_REASON_HEADER, reason));
    }
    reply(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(err.http_status()),
        }),
        headers: Some(HeaderMutation {
            set_headers,
            remove_headers: Vec::new(),
        }),
        body: Bytes::from(err.json_body()),
        details: format!("epp_{}", err.code()),
    }))
}

/// `{namespace: {key: value}}` as dynamic metadata.
pub(crate) fn metadata(namespace: &str, key: &str, value: String) -> Struct {
    let entry = |key: &str, kind| FieldEntry {
        key: key.to_owned(),
        value: Some(Value { kind: Some(kind) }),
    };
    let inner = Struct {
        fields: vec![entry(key, Kind::StringValue(value))],
    };
    Struct {
        fields: vec![entry(namespace, Kind::StructValue(inner))],
    }
}

/// The strings of a metadata list value (other kinds are skipped); a single
/// string is read as a comma-separated list.
pub(crate) fn string_list(v: &Value) -> Vec<String> {
    match &v.kind {
        Some(Kind::ListValue(ListValue { values })) => values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.trim().to_owned()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The endpoint the gateway says served the request, from a response
/// message: `envoy.lb` / `x-gateway-destination-endpoint-served` in the
/// metadata context (the protocol's way), else Envoy's `upstream.address`
/// attribute (when the filter lists it in `response_attributes`).
pub(crate) fn served_endpoint(msg: &ProcessingRequest) -> Option<&str> {
    fn string(v: &Value) -> Option<&str> {
        match &v.kind {
            Some(Kind::StringValue(s)) if !s.trim().is_empty() => Some(s.trim()),
            _ => None,
        }
    }
    msg.metadata_context
        .as_ref()
        .and_then(|m| struct_of(&m.filter_metadata, crate::decision::DESTINATION_NAMESPACE))
        .and_then(|lb| lb.get(crate::decision::SERVED_KEY))
        .and_then(string)
        .or_else(|| {
            msg.attributes.iter().find_map(|entry| {
                entry
                    .value
                    .as_ref()?
                    .get(crate::decision::UPSTREAM_ADDRESS_ATTRIBUTE)
                    .and_then(string)
            })
        })
}
