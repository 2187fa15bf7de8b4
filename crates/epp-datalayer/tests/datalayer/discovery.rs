//! Discovery from a watched file and a static list.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use epp_core::{EndpointSource, InferenceRequest};
use epp_datalayer::{Discovery, EndpointStore, FileDiscovery, StaticDiscovery};
use epp_test_support::{
    plugins::{self, BestScoresPicker, short_queue_profile},
    wait::eventually,
};
use tokio_util::sync::CancellationToken;

use crate::common::Logs;

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

// === A file read while it is being written ===

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("epp-datalayer-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("endpoints.yaml")
}

/// Replaces `path` the way editors do: write a new file, rename it over.
fn replace_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const POLL: Duration = Duration::from_millis(50);
const THREE: &str = "- {address: 10.0.0.1, port: 8000}\n- {address: 10.0.0.2, port: 8000}\n- {address: 10.0.0.3, port: 8000}\n";

fn ports(store: &EndpointStore) -> Vec<String> {
    addrs(store).into_iter().map(|(_, a)| a).collect()
}

/// Paused tokio time: the watcher's polls happen at exact virtual instants,
/// so "between its two looks" and "within two intervals" are deterministic.
#[tokio::test(start_paused = true)]
async fn a_file_being_written_never_drops_the_endpoints() {
    let (logs, _guard) = Logs::capture();
    let path = temp_file("partial");
    std::fs::write(&path, THREE).unwrap();
    let store = Arc::new(EndpointStore::new());
    let stop = CancellationToken::new();
    let discovery = FileDiscovery::new(path.clone()).with_poll_interval(POLL);
    discovery.start(Arc::clone(&store), stop.clone()).unwrap();
    assert_eq!(store.snapshot().len(), 3);

    // Written in two steps; the first step alone is valid YAML with fewer
    // endpoints. The watcher reads it once, then sees it change: never applied.
    let generation = *store.subscribe().borrow();
    std::fs::write(&path, "- {address: 10.0.0.1, port: 8000}\n").unwrap();
    tokio::time::sleep(POLL + POLL / 8).await;
    assert_eq!(
        store.snapshot().len(),
        3,
        "a half-written file is not applied"
    );
    std::fs::write(
        &path,
        "- {address: 10.0.0.1, port: 8000}\n- {address: 10.0.0.2, port: 8000}\n",
    )
    .unwrap();
    tokio::time::sleep(2 * POLL).await;
    assert_eq!(ports(&store), ["10.0.0.1:8000", "10.0.0.2:8000"]);
    assert_eq!(
        *store.subscribe().borrow(),
        generation + 1,
        "one change published, the finished one"
    );
    assert_eq!(discovery.errors(), 0);

    // Truncated to nothing and left so: the endpoints stay, logged once.
    std::fs::write(&path, "").unwrap();
    tokio::time::sleep(3 * POLL).await;
    assert_eq!(
        store.snapshot().len(),
        2,
        "an empty file keeps the last set"
    );
    assert_eq!(discovery.errors(), 1);
    assert!(
        logs.text()
            .contains("empty (write `[]` to remove every endpoint)")
    );

    // Invalid YAML, left for seconds (the content is re-read every second):
    // kept, counted and logged once, with file:line:column.
    std::fs::write(
        &path,
        "- {address: 10.0.0.1, port: 8000}\n- {address: nope, port: 8000}\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(store.snapshot().len(), 2);
    assert_eq!(discovery.errors(), 2);
    assert_eq!(logs.count("endpoints file rejected"), 2, "{}", logs.text());
    let shown = format!("{}:2:", path.display());
    assert!(
        logs.text().contains(&shown),
        "no {shown} in:\n{}",
        logs.text()
    );

    // An editor replaces the file (write + rename) to remove an endpoint:
    // applied, and gone for scheduling within two poll intervals.
    let picker = BestScoresPicker::new(1).last_on_ties();
    let scheduler = plugins::scheduler(short_queue_profile(picker));
    let request = InferenceRequest::builder("m").prompt("hi").build();
    let pick = || {
        scheduler
            .schedule(&request, &store.snapshot())
            .ok()
            .and_then(|r| r.primary().map(|e| e.addr_str().to_owned()))
    };
    // Equal scores: the picker takes the last candidate, the one we remove.
    assert_eq!(pick().as_deref(), Some("10.0.0.2:8000"));
    replace_by_rename(&path, "- {address: 10.0.0.1, port: 8000}\n");
    tokio::time::sleep(2 * POLL).await;
    assert_eq!(ports(&store), ["10.0.0.1:8000"]);
    assert_eq!(pick().as_deref(), Some("10.0.0.1:8000"));
    assert_eq!(logs.count("endpoints file readable again"), 1);
    assert_eq!(discovery.errors(), 2);

    // Removing every endpoint takes an explicit empty list.
    std::fs::write(&path, "[]\n").unwrap();
    tokio::time::sleep(2 * POLL).await;
    assert_eq!(store.snapshot().len(), 0);
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_file_briefly_missing_during_a_replace_is_not_an_error() {
    let (logs, _guard) = Logs::capture();
    let path = temp_file("missing");
    std::fs::write(&path, THREE).unwrap();
    let store = Arc::new(EndpointStore::new());
    let stop = CancellationToken::new();
    let discovery = FileDiscovery::new(path.clone()).with_poll_interval(POLL);
    discovery.start(Arc::clone(&store), stop.clone()).unwrap();
    // Gone for one look (as with editors that move the old file away first).
    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(POLL + POLL / 8).await;
    std::fs::write(&path, THREE).unwrap();
    tokio::time::sleep(3 * POLL).await;
    assert_eq!((store.snapshot().len(), discovery.errors()), (3, 0));
    // Gone for good: reported once, endpoints kept.
    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!((store.snapshot().len(), discovery.errors()), (3, 1));
    assert_eq!(logs.count("endpoints file rejected"), 1, "{}", logs.text());
    std::fs::write(&path, THREE).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        logs.count("endpoints file readable again"),
        1,
        "{}",
        logs.text()
    );
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
