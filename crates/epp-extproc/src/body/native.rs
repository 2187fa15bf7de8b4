//! Bodies of the engines' own APIs (llm-d's `vllmhttp-parser`,
//! `sglanghttp-parser`, `vllmgrpc-parser` and `vertexai-parser`):
//!
//! ```text
//! vLLM  POST …/inference/v1/generate   {"model"?, "token_ids": [u32, …] (required, non-empty),
//!                                       "sampling_params": {"max_tokens"?}, "stream"?}
//! SGLang POST …/generate               {"model"?, "input_ids": [u32, …] | [[u32, …], …]
//!                                       or "text": "…" | ["…", …],
//!                                       "sampling_params": {"max_new_tokens"?}, "stream"?}
//! vLLM gRPC  vllm.grpc.engine.VllmEngine/Generate
//!        GenerateRequest {tokenized: {original_text, input_ids} | text,
//!                         sampling_params: {max_tokens}, stream}
//! Vertex AI gRPC PredictionService/ChatCompletions, …/RawPredict, …/StreamRawPredict
//!        {endpoint, http_body: {content_type, data}}: `data` is an OpenAI chat
//!        (ChatCompletions) or Responses (RawPredict) body, read as such
//! ```
//!
//! Token ids hash as completions' token-id prompts do; SGLang's `text` as a
//! completions prompt. A gRPC body is one length-prefixed message (a
//! compressed one is refused: it cannot be read). The `model` of a gRPC
//! request is not rewritten (its bytes sit inside protobuf lengths).

use prost::Message;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    ParsedBody,
    prompt::{Rendered, token_text},
};
use crate::error::{ExtProcError, Result};

fn bad(what: impl Into<String>) -> ExtProcError {
    ExtProcError::BadBody(what.into())
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Sampling {
    max_tokens: Option<u64>,
    max_new_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Generate<'a> {
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default, borrow)]
    input_ids: Option<&'a RawValue>,
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
    #[serde(default)]
    sampling_params: Option<Sampling>,
    #[serde(default)]
    stream: Option<bool>,
}

fn json_object(body: &[u8]) -> Result<&str> {
    let text = std::str::from_utf8(body).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    if text.trim_start().starts_with('{') {
        Ok(text)
    } else {
        Err(bad("the body must be a JSON object"))
    }
}

/// The optional `model` string and its byte range in `text`.
fn model_of(text: &str, raw: Option<&RawValue>) -> Result<(String, std::ops::Range<usize>)> {
    let Some(raw) = raw else {
        return Ok((String::new(), 0..0));
    };
    match serde_json::from_str::<Option<String>>(raw.get()) {
        Ok(Some(m)) => Ok((m, super::span_of(text, raw.get()))),
        Ok(None) => Ok((String::new(), 0..0)),
        Err(_) => Err(bad("`model` must be a string")),
    }
}

/// vLLM's `/inference/v1/generate`.
pub(super) fn vllm_generate(body: &[u8]) -> Result<ParsedBody> {
    let text = json_object(body)?;
    let g: Generate<'_> = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let ids = g
        .token_ids
        .filter(|ids| !ids.is_empty())
        .ok_or_else(|| bad("a generate request needs a non-empty `token_ids` array"))?;
    let (model, model_span) = model_of(text, g.model)?;
    let mut prompt = Rendered::default();
    token_text(ids.iter().map(|&id| u64::from(id)), &mut prompt);
    Ok(ParsedBody {
        model,
        model_span,
        prompt: prompt.text,
        stream: g.stream.unwrap_or(false),
        max_tokens: g.sampling_params.and_then(|s| s.max_tokens),
        token_ids: Some(ids),
        ..ParsedBody::default()
    })
}

/// SGLang's native `/generate`.
pub(super) fn sglang_generate(body: &[u8]) -> Result<ParsedBody> {
    let text = json_object(body)?;
    let g: Generate<'_> = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let (model, model_span) = model_of(text, g.model)?;
    let mut prompt = Rendered::default();
    let mut token_ids = None;
    if let Some(raw) = g.input_ids {
        let ids: IdsOrBatch = serde_json::from_str(raw.get())
            .map_err(|_| bad("`input_ids` must be an array of token ids, or of arrays of them"))?;
        let batch = match ids {
            IdsOrBatch::One(ids) => vec![ids],
            IdsOrBatch::Batch(b) => b,
        };
        if batch.iter().all(Vec::is_empty) {
            return Err(bad("`input_ids` cannot be empty"));
        }
        for (i, ids) in batch.iter().enumerate() {
            if i > 0 {
                prompt.push_str("\n");
            }
            token_text(ids.iter().map(|&id| u64::from(id)), &mut prompt);
        }
        if let [one] = batch.as_slice() {
            token_ids = Some(one.clone());
        }
    } else if let Some(raw) = g.text {
        let texts: TextOrBatch = serde_json::from_str(raw.get())
            .map_err(|_| bad("`text` must be a string or an array of strings"))?;
        match texts {
            TextOrBatch::One(t) => prompt.push_str(&t),
            TextOrBatch::Batch(b) => prompt.push_str(&b.join("\n")),
        }
    } else {
        return Err(bad("a generate request needs `input_ids` or `text`"));
    }
    Ok(ParsedBody {
        model,
        model_span,
        prompt: prompt.text,
        stream: g.stream.unwrap_or(false),
        max_tokens: g.sampling_params.and_then(|s| s.max_new_tokens),
        token_ids,
        ..ParsedBody::default()
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IdsOrBatch {
    One(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TextOrBatch {
    One(String),
    Batch(Vec<String>),
}

/// The one message of a gRPC request body (5-byte prefix: compressed flag,
/// big-endian length).
fn grpc_message(body: &[u8]) -> Result<&[u8]> {
    let (&[flag, a, b, c, d], rest) = body
        .split_first_chunk::<5>()
        .ok_or_else(|| bad("a gRPC body starts with a 5-byte message prefix"))?;
    if flag != 0 {
        return Err(bad(
            "the gRPC message is compressed; epp reads uncompressed requests only",
        ));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    rest.get(..len).filter(|_| rest.len() == len).ok_or_else(|| {
        bad(format!(
            "the gRPC message prefix says {len} bytes, the body holds {} (one unary message expected)",
            rest.len()
        ))
    })
}

/// vLLM's `TokenizedInput`.
#[derive(Clone, PartialEq, Message)]
struct TokenizedInput {
    #[prost(string, tag = "1")]
    original_text: String,
    #[prost(uint32, repeated, tag = "2")]
    input_ids: Vec<u32>,
}

/// The part of vLLM's `SamplingParams` epp reads.
#[derive(Clone, PartialEq, Message)]
struct SamplingParams {
    #[prost(uint32, optional, tag = "8")]
    max_tokens: Option<u32>,
}

/// The part of vLLM's `GenerateRequest` epp reads.
#[derive(Clone, PartialEq, Message)]
struct GenerateRequest {
    #[prost(string, tag = "1")]
    request_id: String,
    #[prost(message, optional, tag = "2")]
    tokenized: Option<TokenizedInput>,
    #[prost(string, optional, tag = "3")]
    text: Option<String>,
    #[prost(message, optional, tag = "4")]
    sampling_params: Option<SamplingParams>,
    #[prost(bool, tag = "5")]
    stream: bool,
}

/// vLLM's gRPC `Generate`.
pub(super) fn vllm_grpc_generate(body: &[u8]) -> Result<ParsedBody> {
    let msg = GenerateRequest::decode(grpc_message(body)?)
        .map_err(|e| bad(format!("not a vLLM GenerateRequest: {e}")))?;
    let mut prompt = Rendered::default();
    let mut token_ids = None;
    match (&msg.tokenized, &msg.text) {
        (Some(t), _) if !t.input_ids.is_empty() => {
            token_text(t.input_ids.iter().map(|&id| u64::from(id)), &mut prompt);
            token_ids = Some(t.input_ids.clone());
        }
        (_, Some(text)) => prompt.push_str(text),
        _ => return Err(bad("a GenerateRequest needs tokenized input ids or text")),
    }
    Ok(ParsedBody {
        prompt: prompt.text,
        stream: msg.stream,
        max_tokens: msg
            .sampling_params
            .and_then(|s| s.max_tokens)
            .map(u64::from),
        token_ids,
        ..ParsedBody::default()
    })
}

/// `google.api.HttpBody`.
#[derive(Clone, PartialEq, Message)]
struct HttpBody {
    #[prost(string, tag = "1")]
    content_type: String,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
}

/// Vertex AI's `ChatCompletionsRequest` and `RawPredictRequest` (the same
/// shape: an endpoint and an HTTP body).
#[derive(Clone, PartialEq, Message)]
struct VertexRequest {
    #[prost(string, tag = "1")]
    endpoint: String,
    #[prost(message, optional, tag = "2")]
    http_body: Option<HttpBody>,
}

/// Vertex AI's gRPC methods: the OpenAI body inside, read as `inner`.
pub(super) fn vertex(body: &[u8], inner: epp_core::ApiKind) -> Result<ParsedBody> {
    let msg = VertexRequest::decode(grpc_message(body)?)
        .map_err(|e| bad(format!("not a Vertex AI request: {e}")))?;
    let data = msg
        .http_body
        .map(|b| b.data)
        .ok_or_else(|| bad("the Vertex AI request has no http_body"))?;
    let parsed = super::parse_body(inner, &data)?;
    // The model's bytes sit inside protobuf lengths: never spliced.
    Ok(ParsedBody {
        model_span: 0..0,
        ..parsed
    })
}

#[cfg(test)]
mod tests {
    use epp_core::ApiKind;

    use super::*;
    use crate::body::parse_body;

    fn grpc(msg: &impl Message) -> Vec<u8> {
        let bytes = msg.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&bytes);
        out
    }

    #[test]
    fn vllm_http_generate() {
        let p = parse_body(
            ApiKind::VllmGenerate,
            br#"{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":7},"stream":true}"#,
        )
        .unwrap();
        assert_eq!(
            (p.model.as_str(), p.max_tokens, p.stream),
            ("m", Some(7), true)
        );
        assert_eq!(p.prompt.len(), 12, "three tokens, four characters each");
        let same = parse_body(ApiKind::Completions, br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(
            p.prompt, same.prompt,
            "hashes as a token-id completions prompt"
        );
        assert!(parse_body(ApiKind::VllmGenerate, br#"{"model":"m","token_ids":[]}"#).is_err());
        assert!(parse_body(ApiKind::VllmGenerate, br#"{"prompt":"x"}"#).is_err());
        let no_model = parse_body(ApiKind::VllmGenerate, br#"{"token_ids":[5]}"#).unwrap();
        assert_eq!(no_model.model, "");
    }

    #[test]
    fn sglang_generate_ids_batches_and_text() {
        let p = parse_body(
            ApiKind::SglangGenerate,
            br#"{"input_ids":[[1,2],[3]],"sampling_params":{"max_new_tokens":3}}"#,
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(3));
        assert_eq!(p.prompt.len(), 4 * 3 + 1);
        let t = parse_body(ApiKind::SglangGenerate, br#"{"text":"hello","model":"m"}"#).unwrap();
        assert_eq!((t.prompt.as_str(), t.model.as_str()), ("hello", "m"));
        assert!(parse_body(ApiKind::SglangGenerate, br#"{"input_ids":[]}"#).is_err());
        assert!(parse_body(ApiKind::SglangGenerate, br#"{"input_ids":["a"]}"#).is_err());
        assert!(parse_body(ApiKind::SglangGenerate, br#"{"sampling_params":{}}"#).is_err());
    }

    #[test]
    fn vllm_grpc_generate_message() {
        let req = GenerateRequest {
            request_id: "r".into(),
            tokenized: Some(TokenizedInput {
                original_text: "hi".into(),
                input_ids: vec![9, 8],
            }),
            text: None,
            sampling_params: Some(SamplingParams {
                max_tokens: Some(5),
            }),
            stream: true,
        };
        let p = parse_body(ApiKind::VllmGrpcGenerate, &grpc(&req)).unwrap();
        assert_eq!((p.prompt.len(), p.max_tokens, p.stream), (8, Some(5), true));
        let mut compressed = grpc(&req);
        compressed[0] = 1;
        let e = parse_body(ApiKind::VllmGrpcGenerate, &compressed).unwrap_err();
        assert!(e.to_string().contains("compressed"), "{e}");
        let mut short = grpc(&req);
        short.pop();
        assert!(parse_body(ApiKind::VllmGrpcGenerate, &short).is_err());
        assert!(parse_body(ApiKind::VllmGrpcGenerate, b"\0\0").is_err());
    }

    #[test]
    fn vertex_chat_reads_the_inner_openai_body() {
        let inner =
            br#"{"model":"gemma","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let req = VertexRequest {
            endpoint: "projects/p/locations/l/endpoints/e".into(),
            http_body: Some(HttpBody {
                content_type: "application/json".into(),
                data: inner.to_vec(),
            }),
        };
        let p = parse_body(ApiKind::VertexChatCompletions, &grpc(&req)).unwrap();
        let direct = parse_body(ApiKind::ChatCompletions, inner).unwrap();
        assert_eq!((p.model.as_str(), p.stream), ("gemma", true));
        assert_eq!(p.prompt, direct.prompt);
        assert!(p.model_span.is_empty(), "never spliced");
    }
}
