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
        self.decider.decide(&options, parts, body)
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
    assert_eq!(route.labels.target_model_name, "llama-lora");
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
