//! Response trailers from the model server reach the client through Envoy
//! and epp (trailers SEND in FULL_DUPLEX_STREAMED mode), plain and streamed.

use epp_test_support::{
    http,
    process::{BodyMode, scratch_dir, start_envoy_with, start_epp, start_sims, workspace_root},
};

async fn send(port: u16, stream: bool) -> http::Response {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "trail me"}],
        "max_tokens": 3,
        "stream": stream,
    })
    .to_string();
    let headers = [
        ("content-type", "application/json"),
        ("te", "trailers"),
        ("x-sim-trailer", "end-42"),
    ];
    let r = http::send(port, "POST", "/v1/chat/completions", &headers, body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

async fn trailers_pass(mode: BodyMode) {
    let dir = scratch_dir("trailers");
    let sims = start_sims(&dir, 1, &[]);
    // The simulator sends the trailer (checked without a gateway).
    let direct = send(sims[0].port, false).await;
    assert_eq!(
        direct.trailers,
        vec![("x-sim-trailer".to_owned(), "end-42".to_owned())]
    );

    let epp = start_epp(&dir, &["--endpoints", &sims[0].addr()]);
    let file = match mode {
        BodyMode::Buffered => "envoy-buffered.yaml",
        BodyMode::Streamed => "envoy-streamed.yaml",
    };
    // HTTP/1.1 trailers must be enabled on both sides of Envoy.
    let h1_trailers = "http_protocol_options: {enable_trailers: true}";
    let config = std::fs::read_to_string(workspace_root().join("examples/envoy").join(file))
        .unwrap()
        .replace("port_value: 9901", "port_value: 0")
        .replace("port_value: 10000", "port_value: 0")
        .replace("port_value: 9002", &format!("port_value: {}", epp.grpc_port))
        .replace(
            "          codec_type: AUTO\n",
            &format!("          codec_type: AUTO\n          {h1_trailers}\n"),
        )
        .replace(
            "    original_dst_lb_config:\n",
            &format!("    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config:\n          {h1_trailers}\n    original_dst_lb_config:\n"),
        );
    assert_eq!(config.matches("enable_trailers").count(), 2);
    let envoy = start_envoy_with(&dir, file, &config);
    for stream in [false, true] {
        let r = send(envoy.port, stream).await;
        assert_eq!(
            r.trailers,
            vec![("x-sim-trailer".to_owned(), "end-42".to_owned())],
            "stream={stream}: {}",
            r.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_pass_buffered() {
    trailers_pass(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_pass_streamed() {
    trailers_pass(BodyMode::Streamed).await;
}
