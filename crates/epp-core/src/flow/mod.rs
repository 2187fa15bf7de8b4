//! Flow control: requests wait in priority bands in front of the scheduler
//! while the pool is saturated, and are released one at a time as it frees.
//!
//! A request is enqueued under its flow key (fairness id, priority) and
//! gets a [`Ticket`]. Dispatch is event-driven: the controller looks for a
//! request to release only when told something changed ([`FlowController::kick`]:
//! a request enqueued, routed or completed, a new scrape) — never on a timer.
//! A release walks the bands from the highest priority down, stopping at the
//! first whose usage-limit ceiling the pool's saturation reaches; it takes
//! the first non-empty band before that, the flow its fairness policy
//! names, and that flow's head under its ordering policy, then wakes the
//! ticket's waker. Ceilings are computed over every band the controller
//! knows (configured, priority 0, and any made for another priority), as
//! llm-d does.
//!
//! At most one request is released and not yet routed at a time: the next
//! release waits until the previous one has been scheduled (its [`Release`]
//! is dropped), so the saturation it is judged by already counts the
//! previous request. The crate is runtime-agnostic: a ticket is polled like a
//! future by whoever holds it; TTL timers belong to the caller
//! ([`Ticket::expire`]).

mod policy;
mod settings;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

pub use policy::{
    FairnessCursor, FairnessPolicy, FlowHead, OrderKey, OrderingPolicy, QueuedItem,
    UsageLimitPolicy, nanos_since,
};
pub use settings::{
    ACTIVE_FLOW_WINDOW, BandSettings, DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS,
    DEFAULT_REQUEST_TTL, FlowSettings,
};

/// Fairness id of requests that name none.
pub const DEFAULT_FLOW_ID: &str = "default-flow";

/// How a request's time in flow control ended (llm-d's `QueueOutcome`; the
/// `outcome` label of the flow-control metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Released to the scheduler.
    Dispatched,
    /// Refused at enqueue: its band or the whole queue is full (429).
    RejectedCapacity,
    /// Refused at enqueue while the pool has no endpoints (503).
    RejectedNoEndpoints,
    /// Waited longer than its TTL (503).
    EvictedTtl,
    /// Waited longer than `noEndpointRequestTTL` while the pool had no
    /// endpoints (503).
    EvictedNoEndpoints,
    /// The client or the gateway went away while it waited.
    EvictedContextCancelled,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Self; 6] = [
        Self::Dispatched,
        Self::RejectedCapacity,
        Self::RejectedNoEndpoints,
        Self::EvictedTtl,
        Self::EvictedNoEndpoints,
        Self::EvictedContextCancelled,
    ];

    /// llm-d's label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dispatched => "Dispatched",
            Self::RejectedCapacity => "RejectedCapacity",
            Self::RejectedNoEndpoints => "RejectedNoEndpoints",
            Self::EvictedTtl => "EvictedTTL",
            Self::EvictedNoEndpoints => "EvictedNoEndpoints",
            Self::EvictedContextCancelled => "EvictedContextCancelled",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pool's load as flow control needs it.
pub trait PoolGauge: Send + Sync + fmt::Debug {
    /// Saturation now (`>= 1.0`: saturated; the saturation detector's
    /// answer), or `None` when the pool has no endpoint.
    fn saturation(&self) -> Option<f64>;
}

/// Told of queue changes (metrics). Called under the controller's lock:
/// must be quick and must not call the controller.
///
/// Each event names the request's flow (fairness id, priority) and the
/// request's [`FlowRequest::tag`], which the controller keeps and hands
/// back untouched (the observer's own handle on labels the controller does
/// not know, such as the request's model).
pub trait FlowObserver: Send + Sync + fmt::Debug {
    /// A flow's queue changed by `requests` and `bytes` (negative: left),
    /// by a request tagged `tag`.
    fn queue_changed(&self, fairness_id: &str, priority: i32, tag: u64, requests: i64, bytes: i64);
    /// A request's time in flow control ended after `waited`.
    fn finished(
        &self,
        fairness_id: &str,
        priority: i32,
        tag: u64,
        outcome: Outcome,
        waited: Duration,
    );
    /// Enqueueing a request took `took`: it is queued (`refused: None`;
    /// it may be released at once after), or was refused at the door.
    fn enqueued(
        &self,
        fairness_id: &str,
        priority: i32,
        tag: u64,
        refused: Option<Outcome>,
        took: Duration,
    );
    /// One dispatch cycle (a look for a request to release, made while
    /// some wait and none is being routed) took `took`.
    fn dispatch_cycle(&self, took: Duration);
}

/// Something that wants to hear that endpoint metrics were refreshed (the
/// data layer calls it after each scrape).
pub trait MetricsListener: Send + Sync + fmt::Debug {
    /// New metrics were stored for an endpoint.
    fn metrics_updated(&self);
}

/// A request asking to enter flow control.
#[derive(Debug, Clone, Copy)]
pub struct FlowRequest<'a> {
    /// Fairness id ([`DEFAULT_FLOW_ID`] when the request names none).
    pub fairness_id: &'a str,
    /// Priority (from its objective; higher is more important).
    pub priority: i32,
    /// Body size in bytes (counted against `maxBytes`).
    pub bytes: u64,
    /// When the picker received it.
    pub received: Instant,
    /// Its own deadline, measured from `received`, if it carries one.
    pub deadline: Option<Duration>,
    /// Its time-to-first-token objective, if any.
    pub slo_ttft: Option<Duration>,
    /// Handed back to the observer with each of its events
    /// ([`FlowObserver`]); 0 when unused.
    pub tag: u64,
}

/// Where a queued request sits.
#[derive(Debug)]
struct Place {
    priority: i32,
    flow: Arc<str>,
    key: (u64, u64, u64),
}

/// The flow a released request counts in while it is in flight.
#[derive(Debug, Clone)]
struct FlowKey {
    /// Its band's key in [`State::bands`].
    band: i64,
    flow: Arc<str>,
}

#[derive(Debug)]
enum SlotState {
    Free,
    Queued(Place),
    /// Released, its [`Release`] not yet taken by the ticket's holder.
    Released(FlowKey),
    /// Finished (taken, evicted or cancelled); freed when the ticket drops.
    Done,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    state: SlotState,
    waker: Option<Waker>,
    bytes: u64,
    enqueued: Instant,
    /// The request's [`FlowRequest::tag`].
    tag: u64,
}

#[derive(Debug, Default)]
struct Flow {
    /// (order key, arrival sequence) → slot.
    queue: BTreeMap<(u64, u64, u64), u32>,
    bytes: u64,
}

/// What a flow has out of the queue: requests in flight and when the
/// last was released (for [`BandSettings::busiest_flow_ceiling`]).
#[derive(Debug, Clone, Copy)]
struct Activity {
    in_flight: u32,
    last_release: Instant,
}

#[derive(Debug)]
struct Band {
    settings: Arc<BandSettings>,
    /// Flows with requests queued.
    flows: BTreeMap<Arc<str>, Flow>,
    /// With [`BandSettings::busiest_flow_ceiling`] set: flows with requests
    /// released from this band and not yet finished ([`InFlight`]), or
    /// released within the active-flow window (kept at most two windows).
    active: BTreeMap<Arc<str>, Activity>,
    /// When `active` was last rid of flows no longer active.
    swept: Instant,
    len: usize,
    bytes: u64,
    cursor: FairnessCursor,
}

impl Band {
    fn new(settings: Arc<BandSettings>) -> Self {
        Self {
            settings,
            flows: BTreeMap::new(),
            active: BTreeMap::new(),
            swept: Instant::now(),
            len: 0,
            bytes: 0,
            cursor: FairnessCursor::default(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Keyed by `-priority`: iteration is highest priority first.
    bands: BTreeMap<i64, Band>,
    len: usize,
    bytes: u64,
    seq: u64,
    /// A request was released and has not been routed yet.
    releasing: bool,
    priorities: Vec<i32>,
    ceilings: Vec<f64>,
}

/// The flow controller: bands of flows of queued requests. See the module
/// documentation.
pub struct FlowController {
    settings: FlowSettings,
    gauge: Arc<dyn PoolGauge>,
    observer: Option<Arc<dyn FlowObserver>>,
    epoch: Instant,
    state: Mutex<State>,
}

impl fmt::Debug for FlowController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("FlowController")
            .field("queued", &st.len)
            .field("bytes", &st.bytes)
            .field("releasing", &st.releasing)
            .finish_non_exhaustive()
    }
}

/// What the queues hold now, against their limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowUsage {
    /// Requests queued over every band (released ones not counted).
    pub requests: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Each band the controller knows, highest priority first.
    pub bands: Vec<BandUsage>,
}

/// What one priority band holds now, against its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandUsage {
    /// The band's priority.
    pub priority: i32,
    /// Requests queued in it.
    pub requests: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Requests it may hold (0: no limit).
    pub max_requests: u64,
    /// Bytes it may hold (0: no limit).
    pub max_bytes: u64,
}

/// Why a request was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected(pub Outcome);

impl FlowController {
    /// A controller with `settings`, judging the pool by `gauge` and telling
    /// `observer` (metrics) of every change.
    #[must_use]
    pub fn new(
        settings: FlowSettings,
        gauge: Arc<dyn PoolGauge>,
        observer: Option<Arc<dyn FlowObserver>>,
    ) -> Arc<Self> {
        let mut state = State::default();
        let known = settings
            .bands
            .keys()
            .copied()
            .chain(std::iter::once(0))
            .collect::<Vec<_>>();
        for priority in known {
            state
                .bands
                .entry(-i64::from(priority))
                .or_insert_with(|| Band::new(settings.band_for(priority)));
        }
        Arc::new(Self {
            settings,
            gauge,
            observer,
            epoch: Instant::now(),
            state: Mutex::new(state),
        })
    }

    /// The settings.
    #[must_use]
    pub fn settings(&self) -> &FlowSettings {
        &self.settings
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests queued now (released ones not counted).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// Whether nothing is queued.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What every band holds now, against its limits.
    #[must_use]
    pub fn usage(&self) -> FlowUsage {
        let st = self.lock();
        FlowUsage {
            requests: st.len as u64,
            bytes: st.bytes,
            bands: st
                .bands
                .values()
                .map(|b| BandUsage {
                    priority: b.settings.priority,
                    requests: b.len as u64,
                    bytes: b.bytes,
                    max_requests: b.settings.max_requests,
                    max_bytes: b.settings.max_bytes,
                })
                .collect(),
        }
    }

    /// The pool's saturation as dispatch reads it (`None`: the pool has no
    /// endpoint; nothing is released).
    #[must_use]
    pub fn saturation(&self) -> Option<f64> {
        self.gauge.saturation()
    }

    /// The TTL a request gets: the configured one (`noEndpointRequestTTL`
    /// instead while the pool has no endpoint), shortened to the request's
    /// own deadline. `None`: it may wait until it goes away.
    #[must_use]
    pub fn ttl_for(&self, request: &FlowRequest<'_>) -> Option<Duration> {
        let configured = if self.gauge.saturation().is_none() {
            self.settings.no_endpoint_ttl
        } else {
            self.settings.default_ttl
        };
        let own = request
            .deadline
            .map(|d| d.saturating_sub(request.received.elapsed()));
        match (configured, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Queues `request` (then looks for a request to release: it may be
    /// this one, ready at its ticket's first poll).
    ///
    /// # Errors
    /// Its band or the whole queue would exceed `maxRequests` or `maxBytes`:
    /// [`Outcome::RejectedCapacity`] ([`Outcome::RejectedNoEndpoints`] while
    /// the pool has no endpoint).
    pub fn enqueue(
        self: &Arc<Self>,
        request: &FlowRequest<'_>,
        ttl: Option<Duration>,
    ) -> Result<Ticket, Rejected> {
        let now = Instant::now();
        let band_settings = self.settings.band_for(request.priority);
        let item = QueuedItem {
            received: request.received,
            enqueued: now,
            ttl,
            slo_ttft: request.slo_ttft,
            bytes: request.bytes,
        };
        let key = match band_settings.ordering.plugin().as_ordering_policy() {
            Some(o) => o.order_key(&item, self.epoch),
            None => (nanos_since(self.epoch, now), 0),
        };
        let mut guard = self.lock();
        let band_key = -i64::from(request.priority);
        let (band_len, band_bytes) = guard
            .bands
            .get(&band_key)
            .map_or((0, 0), |b| (b.len, b.bytes));
        let over = |max: u64, have: u64, add: u64| max > 0 && have.saturating_add(add) > max;
        if over(band_settings.max_requests, band_len as u64, 1)
            || over(band_settings.max_bytes, band_bytes, request.bytes)
            || over(self.settings.max_requests, guard.len as u64, 1)
            || over(self.settings.max_bytes, guard.bytes, request.bytes)
        {
            drop(guard);
            let outcome = if self.gauge.saturation().is_none() {
                Outcome::RejectedNoEndpoints
            } else {
                Outcome::RejectedCapacity
            };
            if let Some(o) = &self.observer {
                o.enqueued(
                    request.fairness_id,
                    request.priority,
                    request.tag,
                    Some(outcome),
                    now.elapsed(),
                );
                o.finished(
                    request.fairness_id,
                    request.priority,
                    request.tag,
                    outcome,
                    Duration::ZERO,
                );
            }
            return Err(Rejected(outcome));
        }
        let st = &mut *guard;
        st.seq += 1;
        let seq = st.seq;
        let (slot, generation) = match st.free.pop() {
            Some(i) => (i, st.slots[i as usize].generation),
            None => {
                st.slots.push(Slot {
                    generation: 0,
                    state: SlotState::Free,
                    waker: None,
                    bytes: 0,
                    enqueued: now,
                    tag: 0,
                });
                (u32::try_from(st.slots.len() - 1).unwrap_or(u32::MAX), 0)
            }
        };
        let band = st
            .bands
            .entry(band_key)
            .or_insert_with(|| Band::new(Arc::clone(&band_settings)));
        let flow_id: Arc<str> = match band.flows.get_key_value(request.fairness_id) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(request.fairness_id),
        };
        let full_key = (key.0, key.1, seq);
        let flow = band.flows.entry(Arc::clone(&flow_id)).or_default();
        flow.queue.insert(full_key, slot);
        flow.bytes += request.bytes;
        band.len += 1;
        band.bytes += request.bytes;
        st.len += 1;
        st.bytes += request.bytes;
        let s = &mut st.slots[slot as usize];
        s.state = SlotState::Queued(Place {
            priority: request.priority,
            flow: flow_id,
            key: full_key,
        });
        s.waker = None;
        s.bytes = request.bytes;
        s.enqueued = now;
        s.tag = request.tag;
        if let Some(o) = &self.observer {
            o.queue_changed(
                request.fairness_id,
                request.priority,
                request.tag,
                1,
                i64::try_from(request.bytes).unwrap_or(i64::MAX),
            );
            o.enqueued(
                request.fairness_id,
                request.priority,
                request.tag,
                None,
                now.elapsed(),
            );
        }
        let waker = self.release_next(st);
        drop(guard);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(Ticket {
            fc: Arc::clone(self),
            slot,
            generation,
        })
    }

    /// Something changed (a request routed or completed, new metrics):
    /// releases the next request if the pool has room for it. Cheap when
    /// nothing is queued.
    pub fn kick(&self) {
        let mut st = self.lock();
        if let Some(waker) = self.release_next(&mut st) {
            drop(st);
            waker.wake();
        }
    }

    /// Releases one request if none is being routed, the pool has an
    /// endpoint, and some band's ceiling is above the saturation. Returns
    /// the released ticket's waker (to wake after unlocking).
    fn release_next(&self, st: &mut State) -> Option<Waker> {
        if st.releasing || st.len == 0 {
            return None;
        }
        let Some(observer) = &self.observer else {
            return self.dispatch_cycle(st);
        };
        let start = Instant::now();
        let waker = self.dispatch_cycle(st);
        observer.dispatch_cycle(start.elapsed());
        waker
    }

    /// One dispatch cycle of [`Self::release_next`].
    fn dispatch_cycle(&self, st: &mut State) -> Option<Waker> {
        let saturation = self.gauge.saturation()?;
        let State {
            bands,
            priorities,
            ceilings,
            slots,
            ..
        } = &mut *st;
        // As llm-d: ceilings over every band the controller knows (the
        // configured ones, priority 0, and those made for other priorities),
        // highest first; the first band whose ceiling the saturation reaches
        // stops the search (head-of-line blocking: lower bands never
        // overtake a held-back higher one).
        priorities.clear();
        priorities.extend(bands.values().map(|b| b.settings.priority));
        ceilings.clear();
        if let Some(u) = self.settings.usage_limit.plugin().as_usage_limit_policy() {
            u.ceilings(saturation, priorities, ceilings);
        }
        let mut chosen = None;
        for (i, (band_key, band)) in bands.iter_mut().enumerate() {
            let ceiling = ceilings.get(i).copied().unwrap_or(1.0);
            if saturation >= ceiling {
                break;
            }
            if band.len == 0 {
                continue;
            }
            // The clock is read only for bands that track their flows.
            let busiest = match band.settings.busiest_flow_ceiling {
                Some(c) if saturation >= c => busiest_in_flight(band, Instant::now()),
                Some(_) => {
                    let now = Instant::now();
                    if now.saturating_duration_since(band.swept) >= band.settings.active_flow_window
                    {
                        forget_inactive(band, now);
                    }
                    None
                }
                None => None,
            };
            match pick_flow(band, slots, busiest) {
                Some(flow) => {
                    chosen = Some((*band_key, flow));
                    break;
                }
                // Lower bands wait (as behind a band's own ceiling): the
                // room held back is for this band's lighter flows.
                None if busiest.is_some() => break,
                None => {}
            }
        }
        let (band_key, flow_id) = chosen?;
        let band = st.bands.get_mut(&band_key)?;
        let flow = band.flows.get_mut(&flow_id)?;
        let (_, slot) = flow.queue.pop_first()?;
        let s = &mut st.slots[slot as usize];
        let bytes = s.bytes;
        flow.bytes -= bytes;
        if flow.queue.is_empty() {
            band.flows.remove(&flow_id);
        }
        band.len -= 1;
        band.bytes -= bytes;
        if band.settings.busiest_flow_ceiling.is_some() {
            let now = Instant::now();
            let activity = band.active.entry(Arc::clone(&flow_id)).or_insert(Activity {
                in_flight: 0,
                last_release: now,
            });
            activity.in_flight += 1;
            activity.last_release = now;
        }
        st.len -= 1;
        st.bytes -= bytes;
        st.releasing = true;
        s.state = SlotState::Released(FlowKey {
            band: band_key,
            flow: Arc::clone(&flow_id),
        });
        let priority = band.settings.priority;
        if let Some(o) = &self.observer {
            o.queue_changed(
                &flow_id,
                priority,
                s.tag,
                -1,
                -i64::try_from(bytes).unwrap_or(i64::MAX),
            );
            o.finished(
                &flow_id,
                priority,
                s.tag,
                Outcome::Dispatched,
                s.enqueued.elapsed(),
            );
        }
        s.waker.take()
    }

    /// Takes a queued request out of its queue (eviction or cancellation).
    fn remove(&self, st: &mut State, slot: u32, outcome: Outcome) {
        let s = &mut st.slots[slot as usize];
        let SlotState::Queued(place) = std::mem::replace(&mut s.state, SlotState::Done) else {
            return;
        };
        let (bytes, tag) = (s.bytes, s.tag);
        let waited = s.enqueued.elapsed();
        s.waker = None;
        let band_key = -i64::from(place.priority);
        if let Some(band) = st.bands.get_mut(&band_key) {
            if let Some(flow) = band.flows.get_mut(&place.flow) {
                flow.queue.remove(&place.key);
                flow.bytes -= bytes;
                if flow.queue.is_empty() {
                    band.flows.remove(&place.flow);
                }
            }
            band.len -= 1;
            band.bytes -= bytes;
        }
        st.len -= 1;
        st.bytes -= bytes;
        if let Some(o) = &self.observer {
            o.queue_changed(
                &place.flow,
                place.priority,
                tag,
                -1,
                -i64::try_from(bytes).unwrap_or(i64::MAX),
            );
            o.finished(&place.flow, place.priority, tag, outcome, waited);
        }
    }

    /// The routing of the released request ended; `landed`: so did the
    /// request itself (it was refused, or its holder keeps no [`InFlight`]).
    fn routed(&self, landed: Option<&FlowKey>) {
        let mut st = self.lock();
        st.releasing = false;
        if let Some(key) = landed {
            land(&mut st, key);
        }
        if let Some(waker) = self.release_next(&mut st) {
            drop(st);
            waker.wake();
        }
    }

    /// A released request finished (its [`InFlight`] dropped).
    fn landed(&self, key: &FlowKey) {
        let mut st = self.lock();
        land(&mut st, key);
        if let Some(waker) = self.release_next(&mut st) {
            drop(st);
            waker.wake();
        }
    }
}

/// Counts a request of `key` out of flight.
fn land(st: &mut State, key: &FlowKey) {
    if let Some(a) = st
        .bands
        .get_mut(&key.band)
        .and_then(|b| b.active.get_mut(&key.flow))
    {
        a.in_flight = a.in_flight.saturating_sub(1);
    }
}

/// With [`BandSettings::busiest_flow_ceiling`] reached: the most requests
/// any flow of `band` has in flight, when at least one does and another
/// flow is active (queued, in flight, or released within the window);
/// flows with that many wait. Forgets flows no longer active.
fn busiest_in_flight(band: &mut Band, now: Instant) -> Option<u32> {
    forget_inactive(band, now);
    let Band { flows, active, .. } = band;
    let most = active
        .values()
        .map(|a| a.in_flight)
        .max()
        .filter(|&n| n > 0)?;
    let queued_only = flows.keys().filter(|id| !active.contains_key(*id)).count();
    (active.len() + queued_only >= 2).then_some(most)
}

/// Forgets the flows of `band` with nothing queued or in flight and no
/// release within the active-flow window.
fn forget_inactive(band: &mut Band, now: Instant) {
    let window = band.settings.active_flow_window;
    let Band {
        flows,
        active,
        swept,
        ..
    } = band;
    active.retain(|id, a| {
        a.in_flight > 0
            || flows.contains_key(id)
            || now.saturating_duration_since(a.last_release) < window
    });
    *swept = now;
}

/// Picks the flow to release from in `band` by its fairness policy, among
/// the flows with fewer than `busiest` requests in flight (`None`: all).
fn pick_flow(band: &mut Band, slots: &[Slot], busiest: Option<u32>) -> Option<Arc<str>> {
    let active = &band.active;
    let held = |id: &str| busiest.is_some_and(|n| active.get(id).is_some_and(|a| a.in_flight >= n));
    let heads: Vec<FlowHead<'_>> = band
        .flows
        .iter()
        .filter(|(id, _)| !held(id))
        .filter_map(|(id, f)| {
            let (&(a, b, _), &slot) = f.queue.first_key_value()?;
            Some(FlowHead {
                id,
                len: f.queue.len(),
                bytes: f.bytes,
                head: (a, b),
                head_enqueued: slots.get(slot as usize)?.enqueued,
            })
        })
        .collect();
    if heads.is_empty() {
        return None;
    }
    let i = match band.settings.fairness.plugin().as_fairness_policy() {
        Some(p) => p.pick(&heads, &mut band.cursor)?,
        None => 0,
    };
    heads.get(i).map(|h| Arc::clone(h.id))
}

/// A request's place in flow control. Poll it ([`Ticket::poll_release`])
/// until it is released; dropping it while queued takes the request out of
/// its queue at once, counted as [`Outcome::EvictedContextCancelled`].
#[derive(Debug)]
pub struct Ticket {
    fc: Arc<FlowController>,
    slot: u32,
    generation: u32,
}

/// The right to schedule a released request. Dropping it (after the
/// request is routed or refused) lets the controller release the next one.
#[derive(Debug)]
#[must_use = "the next request is released when this is dropped"]
pub struct Release {
    fc: Arc<FlowController>,
    /// Its flow, until [`Release::in_flight`] takes it.
    key: Option<FlowKey>,
}

impl Release {
    /// The request's place among its flow's requests in flight, to keep
    /// until its response ends (for the band's
    /// [`BandSettings::busiest_flow_ceiling`]; dropping it also lets the
    /// controller release the next request). Without this the request
    /// counts in flight until the release is dropped. `None` once taken.
    pub fn in_flight(&mut self) -> Option<InFlight> {
        Some(InFlight {
            fc: Arc::clone(&self.fc),
            key: self.key.take()?,
        })
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.fc.routed(self.key.as_ref());
    }
}

/// A released request counted in flight in its flow; dropped when its
/// response ends. See [`Release::in_flight`].
#[derive(Debug)]
pub struct InFlight {
    fc: Arc<FlowController>,
    key: FlowKey,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.fc.landed(&self.key);
    }
}

impl Ticket {
    /// Ready with the [`Release`] once the controller released the request;
    /// until then the waker of `cx` is woken at release.
    pub fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<Release> {
        let mut st = self.fc.lock();
        let s = &mut st.slots[self.slot as usize];
        if s.generation != self.generation {
            return Poll::Pending;
        }
        match &s.state {
            SlotState::Released(key) => {
                let key = key.clone();
                s.state = SlotState::Done;
                Poll::Ready(Release {
                    fc: Arc::clone(&self.fc),
                    key: Some(key),
                })
            }
            SlotState::Queued(_) => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            SlotState::Free | SlotState::Done => Poll::Pending,
        }
    }

    /// The request's TTL ran out: takes it out of its queue and says why
    /// ([`Outcome::EvictedNoEndpoints`] while the pool has no endpoint,
    /// else [`Outcome::EvictedTtl`]).
    ///
    /// # Errors
    /// It was released meanwhile: the [`Release`] (schedule it after all).
    pub fn expire(self) -> Result<Outcome, Release> {
        let outcome = if self.fc.gauge.saturation().is_none() {
            Outcome::EvictedNoEndpoints
        } else {
            Outcome::EvictedTtl
        };
        let mut st = self.fc.lock();
        let s = &mut st.slots[self.slot as usize];
        if s.generation == self.generation
            && let SlotState::Released(key) = &s.state
        {
            // Released meanwhile (checked under the same lock as the removal).
            let key = key.clone();
            s.state = SlotState::Done;
            return Err(Release {
                fc: Arc::clone(&self.fc),
                key: Some(key),
            });
        }
        if s.generation == self.generation {
            self.fc.remove(&mut st, self.slot, outcome);
        }
        Ok(outcome)
    }

    /// When the request entered its queue.
    #[must_use]
    pub fn enqueued(&self) -> Instant {
        self.fc.lock().slots[self.slot as usize].enqueued
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let fc = Arc::clone(&self.fc);
        let mut st = fc.lock();
        let s = &mut st.slots[self.slot as usize];
        if s.generation != self.generation {
            return;
        }
        let was_released = match &s.state {
            SlotState::Released(key) => Some(key.clone()),
            _ => None,
        };
        if matches!(s.state, SlotState::Queued(_)) {
            fc.remove(&mut st, self.slot, Outcome::EvictedContextCancelled);
        }
        let s = &mut st.slots[self.slot as usize];
        s.state = SlotState::Free;
        s.waker = None;
        s.generation = s.generation.wrapping_add(1);
        st.free.push(self.slot);
        if let Some(key) = was_released {
            // Released but never taken: the holder went away before routing.
            st.releasing = false;
            land(&mut st, &key);
            if let Some(waker) = fc.release_next(&mut st) {
                drop(st);
                waker.wake();
            }
        }
    }
}
