//! What one scheduling cycle sees: the request, the candidates, and scratch
//! state that data producers fill for filters and scorers.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use rand::rngs::SmallRng;

use crate::{Endpoint, EndpointId, EndpointMetrics, InferenceRequest, LatencyPredictions};

/// An endpoint considered in a scheduling cycle, with the metrics loaded once
/// for the whole cycle so every plugin sees the same values.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The endpoint.
    pub endpoint: Arc<Endpoint>,
    /// Its metrics as of the start of the cycle.
    pub metrics: Arc<EndpointMetrics>,
    /// The endpoint's metrics version, read before `metrics` were loaded.
    metrics_version: u64,
}

impl Candidate {
    /// Loads an endpoint's current metrics into a candidate.
    #[must_use]
    pub fn new(endpoint: &Arc<Endpoint>) -> Self {
        // Read before loading: metrics loaded after are at least this recent.
        let metrics_version = endpoint.metrics_version();
        Self {
            metrics: endpoint.metrics(),
            endpoint: Arc::clone(endpoint),
            metrics_version,
        }
    }

    /// Reloads the metrics if the endpoint stored new ones since they were
    /// loaded (a plain load and compare when it did not).
    pub(crate) fn refresh(&mut self) {
        let version = self.endpoint.metrics_version();
        if version != self.metrics_version {
            self.metrics = self.endpoint.metrics();
            self.metrics_version = version;
        }
    }

    /// A number that changes whenever the endpoint's metrics are stored
    /// anew (a scrape, an event feed's update), read before
    /// [`Self::metrics`] were loaded, so those metrics are at least that
    /// recent. A plugin that learns something once per scrape can skip,
    /// with one compare, candidates whose version it has already seen: two
    /// candidates with the same version may carry different metrics only
    /// when a store landed while the first loaded, and then the next
    /// version differs again.
    #[inline]
    #[must_use]
    pub fn metrics_version(&self) -> u64 {
        self.metrics_version
    }

    /// The endpoint's id.
    #[inline]
    #[must_use]
    pub fn id(&self) -> EndpointId {
        self.endpoint.id()
    }

    /// What this picker sent to the endpoint since its metrics were scraped:
    /// its in-flight counts now minus those at the scrape
    /// ([`EndpointMetrics::inflight_at_scrape`]), i.e. dispatched minus
    /// completed in between. Scraped queue and KV values lag by up to one
    /// scrape interval; adding this keeps a burst of arrivals between two
    /// scrapes from all seeing the same "least loaded" endpoint. Negative when
    /// more completed than were dispatched.
    #[inline]
    #[must_use]
    pub fn since_scrape(&self) -> SinceScrape {
        let now = self.endpoint.inflight().sample();
        let then = self.metrics.inflight_at_scrape;
        SinceScrape {
            requests: i64::from(now.requests) - i64::from(then.requests),
            tokens: signed(now.tokens) - signed(then.tokens),
            uncached_tokens: signed(now.uncached_tokens) - signed(then.uncached_tokens),
        }
    }
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Net change of the picker's in-flight counts for an endpoint since its last
/// scrape (see [`Candidate::since_scrape`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinceScrape {
    /// Requests dispatched minus requests completed.
    pub requests: i64,
    /// Their estimated prompt tokens, dispatched minus completed.
    pub tokens: i64,
    /// The part of those tokens not expected in the endpoint's prefix cache
    /// (see [`crate::InflightCounters::start_with`]).
    pub uncached_tokens: i64,
}

/// Result of matching a request's prefix blocks against an index, per endpoint.
///
/// Indexed by [`EndpointId`] so it survives filtering; reused across cycles.
#[derive(Debug, Clone, Default)]
pub struct PrefixMatch {
    /// Block hashes of the request's prompt, in order (chained: each depends on
    /// all before it). Computed once per request, shared between matching and
    /// recording the pick.
    pub hashes: Vec<u64>,
    /// Contiguous matched blocks from the start, per endpoint id.
    matched: Vec<u32>,
    /// Whether a prefix producer ran in this cycle.
    pub computed: bool,
    /// Identifies the producer that filled this match (0 = none), so only
    /// the index that matched a request records its pick.
    pub producer: u64,
    /// Tokens per block of the producer's index (0 = unknown), for scorers
    /// that weigh the absolute matched length.
    pub block_size_tokens: u32,
}

impl PrefixMatch {
    /// Clears for a new cycle, keeping capacity.
    pub fn reset(&mut self) {
        self.hashes.clear();
        self.matched.clear();
        self.computed = false;
        self.producer = 0;
        self.block_size_tokens = 0;
    }

    /// Number of blocks in the request.
    #[must_use]
    pub fn total_blocks(&self) -> usize {
        self.hashes.len()
    }

    /// Records the contiguous matched blocks for `id`.
    pub fn set_matched(&mut self, id: EndpointId, blocks: u32) {
        let i = id.index();
        if self.matched.len() <= i {
            self.matched.resize(i + 1, 0);
        }
        self.matched[i] = blocks;
    }

    /// Contiguous matched blocks for `id` (0 if unknown).
    #[must_use]
    pub fn matched(&self, id: EndpointId) -> u32 {
        self.matched.get(id.index()).copied().unwrap_or(0)
    }

    /// Matched fraction of the request's blocks for `id`, in `[0, 1]`.
    #[must_use]
    pub fn ratio(&self, id: EndpointId) -> f64 {
        if self.hashes.is_empty() {
            return 0.0;
        }
        f64::from(self.matched(id)) / self.hashes.len() as f64
    }

    /// Whether any endpoint matched at least one block.
    #[must_use]
    pub fn any_hit(&self) -> bool {
        self.matched.iter().any(|&m| m > 0)
    }
}

/// No prefix matches: what a reader of a set no producer filled sees.
static NO_PREFIX: PrefixMatch = PrefixMatch {
    hashes: Vec::new(),
    matched: Vec::new(),
    computed: false,
    producer: 0,
    block_size_tokens: 0,
};

/// Which of a cycle's prefix-match sets ([`CycleState::prefix_at`]) a
/// plugin reads or fills: 0, [`CycleState::prefix`], unless config loading
/// bound it to another ([`crate::Plugin::bind_prefix_slot`]), as when two
/// readers name two producers (llm-d's `prefixMatchInfoProducerName`).
#[derive(Debug, Default)]
pub struct PrefixSlot(AtomicUsize);

impl PrefixSlot {
    /// The slot.
    #[must_use]
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Binds the slot (at config loading, before any cycle).
    pub fn set(&self, slot: usize) {
        self.0.store(slot, Ordering::Relaxed);
    }
}

impl Clone for PrefixSlot {
    fn clone(&self) -> Self {
        Self(AtomicUsize::new(self.get()))
    }
}

/// The request's prompt as the model server's tokenizer sees it, when a
/// token producer ran (`token-producer`).
#[derive(Debug, Clone, Default)]
pub struct TokenizedPrompt {
    /// Token ids, in order.
    pub ids: Vec<u32>,
    /// Whether a token producer filled `ids` in this cycle (an empty prompt
    /// is computed and empty).
    pub computed: bool,
}

impl TokenizedPrompt {
    /// Clears for a new cycle, keeping capacity.
    pub fn reset(&mut self) {
        self.ids.clear();
        self.computed = false;
    }
}

/// Which of the request's multimodal items (images, audio, video) each
/// endpoint is expected to hold in its encoder cache, when a multimodal
/// producer ran (`mm-embeddings-cache-producer`).
#[derive(Debug, Clone, Default)]
pub struct MultimodalMatch {
    /// The request's distinct items, as 64-bit hashes.
    pub items: Vec<u64>,
    /// Items matched, per endpoint id.
    matched: Vec<u32>,
}

impl MultimodalMatch {
    /// Clears for a new cycle, keeping capacity.
    pub fn reset(&mut self) {
        self.items.clear();
        self.matched.clear();
    }

    /// Records how many of the items `id` holds.
    pub fn set_matched(&mut self, id: EndpointId, items: u32) {
        let i = id.index();
        if self.matched.len() <= i {
            self.matched.resize(i + 1, 0);
        }
        self.matched[i] = items;
    }

    /// Items `id` holds (0 if unknown).
    #[must_use]
    pub fn matched(&self, id: EndpointId) -> u32 {
        self.matched.get(id.index()).copied().unwrap_or(0)
    }
}

/// Per-request scratch state, reused across cycles so the hot path does not
/// allocate. Data producers write here; filters and scorers read.
#[derive(Debug, Default)]
pub struct CycleState {
    /// The tokenized prompt, when a token producer ran.
    pub tokens: TokenizedPrompt,
    /// Prefix-cache match results (slot 0: the producer the first reader
    /// names).
    pub prefix: PrefixMatch,
    /// Further producers' matches, slot `k` at index `k − 1`, when readers
    /// name different producers.
    pub more_prefix: Vec<PrefixMatch>,
    /// Latency predictions, when a latency predictor ran.
    pub latency: LatencyPredictions,
    /// Multimodal encoder-cache matches, when a multimodal producer ran.
    pub multimodal: MultimodalMatch,
    /// The endpoint an earlier profile of this cycle picked, left by the
    /// profile handler for plugins of a later profile to compare against
    /// (P/D: the decode pick, when the prefill profile runs; llm-d's
    /// peer-endpoint attribute).
    pub peer: Option<Arc<Endpoint>>,
}

impl CycleState {
    /// Clears for a new cycle, keeping capacity.
    pub fn reset(&mut self) {
        self.tokens.reset();
        self.prefix.reset();
        for p in &mut self.more_prefix {
            p.reset();
        }
        self.latency.reset();
        self.multimodal.reset();
        self.peer = None;
    }

    /// The prefix matches in `slot` (0 is [`Self::prefix`]); none when no
    /// producer filled that slot.
    #[must_use]
    pub fn prefix_at(&self, slot: usize) -> &PrefixMatch {
        match slot {
            0 => &self.prefix,
            k => self.more_prefix.get(k - 1).unwrap_or(&NO_PREFIX),
        }
    }

    /// The prefix matches in `slot`, for its producer to fill (allocates a
    /// slot the first time only; the state is reused across cycles).
    pub fn prefix_at_mut(&mut self, slot: usize) -> &mut PrefixMatch {
        self.tokens_and_prefix_mut(slot).1
    }

    /// The tokenized prompt and the prefix matches in `slot`, for a
    /// producer that reads the one to fill the other.
    pub fn tokens_and_prefix_mut(&mut self, slot: usize) -> (&TokenizedPrompt, &mut PrefixMatch) {
        if slot == 0 {
            return (&self.tokens, &mut self.prefix);
        }
        if self.more_prefix.len() < slot {
            self.more_prefix.resize_with(slot, PrefixMatch::default);
        }
        (&self.tokens, &mut self.more_prefix[slot - 1])
    }
}

/// Everything a plugin may look at during one scheduling cycle.
#[derive(Debug)]
pub struct CycleContext<'a> {
    /// The request being scheduled.
    pub request: &'a InferenceRequest,
    /// The cycle's notion of "now" (one clock read per cycle).
    pub now: Instant,
    /// Seedable randomness for tie-breaking and exploration.
    pub rng: &'a mut SmallRng,
    /// Per-request state filled by data producers.
    pub state: &'a mut CycleState,
}
