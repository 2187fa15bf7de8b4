//! `utilization-detector`: pool saturation from queue depth and KV usage.

use std::time::Duration;

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin, SaturationDetector};

use crate::Builtin;

/// Parameters (REFERENCE §4 defaults).
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UtilizationDetectorParams {
    /// Waiting requests at which an endpoint counts as full. Default 5.
    #[serde(default = "default_queue")]
    pub queue_depth_threshold: u32,
    /// KV usage at which an endpoint counts as full. Default 0.8.
    #[serde(default = "default_kv")]
    pub kv_cache_util_threshold: f64,
    /// Metrics older than this count as fully saturated. Default 200 ms.
    #[serde(default = "default_stale", with = "millis")]
    pub metrics_staleness_threshold: Duration,
    /// Burst allowed above both thresholds when filtering, as a fraction
    /// (0.2 = 20 %). Saturation still uses the thresholds themselves.
    /// Default 0.
    #[serde(default)]
    pub headroom: f64,
}

fn default_queue() -> u32 {
    5
}
fn default_kv() -> f64 {
    0.8
}
fn default_stale() -> Duration {
    Duration::from_millis(200)
}

/// Durations as `200ms`, `1s`, `1.5s` or a bare number of milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, de::Error};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        let ms = match Raw::deserialize(d)? {
            Raw::Num(n) => n,
            Raw::Text(t) => {
                let t = t.trim();
                if let Some(v) = t.strip_suffix("ms") {
                    v.trim().parse::<f64>().map_err(D::Error::custom)?
                } else if let Some(v) = t.strip_suffix('s') {
                    v.trim().parse::<f64>().map_err(D::Error::custom)? * 1000.0
                } else {
                    return Err(D::Error::custom(format!(
                        "invalid duration {t:?} (use e.g. 200ms or 1s)"
                    )));
                }
            }
        };
        if !ms.is_finite() || ms < 0.0 {
            return Err(D::Error::custom("duration must be a non-negative number"));
        }
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }
}

impl Default for UtilizationDetectorParams {
    fn default() -> Self {
        Self {
            queue_depth_threshold: default_queue(),
            kv_cache_util_threshold: default_kv(),
            metrics_staleness_threshold: default_stale(),
            headroom: 0.0,
        }
    }
}

impl UtilizationDetectorParams {
    /// Checks ranges.
    fn validated(self) -> Result<Self, BuildError> {
        let bad = |field: &str, value: String, reason: &str| BuildError::InvalidValue {
            plugin: UtilizationDetector::TYPE.into(),
            field: field.into(),
            value,
            reason: reason.into(),
        };
        if self.queue_depth_threshold == 0 {
            return Err(bad("queueDepthThreshold", "0".into(), "must be at least 1"));
        }
        if !(self.kv_cache_util_threshold > 0.0 && self.kv_cache_util_threshold <= 1.0) {
            return Err(bad(
                "kvCacheUtilThreshold",
                self.kv_cache_util_threshold.to_string(),
                "must be in (0, 1]",
            ));
        }
        if !(self.headroom.is_finite() && self.headroom >= 0.0) {
            return Err(bad("headroom", self.headroom.to_string(), "must be >= 0"));
        }
        Ok(self)
    }
}

/// `utilization-detector`: saturation = mean over endpoints of
/// `max(q / qThr, kv / kvThr)`, a stale endpoint counting 1. Also a filter
/// keeping fresh endpoints below both thresholds × (1 + `headroom`) (all of
/// them when none is, as in llm-d).
#[derive(Debug, Clone)]
pub struct UtilizationDetector {
    name: String,
    params: UtilizationDetectorParams,
}

impl Builtin for UtilizationDetector {
    const TYPE: &'static str = "utilization-detector";
    type Params = UtilizationDetectorParams;

    /// # Errors
    /// Zero queue threshold, a KV threshold outside (0, 1], or a negative
    /// headroom.
    fn build(
        name: impl Into<String>,
        params: UtilizationDetectorParams,
    ) -> Result<Self, BuildError> {
        Ok(Self {
            name: name.into(),
            params: params.validated()?,
        })
    }
}

impl UtilizationDetector {
    fn load(&self, cx: &CycleContext<'_>, c: &Candidate) -> f64 {
        if c.metrics
            .is_stale(cx.now, self.params.metrics_staleness_threshold)
        {
            return 1.0;
        }
        let q = f64::from(c.metrics.waiting) / f64::from(self.params.queue_depth_threshold);
        let kv = c.metrics.kv_usage / self.params.kv_cache_util_threshold;
        q.max(kv)
    }
}

impl Plugin for UtilizationDetector {
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

impl SaturationDetector for UtilizationDetector {
    fn saturation(&self, cx: &CycleContext<'_>, endpoints: &[Candidate]) -> f64 {
        if endpoints.is_empty() {
            return 1.0;
        }
        endpoints.iter().map(|c| self.load(cx, c)).sum::<f64>() / endpoints.len() as f64
    }

    /// The endpoints whose metrics are older than
    /// `metricsStalenessThreshold` (each counted as fully saturated).
    fn stale_endpoints(&self, cx: &CycleContext<'_>, endpoints: &[Candidate]) -> Option<usize> {
        let stale = |c: &&Candidate| {
            c.metrics
                .is_stale(cx.now, self.params.metrics_staleness_threshold)
        };
        Some(endpoints.iter().filter(stale).count())
    }

    /// Fresh, and below both thresholds relaxed by `headroom` (llm-d's
    /// filter limits: `threshold × (1 + headroom)`).
    fn has_capacity(&self, cx: &CycleContext<'_>, c: &Candidate) -> bool {
        let p = &self.params;
        if c.metrics.is_stale(cx.now, p.metrics_staleness_threshold) {
            return false;
        }
        let burst = 1.0 + p.headroom;
        f64::from(c.metrics.waiting) < f64::from(p.queue_depth_threshold) * burst
            && c.metrics.kv_usage < p.kv_cache_util_threshold * burst
    }
}

impl Filter for UtilizationDetector {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        crate::keep_with_capacity(self, cx, candidates);
    }
}

#[cfg(test)]
mod tests {
    use epp_core::{EndpointMetrics, InferenceRequest};

    use super::*;
    use crate::testing::{candidates, with_cx};

    #[test]
    fn headroom_relaxes_the_filter_but_not_saturation() {
        let p: UtilizationDetectorParams =
            serde_yaml_ng::from_str("{queueDepthThreshold: 5, headroom: 0.2}").unwrap();
        let d = UtilizationDetector::build("u", p).unwrap();
        let m = |waiting, kv_usage| EndpointMetrics {
            waiting,
            kv_usage,
            ..Default::default()
        };
        // Limits with 20 % headroom: queue < 6, KV < 0.96.
        let c = candidates(vec![m(5, 0.0), m(6, 0.0), m(0, 0.95), m(0, 0.96)]);
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            let s = d.saturation(cx, &c);
            let want = (1.0 + 1.2 + 0.95 / 0.8 + 0.96 / 0.8) / 4.0;
            assert!((s - want).abs() < 1e-12, "{s}");
            let mut kept = c.clone();
            d.filter(cx, &mut kept);
            let ids: Vec<u32> = kept.iter().map(|c| c.id().0).collect();
            assert_eq!(ids, vec![0, 2]);
        });
        let bad = UtilizationDetectorParams {
            headroom: -1.0,
            ..Default::default()
        };
        assert!(
            bad.validated()
                .unwrap_err()
                .to_string()
                .contains("headroom")
        );
    }

    #[test]
    fn stale_endpoints_fail_the_filter_even_with_headroom() {
        let p = UtilizationDetectorParams {
            headroom: 0.5,
            ..Default::default()
        };
        let d = UtilizationDetector::build("u", p).unwrap();
        let c = candidates(vec![EndpointMetrics::default(); 2]);
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            cx.now += Duration::from_secs(5);
            assert!(!d.has_capacity(cx, &c[0]), "stale counts as full");
            assert!((d.saturation(cx, &c) - 1.0).abs() < 1e-12);
        });
    }

    #[test]
    fn stale_endpoints_are_counted_as_the_saturation_scores_them() {
        let d = UtilizationDetector::build("u", UtilizationDetectorParams::default()).unwrap();
        let eps = crate::testing::endpoints(vec![EndpointMetrics::default(); 3]);
        // Endpoint 1 was never scraped: missing metrics count as stale.
        eps[1].set_metrics(EndpointMetrics::default());
        let c: Vec<Candidate> = eps.iter().map(Candidate::new).collect();
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            assert_eq!(d.stale_endpoints(cx, &c), Some(1));
            assert!((d.saturation(cx, &c) - 1.0 / 3.0).abs() < 1e-12);
            assert_eq!(d.stale_endpoints(cx, &[]), Some(0));
            // Past the threshold every endpoint is stale, and saturated.
            cx.now += Duration::from_secs(5);
            assert_eq!(d.stale_endpoints(cx, &c), Some(3));
            assert!((d.saturation(cx, &c) - 1.0).abs() < 1e-12);
        });
    }

    #[test]
    fn saturation_is_the_mean_of_per_endpoint_load() {
        let d = UtilizationDetector::build("u", UtilizationDetectorParams::default()).unwrap();
        let m = |waiting, kv_usage| EndpointMetrics {
            waiting,
            kv_usage,
            ..Default::default()
        };
        let c = candidates(vec![m(10, 0.0), m(0, 0.4), m(0, 0.0)]);
        let req = InferenceRequest::builder("m").build();
        with_cx(&req, 0, |cx| {
            // max(10/5, 0) = 2, max(0, 0.5) = 0.5, 0 → mean 2.5 / 3
            assert!((d.saturation(cx, &c) - 2.5 / 3.0).abs() < 1e-12);
            let mut kept = c.clone();
            d.filter(cx, &mut kept);
            assert_eq!(kept.len(), 2);
        });
    }
}
