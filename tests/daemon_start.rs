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

/// `(status, JSON body or Null)` of `method path` with `token`.
fn http(
    api: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let body = body.map(serde_json::Value::to_string);
    buffet_testkit::http::json(
        method,
        &format!("{api}{path}"),
        Some(token),
        body.as_deref(),
        Duration::from_secs(10),
    )
}

/// A stored tenant the new config no longer admits (it asked for `safe`, the server now
/// runs `trusted-native`) costs the others nothing: buffetd starts, serves the other,
/// says once on stderr which tenant it kept in the store and why, lists it as not
/// running; DELETE removes it (and its token), and the next start knows nothing of it.
#[test]
fn a_stored_tenant_that_no_longer_fits_is_kept_not_running_and_the_others_serve() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let cfg_at = |isolation: &str| {
        write_config(
            dir.path(),
            &format!(
                "{}{isolation}[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 64\n\
                 {GENERATOR}",
                config_head(&data, port, "firewall")
            ),
        )
    };
    let log = |name: &str| {
        let p = dir.path().join(name);
        let f = std::fs::File::create(&p).unwrap();
        (p, Stdio::from(f))
    };
    let strict = serde_json::json!({ "id": 1, "name": "strict", "isolation": "safe",
        "rules": [ { "dst_ip": "10.0.0.0/24" } ], "policy": { "default": "allow" } });
    let plain = serde_json::json!({ "id": 2, "name": "plain",
        "rules": [ { "dst_ip": "10.0.1.0/24" } ], "policy": { "default": "allow" } });
    let cfg = cfg_at("");
    let token = {
        let (_, err) = log("first.log");
        let d = Daemon::start(&cfg, port, ADMIN, err);
        for t in [&strict, &plain] {
            let (s, v) = http(&d.api, "POST", "/v1/tenants", ADMIN, Some(t));
            assert_eq!(s, 201, "{v}");
        }
        let (s, v) = http(&d.api, "POST", "/v1/tenants/1/tokens", ADMIN, None);
        assert_eq!(s, 201, "{v}");
        v["token"].as_str().unwrap().to_owned()
        // Dropped: killed; the store has both tenants.
    };

    // Restarted at another isolation level: tenant 1 no longer fits, tenant 2 does.
    let cfg = cfg_at("isolation = \"trusted-native\"\n");
    let (second, err) = log("second.log");
    let d = Daemon::start(&cfg, port, ADMIN, err);
    let t0 = std::time::Instant::now();
    loop {
        let (s, v) = http(&d.api, "GET", "/v1/tenants/2/stats", ADMIN, None);
        assert_eq!(s, 200, "{v}");
        if v["packets"].as_u64().unwrap() > 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "tenant 2 is not served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = std::fs::read_to_string(&second).unwrap();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("tenant 1")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line = lines[0];
    assert!(
        line.starts_with(&format!(
            "buffetd: store {}: tenant 1 (\"strict\") not restored",
            data.join("buffetd.redb").display()
        )),
        "{line}"
    );
    assert_eq!(line.matches("tenant 1").count(), 1, "{line}");
    assert_eq!(
        line.matches("isolation: asks for safe").count(),
        1,
        "{line}"
    );
    assert!(!line.contains("request"), "{line}");

    // Listed as not running, with why; readable with its token; nothing classified to it.
    let (s, v) = http(&d.api, "GET", "/v1/tenants", ADMIN, None);
    assert_eq!(s, 200, "{v}");
    let rows = v["tenant"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert_eq!(rows[0]["id"], 1, "{v}");
    assert_eq!(rows[0]["state"], "not_restored", "{v}");
    let reason = rows[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("isolation: asks for safe"), "{reason}");
    assert_eq!(rows[1]["id"], 2, "{v}");
    assert!(rows[1].get("state").is_none(), "{v}");
    let (s, v) = http(&d.api, "GET", "/v1/tenants/1", &token, None);
    assert_eq!(
        (s, &v["state"]),
        (200, &serde_json::json!("not_restored")),
        "{v}"
    );
    let (s, v) = http(&d.api, "GET", "/v1/tenants/1/stats", ADMIN, None);
    assert_eq!(s, 404, "{v}");
    let (s, v) = http(&d.api, "GET", "/v1/stats", ADMIN, None);
    assert_eq!(s, 200, "{v}");
    let served: Vec<u64> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(served, vec![2], "{v}");

    // Removed: from the list, the store and with its token.
    let (s, v) = http(&d.api, "DELETE", "/v1/tenants/1", ADMIN, None);
    assert_eq!(s, 204, "{v}");
    assert_eq!(http(&d.api, "GET", "/v1/tenants/1", ADMIN, None).0, 404);
    assert_eq!(http(&d.api, "GET", "/v1/tenants/1", &token, None).0, 401);
    drop(d);

    // The next start: nothing about tenant 1 is left.
    let (third, err) = log("third.log");
    let d = Daemon::start(&cfg, port, ADMIN, err);
    let (s, v) = http(&d.api, "GET", "/v1/tenants", ADMIN, None);
    assert_eq!(s, 200, "{v}");
    let ids: Vec<u64> = v["tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![2], "{v}");
    assert_eq!(http(&d.api, "GET", "/v1/tenants/1", &token, None).0, 401);
    let err = std::fs::read_to_string(&third).unwrap();
    assert!(!err.contains("tenant 1"), "{err}");
}
