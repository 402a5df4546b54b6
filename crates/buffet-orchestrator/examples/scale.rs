//! Placement at scale: 100 simulated servers and 10,000 tenants against one Orchestrator
//! (in-process, its real HTTP API) and a local etcd. Each simulated server is a light
//! in-process client of the same etcd doing exactly an Agent's etcd work — registration
//! under a lease kept alive, a watch on its placements, a `live` status per placement,
//! written only while the placement is current — without a data plane. Prints placement
//! throughput, latency and the etcd writes (revisions) per tenant.
//!
//! `cargo run --release -p buffet-orchestrator --example scale` (environment:
//! `SERVERS`, `TENANTS`, `CLIENTS`; needs the `etcd` binary).

use std::time::{Duration, Instant};

use buffet_orchestrator::local_etcd::LocalEtcd;
use buffet_orchestrator::schema::{self, ServerLoad, State, Status};
use buffet_orchestrator::{lease, Config, Orchestrator, Token};

/// The API's admin token for this run.
const ADMIN: &str = "scale-example-admin-token";
use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, TxnOp, WatchOptions};
use serde_json::json;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn sim_server(mut c: Client, id: String) -> anyhow::Result<()> {
    let asked = tokio::time::Instant::now();
    let lease_id = c.lease_grant(30, None).await?.id();
    let load = ServerLoad {
        server: id.clone(),
        slot_ns: 1 << 30,
        worker_max_nb: 1_000_000,
        live_workers: 8,
        max_workers: 8,
        tenant_slots: 1024,
        ..ServerLoad::default()
    };
    c.put(
        schema::server_key(&id),
        serde_json::to_vec(&load)?,
        Some(PutOptions::new().with_lease(lease_id)),
    )
    .await?;
    let (_held, _keeper) = lease::hold(c.clone(), lease_id, Duration::from_secs(30), asked);
    let mut w = c
        .watch(
            schema::placements_of(&id),
            Some(WatchOptions::new().with_prefix()),
        )
        .await?;
    while let Some(resp) = w.message().await? {
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            if ev.event_type() != EventType::Put {
                continue;
            }
            let Some(t) = schema::tenant_of(kv.key(), schema::PLACEMENTS) else {
                continue;
            };
            let st = Status {
                server: id.clone(),
                state: State::Live,
                placement_rev: kv.mod_revision(),
                reason: None,
                code: None,
                update: false,
            };
            c.txn(
                etcd_client::Txn::new()
                    .when(vec![Compare::mod_revision(
                        kv.key(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )])
                    .and_then(vec![TxnOp::put(
                        schema::status_key(t),
                        serde_json::to_vec(&st)?,
                        None,
                    )]),
            )
            .await?;
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let servers = env_or("SERVERS", 100);
    let tenants = env_or("TENANTS", 10_000) as u32;
    let clients = env_or("CLIENTS", 32) as u32;
    let etcd = LocalEtcd::start()?;
    let url = etcd.url();
    let client = lease::connect(std::slice::from_ref(&url), Duration::from_secs(5)).await?;
    let mut sims = Vec::new();
    for s in 0..servers {
        let c = client.clone();
        sims.push(tokio::spawn(async move {
            if let Err(e) = sim_server(c, format!("sim{s}")).await {
                eprintln!("sim{s}: {e}");
            }
        }));
    }
    let orch = Orchestrator::start(Config::new(
        vec![url],
        "127.0.0.1:0".parse()?,
        Token::new(ADMIN.into()),
    ))
    .await?;
    let api = format!("http://{}", orch.addr());
    let t0 = Instant::now();
    while !orch.is_leader() {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(20), "no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = api.clone();
    tokio::task::spawn_blocking(move || loop {
        let v: serde_json::Value = ureq::get(&format!("{a}/v1/servers"))
            .set("Authorization", &format!("Bearer {ADMIN}"))
            .call()
            .ok()
            .and_then(|r| r.into_json().ok())
            .unwrap_or_default();
        if v["servers"].as_array().map_or(0, Vec::len) == servers {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rev0 = client
        .clone()
        .get("/", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    let t0 = Instant::now();
    let mut hs = Vec::new();
    for k in 0..clients {
        let api = api.clone();
        hs.push(tokio::task::spawn_blocking(move || {
            let mut lat = Vec::new();
            for i in (1..=tenants).filter(|i| i % clients == k) {
                let body = json!({
                    "id": i,
                    "rules": [{ "dst_ip": format!("10.{}.{}.0/24", i / 256, i % 256) }],
                    "policy": {},
                    "expected_pps": 100,
                });
                let t = Instant::now();
                let r = ureq::post(&format!("{api}/v1/tenants"))
                    .set("Authorization", &format!("Bearer {ADMIN}"))
                    .send_json(body);
                assert!(r.is_ok(), "tenant {i}: {r:?}");
                lat.push(t.elapsed().as_secs_f64() * 1e3);
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for h in hs {
        lat.extend(h.await?);
    }
    let secs = t0.elapsed().as_secs_f64();
    let rev1 = client
        .clone()
        .get("/", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    lat.sort_by(f64::total_cmp);
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    println!(
        "{servers} servers, {tenants} tenants, {clients} clients: {:.0} placements/s \
         ({secs:.1} s); API call to live p50 {:.1} ms, p99 {:.1} ms; etcd writes {} \
         ({:.2} per tenant: the leader's placement transaction and the server's status)",
        f64::from(tenants) / secs,
        p(0.5),
        p(0.99),
        rev1 - rev0,
        (rev1 - rev0) as f64 / f64::from(tenants),
    );
    orch.stop().await;
    for s in sims {
        s.abort();
    }
    Ok(())
}
