//! `static-usage-limit-policy`: one fixed ceiling for every band.
//!
//! Rule (llm-d's default usage-limit policy): every band gets the ceiling
//! `threshold` (default 1.0: a band dispatches whenever the pool is not
//! saturated; 0.8: only while saturation is below 0.8).

use epp_core::{BuildError, Plugin, flow::UsageLimitPolicy};

use crate::Builtin;

/// Parameters.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticUsageLimitParams {
    /// The ceiling of every band, in `[0, 1]`. Default 1.0.
    pub threshold: Option<f64>,
}

/// `static-usage-limit-policy`.
#[derive(Debug, Clone)]
pub struct StaticUsageLimitPolicy {
    name: String,
    threshold: f64,
}

impl Builtin for StaticUsageLimitPolicy {
    const TYPE: &'static str = "static-usage-limit-policy";
    type Params = StaticUsageLimitParams;
    /// # Errors
    /// A threshold outside `[0, 1]`.
    fn build(name: impl Into<String>, p: StaticUsageLimitParams) -> Result<Self, BuildError> {
        let threshold = p.threshold.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&threshold) {
            return Err(crate::invalid(
                Self::TYPE,
                "threshold",
                threshold,
                "must be in [0, 1]",
            ));
        }
        Ok(Self {
            name: name.into(),
            threshold,
        })
    }
}

impl Plugin for StaticUsageLimitPolicy {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_usage_limit_policy(&self) -> Option<&dyn UsageLimitPolicy> {
        Some(self)
    }
}

impl UsageLimitPolicy for StaticUsageLimitPolicy {
    fn ceilings(&self, _saturation: f64, priorities: &[i32], out: &mut Vec<f64>) {
        out.clear();
        out.resize(priorities.len(), self.threshold);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_ceiling_for_all_and_range_checked() {
        let p = StaticUsageLimitPolicy::build("s", StaticUsageLimitParams::default()).unwrap();
        let mut out = vec![9.0];
        p.ceilings(0.5, &[3, 1, -1], &mut out);
        assert_eq!(out, [1.0, 1.0, 1.0]);
        let p = StaticUsageLimitPolicy::build(
            "s",
            StaticUsageLimitParams {
                threshold: Some(0.8),
            },
        )
        .unwrap();
        p.ceilings(0.5, &[3], &mut out);
        assert_eq!(out, [0.8]);
        let err = StaticUsageLimitPolicy::build(
            "s",
            StaticUsageLimitParams {
                threshold: Some(1.5),
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("threshold"), "{err}");
    }
}
