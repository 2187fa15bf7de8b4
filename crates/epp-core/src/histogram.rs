//! A lock-free histogram over fixed bucket bounds, for metrics recorded on
//! the request path and read at scrape time (by the binary's collectors, or
//! by a plugin's [`PluginMetrics`](crate::PluginMetrics) report).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::{MetricFamily, MetricSink};

/// Bucket counts (not cumulative; one more than the bounds, the last
/// `+Inf`) and their sum, each updated with one atomic operation.
#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    /// `f64` bits.
    sum: AtomicU64,
}

impl AtomicHistogram {
    /// An empty histogram over `bounds` (ascending upper bounds, without
    /// `+Inf`, which is always added).
    #[must_use]
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Counts `v` in the first bucket whose bound is not below it.
    pub fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i].fetch_add(1, Relaxed);
        // No other writer contends for long: a CAS loop on the bits.
        let _ = self.sum.fetch_update(Relaxed, Relaxed, |s| {
            Some((f64::from_bits(s) + v).to_bits())
        });
    }

    /// Adds this histogram's values into `into` (several histograms may be
    /// added together for a coarser label set).
    pub fn add_to(&self, into: &mut HistogramValue) {
        if into.counts.len() != self.counts.len() {
            into.bounds = self.bounds;
            into.counts = vec![0; self.counts.len()];
        }
        for (i, c) in self.counts.iter().enumerate() {
            into.counts[i] += c.load(Relaxed);
        }
        into.sum += f64::from_bits(self.sum.load(Relaxed));
    }

    /// How many values were observed.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Reports the histogram as one series of `family` with `labels`.
    pub fn report(&self, out: &mut dyn MetricSink, family: MetricFamily, labels: &[(&str, &str)]) {
        let mut v = HistogramValue::default();
        self.add_to(&mut v);
        out.histogram(family, labels, &v.buckets(), v.sum, v.count());
    }
}

/// A histogram's values at one scrape.
#[derive(Debug, Clone, Default)]
pub struct HistogramValue {
    bounds: &'static [f64],
    counts: Vec<u64>,
    /// The sum of the observed values.
    pub sum: f64,
}

impl HistogramValue {
    /// How many values were observed.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(upper bound, count)` per bucket, not cumulative, the last `+Inf`
    /// as `f64::MAX` (what [`MetricSink::histogram`] takes).
    #[must_use]
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(self.counts.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_is_not_below() {
        let h = AtomicHistogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0, 3.0] {
            h.observe(v);
        }
        let mut v = HistogramValue::default();
        h.add_to(&mut v);
        h.add_to(&mut v);
        assert_eq!(v.buckets(), [(1.0, 4), (2.0, 2), (f64::MAX, 4)]);
        assert_eq!(v.count(), 10);
        assert_eq!(h.count(), 5);
        assert!((v.sum - 18.0).abs() < 1e-9);
    }
}
