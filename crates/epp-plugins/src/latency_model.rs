//! An online model of one latency of one model server (time to first token,
//! or time per output token), learned from what the picker observes.
//!
//! The model is linear in a fixed set of [`Features`] read at dispatch:
//!
//! ```text
//! predicted = θ · [1, waiting, dispatched, running, unanswered_uncached/1000, uncached/1000,
//!                  cached/1000, running · uncached/1000, adapter_cold, slot_wait,
//!                  adapter_blocked, kv_wait², busy]
//! ```
//!
//! `waiting` and `dispatched` (requests epp sent since the last scrape) stand
//! for the queue a request waits behind, and `unanswered_uncached/1000`
//! (thousands of uncached prompt tokens of the requests epp sent there that
//! have had no response bytes yet, counted now) for the prefill still to
//! come there, as it is when the request arrives: the scrape's queue is up
//! to an interval old and shows a prompt being computed as running. A
//! request arriving while another's long prompt is computed waits for that
//! step: in the routing benchmark's many-tenants a cached prompt with no
//! wait for KV room took a median 42 ms with nothing unanswered there,
//! 87–130 ms with one request unanswered and 818–912 with two or more (two
//! runs), and the runs' errors were 0.22–0.28 without such an input. It
//! counts the unanswered requests' prefill in tokens, not the requests: an
//! engine prefills the prompts waiting for one step together, so a short
//! prompt queued behind another short one waits for its few tokens, not
//! for a step of its own. As a count (each unanswered request priced at a
//! queued request's wait, 23 ms at short-prompts 120, where joining a
//! 288-token prompt's step adds 6 ms), the input steered arrivals away from
//! a server with a prompt about to be computed, to one that would start a
//! step of its own for them (likely more prefill steps, each with its fixed
//! cost, on every engine). At short-prompts 120, where a server is near its
//! capacity, ranking by the model alone (`latency-scorer`,
//! `delayToOthersWeight: 0`) gave TTFT p50 80–85 ms with the count, 65
//! without the input and 69–72 with the tokens (three runs each; the
//! shortest queue 66, vllm-router 71). The count's gain on the error, replayed
//! over five workloads' logged samples (many-tenants 0.221 and 0.277 to
//! 0.201 and 0.238, mixed-speeds 0.155 to 0.137, lora-mix 0.224 to 0.193),
//! came from long prompts, which the tokens price in full: with them the
//! five workloads' errors were 0.07–0.14 in one sweep. It took the place
//! of the KV utilisation, whose coefficient the fit left at 0 on every
//! endpoint of many-tenants and shared-prefix, at 0–27 ms for a full cache
//! on mixed-speeds and no-sharing, and at 46 and 209 ms on two of lora-mix's
//! four endpoints, where the replay without it did better still: a full
//! cache shows in the wait for room ([`Features::kv_wait`]) rather than in a
//! linear term.
//! `slot_wait` stands for the requests that must leave a full running batch
//! before it gets a place in it
//! ([`Features::slot_wait`]: the wait for a slot is what makes an engine's
//! latency bend upwards at its batch limit, which no sum of the counts
//! alone follows — in the routing benchmark a cached prompt took 45 ms with
//! up to seven running and 118, 190, 262 and 361 ms with eight running and
//! 0, 1, 2 and 3 more queued; the same for room in a full KV cache: with
//! six 6,000-token prompts running in a 32,768-token cache, a seventh, hit
//! or miss, took 470–970 ms with slots to spare), `uncached/1000` for the prefill it
//! needs (thousands of prompt tokens the endpoint's prefix cache is not
//! expected to hold), `running · uncached/1000` for a prefill slowed by the
//! batch it shares the engine with, `cached/1000` for reading a cached prefix,
//! `adapter_cold` (1 when the request's LoRA adapter is not active there)
//! for loading it, `adapter_blocked` (when it cannot load yet — it is
//! already waiting there, or every place for an adapter is held by one with
//! running requests; else 0) for the wait until one of those adapters has
//! none left — in the routing benchmark's LoRA mix a wait of hundreds of
//! milliseconds where a load takes 50; one input for both priced neither
//! right. Its value is that wait as the picker's own requests in flight
//! there tell it, in hundreds of milliseconds
//! ([`epp_core::DispatchLoad::adapter_release_ms`]: when the holders'
//! longest requests end, at the endpoint's time per output token), or,
//! before that time is known, the requests at the endpoint (at least 1).
//! As a 0/1 input, the blocked samples' misfit went to the running-request
//! input, and a warm adapter's request was predicted 40–90 % slower with
//! three or four running than with one, where it took about the same; as
//! the requests there, the blocked samples (12–18 % of the LoRA mix's) were
//! still predicted at about half their wait (median error 0.50–0.62 per
//! run), since it depends on how long the holders' requests have left,
//! which no count shows; with the wait as input, 0.37–0.47. The wait is not
//! work others wait through (the engine runs other requests meanwhile), so
//! it is not in [`OWN_WORK`]. `kv_wait²` (the running requests the prompt
//! waits behind for room in the KV cache, squared) lets the wait for room
//! grow faster than the number of requests it waits for, as the samples
//! show (likely because each request that finishes frees only its own
//! blocks, while more requests queue behind the same room). Fitted offline
//! on the many-tenants run's samples, the linear model's error on the later
//! half fell from 0.31 to 0.27 with it; online, four runs' errors were
//! 0.23–0.26 (median 0.24) against 0.26–0.27.
//! `busy` (1 when anything runs there: `running + dispatched > 0`) is the
//! engine step a request arriving at a busy engine waits out, which a
//! linear count cannot give without over-pricing every further request: in
//! the LoRA mix a cold adapter's request took 75 ms with none running and
//! 106 with one, while a warm adapter's (which always has its own requests
//! running) took 58–66 ms with one to five; with the count alone the model
//! predicted those warm requests at 56 → 93 ms, and the run's error was
//! 0.21–0.28; with `busy`, 65–75 and 0.18–0.22.
//!
//! θ is fitted by exponentially weighted least squares (factor λ, so samples
//! older than about `1 / (1 − λ)` fade and the model follows a server whose
//! speed changes) with every coefficient kept ≥ 0: each input can only add
//! latency, as it does on an engine. Unbounded, the fit finds combinations
//! that match the samples seen and nothing else: early in a run, when misses
//! met idle servers and hits busy ones, it fitted −566 ms per running request
//! against +115 per thousand cached tokens, and predicted a hit on any busy
//! server at 0 ms and one on an idle server as slow as a miss. The fit keeps
//! the weighted sums `Σ x xᵀ` and `Σ x y` (information form) and solves for θ
//! by coordinate descent from the previous θ, in O(10²) per sweep, a few sweeps
//! per sample, without allocating; a weak pull towards the prior θ (the
//! fleet's, for an endpoint) holds the directions the samples do not excite. A
//! residual far beyond the model's recent error is clamped (one stalled
//! request does not drag θ), and a sample with a non-finite value is ignored.
//! Predictions read the published θ without locking.
//!
//! A model that has seen fewer than its minimum samples predicts nothing:
//! the caller falls back (to the fleet's model, then to heuristics). A new
//! endpoint's model starts from the fleet's θ ([`LatencyModel::with_prior`]).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Number of model inputs (bias included).
pub const FEATURES: usize = 13;

/// The inputs of the request's own work: the engine time it takes that
/// others at the endpoint wait through — its prompt's prefill (uncached and
/// cached tokens) and a cold adapter's load — as opposed to what the load
/// adds to its latency (queue, dispatches, running requests, KV use, the
/// batch slowing its prefill) and to the fixed cost of a request (the
/// server's front end, the wait for the engine's next step), which is
/// latency but not work others wait for: counted, it made a cache hit on an
/// endpoint with six requests running look as costly to them as a miss on
/// an idle one, and hits went to idle endpoints. The load inputs move
/// together (KV use grows with running requests), so their coefficients
/// may offset one another while their sum fits: only the idle part is read
/// alone.
const OWN_WORK: [usize; 3] = [5, 6, 8];

/// The input of the uncached tokens' prefill (thousands of tokens).
const UNCACHED_PREFILL: usize = 5;

/// The input of the prompt tokens the endpoint's cache is expected to hold.
const CACHED: usize = 6;

/// The input of the wait for a place in a full running batch.
const SLOT_WAIT: usize = 9;

/// The inputs of the request's wait in the endpoint's queue: the requests
/// waiting there at the scrape, those sent since, the prefill of those not
/// yet answered (queued, or their prompts being computed), the wait for a
/// place in a full batch (which, at the limit, is the first two plus one:
/// the fit may split the wait between them any way) and the squared wait
/// for room in the KV cache.
const QUEUE_WAIT: [usize; 5] = [1, 2, UNANSWERED, SLOT_WAIT, KV_WAIT_SQUARED];

/// The input of the uncached prompt tokens of the requests sent there that
/// have had no answer yet.
const UNANSWERED: usize = 4;

/// The input of the wait for room in the KV cache, squared.
const KV_WAIT_SQUARED: usize = 11;

/// A prediction and the parts of it that are the request's own work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictionParts {
    /// The whole prediction ([`LatencyModel::predict_unchecked`]).
    pub total: f64,
    /// The request's own work: the engine time others at the endpoint
    /// wait through (its prompt's uncached and cached tokens, a cold
    /// adapter), at most `total`.
    pub own_work: f64,
    /// Its wait in the endpoint's queue (the queue and slot-wait terms),
    /// between 0 and `total`: a request that queues there also holds up
    /// the requests that will queue behind it.
    pub queue_wait: f64,
}

/// What is known about a request and its endpoint when it is dispatched.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Features {
    /// Requests waiting in the endpoint's queue at the last scrape.
    pub waiting: f64,
    /// Requests this picker dispatched there since that scrape (net).
    pub dispatched: f64,
    /// Requests running at the last scrape.
    pub running: f64,
    /// Uncached prompt tokens of the requests this picker sent there that
    /// have had no response bytes yet
    /// ([`epp_core::DispatchLoad::unanswered_uncached_tokens`]): the prefill
    /// of those queued there, or computing their prompts, now.
    pub unanswered_uncached_tokens: f64,
    /// Prompt tokens the endpoint's prefix cache is not expected to hold.
    pub uncached_tokens: f64,
    /// Prompt tokens it is expected to hold.
    pub cached_tokens: f64,
    /// 1 when the request's LoRA adapter is not active on the endpoint.
    pub adapter_cold: f64,
    /// When that adapter cannot load yet
    /// ([`epp_core::DispatchLoad::adapter_blocked`]): the wait until a place
    /// frees, in hundreds of milliseconds
    /// ([`epp_core::DispatchLoad::adapter_release_ms`]), or, while the
    /// endpoint's time per token is not known, the requests at the
    /// endpoint ([`epp_core::DispatchLoad::requests_there`], at least 1);
    /// else 0.
    pub adapter_blocked: f64,
    /// Requests that must leave the endpoint's running batch before this
    /// one gets a place in it: the larger of the wait for a slot, when the
    /// batch's size limit is known
    /// (`max(0, running + waiting + dispatched + 1 − slots)`), and the wait
    /// for room in its KV cache, when the endpoint reports the cache's size
    /// ([`epp_core::DispatchLoad::kv_wait`]) ([`Features::at`]). Either
    /// way the request starts once that many running requests are done.
    pub slot_wait: f64,
    /// Running requests that must finish before the prompt fits in the
    /// endpoint's KV cache ([`epp_core::DispatchLoad::kv_wait`]).
    pub kv_wait: f64,
}

impl From<&epp_core::DispatchLoad> for Features {
    fn from(load: &epp_core::DispatchLoad) -> Self {
        Self {
            waiting: f64::from(load.waiting),
            dispatched: f64::from(load.dispatched),
            running: f64::from(load.running),
            unanswered_uncached_tokens: load.unanswered_uncached_tokens as f64,
            uncached_tokens: load.uncached_tokens as f64,
            cached_tokens: load.cached_tokens() as f64,
            adapter_cold: f64::from(u8::from(load.adapter_cold)),
            adapter_blocked: match (load.adapter_blocked, load.adapter_release_ms) {
                (false, _) => 0.0,
                (true, Some(ms)) => ms / 100.0,
                (true, None) => load.requests_there().max(1) as f64,
            },
            slot_wait: 0.0,
            kv_wait: 0.0,
        }
    }
}

impl Features {
    /// The inputs for `load` at an endpoint whose running batch holds at
    /// most `slots` requests (0: not known, no wait for a slot).
    #[inline]
    #[must_use]
    pub fn at(load: &epp_core::DispatchLoad, slots: u32) -> Self {
        let for_slot = Self::batch_wait(load.requests_there(), slots);
        let kv_wait = load.kv_wait();
        Self {
            slot_wait: for_slot.max(kv_wait) as f64,
            kv_wait: kv_wait as f64,
            ..Self::from(load)
        }
    }

    /// Requests that must leave a running batch of at most `slots`
    /// requests (0: not known) before a request arriving where `there`
    /// requests are gets a place in it: `max(0, there + 1 − slots)`, 0
    /// when `slots` is not known.
    #[inline]
    #[must_use]
    pub fn batch_wait(there: u64, slots: u32) -> u64 {
        if slots == 0 {
            0
        } else {
            there.saturating_add(1).saturating_sub(u64::from(slots))
        }
    }

    /// The model's input vector.
    #[inline]
    #[must_use]
    pub fn vector(&self) -> [f64; FEATURES] {
        let uncached_k = self.uncached_tokens * 1e-3;
        [
            1.0,
            self.waiting,
            self.dispatched,
            self.running,
            self.unanswered_uncached_tokens * 1e-3,
            uncached_k,
            self.cached_tokens * 1e-3,
            self.running * uncached_k,
            self.adapter_cold,
            self.slot_wait,
            self.adapter_blocked,
            self.kv_wait * self.kv_wait,
            f64::from(u8::from(self.running + self.dispatched > 0.0)),
        ]
    }

    fn is_finite(&self) -> bool {
        self.vector().iter().all(|v| v.is_finite())
    }
}

/// How a model learns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSettings {
    /// Forgetting factor λ in `(0, 1]`: 1 never forgets; 0.995 weighs the
    /// last ~200 samples.
    pub forgetting: f64,
    /// Samples before the model predicts.
    pub min_samples: u64,
    /// Variance of each coefficient's prior: how weakly θ is pulled towards
    /// its prior where samples say nothing (the pull is 1 / this).
    pub prior_variance: f64,
}

impl Default for ModelSettings {
    fn default() -> Self {
        Self {
            forgetting: 0.995,
            min_samples: 32,
            prior_variance: 1.0e4,
        }
    }
}

/// Coordinate-descent sweeps per fit at most: each starts from the previous
/// θ, which one new sample moves little, so a few sweeps converge.
const SWEEPS: usize = 30;

/// The fitting state (behind the model's lock): exponentially weighted least
/// squares in information form, with every coefficient kept non-negative.
#[derive(Debug, Clone)]
struct Fit {
    theta: [f64; FEATURES],
    /// Σ λ^age · x xᵀ of the samples (symmetric).
    info: [[f64; FEATURES]; FEATURES],
    /// Σ λ^age · x y.
    moment: [f64; FEATURES],
    /// θ before any sample (the fleet's, for an endpoint's model), and how
    /// firmly it holds where samples say nothing: 1 / the prior variance.
    prior: [f64; FEATURES],
    prior_precision: f64,
    /// Mean absolute residual, recent samples weighted more (for clamping
    /// outliers and for reporting).
    mean_abs_error: f64,
}

impl Fit {
    /// `theta` within the bounds ([`LatencyModel::with_prior`] clamps it).
    fn new(theta: [f64; FEATURES], variance: f64) -> Self {
        Self {
            theta,
            info: [[0.0; FEATURES]; FEATURES],
            moment: [0.0; FEATURES],
            prior: theta,
            prior_precision: 1.0 / variance,
            mean_abs_error: 0.0,
        }
    }

    fn predict(&self, x: &[f64; FEATURES]) -> f64 {
        dot(&self.theta, x)
    }

    /// Learns one sample with forgetting `lambda`; `free` while the model
    /// is new (no residual clamp).
    fn update(&mut self, x: &[f64; FEATURES], y: f64, lambda: f64, free: bool) {
        let mut error = y - self.predict(x);
        // Clamp a residual far beyond the recent error (after a warm-up, so
        // the first samples can move θ freely from its prior).
        if !free {
            let limit = 4.0 * self.mean_abs_error.max(1e-9) + 1e-3 * y.abs();
            error = error.clamp(-limit, limit);
        }
        let y = self.predict(x) + error;
        for i in 0..FEATURES {
            for j in 0..FEATURES {
                self.info[i][j] = lambda * self.info[i][j] + x[i] * x[j];
            }
            self.moment[i] = lambda * self.moment[i] + x[i] * y;
        }
        self.solve();
        let a = error.abs();
        self.mean_abs_error = if free && self.mean_abs_error == 0.0 {
            a
        } else {
            0.95 * self.mean_abs_error + 0.05 * a
        };
    }

    /// θ minimising the weighted squared error plus the prior's pull,
    /// `‖θ − prior‖² / variance`, with every coefficient ≥ 0: cyclic
    /// coordinate descent, each coordinate set to its exact minimiser
    /// clipped at 0, from the current θ. A direction the samples do not
    /// excite (a feature that never varies, or two that always move
    /// together) has nearly no curvature, so θ stays where it was along it
    /// instead of drifting.
    fn solve(&mut self) {
        let k = self.prior_precision;
        for _ in 0..SWEEPS {
            let mut moved = 0.0f64;
            for i in 0..FEATURES {
                let curvature = self.info[i][i] + k;
                // The gradient along i without θ_i's own term.
                let rest: f64 = (0..FEATURES)
                    .filter(|&j| j != i)
                    .map(|j| self.info[i][j] * self.theta[j])
                    .sum();
                let next = ((self.moment[i] + k * self.prior[i] - rest) / curvature).max(0.0);
                if next.is_finite() {
                    moved = moved.max((next - self.theta[i]).abs());
                    self.theta[i] = next;
                }
            }
            if moved < 1e-9 {
                break;
            }
        }
    }
}

fn dot(a: &[f64; FEATURES], b: &[f64; FEATURES]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One latency of one endpoint (or of the fleet): fitted on the response
/// path, read lock-free on the scheduling path.
///
/// Laid out for the scheduling path, which reads one model per candidate
/// every cycle and finds it cold (a cycle's prefix matching evicts it from
/// the caches): what a prediction reads comes first, in two cache lines;
/// the fitting state (1.5 KB) is boxed, behind its lock.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct LatencyModel {
    /// Guards `published` (odd while a writer is publishing).
    version: AtomicU64,
    samples: AtomicU64,
    /// θ as published for readers (f64 bits).
    published: [AtomicU64; FEATURES],
    settings: ModelSettings,
    mean_abs_error: AtomicU64,
    fit: Mutex<Box<(Fit, u64)>>,
}

impl LatencyModel {
    /// A model with no samples and θ = 0.
    #[must_use]
    pub fn new(settings: ModelSettings) -> Self {
        Self::with_prior(settings, [0.0; FEATURES])
    }

    /// A model starting from `theta` (e.g. the fleet's current
    /// coefficients, [`Self::coefficients`]; a negative or non-finite one
    /// starts at 0, as every coefficient stays ≥ 0); it still needs its
    /// own minimum samples before [`Self::predict`] answers.
    #[must_use]
    pub fn with_prior(settings: ModelSettings, theta: [f64; FEATURES]) -> Self {
        let settings = ModelSettings {
            forgetting: if settings.forgetting > 0.0 && settings.forgetting <= 1.0 {
                settings.forgetting
            } else {
                ModelSettings::default().forgetting
            },
            prior_variance: if settings.prior_variance.is_finite() && settings.prior_variance > 0.0
            {
                settings.prior_variance
            } else {
                ModelSettings::default().prior_variance
            },
            ..settings
        };
        let theta = theta.map(|t| if t.is_finite() { t.max(0.0) } else { 0.0 });
        Self {
            fit: Mutex::new(Box::new((Fit::new(theta, settings.prior_variance), 0))),
            published: theta.map(|t| AtomicU64::new(t.to_bits())),
            version: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            mean_abs_error: AtomicU64::new(0f64.to_bits()),
            settings,
        }
    }

    /// Learns from one request: its features at dispatch and the latency
    /// observed (any unit, the same for every sample). Non-finite or
    /// negative observations are ignored.
    pub fn observe(&self, features: &Features, observed: f64) {
        if !observed.is_finite() || observed < 0.0 || !features.is_finite() {
            return;
        }
        let x = features.vector();
        let mut fit = self.fit.lock();
        let (state, samples) = &mut **fit;
        state.update(
            &x,
            observed,
            self.settings.forgetting,
            // Until it predicts on its own, a model learns every sample in
            // full: it is expected to differ from its prior.
            *samples < self.settings.min_samples.max(2 * FEATURES as u64),
        );
        *samples += 1;
        // Publish θ: readers that see an odd or changed version retry.
        self.version.fetch_add(1, Ordering::AcqRel);
        for (slot, t) in self.published.iter().zip(state.theta) {
            slot.store(t.to_bits(), Ordering::Release);
        }
        self.version.fetch_add(1, Ordering::Release);
        self.samples.store(*samples, Ordering::Release);
        self.mean_abs_error
            .store(state.mean_abs_error.to_bits(), Ordering::Release);
    }

    /// The published coefficients θ.
    #[inline]
    #[must_use]
    pub fn coefficients(&self) -> [f64; FEATURES] {
        loop {
            let before = self.version.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let theta =
                std::array::from_fn(|i| f64::from_bits(self.published[i].load(Ordering::Acquire)));
            if self.version.load(Ordering::Acquire) == before {
                return theta;
            }
        }
    }

    /// The predicted latency for `features` (never negative), or `None`
    /// while the model has fewer than its minimum samples.
    #[must_use]
    pub fn predict(&self, features: &Features) -> Option<f64> {
        if !self.is_warm() {
            return None;
        }
        self.predict_unchecked(features)
    }

    /// [`Self::predict`] without the sample check (for a model started from
    /// a prior the caller trusts). `None` for non-finite features.
    #[must_use]
    pub fn predict_unchecked(&self, features: &Features) -> Option<f64> {
        self.predict_parts(features).map(|p| p.total)
    }

    /// The coefficients predictions use: θ, with a cached prompt token
    /// costing at most what an uncached one does. The fit can say
    /// otherwise when the prefix matches it is given are often wrong (an
    /// approximate index under cache pressure) and the endpoints they point
    /// to are busier in ways the load inputs miss; a prediction that a
    /// cached token is slower would then steer requests away from their
    /// cached prompts and copy them elsewhere, evicting others.
    #[inline]
    fn predicting(&self) -> [f64; FEATURES] {
        let mut theta = self.coefficients();
        theta[CACHED] = theta[CACHED].min(theta[UNCACHED_PREFILL]);
        theta
    }

    /// [`Self::predict_unchecked`] with the part of it that is the
    /// request's own work ([`PredictionParts`]); neither is negative, and
    /// the part does not exceed the whole.
    #[inline(always)]
    #[must_use]
    pub fn predict_parts(&self, features: &Features) -> Option<PredictionParts> {
        let x = features.vector();
        // No separate check of `x`: with every coefficient finite and ≥ 0,
        // a non-finite input makes the total NaN or infinite (0 · ∞ is
        // NaN), which the check below refuses.
        let theta = self.predicting();
        let total = dot(&theta, &x);
        let own: f64 = OWN_WORK.iter().map(|&i| theta[i] * x[i]).sum();
        let queue_wait: f64 = QUEUE_WAIT.iter().map(|&i| theta[i] * x[i]).sum();
        if !(total.is_finite() && own.is_finite() && queue_wait.is_finite()) {
            return None;
        }
        let total = total.max(0.0);
        Some(PredictionParts {
            total,
            own_work: own.clamp(0.0, total),
            queue_wait: queue_wait.clamp(0.0, total),
        })
    }

    /// What `requests` more requests to wait for before a place in the
    /// batch frees cost a request's time to first token: θ_slot ·
    /// `requests` ([`Features::slot_wait`]), never negative; 0 for a
    /// non-finite count.
    #[inline]
    #[must_use]
    pub fn slot_wait_ms(&self, requests: f64) -> f64 {
        let added = self.predicting()[SLOT_WAIT] * requests;
        if added.is_finite() {
            added.max(0.0)
        } else {
            0.0
        }
    }

    /// The sum of the predictions for several inputs, from the sum of their
    /// vectors ([`Features::vector`]; the model is linear), unclamped: what
    /// the model predicts for samples it has not learned, to compare with
    /// what they took.
    #[must_use]
    pub fn predict_sum(&self, vectors: &[f64; FEATURES]) -> f64 {
        dot(&self.predicting(), vectors)
    }

    /// What a thousand prompt tokens cost uncached rather than cached: the
    /// prefill a cache hit saves (θ_uncached − θ_cached as predictions use
    /// them), never negative. Unlike θ_uncached alone this is known when
    /// every prompt has one length: the fit may then split a prompt's time
    /// between the fixed cost and the prompt terms either way (their inputs
    /// move together: cached + uncached is constant), but hits and misses
    /// still tell the difference apart. Where no prompt ever hits, θ_cached
    /// stays at its prior and this is θ_uncached.
    #[must_use]
    pub fn prefill_a_hit_saves_per_1k(&self) -> f64 {
        let theta = self.predicting();
        let saved = theta[UNCACHED_PREFILL] - theta[CACHED];
        if saved.is_finite() {
            saved.max(0.0)
        } else {
            0.0
        }
    }

    /// Whether it has seen its minimum samples.
    #[must_use]
    pub fn is_warm(&self) -> bool {
        self.samples() >= self.settings.min_samples
    }

    /// Samples learned from.
    #[must_use]
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Acquire)
    }

    /// Recent mean absolute residual (the unit of the observations).
    #[must_use]
    pub fn mean_abs_error(&self) -> f64 {
        f64::from_bits(self.mean_abs_error.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::*;

    /// A server whose TTFT (ms) is 20 + 30·waiting + 25·dispatched +
    /// 40 per request not yet answered + 80 per thousand uncached tokens +
    /// 4 per thousand uncached tokens per running request + 150 for a cold
    /// adapter, 100 more per 100 ms until a place frees when it cannot load
    /// yet + 60 per request ahead of it for a place in the batch + 15 per
    /// square of the running requests it waits for room behind + 20 when
    /// anything runs, with ±5 % noise.
    const TRUE: [f64; FEATURES] = [
        20.0, 30.0, 25.0, 0.0, 40.0, 80.0, 0.0, 4.0, 150.0, 60.0, 100.0, 15.0, 20.0,
    ];
    const ADAPTER_BLOCKED: usize = 10;
    const RUNNING: usize = 3;
    /// 1 when anything runs there.
    const BUSY: usize = 12;

    fn random_features(rng: &mut StdRng) -> Features {
        let adapter_cold = f64::from(rng.random_range(0..4u32) == 0);
        Features {
            waiting: f64::from(rng.random_range(0..20u32)),
            dispatched: f64::from(rng.random_range(0..5u32)),
            running: f64::from(rng.random_range(0..64u32)),
            unanswered_uncached_tokens: f64::from(rng.random_range(0..12_000u32)),
            uncached_tokens: f64::from(rng.random_range(0..8000u32)),
            cached_tokens: f64::from(rng.random_range(0..8000u32)),
            adapter_cold,
            // Only a cold adapter can be blocked: half of them are, for
            // up to a second.
            adapter_blocked: adapter_cold
                * f64::from(rng.random_range(0..2u32))
                * rng.random_range(0.0..10.0),
            slot_wait: f64::from(rng.random_range(0..12u32).saturating_sub(6)),
            kv_wait: f64::from(rng.random_range(0..12u32).saturating_sub(6)),
        }
    }

    fn truth(theta: &[f64; FEATURES], f: &Features, rng: &mut StdRng) -> f64 {
        dot(theta, &f.vector()) * rng.random_range(0.95..1.05)
    }

    /// An engine whose step a request waits out once whenever anything
    /// runs (30 ms), and 5 ms per running request beyond that: `busy`
    /// takes the step, the running count only its slope.
    #[test]
    fn busy_takes_the_step_the_running_count_does_not() {
        let mut rng = StdRng::seed_from_u64(11);
        let model = LatencyModel::new(ModelSettings::default());
        let truth = |f: &Features| 50.0 + 30.0 * f.vector()[BUSY] + 5.0 * f.running;
        for _ in 0..2000 {
            let f = Features {
                running: f64::from(rng.random_range(0..4u32).min(1) * rng.random_range(1..9u32)),
                ..Features::default()
            };
            model.observe(&f, truth(&f));
        }
        let theta = model.coefficients();
        assert!((theta[BUSY] - 30.0).abs() <= 3.0, "busy: {theta:?}");
        assert!((theta[RUNNING] - 5.0).abs() <= 0.5, "running: {theta:?}");
        // A warm engine's request costs the same step with one running as
        // with eight, plus the slope alone.
        let at = |running: f64| {
            model.predict(&Features {
                running,
                ..Features::default()
            })
        };
        let (idle, one, eight) = (at(0.0).unwrap(), at(1.0).unwrap(), at(8.0).unwrap());
        assert!((one - idle - 35.0).abs() <= 3.0, "{idle} {one}");
        assert!((eight - one - 35.0).abs() <= 3.0, "{one} {eight}");
    }

    /// With eight places in the batch: a request arriving where seven
    /// are waits for none to leave, where eight are for one; the wait is
    /// priced at θ_slot per request.
    #[test]
    fn the_wait_for_a_place_starts_when_the_batch_is_full() {
        let waits: Vec<u64> = (0..=10)
            .map(|there| Features::batch_wait(there, 8))
            .collect();
        assert_eq!(waits, [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]);
        // A batch of unknown size makes no request wait for a place.
        assert_eq!(Features::batch_wait(100, 0), 0);
        // No overflow at the edge (the count saturates).
        assert_eq!(Features::batch_wait(u64::MAX, 8), u64::MAX - 8);
        let model = LatencyModel::with_prior(ModelSettings::default(), TRUE);
        assert_eq!(model.slot_wait_ms(3.0), 3.0 * TRUE[SLOT_WAIT]);
        assert_eq!(model.slot_wait_ms(f64::NAN), 0.0);
        // As the model's input: a request arriving where nine are, slots
        // to spare in the KV cache.
        let load = epp_core::DispatchLoad {
            running: 8,
            waiting: 1,
            ..epp_core::DispatchLoad::default()
        };
        assert_eq!(Features::at(&load, 8).slot_wait, 2.0);
    }

    #[test]
    fn recovers_known_coefficients() {
        let mut rng = StdRng::seed_from_u64(7);
        let model = LatencyModel::new(ModelSettings::default());
        for _ in 0..3000 {
            let f = random_features(&mut rng);
            model.observe(&f, truth(&TRUE, &f, &mut rng));
        }
        let theta = model.coefficients();
        // The slopes that matter within 10 % (the noise is multiplicative).
        for i in [1, 2, 5, 7, 8, SLOT_WAIT, ADAPTER_BLOCKED, KV_WAIT_SQUARED] {
            assert!(
                (theta[i] - TRUE[i]).abs() <= 0.1 * TRUE[i],
                "θ[{i}] = {} vs {}: {theta:?}",
                theta[i],
                TRUE[i]
            );
        }
        // Median relative error of predictions on fresh requests.
        let mut errors: Vec<f64> = (0..500)
            .map(|_| {
                let f = random_features(&mut rng);
                let want = dot(&TRUE, &f.vector());
                (model.predict(&f).unwrap() - want).abs() / want
            })
            .collect();
        errors.sort_by(f64::total_cmp);
        assert!(errors[250] < 0.05, "median relative error {}", errors[250]);
    }

    #[test]
    fn own_work_is_the_engine_time_others_wait_through() {
        let mut rng = StdRng::seed_from_u64(7);
        let model = LatencyModel::new(ModelSettings::default());
        for _ in 0..3000 {
            let f = random_features(&mut rng);
            model.observe(&f, truth(&TRUE, &f, &mut rng));
        }
        let f = Features {
            waiting: 6.0,
            running: 10.0,
            uncached_tokens: 2000.0,
            adapter_cold: 1.0,
            ..Features::default()
        };
        let parts = model.predict_parts(&f).unwrap();
        // Idle, it would take 20 + 80 · 2 + 150 = 330, of which 80 · 2 = 160
        // the uncached tokens' prefill and 150 the adapter's load are work
        // (20 is the fixed cost); loaded, 30 · 6 + 4 · 10 · 2 more: 590.
        let close = |got: f64, want: f64| (got - want).abs() / want < 0.1;
        assert!(close(parts.own_work, 310.0), "{parts:?}");
        assert!(close(parts.total, 590.0), "{parts:?}");
        assert!(close(model.prefill_a_hit_saves_per_1k(), 80.0), "{parts:?}");
    }

    #[test]
    fn the_prefill_a_hit_saves_is_known_when_every_prompt_has_one_length() {
        // Every prompt is ~5,500 tokens, a hit or a miss (as in the routing
        // benchmark's many-tenants): cached + uncached is constant, so the
        // fit can split the prompt's time between the fixed cost and the
        // prompt terms any way, and θ_uncached alone can come out near
        // 0 while the fixed cost takes its time. The difference a hit makes
        // is still fitted: 20 per thousand uncached tokens, 1 per thousand
        // cached.
        let mut rng = StdRng::seed_from_u64(13);
        let model = LatencyModel::new(ModelSettings::default());
        for _ in 0..3000 {
            let prompt = f64::from(rng.random_range(5480..5520u32));
            let cached = if rng.random_bool(0.3) {
                prompt - 16.0
            } else {
                0.0
            };
            let f = Features {
                waiting: f64::from(rng.random_range(0..6u32)),
                uncached_tokens: prompt - cached,
                cached_tokens: cached,
                ..Features::default()
            };
            let y = 10.0 + 150.0 * f.waiting + 0.020 * f.uncached_tokens + 0.001 * cached;
            model.observe(&f, y * rng.random_range(0.98..1.02));
        }
        let price = model.prefill_a_hit_saves_per_1k();
        assert!(
            (price - 19.0).abs() < 2.0,
            "{price}: {:?}",
            model.coefficients()
        );
        let mut theta = [0.0; FEATURES];
        theta[UNCACHED_PREFILL] = 20.0;
        // A cached token fitted dearer than an uncached one saves nothing.
        theta[CACHED] = 30.0;
        let model = LatencyModel::with_prior(ModelSettings::default(), theta);
        assert_eq!(model.prefill_a_hit_saves_per_1k(), 0.0);
    }

    #[test]
    fn own_work_is_read_from_the_idle_part_and_stays_within_the_prediction() {
        // 150 fixed, 20 per thousand uncached tokens, 300 per running
        // request per thousand uncached tokens (the batch term), 60 per
        // dispatch since the scrape.
        let mut theta = [0.0; FEATURES];
        theta[0] = 150.0;
        theta[2] = 60.0;
        theta[UNCACHED_PREFILL] = 20.0;
        theta[7] = 300.0;
        let model = LatencyModel::with_prior(ModelSettings::default(), theta);
        let f = Features {
            running: 1.0,
            uncached_tokens: 5500.0,
            ..Features::default()
        };
        let p = model.predict_parts(&f).unwrap();
        assert!((p.total - 1910.0).abs() < 1e-9, "{p:?}");
        // The prefill (110) is its work; neither the fixed cost nor the
        // batch term is.
        assert!((p.own_work - 110.0).abs() < 1e-9, "{p:?}");
        // Requests that completed since the scrape (dispatched < 0) lower
        // the prediction; an idle part above the whole is cut to the
        // whole: 1,910 − 60 · 31 = 50 in all.
        let f = Features {
            dispatched: -31.0,
            ..f
        };
        let p = model.predict_parts(&f).unwrap();
        assert!((p.total - 50.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.own_work, p.total, "{p:?}");
    }

    /// The first 60 samples the fleet's model learned in a shared-prefix run
    /// of the routing benchmark (16 warm-up requests with short prompts,
    /// then 16 tenants' ~5,500-token prompts at 8 req/s), as logged by
    /// `predicted-latency-producer` at debug level: waiting, dispatched,
    /// running, KV use, uncached and cached tokens, TTFT in ms.
    const EARLY_SHARED_PREFIX: [(f64, f64, f64, f64, f64, f64, f64); 60] = [
        (0.0, 0.0, 0.0, 0.0, 15.0, 0.0, 33.1),
        (0.0, 0.0, 0.0, 0.0, 61.0, 0.0, 32.9),
        (0.0, 0.0, 0.0, 0.0, 107.0, 0.0, 34.4),
        (0.0, 0.0, 0.0, 0.0, 153.0, 0.0, 35.9),
        (0.0, 0.0, 0.0, 0.0, 200.0, 0.0, 36.5),
        (0.0, -1.0, 0.0, 0.0, 246.0, 0.0, 37.4),
        (0.0, 0.0, 0.0, 0.0, 292.0, 0.0, 37.9),
        (0.0, 0.0, 0.0, 0.0, 338.0, 0.0, 39.8),
        (0.0, 0.0, 0.0, 0.0, 385.0, 0.0, 40.5),
        (0.0, 0.0, 0.0, 0.0, 431.0, 0.0, 40.4),
        (0.0, 0.0, 0.0, 0.0, 477.0, 0.0, 41.3),
        (0.0, 0.0, 0.0, 0.0, 524.0, 0.0, 42.4),
        (0.0, 0.0, 0.0, 0.0, 570.0, 0.0, 44.4),
        (0.0, 0.0, 0.0, 0.0, 616.0, 0.0, 44.3),
        (0.0, 0.0, 0.0, 0.0, 662.0, 0.0, 45.1),
        (0.0, 0.0, 0.0, 0.0, 709.0, 0.0, 45.5),
        (0.0, 0.0, 0.0, 0.0, 5560.0, 0.0, 123.2),
        (0.0, 0.0, 0.0, 0.0, 5573.0, 0.0, 123.5),
        (0.0, 0.0, 0.0, 0.0, 5536.0, 0.0, 123.2),
        (0.0, 0.0, 0.0, 0.0, 5536.0, 0.0, 122.3),
        (0.0, 0.0, 1.0, 0.1689453125, 5541.0, 0.0, 177.5),
        (0.0, 0.0, 1.0, 0.16943359375, 5550.0, 0.0, 154.8),
        (0.0, 0.0, 1.0, 0.17041015625, 0.0, 5561.0, 49.1),
        (0.0, 0.0, 0.0, 0.0, 5570.0, 0.0, 123.6),
        (0.0, 0.0, 1.0, 0.17041015625, 0.0, 5568.0, 80.0),
        (0.0, 0.0, 0.0, 0.0, 5576.0, 0.0, 123.9),
        (0.0, 0.0, 0.0, 0.0, 5575.0, 0.0, 123.7),
        (0.0, 0.0, 0.0, 0.0, 5534.0, 0.0, 123.3),
        (0.0, 0.0, 1.0, 0.16943359375, 0.0, 5531.0, 42.1),
        (0.0, 0.0, 0.0, 0.0, 5541.0, 0.0, 123.7),
        (0.0, 0.0, 1.0, 0.16943359375, 5528.0, 0.0, 152.3),
        (0.0, 0.0, 1.0, 0.17138671875, 0.0, 5578.0, 52.1),
        (0.0, 0.0, 1.0, 0.16943359375, 0.0, 5542.0, 44.3),
        (0.0, -1.0, 2.0, 0.33935546875, 0.0, 5541.0, 48.0),
        (0.0, 0.0, 0.0, 0.0, 5542.0, 0.0, 122.4),
        (0.0, 0.0, 2.0, 0.17138671875, 5539.0, 0.0, 162.7),
        (1.0, 0.0, 2.0, 0.171875, 5525.0, 0.0, 258.5),
        (0.0, 0.0, 0.0, 0.0, 5522.0, 0.0, 122.6),
        (0.0, 0.0, 0.0, 0.0, 5539.0, 0.0, 123.7),
        (0.0, 0.0, 1.0, 0.169921875, 5581.0, 0.0, 150.2),
        (0.0, 0.0, 1.0, 0.1689453125, 5542.0, 0.0, 155.7),
        (0.0, 0.0, 1.0, 0.16943359375, 5573.0, 0.0, 155.7),
        (0.0, 0.0, 2.0, 0.33837890625, 5573.0, 0.0, 163.4),
        (0.0, 0.0, 2.0, 0.34033203125, 5570.0, 0.0, 161.1),
        (0.0, 0.0, 3.0, 0.51025390625, 5577.0, 0.0, 164.1),
        (0.0, 0.0, 0.0, 0.0, 0.0, 5527.0, 13.2),
        (0.0, 0.0, 2.0, 0.341796875, 0.0, 5542.0, 38.1),
        (0.0, 0.0, 4.0, 0.6806640625, 5544.0, 0.0, 148.1),
        (0.0, 0.0, 4.0, 0.68115234375, 0.0, 5574.0, 134.0),
        (0.0, 0.0, 5.0, 0.6826171875, 0.0, 5538.0, 50.6),
        (0.0, 0.0, 0.0, 0.0, 5576.0, 0.0, 123.9),
        (0.0, -1.0, 1.0, 0.17041015625, 5542.0, 0.0, 122.9),
        (0.0, 0.0, 1.0, 0.16943359375, 0.0, 5569.0, 39.3),
        (0.0, -1.0, 1.0, 0.17041015625, 0.0, 5518.0, 41.7),
        (0.0, 0.0, 1.0, 0.16845703125, 0.0, 5524.0, 33.4),
        (0.0, 0.0, 2.0, 0.17041015625, 0.0, 5537.0, 34.5),
        (0.0, 0.0, 3.0, 0.3408203125, 0.0, 5561.0, 154.3),
        (0.0, 0.0, 0.0, 0.0, 5550.0, 0.0, 123.8),
        (0.0, 0.0, 0.0, 0.0, 0.0, 5535.0, 123.0),
        (0.0, 0.0, 0.0, 0.0, 5538.0, 0.0, 123.4),
    ];

    #[test]
    fn every_coefficient_stays_non_negative() {
        // Misses met idle servers and hits busy ones in these samples, so
        // running requests and cached tokens moved together. Unbounded, the
        // fit matched them with −566 ms per running request and +115 per
        // thousand cached tokens, and predicted a hit on a busy server at
        // 0 ms and one on an idle server as slow as a miss (128 ms): half
        // the hits went elsewhere, and the run's hit rate fell to 0.42.
        let model = LatencyModel::new(ModelSettings::default());
        for (waiting, dispatched, running, _kv_usage, uncached, cached, ttft) in EARLY_SHARED_PREFIX
        {
            let f = Features {
                waiting,
                dispatched,
                running,
                unanswered_uncached_tokens: 0.0,
                uncached_tokens: uncached,
                cached_tokens: cached,
                adapter_cold: 0.0,
                adapter_blocked: 0.0,
                slot_wait: 0.0,
                kv_wait: 0.0,
            };
            model.observe(&f, ttft);
        }
        let theta = model.coefficients();
        assert!(theta.iter().all(|&t| t >= 0.0), "{theta:?}");
        let miss = |running: f64| Features {
            running,
            uncached_tokens: 5532.0,
            ..Features::default()
        };
        let hit = |running: f64| Features {
            uncached_tokens: 32.0,
            cached_tokens: 5500.0,
            ..miss(running)
        };
        let predict = |f: &Features| model.predict(f).unwrap();
        let mut last_hit = 0.0;
        for running in [0.0, 1.0, 2.0, 5.0] {
            let (h, m) = (predict(&hit(running)), predict(&miss(running)));
            // The simulator: ~40 ms for a hit, ~123 for a miss, idle.
            assert!(
                h > 20.0 && h + 50.0 < m,
                "running {running}: hit {h}, miss {m}: {theta:?}"
            );
            assert!(
                h >= last_hit,
                "running {running}: hit {h} < {last_hit}: {theta:?}"
            );
            last_hit = h;
        }
        // A prior outside the bounds starts inside them.
        let mut prior = [0.0; FEATURES];
        prior[3] = -800.0;
        prior[6] = 140.0;
        let model = LatencyModel::with_prior(ModelSettings::default(), prior);
        assert_eq!(model.coefficients()[3], 0.0);
        assert_eq!(model.coefficients()[6], 140.0);
    }

    #[test]
    fn a_cached_token_is_never_predicted_slower_than_an_uncached_one() {
        // A fit that found believed-cached prompts slower (the index was
        // wrong, their endpoints busier than the inputs show).
        let mut theta = [0.0; FEATURES];
        theta[0] = 20.0;
        theta[5] = 30.0;
        theta[6] = 200.0;
        let model = LatencyModel::with_prior(ModelSettings::default(), theta);
        let prompt = |uncached_tokens: f64, cached_tokens: f64| Features {
            uncached_tokens,
            cached_tokens,
            ..Features::default()
        };
        let hit = model.predict_unchecked(&prompt(0.0, 5000.0)).unwrap();
        let miss = model.predict_unchecked(&prompt(5000.0, 0.0)).unwrap();
        assert!((hit - miss).abs() < 1e-9, "hit {hit}, miss {miss}");
        assert_eq!(
            model.predict_parts(&prompt(0.0, 5000.0)).unwrap().total,
            hit
        );
        // The fit itself is kept (a new endpoint starts from it).
        assert_eq!(model.coefficients()[6], 200.0);
        // A cheaper cached token is predicted as fitted.
        theta[6] = 2.0;
        let model = LatencyModel::with_prior(ModelSettings::default(), theta);
        let hit = model.predict_unchecked(&prompt(0.0, 5000.0)).unwrap();
        assert!((hit - 30.0).abs() < 1e-9, "{hit}");
    }

    #[test]
    fn predicts_nothing_until_warm() {
        let settings = ModelSettings {
            min_samples: 10,
            ..ModelSettings::default()
        };
        let model = LatencyModel::new(settings);
        let f = Features::default();
        for i in 0..10 {
            assert_eq!(model.predict(&f), None, "after {i} samples");
            model.observe(&f, 50.0);
        }
        let p = model.predict(&f).unwrap();
        assert!((p - 50.0).abs() < 1.0, "{p}");
    }

    #[test]
    fn follows_a_server_that_slows_down() {
        let mut rng = StdRng::seed_from_u64(11);
        let model = LatencyModel::new(ModelSettings::default());
        for _ in 0..2000 {
            let f = random_features(&mut rng);
            model.observe(&f, truth(&TRUE, &f, &mut rng));
        }
        // Prefill becomes three times slower.
        let slower = TRUE.map(|t| t * 3.0);
        for _ in 0..1500 {
            let f = random_features(&mut rng);
            model.observe(&f, truth(&slower, &f, &mut rng));
        }
        let f = Features {
            waiting: 4.0,
            uncached_tokens: 4000.0,
            running: 16.0,
            ..Features::default()
        };
        let want = dot(&slower, &f.vector());
        let got = model.predict(&f).unwrap();
        assert!((got - want).abs() / want < 0.1, "{got} vs {want}");
    }

    #[test]
    fn a_feature_that_never_varies_stays_bounded() {
        let model = LatencyModel::new(ModelSettings::default());
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..20_000 {
            // Only the prompt varies; everything else is 0 for ever.
            let f = Features {
                uncached_tokens: f64::from(rng.random_range(0..4000u32)),
                ..Features::default()
            };
            model.observe(&f, 10.0 + 0.05 * f.uncached_tokens);
        }
        let theta = model.coefficients();
        assert!(theta.iter().all(|t| t.is_finite()), "{theta:?}");
        let f = Features {
            uncached_tokens: 2000.0,
            ..Features::default()
        };
        let p = model.predict(&f).unwrap();
        assert!((p - 110.0).abs() < 2.0, "{p}");
    }

    #[test]
    fn outliers_and_bad_samples_do_not_poison_it() {
        let mut rng = StdRng::seed_from_u64(5);
        let model = LatencyModel::new(ModelSettings::default());
        for i in 0..3000 {
            let f = random_features(&mut rng);
            let y = if i % 50 == 49 {
                // A stalled request: 100× slower.
                100.0 * dot(&TRUE, &f.vector())
            } else {
                truth(&TRUE, &f, &mut rng)
            };
            model.observe(&f, y);
            model.observe(&f, f64::NAN);
            model.observe(&f, -1.0);
            model.observe(
                &Features {
                    waiting: f64::INFINITY,
                    ..f
                },
                y,
            );
        }
        assert_eq!(model.samples(), 3000);
        let f = Features {
            waiting: 5.0,
            uncached_tokens: 3000.0,
            running: 8.0,
            ..Features::default()
        };
        let want = dot(&TRUE, &f.vector());
        let got = model.predict(&f).unwrap();
        assert!((got - want).abs() / want < 0.1, "{got} vs {want}");
    }

    #[test]
    fn a_new_endpoint_starts_from_the_fleets_coefficients() {
        let mut rng = StdRng::seed_from_u64(9);
        let fleet = LatencyModel::new(ModelSettings::default());
        for _ in 0..2000 {
            let f = random_features(&mut rng);
            fleet.observe(&f, truth(&TRUE, &f, &mut rng));
        }
        let endpoint = LatencyModel::with_prior(ModelSettings::default(), fleet.coefficients());
        let f = random_features(&mut rng);
        assert_eq!(endpoint.predict(&f), None, "not warm on its own");
        let prior = endpoint.predict_unchecked(&f).unwrap();
        assert!((prior - fleet.predict(&f).unwrap()).abs() < 1e-9);
        // A few samples of a server twice as fast move it most of the way.
        let faster = TRUE.map(|t| t / 2.0);
        for _ in 0..64 {
            let f = random_features(&mut rng);
            endpoint.observe(&f, truth(&faster, &f, &mut rng));
        }
        let want = dot(&faster, &f.vector());
        let got = endpoint.predict(&f).unwrap();
        assert!((got - want).abs() / want < 0.2, "{got} vs {want}");
    }
}
