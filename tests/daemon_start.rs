//! `buffetd` and `buffet-orchestrator` refusing to start: one line that names each cause
//! once, and a failed start leaves the data directory as it found it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::daemon::{config_head, free_port, write_config, Daemon};

const ADMIN: &str = "start-test-admin-token-0123456789";

/// A config for `data_dir` listening on `port`, with `port_table` as its `[[port]]`.
fn config(dir: &Path, data_dir: &Path, port: u16, port_table: &str) -> std::path::PathBuf {
    write_config(
        dir,
        &format!(
            "{}[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 64\n{port_table}",
            config_head(data_dir, port, "firewall")
        ),
    )
}

const GENERATOR: &str = "[[port]]\nkind = \"generator\"\ntenants = 2\nrate_pps = 1000\n";

fn buffetd(args: &[&str], token: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_buffetd"));
    c.args(args);
    if token {
        c.env("BUFFETD_ADMIN_TOKEN", ADMIN);
    } else {
        c.env_remove("BUFFETD_ADMIN_TOKEN");
    }
    c
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The error line (`<program>: error: ...`) of a run that must have failed.
fn error_line(out: &Output, program: &str) -> String {
    assert!(!out.status.success(), "{}", stderr(out));
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with(&format!("{program}: error: ")))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    lines[0].to_owned()
}

/// The names in `dir` (sorted), or `None` when it does not exist.
fn listing(dir: &Path) -> Option<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    Some(v)
}

#[test]
fn a_missing_config_names_its_cause_once() {
    let out = buffetd(&["--config", "/nonexistent/buffet.toml"], true)
        .output()
        .unwrap();
    let line = error_line(&out, "buffetd");
    assert_eq!(
        line,
        "buffetd: error: /nonexistent/buffet.toml: No such file or directory (os error 2)"
    );
}

#[test]
fn a_busy_api_port_names_its_cause_once_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    // A data_dir that does not exist yet: it must not exist after the failed start either.
    let fresh = dir.path().join("fresh/data");
    let cfg = config(dir.path(), &fresh, port, GENERATOR);
    // No admin token given: a start that got further would generate one into data_dir.
    let out = buffetd(&["--config", cfg.to_str().unwrap()], false)
        .output()
        .unwrap();
    let line = error_line(&out, "buffetd");
    assert_eq!(
        line,
        format!(
            "buffetd: error: api.listen 127.0.0.1:{port}: Address already in use (os error 98)"
        )
    );
    assert_eq!(listing(&dir.path().join("fresh")), None, "{line}");
    // A data_dir that exists, with something in it: kept as it was, nothing added.
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("keep.txt"), "mine").unwrap();
    let out = buffetd(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            old.to_str().unwrap(),
        ],
        false,
    )
    .output()
    .unwrap();
    error_line(&out, "buffetd");
    assert_eq!(listing(&old), Some(vec!["keep.txt".to_owned()]));
    drop(busy);
}

#[test]
fn a_data_plane_that_cannot_start_leaves_no_files_behind() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let data = dir.path().join("data");
    let cfg = config(
        dir.path(),
        &data,
        port,
        "[[port]]\nkind = \"af_packet\"\niface = \"bfnoiface0\"\n",
    );
    let out = buffetd(&["--config", cfg.to_str().unwrap()], false)
        .output()
        .unwrap();
    let line = error_line(&out, "buffetd");
    assert!(line.contains("port[0]"), "{line}");
    assert_eq!(listing(&data), None, "{line}");
}

#[test]
fn a_second_buffetd_on_the_same_data_dir_is_told_another_one_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let cfg = config(dir.path(), &data, port, GENERATOR);
    let first = Daemon::start(&cfg, port, ADMIN, Stdio::null());
    let api = format!("{}/readyz", first.api);
    let before = listing(&data);
    let other = free_port().to_string();
    let out = buffetd(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{other}"),
        ],
        true,
    )
    .output()
    .unwrap();
    let line = error_line(&out, "buffetd");
    assert_eq!(
        line,
        format!(
            "buffetd: error: data_dir {}: another buffetd is using it (its store, \
             buffetd.redb, is locked): stop that buffetd, or give this one its own data_dir",
            data.display()
        )
    );
    // The first one's files are untouched, and it still serves.
    assert_eq!(listing(&data), before);
    assert!(ureq::get(&api).call().is_ok());
}

/// Starts the daemon of `cfg` in this process on a thread, with a data plane that starts
/// only once the test says so (`true`: as configured; `false`: a start that fails), and
/// returns once the start is waiting for that.
fn start_held(
    cfg: &Path,
) -> (
    std::sync::mpsc::Sender<bool>,
    std::thread::JoinHandle<Result<buffet_daemon::Daemon, buffet_daemon::DaemonError>>,
) {
    use buffet_daemon::plane::{self, StartError};
    let cfg_path = cfg.to_owned();
    let cfg = buffet_daemon::DaemonConfig::load(cfg).unwrap();
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<bool>();
    let starter: buffet_daemon::PlaneStarter = Box::new(move |cfg, path| {
        entered_tx.send(()).unwrap();
        if go_rx.recv().unwrap_or(false) {
            plane::start(cfg, path)
        } else {
            Err(StartError::Nf("refused by the test".into()))
        }
    });
    let start =
        std::thread::spawn(move || buffet_daemon::Daemon::start_with(cfg, &cfg_path, starter));
    entered_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the start reached the data plane");
    (go_tx, start)
}

fn connect(port: u16) -> std::io::Result<std::net::TcpStream> {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
}

#[test]
fn connections_during_the_start_are_refused_until_the_api_serves() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), &data, port, GENERATOR);
    // A start that fails after the API's address is taken: refused throughout, never
    // accepted and then reset.
    let (go, start) = start_held(&cfg);
    let e = connect(port).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    go.send(false).unwrap();
    let err = start.join().unwrap().err().unwrap().to_string();
    assert_eq!(err, "nf: refused by the test");
    assert_eq!(listing(&data), None, "{err}");
    // A start that succeeds: refused while the data plane starts, served once it has.
    let (go, start) = start_held(&cfg);
    let e = connect(port).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    go.send(true).unwrap();
    let daemon = start.join().unwrap().unwrap();
    assert_eq!(daemon.addr().port(), port);
    connect(port).unwrap();
    daemon.stop().unwrap();
}

#[test]
fn an_unreadable_orchestrator_token_file_names_its_cause_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_buffet-orchestrator"))
        .args([
            "--etcd",
            "http://127.0.0.1:1",
            "--admin-token-file",
            "/nonexistent/admin.token",
        ])
        .output()
        .unwrap();
    let line = error_line(&out, "buffet-orchestrator");
    assert_eq!(
        line,
        "buffet-orchestrator: error: --admin-token-file: /nonexistent/admin.token: \
         No such file or directory (os error 2)"
    );
}
