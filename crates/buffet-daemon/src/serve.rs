//! The API's HTTP/1.1 server loop: accepts connections up to a limit, gives each a
//! deadline for its request head (a client trickling its headers is cut off, the
//! request timeout of [`crate::api::router`] starts only once the head is read), serves
//! each with the router current when it was accepted (a reload changes the limits of
//! new connections), and on shutdown stops accepting and lets the open connections
//! finish their current request, for a bounded time.
//!
//! This module does not route, authenticate or know about tenants; there is no TLS and
//! no HTTP/2.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// How long open connections may take to finish once shutdown begins.
pub const DRAIN: Duration = Duration::from_secs(5);

/// What each connection gets: the router (with its body limit and request timeout) and
/// the deadline for the request head.
#[derive(Clone)]
pub struct ConnSetup {
    /// The routes and their layers.
    pub router: Router,
    /// A request head (request line and headers) not complete within this closes the
    /// connection; also bounds how long an idle keep-alive connection stays open.
    pub header_read_timeout: Duration,
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
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let graceful = GracefulShutdown::new();
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
                    eprintln!("buffetd: api: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let ConnSetup {
            router,
            header_read_timeout,
        } = setup.borrow().clone();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Errors are the client's (a reset, a header timeout): nothing to report.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN) => {}
    }
}
