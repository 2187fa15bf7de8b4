//! `prefix-cache-scorer`: prefer endpoints that likely hold the request's
//! prompt prefix in their KV cache.
//!
//! Score (llm-d): `w · min(1, matched × blockSizeTokens / scale)² + (1 − w) ·
//! matched / total`, with `w = matchLengthWeight` (default 0, i.e. the
//! fraction of the request's blocks matched CONTIGUOUSLY from the start) and
//! `scale = matchLengthScaleTokens` (default 8192), read from
//! `CycleState::prefix`. The matches come from the producer named by
//! `prefixMatchInfoProducerName` (default `approx-prefix-cache-producer`).
//! As in the reference picker, the scorer also accepts the approximate
//! index's parameters and keeps an index of its own, used when no plugin of
//! that default name is declared, so the reference's default config works
//! unchanged.

use std::sync::Arc;

use epp_core::{
    BuildError, Candidate, CycleContext, DEFAULT_PREFIX_PRODUCER, DataProducer, DeferredWork,
    Endpoint, MetricSink, Plugin, PluginMetrics, PreRequest, SchedulingResult, Scorer,
    replicas::{ReplicaFeed, SharesPicks},
};

use crate::{
    ApproxPrefixCacheProducer, Builtin, PrefixCacheParams, PrefixIndex, RecordMode, invalid,
};

/// Parameters of `prefix-cache-scorer`: llm-d's scoring parameters and the
/// reference's index parameters (see [`PrefixCacheParams`]). The default is
/// what an empty `parameters:` gives.
#[derive(Debug, Clone)]
pub struct PrefixCacheScorerParams {
    /// Parameters of the scorer's own index.
    pub index: PrefixCacheParams,
    /// Whether any index parameter was given.
    pub index_params_given: bool,
    /// Producer whose matches are read (`None` = the default producer).
    pub prefix_match_info_producer_name: Option<String>,
    /// Weight of the absolute matched length, in [0, 1]. Default 0.
    pub match_length_weight: f64,
    /// Matched tokens at which the length term is 1. Default 8192.
    pub match_length_scale_tokens: i64,
}

impl Default for PrefixCacheScorerParams {
    fn default() -> Self {
        Self {
            index: PrefixCacheParams::default(),
            index_params_given: false,
            prefix_match_info_producer_name: None,
            match_length_weight: 0.0,
            match_length_scale_tokens: DEFAULT_SCALE_TOKENS,
        }
    }
}

/// `matchLengthScaleTokens` when not given.
const DEFAULT_SCALE_TOKENS: i64 = 8192;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawScorerParams {
    prefix_match_info_producer_name: Option<String>,
    match_length_weight: Option<f64>,
    match_length_scale_tokens: Option<i64>,
    block_size_tokens: Option<usize>,
    block_size: Option<usize>,
    max_prefix_blocks_to_match: Option<usize>,
    max_prefix_tokens_to_match: Option<usize>,
    lru_capacity_per_server: Option<usize>,
    auto_tune: Option<bool>,
    #[serde(alias = "recordInBackground")]
    record_mode: Option<RecordMode>,
}

impl<'de> serde::Deserialize<'de> for PrefixCacheScorerParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RawScorerParams::deserialize(d)?;
        let mut index = PrefixCacheParams::default();
        let mut given = false;
        let mut set = |slot: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *slot = v;
                given = true;
            }
        };
        set(&mut index.block_size_tokens, r.block_size_tokens);
        set(&mut index.block_size, r.block_size);
        set(
            &mut index.max_prefix_blocks_to_match,
            r.max_prefix_blocks_to_match,
        );
        set(
            &mut index.max_prefix_tokens_to_match,
            r.max_prefix_tokens_to_match,
        );
        set(
            &mut index.lru_capacity_per_server,
            r.lru_capacity_per_server,
        );
        if let Some(a) = r.auto_tune {
            index.auto_tune = a;
            given = true;
        }
        if let Some(m) = r.record_mode {
            index.record_mode = m;
            given = true;
        }
        Ok(Self {
            index,
            index_params_given: given,
            prefix_match_info_producer_name: r.prefix_match_info_producer_name,
            match_length_weight: r.match_length_weight.unwrap_or(0.0),
            match_length_scale_tokens: r.match_length_scale_tokens.unwrap_or(DEFAULT_SCALE_TOKENS),
        })
    }
}

/// `prefix-cache-scorer`.
#[derive(Debug)]
pub struct PrefixCacheScorer {
    name: String,
    /// Used when this scorer is the prefix-match producer.
    own: ApproxPrefixCacheProducer,
    source: Option<String>,
    length_weight: f64,
    length_scale: f64,
}

impl Builtin for PrefixCacheScorer {
    const TYPE: &'static str = "prefix-cache-scorer";
    type Params = PrefixCacheScorerParams;

    /// # Errors
    /// `matchLengthWeight` outside [0, 1]; `matchLengthScaleTokens` ≤ 0 with a
    /// positive weight; index parameters given together with
    /// `prefixMatchInfoProducerName` (they would have no effect); or a bad
    /// index parameter.
    fn build(name: impl Into<String>, p: PrefixCacheScorerParams) -> Result<Self, BuildError> {
        let name = name.into();
        let w = p.match_length_weight;
        if !(0.0..=1.0).contains(&w) {
            return Err(invalid(
                Self::TYPE,
                "matchLengthWeight",
                w,
                "must be in [0, 1]",
            ));
        }
        if w > 0.0 && p.match_length_scale_tokens <= 0 {
            return Err(invalid(
                Self::TYPE,
                "matchLengthScaleTokens",
                p.match_length_scale_tokens,
                "must be > 0 when matchLengthWeight > 0",
            ));
        }
        if let Some(producer) = &p.prefix_match_info_producer_name
            && p.index_params_given
        {
            return Err(invalid(
                Self::TYPE,
                "prefixMatchInfoProducerName",
                producer,
                "the scorer reads that producer's matches, so its own index parameters \
                 (blockSizeTokens, lruCapacityPerServer, ...) would have no effect: set \
                 them on the producer",
            ));
        }
        let index = p.index.validated(Self::TYPE)?;
        Ok(Self {
            own: ApproxPrefixCacheProducer::with_valid(name.clone(), index),
            name,
            source: p.prefix_match_info_producer_name.filter(|n| !n.is_empty()),
            length_weight: w,
            length_scale: p.match_length_scale_tokens as f64,
        })
    }
}

impl PrefixCacheScorer {
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
    fn prefix_match_source(&self) -> Option<&str> {
        Some(self.source.as_deref().unwrap_or(DEFAULT_PREFIX_PRODUCER))
    }
    fn as_plugin_metrics(&self) -> Option<&dyn PluginMetrics> {
        self.uses_own_index().then_some(self as &dyn PluginMetrics)
    }
    fn as_shares_picks(&self) -> Option<&dyn SharesPicks> {
        self.uses_own_index().then_some(self as &dyn SharesPicks)
    }
    fn as_deferred_work(&self) -> Option<&dyn DeferredWork> {
        self.uses_own_index()
            .then(|| self.own.as_deferred_work())
            .flatten()
    }
}

impl PrefixCacheScorer {
    /// Its own index is used only when it reads no other producer's.
    fn uses_own_index(&self) -> bool {
        self.source.as_deref().is_none_or(|s| s == self.name)
    }
}

impl SharesPicks for PrefixCacheScorer {
    fn share_picks(&self, feed: Arc<dyn ReplicaFeed>) {
        self.own.share_picks(feed);
    }
    fn peer_picked(&self, endpoint: &Arc<Endpoint>, keys: &[u64]) {
        self.own.peer_picked(endpoint, keys);
    }
}

impl PluginMetrics for PrefixCacheScorer {
    fn report(&self, out: &mut dyn MetricSink) {
        self.own.report_size(&self.name, out);
    }
}

impl DataProducer for PrefixCacheScorer {
    fn produce(&self, cx: &mut CycleContext<'_>, _candidates: &[Candidate]) {
        // Reading another producer's matches: never fill them from the own
        // index (a request that producer could not match stays unmatched).
        if self.source.as_deref().is_some_and(|s| s != self.name) {
            return;
        }
        self.own.produce_once(cx);
    }
    fn produces_prefix_matches(&self) -> bool {
        true
    }
}

impl Scorer for PrefixCacheScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let prefix = &cx.state.prefix;
        let w = self.length_weight;
        let block = f64::from(prefix.block_size_tokens);
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            let ratio = prefix.ratio(c.id());
            *s = if w > 0.0 && block > 0.0 && prefix.total_blocks() > 0 {
                let length =
                    (f64::from(prefix.matched(c.id())) * block / self.length_scale).min(1.0);
                w * length * length + (1.0 - w) * ratio
            } else {
                (1.0 - w) * ratio
            };
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
