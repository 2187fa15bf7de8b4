//! `prefix-cache-scorer`: prefer endpoints that likely hold the request's
//! prompt prefix in their KV cache.
//!
//! Score = blocks matched contiguously from the start / blocks of the request,
//! read from `CycleState::prefix`. As in the reference, the scorer takes the
//! approximate index's parameters and keeps an index of its own, so the
//! reference's default config works unchanged; when an
//! `approx-prefix-cache-producer` is declared too, the scheduler runs it
//! first and the scorer only reads its matches (its own index stays empty).

use epp_core::{
    Candidate, CycleContext, DataProducer, Plugin, PreRequest, SchedulingResult, Scorer,
};

use crate::{ApproxPrefixCacheProducer, PrefixCacheParams, PrefixIndex};

/// `prefix-cache-scorer`.
#[derive(Debug)]
pub struct PrefixCacheScorer {
    name: String,
    /// Used when no other producer filled the cycle's prefix state.
    own: ApproxPrefixCacheProducer,
}

impl PrefixCacheScorer {
    /// YAML type.
    pub const TYPE: &'static str = "prefix-cache-scorer";

    /// A scorer named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>, params: PrefixCacheParams) -> Self {
        let name = name.into();
        Self {
            own: ApproxPrefixCacheProducer::new(name.clone(), params),
            name,
        }
    }

    /// The scorer's own index (for inspection and tests).
    #[must_use]
    pub fn index(&self) -> &PrefixIndex {
        self.own.index()
    }
}

impl Plugin for PrefixCacheScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn as_data_producer(&self) -> Option<&dyn DataProducer> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
}

impl DataProducer for PrefixCacheScorer {
    fn produce(&self, cx: &mut CycleContext<'_>, _candidates: &[Candidate]) {
        self.own.produce_once(cx);
    }
}

impl Scorer for PrefixCacheScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let prefix = &cx.state.prefix;
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = prefix.ratio(c.id());
        }
    }
}

impl PreRequest for PrefixCacheScorer {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        self.own.record_pick(cx, result);
    }
}

#[cfg(test)]
mod tests;
