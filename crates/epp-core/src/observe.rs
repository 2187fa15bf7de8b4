//! Timing of plugin calls, for whoever exports it (the binary's Prometheus
//! histograms). The core has no metrics dependency: it reports each call's
//! duration to an optional [`SchedulerObserver`] by *call site*, a dense index
//! the observer resolves once, up front, to its own storage.

use std::{
    fmt,
    time::{Duration, Instant},
};

use crate::PluginRef;

/// Where in a scheduling cycle (or the response path) a plugin was called.
/// [`Self::as_str`] gives the reference picker's `extension_point` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExtensionPoint {
    /// The profile handler choosing the next profile.
    ProfilePicker,
    /// The saturation detector judging whether to shed a sheddable request.
    SaturationDetector,
    /// A data producer filling per-cycle state.
    DataProducer,
    /// An admitter deciding whether the request is admitted.
    Admitter,
    /// A filter.
    Filter,
    /// A scorer (including applying its weight).
    Scorer,
    /// A picker.
    Picker,
    /// A pre-request hook after the decision.
    PreRequest,
    /// Response hooks when the response headers arrive.
    ResponseReceived,
    /// Response hooks when the response completes (usage and outcome).
    ResponseComplete,
}

impl ExtensionPoint {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProfilePicker => "ProfilePicker",
            Self::SaturationDetector => "SaturationDetector",
            Self::DataProducer => "DataProducer",
            Self::Admitter => "Admitter",
            Self::Filter => "Filter",
            Self::Scorer => "Scorer",
            Self::Picker => "Picker",
            Self::PreRequest => "PreRequest",
            Self::ResponseReceived => "ResponseReceived",
            Self::ResponseComplete => "ResponseComplete",
        }
    }
}

impl fmt::Display for ExtensionPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One place a plugin is called from: the extension point and the plugin.
/// [`crate::Scheduler::call_sites`] lists them; an observer receives their
/// index.
#[derive(Debug, Clone)]
pub struct CallSite {
    /// The extension point.
    pub point: ExtensionPoint,
    /// The plugin called there.
    pub plugin: PluginRef,
}

/// Receives the duration of every plugin call of a scheduler that has one
/// ([`crate::Scheduler::with_observer`]).
///
/// Called on the scheduling hot path, from any thread: implementations must
/// be cheap, must not block and should not allocate (resolve
/// [`crate::Scheduler::call_sites`] to storage once, then index it).
pub trait SchedulerObserver: Send + Sync + fmt::Debug {
    /// The plugin at call site `site` (an index into
    /// [`crate::Scheduler::call_sites`]) ran for `took`.
    fn plugin_call(&self, site: usize, took: Duration);
}

/// Chains clock reads so each timed call costs one: a lap ends at the read
/// that starts the next. Without an observer nothing reads the clock.
pub(crate) struct Laps<'o> {
    observer: Option<&'o dyn SchedulerObserver>,
    last: Option<Instant>,
}

impl<'o> Laps<'o> {
    /// Laps starting at `start`.
    pub(crate) fn new(observer: Option<&'o dyn SchedulerObserver>, start: Instant) -> Self {
        Self {
            observer,
            last: Some(start),
        }
    }

    /// Laps starting now (the clock is read only with an observer).
    pub(crate) fn now(observer: Option<&'o dyn SchedulerObserver>) -> Self {
        Self {
            last: observer.map(|_| Instant::now()),
            observer,
        }
    }

    /// Whether calls are timed.
    pub(crate) fn active(&self) -> bool {
        self.observer.is_some()
    }

    /// Restarts the lap (after work that belongs to no plugin).
    pub(crate) fn restart(&mut self) {
        if self.observer.is_some() {
            self.last = Some(Instant::now());
        }
    }

    /// The plugin at `site` ran since the last lap.
    pub(crate) fn lap(&mut self, site: usize) {
        if let (Some(o), Some(last)) = (self.observer, self.last) {
            let now = Instant::now();
            o.plugin_call(site, now.saturating_duration_since(last));
            self.last = Some(now);
        }
    }
}

/// A metric family a plugin reports ([`PluginMetrics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricFamily {
    /// Prometheus name (a counter's without `_total`, which the exporter adds).
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
}

/// Receives the series a plugin reports, at scrape time. The exporter groups
/// series by family; labels are `(name, value)` pairs.
pub trait MetricSink {
    /// A gauge.
    fn gauge(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: f64);
    /// A counter (monotonic).
    fn counter(&mut self, family: MetricFamily, labels: &[(&str, &str)], value: u64);
    /// A histogram: `buckets` are `(upper bound, count in that bucket)`,
    /// ascending, not cumulative; the last bound is `f64::MAX` (+Inf).
    fn histogram(
        &mut self,
        family: MetricFamily,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    );
}

/// Metrics a plugin keeps itself (how well it predicts, how much it holds),
/// read whenever the picker's metrics are scraped. The core does not format
/// them: whoever exports metrics (the binary) gives a [`MetricSink`].
pub trait PluginMetrics {
    /// Reports every series now.
    fn report(&self, out: &mut dyn MetricSink);
}
