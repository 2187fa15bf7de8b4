//! Token usage read from model-server responses: plain JSON bodies and SSE
//! streams, including SSE lines split across body chunks.

use epp_core::Usage;
use memchr::memmem;
use serde_json::Value;

/// Reads usage from a response body fed chunk by chunk.
#[derive(Debug)]
pub struct UsageReader {
    sse: bool,
    /// SSE: the unfinished last line. Plain: the body so far.
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
    usage: Option<Usage>,
}

impl UsageReader {
    /// A reader for an SSE stream (`sse`) or a plain JSON body, buffering at
    /// most `limit` bytes (a longer plain body or SSE line is not parsed).
    #[must_use]
    pub fn new(sse: bool, limit: usize) -> Self {
        Self {
            sse,
            buf: Vec::new(),
            limit,
            overflowed: false,
            usage: None,
        }
    }

    /// Feeds the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.buf.len() + chunk.len() > self.limit {
                self.overflowed = true;
                self.buf = Vec::new();
            } else if !self.overflowed {
                self.buf.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            let (line, tail) = rest.split_at(nl);
            rest = &tail[1..];
            if self.overflowed {
                // The end of a line too long to keep: skip it.
                self.overflowed = false;
            } else if self.buf.is_empty() {
                self.sse_line(line);
            } else {
                let mut whole = std::mem::take(&mut self.buf);
                whole.extend_from_slice(line);
                self.sse_line(&whole);
                whole.clear();
                self.buf = whole;
            }
        }
        if self.buf.len() + rest.len() > self.limit {
            self.overflowed = true;
            self.buf.clear();
        } else if !self.overflowed {
            self.buf.extend_from_slice(rest);
        }
    }

    /// The body ended: parses what is buffered and returns the usage found.
    pub fn finish(&mut self) -> Option<Usage> {
        let buf = std::mem::take(&mut self.buf);
        if !self.overflowed {
            if self.sse {
                self.sse_line(&buf);
            } else if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                self.merge_event(&v);
            }
        }
        self.usage
    }

    /// Usage found so far.
    #[must_use]
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn sse_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        // Most events are token deltas without usage: skip them unparsed.
        if data == b"[DONE]" || memmem::find(data, b"usage").is_none() {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            self.merge_event(&v);
        }
    }

    /// Takes `usage` from an event or body: top level (OpenAI chat and
    /// completions), `response.usage` (Responses API `response.completed`),
    /// or `message.usage` (Anthropic `message_start`).
    fn merge_event(&mut self, v: &Value) {
        let found = v
            .get("usage")
            .filter(|u| u.is_object())
            .or_else(|| v.pointer("/response/usage").filter(|u| u.is_object()))
            .or_else(|| v.pointer("/message/usage").filter(|u| u.is_object()));
        let Some(u) = found else { return };
        let num = |paths: &[&str]| {
            paths
                .iter()
                .find_map(|p| u.pointer(p).and_then(Value::as_u64))
                .unwrap_or(0)
        };
        let prompt = num(&["/prompt_tokens", "/input_tokens"]);
        let completion = num(&["/completion_tokens", "/output_tokens"]);
        let total = num(&["/total_tokens"]);
        let cached = num(&[
            "/prompt_tokens_details/cached_tokens",
            "/input_tokens_details/cached_tokens",
            "/cache_read_input_tokens",
        ]);
        // Anthropic splits usage over events: keep the largest value of each.
        let mut acc = self.usage.unwrap_or_default();
        acc.prompt_tokens = acc.prompt_tokens.max(prompt);
        acc.completion_tokens = acc.completion_tokens.max(completion);
        acc.cached_tokens = acc.cached_tokens.max(cached);
        acc.total_tokens = acc
            .total_tokens
            .max(total)
            .max(acc.prompt_tokens + acc.completion_tokens);
        self.usage = Some(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_json_usage() {
        let mut r = UsageReader::new(false, 1 << 20);
        r.feed(br#"{"id":"1","usage":{"prompt_tokens":10,"#);
        r.feed(br#""completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}"#);
        let u = r.finish().unwrap();
        assert_eq!(
            (
                u.prompt_tokens,
                u.completion_tokens,
                u.total_tokens,
                u.cached_tokens
            ),
            (10, 5, 15, 4)
        );
    }

    #[test]
    fn sse_lines_split_across_chunks() {
        let stream = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\r\n\r\ndata: [DONE]\n\n";
        // Every split point must give the same answer.
        for cut in 0..stream.len() {
            let mut r = UsageReader::new(true, 1 << 20);
            r.feed(&stream[..cut]);
            r.feed(&stream[cut..]);
            let u = r.finish().unwrap_or_else(|| panic!("cut at {cut}"));
            assert_eq!(
                (u.prompt_tokens, u.completion_tokens, u.total_tokens),
                (7, 3, 10)
            );
        }
    }

    #[test]
    fn responses_and_anthropic_events() {
        let mut r = UsageReader::new(true, 1 << 20);
        r.feed(b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":2,\"total_tokens\":11}}}\n\n");
        let u = r.finish().unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (9, 2, 11)
        );

        let mut r = UsageReader::new(true, 1 << 20);
        r.feed(b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n");
        r.feed(b"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":6}}\n");
        let u = r.finish().unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (20, 6, 26)
        );
    }

    #[test]
    fn no_usage_and_overflow() {
        let mut r = UsageReader::new(true, 16);
        r.feed(b"data: {\"usage\":{\"prompt_tokens\":100000000}}");
        r.feed(b"\n");
        assert!(r.finish().is_none());
        let mut r = UsageReader::new(false, 1 << 20);
        r.feed(b"not json");
        assert!(r.finish().is_none());
    }
}
