//! `edf-ordering-policy`: earliest deadline first inside a flow.
//!
//! Rule (llm-d): a request's deadline is its enqueue time plus its
//! effective TTL; the earliest deadline dispatches first, ties in enqueue
//! order. A request without a TTL never expires and sorts after every
//! request that has one.

use std::time::Instant;

use epp_core::flow::{OrderKey, OrderingPolicy, QueuedItem, nanos_since};

stateless_policy!(
    /// `edf-ordering-policy`.
    EdfOrderingPolicy,
    "edf-ordering-policy",
    as_ordering_policy -> OrderingPolicy
);

impl OrderingPolicy for EdfOrderingPolicy {
    fn order_key(&self, item: &QueuedItem, epoch: Instant) -> OrderKey {
        let enqueued = nanos_since(epoch, item.enqueued);
        let deadline = match item.ttl {
            Some(ttl) if !ttl.is_zero() => item
                .enqueued
                .checked_add(ttl)
                .map_or(u64::MAX, |d| nanos_since(epoch, d)),
            _ => u64::MAX,
        };
        (deadline, enqueued)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Builtin, NoParams, testing::queued};

    #[test]
    fn earliest_deadline_first_then_enqueue_order_and_no_ttl_last() {
        let p = EdfOrderingPolicy::build("e", NoParams {}).unwrap();
        let epoch = Instant::now();
        let key = |ms: u64, ttl: Option<u64>| {
            let mut i = queued(epoch, ms);
            i.ttl = ttl.map(Duration::from_millis);
            p.order_key(&i, epoch)
        };
        // Enqueued later but due sooner.
        assert!(key(10, Some(5)) < key(0, Some(100)));
        // Same deadline: the earlier enqueue.
        assert!(key(0, Some(20)) < key(10, Some(10)));
        // No TTL: after any deadline, FCFS among themselves.
        assert!(key(50, Some(1_000_000)) < key(0, None));
        assert!(key(0, None) < key(1, None));
    }
}
