//! `probabilistic-admitter`: shed sheddable requests with a probability that
//! rises steeply with the pool's saturation (llm-d's admitter of that name).
//!
//! ```text
//! priority ≥ 0 or no candidate      → admit
//! saturation s = mean over candidates of max(waiting / queueDepthThreshold,
//!                                            kv_usage / kvCacheUtilThreshold)
//!                (an endpoint never scraped counts 1, as llm-d counts one
//!                 without metrics)
//! p = min(s^power · k, 1)           → refuse (429) with probability p
//! ```
//!
//! With the defaults (`power` 5, `k` 300) nothing is shed below s ≈ 0.08,
//! 2.3 % at 0.15, 73 % at 0.3 and everything from (1/k)^(1/power) ≈ 0.34.
//! The draw uses the cycle's seedable RNG.

use epp_core::{Admitter, BuildError, Candidate, CycleContext, Plugin};
use rand::Rng;

use crate::{Builtin, invalid};

/// Parameters of `probabilistic-admitter` (llm-d's names and defaults).
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProbabilisticAdmitterParams {
    /// Waiting requests at which an endpoint counts as full. Default 5; > 0.
    #[serde(default = "default_queue")]
    pub queue_depth_threshold: i64,
    /// KV-cache use (0..1) at which an endpoint counts as full. Default 0.8;
    /// > 0.
    #[serde(default = "default_kv")]
    pub kv_cache_util_threshold: f64,
    /// Steepness of the curve. Default 5; > 0.
    #[serde(default = "default_power")]
    pub power: f64,
    /// Scale: everything is shed from saturation (1/k)^(1/power). Default
    /// 300; > 0.
    #[serde(default = "default_k")]
    pub k: f64,
}

fn default_queue() -> i64 {
    5
}
fn default_kv() -> f64 {
    0.8
}
fn default_power() -> f64 {
    5.0
}
fn default_k() -> f64 {
    300.0
}

impl Default for ProbabilisticAdmitterParams {
    fn default() -> Self {
        Self {
            queue_depth_threshold: default_queue(),
            kv_cache_util_threshold: default_kv(),
            power: default_power(),
            k: default_k(),
        }
    }
}

/// `probabilistic-admitter`: see the module docs.
#[derive(Debug, Clone)]
pub struct ProbabilisticAdmitter {
    name: String,
    queue: f64,
    kv: f64,
    power: f64,
    k: f64,
}

impl Builtin for ProbabilisticAdmitter {
    const TYPE: &'static str = "probabilistic-admitter";
    type Params = ProbabilisticAdmitterParams;

    /// # Errors
    /// A threshold, `power` or `k` that is not positive (llm-d refuses them too).
    fn build(name: impl Into<String>, p: ProbabilisticAdmitterParams) -> Result<Self, BuildError> {
        let positive = |field: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(v)
            } else {
                Err(invalid(Self::TYPE, field, v, "must be > 0"))
            }
        };
        if p.queue_depth_threshold <= 0 {
            return Err(invalid(
                Self::TYPE,
                "queueDepthThreshold",
                p.queue_depth_threshold,
                "must be > 0",
            ));
        }
        Ok(Self {
            name: name.into(),
            queue: p.queue_depth_threshold as f64,
            kv: positive("kvCacheUtilThreshold", p.kv_cache_util_threshold)?,
            power: positive("power", p.power)?,
            k: positive("k", p.k)?,
        })
    }
}

impl ProbabilisticAdmitter {
    /// The pool's saturation over `candidates` (see the module docs).
    #[must_use]
    pub fn saturation(&self, candidates: &[Candidate]) -> f64 {
        if candidates.is_empty() {
            return 0.0;
        }
        let total: f64 = candidates
            .iter()
            .map(|c| {
                if c.metrics.updated_at.is_none() {
                    return 1.0;
                }
                (f64::from(c.metrics.waiting) / self.queue).max(c.metrics.kv_usage / self.kv)
            })
            .sum();
        total / candidates.len() as f64
    }

    /// The probability of refusing a sheddable request at `saturation`.
    #[must_use]
    pub fn shed_probability(&self, saturation: f64) -> f64 {
        (saturation.powf(self.power) * self.k).min(1.0)
    }
}

impl Plugin for ProbabilisticAdmitter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_admitter(&self) -> Option<&dyn Admitter> {
        Some(self)
    }
}

impl Admitter for ProbabilisticAdmitter {
    fn admit(&self, cx: &mut CycleContext<'_>, candidates: &[Candidate]) -> Result<(), String> {
        if !cx.request.is_sheddable() || candidates.is_empty() {
            return Ok(());
        }
        let s = self.saturation(candidates);
        let p = self.shed_probability(s);
        if cx.rng.random::<f64>() < p {
            Err(format!(
                "probabilistic-admitter: shed at pool saturation {s:.3} (probability {p:.2})"
            ))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    fn admitter() -> ProbabilisticAdmitter {
        ProbabilisticAdmitter::build("a", ProbabilisticAdmitterParams::default()).unwrap()
    }

    fn loaded(waiting: u32, kv: f64) -> EndpointMetrics {
        EndpointMetrics {
            waiting,
            kv_usage: kv,
            ..EndpointMetrics::fresh()
        }
    }

    /// Share of `n` sheddable requests refused over `c`.
    fn shed_share(a: &ProbabilisticAdmitter, c: &[Candidate], priority: i32, n: u32) -> f64 {
        let req = InferenceRequest::builder("m").priority(priority).build();
        with_cx(&req, 7, |cx| {
            let refused = (0..n).filter(|_| a.admit(cx, c).is_err()).count();
            refused as f64 / f64::from(n)
        })
    }

    #[test]
    fn saturation_is_the_mean_of_each_endpoints_worse_ratio() {
        let a = admitter();
        // max(1/5, 0.4/0.8) = 0.5; max(4/5, 0.0) = 0.8; never scraped = 1.
        let mut c = candidates(vec![loaded(1, 0.4), loaded(4, 0.0), loaded(0, 0.0)]);
        c[2].endpoint.set_metrics(EndpointMetrics::default());
        c[2] = Candidate::new(&c[2].endpoint);
        assert!((a.saturation(&c) - (0.5 + 0.8 + 1.0) / 3.0).abs() < 1e-12);
    }

    #[test]
    fn the_curve_is_llm_ds() {
        let a = admitter();
        assert!((a.shed_probability(0.15) - 0.15f64.powi(5) * 300.0).abs() < 1e-12);
        assert!((a.shed_probability(0.15) - 0.0228).abs() < 1e-3, "≈ 2.3 %");
        assert!((a.shed_probability(0.3) - 0.729).abs() < 1e-3, "≈ 73 %");
        assert!((a.shed_probability(0.35) - 1.0).abs() < f64::EPSILON);
        assert!(a.shed_probability(0.0) < f64::EPSILON);
    }

    #[test]
    fn sheddable_requests_are_shed_at_the_curves_rate() {
        let a = admitter();
        // Saturation 0.3 everywhere: 1.5 waiting of 5 is not an integer, so
        // use KV: 0.24 / 0.8 = 0.3.
        let c = candidates(vec![loaded(0, 0.24); 4]);
        let share = shed_share(&a, &c, -1, 4000);
        assert!((share - 0.729).abs() < 0.03, "shed {share}");
        // Idle pool: nothing shed.
        let idle = candidates(vec![loaded(0, 0.0); 4]);
        assert!(shed_share(&a, &idle, -1, 1000) < f64::EPSILON);
        // Overloaded: everything.
        let full = candidates(vec![loaded(5, 0.8); 4]);
        assert!((shed_share(&a, &full, -1, 100) - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn critical_and_standard_requests_are_always_admitted() {
        let a = admitter();
        let full = candidates(vec![loaded(50, 1.0); 3]);
        assert!(shed_share(&a, &full, 0, 200) < f64::EPSILON);
        assert!(shed_share(&a, &full, 2, 200) < f64::EPSILON);
        assert!(
            shed_share(&a, &[], -1, 10) < f64::EPSILON,
            "no candidate: admit"
        );
    }

    #[test]
    fn parameters_must_be_positive() {
        for bad in [
            "{queueDepthThreshold: 0}",
            "{kvCacheUtilThreshold: 0}",
            "{power: -1}",
            "{k: 0}",
        ] {
            let p: ProbabilisticAdmitterParams = serde_yaml_ng::from_str(bad).unwrap();
            assert!(ProbabilisticAdmitter::build("a", p).is_err(), "{bad}");
        }
        let p: ProbabilisticAdmitterParams = serde_yaml_ng::from_str(
            "{queueDepthThreshold: 10, kvCacheUtilThreshold: 0.9, power: 3, k: 100}",
        )
        .unwrap();
        let a = ProbabilisticAdmitter::build("a", p).unwrap();
        assert!((a.shed_probability(0.2) - 0.8).abs() < 1e-12);
    }
}
