//! The soak run: traffic as fast as the machine takes it for N seconds while tenants are
//! admitted and removed throughout, checking that nothing leaks and nothing is lost.
//!
//! ```text
//! cargo run --release --example soak -- [--seconds 600] [--max-rss-growth 10]
//!                                       [--workers 2] [--tenants 32] [--churn-ms 50]
//! ```
//!
//! `scripts/soak.sh` runs it. Every interval it prints the rate, the resident set, the
//! threads of the process and the Memory Manager's regions. It fails (exit status 1) when:
//!
//! * a tenant's packets do not add up: checked for every tenant before it is removed and
//!   for every tenant at each interval (sent = received by its NF + counted drops);
//! * frames for no tenant do not add up (sent = counted as unmatched);
//! * the resident set grew by more than `--max-rss-growth` percent after the warm-up
//!   (the first fifth of the run, at least 5 s);
//! * regions leak: after the last removal only the anchor tenants (never removed, two
//!   per worker) hold regions, as many as they held once admitted;
//! * threads leak: the process ends with the threads it had once the pipeline started;
//! * a tenant faulted or a worker was found dead or stuck (none is expected).
//!
//! Protection keys are not exercised: the run uses the type-system isolation level, which
//! needs none (MPK runs only where the CPU has `pku`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use buffet::dispatch::{DispatcherConfig, Match, SchedulerConfig};
use buffet::nfs::monitor::{Monitor, MonitorPolicy};
use buffet::sdk::TenantId;
use buffet::worker::{Pipeline, PipelineConfig, Report, TenantSpec};

struct Args {
    seconds: u64,
    max_rss_growth: f64,
    workers: u16,
    tenants: u32,
    churn: Duration,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 600,
        max_rss_growth: 10.0,
        workers: 2,
        tenants: 32,
        churn: Duration::from_millis(50),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| usage(&k));
        match k.as_str() {
            "--seconds" => a.seconds = v.parse().unwrap_or_else(|_| usage(&k)),
            "--max-rss-growth" => a.max_rss_growth = v.parse().unwrap_or_else(|_| usage(&k)),
            "--workers" => a.workers = v.parse().unwrap_or_else(|_| usage(&k)),
            "--tenants" => a.tenants = v.parse().unwrap_or_else(|_| usage(&k)),
            "--churn-ms" => {
                a.churn = Duration::from_millis(v.parse().unwrap_or_else(|_| usage(&k)))
            }
            _ => usage(&k),
        }
    }
    a
}

fn usage(k: &str) -> ! {
    eprintln!(
        "soak: bad argument {k}\nusage: soak [--seconds N] [--max-rss-growth PCT] \
         [--workers N] [--tenants N] [--churn-ms MS]"
    );
    std::process::exit(2)
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Tenant `id`'s frames go to 10.(id >> 8).(id & 255).1; a few sizes.
fn frames(id: u32) -> Vec<Vec<u8>> {
    [18usize, 200, 900]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut v = Vec::new();
            etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
                .ipv4(
                    [192, 168, 0, i as u8],
                    [10, (id >> 8) as u8, id as u8, 1],
                    64,
                )
                .udp(1000 + i as u16, 53)
                .write(&mut v, &vec![0x5a; len])
                .expect("frame");
            v
        })
        .collect()
}

fn spec(id: u32) -> TenantSpec<MonitorPolicy> {
    TenantSpec {
        id: TenantId(id),
        name: format!("t{id}"),
        rules: vec![(
            100,
            Match {
                dst_ip: Some(
                    format!("10.{}.{}.0/24", id >> 8, id & 255)
                        .parse()
                        .expect("prefix"),
                ),
                ..Match::default()
            },
        )],
        max_nb: 0,
        policy: MonitorPolicy::default(),
    }
}

/// Checks a tenant's row against what was sent to it; the message on a mismatch.
fn check(r: &Report, id: u32, sent: u64) -> Result<(), String> {
    let Some(t) = r.tenants.iter().find(|t| t.id == TenantId(id)) else {
        return Err(format!("tenant {id} missing from the report"));
    };
    if t.packets != sent || t.passed + t.dropped() != t.packets {
        return Err(format!(
            "tenant {id}: sent {sent}, received {}, passed {}, drops {:?}",
            t.packets, t.passed, t.drops
        ));
    }
    Ok(())
}

fn main() {
    let a = args();
    let cfg = PipelineConfig {
        workers: a.workers,
        pin: false,
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: 30,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = Pipeline::new(Monitor::default(), cfg).expect("pipeline");
    let base_threads = threads();
    // Anchors: never removed, two per worker (placement spreads them over every worker).
    let anchors: Vec<u32> = (1..=u32::from(a.workers) * 2).collect();
    let mut next_id = anchors.len() as u32 + 1;
    let mut active: Vec<u32> = anchors.clone();
    let mut anchor_regions = 0;
    while active.len() < a.tenants as usize {
        active.push(next_id);
        next_id += 1;
    }
    for &t in &active {
        p.admit(spec(t)).expect("admit");
        if anchors.last() == Some(&t) {
            // What the anchors hold (a state may take more than one region: a packed
            // state and its untyped bytes apart), before any other tenant is admitted.
            anchor_regions = p.control().memory_stats().regions;
        }
    }
    let mut sent: BTreeMap<u32, u64> = BTreeMap::new();
    let mut cache: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    let stranger = frames(0xffff);
    let mut unmatched_sent = 0u64;
    let (mut admitted, mut removed) = (active.len() as u64, 0u64);
    let mut failures: Vec<String> = Vec::new();

    let start = Instant::now();
    let total = Duration::from_secs(a.seconds);
    let warmup = (total / 5).max(Duration::from_secs(5)).min(total);
    let interval = (total / 10).clamp(Duration::from_secs(1), Duration::from_secs(30));
    let mut next_print = start + interval;
    let mut next_churn = start + a.churn;
    let mut rss_after_warmup: Option<u64> = None;
    let mut rss_max = 0u64;
    let mut pushed = 0u64;
    let mut last = (start, 0u64);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    println!(
        "soak: {} s, {} workers, {} tenants (churn every {:?}), warm-up {:?}, max RSS growth {}%",
        a.seconds, a.workers, a.tenants, a.churn, warmup, a.max_rss_growth
    );
    println!(
        "{:>7} {:>12} {:>10} {:>8} {:>8} {:>9} {:>9}",
        "t (s)", "packets/s", "RSS (KiB)", "threads", "regions", "admitted", "removed"
    );
    let mut ts = 0u64;
    while start.elapsed() < total {
        // A round: one frame of every active tenant, and one for no tenant.
        for (k, &t) in active.iter().enumerate() {
            let f = cache.entry(t).or_insert_with(|| frames(t));
            p.push(ts, 0, &f[(pushed as usize + k) % f.len()]);
            *sent.entry(t).or_default() += 1;
            pushed += 1;
        }
        p.push(ts, 0, &stranger[0]);
        unmatched_sent += 1;
        pushed += 1;
        ts += 1_000;
        let now = Instant::now();
        if now >= next_churn {
            next_churn = now + a.churn;
            // Remove one non-anchor tenant, checked first, and admit a new one.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let churnable = active.len() - anchors.len();
            if churnable > 0 {
                let i = anchors.len() + (rng as usize % churnable);
                let gone = active.swap_remove(i);
                p.flush();
                let r = p.report();
                if let Err(e) = check(&r, gone, sent.get(&gone).copied().unwrap_or(0)) {
                    failures.push(e);
                }
                p.remove(TenantId(gone)).expect("remove");
                sent.remove(&gone);
                cache.remove(&gone);
                removed += 1;
            }
            p.admit(spec(next_id)).expect("admit");
            active.push(next_id);
            next_id += 1;
            admitted += 1;
        }
        if now >= next_print {
            next_print = now + interval;
            p.flush();
            let r = p.report();
            for &t in &active {
                if let Err(e) = check(&r, t, sent.get(&t).copied().unwrap_or(0)) {
                    failures.push(e);
                }
            }
            let rss = rss_bytes();
            if now.duration_since(start) >= warmup {
                if rss_after_warmup.is_none() {
                    rss_after_warmup = Some(rss);
                }
                rss_max = rss_max.max(rss);
            }
            let rate = (pushed - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
            last = (now, pushed);
            println!(
                "{:>7.1} {:>12.0} {:>10} {:>8} {:>8} {:>9} {:>9}",
                now.duration_since(start).as_secs_f64(),
                rate,
                rss / 1024,
                threads(),
                p.control().memory_stats().regions,
                admitted,
                removed
            );
        }
    }
    let elapsed = start.elapsed();
    // Remove every churned tenant; traffic for the anchors makes every worker let go of
    // the states it cached.
    p.flush();
    let r = p.report();
    for &t in &active {
        if let Err(e) = check(&r, t, sent.get(&t).copied().unwrap_or(0)) {
            failures.push(e);
        }
    }
    if r.global.unmatched != unmatched_sent {
        failures.push(format!(
            "frames for no tenant: sent {unmatched_sent}, counted unmatched {}",
            r.global.unmatched
        ));
    }
    for &t in &active[anchors.len()..] {
        p.remove(TenantId(t)).expect("remove");
    }
    for round in 0..64u64 {
        for &t in &anchors {
            let f = cache.entry(t).or_insert_with(|| frames(t));
            p.push(ts + round, 0, &f[0]);
        }
    }
    p.flush();
    let regions = p.control().memory_stats().regions;
    let end_threads = threads();
    let rss_end = rss_bytes();
    rss_max = rss_max.max(rss_end);
    let report = p.finish();
    let total_packets: u64 = report.tenants.iter().map(|t| t.packets).sum();
    println!(
        "soak: {pushed} frames in {:.1} s ({:.0} packets/s), {admitted} tenants admitted, \
         {removed} removed",
        elapsed.as_secs_f64(),
        pushed as f64 / elapsed.as_secs_f64()
    );
    let base = rss_after_warmup.unwrap_or(rss_end);
    let growth = 100.0 * (rss_max as f64 - base as f64) / base as f64;
    println!(
        "soak: RSS after warm-up {} KiB, highest after {} KiB, at the end {} KiB: growth {growth:.1}% \
         (limit {}%)",
        base / 1024,
        rss_max / 1024,
        rss_end / 1024,
        a.max_rss_growth
    );
    println!(
        "soak: regions at the end {regions} (the {} anchors held {anchor_regions} when admitted), \
         threads {end_threads} (at start {base_threads}), anchors' packets {total_packets}",
        anchors.len()
    );
    let supervision: Vec<_> = report
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                buffet::worker::WorkerEvent::WorkerDied { .. }
                    | buffet::worker::WorkerEvent::WorkerStuck { .. }
                    | buffet::worker::WorkerEvent::Fault { .. }
            )
        })
        .collect();
    if !supervision.is_empty() {
        failures.push(format!("faults or lost workers: {supervision:?}"));
    }
    if growth > a.max_rss_growth {
        failures.push(format!(
            "RSS grew {growth:.1}% after the warm-up (limit {}%)",
            a.max_rss_growth
        ));
    }
    if regions != anchor_regions {
        failures.push(format!(
            "{regions} regions in use after removing every tenant but the {} anchors, which \
             held {anchor_regions} when admitted",
            anchors.len()
        ));
    }
    if end_threads != base_threads {
        failures.push(format!(
            "{end_threads} threads at the end, {base_threads} at the start"
        ));
    }
    if failures.is_empty() {
        println!("soak: OK");
    } else {
        for f in failures.iter().take(20) {
            eprintln!("soak: FAIL: {f}");
        }
        std::process::exit(1);
    }
}
