//! Engine KV-cache events: what a model server reports storing and evicting
//! in its prefix cache, and the role of the plugins that consume them.
//!
//! vLLM (`--kv-events-config`) publishes a [`KvEventBatch`] per engine step
//! over ZeroMQ. The data layer (`epp-datalayer`) subscribes to every
//! endpoint, decodes the batches and hands them to each [`KvEventSink`]
//! wired to an `endpoint-notification-source`; the sink keeps whatever index
//! it needs. Sinks stay synchronous and do no I/O, like extractors.

use std::sync::Arc;

use crate::{Endpoint, EndpointId, Plugin};

/// One batch of events from one engine (one engine step).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvEventBatch {
    /// When the engine emitted the batch, seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in the order the engine applied them.
    pub events: Vec<KvEvent>,
    /// The data-parallel rank that emitted the batch, when the engine says.
    pub data_parallel_rank: Option<i64>,
    /// The model the message's topic names (`kv@<endpoint>@<model>`, llm-d's
    /// convention), when it names one: the base model of blocks stored
    /// without a LoRA name.
    pub model: Option<String>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Full blocks became cached.
    BlockStored(BlockStored),
    /// Blocks were evicted.
    BlockRemoved {
        /// The engine's hashes of the evicted blocks.
        block_hashes: Vec<u64>,
        /// Where they lived (`GPU`, `CPU`, …), when the engine says.
        medium: Option<String>,
    },
    /// The engine dropped its whole prefix cache.
    AllBlocksCleared,
}

/// Consecutive full blocks of one sequence that became cached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockStored {
    /// The engine's hash of each block, in sequence order. Engines that send
    /// byte strings are reduced to their last 8 bytes, big-endian.
    pub block_hashes: Vec<u64>,
    /// The engine's hash of the block before the first one (`None`: the
    /// first block is the sequence's first).
    pub parent_block_hash: Option<u64>,
    /// The blocks' token ids, concatenated (`block_size` per block).
    pub token_ids: Vec<u32>,
    /// Tokens per block in the engine.
    pub block_size: u32,
    /// The engine's id of the LoRA adapter the blocks were computed with.
    pub lora_id: Option<i64>,
    /// Where the blocks live (`GPU`, `CPU`, …), when the engine says.
    pub medium: Option<String>,
    /// The LoRA adapter's name, when the engine says.
    pub lora_name: Option<String>,
    /// The extra keys the engine hashed into each block besides its tokens,
    /// one list per block in `block_hashes` order (vLLM's `extra_keys`: the
    /// LoRA adapter first, then multimodal items, then, in a sequence's first
    /// block only, the request's `cache_salt`). Empty when the engine sent
    /// none.
    pub extra_keys: Vec<Vec<ExtraKey>>,
}

/// One of a block's extra keys ([`BlockStored::extra_keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtraKey {
    /// A string: a LoRA adapter's name, a multimodal item's identifier, or
    /// a cache salt.
    Text(String),
    /// An integer: a LoRA adapter's id (vLLM before it used names).
    Int(i64),
    /// `[identifier, offset]`: a multimodal item as some vLLM versions
    /// report it.
    Media {
        /// The item's content identifier.
        id: String,
        /// Where it starts, relative to the block.
        offset: i64,
    },
    /// Anything else (prompt-embedding digests, future shapes): it made the
    /// block's hash differ, which is all a reader can know of it.
    Other,
}

/// How the data layer reaches each endpoint's event publisher, in llm-d's
/// `kvEventsConfig` spelling.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvEventsConfig {
    /// An address to BIND one subscriber socket to (`tcp://0.0.0.0:5557`):
    /// engines connect to it and name themselves in the topic
    /// (`kv@<pod ip or name>@<model>`). Unset: only per-endpoint subscribers.
    #[serde(default)]
    pub zmq_endpoint: Option<String>,
    /// Subscription prefix of the topic. Default `kv@`.
    #[serde(default = "default_topic_filter")]
    pub topic_filter: String,
    /// Accepted for llm-d's configs; epp runs one task per publisher.
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// `vllm` (default). llm-d's `sglang` is refused by the plugins that
    /// read this config.
    #[serde(default = "default_engine_type")]
    pub engine_type: String,
    /// Connect a subscriber to every endpoint discovery finds. Default true.
    #[serde(default = "default_true")]
    pub discover_pods: bool,
    /// Where each endpoint publishes.
    #[serde(default)]
    pub pod_discovery_config: PodDiscoveryConfig,
}

/// Ports of each endpoint's publisher.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodDiscoveryConfig {
    /// Accepted for llm-d's configs: epp subscribes to the endpoints its
    /// discovery finds, whatever their labels.
    #[serde(default)]
    pub pod_label_selector: Option<String>,
    /// Accepted for llm-d's configs (see `podLabelSelector`).
    #[serde(default)]
    pub pod_namespace: Option<String>,
    /// The publisher's port on each endpoint's address (plus the endpoint's
    /// data-parallel rank). Default 5557.
    #[serde(default = "default_socket_port")]
    pub socket_port: u16,
    /// The replay (ROUTER) port, plus the rank; 0 = no replay: a gap in the
    /// sequence numbers then forgets the endpoint's blocks instead of
    /// re-reading them.
    #[serde(default)]
    pub replay_socket_port: u16,
}

fn default_topic_filter() -> String {
    "kv@".into()
}
fn default_engine_type() -> String {
    "vllm".into()
}
fn default_true() -> bool {
    true
}
fn default_socket_port() -> u16 {
    5557
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            zmq_endpoint: None,
            topic_filter: default_topic_filter(),
            concurrency: None,
            engine_type: default_engine_type(),
            discover_pods: true,
            pod_discovery_config: PodDiscoveryConfig::default(),
        }
    }
}

impl Default for PodDiscoveryConfig {
    fn default() -> Self {
        Self {
            pod_label_selector: None,
            pod_namespace: None,
            socket_port: default_socket_port(),
            replay_socket_port: 0,
        }
    }
}

/// A data source that delivers each endpoint's event stream instead of
/// scraping a page (`endpoint-notification-source`). Its extractors are
/// [`KvEventSink`]s.
pub trait NotificationSource: Plugin {}

/// Consumes the KV-cache events of every endpoint.
///
/// The data layer calls one sink from one task per endpoint, so calls for
/// different endpoints may run concurrently; calls for one endpoint come in
/// the engine's order. Implementations must not block: they run on the data
/// layer's tasks, and the request path reads what they build.
pub trait KvEventSink: Plugin {
    /// Where the events come from.
    fn kv_events_config(&self) -> &KvEventsConfig;

    /// Applies one batch the engine of `endpoint` published.
    fn apply(&self, endpoint: &Arc<Endpoint>, batch: &KvEventBatch);

    /// Forgets every block `endpoint` was known to hold: it left the pool,
    /// or its stream lost events that cannot be replayed.
    fn clear(&self, endpoint: EndpointId);
}
