//! `priority-holdback-policy`: lower ceilings for lower priorities.
//!
//! Rule (llm-d): each band the controller knows gets a ceiling between
//! `maxCeiling` (highest priority) and `minCeiling` (lowest); a band
//! dispatches only while the pool's saturation is below its ceiling, so
//! as saturation rises low-priority traffic waits first.
//! - `domain: rank` (default): equal steps by rank,
//!   `c_i = max − i·(max − min)/(N − 1)` (`i` = 0 for the highest of `N`).
//! - `domain: value`: proportional to the priority value,
//!   `c = min + (p − pMin)/(pMax − pMin)·(max − min)`.
//! - `domain: explicit`: `ceilings` maps each priority to its ceiling
//!   (non-increasing from the highest priority); a priority missing from
//!   the map gets 0 (held back).
//!
//! With one band (or all priorities equal under `value`) it gets
//! `maxCeiling`. `shape` is `linear` (the only curve llm-d has).

use std::collections::BTreeMap;

use epp_core::{BuildError, Plugin, flow::UsageLimitPolicy};

use crate::Builtin;

/// How priorities map to ceilings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HoldbackDomain {
    /// Equal steps by rank.
    #[default]
    Rank,
    /// Proportional to the priority value.
    Value,
    /// From the `ceilings` map.
    Explicit,
}

/// Parameters.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriorityHoldbackParams {
    /// Interpolation curve: `linear` (default, the only one).
    pub shape: Option<String>,
    /// `rank` (default), `value` or `explicit`.
    #[serde(default)]
    pub domain: HoldbackDomain,
    /// Ceiling of the lowest priority, in `[0, 1)`; required unless
    /// `domain: explicit`.
    pub min_ceiling: Option<f64>,
    /// Ceiling of the highest priority, in `(0, 1]`. Default 1.0.
    pub max_ceiling: Option<f64>,
    /// `domain: explicit`: priority → ceiling in `[0, 1]`.
    pub ceilings: Option<BTreeMap<i32, f64>>,
}

#[derive(Debug, Clone)]
enum Rule {
    Linear { rank: bool, min: f64, max: f64 },
    Explicit(BTreeMap<i32, f64>),
}

/// `priority-holdback-policy`.
#[derive(Debug, Clone)]
pub struct PriorityHoldbackPolicy {
    name: String,
    rule: Rule,
}

impl Builtin for PriorityHoldbackPolicy {
    const TYPE: &'static str = "priority-holdback-policy";
    type Params = PriorityHoldbackParams;

    /// # Errors
    /// An unknown shape; `minCeiling` missing or outside `[0, 1)`,
    /// `maxCeiling` outside `(0, 1]` or below `minCeiling`; for `explicit`,
    /// no `ceilings`, a ceiling outside `[0, 1]`, ceilings rising as
    /// priority falls, or `shape`/`minCeiling`/`maxCeiling` given.
    fn build(name: impl Into<String>, p: PriorityHoldbackParams) -> Result<Self, BuildError> {
        let bad = |field: &str, value: String, reason: &str| {
            crate::invalid(Self::TYPE, field, value, reason)
        };
        let rule = if p.domain == HoldbackDomain::Explicit {
            for (field, given) in [
                ("shape", p.shape.is_some()),
                ("minCeiling", p.min_ceiling.is_some()),
                ("maxCeiling", p.max_ceiling.is_some()),
            ] {
                if given {
                    return Err(bad(
                        field,
                        "set".into(),
                        "must not be set with domain explicit",
                    ));
                }
            }
            let Some(map) = p.ceilings else {
                return Err(bad(
                    "ceilings",
                    "absent".into(),
                    "required with domain explicit",
                ));
            };
            if map.is_empty() {
                return Err(bad(
                    "ceilings",
                    "{}".into(),
                    "must name at least one priority",
                ));
            }
            let mut above: Option<f64> = None;
            for (prio, c) in map.iter().rev() {
                if !(0.0..=1.0).contains(c) {
                    return Err(bad(
                        &format!("ceilings.{prio}"),
                        c.to_string(),
                        "must be in [0, 1]",
                    ));
                }
                if above.is_some_and(|a| *c > a) {
                    return Err(bad(
                        &format!("ceilings.{prio}"),
                        c.to_string(),
                        "must not exceed the ceiling of a higher priority",
                    ));
                }
                above = Some(*c);
            }
            Rule::Explicit(map)
        } else {
            if let Some(shape) = &p.shape
                && shape != "linear"
            {
                return Err(bad("shape", shape.clone(), "only \"linear\" is supported"));
            }
            if p.ceilings.is_some() {
                return Err(bad("ceilings", "set".into(), "only with domain explicit"));
            }
            let Some(min) = p.min_ceiling else {
                return Err(bad("minCeiling", "absent".into(), "required (in [0, 1))"));
            };
            if !(0.0..1.0).contains(&min) {
                return Err(bad("minCeiling", min.to_string(), "must be in [0, 1)"));
            }
            let max = p.max_ceiling.unwrap_or(1.0);
            if !(max > 0.0 && max <= 1.0) {
                return Err(bad("maxCeiling", max.to_string(), "must be in (0, 1]"));
            }
            if max < min {
                return Err(bad(
                    "maxCeiling",
                    max.to_string(),
                    "must be at least minCeiling",
                ));
            }
            Rule::Linear {
                rank: p.domain == HoldbackDomain::Rank,
                min,
                max,
            }
        };
        Ok(Self {
            name: name.into(),
            rule,
        })
    }
}

impl Plugin for PriorityHoldbackPolicy {
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

impl UsageLimitPolicy for PriorityHoldbackPolicy {
    fn ceilings(&self, _saturation: f64, priorities: &[i32], out: &mut Vec<f64>) {
        out.clear();
        let n = priorities.len();
        match &self.rule {
            Rule::Explicit(map) => {
                out.extend(
                    priorities
                        .iter()
                        .map(|p| map.get(p).copied().unwrap_or(0.0)),
                );
            }
            Rule::Linear {
                rank: true,
                min,
                max,
            } => {
                let step = if n > 1 {
                    (max - min) / (n - 1) as f64
                } else {
                    0.0
                };
                out.extend((0..n).map(|i| max - i as f64 * step));
            }
            Rule::Linear {
                rank: false,
                min,
                max,
            } => {
                let hi = priorities.iter().copied().max().unwrap_or(0);
                let lo = priorities.iter().copied().min().unwrap_or(0);
                let span = f64::from(hi) - f64::from(lo);
                out.extend(priorities.iter().map(|&p| {
                    if span > 0.0 {
                        min + (f64::from(p) - f64::from(lo)) / span * (max - min)
                    } else {
                        *max
                    }
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(yaml: &str) -> Result<PriorityHoldbackPolicy, BuildError> {
        PriorityHoldbackPolicy::build("h", serde_yaml_ng::from_str(yaml).unwrap())
    }

    fn ceilings(p: &PriorityHoldbackPolicy, prios: &[i32]) -> Vec<f64> {
        let mut out = Vec::new();
        p.ceilings(0.5, prios, &mut out);
        out
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn rank_steps_evenly_by_rank() {
        let p = build("{minCeiling: 0.4, maxCeiling: 0.9}").unwrap();
        assert!(close(&ceilings(&p, &[100, 50, -7]), &[0.9, 0.65, 0.4]));
        assert!(close(&ceilings(&p, &[3]), &[0.9]));
    }

    #[test]
    fn value_follows_the_priority_values() {
        let p = build("{domain: value, minCeiling: 0.2}").unwrap();
        assert!(close(&ceilings(&p, &[10, 8, 0]), &[1.0, 0.84, 0.2]));
        assert!(close(&ceilings(&p, &[4]), &[1.0]));
    }

    #[test]
    fn explicit_reads_the_map_and_holds_back_unknown_priorities() {
        let p = build("{domain: explicit, ceilings: {100: 0.95, 50: 0.7, 10: 0.3}}").unwrap();
        assert!(close(&ceilings(&p, &[100, 10, 7]), &[0.95, 0.3, 0.0]));
    }

    #[test]
    fn bad_parameters_are_named() {
        for (yaml, field) in [
            ("{}", "minCeiling"),
            ("{minCeiling: 1.0}", "minCeiling"),
            ("{minCeiling: 0.5, maxCeiling: 0.4}", "maxCeiling"),
            ("{minCeiling: 0.5, shape: cubic}", "shape"),
            ("{domain: explicit}", "ceilings"),
            (
                "{domain: explicit, minCeiling: 0.1, ceilings: {1: 0.5}}",
                "minCeiling",
            ),
            (
                "{domain: explicit, ceilings: {1: 0.9, 2: 0.5}}",
                "ceilings.1",
            ),
            ("{domain: explicit, ceilings: {1: 1.5}}", "ceilings.1"),
        ] {
            let err = build(yaml).unwrap_err().to_string();
            assert!(err.contains(field), "{yaml}: {err}");
        }
    }
}
