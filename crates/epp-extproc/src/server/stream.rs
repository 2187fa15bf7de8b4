//! One ext_proc stream on the lean server: a future polled by its
//! connection's task, reading Envoy's messages straight from h2's DATA
//! frames and answering each with one DATA send, within the peer's
//! flow-control window: while more than [`MAX_HELD`] bytes of replies wait
//! for that window (or more than a MiB on all the connection's streams),
//! the stream reads no further message (and so releases no receive window:
//! a peer that sends without reading is stopped by its own flow control).

use std::{
    collections::VecDeque,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use h2::{Reason, RecvStream, server::SendResponse};
use http::{HeaderMap, Method, Request, StatusCode, header::CONTENT_TYPE};
use prost::Message;

use super::{
    grpc::{self, Code, Deframer, Status},
    outbox::{ConnectionHeld, Outbox},
    reply,
};
use crate::{
    decision::Decider,
    exchange::Exchange,
    metrics::{OpenStream, StreamEnd},
    service::PROCESS_PATH,
    wire::{ProcessingRequest, ProcessingResponse},
};

/// Reply bytes a stream may hold for the peer's window and still read the
/// peer's next message. Past it, what the stream holds is bounded by this
/// plus the replies to one message.
pub(super) const MAX_HELD: usize = 64 << 10;

/// The future of one stream: resolves once the stream ended (trailers
/// sent, or reset).
pub(super) struct StreamTask {
    recv: RecvStream,
    out: Outbox,
    deframer: Deframer,
    exchange: Exchange,
    pending: VecDeque<ProcessingResponse>,
    /// Once the stream ended: its trailers, sent after the replies held.
    closing: Option<HeaderMap>,
    /// Counted open until dropped (last: after the exchange's accounting).
    open: OpenStream,
}

impl fmt::Debug for StreamTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamTask")
            .field("exchange", &self.exchange)
            .field("pending", &self.pending.len())
            .field("held", &self.out.held())
            .finish_non_exhaustive()
    }
}

/// Starts serving a stream just accepted: `None` when it was answered at
/// once (not the `Process` method, not gRPC).
pub(super) fn start(
    decider: &Arc<Decider>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    max_message: Option<usize>,
    held: &Arc<ConnectionHeld>,
) -> Option<StreamTask> {
    let refusal = if request.uri().path() != PROCESS_PATH {
        Some((
            StatusCode::OK,
            Status::new(
                Code::Unimplemented,
                format!("unknown method {}", request.uri().path()),
            ),
        ))
    } else if request.method() != Method::POST {
        Some((
            StatusCode::METHOD_NOT_ALLOWED,
            Status::new(Code::Unimplemented, "gRPC calls are POST requests"),
        ))
    } else if !request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| grpc::is_grpc_content_type(v.as_bytes()))
    {
        Some((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Status::new(Code::Internal, "content-type is not application/grpc"),
        ))
    } else {
        None
    };
    if let Some((http, status)) = refusal {
        // Trailers-only; h2 resets the request side (NO_ERROR) as it drops.
        let _ = respond.send_response(grpc::trailers_only(http, &status), true);
        return None;
    }
    let send = respond.send_response(grpc::response_head(), false).ok()?;
    let exchange = Exchange::new(Arc::clone(decider));
    let max = max_message.unwrap_or_else(|| default_max_message(exchange.max_body_bytes()));
    let open = decider.metrics.stream_opened(exchange.started());
    Some(StreamTask {
        recv: request.into_body(),
        out: Outbox::new(send, Arc::clone(held)),
        deframer: Deframer::new(max),
        exchange,
        pending: VecDeque::with_capacity(4),
        closing: None,
        open,
    })
}

/// gRPC's usual 4 MiB, raised to hold the largest body the service accepts
/// (plus room for the message's other fields) so that a body over
/// [`crate::ExtProcOptions::max_body_bytes`] is answered with a 413, not a
/// stream error; no limit when the body limit is off.
pub(crate) fn default_max_message(max_body_bytes: usize) -> usize {
    const GRPC_DEFAULT: usize = 4 << 20;
    const HEADROOM: usize = 64 << 10;
    if max_body_bytes == 0 {
        return usize::MAX;
    }
    max_body_bytes.saturating_add(HEADROOM).max(GRPC_DEFAULT)
}

impl StreamTask {
    /// Sends the replies queued, all in one DATA frame send (a large body
    /// apart, not copied: `reply.rs`), as far as the peer's window allows;
    /// the rest is held. `false` when the stream is gone.
    fn flush(&mut self) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        // Each reply's length once (a message yields at most a few, plus
        // the pieces of a re-chunked body: the rest are measured again).
        let mut lens = [0usize; 8];
        let mut total = 0;
        let mut lifted = 0;
        for (i, reply) in self.pending.iter().enumerate() {
            let len = reply.encoded_len();
            if let Some(l) = lens.get_mut(i) {
                *l = len;
            }
            total += 5 + len;
            if let Some(body) = reply::large_body(reply) {
                lifted += body.len();
            }
        }
        let sent = if lifted == 0 {
            let buf = reply::encode(&mut self.pending, &lens, total);
            self.out.send([buf], total)
        } else {
            let parts = reply::encode_apart(&mut self.pending, &lens, total - lifted);
            self.out.send(parts, total)
        };
        sent.is_ok()
    }

    /// Ends the stream with `status` after the replies queued: the trailers
    /// go once the replies held went (`Ready` when the stream is gone).
    fn finish(&mut self, status: &Status, end: StreamEnd) -> Poll<()> {
        self.open.end(end);
        if !self.flush() {
            return Poll::Ready(());
        }
        self.closing = Some(status.trailers());
        Poll::Pending
    }

    /// The stream went while replies waited for the window (reset by the
    /// peer, connection lost).
    fn gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.exchange.abandon();
        if self.closing.is_none()
            && let Poll::Ready(Ok(reason)) = self.out.send.poll_reset(cx)
        {
            tracing::debug!(?reason, "ext_proc stream reset while replies waited");
            // A reset by the gateway is a normal end (as a `CANCELLED` read).
            let end = if reason == Reason::CANCEL {
                StreamEnd::Ok
            } else {
                StreamEnd::Unknown
            };
            self.open.end(end);
        }
        Poll::Ready(())
    }

    /// The stream broke under us (reset by Envoy, connection lost).
    fn broken(&mut self, e: &h2::Error) -> Poll<()> {
        tracing::debug!(error = %e, "ext_proc stream broken");
        self.exchange.abandon();
        // A reset by the gateway is a normal end (as a `CANCELLED` read).
        let end = if e.reason() == Some(Reason::CANCEL) {
            StreamEnd::Ok
        } else {
            StreamEnd::Unknown
        };
        self.open.end(end);
        Poll::Ready(())
    }

    /// A protocol error on Envoy's side: the stream ends with `status`.
    fn refuse(&mut self, status: &Status) -> Poll<()> {
        tracing::debug!(code = ?status.code, message = %status.message, "ext_proc stream refused");
        self.exchange.abandon();
        self.pending.clear();
        self.finish(status, StreamEnd::Unknown)
    }

    /// Handles one message; `Some(Ready)` when the stream is gone,
    /// `Some(Pending)` when it is closing.
    fn handle(&mut self, msg: Bytes) -> Option<Poll<()>> {
        let msg = match ProcessingRequest::decode(msg) {
            Ok(msg) => msg,
            Err(e) => {
                return Some(self.refuse(&Status::new(
                    Code::Internal,
                    format!("failed to decode a ProcessingRequest: {e}"),
                )));
            }
        };
        self.exchange.handle(msg, &mut self.pending);
        if self.exchange.is_closed() {
            // Answered locally: send the reply and end the stream.
            return Some(self.finish(&Status::ok(), StreamEnd::Ok));
        }
        if !self.flush() {
            self.exchange.abandon();
            return Some(Poll::Ready(()));
        }
        None
    }
}

impl Future for StreamTask {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            // Replies waiting for the peer's window first (nothing to do
            // when the window took them all, the usual case).
            let waiting = match this.out.poll_drain(cx) {
                Poll::Ready(Ok(())) => false,
                Poll::Ready(Err(_)) => return this.gone(cx),
                Poll::Pending => true,
            };
            if this.closing.is_some() {
                if waiting {
                    return Poll::Pending;
                }
                if let Some(trailers) = this.closing.take() {
                    let _ = this.out.send.send_trailers(trailers);
                }
                return Poll::Ready(());
            }
            // A request waiting in flow control (its replies, if it left
            // the queue); Envoy's messages are still read meanwhile so a
            // reset or end removes it from its queue at once.
            if this.exchange.poll_wait(cx, &mut this.pending) {
                if this.exchange.is_closed() {
                    if this.finish(&Status::ok(), StreamEnd::Ok).is_ready() {
                        return Poll::Ready(());
                    }
                    continue;
                }
                if !this.flush() {
                    this.exchange.abandon();
                    return Poll::Ready(());
                }
                continue;
            }
            // Backpressure: while the peer leaves too many replies unread,
            // on this stream or on all of the connection's, read nothing
            // more from it (its window is not released, so it stops
            // sending). The window opening, or the connection's streams
            // holding less, wakes this task.
            if (waiting && this.out.held() > MAX_HELD) || this.out.connection().over(cx) {
                return Poll::Pending;
            }
            // Messages already received.
            match this.deframer.next() {
                Ok(Some(msg)) => {
                    if let Some(Poll::Ready(())) = this.handle(msg) {
                        return Poll::Ready(());
                    }
                    continue;
                }
                Ok(None) => {}
                Err(status) => {
                    if this.refuse(&status).is_ready() {
                        return Poll::Ready(());
                    }
                    continue;
                }
            }
            match this.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    // Consumed into the deframer: Envoy may send as much again.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    this.deframer.push(data);
                }
                Poll::Ready(Some(Err(e))) => return this.broken(&e),
                Poll::Ready(None) => {
                    let ended = if this.deframer.is_mid_message() {
                        this.refuse(&Status::new(
                            Code::Internal,
                            "the stream ended in the middle of a message",
                        ))
                    } else {
                        this.exchange.end();
                        this.finish(&Status::ok(), StreamEnd::Ok)
                    };
                    if ended.is_ready() {
                        return Poll::Ready(());
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
