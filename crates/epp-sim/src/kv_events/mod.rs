//! KV cache events over ZeroMQ, as vLLM's `ZmqEventPublisher` sends them, so
//! a router can index which prompt blocks each server holds.
//!
//! The engine hands one batch per step that changed the cache to a
//! [`KvEventSink`] (never blocking: a full queue drops the batch and counts
//! it). A task numbers each batch when it sends it (seq 0, 1, …), publishes
//! `[topic, seq as 8 bytes big-endian, msgpack payload]` on a PUB socket and
//! keeps the last `buffer_steps` for replay. A ROUTER socket, when
//! `replay_endpoint` is set, answers a DEALER's `[b"", start_seq]` with every
//! kept `[b"", seq, payload]` from `start_seq` on, then
//! `[b"", 0xffffffffffffffff, b""]`.

pub mod config;
pub mod wire;

use std::{collections::VecDeque, sync::Arc};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

pub use self::{config::KvEventsConfig, wire::HashEncoding};
use crate::{blocks::PoolEvent, error::Error};

/// The replay stream's end marker: seq -1 as a signed 8-byte integer.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// One engine step's cache changes, not yet numbered.
#[derive(Debug)]
struct Batch {
    ts: f64,
    events: Vec<PoolEvent>,
}

/// Where the engine hands its batches: the front of the publisher's queue.
#[derive(Debug, Clone)]
pub struct KvEventSink {
    tx: mpsc::Sender<Batch>,
}

/// Why a batch was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotQueued {
    /// The queue is full (a subscriber-independent backlog): dropped.
    Full,
    /// The publisher task stopped.
    Closed,
}

impl KvEventSink {
    /// Queues `events` taken at `ts` (seconds since the epoch). Never waits.
    ///
    /// # Errors
    /// When the queue is full or the publisher is gone; the batch is lost.
    pub fn send(&self, ts: f64, events: Vec<PoolEvent>) -> Result<(), NotQueued> {
        self.tx.try_send(Batch { ts, events }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => NotQueued::Full,
            mpsc::error::TrySendError::Closed(_) => NotQueued::Closed,
        })
    }
}

/// A started publisher: its queue and where it listens.
#[derive(Debug)]
pub struct KvEventPublisher {
    /// The engine's end of the queue.
    pub sink: KvEventSink,
    /// The PUB socket's endpoint as bound (the real port).
    pub endpoint: String,
    /// The ROUTER socket's endpoint as bound, if any.
    pub replay_endpoint: Option<String>,
}

/// Binds the sockets of `cfg` and starts the tasks that serve them (on the
/// current tokio runtime). `block_size` goes into every stored event.
///
/// # Errors
/// When an endpoint cannot be bound.
pub async fn start(
    cfg: &KvEventsConfig,
    block_size: usize,
    hashes: HashEncoding,
) -> Result<KvEventPublisher, Error> {
    let mut publisher = PubSocket::new();
    let endpoint = bind(&mut publisher, &cfg.endpoint).await?;
    let kept: Arc<Mutex<VecDeque<(u64, Bytes)>>> = Arc::default();
    let replay_endpoint = match &cfg.replay_endpoint {
        Some(ep) => {
            let mut router = RouterSocket::new();
            let bound = bind(&mut router, ep).await?;
            tokio::spawn(serve_replay(router, Arc::clone(&kept)));
            Some(bound)
        }
        None => None,
    };
    let (tx, rx) = mpsc::channel(cfg.max_queue_size.max(1));
    let sender = Sender {
        socket: publisher,
        topic: Bytes::from(cfg.topic.clone().into_bytes()),
        block_size,
        hashes,
        buffer_steps: cfg.buffer_steps,
        kept,
    };
    tokio::spawn(sender.run(rx));
    Ok(KvEventPublisher {
        sink: KvEventSink { tx },
        endpoint,
        replay_endpoint,
    })
}

async fn bind(socket: &mut impl Socket, endpoint: &str) -> Result<String, Error> {
    let address = config::bind_address(endpoint).map_err(|reason| Error::KvEventsConfig {
        reason: format!("{endpoint:?}: {reason}"),
    })?;
    let bound = socket
        .bind(&address)
        .await
        .map_err(|e| Error::KvEventsBind {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(bound.to_string())
}

/// The task that numbers, sends and keeps the batches.
struct Sender {
    socket: PubSocket,
    topic: Bytes,
    block_size: usize,
    hashes: HashEncoding,
    buffer_steps: usize,
    kept: Arc<Mutex<VecDeque<(u64, Bytes)>>>,
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::Receiver<Batch>) {
        // vLLM numbers a message when it sends it: a batch dropped before
        // (queue full) leaves no gap.
        let mut seq: u64 = 0;
        while let Some(batch) = rx.recv().await {
            let payload = Bytes::from(wire::encode_batch(
                batch.ts,
                &batch.events,
                self.block_size,
                self.hashes,
            ));
            let frames = vec![
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            if let Ok(message) = ZmqMessage::try_from(frames)
                && let Err(e) = self.socket.send(message).await
            {
                eprintln!("epp-sim: kv events: publishing seq {seq} failed: {e}");
            }
            if self.buffer_steps > 0 {
                let mut kept = self.kept.lock();
                if kept.len() == self.buffer_steps {
                    kept.pop_front();
                }
                kept.push_back((seq, payload));
            }
            seq += 1;
        }
    }
}

/// Answers replay requests until the socket fails.
async fn serve_replay(mut router: RouterSocket, kept: Arc<Mutex<VecDeque<(u64, Bytes)>>>) {
    loop {
        let frames = match router.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                eprintln!("epp-sim: kv events replay socket stopped: {e}");
                return;
            }
        };
        let [identity, _empty, start] = frames.as_slice() else {
            eprintln!(
                "epp-sim: kv events replay: expected [identity, empty, start_seq], got {} frames",
                frames.len()
            );
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            eprintln!("epp-sim: kv events replay: start_seq is not 8 bytes");
            continue;
        };
        let start = u64::from_be_bytes(start);
        let replay: Vec<(u64, Bytes)> = kept
            .lock()
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let replies = replay
            .into_iter()
            .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload))
            .chain([(Bytes::from_static(&END_SEQ), Bytes::new())]);
        for (seq, payload) in replies {
            let frames = vec![identity.clone(), Bytes::new(), seq, payload];
            let Ok(message) = ZmqMessage::try_from(frames) else {
                continue;
            };
            if let Err(e) = router.send(message).await {
                eprintln!("epp-sim: kv events replay: sending failed: {e}");
                break;
            }
        }
    }
}
