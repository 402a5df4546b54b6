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

const ADMIN: &str = "cluster-test-admin-token-0123456789";

fn etcd_or_skip(test: &str) -> Option<LocalEtcd> {
    match LocalEtcd::start() {
        Ok(e) => Some(e),
        Err(e @ LocalEtcdError::Missing { .. }) => {
            buffet_testkit::gate::skip_privileged(test, e);
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// buffetd in agent mode: firewall NF, a generator for 320 tenants' prefixes.
fn agent(dir: &Path, id: &str, etcd: &str, worker_max_nb: u64) -> Proc {
    let port = free_port();
    let d = dir.join(id);
    std::fs::create_dir_all(&d).unwrap();
    let cfg = d.join("buffet.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:{port}\"\n[nf]\nname = \"firewall\"\n\
             [dataplane]\nworkers = 1\nmax_workers = 2\nworker_max_nb = {worker_max_nb}\n\
             arena_mib = 2048\ntenant_slots = 400\n\
             [[port]]\nkind = \"generator\"\ntenants = 320\nrate_pps = 3000\npeak_factor = 1.0\n\
             flows_per_tenant = 2\n\
             [cluster]\netcd = [\"{etcd}\"]\nserver_id = \"{id}\"\nlease_ttl_s = 6\n\
             report_interval_ms = 300\n",
            d = d.display()
        ),
    )
    .unwrap();
    let log = d.join("buffetd.log");
    let child = Command::new(env!("CARGO_BIN_EXE_buffetd"))
        .arg("--config")
        .arg(&cfg)
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

fn orchestrator(dir: &Path, name: &str, etcd: &str) -> Proc {
    let port = free_port();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_buffet-orchestrator"))
        .args(["--etcd", etcd, "--listen", &format!("127.0.0.1:{port}")])
        .args(["--lease-ttl", "5", "--admit-timeout", "30"])
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
    let mut req = ureq::request(method, url).timeout(Duration::from_secs(40));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let res = match body {
        Some(b) => req
            .set("Content-Type", "application/json")
            .send_string(&b.to_string()),
        None => req.call(),
    };
    let resp = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(_) => return None,
    };
    let status = resp.status();
    let text = resp.into_string().unwrap_or_default();
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

fn call(method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
    try_call(method, url, None, body).unwrap_or_else(|| panic!("{method} {url}: no answer"))
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
            if let Some((200, v)) = try_call("GET", &format!("{}/v1/leader", o.url), None, None) {
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
        if let Some((200, _)) = try_call("GET", &format!("{leader}/v1/tenants"), None, None) {
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
                        None,
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
    // etcd unreachable at start: one clear line, exit 1.
    let port = free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_buffet-orchestrator"))
        .args([
            "--etcd",
            &format!("http://127.0.0.1:{port}"),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("etcd at http://127.0.0.1:{port} is unreachable")),
        "{err}"
    );
    let Some(etcd) = etcd_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let o = orchestrator(dir.path(), "orch", &etcd.url());
    leader_of(&[&o]);
    let post = |body: &Value| call("POST", &format!("{}/v1/tenants", o.url), Some(body));
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
    let _a = agent(dir.path(), "small", &etcd.url(), 1000);
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
