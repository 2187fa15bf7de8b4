//! The precise prefix index (issue 16's targets: ingestion ≥ 1M block
//! events/s on one core, lookup of a 16K-token prompt across 64 endpoints
//! ≤ 5 µs, in-process tokenization of 16 KiB ≤ 200 µs).
//!
//! - `ingest`: batches of one `BlockStored` (16 blocks of 16 tokens, chained
//!   on the previous one) and, once an endpoint holds 4,096 blocks, one
//!   `BlockRemoved` of its 16 oldest, round-robin over 64 endpoints; the
//!   throughput is in block events (stored + removed).
//! - `lookup-16k`: keying a 16,384-token prompt (1,024 blocks) and matching
//!   it when 8 of 64 endpoints hold all of it and 8 hold its first half;
//!   `lookup-16k-keys-only` and `lookup-16k-match-only` split the two;
//!   `lookup-16k-blocks-of-64…` the same in blocks of 64 tokens (256
//!   blocks), llm-d's shipped precise config.
//! - `tokenize-16k/{crate,fast}`: the test tokenizer (byte-level BPE, GPT-2
//!   shape) on 16 KiB of English, by the `tokenizers` crate and by epp's
//!   `ByteBpe` (what `token-producer` runs), in the same run;
//!   `tokenize-16k-varied/…` on 16 KiB of mostly unseen words (few word-cache
//!   hits); `tokenize-16k-llama3/…` with the Llama 3-shaped test tokenizer.
//! - `chat-16k/rendered`: a 16 KiB chat request (a long system prompt and
//!   six turns) rendered through a chat template in the shape of Llama 3's
//!   and tokenized, as the token producer does at the edge
//!   (`prompt_renderer`): the in-process path for chat.
//!
//! With mimalloc, as the `epp` binary runs.
//!
//! ```sh
//! cargo bench -p epp-plugins --bench kv_index
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::VecDeque;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use epp_core::{BlockStored, EndpointId, KvEvent, KvEventBatch, PrefixMatch};
use epp_plugins::{Builtin, KvBlockIndex, TokenProducer, TokenProducerParams};
use epp_test_support::{
    process::scratch_dir,
    tokenizer::{write_llama3_test_tokenizer, write_test_tokenizer},
};
use tokenizers::Tokenizer;

/// The `epp` binary's allocator: the tokenizer allocates per token.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ENDPOINTS: u32 = 64;
const BLOCK: usize = 16;
const PER_EVENT: usize = 16;
const HELD: usize = 4096;

/// One endpoint's engine: its chain and its blocks, oldest first.
struct Engine {
    next_hash: u64,
    parent: Option<u64>,
    held: VecDeque<u64>,
    token: u32,
}

fn ingest(c: &mut Criterion) {
    let index = KvBlockIndex::new(BLOCK, 1, 1 << 20);
    let mut engines: Vec<Engine> = (0..u64::from(ENDPOINTS))
        .map(|e| Engine {
            next_hash: e << 40,
            parent: None,
            held: VecDeque::new(),
            token: (e as u32).wrapping_mul(1_000_003),
        })
        .collect();
    let mut stored = KvEventBatch {
        events: vec![KvEvent::BlockStored(BlockStored {
            block_size: BLOCK as u32,
            medium: Some("GPU".into()),
            ..BlockStored::default()
        })],
        model: Some("m".into()),
        ..KvEventBatch::default()
    };
    let mut removed = KvEventBatch {
        events: vec![KvEvent::BlockRemoved {
            block_hashes: Vec::new(),
            medium: Some("GPU".into()),
        }],
        ..KvEventBatch::default()
    };
    let mut turn = 0usize;
    let mut step = |blocks: &mut u64| {
        let e = turn % engines.len();
        turn += 1;
        let eng = &mut engines[e];
        let id = EndpointId(e as u32);
        let KvEvent::BlockStored(s) = &mut stored.events[0] else {
            unreachable!()
        };
        s.block_hashes.clear();
        s.token_ids.clear();
        s.parent_block_hash = eng.parent;
        for _ in 0..PER_EVENT {
            eng.next_hash += 1;
            s.block_hashes.push(eng.next_hash);
            eng.held.push_back(eng.next_hash);
            for _ in 0..BLOCK {
                eng.token = eng.token.wrapping_add(7919);
                s.token_ids.push(eng.token);
            }
        }
        eng.parent = Some(eng.next_hash);
        index.apply(id, &stored);
        *blocks += PER_EVENT as u64;
        if eng.held.len() > HELD {
            let KvEvent::BlockRemoved { block_hashes, .. } = &mut removed.events[0] else {
                unreachable!()
            };
            block_hashes.clear();
            block_hashes.extend(eng.held.drain(..PER_EVENT));
            index.apply(id, &removed);
            *blocks += PER_EVENT as u64;
        }
    };
    // Warm up to the steady state: every endpoint holding HELD blocks.
    let mut blocks = 0;
    for _ in 0..(HELD / PER_EVENT + 2) * ENDPOINTS as usize {
        step(&mut blocks);
    }
    let mut g = c.benchmark_group("kv-index");
    // Steady state: 16 stored + 16 removed per batch.
    g.throughput(Throughput::Elements(2 * PER_EVENT as u64));
    g.bench_function("ingest", |b| b.iter(|| step(&mut blocks)));
    g.finish();
    eprintln!(
        "index after ingest: {} keys, {} endpoints x {} blocks",
        index.len(),
        ENDPOINTS,
        index.engine_blocks(EndpointId(0))
    );
}

fn lookup(c: &mut Criterion) {
    lookup_in_blocks_of(c, BLOCK, "lookup-16k");
    lookup_in_blocks_of(c, 64, "lookup-16k-blocks-of-64");
}

/// Keying and matching a 16,384-token prompt in blocks of `block` tokens
/// (16: vLLM's default; 64: llm-d's precise config), as `name`.
fn lookup_in_blocks_of(c: &mut Criterion, block: usize, name: &str) {
    let index = KvBlockIndex::new(block, 1, 1 << 20);
    let all = 16_384 / block;
    let tokens: Vec<u32> = (0..16_384u32)
        .map(|t| t.wrapping_mul(2_654_435_761) >> 15)
        .collect();
    let holds = |id: u32, n: usize| {
        let batch = KvEventBatch {
            events: vec![KvEvent::BlockStored(BlockStored {
                block_hashes: (0..n as u64).map(|b| (u64::from(id) << 32) | b).collect(),
                parent_block_hash: None,
                token_ids: tokens[..n * block].to_vec(),
                block_size: block as u32,
                ..BlockStored::default()
            })],
            model: Some("m".into()),
            ..KvEventBatch::default()
        };
        index.apply(EndpointId(id), &batch);
    };
    for id in 0..8 {
        holds(id, all);
    }
    for id in 8..16 {
        holds(id, all / 2);
    }
    let mut keys = Vec::new();
    let mut m = PrefixMatch::default();
    let mut g = c.benchmark_group("kv-index");
    g.bench_function(name, |b| {
        b.iter(|| {
            m.reset();
            index.keys_of("m", None, &[], &tokens, 8192, &mut keys);
            index.lookup(&keys, &mut m);
            m.matched(EndpointId(0))
        });
    });
    g.bench_function(format!("{name}-keys-only"), |b| {
        b.iter(|| {
            index.keys_of("m", None, &[], &tokens, 8192, &mut keys);
            keys.len()
        });
    });
    index.keys_of("m", None, &[], &tokens, 8192, &mut keys);
    g.bench_function(format!("{name}-match-only"), |b| {
        b.iter(|| {
            m.reset();
            index.lookup(&keys, &mut m);
            m.matched(EndpointId(0))
        });
    });
    g.finish();
    m.reset();
    index.lookup(&keys, &mut m);
    assert_eq!(m.matched(EndpointId(0)) as usize, all);
    assert_eq!(m.matched(EndpointId(8)) as usize, all / 2);
}

/// 16 KiB of words, numbers and punctuation from a fixed pseudo-random
/// sequence: most words are seen once.
fn varied_text() -> String {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut text = String::new();
    while text.len() < 16 * 1024 {
        match next(10) {
            0 => text.push_str(&format!(" {}", next(100_000))),
            1 => {
                text.push_str([", ", ". ", "; ", "\n\n", " (", ") ", "'s", " — "][next(8) as usize])
            }
            _ => {
                text.push(' ');
                for _ in 0..2 + next(9) {
                    text.push(char::from(b'a' + next(26) as u8));
                }
            }
        }
    }
    let mut end = 16 * 1024;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

fn tokenize(c: &mut Criterion) {
    let paragraph = "The system prompt is the same for every user of the application, \
                     and the conversation that follows it is different for each one of them. \
                     Explain the theory of relativity to a child; count from one to ten. ";
    let english: String = paragraph.repeat(16 * 1024 / paragraph.len() + 1)[..16 * 1024].to_owned();
    let varied = varied_text();
    type Write = fn(&std::path::Path) -> std::io::Result<std::path::PathBuf>;
    let cases: [(&str, Write, &str); 3] = [
        ("tokenize-16k", write_test_tokenizer, &english),
        ("tokenize-16k-varied", write_test_tokenizer, &varied),
        ("tokenize-16k-llama3", write_llama3_test_tokenizer, &english),
    ];
    let mut g = c.benchmark_group("kv-index");
    for (name, write, text) in cases {
        let dir = scratch_dir(&format!("bench-{name}"));
        let file = write(&dir).unwrap();
        let p: TokenProducerParams = serde_yaml_ng::from_str(&format!(
            "{{local: {{path: {}, reloadInterval: 0s}}}}",
            file.display()
        ))
        .unwrap();
        let t = TokenProducer::build("tok", p).unwrap();
        assert!(t.uses_byte_bpe(), "{name}: the fast path");
        let crate_ = Tokenizer::from_file(&file).unwrap();
        let mut ids = Vec::new();
        t.tokenize(text, &mut ids).unwrap();
        assert_eq!(
            ids,
            crate_.encode_fast(text, true).unwrap().get_ids(),
            "{name}: same ids"
        );
        eprintln!("{name}: {} bytes -> {} tokens", text.len(), ids.len());
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(format!("{name}/crate"), |b| {
            b.iter(|| {
                ids.clear();
                let enc = crate_.encode_fast(text, true).unwrap();
                ids.extend_from_slice(enc.get_ids());
                ids.len()
            });
        });
        g.bench_function(format!("{name}/fast"), |b| {
            b.iter(|| {
                ids.clear();
                t.tokenize(text, &mut ids).unwrap();
                ids.len()
            });
        });
    }
    g.finish();
}

const HEADERS_TEMPLATE: &str = "{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}";

fn chat(c: &mut Criterion) {
    let dir = scratch_dir("bench-chat-16k");
    let file = write_llama3_test_tokenizer(&dir).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), HEADERS_TEMPLATE).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|begin_of_text|>"}"#,
    )
    .unwrap();
    let p: TokenProducerParams = serde_yaml_ng::from_str(&format!(
        "{{local: {{path: {}, reloadInterval: 0s}}}}",
        file.display()
    ))
    .unwrap();
    let t = TokenProducer::build("tok", p).unwrap();
    let renderer = epp_core::Plugin::prompt_renderer(&t).unwrap();
    let system =
        "You answer questions about the sea, its tides and its harbours, briefly and kindly. "
            .repeat(185);
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for turn in 0..6 {
        messages.push(serde_json::json!({"role": "user", "content": format!("Question {turn}: when is high tide in harbour {turn}?")}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("At {turn} o'clock, twice a day, give or take an hour.")}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "And at the next harbour?"}));
    let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
    let run = || {
        let mut fut = renderer
            .render(epp_core::ApiKind::ChatCompletions, body.as_bytes(), 0)
            .unwrap();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r.unwrap().token_ids.len(),
            std::task::Poll::Pending => unreachable!("ready at once"),
        }
    };
    eprintln!("chat-16k: {} bytes of body -> {} tokens", body.len(), run());
    let mut g = c.benchmark_group("kv-index");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("chat-16k/rendered", |b| b.iter(run));
    g.finish();
}

criterion_group!(benches, ingest, lookup, tokenize, chat);
criterion_main!(benches);
