//! gRPC over HTTP/2 as the lean server speaks it: the 5-byte message prefix,
//! status codes, and the header blocks of a reply.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header::CONTENT_TYPE};

/// The gRPC status codes the server ends streams with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Ok = 0,
    Internal = 13,
    Unimplemented = 12,
    ResourceExhausted = 8,
}

impl Code {
    fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::Ok => "0",
            Self::ResourceExhausted => "8",
            Self::Unimplemented => "12",
            Self::Internal => "13",
        })
    }
}

/// A stream's final status: its code and, for an error, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl Status {
    pub(crate) fn ok() -> Self {
        Self {
            code: Code::Ok,
            message: String::new(),
        }
    }

    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The trailers carrying it (`grpc-status`, and `grpc-message`
    /// percent-encoded when there is one).
    pub(crate) fn trailers(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(2);
        self.add_to(&mut map);
        map
    }

    fn add_to(&self, map: &mut HeaderMap) {
        map.insert("grpc-status", self.code.header_value());
        if !self.message.is_empty()
            && let Ok(v) = HeaderValue::from_maybe_shared(percent_encode(&self.message))
        {
            map.insert("grpc-message", v);
        }
    }
}

/// The response headers opening a served stream.
pub(crate) fn response_head() -> Response<()> {
    let mut response = Response::new(());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A trailers-only reply: HTTP `status`, the gRPC status in the headers,
/// no body.
pub(crate) fn trailers_only(status: StatusCode, grpc: &Status) -> Response<()> {
    let mut response = response_head();
    *response.status_mut() = status;
    grpc.add_to(response.headers_mut());
    response
}

/// Whether `content_type` is gRPC's (`application/grpc`, optionally
/// `+proto` or parameters), not gRPC-Web's.
pub(crate) fn is_grpc_content_type(content_type: &[u8]) -> bool {
    match content_type.strip_prefix(b"application/grpc") {
        Some(rest) => rest.is_empty() || rest[0] == b'+' || rest[0] == b';',
        None => false,
    }
}

/// gRPC's percent-encoding of `grpc-message`: bytes outside printable ASCII,
/// and `%`, as `%XX`.
pub(crate) fn percent_encode(message: &str) -> Bytes {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = BytesMut::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.extend_from_slice(&[b]);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    out.freeze()
}

// === message framing ===

/// Length-prefixed messages cut out of the DATA frames of one stream. A
/// message lying whole in one frame is a slice of it (no copy); one split
/// across frames is copied once into a buffer of its exact size.
#[derive(Debug)]
pub(crate) struct Deframer {
    /// The rest of the last frame, not yet cut.
    rest: Bytes,
    /// The prefix of a message split across frames, while incomplete.
    head: [u8; 5],
    head_len: usize,
    /// Its body, while incomplete (capacity: its length).
    body: BytesMut,
    body_len: usize,
    max: usize,
}

impl Deframer {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            rest: Bytes::new(),
            head: [0; 5],
            head_len: 0,
            body: BytesMut::new(),
            body_len: 0,
            max,
        }
    }

    /// Takes the payload of a DATA frame (only once [`Self::next`] returned
    /// `None`).
    pub(crate) fn push(&mut self, data: Bytes) {
        debug_assert!(self.rest.is_empty());
        self.rest = data;
    }

    /// Whether bytes of an unfinished message are held (at the stream's
    /// end: a truncated message).
    pub(crate) fn is_mid_message(&self) -> bool {
        self.head_len > 0 || !self.rest.is_empty()
    }

    /// The next whole message, `None` when more data is needed.
    pub(crate) fn next(&mut self) -> Result<Option<Bytes>, Status> {
        if self.head_len == 0 {
            // The fast path: a whole message at the front of the frame.
            if self.rest.len() < 5 {
                if self.rest.is_empty() {
                    return Ok(None);
                }
            } else {
                let len = self.check(&self.rest[..5])?;
                if self.rest.len() - 5 >= len {
                    self.rest.advance(5);
                    return Ok(Some(self.rest.split_to(len)));
                }
            }
        }
        // A message split across frames.
        if self.head_len < 5 {
            let n = (5 - self.head_len).min(self.rest.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&self.rest[..n]);
            self.rest.advance(n);
            self.head_len += n;
            if self.head_len < 5 {
                return Ok(None);
            }
            self.body_len = self.check(&self.head)?;
            self.body = BytesMut::with_capacity(self.body_len);
        }
        let n = (self.body_len - self.body.len()).min(self.rest.len());
        self.body.extend_from_slice(&self.rest[..n]);
        self.rest.advance(n);
        if self.body.len() < self.body_len {
            return Ok(None);
        }
        self.head_len = 0;
        Ok(Some(std::mem::take(&mut self.body).freeze()))
    }

    /// The length a prefix announces, if acceptable.
    fn check(&self, head: &[u8]) -> Result<usize, Status> {
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        match head[0] {
            0 => {}
            1 => {
                return Err(Status::new(
                    Code::Internal,
                    "compressed message, but no grpc-encoding was negotiated",
                ));
            }
            f => {
                return Err(Status::new(
                    Code::Internal,
                    format!("invalid compressed flag {f} in a message prefix"),
                ));
            }
        }
        if len > self.max {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "message of {len} bytes is larger than the limit of {} bytes",
                    self.max
                ),
            ));
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn drain(d: &mut Deframer) -> Vec<Bytes> {
        let mut out = Vec::new();
        while let Some(m) = d.next().unwrap() {
            out.push(m);
        }
        out
    }

    #[test]
    fn whole_messages_are_slices_of_the_frame() {
        let mut frame = framed(b"hello");
        frame.extend(framed(b""));
        frame.extend(framed(b"world"));
        let frame = Bytes::from(frame);
        let mut d = Deframer::new(1024);
        d.push(frame.clone());
        let msgs = drain(&mut d);
        assert_eq!(msgs, vec![&b"hello"[..], b"", b"world"]);
        assert_eq!(msgs[0].as_ptr(), frame[5..].as_ptr(), "no copy");
        assert!(!d.is_mid_message());
    }

    #[test]
    fn a_message_split_anywhere_is_joined() {
        let mut all = framed(b"first message");
        all.extend(framed(b"second"));
        for cut in 1..all.len() {
            for cut2 in cut..all.len() {
                let mut d = Deframer::new(1024);
                let mut msgs = Vec::new();
                for part in [&all[..cut], &all[cut..cut2], &all[cut2..]] {
                    d.push(Bytes::copy_from_slice(part));
                    msgs.extend(drain(&mut d));
                }
                assert_eq!(msgs, vec![&b"first message"[..], b"second"], "{cut} {cut2}");
                assert!(!d.is_mid_message());
            }
        }
    }

    #[test]
    fn a_truncated_message_is_seen() {
        let all = framed(b"abc");
        let mut d = Deframer::new(1024);
        d.push(Bytes::copy_from_slice(&all[..6]));
        assert!(drain(&mut d).is_empty());
        assert!(d.is_mid_message());
    }

    #[test]
    fn flags_and_sizes_are_checked() {
        let mut d = Deframer::new(4);
        d.push(Bytes::from(framed(b"12345")));
        assert_eq!(d.next().unwrap_err().code, Code::ResourceExhausted);
        let mut compressed = framed(b"x");
        compressed[0] = 1;
        let mut d = Deframer::new(4);
        d.push(Bytes::from(compressed));
        assert_eq!(d.next().unwrap_err().code, Code::Internal);
        // Split prefixes are checked too.
        let mut d = Deframer::new(4);
        let big = framed(b"123456");
        d.push(Bytes::copy_from_slice(&big[..3]));
        assert!(d.next().unwrap().is_none());
        d.push(Bytes::copy_from_slice(&big[3..]));
        assert_eq!(d.next().unwrap_err().code, Code::ResourceExhausted);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c\né"), "a b%25c%0A%C3%A9");
        assert!(is_grpc_content_type(b"application/grpc"));
        assert!(is_grpc_content_type(b"application/grpc+proto"));
        assert!(!is_grpc_content_type(b"application/grpc-web"));
        assert!(!is_grpc_content_type(b"application/json"));
    }
}
