//! `prefix-based-pd-decider`: run prefill on its own server when the part of
//! the prompt the decode pick does not hold is long enough.
//!
//! ```text
//! prompt    = tokens of the prompt (the token producer's, else the
//!             characters / 4 estimate)
//! cached    = blocks of the prompt the decode pick holds × tokens per block
//!             (the cycle's prefix match)
//! disaggregate ⇔ nonCachedTokens > 0
//!              ∧ prompt ≥ promptTokens          (when promptTokens > 0)
//!              ∧ prompt ≥ nonCachedTokens
//!              ∧ prompt − cached ≥ nonCachedTokens
//! ```
//!
//! No prefix match this cycle (no producer ran) or no decode pick: no
//! disaggregation. It reads the prefix matches of the default producer
//! (`approx-prefix-cache-producer`, created when not declared), as llm-d's
//! decider reads that producer's attribute, even when other readers read
//! another producer's.

use std::sync::Arc;

use epp_core::{
    BuildError, CycleContext, DEFAULT_PREFIX_PRODUCER, Decider, Endpoint, Plugin, PrefixSlot,
};

use crate::Builtin;

/// Parameters (llm-d's names).
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixPdParams {
    /// Uncached tokens at or above which prefill runs on its own server;
    /// 0 turns the decider off.
    #[serde(default)]
    pub non_cached_tokens: i64,
    /// Prompts shorter than this never disaggregate; 0: no such gate.
    #[serde(default)]
    pub prompt_tokens: i64,
}

/// `prefix-based-pd-decider`: see the module docs.
#[derive(Debug, Clone)]
pub struct PrefixBasedPdDecider {
    name: String,
    non_cached_tokens: u64,
    prompt_tokens: u64,
    /// The prefix-match set it reads (the default producer's).
    slot: PrefixSlot,
}

impl Builtin for PrefixBasedPdDecider {
    const TYPE: &'static str = "prefix-based-pd-decider";
    type Params = PrefixPdParams;

    fn build(name: impl Into<String>, p: PrefixPdParams) -> Result<Self, BuildError> {
        let name = name.into();
        let non_negative = |field: &str, v: i64| {
            u64::try_from(v).map_err(|_| crate::invalid(&name, field, v, "must be >= 0"))
        };
        Ok(Self {
            non_cached_tokens: non_negative("nonCachedTokens", p.non_cached_tokens)?,
            prompt_tokens: non_negative("promptTokens", p.prompt_tokens)?,
            slot: PrefixSlot::default(),
            name,
        })
    }
}

impl Plugin for PrefixBasedPdDecider {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_decider(&self) -> Option<&dyn Decider> {
        Some(self)
    }
    fn prefix_match_source(&self) -> Option<&str> {
        Some(DEFAULT_PREFIX_PRODUCER)
    }
    fn bind_prefix_slot(&self, slot: usize) -> bool {
        self.slot.set(slot);
        true
    }
}

impl Decider for PrefixBasedPdDecider {
    fn disaggregate(&self, cx: &CycleContext<'_>, decode: Option<&Arc<Endpoint>>) -> bool {
        if self.non_cached_tokens == 0 {
            return false;
        }
        let Some(decode) = decode else {
            return false;
        };
        let tokens = &cx.state.tokens;
        let prompt = if tokens.computed {
            tokens.ids.len() as u64
        } else {
            cx.request.prompt_tokens_estimate()
        };
        if (self.prompt_tokens > 0 && prompt < self.prompt_tokens)
            || prompt < self.non_cached_tokens
        {
            return false;
        }
        let prefix = cx.state.prefix_at(self.slot.get());
        if !prefix.computed {
            tracing::debug!(plugin = %self.name, "no prefix match this cycle: no disaggregation");
            return false;
        }
        let cached = u64::from(prefix.matched(decode.id())) * u64::from(prefix.block_size_tokens);
        prompt.saturating_sub(cached) >= self.non_cached_tokens
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn decider(non_cached: i64, prompt: i64) -> PrefixBasedPdDecider {
        PrefixBasedPdDecider::build(
            "d",
            PrefixPdParams {
                non_cached_tokens: non_cached,
                prompt_tokens: prompt,
            },
        )
        .unwrap()
    }

    /// `prompt_chars` characters (÷4 = tokens), `blocks` blocks of 16 tokens
    /// cached on the decode pick.
    fn decide(d: &PrefixBasedPdDecider, prompt_chars: usize, blocks: Option<u32>) -> bool {
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let req = InferenceRequest::builder("m")
            .prompt("x".repeat(prompt_chars))
            .build();
        with_cx(&req, 1, |cx| {
            if let Some(b) = blocks {
                cx.state.prefix.computed = true;
                cx.state.prefix.block_size_tokens = 16;
                cx.state.prefix.set_matched(c[0].id(), b);
            }
            d.disaggregate(cx, Some(&c[0].endpoint))
        })
    }

    #[test]
    fn formula() {
        let d = decider(16, 0);
        // 100 tokens, none cached: 100 ≥ 16.
        assert!(decide(&d, 400, Some(0)));
        // 100 tokens, 6 blocks (96) cached: 4 < 16.
        assert!(!decide(&d, 400, Some(6)));
        // 100 tokens, 5 blocks (80) cached: 20 ≥ 16.
        assert!(decide(&d, 400, Some(5)));
        // Shorter than nonCachedTokens: never.
        assert!(!decide(&d, 60, Some(0)));
        // No prefix match this cycle: never.
        assert!(!decide(&d, 400, None));
        // No decode pick: never.
        let req = InferenceRequest::builder("m")
            .prompt("x".repeat(400))
            .build();
        assert!(!with_cx(&req, 1, |cx| d.disaggregate(cx, None)));
    }

    #[test]
    fn prompt_tokens_gate_and_off() {
        let d = decider(16, 200);
        assert!(!decide(&d, 400, Some(0)), "100 tokens < promptTokens 200");
        assert!(decide(&d, 800, Some(0)));
        assert!(!decide(&decider(0, 0), 4000, Some(0)), "0 turns it off");
        assert!(
            PrefixBasedPdDecider::build(
                "d",
                PrefixPdParams {
                    non_cached_tokens: -1,
                    prompt_tokens: 0
                }
            )
            .is_err()
        );
    }

    #[test]
    fn tokens_from_a_token_producer_win() {
        let d = decider(16, 0);
        let c = candidates(vec![EndpointMetrics::default(); 1]);
        // 400 characters would be 100 tokens; the producer says 10.
        let req = InferenceRequest::builder("m")
            .prompt("x".repeat(400))
            .build();
        let yes = with_cx(&req, 1, |cx| {
            cx.state.tokens.computed = true;
            cx.state.tokens.ids.extend(0..10);
            cx.state.prefix.computed = true;
            d.disaggregate(cx, Some(&c[0].endpoint))
        });
        assert!(!yes);
    }
}
