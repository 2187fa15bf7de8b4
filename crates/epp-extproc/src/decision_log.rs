//! The last decisions, kept for a person to read: which endpoints each
//! sampled request could go to, what each filter and scorer made of them,
//! and what was picked or why nothing was. The service fills a
//! [`DecisionLog`] when it has one ([`crate::ExtProcService::set_decision_log`]);
//! whoever embeds it serves the records (the `epp` binary: a page and its
//! JSON on the metrics port). Records never hold the prompt or the body.
//!
//! Which requests are recorded keeps the request path cheap under load: a
//! request is recorded when at least [`DecisionLog::interval`] has passed
//! since the last recorded one, so an idle picker records the next request
//! and a busy one records a few per second. Deciding costs one atomic load
//! per request; a recorded request's scheduling cycle copies its candidates
//! and scores ([`epp_core::CycleRecorder::records_candidates`]).
//!
//! ```
//! use std::time::Duration;
//! use epp_extproc::DecisionLog;
//!
//! let log = DecisionLog::new(50, Duration::from_millis(100));
//! assert_eq!(log.capacity(), 50);
//! assert!(log.recent().is_empty(), "nothing decided yet");
//! ```

use std::{
    collections::VecDeque,
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Serialize;

mod detail;

pub(crate) use detail::{CycleDetail, Recorders};

/// A bounded ring of the last recorded decisions, newest last, shared by
/// every stream of the service and whoever reads it. Cheap to consult on
/// every request; thread-safe.
pub struct DecisionLog {
    capacity: usize,
    interval: Duration,
    /// `last` counts nanoseconds from here.
    epoch: Instant,
    /// When the last recorded request was claimed, in nanoseconds since
    /// `epoch` plus one (0: never).
    last: AtomicU64,
    recorded: AtomicU64,
    ring: Mutex<VecDeque<Arc<DecisionRecord>>>,
}

impl fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionLog")
            .field("capacity", &self.capacity)
            .field("interval", &self.interval)
            .field("recorded", &self.recorded())
            .finish_non_exhaustive()
    }
}

impl DecisionLog {
    /// A log keeping the last `capacity` decisions (0 keeps none and records
    /// nothing), recording a request when `interval` has passed since the
    /// last recorded one (zero: every request).
    #[must_use]
    pub fn new(capacity: usize, interval: Duration) -> Self {
        Self {
            capacity,
            interval,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
        }
    }

    /// How many decisions it keeps.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The least time between two recorded requests.
    #[must_use]
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Decisions recorded since it was made (kept or since pushed out).
    #[must_use]
    pub fn recorded(&self) -> u64 {
        self.recorded.load(Ordering::Relaxed)
    }

    /// The decisions it keeps, newest first.
    #[must_use]
    pub fn recent(&self) -> Vec<Arc<DecisionRecord>> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter().rev().cloned().collect()
    }

    /// Whether the request arriving at `now` is recorded: yes when the
    /// interval has passed since the last one that was (or none was). Of
    /// concurrent requests, one wins.
    pub(crate) fn claim(&self, now: Instant) -> bool {
        if self.capacity == 0 {
            return false;
        }
        if self.interval.is_zero() {
            return true;
        }
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let at = nanos(now.saturating_duration_since(self.epoch)).saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && at.saturating_sub(last) < nanos(self.interval) {
            return false;
        }
        self.last
            .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Keeps `record`, pushing out the oldest when full.
    pub(crate) fn push(&self, record: DecisionRecord) {
        if self.capacity == 0 {
            return;
        }
        let record = Arc::new(record);
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        while ring.len() >= self.capacity {
            ring.pop_front();
        }
        ring.push_back(record);
        self.recorded.fetch_add(1, Ordering::Relaxed);
    }
}

/// One recorded decision. Serialises to the JSON the `epp` binary serves
/// (field names as here); scores that are not numbers (a scorer's NaN)
/// serialise as `null`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DecisionRecord {
    /// When it was decided, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The request's `x-request-id` (generated when the client sent none).
    pub request_id: String,
    /// The model the client asked for.
    pub model: String,
    /// The model it was routed for (after any rewrite).
    pub target_model: String,
    /// The `x-gateway-inference-objective`, if any.
    pub objective: Option<String>,
    /// Its priority (negative: sheddable).
    pub priority: i32,
    /// Its fairness flow.
    pub fairness_id: String,
    /// How long the scheduling cycle took, microseconds (0 when refused
    /// before one ran).
    pub scheduling_us: u64,
    /// Why it was refused; `None` when it was routed.
    pub refused: Option<Refusal>,
    /// Where it was sent: the target, then the fallbacks.
    pub targets: Vec<EndpointRef>,
    /// The prefill endpoint of a disaggregated (P/D) decision.
    pub prefill: Option<EndpointRef>,
    /// Fraction of the prompt's prefix blocks the target holds, in `[0, 1]`
    /// (0 without a prefix producer).
    pub prefix_hit: f64,
    /// Endpoints no profile ran over, and why.
    pub excluded: Vec<Excluded>,
    /// Each profile run, in the order they ran (a P/D decision has two).
    pub runs: Vec<RunRecord>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Refusal {
    /// The HTTP status the client got.
    pub status: u16,
    /// The error's message (what the client's JSON body says).
    pub reason: String,
}

/// An endpoint as a person knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EndpointRef {
    /// What discovery calls it (its address when unnamed).
    pub name: String,
    /// `ip:port`.
    pub address: String,
}

/// An endpoint left out before any profile ran.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Excluded {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: EndpointRef,
    /// Why: `subset` (not in the gateway's subset hint) or `stale` (its
    /// metrics are stale while fresh endpoints remain).
    pub reason: &'static str,
}

/// A plugin of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PluginId {
    /// Its type (`queue-scorer`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Its name in the config.
    pub name: String,
}

/// A scorer of a profile and its weight.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ScorerId {
    /// The scorer.
    #[serde(flatten)]
    pub plugin: PluginId,
    /// Its weight in the profile.
    pub weight: f64,
}

/// One profile run.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunRecord {
    /// The profile's name.
    pub profile: String,
    /// Its filters, in order.
    pub filters: Vec<PluginId>,
    /// Its scorers; [`CandidateRecord::scores`] follows this order.
    pub scorers: Vec<ScorerId>,
    /// Its picker.
    pub picker: Option<PluginId>,
    /// Every endpoint the run started from, in snapshot order.
    pub candidates: Vec<CandidateRecord>,
}

/// What one profile run made of one endpoint.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct CandidateRecord {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: EndpointRef,
    /// The filter that removed it; `None` when it was scored.
    pub dropped_by: Option<PluginId>,
    /// Each scorer's score as the scorer wrote it (in
    /// [`RunRecord::scorers`] order; the profile clamps it to `[0, 1]`
    /// before weighting); empty when it was dropped.
    pub scores: Vec<f64>,
    /// The weighted total the picker saw; `None` when it was dropped.
    pub total: Option<f64>,
    /// Its place among the picks: 0 the target, 1 the first fallback, …;
    /// `None` when not picked.
    pub pick: Option<usize>,
}

#[cfg(test)]
mod tests;
