//! Helpers for plugin unit tests.

use std::sync::Arc;

use epp_core::{Candidate, CycleContext, CycleState, Endpoint, EndpointMetrics, InferenceRequest};
use rand::{SeedableRng, rngs::SmallRng};

/// Candidates with the given metrics, ids 0.., ports 8000...
pub(crate) fn candidates(metrics: Vec<EndpointMetrics>) -> Vec<Candidate> {
    metrics
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let e = Arc::new(Endpoint::new(
                i as u32,
                format!("10.0.0.1:{}", 8000 + i).parse().unwrap(),
            ));
            e.set_metrics(EndpointMetrics {
                updated_at: Some(std::time::Instant::now()),
                ..m
            });
            Candidate::new(&e)
        })
        .collect()
}

/// Runs `f` with a cycle context over `request`.
pub(crate) fn with_cx<R>(
    request: &InferenceRequest,
    seed: u64,
    f: impl FnOnce(&mut CycleContext<'_>) -> R,
) -> R {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut state = CycleState::default();
    let mut cx = CycleContext {
        request,
        now: std::time::Instant::now(),
        rng: &mut rng,
        state: &mut state,
    };
    f(&mut cx)
}

/// Scores of `scorer` over `cands`.
pub(crate) fn scores(scorer: &dyn epp_core::Scorer, cands: &[Candidate]) -> Vec<f64> {
    let req = InferenceRequest::builder("m").build();
    with_cx(&req, 1, |cx| {
        let mut out = vec![0.0; cands.len()];
        scorer.score(cx, cands, &mut out);
        out
    })
}
