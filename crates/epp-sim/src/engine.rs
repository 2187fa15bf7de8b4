//! One simulated server: the engine [`Core`] behind a lock, and the single
//! scheduler task that runs its steps. HTTP handlers submit requests and get
//! a [`Generation`] that yields the tokens as the steps produce them.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};

use crate::{
    config::SimConfig,
    engine_core::{Core, Injected, unix_now},
};

/// Characters per token: the tokenizer-free rule every client and router uses.
pub const CHARS_PER_TOKEN: usize = 4;

/// Tokens in `text` under the 4-characters-per-token rule (UTF-8 bytes,
/// rounded up).
#[must_use]
pub fn count_tokens(text: &str) -> u64 {
    text.len().div_ceil(CHARS_PER_TOKEN) as u64
}

/// What the engine tells a request's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// One generated token's text.
    Token(&'static str),
    /// All tokens are out.
    Done(Outcome),
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

/// A generation request, already tokenized by the 4-character rule.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// Model name asked for (base model or adapter).
    pub model: String,
    /// Prompt text (what the prefix cache hashes).
    pub prompt: String,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens to generate.
    pub max_tokens: u64,
}

/// Why a request was refused before it was queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    /// Prompt plus output exceed `--max-model-len`.
    TooLong {
        /// Prompt + max tokens.
        tokens: u64,
        /// The limit.
        max_model_len: u64,
    },
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLong {
                tokens,
                max_model_len,
            } => write!(
                f,
                "This model's maximum context length is {max_model_len} tokens. \
                 However, you requested {tokens} tokens (prompt + max_tokens)."
            ),
        }
    }
}

impl std::error::Error for Rejected {}

/// A request in the engine. Dropping it aborts the request (the scheduler
/// frees its slot and blocks at the next step).
#[derive(Debug)]
pub struct Generation {
    rx: mpsc::UnboundedReceiver<Event>,
    /// Prompt tokens.
    pub prompt_tokens: u64,
}

impl Generation {
    /// The next event; `None` only if the server shut down.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Waits for the end; returns the text and the accounting.
    pub async fn collect(mut self) -> Option<(String, Outcome)> {
        let mut text = String::new();
        loop {
            match self.next().await? {
                Event::Token(t) => text.push_str(t),
                Event::Done(o) => return Some((text, o)),
            }
        }
    }
}

/// One simulated server.
#[derive(Debug)]
pub struct Sim {
    /// Settings.
    pub cfg: SimConfig,
    core: Mutex<Core>,
    wake: Arc<Notify>,
    /// Process start (Unix seconds), for `_created` series.
    pub started_unix: f64,
}

impl Sim {
    /// A server with `cfg`; spawns its scheduler task on the current tokio
    /// runtime. The task ends when the last `Arc<Sim>` is dropped.
    #[must_use]
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let sim = Arc::new(Self {
            core: Mutex::new(Core::new(cfg.clone())),
            cfg,
            wake: Arc::new(Notify::new()),
            started_unix: unix_now(),
        });
        tokio::spawn(run(Arc::downgrade(&sim), Arc::clone(&sim.wake)));
        sim
    }

    /// Runs `f` on the engine state under its lock (metrics, admin, tests).
    pub fn with_core<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        f(&mut self.core.lock())
    }

    /// Rolls the failure-injection dice for one request.
    pub fn roll_failure(&self) -> Option<Injected> {
        self.core.lock().roll_failure()
    }

    /// A response id, deterministic per seed.
    pub fn next_id(&self) -> u64 {
        self.core.lock().next_id()
    }

    /// Queues a request; its tokens arrive through the returned generation.
    ///
    /// # Errors
    /// When prompt plus output exceed the model length.
    pub fn submit(&self, req: NewRequest) -> Result<Generation, Rejected> {
        let tokens = req.prompt_tokens + req.max_tokens;
        let max_model_len = self.cfg.model_len();
        if tokens > max_model_len {
            return Err(Rejected::TooLong {
                tokens,
                max_model_len,
            });
        }
        let lora = self
            .cfg
            .lora_modules
            .contains(&req.model)
            .then(|| req.model.clone());
        let (tx, rx) = mpsc::unbounded_channel();
        self.core.lock().add(
            Instant::now(),
            lora,
            &req.prompt,
            req.prompt_tokens,
            req.max_tokens,
            tx,
        );
        self.wake.notify_one();
        Ok(Generation {
            rx,
            prompt_tokens: req.prompt_tokens,
        })
    }

    /// Wakes the scheduler (after an admin change, or a client left).
    pub fn poke(&self) {
        self.wake.notify_one();
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// The scheduler loop: plan a step, let its time pass, apply it. Back-to-back
/// steps are timed from the previous step's deadline, not from when the timer
/// fired, so timer granularity (1 ms) does not accumulate into drift.
async fn run(sim: Weak<Sim>, wake: Arc<Notify>) {
    let mut last_end: Option<Instant> = None;
    loop {
        let now = Instant::now();
        // Late by more than a few ticks (an overloaded machine): restart
        // the timeline from now rather than replay the backlog.
        let start = last_end
            .filter(|t| now.duration_since(*t) <= Duration::from_millis(5))
            .unwrap_or(now);
        let step = {
            let Some(sim) = sim.upgrade() else { return };
            sim.core.lock().schedule(start)
        };
        match step {
            Some(step) => {
                let end = start + step.duration;
                tokio::time::sleep_until(end).await;
                let Some(sim) = sim.upgrade() else { return };
                sim.core.lock().complete(end);
                last_end = Some(end);
            }
            // Idle means nothing waits either (an idle engine admits every
            // request that fits, and every accepted request fits), so sleep
            // until one arrives.
            None => {
                last_end = None;
                wake.notified().await;
            }
        }
    }
}
