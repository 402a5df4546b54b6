//! A cluster on loopback: a real etcd (Debian's etcd-server, started by the test), three
//! `buffetd` agents with the generator's traffic, two `buffet-orchestrator`s, all as
//! processes. 300 tenants admitted and spread; an etcd restart (no placement lost, no
//! tenant re-admitted); the leader Orchestrator killed with admissions in flight; an
//! agent killed (SIGKILL) and its tenants re-placed on the two others, never on two
//! servers at once; bad input. Placement latency and re-placement time are printed.
//!
//! Without an `etcd` binary the tests skip (`SKIP (privilege): ...`), or fail under
//! `BUFFET_REQUIRE_PRIVILEGED=1` / `CI=true`, where .ci/run installs it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use buffet_orchestrator::local_etcd::{LocalEtcd, LocalEtcdError};
use serde_json::{json, Value};

mod common;
use common::daemon::free_port;

/// buffetd's admin token (every agent's).
const ADMIN: &str = "cluster-test-admin-token-0123456789";
/// The Orchestrators' admin token.
const ORCH: &str = "cluster-test-orchestrator-token-42";
/// The Orchestrators' reader token (GET only).
const READER: &str = "cluster-test-reader-token-0042";

fn etcd_or_skip(test: &str) -> Option<LocalEtcd> {
    buffet_testkit::gate::started_or_skip(test, LocalEtcd::start(), LocalEtcdError::is_missing)
}

/// A child process, killed on drop.
struct Proc {
    child: Child,
    url: String,
    name: String,
}

impl Proc {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_ready(p: &mut Proc, path: &str, log: &Path) {
    let t0 = Instant::now();
    while ureq::get(&format!("{}{path}", p.url)).call().is_err() {
        if let Ok(Some(s)) = p.child.try_wait() {
            panic!(
                "{} exited with {s}: {}",
                p.name,
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{} did not start",
            p.name
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn orchestrator(dir: &Path, name: &str, etcd: &str) -> Proc {
    let port = free_port();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_buffet-orchestrator"))
        .args(["--etcd", etcd, "--listen", &format!("127.0.0.1:{port}")])
        .args(["--lease-ttl", "5", "--admit-timeout", "30"])
        .env("BUFFET_ORCHESTRATOR_ADMIN_TOKEN", ORCH)
        .env("BUFFET_ORCHESTRATOR_READER_TOKEN", READER)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut p = Proc {
        child,
        url: format!("http://127.0.0.1:{port}"),
        name: name.into(),
    };
    wait_ready(&mut p, "/healthz", &log);
    p
}

/// `(status, JSON body or Null)`; `None` when the connection failed.
fn try_call(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Option<(u16, Value)> {
    let body = body.map(Value::to_string);
    buffet_testkit::http::try_json(method, url, token, body.as_deref(), Duration::from_secs(40))
}

/// A request to an Orchestrator, with its admin token.
fn call(method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
    try_call(method, url, Some(ORCH), body).unwrap_or_else(|| panic!("{method} {url}: no answer"))
}

fn tenant(i: u32) -> Value {
    json!({
        "id": i, "name": format!("t{i}"),
        "rules": [ { "dst_ip": format!("10.{}.{}.0/24", (i - 1) / 256, (i - 1) % 256) } ],
        "policy": { "default": "allow" },
        "expected_pps": 100,
    })
}

/// The tenant ids a buffetd serves, with their packet counts.
fn served(a: &Proc) -> BTreeMap<u32, u64> {
    let (s, v) = try_call("GET", &format!("{}/v1/stats", a.url), Some(ADMIN), None)
        .unwrap_or((0, Value::Null));
    assert_eq!(s, 200, "{}: {v}", a.name);
    v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap() as u32,
                t["packets"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Tenant `id`'s packets its NF did not pass, on buffetd `a`.
fn served_drops(a: &Proc, id: u32) -> u64 {
    let (s, v) = try_call(
        "GET",
        &format!("{}/v1/tenants/{id}/stats", a.url),
        Some(ADMIN),
        None,
    )
    .unwrap_or((0, Value::Null));
    assert_eq!(s, 200, "{}: {v}", a.name);
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    n("packets") - n("passed")
}

/// The orchestrator's list: id -> (server, state).
fn listed(o: &Proc) -> BTreeMap<u32, (Option<String>, String)> {
    let (s, v) = call("GET", &format!("{}/v1/tenants", o.url), None);
    assert_eq!(s, 200, "{v}");
    v["tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap() as u32,
                (
                    t["server"].as_str().map(str::to_owned),
                    t["state"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

/// No tenant on two servers; returns tenant -> server.
fn disjoint(agents: &[&Proc]) -> BTreeMap<u32, String> {
    let mut at = BTreeMap::new();
    for a in agents {
        for id in served(a).keys() {
            if let Some(other) = at.insert(*id, a.name.clone()) {
                panic!("tenant {id} is on {other} and {} at once", a.name);
            }
        }
    }
    at
}

fn leader_of(orchs: &[&Proc]) -> usize {
    let t0 = Instant::now();
    loop {
        for (i, o) in orchs.iter().enumerate() {
            if let Some((200, v)) =
                try_call("GET", &format!("{}/v1/leader", o.url), Some(ORCH), None)
            {
                if v["is_leader"] == true {
                    return i;
                }
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no leader elected");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn three_agents_two_orchestrators_place_survive_etcd_restart_leader_and_agent_death() {
    let test = "three_agents_two_orchestrators_place_survive_etcd_restart_leader_and_agent_death";
    let Some(mut etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let agents: Vec<Proc> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| agent(dir.path(), id, &url, 100_000))
        .collect();
    let mut orchs = vec![
        orchestrator(dir.path(), "orch-a", &url),
        orchestrator(dir.path(), "orch-b", &url),
    ];
    let li = leader_of(&[&orchs[0], &orchs[1]]);
    let leader = orchs[li].url.clone();
    let follower = orchs[1 - li].url.clone();
    let t0 = Instant::now();
    loop {
        let (_, v) = call("GET", &format!("{leader}/v1/servers"), None);
        if v["servers"].as_array().map_or(0, Vec::len) == 3 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "servers: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A follower names the leader.
    let (s, v) = call("POST", &format!("{follower}/v1/tenants"), Some(&tenant(1)));
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["leader"], json!(leader), "{v}");

    // 300 admissions, four clients at once: each answers once live.
    let t_admit = Instant::now();
    let lat: Vec<f64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4u32)
            .map(|k| {
                let leader = leader.clone();
                sc.spawn(move || {
                    let mut lat = Vec::new();
                    for i in (1..=300u32).filter(|i| i % 4 == k) {
                        let t = Instant::now();
                        let (s, v) =
                            call("POST", &format!("{leader}/v1/tenants"), Some(&tenant(i)));
                        assert_eq!(s, 201, "tenant {i}: {v}");
                        assert_eq!(v["state"], "live", "{v}");
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    lat
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let admit_s = t_admit.elapsed().as_secs_f64();
    let mut sorted = lat.clone();
    sorted.sort_by(f64::total_cmp);
    let placed = listed(&orchs[li]);
    assert_eq!(placed.len(), 300);
    assert!(placed.values().all(|(_, st)| st == "live"), "{placed:?}");
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for (srv, _) in placed.values() {
        *per.entry(srv.clone().unwrap()).or_default() += 1;
    }
    // Equal expected rates, equal servers: the most-headroom policy spreads evenly.
    assert!(per.values().all(|n| (95..=105).contains(n)), "{per:?}");
    let refs: Vec<&Proc> = agents.iter().collect();
    let at = disjoint(&refs);
    assert_eq!(at.len(), 300);
    for (id, (srv, _)) in &placed {
        assert_eq!(
            at[id],
            format!("buffetd {}", srv.as_deref().unwrap()),
            "tenant {id}"
        );
    }
    // Traffic flows to every tenant, on its one server.
    let t0 = Instant::now();
    loop {
        let silent: Vec<u32> = agents
            .iter()
            .flat_map(|a| {
                served(a)
                    .into_iter()
                    .filter(|(_, n)| *n == 0)
                    .map(|(id, _)| id)
            })
            .collect();
        if silent.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no traffic yet: {silent:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // etcd restarted: nothing lost, nothing re-admitted (packet counters keep growing).
    let before: Vec<BTreeMap<u32, u64>> = agents.iter().map(served).collect();
    etcd.kill();
    std::thread::sleep(Duration::from_millis(1000));
    etcd.resume().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let t0 = Instant::now();
    let after_list = loop {
        if let Some((200, _)) = try_call("GET", &format!("{leader}/v1/tenants"), Some(ORCH), None) {
            break listed(&orchs[li]);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "orchestrator lost etcd"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        after_list, placed,
        "placements changed across the etcd restart"
    );
    for (a, b) in agents.iter().zip(&before) {
        let now = served(a);
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "{}",
            a.name
        );
        for (id, n) in b {
            assert!(
                now[id] >= *n,
                "{}: tenant {id} was re-admitted ({} < {n}); its log: {}",
                a.name,
                now[id],
                std::fs::read_to_string(dir.path().join(&a.name[8..]).join("buffetd.log"))
                    .unwrap_or_default()
            );
        }
    }

    // The leader killed with admissions in flight: each completes or fails cleanly.
    let pending: Vec<u32> = (301..=320).collect();
    let answers: Vec<Option<(u16, Value)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = pending
            .iter()
            .map(|i| {
                let leader = leader.clone();
                let i = *i;
                sc.spawn(move || {
                    try_call(
                        "POST",
                        &format!("{leader}/v1/tenants"),
                        Some(ORCH),
                        Some(&tenant(i)),
                    )
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        orchs[li].kill();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let t_kill = Instant::now();
    let mut completed_before = 0;
    for (i, a) in pending.iter().zip(&answers) {
        if matches!(a, Some((201, _))) {
            completed_before += 1;
            continue;
        }
        // Retried on the other Orchestrator once it leads.
        loop {
            let (s, v) = call("POST", &format!("{follower}/v1/tenants"), Some(&tenant(*i)));
            if s == 201 {
                break;
            }
            assert_eq!(s, 503, "tenant {i}: {v}");
            assert!(
                t_kill.elapsed() < Duration::from_secs(30),
                "no takeover: {v}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let takeover_s = t_kill.elapsed().as_secs_f64();
    let o2 = &orchs[1 - li];
    let all = listed(o2);
    assert_eq!(all.len(), 320);
    assert!(all.values().all(|(_, st)| st == "live"), "{all:?}");
    assert_eq!(disjoint(&refs).len(), 320);

    // SIGKILL an agent: its tenants go to the two others, never on two servers at once.
    let mut agents = agents;
    let victim = agents.remove(0);
    let victim_tenants = served(&victim).len();
    let mut victim = victim;
    victim.kill();
    let t_dead = Instant::now();
    let survivors: Vec<&Proc> = agents.iter().collect();
    let replaced_s = loop {
        let l = listed(o2);
        let on_dead = l
            .values()
            .filter(|(s, _)| s.as_deref() == Some("s1"))
            .count();
        let live = l.values().filter(|(_, st)| st == "live").count();
        let at = disjoint(&survivors);
        if on_dead == 0 && live == 320 && at.len() == 320 {
            break t_dead.elapsed().as_secs_f64();
        }
        assert!(
            t_dead.elapsed() < Duration::from_secs(30),
            "not re-placed: {on_dead} still on s1, {live} live"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "cluster: 300 admissions in {admit_s:.2} s with 4 clients; placement latency (API call \
         to live) p50 {:.1} ms p99 {:.1} ms max {:.1} ms; leader takeover with 20 admissions in \
         flight {takeover_s:.2} s ({completed_before} answered before the kill); {victim_tenants} \
         tenants of a SIGKILLed agent (lease TTL 6 s) re-placed and live in {replaced_s:.2} s",
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        sorted[sorted.len() - 1],
    );
    drop(orchs);
}

#[test]
fn bad_input_gets_clear_errors() {
    let test = "bad_input_gets_clear_errors";
    // No admin token: one clear line, exit 1, before anything else.
    let port = free_port();
    let orch_cmd = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_buffet-orchestrator"));
        c.args([
            "--etcd",
            &format!("http://127.0.0.1:{port}"),
            "--listen",
            "127.0.0.1:0",
        ])
        .env_remove("BUFFET_ORCHESTRATOR_ADMIN_TOKEN")
        .env_remove("BUFFET_ORCHESTRATOR_READER_TOKEN")
        .stdout(Stdio::null());
        c
    };
    let out = orch_cmd().output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "no admin token: give --admin-token-file PATH or set BUFFET_ORCHESTRATOR_ADMIN_TOKEN"
        ),
        "{err}"
    );
    let out = orch_cmd()
        .env("BUFFET_ORCHESTRATOR_ADMIN_TOKEN", "short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 16 characters"), "{err}");
    assert!(!err.contains("short"), "a token is never printed: {err}");
    // etcd unreachable at start: one clear line, exit 1.
    let out = orch_cmd()
        .env("BUFFET_ORCHESTRATOR_ADMIN_TOKEN", ORCH)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot reach etcd at http://127.0.0.1:{port}: connection refused"
        )),
        "{err}"
    );
    assert!(!err.contains("tonic") && !err.contains("Os {"), "{err}");
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let o = orchestrator(dir.path(), "orch", &etcd.url());
    leader_of(&[&o]);
    let post = |body: &Value| call("POST", &format!("{}/v1/tenants", o.url), Some(body));
    // Auth: no token or a wrong one is 401 on reads and writes; the reader token reads
    // and gets 403 on writes; /healthz needs none.
    let tenants_url = format!("{}/v1/tenants", o.url);
    for (method, body) in [("GET", None), ("POST", Some(&tenant(1)))] {
        for token in [None, Some("cluster-test-wrong-token-000000")] {
            let (s, v) = try_call(method, &tenants_url, token, body).unwrap();
            assert_eq!(s, 401, "{method} with {token:?}: {v}");
            assert!(v["error"].as_str().unwrap().contains("Bearer"), "{v}");
        }
    }
    for path in ["/v1/servers", "/v1/leader", "/v1/tenants/1"] {
        let (s, _) = try_call("GET", &format!("{}{path}", o.url), None, None).unwrap();
        assert_eq!(s, 401, "GET {path} without a token");
    }
    let (s, v) = try_call("GET", &tenants_url, Some(READER), None).unwrap();
    assert_eq!(s, 200, "{v}");
    for (method, url) in [
        ("POST", tenants_url.clone()),
        ("PUT", format!("{tenants_url}/1")),
        ("DELETE", format!("{tenants_url}/1")),
    ] {
        let (s, v) = try_call(method, &url, Some(READER), Some(&tenant(1))).unwrap();
        assert_eq!(s, 403, "{method} with the reader token: {v}");
    }
    let (s, _) = try_call("GET", &format!("{}/healthz", o.url), None, None).unwrap();
    assert_eq!(s, 200);
    // axum's own rejections are JSON too, naming the problem.
    for (method, path, body, status, words) in [
        ("GET", "/v1/tenants/abc", None, 400, "Cannot parse"),
        ("GET", "/v1/tenants/99999999999", None, 400, "Cannot parse"),
        ("PATCH", "/v1/tenants/1", None, 405, "method not allowed"),
        (
            "POST",
            "/v1/tenants",
            Some(json!({ "name": "x".repeat(1 << 20) })),
            413,
            "",
        ),
    ] {
        let (s, v) = call(method, &format!("{}{path}", o.url), body.as_ref());
        assert_eq!(s, status, "{method} {path}: {v}");
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains(words)),
            "{method} {path}: {v}"
        );
    }
    // The scheme is case-blind.
    let lower = ureq::get(&tenants_url)
        .set("Authorization", &format!("bearer {ORCH}"))
        .call()
        .map(|r| r.status())
        .unwrap_or_else(|e| match e {
            ureq::Error::Status(code, _) => code,
            e => panic!("{e}"),
        });
    assert_eq!(lower, 200, "a lowercase `bearer` scheme");
    // No server registered.
    let (s, v) = post(&tenant(1));
    assert_eq!(s, 503, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no server is registered"),
        "{v}"
    );
    // One small server: MAX_NB 1000 per ~1.07 s slot, 2 workers.
    let small = agent(dir.path(), "small", &etcd.url(), 1000);
    let t0 = Instant::now();
    while call("GET", &format!("{}/v1/servers", o.url), None).1["servers"]
        .as_array()
        .map_or(0, Vec::len)
        == 0
    {
        assert!(t0.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut big = tenant(1);
    big["expected_pps"] = json!(1e6);
    let (s, v) = post(&big);
    assert_eq!(s, 422, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("more than any server can carry"),
        "{v}"
    );
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), None);
    assert_eq!(s, 400, "{v}");
    let mut bad = tenant(1);
    bad["rules"] = json!([{ "dst_ip": "10.0.0.0/99" }]);
    let (s, v) = post(&bad);
    assert_eq!(s, 422, "{v}");
    // Admitted, then a tenant the server refuses (same rule, same priority): the
    // server's status and reason, and the cluster forgets it.
    let (s, v) = post(&tenant(1));
    assert_eq!(s, 201, "{v}");
    let mut clash = tenant(2);
    clash["rules"] = tenant(1)["rules"].clone();
    let (s, v) = post(&clash);
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("overlaps tenant 1"),
        "{v}"
    );
    let (s, _) = call("GET", &format!("{}/v1/tenants/2", o.url), None);
    assert_eq!(s, 404);
    let (s, v) = post(&tenant(1));
    assert_eq!(s, 201, "a retried admission answers like the first: {v}");
    // An update through the Orchestrator: applied by the server's own update path, answered
    // once applied.
    let put =
        |id: u32, body: &Value| call("PUT", &format!("{}/v1/tenants/{id}", o.url), Some(body));
    let on_server = |id: u32| {
        let (s, v) = try_call(
            "GET",
            &format!("{}/v1/tenants/{id}", small.url),
            Some(ADMIN),
            None,
        )
        .unwrap();
        assert_eq!(s, 200, "{v}");
        v
    };
    let mut deny = tenant(1);
    deny["policy"] = json!({ "default": "deny" });
    let (s, v) = put(1, &deny);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "live", "{v}");
    assert_eq!(on_server(1)["policy"]["default"], "deny");
    let (_, v) = call("GET", &format!("{}/v1/tenants/1", o.url), None);
    assert_eq!(v["doc"]["policy"]["default"], "deny", "{v}");
    // The denied tenant's packets are now dropped on its server.
    let drops = || served_drops(&small, 1);
    let d0 = drops();
    let t0 = Instant::now();
    while drops() <= d0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no drops after deny"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // An update the server refuses (a policy the firewall cannot decode): its status and
    // reason; the tenant keeps the document it had, on the server and in the cluster.
    let mut bogus = tenant(1);
    bogus["policy"] = json!({ "default": "sometimes" });
    let (s, v) = put(1, &bogus);
    assert_eq!(s, 422, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("keeps its previous document"),
        "{v}"
    );
    assert_eq!(on_server(1)["policy"]["default"], "deny");
    let t0 = Instant::now();
    loop {
        let (_, v) = call("GET", &format!("{}/v1/tenants/1", o.url), None);
        if v["doc"]["policy"]["default"] == "deny" && v["state"] == "live" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not put back: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Bad updates change nothing: another id in the body, an unknown tenant, bad JSON.
    let (s, v) = put(1, &tenant(2));
    assert_eq!(s, 422, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("not the path's 1"),
        "{v}"
    );
    let (s, v) = put(77, &tenant(77));
    assert_eq!(s, 404, "{v}");
    let (s, v) = call("PUT", &format!("{}/v1/tenants/1", o.url), None);
    assert_eq!(s, 400, "{v}");
    assert_eq!(on_server(1)["policy"]["default"], "deny");
    let (s, _) = call("DELETE", &format!("{}/v1/tenants/1", o.url), None);
    assert_eq!(s, 204);
    let (s, _) = call("DELETE", &format!("{}/v1/tenants/1", o.url), None);
    assert_eq!(s, 404);
    // An invalid [cluster] table: buffetd names the field.
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "data_dir = \"/tmp/x\"\n[nf]\nname = \"monitor\"\n[cluster]\netcd = [\"http://127.0.0.1:1\"]\nserver_id = \"a/b\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_buffetd"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.server_id"), "{err}");
}

/// buffetd in agent mode: firewall NF, a generator for 320 tenants' prefixes.
fn agent(dir: &Path, id: &str, etcd: &str, worker_max_nb: u64) -> Proc {
    spawn_agent(
        dir,
        id,
        &format!(
            "[dataplane]\nworkers = 1\nmax_workers = 2\nworker_max_nb = {worker_max_nb}\n\
             arena_mib = 2048\ntenant_slots = 400\n\
             [[port]]\nkind = \"generator\"\ntenants = 320\nrate_pps = 3000\npeak_factor = 1.0\n\
             flows_per_tenant = 2\n"
        ),
        etcd,
    )
}

/// buffetd in agent mode with its own `[dataplane]` and generator lines (one worker that
/// may not grow, timeslots of 2^29 ns ≈ 0.54 s).
fn agent_with(dir: &Path, id: &str, etcd: &str, worker_max_nb: u64, generator: &str) -> Proc {
    spawn_agent(
        dir,
        id,
        &format!(
            "[dataplane]\nworkers = 1\nmax_workers = 1\nworker_max_nb = {worker_max_nb}\nshift = 29\n\
             arena_mib = 512\ntenant_slots = 64\n\
             [[port]]\nkind = \"generator\"\n{generator}\n"
        ),
        etcd,
    )
}

/// Starts buffetd `id` in agent mode (firewall NF, a 6 s lease, load reports every
/// 300 ms) with these `[dataplane]` and `[[port]]` lines, and waits until it is ready.
fn spawn_agent(dir: &Path, id: &str, dataplane_and_port: &str, etcd: &str) -> Proc {
    let port = free_port();
    let d = dir.join(id);
    std::fs::create_dir_all(&d).unwrap();
    let cfg = d.join("buffet.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[nf]\nname = \"firewall\"\n\
             {dataplane_and_port}\
             [cluster]\netcd = [\"{etcd}\"]\nserver_id = \"{id}\"\nlease_ttl_s = 6\n\
             report_interval_ms = 300\n",
            d = d.display()
        ),
    )
    .unwrap();
    start_agent(&d, id, port)
}

/// Starts buffetd `id` on the config [`spawn_agent`] wrote under `d` (API port `port`),
/// its stderr in `buffetd.log` there, and waits until it is ready.
fn start_agent(d: &Path, id: &str, port: u16) -> Proc {
    let log = d.join("buffetd.log");
    let child = Command::new(env!("CARGO_BIN_EXE_buffetd"))
        .arg("--config")
        .arg(d.join("buffet.toml"))
        .env("BUFFETD_ADMIN_TOKEN", ADMIN)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut p = Proc {
        child,
        url: format!("http://127.0.0.1:{port}"),
        name: format!("buffetd {id}"),
    };
    wait_ready(&mut p, "/readyz", &log);
    p
}

/// tenant `i - 1`.
fn gen_tenant(i: u32, expected_pps: f64) -> Value {
    let mut t = tenant(i);
    t["expected_pps"] = json!(expected_pps);
    t
}

/// Waits until `cond` holds, polling every 100 ms; panics with `what` after `limit`.
fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what} (after {limit:?})");
        std::thread::sleep(Duration::from_millis(100));
    }
    t0.elapsed()
}

/// The registered servers' load reports, by id.
fn server_loads(o: &Proc) -> BTreeMap<String, Value> {
    let (s, v) = call("GET", &format!("{}/v1/servers", o.url), None);
    assert_eq!(s, 200, "{v}");
    v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["server"].as_str().unwrap().to_owned(), l.clone()))
        .collect()
}

/// The cluster most tests start from: etcd, buffetd `s1` in agent mode ([`agent`]) and
/// one Orchestrator, leading and with `s1` registered. Fields drop in order: the
/// processes first, etcd last. A test borrows the fields (`let OneServer { s1, o, .. } =
/// &c;`): moving some out would drop the others, etcd among them, at once.
struct OneServer {
    /// buffetd `s1` (its files under `dir/s1`).
    s1: Proc,
    /// The Orchestrator (its log `dir/orch.log`).
    o: Proc,
    /// etcd's client URL.
    url: String,
    dir: tempfile::TempDir,
    _etcd: LocalEtcd,
}

/// Starts [`OneServer`]; `None` when the test skips (no `etcd` binary).
fn one_server(test: &str) -> Option<OneServer> {
    let etcd = etcd_or_skip(test)?;
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let s1 = agent(dir.path(), "s1", &url, 100_000);
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "server not registered", || {
        server_loads(&o).len() == 1
    });
    Some(OneServer {
        s1,
        o,
        url,
        dir,
        _etcd: etcd,
    })
}

#[test]
fn an_overloaded_server_sheds_its_fewest_tenants_and_a_full_cluster_refuses_with_a_reason() {
    let test =
        "an_overloaded_server_sheds_its_fewest_tenants_and_a_full_cluster_refuses_with_a_reason";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    // The generator's plan (constant rates, log-normal weights): pick a seed whose
    // heaviest tenant, with the lightest ones beside it, makes a set where it carries 60
    // to 67 % of the packets. Moving it alone then clears an overload of the whole set,
    // and nothing smaller does.
    const GEN_TENANTS: u32 = 8;
    let plan = |seed: u64| -> Vec<f64> {
        let g = buffet_io::gen::Generator::new(buffet_io::gen::GenConfig {
            seed,
            tenants: GEN_TENANTS,
            flows_per_tenant: 64,
            duration_ns: u64::MAX,
            mean_rate_pps: 1.0,
            peak_factor: 1.0,
            ..buffet_io::gen::GenConfig::default()
        })
        .unwrap();
        (0..GEN_TENANTS)
            .map(|i| g.tenant_mean_pps(i).unwrap())
            .collect()
    };
    let (seed, shares, set) = (1..200u64)
        .find_map(|seed| {
            let w = plan(seed);
            let mut order: Vec<u32> = (0..GEN_TENANTS).collect();
            order.sort_by(|a, b| w[*b as usize].total_cmp(&w[*a as usize]));
            let big = order[0];
            let mut set = vec![big];
            let mut sum = w[big as usize];
            for &i in order[1..].iter().rev() {
                if w[big as usize] / (sum + w[i as usize]) >= 0.6 {
                    set.push(i);
                    sum += w[i as usize];
                }
            }
            let share = w[big as usize] / sum;
            (set.len() >= 3 && share <= 0.67).then_some((seed, w, set))
        })
        .expect("a seed with a dominant tenant");
    let big = set[0];
    // Scale: the set sends 2400 packets/s; the hot server's one worker carries 75 % of
    // that (its MAX_NB per ~0.54 s slot), the cool server's twice as much.
    let set_share: f64 = set.iter().map(|i| shares[*i as usize]).sum();
    let rate = 2400.0 / set_share;
    let slot_s = (1u64 << 29) as f64 / 1e9;
    let hot_max_nb = (0.75 * 2400.0 * slot_s) as u64;
    let generator =
        format!("tenants = {GEN_TENANTS}\nrate_pps = {rate:.1}\nseed = {seed}\npeak_factor = 1.0\nflows_per_tenant = 64");
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let hot = agent_with(dir.path(), "hot", &url, hot_max_nb, &generator);
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "hot not registered", || {
        server_loads(&o).contains_key("hot")
    });
    // Admitted with a small expected rate, the set fits on paper; its real traffic does not.
    let ids: Vec<u32> = set.iter().map(|i| i + 1).collect();
    for id in &ids {
        let (s, v) = call(
            "POST",
            &format!("{}/v1/tenants", o.url),
            Some(&gen_tenant(*id, 1.0)),
        );
        assert_eq!(s, 201, "tenant {id}: {v}");
    }
    // The hot server's worker overloads (Load Monitor reports; no worker left to launch),
    // its Agent publishes the flag, and with no other server the cluster refuses.
    let t_overload = wait_for(
        Duration::from_secs(20),
        "hot never reported overload",
        || server_loads(&o)["hot"]["overloaded"].is_string(),
    );
    let refused = |v: &Value| {
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("overloaded") && e.contains("hot"))
    };
    let extra = gen_tenant(200, 1.0);
    let mut refusal = Value::Null;
    wait_for(Duration::from_secs(5), "no 503 while overloaded", || {
        let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&extra));
        assert!(
            s == 503,
            "admitted while the only server is overloaded: {s} {v}"
        );
        refusal = v;
        refused(&refusal)
    });
    let (s, _) = call("GET", &format!("{}/v1/tenants/200", o.url), None);
    assert_eq!(s, 404, "a refused admission leaves nothing behind");
    assert_eq!(
        served(&hot).keys().copied().collect::<Vec<_>>(),
        {
            let mut v = ids.clone();
            v.sort_unstable();
            v
        },
        "nothing moved while no server had room"
    );
    // A roomier server joins: the heaviest tenant alone moves there.
    let cool = agent_with(dir.path(), "cool", &url, 2 * hot_max_nb, &generator);
    let moved_after = wait_for(Duration::from_secs(20), "nothing moved to cool", || {
        listed(&o)
            .values()
            .any(|(srv, st)| srv.as_deref() == Some("cool") && st == "live")
    });
    // Let the orchestrator's cooldown show that no second move follows.
    std::thread::sleep(Duration::from_secs(3));
    let placed = listed(&o);
    assert_eq!(placed.len(), ids.len(), "{placed:?}");
    for id in &ids {
        let (srv, st) = &placed[id];
        assert_eq!(st, "live", "tenant {id}: {placed:?}");
        let want = if *id == big + 1 { "cool" } else { "hot" };
        assert_eq!(
            srv.as_deref(),
            Some(want),
            "tenant {id} (the heaviest is {}): {placed:?}; orchestrator log: {}",
            big + 1,
            std::fs::read_to_string(dir.path().join("orch.log")).unwrap_or_default()
        );
    }
    // Every tenant on exactly one server, the one its placement names; the moved one's
    // traffic flows on the new server only.
    let at = disjoint(&[&hot, &cool]);
    assert_eq!(at.len(), ids.len());
    assert_eq!(at[&(big + 1)], "buffetd cool");
    let before = served(&cool)[&(big + 1)];
    std::thread::sleep(Duration::from_millis(800));
    assert!(served(&cool)[&(big + 1)] > before, "no traffic on cool");
    assert!(!served(&hot).contains_key(&(big + 1)));
    // The hot server settles (its flag clears once its worker is under MAX_NB) and the
    // cluster admits again.
    let settled = wait_for(Duration::from_secs(15), "hot stays overloaded", || {
        server_loads(&o)["hot"]["overloaded"].is_null()
    });
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&extra));
    assert_eq!(s, 201, "{v}");
    eprintln!(
        "cluster overload: seed {seed}, tenants {ids:?} (heaviest {}: {:.0} % of {:.0} packets/s), \
         hot MAX_NB {hot_max_nb}/slot: overload published {:.2} s after admission; refused with \
         {refusal}; moved 1 tenant {:.2} s after cool started; hot settled {:.2} s later",
        big + 1,
        100.0 * shares[big as usize] / set_share,
        2400.0,
        t_overload.as_secs_f64(),
        moved_after.as_secs_f64(),
        settled.as_secs_f64(),
    );
}

/// A TCP proxy on loopback in front of etcd, for one agent: [`Partition::cut`] closes
/// every connection through it and black-holes new ones (accepted, never answered) until
/// [`Partition::heal`]. The agent keeps running; it just cannot reach etcd.
struct Partition {
    url: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Partition {
    fn new(upstream: &str) -> Partition {
        use std::io::copy;
        use std::net::{TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        let target = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>> = Default::default();
        let (c, k) = (cut.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                // Black-holed while cut: kept open, never forwarded; closed on heal.
                k.lock().unwrap().push(client.try_clone().unwrap());
                if c.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                };
                k.lock().unwrap().push(server.try_clone().unwrap());
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                let (mut s_in, mut c_out) = (server, client);
                std::thread::spawn(move || {
                    let _ = copy(&mut s_in, &mut c_out);
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Partition { url, cut, conns }
    }

    fn close_all(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.close_all();
    }

    fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
        self.close_all();
    }
}

#[test]
fn an_agent_cut_off_from_etcd_stops_serving_before_its_tenants_are_placed_elsewhere() {
    let test = "an_agent_cut_off_from_etcd_stops_serving_before_its_tenants_are_placed_elsewhere";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let proxy = Partition::new(&url);
    // s1 reaches etcd only through the proxy; s2 and the orchestrator directly.
    let s1 = agent(dir.path(), "s1", &proxy.url, 100_000);
    let s2 = agent(dir.path(), "s2", &url, 100_000);
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "servers not registered", || {
        server_loads(&o).len() == 2
    });
    for i in 1..=20u32 {
        let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(i)));
        assert_eq!(s, 201, "tenant {i}: {v}");
    }
    let on_s1: Vec<u32> = listed(&o)
        .into_iter()
        .filter(|(_, (srv, _))| srv.as_deref() == Some("s1"))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(on_s1.len(), 10, "the policy spreads 20 equal tenants 10/10");
    wait_for(Duration::from_secs(10), "no traffic on s1", || {
        served(&s1).values().all(|n| *n > 0)
    });

    // Cut s1 off. It keeps running and serving until it counts its lease as lost.
    proxy.cut();
    let t_cut = Instant::now();
    let (mut fenced, mut elsewhere) = (None, None);
    let mut last_s1 = served(&s1);
    while fenced.is_none() || elsewhere.is_none() {
        let now_s1 = served(&s1);
        let now_s2 = served(&s2);
        let t = t_cut.elapsed();
        // Never on two servers at once (both APIs read within a few ms of each other).
        for id in now_s1.keys() {
            assert!(
                !now_s2.contains_key(id),
                "tenant {id} served by s1 and s2 at {t:?} after the cut"
            );
        }
        if fenced.is_none() && on_s1.iter().all(|id| !now_s1.contains_key(id)) {
            fenced = Some(t);
        }
        if elsewhere.is_none() && on_s1.iter().all(|id| now_s2.contains_key(id)) {
            elsewhere = Some(t);
        }
        // s1 serves only (some of) its own tenants until fenced, and nothing after.
        assert!(now_s1.keys().all(|id| on_s1.contains(id)), "{now_s1:?}");
        if fenced.is_some() {
            assert!(now_s1.is_empty(), "s1 serves {now_s1:?} after fencing");
        }
        last_s1 = now_s1;
        assert!(
            t < Duration::from_secs(30),
            "fenced {fenced:?}, re-placed {elsewhere:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(last_s1.is_empty());
    let (fenced, elsewhere) = (fenced.unwrap(), elsewhere.unwrap());
    // The lease TTL is 6 s: s1 fences at 3/4 of it after its last acknowledged keep-alive
    // was sent; etcd expires the lease no earlier than 6 s after that.
    assert!(
        fenced < elsewhere,
        "s1 fenced at {fenced:?}, its tenants served elsewhere at {elsewhere:?}"
    );
    assert!(
        fenced <= Duration::from_millis(4500 + 1000),
        "fenced late: {fenced:?}"
    );
    let all = listed(&o);
    assert!(
        on_s1
            .iter()
            .all(|id| all[id] == (Some("s2".to_owned()), "live".to_owned())),
        "{all:?}"
    );
    wait_for(Duration::from_secs(10), "no traffic on s2", || {
        let now = served(&s2);
        on_s1.iter().all(|id| now.get(id).is_some_and(|n| *n > 0))
    });

    // Heal: s1 registers again with a new lease and serves only what is placed on it.
    proxy.heal();
    let back = wait_for(Duration::from_secs(20), "s1 not registered again", || {
        server_loads(&o).contains_key("s1")
    });
    assert!(served(&s1).is_empty(), "s1 serves tenants placed elsewhere");
    // The emptiest server gets the next tenant: s1, and only that one.
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(21)));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["server"], "s1", "{v}");
    assert_eq!(served(&s1).keys().copied().collect::<Vec<_>>(), vec![21]);
    assert_eq!(disjoint(&[&s1, &s2]).len(), 21);
    eprintln!(
        "cluster partition (lease TTL 6 s): s1 fenced its 10 tenants {:.2} s after the cut; \
         they served on s2 from {:.2} s (gap {:.2} s with neither, never both); s1 registered \
         again {:.2} s after the heal",
        fenced.as_secs_f64(),
        elsewhere.as_secs_f64(),
        (elsewhere - fenced).as_secs_f64(),
        back.as_secs_f64()
    );
}

/// A tenant whose server died is re-placed; when the new server refuses it (its rules
/// overlap a tenant there), the tenant is not lost: it stays recorded as `unplaced` with
/// the refusal, a retried admission says so, and it is placed on that server once the
/// tenant it overlapped is removed.
#[test]
fn a_tenant_refused_after_a_move_stays_unplaced_and_returns_when_a_server_can_take_it() {
    let test = "a_tenant_refused_after_a_move_stays_unplaced_and_returns_when_a_server_can_take_it";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let mut agents: BTreeMap<String, Proc> = ["s1", "s2"]
        .iter()
        .map(|id| (id.to_string(), agent(dir.path(), id, &url, 100_000)))
        .collect();
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "servers not registered", || {
        server_loads(&o).len() == 2
    });
    // Two tenants with the same rule: allowed on two servers, not on one.
    let doc = |id: u32| {
        json!({
            "id": id, "name": format!("t{id}"),
            "rules": [ { "dst_ip": "10.1.0.0/24" } ],
            "policy": { "default": "allow" },
            "expected_pps": 100,
        })
    };
    let (s, a) = call("POST", &format!("{}/v1/tenants", o.url), Some(&doc(10)));
    assert_eq!(s, 201, "{a}");
    let (s, b) = call("POST", &format!("{}/v1/tenants", o.url), Some(&doc(11)));
    assert_eq!(s, 201, "{b}");
    let home = a["server"].as_str().unwrap().to_owned();
    let other = b["server"].as_str().unwrap().to_owned();
    assert_ne!(home, other, "the policy spreads two equal tenants");

    // Tenant 10's server dies; the other refuses it (overlapping rules).
    agents.get_mut(&home).unwrap().kill();
    let tenant10 = format!("{}/v1/tenants/10", o.url);
    wait_for(
        Duration::from_secs(30),
        "tenant 10 not left unplaced",
        || {
            let (s, v) = call("GET", &tenant10, None);
            s == 200 && v["state"] == "unplaced"
        },
    );
    let (_, v) = call("GET", &tenant10, None);
    let reason = v["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("refused by {other}")) && reason.contains("overlap"),
        "{v}"
    );
    assert_eq!(v["doc"]["rules"][0]["dst_ip"], "10.1.0.0/24", "{v}");
    // It is not retried on the server that refused it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(call("GET", &tenant10, None).1["state"], "unplaced");
    assert!(!served(&agents[&other]).contains_key(&10));
    // Retrying the admission answers what happened to it.
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&doc(10)));
    assert_eq!(s, 503, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("recorded with this document but placed on no server"),
        "{v}"
    );

    // Removing the tenant it overlapped offers that server to it again: it is placed
    // there and serves.
    let (s, v) = call("DELETE", &format!("{}/v1/tenants/11", o.url), None);
    assert!((200..300).contains(&s), "{s} {v}");
    wait_for(Duration::from_secs(30), "tenant 10 not live again", || {
        let (s, v) = call("GET", &tenant10, None);
        s == 200 && v["state"] == "live" && v["server"] == other.as_str()
    });
    wait_for(Duration::from_secs(10), "tenant 10 not served", || {
        served(&agents[&other]).contains_key(&10)
    });
    // Its old server comes back and gets nothing of it.
    agents.insert(home.clone(), agent(dir.path(), &home, &url, 100_000));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(disjoint(&[&agents["s1"], &agents["s2"]]).len(), 1);
    assert!(served(&agents[&home]).is_empty());
}

/// In cluster mode the Agent owns the server's tenant set: a tenant admitted through
/// buffetd's own API is removed at the next reconciliation, and the Orchestrator can then
/// place a tenant of that id there.
#[test]
fn a_tenant_admitted_behind_the_agents_back_is_removed_at_the_next_reconciliation() {
    let test = "a_tenant_admitted_behind_the_agents_back_is_removed_at_the_next_reconciliation";
    let Some(c) = one_server(test) else {
        return;
    };
    let OneServer { s1, o, .. } = &c;
    let mut rogue = tenant(77);
    rogue.as_object_mut().unwrap().remove("expected_pps");
    let (s, v) = try_call(
        "POST",
        &format!("{}/v1/tenants", s1.url),
        Some(ADMIN),
        Some(&rogue),
    )
    .unwrap();
    assert_eq!(s, 201, "{v}");
    assert!(served(s1).contains_key(&77));
    // A placement on s1 makes its Agent reconcile.
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(1)));
    assert_eq!(s, 201, "{v}");
    wait_for(Duration::from_secs(10), "tenant 77 still served", || {
        !served(s1).contains_key(&77)
    });
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(77)));
    assert_eq!(s, 201, "{v}");
    assert_eq!(served(s1).keys().copied().collect::<Vec<_>>(), vec![1, 77]);
}

/// Two buffetd started with the same `server_id`: the second is refused registration,
/// says why, and serves none of the tenants placed on that id; a restarted server (the
/// same data directory) takes its registration back at once.
#[test]
fn a_second_server_with_the_same_id_is_refused_and_a_restarted_one_takes_its_id_back() {
    let test = "a_second_server_with_the_same_id_is_refused_and_a_restarted_one_takes_its_id_back";
    let Some(mut c) = one_server(test) else {
        return;
    };
    let OneServer {
        s1: first,
        o,
        url,
        dir,
        ..
    } = &mut c;
    let other_dir = tempfile::tempdir().unwrap();
    let second = agent(other_dir.path(), "s1", url, 100_000);
    let log = other_dir.path().join("s1/buffetd.log");
    wait_for(
        Duration::from_secs(10),
        "the second server says nothing",
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("is registered by another buffetd")
        },
    );
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(1)));
    assert_eq!(s, 201, "{v}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(served(first).keys().copied().collect::<Vec<_>>(), vec![1]);
    assert!(served(&second).is_empty(), "{:?}", served(&second));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("is registered by another buffetd").count(),
        1,
        "said once: {text}"
    );
    drop(second);

    // The first restarts within its lease: it registers again at once, with its tenant.
    first.kill();
    let t0 = Instant::now();
    let first = agent(dir.path(), "s1", url, 100_000);
    let first_log = dir.path().join("s1/buffetd.log");
    wait_for(Duration::from_secs(5), "not registered again", || {
        std::fs::read_to_string(&first_log)
            .unwrap_or_default()
            .contains("registered (lease")
    });
    wait_for(Duration::from_secs(5), "tenant 1 not served again", || {
        served(&first).contains_key(&1)
    });
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "took its id back only after the old lease expired: {:?}",
        t0.elapsed()
    );
}

/// A registration of the server id without an instance id (an older buffetd's, which
/// registers without looking and gives none) may be another server's: buffetd never
/// takes it over, says why once, and registers once it is gone. And when such a buffetd
/// writes the key over a live registration, the registered one stops serving (it fences)
/// and does not write the key back, so two servers never serve one id; it registers
/// again, with its tenants, once the other's registration is gone.
#[test]
fn a_registration_without_an_instance_id_is_never_taken_over() {
    let test = "a_registration_without_an_instance_id_is_never_taken_over";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    // What an older buffetd registers: a load report without `instance`, under its lease.
    let older = |api: &str| {
        json!({
            "server": "s1", "api": api, "slot_ns": 1 << 20, "worker_max_nb": 100_000,
            "live_workers": 1, "max_workers": 2, "workers": [], "tenants": 0,
            "tenant_slots": 400, "pps": 0.0,
        })
        .to_string()
    };
    let key = "/buffet/servers/s1";
    let lease = common::etcd::grant(&url, 60);
    common::etcd::put(&url, key, &older("http://127.0.0.1:1"), lease);

    let s1 = agent(dir.path(), "s1", &url, 100_000);
    let log = dir.path().join("s1/buffetd.log");
    let said = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    wait_for(
        Duration::from_secs(10),
        "s1 does not say why it waits",
        || said("is registered without an instance id") > 0,
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        said("registered (lease"),
        0,
        "took the older registration over"
    );
    assert_eq!(said("is registered without an instance id"), 1, "said once");
    assert_eq!(
        common::etcd::get(&url, key),
        Some((older("http://127.0.0.1:1"), lease)),
        "the older registration is kept"
    );
    // That buffetd stops (its lease is revoked): s1 registers at once and serves.
    common::etcd::revoke(&url, lease);
    wait_for(Duration::from_secs(5), "s1 not registered", || {
        said("registered (lease") == 1
    });
    wait_for(Duration::from_secs(10), "s1 not in the view", || {
        server_loads(&o)["s1"]["instance"].is_string()
    });
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(1)));
    assert_eq!(s, 201, "{v}");
    assert_eq!(served(&s1).keys().copied().collect::<Vec<_>>(), vec![1]);

    // An older buffetd starts with the same id and writes its registration over s1's.
    let lease = common::etcd::grant(&url, 60);
    common::etcd::put(&url, key, &older("http://127.0.0.1:2"), lease);
    wait_for(Duration::from_secs(5), "s1 still serves tenant 1", || {
        served(&s1).is_empty()
    });
    assert_eq!(
        said("was registered over this registration by another buffetd"),
        1
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        common::etcd::get(&url, key),
        Some((older("http://127.0.0.1:2"), lease)),
        "s1 wrote its registration back"
    );
    assert!(served(&s1).is_empty());
    // Gone again: s1 registers and serves tenant 1 again.
    common::etcd::revoke(&url, lease);
    wait_for(Duration::from_secs(20), "tenant 1 not served again", || {
        served(&s1).contains_key(&1)
    });
    assert_eq!(said("registered (lease"), 2);
}

/// An operator drains a server: its tenants move to the other server and are served
/// there, a new tenant goes there too, and `GET /v1/servers` says `draining`. Draining
/// the other one as well moves nothing (there is no room anywhere): every tenant stays
/// placed and served, and a new tenant is refused naming the drains. Ending the first
/// drain moves the second's tenants back to it.
#[test]
fn a_drained_server_hands_its_tenants_over_and_takes_no_new_ones() {
    let test = "a_drained_server_hands_its_tenants_over_and_takes_no_new_ones";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let dataplane = "[dataplane]\nworkers = 1\nmax_workers = 1\narena_mib = 256\n\
                     tenant_slots = 16\n";
    let s1 = spawn_agent(dir.path(), "s1", dataplane, &url);
    let s2 = spawn_agent(dir.path(), "s2", dataplane, &url);
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "servers not registered", || {
        server_loads(&o).len() == 2
    });
    let tenants = format!("{}/v1/tenants", o.url);
    for i in 1..=4 {
        let (s, v) = call("POST", &tenants, Some(&tenant(i)));
        assert_eq!(s, 201, "{v}");
    }
    let on = |server: &str| -> Vec<u32> {
        listed(&o)
            .into_iter()
            .filter(|(_, (s, st))| s.as_deref() == Some(server) && st == "live")
            .map(|(id, _)| id)
            .collect()
    };
    assert_eq!((on("s1").len(), on("s2").len()), (2, 2));
    let drain = |method: &str, server: &str| {
        call(
            method,
            &format!("{}/v1/servers/{server}/drain", o.url),
            None,
        )
    };
    // Bad requests change nothing.
    let (s, v) = drain("POST", "s9");
    assert_eq!(s, 404, "{v}");
    assert_eq!(v["error"], "server \"s9\" is not registered in the cluster");
    let (s, v) = drain("POST", "s%201");
    assert_eq!(s, 400, "{v}");

    // Through the CLI, as an operator would.
    let buffet = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
            .args(args)
            .args(["--api", &o.url])
            .env("BUFFET_TOKEN", ORCH)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = buffet(&["servers", "drain", "s1"]);
    assert!(ok, "{text}");
    assert!(text.starts_with("draining s1: "), "{text}");
    // An id that would be a path: refused before any request.
    let (ok, text) = buffet(&["servers", "undrain", "../tenants/1?"]);
    assert!(!ok && text.contains("is not a server id"), "{text}");
    let (ok, text) = buffet(&["servers", "drain", "s9"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("buffet-orchestrator: 404: server \"s9\" is not registered"),
        "{text}"
    );
    wait_for(Duration::from_secs(20), "s1's tenants not moved", || {
        on("s2") == [1, 2, 3, 4]
    });
    let (ok, text) = buffet(&["servers", "ls"]);
    assert!(ok, "{text}");
    let row = |server: &str| {
        text.lines()
            .find(|l| l.starts_with(server))
            .unwrap_or_else(|| panic!("no {server} in\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("s1")[4], "draining", "{text}");
    assert_eq!(row("s2")[4], "ok", "{text}");
    wait_for(
        Duration::from_secs(10),
        "s1's tenants not served by s2",
        || served(&s1).is_empty() && served(&s2).len() == 4,
    );
    let loads = server_loads(&o);
    assert_eq!(
        (&loads["s1"]["draining"], &loads["s2"]["draining"]),
        (&json!(true), &json!(false)),
        "{loads:?}"
    );
    // A new tenant goes to s2, though s1 has more room now.
    let (s, v) = call("POST", &tenants, Some(&tenant(5)));
    assert_eq!((s, &v["server"]), (201, &json!("s2")), "{v}");

    // s2 drains too: nowhere to go, so its tenants stay, placed and served.
    let (s, v) = drain("POST", "s2");
    assert_eq!((s, &v["tenants_left"]), (202, &json!(5)), "{v}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(on("s2"), [1, 2, 3, 4, 5]);
    assert_eq!(served(&s2).len(), 5);
    let (s, v) = call("POST", &tenants, Some(&tenant(6)));
    assert_eq!(s, 503, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("s1: draining") && e.contains("s2: draining"),
        "{v}"
    );

    // s1's drain ends: s2's tenants move back to it.
    let (s, v) = drain("DELETE", "s1");
    assert_eq!(s, 204, "{v}");
    wait_for(
        Duration::from_secs(20),
        "s2's tenants not moved to s1",
        || on("s1") == [1, 2, 3, 4, 5],
    );
    wait_for(
        Duration::from_secs(10),
        "s2's tenants not served by s1",
        || served(&s1).len() == 5 && served(&s2).is_empty(),
    );

    // A tenant the other server refuses stays where it is served. Tenant 6 has tenant
    // 1's rules, so s1 (tenant 1's server) refuses it (409); it is placed on s2, and s2
    // drains.
    let (s, v) = drain("DELETE", "s2");
    assert_eq!(s, 204, "{v}");
    let mut clash = tenant(6);
    clash["rules"] = tenant(1)["rules"].clone();
    let (s, v) = call("POST", &tenants, Some(&clash));
    assert_eq!((s, &v["server"]), (201, &json!("s2")), "{v}");
    let (s, v) = drain("POST", "s2");
    assert_eq!(
        (s, &v["tenants_left"]),
        (202, &json!(0)),
        "moved at once: {v}"
    );
    // Moved to s1, refused there, back on s2 with the refusal remembered: not moved
    // to s1 again while s2 drains.
    wait_for(Duration::from_secs(20), "tenant 6 not back on s2", || {
        let (_, v) = call("GET", &format!("{tenants}/6"), None);
        v["server"] == "s2" && v["state"] == "live" && served(&s2).contains_key(&6)
    });
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(200));
        let (_, v) = call("GET", &format!("{tenants}/6"), None);
        assert_eq!(
            (&v["server"], &v["state"]),
            (&json!("s2"), &json!("live")),
            "{v}"
        );
    }
    assert!(served(&s2).contains_key(&6));
    assert!(!served(&s1).contains_key(&6));
}

/// Two buffetds share one identity (the second's data_dir holds a copy of the first's
/// `cluster-instance`) and one server id. The second takes the registration over, as a
/// restarted server takes its previous life's; the first sees its registration written
/// over by a buffetd with its own instance id, says so once, serves nothing and does not
/// register again while the second's registration lasts: the two do not take turns, and
/// the second serves the tenant. Once the second is gone, the first takes over.
#[test]
fn two_buffetds_sharing_one_identity_do_not_take_turns() {
    let test = "two_buffetds_sharing_one_identity_do_not_take_turns";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = etcd.url();
    let dataplane = "[dataplane]\nworkers = 1\nmax_workers = 1\narena_mib = 256\n\
                     tenant_slots = 16\n";
    let o = orchestrator(one.path(), "orch", &url);
    leader_of(&[&o]);
    let first = spawn_agent(one.path(), "s1", dataplane, &url);
    wait_for(Duration::from_secs(10), "s1 not in the view", || {
        server_loads(&o).contains_key("s1")
    });
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(1)));
    assert_eq!((s, &v["server"]), (201, &json!("s1")), "{v}");
    assert!(served(&first).contains_key(&1));

    let copy = two.path().join("s1/data");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(
        one.path().join("s1/data/cluster-instance"),
        copy.join("cluster-instance"),
    )
    .unwrap();
    let mut second = spawn_agent(two.path(), "s1", dataplane, &url);
    let said = |dir: &Path, what: &str| {
        std::fs::read_to_string(dir.join("s1/buffetd.log"))
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    let twin = "two buffetds share one identity";
    wait_for(
        Duration::from_secs(10),
        "the first does not say it shares its identity",
        || said(one.path(), twin) > 0,
    );
    wait_for(Duration::from_secs(10), "tenant 1 not moved over", || {
        served(&first).is_empty() && served(&second).contains_key(&1)
    });
    // Ten report intervals later, neither has registered again.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        said(one.path(), "registered (lease"),
        1,
        "the first registered again"
    );
    assert_eq!(
        said(two.path(), "registered (lease"),
        1,
        "the second registered again"
    );
    assert_eq!(said(one.path(), twin), 1, "said once");
    assert!(served(&first).is_empty());
    assert!(served(&second).contains_key(&1));
    assert_eq!(server_loads(&o)["s1"]["api"], json!(second.url));
    // The second dies: once its lease expires, the first registers again and serves.
    second.kill();
    wait_for(
        Duration::from_secs(20),
        "the first not registered again",
        || said(one.path(), "registered (lease") == 2,
    );
    assert_eq!(said(one.path(), "the other registration is gone"), 1);
    wait_for(Duration::from_secs(10), "tenant 1 not served again", || {
        served(&first).contains_key(&1)
    });
}

/// Tenant documents whose sum is over gRPC's default 4 MiB reply: every read of a whole
/// prefix (the Agent's placements, the API's list, a new leader's load) still works, and
/// a document over the Orchestrator's limit is refused with 413 naming the limit.
#[test]
fn large_documents_in_sum_are_read_and_one_too_large_is_refused() {
    let test = "large_documents_in_sum_are_read_and_one_too_large_is_refused";
    let Some(mut c) = one_server(test) else {
        return;
    };
    let OneServer {
        s1, o, url, dir, ..
    } = &mut c;
    // A firewall ACL long enough to make the document about `bytes` long (a name may
    // not: it has at most 256 bytes).
    let big = |i: u32, bytes: usize| {
        let rule = json!({
            "action": "allow", "src": "192.168.100.200/32", "dst": "10.200.100.250/32",
            "proto": "udp", "src_port": "10000-20000", "dst_port": "30000-40000",
        });
        let per = rule.to_string().len() + 1;
        let mut t = tenant(i);
        t["policy"]["rules"] = json!(vec![rule; bytes / per]);
        t
    };
    // 20 documents of 240 KB: 4.8 MB in all.
    for i in 1..=20u32 {
        let (s, v) = call(
            "POST",
            &format!("{}/v1/tenants", o.url),
            Some(&big(i, 240_000)),
        );
        assert_eq!(
            s,
            201,
            "tenant {i}: {}",
            v.to_string().chars().take(300).collect::<String>()
        );
    }
    assert_eq!(served(s1).len(), 20);
    let (s, v) = call(
        "POST",
        &format!("{}/v1/tenants", o.url),
        Some(&big(21, 300_000)),
    );
    assert_eq!(
        s,
        413,
        "{}",
        v.to_string().chars().take(300).collect::<String>()
    );
    assert!(
        v["error"].as_str().unwrap().contains("at most 262144"),
        "{v}"
    );
    assert_eq!(listed(o).len(), 20);
    // A new leader loads them all.
    o.kill();
    let o = orchestrator(dir.path(), "orch2", url);
    leader_of(&[&o]);
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(22)));
    assert_eq!(s, 201, "{v}");
    let all = listed(&o);
    assert_eq!(all.len(), 21, "{:?}", all.keys().collect::<Vec<_>>());
    assert!(all
        .values()
        .all(|(srv, st)| srv.as_deref() == Some("s1") && st == "live"));
}

/// Refusals written while no Orchestrator leads (the leader died between writing the
/// placements and seeing their statuses): the next leader finds them stored and handles
/// them as the dead one would have. The refused first admission is removed, the refused
/// update is put back, and the server keeps serving the previous document.
#[test]
fn refusals_nobody_handled_are_handled_by_the_next_leader() {
    let test = "refusals_nobody_handled_are_handled_by_the_next_leader";
    let Some(mut c) = one_server(test) else {
        return;
    };
    let OneServer {
        s1,
        o: o1,
        url,
        dir,
        ..
    } = &mut c;
    let (s, v) = call("POST", &format!("{}/v1/tenants", o1.url), Some(&tenant(1)));
    assert_eq!(s, 201, "{v}");

    // s1 pauses (SIGSTOP, well within its lease) while the leader writes an update it will
    // refuse (a policy the firewall cannot decode) and an admission it will refuse (the
    // same rule as tenant 1); the leader is killed before s1 answers either.
    common::netns::signal(&s1.child, "STOP");
    let mut bogus = tenant(1);
    bogus["policy"] = json!({ "default": "sometimes" });
    let mut clash = tenant(2);
    clash["rules"] = tenant(1)["rules"].clone();
    std::thread::scope(|sc| {
        let o1_url = o1.url.clone();
        let (bogus, clash) = (&bogus, &clash);
        let (put_url, post_url) = (
            format!("{o1_url}/v1/tenants/1"),
            format!("{o1_url}/v1/tenants"),
        );
        sc.spawn(move || try_call("PUT", &put_url, Some(ORCH), Some(bogus)));
        sc.spawn(move || try_call("POST", &post_url, Some(ORCH), Some(clash)));
        wait_for(
            Duration::from_secs(10),
            "update and admission not written",
            || {
                let (s2, _) = call("GET", &format!("{o1_url}/v1/tenants/2"), None);
                let (_, v1) = call("GET", &format!("{o1_url}/v1/tenants/1"), None);
                s2 == 200 && v1["doc"]["policy"]["default"] == "sometimes"
            },
        );
        o1.kill();
    });
    common::netns::signal(&s1.child, "CONT");
    let log = dir.path().join("s1/buffetd.log");
    wait_for(Duration::from_secs(10), "s1 did not refuse both", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("update of tenant 1 refused") && text.contains("tenant 2 refused")
    });
    // Its statuses are written right after it logs; the old leader's lease has not even
    // expired yet, so nobody leads while they are written.
    std::thread::sleep(Duration::from_millis(500));

    let o2 = orchestrator(dir.path(), "orch-b", url);
    leader_of(&[&o2]);
    wait_for(
        Duration::from_secs(10),
        "the refused admission not removed",
        || call("GET", &format!("{}/v1/tenants/2", o2.url), None).0 == 404,
    );
    wait_for(
        Duration::from_secs(10),
        "the refused update not put back",
        || {
            let (_, v) = call("GET", &format!("{}/v1/tenants/1", o2.url), None);
            v["doc"]["policy"]["default"] == "allow" && v["state"] == "live"
        },
    );
    let (s, v) = try_call(
        "GET",
        &format!("{}/v1/tenants/1", s1.url),
        Some(ADMIN),
        None,
    )
    .unwrap();
    assert_eq!((s, &v["policy"]["default"]), (200, &json!("allow")), "{v}");
    assert_eq!(served(s1).keys().copied().collect::<Vec<_>>(), vec![1]);
    // The id is free again: an admission of it with another rule is placed.
    let (s, v) = call("POST", &format!("{}/v1/tenants", o2.url), Some(&tenant(2)));
    assert_eq!(s, 201, "{v}");
}

/// Two updates of one tenant at about the same time, both of which its server refuses (a
/// policy the firewall cannot decode), sent while the server is paused: without a turn
/// each, the second would be written before the server saw the first, with the first's
/// document (never run) as the one to put back. They apply one at a time: each is
/// refused and answered so, and the tenant ends live with the document its server ran
/// all along. Before, the server refused the second, the first's document was put back,
/// the server refused that too, and the tenant was left placed nowhere.
#[test]
fn two_concurrent_updates_apply_one_at_a_time_and_a_refusal_puts_back_what_ran() {
    let test = "two_concurrent_updates_apply_one_at_a_time_and_a_refusal_puts_back_what_ran";
    let Some(c) = one_server(test) else {
        return;
    };
    let OneServer { s1, o, .. } = &c;
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&tenant(1)));
    assert_eq!(s, 201, "{v}");
    let tenant1 = format!("{}/v1/tenants/1", o.url);
    let bad = |default: &str| {
        let mut t = tenant(1);
        t["policy"] = json!({ "default": default });
        t
    };

    common::netns::signal(&s1.child, "STOP");
    let answers = std::thread::scope(|sc| {
        let put = |doc: Value| {
            let url = tenant1.clone();
            sc.spawn(move || call("PUT", &url, Some(&doc)))
        };
        let first = put(bad("sometimes"));
        wait_for(Duration::from_secs(5), "first update not written", || {
            call("GET", &tenant1, None).1["doc"]["policy"]["default"] == "sometimes"
        });
        // Written, not run: s1 answered only the placement before it.
        let (_, v) = call("GET", &tenant1, None);
        assert_eq!(v["state"], "pending", "{v}");
        let second = put(bad("rarely"));
        // Well within s1's lease.
        std::thread::sleep(Duration::from_millis(700));
        common::netns::signal(&s1.child, "CONT");
        [first.join().unwrap(), second.join().unwrap()]
    });
    for (s, v) in &answers {
        let e = v["error"].as_str().unwrap_or_default();
        assert!(
            (400..500).contains(s) && e.contains("keeps its previous document"),
            "{s} {v}"
        );
    }
    wait_for(
        Duration::from_secs(10),
        "tenant 1 not live with its first document",
        || {
            let (_, v) = call("GET", &tenant1, None);
            v["state"] == "live" && v["server"] == "s1" && v["doc"]["policy"]["default"] == "allow"
        },
    );
    let (s, v) = try_call(
        "GET",
        &format!("{}/v1/tenants/1", s1.url),
        Some(ADMIN),
        None,
    )
    .unwrap();
    assert_eq!((s, &v["policy"]["default"]), (200, &json!("allow")), "{v}");
    assert_eq!(served(s1).keys().copied().collect::<Vec<_>>(), vec![1]);
}

/// A tenant re-placed off a dead server, refused by one server (its rules overlap a
/// tenant there) and live on another: a retry of its admission, and an update with the
/// same document, answer at once that it is live, as the first request did.
#[test]
fn a_tenant_live_again_after_a_refusal_answers_a_retry_at_once() {
    let test = "a_tenant_live_again_after_a_refusal_answers_a_retry_at_once";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let mut agents: BTreeMap<String, Proc> = ["s1", "s2", "s3"]
        .iter()
        .map(|id| (id.to_string(), agent(dir.path(), id, &url, 100_000)))
        .collect();
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "servers not registered", || {
        server_loads(&o).len() == 3
    });
    let post = |body: &Value| call("POST", &format!("{}/v1/tenants", o.url), Some(body));
    let doc = |id: u32| {
        json!({
            "id": id, "name": format!("t{id}"),
            "rules": [ { "dst_ip": "10.1.0.0/24" } ],
            "policy": { "default": "allow" },
            "expected_pps": 100,
        })
    };
    // Tenant 10 on one server, 11 (the same rule) on another, and a heavier tenant 12 on
    // the third: when 10's server dies, the policy picks 11's (more headroom), which
    // refuses it, and it goes live on 12's.
    let (s, a) = post(&doc(10));
    assert_eq!(s, 201, "{a}");
    let (s, b) = post(&doc(11));
    assert_eq!(s, 201, "{b}");
    let (s, c) = post(&gen_tenant(12, 1000.0));
    assert_eq!(s, 201, "{c}");
    let [home, refuser, third] = [&a, &b, &c].map(|v| v["server"].as_str().unwrap().to_owned());
    assert!(
        home != refuser && refuser != third && home != third,
        "{a} {b} {c}"
    );
    agents.get_mut(&home).unwrap().kill();
    let tenant10 = format!("{}/v1/tenants/10", o.url);
    wait_for(Duration::from_secs(30), "tenant 10 not live again", || {
        let (_, v) = call("GET", &tenant10, None);
        v["state"] == "live" && v["server"] == third.as_str()
    });
    let refused =
        std::fs::read_to_string(dir.path().join(&refuser).join("buffetd.log")).unwrap_or_default();
    assert!(
        refused.contains("tenant 10 refused"),
        "{refuser} never refused it: {refused}"
    );
    // Its record changed once more after it went live (the refusal is forgotten).
    std::thread::sleep(Duration::from_millis(500));

    let t0 = Instant::now();
    let (s, v) = post(&doc(10));
    assert_eq!(s, 201, "a retried admission answers like the first: {v}");
    assert_eq!(v["server"], third.as_str(), "{v}");
    let (s, v) = call("PUT", &tenant10, Some(&doc(10)));
    assert_eq!(s, 200, "the same document again: {v}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        t0.elapsed()
    );
    assert!(served(&agents[&third]).contains_key(&10));
}

/// A server restarted with a config under which it can no longer run one of its tenants
/// (a tenant that asked for `safe` isolation, the server now `trusted-native`) keeps it
/// in its store without running it; its Agent's attempt to apply the placement is
/// refused. The Orchestrator then places the tenant on another server, where it goes
/// live; before, nothing could be put back and the tenant stayed placed where nothing ran
/// it.
#[test]
fn a_tenant_its_server_can_no_longer_run_after_a_restart_is_placed_elsewhere() {
    let test = "a_tenant_its_server_can_no_longer_run_after_a_restart_is_placed_elsewhere";
    let Some(mut c) = one_server(test) else {
        return;
    };
    let OneServer {
        s1, o, url, dir, ..
    } = &mut c;
    let mut strict = tenant(1);
    strict["isolation"] = json!("safe");
    let (s, v) = call("POST", &format!("{}/v1/tenants", o.url), Some(&strict));
    assert_eq!(s, 201, "{v}");
    let _s2 = agent(dir.path(), "s2", url, 100_000);
    wait_for(
        Duration::from_secs(20),
        "second server not registered",
        || server_loads(o).len() == 2,
    );
    assert_eq!(listed(o)[&1], (Some("s1".to_owned()), "live".to_owned()));
    // Restarted at once (well within its 6 s lease, so the tenant is not moved for its
    // death) at another isolation level.
    let d = dir.path().join("s1");
    let cfg = std::fs::read_to_string(d.join("buffet.toml")).unwrap();
    let port: u16 = cfg
        .split("listen = \"127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .parse()
        .unwrap();
    std::fs::write(
        d.join("buffet.toml"),
        cfg.replace(
            "name = \"firewall\"\n",
            "name = \"firewall\"\nisolation = \"trusted-native\"\n",
        ),
    )
    .unwrap();
    s1.kill();
    let s1 = start_agent(&d, "s1", port);
    wait_for(Duration::from_secs(30), "tenant 1 not live on s2", || {
        listed(o).get(&1) == Some(&(Some("s2".to_owned()), "live".to_owned()))
    });
    // s1 no longer keeps it, running or not.
    wait_for(Duration::from_secs(20), "s1 still keeps tenant 1", || {
        let got = try_call("GET", &format!("{}/v1/tenants", s1.url), Some(ADMIN), None);
        got.is_some_and(|(s, v)| s == 200 && v["tenant"].as_array().is_some_and(Vec::is_empty))
    });
}

/// A chain goes only to a server that offers every NF it names (its Agent reports
/// `nf.offered`): `plain` runs the firewall for every tenant and has the most headroom,
/// `chains` offers firewall and monitor as stages. A chain naming an NF no server offers
/// is refused as such, and a chain whose server dies is not re-placed where its NFs do
/// not run; it waits, unplaced with the reason, and returns when such a server does.
#[test]
fn a_chain_is_placed_only_on_a_server_that_offers_its_nfs() {
    let test = "a_chain_is_placed_only_on_a_server_that_offers_its_nfs";
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = etcd.url();
    let dataplane = |max_nb: u64| {
        format!(
            "[dataplane]\nworkers = 1\nmax_workers = 1\nworker_max_nb = {max_nb}\n\
             arena_mib = 256\ntenant_slots = 16\n"
        )
    };
    let plain = spawn_agent(dir.path(), "plain", &dataplane(1_000_000), &url);
    let chains_cfg = format!("offered = [\"firewall\", \"monitor\"]\n{}", dataplane(1000));
    let mut chains = spawn_agent(dir.path(), "chains", &chains_cfg, &url);
    let o = orchestrator(dir.path(), "orch", &url);
    leader_of(&[&o]);
    wait_for(Duration::from_secs(20), "servers not registered", || {
        server_loads(&o).len() == 2
    });
    let loads = server_loads(&o);
    assert_eq!(loads["plain"]["offered"], json!([]), "{loads:?}");
    assert_eq!(
        loads["chains"]["offered"],
        json!(["firewall", "monitor"]),
        "{loads:?}"
    );
    let chained = |id: u32, second: &str| {
        json!({
            "id": id, "name": format!("t{id}"),
            "rules": [ { "dst_ip": format!("10.2.{id}.0/24") } ],
            "chain": [ { "nf": "firewall", "policy": { "default": "allow" } }, { "nf": second } ],
            "expected_pps": 10,
        })
    };
    let tenants = format!("{}/v1/tenants", o.url);
    // An NF no server offers: 422 naming it and what each server offers; nothing kept.
    // (Before refusing, the leader reads the servers from etcd: its view has both from
    // here on, whatever its watch had delivered.)
    let (s, v) = call("POST", &tenants, Some(&chained(3, "my-nf")));
    assert_eq!(s, 422, "{v}");
    assert_eq!(
        v["error"],
        "chain: no server offers the NF \"my-nf\" (chains offers firewall, monitor; \
         plain: one NF for every tenant, no chains)",
        "{v}"
    );
    // A tenant naming no chain: the most headroom.
    let (s, v) = call("POST", &tenants, Some(&tenant(1)));
    assert_eq!((s, &v["server"]), (201, &json!("plain")), "{v}");
    // A chain: only `chains` runs it.
    let (s, v) = call("POST", &tenants, Some(&chained(2, "monitor")));
    assert_eq!((s, &v["server"]), (201, &json!("chains")), "{v}");
    assert!(served(&chains).contains_key(&2));
    // A name no program could register: the document's own error.
    let (s, v) = call("POST", &tenants, Some(&chained(3, "My NF")));
    assert_eq!(s, 422, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("chain[1].nf") && e.contains("unknown NF"), "{v}");
    assert_eq!(listed(&o).keys().copied().collect::<Vec<_>>(), [1, 2]);

    // Updates of tenant 1 (on `plain`) to a chain: `plain` runs none, so the update moves
    // it to `chains`. First one that `chains` refuses (its rules overlap tenant 2's
    // there): the tenant goes back to `plain` with the document it ran there.
    let tenant1 = format!("{tenants}/1");
    let mut clash = chained(1, "monitor");
    clash["rules"] = json!([ { "dst_ip": "10.2.2.0/24" } ]);
    let (s, v) = call("PUT", &tenant1, Some(&clash));
    assert_eq!(s, 409, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.starts_with(
            "the update of tenant 1 was refused by chains (it moved there because plain does \
             not offer its new chain's NFs): "
        ) && e.ends_with("; it goes back to plain with its previous document"),
        "{v}"
    );
    wait_for(
        Duration::from_secs(30),
        "tenant 1 not back on plain",
        || {
            let (s, v) = call("GET", &tenant1, None);
            s == 200 && v["state"] == "live" && v["server"] == "plain"
        },
    );
    let (_, v) = call("GET", &tenant1, None);
    assert_eq!(v["doc"]["rules"], tenant(1)["rules"], "{v}");
    assert!(v["doc"].get("chain").is_none(), "{v}");
    wait_for(
        Duration::from_secs(10),
        "tenant 1 not served by plain",
        || served(&plain).contains_key(&1) && !served(&chains).contains_key(&1),
    );
    // Then one that `chains` takes: moved, answered with where from.
    let (s, v) = call("PUT", &tenant1, Some(&chained(1, "monitor")));
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (&v["server"], &v["moved_from"], &v["state"]),
        (&json!("chains"), &json!("plain"), &json!("live")),
        "{v}"
    );
    wait_for(Duration::from_secs(10), "tenant 1 not moved", || {
        served(&chains).contains_key(&1) && !served(&plain).contains_key(&1)
    });
    // A chain no server runs: refused before anything is written; it stays as it is.
    let (s, v) = call("PUT", &tenant1, Some(&chained(1, "my-nf")));
    assert_eq!(s, 422, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("chain: no server offers the NF \"my-nf\""),
        "{v}"
    );
    let (_, v) = call("GET", &tenant1, None);
    assert_eq!(
        (&v["server"], &v["state"]),
        (&json!("chains"), &json!("live")),
        "{v}"
    );
    assert_eq!(v["doc"]["chain"][1]["nf"], "monitor", "{v}");

    // `chains` dies: its tenants are not re-placed on `plain`, which would refuse them.
    chains.kill();
    for id in [1, 2] {
        let url = format!("{tenants}/{id}");
        wait_for(
            Duration::from_secs(30),
            &format!("tenant {id} not left unplaced"),
            || {
                let (s, v) = call("GET", &url, None);
                s == 200 && v["state"] == "unplaced"
            },
        );
        let (_, v) = call("GET", &url, None);
        assert_eq!(
            v["reason"],
            "chain: no server offers the NF \"firewall\" (plain: one NF for every tenant, \
             no chains)",
            "{v}"
        );
        assert!(v["server"].is_null(), "{v}");
    }
    // It comes back: placed on it again, and served.
    let chains = spawn_agent(dir.path(), "chains", &chains_cfg, &url);
    for id in [1, 2] {
        let url = format!("{tenants}/{id}");
        wait_for(
            Duration::from_secs(30),
            &format!("tenant {id} not live again"),
            || {
                let (s, v) = call("GET", &url, None);
                s == 200 && v["state"] == "live" && v["server"] == "chains"
            },
        );
    }
    wait_for(Duration::from_secs(10), "tenants not served", || {
        let on = served(&chains);
        on.contains_key(&1) && on.contains_key(&2)
    });
}
