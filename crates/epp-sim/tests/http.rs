//! The `epp-sim` binary as other tests use it: started as a process on a free
//! port, spoken to over HTTP/1.0 (close-delimited bodies, no chunking to
//! undo).
#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

mod common;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::{Value, json};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A running simulator, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_epp-sim"))
        .args(["--port", "0", "--pod-name", "pod-a"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("epp-sim listening on 127.0.0.1:"),
        "{line:?}"
    );
    let port = line.trim().rsplit(':').next().unwrap().parse().unwrap();
    Server { child, port }
}

/// A response: status, headers (lower-case names), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn get(port: u16, path: &str) -> Reply {
    request(port, "GET", path, None)
}

fn post(port: u16, path: &str, body: &Value) -> Reply {
    request(port, "POST", path, Some(body))
}

/// The `data:` payloads of an SSE body, checking the framing on the way.
fn sse_events(body: &str) -> Vec<&str> {
    assert!(body.ends_with("\n\n"), "events end with a blank line");
    body.split_terminator("\n\n")
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data line: {e:?}"))
        })
        .collect()
}

#[test]
fn completions_answer_with_usage_and_the_pod_header() {
    let s = start(&[]);
    let prompt = "x".repeat(64 * 3 + 10); // 51 tokens, 3 full blocks
    let ask = json!({"model": MODEL, "prompt": prompt, "max_tokens": 7});
    let r = post(s.port, "/v1/completions", &ask);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-inference-pod"), Some("pod-a"));
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap().len(), 28);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 51, "completion_tokens": 7, "total_tokens": 58,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let again = post(s.port, "/v1/completions", &ask).json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 48);
}

#[test]
fn chat_streams_sse_chunks_a_usage_chunk_and_done() {
    let s = start(&["--max-tokens-default", "4"]);
    let ask = json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": true},
                     "messages": [{"role": "user", "content": "hello there"}]});
    let r = post(s.port, "/v1/chat/completions", &ask);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&r.body);
    assert_eq!(events.len(), 4 + 1 + 1 + 1, "{events:?}");
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    let usage = &chunks[5];
    assert_eq!(usage["choices"], json!([]));
    // "user: hello there\n" is 18 characters: 5 tokens.
    assert_eq!(usage["usage"]["prompt_tokens"], 5);
    assert_eq!(usage["usage"]["completion_tokens"], 4);

    // Without include_usage there is no usage chunk; completions stream too.
    let ask = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": true});
    let r = post(s.port, "/v1/completions", &ask);
    let events = sse_events(&r.body);
    assert_eq!(events.len(), 2 + 1 + 1);
    assert!(!r.body.contains("usage"));
}

#[test]
fn errors_are_openai_shaped() {
    let s = start(&["--max-model-len", "100"]);
    let r = post(
        s.port,
        "/v1/completions",
        &json!({"model": "nope", "prompt": "x"}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "NotFoundError");
    let r = post(s.port, "/v1/chat/completions", &json!({"model": MODEL}));
    assert_eq!(r.status, 400);
    let long = json!({"model": MODEL, "prompt": "x".repeat(400), "max_tokens": 10});
    let r = post(s.port, "/v1/completions", &long);
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("100")
    );
}

#[test]
fn models_and_the_endpoints_routers_probe() {
    let s = start(&["--lora-modules", "sql", "--served-model-name", "llama"]);
    let models = get(s.port, "/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [MODEL, "llama", "sql"]);
    assert_eq!(models["data"][2]["parent"], MODEL);
    for path in [
        "/health",
        "/readiness",
        "/model_info",
        "/get_model_info",
        "/server_info",
    ] {
        assert_eq!(get(s.port, path).status, 200, "{path}");
    }
    assert_eq!(get(s.port, "/model_info").json()["model_path"], MODEL);
    assert_eq!(
        get(s.port, "/get_load").json(),
        json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}])
    );
    let t = post(s.port, "/tokenize", &json!({"prompt": "Hello, world"})).json();
    assert_eq!(t["count"], 3);
    let r = post(
        s.port,
        "/v1/completions",
        &json!({"model": "sql", "prompt": "q", "max_tokens": 1}),
    );
    assert_eq!(r.json()["model"], "sql");
}

#[test]
fn metrics_parse_and_reflect_served_requests() {
    for engine in ["vllm", "sglang", "trtllm-serve", "triton"] {
        let s = start(&["--engine", engine]);
        let ask = json!({"model": MODEL, "prompt": "count me", "max_tokens": 3});
        assert_eq!(post(s.port, "/v1/completions", &ask).status, 200);
        let r = get(s.port, "/metrics");
        assert!(
            r.header("content-type")
                .unwrap()
                .starts_with("text/plain; version=0.0.4")
        );
        let samples = common::prom::parse(&r.body).unwrap_or_else(|e| panic!("{engine}: {e}"));
        let value = |name: &str| {
            samples
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{engine}: no {name}"))
                .value
        };
        match engine {
            "vllm" => {
                assert_eq!(value("vllm:generation_tokens_total"), 3.0);
                assert_eq!(value("vllm:prompt_tokens_total"), 2.0);
                assert_eq!(value("vllm:num_requests_running"), 0.0);
                assert_eq!(value("vllm:time_to_first_token_seconds_count"), 1.0);
                let info = samples
                    .iter()
                    .find(|s| s.name == "vllm:cache_config_info")
                    .unwrap();
                assert_eq!(info.label("num_gpu_blocks"), Some("8192"));
                assert_eq!(info.label("block_size"), Some("16"));
                let ok = samples
                    .iter()
                    .find(|s| {
                        s.name == "vllm:request_success_total"
                            && s.label("finished_reason") == Some("length")
                    })
                    .unwrap();
                assert_eq!(ok.value, 1.0);
                assert_eq!(ok.label("model_name"), Some(MODEL));
            }
            "sglang" => assert_eq!(value("sglang:num_queue_reqs"), 0.0),
            "trtllm-serve" => assert_eq!(value("trtllm_kv_cache_max_blocks"), 8192.0),
            _ => assert!(
                samples
                    .iter()
                    .any(|s| s.name == "nv_trt_llm_request_metrics"
                        && s.label("request_type") == Some("waiting"))
            ),
        }
    }
}

#[test]
fn admin_state_sets_queue_gauges_and_faults() {
    let s = start(&[]);
    let r = post(
        s.port,
        "/admin/state",
        &json!({"extra_waiting": 40, "gauges": {"my_custom_metric{gpu=\"0\"}": 42.0}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let page = get(s.port, "/metrics").body;
    let samples = common::prom::parse(&page).unwrap();
    let find = |name: &str| samples.iter().find(|s| s.name == name).unwrap();
    assert_eq!(find("vllm:num_requests_waiting").value, 40.0);
    assert_eq!(find("my_custom_metric").label("gpu"), Some("0"));
    assert_eq!(find("my_custom_metric").value, 42.0);
    assert_eq!(get(s.port, "/get_load").json()[0]["num_waiting_reqs"], 40);

    post(
        s.port,
        "/admin/state",
        &json!({"gauges": {"my_custom_metric{gpu=\"0\"}": null}}),
    );
    assert!(!get(s.port, "/metrics").body.contains("my_custom_metric"));

    post(
        s.port,
        "/admin/state",
        &json!({"error_rate": 1.0, "unhealthy": true}),
    );
    let ask = json!({"model": MODEL, "prompt": "x"});
    assert_eq!(post(s.port, "/v1/completions", &ask).status, 500);
    assert_eq!(get(s.port, "/health").status, 503);
    assert_eq!(
        post(s.port, "/admin/state", &json!({"extra_waiting": -1})).status,
        400
    );
}

#[test]
fn a_hanging_server_still_reports_metrics() {
    let s = start(&["--hang"]);
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let body = json!({"model": MODEL, "prompt": "x"}).to_string();
    write!(
        c,
        "POST /v1/completions HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(c.read(&mut buf).is_err(), "no answer while hanging");
    assert_eq!(get(s.port, "/metrics").status, 200);
}

#[test]
fn responses_messages_and_embeddings_run_through_the_engine() {
    let server = start(&[]);
    let system = "You answer in one word. ".repeat(40);

    let r = post(
        server.port,
        "/v1/responses",
        &json!({"model": MODEL, "instructions": system, "input": "hi", "max_output_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-inference-pod"), Some("pod-a"));
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 200);

    // The same system prompt again, through the Messages API: its blocks are cached.
    let r = post(
        server.port,
        "/v1/messages",
        &json!({"model": MODEL, "system": system, "max_tokens": 2,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(v["usage"]["output_tokens"], 2);
    assert!(
        v["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "the shared system prompt should hit the prefix cache: {v}"
    );

    let r = post(
        server.port,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": ["one", "two", "one"]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["embedding"], data[2]["embedding"]);
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() >= 1);

    // Shapes the simulator does not serve are refused, not half-answered.
    for (path, body) in [
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "x", "stream": true}),
        ),
        ("/v1/messages", json!({"model": MODEL, "messages": []})),
        ("/v1/embeddings", json!({"model": MODEL, "input": []})),
        ("/v1/embeddings", json!({"input": "x"})),
    ] {
        let r = post(server.port, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string());
    }
}

/// P/D through HTTP as vLLM's KV connectors speak it: a prefill request
/// (`do_remote_decode`) is answered with the parameters a decode server
/// pulls the KV with; a decode request carrying them (`do_remote_prefill`)
/// is served; a role that cannot play the part refuses with 400.
#[test]
fn kv_transfer_params_exchange_and_roles() {
    let prefill = start(&["--kv-role", "kv_producer"]);
    let decode = start(&["--kv-role", "kv_consumer"]);
    let prompt = "p".repeat(400);
    let produce = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": false,
        "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null,
            "remote_host": null, "remote_port": null}});
    let r = post(prefill.port, "/v1/completions", &produce);
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    let params = &v["kv_transfer_params"];
    assert_eq!(params["do_remote_prefill"], json!(true));
    assert_eq!(params["remote_engine_id"], json!("pod-a"));
    // 100 prompt tokens in 16-token blocks.
    assert_eq!(params["remote_block_ids"].as_array().unwrap().len(), 7);

    let consume = json!({"model": MODEL, "prompt": prompt, "max_tokens": 3,
        "kv_transfer_params": params});
    let r = post(decode.port, "/v1/completions", &consume);
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], json!(3));
    assert!(v.get("kv_transfer_params").is_none());

    let r = post(decode.port, "/v1/completions", &produce);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("kv_consumer"), "{}", r.body);
    let r = post(prefill.port, "/v1/completions", &consume);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("kv_producer"), "{}", r.body);
}
