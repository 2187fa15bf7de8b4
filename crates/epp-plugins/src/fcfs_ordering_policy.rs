//! `fcfs-ordering-policy`: first come, first served inside a flow.
//!
//! Rule: requests dispatch in the order they entered the queue (llm-d's
//! default ordering policy; it needs no declaration).

use std::time::Instant;

use epp_core::flow::{OrderKey, OrderingPolicy, QueuedItem, nanos_since};

stateless_policy!(
    /// `fcfs-ordering-policy`.
    FcfsOrderingPolicy,
    "fcfs-ordering-policy",
    as_ordering_policy -> OrderingPolicy
);

impl OrderingPolicy for FcfsOrderingPolicy {
    fn order_key(&self, item: &QueuedItem, epoch: Instant) -> OrderKey {
        (nanos_since(epoch, item.enqueued), 0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Builtin, NoParams, testing::queued};

    #[test]
    fn earlier_enqueue_goes_first_whatever_the_deadline() {
        let p = FcfsOrderingPolicy::build("f", NoParams {}).unwrap();
        let epoch = Instant::now();
        let mut a = queued(epoch, 1);
        a.ttl = Some(Duration::from_secs(100));
        let mut b = queued(epoch, 2);
        b.ttl = Some(Duration::from_secs(1));
        assert!(p.order_key(&a, epoch) < p.order_key(&b, epoch));
    }
}
