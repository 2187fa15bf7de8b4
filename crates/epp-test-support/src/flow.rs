//! A flow controller over llm-d's built-in policies with a pool whose
//! saturation the caller sets, and wakers that record which ticket was
//! released: the flow-control benches and memory test share it.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
    time::Instant,
};

use epp_core::{
    PluginRef, PluginSpec, Registry,
    flow::{BandSettings, FlowController, FlowRequest, FlowSettings, PoolGauge, Ticket},
};

/// A pool that is saturated or not, as the caller says.
#[derive(Debug, Default)]
pub struct Switch(pub AtomicBool);

impl PoolGauge for Switch {
    fn saturation(&self) -> Option<f64> {
        Some(if self.0.load(Ordering::Relaxed) {
            1.0
        } else {
            0.0
        })
    }
}

/// Records the index of each woken ticket.
#[derive(Debug)]
struct Woken {
    index: usize,
    log: Arc<Mutex<Vec<usize>>>,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(self.index);
    }
}

/// A controller, its pool switch, and `n` queued tickets.
#[derive(Debug)]
pub struct Queued {
    /// The controller.
    pub fc: Arc<FlowController>,
    /// The pool: saturated while true.
    pub saturated: Arc<Switch>,
    /// The tickets, by enqueue order.
    pub tickets: Vec<Option<Ticket>>,
    wakers: Vec<Waker>,
    log: Arc<Mutex<Vec<usize>>>,
}

/// A controller whose bands use `fairness` and `ordering` (policy types
/// from `registry`), holding nothing yet.
///
/// # Panics
/// A policy type the registry cannot build.
#[must_use]
pub fn controller(
    registry: &Registry,
    fairness: &str,
    ordering: &str,
) -> (Arc<FlowController>, Arc<Switch>) {
    let build = |t: &str| PluginRef::new(registry.build(&PluginSpec::new(t)).expect(t));
    let settings = FlowSettings {
        max_bytes: 0,
        max_requests: 0,
        default_ttl: None,
        no_endpoint_ttl: None,
        bands: std::collections::BTreeMap::new(),
        default_band: BandSettings {
            priority: 0,
            max_bytes: 0,
            max_requests: 0,
            fairness: build(fairness),
            ordering: build(ordering),
            busiest_flow_ceiling: None,
            active_flow_window: epp_core::flow::ACTIVE_FLOW_WINDOW,
        },
        default_negative_band: None,
        usage_limit: build("static-usage-limit-policy"),
    };
    let saturated = Arc::new(Switch(AtomicBool::new(true)));
    let fc = FlowController::new(settings, saturated.clone(), None);
    (fc, saturated)
}

impl Queued {
    /// Queues `n` requests of 4 KiB over `flows` fairness ids and `bands`
    /// priorities (round robin) in a saturated pool, each ticket polled once
    /// so its waker is registered. `flow_ids` must outlive nothing: ids are
    /// copied into the controller.
    ///
    /// # Panics
    /// A request refused (the controller has no limits).
    #[must_use]
    pub fn fill(
        fc: Arc<FlowController>,
        saturated: Arc<Switch>,
        n: usize,
        flows: usize,
        bands: i32,
    ) -> Self {
        let ids: Vec<String> = (0..flows.max(1)).map(|i| format!("tenant-{i}")).collect();
        let log = Arc::new(Mutex::new(Vec::with_capacity(n)));
        let mut tickets = Vec::with_capacity(n);
        let mut wakers = Vec::with_capacity(n);
        let now = Instant::now();
        for i in 0..n {
            let request = FlowRequest {
                fairness_id: &ids[i % ids.len()],
                priority: i32::try_from(i).unwrap_or(0) % bands.max(1),
                bytes: 4096,
                received: now,
                deadline: None,
                slo_ttft: None,
                tag: 0,
            };
            let mut t = fc.enqueue(&request, None).expect("no limits");
            let w = Waker::from(Arc::new(Woken {
                index: i,
                log: Arc::clone(&log),
            }));
            assert!(t.poll_release(&mut Context::from_waker(&w)).is_pending());
            tickets.push(Some(t));
            wakers.push(w);
        }
        Self {
            fc,
            saturated,
            tickets,
            wakers,
            log,
        }
    }

    /// Opens the pool and releases every request, one after another (each
    /// release dropped as soon as taken, as a routed request's is); returns
    /// the tickets' indices in release order.
    ///
    /// # Panics
    /// A woken ticket that is not ready.
    pub fn drain(&mut self) -> Vec<usize> {
        self.saturated.0.store(false, Ordering::Relaxed);
        self.fc.kick();
        let mut order = Vec::with_capacity(self.tickets.len());
        loop {
            let next = {
                let mut log = self
                    .log
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if log.is_empty() {
                    break;
                }
                log.remove(0)
            };
            let waker = &self.wakers[next];
            let Some(t) = self.tickets[next].as_mut() else {
                continue;
            };
            match t.poll_release(&mut Context::from_waker(waker)) {
                Poll::Ready(release) => drop(release),
                Poll::Pending => panic!("ticket {next} woken but not released"),
            }
            order.push(next);
        }
        order
    }
}
