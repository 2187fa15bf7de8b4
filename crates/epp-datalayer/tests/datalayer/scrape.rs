//! Scraping against a deliberately misbehaving server: every failure costs
//! bounded time and memory, keeps the last values without refreshing their
//! age, is counted, and never stalls the other endpoints.

use std::{sync::Arc, time::Duration};

use epp_core::{Candidate, EndpointMetrics, EndpointSource};
use epp_datalayer::{DataLayer, DataLayerOptions, EndpointSpec, EndpointStore, ScrapeStatus};
use epp_test_support::{
    plugins::{self, BestScoresPicker, short_queue_profile},
    wait::eventually,
};
use tokio_util::sync::CancellationToken;

use crate::common::{BadServer, Logs, Mode, vllm_page, wiring};

fn opts(refresh_ms: u64, timeout_ms: u64) -> DataLayerOptions {
    DataLayerOptions {
        refresh_interval: Duration::from_millis(refresh_ms),
        scrape_timeout: Duration::from_millis(timeout_ms),
        ..DataLayerOptions::default()
    }
}

fn store_of(servers: &[&BadServer]) -> Arc<EndpointStore> {
    let store = Arc::new(EndpointStore::new());
    store.replace_source(
        "test",
        servers.iter().map(|s| EndpointSpec::new(s.addr)).collect(),
    );
    store
}

fn metrics_of(store: &EndpointStore, server: &BadServer) -> Arc<EndpointMetrics> {
    store.snapshot().by_addr(server.addr).unwrap().metrics()
}

/// A data layer scraping `store`'s endpoints over plain HTTP every 10 ms,
/// with a scrape timeout of `timeout_ms`.
fn start_plain(store: &Arc<EndpointStore>, timeout_ms: u64) -> DataLayer {
    DataLayer::start(
        Arc::clone(store),
        &[wiring("{}")],
        opts(10, timeout_ms),
        CancellationToken::new(),
    )
    .unwrap()
}

fn status_of(dl: &DataLayer, server: &BadServer) -> ScrapeStatus {
    dl.status()
        .into_iter()
        .find(|s| s.addr == server.addr)
        .unwrap_or_else(|| panic!("no status for {}", server.addr))
}

#[tokio::test]
async fn scrapes_over_one_kept_alive_connection() {
    let server = BadServer::start(Mode::Page(vllm_page(3, 2, 0.5))).await;
    let store = store_of(&[&server]);
    let dl = start_plain(&store, 1000);
    eventually("ten scrapes", || async { status_of(&dl, &server).ok >= 10 }).await;
    let m = metrics_of(&store, &server);
    assert_eq!((m.waiting, m.running), (3, 2));
    assert!((m.kv_usage - 0.5).abs() < 1e-12);
    assert!(m.updated_at.is_some());
    assert_eq!(server.connections(), 1, "the connection is reused");
    dl.stop().await;
}

#[tokio::test]
async fn each_scrape_carries_the_in_flight_counts_from_when_it_was_sent() {
    let server = BadServer::start(Mode::Page(vllm_page(3, 2, 0.5))).await;
    let store = store_of(&[&server]);
    let endpoint = Arc::clone(store.snapshot().by_addr(server.addr).unwrap());
    endpoint.inflight().start(100);
    endpoint.inflight().start(20);
    let dl = start_plain(&store, 1000);
    eventually("a scrape", || async { status_of(&dl, &server).ok >= 1 }).await;
    let m = metrics_of(&store, &server);
    assert_eq!(
        (m.inflight_at_scrape.requests, m.inflight_at_scrape.tokens),
        (2, 120)
    );
    assert_eq!(Candidate::new(&endpoint).since_scrape().requests, 0);
    // One completes: the next scrapes are sent with one in flight.
    endpoint.inflight().finish(20);
    eventually("a scrape sent after the completion", || async {
        metrics_of(&store, &server).inflight_at_scrape.requests == 1
    })
    .await;
    assert_eq!(metrics_of(&store, &server).inflight_at_scrape.tokens, 100);
    dl.stop().await;
}

/// Each way a server can misbehave, the substring its error carries, and a
/// scrape timeout short enough for the slow ones.
#[tokio::test]
async fn failures_keep_values_age_and_recover() {
    let (logs, _guard) = Logs::capture();
    let cases: Vec<(Mode, &str, &str)> = vec![
        (Mode::Status500, "HTTP 500", "http_error"),
        (Mode::Garbage, "none of the vllm", "extract_error"),
        (Mode::Hang, "timed out", "timeout"),
        (
            Mode::Huge(50 << 20),
            "larger than the size cap",
            "too_large",
        ),
        (
            Mode::HugeAnnounced(50 << 20),
            "larger than the size cap",
            "too_large",
        ),
        (
            Mode::Drip(vllm_page(1, 1, 0.1), Duration::from_millis(20)),
            "timed out",
            "timeout",
        ),
    ];
    let n_cases = cases.len();
    let server = BadServer::start(Mode::Page(vllm_page(3, 2, 0.5))).await;
    let store = store_of(&[&server]);
    let dl = start_plain(&store, 300);
    for (round, (mode, expected, outcome)) in cases.into_iter().enumerate() {
        let waiting = u32::try_from(round).unwrap() + 3;
        server.set(Mode::Page(vllm_page(waiting, 2, 0.5)));
        eventually("a good scrape", || async {
            metrics_of(&store, &server).waiting == waiting
                && status_of(&dl, &server).last_error.is_none()
        })
        .await;

        server.set(mode.clone());
        let before = status_of(&dl, &server).failed;
        let counted_before = scrapes_counted(&dl, &server, outcome);
        eventually(&format!("{mode:?} fails twice"), || async {
            let s = status_of(&dl, &server);
            s.failed >= before + 2
                && s.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains(expected))
        })
        .await;
        let stamp = metrics_of(&store, &server).updated_at;
        eventually(&format!("{mode:?} fails again"), || async {
            status_of(&dl, &server).failed >= before + 3
        })
        .await;
        let m = metrics_of(&store, &server);
        assert_eq!(m.waiting, waiting, "{mode:?}: the last values are kept");
        assert_eq!(
            m.updated_at, stamp,
            "{mode:?}: a failed scrape does not refresh the age"
        );
        assert!(
            scrapes_counted(&dl, &server, outcome) >= counted_before + 3,
            "{mode:?}: counted as {outcome} in the picker's metrics"
        );
    }
    // Logged once per change of state, not per failed scrape.
    assert_eq!(
        logs.count("metrics scrape failing"),
        n_cases,
        "{}",
        logs.text()
    );
    // llm-d's error series: extraction failures by source and extractor
    // type, every other failure as a poll error of the source type.
    let page = encoded(&dl);
    let value = |prefix: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    assert!(
        value(
            "llm_d_epp_datalayer_extract_errors_total{source_type=\"metrics-data-source\",extractor_type=\"core-metrics-extractor\"} "
        ) >= 3,
        "{page}"
    );
    assert!(
        value("llm_d_epp_datalayer_poll_errors_total{source_type=\"metrics-data-source\"} ") >= 15,
        "{page}"
    );
    server.set(Mode::Page(vllm_page(42, 0, 0.0)));
    eventually("recovery", || async {
        metrics_of(&store, &server).waiting == 42
    })
    .await;
    assert_eq!(status_of(&dl, &server).last_error, None);
    dl.stop().await;
}

#[tokio::test]
async fn a_hanging_server_does_not_stall_the_others() {
    let good = BadServer::start(Mode::Page(vllm_page(1, 1, 0.1))).await;
    let hung = BadServer::start(Mode::Hang).await;
    let store = store_of(&[&good, &hung]);
    // The hung scrape cannot end before 60 s; the good one must not wait for it.
    let dl = start_plain(&store, 60_000);
    eventually("20 good scrapes", || async {
        status_of(&dl, &good).ok >= 20
    })
    .await;
    let h = status_of(&dl, &hung);
    assert_eq!((h.ok, h.failed), (0, 0), "the hung scrape is still pending");
    assert!(hung.requests() <= 1);
    assert!(metrics_of(&store, &hung).updated_at.is_none());
    dl.stop().await;
}

#[tokio::test]
async fn removed_endpoints_leave_scheduling_at_once_and_scraping_soon() {
    let a = BadServer::start(Mode::Page(vllm_page(0, 0, 0.0))).await;
    let b = BadServer::start(Mode::Page(vllm_page(0, 0, 0.0))).await;
    let store = store_of(&[&a, &b]);
    let dl = start_plain(&store, 1000);
    eventually("both scraped", || async {
        status_of(&dl, &a).ok > 2 && status_of(&dl, &b).ok > 2
    })
    .await;
    let b_id = store.snapshot().by_addr(b.addr).unwrap().id();
    store.remove("test", b.addr);
    assert!(
        store.snapshot().by_addr(b.addr).is_none(),
        "the next request's snapshot no longer has it"
    );
    eventually("its scraper is gone", || async {
        dl.status().iter().all(|s| s.addr != b.addr)
    })
    .await;
    let after = b.requests();
    let a_before = status_of(&dl, &a).ok;
    eventually("a few more scrapes of the other", || async {
        status_of(&dl, &a).ok >= a_before + 5
    })
    .await;
    assert!(b.requests() <= after + 1, "no scrapes after removal");

    // Re-added, it gets its old id back.
    store.upsert("test", EndpointSpec::new(b.addr));
    let back = Arc::clone(store.snapshot().by_addr(b.addr).unwrap());
    assert_eq!(back.id(), b_id);
    eventually("scraped again", || async {
        back.metrics().updated_at.is_some()
    })
    .await;
    dl.stop().await;
}

#[tokio::test]
async fn https_with_and_without_certificate_checks() {
    let server = BadServer::start_tls(Mode::Page(vllm_page(5, 1, 0.2))).await;
    let store = store_of(&[&server]);
    let dl = DataLayer::start(
        Arc::clone(&store),
        &[wiring("{scheme: https, insecureSkipVerify: true}")],
        opts(10, 1000),
        CancellationToken::new(),
    )
    .unwrap();
    eventually("scraped over TLS", || async {
        metrics_of(&store, &server).waiting == 5
    })
    .await;
    assert_eq!(server.connections(), 1, "one TLS session, reused");
    dl.stop().await;

    // Verifying a self-signed certificate fails (when the machine has CA roots).
    let store = store_of(&[&server]);
    if let Ok(dl) = DataLayer::start(
        Arc::clone(&store),
        &[wiring("{scheme: https}")],
        opts(10, 1000),
        CancellationToken::new(),
    ) {
        eventually("a certificate error", || async {
            status_of(&dl, &server)
                .last_error
                .is_some_and(|e| e.contains("TLS handshake"))
        })
        .await;
        assert!(metrics_of(&store, &server).updated_at.is_none());
        dl.stop().await;
    }
}

// === Staleness reaches scheduling ===

#[tokio::test]
async fn a_server_that_stops_answering_stops_being_picked() {
    let idle = BadServer::start(Mode::Page(vllm_page(0, 0, 0.0))).await;
    let busy = BadServer::start(Mode::Page(vllm_page(9, 4, 0.9))).await;
    let store = store_of(&[&idle, &busy]);
    let dl = start_plain(&store, 100);
    let picker = BestScoresPicker::new(1).last_on_ties();
    let scheduler = plugins::scheduler(short_queue_profile(picker))
        .with_staleness_threshold(Duration::from_millis(300));
    let request = epp_core::InferenceRequest::builder("m")
        .prompt("hi")
        .build();
    let pick = || {
        scheduler
            .schedule(&request, &store.snapshot())
            .ok()
            .and_then(|r| r.primary().map(|e| e.addr()))
    };
    eventually("the idle server is picked", || async {
        pick() == Some(idle.addr)
    })
    .await;
    // Its last page said "idle", but it hangs now: once stale it must lose.
    idle.set(Mode::Hang);
    eventually("the stale server is dropped", || async {
        pick() == Some(busy.addr)
    })
    .await;
    assert_eq!(metrics_of(&store, &idle).waiting, 0, "still reporting idle");
    dl.stop().await;
}

fn encoded(dl: &DataLayer) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    dl.register_metrics(&mut registry);
    dl.register_llm_d_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[tokio::test]
async fn scrape_up_follows_the_latest_scrape() {
    let server = BadServer::start(Mode::Hang).await;
    let store = store_of(&[&server]);
    let dl = start_plain(&store, 100);
    let line = |up: u8| {
        format!(
            "epp_metrics_scrape_up{{endpoint=\"{}\"}} {up}\n",
            server.addr
        )
    };
    assert!(encoded(&dl).contains(&line(0)), "none finished yet");
    server.set(Mode::Page(vllm_page(1, 1, 0.1)));
    eventually("up", || async { encoded(&dl).contains(&line(1)) }).await;
    server.set(Mode::Status500);
    eventually("down", || async { encoded(&dl).contains(&line(0)) }).await;
    assert!(status_of(&dl, &server).last_error.is_some());
    store.remove("test", server.addr);
    eventually("gone with the endpoint", || async {
        !encoded(&dl).contains("epp_metrics_scrape_up{")
    })
    .await;
    dl.stop().await;
}

/// `epp_metrics_scrapes_total{endpoint, outcome}` as the picker exports it.
fn scrapes_counted(dl: &DataLayer, server: &BadServer, outcome: &str) -> u64 {
    let key = format!(
        "epp_metrics_scrapes_total{{endpoint=\"{}\",outcome=\"{outcome}\"}} ",
        server.addr
    );
    encoded(dl)
        .lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap())
}
