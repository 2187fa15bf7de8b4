//! `global-strict-fairness-policy`: one order across every flow of a band.
//!
//! Rule (llm-d's default fairness policy): ignore flow boundaries and
//! dispatch the band's single best request, i.e. the flow whose head comes
//! first under the band's ordering policy (ties: the first flow by id).

use epp_core::flow::{FairnessCursor, FairnessPolicy, FlowHead};

stateless_policy!(
    /// `global-strict-fairness-policy`.
    GlobalStrictFairnessPolicy,
    "global-strict-fairness-policy",
    as_fairness_policy -> FairnessPolicy
);

impl FairnessPolicy for GlobalStrictFairnessPolicy {
    fn pick(&self, flows: &[FlowHead<'_>], _cursor: &mut FairnessCursor) -> Option<usize> {
        (0..flows.len()).min_by_key(|&i| flows[i].head)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Builtin, NoParams};

    #[test]
    fn the_best_head_wins_whatever_its_flow() {
        let p = GlobalStrictFairnessPolicy::build("g", NoParams {}).unwrap();
        let ids: Vec<Arc<str>> = ["a", "b", "c"].into_iter().map(Arc::from).collect();
        let head = |i: usize, key: u64, len: usize| FlowHead {
            id: &ids[i],
            len,
            bytes: 0,
            head: (key, 0),
            head_enqueued: std::time::Instant::now(),
        };
        let mut c = FairnessCursor::default();
        // The heavy flow "a" keeps winning while its head is earliest.
        let flows = [head(0, 1, 100), head(1, 5, 1), head(2, 3, 1)];
        assert_eq!(p.pick(&flows, &mut c), Some(0));
        assert_eq!(p.pick(&flows, &mut c), Some(0));
        let flows = [head(0, 9, 99), head(1, 5, 1), head(2, 3, 1)];
        assert_eq!(p.pick(&flows, &mut c), Some(2));
    }
}
