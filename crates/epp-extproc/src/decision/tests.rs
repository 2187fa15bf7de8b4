//! The decision as a plain value: no gRPC, no protobuf.

use std::sync::Arc;

use arc_swap::ArcSwap;
use epp_core::{
    Endpoint, EndpointMetrics, EndpointSnapshot, EndpointSource, config::EndpointPickerConfig,
};

use super::*;

/// Shortest queue wins, counting what was dispatched since the scrape.
const QUEUE_ONLY: &str = "\
plugins:
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
";

struct Fixture {
    decider: Decider,
    endpoints: Vec<Arc<Endpoint>>,
}

/// Endpoints 10.0.0.1:8000, 10.0.0.2:8000, … with these scraped queues.
fn fixture(queues: &[u32], options: ExtProcOptions) -> Fixture {
    let endpoints: Vec<Arc<Endpoint>> = queues
        .iter()
        .enumerate()
        .map(|(i, &waiting)| {
            let e = Arc::new(Endpoint::new(
                i as u32,
                format!("10.0.0.{}:8000", i + 1).parse().unwrap(),
            ));
            e.set_metrics(EndpointMetrics {
                waiting,
                ..EndpointMetrics::fresh()
            });
            e
        })
        .collect();
    let source: Arc<dyn EndpointSource> = Arc::new(ArcSwap::from_pointee(EndpointSnapshot::new(
        endpoints.clone(),
    )));
    let scheduler = EndpointPickerConfig::parse(QUEUE_ONLY, "test.yaml")
        .unwrap()
        .build(&epp_plugins::builtin_registry())
        .unwrap()
        .scheduler;
    Fixture {
        decider: Decider::new(Arc::new(scheduler), source, options),
        endpoints,
    }
}

fn parts(path: &str, headers: &[(&str, &str)]) -> RequestParts {
    let mut all = vec![(":path".to_owned(), path.to_owned())];
    all.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    RequestParts {
        headers: all,
        subset: None,
    }
}

impl Fixture {
    fn decide(&self, parts: &mut RequestParts, body: Option<&[u8]>) -> Decision {
        let options = self.decider.options.load_full();
        self.decider.decide(&options, parts, body, None)
    }

    fn route(&self, parts: &mut RequestParts, body: Option<&[u8]>) -> Route {
        match self.decide(parts, body) {
            Decision::Route(r) => *r,
            Decision::Reject(e) => panic!("refused: {e}"),
        }
    }

    fn inflight(&self) -> Vec<u32> {
        self.endpoints
            .iter()
            .map(|e| e.inflight().requests())
            .collect()
    }
}

const BODY: &[u8] = br#"{"model":"llama","prompt":"Hello there","max_tokens":4}"#;

#[test]
fn a_route_names_the_target_and_leaves_the_body_alone() {
    let f = fixture(&[3, 0, 5], ExtProcOptions::default());
    let route = f.route(
        &mut parts("/v1/completions", &[("x-request-id", "r-1")]),
        Some(BODY),
    );
    assert_eq!(
        route.set_headers().collect::<Vec<_>>(),
        [(DESTINATION_HEADER, "10.0.0.2:8000")],
        "the client's request id is kept, nothing else is set"
    );
    assert_eq!(route.targets, "10.0.0.2:8000");
    assert_eq!(route.body, BodyEdit::Unchanged);
    assert!(route.remove_headers.is_empty());
    assert_eq!(route.restore_model, None);
    assert_eq!(route.dispatch.request().request_id, "r-1");
    assert_eq!(route.dispatch.request().prompt, "Hello there");
}

#[test]
fn the_dispatch_counts_the_request_until_the_route_is_dropped() {
    let f = fixture(&[0, 0], ExtProcOptions::default());
    let first = f.route(&mut parts("/v1/completions", &[]), Some(BODY));
    let picked = f.inflight();
    assert_eq!(picked.iter().sum::<u32>(), 1, "{picked:?}");
    // The first pick is in flight: the next equal request goes elsewhere.
    let second = f.route(&mut parts("/v1/completions", &[]), Some(BODY));
    assert_eq!(f.inflight(), [1, 1]);
    assert_ne!(first.targets, second.targets);
    drop(first);
    assert_eq!(f.inflight().iter().sum::<u32>(), 1);
    drop(second);
    assert_eq!(f.inflight(), [0, 0]);
}

#[test]
fn a_rewrite_splices_the_model_and_says_how_to_restore_it() {
    let f = fixture(&[0], ExtProcOptions::default());
    let route = f.route(
        &mut parts(
            "/v1/completions",
            &[
                (MODEL_REWRITE_HEADER, "llama-lora"),
                (OBJECTIVE_HEADER, "chat"),
            ],
        ),
        Some(BODY),
    );
    let want = br#"{"model":"llama-lora","prompt":"Hello there","max_tokens":4}"#;
    assert_eq!(route.body, BodyEdit::Replace(want.to_vec()));
    assert!(
        route
            .extra_headers
            .contains(&("content-length", want.len().to_string()))
    );
    assert_eq!(
        route.remove_headers,
        [MODEL_REWRITE_HEADER, OBJECTIVE_HEADER]
    );
    assert_eq!(route.restore_model.as_deref(), Some("llama"));
    assert_eq!(route.series.key.target, "llama-lora");
}

#[test]
fn a_request_without_an_id_gets_one_forwarded() {
    let f = fixture(&[0], ExtProcOptions::default());
    let route = f.route(&mut parts("/v1/completions", &[]), Some(BODY));
    let id = &route.dispatch.request().request_id;
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert!(
        route
            .set_headers()
            .any(|h| h == ("x-request-id", id.as_str()))
    );
}

#[test]
fn objectives_give_priority_and_the_fairness_flow_defaults() {
    let options = ExtProcOptions {
        objectives: [("batch".to_owned(), -1)].into_iter().collect(),
        ..ExtProcOptions::default()
    };
    let f = fixture(&[0], options);
    let route = f.route(
        &mut parts("/v1/completions", &[(OBJECTIVE_HEADER, "batch")]),
        Some(BODY),
    );
    let request = route.dispatch.request();
    assert_eq!(request.priority, -1);
    assert_eq!(request.objective.as_deref(), Some("batch"));
    assert_eq!(request.fairness_id, "default-flow");
}

#[test]
fn llm_d_header_names_are_read_first_and_every_name_is_removed() {
    let options = ExtProcOptions {
        objectives: [("batch".to_owned(), -1), ("chat".to_owned(), 5)]
            .into_iter()
            .collect(),
        ..ExtProcOptions::default()
    };
    let f = fixture(&[0], options);
    // llm-d's names alone.
    let route = f.route(
        &mut parts(
            "/v1/completions",
            &[
                (LLM_D_MODEL_REWRITE_HEADER, "llama-lora"),
                (LLM_D_OBJECTIVE_HEADER, "chat"),
                (LLM_D_FAIRNESS_HEADER, "tenant-a"),
            ],
        ),
        Some(BODY),
    );
    let request = route.dispatch.request();
    assert_eq!(
        (request.target_model.as_str(), request.priority),
        ("llama-lora", 5)
    );
    assert_eq!(request.fairness_id, "tenant-a");
    assert_eq!(
        route.remove_headers,
        [
            LLM_D_MODEL_REWRITE_HEADER,
            LLM_D_OBJECTIVE_HEADER,
            LLM_D_FAIRNESS_HEADER
        ]
    );
    // Both names: llm-d's wins (as llm-d reads them), both are removed.
    let route = f.route(
        &mut parts(
            "/v1/completions",
            &[
                (OBJECTIVE_HEADER, "batch"),
                (LLM_D_OBJECTIVE_HEADER, "chat"),
                (FAIRNESS_HEADER, "old"),
                (LLM_D_FAIRNESS_HEADER, "new"),
            ],
        ),
        Some(BODY),
    );
    let request = route.dispatch.request();
    assert_eq!((request.priority, request.fairness_id.as_str()), (5, "new"));
    assert_eq!(
        route.remove_headers,
        [
            LLM_D_OBJECTIVE_HEADER,
            OBJECTIVE_HEADER,
            LLM_D_FAIRNESS_HEADER,
            FAIRNESS_HEADER
        ]
    );
}

#[test]
fn a_headers_only_request_is_routed_without_a_body() {
    let f = fixture(&[1, 0], ExtProcOptions::default());
    let route = f.route(&mut parts("/v1/models", &[]), None);
    assert_eq!(route.targets, "10.0.0.2:8000");
    assert_eq!(route.body, BodyEdit::Unchanged);
    assert_eq!(route.dispatch.request().body_len, 0);
}

#[test]
fn bad_bodies_and_no_endpoints_are_refused_with_their_status() {
    let f = fixture(&[0], ExtProcOptions::default());
    for (body, status) in [
        (&br#"["llama"]"#[..], 400),
        (br#"{"prompt":"no model"}"#, 400),
        (b"\xff", 400),
    ] {
        match f.decide(&mut parts("/v1/completions", &[]), Some(body)) {
            Decision::Reject(e) => assert_eq!(e.http_status(), status, "{e}"),
            Decision::Route(r) => panic!("routed {:?} to {}", body, r.targets),
        }
    }
    assert_eq!(f.inflight(), [0], "nothing refused is counted");

    let empty = fixture(&[], ExtProcOptions::default());
    match empty.decide(&mut parts("/v1/completions", &[]), Some(BODY)) {
        Decision::Reject(e) => assert_eq!(e.http_status(), 503, "{e}"),
        Decision::Route(r) => panic!("routed to {}", r.targets),
    }
}

#[test]
fn an_empty_set_refuses_with_discoverys_reason() {
    let mut f = fixture(&[], ExtProcOptions::default());
    let explained = EndpointSnapshot::new(Vec::new())
        .with_empty_reason(Some("InferencePool ns/pool was deleted".into()));
    f.decider.endpoints = Arc::new(ArcSwap::from_pointee(explained));
    match f.decide(&mut parts("/v1/completions", &[]), Some(BODY)) {
        Decision::Reject(e) => {
            assert_eq!(e.http_status(), 503);
            assert_eq!(
                e.to_string(),
                "no endpoints available in the pool: InferencePool ns/pool was deleted"
            );
        }
        Decision::Route(r) => panic!("routed to {}", r.targets),
    }
}

#[test]
fn a_subset_hint_limits_the_candidates() {
    let f = fixture(&[0, 5, 9], ExtProcOptions::default());
    let mut p = parts("/v1/completions", &[]);
    p.subset = Some(vec!["10.0.0.3".to_owned(), "10.0.0.2:8000".to_owned()]);
    let route = f.route(&mut p, Some(BODY));
    assert_eq!(route.targets, "10.0.0.2:8000");
}

/// Samples every request (or none) and keeps what is exported.
#[derive(Debug)]
struct Keep {
    sample: bool,
    traces: std::sync::Mutex<Vec<crate::RequestTrace>>,
}

impl crate::RequestTracer for Keep {
    fn should_sample(&self, _: &[u8; 16], _: Option<&crate::TraceParent>) -> bool {
        self.sample
    }
    fn export(&self, trace: crate::RequestTrace) {
        self.traces.lock().unwrap().push(trace);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn a_traced_decision_continues_the_callers_trace_with_a_span_per_plugin() {
    use crate::{AttrValue, RequestTracer, trace::ActiveTrace};
    let f = fixture(&[3, 0, 5], ExtProcOptions::default());
    let keep = Arc::new(Keep {
        sample: true,
        traces: Default::default(),
    });
    let tracer: Arc<dyn RequestTracer> = keep.clone();
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut p = parts(
        "/v1/completions",
        &[
            ("traceparent", caller),
            ("tracestate", "vendor=x"),
            ("x-request-id", "r-1"),
        ],
    );
    let mut trace = ActiveTrace::start(&tracer, &p.headers, Instant::now()).unwrap();
    let options = f.decider.options.load_full();
    let route = match f
        .decider
        .decide(&options, &mut p, Some(BODY), Some(&mut trace))
    {
        Decision::Route(r) => r,
        Decision::Reject(e) => panic!("refused: {e}"),
    };
    trace.finish();
    let t = keep.traces.lock().unwrap().pop().unwrap();
    assert_eq!(hex(&t.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(t.trace_state, "vendor=x");
    let root = t
        .spans
        .iter()
        .find(|s| s.name == "gateway.request")
        .unwrap();
    assert_eq!(
        root.parent_span_id.map(|p| hex(&p)).as_deref(),
        Some("00f067aa0ba902b7")
    );
    // The model server continues the trace under epp's span.
    let forwarded: Vec<_> = route.set_headers().collect();
    assert!(
        forwarded.contains(&(
            "traceparent",
            format!(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
                hex(&root.span_id)
            )
            .as_str()
        ))
    );
    assert!(forwarded.contains(&("tracestate", "vendor=x")));

    let names: Vec<&str> = t.spans.iter().map(|s| &*s.name).collect();
    for want in [
        "gateway.request_orchestration",
        "llm_d.epp.scheduling",
        "llm_d.epp.profile_picker.single-profile-handler",
        "run_scheduler_profile",
        "llm_d.epp.scoring",
        "llm_d.epp.scorer.queue-scorer",
        "pick_endpoints",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // Every span but the root hangs off another span of this trace.
    for s in &t.spans {
        if s.name != "gateway.request" {
            let parent = s.parent_span_id.unwrap();
            assert!(
                t.spans.iter().any(|o| o.span_id == parent),
                "{} has no parent",
                s.name
            );
        }
        assert!(s.start_unix_nanos <= s.end_unix_nanos, "{}", s.name);
    }
    let attr = |span: &str, key: &str| {
        t.spans
            .iter()
            .find(|s| s.name == span)
            .and_then(|s| s.attributes.iter().find(|(k, _)| *k == key))
            .map(|(_, v)| v.clone())
    };
    let picked = Some(AttrValue::Str("10.0.0.2:8000".into()));
    assert_eq!(
        attr("gateway.request_orchestration", "llm_d.epp.picked_endpoint"),
        picked
    );
    assert_eq!(
        attr("llm_d.epp.scheduling", "llm_d.epp.picked_endpoint"),
        picked
    );
    assert_eq!(
        attr("gateway.request_orchestration", "gen_ai.request.id"),
        Some(AttrValue::Str("r-1".into()))
    );
    assert_eq!(
        attr("pick_endpoints", "llm_d.epp.picker.top_endpoints"),
        Some(AttrValue::StrList(vec!["10.0.0.2:8000".into(),]))
    );
    // Never the prompt.
    let dump = format!("{t:?}");
    assert!(!dump.contains("Hello there"), "{dump}");
}

#[test]
fn a_request_the_tracer_does_not_sample_is_not_recorded() {
    use crate::{RequestTracer, trace::ActiveTrace};
    let keep: Arc<dyn RequestTracer> = Arc::new(Keep {
        sample: false,
        traces: Default::default(),
    });
    let p = parts("/v1/completions", &[]);
    assert!(ActiveTrace::start(&keep, &p.headers, Instant::now()).is_none());
}
