//! A downstream crate adding its own scorer to the epp-rs picker, without
//! touching epp's crates: implement [`Scorer`], give it a factory, register
//! the factory under a YAML type, and name that type in a config.
//!
//! `preferred-label-scorer` scores 1.0 for endpoints whose label `label`
//! equals `value` (say, a newer GPU generation) and `otherwise` for the rest.

use std::sync::Arc;

use epp_core::{BuildError, Candidate, CycleContext, Plugin, PluginSpec, Registry, Scorer};

/// Parameters, as written under `parameters:` in the config.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreferredLabelParams {
    /// Label key.
    pub label: String,
    /// Preferred value.
    pub value: String,
    /// Score of the other endpoints, in [0, 1]. Default 0.
    #[serde(default)]
    pub otherwise: f64,
}

/// The scorer.
#[derive(Debug)]
pub struct PreferredLabelScorer {
    name: String,
    params: PreferredLabelParams,
}

impl PreferredLabelScorer {
    /// The YAML type.
    pub const TYPE: &'static str = "preferred-label-scorer";
}

impl Plugin for PreferredLabelScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}

impl Scorer for PreferredLabelScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let hit = c.endpoint.label(&self.params.label) == Some(self.params.value.as_str());
            *s = if hit { 1.0 } else { self.params.otherwise };
        }
    }
}

/// Adds `preferred-label-scorer` to a registry.
pub fn register(registry: &mut Registry) {
    registry.register(PreferredLabelScorer::TYPE, |spec: &PluginSpec| {
        let params: PreferredLabelParams = spec.params()?;
        if !(0.0..=1.0).contains(&params.otherwise) {
            return Err(BuildError::InvalidValue {
                plugin: spec.name.clone(),
                field: "otherwise".into(),
                value: params.otherwise.to_string(),
                reason: "must be in [0, 1]".into(),
            });
        }
        Ok(Arc::new(PreferredLabelScorer {
            name: spec.name.clone(),
            params,
        }))
    });
}
