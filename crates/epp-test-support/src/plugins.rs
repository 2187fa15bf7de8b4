//! Small plugins for tests of the crates that may not depend on epp-plugins
//! (the data layer, the ext_proc service): each does one obvious thing, so a
//! test's expectation can be worked out by hand.

use std::sync::{Arc, Mutex};

use epp_core::{
    Candidate, CycleContext, Endpoint, InferenceRequest, Picker, Plugin, PluginRef, RequestOutcome,
    ResponseHooks, SaturationDetector, Scheduler, SchedulingProfile, Scorer, SingleProfileHandler,
    Usage,
};

/// An `EndpointPickerConfig` of built-in types whose every stage shows in a
/// decision: the header-based testing filter keeps the endpoints a request
/// names, then `queue-scorer` (weight 2) and `kv-cache-utilization-scorer`
/// (weight 1), and the best total wins (profile `steered`).
pub const STEERED_CONFIG: &str = "\
plugins:
- type: header-based-testing-filter
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: steered
  plugins:
  - {pluginRef: header-based-testing-filter}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer}
  - {pluginRef: max-score-picker}
";

/// Scores `1 / (1 + waiting)`: the shorter an endpoint's queue, the higher.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShortQueueScorer;

impl Plugin for ShortQueueScorer {
    fn type_name(&self) -> &str {
        "short-queue"
    }
    fn name(&self) -> &str {
        "short-queue"
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}

impl Scorer for ShortQueueScorer {
    fn score(&self, _: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = 1.0 / (1.0 + f64::from(c.metrics.waiting));
        }
    }
}

/// Picks the `count` best-scored candidates, best first; equal scores in
/// candidate order, or in reverse with [`last_on_ties`](Self::last_on_ties).
#[derive(Debug, Clone, Copy)]
pub struct BestScoresPicker {
    count: usize,
    last_on_ties: bool,
}

impl BestScoresPicker {
    /// Picks `count`: the target, then `count - 1` fallbacks.
    #[must_use]
    pub fn new(count: usize) -> Self {
        Self {
            count,
            last_on_ties: false,
        }
    }

    /// Of equal scores, the later candidate first (so a test can tell that
    /// the last endpoint of a set was removed).
    #[must_use]
    pub fn last_on_ties(self) -> Self {
        Self {
            last_on_ties: true,
            ..self
        }
    }
}

impl Plugin for BestScoresPicker {
    fn type_name(&self) -> &str {
        "best-scores"
    }
    fn name(&self) -> &str {
        "best-scores"
    }
    fn as_picker(&self) -> Option<&dyn Picker> {
        Some(self)
    }
}

impl Picker for BestScoresPicker {
    fn pick(
        &self,
        _: &mut CycleContext<'_>,
        _: &[Candidate],
        scores: &[f64],
        out: &mut Vec<usize>,
    ) {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| {
            let ties = if self.last_on_ties {
                b.cmp(&a)
            } else {
                a.cmp(&b)
            };
            scores[b].total_cmp(&scores[a]).then(ties)
        });
        out.extend(order.into_iter().take(self.count));
    }
}

/// Saturated when every endpoint has a queue; an endpoint has capacity when
/// its queue is empty.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueSaturationDetector;

impl Plugin for QueueSaturationDetector {
    fn type_name(&self) -> &str {
        "queue-saturation"
    }
    fn name(&self) -> &str {
        "queue-saturation"
    }
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        Some(self)
    }
}

impl SaturationDetector for QueueSaturationDetector {
    fn saturation(&self, _: &CycleContext<'_>, endpoints: &[Candidate]) -> f64 {
        if endpoints.iter().all(|c| c.metrics.waiting > 0) {
            1.0
        } else {
            0.0
        }
    }
    fn has_capacity(&self, _: &CycleContext<'_>, c: &Candidate) -> bool {
        c.metrics.waiting == 0
    }
}

/// What a [`Recorder`]'s response hooks saw, in order.
#[derive(Debug, Default)]
pub struct Seen {
    /// The status of each response.
    pub statuses: Vec<u16>,
    /// Each usage report.
    pub usage: Vec<Usage>,
    /// Each completed request's outcome.
    pub outcomes: Vec<RequestOutcome>,
    /// The request of each response, as the hooks received it.
    pub requests: Vec<InferenceRequest>,
}

/// Response hooks that record every call.
#[derive(Debug, Default)]
pub struct Recorder(pub Mutex<Seen>);

impl Recorder {
    /// Reads what was recorded so far.
    ///
    /// # Panics
    /// If a hook panicked while recording.
    pub fn seen<R>(&self, f: impl FnOnce(&Seen) -> R) -> R {
        f(&self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0.lock().expect("a hook panicked while recording")
    }
}

impl Plugin for Recorder {
    fn type_name(&self) -> &str {
        "recorder"
    }
    fn name(&self) -> &str {
        "recorder"
    }
    fn as_response_hooks(&self) -> Option<&dyn ResponseHooks> {
        Some(self)
    }
}

impl ResponseHooks for Recorder {
    fn response_headers(
        &self,
        request: &InferenceRequest,
        _: &Endpoint,
        status: u16,
        _: &[(String, String)],
    ) {
        let mut seen = self.lock();
        seen.statuses.push(status);
        seen.requests.push(request.clone());
    }
    fn response_usage(&self, _: &InferenceRequest, _: &Endpoint, usage: &Usage) {
        self.lock().usage.push(*usage);
    }
    fn request_completed(&self, _: &InferenceRequest, _: &Endpoint, outcome: RequestOutcome) {
        self.lock().outcomes.push(outcome);
    }
}

/// One profile: [`ShortQueueScorer`] (weight 1) and `picker`.
#[must_use]
pub fn short_queue_profile(picker: BestScoresPicker) -> SchedulingProfile {
    SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(Arc::new(ShortQueueScorer)), 1.0)
        .with_picker(PluginRef::new(Arc::new(picker)))
}

/// A single-profile scheduler over `profile`.
///
/// # Panics
/// If the profile is invalid (a test's own mistake).
#[must_use]
pub fn scheduler(profile: SchedulingProfile) -> Scheduler {
    Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
        .expect("a valid profile")
}

#[cfg(test)]
mod tests {
    use epp_core::EndpointMetrics;

    use super::*;
    use crate::endpoints::{candidates, snapshot, with_cx, with_queues};

    #[test]
    fn the_shortest_queues_are_picked_best_first() {
        let snap = epp_core::EndpointSnapshot::new(with_queues(&[4, 0, 1, 0]));
        let request = InferenceRequest::builder("m").build();
        let picked = |picker| {
            let r = scheduler(short_queue_profile(picker))
                .schedule(&request, &snap)
                .expect("a pick");
            let targets = &r.primary_run().expect("a run").targets;
            targets.iter().map(|e| e.id().0).collect::<Vec<_>>()
        };
        assert_eq!(
            picked(BestScoresPicker::new(2)),
            [1, 3],
            "ties in candidate order"
        );
        assert_eq!(picked(BestScoresPicker::new(3).last_on_ties()), [3, 1, 2]);
        let none = scheduler(short_queue_profile(BestScoresPicker::new(1)))
            .schedule(&request, &snapshot(0));
        assert!(none.is_err(), "no endpoint, no pick");
    }

    #[test]
    fn saturation_follows_the_queues() {
        let busy = candidates(vec![
            EndpointMetrics {
                waiting: 1,
                ..EndpointMetrics::default()
            };
            2
        ]);
        let request = InferenceRequest::builder("m").build();
        with_cx(&request, 0, |cx| {
            let d = QueueSaturationDetector;
            assert!((d.saturation(cx, &busy) - 1.0).abs() < f64::EPSILON);
            assert!(!d.has_capacity(cx, &busy[0]));
            let mixed = candidates(vec![
                EndpointMetrics::default(),
                busy[0].metrics.as_ref().clone(),
            ]);
            assert!(d.saturation(cx, &mixed).abs() < f64::EPSILON);
            assert!(d.has_capacity(cx, &mixed[0]));
        });
    }
}
