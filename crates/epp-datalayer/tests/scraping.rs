//! The scrapers against a deliberately misbehaving HTTP server: hangs, 500s,
//! garbage, a 50 MB page and a slow drip each cost bounded time and memory,
//! never stall the healthy endpoint, and leave failing endpoints to go stale.

#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use epp_core::{EndpointSource, PluginRef, config::SourceWiring};
use epp_datalayer::{
    CoreMetricsExtractor, CoreMetricsParams, DataLayer, DataLayerOptions, EndpointSpec,
    EndpointStore, FileDiscovery, MetricsDataSource, MetricsDataSourceParams,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug)]
enum Behaviour {
    Healthy(u32),
    Hang,
    Status500,
    Garbage,
    Huge,
    Drip,
}

/// A tiny HTTP/1.1 server answering every request per `b`.
async fn server(b: Behaviour) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let head = |len: usize, status: &str| {
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {len}\r\n\r\n"
                        )
                    };
                    let r = match b {
                        Behaviour::Healthy(q) => {
                            let body = format!(
                                "vllm:num_requests_waiting{{engine=\"0\"}} {q}\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n"
                            );
                            s.write_all(format!("{}{body}", head(body.len(), "200 OK")).as_bytes())
                                .await
                        }
                        Behaviour::Hang => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        }
                        Behaviour::Status500 => s
                            .write_all(head(5, "500 Internal Server Error").as_bytes())
                            .await
                            .and(s.write_all(b"oops!").await),
                        Behaviour::Garbage => {
                            let body = "<html><body>502 Bad Gateway</body></html>";
                            s.write_all(format!("{}{body}", head(body.len(), "200 OK")).as_bytes())
                                .await
                        }
                        Behaviour::Huge => {
                            // 50 MB, announced honestly: rejected before reading.
                            let _ = s.write_all(head(50 << 20, "200 OK").as_bytes()).await;
                            let chunk = vec![b'#'; 1 << 20];
                            for _ in 0..50 {
                                if s.write_all(&chunk).await.is_err() {
                                    return;
                                }
                            }
                            Ok(())
                        }
                        Behaviour::Drip => {
                            let _ = s.write_all(head(1000, "200 OK").as_bytes()).await;
                            for _ in 0..1000 {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                if s.write_all(b"#").await.is_err() {
                                    return;
                                }
                            }
                            Ok(())
                        }
                    };
                    if r.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn wiring() -> Vec<SourceWiring> {
    let source = MetricsDataSource::new("metrics", MetricsDataSourceParams::default()).unwrap();
    let core = CoreMetricsExtractor::new("core", &CoreMetricsParams::default()).unwrap();
    vec![SourceWiring {
        source: PluginRef::new(Arc::new(source)),
        extractors: vec![PluginRef::new(Arc::new(core))],
    }]
}

fn opts() -> DataLayerOptions {
    DataLayerOptions {
        refresh_interval: Duration::from_millis(50),
        scrape_timeout: Duration::from_millis(300),
        max_page_bytes: 1 << 20,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_servers_do_not_stall_healthy_ones_and_go_stale() {
    let healthy = server(Behaviour::Healthy(7)).await;
    let bad = [
        server(Behaviour::Hang).await,
        server(Behaviour::Status500).await,
        server(Behaviour::Garbage).await,
        server(Behaviour::Huge).await,
        server(Behaviour::Drip).await,
    ];
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let store = Arc::new(EndpointStore::new());
    let mut specs = vec![EndpointSpec::new(healthy)];
    specs.extend(bad.iter().copied().map(EndpointSpec::new));
    specs.push(EndpointSpec::new(dead));
    store.replace_source("test", specs);
    let stop = CancellationToken::new();
    let layer = DataLayer::start(Arc::clone(&store), &wiring(), opts(), stop.clone()).unwrap();

    // The healthy endpoint is refreshed every interval while the others misbehave.
    let start = Instant::now();
    let mut refreshes = 0;
    let mut last = None;
    while start.elapsed() < Duration::from_millis(1500) {
        let m = store.snapshot().by_addr(healthy).unwrap().metrics();
        if m.updated_at != last {
            refreshes += 1;
            last = m.updated_at;
        }
        assert!(m.updated_at.is_none() || m.waiting == 7);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        refreshes >= 10,
        "healthy endpoint refreshed only {refreshes} times in 1.5 s"
    );

    // Every misbehaving endpoint stays unscraped: its metrics are never fresh.
    let now = Instant::now();
    for addr in bad.iter().chain([&dead]) {
        let m = store.snapshot().by_addr(*addr).unwrap().metrics();
        assert!(
            m.is_stale(now, Duration::from_secs(1)),
            "{addr} looks fresh"
        );
    }
    layer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_starts_failing_keeps_its_values_but_ages() {
    let ok = server(Behaviour::Healthy(3)).await;
    let store = Arc::new(EndpointStore::new());
    store.replace_source("test", vec![EndpointSpec::new(ok)]);
    let stop = CancellationToken::new();
    let layer = DataLayer::start(Arc::clone(&store), &wiring(), opts(), stop.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let endpoint = Arc::clone(store.snapshot().by_addr(ok).unwrap());
    assert_eq!(endpoint.metrics().waiting, 3);

    // Swap the endpoint for one at a dead address with the same id semantics:
    // removal takes effect within two refresh intervals.
    store.replace_source("test", vec![]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(store.snapshot().is_empty());
    let frozen = endpoint.metrics().updated_at;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        endpoint.metrics().updated_at,
        frozen,
        "a removed endpoint is no longer scraped"
    );
    assert_eq!(
        endpoint.metrics().waiting,
        3,
        "old values are kept, only their age grows"
    );
    layer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_discovery_follows_edits() {
    let dir = std::env::temp_dir().join(format!("epp-endpoints-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("endpoints.yaml");
    std::fs::write(&file, "- {address: 10.0.0.1, port: 8000}\n").unwrap();
    let store = Arc::new(EndpointStore::new());
    let stop = CancellationToken::new();
    FileDiscovery::new(file.clone())
        .with_poll_interval(Duration::from_millis(20))
        .spawn(Arc::clone(&store), stop.clone())
        .unwrap();
    assert_eq!(store.snapshot().len(), 1);

    std::fs::write(&file, "- {address: 10.0.0.1, port: 8000}\n- {address: 10.0.0.2, port: 8000, labels: {llm-d.ai/role: decode}}\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.snapshot().len() != 2 {
        assert!(
            Instant::now() < deadline,
            "the added endpoint never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A broken edit keeps the previous endpoints.
    std::fs::write(&file, "- {address: nope").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.snapshot().len(), 2);
    std::fs::write(&file, "- {address: 10.0.0.2, port: 8000}\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.snapshot().len() != 1 {
        assert!(Instant::now() < deadline, "the removed endpoint never left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    let _ = std::fs::remove_dir_all(dir);
}
