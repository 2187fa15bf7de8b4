//! The lean ext_proc server: gRPC on the `h2` crate directly, one task per
//! connection polling all its streams, no per-stream task, body channel or
//! body adapter. A message whole in a DATA frame is decoded from a slice of
//! it; the replies one message produces are encoded into one buffer, sent
//! as one DATA send; the writes of all streams polled in one turn leave in
//! one system call (`io.rs`). Same service, same [`crate::ExtProcService`]
//! state as [`crate::ExtProcServer`] (the tonic service), another way of
//! driving it.
//!
//! A large body in a reply (32 KiB or more: a FULL_DUPLEX body streamed
//! back, a rewritten body) is not copied into that buffer: it goes to h2 as
//! the `Bytes` it is, between the pieces of the buffer around it
//! (`reply.rs`), and h2 and `io.rs` write it from there.
//!
//! Replies go to h2 only within the peer's flow-control window; what the
//! window does not take waits in the stream (`outbox.rs`), and a stream
//! holding more than 64 KiB of replies reads no further message until the
//! peer reads, so a peer that sends without reading is stopped by its own
//! window instead of growing a queue here. Envoy's windows (256 MiB) take
//! every reply at once.
//!
//! Unread request data is bounded per connection (its receive window,
//! 4 MiB); replies held here per stream (64 KiB plus one message's replies)
//! and per connection: past 1 MiB held by all its streams, none of them
//! reads on, so a peer opening many streams and reading none is stopped
//! too. Still per stream: h2's own send buffer (at most ~400 KiB within the
//! peer's window).

use std::{
    fmt,
    future::{Future, poll_fn},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, stream::FuturesUnordered};
use h2::{
    Ping, PingPong,
    server::{Connection, SendResponse},
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    task::JoinSet,
    time::{Instant, Sleep},
};

use crate::{ExtProcService, decision::Decider};

mod grpc;
mod io;
mod outbox;
mod reply;
mod stream;

use io::Coalesce;
use stream::StreamTask;

/// HTTP/2 and gRPC settings of [`ExtProcService::serve_connection`] and
/// [`ExtProcService::serve_incoming`]. Build with struct-update syntax:
/// `H2Options { keepalive_interval: None, ..H2Options::default() }`.
#[derive(Debug, Clone)]
pub struct H2Options {
    /// Bytes Envoy may send on one stream ahead of epp's reading
    /// (`SETTINGS_INITIAL_WINDOW_SIZE`); capacity is released as each DATA
    /// frame is read, so this only needs to cover a round trip. 1 MiB: a
    /// 225 KB body goes out without waiting for a `WINDOW_UPDATE`.
    pub initial_stream_window: u32,
    /// The same for the whole connection. 4 MiB.
    pub initial_connection_window: u32,
    /// Largest DATA frame Envoy may send (`SETTINGS_MAX_FRAME_SIZE`,
    /// 16 KiB to 16 MiB). 1 MiB: a message up to that size can come in one
    /// frame and is then decoded where it lies, not joined from pieces
    /// (a 225 KB body message: 1.47 M instructions a decision instead of
    /// 1.72 M with 64 KiB frames).
    pub max_frame_size: u32,
    /// Largest header block accepted (`SETTINGS_MAX_HEADER_LIST_SIZE`). 16 KiB.
    pub max_header_list_size: u32,
    /// Streams one connection may have open at once
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`); `None`: no limit (Envoy
    /// multiplexes every request of a worker on one connection).
    pub max_concurrent_streams: Option<u32>,
    /// Largest gRPC message accepted; a larger one ends its stream with
    /// `RESOURCE_EXHAUSTED`. `None`: gRPC's usual 4 MiB, raised to the
    /// service's [`crate::ExtProcOptions::max_body_bytes`] plus 64 KiB when
    /// that is larger (so an oversized body is still answered with a 413),
    /// no limit when the body limit is off.
    pub max_message_bytes: Option<usize>,
    /// Interval of the HTTP/2 PINGs that keep an idle connection alive (and
    /// find a dead one); `None`: none. 30 s.
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed. 20 s.
    pub keepalive_timeout: Duration,
}

impl Default for H2Options {
    fn default() -> Self {
        Self {
            initial_stream_window: 1 << 20,
            initial_connection_window: 4 << 20,
            max_frame_size: 1 << 20,
            max_header_list_size: 16 << 10,
            max_concurrent_streams: None,
            max_message_bytes: None,
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

impl H2Options {
    fn builder(&self) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(self.initial_stream_window)
            .initial_connection_window_size(self.initial_connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.max_header_list_size);
        if let Some(n) = self.max_concurrent_streams {
            b.max_concurrent_streams(n);
        }
        b
    }
}

/// Why a connection of the lean server ended other than by a clean close.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The HTTP/2 connection failed: I/O error, protocol error, handshake.
    #[error("HTTP/2 connection: {0}")]
    Http2(#[from] h2::Error),
    /// A keep-alive PING went unanswered for
    /// [`H2Options::keepalive_timeout`].
    #[error("keep-alive PING unanswered")]
    KeepaliveTimeout,
}

impl ExtProcService {
    /// Serves ext_proc on one connection (`io`: a TCP or TLS stream, the
    /// server side of an HTTP/2 connection with prior knowledge) until the
    /// peer closes it. Only `POST
    /// /envoy.service.ext_proc.v3.ExternalProcessor/Process` is served;
    /// other paths get `UNIMPLEMENTED`.
    ///
    /// # Errors
    ///
    /// When the connection fails ([`ServeError`]); its streams end with it.
    pub async fn serve_connection<T>(&self, io: T, options: &H2Options) -> Result<(), ServeError>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send,
    {
        self.serve_connection_with_shutdown(io, options, std::future::pending())
            .await
    }

    /// [`Self::serve_connection`], shutting down gracefully once `shutdown`
    /// resolves: a GOAWAY tells the peer to open no new stream, streams in
    /// flight go on to their end, then the connection closes.
    ///
    /// # Errors
    ///
    /// When the connection fails ([`ServeError`]); its streams end with it.
    pub async fn serve_connection_with_shutdown<T, S>(
        &self,
        io: T,
        options: &H2Options,
        shutdown: S,
    ) -> Result<(), ServeError>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send,
        S: Future<Output = ()> + Send,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let defer = Arc::new(AtomicBool::new(false));
        let io = Coalesce::new(io, Arc::clone(&defer));
        let handshake = options.builder().handshake::<Coalesce<T>, Bytes>(io);
        let mut conn = tokio::select! {
            c = handshake => c?,
            () = &mut shutdown => return Ok(()),
        };
        let keepalive = options.keepalive_interval.and_then(|interval| {
            Some(Keepalive {
                pings: conn.ping_pong()?,
                interval,
                timeout: options.keepalive_timeout,
                timer: Box::pin(tokio::time::sleep(interval)),
                awaiting_pong: false,
            })
        });
        let mut task = ConnectionTask {
            conn,
            streams: FuturesUnordered::new(),
            decider: Arc::clone(&self.decider),
            max_message: options.max_message_bytes,
            held: Arc::default(),
            keepalive,
            shutdown: Some(shutdown),
            defer,
        };
        poll_fn(|cx| task.poll(cx)).await
    }

    /// Serves ext_proc on every connection `incoming` yields (accepted TCP
    /// streams with `TCP_NODELAY` set, or TLS streams), one task each, until
    /// `shutdown` resolves: then no connection is accepted any more, every
    /// connection gets a GOAWAY, and this returns once their streams in
    /// flight have ended (bound that wait with a timeout; dropping the
    /// future drops every connection). Errors of `incoming` and of single
    /// connections are logged at `debug` and do not stop the server.
    pub async fn serve_incoming<I, T, E, S>(&self, incoming: I, options: H2Options, shutdown: S)
    where
        I: Stream<Item = Result<T, E>> + Send,
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        E: fmt::Display,
        S: Future<Output = ()> + Send,
    {
        let options = Arc::new(options);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut connections = JoinSet::new();
        let mut incoming = Box::pin(incoming);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                next = incoming.next() => match next {
                    Some(Ok(io)) => {
                        let service = self.clone();
                        let options = Arc::clone(&options);
                        let mut stop = stop_rx.clone();
                        connections.spawn(async move {
                            let stopped = async move {
                                let _ = stop.wait_for(|s| *s).await;
                            };
                            if let Err(e) = service
                                .serve_connection_with_shutdown(io, &options, stopped)
                                .await
                            {
                                tracing::debug!(error = %e, "ext_proc connection ended");
                            }
                        });
                    }
                    Some(Err(e)) => tracing::debug!(error = %e, "ext_proc accept failed"),
                    None => break,
                },
                // Reap finished connections as they go.
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        // Closes the listener: a new connection is refused, not left waiting.
        drop(incoming);
        let _ = stop_tx.send(true);
        while connections.join_next().await.is_some() {}
    }
}

// === impl ConnectionTask ===

/// One connection: h2's state and the futures of its streams, polled
/// together by one task.
struct ConnectionTask<T, S> {
    conn: Connection<Coalesce<T>, Bytes>,
    streams: FuturesUnordered<StreamTask>,
    decider: Arc<Decider>,
    max_message: Option<usize>,
    /// What its streams hold for the peer's windows, in all.
    held: Arc<outbox::ConnectionHeld>,
    keepalive: Option<Keepalive>,
    /// Until it fired (then the connection is going away).
    shutdown: Option<S>,
    /// Set while the streams are polled: h2's writes are gathered and go
    /// out in one system call at the end of the poll.
    defer: Arc<AtomicBool>,
}

impl<T, S> ConnectionTask<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Future<Output = ()> + Unpin,
{
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ServeError>> {
        if let Some(shutdown) = self.shutdown.as_mut()
            && Pin::new(shutdown).poll(cx).is_ready()
        {
            self.shutdown = None;
            self.conn.graceful_shutdown();
        }
        if let Some(k) = self.keepalive.as_mut() {
            k.poll(cx)?;
        }
        self.defer.store(true, Relaxed);
        let polled = self.poll_streams(cx);
        self.defer.store(false, Relaxed);
        if polled.is_ready() {
            return polled;
        }
        // What the streams wrote goes out now, in one write; a stream
        // accepted meanwhile is polled on the next turn.
        let accepted = self.conn.poll_accept(cx);
        // Then the work the decisions left for after their replies (the
        // prefix index's records): the replies did not wait for it. Nothing
        // to run costs a loop over an empty list.
        self.decider.scheduler.load().run_deferred();
        match accepted {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(r)) => {
                let (request, respond) = r?;
                self.start(request, respond);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(None) => Poll::Ready(Ok(())),
        }
    }

    /// Starts serving a stream the peer opened.
    fn start(&mut self, request: http::Request<h2::RecvStream>, respond: SendResponse<Bytes>) {
        if let Some(s) = stream::start(
            &self.decider,
            request,
            respond,
            self.max_message,
            &self.held,
        ) {
            self.streams.push(s);
        }
    }

    /// Polls the streams woken and drives the connection (its writes
    /// deferred), until neither has more to do for now.
    fn poll_streams(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ServeError>> {
        // Streams first (their replies), then the connection (writes them,
        // reads what came, accepts new streams); a second round answers what
        // the first one read without going through the scheduler.
        for round in 0.. {
            while let Poll::Ready(Some(())) = self.streams.poll_next_unpin(cx) {}
            let mut accepted = false;
            loop {
                match self.conn.poll_accept(cx) {
                    Poll::Pending => break,
                    Poll::Ready(Some(r)) => {
                        let (request, respond) = r?;
                        self.start(request, respond);
                        accepted = true;
                    }
                    // Closed: streams still here went with the connection.
                    Poll::Ready(None) => return Poll::Ready(Ok(())),
                }
            }
            if !accepted && round >= 1 {
                break;
            }
        }
        Poll::Pending
    }
}

// === impl Keepalive ===

/// HTTP/2 PINGs every `interval`; an unanswered one closes the connection.
struct Keepalive {
    pings: PingPong,
    interval: Duration,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
    awaiting_pong: bool,
}

impl Keepalive {
    fn poll(&mut self, cx: &mut Context<'_>) -> Result<(), ServeError> {
        if self.awaiting_pong && self.pings.poll_pong(cx)?.is_ready() {
            self.awaiting_pong = false;
            self.timer.as_mut().reset(Instant::now() + self.interval);
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            if self.awaiting_pong {
                return Err(ServeError::KeepaliveTimeout);
            }
            self.pings.send_ping(Ping::opaque())?;
            self.awaiting_pong = true;
            self.timer.as_mut().reset(Instant::now() + self.timeout);
        }
        Ok(())
    }
}
