//! Tracing through the real Envoy to a real OpenTelemetry Collector (built
//! from its Go modules by `scripts/otelcol.sh`) that writes what it receives
//! to a file: the caller's trace continued, the spans of the decision and of
//! every plugin with the decision's attributes, never the prompt; the sampler
//! obeyed; and a collector that is down costs no request.

use std::process::Command;

use epp_test_support::{
    http,
    otelcol::{Collector, ExportedSpan, start_collector},
    process::{
        BodyMode, Epp, Sim, epp_command, free_port_on, recorded_header, scratch_dir, sim_requests,
        spawn_epp, start_envoy, start_sims,
    },
    wait::poll,
};

/// A config whose decisions are easy to follow: shortest queue, then a
/// filter that keeps everything, so a filter span exists too.
const CONFIG: &str = "\
plugins:
- type: label-selector-filter
  parameters: {matchLabels: {}}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: label-selector-filter}
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
";

/// epp with `--tracing` and `env`, over `sims`.
fn epp(dir: &std::path::Path, name: &str, sims: &[Sim], env: &[(&str, &str)]) -> Epp {
    let addrs: Vec<String> = sims.iter().map(Sim::addr).collect();
    let mut cmd: Command = epp_command();
    cmd.args([
        "--secure-serving=false",
        "--tracing",
        "--drain-timeout",
        "0s",
        "--endpoints",
        &addrs.join(","),
        "--config-text",
        CONFIG,
    ])
    .env("RUST_LOG", "info")
    // Batches leave at once, so the test does not wait for the default 5 s.
    .env("OTEL_BSP_SCHEDULE_DELAY", "20");
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_epp(name, cmd, dir.join(format!("{name}.log"))).0
}

async fn send(port: u16, prompt: &str, traceparent: Option<&str>) -> http::Response {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": prompt,
        "max_tokens": 2,
    });
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(traceparent.map(|t| ("traceparent", t)));
    http::send(port, "POST", "/v1/completions", &headers, body.to_string())
        .await
        .unwrap()
}

/// The spans of `trace_id`, once its root (`gateway.request`, ended last) is in.
async fn trace_of(collector: &Collector, trace_id: &str) -> Vec<ExportedSpan> {
    poll(&format!("the spans of trace {trace_id}"), 400, || async {
        let spans: Vec<ExportedSpan> = collector
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect();
        spans
            .iter()
            .any(|s| s.name == "gateway.request")
            .then_some(spans)
    })
    .await
}

/// A directory of its own for each Envoy of a test (each writes its admin
/// address to a file named after its config).
fn stage(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_collector_continuing_the_callers_trace() {
    let dir = scratch_dir("tracing");
    let collector = start_collector(&dir);
    let sims = start_sims(&dir, 2, &["--record-requests", "100"]);
    // A ratio of 0: only a caller's sampled traceparent gets a request recorded.
    let endpoint = collector.grpc_endpoint();
    let epp = epp(
        &dir,
        "epp",
        &sims,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SERVICE_NAME", "epp-e2e"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.pod.name=epp-e2e-0,k8s.namespace.name=test",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);

    // Not sampled: a caller who did not sample, and a new trace at ratio 0.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    assert_eq!(
        send(envoy.port, "first secret prompt", Some(unsampled))
            .await
            .status,
        200
    );
    assert_eq!(
        send(envoy.port, "second secret prompt", None).await.status,
        200
    );
    // Sampled by the caller: recorded.
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let r = send(envoy.port, "third secret prompt", Some(&traceparent)).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let spans = trace_of(&collector, TRACE).await;
    // The requests not sampled went through the same queue before it: none
    // of theirs arrived.
    let all = collector.spans();
    assert!(
        all.iter().all(|s| s.trace_id == TRACE),
        "only the sampled request is exported: {:?}",
        all.iter()
            .map(|s| (&s.trace_id, &s.name))
            .collect::<Vec<_>>()
    );

    let root = spans.iter().find(|s| s.name == "gateway.request").unwrap();
    assert_eq!(
        root.parent_span_id, CALLER,
        "the caller's span is the parent"
    );
    assert_eq!(root.kind, 2, "a server span");
    assert_eq!(root.resource["service.name"]["stringValue"], "epp-e2e");
    assert_eq!(root.resource["k8s.pod.name"]["stringValue"], "epp-e2e-0");
    assert_eq!(
        root.attributes["http.response.status_code"]["intValue"],
        "200"
    );

    // The model server got the trace, continued under epp's span.
    let served: Vec<(usize, serde_json::Value)> = sims
        .iter()
        .enumerate()
        .flat_map(|(i, s)| sim_requests(s.port).into_iter().map(move |r| (i, r)))
        .filter(|(_, r)| recorded_header(r, "traceparent").is_some_and(|t| t.contains(TRACE)))
        .collect();
    assert_eq!(served.len(), 1, "one request carried the trace");
    let (sim, request) = &served[0];
    assert_eq!(
        recorded_header(request, "traceparent"),
        Some(format!("00-{TRACE}-{}-01", root.span_id).as_str())
    );

    // The decision's span and its attributes: the endpoint that served.
    let picked = sims[*sim].addr();
    let decision = spans
        .iter()
        .find(|s| s.name == "gateway.request_orchestration")
        .unwrap();
    assert_eq!(decision.parent_span_id, root.span_id);
    assert_eq!(
        decision.str_attr("llm_d.epp.picked_endpoint"),
        Some(picked.as_str())
    );
    assert_eq!(
        decision.str_attr("target_model"),
        Some("meta-llama/Llama-3.1-8B-Instruct")
    );
    assert_eq!(decision.str_attr("llm_d.epp.outcome"), Some("routed"));
    assert_eq!(
        root.str_attr("llm_d.epp.picked_endpoint"),
        Some(picked.as_str())
    );
    let scheduling = spans
        .iter()
        .find(|s| s.name == "llm_d.epp.scheduling")
        .unwrap();
    assert_eq!(scheduling.parent_span_id, decision.span_id);
    assert_eq!(
        scheduling.attributes["llm_d.epp.scheduling.candidate_endpoints"]["intValue"],
        "2"
    );

    // A span per plugin, each under its stage.
    let by_name = |name: &str| {
        spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
            panic!(
                "no {name} span in {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })
    };
    let profile = by_name("run_scheduler_profile");
    assert_eq!(profile.parent_span_id, scheduling.span_id);
    assert_eq!(
        profile.str_attr("llm_d.epp.scheduling.profile.name"),
        Some("default")
    );
    let handler = by_name("llm_d.epp.profile_picker.single-profile-handler");
    assert_eq!(handler.parent_span_id, scheduling.span_id);
    let filters = by_name("filter_endpoints");
    assert_eq!(filters.parent_span_id, profile.span_id);
    assert_eq!(
        by_name("llm_d.epp.filter.label-selector-filter").parent_span_id,
        filters.span_id
    );
    let scoring = by_name("llm_d.epp.scoring");
    assert_eq!(scoring.parent_span_id, profile.span_id);
    let scorer = by_name("llm_d.epp.scorer.queue-scorer");
    assert_eq!(scorer.parent_span_id, scoring.span_id);
    assert_eq!(
        scorer.str_attr("llm_d.epp.scorer.type"),
        Some("queue-scorer")
    );
    let picker = by_name("pick_endpoints");
    assert_eq!(picker.parent_span_id, profile.span_id);
    assert_eq!(
        picker.str_attr("llm_d.epp.plugin.type"),
        Some("max-score-picker")
    );
    assert_eq!(
        picker.attributes["llm_d.epp.picker.top_endpoints"]["arrayValue"]["values"][0]["stringValue"],
        picked.as_str()
    );

    // Counted on the metrics port (once epp has read the collector's answer).
    poll("the exported spans counted", 400, || async {
        let (_, metrics) = http::get_blocking(epp.metrics_port, "/metrics").unwrap();
        metrics
            .lines()
            .find(|l| l.starts_with("epp_trace_spans_exported_total "))
            .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .filter(|n| *n == spans.len())
    })
    .await;

    // Never the prompt, of any request.
    let raw = collector.raw();
    assert!(
        !raw.contains("secret prompt"),
        "a prompt reached the collector"
    );
    drop(envoy);
    drop(epp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_off_exports_nothing_and_a_dead_collector_fails_no_request() {
    let dir = scratch_dir("tracing-off");
    let collector = start_collector(&dir);
    let sims = start_sims(&dir, 1, &[]);
    let endpoint = collector.grpc_endpoint();
    let sampled = "00-11111111111111111111111111111111-2222222222222222-01";

    // always_off: not even a caller's sampled trace is recorded.
    let mut off = epp(
        &dir,
        "epp-off",
        &sims,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ],
    );
    let envoy = start_envoy(&stage(&dir, "off"), BodyMode::Streamed, off.grpc_port);
    for _ in 0..5 {
        assert_eq!(send(envoy.port, "off", Some(sampled)).await.status, 200);
    }
    drop(envoy);
    // SIGTERM sends whatever is queued before epp exits.
    assert_eq!(
        off.proc.terminate(std::time::Duration::from_secs(30)),
        Some(0)
    );

    // A collector nobody listens on: every request still succeeds, and the
    // spans it could not send are counted.
    let dead = format!("http://127.0.0.1:{}", free_port_on("127.0.0.1"));
    let down = epp(
        &dir,
        "epp-down",
        &sims,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &dead),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ],
    );
    let envoy = start_envoy(&stage(&dir, "down"), BodyMode::Streamed, down.grpc_port);
    for i in 0..20 {
        let r = send(envoy.port, &format!("down {i}"), None).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let dropped = poll("spans counted as dropped", 400, || async {
        let (_, text) = http::get_blocking(down.metrics_port, "/metrics").unwrap();
        text.lines()
            .find(|l| l.starts_with("epp_trace_spans_dropped_total{reason=\"export_failed\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .filter(|n| *n > 0.0)
    })
    .await;
    assert!(dropped > 0.0);
    drop(envoy);
    drop(down);

    // Then a request that is recorded, to the live collector: once its spans
    // are in, anything always_off had sent (before it exited) would be too.
    let on = epp(
        &dir,
        "epp-on",
        &sims,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ],
    );
    let envoy = start_envoy(&stage(&dir, "on"), BodyMode::Streamed, on.grpc_port);
    let marker = format!("00-{TRACE}-{CALLER}-01");
    assert_eq!(send(envoy.port, "on", Some(&marker)).await.status, 200);
    trace_of(&collector, TRACE).await;
    let leaked: Vec<String> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id != TRACE)
        .map(|s| format!("{} {}", s.trace_id, s.name))
        .collect();
    assert!(leaked.is_empty(), "always_off exported: {leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_reaches_the_collector_too() {
    let dir = scratch_dir("tracing-http");
    let collector = start_collector(&dir);
    let sims = start_sims(&dir, 1, &[]);
    // The base endpoint: epp appends /v1/traces.
    let endpoint = format!("http://127.0.0.1:{}", collector.http_port);
    let epp = epp(
        &dir,
        "epp",
        &sims,
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_off"),
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    assert_eq!(send(envoy.port, "hi", Some(&traceparent)).await.status, 200);
    let spans = trace_of(&collector, TRACE).await;
    let root = spans.iter().find(|s| s.name == "gateway.request").unwrap();
    assert_eq!(root.parent_span_id, CALLER);
    assert_eq!(
        root.resource["service.name"]["stringValue"],
        "gateway-api-inference-extension/epp"
    );
    assert!(spans.iter().any(|s| s.name == "pick_endpoints"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_spans_are_sent_on_sigterm() {
    let dir = scratch_dir("tracing-flush");
    let collector = start_collector(&dir);
    let sims = start_sims(&dir, 1, &[]);
    let endpoint = collector.grpc_endpoint();
    // Batches would wait ten minutes: only the shutdown sends this one.
    let mut epp = epp(
        &dir,
        "epp",
        &sims,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let envoy = start_envoy(&dir, BodyMode::Streamed, epp.grpc_port);
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    assert_eq!(
        send(envoy.port, "bye", Some(&traceparent)).await.status,
        200
    );
    drop(envoy);
    assert!(collector.spans().is_empty(), "nothing sent before the stop");
    assert_eq!(
        epp.proc.terminate(std::time::Duration::from_secs(30)),
        Some(0)
    );
    let spans = trace_of(&collector, TRACE).await;
    assert!(spans.iter().any(|s| s.name == "llm_d.epp.scheduling"));
}

#[test]
fn a_bad_tracing_variable_stops_epp_at_start_naming_it() {
    for (var, value) in [
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
        ("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name"),
    ] {
        let out = epp_command()
            .args([
                "--secure-serving=false",
                "--tracing",
                "--endpoints",
                "127.0.0.1:1",
            ])
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}={value}: {stderr}");
        assert!(
            stderr.contains("invalid tracing configuration") && stderr.contains(var),
            "{var}={value}: {stderr}"
        );
    }
    // The same variables do nothing without --tracing (the chart's --tracing=false).
    let mut cmd = epp_command();
    cmd.args([
        "--secure-serving=false",
        "--tracing=false",
        "--drain-timeout",
        "0s",
        "--endpoints",
        "127.0.0.1:1",
    ])
    .env("OTEL_TRACES_SAMPLER", "sometimes");
    let (mut epp, _) = spawn_epp("epp", cmd, scratch_dir("tracing-flag").join("epp.log"));
    assert_eq!(
        epp.proc.terminate(std::time::Duration::from_secs(30)),
        Some(0)
    );
}
