//! Writing the client-facing model name back into responses when the request's
//! model was rewritten, for plain JSON bodies and SSE streams.

use crate::body::rewrite_model_field;

/// Rewrites the top-level `model` of a response body chunk by chunk.
///
/// SSE: complete lines are rewritten and released at once; an unfinished
/// line is held until its end arrives. Plain JSON: the body is held until the
/// end (up to `limit` bytes; beyond that it is released unchanged).
#[derive(Debug)]
pub struct ModelRestorer {
    client_model: String,
    sse: bool,
    held: Vec<u8>,
    limit: usize,
    gave_up: bool,
}

impl ModelRestorer {
    /// A restorer writing `client_model` back.
    #[must_use]
    pub fn new(client_model: impl Into<String>, sse: bool, limit: usize) -> Self {
        Self {
            client_model: client_model.into(),
            sse,
            held: Vec::new(),
            limit,
            gave_up: false,
        }
    }

    /// Feeds a chunk; returns the bytes to release now.
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> Vec<u8> {
        if self.gave_up {
            return chunk.to_vec();
        }
        if !self.sse {
            if self.held.len() + chunk.len() > self.limit {
                self.gave_up = true;
                let mut out = std::mem::take(&mut self.held);
                out.extend_from_slice(chunk);
                return out;
            }
            self.held.extend_from_slice(chunk);
            if !end {
                return Vec::new();
            }
            let body = std::mem::take(&mut self.held);
            return rewrite_model_field(&body, &self.client_model).unwrap_or(body);
        }
        self.held.extend_from_slice(chunk);
        let cut = if end {
            self.held.len()
        } else {
            match memchr::memrchr(b'\n', &self.held) {
                Some(i) => i + 1,
                None if self.held.len() > self.limit => {
                    self.gave_up = true;
                    return std::mem::take(&mut self.held);
                }
                None => return Vec::new(),
            }
        };
        let rest = self.held.split_off(cut);
        let ready = std::mem::replace(&mut self.held, rest);
        let mut out = Vec::with_capacity(ready.len() + 16);
        for line in ready.split_inclusive(|&b| b == b'\n') {
            self.line(line, &mut out);
        }
        out
    }

    fn line(&self, line: &[u8], out: &mut Vec<u8>) {
        let body_end = line
            .iter()
            .rposition(|&b| b != b'\n' && b != b'\r')
            .map_or(0, |i| i + 1);
        let (content, eol) = line.split_at(body_end);
        if let Some(data) = content.strip_prefix(b"data:") {
            let lead = data.len() - data.trim_ascii_start().len();
            let json = &data[lead..];
            if json.first() == Some(&b'{')
                && memchr::memmem::find(json, b"\"model\"").is_some()
                && let Some(new) = rewrite_model_field(json, &self.client_model)
            {
                out.extend_from_slice(b"data:");
                out.extend_from_slice(&data[..lead]);
                out.extend_from_slice(&new);
                out.extend_from_slice(eol);
                return;
            }
        }
        out.extend_from_slice(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_body_rewritten_at_end() {
        let mut r = ModelRestorer::new("base", false, 1 << 20);
        assert!(r.feed(br#"{"model":"lo"#, false).is_empty());
        let out = r.feed(br#"ra-1","x":1}"#, true);
        assert_eq!(out, br#"{"model":"base","x":1}"#);
    }

    #[test]
    fn sse_rewritten_at_every_split() {
        let stream = b"data: {\"model\":\"lora-1\",\"c\":1}\r\n\r\ndata: {\"model\":\"lora-1\",\"c\":2}\n\ndata: [DONE]\n\n";
        let want = b"data: {\"model\":\"base\",\"c\":1}\r\n\r\ndata: {\"model\":\"base\",\"c\":2}\n\ndata: [DONE]\n\n";
        for cut in 0..=stream.len() {
            let mut r = ModelRestorer::new("base", true, 1 << 20);
            let mut out = r.feed(&stream[..cut], false);
            out.extend(r.feed(&stream[cut..], true));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(want),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn oversized_plain_body_passes_unchanged() {
        let mut r = ModelRestorer::new("base", false, 8);
        let mut out = r.feed(br#"{"model":"#, false);
        out.extend(r.feed(br#""x"}"#, true));
        assert_eq!(out, br#"{"model":"x"}"#);
    }
}
