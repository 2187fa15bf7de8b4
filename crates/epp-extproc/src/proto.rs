//! Small builders for the ext_proc protobuf messages.

use envoy_types::pb::{
    envoy::{
        config::core::v3::{
            HeaderMap, HeaderValue, HeaderValueOption, header_value_option::HeaderAppendAction,
        },
        service::ext_proc::v3::{
            BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse,
            ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
            TrailersResponse, body_mutation::Mutation, processing_response::Response,
        },
        r#type::v3::HttpStatus,
    },
    google::protobuf::{ListValue, Struct, Value, value::Kind},
};

use crate::error::ExtProcError;

/// Headers as `(lower-case name, value)`; values from `raw_value` (Envoy's
/// encoding) or `value`.
pub(crate) fn header_pairs(map: Option<&HeaderMap>) -> Vec<(String, String)> {
    let Some(map) = map else { return Vec::new() };
    map.headers
        .iter()
        .map(|h| {
            let value = if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            };
            (h.key.to_ascii_lowercase(), value)
        })
        .collect()
}

/// A header set (overwriting any existing value), value in `raw_value`.
pub(crate) fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
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
        ..ProcessingResponse::default()
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
    Response::RequestTrailers(TrailersResponse::default())
}

pub(crate) fn response_trailers() -> Response {
    Response::ResponseTrailers(TrailersResponse::default())
}

/// A FULL_DUPLEX_STREAMED body chunk sent back to Envoy.
pub(crate) fn streamed(body: Vec<u8>, end_of_stream: bool) -> CommonResponse {
    CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                body,
                end_of_stream,
                ..StreamedBodyResponse::default()
            })),
        }),
        ..CommonResponse::default()
    }
}

/// A whole-body replacement (BUFFERED / STREAMED modes).
pub(crate) fn replace_body(mut c: CommonResponse, body: Vec<u8>) -> CommonResponse {
    c.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::Body(body)),
    });
    c
}

/// The local reply for a refused request: status, JSON body, content type.
pub(crate) fn immediate(err: &ExtProcError) -> ProcessingResponse {
    reply(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(err.http_status()),
        }),
        headers: Some(HeaderMutation {
            set_headers: vec![set_header("content-type", "application/json")],
            remove_headers: Vec::new(),
        }),
        body: err.json_body(),
        details: format!("epp_{}", err.code()),
        ..ImmediateResponse::default()
    }))
}

/// `{namespace: {key: value}}` as dynamic metadata.
pub(crate) fn metadata(namespace: &str, key: &str, value: String) -> Struct {
    let inner = Struct {
        fields: [(
            key.to_owned(),
            Value {
                kind: Some(Kind::StringValue(value)),
            },
        )]
        .into_iter()
        .collect(),
    };
    Struct {
        fields: [(
            namespace.to_owned(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into_iter()
        .collect(),
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
        .and_then(|m| {
            m.filter_metadata
                .get(crate::decision::DESTINATION_NAMESPACE)
        })
        .and_then(|lb| lb.fields.get(crate::decision::SERVED_KEY))
        .and_then(string)
        .or_else(|| {
            msg.attributes.values().find_map(|attrs| {
                attrs
                    .fields
                    .get(crate::decision::UPSTREAM_ADDRESS_ATTRIBUTE)
                    .and_then(string)
            })
        })
}
