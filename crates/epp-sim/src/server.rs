//! HTTP surface: OpenAI-compatible completions and chat (plain and SSE),
//! model listing, health, metrics, the registration endpoints other routers
//! probe, and an admin API for tests.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::engine::{Generation, Injected, Outcome, Sim, count_tokens};

/// The router for one simulated server.
pub fn router(sim: Arc<Sim>) -> Router {
    let pod = HeaderValue::from_str(&sim.cfg.pod_name).unwrap_or(HeaderValue::from_static("sim"));
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(ok))
        .route("/readiness", get(ok))
        .route("/metrics", get(metrics))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/get_load", get(load))
        .route("/admin/state", post(admin_state))
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let pod = pod.clone();
            async move {
                r.headers_mut().insert("x-inference-pod", pod);
                r
            }
        }))
        .with_state(sim)
}

/// An OpenAI-style error reply.
#[derive(Debug)]
struct ApiError {
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

fn api_error(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        kind,
        message: message.into(),
    }
}

fn error(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Response {
    api_error(status, kind, message).into_response()
}

/// What a request asks for.
#[derive(Debug)]
struct Ask {
    model: String,
    prompt: String,
    prompt_tokens: u64,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
}

fn text_of_content(content: &Value, out: &mut String) {
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

fn parse(sim: &Sim, body: &[u8], chat: bool) -> Result<Ask, ApiError> {
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
    if !sim.cfg.serves(&model) {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{model}` does not exist."),
        ));
    }
    let mut prompt = String::new();
    let mut token_ids = 0u64;
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
                        Value::String(s) => prompt.push_str(s),
                        Value::Number(n) => {
                            token_ids += 1;
                            prompt.push_str(&n.to_string());
                            prompt.push(' ');
                        }
                        Value::Array(ids) => {
                            token_ids += ids.len() as u64;
                            for id in ids {
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
    let prompt_tokens = if token_ids > 0 {
        token_ids
    } else {
        count_tokens(&prompt)
    }
    .max(1);
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
    Ok(Ask {
        model,
        prompt,
        prompt_tokens,
        max_tokens,
        stream,
        include_usage,
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

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn completions(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    generate(sim, &body, false).await
}

async fn chat_completions(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    generate(sim, &body, true).await
}

async fn generate(sim: Arc<Sim>, body: &[u8], chat: bool) -> Response {
    let ask = match parse(&sim, body, chat) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    match sim.injected_failure() {
        Some(Injected::Error) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "injected failure",
            );
        }
        Some(Injected::Hang) => std::future::pending::<()>().await,
        None => {}
    }
    let id = format!(
        "{}-{:016x}",
        if chat { "chatcmpl" } else { "cmpl" },
        rand::random::<u64>()
    );
    if ask.stream {
        return stream(sim, ask, id, chat);
    }
    let mut g = sim
        .start(&ask.model, &ask.prompt, ask.prompt_tokens, ask.max_tokens)
        .await;
    let mut text = String::new();
    while !g.done() {
        g.next_token().await;
        text.push_str(sim.word());
    }
    let outcome = g.finish();
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
    };
    Json(json!({
        "id": id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": unix_secs(),
        "model": ask.model,
        "choices": [choice],
        "usage": usage(&outcome),
    }))
    .into_response()
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream(sim: Arc<Sim>, ask: Ask, id: String, chat: bool) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let created = unix_secs();
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let chunk = |text: &str, first: bool, finish: Option<&str>| {
            let choice = if chat {
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
                &json!({"id": id, "object": object, "created": created, "model": ask.model, "choices": [choice]}),
            )
        };
        let mut g: Generation = sim
            .start(&ask.model, &ask.prompt, ask.prompt_tokens, ask.max_tokens)
            .await;
        let mut first = true;
        while !g.done() {
            g.next_token().await;
            if tx.send(Ok(chunk(sim.word(), first, None))).await.is_err() {
                return; // client gone: dropping `g` frees its slot and blocks
            }
            first = false;
        }
        let outcome = g.finish();
        let _ = tx.send(Ok(chunk("", false, Some("length")))).await;
        if ask.include_usage {
            let v = json!({"id": id, "object": object, "created": created, "model": ask.model,
                           "choices": [], "usage": usage(&outcome)});
            let _ = tx.send(Ok(sse(&v))).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn ok() -> StatusCode {
    StatusCode::OK
}

async fn models(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let created = sim.started_unix as u64;
    let mut data = vec![
        json!({"id": sim.cfg.model, "object": "model", "created": created,
                               "owned_by": "epp-sim", "root": sim.cfg.model, "parent": null,
                               "max_model_len": sim.cfg.num_gpu_blocks * sim.cfg.block_size}),
    ];
    for name in &sim.cfg.served_model_name {
        data.push(
            json!({"id": name, "object": "model", "created": created, "owned_by": "epp-sim",
                         "root": sim.cfg.model, "parent": null}),
        );
    }
    for lora in &sim.cfg.lora_modules {
        data.push(
            json!({"id": lora, "object": "model", "created": created, "owned_by": "epp-sim",
                         "root": lora, "parent": sim.cfg.model}),
        );
    }
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(sim): State<Arc<Sim>>) -> Response {
    if sim.cfg.slow_metrics_ms > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(sim.cfg.slow_metrics_ms / 1000.0)).await;
    }
    let page = crate::metrics::render(&sim.cfg, &sim.state.lock(), sim.started_unix);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
        .into_response()
}

fn model_path(sim: &Sim) -> &str {
    sim.cfg.model_path.as_deref().unwrap_or(&sim.cfg.model)
}

async fn model_info(State(sim): State<Arc<Sim>>) -> Json<Value> {
    Json(
        json!({"model_path": model_path(&sim), "tokenizer_path": model_path(&sim),
                "is_generation": true, "preferred_sampling_params": null}),
    )
}

async fn server_info(State(sim): State<Arc<Sim>>) -> Json<Value> {
    Json(json!({
        "model_path": model_path(&sim),
        "tokenizer_path": model_path(&sim),
        "served_model_name": sim.cfg.model,
        "max_total_num_tokens": sim.cfg.num_gpu_blocks * sim.cfg.block_size,
        "page_size": sim.cfg.block_size,
        "max_running_requests": sim.cfg.max_num_seqs,
        "dp_size": 1,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn load(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let st = sim.state.lock();
    let waiting = st.waiting + st.extra_waiting as usize;
    Json(json!([{
        "dp_rank": 0,
        "num_reqs": st.running + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": st.blocks_in_use * sim.cfg.block_size,
    }]))
}

/// `POST /admin/state`: `{"extra_waiting": N}` adds N to the reported queue
/// and slows the server as if N more requests were queued; `{"gauges":
/// {"series{label=\"v\"}": 1.5, "other": null}}` sets or removes extra gauges.
async fn admin_state(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                format!("invalid JSON: {e}"),
            );
        }
    };
    let mut st = sim.state.lock();
    if let Some(n) = v.get("extra_waiting") {
        match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => st.extra_waiting = n,
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequestError",
                    "extra_waiting must be a non-negative integer",
                );
            }
        }
    }
    if let Some(gauges) = v.get("gauges").and_then(Value::as_object) {
        for (series, value) in gauges {
            match value.as_f64() {
                Some(x) => {
                    st.gauges.insert(series.clone(), x);
                }
                None => {
                    st.gauges.remove(series);
                }
            }
        }
    }
    Json(json!({"ok": true, "extra_waiting": st.extra_waiting, "gauges": st.gauges}))
        .into_response()
}
