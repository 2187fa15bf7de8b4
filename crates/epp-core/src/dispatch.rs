//! A committed pick: the request is on its way to an endpoint, and the
//! endpoint's in-flight counters say so until the response ends.
//!
//! Any front end (the ext_proc service, or a Rust gateway embedding the
//! crates) gets correct load signals by holding the [`Dispatch`] for as long
//! as the request is being served: starting it counts the request on its
//! endpoint, [`Dispatch::complete`] or dropping it (client gone, stream reset)
//! releases the count exactly once and runs the scheduler's response hooks.

use std::{fmt, sync::Arc, time::Instant};

use crate::{
    AdapterTicket, Candidate, DispatchLoad, Endpoint, InferenceRequest, LatencyPrediction,
    RequestOutcome, ResponseHeaderSink, ResponseTiming, Scheduler, SchedulingError,
    SchedulingResult, Usage,
};

/// How dispatches count their tokens in the endpoints' in-flight counters
/// ([`crate::InflightCounters`]), as a plugin asks
/// ([`crate::Plugin::inflight_accounting`]; llm-d's
/// `inflight-load-producer`). The default: a request's prompt tokens count
/// from its dispatch until its response ends, and nothing for its output.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InflightAccounting {
    /// A streamed response's prompt tokens leave the counts when its first
    /// body bytes arrive (the prefill is done), not when it ends; the
    /// request itself, and any output estimate, count until it ends. A
    /// response that is not streamed keeps them all until it ends.
    pub release_prompt_at_first_token: bool,
    /// Output tokens estimated per request and counted (as uncached: the
    /// endpoint computes them) until the response ends; `None`: none.
    pub output: Option<OutputEstimate>,
}

/// An estimate of a request's output tokens from its prompt:
/// `min(round(prompt tokens × ratio), the request's max_tokens when it
/// states one, max)`, and never above [`OutputEstimate::CEILING`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputEstimate {
    /// Output tokens per prompt token (finite, ≥ 0).
    pub ratio: f64,
    /// A cap on every estimate, if any.
    pub max: Option<u64>,
}

impl OutputEstimate {
    /// The largest estimate: far more than any request outputs, and small
    /// enough that the counters it is added to cannot overflow.
    pub const CEILING: u64 = u32::MAX as u64;

    /// The estimate for a prompt of `prompt_tokens` whose request caps its
    /// output at `client_max`, if it does.
    #[must_use]
    pub fn tokens(&self, prompt_tokens: u64, client_max: Option<u64>) -> u64 {
        let estimate = (prompt_tokens as f64 * self.ratio).round();
        // `as` saturates: a NaN or negative ratio gives 0.
        let estimate = (estimate as u64).min(Self::CEILING);
        [client_max, self.max]
            .into_iter()
            .flatten()
            .fold(estimate, u64::min)
    }
}

/// One request routed to one endpoint, from the pick until its response
/// completes.
///
/// While it lives, the endpoint's [`crate::InflightCounters`] include the
/// request: one request, its estimated prompt tokens, and of those the
/// tokens the endpoint's prefix cache was not expected to hold (what its KV
/// cache grows by); how long the tokens count, and whether an estimate of
/// the output counts too, is the scheduler's [`InflightAccounting`]. The
/// load scorers read those counters between scrapes.
///
/// Not `Clone`: the counts are released once, by [`Self::complete`] or by
/// `Drop` (which reports [`RequestOutcome::Aborted`] to the response hooks).
pub struct Dispatch {
    scheduler: Arc<Scheduler>,
    request: InferenceRequest,
    endpoint: Arc<Endpoint>,
    /// What the endpoint's counters hold for the request now: tokens, and
    /// of those uncached ones.
    tokens: u64,
    uncached_tokens: u64,
    /// The prompt's part of those, while it still counts and is to leave
    /// at the first streamed bytes ([`InflightAccounting`]).
    prompt_until_first_token: Option<(u64, u64)>,
    open: bool,
    /// When the request was dispatched, and the endpoint's load then (its
    /// `uncached_tokens` are what the endpoint's unanswered counts hold for
    /// the request until its first bytes).
    started: Instant,
    load: DispatchLoad,
    /// The endpoint's latency prediction when it was picked, if any.
    prediction: Option<LatencyPrediction>,
    /// When the first response body bytes came, and whether the response
    /// is streamed.
    first_byte: Option<Instant>,
    streamed: bool,
    /// P/D: the prefill endpoint and what it counts for this request
    /// (tokens, uncached tokens), until the prefill is done.
    prefill: Option<(Arc<Endpoint>, u64, u64)>,
    /// Its place in the endpoint's [`crate::AdapterInflight`], when it
    /// names a LoRA adapter there.
    adapter: Option<AdapterTicket>,
}

impl fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatch")
            .field("request_id", &self.request.request_id)
            .field("endpoint", &self.endpoint.addr_str())
            .field("tokens", &self.tokens)
            .field("uncached_tokens", &self.uncached_tokens)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

/// The prompt tokens an endpoint must compute for a request of `tokens`
/// prompt tokens of which the fraction `prefix_hit` (in `[0, 1]`) is in its
/// prefix cache: the uncached part, rounded up (at most `i64::MAX`).
#[inline]
#[must_use]
pub fn uncached_tokens(tokens: u64, prefix_hit: f64) -> u64 {
    let hit = if prefix_hit.is_nan() {
        0.0
    } else {
        prefix_hit.clamp(0.0, 1.0)
    };
    // Rounded up without `f64::ceil`, which the baseline x86-64 target
    // (no SSE4.1) compiles to a libm call, and through `i64`, which it
    // converts to and from `f64` in one instruction each (`u64` takes a
    // branchy sequence): this runs for every candidate of every cycle. The
    // product is in `[0, tokens]`, so the truncating cast is exact below
    // it.
    let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
    let exact = tokens as f64 * (1.0 - hit);
    let whole = exact as i64;
    let up = whole.saturating_add(i64::from((whole as f64) < exact));
    up.clamp(0, tokens).unsigned_abs()
}

/// Registers `request` in its endpoint's [`crate::AdapterInflight`] when it
/// names a LoRA adapter the endpoint serves.
fn register_adapter(candidate: &Candidate, request: &InferenceRequest) -> Option<AdapterTicket> {
    let lora = &candidate.metrics.lora;
    lora.serves_adapter(&request.target_model, &request.model)
        .then(|| {
            candidate.endpoint.adapter_inflight().start(
                &request.target_model,
                request.max_tokens,
                request.stream,
            )
        })
}

impl SchedulingResult {
    /// Commits the pick: `request` is sent to the primary target, whose
    /// in-flight counters count it from now until the returned
    /// [`Dispatch`] completes or is dropped. `scheduler` is the one that
    /// produced this result (its response hooks see the response).
    ///
    /// # Errors
    /// [`SchedulingError::NoEndpoints`] when the result has no primary target.
    pub fn dispatch(
        &self,
        scheduler: Arc<Scheduler>,
        request: InferenceRequest,
    ) -> Result<Dispatch, SchedulingError> {
        let endpoint = self
            .primary()
            .cloned()
            .ok_or(SchedulingError::NoEndpoints)?;
        // P/D: the prefill server computes the prompt; it carries the
        // request until the prefill is done ([`Dispatch::prefill_done`]).
        let prefill = self
            .prefill()
            .filter(|p| !Arc::ptr_eq(p, &endpoint))
            .map(|p| {
                let load = DispatchLoad::of(&Candidate::new(p), &request, self.prefill_prefix_hit);
                let (tokens, uncached) = (load.prompt_tokens, load.uncached_tokens);
                p.inflight().start_with(tokens, uncached);
                (Arc::clone(p), tokens, uncached)
            });
        let mut dispatch = Dispatch::start(scheduler, request, endpoint, self.primary_prefix_hit);
        dispatch.prefill = prefill;
        dispatch.prediction = self.primary_prediction;
        Ok(dispatch)
    }
}

impl Dispatch {
    /// Counts `request` on `endpoint`, of whose prompt the fraction
    /// `prefix_hit` is expected in the endpoint's prefix cache. Prefer
    /// [`SchedulingResult::dispatch`]; this is for a front end that picked
    /// the endpoint some other way (a forced endpoint, a retry elsewhere).
    #[must_use]
    pub fn start(
        scheduler: Arc<Scheduler>,
        request: InferenceRequest,
        endpoint: Arc<Endpoint>,
        prefix_hit: f64,
    ) -> Self {
        let candidate = Candidate::new(&endpoint);
        let load = DispatchLoad::of(&candidate, &request, prefix_hit);
        let adapter = register_adapter(&candidate, &request);
        let accounting = scheduler.inflight_accounting();
        let prompt = (load.prompt_tokens, load.uncached_tokens);
        let output = accounting
            .output
            .map_or(0, |o| o.tokens(load.prompt_tokens, request.max_tokens));
        let (tokens, uncached_tokens) = (
            prompt.0.saturating_add(output),
            prompt.1.saturating_add(output),
        );
        endpoint.inflight().start_with(tokens, uncached_tokens);
        endpoint.inflight().await_answer(load.uncached_tokens);
        if let Some(feed) = scheduler.replica_feed() {
            feed.load_changed();
        }
        Self {
            scheduler,
            request,
            endpoint,
            tokens,
            uncached_tokens,
            prompt_until_first_token: accounting.release_prompt_at_first_token.then_some(prompt),
            open: true,
            started: Instant::now(),
            load,
            prediction: None,
            first_byte: None,
            streamed: false,
            prefill: None,
            adapter,
        }
    }

    /// The prefill endpoint a P/D decision picked, while it still counts
    /// this request.
    #[must_use]
    pub fn prefill_endpoint(&self) -> Option<&Arc<Endpoint>> {
        self.prefill.as_ref().map(|(e, _, _)| e)
    }

    /// The prefill of a P/D request is done (the decode server's response
    /// began: the routing sidecar sends the decode request after the
    /// prefill answered): the prefill endpoint stops counting it. Also done
    /// on completion or drop; does nothing without a prefill pick.
    pub fn prefill_done(&mut self) {
        if let Some((endpoint, tokens, uncached)) = self.prefill.take() {
            endpoint.inflight().finish_with(tokens, uncached);
            self.load_changed();
        }
    }

    /// The endpoint's load when the request was dispatched to it.
    #[must_use]
    pub fn load(&self) -> &DispatchLoad {
        &self.load
    }

    /// The first bytes of the response body arrived; `streamed` = the
    /// response is streamed (server-sent events), so they carry the first
    /// token. Only the first call counts. With
    /// [`InflightAccounting::release_prompt_at_first_token`], a streamed
    /// response's prompt tokens leave the endpoint's counts here.
    pub fn first_body_bytes(&mut self, streamed: bool) {
        if self.first_byte.is_some() {
            return;
        }
        self.first_byte = Some(Instant::now());
        self.streamed = streamed;
        if self.open {
            // Its first bytes: it leaves the endpoint's unanswered count.
            self.endpoint.inflight().answered(self.load.uncached_tokens);
        }
        if !streamed || !self.open {
            return;
        }
        if let Some(ticket) = self.adapter {
            self.endpoint.adapter_inflight().first_token(ticket);
        }
        if let Some((tokens, uncached)) = self.prompt_until_first_token.take() {
            self.endpoint.inflight().release_tokens(tokens, uncached);
            self.tokens -= tokens;
            self.uncached_tokens -= uncached;
            self.load_changed();
        }
    }

    /// The endpoint serving the request.
    #[must_use]
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The request.
    #[must_use]
    pub fn request(&self) -> &InferenceRequest {
        &self.request
    }

    /// The scheduler that routed the request.
    #[must_use]
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.scheduler
    }

    /// Tokens the endpoint's counters hold for the request now: its
    /// estimated prompt tokens (until the first token, or the end, as the
    /// [`InflightAccounting`] says) and any output estimate.
    #[must_use]
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Of those, the tokens not expected in the endpoint's prefix cache.
    #[must_use]
    pub fn uncached_tokens(&self) -> u64 {
        self.uncached_tokens
    }

    /// The gateway reports that `served` (not necessarily the pick: a
    /// fallback after the primary failed) is serving the request. Moves the
    /// in-flight counts there, so load signals follow where the request
    /// really is, and the response hooks are told of `served`. Its prefix
    /// cache is not assumed to hold any of the prompt: all its tokens count
    /// as uncached. Returns whether the endpoint changed.
    ///
    /// Does nothing once the dispatch completed.
    pub fn served_by(&mut self, served: Arc<Endpoint>) -> bool {
        if !self.open || served.addr() == self.endpoint.addr() {
            return false;
        }
        self.endpoint
            .inflight()
            .finish_with(self.tokens, self.uncached_tokens);
        self.uncached_tokens = self.tokens;
        if let Some(prompt) = &mut self.prompt_until_first_token {
            prompt.1 = prompt.0;
        }
        if let Some(ticket) = self.adapter.take() {
            self.endpoint.adapter_inflight().forget(ticket);
        }
        let candidate = Candidate::new(&served);
        // What the old endpoint's unanswered counts hold for it.
        let was_uncached = self.load.uncached_tokens;
        self.load = DispatchLoad::of(&candidate, &self.request, 0.0);
        self.adapter = register_adapter(&candidate, &self.request);
        // The prediction was for the pick, not for where the request went.
        self.prediction = None;
        served
            .inflight()
            .start_with(self.tokens, self.uncached_tokens);
        // Still open here: unanswered until its first bytes.
        if self.first_byte.is_none() {
            self.endpoint.inflight().answered(was_uncached);
            served.inflight().await_answer(self.load.uncached_tokens);
        }
        self.endpoint = served;
        self.load_changed();
        true
    }

    fn load_changed(&self) {
        if let Some(feed) = self.scheduler.replica_feed() {
            feed.load_changed();
        }
    }

    /// The response's headers arrived with `status`: runs the scheduler's
    /// response hooks, which may add headers for the client to `out`.
    pub fn response_received(
        &self,
        status: u16,
        headers: &[(String, String)],
        out: &mut dyn ResponseHeaderSink,
    ) {
        self.scheduler
            .response_received(&self.request, &self.endpoint, status, headers, out);
    }

    /// The response ended with `outcome` (and the token `usage` read from
    /// it, if any): releases the in-flight counts and runs the response
    /// hooks. Returns the request.
    pub fn complete(mut self, usage: Option<&Usage>, outcome: RequestOutcome) -> InferenceRequest {
        self.close(usage, outcome);
        std::mem::take(&mut self.request)
    }

    fn close(&mut self, usage: Option<&Usage>, outcome: RequestOutcome) {
        self.prefill_done();
        if !std::mem::replace(&mut self.open, false) {
            return;
        }
        self.endpoint
            .inflight()
            .finish_with(self.tokens, self.uncached_tokens);
        if self.first_byte.is_none() {
            self.endpoint.inflight().answered(self.load.uncached_tokens);
        }
        if let Some(ticket) = self.adapter.take() {
            let adapters = self.endpoint.adapter_inflight();
            match outcome {
                RequestOutcome::Completed { status } if (200..300).contains(&status) => {
                    adapters.finish(ticket, usage.map(|u| u.completion_tokens));
                }
                _ => adapters.forget(ticket),
            }
        }
        self.load_changed();
        let timing = match outcome {
            RequestOutcome::Completed { status } => Some(ResponseTiming {
                load: self.load,
                predicted: self.prediction,
                first_byte: self.first_byte.map(|t| t - self.started),
                total: self.started.elapsed(),
                streamed: self.streamed,
                output_tokens: usage.map(|u| u.completion_tokens),
                status,
            }),
            RequestOutcome::Aborted => None,
        };
        self.scheduler.response_complete(
            &self.request,
            &self.endpoint,
            usage,
            timing.as_ref(),
            outcome,
        );
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        // Client gone, stream reset, or a front end that forgot: the request
        // no longer loads the endpoint.
        self.close(None, RequestOutcome::Aborted);
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Mutex, time::Duration};

    use super::*;
    use crate::{
        Candidate, CycleContext, EndpointMetrics, EndpointSnapshot, Picker, Plugin, PluginRef,
        ResponseHooks, SchedulingProfile, SingleProfileHandler,
    };

    #[test]
    fn uncached_tokens_round_up_and_stay_in_range() {
        assert_eq!(uncached_tokens(100, 0.0), 100);
        assert_eq!(uncached_tokens(100, 1.0), 0);
        assert_eq!(uncached_tokens(100, 0.755), 25);
        assert_eq!(uncached_tokens(7, 0.5), 4);
        assert_eq!(uncached_tokens(100, -3.0), 100);
        assert_eq!(uncached_tokens(100, 4.0), 0);
        assert_eq!(uncached_tokens(100, f64::NAN), 100);
        assert_eq!(uncached_tokens(u64::MAX, 0.0), i64::MAX.unsigned_abs());
        // The same as rounding up with `f64::ceil`, which it avoids.
        for tokens in (0..300).chain([4096, 16_384, 1 << 40]) {
            for k in 0..=64 {
                let hit = f64::from(k) / 64.0;
                let ceil = ((tokens as f64 * (1.0 - hit)).ceil() as u64).min(tokens);
                assert_eq!(uncached_tokens(tokens, hit), ceil, "{tokens} at {hit}");
            }
        }
    }

    /// Picks the first candidate and records every outcome and timing it is
    /// told of.
    #[derive(Debug, Default)]
    struct FirstAndLog(Mutex<Vec<RequestOutcome>>, Mutex<Vec<ResponseTiming>>);
    impl Plugin for FirstAndLog {
        fn type_name(&self) -> &str {
            "first"
        }
        fn name(&self) -> &str {
            "first"
        }
        fn as_picker(&self) -> Option<&dyn Picker> {
            Some(self)
        }
        fn as_response_hooks(&self) -> Option<&dyn ResponseHooks> {
            Some(self)
        }
    }
    impl Picker for FirstAndLog {
        fn pick(&self, _: &mut CycleContext<'_>, c: &[Candidate], _: &[f64], out: &mut Vec<usize>) {
            out.extend((!c.is_empty()).then_some(0));
        }
    }
    impl ResponseHooks for FirstAndLog {
        fn request_completed(&self, _: &InferenceRequest, _: &Endpoint, o: RequestOutcome) {
            self.0.lock().unwrap().push(o);
        }
        fn response_timing(&self, _: &InferenceRequest, _: &Endpoint, t: &ResponseTiming) {
            self.1.lock().unwrap().push(*t);
        }
    }

    /// A scheduler over one endpoint, a 40-character (10-token) request, its
    /// scheduling result, and the endpoint.
    struct Setup {
        scheduler: Arc<Scheduler>,
        log: Arc<FirstAndLog>,
        request: InferenceRequest,
        result: SchedulingResult,
        endpoint: Arc<Endpoint>,
    }

    fn setup() -> Setup {
        setup_with(&[])
    }

    /// Declares an in-flight accounting, as `inflight-load-producer` does.
    #[derive(Debug)]
    struct Accounting(InflightAccounting);
    impl Plugin for Accounting {
        fn type_name(&self) -> &str {
            "accounting"
        }
        fn name(&self) -> &str {
            "accounting"
        }
        fn inflight_accounting(&self) -> Option<InflightAccounting> {
            Some(self.0)
        }
    }

    /// [`setup`] with a hook plugin declaring each of `accountings`.
    fn setup_with(accountings: &[InflightAccounting]) -> Setup {
        let picker = Arc::new(FirstAndLog::default());
        let profile =
            SchedulingProfile::new("p").with_picker(PluginRef::new(picker.clone() as Arc<_>));
        let hooks = std::iter::once(PluginRef::new(picker.clone() as Arc<_>)).chain(
            accountings
                .iter()
                .map(|a| PluginRef::new(Arc::new(Accounting(*a)))),
        );
        let scheduler = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
            .unwrap()
            .with_hooks(hooks);
        let endpoint = Arc::new(Endpoint::new(0, "10.0.0.1:8000".parse().unwrap()));
        endpoint.set_metrics(EndpointMetrics::fresh());
        let snapshot = EndpointSnapshot::new(vec![Arc::clone(&endpoint)]);
        let request = InferenceRequest::builder("m")
            .prompt("x".repeat(40))
            .build();
        let result = scheduler.schedule(&request, &snapshot).unwrap();
        Setup {
            scheduler: Arc::new(scheduler),
            log: picker,
            request,
            result,
            endpoint,
        }
    }

    /// A request naming an adapter is registered at its endpoint while in
    /// flight; completed, it teaches the endpoint's time per output token;
    /// a request whose adapter cannot load is told how long until a place
    /// frees from the holders' requests in flight there.
    #[test]
    fn adapter_requests_in_flight_say_when_a_place_frees() {
        let s = setup();
        let e = &s.endpoint;
        e.set_metrics(EndpointMetrics {
            lora: crate::LoraInfo {
                active: vec!["a".into(), "c".into()],
                max_loras: 2,
                base_model: Some("base".into()),
                ..crate::LoraInfo::default()
            },
            ..EndpointMetrics::fresh()
        });
        // Streamed: a request not yet begun counts all its tokens, so the
        // figures below do not depend on how long the test takes.
        let ask = |adapter: &str, tokens: u64| {
            InferenceRequest::builder(adapter)
                .target_model(adapter)
                .max_tokens(tokens)
                .stream(true)
                .prompt("x".repeat(40))
                .build()
        };
        let start =
            |r: InferenceRequest| Dispatch::start(Arc::clone(&s.scheduler), r, Arc::clone(e), 0.0);
        let blocked = |r: &InferenceRequest| DispatchLoad::of(&Candidate::new(e), r, 0.0);

        // The base model is not registered; an adapter is.
        drop(start(InferenceRequest::builder("base").build()));
        let first = start(ask("a", 10));
        assert_eq!(e.adapter_inflight().len(), 1);
        let b = ask("b", 10);
        let load = blocked(&b);
        assert!(load.adapter_blocked);
        assert_eq!(load.adapter_release_ms, None, "no time per token known yet");
        // 10 tokens in at least 20 ms: at least 2 ms per token.
        std::thread::sleep(Duration::from_millis(20));
        let usage = Usage {
            completion_tokens: 10,
            ..Usage::default()
        };
        first.complete(Some(&usage), RequestOutcome::Completed { status: 200 });
        assert!(e.adapter_inflight().is_empty());

        // "a" holds a place for 100 tokens more, "c" for 1,000.
        let _a = start(ask("a", 100));
        let _c = start(ask("c", 1_000));
        let soon = blocked(&b).adapter_release_ms.unwrap();
        assert!(soon >= 150.0, "{soon}");
        // Another cold adapter already waiting takes the first place.
        e.set_metrics(EndpointMetrics {
            lora: crate::LoraInfo {
                active: vec!["a".into(), "c".into()],
                waiting: vec!["d".into()],
                max_loras: 2,
                base_model: Some("base".into()),
            },
            ..EndpointMetrics::fresh()
        });
        let later = blocked(&b).adapter_release_ms.unwrap();
        assert!((8.0..12.0).contains(&(later / soon)), "{later} / {soon}");
        // A request whose adapter runs there is not blocked.
        assert_eq!(blocked(&ask("a", 5)).adapter_release_ms, None);

        // Aborted, or moved to another endpoint: no longer registered.
        let mut moved = start(ask("c", 5));
        assert_eq!(e.adapter_inflight().len(), 3);
        let other = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
        other.set_metrics(EndpointMetrics::fresh());
        assert!(moved.served_by(Arc::clone(&other)));
        assert_eq!(e.adapter_inflight().len(), 2);
        assert!(other.adapter_inflight().is_empty(), "serves no adapters");
        drop(moved);
        drop(_c);
        assert_eq!(e.adapter_inflight().len(), 1);

        // An adapter the scrape did not see running is cold, until a
        // response of ours for it streams from there.
        let d = ask("d", 10);
        assert!(blocked(&d).adapter_cold);
        let mut sent = start(ask("d", 10));
        assert!(blocked(&d).adapter_cold, "sent is not loaded");
        sent.first_body_bytes(true);
        let load = blocked(&d);
        assert!(!load.adapter_cold && !load.adapter_blocked);
        drop(sent);
        assert!(blocked(&d).adapter_cold);
    }

    /// A request counts as unanswered at its endpoint, with its uncached
    /// prompt tokens, from dispatch to its first response bytes (streamed
    /// or not), moves with `served_by` (all its prompt uncached there), and
    /// leaves when it ends without any; the next request's load reads it.
    #[test]
    fn unanswered_from_dispatch_to_the_first_bytes() {
        let s = setup();
        let e = &s.endpoint;
        let unanswered = || e.inflight().unanswered();
        let start_with = |hit: f64| {
            Dispatch::start(
                Arc::clone(&s.scheduler),
                s.request.clone(),
                Arc::clone(e),
                hit,
            )
        };
        let start = || start_with(0.0);
        let mut streamed = start();
        let mut whole = start();
        let aborted = start();
        assert_eq!(unanswered(), 3);
        assert_eq!(e.inflight().unanswered_uncached_tokens(), 30);
        // A request's load counts those before it, not itself.
        let next = start();
        assert_eq!(next.load().unanswered, 3);
        assert_eq!(next.load().unanswered_uncached_tokens, 30);
        drop(next);
        assert_eq!(unanswered(), 3, "the one just dropped left");
        streamed.first_body_bytes(true);
        streamed.first_body_bytes(true);
        assert_eq!(unanswered(), 2, "only the first bytes count");
        whole.first_body_bytes(false);
        assert_eq!(unanswered(), 1);
        drop(aborted);
        assert_eq!(unanswered(), 0);
        assert_eq!(e.inflight().unanswered_uncached_tokens(), 0);
        // Completing after the first bytes takes nothing more.
        streamed.complete(None, RequestOutcome::Completed { status: 200 });
        assert_eq!(unanswered(), 0);
        // Moved before answering: counted where it went.
        let other = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
        let mut moved = start_with(0.5);
        assert_eq!(e.inflight().unanswered_uncached_tokens(), 5);
        assert!(moved.served_by(Arc::clone(&other)));
        assert_eq!((unanswered(), other.inflight().unanswered()), (0, 1));
        assert_eq!(
            (
                e.inflight().unanswered_uncached_tokens(),
                other.inflight().unanswered_uncached_tokens()
            ),
            (0, 10)
        );
        moved.first_body_bytes(true);
        assert_eq!(other.inflight().unanswered(), 0);
        assert_eq!(other.inflight().unanswered_uncached_tokens(), 0);
        // Answered first, then moved: nothing to move.
        let mut late = start();
        late.first_body_bytes(true);
        assert!(late.served_by(Arc::clone(&other)));
        assert_eq!((unanswered(), other.inflight().unanswered()), (0, 0));
        drop((whole, late));
        // More answers than waits never wrap around.
        e.inflight().answered(7);
        assert_eq!(unanswered(), 0);
        assert_eq!(e.inflight().unanswered_uncached_tokens(), 0);
    }

    #[test]
    fn counts_from_dispatch_until_complete_then_runs_hooks_once() {
        let s = setup();
        let endpoint = &s.endpoint;
        assert_eq!(endpoint.inflight().requests(), 0);

        let dispatch = s.result.dispatch(s.scheduler, s.request).unwrap();
        let sample = endpoint.inflight().sample();
        assert_eq!(
            (sample.requests, sample.tokens, sample.uncached_tokens),
            (1, 10, 10)
        );

        let back = dispatch.complete(None, RequestOutcome::Completed { status: 200 });
        assert_eq!(back.model, "m");
        assert_eq!(endpoint.inflight().sample(), Default::default());
        assert_eq!(
            *s.log.0.lock().unwrap(),
            [RequestOutcome::Completed { status: 200 }]
        );
    }

    /// Predicts 42 ms to the first token and 3 ms per token for every
    /// candidate.
    #[derive(Debug)]
    struct Predicting;
    impl Plugin for Predicting {
        fn type_name(&self) -> &str {
            "predicting"
        }
        fn name(&self) -> &str {
            "predicting"
        }
        fn as_data_producer(&self) -> Option<&dyn crate::DataProducer> {
            Some(self)
        }
    }
    impl crate::DataProducer for Predicting {
        fn produce(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) {
            for c in candidates {
                let p = LatencyPrediction::new(42.0, Some(3.0), crate::LatencySlo::default());
                cx.state.latency.set(c.id(), p);
            }
        }
    }

    #[test]
    fn the_response_is_told_the_prediction_its_endpoint_was_picked_by() {
        let s = setup();
        assert_eq!(s.result.primary_prediction, None, "no predictor ran");
        let scheduler = Arc::new(
            Arc::into_inner(s.scheduler)
                .unwrap()
                .with_hooks([PluginRef::new(Arc::new(Predicting))]),
        );
        let snapshot = EndpointSnapshot::new(vec![Arc::clone(&s.endpoint)]);
        let result = scheduler.schedule(&s.request, &snapshot).unwrap();
        let predicted = result.primary_prediction.expect("the pick's prediction");
        assert_eq!((predicted.ttft_ms, predicted.tpot_ms), (42.0, 3.0));

        let dispatch = result
            .dispatch(Arc::clone(&scheduler), s.request.clone())
            .unwrap();
        dispatch.complete(None, RequestOutcome::Completed { status: 200 });
        // Served elsewhere than picked: the prediction was not for it.
        let mut moved = result.dispatch(scheduler, s.request).unwrap();
        let other = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
        assert!(moved.served_by(other));
        moved.complete(None, RequestOutcome::Completed { status: 200 });
        let told: Vec<_> = s
            .log
            .1
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.predicted)
            .collect();
        assert_eq!(told, [Some(predicted), None]);
    }

    fn counts(e: &Endpoint) -> (u32, u64, u64) {
        let s = e.inflight().sample();
        (s.requests, s.tokens, s.uncached_tokens)
    }

    const LLM_D: InflightAccounting = InflightAccounting {
        release_prompt_at_first_token: true,
        output: None,
    };

    #[test]
    fn by_default_the_prompt_counts_until_the_response_ends() {
        let s = setup();
        assert_eq!(
            s.scheduler.inflight_accounting(),
            InflightAccounting::default()
        );
        let mut dispatch = s.result.dispatch(s.scheduler, s.request).unwrap();
        dispatch.first_body_bytes(true);
        assert_eq!(counts(&s.endpoint), (1, 10, 10));
        dispatch.complete(None, RequestOutcome::Completed { status: 200 });
        assert_eq!(counts(&s.endpoint), (0, 0, 0));
    }

    #[test]
    fn a_streamed_prompt_can_leave_the_counts_at_its_first_token() {
        let s = setup_with(&[LLM_D]);
        let mut streamed = s
            .result
            .dispatch(Arc::clone(&s.scheduler), s.request.clone())
            .unwrap();
        let mut whole = s.result.dispatch(s.scheduler, s.request).unwrap();
        assert_eq!(counts(&s.endpoint), (2, 20, 20));
        streamed.first_body_bytes(true);
        assert_eq!(counts(&s.endpoint), (2, 10, 10), "the streamed prompt left");
        streamed.first_body_bytes(true);
        assert_eq!(counts(&s.endpoint), (2, 10, 10), "once");
        whole.first_body_bytes(false);
        assert_eq!(
            counts(&s.endpoint),
            (2, 10, 10),
            "a response not streamed keeps its prompt to the end"
        );
        streamed.complete(None, RequestOutcome::Completed { status: 200 });
        assert_eq!(counts(&s.endpoint), (1, 10, 10));
        drop(whole);
        assert_eq!(counts(&s.endpoint), (0, 0, 0));
    }

    #[test]
    fn an_output_estimate_counts_until_the_end_and_follows_a_fallback() {
        let estimate = |ratio: f64, max: Option<u64>| InflightAccounting {
            release_prompt_at_first_token: true,
            output: Some(OutputEstimate { ratio, max }),
        };
        // 10 prompt tokens, ratio 1.5: 15 more.
        let s = setup_with(&[estimate(1.5, None), LLM_D]);
        let fallback = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
        let mut dispatch = s.result.dispatch(s.scheduler, s.request).unwrap();
        assert_eq!(
            counts(&s.endpoint),
            (1, 25, 25),
            "the first declaration holds"
        );
        dispatch.first_body_bytes(true);
        assert_eq!(counts(&s.endpoint), (1, 15, 15));
        assert!(dispatch.served_by(Arc::clone(&fallback)));
        assert_eq!(counts(&s.endpoint), (0, 0, 0));
        assert_eq!(counts(&fallback), (1, 15, 15));
        dispatch.complete(None, RequestOutcome::Completed { status: 200 });
        assert_eq!(counts(&fallback), (0, 0, 0));

        // The request's own cap, then the estimate's, bound it.
        let s = setup_with(&[estimate(1.5, Some(3))]);
        let mut request = s.request.clone();
        request.max_tokens = Some(4);
        let a = s
            .result
            .dispatch(Arc::clone(&s.scheduler), s.request)
            .unwrap();
        assert_eq!(counts(&s.endpoint), (1, 13, 13));
        drop(a);
        let s = setup_with(&[estimate(1.5, None)]);
        let _b = s
            .result
            .dispatch(Arc::clone(&s.scheduler), request)
            .unwrap();
        assert_eq!(counts(&s.endpoint), (1, 14, 14));
    }

    #[test]
    fn a_fallback_before_the_first_token_moves_the_prompt_as_uncached() {
        let s = setup_with(&[LLM_D]);
        let fallback = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
        let mut dispatch = s.result.dispatch(s.scheduler, s.request).unwrap();
        assert!(dispatch.served_by(Arc::clone(&fallback)));
        assert_eq!(counts(&fallback), (1, 10, 10));
        dispatch.first_body_bytes(true);
        assert_eq!(counts(&fallback), (1, 0, 0));
        drop(dispatch);
        assert_eq!(counts(&fallback), (0, 0, 0));
    }

    #[test]
    fn output_estimates_round_and_take_the_smallest_cap() {
        let e = |ratio: f64, max: Option<u64>| OutputEstimate { ratio, max };
        assert_eq!(e(1.5, None).tokens(5, None), 8, "7.5 rounds up");
        assert_eq!(e(1.5, None).tokens(5, Some(6)), 6);
        assert_eq!(e(1.5, Some(4)).tokens(5, Some(6)), 4);
        assert_eq!(e(0.0, None).tokens(1_000, None), 0);
        assert_eq!(e(f64::NAN, None).tokens(1_000, None), 0);
        assert_eq!(e(1e300, None).tokens(1_000, None), OutputEstimate::CEILING);
    }

    #[test]
    fn dropping_a_dispatch_releases_it_as_aborted() {
        let s = setup();
        let (endpoint, log) = (&s.endpoint, &s.log);
        let a = s
            .result
            .dispatch(Arc::clone(&s.scheduler), s.request.clone())
            .unwrap();
        let b = s.result.dispatch(s.scheduler, s.request).unwrap();
        assert_eq!(endpoint.inflight().requests(), 2);
        drop(a);
        assert_eq!(endpoint.inflight().requests(), 1);
        drop(b);
        assert_eq!(endpoint.inflight().sample(), Default::default());
        assert_eq!(
            *log.0.lock().unwrap(),
            [RequestOutcome::Aborted, RequestOutcome::Aborted]
        );
    }

    #[test]
    fn a_fallback_moves_the_counts_to_the_endpoint_that_served() {
        let s = setup();
        let fallback = Arc::new(Endpoint::new(1, "10.0.0.2:8000".parse().unwrap()));
        let mut dispatch = s.result.dispatch(s.scheduler, s.request).unwrap();
        assert!(
            !dispatch.served_by(Arc::clone(&s.endpoint)),
            "the pick served"
        );
        assert!(dispatch.served_by(Arc::clone(&fallback)));
        assert_eq!(s.endpoint.inflight().sample(), Default::default());
        let sample = fallback.inflight().sample();
        assert_eq!(
            (sample.requests, sample.tokens, sample.uncached_tokens),
            (1, 10, 10),
            "nothing assumed cached on the fallback"
        );
        assert_eq!(dispatch.endpoint().addr(), fallback.addr());
        dispatch.complete(None, RequestOutcome::Completed { status: 200 });
        assert_eq!(fallback.inflight().sample(), Default::default());
        assert_eq!(s.endpoint.inflight().sample(), Default::default());
    }

    #[test]
    fn a_completed_response_reports_its_timing_and_the_load_at_dispatch() {
        let s = setup();
        s.endpoint.set_metrics(EndpointMetrics {
            waiting: 3,
            running: 5,
            ..EndpointMetrics::fresh()
        });
        // Another request already in flight since the scrape.
        s.endpoint.inflight().start_with(1, 1);
        let mut dispatch = s
            .result
            .dispatch(Arc::clone(&s.scheduler), s.request.clone())
            .unwrap();
        assert_eq!(dispatch.load().dispatched, 1, "not counting itself");
        std::thread::sleep(std::time::Duration::from_millis(2));
        dispatch.first_body_bytes(true);
        dispatch.first_body_bytes(false);
        let usage = Usage {
            completion_tokens: 7,
            ..Usage::default()
        };
        dispatch.complete(Some(&usage), RequestOutcome::Completed { status: 200 });
        let timings = s.log.1.lock().unwrap().clone();
        assert_eq!(timings.len(), 1);
        let t = timings[0];
        assert_eq!(
            (t.load.waiting, t.load.running, t.load.dispatched),
            (3, 5, 1)
        );
        assert_eq!((t.load.prompt_tokens, t.load.uncached_tokens), (10, 10));
        assert!(t.streamed, "the first call decides");
        assert_eq!((t.output_tokens, t.status), (Some(7), 200));
        let first = t.first_byte.unwrap();
        assert!(first >= std::time::Duration::from_millis(2) && first <= t.total);

        // An aborted request teaches nothing.
        drop(s.result.dispatch(s.scheduler, s.request).unwrap());
        assert_eq!(s.log.1.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_result_without_a_target_dispatches_nothing() {
        let empty = SchedulingResult::default();
        let err = empty
            .dispatch(setup().scheduler, InferenceRequest::builder("m").build())
            .unwrap_err();
        assert_eq!(err, SchedulingError::NoEndpoints);
    }
}
