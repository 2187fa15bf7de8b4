//! `mm-embeddings-cache-scorer` (llm-d's): prefer endpoints whose encoder
//! cache holds the request's images, audio or video.
//!
//! ```text
//! score(e) = matched items(e) / items(request)     (each item counts 1, as in llm-d)
//! no items (a text-only request, or no producer ran): 0 everywhere
//! ```
//!
//! The matches come from `mm-embeddings-cache-producer`; without one
//! declared, every score is 0.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::{Builtin, NoParams};

/// `mm-embeddings-cache-scorer`: see the module docs.
#[derive(Debug, Clone)]
pub struct MmEmbeddingsCacheScorer {
    name: String,
}

impl Builtin for MmEmbeddingsCacheScorer {
    const TYPE: &'static str = "mm-embeddings-cache-scorer";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self { name: name.into() })
    }
}

impl Plugin for MmEmbeddingsCacheScorer {
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

impl Scorer for MmEmbeddingsCacheScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let mm = &cx.state.multimodal;
        if mm.items.is_empty() {
            out.fill(0.0);
            return;
        }
        let total = mm.items.len() as f64;
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = f64::from(mm.matched(c.id())) / total;
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn the_share_of_items_the_endpoint_holds() {
        let s = MmEmbeddingsCacheScorer::build("s", NoParams {}).unwrap();
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let req = InferenceRequest::builder("m").build();
        let (with_items, without) = with_cx(&req, 0, |cx| {
            let mut out = vec![9.0; 3];
            s.score(cx, &c, &mut out);
            let without = out.clone();
            cx.state.multimodal.items = vec![1, 2, 3, 4];
            cx.state.multimodal.set_matched(c[0].id(), 4);
            cx.state.multimodal.set_matched(c[2].id(), 1);
            s.score(cx, &c, &mut out);
            (out, without)
        });
        assert_eq!(with_items, vec![1.0, 0.0, 0.25]);
        assert_eq!(without, vec![0.0; 3], "no media: no preference");
    }
}
