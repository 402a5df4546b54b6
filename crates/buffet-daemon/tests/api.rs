//! The daemon in-process on a loopback port, driven by a real HTTP client (ureq): tenants
//! admitted, updated and removed while the generator's traffic flows, auth, bad input,
//! restart, `/metrics`.

use std::path::Path;
use std::time::{Duration, Instant};

use buffet_daemon::{Daemon, DaemonConfig};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-for-tests-0123456789";

fn config(dir: &Path, extra: &str) -> DaemonConfig {
    DaemonConfig::parse(Path::new("test.toml"), &config_text(dir, extra)).unwrap()
}

/// The text of [`config`] (and the admin token file it names, written).
fn config_text(dir: &Path, extra: &str) -> String {
    std::fs::write(dir.join("admin.token"), format!("{ADMIN}\n")).unwrap();
    format!(
        r#"
data_dir = "{d}/data"
[api]
listen = "127.0.0.1:0"
admin_token_file = "{d}/admin.token"
max_body_bytes = 4096
[nf]
name = "firewall"
[dataplane]
workers = 2
max_workers = 3
tenant_slots = 16
arena_mib = 64
[[port]]
kind = "generator"
tenants = 4
rate_pps = 20000
{extra}
"#,
        d = dir.display()
    )
}

trait WithApi {
    fn with_api(self, f: impl FnOnce(&mut buffet_daemon::config::ApiConfig)) -> Self;
}

impl WithApi for DaemonConfig {
    fn with_api(mut self, f: impl FnOnce(&mut buffet_daemon::config::ApiConfig)) -> Self {
        f(&mut self.api);
        self
    }
}

fn start(dir: &Path) -> Daemon {
    Daemon::start(config(dir, ""), Path::new("test.toml")).unwrap()
}

/// `(status, JSON body or Null)`.
fn call(
    d: &Daemon,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let url = format!("http://{}{path}", d.addr());
    buffet_testkit::http::json(method, &url, token, body, Duration::from_secs(20))
}

fn admin(d: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let b = body.map(Value::to_string);
    call(d, method, path, Some(ADMIN), b.as_deref())
}

/// Tenant `id` owning generator tenant `i`'s prefix.
fn tenant(id: u32, i: u32, policy: Value) -> Value {
    json!({ "id": id, "name": format!("t{id}"), "rules": [ { "dst_ip": format!("10.0.{i}.0/24") } ],
            "policy": policy })
}

fn allow_all() -> Value {
    json!({ "default": "allow" })
}

fn packets(d: &Daemon, id: u32) -> u64 {
    let (s, v) = admin(d, "GET", &format!("/v1/tenants/{id}/stats"), None);
    assert_eq!(s, 200, "{v}");
    v["packets"].as_u64().unwrap()
}

fn wait_for_packets(d: &Daemon, id: u32, more_than: u64) -> u64 {
    let t0 = Instant::now();
    loop {
        let n = packets(d, id);
        if n > more_than {
            return n;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "tenant {id} stuck at {n} packets"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ids(d: &Daemon) -> Vec<u64> {
    let (s, v) = admin(d, "GET", "/v1/tenants", None);
    assert_eq!(s, 200);
    v["tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn tenants_are_admitted_updated_and_removed_while_traffic_flows() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    assert_eq!(call(&d, "GET", "/healthz", None, None).0, 200);
    assert_eq!(call(&d, "GET", "/readyz", None, None).0, 200);
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(1, 0, allow_all())));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["id"], 1);
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(2, 1, allow_all())));
    assert_eq!(s, 201, "{v}");
    assert_eq!(ids(&d), vec![1, 2]);
    let (s, v) = admin(&d, "GET", "/v1/tenants/2", None);
    assert_eq!((s, v["name"].clone()), (200, json!("t2")));

    let n1 = wait_for_packets(&d, 1, 0);
    wait_for_packets(&d, 2, 0);
    let passed_before = admin(&d, "GET", "/v1/tenants/1/stats", None).1["passed"]
        .as_u64()
        .unwrap();
    assert!(passed_before > 0);

    // Deny everything: tenant 1's packets keep arriving, now dropped by the NF.
    let (s, v) = admin(
        &d,
        "PUT",
        "/v1/tenants/1",
        Some(&tenant(1, 0, json!({ "default": "deny" }))),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["policy"]["default"], "deny");
    wait_for_packets(&d, 1, n1 + 100);
    let st = admin(&d, "GET", "/v1/tenants/1/stats", None).1;
    assert!(
        st["drops"].as_object().is_some_and(|m| !m.is_empty()),
        "{st}"
    );

    // Only a quarantined tenant can be released; tenant 1 is not.
    let (s, v) = admin(&d, "POST", "/v1/tenants/1/release", None);
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("not quarantined"),
        "{v}"
    );
    assert_eq!(admin(&d, "POST", "/v1/tenants/9/release", None).0, 404);

    // Rules that overlap another tenant's cannot replace a tenant's own.
    let (s, v) = admin(&d, "PUT", "/v1/tenants/1", Some(&tenant(1, 1, allow_all())));
    assert_eq!(s, 409, "{v}");

    let (s, _) = admin(&d, "DELETE", "/v1/tenants/1", None);
    assert_eq!(s, 204);
    assert_eq!(admin(&d, "GET", "/v1/tenants/1", None).0, 404);
    assert_eq!(admin(&d, "DELETE", "/v1/tenants/1", None).0, 404);
    assert_eq!(ids(&d), vec![2]);
    // The other tenant kept running.
    let n2 = packets(&d, 2);
    wait_for_packets(&d, 2, n2);

    // Workers: list, launch, terminate.
    let (s, v) = admin(&d, "GET", "/v1/workers", None);
    assert_eq!(s, 200);
    assert_eq!(v["workers"].as_array().unwrap().len(), 2);
    let (s, v) = admin(&d, "POST", "/v1/workers", None);
    assert_eq!((s, v["id"].clone()), (201, json!(2)));
    let (s, v) = admin(&d, "POST", "/v1/workers", None);
    assert_eq!(s, 409, "max_workers is 3: {v}");
    assert_eq!(admin(&d, "DELETE", "/v1/workers/0", None).0, 204);
    assert_eq!(admin(&d, "DELETE", "/v1/workers/0", None).0, 404);
    wait_for_packets(&d, 2, packets(&d, 2));
    d.stop().unwrap();
}

#[test]
fn rules_max_nb_and_name_change_in_place_while_traffic_flows() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    for (id, i) in [(1, 0), (2, 1)] {
        let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(id, i, allow_all())));
        assert_eq!(s, 201, "{v}");
    }
    let n1 = wait_for_packets(&d, 1, 0);

    // Onto tenant 2's prefix at the same priority: refused, and nothing changed.
    let (s, v) = admin(&d, "PUT", "/v1/tenants/1", Some(&tenant(1, 1, allow_all())));
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("overlaps tenant 2"),
        "{v}"
    );
    let (_, doc) = admin(&d, "GET", "/v1/tenants/1", None);
    assert_eq!(
        doc,
        tenant(1, 0, allow_all())
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("max_nb".into(), json!(0));
                Value::Object(o)
            })
            .unwrap()
    );
    let n1 = wait_for_packets(&d, 1, n1);
    // An invalid rule: 422, nothing changed.
    let mut bad = tenant(1, 2, allow_all());
    bad["rules"][0]["dst_ip"] = json!("10.0.2.0/99");
    assert_eq!(admin(&d, "PUT", "/v1/tenants/1", Some(&bad)).0, 422);
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/1", None).1["rules"],
        doc["rules"]
    );

    // Onto generator tenant 2's prefix, with a new name and MAX_NB, in one request.
    let mut moved = tenant(1, 2, allow_all());
    moved["name"] = json!("moved");
    moved["max_nb"] = json!(1_000_000);
    let (s, v) = admin(&d, "PUT", "/v1/tenants/1", Some(&moved));
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["name"].clone(), v["max_nb"].clone()),
        (json!("moved"), json!(1_000_000))
    );
    // Counters carry on from where they were (same slot, same row), and grow.
    let n1 = wait_for_packets(&d, 1, n1);
    assert_eq!(
        admin(&d, "GET", "/v1/stats", None).1["tenants"][0]["name"],
        "moved"
    );

    // Onto a prefix no packet goes to: the tenant's count stops, so neither its first
    // nor its second prefix reaches it any more.
    let mut dead = moved.clone();
    dead["rules"][0]["dst_ip"] = json!("10.9.9.0/24");
    assert_eq!(admin(&d, "PUT", "/v1/tenants/1", Some(&dead)).0, 200);
    std::thread::sleep(Duration::from_millis(300));
    let settled = packets(&d, 1);
    assert!(settled >= n1, "counters went back: {settled} < {n1}");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        packets(&d, 1),
        settled,
        "a packet of an old prefix reached tenant 1"
    );
    // Its first prefix is free again: another tenant takes it and gets its packets.
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(3, 0, allow_all())));
    assert_eq!(s, 201, "{v}");
    wait_for_packets(&d, 3, 0);
    // And back onto generator tenant 2's prefix: packets reach it again.
    assert_eq!(admin(&d, "PUT", "/v1/tenants/1", Some(&moved)).0, 200);
    wait_for_packets(&d, 1, settled);

    // The batch form changes rules too (tenant 2 onto generator tenant 3's prefix).
    let set = json!({ "tenant": [ moved.clone(), tenant(2, 3, allow_all()), tenant(3, 0, allow_all()) ] });
    let (s, v) = admin(&d, "PUT", "/v1/tenants", Some(&set));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["updated"], json!([2]));
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/2", None).1["rules"][0]["dst_ip"],
        "10.0.3.0/24"
    );
    let n2 = packets(&d, 2);
    wait_for_packets(&d, 2, n2);
    // A restart keeps the changed tenants.
    d.stop().unwrap();
    let d = start(dir.path());
    let (_, v) = admin(&d, "GET", "/v1/tenants/1", None);
    assert_eq!(
        (v["name"].clone(), v["rules"][0]["dst_ip"].clone()),
        (json!("moved"), json!("10.0.2.0/24"))
    );
    d.stop().unwrap();
}

#[test]
fn tokens_are_checked_401_and_403() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    for (id, i) in [(1, 0), (2, 1)] {
        assert_eq!(
            admin(&d, "POST", "/v1/tenants", Some(&tenant(id, i, allow_all()))).0,
            201
        );
    }
    let body = tenant(3, 2, allow_all()).to_string();
    assert_eq!(call(&d, "POST", "/v1/tenants", None, Some(&body)).0, 401);
    let (s, v) = call(
        &d,
        "POST",
        "/v1/tenants",
        Some("wrong-token-0123456789"),
        Some(&body),
    );
    assert_eq!(s, 401);
    assert!(v["error"].as_str().unwrap().contains("bearer token"));
    assert_eq!(call(&d, "GET", "/v1/tenants", None, None).0, 401);
    assert_eq!(call(&d, "GET", "/v1/events", None, None).0, 401);

    let (s, v) = admin(&d, "POST", "/v1/tenants/1/tokens", None);
    assert_eq!(s, 201);
    let t1 = v["token"].as_str().unwrap().to_owned();
    assert_eq!(call(&d, "GET", "/v1/tenants/1", Some(&t1), None).0, 200);
    assert_eq!(
        call(&d, "GET", "/v1/tenants/1/stats", Some(&t1), None).0,
        200
    );
    assert_eq!(call(&d, "GET", "/v1/tenants/2", Some(&t1), None).0, 403);
    assert_eq!(
        call(&d, "GET", "/v1/tenants/2/stats", Some(&t1), None).0,
        403
    );
    assert_eq!(call(&d, "GET", "/v1/tenants", Some(&t1), None).0, 403);
    assert_eq!(
        call(&d, "POST", "/v1/tenants", Some(&t1), Some(&body)).0,
        403
    );
    assert_eq!(call(&d, "DELETE", "/v1/tenants/1", Some(&t1), None).0, 403);
    assert_eq!(call(&d, "POST", "/v1/workers", Some(&t1), None).0, 403);
    // A removed tenant's tokens die with it.
    assert_eq!(admin(&d, "DELETE", "/v1/tenants/1", None).0, 204);
    assert_eq!(call(&d, "GET", "/v1/tenants/1", Some(&t1), None).0, 401);
    d.stop().unwrap();
}

#[test]
fn bad_input_gets_a_4xx_naming_the_problem_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    assert_eq!(
        admin(&d, "POST", "/v1/tenants", Some(&tenant(1, 0, allow_all()))).0,
        201
    );
    let before = admin(&d, "GET", "/v1/tenants", None).1;
    let post = |body: &str| call(&d, "POST", "/v1/tenants", Some(ADMIN), Some(body));
    let big = format!("{{\"id\": 9, \"name\": \"{}\"}}", "x".repeat(8000));
    let cases: Vec<(String, u16, &str)> = vec![
        ("{\"id\": 5, ".into(), 400, "malformed JSON"),
        ("[1, 2]".into(), 400, "a tenant is a JSON object"),
        (
            json!({ "id": 5, "rules": [ { "dst_ip": "10.0.2.0/24" } ], "colour": "red" }).to_string(),
            422,
            "unknown field `colour`",
        ),
        (
            json!({ "id": 5, "rules": [ { "dst_ip": "10.0.2.0/24" } ], "policy": { "default": "sometimes" } }).to_string(),
            422,
            "tenant 5: policy.default: unknown variant `sometimes`",
        ),
        (
            json!({ "id": 5, "rules": [ { "dst_ip": "10.0.2.0/24" } ], "policy": { "conntrack_capacity": "x" } }).to_string(),
            422,
            "tenant 5: policy.conntrack_capacity: invalid type: string \"x\", expected u32",
        ),
        (
            json!({ "id": 5, "rules": [ { "dst_ip": "10.0.2.0/24" } ], "policy": { "conntrack_capacty": 4 } }).to_string(),
            422,
            "tenant 5: policy.conntrack_capacty: unknown field `conntrack_capacty`",
        ),
        (
            json!({ "id": 5, "rules": [ { "dst_ip": "10.0.2.0/33" } ] }).to_string(),
            422,
            "rules[0].dst_ip",
        ),
        (
            json!({ "id": 5, "rules": [ { "dst_port": 80 } ] }).to_string(),
            422,
            "protocol",
        ),
        (tenant(1, 2, allow_all()).to_string(), 409, "tenant 1 is already admitted"),
        (
            tenant(5, 0, allow_all()).to_string(),
            409,
            "overlaps tenant 1's rules[0] at the same priority 100",
        ),
        (
            json!({ "id": 5, "rules": [ { "dst_ip": "10.0.2.0/24" } ], "isolation": "mpk" }).to_string(),
            422,
            "isolation",
        ),
        (big, 413, "too large"),
    ];
    for (body, status, needle) in cases {
        let (s, v) = post(&body);
        assert_eq!(s, status, "{body:.80}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{body:.80}: {msg:?} lacks {needle:?}");
        assert_eq!(
            admin(&d, "GET", "/v1/tenants", None).1,
            before,
            "{body:.80} changed something"
        );
    }
    // Overlap at another priority is fine: the priority decides.
    let mut t = tenant(5, 0, allow_all());
    t["rules"][0]["priority"] = json!(50);
    assert_eq!(admin(&d, "POST", "/v1/tenants", Some(&t)).0, 201);
    // An unknown NF in the config: the daemon does not start, and says why.
    let mut cfg = config(dir.path(), "");
    cfg.nf.name = Some("nope".into());
    let e = cfg.validate(Path::new("x.toml")).unwrap_err().to_string();
    assert!(e.contains("unknown NF \"nope\""), "{e}");
    assert_eq!(call(&d, "GET", "/v1/nothing", Some(ADMIN), None).0, 404);
    // A path, query or method the API does not take: a 4xx whose body is JSON naming it.
    for (method, path, status, needle) in [
        ("GET", "/v1/tenants/abc", 400, "abc"),
        ("GET", "/v1/tenants/4294967296", 400, "4294967296"),
        ("DELETE", "/v1/tenants/-1", 400, "-1"),
        ("DELETE", "/v1/workers/70000", 400, "70000"),
        ("PUT", "/v1/tenants?dry_run=maybe", 400, "dry_run"),
        ("PATCH", "/v1/tenants/1", 405, "PATCH is not served"),
    ] {
        let (s, v) = call(&d, method, path, Some(ADMIN), Some("{}"));
        assert_eq!(s, status, "{method} {path}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{method} {path}: {v} lacks {needle:?}"
        );
    }
    assert_eq!(
        admin(&d, "GET", "/v1/tenants", None).1["tenant"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    d.stop().unwrap();
}

#[test]
fn a_restart_keeps_every_tenant_with_its_last_acknowledged_policy_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let token;
    {
        let d = start(dir.path());
        for (id, i) in [(1, 0), (2, 1), (3, 2)] {
            assert_eq!(
                admin(&d, "POST", "/v1/tenants", Some(&tenant(id, i, allow_all()))).0,
                201
            );
        }
        assert_eq!(
            admin(
                &d,
                "PUT",
                "/v1/tenants/2",
                Some(&tenant(2, 1, json!({ "default": "deny" })))
            )
            .0,
            200
        );
        assert_eq!(admin(&d, "DELETE", "/v1/tenants/3", None).0, 204);
        token = admin(&d, "POST", "/v1/tenants/1/tokens", None).1["token"]
            .as_str()
            .unwrap()
            .to_owned();
        d.stop().unwrap();
    }
    let d = start(dir.path());
    assert_eq!(ids(&d), vec![1, 2]);
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/2", None).1["policy"]["default"],
        "deny"
    );
    assert_eq!(call(&d, "GET", "/v1/tenants/1", Some(&token), None).0, 200);
    wait_for_packets(&d, 2, 0);
    d.stop().unwrap();
}

#[test]
fn applying_a_tenant_set_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    assert_eq!(
        admin(&d, "POST", "/v1/tenants", Some(&tenant(1, 0, allow_all()))).0,
        201
    );
    assert_eq!(
        admin(&d, "POST", "/v1/tenants", Some(&tenant(2, 1, allow_all()))).0,
        201
    );
    // 1 updated, 2 removed, 3 added, and 4 invalid: nothing happens.
    let bad = json!({ "tenant": [
        tenant(1, 0, json!({ "default": "deny" })),
        tenant(3, 2, allow_all()),
        tenant(4, 3, json!({ "default": "sometimes" })),
    ]});
    let (s, v) = admin(&d, "PUT", "/v1/tenants", Some(&bad));
    assert_eq!(s, 422, "{v}");
    // The refusal names the tenant among the set, and the field.
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("tenant 4: policy.default: unknown variant `sometimes`"),
        "{msg}"
    );
    assert_eq!(ids(&d), vec![1, 2]);
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/1", None).1["policy"]["default"],
        "allow"
    );
    let good = json!({ "tenant": [
        tenant(1, 0, json!({ "default": "deny" })),
        tenant(3, 2, allow_all()),
    ]});
    let (s, v) = admin(&d, "PUT", "/v1/tenants?dry_run=true", Some(&good));
    assert_eq!(s, 200, "{v}");
    assert_eq!(ids(&d), vec![1, 2]);
    let (s, v) = admin(&d, "PUT", "/v1/tenants", Some(&good));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["added"], json!([3]));
    assert_eq!(v["updated"], json!([1]));
    assert_eq!(v["removed"], json!([2]));
    assert_eq!(ids(&d), vec![1, 3]);
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/1", None).1["policy"]["default"],
        "deny"
    );
    d.stop().unwrap();
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    assert_eq!(
        admin(&d, "POST", "/v1/tenants", Some(&tenant(7, 0, allow_all()))).0,
        201
    );
    wait_for_packets(&d, 7, 0);
    let text = ureq::get(&format!("http://{}/metrics", d.addr()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let find = |name: &str, label: Option<(&str, &str)>| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                prometheus_parse::Value::Untyped(v) => v,
                _ => -1.0,
            })
    };
    assert!(
        find("buffet_tenant_packets_total", Some(("tenant", "7"))).unwrap() > 0.0,
        "{text}"
    );
    assert!(find("buffet_tenant_bytes_total", Some(("tenant", "7"))).unwrap() > 0.0);
    assert!(find("buffet_tenant_cycles_total", Some(("tenant", "7"))).is_some());
    assert_eq!(find("buffet_tenants", None), Some(1.0));
    assert!(find("buffet_worker_packets_total", Some(("worker", "0"))).is_some());
    assert!(find("buffet_migrations_total", None).is_some());
    // The server-wide drops, one series per reason from the first scrape.
    assert!(find(
        "buffet_dropped_packets_total",
        Some(("reason", "no_live_worker"))
    )
    .is_some());
    assert!(find(
        "buffet_malformed_packets_total",
        Some(("reason", "truncated_ip"))
    )
    .is_some());
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric.starts_with("buffet_admission_latency_seconds")));
    d.stop().unwrap();
}

/// Every `(METHOD, path)` of `docs/openapi.json`.
fn documented() -> std::collections::BTreeSet<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = std::collections::BTreeSet::new();
    for (p, item) in doc["paths"].as_object().unwrap() {
        for m in item.as_object().unwrap().keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"].contains(&m.as_str()) {
                out.insert((m.to_uppercase(), p.clone()));
            }
        }
    }
    out
}

#[test]
fn the_openapi_document_names_exactly_the_routes_served() {
    let served: std::collections::BTreeSet<(String, String)> = buffet_daemon::api::routes()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_owned()))
        .collect();
    let docs = documented();
    let undocumented: Vec<_> = served.difference(&docs).collect();
    let unserved: Vec<_> = docs.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in docs/openapi.json: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "in docs/openapi.json but not served: {unserved:?}"
    );
    // Every operation documents its responses, and every path parameter.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (m, p) in &docs {
        let op = &doc["paths"][p][m.to_lowercase()];
        assert!(
            op["responses"].as_object().is_some_and(|r| !r.is_empty()),
            "{m} {p}"
        );
        if p.contains("{id}") {
            assert_eq!(op["parameters"][0]["name"], "id", "{m} {p}");
        }
    }

    // Served as is, without a token; and each documented route answers (not the
    // fallback's 404 "no such route", not 405).
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let text = ureq::get(&format!("http://{}/v1/openapi.json", d.addr()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert_eq!(text, buffet_daemon::api::OPENAPI);
    for (m, p) in &docs {
        if p == "/v1/events" {
            continue; // a stream that stays open
        }
        let path = p.replace("{id}", "99");
        let (s, v) = call(&d, m, &path, None, Some("{}"));
        assert_ne!(s, 405, "{m} {p}");
        assert!(s != 404 || v["error"] != "no such route", "{m} {p}: {v}");
    }
    d.stop().unwrap();
}

#[test]
fn a_client_trickling_its_headers_is_cut_off_while_others_are_served() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        config(dir.path(), "").with_api(|a| {
            a.header_read_timeout_ms = 500;
            a.max_connections = 2;
        }),
        Path::new("test.toml"),
    )
    .unwrap();
    // Two slow clients take every connection the server allows.
    let t0 = Instant::now();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let addr = d.addr();
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
                let started = Instant::now();
                let mut buf = [0u8; 256];
                loop {
                    // One header byte every 50 ms: never a complete head.
                    if s.write_all(b"X").is_err() {
                        break;
                    }
                    match s.read(&mut buf) {
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        // End of stream, an answer or a reset: the server let go.
                        _ => break,
                    }
                    assert!(started.elapsed() < Duration::from_secs(30), "never cut off");
                }
                started.elapsed()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // Another client is served once the slow ones are cut off (the limit is 2).
    assert_eq!(call(&d, "GET", "/healthz", None, None).0, 200);
    let served_after = t0.elapsed();
    for h in slow {
        let cut = h.join().unwrap();
        assert!(
            cut < Duration::from_secs(3),
            "a trickling client was held {cut:?}"
        );
    }
    assert!(served_after < Duration::from_secs(3), "{served_after:?}");
    // With connections free, a client is served at once.
    let t1 = Instant::now();
    assert_eq!(call(&d, "GET", "/healthz", None, None).0, 200);
    assert!(
        t1.elapsed() < Duration::from_millis(400),
        "{:?}",
        t1.elapsed()
    );
    d.stop().unwrap();
}

#[test]
fn clients_that_announce_a_body_and_send_none_are_cut_off_and_others_served() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        config(dir.path(), "").with_api(|a| {
            a.request_timeout_ms = 500;
            a.max_connections = 3;
        }),
        Path::new("test.toml"),
    )
    .unwrap();
    // Every connection the server allows: a request head with a Content-Length, then
    // nothing. Two send no token, one the admin's.
    let held: Vec<_> = [None, None, Some(ADMIN)]
        .into_iter()
        .map(|token| {
            let addr = d.addr();
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let auth = token
                    .map(|t| format!("Authorization: Bearer {t}\r\n"))
                    .unwrap_or_default();
                let head = format!(
                    "POST /v1/tenants HTTP/1.1\r\nHost: x\r\n{auth}\
                     Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                );
                s.write_all(head.as_bytes()).unwrap();
                let started = Instant::now();
                // Until the server closes the connection (or the read times out).
                let mut answer = Vec::new();
                let _ = s.read_to_end(&mut answer);
                (
                    token.is_some(),
                    started.elapsed(),
                    String::from_utf8_lossy(&answer).to_lowercase(),
                )
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // An authorised request gets through although the limit is 3.
    let t0 = Instant::now();
    assert_eq!(call(&d, "GET", "/v1/tenants", Some(ADMIN), None).0, 200);
    let served = t0.elapsed();
    assert!(served < Duration::from_secs(2), "{served:?}");
    for h in held {
        let (admin, closed, answer) = h.join().unwrap();
        // Without a token: 401 before the body is waited for. The admin: 408 once the
        // request's deadline passes. Either way the connection is closed.
        let status = if admin { "408" } else { "401" };
        assert!(
            answer.starts_with(&format!("http/1.1 {status}")),
            "{answer}"
        );
        assert!(
            closed < Duration::from_secs(2),
            "a connection was held {closed:?}: {answer}"
        );
        if admin {
            assert!(answer.contains("connection: close"), "{answer}");
            assert!(closed >= Duration::from_millis(400), "{closed:?}");
        }
    }
    d.stop().unwrap();
}

/// A restart at another isolation level never runs a tenant that asked for its own, and
/// costs the others nothing: the daemon starts, serves them, and keeps the refused ones
/// in the store, listed as `not_restored` with why, until a document that fits replaces
/// them (`PUT /v1/tenants/{id}`) or they are removed (a tenant set without them).
#[test]
fn a_restart_at_another_isolation_level_never_runs_a_tenant_that_asked_for_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let mut t5 = tenant(5, 0, allow_all());
    t5["isolation"] = json!("safe");
    let mut t6 = tenant(6, 1, allow_all());
    t6["isolation"] = json!("safe");
    for t in [&t5, &t6, &tenant(7, 2, allow_all())] {
        assert_eq!(admin(&d, "POST", "/v1/tenants", Some(t)).0, 201);
    }
    d.stop().unwrap();
    let mut cfg = config(dir.path(), "");
    cfg.nf.isolation = Some(buffet_config::isolation::Isolation::TrustedNative);
    let d = Daemon::start(cfg.clone(), Path::new("test.toml")).unwrap();
    assert_eq!(ids(&d), vec![5, 6, 7]);
    let (s, v) = admin(&d, "GET", "/v1/tenants/5", None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "not_restored", "{v}");
    assert_eq!(
        v["reason"], "isolation: asks for safe, this server runs every tenant at trusted-native",
        "{v}"
    );
    assert!(admin(&d, "GET", "/v1/tenants/7", None)
        .1
        .get("state")
        .is_none());
    wait_for_packets(&d, 7, 0);
    let (s, v) = admin(&d, "GET", "/v1/tenants/5/stats", None);
    assert_eq!(s, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("not running"), "{v}");
    // Its id is taken: a new admission is refused, naming the way out.
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(5, 0, allow_all())));
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("PUT /v1/tenants/5"),
        "{v}"
    );
    // Replaced by a document that fits: it runs.
    let (s, v) = admin(&d, "PUT", "/v1/tenants/5", Some(&tenant(5, 0, allow_all())));
    assert_eq!(s, 200, "{v}");
    assert!(v.get("state").is_none(), "{v}");
    wait_for_packets(&d, 5, 0);
    // A tenant set without tenant 6 removes it from the store.
    let set = json!({ "tenant": [ tenant(5, 0, allow_all()), tenant(7, 2, allow_all()) ] });
    let (s, v) = admin(&d, "PUT", "/v1/tenants", Some(&set));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["removed"], json!([6]), "{v}");
    assert_eq!(ids(&d), vec![5, 7]);
    d.stop().unwrap();
    // What the store has now runs at this level.
    let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
    let (s, v) = admin(&d, "GET", "/v1/tenants", None);
    assert_eq!(s, 200, "{v}");
    let rows = v["tenant"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert!(rows.iter().all(|t| t.get("state").is_none()), "{v}");
    d.stop().unwrap();
}

/// Fewer tenant slots after a restart: the tenants that still fit run, the rest are
/// kept not running, and removing one of those frees nothing it never held.
#[test]
fn a_restart_with_fewer_tenant_slots_runs_the_tenants_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    for (id, i) in [(1, 0), (2, 1), (3, 2)] {
        assert_eq!(
            admin(&d, "POST", "/v1/tenants", Some(&tenant(id, i, allow_all()))).0,
            201
        );
    }
    d.stop().unwrap();
    let mut cfg = config(dir.path(), "");
    cfg.dataplane.tenant_slots = 2;
    let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
    let (s, v) = admin(&d, "GET", "/v1/tenants", None);
    assert_eq!(s, 200, "{v}");
    let states: Vec<(u64, Value)> = v["tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_u64().unwrap(), t["state"].clone()))
        .collect();
    assert_eq!(
        states,
        vec![
            (1, Value::Null),
            (2, Value::Null),
            (3, json!("not_restored"))
        ],
        "{v}"
    );
    assert!(
        v["tenant"][2]["reason"]
            .as_str()
            .unwrap()
            .starts_with("too many tenants"),
        "{v}"
    );
    wait_for_packets(&d, 2, 0);
    assert_eq!(admin(&d, "DELETE", "/v1/tenants/3", None).0, 204);
    assert_eq!(ids(&d), vec![1, 2]);
    assert_eq!(admin(&d, "GET", "/v1/tenants/3", None).0, 404);
    d.stop().unwrap();
}

/// Retries `f` until it returns true; fails with `why` after `limit`.
fn eventually(limit: Duration, why: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{why}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_agents_refusal_holds_for_tenant_sets_and_ends_with_a_removal_or_a_launch() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "");
    // One worker that can take almost nothing, and none to launch: overloaded at once.
    cfg.dataplane.workers = 1;
    cfg.dataplane.max_workers = 1;
    cfg.dataplane.worker_max_nb = 4;
    cfg.dataplane.shift = 24;
    let d = Daemon::start(cfg.clone(), Path::new("test.toml")).unwrap();
    let busy = tenant(1, 0, allow_all());
    // Tenants whose prefixes no generated packet hits.
    let quiet = |id: u32| json!({ "id": id, "rules": [ { "dst_ip": format!("10.9.{id}.0/24") } ] });
    assert_eq!(admin(&d, "POST", "/v1/tenants", Some(&busy)).0, 201);
    let refused = |s: u16, v: &Value| {
        s == 503
            && v["error"]
                .as_str()
                .is_some_and(|e| e.contains("not admitting new tenants"))
    };
    eventually(Duration::from_secs(20), "never refusing", || {
        let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&quiet(9)));
        assert!(s == 201 || refused(s, &v), "{s} {v}");
        if s == 201 {
            assert_eq!(admin(&d, "DELETE", "/v1/tenants/9", None).0, 204);
        }
        refused(s, &v)
    });
    // A tenant set that adds a tenant is refused like an admission, and changes nothing.
    let (s, v) = admin(
        &d,
        "PUT",
        "/v1/tenants",
        Some(&json!({ "tenant": [busy, quiet(9)] })),
    );
    assert!(refused(s, &v), "{s} {v}");
    assert_eq!(ids(&d), [1]);
    // One that removes a tenant lifts the refusal (the removed tenant was the load).
    let (s, v) = admin(&d, "PUT", "/v1/tenants", Some(&json!({ "tenant": [] })));
    assert_eq!(s, 200, "{v}");
    eventually(Duration::from_secs(5), "still refusing", || {
        admin(&d, "POST", "/v1/tenants", Some(&quiet(9))).0 == 201
    });
    // Overloaded again with no worker to launch; then a reload allows more workers and
    // the Agent's own launch lifts the refusal.
    assert_eq!(admin(&d, "POST", "/v1/tenants", Some(&busy)).0, 201);
    eventually(Duration::from_secs(20), "never refusing again", || {
        let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&quiet(10)));
        assert!(s == 201 || refused(s, &v), "{s} {v}");
        if s == 201 {
            assert_eq!(admin(&d, "DELETE", "/v1/tenants/10", None).0, 204);
        }
        refused(s, &v)
    });
    let mut more = cfg;
    more.dataplane.max_workers = 8;
    d.reload(more).unwrap();
    eventually(Duration::from_secs(20), "no worker launched", || {
        let (_, v) = admin(&d, "GET", "/v1/workers", None);
        v["workers"].as_array().unwrap().len() > 1
    });
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&quiet(10)));
    assert_eq!(s, 201, "{v}");
    d.stop().unwrap();
}

#[test]
fn a_reload_changes_what_may_change_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let d = Daemon::start(cfg.clone(), Path::new("test.toml")).unwrap();
    assert_eq!(admin(&d, "POST", "/v1/workers", None).0, 201);
    assert_eq!(admin(&d, "POST", "/v1/workers", None).0, 409);
    // max_workers 3 -> 4 and a new admin token.
    let new_token = "a-new-admin-token-after-reload-0001";
    std::fs::write(dir.path().join("admin2.token"), format!("{new_token}\n")).unwrap();
    let mut next = cfg.clone();
    next.dataplane.max_workers = 4;
    next.api.admin_token_file = Some(dir.path().join("admin2.token"));
    next.api.max_body_bytes = 2048;
    let changed = d.reload(next.clone()).unwrap();
    assert_eq!(
        changed,
        [
            "api.admin_token_file",
            "api.max_body_bytes",
            "dataplane.max_workers"
        ]
    );
    assert_eq!(call(&d, "POST", "/v1/workers", Some(ADMIN), None).0, 401);
    assert_eq!(
        call(&d, "POST", "/v1/workers", Some(new_token), None).0,
        201
    );
    // The new body limit holds for new connections.
    let big = json!({ "id": 5, "rules": [ { "dst_ip": "10.0.0.0/24" } ], "policy": { "x": "y".repeat(3000) } });
    assert_eq!(
        call(
            &d,
            "POST",
            "/v1/tenants",
            Some(new_token),
            Some(&big.to_string())
        )
        .0,
        413
    );
    // A field that needs a restart: refused, naming it, and nothing changed.
    let mut fixed = next.clone();
    fixed.dataplane.max_workers = 8;
    fixed.dataplane.tenant_slots = 32;
    let e = d.reload(fixed).unwrap_err();
    assert_eq!(
        e.to_string(),
        "dataplane.tenant_slots cannot change without a restart"
    );
    let mut fixed = next.clone();
    fixed.dataplane.idle_wait_us = 5;
    let e = d.reload(fixed).unwrap_err();
    assert_eq!(
        e.to_string(),
        "dataplane.idle_wait_us cannot change without a restart"
    );
    assert_eq!(
        call(&d, "POST", "/v1/workers", Some(new_token), None).0,
        409
    );
    let mut nf = next.clone();
    nf.nf.name = Some("monitor".into());
    assert_eq!(
        d.reload(nf).unwrap_err().to_string(),
        "nf cannot change without a restart"
    );
    assert_eq!(d.reload(next).unwrap(), Vec::<&str>::new());
    d.stop().unwrap();
}

/// A daemon whose tenants may name their own chains of the offered NFs (monitor is the
/// default stage).
fn chain_config(dir: &Path) -> DaemonConfig {
    let text = config_text(dir, "")
        .replace(
            "name = \"firewall\"\n",
            "name = \"monitor\"\noffered = [\"firewall\", \"monitor\"]\n",
        )
        .replace("arena_mib = 64", "arena_mib = 1024");
    DaemonConfig::parse(Path::new("test.toml"), &text).unwrap()
}

/// A stage NF whose region makes every tenant's chain region larger than the arena gives
/// one region is refused when the daemon starts, naming that stage and the arena it
/// needs, not at the first tenant's admission.
#[test]
fn a_stage_nf_too_large_for_the_arena_is_named_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(dir.path(), "")
        .replace(
            "name = \"firewall\"\n",
            "name = \"monitor\"\noffered = [\"firewall\", \"monitor\"]\n",
        )
        .replace("arena_mib = 64", "arena_mib = 4");
    assert!(text.contains("arena_mib = 4\n"), "{text}");
    let cfg = DaemonConfig::parse(Path::new("test.toml"), &text).unwrap();
    let e = match Daemon::start(cfg, Path::new("test.toml")) {
        Ok(d) => {
            d.stop().unwrap();
            panic!("a chain region larger than a 4 MiB arena was accepted");
        }
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("nf.offered: chain stage NF firewall asks")
            && e.contains("larger arena (at least"),
        "{e}"
    );
    assert_eq!(e.matches("firewall asks").count(), 1, "{e}");
}

/// Tenant `id` on generator prefix `i` with the chain firewall(`fw`) -> monitor.
fn chained(id: u32, i: u32, fw: Value) -> Value {
    json!({ "id": id, "name": format!("t{id}"), "rules": [ { "dst_ip": format!("10.0.{i}.0/24") } ],
            "chain": [ { "nf": "firewall", "policy": fw }, { "nf": "monitor" } ] })
}

fn stats_of(d: &Daemon, id: u32) -> Value {
    let (s, v) = admin(d, "GET", &format!("/v1/tenants/{id}/stats"), None);
    assert_eq!(s, 200, "{v}");
    v
}

/// Issue 16 through the API: a tenant admitted with its own chain (the tenants-file
/// schema as JSON) runs it, with per-stage counters in its stats and in /metrics; a
/// chain naming an NF the server does not offer, or a stage policy its NF rejects, is a
/// 422 naming the tenant, the stage and the field, and changes nothing; a chain update
/// is one step (the new chain's firewall denies everything: its monitor stage never sees
/// a packet); the chain survives a restart. A server without `nf.offered` refuses chains.
#[test]
fn tenants_run_their_own_chains_admitted_updated_and_kept_through_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(chain_config(dir.path()), Path::new("test.toml")).unwrap();
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&chained(1, 0, allow_all())));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["chain"][0]["nf"], "firewall");
    // A tenant naming no chain runs the configured NF alone.
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(2, 1, json!({}))));
    assert_eq!(s, 201, "{v}");
    wait_for_packets(&d, 1, 0);
    wait_for_packets(&d, 2, 0);
    let t0 = Instant::now();
    let st = loop {
        let st = stats_of(&d, 1);
        if st["chain"][1]["packets"].as_u64().unwrap_or(0) > 0 {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{st}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stages = st["chain"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{st}");
    assert_eq!(
        (stages[0]["stage"].clone(), stages[0]["nf"].clone()),
        (json!(0), json!("firewall"))
    );
    assert_eq!(
        (stages[1]["stage"].clone(), stages[1]["nf"].clone()),
        (json!(1), json!("monitor"))
    );
    assert!(stages[0]["passed"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(stats_of(&d, 2)["chain"].as_array().map(Vec::len), Some(1));

    // Not offered: 422 naming tenant, stage index and field; nothing admitted.
    let mut bad = chained(3, 2, allow_all());
    bad["chain"][1]["nf"] = json!("dpi");
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&bad));
    assert_eq!(s, 422, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("tenant 3")
            && msg.contains("chain[1].nf")
            && msg.contains("dpi is not offered"),
        "{msg}"
    );
    assert_eq!(ids(&d), vec![1, 2]);
    // A stage policy its NF rejects: 422 naming chain[0].policy; tenant 1 unchanged.
    let (s, v) = admin(
        &d,
        "PUT",
        "/v1/tenants/1",
        Some(&chained(1, 0, json!({ "default": "maybe" }))),
    );
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("tenant 1"), "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("chain[0].policy"),
        "{v}"
    );
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/1", None).1["chain"][0]["policy"],
        allow_all()
    );

    // The chain's update: the new chain's firewall denies everything, in one step with
    // its new state, so its monitor stage never sees a packet.
    let (s, v) = admin(
        &d,
        "PUT",
        "/v1/tenants/1",
        Some(&chained(1, 0, json!({ "default": "deny" }))),
    );
    assert_eq!(s, 200, "{v}");
    let n = packets(&d, 1);
    wait_for_packets(&d, 1, n + 50);
    let st = stats_of(&d, 1);
    assert!(
        st["chain"][0]["drops"]["policy"].as_u64().unwrap_or(0) > 0,
        "{st}"
    );
    assert_eq!(st["chain"][1]["packets"], 0, "{st}");

    // /metrics: per-stage families with tenant, stage and nf labels.
    let text = ureq::get(&format!("http://{}/metrics", d.addr()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let has = |name: &str, labels: &[&str]| {
        lines
            .iter()
            .any(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
    };
    assert!(
        has(
            "buffet_tenant_stage_packets_total{",
            &["tenant=\"1\"", "stage=\"0\"", "nf=\"firewall\""]
        ),
        "{text}"
    );
    assert!(
        has(
            "buffet_tenant_stage_drops_total{",
            &["tenant=\"1\"", "stage=\"0\"", "reason=\"policy\""]
        ),
        "{text}"
    );
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert!(parsed
        .samples
        .iter()
        .any(|s| s.metric == "buffet_tenant_stage_passed_packets_total"));

    // A restart re-admits tenant 1 with its chain as last acknowledged.
    d.stop().unwrap();
    let d = Daemon::start(chain_config(dir.path()), Path::new("test.toml")).unwrap();
    let (_, v) = admin(&d, "GET", "/v1/tenants/1", None);
    assert_eq!(v["chain"][0]["policy"], json!({ "default": "deny" }));
    let t0 = Instant::now();
    loop {
        let st = stats_of(&d, 1);
        if st["chain"][0]["drops"]["policy"].as_u64().unwrap_or(0) > 0 {
            assert_eq!(st["chain"][1]["packets"], 0, "{st}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop().unwrap();

    // Without nf.offered a chain is refused, naming why.
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&chained(1, 0, allow_all())));
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("nf.offered"), "{v}");
    assert!(ids(&d).is_empty());
    d.stop().unwrap();
}

/// A policy and a rules change to one tenant are one data-plane step. Tenant 1 flips,
/// 100 times while the generator's traffic flows, between generator prefix 0 with a
/// firewall policy that allows only prefix 0, and prefix 1 with one that allows only
/// prefix 1 (both deny the rest). A packet classified under the new rules but handled
/// with the old policy, or the reverse, is denied by the firewall and counted as a
/// `policy` drop: there must be none, while the tenant's packets keep passing.
#[test]
fn a_policy_and_rules_change_is_one_step_no_packet_meets_half_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let only = |i: u32| {
        tenant(
            1,
            i,
            json!({ "default": "deny", "rules": [ { "action": "allow", "dst": format!("10.0.{i}.0/24") } ] }),
        )
    };
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&only(0)));
    assert_eq!(s, 201, "{v}");
    // A neighbour whose traffic must flow on throughout.
    assert_eq!(
        admin(&d, "POST", "/v1/tenants", Some(&tenant(2, 2, allow_all()))).0,
        201
    );
    wait_for_packets(&d, 1, 0);
    let n2 = wait_for_packets(&d, 2, 0);
    let policy_drops = |d: &Daemon| {
        let (s, st) = admin(d, "GET", "/v1/tenants/1/stats", None);
        assert_eq!(s, 200, "{st}");
        (
            st["drops"]["policy"].as_u64().unwrap_or(0),
            st["passed"].as_u64().unwrap(),
        )
    };
    let (_, passed0) = policy_drops(&d);
    for k in 0..100u32 {
        let (s, v) = admin(&d, "PUT", "/v1/tenants/1", Some(&only((k + 1) % 2)));
        assert_eq!(s, 200, "{v}");
        // Let some packets of the new prefix arrive before the next flip.
        std::thread::sleep(Duration::from_millis(2));
    }
    wait_for_packets(&d, 1, packets(&d, 1));
    let (drops, passed) = policy_drops(&d);
    assert_eq!(
        drops, 0,
        "packets met the new rules with the old policy or the reverse"
    );
    assert!(passed > passed0, "tenant 1 stopped passing packets");
    wait_for_packets(&d, 2, n2);
    // The last document is the one served and stored.
    assert_eq!(
        admin(&d, "GET", "/v1/tenants/1", None).1["rules"][0]["dst_ip"],
        "10.0.0.0/24"
    );
    d.stop().unwrap();
}

/// `POST /v1/reload` reads the daemon's config file again through the SIGHUP path: the
/// admin token only; a reloadable change applies and is named; an invalid file or a
/// field that needs a restart is a 4xx naming the field, and nothing changes.
#[test]
fn the_api_reloads_the_config_file_admin_only_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("buffet.toml");
    let write = |dataplane: &str| {
        let text = config_text(dir.path(), "").replace(
            "max_workers = 3\n",
            &format!("max_workers = 3\n{dataplane}"),
        );
        std::fs::write(&file, text).unwrap();
    };
    write("");
    let d = Daemon::start(DaemonConfig::load(&file).unwrap(), &file).unwrap();
    assert_eq!(
        admin(&d, "POST", "/v1/tenants", Some(&tenant(1, 0, allow_all()))).0,
        201
    );
    let (_, tok) = admin(&d, "POST", "/v1/tenants/1/tokens", None);
    let tenant_token = tok["token"].as_str().unwrap().to_owned();
    // Nothing in the file changed yet.
    let (s, v) = admin(&d, "POST", "/v1/reload", None);
    assert_eq!((s, v), (200, json!({ "changed": [] })));
    // No token, a tenant's token: refused.
    assert_eq!(call(&d, "POST", "/v1/reload", None, None).0, 401);
    write("default_tenant_max_nb = 77\n");
    let (s, v) = call(&d, "POST", "/v1/reload", Some(&tenant_token), None);
    assert_eq!(s, 403, "{v}");
    // ... and the refused request changed nothing: an admission still gets MAX_NB 0.
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(2, 1, allow_all())));
    assert_eq!((s, v["max_nb"].clone()), (201, json!(0)), "{v}");
    // The admin's reload applies it and names it.
    let (s, v) = admin(&d, "POST", "/v1/reload", None);
    assert_eq!(
        (s, v),
        (
            200,
            json!({ "changed": ["dataplane.default_tenant_max_nb"] })
        )
    );
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(3, 2, allow_all())));
    assert_eq!((s, v["max_nb"].clone()), (201, json!(77)), "{v}");
    // An invalid file: 422 naming the field; nothing changed.
    write("default_tenant_max_nb = 5\nshift = 64\n");
    let (s, v) = admin(&d, "POST", "/v1/reload", None);
    assert_eq!(s, 422, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("dataplane.shift: must be below 64"), "{msg}");
    // A field that needs a restart, beside a reloadable one: 409 naming it; nothing changed.
    write("default_tenant_max_nb = 5\nshift = 20\n");
    let (s, v) = admin(&d, "POST", "/v1/reload", None);
    assert_eq!(s, 409, "{v}");
    assert_eq!(
        v["error"],
        "reload refused, nothing changed: dataplane.shift cannot change without a restart"
    );
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(4, 3, allow_all())));
    assert_eq!((s, v["max_nb"].clone()), (201, json!(77)), "{v}");
    // A file that is gone: 422 naming it.
    std::fs::remove_file(&file).unwrap();
    let (s, v) = admin(&d, "POST", "/v1/reload", None);
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("buffet.toml"), "{v}");
    d.stop().unwrap();
}

#[path = "common/gaps.rs"]
mod gaps;

/// Control requests are applied between bursts: during 1,000 admissions and removals of
/// other tenants, no running tenant's traffic pauses for longer than the sampler itself
/// explains. The bound: the largest interval without progress stays within twice the
/// same sampler's largest one over as long a time with no requests, plus twice its
/// slowest poll, plus 50 ms — a data plane that stopped for an admission (a lock held
/// across the bursts, a state built on the data-plane thread) would exceed it.
#[test]
fn admissions_and_removals_never_pause_the_running_tenants_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "");
    cfg.dataplane.tenant_slots = 64;
    let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
    for i in 0..4u32 {
        let (s, v) = admin(
            &d,
            "POST",
            "/v1/tenants",
            Some(&tenant(i + 1, i, allow_all())),
        );
        assert_eq!(s, 201, "{v}");
    }
    for id in 1..=4 {
        wait_for_packets(&d, id, 0);
    }
    let base = format!("http://{}", d.addr());
    let running = [1u64, 2, 3, 4];
    let churn = gaps::sample_gaps(&base, ADMIN, &running, || {
        let t0 = Instant::now();
        for k in 0..500u32 {
            let id = 100 + k % 32;
            let t = json!({ "id": id, "rules": [ { "dst_ip": format!("10.9.{}.0/24", k % 32) } ],
                            "policy": allow_all() });
            let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&t));
            assert_eq!(s, 201, "{v}");
            let (s, v) = admin(&d, "DELETE", &format!("/v1/tenants/{id}"), None);
            assert_eq!(s, 204, "{v}");
        }
        t0.elapsed()
    });
    let quiet = gaps::sample_gaps(&base, ADMIN, &running, || {
        std::thread::sleep(churn.took);
        churn.took
    });
    let bound =
        2 * quiet.worst + 2 * churn.worst_poll.max(quiet.worst_poll) + Duration::from_millis(50);
    println!("during 1,000 admissions and removals: {churn:?}; quiet: {quiet:?}; bound {bound:?}");
    assert!(churn.samples > 10, "{churn:?}");
    assert!(
        churn.worst <= bound,
        "a running tenant's traffic paused for {:?} during the admissions (quiet: {:?}, bound {bound:?})",
        churn.worst,
        quiet.worst
    );
    d.stop().unwrap();
}

/// More tenants than the Tenant Table's slots, a region larger than the whole arena (the
/// firewall's is 4.5 MB), and an arena that cannot hold another region: each a 409
/// naming the limit, nothing changed, the admitted tenants still served.
#[test]
fn capacity_limits_are_a_4xx_naming_the_limit_and_change_nothing() {
    for (slots, arena_mib, needle, want) in [
        (3u32, 64u64, "all 3 slots are in use", Some(3)),
        (64, 1, "exceeds the largest possible region", Some(0)),
        (64, 16, "arena exhausted", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), "");
        cfg.dataplane.tenant_slots = slots;
        cfg.dataplane.arena_mib = arena_mib;
        let d = Daemon::start(cfg, Path::new("test.toml")).unwrap();
        let mut admitted = 0u32;
        let refusal = loop {
            let id = admitted + 1;
            let (s, v) = admin(
                &d,
                "POST",
                "/v1/tenants",
                Some(&tenant(id, admitted, allow_all())),
            );
            if s != 201 {
                break (id, s, v);
            }
            admitted += 1;
            assert!(admitted <= slots, "admitted past {slots} slots");
        };
        let (id, s, v) = refusal;
        match want {
            Some(n) => assert_eq!(admitted, n, "{v}"),
            None => assert!(admitted >= 1, "{v}"),
        }
        assert_eq!(s, 409, "tenant {id}: {v}");
        let msg = v["error"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        let listed: Vec<u64> = ids(&d);
        assert_eq!(listed, (1..=u64::from(admitted)).collect::<Vec<_>>());
        // The admitted tenants' traffic still flows (generator tenants 0..4).
        if admitted >= 1 {
            let n = packets(&d, 1);
            wait_for_packets(&d, 1, n);
        }
        d.stop().unwrap();
    }
}
