//! Request-body parsing: the fields the scheduler needs, read without
//! re-serialising the body (the raw bytes are forwarded untouched, and the
//! `model` value's byte range is kept so a rewrite splices only that value).
//!
//! Gateway-independent: bytes in, [`ParsedBody`] out. `prompt` renders the
//! text the prefix index hashes; `chat` reads a `messages` array in the same
//! pass as the rest of the body.

use std::ops::Range;

use epp_core::ApiKind;
use serde::Deserialize;
use serde_json::value::RawValue;

mod chat;
mod native;
mod prompt;

use chat::Messages;
use prompt::PromptFields;

use crate::error::{ExtProcError, Result};

/// What the picker reads from a request body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedBody {
    /// The `model` value.
    pub model: String,
    /// Byte range of the `model` value in the body, quotes included.
    pub model_span: Range<usize>,
    /// The text the prefix index hashes (see `docs/api-parsing.md`).
    pub prompt: String,
    /// `stream: true`.
    pub stream: bool,
    /// `cache_salt`.
    pub cache_salt: Option<String>,
    /// `max_tokens`, `max_completion_tokens` or `max_output_tokens`.
    pub max_tokens: Option<u64>,
    /// Media parts in the messages (`image_url`, `video_url`, `input_audio`,
    /// ...): a multimodal request when not 0.
    pub media_parts: u32,
    /// The prompt's token ids, when the client sent ids (a completions
    /// prompt of ids, vLLM's and SGLang's generate APIs): used as they are.
    pub token_ids: Option<Vec<u32>>,
}

/// The top-level fields we look at, borrowed from the body text. Unknown keys
/// are skipped without being materialised.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Top<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt: Option<&'a RawValue>,
    /// Read in this same pass (a long prompt is scanned once).
    #[serde(borrow)]
    messages: Option<Messages<'a>>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    items: Option<&'a RawValue>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    stream: Option<&'a RawValue>,
    #[serde(borrow)]
    cache_salt: Option<&'a RawValue>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
}

/// Parses a request body of API `api` (a [`ApiKind::Passthrough`] body is
/// not read: no model, no prompt).
///
/// # Errors
/// [`ExtProcError::BadBody`] when the body is not a UTF-8 JSON object,
/// [`ExtProcError::MissingModel`] when `model` is absent, null or empty.
pub fn parse_body(api: ApiKind, body: &[u8]) -> Result<ParsedBody> {
    match api {
        ApiKind::Passthrough => return Ok(ParsedBody::default()),
        ApiKind::VllmGenerate => return native::vllm_generate(body),
        ApiKind::SglangGenerate => return native::sglang_generate(body),
        ApiKind::VllmGrpcGenerate => return native::vllm_grpc_generate(body),
        ApiKind::VertexChatCompletions => return native::vertex(body, ApiKind::ChatCompletions),
        ApiKind::VertexRawPredict => return native::vertex(body, ApiKind::Responses),
        _ => {}
    }
    let text =
        std::str::from_utf8(body).map_err(|e| ExtProcError::BadBody(format!("not UTF-8: {e}")))?;
    // serde reads a struct from a JSON array too (`["m"]` as model "m"):
    // only an object is a request.
    if !text.trim_start().starts_with('{') {
        return Err(ExtProcError::BadBody(
            "the body must be a JSON object".into(),
        ));
    }
    let top: Top<'_> =
        serde_json::from_str(text).map_err(|e| ExtProcError::BadBody(e.to_string()))?;
    let model_raw = top.model.ok_or(ExtProcError::MissingModel)?;
    let model: Option<String> = serde_json::from_str(model_raw.get())
        .map_err(|_| ExtProcError::BadBody("`model` must be a string".into()))?;
    let model = model
        .filter(|m| !m.is_empty())
        .ok_or(ExtProcError::MissingModel)?;
    let model_span = span_of(text, model_raw.get());

    let fields = PromptFields {
        prompt: top.prompt,
        messages: top.messages,
        input: top.input,
        instructions: top.instructions,
        tools: top.tools,
        items: top.items,
        system: top.system,
    };
    let prompt::Rendered {
        text: prompt,
        media_parts,
        token_ids,
    } = prompt::render(api, &fields);

    let cache_salt = top
        .cache_salt
        .and_then(|raw| serde_json::from_str::<Option<String>>(raw.get()).ok())
        .flatten();
    let max_tokens = [
        top.max_tokens,
        top.max_completion_tokens,
        top.max_output_tokens,
    ]
    .into_iter()
    .flatten()
    .find_map(|raw| raw.get().parse::<u64>().ok());
    Ok(ParsedBody {
        model,
        model_span,
        prompt,
        stream: top.stream.is_some_and(|raw| raw.get() == "true"),
        cache_salt,
        max_tokens,
        media_parts,
        token_ids,
    })
}

/// Byte range of `inner` (a sub-slice of `outer`) within `outer`.
fn span_of(outer: &str, inner: &str) -> Range<usize> {
    let start = inner.as_ptr().addr().saturating_sub(outer.as_ptr().addr());
    let start = start.min(outer.len());
    start..(start + inner.len()).min(outer.len())
}

/// The body with the `model` value at `span` replaced by `new_model` (JSON
/// string-encoded); every other byte is kept.
#[must_use]
pub fn splice_model(body: &[u8], span: &Range<usize>, new_model: &str) -> Vec<u8> {
    let encoded = serde_json::Value::String(new_model.to_owned()).to_string();
    let mut out = Vec::with_capacity(body.len() + encoded.len());
    out.extend_from_slice(&body[..span.start.min(body.len())]);
    out.extend_from_slice(encoded.as_bytes());
    out.extend_from_slice(&body[span.end.min(body.len())..]);
    out
}

/// Only the top-level `model` of a JSON object (for rewriting responses).
#[derive(Deserialize)]
struct ModelOnly<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
}

/// Replaces the top-level `model` string of the JSON object `json` with
/// `new_model`; `None` when there is none (or `json` is not an object).
#[must_use]
pub fn rewrite_model_field(json: &[u8], new_model: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(json).ok()?;
    // As for requests: serde reads a struct from an array too.
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let top: ModelOnly<'_> = serde_json::from_str(text).ok()?;
    let raw = top.model?;
    if !raw.get().starts_with('"') {
        return None;
    }
    Some(splice_model(json, &span_of(text, raw.get()), new_model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_common_fields_and_model_span() {
        let body = br#"{"stream":true, "model" : "llama-3", "max_tokens": 7, "cache_salt":"s1", "prompt":"hi"}"#;
        let p = parse_body(ApiKind::Completions, body).unwrap();
        assert_eq!(p.model, "llama-3");
        assert_eq!(&body[p.model_span.clone()], br#""llama-3""#);
        assert!(p.stream);
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(p.cache_salt.as_deref(), Some("s1"));
        assert_eq!(p.prompt, "hi");
    }

    #[test]
    fn rejects_bad_bodies() {
        for (body, want) in [
            (&b"not json"[..], 400),
            (b"[1,2]", 400),
            (b"[\"m\"]", 400),
            (b" [\"m\", \"hello\"]", 400),
            (b"\"m\"", 400),
            (b"{\"prompt\":\"x\"}", 400),
            (b"{\"model\":null}", 400),
            (b"{\"model\":\"\"}", 400),
            (b"{\"model\":5}", 400),
            (b"\xff\xfe", 400),
        ] {
            let err = parse_body(ApiKind::Completions, body).unwrap_err();
            assert_eq!(err.http_status(), want, "{err}");
        }
        assert_eq!(
            parse_body(ApiKind::Completions, b"{}").unwrap_err(),
            ExtProcError::MissingModel
        );
    }

    #[test]
    fn splice_keeps_every_other_byte() {
        let body = br#"{"z": 12345678901234567890, "model":"a\u0041", "b": [1.50]}"#;
        let p = parse_body(ApiKind::Completions, body).unwrap();
        assert_eq!(p.model, "aA");
        let out = splice_model(body, &p.model_span, "new\"m");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"z": 12345678901234567890, "model":"new\"m", "b": [1.50]}"#
        );
    }

    #[test]
    fn rewrites_response_model() {
        let out =
            rewrite_model_field(br#"{"id":"x","model":"lora-7","usage":{}}"#, "base").unwrap();
        assert_eq!(out, br#"{"id":"x","model":"base","usage":{}}"#);
        assert!(rewrite_model_field(br#"{"id":"x"}"#, "base").is_none());
        assert!(rewrite_model_field(b"[]", "base").is_none());
        // An array's first string is not a model (found by fuzzing).
        assert!(rewrite_model_field(b"[\r\"lora-7\"]", "base").is_none());
    }
}
