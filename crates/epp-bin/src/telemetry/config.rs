//! Tracing configuration from `--tracing` and the standard `OTEL_*`
//! variables, read through a lookup function so tests never set the
//! process environment. Every bad value is an error naming the variable.

use std::time::Duration;

use epp_extproc::TraceParent;
use hyper::Uri;

/// The service name when neither `OTEL_SERVICE_NAME` nor
/// `OTEL_RESOURCE_ATTRIBUTES` names one: the reference picker's, so trace
/// queries by service keep working.
pub(crate) const DEFAULT_SERVICE_NAME: &str = "gateway-api-inference-extension/epp";

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// OTLP over gRPC (`TraceService/Export`), the reference's.
    Grpc,
    /// OTLP over HTTP, protobuf body (`POST …/v1/traces`).
    HttpProtobuf,
}

/// Which requests are recorded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// A fraction of trace ids, by the id (the same trace is sampled alike
    /// everywhere): sampled when the id's low 63 bits are below the bound.
    Ratio {
        ratio: f64,
        bound: u64,
    },
    /// The caller's decision when it sent a `traceparent`, else the root sampler.
    ParentBased(Box<Sampler>),
}

impl Sampler {
    fn ratio(ratio: f64) -> Self {
        // As the Go SDK: compare the trace id's last 8 bytes, shifted right
        // once, with ratio × 2^63.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "ratio is in [0, 1]: the product fits in u64"
        )]
        let bound = (ratio * (1u64 << 63) as f64) as u64;
        Self::Ratio { ratio, bound }
    }

    /// Whether a request of `trace_id` with caller `parent` is recorded.
    pub(crate) fn should_sample(&self, trace_id: &[u8; 16], parent: Option<&TraceParent>) -> bool {
        match self {
            Self::AlwaysOn => true,
            Self::AlwaysOff => false,
            Self::Ratio { ratio, bound } => {
                if *ratio >= 1.0 {
                    return true;
                }
                let mut low = [0u8; 8];
                low.copy_from_slice(&trace_id[8..]);
                (u64::from_be_bytes(low) >> 1) < *bound
            }
            Self::ParentBased(root) => match parent {
                Some(p) => p.sampled,
                None => root.should_sample(trace_id, None),
            },
        }
    }
}

/// Everything the exporter needs.
#[derive(Debug, Clone)]
pub(crate) struct TraceConfig {
    pub(crate) protocol: Protocol,
    /// gRPC: the collector's address; HTTP: the full URL spans are posted to.
    pub(crate) endpoint: Uri,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) timeout: Duration,
    /// Resource attributes, `service.name` first.
    pub(crate) resource: Vec<(String, String)>,
    pub(crate) sampler: Sampler,
    /// Spans queued for export at most; more are dropped (and counted).
    pub(crate) max_queue: usize,
    /// Spans per export request at most.
    pub(crate) max_batch: usize,
    /// How long a span waits for a batch to fill.
    pub(crate) delay: Duration,
}

/// A bad tracing setting: the variable, its value, and why.
#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub(crate) struct ConfigError {
    var: &'static str,
    value: String,
    why: String,
}

fn bad(var: &'static str, value: &str, why: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        value: value.to_owned(),
        why: why.into(),
    }
}

/// The tracing configuration: `None` when tracing is off (`--tracing` not
/// given or false, `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`).
/// `env` looks a variable up (empty values count as unset, as the spec says).
pub(crate) fn configure(
    flag: Option<bool>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<TraceConfig>, ConfigError> {
    if flag != Some(true) {
        return Ok(None);
    }
    let get = |var: &str| {
        env(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(v) = get("OTEL_SDK_DISABLED") {
        match v.to_ascii_lowercase().as_str() {
            "true" => return Ok(None),
            "false" => {}
            _ => return Err(bad("OTEL_SDK_DISABLED", &v, "expected true or false")),
        }
    }
    if let Some(v) = get("OTEL_TRACES_EXPORTER") {
        let mut otlp = false;
        for e in v.split(',').map(str::trim) {
            match e {
                "otlp" => otlp = true,
                "none" => {}
                _ => {
                    return Err(bad(
                        "OTEL_TRACES_EXPORTER",
                        &v,
                        format!(
                            "{e:?} is not supported: epp exports traces over OTLP (otlp) or not at all (none)"
                        ),
                    ));
                }
            }
        }
        if !otlp {
            return Ok(None);
        }
    }

    let (protocol_var, protocol) = first(
        &get,
        &[
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ],
    );
    let protocol = match protocol.as_deref() {
        None | Some("grpc") => Protocol::Grpc,
        Some("http/protobuf") => Protocol::HttpProtobuf,
        Some(v) => {
            return Err(bad(
                protocol_var,
                v,
                "expected grpc or http/protobuf (http/json is not supported)",
            ));
        }
    };
    let endpoint = endpoint(&get, protocol)?;

    let (headers_var, headers) = first(
        &get,
        &[
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ],
    );
    let headers = match headers {
        Some(h) => pairs(headers_var, &h)?,
        None => Vec::new(),
    };
    let (timeout_var, timeout) = first(
        &get,
        &[
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ],
    );
    let timeout = match timeout {
        Some(t) => millis(timeout_var, &t)?,
        None => Duration::from_secs(10),
    };

    let mut resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(r) => pairs("OTEL_RESOURCE_ATTRIBUTES", &r)?,
        None => Vec::new(),
    };
    let service = get("OTEL_SERVICE_NAME")
        .or_else(|| {
            resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    resource.retain(|(k, _)| k != "service.name" && k != "service.version");
    resource.insert(0, ("service.name".to_owned(), service));
    resource.insert(
        1,
        (
            "service.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
    );
    resource.push(("telemetry.sdk.name".to_owned(), "epp-rs".to_owned()));
    resource.push(("telemetry.sdk.language".to_owned(), "rust".to_owned()));

    let sampler = sampler(&get)?;
    let count = |var: &'static str, default: usize| -> Result<usize, ConfigError> {
        match get(var) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(var, &v, "expected a whole number above 0")),
        }
    };
    let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
    let max_batch = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue);
    let delay = match get("OTEL_BSP_SCHEDULE_DELAY") {
        Some(v) => millis("OTEL_BSP_SCHEDULE_DELAY", &v)?,
        None => Duration::from_secs(5),
    };
    Ok(Some(TraceConfig {
        protocol,
        endpoint,
        headers,
        timeout,
        resource,
        sampler,
        max_queue,
        max_batch,
        delay,
    }))
}

/// The first of `vars` that is set, and its name (the last one's when none is).
fn first(
    get: &dyn Fn(&str) -> Option<String>,
    vars: &[&'static str],
) -> (&'static str, Option<String>) {
    for var in vars {
        if let Some(v) = get(var) {
            return (var, Some(v));
        }
    }
    (vars[vars.len() - 1], None)
}

fn endpoint(get: &dyn Fn(&str) -> Option<String>, protocol: Protocol) -> Result<Uri, ConfigError> {
    let (var, url, append) = match (
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        get("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        (Some(u), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", u, false),
        (None, Some(u)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", u, true),
        (None, None) => match protocol {
            Protocol::Grpc => (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://localhost:4317".to_owned(),
                false,
            ),
            Protocol::HttpProtobuf => (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://localhost:4318".to_owned(),
                true,
            ),
        },
    };
    // A bare host:port is a plaintext collector (the Go SDK reads it so for gRPC).
    let full = if url.contains("://") {
        url.clone()
    } else {
        format!("http://{url}")
    };
    let uri: Uri = full
        .parse()
        .map_err(|e| bad(var, &url, format!("not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                var,
                &url,
                "TLS to the collector is not supported: use an http:// endpoint (a collector sidecar on localhost)",
            ));
        }
        _ => return Err(bad(var, &url, "expected an http:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad(var, &url, "the URL names no host"));
    }
    if protocol == Protocol::Grpc || !append {
        return Ok(uri);
    }
    // The base endpoint of OTLP/HTTP gets the signal's path.
    let base = full.trim_end_matches('/');
    format!("{base}/v1/traces")
        .parse()
        .map_err(|e| bad(var, &url, format!("not a URL: {e}")))
}

fn sampler(get: &dyn Fn(&str) -> Option<String>) -> Result<Sampler, ConfigError> {
    let name = get("OTEL_TRACES_SAMPLER").unwrap_or_else(|| "parentbased_traceidratio".to_owned());
    let ratio = || -> Result<f64, ConfigError> {
        // The reference's default ratio (the spec's is 1.0).
        let Some(v) = get("OTEL_TRACES_SAMPLER_ARG") else {
            return Ok(0.1);
        };
        v.parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                bad(
                    "OTEL_TRACES_SAMPLER_ARG",
                    &v,
                    "expected a number from 0 to 1",
                )
            })
    };
    Ok(match name.as_str() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::ratio(ratio()?),
        "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => Sampler::ParentBased(Box::new(Sampler::ratio(ratio()?))),
        _ => {
            return Err(bad(
                "OTEL_TRACES_SAMPLER",
                &name,
                "expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
            ));
        }
    })
}

/// `key=value,key=value` with percent-encoded values (W3C baggage style,
/// as `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_EXPORTER_OTLP_HEADERS` use).
fn pairs(var: &'static str, value: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(bad(var, value, format!("{item:?} is not key=value")));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(bad(var, value, format!("{item:?} has an empty key")));
        }
        let v = percent_decode(v.trim())
            .ok_or_else(|| bad(var, value, format!("{item:?}: bad percent-encoding")))?;
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn millis(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| bad(var, value, "expected milliseconds (a whole number)"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn conf(flag: Option<bool>, vars: &[(&str, &str)]) -> Result<Option<TraceConfig>, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        configure(flag, &|k| map.get(k).cloned())
    }

    /// The environment the reference chart sets when tracing is enabled.
    const CHART: &[(&str, &str)] = &[
        ("OTEL_SERVICE_NAME", "gateway-api-inference-extension/epp"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_RESOURCE_ATTRIBUTES_NODE_NAME", "node-1"),
        ("OTEL_RESOURCE_ATTRIBUTES_POD_NAME", "epp-0"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "k8s.namespace.name=default,k8s.node.name=node-1,k8s.pod.name=epp-0",
        ),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
    ];

    #[test]
    fn the_reference_charts_environment_configures_grpc_to_localhost() {
        let c = conf(Some(true), CHART).unwrap().unwrap();
        assert_eq!(c.protocol, Protocol::Grpc);
        assert_eq!(c.endpoint.to_string(), "http://localhost:4317/");
        assert_eq!(
            c.resource[0],
            (
                "service.name".into(),
                "gateway-api-inference-extension/epp".into()
            )
        );
        assert!(
            c.resource
                .contains(&("k8s.pod.name".into(), "epp-0".into()))
        );
        assert!(
            matches!(&c.sampler, Sampler::ParentBased(root) if matches!(**root, Sampler::Ratio { ratio, .. } if ratio == 0.1))
        );
        // Off unless asked, and the chart's --tracing=false wins over its env.
        assert!(conf(None, CHART).unwrap().is_none());
        assert!(conf(Some(false), CHART).unwrap().is_none());
    }

    #[test]
    fn disabling_variables_turn_tracing_off() {
        assert!(
            conf(Some(true), &[("OTEL_SDK_DISABLED", "TRUE")])
                .unwrap()
                .is_none()
        );
        assert!(
            conf(Some(true), &[("OTEL_TRACES_EXPORTER", "none")])
                .unwrap()
                .is_none()
        );
        assert!(
            conf(Some(true), &[("OTEL_SDK_DISABLED", "false")])
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn http_protobuf_appends_the_signal_path_to_the_base_endpoint_only() {
        let c = conf(
            Some(true),
            &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.to_string(), "http://localhost:4318/v1/traces");
        let c = conf(
            Some(true),
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.to_string(), "http://collector:4318/v1/traces");
        let c = conf(
            Some(true),
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://collector:9999/custom",
                ),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, x=1"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.to_string(), "http://collector:9999/custom");
        assert_eq!(
            c.headers,
            vec![("api-key".into(), "a b".into()), ("x".into(), "1".into())]
        );
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (var, value) in [
            ("OTEL_SDK_DISABLED", "yes"),
            ("OTEL_TRACES_EXPORTER", "console"),
            ("OTEL_TRACES_EXPORTER", "jaeger"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://a b"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            ("OTEL_RESOURCE_ATTRIBUTES", "a=%zz"),
            ("OTEL_RESOURCE_ATTRIBUTES", "=x"),
            ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
            ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ("OTEL_TRACES_SAMPLER_ARG", "NaN"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "-1"),
        ] {
            let e = conf(Some(true), &[(var, value)])
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("{var}=")), "{var}={value}: {e}");
        }
    }

    #[test]
    fn samplers_follow_the_spec() {
        let id_low = |low: u64| {
            let mut id = [0u8; 16];
            id[0] = 1;
            id[8..].copy_from_slice(&low.to_be_bytes());
            id
        };
        let sampled = TraceParent {
            trace_id: id_low(0),
            span_id: [1; 8],
            sampled: true,
        };
        let unsampled = TraceParent {
            sampled: false,
            ..sampled
        };
        let half = Sampler::ratio(0.5);
        assert!(half.should_sample(&id_low(0), None));
        assert!(half.should_sample(&id_low((1 << 63) - 1), None));
        assert!(!half.should_sample(&id_low(1 << 63), None));
        assert!(!half.should_sample(&id_low(u64::MAX), None));
        assert!(!Sampler::ratio(0.0).should_sample(&id_low(0), None));
        assert!(Sampler::ratio(1.0).should_sample(&id_low(u64::MAX), None));
        let parent_based = Sampler::ParentBased(Box::new(Sampler::AlwaysOff));
        assert!(parent_based.should_sample(&id_low(0), Some(&sampled)));
        assert!(!parent_based.should_sample(&id_low(0), Some(&unsampled)));
        assert!(!parent_based.should_sample(&id_low(0), None));
        let parent_based = Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
        assert!(parent_based.should_sample(&id_low(0), None));
        assert!(!Sampler::AlwaysOff.should_sample(&id_low(0), Some(&sampled)));
        assert!(Sampler::AlwaysOn.should_sample(&id_low(0), Some(&unsampled)));
    }
}
