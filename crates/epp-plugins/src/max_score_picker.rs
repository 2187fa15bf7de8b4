//! `max-score-picker`: the highest total wins; ties are broken at random.

use epp_core::{BuildError, Candidate, CycleContext, Picker};
use rand::Rng;

/// Parameters shared by the pickers.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PickerParams {
    /// Endpoints returned: the target plus `n − 1` fallbacks. Default 1;
    /// as in llm-d, 0 or less in a config means the default.
    #[serde(default = "one", deserialize_with = "at_least_one")]
    pub max_num_of_endpoints: usize,
}

fn one() -> usize {
    1
}

fn at_least_one<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = <i64 as serde::Deserialize>::deserialize(d)?;
    Ok(usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1))
}

impl Default for PickerParams {
    fn default() -> Self {
        Self {
            max_num_of_endpoints: 1,
        }
    }
}

impl PickerParams {
    /// Checks ranges; `plugin` names the plugin in errors.
    pub(crate) fn validated(self, plugin: &str) -> Result<Self, BuildError> {
        if self.max_num_of_endpoints == 0 {
            return Err(BuildError::InvalidValue {
                plugin: plugin.to_owned(),
                field: "maxNumOfEndpoints".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(self)
    }
}

/// The parts every picker shares: a `name`, [`PickerParams`] (field
/// `params`) and a `build` that validates them, under YAML type `$type`. Each
/// picker's file defines the struct and its `pick`.
macro_rules! picker_plugin {
    ($picker:ident, $type:literal) => {
        impl $crate::Builtin for $picker {
            const TYPE: &'static str = $type;
            type Params = $crate::PickerParams;

            /// # Errors
            /// `maxNumOfEndpoints` below 1.
            fn build(
                name: impl Into<String>,
                params: $crate::PickerParams,
            ) -> Result<Self, epp_core::BuildError> {
                Ok(Self {
                    name: name.into(),
                    params: params.validated(<Self as $crate::Builtin>::TYPE)?,
                })
            }
        }

        impl epp_core::Plugin for $picker {
            fn type_name(&self) -> &str {
                <Self as $crate::Builtin>::TYPE
            }
            fn name(&self) -> &str {
                &self.name
            }
            fn as_picker(&self) -> Option<&dyn epp_core::Picker> {
                Some(self)
            }
        }
    };
}
pub(crate) use picker_plugin;

/// `max-score-picker`.
#[derive(Debug, Clone)]
pub struct MaxScorePicker {
    name: String,
    params: PickerParams,
}

picker_plugin!(MaxScorePicker, "max-score-picker");

impl Picker for MaxScorePicker {
    fn pick(
        &self,
        cx: &mut CycleContext<'_>,
        candidates: &[Candidate],
        scores: &[f64],
        out: &mut Vec<usize>,
    ) {
        let n = candidates.len().min(scores.len());
        if n == 0 {
            return;
        }
        if self.params.max_num_of_endpoints == 1 {
            // One pass; among equal maxima each is chosen with equal chance.
            let (mut best, mut ties) = (0, 0u32);
            for i in 0..n {
                if i == 0 || scores[i] > scores[best] {
                    best = i;
                    ties = 1;
                } else if scores[i] == scores[best] {
                    ties += 1;
                    if cx.rng.random_range(0..ties) == 0 {
                        best = i;
                    }
                }
            }
            out.push(best);
            return;
        }
        // Shuffle first so the (unstable) sort leaves ties in random order.
        out.extend(0..n);
        for i in (1..n).rev() {
            out.swap(i, cx.rng.random_range(0..=i));
        }
        out.sort_unstable_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        out.truncate(self.params.max_num_of_endpoints);
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::{
        Builtin,
        testing::{candidates, with_cx},
    };

    #[test]
    fn zero_or_negative_max_num_of_endpoints_means_one_as_in_llm_d() {
        for text in ["{maxNumOfEndpoints: 0}", "{maxNumOfEndpoints: -3}", "{}"] {
            let p: PickerParams = serde_yaml_ng::from_str(text).unwrap();
            assert_eq!(p.max_num_of_endpoints, 1, "{text}");
        }
        let p: PickerParams = serde_yaml_ng::from_str("{maxNumOfEndpoints: 4}").unwrap();
        assert_eq!(p.max_num_of_endpoints, 4);
    }

    fn pick(p: &MaxScorePicker, scores: &[f64], seed: u64) -> Vec<usize> {
        let c = candidates(vec![EndpointMetrics::default(); scores.len()]);
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, seed, |cx| {
            let mut out = Vec::new();
            p.pick(cx, &c, scores, &mut out);
            out
        })
    }

    #[test]
    fn highest_wins_and_fallbacks_follow_in_order() {
        let one = MaxScorePicker::build("p", PickerParams::default()).unwrap();
        assert_eq!(pick(&one, &[0.1, 0.9, 0.5], 0), vec![1]);
        let three = MaxScorePicker::build(
            "p",
            PickerParams {
                max_num_of_endpoints: 3,
            },
        )
        .unwrap();
        assert_eq!(pick(&three, &[0.1, 0.9, 0.5, 0.7], 0), vec![1, 3, 2]);
    }

    #[test]
    fn ties_are_broken_randomly() {
        let one = MaxScorePicker::build("p", PickerParams::default()).unwrap();
        let mut seen = [0; 3];
        for seed in 0..300 {
            seen[pick(&one, &[1.0, 0.2, 1.0], seed)[0]] += 1;
        }
        assert_eq!(seen[1], 0);
        assert!(seen[0] > 100 && seen[2] > 100, "{seen:?}");
        let two = MaxScorePicker::build(
            "p",
            PickerParams {
                max_num_of_endpoints: 2,
            },
        )
        .unwrap();
        let mut first = [0; 3];
        for seed in 0..300 {
            let p = pick(&two, &[0.5, 0.5, 0.5], seed);
            assert_eq!(p.len(), 2);
            assert_ne!(p[0], p[1]);
            first[p[0]] += 1;
        }
        assert!(first.iter().all(|&n| n > 50), "{first:?}");
    }
}
