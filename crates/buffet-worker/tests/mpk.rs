//! The Worker Pool with MPK isolation: Rust NFs whose tenant regions carry protection
//! keys, more tenants than keys, exact counts. Needs a CPU with `pku`: without one each
//! test is a hardware skip (`buffet_testkit::require_mpk`), a failure only under
//! `BUFFET_REQUIRE_PKU=1`; other MPK set-up errors fail under `BUFFET_REQUIRE_PRIVILEGED=1`.

use buffet_dispatch::{DispatcherConfig, SchedulerConfig};
use buffet_memory::{Domain, Mpk};
use buffet_nfs::monitor::Monitor;
use buffet_testkit::require_mpk;
use buffet_worker::{Pipeline, PipelineConfig, PipelineError};

mod common;
use common::{frame, spec};

fn cfg(workers: u16, domain: Domain) -> PipelineConfig {
    PipelineConfig {
        workers,
        pin: false,
        ring_size: 256,
        burst: 64,
        domain,
        dispatcher: DispatcherConfig {
            // Timeslots of 2^33 ns (8.6 s): every packet of these tests is in slot 0 at any
            // shift from 10 up, and the Worker Pool's supervision, which takes a worker
            // with queued packets and no completed burst for half a timeslot for stuck,
            // allows 4.3 s. At 2^30 (0.54 s) a worker's first burst under emulated pku
            // (scripts/mpk-vm.sh: QEMU TCG translating the code on its first run, on a
            // shared host) outlasted it and the worker was evacuated as stuck.
            sched: SchedulerConfig {
                shift: 33,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    }
}

#[test]
fn forty_tenants_over_fourteen_keys_count_exactly() {
    let Some(mpk) = require_mpk("forty_tenants_over_fourteen_keys_count_exactly", Mpk::get) else {
        return;
    };
    let mut p = Pipeline::new(Monitor::with_max_flows(64), cfg(2, Domain::Mpk)).unwrap();
    for t in 1..=40 {
        p.admit(spec(t)).unwrap();
    }
    let misses_before = mpk.stats().misses;
    let frames: Vec<Vec<u8>> = (1..=40).map(|t| frame(t, &[t as u8; 20])).collect();
    let rounds = 200u32;
    for r in 0..rounds {
        // Runs of 8 packets per tenant, so groups are real Packet Buffers.
        for f in &frames {
            for _ in 0..8 {
                p.push(u64::from(r), 0, f);
            }
        }
    }
    let report = p.finish();
    assert_eq!(report.tenants.len(), 40);
    for t in &report.tenants {
        assert_eq!(t.packets, 8 * u64::from(rounds), "tenant {}", t.id);
        assert_eq!(t.passed, t.packets);
        assert!(!t.quarantined);
        let monitored = t.nf.get("monitored_packets").copied();
        assert_eq!(monitored, Some(t.packets), "tenant {} state", t.id);
    }
    assert!(
        mpk.stats().misses > misses_before,
        "40 tenants over {} keys must re-tag",
        mpk.cache_keys()
    );
}

#[test]
fn too_many_workers_for_the_keys_is_a_clear_error() {
    let Some(mpk) = require_mpk("too_many_workers_for_the_keys_is_a_clear_error", Mpk::get) else {
        return;
    };
    let workers = mpk.cache_keys() as u16;
    let e = Pipeline::new(Monitor::default(), cfg(workers, Domain::Mpk))
        .err()
        .expect("more workers than keys allow");
    assert!(
        matches!(&e, PipelineError::Config(m) if m.contains("protection keys")),
        "{e}"
    );
}

#[test]
fn mpk_unavailable_is_a_clear_error_at_setup() {
    const CHILD: &str = "BUFFET_WORKER_MPK_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let e = Pipeline::new(Monitor::default(), cfg(1, Domain::Mpk))
            .err()
            .expect("MPK is off in this child");
        println!("child: {e}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "mpk_unavailable_is_a_clear_error_at_setup",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env(buffet_memory::MPK_DISABLE_ENV, "off")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("child: isolation: MPK isolation is unavailable"),
        "{stdout}"
    );
}
