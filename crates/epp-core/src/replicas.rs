//! Several picker replicas behind one gateway, routing as one (llm-d's
//! `dataLayer.crossReplicaSyncerPluginRef`, `peerDiscovery` and
//! `crossReplicaSyncInterval`).
//!
//! A gateway spreads requests over the replicas, so each replica sees only
//! its share. Two things a lone picker knows are then missing from every
//! replica's view, and both are what it changed itself a moment ago:
//!
//! - the endpoints' in-flight load between two scrapes (what each replica
//!   dispatched since, [`crate::Candidate::since_scrape`]): without the
//!   others' dispatches, replicas pile onto the same "least loaded"
//!   endpoint;
//! - the prefix blocks a pick just placed on an endpoint, which the
//!   approximate index only learns from picks, and the precise index holds
//!   speculatively until the engine reports them: without the others'
//!   picks, a tenant's next request may start a second copy of its prompt
//!   elsewhere.
//!
//! A replica hands both to a [`ReplicaFeed`] as they happen: its
//! [`crate::Dispatch`]es say when an endpoint's in-flight counts change, and
//! the plugins that [`SharesPicks`] say what they recorded. The data layer's
//! syncer carries them to the peers, which add the others' in-flight counts
//! to each endpoint's ([`crate::InflightCounters::set_peers`]) and give the
//! others' picks to the same-named plugin ([`SharesPicks::peer_picked`]).
//! Scrapes and engines' events stay each replica's own: they describe the
//! same endpoints to every replica already.

use std::{fmt::Debug, net::SocketAddr, sync::Arc, time::Duration};

use crate::{Endpoint, Plugin, PluginRef};

/// Where a replica publishes what it did, for its peers. Called on the
/// request path: an implementation queues and wakes, it never blocks or
/// does I/O in the call.
pub trait ReplicaFeed: Send + Sync + Debug {
    /// Some endpoint's local in-flight counts changed (a request was
    /// dispatched, moved, or ended). The feed reads the counts itself
    /// ([`crate::InflightCounters::local`]), so calls may be coalesced.
    fn load_changed(&self);

    /// The plugin named `plugin` recorded a pick of the prompt blocks `keys`
    /// (in order, chained as the plugin hashes them) on `endpoint`.
    fn picked(&self, plugin: &str, endpoint: &Endpoint, keys: &[u64]);
}

/// A plugin whose state follows the picks of every replica (the prefix
/// producers): it publishes its own picks and records its peers'.
///
/// Peers are matched by plugin name, so replicas must run the same config
/// (as replicas of one deployment do); a pick naming a plugin this replica
/// does not have is dropped.
pub trait SharesPicks: Plugin {
    /// From now on, also publish every pick recorded to `feed`. Called once,
    /// before any request.
    fn share_picks(&self, feed: Arc<dyn ReplicaFeed>);

    /// Another replica recorded a pick of `keys` on `endpoint`: record it
    /// here as if this replica had made it (it is not published again).
    fn peer_picked(&self, endpoint: &Arc<Endpoint>, keys: &[u64]);
}

/// The plugin `dataLayer.crossReplicaSyncerPluginRef` names.
pub trait ReplicaSyncer: Plugin {
    /// Where this replica listens for its peers' state; `None` for a syncer
    /// that shares nothing (llm-d's single-replica `local-syncer`).
    fn listen_address(&self) -> Option<SocketAddr>;
}

/// The plugin `dataLayer.peerDiscovery` names: where the other replicas are.
pub trait PeerDiscovery: Plugin {
    /// `host:port` entries; each address a host name resolves to is a peer
    /// (a Kubernetes headless Service names every replica's pod at once).
    /// This replica's own address may be among them.
    fn peer_addresses(&self) -> &[String];
}

/// How often a replica sends its whole state when nothing changed, if the
/// config does not say (`crossReplicaSyncInterval`; llm-d's default too).
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(200);

/// The cross-replica part of a loaded config.
#[derive(Debug, Clone)]
pub struct ReplicaSync {
    /// The syncer plugin ([`ReplicaSyncer`]).
    pub syncer: PluginRef,
    /// The peer-discovery plugin ([`PeerDiscovery`]), if named.
    pub peers: Option<PluginRef>,
    /// `crossReplicaSyncInterval`, or [`DEFAULT_SYNC_INTERVAL`].
    pub interval: Duration,
}
