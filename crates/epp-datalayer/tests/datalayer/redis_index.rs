//! The shared prefix index against a real Redis server: what one replica
//! writes, another reads; a server that dies makes lookups unanswered (at
//! once, never a stall); a restarted, empty server gets the replica's whole
//! view back.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use epp_core::{HolderCounts, RedisAddress, SharedBlockIndex, SharedIndexSpec, Snapshot};
use epp_datalayer::RedisBlockIndex;
use epp_test_support::{process::scratch_dir, redis::RedisServer};
use futures::FutureExt as _;
use tokio_util::sync::CancellationToken;

/// A replica's view: the keys each endpoint holds.
type View = Arc<Mutex<Vec<(String, Vec<u64>)>>>;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

fn spec(url: &str, timeout: Duration) -> SharedIndexSpec {
    SharedIndexSpec {
        address: RedisAddress::parse(url).unwrap(),
        backend: "redis".into(),
        lookup_timeout: timeout,
    }
}

fn sorted(mut m: HolderCounts) -> HolderCounts {
    m.sort();
    m
}

/// Looks `keys` up until the answer is `want` (the writes are queued).
async fn until_answer(store: &RedisBlockIndex, keys: &[u64], want: &[(&str, u32)]) {
    let want: HolderCounts = want.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = store.lookup(keys.to_vec()).await.map(sorted);
        if got.as_ref() == Ok(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "lookup still answers {got:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_view_and_survive_a_server_restart() {
    let dir = scratch_dir("redis-index");
    let mut server = RedisServer::start(&dir);
    let shutdown = CancellationToken::new();
    let timeout = Duration::from_millis(200);
    let writer = RedisBlockIndex::start(&spec(&server.url(), timeout), shutdown.clone());
    // What this replica holds, as its index would report it.
    let view: View = Arc::new(Mutex::new(vec![
        (A.into(), vec![1, 2, 3]),
        (B.into(), vec![1, 2]),
    ]));
    let v = Arc::clone(&view);
    let snapshot: Snapshot = Arc::new(move |f: &mut dyn FnMut(&str, &[u64])| {
        for (e, keys) in v.lock().unwrap().iter() {
            f(e, keys);
        }
    });
    writer.set_snapshot(snapshot);
    // Written from the snapshot on connecting.
    until_answer(&writer, &[1, 2, 3], &[(A, 3), (B, 2)]).await;
    assert_eq!(
        sorted_lines(server.cli(&["HKEYS", "epp:kv:0000000000000001"])),
        [A, B]
    );

    // Another replica, which wrote nothing, reads the same.
    let reader = RedisBlockIndex::start(&spec(&server.url(), timeout), shutdown.clone());
    until_answer(&reader, &[1, 2, 3], &[(A, 3), (B, 2)]).await;
    // A gap ends a match: nobody holds 9.
    until_answer(&reader, &[1, 9, 3], &[(A, 1), (B, 1)]).await;
    until_answer(&reader, &[9, 1], &[]).await;

    // Updates: A drops block 2 (so its match stops at 1), B gains 3.
    writer.update(A, &[], &[2]);
    writer.update(B, &[3], &[]);
    *view.lock().unwrap() = vec![(A.into(), vec![1, 3]), (B.into(), vec![1, 2, 3])];
    until_answer(&reader, &[1, 2, 3], &[(A, 1), (B, 3)]).await;

    // The server dies: the reader notices at its next lookup, and from then
    // on lookups are unanswered at once (ready when asked: nothing waits).
    server.kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    while reader.stats().connected {
        // A lookup is what makes it notice (it writes to the dead connection).
        let _ = reader.lookup(vec![1, 2, 3]).await;
        assert!(Instant::now() < deadline, "the reader never noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = reader.lookup(vec![1, 2, 3]).now_or_never();
    assert!(matches!(now, Some(Err(_))), "{now:?}");
    // Changes while it is down are lost (the first one written to the dead
    // connection, the next ones dropped at once), then rewritten whole.
    *view.lock().unwrap() = vec![(A.into(), vec![1, 2, 3]), (B.into(), vec![1, 2, 3])];
    let deadline = Instant::now() + Duration::from_secs(20);
    while writer.stats().dropped_updates == 0 {
        writer.update(A, &[2], &[]);
        assert!(Instant::now() < deadline, "the writer never noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!writer.stats().connected);

    // Back, empty: the writer's view is written again; the reader sees it.
    server.start_again();
    until_answer(&reader, &[1, 2, 3], &[(A, 3), (B, 3)]).await;
    let stats = writer.stats();
    assert!(stats.connected && stats.resyncs >= 2, "{stats:?}");
    assert!(reader.stats().unanswered >= 1);
    shutdown.cancel();
}

#[tokio::test]
async fn no_server_means_unanswered_lookups_not_errors_or_stalls() {
    // Nothing listens on the port of a server just stopped.
    let dir = scratch_dir("redis-index-none");
    let mut server = RedisServer::start(&dir);
    let url = server.url();
    server.kill();
    let shutdown = CancellationToken::new();
    let store = RedisBlockIndex::start(&spec(&url, Duration::from_millis(100)), shutdown.clone());
    store.update(A, &[1], &[]);
    for _ in 0..5 {
        assert!(store.lookup(vec![1]).await.is_err());
    }
    let s = store.stats();
    assert_eq!((s.lookups, s.unanswered), (5, 5));
    assert!(!s.connected && s.dropped_updates == 1, "{s:?}");
    shutdown.cancel();
}

fn sorted_lines(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_costs_each_lookup_its_timeout_and_no_more() {
    // Accepts, reads, never writes back.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut conn, _)) = listener.accept().await {
            held.push(tokio::spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut conn, &mut sink).await;
            }));
        }
    });
    let shutdown = CancellationToken::new();
    let timeout = Duration::from_millis(500);
    let store = RedisBlockIndex::start(
        &spec(&format!("redis://127.0.0.1:{port}"), timeout),
        shutdown.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.stats().connected {
        assert!(Instant::now() < deadline, "never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first lookups wait (for their timeout at most)...
    let waiting: Vec<_> = (0..64).map(|_| store.lookup(vec![1, 2, 3])).collect();
    // ...and past that many, a lookup is unanswered at once, not queued.
    let over = store.lookup(vec![1, 2, 3]).now_or_never();
    assert!(matches!(over, Some(Err(_))), "{over:?}");
    // Each ends by its own deadline, counted from the ask: awaited one after
    // the other, the last would otherwise outlive the connection's reply
    // timeout and end another way.
    for w in waiting {
        let e = w.await.unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
    }
    assert_eq!(store.stats().unanswered, 65);
    // Once they are done, lookups wait again rather than being refused.
    assert!(store.lookup(vec![1]).now_or_never().is_none());
    shutdown.cancel();
}
