//! Discovery from a watched file and a static list.

use std::{sync::Arc, time::Duration};

use epp_core::EndpointSource;
use epp_datalayer::{Discovery, EndpointStore, FileDiscovery, StaticDiscovery};
use tokio_util::sync::CancellationToken;

use crate::common::eventually;

fn addrs(store: &EndpointStore) -> Vec<(u32, String)> {
    store
        .snapshot()
        .endpoints()
        .iter()
        .map(|e| (e.id().0, e.addr_str().to_owned()))
        .collect()
}

#[tokio::test]
async fn file_edits_add_and_remove_endpoints() {
    let dir = std::env::temp_dir().join(format!("epp-datalayer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("endpoints.yaml");
    std::fs::write(&path, "- {address: 10.0.0.1, port: 8000}\n").unwrap();

    let store = Arc::new(EndpointStore::new());
    let stop = CancellationToken::new();
    let discovery = FileDiscovery::new(path.clone()).with_poll_interval(Duration::from_millis(10));
    assert_eq!(discovery.source_name(), format!("file:{}", path.display()));
    discovery.start(Arc::clone(&store), stop.clone()).unwrap();
    assert_eq!(addrs(&store), vec![(0, "10.0.0.1:8000".to_owned())]);

    std::fs::write(
        &path,
        "- {address: 10.0.0.1, port: 8000}\n- address: 10.0.0.2\n  port: 8000\n  labels: {llm-d.ai/engine-type: sglang}\n",
    )
    .unwrap();
    eventually("the added endpoint", || async {
        store.snapshot().len() == 2
    })
    .await;
    let second = Arc::clone(
        store
            .snapshot()
            .by_addr("10.0.0.2:8000".parse().unwrap())
            .unwrap(),
    );
    assert_eq!(second.label("llm-d.ai/engine-type"), Some("sglang"));

    // A bad edit keeps the previous set.
    std::fs::write(&path, "- {address: nope\n").unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.snapshot().len(), 2);

    std::fs::write(
        &path,
        "- {address: 10.0.0.2, port: 8000, labels: {llm-d.ai/engine-type: sglang}}\n",
    )
    .unwrap();
    eventually("the removed endpoint", || async {
        store.snapshot().len() == 1
    })
    .await;
    assert_eq!(addrs(&store), vec![(1, "10.0.0.2:8000".to_owned())]);
    assert!(
        Arc::ptr_eq(&second, &store.snapshot().endpoints()[0]),
        "an unchanged endpoint keeps its identity (and metrics)"
    );
    stop.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn static_lists_and_file_merge() {
    let store = Arc::new(EndpointStore::new());
    let flag = StaticDiscovery::parse(&["10.0.0.1:80,10.0.0.2:80", "10.0.0.3:80"]).unwrap();
    flag.start(Arc::clone(&store), CancellationToken::new())
        .unwrap();
    assert_eq!(store.snapshot().len(), 3);
    let err = StaticDiscovery::parse(&["10.0.0.1"]).unwrap_err();
    assert!(err.to_string().contains("not ip:port"), "{err}");
    let missing = FileDiscovery::new("/nonexistent/endpoints.yaml".into())
        .start(Arc::clone(&store), CancellationToken::new())
        .unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/endpoints.yaml"),
        "{missing}"
    );
}
