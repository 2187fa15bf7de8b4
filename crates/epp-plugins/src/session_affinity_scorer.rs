//! `session-affinity-scorer`: keep a session on the endpoint its token names.

use epp_core::{
    BuildError, Candidate, CycleContext, Endpoint, InferenceRequest, Plugin, ResponseHeaderSink,
    ResponseHooks, Scorer,
};

use crate::{Builtin, invalid};

/// Header a client echoes to stay on its endpoint.
pub const SESSION_HEADER: &str = "x-session-token";

/// The session token for an endpoint address: base64 of `ip:port`.
#[must_use]
pub fn session_token(addr: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = addr.as_bytes();
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Parameters of `session-affinity-scorer` (llm-d's names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionAffinityParams {
    /// `encoded_endpoint_header` (the default). llm-d's `session_id`
    /// strategy is not implemented: a load error.
    #[serde(default)]
    pub strategy: Option<String>,
    /// `{header: name}`: the header carrying the token (default
    /// `x-session-token`; trimmed and lower-cased, as in llm-d).
    #[serde(default)]
    pub encoded_endpoint_header_config: EncodedEndpointHeaderConfig,
}

/// `encodedEndpointHeaderConfig`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EncodedEndpointHeaderConfig {
    /// Header name; empty = `x-session-token`.
    #[serde(default)]
    pub header: String,
}

/// `session-affinity-scorer`: the endpoint named by the request's session
/// header (`x-session-token` unless configured; base64 of the endpoint's
/// `ip:port`) scores 1, others 0. Every response carries that header naming
/// the endpoint that served it, for the client to echo on its next request.
#[derive(Debug, Clone)]
pub struct SessionAffinityScorer {
    name: String,
    header: String,
}

impl Builtin for SessionAffinityScorer {
    const TYPE: &'static str = "session-affinity-scorer";
    type Params = SessionAffinityParams;

    /// Reads and writes `x-session-token` unless the parameters name
    /// another header.
    ///
    /// # Errors
    /// A strategy other than `encoded_endpoint_header`.
    fn build(name: impl Into<String>, p: SessionAffinityParams) -> Result<Self, BuildError> {
        match p.strategy.as_deref() {
            None | Some("encoded_endpoint_header") => {}
            Some("session_id") => {
                return Err(invalid(
                    Self::TYPE,
                    "strategy",
                    "session_id",
                    "llm-d's session_id strategy is not implemented here; use encoded_endpoint_header",
                ));
            }
            Some(other) => {
                return Err(invalid(
                    Self::TYPE,
                    "strategy",
                    other,
                    "must be encoded_endpoint_header or session_id",
                ));
            }
        }
        let header = p
            .encoded_endpoint_header_config
            .header
            .trim()
            .to_ascii_lowercase();
        Ok(Self {
            name: name.into(),
            header: if header.is_empty() {
                SESSION_HEADER.to_owned()
            } else {
                header
            },
        })
    }
}

impl Plugin for SessionAffinityScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn as_response_hooks(&self) -> Option<&dyn ResponseHooks> {
        Some(self)
    }
}

impl ResponseHooks for SessionAffinityScorer {
    fn add_response_headers(
        &self,
        _request: &InferenceRequest,
        endpoint: &Endpoint,
        out: &mut dyn ResponseHeaderSink,
    ) {
        out.set_header(&self.header, &session_token(endpoint.addr_str()));
    }
}

impl Scorer for SessionAffinityScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let Some(token) = cx.request.header(&self.header) else {
            return;
        };
        // Decoded once, on the stack: no allocation per candidate.
        let mut buf = [0u8; 64];
        let Some(addr) = decode_token(token, &mut buf) else {
            return;
        };
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            if c.endpoint.addr_str().as_bytes() == addr {
                *s = 1.0;
            }
        }
    }
}

/// Decodes a standard base64 token into `buf`; `None` if it is not base64
/// or longer than any endpoint address.
fn decode_token<'b>(token: &str, buf: &'b mut [u8; 64]) -> Option<&'b [u8]> {
    let digits = token.trim_end_matches('=').as_bytes();
    let (mut bits, mut n, mut len) = (0u32, 0u32, 0usize);
    for &c in digits {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        n += 6;
        if n >= 8 {
            n -= 8;
            *buf.get_mut(len)? = (bits >> n) as u8;
            len += 1;
            bits &= (1 << n) - 1;
        }
    }
    Some(&buf[..len])
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn base64_tokens() {
        assert_eq!(session_token("10.0.0.1:8000"), "MTAuMC4wLjE6ODAwMA==");
        assert_eq!(session_token("abc"), "YWJj");
        assert_eq!(session_token("ab"), "YWI=");
    }

    #[test]
    fn tokens_decode_back_and_garbage_is_refused() {
        let mut buf = [0u8; 64];
        for addr in ["10.0.0.1:8000", "a", "ab", "[fd00::1]:65535"] {
            assert_eq!(
                decode_token(&session_token(addr), &mut buf),
                Some(addr.as_bytes())
            );
        }
        assert_eq!(decode_token("not base64!", &mut buf), None);
        assert_eq!(decode_token(&"QUFB".repeat(30), &mut buf), None, "too long");
    }

    #[test]
    fn session_header_picks_its_endpoint() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let req = InferenceRequest::builder("m")
            .header(SESSION_HEADER, session_token("10.0.0.2:8000"))
            .build();
        let s = with_cx(&req, 0, |cx| {
            let mut out = vec![0.0; 3];
            SessionAffinityScorer::build("s", SessionAffinityParams::default())
                .unwrap()
                .score(cx, &c, &mut out);
            out
        });
        assert_eq!(s, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn a_configured_header_is_read_and_written() {
        let p: SessionAffinityParams = serde_yaml_ng::from_str(
            "{strategy: encoded_endpoint_header, encodedEndpointHeaderConfig: {header: ' X-My-Session '}}",
        )
        .unwrap();
        let s = SessionAffinityScorer::build("s", p).unwrap();
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let req = InferenceRequest::builder("m")
            .header("x-my-session", session_token("10.0.0.2:8000"))
            .header(SESSION_HEADER, session_token("10.0.0.1:8000"))
            .build();
        let scores = with_cx(&req, 0, |cx| {
            let mut out = vec![0.0; 2];
            s.score(cx, &c, &mut out);
            out
        });
        assert_eq!(scores, vec![0.0, 1.0]);
        let mut out: Vec<(String, String)> = Vec::new();
        s.add_response_headers(&req, &c[0].endpoint, &mut out);
        assert_eq!(out[0].0, "x-my-session");
        let p: SessionAffinityParams = serde_yaml_ng::from_str("{strategy: session_id}").unwrap();
        let err = SessionAffinityScorer::build("s", p).unwrap_err();
        assert!(err.to_string().contains("not implemented"), "{err}");
    }

    #[test]
    fn responses_carry_the_serving_endpoints_token() {
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let req = InferenceRequest::builder("m").build();
        let mut out: Vec<(String, String)> = Vec::new();
        SessionAffinityScorer::build("s", SessionAffinityParams::default())
            .unwrap()
            .add_response_headers(&req, &c[1].endpoint, &mut out);
        assert_eq!(
            out,
            vec![(SESSION_HEADER.to_owned(), session_token("10.0.0.2:8000"))]
        );
    }
}
