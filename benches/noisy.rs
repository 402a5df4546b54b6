//! `noisy`: the well-behaved tenants' throughput and latency alone and beside noisy
//! neighbours, in the same process (docs/robustness.md, "Noisy neighbours").
//!
//! The run is `tests/common/noisy.rs`: 8 tenants on 2 workers as one-stage chains of a
//! tenants file; 5 well-behaved (monitor, firewall; 2,000 packets/s each), one flooding
//! at 10× its MAX_NB, one running the IDS with 1,024 signatures (its registered maximum) over 1,400-byte payloads,
//! one running a verified eBPF program (JIT) at its cost budget. A live port offers the
//! load at fixed rates and measures each packet's latency from when it was due to when it
//! was sent back out. Per round, two runs of the same configuration: **alone** (only the
//! well-behaved tenants send) and **crowd** (all do). Reported per arm: the well-behaved
//! tenants' packets passed per second, the least of their per-tenant passed ratios
//! crowd/alone, and their latency p50/p99.
//!
//! Run: `cargo bench --bench noisy` (about 20 s: 3 rounds of 2 × 3 s). Environment:
//! `BUFFET_NOISY_SECS` (offered seconds per run, default 3), `BUFFET_NOISY_ROUNDS`
//! (default 3), `BUFFET_NOISY_CSV` (a file for the CSV lines). `-- --test` is the smoke
//! mode CI runs (one round of 0.2 s). Needs clang for the eBPF program; without it the
//! bench says so and exits.

#[path = "../tests/common/noisy.rs"]
mod noisy;
// Only `env_or` is used here.
#[allow(dead_code)]
#[path = "common/report.rs"]
mod report;

use std::io::Write;

use noisy::WELL;

fn main() {
    let test = std::env::args().any(|a| a == "--test");
    let (secs, rounds) = if test {
        (0.2, 1)
    } else {
        (
            report::env_or("BUFFET_NOISY_SECS", 3.0f64),
            report::env_or("BUFFET_NOISY_ROUNDS", 3usize),
        )
    };
    let setup = match noisy::setup() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("noisy: skipped: the eBPF program does not build: {e} (install clang)");
            return;
        }
    };
    let mut csv = std::env::var("BUFFET_NOISY_CSV")
        .ok()
        .map(|p| std::fs::File::create(p).expect("BUFFET_NOISY_CSV"));
    let header = "round,arm,well_kpps,min_ratio,p50_us,p99_us,ebpf_cost,ebpf_budget";
    if let Some(f) = csv.as_mut() {
        writeln!(f, "{header}").unwrap();
    }
    println!(
        "noisy: {} s offered per run, {rounds} rounds; eBPF tenant's packet costs {} units, \
         its budget is {}",
        secs, setup.ebpf_cost, setup.ebpf_budget
    );
    println!(
        "{:>5} {:>6} {:>10} {:>10} {:>9} {:>9}",
        "round", "arm", "well kpps", "min ratio", "p50 µs", "p99 µs"
    );
    for round in 1..=rounds {
        let alone = noisy::run(&setup, false, secs);
        let crowd = noisy::run(&setup, true, secs);
        let min_ratio = WELL
            .iter()
            .map(|&t| crowd.passed(t) as f64 / alone.passed(t).max(1) as f64)
            .fold(f64::INFINITY, f64::min);
        for (arm, o, ratio) in [("alone", &alone, 1.0), ("crowd", &crowd, min_ratio)] {
            let kpps = WELL.iter().map(|&t| o.passed(t)).sum::<u64>() as f64 / secs / 1e3;
            let (p50, p99) = (o.latency_us(&WELL, 0.5), o.latency_us(&WELL, 0.99));
            println!("{round:>5} {arm:>6} {kpps:>10.2} {ratio:>10.3} {p50:>9.0} {p99:>9.0}");
            if let Some(f) = csv.as_mut() {
                writeln!(
                    f,
                    "{round},{arm},{kpps:.2},{ratio:.3},{p50:.0},{p99:.0},{},{}",
                    setup.ebpf_cost, setup.ebpf_budget
                )
                .unwrap();
            }
        }
        let policed = crowd
            .tenant(noisy::FLOOD)
            .drops
            .get("policed")
            .copied()
            .unwrap_or(0);
        println!(
            "      crowd: flooder {} of {} policed; cycles/packet IDS {:.0}, eBPF {:.0}, \
             well-behaved {:.0}",
            policed,
            crowd.offered[&noisy::FLOOD],
            crowd.cycles_per_packet(noisy::IDS),
            crowd.cycles_per_packet(noisy::EBPF),
            crowd.cycles_per_packet(WELL[0]),
        );
    }
}
