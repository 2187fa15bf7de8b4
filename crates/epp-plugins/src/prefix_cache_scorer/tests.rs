use std::sync::Arc;

use epp_core::{
    EndpointMetrics, InferenceRequest, PluginRef, Scheduler, SchedulingProfile,
    SingleProfileHandler,
};

use super::*;
use crate::{
    MaxScorePicker, PickerParams,
    testing::{candidates, snapshot},
};

fn scheduler(scorer: &Arc<PrefixCacheScorer>, extra: Option<PluginRef>) -> Scheduler {
    let picker = Arc::new(MaxScorePicker::build("pick", PickerParams::default()).unwrap());
    let profile = SchedulingProfile::new("default")
        .with_scorer(PluginRef::new(scorer.clone()), 1.0)
        .with_picker(PluginRef::new(picker));
    let mut hooks = vec![PluginRef::new(scorer.clone())];
    hooks.extend(extra);
    Scheduler::new(vec![profile], Arc::new(SingleProfileHandler::default()))
        .unwrap()
        .with_hooks(hooks)
}

#[test]
fn score_is_the_contiguous_matched_fraction() {
    let s = PrefixCacheScorer::build("p", PrefixCacheScorerParams::default()).unwrap();
    let c = candidates(vec![EndpointMetrics::default(); 3]);
    let req = InferenceRequest::builder("m").build();
    let out = crate::testing::with_cx(&req, 0, |cx| {
        cx.state.prefix.hashes = vec![1, 2, 3, 4];
        cx.state.prefix.computed = true;
        cx.state.prefix.set_matched(c[1].id(), 3);
        cx.state.prefix.set_matched(c[2].id(), 4);
        let mut out = vec![0.0; 3];
        s.score(cx, &c, &mut out);
        out
    });
    assert_eq!(out, vec![0.0, 0.75, 1.0]);
}

#[test]
fn a_scheduled_prefix_sticks_to_its_endpoint() {
    let scorer =
        Arc::new(PrefixCacheScorer::build("prefix", PrefixCacheScorerParams::default()).unwrap());
    let scheduler = scheduler(&scorer, None);
    let snapshot = snapshot(8);
    let system = "You are a helpful assistant. ".repeat(40);
    let ask = |q: &str, salt: Option<&str>| {
        let mut b = InferenceRequest::builder("m").prompt(format!("{system} {q}"));
        if let Some(s) = salt {
            b = b.cache_salt(s);
        }
        scheduler.schedule(&b.build(), &snapshot).unwrap()
    };
    let home = ask("Q1", None).primary().unwrap().id();
    for q in 2..20 {
        let r = ask(&format!("Q{q}"), None);
        assert_eq!(r.primary().unwrap().id(), home);
        assert!(r.primary_run().unwrap().scores[0] > 0.9);
    }
    // Another tenant's salt does not share the cache.
    assert_eq!(ask("Q1", Some("t2")).primary_run().unwrap().scores[0], 0.0);
}

/// Schedules a prompt of ~1,160 characters, a system prompt (18 blocks of 64
/// characters) then `q`.
fn ask_after_system(
    scheduler: &Scheduler,
    snapshot: &epp_core::EndpointSnapshot,
    q: &str,
) -> epp_core::SchedulingResult {
    let system = "You are a helpful assistant. ".repeat(40);
    let req = InferenceRequest::builder("m")
        .prompt(format!("{system} {q}"))
        .build();
    scheduler.schedule(&req, snapshot).unwrap()
}

#[test]
fn recorded_in_background_the_next_decision_still_sees_the_last() {
    let params: PrefixCacheScorerParams =
        serde_yaml_ng::from_str("{recordInBackground: true}").unwrap();
    let scorer = Arc::new(PrefixCacheScorer::build("prefix", params).unwrap());
    assert!(scorer.index().is_background());
    let scheduler = scheduler(&scorer, None);
    let snapshot = snapshot(8);
    // No flush between decisions: a read applies what the writer has not.
    let ask = |q: &str| ask_after_system(&scheduler, &snapshot, q);
    let home = ask("Q1").primary().unwrap().id();
    assert_eq!(
        scorer.index().len_for(home),
        18,
        "1,163 characters in 64-character blocks"
    );
    for q in 2..20 {
        let r = ask(&format!("Q{q}"));
        assert_eq!(r.primary().unwrap().id(), home);
        assert!(r.primary_run().unwrap().scores[0] > 0.9);
    }
    // The last decision's record waits for the writer or the next read.
    assert!(scorer.index().len_for(home) >= 18);
    assert_eq!(scorer.index().queued_records(), 0, "the read applied it");
    // Only `recordMode: writer` starts a writer thread.
    let default: PrefixCacheScorerParams = serde_yaml_ng::from_str("{}").unwrap();
    assert!(
        !PrefixCacheScorer::build("p", default)
            .unwrap()
            .index()
            .is_background()
    );
    // The writer needs no one to run deferred work.
    assert!(!scheduler.has_deferred_work());
}

#[test]
fn recorded_after_the_reply_the_record_waits_for_the_server_or_the_next_read() {
    let params: PrefixCacheScorerParams =
        serde_yaml_ng::from_str("{recordMode: afterReply}").unwrap();
    let scorer = Arc::new(PrefixCacheScorer::build("prefix", params).unwrap());
    assert!(scorer.index().records_after_reply() && !scorer.index().is_background());
    let scheduler = scheduler(&scorer, None);
    assert!(scheduler.has_deferred_work());
    let snapshot = snapshot(8);
    let ask = |q: &str| ask_after_system(&scheduler, &snapshot, q);
    let home = ask("Q1").primary().unwrap().id();
    // Decided, the record queued: nothing applies it but a caller.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(scorer.index().queued_records(), 1);
    // The server, once its reply is written.
    scheduler.run_deferred();
    assert_eq!(scorer.index().queued_records(), 0);
    assert_eq!(scorer.index().len_for(home), 18);
    // Without it, the next decision's read applies the last record first.
    for q in 2..20 {
        let r = ask(&format!("Q{q}"));
        assert_eq!(r.primary().unwrap().id(), home);
        assert!(r.primary_run().unwrap().scores[0] > 0.9);
        assert_eq!(scorer.index().queued_records(), 1, "only this decision's");
    }
    // In place: nothing left over, nothing to run.
    let params: PrefixCacheScorerParams = serde_yaml_ng::from_str("{recordMode: inPlace}").unwrap();
    let scorer = Arc::new(PrefixCacheScorer::build("prefix", params).unwrap());
    let in_place = self::scheduler(&scorer, None);
    assert!(!in_place.has_deferred_work());
    let home = ask_after_system(&in_place, &snapshot, "Q1");
    assert_eq!(scorer.index().queued_records(), 0);
    assert_eq!(scorer.index().len_for(home.primary().unwrap().id()), 18);
}

#[test]
fn by_default_records_are_timed_and_the_server_runs_what_they_leave() {
    let default: PrefixCacheScorerParams = serde_yaml_ng::from_str("{}").unwrap();
    let scorer = Arc::new(PrefixCacheScorer::build("prefix", default).unwrap());
    // It may queue, so the server is asked to run what it leaves; no thread.
    let scheduler = scheduler(&scorer, None);
    assert!(scheduler.has_deferred_work() && !scorer.index().is_background());
    let snapshot = snapshot(8);
    let home = ask_after_system(&scheduler, &snapshot, "Q0")
        .primary()
        .unwrap()
        .id();
    for q in 1..40 {
        // Queued or not (that depends on this machine's speed), every
        // decision sees the records before it.
        let r = ask_after_system(&scheduler, &snapshot, &format!("Q{q}"));
        assert_eq!(r.primary().unwrap().id(), home);
        assert!(r.primary_run().unwrap().scores[0] > 0.9);
        scheduler.run_deferred();
        assert_eq!(scorer.index().queued_records(), 0);
    }
    assert!(scorer.index().record_cost().is_some(), "records were timed");
}

#[test]
fn record_mode_is_named_or_given_as_the_older_flag() {
    // The scorer and the producer take the same spellings.
    let scorer = |yaml: &str| {
        serde_yaml_ng::from_str::<PrefixCacheScorerParams>(yaml)
            .map(|p| p.index.record_mode)
            .map_err(|e| e.to_string())
    };
    let producer = |yaml: &str| {
        serde_yaml_ng::from_str::<PrefixCacheParams>(yaml)
            .map(|p| p.record_mode)
            .map_err(|e| e.to_string())
    };
    for (yaml, want) in [
        ("{}", RecordMode::Auto),
        ("{recordMode: auto}", RecordMode::Auto),
        ("{recordMode: inPlace}", RecordMode::InPlace),
        ("{recordMode: afterReply}", RecordMode::AfterReply),
        ("{recordMode: writer}", RecordMode::Writer),
        ("{recordInBackground: true}", RecordMode::Writer),
        ("{recordInBackground: false}", RecordMode::InPlace),
    ] {
        assert_eq!(scorer(yaml), Ok(want), "{yaml}");
        assert_eq!(producer(yaml), Ok(want), "{yaml}");
    }
    for (yaml, says) in [
        ("{recordMode: later}", ["later", "afterReply"]),
        ("{recordMode: 3}", ["3", "inPlace"]),
        (
            "{recordMode: writer, recordInBackground: false}",
            ["duplicate field", "recordMode"],
        ),
    ] {
        for err in [scorer(yaml).unwrap_err(), producer(yaml).unwrap_err()] {
            assert!(says.iter().all(|s| err.contains(s)), "{yaml}: {err}");
        }
    }
}

#[test]
fn a_declared_producer_feeds_the_scorer_and_owns_the_index() {
    let scorer =
        Arc::new(PrefixCacheScorer::build("prefix", PrefixCacheScorerParams::default()).unwrap());
    let producer = Arc::new(
        ApproxPrefixCacheProducer::build("producer", PrefixCacheParams::default()).unwrap(),
    );
    // Declared after the scorer: the scheduler still runs it first.
    let scheduler = scheduler(&scorer, Some(PluginRef::new(producer.clone())));
    let snapshot = snapshot(4);
    let prompt = "x".repeat(64 * 10);
    let first = scheduler
        .schedule(
            &InferenceRequest::builder("m")
                .prompt(prompt.clone())
                .build(),
            &snapshot,
        )
        .unwrap();
    let again = scheduler
        .schedule(
            &InferenceRequest::builder("m").prompt(prompt).build(),
            &snapshot,
        )
        .unwrap();
    assert_eq!(first.primary().unwrap().id(), again.primary().unwrap().id());
    assert_eq!(again.primary_run().unwrap().scores[0], 1.0);
    assert_eq!(producer.index().entries(), 10);
    assert_eq!(
        scorer.index().entries(),
        0,
        "hashes computed and recorded once"
    );
}

/// An endpoint's list holds as many prompts as its engine would: a prompt
/// longer than `maxPrefixBlocksToMatch` is recorded by its first blocks,
/// but counts against the capacity (the engine's) with all of them.
#[test]
fn prompts_longer_than_the_match_cap_count_with_all_their_blocks() {
    // Capacity 20 blocks of 64 characters, 4 recorded per prompt at most.
    let params: PrefixCacheScorerParams =
        serde_yaml_ng::from_str("{maxPrefixBlocksToMatch: 4, lruCapacityPerServer: 20}").unwrap();
    // (blocks per prompt, prompts the engine holds, entries that stand for them)
    for (blocks, held, entries) in [(10, 2, 8), (4, 5, 20), (5, 4, 16)] {
        let scorer = Arc::new(PrefixCacheScorer::build("prefix", params.clone()).unwrap());
        let scheduler = scheduler(&scorer, None);
        let snapshot = snapshot(1);
        let prompt = |tenant: usize| format!("{tenant:>64}").repeat(blocks);
        // The score a tenant's prompt gets (before its own record).
        let ask = |tenant: usize| {
            let req = InferenceRequest::builder("m")
                .prompt(prompt(tenant))
                .build();
            let r = scheduler.schedule(&req, &snapshot).unwrap();
            r.primary_run().unwrap().scores[0]
        };
        for tenant in 0..8 {
            assert_eq!(ask(tenant), 0.0, "{blocks} blocks: a new tenant");
        }
        let id = snapshot.endpoints()[0].id();
        assert_eq!(scorer.index().len_for(id), entries, "{blocks} blocks");
        // The last `held` tenants are remembered, the one before is not.
        assert_eq!(ask(8 - held - 1), 0.0, "{blocks} blocks: evicted");
        for tenant in 8 - held + 1..8 {
            assert_eq!(ask(tenant), 1.0, "{blocks} blocks: tenant {tenant} held");
        }
    }
}
