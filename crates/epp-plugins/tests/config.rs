//! Configs users bring, built with the built-in registry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use epp_core::{InferenceRequest, config::EndpointPickerConfig};
use epp_plugins::builtin_registry;
use epp_test_support::endpoints::snapshot;

#[test]
fn an_llm_d_style_config_with_a_declared_producer_schedules() {
    let text = "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 8, autoTune: false}
- type: prefix-cache-scorer
- type: decode-filter
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: approx-prefix-cache-producer
  - pluginRef: decode-filter
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - pluginRef: max-score-picker
";
    let built = EndpointPickerConfig::parse(text, "llm-d.yaml")
        .unwrap()
        .build(&builtin_registry())
        .unwrap();
    let snapshot = snapshot(3);
    let prompt = "a shared system prompt ".repeat(20);
    let req = InferenceRequest::builder("m").prompt(prompt).build();
    let first = built.scheduler.schedule(&req, &snapshot).unwrap();
    assert_eq!(
        first.primary_run().unwrap().targets.len(),
        2,
        "target and one fallback"
    );
    let again = built.scheduler.schedule(&req, &snapshot).unwrap();
    assert_eq!(first.primary().unwrap().id(), again.primary().unwrap().id());
    assert!(
        (again.primary_run().unwrap().scores[0] - 3.0).abs() < 1e-9,
        "full match × weight 3"
    );
    assert!(
        built
            .effective_yaml
            .contains("approx-prefix-cache-producer")
    );
}

#[test]
fn bad_producer_parameters_point_at_the_field() {
    let text = "\
plugins:
- type: approx-prefix-cache-producer
  parameters:
    blockSizeTokens: 0
";
    let err = EndpointPickerConfig::parse(text, "epp.yaml")
        .unwrap()
        .build(&builtin_registry())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("epp.yaml:4:5: plugins[0].parameters.blockSizeTokens"),
        "{err}"
    );
}

#[test]
fn the_registered_default_config_is_the_reference_pickers_and_fills_each_role() {
    let registry = builtin_registry();
    assert_eq!(registry.default_config(), Some(epp_plugins::DEFAULT_CONFIG));
    let built = EndpointPickerConfig::default_config(&registry)
        .unwrap()
        .build(&registry)
        .unwrap();
    let profiles = built.scheduler.profiles();
    assert_eq!(profiles.len(), 1);
    let scorers: Vec<(&str, f64)> = profiles[0]
        .scorers()
        .iter()
        .map(|s| (s.plugin.plugin().type_name(), s.weight))
        .collect();
    assert_eq!(
        scorers,
        [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0)
        ]
    );
    assert_eq!(
        profiles[0].picker().unwrap().plugin().type_name(),
        "max-score-picker"
    );
    let y = &built.effective_yaml;
    for default in [
        "type: single-profile-handler",
        "type: utilization-detector",
        "saturationDetector:\n  pluginRef: utilization-detector",
        "parser:\n  pluginRef: openai-parser",
    ] {
        assert!(y.contains(default), "{default} missing from\n{y}");
    }
    // The data layer's defaults come with its own registration.
    assert!(y.contains("dataLayer:\n  sources: []"), "{y}");
}
