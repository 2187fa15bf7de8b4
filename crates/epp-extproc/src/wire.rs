//! The ext_proc messages (`envoy.service.ext_proc.v3`) as epp reads and
//! writes them: only the fields epp uses, bodies and header bytes as
//! [`Bytes`] slices of the buffer the message was decoded from.
//!
//! Field numbers and wire types are Envoy's; a field epp does not read is
//! skipped by the decoder, so a newer Envoy's additions are ignored as any
//! protobuf reader ignores them. Three deliberate narrowings, all
//! wire-compatible:
//! - header keys and values are read as `bytes` (a protobuf `string` has the
//!   same encoding): no UTF-8 check, copy or allocation per header while
//!   decoding; the few headers epp reads are converted where it reads them;
//! - `google.protobuf.Struct` is a repeated entry message (a protobuf map is
//!   exactly that on the wire), so a reply's metadata is a small `Vec`, not
//!   two hash maps;
//! - enums are plain `int32` (same varint).
//!
//! Compared with the generated Envoy types, a body arrives without a copy
//! (it is a slice of the gRPC receive buffer) and goes back without one until
//! the encoder writes it into the frame.
#![expect(
    clippy::enum_variant_names,
    reason = "the oneof cases keep the protocol's names (RequestHeaders, StringValue, ...)"
)]

use bytes::Bytes;

// === what Envoy sends ===

/// `ProcessingRequest`: one message of Envoy's side of the stream.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProcessingRequest {
    #[prost(oneof = "Request", tags = "2, 3, 4, 5, 6, 7")]
    pub(crate) request: Option<Request>,
    /// `config.core.v3.Metadata` (the filter's `metadata_options`).
    #[prost(message, optional, tag = "8")]
    pub(crate) metadata_context: Option<Metadata>,
    /// `map<string, google.protobuf.Struct>`: the attributes the filter was
    /// asked to send, by filter name.
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<StructEntry>,
    #[prost(bool, tag = "10")]
    pub(crate) observability_mode: bool,
    /// Sent on the stream's first message only.
    #[prost(message, optional, tag = "11")]
    pub(crate) protocol_config: Option<ProtocolConfiguration>,
}

/// `ProcessingRequest.request`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Request {
    #[prost(message, tag = "2")]
    RequestHeaders(HttpHeaders),
    #[prost(message, tag = "3")]
    ResponseHeaders(HttpHeaders),
    #[prost(message, tag = "4")]
    RequestBody(HttpBody),
    #[prost(message, tag = "5")]
    ResponseBody(HttpBody),
    /// The trailers themselves are not read.
    #[prost(message, tag = "6")]
    RequestTrailers(HttpTrailers),
    #[prost(message, tag = "7")]
    ResponseTrailers(HttpTrailers),
}

/// `ProtocolConfiguration`: the filter's body modes (`BodySendMode`).
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct ProtocolConfiguration {
    #[prost(int32, tag = "1")]
    pub(crate) request_body_mode: i32,
    #[prost(int32, tag = "2")]
    pub(crate) response_body_mode: i32,
}

/// `HttpHeaders` (the deprecated `attributes`, tag 2, is skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HttpHeaders {
    #[prost(message, optional, tag = "1")]
    pub(crate) headers: Option<HeaderMap>,
    #[prost(bool, tag = "3")]
    pub(crate) end_of_stream: bool,
}

/// `config.core.v3.HeaderMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub(crate) headers: Vec<HeaderValue>,
}

/// `config.core.v3.HeaderValue` as received: Envoy puts the value in
/// `raw_value` (or, in older versions, `value`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderValue {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) value: Bytes,
    #[prost(bytes = "bytes", tag = "3")]
    pub(crate) raw_value: Bytes,
}

impl HeaderValue {
    /// The value's bytes, wherever Envoy put them.
    pub(crate) fn value_bytes(&self) -> &[u8] {
        if self.raw_value.is_empty() {
            &self.value
        } else {
            &self.raw_value
        }
    }
}

/// `HttpBody`: a body or a chunk of one.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HttpBody {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) body: Bytes,
    #[prost(bool, tag = "2")]
    pub(crate) end_of_stream: bool,
}

/// `HttpTrailers`, contents skipped.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct HttpTrailers {}

/// `config.core.v3.Metadata` (`typed_filter_metadata`, tag 2, is skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Metadata {
    /// `map<string, google.protobuf.Struct>`, by namespace.
    #[prost(message, repeated, tag = "1")]
    pub(crate) filter_metadata: Vec<StructEntry>,
}

// === google.protobuf.Struct, both ways ===

/// `google.protobuf.Struct`: its `map<string, Value>` as the repeated entry
/// message it is on the wire. Lookups are linear: these hold a handful of
/// keys.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Struct {
    #[prost(message, repeated, tag = "1")]
    pub(crate) fields: Vec<FieldEntry>,
}

impl Struct {
    /// The value of `key` (the last one, as protobuf maps merge).
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.fields
            .iter()
            .rev()
            .find(|e| e.key == key)
            .and_then(|e| e.value.as_ref())
    }
}

/// One entry of a `Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct FieldEntry {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<Value>,
}

/// One entry of a `map<string, google.protobuf.Struct>`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StructEntry {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<Struct>,
}

/// The `Struct` of `key` in a `map<string, Struct>` (the last one).
pub(crate) fn struct_of<'a>(entries: &'a [StructEntry], key: &str) -> Option<&'a Struct> {
    entries
        .iter()
        .rev()
        .find(|e| e.key == key)
        .and_then(|e| e.value.as_ref())
}

/// `google.protobuf.Value`: the kinds epp reads or writes (a number, bool
/// or null is skipped, leaving `kind` empty).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Value {
    #[prost(oneof = "Kind", tags = "3, 5, 6")]
    pub(crate) kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Kind {
    #[prost(string, tag = "3")]
    StringValue(String),
    #[prost(message, tag = "5")]
    StructValue(Struct),
    #[prost(message, tag = "6")]
    ListValue(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub(crate) values: Vec<Value>,
}

// === what epp answers ===

/// `ProcessingResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProcessingResponse {
    #[prost(oneof = "Response", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub(crate) response: Option<Response>,
    #[prost(message, optional, tag = "8")]
    pub(crate) dynamic_metadata: Option<Struct>,
}

/// `ProcessingResponse.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Response {
    #[prost(message, tag = "1")]
    RequestHeaders(HeadersResponse),
    #[prost(message, tag = "2")]
    ResponseHeaders(HeadersResponse),
    #[prost(message, tag = "3")]
    RequestBody(BodyResponse),
    #[prost(message, tag = "4")]
    ResponseBody(BodyResponse),
    #[prost(message, tag = "5")]
    RequestTrailers(TrailersResponse),
    #[prost(message, tag = "6")]
    ResponseTrailers(TrailersResponse),
    #[prost(message, tag = "7")]
    ImmediateResponse(ImmediateResponse),
}

/// `HeadersResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeadersResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) response: Option<CommonResponse>,
}

/// `BodyResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct BodyResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) response: Option<CommonResponse>,
}

/// `TrailersResponse`, empty: epp never changes trailers.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct TrailersResponse {}

/// `CommonResponse` (`status` is left at CONTINUE; `trailers` unused).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CommonResponse {
    #[prost(message, optional, tag = "2")]
    pub(crate) header_mutation: Option<HeaderMutation>,
    #[prost(message, optional, tag = "3")]
    pub(crate) body_mutation: Option<BodyMutation>,
    #[prost(bool, tag = "5")]
    pub(crate) clear_route_cache: bool,
}

/// `HeaderMutation`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderMutation {
    #[prost(message, repeated, tag = "1")]
    pub(crate) set_headers: Vec<HeaderValueOption>,
    #[prost(string, repeated, tag = "2")]
    pub(crate) remove_headers: Vec<String>,
}

/// `config.core.v3.HeaderValueOption`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub(crate) header: Option<HeaderValue>,
    /// `HeaderAppendAction`.
    #[prost(int32, tag = "3")]
    pub(crate) append_action: i32,
}

/// `HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD`.
pub(crate) const OVERWRITE_IF_EXISTS_OR_ADD: i32 = 2;

/// `BodyMutation`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct BodyMutation {
    #[prost(oneof = "Mutation", tags = "1, 3")]
    pub(crate) mutation: Option<Mutation>,
}

/// `BodyMutation.mutation`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Mutation {
    /// The whole body replaced (BUFFERED / STREAMED).
    #[prost(bytes = "bytes", tag = "1")]
    Body(Bytes),
    /// A FULL_DUPLEX_STREAMED chunk.
    #[prost(message, tag = "3")]
    StreamedResponse(StreamedBodyResponse),
}

/// `StreamedBodyResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StreamedBodyResponse {
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) body: Bytes,
    #[prost(bool, tag = "2")]
    pub(crate) end_of_stream: bool,
}

/// `ImmediateResponse` (`grpc_status` unused).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ImmediateResponse {
    #[prost(message, optional, tag = "1")]
    pub(crate) status: Option<HttpStatus>,
    #[prost(message, optional, tag = "2")]
    pub(crate) headers: Option<HeaderMutation>,
    #[prost(bytes = "bytes", tag = "3")]
    pub(crate) body: Bytes,
    #[prost(string, tag = "5")]
    pub(crate) details: String,
}

/// `type.v3.HttpStatus`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct HttpStatus {
    #[prost(int32, tag = "1")]
    pub(crate) code: i32,
}

#[cfg(test)]
mod tests {
    //! Each way checked against Envoy's generated types (`envoy-types`), an
    //! encoding these types did not write.

    use envoy_types::pb::{
        envoy::{
            config::core::v3 as core,
            service::ext_proc::v3::{self as ep, processing_request, processing_response},
        },
        google::protobuf as pbuf,
    };
    use prost::Message;

    use super::*;

    fn header(key: &str, value: &str) -> core::HeaderValue {
        core::HeaderValue {
            key: key.to_owned(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }
    }

    fn string_value(s: &str) -> pbuf::Value {
        pbuf::Value {
            kind: Some(pbuf::value::Kind::StringValue(s.to_owned())),
        }
    }

    fn one_field(key: &str, value: pbuf::Value) -> pbuf::Struct {
        pbuf::Struct {
            fields: [(key.to_owned(), value)].into_iter().collect(),
        }
    }

    #[test]
    fn reads_what_envoy_sends() {
        let sent = ep::ProcessingRequest {
            request: Some(processing_request::Request::RequestHeaders(
                ep::HttpHeaders {
                    headers: Some(core::HeaderMap {
                        headers: vec![
                            header(":path", "/v1/completions"),
                            core::HeaderValue {
                                key: "X-Old".into(),
                                value: "in value".into(),
                                raw_value: Vec::new(),
                            },
                        ],
                    }),
                    end_of_stream: true,
                    ..ep::HttpHeaders::default()
                },
            )),
            metadata_context: Some(core::Metadata {
                filter_metadata: [(
                    "envoy.lb.subset_hint".to_owned(),
                    one_field(
                        "x-gateway-destination-endpoint-subset",
                        pbuf::Value {
                            kind: Some(pbuf::value::Kind::ListValue(pbuf::ListValue {
                                values: vec![string_value("10.0.0.1:8000"), string_value("b")],
                            })),
                        },
                    ),
                )]
                .into_iter()
                .collect(),
                ..core::Metadata::default()
            }),
            attributes: [(
                "envoy.filters.http.ext_proc".to_owned(),
                one_field("upstream.address", string_value("10.0.0.2:8000")),
            )]
            .into_iter()
            .collect(),
            observability_mode: true,
            protocol_config: Some(ep::ProtocolConfiguration {
                request_body_mode: 4,
                response_body_mode: 2,
                send_body_without_waiting_for_header_response: true,
            }),
            ..ep::ProcessingRequest::default()
        };
        let got = ProcessingRequest::decode(Bytes::from(sent.encode_to_vec())).unwrap();
        let Some(Request::RequestHeaders(h)) = &got.request else {
            panic!("{got:?}");
        };
        assert!(h.end_of_stream);
        let headers = &h.headers.as_ref().unwrap().headers;
        assert_eq!(&headers[0].key[..], b":path");
        assert_eq!(headers[0].value_bytes(), b"/v1/completions");
        assert_eq!(headers[1].value_bytes(), b"in value");
        let subset = struct_of(
            &got.metadata_context.as_ref().unwrap().filter_metadata,
            "envoy.lb.subset_hint",
        )
        .and_then(|s| s.get("x-gateway-destination-endpoint-subset"));
        let Some(Value {
            kind: Some(Kind::ListValue(list)),
        }) = subset
        else {
            panic!("{subset:?}");
        };
        assert_eq!(list.values.len(), 2);
        let address = struct_of(&got.attributes, "envoy.filters.http.ext_proc")
            .and_then(|s| s.get("upstream.address"));
        assert_eq!(
            address.and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("10.0.0.2:8000".into()))
        );
        assert!(got.observability_mode);
        assert_eq!(
            got.protocol_config,
            Some(ProtocolConfiguration {
                request_body_mode: 4,
                response_body_mode: 2
            })
        );
    }

    #[test]
    fn a_body_is_a_slice_of_the_received_buffer() {
        let body = vec![b'x'; 64 * 1024];
        let sent = ep::ProcessingRequest {
            request: Some(processing_request::Request::RequestBody(ep::HttpBody {
                body: body.clone(),
                end_of_stream: true,
                ..ep::HttpBody::default()
            })),
            ..ep::ProcessingRequest::default()
        };
        let buffer = Bytes::from(sent.encode_to_vec());
        let range = buffer.as_ptr_range();
        let got = ProcessingRequest::decode(buffer.clone()).unwrap();
        let Some(Request::RequestBody(b)) = got.request else {
            panic!("not a body");
        };
        assert_eq!(&b.body[..], &body[..]);
        assert!(b.end_of_stream);
        // No copy: the body points into the buffer it was decoded from.
        assert!(range.contains(&b.body.as_ptr()));
    }

    #[test]
    fn envoy_reads_what_epp_answers() {
        let metadata = Struct {
            fields: vec![FieldEntry {
                key: "envoy.lb".into(),
                value: Some(Value {
                    kind: Some(Kind::StructValue(Struct {
                        fields: vec![FieldEntry {
                            key: "x-gateway-destination-endpoint".into(),
                            value: Some(Value {
                                kind: Some(Kind::StringValue("10.0.0.1:8000,10.0.0.2:8000".into())),
                            }),
                        }],
                    })),
                }),
            }],
        };
        let reply = ProcessingResponse {
            response: Some(Response::RequestHeaders(HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(HeaderMutation {
                        set_headers: vec![HeaderValueOption {
                            header: Some(HeaderValue {
                                key: Bytes::from_static(b"x-gateway-destination-endpoint"),
                                value: Bytes::new(),
                                raw_value: Bytes::from_static(b"10.0.0.1:8000"),
                            }),
                            append_action: OVERWRITE_IF_EXISTS_OR_ADD,
                        }],
                        remove_headers: vec!["content-length".into()],
                    }),
                    body_mutation: Some(BodyMutation {
                        mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                            body: Bytes::from_static(b"{\"model\":\"m\"}"),
                            end_of_stream: true,
                        })),
                    }),
                    clear_route_cache: true,
                }),
            })),
            dynamic_metadata: Some(metadata),
        };
        let got = ep::ProcessingResponse::decode(&reply.encode_to_vec()[..]).unwrap();
        let Some(processing_response::Response::RequestHeaders(h)) = &got.response else {
            panic!("{got:?}");
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let mutation = common.header_mutation.as_ref().unwrap();
        let set = mutation.set_headers[0].header.as_ref().unwrap();
        assert_eq!(set.key, "x-gateway-destination-endpoint");
        assert_eq!(set.raw_value, b"10.0.0.1:8000");
        assert_eq!(
            mutation.set_headers[0].append_action,
            core::header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32
        );
        assert_eq!(mutation.remove_headers, ["content-length"]);
        let Some(ep::body_mutation::Mutation::StreamedResponse(s)) = common
            .body_mutation
            .as_ref()
            .and_then(|m| m.mutation.as_ref())
        else {
            panic!("{common:?}");
        };
        assert_eq!(s.body, b"{\"model\":\"m\"}");
        assert!(s.end_of_stream);
        let lb = &got.dynamic_metadata.as_ref().unwrap().fields["envoy.lb"];
        let Some(pbuf::value::Kind::StructValue(inner)) = &lb.kind else {
            panic!("{lb:?}");
        };
        assert_eq!(
            inner.fields["x-gateway-destination-endpoint"].kind,
            Some(pbuf::value::Kind::StringValue(
                "10.0.0.1:8000,10.0.0.2:8000".into()
            ))
        );

        let refused = ProcessingResponse {
            response: Some(Response::ImmediateResponse(ImmediateResponse {
                status: Some(HttpStatus { code: 429 }),
                headers: None,
                body: Bytes::from_static(b"{}"),
                details: "epp_x".into(),
            })),
            dynamic_metadata: None,
        };
        let got = ep::ProcessingResponse::decode(&refused.encode_to_vec()[..]).unwrap();
        let Some(processing_response::Response::ImmediateResponse(i)) = got.response else {
            panic!("not immediate");
        };
        assert_eq!(i.status.map(|s| s.code), Some(429));
        assert_eq!(i.body, b"{}");
        assert_eq!(i.details, "epp_x");
    }
}
