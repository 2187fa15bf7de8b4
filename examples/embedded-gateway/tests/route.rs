//! The embedded gateway against simulator processes: requests are routed
//! through it, the endpoints' load signals move while they are served (the
//! scraped ones, and the in-flight counts each Dispatch holds), and a client
//! that goes away releases what its request held.

#![expect(clippy::unwrap_used, reason = "test code")]

use embedded_gateway::{Gateway, GatewayOptions, SERVED_BY_HEADER};
use epp_test_support::{
    http::{post_json, send},
    process::{Sim, scratch_dir, start_sims},
    wait::eventually,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Simulators whose answers take a while (40 ms per output token), so
/// requests overlap.
fn slow_sims(tag: &str, n: usize) -> Vec<Sim> {
    start_sims(&scratch_dir(tag), n, &["--itl-ms", "40"])
}

async fn gateway(sims: &[Sim]) -> Gateway {
    let gateway = Gateway::start(GatewayOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        endpoints: sims.iter().map(Sim::addr).collect(),
        ..GatewayOptions::default()
    })
    .await
    .unwrap();
    eventually("every endpoint scraped once", || async {
        gateway
            .endpoints()
            .endpoints()
            .iter()
            .all(|e| e.metrics().updated_at.is_some())
    })
    .await;
    gateway
}

fn in_flight(gateway: &Gateway) -> Vec<u32> {
    gateway
        .endpoints()
        .endpoints()
        .iter()
        .map(|e| e.inflight().requests())
        .collect()
}

fn completion(max_tokens: u32, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": "Tell me a story about a lighthouse keeper.",
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_routed_and_the_load_signals_move() {
    let sims = slow_sims("embedded-route", 2);
    let gateway = gateway(&sims).await;
    let port = gateway.local_addr().port();
    assert_eq!(in_flight(&gateway), [0, 0]);

    let requests: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(
                async move { post_json(port, "/v1/completions", &completion(25, false)).await },
            )
        })
        .collect();
    // While they are served, each endpoint counts what the gateway sent it
    // (a burst between two scrapes is spread, not herded onto one), and the
    // scraped running counts follow.
    eventually("both endpoints carry in-flight requests", || async {
        in_flight(&gateway).iter().all(|&n| n > 0)
    })
    .await;
    eventually("the scrapes see requests running", || async {
        gateway
            .endpoints()
            .endpoints()
            .iter()
            .any(|e| e.metrics().running > 0)
    })
    .await;

    let mut served = std::collections::BTreeMap::<String, usize>::new();
    for r in requests {
        let r = r.await.unwrap().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json()["choices"][0]["text"].is_string());
        *served
            .entry(r.header(SERVED_BY_HEADER).unwrap().to_owned())
            .or_default() += 1;
    }
    let mut want: Vec<String> = sims.iter().map(Sim::addr).collect();
    want.sort();
    assert_eq!(
        served.keys().cloned().collect::<Vec<_>>(),
        want,
        "{served:?}"
    );
    assert_eq!(served.values().sum::<usize>(), 8);
    assert_eq!(
        in_flight(&gateway),
        [0, 0],
        "every completed request released"
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_releases_its_request() {
    let sims = slow_sims("embedded-cancel", 1);
    let gateway = gateway(&sims).await;
    let body = completion(200, true).to_string();
    let mut conn = tokio::net::TcpStream::connect(gateway.local_addr())
        .await
        .unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    // The first streamed bytes arrive: the request is being served…
    let mut first = [0u8; 64];
    let n = conn.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    assert_eq!(in_flight(&gateway), [1]);
    // …and ~8 s of tokens are left when the client leaves.
    drop(conn);
    eventually("the dropped request is released", || async {
        in_flight(&gateway) == [0]
    })
    .await;
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_pickers_errors() {
    let sims = slow_sims("embedded-errors", 1);
    let gateway = gateway(&sims).await;
    let port = gateway.local_addr().port();
    let array = send(
        port,
        "POST",
        "/v1/completions",
        &[("content-type", "application/json")],
        r#"["meta-llama/Llama-3.1-8B-Instruct"]"#,
    )
    .await
    .unwrap();
    assert_eq!(array.status, 400, "{}", array.text());
    assert!(
        array.json()["error"]["message"].is_string(),
        "{}",
        array.text()
    );
    let no_model = send(port, "POST", "/v1/completions", &[], r#"{"prompt":"x"}"#)
        .await
        .unwrap();
    assert_eq!(no_model.status, 400, "{}", no_model.text());
    // A body-less request is routed on load alone.
    let models = send(port, "GET", "/v1/models", &[], "").await.unwrap();
    assert_eq!(models.status, 200, "{}", models.text());
    assert_eq!(in_flight(&gateway), [0]);
    gateway.stop().await;
}
