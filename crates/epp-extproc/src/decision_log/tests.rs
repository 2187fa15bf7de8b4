//! The ring, the sampling rule, and what a decision's record holds.

use std::{sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use epp_core::{
    Endpoint, EndpointMetrics, EndpointSnapshot, EndpointSource, InferenceRequest,
    config::EndpointPickerConfig,
};

use epp_test_support::plugins::STEERED_CONFIG;

use super::*;
use crate::{
    ExtProcError, ExtProcOptions,
    decision::{Decider, Decision, RequestParts},
};

fn record(id: &str) -> DecisionRecord {
    let request = InferenceRequest::builder("m").request_id(id).build();
    DecisionRecord::unscheduled(&request, &ExtProcError::NoEndpoints("none".into()))
}

fn ids(log: &DecisionLog) -> Vec<String> {
    log.recent().iter().map(|r| r.request_id.clone()).collect()
}

#[test]
fn the_ring_keeps_the_last_decisions_newest_first() {
    let log = DecisionLog::new(3, Duration::ZERO);
    for id in ["a", "b"] {
        log.push(record(id));
    }
    assert_eq!(ids(&log), ["b", "a"]);
    for id in ["c", "d", "e"] {
        log.push(record(id));
    }
    assert_eq!(ids(&log), ["e", "d", "c"], "bounded: the oldest go");
    assert_eq!(log.recorded(), 5);

    let off = DecisionLog::new(0, Duration::ZERO);
    assert!(
        !off.claim(Instant::now()),
        "a log keeping nothing samples nothing"
    );
    off.push(record("x"));
    assert!(off.recent().is_empty());
    assert_eq!(off.recorded(), 0);
}

#[test]
fn a_request_is_sampled_once_the_interval_passed_since_the_last_sampled_one() {
    let log = DecisionLog::new(10, Duration::from_millis(100));
    let t0 = Instant::now();
    assert!(log.claim(t0), "an idle log samples the next request");
    assert!(!log.claim(t0 + Duration::from_millis(60)));
    assert!(!log.claim(t0 + Duration::from_millis(99)));
    assert!(log.claim(t0 + Duration::from_millis(100)));
    // The interval runs from the last sampled request, not the last request.
    assert!(!log.claim(t0 + Duration::from_millis(150)));
    assert!(log.claim(t0 + Duration::from_millis(210)));
    assert!(
        log.claim(t0 + Duration::from_secs(3600)),
        "after a quiet hour"
    );

    let every = DecisionLog::new(10, Duration::ZERO);
    assert!((0..5).all(|_| every.claim(t0)));
}

/// Endpoints 10.0.0.1:8000, 10.0.0.2:8000, 10.0.0.3:8000 with these
/// queues and KV use, behind a decider keeping every decision.
fn decider(load: &[(u32, f64)]) -> (Decider, Arc<DecisionLog>) {
    let endpoints: Vec<Arc<Endpoint>> = load
        .iter()
        .enumerate()
        .map(|(i, &(waiting, kv_usage))| {
            let e = Arc::new(Endpoint::new(
                i as u32,
                format!("10.0.0.{}:8000", i + 1).parse().unwrap(),
            ));
            e.set_metrics(EndpointMetrics {
                waiting,
                kv_usage,
                ..EndpointMetrics::fresh()
            });
            e
        })
        .collect();
    let source: Arc<dyn EndpointSource> =
        Arc::new(ArcSwap::from_pointee(EndpointSnapshot::new(endpoints)));
    let scheduler = EndpointPickerConfig::parse(STEERED_CONFIG, "test.yaml")
        .unwrap()
        .build(&epp_plugins::builtin_registry())
        .unwrap()
        .scheduler;
    let decider = Decider::new(Arc::new(scheduler), source, ExtProcOptions::default());
    let log = Arc::new(DecisionLog::new(8, Duration::ZERO));
    decider.decision_log.store(Some(Arc::clone(&log)));
    (decider, log)
}

const PROMPT: &str = "the-secret-prompt-7f3a9 about a purple giraffe";

fn decide(decider: &Decider, headers: &[(&str, &str)]) -> Decision {
    let mut all = vec![(":path".to_owned(), "/v1/completions".to_owned())];
    all.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let mut parts = RequestParts {
        headers: all,
        subset: None,
    };
    let body = serde_json::json!({"model": "llama", "prompt": PROMPT}).to_string();
    let options = decider.options.load_full();
    decider.decide(&options, &mut parts, Some(body.as_bytes()), None)
}

#[test]
fn a_routed_decision_shows_each_filter_scorer_and_the_pick_and_never_the_prompt() {
    // Endpoint 3 has the shortest queue but the filter drops it.
    let (decider, log) = decider(&[(4, 0.5), (2, 0.9), (0, 0.0)]);
    let decision = decide(
        &decider,
        &[
            ("x-request-id", "req-42"),
            ("test-epp-endpoint-selection", "10.0.0.1:8000,10.0.0.2:8000"),
            ("x-gateway-model-name-rewrite", "llama-lora"),
        ],
    );
    let Decision::Route(route) = decision else {
        panic!("refused: {decision:?}");
    };
    let recent = log.recent();
    assert_eq!(recent.len(), 1);
    let r = &recent[0];
    assert_eq!(r.request_id, "req-42");
    assert_eq!(
        (r.model.as_str(), r.target_model.as_str()),
        ("llama", "llama-lora")
    );
    assert!(r.refused.is_none());
    assert_eq!(r.targets[0].address, route.targets);
    assert!(r.excluded.is_empty());
    assert_eq!(r.runs.len(), 1);
    let run = &r.runs[0];
    assert_eq!(run.profile, "steered");
    let names = |p: &[PluginId]| p.iter().map(|p| p.type_name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&run.filters), ["header-based-testing-filter"]);
    let scorers: Vec<(&str, f64)> = run
        .scorers
        .iter()
        .map(|s| (s.plugin.type_name.as_str(), s.weight))
        .collect();
    assert_eq!(
        scorers,
        [("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 1.0)]
    );
    assert_eq!(run.picker.as_ref().unwrap().type_name, "max-score-picker");

    let c: Vec<&str> = run
        .candidates
        .iter()
        .map(|c| c.endpoint.address.as_str())
        .collect();
    assert_eq!(c, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]);
    let dropped = &run.candidates[2];
    assert_eq!(
        dropped.dropped_by.as_ref().map(|p| p.type_name.as_str()),
        Some("header-based-testing-filter")
    );
    assert!(dropped.scores.is_empty() && dropped.total.is_none() && dropped.pick.is_none());
    for c in &run.candidates[..2] {
        assert!(c.dropped_by.is_none(), "{c:?}");
        assert_eq!(c.scores.len(), 2, "{c:?}");
        // The total is the weighted sum the picker saw.
        let total = 2.0 * c.scores[0] + c.scores[1];
        assert!((c.total.unwrap() - total).abs() < 1e-9, "{c:?}");
    }
    // The shorter queue scores higher on the queue, the emptier KV on KV.
    let (a, b) = (&run.candidates[0], &run.candidates[1]);
    assert!(
        b.scores[0] > a.scores[0] && a.scores[1] > b.scores[1],
        "{a:?} {b:?}"
    );
    let best = if a.total > b.total { a } else { b };
    assert_eq!(best.pick, Some(0));
    assert_eq!(best.endpoint.address, route.targets);

    let json = serde_json::to_string(&**r).unwrap();
    assert!(
        json.contains("\"dropped_by\":{\"type\":\"header-based-testing-filter\""),
        "{json}"
    );
    assert!(
        !json.contains("secret-prompt") && !json.contains("giraffe"),
        "{json}"
    );
}

#[test]
fn a_refused_decision_says_why_and_which_filter_dropped_everything() {
    let (decider, log) = decider(&[(0, 0.0), (1, 0.0)]);
    // No selection header: the testing filter keeps nothing.
    let decision = decide(&decider, &[("x-request-id", "req-none")]);
    let Decision::Reject(err) = decision else {
        panic!("routed: {decision:?}");
    };
    let recent = log.recent();
    let r = &recent[0];
    let refused = r.refused.as_ref().expect("refused");
    assert_eq!(refused.status, err.http_status());
    assert_eq!(refused.status, 503);
    assert_eq!(refused.reason, err.to_string());
    assert!(r.targets.is_empty());
    let run = &r.runs[0];
    assert!(
        run.candidates.iter().all(|c| c
            .dropped_by
            .as_ref()
            .is_some_and(|p| p.name == "header-based-testing-filter")),
        "{run:?}"
    );
    assert!(!serde_json::to_string(&**r).unwrap().contains("giraffe"));
}

#[test]
fn a_subset_hint_shows_what_it_left_out() {
    let (decider, log) = decider(&[(0, 0.0), (1, 0.0), (2, 0.0)]);
    let mut parts = RequestParts {
        headers: vec![
            (":path".to_owned(), "/v1/completions".to_owned()),
            (
                "test-epp-endpoint-selection".to_owned(),
                "10.0.0.2".to_owned(),
            ),
        ],
        subset: Some(vec!["10.0.0.2:8000".to_owned(), "10.0.0.3:8000".to_owned()]),
    };
    let options = decider.options.load_full();
    let body = br#"{"model":"llama","prompt":"hi"}"#;
    let decision = decider.decide(&options, &mut parts, Some(body), None);
    assert!(matches!(decision, Decision::Route(_)), "{decision:?}");
    let r = &log.recent()[0];
    let excluded: Vec<(&str, &str)> = r
        .excluded
        .iter()
        .map(|e| (e.endpoint.address.as_str(), e.reason))
        .collect();
    assert_eq!(excluded, [("10.0.0.1:8000", "subset")]);
    assert_eq!(
        r.runs[0].candidates.len(),
        2,
        "the runs start from the subset"
    );
}

#[test]
fn a_busy_log_samples_only_the_first_request_of_its_interval() {
    let (decider, _) = decider(&[(0, 0.0)]);
    let log = Arc::new(DecisionLog::new(8, Duration::from_secs(3600)));
    decider.decision_log.store(Some(Arc::clone(&log)));
    let steer = ("test-epp-endpoint-selection", "10.0.0.1:8000");
    for id in ["first", "second", "third"] {
        let d = decide(&decider, &[("x-request-id", id), steer]);
        assert!(matches!(d, Decision::Route(_)), "{d:?}");
    }
    assert_eq!(ids(&log), ["first"]);
}

/// Samples every request and keeps what is exported.
#[derive(Debug, Default)]
struct KeepTraces(std::sync::Mutex<Vec<crate::RequestTrace>>);

impl crate::RequestTracer for KeepTraces {
    fn should_sample(&self, _: &[u8; 16], _: Option<&crate::TraceParent>) -> bool {
        true
    }
    fn export(&self, trace: crate::RequestTrace) {
        self.0.lock().unwrap().push(trace);
    }
}

#[test]
fn a_traced_request_is_both_traced_and_logged() {
    use crate::{RequestTracer, trace::ActiveTrace};
    let (decider, log) = decider(&[(3, 0.0), (0, 0.0)]);
    let keep = Arc::new(KeepTraces::default());
    let tracer: Arc<dyn RequestTracer> = keep.clone();
    let mut parts = RequestParts {
        headers: vec![
            (":path".to_owned(), "/v1/completions".to_owned()),
            ("x-request-id".to_owned(), "traced".to_owned()),
            (
                "test-epp-endpoint-selection".to_owned(),
                "10.0.0.1,10.0.0.2".to_owned(),
            ),
        ],
        subset: None,
    };
    let mut trace = ActiveTrace::start(&tracer, &parts.headers, Instant::now()).unwrap();
    let options = decider.options.load_full();
    let body = br#"{"model":"llama","prompt":"hi"}"#;
    let decision = decider.decide(&options, &mut parts, Some(body), Some(&mut trace));
    assert!(matches!(decision, Decision::Route(_)), "{decision:?}");
    trace.finish();
    let spans: Vec<String> = keep.0.lock().unwrap()[0]
        .spans
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    for name in [
        "llm_d.epp.filter.header-based-testing-filter",
        "llm_d.epp.scorer.queue-scorer",
        "llm_d.epp.scorer.kv-cache-utilization-scorer",
        "pick_endpoints",
    ] {
        assert!(spans.iter().any(|s| s == name), "{name} in {spans:?}");
    }
    let r = &log.recent()[0];
    assert_eq!(r.request_id, "traced");
    assert_eq!(r.runs[0].candidates[1].pick, Some(0), "{r:?}");
}
