//! Attack NFs against the native level, each with victim tenants in flight: a crash in
//! `buffet_state_init` (NULL write, SIGFPE, ud2, stack overflow, endless loop) fails the
//! admission only; a stack overflow (recursion, huge alloca) and an endless loop in
//! `buffet_pkt_handler` quarantine the attacker while its worker and every other tenant
//! carry on; forbidden system calls made with a raw `syscall` instruction on a thread under
//! the NF seccomp filter are contained the same way. All at the mpk containment level
//! (`Containment::Guarded`, inspected) without protection keys (`Domain::None`), so they
//! run on every machine: none of these needs the hardware.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet_cnf::{confine_nf_thread, CNf, CState, Containment, FaultKind, LoadConfig};
use buffet_dispatch::TenantSlot;
use buffet_memory::{ArenaConfig, Domain, MemoryStorage, TenantTable};
use buffet_sdk::{NetworkFunction, TenantId, Verdict};
use buffet_worker::{Outcome, PacketBuf, Pipeline, Report, Worker, WorkerEvent};
use common::{cfg, child_dies_of, frame, spec, test_nf};
use serde_json::json;

const FRAME_PAYLOAD: usize = 30;
const VICTIMS: [u32; 5] = [1, 2, 4, 5, 6];

/// The attack NF at `mpk`'s containment with the default watchdog budget, whatever
/// BUFFET_CNF_WATCHDOG_MS says: these tests assert on the budget's 10 ms.
fn load() -> CNf {
    let nf = CNf::load_config(&test_nf("attack"), LoadConfig::default()).unwrap();
    assert_eq!(nf.containment(), Containment::Guarded);
    assert_eq!(nf.watchdog(), Some(buffet_cnf::DEFAULT_WATCHDOG));
    nf
}

/// Pushes `rounds` rounds of 8 packets for each tenant in `tenants`.
fn push(p: &mut Pipeline<CNf>, tenants: &[u32], from: u32, rounds: u32) {
    let frames: Vec<Vec<u8>> = tenants
        .iter()
        .map(|&t| frame(t, 53, FRAME_PAYLOAD))
        .collect();
    for r in from..from + rounds {
        for f in &frames {
            for _ in 0..8 {
                p.push(u64::from(r), 0, f);
            }
        }
    }
}

/// Every victim passed all of its `expect` packets, and its state is its own.
fn victims_exact(report: &Report, expect: u64) {
    for &v in &VICTIMS {
        let t = report
            .tenants
            .iter()
            .find(|t| t.id == TenantId(v))
            .unwrap_or_else(|| panic!("tenant {v} missing"));
        assert!(!t.quarantined, "tenant {v}");
        assert_eq!((t.packets, t.passed), (expect, expect), "tenant {v}");
        assert_eq!(t.nf.get("packets"), Some(&expect), "tenant {v}");
        assert_eq!(
            t.nf.get("canary"),
            Some(&(1000 * u64::from(v))),
            "tenant {v}"
        );
    }
}

/// A crash of any kind in `buffet_state_init` fails that admission with the fault and
/// changes nothing else: the victims' traffic, pushed before and after each failed
/// admission, all passes.
#[test]
fn a_crash_in_init_fails_the_admission_and_nothing_else() {
    let mut p = Pipeline::new(load(), cfg(2, Domain::None)).unwrap();
    for &t in &VICTIMS {
        p.admit(spec(t, json!({ "canary": 1000 * t }))).unwrap();
    }
    let cases: [(&str, &str); 5] = [
        ("init-null", "raised SIGSEGV at 0x0 (address not mapped)"),
        ("init-fpe", "raised SIGFPE"),
        ("init-ud2", "raised SIGILL"),
        ("init-overflow", "overflowed its stack"),
        ("init-loop", "ran past the watchdog's budget of 10ms"),
    ];
    let mut round = 0;
    for (i, (attack, says)) in cases.iter().enumerate() {
        push(&mut p, &VICTIMS, round, 5);
        round += 5;
        let t = 3 + 10 * i as u32;
        let started = Instant::now();
        let e = p
            .admit(spec(t, json!({ "attack": attack, "canary": 1 })))
            .unwrap_err()
            .to_string();
        assert!(e.contains("fault contained"), "{attack}: {e}");
        assert!(e.contains(says), "{attack}: {e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{attack}");
        push(&mut p, &VICTIMS, round, 5);
        round += 5;
    }
    let faults = p.nf().faults();
    let kinds: Vec<FaultKind> = faults.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        [
            FaultKind::Signal {
                signal: libc::SIGSEGV,
                code: 1
            },
            FaultKind::Signal {
                signal: libc::SIGFPE,
                code: 1
            },
            FaultKind::Signal {
                signal: libc::SIGILL,
                code: 2
            },
            FaultKind::StackOverflow,
            FaultKind::Watchdog {
                budget: Duration::from_millis(10)
            },
        ],
        "{faults:?}"
    );
    assert!(faults.iter().all(|f| f.during == "buffet_state_init"));
    // A well-behaved tenant is still admitted afterwards.
    p.admit(spec(7, json!({ "canary": 7 }))).unwrap();
    push(&mut p, &[7], round, 5);
    let report = p.finish();
    assert_eq!(
        report.tenants.len(),
        VICTIMS.len() + 1,
        "no failed admission left a row"
    );
    victims_exact(&report, 8 * u64::from(round));
    let t7 = report.tenants.iter().find(|t| t.id == TenantId(7)).unwrap();
    assert_eq!((t7.packets, t7.passed), (40, 40));
}

/// Tenant 3 attacks after 20 packets; the victims' traffic is in the same bursts, on
/// the same two workers, before and after the fault. Returns the report and the faults.
fn run_handler_attack(nf: CNf, attack: &str) -> (Report, Vec<buffet_cnf::CFault>) {
    let mut p = Pipeline::new(nf, cfg(2, Domain::None)).unwrap();
    for t in 1..=6 {
        let policy = if t == 3 {
            json!({ "attack": attack, "attack_after": 20, "canary": 3000 })
        } else {
            json!({ "canary": 1000 * t })
        };
        p.admit(spec(t, policy)).unwrap();
    }
    let all: Vec<u32> = (1..=6).collect();
    push(&mut p, &all, 0, 75);
    p.flush();
    assert!(
        p.events()
            .iter()
            .any(|e| matches!(e, WorkerEvent::Fault { tenant, .. } if *tenant == TenantId(3))),
        "{attack}: the fault was reported: {:?}",
        p.events()
    );
    push(&mut p, &all, 75, 25);
    let faults = p.nf().faults();
    let report = p.finish();
    let attacker = report.tenants.iter().find(|t| t.id == TenantId(3)).unwrap();
    assert!(attacker.quarantined, "{attack}");
    assert_eq!((attacker.packets, attacker.passed), (800, 20), "{attack}");
    victims_exact(&report, 800);
    let shares_worker = report
        .tenants
        .iter()
        .any(|t| t.id != TenantId(3) && t.worker == attacker.worker);
    assert!(
        shares_worker,
        "{attack}: a victim ran on the attacker's worker"
    );
    assert_eq!(faults.len(), 1, "{attack}: {faults:?}");
    assert_eq!(
        (faults[0].tenant, faults[0].during),
        (TenantId(3), "buffet_pkt_handler")
    );
    (report, faults)
}

#[test]
fn a_stack_overflow_in_the_handler_is_contained_recursion_or_alloca() {
    for attack in ["recurse", "alloca"] {
        let (_, faults) = run_handler_attack(load(), attack);
        assert_eq!(faults[0].kind, FaultKind::StackOverflow, "{attack}");
        let text = faults[0].to_string();
        assert!(text.contains("overflowed its stack"), "{text}");
    }
}

#[test]
fn an_endless_loop_is_interrupted_by_the_watchdog() {
    let started = Instant::now();
    let (_, faults) = run_handler_attack(load(), "loop");
    assert_eq!(
        faults[0].kind,
        FaultKind::Watchdog {
            budget: Duration::from_millis(10)
        }
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    // A budget of one's own, on the loader's config.
    let cfg = LoadConfig {
        watchdog: Some(Duration::from_millis(3)),
        ..LoadConfig::default()
    };
    let nf = CNf::load_config(&test_nf("attack"), cfg).unwrap();
    let (_, faults) = run_handler_attack(nf, "loop");
    assert_eq!(
        faults[0].kind,
        FaultKind::Watchdog {
            budget: Duration::from_millis(3)
        }
    );
    assert_eq!(
        faults[0].to_string(),
        "tenant 3: buffet_pkt_handler ran past the watchdog's budget of 3ms and was interrupted"
    );
}

/// The watchdog never fires for NFs that return: a long run of the well-behaved tenants
/// alone (many budgets of CPU time in total) has no fault.
#[test]
fn the_watchdog_leaves_calls_that_return_alone() {
    let cfg = LoadConfig {
        watchdog: Some(Duration::from_millis(1)),
        ..LoadConfig::default()
    };
    let nf = CNf::load_config(&test_nf("attack"), cfg).unwrap();
    let mut p = Pipeline::new(nf, common::cfg(2, Domain::None)).unwrap();
    for &t in &VICTIMS {
        p.admit(spec(t, json!({ "canary": 1000 * t }))).unwrap();
    }
    push(&mut p, &VICTIMS, 0, 500);
    let faults = p.nf().faults();
    let report = p.finish();
    assert!(faults.is_empty(), "{faults:?}");
    victims_exact(&report, 8 * 500);
}

/// Tenants 1..=4 at slots 0..=3 of an inline engine; slot 2 runs `attack`.
fn inline_rig(nf: &Arc<CNf>, attack: &str) -> (Arc<TenantTable<CState>>, Worker<CNf>) {
    let storage = MemoryStorage::new(ArenaConfig { capacity: 16 << 20 }).unwrap();
    let table = Arc::new(TenantTable::new(storage, 4));
    for slot in 0..4u32 {
        let policy = if slot == 2 {
            json!({ "attack": attack, "attack_after": 20, "canary": 3000 })
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
    (table, engine)
}

/// Bursts of 32 packets, 8 per tenant; the outcomes per slot.
fn run_inline(engine: &mut Worker<CNf>, bursts: usize) -> Vec<Vec<Outcome>> {
    let mut out = vec![Vec::new(); 4];
    for _ in 0..bursts {
        let mut burst: Vec<PacketBuf> = Vec::new();
        for slot in 0..4u32 {
            for _ in 0..8 {
                let mut m = PacketBuf::heap();
                assert!(m.fill(&frame(slot + 1, 53, FRAME_PAYLOAD)));
                m.tenant = TenantSlot(slot);
                burst.push(m);
            }
        }
        engine.process(&mut burst);
        for m in &burst {
            out[m.tenant.0 as usize].push(m.outcome);
        }
    }
    out
}

/// On a thread confined with the NF seccomp filter, an NF that makes a forbidden system
/// call with a raw `syscall` instruction (no import to refuse) — mprotect with
/// PROT_EXEC, exit_group, tgkill(SIGKILL), and, because the instruction is not libc's,
/// exit (ending the worker thread), mmap of more memory, rt_sigprocmask blocking the
/// watchdog — is quarantined; the thread, the process and the other tenants carry on,
/// and the thread (whose own system calls go through libc) still ends normally.
#[test]
fn forbidden_system_calls_under_seccomp_quarantine_the_tenant() {
    for (attack, nr) in [
        ("mprotect-exec", libc::SYS_mprotect),
        ("exit-group", libc::SYS_exit_group),
        ("tgkill", libc::SYS_tgkill),
        ("exit-thread", libc::SYS_exit),
        ("mmap", libc::SYS_mmap),
        ("block-signals", libc::SYS_rt_sigprocmask),
    ] {
        let nf = Arc::new(load());
        let worker_nf = nf.clone();
        let out = std::thread::spawn(move || {
            let (_table, mut engine) = inline_rig(&worker_nf, attack);
            confine_nf_thread().unwrap();
            run_inline(&mut engine, 10)
        })
        .join()
        .unwrap();
        let pass = |o: &[Outcome]| {
            o.iter()
                .filter(|o| **o == Outcome::Nf(Verdict::Pass))
                .count()
        };
        assert_eq!(pass(&out[2]), 20, "{attack}");
        assert_eq!(
            out[2]
                .iter()
                .filter(|o| **o == Outcome::Quarantined)
                .count(),
            60,
            "{attack}: {:?}",
            out[2]
        );
        for slot in [0, 1, 3] {
            assert_eq!(pass(&out[slot]), 80, "{attack}: slot {slot}");
        }
        let faults = nf.faults();
        assert_eq!(faults.len(), 1, "{attack}: {faults:?}");
        assert_eq!(faults[0].tenant, TenantId(3));
        assert_eq!(
            faults[0].kind,
            FaultKind::Syscall { nr: nr as i32 },
            "{attack}"
        );
        let text = faults[0].to_string();
        assert!(
            text.contains("which the NF seccomp filter forbids"),
            "{text}"
        );
    }
}

/// A pipeline confines its own worker threads at the mpk level (the NF's
/// `prepare_worker_thread`): nobody calls `confine_nf_thread` here, yet an attacker's raw
/// `mprotect(PROT_EXEC)` traps, quarantines it after exactly its first 20 packets, and the
/// victims on the same two workers pass every packet.
#[test]
fn pipeline_workers_are_confined_before_their_first_nf_call() {
    let mut p = Pipeline::new(load(), cfg(2, Domain::None)).unwrap();
    for t in 1..=6u32 {
        let policy = if t == 3 {
            json!({ "attack": "mprotect-exec", "attack_after": 20, "canary": 3000 })
        } else {
            json!({ "canary": 1000 * t })
        };
        p.admit(spec(t, policy)).unwrap();
    }
    push(&mut p, &[1, 2, 3, 4, 5, 6], 0, 10);
    let report = p.finish();
    victims_exact(&report, 80);
    let attacker = report.tenants.iter().find(|t| t.id == TenantId(3)).unwrap();
    assert!(attacker.quarantined);
    assert_eq!((attacker.packets, attacker.passed), (80, 20));
    assert!(report
        .events
        .iter()
        .any(|e| matches!(e, WorkerEvent::Fault { tenant, .. } if *tenant == TenantId(3))));
}

/// The same forbidden call outside any NF call — the framework's own code on a confined
/// thread — is not contained: the process dies of SIGSYS. Runs itself in a child process.
#[test]
fn a_forbidden_call_outside_an_nf_call_kills_the_process() {
    const CHILD: &str = "BUFFET_CNF_SECCOMP_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let nf = load();
        drop(nf);
        confine_nf_thread().unwrap();
        println!("child: confined");
        // Spawning a process clones: trapped before it happens.
        let spawned = std::process::Command::new("true").status();
        println!("child: survived {spawned:?}");
        return;
    }
    child_dies_of(
        "a_forbidden_call_outside_an_nf_call_kills_the_process",
        CHILD,
        "confined",
        libc::SIGSYS,
    );
}
