//! What several benches share: the cycle workload of `cycle.rs`'s
//! `cycle/64ep/16KiB`, built and warmed.

use std::sync::Arc;

use epp_plugins::{
    Builtin, PrefixCacheScorer, PrefixCacheScorerParams, RecordMode, builtin_registry,
};
use epp_test_support::workload::{Profile, Workload};

/// 64 endpoints, 16 KiB prompts, scheduled by `profile` with a prefix
/// scorer recording in `mode`; 10,000 requests already routed and their
/// records applied.
pub(crate) fn warmed_workload(profile: Profile, mode: RecordMode) -> Workload<PrefixCacheScorer> {
    let mut params = PrefixCacheScorerParams::default();
    params.index.record_mode = mode;
    let prefix = PrefixCacheScorer::build(PrefixCacheScorer::TYPE, params).expect("valid");
    let mut w = Workload::with_profile(64, 16, &builtin_registry(), Arc::new(prefix), profile);
    w.warm(10_000);
    w.prefix.index().flush();
    w
}
