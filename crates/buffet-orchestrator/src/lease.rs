//! Connecting to etcd and holding a lease: the one piece the Orchestrator and the
//! Agents share at run time.
//!
//! [`connect`] fails with a clear [`ConnectError`] when no endpoint answers. [`hold`]
//! keeps a lease alive and says when it must be taken as lost: when no keep-alive has
//! been acknowledged for three quarters of the TTL, counted from the moment the last
//! acknowledged request was *sent* (etcd refreshed the lease after that moment, so the
//! lease cannot have expired earlier than TTL after it). Losing it early by that margin
//! is what lets a holder stop acting before anybody else can see the lease expire.
//! Broken keep-alive streams (an etcd restart) are re-opened until then.
//!
//! Before the first acknowledgement the clock runs from the grant's request. A holder
//! that starts holding later than three quarters of the TTL after it (a grant and a
//! registration that waited on a slow etcd) still has its first keep-alive tried, until
//! seven eighths of the TTL after the grant was asked: the lease is given up only if
//! that fails, and still before etcd can expire it.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::watch;
use tokio::time::Instant;

/// Why etcd cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No endpoint given.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// The endpoints did not answer.
    #[error("cannot reach etcd at {endpoints}: {message}")]
    Unreachable {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// Why, in words ([`describe`]): `connection refused`.
        message: String,
    },
}

/// An etcd client error in words for a person: the system's reason when the connection
/// failed (`connection refused`, `host is unreachable`), else etcd's own message
/// (`etcdserver: requested lease not found`), never the client's debug structures.
pub fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error;
    // The client's error does not chain to what it wraps: start from that.
    let mut cause: Option<&(dyn Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => Some(s),
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::IoError(io) => Some(io),
        e => Some(e),
    };
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return io_words(io);
        }
        cause = c.source();
    }
    match e {
        etcd_client::Error::GRpcStatus(s) if !s.message().is_empty() => s.message().to_owned(),
        etcd_client::Error::GRpcStatus(s) => s.code().description().to_owned(),
        e => e.to_string(),
    }
}

/// An I/O error's reason, without the `(os error N)` suffix: `connection refused`.
fn io_words(io: &std::io::Error) -> String {
    match io.raw_os_error() {
        // The kind's own words are the system's, lower-case, for the usual ones.
        Some(_) if io.kind() != std::io::ErrorKind::Other => io.kind().to_string(),
        _ => io.to_string(),
    }
}

/// Connects to etcd and checks that it answers (a `Status` call) within `timeout`. No
/// per-request timeout is set on the client (a campaign blocks until elected); HTTP/2
/// keep-alive pings (every 2 s) break calls on a dead connection, and callers bound
/// their own calls where they must.
pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Client, ConnectError> {
    if endpoints.is_empty() {
        return Err(ConnectError::NoEndpoint);
    }
    let unreachable = |message: String| ConnectError::Unreachable {
        endpoints: endpoints.join(","),
        message,
    };
    let opts = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
    let mut client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts)))
        .await
        .map_err(|_| unreachable(format!("no answer within {timeout:?}")))?
        .map_err(|e| unreachable(describe(&e)))?;
    tokio::time::timeout(timeout, client.status())
        .await
        .map_err(|_| unreachable(format!("no answer within {timeout:?}")))?
        .map_err(|e| unreachable(describe(&e)))?;
    Ok(client)
}

/// Whether a held lease still counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Held: acknowledged recently enough.
    Held,
    /// Lost: not acknowledged for 3/4 of the TTL, or etcd said it no longer exists.
    Lost,
}

/// Keeps lease `id` (of `ttl`) alive until the returned receiver's state turns
/// [`LeaseState::Lost`] (then the task ends) or the task is aborted.
///
/// `asked` is when the lease grant was sent (an instant taken before the request): etcd
/// counts the lease's TTL from its grant, so until the first keep-alive is acknowledged
/// the lease is lost 3/4 of the TTL after that, however long the holder took between the
/// grant and this call (a registration that waited on etcd, say). Called later than
/// that, the first keep-alive is tried all the same, and the lease lost 7/8 of the TTL
/// after `asked` unless it is acknowledged by then.
pub fn hold(
    client: Client,
    id: i64,
    ttl: Duration,
    asked: Instant,
) -> (watch::Receiver<LeaseState>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(LeaseState::Held);
    let task = tokio::spawn(async move {
        keep(client, id, ttl, asked).await;
        let _ = tx.send(LeaseState::Lost);
    });
    (rx, task)
}

async fn keep(mut client: Client, id: i64, ttl: Duration, asked: Instant) {
    let margin = ttl * 3 / 4;
    let every = (ttl / 6).clamp(Duration::from_millis(100), Duration::from_secs(5));
    // Counted as an acknowledged keep-alive sent when the grant was.
    let mut last_ok = asked;
    // Until the first acknowledgement: 3/4 of the TTL after the grant was asked, or, for
    // a holder that comes close to or after that, up to 1/8 of the TTL from now but never
    // past 7/8 after the grant, so that its first keep-alive is tried before the lease
    // is given up (still 1/8 of the TTL before etcd may expire it). The later the holder,
    // the later (never earlier) this deadline.
    let now = Instant::now();
    let mut first = Some((asked + margin).max((now + ttl / 8).min(asked + ttl * 7 / 8)));
    let mut stream = None;
    loop {
        let deadline = first.unwrap_or(last_ok + margin);
        if Instant::now() >= deadline {
            return;
        }
        if stream.is_none() {
            match tokio::time::timeout_at(deadline, client.lease_keep_alive(id)).await {
                Ok(Ok(s)) => stream = Some(s),
                _ => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let Some((keeper, replies)) = stream.as_mut() else {
            continue;
        };
        let sent = Instant::now();
        let ok = tokio::time::timeout_at(deadline, async {
            keeper.keep_alive().await?;
            replies.message().await
        })
        .await;
        match ok {
            Ok(Ok(Some(r))) if r.ttl() > 0 => {
                last_ok = sent;
                first = None;
                tokio::time::sleep(every).await;
            }
            // The lease is gone (expired or revoked).
            Ok(Ok(Some(_))) => return,
            _ => {
                stream = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Resolves once `held` turns [`LeaseState::Lost`] (or its sender is gone).
pub async fn lost(held: &mut watch::Receiver<LeaseState>) {
    let _ = held.wait_for(|s| *s == LeaseState::Lost).await;
}

/// Resolves once `flag` turns true (or its sender is gone).
pub async fn raised(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_etcd_nobody_listens_on_is_named_with_the_reason_in_words() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let e = connect(std::slice::from_ref(&url), Duration::from_secs(3))
            .await
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e, format!("cannot reach etcd at {url}: connection refused"));
    }

    /// A local etcd for `test`, or its skip when etcd is not installed.
    fn etcd_or_skip(test: &str) -> Option<crate::local_etcd::LocalEtcd> {
        buffet_testkit::gate::started_or_skip(
            test,
            crate::local_etcd::LocalEtcd::start(),
            crate::local_etcd::LocalEtcdError::is_missing,
        )
    }

    /// The holder took a while between the grant and [`hold`] (registering, say), then
    /// lost etcd before any keep-alive: etcd expires the lease a TTL after the grant, so
    /// the lease counts as lost 3/4 of the TTL after the grant was asked for, not after
    /// `hold` was called.
    #[tokio::test]
    async fn a_lease_never_kept_alive_is_lost_three_quarters_of_its_ttl_after_the_grant() {
        let test = "a_lease_never_kept_alive_is_lost_three_quarters_of_its_ttl_after_the_grant";
        let Some(mut etcd) = etcd_or_skip(test) else {
            return;
        };
        let mut client = connect(&[etcd.url()], Duration::from_secs(3))
            .await
            .unwrap();
        let ttl = Duration::from_secs(4);
        let asked = Instant::now();
        let id = client.lease_grant(4, None).await.unwrap().id();
        // A slow registration, then etcd is gone.
        tokio::time::sleep(Duration::from_secs(2)).await;
        etcd.kill();
        let called = Instant::now();
        let (mut held, _keeper) = hold(client, id, ttl, asked);
        tokio::time::timeout(Duration::from_secs(10), lost(&mut held))
            .await
            .unwrap();
        let (since_asked, since_called) = (asked.elapsed(), called.elapsed());
        assert!(since_asked >= ttl * 3 / 4, "lost early: {since_asked:?}");
        assert!(
            since_called < Duration::from_millis(1800),
            "lost {since_called:?} after hold, {since_asked:?} after the grant: counted from \
             hold, not from the grant"
        );
    }

    /// etcd was slow: the holder comes 3/4 of the TTL after the grant was asked, with the
    /// lease still alive in etcd. Its first keep-alive is tried and the lease kept; were
    /// etcd gone, it is lost 7/8 of the TTL after the grant was asked, before etcd could
    /// expire it.
    #[tokio::test]
    async fn a_holder_that_comes_late_tries_a_keep_alive_before_giving_the_lease_up() {
        let test = "a_holder_that_comes_late_tries_a_keep_alive_before_giving_the_lease_up";
        let Some(mut etcd) = etcd_or_skip(test) else {
            return;
        };
        let mut client = connect(&[etcd.url()], Duration::from_secs(3))
            .await
            .unwrap();
        let ttl = Duration::from_secs(4);
        let late = ttl * 3 / 4 + Duration::from_millis(50);

        let asked = Instant::now();
        let id = client.lease_grant(4, None).await.unwrap().id();
        tokio::time::sleep_until(asked + late).await;
        let (held, _keeper) = hold(client.clone(), id, ttl, asked);
        // Past the TTL counted from the grant: kept only by keep-alives sent since.
        tokio::time::sleep_until(asked + ttl + Duration::from_millis(500)).await;
        assert_eq!(*held.borrow(), LeaseState::Held);
        let left = client.lease_time_to_live(id, None).await.unwrap().ttl();
        assert!(left > 0, "the lease expired in etcd: {left}");

        let asked = Instant::now();
        let id = client.lease_grant(4, None).await.unwrap().id();
        tokio::time::sleep_until(asked + late).await;
        etcd.kill();
        let (mut held, _keeper) = hold(client, id, ttl, asked);
        tokio::time::timeout(Duration::from_secs(10), lost(&mut held))
            .await
            .unwrap();
        let since_asked = asked.elapsed();
        assert!(
            since_asked >= ttl * 7 / 8 && since_asked < ttl,
            "lost {since_asked:?} after the grant"
        );
    }
}
