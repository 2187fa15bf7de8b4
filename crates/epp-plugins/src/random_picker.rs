//! `random-picker`: uniform choice, ignoring scores.

use epp_core::{Candidate, CycleContext, Picker};
use rand::Rng;

use crate::PickerParams;

/// `random-picker`.
#[derive(Debug, Clone)]
pub struct RandomPicker {
    name: String,
    params: PickerParams,
}

super::max_score_picker::picker_plugin!(RandomPicker, "random-picker");

impl Picker for RandomPicker {
    fn pick(
        &self,
        cx: &mut CycleContext<'_>,
        candidates: &[Candidate],
        _scores: &[f64],
        out: &mut Vec<usize>,
    ) {
        let n = candidates.len();
        let k = self.params.max_num_of_endpoints.min(n);
        out.extend(0..n);
        // Partial Fisher-Yates: the first k are a uniform sample in random order.
        for i in 0..k {
            out.swap(i, cx.rng.random_range(i..n));
        }
        out.truncate(k);
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
    fn uniform_and_distinct() {
        let p = RandomPicker::build(
            "r",
            PickerParams {
                max_num_of_endpoints: 2,
            },
        )
        .unwrap();
        let c = candidates(vec![EndpointMetrics::default(); 4]);
        let req = InferenceRequest::builder("m").build();
        let mut first = [0; 4];
        for seed in 0..400 {
            let out = with_cx(&req, seed, |cx| {
                let mut out = Vec::new();
                p.pick(cx, &c, &[9.0, 0.0, 0.0, 0.0], &mut out);
                out
            });
            assert_eq!(out.len(), 2);
            assert_ne!(out[0], out[1]);
            first[out[0]] += 1;
        }
        assert!(first.iter().all(|&n| n > 60), "{first:?}");
    }
}
