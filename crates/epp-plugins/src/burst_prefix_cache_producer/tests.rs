use epp_core::EndpointMetrics;

use super::*;
use crate::testing::{candidates, with_cx};

/// 64-token blocks are 256 characters.
const BLOCK: usize = 256;

fn producer(yaml: &str) -> BurstPrefixCacheProducer {
    BurstPrefixCacheProducer::build("b", serde_yaml_ng::from_str(yaml).unwrap()).unwrap()
}

fn request(id: &str, prompt: &str) -> InferenceRequest {
    InferenceRequest::builder("m")
        .request_id(id)
        .prompt(prompt)
        .build()
}

/// Holds every `(id, prompt)` in one window, then schedules each over `c`:
/// the endpoint index each was steered to (the one holding all its blocks
/// in the producer's matches), `None` for no affinity.
fn steer(
    p: &BurstPrefixCacheProducer,
    c: &[Candidate],
    reqs: &[(&str, String)],
) -> Vec<Option<usize>> {
    let t0 = Instant::now();
    let ends: Vec<_> = reqs
        .iter()
        .map(|(id, prompt)| p.hold(&request(id, prompt), t0))
        .collect();
    assert!(
        ends.iter().all(|e| *e == ends[0] && e.is_some()),
        "one window"
    );
    reqs.iter()
        .map(|(id, prompt)| {
            let r = request(id, prompt);
            with_cx(&r, 0, |cx| {
                p.produce(cx, c);
                let m = &cx.state.prefix;
                assert!(m.computed);
                let hits: Vec<usize> = (0..c.len()).filter(|&i| m.matched(c[i].id()) > 0).collect();
                assert!(hits.len() <= 1);
                if let Some(&i) = hits.first() {
                    assert_eq!(
                        m.matched(c[i].id()) as usize,
                        m.total_blocks(),
                        "a full match"
                    );
                }
                hits.first().copied()
            })
        })
        .collect()
}

fn prompt(head: char, blocks: usize, tail: char) -> String {
    let mut s: String = std::iter::repeat_n(head, BLOCK).collect();
    s.extend(std::iter::repeat_n(tail, BLOCK * (blocks - 1)));
    s
}

#[test]
fn a_burst_of_one_prompt_goes_to_one_replica_and_the_next_to_another() {
    let p = producer("{}");
    let c = candidates(vec![EndpointMetrics::default(); 3]);
    let a = prompt('a', 3, 'x');
    let b = prompt('b', 3, 'y');
    let reqs: Vec<(&str, String)> = vec![
        ("1", a.clone()),
        ("2", b.clone()),
        ("3", a.clone()),
        ("4", b.clone()),
        ("5", a.clone()),
    ];
    let got = steer(&p, &c, &reqs);
    let (ra, rb) = (got[0].unwrap(), got[1].unwrap());
    assert_ne!(ra, rb, "two groups, two replicas: {got:?}");
    assert_eq!(got, vec![Some(ra), Some(rb), Some(ra), Some(rb), Some(ra)]);
}

#[test]
fn max_per_replica_spills_a_group_to_the_next_least_loaded() {
    let p = producer("{maxPerReplica: 2}");
    let c = candidates(vec![EndpointMetrics::default(); 3]);
    let a = prompt('a', 2, 'x');
    let reqs: Vec<(&str, String)> = (0..4)
        .map(|i| (["1", "2", "3", "4"][i], a.clone()))
        .collect();
    let got = steer(&p, &c, &reqs);
    let mut per = [0; 3];
    for g in &got {
        per[g.unwrap()] += 1;
    }
    per.sort_unstable();
    assert_eq!(per, [0, 2, 2], "{got:?}");
}

#[test]
fn a_request_sharing_nothing_gets_no_affinity() {
    let p = producer("{}");
    let c = candidates(vec![EndpointMetrics::default(); 2]);
    let reqs = vec![("1", prompt('a', 2, 'x')), ("2", prompt('b', 2, 'y'))];
    assert_eq!(steer(&p, &c, &reqs), vec![None, None]);
}

#[test]
fn min_colocate_blocks_puts_prompts_sharing_a_head_together() {
    // x (2 requests) and the single y share their first block; z (4) is
    // unrelated. 7 requests over 2 replicas: a fair share of 4. x goes to
    // one replica, z to the other (least loaded), and y joins x, which holds
    // its head and is below its share.
    let c = candidates(vec![EndpointMetrics::default(); 2]);
    let (x, y, z) = (
        prompt('h', 3, 'x'),
        prompt('h', 3, 'y'),
        prompt('z', 3, 'z'),
    );
    let reqs = vec![
        ("x1", x.clone()),
        ("z1", z.clone()),
        ("y", y.clone()),
        ("x2", x.clone()),
        ("z2", z.clone()),
        ("z3", z.clone()),
        ("z4", z.clone()),
    ];
    let got = steer(&producer("{minColocateBlocks: 1}"), &c, &reqs);
    assert_eq!(got[2], got[0], "y joins x: {got:?}");
    assert_ne!(got[0], got[1]);
    // Without the option a single request sharing only a head gets nothing.
    let got = steer(&producer("{}"), &c, &reqs);
    assert_eq!(got[2], None, "{got:?}");
    // The fair share bounds it: x (2) and y (2) over 2 replicas split.
    let reqs = vec![("1", x.clone()), ("2", y.clone()), ("3", x), ("4", y)];
    let got = steer(&producer("{minColocateBlocks: 1}"), &c, &reqs);
    assert_eq!((got[0], got[1]), (got[2], got[3]));
    assert_ne!(got[0], got[1], "{got:?}");
}

#[test]
fn the_window_and_the_batch_limit() {
    let p = producer("{windowDurationMs: 50, maxBatchSize: 2}");
    let t0 = Instant::now();
    let end = p.hold(&request("1", "x"), t0).unwrap();
    assert_eq!(end, t0 + Duration::from_millis(50));
    assert_eq!(
        p.hold(&request("2", "x"), t0 + Duration::from_millis(10)),
        Some(end)
    );
    assert_eq!(
        p.hold(&request("3", "x"), t0 + Duration::from_millis(20)),
        None,
        "batch full"
    );
    let next = p
        .hold(&request("4", "x"), t0 + Duration::from_millis(60))
        .unwrap();
    assert_eq!(next, t0 + Duration::from_millis(110), "a new window");
}

#[test]
fn a_request_that_was_not_held_gets_no_affinity() {
    let p = producer("{}");
    let c = candidates(vec![EndpointMetrics::default(); 2]);
    let r = request("never-held", &prompt('a', 2, 'x'));
    with_cx(&r, 0, |cx| {
        p.produce(cx, &c);
        assert!(cx.state.prefix.computed);
        assert!(!cx.state.prefix.any_hit());
    });
}

#[test]
fn llm_ds_checks() {
    for bad in [
        "{windowDurationMs: 0}",
        "{windowDurationMs: 10001}",
        "{maxPerReplica: 0}",
        "{blockSizeTokens: 0}",
        "{maxPrefixTokensToMatch: 10}",
        "{minColocateBlocks: -1}",
        "{maxBatchSize: 0}",
        "{balanceBy: bytes}",
    ] {
        let params: BurstPrefixParams = serde_yaml_ng::from_str(bad).unwrap();
        assert!(
            BurstPrefixCacheProducer::build("b", params).is_err(),
            "{bad}"
        );
    }
    assert!(serde_yaml_ng::from_str::<BurstPrefixParams>("{window: 1}").is_err());
}
