//! A tiny HTTP/1.1 client for tests: one connection per request, chunks
//! recorded with their arrival time so streaming can be checked.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

/// A response with its body chunks as they arrived.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, in order, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Bytes,
    /// (time since the request was sent, chunk).
    pub chunks: Vec<(Duration, Bytes)>,
    /// Trailers, if the response had any.
    pub trailers: Vec<(String, String)>,
    /// Time to the response headers.
    pub ttfb: Duration,
    /// Time to the end of the body.
    pub total: Duration,
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.text()))
    }
}

/// Sends one request to 127.0.0.1:`port`.
pub async fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> std::io::Result<Response> {
    send_at("127.0.0.1", port, method, path, headers, body).await
}

/// The sum of the samples of metric `name` on the Prometheus page at
/// 127.0.0.1:`metrics_port` whose labels contain every one of `labels`
/// (`key="value"`); 0 when none does.
pub async fn metric_sum(metrics_port: u16, name: &str, labels: &[&str]) -> f64 {
    let page = send(metrics_port, "GET", "/metrics", &[], "")
        .await
        .expect("metrics page")
        .text();
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends one request to `host:port` (another loopback address, e.g.).
pub async fn send_at(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> std::io::Result<Response> {
    let start = Instant::now();
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    // A request body written apart from its headers must not wait for the
    // server's delayed ACK (Nagle's algorithm).
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("{host}:{port}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(body.into()))
        .map_err(std::io::Error::other)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(std::io::Error::other)?;
    let ttfb = start.elapsed();
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let mut body = resp.into_body();
    let mut chunks = Vec::new();
    let mut trailers = Vec::new();
    let mut all = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(std::io::Error::other)?;
        match frame.into_data() {
            Ok(data) => {
                all.extend_from_slice(&data);
                chunks.push((start.elapsed(), data));
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers.extend(t.iter().map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    }));
                }
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body: Bytes::from(all),
        chunks,
        trailers,
        ttfb,
        total: start.elapsed(),
    })
}

/// POSTs a JSON body to 127.0.0.1:`port`.
pub async fn post_json(
    port: u16,
    path: &str,
    body: &serde_json::Value,
) -> std::io::Result<Response> {
    post_json_at("127.0.0.1", port, path, body).await
}

/// POSTs a JSON body to `host:port`.
pub async fn post_json_at(
    host: &str,
    port: u16,
    path: &str,
    body: &serde_json::Value,
) -> std::io::Result<Response> {
    send_at(
        host,
        port,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

/// POSTs a short completion ("hello", 2 tokens) to `/v1/completions`, with
/// one more header if given.
pub async fn post_hello(port: u16, header: Option<(&str, &str)>) -> std::io::Result<Response> {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": "hello",
        "max_tokens": 2,
    });
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(header);
    send(port, "POST", "/v1/completions", &headers, body.to_string()).await
}

/// POSTs a 2-token chat for `model` naming `objective` in
/// `x-gateway-inference-objective`.
pub async fn chat_for_objective(
    port: u16,
    model: &str,
    objective: &str,
) -> std::io::Result<Response> {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    });
    send(
        port,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-inference-objective", objective),
        ],
        body.to_string(),
    )
    .await
}

/// A blocking GET for admin endpoints: (status, body).
pub fn get_blocking(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    blocking_get(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
        Duration::from_secs(5),
    )
}

/// A blocking GET over HTTP/1.0, so the answer is never chunked: (status,
/// body). Waits up to `timeout` for the answer.
pub fn get_unchunked(port: u16, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    blocking_get(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"),
        timeout,
    )
}

/// Sends `request` to 127.0.0.1:`port` and reads the answer to its end.
fn blocking_get(port: u16, request: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(request.as_bytes())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response {buf:?}")))?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
