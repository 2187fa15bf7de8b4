//! The requests this picker has in flight at one endpoint for each LoRA
//! adapter, and how long the endpoint takes per output token: enough to
//! tell when an adapter holding one of the endpoint's adapter places will
//! have no request left there, and so when a request whose adapter cannot
//! load yet will start ([`AdapterInflight::release_ms`]).
//!
//! An engine (vLLM, and our simulator) loads a request's adapter only into
//! a free place, and a place frees only when the adapter in it has no
//! request running. Until then the request waits, however idle the batch:
//! in the routing benchmark's LoRA mix such waits were 300–1,000 ms where
//! loading an adapter takes 50, and they were the one kind of request the
//! latency model could not predict (median error 0.55–0.62 against ~0.16
//! for the rest), because no scrape says how long the adapters holding the
//! places have left. Their requests' lengths and ages say it: the picker
//! sent them.
//!
//! Only requests that name an adapter at an endpoint serving adapters are
//! registered ([`crate::Dispatch`] does it), under one lock per endpoint that
//! the request path takes at dispatch, first token and completion, and a
//! cycle only for a candidate where the request's adapter was not running
//! at the last scrape. The register holds no strings: adapters are kept by
//! hash.

use std::{
    hash::{BuildHasher, BuildHasherDefault, DefaultHasher},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

/// The weight of a new observation in the per-token and output-length
/// averages.
const EWMA: f64 = 0.1;

/// At most this many adapters holding places are considered (`max_loras`
/// above it is not known to be deployed).
const MAX_HOLDERS: usize = 16;

/// A request of one adapter in flight at the endpoint.
#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    adapter: u64,
    started: Instant,
    /// Whether it asked for a streamed response.
    streamed: bool,
    /// When its first token came, if it is streamed and it has.
    first_token: Option<Instant>,
    /// The output tokens it asked for; 0 when it did not say.
    tokens: u64,
}

/// The register of one endpoint. See the module docs.
#[derive(Debug, Default)]
pub struct AdapterInflight {
    entries: Mutex<Vec<Entry>>,
    next_id: AtomicU64,
    /// Milliseconds per output token after the first, as an average over
    /// the endpoint's completed adapter requests (`f64` bits; 0 until one
    /// completed): from the first token to the last when the response was
    /// streamed, else from dispatch to completion (which also counts the
    /// time to the first token, so it overstates).
    ms_per_token: AtomicU64,
    /// Output tokens of those requests, averaged the same way: the length
    /// assumed for a request that did not state its `max_tokens`.
    mean_tokens: AtomicU64,
}

/// One registered request: given back to [`AdapterInflight::finish`] or
/// [`AdapterInflight::forget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterTicket(u64);

fn hash(adapter: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(adapter)
}

fn load(a: &AtomicU64) -> f64 {
    f64::from_bits(a.load(Ordering::Relaxed))
}

fn blend(a: &AtomicU64, value: f64) {
    let old = load(a);
    let new = if old > 0.0 {
        old + EWMA * (value - old)
    } else {
        value
    };
    a.store(new.to_bits(), Ordering::Relaxed);
}

impl AdapterInflight {
    /// Registers a request for `adapter` that asked for `max_tokens` output
    /// tokens, and for a streamed response or not, sent now.
    pub fn start(&self, adapter: &str, max_tokens: Option<u64>, streamed: bool) -> AdapterTicket {
        self.start_at(adapter, max_tokens, streamed, Instant::now())
    }

    fn start_at(
        &self,
        adapter: &str,
        max_tokens: Option<u64>,
        streamed: bool,
        started: Instant,
    ) -> AdapterTicket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            id,
            adapter: hash(adapter),
            started,
            streamed,
            first_token: None,
            tokens: max_tokens.unwrap_or(0),
        };
        self.lock().push(entry);
        AdapterTicket(id)
    }

    /// The request's first token came (its response is streamed).
    pub fn first_token(&self, ticket: AdapterTicket) {
        self.first_token_at(ticket, Instant::now());
    }

    fn first_token_at(&self, ticket: AdapterTicket, at: Instant) {
        if let Some(e) = self.lock().iter_mut().find(|e| e.id == ticket.0) {
            e.first_token.get_or_insert(at);
        }
    }

    /// The request is done, having produced `output_tokens` (when the
    /// response said): learns the endpoint's time per output token from it.
    pub fn finish(&self, ticket: AdapterTicket, output_tokens: Option<u64>) {
        self.finish_at(ticket, output_tokens, Instant::now());
    }

    fn finish_at(&self, ticket: AdapterTicket, output_tokens: Option<u64>, now: Instant) {
        let Some(entry) = self.take(ticket) else {
            return;
        };
        let Some(tokens) = output_tokens.filter(|t| *t > 0) else {
            return;
        };
        let per_token = match entry.first_token {
            Some(first) if tokens > 1 => {
                now.saturating_duration_since(first).as_secs_f64() / (tokens - 1) as f64
            }
            Some(_) => return,
            None => now.saturating_duration_since(entry.started).as_secs_f64() / tokens as f64,
        } * 1e3;
        if per_token.is_finite() {
            blend(&self.ms_per_token, per_token);
            blend(&self.mean_tokens, tokens as f64);
        }
    }

    /// The request left without an answer to learn from (aborted, or moved
    /// to another endpoint).
    pub fn forget(&self, ticket: AdapterTicket) {
        self.take(ticket);
    }

    fn take(&self, ticket: AdapterTicket) -> Option<Entry> {
        let mut entries = self.lock();
        let i = entries.iter().position(|e| e.id == ticket.0)?;
        Some(entries.swap_remove(i))
    }

    /// Whether a request for `adapter` is running here: one of ours has
    /// streamed its first token and not ended, so the adapter holds a
    /// place now, whatever the last scrape said.
    #[must_use]
    pub fn is_running(&self, adapter: &str) -> bool {
        let key = hash(adapter);
        self.lock()
            .iter()
            .any(|e| e.adapter == key && e.first_token.is_some())
    }

    /// Requests registered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long until a place frees for a request whose adapter cannot
    /// load, in milliseconds from `now`: `holders` are the adapters
    /// holding the places (running at the last scrape), `ahead` the other
    /// adapters already waiting for one, which take the first places that
    /// free.
    ///
    /// ```text
    /// left(r)      = max(0, (tokens(r) − 1) · ms_per_token − since_first(r))
    ///                  once a streamed request's first token came
    ///                tokens(r) · ms_per_token
    ///                  for a streamed request before it
    ///                max(0, tokens(r) · ms_per_token − age(r))
    ///                  for a request not streamed (its time per token
    ///                  counts the wait for the first, as its age does)
    /// free(a)      = max over a's requests here of left(r)  (0: none here)
    /// release_ms   = the (ahead + 1)-th smallest free(a) over the holders
    ///                (the largest when fewer)
    /// ```
    ///
    /// `tokens(r)` is the request's `max_tokens`, or the endpoint's mean
    /// output when it stated none. `None` before any adapter request
    /// completed here (no time per token known) or with no holder.
    #[must_use]
    pub fn release_ms(&self, holders: &[String], ahead: usize, now: Instant) -> Option<f64> {
        let per_token = load(&self.ms_per_token);
        if per_token <= 0.0 || holders.is_empty() {
            return None;
        }
        let mean_tokens = load(&self.mean_tokens);
        let mut free = [0.0_f64; MAX_HOLDERS];
        let n = holders.len().min(MAX_HOLDERS);
        let mut keys = [0_u64; MAX_HOLDERS];
        for (k, h) in keys.iter_mut().zip(holders) {
            *k = hash(h);
        }
        for e in self.lock().iter() {
            let Some(slot) = keys[..n].iter().position(|k| *k == e.adapter) else {
                continue;
            };
            let tokens = if e.tokens > 0 {
                e.tokens as f64
            } else {
                mean_tokens
            };
            let left = match (e.first_token, e.streamed) {
                (Some(first), _) => {
                    let since = now.saturating_duration_since(first).as_secs_f64() * 1e3;
                    ((tokens - 1.0).max(0.0) * per_token - since).max(0.0)
                }
                (None, true) => tokens * per_token,
                (None, false) => {
                    let age = now.saturating_duration_since(e.started).as_secs_f64() * 1e3;
                    (tokens * per_token - age).max(0.0)
                }
            };
            free[slot] = free[slot].max(left);
        }
        let free = &mut free[..n];
        free.sort_unstable_by(f64::total_cmp);
        Some(free[ahead.min(n - 1)])
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Learns `ms` milliseconds for `tokens` output tokens.
    fn learn(r: &AdapterInflight, ms: u64, tokens: u64) {
        let now = Instant::now();
        let t = r.start_at("x", Some(tokens), false, now - Duration::from_millis(ms));
        r.finish_at(t, Some(tokens), now);
    }

    #[test]
    fn nothing_is_known_before_a_request_completed() {
        let r = AdapterInflight::default();
        r.start("a", Some(10), true);
        assert_eq!(r.release_ms(&names(&["a"]), 0, Instant::now()), None);
        assert_eq!(r.release_ms(&[], 0, Instant::now()), None);
    }

    /// The formula in the docs, on a known time per token.
    #[test]
    fn the_place_frees_when_the_holders_longest_request_ends() {
        let r = AdapterInflight::default();
        // 100 ms for 10 tokens, not streamed: 10 ms per token.
        learn(&r, 100, 10);
        assert!(r.is_empty());
        let t0 = Instant::now();
        let streaming = |adapter: &str, tokens: u64| {
            let t = r.start(adapter, Some(tokens), true);
            r.first_token_at(t, t0);
        };
        streaming("a", 31); // 300 ms left at t0
        streaming("a", 51); // 500 ms: "a" frees in 500
        streaming("b", 21); // "b" frees in 200
        // Streamed, not begun, no max_tokens: the mean, 10 tokens.
        r.start("c", None, true);
        // Not streamed: its age counts as progress.
        r.start_at("d", Some(30), false, t0);
        let holders = names(&["a", "b"]);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let near = |got: Option<f64>, want: f64| {
            let got = got.unwrap();
            assert!((got - want).abs() < 2.0, "{got} against {want}");
        };
        near(r.release_ms(&holders, 0, at(0)), 200.0);
        near(r.release_ms(&holders, 1, at(0)), 500.0);
        // More waiting ahead than places: the last place to free.
        near(r.release_ms(&holders, 5, at(0)), 500.0);
        // Later, the requests have produced more.
        near(r.release_ms(&holders, 0, at(150)), 50.0);
        near(r.release_ms(&holders, 0, at(400)), 0.0);
        near(r.release_ms(&holders, 1, at(400)), 100.0);
        // A holder with nothing of ours in flight frees at once.
        near(r.release_ms(&names(&["a", "z"]), 0, at(0)), 0.0);
        // A streamed request not begun has all its tokens ahead, whenever.
        near(r.release_ms(&names(&["c"]), 0, at(0)), 100.0);
        near(r.release_ms(&names(&["c"]), 0, at(400)), 100.0);
        near(r.release_ms(&names(&["d"]), 0, at(0)), 300.0);
        near(r.release_ms(&names(&["d"]), 0, at(250)), 50.0);
        // Running: a streamed first token, not a request merely sent.
        assert!(r.is_running("a") && r.is_running("b"));
        assert!(!r.is_running("c") && !r.is_running("z"));
    }

    #[test]
    fn the_time_per_token_follows_the_endpoint() {
        let r = AdapterInflight::default();
        learn(&r, 100, 10);
        for _ in 0..60 {
            learn(&r, 200, 10);
        }
        let t0 = Instant::now();
        r.start("a", Some(10), true);
        let got = r.release_ms(&names(&["a"]), 0, t0).unwrap();
        assert!((got - 200.0).abs() < 5.0, "{got}");
        // Streamed: the time from the first token to the last, per token
        // after the first (2 s for 9 tokens here), not the wait before it.
        let r = AdapterInflight::default();
        let now = Instant::now();
        let t = r.start_at("a", Some(10), true, now - Duration::from_secs(5));
        r.first_token_at(t, now - Duration::from_secs(2));
        r.finish_at(t, Some(10), now);
        r.start("a", Some(10), true);
        let got = r.release_ms(&names(&["a"]), 0, Instant::now()).unwrap();
        assert!((got - 10.0 * 2_000.0 / 9.0).abs() < 20.0, "{got}");
        // Aborted or moved: forgotten, nothing learned.
        let t = r.start("b", Some(10), true);
        r.forget(t);
        assert_eq!(r.len(), 1);
    }
}
