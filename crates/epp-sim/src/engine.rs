//! The simulated engine: admission (continuous batching up to max-num-seqs
//! with a FIFO waiting queue), prefill proportional to uncached prompt tokens,
//! decode steps that slow with batch size, KV blocks, LoRA adapters, and the
//! counters and histograms the metrics page reports.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::{
    cache::{PrefixCache, block_hashes},
    config::SimConfig,
    metrics::Histogram,
};

/// Characters per token: the tokenizer-free rule every client and router uses.
pub const CHARS_PER_TOKEN: usize = 4;

/// Tokens in `text` under the 4-characters-per-token rule (rounded up).
#[must_use]
pub fn count_tokens(text: &str) -> u64 {
    text.len().div_ceil(CHARS_PER_TOKEN) as u64
}

/// Everything the metrics page shows, guarded by one lock.
#[derive(Debug)]
pub struct State {
    /// Requests admitted and not finished.
    pub running: usize,
    /// Requests waiting for a batch slot.
    pub waiting: usize,
    /// Synthetic queue added through the admin API (also slows the server).
    pub extra_waiting: u32,
    /// Extra gauges exposed verbatim: series text → value.
    pub gauges: BTreeMap<String, f64>,
    /// KV blocks held by running requests.
    pub blocks_in_use: usize,
    /// The prefix cache.
    pub cache: PrefixCache,
    /// Counters.
    pub prompt_tokens_total: u64,
    /// Counters.
    pub generation_tokens_total: u64,
    /// Counters.
    pub request_success_total: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries_total: u64,
    /// Prompt tokens found in the prefix cache.
    pub prefix_hits_total: u64,
    /// Time to first token.
    pub ttft: Histogram,
    /// End-to-end latency.
    pub e2e: Histogram,
    /// Inter-token latency.
    pub itl: Histogram,
    /// Loaded adapters with their running request counts, oldest first.
    pub loras: Vec<(String, usize)>,
    /// Adapters requested but waiting for a free slot.
    pub lora_waiting: BTreeMap<String, usize>,
    /// When the LoRA state last changed (the value of `vllm:lora_requests_info`).
    pub lora_changed: f64,
    rng: SmallRng,
}

/// One simulated server.
#[derive(Debug)]
pub struct Sim {
    /// Settings.
    pub cfg: SimConfig,
    /// Mutable state.
    pub state: Mutex<State>,
    slots: Arc<Semaphore>,
    lora_freed: Notify,
    /// Process start, for `_created` series.
    pub started_unix: f64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What a finished generation reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
}

/// A request between admission and completion. Dropping it (client gone)
/// releases its slot, blocks and adapter.
#[derive(Debug)]
pub struct Generation {
    sim: Arc<Sim>,
    _permit: OwnedSemaphorePermit,
    hashes: Vec<u64>,
    blocks: usize,
    lora: Option<String>,
    started: Instant,
    last_token: Instant,
    /// Prompt tokens, cached tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
    /// Tokens generated so far.
    pub generated: u64,
    max_tokens: u64,
    finished: bool,
}

/// A failure the simulator was told to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// Answer 500.
    Error,
    /// Never answer.
    Hang,
}

impl Sim {
    /// A server with `cfg`.
    #[must_use]
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let now = unix_now();
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(cfg.max_num_seqs.max(1))),
            state: Mutex::new(State {
                running: 0,
                waiting: 0,
                extra_waiting: 0,
                gauges: BTreeMap::new(),
                blocks_in_use: 0,
                cache: PrefixCache::new(cfg.num_gpu_blocks),
                prompt_tokens_total: 0,
                generation_tokens_total: 0,
                request_success_total: 0,
                prefix_queries_total: 0,
                prefix_hits_total: 0,
                ttft: Histogram::new(&crate::metrics::TTFT_BUCKETS),
                e2e: Histogram::new(&crate::metrics::E2E_BUCKETS),
                itl: Histogram::new(&crate::metrics::ITL_BUCKETS),
                loras: Vec::new(),
                lora_waiting: BTreeMap::new(),
                lora_changed: now,
                rng: SmallRng::seed_from_u64(cfg.seed),
            }),
            lora_freed: Notify::new(),
            started_unix: now,
            cfg,
        })
    }

    /// Draws the failure-injection dice for one request.
    pub fn injected_failure(&self) -> Option<Injected> {
        let mut st = self.state.lock();
        let roll: f64 = st.rng.random();
        if roll < self.cfg.error_rate {
            Some(Injected::Error)
        } else if roll < self.cfg.error_rate + self.cfg.hang_rate {
            Some(Injected::Hang)
        } else {
            None
        }
    }

    /// A pseudo-random word for generated text (deterministic per seed).
    pub fn word(&self) -> &'static str {
        const WORDS: [&str; 8] = [
            "the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "slept ",
        ];
        WORDS[self.state.lock().rng.random_range(0..WORDS.len())]
    }

    /// How much the admin-injected queue slows this server down.
    fn slowdown(&self) -> f64 {
        let extra = self.state.lock().extra_waiting;
        1.0 + f64::from(extra) / self.cfg.max_num_seqs.max(1) as f64
    }

    /// Queues a request, waits for a batch slot (FIFO), loads its adapter,
    /// and runs prefill. Returns when the first token is ready.
    pub async fn start(
        self: &Arc<Self>,
        model: &str,
        prompt: &str,
        prompt_tokens: u64,
        max_tokens: u64,
    ) -> Generation {
        let started = Instant::now();
        let queued = Queued::new(self);
        let permit = Arc::clone(&self.slots).acquire_owned().await;
        drop(queued);
        let Ok(permit) = permit else {
            unreachable_semaphore()
        };
        let lora = if self.cfg.lora_modules.iter().any(|m| m == model) {
            Some(model.to_owned())
        } else {
            None
        };
        // Salt the prefix cache by model so adapters do not share blocks.
        let seed = model
            .bytes()
            .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
        let hashes = block_hashes(
            prompt.as_bytes(),
            self.cfg.block_size * CHARS_PER_TOKEN,
            seed,
        );
        let blocks = (prompt_tokens as usize)
            .div_ceil(self.cfg.block_size.max(1))
            .max(1);
        let cached_blocks = {
            let mut st = self.state.lock();
            st.running += 1;
            let hits = st.cache.hits(&hashes);
            st.cache.acquire(&hashes);
            st.blocks_in_use += blocks;
            st.prefix_queries_total += prompt_tokens;
            hits
        };
        let cached_tokens = ((cached_blocks * self.cfg.block_size) as u64).min(prompt_tokens);
        self.state.lock().prefix_hits_total += cached_tokens;
        let mut generation = Generation {
            sim: Arc::clone(self),
            _permit: permit,
            hashes,
            blocks,
            lora: None,
            started,
            last_token: started,
            prompt_tokens,
            cached_tokens,
            generated: 0,
            max_tokens,
            finished: false,
        };
        if let Some(adapter) = lora {
            self.load_adapter(&adapter).await;
            generation.lora = Some(adapter);
        }
        let uncached = prompt_tokens - cached_tokens;
        let prefill_ms =
            self.cfg.ttft_ms + uncached as f64 * self.cfg.prefill_us_per_token / 1000.0;
        sleep_ms(prefill_ms * self.slowdown()).await;
        generation.last_token = Instant::now();
        self.state
            .lock()
            .ttft
            .observe(started.elapsed().as_secs_f64());
        generation
    }

    async fn load_adapter(&self, adapter: &str) {
        let mut waited = false;
        loop {
            let notified = self.lora_freed.notified();
            match self.claim_adapter(adapter, &mut waited) {
                Claim::Resident => return,
                Claim::Load => {
                    sleep_ms(self.cfg.lora_load_ms).await;
                    return;
                }
                Claim::Wait => notified.await,
            }
        }
    }

    /// One attempt to get `adapter` resident, under the lock.
    fn claim_adapter(&self, adapter: &str, waited: &mut bool) -> Claim {
        let mut st = self.state.lock();
        if let Some(entry) = st.loras.iter_mut().find(|(n, _)| n == adapter) {
            entry.1 += 1;
            if *waited {
                remove_waiter(&mut st, adapter);
            }
            return Claim::Resident;
        }
        let idle = st.loras.iter().position(|(_, refs)| *refs == 0);
        if st.loras.len() < self.cfg.max_loras || idle.is_some() {
            if st.loras.len() >= self.cfg.max_loras
                && let Some(i) = idle
            {
                st.loras.remove(i);
            }
            st.loras.push((adapter.to_owned(), 1));
            if *waited {
                remove_waiter(&mut st, adapter);
            }
            st.lora_changed = unix_now();
            return Claim::Load;
        }
        if !*waited {
            *st.lora_waiting.entry(adapter.to_owned()).or_default() += 1;
            st.lora_changed = unix_now();
            *waited = true;
        }
        Claim::Wait
    }
}

/// What [`Sim::claim_adapter`] decided.
enum Claim {
    Resident,
    Load,
    Wait,
}

/// Counts a request as waiting until dropped (also when the client leaves
/// while queued).
struct Queued<'a>(&'a Sim);

impl<'a> Queued<'a> {
    fn new(sim: &'a Sim) -> Self {
        sim.state.lock().waiting += 1;
        Self(sim)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.state.lock().waiting -= 1;
    }
}

fn remove_waiter(st: &mut State, adapter: &str) {
    if let Some(n) = st.lora_waiting.get_mut(adapter) {
        *n -= 1;
        if *n == 0 {
            st.lora_waiting.remove(adapter);
        }
    }
    st.lora_changed = unix_now();
}

#[expect(
    clippy::panic,
    reason = "the slot semaphore is owned by Sim and never closed"
)]
fn unreachable_semaphore() -> ! {
    panic!("batch-slot semaphore closed")
}

async fn sleep_ms(ms: f64) {
    if ms > 0.0 && ms.is_finite() {
        tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
    }
}

impl Generation {
    /// Whether all tokens are out.
    #[must_use]
    pub fn done(&self) -> bool {
        self.generated >= self.max_tokens
    }

    /// Waits one decode step (longer with more running requests) and
    /// produces one token. The first token comes right after prefill.
    pub async fn next_token(&mut self) {
        if self.generated > 0 {
            let running = self.sim.state.lock().running.max(1);
            let step = self.sim.cfg.itl_ms
                * (1.0 + self.sim.cfg.batch_slowdown * (running - 1) as f64)
                * self.sim.slowdown();
            sleep_ms(step).await;
        }
        self.generated += 1;
        let now = Instant::now();
        let mut st = self.sim.state.lock();
        if self.generated > 1 {
            st.itl
                .observe(now.duration_since(self.last_token).as_secs_f64());
        }
        self.last_token = now;
        // A new KV block every block_size tokens of context.
        let context = self.prompt_tokens + self.generated;
        let need = (context as usize).div_ceil(self.sim.cfg.block_size.max(1));
        if need > self.blocks {
            st.blocks_in_use += need - self.blocks;
            self.blocks = need;
        }
    }

    /// Marks success and returns the accounting.
    pub fn finish(mut self) -> Outcome {
        self.finished = true;
        Outcome {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.generated,
            cached_tokens: self.cached_tokens,
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        let mut st = self.sim.state.lock();
        st.running -= 1;
        st.blocks_in_use = st.blocks_in_use.saturating_sub(self.blocks);
        st.cache.release(&self.hashes);
        if self.finished {
            st.request_success_total += 1;
            st.prompt_tokens_total += self.prompt_tokens;
            st.generation_tokens_total += self.generated;
            st.e2e.observe(self.started.elapsed().as_secs_f64());
        }
        if let Some(adapter) = &self.lora {
            if let Some(entry) = st.loras.iter_mut().find(|(n, _)| n == adapter) {
                entry.1 = entry.1.saturating_sub(1);
            }
            st.lora_changed = unix_now();
            drop(st);
            self.sim.lora_freed.notify_waiters();
        }
    }
}

impl State {
    /// KV usage in [0, 1].
    #[must_use]
    pub fn kv_usage(&self, capacity: usize) -> f64 {
        (self.blocks_in_use as f64 / capacity.max(1) as f64).min(1.0)
    }
}
