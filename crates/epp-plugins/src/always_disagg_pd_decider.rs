//! `always-disagg-pd-decider`: prefill always runs on its own server.
//!
//! ```text
//! disaggregate = true
//! ```

use std::sync::Arc;

use epp_core::{BuildError, CycleContext, Decider, Endpoint, Plugin};

use crate::{Builtin, NoParams};

/// `always-disagg-pd-decider`.
#[derive(Debug, Clone)]
pub struct AlwaysDisaggPdDecider {
    name: String,
}

impl Builtin for AlwaysDisaggPdDecider {
    const TYPE: &'static str = "always-disagg-pd-decider";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self { name: name.into() })
    }
}

impl Plugin for AlwaysDisaggPdDecider {
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

impl Decider for AlwaysDisaggPdDecider {
    fn disaggregate(&self, _cx: &CycleContext<'_>, _decode: Option<&Arc<Endpoint>>) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use epp_core::InferenceRequest;

    use super::*;
    use crate::testing::with_cx;

    #[test]
    fn always() {
        let d = AlwaysDisaggPdDecider::build("d", NoParams {}).unwrap();
        let req = InferenceRequest::builder("m").build();
        assert!(with_cx(&req, 1, |cx| d.disaggregate(cx, None)));
    }
}
