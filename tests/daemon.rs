//! `buffetd` as a process, driven by the `buffet` client commands: admission with the
//! generator's traffic flowing, SIGTERM (exit 0 after draining), SIGKILL and restart
//! (every acknowledged tenant back with its last acknowledged policy); on an `af_xdp`
//! port (root), the warning about tenants matching on `vlan`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use buffet_testkit::cores_used_over;
use common::daemon::{config_head, free_port, write_config, Daemon};

const ADMIN: &str = "process-test-admin-token-0123456789";

fn start(dir: &Path, port: u16) -> Daemon {
    start_with(dir, port, "", None)
}

/// Writes `<dir>/buffet.toml` (`extra` appended to `[dataplane]`) and starts buffetd on
/// it, its stderr appended to `log` (or discarded); returns once it is ready.
fn start_with(dir: &Path, port: u16, extra: &str, log: Option<&Path>) -> Daemon {
    start_config(dir, port, &config_text(dir, port, extra), log)
}

/// Writes `text` to `<dir>/buffet.toml` and starts buffetd on it (see [`start_with`]).
fn start_config(dir: &Path, port: u16, text: &str, log: Option<&Path>) -> Daemon {
    let cfg = write_config(dir, text);
    let stderr = match log {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap(),
        ),
        None => Stdio::null(),
    };
    Daemon::start(&cfg, port, ADMIN, stderr)
}

fn config_text(dir: &Path, port: u16, extra: &str) -> String {
    let arena = if extra.contains("arena_mib") {
        ""
    } else {
        "arena_mib = 64\n"
    };
    format!(
        "{}[dataplane]\nworkers = 1\n{arena}tenant_slots = 64\n{extra}\n\
         [[port]]\nkind = \"generator\"\ntenants = 4\nrate_pps = 20000\n",
        config_head(&dir.join("data"), port, "firewall")
    )
}

/// `child`'s exit status once it exits; fails with `why` if it has not within `limit`.
fn exit_within(child: &mut Child, limit: Duration, why: &str) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(t0.elapsed() < limit, "{why}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn buffetd_serves_the_client_survives_sigkill_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut d = start(dir.path(), port);
    let (ok, v, err) = d.client(&[
        "tenant",
        "add",
        "--id",
        "1",
        "--rule",
        "dst_ip=10.0.0.0/24",
        "--policy",
        r#"{"default":"allow"}"#,
    ]);
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
    let (ok, v, err) = d.client(&["tenant", "apply", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(v["added"], serde_json::json!([2]));
    assert_eq!(v["updated"], serde_json::json!([1]));
    // Traffic flows to both.
    let t0 = Instant::now();
    loop {
        let (ok, v, err) = d.client(&["stats"]);
        assert!(ok, "{err}");
        let tenants = v["tenants"].as_array().unwrap();
        if tenants.len() == 2 && tenants.iter().all(|t| t["packets"].as_u64() > Some(0)) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, _, err) = d.client(&["tenant", "add", "--id", "3", "--rule", "dst_ip=10.0.0.0/24"]);
    assert!(!ok);
    assert!(
        err.contains("409") && err.contains("overlaps tenant 1"),
        "{err}"
    );

    // SIGKILL: the acknowledged state comes back.
    d.signal("KILL");
    d.child.wait().unwrap();
    let mut d = start(dir.path(), port);
    let (ok, v, err) = d.client(&["tenant", "ls"]);
    assert!(ok, "{err}");
    let list = v["tenant"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    assert_eq!(list[0]["policy"]["default"], "deny");
    let (ok, v, _) = d.client(&["workers", "ls"]);
    assert!(ok);
    assert_eq!(v["workers"].as_array().unwrap().len(), 1);

    // SIGTERM: drains and exits 0.
    d.signal("TERM");
    let status = exit_within(
        &mut d.child,
        Duration::from_secs(20),
        "buffetd ignored SIGTERM",
    );
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

/// `(status, JSON body or Null)`, or `None` when the request got no answer (the daemon
/// died).
fn http(
    api: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Option<(u16, serde_json::Value)> {
    let body = body.map(serde_json::Value::to_string);
    let url = format!("{api}{path}");
    buffet_testkit::http::try_json(
        method,
        &url,
        Some(ADMIN),
        body.as_deref(),
        Duration::from_secs(10),
    )
}

fn wait_for_line(log: &Path, needle: &str) -> String {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return l.to_owned();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no {needle:?} in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_reloads_what_may_change_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("buffetd.log");
    let mut d = start_with(dir.path(), port, "max_workers = 1", Some(&log));
    assert_eq!(http(&d.api, "POST", "/v1/workers", None).unwrap().0, 409);
    // A reloadable field.
    let cfg = dir.path().join("buffet.toml");
    std::fs::write(&cfg, config_text(dir.path(), port, "max_workers = 2")).unwrap();
    d.signal("HUP");
    let line = wait_for_line(&log, "SIGHUP: config reloaded");
    assert!(line.contains("dataplane.max_workers"), "{line}");
    assert_eq!(http(&d.api, "POST", "/v1/workers", None).unwrap().0, 201);
    // One that needs a restart: one line naming it, nothing changed, still serving.
    std::fs::write(
        &cfg,
        config_text(dir.path(), port, "max_workers = 3\nshift = 20"),
    )
    .unwrap();
    d.signal("HUP");
    let line = wait_for_line(&log, "SIGHUP: reload refused");
    assert!(
        line.ends_with("dataplane.shift cannot change without a restart"),
        "{line}"
    );
    assert_eq!(http(&d.api, "GET", "/healthz", None).unwrap().0, 200);
    assert_eq!(http(&d.api, "POST", "/v1/workers", None).unwrap().0, 409);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(ADMIN), "a token in the log");
    d.child.kill().unwrap();
    d.child.wait().unwrap();
}

#[test]
fn buffet_reload_applies_what_may_change_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("buffetd.log");
    let mut d = start_with(dir.path(), port, "max_workers = 1", Some(&log));
    let (ok, v, err) = d.client(&["reload"]);
    assert!(ok, "{err}");
    assert_eq!(v, serde_json::json!({ "changed": [] }));
    assert_eq!(http(&d.api, "POST", "/v1/workers", None).unwrap().0, 409);
    let cfg = dir.path().join("buffet.toml");
    std::fs::write(&cfg, config_text(dir.path(), port, "max_workers = 2")).unwrap();
    let (ok, v, err) = d.client(&["reload"]);
    assert!(ok, "{err}");
    assert_eq!(
        v,
        serde_json::json!({ "changed": ["dataplane.max_workers"] })
    );
    assert_eq!(http(&d.api, "POST", "/v1/workers", None).unwrap().0, 201);
    // A field that needs a restart: the command fails naming it, nothing changed.
    std::fs::write(
        &cfg,
        config_text(dir.path(), port, "max_workers = 3\nshift = 20"),
    )
    .unwrap();
    let (ok, _, err) = d.client(&["reload"]);
    assert!(!ok);
    assert!(
        err.contains("409") && err.contains("dataplane.shift cannot change without a restart"),
        "{err}"
    );
    assert_eq!(http(&d.api, "POST", "/v1/workers", None).unwrap().0, 409);
    // The human form.
    std::fs::write(&cfg, config_text(dir.path(), port, "max_workers = 2")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .arg("reload")
        .env("BUFFET_API", &d.api)
        .env("BUFFET_TOKEN", ADMIN)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "config reloaded: nothing changed\n"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("API: reload refused"), "{text}");
    assert!(!text.contains(ADMIN), "a token in the log");
    d.child.kill().unwrap();
    d.child.wait().unwrap();
}

/// What the client knows of one tenant: its last acknowledged document (`None`:
/// absent) and, while a request is in flight, the document that request leaves
/// (`Some(None)`: a removal). A request in flight when the daemon dies may or may not
/// have committed: after a restart the tenant is as last acknowledged, or as that
/// request leaves it, and nothing else.
#[derive(Clone, Default)]
struct Known {
    acked: Option<serde_json::Value>,
    pending: Option<Option<serde_json::Value>>,
}

/// A small seeded generator (xorshift64*), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Admissions, updates (policy, rules, MAX_NB, name) and removals against buffetd,
/// SIGKILLed at random moments and restarted each time: after every restart each tenant
/// is wholly there with its last acknowledged document (or the one of the request in
/// flight at the kill), in the store's view and in the data plane's, or wholly absent.
#[test]
fn sigkill_at_random_moments_never_leaves_a_half_changed_tenant() {
    use std::sync::{Arc, Mutex};
    const TENANTS: u32 = 12;
    let seed: u64 = std::env::var("BUFFET_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_b0ff);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let known = Arc::new(Mutex::new(vec![Known::default(); TENANTS as usize + 1]));
    let mut rng = Rng(seed | 1);
    let t0 = Instant::now();
    let (mut acked_ops, mut kills, mut version) = (0u64, 0u32, 0u64);
    while (acked_ops < 300 || kills < 40) && t0.elapsed() < Duration::from_secs(45) {
        // Room for every tenant's firewall region (4.5 MB), a second one while a policy
        // is replaced, and the regions of removed tenants until their packets drain.
        let mut d = start_with(dir.path(), port, "arena_mib = 1024", None);
        // Check every tenant against what the client knows.
        let (s, list) = http(&d.api, "GET", "/v1/tenants", None).unwrap();
        assert_eq!(s, 200);
        let (s, report) = http(&d.api, "GET", "/v1/stats", None).unwrap();
        assert_eq!(s, 200);
        let mut k = known.lock().unwrap();
        for id in 1..=TENANTS {
            let stored = list["tenant"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["id"] == id)
                .cloned();
            let running = report["tenants"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["id"] == id)
                .cloned();
            let e = &mut k[id as usize];
            assert!(
                stored == e.acked || e.pending.as_ref().is_some_and(|p| *p == stored),
                "seed {seed}, after kill {kills}: tenant {id} is {stored:?}; acknowledged \
                 {:?}, in flight {:?}",
                e.acked,
                e.pending
            );
            // The data plane has the same tenant: present with the stored name (a name
            // change travels with the rules swap), or absent.
            assert_eq!(
                running.as_ref().map(|r| r["name"].clone()),
                stored.as_ref().map(|t| t["name"].clone()),
                "seed {seed}: tenant {id} in the data plane"
            );
            e.acked = stored;
            e.pending = None;
        }
        drop(k);
        // Requests until the kill.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = {
            let (api, known, stop) = (d.api.clone(), known.clone(), stop.clone());
            let mut rng = Rng(rng.next() | 1);
            let mut version = version;
            std::thread::spawn(move || {
                let mut acked = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = 1 + rng.below(u64::from(TENANTS)) as u32;
                    version += 1;
                    let doc = serde_json::json!({
                        "id": id,
                        "name": format!("t{id}-v{version}"),
                        "rules": [ { "dst_ip": format!("10.{}.{id}.0/24", rng.below(2)) } ],
                        "max_nb": rng.below(3) * 1000,
                        "policy": { "default": if rng.below(2) == 0 { "allow" } else { "deny" } },
                    });
                    let present = known.lock().unwrap()[id as usize].acked.is_some();
                    let (method, path, body, after) = match (present, rng.below(3)) {
                        (false, _) => (
                            "POST",
                            "/v1/tenants".to_owned(),
                            Some(&doc),
                            Some(doc.clone()),
                        ),
                        (true, 0) => ("DELETE", format!("/v1/tenants/{id}"), None, None),
                        (true, _) => (
                            "PUT",
                            format!("/v1/tenants/{id}"),
                            Some(&doc),
                            Some(doc.clone()),
                        ),
                    };
                    known.lock().unwrap()[id as usize].pending = Some(after.clone());
                    let Some((status, v)) = http(&api, method, &path, body) else {
                        break;
                    };
                    assert!(
                        (200..300).contains(&status),
                        "{method} {path}: {status} {v}"
                    );
                    let mut k = known.lock().unwrap();
                    k[id as usize].acked = after;
                    k[id as usize].pending = None;
                    acked += 1;
                }
                (acked, version)
            })
        };
        std::thread::sleep(Duration::from_millis(20 + rng.below(250)));
        d.child.kill().unwrap();
        d.child.wait().unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (n, v) = client.join().unwrap();
        acked_ops += n;
        version = v;
        kills += 1;
    }
    assert!(
        acked_ops >= 300 && kills >= 40,
        "only {acked_ops} acknowledged requests and {kills} kills in {:?}",
        t0.elapsed()
    );
    eprintln!(
        "{acked_ops} acknowledged requests, {kills} SIGKILLs, {:?}",
        t0.elapsed()
    );
}

#[test]
fn buffet_events_follows_the_stream_until_the_daemon_stops() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut d = start_with(dir.path(), port, "max_workers = 2", None);
    let mut events = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(["events", "--follow", "--json"])
        .env("BUFFET_API", &d.api)
        .env("BUFFET_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = events.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    // The stream is open before the event: a worker launched after it is subscribed shows.
    let t0 = Instant::now();
    let launched = loop {
        let (ok, v, err) = d.client(&["workers", "add"]);
        assert!(ok, "{err}");
        let id = v["id"].as_u64().expect("the new worker's id");
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut seen = None;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = rx.recv_timeout(left) else {
                break;
            };
            let v: serde_json::Value =
                serde_json::from_str(&line).expect("one JSON object per line");
            if v["event"] == "worker_launched" {
                seen = Some(v);
                break;
            }
        }
        if let Some(v) = seen {
            break (id, v);
        }
        // Not subscribed yet when the worker came up: take it down and try again.
        if let Some(status) = events.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut events.stderr.take().unwrap(), &mut err).unwrap();
            panic!("buffet events exited ({status}): {err}");
        }
        let (ok, _, err) = d.client(&["workers", "rm", &id.to_string()]);
        assert!(ok, "{err}");
        while rx.recv_timeout(Duration::from_millis(500)).is_ok() {}
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no event reached buffet events"
        );
    };
    assert_eq!(
        launched.1["worker"].as_u64(),
        Some(launched.0),
        "{}",
        launched.1
    );

    // SIGTERM ends the stream, and the follower exits 0.
    d.signal("TERM");
    d.child.wait().unwrap();
    let status = exit_within(
        &mut events,
        Duration::from_secs(20),
        "buffet events outlived the stream",
    );
    assert!(status.success(), "{status}");
}

/// A buffetd whose only port has ended (a replayed pcap) and which has no traffic sleeps:
/// with `dataplane.idle_wait_us` = 1 s its data plane and workers block until a command
/// or a frame comes, using almost no CPU (its data plane used to nap 100 µs at a time
/// whatever the setting, about a tenth of a core), and an admission through the API is
/// still answered at once, not after the idle wait.
#[test]
fn an_idle_buffetd_sleeps_and_still_answers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // A pcap of no frames: the port ends at once.
    let pcap = dir.path().join("empty.pcap");
    let mut header = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
    header.extend([0u8; 8]);
    header.extend(65535u32.to_le_bytes());
    header.extend(1u32.to_le_bytes());
    std::fs::write(&pcap, header).unwrap();
    let text = format!(
        "{}[dataplane]\nworkers = 2\narena_mib = 64\ntenant_slots = 64\nidle_wait_us = 1000000\n\
         [[port]]\nkind = \"pcap\"\npath = \"{p}\"\n",
        config_head(&dir.path().join("data"), port, "firewall"),
        p = pcap.display()
    );
    let d = start_config(dir.path(), port, &text, None);
    std::thread::sleep(Duration::from_millis(500));
    let pid = d.child.id();
    let cores = cores_used_over(pid, Duration::from_secs(3));
    eprintln!("idle buffetd: {cores:.3} cores");
    assert!(
        cores < 0.04,
        "an idle buffetd used {cores:.3} cores over 3 s"
    );
    // Asleep, it still answers an admission (the API's command wakes the data plane).
    let body = serde_json::json!({
        "id": 1,
        "rules": [ { "dst_ip": "10.0.0.0/24" } ],
        "policy": { "default": "allow" },
    });
    let t0 = Instant::now();
    let (status, v) = http(&d.api, "POST", "/v1/tenants", Some(&body)).expect("answered");
    let took = t0.elapsed();
    assert_eq!(status, 201, "{v}");
    assert!(
        took < Duration::from_millis(500),
        "an admission to an idle buffetd took {took:?} (its idle wait is 1 s)"
    );
    let (status, v) = http(&d.api, "GET", "/v1/stats", None).expect("answered");
    assert_eq!(status, 200, "{v}");
    assert!(v["tenants"].as_array().is_some_and(|t| t.len() == 1), "{v}");
}

/// buffetd receiving through an `af_xdp` port (whose frames an XDP program and an AF_XDP
/// socket see without the 802.1Q tag a NIC's VLAN offload took out) says so on stderr,
/// as `buffet run` does: once for each admission or change of a tenant whose rules
/// match on `vlan`, naming it and `ethtool -K IF rxvlan off`, nothing for the others,
/// and once at start for the stored tenants that do. Needs root and `ip` (a veth pair
/// in two network namespaces); skipped otherwise, a failure under
/// `BUFFET_REQUIRE_PRIVILEGED=1` or CI.
#[test]
fn a_vlan_rule_on_an_af_xdp_port_is_warned_about_at_admission_and_at_start() {
    use common::netns::{ip, privileged, NsPair};
    use std::io::Read;
    if !privileged(
        "daemon::a_vlan_rule_on_an_af_xdp_port_is_warned_about_at_admission_and_at_start",
    ) {
        return;
    }
    let ns = NsPair::new();
    ip(&["-n", &ns.a, "link", "set", "lo", "up"]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        &format!(
            "{}[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 16\n\
             [[port]]\nkind = \"af_xdp\"\niface = \"{}\"\nxdp_mode = \"generic\"\n",
            config_head(&dir.path().join("data"), port, "firewall"),
            ns.va
        ),
    );
    // Stopped with SIGTERM: its stderr, whole.
    let stop = |mut d: Daemon| {
        d.signal("TERM");
        let status = exit_within(&mut d.child, Duration::from_secs(20), "no exit on SIGTERM");
        let mut err = String::new();
        d.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{status}: {err}");
        err
    };
    let warnings = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.starts_with("buffetd: warning: tenant"))
            .map(str::to_owned)
            .collect()
    };
    let ethtool = format!("(ethtool -K {} rxvlan off)", ns.va);

    let d = Daemon::start_in(&ns.a, &cfg, port, ADMIN);
    for args in [
        &[
            "tenant",
            "add",
            "--id",
            "4",
            "--rule",
            "dst_ip=10.4.0.0/16,vlan=12",
        ][..],
        &["tenant", "add", "--id", "5", "--rule", "dst_ip=10.5.0.0/16"],
        &[
            "tenant",
            "update",
            "--id",
            "5",
            "--rule",
            "dst_ip=10.5.0.0/16,vlan=7",
        ],
    ] {
        let (ok, v, err) = d.client(args);
        assert!(ok, "{args:?}: {err} {v}");
    }
    let err = stop(d);
    let w = warnings(&err);
    assert_eq!(w.len(), 2, "{err}");
    assert!(
        w[0].starts_with("buffetd: warning: tenant 4 matches on vlan, but"),
        "{err}"
    );
    assert!(
        w[1].starts_with("buffetd: warning: tenant 5 matches on vlan, but"),
        "{err}"
    );
    assert!(w.iter().all(|l| l.contains(&ethtool)), "{err}");

    // At start, once, for the stored tenants that match on vlan.
    let d = Daemon::start_in(&ns.a, &cfg, port, ADMIN);
    let err = stop(d);
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(
        w[0].starts_with("buffetd: warning: tenants 4, 5 match on vlan"),
        "{err}"
    );
    assert!(w[0].contains(&ethtool), "{err}");
}
