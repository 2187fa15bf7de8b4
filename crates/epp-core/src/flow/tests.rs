use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
    time::{Duration, Instant},
};

use super::*;
use crate::{Plugin, PluginRef};

/// Arrival order.
#[derive(Debug)]
struct Fifo;
impl Plugin for Fifo {
    fn type_name(&self) -> &str {
        "fifo"
    }
    fn name(&self) -> &str {
        "fifo"
    }
    fn as_ordering_policy(&self) -> Option<&dyn OrderingPolicy> {
        Some(self)
    }
}
impl OrderingPolicy for Fifo {
    fn order_key(&self, item: &QueuedItem, epoch: Instant) -> OrderKey {
        (nanos_since(epoch, item.enqueued), 0)
    }
}

/// The flow whose head is smallest.
#[derive(Debug)]
struct Strict;
impl Plugin for Strict {
    fn type_name(&self) -> &str {
        "strict"
    }
    fn name(&self) -> &str {
        "strict"
    }
    fn as_fairness_policy(&self) -> Option<&dyn FairnessPolicy> {
        Some(self)
    }
}
impl FairnessPolicy for Strict {
    fn pick(&self, flows: &[FlowHead<'_>], _: &mut FairnessCursor) -> Option<usize> {
        (0..flows.len()).min_by_key(|&i| flows[i].head)
    }
}

/// Fixed ceilings per rank (missing: 1.0).
#[derive(Debug, Default)]
struct Ceilings(Vec<f64>);
impl Plugin for Ceilings {
    fn type_name(&self) -> &str {
        "ceilings"
    }
    fn name(&self) -> &str {
        "ceilings"
    }
    fn as_usage_limit_policy(&self) -> Option<&dyn UsageLimitPolicy> {
        Some(self)
    }
}
impl UsageLimitPolicy for Ceilings {
    fn ceilings(&self, _: f64, priorities: &[i32], out: &mut Vec<f64>) {
        out.clear();
        out.extend((0..priorities.len()).map(|i| self.0.get(i).copied().unwrap_or(1.0)));
    }
}

/// A pool whose saturation the test sets (`None`: no endpoints).
#[derive(Debug)]
struct Gauge(Mutex<Option<f64>>);
impl Gauge {
    fn set(&self, v: Option<f64>) {
        *self.0.lock().unwrap() = v;
    }
}
impl PoolGauge for Gauge {
    fn saturation(&self) -> Option<f64> {
        *self.0.lock().unwrap()
    }
}

#[derive(Debug, Default)]
struct Recorder {
    finished: Mutex<Vec<(String, i32, Outcome)>>,
    queued: Mutex<BTreeMap<(String, i32), (i64, i64)>>,
    enqueued: Mutex<Vec<(String, i32, Option<Outcome>)>>,
    cycles: AtomicUsize,
    /// The tag of every event, in order.
    tags: Mutex<Vec<u64>>,
}
impl FlowObserver for Recorder {
    fn queue_changed(&self, fairness_id: &str, priority: i32, tag: u64, requests: i64, bytes: i64) {
        self.tags.lock().unwrap().push(tag);
        let mut q = self.queued.lock().unwrap();
        let e = q.entry((fairness_id.to_owned(), priority)).or_default();
        e.0 += requests;
        e.1 += bytes;
    }
    fn finished(&self, fairness_id: &str, priority: i32, tag: u64, outcome: Outcome, _: Duration) {
        self.tags.lock().unwrap().push(tag);
        self.finished
            .lock()
            .unwrap()
            .push((fairness_id.to_owned(), priority, outcome));
    }
    fn enqueued(
        &self,
        fairness_id: &str,
        priority: i32,
        tag: u64,
        refused: Option<Outcome>,
        _: Duration,
    ) {
        self.tags.lock().unwrap().push(tag);
        self.enqueued
            .lock()
            .unwrap()
            .push((fairness_id.to_owned(), priority, refused));
    }
    fn dispatch_cycle(&self, _: Duration) {
        self.cycles.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct CountWake(AtomicUsize);
impl Wake for CountWake {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn plugin(p: impl Plugin + 'static) -> PluginRef {
    PluginRef::new(Arc::new(p))
}

fn band(priority: i32, max_requests: u64, max_bytes: u64) -> BandSettings {
    BandSettings {
        priority,
        max_bytes,
        max_requests,
        fairness: plugin(Strict),
        ordering: plugin(Fifo),
        busiest_flow_ceiling: None,
        active_flow_window: ACTIVE_FLOW_WINDOW,
    }
}

fn settings(ceilings: Vec<f64>) -> FlowSettings {
    FlowSettings {
        max_bytes: 0,
        max_requests: 0,
        default_ttl: None,
        no_endpoint_ttl: None,
        bands: BTreeMap::new(),
        default_band: band(0, 0, 0),
        default_negative_band: None,
        usage_limit: plugin(Ceilings(ceilings)),
    }
}

struct Setup {
    fc: Arc<FlowController>,
    gauge: Arc<Gauge>,
    rec: Arc<Recorder>,
}

fn setup(s: FlowSettings, saturation: Option<f64>) -> Setup {
    let gauge = Arc::new(Gauge(Mutex::new(saturation)));
    let rec = Arc::new(Recorder::default());
    let fc = FlowController::new(s, gauge.clone(), Some(rec.clone() as Arc<dyn FlowObserver>));
    Setup { fc, gauge, rec }
}

fn req(flow: &str, priority: i32, bytes: u64) -> FlowRequest<'_> {
    FlowRequest {
        fairness_id: flow,
        priority,
        bytes,
        received: Instant::now(),
        deadline: None,
        slo_ttft: None,
        tag: 0,
    }
}

/// Each request's tag comes back with every event of it: queued,
/// released, refused and cancelled alike.
#[test]
fn the_observer_gets_each_requests_tag_back() {
    let s = setup(settings(vec![]), Some(2.0));
    let tagged = |tag| FlowRequest {
        tag,
        ..req("f", 0, 1)
    };
    let mut kept = s.fc.enqueue(&tagged(7), None).unwrap();
    let gone = s.fc.enqueue(&tagged(9), None).unwrap();
    drop(gone);
    assert_eq!(*s.rec.tags.lock().unwrap(), [7, 7, 9, 9, 9, 9]);
    s.rec.tags.lock().unwrap().clear();
    s.gauge.set(Some(0.0));
    s.fc.kick();
    assert!(poll(&mut kept).is_some());
    assert_eq!(*s.rec.tags.lock().unwrap(), [7, 7]);
}

fn poll(t: &mut Ticket) -> Option<Release> {
    match t.poll_release(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

#[test]
fn an_unsaturated_pool_releases_at_once() {
    let s = setup(settings(vec![]), Some(0.2));
    let mut t = s.fc.enqueue(&req("a", 0, 10), None).unwrap();
    assert!(poll(&mut t).is_some());
    assert_eq!(s.fc.len(), 0);
    assert_eq!(
        s.rec.finished.lock().unwrap()[0],
        ("a".into(), 0, Outcome::Dispatched)
    );
}

#[test]
fn a_saturated_pool_holds_requests_until_kicked_with_room() {
    let s = setup(settings(vec![]), Some(1.0));
    let mut t = s.fc.enqueue(&req("a", 0, 10), None).unwrap();
    let woken = Arc::new(CountWake::default());
    let waker = Waker::from(woken.clone());
    assert!(
        t.poll_release(&mut Context::from_waker(&waker))
            .is_pending()
    );
    s.fc.kick();
    assert_eq!(woken.0.load(Ordering::SeqCst), 0, "still saturated");
    s.gauge.set(Some(0.5));
    s.fc.kick();
    assert_eq!(woken.0.load(Ordering::SeqCst), 1, "woken on release");
    assert!(poll(&mut t).is_some());
}

#[test]
fn no_endpoints_holds_requests() {
    let s = setup(settings(vec![]), None);
    let mut t = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    assert!(poll(&mut t).is_none());
    s.gauge.set(Some(0.0));
    s.fc.kick();
    assert!(poll(&mut t).is_some());
}

#[test]
fn higher_bands_go_first_and_one_release_at_a_time() {
    let s = setup(settings(vec![]), Some(1.0));
    let mut low = s.fc.enqueue(&req("a", -1, 1), None).unwrap();
    let mut mid = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    let mut high = s.fc.enqueue(&req("b", 5, 1), None).unwrap();
    s.gauge.set(Some(0.0));
    s.fc.kick();
    assert!(poll(&mut low).is_none());
    assert!(poll(&mut mid).is_none());
    let r = poll(&mut high).expect("highest band first");
    // Until that one is routed, nothing else is released.
    s.fc.kick();
    assert!(poll(&mut mid).is_none());
    drop(r);
    let r = poll(&mut mid).expect("then the next band");
    assert!(poll(&mut low).is_none());
    drop(r);
    assert!(poll(&mut low).is_some());
}

#[test]
fn a_released_ticket_dropped_before_routing_lets_the_next_go() {
    let s = setup(settings(vec![]), Some(1.0));
    let first = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    let mut second = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    s.gauge.set(Some(0.0));
    s.fc.kick();
    drop(first);
    assert!(poll(&mut second).is_some());
}

#[test]
fn ceilings_hold_back_lower_bands_and_block_the_line() {
    // Known bands, highest first: 3 (configured) and 0 (always); ceilings
    // by rank: 1.0 and 0.5.
    let with_band_3 = |ceilings: Vec<f64>| {
        let mut st = settings(ceilings);
        st.bands.insert(3, Arc::new(band(3, 0, 0)));
        st
    };
    let s = setup(with_band_3(vec![1.0, 0.5]), Some(1.0));
    let mut low = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    s.gauge.set(Some(0.7));
    s.fc.kick();
    // Band 0 ranks second even while band 3 is empty: held at 0.7.
    assert!(poll(&mut low).is_none());
    let mut high = s.fc.enqueue(&req("a", 3, 1), None).unwrap();
    drop(poll(&mut high).expect("band 3 is below its ceiling"));
    assert!(poll(&mut low).is_none());
    s.gauge.set(Some(0.4));
    s.fc.kick();
    assert!(poll(&mut low).is_some());

    // Head-of-line blocking: a held-back higher band stops the search, even
    // when a lower band's ceiling would let it go.
    let s = setup(with_band_3(vec![0.6, 0.9]), Some(1.0));
    let mut low = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    s.gauge.set(Some(0.7));
    s.fc.kick();
    assert!(poll(&mut low).is_none());
    s.gauge.set(Some(0.5));
    s.fc.kick();
    assert!(poll(&mut low).is_some());
}

#[test]
fn capacity_per_band_and_global() {
    let mut st = settings(vec![]);
    st.bands.insert(1, Arc::new(band(1, 2, 0)));
    st.max_bytes = 100;
    let s = setup(st, Some(1.0));
    let _a = s.fc.enqueue(&req("a", 1, 10), None).unwrap();
    let _b = s.fc.enqueue(&req("a", 1, 10), None).unwrap();
    assert_eq!(
        s.fc.enqueue(&req("a", 1, 10), None).unwrap_err(),
        Rejected(Outcome::RejectedCapacity)
    );
    // Band 0 (template: no limit) is bounded by the global bytes.
    let _c = s.fc.enqueue(&req("a", 0, 70), None).unwrap();
    assert_eq!(
        s.fc.enqueue(&req("a", 0, 11), None).unwrap_err(),
        Rejected(Outcome::RejectedCapacity)
    );
    let _d = s.fc.enqueue(&req("a", 0, 10), None).unwrap();
    s.gauge.set(None);
    assert_eq!(
        s.fc.enqueue(&req("a", 0, 1), None).unwrap_err(),
        Rejected(Outcome::RejectedNoEndpoints)
    );
}

#[test]
fn dropping_a_queued_ticket_cancels_it_and_frees_its_room() {
    let mut st = settings(vec![]);
    st.max_requests = 1;
    let s = setup(st, Some(1.0));
    let t = s.fc.enqueue(&req("a", 0, 7), None).unwrap();
    assert!(s.fc.enqueue(&req("a", 0, 7), None).is_err());
    drop(t);
    assert_eq!(s.fc.len(), 0);
    assert_eq!(
        s.rec.queued.lock().unwrap()[&("a".to_owned(), 0)],
        (0, 0),
        "gauges back to zero"
    );
    assert!(s.rec.finished.lock().unwrap().contains(&(
        "a".into(),
        0,
        Outcome::EvictedContextCancelled
    )));
    let _t = s.fc.enqueue(&req("a", 0, 7), None).unwrap();
}

#[test]
fn expiry_evicts_with_the_reason() {
    let s = setup(settings(vec![]), Some(1.0));
    let t = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    assert_eq!(t.expire().unwrap(), Outcome::EvictedTtl);
    s.gauge.set(None);
    let t = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    assert_eq!(t.expire().unwrap(), Outcome::EvictedNoEndpoints);
    assert_eq!(s.fc.len(), 0);
    // Released before the timer fired: the release wins.
    s.gauge.set(Some(1.0));
    let t = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    s.gauge.set(Some(0.0));
    s.fc.kick();
    assert!(t.expire().is_err());
}

#[test]
fn ttl_is_the_shorter_of_config_and_own_deadline() {
    let mut st = settings(vec![]);
    st.default_ttl = Some(Duration::from_secs(60));
    st.no_endpoint_ttl = Some(Duration::from_secs(300));
    let s = setup(st, Some(0.0));
    let mut r = req("a", 0, 1);
    assert_eq!(s.fc.ttl_for(&r), Some(Duration::from_secs(60)));
    r.deadline = Some(Duration::from_secs(10));
    assert!(s.fc.ttl_for(&r).unwrap() <= Duration::from_secs(10));
    s.gauge.set(None);
    r.deadline = None;
    assert_eq!(s.fc.ttl_for(&r), Some(Duration::from_secs(300)));
}

#[test]
fn flows_within_a_band_follow_the_fairness_policy() {
    let s = setup(settings(vec![]), Some(1.0));
    let mut b1 = s.fc.enqueue(&req("b", 0, 1), None).unwrap();
    let mut a1 = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    s.gauge.set(Some(0.0));
    s.fc.kick();
    // Strict: the earliest head, whatever its flow.
    assert!(poll(&mut a1).is_none());
    drop(poll(&mut b1).unwrap());
    assert!(poll(&mut a1).is_some());
}

#[test]
fn enqueues_and_dispatch_cycles_are_observed() {
    let mut st = settings(vec![]);
    st.max_requests = 2;
    let s = setup(st, Some(1.0));
    let mut a = s.fc.enqueue(&req("a", 0, 1), None).unwrap();
    let _b = s.fc.enqueue(&req("b", 3, 1), None).unwrap();
    assert!(s.fc.enqueue(&req("c", 0, 1), None).is_err());
    assert_eq!(
        *s.rec.enqueued.lock().unwrap(),
        [
            ("a".to_owned(), 0, None),
            ("b".to_owned(), 3, None),
            ("c".to_owned(), 0, Some(Outcome::RejectedCapacity)),
        ]
    );
    // One cycle per accepted enqueue (the pool is saturated: none released).
    assert_eq!(s.rec.cycles.load(Ordering::SeqCst), 2);
    s.fc.kick();
    assert_eq!(s.rec.cycles.load(Ordering::SeqCst), 3);
    s.gauge.set(Some(0.0));
    s.fc.kick();
    assert_eq!(s.rec.cycles.load(Ordering::SeqCst), 4);
    // One released and not routed: no cycle until it is.
    s.fc.kick();
    assert_eq!(s.rec.cycles.load(Ordering::SeqCst), 4);
    assert!(poll(&mut a).is_none(), "band 3 goes first");
    // Nothing queued: kicks run no cycle.
    let s = setup(settings(vec![]), Some(0.0));
    s.fc.kick();
    assert_eq!(s.rec.cycles.load(Ordering::SeqCst), 0);
}

#[test]
fn usage_reports_every_band_against_its_limits() {
    let mut st = settings(vec![]);
    st.bands.insert(2, Arc::new(band(2, 10, 1000)));
    st.max_requests = 50;
    let s = setup(st, Some(1.0));
    let _a = s.fc.enqueue(&req("a", 2, 100), None).unwrap();
    let _b = s.fc.enqueue(&req("b", 2, 50), None).unwrap();
    let _c = s.fc.enqueue(&req("c", -1, 7), None).unwrap();
    let u = s.fc.usage();
    assert_eq!((u.requests, u.bytes), (3, 157));
    let bands: Vec<_> = u
        .bands
        .iter()
        .map(|b| (b.priority, b.requests, b.bytes, b.max_requests, b.max_bytes))
        .collect();
    // Highest first: the configured band, priority 0 (always known), and
    // the band made for priority -1 from the template.
    assert_eq!(
        bands,
        [(2, 2, 150, 10, 1000), (0, 0, 0, 0, 0), (-1, 1, 7, 0, 0)]
    );
    assert_eq!(s.fc.saturation(), Some(1.0));
}

/// A controller whose default band holds its busiest flows back from
/// saturation 0.75 on, with an active-flow `window`.
fn busiest_held(window: Duration) -> Setup {
    let mut st = settings(vec![]);
    st.default_band.busiest_flow_ceiling = Some(0.75);
    st.default_band.active_flow_window = window;
    setup(st, Some(0.0))
}

/// Releases one request of `flow` at once and keeps it in flight.
fn in_flight(s: &Setup, flow: &str) -> InFlight {
    let mut t = s.fc.enqueue(&req(flow, 0, 1), None).unwrap();
    let mut r = poll(&mut t).expect("released at once");
    r.in_flight().expect("taken once")
}

#[test]
fn past_the_busiest_flow_ceiling_the_busiest_flow_waits_for_the_others() {
    let s = busiest_held(Duration::from_secs(60));
    let heavy = [in_flight(&s, "heavy"), in_flight(&s, "heavy")];
    let light = in_flight(&s, "light");
    s.gauge.set(Some(0.8));
    let mut h = s.fc.enqueue(&req("heavy", 0, 1), None).unwrap();
    let mut l = s.fc.enqueue(&req("light", 0, 1), None).unwrap();
    // Heavy has the most in flight (2 against 1): only light goes on,
    // though heavy's request came first and the pool is not saturated.
    assert!(poll(&mut h).is_none());
    let mut r = poll(&mut l).expect("the lighter flow is released");
    let light_2 = r.in_flight().unwrap();
    drop(r);
    // Now both have 2 in flight: both are the busiest, both wait.
    let mut l = s.fc.enqueue(&req("light", 0, 1), None).unwrap();
    s.fc.kick();
    assert!(poll(&mut h).is_none());
    assert!(poll(&mut l).is_none());
    // One of light's requests ends: light is below heavy again.
    drop(light_2);
    assert!(poll(&mut h).is_none());
    drop(poll(&mut l).expect("released when light's request ended"));
    // Below the ceiling nobody waits for anybody.
    s.gauge.set(Some(0.5));
    s.fc.kick();
    assert!(poll(&mut h).is_some());
    drop((heavy, light));
}

#[test]
fn a_flow_alone_is_never_held_back_for_its_own_share() {
    let s = busiest_held(Duration::ZERO);
    let first = in_flight(&s, "heavy");
    s.gauge.set(Some(0.9));
    let mut t = s.fc.enqueue(&req("heavy", 0, 1), None).unwrap();
    assert!(poll(&mut t).is_some(), "no other flow is active");
    drop(first);
}

#[test]
fn a_flow_counts_as_active_for_the_window_after_its_last_release() {
    let s = busiest_held(Duration::from_millis(200));
    let heavy = in_flight(&s, "heavy");
    // Light's request ends at once; within the window heavy still waits.
    drop(in_flight(&s, "light"));
    s.gauge.set(Some(0.9));
    let mut t = s.fc.enqueue(&req("heavy", 0, 1), None).unwrap();
    assert!(poll(&mut t).is_none(), "light is active for the window");
    std::thread::sleep(Duration::from_millis(250));
    s.fc.kick();
    assert!(poll(&mut t).is_some(), "light went quiet: heavy is alone");
    drop(heavy);
}

#[test]
fn a_release_without_its_in_flight_counts_until_it_is_dropped() {
    let s = busiest_held(Duration::ZERO);
    let light = in_flight(&s, "light");
    // Heavy's release dropped without taking its in-flight share: heavy
    // holds nothing in flight, so it is not held back for light's one.
    let mut t = s.fc.enqueue(&req("heavy", 0, 1), None).unwrap();
    drop(poll(&mut t).unwrap());
    s.gauge.set(Some(0.9));
    let mut h = s.fc.enqueue(&req("heavy", 0, 1), None).unwrap();
    let mut r = poll(&mut h).expect("heavy is the lighter flow now");
    let _h = r.in_flight().unwrap();
    drop(r);
    // Light's request ends; two more come: the first is released (light
    // has 0 in flight, heavy 1). Its ticket dropped before its release was
    // taken counts it out of flight again, so the second goes too (with
    // light still at 1 both flows would be the busiest and both wait).
    drop(light);
    let l1 = s.fc.enqueue(&req("light", 0, 1), None).unwrap();
    let mut l2 = s.fc.enqueue(&req("light", 0, 1), None).unwrap();
    assert!(poll(&mut l2).is_none(), "one release at a time");
    drop(l1);
    assert!(poll(&mut l2).is_some());
}

#[test]
fn a_band_without_the_ceiling_holds_no_flow_back() {
    let s = setup(settings(vec![]), Some(0.0));
    let heavy = [in_flight(&s, "heavy"), in_flight(&s, "heavy")];
    let light = in_flight(&s, "light");
    s.gauge.set(Some(0.9));
    let mut h = s.fc.enqueue(&req("heavy", 0, 1), None).unwrap();
    assert!(poll(&mut h).is_some());
    drop((heavy, light));
}

/// Flows the band tracks for its busiest-flow ceiling, over every band.
fn tracked(s: &Setup) -> usize {
    s.fc.lock().bands.values().map(|b| b.active.len()).sum()
}

#[test]
fn flows_no_longer_active_are_forgotten() {
    // Fairness ids come from a header: what is kept of them must not grow
    // with every id ever seen.
    let s = busiest_held(Duration::from_millis(50));
    for i in 0..100 {
        drop(in_flight(&s, &format!("tenant-{i}")));
    }
    assert_eq!(tracked(&s), 100, "active within the window");
    std::thread::sleep(Duration::from_millis(60));
    drop(in_flight(&s, "next"));
    assert_eq!(tracked(&s), 1, "only the flow just released");

    let s = setup(settings(vec![]), Some(0.0));
    drop(in_flight(&s, "a"));
    assert_eq!(tracked(&s), 0, "nothing tracked without the ceiling");
}
