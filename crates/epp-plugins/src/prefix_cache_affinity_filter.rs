//! `prefix-cache-affinity-filter`: keep only endpoints holding most of the
//! prompt, when some do.

use epp_core::{BuildError, Candidate, CycleContext, DEFAULT_PREFIX_PRODUCER, Filter, Plugin};
use rand::Rng;

/// Parameters of `prefix-cache-affinity-filter`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixAffinityParams {
    /// Matched fraction of the prompt that makes an endpoint "affine". Default 0.8.
    #[serde(default = "default_affinity")]
    pub affinity_threshold: f64,
    /// Chance of ignoring affinity, to keep exploring. Default 0.01.
    #[serde(default = "default_exploration")]
    pub exploration_probability: f64,
    /// Producer whose prefix matches are read (default
    /// `approx-prefix-cache-producer`).
    #[serde(default)]
    pub prefix_match_info_producer_name: Option<String>,
}

fn default_affinity() -> f64 {
    0.8
}
fn default_exploration() -> f64 {
    0.01
}

impl Default for PrefixAffinityParams {
    fn default() -> Self {
        Self {
            affinity_threshold: default_affinity(),
            exploration_probability: default_exploration(),
            prefix_match_info_producer_name: None,
        }
    }
}

/// `prefix-cache-affinity-filter`: when some candidates hold at least
/// `affinityThreshold` of the prompt, keep only those (except with
/// probability `explorationProbability`). Needs a prefix producer.
#[derive(Debug, Clone)]
pub struct PrefixCacheAffinityFilter {
    name: String,
    params: PrefixAffinityParams,
}

impl PrefixCacheAffinityFilter {
    /// YAML type.
    pub const TYPE: &'static str = "prefix-cache-affinity-filter";

    /// A filter named `name`.
    ///
    /// # Errors
    /// Threshold outside (0, 1] or probability outside [0, 1].
    pub fn new(name: impl Into<String>, params: PrefixAffinityParams) -> Result<Self, BuildError> {
        let bad = |field: &str, v: f64, reason: &str| BuildError::InvalidValue {
            plugin: Self::TYPE.into(),
            field: field.into(),
            value: v.to_string(),
            reason: reason.into(),
        };
        if !(params.affinity_threshold > 0.0 && params.affinity_threshold <= 1.0) {
            return Err(bad(
                "affinityThreshold",
                params.affinity_threshold,
                "must be in (0, 1]",
            ));
        }
        if !(0.0..=1.0).contains(&params.exploration_probability) {
            return Err(bad(
                "explorationProbability",
                params.exploration_probability,
                "must be in [0, 1]",
            ));
        }
        Ok(Self {
            name: name.into(),
            params,
        })
    }
}

impl Plugin for PrefixCacheAffinityFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
    fn prefix_match_source(&self) -> Option<&str> {
        Some(
            self.params
                .prefix_match_info_producer_name
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(DEFAULT_PREFIX_PRODUCER),
        )
    }
}

impl Filter for PrefixCacheAffinityFilter {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        let t = self.params.affinity_threshold;
        let prefix = &cx.state.prefix;
        if !candidates.iter().any(|c| prefix.ratio(c.id()) >= t) {
            return;
        }
        if cx.rng.random::<f64>() < self.params.exploration_probability {
            return;
        }
        let prefix = &cx.state.prefix;
        candidates.retain(|c| prefix.ratio(c.id()) >= t);
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn affinity_filter_keeps_affine_endpoints() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let f = PrefixCacheAffinityFilter::new(
            "f",
            PrefixAffinityParams {
                affinity_threshold: 0.5,
                exploration_probability: 0.0,
                ..Default::default()
            },
        )
        .unwrap();
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            cx.state.prefix.hashes = vec![1, 2, 3, 4];
            cx.state.prefix.computed = true;
            cx.state.prefix.set_matched(c[1].id(), 3);
            cx.state.prefix.set_matched(c[2].id(), 1);
            let mut kept = c.clone();
            f.filter(cx, &mut kept);
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0].id(), c[1].id());
        });
    }
}
