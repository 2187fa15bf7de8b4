//! Endpoints, candidates and cycle contexts for scheduling tests, built one
//! way: endpoint `i` has id `i` and address [`addr`]`(i)`.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Instant};

use epp_core::{
    Candidate, CycleContext, CycleState, Endpoint, EndpointId, EndpointMetrics, EndpointSnapshot,
    InferenceRequest, Scorer,
};
use rand::{SeedableRng, rngs::SmallRng};

/// The address of endpoint `i`: `10.0.0.{i + 1}:8000` for the first 254,
/// then on through `10.0.1.0`, `10.0.1.1`… (unique for any `u32` below 2²⁴).
#[must_use]
pub fn addr(i: u32) -> SocketAddr {
    let n = i + 1;
    SocketAddr::from(([10, (n >> 16) as u8, (n >> 8) as u8, n as u8], 8000))
}

/// Endpoint `i` with `metrics`, marked as scraped now (`updated_at`).
#[must_use]
pub fn endpoint(i: u32, metrics: EndpointMetrics) -> Arc<Endpoint> {
    let e = Arc::new(Endpoint::new(i, addr(i)));
    e.set_metrics(EndpointMetrics {
        updated_at: Some(Instant::now()),
        ..metrics
    });
    e
}

/// Endpoint `i` with `labels` and fresh, empty metrics.
#[must_use]
pub fn labelled(i: u32, labels: &[(&str, &str)]) -> Arc<Endpoint> {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let e = Arc::new(Endpoint::with_labels(EndpointId(i), addr(i), labels));
    e.set_metrics(EndpointMetrics::fresh());
    e
}

/// Endpoints `0..` with fresh, empty metrics, endpoint `i` labelled
/// `llm-d.ai/role: roles[i]` when that is given.
#[must_use]
pub fn with_roles(roles: &[Option<&str>]) -> Vec<Arc<Endpoint>> {
    (0..)
        .zip(roles)
        .map(|(i, role)| match role {
            Some(role) => labelled(i, &[("llm-d.ai/role", role)]),
            None => labelled(i, &[]),
        })
        .collect()
}

/// Endpoints `0..`, one per entry of `metrics`, each marked as scraped now.
#[must_use]
pub fn endpoints(metrics: impl IntoIterator<Item = EndpointMetrics>) -> Vec<Arc<Endpoint>> {
    (0..).zip(metrics).map(|(i, m)| endpoint(i, m)).collect()
}

/// Endpoints `0..` with these waiting-queue lengths, otherwise idle and fresh.
#[must_use]
pub fn with_queues(queues: &[u32]) -> Vec<Arc<Endpoint>> {
    endpoints(queues.iter().map(|&waiting| EndpointMetrics {
        waiting,
        ..EndpointMetrics::default()
    }))
}

/// A snapshot of `n` idle, fresh endpoints.
#[must_use]
pub fn snapshot(n: usize) -> EndpointSnapshot {
    EndpointSnapshot::new(endpoints(vec![EndpointMetrics::default(); n]))
}

/// Candidates over [`endpoints`]`(metrics)`.
#[must_use]
pub fn candidates(metrics: Vec<EndpointMetrics>) -> Vec<Candidate> {
    endpoints(metrics).iter().map(Candidate::new).collect()
}

/// Runs `f` with a cycle context over `request`, its RNG seeded with `seed`.
pub fn with_cx<R>(
    request: &InferenceRequest,
    seed: u64,
    f: impl FnOnce(&mut CycleContext<'_>) -> R,
) -> R {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut state = CycleState::default();
    let mut cx = CycleContext {
        request,
        now: Instant::now(),
        rng: &mut rng,
        state: &mut state,
    };
    f(&mut cx)
}

/// What `scorer` writes for `candidates`, for a request to model `m`.
#[must_use]
pub fn scores(scorer: &dyn Scorer, candidates: &[Candidate]) -> Vec<f64> {
    let request = InferenceRequest::builder("m").build();
    with_cx(&request, 1, |cx| {
        let mut out = vec![0.0; candidates.len()];
        scorer.score(cx, candidates, &mut out);
        out
    })
}

/// A queued request of `bytes` 0, received and enqueued `ms` milliseconds
/// after `epoch`, with no TTL and no objective (flow-control policy tests).
#[must_use]
pub fn queued(epoch: std::time::Instant, ms: u64) -> epp_core::flow::QueuedItem {
    let at = epoch + std::time::Duration::from_millis(ms);
    epp_core::flow::QueuedItem {
        received: at,
        enqueued: at,
        ttl: None,
        slo_ttft: None,
        bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_and_start_at_10_0_0_1() {
        assert_eq!(addr(0).to_string(), "10.0.0.1:8000");
        assert_eq!(addr(253).to_string(), "10.0.0.254:8000");
        let all: std::collections::HashSet<_> = (0..70_000).map(addr).collect();
        assert_eq!(all.len(), 70_000);
    }

    #[test]
    fn endpoints_carry_their_index_metrics_and_labels() {
        let eps = with_queues(&[3, 0]);
        assert_eq!(eps[1].id(), EndpointId(1));
        assert_eq!(eps[1].addr(), addr(1));
        assert_eq!(eps[0].metrics().waiting, 3);
        assert!(eps[0].metrics().updated_at.is_some(), "fresh");
        let e = labelled(2, &[("llm-d.ai/role", "decode")]);
        assert_eq!(e.label("llm-d.ai/role"), Some("decode"));
        let roles = with_roles(&[None, Some("prefill")]);
        assert_eq!(roles[0].labels().len(), 0);
        assert_eq!(roles[1].label("llm-d.ai/role"), Some("prefill"));
        assert_eq!(roles[1].id(), EndpointId(1));
        assert_eq!(snapshot(4).len(), 4);
    }
}
