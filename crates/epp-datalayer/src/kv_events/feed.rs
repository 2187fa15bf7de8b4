//! The subscriber tasks: one per (sink group, endpoint) that connects to the
//! endpoint's publisher, and one per bound address (`zmqEndpoint`) that
//! engines connect to.
//!
//! Every message is `[topic, seq (8 bytes, big-endian), payload]`. Per
//! publisher the task keeps the last sequence number applied:
//! - the next one is applied;
//! - an older or equal one is a duplicate, unless it is lower than the last
//!   one seen live, which means the engine restarted: what it held is
//!   forgotten and the stream starts again;
//! - a gap is filled from the engine's replay socket when one is configured
//!   (a DEALER asking from the first missing number); otherwise, or when the
//!   replay cannot fill it, everything the endpoint held is forgotten (a lost
//!   `BlockRemoved` would otherwise leave blocks believed cached for ever)
//!   and the stream goes on from the new message.
//!
//! A subscriber joining mid-stream asks for a replay from 0 when it can.
//! Sinks are called from these tasks; nothing here blocks the request path.

use std::{collections::HashMap, net::IpAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use epp_core::{
    Endpoint, EndpointId, EndpointSource, KvEvent, KvEventBatch, KvEventsConfig, PluginRef,
};
use futures::StreamExt;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::decode_batch;
use crate::EndpointStore;

/// How long a connect may take before it is retried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between connection attempts.
const RETRY: Duration = Duration::from_secs(1);
/// A replay that sends nothing for this long has ended.
const REPLAY_IDLE: Duration = Duration::from_secs(2);
/// Messages one replay may return at most (vLLM buffers 10,000 steps).
const REPLAY_MAX: usize = 100_000;

/// Sinks that read the same publishers (equal `kvEventsConfig`) share one
/// subscription per endpoint.
#[derive(Debug, Clone)]
pub(crate) struct SinkGroup {
    pub(crate) config: KvEventsConfig,
    pub(crate) sinks: Vec<PluginRef>,
}

impl SinkGroup {
    /// Groups the sinks of every notification source by their config.
    pub(crate) fn group(sinks: impl IntoIterator<Item = PluginRef>) -> Vec<Self> {
        let mut groups: Vec<Self> = Vec::new();
        for p in sinks {
            let Some(sink) = p.plugin().as_kv_event_sink() else {
                continue;
            };
            let config = sink.kv_events_config().clone();
            if groups
                .iter()
                .flat_map(|g| &g.sinks)
                .any(|q| q.plugin().name() == p.plugin().name())
            {
                continue;
            }
            match groups.iter_mut().find(|g| g.config == config) {
                Some(g) => g.sinks.push(p),
                None => groups.push(Self {
                    config,
                    sinks: vec![p],
                }),
            }
        }
        groups
    }

    fn apply(&self, endpoint: &Arc<Endpoint>, batch: &KvEventBatch) {
        for p in &self.sinks {
            if let Some(s) = p.plugin().as_kv_event_sink() {
                s.apply(endpoint, batch);
            }
        }
    }

    fn clear(&self, id: EndpointId) {
        for p in &self.sinks {
            if let Some(s) = p.plugin().as_kv_event_sink() {
                s.clear(id);
            }
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MessageLabels {
    endpoint: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    endpoint: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

/// The feeds' counters.
#[derive(Debug, Default)]
pub(crate) struct FeedMetrics {
    messages: Family<MessageLabels, Counter>,
    events: Family<EventLabels, Counter>,
    block_events: Family<EventLabels, Counter>,
    connected: Family<EndpointLabel, Gauge>,
}

impl FeedMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "epp_kv_events_messages",
            "KV-event messages received per endpoint and outcome (applied, replayed, duplicate, decode_error, malformed, unknown_publisher)",
            self.messages.clone(),
        );
        registry.register(
            "epp_kv_events",
            "KV-cache events applied per endpoint and kind (block_stored, block_removed, all_blocks_cleared, unknown), and resynchronisations (gap_cleared, restart_cleared)",
            self.events.clone(),
        );
        registry.register(
            "epp_kv_events_blocks",
            "Blocks in the KV-cache events applied per endpoint and kind (stored, removed)",
            self.block_events.clone(),
        );
        registry.register(
            "epp_kv_events_subscribed",
            "1 while the subscriber to the endpoint's KV-event publisher is connected (0 from a disconnection until it has reconnected)",
            self.connected.clone(),
        );
    }

    /// The series applying `endpoint`'s messages adds to, resolved once so a
    /// message allocates no labels and takes no family lock.
    fn apply_counters(&self, endpoint: &str) -> ApplyCounters {
        let message = |outcome| {
            self.messages
                .get_or_create(&MessageLabels {
                    endpoint: endpoint.to_owned(),
                    outcome,
                })
                .clone()
        };
        let event = |family: &Family<EventLabels, Counter>, kind| {
            family
                .get_or_create(&EventLabels {
                    endpoint: endpoint.to_owned(),
                    kind,
                })
                .clone()
        };
        ApplyCounters {
            applied: message("applied"),
            replayed: message("replayed"),
            decode_error: message("decode_error"),
            unknown: event(&self.events, "unknown"),
            block_stored: event(&self.events, "block_stored"),
            block_removed: event(&self.events, "block_removed"),
            all_blocks_cleared: event(&self.events, "all_blocks_cleared"),
            stored_blocks: event(&self.block_events, "stored"),
            removed_blocks: event(&self.block_events, "removed"),
        }
    }

    fn message(&self, endpoint: &str, outcome: &'static str) {
        self.messages
            .get_or_create(&MessageLabels {
                endpoint: endpoint.to_owned(),
                outcome,
            })
            .inc();
    }

    fn event(&self, endpoint: &str, kind: &'static str, n: u64) {
        if n > 0 {
            self.events
                .get_or_create(&EventLabels {
                    endpoint: endpoint.to_owned(),
                    kind,
                })
                .inc_by(n);
        }
    }

    fn forget(&self, endpoint: &str) {
        let endpoint = endpoint.to_owned();
        self.connected.remove(&EndpointLabel {
            endpoint: endpoint.clone(),
        });
        for outcome in [
            "applied",
            "replayed",
            "duplicate",
            "decode_error",
            "malformed",
        ] {
            self.messages.remove(&MessageLabels {
                endpoint: endpoint.clone(),
                outcome,
            });
        }
        for kind in [
            "block_stored",
            "block_removed",
            "all_blocks_cleared",
            "unknown",
            "gap_cleared",
            "restart_cleared",
        ] {
            self.events.remove(&EventLabels {
                endpoint: endpoint.clone(),
                kind,
            });
        }
        for kind in ["stored", "removed"] {
            self.block_events.remove(&EventLabels {
                endpoint: endpoint.clone(),
                kind,
            });
        }
    }
}

/// See [`FeedMetrics::apply_counters`].
#[derive(Debug, Clone)]
struct ApplyCounters {
    applied: Counter,
    replayed: Counter,
    decode_error: Counter,
    unknown: Counter,
    block_stored: Counter,
    block_removed: Counter,
    all_blocks_cleared: Counter,
    stored_blocks: Counter,
    removed_blocks: Counter,
}

/// Starts following `store` with a subscriber per endpoint and group, plus
/// one bound subscriber per group with a `zmqEndpoint`.
pub(crate) fn start_feeds(
    store: Arc<EndpointStore>,
    groups: Vec<SinkGroup>,
    metrics: Arc<FeedMetrics>,
    stop: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let groups: Vec<Arc<SinkGroup>> = groups.into_iter().map(Arc::new).collect();
    let mut tasks = Vec::new();
    for g in &groups {
        if let Some(addr) = g.config.zmq_endpoint.clone() {
            tasks.push(tokio::spawn(bound(
                addr,
                Arc::clone(g),
                Arc::clone(&store),
                Arc::clone(&metrics),
                stop.clone(),
            )));
        }
    }
    let discovering: Vec<Arc<SinkGroup>> = groups
        .into_iter()
        .filter(|g| g.config.discover_pods)
        .collect();
    if !discovering.is_empty() {
        tasks.push(tokio::spawn(supervise(store, discovering, metrics, stop)));
    }
    tasks
}

/// The publisher address of `e` for `group`: its IP, the configured port plus
/// its data-parallel rank, which is its position among the endpoints sharing
/// its IP, by port (llm-d: the port's index among the pool's target ports).
fn publisher(
    e: &Endpoint,
    all: &[Arc<Endpoint>],
    config: &KvEventsConfig,
) -> (String, Option<String>) {
    let ip = e.addr().ip();
    let rank = all
        .iter()
        .filter(|o| o.addr().ip() == ip && o.addr().port() < e.addr().port())
        .count();
    let rank = u16::try_from(rank).unwrap_or(u16::MAX);
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let pd = &config.pod_discovery_config;
    let sub = format!("tcp://{host}:{}", pd.socket_port.saturating_add(rank));
    let replay = (pd.replay_socket_port > 0).then(|| {
        format!(
            "tcp://{host}:{}",
            pd.replay_socket_port.saturating_add(rank)
        )
    });
    (sub, replay)
}

type Running = HashMap<(usize, EndpointId), (Arc<Endpoint>, String, JoinHandle<()>)>;

async fn supervise(
    store: Arc<EndpointStore>,
    groups: Vec<Arc<SinkGroup>>,
    metrics: Arc<FeedMetrics>,
    stop: CancellationToken,
) {
    let mut changes = store.subscribe();
    let mut running: Running = HashMap::new();
    loop {
        changes.borrow_and_update();
        let snapshot = store.snapshot();
        let all = snapshot.endpoints();
        running.retain(|(gi, id), (endpoint, addr, task)| {
            let current = snapshot.get(*id);
            let keep = current.is_some_and(|e| {
                Arc::ptr_eq(e, endpoint) && publisher(e, all, &groups[*gi].config).0 == *addr
            });
            if !keep {
                task.abort();
                if current.is_none() {
                    groups[*gi].clear(*id);
                    metrics.forget(endpoint.addr_str());
                }
            }
            keep
        });
        for (gi, g) in groups.iter().enumerate() {
            for e in all {
                running.entry((gi, e.id())).or_insert_with(|| {
                    let (sub, replay) = publisher(e, all, &g.config);
                    let task = tokio::spawn(follow(
                        Arc::clone(e),
                        sub.clone(),
                        replay,
                        Arc::clone(g),
                        Arc::clone(&metrics),
                        stop.clone(),
                    ));
                    (Arc::clone(e), sub, task)
                });
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            changed = changes.changed() => if changed.is_err() { break },
        }
    }
    for (_, (_, _, task)) in running {
        task.abort();
        let _ = task.await;
    }
}

/// One message's frames.
struct Frame {
    seq: u64,
    payload: Bytes,
}

fn frames(msg: ZmqMessage) -> Option<(Bytes, Frame)> {
    let mut it = msg.into_vec().into_iter();
    let (topic, seq, payload) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    let seq = u64::from_be_bytes(seq.get(..8)?.try_into().ok()?);
    Some((topic, Frame { seq, payload }))
}

/// Where one publisher's stream stands.
#[derive(Debug, Default)]
struct Stream {
    /// The last sequence number applied.
    applied: Option<u64>,
    /// The last sequence number received live.
    live: Option<u64>,
}

/// What to do with a live message.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Apply,
    Duplicate,
    /// Sequence numbers `from..seq` are missing.
    Gap {
        from: u64,
    },
    /// The engine restarted (its numbers went back).
    Restarted,
    /// The first message seen, not the stream's first.
    Joined,
}

impl Stream {
    fn classify(&mut self, seq: u64) -> Next {
        let restarted = self.live.is_some_and(|l| seq < l);
        self.live = Some(seq);
        if restarted {
            return Next::Restarted;
        }
        match self.applied {
            None if seq == 0 => Next::Apply,
            None => Next::Joined,
            Some(a) if seq <= a => Next::Duplicate,
            Some(a) if seq == a + 1 => Next::Apply,
            Some(a) => Next::Gap { from: a + 1 },
        }
    }
}

/// Decodes and applies one payload, counted as replayed or applied.
fn apply(
    endpoint: &Arc<Endpoint>,
    group: &SinkGroup,
    counters: &ApplyCounters,
    batch: &mut KvEventBatch,
    topic: &[u8],
    payload: &[u8],
    replayed: bool,
) -> bool {
    match decode_batch(payload, batch) {
        Ok(d) => {
            let model = topic_model(topic);
            if batch.model.as_deref() != model {
                batch.model = model.map(str::to_owned);
            }
            group.apply(endpoint, batch);
            let c = counters;
            if replayed { &c.replayed } else { &c.applied }.inc();
            c.unknown.inc_by(u64::from(d.unknown_events));
            for e in &batch.events {
                match e {
                    KvEvent::BlockStored(s) => {
                        c.block_stored.inc();
                        c.stored_blocks.inc_by(s.block_hashes.len() as u64);
                    }
                    KvEvent::BlockRemoved { block_hashes, .. } => {
                        c.block_removed.inc();
                        c.removed_blocks.inc_by(block_hashes.len() as u64);
                    }
                    KvEvent::AllBlocksCleared => {
                        c.all_blocks_cleared.inc();
                    }
                }
            }
            true
        }
        Err(e) => {
            counters.decode_error.inc();
            tracing::debug!(endpoint = endpoint.addr_str(), error = %e, "undecodable KV-event batch");
            false
        }
    }
}

/// Follows one endpoint's publisher until stopped or aborted.
async fn follow(
    endpoint: Arc<Endpoint>,
    addr: String,
    replay: Option<String>,
    group: Arc<SinkGroup>,
    metrics: Arc<FeedMetrics>,
    stop: CancellationToken,
) {
    let label = EndpointLabel {
        endpoint: endpoint.addr_str().to_owned(),
    };
    let counters = metrics.apply_counters(endpoint.addr_str());
    let mut stream = Stream::default();
    let mut batch = KvEventBatch::default();
    let mut warned_decode = false;
    loop {
        let mut sub = SubSocket::new();
        // Disconnections (the socket reconnects by itself) show in the gauge.
        let mut monitor = sub.monitor();
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            r = tokio::time::timeout(CONNECT_TIMEOUT, sub.connect(&addr)) => matches!(r, Ok(Ok(()))),
        };
        if !connected || sub.subscribe(&group.config.topic_filter).await.is_err() {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RETRY) => continue,
            }
        }
        metrics.connected.get_or_create(&label).set(1);
        let mut up = true;
        tracing::info!(endpoint = %endpoint.addr_str(), publisher = %addr, "subscribed to KV events");
        loop {
            let msg = tokio::select! {
                () = stop.cancelled() => return,
                m = sub.recv() => m,
                // A closed monitor (None) disables this branch for the select.
                Some(event) = monitor.next() => {
                    match event {
                        SocketEvent::Disconnected(_) if up => {
                            up = false;
                            metrics.connected.get_or_create(&label).set(0);
                            tracing::info!(endpoint = %endpoint.addr_str(), publisher = %addr, "KV-event publisher disconnected; reconnecting");
                        }
                        SocketEvent::Connected(..) if !up => {
                            up = true;
                            metrics.connected.get_or_create(&label).set(1);
                        }
                        _ => {}
                    }
                    continue;
                }
            };
            let Ok(msg) = msg else { break };
            if !up {
                up = true;
                metrics.connected.get_or_create(&label).set(1);
            }
            let Some((topic, frame)) = frames(msg) else {
                metrics.message(endpoint.addr_str(), "malformed");
                continue;
            };
            let next = stream.classify(frame.seq);
            let from = match next {
                Next::Apply => None,
                Next::Duplicate => {
                    metrics.message(endpoint.addr_str(), "duplicate");
                    continue;
                }
                Next::Restarted => {
                    group.clear(endpoint.id());
                    metrics.event(endpoint.addr_str(), "restart_cleared", 1);
                    stream.applied = None;
                    (frame.seq > 0).then_some(0)
                }
                Next::Gap { from } => Some(from),
                Next::Joined => Some(0),
            };
            if let Some(from) = from {
                let filled = match &replay {
                    Some(r) => {
                        replay_range(
                            r,
                            from,
                            frame.seq,
                            &endpoint,
                            &group,
                            &counters,
                            &mut batch,
                            &topic,
                            &mut stream,
                        )
                        .await
                    }
                    None => false,
                };
                // A stream joined at its start has nothing to forget.
                let fresh = next == Next::Joined && stream.applied.is_none();
                if !(filled || fresh) {
                    group.clear(endpoint.id());
                    metrics.event(endpoint.addr_str(), "gap_cleared", 1);
                }
            }
            // An unreadable batch is passed too: its events are lost like a gap's.
            stream.applied = Some(frame.seq);
            if !apply(
                &endpoint,
                &group,
                &counters,
                &mut batch,
                &topic,
                &frame.payload,
                false,
            ) {
                if !warned_decode {
                    warned_decode = true;
                    tracing::warn!(endpoint = %endpoint.addr_str(), "a KV-event batch could not be decoded (more at debug level; counted in epp_kv_events_messages_total)");
                }
                group.clear(endpoint.id());
            }
        }
        metrics.connected.get_or_create(&label).set(0);
    }
}

/// Asks `addr` (the engine's replay ROUTER) for messages `from..until` and
/// applies them in order. True when every one of them was applied.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site; a struct would only rename them"
)]
async fn replay_range(
    addr: &str,
    from: u64,
    until: u64,
    endpoint: &Arc<Endpoint>,
    group: &SinkGroup,
    counters: &ApplyCounters,
    batch: &mut KvEventBatch,
    topic: &[u8],
    stream: &mut Stream,
) -> bool {
    let mut dealer = DealerSocket::new();
    if !matches!(
        tokio::time::timeout(CONNECT_TIMEOUT, dealer.connect(addr)).await,
        Ok(Ok(()))
    ) {
        tracing::debug!(replay = addr, "replay socket unreachable");
        return false;
    }
    let mut ask = ZmqMessage::from(Bytes::new());
    ask.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
    if dealer.send(ask).await.is_err() {
        return false;
    }
    let mut expected = from;
    let mut restarted = false;
    for _ in 0..REPLAY_MAX {
        let Ok(Ok(msg)) = tokio::time::timeout(REPLAY_IDLE, dealer.recv()).await else {
            break;
        };
        // [b"", seq, payload]: the ROUTER's envelope delimiter, then the message.
        let mut it = msg.into_vec().into_iter().skip_while(|f| f.is_empty());
        let (Some(seq), payload) = (it.next(), it.next()) else {
            break;
        };
        let Some(seq) = seq
            .get(..8)
            .and_then(|s| s.try_into().ok())
            .map(i64::from_be_bytes)
        else {
            break;
        };
        if seq < 0 {
            break;
        }
        let seq = seq as u64;
        if seq >= until {
            continue;
        }
        if seq < expected {
            continue;
        }
        if seq > expected {
            // The engine no longer buffers what is missing.
            restarted = true;
            break;
        }
        let payload = payload.unwrap_or_default();
        apply(endpoint, group, counters, batch, topic, &payload, true);
        stream.applied = Some(seq);
        expected = seq + 1;
    }
    !restarted && expected == until
}

/// Subscribes on a bound address: engines connect and name themselves in the
/// topic `kv@<endpoint>@<model>`, `<endpoint>` being the endpoint's
/// `ip:port`, its name, or its IP (the lowest port wins).
async fn bound(
    addr: String,
    group: Arc<SinkGroup>,
    store: Arc<EndpointStore>,
    metrics: Arc<FeedMetrics>,
    stop: CancellationToken,
) {
    let mut sub = SubSocket::new();
    loop {
        let bound = tokio::select! {
            () = stop.cancelled() => return,
            r = sub.bind(&addr) => r,
        };
        match bound {
            Ok(at) => {
                tracing::info!(address = %at, "listening for KV events");
                break;
            }
            Err(e) => {
                tracing::warn!(address = %addr, error = %e, "cannot bind the KV-event subscriber; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY * 5) => {}
                }
            }
        }
    }
    if sub.subscribe(&group.config.topic_filter).await.is_err() {
        return;
    }
    let mut streams: HashMap<EndpointId, (Stream, ApplyCounters)> = HashMap::new();
    let mut batch = KvEventBatch::default();
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => return,
            m = sub.recv() => m,
        };
        let Ok(msg) = msg else { continue };
        let Some((topic, frame)) = frames(msg) else {
            metrics.message("unknown", "malformed");
            continue;
        };
        let snapshot = store.snapshot();
        let Some(endpoint) = topic_endpoint(&topic, snapshot.endpoints()) else {
            metrics.message("unknown", "unknown_publisher");
            continue;
        };
        if streams.len() > snapshot.endpoints().len() {
            streams.retain(|id, _| snapshot.get(*id).is_some());
        }
        let (stream, counters) = streams.entry(endpoint.id()).or_insert_with(|| {
            (
                Stream::default(),
                metrics.apply_counters(endpoint.addr_str()),
            )
        });
        match stream.classify(frame.seq) {
            Next::Duplicate => {
                metrics.message(endpoint.addr_str(), "duplicate");
                continue;
            }
            Next::Apply => {}
            Next::Joined => {}
            Next::Restarted | Next::Gap { .. } => {
                group.clear(endpoint.id());
                metrics.event(endpoint.addr_str(), "gap_cleared", 1);
            }
        }
        stream.applied = Some(frame.seq);
        if !apply(
            &endpoint,
            &group,
            counters,
            &mut batch,
            &topic,
            &frame.payload,
            false,
        ) {
            group.clear(endpoint.id());
        }
    }
}

/// The model a topic `kv@<who>@<model>` names.
fn topic_model(topic: &[u8]) -> Option<&str> {
    let topic = std::str::from_utf8(topic).ok()?;
    let mut parts = topic.splitn(3, '@');
    let (_, _, model) = (parts.next()?, parts.next()?, parts.next()?);
    (!model.is_empty()).then_some(model)
}

/// The endpoint a topic `kv@<who>@<model>` names.
fn topic_endpoint(topic: &[u8], all: &[Arc<Endpoint>]) -> Option<Arc<Endpoint>> {
    let topic = std::str::from_utf8(topic).ok()?;
    let mut parts = topic.split('@');
    let who = match (parts.next(), parts.next()) {
        (Some(_), Some(who)) => who,
        _ => topic,
    };
    if let Some(e) = all.iter().find(|e| e.addr_str() == who || e.name() == who) {
        return Some(Arc::clone(e));
    }
    let ip: IpAddr = who.parse().ok()?;
    all.iter()
        .filter(|e| e.addr().ip() == ip)
        .min_by_key(|e| e.addr().port())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_classify() {
        let mut s = Stream::default();
        assert_eq!(s.classify(0), Next::Apply);
        s.applied = Some(0);
        assert_eq!(s.classify(1), Next::Apply);
        s.applied = Some(1);
        assert_eq!(s.classify(1), Next::Duplicate);
        assert_eq!(s.classify(4), Next::Gap { from: 2 });
        s.applied = Some(4);
        assert_eq!(s.classify(2), Next::Restarted);
        let mut late = Stream::default();
        assert_eq!(late.classify(7), Next::Joined);
    }

    #[test]
    fn topics_name_endpoints_by_address_name_or_ip() {
        let a = Arc::new(Endpoint::new(0, "10.0.0.1:8001".parse().expect("addr")));
        let b = Arc::new(Endpoint::new(1, "10.0.0.1:8000".parse().expect("addr")));
        let all = [Arc::clone(&a), Arc::clone(&b)];
        let found = |t: &str| topic_endpoint(t.as_bytes(), &all).map(|e| e.id());
        assert_eq!(found("kv@10.0.0.1:8001@m"), Some(a.id()));
        assert_eq!(found("kv@10.0.0.1@m"), Some(b.id()), "lowest port");
        assert_eq!(found("kv@10.0.0.2@m"), None);
        assert_eq!(found("garbage"), None);
    }

    #[test]
    fn ranks_offset_the_publisher_port() {
        let mk = |i: u32, a: &str| Arc::new(Endpoint::new(i, a.parse().expect("addr")));
        let all = [
            mk(0, "10.0.0.1:8001"),
            mk(1, "10.0.0.1:8000"),
            mk(2, "10.0.0.2:8000"),
        ];
        let mut cfg = KvEventsConfig::default();
        cfg.pod_discovery_config.replay_socket_port = 6000;
        assert_eq!(
            publisher(&all[0], &all, &cfg),
            (
                "tcp://10.0.0.1:5558".into(),
                Some("tcp://10.0.0.1:6001".into())
            )
        );
        assert_eq!(publisher(&all[1], &all, &cfg).0, "tcp://10.0.0.1:5557");
        assert_eq!(publisher(&all[2], &all, &cfg).0, "tcp://10.0.0.2:5557");
    }
}
