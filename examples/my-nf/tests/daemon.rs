//! buffetd embedded in the author's program, with `my-nf` registered in the same
//! registry the `buffet` command uses: `nf.offered` names it beside a reference NF, a
//! tenant admitted through the HTTP API runs the chain firewall -> my-nf on the
//! generator's traffic, and its stats show both stages' counters. A chain naming an NF
//! that is not registered, or registered but not offered, is a 422 naming `chain[i].nf`.

use std::path::Path;
use std::time::{Duration, Instant};

use buffet::cli::Registry;
use buffet_daemon::{Daemon, DaemonConfig};
use my_nf::MyNf;
use serde_json::{json, Value};

mod common;
use common::{config_text, ADMIN};

fn admin(d: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let timeout = Duration::from_secs(20);
    buffet_testkit::http::api(d.addr(), method, path, Some(ADMIN), body, timeout)
}

/// Tenant `id` on the generator's tenant `id - 1` (10.0.<id - 1>.0/24), with `chain`.
fn tenant(id: u32, chain: Value) -> Value {
    json!({ "id": id, "rules": [ { "dst_ip": format!("10.0.{}.0/24", id - 1) } ], "chain": chain })
}

fn ids(d: &Daemon) -> Vec<u64> {
    let (s, v) = admin(d, "GET", "/v1/tenants", None);
    assert_eq!(s, 200, "{v}");
    v["tenant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn an_embedded_daemon_runs_the_authors_nf_as_a_named_chain_stage() {
    let dir = tempfile::tempdir().unwrap();
    let mut nfs = Registry::new();
    nfs.add::<MyNf>("my-nf").add::<MyNf>("my-other-nf");
    assert!(nfs.errors().is_empty(), "{:?}", nfs.errors());
    let text = config_text(dir.path(), "");
    let path = Path::new("my-nfd.toml");
    // Read without the program's names, `nf.offered` names an unknown NF.
    let e = DaemonConfig::parse(path, &text).unwrap_err().to_string();
    assert!(
        e.starts_with("my-nfd.toml: nf.offered[1]: unknown NF \"my-nf\""),
        "{e}"
    );
    let cfg = DaemonConfig::parse_registered(path, &text, &nfs.registered_names()).unwrap();
    let d = Daemon::start_registered(cfg, path, nfs).unwrap();

    // The provider's firewall, then the author's NF blocking every UDP port the
    // generator sends to: my-nf drops each UDP packet the firewall passed.
    let chain = json!([
        { "nf": "firewall", "policy": { "default": "allow" } },
        { "nf": "my-nf", "policy": { "block_udp_ports": [53, 123, 443, 4789, 5060] } },
    ]);
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(1, chain.clone())));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["chain"][1]["nf"], "my-nf", "{v}");

    // Not registered: 422 naming the stage's field; nothing admitted.
    let mut bad = chain.clone();
    bad[1]["nf"] = json!("their-nf");
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(2, bad)));
    assert_eq!(s, 422, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("chain[1].nf") && msg.contains("unknown NF \"their-nf\""),
        "{msg}"
    );
    // Registered by the program but not offered by the config: 422 as well.
    let mut bad = chain.clone();
    bad[0]["nf"] = json!("my-other-nf");
    let (s, v) = admin(&d, "POST", "/v1/tenants", Some(&tenant(2, bad)));
    assert_eq!(s, 422, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("chain[0].nf") && msg.contains("my-other-nf is not offered"),
        "{msg}"
    );
    assert_eq!(ids(&d), vec![1]);

    // Traffic: wait until my-nf has blocked UDP packets, then read one snapshot.
    let t0 = Instant::now();
    let st = loop {
        let (s, st) = admin(&d, "GET", "/v1/tenants/1/stats", None);
        assert_eq!(s, 200, "{st}");
        let blocked = st["chain"][1]["counters"]["blocked"].as_u64().unwrap_or(0);
        let passed = st["chain"][1]["passed"].as_u64().unwrap_or(0);
        if blocked > 0 && passed > 0 {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{st}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stages = st["chain"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{st}");
    let (fw, mine) = (&stages[0], &stages[1]);
    assert_eq!((&fw["stage"], &fw["nf"]), (&json!(0), &json!("firewall")));
    assert_eq!((&mine["stage"], &mine["nf"]), (&json!(1), &json!("my-nf")));
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    // Everything the firewall passed reached my-nf, which counted each one itself.
    assert_eq!(n(&fw["passed"]), n(&fw["packets"]), "{st}");
    assert_eq!(n(&mine["packets"]), n(&fw["passed"]), "{st}");
    assert_eq!(n(&mine["counters"]["packets"]), n(&mine["packets"]), "{st}");
    // Its drops are its blocked UDP, all of the UDP it saw, counted at its stage.
    assert_eq!(
        n(&mine["drops"]["policy"]),
        n(&mine["counters"]["blocked"]),
        "{st}"
    );
    assert_eq!(
        n(&mine["counters"]["udp"]),
        n(&mine["counters"]["blocked"]),
        "{st}"
    );
    assert_eq!(
        n(&mine["passed"]) + n(&mine["drops"]["policy"]),
        n(&mine["packets"]),
        "{st}"
    );
    d.stop().unwrap();
}
