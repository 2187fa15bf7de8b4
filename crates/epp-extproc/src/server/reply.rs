//! The replies of one flush encoded for the wire: each with gRPC's 5-byte
//! prefix, all in one buffer, except the bytes of a large body (a body
//! mutation of at least [`LIFT_MIN`] bytes: a FULL_DUPLEX body streamed
//! back, a rewritten body), which go out as the [`Bytes`] they already are
//! (a slice of the message Envoy sent, or the rewritten body) instead of
//! being copied into the buffer. h2 writes a DATA frame that large from
//! where it lies, so such a body is not copied on the way out at all.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use prost::{
    Message,
    encoding::{WireType, encode_key, encode_varint},
};

use crate::wire::{BodyResponse, Mutation, ProcessingResponse, Response};

/// The smallest body sent apart from the buffer rather than copied into it.
/// Sending apart costs ~2.5 k instructions a body (two more DATA sends and
/// frames, a reference-counted slice of the buffer); the copy it saves runs
/// at tens of bytes a cycle, so it pays from a few tens of KiB. FULL_DUPLEX
/// pieces of a large body (up to 62,000 bytes) are above this.
pub(super) const LIFT_MIN: usize = 32 << 10;

/// The body of `reply` to send apart, if it has one that large.
pub(super) fn large_body(reply: &ProcessingResponse) -> Option<&Bytes> {
    let Some(Response::RequestBody(b) | Response::ResponseBody(b)) = &reply.response else {
        return None;
    };
    let body = match b
        .response
        .as_ref()?
        .body_mutation
        .as_ref()?
        .mutation
        .as_ref()?
    {
        Mutation::Body(body) => body,
        Mutation::StreamedResponse(s) => &s.body,
    };
    (body.len() >= LIFT_MIN).then_some(body)
}

/// Encodes `replies` (draining them) into one buffer of `total` bytes,
/// `lens` their encoded lengths (as far as it goes; the others are measured
/// again). For replies without a large body.
pub(super) fn encode(
    replies: &mut VecDeque<ProcessingResponse>,
    lens: &[usize],
    total: usize,
) -> Bytes {
    let mut buf = BytesMut::with_capacity(total);
    for (i, reply) in replies.drain(..).enumerate() {
        prefix(&reply, lens.get(i), &mut buf);
        reply.encode_raw(&mut buf);
    }
    buf.freeze()
}

/// [`encode`] with the large bodies sent apart: `copied` is what goes into
/// the buffer (all but those bodies).
pub(super) fn encode_apart(
    replies: &mut VecDeque<ProcessingResponse>,
    lens: &[usize],
    copied: usize,
) -> Parts {
    let mut buf = BytesMut::with_capacity(copied);
    let mut lifted = Vec::new();
    for (i, reply) in replies.drain(..).enumerate() {
        prefix(&reply, lens.get(i), &mut buf);
        if large_body(&reply).is_some() {
            encode_lifting(&reply, &mut buf, &mut lifted);
        } else {
            reply.encode_raw(&mut buf);
        }
    }
    Parts {
        buf: buf.freeze(),
        at: 0,
        lifted: lifted.into_iter(),
        body: None,
    }
}

/// gRPC's prefix of `reply`: uncompressed, its length (`len` if known).
fn prefix(reply: &ProcessingResponse, len: Option<&usize>, buf: &mut BytesMut) {
    let len = match len {
        Some(&len) => len,
        None => reply.encoded_len(),
    };
    buf.put_u8(0);
    // A reply is at most a body slice of a received message plus a few
    // fields: far below 4 GiB.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
}

/// `reply` (a body reply) as prost encodes it, fields in tag order, but its
/// body left out of `buf` and put in `lifted` with the offset it follows.
fn encode_lifting(
    reply: &ProcessingResponse,
    buf: &mut BytesMut,
    lifted: &mut Vec<(usize, Bytes)>,
) {
    let (tag, response) = match &reply.response {
        Some(Response::RequestBody(b)) => (3, b),
        Some(Response::ResponseBody(b)) => (4, b),
        _ => {
            reply.encode_raw(buf);
            return;
        }
    };
    nested(tag, response.encoded_len(), buf);
    encode_body_response(response, buf, lifted);
    if let Some(metadata) = &reply.dynamic_metadata {
        prost::encoding::message::encode(8, metadata, buf);
    }
}

fn encode_body_response(
    response: &BodyResponse,
    buf: &mut BytesMut,
    lifted: &mut Vec<(usize, Bytes)>,
) {
    let Some(common) = &response.response else {
        return;
    };
    nested(1, common.encoded_len(), buf);
    if let Some(headers) = &common.header_mutation {
        prost::encoding::message::encode(2, headers, buf);
    }
    if let Some(mutation) = &common.body_mutation {
        nested(3, mutation.encoded_len(), buf);
        match &mutation.mutation {
            // A oneof case is written even when empty.
            Some(Mutation::Body(body)) => lift(1, body, buf, lifted),
            Some(Mutation::StreamedResponse(s)) => {
                nested(3, s.encoded_len(), buf);
                if !s.body.is_empty() {
                    lift(1, &s.body, buf, lifted);
                }
                if s.end_of_stream {
                    prost::encoding::bool::encode(2, &true, buf);
                }
            }
            None => {}
        }
    }
    if common.clear_route_cache {
        prost::encoding::bool::encode(5, &true, buf);
    }
}

/// The key and length of a nested message (or bytes field) of `len` bytes.
fn nested(tag: u32, len: usize, buf: &mut BytesMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// A bytes field whose bytes are sent apart.
fn lift(tag: u32, body: &Bytes, buf: &mut BytesMut, lifted: &mut Vec<(usize, Bytes)>) {
    nested(tag, body.len(), buf);
    lifted.push((buf.len(), body.clone()));
}

/// The encoded replies as the pieces to send, in order: the buffer up to a
/// large body, the body, the buffer up to the next, ..., the buffer's rest.
/// Without a large body, the buffer alone.
#[derive(Debug)]
pub(super) struct Parts {
    /// What is left of the buffer.
    buf: Bytes,
    /// Its offset in the whole buffer.
    at: usize,
    lifted: std::vec::IntoIter<(usize, Bytes)>,
    /// A body to send next.
    body: Option<Bytes>,
}

impl Iterator for Parts {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if let Some(body) = self.body.take() {
            return Some(body);
        }
        if let Some((end, body)) = self.lifted.next() {
            let part = self.buf.split_to(end - self.at);
            self.at = end;
            self.body = Some(body);
            return Some(part);
        }
        let rest = std::mem::take(&mut self.buf);
        (!rest.is_empty()).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        BodyMutation, CommonResponse, FieldEntry, HeaderMutation, HeaderValue, HeaderValueOption,
        HeadersResponse, Kind, StreamedBodyResponse, Struct, Value,
    };

    fn body_reply(
        request: bool,
        mutation: Mutation,
        headers: bool,
        clear: bool,
        metadata: bool,
    ) -> ProcessingResponse {
        let common = CommonResponse {
            header_mutation: headers.then(|| HeaderMutation {
                set_headers: vec![HeaderValueOption {
                    header: Some(HeaderValue {
                        key: Bytes::from_static(b"content-length"),
                        value: Bytes::new(),
                        raw_value: Bytes::from_static(b"70000"),
                    }),
                    append_action: 2,
                }],
                remove_headers: vec!["x-old".into()],
            }),
            body_mutation: Some(BodyMutation {
                mutation: Some(mutation),
            }),
            clear_route_cache: clear,
        };
        let response = BodyResponse {
            response: Some(common),
        };
        ProcessingResponse {
            response: Some(if request {
                Response::RequestBody(response)
            } else {
                Response::ResponseBody(response)
            }),
            dynamic_metadata: metadata.then(|| Struct {
                fields: vec![FieldEntry {
                    key: "envoy.lb".into(),
                    value: Some(Value {
                        kind: Some(Kind::StringValue("10.0.0.1:8000".into())),
                    }),
                }],
            }),
        }
    }

    /// The bytes prost writes for `replies`, each with its prefix.
    fn prost_encoded(replies: &[ProcessingResponse]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in replies {
            let body = r.encode_to_vec();
            out.push(0);
            out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
            out.extend(body);
        }
        out
    }

    fn encoded(replies: &[ProcessingResponse]) -> Vec<Bytes> {
        let lens: Vec<usize> = replies.iter().map(Message::encoded_len).collect();
        let copied = replies
            .iter()
            .map(|r| 5 + r.encoded_len() - large_body(r).map_or(0, Bytes::len))
            .sum();
        let mut queue: VecDeque<_> = replies.iter().cloned().collect();
        // Only the first lengths given, as the caller does past 8 replies.
        let parts: Vec<Bytes> = encode_apart(&mut queue, &lens[..lens.len() / 2], copied).collect();
        assert!(queue.is_empty());
        parts
    }

    #[test]
    fn the_parts_are_the_bytes_prost_writes() {
        let big = Bytes::from(vec![b'x'; LIFT_MIN]);
        let huge = Bytes::from(vec![b'y'; 300_000]);
        let small = Bytes::from_static(b"{\"model\":\"m\"}");
        let streamed = |body: &Bytes, end| {
            Mutation::StreamedResponse(StreamedBodyResponse {
                body: body.clone(),
                end_of_stream: end,
            })
        };
        let mut replies = vec![ProcessingResponse {
            response: Some(Response::RequestHeaders(HeadersResponse {
                response: Some(CommonResponse::default()),
            })),
            dynamic_metadata: None,
        }];
        for request in [true, false] {
            for flags in 0..8 {
                let (headers, clear, metadata) = (flags & 1 != 0, flags & 2 != 0, flags & 4 != 0);
                for m in [
                    Mutation::Body(big.clone()),
                    Mutation::Body(small.clone()),
                    streamed(&huge, flags & 1 != 0),
                    streamed(&small, true),
                    streamed(&Bytes::new(), true),
                ] {
                    replies.push(body_reply(request, m, headers, clear, metadata));
                }
            }
        }
        let parts = encoded(&replies);
        assert_eq!(parts.concat(), prost_encoded(&replies));
        // Every large body went apart, as itself (no copy).
        let lifted: Vec<&Bytes> = parts.iter().filter(|p| p.len() >= LIFT_MIN).collect();
        assert_eq!(lifted.len(), 2 * 8 * 2);
        for p in lifted {
            assert!(
                p.as_ptr() == big.as_ptr() || p.as_ptr() == huge.as_ptr(),
                "a copy"
            );
        }
        assert!(parts.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn without_a_large_body_one_buffer() {
        let small = Bytes::from(vec![b'x'; LIFT_MIN - 1]);
        let replies = [
            body_reply(true, Mutation::Body(small.clone()), true, true, true),
            body_reply(false, Mutation::Body(small), false, false, false),
        ];
        let parts = encoded(&replies);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0], prost_encoded(&replies));
        assert!(encoded(&[]).is_empty());
        // And so without looking for one.
        let lens: Vec<usize> = replies.iter().map(Message::encoded_len).collect();
        let total = lens.iter().map(|l| 5 + l).sum();
        let mut queue: VecDeque<_> = replies.iter().cloned().collect();
        assert_eq!(encode(&mut queue, &lens[..1], total), parts[0]);
    }
}
