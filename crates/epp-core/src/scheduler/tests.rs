use std::{net::SocketAddr, sync::Arc, time::Duration};

use super::*;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::{
    DeferredWork, EndpointMetrics, Filter, Picker, PreRequest, SaturationDetector, Scorer,
};

/// Scores each candidate with a fixed value by endpoint id (NaN allowed).
#[derive(Debug)]
struct Fixed(Vec<f64>);
impl Plugin for Fixed {
    fn type_name(&self) -> &str {
        "fixed"
    }
    fn name(&self) -> &str {
        "fixed"
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}
impl Scorer for Fixed {
    fn score(&self, _: &CycleContext<'_>, c: &[Candidate], out: &mut [f64]) {
        for (c, s) in c.iter().zip(out) {
            *s = self.0[c.id().index()];
        }
    }
}

/// Picks every candidate in descending total, with a duplicate and an
/// out-of-range index thrown in to test contract enforcement.
#[derive(Debug)]
struct AllDesc;
impl Plugin for AllDesc {
    fn type_name(&self) -> &str {
        "all"
    }
    fn name(&self) -> &str {
        "all"
    }
    fn as_picker(&self) -> Option<&dyn Picker> {
        Some(self)
    }
}
impl Picker for AllDesc {
    fn pick(&self, _: &mut CycleContext<'_>, c: &[Candidate], s: &[f64], out: &mut Vec<usize>) {
        out.extend(0..c.len());
        out.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        out.push(out[0]);
        out.push(999);
    }
}

#[derive(Debug)]
struct DropAll;
impl Plugin for DropAll {
    fn type_name(&self) -> &str {
        "drop-all"
    }
    fn name(&self) -> &str {
        "drop-all"
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}
impl Filter for DropAll {
    fn filter(&self, _: &mut CycleContext<'_>, c: &mut Vec<Candidate>) {
        c.clear();
    }
}

#[derive(Debug)]
struct AlwaysSaturated;
impl Plugin for AlwaysSaturated {
    fn type_name(&self) -> &str {
        "sat"
    }
    fn name(&self) -> &str {
        "sat"
    }
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        Some(self)
    }
}
impl SaturationDetector for AlwaysSaturated {
    fn saturation(&self, _: &CycleContext<'_>, _: &[Candidate]) -> f64 {
        1.0
    }
    fn has_capacity(&self, _: &CycleContext<'_>, _: &Candidate) -> bool {
        false
    }
}

/// Refuses sheddable requests when fewer than two candidates exist.
#[derive(Debug)]
struct NeedsTwo;
impl Plugin for NeedsTwo {
    fn type_name(&self) -> &str {
        "needs-two"
    }
    fn name(&self) -> &str {
        "gate"
    }
    fn as_admitter(&self) -> Option<&dyn crate::Admitter> {
        Some(self)
    }
}
impl crate::Admitter for NeedsTwo {
    fn admit(&self, cx: &mut CycleContext<'_>, c: &[Candidate]) -> Result<(), String> {
        if cx.request.is_sheddable() && c.len() < 2 {
            Err(format!("{} candidate(s)", c.len()))
        } else {
            Ok(())
        }
    }
}

fn snapshot(n: u32) -> EndpointSnapshot {
    EndpointSnapshot::new(
        (0..n)
            .map(|i| {
                let addr: SocketAddr = format!("10.0.0.1:{}", 8000 + i).parse().unwrap();
                let e = Arc::new(Endpoint::new(i, addr));
                e.set_metrics(EndpointMetrics::fresh());
                e
            })
            .collect(),
    )
}

fn scheduler(scores: Vec<f64>) -> Scheduler {
    let profile = SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(Arc::new(Fixed(scores))), 2.0)
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default())).unwrap()
}

fn ids(r: &SchedulingResult) -> Vec<u32> {
    r.primary_run()
        .unwrap()
        .targets
        .iter()
        .map(|e| e.id().0)
        .collect()
}

#[test]
fn scores_are_clamped_weighted_and_nan_is_worst() {
    let s = scheduler(vec![0.5, f64::NAN, 7.0, -3.0]);
    let r = s
        .schedule(&InferenceRequest::builder("m").build(), &snapshot(4))
        .unwrap();
    // 7.0 clamps to 1.0 (total 2.0), 0.5 → 1.0; NaN and -3 → 0, stable order.
    assert_eq!(ids(&r), vec![2, 0, 1, 3]);
    assert_eq!(r.primary_run().unwrap().scores, vec![2.0, 1.0, 0.0, 0.0]);
}

#[test]
fn picker_output_is_made_distinct_and_in_range() {
    let s = scheduler(vec![0.1, 0.2]);
    let r = s
        .schedule(&InferenceRequest::builder("m").build(), &snapshot(2))
        .unwrap();
    assert_eq!(ids(&r), vec![1, 0]);
}

#[test]
fn subset_matches_ip_and_port() {
    let s = scheduler(vec![0.9, 0.1, 0.5]);
    // Same IP as endpoint 0 but a port no endpoint has: must not match endpoint 0.
    let req = InferenceRequest::builder("m")
        .subset(vec![
            "10.0.0.1:8001".parse().unwrap(),
            "10.0.0.1:9999".parse().unwrap(),
        ])
        .build();
    let r = s.schedule(&req, &snapshot(3)).unwrap();
    assert_eq!(ids(&r), vec![1]);

    let req = InferenceRequest::builder("m").subset(vec![]).build();
    assert_eq!(
        s.schedule(&req, &snapshot(3)).unwrap_err(),
        SchedulingError::EmptySubset
    );
}

#[test]
fn empty_pool_and_all_filtered_are_errors() {
    let s = scheduler(vec![]);
    let req = InferenceRequest::builder("m").build();
    assert_eq!(
        s.schedule(&req, &EndpointSnapshot::default()).unwrap_err(),
        SchedulingError::NoEndpoints
    );
    let profile = SchedulingProfile::new("strict")
        .with_filter(PluginRef::new(Arc::new(DropAll)))
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    let s = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default())).unwrap();
    assert_eq!(
        s.schedule(&req, &snapshot(2)).unwrap_err(),
        SchedulingError::AllFiltered {
            profile: "strict".into()
        }
    );
}

#[test]
fn stale_endpoints_are_dropped_only_when_fresh_ones_exist() {
    let snap = snapshot(3);
    snap.endpoints()[0].set_metrics(EndpointMetrics::default()); // never scraped
    let s = scheduler(vec![1.0, 0.5, 0.1]).with_staleness_threshold(Duration::from_secs(2));
    let req = InferenceRequest::builder("m").build();
    assert_eq!(ids(&s.schedule(&req, &snap).unwrap()), vec![1, 2]);

    for e in snap.endpoints() {
        e.set_metrics(EndpointMetrics::default());
    }
    // All stale: still route rather than refuse everything.
    assert_eq!(ids(&s.schedule(&req, &snap).unwrap()), vec![0, 1, 2]);
}

#[test]
fn sheddable_requests_are_refused_when_saturated() {
    let s = scheduler(vec![1.0])
        .with_saturation_detector(PluginRef::new(Arc::new(AlwaysSaturated)))
        .unwrap();
    let snap = snapshot(1);
    let shed = InferenceRequest::builder("m").priority(-1).build();
    assert_eq!(
        s.schedule(&shed, &snap).unwrap_err(),
        SchedulingError::Saturated
    );
    let critical = InferenceRequest::builder("m").priority(0).build();
    assert!(s.schedule(&critical, &snap).is_ok());
}

/// Saturation 0.5; every endpoint with an odd id counts as stale.
#[derive(Debug)]
struct OddStale;
impl Plugin for OddStale {
    fn type_name(&self) -> &str {
        "odd-stale"
    }
    fn name(&self) -> &str {
        "odd"
    }
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        Some(self)
    }
}
impl SaturationDetector for OddStale {
    fn saturation(&self, _: &CycleContext<'_>, _: &[Candidate]) -> f64 {
        0.5
    }
    fn has_capacity(&self, _: &CycleContext<'_>, _: &Candidate) -> bool {
        true
    }
    fn stale_endpoints(&self, _: &CycleContext<'_>, c: &[Candidate]) -> Option<usize> {
        Some(c.iter().filter(|c| c.id().0 % 2 == 1).count())
    }
}

#[test]
fn the_pool_reading_covers_every_endpoint_and_names_the_detector() {
    let plain = scheduler(vec![0.0; 5]);
    assert_eq!(plain.pool_saturation(&snapshot(5)), Some(0.0));
    assert_eq!(plain.pool_stale_endpoints(&snapshot(5)), None);
    let with = |p: Arc<dyn Plugin>| {
        scheduler(vec![0.0; 5])
            .with_saturation_detector(PluginRef::new(p))
            .unwrap()
    };
    let odd = with(Arc::new(OddStale));
    assert_eq!(odd.pool_saturation(&snapshot(5)), Some(0.5));
    assert_eq!(odd.pool_stale_endpoints(&snapshot(5)), Some(("odd", 2)));
    assert_eq!(odd.pool_saturation(&snapshot(0)), None);
    assert_eq!(odd.pool_stale_endpoints(&snapshot(0)), Some(("odd", 0)));
    // A detector that does not judge staleness reports none.
    let sat = with(Arc::new(AlwaysSaturated));
    assert_eq!(sat.pool_saturation(&snapshot(2)), Some(1.0));
    assert_eq!(sat.pool_stale_endpoints(&snapshot(2)), None);
}

#[test]
fn an_admitter_refuses_before_any_profile_runs() {
    let s = scheduler(vec![1.0, 2.0]).with_hooks([PluginRef::new(Arc::new(NeedsTwo))]);
    assert!(
        s.call_sites()
            .iter()
            .any(|c| c.point == crate::ExtensionPoint::Admitter)
    );
    let shed = InferenceRequest::builder("m").priority(-1).build();
    assert_eq!(
        s.schedule(&shed, &snapshot(1)).unwrap_err(),
        SchedulingError::NotAdmitted {
            plugin: "gate".into(),
            reason: "1 candidate(s)".into()
        }
    );
    assert!(s.schedule(&shed, &snapshot(2)).is_ok());
    let critical = InferenceRequest::builder("m").priority(0).build();
    assert!(s.schedule(&critical, &snapshot(1)).is_ok());
}

#[test]
fn wrong_roles_are_rejected_at_build() {
    let profile = SchedulingProfile::new("p")
        .with_scorer(PluginRef::new(Arc::new(AllDesc)), 1.0)
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    let err = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default())).unwrap_err();
    assert!(err.to_string().contains("is not a scorer"), "{err}");
    let no_picker = SchedulingProfile::new("p");
    assert!(Scheduler::new(vec![no_picker], Arc::new(SingleProfileHandler::default())).is_err());
}

#[test]
fn seeded_scratch_reuses_result_buffers() {
    let s = scheduler(vec![0.3, 0.6]);
    let snap = snapshot(2);
    let req = InferenceRequest::builder("m").build();
    let mut scratch = Scratch::seeded(7);
    let mut result = SchedulingResult::default();
    for _ in 0..3 {
        s.schedule_into(&req, &snap, &mut scratch, &mut result)
            .unwrap();
        assert_eq!(result.runs.len(), 1);
        assert_eq!(ids(&result), vec![1, 0]);
    }
}

/// Records every reported call site.
#[derive(Debug, Default)]
struct Recorder(std::sync::Mutex<Vec<usize>>);
impl crate::SchedulerObserver for Recorder {
    fn plugin_call(&self, site: usize, _took: Duration) {
        self.0.lock().unwrap().push(site);
    }
}

/// Response hooks that add a header.
#[derive(Debug)]
struct Tagger;
impl Plugin for Tagger {
    fn type_name(&self) -> &str {
        "tagger"
    }
    fn name(&self) -> &str {
        "tag"
    }
    fn as_response_hooks(&self) -> Option<&dyn crate::ResponseHooks> {
        Some(self)
    }
}
impl crate::ResponseHooks for Tagger {
    fn add_response_headers(
        &self,
        _: &InferenceRequest,
        endpoint: &Endpoint,
        out: &mut dyn crate::ResponseHeaderSink,
    ) {
        out.set_header("x-tag", endpoint.addr_str());
    }
}

#[test]
fn observer_sees_every_plugin_call_at_its_site() {
    use crate::ExtensionPoint as E;
    let filter = SchedulingProfile::new("p")
        .with_filter(PluginRef::new(Arc::new(DropAll)))
        .with_scorer(PluginRef::new(Arc::new(Fixed(vec![1.0]))), 1.0)
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    let recorder = Arc::new(Recorder::default());
    let s = scheduler(vec![0.3, 0.6])
        .with_saturation_detector(PluginRef::new(Arc::new(AlwaysSaturated)))
        .unwrap()
        .with_hooks([PluginRef::new(Arc::new(Tagger))])
        .with_observer(recorder.clone());
    let sites = s.call_sites();
    let points: Vec<(E, &str)> = sites
        .iter()
        .map(|c| (c.point, c.plugin.plugin().name()))
        .collect();
    assert_eq!(
        points,
        vec![
            (E::ProfilePicker, "single-profile-handler"),
            (E::SaturationDetector, "sat"),
            (E::Scorer, "fixed"),
            (E::Picker, "all"),
            (E::ResponseReceived, "tag"),
            (E::ResponseComplete, "tag"),
        ]
    );
    assert_eq!(E::ResponseReceived.as_str(), "ResponseReceived");

    let snap = snapshot(2);
    let req = InferenceRequest::builder("m").build();
    let r = s.schedule(&req, &snap).unwrap();
    // The handler is asked twice (run the profile; then "done").
    assert_eq!(*recorder.0.lock().unwrap(), vec![0, 2, 3, 0]);

    recorder.0.lock().unwrap().clear();
    assert!(
        s.schedule(&InferenceRequest::builder("m").priority(-1).build(), &snap)
            .is_err()
    );
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![1],
        "shed after the detector"
    );

    recorder.0.lock().unwrap().clear();
    let endpoint = r.primary().unwrap();
    let mut headers: Vec<(String, String)> = Vec::new();
    s.response_received(&req, endpoint, 200, &[], &mut headers);
    s.response_complete(&req, endpoint, None, None, crate::RequestOutcome::Aborted);
    assert_eq!(
        headers,
        vec![("x-tag".to_owned(), "10.0.0.1:8001".to_owned())]
    );
    assert_eq!(*recorder.0.lock().unwrap(), vec![4, 5]);

    // Filters come first within a profile; a second profile's sites follow.
    let s = Scheduler::new(vec![filter], Arc::new(SingleProfileHandler::default()))
        .unwrap()
        .with_observer(recorder.clone());
    recorder.0.lock().unwrap().clear();
    assert!(s.schedule(&req, &snap).is_err(), "everything filtered");
    assert_eq!(*recorder.0.lock().unwrap(), vec![0, 1, 0]);
    assert_eq!(s.call_sites()[1].point, E::Filter);
}

/// Prefers the endpoint with the shortest waiting queue, as scraped.
#[derive(Debug)]
struct ShortestQueue;
impl Plugin for ShortestQueue {
    fn type_name(&self) -> &str {
        "shortest-queue"
    }
    fn name(&self) -> &str {
        "shortest-queue"
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}
impl Scorer for ShortestQueue {
    fn score(&self, _: &CycleContext<'_>, c: &[Candidate], out: &mut [f64]) {
        for (c, s) in c.iter().zip(out) {
            *s = 1.0 / (1.0 + c.metrics.waiting as f64);
        }
    }
}

/// One scratch kept across cycles (as each server thread keeps one) must
/// see every metrics update and every membership change, even though it
/// keeps candidates from one cycle to the next.
#[test]
fn reused_scratch_follows_metrics_and_membership() {
    let profile = SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(Arc::new(ShortestQueue)), 1.0)
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    let s = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default())).unwrap();
    let req = InferenceRequest::builder("m").build();
    let mut scratch = Scratch::seeded(1);
    let mut result = SchedulingResult::default();
    let queue = |e: &Endpoint, waiting| {
        e.set_metrics(EndpointMetrics {
            waiting,
            ..EndpointMetrics::fresh()
        });
    };

    let snap = snapshot(3);
    for (e, q) in snap.endpoints().iter().zip([5, 0, 9]) {
        queue(e, q);
    }
    s.schedule_into(&req, &snap, &mut scratch, &mut result)
        .unwrap();
    assert_eq!(ids(&result), vec![1, 0, 2]);

    // A scrape lands on two endpoints between cycles.
    queue(&snap.endpoints()[1], 20);
    snap.endpoints()[2].update_metrics(|m| EndpointMetrics {
        waiting: 1,
        ..m.clone()
    });
    s.schedule_into(&req, &snap, &mut scratch, &mut result)
        .unwrap();
    assert_eq!(ids(&result), vec![2, 0, 1]);

    // Discovery replaces endpoint 1 by a new object with the same id and
    // address, and drops endpoint 2: the old objects must not be used.
    let mut next: Vec<_> = snap.endpoints()[..1].to_vec();
    let replaced = Arc::new(Endpoint::new(1, snap.endpoints()[1].addr()));
    queue(&replaced, 0);
    next.push(Arc::clone(&replaced));
    let next = EndpointSnapshot::new(next);
    s.schedule_into(&req, &next, &mut scratch, &mut result)
        .unwrap();
    assert_eq!(ids(&result), vec![1, 0]);
    assert!(Arc::ptr_eq(
        &result.primary_run().unwrap().targets[0],
        &replaced
    ));
}

/// Keeps what a recorded cycle reports.
#[derive(Debug, Default)]
struct Cycle {
    calls: Vec<(usize, std::time::Instant, std::time::Instant)>,
    runs: Vec<crate::ProfileRun>,
}
impl crate::CycleRecorder for Cycle {
    fn plugin_call(&mut self, site: usize, start: std::time::Instant, end: std::time::Instant) {
        self.calls.push((site, start, end));
    }
    fn profile_run(&mut self, run: crate::ProfileRun) {
        self.runs.push(run);
    }
}

#[test]
fn a_recorded_cycle_reports_calls_in_order_and_each_profile_run() {
    let profile = SchedulingProfile::new("p")
        .with_filter(PluginRef::new(Arc::new(DropAll)))
        .with_scorer(PluginRef::new(Arc::new(Fixed(vec![1.0]))), 1.0)
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    // No observer: the recorder alone makes the cycle read the clock.
    let s = scheduler(vec![0.3, 0.6]);
    let snap = snapshot(2);
    let req = InferenceRequest::builder("m").build();
    let mut cycle = Cycle::default();
    let r = s.schedule_recorded(&req, &snap, &mut cycle).unwrap();
    assert_eq!(ids(&r), vec![1, 0], "the same decision as unrecorded");
    let sites: Vec<usize> = cycle.calls.iter().map(|c| c.0).collect();
    assert_eq!(sites, vec![0, 1, 2, 0]);
    // In order, and none ends before it starts.
    for w in cycle.calls.windows(2) {
        assert!(w[0].1 <= w[0].2 && w[0].2 <= w[1].1);
    }
    assert_eq!(cycle.runs.len(), 1);
    let run = cycle.runs[0];
    assert_eq!((run.profile, run.candidates, run.filtered), (0, 2, 2));
    assert!(run.start <= cycle.calls[1].1 && run.end == cycle.calls[2].2);

    // A run whose filter drops everything still reports it, with 0 left.
    let s = Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default())).unwrap();
    let mut cycle = Cycle::default();
    assert!(s.schedule_recorded(&req, &snap, &mut cycle).is_err());
    assert_eq!(cycle.runs.len(), 1);
    assert_eq!((cycle.runs[0].candidates, cycle.runs[0].filtered), (2, 0));
}

/// Keeps odd endpoint ids only.
#[derive(Debug)]
struct KeepOdd;
impl Plugin for KeepOdd {
    fn type_name(&self) -> &str {
        "keep-odd"
    }
    fn name(&self) -> &str {
        "odd"
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}
impl Filter for KeepOdd {
    fn filter(&self, _: &mut CycleContext<'_>, c: &mut Vec<Candidate>) {
        c.retain(|c| c.id().0 % 2 == 1);
    }
}

/// Keeps the candidates a recorded cycle reports, as ids, event by event.
#[derive(Debug, Default)]
struct Detail {
    wants: bool,
    events: Vec<String>,
}
impl crate::CycleRecorder for Detail {
    fn plugin_call(&mut self, _: usize, _: std::time::Instant, _: std::time::Instant) {}
    fn profile_run(&mut self, run: crate::ProfileRun) {
        self.events.push(format!("run {}", run.profile));
    }
    fn records_candidates(&self) -> bool {
        self.wants
    }
    fn cycle_candidates(&mut self, c: &[Candidate]) {
        self.events.push(format!("cycle {:?}", id_list(c)));
    }
    fn filtered(&mut self, site: usize, kept: &[Candidate]) {
        self.events
            .push(format!("filter@{site} kept {:?}", id_list(kept)));
    }
    fn scored(&mut self, site: usize, c: &[Candidate], weight: f64, scores: &[f64]) {
        self.events.push(format!(
            "scorer@{site} w{weight} {:?} {scores:?}",
            id_list(c)
        ));
    }
    fn picked(&mut self, profile: usize, c: &[Candidate], totals: &[f64], picks: &[usize]) {
        self.events.push(format!(
            "picker of {profile} {:?} {totals:?} {picks:?}",
            id_list(c)
        ));
    }
}

fn id_list(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.id().0).collect()
}

#[test]
fn a_recorder_of_candidates_sees_every_filter_scorer_and_pick() {
    let keep_odd = SchedulingProfile::new("odd")
        .with_filter(PluginRef::new(Arc::new(KeepOdd)))
        .with_scorer(
            PluginRef::new(Arc::new(Fixed(vec![0.5, f64::NAN, 7.0, 0.25, 0.0]))),
            2.0,
        )
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    let s = Scheduler::new(vec![keep_odd], Arc::new(SingleProfileHandler::default())).unwrap();
    let snap = snapshot(5);
    // Endpoint 4 is outside the subset: no profile run sees it.
    let subset = (0..4).map(|i| snap.endpoints()[i].addr()).collect();
    let req = InferenceRequest::builder("m").subset(subset).build();
    let mut detail = Detail {
        wants: true,
        ..Detail::default()
    };
    let r = s.schedule_recorded(&req, &snap, &mut detail).unwrap();
    assert_eq!(ids(&r), vec![3, 1], "the same decision as unrecorded");
    // Sites: 0 the profile picker, 1 the filter, 2 the scorer, 3 the picker.
    // Scores as the scorer wrote them (NaN included); totals weighted and clamped.
    assert_eq!(
        detail.events,
        [
            "cycle [0, 1, 2, 3]",
            "filter@1 kept [1, 3]",
            "scorer@2 w2 [1, 3] [NaN, 0.25]",
            "picker of 0 [1, 3] [0.0, 0.5] [1, 0]",
            "run 0",
        ]
    );

    // A run whose filter drops everything: the picker's report is empty.
    let strict = SchedulingProfile::new("strict")
        .with_filter(PluginRef::new(Arc::new(DropAll)))
        .with_picker(PluginRef::new(Arc::new(AllDesc)));
    let s = Scheduler::new(vec![strict], Arc::new(SingleProfileHandler::default())).unwrap();
    let mut detail = Detail {
        wants: true,
        ..Detail::default()
    };
    let req = InferenceRequest::builder("m").build();
    assert!(s.schedule_recorded(&req, &snap, &mut detail).is_err());
    assert_eq!(
        detail.events,
        [
            "cycle [0, 1, 2, 3, 4]",
            "filter@1 kept []",
            "picker of 0 [] [] []",
            "run 0",
        ]
    );

    // A recorder that does not ask for candidates is told of runs only.
    let mut timing_only = Detail::default();
    assert!(s.schedule_recorded(&req, &snap, &mut timing_only).is_err());
    assert_eq!(timing_only.events, ["run 0"]);
}

/// Leaves one unit of work per decision for after its reply.
#[derive(Debug, Default)]
struct Leaves {
    left: AtomicU32,
    done: AtomicU32,
}
impl Plugin for Leaves {
    fn type_name(&self) -> &str {
        "leaves"
    }
    fn name(&self) -> &str {
        "leaves"
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
    fn as_deferred_work(&self) -> Option<&dyn DeferredWork> {
        Some(self)
    }
}
impl PreRequest for Leaves {
    fn pre_request(&self, _: &CycleContext<'_>, _: &SchedulingResult) {
        self.left.fetch_add(1, Relaxed);
    }
}
impl DeferredWork for Leaves {
    fn run_deferred(&self) {
        let left = self.left.swap(0, Relaxed);
        self.done.fetch_add(left, Relaxed);
    }
}

#[test]
fn deferred_work_runs_when_the_host_asks() {
    assert!(!scheduler(vec![1.0; 3]).has_deferred_work());
    let leaves = Arc::new(Leaves::default());
    let s = scheduler(vec![1.0; 3]).with_hooks([PluginRef::new(leaves.clone())]);
    assert!(s.has_deferred_work());
    let req = InferenceRequest::builder("m").build();
    for _ in 0..3 {
        s.schedule(&req, &snapshot(3)).unwrap();
    }
    let count = |a: &AtomicU32| a.load(Relaxed);
    assert_eq!((count(&leaves.left), count(&leaves.done)), (3, 0));
    s.run_deferred();
    assert_eq!((count(&leaves.left), count(&leaves.done)), (0, 3));
}
