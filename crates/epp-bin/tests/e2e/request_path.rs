//! The request path as a gateway sees it: fallbacks in `envoy.lb` metadata
//! in preference order, the subset hint matched by ip AND port (an empty
//! match is 503), and the body-size limit (413), through a real Envoy.

use epp_test_support::{
    http,
    process::{
        BodyMode, Envoy, Stack, scratch_dir, sim_admin, start_envoy_with, start_epp, start_sims,
        workspace_root,
    },
    wait::poll,
};

const CONFIG: &str = "plugins:\n- type: queue-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 3}\n";

/// The example Envoy config for `mode` in front of epp, reporting the
/// `envoy.lb` metadata epp set in a response header and, with `subset`,
/// setting the subset hint (`envoy.lb.subset_hint`) on every request, as a
/// gateway would.
fn envoy(dir: &std::path::Path, mode: BodyMode, epp_port: u16, subset: Option<&[String]>) -> Envoy {
    let file = match mode {
        BodyMode::Buffered => "envoy-buffered.yaml",
        BodyMode::Streamed => "envoy-streamed.yaml",
    };
    let mut config = std::fs::read_to_string(workspace_root().join("examples/envoy").join(file))
        .unwrap()
        .replace("port_value: 9901", "port_value: 0")
        .replace("port_value: 10000", "port_value: 0")
        .replace("port_value: 9002", &format!("port_value: {epp_port}"));
    let route_end = "                  idle_timeout: 86400s\n";
    assert!(config.contains(route_end));
    config = config.replace(
        route_end,
        &format!("{route_end}                response_headers_to_add:\n                - header: {{key: x-lb-metadata, value: \"%DYNAMIC_METADATA(envoy.lb:x-gateway-destination-endpoint)%\"}}\n"),
    );
    assert!(
        config.contains("untyped: [envoy.lb]"),
        "the example accepts envoy.lb metadata"
    );
    if let Some(subset) = subset {
        let ext_proc = "          - name: envoy.filters.http.ext_proc\n";
        let list = subset
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let set_metadata = format!(
            "          - name: envoy.filters.http.set_metadata\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config\n              metadata:\n              - metadata_namespace: envoy.lb.subset_hint\n                value:\n                  x-gateway-destination-endpoint-subset: [{list}]\n"
        );
        config = config.replace(ext_proc, &format!("{set_metadata}{ext_proc}"));
    }
    start_envoy_with(
        dir,
        &format!("{}-{file}", subset.map_or(0, <[String]>::len)),
        &config,
    )
}

async fn send(port: u16, prompt: &str) -> http::Response {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": prompt,
        "max_tokens": 2,
    });
    http::post_json(port, "/v1/completions", &body)
        .await
        .unwrap()
}

async fn fallbacks_and_subsets(mode: BodyMode) {
    let dir = scratch_dir("request-path");
    let sims = start_sims(&dir, 3, &[]);
    let addrs: Vec<String> = sims
        .iter()
        .map(epp_test_support::process::Sim::addr)
        .collect();
    let epp = start_epp(
        &dir,
        &["--endpoints", &addrs.join(","), "--config-text", CONFIG],
    );
    // Distinct loads give a strict preference order: sim-0, sim-1, sim-2.
    for (sim, waiting) in sims.iter().zip([0, 10, 20]) {
        sim_admin(sim.port, serde_json::json!({"extra_waiting": waiting})).await;
    }
    let plain = envoy(&dir, mode, epp.grpc_port, None);
    let want = addrs.join(",");
    poll("fallbacks in preference order", 100, || async {
        let r = send(plain.port, "hi").await;
        assert_eq!(r.status, 200, "{}", r.text());
        (r.header("x-lb-metadata") == Some(want.as_str())).then_some(())
    })
    .await;

    // The hint allows sim-1, and sim-0's ip with a port nobody listens on:
    // only sim-1 may serve, although sim-0 is the better endpoint.
    let hint = [addrs[1].clone(), "127.0.0.1:1".to_owned()];
    let hinted = envoy(&dir, mode, epp.grpc_port, Some(&hint));
    for _ in 0..5 {
        let r = send(hinted.port, "hi").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-inference-pod"), Some("sim-1"));
        assert_eq!(r.header("x-lb-metadata"), Some(addrs[1].as_str()));
    }

    // Right ip, wrong port: no endpoint matches, the subset is empty → 503.
    let wrong_port = ["127.0.0.1:1".to_owned()];
    let empty = envoy(&dir, mode, epp.grpc_port, Some(&wrong_port));
    let r = send(empty.port, "hi").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallbacks_and_subsets_buffered() {
    fallbacks_and_subsets(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallbacks_and_subsets_streamed() {
    fallbacks_and_subsets(BodyMode::Streamed).await;
}

async fn oversized_body_gets_413(mode: BodyMode) {
    let stack = Stack::start(
        "body-limit",
        1,
        &[],
        &["--max-request-body-bytes", "4096"],
        mode,
    );
    let r = send(stack.envoy.port, &"x".repeat(16 * 1024)).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "BadRequest", "{}", r.text());
    let r = send(stack.envoy.port, "small").await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_gets_413_buffered() {
    oversized_body_gets_413(BodyMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_gets_413_streamed() {
    oversized_body_gets_413(BodyMode::Streamed).await;
}
