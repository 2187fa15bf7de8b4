//! The OpenAI-compatible generation endpoints: `/v1/completions` and
//! `/v1/chat/completions`, plain JSON or SSE streaming.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    Json,
    body::{Body, Bytes},
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::{
    config::KvRole,
    engine::{Event, Generation, MediaPlace, NewRequest, Outcome, Sim, count_tokens},
    engine_core::Injected,
};

/// An OpenAI-style error reply.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "code": self.status.as_u16()}});
        (self.status, Json(body)).into_response()
    }
}

pub(crate) fn api_error(
    status: StatusCode,
    kind: &'static str,
    message: impl Into<String>,
) -> ApiError {
    ApiError {
        status,
        kind,
        message: message.into(),
    }
}

pub(crate) fn error(
    status: StatusCode,
    kind: &'static str,
    message: impl Into<String>,
) -> Response {
    api_error(status, kind, message).into_response()
}

/// What a request asks for.
#[derive(Debug)]
struct Ask {
    model: String,
    prompt: String,
    prompt_tokens: u64,
    /// The prompt's token ids: given as such, or from the `--tokenizer`.
    token_ids: Option<Vec<u32>>,
    /// The chat's media parts, in order (modality, identifier).
    media: Vec<(&'static str, String)>,
    /// Where they stand among `token_ids`, when placed (`--mm-tokens`).
    places: Vec<MediaPlace>,
    cache_salt: Option<String>,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
    transfer: Transfer,
}

/// The request's part in a P/D exchange (its `kv_transfer_params`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transfer {
    /// A whole request.
    None,
    /// `do_remote_decode`: prefill here, a decode server continues.
    Produce,
    /// `do_remote_prefill`: the prompt's KV comes from a prefill server.
    Consume,
}

pub(crate) fn text_of_content(content: &Value, out: &mut String) {
    match content {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    out.push_str(t);
                }
            }
        }
        _ => {}
    }
}

/// The request body as JSON, and its `model` once checked to be served here.
pub(crate) fn json_and_model(sim: &Sim, body: &[u8]) -> Result<(Value, String), ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        api_error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            format!("invalid JSON body: {e}"),
        )
    })?;
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            api_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                "missing `model`",
            )
        })?
        .to_owned();
    if !sim.serves(&model) {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{model}` does not exist."),
        ));
    }
    Ok((v, model))
}

fn parse(sim: &Sim, body: &[u8], chat: bool) -> Result<Ask, ApiError> {
    let (v, model) = json_and_model(sim, body)?;
    let mut prompt = String::new();
    let mut ids: Vec<u32> = Vec::new();
    let mut texts = 0usize;
    if chat {
        let messages = v
            .get("messages")
            .and_then(Value::as_array)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                api_error(
                    StatusCode::BAD_REQUEST,
                    "BadRequestError",
                    "`messages` must be a non-empty list",
                )
            })?;
        for m in messages {
            prompt.push_str(m.get("role").and_then(Value::as_str).unwrap_or("user"));
            prompt.push_str(": ");
            if let Some(c) = m.get("content") {
                text_of_content(c, &mut prompt);
            }
            prompt.push('\n');
        }
    } else {
        match v.get("prompt") {
            Some(Value::String(s)) => prompt.push_str(s),
            Some(Value::Array(items)) => {
                for item in items {
                    match item {
                        Value::String(s) => {
                            texts += 1;
                            prompt.push_str(s);
                        }
                        Value::Number(_) => {
                            ids.push(token_id(item)?);
                            prompt.push_str(&item.to_string());
                            prompt.push(' ');
                        }
                        Value::Array(batch) => {
                            for id in batch {
                                ids.push(token_id(id)?);
                                prompt.push_str(&id.to_string());
                                prompt.push(' ');
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {
                return Err(api_error(
                    StatusCode::BAD_REQUEST,
                    "BadRequestError",
                    "missing `prompt`",
                ));
            }
        }
    }
    // Token-id prompts are token ids, tokenizer or not; chat goes through
    // the --chat-template when there is one; other text (a prompt string,
    // or the flattened chat) is tokenized when there is a tokenizer.
    let media = if chat { media_parts(&v) } else { Vec::new() };
    let rendered = if chat {
        sim.render_chat(&v, &media).map_err(|e| {
            api_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                format!("rendering the chat failed: {e}"),
            )
        })?
    } else {
        None
    };
    let mut places = Vec::new();
    let token_ids = if let Some(rendered) = rendered {
        prompt = rendered.text;
        places = rendered.media;
        Some(rendered.token_ids)
    } else if !ids.is_empty() && texts == 0 {
        Some(ids)
    } else {
        sim.tokenize(&prompt).map_err(|e| {
            api_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                format!("tokenizing the prompt failed: {e}"),
            )
        })?
    };
    let prompt_tokens = match &token_ids {
        Some(ids) => ids.len() as u64,
        None => count_tokens(&prompt),
    }
    .max(1);
    let cache_salt = v
        .get("cache_salt")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let max_tokens = v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(sim.cfg.max_tokens_default)
        .max(1);
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let transfer = transfer_of(sim, v.get("kv_transfer_params"))?;
    Ok(Ask {
        model,
        prompt,
        prompt_tokens,
        token_ids,
        media,
        places,
        cache_salt,
        max_tokens,
        stream,
        include_usage,
        transfer,
    })
}

/// Reads `kv_transfer_params` as vLLM's KV connectors do: `do_remote_decode`
/// asks this server to prefill for another, `do_remote_prefill` says the
/// prompt's KV was prefilled elsewhere. A role that cannot play the part
/// refuses with 400.
fn transfer_of(sim: &Sim, params: Option<&Value>) -> Result<Transfer, ApiError> {
    let flag = |key: &str| {
        params
            .and_then(|p| p.get(key))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let transfer = match (flag("do_remote_decode"), flag("do_remote_prefill")) {
        (true, true) => {
            return Err(api_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                "kv_transfer_params: do_remote_decode and do_remote_prefill are both set",
            ));
        }
        (true, false) => Transfer::Produce,
        (false, true) => Transfer::Consume,
        (false, false) => Transfer::None,
    };
    let refused = match (transfer, sim.cfg.kv_role) {
        (Transfer::Produce, KvRole::Consumer) => {
            Some("kv_consumer: it does not prefill for others")
        }
        (Transfer::Consume, KvRole::Producer) => {
            Some("kv_producer: it does not take KV prefilled elsewhere")
        }
        _ => None,
    };
    match refused {
        Some(why) => Err(api_error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            format!("kv_transfer_params refused: this server is {why}"),
        )),
        None => Ok(transfer),
    }
}

/// What a prefill server answers in `kv_transfer_params` (the fields of
/// vLLM's NIXL connector): where the decode server pulls the blocks from.
fn produced_params(sim: &Sim, prompt_tokens: u64) -> Value {
    let blocks = prompt_tokens.div_ceil(sim.cfg.block_size.max(1) as u64);
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": (0..blocks).collect::<Vec<u64>>(),
        "remote_engine_id": sim.cfg.pod_name,
        "remote_host": sim.cfg.host,
        "remote_port": sim.cfg.port,
        "tp_size": 1,
    })
}

/// One token id of a token-id prompt.
fn token_id(v: &Value) -> Result<u32, ApiError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            api_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                format!("token id {v} is not an integer in 0..2^32"),
            )
        })
}

fn usage(o: &Outcome) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    })
}

pub(crate) fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `POST /v1/completions`.
pub(crate) async fn completions(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    generate(sim, &body, false).await
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    generate(sim, &body, true).await
}

/// Hands a request to the engine after the configured failure injection: an
/// injected error or an engine refusal is the reply to send instead.
pub(crate) async fn submit(sim: &Sim, request: NewRequest) -> Result<Generation, Response> {
    match sim.roll_failure() {
        Some(Injected::Error) => {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "injected failure",
            ));
        }
        Some(Injected::Hang) => std::future::pending::<()>().await,
        None => {}
    }
    sim.submit(request)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "BadRequestError", e.to_string()))
}

/// Waits for a whole generation; `None` if the engine stopped first.
pub(crate) async fn finish(g: Generation) -> Result<(String, Outcome), Response> {
    g.collect().await.ok_or_else(|| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "the engine stopped",
        )
    })
}

async fn generate(sim: Arc<Sim>, body: &[u8], chat: bool) -> Response {
    let mut ask = match parse(&sim, body, chat) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let id = format!(
        "{}-{:016x}",
        if chat { "chatcmpl" } else { "cmpl" },
        sim.next_id()
    );
    let request = NewRequest {
        model: ask.model.clone(),
        prompt: std::mem::take(&mut ask.prompt),
        prompt_tokens: ask.prompt_tokens,
        max_tokens: ask.max_tokens,
        token_ids: ask.token_ids.take(),
        media: std::mem::take(&mut ask.places),
        cache_salt: ask.cache_salt.take(),
        remote_prefill: ask.transfer == Transfer::Consume,
    };
    if ask.transfer == Transfer::Consume {
        // Pull the prompt's KV from the prefill server (no engine compute).
        let us = ask.prompt_tokens as f64 * sim.cfg.kv_transfer_us_per_token;
        if us.is_finite() && us > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(us / 1e6)).await;
        }
    }
    let g = match submit(&sim, request).await {
        Ok(g) => g,
        Err(e) => return e,
    };
    if ask.stream {
        return stream(g, ask, id, chat);
    }
    let (text, outcome) = match finish(g).await {
        Ok(done) => done,
        Err(e) => return e,
    };
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text},
               "logprobs": null, "finish_reason": "length"})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
    };
    let mut body = json!({
        "id": id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": unix_secs(),
        "model": ask.model,
        "choices": [choice],
        "usage": usage(&outcome),
    });
    if ask.transfer == Transfer::Produce {
        body["kv_transfer_params"] = produced_params(&sim, outcome.prompt_tokens);
    }
    Json(body).into_response()
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One SSE chunk of a streamed response.
struct Chunker {
    id: String,
    model: String,
    created: u64,
    chat: bool,
}

impl Chunker {
    fn object(&self) -> &'static str {
        if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        }
    }

    fn token(&self, text: &str, first: bool, finish: Option<&str>) -> Bytes {
        let choice = if self.chat {
            let delta = if first {
                json!({"role": "assistant", "content": text})
            } else if finish.is_some() {
                json!({})
            } else {
                json!({"content": text})
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        sse(
            &json!({"id": self.id, "object": self.object(), "created": self.created,
                    "model": self.model, "choices": [choice]}),
        )
    }

    fn usage(&self, outcome: &Outcome) -> Bytes {
        sse(
            &json!({"id": self.id, "object": self.object(), "created": self.created,
                    "model": self.model, "choices": [], "usage": usage(outcome)}),
        )
    }
}

fn stream(mut g: Generation, ask: Ask, id: String, chat: bool) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    let chunker = Chunker {
        id,
        model: ask.model,
        created: unix_secs(),
        chat,
    };
    tokio::spawn(async move {
        let mut first = true;
        while let Some(event) = g.next().await {
            let bytes = match event {
                Event::Token(t) => chunker.token(t, first, None),
                Event::Done(outcome) => {
                    let _ = tx.send(Ok(chunker.token("", false, Some("length")))).await;
                    if ask.include_usage {
                        let _ = tx.send(Ok(chunker.usage(&outcome))).await;
                    }
                    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                    return;
                }
            };
            first = false;
            if tx.send(Ok(bytes)).await.is_err() {
                return; // client gone: dropping `g` aborts the request
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The media parts of a chat body's messages, in order, as (modality,
/// identifier): `image_url`, `input_image` → image; `input_audio`,
/// `audio_url` → audio; `video_url` → video. vLLM hashes each item's
/// content; the simulator fetches nothing, so it hashes the reference (the
/// URL, or the inline data, which is the content).
fn media_parts(v: &Value) -> Vec<(&'static str, String)> {
    let mut items = Vec::new();
    let parts = v
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten();
    for part in parts {
        let Some(kind) = part.get("type").and_then(Value::as_str) else {
            continue;
        };
        let Some(modality) = crate::chat_template::media_modality(kind) else {
            continue;
        };
        // `{"image_url": {"url": …}}`, `{"image_url": "…"}`, `{"input_audio": {"data": …}}`.
        let reference = part.get(kind).map_or(Value::Null, |r| {
            r.get("url")
                .or_else(|| r.get("data"))
                .cloned()
                .unwrap_or_else(|| r.clone())
        });
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&reference.to_string(), &mut h);
        items.push((modality, format!("{:016x}", std::hash::Hasher::finish(&h))));
    }
    items
}

/// The `features` of a chat render answer: `{"mm_hashes": {modality:
/// [hash, …]}}` for the media parts, in order, with `"mm_placeholders":
/// {modality: [{"offset", "length"}, …]}` when they were placed among the
/// tokens (`--mm-tokens`); null without any.
fn media_features(media: &[(&'static str, String)], places: &[MediaPlace]) -> Value {
    if media.is_empty() {
        return Value::Null;
    }
    let mut hashes: serde_json::Map<String, Value> = serde_json::Map::new();
    for (modality, hash) in media {
        if let Value::Array(list) = hashes
            .entry(*modality)
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            list.push(Value::String(hash.clone()));
        }
    }
    if places.is_empty() {
        return json!({ "mm_hashes": hashes });
    }
    let mut ranges: serde_json::Map<String, Value> = serde_json::Map::new();
    for p in places {
        if let Value::Array(list) = ranges
            .entry(p.modality)
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            list.push(json!({"offset": p.offset, "length": p.length}));
        }
    }
    json!({ "mm_hashes": hashes, "mm_placeholders": ranges })
}

/// `POST /v1/completions/render` and `/v1/chat/completions/render` (vLLM's
/// render endpoints, as `vllm launch render` serves them): the token ids the
/// server would compute for the request, without generating, and for chat
/// the media items' hashes ([`media_features`]). Needs `--tokenizer` (the
/// ids are the tokenizer's, as in the server's KV events).
async fn render(sim: Arc<Sim>, body: &[u8], chat: bool) -> Response {
    let ask = match parse(&sim, body, chat) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let Some(ids) = ask.token_ids else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "rendering needs a tokenizer: start the simulator with --tokenizer",
        );
    };
    let id = format!("render-{:016x}", sim.next_id());
    if chat {
        let features = media_features(&ask.media, &ask.places);
        Json(json!({"request_id": id, "token_ids": ids, "features": features})).into_response()
    } else {
        Json(json!([{"request_id": id, "token_ids": ids}])).into_response()
    }
}

/// `POST /v1/completions/render`.
pub(crate) async fn completions_render(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    render(sim, &body, false).await
}

/// `POST /v1/chat/completions/render`.
pub(crate) async fn chat_completions_render(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    render(sim, &body, true).await
}

#[cfg(test)]
mod render_tests {
    use super::*;

    #[test]
    fn chat_renders_report_each_media_part_by_modality() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"look"},
            {"type":"image_url","image_url":{"url":"http://x/a.png"}},
            {"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},
            {"type":"image_url","image_url":{"url":"http://x/a.png"}}]}]}"#;
        let media = media_parts(&serde_json::from_slice(body).unwrap());
        let f = media_features(&media, &[]);
        let images = f["mm_hashes"]["image"].as_array().unwrap();
        assert_eq!(images.len(), 2, "one per part, repeats included");
        assert_eq!(images[0], images[1], "the same reference, the same hash");
        assert_eq!(f["mm_hashes"]["audio"].as_array().unwrap().len(), 1);
        assert!(f.get("mm_placeholders").is_none(), "not placed");
        // Placed: each modality's places in order.
        let at = |i: usize, offset| MediaPlace {
            modality: media[i].0,
            hash: media[i].1.clone(),
            offset,
            length: 4,
        };
        let f = media_features(&media, &[at(0, 2), at(1, 6), at(2, 12)]);
        assert_eq!(
            f["mm_placeholders"],
            json!({"image": [{"offset": 2, "length": 4}, {"offset": 12, "length": 4}],
                   "audio": [{"offset": 6, "length": 4}]})
        );
        let text_only = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let none = media_parts(&serde_json::from_slice(text_only).unwrap());
        assert_eq!(media_features(&none, &[]), Value::Null);
    }
}
