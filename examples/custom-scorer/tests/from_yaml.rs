//! The custom scorer, run from a YAML config next to the built-in plugins.

use std::{collections::BTreeMap, sync::Arc};

use epp_core::{
    Endpoint, EndpointId, EndpointMetrics, EndpointSnapshot, InferenceRequest,
    config::EndpointPickerConfig,
};

const CONFIG: &str = "
plugins:
- type: queue-scorer
- name: prefer-h200
  type: preferred-label-scorer
  parameters: {label: gpu, value: h200, otherwise: 0.1}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: prefer-h200, weight: 3}
  - {pluginRef: max-score-picker}
";

#[test]
fn a_registered_custom_scorer_runs_from_yaml() {
    let mut registry = epp_plugins::builtin_registry();
    custom_scorer::register(&mut registry);
    let built = EndpointPickerConfig::parse(CONFIG, "custom.yaml")
        .unwrap()
        .build(&registry)
        .unwrap();

    let endpoints: Vec<Arc<Endpoint>> = ["a100", "h200", "a100"]
        .iter()
        .enumerate()
        .map(|(i, gpu)| {
            let labels = BTreeMap::from([("gpu".to_owned(), (*gpu).to_owned())]);
            let e = Arc::new(Endpoint::with_labels(
                EndpointId(i as u32),
                format!("10.0.0.{i}:8000").parse().unwrap(),
                labels,
            ));
            // The H200 has a longer queue, but the preference outweighs it.
            e.set_metrics(EndpointMetrics {
                waiting: if i == 1 { 4 } else { 0 },
                ..EndpointMetrics::fresh()
            });
            e
        })
        .collect();
    let snapshot = EndpointSnapshot::new(endpoints);
    let request = InferenceRequest::builder("m").prompt("hello").build();
    let result = built.scheduler.schedule(&request, &snapshot).unwrap();
    assert_eq!(result.primary().unwrap().label("gpu"), Some("h200"));

    let bad = CONFIG.replace("otherwise: 0.1", "otherwise: 2");
    let err = EndpointPickerConfig::parse(&bad, "custom.yaml")
        .unwrap()
        .build(&registry)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("plugins[1].parameters.otherwise: 2: must be in [0, 1]"),
        "{err}"
    );
}
