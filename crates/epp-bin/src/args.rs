//! Command-line flags. Names follow the reference picker so deployments carry over.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::{ArgAction, Parser};

/// epp: an endpoint picker for LLM inference behind Envoy (ext_proc).
#[derive(Debug, Clone, Parser)]
#[command(name = "epp", version, about, long_about = None)]
pub(crate) struct Args {
    /// Port of the ext_proc gRPC server (0 = any free port).
    #[arg(long, default_value_t = 9002)]
    pub(crate) grpc_port: u16,

    /// Port of the gRPC health server (0 = any free port).
    #[arg(long, default_value_t = 9003)]
    pub(crate) grpc_health_port: u16,

    /// Port of the Prometheus metrics server (0 = any free port).
    #[arg(long, default_value_t = 9090)]
    pub(crate) metrics_port: u16,

    /// Which generations of metric names `/metrics` serves, comma-separated:
    /// `inference-model` (the first reference releases' `inference_model_*`),
    /// `inference-objective` (the Gateway API Inference Extension's
    /// `inference_objective_*`), `llm-d` (`llm_d_epp_*`), or `all`. Each is
    /// fed by the same observations.
    #[arg(long, default_value = "all")]
    pub(crate) metrics_generations: epp_extproc::MetricGenerations,

    /// Address all servers bind to.
    #[arg(long, default_value = "0.0.0.0")]
    pub(crate) bind_address: IpAddr,

    /// Static model-server endpoints, `ip:port,ip:port,...`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) endpoints: Vec<String>,

    /// YAML file listing endpoints (`- {address, port, labels}`); watched for changes.
    #[arg(long)]
    pub(crate) endpoints_file: Option<PathBuf>,

    /// Serve ext_proc over TLS (self-signed unless --cert-path is given).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub(crate) secure_serving: bool,

    /// Directory holding `tls.crt` and `tls.key` (reloaded when they change).
    #[arg(long)]
    pub(crate) cert_path: Option<PathBuf>,

    /// EndpointPickerConfig file.
    #[arg(long, conflicts_with = "config_text")]
    pub(crate) config_file: Option<PathBuf>,

    /// EndpointPickerConfig as inline YAML.
    #[arg(long)]
    pub(crate) config_text: Option<String>,

    /// Validate the config, print the effective config (defaults filled in) and exit.
    #[arg(long)]
    pub(crate) check_config: bool,

    /// How often each endpoint's metrics are scraped.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub(crate) refresh_metrics_interval: Duration,

    /// Metrics older than this make an endpoint stale (never treated as idle).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) metrics_staleness_threshold: Duration,

    /// Name of the InferencePool to follow on Kubernetes (without --endpoints,
    /// --endpoints-file or --endpoint-selector); also the metrics label `name`
    /// (default `epp-pool`).
    #[arg(long)]
    pub(crate) pool_name: Option<String>,

    /// Namespace of the pool and its pods.
    #[arg(long, env = "NAMESPACE", default_value = "default")]
    pub(crate) pool_namespace: String,

    /// Kubernetes discovery.
    #[command(flatten)]
    pub(crate) kube: crate::kube::KubeArgs,

    /// The reference picker's other flags (logging, metrics names, ...).
    #[command(flatten)]
    pub(crate) reference: crate::reference_flags::ReferenceFlags,

    /// Verbosity: -v one debug line per request (decision and scores), -vv debug of
    /// every library, -vvv trace (prompts included).
    #[arg(short = 'v', action = ArgAction::Count)]
    pub(crate) verbose: u8,

    /// Log as JSON lines.
    #[arg(long)]
    pub(crate) log_json: bool,

    /// Largest request body accepted, in bytes; a larger one gets 413. 0 = no limit.
    #[arg(long, default_value_t = 64 << 20)]
    pub(crate) max_request_body_bytes: usize,

    /// How many recent decisions the decision view keeps (`/debug/decisions`
    /// on the metrics port, behind its authentication): each with every
    /// candidate's scores, the filter that dropped it, and the pick. 0 turns
    /// the view and its recording off.
    #[arg(long, default_value_t = 50,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=10_000))]
    pub(crate) decision_log_size: usize,

    /// The least time between two decisions the view records: an idle
    /// picker records the next request, a busy one about one per interval.
    /// 0 records every request.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub(crate) decision_log_interval: Duration,

    /// After SIGTERM (health NOT_SERVING, lease released), how long ext_proc
    /// keeps serving new and existing streams before it stops accepting (as
    /// the reference's flag). A second signal ends the drain at once.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) drain_timeout: Duration,

    /// After the drain, how long in-flight streams may take to finish before
    /// epp exits.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) shutdown_grace_period: Duration,

    /// Worker threads running the servers and the background work (scrapes,
    /// watches): 0 = one per CPU (or `TOKIO_WORKER_THREADS` when set). On a
    /// machine whose cores the gateway also uses, 1 answers sooner and spends
    /// less CPU per decision (docs/operations.md, "Threads").
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub(crate) worker_threads: u16,
}

impl Args {
    /// The pool's name in metrics.
    pub(crate) fn pool_label(&self) -> &str {
        self.pool_name.as_deref().unwrap_or("epp-pool")
    }
}

/// Parses `50ms`, `2s`, `1m30s`, or a bare number of seconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("invalid duration {s:?}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_flags() {
        assert_eq!(parse_duration("50ms").unwrap(), Duration::from_millis(50));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());

        let a = Args::parse_from([
            "epp",
            "--secure-serving=false",
            "--endpoints",
            "1.2.3.4:8000,5.6.7.8:8000",
        ]);
        assert!(!a.secure_serving);
        assert_eq!(a.endpoints.len(), 2);
        assert_eq!(a.grpc_port, 9002);
        assert_eq!(a.refresh_metrics_interval, Duration::from_millis(50));
        let a = Args::parse_from(["epp", "-vv", "--secure-serving"]);
        assert!(a.secure_serving);
        assert_eq!(a.verbose, 2);
    }

    #[test]
    fn worker_threads_default_to_one_per_cpu() {
        assert_eq!(Args::parse_from(["epp"]).worker_threads, 0);
        assert_eq!(
            Args::parse_from(["epp", "--worker-threads=1"]).worker_threads,
            1
        );
        for bad in [
            "--worker-threads=-1",
            "--worker-threads=5000",
            "--worker-threads=x",
        ] {
            assert!(Args::try_parse_from(["epp", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_decision_view_is_on_by_default_and_bounded() {
        let a = Args::parse_from(["epp"]);
        assert_eq!(a.decision_log_size, 50);
        assert_eq!(a.decision_log_interval, Duration::from_millis(100));
        let a = Args::parse_from(["epp", "--decision-log-size=0", "--decision-log-interval=0"]);
        assert_eq!(
            (a.decision_log_size, a.decision_log_interval),
            (0, Duration::ZERO)
        );
        for bad in ["--decision-log-size=-1", "--decision-log-size=100000"] {
            assert!(Args::try_parse_from(["epp", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn metrics_generations_default_to_all_and_can_be_narrowed() {
        let a = Args::parse_from(["epp"]);
        assert_eq!(a.metrics_generations, epp_extproc::MetricGenerations::ALL);
        let a = Args::parse_from(["epp", "--metrics-generations", "llm-d"]);
        let g = a.metrics_generations;
        assert!(g.llm_d && !g.inference_model && !g.inference_objective);
        let a = Args::parse_from(["epp", "--metrics-generations=inference-objective,llm-d"]);
        assert!(!a.metrics_generations.inference_model);
        let err = Args::try_parse_from(["epp", "--metrics-generations", "v3"]).unwrap_err();
        assert!(
            err.to_string().contains("unknown metrics generation"),
            "{err}"
        );
    }
}
