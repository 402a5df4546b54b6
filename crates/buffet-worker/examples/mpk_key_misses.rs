//! Counts the MPK key cache's misses per 1,000 packets under the demo's traffic shape.
//!
//! `buffet demo`'s traffic (the seeded generator of `buffet_io::gen`: log-normal tenant
//! weights, staggered ON/OFF rates, data-centre flow sizes; seed 7, 2 virtual seconds at
//! 400,000 packets/s) runs through a Worker Pool of 2 workers in the MPK domain, the
//! Monitor NF in every tenant's region, once per tenant count given on the command line
//! (default: 100 and 1,000). Each line gives the packets the NF handled and the key
//! cache's hits and misses while the traffic ran (admission and the final report, which
//! locks every tenant once, excluded), and misses per 1,000 packets.
//!
//! Unlike the demo, no worker has a MAX_NB (no migrations) and no tenant is policed, and
//! the timeslot is 2^36 ns rather than 2^24: without a MAX_NB the timeslot decides no
//! placement, and the Worker Pool's stall bound (half a timeslot, at least 0.5 s; 34 s
//! here) then does not take a worker for stuck when it runs slowly (emulated, as below,
//! on a loaded host: at 2^33 ns, 4.3 s, two 1,000-tenant runs were cut short so).
//!
//! Needs a CPU with protection keys (or `scripts/mpk-vm.sh run -- …`, the emulated one:
//! the counts are the same, any time it reports is not). It reports counts only: the
//! wall-clock cost of a miss is measured by `cargo bench --bench isolation`.
//!
//! ```text
//! cargo build --release -p buffet-worker --example mpk_key_misses
//! target/release/examples/mpk_key_misses 100 1000
//! ```

use buffet_dispatch::{DispatcherConfig, Match, SchedulerConfig};
use buffet_io::gen::tenant_dst_prefix;
use buffet_io::PacketSource;
use buffet_memory::{Domain, Mpk};
use buffet_nfs::monitor::{Monitor, MonitorPolicy};
use buffet_sdk::TenantId;
use buffet_worker::{Pipeline, PipelineConfig, TenantSpec, WorkerEvent};

mod demo_traffic;
use demo_traffic::{RATE_PPS, SECONDS, SEED, WORKERS};

const SHIFT: u32 = 36;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let counts = demo_traffic::tenant_counts()?;
    let mpk = Mpk::get()?;
    println!(
        "demo traffic (seed {SEED}, {SECONDS} virtual s at {RATE_PPS} pps, timeslot 2^{SHIFT} ns), \
         {WORKERS} workers, Monitor NF, MPK domain, {} cache keys",
        mpk.cache_keys()
    );
    println!("tenants  packets  hits  misses  misses_per_1000_packets");
    for tenants in counts {
        let cfg = PipelineConfig {
            workers: WORKERS,
            pin: false,
            domain: Domain::Mpk,
            dispatcher: DispatcherConfig {
                sched: SchedulerConfig {
                    shift: SHIFT,
                    threshold: 3,
                },
                ..DispatcherConfig::default()
            },
            ..PipelineConfig::default()
        };
        let mut p = Pipeline::new(Monitor::default(), cfg)?;
        for i in 0..tenants {
            let (addr, len) = tenant_dst_prefix(i);
            p.admit(TenantSpec {
                id: TenantId(i + 1),
                name: format!("tenant-{:02}", i + 1),
                rules: vec![(
                    100,
                    Match {
                        dst_ip: Some(format!("{addr}/{len}").parse()?),
                        ..Match::default()
                    },
                )],
                max_nb: 0,
                policy: MonitorPolicy::default(),
            })?;
        }
        let mut source = demo_traffic::generator(tenants)?;
        let before = mpk.stats();
        while let Some(pkt) = source.next_packet()? {
            p.push(pkt.ts_ns, 0, pkt.data);
        }
        p.flush();
        let after = mpk.stats();
        // What went wrong, if anything does: faults, and workers found dead or stuck.
        let events: Vec<String> = p
            .events()
            .iter()
            .filter(|e| !matches!(e, WorkerEvent::Migration { .. }))
            .map(|e| format!("{e:?}"))
            .collect();
        let report = p.finish();
        let lost = report.global.no_live_worker + report.global.unmatched + report.global.ring_full;
        if lost != 0 || report.tenants.iter().any(|t| t.quarantined) {
            return Err(format!(
                "{tenants} tenants: {lost} packets lost; events {events:?}; {:?}",
                report.global
            )
            .into());
        }
        let packets: u64 = report.tenants.iter().map(|t| t.packets).sum();
        let (hits, misses) = (after.hits - before.hits, after.misses - before.misses);
        println!(
            "{tenants}  {packets}  {hits}  {misses}  {:.2}",
            misses as f64 * 1000.0 / packets.max(1) as f64
        );
    }
    Ok(())
}
