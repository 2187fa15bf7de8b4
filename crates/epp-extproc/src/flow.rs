//! Flow control at the edge: a prepared request enters the
//! [`FlowController`] and the exchange holds its [`Waiting`] (a future the
//! stream polls before reading Envoy's next message) until it is released
//! (then routed), refused (429/503), or its TTL runs out (503). A stream
//! that ends while its request waits drops the ticket: the request leaves
//! the queue at once, counted as cancelled.
//!
//! Wake-ups are events, never polling: a request enqueued, routed or
//! completed ([`FlowKick`]), and every scrape ([`epp_core::flow::MetricsListener`]
//! on the service) kick the controller; a waiting request sleeps on its
//! ticket's waker and, when it has a TTL, on one timer.

use std::{
    fmt,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError, Weak},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use epp_core::{
    FOLDED_LABEL, PrefixLookup, PrefixLookupFuture,
    flow::{
        FlowController, FlowObserver, FlowRequest, InFlight, Outcome, PoolGauge, Rejected, Release,
        Ticket,
    },
};

use crate::{
    ExtProcService,
    decision::{Decider, Prepared},
    error::ExtProcError,
};

/// Header with the time budget (ms) the gateway gives the request; a queued
/// request does not wait longer.
pub const EXPECTED_TIMEOUT_HEADER: &str = "x-envoy-expected-rq-timeout-ms";

/// The pool's saturation as the current scheduler's detector reads it.
pub(crate) struct DeciderGauge(pub(crate) Weak<Decider>);

impl fmt::Debug for DeciderGauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeciderGauge")
    }
}

impl PoolGauge for DeciderGauge {
    fn saturation(&self) -> Option<f64> {
        let d = self.0.upgrade()?;
        let snapshot = d.endpoints.snapshot();
        d.scheduler.load().pool_saturation(&snapshot)
    }
}

/// The controllers of the service: the current one, and those a config
/// reload replaced while requests still waited in them (kicked too until
/// they drain).
#[derive(Debug, Default)]
pub(crate) struct Controllers {
    current: arc_swap::ArcSwapOption<FlowController>,
    draining: Mutex<Vec<Weak<FlowController>>>,
}

impl Controllers {
    pub(crate) fn current(&self) -> Option<Arc<FlowController>> {
        self.current.load_full()
    }

    pub(crate) fn replace(&self, next: Option<Arc<FlowController>>) {
        if let Some(old) = self.current.swap(next) {
            self.draining
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Arc::downgrade(&old));
        }
    }

    /// Tells every live controller something changed.
    pub(crate) fn kick(&self) {
        if let Some(c) = self.current.load().as_ref() {
            c.kick();
        }
        let mut draining = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        if draining.is_empty() {
            return;
        }
        draining.retain(|w| match w.upgrade() {
            Some(c) if !c.is_empty() => {
                c.kick();
                true
            }
            _ => false,
        });
    }
}

/// Kicks the flow controller when dropped: held by a routed request until
/// its response completes (its endpoint has a slot free again). A request
/// released from the queue also counts in its flow's requests in flight
/// until then.
pub(crate) struct FlowKick {
    fc: Arc<FlowController>,
    in_flight: Option<InFlight>,
}

impl FlowKick {
    pub(crate) fn new(fc: Arc<FlowController>) -> Self {
        Self {
            fc,
            in_flight: None,
        }
    }

    /// Keeps the request counted in its flow's requests in flight.
    pub(crate) fn hold(&mut self, in_flight: Option<InFlight>) {
        self.in_flight = in_flight;
    }
}

impl fmt::Debug for FlowKick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FlowKick")
    }
}

impl Drop for FlowKick {
    fn drop(&mut self) {
        // Out of flight first, so that the kick sees the flow's new count
        // (its controller may have been replaced by a reload meanwhile).
        drop(self.in_flight.take());
        self.fc.kick();
    }
}

/// A request waiting in flow control, or held by a plugin before it is
/// scheduled ([`epp_core::RequestHold`]).
pub(crate) struct Waiting {
    prepared: Option<Prepared>,
    ticket: Option<Ticket>,
    ttl: Option<Duration>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A plugin's hold: ready when it elapses.
    hold: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The prompt being rendered to token ids (first, before anything else).
    render: Option<epp_core::RenderFuture>,
    /// The lookup to start once rendered (in a shared prefix index).
    then_lookup: Option<Arc<dyn PrefixLookup>>,
    /// That lookup, running.
    lookup: Option<PrefixLookupFuture>,
}

impl fmt::Debug for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiting")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// How a wait ended.
pub(crate) enum Waited {
    /// Released: route it, then drop the release.
    Released(Prepared, Release),
    /// Evicted (TTL): answer with the error.
    Evicted(Prepared, ExtProcError),
    /// A plugin's hold elapsed: route it.
    Held(Prepared),
    /// Its prompt was rendered (or the render failed), and looked up in a
    /// shared prefix index when one is configured: it goes on to any hold
    /// and flow control.
    Rendered(Prepared),
}

impl Waiting {
    /// `prepared`, waiting for nothing yet.
    fn bare(prepared: Prepared) -> Self {
        Self {
            prepared: Some(prepared),
            ticket: None,
            ttl: None,
            timer: None,
            hold: None,
            render: None,
            then_lookup: None,
            lookup: None,
        }
    }

    /// `prepared`, held until `until` (outside flow control).
    pub(crate) fn held(prepared: Prepared, until: Instant) -> Self {
        Self {
            hold: Some(Box::pin(tokio::time::sleep_until(
                tokio::time::Instant::from_std(until),
            ))),
            ..Self::bare(prepared)
        }
    }

    /// `prepared`, waiting for its prompt's token ids, then for `lookup`'s
    /// answer if there is one to ask.
    pub(crate) fn rendering(
        prepared: Prepared,
        render: epp_core::RenderFuture,
        lookup: Option<Arc<dyn PrefixLookup>>,
    ) -> Self {
        Self {
            render: Some(render),
            then_lookup: lookup,
            ..Self::bare(prepared)
        }
    }

    /// `prepared`, waiting for a shared prefix index's answer.
    pub(crate) fn looking_up(prepared: Prepared, lookup: PrefixLookupFuture) -> Self {
        Self {
            lookup: Some(lookup),
            ..Self::bare(prepared)
        }
    }

    /// Ready when the request is released or its TTL ran out (or, held,
    /// when the hold elapsed).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Waited> {
        if let Some(render) = self.render.as_mut() {
            let Poll::Ready(rendered) = render.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            self.render = None;
            let Some(mut prepared) = self.prepared.take() else {
                return Poll::Pending;
            };
            match rendered {
                Ok(rendered) => {
                    prepared.request.prompt_token_ids = Some(rendered.token_ids);
                    prepared.request.media_items = rendered.media;
                }
                Err(e) => render_failed(&prepared.request.request_id, &e),
            }
            match self
                .then_lookup
                .take()
                .and_then(|l| l.lookup(&prepared.request))
            {
                Some(lookup) => {
                    self.prepared = Some(prepared);
                    self.lookup = Some(lookup);
                }
                None => return Poll::Ready(Waited::Rendered(prepared)),
            }
        }
        if let Some(lookup) = self.lookup.as_mut() {
            let Poll::Ready(answer) = lookup.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            self.lookup = None;
            let Some(mut prepared) = self.prepared.take() else {
                return Poll::Pending;
            };
            prepared.request.shared_prefix = Some(answer);
            return Poll::Ready(Waited::Rendered(prepared));
        }
        if let Some(hold) = self.hold.as_mut() {
            if hold.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.hold = None;
            return match self.prepared.take() {
                Some(prepared) => Poll::Ready(Waited::Held(prepared)),
                None => Poll::Pending,
            };
        }
        let Some(ticket) = self.ticket.as_mut() else {
            return Poll::Pending;
        };
        if let Poll::Ready(release) = ticket.poll_release(cx) {
            return self.finish(Ok(release));
        }
        let Some(ttl) = self.ttl else {
            return Poll::Pending;
        };
        let enqueued = ticket.enqueued();
        let timer = self.timer.get_or_insert_with(|| {
            Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                enqueued + ttl,
            )))
        });
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let Some(ticket) = self.ticket.take() else {
            return Poll::Pending;
        };
        match ticket.expire() {
            Err(release) => self.finish(Ok(release)),
            Ok(outcome) => self.finish(Err(outcome)),
        }
    }

    fn finish(&mut self, how: Result<Release, Outcome>) -> Poll<Waited> {
        self.ticket = None;
        let Some(prepared) = self.prepared.take() else {
            return Poll::Pending;
        };
        Poll::Ready(match how {
            Ok(release) => Waited::Released(prepared, release),
            Err(outcome) => Waited::Evicted(prepared, ExtProcError::FlowControl(outcome)),
        })
    }
}

/// Logs a failed render: each at debug, and a warning at most once a
/// minute (a dead render service fails every request).
fn render_failed(request_id: &str, error: &str) {
    static LAST_WARNING: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    tracing::debug!(request_id, error, "the prompt could not be rendered");
    let mut last = LAST_WARNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
        *last = Some(Instant::now());
        tracing::warn!(
            request_id,
            error,
            "the prompt could not be rendered; requests are scheduled without token ids \
             (warned at most once a minute)"
        );
    }
}

impl ExtProcService {
    /// Turns flow control on with `settings` (`None`: off). Requests
    /// already waiting stay in the controller they entered and are served
    /// from it; new ones enter the new one.
    pub fn set_flow_control(&self, settings: Option<epp_core::flow::FlowSettings>) {
        let next = settings.map(|s| {
            FlowController::new(
                s,
                Arc::new(DeciderGauge(Arc::downgrade(&self.decider))),
                Some(Arc::clone(&self.decider.flow_metrics) as Arc<dyn FlowObserver>),
            )
        });
        self.decider.flow.replace(next);
    }

    /// Requests waiting in flow control now (0 when it is off).
    #[must_use]
    pub fn flow_queued(&self) -> usize {
        self.decider.flow.current().map_or(0, |c| c.len())
    }
}

/// A scrape stored new metrics: a queued request may fit now.
impl epp_core::flow::MetricsListener for ExtProcService {
    fn metrics_updated(&self) {
        self.decider.flow.kick();
    }
}

/// What admission into flow control gave.
pub(crate) enum Admitted {
    /// Not queued (flow control off): route now.
    Now(Prepared),
    /// Refused at the door.
    Refused(Prepared, ExtProcError),
    /// Queued.
    Queued(Waiting),
}

impl Decider {
    /// Puts `prepared` into the flow controller, if one runs. `received`
    /// is when the exchange began.
    pub(crate) fn admit(&self, prepared: Prepared, received: Instant) -> Admitted {
        let Some(fc) = self.flow.current() else {
            return Admitted::Now(prepared);
        };
        let request = &prepared.request;
        let millis = |name: &str| {
            request
                .header(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        let flow_request = FlowRequest {
            fairness_id: &request.fairness_id,
            priority: request.priority,
            bytes: request.body_len as u64,
            received,
            deadline: millis(EXPECTED_TIMEOUT_HEADER).filter(|d| !d.is_zero()),
            slo_ttft: millis(epp_core::TTFT_SLO_HEADER)
                .or_else(|| millis(epp_core::LEGACY_TTFT_SLO_HEADER)),
            tag: self
                .flow_metrics
                .models_tag(&request.model, &request.target_model),
        };
        let ttl = fc.ttl_for(&flow_request);
        match fc.enqueue(&flow_request, ttl) {
            Ok(ticket) => Admitted::Queued(Waiting {
                ticket: Some(ticket),
                ttl,
                ..Waiting::bare(prepared)
            }),
            Err(Rejected(outcome)) => {
                Admitted::Refused(prepared, ExtProcError::FlowControl(outcome))
            }
        }
    }
}

/// The `fairness_id` label of every id past the cap
/// ([`epp_core::MAX_LABEL_VALUES`] distinct ids).
pub const FOLDED_FAIRNESS_ID: &str = FOLDED_LABEL;
