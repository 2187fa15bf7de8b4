//! The engine core: the state one scheduler loop owns, and the two halves of
//! an engine step. [`Core::schedule`] picks what runs in the next step (the
//! running requests first, then waiting ones in FIFO order while the batch,
//! the token budget, the KV pool and the adapter slots allow) and says how
//! long the step takes; [`Core::complete`] applies the step: computed tokens,
//! sampled tokens sent to clients, finished requests retired. No clocks are
//! read here: the caller passes `now`, so tests drive it step by step.

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::{sync::mpsc::UnboundedSender, time::Instant};

use crate::{
    blocks::{
        BlockPool, BlockSource, LoraTag, PoolEvent, block_hashes, output_block_hash,
        token_block_hashes,
    },
    config::SimConfig,
    engine::{CHARS_PER_TOKEN, Event, MediaPlace, NewRequest, Outcome},
    stats::{FinishReason, Stats},
};

/// Generated tokens: four characters each, so counting the output text with
/// the 4-characters-per-token rule gives back the completion token count.
const WORDS: [&str; 10] = [
    "the ", "cat ", "sat ", "mat ", "and ", "dog ", "ran ", "far ", "sun ", "sky ",
];

/// One request inside the engine.
#[derive(Debug)]
struct Req {
    tx: UnboundedSender<Event>,
    lora: Option<LoraTag>,
    /// The request's non-empty `cache_salt`.
    salt: Option<String>,
    /// Hashes of the prompt's full blocks.
    hashes: Vec<u64>,
    /// The prompt's token ids, when known (its blocks are then announced).
    tokens: Option<Vec<u32>>,
    /// The prompt's media items placed among `tokens`.
    media: Vec<MediaPlace>,
    /// With `--cache-output-blocks`: what makes this request's output
    /// blocks' hashes its own.
    output_nonce: Option<u64>,
    prompt_tokens: u64,
    max_tokens: u64,
    generated: u64,
    /// Tokens whose KV is computed.
    computed: u64,
    /// Tokens scheduled in the step in flight.
    scheduled: u64,
    /// Leading `hashes` referenced in the pool.
    held_hashed: usize,
    /// Unhashed blocks held in the pool.
    held_private: usize,
    cached_tokens: Option<u64>,
    /// The prompt's KV came from a prefill server.
    remote_prefill: bool,
    arrival: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl Req {
    fn num_tokens(&self) -> u64 {
        self.prompt_tokens + self.generated
    }

    /// Where blocks `first..` of this request come from, for the pool's events.
    fn source(&self, first: usize, block_size: u64) -> Option<BlockSource<'_>> {
        Some(BlockSource {
            tokens: self.tokens.as_deref()?,
            block_size: block_size as usize,
            hashes: &self.hashes,
            first,
            lora: self.lora.as_ref(),
            salt: self.salt.as_deref(),
            media: &self.media,
        })
    }

    fn release(&mut self, pool: &mut BlockPool) {
        pool.give_back(&self.hashes[..self.held_hashed], self.held_private);
        self.held_hashed = 0;
        self.held_private = 0;
    }
}

/// Grows `req`'s blocks to cover `tokens` tokens. False (and no change) when
/// the pool is short.
fn grow(pool: &mut BlockPool, req: &mut Req, tokens: u64, block_size: u64) -> bool {
    let total = tokens.div_ceil(block_size) as usize;
    let hashed = req
        .hashes
        .len()
        .min((tokens / block_size) as usize)
        .max(req.held_hashed);
    let private = total.saturating_sub(hashed);
    // A partial block that filled up becomes a hashed one: return it first.
    let shrink = req.held_private.saturating_sub(private);
    pool.give_back(&[], shrink);
    let grow_private = private.saturating_sub(req.held_private - shrink);
    let source = req.source(req.held_hashed, block_size);
    if pool.take_from(
        &req.hashes[req.held_hashed..hashed],
        grow_private,
        source.as_ref(),
    ) {
        req.held_hashed = hashed;
        req.held_private = req.held_private - shrink + grow_private;
        true
    } else {
        let restored = pool.take(&[], shrink);
        debug_assert!(restored, "blocks just returned are free");
        false
    }
}

/// A generated token of `r`, with `--cache-output-blocks`: its id joins the
/// prompt's (when those are known, for the KV events), and a block it fills
/// gets a hash, so the next growth caches it like a prompt block.
fn note_output_token(r: &mut Req, nonce: u64, block_size: usize) {
    let tokens = r.num_tokens() as usize;
    if let Some(ids) = r.tokens.as_mut() {
        // Ids of the tokenizer's range, the request's own.
        let id = output_block_hash(nonce, tokens as u64, 0) % 30_000;
        ids.push(u32::try_from(id).unwrap_or(0));
    }
    if tokens.is_multiple_of(block_size) && r.hashes.len() + 1 == tokens / block_size {
        let parent = r.hashes.last().copied().unwrap_or(nonce);
        let index = r.hashes.len();
        r.hashes.push(output_block_hash(parent, nonce, index));
    }
}

/// A resident LoRA adapter.
#[derive(Debug)]
struct Adapter {
    name: String,
    last_used: u64,
}

/// Runtime settings the admin API changes.
#[derive(Debug, Clone, Default)]
pub struct Knobs {
    /// Synthetic waiting requests: reported, and slowing every step.
    pub extra_waiting: u32,
    /// Fraction of requests answered with HTTP 500.
    pub error_rate: f64,
    /// Fraction of requests that never answer.
    pub hang_rate: f64,
    /// Every generation request hangs.
    pub hang: bool,
    /// Delay before every `/metrics` answer, milliseconds.
    pub slow_metrics_ms: f64,
    /// `/health` answers 503.
    pub unhealthy: bool,
    /// The engine runs no steps: requests pile up, metrics keep answering.
    pub stall: bool,
    /// Extra gauges printed on `/metrics`: series text → value.
    pub gauges: BTreeMap<String, f64>,
    /// The next this many `/v1/load_lora_adapter` and
    /// `/v1/unload_lora_adapter` calls answer 500 (a syncer's retries).
    pub fail_lora_updates: u32,
}

/// Why a runtime LoRA update was refused (vLLM's answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoraUpdateError {
    /// Loading a name already served.
    AlreadyLoaded,
    /// Unloading a name that is not an adapter.
    NotFound,
}

/// A failure the dice chose for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// Answer 500.
    Error,
    /// Never answer.
    Hang,
}

/// The engine state. One scheduler loop owns the steps; HTTP handlers add
/// requests and read metrics under the same lock.
#[derive(Debug)]
pub struct Core {
    cfg: SimConfig,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    pool: BlockPool,
    adapters: Vec<Adapter>,
    clock: u64,
    rng: SmallRng,
    /// Counters and histograms.
    pub stats: Stats,
    /// Admin-set behaviour.
    pub knobs: Knobs,
    /// `vllm:lora_requests_info` series seen: labels and the unix time they
    /// were last current, oldest first.
    pub lora_history: Vec<(String, f64)>,
}

/// What [`Core::schedule`] planned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// How long the step takes.
    pub duration: Duration,
    /// Prompt tokens computed in the step.
    pub prefill_tokens: u64,
    /// Requests decoding one token in the step.
    pub decodes: u64,
}

impl Core {
    /// An idle engine for `cfg`.
    #[must_use]
    pub fn new(cfg: SimConfig) -> Self {
        Self {
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool: BlockPool::new(cfg.num_gpu_blocks),
            adapters: Vec::new(),
            clock: 0,
            // Mix in the pod name so servers sharing a seed differ (ids too).
            rng: SmallRng::seed_from_u64(cfg.pod_name.bytes().fold(cfg.seed, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })),
            stats: Stats::new(cfg.model_len()),
            knobs: Knobs {
                error_rate: cfg.error_rate,
                hang_rate: cfg.hang_rate,
                hang: cfg.hang,
                slow_metrics_ms: cfg.slow_metrics_ms,
                ..Knobs::default()
            },
            lora_history: Vec::new(),
            cfg,
        }
    }

    /// Settings.
    #[must_use]
    pub fn cfg(&self) -> &SimConfig {
        &self.cfg
    }

    /// Requests in the batch.
    #[must_use]
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting (without the admin's synthetic ones).
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The KV pool.
    #[must_use]
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// KV usage in [0, 1]: referenced blocks / capacity.
    #[must_use]
    pub fn kv_usage(&self) -> f64 {
        self.pool.used() as f64 / self.pool.capacity().max(1) as f64
    }

    /// Tokens whose KV the running requests hold.
    #[must_use]
    pub fn running_tokens(&self) -> u64 {
        self.running.iter().map(|r| r.computed).sum()
    }

    /// Resident adapters, least recently used first.
    #[must_use]
    pub fn resident_adapters(&self) -> Vec<&str> {
        let mut a: Vec<&Adapter> = self.adapters.iter().collect();
        a.sort_by_key(|a| a.last_used);
        a.into_iter().map(|a| a.name.as_str()).collect()
    }

    /// Adapters of running requests, sorted, deduplicated.
    #[must_use]
    pub fn running_adapters(&self) -> Vec<&str> {
        adapters_of(self.running.iter())
    }

    /// Adapters of waiting requests, sorted, deduplicated.
    #[must_use]
    pub fn waiting_adapters(&self) -> Vec<&str> {
        adapters_of(self.waiting.iter())
    }

    /// Rolls the failure-injection dice for one request.
    pub fn roll_failure(&mut self) -> Option<Injected> {
        if self.knobs.hang {
            return Some(Injected::Hang);
        }
        let roll: f64 = self.rng.random();
        if roll < self.knobs.error_rate {
            Some(Injected::Error)
        } else if roll < self.knobs.error_rate + self.knobs.hang_rate {
            Some(Injected::Hang)
        } else {
            None
        }
    }

    /// A request id, deterministic per seed.
    pub fn next_id(&mut self) -> u64 {
        self.rng.random()
    }

    /// Starts noting the KV pool's changes for [`Core::take_kv_events`].
    pub fn record_kv_events(&mut self) {
        self.pool.record_events();
    }

    /// Whether KV cache events are noted.
    #[must_use]
    pub fn kv_events_on(&self) -> bool {
        self.pool.records_events()
    }

    /// The KV pool's changes since the last call (one engine step's worth
    /// when called after each step).
    pub fn take_kv_events(&mut self) -> Vec<PoolEvent> {
        self.pool.take_events()
    }

    /// Drops every cached block if no request holds one (vLLM's
    /// `reset_prefix_cache`); false, changing nothing, otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset()
    }

    /// Queues a request (its adapter, if any, is `req.model`).
    pub fn add(&mut self, now: Instant, req: NewRequest, tx: UnboundedSender<Event>) {
        let lora = self
            .cfg
            .lora_modules
            .iter()
            .position(|m| *m == req.model)
            .map(|i| LoraTag {
                id: u32::try_from(i + 1).unwrap_or(u32::MAX),
                name: req.model.clone(),
            });
        // Salt by adapter: the base model under any served name shares
        // blocks, an adapter's KV differs from the base model's; and by
        // `cache_salt`, which keeps one tenant's blocks from another's.
        let salt = lora
            .as_ref()
            .map_or("", |l| l.name.as_str())
            .bytes()
            .chain(req.cache_salt.as_deref().unwrap_or("").bytes().map(|b| !b))
            .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
        let prompt_tokens = req.prompt_tokens;
        let hashes = match &req.token_ids {
            Some(ids) => token_block_hashes(ids, self.cfg.block_size, salt, &req.media),
            None => {
                let block_chars = self.cfg.block_size.max(1) * CHARS_PER_TOKEN;
                let mut hashes = block_hashes(req.prompt.as_bytes(), block_chars, salt);
                hashes.truncate((prompt_tokens / self.block_size()) as usize);
                hashes
            }
        };
        self.waiting.push_back(Req {
            tx,
            lora,
            salt: req.cache_salt.filter(|s| !s.is_empty()),
            hashes,
            tokens: req.token_ids,
            media: req.media,
            output_nonce: self.cfg.cache_output_blocks.then(|| self.rng.random()),
            prompt_tokens,
            max_tokens: req.max_tokens.max(1),
            generated: 0,
            computed: 0,
            scheduled: 0,
            held_hashed: 0,
            held_private: 0,
            cached_tokens: None,
            remote_prefill: req.remote_prefill,
            arrival: now,
            admitted: None,
            first_token: None,
            last_token: None,
        });
        self.note_lora_change();
    }

    fn block_size(&self) -> u64 {
        self.cfg.block_size.max(1) as u64
    }

    /// Drops requests whose client went away.
    fn drop_abandoned(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|r| !r.tx.is_closed());
        for _ in self.waiting.len()..before {
            self.stats.finish(FinishReason::Abort);
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let mut r = self.running.remove(i);
                r.release(&mut self.pool);
                self.stats.finish(FinishReason::Abort);
            } else {
                i += 1;
            }
        }
    }

    /// Plans the next step; `None` when there is nothing to run.
    pub fn schedule(&mut self, now: Instant) -> Option<Step> {
        self.drop_abandoned();
        if self.knobs.stall {
            return None;
        }
        let bs = self.block_size();
        let mut budget = self.cfg.max_num_batched_tokens.max(1);
        let (mut prefill_tokens, mut decodes, mut loads) = (0u64, 0u64, 0u32);
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            let n = (r.num_tokens() - r.computed).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let target = r.computed + n;
            let mut scheduled = false;
            while i < self.running.len() {
                if grow(&mut self.pool, &mut self.running[i], target, bs) {
                    scheduled = true;
                    break;
                }
                // Out of blocks: preempt the most recently admitted request
                // (possibly this one); it recomputes from scratch later.
                if let Some(mut victim) = self.running.pop() {
                    victim.release(&mut self.pool);
                    victim.computed = 0;
                    victim.scheduled = 0;
                    self.waiting.push_front(victim);
                    self.stats.preemptions += 1;
                    preempted = true;
                }
            }
            if !scheduled {
                break;
            }
            let r = &mut self.running[i];
            r.scheduled = n;
            budget -= n;
            if n == 1 && r.generated > 0 {
                decodes += 1;
            } else {
                prefill_tokens += n;
            }
            i += 1;
        }
        if !preempted {
            let mut j = 0;
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs.max(1) {
                let Some(r) = self.waiting.get(j) else { break };
                let load = match r.lora.as_ref().map(|l| l.name.as_str()) {
                    None => None,
                    Some(name) => match self.adapter_slot(name) {
                        Slot::Resident => None,
                        Slot::Load(evict) => Some(evict),
                        Slot::Busy => {
                            // No adapter slot: skip it, later requests may go.
                            j += 1;
                            continue;
                        }
                    },
                };
                let Some(n) = self.try_admit(j, budget, bs) else {
                    break;
                };
                let Some(mut r) = self.waiting.remove(j) else {
                    break;
                };
                if let (Some(evict), Some(name)) = (load, r.lora.as_ref().map(|l| l.name.clone())) {
                    if let Some(k) = evict {
                        self.adapters.swap_remove(k);
                    }
                    self.adapters.push(Adapter { name, last_used: 0 });
                    loads += 1;
                }
                r.admitted.get_or_insert(now);
                r.scheduled = n;
                budget -= n;
                prefill_tokens += n;
                self.running.push(r);
            }
        }
        for r in &self.running {
            if let Some(name) = r.lora.as_ref().map(|l| l.name.as_str())
                && let Some(a) = self.adapters.iter_mut().find(|a| a.name == name)
            {
                self.clock += 1;
                a.last_used = self.clock;
            }
        }
        self.stats.lora_loads += u64::from(loads);
        self.note_lora_change();
        if prefill_tokens == 0 && decodes == 0 {
            return None;
        }
        Some(Step {
            duration: self.step_time(prefill_tokens, decodes, loads),
            prefill_tokens,
            decodes,
        })
    }

    /// Looks up the prefix cache for waiting request `j` and takes blocks for
    /// its first chunk. Returns the chunk size, or `None` (nothing changed)
    /// when the pool is short.
    fn try_admit(&mut self, j: usize, budget: u64, bs: u64) -> Option<u64> {
        let r = self.waiting.get_mut(j)?;
        // vLLM always recomputes the last prompt token to get logits.
        let max_hit = ((r.num_tokens() - 1) / bs) as usize;
        let hits = self.pool.hits(&r.hashes).min(max_hit);
        if !self
            .pool
            .take_from(&r.hashes[..hits], 0, r.source(0, bs).as_ref())
        {
            return None;
        }
        r.held_hashed = hits;
        r.computed = hits as u64 * bs;
        r.cached_tokens.get_or_insert(r.computed);
        if r.remote_prefill && r.generated == 0 {
            // P/D: the rest of the prompt's KV arrived from the prefill
            // server. Its blocks are taken (and cached when released); only
            // the last prompt token runs here, for its logits.
            if !grow(&mut self.pool, r, r.prompt_tokens, bs) {
                r.release(&mut self.pool);
                r.computed = 0;
                return None;
            }
            r.computed = r.computed.max(r.prompt_tokens - 1);
        }
        let n = (r.num_tokens() - r.computed).min(budget);
        if !grow(&mut self.pool, r, r.computed + n, bs) {
            r.release(&mut self.pool);
            r.computed = 0;
            return None;
        }
        self.stats.prefix_queries += r.num_tokens();
        self.stats.prefix_hits += r.cached_tokens.unwrap_or(0);
        Some(n)
    }

    fn adapter_slot(&self, name: &str) -> Slot {
        if self.adapters.iter().any(|a| a.name == name) {
            return Slot::Resident;
        }
        if self.adapters.len() < self.cfg.max_loras {
            return Slot::Load(None);
        }
        let idle = self
            .adapters
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                !self
                    .running
                    .iter()
                    .any(|r| r.lora.as_ref().is_some_and(|l| l.name == a.name))
            })
            .min_by_key(|(_, a)| a.last_used);
        match idle {
            Some((k, _)) => Slot::Load(Some(k)),
            None => Slot::Busy,
        }
    }

    fn step_time(&self, prefill_tokens: u64, decodes: u64, loads: u32) -> Duration {
        let cfg = &self.cfg;
        let mut ms = 0.0;
        if decodes > 0 {
            let batch = self.running.len().max(1) as f64;
            ms += cfg.itl_ms * (1.0 + cfg.batch_slowdown * (batch - 1.0));
        }
        if prefill_tokens > 0 {
            ms += cfg.ttft_ms + prefill_tokens as f64 * cfg.prefill_us_per_token / 1000.0;
        }
        ms += f64::from(loads) * cfg.lora_load_ms;
        ms *= 1.0 + f64::from(self.knobs.extra_waiting) / cfg.max_num_seqs.max(1) as f64;
        if ms.is_finite() && ms > 0.0 {
            Duration::from_secs_f64(ms / 1000.0)
        } else {
            Duration::ZERO
        }
    }

    /// Applies the step planned by the last [`Core::schedule`], at `now`.
    pub fn complete(&mut self, now: Instant) {
        let mut step_tokens = 0;
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            let n = std::mem::take(&mut r.scheduled);
            step_tokens += n;
            r.computed += n;
            if n == 0 || r.computed < r.num_tokens() {
                i += 1;
                continue;
            }
            // The last computed token yields a new one.
            r.generated += 1;
            if let Some(nonce) = r.output_nonce {
                note_output_token(r, nonce, self.cfg.block_size.max(1));
            }
            self.stats.generation_tokens += 1;
            match r.last_token {
                None => {
                    let ttft = now.duration_since(r.arrival).as_secs_f64();
                    self.stats.ttft.observe(ttft);
                    self.stats.prompt_tokens += r.prompt_tokens;
                    if let Some(a) = r.admitted {
                        self.stats
                            .prefill
                            .observe(now.duration_since(a).as_secs_f64());
                        self.stats
                            .queue
                            .observe(a.duration_since(r.arrival).as_secs_f64());
                    }
                    r.first_token = Some(now);
                }
                Some(last) => self
                    .stats
                    .itl
                    .observe(now.duration_since(last).as_secs_f64()),
            }
            r.last_token = Some(now);
            let word = WORDS[self.rng.random_range(0..WORDS.len())];
            let _ = r.tx.send(Event::Token(word));
            if r.generated >= r.max_tokens {
                let mut r = self.running.remove(i);
                r.release(&mut self.pool);
                self.retire(&r, now);
            } else {
                i += 1;
            }
        }
        self.stats.steps += 1;
        self.stats.iteration_tokens.observe(step_tokens as f64);
        self.note_lora_change();
    }

    fn retire(&mut self, r: &Req, now: Instant) {
        let s = &mut self.stats;
        s.finish(FinishReason::Length);
        s.e2e.observe(now.duration_since(r.arrival).as_secs_f64());
        if let Some(first) = r.first_token {
            s.decode.observe(now.duration_since(first).as_secs_f64());
        }
        if let Some(a) = r.admitted {
            s.inference.observe(now.duration_since(a).as_secs_f64());
        }
        s.request_prompt_tokens.observe(r.prompt_tokens as f64);
        s.request_generation_tokens.observe(r.generated as f64);
        let _ = r.tx.send(Event::Done(Outcome {
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.generated,
            cached_tokens: r.cached_tokens.unwrap_or(0),
        }));
    }

    /// Loads adapter `name` at runtime (vLLM's `/v1/load_lora_adapter`).
    ///
    /// # Errors
    /// [`LoraUpdateError::AlreadyLoaded`] when `name` is already served.
    pub fn load_lora(&mut self, name: &str) -> Result<(), LoraUpdateError> {
        if name.is_empty() || self.cfg.serves(name) {
            return Err(LoraUpdateError::AlreadyLoaded);
        }
        // Appended (never reusing a slot): an adapter's tag, its position,
        // stays what its cached blocks were stored under.
        self.cfg.lora_modules.push(name.to_owned());
        self.note_lora_change();
        Ok(())
    }

    /// Unloads adapter `name` (vLLM's `/v1/unload_lora_adapter`); requests
    /// already running finish.
    ///
    /// # Errors
    /// [`LoraUpdateError::NotFound`] when `name` is not an adapter.
    pub fn unload_lora(&mut self, name: &str) -> Result<(), LoraUpdateError> {
        let slot = self
            .cfg
            .lora_modules
            .iter_mut()
            .find(|m| !name.is_empty() && *m == name)
            .ok_or(LoraUpdateError::NotFound)?;
        // Left empty rather than removed, so later adapters keep their tags.
        slot.clear();
        self.adapters.retain(|a| a.name != name);
        self.note_lora_change();
        Ok(())
    }

    /// The adapters served now (static `--lora-modules` and loaded ones).
    pub fn lora_adapters(&self) -> impl Iterator<Item = &str> {
        self.cfg
            .lora_modules
            .iter()
            .map(String::as_str)
            .filter(|m| !m.is_empty())
    }

    /// Records a new `vllm:lora_requests_info` label set when it changes.
    fn note_lora_change(&mut self) {
        if self.cfg.lora_modules.is_empty() {
            return;
        }
        let labels = format!(
            "max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"",
            self.cfg.max_loras,
            self.running_adapters().join(","),
            self.waiting_adapters().join(",")
        );
        if self.lora_history.last().is_some_and(|(l, _)| *l == labels) {
            return;
        }
        self.lora_history.retain(|(l, _)| *l != labels);
        self.lora_history.push((labels, unix_now()));
        if self.lora_history.len() > 8 {
            self.lora_history.remove(0);
        }
    }
}

/// Where an adapter can run.
enum Slot {
    Resident,
    /// Load it, evicting the idle adapter at this index if any.
    Load(Option<usize>),
    Busy,
}

fn adapters_of<'a>(reqs: impl Iterator<Item = &'a Req>) -> Vec<&'a str> {
    let mut v: Vec<&str> = reqs
        .filter_map(|r| r.lora.as_ref().map(|l| l.name.as_str()))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Seconds since the Unix epoch.
#[must_use]
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
