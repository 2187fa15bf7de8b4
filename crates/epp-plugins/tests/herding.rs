//! Requests arriving between two scrapes of equally loaded endpoints: the
//! default profile spreads them because its load signals count what the
//! picker dispatched since the scrape; scoring on the scraped values alone
//! (the reference's behaviour, `countDispatched: false`) sends every one of
//! them to the same endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc};

use epp_core::{
    CacheGeometry, Dispatch, EndpointMetrics, EndpointSnapshot, InferenceRequest, Scheduler,
    config::EndpointPickerConfig,
};
use epp_plugins::{DEFAULT_CONFIG, builtin_registry};
use epp_test_support::endpoints::endpoints;

fn scheduler(text: &str) -> Arc<Scheduler> {
    Arc::new(
        EndpointPickerConfig::parse(text, "epp.yaml")
            .unwrap()
            .build(&builtin_registry())
            .unwrap()
            .scheduler,
    )
}

/// Four endpoints with empty queues and KV usage 10 %, 11 %, 12 %, 13 % in
/// their last scrape, which left while nothing was in flight.
fn fleet() -> EndpointSnapshot {
    EndpointSnapshot::new(endpoints((0..4u32).map(|i| EndpointMetrics {
        kv_usage: 0.10 + f64::from(i) / 100.0,
        cache: Some(CacheGeometry {
            block_size_tokens: 16,
            num_blocks: 2048,
        }),
        ..EndpointMetrics::default()
    })))
}

/// Schedules `prompts` back to back, each dispatched (counted in flight on
/// its target, as any front end does by holding the [`Dispatch`]) and none
/// completed, and returns the picks per endpoint.
fn schedule_all(
    scheduler: &Arc<Scheduler>,
    prompts: impl Iterator<Item = String>,
) -> BTreeMap<u32, usize> {
    let fleet = fleet();
    let mut picks = BTreeMap::new();
    let mut in_flight: Vec<Dispatch> = Vec::new();
    for prompt in prompts {
        let request = InferenceRequest::builder("m").prompt(prompt).build();
        let result = scheduler.schedule(&request, &fleet).unwrap();
        let dispatch = result.dispatch(Arc::clone(scheduler), request).unwrap();
        *picks.entry(dispatch.endpoint().id().0).or_insert(0) += 1;
        in_flight.push(dispatch);
    }
    picks
}

/// `n` unrelated requests: different from the first block on, so the prefix
/// scorer sees no hit.
fn burst(scheduler: &Arc<Scheduler>, n: usize) -> BTreeMap<u32, usize> {
    schedule_all(
        scheduler,
        (0..n).map(|i| format!("request {i:04}: {}", "some words ".repeat(150))),
    )
}

#[test]
fn the_default_profile_spreads_a_burst_between_scrapes() {
    let picks = burst(&scheduler(DEFAULT_CONFIG), 8);
    assert_eq!(
        picks,
        BTreeMap::from([(0, 2), (1, 2), (2, 2), (3, 2)]),
        "two each, not all on the lowest scraped KV usage"
    );
}

#[test]
fn a_burst_of_one_tenant_keeps_its_prefix_affinity() {
    // ~6,000-token shared system prompts. Counted in full, each would add
    // 18 % KV to its target, and the burst would leave the tenant's cache
    // three requests per endpoint; the part the target already holds adds
    // nothing, so all stay where the first one warmed the cache.
    let system = "you are a helpful assistant. ".repeat(830);
    let picks = schedule_all(
        &scheduler(DEFAULT_CONFIG),
        (0..9).map(|i| format!("{system}question {i}?")),
    );
    assert_eq!(picks, BTreeMap::from([(0, 9)]));
}

#[test]
fn scraped_values_alone_herd_a_burst_onto_one_endpoint() {
    let stale = DEFAULT_CONFIG
        .replace(
            "- type: queue-scorer\n",
            "- type: queue-scorer\n  parameters: {countDispatched: false}\n",
        )
        .replace(
            "- type: kv-cache-utilization-scorer\n",
            "- type: kv-cache-utilization-scorer\n  parameters: {countDispatched: false}\n",
        );
    assert_ne!(stale, DEFAULT_CONFIG);
    let picks = burst(&scheduler(&stale), 8);
    assert_eq!(picks, BTreeMap::from([(0, 8)]));
}

#[test]
fn queue_alone_spreads_and_kv_alone_spreads_by_prompt_size() {
    // Each signal on its own is enough to move the next request elsewhere.
    for (queue, kv) in [(true, false), (false, true)] {
        let text = DEFAULT_CONFIG
            .replace(
                "- type: queue-scorer\n",
                &format!("- type: queue-scorer\n  parameters: {{countDispatched: {queue}}}\n"),
            )
            .replace(
                "- type: kv-cache-utilization-scorer\n",
                &format!(
                    "- type: kv-cache-utilization-scorer\n  parameters: {{countDispatched: {kv}}}\n"
                ),
            );
        let picks = burst(&scheduler(&text), 8);
        assert_eq!(picks.len(), 4, "queue {queue}, kv {kv}: {picks:?}");
    }
}

#[test]
fn an_unknown_parameter_is_an_error() {
    let text = DEFAULT_CONFIG.replace(
        "- type: queue-scorer\n",
        "- type: queue-scorer\n  parameters: {countDispached: false}\n",
    );
    let err = EndpointPickerConfig::parse(&text, "epp.yaml")
        .unwrap()
        .build(&builtin_registry())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("countDispached"), "{err}");
}
