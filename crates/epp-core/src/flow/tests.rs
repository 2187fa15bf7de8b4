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
