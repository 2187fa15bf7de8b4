//! What discovery reads from Kubernetes objects: an InferencePool's selector
//! and target ports, and for each pod whether it may receive traffic.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use k8s_openapi::api::core::v1::Pod;
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use super::selector::LabelSelector;
use crate::{EndpointSpec, Error, Result};

/// Most target ports a pool may list (the CRD's `maxItems`).
pub const MAX_TARGET_PORTS: usize = 8;

/// The API group an InferencePool is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolGroup {
    /// `inference.networking.k8s.io`, version `v1`.
    V1,
    /// `inference.networking.x-k8s.io`, version `v1alpha2` (the older shape:
    /// `selector` is a flat label map, `targetPortNumber` one port).
    XV1Alpha2,
}

impl PoolGroup {
    /// The group named by `--pool-group`.
    ///
    /// # Errors
    /// Any other group.
    pub fn parse(group: &str) -> Result<Self> {
        match group {
            "inference.networking.k8s.io" => Ok(Self::V1),
            "inference.networking.x-k8s.io" => Ok(Self::XV1Alpha2),
            other => Err(Error::Kubernetes(format!(
                "unknown InferencePool group {other:?} (expected inference.networking.k8s.io or inference.networking.x-k8s.io)"
            ))),
        }
    }

    /// The API group.
    #[must_use]
    pub fn group(self) -> &'static str {
        match self {
            Self::V1 => "inference.networking.k8s.io",
            Self::XV1Alpha2 => "inference.networking.x-k8s.io",
        }
    }

    /// The version served for the pool.
    #[must_use]
    pub fn version(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::XV1Alpha2 => "v1alpha2",
        }
    }

    /// The InferencePool resource of this group.
    #[must_use]
    pub fn resource(self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(self.group(), self.version(), "InferencePool");
        ApiResource::from_gvk_with_plural(&gvk, "inferencepools")
    }
}

/// What an InferencePool asks for: which pods, which ports on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// The pods it selects.
    pub selector: LabelSelector,
    /// The ports on each pod (1 to 8, distinct, in the pool's order: the
    /// index is the data-parallel rank).
    pub ports: Vec<u16>,
}

impl PoolSpec {
    /// Reads the `spec` of an InferencePool object, in either shape:
    /// `selector.matchLabels` + `targetPorts[].number` (v1) or a flat
    /// `selector` map + `targetPortNumber` (v1alpha2).
    ///
    /// # Errors
    /// A missing or invalid selector or port list, naming the pool.
    pub fn from_object(name: &str, data: &Value) -> Result<Self> {
        let bad = |why: String| Error::Kubernetes(format!("InferencePool {name:?}: {why}"));
        let spec = data.get("spec").ok_or_else(|| bad("no spec".into()))?;
        let selector = spec
            .get("selector")
            .ok_or_else(|| bad("no spec.selector".into()))?;
        let labels = selector.get("matchLabels").unwrap_or(selector);
        let labels: BTreeMap<String, String> = serde_json::from_value(labels.clone())
            .map_err(|e| bad(format!("spec.selector: {e}")))?;
        if labels.is_empty() {
            return Err(bad("spec.selector selects no labels".into()));
        }
        let selector = LabelSelector::from_match_labels(&labels).map_err(|e| bad(e.to_string()))?;
        let numbers: Vec<i64> = if let Some(ports) = spec.get("targetPorts") {
            let items = ports
                .as_array()
                .ok_or_else(|| bad("spec.targetPorts is not a list".into()))?;
            items
                .iter()
                .map(|p| {
                    p.get("number")
                        .and_then(Value::as_i64)
                        .ok_or_else(|| bad(format!("spec.targetPorts entry {p} has no number")))
                })
                .collect::<Result<_>>()?
        } else if let Some(port) = spec.get("targetPortNumber") {
            vec![
                port.as_i64()
                    .ok_or_else(|| bad(format!("spec.targetPortNumber {port} is not a number")))?,
            ]
        } else {
            return Err(bad("no spec.targetPorts".into()));
        };
        Ok(Self {
            selector,
            ports: check_ports(&numbers).map_err(bad)?,
        })
    }
}

/// Validates a list of target ports: 1 to 8 distinct numbers in 1..=65535.
///
/// # Errors
/// Why the list is not acceptable.
pub fn check_ports(numbers: &[i64]) -> Result<Vec<u16>, String> {
    if numbers.is_empty() || numbers.len() > MAX_TARGET_PORTS {
        return Err(format!(
            "{} target ports (expected 1 to {MAX_TARGET_PORTS})",
            numbers.len()
        ));
    }
    let mut seen = BTreeSet::new();
    numbers
        .iter()
        .map(|&n| {
            let port = u16::try_from(n)
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("target port {n} is not in 1-65535"))?;
            if !seen.insert(port) {
                return Err(format!("target port {port} is listed twice"));
            }
            Ok(port)
        })
        .collect()
}

/// What discovery keeps of a pod: only what decides its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// The pod's name.
    pub name: String,
    /// Its IP, when it has one.
    pub ip: Option<IpAddr>,
    /// Its labels (they become the endpoints' labels).
    pub labels: BTreeMap<String, String>,
    /// Ready condition true, not being deleted, not finished.
    pub ready: bool,
}

impl PodView {
    /// Reads a pod object.
    #[must_use]
    pub fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let ip = status
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok());
        let finished = status
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let ready_condition = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let terminating = pod.metadata.deletion_timestamp.is_some();
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            ip,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ready: ready_condition && !terminating && !finished,
        }
    }

    /// Whether the pod gets endpoints.
    #[must_use]
    pub fn serves(&self) -> bool {
        self.ready && self.ip.is_some()
    }
}

/// One endpoint with the name discovery gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedEndpoint {
    /// `<pod>` with one target port, `<pod>-rank-<i>` with several.
    pub name: String,
    /// Address and labels.
    pub spec: EndpointSpec,
}

/// The endpoints of `pods` (those that serve and match `selector`) on
/// `ports`, sorted by name.
#[must_use]
pub(super) fn endpoints<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    selector: &LabelSelector,
    ports: &[u16],
) -> Vec<NamedEndpoint> {
    let mut out: Vec<NamedEndpoint> = pods
        .into_iter()
        .flat_map(|pod| pod_endpoints(pod, selector, ports))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The endpoints of one pod: none unless it serves and matches `selector`.
#[must_use]
pub(super) fn pod_endpoints(
    pod: &PodView,
    selector: &LabelSelector,
    ports: &[u16],
) -> Vec<NamedEndpoint> {
    let Some(ip) = pod.ip.filter(|_| pod.ready) else {
        return Vec::new();
    };
    if !selector.matches(&pod.labels) {
        return Vec::new();
    }
    ports
        .iter()
        .enumerate()
        .map(|(rank, &port)| {
            let name = endpoint_name(&pod.name, rank, ports.len());
            NamedEndpoint {
                spec: EndpointSpec {
                    addr: SocketAddr::new(ip, port),
                    labels: pod.labels.clone(),
                    name: Some(name.as_str().into()),
                },
                name,
            }
        })
        .collect()
}

/// `<pod>` with one port, `<pod>-rank-<rank>` with several.
#[must_use]
pub(super) fn endpoint_name(pod: &str, rank: usize, ports: usize) -> String {
    if ports == 1 {
        pod.to_owned()
    } else {
        format!("{pod}-rank-{rank}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn both_pool_shapes() {
        let v1 = json!({"spec": {"selector": {"matchLabels": {"app": "m"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}]}});
        let spec = PoolSpec::from_object("p", &v1).unwrap();
        assert_eq!(spec.ports, vec![8000, 8001]);
        assert_eq!(spec.selector.as_str(), "app=m");
        let old = json!({"spec": {"selector": {"app": "m"}, "targetPortNumber": 9000}});
        let spec = PoolSpec::from_object("p", &old).unwrap();
        assert_eq!(spec.ports, vec![9000]);
        assert_eq!(spec.selector.as_str(), "app=m");
    }

    #[test]
    fn bad_pools_say_why() {
        for (data, needle) in [
            (json!({}), "no spec"),
            (
                json!({"spec": {"targetPorts": [{"number": 1}]}}),
                "no spec.selector",
            ),
            (
                json!({"spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}}),
                "selects no labels",
            ),
            (
                json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}),
                "no spec.targetPorts",
            ),
            (
                json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []}}),
                "0 target ports",
            ),
            (
                json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]}}),
                "not in 1-65535",
            ),
            (
                json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 1}, {"number": 1}]}}),
                "listed twice",
            ),
            (
                json!({"spec": {"selector": {"matchLabels": {"a": 3}}, "targetPorts": [{"number": 1}]}}),
                "spec.selector",
            ),
        ] {
            let e = PoolSpec::from_object("pool-a", &data)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle) && e.contains("pool-a"), "{data}: {e}");
        }
        let nine: Vec<i64> = (1..=9).collect();
        assert!(check_ports(&nine).unwrap_err().contains("9 target ports"));
    }

    fn pod(name: &str, ip: Option<&str>, ready: bool, labels: &[(&str, &str)]) -> PodView {
        PodView {
            name: name.into(),
            ip: ip.map(|ip| ip.parse().unwrap()),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            ready,
        }
    }

    #[test]
    fn endpoints_per_ready_pod_and_port() {
        let sel = LabelSelector::parse("app=m").unwrap();
        let pods = [
            pod(
                "a",
                Some("10.0.0.1"),
                true,
                &[("app", "m"), ("llm-d.ai/role", "decode")],
            ),
            pod("b", Some("10.0.0.2"), false, &[("app", "m")]),
            pod("c", None, true, &[("app", "m")]),
            pod("d", Some("10.0.0.4"), true, &[("app", "other")]),
        ];
        let one = endpoints(&pods, &sel, &[8000]);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "a");
        assert_eq!(one[0].spec.addr.to_string(), "10.0.0.1:8000");
        assert_eq!(one[0].spec.labels["llm-d.ai/role"], "decode");
        let ranks = endpoints(&pods, &sel, &[8000, 8001]);
        let names: Vec<_> = ranks
            .iter()
            .map(|e| (e.name.as_str(), e.spec.addr.port()))
            .collect();
        assert_eq!(names, vec![("a-rank-0", 8000), ("a-rank-1", 8001)]);
    }

    #[test]
    fn pod_readiness_from_status() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"app": "m"}},
            "status": {"phase": "Running", "podIP": "127.0.0.2",
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(PodView::from_pod(&p).serves());
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!PodView::from_pod(&p).serves(), "terminating");
        let not_ready: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "podIP": "127.0.0.2",
                "conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .unwrap();
        assert!(!PodView::from_pod(&not_ready).serves());
        let done: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Succeeded", "podIP": "127.0.0.2",
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(!PodView::from_pod(&done).serves());
    }
}
