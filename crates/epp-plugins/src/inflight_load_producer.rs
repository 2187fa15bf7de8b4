//! `inflight-load-producer`: how long a dispatched request's tokens count
//! in its endpoint's in-flight load, as llm-d's plugin of that name does.
//!
//! epp keeps every endpoint's in-flight counts itself (requests, prompt
//! tokens, and of those the ones the endpoint's prefix cache was not
//! expected to hold); `token-load-scorer`, `active-request-scorer`,
//! `concurrency-detector`, `utilization-filter` and the latency plugins read
//! them, whatever they name in `inFlightLoadProducerName`. Declaring this
//! plugin changes how the tokens are counted, to llm-d's rules
//! ([`InflightAccounting`]):
//!
//! - a streamed response's prompt tokens leave the counts when its first
//!   body bytes arrive (the prefill is done); without the plugin they count
//!   until the response ends;
//! - with `addEstimatedOutputTokens`, each request also counts
//!   `min(round(prompt tokens × outputRatio), its max_tokens when stated,
//!   maxEstimatedOutputTokens when set)` output tokens, as uncached (the
//!   endpoint computes them), until its response ends.
//!
//! The request itself counts from dispatch to the end either way. The
//! prefix discount is the profile's prefix matches, from whichever prefix
//! producer runs (`prefixMatchInfoProducerName` is accepted for llm-d
//! configs). With several declared, the first in the config counts.

use epp_core::{BuildError, InflightAccounting, OutputEstimate, Plugin};

use crate::{Builtin, invalid};

/// Parameters of `inflight-load-producer` (llm-d's names).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InflightLoadParams {
    /// Count an estimate of each request's output tokens too. Default false.
    #[serde(default)]
    pub add_estimated_output_tokens: bool,
    /// Output tokens estimated per prompt token (≥ 0). Default 1.5, llm-d's.
    #[serde(default)]
    pub output_ratio: Option<f64>,
    /// A cap on each estimate (≥ 0). Default none.
    #[serde(default)]
    pub max_estimated_output_tokens: Option<i64>,
    /// Accepted for llm-d configs: the prefix discount is the profile's
    /// prefix matches, from whichever prefix producer runs.
    #[serde(default)]
    pub prefix_match_info_producer_name: Option<String>,
    /// Whether the counts are shared with the other epp replicas. Default
    /// true; `false` is refused: epp shares them through the configured
    /// cross-replica syncer or not at all (leave the syncer out to keep them
    /// local).
    #[serde(default)]
    pub sync_cross_replica_state: Option<bool>,
}

/// llm-d's default `outputRatio`.
pub const DEFAULT_OUTPUT_RATIO: f64 = 1.5;

/// `inflight-load-producer`: see the module docs.
#[derive(Debug, Clone)]
pub struct InflightLoadProducer {
    name: String,
    accounting: InflightAccounting,
}

impl Builtin for InflightLoadProducer {
    const TYPE: &'static str = "inflight-load-producer";
    type Params = InflightLoadParams;

    /// # Errors
    /// A negative or non-finite `outputRatio`, a negative
    /// `maxEstimatedOutputTokens`, or `syncCrossReplicaState: false`.
    fn build(name: impl Into<String>, params: InflightLoadParams) -> Result<Self, BuildError> {
        let ratio = params.output_ratio.unwrap_or(DEFAULT_OUTPUT_RATIO);
        if !(ratio.is_finite() && ratio >= 0.0) {
            return Err(invalid(
                Self::TYPE,
                "outputRatio",
                ratio,
                "must be a finite number ≥ 0",
            ));
        }
        let max =
            match params.max_estimated_output_tokens {
                Some(m) => Some(u64::try_from(m).map_err(|_| {
                    invalid(Self::TYPE, "maxEstimatedOutputTokens", m, "must be ≥ 0")
                })?),
                None => None,
            };
        if params.sync_cross_replica_state == Some(false) {
            return Err(invalid(
                Self::TYPE,
                "syncCrossReplicaState",
                false,
                "epp shares in-flight load through the configured cross-replica syncer or not at \
                 all: leave the syncer out to keep it local",
            ));
        }
        Ok(Self {
            name: name.into(),
            accounting: InflightAccounting {
                release_prompt_at_first_token: true,
                output: params
                    .add_estimated_output_tokens
                    .then_some(OutputEstimate { ratio, max }),
            },
        })
    }
}

impl Plugin for InflightLoadProducer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn inflight_accounting(&self) -> Option<InflightAccounting> {
        Some(self.accounting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(yaml: &str) -> Result<InflightLoadProducer, BuildError> {
        let params: InflightLoadParams = serde_yaml_ng::from_str(yaml).unwrap();
        InflightLoadProducer::build("p", params)
    }

    #[test]
    fn by_default_the_prompt_leaves_at_the_first_token_and_no_output_counts() {
        let p = build("{}").unwrap();
        assert_eq!(
            p.inflight_accounting(),
            Some(InflightAccounting {
                release_prompt_at_first_token: true,
                output: None
            })
        );
    }

    #[test]
    fn an_output_estimate_takes_llm_ds_ratio_unless_given_one() {
        let p = build("addEstimatedOutputTokens: true").unwrap();
        let out = p.inflight_accounting().unwrap().output.unwrap();
        assert_eq!((out.ratio, out.max), (1.5, None));
        let p = build(
            "{addEstimatedOutputTokens: true, outputRatio: 0.25, maxEstimatedOutputTokens: 512, \
             prefixMatchInfoProducerName: precise, syncCrossReplicaState: true}",
        )
        .unwrap();
        let out = p.inflight_accounting().unwrap().output.unwrap();
        assert_eq!((out.ratio, out.max), (0.25, Some(512)));
        assert_eq!(out.tokens(4_000, None), 512);
        // Set but not asked for: no estimate.
        let p = build("outputRatio: 3").unwrap();
        assert_eq!(p.inflight_accounting().unwrap().output, None);
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        for (yaml, field) in [
            ("outputRatio: -1", "outputRatio"),
            ("outputRatio: .inf", "outputRatio"),
            ("maxEstimatedOutputTokens: -5", "maxEstimatedOutputTokens"),
            ("syncCrossReplicaState: false", "syncCrossReplicaState"),
        ] {
            let e = build(yaml).unwrap_err().to_string();
            assert!(e.contains(field), "{yaml}: {e}");
        }
        assert!(serde_yaml_ng::from_str::<InflightLoadParams>("outputRatios: 1").is_err());
    }
}
