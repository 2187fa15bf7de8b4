//! Replicas that tell each other what they dispatched and picked (see
//! [`epp_core::replicas`]): the plugin types `udp-peer-syncer`,
//! `local-syncer` (llm-d's) and `static-peer-discovery`, and [`PeerSync`],
//! which carries the state between replicas.
//!
//! Transport: one UDP socket per replica. What a replica sends is state, not
//! deltas: an endpoint's local in-flight counts as they are now, and a pick
//! (plugin, endpoint, block keys). A lost datagram is repaired by the next
//! one or by the full state every replica sends each
//! `crossReplicaSyncInterval`; a replica not heard from for three intervals
//! (at least a second) is forgotten, its in-flight counts with it. Changes
//! are sent as they happen (the request path only wakes the sender), so a
//! peer sees a dispatch within a loopback or pod-network round trip.
//!
//! The port takes what anyone who can reach it sends: keep it reachable by
//! the replicas only (a NetworkPolicy in Kubernetes). What it receives is
//! bounded: 64 peers, endpoints the replica knows, picks of at most
//! [`MAX_PICK_KEYS`] blocks; anything malformed is counted and dropped.

use std::{
    collections::{HashMap, VecDeque},
    io,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use epp_core::{
    BuildError, Endpoint, EndpointSource, InflightSample, Plugin, PluginRef,
    replicas::{PeerDiscovery, ReplicaFeed, ReplicaSyncer},
};
use parking_lot::Mutex;
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::{net::UdpSocket, sync::Notify};
use tokio_util::sync::CancellationToken;

/// `udp-peer-syncer` parameters.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UdpPeerSyncerParams {
    /// Where this replica listens for its peers, `ip:port` (required; the
    /// same port on every replica suits a headless Service).
    #[serde(default)]
    pub address: String,
}

/// `udp-peer-syncer`: shares in-flight load and picks with the replicas a
/// peer-discovery plugin names, over UDP (see the module docs).
#[derive(Debug, Clone)]
pub struct UdpPeerSyncer {
    name: String,
    address: SocketAddr,
}

impl UdpPeerSyncer {
    /// YAML type.
    pub const TYPE: &'static str = "udp-peer-syncer";

    /// A syncer named `name`.
    ///
    /// # Errors
    /// `address` missing or not `ip:port`.
    pub fn new(name: impl Into<String>, params: &UdpPeerSyncerParams) -> Result<Self, BuildError> {
        let name = name.into();
        let address = params
            .address
            .parse()
            .map_err(|_| BuildError::InvalidValue {
                plugin: name.clone(),
                field: "address".into(),
                value: params.address.clone(),
                reason: "must be ip:port, e.g. 0.0.0.0:9005".into(),
            })?;
        Ok(Self { name, address })
    }
}

impl Plugin for UdpPeerSyncer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_replica_syncer(&self) -> Option<&dyn ReplicaSyncer> {
        Some(self)
    }
}

impl ReplicaSyncer for UdpPeerSyncer {
    fn listen_address(&self) -> Option<SocketAddr> {
        Some(self.address)
    }
}

/// llm-d's `local-syncer`: the syncer of a single replica, sharing nothing.
/// Loads so llm-d's configs do; a replica running it routes on its own view.
#[derive(Debug, Clone)]
pub struct LocalSyncer {
    name: String,
}

impl LocalSyncer {
    /// YAML type (llm-d's).
    pub const TYPE: &'static str = "local-syncer";

    /// A syncer named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Plugin for LocalSyncer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_replica_syncer(&self) -> Option<&dyn ReplicaSyncer> {
        Some(self)
    }
}

impl ReplicaSyncer for LocalSyncer {
    fn listen_address(&self) -> Option<SocketAddr> {
        None
    }
}

/// `static-peer-discovery` parameters.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StaticPeerDiscoveryParams {
    /// `host:port` of every replica (this one may be listed too); a host
    /// name stands for every address it resolves to, re-resolved every
    /// [`RESOLVE_EVERY`].
    #[serde(default)]
    pub peers: Vec<String>,
}

/// `static-peer-discovery`: the replicas' addresses, listed, or a DNS name
/// that resolves to all of them (a headless Service).
#[derive(Debug, Clone)]
pub struct StaticPeerDiscovery {
    name: String,
    peers: Vec<String>,
}

impl StaticPeerDiscovery {
    /// YAML type.
    pub const TYPE: &'static str = "static-peer-discovery";

    /// A discovery named `name`.
    ///
    /// # Errors
    /// No peers, or an entry that is not `host:port`.
    pub fn new(
        name: impl Into<String>,
        params: StaticPeerDiscoveryParams,
    ) -> Result<Self, BuildError> {
        let name = name.into();
        let invalid = |value: &str, reason: &str| BuildError::InvalidValue {
            plugin: name.clone(),
            field: "peers".into(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        if params.peers.is_empty() {
            return Err(invalid("", "required: host:port of every replica"));
        }
        for p in &params.peers {
            let port = p.rsplit_once(':').map(|(h, port)| (h, port.parse::<u16>()));
            if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
                return Err(invalid(p, "must be host:port"));
            }
        }
        Ok(Self {
            name,
            peers: params.peers,
        })
    }
}

impl Plugin for StaticPeerDiscovery {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_peer_discovery(&self) -> Option<&dyn PeerDiscovery> {
        Some(self)
    }
}

impl PeerDiscovery for StaticPeerDiscovery {
    fn peer_addresses(&self) -> &[String] {
        &self.peers
    }
}

/// How often peer host names are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(10);

/// Blocks a pick carries at most (a longer prompt's leading blocks).
pub const MAX_PICK_KEYS: usize = 7_000;

const MAX_PEERS: usize = 64;
const MAX_QUEUED_PICKS: usize = 1_024;
const LOAD_DATAGRAM: usize = 1_200;
const MAGIC: &[u8; 4] = b"EPPS";
const VERSION: u8 = 1;
const KIND_LOAD: u8 = 1;
const KIND_PICK: u8 = 2;
const HEADER: usize = 4 + 1 + 1 + 8 + 8;

/// Why a received datagram (or part of it) was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Not this protocol, or another version of it.
    NotOurs,
    /// Cut short, or a length that runs past the end.
    Truncated,
    /// An unknown kind, address tag or a name that is not UTF-8.
    Invalid,
}

/// One decoded datagram.
#[derive(Debug, PartialEq)]
enum Message<'a> {
    Load(Vec<(SocketAddr, InflightSample)>),
    Pick {
        plugin: &'a str,
        endpoint: SocketAddr,
        keys: Vec<u64>,
    },
}

#[derive(Debug, PartialEq)]
struct Datagram<'a> {
    replica: u64,
    seq: u64,
    message: Message<'a>,
}

fn put_header(out: &mut Vec<u8>, kind: u8, replica: u64, seq: u64) {
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&replica.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
}

fn put_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

/// The body of a pick datagram (the header is written when it is sent).
fn encode_pick(plugin: &str, endpoint: SocketAddr, keys: &[u64]) -> Vec<u8> {
    let plugin = &plugin.as_bytes()[..plugin.len().min(255)];
    let keys = &keys[..keys.len().min(MAX_PICK_KEYS)];
    let mut out = Vec::with_capacity(1 + plugin.len() + 19 + 2 + keys.len() * 8);
    out.push(plugin.len() as u8);
    out.extend_from_slice(plugin);
    put_addr(&mut out, endpoint);
    out.extend_from_slice(&(keys.len() as u16).to_le_bytes());
    for k in keys {
        out.extend_from_slice(&k.to_le_bytes());
    }
    out
}

fn put_load(out: &mut Vec<u8>, addr: SocketAddr, s: InflightSample) {
    put_addr(out, addr);
    out.extend_from_slice(&s.requests.to_le_bytes());
    out.extend_from_slice(&s.tokens.to_le_bytes());
    out.extend_from_slice(&s.uncached_tokens.to_le_bytes());
}

/// Reads the wire, never past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn addr(&mut self) -> Result<SocketAddr, WireError> {
        let ip = match self.u8()? {
            4 => IpAddr::from(self.array::<4>()?),
            6 => IpAddr::from(self.array::<16>()?),
            _ => return Err(WireError::Invalid),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }
}

fn decode(buf: &[u8]) -> Result<Datagram<'_>, WireError> {
    let mut r = Reader(buf);
    if r.take(4).map_err(|_| WireError::NotOurs)? != MAGIC || r.u8()? != VERSION {
        return Err(WireError::NotOurs);
    }
    let kind = r.u8()?;
    let replica = r.u64()?;
    let seq = r.u64()?;
    let message = match kind {
        KIND_LOAD => {
            let n = usize::from(r.u16()?);
            // Each entry is at least 27 bytes: a count past the end is
            // refused before anything is allocated for it.
            if n.saturating_mul(27) > r.0.len() {
                return Err(WireError::Truncated);
            }
            let mut loads = Vec::with_capacity(n);
            for _ in 0..n {
                let addr = r.addr()?;
                let sample = InflightSample {
                    requests: r.u32()?,
                    tokens: r.u64()?,
                    uncached_tokens: r.u64()?,
                };
                loads.push((addr, sample));
            }
            Message::Load(loads)
        }
        KIND_PICK => {
            let len = usize::from(r.u8()?);
            let plugin = std::str::from_utf8(r.take(len)?).map_err(|_| WireError::Invalid)?;
            let endpoint = r.addr()?;
            let n = usize::from(r.u16()?);
            let raw = r.take(n.checked_mul(8).ok_or(WireError::Truncated)?)?;
            let keys = raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            Message::Pick {
                plugin,
                endpoint,
                keys,
            }
        }
        _ => return Err(WireError::Invalid),
    };
    if !r.0.is_empty() {
        return Err(WireError::Invalid);
    }
    Ok(Datagram {
        replica,
        seq,
        message,
    })
}

/// What the request path hands over: a wake-up and the picks to send.
#[derive(Debug)]
struct Feed {
    wake: Notify,
    load_dirty: AtomicBool,
    picks: Mutex<VecDeque<Vec<u8>>>,
    metrics: Metrics,
}

impl ReplicaFeed for Feed {
    fn load_changed(&self) {
        self.load_dirty.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    fn picked(&self, plugin: &str, endpoint: &Endpoint, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        let body = encode_pick(plugin, endpoint.addr(), keys);
        {
            let mut q = self.picks.lock();
            if q.len() >= MAX_QUEUED_PICKS {
                q.pop_front();
                self.metrics.dropped("queue_full");
            }
            q.push_back(body);
        }
        self.wake.notify_one();
    }
}

/// The syncer's counters (`epp_replica_sync_*`).
#[derive(Debug, Clone, Default)]
struct Metrics {
    messages: Family<[(&'static str, &'static str); 2], Counter>,
    dropped: Family<[(&'static str, &'static str); 1], Counter>,
    peers: Gauge,
}

impl Metrics {
    fn message(&self, direction: &'static str, kind: &'static str) {
        self.messages
            .get_or_create(&[("direction", direction), ("kind", kind)])
            .inc();
    }
    fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&[("reason", reason)]).inc();
    }
}

/// Carries in-flight load and picks between replicas (see the module docs).
///
/// Made with [`Self::bind`] before the scheduler (whose dispatches report to
/// [`Self::feed`]) and started with [`Self::start`] once the endpoint set
/// exists.
#[derive(Debug)]
pub struct PeerSync {
    feed: Arc<Feed>,
    socket: std::net::UdpSocket,
    replica: u64,
    peers: Vec<String>,
    interval: Duration,
}

impl PeerSync {
    /// Binds `listen`; `peers` are `host:port` entries (this replica's own
    /// may be among them); the whole state is sent every `interval`.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn bind(listen: SocketAddr, peers: Vec<String>, interval: Duration) -> io::Result<Self> {
        let socket = std::net::UdpSocket::bind(listen)?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            feed: Arc::new(Feed {
                wake: Notify::new(),
                load_dirty: AtomicBool::new(false),
                picks: Mutex::new(VecDeque::new()),
                metrics: Metrics::default(),
            }),
            socket,
            replica: rand::random(),
            peers,
            interval: interval.max(Duration::from_millis(1)),
        })
    }

    /// Where it listens (the real port when 0 was asked).
    ///
    /// # Errors
    /// The socket's address cannot be read.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// What the scheduler ([`epp_core::Scheduler::with_replica_feed`]) and
    /// the plugins that share picks report to.
    #[must_use]
    pub fn feed(&self) -> Arc<dyn ReplicaFeed> {
        Arc::clone(&self.feed) as Arc<dyn ReplicaFeed>
    }

    /// Registers `epp_replica_sync_messages` (by direction and kind: load,
    /// pick), `epp_replica_sync_dropped` (by reason) and
    /// `epp_replica_sync_peers` (replicas heard from recently).
    pub fn register_metrics(&self, registry: &mut Registry) {
        let m = &self.feed.metrics;
        registry.register(
            "epp_replica_sync_messages",
            "Datagrams exchanged with other epp replicas, by direction (sent, received) and kind (load, pick)",
            m.messages.clone(),
        );
        registry.register(
            "epp_replica_sync_dropped",
            "State from or for other replicas not applied, by reason (malformed, stale, unknown_endpoint, unknown_plugin, too_many_peers, queue_full, send_error)",
            m.dropped.clone(),
        );
        registry.register(
            "epp_replica_sync_peers",
            "Other epp replicas heard from within three sync intervals",
            m.peers.clone(),
        );
    }

    /// Starts sending and receiving: every plugin of `plugins` that shares
    /// picks publishes to this syncer from now on and records its peers'
    /// picks; endpoints are found in `source`. Runs until `shutdown`.
    ///
    /// # Errors
    /// The socket cannot join the runtime (not called inside one).
    pub fn start(
        self,
        source: Arc<dyn EndpointSource>,
        plugins: &[(String, PluginRef)],
        shutdown: CancellationToken,
    ) -> io::Result<()> {
        let socket = Arc::new(UdpSocket::from_std(self.socket)?);
        let own = socket.local_addr()?;
        let feed: Arc<dyn ReplicaFeed> = Arc::clone(&self.feed) as Arc<dyn ReplicaFeed>;
        let sharing: HashMap<String, PluginRef> = plugins
            .iter()
            .filter(|(_, p)| p.plugin().as_shares_picks().is_some())
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect();
        for p in sharing.values() {
            if let Some(s) = p.plugin().as_shares_picks() {
                s.share_picks(Arc::clone(&feed));
            }
        }
        tracing::info!(listen = %own, peers = ?self.peers, interval = ?self.interval,
            sharing_picks = ?sharing.keys().collect::<Vec<_>>(), "sharing state with other epp replicas");
        let sender = Sender {
            feed: Arc::clone(&self.feed),
            socket: Arc::clone(&socket),
            source: Arc::clone(&source),
            replica: self.replica,
            own,
            entries: self.peers,
            peers: Vec::new(),
            resolved: None,
            seq: 0,
            sent: HashMap::new(),
            buf: Vec::with_capacity(64 * 1024),
        };
        let receiver = Receiver {
            metrics: self.feed.metrics.clone(),
            socket,
            source,
            replica: self.replica,
            sharing,
            peers: HashMap::new(),
            forget_after: (self.interval * 3).max(Duration::from_secs(1)),
        };
        tokio::spawn(sender.run(self.interval, shutdown.clone()));
        tokio::spawn(receiver.run(self.interval, shutdown));
        Ok(())
    }
}

struct Sender {
    feed: Arc<Feed>,
    socket: Arc<UdpSocket>,
    source: Arc<dyn EndpointSource>,
    replica: u64,
    own: SocketAddr,
    entries: Vec<String>,
    peers: Vec<SocketAddr>,
    resolved: Option<Instant>,
    seq: u64,
    /// What each endpoint's load was when last sent.
    sent: HashMap<SocketAddr, InflightSample>,
    buf: Vec<u8>,
}

impl Sender {
    async fn run(mut self, interval: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let full = tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.feed.wake.notified() => false,
                _ = tick.tick() => true,
            };
            if self.resolved.is_none_or(|t| t.elapsed() >= RESOLVE_EVERY) {
                self.resolve().await;
            }
            let dirty = self.feed.load_dirty.swap(false, Ordering::AcqRel);
            if full || dirty {
                self.send_loads(full).await;
            }
            loop {
                let Some(body) = self.feed.picks.lock().pop_front() else {
                    break;
                };
                self.start_datagram(KIND_PICK);
                self.buf.extend_from_slice(&body);
                self.send("pick").await;
            }
        }
    }

    async fn resolve(&mut self) {
        let mut peers = Vec::new();
        for entry in &self.entries {
            match tokio::net::lookup_host(entry.as_str()).await {
                Ok(addrs) => peers.extend(addrs),
                Err(e) => tracing::warn!(peer = %entry, error = %e, "cannot resolve an epp peer"),
            }
        }
        peers.retain(|a| *a != self.own);
        peers.sort_unstable();
        peers.dedup();
        if peers != self.peers {
            tracing::info!(peers = ?peers, "epp peers");
        }
        // A failed lookup keeps the last good addresses.
        if !peers.is_empty() || self.peers.is_empty() {
            self.peers = peers;
        }
        self.resolved = Some(Instant::now());
    }

    fn start_datagram(&mut self, kind: u8) {
        self.seq += 1;
        self.buf.clear();
        put_header(&mut self.buf, kind, self.replica, self.seq);
    }

    /// Every endpoint's local load (`full`), or those changed since sent.
    async fn send_loads(&mut self, full: bool) {
        let snapshot = self.source.snapshot();
        let mut changed = Vec::new();
        for e in snapshot.endpoints() {
            let now = e.inflight().local();
            if full || self.sent.get(&e.addr()) != Some(&now) {
                changed.push((e.addr(), now));
            }
        }
        if full {
            self.sent.retain(|a, _| snapshot.by_addr(*a).is_some());
        }
        for chunk in changed.chunks((LOAD_DATAGRAM - HEADER - 2) / 39) {
            self.start_datagram(KIND_LOAD);
            self.buf
                .extend_from_slice(&(chunk.len() as u16).to_le_bytes());
            for &(addr, sample) in chunk {
                put_load(&mut self.buf, addr, sample);
                self.sent.insert(addr, sample);
            }
            self.send("load").await;
        }
    }

    async fn send(&mut self, kind: &'static str) {
        for peer in &self.peers {
            match self.socket.send_to(&self.buf, peer).await {
                Ok(_) => self.feed.metrics.message("sent", kind),
                Err(_) => self.feed.metrics.dropped("send_error"),
            }
        }
    }
}

struct PeerState {
    seen: Instant,
    seq: u64,
    loads: HashMap<SocketAddr, InflightSample>,
}

struct Receiver {
    metrics: Metrics,
    socket: Arc<UdpSocket>,
    source: Arc<dyn EndpointSource>,
    replica: u64,
    sharing: HashMap<String, PluginRef>,
    peers: HashMap<u64, PeerState>,
    forget_after: Duration,
}

impl Receiver {
    async fn run(mut self, interval: Duration, shutdown: CancellationToken) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = self.socket.recv_from(&mut buf) => match r {
                    Ok((n, _)) => self.receive(&buf[..n]),
                    Err(e) => tracing::debug!(error = %e, "peer sync receive"),
                },
                _ = tick.tick() => self.forget_silent(),
            }
        }
    }

    fn receive(&mut self, datagram: &[u8]) {
        let d = match decode(datagram) {
            Ok(d) => d,
            Err(_) => return self.metrics.dropped("malformed"),
        };
        if d.replica == self.replica {
            return;
        }
        if !self.peers.contains_key(&d.replica) && self.peers.len() >= MAX_PEERS {
            return self.metrics.dropped("too_many_peers");
        }
        let snapshot = self.source.snapshot();
        let peer = self.peers.entry(d.replica).or_insert_with(|| PeerState {
            seen: Instant::now(),
            seq: 0,
            loads: HashMap::new(),
        });
        peer.seen = Instant::now();
        self.metrics.peers.set(self.peers.len() as i64);
        match d.message {
            Message::Load(loads) => {
                self.metrics.message("received", "load");
                let Some(peer) = self.peers.get_mut(&d.replica) else {
                    return;
                };
                // Loads are absolute: an older datagram than one applied
                // would put a count back.
                if d.seq <= peer.seq {
                    return self.metrics.dropped("stale");
                }
                peer.seq = d.seq;
                // Departed endpoints' counts go; the sums that change are
                // those of the endpoints this datagram names.
                peer.loads.retain(|a, _| snapshot.by_addr(*a).is_some());
                let mut changed = Vec::with_capacity(loads.len());
                for (addr, sample) in loads {
                    if snapshot.by_addr(addr).is_none() {
                        self.metrics.dropped("unknown_endpoint");
                        continue;
                    }
                    peer.loads.insert(addr, sample);
                    changed.push(addr);
                }
                for addr in changed {
                    self.apply_sum(&snapshot, addr);
                }
            }
            Message::Pick {
                plugin,
                endpoint,
                keys,
            } => {
                self.metrics.message("received", "pick");
                let Some(e) = snapshot.by_addr(endpoint) else {
                    return self.metrics.dropped("unknown_endpoint");
                };
                match self
                    .sharing
                    .get(plugin)
                    .and_then(|p| p.plugin().as_shares_picks())
                {
                    Some(p) => p.peer_picked(e, &keys),
                    None => self.metrics.dropped("unknown_plugin"),
                }
            }
        }
    }

    /// Sets `addr`'s peer in-flight counts to the sum of what each peer
    /// last said.
    fn apply_sum(&self, snapshot: &epp_core::EndpointSnapshot, addr: SocketAddr) {
        let Some(e) = snapshot.by_addr(addr) else {
            return;
        };
        let mut sum = InflightSample::default();
        for p in self.peers.values() {
            if let Some(s) = p.loads.get(&addr) {
                sum.requests = sum.requests.saturating_add(s.requests);
                sum.tokens = sum.tokens.saturating_add(s.tokens);
                sum.uncached_tokens = sum.uncached_tokens.saturating_add(s.uncached_tokens);
            }
        }
        e.inflight().set_peers(sum);
    }

    /// Forgets replicas not heard from (stopped, restarted under a new id):
    /// their in-flight counts no longer load any endpoint.
    fn forget_silent(&mut self) {
        let now = Instant::now();
        let before = self.peers.len();
        let mut addrs = Vec::new();
        self.peers.retain(|id, p| {
            let keep = now.duration_since(p.seen) < self.forget_after;
            if !keep {
                tracing::info!(
                    replica = format_args!("{id:016x}"),
                    "epp peer silent: forgotten"
                );
                addrs.extend(p.loads.keys().copied());
            }
            keep
        });
        if self.peers.len() != before {
            let snapshot = self.source.snapshot();
            for addr in addrs {
                self.apply_sum(&snapshot, addr);
            }
            self.metrics.peers.set(self.peers.len() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(requests: u32) -> InflightSample {
        InflightSample {
            requests,
            tokens: u64::from(requests) * 100,
            uncached_tokens: u64::from(requests) * 10,
        }
    }

    #[test]
    fn a_pick_and_a_load_survive_the_wire() {
        let e: SocketAddr = "10.0.0.7:8000".parse().unwrap();
        let mut buf = Vec::new();
        put_header(&mut buf, KIND_PICK, 42, 7);
        buf.extend_from_slice(&encode_pick("prefix", e, &[1, 2, u64::MAX]));
        assert_eq!(
            decode(&buf),
            Ok(Datagram {
                replica: 42,
                seq: 7,
                message: Message::Pick {
                    plugin: "prefix",
                    endpoint: e,
                    keys: vec![1, 2, u64::MAX]
                }
            })
        );
        let v6: SocketAddr = "[fd00::1]:9".parse().unwrap();
        buf.clear();
        put_header(&mut buf, KIND_LOAD, 1, 2);
        buf.extend_from_slice(&2u16.to_le_bytes());
        put_load(&mut buf, e, sample(3));
        put_load(&mut buf, v6, sample(0));
        assert_eq!(
            decode(&buf).unwrap().message,
            Message::Load(vec![(e, sample(3)), (v6, sample(0))])
        );
    }

    #[test]
    fn a_pick_keeps_its_leading_blocks_when_too_long_for_a_datagram() {
        let keys: Vec<u64> = (0..MAX_PICK_KEYS as u64 + 500).collect();
        let mut buf = Vec::new();
        put_header(&mut buf, KIND_PICK, 1, 1);
        buf.extend_from_slice(&encode_pick("p", "127.0.0.1:1".parse().unwrap(), &keys));
        assert!(buf.len() <= 65_507, "fits one UDP datagram: {}", buf.len());
        let Message::Pick { keys: got, .. } = decode(&buf).unwrap().message else {
            panic!("a pick")
        };
        assert_eq!(got, keys[..MAX_PICK_KEYS]);
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let mut good = Vec::new();
        put_header(&mut good, KIND_PICK, 1, 1);
        good.extend_from_slice(&encode_pick("p", "127.0.0.1:1".parse().unwrap(), &[5; 3]));
        // Every truncation of a valid datagram is an error, never a panic.
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "cut at {n}");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(WireError::Invalid));
        assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(WireError::NotOurs));
        let mut load = Vec::new();
        put_header(&mut load, KIND_LOAD, 1, 1);
        load.extend_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            decode(&load),
            Err(WireError::Truncated),
            "a count past the end"
        );
        let mut kind = good.clone();
        kind[5] = 9;
        assert_eq!(decode(&kind), Err(WireError::Invalid));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
            let mut framed = Vec::new();
            put_header(&mut framed, bytes.first().map_or(KIND_LOAD, |b| 1 + b % 2), 1, 1);
            framed.extend_from_slice(&bytes);
            let _ = decode(&framed);
        }
    }

    #[test]
    fn peer_discovery_and_syncer_check_their_parameters() {
        assert!(
            UdpPeerSyncer::new(
                "s",
                &UdpPeerSyncerParams {
                    address: "0.0.0.0:9005".into()
                }
            )
            .is_ok()
        );
        let e = UdpPeerSyncer::new(
            "s",
            &UdpPeerSyncerParams {
                address: ":9005".into(),
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("address"), "{e}");
        let peers = |p: &[&str]| StaticPeerDiscoveryParams {
            peers: p.iter().map(|s| (*s).to_owned()).collect(),
        };
        assert!(
            StaticPeerDiscovery::new("d", peers(&["epp-peers.ns.svc:9005", "10.0.0.1:1"])).is_ok()
        );
        for bad in [&[][..], &["10.0.0.1"], &[":9005"], &["h:port"]] {
            assert!(
                StaticPeerDiscovery::new("d", peers(bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
