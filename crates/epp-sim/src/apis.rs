//! The other inference APIs a gateway routes: OpenAI `/v1/responses`,
//! `/v1/conversations` and `/v1/embeddings`, and Anthropic `/v1/messages`.
//! Each runs through the same engine as completions (so its prompt meets the
//! prefix cache and the queue); replies are plain JSON in each API's shape,
//! with its usage fields. Streaming is simulated only for completions and
//! chat: a streamed request here gets 400.

use std::{
    hash::{BuildHasher, BuildHasherDefault, DefaultHasher},
    sync::Arc,
};

use axum::{
    Json,
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    engine::{NewRequest, Outcome, Sim, count_tokens},
    openai::{ApiError, api_error, finish, json_and_model, submit, text_of_content, unix_secs},
};

/// Dimensions of a simulated embedding.
const EMBEDDING_DIMS: usize = 8;

/// What the handlers below need from a request.
struct Parsed {
    model: String,
    prompt: String,
    max_tokens: u64,
}

fn bad(message: impl Into<String>) -> ApiError {
    api_error(StatusCode::BAD_REQUEST, "BadRequestError", message)
}

fn not_streamed(v: &Value, api: &str) -> Result<(), ApiError> {
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(bad(format!(
            "streaming is not simulated for {api}; send \"stream\": false"
        )));
    }
    Ok(())
}

/// One turn of a transcript: `role: text`.
fn push_turn(role: &str, content: &Value, out: &mut String) {
    out.push_str(role);
    out.push_str(": ");
    text_of_content(content, out);
    out.push('\n');
}

/// Responses / Conversations items, each a turn (items without a role, such
/// as tool calls, count as the user's).
fn push_items(items: &[Value], out: &mut String) {
    for item in items {
        let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
        push_turn(role, item.get("content").unwrap_or(item), out);
    }
}

fn max_tokens(sim: &Sim, v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or(sim.cfg.max_tokens_default)
        .max(1)
}

async fn run(sim: &Sim, p: Parsed) -> Result<(String, String, Outcome), Response> {
    // The transcript is tokenized when there is a `--tokenizer`.
    let token_ids = sim
        .tokenize(&p.prompt)
        .map_err(|e| bad(e).into_response())?;
    let prompt_tokens = token_ids
        .as_ref()
        .map_or_else(|| count_tokens(&p.prompt), |ids| ids.len() as u64)
        .max(1);
    let g = submit(
        sim,
        NewRequest {
            model: p.model.clone(),
            prompt: p.prompt,
            prompt_tokens,
            max_tokens: p.max_tokens,
            token_ids,
            ..NewRequest::default()
        },
    )
    .await?;
    let (text, outcome) = finish(g).await?;
    Ok((p.model, text, outcome))
}

fn reply(result: Result<Value, Response>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e,
    }
}

// === /v1/responses ===

fn parse_responses(sim: &Sim, body: &[u8]) -> Result<Parsed, ApiError> {
    let (v, model) = json_and_model(sim, body)?;
    not_streamed(&v, "/v1/responses")?;
    let mut prompt = String::new();
    if let Some(instructions) = v.get("instructions") {
        push_turn("system", instructions, &mut prompt);
    }
    match v.get("input") {
        Some(s @ Value::String(_)) => push_turn("user", s, &mut prompt),
        Some(Value::Array(items)) => push_items(items, &mut prompt),
        _ => return Err(bad("`input` must be a string or a list of items")),
    }
    Ok(Parsed {
        model,
        prompt,
        max_tokens: max_tokens(sim, &v, "max_output_tokens"),
    })
}

/// `POST /v1/responses` (OpenAI Responses API, non-streamed).
pub(crate) async fn responses(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let parsed = match parse_responses(&sim, &body) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    reply(run(&sim, parsed).await.map(|(model, text, o)| {
        let id = sim.next_id();
        json!({
            "id": format!("resp_{id:016x}"),
            "object": "response",
            "created_at": unix_secs(),
            "model": model,
            "status": "completed",
            "output": [{
                "type": "message", "id": format!("msg_{id:016x}"), "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }],
            "usage": {
                "input_tokens": o.prompt_tokens,
                "input_tokens_details": {"cached_tokens": o.cached_tokens},
                "output_tokens": o.completion_tokens,
                "total_tokens": o.prompt_tokens + o.completion_tokens,
            },
        })
    }))
}

// === /v1/conversations ===

/// `POST /v1/conversations`: creating a conversation with its first `items`
/// prefills them (one output token, not returned), as a server that keeps
/// conversation state would, and returns the conversation object.
pub(crate) async fn conversations(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let parsed = json_and_model(&sim, &body).and_then(|(v, model)| {
        let items = v
            .get("items")
            .and_then(Value::as_array)
            .filter(|items| !items.is_empty())
            .ok_or_else(|| bad("`items` must be a non-empty list"))?;
        let mut prompt = String::new();
        push_items(items, &mut prompt);
        Ok((
            Parsed {
                model,
                prompt,
                max_tokens: 1,
            },
            v.get("metadata").cloned().unwrap_or_else(|| json!({})),
        ))
    });
    let (request, metadata) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    reply(run(&sim, request).await.map(|_| {
        json!({
            "id": format!("conv_{:016x}", sim.next_id()),
            "object": "conversation",
            "created_at": unix_secs(),
            "metadata": metadata,
        })
    }))
}

// === /v1/messages ===

fn parse_messages(sim: &Sim, body: &[u8]) -> Result<Parsed, ApiError> {
    let (v, model) = json_and_model(sim, body)?;
    not_streamed(&v, "/v1/messages")?;
    let messages = v
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("`messages` must be a non-empty list"))?;
    let mut prompt = String::new();
    if let Some(system) = v.get("system") {
        push_turn("system", system, &mut prompt);
    }
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        push_turn(role, m.get("content").unwrap_or(&Value::Null), &mut prompt);
    }
    Ok(Parsed {
        model,
        prompt,
        max_tokens: max_tokens(sim, &v, "max_tokens"),
    })
}

/// `POST /v1/messages` (Anthropic Messages API, non-streamed).
pub(crate) async fn messages(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let parsed = match parse_messages(&sim, &body) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    reply(run(&sim, parsed).await.map(|(model, text, o)| {
        json!({
            "id": format!("msg_{:016x}", sim.next_id()),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "max_tokens",
            "stop_sequence": null,
            "usage": {
                "input_tokens": o.prompt_tokens.saturating_sub(o.cached_tokens),
                "cache_read_input_tokens": o.cached_tokens,
                "output_tokens": o.completion_tokens,
            },
        })
    }))
}

// === /v1/embeddings ===

/// The inputs of an embeddings request, one text per embedding (token-id
/// inputs are spelled as their numbers).
fn embedding_inputs(v: &Value) -> Result<Vec<String>, ApiError> {
    let ids = |ids: &[Value]| ids.iter().map(ToString::to_string).collect::<Vec<_>>();
    match v.get("input") {
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) if items.is_empty() => Err(bad("`input` must not be empty")),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            Ok(vec![ids(items).join(" ")])
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                Value::Array(inner) => Ok(ids(inner).join(" ")),
                _ => Err(bad("`input` items must be strings or token-id lists")),
            })
            .collect(),
        _ => Err(bad("`input` must be a string or a list")),
    }
}

/// A deterministic unit vector for a text, so equal inputs embed equally.
fn embed(text: &str) -> Vec<f64> {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    let raw: Vec<f64> = (0..EMBEDDING_DIMS)
        .map(|d| (hasher.hash_one((d, text)) % 2001) as f64 / 1000.0 - 1.0)
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::EPSILON);
    raw.into_iter().map(|x| x / norm).collect()
}

/// `POST /v1/embeddings`: the inputs are prefilled as one request (one output
/// token, not returned) and each gets a deterministic embedding.
pub(crate) async fn embeddings(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let parsed =
        json_and_model(&sim, &body).and_then(|(v, model)| Ok((model, embedding_inputs(&v)?)));
    let (model, inputs) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let prompt = inputs.join("\n");
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": embed(text)}))
        .collect();
    let request = Parsed {
        model,
        prompt,
        max_tokens: 1,
    };
    reply(run(&sim, request).await.map(|(model, _, o)| {
        json!({
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": o.prompt_tokens, "total_tokens": o.prompt_tokens},
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_inputs_of_every_form() {
        let inputs = |v: Value| embedding_inputs(&json!({ "input": v }));
        assert_eq!(inputs(json!("a")).unwrap(), ["a"]);
        assert_eq!(inputs(json!(["a", "b"])).unwrap(), ["a", "b"]);
        assert_eq!(inputs(json!([1, 2])).unwrap(), ["1 2"]);
        assert_eq!(inputs(json!([[1, 2], [3]])).unwrap(), ["1 2", "3"]);
        assert!(inputs(json!({"x": 1})).is_err());
        assert!(inputs(json!([true])).is_err());
        assert!(inputs(json!([])).is_err());
    }

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embed("hello");
        assert_eq!(a, embed("hello"));
        assert_ne!(a, embed("world"));
        assert_eq!(a.len(), EMBEDDING_DIMS);
        let norm: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-9, "{norm}");
    }
}
