//! Built-in scheduling plugins (filters, scorers, pickers, profile handlers,
//! saturation detectors, data producers) and [`register_builtins`], which
//! adds every one of them to a [`Registry`] under the YAML `type:` names users
//! know from the reference picker and llm-d, names the defaults for the roles
//! they fill, and registers [`DEFAULT_CONFIG`]. Every built-in has one shape,
//! [`Builtin`]: a type name, a parameters struct and a validating `build`.
//!
//! ```
//! use epp_core::{PluginSpec, Registry, Role};
//! use epp_plugins::{Builtin, MaxScorePicker};
//!
//! let mut registry = Registry::new();
//! epp_plugins::register_builtins(&mut registry);
//! let scorer = registry.build(&PluginSpec::new("queue-scorer")).unwrap();
//! assert!(scorer.as_scorer().is_some());
//! assert_eq!(registry.default_type(Role::Picker), Some(MaxScorePicker::TYPE));
//! assert_eq!(registry.default_config(), Some(epp_plugins::DEFAULT_CONFIG));
//! ```
#![warn(missing_docs)]

/// A flow-control policy with no parameters and no state: the struct (its
/// `name` only), its [`Builtin`] (YAML type `$type`, [`NoParams`]) and its
/// [`Plugin`](epp_core::Plugin) filling the one role `$role`. Each policy's
/// file writes the doc and the role's rule.
macro_rules! stateless_policy {
    ($(#[$doc:meta])* $policy:ident, $type:literal, $as_role:ident -> $role:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $policy {
            name: String,
        }

        impl $crate::Builtin for $policy {
            const TYPE: &'static str = $type;
            type Params = $crate::NoParams;
            fn build(
                name: impl Into<String>,
                $crate::NoParams {}: $crate::NoParams,
            ) -> Result<Self, epp_core::BuildError> {
                Ok(Self { name: name.into() })
            }
        }

        impl epp_core::Plugin for $policy {
            fn type_name(&self) -> &str {
                <Self as $crate::Builtin>::TYPE
            }
            fn name(&self) -> &str {
                &self.name
            }
            fn $as_role(&self) -> Option<&dyn epp_core::flow::$role> {
                Some(self)
            }
        }
    };
}

mod active_request_scorer;
mod always_disagg_multimodal_decider;
mod always_disagg_pd_decider;
mod approx_prefix_cache_producer;
mod burst_prefix_cache_producer;
mod concurrency_detector;
mod data_parallel_profile_handler;
mod disagg_profile_handler;
mod edf_ordering_policy;
mod endpoint_attribute_filter;
mod endpoint_attribute_scorer;
mod fcfs_ordering_policy;
mod global_strict_fairness_policy;
mod header_based_testing_filter;
mod header_label_affinity_scorer;
mod inflight_load_producer;
mod kv_block_index;
mod label_selector_filter;
mod latency_model;
mod latency_scorer;
mod latency_slo_admitter;
mod load_aware_scorer;
mod load_signal_scorer;
mod lora_affinity_scorer;
mod max_score_picker;
mod metric_scorer;
mod mm_embeddings_cache_producer;
mod mm_embeddings_cache_scorer;
mod no_hit_lru_scorer;
mod precise_prefix_cache_producer;
mod predicted_latency_producer;
mod prefix_based_pd_decider;
mod prefix_cache_affinity_filter;
mod prefix_cache_scorer;
mod prefix_index;
mod priority_holdback_policy;
mod probabilistic_admitter;
mod program_aware_fairness;
mod random_picker;
mod request_parsers;
mod round_robin_fairness_policy;
mod session_affinity_scorer;
mod slo_deadline_ordering_policy;
mod slo_headroom_tier_filter;
mod soft_reflective_ceiling_policy;
mod static_usage_limit_policy;
mod token_load_scorer;
mod token_producer;
mod topology_affinity_filter;
mod topology_affinity_scorer;
mod topology_extractor;
mod utilization_detector;
mod utilization_filter;
mod weighted_random_picker;

#[cfg(test)]
mod test_sink;

use std::sync::Arc;

use epp_core::{BuildError, Plugin, PluginSpec, Registry, Role, SingleProfileHandler};
use serde::de::DeserializeOwned;

pub use active_request_scorer::{ActiveRequestParams, ActiveRequestScorer};
pub use always_disagg_multimodal_decider::AlwaysDisaggMultimodalDecider;
pub use always_disagg_pd_decider::AlwaysDisaggPdDecider;
pub use approx_prefix_cache_producer::{
    ApproxPrefixCacheProducer, PrefixCacheParams, RecordMode, block_hashes,
};
pub use burst_prefix_cache_producer::{BurstPrefixCacheProducer, BurstPrefixParams};
pub use concurrency_detector::{ConcurrencyDetector, ConcurrencyDetectorParams, ConcurrencyMode};
pub use data_parallel_profile_handler::{
    DATA_PARALLEL_HEADER, DataParallelParams, DataParallelProfileHandler,
};
pub use disagg_profile_handler::{
    DisaggParams, DisaggProfileHandler, ENCODERS_HEADER, PREFILL_HEADER, StageDeciders, StageOrder,
    StageProfiles,
};
pub use edf_ordering_policy::EdfOrderingPolicy;
pub use endpoint_attribute_filter::{
    EndpointAttributeFilter, EndpointAttributeFilterParams, FilterAlgorithm, OnMissing, Threshold,
    ThresholdOperator,
};
pub use endpoint_attribute_scorer::{
    AdaptiveRange, EndpointAttributeScorer, EndpointAttributeScorerParams, FixedRange,
    Normalization, ScorerAlgorithm,
};
pub use fcfs_ordering_policy::FcfsOrderingPolicy;
pub use global_strict_fairness_policy::GlobalStrictFairnessPolicy;
pub use header_based_testing_filter::{ENDPOINT_SELECTION_HEADER, HeaderBasedTestingFilter};
pub use header_label_affinity_scorer::{HeaderLabelAffinityParams, HeaderLabelAffinityScorer};
pub use inflight_load_producer::{DEFAULT_OUTPUT_RATIO, InflightLoadParams, InflightLoadProducer};
pub use kv_block_index::{
    IndexCounters, IndexMirror, KvBlockIndex, block_key, fold_extra, root_key,
};
pub use label_selector_filter::{
    LabelExpression, LabelSelectorFilter, LabelSelectorParams, Operator, ROLE_LABEL,
};
pub use latency_model::{FEATURES, Features, LatencyModel, ModelSettings, PredictionParts};
pub use latency_scorer::{HeadroomStrategy, LatencyScorer, LatencyScorerParams};
pub use latency_slo_admitter::{LatencyAdmitterParams, LatencySloAdmitter};
pub use load_aware_scorer::{LoadAwareParams, LoadAwareScorer};
pub use load_signal_scorer::{LoadSignalParams, LoadSignalScorer, Signal};
pub use lora_affinity_scorer::LoraAffinityScorer;
pub use max_score_picker::{MaxScorePicker, PickerParams};
pub use metric_scorer::{MetricScorer, MetricScorerParams, NormalizationAlgo, OptimizationMode};
pub use mm_embeddings_cache_producer::{MmEmbeddingsCacheProducer, MmEmbeddingsParams};
pub use mm_embeddings_cache_scorer::MmEmbeddingsCacheScorer;
pub use no_hit_lru_scorer::{NoHitLruParams, NoHitLruScorer};
pub use precise_prefix_cache_producer::{
    PrecisePrefixCacheProducer, PrecisePrefixParams, TokenProcessorConfig,
};
pub use predicted_latency_producer::{Predicted, PredictedLatencyParams, PredictedLatencyProducer};
pub use prefix_based_pd_decider::{PrefixBasedPdDecider, PrefixPdParams};
pub use prefix_cache_affinity_filter::{
    PrefixAffinityParams, PrefixCacheAffinityFilter, TtftSource,
};
pub use prefix_cache_scorer::{PrefixCacheScorer, PrefixCacheScorerParams};
pub use prefix_index::PrefixIndex;
pub use priority_holdback_policy::{
    HoldbackDomain, PriorityHoldbackParams, PriorityHoldbackPolicy,
};
pub use probabilistic_admitter::{ProbabilisticAdmitter, ProbabilisticAdmitterParams};
pub use program_aware_fairness::{ProgramAwareFairness, ProgramAwareParams};
pub use random_picker::RandomPicker;
pub use request_parsers::{ApiParser, OTHER_PARSERS};
pub use round_robin_fairness_policy::RoundRobinFairnessPolicy;
pub use session_affinity_scorer::{
    EncodedEndpointHeaderConfig, SESSION_HEADER, SessionAffinityParams, SessionAffinityScorer,
    session_token,
};
pub use slo_deadline_ordering_policy::SloDeadlineOrderingPolicy;
pub use slo_headroom_tier_filter::{SloHeadroomTierFilter, SloTierParams};
pub use soft_reflective_ceiling_policy::SoftReflectiveCeilingPolicy;
pub use static_usage_limit_policy::{StaticUsageLimitParams, StaticUsageLimitPolicy};
pub use token_load_scorer::{TokenLoadParams, TokenLoadScorer};
pub use token_producer::{
    ByteBpe, ChatTemplate, ContentFormat, LocalTokenizerParams, RenderedChat, SpecialTokens,
    TokenProducer, TokenProducerParams, Unrendered, UnsupportedTokenizer,
};
pub use topology_affinity_filter::{TopologyAffinityFilter, TopologyFilterParams};
pub use topology_affinity_scorer::{TopologyAffinityScorer, TopologyScorerParams, proximity};
pub use topology_extractor::{TopologyExtractor, TopologyLabels};
pub use utilization_detector::{UtilizationDetector, UtilizationDetectorParams};
pub use utilization_filter::{
    UtilizationCondition, UtilizationFilter, UtilizationFilterParams, UtilizationMetric,
};
pub use weighted_random_picker::WeightedRandomPicker;

/// A parameter error for `plugin`.
pub(crate) fn invalid(plugin: &str, field: &str, value: impl ToString, reason: &str) -> BuildError {
    BuildError::InvalidValue {
        plugin: plugin.into(),
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Checks that every `(field, weight)` of `plugin` is a finite number ≥ 0.
pub(crate) fn non_negative_weights(
    plugin: &str,
    weights: &[(&str, f64)],
) -> Result<(), BuildError> {
    match weights.iter().find(|(_, w)| !(w.is_finite() && *w >= 0.0)) {
        Some((field, w)) => Err(invalid(plugin, field, w, "must be a finite number >= 0")),
        None => Ok(()),
    }
}

/// Parameters of plugins that take none: any key is an error.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// A built-in plugin as [`register_builtins`] builds it: one YAML type, one
/// parameters struct, one `build` that validates them. The registry's
/// factory is the same for every built-in: deserialise [`Builtin::Params`]
/// from `parameters:` (absent = an empty mapping), then [`Builtin::build`].
///
/// The trait is for building and naming only; the scheduler holds plugins
/// through the object-safe [`Plugin`] traits.
pub trait Builtin: Plugin + Sized + 'static {
    /// The YAML `type:`.
    const TYPE: &'static str;
    /// The parameters as written under `parameters:` (unknown keys rejected).
    type Params: DeserializeOwned;
    /// Validates `params` and builds the plugin named `name`.
    ///
    /// # Errors
    /// A parameter out of range or otherwise invalid, naming the field and
    /// the value.
    fn build(name: impl Into<String>, params: Self::Params) -> Result<Self, BuildError>;
}

/// Registers `type_name`, built by `build` from the deserialised parameters.
fn add<T, P>(
    registry: &mut Registry,
    type_name: &str,
    build: impl Fn(String, P) -> Result<T, BuildError> + Send + Sync + 'static,
) where
    T: Plugin + 'static,
    P: DeserializeOwned,
{
    registry.register(type_name, move |spec: &PluginSpec| {
        Ok(Arc::new(build(spec.name.clone(), spec.params()?)?))
    });
}

/// Registers `T` under [`Builtin::TYPE`].
fn reg<T: Builtin>(registry: &mut Registry) {
    add(registry, T::TYPE, |name, params| T::build(name, params));
}

impl Builtin for SingleProfileHandler {
    const TYPE: &'static str = SingleProfileHandler::TYPE;
    type Params = NoParams;
    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self::new(name))
    }
}

/// The config used when none is given: the reference picker's default
/// profile. [`register_builtins`] registers it
/// ([`Registry::set_default_config`]).
pub const DEFAULT_CONFIG: &str = "\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
";

/// Registers every built-in scheduling plugin, the defaults for the roles
/// they fill (picker, profile handler, saturation detector, parser,
/// prefix-match producer) and [`DEFAULT_CONFIG`].
pub fn register_builtins(registry: &mut Registry) {
    registry
        .set_default(Role::Picker, MaxScorePicker::TYPE)
        .set_default(Role::ProfileHandler, SingleProfileHandler::TYPE)
        .set_default(Role::SaturationDetector, UtilizationDetector::TYPE)
        .set_default(Role::Parser, ApiParser::TYPE)
        .set_default(Role::PrefixProducer, ApproxPrefixCacheProducer::TYPE)
        .set_default(Role::LatencyPredictor, PredictedLatencyProducer::TYPE)
        .set_default_config(DEFAULT_CONFIG);
    for signal in Signal::ALL {
        add(registry, signal.type_name(), move |name, p| {
            Ok(LoadSignalScorer::new(name, signal, p))
        });
    }
    reg::<PrefixCacheScorer>(registry);
    reg::<ApproxPrefixCacheProducer>(registry);
    reg::<BurstPrefixCacheProducer>(registry);
    reg::<PrecisePrefixCacheProducer>(registry);
    reg::<TokenProducer>(registry);
    reg::<MaxScorePicker>(registry);
    reg::<RandomPicker>(registry);
    reg::<WeightedRandomPicker>(registry);
    reg::<SingleProfileHandler>(registry);
    reg::<DisaggProfileHandler>(registry);
    reg::<TopologyExtractor>(registry);
    reg::<TopologyAffinityFilter>(registry);
    reg::<TopologyAffinityScorer>(registry);
    reg::<DataParallelProfileHandler>(registry);
    reg::<PrefixBasedPdDecider>(registry);
    reg::<AlwaysDisaggPdDecider>(registry);
    reg::<AlwaysDisaggMultimodalDecider>(registry);
    reg::<UtilizationDetector>(registry);
    reg::<ConcurrencyDetector>(registry);
    reg::<GlobalStrictFairnessPolicy>(registry);
    reg::<RoundRobinFairnessPolicy>(registry);
    reg::<ProgramAwareFairness>(registry);
    reg::<FcfsOrderingPolicy>(registry);
    reg::<EdfOrderingPolicy>(registry);
    reg::<SloDeadlineOrderingPolicy>(registry);
    reg::<StaticUsageLimitPolicy>(registry);
    reg::<PriorityHoldbackPolicy>(registry);
    reg::<SoftReflectiveCeilingPolicy>(registry);
    reg::<ApiParser>(registry);
    for (type_name, _) in OTHER_PARSERS {
        add(registry, type_name, move |name, NoParams {}| {
            ApiParser::other(name, type_name).ok_or_else(|| BuildError::UnknownType {
                type_name: type_name.to_owned(),
                hint: String::new(),
            })
        });
    }
    reg::<LoraAffinityScorer>(registry);
    reg::<TokenLoadScorer>(registry);
    reg::<InflightLoadProducer>(registry);
    reg::<LoadAwareScorer>(registry);
    reg::<ActiveRequestScorer>(registry);
    reg::<SessionAffinityScorer>(registry);
    reg::<NoHitLruScorer>(registry);
    reg::<MetricScorer>(registry);
    reg::<MmEmbeddingsCacheProducer>(registry);
    reg::<MmEmbeddingsCacheScorer>(registry);
    reg::<HeaderLabelAffinityScorer>(registry);
    reg::<EndpointAttributeScorer>(registry);
    reg::<EndpointAttributeFilter>(registry);
    reg::<UtilizationFilter>(registry);
    reg::<PrefixCacheAffinityFilter>(registry);
    reg::<PredictedLatencyProducer>(registry);
    reg::<LatencyScorer>(registry);
    reg::<SloHeadroomTierFilter>(registry);
    reg::<LatencySloAdmitter>(registry);
    reg::<ProbabilisticAdmitter>(registry);
    reg::<LabelSelectorFilter>(registry);
    reg::<HeaderBasedTestingFilter>(registry);
    add(registry, "decode-filter", |name, NoParams {}| {
        Ok(LabelSelectorFilter::decode(name))
    });
    add(registry, "prefill-filter", |name, NoParams {}| {
        Ok(LabelSelectorFilter::prefill(name))
    });
    add(registry, "encode-filter", |name, NoParams {}| {
        Ok(LabelSelectorFilter::encode(name))
    });
}

/// The filter role of a saturation detector: keep the endpoints with
/// capacity left, or all of them when none has (better a busy endpoint than
/// a refusal; shedding is the detector's saturation verdict, not the filter's).
fn keep_with_capacity(
    detector: &dyn epp_core::SaturationDetector,
    cx: &epp_core::CycleContext<'_>,
    candidates: &mut Vec<epp_core::Candidate>,
) {
    if candidates.iter().any(|c| detector.has_capacity(cx, c)) {
        candidates.retain(|c| detector.has_capacity(cx, c));
    }
}

/// A registry holding every built-in scheduling plugin.
#[must_use]
pub fn builtin_registry() -> Registry {
    let mut registry = Registry::new();
    register_builtins(&mut registry);
    registry
}

/// The unit tests' candidates and cycle contexts.
#[cfg(test)]
use epp_test_support::endpoints as testing;
