//! `slo-deadline-ordering-policy`: the tightest time-to-first-token
//! objective first.
//!
//! Rule (llm-d): deadline = the time the request was received + its
//! `x-llm-d-slo-ttft-ms` header; the earliest deadline dispatches first,
//! ties in order of receipt. Requests without a valid header sort after
//! every request that has one (first come, first served among themselves).

use std::time::Instant;

use epp_core::flow::{OrderKey, OrderingPolicy, QueuedItem, nanos_since};

stateless_policy!(
    /// `slo-deadline-ordering-policy`.
    SloDeadlineOrderingPolicy,
    "slo-deadline-ordering-policy",
    as_ordering_policy -> OrderingPolicy
);

impl OrderingPolicy for SloDeadlineOrderingPolicy {
    fn order_key(&self, item: &QueuedItem, epoch: Instant) -> OrderKey {
        let received = nanos_since(epoch, item.received);
        let deadline = item
            .slo_ttft
            .and_then(|slo| item.received.checked_add(slo))
            .map_or(u64::MAX, |d| nanos_since(epoch, d));
        (deadline, received)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Builtin, NoParams, testing::queued};

    #[test]
    fn tightest_slo_first_and_requests_without_one_last() {
        let p = SloDeadlineOrderingPolicy::build("s", NoParams {}).unwrap();
        let epoch = Instant::now();
        let key = |ms: u64, slo: Option<u64>| {
            let mut i = queued(epoch, ms);
            i.slo_ttft = slo.map(Duration::from_millis);
            p.order_key(&i, epoch)
        };
        assert!(key(100, Some(50)) < key(0, Some(500)));
        assert!(
            key(0, Some(60)) < key(10, Some(50)),
            "equal deadlines: receipt order"
        );
        assert!(key(0, Some(1_000_000)) < key(0, None));
        assert!(key(0, None) < key(5, None));
    }
}
