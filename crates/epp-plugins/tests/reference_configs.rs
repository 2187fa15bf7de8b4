//! Configs shaped like the ones users write for the reference picker
//! (gateway-api-inference-extension) and for llm-d: the same keys, plugin
//! types, parameter names and layouts as their shipped sample, guide and test
//! configs, written here in our own words. Each must load unchanged and mean
//! the same thing: the same profiles, weights, pickers and parameters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use epp_core::{
    EndpointSnapshot, InferenceRequest,
    config::{BuiltConfig, EndpointPickerConfig},
};
use epp_plugins::builtin_registry;
use epp_test_support::endpoints::{snapshot, with_roles};

fn load(text: &str) -> BuiltConfig {
    EndpointPickerConfig::parse(text, "ref.yaml")
        .unwrap()
        .build(&builtin_registry())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> String {
    match EndpointPickerConfig::parse(text, "ref.yaml").and_then(|c| c.build(&builtin_registry())) {
        Ok(_) => panic!("loaded: {text}"),
        Err(e) => e.to_string(),
    }
}

/// `(profile, [filters], [(scorer, weight)], picker)` of every profile.
type Shape = Vec<(String, Vec<String>, Vec<(String, f64)>, String)>;

fn shape(built: &BuiltConfig) -> Shape {
    built
        .scheduler
        .profiles()
        .iter()
        .map(|p| {
            (
                p.name().to_owned(),
                p.filters()
                    .iter()
                    .map(|f| f.plugin().type_name().to_owned())
                    .collect(),
                p.scorers()
                    .iter()
                    .map(|s| (s.plugin.plugin().type_name().to_owned(), s.weight))
                    .collect(),
                p.picker()
                    .map(|x| x.plugin().type_name().to_owned())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

fn s(v: &str) -> String {
    v.to_owned()
}

/// The reference's integration-test config: scorers listed without weights
/// or picker, the parser by reference, and its legacy-metrics feature gate.
#[test]
fn reference_test_config_with_unweighted_scorers_and_no_picker() {
    let built = load(
        "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates:
- enableLegacyMetrics
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
- type: openai-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
  - pluginRef: lora-affinity-scorer
parser:
  pluginRef: openai-parser
",
    );
    assert_eq!(
        shape(&built),
        vec![(
            s("default"),
            vec![],
            vec![
                (s("queue-scorer"), 1.0),
                (s("kv-cache-utilization-scorer"), 1.0),
                (s("prefix-cache-scorer"), 1.0),
                (s("lora-affinity-scorer"), 1.0),
            ],
            s("max-score-picker"),
        )]
    );
    assert_eq!(built.feature_gates, vec![s("enableLegacyMetrics")]);
}

/// llm-d's newer layout: parsers under `requestHandler`, the saturation
/// detector under `flowControl`.
#[test]
fn llm_d_request_handler_parsers_and_flow_control_detector() {
    let built = load(
        "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: openai-parser
- type: random-picker
- type: utilization-detector
  parameters:
    queueDepthThreshold: 999999
    kvCacheUtilThreshold: 1.0
flowControl:
  saturationDetector:
    pluginRef: utilization-detector
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: random-picker
requestHandler:
  parsers:
  - pluginRef: openai-parser
",
    );
    assert_eq!(
        shape(&built),
        vec![(
            s("default"),
            vec![],
            vec![(s("queue-scorer"), 1.0)],
            s("random-picker")
        )]
    );
    assert!(
        built
            .effective_yaml
            .contains("pluginRef: utilization-detector"),
        "{}",
        built.effective_yaml
    );
    let err = load_err(
        "\
plugins:
- type: queue-scorer
requestHandler:
  parsers:
  - pluginRef: nope
",
    );
    assert!(
        err.contains("requestHandler.parsers[0].pluginRef") && err.contains("\"nope\""),
        "{err}"
    );
    let err = load_err(
        "\
plugins:
- type: queue-scorer
flowControl:
  saturationDetector:
    pluginRef: queue-scorer
",
    );
    assert!(
        err.contains("flowControl.saturationDetector.pluginRef")
            && err.contains("not a saturation detector"),
        "{err}"
    );
}

/// llm-d's sample config without P/D: the picker listed before the scorer,
/// decode-filter, an explicit single-profile-handler.
#[test]
fn llm_d_decode_only_sample_keeps_the_decode_endpoints() {
    let built = load(
        "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: decode-filter
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
",
    );
    assert_eq!(
        shape(&built),
        vec![(
            s("default"),
            vec![s("decode-filter")],
            vec![(s("prefix-cache-scorer"), 2.0)],
            s("max-score-picker"),
        )]
    );
    // llm-d keeps decode workers and workers without a role.
    let snapshot = EndpointSnapshot::new(with_roles(&[
        Some("prefill"),
        Some("decode"),
        None,
        Some("encode"),
    ]));
    let req = InferenceRequest::builder("m").prompt("hello").build();
    let mut seen = [false; 4];
    for _ in 0..40 {
        let r = built.scheduler.schedule(&req, &snapshot).unwrap();
        seen[r.primary().unwrap().id().index()] = true;
    }
    assert_eq!(seen, [false, true, true, false]);
}

/// llm-d's estimate-mode guide config: float weights, load-aware-scorer.
#[test]
fn llm_d_estimate_prefix_cache_config_with_float_weights() {
    let built = load(
        "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: decode-filter
- type: prefix-cache-scorer
- type: load-aware-scorer
  parameters: {threshold: 64}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 1.0
  - pluginRef: load-aware-scorer
    weight: 1.0
  - pluginRef: max-score-picker
",
    );
    assert_eq!(
        shape(&built)[0].2,
        vec![
            (s("prefix-cache-scorer"), 1.0),
            (s("load-aware-scorer"), 1.0)
        ]
    );
}

/// llm-d's optimized-baseline guide: the reference weights plus
/// no-hit-lru-scorer, and a producer capped in tokens.
#[test]
fn llm_d_optimized_baseline_profile() {
    let built = load(
        "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 100000
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
  parameters: {lruSize: 2048}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: no-hit-lru-scorer, weight: 2}
",
    );
    assert_eq!(
        shape(&built),
        vec![(
            s("default"),
            vec![],
            vec![
                (s("queue-scorer"), 2.0),
                (s("kv-cache-utilization-scorer"), 2.0),
                (s("prefix-cache-scorer"), 3.0),
                (s("no-hit-lru-scorer"), 2.0),
            ],
            s("max-score-picker"),
        )]
    );
}

/// `maxPrefixTokensToMatch` (llm-d's sample and P/D configs set it) caps the
/// blocks matched: 32 tokens = 2 blocks of 16, so a request sharing only its
/// first two blocks with an earlier one is a full match, not half of one.
#[test]
fn max_prefix_tokens_to_match_caps_the_matched_blocks() {
    let config = |cap: &str| {
        format!(
            "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {{autoTune: false, lruCapacityPerServer: 31250{cap}}}
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
"
        )
    };
    let snapshot = snapshot(3);
    // Blocks are 16 × 4 = 64 characters.
    let head = "h".repeat(128);
    let first = InferenceRequest::builder("m")
        .prompt(format!("{head}{}", "a".repeat(128)))
        .build();
    let second = InferenceRequest::builder("m")
        .prompt(format!("{head}{}", "b".repeat(128)))
        .build();
    let score_of_second = |text: &str| {
        let built = load(text);
        let chosen = built.scheduler.schedule(&first, &snapshot).unwrap();
        let again = built.scheduler.schedule(&second, &snapshot).unwrap();
        assert_eq!(
            chosen.primary().unwrap().id(),
            again.primary().unwrap().id()
        );
        again.primary_run().unwrap().scores[0]
    };
    let capped = score_of_second(&config(", maxPrefixTokensToMatch: 32"));
    let uncapped = score_of_second(&config(""));
    assert!((capped - 3.0).abs() < 1e-9, "2 of 2 blocks: {capped}");
    assert!((uncapped - 1.5).abs() < 1e-9, "2 of 4 blocks: {uncapped}");
}

/// Every plugin type of the catalog, with every parameter spelled as the
/// reference and llm-d spell it.
#[test]
fn every_catalog_plugin_loads_with_the_reference_parameter_names() {
    let built = load(
        "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: running-requests-size-scorer
- type: kv-cache-utilization-scorer
- type: lora-affinity-scorer
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 32, maxPrefixBlocksToMatch: 128, lruCapacityPerServer: 1000, autoTune: false}
- type: prefix-cache-scorer
- type: token-load-scorer
  parameters: {queueThresholdTokens: 1000000}
- type: load-aware-scorer
  parameters: {threshold: 100}
- type: active-request-scorer
  parameters: {idleThreshold: 2, maxBusyScore: 0.5}
- type: session-affinity-scorer
- type: no-hit-lru-scorer
  parameters: {lruSize: 512}
- type: metric-scorer
  parameters:
    metricName: vllm:num_requests_waiting
    optimizationMode: Minimize
    normalizationAlgo: Softmax
    min: 0
    max: 100
- type: label-selector-filter
  parameters:
    matchLabels: {tier: gold}
    matchExpressions:
    - {key: zone, operator: In, values: [a, b]}
    - {key: spot, operator: DoesNotExist}
- type: decode-filter
- type: prefill-filter
- type: encode-filter
- type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.7, explorationProbability: 0.05}
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
- type: random-picker
  parameters: {maxNumOfEndpoints: 3}
- type: weighted-random-picker
  parameters: {maxNumOfEndpoints: 1}
- type: single-profile-handler
- type: utilization-detector
  parameters: {queueDepthThreshold: 8, kvCacheUtilThreshold: 0.9, metricsStalenessThreshold: 150ms}
- type: concurrency-detector
  parameters: {maxConcurrency: 50}
saturationDetector:
  pluginRef: utilization-detector
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: queue-scorer
  - {pluginRef: token-load-scorer, weight: 0.5}
  - pluginRef: max-score-picker
",
    );
    let types: Vec<&str> = built
        .plugins
        .iter()
        .map(|(_, p)| p.plugin().type_name())
        .collect();
    assert_eq!(types.len(), 24, "{types:?}");
    assert_eq!(
        shape(&built)[0],
        (
            s("default"),
            vec![
                s("label-selector-filter"),
                s("prefix-cache-affinity-filter")
            ],
            vec![(s("queue-scorer"), 1.0), (s("token-load-scorer"), 0.5)],
            s("max-score-picker"),
        )
    );
}

/// Types the reference or llm-d ship that this picker does not implement:
/// the load error names the type and where it is declared.
#[test]
fn unimplemented_reference_types_are_named_in_the_error() {
    for (ty, params) in [
        // llm-d's deprecated P/D types, not built (none of its shipped
        // configs names them).
        ("pd-profile-handler", "{}"),
        ("disagg-headers-handler", "{}"),
        ("prefill-header-handler", "{}"),
        // llm-d types for roles epp fills otherwise (no shipped config
        // names them).
        ("k8s-notification-source", "{kind: Pod}"),
        ("local-syncer", "{}"),
    ] {
        let text = format!(
            "\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: {ty}
  parameters: {params}
"
        );
        let err = load_err(&text);
        assert!(
            err.starts_with("ref.yaml:5:")
                && err.contains("plugins[1].type")
                && err.contains(&format!("unknown plugin type \"{ty}\"")),
            "{ty}: {err}"
        );
    }
}
