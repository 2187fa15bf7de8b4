//! Against simulator processes: every engine's real page flows through the
//! scraper into the endpoint's metrics, and admin changes are followed.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use epp_core::{EndpointSource, PluginRef, config::SourceWiring};
use epp_datalayer::{
    DataLayer, DataLayerOptions, EndpointSpec, EndpointStore, MetricsDataSource,
    PrometheusMetricExtractor, default_source_wiring,
};
use epp_test_support::{
    process::{Sim, scratch_dir, sim_admin, start_sim},
    wait::eventually,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn opts() -> DataLayerOptions {
    DataLayerOptions {
        refresh_interval: Duration::from_millis(20),
        ..DataLayerOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engine_simulated_is_read() {
    let cases = [
        ("vllm", "vllm"),
        ("sglang", "sglang"),
        ("trtllm-serve", "trtllm-serve"),
        ("triton", "triton-tensorrt-llm"),
    ];
    let dir = scratch_dir("datalayer-engines");
    let sims: Vec<Sim> = cases
        .iter()
        .enumerate()
        .map(|(i, (flag, _))| {
            start_sim(
                &dir,
                i,
                &[
                    "--engine",
                    flag,
                    "--block-size",
                    "32",
                    "--num-gpu-blocks",
                    "1000",
                ],
            )
        })
        .collect();
    let store = Arc::new(EndpointStore::new());
    store.replace_source(
        "sims",
        sims.iter()
            .zip(cases)
            .map(|(s, (_, engine))| EndpointSpec {
                addr: s.socket_addr(),
                labels: BTreeMap::from([("llm-d.ai/engine-type".to_owned(), engine.to_owned())]),
                name: None,
            })
            .collect(),
    );
    let dl = DataLayer::start(
        Arc::clone(&store),
        &[default_source_wiring()],
        opts(),
        CancellationToken::new(),
    )
    .unwrap();
    eventually("every engine scraped", || async {
        dl.status().iter().all(|s| s.ok > 0)
    })
    .await;
    for (sim, (flag, _)) in sims.iter().zip(cases) {
        sim_admin(sim.port, json!({"extra_waiting": 6})).await;
        let e = Arc::clone(store.snapshot().by_addr(sim.socket_addr()).unwrap());
        eventually(&format!("{flag}: the queue is seen"), || async {
            e.metrics().waiting == 6
        })
        .await;
        let m = e.metrics();
        assert!((0.0..=1.0).contains(&m.kv_usage), "{flag}: {m:?}");
        if let Some(cache) = m.cache {
            assert_eq!(cache.num_blocks, 1000, "{flag}: {cache:?}");
        }
    }
    assert!(
        dl.status().iter().all(|s| s.last_error.is_none()),
        "{:?}",
        dl.status()
    );
    dl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_gauges_reach_custom_metrics_and_go_away() {
    let sim = start_sim(&scratch_dir("datalayer-gauges"), 0, &[]);
    let store = Arc::new(EndpointStore::new());
    store.replace_source("sims", vec![EndpointSpec::new(sim.socket_addr())]);
    let params =
        serde_yaml_ng::from_str("metricName: gpu_temperature_celsius\nlabels: {gpu: \"0\"}\n")
            .unwrap();
    let temp = PrometheusMetricExtractor::new("gpu-temp", params).unwrap();
    let mut wiring: SourceWiring = default_source_wiring();
    wiring.extractors.push(PluginRef::new(Arc::new(temp)));
    assert_eq!(wiring.source.plugin().type_name(), MetricsDataSource::TYPE);
    let dl = DataLayer::start(
        Arc::clone(&store),
        &[wiring],
        opts(),
        CancellationToken::new(),
    )
    .unwrap();

    let gauges = json!({"gauges": {
        "gpu_temperature_celsius{gpu=\"0\"}": 71.5,
        "gpu_temperature_celsius{gpu=\"1\"}": 90,
    }});
    sim_admin(sim.port, gauges).await;
    let e = Arc::clone(store.snapshot().by_addr(sim.socket_addr()).unwrap());
    eventually("the gauge is read", || async {
        e.metrics().custom.get("gpu_temperature_celsius") == Some(&71.5)
    })
    .await;
    sim_admin(
        sim.port,
        json!({"gauges": {"gpu_temperature_celsius{gpu=\"0\"}": null}}),
    )
    .await;
    eventually("a vanished gauge is removed", || async {
        !e.metrics().custom.contains_key("gpu_temperature_celsius")
    })
    .await;
    assert!(
        e.metrics().updated_at.is_some(),
        "the core metrics are still fresh"
    );
    dl.stop().await;
}
