//! The Orchestrator's API against clients that hold connections: a request head never
//! finished, a body announced and never sent. Each connection is closed within its
//! deadline while other clients are answered. Needs an `etcd` binary (Debian's
//! etcd-server); without it the test skips, or fails under `BUFFET_REQUIRE_PRIVILEGED=1`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use buffet_orchestrator::local_etcd::{LocalEtcd, LocalEtcdError};
use buffet_orchestrator::{Config, Orchestrator, Token};

const ADMIN: &str = "deadline-test-admin-token-0123456789";

/// Reads `s` until the server closes it: what came, and how long that took from `t0`.
fn read_to_close(s: &mut TcpStream, t0: Instant) -> (String, Duration) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading: {e} after {:?}", t0.elapsed()),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), t0.elapsed())
}

fn connect(addr: SocketAddr, head: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s
}

#[test]
fn held_heads_and_bodies_are_cut_off_at_their_deadline_while_others_are_served() {
    let test = "held_heads_and_bodies_are_cut_off_at_their_deadline_while_others_are_served";
    let Some(etcd) =
        buffet_testkit::gate::started_or_skip(test, LocalEtcd::start(), LocalEtcdError::is_missing)
    else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let deadline = Duration::from_secs(1);
    let mut cfg = Config::new(
        vec![etcd.url()],
        "127.0.0.1:0".parse().unwrap(),
        Token::new(ADMIN.to_owned()),
    );
    cfg.header_read_timeout = deadline;
    cfg.body_timeout = deadline;
    let o = rt.block_on(Orchestrator::start(cfg)).unwrap();
    let addr = o.addr();

    let t0 = Instant::now();
    // Half a head: the request line and one header, never the blank line.
    let mut half = connect(addr, "GET /v1/leader HTTP/1.1\r\nHost: x\r\n");
    // A whole head announcing a body that never comes, with the admin token (the body is
    // read) and without (401 from the head, the body never read).
    let announce = |auth: &str| {
        format!(
            "POST /v1/tenants HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 100\r\n\r\n"
        )
    };
    let mut bodiless = connect(
        addr,
        &announce(&format!("Authorization: Bearer {ADMIN}\r\n")),
    );
    let mut unauthorised = connect(addr, &announce(""));

    // Meanwhile another client is answered, at once.
    let asked = Instant::now();
    let r = ureq::get(&format!("http://{addr}/healthz")).call().unwrap();
    assert_eq!(r.status(), 200);
    assert!(asked.elapsed() < deadline / 2, "{:?}", asked.elapsed());

    let (got, took) = read_to_close(&mut unauthorised, t0);
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
    assert!(took < deadline, "401 then closed after {took:?}");

    let (got, took) = read_to_close(&mut half, t0);
    assert!(
        !got.starts_with("HTTP/1.1 2"),
        "a half head was served: {got}"
    );
    assert!(
        took >= deadline * 3 / 4 && took < deadline * 3,
        "a half head held its connection {took:?} (deadline {deadline:?})"
    );

    let (got, took) = read_to_close(&mut bodiless, t0);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("\"error\""), "{got}");
    assert!(
        took >= deadline * 3 / 4 && took < deadline * 3,
        "an announced body held its connection {took:?} (deadline {deadline:?})"
    );

    // Still serving.
    let r = ureq::get(&format!("http://{addr}/healthz")).call().unwrap();
    assert_eq!(r.status(), 200);

    // A client keeping its connection open between requests leaves nothing unread: the
    // stop closes it without lingering (the clients answered early are gone by then).
    drop((half, bodiless, unauthorised));
    let mut idle = connect(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let stopping = Instant::now();
    rt.block_on(o.stop());
    assert!(
        stopping.elapsed() < Duration::from_millis(1500),
        "stopped in {:?}",
        stopping.elapsed()
    );
}
