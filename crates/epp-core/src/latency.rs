//! Latency: a request's latency objectives, the load an endpoint carried when
//! a request was sent to it, what the response path then observed, and the
//! per-cycle predictions a latency predictor fills for filters and scorers.
//!
//! The core does not predict anything: a predictor plugin (a
//! [`crate::DataProducer`]) writes [`LatencyPredictions`] into the cycle's
//! state, and learns from the [`ResponseTiming`] every
//! [`crate::ResponseHooks::response_timing`] call hands it. The load at
//! dispatch is measured by the core ([`DispatchLoad::of`]) both when a
//! predictor predicts and when a request is dispatched, so a model is fitted
//! on exactly the inputs it predicts from.

use std::time::Duration;

use crate::{Candidate, EndpointId, InferenceRequest};

/// Header carrying the request's time-to-first-token objective, in
/// milliseconds (llm-d's current name).
pub const TTFT_SLO_HEADER: &str = "x-llm-d-slo-ttft-ms";
/// Header carrying the request's time-per-output-token objective, in
/// milliseconds (llm-d's current name).
pub const TPOT_SLO_HEADER: &str = "x-llm-d-slo-tpot-ms";
/// The earlier name of [`TTFT_SLO_HEADER`], still honoured.
pub const LEGACY_TTFT_SLO_HEADER: &str = "x-slo-ttft-ms";
/// The earlier name of [`TPOT_SLO_HEADER`], still honoured.
pub const LEGACY_TPOT_SLO_HEADER: &str = "x-slo-tpot-ms";

/// A request's latency objectives, from its headers. A value that is not a
/// positive finite number of milliseconds is no objective.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySlo {
    /// Time to first token, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time per output token, milliseconds.
    pub tpot_ms: Option<f64>,
}

impl LatencySlo {
    /// The objectives `request` states ([`TTFT_SLO_HEADER`] /
    /// [`TPOT_SLO_HEADER`], or their legacy names when those are absent).
    #[must_use]
    pub fn of(request: &InferenceRequest) -> Self {
        let read = |name: &str, legacy: &str| {
            request
                .header(name)
                .or_else(|| request.header(legacy))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        Self {
            ttft_ms: read(TTFT_SLO_HEADER, LEGACY_TTFT_SLO_HEADER),
            tpot_ms: read(TPOT_SLO_HEADER, LEGACY_TPOT_SLO_HEADER),
        }
    }

    /// Whether any objective is set.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }
}

/// What an endpoint carried, as this picker saw it, when a request was (or
/// would be) sent there: the inputs of a latency model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DispatchLoad {
    /// Requests waiting in its queue at the last scrape that are ahead of
    /// the request: when every adapter place is held and the request's own
    /// adapter can run (it is active there, or the request names none), one
    /// fewer for each adapter waiting there that is not active — the
    /// engine passes its requests over until it can load.
    pub waiting: u32,
    /// Requests running at the last scrape.
    pub running: u32,
    /// KV-cache utilisation at the last scrape, in `[0, 1]`.
    pub kv_usage: f64,
    /// Requests this picker sent there since the scrape, net of those that
    /// completed ([`Candidate::since_scrape`]): negative when more completed
    /// than were sent, i.e. the scrape's counts are already too high.
    pub dispatched: i32,
    /// Requests this picker sent there that have had no response bytes
    /// yet, now ([`crate::InflightCounters::unanswered`]): queued there, or
    /// computing their prompts, which the request waits behind. Current
    /// where the scrape's queue is up to an interval old, and it counts the
    /// prompts being computed, which the scrape shows as running.
    pub unanswered: u32,
    /// Of the prompt tokens of those unanswered requests, the ones their
    /// endpoint's prefix cache was not expected to hold
    /// ([`crate::InflightCounters::unanswered_uncached_tokens`]): the
    /// prefill the endpoint has yet to do for them, now.
    pub unanswered_uncached_tokens: u64,
    /// The request's estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Of those, the tokens its prefix cache is not expected to hold.
    pub uncached_tokens: u64,
    /// The request names a LoRA adapter the endpoint does not have active:
    /// not running there at the last scrape, nor in a response of this
    /// picker's streaming from there since
    /// ([`crate::AdapterInflight::is_running`]).
    pub adapter_cold: bool,
    /// The adapter is cold and cannot load yet: it is already waiting for a
    /// place there, or every place the endpoint has for adapters
    /// (`max_lora`) is held by one with running requests. The request then
    /// waits until one of those adapters has no request left running, which
    /// takes far longer than loading one.
    pub adapter_blocked: bool,
    /// When the adapter is blocked: how long until a place frees for it,
    /// in milliseconds, from the requests this picker has in flight there
    /// for the adapters holding the places
    /// ([`crate::AdapterInflight::release_ms`], counting the other adapters
    /// already waiting as ahead of it). `None` when not blocked, or before
    /// the endpoint's time per output token is known.
    pub adapter_release_ms: Option<f64>,
    /// The endpoint's KV cache in tokens, as it reports its geometry
    /// (`num_blocks × block_size`); 0 when it does not.
    pub kv_capacity_tokens: u64,
    /// Uncached prompt tokens of the requests this picker sent there since
    /// the scrape, net of those that completed: what they took from (or,
    /// negative, gave back to) the KV cache the scrape saw.
    pub dispatched_uncached_tokens: i64,
}

impl DispatchLoad {
    /// The load `candidate` carries for `request`, of whose prompt the
    /// fraction `prefix_hit` is expected in the endpoint's prefix cache.
    #[must_use]
    #[inline]
    pub fn of(candidate: &Candidate, request: &InferenceRequest, prefix_hit: f64) -> Self {
        let m = &candidate.metrics;
        let prompt_tokens = request.prompt_tokens_estimate();
        let adapter = request.target_model.as_str();
        // Cold: not running at the scrape, nor since as far as this
        // picker saw (a request of ours streaming there: the scrape is up
        // to an interval old, and the adapter of a request sent since may
        // have loaded).
        let adapter_cold = m.lora.serves_adapter(adapter, &request.model)
            && !m.lora.is_active(adapter)
            && !candidate.endpoint.adapter_inflight().is_running(adapter);
        let places_full = m.lora.max_loras > 0 && m.lora.active.len() >= m.lora.max_loras as usize;
        let adapter_blocked = adapter_cold && (places_full || m.lora.is_waiting(adapter));
        // Requests waiting for an adapter that cannot load are passed over
        // by the engine's scheduler: they hold up neither a place in the
        // batch nor a request whose adapter can run. At least one waits per
        // such adapter.
        let cold_waiting = || m.lora.waiting.iter().filter(|a| !m.lora.is_active(a));
        let passed_over = if places_full && !adapter_blocked {
            u32::try_from(cold_waiting().count()).unwrap_or(u32::MAX)
        } else {
            0
        };
        let adapter_release_ms = if adapter_blocked {
            let ahead = cold_waiting().filter(|a| a.as_str() != adapter).count();
            candidate.endpoint.adapter_inflight().release_ms(
                &m.lora.active,
                ahead,
                std::time::Instant::now(),
            )
        } else {
            None
        };
        let since = candidate.since_scrape();
        Self {
            waiting: m.waiting.saturating_sub(passed_over),
            running: m.running,
            kv_usage: if m.kv_usage.is_finite() {
                m.kv_usage.clamp(0.0, 1.0)
            } else {
                0.0
            },
            dispatched: i32::try_from(since.requests).unwrap_or(i32::MAX),
            unanswered: candidate.endpoint.inflight().unanswered(),
            unanswered_uncached_tokens: candidate.endpoint.inflight().unanswered_uncached_tokens(),
            prompt_tokens,
            uncached_tokens: crate::uncached_tokens(prompt_tokens, prefix_hit),
            adapter_cold,
            adapter_blocked,
            adapter_release_ms,
            kv_capacity_tokens: m.cache.map_or(0, |g| {
                g.num_blocks.saturating_mul(u64::from(g.block_size_tokens))
            }),
            dispatched_uncached_tokens: since.uncached_tokens,
        }
    }

    /// Running requests that must complete before the request's prompt
    /// fits in the endpoint's KV cache: an engine admits a request only
    /// when its blocks are free (cached blocks of its prefix that no
    /// running request uses are free, but taken out of the free pool when
    /// it runs, so the whole prompt is counted), and a request that does
    /// not fit waits for running ones to finish and give theirs back,
    /// whatever room its batch has for more requests.
    ///
    /// ```text
    /// room     = (1 − kv_usage) · capacity − dispatched_uncached
    /// each     = kv_usage · capacity / running      (a running request's share)
    /// kv_wait  = ⌈(prompt − room) / each⌉, within [0, running]
    /// ```
    ///
    /// 0 when the capacity is not reported, nothing runs, or the prompt
    /// fits.
    #[inline]
    #[must_use]
    pub fn kv_wait(&self) -> u64 {
        let capacity = self.kv_capacity_tokens as f64;
        let used = self.kv_usage * capacity;
        if self.running == 0 || used <= 0.0 {
            return 0;
        }
        let room = capacity - used - self.dispatched_uncached_tokens as f64;
        let short = self.prompt_tokens as f64 - room;
        if short <= 0.0 {
            return 0;
        }
        let each = used / f64::from(self.running);
        // Bounded by `running`: the cast cannot overflow.
        (short / each).ceil().min(f64::from(self.running)) as u64
    }

    /// Requests at the endpoint now, as best known: running and waiting at
    /// the scrape plus the net dispatched since (never below zero).
    #[inline]
    #[must_use]
    pub fn requests_there(&self) -> u64 {
        (i64::from(self.running) + i64::from(self.waiting) + i64::from(self.dispatched)).max(0)
            as u64
    }

    /// Prompt tokens expected in the prefix cache.
    #[inline]
    #[must_use]
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens - self.uncached_tokens.min(self.prompt_tokens)
    }
}

/// What the response path observed of one dispatched request, for plugins
/// that learn latencies ([`crate::ResponseHooks::response_timing`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResponseTiming {
    /// The endpoint's load when the request was dispatched to it.
    pub load: DispatchLoad,
    /// The endpoint's latency prediction in the cycle that picked it, when
    /// a predictor ran and the request was served where it was picked
    /// ([`crate::SchedulingResult::primary_prediction`]).
    pub predicted: Option<LatencyPrediction>,
    /// From dispatch to the first bytes of the response body, when any came.
    pub first_byte: Option<Duration>,
    /// From dispatch to the end of the response.
    pub total: Duration,
    /// The response was streamed (server-sent events): its first body bytes
    /// carry the first token. Otherwise the body arrives whole and
    /// `first_byte` is close to `total`.
    pub streamed: bool,
    /// Output tokens, from the response's usage, when it reported them.
    pub output_tokens: Option<u64>,
    /// HTTP status of the response.
    pub status: u16,
}

/// One endpoint's predicted latencies for the request being scheduled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencyPrediction {
    /// Predicted time to first token, milliseconds.
    pub ttft_ms: f64,
    /// Predicted time per output token, milliseconds (0 when unknown).
    pub tpot_ms: f64,
    /// The request's TTFT objective minus [`Self::ttft_ms`] (0 minus it
    /// when the request has none): positive means the objective is met.
    pub ttft_headroom_ms: f64,
    /// Likewise for TPOT; 0 when the request has no TPOT objective or TPOT
    /// is unknown (TPOT then neither helps nor hurts).
    pub tpot_headroom_ms: f64,
    /// How much the request would delay other requests: those already at
    /// the endpoint, by its own predicted work (the prefill of its prompt,
    /// a cold adapter: engine time they wait through) times the
    /// requests it would hold up ([`DispatchLoad::requests_there`]); and,
    /// as its predictor weighs it, later ones: those whose cached prompts
    /// its uncached tokens would evict, those that would queue behind it
    /// (part of its own wait in the queue), and those that would find the
    /// batch full because it took a place. Large where a long prompt
    /// misses the cache of a busy endpoint, or where it would wait for a
    /// place in a full batch.
    pub delay_to_others_ms: f64,
}

impl LatencyPrediction {
    /// A prediction for a request with objectives `slo`.
    #[must_use]
    #[inline]
    pub fn new(ttft_ms: f64, tpot_ms: Option<f64>, slo: LatencySlo) -> Self {
        let tpot = tpot_ms.filter(|t| t.is_finite() && *t >= 0.0);
        Self {
            ttft_ms,
            tpot_ms: tpot.unwrap_or(0.0),
            ttft_headroom_ms: slo.ttft_ms.unwrap_or(0.0) - ttft_ms,
            tpot_headroom_ms: match (slo.tpot_ms, tpot) {
                (Some(objective), Some(t)) => objective - t,
                _ => 0.0,
            },
            delay_to_others_ms: 0.0,
        }
    }

    /// With [`Self::delay_to_others_ms`] set.
    #[inline]
    #[must_use]
    pub fn with_delay_to_others(mut self, ms: f64) -> Self {
        self.delay_to_others_ms = if ms.is_finite() { ms.max(0.0) } else { 0.0 };
        self
    }

    /// Whether every objective the request states is predicted to be met.
    /// Without objectives, nothing is "met": headroom is negative.
    #[inline]
    #[must_use]
    pub fn meets_slo(&self) -> bool {
        self.ttft_headroom_ms >= 0.0 && self.tpot_headroom_ms >= 0.0
    }
}

/// Latency predictions of one scheduling cycle, per endpoint id. Filled by a
/// latency predictor; endpoints it has no prediction for have none.
#[derive(Debug, Clone, Default)]
pub struct LatencyPredictions {
    by_id: Vec<Option<LatencyPrediction>>,
    /// The request's objectives.
    pub slo: LatencySlo,
    /// Whether a predictor ran in this cycle.
    pub computed: bool,
}

impl LatencyPredictions {
    /// Clears for a new cycle, keeping capacity.
    pub fn reset(&mut self) {
        self.by_id.clear();
        self.slo = LatencySlo::default();
        self.computed = false;
    }

    /// Records the prediction for `id`.
    #[inline]
    pub fn set(&mut self, id: EndpointId, prediction: LatencyPrediction) {
        let i = id.index();
        if self.by_id.len() <= i {
            self.by_id.resize(i + 1, None);
        }
        self.by_id[i] = Some(prediction);
    }

    /// The prediction for `id`, if any.
    #[inline]
    #[must_use]
    pub fn get(&self, id: EndpointId) -> Option<&LatencyPrediction> {
        self.by_id.get(id.index()).and_then(Option::as_ref)
    }

    /// Whether any endpoint has a prediction.
    #[must_use]
    pub fn any(&self) -> bool {
        self.by_id.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{CacheGeometry, Endpoint, EndpointMetrics, LoraInfo};

    #[test]
    fn objectives_come_from_either_header_name_and_only_positive_numbers_count() {
        let r = InferenceRequest::builder("m")
            .header(TTFT_SLO_HEADER, "250")
            .header(LEGACY_TPOT_SLO_HEADER, " 20 ")
            .build();
        assert_eq!(
            LatencySlo::of(&r),
            LatencySlo {
                ttft_ms: Some(250.0),
                tpot_ms: Some(20.0)
            }
        );
        for bad in ["0", "-5", "NaN", "inf", "fast", ""] {
            let r = InferenceRequest::builder("m")
                .header(TTFT_SLO_HEADER, bad)
                .build();
            assert!(!LatencySlo::of(&r).is_set(), "{bad:?}");
        }
        let r = InferenceRequest::builder("m")
            .header(TTFT_SLO_HEADER, "100")
            .header(LEGACY_TTFT_SLO_HEADER, "900")
            .build();
        assert_eq!(LatencySlo::of(&r).ttft_ms, Some(100.0), "current name wins");
    }

    #[test]
    fn headroom_is_objective_minus_prediction() {
        let slo = LatencySlo {
            ttft_ms: Some(300.0),
            tpot_ms: Some(25.0),
        };
        let p = LatencyPrediction::new(200.0, Some(30.0), slo);
        assert_eq!((p.ttft_headroom_ms, p.tpot_headroom_ms), (100.0, -5.0));
        assert!(!p.meets_slo());
        let none = LatencyPrediction::new(200.0, Some(30.0), LatencySlo::default());
        assert_eq!(
            (none.ttft_headroom_ms, none.tpot_headroom_ms),
            (-200.0, 0.0)
        );
        let unknown_tpot = LatencyPrediction::new(200.0, None, slo);
        assert_eq!(unknown_tpot.tpot_headroom_ms, 0.0);
        assert!(unknown_tpot.meets_slo());
    }

    #[test]
    fn load_reads_the_scrape_the_dispatches_since_and_the_adapter() {
        let e = Arc::new(Endpoint::new(3, "10.0.0.1:8000".parse().unwrap()));
        e.set_metrics(EndpointMetrics {
            waiting: 4,
            running: 7,
            kv_usage: 0.5,
            lora: LoraInfo {
                active: vec!["a".into()],
                waiting: vec![],
                max_loras: 2,
                base_model: None,
            },
            ..EndpointMetrics::fresh()
        });
        e.inflight().start_with(10, 10);
        e.inflight().start_with(10, 10);
        // Of the two, one has begun to answer.
        e.inflight().await_answer(40);
        let c = Candidate::new(&e);
        let r = InferenceRequest::builder("base")
            .target_model("b")
            .prompt("x".repeat(400))
            .build();
        let load = DispatchLoad::of(&c, &r, 0.75);
        assert_eq!(
            load,
            DispatchLoad {
                waiting: 4,
                running: 7,
                kv_usage: 0.5,
                dispatched: 2,
                unanswered: 1,
                unanswered_uncached_tokens: 40,
                prompt_tokens: 100,
                uncached_tokens: 25,
                adapter_cold: true,
                adapter_blocked: false,
                adapter_release_ms: None,
                kv_capacity_tokens: 0,
                dispatched_uncached_tokens: 20,
            }
        );
        assert_eq!(load.cached_tokens(), 75);
        assert_eq!(load.requests_there(), 13);
        // A scrape that saw both, then one completes.
        e.set_metrics(EndpointMetrics {
            inflight_at_scrape: e.inflight().sample(),
            ..EndpointMetrics::fresh()
        });
        e.inflight().finish_with(10, 10);
        let completed = DispatchLoad::of(&Candidate::new(&e), &r, 0.0);
        assert_eq!(completed.dispatched, -1, "one more completed than was sent");
        let warm = InferenceRequest::builder("base").target_model("a").build();
        assert!(!DispatchLoad::of(&c, &warm, 0.0).adapter_cold);
        let base = InferenceRequest::builder("base").build();
        assert!(!DispatchLoad::of(&c, &base, 0.0).adapter_cold);
        // A client naming the adapter itself (no rewrite): cold only once
        // the server says which model is its base.
        let direct = InferenceRequest::builder("b").build();
        assert!(!DispatchLoad::of(&c, &direct, 0.0).adapter_cold);
        e.set_metrics(EndpointMetrics {
            lora: LoraInfo {
                active: vec!["a".into()],
                max_loras: 2,
                base_model: Some("base".into()),
                ..LoraInfo::default()
            },
            ..EndpointMetrics::fresh()
        });
        let c = Candidate::new(&e);
        assert!(DispatchLoad::of(&c, &direct, 0.0).adapter_cold);
        let direct_warm = InferenceRequest::builder("a").build();
        assert!(!DispatchLoad::of(&c, &direct_warm, 0.0).adapter_cold);
        assert!(!DispatchLoad::of(&c, &base, 0.0).adapter_cold);
        // Blocked: both places held by adapters with running requests, or
        // the adapter already waiting for one; a free place only loads.
        let lora = |active: &[&str], waiting: &[&str]| EndpointMetrics {
            lora: LoraInfo {
                active: active.iter().map(|&a| a.to_owned()).collect(),
                waiting: waiting.iter().map(|&a| a.to_owned()).collect(),
                max_loras: 2,
                base_model: Some("base".into()),
            },
            ..EndpointMetrics::fresh()
        };
        let blocked = |m: EndpointMetrics, r: &InferenceRequest| {
            e.set_metrics(m);
            let load = DispatchLoad::of(&Candidate::new(&e), r, 0.0);
            (load.adapter_cold, load.adapter_blocked)
        };
        assert_eq!(blocked(lora(&["a"], &[]), &direct), (true, false));
        assert_eq!(blocked(lora(&["a", "c"], &[]), &direct), (true, true));
        assert_eq!(blocked(lora(&["a"], &["b"]), &direct), (true, true));
        assert_eq!(
            blocked(lora(&["a", "c"], &[]), &direct_warm),
            (false, false)
        );
        assert_eq!(blocked(lora(&["a", "c"], &[]), &base), (false, false));

        // Both places held: the requests waiting for the cold adapters
        // "b" and "d" are passed over, so they are not ahead of a request
        // whose adapter runs (nor of one for the base model); "c" is
        // active, its waiting requests wait for their turn like any other.
        // A request that is blocked itself waits behind all of them.
        let waiting = |active: &[&str], waiting_adapters: &[&str], r: &InferenceRequest| {
            e.set_metrics(EndpointMetrics {
                waiting: 5,
                ..lora(active, waiting_adapters)
            });
            DispatchLoad::of(&Candidate::new(&e), r, 0.0).waiting
        };
        let full = ["a", "c"];
        assert_eq!(waiting(&full, &["b", "c", "d"], &direct_warm), 3);
        assert_eq!(waiting(&full, &["b", "c", "d"], &base), 3);
        assert_eq!(waiting(&full, &["b", "c", "d"], &direct), 5, "blocked");
        // A free place: a cold adapter's requests can load, none passed over.
        assert_eq!(waiting(&["a"], &["b"], &direct_warm), 5);
    }

    #[test]
    fn kv_wait_counts_the_running_requests_whose_blocks_the_prompt_needs() {
        // A 10,000-token cache, 80 % used by 4 running requests (2,000
        // tokens each), 2,000 free.
        let at = |prompt: u64, dispatched: i64| DispatchLoad {
            running: 4,
            kv_usage: 0.8,
            prompt_tokens: prompt,
            kv_capacity_tokens: 10_000,
            dispatched_uncached_tokens: dispatched,
            ..DispatchLoad::default()
        };
        // (prompt, uncached tokens dispatched since the scrape, kv_wait)
        for (prompt, dispatched, wait) in [
            (2_000, 0, 0),      // fits exactly
            (2_001, 0, 1),      // one token short: one request must finish
            (4_000, 0, 1),      // short by one request's share
            (4_001, 0, 2),      //
            (1_000, 1_500, 1),  // what was sent since took the room
            (3_000, -1_000, 0), // a completion since gave room back
            (50_000, 0, 4),     // never fits: at most every running request
        ] {
            assert_eq!(
                at(prompt, dispatched).kv_wait(),
                wait,
                "{prompt} {dispatched}"
            );
        }
        // Nothing to wait for: no geometry, nothing running, or an empty cache.
        let unknown = DispatchLoad {
            kv_capacity_tokens: 0,
            ..at(9_000, 0)
        };
        let idle = DispatchLoad {
            running: 0,
            ..at(9_000, 0)
        };
        let empty = DispatchLoad {
            kv_usage: 0.0,
            ..at(9_000, 0)
        };
        assert_eq!([unknown, idle, empty].map(|l| l.kv_wait()), [0; 3]);
        // Read from the reported geometry and the dispatches since the scrape.
        let e = Arc::new(Endpoint::new(1, "10.0.0.1:8000".parse().unwrap()));
        e.set_metrics(EndpointMetrics {
            running: 4,
            kv_usage: 0.8,
            cache: Some(CacheGeometry {
                block_size_tokens: 16,
                num_blocks: 625,
            }),
            ..EndpointMetrics::fresh()
        });
        e.inflight().start_with(1_600, 1_500);
        let r = InferenceRequest::builder("m")
            .prompt("x".repeat(4_000))
            .build();
        let load = DispatchLoad::of(&Candidate::new(&e), &r, 0.0);
        assert_eq!(
            (load.kv_capacity_tokens, load.dispatched_uncached_tokens),
            (10_000, 1_500)
        );
        assert_eq!(load.kv_wait(), 1, "1,000 tokens against 500 left");
    }

    #[test]
    fn predictions_are_kept_per_endpoint_and_cleared_per_cycle() {
        let mut p = LatencyPredictions::default();
        assert!(!p.any());
        p.set(EndpointId(5), LatencyPrediction::new(10.0, None, p.slo));
        assert_eq!(p.get(EndpointId(5)).unwrap().ttft_ms, 10.0);
        assert!(p.get(EndpointId(2)).is_none() && p.get(EndpointId(50)).is_none());
        p.reset();
        assert!(!p.any() && !p.computed);
    }
}
