//! The three policy roles of flow control, as object-safe traits. The
//! controller ([`super::FlowController`]) holds the queues; a policy only
//! answers one question about them, synchronously, under the controller's
//! lock: it must be quick (no I/O, no blocking), must not panic, and must not
//! call back into the controller.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::Plugin;

/// What a policy sees of one queued request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedItem {
    /// When the picker received the request (its ext_proc stream opened).
    pub received: Instant,
    /// When it entered its queue.
    pub enqueued: Instant,
    /// How long it may wait (`defaultRequestTTL` or the request's own
    /// deadline, whichever is shorter); `None`: no limit.
    pub ttl: Option<Duration>,
    /// Its time-to-first-token objective (header `x-llm-d-slo-ttft-ms`).
    pub slo_ttft: Option<Duration>,
    /// Its body size in bytes.
    pub bytes: u64,
}

/// A request's place in its flow's queue: smaller keys dispatch first; equal
/// keys in arrival order. Times are nanoseconds since the controller's epoch
/// (see [`OrderingPolicy::order_key`]); `u64::MAX` stands for "never".
pub type OrderKey = (u64, u64);

/// Nanoseconds from `epoch` to `t` (0 before it, saturating far after).
#[must_use]
pub fn nanos_since(epoch: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// Orders the requests inside one flow (llm-d's `OrderingPolicy`).
///
/// Contract: the key depends only on the item and `epoch` (it is computed
/// once, at enqueue), so a flow's queue stays sorted without re-evaluation.
pub trait OrderingPolicy: Plugin {
    /// The item's [`OrderKey`]; `epoch` is the instant the controller
    /// measures times from (never after any item's `received`).
    fn order_key(&self, item: &QueuedItem, epoch: Instant) -> OrderKey;
}

/// One non-empty flow of a band, as a fairness policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct FlowHead<'a> {
    /// The flow's fairness id (`x-gateway-inference-fairness-id`).
    pub id: &'a Arc<str>,
    /// Requests queued in it (at least 1).
    pub len: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The [`OrderKey`] of the request its ordering policy would dispatch next.
    pub head: OrderKey,
    /// When that request entered the queue.
    pub head_enqueued: Instant,
}

/// A band's fairness state, kept between picks (each band has its own).
#[derive(Debug, Clone, Default)]
pub struct FairnessCursor {
    /// The flow picked last, if the policy records it.
    pub last: Option<Arc<str>>,
}

/// Chooses which flow of a band dispatches next (llm-d's `FairnessPolicy`).
pub trait FairnessPolicy: Plugin {
    /// The index in `flows` of the flow to dispatch from. `flows` holds the
    /// band's non-empty flows sorted by id (never empty); `cursor` is this
    /// band's state. `None` dispatches nothing from the band this time.
    fn pick(&self, flows: &[FlowHead<'_>], cursor: &mut FairnessCursor) -> Option<usize>;
}

/// Decides how far each priority band may fill the pool (llm-d's
/// `UsageLimitPolicy`): a band dispatches only while the pool's saturation
/// is below its ceiling.
pub trait UsageLimitPolicy: Plugin {
    /// Writes into `out` (cleared first) one ceiling in `[0, 1]` per entry
    /// of `priorities` (every band the controller knows, highest first)
    /// for pool `saturation` (`>= 1.0`: saturated). A missing entry counts
    /// as 1.0; 0.0 holds a band back entirely.
    fn ceilings(&self, saturation: f64, priorities: &[i32], out: &mut Vec<f64>);
}
