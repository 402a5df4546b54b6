//! The author's NF across a cluster: buffetd embedded with `my-nf` registered and offered,
//! in agent mode, and an Orchestrator (the stock one, which knows nothing of `my-nf`)
//! placing tenants on it through etcd. A chain naming `my-nf` is placed where it is
//! offered and runs there; one naming an NF no server offers is refused by the
//! Orchestrator, naming it. Needs an `etcd` binary (Debian's etcd-server); without it the
//! test skips, or fails under `BUFFET_REQUIRE_PRIVILEGED=1`.

use std::path::Path;
use std::time::{Duration, Instant};

use buffet::cli::Registry;
use buffet_daemon::{Daemon, DaemonConfig};
use buffet_orchestrator::local_etcd::{LocalEtcd, LocalEtcdError};
use buffet_orchestrator::{Config, Orchestrator, Token};
use my_nf::MyNf;
use serde_json::{json, Value};

mod common;
use common::{config_text, ADMIN};

const ORCH: &str = "orchestrator-token-for-my-nf-0123456789";

/// buffetd in agent mode, server `mine`, on the etcd at `etcd`.
fn cluster_table(etcd: &str) -> String {
    format!(
        "[cluster]\netcd = [\"{etcd}\"]\nserver_id = \"mine\"\nlease_ttl_s = 6\n\
         report_interval_ms = 200\n"
    )
}

fn call(url: &str, method: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
    let body = body.map(Value::to_string);
    buffet_testkit::http::try_json(
        method,
        url,
        Some(token),
        body.as_deref(),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|| panic!("{method} {url}: no answer"))
}

/// Waits until `cond` holds, polling every 100 ms; panics with `what` after 30 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_orchestrator_places_a_chain_naming_the_authors_nf_where_it_is_offered() {
    let test = "the_orchestrator_places_a_chain_naming_the_authors_nf_where_it_is_offered";
    let Some(etcd) =
        buffet_testkit::gate::started_or_skip(test, LocalEtcd::start(), LocalEtcdError::is_missing)
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut nfs = Registry::new();
    nfs.add::<MyNf>("my-nf");
    let path = Path::new("my-nfd.toml");
    let text = config_text(dir.path(), &cluster_table(&etcd.url()));
    let cfg = DaemonConfig::parse_registered(path, &text, &nfs.registered_names()).unwrap();
    let d = Daemon::start_registered(cfg, path, nfs).unwrap();
    let server = format!("http://{}", d.addr());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = Config::new(
        vec![etcd.url()],
        "127.0.0.1:0".parse().unwrap(),
        Token::new(ORCH.to_owned()),
    );
    let o = rt.block_on(Orchestrator::start(cfg)).unwrap();
    let orch = format!("http://{}", o.addr());
    wait_for("the Orchestrator never led", || {
        let (s, v) = call(&format!("{orch}/v1/leader"), "GET", ORCH, None);
        s == 200 && v["is_leader"] == true
    });
    wait_for("the server never registered offering my-nf", || {
        let (s, v) = call(&format!("{orch}/v1/servers"), "GET", ORCH, None);
        s == 200 && v["servers"][0]["offered"] == json!(["firewall", "my-nf"])
    });

    // Through the Orchestrator: placed on the server that offers my-nf, and live there.
    let chain = json!([
        { "nf": "firewall", "policy": { "default": "allow" } },
        { "nf": "my-nf", "policy": { "block_udp_ports": [53, 123, 443, 4789, 5060] } },
    ]);
    let doc = json!({ "id": 1, "rules": [ { "dst_ip": "10.0.0.0/24" } ], "chain": chain });
    let (s, v) = call(&format!("{orch}/v1/tenants"), "POST", ORCH, Some(&doc));
    assert_eq!((s, &v["server"]), (201, &json!("mine")), "{v}");
    // The server runs it: my-nf blocks the generator's UDP for tenant 1.
    wait_for("my-nf never blocked a packet of tenant 1", || {
        let (s, st) = call(&format!("{server}/v1/tenants/1/stats"), "GET", ADMIN, None);
        s == 200
            && st["chain"][1]["nf"] == "my-nf"
            && st["chain"][1]["counters"]["blocked"].as_u64().unwrap_or(0) > 0
    });

    // An NF no server offers: refused by the Orchestrator, naming it; nothing placed.
    let mut bad = doc.clone();
    bad["id"] = json!(2);
    bad["rules"][0]["dst_ip"] = json!("10.0.1.0/24");
    bad["chain"][1]["nf"] = json!("their-nf");
    let (s, v) = call(&format!("{orch}/v1/tenants"), "POST", ORCH, Some(&bad));
    assert_eq!(s, 422, "{v}");
    assert_eq!(
        v["error"], "chain: no server offers the NF \"their-nf\" (mine offers firewall, my-nf)",
        "{v}"
    );
    let (s, v) = call(&format!("{orch}/v1/tenants"), "GET", ORCH, None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["tenant"].as_array().map(Vec::len), Some(1), "{v}");

    rt.block_on(o.stop());
    d.stop().unwrap();
}
