//! `buffetd` as a process, driven by the `buffet` client commands: admission with the
//! generator's traffic flowing, SIGTERM (exit 0 after draining), SIGKILL and restart
//! (every acknowledged tenant back with its last acknowledged policy).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ADMIN: &str = "process-test-admin-token-0123456789";

struct Daemon {
    child: Child,
    api: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(dir: &Path, port: u16) -> Daemon {
    let cfg = dir.join("buffet.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[nf]\nname = \"firewall\"\n\
             [dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 64\n\
             [[port]]\nkind = \"generator\"\ntenants = 4\nrate_pps = 20000\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_buffetd"))
        .arg("--config")
        .arg(&cfg)
        .env("BUFFETD_ADMIN_TOKEN", ADMIN)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let api = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    while ureq::get(&format!("{api}/readyz")).call().is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "buffetd did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Daemon { child, api }
}

/// Runs `buffet ARGS --json` against the daemon; stdout as JSON (or Null), and success.
fn buffet(d: &Daemon, args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(args)
        .arg("--json")
        .env("BUFFET_API", &d.api)
        .env("BUFFET_TOKEN", ADMIN)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.success(),
        serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn signal(d: &Daemon, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(d.child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

#[test]
fn buffetd_serves_the_client_survives_sigkill_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut d = start(dir.path(), port);
    let (ok, v, err) = buffet(
        &d,
        &[
            "tenant",
            "add",
            "--id",
            "1",
            "--rule",
            "dst_ip=10.0.0.0/24",
            "--policy",
            r#"{"default":"allow"}"#,
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(v["id"], 1);
    let file = dir.path().join("tenants.toml");
    std::fs::write(
        &file,
        "[[tenant]]\nid = 1\nname = \"tenant-1\"\nrules = [ { dst_ip = \"10.0.0.0/24\" } ]\n\
         [tenant.policy]\ndefault = \"deny\"\n\n\
         [[tenant]]\nid = 2\nrules = [ { dst_ip = \"10.0.1.0/24\" } ]\n[tenant.policy]\ndefault = \"allow\"\n",
    )
    .unwrap();
    let (ok, v, err) = buffet(&d, &["tenant", "apply", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(v["added"], serde_json::json!([2]));
    assert_eq!(v["updated"], serde_json::json!([1]));
    // Traffic flows to both.
    let t0 = Instant::now();
    loop {
        let (ok, v, err) = buffet(&d, &["stats"]);
        assert!(ok, "{err}");
        let tenants = v["tenants"].as_array().unwrap();
        if tenants.len() == 2 && tenants.iter().all(|t| t["packets"].as_u64() > Some(0)) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, _, err) = buffet(
        &d,
        &["tenant", "add", "--id", "3", "--rule", "dst_ip=10.0.0.0/24"],
    );
    assert!(!ok);
    assert!(
        err.contains("409") && err.contains("overlaps tenant 1"),
        "{err}"
    );

    // SIGKILL: the acknowledged state comes back.
    signal(&d, "KILL");
    d.child.wait().unwrap();
    let mut d = start(dir.path(), port);
    let (ok, v, err) = buffet(&d, &["tenant", "ls"]);
    assert!(ok, "{err}");
    let list = v["tenant"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    assert_eq!(list[0]["policy"]["default"], "deny");
    let (ok, v, _) = buffet(&d, &["workers", "ls"]);
    assert!(ok);
    assert_eq!(v["workers"].as_array().unwrap().len(), 1);

    // SIGTERM: drains and exits 0.
    signal(&d, "TERM");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "buffetd ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn an_invalid_config_is_one_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "data_dir = \"/tmp/x\"\n[nf]\nname = \"monitor\"\n[dataplane]\nworkers = 0\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_buffetd"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dataplane.workers: must be 1..=256, got 0"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
