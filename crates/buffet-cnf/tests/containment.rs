//! Fault containment of C NFs under MPK: a tenant whose C code reads or writes another
//! tenant's region faults, is quarantined, and nobody else notices — while the traffic of
//! several tenants is in flight. Needs a CPU with `pku`: without one each test is a
//! hardware skip (`buffet_testkit::require_mpk`), a failure only under
//! `BUFFET_REQUIRE_PKU=1`; other MPK set-up errors fail under `BUFFET_REQUIRE_PRIVILEGED=1`.

mod common;

use std::sync::Arc;

use buffet_cnf::{CNf, CState, FaultKind};
use buffet_dispatch::TenantSlot;
use buffet_memory::{ArenaConfig, Domain, MemoryStorage, Mpk, TenantTable};
use buffet_sdk::{NetworkFunction, TenantId, Verdict};
use buffet_testkit::require_mpk;
use buffet_worker::{Outcome, PacketBuf, Pipeline, Worker, WorkerEvent};
use common::{cfg, child_dies_of, example_nf, frame, spec};
use serde_json::json;

const FRAME_PAYLOAD: usize = 30;

/// Tenants 1..=4 at slots 0..=3 of an inline engine; slot 1 runs `attacker_policy`.
struct Rig {
    nf: Arc<CNf>,
    table: Arc<TenantTable<CState>>,
    engine: Worker<CNf>,
}

impl Rig {
    fn new(domain: Domain, attacker_policy: serde_json::Value) -> Rig {
        let nf = Arc::new(CNf::load(&example_nf("malicious")).unwrap());
        let storage = MemoryStorage::new(ArenaConfig { capacity: 64 << 20 }).unwrap();
        let table = Arc::new(match domain {
            Domain::Mpk => TenantTable::with_mpk(storage, 4, Mpk::get().unwrap()),
            _ => TenantTable::new(storage, 4),
        });
        for slot in 0..4u32 {
            let policy = if slot == 1 {
                attacker_policy.clone()
            } else {
                json!({ "canary": 1000 * (slot + 1) })
            };
            table
                .admit_with(
                    TenantSlot(slot),
                    TenantId(slot + 1),
                    nf.register().bytes,
                    CState::default(),
                    |s, r| nf.init_in_region(&policy, s, r),
                )
                .unwrap();
        }
        let engine = Worker::new(nf.clone(), table.clone());
        Rig { nf, table, engine }
    }

    /// `bursts` bursts of 32 packets: 8 per tenant, the attacker's neighbour (slot 2)
    /// first, so its key is freshly loaded when the attacker runs. Returns the outcomes
    /// per slot.
    fn run(&mut self, bursts: usize) -> Vec<Vec<Outcome>> {
        let mut out = vec![Vec::new(); 4];
        for _ in 0..bursts {
            let mut burst: Vec<PacketBuf> = Vec::new();
            for slot in [2u32, 0, 1, 3] {
                for _ in 0..8 {
                    let mut m = PacketBuf::heap();
                    assert!(m.fill(&frame(slot + 1, 53, FRAME_PAYLOAD)));
                    m.tenant = TenantSlot(slot);
                    burst.push(m);
                }
            }
            self.engine.process(&mut burst);
            for m in &burst {
                out[m.tenant.0 as usize].push(m.outcome);
            }
        }
        out
    }

    /// The C state bytes of every tenant (the region past the 64-byte header).
    fn regions(&self) -> Vec<Vec<u8>> {
        (0..4)
            .map(|slot| {
                let e = self.table.get_arc(TenantSlot(slot)).unwrap();
                let mut g = e.lock();
                let bytes = g.split().expect("no sealed pages").1.to_vec();
                bytes
            })
            .collect()
    }
}

fn passed(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| **o == Outcome::Nf(Verdict::Pass))
        .count()
}

#[test]
fn an_attacker_is_quarantined_and_its_neighbours_regions_are_byte_identical() {
    let Some(mpk) = require_mpk(
        "an_attacker_is_quarantined_and_its_neighbours_regions_are_byte_identical",
        Mpk::get,
    ) else {
        return;
    };
    let control = {
        let mut rig = Rig::new(Domain::Mpk, json!({ "attack": "none", "canary": 2000 }));
        let out = rig.run(10);
        assert!(out.iter().all(|o| passed(o) == 80));
        rig.regions()
    };
    let pkru_before = mpk.current_pkru();
    let mut rig = Rig::new(
        Domain::Mpk,
        json!({ "attack": "read-write", "attack_after": 20, "canary": 2000 }),
    );
    // The layout the attacker relies on: the neighbour's region right after its own and
    // one guard page, so the attack really aims at the neighbour's first counter.
    let (a, n) = (
        rig.table.get_arc(TenantSlot(1)).unwrap(),
        rig.table.get_arc(TenantSlot(2)).unwrap(),
    );
    let page = rig.table.storage().page_size();
    assert_eq!(n.extent().base, a.extent().end() + page);
    let out = rig.run(10);
    // The attacker: 20 packets passed, then the fault quarantined the rest.
    assert_eq!(passed(&out[1]), 20);
    assert_eq!(
        out[1]
            .iter()
            .filter(|o| **o == Outcome::Quarantined)
            .count(),
        60
    );
    // Everyone else: every packet, before and after the fault, in the same bursts.
    for slot in [0, 2, 3] {
        assert_eq!(passed(&out[slot]), 80, "slot {slot}");
    }
    let faults = rig.nf.faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    let f = &faults[0];
    assert_eq!((f.tenant, f.during), (TenantId(2), "buffet_pkt_handler"));
    // Both keys were cached (the neighbour ran just before): still a protection-key fault,
    // on the neighbour's own cache key, at the neighbour's first byte of C state.
    let neighbour_key = n.pkey().unwrap();
    assert_ne!(neighbour_key, mpk.parking_key());
    assert_eq!(
        f.kind,
        FaultKind::ProtectionKey {
            pkey: neighbour_key
        }
    );
    assert_eq!(f.addr as usize, n.extent().base + 64);
    // Right after the fault, back in Rust, PKRU was the group's own: the attacker's key
    // open, every other key closed (not the signal handler's default PKRU).
    let attacker_key = a.pkey().unwrap();
    let group_pkru = mpk.closed_pkru() & !(0b11 << (2 * attacker_key));
    assert_eq!(f.pkru_after, Some(group_pkru));
    // And after the group, the thread is back to its own PKRU: every tenant key closed.
    assert_eq!(mpk.current_pkru(), pkru_before);
    let regions = rig.regions();
    for slot in [0, 2, 3] {
        assert!(
            regions[slot] == control[slot],
            "slot {slot}: state differs from a run without the attacker"
        );
    }
    // The attacker never got to read anything.
    assert_eq!(
        u64::from_ne_bytes(regions[1][24..32].try_into().unwrap()),
        0
    );
}

/// The same attack without MPK succeeds — the comparison above would catch it.
#[test]
fn without_mpk_the_same_attack_corrupts_the_neighbour() {
    if require_mpk(
        "without_mpk_the_same_attack_corrupts_the_neighbour",
        Mpk::get,
    )
    .is_none()
    {
        return;
    }
    let control = {
        let mut rig = Rig::new(Domain::None, json!({ "canary": 2000 }));
        rig.run(4);
        rig.regions()
    };
    let mut rig = Rig::new(
        Domain::None,
        json!({ "attack": "read-write", "attack_after": 20, "canary": 2000 }),
    );
    let out = rig.run(4);
    assert_eq!(passed(&out[1]), 32, "nothing stops it");
    assert!(rig.nf.faults().is_empty());
    let regions = rig.regions();
    assert!(regions[2] != control[2], "the neighbour was overwritten");
    // The attacker aims past a guard page and a 64-byte header, the MPK domain's layout;
    // outside it the C states are page regions with no header in front, one after the
    // other, so the write lands 64 bytes into the neighbour's.
    let (own, next) = (
        rig.table
            .get_arc(TenantSlot(1))
            .unwrap()
            .tail_extent()
            .unwrap(),
        rig.table
            .get_arc(TenantSlot(2))
            .unwrap()
            .tail_extent()
            .unwrap(),
    );
    assert_eq!(next.base, own.end() + rig.table.storage().page_size());
    assert_eq!(
        u64::from_ne_bytes(regions[2][64..72].try_into().unwrap()),
        0xdeadbeef
    );
}

#[test]
fn a_write_only_attack_and_a_guard_page_overrun_are_contained_too() {
    let Some(mpk) = require_mpk(
        "a_write_only_attack_and_a_guard_page_overrun_are_contained_too",
        Mpk::get,
    ) else {
        return;
    };
    for (attack, expect) in [("write", None), ("overrun", Some(FaultKind::GuardPage))] {
        let mut rig = Rig::new(
            Domain::Mpk,
            json!({ "attack": attack, "attack_after": 3, "canary": 2000 }),
        );
        let n = rig.table.get_arc(TenantSlot(2)).unwrap();
        let out = rig.run(3);
        assert_eq!(passed(&out[1]), 3, "{attack}");
        assert!(out[2].iter().all(|o| *o == Outcome::Nf(Verdict::Pass)));
        let faults = rig.nf.faults();
        assert_eq!(faults.len(), 1, "{attack}: {faults:?}");
        let want = expect.unwrap_or(FaultKind::ProtectionKey {
            pkey: n.pkey().unwrap(),
        });
        assert_eq!(faults[0].kind, want, "{attack}");
        assert_ne!(mpk.cache_keys(), 0);
        let g = n.lock();
        drop(g);
    }
}

/// Worker threads, six tenants, one attacker: the process survives, the attacker's
/// worker keeps serving its other tenants, and every other count is exact.
#[test]
fn the_pipeline_quarantines_the_attacker_and_its_worker_keeps_running() {
    if require_mpk(
        "the_pipeline_quarantines_the_attacker_and_its_worker_keeps_running",
        Mpk::get,
    )
    .is_none()
    {
        return;
    }
    let nf = CNf::load(&example_nf("malicious")).unwrap();
    let mut p = Pipeline::new(nf, cfg(2, Domain::Mpk)).unwrap();
    for t in 1..=6 {
        let policy = if t == 3 {
            json!({ "attack": "read-write", "attack_after": 50, "canary": 3000 })
        } else {
            json!({ "canary": 1000 * t })
        };
        p.admit(spec(t, policy)).unwrap();
    }
    let frames: Vec<Vec<u8>> = (1..=6).map(|t| frame(t, 53, FRAME_PAYLOAD)).collect();
    let len = frames[0].len() as u64;
    let push = |p: &mut Pipeline<CNf>, rounds: u32| {
        for r in 0..rounds {
            for f in &frames {
                for _ in 0..8 {
                    p.push(u64::from(r), 0, f);
                }
            }
        }
    };
    push(&mut p, 75);
    p.flush();
    assert!(
        p.events()
            .iter()
            .any(|e| matches!(e, WorkerEvent::Fault { tenant, .. } if *tenant == TenantId(3))),
        "the fault was reported: {:?}",
        p.events()
    );
    let faults = p.nf().faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!(faults[0].tenant, TenantId(3));
    assert!(matches!(faults[0].kind, FaultKind::ProtectionKey { .. }));
    // After the fault: more traffic, through the same workers.
    push(&mut p, 25);
    let report = p.finish();
    let attacker = report.tenants.iter().find(|t| t.id == TenantId(3)).unwrap();
    assert!(attacker.quarantined);
    assert_eq!((attacker.packets, attacker.passed), (800, 50));
    let mut shares_worker = false;
    for t in report.tenants.iter().filter(|t| t.id != TenantId(3)) {
        assert!(!t.quarantined, "tenant {}", t.id);
        assert_eq!((t.packets, t.passed), (800, 800), "tenant {}", t.id);
        assert_eq!(t.nf.get("packets"), Some(&800), "tenant {}", t.id);
        assert_eq!(t.nf.get("bytes"), Some(&(800 * len)), "tenant {}", t.id);
        assert_eq!(t.nf.get("canary"), Some(&(1000 * u64::from(t.id.0))));
        shares_worker |= t.worker == attacker.worker;
    }
    assert!(
        shares_worker,
        "some tenant ran on the attacker's worker after the fault"
    );
}

/// More tenants than protection keys, on two worker threads, with a real policy.
#[test]
fn forty_c_tenants_over_the_key_cache_count_exactly() {
    let Some(mpk) = require_mpk("forty_c_tenants_over_the_key_cache_count_exactly", Mpk::get)
    else {
        return;
    };
    let nf = CNf::load(&example_nf("portblock")).unwrap();
    let mut p = Pipeline::new(nf, cfg(2, Domain::Mpk)).unwrap();
    for t in 1..=40 {
        p.admit(spec(t, json!({ "blocked_ports": [22, 23], "canary": t })))
            .unwrap();
    }
    let misses_before = mpk.stats().misses;
    let rounds = 60u64;
    for r in 0..rounds {
        for t in 1..=40u32 {
            // 6 packets to port 53, 2 to the blocked port 22.
            for i in 0..8 {
                let dport = if i % 4 == 3 { 22 } else { 53 };
                p.push(r, 0, &frame(t, dport, FRAME_PAYLOAD));
            }
        }
    }
    let report = p.finish();
    assert_eq!(report.tenants.len(), 40);
    for t in &report.tenants {
        assert!(!t.quarantined);
        assert_eq!(t.packets, 8 * rounds, "tenant {}", t.id);
        assert_eq!(t.passed, 6 * rounds, "tenant {}", t.id);
        assert_eq!(t.nf.get("packets"), Some(&(8 * rounds)));
        assert_eq!(t.nf.get("dropped"), Some(&(2 * rounds)));
        assert_eq!(t.nf.get("canary"), Some(&u64::from(t.id.0)));
    }
    assert!(mpk.stats().misses > misses_before + 40);
}

/// Inside an NF call every fault is the tenant's, at the `mpk` level as at
/// trusted-native: a NULL write in the handler quarantines its tenant after exactly the
/// packets before it, and the other tenants' packets in the same bursts all pass. (No
/// protection key is involved, so this runs on every CPU.)
#[test]
fn a_null_write_in_the_handler_is_contained_at_the_mpk_level() {
    let mut rig = Rig::new(
        Domain::None,
        json!({ "attack": "null", "attack_after": 12 }),
    );
    let out = rig.run(4);
    assert_eq!(passed(&out[1]), 12, "{:?}", out[1]);
    assert_eq!(
        out[1]
            .iter()
            .filter(|o| **o == Outcome::Quarantined)
            .count(),
        20
    );
    for slot in [0, 2, 3] {
        assert_eq!(passed(&out[slot]), 32, "slot {slot}: {:?}", out[slot]);
    }
    let faults = rig.nf.faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!(
        (faults[0].tenant, faults[0].during, faults[0].addr),
        (TenantId(2), "buffet_pkt_handler", 0)
    );
    assert_eq!(
        faults[0].kind,
        FaultKind::Signal {
            signal: libc::SIGSEGV,
            code: 1
        }
    );
}

/// A fault outside any NF call is the framework's own bug: the shim's handler passes it
/// on and the process dies of it, even with a C NF loaded and after it ran.
#[test]
fn a_fault_outside_an_nf_call_still_crashes() {
    const CHILD: &str = "BUFFET_CNF_CRASH_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let mut rig = Rig::new(Domain::None, json!({ "attack": "none" }));
        rig.run(1);
        println!("child: running");
        // SAFETY: none — this is the deliberate framework-side bug the test is about.
        unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u64>(), 1) };
        println!("child: survived");
        return;
    }
    child_dies_of(
        "a_fault_outside_an_nf_call_still_crashes",
        CHILD,
        "running",
        libc::SIGSEGV,
    );
}

#[test]
fn policy_errors_and_missing_symbols_are_reported() {
    let nf = CNf::load(&example_nf("portblock")).unwrap();
    assert_eq!(nf.name(), "portblock");
    let storage = MemoryStorage::new(ArenaConfig { capacity: 16 << 20 }).unwrap();
    let table = TenantTable::new(storage, 2);
    let e = table
        .admit_with(
            TenantSlot(0),
            TenantId(1),
            nf.register().bytes,
            CState::default(),
            |s, r| nf.init_in_region(&json!({ "blocked_ports": [70000] }), s, r),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("blocked_ports: not a port number"), "{e}");
    let e = nf
        .init(&json!({}), &mut CState::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tenant's region"), "{e}");
    let e = CNf::load(std::path::Path::new("/nonexistent/nf.so"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot load C NF /nonexistent/nf.so"), "{e}");
    assert_eq!(e.matches("nf.so").count(), 1, "the path once: {e}");
}
