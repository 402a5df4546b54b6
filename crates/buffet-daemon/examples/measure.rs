//! buffetd's control plane under load, measured against a running daemon (in-process,
//! real HTTP on loopback, the generator's traffic flowing to 8 tenants):
//!
//! 1. admission rate: tenants admitted per second through `POST /v1/tenants`, one
//!    request at a time, while the 8 tenants' traffic runs;
//! 2. the largest traffic gap a running tenant sees while 1,000 admissions and removals
//!    of other tenants go through the API: a sampler polls the 8 tenants' packet counters
//!    and records the longest interval in which one of them did not advance (an upper
//!    bound on the real gap, at the sampler's resolution, printed too);
//! 3. API latency at 1,000 requests/s (open loop, `GET /v1/tenants/{id}/stats`):
//!    p50, p99, max.
//!
//! `cargo run --release -p buffet-daemon --example measure` (env: `ADMISSIONS`,
//! `CHURN`, `API_SECONDS`, `RATE_PPS`).

use std::path::Path;
use std::time::{Duration, Instant};

use buffet_daemon::{Daemon, DaemonConfig};
use serde_json::{json, Value};

#[path = "../tests/common/gaps.rs"]
mod gaps;

const ADMIN: &str = "admin-token-for-measurements-01234";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn call(agent: &ureq::Agent, base: &str, method: &str, path: &str, body: Option<Value>) -> u16 {
    let req = agent
        .request(method, &format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {ADMIN}"));
    let res = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    match res {
        Ok(r) => {
            let s = r.status();
            let _ = r.into_string();
            s
        }
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// The 8 running tenants.
const RUNNING: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn packets(agent: &ureq::Agent, base: &str) -> Vec<u64> {
    gaps::packets(agent, base, ADMIN, &RUNNING)
}

/// Tenant `id` (>= 100) on a prefix no generated packet goes to.
fn other(id: u32) -> Value {
    json!({ "id": id, "rules": [ { "dst_ip": format!("10.{}.{}.0/24", 100 + id / 256, id % 256) } ],
            "policy": { "default": "allow" } })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let admissions = env_or("ADMISSIONS", 500) as u32;
    let churn = env_or("CHURN", 1000) as u32;
    let api_seconds = env_or("API_SECONDS", 5);
    let rate = env_or("RATE_PPS", 80_000);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), ADMIN).unwrap();
    let text = format!(
        "data_dir = \"{d}/data\"\n[api]\nlisten = \"127.0.0.1:0\"\nadmin_token_file = \"{d}/admin.token\"\n\
         [nf]\nname = \"firewall\"\n[dataplane]\nworkers = 2\nmax_workers = 2\ntenant_slots = 4096\narena_mib = 16384\n\
         [[port]]\nkind = \"generator\"\ntenants = 8\nrate_pps = {rate}\npeak_factor = 1.0\n",
        d = dir.path().display()
    );
    let cfg = DaemonConfig::parse(Path::new("measure.toml"), &text).unwrap();
    let d = Daemon::start(cfg, Path::new("measure.toml")).unwrap();
    let base = format!("http://{}", d.addr());
    let agent = ureq::AgentBuilder::new().build();
    for i in 0..8u32 {
        let t = json!({ "id": i + 1, "rules": [ { "dst_ip": format!("10.0.{i}.0/24") } ],
                        "policy": { "default": "allow" } });
        assert_eq!(call(&agent, &base, "POST", "/v1/tenants", Some(t)), 201);
    }
    std::thread::sleep(Duration::from_millis(500));
    let p0 = packets(&agent, &base);
    assert!(p0.iter().all(|&p| p > 0), "traffic does not flow: {p0:?}");
    println!(
        "buffetd measurements: firewall NF, 2 workers, 8 running tenants, generator {rate} pps"
    );

    // 1. Admission rate.
    let t0 = Instant::now();
    for k in 0..admissions {
        assert_eq!(
            call(&agent, &base, "POST", "/v1/tenants", Some(other(100 + k))),
            201
        );
    }
    let took = t0.elapsed();
    println!(
        "admission rate: {admissions} admissions in {:.3} s = {:.0} tenants/s (mean {:.2} ms each)",
        took.as_secs_f64(),
        f64::from(admissions) / took.as_secs_f64(),
        took.as_secs_f64() * 1e3 / f64::from(admissions)
    );
    for k in 0..admissions {
        assert_eq!(
            call(
                &agent,
                &base,
                "DELETE",
                &format!("/v1/tenants/{}", 100 + k),
                None
            ),
            204
        );
    }

    // 2. Largest traffic gap during admissions and removals of other tenants, against
    // the same sampler over the same time with no control traffic (the baseline: what
    // the sampler and this machine's scheduling alone show).
    let churn_gaps = gaps::sample_gaps(&base, ADMIN, &RUNNING, || {
        let t0 = Instant::now();
        for k in 0..churn / 2 {
            let id = 100 + (k % 256);
            assert_eq!(
                call(&agent, &base, "POST", "/v1/tenants", Some(other(id))),
                201
            );
            assert_eq!(
                call(&agent, &base, "DELETE", &format!("/v1/tenants/{id}"), None),
                204
            );
        }
        t0.elapsed()
    });
    let (gap, samples, worst_poll, churn_took) = (
        churn_gaps.worst,
        churn_gaps.samples,
        churn_gaps.worst_poll,
        churn_gaps.took,
    );
    let baseline = gaps::sample_gaps(&base, ADMIN, &RUNNING, || {
        std::thread::sleep(churn_took);
        churn_took
    });
    let (base_gap, base_samples, base_poll) =
        (baseline.worst, baseline.samples, baseline.worst_poll);
    println!(
        "traffic gap: {churn} admissions+removals in {:.3} s; largest interval without progress \
         of any of the 8 running tenants: {:.2} ms ({samples} samples, slowest sample {:.2} ms); \
         baseline, no admissions, same time: {:.2} ms ({base_samples} samples, slowest {:.2} ms)",
        churn_took.as_secs_f64(),
        gap.as_secs_f64() * 1e3,
        worst_poll.as_secs_f64() * 1e3,
        base_gap.as_secs_f64() * 1e3,
        base_poll.as_secs_f64() * 1e3
    );

    // 3. API latency at 1,000 requests/s, open loop over 4 client threads.
    let per_thread = 250u64;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let base = base.clone();
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                let interval = Duration::from_nanos(1_000_000_000 / per_thread);
                let start = Instant::now() + Duration::from_micros(t * 1000);
                let n = per_thread * api_seconds;
                let mut lat = Vec::with_capacity(n as usize);
                for k in 0..n {
                    let due = start + interval * k as u32;
                    if let Some(w) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(w);
                    }
                    let id = 1 + (k % 8);
                    assert_eq!(
                        call(
                            &agent,
                            &base,
                            "GET",
                            &format!("/v1/tenants/{id}/stats"),
                            None
                        ),
                        200
                    );
                    // From when it was due: a late start counts (no coordinated omission).
                    lat.push(due.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<Duration> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    lat.sort_unstable();
    println!(
        "API latency at 1000 requests/s for {api_seconds} s ({} requests, GET /v1/tenants/{{id}}/stats): \
         p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        lat.len(),
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let p1 = packets(&agent, &base);
    println!(
        "running tenants' packets during the run: {:?}",
        p1.iter().zip(&p0).map(|(a, b)| a - b).collect::<Vec<_>>()
    );
    d.stop().unwrap();
}
