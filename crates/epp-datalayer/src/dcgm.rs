//! `dcgm-data-source` and `dcgm-extractor` (llm-d's): GPU utilization from
//! NVIDIA's DCGM exporter, scraped beside each model server.
//!
//! The source scrapes `scheme://<endpoint ip>:port/path` (port 9400, the
//! exporter's) every `interval`. The extractor reads the gauge
//! `DCGM_FI_DEV_GPU_UTIL` (percent): the samples whose `pod` label names
//! the endpoint's pod, or that carry no `pod` label (a sidecar exporter's
//! page; an endpoint without a pod name keeps every sample), and stores
//!
//! ```text
//! GPUUtilization = max(samples) / 100     (the busiest GPU of the pod, in [0, 1])
//! ```
//!
//! under the custom metric `GPUUtilization/dcgm-extractor`, the key
//! `endpoint-attribute-filter` and `-scorer` read with
//! `attribute: GPUUtilization, producer: dcgm-extractor`.
//!
//! The exporter is auxiliary: where nothing answers at the port (no GPU, no
//! exporter), the model server's own metrics stay fresh, the attribute
//! stays absent, and the data layer warns once for the source.

use std::time::Duration;

use epp_core::{
    BuildError, Endpoint, EndpointMetrics, ExtractError, Extractor, MetricsSource, Plugin,
};
use epp_promtext::{Selector, SelectorSet};

use crate::source::http_options;

/// The attribute the extractor fills.
pub const GPU_UTILIZATION: &str = "GPUUtilization";
/// The metric it reads.
pub const GPU_UTIL_METRIC: &str = "DCGM_FI_DEV_GPU_UTIL";

/// Parameters of `dcgm-data-source` (llm-d's names and defaults).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DcgmDataSourceParams {
    /// `http` (default) or `https`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Path of the exporter's page. Default `/metrics`.
    #[serde(default = "default_path")]
    pub path: String,
    /// The exporter's port. Default 9400.
    #[serde(default = "default_port")]
    pub port: u32,
    /// Accept any TLS certificate. Default true (llm-d's).
    #[serde(default = "yes")]
    pub insecure_skip_verify: bool,
    /// llm-d: scrape the node's address (a DaemonSet exporter) instead of
    /// the pod's. Endpoints here carry no node address, so `true` is a load
    /// error.
    #[serde(default)]
    pub use_node_address: bool,
    /// How often to scrape, a Go duration, rounded to the nearest multiple
    /// of `--refresh-metrics-interval`. Default: every refresh.
    #[serde(default)]
    pub interval: Option<String>,
}

fn default_scheme() -> String {
    "http".into()
}
fn default_path() -> String {
    "/metrics".into()
}
fn default_port() -> u32 {
    9400
}
fn yes() -> bool {
    true
}

/// `dcgm-data-source`: see the module docs.
#[derive(Debug, Clone)]
pub struct DcgmDataSource {
    name: String,
    params: DcgmDataSourceParams,
    port: u16,
    interval: Option<Duration>,
}

impl DcgmDataSource {
    /// YAML type.
    pub const TYPE: &'static str = "dcgm-data-source";

    /// A source named `name`.
    ///
    /// # Errors
    /// A scheme other than http or https, a path not starting with `/`, a
    /// port outside 1–65535, an interval that is not a positive duration,
    /// or `useNodeAddress: true`.
    pub fn new(name: impl Into<String>, params: DcgmDataSourceParams) -> Result<Self, BuildError> {
        let name = name.into();
        let bad = |field: &str, value: &str, reason: &str| BuildError::InvalidValue {
            plugin: name.clone(),
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        };
        if params.use_node_address {
            return Err(bad(
                "useNodeAddress",
                "true",
                "endpoints here carry no node address: run the exporter as a sidecar \
                 (scraped at the pod's address)",
            ));
        }
        let (port, interval) = http_options(
            &name,
            &params.scheme,
            &params.path,
            Some(params.port),
            params.interval.as_deref(),
            None,
            None,
        )?;
        Ok(Self {
            port: port.unwrap_or(9400),
            name,
            params,
            interval,
        })
    }
}

impl Plugin for DcgmDataSource {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_metrics_source(&self) -> Option<&dyn MetricsSource> {
        Some(self)
    }
}

impl MetricsSource for DcgmDataSource {
    fn scheme(&self) -> &str {
        &self.params.scheme
    }
    fn path(&self) -> &str {
        &self.params.path
    }
    fn insecure_skip_verify(&self) -> bool {
        self.params.insecure_skip_verify
    }
    fn port(&self) -> Option<u16> {
        Some(self.port)
    }
    fn interval(&self) -> Option<Duration> {
        self.interval
    }
    fn counts_for_freshness(&self) -> bool {
        false
    }
}

/// `dcgm-extractor`: see the module docs. No parameters.
#[derive(Debug, Clone)]
pub struct DcgmExtractor {
    name: String,
    /// `GPUUtilization/dcgm-extractor` (llm-d keys it by the type, whatever
    /// the instance's name).
    keys: [String; 1],
    set: SelectorSet,
}

impl DcgmExtractor {
    /// YAML type.
    pub const TYPE: &'static str = "dcgm-extractor";

    /// An extractor named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            keys: [format!("{GPU_UTILIZATION}/{}", Self::TYPE)],
            set: SelectorSet::new(vec![Selector::name(GPU_UTIL_METRIC)]),
        }
    }

    /// The custom-metric key the utilization is stored under.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.keys[0]
    }
}

impl Plugin for DcgmExtractor {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_extractor(&self) -> Option<&dyn Extractor> {
        Some(self)
    }
}

impl Extractor for DcgmExtractor {
    fn custom_metrics(&self) -> Option<&[String]> {
        Some(&self.keys)
    }

    fn extract(
        &self,
        endpoint: &Endpoint,
        page: &str,
        m: &mut EndpointMetrics,
    ) -> Result<(), ExtractError> {
        let pod = endpoint.given_name().map(|n| &**n);
        let mut family = false;
        let mut max: Option<f64> = None;
        self.set.scan(page, |_, s| {
            family = true;
            let mine = match (pod, s.label("pod")) {
                (Some(pod), Some(p)) => p == pod,
                _ => true,
            };
            if mine && s.value.is_finite() {
                max = Some(max.map_or(s.value, |v: f64| v.max(s.value)));
            }
        });
        let key = self.key();
        match max {
            Some(v) => {
                m.custom.insert(key.to_owned(), v / 100.0);
                Ok(())
            }
            None => {
                m.custom.remove(key);
                Err(ExtractError(if family {
                    format!(
                        "{GPU_UTIL_METRIC} has no sample for pod {:?}",
                        pod.unwrap_or("")
                    )
                } else {
                    format!("{GPU_UTIL_METRIC} not found in the DCGM exporter's page")
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Arc};

    use super::*;

    const PAGE: &str = "\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",pod=\"vllm-0\",namespace=\"ns\"} 35
DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-b\",pod=\"vllm-0\",namespace=\"ns\"} 80
DCGM_FI_DEV_GPU_UTIL{gpu=\"2\",UUID=\"GPU-c\",pod=\"vllm-1\",namespace=\"ns\"} 97
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu=\"0\"} 1024
";

    fn pod(name: Option<&str>) -> Endpoint {
        Endpoint::with_labels(
            epp_core::EndpointId(0),
            "10.0.0.1:8000".parse().unwrap(),
            BTreeMap::new(),
        )
        .with_name(name.map(Arc::from))
    }

    fn gpu(endpoint: &Endpoint, page: &str) -> (Result<(), ExtractError>, Option<f64>) {
        let x = DcgmExtractor::new("d");
        let mut m = EndpointMetrics::default();
        let r = x.extract(endpoint, page, &mut m);
        (r, m.custom.get("GPUUtilization/dcgm-extractor").copied())
    }

    #[test]
    fn the_busiest_gpu_of_the_pod_as_a_fraction() {
        assert_eq!(gpu(&pod(Some("vllm-0")), PAGE).1, Some(0.8));
        assert_eq!(gpu(&pod(Some("vllm-1")), PAGE).1, Some(0.97));
        // No pod name: every sample is the endpoint's.
        assert_eq!(gpu(&pod(None), PAGE).1, Some(0.97));
        // A sidecar page without pod labels.
        let sidecar = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 12\nDCGM_FI_DEV_GPU_UTIL{gpu=\"1\"} 7\n";
        assert_eq!(gpu(&pod(Some("vllm-0")), sidecar).1, Some(0.12));
    }

    #[test]
    fn a_page_without_the_pods_gpus_is_an_error_and_clears_the_value() {
        let (r, v) = gpu(&pod(Some("vllm-9")), PAGE);
        assert!(r.unwrap_err().0.contains("no sample for pod \"vllm-9\""));
        assert_eq!(v, None);
        let (r, _) = gpu(&pod(None), "other 1\n");
        assert!(r.unwrap_err().0.contains("not found"));
    }

    #[test]
    fn source_defaults_and_checks_are_llm_ds() {
        let p: DcgmDataSourceParams = serde_yaml_ng::from_str("{}").unwrap();
        let s = DcgmDataSource::new("s", p).unwrap();
        assert_eq!(
            (s.port(), s.path(), s.insecure_skip_verify(), s.interval()),
            (Some(9400), "/metrics", true, None)
        );
        assert!(!s.counts_for_freshness());
        let p: DcgmDataSourceParams =
            serde_yaml_ng::from_str("{port: 9500, interval: 1s}").unwrap();
        let s = DcgmDataSource::new("s", p).unwrap();
        assert_eq!(
            (s.port(), s.interval()),
            (Some(9500), Some(Duration::from_secs(1)))
        );
        for bad in [
            "{port: 0}",
            "{port: 70000}",
            "{interval: soon}",
            "{useNodeAddress: true}",
            "{scheme: ftp}",
        ] {
            let p: DcgmDataSourceParams = serde_yaml_ng::from_str(bad).unwrap();
            assert!(DcgmDataSource::new("s", p).is_err(), "{bad}");
        }
        assert!(serde_yaml_ng::from_str::<DcgmDataSourceParams>("{prot: 1}").is_err());
    }
}
