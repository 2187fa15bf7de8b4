//! Endpoints (model-server replicas), what the picker knows about them, and the
//! immutable snapshot the scheduler reads.

use std::{
    any::{Any, TypeId},
    collections::{BTreeMap, HashMap},
    fmt,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;

use crate::AdapterInflight;

/// Dense identifier given to an endpoint when it is discovered.
///
/// Ids are small integers so per-endpoint tables (prefix index, in-flight
/// counters) can be plain vectors indexed by id. An id is never reused for a
/// different address while the process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub u32);

impl EndpointId {
    /// The id as a vector index.
    #[must_use]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// LoRA adapter state reported by a model server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraInfo {
    /// Adapters loaded and serving requests.
    pub active: Vec<String>,
    /// Adapters requested but waiting to be loaded.
    pub waiting: Vec<String>,
    /// Maximum adapters the server holds at once (0 = unknown).
    pub max_loras: u32,
    /// The model adapters apply to: the name the server serves its base
    /// model under (the `model_name` label vLLM, SGLang and TensorRT-LLM
    /// put on their queue and cache series), when it reports one.
    pub base_model: Option<String>,
}

impl LoraInfo {
    /// Whether `adapter` is loaded.
    #[must_use]
    pub fn is_active(&self, adapter: &str) -> bool {
        self.active.iter().any(|a| a == adapter)
    }

    /// Whether `adapter` is waiting to be loaded.
    #[must_use]
    pub fn is_waiting(&self, adapter: &str) -> bool {
        self.waiting.iter().any(|a| a == adapter)
    }

    /// Whether a request for `model` (the target after any rewrite; the
    /// client asked for `asked`) names an adapter on this server rather
    /// than its base model: any name but the base model's when the server
    /// reports that, else only a name the request was rewritten to (a
    /// client naming an adapter directly cannot be told from one naming
    /// the base model without it). A second name the base model is served
    /// under counts as an adapter: the label carries only the first.
    #[must_use]
    pub fn names_adapter(&self, model: &str, asked: &str) -> bool {
        !model.is_empty()
            && match self.base_model.as_deref() {
                Some(base) => model != base,
                None => model != asked,
            }
    }

    /// Whether a request for `model` (the client asked for `asked`) names
    /// an adapter on a server that loads adapters: [`Self::serves_adapters`]
    /// (the cheap test, first: most fleets serve none), then
    /// [`Self::names_adapter`].
    #[inline]
    #[must_use]
    pub fn serves_adapter(&self, model: &str, asked: &str) -> bool {
        self.serves_adapters() && self.names_adapter(model, asked)
    }

    /// Whether the server loads adapters at all (it reports a capacity or
    /// any adapter).
    #[inline]
    #[must_use]
    pub fn serves_adapters(&self) -> bool {
        self.max_loras > 0 || !self.active.is_empty() || !self.waiting.is_empty()
    }
}

/// KV-cache geometry reported by a model server, used to tune the prefix index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheGeometry {
    /// Tokens per KV block.
    pub block_size_tokens: u32,
    /// Number of KV blocks the server holds.
    pub num_blocks: u64,
}

/// What was last scraped from one endpoint.
///
/// Values are replaced as a whole (one [`Arc`] swap per scrape), so a reader
/// always sees one scrape's numbers together.
#[derive(Debug, Clone, Default)]
pub struct EndpointMetrics {
    /// Requests waiting in the server's queue.
    pub waiting: u32,
    /// Requests being processed.
    pub running: u32,
    /// KV-cache utilisation in `[0, 1]`.
    pub kv_usage: f64,
    /// LoRA adapters.
    pub lora: LoraInfo,
    /// KV-cache geometry, when the server reports it.
    pub cache: Option<CacheGeometry>,
    /// User-named metrics (see the `prometheus-metric` extractor), keyed by the
    /// extractor's metric key.
    pub custom: HashMap<String, f64>,
    /// When these values were successfully scraped; `None` before the first scrape.
    pub updated_at: Option<Instant>,
    /// The picker's own in-flight counts for the endpoint when the scrape that
    /// produced these values was sent. Compared with the current counts it
    /// tells what the picker dispatched since, which the scraped values cannot
    /// show yet (see [`crate::Candidate::since_scrape`]). Zero when the values
    /// did not come from a scrape.
    pub inflight_at_scrape: InflightSample,
    /// Rare, user-defined typed attributes (see [`Self::extension`]).
    pub extensions: Extensions,
}

impl EndpointMetrics {
    /// Empty metrics stamped as refreshed now (useful in tests and examples).
    #[must_use]
    pub fn fresh() -> Self {
        Self {
            updated_at: Some(Instant::now()),
            ..Self::default()
        }
    }

    /// Age of the values at `now`; `None` if never scraped.
    #[must_use]
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.updated_at.map(|t| now.saturating_duration_since(t))
    }

    /// Whether the values are missing or older than `threshold` at `now`.
    #[must_use]
    pub fn is_stale(&self, now: Instant, threshold: Duration) -> bool {
        self.age(now).is_none_or(|age| age > threshold)
    }

    /// A user-defined typed attribute, written by a custom extractor.
    #[must_use]
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.extensions.get::<T>()
    }

    /// Stores a user-defined typed attribute, replacing any of the same type.
    pub fn insert_extension<T: Any + Send + Sync>(&mut self, value: T) {
        self.extensions.insert(value);
    }
}

/// A small type map for rare, user-defined attributes. Values are shared, so
/// cloning [`EndpointMetrics`] stays cheap.
#[derive(Clone, Default)]
pub struct Extensions(Vec<(TypeId, Arc<dyn Any + Send + Sync>)>);

impl Extensions {
    fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.0
            .iter()
            .find(|(id, _)| *id == TypeId::of::<T>())
            .and_then(|(_, v)| v.downcast_ref::<T>())
    }

    fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        let id = TypeId::of::<T>();
        self.0.retain(|(k, _)| *k != id);
        self.0.push((id, Arc::new(value)));
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Extensions({} entries)", self.0.len())
    }
}

/// The picker's in-flight counts for one endpoint at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InflightSample {
    /// Requests routed and not yet completed.
    pub requests: u32,
    /// Their estimated prompt tokens.
    pub tokens: u64,
    /// The part of those tokens the endpoint was not expected to hold in its
    /// prefix cache when each request was picked: what its KV grows by.
    pub uncached_tokens: u64,
}

/// Counters the picker keeps for an endpoint: requests it routed there that
/// have not completed yet, and, with several replicas sharing their load
/// (see [`crate::replicas`]), the other replicas' such requests.
///
/// The readers ([`Self::requests`], [`Self::sample`], …) give the sum of both:
/// what the endpoint is serving for the whole set of replicas, as far as it
/// is known here. [`Self::local`] gives this replica's part alone (what it
/// tells its peers).
#[derive(Debug, Default)]
pub struct InflightCounters {
    requests: AtomicU32,
    tokens: AtomicU64,
    uncached_tokens: AtomicU64,
    peer_requests: AtomicU32,
    peer_tokens: AtomicU64,
    peer_uncached_tokens: AtomicU64,
    unanswered: AtomicU32,
    unanswered_uncached_tokens: AtomicU64,
}

impl InflightCounters {
    /// Requests routed to the endpoint and not yet completed (by this
    /// replica and its peers).
    #[inline]
    #[must_use]
    pub fn requests(&self) -> u32 {
        self.requests
            .load(Ordering::Relaxed)
            .saturating_add(self.peer_requests.load(Ordering::Relaxed))
    }

    /// Estimated tokens of those requests.
    #[inline]
    #[must_use]
    pub fn tokens(&self) -> u64 {
        self.tokens
            .load(Ordering::Relaxed)
            .saturating_add(self.peer_tokens.load(Ordering::Relaxed))
    }

    /// Of those tokens, the ones not expected in the endpoint's prefix cache.
    #[inline]
    #[must_use]
    pub fn uncached_tokens(&self) -> u64 {
        self.uncached_tokens
            .load(Ordering::Relaxed)
            .saturating_add(self.peer_uncached_tokens.load(Ordering::Relaxed))
    }

    /// All counts at once (each read atomically; a request starting between
    /// the reads may show in some only).
    #[inline]
    #[must_use]
    pub fn sample(&self) -> InflightSample {
        InflightSample {
            requests: self.requests(),
            tokens: self.tokens(),
            uncached_tokens: self.uncached_tokens(),
        }
    }

    /// This replica's own counts, without its peers'.
    #[must_use]
    pub fn local(&self) -> InflightSample {
        InflightSample {
            requests: self.requests.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            uncached_tokens: self.uncached_tokens.load(Ordering::Relaxed),
        }
    }

    /// The other replicas' counts, as last set.
    #[must_use]
    pub fn peers(&self) -> InflightSample {
        InflightSample {
            requests: self.peer_requests.load(Ordering::Relaxed),
            tokens: self.peer_tokens.load(Ordering::Relaxed),
            uncached_tokens: self.peer_uncached_tokens.load(Ordering::Relaxed),
        }
    }

    /// Replaces the other replicas' counts (their sum, as they last
    /// reported them).
    pub fn set_peers(&self, peers: InflightSample) {
        self.peer_requests.store(peers.requests, Ordering::Relaxed);
        self.peer_tokens.store(peers.tokens, Ordering::Relaxed);
        self.peer_uncached_tokens
            .store(peers.uncached_tokens, Ordering::Relaxed);
    }

    /// Records a request routed to the endpoint, none of its tokens cached.
    pub fn start(&self, tokens: u64) {
        self.start_with(tokens, tokens);
    }

    /// Records a request routed to the endpoint of which `uncached_tokens`
    /// (at most `tokens`) are not expected in its prefix cache.
    pub fn start_with(&self, tokens: u64, uncached_tokens: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        self.uncached_tokens
            .fetch_add(uncached_tokens.min(tokens), Ordering::Relaxed);
    }

    /// Records the completion of a request started with `start(tokens)`.
    pub fn finish(&self, tokens: u64) {
        self.finish_with(tokens, tokens);
    }

    /// Records the completion of a request started with
    /// `start_with(tokens, uncached_tokens)`.
    pub fn finish_with(&self, tokens: u64, uncached_tokens: u64) {
        // Saturating: a finish without a start must not wrap around.
        let _ = self
            .requests
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
        self.release_tokens(tokens, uncached_tokens);
    }

    /// Requests this replica routed to the endpoint that have had no
    /// response bytes yet: waiting in its queue, or computing their
    /// prompts. Unlike a scrape's queue this is current, and unlike
    /// [`Self::requests`] it leaves out those already answering. Peers do
    /// not report it: their requests are not in it.
    #[inline]
    #[must_use]
    pub fn unanswered(&self) -> u32 {
        self.unanswered.load(Ordering::Relaxed)
    }

    /// Of the prompt tokens of the [`Self::unanswered`] requests, those not
    /// expected in the endpoint's prefix cache: the prefill still to come
    /// there for this replica's requests, now.
    #[inline]
    #[must_use]
    pub fn unanswered_uncached_tokens(&self) -> u64 {
        self.unanswered_uncached_tokens.load(Ordering::Relaxed)
    }

    /// A request routed here, `uncached_prompt_tokens` of whose prompt are
    /// not expected in the endpoint's prefix cache, awaits its first
    /// response bytes (counted by [`Self::unanswered`] and
    /// [`Self::unanswered_uncached_tokens`] until [`Self::answered`]).
    pub fn await_answer(&self, uncached_prompt_tokens: u64) {
        self.unanswered.fetch_add(1, Ordering::Relaxed);
        self.unanswered_uncached_tokens
            .fetch_add(uncached_prompt_tokens, Ordering::Relaxed);
    }

    /// A request counted by [`Self::await_answer`]`(uncached_prompt_tokens)`
    /// had its first response bytes, or ended without any.
    pub fn answered(&self, uncached_prompt_tokens: u64) {
        // Saturating: an answer without a wait must not wrap around.
        let _ = self
            .unanswered
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
        let _ = self.unanswered_uncached_tokens.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |v| Some(v.saturating_sub(uncached_prompt_tokens)),
        );
    }

    /// Takes `tokens` (of which `uncached_tokens`) of a request still in
    /// flight out of the counts: the part of its work that is done (its
    /// prompt, once the first token came), while the request itself still
    /// counts until [`Self::finish_with`] releases the rest.
    pub fn release_tokens(&self, tokens: u64, uncached_tokens: u64) {
        let sub = |counter: &AtomicU64, n: u64| {
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        };
        sub(&self.tokens, tokens);
        sub(&self.uncached_tokens, uncached_tokens.min(tokens));
    }
}

/// The label llm-d gives an endpoint's disaggregation role.
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// An endpoint's disaggregation role: its [`ROLE_LABEL`] label, resolved once
/// when the endpoint is made. An endpoint's labels never change (a relabel
/// makes a new endpoint), so role filters test this instead of looking the
/// label up and comparing strings on every cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndpointRole {
    /// No role label.
    Unlabelled,
    /// `encode`.
    Encode,
    /// `prefill`.
    Prefill,
    /// `decode`.
    Decode,
    /// `encode-prefill`.
    EncodePrefill,
    /// `prefill-decode`.
    PrefillDecode,
    /// `both`.
    Both,
    /// `encode-prefill-decode`.
    EncodePrefillDecode,
    /// Any other value.
    Other,
}

impl EndpointRole {
    /// The role a [`ROLE_LABEL`] value names (`None`: no label).
    #[must_use]
    pub fn from_label(value: Option<&str>) -> Self {
        match value {
            None => Self::Unlabelled,
            Some("encode") => Self::Encode,
            Some("prefill") => Self::Prefill,
            Some("decode") => Self::Decode,
            Some("encode-prefill") => Self::EncodePrefill,
            Some("prefill-decode") => Self::PrefillDecode,
            Some("both") => Self::Both,
            Some("encode-prefill-decode") => Self::EncodePrefillDecode,
            Some(_) => Self::Other,
        }
    }

    /// A distinct bit per role, for sets of roles kept in one integer.
    #[must_use]
    pub fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// One model-server replica.
#[derive(Debug)]
pub struct Endpoint {
    id: EndpointId,
    addr: SocketAddr,
    addr_text: String,
    /// What discovery calls it (e.g. `<pod>-rank-<i>` on Kubernetes).
    name: Option<Arc<str>>,
    labels: BTreeMap<String, String>,
    /// `labels[ROLE_LABEL]`, resolved.
    role: EndpointRole,
    metrics: ArcSwap<EndpointMetrics>,
    /// Bumped after every metrics store, so a reader that kept the metrics
    /// can tell, with one plain load, whether they are still current.
    metrics_version: AtomicU64,
    inflight: InflightCounters,
    adapters: AdapterInflight,
}

impl Endpoint {
    /// A new endpoint with no labels and no metrics yet.
    #[must_use]
    pub fn new(id: u32, addr: SocketAddr) -> Self {
        Self::with_labels(EndpointId(id), addr, BTreeMap::new())
    }

    /// A new endpoint with labels.
    #[must_use]
    pub fn with_labels(id: EndpointId, addr: SocketAddr, labels: BTreeMap<String, String>) -> Self {
        Self {
            id,
            addr,
            addr_text: addr.to_string(),
            name: None,
            role: EndpointRole::from_label(labels.get(ROLE_LABEL).map(String::as_str)),
            labels,
            metrics: ArcSwap::from_pointee(EndpointMetrics::default()),
            metrics_version: AtomicU64::new(0),
            inflight: InflightCounters::default(),
            adapters: AdapterInflight::default(),
        }
    }

    /// Names the endpoint (see [`Endpoint::name`]).
    #[must_use]
    pub fn with_name(mut self, name: Option<Arc<str>>) -> Self {
        self.name = name;
        self
    }

    /// The name discovery gave it (a pod, or `<pod>-rank-<i>` for one of a
    /// pod's data-parallel ranks), else its address.
    #[must_use]
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.addr_text)
    }

    /// The name discovery gave it, if any.
    #[must_use]
    pub fn given_name(&self) -> Option<&Arc<str>> {
        self.name.as_ref()
    }

    /// The endpoint's dense id.
    #[must_use]
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// Address requests are sent to.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address as `ip:port` text (what the gateway receives).
    #[must_use]
    pub fn addr_str(&self) -> &str {
        &self.addr_text
    }

    /// Labels (e.g. `llm-d.ai/role`, engine type).
    #[must_use]
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// One label's value.
    #[must_use]
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// Its disaggregation role (label [`ROLE_LABEL`]), resolved when it was
    /// made.
    #[must_use]
    pub fn role(&self) -> EndpointRole {
        self.role
    }

    /// The latest metrics, shared (no copy).
    #[must_use]
    pub fn metrics(&self) -> Arc<EndpointMetrics> {
        self.metrics.load_full()
    }

    /// Replaces the metrics (called by the data layer after each scrape).
    pub fn set_metrics(&self, metrics: EndpointMetrics) {
        self.metrics.store(Arc::new(metrics));
        self.metrics_version.fetch_add(1, Ordering::Release);
    }

    /// Replaces the metrics with a function of the current ones.
    pub fn update_metrics(&self, mut f: impl FnMut(&EndpointMetrics) -> EndpointMetrics) {
        self.metrics.rcu(|old| Arc::new(f(old)));
        self.metrics_version.fetch_add(1, Ordering::Release);
    }

    /// Changes with every metrics store. Metrics loaded after reading a
    /// version are at least that recent: a reader that still holds them and
    /// sees the same version need not load them again.
    pub(crate) fn metrics_version(&self) -> u64 {
        self.metrics_version.load(Ordering::Acquire)
    }

    /// Requests this picker routed here that are still in flight.
    #[inline]
    #[must_use]
    pub fn inflight(&self) -> &InflightCounters {
        &self.inflight
    }

    /// The requests this picker routed here that name a LoRA adapter, by
    /// adapter, while they are in flight.
    #[inline]
    #[must_use]
    pub fn adapter_inflight(&self) -> &AdapterInflight {
        &self.adapters
    }
}

/// An immutable set of endpoints, swapped as a whole when discovery changes it.
#[derive(Debug, Clone, Default)]
pub struct EndpointSnapshot {
    endpoints: Vec<Arc<Endpoint>>,
    /// Why the set is empty, when discovery knows (a deleted pool, a
    /// selector no Ready pod matches): the client's 503 says so.
    empty_reason: Option<Arc<str>>,
}

impl EndpointSnapshot {
    /// A snapshot of `endpoints`.
    #[must_use]
    pub fn new(endpoints: Vec<Arc<Endpoint>>) -> Self {
        Self {
            endpoints,
            empty_reason: None,
        }
    }

    /// The same snapshot, explaining an empty set with `reason` (for example
    /// "InferencePool prod/llama was deleted"). Kept only when the set is
    /// empty: a reason never describes endpoints that exist.
    #[must_use]
    pub fn with_empty_reason(mut self, reason: Option<Arc<str>>) -> Self {
        self.empty_reason = if self.endpoints.is_empty() {
            reason
        } else {
            None
        };
        self
    }

    /// Why the set is empty, when it is and discovery said why.
    #[must_use]
    pub fn empty_reason(&self) -> Option<&str> {
        self.empty_reason.as_deref()
    }

    /// All endpoints.
    #[must_use]
    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        &self.endpoints
    }

    /// Number of endpoints.
    #[must_use]
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint with `id`, if present.
    #[must_use]
    pub fn get(&self, id: EndpointId) -> Option<&Arc<Endpoint>> {
        self.endpoints.iter().find(|e| e.id() == id)
    }

    /// The endpoint at `addr`, if present.
    #[must_use]
    pub fn by_addr(&self, addr: SocketAddr) -> Option<&Arc<Endpoint>> {
        self.endpoints.iter().find(|e| e.addr() == addr)
    }
}

/// Where the current endpoint set comes from (the data layer's store, a
/// Kubernetes watcher, a test fixture). Reading must be cheap and lock-free:
/// it happens once per request.
pub trait EndpointSource: Send + Sync + fmt::Debug {
    /// The current set.
    fn snapshot(&self) -> Arc<EndpointSnapshot>;
}

impl EndpointSource for ArcSwap<EndpointSnapshot> {
    fn snapshot(&self) -> Arc<EndpointSnapshot> {
        self.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_reason_only_explains_an_empty_set() {
        let reason: Option<Arc<str>> = Some("InferencePool ns/p was deleted".into());
        let empty = EndpointSnapshot::new(Vec::new()).with_empty_reason(reason.clone());
        assert_eq!(empty.empty_reason(), Some("InferencePool ns/p was deleted"));
        let one = Arc::new(Endpoint::new(0, "127.0.0.1:1".parse().unwrap()));
        let full = EndpointSnapshot::new(vec![one]).with_empty_reason(reason);
        assert_eq!(full.empty_reason(), None);
        assert_eq!(EndpointSnapshot::default().empty_reason(), None);
    }

    #[test]
    fn the_role_is_resolved_from_its_label() {
        let addr = "127.0.0.1:1".parse().unwrap();
        let with = |role: Option<&str>| {
            let labels = role
                .map(|r| (ROLE_LABEL.to_owned(), r.to_owned()))
                .into_iter()
                .chain([("zone".to_owned(), "a".to_owned())])
                .collect();
            Endpoint::with_labels(EndpointId(0), addr, labels).role()
        };
        assert_eq!(with(None), EndpointRole::Unlabelled);
        assert_eq!(with(Some("prefill")), EndpointRole::Prefill);
        assert_eq!(with(Some("decode")), EndpointRole::Decode);
        assert_eq!(with(Some("both")), EndpointRole::Both);
        assert_eq!(
            with(Some("encode-prefill-decode")),
            EndpointRole::EncodePrefillDecode
        );
        assert_eq!(with(Some("Decode")), EndpointRole::Other, "case matters");
        assert_eq!(with(Some("")), EndpointRole::Other, "empty is a value");
        let all = [
            EndpointRole::Unlabelled,
            EndpointRole::Encode,
            EndpointRole::Prefill,
            EndpointRole::Decode,
            EndpointRole::EncodePrefill,
            EndpointRole::PrefillDecode,
            EndpointRole::Both,
            EndpointRole::EncodePrefillDecode,
            EndpointRole::Other,
        ];
        let bits = all.iter().fold(0u16, |acc, r| {
            assert_eq!(acc & r.bit(), 0, "{r:?}: a bit of its own");
            acc | r.bit()
        });
        assert_eq!(bits.count_ones() as usize, all.len());
    }

    #[test]
    fn staleness_needs_a_scrape() {
        let now = Instant::now();
        let never = EndpointMetrics::default();
        assert!(never.is_stale(now, Duration::from_secs(3600)));
        let fresh = EndpointMetrics {
            updated_at: Some(now),
            ..EndpointMetrics::default()
        };
        assert!(!fresh.is_stale(now + Duration::from_millis(100), Duration::from_secs(1)));
        assert!(fresh.is_stale(now + Duration::from_secs(2), Duration::from_secs(1)));
    }

    #[test]
    fn inflight_never_wraps() {
        let c = InflightCounters::default();
        c.finish(10);
        assert_eq!(c.requests(), 0);
        c.start(100);
        c.start(50);
        assert_eq!((c.requests(), c.tokens()), (2, 150));
        assert_eq!(
            c.sample(),
            InflightSample {
                requests: 2,
                tokens: 150,
                uncached_tokens: 150
            }
        );
        c.start_with(1000, 40);
        c.finish(100);
        c.finish_with(1000, 40);
        assert_eq!(
            c.sample(),
            InflightSample {
                requests: 1,
                tokens: 50,
                uncached_tokens: 50
            }
        );
    }

    #[test]
    fn extensions_are_typed() {
        #[derive(Debug, PartialEq)]
        struct GpuTemp(f64);
        let mut m = EndpointMetrics::default();
        assert!(m.extension::<GpuTemp>().is_none());
        m.insert_extension(GpuTemp(71.0));
        m.insert_extension(GpuTemp(72.0));
        assert_eq!(m.extension::<GpuTemp>(), Some(&GpuTemp(72.0)));
    }

    #[test]
    fn readers_add_the_peers_counts_and_local_leaves_them_out() {
        let c = InflightCounters::default();
        c.start_with(100, 40);
        let peers = InflightSample {
            requests: 3,
            tokens: 900,
            uncached_tokens: 300,
        };
        c.set_peers(peers);
        let local = InflightSample {
            requests: 1,
            tokens: 100,
            uncached_tokens: 40,
        };
        assert_eq!(c.local(), local);
        assert_eq!(c.peers(), peers);
        assert_eq!(
            c.sample(),
            InflightSample {
                requests: 4,
                tokens: 1000,
                uncached_tokens: 340,
            }
        );
        assert_eq!(
            (c.requests(), c.tokens(), c.uncached_tokens()),
            (4, 1000, 340)
        );
        // Finishing touches the local counts only; the peers' are replaced
        // as a whole.
        c.finish_with(100, 40);
        assert_eq!(c.sample(), peers);
        c.set_peers(InflightSample::default());
        assert_eq!(c.sample(), InflightSample::default());
    }
}
