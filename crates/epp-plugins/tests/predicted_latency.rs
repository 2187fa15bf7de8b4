//! The latency plugins as users configure them: llm-d's predicted-latency
//! profile loads, learns from response timings, and routes by them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use epp_core::{
    DispatchLoad, EndpointSnapshot, InferenceRequest, Scheduler, SchedulingError, TTFT_SLO_HEADER,
    config::EndpointPickerConfig,
};
use epp_plugins::builtin_registry;
use epp_test_support::{endpoints::snapshot, workload::complete_streamed};

/// llm-d's predicted-latency profile with objectives (its chart's shape).
const LLM_D: &str = "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: prefix-cache-affinity-filter
  name: strict-affinity-filter
  parameters: {affinityThreshold: 0.99, ttftSource: latencyPredictor}
- type: slo-headroom-tier-filter
- type: prefix-cache-affinity-filter
  name: loose-affinity-filter
  parameters: {affinityThreshold: 0.80, ttftSource: latencyPredictor}
- type: latency-scorer
- type: max-score-picker
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
  - pluginRef: latency-slo-admitter
";

fn build(text: &str) -> (Scheduler, String) {
    let built = EndpointPickerConfig::parse(text, "epp.yaml")
        .unwrap()
        .build(&builtin_registry())
        .unwrap();
    (built.scheduler, built.effective_yaml)
}

/// Teaches `scheduler` that endpoint 0 answers its first token in 40 ms
/// plus 30 ms per queued request, endpoint 1 in 250 ms plus the same.
fn train(scheduler: &Scheduler, snapshot: &EndpointSnapshot) {
    let request = InferenceRequest::builder("m").build();
    for i in 0..200u32 {
        for (e, base) in snapshot.endpoints().iter().zip([40.0, 250.0]) {
            let load = DispatchLoad {
                waiting: i % 5,
                prompt_tokens: 64,
                uncached_tokens: 64,
                ..DispatchLoad::default()
            };
            let ttft = base + 30.0 * f64::from(load.waiting);
            complete_streamed(scheduler, &request, e, load, ttft, ttft + 100.0, 11);
        }
    }
}

#[test]
fn llm_d_predicted_latency_profile_routes_to_the_faster_server_once_learned() {
    let (scheduler, _) = build(LLM_D);
    let snapshot = snapshot(2);
    // Distinct prompts: no endpoint holds one (the affinity filters stay out).
    let request = |i: usize| {
        InferenceRequest::builder("m")
            .prompt(format!("{i} ").repeat(64))
            .build()
    };
    // Before any sample: no prediction, the scorer's heuristic blend decides.
    assert!(scheduler.schedule(&request(0), &snapshot).is_ok());
    train(&scheduler, &snapshot);
    for i in 1..20 {
        let r = scheduler.schedule(&request(i), &snapshot).unwrap();
        assert_eq!(r.primary().unwrap().id(), snapshot.endpoints()[0].id());
    }
}

#[test]
fn a_sheddable_request_no_server_can_serve_in_time_is_refused() {
    let (scheduler, _) = build(LLM_D);
    let snapshot = snapshot(2);
    train(&scheduler, &snapshot);
    for e in snapshot.endpoints() {
        e.set_metrics(epp_core::EndpointMetrics {
            running: 4,
            kv_usage: 0.5,
            ..epp_core::EndpointMetrics::fresh()
        });
    }
    let in_time = |ms: &str, priority: i32| {
        let r = InferenceRequest::builder("m")
            .priority(priority)
            .header(TTFT_SLO_HEADER, ms)
            .build();
        scheduler.schedule(&r, &snapshot)
    };
    assert!(in_time("100", -1).is_ok(), "endpoint 0 makes 100 ms");
    let err = in_time("10", -1).unwrap_err();
    assert!(
        matches!(&err, SchedulingError::NotAdmitted { plugin, .. } if plugin == "latency-slo-admitter"),
        "{err}"
    );
    assert!(in_time("10", 0).is_ok(), "critical requests are not shed");
}

#[test]
fn a_latency_reader_without_a_producer_gets_the_default_one() {
    let (scheduler, effective) = build(
        "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: latency-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
",
    );
    assert!(
        effective.contains("predicted-latency-producer"),
        "{effective}"
    );
    assert!(
        effective.contains("approx-prefix-cache-producer"),
        "the predictor reads prefix matches: {effective}"
    );
    let snapshot = snapshot(2);
    train(&scheduler, &snapshot);
    let r = scheduler
        .schedule(&InferenceRequest::builder("m").build(), &snapshot)
        .unwrap();
    assert_eq!(r.primary().unwrap().id(), snapshot.endpoints()[0].id());
}

/// The cycle bench's learned profile (`workload::latency_profile`) is built
/// by hand around its own prefix scorer; it must stay the shipped example
/// (`examples/configs/predicted-latency.yaml`): the same scorers at the same
/// weights.
#[test]
fn the_benchs_learned_profile_is_the_shipped_example() {
    let path =
        epp_test_support::process::workspace_root().join("examples/configs/predicted-latency.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let example = EndpointPickerConfig::parse(&text, &path.to_string_lossy())
        .unwrap()
        .build(&builtin_registry())
        .unwrap();
    let registry = builtin_registry();
    let prefix = epp_core::PluginRef::new(
        registry
            .build(&epp_core::PluginSpec::new("prefix-cache-scorer"))
            .unwrap(),
    );
    let bench = epp_test_support::workload::latency_profile(&registry, prefix);
    let scorers = |s: &Scheduler| {
        let mut v: Vec<(String, f64)> = s.profiles()[0]
            .scorers()
            .iter()
            .map(|w| (w.plugin.plugin().type_name().to_owned(), w.weight))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(scorers(&example.scheduler), scorers(&bench));
}
