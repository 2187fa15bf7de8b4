//! `queue-scorer`, `running-requests-size-scorer` and
//! `kv-cache-utilization-scorer`: one scorer, [`LoadSignalScorer`], reading
//! one of three load signals ([`Signal`]).
//!
//! Each signal adds what this picker dispatched since an endpoint's last
//! scrape to the scraped value. Scraped metrics lag by up to one refresh
//! interval (50 ms by default). The reference picker scores on them as they
//! are, so every request arriving between two scrapes sees the same "least
//! loaded" endpoint and they all go there (herding). Here the queue, running
//! and KV signals are the scraped value plus the picker's own in-flight
//! change since the scrape ([`Candidate::since_scrape`]): dispatched minus
//! completed requests, and the prompt tokens of theirs the endpoint's prefix
//! cache was not expected to hold, as a share of its KV capacity when the
//! server reports its cache geometry. `countDispatched: false` gives the
//! reference's values.

use epp_core::{Candidate, CycleContext, Plugin, Scorer};

/// The load signal a [`LoadSignalScorer`] reads; it fixes the YAML type and
/// the formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `queue-scorer`: `(max − q) / (max − min)` of the waiting queue `q`
    /// ([`LoadSignalParams::waiting`]) across the candidates; 1 for all when
    /// all are equal.
    Waiting,
    /// `running-requests-size-scorer`: `(max − r) / (max − min)` of the
    /// running requests `r` ([`LoadSignalParams::running`]) across the
    /// candidates; 1 for all when all are equal.
    Running,
    /// `kv-cache-utilization-scorer`: `1 − u`, `u` the KV usage
    /// ([`LoadSignalParams::kv_usage`]) clamped to [0, 1]; an unreadable
    /// (NaN) usage scores 0, as if full.
    KvUsage,
}

impl Signal {
    /// Every signal, in the order their types are registered.
    pub const ALL: [Self; 3] = [Self::Waiting, Self::Running, Self::KvUsage];

    /// The YAML type of the scorer reading this signal.
    #[must_use]
    pub const fn type_name(self) -> &'static str {
        match self {
            Self::Waiting => "queue-scorer",
            Self::Running => "running-requests-size-scorer",
            Self::KvUsage => "kv-cache-utilization-scorer",
        }
    }
}

/// Parameters of a [`LoadSignalScorer`], whichever its signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadSignalParams {
    /// Add the requests this picker dispatched to an endpoint since its last
    /// scrape (net of those that completed) to the scraped signal. Default
    /// `true`; `false` scores on the scraped values alone, as the reference
    /// does.
    #[serde(default = "yes")]
    pub count_dispatched: bool,
}

fn yes() -> bool {
    true
}

impl Default for LoadSignalParams {
    fn default() -> Self {
        Self {
            count_dispatched: true,
        }
    }
}

/// `scraped + delta`, floored at 0 and capped at `u32::MAX`.
fn plus(scraped: u32, delta: i64) -> u32 {
    u32::try_from((i64::from(scraped) + delta).max(0)).unwrap_or(u32::MAX)
}

impl LoadSignalParams {
    /// Waiting requests: scraped queue plus the net dispatched since. The
    /// server may start some of them at once rather than queue them; counting
    /// them as queued errs towards spreading a burst.
    pub fn waiting(self, c: &Candidate) -> u32 {
        if self.count_dispatched {
            plus(c.metrics.waiting, c.since_scrape().requests)
        } else {
            c.metrics.waiting
        }
    }

    /// Running requests: scraped count plus the net dispatched since.
    pub fn running(self, c: &Candidate) -> u32 {
        if self.count_dispatched {
            plus(c.metrics.running, c.since_scrape().requests)
        } else {
            c.metrics.running
        }
    }

    /// KV usage: scraped fraction plus the uncached prompt tokens dispatched
    /// since (those the picked endpoint's prefix match did not cover) over
    /// the cache's capacity in tokens, when the server reports its geometry
    /// (otherwise the scraped value). Not clamped; NaN stays NaN.
    pub fn kv_usage(self, c: &Candidate) -> f64 {
        let scraped = c.metrics.kv_usage;
        let capacity = c.metrics.cache.map_or(0.0, |g| {
            f64::from(g.block_size_tokens) * g.num_blocks as f64
        });
        if !self.count_dispatched || capacity <= 0.0 {
            return scraped;
        }
        scraped + c.since_scrape().uncached_tokens as f64 / capacity
    }
}

/// Scores candidates on one load signal; see [`Signal`] for each formula.
#[derive(Debug, Clone)]
pub struct LoadSignalScorer {
    name: String,
    signal: Signal,
    params: LoadSignalParams,
}

impl LoadSignalScorer {
    /// A scorer named `name` reading `signal`.
    #[must_use]
    pub fn new(name: impl Into<String>, signal: Signal, params: LoadSignalParams) -> Self {
        Self {
            name: name.into(),
            signal,
            params,
        }
    }

    /// The signal it reads.
    #[must_use]
    pub fn signal(&self) -> Signal {
        self.signal
    }
}

impl Plugin for LoadSignalScorer {
    fn type_name(&self) -> &str {
        self.signal.type_name()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}

impl Scorer for LoadSignalScorer {
    fn score(&self, _cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let p = self.params;
        match self.signal {
            Signal::Waiting => min_max_low_is_good(candidates, out, |c| p.waiting(c)),
            Signal::Running => min_max_low_is_good(candidates, out, |c| p.running(c)),
            Signal::KvUsage => {
                for (c, s) in candidates.iter().zip(out.iter_mut()) {
                    let kv = p.kv_usage(c);
                    // An unreadable usage counts as full rather than poisoning the total.
                    *s = if kv.is_nan() {
                        0.0
                    } else {
                        1.0 - kv.clamp(0.0, 1.0)
                    };
                }
            }
        }
    }
}

/// Writes `(max − v) / (max − min)` per candidate; 1 for all when all equal.
fn min_max_low_is_good(
    candidates: &[Candidate],
    out: &mut [f64],
    value: impl Fn(&Candidate) -> u32,
) {
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    for c in candidates {
        let v = value(c);
        lo = lo.min(v);
        hi = hi.max(v);
    }
    for (c, s) in candidates.iter().zip(out.iter_mut()) {
        *s = if hi == lo {
            1.0
        } else {
            f64::from(hi - value(c)) / f64::from(hi - lo)
        };
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{CacheGeometry, EndpointMetrics, InflightSample};

    use super::*;
    use crate::testing::{candidates, scores};

    fn scorer(signal: Signal) -> LoadSignalScorer {
        LoadSignalScorer::new("s", signal, LoadSignalParams::default())
    }

    #[test]
    fn queue_formula() {
        let m = |waiting| EndpointMetrics {
            waiting,
            ..Default::default()
        };
        let c = candidates(vec![m(0), m(5), m(10)]);
        assert_eq!(scores(&scorer(Signal::Waiting), &c), vec![1.0, 0.5, 0.0]);
        let equal = candidates(vec![m(4), m(4)]);
        assert_eq!(scores(&scorer(Signal::Waiting), &equal), vec![1.0, 1.0]);
    }

    #[test]
    fn running_requests_formula() {
        let m = |running| EndpointMetrics {
            running,
            ..Default::default()
        };
        let c = candidates(vec![m(9), m(3), m(3)]);
        assert_eq!(scores(&scorer(Signal::Running), &c), vec![0.0, 1.0, 1.0]);
    }

    #[test]
    fn kv_cache_utilization_formula() {
        let m = |kv_usage| EndpointMetrics {
            kv_usage,
            ..Default::default()
        };
        let c = candidates(vec![m(0.0), m(0.25), m(1.0), m(1.7), m(f64::NAN)]);
        assert_eq!(
            scores(&scorer(Signal::KvUsage), &c),
            vec![1.0, 0.75, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn each_signal_is_registered_under_its_type_with_count_dispatched() {
        let registry = crate::builtin_registry();
        for signal in Signal::ALL {
            let off: serde_yaml_ng::Value =
                serde_yaml_ng::from_str("{countDispatched: false}").unwrap();
            let spec = epp_core::PluginSpec::new(signal.type_name()).with_parameters(off);
            let plugin = registry.build(&spec).unwrap();
            assert_eq!(plugin.type_name(), signal.type_name());
            // Scraped 3 queued/running, one dispatched since: only counted
            // when countDispatched is on.
            let c = candidates(vec![
                EndpointMetrics {
                    waiting: 3,
                    running: 3,
                    ..Default::default()
                },
                EndpointMetrics {
                    waiting: 4,
                    running: 4,
                    ..Default::default()
                },
            ]);
            c[0].endpoint.inflight().start(160);
            let scorer = plugin.as_scorer().unwrap();
            let on = registry
                .build(&epp_core::PluginSpec::new(signal.type_name()))
                .unwrap();
            let on = on.as_scorer().unwrap();
            if signal == Signal::KvUsage {
                // No cache geometry: the scraped value either way.
                assert_eq!(scores(scorer, &c), scores(on, &c));
            } else {
                assert_eq!(scores(scorer, &c), vec![1.0, 0.0], "{signal:?}");
                assert_eq!(scores(on, &c), vec![1.0, 1.0], "{signal:?}");
            }
        }
        let bad: serde_yaml_ng::Value = serde_yaml_ng::from_str("{countDispatch: false}").unwrap();
        let err = registry
            .build(&epp_core::PluginSpec::new("queue-scorer").with_parameters(bad))
            .unwrap_err();
        assert!(
            err.to_string().contains("unknown field `countDispatch`"),
            "{err}"
        );
    }

    fn scraped(waiting: u32, inflight_requests: u32) -> EndpointMetrics {
        EndpointMetrics {
            waiting,
            running: waiting,
            kv_usage: 0.5,
            cache: Some(CacheGeometry {
                block_size_tokens: 16,
                num_blocks: 100,
            }),
            inflight_at_scrape: InflightSample {
                requests: inflight_requests,
                tokens: u64::from(inflight_requests) * 160,
                uncached_tokens: u64::from(inflight_requests) * 160,
            },
            ..EndpointMetrics::default()
        }
    }

    #[test]
    fn adds_only_what_was_dispatched_after_the_scrape() {
        // Two requests were in flight when the scrape left (the server counts
        // them); one more was dispatched since.
        let c = candidates(vec![scraped(3, 2)]);
        for _ in 0..3 {
            c[0].endpoint.inflight().start(160);
        }
        let on = LoadSignalParams::default();
        assert_eq!((on.waiting(&c[0]), on.running(&c[0])), (4, 4));
        // 160 tokens = 10 blocks of 100.
        assert!((on.kv_usage(&c[0]) - 0.6).abs() < 1e-9);
        let off = LoadSignalParams {
            count_dispatched: false,
        };
        assert_eq!((off.waiting(&c[0]), off.running(&c[0])), (3, 3));
        assert!((off.kv_usage(&c[0]) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn completions_since_the_scrape_lower_the_signal_but_not_below_zero() {
        let c = candidates(vec![scraped(1, 3)]);
        c[0].endpoint.inflight().start(160);
        let on = LoadSignalParams::default();
        assert_eq!(on.waiting(&c[0]), 0, "1 queued, 3 in flight then, 1 now");
        assert!((on.kv_usage(&c[0]) - 0.3).abs() < 1e-9);
    }

    #[test]
    fn kv_grows_by_the_uncached_part_only() {
        let c = candidates(vec![scraped(0, 0)]);
        // 800 prompt tokens, 640 of them in the endpoint's prefix cache.
        c[0].endpoint.inflight().start_with(800, 160);
        assert!((LoadSignalParams::default().kv_usage(&c[0]) - 0.6).abs() < 1e-9);
    }

    #[test]
    fn kv_without_geometry_is_the_scraped_value() {
        let c = candidates(vec![EndpointMetrics {
            kv_usage: 0.25,
            ..EndpointMetrics::default()
        }]);
        c[0].endpoint.inflight().start(10_000);
        assert!((LoadSignalParams::default().kv_usage(&c[0]) - 0.25).abs() < 1e-9);
        assert_eq!(LoadSignalParams::default().waiting(&c[0]), 1);
    }
}
