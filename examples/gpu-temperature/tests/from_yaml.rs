//! The downstream extractor and scorer, run from YAML next to the built-in
//! plugins against simulator processes whose GPU-temperature gauges are set
//! through `/admin/state`: routing follows the coolest GPU.

#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

use std::{
    io::BufRead,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use epp_core::{EndpointSource, InferenceRequest, config::EndpointPickerConfig};
use epp_datalayer::{DataLayer, DataLayerOptions, EndpointSpec, EndpointStore};
use gpu_temperature::GpuTemperature;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const CONFIG: &str = r#"
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- name: gpu-temp
  type: gpu-temperature-extractor
  parameters: {metricName: gpu_temperature_celsius}
- name: cool
  type: cool-gpu-scorer
  parameters: {coolCelsius: 40, hotCelsius: 90}
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}, {pluginRef: gpu-temp}]
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: cool, weight: 5}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"#;

struct Sim {
    child: Child,
    addr: SocketAddr,
}

impl Sim {
    fn start() -> Self {
        let exe = std::env::current_exe().unwrap();
        let bin = exe
            .ancestors()
            .skip(1)
            .take(3)
            .map(|d| d.join("epp-sim"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("epp-sim not built: run `cargo build -p epp-sim` first"));
        let mut child = Command::new(bin)
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().unwrap().unwrap();
            if let Some(rest) = line.strip_prefix("epp-sim listening on ") {
                break rest.trim().parse().unwrap();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self { child, addr }
    }

    /// Sets the two GPUs' temperatures.
    async fn temperatures(&self, gpu0: f64, gpu1: f64) {
        let body = format!(
            r#"{{"gauges": {{"gpu_temperature_celsius{{gpu=\"0\"}}": {gpu0}, "gpu_temperature_celsius{{gpu=\"1\"}}": {gpu1}}}}}"#
        );
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "POST /admin/state HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_follows_the_coolest_gpu() {
    let mut registry = epp_plugins::builtin_registry();
    epp_datalayer::register(&mut registry);
    gpu_temperature::register(&mut registry);
    let built = EndpointPickerConfig::parse(CONFIG, "gpu.yaml")
        .unwrap()
        .build(&registry)
        .unwrap();

    let sims = [Sim::start(), Sim::start(), Sim::start()];
    // The hottest GPU of each server counts: 85, 60, 75.
    for (sim, (a, b)) in sims.iter().zip([(85.0, 50.0), (55.0, 60.0), (75.0, 41.0)]) {
        sim.temperatures(a, b).await;
    }
    let store = Arc::new(EndpointStore::new());
    store.replace_source(
        "sims",
        sims.iter().map(|s| EndpointSpec::new(s.addr)).collect(),
    );
    let layer = DataLayer::start(
        Arc::clone(&store),
        &built.data_layer,
        DataLayerOptions {
            refresh_interval: Duration::from_millis(20),
            ..DataLayerOptions::default()
        },
        CancellationToken::new(),
    )
    .unwrap();

    let request = InferenceRequest::builder("m").prompt("hello").build();
    let pick = || {
        built
            .scheduler
            .schedule(&request, &store.snapshot())
            .ok()
            .and_then(|r| r.primary().map(|e| e.addr()))
    };
    let wait_for = |want: SocketAddr| async move {
        for _ in 0..2000 {
            if pick() == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("routing never went to {want}; last pick {:?}", pick());
    };
    // Routing is only meaningful once every server's temperature has been
    // read; before that all scores tie and any server may be picked.
    for _ in 0..2000 {
        let snapshot = store.snapshot();
        if snapshot.endpoints().iter().all(|e| {
            e.metrics()
                .extension::<GpuTemperature>()
                .is_some_and(|t| t.hottest_celsius.is_some())
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_for(sims[1].addr).await;
    let e = Arc::clone(store.snapshot().by_addr(sims[1].addr).unwrap());
    assert_eq!(
        e.metrics().extension::<GpuTemperature>(),
        Some(&GpuTemperature {
            hottest_celsius: Some(60.0)
        })
    );

    // The middle server heats up: routing moves to the now-coolest one.
    sims[1].temperatures(88.0, 60.0).await;
    wait_for(sims[2].addr).await;
    layer.stop().await;

    // Config errors name the field.
    let bad = CONFIG.replace("hotCelsius: 90", "hotCelsius: 30");
    let err = EndpointPickerConfig::parse(&bad, "gpu.yaml")
        .unwrap()
        .build(&registry)
        .unwrap_err();
    assert!(err.to_string().contains("hotCelsius"), "{err}");
}
