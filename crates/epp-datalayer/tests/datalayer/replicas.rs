//! Two replicas sharing their state over `udp-peer-syncer`, loaded from
//! config as the `epp` binary loads it: a dispatch on one loads the
//! endpoint in the other's view, a pick on one is in the other's prefix
//! index, and a replica that stops is forgotten.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, UdpSocket},
    sync::Arc,
    time::{Duration, Instant},
};

use epp_core::{
    CacheGeometry, Dispatch, EndpointMetrics, EndpointSource, InferenceRequest, Registry,
    Scheduler,
    config::{BuiltConfig, EndpointPickerConfig},
};
use epp_datalayer::{EndpointSpec, EndpointStore, PeerSync};
use tokio_util::sync::CancellationToken;

fn registry() -> Registry {
    let mut r = Registry::new();
    epp_plugins::register_builtins(&mut r);
    epp_datalayer::register(&mut r);
    r
}

/// Ports free now (bound and released: the replicas bind them next).
fn free_udp_ports() -> (u16, u16) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

const FLEET: [&str; 4] = [
    "127.0.0.1:18001",
    "127.0.0.1:18002",
    "127.0.0.1:18003",
    "127.0.0.1:18004",
];

struct Replica {
    scheduler: Arc<Scheduler>,
    store: Arc<EndpointStore>,
    stop: CancellationToken,
}

/// A replica of `profile` (plugins and profiles) listening on `own`, with
/// both ports as its peers; `sync: false` leaves the syncer out.
fn replica(profile: &str, own: u16, peers: (u16, u16), sync: bool) -> Replica {
    let sync_text = format!(
        "- type: udp-peer-syncer\n  parameters: {{address: \"127.0.0.1:{own}\"}}\n\
         - type: static-peer-discovery\n  parameters: {{peers: [\"127.0.0.1:{}\", \"localhost:{}\"]}}\n",
        peers.0, peers.1
    );
    let data_layer = "dataLayer:\n  peerDiscovery: {pluginRef: static-peer-discovery}\n  \
                      crossReplicaSyncerPluginRef: udp-peer-syncer\n  crossReplicaSyncInterval: 50ms\n";
    let text = if sync {
        profile.replacen("plugins:\n", &format!("plugins:\n{sync_text}"), 1) + data_layer
    } else {
        profile.to_owned()
    };
    let built: BuiltConfig = EndpointPickerConfig::parse(&text, "replica.yaml")
        .and_then(|c| c.build(&registry()))
        .unwrap();
    let store = Arc::new(EndpointStore::new());
    store.replace_source(
        "static",
        FLEET
            .iter()
            .map(|a| EndpointSpec::new(a.parse().unwrap()))
            .collect(),
    );
    // KV usage 10 %, 11 %, 12 %, 13 % as last scraped, nothing in flight
    // then: the least loaded endpoint is the same in every replica's view.
    for (i, e) in store.snapshot().endpoints().iter().enumerate() {
        let i = u32::try_from(
            FLEET
                .iter()
                .position(|a| a.parse::<SocketAddr>().unwrap() == e.addr())
                .unwrap_or(i),
        )
        .unwrap();
        e.set_metrics(EndpointMetrics {
            kv_usage: 0.10 + f64::from(i) / 100.0,
            cache: Some(CacheGeometry {
                block_size_tokens: 16,
                num_blocks: 2048,
            }),
            ..EndpointMetrics::fresh()
        });
    }
    let stop = CancellationToken::new();
    let mut scheduler = built.scheduler;
    if let Some(r) = &built.replicas {
        let listen = r
            .syncer
            .plugin()
            .as_replica_syncer()
            .unwrap()
            .listen_address()
            .unwrap();
        let peers = r
            .peers
            .as_ref()
            .unwrap()
            .plugin()
            .as_peer_discovery()
            .unwrap();
        assert_eq!(r.interval, Duration::from_millis(50));
        let sync = PeerSync::bind(listen, peers.peer_addresses().to_vec(), r.interval).unwrap();
        scheduler = scheduler.with_replica_feed(sync.feed());
        sync.start(
            store.clone() as Arc<dyn EndpointSource>,
            &built.plugins,
            stop.clone(),
        )
        .unwrap();
    }
    Replica {
        scheduler: Arc::new(scheduler),
        store,
        stop,
    }
}

impl Replica {
    fn dispatch(&self, prompt: &str) -> Dispatch {
        let request = InferenceRequest::builder("m")
            .prompt(prompt.to_owned())
            .build();
        let result = self
            .scheduler
            .schedule(&request, &self.store.snapshot())
            .unwrap();
        result
            .dispatch(Arc::clone(&self.scheduler), request)
            .unwrap()
    }

    fn peer_requests(&self, addr: SocketAddr) -> u32 {
        self.store
            .snapshot()
            .by_addr(addr)
            .unwrap()
            .inflight()
            .peers()
            .requests
    }

    fn total_peer_requests(&self) -> u32 {
        FLEET
            .iter()
            .map(|a| self.peer_requests(a.parse().unwrap()))
            .sum()
    }
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn prompt(i: usize) -> String {
    format!("request {i:04}: {}", "some words ".repeat(150))
}

/// Requests alternating between two replicas, each waiting until the other
/// replica has heard of the one before: per endpoint, what the picks were.
async fn alternate(
    a: &Replica,
    b: &Replica,
    n: usize,
    synced: bool,
) -> BTreeMap<SocketAddr, usize> {
    let mut held = Vec::new();
    let mut picks = BTreeMap::new();
    for i in 0..n {
        let (me, other) = if i % 2 == 0 { (a, b) } else { (b, a) };
        let d = me.dispatch(&prompt(i));
        *picks.entry(d.endpoint().addr()).or_insert(0) += 1;
        let addr = d.endpoint().addr();
        held.push(d);
        if synced {
            let expect = held.iter().filter(|d| d.endpoint().addr() == addr).count();
            // The other replica's own dispatches there count locally.
            eventually("the other replica sees the dispatch", || {
                let own = other
                    .store
                    .snapshot()
                    .by_addr(addr)
                    .unwrap()
                    .inflight()
                    .local()
                    .requests as usize;
                own + other.peer_requests(addr) as usize == expect
            })
            .await;
        }
    }
    picks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_spread_a_burst_as_one_does() {
    let profile = epp_plugins::DEFAULT_CONFIG;
    let (pa, pb) = free_udp_ports();
    let a = replica(profile, pa, (pa, pb), true);
    let b = replica(profile, pb, (pa, pb), true);
    let picks = alternate(&a, &b, 4, true).await;
    assert_eq!(picks.len(), 4, "one request per endpoint: {picks:?}");

    // Without sharing, the second replica does not see the first one's
    // dispatch and picks the same endpoint (the check that the test can
    // fail).
    let (pc, pd) = free_udp_ports();
    let c = replica(profile, pc, (pc, pd), false);
    let d = replica(profile, pd, (pc, pd), false);
    let picks = alternate(&c, &d, 4, false).await;
    assert_eq!(picks.len(), 2, "two endpoints twice each: {picks:?}");
    for r in [&a, &b] {
        r.stop.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_on_one_replica_is_in_the_others_prefix_index_and_a_stopped_replica_is_forgotten() {
    let profile = "\
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 1}
  - {pluginRef: max-score-picker}
";
    // The scorer keeping its own index (llm-d's default) shares it too.
    let own_index = profile.replacen("- type: approx-prefix-cache-producer\n", "", 1);
    for profile in [profile, own_index.as_str()] {
        pick_is_shared_and_a_stopped_replica_forgotten(profile).await;
    }
}

async fn pick_is_shared_and_a_stopped_replica_forgotten(profile: &str) {
    let (pa, pb) = free_udp_ports();
    let a = replica(profile, pa, (pa, pb), true);
    let b = replica(profile, pb, (pa, pb), true);
    let tenant = "You are a helpful assistant for tenant 7. ".repeat(40);
    let first = a.dispatch(&format!("{tenant} question one"));
    let target = first.endpoint().addr();
    let b_target = b.store.snapshot().by_addr(target).unwrap().id();
    let held = || {
        let snapshot = b.store.snapshot();
        let e = snapshot.get(b_target).unwrap();
        let request = InferenceRequest::builder("m")
            .prompt(format!("{tenant} question two"))
            .build();
        let result = b.scheduler.schedule(&request, &snapshot).unwrap();
        result.primary().map(|p| p.addr()) == Some(e.addr()) && result.primary_prefix_hit > 0.5
    };
    eventually(
        "the other replica routes the tenant where its prompt is",
        held,
    )
    .await;

    // A replica that stops is forgotten, with what it had in flight.
    eventually("the other replica sees the dispatch", || {
        b.total_peer_requests() == 1
    })
    .await;
    // `first` is still held: only forgetting the silent replica can drop it.
    a.stop.cancel();
    eventually("the stopped replica's load is dropped", || {
        b.total_peer_requests() == 0
    })
    .await;
    drop(first);
    b.stop.cancel();
}

/// llm-d's `local-syncer` (its single-replica syncer) loads and shares
/// nothing; a syncer without an address, or discovery without peers, is a
/// load error naming the field.
#[test]
fn llm_ds_local_syncer_loads_and_shares_nothing() {
    let text = "plugins:\n- type: local-syncer\n  name: sync\ndataLayer:\n  \
                crossReplicaSyncerPluginRef: sync\n  crossReplicaSyncInterval: 1s\n";
    let built = EndpointPickerConfig::parse(text, "llm-d.yaml")
        .and_then(|c| c.build(&registry()))
        .unwrap();
    let replicas = built.replicas.unwrap();
    assert_eq!(replicas.interval, Duration::from_secs(1));
    let syncer = replicas.syncer.plugin().as_replica_syncer().unwrap();
    assert_eq!(syncer.listen_address(), None);
    for (text, field) in [
        ("plugins:\n- type: udp-peer-syncer\n", "address"),
        (
            "plugins:\n- type: static-peer-discovery\n  parameters: {peers: []}\n",
            "peers",
        ),
    ] {
        let err = EndpointPickerConfig::parse(text, "f.yaml")
            .and_then(|c| c.build(&registry()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{err}");
    }
}
