//! Disaggregated serving and data-parallel ranks as llm-d's shipped configs
//! (`../shared/reference/llm-d-configs`, beside the checkout) describe them:
//! each loads unchanged and routes as its comments say.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, sync::Arc};

use epp_core::{
    Endpoint, EndpointSnapshot, InferenceRequest, SchedulingResult,
    config::{BuiltConfig, EndpointPickerConfig},
};
use epp_plugins::{DATA_PARALLEL_HEADER, ENCODERS_HEADER, PREFILL_HEADER, builtin_registry};
use epp_test_support::endpoints::with_roles;

fn llm_d_config(file: &str) -> BuiltConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/llm-d-configs")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the shared/ directory sits beside the checkout)",
            path.display()
        )
    });
    EndpointPickerConfig::parse(&text, file)
        .unwrap()
        .build(&builtin_registry())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn load(text: &str) -> Result<BuiltConfig, String> {
    EndpointPickerConfig::parse(text, "pd.yaml")
        .and_then(|c| c.build(&builtin_registry()))
        .map_err(|e| e.to_string())
}

fn header<'r>(r: &'r SchedulingResult, name: &str) -> Option<&'r str> {
    r.edits
        .headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

fn role(e: &Arc<Endpoint>) -> &str {
    e.label("llm-d.ai/role").unwrap_or("none")
}

/// Two prefill servers (0, 1) and two decode servers (2, 3).
fn pd_fleet() -> EndpointSnapshot {
    EndpointSnapshot::new(with_roles(&[
        Some("prefill"),
        Some("prefill"),
        Some("decode"),
        Some("decode"),
    ]))
}

fn prompt(chars: usize, seed: u8) -> InferenceRequest {
    let text: String = (0..chars)
        .map(|i| char::from(b'a' + ((i * 7 + usize::from(seed)) % 26) as u8))
        .collect();
    InferenceRequest::builder("m").prompt(text).build()
}

/// pd-epp-config.yaml: a long uncached prompt is prefilled on a prefill
/// server and decoded on a decode server; the same prompt again is cached on
/// that decode server, so it is served there alone.
#[test]
fn pd_config_disaggregates_uncached_prompts_only() {
    for file in ["pd-epp-config.yaml", "sim-pd-epp-config.yaml"] {
        let built = llm_d_config(file);
        let fleet = pd_fleet();
        let req = prompt(4000, 1);
        let first = built.scheduler.schedule(&req, &fleet).unwrap();
        let decode = first.primary().unwrap();
        assert_eq!(role(decode), "decode", "{file}");
        let prefill = first
            .prefill()
            .expect("uncached 1000 tokens ≥ 16: prefill runs");
        assert_eq!(role(prefill), "prefill", "{file}");
        assert_eq!(header(&first, PREFILL_HEADER), Some(prefill.addr_str()));
        assert_eq!(first.runs.len(), 2, "{file}");
        assert!(first.edits.owned_headers.contains(&PREFILL_HEADER));

        // The decode pick now holds the prompt: the uncached rest is short.
        let again = built.scheduler.schedule(&req, &fleet).unwrap();
        assert_eq!(again.primary().unwrap().id(), decode.id(), "{file}");
        assert!(again.prefill().is_none(), "{file}: cached, no prefill");
        assert_eq!(header(&again, PREFILL_HEADER), None);
        assert!(
            again.edits.owned_headers.contains(&PREFILL_HEADER),
            "a client's header is dropped"
        );

        // A short prompt (< nonCachedTokens 16) is never disaggregated.
        let short = built.scheduler.schedule(&prompt(40, 2), &fleet).unwrap();
        assert!(short.prefill().is_none(), "{file}");
        assert_eq!(role(short.primary().unwrap()), "decode");
    }
}

/// The prefill server computed the prompt: the prefix index records it there
/// too, so the same prompt sent to a fleet with no free decode choice (one
/// decode server) prefers, for its prefill, the prefill server that holds it.
#[test]
fn the_prefill_pick_is_recorded_in_the_prefix_index() {
    let built = llm_d_config("pd-epp-config.yaml");
    let fleet = EndpointSnapshot::new(with_roles(&[
        Some("prefill"),
        Some("prefill"),
        Some("prefill"),
        Some("decode"),
        Some("decode"),
    ]));
    // Five prompts: by chance alone (three tied prefill servers) all five
    // would follow with probability 1/81.
    for seed in 10..15 {
        let a = prompt(4000, seed);
        let first = built.scheduler.schedule(&a, &fleet).unwrap();
        let prefill = Arc::clone(first.prefill().unwrap());
        // The same 4,000 characters and 1,000 more: the decode pick holds the
        // first part, the uncached rest (250 tokens) still needs a prefill,
        // and the prefill server that computed the first part wins on prefix.
        let mut longer = a.prompt.clone();
        longer.push_str(&prompt(1000, seed + 100).prompt);
        let second = built
            .scheduler
            .schedule(
                &InferenceRequest::builder("m").prompt(longer).build(),
                &fleet,
            )
            .unwrap();
        assert_eq!(second.prefill().unwrap().id(), prefill.id(), "seed {seed}");
    }
}

/// sim-e-p-d-epp-config.yaml: a request with an image runs encode, prefill
/// and decode; a text one prefill and decode.
#[test]
fn epd_config_encodes_media_only() {
    let built = llm_d_config("sim-e-p-d-epp-config.yaml");
    let fleet = EndpointSnapshot::new(with_roles(&[
        Some("encode"),
        Some("prefill"),
        Some("decode"),
    ]));
    let text = prompt(4000, 5);
    let r = built.scheduler.schedule(&text, &fleet).unwrap();
    assert_eq!(role(r.primary().unwrap()), "decode");
    assert_eq!(header(&r, ENCODERS_HEADER), None);
    assert_eq!(
        header(&r, PREFILL_HEADER),
        Some(fleet.endpoints()[1].addr_str())
    );

    let mut image = prompt(4000, 6);
    image.media_parts = 1;
    let r = built.scheduler.schedule(&image, &fleet).unwrap();
    assert_eq!(
        header(&r, ENCODERS_HEADER),
        Some(fleet.endpoints()[0].addr_str())
    );
    assert_eq!(
        header(&r, PREFILL_HEADER),
        Some(fleet.endpoints()[1].addr_str())
    );
    assert_eq!(r.runs.len(), 3);
}

/// sim-e-pd-epp-config.yaml: encode on its own server for media, prefill and
/// decode together.
#[test]
fn e_pd_config() {
    let built = llm_d_config("sim-e-pd-epp-config.yaml");
    let fleet = EndpointSnapshot::new(with_roles(&[Some("encode"), Some("decode")]));
    let mut image = prompt(100, 7);
    image.media_parts = 2;
    let r = built.scheduler.schedule(&image, &fleet).unwrap();
    assert_eq!(r.primary().unwrap().id(), fleet.endpoints()[1].id());
    assert_eq!(
        header(&r, ENCODERS_HEADER),
        Some(fleet.endpoints()[0].addr_str())
    );
    assert_eq!(header(&r, PREFILL_HEADER), None);
    let r = built.scheduler.schedule(&prompt(100, 8), &fleet).unwrap();
    assert!(r.edits.headers.is_empty());
}

/// dp-epp-config.yaml: a rank is picked, named in the header, and the
/// request goes to the pod's primary port.
#[test]
fn dp_config_names_the_rank_and_forwards_to_the_primary_port() {
    let built = llm_d_config("dp-epp-config.yaml");
    let fleet = EndpointSnapshot::new(with_roles(&[None, None, None]));
    let r = built.scheduler.schedule(&prompt(400, 9), &fleet).unwrap();
    let rank = r.primary().unwrap();
    assert_eq!(header(&r, DATA_PARALLEL_HEADER), Some(rank.addr_str()));
    assert_eq!(r.edits.forward_port, Some(8000));
}

/// The deciders are wired by name; mistakes are load errors at the field.
#[test]
fn wiring_errors_name_the_field() {
    let base = |handler_params: &str, profiles: &str| {
        format!(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
             - type: prefill-filter\n- type: decode-filter\n- type: queue-scorer\n\
             - type: prefix-based-pd-decider\n  parameters: {{nonCachedTokens: 16}}\n\
             - type: disagg-profile-handler\n  parameters:\n{handler_params}\
             schedulingProfiles:\n{profiles}"
        )
    };
    let both = "- name: prefill\n  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]\n\
                - name: decode\n  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]\n";
    assert!(
        load(&base(
            "    deciders: {prefill: prefix-based-pd-decider}\n",
            both
        ))
        .is_ok()
    );

    let e = load(&base("    deciders: {prefill: nope}\n", both)).unwrap_err();
    assert!(
        e.contains("deciders.prefill") && e.contains("\"nope\""),
        "{e}"
    );

    let e = load(&base("    deciders: {prefill: queue-scorer}\n", both)).unwrap_err();
    assert!(e.contains("is not a decider"), "{e}");

    let decode_only = "- name: prefill\n  plugins: [{pluginRef: prefill-filter}]\n";
    let e = load(&base(
        "    deciders: {prefill: prefix-based-pd-decider}\n",
        decode_only,
    ))
    .unwrap_err();
    assert!(
        e.contains("decode profile \"decode\" is not declared"),
        "{e}"
    );

    let e = load(&base("    stageOrder: sideways\n", both)).unwrap_err();
    assert!(e.contains("stageOrder"), "{e}");
}

/// pd-topology-epp-config.yaml: the prefill pick is on the decode pick's host
/// when a prefill server is there (filter at `host`, scorer's curve), on a
/// server of its rack otherwise; with no locality known it is routed as
/// without the plugins (fail open).
#[test]
fn topology_config_places_prefill_next_to_decode() {
    let built = llm_d_config("pd-topology-epp-config.yaml");
    let host = "kubernetes.io/hostname";
    let rack = "topology.kubernetes.io/rack";
    let ep = |i: u32, role: &str, h: &str, r: &str| {
        epp_test_support::endpoints::labelled(i, &[("llm-d.ai/role", role), (host, h), (rack, r)])
    };
    // One decode server (on h2, rack r1); prefill servers on h1 (r1), h2
    // (r1), h3 (r2).
    let fleet = EndpointSnapshot::new(vec![
        ep(0, "prefill", "h1", "r1"),
        ep(1, "prefill", "h2", "r1"),
        ep(2, "prefill", "h3", "r2"),
        ep(3, "decode", "h2", "r1"),
    ]);
    for seed in 20..26 {
        let r = built
            .scheduler
            .schedule(&prompt(4000, seed), &fleet)
            .unwrap();
        assert_eq!(r.primary().unwrap().id(), fleet.endpoints()[3].id());
        assert_eq!(
            r.prefill().unwrap().id(),
            fleet.endpoints()[1].id(),
            "same host"
        );
    }
    // Without a prefill server on its host, the rack's wins over another rack's.
    let fleet = EndpointSnapshot::new(vec![
        ep(0, "prefill", "h1", "r1"),
        ep(2, "prefill", "h3", "r2"),
        ep(3, "decode", "h2", "r1"),
    ]);
    for seed in 30..36 {
        let r = built
            .scheduler
            .schedule(&prompt(4000, seed), &fleet)
            .unwrap();
        assert_eq!(
            r.prefill().unwrap().id(),
            fleet.endpoints()[0].id(),
            "same rack"
        );
    }
    // No locality: still disaggregated, over every prefill server.
    let r = built
        .scheduler
        .schedule(&prompt(4000, 40), &pd_fleet())
        .unwrap();
    assert_eq!(role(r.prefill().unwrap()), "prefill");
}

/// A topology plugin names its source; a missing or wrong one is a load
/// error at that parameter.
#[test]
fn topology_source_must_exist() {
    let text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
                - type: topology-affinity-scorer\n  parameters: {topologyProducerName: where}\n\
                - type: queue-scorer\n\
                schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: topology-affinity-scorer\n";
    let e = load(text).unwrap_err();
    assert!(
        e.contains("topologyProducerName") && e.contains("\"where\""),
        "{e}"
    );
    let e = load(&text.replace("where", "queue-scorer")).unwrap_err();
    assert!(e.contains("does not produce endpoint topology"), "{e}");
}

/// The decider reads the default producer's matches even when the profiles'
/// prefix scorer reads another producer's (here one that matches at most 2
/// blocks): a long prompt the decode pick holds is not prefilled again
/// (read through the short producer, 32 cached tokens of ~1,000 would say
/// it must be).
#[test]
fn the_decider_reads_the_default_producers_matches_beside_another_one() {
    let text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
- type: approx-prefix-cache-producer\n  name: short\n  parameters: {autoTune: false, maxPrefixTokensToMatch: 32}\n\
- type: prefix-cache-scorer\n  parameters: {prefixMatchInfoProducerName: short}\n\
- type: queue-scorer\n- type: prefill-filter\n- type: decode-filter\n- type: max-score-picker\n\
- type: prefix-based-pd-decider\n  parameters: {nonCachedTokens: 16}\n\
- type: disagg-profile-handler\n  parameters: {deciders: {prefill: prefix-based-pd-decider}}\n\
schedulingProfiles:\n\
- name: prefill\n  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: prefix-cache-scorer}]\n\
- name: decode\n  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: prefix-cache-scorer}]\n";
    let built = load(text).unwrap_or_else(|e| panic!("{e}"));
    let fleet = EndpointSnapshot::new(with_roles(&[Some("prefill"), Some("decode")]));
    let req = prompt(4000, 50);
    let first = built.scheduler.schedule(&req, &fleet).unwrap();
    assert!(first.prefill().is_some(), "uncached: prefilled apart");
    let again = built.scheduler.schedule(&req, &fleet).unwrap();
    assert!(
        again.prefill().is_none(),
        "held on the approximate index: no prefill"
    );
}

/// The prefill pick carries the request until its prefill is done: a burst
/// of uncached prompts spreads over the prefill servers between scrapes
/// (their queue scores count epp's own dispatches), and the count is
/// released when the decode server's response begins.
#[test]
fn the_prefill_server_counts_the_request_until_its_prefill_is_done() {
    let built = llm_d_config("pd-epp-config.yaml");
    let fleet = pd_fleet();
    let scheduler = std::sync::Arc::new(built.scheduler);
    let dispatch = |seed| {
        let req = prompt(4000, seed);
        let r = scheduler.schedule(&req, &fleet).unwrap();
        r.dispatch(std::sync::Arc::clone(&scheduler), req).unwrap()
    };
    let mut first = dispatch(60);
    let p1 = std::sync::Arc::clone(first.prefill_endpoint().unwrap());
    assert_eq!(p1.inflight().requests(), 1);
    let second = dispatch(61);
    let p2 = std::sync::Arc::clone(second.prefill_endpoint().unwrap());
    assert_ne!(p1.id(), p2.id(), "the busy prefill server is avoided");
    first.prefill_done();
    assert_eq!(
        p1.inflight().requests(),
        0,
        "released when the prefill is done"
    );
    assert!(first.prefill_endpoint().is_none());
    drop(second);
    assert_eq!(p2.inflight().requests(), 0, "and when the request ends");
}

/// Every decision is counted by kind under llm-d's names.
#[test]
fn decisions_are_counted_by_kind() {
    /// A counter: family, labels, value.
    type Series = (String, Vec<(String, String)>, u64);
    struct Sink(Vec<Series>);
    impl epp_core::MetricSink for Sink {
        fn gauge(&mut self, _: epp_core::MetricFamily, _: &[(&str, &str)], _: f64) {}
        fn counter(&mut self, f: epp_core::MetricFamily, labels: &[(&str, &str)], v: u64) {
            let labels = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.0.push((f.name.to_owned(), labels, v));
        }
        fn histogram(
            &mut self,
            _: epp_core::MetricFamily,
            _: &[(&str, &str)],
            _: &[(f64, u64)],
            _: f64,
            _: u64,
        ) {
        }
    }
    let built = llm_d_config("pd-epp-config.yaml");
    let fleet = pd_fleet();
    let req = prompt(4000, 70);
    built.scheduler.schedule(&req, &fleet).unwrap(); // prefill-decode
    built.scheduler.schedule(&req, &fleet).unwrap(); // decode-only (cached)
    built.scheduler.schedule(&req, &fleet).unwrap(); // decode-only
    let handler = built
        .plugins
        .iter()
        .find(|(_, p)| p.plugin().type_name() == "disagg-profile-handler")
        .map(|(_, p)| p.clone())
        .unwrap();
    let mut sink = Sink(Vec::new());
    handler
        .plugin()
        .as_plugin_metrics()
        .unwrap()
        .report(&mut sink);
    let count = |kind: &str| {
        sink.0
            .iter()
            .find(|(name, labels, _)| {
                name == "llm_d_epp_disagg_decision"
                    && labels
                        .iter()
                        .any(|(k, v)| k == "decision_type" && v == kind)
            })
            .map_or(0, |s| s.2)
    };
    assert_eq!(
        (count("prefill-decode"), count("decode-only")),
        (1, 2),
        "{:?}",
        sink.0
    );
    assert!(
        sink.0
            .iter()
            .any(|(name, _, _)| name == "llm_d_inference_scheduler_disagg_decision")
    );
}
