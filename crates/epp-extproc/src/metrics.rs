//! The picker's per-request metrics, with the names of the reference
//! (`inference_objective_*`, `inference_extension_scheduler_e2e_duration_seconds`).
//!
//! They always exist; [`crate::ExtProcService::register_metrics`] exposes them
//! in a `prometheus_client` registry the binary serves.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// `model_name`, `target_model_name`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabels {
    pub(crate) model_name: String,
    pub(crate) target_model_name: String,
}

/// `model_name`, `target_model_name`, `error_code`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    model_name: String,
    target_model_name: String,
    error_code: String,
}

/// `model_name`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunningLabels {
    model_name: String,
}

type HistFamily = Family<ModelLabels, Histogram, fn() -> Histogram>;

fn seconds() -> Histogram {
    // 1 ms … ~9 min.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}
fn sizes() -> Histogram {
    // 64 B … 64 MiB.
    Histogram::new(exponential_buckets(64.0, 4.0, 11))
}
fn token_counts() -> Histogram {
    // 1 … 1 Mi tokens.
    Histogram::new(exponential_buckets(1.0, 4.0, 11))
}
fn per_token() -> Histogram {
    // 0.5 ms … ~4 s per output token.
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// The metric handles (cheap to clone: they share their values).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    requests: Family<ModelLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: HistFamily,
    request_sizes: HistFamily,
    response_sizes: HistFamily,
    input_tokens: HistFamily,
    output_tokens: HistFamily,
    ntpot: HistFamily,
    running: Family<RunningLabels, Gauge>,
    scheduler_e2e: Histogram,
    served_by_fallback: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(seconds),
            request_sizes: Family::new_with_constructor(sizes),
            response_sizes: Family::new_with_constructor(sizes),
            input_tokens: Family::new_with_constructor(token_counts),
            output_tokens: Family::new_with_constructor(token_counts),
            ntpot: Family::new_with_constructor(per_token),
            running: Family::default(),
            scheduler_e2e: Histogram::new(exponential_buckets(0.000_01, 2.0, 20)),
            served_by_fallback: Counter::default(),
        }
    }
}

impl Metrics {
    pub(crate) fn register(&self, r: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        r.register(
            "inference_objective_request",
            "Requests per model and target model",
            self.requests.clone(),
        );
        r.register(
            "inference_objective_request_error",
            "Requests refused or failed, per error code",
            self.errors.clone(),
        );
        r.register(
            "inference_objective_request_duration_seconds",
            "Time from request headers to the end of the response",
            self.duration.clone(),
        );
        r.register(
            "inference_objective_request_sizes",
            "Request body sizes in bytes",
            self.request_sizes.clone(),
        );
        r.register(
            "inference_objective_response_sizes",
            "Response body sizes in bytes",
            self.response_sizes.clone(),
        );
        r.register(
            "inference_objective_input_tokens",
            "Prompt tokens reported by the model server",
            self.input_tokens.clone(),
        );
        r.register(
            "inference_objective_output_tokens",
            "Output tokens reported by the model server",
            self.output_tokens.clone(),
        );
        r.register(
            "inference_objective_normalized_time_per_output_token_seconds",
            "Request duration divided by output tokens",
            self.ntpot.clone(),
        );
        r.register(
            "inference_objective_running_requests",
            "Requests routed and not yet completed, per model",
            self.running.clone(),
        );
        r.register(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time spent in one scheduling decision",
            self.scheduler_e2e.clone(),
        );
        r.register(
            "epp_requests_served_by_fallback",
            "Responses the gateway reported from an endpoint other than the pick \
             (x-gateway-destination-endpoint-served); their in-flight accounting moved there",
            self.served_by_fallback.clone(),
        );
    }

    pub(crate) fn served_by_fallback(&self) {
        self.served_by_fallback.inc();
    }

    pub(crate) fn scheduled(&self, labels: &ModelLabels, body_len: usize) {
        self.requests.get_or_create(labels).inc();
        self.request_sizes
            .get_or_create(labels)
            .observe(body_len as f64);
        self.running
            .get_or_create(&RunningLabels {
                model_name: labels.model_name.clone(),
            })
            .inc();
    }

    pub(crate) fn error(&self, model: &str, target: &str, code: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                model_name: model.to_owned(),
                target_model_name: target.to_owned(),
                error_code: code.to_owned(),
            })
            .inc();
    }

    pub(crate) fn scheduling_took(&self, took: Duration) {
        self.scheduler_e2e.observe(took.as_secs_f64());
    }

    pub(crate) fn completed(
        &self,
        labels: &ModelLabels,
        elapsed: Duration,
        response_bytes: usize,
        usage: Option<epp_core::Usage>,
    ) {
        self.running
            .get_or_create(&RunningLabels {
                model_name: labels.model_name.clone(),
            })
            .dec();
        self.duration
            .get_or_create(labels)
            .observe(elapsed.as_secs_f64());
        self.response_sizes
            .get_or_create(labels)
            .observe(response_bytes as f64);
        if let Some(u) = usage {
            self.input_tokens
                .get_or_create(labels)
                .observe(u.prompt_tokens as f64);
            self.output_tokens
                .get_or_create(labels)
                .observe(u.completion_tokens as f64);
            if u.completion_tokens > 0 {
                self.ntpot
                    .get_or_create(labels)
                    .observe(elapsed.as_secs_f64() / u.completion_tokens as f64);
            }
        }
    }
}
