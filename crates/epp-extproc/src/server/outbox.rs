//! The send side of one stream on the lean server: replies go to h2 only
//! as far as the peer's flow-control window allows; the rest waits here
//! (not in h2's queue, which would grow without bound) until the peer
//! opens the window. What the streams of one connection hold is counted
//! together ([`ConnectionHeld`]), so a peer reading none of many streams'
//! replies stops them all.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use h2::SendStream;

/// The largest capacity asked of h2 at once (its windows are at most
/// 2^31 - 1 bytes).
const MAX_RESERVE: usize = (1 << 31) - 1;

/// Reply bytes all the streams of one connection may hold for the peer's
/// windows before every stream of it stops reading.
pub(super) const MAX_HELD_PER_CONNECTION: usize = 1 << 20;

/// The reply bytes the streams of one connection hold, and the streams
/// waiting for that to fall under [`MAX_HELD_PER_CONNECTION`].
#[derive(Debug, Default)]
pub(super) struct ConnectionHeld {
    bytes: AtomicUsize,
    waiting: Mutex<Vec<Waker>>,
}

impl ConnectionHeld {
    /// Whether the connection holds more than it may: then the stream
    /// asking is woken once it holds less.
    pub(super) fn over(&self, cx: &Context<'_>) -> bool {
        if self.bytes.load(Relaxed) <= MAX_HELD_PER_CONNECTION {
            return false;
        }
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
        drop(waiting);
        // Drained meanwhile: do not wait for a wake that came before.
        self.bytes.load(Relaxed) > MAX_HELD_PER_CONNECTION
    }

    fn add(&self, n: usize) {
        self.bytes.fetch_add(n, Relaxed);
    }

    fn sub(&self, n: usize) {
        let before = self.bytes.fetch_sub(n, Relaxed);
        if before > MAX_HELD_PER_CONNECTION && before - n <= MAX_HELD_PER_CONNECTION {
            let waiting =
                std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
            waiting.into_iter().for_each(Waker::wake);
        }
    }
}

/// Reply bytes of one stream, handed to h2 within the window, or held.
#[derive(Debug)]
pub(super) struct Outbox {
    pub(super) send: SendStream<Bytes>,
    /// What the window did not take yet, in order.
    held: VecDeque<Bytes>,
    /// Their total length.
    held_len: usize,
    /// What the connection's streams hold in all.
    connection: Arc<ConnectionHeld>,
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.connection.sub(self.held_len);
    }
}

/// The stream is gone (reset by the peer, or its connection failed).
#[derive(Debug)]
pub(super) struct Gone;

impl Outbox {
    pub(super) fn new(send: SendStream<Bytes>, connection: Arc<ConnectionHeld>) -> Self {
        Self {
            send,
            held: VecDeque::new(),
            held_len: 0,
            connection,
        }
    }

    /// The connection's account of what its streams hold.
    pub(super) fn connection(&self) -> &ConnectionHeld {
        &self.connection
    }

    /// Bytes waiting for the peer's window.
    pub(super) fn held(&self) -> usize {
        self.held_len
    }

    /// Sends `parts` (`total` bytes, in order) as far as the window allows
    /// now, holding the rest. With a window as large as Envoy's, everything
    /// goes at once: one capacity request, one check, the sends.
    pub(super) fn send(
        &mut self,
        parts: impl IntoIterator<Item = Bytes>,
        total: usize,
    ) -> Result<(), Gone> {
        let mut capacity = 0;
        if self.held_len == 0 {
            // Capacity asked for is on top of what h2 holds unsent already.
            self.send.reserve_capacity(total.min(MAX_RESERVE));
            capacity = self.send.capacity();
        }
        for mut part in parts {
            if self.held_len == 0 && capacity > 0 {
                if part.len() <= capacity {
                    capacity -= part.len();
                    self.send.send_data(part, false).map_err(|_| Gone)?;
                    continue;
                }
                let now = part.split_to(capacity);
                capacity = 0;
                self.send.send_data(now, false).map_err(|_| Gone)?;
            }
            if !part.is_empty() {
                self.held_len += part.len();
                self.connection.add(part.len());
                self.held.push_back(part);
            }
        }
        Ok(())
    }

    /// Sends what is held as the window opens: `Ready(Ok)` once nothing is
    /// held; `Pending` while something is (the task is woken when the
    /// window grows, or when the stream is reset).
    pub(super) fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Gone>> {
        while self.held_len > 0 {
            let mut capacity = self.send.capacity();
            if capacity == 0 {
                self.send.reserve_capacity(self.held_len.min(MAX_RESERVE));
                capacity = match self.send.poll_capacity(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(n))) => n,
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(Err(Gone)),
                };
            }
            while capacity > 0
                && let Some(front) = self.held.front_mut()
            {
                let part = if front.len() <= capacity {
                    self.held.pop_front().unwrap_or_default()
                } else {
                    front.split_to(capacity)
                };
                capacity -= part.len();
                self.held_len -= part.len();
                self.connection.sub(part.len());
                self.send.send_data(part, false).map_err(|_| Gone)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}
