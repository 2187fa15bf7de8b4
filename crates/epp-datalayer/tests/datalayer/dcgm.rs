//! `dcgm-data-source` and `dcgm-extractor` against real HTTP servers: a
//! DCGM-exporter-shaped page on a port of its own beside the model server's
//! page, and no exporter at all (a machine without GPUs).

use std::{sync::Arc, time::Duration};

use epp_core::{EndpointSource, PluginRef, config::SourceWiring};
use epp_datalayer::{
    DataLayer, DataLayerOptions, DcgmDataSource, DcgmExtractor, EndpointSpec, EndpointStore,
};
use epp_test_support::wait::eventually;
use tokio_util::sync::CancellationToken;

use crate::common::{BadServer, Logs, Mode, vllm_page, wiring};

const KEY: &str = "GPUUtilization/dcgm-extractor";

/// DCGM exporter's page as a sidecar serves it (no `pod` label).
fn dcgm_page(utils: &[u32]) -> String {
    let mut page = String::from(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
    );
    for (i, u) in utils.iter().enumerate() {
        page.push_str(&format!(
            "DCGM_FI_DEV_GPU_UTIL{{gpu=\"{i}\",UUID=\"GPU-{i}\",Hostname=\"h\"}} {u}\n"
        ));
    }
    page.push_str("# TYPE DCGM_FI_DEV_SM_CLOCK gauge\nDCGM_FI_DEV_SM_CLOCK{gpu=\"0\"} 1410\n");
    page
}

fn dcgm(port: u16, interval: &str) -> SourceWiring {
    let params =
        serde_yaml_ng::from_str(&format!("{{port: {port}, interval: {interval}}}")).unwrap();
    SourceWiring {
        source: PluginRef::new(Arc::new(
            DcgmDataSource::new("dcgm-source", params).unwrap(),
        )),
        extractors: vec![PluginRef::new(Arc::new(DcgmExtractor::new(
            "dcgm-extractor",
        )))],
    }
}

fn start(store: &Arc<EndpointStore>, dcgm_port: u16) -> DataLayer {
    DataLayer::start(
        Arc::clone(store),
        &[wiring("{}"), dcgm(dcgm_port, "40ms")],
        DataLayerOptions {
            refresh_interval: Duration::from_millis(10),
            scrape_timeout: Duration::from_millis(500),
            ..DataLayerOptions::default()
        },
        CancellationToken::new(),
    )
    .unwrap()
}

#[tokio::test]
async fn gpu_utilization_comes_from_the_exporters_port_at_its_interval() {
    let model = BadServer::start(Mode::Page(vllm_page(3, 1, 0.25))).await;
    let exporter = BadServer::start(Mode::Page(dcgm_page(&[35, 42]))).await;
    let store = Arc::new(EndpointStore::new());
    store.replace_source("test", vec![EndpointSpec::new(model.addr)]);
    let dl = start(&store, exporter.addr.port());
    let metrics = || store.snapshot().by_addr(model.addr).unwrap().metrics();
    eventually("the GPU utilization", || async {
        metrics().custom.get(KEY).copied() == Some(0.42)
    })
    .await;
    let m = metrics();
    assert_eq!(
        (m.waiting, m.running),
        (3, 1),
        "the model server's own page"
    );
    assert!(m.updated_at.is_some());
    eventually("twenty model-server scrapes", || async {
        model.requests() >= 20
    })
    .await;
    // Every 40 ms against every 10 ms: about a quarter as many.
    let (m, e) = (model.requests(), exporter.requests());
    assert!(e * 2 <= m, "exporter {e} vs model server {m}");
    // The busiest GPU changes: the value follows.
    exporter.set(Mode::Page(dcgm_page(&[90, 10])));
    eventually("the new utilization", || async {
        metrics().custom.get(KEY).copied() == Some(0.9)
    })
    .await;
    dl.stop().await;
}

#[tokio::test]
async fn without_an_exporter_endpoints_stay_fresh_and_it_warns_once() {
    let (logs, _guard) = Logs::capture();
    let models = [
        BadServer::start(Mode::Page(vllm_page(1, 0, 0.1))).await,
        BadServer::start(Mode::Page(vllm_page(2, 0, 0.2))).await,
    ];
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = Arc::new(EndpointStore::new());
    store.replace_source(
        "test",
        models.iter().map(|m| EndpointSpec::new(m.addr)).collect(),
    );
    let dl = start(&store, closed);
    eventually("ten scrapes of each model server", || async {
        dl.status().iter().all(|s| s.ok >= 10)
    })
    .await;
    for (m, waiting) in models.iter().zip([1, 2]) {
        let metrics = store.snapshot().by_addr(m.addr).unwrap().metrics();
        assert_eq!(metrics.waiting, waiting);
        assert!(metrics.updated_at.is_some(), "fresh without the exporter");
        assert!(!metrics.custom.contains_key(KEY));
    }
    assert!(
        dl.status().iter().all(|s| s.last_error.is_none()),
        "{:?}",
        dl.status()
    );
    assert_eq!(
        logs.count("logged once for this source"),
        1,
        "one warning for the source, not one per endpoint or scrape:\n{}",
        logs.text()
    );
    dl.stop().await;
}
