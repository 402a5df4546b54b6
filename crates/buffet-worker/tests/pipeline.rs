//! The Worker Pool end to end: run-time worker changes, fault containment, admission
//! and removal under traffic. Every test counts packets exactly.

use buffet_nfs::monitor::{Monitor, MonitorPolicy};
use buffet_sdk::{InitError, MemorySpec, NetworkFunction, Packet, TenantId, Verdict};
use buffet_worker::{Pipeline, PipelineError, TenantSpec, WorkerEvent};

mod common;
use common::{answered, cfg, frame, spec, spec_with};

#[test]
fn terminating_a_worker_reassigns_its_tenants_and_loses_nothing() {
    let mut p = Pipeline::new(Monitor::default(), cfg(3, 30)).unwrap();
    for t in 1..=9 {
        p.admit(spec(t)).unwrap();
    }
    let on_1_before: Vec<u32> = p
        .report()
        .tenants
        .iter()
        .filter(|t| t.worker == 1)
        .map(|t| t.id.0)
        .collect();
    assert!(!on_1_before.is_empty());
    let frames: Vec<Vec<u8>> = (1..=9).map(|t| frame(t, b"payload")).collect();
    let rounds = 3000u32;
    for r in 0..rounds {
        if r == rounds / 2 {
            p.terminate_worker(buffet_dispatch::WorkerId(1)).unwrap();
            assert!(
                p.terminate_worker(buffet_dispatch::WorkerId(1)).is_err(),
                "already dead"
            );
        }
        for f in &frames {
            p.push(u64::from(r), 0, f);
        }
    }
    let report = p.finish();
    for t in &report.tenants {
        assert_eq!(t.packets, u64::from(rounds), "tenant {} lost packets", t.id);
        assert_eq!(t.passed, u64::from(rounds));
        assert_ne!(
            t.worker, 1,
            "tenant {} still on the terminated worker",
            t.id
        );
    }
    assert!(!report.workers[1].live);
    assert!(
        report.workers[1].packets > 0,
        "worker 1 processed its queue before exiting"
    );
    let total: u64 = report.workers.iter().map(|w| w.packets).sum();
    assert_eq!(total, 9 * u64::from(rounds));
    assert!(report
        .events
        .iter()
        .any(|e| matches!(e, WorkerEvent::WorkerTerminated { worker: 1, reassigned } if *reassigned == on_1_before.len())));
}

#[test]
fn last_worker_cannot_be_terminated_and_launch_adds_one() {
    let mut p = Pipeline::new(Monitor::default(), cfg(1, 30)).unwrap();
    assert!(p.terminate_worker(buffet_dispatch::WorkerId(0)).is_err());
    let w = p.launch_worker().unwrap();
    assert_eq!(w.0, 1);
    p.admit(spec(1)).unwrap();
    p.admit(spec(2)).unwrap();
    // Initial placement spreads tenants: one on each worker.
    let r = p.report();
    let mut workers: Vec<u16> = r.tenants.iter().map(|t| t.worker).collect();
    workers.sort();
    assert_eq!(workers, vec![0, 1]);
    for i in 0..100 {
        p.push(i, 0, &frame(1, b"a"));
        p.push(i, 0, &frame(2, b"b"));
    }
    let r = p.finish();
    assert!(r.workers.iter().all(|w| w.packets == 100));
}

/// An NF that panics on a packet whose payload is `boom`.
struct Fragile;

impl NetworkFunction for Fragile {
    type State = u64;
    type Policy = ();
    fn name(&self) -> &'static str {
        "fragile"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<u64>()
    }
    fn init(&self, _: &(), _: &mut u64) -> Result<(), InitError> {
        Ok(())
    }
    fn handle(&self, pkt: &mut Packet<'_>, seen: &mut u64) -> Verdict {
        *seen += 1;
        if pkt.payload() == b"boom" {
            panic!("tenant {} sent boom", pkt.tenant());
        }
        if pkt.payload() == b"fault" {
            return Verdict::Fault;
        }
        Verdict::Pass
    }
    fn summary(&self, seen: &u64) -> Vec<(&'static str, u64)> {
        vec![("seen", *seen)]
    }
}

#[test]
fn a_panicking_handler_quarantines_only_its_tenant() {
    let mut p = Pipeline::new(Fragile, cfg(2, 30)).unwrap();
    for t in 1..=4 {
        p.admit(spec_with(t, ())).unwrap();
    }
    let ok: Vec<Vec<u8>> = (1..=4).map(|t| frame(t, b"fine")).collect();
    let boom = frame(3, b"boom");
    for r in 0..2000u64 {
        for f in &ok {
            p.push(r, 0, f);
        }
        if r == 500 {
            p.push(r, 0, &boom);
        }
    }
    let report = p.finish();
    for t in &report.tenants {
        if t.id == TenantId(3) {
            assert!(t.quarantined);
            assert_eq!(t.packets, 2001);
            assert!(t.passed >= 501 && t.passed < 2001, "passed {}", t.passed);
            assert_eq!(t.passed + t.drops["quarantined"], 2001);
        } else {
            assert!(!t.quarantined);
            assert_eq!(
                (t.packets, t.passed),
                (2000, 2000),
                "tenant {} was hurt",
                t.id
            );
            assert!(t.drops.is_empty());
            assert_eq!(t.nf["seen"], 2000);
        }
    }
    assert!(report.events.iter().any(
        |e| matches!(e, WorkerEvent::Fault { tenant, message, .. } if *tenant == TenantId(3) && message.contains("boom"))
    ));
}

#[test]
fn a_fault_verdict_quarantines_only_its_tenant() {
    let mut p = Pipeline::new(Fragile, cfg(1, 30)).unwrap();
    for t in 1..=2 {
        p.admit(spec_with(t, ())).unwrap();
    }
    for r in 0..100u64 {
        p.push(r, 0, &frame(1, b"fine"));
        p.push(r, 0, &frame(2, if r == 10 { b"fault" } else { b"fine" }));
    }
    let report = p.finish();
    let t1 = &report.tenants[0];
    let t2 = &report.tenants[1];
    assert_eq!((t1.passed, t1.quarantined), (100, false));
    assert!(t2.quarantined);
    assert_eq!(t2.passed, 10);
    assert_eq!(t2.drops["quarantined"], 90);
    assert!(report.events.iter().any(
        |e| matches!(e, WorkerEvent::Fault { tenant, message, .. } if *tenant == TenantId(2) && message.contains("Verdict::Fault"))
    ));
}

#[test]
fn admission_and_removal_under_traffic_lose_no_other_tenants_packets() {
    let mut p = Pipeline::new(Monitor::default(), cfg(2, 30)).unwrap();
    for t in 1..=4 {
        p.admit(spec(t)).unwrap();
    }
    let steady: Vec<Vec<u8>> = (1..=4).map(|t| frame(t, b"steady")).collect();
    let churn = frame(50, b"churn");
    let mut churn_sent_while_admitted = 0u64;
    for r in 0..4000u64 {
        if r % 200 == 0 {
            if r % 400 == 0 {
                p.admit(spec(50)).unwrap();
            } else {
                p.remove(TenantId(50)).unwrap();
            }
        }
        if (r / 200) % 2 == 0 {
            churn_sent_while_admitted += 1;
        }
        p.push(r, 0, &churn);
        for f in &steady {
            p.push(r, 0, f);
        }
    }
    let report = p.finish();
    for t in report.tenants.iter().filter(|t| t.id.0 <= 4) {
        assert_eq!(
            (t.packets, t.passed),
            (4000, 4000),
            "tenant {} lost packets",
            t.id
        );
    }
    assert!(
        report.tenants.iter().all(|t| t.id != TenantId(50)),
        "removed at the end"
    );
    // While tenant 50 was out, its frames were unmatched.
    assert_eq!(report.global.unmatched, 4000 - churn_sent_while_admitted);
    assert!(p_err_duplicate());
}

fn p_err_duplicate() -> bool {
    let mut p = Pipeline::new(Monitor::default(), cfg(1, 30)).unwrap();
    p.admit(spec(1)).unwrap();
    let dup = p.admit(spec(1)).unwrap_err().to_string();
    let bad = p
        .admit(TenantSpec {
            policy: MonitorPolicy {
                flow_capacity: Some(0),
            },
            ..spec(2)
        })
        .unwrap_err()
        .to_string();
    dup.contains("already admitted")
        && bad.contains("flow_capacity")
        && p.slot_of(TenantId(2)).is_none()
}

#[test]
fn a_policy_update_takes_effect_and_a_rejected_one_changes_nothing() {
    use buffet_nfs::firewall::{Action, Firewall, FirewallPolicy};
    let policy = |default| FirewallPolicy {
        default,
        ..FirewallPolicy::default()
    };
    let mut p = Pipeline::new(Firewall::default(), cfg(2, 30)).unwrap();
    for t in [1, 2] {
        p.admit(spec_with(t, policy(Action::Allow))).unwrap();
    }
    let slots = (p.slot_of(TenantId(1)), p.slot_of(TenantId(2)));
    let burst = |p: &mut Pipeline<Firewall>| {
        for i in 0..20u8 {
            for t in [1, 2] {
                p.push(u64::from(i), 0, &frame(t, &[i]));
            }
        }
        p.flush();
    };
    burst(&mut p);

    // Tenant 1 now denies everything; tenant 2's update is invalid and refused.
    p.update_policy(TenantId(1), &policy(Action::Deny)).unwrap();
    let bad = FirewallPolicy {
        conntrack_capacity: Some(10),
        ..policy(Action::Deny)
    };
    let e = p.update_policy(TenantId(2), &bad).unwrap_err();
    assert!(
        matches!(e, PipelineError::Policy { tenant, .. } if tenant == TenantId(2)),
        "{e}"
    );
    assert!(e.to_string().contains("conntrack_capacity"), "{e}");
    let e = p
        .update_policy(TenantId(3), &policy(Action::Deny))
        .unwrap_err();
    assert!(matches!(e, PipelineError::Unknown(TenantId(3))), "{e}");
    burst(&mut p);

    // Same slots; counters carried across the update; the new policy applies to every
    // packet after it, the rejected one to none.
    assert_eq!((p.slot_of(TenantId(1)), p.slot_of(TenantId(2))), slots);
    let report = p.finish();
    let t = |id| {
        report
            .tenants
            .iter()
            .find(|r| r.id == TenantId(id))
            .unwrap()
    };
    assert_eq!((t(1).packets, t(1).passed, t(1).dropped()), (40, 20, 20));
    assert_eq!((t(2).packets, t(2).passed, t(2).dropped()), (40, 40, 0));
}

/// An NF whose `init` waits until the test lets it go: an admission that takes long (a
/// large policy, a program under verification).
struct SlowInit {
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl NetworkFunction for SlowInit {
    type State = u64;
    type Policy = bool;
    fn name(&self) -> &'static str {
        "slow-init"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<u64>()
    }
    fn init(&self, slow: &bool, _: &mut u64) -> Result<(), InitError> {
        if *slow {
            self.entered.lock().unwrap().send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        Ok(())
    }
    fn handle(&self, _: &mut Packet<'_>, seen: &mut u64) -> Verdict {
        *seen += 1;
        Verdict::Pass
    }
}

#[test]
fn a_long_admission_does_not_stall_the_data_plane() {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let nf = SlowInit {
        entered: std::sync::Mutex::new(entered_tx),
        release: std::sync::Mutex::new(release_rx),
    };
    let (control, mut dataplane) = buffet_worker::build(nf, cfg(2, 30)).unwrap();
    let c = control.clone();
    answered(&mut dataplane, move || {
        c.admit(spec_with(1, false)).unwrap()
    });
    // Tenant 2's init now holds the admission path; the data plane must still carry
    // tenant 1's traffic and answer reports.
    let c = control.clone();
    let slow = std::thread::spawn(move || c.admit(spec_with(2, true)));
    entered.recv().unwrap();
    for i in 0..100u8 {
        dataplane.push(u64::from(i), 0, &frame(1, &[i]));
    }
    dataplane.flush();
    let report = dataplane.report();
    let t1 = report.tenants.iter().find(|r| r.id == TenantId(1)).unwrap();
    assert_eq!((t1.packets, t1.passed), (100, 100));
    assert!(report.tenants.iter().all(|r| r.id != TenantId(2)));
    release.send(()).unwrap();
    while !slow.is_finished() {
        dataplane.apply_commands();
    }
    assert!(slow.join().unwrap().is_ok());
    assert!(dataplane
        .report()
        .tenants
        .iter()
        .any(|r| r.id == TenantId(2)));
}
