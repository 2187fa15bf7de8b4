//! KV cache events end to end: the `epp-sim` binary with a real tokenizer and
//! a small KV pool, a ZeroMQ SUB socket listening as epp does, and a DEALER
//! asking for a replay. Real sockets on loopback, no mocks.
#![expect(clippy::unwrap_used, reason = "test helpers panic on failure")]

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, ChildStdout, Command, Stdio},
    time::Duration,
};

use bytes::Bytes;
use rmpv::Value;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::timeout,
};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const BLOCK: usize = 4;
const TOPIC: &str = "kv@127.0.0.1@test";

/// A running simulator, killed on drop.
struct Server {
    child: Child,
    http: u16,
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two free ports, distinct: both are held until both are chosen (one
/// released before the other is asked for may come back as the other, and
/// the simulator then cannot bind its replay socket).
fn free_ports() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, b) = (bind(), bind());
    let port = |l: &std::net::TcpListener| l.local_addr().unwrap().port();
    (port(&a), port(&b))
}

/// Starts the binary with KV events on free ports; returns it and the PUB
/// and replay endpoints it printed.
fn start(extra: &[&str]) -> (Server, String, String) {
    let (pub_port, replay_port) = free_ports();
    let config = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://127.0.0.1:{pub_port}"),
        "replay_endpoint": format!("tcp://127.0.0.1:{replay_port}"),
        "buffer_steps": 10000,
        "topic": TOPIC,
    })
    .to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_epp-sim"))
        .args(["--port", "0", "--block-size", "4", "--num-gpu-blocks", "16"])
        .args(["--max-tokens-default", "1", "--kv-events-config", &config])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        lines.push(line.trim().to_owned());
    }
    let http = lines[0].rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(
        lines[1],
        format!("epp-sim kv events on tcp://127.0.0.1:{pub_port} (topic {TOPIC:?})")
    );
    assert_eq!(
        lines[2],
        format!("epp-sim kv events replay on tcp://127.0.0.1:{replay_port}")
    );
    let server = Server {
        child,
        http,
        _stdout: out,
    };
    (
        server,
        format!("tcp://127.0.0.1:{pub_port}"),
        format!("tcp://127.0.0.1:{replay_port}"),
    )
}

/// POSTs `body` over HTTP/1.0; returns the JSON reply.
async fn post(port: u16, path: &str, body: &serde_json::Value) -> serde_json::Value {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).await.unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{reply}");
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

async fn subscribe(endpoint: &str) -> SubSocket {
    let mut sub = SubSocket::new();
    sub.connect(endpoint).await.unwrap();
    sub.subscribe("").await.unwrap();
    // The subscription travels to the publisher; messages sent before it
    // arrives are not delivered (ZeroMQ's slow joiner).
    tokio::time::sleep(Duration::from_millis(500)).await;
    sub
}

/// One received message: seq and the decoded batch's events.
struct Message {
    seq: u64,
    payload: Bytes,
    events: Vec<Value>,
}

fn decode(payload: &[u8]) -> Vec<Value> {
    let mut r = payload;
    let batch = rmpv::decode::read_value(&mut r).unwrap();
    assert!(r.is_empty());
    let batch = batch.as_array().unwrap();
    assert_eq!(batch.len(), 2, "[ts, events], no data_parallel_rank");
    assert!(matches!(batch[0], Value::F64(_)));
    batch[1].as_array().unwrap().clone()
}

async fn recv(sub: &mut SubSocket) -> Option<Message> {
    let m = timeout(Duration::from_secs(2), sub.recv())
        .await
        .ok()?
        .unwrap();
    let frames = m.into_vec();
    assert_eq!(frames.len(), 3, "[topic, seq, payload]");
    assert_eq!(frames[0].as_ref(), TOPIC.as_bytes());
    let seq = u64::from_be_bytes(frames[1].as_ref().try_into().unwrap());
    Some(Message {
        seq,
        events: decode(&frames[2]),
        payload: frames[2].clone(),
    })
}

/// What a subscriber knows: stored blocks by hash, as epp indexes them.
#[derive(Default)]
struct Index {
    /// hash → (parent, the block's token ids).
    blocks: HashMap<u64, (Option<u64>, Vec<u32>)>,
    stored: HashSet<u64>,
    removed: Vec<u64>,
    cleared: bool,
    stored_events: usize,
    messages: Vec<(u64, Bytes)>,
}

impl Index {
    fn apply(&mut self, m: Message) {
        assert_eq!(m.seq, self.messages.len() as u64, "seq contiguous from 0");
        assert!(!m.events.is_empty(), "a batch with no change is not sent");
        for e in &m.events {
            let f = e.as_array().unwrap();
            match f[0].as_str().unwrap() {
                "BlockStored" => {
                    self.stored_events += 1;
                    assert_eq!(f.len(), 7, "base model: no lora_name");
                    let hashes: Vec<u64> = f[1]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| h.as_u64().unwrap())
                        .collect();
                    let parent = f[2].as_u64();
                    assert!(parent.is_some() || f[2].is_nil());
                    let ids: Vec<u32> = f[3]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
                        .collect();
                    assert_eq!(f[4].as_u64(), Some(BLOCK as u64));
                    assert!(f[5].is_nil(), "lora_id nil for the base model");
                    assert_eq!(f[6].as_str(), Some("GPU"));
                    assert_eq!(ids.len(), hashes.len() * BLOCK, "full blocks only");
                    let mut prev = parent;
                    for (h, chunk) in hashes.iter().zip(ids.chunks(BLOCK)) {
                        self.blocks.insert(*h, (prev, chunk.to_vec()));
                        assert!(self.stored.insert(*h), "stored while already held");
                        prev = Some(*h);
                    }
                }
                "BlockRemoved" => {
                    assert_eq!(f.len(), 3);
                    assert_eq!(f[2].as_str(), Some("GPU"));
                    for h in f[1].as_array().unwrap() {
                        let h = h.as_u64().unwrap();
                        assert!(self.stored.remove(&h), "removed {h} was never stored");
                        self.removed.push(h);
                    }
                }
                "AllBlocksCleared" => {
                    assert_eq!(f.len(), 1);
                    self.stored.clear();
                    self.cleared = true;
                }
                other => panic!("unknown event {other}"),
            }
        }
        self.messages.push((m.seq, m.payload));
    }

    /// Whether every full block of `ids` is held, chained from the first.
    fn holds(&self, ids: &[u32]) -> bool {
        let mut parent = None;
        ids.chunks_exact(BLOCK).all(|chunk| {
            let found = self
                .stored
                .iter()
                .find(|h| self.blocks[h] == (parent, chunk.to_vec()));
            found.map(|h| parent = Some(*h)).is_some()
        })
    }

    /// Receives until `done` holds (or fails after a quiet spell).
    async fn until(&mut self, sub: &mut SubSocket, done: impl Fn(&Self) -> bool) {
        while !done(self) {
            let m = recv(sub).await.expect("the events this test waits for");
            self.apply(m);
        }
    }
}

fn tokenizer_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("epp-sim-kv-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    epp_test_support::tokenizer::write_test_tokenizer(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenized_prompts_publish_vllm_events_and_replay_them() {
    let dir = tokenizer_dir("tok");
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let (server, endpoint, replay) = start(&["--tokenizer", dir.to_str().unwrap()]);
    let mut sub = subscribe(&endpoint).await;
    let mut index = Index::default();

    // The pool holds 16 blocks of 4 tokens; each prompt fills about half.
    let prompts = [
        "Write a short story about a cat and a dog who become friends in the city, and walk along the river.",
        "Translate the following text into French: the station is near the river, past the old bridge.",
        "Explain the theory of relativity to a child, in three short sentences, with an example.",
        "What is the capital of Italy? Count from one to ten, then stop there and say goodbye.",
    ];
    for prompt in prompts {
        let ids = tokenizer.encode(prompt, true).unwrap().get_ids().to_vec();
        assert!(
            ids.len() >= 6 * BLOCK && ids.len() < 60,
            "{} tokens",
            ids.len()
        );
        let reply = post(
            server.http,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}),
        )
        .await;
        assert_eq!(
            reply["usage"]["prompt_tokens"],
            ids.len(),
            "real token count"
        );
        // Exactly this prompt's ids, chunked by block size, full blocks only.
        index.until(&mut sub, |ix| ix.holds(&ids)).await;
    }
    assert!(
        !index.removed.is_empty(),
        "four prompts of 7+ blocks overflow 16 blocks: evictions announced"
    );
    assert!(
        !index.holds(tokenizer.encode(prompts[0], true).unwrap().get_ids()),
        "the oldest prompt's tail was evicted"
    );

    // The last prompt again: a prefix hit stores nothing new (its partial
    // tail block may still evict an old block).
    let again = tokenizer
        .encode(prompts[3], true)
        .unwrap()
        .get_ids()
        .to_vec();
    let stored = index.stored_events;
    let reply = post(
        server.http,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompts[3], "max_tokens": 1}),
    )
    .await;
    let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(cached, Some(((again.len() - 1) / BLOCK * BLOCK) as u64));
    while let Some(m) = recv(&mut sub).await {
        index.apply(m);
    }
    assert_eq!(index.stored_events, stored, "a prefix hit stores nothing");
    assert!(index.holds(&again));

    // vLLM's reset: everything cached goes, one AllBlocksCleared says so.
    post(server.http, "/reset_prefix_cache", &json!({})).await;
    index.until(&mut sub, |ix| ix.cleared).await;
    assert!(!index.holds(&again));

    // A replay from seq 0 returns every message as published, then the end.
    let mut dealer = DealerSocket::new();
    dealer.connect(&replay).await.unwrap();
    let ask = vec![Bytes::new(), Bytes::copy_from_slice(&0u64.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(ask).unwrap())
        .await
        .unwrap();
    let mut replayed = Vec::new();
    loop {
        let m = timeout(Duration::from_secs(5), dealer.recv())
            .await
            .unwrap()
            .unwrap()
            .into_vec();
        assert_eq!(m.len(), 3, "[empty, seq, payload]");
        assert!(m[0].is_empty());
        if m[1].as_ref() == [0xff; 8] {
            assert!(m[2].is_empty(), "the end marker has an empty payload");
            break;
        }
        let seq = u64::from_be_bytes(m[1].as_ref().try_into().unwrap());
        replayed.push((seq, m[2].clone()));
    }
    assert_eq!(replayed, index.messages);

    // From a later seq: only what follows.
    let from = 2u64;
    let ask = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(ask).unwrap())
        .await
        .unwrap();
    let first = dealer.recv().await.unwrap().into_vec();
    assert_eq!(first[1].as_ref(), from.to_be_bytes());
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_id_prompts_publish_events_without_a_tokenizer() {
    let (server, endpoint, _) = start(&[]);
    let mut sub = subscribe(&endpoint).await;
    let ids: Vec<u32> = (1000..1010).collect();
    let reply = post(
        server.http,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ids, "max_tokens": 1}),
    )
    .await;
    assert_eq!(reply["usage"]["prompt_tokens"], 10);
    let m = recv(&mut sub).await.expect("a batch");
    assert_eq!(m.seq, 0);
    let f = m.events[0].as_array().unwrap();
    assert_eq!(f[0].as_str(), Some("BlockStored"));
    assert_eq!(f[1].as_array().unwrap().len(), 2, "two full blocks of 4");
    assert!(f[2].is_nil());
    let stored: Vec<u64> = f[3]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(stored, (1000..1008).collect::<Vec<u64>>());

    // A text prompt without a tokenizer keys character blocks: no events.
    post(
        server.http,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "a text prompt of some length, no tokenizer here", "max_tokens": 1}),
    )
    .await;
    assert!(recv(&mut sub).await.is_none());
}

/// With `--cache-output-blocks`, the blocks a request's output fills are
/// announced after its prompt's, chained to them, as vLLM announces every
/// block it caches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_blocks_are_announced_after_the_prompts() {
    let (server, endpoint, _) = start(&["--cache-output-blocks"]);
    let mut sub = subscribe(&endpoint).await;
    let ids: Vec<u32> = (1000..1010).collect();
    // 10 prompt tokens and 9 generated: blocks 0-1 are the prompt's, block 2
    // holds 2 prompt and 2 generated tokens, blocks 3 the generated ones.
    post(
        server.http,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ids, "max_tokens": 9}),
    )
    .await;
    let mut blocks: Vec<(u64, Vec<u64>)> = Vec::new();
    while let Some(m) = recv(&mut sub).await {
        for e in &m.events {
            let f = e.as_array().unwrap();
            if f[0].as_str() != Some("BlockStored") {
                continue;
            }
            let tokens: Vec<u64> = f[3]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect();
            for (i, h) in f[1].as_array().unwrap().iter().enumerate() {
                blocks.push((
                    h.as_u64().unwrap(),
                    tokens[i * BLOCK..(i + 1) * BLOCK].to_vec(),
                ));
            }
        }
        if blocks.len() >= 4 {
            break;
        }
    }
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    assert_eq!(blocks[0].1, [1000, 1001, 1002, 1003]);
    assert_eq!(
        &blocks[2].1[..2],
        [1008, 1009],
        "the prompt's tail, then output"
    );
    let hashes: HashSet<u64> = blocks.iter().map(|b| b.0).collect();
    assert_eq!(hashes.len(), 4);
}
