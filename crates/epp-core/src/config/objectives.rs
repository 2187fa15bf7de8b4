//! What Kubernetes deployments of the reference picker declare as separate
//! resources, in the config file for standalone use: `objectives`
//! (InferenceObjective: name → priority) and `modelRewrites`
//! (InferenceModelRewrite: rules matching a model name, weighted targets).
//!
//! ```yaml
//! objectives:
//! - {name: interactive, priority: 10}
//! - {name: batch, priority: -1}          # negative: shed with 429 when saturated
//! modelRewrites:
//! - name: canary
//!   rules:
//!   - matches: [{model: {type: Exact, value: chat}}]
//!     targets:
//!     - {modelRewrite: chat-v1, weight: 90}
//!     - {modelRewrite: chat-v2, weight: 10}
//!   - matches: []                         # every other model
//!     targets: [{modelRewrite: base}]
//! ```

use std::collections::HashMap;

use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};

/// An objective: requests naming it in `x-gateway-inference-objective` get
/// its priority (the reference's InferenceObjective resource).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectiveDecl {
    /// The name clients send.
    pub name: String,
    /// Priority; negative means sheddable. Defaults to 0.
    #[serde(default)]
    pub priority: i32,
}

/// A set of rewrite rules (one InferenceModelRewrite resource's `spec`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelRewriteDecl {
    /// A name for logs and errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The rules.
    pub rules: Vec<RewriteRuleDecl>,
}

/// One rule: which models it applies to, and the weighted targets.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RewriteRuleDecl {
    /// Model matches; empty = every model no other rule matches.
    #[serde(default)]
    pub matches: Vec<ModelMatchDecl>,
    /// Target models, chosen at random in proportion to their weights.
    pub targets: Vec<RewriteTargetDecl>,
}

/// `{model: {type: Exact, value: NAME}}`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelMatchDecl {
    /// The model-name match.
    pub model: ModelNameMatch,
}

/// A model-name match; `type` is `Exact` (the only type the reference has).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelNameMatch {
    /// Match type (default `Exact`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub match_type: Option<String>,
    /// The model name in the request body.
    pub value: String,
}

/// A target model and its weight.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RewriteTargetDecl {
    /// The model the request is sent for.
    pub model_rewrite: String,
    /// Relative weight; give it on every target of a rule or on none
    /// (then all weigh the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// A validation problem: the field path (relative to the config root) and why.
pub(crate) type Invalid = (String, String);

/// Objective name → priority, validated (names unique and non-empty).
pub(crate) fn build_objectives(decls: &[ObjectiveDecl]) -> Result<HashMap<String, i32>, Invalid> {
    let mut out = HashMap::with_capacity(decls.len());
    for (i, o) in decls.iter().enumerate() {
        if o.name.trim().is_empty() {
            return Err((format!("objectives[{i}].name"), "must not be empty".into()));
        }
        if out.insert(o.name.clone(), o.priority).is_some() {
            return Err((
                format!("objectives[{i}].name"),
                format!("duplicate objective {:?}", o.name),
            ));
        }
    }
    Ok(out)
}

/// The built rewrite rules: exact model names first, then the catch-all.
#[derive(Debug, Clone, Default)]
pub struct ModelRewriteRules {
    exact: HashMap<String, usize>,
    fallback: Option<usize>,
    rules: Vec<BuiltRule>,
}

#[derive(Debug, Clone)]
struct BuiltRule {
    /// Target models with cumulative weights (strictly increasing totals
    /// skip zero-weight targets).
    targets: Vec<(String, u64)>,
    total: u64,
}

impl ModelRewriteRules {
    /// Validates and builds the rules of every `modelRewrites` entry.
    pub(crate) fn build(decls: &[ModelRewriteDecl]) -> Result<Self, Invalid> {
        let mut out = Self::default();
        let mut fallback_at = String::new();
        for (di, d) in decls.iter().enumerate() {
            if d.rules.is_empty() {
                return Err((
                    format!("modelRewrites[{di}].rules"),
                    "give at least one rule".into(),
                ));
            }
            for (ri, r) in d.rules.iter().enumerate() {
                let at = format!("modelRewrites[{di}].rules[{ri}]");
                let rule = build_rule(r, &at)?;
                let index = out.rules.len();
                out.rules.push(rule);
                if r.matches.is_empty() {
                    if out.fallback.is_some() {
                        return Err((
                            format!("{at}.matches"),
                            format!(
                                "a second catch-all rule (empty matches); the first is {fallback_at}"
                            ),
                        ));
                    }
                    out.fallback = Some(index);
                    fallback_at = at.clone();
                }
                for (mi, m) in r.matches.iter().enumerate() {
                    let field = format!("{at}.matches[{mi}].model");
                    if let Some(t) = &m.model.match_type
                        && t != "Exact"
                    {
                        return Err((
                            format!("{field}.type"),
                            format!("unsupported match type {t:?}, expected \"Exact\""),
                        ));
                    }
                    if m.model.value.is_empty() {
                        return Err((format!("{field}.value"), "must not be empty".into()));
                    }
                    if out.exact.insert(m.model.value.clone(), index).is_some() {
                        return Err((
                            format!("{field}.value"),
                            format!("model {:?} is matched by an earlier rule", m.model.value),
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Validates and builds rules declared outside the config file (e.g.
    /// InferenceModelRewrite resources on Kubernetes).
    ///
    /// # Errors
    /// The first invalid rule, as `field: why` (fields as if under
    /// `modelRewrites`).
    pub fn from_decls(decls: &[ModelRewriteDecl]) -> Result<Self, String> {
        Self::build(decls).map_err(|(field, why)| format!("{field}: {why}"))
    }

    /// Whether there is no rule.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The target model for a request asking for `model`, drawn with `rng`
    /// in proportion to the weights of the matching rule's targets; `None`
    /// when no rule matches.
    pub fn choose(&self, model: &str, rng: &mut dyn RngCore) -> Option<&str> {
        let index = self.exact.get(model).copied().or(self.fallback)?;
        let rule = self.rules.get(index)?;
        if let [(only, _)] = rule.targets.as_slice() {
            return Some(only);
        }
        let draw = rng.random_range(0..rule.total);
        rule.targets
            .iter()
            .find(|(_, upto)| draw < *upto)
            .map(|(m, _)| m.as_str())
    }
}

fn build_rule(r: &RewriteRuleDecl, at: &str) -> Result<BuiltRule, Invalid> {
    if r.targets.is_empty() {
        return Err((format!("{at}.targets"), "give at least one target".into()));
    }
    let weighted = r.targets.iter().filter(|t| t.weight.is_some()).count();
    if weighted != 0 && weighted != r.targets.len() {
        return Err((
            format!("{at}.targets"),
            "set a weight on every target of a rule or on none".into(),
        ));
    }
    let mut total = 0u64;
    let mut targets = Vec::with_capacity(r.targets.len());
    for (ti, t) in r.targets.iter().enumerate() {
        if t.model_rewrite.is_empty() {
            return Err((
                format!("{at}.targets[{ti}].modelRewrite"),
                "must not be empty".into(),
            ));
        }
        let w = u64::from(t.weight.unwrap_or(1));
        if w > 0 {
            total += w;
            targets.push((t.model_rewrite.clone(), total));
        }
    }
    if total == 0 {
        return Err((
            format!("{at}.targets"),
            "every weight is 0: no target can be chosen".into(),
        ));
    }
    Ok(BuiltRule { targets, total })
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::SmallRng};

    use super::*;

    fn rules(yaml: &str) -> Result<ModelRewriteRules, Invalid> {
        let decls: Vec<ModelRewriteDecl> = serde_yaml_ng::from_str(yaml).unwrap();
        ModelRewriteRules::build(&decls)
    }

    #[test]
    fn weights_are_respected() {
        let r = rules(
            "- rules:\n  - matches: [{model: {value: chat}}]\n    targets:\n    - {modelRewrite: a, weight: 90}\n    - {modelRewrite: b, weight: 10}\n    - {modelRewrite: never, weight: 0}\n",
        )
        .unwrap();
        let mut rng = SmallRng::seed_from_u64(42);
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for _ in 0..20_000 {
            *counts
                .entry(r.choose("chat", &mut rng).unwrap())
                .or_default() += 1;
        }
        let a = f64::from(counts["a"]) / 20_000.0;
        assert!((0.88..0.92).contains(&a), "{counts:?}");
        assert!(!counts.contains_key("never"), "{counts:?}");
        assert_eq!(r.choose("other", &mut rng), None, "no catch-all");
    }

    #[test]
    fn exact_matches_win_over_the_catch_all() {
        let r = rules(
            "- rules:\n  - targets: [{modelRewrite: base}]\n- name: alias\n  rules:\n  - matches: [{model: {type: Exact, value: small}}]\n    targets: [{modelRewrite: small-v1}]\n",
        )
        .unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(r.choose("small", &mut rng), Some("small-v1"));
        assert_eq!(r.choose("anything", &mut rng), Some("base"));
    }

    #[test]
    fn invalid_rules_name_the_field() {
        let cases = [
            (
                "- rules:\n  - targets: [{modelRewrite: a, weight: 1}, {modelRewrite: b}]\n",
                "modelRewrites[0].rules[0].targets",
                "every target",
            ),
            (
                "- rules:\n  - matches: [{model: {type: Prefix, value: x}}]\n    targets: [{modelRewrite: a}]\n",
                "modelRewrites[0].rules[0].matches[0].model.type",
                "Prefix",
            ),
            (
                "- rules:\n  - targets: [{modelRewrite: a}]\n  - targets: [{modelRewrite: b}]\n",
                "modelRewrites[0].rules[1].matches",
                "second catch-all",
            ),
            (
                "- rules:\n  - matches: [{model: {value: x}}]\n    targets: [{modelRewrite: a}]\n- rules:\n  - matches: [{model: {value: x}}]\n    targets: [{modelRewrite: b}]\n",
                "modelRewrites[1].rules[0].matches[0].model.value",
                "earlier rule",
            ),
            (
                "- rules:\n  - targets: [{modelRewrite: a, weight: 0}]\n",
                "modelRewrites[0].rules[0].targets",
                "every weight is 0",
            ),
            ("- rules: []\n", "modelRewrites[0].rules", "at least one"),
        ];
        for (yaml, field, why) in cases {
            let (f, m) = rules(yaml).unwrap_err();
            assert_eq!(f, field, "{yaml}");
            assert!(m.contains(why), "{m} for {yaml}");
        }
    }

    #[test]
    fn objectives_are_unique() {
        let decls: Vec<ObjectiveDecl> =
            serde_yaml_ng::from_str("- {name: a, priority: -1}\n- {name: b}\n").unwrap();
        let o = build_objectives(&decls).unwrap();
        assert_eq!((o["a"], o["b"]), (-1, 0));
        let decls: Vec<ObjectiveDecl> =
            serde_yaml_ng::from_str("- {name: a}\n- {name: a, priority: 2}\n").unwrap();
        assert_eq!(
            build_objectives(&decls).unwrap_err().0,
            "objectives[1].name"
        );
    }
}
