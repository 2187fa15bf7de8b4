//! `always-disagg-multimodal-decider`: encode runs on its own server for
//! every request with media in its messages.
//!
//! ```text
//! disaggregate ⇔ media parts (image_url, video_url, input_audio, …) > 0
//! ```

use std::sync::Arc;

use epp_core::{BuildError, CycleContext, Decider, Endpoint, Plugin};

use crate::{Builtin, NoParams};

/// `always-disagg-multimodal-decider`.
#[derive(Debug, Clone)]
pub struct AlwaysDisaggMultimodalDecider {
    name: String,
}

impl Builtin for AlwaysDisaggMultimodalDecider {
    const TYPE: &'static str = "always-disagg-multimodal-decider";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self { name: name.into() })
    }
}

impl Plugin for AlwaysDisaggMultimodalDecider {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_decider(&self) -> Option<&dyn Decider> {
        Some(self)
    }
}

impl Decider for AlwaysDisaggMultimodalDecider {
    fn disaggregate(&self, cx: &CycleContext<'_>, _decode: Option<&Arc<Endpoint>>) -> bool {
        cx.request.media_parts > 0
    }
}

#[cfg(test)]
mod tests {
    use epp_core::InferenceRequest;

    use super::*;
    use crate::testing::with_cx;

    #[test]
    fn media_only() {
        let d = AlwaysDisaggMultimodalDecider::build("d", NoParams {}).unwrap();
        let text = InferenceRequest::builder("m").prompt("hi").build();
        assert!(!with_cx(&text, 1, |cx| d.disaggregate(cx, None)));
        let image = InferenceRequest::builder("m").media_parts(1).build();
        assert!(with_cx(&image, 1, |cx| d.disaggregate(cx, None)));
    }
}
