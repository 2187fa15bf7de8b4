//! The reference picker's flags that epp's own do not already cover, in the
//! reference's syntax (`--flag=value`, `--flag value`, `--bool=false`), so
//! its Helm chart and other deployments' arguments start epp unchanged.
//!
//! Where epp has the feature the flag keeps its meaning: `--v` and the
//! `--zap-*` logging flags set the log level and format; the model-server
//! metrics flags configure the default metrics source and the default
//! engine's metric names; `--metrics-endpoint-auth`, `--metrics-cert-dir`,
//! `--metrics-client-ca-file` and `--enable-pprof` secure and extend the
//! metrics port (`metrics_server.rs`); `--tracing` exports spans over OTLP
//! as the `OTEL_*` variables say (`telemetry/`). The others are accepted and, when they ask for
//! something epp does not do, reported once at start (docs/operations.md
//! lists them).

use clap::{ArgAction, Args};
use epp_core::{Registry, Role};
use serde_yaml_ng::{Mapping, Value};

/// Flags of the reference's `options.go` and its logging options.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ReferenceFlags {
    /// Log verbosity as the reference counts it (logr levels): 1–2 info, 3 a
    /// debug line per request, 4 debug from every library, 5 and more trace.
    #[arg(long = "v", value_name = "LEVEL")]
    pub(crate) v: Option<u8>,

    /// `json` logs JSON lines (as --log-json), `console` text.
    #[arg(long, value_name = "json|console")]
    pub(crate) zap_encoder: Option<String>,

    /// `debug`, `info` or `error` (or a number: higher is more verbose, as --v).
    #[arg(long, value_name = "LEVEL")]
    pub(crate) zap_log_level: Option<String>,

    /// zap's development mode (accepted; no effect).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) zap_devel: Option<bool>,

    /// Level from which zap adds stack traces (accepted; no effect).
    #[arg(long, value_name = "LEVEL")]
    pub(crate) zap_stacktrace_level: Option<String>,

    /// zap's time encoding (accepted; no effect: times are RFC 3339).
    #[arg(long, value_name = "ENCODING")]
    pub(crate) zap_time_encoding: Option<String>,

    /// Export OpenTelemetry traces over OTLP, configured by the standard
    /// `OTEL_*` variables (endpoint, protocol, sampler, service name,
    /// resource attributes). Off unless given.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) tracing: Option<bool>,

    /// Serve gRPC health (accepted; it is always served).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) health_checking: Option<bool>,

    /// CPU profiles in the pprof format at `/debug/pprof/profile?seconds=N`
    /// on the metrics port, behind its authentication (default true, as in
    /// the reference).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) enable_pprof: Option<bool>,

    /// Reload --cert-path when it changes (accepted; epp always does).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) enable_cert_reload: Option<bool>,

    /// Serve the ext_proc stream series `llm_d_epp_extproc_*` (accepted;
    /// epp serves them with the llm-d generation of names).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) enable_grpc_stream_metrics: Option<bool>,

    /// Authenticate metrics-port requests with a TokenReview and authorise
    /// them with a SubjectAccessReview (`get` on the request's path) against
    /// the cluster. Default: on whenever epp runs against a cluster (pool or
    /// selector mode); without one, EPP_METRICS_BEARER_TOKEN (if set) is the
    /// accepted token.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) metrics_endpoint_auth: Option<bool>,

    /// Serve the metrics port over TLS with `tls.crt` and `tls.key` from this
    /// directory (reloaded when they change).
    #[arg(long, value_name = "DIR")]
    pub(crate) metrics_cert_dir: Option<std::path::PathBuf>,

    /// PEM CA bundle: the metrics port requires client certificates signed by
    /// one of these CAs (mTLS). Needs --metrics-cert-dir.
    #[arg(long, value_name = "FILE", requires = "metrics_cert_dir")]
    pub(crate) metrics_client_ca_file: Option<std::path::PathBuf>,

    /// How often the reference flushed its pool gauges (accepted; epp
    /// computes them at each scrape of /metrics).
    #[arg(long, value_name = "DURATION")]
    pub(crate) refresh_prometheus_metrics_interval: Option<String>,

    /// Scheme of the default metrics source (`http` or `https`).
    #[arg(long, value_name = "SCHEME")]
    pub(crate) model_server_metrics_scheme: Option<String>,

    /// Path of the default metrics source.
    #[arg(long, value_name = "PATH")]
    pub(crate) model_server_metrics_path: Option<String>,

    /// Port to scrape (deprecated in the reference; accepted, not supported:
    /// epp scrapes each endpoint's own port).
    #[arg(long, value_name = "PORT")]
    pub(crate) model_server_metrics_port: Option<u16>,

    /// Skip certificate verification of https scrapes (the reference's
    /// default is true; epp's is false unless this flag says otherwise).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) model_server_metrics_https_insecure_skip_verify: Option<bool>,

    /// Metric spec of the default engine's waiting requests.
    #[arg(long, value_name = "SPEC")]
    pub(crate) total_queued_requests_metric: Option<String>,

    /// Metric spec of the default engine's running requests.
    #[arg(long, value_name = "SPEC")]
    pub(crate) total_running_requests_metric: Option<String>,

    /// Metric spec of the default engine's KV-cache usage (a fraction).
    #[arg(long, value_name = "SPEC")]
    pub(crate) kv_cache_usage_percentage_metric: Option<String>,

    /// Metric spec of the default engine's LoRA info (`""`: not scraped).
    #[arg(long, value_name = "SPEC")]
    pub(crate) lora_info_metric: Option<String>,

    /// Metric spec of the default engine's cache info (`""`: not scraped).
    #[arg(long, value_name = "SPEC")]
    pub(crate) cache_info_metric: Option<String>,
}

impl ReferenceFlags {
    /// The verbosity (epp's `-v` count) the reference's flags ask for, if any:
    /// `--v`, else `--zap-log-level`.
    pub(crate) fn verbosity(&self) -> Option<u8> {
        if let Some(v) = self.v {
            return Some(v.saturating_sub(2));
        }
        match self.zap_log_level.as_deref()? {
            "debug" => Some(1),
            "info" | "warn" | "error" | "dpanic" | "panic" | "fatal" => Some(0),
            n => n.parse::<u8>().ok().map(|v| v.saturating_sub(2)),
        }
    }

    /// Whether `--zap-encoder json` asks for JSON logs.
    pub(crate) fn json_logs(&self) -> bool {
        self.zap_encoder.as_deref() == Some("json")
    }

    /// Makes the model-server metrics flags the parameters of the default
    /// metrics source and extractor (a config that declares its own data
    /// layer is not affected).
    pub(crate) fn apply(&self, registry: &mut Registry) {
        let mut source = Mapping::new();
        let set = |map: &mut Mapping, key: &str, value: Value| {
            map.insert(Value::from(key), value);
        };
        if let Some(s) = &self.model_server_metrics_scheme {
            set(&mut source, "scheme", Value::from(s.as_str()));
        }
        if let Some(p) = &self.model_server_metrics_path {
            set(&mut source, "path", Value::from(p.as_str()));
        }
        if let Some(skip) = self.model_server_metrics_https_insecure_skip_verify {
            set(&mut source, "insecureSkipVerify", Value::from(skip));
        }
        if !source.is_empty() {
            registry.set_default_parameters(Role::MetricsSource, Value::Mapping(source));
        }

        let names = [
            &self.total_queued_requests_metric,
            &self.total_running_requests_metric,
            &self.kv_cache_usage_percentage_metric,
            &self.lora_info_metric,
            &self.cache_info_metric,
        ];
        if names.iter().all(|n| n.is_none()) {
            return;
        }
        // The built-in default engine, with the specs the flags name.
        let Some(mut engine) = epp_datalayer::builtin_engine(epp_datalayer::DEFAULT_ENGINE) else {
            return;
        };
        let pick = |flag: &Option<String>, builtin: &mut Option<String>| {
            if let Some(spec) = flag {
                *builtin = Some(spec.clone());
            }
        };
        pick(
            &self.total_queued_requests_metric,
            &mut engine.queued_requests_spec,
        );
        pick(
            &self.total_running_requests_metric,
            &mut engine.running_requests_spec,
        );
        pick(
            &self.kv_cache_usage_percentage_metric,
            &mut engine.kv_usage_spec,
        );
        pick(&self.lora_info_metric, &mut engine.lora_spec);
        pick(&self.cache_info_metric, &mut engine.cache_info_spec);
        if let Ok(engine) = serde_yaml_ng::to_value(&engine) {
            let mut params = Mapping::new();
            set(&mut params, "engineConfigs", Value::Sequence(vec![engine]));
            registry.set_default_parameters(Role::MetricsExtractor, Value::Mapping(params));
        }
    }

    /// Logs, once, each flag that asks for something epp does not do.
    pub(crate) fn report(&self) {
        let unsupported = [
            (
                self.model_server_metrics_port.is_some(),
                "--model-server-metrics-port: not supported; each endpoint is scraped on its own port",
            ),
            (
                self.health_checking == Some(false),
                "--health-checking=false: gRPC health is always served",
            ),
            (
                self.enable_cert_reload == Some(false),
                "--enable-cert-reload=false: --cert-path is always watched and reloaded",
            ),
            (
                self.enable_grpc_stream_metrics == Some(false),
                "--enable-grpc-stream-metrics=false: the llm_d_epp_extproc_* series are served \
                 with the llm-d generation (--metrics-generations)",
            ),
            (
                self.zap_devel.is_some()
                    || self.zap_stacktrace_level.is_some()
                    || self.zap_time_encoding.is_some(),
                "--zap-devel, --zap-stacktrace-level, --zap-time-encoding: accepted, no effect",
            ),
            (
                self.refresh_prometheus_metrics_interval.is_some(),
                "--refresh-prometheus-metrics-interval: accepted, no effect; pool gauges are computed at each scrape of /metrics",
            ),
        ];
        for (given, what) in unsupported {
            if given {
                tracing::warn!("{what}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ReferenceFlags,
    }

    fn parse(args: &[&str]) -> ReferenceFlags {
        Cli::try_parse_from(std::iter::once("epp").chain(args.iter().copied()))
            .unwrap()
            .flags
    }

    #[test]
    fn the_reference_charts_arguments_parse() {
        let f = parse(&["--zap-encoder", "json", "--v", "1", "--tracing=false"]);
        assert!(f.json_logs());
        assert_eq!(f.verbosity(), Some(0));
        assert_eq!(f.tracing, Some(false));
        let f = parse(&["--v=4", "--enable-pprof", "--metrics-endpoint-auth=false"]);
        assert_eq!(f.verbosity(), Some(2));
        assert_eq!(
            parse(&["--enable-grpc-stream-metrics"]).enable_grpc_stream_metrics,
            Some(true)
        );
        assert_eq!(
            parse(&["--enable-grpc-stream-metrics=false"]).enable_grpc_stream_metrics,
            Some(false)
        );
        assert_eq!(f.enable_pprof, Some(true));
        assert_eq!(f.metrics_endpoint_auth, Some(false));
        let f = parse(&[
            "--metrics-cert-dir",
            "/certs",
            "--metrics-client-ca-file=/ca.crt",
        ]);
        assert_eq!(
            f.metrics_cert_dir.as_deref(),
            Some(std::path::Path::new("/certs"))
        );
        assert_eq!(
            f.metrics_client_ca_file.as_deref(),
            Some(std::path::Path::new("/ca.crt"))
        );
        let e = Cli::try_parse_from(["epp", "--metrics-client-ca-file", "/ca.crt"]).unwrap_err();
        assert!(e.to_string().contains("--metrics-cert-dir"), "{e}");
        // --tracing in each of the reference's spellings.
        assert_eq!(parse(&["--tracing"]).tracing, Some(true));
        assert_eq!(parse(&["--tracing", "true"]).tracing, Some(true));
        assert_eq!(parse(&["--tracing=true"]).tracing, Some(true));
        assert_eq!(parse(&["--tracing", "false"]).tracing, Some(false));
        assert_eq!(parse(&[]).tracing, None);
        assert_eq!(parse(&["--zap-log-level=debug"]).verbosity(), Some(1));
        assert_eq!(parse(&[]).verbosity(), None);
    }

    #[test]
    fn metric_flags_configure_the_default_source_and_engine() {
        let mut registry = Registry::new();
        epp_datalayer::register(&mut registry);
        parse(&[
            "--model-server-metrics-scheme=https",
            "--model-server-metrics-https-insecure-skip-verify",
            "--total-queued-requests-metric",
            "sglang:num_queue_reqs",
            "--lora-info-metric=",
        ])
        .apply(&mut registry);
        let source = registry.default_spec(Role::MetricsSource).unwrap();
        assert_eq!(source.parameters["scheme"], Value::from("https"));
        assert_eq!(source.parameters["insecureSkipVerify"], Value::from(true));
        assert!(registry.build(&source).is_ok());

        let extractor = registry.default_spec(Role::MetricsExtractor).unwrap();
        let vllm = &extractor.parameters["engineConfigs"][0];
        assert_eq!(vllm["name"], Value::from("vllm"));
        assert_eq!(
            vllm["queuedRequestsSpec"],
            Value::from("sglang:num_queue_reqs")
        );
        assert_eq!(vllm["loraSpec"], Value::from(""));
        assert_eq!(
            vllm["runningRequestsSpec"],
            Value::from("vllm:num_requests_running"),
            "specs no flag names keep the built-in ones"
        );
        assert!(registry.build(&extractor).is_ok());
    }

    #[test]
    fn without_metric_flags_the_defaults_are_untouched() {
        let mut registry = Registry::new();
        epp_datalayer::register(&mut registry);
        parse(&["--v", "2"]).apply(&mut registry);
        assert!(
            registry
                .default_spec(Role::MetricsExtractor)
                .unwrap()
                .parameters
                .is_null()
        );
        assert!(
            registry
                .default_spec(Role::MetricsSource)
                .unwrap()
                .parameters
                .is_null()
        );
    }
}
