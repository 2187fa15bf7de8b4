//! Prefix affinity with the default config: requests sharing a long prefix
//! keep going to the simulator that cached it, while unrelated prompts spread.

use std::{collections::HashMap, time::Duration};

use epp_test_support::{
    http,
    process::{BodyMode, Stack},
};

async fn served_by(stack: &Stack, prompt: String) -> usize {
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "prompt": prompt,
        "max_tokens": 2,
    });
    let r = http::post_json(stack.envoy.port, "/v1/completions", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    stack
        .sim_index(r.header("x-inference-pod").unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_stick_while_unrelated_prompts_spread() {
    let stack = Stack::start("prefix", 4, &[], &[], BodyMode::Streamed);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Four tenants with 8 KiB system prompts, interleaved.
    let groups = 4;
    let per_group = 8;
    let mut homes: Vec<HashMap<usize, usize>> = vec![HashMap::new(); groups];
    for round in 0..per_group {
        for (g, home) in homes.iter_mut().enumerate() {
            let prefix = format!("Tenant {g} system prompt: be precise and kind. ").repeat(180);
            let sim = served_by(&stack, format!("{prefix}\nQuestion {round}?")).await;
            *home.entry(sim).or_default() += 1;
        }
    }
    for (g, home) in homes.iter().enumerate() {
        let (&sim, &n) = home.iter().max_by_key(|(_, n)| **n).unwrap();
        assert!(
            n >= per_group - 1,
            "tenant {g} should stick to one simulator (best: sim-{sim} with {n}/{per_group}): {home:?}"
        );
    }

    // Unrelated short prompts: no prefix to follow, so the load spreads.
    let mut counts = [0usize; 4];
    for i in 0..40 {
        counts[served_by(&stack, format!("unrelated prompt {i} {}", i * 7919)).await] += 1;
    }
    let used = counts.iter().filter(|&&c| c > 0).count();
    let max = counts.iter().max().copied().unwrap_or(0);
    assert!(
        used >= 3 && max <= 20,
        "unrelated prompts should spread: {counts:?}"
    );
}
