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
    #[serde(default = "default_stale", with = "duration_or_millis")]
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

/// Durations as Go writes them (`200ms`, `1s`, `1m30s`, `500us`, as llm-d
/// reads them) or a bare number of milliseconds.
mod duration_or_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, de::Error};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(ms) => Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
                D::Error::custom(format!(
                    "invalid duration {ms} (a non-negative number of milliseconds)"
                ))
            }),
            Raw::Text(t) => epp_core::config::parse_duration(&t).ok_or_else(|| {
                D::Error::custom(format!(
                    "invalid duration {t:?} (use e.g. 200ms, 1s or 1m30s)"
                ))
            }),
        }
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
        if self.metrics_staleness_threshold.is_zero() {
            return Err(bad(
                "metricsStalenessThreshold",
                "0".into(),
                "must be longer than 0 (every endpoint would count as stale)",
            ));
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
    fn staleness_is_a_go_duration_longer_than_zero() {
        let read = |yaml: &str| {
            serde_yaml_ng::from_str::<UtilizationDetectorParams>(yaml)
                .map_err(|e| e.to_string())
                .and_then(|p| p.validated().map_err(|e| e.to_string()))
                .map(|p| p.metrics_staleness_threshold)
        };
        for (yaml, ms) in [
            ("{metricsStalenessThreshold: 200ms}", 200),
            ("{metricsStalenessThreshold: 1m30s}", 90_000),
            ("{metricsStalenessThreshold: 1.5s}", 1500),
            ("{metricsStalenessThreshold: 250}", 250),
        ] {
            assert_eq!(read(yaml), Ok(Duration::from_millis(ms)), "{yaml}");
        }
        assert_eq!(
            read("{metricsStalenessThreshold: 500us}"),
            Ok(Duration::from_micros(500))
        );
        for (yaml, says) in [
            ("{metricsStalenessThreshold: 0s}", "longer than 0"),
            ("{metricsStalenessThreshold: 0}", "longer than 0"),
            ("{metricsStalenessThreshold: soon}", "invalid duration"),
            ("{metricsStalenessThreshold: -1}", "invalid duration"),
            ("{metricsStalenessThreshold: 1e300}", "invalid duration"),
        ] {
            let err = read(yaml).unwrap_err();
            assert!(err.contains(says), "{yaml}: {err}");
        }
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
