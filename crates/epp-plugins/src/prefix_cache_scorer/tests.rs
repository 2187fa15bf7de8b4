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

#[test]
fn recorded_in_background_the_next_decision_still_sees_the_last() {
    let params: PrefixCacheScorerParams =
        serde_yaml_ng::from_str("{recordInBackground: true}").unwrap();
    let scorer = Arc::new(PrefixCacheScorer::build("prefix", params).unwrap());
    assert!(scorer.index().is_background());
    let scheduler = scheduler(&scorer, None);
    let snapshot = snapshot(8);
    let system = "You are a helpful assistant. ".repeat(40);
    // No flush between decisions: a read applies what the writer has not.
    let ask = |q: &str| {
        let req = InferenceRequest::builder("m")
            .prompt(format!("{system} {q}"))
            .build();
        scheduler.schedule(&req, &snapshot).unwrap()
    };
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
    // The default records in the decision.
    let in_place: PrefixCacheScorerParams = serde_yaml_ng::from_str("{}").unwrap();
    assert!(
        !PrefixCacheScorer::build("p", in_place)
            .unwrap()
            .index()
            .is_background()
    );
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
