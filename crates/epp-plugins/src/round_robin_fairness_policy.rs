//! `round-robin-fairness-policy`: each flow of a band in turn.
//!
//! Rule (llm-d): the band's non-empty flows are taken in order of their ids;
//! each pick is the first flow after the one picked last (wrapping around),
//! so no flow can starve another however many requests it queues.

use std::sync::Arc;

use epp_core::flow::{FairnessCursor, FairnessPolicy, FlowHead};

stateless_policy!(
    /// `round-robin-fairness-policy`.
    RoundRobinFairnessPolicy,
    "round-robin-fairness-policy",
    as_fairness_policy -> FairnessPolicy
);

impl FairnessPolicy for RoundRobinFairnessPolicy {
    fn pick(&self, flows: &[FlowHead<'_>], cursor: &mut FairnessCursor) -> Option<usize> {
        if flows.is_empty() {
            cursor.last = None;
            return None;
        }
        let next = match &cursor.last {
            // `flows` is sorted by id: the first id after the last pick.
            Some(last) => flows.partition_point(|f| f.id.as_ref() <= last.as_ref()) % flows.len(),
            None => 0,
        };
        cursor.last = Some(Arc::clone(flows[next].id));
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Builtin, NoParams};

    #[test]
    fn flows_take_turns_and_a_vanished_flow_does_not_reset_the_turn() {
        let p = RoundRobinFairnessPolicy::build("r", NoParams {}).unwrap();
        let ids: Vec<Arc<str>> = ["a", "b", "c"].into_iter().map(Arc::from).collect();
        let head = |i: usize| FlowHead {
            id: &ids[i],
            len: 1,
            bytes: 0,
            head: (0, 0),
            head_enqueued: std::time::Instant::now(),
        };
        let all = [head(0), head(1), head(2)];
        let mut c = FairnessCursor::default();
        let picks: Vec<usize> = (0..4).map(|_| p.pick(&all, &mut c).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        // "b" emptied: after "a" comes "c".
        let without_b = [head(0), head(2)];
        assert_eq!(p.pick(&without_b, &mut c), Some(1));
        assert_eq!(c.last.as_deref(), Some("c"));
        // Wraps around.
        assert_eq!(p.pick(&without_b, &mut c), Some(0));
    }
}
