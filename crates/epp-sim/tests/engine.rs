//! The simulated engine's behaviour under load, on tokio's paused clock.

use std::{sync::Arc, time::Duration};

use clap::Parser;
use epp_sim::{config::SimConfig, engine::Sim, metrics::render};

fn sim(args: &[&str]) -> Arc<Sim> {
    let mut all = vec!["epp-sim"];
    all.extend_from_slice(args);
    Sim::new(SimConfig::parse_from(all))
}

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

#[tokio::test(start_paused = true)]
async fn requests_beyond_max_num_seqs_wait_in_fifo_order() {
    let s = sim(&["--max-num-seqs", "2", "--ttft-ms", "10", "--itl-ms", "10"]);
    let mut tasks = Vec::new();
    for i in 0..3 {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let mut g = s.start(MODEL, &format!("prompt {i}"), 3, 5).await;
            while !g.done() {
                g.next_token().await;
            }
            g.finish()
        }));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    {
        let st = s.state.lock();
        assert_eq!((st.running, st.waiting), (2, 1));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().completion_tokens, 5);
    }
    let st = s.state.lock();
    assert_eq!(
        (st.running, st.waiting, st.request_success_total),
        (0, 0, 3)
    );
    assert_eq!(
        st.blocks_in_use, 0,
        "finished requests release their KV blocks"
    );
}

#[tokio::test(start_paused = true)]
async fn a_repeated_prefix_is_served_from_cache_and_prefills_faster() {
    let s = sim(&[
        "--ttft-ms",
        "1",
        "--prefill-us-per-token",
        "1000",
        "--block-size",
        "16",
    ]);
    let prompt = "x".repeat(64 * 10 + 7); // 10 full blocks of 16 tokens (64 chars)
    let tokens = epp_sim::engine::count_tokens(&prompt);

    let t0 = tokio::time::Instant::now();
    let g = s.start(MODEL, &prompt, tokens, 1).await;
    let cold = t0.elapsed();
    assert_eq!(g.cached_tokens, 0);
    let _ = g.finish();

    let t1 = tokio::time::Instant::now();
    let g = s.start(MODEL, &prompt, tokens, 1).await;
    let warm = t1.elapsed();
    assert_eq!(g.cached_tokens, 160, "ten cached blocks of sixteen tokens");
    assert!(
        warm < cold / 10,
        "prefill only the uncached tail: {warm:?} vs {cold:?}"
    );
    let _ = g.finish();

    let st = s.state.lock();
    assert_eq!(st.prefix_hits_total, 160);
    assert_eq!(st.prefix_queries_total, 2 * tokens);
}

#[tokio::test(start_paused = true)]
async fn the_cache_evicts_least_recently_used_blocks() {
    let s = sim(&[
        "--num-gpu-blocks",
        "4",
        "--block-size",
        "1",
        "--ttft-ms",
        "0",
    ]);
    // Four one-token blocks per prompt: a second distinct prompt evicts the first.
    let a = "aaaabbbbccccdddd";
    let b = "eeeeffffgggghhhh";
    let _ = s.start(MODEL, a, 4, 1).await.finish();
    let _ = s.start(MODEL, b, 4, 1).await.finish();
    let g = s.start(MODEL, a, 4, 1).await;
    assert_eq!(g.cached_tokens, 0, "a was evicted by b");
    let _ = g.finish();
    let g = s.start(MODEL, a, 4, 1).await;
    assert_eq!(g.cached_tokens, 4);
    let _ = g.finish();
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
    let first = {
        let s = Arc::clone(&s);
        tokio::spawn(async move {
            let mut g = s.start("sql", "q", 1, 4).await;
            while !g.done() {
                g.next_token().await;
            }
            g.finish()
        })
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    let second = {
        let s = Arc::clone(&s);
        tokio::spawn(async move { s.start("chat", "q", 1, 1).await.finish() })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    {
        let st = s.state.lock();
        assert_eq!(st.loras, vec![("sql".to_owned(), 1)]);
        assert_eq!(st.lora_waiting.get("chat"), Some(&1));
        let page = render(&s.cfg, &st, 0.0);
        assert!(page.contains("running_lora_adapters=\"sql\""), "{page}");
        assert!(page.contains("waiting_lora_adapters=\"chat\""), "{page}");
    }
    first.await.unwrap();
    second.await.unwrap();
    let st = s.state.lock();
    assert_eq!(
        st.loras,
        vec![("chat".to_owned(), 0)],
        "sql was unloaded for chat"
    );
    assert!(st.lora_waiting.is_empty());
}

#[test]
fn every_engine_page_parses_as_prometheus_text() {
    for engine in ["vllm", "sglang", "trtllm-serve", "triton"] {
        let s = sim(&["--engine", engine, "--lora-modules", "a"]);
        s.state
            .lock()
            .gauges
            .insert("gpu_temp{gpu=\"0\"}".into(), 71.5);
        s.state
            .lock()
            .gauges
            .insert("gpu_temp{gpu=\"1\"}".into(), 60.0);
        let page = render(&s.cfg, &s.state.lock(), 1.0);
        let mut samples = 0;
        for line in page.lines() {
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("series and value");
            assert!(
                value.parse::<f64>().is_ok(),
                "{engine}: bad value in {line:?}"
            );
            let name = series.split('{').next().unwrap();
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "{engine}: bad name in {line:?}"
            );
            if let Some(labels) = series.strip_prefix(name) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                    "{line:?}"
                );
            }
            samples += 1;
        }
        assert!(samples > 5, "{engine}: {page}");
        assert!(page.contains("gpu_temp{gpu=\"1\"} 60.0"), "{engine}");
        assert_eq!(page.matches("# TYPE gpu_temp gauge").count(), 1, "{engine}");
    }
}
