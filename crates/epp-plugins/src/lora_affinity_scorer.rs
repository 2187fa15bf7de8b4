//! `lora-affinity-scorer`: prefer endpoints that already serve the request's
//! adapter, then those with room to load it.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::{Builtin, NoParams};

/// `lora-affinity-scorer`: 1.0 when the adapter (the request's target model)
/// is active on the endpoint; 0.8 when the endpoint has room to load another
/// (`|active| + |waiting| < max_lora`); 0.6 when the adapter is already
/// waiting there; otherwise 0. As in llm-d, an endpoint reporting no
/// `max_lora` (0) has no room: it cannot load adapters.
#[derive(Debug, Clone)]
pub struct LoraAffinityScorer {
    name: String,
}

impl Builtin for LoraAffinityScorer {
    const TYPE: &'static str = "lora-affinity-scorer";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self { name: name.into() })
    }
}

impl Plugin for LoraAffinityScorer {
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

impl Scorer for LoraAffinityScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let adapter = cx.request.target_model.as_str();
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let lora = &c.metrics.lora;
            let loaded = lora.active.len() + lora.waiting.len();
            *s = if lora.is_active(adapter) {
                1.0
            } else if loaded < lora.max_loras as usize {
                0.8
            } else if lora.is_waiting(adapter) {
                0.6
            } else {
                0.0
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest, LoraInfo};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn formula() {
        let m = |active: &[&str], waiting: &[&str], max| EndpointMetrics {
            lora: LoraInfo {
                active: active.iter().map(|s| (*s).to_owned()).collect(),
                waiting: waiting.iter().map(|s| (*s).to_owned()).collect(),
                max_loras: max,
                base_model: None,
            },
            ..Default::default()
        };
        let c = candidates(vec![
            m(&["sql"], &[], 2),
            m(&["a"], &[], 2),
            m(&["a", "b"], &["sql"], 2),
            m(&["a", "b"], &[], 2),
            m(&[], &[], 0),
        ]);
        let req = InferenceRequest::builder("base")
            .target_model("sql")
            .build();
        let s = with_cx(&req, 0, |cx| {
            let mut out = vec![0.0; c.len()];
            LoraAffinityScorer::build("l", NoParams {})
                .unwrap()
                .score(cx, &c, &mut out);
            out
        });
        // The last endpoint reports no LoRA limit: llm-d gives it no room (0).
        assert_eq!(s, vec![1.0, 0.8, 0.6, 0.0, 0.0]);
    }
}
