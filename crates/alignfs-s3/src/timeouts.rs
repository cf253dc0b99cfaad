//! Bounds on slow clients, below hyper: a connection's request head must arrive within
//! a time of its last activity ([`TimedIo`]), and a request body's pieces within a time
//! of each other ([`IdleBody`]).
//!
//! hyper has a header read timeout of its own; with it on, uploads that wait for
//! `100 Continue` (awscli's multipart parts) lost the end of their bodies in our tests, so
//! the head's clock lives here, on the socket.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Whether a connection is inside a request (its head read, its response not yet
/// returned): set by the service, read by the socket.
#[derive(Default)]
pub struct InRequest(AtomicBool);

impl InRequest {
    /// Mark the connection inside a request until the guard drops.
    pub fn enter(self: &Arc<Self>) -> impl Drop {
        struct Leave(Arc<InRequest>);
        impl Drop for Leave {
            fn drop(&mut self) {
                self.0 .0.store(false, Ordering::Release);
            }
        }
        self.0.store(true, Ordering::Release);
        Leave(Arc::clone(self))
    }

    fn busy(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A client socket on which, outside a request, waiting to read is bounded: from the
/// first wait after the last request (or the last byte written), the next head must be
/// in within `timeout`, however slowly its bytes trickle. Inside a request the body's
/// own bound ([`IdleBody`]) applies; a response being written keeps the connection alive.
pub struct TimedIo<S> {
    inner: S,
    in_request: Arc<InRequest>,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> TimedIo<S> {
    pub fn new(inner: S, in_request: Arc<InRequest>, timeout: Duration) -> TimedIo<S> {
        TimedIo { inner, in_request, timeout, deadline: None }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.in_request.busy() {
            this.deadline = None;
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => {
                let timeout = this.timeout;
                let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no whole request head within {timeout:?}"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.deadline = None;
        }
        written
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, data);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.deadline = None;
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that fails when its next piece takes longer than `idle` to come (a
/// client that stalls mid-body would otherwise hold its request, and the staged object
/// it writes, forever). The clock runs only while the body is waited on.
pub struct IdleBody {
    inner: hyper::body::Incoming,
    idle: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// What [`IdleBody`] fails with.
#[derive(Debug)]
pub struct BodyTimedOut(pub Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}", Self::SAID, self.0)
    }
}

impl std::error::Error for BodyTimedOut {}

impl BodyTimedOut {
    const SAID: &'static str = "no byte of the request body came for";

    /// Whether `error` comes of a [`BodyTimedOut`]: itself, a source of it, or (s3s wraps
    /// a signed body's errors with their text and no source) one whose text says so.
    pub fn caused(error: &(dyn std::error::Error + 'static)) -> bool {
        let mut cause = Some(error);
        while let Some(e) = cause {
            if e.is::<BodyTimedOut>() || e.to_string().contains(Self::SAID) {
                return true;
            }
            cause = e.source();
        }
        false
    }
}

impl IdleBody {
    pub fn new(inner: hyper::body::Incoming, idle: Duration) -> IdleBody {
        IdleBody { inner, idle, deadline: None }
    }
}

impl http_body::Body for IdleBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.deadline = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(idle))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
