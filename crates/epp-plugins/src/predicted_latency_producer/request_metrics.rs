//! llm-d's per-model series of its predicted-latency plugin ("Predicted
//! latency and SLO" in llm-d's metrics catalogue), kept by
//! `predicted-latency-producer` so dashboards built on them work unchanged.
//!
//! Every series carries `{plugin_name, plugin_type, model_name,
//! target_model_name}` and has a deprecated `inference_objective_` twin
//! with `{model_name, target_model_name}` only, as llm-d emits both:
//!
//! | series (`llm_d_epp_` …) | what |
//! |---|---|
//! | `request_predicted_ttft_seconds` | histogram, per completed 2xx response: the TTFT predicted for the endpoint when it was picked |
//! | `request_predicted_tpot_seconds` | histogram, per response with an observed TPOT: the TPOT predicted for it |
//! | `request_ttft_prediction_duration_seconds`, `request_tpot_prediction_duration_seconds` | histogram, per scheduling cycle that predicted: the time the producer spent predicting for every candidate (one pass predicts both, so both get the same value, as in llm-d) |
//! | `request_slo_violation_total{type}` | counter: responses whose observed TTFT (`type="ttft"`) or TPOT (`"tpot"`) exceeded the request's stated objective |
//! | `inference_request_metric{type}` | gauge: the last value of each of `ttft`, `predicted_ttft`, `tpot`, `predicted_tpot`, `ttft_prediction_duration`, `tpot_prediction_duration` (seconds) and `ttft_slo_violation`, `tpot_slo_violation` (1 when the last response with that objective missed it, else 0) |
//!
//! Observed TTFT here is what the client saw: the first body bytes of a
//! streamed response, the whole response otherwise (its first token comes
//! with its last); observed TPOT only for a streamed response of ≥ 2
//! tokens. llm-d's deprecated prediction-duration series swap the model and
//! target-model labels; here they are not swapped. Past 1,000 model names
//! (both labels together), later ones are reported as `other`.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use epp_core::{AtomicHistogram, InferenceRequest, LabelCap, MetricFamily, MetricSink};
use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};

/// Latency bounds, seconds: 5 ms … 1 h (llm-d's).
const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];
/// Time per output token bounds, seconds: 0.5 ms … 6 min (llm-d's).
const TPOT_BOUNDS: &[f64] = &[
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 12.0, 18.0, 24.0, 30.0, 36.0, 48.0, 60.0, 90.0, 120.0,
    180.0, 270.0, 360.0,
];
/// Prediction duration bounds, seconds: 0.1 ms … 5 s (llm-d's).
const DURATION_BOUNDS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

/// A family under llm-d's current name and its deprecated twin.
struct Names {
    current: MetricFamily,
    deprecated: MetricFamily,
}

macro_rules! names {
    ($name:literal, $help:literal) => {
        Names {
            current: MetricFamily {
                name: concat!("llm_d_epp_", $name),
                help: $help,
            },
            deprecated: MetricFamily {
                name: concat!("inference_objective_", $name),
                help: concat!("[Deprecated: use llm_d_epp_", $name, "] ", $help),
            },
        }
    };
}

const PREDICTED_TTFT: Names = names!(
    "request_predicted_ttft_seconds",
    "TTFT predicted for the picked endpoint, per completed response, seconds"
);
const PREDICTED_TPOT: Names = names!(
    "request_predicted_tpot_seconds",
    "TPOT predicted for the picked endpoint, per response with an observed TPOT, seconds"
);
const TTFT_DURATION: Names = names!(
    "request_ttft_prediction_duration_seconds",
    "Time spent predicting TTFT for a request's candidates, seconds"
);
const TPOT_DURATION: Names = names!(
    "request_tpot_prediction_duration_seconds",
    "Time spent predicting TPOT for a request's candidates, seconds"
);
const VIOLATIONS: Names = names!(
    "request_slo_violation",
    "Responses whose observed TTFT or TPOT exceeded the request's objective, by type"
);
const LAST: Names = names!(
    "inference_request_metric",
    "Last observed and predicted TTFT and TPOT, prediction durations (seconds) and whether the \
     last response with an objective missed it, by type"
);

/// `type` values of [`LAST`], in [`ModelSeries::last`]'s order.
const LAST_TYPES: [&str; 8] = [
    "ttft",
    "predicted_ttft",
    "tpot",
    "predicted_tpot",
    "ttft_prediction_duration",
    "tpot_prediction_duration",
    "ttft_slo_violation",
    "tpot_slo_violation",
];
const TTFT: usize = 0;
const PREDICTED_TTFT_LAST: usize = 1;
const TPOT: usize = 2;
const PREDICTED_TPOT_LAST: usize = 3;
const TTFT_DURATION_LAST: usize = 4;
const TPOT_DURATION_LAST: usize = 5;
const TTFT_VIOLATION: usize = 6;
const TPOT_VIOLATION: usize = 7;

/// One (model, target model)'s series.
#[derive(Debug)]
struct ModelSeries {
    predicted_ttft: AtomicHistogram,
    predicted_tpot: AtomicHistogram,
    /// One pass predicts both latencies: one histogram serves both names.
    duration: AtomicHistogram,
    /// TTFT, TPOT.
    violations: [AtomicU64; 2],
    /// By [`LAST_TYPES`]; `f64` bits, NaN while never set (not reported).
    last: [AtomicU64; LAST_TYPES.len()],
}

impl Default for ModelSeries {
    fn default() -> Self {
        Self {
            predicted_ttft: AtomicHistogram::new(LATENCY_BOUNDS),
            predicted_tpot: AtomicHistogram::new(TPOT_BOUNDS),
            duration: AtomicHistogram::new(DURATION_BOUNDS),
            violations: Default::default(),
            last: std::array::from_fn(|_| AtomicU64::new(f64::NAN.to_bits())),
        }
    }
}

impl ModelSeries {
    fn set(&self, which: usize, v: f64) {
        self.last[which].store(v.to_bits(), Ordering::Relaxed);
    }

    /// Records whether `observed` missed `objective` (milliseconds both).
    fn judge(&self, observed: f64, objective: Option<f64>, counter: usize, gauge: usize) {
        if let Some(objective) = objective.filter(|o| *o > 0.0) {
            let missed = observed > objective;
            if missed {
                self.violations[counter].fetch_add(1, Ordering::Relaxed);
            }
            self.set(gauge, f64::from(u8::from(missed)));
        }
    }
}

/// A completed response as these series see it, milliseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Observed {
    /// Time to first token as the client saw it.
    pub(super) ttft_ms: f64,
    /// Time per output token, when streamed with ≥ 2 tokens.
    pub(super) tpot_ms: Option<f64>,
    /// What was predicted for the picked endpoint, when anything was.
    pub(super) predicted_ttft_ms: Option<f64>,
    pub(super) predicted_tpot_ms: Option<f64>,
    /// The request's objectives, as stated (unbuffered).
    pub(super) ttft_objective_ms: Option<f64>,
    pub(super) tpot_objective_ms: Option<f64>,
}

/// Target model → series.
type Targets = HashMap<String, ModelSeries, foldhash::fast::RandomState>;

/// The series of every (model, target model) seen.
#[derive(Debug, Default)]
pub(super) struct RequestMetrics {
    /// Caps the values of both model labels together.
    models: LabelCap,
    /// Model → target model → series.
    series: RwLock<HashMap<String, Targets, foldhash::fast::RandomState>>,
}

impl RequestMetrics {
    /// Runs `f` on the series of `request`'s model and target model
    /// (created on first use). Every cycle that predicts comes here: a
    /// model pair already seen costs a read lock and two lookups, without
    /// consulting the cap (a value past it has no series of its own, so it
    /// takes the slow way, to `other`'s).
    fn with(&self, request: &InferenceRequest, f: impl FnOnce(&ModelSeries)) {
        if let Some(s) = self.read(&request.model, &request.target_model) {
            return f(&s);
        }
        let model = self.models.label(&request.model);
        let target = self.models.label(&request.target_model);
        // Past the cap, every new name shares `other`'s series: a read lock
        // again, not a write lock per request.
        if let Some(s) = self.read(model, target) {
            return f(&s);
        }
        let mut map = self.series.write();
        let targets = map.entry(model.to_owned()).or_default();
        f(targets.entry(target.to_owned()).or_default());
    }

    /// The series of `model` and `target`, if they have one, under the read
    /// lock.
    fn read(&self, model: &str, target: &str) -> Option<MappedRwLockReadGuard<'_, ModelSeries>> {
        RwLockReadGuard::try_map(self.series.read(), |m| m.get(model)?.get(target)).ok()
    }

    /// A scheduling cycle spent `took` predicting for `request`'s
    /// candidates.
    pub(super) fn predicted(&self, request: &InferenceRequest, took: Duration) {
        let secs = took.as_secs_f64();
        self.with(request, |s| {
            s.duration.observe(secs);
            s.set(TTFT_DURATION_LAST, secs);
            s.set(TPOT_DURATION_LAST, secs);
        });
    }

    /// `request`'s response completed (2xx) as `o` says.
    pub(super) fn completed(&self, request: &InferenceRequest, o: &Observed) {
        self.with(request, |s| {
            s.set(TTFT, o.ttft_ms / 1e3);
            if let Some(p) = o.predicted_ttft_ms.filter(|p| p.is_finite() && *p >= 0.0) {
                s.predicted_ttft.observe(p / 1e3);
                s.set(PREDICTED_TTFT_LAST, p / 1e3);
            }
            s.judge(o.ttft_ms, o.ttft_objective_ms, 0, TTFT_VIOLATION);
            if let Some(tpot) = o.tpot_ms {
                s.set(TPOT, tpot / 1e3);
                if let Some(p) = o.predicted_tpot_ms.filter(|p| p.is_finite() && *p >= 0.0) {
                    s.predicted_tpot.observe(p / 1e3);
                    s.set(PREDICTED_TPOT_LAST, p / 1e3);
                }
                s.judge(tpot, o.tpot_objective_ms, 1, TPOT_VIOLATION);
            }
        });
    }

    /// Reports every series; `plugin` is `[("plugin_name", …), ("plugin_type", …)]`.
    pub(super) fn report(&self, out: &mut dyn MetricSink, plugin: [(&str, &str); 2]) {
        let map = self.series.read();
        for (model, targets) in map.iter() {
            for (target, s) in targets {
                let [name, kind] = plugin;
                let models = [
                    ("model_name", model.as_str()),
                    ("target_model_name", target),
                ];
                let full = [name, kind, models[0], models[1]];
                for (names, h) in [
                    (&PREDICTED_TTFT, &s.predicted_ttft),
                    (&PREDICTED_TPOT, &s.predicted_tpot),
                    (&TTFT_DURATION, &s.duration),
                    (&TPOT_DURATION, &s.duration),
                ] {
                    if h.count() > 0 {
                        h.report(out, names.current, &full);
                        h.report(out, names.deprecated, &models);
                    }
                }
                for (ty, v) in ["ttft", "tpot"].into_iter().zip(&s.violations) {
                    let v = v.load(Ordering::Relaxed);
                    if v > 0 {
                        let ty = ("type", ty);
                        out.counter(
                            VIOLATIONS.current,
                            &[name, kind, models[0], models[1], ty],
                            v,
                        );
                        out.counter(VIOLATIONS.deprecated, &[models[0], models[1], ty], v);
                    }
                }
                for (ty, v) in LAST_TYPES.into_iter().zip(&s.last) {
                    let v = f64::from_bits(v.load(Ordering::Relaxed));
                    if !v.is_nan() {
                        let ty = ("type", ty);
                        out.gauge(LAST.current, &[name, kind, models[0], models[1], ty], v);
                        out.gauge(LAST.deprecated, &[models[0], models[1], ty], v);
                    }
                }
            }
        }
    }
}
