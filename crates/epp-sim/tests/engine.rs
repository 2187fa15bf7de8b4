//! The simulated engine's behaviour under load, in process, on tokio's paused
//! clock: time only moves when every task waits, so durations are exact and
//! nothing sleeps for real.
#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

mod common;

use std::{sync::Arc, time::Duration};

use clap::Parser;
use epp_sim::{
    config::SimConfig,
    engine::{Event, NewRequest, Outcome, Rejected, Sim},
    stats::FinishReason,
};
use tokio::{task::JoinHandle, time::Instant};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn sim(args: &[&str]) -> Arc<Sim> {
    let mut all = vec!["epp-sim"];
    all.extend_from_slice(args);
    Sim::new(SimConfig::parse_from(all))
}

fn req(model: &str, prompt: &str, max_tokens: u64) -> NewRequest {
    NewRequest {
        model: model.into(),
        prompt: prompt.into(),
        prompt_tokens: epp_sim::engine::count_tokens(prompt),
        max_tokens,
        ..NewRequest::default()
    }
}

/// Runs one request to the end; returns text, outcome and time to first token.
async fn run(s: &Sim, r: NewRequest) -> (String, Outcome, Duration) {
    let t0 = Instant::now();
    let mut g = s.submit(r).unwrap();
    let mut text = String::new();
    let mut ttft = None;
    loop {
        match g.next().await.unwrap() {
            Event::Token(t) => {
                ttft.get_or_insert(t0.elapsed());
                text.push_str(t);
            }
            Event::Done(o) => return (text, o, ttft.unwrap()),
        }
    }
}

fn spawn(s: &Arc<Sim>, r: NewRequest) -> JoinHandle<(String, Outcome, Duration)> {
    let s = Arc::clone(s);
    tokio::spawn(async move { run(&s, r).await })
}

/// Asserts `d` is `want` give or take timer rounding (1 ms per step).
#[track_caller]
fn assert_near(d: Duration, want: Duration) {
    let slack = Duration::from_millis(2) + want / 50;
    assert!(
        d + slack >= want && d <= want + slack,
        "{d:?} is not about {want:?}"
    );
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// (running, waiting) as the metrics report them.
fn load(s: &Sim) -> (usize, usize) {
    s.with_core(|c| (c.running(), c.waiting()))
}

#[tokio::test(start_paused = true)]
async fn requests_beyond_max_num_seqs_wait_in_fifo_order() {
    let s = sim(&["--max-num-seqs", "2", "--ttft-ms", "10", "--itl-ms", "10"]);
    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(spawn(&s, req(MODEL, &format!("prompt {i}"), 5)));
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(load(&s), (2, 1));
    let mut ttfts = Vec::new();
    for t in tasks {
        let (text, o, ttft) = t.await.unwrap();
        assert_eq!(o.completion_tokens, 5);
        assert_eq!(text.len(), 20, "four characters per generated token");
        ttfts.push(ttft);
    }
    assert_eq!(ttfts[0], ttfts[1], "the first two prefill in one step");
    assert!(
        ttfts[2] > Duration::from_millis(40),
        "the third waits for a slot: {ttfts:?}"
    );
    assert_eq!(load(&s), (0, 0));
    s.with_core(|c| {
        assert_eq!(c.stats.finished(FinishReason::Length), 3);
        assert_eq!(c.stats.generation_tokens, 15);
        assert_eq!(c.pool().used(), 0, "finished requests release their blocks");
        assert_eq!(c.stats.ttft.count(), 3);
        assert_eq!(c.stats.itl.count(), 12);
    });
}

#[tokio::test(start_paused = true)]
async fn a_repeated_prefix_is_served_from_cache_and_prefills_faster() {
    let s = sim(&["--ttft-ms", "1", "--prefill-us-per-token", "1000"]);
    let prompt = "x".repeat(64 * 10 + 7); // 10 full blocks of 16 tokens + a tail
    let (_, cold, cold_ttft) = run(&s, req(MODEL, &prompt, 1)).await;
    assert_eq!((cold.prompt_tokens, cold.cached_tokens), (162, 0));
    let (_, warm, warm_ttft) = run(&s, req(MODEL, &prompt, 1)).await;
    assert_eq!(
        warm.cached_tokens, 160,
        "ten cached blocks of sixteen tokens"
    );
    assert_near(cold_ttft, ms(1 + 162));
    assert_near(warm_ttft, ms(1 + 2));
    // Another name of the base model shares blocks; an adapter does not.
    let other = sim(&["--served-model-name", "alias", "--lora-modules", "sql"]);
    let _ = run(&other, req(MODEL, &prompt, 1)).await;
    assert_eq!(
        run(&other, req("alias", &prompt, 1)).await.1.cached_tokens,
        160
    );
    assert_eq!(run(&other, req("sql", &prompt, 1)).await.1.cached_tokens, 0);
    s.with_core(|c| {
        assert_eq!(c.stats.prefix_hits, 160);
        assert_eq!(c.stats.prefix_queries, 2 * 162);
    });
}

#[tokio::test(start_paused = true)]
async fn a_fully_cached_prompt_still_recomputes_its_last_token() {
    let s = sim(&[]);
    let prompt = "y".repeat(64 * 4); // exactly 4 blocks
    let _ = run(&s, req(MODEL, &prompt, 1)).await;
    let (_, o, _) = run(&s, req(MODEL, &prompt, 1)).await;
    assert_eq!(
        o.cached_tokens, 48,
        "the last block is recomputed, as in vLLM"
    );
}

#[tokio::test(start_paused = true)]
async fn the_cache_evicts_least_recently_freed_blocks() {
    // 8 blocks of 1 token (4 characters); each prompt fills 4.
    let s = sim(&["--num-gpu-blocks", "8", "--block-size", "1"]);
    let a = "aaaabbbbccccdddd";
    let b = "eeeeffffgggghhhh";
    let _ = run(&s, req(MODEL, a, 1)).await;
    let _ = run(&s, req(MODEL, b, 1)).await;
    assert_eq!(s.with_core(|c| c.pool().cached_blocks()), 8);
    assert_eq!(run(&s, req(MODEL, b, 1)).await.1.cached_tokens, 3);
    // c needs 4 new blocks: a's, the least recently freed, make room.
    let _ = run(&s, req(MODEL, "iiiijjjjkkkkllll", 1)).await;
    assert_eq!(
        run(&s, req(MODEL, b, 1)).await.1.cached_tokens,
        3,
        "b survives"
    );
    assert_eq!(
        run(&s, req(MODEL, a, 1)).await.1.cached_tokens,
        0,
        "a evicted"
    );
}

/// vLLM caches the blocks of generated tokens too: a request's output
/// stays cached after it (blocks of 4 tokens: 8 prompt tokens and 9 output
/// tokens fill 4 blocks, the 17th token's is partial), and long outputs
/// crowd cached prompts out. Without the flag only prompts are cached.
#[tokio::test(start_paused = true)]
async fn generated_blocks_are_cached_and_crowd_out_prompts() {
    let prompt = |c: char| c.to_string().repeat(32); // 8 tokens, 2 blocks
    for (flag, cached_after_a, a_survives) in [(true, 4, false), (false, 2, true)] {
        let mut args = vec!["--num-gpu-blocks", "8", "--block-size", "4"];
        if flag {
            args.push("--cache-output-blocks");
        }
        let s = sim(&args);
        let _ = run(&s, req(MODEL, &prompt('a'), 9)).await;
        assert_eq!(
            s.with_core(|c| c.pool().cached_blocks()),
            cached_after_a,
            "--cache-output-blocks {flag}"
        );
        // b and its output take the 4 blocks left; then c's 16-token prompt
        // needs 4: with outputs cached the pool must evict a's 4 (its output
        // first, then its prompt from the tail).
        let _ = run(&s, req(MODEL, &prompt('b'), 9)).await;
        let _ = run(&s, req(MODEL, &"c".repeat(64), 1)).await;
        let hit = run(&s, req(MODEL, &prompt('a'), 1)).await.1.cached_tokens;
        assert_eq!(hit > 0, a_survives, "--cache-output-blocks {flag}: {hit}");
    }
}

#[tokio::test(start_paused = true)]
async fn kv_usage_counts_the_blocks_running_requests_hold() {
    let s = sim(&["--num-gpu-blocks", "100", "--itl-ms", "10"]);
    let t = spawn(&s, req(MODEL, &"z".repeat(64 * 5), 20)); // 80 prompt tokens
    tokio::time::sleep(Duration::from_millis(30)).await;
    let kv = s.with_core(|c| c.kv_usage());
    assert!(
        (0.05..=0.07).contains(&kv),
        "5 prompt blocks + 1 for output: {kv}"
    );
    t.await.unwrap();
    assert_eq!(s.with_core(|c| c.kv_usage()), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_full_pool_preempts_the_newest_request_and_recomputes_it() {
    // 10 blocks of 4 tokens; two requests of 8 prompt tokens each growing to
    // 24 tokens (6 blocks each) cannot both fit.
    let s = sim(&["--num-gpu-blocks", "10", "--block-size", "4"]);
    let a = spawn(&s, req(MODEL, &"a".repeat(32), 16));
    let b = spawn(&s, req(MODEL, &"b".repeat(32), 16));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!((a.1.completion_tokens, b.1.completion_tokens), (16, 16));
    s.with_core(|c| {
        assert!(c.stats.preemptions >= 1, "{}", c.stats.preemptions);
        assert_eq!(c.pool().used(), 0);
    });
}

#[tokio::test(start_paused = true)]
async fn long_prompts_prefill_in_chunks_of_the_token_budget() {
    let s = sim(&[
        "--max-num-batched-tokens",
        "100",
        "--ttft-ms",
        "5",
        "--prefill-us-per-token",
        "1000",
    ]);
    let (_, _, ttft) = run(&s, req(MODEL, &"q".repeat(4 * 250), 1)).await;
    // Three steps (100 + 100 + 50 tokens), each paying the fixed cost.
    assert_near(ttft, ms(3 * 5 + 250));
}

#[tokio::test(start_paused = true)]
async fn decode_steps_slow_down_as_the_batch_grows() {
    let args = [
        "--itl-ms",
        "10",
        "--batch-slowdown",
        "0.1",
        "--ttft-ms",
        "0",
    ];
    let alone = sim(&args);
    let t0 = Instant::now();
    let _ = run(&alone, req(MODEL, "solo", 11)).await;
    let solo = t0.elapsed();
    let busy = sim(&args);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..11)
        .map(|i| spawn(&busy, req(MODEL, &format!("p{i}"), 11)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let batch = t0.elapsed();
    // 10 decode steps of 10 ms alone; with 11 running, each step is 2x.
    assert_near(solo, ms(100));
    assert_near(batch, ms(200));
}

#[tokio::test(start_paused = true)]
async fn adapters_load_on_demand_and_wait_for_a_free_slot() {
    let s = sim(&[
        "--lora-modules",
        "sql,chat",
        "--max-loras",
        "1",
        "--lora-load-ms",
        "100",
        "--ttft-ms",
        "0",
        "--itl-ms",
        "50",
    ]);
    let sql = spawn(&s, req("sql", "q", 4));
    tokio::time::sleep(Duration::from_millis(120)).await;
    let chat = spawn(&s, req("chat", "q", 1));
    let base = spawn(&s, req(MODEL, "q", 1));
    // The step in flight ends at 150 ms; the next one has admitted what fits.
    tokio::time::sleep(Duration::from_millis(40)).await;
    s.with_core(|c| {
        assert_eq!(c.resident_adapters(), ["sql"]);
        assert_eq!(c.running_adapters(), ["sql"]);
        assert_eq!(c.waiting_adapters(), ["chat"], "chat waits for sql's slot");
        assert_eq!(c.running(), 2, "the base model request went past it");
        let page = epp_sim::metrics::render(c, 0.0);
        let info = page
            .lines()
            .rfind(|l| l.starts_with("vllm:lora_requests_info{"))
            .unwrap();
        assert!(info.contains("running_lora_adapters=\"sql\""), "{info}");
        assert!(info.contains("waiting_lora_adapters=\"chat\""), "{info}");
        assert!(info.contains("max_lora=\"1\""), "{info}");
    });
    let (_, _, sql_ttft) = sql.await.unwrap();
    assert_near(sql_ttft, ms(100));
    chat.await.unwrap();
    base.await.unwrap();
    s.with_core(|c| {
        assert_eq!(c.resident_adapters(), ["chat"], "sql was unloaded for chat");
        assert!(c.waiting_adapters().is_empty());
        assert_eq!(c.stats.lora_loads, 2);
    });
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_frees_its_slot() {
    let s = sim(&["--max-num-seqs", "1", "--itl-ms", "10"]);
    let g = s.submit(req(MODEL, "long", 1000)).unwrap();
    let queued = s.submit(req(MODEL, "next", 1000)).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(load(&s), (1, 1));
    drop(queued);
    drop(g);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(load(&s), (0, 0));
    s.with_core(|c| {
        assert_eq!(
            c.stats.finished(FinishReason::Abort),
            2,
            "running and queued"
        );
        assert_eq!(c.pool().used(), 0);
    });
}

#[tokio::test(start_paused = true)]
async fn admin_extra_waiting_is_reported_and_slows_the_server() {
    let s = sim(&["--max-num-seqs", "10", "--itl-ms", "10", "--ttft-ms", "10"]);
    let (_, _, fast) = run(&s, req(MODEL, "a", 1)).await;
    s.with_core(|c| c.knobs.extra_waiting = 10);
    let (_, _, slow) = run(&s, req(MODEL, "a", 1)).await;
    assert_near(slow, fast * 2);
    let page = s.with_core(|c| epp_sim::metrics::render(c, 0.0));
    assert!(page.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 10.0"));
}

#[tokio::test(start_paused = true)]
async fn too_long_requests_are_refused() {
    let s = sim(&["--num-gpu-blocks", "4", "--block-size", "4"]);
    let r = s.submit(req(MODEL, &"x".repeat(40), 10));
    assert_eq!(
        r.err(),
        Some(Rejected::TooLong {
            tokens: 20,
            max_model_len: 16
        })
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_run() {
    async fn trace(seed: &str) -> Vec<(String, u64)> {
        let s = sim(&["--seed", seed]);
        let mut out = Vec::new();
        for i in 0..5 {
            let id = s.next_id();
            let (text, ..) = run(&s, req(MODEL, &format!("prompt {i}"), 8)).await;
            out.push((text, id));
        }
        out
    }
    assert_eq!(trace("7").await, trace("7").await);
    assert_ne!(trace("7").await, trace("8").await);
}

#[tokio::test(start_paused = true)]
async fn every_engine_page_parses_as_prometheus_text() {
    for engine in ["vllm", "sglang", "trtllm-serve", "triton"] {
        let s = sim(&["--engine", engine, "--lora-modules", "a"]);
        let _ = run(&s, req(MODEL, "warm up the histograms", 3)).await;
        s.with_core(|c| {
            c.knobs.gauges.insert("gpu_temp{gpu=\"0\"}".into(), 71.5);
            c.knobs.gauges.insert("gpu_temp{gpu=\"1\"}".into(), 60.0);
        });
        let page = s.with_core(|c| epp_sim::metrics::render(c, 1.0));
        let samples = common::prom::parse(&page).unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert!(samples.len() > 5, "{engine}: {page}");
        let temp = samples
            .iter()
            .find(|s| s.name == "gpu_temp" && s.label("gpu") == Some("1"));
        assert_eq!(temp.map(|s| s.value), Some(60.0), "{engine}");
        let pod = samples.iter().find(|s| s.name == "epp_sim_info");
        assert!(
            pod.is_some_and(|s| s.label("pod") == Some("sim")),
            "{engine}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_engine_queues_requests_until_it_resumes() {
    let s = sim(&[]);
    s.with_core(|c| c.knobs.stall = true);
    let t = spawn(&s, req(MODEL, "stuck", 2));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(load(&s), (0, 1));
    s.with_core(|c| c.knobs.stall = false);
    s.poke();
    assert_eq!(t.await.unwrap().1.completion_tokens, 2);
}

/// P/D: a request whose prompt was prefilled elsewhere computes only its last
/// prompt token here, and the transferred blocks stay cached for the next
/// request with that prefix.
#[tokio::test(start_paused = true)]
async fn a_remotely_prefilled_request_skips_its_prefill_and_keeps_the_blocks() {
    let s = sim(&["--ttft-ms", "1", "--prefill-us-per-token", "1000"]);
    let prompt = "x".repeat(4 * 400); // 400 tokens: 400 ms to prefill here
    let remote = NewRequest {
        remote_prefill: true,
        ..req(MODEL, &prompt, 2)
    };
    let (_, o, ttft) = run(&s, remote).await;
    // One step: 1 ms fixed + the last token's 1 ms.
    assert_near(ttft, ms(2));
    assert_eq!(o.cached_tokens, 0, "nothing was cached here before");
    let (_, warm, ttft) = run(&s, req(MODEL, &prompt, 2)).await;
    assert_eq!(
        warm.cached_tokens, 384,
        "24 full blocks kept from the transfer"
    );
    assert_near(ttft, ms(1 + 16));
    let (_, cold, ttft) = run(&s, req(MODEL, &"y".repeat(4 * 400), 2)).await;
    assert_eq!(cold.cached_tokens, 0);
    assert_near(ttft, ms(1 + 400));
}
