//! `concurrency-detector`: saturation from the requests (or prompt tokens)
//! this picker has in flight per endpoint, with llm-d's parameters and
//! formulas.

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin, SaturationDetector};

use crate::{Builtin, invalid};

/// What the detector counts (`concurrencyMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConcurrencyMode {
    /// In-flight requests against `maxConcurrency` (the default).
    #[default]
    Requests,
    /// In-flight uncached prompt tokens against `maxTokenConcurrency`.
    Tokens,
    /// Per endpoint the larger of the request and token ratios.
    Hybrid,
}

/// Parameters (llm-d's names and defaults).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConcurrencyDetectorParams {
    /// In-flight requests at which an endpoint is full. Default 100.
    #[serde(default = "default_max")]
    pub max_concurrency: u32,
    /// In-flight uncached prompt tokens at which an endpoint is full
    /// (`tokens` and `hybrid` modes). Default 1,000,000.
    #[serde(default = "default_max_tokens")]
    pub max_token_concurrency: u64,
    /// Burst allowed above the limits when filtering, as a fraction
    /// (0.2 = 20 %). Saturation still uses the limits themselves. Default 0.
    #[serde(default)]
    pub headroom: f64,
    /// `requests` (default), `tokens` or `hybrid`.
    #[serde(default)]
    pub concurrency_mode: ConcurrencyMode,
    /// llm-d's in-flight load producer to read; this picker counts every
    /// endpoint's in-flight requests and tokens itself, so the name is
    /// accepted for llm-d's configs and changes nothing.
    #[serde(default)]
    pub in_flight_load_producer_name: Option<String>,
}

fn default_max() -> u32 {
    100
}
fn default_max_tokens() -> u64 {
    1_000_000
}

impl Default for ConcurrencyDetectorParams {
    fn default() -> Self {
        Self {
            max_concurrency: default_max(),
            max_token_concurrency: default_max_tokens(),
            headroom: 0.0,
            concurrency_mode: ConcurrencyMode::Requests,
            in_flight_load_producer_name: None,
        }
    }
}

/// `concurrency-detector`.
///
/// Saturation (as llm-d computes it): `requests` mode Σ in-flight requests /
/// (endpoints × `maxConcurrency`); `tokens` mode Σ in-flight tokens /
/// (endpoints × `maxTokenConcurrency`); `hybrid` the mean over endpoints of
/// max(request ratio, token ratio). As a filter it keeps the endpoints below
/// `limit × (1 + headroom)` (truncated to an integer) in the counted
/// dimension(s) — in `hybrid` both must be below — and, as in llm-d, may
/// leave none (the request then gets 503).
#[derive(Debug, Clone)]
pub struct ConcurrencyDetector {
    name: String,
    params: ConcurrencyDetectorParams,
    /// Filter limits: `max × (1 + headroom)`, truncated.
    request_limit: u64,
    token_limit: u64,
}

impl Builtin for ConcurrencyDetector {
    const TYPE: &'static str = "concurrency-detector";
    type Params = ConcurrencyDetectorParams;

    /// # Errors
    /// A zero limit or a negative (or non-finite) headroom.
    fn build(name: impl Into<String>, p: ConcurrencyDetectorParams) -> Result<Self, BuildError> {
        if p.max_concurrency == 0 {
            return Err(invalid(
                Self::TYPE,
                "maxConcurrency",
                0,
                "must be at least 1",
            ));
        }
        if p.max_token_concurrency == 0 {
            return Err(invalid(
                Self::TYPE,
                "maxTokenConcurrency",
                0,
                "must be at least 1",
            ));
        }
        if !(p.headroom.is_finite() && p.headroom >= 0.0) {
            return Err(invalid(Self::TYPE, "headroom", p.headroom, "must be >= 0"));
        }
        let burst = |max: f64| {
            let limit = max * (1.0 + p.headroom);
            // Truncation as in llm-d; saturating at u64::MAX.
            if limit >= u64::MAX as f64 {
                u64::MAX
            } else {
                limit as u64
            }
        };
        Ok(Self {
            name: name.into(),
            request_limit: burst(f64::from(p.max_concurrency)),
            token_limit: burst(p.max_token_concurrency as f64),
            params: p,
        })
    }
}

impl ConcurrencyDetector {
    fn request_ratio(&self, c: &Candidate) -> f64 {
        f64::from(c.endpoint.inflight().requests()) / f64::from(self.params.max_concurrency)
    }

    fn token_ratio(&self, c: &Candidate) -> f64 {
        c.endpoint.inflight().uncached_tokens() as f64 / self.params.max_token_concurrency as f64
    }
}

impl Plugin for ConcurrencyDetector {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_saturation_detector(&self) -> Option<&dyn SaturationDetector> {
        Some(self)
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}

impl SaturationDetector for ConcurrencyDetector {
    fn saturation(&self, _cx: &CycleContext<'_>, endpoints: &[Candidate]) -> f64 {
        if endpoints.is_empty() {
            return 1.0;
        }
        // Every endpoint has the same capacity, so Σ in-flight / Σ capacity
        // is the mean of the per-endpoint ratios.
        let sum: f64 = match self.params.concurrency_mode {
            ConcurrencyMode::Requests => endpoints.iter().map(|c| self.request_ratio(c)).sum(),
            ConcurrencyMode::Tokens => endpoints.iter().map(|c| self.token_ratio(c)).sum(),
            ConcurrencyMode::Hybrid => endpoints
                .iter()
                .map(|c| self.request_ratio(c).max(self.token_ratio(c)))
                .sum(),
        };
        sum / endpoints.len() as f64
    }

    fn has_capacity(&self, _cx: &CycleContext<'_>, c: &Candidate) -> bool {
        let requests_ok = || u64::from(c.endpoint.inflight().requests()) < self.request_limit;
        let tokens_ok = || c.endpoint.inflight().uncached_tokens() < self.token_limit;
        match self.params.concurrency_mode {
            ConcurrencyMode::Requests => requests_ok(),
            ConcurrencyMode::Tokens => tokens_ok(),
            ConcurrencyMode::Hybrid => requests_ok() && tokens_ok(),
        }
    }
}

impl Filter for ConcurrencyDetector {
    /// Unlike `utilization-detector`, llm-d's concurrency filter does not fall
    /// back to every endpoint when all are at their limit: it is a hard cap.
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        candidates.retain(|c| self.has_capacity(cx, c));
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn detector(p: ConcurrencyDetectorParams) -> ConcurrencyDetector {
        ConcurrencyDetector::build("c", p).unwrap()
    }

    /// Endpoint `i` with `load[i]` = (requests, tokens) in flight.
    fn loaded(load: &[(u32, u64)]) -> Vec<Candidate> {
        let c = candidates(vec![EndpointMetrics::default(); load.len()]);
        for (c, &(requests, tokens)) in c.iter().zip(load) {
            for _ in 0..requests {
                c.endpoint.inflight().start(0);
            }
            c.endpoint.inflight().start(tokens);
            c.endpoint.inflight().finish(0);
        }
        c
    }

    fn kept(d: &ConcurrencyDetector, c: &[Candidate]) -> Vec<u32> {
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            let mut kept = c.to_vec();
            d.filter(cx, &mut kept);
            kept.iter().map(|c| c.id().0).collect()
        })
    }

    fn saturation(d: &ConcurrencyDetector, c: &[Candidate]) -> f64 {
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| d.saturation(cx, c))
    }

    #[test]
    fn requests_mode() {
        let d = detector(ConcurrencyDetectorParams {
            max_concurrency: 2,
            ..Default::default()
        });
        let c = loaded(&[(2, 0), (1, 0)]);
        assert!((saturation(&d, &c) - 0.75).abs() < 1e-12);
        assert_eq!(kept(&d, &c), vec![1]);
    }

    #[test]
    fn headroom_relaxes_the_filter_but_not_saturation() {
        // llm-d: maxConcurrency 10, headroom 0.25 → filter limit int(12.5) = 12.
        let d = detector(ConcurrencyDetectorParams {
            max_concurrency: 10,
            headroom: 0.25,
            ..Default::default()
        });
        let c = loaded(&[(11, 0), (12, 0)]);
        assert!((saturation(&d, &c) - 1.15).abs() < 1e-12, "23 / 20");
        assert_eq!(kept(&d, &c), vec![0], "11 < 12 passes, 12 does not");
    }

    #[test]
    fn a_full_pool_is_filtered_out_entirely() {
        let d = detector(ConcurrencyDetectorParams {
            max_concurrency: 1,
            ..Default::default()
        });
        let c = loaded(&[(1, 0), (3, 0)]);
        assert!(kept(&d, &c).is_empty(), "llm-d's filter is a hard cap");
    }

    #[test]
    fn tokens_mode_counts_prompt_tokens() {
        let d = detector(ConcurrencyDetectorParams {
            max_token_concurrency: 1000,
            concurrency_mode: ConcurrencyMode::Tokens,
            ..Default::default()
        });
        let c = loaded(&[(50, 900), (0, 1000), (1, 100)]);
        assert!((saturation(&d, &c) - 2000.0 / 3000.0).abs() < 1e-12);
        assert_eq!(kept(&d, &c), vec![0, 2], "request counts do not matter");
    }

    #[test]
    fn hybrid_mode_takes_the_tighter_dimension_per_endpoint() {
        let d = detector(ConcurrencyDetectorParams {
            max_concurrency: 10,
            max_token_concurrency: 1000,
            concurrency_mode: ConcurrencyMode::Hybrid,
            ..Default::default()
        });
        // ratios: (0.9, 0.1) → 0.9; (0.1, 0.5) → 0.5; (0.2, 1.0) → 1.0.
        let c = loaded(&[(9, 100), (1, 500), (2, 1000)]);
        assert!((saturation(&d, &c) - 2.4 / 3.0).abs() < 1e-12);
        assert_eq!(kept(&d, &c), vec![0, 1], "endpoint 2 is at its token limit");
    }

    #[test]
    fn parameters_load_with_llm_d_names_and_are_checked() {
        let p: ConcurrencyDetectorParams = serde_yaml_ng::from_str(
            "{maxConcurrency: 8, maxTokenConcurrency: 4096, headroom: 0.2, concurrencyMode: hybrid}",
        )
        .unwrap();
        assert_eq!(p.concurrency_mode, ConcurrencyMode::Hybrid);
        assert_eq!(p.max_token_concurrency, 4096);
        let bad: Result<ConcurrencyDetectorParams, _> =
            serde_yaml_ng::from_str("{concurrencyMode: bytes}");
        assert!(bad.is_err());
        let negative = ConcurrencyDetectorParams {
            headroom: -0.1,
            ..Default::default()
        };
        let err = ConcurrencyDetector::build("c", negative).unwrap_err();
        assert!(err.to_string().contains("headroom"), "{err}");
    }
}
