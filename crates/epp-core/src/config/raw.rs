//! The config file as written (serde), unknown keys rejected.

use serde::{Deserialize, Serialize};

use super::objectives::{ModelRewriteDecl, ObjectiveDecl};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) feature_gates: Vec<String>,
    #[serde(default)]
    pub(crate) plugins: Vec<PluginDecl>,
    #[serde(default)]
    pub(crate) scheduling_profiles: Vec<ProfileDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) saturation_detector: Option<PluginRefDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data_layer: Option<DataLayerDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<DataLayerDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parser: Option<PluginRefDecl>,
    /// llm-d's newer home of the parser: `requestHandler.parsers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) request_handler: Option<RequestHandlerDecl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) flow_control: Option<FlowControlConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) objectives: Vec<ObjectiveDecl>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) model_rewrites: Vec<ModelRewriteDecl>,
}

/// A plugin declaration: `type`, optional `name`, optional `parameters`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginDecl {
    /// Plugin type.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Instance name (defaults to the type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_yaml_ng::Value>,
}

impl PluginDecl {
    /// The declaration of a plugin built from `spec` (parameters left out
    /// when it has none).
    pub(crate) fn of_spec(spec: &crate::PluginSpec) -> Self {
        Self {
            type_name: spec.type_name.clone(),
            name: Some(spec.name.clone()),
            parameters: (!spec.parameters.is_null()).then(|| spec.parameters.clone()),
        }
    }
}

/// A scheduling profile.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileDecl {
    /// Profile name.
    pub name: String,
    /// Filters, scorers and the picker, by reference.
    #[serde(default)]
    pub plugins: Vec<ProfilePluginDecl>,
}

/// A plugin used in a profile.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfilePluginDecl {
    /// Name of a declared plugin.
    pub plugin_ref: String,
    /// Scorer weight (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// `{pluginRef: name}`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginRefDecl {
    /// Name of a declared plugin.
    pub plugin_ref: String,
}

/// `requestHandler: {parsers: [{pluginRef: ..}]}` (llm-d).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RequestHandlerDecl {
    #[serde(default)]
    pub(crate) parsers: Vec<PluginRefDecl>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct DataLayerDecl {
    /// llm-d: whether the default metrics source and extractor are added
    /// when no source of the default source's type is listed (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) inject_defaults: Option<bool>,
    #[serde(default)]
    pub(crate) sources: Vec<SourceDecl>,
    /// llm-d: the endpoint-discovery plugin replacing Kubernetes discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discovery: Option<PluginRefDecl>,
    /// llm-d: the plugin that finds peer picker replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) peer_discovery: Option<PluginRefDecl>,
    /// llm-d: the plugin that shares per-endpoint state between replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cross_replica_syncer_plugin_ref: Option<String>,
    /// llm-d: how often a replica publishes its state to the syncer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cross_replica_sync_interval: Option<String>,
}

/// A data source and its extractors.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceDecl {
    /// Name of a declared data-source plugin.
    pub plugin_ref: String,
    /// Extractors fed by the source.
    #[serde(default)]
    pub extractors: Vec<PluginRefDecl>,
}

/// Flow control settings (`flowControl`), used when the `flowControl`
/// feature gate is on.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowControlConfig {
    /// Bytes queued at most, e.g. `10Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<serde_yaml_ng::Value>,
    /// Requests queued at most, a quantity (`5000`, `5k`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<serde_yaml_ng::Value>,
    /// Default time a request may wait, e.g. `60s`.
    #[serde(
        default,
        rename = "defaultRequestTTL",
        skip_serializing_if = "Option::is_none"
    )]
    pub default_request_ttl: Option<String>,
    /// llm-d: how long a request may wait while the pool has no endpoint.
    #[serde(
        default,
        rename = "noEndpointRequestTTL",
        skip_serializing_if = "Option::is_none"
    )]
    pub no_endpoint_request_ttl: Option<String>,
    /// Priority bands (distinct priorities).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub priority_bands: Vec<PriorityBandDecl>,
    /// llm-d: the template for negative priorities (sheddable traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_negative_priority_band: Option<PriorityBandDecl>,
    /// llm-d: demand-driven eviction of in-flight sheddable requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_eviction: Option<bool>,
    /// llm-d's newer home of the top-level `saturationDetector`; when both
    /// are given this one is used, as in llm-d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation_detector: Option<PluginRefDecl>,
    /// llm-d: the template for priority levels `priorityBands` does not list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_priority_band: Option<PriorityBandDecl>,
    /// llm-d: the usage-limit policy plugin. Must name a declared plugin or
    /// llm-d's built-in `static-usage-limit-policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_limit_policy_plugin_ref: Option<String>,
}

/// A priority band as llm-d writes it (`priorityBands[]`,
/// `defaultPriorityBand`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriorityBandDecl {
    /// Priority level (higher = more important).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Byte capacity, a Kubernetes quantity (`1Gi`, `500M`, `1000`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<serde_yaml_ng::Value>,
    /// Request capacity, a Kubernetes quantity (`100`, `1k`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<serde_yaml_ng::Value>,
    /// Fairness policy plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_policy_ref: Option<String>,
    /// Ordering policy plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_policy_ref: Option<String>,
    /// epp's extension: the saturation at which the band's busiest flows
    /// wait while another of its flows is active, in `(0, 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busiest_flow_ceiling: Option<f64>,
}
