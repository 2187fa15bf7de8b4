//! `precise-prefix-cache-producer`: matches the request's tokens against what
//! each engine reports holding (its KV-cache events), and fills
//! `CycleState::prefix` for `prefix-cache-scorer` and the other readers.
//!
//! Per request: the tokens a `token-producer` wrote are cut into blocks of
//! `blockSize` tokens and keyed ([`KvBlockIndex::keys_of`]: chained, rooted
//! at the target model); each endpoint's match is the number of leading
//! blocks it holds. Without tokens (no token producer ran, or it could not
//! tokenize this request) nothing is matched and every endpoint scores 0.
//!
//! The index is filled by the data layer: this plugin is a
//! [`KvEventSink`] fed by an `endpoint-notification-source`, which
//! subscribes to each endpoint's publisher as `kvEventsConfig` says.
//!
//! With a shared backend (`redisConfig` / `valkeyConfig`), every change of
//! which keys an endpoint holds is also written to the shared store, under
//! the endpoint's address, and requests whose token ids are known before
//! the cycle (rendered chat, ids the client sent) are looked up there
//! before the cycle ([`PrefixLookup`]): several replicas then see one
//! index, and a replica that just started sees blocks stored before it
//! subscribed. When the store does not answer in time, and for requests
//! tokenized in the cycle (completions tokenized in process), the request is
//! matched in this replica's own view, which its own subscriptions keep.

use std::{
    collections::HashMap,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use epp_core::{
    BuildError, Candidate, CycleContext, DataProducer, Endpoint, EndpointId, InferenceRequest,
    KvEventBatch, KvEventSink, KvEventsConfig, MetricFamily, MetricSink, Plugin, PluginMetrics,
    PreRequest, PrefixLookup, PrefixLookupFuture, PrefixMatch, PrefixSlot, RedisAddress,
    SchedulingResult, SharedBlockIndex, SharedIndexSpec, SharedPrefixMatch,
    replicas::{ReplicaFeed, SharesPicks},
};
use parking_lot::RwLock;
use serde::de::IgnoredAny;

use crate::{Builtin, IndexMirror, KvBlockIndex, invalid};

/// `tokenProcessorConfig`: how request tokens become block keys.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenProcessorConfig {
    /// Tokens per block (llm-d's older name). Default 16.
    #[serde(default)]
    pub block_size: usize,
    /// Tokens per block; wins over `blockSize`. Default 16.
    #[serde(default)]
    pub block_size_tokens: usize,
    /// Seeds every key (llm-d: `PYTHONHASHSEED` of the engines). Any string.
    #[serde(default)]
    pub hash_seed: String,
    /// llm-d's key hash (`cbor-fnv`, `xxh64`): accepted; epp keys blocks its
    /// own way on both sides, so the choice does not matter.
    #[serde(default)]
    pub hash_algorithm: Option<String>,
}

/// `indexerConfig`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IndexerConfig {
    /// The index backend.
    #[serde(default)]
    pub kv_block_index_config: KvBlockIndexConfig,
    /// llm-d's tokenizer pool: accepted; tokens come from `token-producer`.
    #[serde(default)]
    pub tokenizers_pool_config: Option<IgnoredAny>,
}

/// `indexerConfig.kvBlockIndexConfig`: the in-process index (default), or
/// a shared Redis or Valkey one; `enableMetrics` and
/// `metricsLoggingInterval` are accepted (epp always exports the index's
/// metrics).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvBlockIndexConfig {
    /// The in-process index (the default); its sizes are accepted.
    #[serde(default)]
    pub in_memory_config: Option<IgnoredAny>,
    /// A shared Redis index.
    #[serde(default)]
    pub redis_config: Option<RedisIndexConfig>,
    /// A shared Valkey index (the same protocol).
    #[serde(default)]
    pub valkey_config: Option<RedisIndexConfig>,
    /// llm-d's cost-aware in-memory index: refused.
    #[serde(default)]
    pub cost_aware_memory_config: Option<IgnoredAny>,
    /// Accepted.
    #[serde(default)]
    pub enable_metrics: bool,
    /// Accepted.
    #[serde(default)]
    pub metrics_logging_interval: Option<IgnoredAny>,
}

/// `redisConfig` / `valkeyConfig` (llm-d's `RedisIndexConfig`, plus epp's
/// `lookupTimeout`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RedisIndexConfig {
    /// `redis://[[user]:password@]host[:port][/db]`; default
    /// `redis://127.0.0.1:6379` (`valkey://` for `valkeyConfig`).
    #[serde(default)]
    pub address: Option<String>,
    /// `redis` or `valkey` (documentation only: one protocol).
    #[serde(default)]
    pub backend_type: Option<String>,
    /// llm-d's experimental RDMA transport for Valkey: accepted, TCP is
    /// used (said once at start).
    #[serde(default, rename = "enableRDMA")]
    pub enable_rdma: bool,
    /// epp's: how long a request waits for the shared lookup before it is
    /// matched in this replica's own view instead. Default `50ms`.
    #[serde(default)]
    pub lookup_timeout: Option<String>,
}

/// Parameters (llm-d's names; see docs/plugins.md).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrecisePrefixParams {
    /// Block size and seed.
    #[serde(default)]
    pub token_processor_config: TokenProcessorConfig,
    /// llm-d's indexer settings.
    #[serde(default)]
    pub indexer_config: IndexerConfig,
    /// Where the events come from.
    #[serde(default)]
    pub kv_events_config: KvEventsConfig,
    /// Hold a pick's blocks on its endpoint until the engine reports them
    /// (llm-d's option; default false).
    #[serde(default)]
    pub speculative_indexing: bool,
    /// How long a speculation holds. Default `2s`.
    #[serde(default, rename = "speculativeTTL")]
    pub speculative_ttl: Option<String>,
    /// Leading blocks of a prompt looked up at most. Default 8192.
    #[serde(default)]
    pub max_prefix_blocks_to_match: usize,
    /// Engine blocks remembered per endpoint at most. Default 2^20.
    #[serde(default)]
    pub max_blocks_per_endpoint: usize,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 40);

/// `precise-prefix-cache-producer`.
#[derive(Debug)]
pub struct PrecisePrefixCacheProducer {
    name: String,
    id: u64,
    config: KvEventsConfig,
    max_blocks: usize,
    index: Arc<KvBlockIndex>,
    speculative: bool,
    warned_no_tokens: AtomicBool,
    /// The cycle's prefix-match set this producer fills.
    slot: PrefixSlot,
    /// The shared backend, when configured, and its store once bound.
    shared: Option<SharedIndexSpec>,
    store: Arc<OnceLock<Arc<dyn SharedBlockIndex>>>,
    /// Endpoint addresses by id: the names the shared store knows them by.
    names: Arc<RwLock<HashMap<EndpointId, Arc<str>>>>,
    /// Where picks go for the other replicas, when they share them.
    feed: OnceLock<Arc<dyn ReplicaFeed>>,
}

fn seed_of(s: &str) -> u64 {
    // FNV-1a: stable across builds (the default hasher is not).
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Builtin for PrecisePrefixCacheProducer {
    const TYPE: &'static str = "precise-prefix-cache-producer";
    type Params = PrecisePrefixParams;

    /// # Errors
    /// A block size over 2^18 tokens, a bad `speculativeTTL`, an engine
    /// other than vLLM, or an index backend other than in-memory (Redis is
    /// not built yet).
    fn build(name: impl Into<String>, p: PrecisePrefixParams) -> Result<Self, BuildError> {
        let name = name.into();
        let bad = |field: &str, value: String, reason: &str| invalid(&name, field, value, reason);
        let t = &p.token_processor_config;
        let block = match (t.block_size_tokens, t.block_size) {
            (0, 0) => 16,
            (0, b) | (b, _) => b,
        };
        if block > 1 << 18 {
            return Err(bad(
                "tokenProcessorConfig.blockSizeTokens",
                block.to_string(),
                "must be at most 262144",
            ));
        }
        let ttl = match p.speculative_ttl.as_deref() {
            None => Duration::from_secs(2),
            Some(t) => humantime::parse_duration(t)
                .map_err(|e| bad("speculativeTTL", t.to_owned(), &e.to_string()))?,
        };
        if p.kv_events_config.engine_type != "vllm" {
            return Err(bad(
                "kvEventsConfig.engineType",
                p.kv_events_config.engine_type.clone(),
                "only vllm's events are decoded",
            ));
        }
        let kv = &p.indexer_config.kv_block_index_config;
        if kv.cost_aware_memory_config.is_some() {
            return Err(bad(
                "indexerConfig.kvBlockIndexConfig.costAwareMemoryConfig",
                "set".into(),
                "not built in epp: use inMemoryConfig or a shared redisConfig/valkeyConfig",
            ));
        }
        let shared = match (&kv.redis_config, &kv.valkey_config) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "indexerConfig.kvBlockIndexConfig.valkeyConfig",
                    "set".into(),
                    "redisConfig is set too: name one shared backend",
                ));
            }
            (Some(r), None) => Some(shared_spec(&name, "redisConfig", "redis", r)?),
            (None, Some(v)) => Some(shared_spec(&name, "valkeyConfig", "valkey", v)?),
            (None, None) => None,
        };
        let max_blocks = match p.max_prefix_blocks_to_match {
            0 => 8192,
            n => n,
        };
        let per_endpoint = match p.max_blocks_per_endpoint {
            0 => 1 << 20,
            n => n,
        };
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            config: p.kv_events_config,
            max_blocks,
            index: Arc::new(
                KvBlockIndex::new(block, seed_of(&t.hash_seed), per_endpoint)
                    .with_speculative_ttl(ttl),
            ),
            speculative: p.speculative_indexing,
            warned_no_tokens: AtomicBool::new(false),
            slot: PrefixSlot::default(),
            shared,
            store: Arc::new(OnceLock::new()),
            names: Arc::new(RwLock::new(HashMap::new())),
            feed: OnceLock::new(),
            name,
        })
    }
}

/// The shared backend `r` (at `redisConfig` or `valkeyConfig`) checked.
fn shared_spec(
    plugin: &str,
    field: &str,
    scheme: &str,
    r: &RedisIndexConfig,
) -> Result<SharedIndexSpec, BuildError> {
    let at = |key: &str| format!("indexerConfig.kvBlockIndexConfig.{field}.{key}");
    let text = r
        .address
        .clone()
        .unwrap_or_else(|| format!("{scheme}://127.0.0.1:6379"));
    let address = RedisAddress::parse(&text)
        .map_err(|e| invalid(plugin, &at("address"), text.clone(), &e))?;
    let backend = r.backend_type.clone().unwrap_or_else(|| scheme.to_owned());
    if backend != "redis" && backend != "valkey" {
        return Err(invalid(
            plugin,
            &at("backendType"),
            backend,
            "redis or valkey",
        ));
    }
    let lookup_timeout = match r.lookup_timeout.as_deref() {
        None => Duration::from_millis(50),
        Some(t) => humantime::parse_duration(t)
            .map_err(|e| invalid(plugin, &at("lookupTimeout"), t.to_owned(), &e.to_string()))?,
    };
    if lookup_timeout.is_zero() {
        return Err(invalid(
            plugin,
            &at("lookupTimeout"),
            "0",
            "must be more than 0",
        ));
    }
    if r.enable_rdma {
        tracing::warn!(
            plugin,
            "{field}.enableRDMA: RDMA transport is not built in epp; connecting over TCP"
        );
    }
    Ok(SharedIndexSpec {
        address,
        backend,
        lookup_timeout,
    })
}

impl PrecisePrefixCacheProducer {
    /// The index (for inspection and tests).
    #[must_use]
    pub fn index(&self) -> &KvBlockIndex {
        &self.index
    }

    /// Remembers `endpoint`'s address, the name the shared store knows it
    /// by (only with a shared backend).
    fn name_endpoint(&self, endpoint: &Endpoint) {
        if self.shared.is_none() || self.names.read().contains_key(&endpoint.id()) {
            return;
        }
        self.names
            .write()
            .insert(endpoint.id(), Arc::from(endpoint.addr_str()));
    }

    /// Fills `prefix` from what the shared store answered before the cycle.
    fn fill_from_shared(
        &self,
        answer: &SharedPrefixMatch,
        prefix: &mut PrefixMatch,
        candidates: &[Candidate],
    ) {
        prefix.hashes.clear();
        prefix.hashes.extend_from_slice(&answer.keys);
        if !answer.answered {
            // The store is down or slow: this replica's own view, which its
            // subscriptions keep (empty for one that heard no events).
            let keys = std::mem::take(&mut prefix.hashes);
            self.index.lookup(&keys, prefix);
            prefix.hashes = keys;
            return;
        }
        for c in candidates {
            let addr = c.endpoint.addr_str();
            if let Some((_, n)) = answer.matched.iter().find(|(a, _)| a == addr) {
                prefix.set_matched(c.endpoint.id(), *n);
            }
        }
        let c = self.index.counters();
        c.lookups.fetch_add(1, Ordering::Relaxed);
        c.lookup_blocks
            .fetch_add(answer.keys.len() as u64, Ordering::Relaxed);
        let hit = answer.matched.iter().map(|(_, n)| *n).max().unwrap_or(0);
        c.hit_blocks.fetch_add(u64::from(hit), Ordering::Relaxed);
    }
}

/// The request's media items, for its keys; `None` when it has media the
/// renderer did not identify (its placeholder tokens alone would match the
/// blocks of another image).
fn keyed_media(request: &InferenceRequest) -> Option<&[epp_core::MediaItem]> {
    if request.media_parts > 0 && request.media_items.is_empty() {
        return None;
    }
    Some(&request.media_items)
}

/// Writes every change of the index to the shared store, under the
/// endpoint's address.
#[derive(Debug)]
struct Mirror {
    store: Arc<dyn SharedBlockIndex>,
    names: Arc<RwLock<HashMap<EndpointId, Arc<str>>>>,
}

impl IndexMirror for Mirror {
    fn changed(&self, id: EndpointId, added: &[u64], removed: &[u64]) {
        let name = self.names.read().get(&id).cloned();
        match name {
            Some(name) => self.store.update(&name, added, removed),
            // Not named yet (cannot happen: the sink names an endpoint
            // before applying its events, the pick before speculating).
            None => tracing::debug!(endpoint = id.index(), "change of an unnamed endpoint"),
        }
    }
}

/// The lookup in the shared store the edge runs before the cycle.
#[derive(Debug)]
struct SharedLookup {
    producer: u64,
    index: Arc<KvBlockIndex>,
    max_blocks: usize,
    store: Arc<OnceLock<Arc<dyn SharedBlockIndex>>>,
}

impl PrefixLookup for SharedLookup {
    fn lookup(&self, request: &InferenceRequest) -> Option<PrefixLookupFuture> {
        let store = Arc::clone(self.store.get()?);
        let tokens = request.prompt_token_ids.as_deref()?;
        let media = keyed_media(request)?;
        let mut keys = Vec::new();
        self.index.keys_of(
            &request.target_model,
            request.cache_salt.as_deref(),
            media,
            tokens,
            self.max_blocks,
            &mut keys,
        );
        let producer = self.producer;
        if keys.is_empty() {
            return Some(Box::pin(std::future::ready(SharedPrefixMatch {
                producer,
                answered: true,
                ..SharedPrefixMatch::default()
            })));
        }
        let answer = store.lookup(keys.clone());
        Some(Box::pin(async move {
            let (matched, answered) = match answer.await {
                Ok(m) => (m, true),
                Err(e) => {
                    tracing::debug!(error = %e, "shared prefix index: no answer");
                    (Vec::new(), false)
                }
            };
            SharedPrefixMatch {
                producer,
                keys,
                matched,
                answered,
            }
        }))
    }
}

impl Plugin for PrecisePrefixCacheProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_kv_event_sink(&self) -> Option<&dyn KvEventSink> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        self.speculative.then_some(self as &dyn PreRequest)
    }
    /// With `speculativeIndexing` only: otherwise a pick changes nothing
    /// here, the engines' events tell every replica alike.
    fn as_shares_picks(&self) -> Option<&dyn SharesPicks> {
        self.speculative.then_some(self as &dyn SharesPicks)
    }
    fn bind_prefix_slot(&self, slot: usize) -> bool {
        self.slot.set(slot);
        true
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        Some(self)
    }
    fn shared_index(&self) -> Option<SharedIndexSpec> {
        self.shared.clone()
    }
    fn bind_shared_index(&self, store: Arc<dyn SharedBlockIndex>) {
        if self.shared.is_none() || self.store.set(Arc::clone(&store)).is_err() {
            return;
        }
        let mirror = Mirror {
            store: Arc::clone(&store),
            names: Arc::clone(&self.names),
        };
        // Bound once (the store was unset above), so the mirror is too.
        let _ = self.index.set_mirror(Arc::new(mirror));
        let (index, names) = (Arc::clone(&self.index), Arc::clone(&self.names));
        store.set_snapshot(Arc::new(move |f: &mut dyn FnMut(&str, &[u64])| {
            index.for_each_endpoint(|id, keys| {
                let name = names.read().get(&id).cloned();
                if let Some(name) = name {
                    f(&name, keys);
                }
            });
        }));
    }
    fn prefix_lookup(&self) -> Option<Arc<dyn PrefixLookup>> {
        self.shared.as_ref()?;
        Some(Arc::new(SharedLookup {
            producer: self.id,
            index: Arc::clone(&self.index),
            max_blocks: self.max_blocks,
            store: Arc::clone(&self.store),
        }))
    }
}

impl DataProducer for PrecisePrefixCacheProducer {
    fn produce(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) {
        let (tokens, prefix) = cx.state.tokens_and_prefix_mut(self.slot.get());
        if prefix.computed {
            return;
        }
        if let Some(answer) = &cx.request.shared_prefix
            && answer.producer == self.id
        {
            prefix.computed = true;
            prefix.producer = self.id;
            prefix.block_size_tokens = u32::try_from(self.index.block_size()).unwrap_or(u32::MAX);
            self.fill_from_shared(answer, prefix, candidates);
            return;
        }
        if !tokens.computed {
            if !self.warned_no_tokens.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    plugin = %self.name,
                    "no token-producer tokenized this request: precise prefix matching needs \
                     tokens (declare a token-producer; this is logged once)"
                );
            }
            return;
        }
        let Some(media) = keyed_media(cx.request) else {
            return;
        };
        // The salt and the media items are in the keys as the engines hash
        // them, so a request matches only blocks computed with the same.
        self.index.keys_of(
            &cx.request.target_model,
            cx.request.cache_salt.as_deref(),
            media,
            &tokens.ids,
            self.max_blocks,
            &mut prefix.hashes,
        );
        prefix.computed = true;
        prefix.producer = self.id;
        prefix.block_size_tokens = u32::try_from(self.index.block_size()).unwrap_or(u32::MAX);
        let keys = std::mem::take(&mut prefix.hashes);
        self.index.lookup(&keys, prefix);
        prefix.hashes = keys;
    }
    fn produces_prefix_matches(&self) -> bool {
        true
    }
    fn reads_tokens(&self) -> bool {
        true
    }
}

impl PreRequest for PrecisePrefixCacheProducer {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        let prefix = cx.state.prefix_at(self.slot.get());
        if prefix.producer != self.id {
            return;
        }
        if let Some(target) = result.primary() {
            self.hold_speculatively(target, &prefix.hashes);
            if let Some(feed) = self.feed.get() {
                feed.picked(&self.name, target, &prefix.hashes);
            }
        }
    }
}

impl SharesPicks for PrecisePrefixCacheProducer {
    fn share_picks(&self, feed: Arc<dyn ReplicaFeed>) {
        let _ = self.feed.set(feed);
    }

    /// Holds the blocks on `endpoint` until its engine reports them, as
    /// this replica's own pick would (`speculativeIndexing`).
    fn peer_picked(&self, endpoint: &Arc<Endpoint>, keys: &[u64]) {
        self.hold_speculatively(endpoint, keys);
    }
}

impl PrecisePrefixCacheProducer {
    /// A pick's blocks, held on `endpoint` for `speculativeTTL` or until
    /// its engine reports them.
    fn hold_speculatively(&self, endpoint: &Endpoint, keys: &[u64]) {
        self.name_endpoint(endpoint);
        self.index.speculate(
            endpoint.id(),
            keys,
            Instant::now(),
            self.index.speculative_ttl(),
        );
    }
}

impl KvEventSink for PrecisePrefixCacheProducer {
    fn kv_events_config(&self) -> &KvEventsConfig {
        &self.config
    }
    fn apply(&self, endpoint: &Arc<Endpoint>, batch: &KvEventBatch) {
        self.name_endpoint(endpoint);
        self.index.apply(endpoint.id(), batch);
    }
    fn clear(&self, endpoint: EndpointId) {
        self.index.clear(endpoint);
        if self.shared.is_some() {
            self.names.write().remove(&endpoint);
        }
    }
}

const fn family(name: &'static str, help: &'static str) -> MetricFamily {
    MetricFamily { name, help }
}

const COUNTERS: [MetricFamily; 8] = [
    family(
        "epp_kv_block_index_blocks_stored",
        "Engine blocks the precise prefix index was told were stored",
    ),
    family(
        "epp_kv_block_index_blocks_removed",
        "Engine blocks the precise prefix index was told were evicted",
    ),
    family(
        "epp_kv_block_index_orphan_events",
        "Stored blocks not indexed because their parent block was unknown",
    ),
    family(
        "epp_kv_block_index_clears",
        "Times an endpoint's blocks were all forgotten (engine cleared, stream gap or restart, cap)",
    ),
    family(
        "epp_kv_block_index_lookups",
        "Requests looked up in the precise prefix index",
    ),
    family(
        "epp_kv_block_index_lookup_blocks",
        "Blocks of the requests looked up",
    ),
    family(
        "epp_kv_block_index_hit_blocks",
        "Blocks of the requests looked up that some endpoint held (hit ratio: over lookup_blocks)",
    ),
    family(
        "epp_kv_block_index_speculations",
        "Picks whose blocks were held on their endpoint until the engine reported them (speculativeIndexing)",
    ),
];

const KEYS: MetricFamily = family(
    "epp_kv_block_index_keys",
    "Distinct blocks (index keys) some endpoint holds",
);

const SHARED_CONNECTED: MetricFamily = family(
    "epp_kv_block_index_shared_connected",
    "Whether the shared index (redisConfig/valkeyConfig) is connected: 1 or 0",
);

const SHARED_COUNTERS: [MetricFamily; 4] = [
    family(
        "epp_kv_block_index_shared_lookups",
        "Requests looked up in the shared index before scheduling",
    ),
    family(
        "epp_kv_block_index_shared_unanswered",
        "Shared index lookups not answered in time (error, timeout, not connected): matched in the replica's own view",
    ),
    family(
        "epp_kv_block_index_shared_dropped_updates",
        "Index changes not written to the shared index (not connected, or too many queued); the whole view is rewritten after",
    ),
    family(
        "epp_kv_block_index_shared_resyncs",
        "Times this replica's whole view was written to the shared index (each connection, each drop)",
    ),
];

impl PluginMetrics for PrecisePrefixCacheProducer {
    fn report(&self, out: &mut dyn MetricSink) {
        let c = self.index.counters();
        let labels = [("plugin", self.name.as_str())];
        let values = [
            &c.stored,
            &c.removed,
            &c.orphans,
            &c.clears,
            &c.lookups,
            &c.lookup_blocks,
            &c.hit_blocks,
            &c.speculated,
        ];
        for (f, v) in COUNTERS.into_iter().zip(values) {
            out.counter(f, &labels, v.load(Ordering::Relaxed));
        }
        out.gauge(KEYS, &labels, self.index.len() as f64);
        if let Some(store) = self.store.get() {
            let st = store.stats();
            out.gauge(SHARED_CONNECTED, &labels, f64::from(u8::from(st.connected)));
            for (f, v) in SHARED_COUNTERS.into_iter().zip([
                st.lookups,
                st.unanswered,
                st.dropped_updates,
                st.resyncs,
            ]) {
                out.counter(f, &labels, v);
            }
        }
    }
}

#[cfg(test)]
mod tests;
