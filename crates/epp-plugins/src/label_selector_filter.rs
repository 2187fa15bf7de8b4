//! `label-selector-filter`, and `decode-filter` / `prefill-filter` /
//! `encode-filter`, which are the same filter with a fixed selector on the
//! `llm-d.ai/role` label. The role filters test each endpoint's role as
//! resolved when the endpoint was made ([`Endpoint::role`]), one bit test per
//! candidate, instead of looking the label up and comparing strings.
//!
//! [`Endpoint::role`]: epp_core::Endpoint::role

use std::collections::BTreeMap;

pub use epp_core::ROLE_LABEL;
use epp_core::{BuildError, Candidate, CycleContext, EndpointRole, Filter, Plugin};

use crate::Builtin;

/// A Kubernetes-style set-based requirement.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelExpression {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: Operator,
    /// Values for `In` / `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// Operators of [`LabelExpression`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum Operator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// Parameters of `label-selector-filter`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelectorParams {
    /// Labels that must have exactly these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    #[serde(default)]
    pub match_expressions: Vec<LabelExpression>,
}

impl LabelSelectorParams {
    fn matches(&self, c: &Candidate) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| c.endpoint.label(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|e| {
                let v = c.endpoint.label(&e.key);
                match e.operator {
                    Operator::In => v.is_some_and(|v| e.values.iter().any(|x| x == v)),
                    Operator::NotIn => v.is_none_or(|v| !e.values.iter().any(|x| x == v)),
                    Operator::Exists => v.is_some(),
                    Operator::DoesNotExist => v.is_none(),
                }
            })
    }
}

/// `label-selector-filter`: keeps endpoints whose labels satisfy the selector.
#[derive(Debug, Clone)]
pub struct LabelSelectorFilter {
    name: String,
    type_name: &'static str,
    selector: LabelSelectorParams,
    /// The role filters: the [`EndpointRole::bit`]s of the roles kept, in
    /// place of `selector` (which says the same in labels). `None`: a
    /// `label-selector-filter`, which applies `selector`.
    roles: Option<u16>,
}

/// Roles llm-d's `decode-filter` keeps (besides endpoints with no role).
const DECODE_ROLES: [&str; 4] = ["decode", "prefill-decode", "both", "encode-prefill-decode"];
/// Roles llm-d's `prefill-filter` keeps; endpoints with no role are dropped.
const PREFILL_ROLES: [&str; 5] = [
    "prefill",
    "encode-prefill",
    "prefill-decode",
    "both",
    "encode-prefill-decode",
];
/// Roles llm-d's `encode-filter` keeps; endpoints with no role are dropped.
const ENCODE_ROLES: [&str; 3] = ["encode", "encode-prefill", "encode-prefill-decode"];

/// The role bits of `roles` (label values), plus [`EndpointRole::Unlabelled`]
/// when `unlabelled`.
fn role_bits(roles: &[&str], unlabelled: bool) -> u16 {
    let bits = roles
        .iter()
        .fold(0, |acc, r| acc | EndpointRole::from_label(Some(r)).bit());
    if unlabelled {
        bits | EndpointRole::Unlabelled.bit()
    } else {
        bits
    }
}

fn role_in(roles: &[&str]) -> LabelSelectorParams {
    LabelSelectorParams {
        match_labels: BTreeMap::new(),
        match_expressions: vec![LabelExpression {
            key: ROLE_LABEL.into(),
            operator: Operator::In,
            values: roles.iter().map(|r| (*r).to_owned()).collect(),
        }],
    }
}

impl Builtin for LabelSelectorFilter {
    const TYPE: &'static str = "label-selector-filter";
    type Params = LabelSelectorParams;

    /// # Errors
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with values.
    fn build(name: impl Into<String>, selector: LabelSelectorParams) -> Result<Self, BuildError> {
        let name = name.into();
        for (i, e) in selector.match_expressions.iter().enumerate() {
            let needs_values = matches!(e.operator, Operator::In | Operator::NotIn);
            if needs_values == e.values.is_empty() {
                return Err(BuildError::InvalidValue {
                    plugin: name,
                    field: format!("matchExpressions[{i}].values"),
                    value: format!("{:?}", e.values),
                    reason: if needs_values {
                        "In and NotIn need values".into()
                    } else {
                        "Exists and DoesNotExist take no values".into()
                    },
                });
            }
        }
        Ok(Self {
            name,
            type_name: Self::TYPE,
            selector,
            roles: None,
        })
    }
}

impl LabelSelectorFilter {
    /// `decode-filter`: endpoints whose role (label `llm-d.ai/role`) is
    /// `decode`, `prefill-decode`, `both` or `encode-prefill-decode`, or that
    /// have no role, as in llm-d.
    #[must_use]
    pub fn decode(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            type_name: "decode-filter",
            selector: role_in(&DECODE_ROLES),
            roles: Some(role_bits(&DECODE_ROLES, true)),
        }
    }

    /// `prefill-filter`: endpoints whose role is `prefill`, `encode-prefill`,
    /// `prefill-decode`, `both` or `encode-prefill-decode` (no role: dropped).
    #[must_use]
    pub fn prefill(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            type_name: "prefill-filter",
            selector: role_in(&PREFILL_ROLES),
            roles: Some(role_bits(&PREFILL_ROLES, false)),
        }
    }
}

impl LabelSelectorFilter {
    /// `encode-filter`: endpoints whose role is `encode`, `encode-prefill`
    /// or `encode-prefill-decode` (no role: dropped), as in llm-d.
    #[must_use]
    pub fn encode(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            type_name: "encode-filter",
            selector: role_in(&ENCODE_ROLES),
            roles: Some(role_bits(&ENCODE_ROLES, false)),
        }
    }
}

impl Plugin for LabelSelectorFilter {
    fn type_name(&self) -> &str {
        self.type_name
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}

impl LabelSelectorFilter {
    /// Whether `c` passes: one bit for a role filter, else the selector.
    fn keeps(&self, c: &Candidate) -> bool {
        match self.roles {
            Some(bits) => c.endpoint.role().bit() & bits != 0,
            None => self.selector.matches(c),
        }
    }
}

impl Filter for LabelSelectorFilter {
    fn filter(&self, _cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        candidates.retain(|c| self.keeps(c));
    }

    fn filter_from(
        &self,
        _cx: &mut CycleContext<'_>,
        base: &[Candidate],
        out: &mut Vec<Candidate>,
    ) {
        out.extend(base.iter().filter(|c| self.keeps(c)).cloned());
    }
}

#[cfg(test)]
mod tests {
    use epp_core::InferenceRequest;

    use super::*;
    use crate::testing::{labelled, with_cx};

    fn cands(roles: &[Option<&str>]) -> Vec<Candidate> {
        (0u32..)
            .zip(roles)
            .map(|(i, role)| {
                let zone = format!("z{}", i % 2);
                let mut labels = vec![("zone", zone.as_str())];
                labels.extend(role.map(|r| (ROLE_LABEL, r)));
                Candidate::new(&labelled(i, &labels))
            })
            .collect()
    }

    /// What `f` keeps of `c`, checking that filtering a copy in place and
    /// copying what it keeps (`filter_from`, the profile's first filter)
    /// agree.
    fn kept(f: &LabelSelectorFilter, c: &[Candidate]) -> Vec<u32> {
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            let mut in_place = c.to_vec();
            f.filter(cx, &mut in_place);
            let mut copied = Vec::new();
            f.filter_from(cx, c, &mut copied);
            let ids = |v: &[Candidate]| v.iter().map(|c| c.id().0).collect::<Vec<_>>();
            assert_eq!(ids(&copied), ids(&in_place), "{}", f.type_name);
            ids(&in_place)
        })
    }

    /// The role filters keep exactly what their selectors on the label keep
    /// (the decode filter also the unlabelled), whatever the value.
    #[test]
    fn role_bits_agree_with_the_label_selectors() {
        let values = [
            None,
            Some("encode"),
            Some("prefill"),
            Some("decode"),
            Some("encode-prefill"),
            Some("prefill-decode"),
            Some("both"),
            Some("encode-prefill-decode"),
            Some("Decode"),
            Some(" decode"),
            Some(""),
            Some("unknown-role"),
        ];
        let c = cands(&values);
        for (f, unlabelled) in [
            (LabelSelectorFilter::decode("d"), true),
            (LabelSelectorFilter::prefill("p"), false),
            (LabelSelectorFilter::encode("e"), false),
        ] {
            let by_label: Vec<u32> = c
                .iter()
                .filter(|c| {
                    (unlabelled && c.endpoint.label(ROLE_LABEL).is_none()) || f.selector.matches(c)
                })
                .map(|c| c.id().0)
                .collect();
            assert_eq!(kept(&f, &c), by_label, "{}", f.type_name);
        }
    }

    #[test]
    fn roles_and_selectors() {
        let c = cands(&[Some("prefill"), Some("decode"), Some("both"), None]);
        assert_eq!(kept(&LabelSelectorFilter::decode("d"), &c), vec![1, 2, 3]);
        assert_eq!(kept(&LabelSelectorFilter::prefill("p"), &c), vec![0, 2]);
        let e = cands(&[
            Some("encode"),
            Some("encode-prefill"),
            Some("encode-prefill-decode"),
            Some("prefill"),
            Some("both"),
            None,
        ]);
        assert_eq!(kept(&LabelSelectorFilter::encode("e"), &e), vec![0, 1, 2]);
        // llm-d's combined roles: E/P/D workers.
        let epd = cands(&[
            Some("encode"),
            Some("encode-prefill"),
            Some("prefill-decode"),
            Some("encode-prefill-decode"),
            Some("unknown-role"),
        ]);
        assert_eq!(kept(&LabelSelectorFilter::decode("d"), &epd), vec![2, 3]);
        assert_eq!(
            kept(&LabelSelectorFilter::prefill("p"), &epd),
            vec![1, 2, 3]
        );
        let p: LabelSelectorParams = serde_yaml_ng::from_str(
            "matchLabels: {zone: z0}\nmatchExpressions:\n- {key: llm-d.ai/role, operator: Exists}\n",
        )
        .unwrap();
        assert_eq!(
            kept(&LabelSelectorFilter::build("s", p).unwrap(), &c),
            vec![0, 2]
        );
        let bad: LabelSelectorParams =
            serde_yaml_ng::from_str("matchExpressions:\n- {key: a, operator: In}\n").unwrap();
        assert!(LabelSelectorFilter::build("s", bad).is_err());
        assert!(
            serde_yaml_ng::from_str::<LabelSelectorParams>(
                "matchExpressions:\n- {key: a, operator: Near}\n"
            )
            .is_err()
        );
    }
}
