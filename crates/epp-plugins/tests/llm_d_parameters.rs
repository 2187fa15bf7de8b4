//! llm-d parameters that configs written for llm-d use: each loads and means
//! what llm-d makes it mean (learned from llm-d-router's source), and the
//! wrong uses are load errors that name the file, line and field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use epp_core::{
    EndpointId, EndpointMetrics, EndpointSnapshot, InferenceRequest,
    config::{BuiltConfig, EndpointPickerConfig},
};
use epp_plugins::builtin_registry;
use epp_test_support::endpoints::{snapshot, with_roles};

fn load(text: &str) -> BuiltConfig {
    EndpointPickerConfig::parse(text, "llmd.yaml")
        .unwrap()
        .build(&builtin_registry())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> String {
    match EndpointPickerConfig::parse(text, "llmd.yaml").and_then(|c| c.build(&builtin_registry()))
    {
        Ok(_) => panic!("loaded: {text}"),
        Err(e) => e.to_string(),
    }
}

fn config(plugins: &str, profile: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n{plugins}\
         schedulingProfiles:\n- name: default\n  plugins:\n{profile}"
    )
}

fn request(prompt: String) -> InferenceRequest {
    InferenceRequest::builder("m").prompt(prompt).build()
}

/// Schedules `first`, then `second`; returns the weighted score of the
/// second's target, which must be the first's target.
fn score_of_second(built: &BuiltConfig, first: &str, second: &str) -> f64 {
    let snapshot = snapshot(3);
    let a = built
        .scheduler
        .schedule(&request(first.to_owned()), &snapshot)
        .unwrap();
    let b = built
        .scheduler
        .schedule(&request(second.to_owned()), &snapshot)
        .unwrap();
    assert_eq!(a.primary().unwrap().id(), b.primary().unwrap().id());
    b.primary_run().unwrap().scores[0]
}

fn names(built: &BuiltConfig) -> Vec<&str> {
    built.plugins.iter().map(|(n, _)| n.as_str()).collect()
}

// Blocks of the default 16 tokens are 64 characters.
const BLOCK: usize = 64;

/// The scorer reads the matches of the producer it names: here one that
/// caps matching at 2 blocks, so a request sharing its first 2 of 4 blocks
/// is a full match (with the scorer's own index it would be half).
#[test]
fn prefix_match_info_producer_name_selects_the_producer() {
    let score = half_shared_score("  parameters: {prefixMatchInfoProducerName: short-prefix}\n");
    assert!((score - 3.0).abs() < 1e-9, "2 of 2 blocks: {score}");
}

/// Next to a producer named `short-prefix` that matches at most 2 blocks, a
/// `prefix-cache-scorer` (weight 3, then `scorer_params`) scores a 4-block
/// request sharing its first 2 blocks with the one before.
fn half_shared_score(scorer_params: &str) -> f64 {
    let built = load(&config(
        &format!(
            "- type: approx-prefix-cache-producer\n  name: short-prefix\n  \
             parameters: {{autoTune: false, maxPrefixTokensToMatch: 32}}\n\
             - type: prefix-cache-scorer\n{scorer_params}"
        ),
        "  - {pluginRef: prefix-cache-scorer, weight: 3}\n",
    ));
    let head = "h".repeat(2 * BLOCK);
    let first = format!("{head}{}", "a".repeat(2 * BLOCK));
    let second = format!("{head}{}", "b".repeat(2 * BLOCK));
    score_of_second(&built, &first, &second)
}

/// Without the parameter, readers read the producer named
/// `approx-prefix-cache-producer`; a producer under another name is not
/// theirs (llm-d creates a default one for them; here the scorer's own
/// index plays that part), so its 2-block cap does not apply.
#[test]
fn readers_default_to_the_approx_producer_name() {
    let score = half_shared_score("");
    assert!((score - 1.5).abs() < 1e-9, "2 of 4 blocks: {score}");
}

/// A reader with no producer and no index of its own gets a default
/// `approx-prefix-cache-producer`, as llm-d creates one.
#[test]
fn a_default_producer_is_created_for_readers_without_one() {
    let built = load(&config(
        "- type: no-hit-lru-scorer\n  \
         parameters: {lruSize: 16, prefixPluginType: prefix-cache-scorer, prefixPluginName: x}\n",
        "  - {pluginRef: no-hit-lru-scorer}\n",
    ));
    assert!(
        names(&built).contains(&"approx-prefix-cache-producer"),
        "{:?}",
        names(&built)
    );
    // Cold requests rotate over the pool: three different prompts, three
    // different endpoints (each pick becomes the most recent).
    let snapshot = snapshot(3);
    let mut seen: Vec<EndpointId> = (0..3)
        .map(|i| {
            let r = request(format!("{i}").repeat(4 * BLOCK));
            let res = built.scheduler.schedule(&r, &snapshot).unwrap();
            res.primary().unwrap().id()
        })
        .collect();
    seen.sort_by_key(|id| id.0);
    seen.dedup();
    assert_eq!(seen.len(), 3, "{seen:?}");
    // A repeated prompt is a hit: neutral scores, 0.5 for everyone.
    let r = request("0".repeat(4 * BLOCK));
    let res = built.scheduler.schedule(&r, &snapshot).unwrap();
    assert!((res.primary_run().unwrap().scores[0] - 0.5).abs() < 1e-9);
}

#[test]
fn a_dangling_producer_name_is_a_load_error() {
    let err = load_err(&config(
        "- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: nowhere}\n",
        "  - {pluginRef: prefix-cache-scorer}\n",
    ));
    assert!(
        err.starts_with("llmd.yaml:5:")
            && err.contains("plugins[0].parameters.prefixMatchInfoProducerName")
            && err.contains("no plugin named \"nowhere\""),
        "{err}"
    );
}

#[test]
fn the_named_producer_must_produce_prefix_matches() {
    let err = load_err(&config(
        "- type: queue-scorer\n\
         - type: prefix-cache-affinity-filter\n  parameters: {prefixMatchInfoProducerName: queue-scorer}\n",
        "  - {pluginRef: prefix-cache-affinity-filter}\n",
    ));
    assert!(
        err.contains("plugins[1].parameters.prefixMatchInfoProducerName")
            && err.contains("does not produce prefix-cache matches"),
        "{err}"
    );
}

/// A reader that can only read the first set of matches refuses a second
/// producer, naming its parameter.
#[test]
fn a_reader_that_cannot_read_a_second_set_is_refused() {
    let err = load_err(&config(
        "- type: approx-prefix-cache-producer\n  name: a\n\
         - type: approx-prefix-cache-producer\n  name: b\n\
         - type: no-hit-lru-scorer\n  parameters: {prefixMatchInfoProducerName: a}\n\
         - type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: b}\n",
        "  - {pluginRef: prefix-cache-scorer}\n  - {pluginRef: no-hit-lru-scorer}\n",
    ));
    assert!(
        err.contains("plugins[3].parameters.prefixMatchInfoProducerName")
            && err.contains("can only read the prefix matches of the producer the first reader"),
        "{err}"
    );
}

#[test]
fn index_parameters_beside_a_producer_name_are_refused() {
    let err = load_err(&config(
        "- type: approx-prefix-cache-producer\n\
         - type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer, blockSizeTokens: 64}\n",
        "  - {pluginRef: prefix-cache-scorer}\n",
    ));
    assert!(err.contains("would have no effect"), "{err}");
}

/// llm-d's score with `matchLengthWeight` w and `matchLengthScaleTokens` s:
/// w·min(1, matched tokens / s)² + (1 − w)·matched / total.
#[test]
fn match_length_weight_adds_the_absolute_matched_length() {
    let built = load(&config(
        "- type: approx-prefix-cache-producer\n  parameters: {autoTune: false}\n\
         - type: prefix-cache-scorer\n  parameters: {matchLengthWeight: 0.5, matchLengthScaleTokens: 64}\n",
        "  - {pluginRef: prefix-cache-scorer}\n",
    ));
    let head = "h".repeat(2 * BLOCK);
    let first = format!("{head}{}", "a".repeat(2 * BLOCK));
    let second = format!("{head}{}", "b".repeat(2 * BLOCK));
    // 2 of 4 blocks = 32 tokens: 0.5 · (32/64)² + 0.5 · 0.5.
    let score = score_of_second(&built, &first, &second);
    assert!((score - 0.375).abs() < 1e-9, "{score}");

    for (params, field) in [
        ("{matchLengthWeight: 1.5}", "matchLengthWeight"),
        (
            "{matchLengthWeight: 0.2, matchLengthScaleTokens: 0}",
            "matchLengthScaleTokens",
        ),
    ] {
        let err = load_err(&config(
            &format!("- type: prefix-cache-scorer\n  parameters: {params}\n"),
            "  - {pluginRef: prefix-cache-scorer}\n",
        ));
        assert!(
            err.contains(&format!("plugins[0].parameters.{field}")),
            "{err}"
        );
    }
}

/// The deprecated `blockSize` is taken as `blockSizeTokens` (llm-d): with
/// 32-token blocks (128 characters) a 64-character shared head matches no
/// whole block.
#[test]
fn deprecated_block_size_sets_the_block_size() {
    let text = |params: &str| {
        config(
            &format!(
                "- type: approx-prefix-cache-producer\n  parameters: {{autoTune: false{params}}}\n\
                 - type: prefix-cache-scorer\n"
            ),
            "  - {pluginRef: prefix-cache-scorer}\n",
        )
    };
    let head = "h".repeat(BLOCK);
    let first = format!("{head}{}", "a".repeat(3 * BLOCK));
    let second = format!("{head}{}", "b".repeat(3 * BLOCK));
    let snapshot = snapshot(1);
    let second_score = |built: &BuiltConfig| {
        built
            .scheduler
            .schedule(&request(first.clone()), &snapshot)
            .unwrap();
        let b = built
            .scheduler
            .schedule(&request(second.clone()), &snapshot)
            .unwrap();
        b.primary_run().unwrap().scores[0]
    };
    assert!((second_score(&load(&text(""))) - 0.25).abs() < 1e-9);
    assert!(second_score(&load(&text(", blockSize: 32"))).abs() < 1e-9);
}

/// The producer-name keys llm-d's current plugins take (which of several
/// in-flight-load, prediction or prefix producers to read) load: this picker
/// has one of each per request, so they select nothing, but a config that
/// names them is llm-d's and must load. `ttftSource: latencyPredictor` needs
/// no prefill throughput, as in llm-d.
#[test]
fn llm_d_producer_name_keys_load() {
    let plugins = [
        "- type: predicted-latency-producer",
        "  parameters: {inFlightLoadProducerName: inflight}",
        "- type: latency-scorer",
        "  parameters: {latencyPredictionInfoProducerName: predicted-latency-producer,",
        "    prefixMatchInfoProducerName: approx-prefix-cache-producer}",
        "- type: slo-headroom-tier-filter",
        "  parameters: {latencyPredictionInfoProducerName: predicted-latency-producer}",
        "- type: prefix-cache-affinity-filter",
        "  parameters: {ttftSource: latencyPredictor, peakPrefillThroughput: 0,",
        "    latencyPredictionInfoProducerName: predicted-latency-producer,",
        "    inFlightLoadProducerName: inflight}",
        "- type: concurrency-detector",
        "  parameters: {inFlightLoadProducerName: inflight}",
        "- type: utilization-filter",
        "  parameters: {conditions: [{metric: active-requests, maxValue: 10}],",
        "    inFlightLoadProducerName: inflight}",
        "- type: max-score-picker",
        "",
    ];
    let profile = [
        "  - {pluginRef: slo-headroom-tier-filter}",
        "  - {pluginRef: prefix-cache-affinity-filter}",
        "  - {pluginRef: concurrency-detector}",
        "  - {pluginRef: utilization-filter}",
        "  - {pluginRef: latency-scorer}",
        "  - {pluginRef: max-score-picker}",
        "",
    ];
    let built = load(&config(&plugins.join("\n"), &profile.join("\n")));
    built
        .scheduler
        .schedule(&request("p".to_owned()), &snapshot(2))
        .unwrap();
    // With the throughput estimate, a throughput of 0 is still refused.
    let err = load_err(&config(
        "- type: prefix-cache-affinity-filter\n  parameters: {peakPrefillThroughput: 0}\n",
        "  - {pluginRef: prefix-cache-affinity-filter}\n",
    ));
    assert!(err.contains("peakPrefillThroughput"), "{err}");
}

/// `headroom`, `concurrencyMode` and `maxTokenConcurrency` load, and the
/// detector used as a filter applies them: in `tokens` mode an endpoint at
/// `maxTokenConcurrency × (1 + headroom)` in-flight tokens is left out.
#[test]
fn concurrency_detector_tokens_mode_with_headroom() {
    let built = load(&config(
        "- type: concurrency-detector\n  \
         parameters: {concurrencyMode: tokens, maxTokenConcurrency: 1000, headroom: 0.5, maxConcurrency: 1}\n\
         - type: utilization-detector\n  parameters: {headroom: 0.2}\n\
         - type: queue-scorer\n",
        "  - {pluginRef: concurrency-detector}\n  - {pluginRef: queue-scorer}\n",
    ));
    let snapshot = snapshot(2);
    let e0 = snapshot.get(EndpointId(0)).unwrap();
    let e1 = snapshot.get(EndpointId(1)).unwrap();
    e0.inflight().start(1500);
    for _ in 0..5 {
        e1.inflight().start(100);
    }
    for i in 0..20 {
        let res = built
            .scheduler
            .schedule(&request(format!("p{i}")), &snapshot)
            .unwrap();
        assert_eq!(
            res.primary().unwrap().id(),
            EndpointId(1),
            "1500 tokens ≥ 1000 × 1.5; request counts do not matter in tokens mode"
        );
    }
    let err = load_err(&config(
        "- type: concurrency-detector\n  parameters: {concurrencyMode: bytes}\n",
        "  - {pluginRef: concurrency-detector}\n",
    ));
    assert!(err.contains("plugins[0].parameters"), "{err}");
    let err = load_err(&config(
        "- type: utilization-detector\n  parameters: {headroom: -0.1}\n",
        "  - {pluginRef: utilization-detector}\n",
    ));
    assert!(err.contains("plugins[0].parameters.headroom"), "{err}");
}

/// `flowControl.defaultPriorityBand` and `usageLimitPolicyPluginRef` are
/// part of the schema and validated; llm-d's built-in policies need no
/// declaration; a dangling reference is an error.
#[test]
fn flow_control_default_band_and_usage_limit_policy() {
    let base = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n\
                plugins:\n- type: queue-scorer\nflowControl:\n";
    let built = load(&format!(
        "{base}  usageLimitPolicyPluginRef: static-usage-limit-policy\n  defaultPriorityBand:\n    \
         maxBytes: 1Gi\n    maxRequests: 500\n    fairnessPolicyRef: global-strict-fairness-policy\n    \
         orderingPolicyRef: fcfs-ordering-policy\n"
    ));
    let fc = built.flow_control.unwrap();
    let band = fc.default_priority_band.unwrap();
    assert_eq!(
        band.max_requests,
        Some(serde_yaml_ng::Value::Number(500.into()))
    );
    assert_eq!(
        fc.usage_limit_policy_plugin_ref.as_deref(),
        Some("static-usage-limit-policy")
    );
    assert!(built.effective_yaml.contains("defaultPriorityBand"));
    // llm-d's other flow-control keys, as its operations guide writes them.
    let built = load(&format!(
        "{base}  maxBytes: 10Gi\n  maxRequests: 5k\n  defaultRequestTTL: 60s\n  \
         noEndpointRequestTTL: 5m\n  enableEviction: true\n  defaultNegativePriorityBand:\n    \
         maxRequests: 10\n  priorityBands:\n  - {{priority: 10, maxBytes: 1G}}\n  - {{priority: -1}}\n"
    ));
    let fc = built.flow_control.unwrap();
    assert_eq!(fc.priority_bands.len(), 2);
    assert_eq!(fc.enable_eviction, Some(true));

    let cases = [
        (
            "  usageLimitPolicyPluginRef: soft-reflective-ceiling-policy\n",
            "llmd.yaml:7:3: flowControl.usageLimitPolicyPluginRef: no plugin named",
        ),
        (
            "  usageLimitPolicyPluginRef: queue-scorer\n",
            "is not a usage-limit policy",
        ),
        (
            "  defaultPriorityBand:\n    fairnessPolicyRef: program-aware-fairness\n",
            "flowControl.defaultPriorityBand.fairnessPolicyRef: no plugin named",
        ),
        (
            "  defaultPriorityBand:\n    maxBytes: 10GB\n",
            "flowControl.defaultPriorityBand.maxBytes: \"10GB\" is not a quantity",
        ),
        (
            "  defaultPriorityBand:\n    weight: 3\n",
            "unknown field `weight`",
        ),
        (
            "  priorityBands:\n  - {priority: 1}\n  - {priority: 1, maxRequests: 5}\n",
            "flowControl.priorityBands[1].priority: duplicate priority level 1",
        ),
        (
            "  priorityBands:\n  - {priority: 0, orderingPolicyRef: nowhere}\n",
            "flowControl.priorityBands[0].orderingPolicyRef: no plugin named",
        ),
        (
            "  defaultPriorityBand:\n    busiestFlowCeiling: 1.5\n",
            "flowControl.defaultPriorityBand.busiestFlowCeiling: 1.5 is not a saturation in (0, 1]",
        ),
        (
            "  priorityBands:\n  - {priority: 2, busiestFlowCeiling: 0}\n",
            "flowControl.priorityBands[0].busiestFlowCeiling: 0 is not a saturation",
        ),
        (
            "  maxRequests: lots\n",
            "flowControl.maxRequests: \"lots\" is not a quantity",
        ),
        (
            "  defaultRequestTTL: 60\n",
            "flowControl.defaultRequestTTL: \"60\" is not a duration",
        ),
        (
            "  defaultNegativePriorityBand:\n    maxBytes: -1\n",
            "flowControl.defaultNegativePriorityBand.maxBytes",
        ),
    ];
    for (yaml, want) in cases {
        let err = load_err(&format!("{base}{yaml}"));
        assert!(err.contains(want), "{yaml}: {err}");
    }
}

/// With the `flowControl` gate on, the section becomes the controller's
/// settings: declared policies by name, built-in defaults for the rest,
/// quantities and durations read.
#[test]
fn flow_control_settings_are_built_from_the_section() {
    let built = load(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n\
         plugins:\n- type: queue-scorer\n- type: round-robin-fairness-policy\n\
         - type: priority-holdback-policy\n  name: holdback\n  parameters: {minCeiling: 0.5}\n\
         - type: edf-ordering-policy\n\
         flowControl:\n  maxBytes: 1Ki\n  maxRequests: 5k\n  defaultRequestTTL: 1m30s\n  \
         usageLimitPolicyPluginRef: holdback\n  priorityBands:\n  - priority: 10\n    \
         maxRequests: 7\n    fairnessPolicyRef: round-robin-fairness-policy\n    \
         orderingPolicyRef: edf-ordering-policy\n    busiestFlowCeiling: 0.8\n",
    );
    let fc = built.flow_settings.expect("gate on");
    assert_eq!((fc.max_bytes, fc.max_requests), (1024, 5000));
    assert_eq!(fc.default_ttl, Some(std::time::Duration::from_secs(90)));
    assert_eq!(
        fc.usage_limit.plugin().type_name(),
        "priority-holdback-policy"
    );
    let band = fc.band_for(10);
    assert_eq!(band.max_requests, 7);
    assert_eq!(band.max_bytes, epp_core::flow::DEFAULT_BAND_MAX_BYTES);
    assert_eq!(
        band.fairness.plugin().type_name(),
        "round-robin-fairness-policy"
    );
    assert_eq!(band.ordering.plugin().type_name(), "edf-ordering-policy");
    assert_eq!(band.busiest_flow_ceiling, Some(0.8));
    // Another priority: the default template with llm-d's built-ins.
    let other = fc.band_for(-3);
    assert_eq!(other.priority, -3);
    assert_eq!(
        other.fairness.plugin().type_name(),
        "global-strict-fairness-policy"
    );
    assert_eq!(other.ordering.plugin().type_name(), "fcfs-ordering-policy");
    assert_eq!(
        other.busiest_flow_ceiling, None,
        "llm-d's behaviour unless asked"
    );
    assert_eq!(
        other.max_requests,
        epp_core::flow::DEFAULT_BAND_MAX_REQUESTS
    );
    // Gate off: the section is checked but builds nothing.
    let off = load(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n\
         flowControl:\n  maxRequests: 5\n",
    );
    assert!(off.flow_settings.is_none());
}

/// llm-d's budgets when a key is absent or "0s", and its reading of a band's
/// 0 limits as "unset".
#[test]
fn flow_control_ttls_and_zero_limits_read_as_llm_d_reads_them() {
    use std::time::Duration;
    let settings = |section: &str| {
        load(&format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n\
             featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n{section}"
        ))
        .flow_settings
        .expect("gate on")
    };
    let minute = Some(Duration::from_secs(60));
    // No section, or no TTL keys: 60 s both ways.
    for section in ["", "flowControl:\n  maxRequests: 5\n"] {
        let fc = settings(section);
        assert_eq!((fc.default_ttl, fc.no_endpoint_ttl), (minute, minute));
    }
    // The no-endpoint budget follows the default one, "0s" included.
    let fc = settings("flowControl:\n  defaultRequestTTL: 5s\n");
    let five = Some(Duration::from_secs(5));
    assert_eq!((fc.default_ttl, fc.no_endpoint_ttl), (five, five));
    let fc = settings("flowControl:\n  defaultRequestTTL: 0s\n");
    assert_eq!((fc.default_ttl, fc.no_endpoint_ttl), (None, None));
    // Set apart; "0s" turns the no-endpoint eviction off alone.
    let fc = settings("flowControl:\n  defaultRequestTTL: 5s\n  noEndpointRequestTTL: 5m\n");
    assert_eq!(
        (fc.default_ttl, fc.no_endpoint_ttl),
        (five, Some(Duration::from_secs(300)))
    );
    let fc = settings("flowControl:\n  noEndpointRequestTTL: 0s\n");
    assert_eq!((fc.default_ttl, fc.no_endpoint_ttl), (minute, None));
    // A band's 0 is its default; the global 0 is no limit.
    let fc = settings(
        "flowControl:\n  maxRequests: 0\n  priorityBands:\n  \
         - {priority: 1, maxRequests: 0, maxBytes: 0}\n",
    );
    assert_eq!(fc.max_requests, 0);
    let band = fc.band_for(1);
    assert_eq!(
        (band.max_requests, band.max_bytes),
        (
            epp_core::flow::DEFAULT_BAND_MAX_REQUESTS,
            epp_core::flow::DEFAULT_BAND_MAX_BYTES
        )
    );
}

/// llm-d's `encode-filter` keeps the endpoints whose `llm-d.ai/role` is an
/// encode role; endpoints without a role are dropped.
#[test]
fn encode_filter_keeps_encode_roles() {
    let built = load(&config(
        "- type: encode-filter\n- type: random-picker\n",
        "  - {pluginRef: encode-filter}\n  - {pluginRef: random-picker}\n",
    ));
    let roles = [
        Some("encode"),
        Some("decode"),
        Some("encode-prefill"),
        None,
        Some("prefill"),
    ];
    let snapshot = EndpointSnapshot::new(with_roles(&roles));
    let mut seen: Vec<u32> = (0..64)
        .map(|i| {
            let res = built
                .scheduler
                .schedule(&request(format!("p{i}")), &snapshot)
                .unwrap();
            res.primary().unwrap().id().0
        })
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, vec![0, 2]);
}

/// llm-d's `utilization-filter`, as its README configures it: endpoints over
/// a ceiling are dropped, and with `fallbackOnEmpty` a pool where every
/// endpoint is over one still gets a pick.
#[test]
fn utilization_filter_as_llm_d_documents_it() {
    let built = load(&config(
        "- type: utilization-filter\n  name: drop-overloaded-endpoints\n  parameters:\n    \
         conditions:\n    - {metric: running-requests, maxValue: 40}\n    \
         - {metric: waiting-queue, maxValue: 0}\n    \
         - {metric: kv-cache-utilization, maxValue: 0.8}\n    fallbackOnEmpty: true\n\
         - type: random-picker\n",
        "  - {pluginRef: drop-overloaded-endpoints}\n  - {pluginRef: random-picker}\n",
    ));
    let snapshot = snapshot(3);
    let set = |i: u32, waiting: u32, kv_usage: f64| {
        snapshot
            .get(EndpointId(i))
            .unwrap()
            .set_metrics(EndpointMetrics {
                waiting,
                kv_usage,
                ..EndpointMetrics::fresh()
            });
    };
    set(0, 1, 0.1);
    set(1, 0, 0.5);
    set(2, 0, 0.85);
    let picks = |n: usize| {
        let mut seen: Vec<u32> = (0..n)
            .map(|i| {
                let res = built
                    .scheduler
                    .schedule(&request(format!("p{i}")), &snapshot)
                    .unwrap();
                res.primary().unwrap().id().0
            })
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen
    };
    assert_eq!(picks(32), vec![1]);
    set(1, 4, 0.5);
    assert_eq!(
        picks(64),
        vec![0, 1, 2],
        "all over a ceiling: fallback to all"
    );
}

/// llm-d's parser list, as its parsers README writes it.
#[test]
fn openai_and_anthropic_parsers_under_request_handler() {
    let built = load(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
         - {name: maxScore, type: max-score-picker}\n\
         - {name: openaiParser, type: openai-parser}\n\
         - {name: anthropicParser, type: anthropic-parser}\n\
         schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: maxScore\n\
         requestHandler:\n  parsers:\n  - pluginRef: openaiParser\n  - pluginRef: anthropicParser\n",
    );
    let types: Vec<&str> = built
        .plugins
        .iter()
        .map(|(_, p)| p.plugin().type_name())
        .collect();
    assert!(types.contains(&"anthropic-parser"), "{types:?}");
}

/// llm-d's `inflight-load-producer`, as its README configures it, with the
/// scorers that name it: the config loads, and a request dispatched by the
/// built scheduler counts by its rules: the prompt until the first streamed
/// bytes, an output estimate (1.5 × the prompt) until the end. Without the
/// plugin the prompt counts to the end and no output does.
#[test]
fn inflight_load_producer_sets_how_tokens_count() {
    let plugins = |producer: &str| {
        format!(
            "{producer}- type: token-load-scorer\n  parameters: {{inFlightLoadProducerName: \
             inflight-load}}\n- type: active-request-scorer\n  parameters: \
             {{inFlightLoadProducerName: inflight-load}}\n- type: max-score-picker\n"
        )
    };
    let profile = "  - {pluginRef: token-load-scorer}\n  - {pluginRef: active-request-scorer}\n  \
                   - {pluginRef: max-score-picker}\n";
    let producer = "- type: inflight-load-producer\n  name: inflight-load\n  parameters:\n    \
                    addEstimatedOutputTokens: true\n";
    // 400 characters: 100 prompt tokens.
    let run = |text: &str| {
        let built = load(text);
        let scheduler = std::sync::Arc::new(built.scheduler);
        let eps = snapshot(1);
        let req = request("p".repeat(400));
        let result = scheduler.schedule(&req, &eps).unwrap();
        let mut dispatch = result.dispatch(scheduler, req).unwrap();
        let e = &eps.endpoints()[0];
        let tokens = |e: &epp_core::Endpoint| e.inflight().tokens();
        let at_dispatch = tokens(e);
        dispatch.first_body_bytes(true);
        let after_first = (e.inflight().requests(), tokens(e));
        drop(dispatch);
        assert_eq!(e.inflight().sample(), Default::default());
        (at_dispatch, after_first)
    };
    assert_eq!(run(&config(&plugins(producer), profile)), (250, (1, 150)));
    assert_eq!(run(&config(&plugins(""), profile)), (100, (1, 100)));
    let err = load_err(&config(
        "- type: inflight-load-producer\n  parameters: {outputRatio: -1}\n- type: max-score-picker\n",
        "  - {pluginRef: max-score-picker}\n",
    ));
    assert!(err.contains("outputRatio"), "{err}");
}
