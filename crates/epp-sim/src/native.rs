//! The engines' own HTTP APIs, beside the OpenAI ones, so a gateway's
//! parsers for them are tested against a server: vLLM's
//! `/inference/v1/generate` (token ids in and out), SGLang's native
//! `/generate`, and the KServe v2 inference protocol Triton speaks
//! (`/v2/models/{model}/infer`, TensorRT-LLM's `text_input` / `max_tokens` /
//! `text_output` tensors). Each runs through the same engine; no streaming.

use std::sync::Arc;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    engine::{NewRequest, Outcome, Sim, count_tokens},
    openai::{ApiError, api_error, finish, submit},
};

fn bad(message: impl Into<String>) -> ApiError {
    api_error(StatusCode::BAD_REQUEST, "BadRequestError", message)
}

fn json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}")))
}

fn token_ids(v: Option<&Value>) -> Option<Vec<u32>> {
    v?.as_array()?
        .iter()
        .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .filter(|ids| !ids.is_empty())
}

fn model_of(sim: &Sim, v: &Value) -> Result<String, ApiError> {
    match v.get("model").and_then(Value::as_str) {
        None => Ok(sim.cfg.model.clone()),
        Some(m) if sim.cfg.serves(m) => Ok(m.to_owned()),
        Some(m) => Err(api_error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{m}` does not exist."),
        )),
    }
}

/// Runs a prompt of token ids or text.
async fn run(
    sim: &Sim,
    model: String,
    prompt: Result<Vec<u32>, String>,
    max_tokens: Option<u64>,
) -> Result<(String, Outcome), Response> {
    let (prompt, token_ids) = match prompt {
        Ok(ids) => (String::new(), Some(ids)),
        Err(text) => {
            let ids = sim.tokenize(&text).map_err(|e| bad(e).into_response())?;
            (text, ids)
        }
    };
    let prompt_tokens = token_ids
        .as_ref()
        .map_or_else(|| count_tokens(&prompt), |ids| ids.len() as u64)
        .max(1);
    let g = submit(
        sim,
        NewRequest {
            model,
            prompt,
            prompt_tokens,
            max_tokens: max_tokens.unwrap_or(sim.cfg.max_tokens_default).max(1),
            token_ids,
            ..NewRequest::default()
        },
    )
    .await?;
    finish(g).await
}

/// The output as token ids (one per generated 4-character word).
fn output_ids(o: &Outcome) -> Vec<u64> {
    (0..o.completion_tokens).map(|i| 1000 + i).collect()
}

/// `POST /inference/v1/generate` (vLLM): `{"token_ids": [...],
/// "sampling_params": {"max_tokens"}}` → `{"choices": [{"token_ids"}]}`.
pub(crate) async fn vllm_generate(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let parsed = json(&body).and_then(|v| {
        let ids = token_ids(v.get("token_ids"))
            .ok_or_else(|| bad("`token_ids` must be a non-empty array of token ids"))?;
        let max = v
            .pointer("/sampling_params/max_tokens")
            .and_then(Value::as_u64);
        Ok((model_of(&sim, &v)?, ids, max))
    });
    let (model, ids, max) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match run(&sim, model, Ok(ids), max).await {
        Ok((_, o)) => Json(json!({
            "request_id": format!("gen-{:016x}", sim.next_id()),
            "choices": [{"index": 0, "token_ids": output_ids(&o), "finish_reason": "length"}],
            "prompt_token_ids_len": o.prompt_tokens,
            "num_cached_tokens": o.cached_tokens,
        }))
        .into_response(),
        Err(e) => e,
    }
}

/// `POST /generate` (SGLang): `{"input_ids": [...]}` or `{"text": "..."}`,
/// `sampling_params.max_new_tokens` → `{"text", "output_ids", "meta_info"}`.
pub(crate) async fn sglang_generate(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let parsed = json(&body).and_then(|v| {
        let prompt = match (
            token_ids(v.get("input_ids")),
            v.get("text").and_then(Value::as_str),
        ) {
            (Some(ids), _) => Ok(ids),
            (None, Some(text)) => Err(text.to_owned()),
            (None, None) => return Err(bad("one of `input_ids` or `text` is required")),
        };
        let max = v
            .pointer("/sampling_params/max_new_tokens")
            .and_then(Value::as_u64);
        Ok((model_of(&sim, &v)?, prompt, max))
    });
    let (model, prompt, max) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match run(&sim, model, prompt, max).await {
        Ok((text, o)) => Json(json!({
            "text": text,
            "output_ids": output_ids(&o),
            "meta_info": {
                "id": format!("{:032x}", sim.next_id()),
                "prompt_tokens": o.prompt_tokens,
                "completion_tokens": o.completion_tokens,
                "cached_tokens": o.cached_tokens,
                "finish_reason": {"type": "length", "length": o.completion_tokens},
            },
        }))
        .into_response(),
        Err(e) => e,
    }
}

/// The first element of the KServe v2 input tensor `name`.
fn input<'v>(v: &'v Value, name: &str) -> Option<&'v Value> {
    v.get("inputs")?
        .as_array()?
        .iter()
        .find(|t| t.get("name").and_then(Value::as_str) == Some(name))?
        .get("data")?
        .as_array()?
        .first()
}

/// `POST /v2/models/{model}/infer` (KServe v2, Triton with TensorRT-LLM's
/// ensemble): the `text_input` tensor is the prompt, `max_tokens` the
/// output length; answers with the `text_output` tensor.
pub(crate) async fn kserve_infer(
    State(sim): State<Arc<Sim>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Response {
    let parsed = json(&body).and_then(|v| {
        let text = input(&v, "text_input")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("the `text_input` input tensor (BYTES) is required"))?
            .to_owned();
        let max = input(&v, "max_tokens").and_then(Value::as_u64);
        if !sim.cfg.serves(&model) {
            return Err(api_error(
                StatusCode::NOT_FOUND,
                "NotFoundError",
                format!("Request for unknown model: '{model}' is not found"),
            ));
        }
        Ok((text, max, v.get("id").cloned()))
    });
    let (text, max, id) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match run(&sim, model.clone(), Err(text), max).await {
        Ok((out, _)) => Json(json!({
            "model_name": model,
            "model_version": "1",
            "id": id.unwrap_or(Value::Null),
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1], "data": [out]}],
        }))
        .into_response(),
        Err(e) => e,
    }
}
