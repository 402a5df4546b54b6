//! The trusted-native level: C NFs on a CPU without protection keys. Regions have no
//! hardware domain (`Domain::None`), guard pages separate them, and the NF is loaded with
//! `Containment::AnyFault`, so any crash of a tenant's code — a NULL write here — is
//! contained and quarantines that tenant only. Runs on every machine (no `pku` needed).

mod common;

use buffet_cnf::{CNf, Containment, FaultKind};
use buffet_memory::Domain;
use buffet_sdk::TenantId;
use buffet_worker::{Pipeline, WorkerEvent};
use common::{cfg, example_nf, frame, spec};
use serde_json::json;

const FRAME_PAYLOAD: usize = 30;

fn load(name: &str) -> CNf {
    let nf = CNf::load_with(&example_nf(name), Containment::AnyFault).unwrap();
    assert_eq!(nf.containment(), Containment::AnyFault);
    nf
}

#[test]
fn a_c_nf_serves_many_tenants_without_protection_keys() {
    let mut p = Pipeline::new(load("portblock"), cfg(2, Domain::None)).unwrap();
    for t in 1..=12 {
        p.admit(spec(t, json!({ "blocked_ports": [22, 23], "canary": t })))
            .unwrap();
    }
    let rounds = 40u64;
    for r in 0..rounds {
        for t in 1..=12u32 {
            for i in 0..8 {
                let dport = if i % 4 == 3 { 22 } else { 53 };
                p.push(r, 0, &frame(t, dport, FRAME_PAYLOAD));
            }
        }
    }
    p.flush();
    let faults = p.nf().faults();
    let report = p.finish();
    assert!(faults.is_empty(), "{faults:?}");
    assert_eq!(report.tenants.len(), 12);
    for t in &report.tenants {
        assert!(!t.quarantined, "tenant {}", t.id);
        assert_eq!(t.packets, 8 * rounds, "tenant {}", t.id);
        assert_eq!(t.passed, 6 * rounds, "tenant {}", t.id);
        assert_eq!(t.nf.get("packets"), Some(&(8 * rounds)));
        assert_eq!(t.nf.get("dropped"), Some(&(2 * rounds)));
        assert_eq!(t.nf.get("canary"), Some(&u64::from(t.id.0)));
    }
}

/// The same NULL write that crashes the process under the default containment
/// (`a_plain_bug_outside_any_tenant_region_still_crashes` in containment.rs).
#[test]
fn a_null_write_quarantines_its_tenant_and_the_others_carry_on() {
    let mut p = Pipeline::new(load("malicious"), cfg(2, Domain::None)).unwrap();
    for t in 1..=6 {
        let policy = if t == 4 {
            json!({ "attack": "null", "attack_after": 50, "canary": 4000 })
        } else {
            json!({ "canary": 1000 * t })
        };
        p.admit(spec(t, policy)).unwrap();
    }
    let frames: Vec<Vec<u8>> = (1..=6).map(|t| frame(t, 53, FRAME_PAYLOAD)).collect();
    let push = |p: &mut Pipeline<CNf>, from: u32, rounds: u32| {
        for r in from..from + rounds {
            for f in &frames {
                for _ in 0..8 {
                    p.push(u64::from(r), 0, f);
                }
            }
        }
    };
    push(&mut p, 0, 75);
    p.flush();
    assert!(
        p.events()
            .iter()
            .any(|e| matches!(e, WorkerEvent::Fault { tenant, .. } if *tenant == TenantId(4))),
        "the fault was reported: {:?}",
        p.events()
    );
    let faults = p.nf().faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    let f = &faults[0];
    assert_eq!((f.tenant, f.during), (TenantId(4), "buffet_pkt_handler"));
    assert_eq!(
        f.kind,
        FaultKind::Signal {
            signal: libc::SIGSEGV,
            code: 1
        }
    );
    assert_eq!(f.addr, 0);
    let text = f.to_string();
    assert!(
        text.contains("raised SIGSEGV at 0x0 (address not mapped)"),
        "{text}"
    );
    // After the fault: more traffic through the same workers.
    push(&mut p, 75, 25);
    let report = p.finish();
    let victim = report.tenants.iter().find(|t| t.id == TenantId(4)).unwrap();
    assert!(victim.quarantined);
    assert_eq!((victim.packets, victim.passed), (800, 50));
    let mut shares_worker = false;
    for t in report.tenants.iter().filter(|t| t.id != TenantId(4)) {
        assert!(!t.quarantined, "tenant {}", t.id);
        assert_eq!((t.packets, t.passed), (800, 800), "tenant {}", t.id);
        assert_eq!(t.nf.get("packets"), Some(&800), "tenant {}", t.id);
        assert_eq!(t.nf.get("canary"), Some(&(1000 * u64::from(t.id.0))));
        shares_worker |= t.worker == victim.worker;
    }
    assert!(
        shares_worker,
        "some tenant ran on the faulting tenant's worker after the fault"
    );
}

/// A write one byte past the tenant's region hits the guard page after it: contained and
/// reported as a guard-page fault, as under MPK.
#[test]
fn a_guard_page_overrun_is_contained_without_protection_keys() {
    let mut p = Pipeline::new(load("malicious"), cfg(2, Domain::None)).unwrap();
    for t in 1..=3 {
        let policy = if t == 2 {
            json!({ "attack": "overrun", "attack_after": 3, "canary": 2000 })
        } else {
            json!({ "canary": 1000 * t })
        };
        p.admit(spec(t, policy)).unwrap();
    }
    for r in 0..10u64 {
        for t in 1..=3 {
            for _ in 0..4 {
                p.push(r, 0, &frame(t, 53, FRAME_PAYLOAD));
            }
        }
    }
    p.flush();
    let faults = p.nf().faults();
    let report = p.finish();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!(faults[0].tenant, TenantId(2));
    assert_eq!(faults[0].kind, FaultKind::GuardPage);
    for t in &report.tenants {
        let expect = if t.id == TenantId(2) { 3 } else { 40 };
        assert_eq!(t.passed, expect, "tenant {}", t.id);
        assert_eq!(t.quarantined, t.id == TenantId(2));
    }
}

/// `CNf::load("nf.so")` opens ./nf.so: dlopen alone would search the library path.
/// Runs itself in a child process whose working directory holds the object.
#[test]
fn a_bare_file_name_is_the_file_in_the_current_directory() {
    const CHILD: &str = "BUFFET_CNF_BARE_NAME_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let nf = CNf::load(std::path::Path::new("bare-portblock.so")).unwrap();
        assert_eq!(nf.path(), std::path::Path::new("bare-portblock.so"));
        println!("child: loaded {}", buffet_sdk::NetworkFunction::name(&nf));
        let e = CNf::load(std::path::Path::new("missing.so"))
            .unwrap_err()
            .to_string();
        println!("child: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        example_nf("portblock"),
        dir.path().join("bare-portblock.so"),
    )
    .unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_bare_file_name_is_the_file_in_the_current_directory",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("child: loaded portblock"), "{stdout}");
    // The error names the file as given.
    assert!(
        stdout.contains("child: cannot load C NF missing.so: "),
        "{stdout}"
    );
}
