//! The HTTP/1.1 server loop of buffetd's API and of the Orchestrator's: accepts
//! connections up to a limit, gives each a deadline for its request head (a client
//! trickling its headers is cut off; a router's own request or body timeout starts only
//! once the head is read), serves each with the router current when it was accepted (a
//! reload changes the limits of new connections), closes each connection lingering
//! ([`LINGER`]), and on shutdown stops accepting and lets the open connections finish
//! their current request, for a bounded time ([`DRAIN`]).
//!
//! Lingering close: a server that answers before reading the request body (a 401 from
//! the head, a 413 from its `Content-Length`, a 408) and then closes the socket with
//! the body's bytes still unread makes the kernel send a reset instead of a normal
//! close; a client still sending its body gets the reset and most report it instead of
//! the answer. So every connection, once served, shuts down its write side (the client
//! sees the answer, then the end of the stream) and reads and discards what the client
//! still sends, for at most [`LINGER`] and the body limit ([`ConnSetup::linger_bytes`],
//! at least [`LINGER_BYTES`]), before it is closed.
//! Nothing of a body is read before the router has answered. A connection cut off at
//! its head deadline was answered nothing and is closed at once.
//!
//! [`body_deadline`] bounds the time a request's body may take, for routers that have
//! no request timeout of their own (the Orchestrator's, whose admissions wait longer).
//!
//! This module does not route, authenticate or know about tenants; there is no TLS and
//! no HTTP/2.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;

/// How long open connections may take to finish once shutdown begins.
pub const DRAIN: Duration = Duration::from_secs(5);

/// How long a connection done with its last answer keeps reading (and discarding) what
/// its client still sends before it is closed.
pub const LINGER: Duration = Duration::from_secs(2);

/// The least a closing connection reads and discards: the default body limit of buffetd
/// and of the Orchestrator. A server with a larger body limit lingers for that many
/// bytes ([`ConnSetup::linger_bytes`]). A client sending more after its answer is reset.
pub const LINGER_BYTES: u64 = 1 << 20;

/// What each connection gets: the router (with its body limit and request timeout) and
/// the deadline for the request head.
#[derive(Clone)]
pub struct ConnSetup {
    /// The routes and their layers.
    pub router: Router,
    /// A request head (request line and headers) not complete within this closes the
    /// connection; also bounds how long an idle keep-alive connection stays open.
    pub header_read_timeout: Duration,
    /// The most a connection answered before its body was read discards while it closes
    /// lingering: the router's body limit, so that a client sending a body the server
    /// accepts gets its early answer, not a reset (at least [`LINGER_BYTES`]).
    pub linger_bytes: u64,
}

/// Serves `listener` until `shutdown` resolves, with at most `max_connections` open at
/// once (further clients wait in the listen backlog), each set up from the current
/// value of `setup`.
pub async fn serve(
    listener: TcpListener,
    setup: watch::Receiver<ConnSetup>,
    max_connections: usize,
    shutdown: impl Future<Output = ()>,
) {
    let max = u32::try_from(max_connections.max(1)).unwrap_or(u32::MAX);
    let permits = Arc::new(Semaphore::new(max as usize));
    let (stopping, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait and retry, as axum does.
                    eprintln!("API: accept: {e}: retrying in 50 ms");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let conn = setup.borrow().clone();
        let linger_bytes = conn.linger_bytes.max(LINGER_BYTES);
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            let unread = Arc::new(AtomicBool::new(false));
            let (served, stopped) = serve_connection(&mut stream, conn, unread.clone(), stop).await;
            // Lingering is for a client whose answer came before its body was read, or
            // that hyper answered an error (400, 431) before it stopped reading. Not for
            // a head not complete in time or an idle connection (answered nothing: cut
            // off at once), nor for one that ends between requests (the client's
            // `Connection: close`): nothing of the client's is left unread there. Nor
            // once the server stops: a kept-alive connection whose last body hyper
            // drained itself would otherwise hold the stop for the whole linger.
            let early = match &served {
                Ok(()) => !stopped && unread.load(Ordering::Acquire),
                Err(e) => !stopped && !e.is_timeout(),
            };
            if early {
                linger(&mut stream, linger_bytes).await;
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    // Every connection holds a permit until it is closed: all of them back is all closed.
    let _ = tokio::time::timeout(DRAIN, permits.acquire_many(max)).await;
}

/// Serves one connection until the client or the server ends it; on `stop`, the request
/// under way is finished and the connection then ends. Errors are the client's (a reset,
/// a header timeout): nothing to report. The flag says whether `stop` ended it.
async fn serve_connection(
    stream: &mut TcpStream,
    setup: ConnSetup,
    unread: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) -> (Result<(), hyper::Error>, bool) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(setup.header_read_timeout);
    let service = Tracking {
        router: setup.router,
        unread,
    };
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => return (r, false),
        _ = stop.wait_for(|s| *s) => {}
    }
    conn.as_mut().graceful_shutdown();
    (conn.await, true)
}

/// The router, noting in `unread` whether the last request's body was left unread (not
/// read to its end by the time the connection ends).
struct Tracking {
    router: Router,
    unread: Arc<AtomicBool>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracking {
    type Response = Response;
    type Error = Infallible;
    type Future = <Router as tower::Service<Request>>::Future;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        self.unread
            .store(!HttpBody::is_end_stream(req.body()), Ordering::Release);
        let unread = self.unread.clone();
        let req = req.map(|inner| Body::new(TrackedBody { inner, unread }));
        tower::Service::call(&mut self.router.clone(), req)
    }
}

/// A request body that clears `unread` once read to its end.
struct TrackedBody {
    inner: Incoming,
    unread: Arc<AtomicBool>,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.unread.store(false, Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Closes `stream` lingering: its write side first, then what the client still sends is
/// read and discarded until it closes too, [`LINGER`] passes or `bytes` came.
async fn linger(stream: &mut TcpStream, bytes: u64) {
    if stream.shutdown().await.is_err() {
        // Not connected any more: nothing can be lost.
        return;
    }
    let mut buf = [0u8; 8 << 10];
    let mut left = bytes;
    let _ = tokio::time::timeout(LINGER, async {
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n as u64),
            }
        }
    })
    .await;
}

/// Wraps `router` so that a request body not complete `timeout` after the request head
/// was read fails: the answer is 408 (`{"error": ...}`), whatever the handler made of
/// the failed read. The body is not read here: only a handler reads it, after the
/// router's own checks (authentication) passed.
pub fn body_deadline(router: Router, timeout: Duration) -> Router {
    router.layer(axum::middleware::from_fn(move |req, next| {
        bound_body(req, next, timeout)
    }))
}

async fn bound_body(req: Request, next: Next, timeout: Duration) -> Response {
    let expired = Arc::new(AtomicBool::new(false));
    let req = req.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            expired: expired.clone(),
        })
    });
    let resp = next.run(req).await;
    if expired.load(Ordering::Acquire) {
        let message = format!(
            "the request body was not complete within {timeout:?} of the request head: \
             send it at once"
        );
        return (
            StatusCode::REQUEST_TIMEOUT,
            Json(serde_json::json!({ "error": message })),
        )
            .into_response();
    }
    resp
}

/// A request body that fails once its deadline passes, and says so in `expired`.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    expired: Arc<AtomicBool>,
}

/// The error a [`DeadlineBody`] fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not complete in time")]
struct BodyTimeout;

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.expired.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
