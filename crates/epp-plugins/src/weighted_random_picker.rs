//! `weighted-random-picker`: choose in proportion to score.

use epp_core::{Candidate, CycleContext, Picker};
use rand::Rng;

use crate::PickerParams;

/// `weighted-random-picker`: weighted sampling without replacement by the
/// reservoir method (key `u^(1/score)`, largest keys win), so each pick's
/// chance is proportional to its score. When every score is 0 the choice is
/// uniform.
#[derive(Debug, Clone)]
pub struct WeightedRandomPicker {
    name: String,
    params: PickerParams,
}

super::max_score_picker::picker_plugin!(WeightedRandomPicker, "weighted-random-picker");

impl Picker for WeightedRandomPicker {
    fn pick(
        &self,
        cx: &mut CycleContext<'_>,
        candidates: &[Candidate],
        scores: &[f64],
        out: &mut Vec<usize>,
    ) {
        let n = candidates.len().min(scores.len());
        let k = self.params.max_num_of_endpoints.min(n);
        if k == 0 {
            return;
        }
        let all_zero = scores[..n].iter().all(|&s| s <= 0.0);
        // Keys in log space: ln(u) / w; zero weights rank below every positive one.
        let key = |i: usize, u: f64| {
            let w = if all_zero { 1.0 } else { scores[i] };
            if w > 0.0 {
                u.ln() / w
            } else {
                f64::NEG_INFINITY
            }
        };
        // Keep the k best (index, key) pairs in `out` order: insertion into a
        // short sorted prefix, no allocation beyond `out`.
        let mut keys = [0.0f64; 16];
        if k <= keys.len() {
            for i in 0..n {
                let u: f64 = cx.rng.random_range(f64::MIN_POSITIVE..1.0);
                let kv = key(i, u);
                let mut pos = out.len();
                while pos > 0 && keys[pos - 1] < kv {
                    pos -= 1;
                }
                if pos < k {
                    if out.len() < k {
                        out.push(0);
                    }
                    for j in (pos + 1..out.len()).rev() {
                        out[j] = out[j - 1];
                        keys[j] = keys[j - 1];
                    }
                    out[pos] = i;
                    keys[pos] = kv;
                }
            }
        } else {
            let mut all: Vec<(f64, usize)> = (0..n)
                .map(|i| (key(i, cx.rng.random_range(f64::MIN_POSITIVE..1.0)), i))
                .collect();
            all.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
            out.extend(all.into_iter().take(k).map(|(_, i)| i));
        }
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

    fn freq(scores: &[f64], k: usize, rounds: u64) -> Vec<f64> {
        let p = WeightedRandomPicker::build(
            "w",
            PickerParams {
                max_num_of_endpoints: k,
            },
        )
        .unwrap();
        let c = candidates(vec![EndpointMetrics::default(); scores.len()]);
        let req = InferenceRequest::builder("m").build();
        let mut first = vec![0u64; scores.len()];
        with_cx(&req, 42, |cx| {
            for _ in 0..rounds {
                let mut out = Vec::new();
                p.pick(cx, &c, scores, &mut out);
                assert_eq!(out.len(), k.min(scores.len()));
                let mut d = out.clone();
                d.sort_unstable();
                d.dedup();
                assert_eq!(d.len(), out.len(), "distinct");
                first[out[0]] += 1;
            }
        });
        first.iter().map(|&n| n as f64 / rounds as f64).collect()
    }

    #[test]
    fn frequencies_follow_weights() {
        let f = freq(&[1.0, 2.0, 3.0, 4.0], 1, 40_000);
        for (i, want) in [0.1, 0.2, 0.3, 0.4].iter().enumerate() {
            assert!((f[i] - want).abs() < 0.015, "{f:?}");
        }
        let zero = freq(&[0.0, 0.0, 0.0, 0.0], 2, 20_000);
        assert!(zero.iter().all(|&x| (x - 0.25).abs() < 0.02), "{zero:?}");
        let never = freq(&[0.0, 1.0], 1, 2_000);
        assert_eq!(never[0], 0.0);
    }
}
