//! `token-load-scorer`: prefer endpoints with few prompt tokens to compute.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::Builtin;

/// Parameters of `token-load-scorer`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenLoadParams {
    /// Tokens at which an endpoint scores 0. Default 4194304; as in llm-d,
    /// 0 or less means the default.
    #[serde(default = "default_tokens")]
    pub queue_threshold_tokens: i64,
    /// llm-d's in-flight load producer to read; this picker counts every
    /// endpoint's in-flight requests and tokens itself (as a declared
    /// `inflight-load-producer` says), so the name is accepted for llm-d's
    /// configs and changes nothing.
    #[serde(default)]
    pub in_flight_load_producer_name: Option<String>,
}

const DEFAULT_TOKENS: u64 = 4_194_304;

fn default_tokens() -> i64 {
    DEFAULT_TOKENS as i64
}

impl Default for TokenLoadParams {
    fn default() -> Self {
        Self {
            queue_threshold_tokens: default_tokens(),
            in_flight_load_producer_name: None,
        }
    }
}

/// `token-load-scorer` (llm-d's formula): `1 − min(tokens, thr) / thr`
/// where, per endpoint, `tokens` = the uncached prompt tokens of the requests
/// this picker routed there and that have not completed (the part the
/// endpoint's prefix cache was not expected to hold), plus the tokens of this request
/// the endpoint would have to compute: the prompt minus the prefix it holds
/// (from the cycle's prefix matches, when a prefix producer ran; else the
/// whole prompt, estimated at 4 characters per token).
#[derive(Debug, Clone)]
pub struct TokenLoadScorer {
    name: String,
    threshold: u64,
}

impl Builtin for TokenLoadScorer {
    const TYPE: &'static str = "token-load-scorer";
    type Params = TokenLoadParams;

    /// # Errors
    /// None: an unset or non-positive `queueThresholdTokens` means the
    /// default threshold.
    fn build(name: impl Into<String>, p: TokenLoadParams) -> Result<Self, BuildError> {
        let threshold = u64::try_from(p.queue_threshold_tokens)
            .ok()
            .filter(|&t| t > 0)
            .unwrap_or(DEFAULT_TOKENS);
        Ok(Self {
            name: name.into(),
            threshold,
        })
    }
}

impl Plugin for TokenLoadScorer {
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

impl Scorer for TokenLoadScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let input = cx.request.prompt_tokens_estimate();
        let prefix = &cx.state.prefix;
        let block = u64::from(prefix.block_size_tokens);
        let indexed = prefix.total_blocks() as u64 * block;
        let matched_prefix = prefix.computed && block > 0;
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            // llm-d's uncached input: unmatched indexed blocks plus the tail
            // beyond the index's cap.
            let uncached = if matched_prefix {
                let matched = u64::from(prefix.matched(c.id())) * block;
                indexed.saturating_sub(matched) + input.saturating_sub(indexed)
            } else {
                input
            };
            let tokens = c
                .endpoint
                .inflight()
                .uncached_tokens()
                .saturating_add(uncached)
                .min(self.threshold);
            *s = 1.0 - tokens as f64 / self.threshold as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, scores, with_cx};

    #[test]
    fn token_load() {
        let c = candidates(vec![EndpointMetrics::default(); 3]);
        c[1].endpoint.inflight().start(50);
        c[2].endpoint.inflight().start(500);
        let s = TokenLoadScorer::build(
            "t",
            TokenLoadParams {
                queue_threshold_tokens: 100,
                ..TokenLoadParams::default()
            },
        )
        .unwrap();
        assert_eq!(scores(&s, &c), vec![1.0, 0.5, 0.0]);
    }

    #[test]
    fn in_flight_tokens_are_the_uncached_ones() {
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        // 1000 prompt tokens in flight on each; endpoint 1 had 900 cached.
        c[0].endpoint.inflight().start(1000);
        c[1].endpoint.inflight().start_with(1000, 100);
        let s = TokenLoadScorer::build(
            "t",
            TokenLoadParams {
                queue_threshold_tokens: 1000,
                ..TokenLoadParams::default()
            },
        )
        .unwrap();
        assert_eq!(scores(&s, &c), vec![0.0, 0.9]);
    }

    #[test]
    fn zero_threshold_means_the_default_as_in_llm_d() {
        let s = TokenLoadScorer::build(
            "t",
            TokenLoadParams {
                queue_threshold_tokens: 0,
                ..TokenLoadParams::default()
            },
        )
        .unwrap();
        assert_eq!(s.threshold, DEFAULT_TOKENS);
    }

    #[test]
    fn this_requests_uncached_tokens_count() {
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let s = TokenLoadScorer::build(
            "t",
            TokenLoadParams {
                queue_threshold_tokens: 1000,
                ..TokenLoadParams::default()
            },
        )
        .unwrap();
        // 400 characters = 100 tokens.
        let req = InferenceRequest::builder("m")
            .prompt("x".repeat(400))
            .build();
        let without_prefix = with_cx(&req, 0, |cx| {
            let mut out = vec![0.0; 2];
            s.score(cx, &c, &mut out);
            out
        });
        assert_eq!(without_prefix, vec![0.9, 0.9], "the whole prompt");
        let with_prefix = with_cx(&req, 0, |cx| {
            // 4 indexed blocks of 16 tokens (64 tokens) and a 36-token tail;
            // endpoint 0 holds 3 of the blocks.
            cx.state.prefix.computed = true;
            cx.state.prefix.block_size_tokens = 16;
            cx.state.prefix.hashes = vec![1, 2, 3, 4];
            cx.state.prefix.set_matched(c[0].id(), 3);
            let mut out = vec![0.0; 2];
            s.score(cx, &c, &mut out);
            out
        });
        let want0 = 1.0 - (16.0 + 36.0) / 1000.0;
        assert!((with_prefix[0] - want0).abs() < 1e-12, "{with_prefix:?}");
        assert!((with_prefix[1] - 0.9).abs() < 1e-12, "{with_prefix:?}");
    }
}
