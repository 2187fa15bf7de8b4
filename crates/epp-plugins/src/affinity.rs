//! Affinity plugins: `session-affinity-scorer`, `no-hit-lru-scorer`,
//! `prefix-cache-affinity-filter`.

use std::collections::VecDeque;

use epp_core::{
    BuildError, Candidate, CycleContext, EndpointId, Filter, Plugin, PreRequest, SchedulingResult,
    Scorer,
};
use parking_lot::Mutex;
use rand::Rng;

/// Header a client echoes to stay on its endpoint.
pub const SESSION_HEADER: &str = "x-session-token";

/// The session token for an endpoint address: base64 of `ip:port`.
#[must_use]
pub fn session_token(addr: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = addr.as_bytes();
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `session-affinity-scorer`: the endpoint named by the request's
/// `x-session-token` header (base64 of its `ip:port`) scores 1, others 0.
#[derive(Debug, Clone)]
pub struct SessionAffinityScorer {
    name: String,
}

impl SessionAffinityScorer {
    /// YAML type.
    pub const TYPE: &'static str = "session-affinity-scorer";

    /// A scorer named `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Plugin for SessionAffinityScorer {
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

impl Scorer for SessionAffinityScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let Some(token) = cx.request.header(SESSION_HEADER) else {
            return;
        };
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            if session_token(c.endpoint.addr_str()) == token {
                *s = 1.0;
            }
        }
    }
}

/// Parameters of `no-hit-lru-scorer`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NoHitLruParams {
    /// Endpoints remembered. Default 1024.
    #[serde(default = "default_lru")]
    pub lru_size: usize,
}

fn default_lru() -> usize {
    1024
}

impl Default for NoHitLruParams {
    fn default() -> Self {
        Self {
            lru_size: default_lru(),
        }
    }
}

/// `no-hit-lru-scorer`: for a request no endpoint has a cached prefix for
/// (a "cold" request), prefer the endpoints that received a cold request
/// least recently, spreading new prefixes over the pool. Never-used endpoints
/// score 1, the most recently used 0, linear by rank in between. Requests
/// with a prefix hit score 0.5 everywhere (neutral). Needs a prefix producer
/// (`prefix-cache-scorer`) in the same config.
#[derive(Debug)]
pub struct NoHitLruScorer {
    name: String,
    size: usize,
    /// Most recent cold picks, newest at the back.
    recent: Mutex<VecDeque<EndpointId>>,
}

impl NoHitLruScorer {
    /// YAML type.
    pub const TYPE: &'static str = "no-hit-lru-scorer";

    /// A scorer named `name`.
    ///
    /// # Errors
    /// A zero size.
    pub fn new(name: impl Into<String>, p: NoHitLruParams) -> Result<Self, BuildError> {
        if p.lru_size == 0 {
            return Err(BuildError::InvalidValue {
                plugin: Self::TYPE.into(),
                field: "lruSize".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(Self {
            name: name.into(),
            size: p.lru_size,
            recent: Mutex::new(VecDeque::new()),
        })
    }

    fn cold(cx: &CycleContext<'_>) -> bool {
        cx.state.prefix.computed && !cx.state.prefix.any_hit()
    }
}

impl Plugin for NoHitLruScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
    fn as_pre_request(&self) -> Option<&dyn PreRequest> {
        Some(self)
    }
}

impl Scorer for NoHitLruScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        if !Self::cold(cx) {
            out.fill(0.5);
            return;
        }
        let recent = self.recent.lock();
        // Recency rank: position from the back (0 = most recent); never used = len.
        let rank = |id: EndpointId| {
            recent
                .iter()
                .rev()
                .position(|&e| e == id)
                .unwrap_or(recent.len())
        };
        let max = candidates.iter().map(|c| rank(c.id())).max().unwrap_or(0);
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            *s = if max == 0 {
                1.0
            } else {
                rank(c.id()) as f64 / max as f64
            };
        }
    }
}

impl PreRequest for NoHitLruScorer {
    fn pre_request(&self, cx: &CycleContext<'_>, result: &SchedulingResult) {
        if !Self::cold(cx) {
            return;
        }
        let Some(target) = result.primary() else {
            return;
        };
        let mut recent = self.recent.lock();
        recent.retain(|&e| e != target.id());
        recent.push_back(target.id());
        while recent.len() > self.size {
            recent.pop_front();
        }
    }
}

/// Parameters of `prefix-cache-affinity-filter`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixAffinityParams {
    /// Matched fraction of the prompt that makes an endpoint "affine". Default 0.8.
    #[serde(default = "default_affinity")]
    pub affinity_threshold: f64,
    /// Chance of ignoring affinity, to keep exploring. Default 0.01.
    #[serde(default = "default_exploration")]
    pub exploration_probability: f64,
}

fn default_affinity() -> f64 {
    0.8
}
fn default_exploration() -> f64 {
    0.01
}

impl Default for PrefixAffinityParams {
    fn default() -> Self {
        Self {
            affinity_threshold: default_affinity(),
            exploration_probability: default_exploration(),
        }
    }
}

/// `prefix-cache-affinity-filter`: when some candidates hold at least
/// `affinityThreshold` of the prompt, keep only those (except with
/// probability `explorationProbability`). Needs a prefix producer.
#[derive(Debug, Clone)]
pub struct PrefixCacheAffinityFilter {
    name: String,
    params: PrefixAffinityParams,
}

impl PrefixCacheAffinityFilter {
    /// YAML type.
    pub const TYPE: &'static str = "prefix-cache-affinity-filter";

    /// A filter named `name`.
    ///
    /// # Errors
    /// Threshold outside (0, 1] or probability outside [0, 1].
    pub fn new(name: impl Into<String>, params: PrefixAffinityParams) -> Result<Self, BuildError> {
        let bad = |field: &str, v: f64, reason: &str| BuildError::InvalidValue {
            plugin: Self::TYPE.into(),
            field: field.into(),
            value: v.to_string(),
            reason: reason.into(),
        };
        if !(params.affinity_threshold > 0.0 && params.affinity_threshold <= 1.0) {
            return Err(bad(
                "affinityThreshold",
                params.affinity_threshold,
                "must be in (0, 1]",
            ));
        }
        if !(0.0..=1.0).contains(&params.exploration_probability) {
            return Err(bad(
                "explorationProbability",
                params.exploration_probability,
                "must be in [0, 1]",
            ));
        }
        Ok(Self {
            name: name.into(),
            params,
        })
    }
}

impl Plugin for PrefixCacheAffinityFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}

impl Filter for PrefixCacheAffinityFilter {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        let t = self.params.affinity_threshold;
        let prefix = &cx.state.prefix;
        if !candidates.iter().any(|c| prefix.ratio(c.id()) >= t) {
            return;
        }
        if cx.rng.random::<f64>() < self.params.exploration_probability {
            return;
        }
        let prefix = &cx.state.prefix;
        candidates.retain(|c| prefix.ratio(c.id()) >= t);
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn base64_tokens() {
        assert_eq!(session_token("10.0.0.1:8000"), "MTAuMC4wLjE6ODAwMA==");
        assert_eq!(session_token("abc"), "YWJj");
        assert_eq!(session_token("ab"), "YWI=");
    }

    #[test]
    fn session_header_picks_its_endpoint() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let req = InferenceRequest::builder("m")
            .header(SESSION_HEADER, session_token("10.0.0.1:8001"))
            .build();
        let s = with_cx(&req, 0, |cx| {
            let mut out = vec![0.0; 3];
            SessionAffinityScorer::new("s").score(cx, &c, &mut out);
            out
        });
        assert_eq!(s, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn affinity_filter_keeps_affine_endpoints() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let f = PrefixCacheAffinityFilter::new(
            "f",
            PrefixAffinityParams {
                affinity_threshold: 0.5,
                exploration_probability: 0.0,
            },
        )
        .unwrap();
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            cx.state.prefix.hashes = vec![1, 2, 3, 4];
            cx.state.prefix.computed = true;
            cx.state.prefix.set_matched(c[1].id(), 3);
            cx.state.prefix.set_matched(c[2].id(), 1);
            let mut kept = c.clone();
            f.filter(cx, &mut kept);
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0].id(), c[1].id());
        });
    }

    #[test]
    fn cold_requests_go_to_least_recently_used() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        let s = NoHitLruScorer::new("n", NoHitLruParams::default()).unwrap();
        let req = InferenceRequest::builder("m").build();
        s.recent.lock().extend([c[0].id(), c[2].id()]);
        let out = with_cx(&req, 0, |cx| {
            cx.state.prefix.computed = true;
            cx.state.prefix.hashes = vec![9];
            let mut out = vec![0.0; 3];
            s.score(cx, &c, &mut out);
            out
        });
        assert_eq!(out, vec![0.5, 1.0, 0.0], "c1 never used, c2 most recent");
    }
}
