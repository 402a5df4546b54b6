//! buffetd answers some requests from their head alone (401 for a wrong token), without
//! reading the body. A client still sending a large body then must get the answer, not
//! a connection reset: the server closes lingering (docs/daemon.md).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

mod common;
use common::daemon::{config_head, free_port, write_config, Daemon};

const ADMIN: &str = "linger-test-admin-token-0123456789";

/// buffetd with its body limit at `max_body` bytes (the default without one).
fn start(dir: &Path, port: u16, max_body: Option<usize>) -> Daemon {
    let mut head = config_head(&dir.join("data"), port, "firewall");
    if let Some(max) = max_body {
        let listen = format!("listen = \"127.0.0.1:{port}\"\n");
        head = head.replace(&listen, &format!("{listen}max_body_bytes = {max}\n"));
        assert!(head.contains("max_body_bytes"), "{head}");
    }
    let text = format!(
        "{head}[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 64\n\
         [[port]]\nkind = \"generator\"\ntenants = 4\nrate_pps = 1000\n"
    );
    Daemon::start(&write_config(dir, &text), port, ADMIN, Stdio::null())
}

/// Sends an admission of `body` bytes with a wrong token, slowly, as one client does:
/// the whole body first, then the answer is read. What went wrong, if anything.
fn wrong_token_with_a_large_body(port: u16, body: usize) -> Result<(), String> {
    const CHUNK: usize = 16 << 10;
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /v1/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Authorization: Bearer not-the-admin-token-0123456789\r\n\
         Content-Type: application/json\r\nContent-Length: {body}\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .map_err(|e| format!("sending the head: {e}"))?;
    // The 401 is on its way before most of the body is.
    std::thread::sleep(Duration::from_millis(20));
    let chunk = vec![b' '; CHUNK];
    for i in 0..body / CHUNK {
        s.write_all(&chunk)
            .map_err(|e| format!("sending the body, at byte {}: {e}", i * CHUNK))?;
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .map_err(|e| format!("reading the answer: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.lines().next().unwrap_or_default();
    if status.starts_with("HTTP/1.1 401") {
        Ok(())
    } else {
        Err(format!("answered {status:?}"))
    }
}

#[test]
fn a_client_sending_a_large_body_gets_its_401_not_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _d = start(dir.path(), port, None);
    let failures: Vec<String> = (0..20)
        .filter_map(|i| {
            wrong_token_with_a_large_body(port, 1 << 20)
                .err()
                .map(|e| format!("attempt {i}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// With the body limit raised above the default, the linger follows it: a 3 MiB body
/// the server would accept still gets its 401, not a reset after the first MiB.
#[test]
fn a_raised_body_limit_lingers_for_a_body_of_that_size() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _d = start(dir.path(), port, Some(4 << 20));
    let failures: Vec<String> = (0..4)
        .filter_map(|i| {
            wrong_token_with_a_large_body(port, 3 << 20)
                .err()
                .map(|e| format!("attempt {i}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
