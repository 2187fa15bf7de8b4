//! The decision view on the metrics port: `GET /debug/decisions`, a small
//! self-contained page, and `GET /debug/decisions.json`, what it polls — the
//! endpoints with their live signals and freshness, and the last sampled
//! decisions ([`epp_extproc::DecisionLog`]). Neither ever holds a prompt or
//! a body: the records have no field for them.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use epp_core::{Endpoint, EndpointSource};
use epp_extproc::{DecisionLog, DecisionRecord};
use serde::Serialize;

/// The page's path.
pub(crate) const PAGE_PATH: &str = "/debug/decisions";
/// The JSON's path (the page fetches it relative to itself).
pub(crate) const JSON_PATH: &str = "/debug/decisions.json";

/// The page: HTML, CSS and script in one file, no external asset.
pub(crate) const PAGE: &str = include_str!("decision_view.html");

/// The page's Content-Security-Policy: its own inline script and style, and
/// fetches to its own origin; nothing else loads.
pub(crate) const PAGE_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// What the view reads: the log the ext_proc service fills, and the
/// staleness threshold the scheduler uses.
#[derive(Debug)]
pub(crate) struct DecisionView {
    pub(crate) log: Arc<DecisionLog>,
    pub(crate) staleness: Duration,
}

#[derive(Serialize)]
struct ViewJson<'a> {
    /// When this was made, milliseconds since the Unix epoch.
    unix_ms: u64,
    staleness_threshold_ms: u64,
    log: LogJson,
    endpoints: Vec<EndpointJson>,
    /// Newest first.
    decisions: Vec<&'a DecisionRecord>,
}

#[derive(Serialize)]
struct LogJson {
    capacity: usize,
    interval_ms: u64,
    recorded: u64,
}

#[derive(Serialize)]
struct EndpointJson {
    name: String,
    address: String,
    labels: BTreeMap<String, String>,
    waiting: u32,
    running: u32,
    kv_usage: f64,
    lora_active: Vec<String>,
    lora_waiting: Vec<String>,
    max_loras: u32,
    inflight_requests: u32,
    inflight_tokens: u64,
    custom: BTreeMap<String, f64>,
    /// Age of the last successful scrape; `None` before the first.
    scraped_ms_ago: Option<u64>,
    stale: bool,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn endpoint(e: &Endpoint, now: Instant, staleness: Duration) -> EndpointJson {
    let m = e.metrics();
    let inflight = e.inflight().sample();
    EndpointJson {
        name: e.name().to_owned(),
        address: e.addr_str().to_owned(),
        labels: e.labels().clone(),
        waiting: m.waiting,
        running: m.running,
        kv_usage: m.kv_usage,
        lora_active: m.lora.active.clone(),
        lora_waiting: m.lora.waiting.clone(),
        max_loras: m.lora.max_loras,
        inflight_requests: inflight.requests,
        inflight_tokens: inflight.tokens,
        custom: m.custom.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        scraped_ms_ago: m.age(now).map(millis),
        stale: m.is_stale(now, staleness),
    }
}

impl DecisionView {
    /// The JSON the page polls: the endpoints of `source` now and the
    /// decisions kept.
    pub(crate) fn json(&self, source: &dyn EndpointSource) -> String {
        let now = Instant::now();
        let snapshot = source.snapshot();
        let recent = self.log.recent();
        let view = ViewJson {
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, millis),
            staleness_threshold_ms: millis(self.staleness),
            log: LogJson {
                capacity: self.log.capacity(),
                interval_ms: millis(self.log.interval()),
                recorded: self.log.recorded(),
            },
            endpoints: snapshot
                .endpoints()
                .iter()
                .map(|e| endpoint(e, now, self.staleness))
                .collect(),
            decisions: recent.iter().map(|r| &**r).collect(),
        };
        // Plain data (strings, numbers, maps with string keys): serialising
        // it cannot fail; a failure would still be a valid, empty answer.
        serde_json::to_string(&view).unwrap_or_else(|_| "{}".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arc_swap::ArcSwap;
    use epp_core::{EndpointId, EndpointMetrics, EndpointSnapshot, LoraInfo};

    use super::*;

    #[test]
    fn the_json_shows_each_endpoints_signals_and_freshness() {
        let fresh = Endpoint::with_labels(
            EndpointId(0),
            "10.0.0.1:8000".parse().unwrap(),
            BTreeMap::from([("llm-d.ai/role".to_owned(), "decode".to_owned())]),
        )
        .with_name(Some("pod-a".into()));
        fresh.set_metrics(EndpointMetrics {
            waiting: 3,
            running: 7,
            kv_usage: 0.25,
            lora: LoraInfo {
                active: vec!["sql-lora".into()],
                waiting: vec!["chat-lora".into()],
                max_loras: 4,
                base_model: None,
            },
            custom: HashMap::from([("queue_seconds".to_owned(), 1.5)]),
            ..EndpointMetrics::fresh()
        });
        fresh.inflight().start(120);
        let never = Endpoint::new(1, "10.0.0.2:8000".parse().unwrap());
        let source = ArcSwap::from_pointee(EndpointSnapshot::new(vec![
            Arc::new(fresh),
            Arc::new(never),
        ]));
        let view = DecisionView {
            log: Arc::new(DecisionLog::new(7, Duration::from_millis(250))),
            staleness: Duration::from_secs(3600),
        };
        let v: serde_json::Value = serde_json::from_str(&view.json(&source)).unwrap();
        assert_eq!(
            v["log"],
            serde_json::json!({"capacity": 7, "interval_ms": 250, "recorded": 0})
        );
        assert_eq!(v["staleness_threshold_ms"], 3_600_000);
        assert_eq!(v["decisions"], serde_json::json!([]));
        let a = &v["endpoints"][0];
        assert_eq!(a["name"], "pod-a");
        assert_eq!(a["address"], "10.0.0.1:8000");
        assert_eq!(a["labels"]["llm-d.ai/role"], "decode");
        assert_eq!(
            (a["waiting"].as_u64(), a["running"].as_u64()),
            (Some(3), Some(7))
        );
        assert_eq!(a["kv_usage"], 0.25);
        assert_eq!(a["lora_active"], serde_json::json!(["sql-lora"]));
        assert_eq!(a["lora_waiting"], serde_json::json!(["chat-lora"]));
        assert_eq!(a["max_loras"], 4);
        assert_eq!(a["inflight_requests"], 1);
        assert_eq!(a["inflight_tokens"], 120);
        assert_eq!(a["custom"]["queue_seconds"], 1.5);
        assert!(a["scraped_ms_ago"].is_u64(), "{a}");
        assert_eq!(a["stale"], false);
        let b = &v["endpoints"][1];
        assert_eq!(
            b["name"], "10.0.0.2:8000",
            "an unnamed endpoint goes by its address"
        );
        assert!(b["scraped_ms_ago"].is_null(), "never scraped: {b}");
        assert_eq!(b["stale"], true);
    }

    #[test]
    fn the_page_is_self_contained_and_writes_no_markup_from_data() {
        for external in ["http://", "https://", "src=", "href=", "@import", "url("] {
            assert!(!PAGE.contains(external), "the page loads {external}");
        }
        // Values from requests (model names, ids, labels) reach the page as
        // text nodes, never parsed as HTML.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!PAGE.contains(sink), "the page writes markup with {sink}");
        }
        assert!(
            PAGE.contains("fetch(\"decisions.json\""),
            "it polls its JSON"
        );
        assert!(JSON_PATH.starts_with(PAGE_PATH));
    }
}
