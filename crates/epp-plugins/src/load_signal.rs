//! Load signals that add what this picker dispatched since an endpoint's last
//! scrape to the scraped values.
//!
//! Scraped metrics lag by up to one refresh interval (50 ms by default). The
//! reference picker scores on them as they are, so every request arriving
//! between two scrapes sees the same "least loaded" endpoint and they all go
//! there (herding). Here the queue, running and KV signals are the scraped
//! value plus the picker's own in-flight change since the scrape
//! ([`Candidate::since_scrape`]): dispatched minus completed requests, and
//! the prompt tokens of theirs the endpoint's prefix cache was not expected to
//! hold, as a share of its KV capacity when the server reports its cache
//! geometry. `countDispatched: false` gives the reference's values.

use epp_core::Candidate;

/// Parameters of the scorers that read a load signal (`queue-scorer`,
/// `running-requests-size-scorer`, `kv-cache-utilization-scorer`).
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
    pub(crate) fn waiting(self, c: &Candidate) -> u32 {
        if self.count_dispatched {
            plus(c.metrics.waiting, c.since_scrape().requests)
        } else {
            c.metrics.waiting
        }
    }

    /// Running requests: scraped count plus the net dispatched since.
    pub(crate) fn running(self, c: &Candidate) -> u32 {
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
    pub(crate) fn kv_usage(self, c: &Candidate) -> f64 {
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

#[cfg(test)]
mod tests {
    use epp_core::{CacheGeometry, EndpointMetrics, InflightSample};

    use super::*;
    use crate::testing::candidates;

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
