//! HTTP surface: the generation endpoints (in `openai.rs`), model
//! listing, health, metrics, the registration endpoints other routers probe,
//! and an admin API for tests.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::{
    apis,
    engine::{Sim, count_tokens},
    native, openai,
    openai::{chat_completions, completions, error},
};

/// Generation requests as received, newest last (`--record-requests`).
#[derive(Debug, Default)]
struct Recorded {
    capacity: usize,
    requests: Mutex<VecDeque<Value>>,
}

/// Records a generation request exactly as it arrived, then serves it.
async fn record(
    State(rec): State<Arc<Recorded>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let headers: Vec<Value> = parts
        .headers
        .iter()
        .map(|(k, v)| json!([k.as_str(), String::from_utf8_lossy(v.as_bytes())]))
        .collect();
    let entry = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "headers": headers,
        "body": String::from_utf8_lossy(&bytes),
    });
    {
        let mut q = rec.requests.lock();
        if q.len() == rec.capacity {
            q.pop_front();
        }
        q.push_back(entry);
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Request header asking for a trailer on the response (tests of gateways
/// that must pass trailers): the response ends with trailer
/// `x-sim-trailer` carrying the header's value.
const TRAILER_REQUEST: &str = "x-sim-trailer";

/// Adds the trailer a request asked for with `x-sim-trailer`.
async fn trailer(req: Request, next: axum::middleware::Next) -> Response {
    let Some(value) = req.headers().get(TRAILER_REQUEST).cloned() else {
        return next.run(req).await;
    };
    let response = next.run(req).await;
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::TRAILER, HeaderValue::from_static(TRAILER_REQUEST));
    let mut trailers = axum::http::HeaderMap::new();
    trailers.insert(TRAILER_REQUEST, value);
    let body = http_body_util::BodyExt::with_trailers(body, std::future::ready(Some(Ok(trailers))));
    Response::from_parts(parts, axum::body::Body::new(UnsizedBody(body)))
}

/// A body that does not announce its size, so it is sent chunked (trailers
/// need chunked framing).
struct UnsizedBody<B>(B);

impl<B: http_body::Body + Unpin> http_body::Body for UnsizedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// The router for one simulated server.
pub fn router(sim: Arc<Sim>) -> Router {
    let pod = HeaderValue::from_str(&sim.cfg.pod_name).unwrap_or(HeaderValue::from_static("sim"));
    let recorded = Arc::new(Recorded {
        capacity: sim.cfg.record_requests,
        requests: Mutex::new(VecDeque::new()),
    });
    let mut generation = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(apis::responses))
        .route("/v1/conversations", post(apis::conversations))
        .route("/v1/messages", post(apis::messages))
        .route("/v1/embeddings", post(apis::embeddings))
        .route("/inference/v1/generate", post(native::vllm_generate))
        .route("/generate", post(native::sglang_generate))
        .route("/v2/models/{model}/infer", post(native::kserve_infer))
        .layer(axum::middleware::from_fn(trailer));
    if recorded.capacity > 0 {
        generation = generation.layer(axum::middleware::from_fn_with_state(
            Arc::clone(&recorded),
            record,
        ));
    }
    Router::new()
        .merge(generation)
        .route(
            "/admin/requests",
            get(move || {
                let rec = Arc::clone(&recorded);
                async move { Json(Value::Array(rec.requests.lock().iter().cloned().collect())) }
            }),
        )
        .route("/v1/models", get(models))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .route("/health", get(health))
        .route("/readiness", get(health))
        .route("/ping", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/get_load", get(load))
        .route("/tokenize", post(tokenize))
        .route("/v1/completions/render", post(openai::completions_render))
        .route(
            "/v1/chat/completions/render",
            post(openai::chat_completions_render),
        )
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/admin/state", post(admin_state).get(admin_view))
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let pod = pod.clone();
            async move {
                r.headers_mut().insert("x-inference-pod", pod);
                r
            }
        }))
        .with_state(sim)
}

async fn health(State(sim): State<Arc<Sim>>) -> StatusCode {
    if sim.with_core(|c| c.knobs.unhealthy) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

async fn models(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let cfg = &sim.cfg;
    let created = sim.started_unix as u64;
    let max_model_len = cfg.model_len();
    let entry = |id: &str, root: &str, parent: Option<&str>| {
        json!({"id": id, "object": "model", "created": created, "owned_by": "vllm",
               "root": root, "parent": parent, "max_model_len": max_model_len})
    };
    let mut data = vec![entry(&cfg.model, &cfg.model, None)];
    for name in &cfg.served_model_name {
        data.push(entry(name, &cfg.model, None));
    }
    for lora in sim.with_core(|c| c.lora_adapters().map(str::to_owned).collect::<Vec<_>>()) {
        data.push(entry(&lora, &lora, Some(&cfg.model)));
    }
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(sim): State<Arc<Sim>>) -> Response {
    let delay = sim.with_core(|c| c.knobs.slow_metrics_ms);
    if delay > 0.0 && delay.is_finite() {
        tokio::time::sleep(Duration::from_secs_f64(delay / 1000.0)).await;
    }
    let page = sim.with_core(|c| crate::metrics::render(c, sim.started_unix));
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
                "is_generation": true, "preferred_sampling_params": null,
                "weight_version": "default", "has_image_understanding": false,
                "has_audio_understanding": false, "model_type": "llama",
                "architectures": ["LlamaForCausalLM"]}),
    )
}

async fn server_info(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let cfg = &sim.cfg;
    Json(json!({
        "model_path": model_path(&sim),
        "tokenizer_path": model_path(&sim),
        "served_model_name": cfg.model,
        "context_length": cfg.model_len(),
        "max_total_num_tokens": cfg.num_gpu_blocks * cfg.block_size,
        "page_size": cfg.block_size,
        "max_running_requests": cfg.max_num_seqs,
        "chunked_prefill_size": cfg.max_num_batched_tokens,
        "dp_size": 1,
        "tp_size": 1,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn load(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let (running, waiting, tokens) = sim.with_core(|c| {
        (
            c.running(),
            c.waiting() + c.knobs.extra_waiting as usize,
            c.running_tokens(),
        )
    });
    Json(json!([{
        "dp_rank": 0,
        "num_reqs": running + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": tokens,
    }]))
}

/// `POST /tokenize` (vLLM's shape): token ids under the 4-character rule,
/// each id a hash of its 4 characters.
async fn tokenize(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let text = v
        .get("prompt")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| {
            v.get("messages").and_then(Value::as_array).map(|ms| {
                let mut s = String::new();
                for m in ms {
                    s.push_str(m.get("role").and_then(Value::as_str).unwrap_or("user"));
                    s.push_str(": ");
                    s.push_str(m.get("content").and_then(Value::as_str).unwrap_or(""));
                    s.push('\n');
                }
                s
            })
        });
    let Some(text) = text else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "`prompt` or `messages` required",
        );
    };
    match sim.tokenize(&text) {
        Ok(Some(tokens)) => {
            return Json(json!({"count": tokens.len(), "max_model_len": sim.cfg.model_len(), "tokens": tokens}))
                .into_response();
        }
        Ok(None) => {}
        Err(e) => return error(StatusCode::BAD_REQUEST, "BadRequestError", e),
    }
    let tokens: Vec<u32> = text
        .as_bytes()
        .chunks(crate::engine::CHARS_PER_TOKEN)
        .map(|c| {
            c.iter().fold(2_166_136_261u32, |h, b| {
                (h ^ u32::from(*b)).wrapping_mul(16_777_619)
            }) % 128_000
        })
        .collect();
    debug_assert_eq!(tokens.len() as u64, count_tokens(&text));
    Json(json!({"count": tokens.len(), "max_model_len": sim.cfg.model_len(), "tokens": tokens}))
        .into_response()
}

/// `POST /reset_prefix_cache`, as vLLM has it: drops every cached block and
/// publishes `AllBlocksCleared`. Like vLLM, it does nothing while a request
/// holds blocks, and answers 200 either way.
async fn reset_prefix_cache(State(sim): State<Arc<Sim>>) -> StatusCode {
    if !sim.reset_prefix_cache() {
        eprintln!("epp-sim: reset_prefix_cache: blocks are in use, nothing reset");
    }
    StatusCode::OK
}

/// `POST /admin/state` (see docs/simulator.md): every field optional.
/// `extra_waiting` adds synthetic waiting requests that also slow the server;
/// `gauges` sets (a number) or removes (`null`) extra gauges; `error_rate`,
/// `hang_rate`, `hang`, `stall`, `slow_metrics_ms`, `unhealthy` change
/// failure injection at run time.
async fn admin_state(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(v)) => Value::Object(v),
        Ok(_) => return bad("expected a JSON object"),
        Err(e) => return bad(&format!("invalid JSON: {e}")),
    };
    let result = sim.with_core(|c| {
        let k = &mut c.knobs;
        if let Some(n) = v.get("extra_waiting") {
            k.extra_waiting = n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("extra_waiting must be a non-negative integer")?;
        }
        for (field, slot) in [
            ("error_rate", &mut k.error_rate),
            ("hang_rate", &mut k.hang_rate),
            ("slow_metrics_ms", &mut k.slow_metrics_ms),
        ] {
            if let Some(x) = v.get(field) {
                *slot = x
                    .as_f64()
                    .filter(|x| *x >= 0.0)
                    .ok_or("rates and delays must be non-negative numbers")?;
            }
        }
        for (field, slot) in [
            ("hang", &mut k.hang),
            ("unhealthy", &mut k.unhealthy),
            ("stall", &mut k.stall),
        ] {
            if let Some(x) = v.get(field) {
                *slot = x
                    .as_bool()
                    .ok_or("hang, unhealthy, stall must be booleans")?;
            }
        }
        if let Some(n) = v.get("fail_lora_updates") {
            k.fail_lora_updates = n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("fail_lora_updates must be a non-negative integer")?;
        }
        if let Some(gauges) = v.get("gauges") {
            let gauges = gauges.as_object().ok_or("gauges must be an object")?;
            for (series, value) in gauges {
                match value.as_f64() {
                    Some(x) => {
                        k.gauges.insert(series.clone(), x);
                    }
                    None => {
                        k.gauges.remove(series);
                    }
                }
            }
        }
        Ok::<_, &str>(knobs_json(k))
    });
    sim.poke();
    match result {
        Ok(v) => Json(v).into_response(),
        Err(msg) => bad(msg),
    }
}

/// The `lora_name` of a LoRA update body, or why it is refused (400):
/// every field of `fields` is a required non-empty string.
fn lora_request(body: &[u8], fields: &[&str]) -> Result<String, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    for f in fields {
        if v.get(*f).and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(format!("`{f}` is required"));
        }
    }
    Ok(v["lora_name"].as_str().unwrap_or_default().to_owned())
}

/// Takes one injected failure of a LoRA update, if any is left.
fn lora_update_fails(c: &mut crate::engine_core::Core) -> bool {
    let left = &mut c.knobs.fail_lora_updates;
    if *left > 0 {
        *left -= 1;
        true
    } else {
        false
    }
}

/// `POST /v1/load_lora_adapter` (`{lora_name, lora_path, base_model_name?}`),
/// answered as vLLM does: 200 with a text line, 400 when already loaded.
async fn load_lora_adapter(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let name = match lora_request(&body, &["lora_name", "lora_path"]) {
        Ok(n) => n,
        Err(why) => return bad(&why),
    };
    let result = sim.with_core(|c| {
        if lora_update_fails(c) {
            return Err(None);
        }
        c.load_lora(&name).map_err(Some)
    });
    match result {
        Ok(()) => format!("Success: LoRA adapter '{name}' added successfully.").into_response(),
        Err(None) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "injected failure (fail_lora_updates)",
        ),
        Err(Some(_)) => bad(&format!(
            "The lora adapter '{name}' has already been loaded."
        )),
    }
}

/// `POST /v1/unload_lora_adapter` (`{lora_name}`): 200, or 404 when no such
/// adapter is loaded.
async fn unload_lora_adapter(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let name = match lora_request(&body, &["lora_name"]) {
        Ok(n) => n,
        Err(why) => return bad(&why),
    };
    let result = sim.with_core(|c| {
        if lora_update_fails(c) {
            return Err(None);
        }
        c.unload_lora(&name).map_err(Some)
    });
    match result {
        Ok(()) => format!("Success: LoRA adapter '{name}' removed successfully.").into_response(),
        Err(None) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "injected failure (fail_lora_updates)",
        ),
        Err(Some(_)) => error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The lora adapter '{name}' cannot be found."),
        ),
    }
}

/// `GET /admin/state`: the current knobs and engine state.
async fn admin_view(State(sim): State<Arc<Sim>>) -> Json<Value> {
    Json(sim.with_core(|c| {
        let mut v = knobs_json(&c.knobs);
        v["running"] = json!(c.running());
        v["waiting"] = json!(c.waiting());
        v["kv_usage"] = json!(c.kv_usage());
        v["cached_blocks"] = json!(c.pool().cached_blocks());
        v["resident_adapters"] = json!(c.resident_adapters());
        v
    }))
}

fn knobs_json(k: &crate::engine_core::Knobs) -> Value {
    json!({"ok": true, "extra_waiting": k.extra_waiting, "error_rate": k.error_rate,
           "hang_rate": k.hang_rate, "hang": k.hang, "slow_metrics_ms": k.slow_metrics_ms,
           "unhealthy": k.unhealthy, "stall": k.stall, "gauges": k.gauges,
           "fail_lora_updates": k.fail_lora_updates})
}

fn bad(msg: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "BadRequestError", msg)
}
