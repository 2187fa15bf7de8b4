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

use tokenizers::Tokenizer;

use crate::chat_template::ChatTemplate;

use crate::{
    config::SimConfig,
    engine_core::{Core, Injected, unix_now},
    kv_events::{KvEventSink, NotQueued},
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

/// A generation request, already tokenized: by a real tokenizer (then
/// `token_ids` is set) or by the 4-character rule.
#[derive(Debug, Clone, Default)]
pub struct NewRequest {
    /// Model name asked for (base model or adapter).
    pub model: String,
    /// Prompt text (what the prefix cache hashes when `token_ids` is unset).
    pub prompt: String,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens to generate.
    pub max_tokens: u64,
    /// The prompt's token ids, when known: the prefix cache then hashes
    /// blocks of `--block-size` ids, and KV events announce them.
    pub token_ids: Option<Vec<u32>>,
    /// The request's `cache_salt`: blocks are only shared with requests of
    /// the same salt.
    pub cache_salt: Option<String>,
    /// The prompt's media items and their places in `token_ids`.
    pub media: Vec<MediaPlace>,
    /// The prompt's KV was computed by a prefill server and transferred here
    /// (P/D, `kv_transfer_params.do_remote_prefill`): its blocks are taken
    /// at admission and only the last prompt token is computed, as vLLM's
    /// KV connectors do.
    pub remote_prefill: bool,
}

/// A media item of a prompt and the placeholder tokens standing for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaPlace {
    /// `image`, `audio` or `video`.
    pub modality: &'static str,
    /// Its identifier (vLLM's `mm_hash`).
    pub hash: String,
    /// Index of its first placeholder token.
    pub offset: u32,
    /// Its number of placeholder tokens.
    pub length: u32,
}

impl MediaPlace {
    /// Whether it has a token in `start..end`.
    #[must_use]
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        (self.offset as usize) < end && (self.offset + self.length) as usize > start
    }
}

/// A chat rendered through the `--chat-template`.
#[derive(Debug, Clone, Default)]
pub struct RenderedChat {
    /// The text the template rendered.
    pub text: String,
    /// Its token ids, media placeholders expanded (`--mm-tokens`).
    pub token_ids: Vec<u32>,
    /// The media items placed among them (none when `--mm-tokens` is 0 or
    /// the template did not render a marker per item).
    pub media: Vec<MediaPlace>,
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
    tokenizer: Option<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    kv_events: Option<KvEventSink>,
}

/// What a server has beyond its settings: the loaded `--tokenizer` and the
/// queue of a started KV event publisher.
#[derive(Debug, Default)]
pub struct Attachments {
    /// Tokenizes text prompts.
    pub tokenizer: Option<Tokenizer>,
    /// Renders chat requests (needs the tokenizer).
    pub chat_template: Option<ChatTemplate>,
    /// Receives the KV cache events of every step.
    pub kv_events: Option<KvEventSink>,
}

impl Sim {
    /// A server with `cfg` (without tokenizer or KV events); spawns its
    /// scheduler task on the current tokio runtime. The task ends when the
    /// last `Arc<Sim>` is dropped.
    #[must_use]
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        Self::with(cfg, Attachments::default())
    }

    /// [`Sim::new`] with a tokenizer and/or a KV event queue.
    #[must_use]
    pub fn with(cfg: SimConfig, extra: Attachments) -> Arc<Self> {
        let mut core = Core::new(cfg.clone());
        if extra.kv_events.is_some() {
            core.record_kv_events();
        }
        let sim = Arc::new(Self {
            core: Mutex::new(core),
            cfg,
            wake: Arc::new(Notify::new()),
            started_unix: unix_now(),
            tokenizer: extra.tokenizer,
            chat_template: extra.chat_template,
            kv_events: extra.kv_events,
        });
        tokio::spawn(run(Arc::downgrade(&sim), Arc::clone(&sim.wake)));
        sim
    }

    /// The `--tokenizer`, if one was loaded.
    #[must_use]
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// A chat body through the `--chat-template` (then the tokenizer,
    /// without special tokens): its text and token ids, each of `media`
    /// (the body's media parts, in order) standing for `--mm-tokens`
    /// placeholder tokens where the template rendered its marker; `None`
    /// without a template.
    ///
    /// # Errors
    /// When the template or the tokenizer fails.
    pub fn render_chat(
        &self,
        body: &serde_json::Value,
        media: &[(&'static str, String)],
    ) -> Result<Option<RenderedChat>, String> {
        let (Some(template), Some(tokenizer)) = (&self.chat_template, &self.tokenizer) else {
            return Ok(None);
        };
        let text = template.render(body, self.cfg.mm_tokens > 0)?;
        let encode = |t: &str| crate::tokens::encode_with(tokenizer, t, false);
        let pieces = split_at_markers(&text);
        let placed = self.cfg.mm_tokens > 0
            && !media.is_empty()
            && pieces.len() == media.len() + 1
            && pieces[1..]
                .iter()
                .zip(media)
                .all(|((_, after), (modality, _))| *after == Some(*modality));
        if !placed {
            let token_ids = encode(&text)?;
            return Ok(Some(RenderedChat {
                text,
                token_ids,
                media: Vec::new(),
            }));
        }
        let mut token_ids = Vec::new();
        let mut places = Vec::with_capacity(media.len());
        for (i, (piece, _)) in pieces.iter().enumerate() {
            if let Some((modality, hash)) = i.checked_sub(1).and_then(|m| media.get(m)) {
                places.push(MediaPlace {
                    modality,
                    hash: hash.clone(),
                    offset: u32::try_from(token_ids.len()).unwrap_or(u32::MAX),
                    length: self.cfg.mm_tokens,
                });
                token_ids.extend(std::iter::repeat_n(0, self.cfg.mm_tokens as usize));
            }
            token_ids.extend(encode(piece)?);
        }
        Ok(Some(RenderedChat {
            text,
            token_ids,
            media: places,
        }))
    }

    /// `text`'s token ids with the `--tokenizer` (special tokens added);
    /// `None` without one.
    ///
    /// # Errors
    /// When the tokenizer fails on the text.
    pub fn tokenize(&self, text: &str) -> Result<Option<Vec<u32>>, String> {
        self.tokenizer
            .as_ref()
            .map(|t| crate::tokens::encode(t, text))
            .transpose()
    }

    /// Hands the cache changes noted in `core` (one step's) to the
    /// publisher; nothing to publish publishes nothing. Called under the
    /// engine lock, so batches queue in the order they happened; the queue
    /// never waits: when full the batch is dropped (and counted).
    fn publish(&self, core: &mut Core) {
        let Some(sink) = &self.kv_events else { return };
        let events = core.take_kv_events();
        if events.is_empty() {
            return;
        }
        if let Err(NotQueued::Full) = sink.send(unix_now(), events) {
            core.stats.kv_events_dropped += 1;
            let dropped = core.stats.kv_events_dropped;
            if dropped.is_power_of_two() {
                eprintln!("epp-sim: kv events queue full: {dropped} batches dropped so far");
            }
        }
    }

    /// vLLM's `reset_prefix_cache`: drops every cached block and publishes
    /// `AllBlocksCleared`, unless a request holds blocks (then nothing
    /// changes and false is returned, as in vLLM).
    pub fn reset_prefix_cache(&self) -> bool {
        let mut core = self.core.lock();
        let done = core.reset_prefix_cache();
        self.publish(&mut core);
        done
    }

    /// Runs `f` on the engine state under its lock (metrics, admin, tests).
    pub fn with_core<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        f(&mut self.core.lock())
    }

    /// Whether `name` is served now: the base model, a served name, or an
    /// adapter (adapters change at runtime through `/v1/load_lora_adapter`,
    /// so the engine's settings are asked, not the ones at start).
    #[must_use]
    pub fn serves(&self, name: &str) -> bool {
        self.with_core(|c| c.cfg().serves(name))
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
        let (tx, rx) = mpsc::unbounded_channel();
        let prompt_tokens = req.prompt_tokens;
        self.core.lock().add(Instant::now(), req, tx);
        self.wake.notify_one();
        Ok(Generation { rx, prompt_tokens })
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
            let mut core = sim.core.lock();
            let step = core.schedule(start);
            // A step's changes go out once it is done; an idle pass
            // changes nothing but is drained all the same.
            if step.is_none() {
                sim.publish(&mut core);
            }
            step
        };
        match step {
            Some(step) => {
                let end = start + step.duration;
                tokio::time::sleep_until(end).await;
                let Some(sim) = sim.upgrade() else { return };
                let mut core = sim.core.lock();
                core.complete(end);
                sim.publish(&mut core);
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

/// `text` cut at each media marker (`<image>`, `<audio>`, `<video>`): the
/// pieces between them, each with the modality of the marker before it
/// (`None` for the first).
fn split_at_markers(text: &str) -> Vec<(&str, Option<&'static str>)> {
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut before = None;
    loop {
        let next = crate::chat_template::MEDIA_MARKERS
            .iter()
            .filter_map(|(m, modality)| rest.find(m).map(|at| (at, *m, *modality)))
            .min_by_key(|(at, ..)| *at);
        match next {
            Some((at, marker, modality)) => {
                pieces.push((&rest[..at], before));
                before = Some(modality);
                rest = &rest[at + marker.len()..];
            }
            None => {
                pieces.push((rest, before));
                return pieces;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_cut_at_each_media_marker_in_order() {
        assert_eq!(
            split_at_markers("a<image>b<audio><image>c"),
            [
                ("a", None),
                ("b", Some("image")),
                ("", Some("audio")),
                ("c", Some("image"))
            ]
        );
        assert_eq!(split_at_markers("plain"), [("plain", None)]);
    }
}
