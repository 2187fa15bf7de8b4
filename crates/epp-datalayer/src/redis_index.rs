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
//! is not answered within its timeout is left unanswered (the plugin then
//! matches in the replica's own view). After any drop, and on
//! every (re)connection — a restarted server is empty — the task rewrites
//! the replica's whole view from its [`Snapshot`]. What it cannot repair:
//! a removal dropped while the server kept its contents stays until the
//! engine stores and evicts that block again, or another replica (which
//! saw the same eviction) removes it.

use std::{
    collections::VecDeque,
    fmt,
    io::Write as _,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed},
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
/// Lookups waiting for the server at most: past it, a lookup is
/// unanswered at once (the request falls back to the replica's own view)
/// rather than queued behind the others for its whole timeout.
const MAX_LOOKUPS_IN_FLIGHT: usize = 64;
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
    /// Lookups sent and not yet answered or timed out.
    in_flight: AtomicUsize,
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
        let in_flight = InFlight::enter(&self.shared);
        if in_flight.0.in_flight.load(Relaxed) > MAX_LOOKUPS_IN_FLIGHT {
            return Box::pin(std::future::ready(unanswered(format!(
                "more than {MAX_LOOKUPS_IN_FLIGHT} lookups waiting for the server"
            ))));
        }
        let (reply, answer) = oneshot::channel();
        if self.tx.try_send(Op::Lookup { keys, reply }).is_err() {
            return Box::pin(std::future::ready(unanswered(
                "too many operations queued".into(),
            )));
        }
        // The time counts from the ask, not from the first poll.
        let timeout = self.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        Box::pin(async move {
            let _in_flight = in_flight;
            match tokio::time::timeout_at(deadline, answer).await {
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

/// One lookup counted in flight until dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> Self {
        shared.in_flight.fetch_add(1, Relaxed);
        Self(Arc::clone(shared))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
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
                if let Some(e) = tokio::time::timeout(CONNECT_TIMEOUT, conn.next_error())
                    .await
                    .map_err(|_| "no reply to AUTH/SELECT".to_owned())??
                {
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

    /// The length of the next whole reply at the front of the input,
    /// reading as needed (the caller advances past it).
    async fn next_span(&mut self) -> IoResult<usize> {
        loop {
            if let Some(end) = reply_end(&self.input, 0, 0)? {
                return Ok(end);
            }
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

    /// Reads the next reply: its text if it is an error.
    async fn next_error(&mut self) -> IoResult<Option<String>> {
        let len = self.next_span().await?;
        let error = (self.input[0] == b'-')
            .then(|| String::from_utf8_lossy(&self.input[1..len - 2]).into_owned());
        self.input.advance(len);
        Ok(error)
    }

    /// Reads `n` replies, counting the errors among them.
    async fn skip(&mut self, n: usize) -> IoResult<usize> {
        let mut errors = 0;
        for _ in 0..n {
            if let Some(e) = self.next_error().await? {
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
                            let mut tally = Tally::default();
                            for _ in 0..n {
                                let len = self.next_span().await?;
                                tally.feed(&self.input[..len]);
                                self.input.advance(len);
                            }
                            let _ = reply.send(Ok(tally.counts));
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
                    command(&mut self.out, &[b"HDEL", &key, endpoint.as_bytes()]);
                    pending.push_back(Pending::Update);
                }
            }
            Op::Lookup { keys, reply } => {
                for &k in &keys {
                    let key = block_key(k);
                    command(&mut self.out, &[b"HKEYS", &key]);
                }
                pending.push_back(Pending::Lookup {
                    n: keys.len(),
                    reply,
                });
            }
        }
    }
}

/// The Redis key of block key `k`: `epp:kv:` and 16 hex digits.
fn block_key(k: u64) -> [u8; 23] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut key = *b"epp:kv:0000000000000000";
    for (i, d) in key[7..].iter_mut().enumerate() {
        *d = HEX[((k >> (60 - 4 * i)) & 0xf) as usize];
    }
    key
}

fn hset(out: &mut Vec<u8>, k: u64, endpoint: &str) {
    command(out, &[b"HSET", &block_key(k), endpoint.as_bytes(), b"1"]);
}

/// Each endpoint's leading keys held, fed the `HKEYS` replies of a
/// request's keys in order: an endpoint counts while it holds every key so
/// far; the count stops at the first key nobody still counting holds.
#[derive(Debug, Default)]
struct Tally {
    counts: HolderCounts,
    depth: u32,
    done: bool,
}

impl Tally {
    /// One key's reply (whole, as [`reply_end`] found it): an array of
    /// endpoint names, or anything else (an error: nobody holds it).
    fn feed(&mut self, reply: &[u8]) {
        if self.done {
            return;
        }
        let depth = self.depth;
        let mut any = false;
        for_each_bulk(reply, |name| {
            let Ok(name) = std::str::from_utf8(name) else {
                return;
            };
            if depth == 0 {
                self.counts.push((name.to_owned(), 1));
                any = true;
            } else if let Some(c) = self
                .counts
                .iter_mut()
                .find(|(n, c)| n == name && *c == depth)
            {
                c.1 += 1;
                any = true;
            }
        });
        self.depth += 1;
        self.done = !any;
    }
}

/// Calls `f` with each bulk string of `reply`, one whole RESP reply (which
/// [`reply_end`] checked); only an array has any.
fn for_each_bulk(reply: &[u8], mut f: impl FnMut(&[u8])) {
    if reply.first() != Some(&b'*') {
        return;
    }
    let Some(mut at) = line_end(reply, 0).map(|cr| cr + 2) else {
        return;
    };
    while at < reply.len() {
        let Some(cr) = line_end(reply, at) else {
            return;
        };
        let bulk = (reply[at] == b'$')
            .then(|| number(&reply[at + 1..cr]))
            .flatten()
            .and_then(|n| usize::try_from(n).ok());
        if let Some(n) = bulk {
            f(&reply[cr + 2..cr + 2 + n]);
            at = cr + 2 + n + 2;
        } else {
            match reply_end(reply, at, 1) {
                Ok(Some(next)) => at = next,
                _ => return,
            }
        }
    }
}

/// Where the line starting at `at` ends (its CR), if the LF after it is in.
fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    memchr::memchr(b'\r', buf.get(at..)?)
        .map(|i| at + i)
        .filter(|&cr| cr + 1 < buf.len())
}

fn number(digits: &[u8]) -> Option<i64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Where the reply starting at `at` ends, `None` when more bytes are
/// needed, or an error for what no server sends.
fn reply_end(buf: &[u8], at: usize, depth: usize) -> IoResult<Option<usize>> {
    if depth > MAX_DEPTH {
        return Err("reply nested too deep".into());
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(cr) = line_end(buf, at) else {
        return Ok(None);
    };
    if buf[cr + 1] != b'\n' {
        return Err("reply line not ended by CRLF".into());
    }
    let next = cr + 2;
    let len = || {
        number(&buf[at + 1..cr]).ok_or_else(|| {
            format!(
                "bad number in reply: {:?}",
                String::from_utf8_lossy(&buf[at + 1..cr])
            )
        })
    };
    match kind {
        b'+' | b'-' => Ok(Some(next)),
        b':' => len().map(|_| Some(next)),
        b'$' => {
            let n = len()?;
            if n < 0 {
                return Ok(Some(next));
            }
            if n > MAX_LEN {
                return Err(format!("bulk reply of {n} bytes"));
            }
            let end = next + usize::try_from(n).unwrap_or(usize::MAX);
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err("bulk reply not ended by CRLF".into());
            }
            Ok(Some(end + 2))
        }
        b'*' => {
            let n = len()?;
            if n > MAX_LEN {
                return Err(format!("array reply of {n} items"));
            }
            let mut pos = next;
            for _ in 0..n.max(0) {
                match reply_end(buf, pos, depth + 1)? {
                    Some(end) => pos = end,
                    None => return Ok(None),
                }
            }
            Ok(Some(pos))
        }
        other => Err(format!("unknown reply type {:?}", char::from(other))),
    }
}

/// Appends one command, as RESP (an array of bulk strings).
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Replies nested deeper than this are refused (a server never sends them).
const MAX_DEPTH: usize = 8;
/// Bulk strings and arrays longer than this are refused.
const MAX_LEN: i64 = 512 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_where_every_reply_kind_ends_and_waits_for_more() {
        let wire =
            b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n$1\r\na\r\n:1\r\n*0\r\n*-1\r\n";
        let mut at = 0;
        let mut ends = Vec::new();
        while let Some(end) = reply_end(wire, at, 0).unwrap() {
            ends.push(end);
            at = end;
        }
        assert_eq!(ends, [5, 14, 19, 28, 33, 48, 52, 57]);
        // Every cut short of a whole reply asks for more.
        let one = b"*2\r\n$5\r\nhello\r\n$3\r\nbye\r\n";
        for cut in 0..one.len() {
            assert_eq!(reply_end(&one[..cut], 0, 0).unwrap(), None, "cut at {cut}");
        }
        let mut names = Vec::new();
        for_each_bulk(one, |b| names.push(b.to_vec()));
        assert_eq!(names, [b"hello".to_vec(), b"bye".to_vec()]);
        // A nested array or a nil inside is stepped over.
        let mixed = b"*3\r\n*1\r\n:1\r\n$-1\r\n$1\r\nx\r\n";
        assert_eq!(reply_end(mixed, 0, 0).unwrap(), Some(mixed.len()));
        names.clear();
        for_each_bulk(mixed, |b| names.push(b.to_vec()));
        assert_eq!(names, [b"x".to_vec()]);
    }

    #[test]
    fn refuses_what_no_server_sends() {
        for bad in [
            &b"?x\r\n"[..],
            b":x\r\n",
            b"$3\r\nabcde\r\n",
            b"$99999999999\r\n",
            b"+OK\rX",
        ] {
            assert!(reply_end(bad, 0, 0).is_err(), "{bad:?}");
        }
        let deep = "*1\r\n".repeat(20) + ":1\r\n";
        assert!(reply_end(deep.as_bytes(), 0, 0).is_err());
    }

    #[test]
    fn encodes_commands_as_resp_arrays() {
        let mut out = Vec::new();
        command(&mut out, &[b"HKEYS", b"epp:kv:00"]);
        assert_eq!(out, b"*2\r\n$5\r\nHKEYS\r\n$9\r\nepp:kv:00\r\n");
        assert_eq!(&block_key(0xab), b"epp:kv:00000000000000ab");
        assert_eq!(&block_key(u64::MAX - 1), b"epp:kv:fffffffffffffffe");
    }

    fn holders(replies: &[Vec<u8>]) -> HolderCounts {
        let mut tally = Tally::default();
        for r in replies {
            assert_eq!(reply_end(r, 0, 0).unwrap(), Some(r.len()));
            tally.feed(r);
        }
        tally.counts
    }

    #[test]
    fn counts_leading_blocks_without_gaps() {
        let keys = |names: &[&str]| {
            let mut r = format!("*{}\r\n", names.len());
            for n in names {
                r += &format!("${}\r\n{n}\r\n", n.len());
            }
            r.into_bytes()
        };
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
        assert!(holders(&[b"-WRONGTYPE\r\n".to_vec()]).is_empty());
    }
}
