//! Writes of one connection gathered into one system call per poll.
//!
//! h2 keeps a DATA frame of 256 bytes or more aside and writes it straight
//! from its buffer, flushing the socket before it buffers the next frame: a
//! poll answering 16 streams made ~2 `writev`s per decision, half of epp's
//! CPU time being the kernel's. [`Coalesce`] copies small writes into one
//! buffer (large ones are written at once behind it, not copied) and, while its connection polls its streams, takes h2's flushes
//! as done; the connection task turns that off for its last flush, which
//! writes everything at once.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    task::{Context, Poll, ready},
};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Writes buffered up to this size in all.
const LIMIT: usize = 64 << 10;

/// A write this large (a full DATA frame of a large body) is not copied: it
/// goes to the socket at once, behind what is buffered, in one `writev`.
const LARGE: usize = 8 << 10;

/// The connection's socket, its writes gathered (see the module docs).
#[derive(Debug)]
pub(super) struct Coalesce<T> {
    io: T,
    buf: BytesMut,
    /// Set: flushes leave the buffer for later (the connection task flushes
    /// for real before it yields).
    defer: Arc<AtomicBool>,
}

impl<T> Coalesce<T> {
    pub(super) fn new(io: T, defer: Arc<AtomicBool>) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            defer,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesce<T> {
    /// Writes out what is buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.buf.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.buf.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `bufs`: copied into the buffer when small, else written at
    /// once behind what is buffered, in one `writev` and without a copy.
    fn poll_write_slices(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total < LARGE && self.buf.len() + total <= LIMIT {
            for b in bufs {
                self.buf.extend_from_slice(b);
            }
            return Poll::Ready(Ok(total));
        }
        loop {
            let mut slices = [IoSlice::new(&[]); 8];
            slices[0] = IoSlice::new(&self.buf);
            let n_slices = 1 + bufs.len().min(slices.len() - 1);
            for (slot, b) in slices[1..n_slices].iter_mut().zip(bufs) {
                *slot = IoSlice::new(b);
            }
            let ours = self.buf.len();
            let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n_slices]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n > ours {
                self.buf.clear();
                return Poll::Ready(Ok(n - ours));
            }
            // Only buffered bytes went: none of `bufs` yet.
            self.buf.advance(n);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesce<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesce<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slices(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_slices(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.defer.load(Relaxed) {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn deferred_flushes_write_nothing_until_the_real_one() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let defer = Arc::new(AtomicBool::new(true));
        let mut w = Coalesce::new(client, Arc::clone(&defer));
        w.write_all(b"hello ").await.unwrap();
        w.flush().await.unwrap();
        w.write_all(b"world").await.unwrap();
        w.flush().await.unwrap();
        let mut got = [0u8; 11];
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            server.read_exact(&mut got),
        )
        .await;
        assert!(early.is_err(), "nothing written while deferred");
        defer.store(false, Relaxed);
        w.flush().await.unwrap();
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello world");
    }

    #[tokio::test]
    async fn a_large_write_goes_after_what_is_buffered() {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let mut w = Coalesce::new(client, Arc::new(AtomicBool::new(true)));
        w.write_all(b"head").await.unwrap();
        let big = vec![7u8; LIMIT + 1];
        w.write_all(&big).await.unwrap();
        w.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..], &big[..]);
    }
}
