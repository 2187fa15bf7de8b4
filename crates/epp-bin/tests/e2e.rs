//! End-to-end tests: real Envoy, real epp, simulator processes, on loopback.
//! If Envoy is missing they fail with the command that installs it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod e2e {
    mod apis;
    mod chart;
    mod custom_metric;
    mod decision_view;
    mod disaggregation;
    mod errors;
    mod flow_control;
    mod inflight_load;
    mod kubernetes;
    mod latency;
    mod llm_d_keys;
    mod logs;
    mod lora_syncer;
    mod metric_names;
    mod metrics_auth;
    mod objectives;
    mod observability;
    mod parsers;
    mod precise_prefix;
    mod prefix;
    mod process;
    mod request_path;
    mod rewrite;
    mod routing;
    mod session;
    mod shutdown;
    mod streaming;
    mod tracing;
    mod trailers;
}
