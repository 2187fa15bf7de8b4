use std::time::Instant;

use arc_swap::ArcSwap;
use epp_core::{
    Endpoint, EndpointMetrics, EndpointSnapshot, EndpointSource, MAX_LABEL_VALUES,
    config::EndpointPickerConfig, flow::FlowRequest,
};
use prometheus_client::{encoding::text::encode, registry::Registry};

use super::*;
use crate::{ExtProcOptions, ExtProcService, FOLDED_FAIRNESS_ID};

/// The page of `metrics` alone (no controller to read).
fn page(metrics: &Arc<FlowMetrics>, generations: MetricGenerations) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(FlowCollector {
        metrics: Arc::clone(metrics),
        decider: Weak::new(),
        generations,
    }));
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text
}

fn lines<'t>(text: &'t str, prefix: &str) -> Vec<&'t str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn fairness_ids_past_the_cap_fold_into_one_series() {
    let metrics = Arc::new(FlowMetrics::default());
    for i in 0..=MAX_LABEL_VALUES {
        let id = format!("tenant-{i}");
        metrics.queue_changed(&id, 0, 0, 1, 10);
        metrics.finished(&id, 0, 0, Outcome::Dispatched, Duration::from_millis(1));
    }
    // An id seen before the cap keeps its own series afterwards.
    metrics.queue_changed("tenant-0", 0, 0, -1, -10);
    let text = page(&metrics, MetricGenerations::ALL);
    let queue = |id: &str| {
        lines(&text, "inference_extension_flow_control_queue_size{")
            .into_iter()
            .filter(|l| l.contains(&format!("fairness_id=\"{id}\"")))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        queue("tenant-0"),
        [
            "inference_extension_flow_control_queue_size{fairness_id=\"tenant-0\",priority=\"0\",inference_pool=\"\",model_name=\"\",target_model_name=\"\"} 0"
        ]
    );
    assert_eq!(queue(&format!("tenant-{}", MAX_LABEL_VALUES - 1)).len(), 1);
    assert!(queue(&format!("tenant-{MAX_LABEL_VALUES}")).is_empty());
    assert_eq!(
        queue(FOLDED_FAIRNESS_ID),
        [
            "inference_extension_flow_control_queue_size{fairness_id=\"other\",priority=\"0\",inference_pool=\"\",model_name=\"\",target_model_name=\"\"} 1"
        ]
    );
    assert_eq!(
        lines(&text, "inference_extension_flow_control_queue_size{").len(),
        MAX_LABEL_VALUES + 1
    );
    // Every request left flow control dispatched: one count per request.
    assert!(
        text.contains(&format!(
            "llm_d_epp_flow_control_requests_total{{outcome=\"Dispatched\",priority=\"0\",inference_pool=\"\"}} {}",
            MAX_LABEL_VALUES + 1
        )),
        "{text}"
    );
}

#[test]
fn each_observation_is_served_under_both_prefixes_and_summed_per_priority() {
    let metrics = Arc::new(FlowMetrics::default());
    let ms = Duration::from_millis;
    metrics.enqueued("a", 0, 0, None, ms(1));
    metrics.enqueued("b", 0, 0, None, ms(1));
    metrics.enqueued("b", 0, 0, Some(Outcome::RejectedCapacity), ms(1));
    metrics.finished("b", 0, 0, Outcome::RejectedCapacity, Duration::ZERO);
    metrics.finished("a", 0, 0, Outcome::Dispatched, ms(30));
    metrics.finished("b", 0, 0, Outcome::Dispatched, ms(2));
    metrics.finished("a", 2, 0, Outcome::EvictedTtl, ms(900));
    metrics.dispatch_cycle(Duration::from_micros(40));
    metrics.dispatch_cycle(Duration::from_micros(40));
    let text = page(&metrics, MetricGenerations::ALL);
    for prefix in ["inference_extension", "llm_d_epp"] {
        for want in [
            format!(
                "{prefix}_flow_control_request_enqueue_duration_seconds_count{{fairness_id=\"b\",priority=\"0\",inference_pool=\"\",model_name=\"\",target_model_name=\"\",outcome=\"NotYetFinalized\"}} 1"
            ),
            format!(
                "{prefix}_flow_control_request_enqueue_duration_seconds_count{{fairness_id=\"b\",priority=\"0\",inference_pool=\"\",model_name=\"\",target_model_name=\"\",outcome=\"RejectedCapacity\"}} 1"
            ),
            format!(
                "{prefix}_flow_control_request_queue_duration_seconds_count{{fairness_id=\"a\",priority=\"2\",inference_pool=\"\",model_name=\"\",target_model_name=\"\",outcome=\"EvictedTTL\"}} 1"
            ),
            format!("{prefix}_flow_control_dispatch_cycle_duration_seconds_count 2"),
            // 40 µs: the first bucket (100 µs).
            format!(
                "{prefix}_flow_control_dispatch_cycle_duration_seconds_bucket{{le=\"0.0001\"}} 2"
            ),
        ] {
            assert!(text.contains(&want), "missing {want} in\n{text}");
        }
        // Outcomes that never happened have no series.
        assert!(
            !text.contains(&format!(
                "{prefix}_flow_control_request_queue_duration_seconds_count{{fairness_id=\"a\",priority=\"0\",inference_pool=\"\",model_name=\"\",target_model_name=\"\",outcome=\"EvictedTTL\"}}"
            )),
            "{text}"
        );
    }
    // Requests per priority and outcome, over every flow.
    assert_eq!(
        lines(&text, "llm_d_epp_flow_control_requests_total"),
        [
            "llm_d_epp_flow_control_requests_total{outcome=\"Dispatched\",priority=\"0\",inference_pool=\"\"} 2",
            "llm_d_epp_flow_control_requests_total{outcome=\"EvictedTTL\",priority=\"2\",inference_pool=\"\"} 1",
            "llm_d_epp_flow_control_requests_total{outcome=\"RejectedCapacity\",priority=\"0\",inference_pool=\"\"} 1",
        ]
    );
    // No controller read: no pool-level samples.
    assert!(lines(&text, "llm_d_epp_flow_control_pool_saturation{").is_empty());

    let reference: MetricGenerations = "inference-objective".parse().unwrap();
    let text = page(&metrics, reference);
    assert!(!text.contains("llm_d_epp_"), "{text}");
    assert!(
        text.contains("inference_extension_flow_control_dispatch_cycle_duration_seconds_count 2"),
        "{text}"
    );
    let llm_d: MetricGenerations = "llm-d".parse().unwrap();
    let text = page(&metrics, llm_d);
    assert!(!text.contains("inference_extension_"), "{text}");
}

/// A picker with flow control over three endpoints: queues 10 and 0, and
/// one never scraped (stale to the detector, whose threshold is an hour).
const FLOW: &str = "\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: utilization-detector
  parameters: {metricsStalenessThreshold: 3600s}
saturationDetector: {pluginRef: utilization-detector}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
flowControl:
  maxRequests: 8
  priorityBands:
  - {priority: 1, maxRequests: 4, maxBytes: 1000}
";

fn flow_service() -> ExtProcService {
    let endpoints: Vec<Arc<Endpoint>> = (0..3u32)
        .map(|i| {
            let e = Arc::new(Endpoint::new(
                i,
                format!("10.0.0.{}:8000", i + 1).parse().unwrap(),
            ));
            match i {
                2 => e.set_metrics(EndpointMetrics::default()),
                _ => e.set_metrics(EndpointMetrics {
                    waiting: if i == 0 { 10 } else { 0 },
                    ..EndpointMetrics::fresh()
                }),
            }
            e
        })
        .collect();
    let source: Arc<dyn EndpointSource> =
        Arc::new(ArcSwap::from_pointee(EndpointSnapshot::new(endpoints)));
    let built = EndpointPickerConfig::parse(FLOW, "flow.yaml")
        .unwrap()
        .build(&epp_plugins::builtin_registry())
        .unwrap();
    let options = ExtProcOptions {
        pool_name: "pool-a".into(),
        ..ExtProcOptions::default()
    };
    let service = ExtProcService::new(Arc::new(built.scheduler), source, options);
    service.set_flow_control(built.flow_settings);
    service
}

fn service_page(service: &ExtProcService) -> String {
    let mut registry = Registry::default();
    service.register_metrics_as(&mut registry, MetricGenerations::ALL);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text
}

#[test]
fn the_running_controller_is_read_at_scrape_time() {
    let service = flow_service();
    let fc = service.decider.flow.current().unwrap();
    // The request's models ride through the controller as its tag.
    let tag = service.decider.flow_metrics.models_tag("m", "m-lora");
    assert_eq!(service.decider.flow_metrics.models_tag("m", "m-lora"), tag);
    let request = |priority, bytes| FlowRequest {
        fairness_id: "t",
        priority,
        bytes,
        received: Instant::now(),
        deadline: None,
        slo_ttft: None,
        tag,
    };
    // Saturation (2 + 0 + 1) / 3 = 1: nothing is released.
    let _queued = [
        fc.enqueue(&request(1, 100), None).unwrap(),
        fc.enqueue(&request(1, 100), None).unwrap(),
        fc.enqueue(&request(0, 50), None).unwrap(),
    ];
    let text = service_page(&service);
    for want in [
        "inference_extension_flow_control_pool_saturation{inference_pool=\"pool-a\",stage=\"effective\"} 1.0",
        "llm_d_epp_flow_control_pool_saturation{inference_pool=\"pool-a\",stage=\"effective\"} 1.0",
        "llm_d_epp_flow_control_stale_endpoints{detector=\"utilization-detector\"} 1",
        // Band 1: 2 of 4 requests, 200 of 1000 bytes.
        "llm_d_epp_flow_control_capacity_utilization_requests{priority=\"1\",inference_pool=\"pool-a\"} 0.5",
        "llm_d_epp_flow_control_capacity_utilization_bytes{priority=\"1\",inference_pool=\"pool-a\"} 0.2",
        // Band 0 takes the default limits (5000 requests).
        "llm_d_epp_flow_control_capacity_utilization_requests{priority=\"0\",inference_pool=\"pool-a\"} 0.0002",
        // 3 of the 8 requests the whole queue may hold.
        "llm_d_epp_flow_control_global_capacity_utilization_requests{inference_pool=\"pool-a\"} 0.375",
        "llm_d_epp_flow_control_queue_size{fairness_id=\"t\",priority=\"1\",inference_pool=\"pool-a\",model_name=\"m\",target_model_name=\"m-lora\"} 2",
        "llm_d_epp_flow_control_request_enqueue_duration_seconds_count{fairness_id=\"t\",priority=\"1\",inference_pool=\"pool-a\",model_name=\"m\",target_model_name=\"m-lora\",outcome=\"NotYetFinalized\"} 2",
        // One cycle per enqueue, none of which released anything.
        "llm_d_epp_flow_control_dispatch_cycle_duration_seconds_count 3",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
    // No global byte limit configured: no global byte series (not 0).
    assert!(
        lines(
            &text,
            "llm_d_epp_flow_control_global_capacity_utilization_bytes{"
        )
        .is_empty(),
        "{text}"
    );

    // Flow control turned off: nothing of the controller is read.
    service.set_flow_control(None);
    let text = service_page(&service);
    for family in [
        "llm_d_epp_flow_control_pool_saturation{",
        "llm_d_epp_flow_control_stale_endpoints{",
        "llm_d_epp_flow_control_capacity_utilization_requests{",
    ] {
        assert!(lines(&text, family).is_empty(), "{family} in\n{text}");
    }
}
