//! Seeded properties of the built-in plugins, run through the real scheduler:
//! every scorer's output stays in [0, 1]; pickers return distinct candidates
//! that survived filtering; the prefix index never exceeds its capacity and
//! forgets removed endpoints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc};

use epp_core::{
    Candidate, CycleContext, CycleState, Endpoint, EndpointId, EndpointMetrics, InferenceRequest,
    LoraInfo, PluginSpec, PrefixMatch,
};
use epp_plugins::{PrefixIndex, builtin_registry};
use proptest::prelude::*;
use rand::{SeedableRng, rngs::SmallRng};

const SCORERS: [(&str, &str); 11] = [
    ("queue-scorer", "{}"),
    ("running-requests-size-scorer", "{}"),
    ("kv-cache-utilization-scorer", "{}"),
    ("prefix-cache-scorer", "{}"),
    ("lora-affinity-scorer", "{}"),
    ("token-load-scorer", "{queueThresholdTokens: 1000}"),
    ("load-aware-scorer", "{threshold: 10}"),
    (
        "active-request-scorer",
        "{idleThreshold: 1, maxBusyScore: 0.7}",
    ),
    ("session-affinity-scorer", "{}"),
    ("no-hit-lru-scorer", "{}"),
    (
        "metric-scorer",
        "{metricName: m, optimizationMode: Minimize, normalizationAlgo: Softmax}",
    ),
];

#[derive(Debug, Clone)]
struct Ep {
    waiting: u32,
    running: u32,
    kv: f64,
    inflight: u8,
    metric: Option<f64>,
    role: Option<&'static str>,
    loras: Vec<String>,
}

fn ep() -> impl Strategy<Value = Ep> {
    (
        0u32..200,
        0u32..200,
        prop_oneof![0.0..1.0f64, Just(0.0), Just(1.0), Just(1.5), Just(f64::NAN)],
        0u8..10,
        prop::option::of(prop_oneof![
            -1e6..1e6f64,
            Just(f64::INFINITY),
            Just(f64::NAN)
        ]),
        prop::option::of(prop_oneof![Just("prefill"), Just("decode"), Just("both")]),
        prop::collection::vec("[ab]", 0..3),
    )
        .prop_map(|(waiting, running, kv, inflight, metric, role, loras)| Ep {
            waiting,
            running,
            kv,
            inflight,
            metric,
            role,
            loras,
        })
}

fn candidates(eps: &[Ep]) -> Vec<Candidate> {
    eps.iter()
        .enumerate()
        .map(|(i, e)| {
            let mut labels = BTreeMap::new();
            if let Some(r) = e.role {
                labels.insert("llm-d.ai/role".to_owned(), r.to_owned());
            }
            let endpoint = Arc::new(Endpoint::with_labels(
                EndpointId(i as u32),
                format!("10.1.0.{i}:8000").parse().unwrap(),
                labels,
            ));
            let mut m = EndpointMetrics {
                waiting: e.waiting,
                running: e.running,
                kv_usage: e.kv,
                ..EndpointMetrics::fresh()
            };
            m.lora = LoraInfo {
                active: e.loras.clone(),
                waiting: Vec::new(),
                max_loras: 2,
                base_model: None,
            };
            if let Some(v) = e.metric {
                m.custom.insert("m".into(), v);
            }
            endpoint.set_metrics(m);
            for _ in 0..e.inflight {
                endpoint.inflight().start(100);
            }
            Candidate::new(&endpoint)
        })
        .collect()
}

fn spec(type_name: &str, params: &str) -> PluginSpec {
    PluginSpec::new(type_name).with_parameters(serde_yaml_ng::from_str(params).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn scores_stay_in_unit_interval(eps in prop::collection::vec(ep(), 1..12), prompt in "[a-z ]{0,400}", seed: u64) {
        let registry = builtin_registry();
        let cands = candidates(&eps);
        let req = InferenceRequest::builder("m").target_model("a").prompt(prompt).build();
        for (type_name, params) in SCORERS {
            let plugin = registry.build(&spec(type_name, params)).unwrap();
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut state = CycleState::default();
            let mut cx = CycleContext { request: &req, now: std::time::Instant::now(), rng: &mut rng, state: &mut state };
            if let Some(p) = plugin.as_data_producer() {
                p.produce(&mut cx, &cands);
            }
            let mut out = vec![0.0; cands.len()];
            plugin.as_scorer().unwrap().score(&cx, &cands, &mut out);
            for s in out {
                prop_assert!((0.0..=1.0).contains(&s), "{type_name} scored {s}");
            }
        }
    }

    #[test]
    fn pickers_return_distinct_filtered_candidates(eps in prop::collection::vec(ep(), 1..12), n in 1usize..5, seed: u64,
                                                   scores in prop::collection::vec(0.0..3.0f64, 12)) {
        let registry = builtin_registry();
        let req = InferenceRequest::builder("m").build();
        for filter in ["decode-filter", "prefill-filter", "utilization-detector", "concurrency-detector"] {
            for picker in ["max-score-picker", "random-picker", "weighted-random-picker"] {
                let f = registry.build(&PluginSpec::new(filter)).unwrap();
                let p = registry.build(&spec(picker, &format!("{{maxNumOfEndpoints: {n}}}"))).unwrap();
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut state = CycleState::default();
                let mut cx = CycleContext { request: &req, now: std::time::Instant::now(), rng: &mut rng, state: &mut state };
                let mut cands = candidates(&eps);
                let before: Vec<EndpointId> = cands.iter().map(Candidate::id).collect();
                f.as_filter().unwrap().filter(&mut cx, &mut cands);
                prop_assert!(cands.iter().all(|c| before.contains(&c.id())), "{filter} invented a candidate");
                let mut out = Vec::new();
                p.as_picker().unwrap().pick(&mut cx, &cands, &scores[..cands.len()], &mut out);
                prop_assert_eq!(out.len(), n.min(cands.len()), "{} after {}", picker, filter);
                let mut seen = out.clone();
                seen.sort_unstable();
                seen.dedup();
                prop_assert_eq!(seen.len(), out.len(), "{} repeated a pick", picker);
                prop_assert!(out.iter().all(|&i| i < cands.len()));
            }
        }
    }

    #[test]
    fn prefix_index_is_bounded_and_forgets(ops in prop::collection::vec((0u32..6, prop::collection::vec(0u64..64, 1..40), any::<bool>()), 1..60),
                                           capacity in 1usize..50) {
        let index = PrefixIndex::default();
        let mut removed = std::collections::HashSet::new();
        for (id, hashes, forget) in ops {
            let id = EndpointId(id);
            if forget {
                index.forget(id);
                removed.insert(id);
            } else {
                index.record(id, &hashes, capacity);
                removed.remove(&id);
            }
            for e in 0..6 {
                prop_assert!(index.len_for(EndpointId(e)) <= capacity);
            }
        }
        for id in removed {
            prop_assert_eq!(index.len_for(id), 0);
            let mut m = PrefixMatch::default();
            index.match_prefix(&(0..64).collect::<Vec<_>>(), &mut m);
            prop_assert_eq!(m.matched(id), 0, "a forgotten endpoint still matches");
        }
    }
}
