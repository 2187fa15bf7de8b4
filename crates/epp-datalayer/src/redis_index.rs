//! A prefix-block index shared by several epp replicas in a Redis or Valkey
//! server ([`SharedBlockIndex`]; llm-d's `redisConfig` / `valkeyConfig`).
//!
//! Layout: one hash per block key, `epp:kv:<key as 16 hex digits>`, whose
//! fields are the addresses (`ip:port`) of the endpoints holding the block
//! (value `1`). A replica writes `HSET` / `HDEL` as its own view changes
//! (every replica subscribes to every engine, so they all write the same
//! thing; the commands are idempotent) and looks a request up with one
//! pipelined `HKEYS` per block key, in one round trip.
//!
//! One connection, one task: it gathers what is queued (updates and
//! lookups) into one write, reads the replies in order, and answers the
//! lookups. Nothing waits on it: updates are queued without blocking and
//! dropped when the queue is full or the server unreachable; a lookup that
//! is not answered within its timeout is no match. After any drop, and on
//! every (re)connection — a restarted server is empty — the task rewrites
//! the replica's whole view from its [`Snapshot`]. What it cannot repair:
//! a removal dropped while the server kept its contents stays until the
//! engine stores and evicts that block again, or another replica (which
//! saw the same eviction) removes it.

use std::{
    collections::VecDeque,
    fmt::{self, Write as _},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::{Buf, BytesMut};
use epp_core::{
    HolderCounts, RedisAddress, SharedBlockIndex, SharedIndexSpec, SharedIndexStats,
    SharedLookupFuture, Snapshot,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::{Notify, mpsc, oneshot},
};
use tokio_util::sync::CancellationToken;

/// Operations queued at most (updates and lookups); past it updates are
/// dropped (and the view rewritten later) and lookups unanswered.
const QUEUE: usize = 8192;
/// Commands written per flush while rewriting the view.
const RESYNC_CHUNK: usize = 4096;
/// How long connecting (and each reply during it) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the replies of one write may take once connected.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Waits between connection attempts: from the first to the last, doubling.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

enum Op {
    Update {
        endpoint: Arc<str>,
        added: Vec<u64>,
        removed: Vec<u64>,
    },
    Lookup {
        keys: Vec<u64>,
        reply: oneshot::Sender<Result<HolderCounts, String>>,
    },
}

#[derive(Default)]
struct Shared {
    connected: AtomicBool,
    /// Set when an update was dropped: the view is rewritten.
    dirty: AtomicBool,
    lookups: AtomicU64,
    unanswered: AtomicU64,
    dropped: AtomicU64,
    resyncs: AtomicU64,
    snapshot: OnceLock<Snapshot>,
    /// Wakes the task for a rewrite when only the dirty flag changed.
    wake: Notify,
}

/// A [`SharedBlockIndex`] in a Redis or Valkey server.
pub struct RedisBlockIndex {
    tx: mpsc::Sender<Op>,
    shared: Arc<Shared>,
    timeout: Duration,
    address: String,
}

impl fmt::Debug for RedisBlockIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBlockIndex")
            .field("address", &self.address)
            .field("connected", &self.shared.connected.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl RedisBlockIndex {
    /// Starts the connection task (it connects, and reconnects, by itself;
    /// nothing here waits for the server). Stops when `shutdown` fires.
    /// Needs a Tokio runtime.
    #[must_use]
    pub fn start(spec: &SharedIndexSpec, shutdown: CancellationToken) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared::default());
        let address = format!("{}:{}", spec.address.host, spec.address.port);
        tokio::spawn(run(spec.address.clone(), rx, Arc::clone(&shared), shutdown));
        Self {
            tx,
            shared,
            timeout: spec.lookup_timeout,
            address,
        }
    }

    fn dropped(&self) {
        self.shared.dropped.fetch_add(1, Relaxed);
        if !self.shared.dirty.swap(true, Relaxed) {
            self.shared.wake.notify_one();
        }
    }
}

impl SharedBlockIndex for RedisBlockIndex {
    fn update(&self, endpoint: &str, added: &[u64], removed: &[u64]) {
        if !self.shared.connected.load(Relaxed) {
            // Written again from the snapshot once connected.
            self.dropped();
            return;
        }
        let op = Op::Update {
            endpoint: Arc::from(endpoint),
            added: added.to_vec(),
            removed: removed.to_vec(),
        };
        if self.tx.try_send(op).is_err() {
            self.dropped();
        }
    }

    fn lookup(&self, keys: Vec<u64>) -> SharedLookupFuture {
        let shared = Arc::clone(&self.shared);
        shared.lookups.fetch_add(1, Relaxed);
        let unanswered = move |why: String| {
            shared.unanswered.fetch_add(1, Relaxed);
            Err(why)
        };
        if !self.shared.connected.load(Relaxed) {
            return Box::pin(std::future::ready(unanswered(format!(
                "not connected to {}",
                self.address
            ))));
        }
        let (reply, answer) = oneshot::channel();
        if self.tx.try_send(Op::Lookup { keys, reply }).is_err() {
            return Box::pin(std::future::ready(unanswered(
                "too many operations queued".into(),
            )));
        }
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(Ok(counts))) => Ok(counts),
                Ok(Ok(Err(e))) => unanswered(e),
                Ok(Err(_)) => unanswered("connection lost".into()),
                Err(_) => unanswered(format!("no answer within {timeout:?}")),
            }
        })
    }

    fn set_snapshot(&self, snapshot: Snapshot) {
        if self.shared.snapshot.set(snapshot).is_ok() {
            // Connected before the snapshot was known: write it now.
            self.shared.dirty.store(true, Relaxed);
            self.shared.wake.notify_one();
        }
    }

    fn stats(&self) -> SharedIndexStats {
        let s = &self.shared;
        SharedIndexStats {
            connected: s.connected.load(Relaxed),
            lookups: s.lookups.load(Relaxed),
            unanswered: s.unanswered.load(Relaxed),
            dropped_updates: s.dropped.load(Relaxed),
            resyncs: s.resyncs.load(Relaxed),
        }
    }
}

/// The connection task: connect, rewrite the view, serve; on any error,
/// fail what is pending, back off, and again.
async fn run(
    address: RedisAddress,
    mut rx: mpsc::Receiver<Op>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let mut backoff = BACKOFF.0;
    let mut logged_down = false;
    loop {
        let attempt = async {
            let mut conn = Conn::connect(&address).await?;
            shared.connected.store(true, Relaxed);
            shared.dirty.store(true, Relaxed);
            if logged_down {
                tracing::info!(server = %conn.name, "shared prefix index: connected again");
            } else {
                tracing::info!(server = %conn.name, "shared prefix index: connected");
            }
            logged_down = false;
            backoff = BACKOFF.0;
            conn.serve(&mut rx, &shared).await
        };
        let ended = tokio::select! {
            () = shutdown.cancelled() => return,
            e = attempt => e,
        };
        let was = shared.connected.swap(false, Relaxed);
        let Err(e) = ended else {
            // The store was dropped: nothing more to serve.
            return;
        };
        if !logged_down {
            tracing::warn!(
                server = %format_args!("{}:{}", address.host, address.port),
                error = %e,
                "shared prefix index: {}; lookups match nothing until it is back",
                if was { "connection lost" } else { "cannot connect" }
            );
            logged_down = true;
        }
        // Everything queued meanwhile: updates are dropped (rewritten on
        // reconnecting), lookups unanswered.
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut sleep => break,
                op = rx.recv() => match op {
                    None => return,
                    Some(Op::Lookup { reply, .. }) => {
                        let _ = reply.send(Err("not connected".into()));
                    }
                    Some(Op::Update { .. }) => {
                        shared.dropped.fetch_add(1, Relaxed);
                        shared.dirty.store(true, Relaxed);
                    }
                },
            }
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// What one queued reply is for.
enum Pending {
    /// An update's reply: only its errors matter.
    Update,
    /// The `n` replies of a lookup.
    Lookup {
        n: usize,
        reply: oneshot::Sender<Result<HolderCounts, String>>,
    },
}

struct Conn {
    stream: TcpStream,
    name: String,
    out: Vec<u8>,
    input: BytesMut,
}

type IoResult<T> = Result<T, String>;

impl Conn {
    async fn connect(a: &RedisAddress) -> IoResult<Self> {
        let name = format!("{}:{}", a.host, a.port);
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((a.host.as_str(), a.port)),
        )
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let mut conn = Self {
            stream,
            name,
            out: Vec::with_capacity(64 << 10),
            input: BytesMut::with_capacity(64 << 10),
        };
        let mut setup = 0;
        if let Some(pass) = &a.password {
            match &a.username {
                Some(user) => command(&mut conn.out, &[b"AUTH", user.as_bytes(), pass.as_bytes()]),
                None => command(&mut conn.out, &[b"AUTH", pass.as_bytes()]),
            }
            setup += 1;
        }
        if a.db != 0 {
            command(&mut conn.out, &[b"SELECT", a.db.to_string().as_bytes()]);
            setup += 1;
        }
        if setup > 0 {
            conn.flush().await?;
            for _ in 0..setup {
                let r = tokio::time::timeout(CONNECT_TIMEOUT, conn.reply())
                    .await
                    .map_err(|_| "no reply to AUTH/SELECT".to_owned())??;
                if let Reply::Error(e) = r {
                    return Err(format!("refused: {e}"));
                }
            }
        }
        Ok(conn)
    }

    async fn flush(&mut self) -> IoResult<()> {
        let r = self.stream.write_all(&self.out).await;
        self.out.clear();
        r.map_err(|e| e.to_string())
    }

    /// The next reply, reading as needed.
    async fn reply(&mut self) -> IoResult<Reply> {
        loop {
            match parse(&self.input)? {
                Some((reply, used)) => {
                    self.input.advance(used);
                    return Ok(reply);
                }
                None => {
                    self.input.reserve(64 << 10);
                    let n = self
                        .stream
                        .read_buf(&mut self.input)
                        .await
                        .map_err(|e| e.to_string())?;
                    if n == 0 {
                        return Err("the server closed the connection".into());
                    }
                }
            }
        }
    }

    /// Reads `n` replies, counting the errors among them.
    async fn skip(&mut self, n: usize) -> IoResult<usize> {
        let mut errors = 0;
        for _ in 0..n {
            if let Reply::Error(e) = self.reply().await? {
                if errors == 0 {
                    tracing::debug!(error = %e, "shared prefix index: a write was refused");
                }
                errors += 1;
            }
        }
        Ok(errors)
    }

    /// Writes the replica's whole view (`HSET` of every key it holds).
    async fn resync(&mut self, shared: &Shared) -> IoResult<()> {
        let Some(snapshot) = shared.snapshot.get() else {
            return Ok(());
        };
        // Taken whole before writing: the snapshot holds index locks.
        let mut view: Vec<(Arc<str>, Vec<u64>)> = Vec::new();
        snapshot(&mut |endpoint, keys| {
            view.push((Arc::from(endpoint), keys.to_vec()));
        });
        let mut queued = 0;
        for (endpoint, keys) in &view {
            for &k in keys {
                hset(&mut self.out, k, endpoint);
                queued += 1;
                if queued == RESYNC_CHUNK {
                    self.flush().await?;
                    self.skip(queued).await?;
                    queued = 0;
                }
            }
        }
        if queued > 0 {
            self.flush().await?;
            self.skip(queued).await?;
        }
        shared.resyncs.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Serves the queue until the connection fails or the queue closes.
    async fn serve(&mut self, rx: &mut mpsc::Receiver<Op>, shared: &Shared) -> IoResult<()> {
        let mut pending: VecDeque<Pending> = VecDeque::new();
        loop {
            if shared.dirty.swap(false, Relaxed) {
                tokio::time::timeout(REPLY_TIMEOUT * 4, self.resync(shared))
                    .await
                    .map_err(|_| "rewriting the view timed out".to_owned())??;
            }
            let first = tokio::select! {
                op = rx.recv() => match op {
                    Some(op) => op,
                    None => return Ok(()),
                },
                () = shared.wake.notified() => continue,
            };
            self.queue(first, &mut pending);
            while pending.len() < 1024 {
                match rx.try_recv() {
                    Ok(op) => self.queue(op, &mut pending),
                    Err(_) => break,
                }
            }
            let served = async {
                self.flush().await?;
                while let Some(p) = pending.pop_front() {
                    match p {
                        Pending::Update => {
                            self.skip(1).await?;
                        }
                        Pending::Lookup { n, reply } => {
                            let mut replies = Vec::with_capacity(n);
                            for _ in 0..n {
                                replies.push(self.reply().await?);
                            }
                            let _ = reply.send(Ok(holders(&replies)));
                        }
                    }
                }
                Ok::<_, String>(())
            };
            tokio::time::timeout(REPLY_TIMEOUT, served)
                .await
                .map_err(|_| format!("no reply within {REPLY_TIMEOUT:?}"))??;
        }
    }

    fn queue(&mut self, op: Op, pending: &mut VecDeque<Pending>) {
        match op {
            Op::Update {
                endpoint,
                added,
                removed,
            } => {
                for &k in &added {
                    hset(&mut self.out, k, &endpoint);
                    pending.push_back(Pending::Update);
                }
                for &k in &removed {
                    let key = block_key(k);
                    command(
                        &mut self.out,
                        &[b"HDEL", key.as_bytes(), endpoint.as_bytes()],
                    );
                    pending.push_back(Pending::Update);
                }
            }
            Op::Lookup { keys, reply } => {
                for &k in &keys {
                    let key = block_key(k);
                    command(&mut self.out, &[b"HKEYS", key.as_bytes()]);
                }
                pending.push_back(Pending::Lookup {
                    n: keys.len(),
                    reply,
                });
            }
        }
    }
}

/// The Redis key of block key `k`.
fn block_key(k: u64) -> String {
    let mut s = String::with_capacity(23);
    s.push_str("epp:kv:");
    let _ = write!(s, "{k:016x}");
    s
}

fn hset(out: &mut Vec<u8>, k: u64, endpoint: &str) {
    let key = block_key(k);
    command(out, &[b"HSET", key.as_bytes(), endpoint.as_bytes(), b"1"]);
}

/// Each endpoint's leading keys held, from the `HKEYS` replies of a
/// request's keys in order: an endpoint counts while it holds every key so
/// far; the count stops at the first key nobody still counting holds.
fn holders(replies: &[Reply]) -> HolderCounts {
    let mut counts: HolderCounts = Vec::new();
    for (depth, r) in replies.iter().enumerate() {
        let fields: &[Reply] = match r {
            Reply::Array(Some(items)) => items,
            _ => &[],
        };
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        let mut any = false;
        for f in fields {
            let Reply::Bulk(Some(name)) = f else { continue };
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            if depth == 0 {
                counts.push((name.to_owned(), 1));
                any = true;
            } else if let Some(c) = counts.iter_mut().find(|(n, c)| n == name && *c == depth) {
                c.1 += 1;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    counts
}

/// Appends one command, as RESP (an array of bulk strings).
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// Replies nested deeper than this are refused (a server never sends them).
const MAX_DEPTH: usize = 8;
/// Bulk strings and arrays longer than this are refused.
const MAX_LEN: i64 = 512 << 20;

/// The first whole reply in `buf` and the bytes it took, `None` when more
/// bytes are needed, or an error for what no server sends.
fn parse(buf: &[u8]) -> IoResult<Option<(Reply, usize)>> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> IoResult<Option<(Reply, usize)>> {
    if depth > MAX_DEPTH {
        return Err("reply nested too deep".into());
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &buf[at + 1..at + end];
    let next = at + end + 2;
    let text = || String::from_utf8_lossy(line).into_owned();
    let int = || -> IoResult<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad number in reply: {:?}", text()))
    };
    Ok(Some(match kind {
        b'+' => (Reply::Simple(text()), next),
        b'-' => (Reply::Error(text()), next),
        b':' => (Reply::Int(int()?), next),
        b'$' => {
            let n = int()?;
            if n < 0 {
                (Reply::Bulk(None), next)
            } else if n > MAX_LEN {
                return Err(format!("bulk reply of {n} bytes"));
            } else {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if buf.len() < next + n + 2 {
                    return Ok(None);
                }
                if &buf[next + n..next + n + 2] != b"\r\n" {
                    return Err("bulk reply not ended by CRLF".into());
                }
                (
                    Reply::Bulk(Some(buf[next..next + n].to_vec())),
                    next + n + 2,
                )
            }
        }
        b'*' => {
            let n = int()?;
            if n < 0 {
                (Reply::Array(None), next)
            } else if n > MAX_LEN {
                return Err(format!("array reply of {n} items"));
            } else {
                let mut items = Vec::new();
                let mut pos = next;
                for _ in 0..n {
                    match parse_at(buf, pos, depth + 1)? {
                        Some((item, used)) => {
                            items.push(item);
                            pos = used;
                        }
                        None => return Ok(None),
                    }
                }
                (Reply::Array(Some(items)), pos)
            }
        }
        other => return Err(format!("unknown reply type {:?}", char::from(other))),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Some(s.as_bytes().to_vec()))
    }

    #[test]
    fn parses_every_reply_kind_and_waits_for_more() {
        let wire = b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n$1\r\na\r\n:1\r\n*0\r\n";
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((r, used)) = parse(&wire[at..]).unwrap() {
            got.push(r);
            at += used;
        }
        assert_eq!(at, wire.len());
        assert_eq!(
            got,
            [
                Reply::Simple("OK".into()),
                Reply::Error("ERR no".into()),
                Reply::Int(42),
                bulk("abc"),
                Reply::Bulk(None),
                Reply::Array(Some(vec![bulk("a"), Reply::Int(1)])),
                Reply::Array(Some(vec![])),
            ]
        );
        // Every cut short of a whole reply asks for more.
        let one = b"*2\r\n$5\r\nhello\r\n$3\r\nbye\r\n";
        for cut in 0..one.len() {
            assert_eq!(parse(&one[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn refuses_what_no_server_sends() {
        for bad in [
            &b"?x\r\n"[..],
            b":x\r\n",
            b"$3\r\nabcde\r\n",
            b"$99999999999\r\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let deep = "*1\r\n".repeat(20) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn encodes_commands_as_resp_arrays() {
        let mut out = Vec::new();
        command(&mut out, &[b"HKEYS", b"epp:kv:00"]);
        assert_eq!(out, b"*2\r\n$5\r\nHKEYS\r\n$9\r\nepp:kv:00\r\n");
        assert_eq!(block_key(0xab), "epp:kv:00000000000000ab");
    }

    #[test]
    fn counts_leading_blocks_without_gaps() {
        let keys = |names: &[&str]| Reply::Array(Some(names.iter().map(|n| bulk(n)).collect()));
        let replies = [
            keys(&["a:1", "b:1", "c:1"]),
            keys(&["a:1", "b:1"]),
            // c holds the third block but not the second: it stays at 1.
            keys(&["a:1", "c:1"]),
            keys(&["b:1"]),
            keys(&[]),
            keys(&["a:1"]),
        ];
        let mut got = holders(&replies);
        got.sort();
        assert_eq!(
            got,
            [("a:1".into(), 3), ("b:1".into(), 2), ("c:1".into(), 1)]
        );
        assert!(holders(&[keys(&[]), keys(&["a:1"])]).is_empty());
        assert!(holders(&[Reply::Error("WRONGTYPE".into())]).is_empty());
    }
}
