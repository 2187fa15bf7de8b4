//! `no-hit-lru-scorer`: spread requests nobody has cached over the pool.

use std::collections::VecDeque;

use epp_core::{
    BuildError, Candidate, CycleContext, EndpointId, Plugin, PreRequest, SchedulingResult, Scorer,
};
use parking_lot::Mutex;

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

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

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
