//! Pointers a C NF hands over are never read by Buffet itself: a counter name or
//! `buffet_nf_name` result that cannot be read is copied inside the guarded call, so it is
//! the NF's contained fault (the tenant quarantined, or the load refused), never a crash
//! of the process; a crash in `buffet_mem_register` or `buffet_abi_version` refuses the
//! load. Runs at trusted-native (no `pku` needed); the load-time cases also at the `mpk`
//! containment (`Containment::Guarded`), which loading alone does not need `pku` for.

mod common;

use std::path::{Path, PathBuf};

use buffet_cnf::{CNf, CNfLoadError, Containment, FaultKind};
use buffet_memory::Domain;
use buffet_sdk::{NetworkFunction, TenantId};
use buffet_worker::{Pipeline, WorkerEvent};
use common::{build_nf, cfg, frame, spec, NF_CFLAGS};
use serde_json::json;

/// tests/nf/names.c built with `define` (`-D<define>`), or plain for `None`.
fn names_nf(define: Option<&str>) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nf/names.c");
    let mut flags: Vec<String> = NF_CFLAGS.iter().map(|s| (*s).to_owned()).collect();
    let out = match define {
        Some(d) => {
            flags.push(format!("-D{d}"));
            format!("names-{}", d.to_lowercase())
        }
        None => "names".to_owned(),
    };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    build_nf(&src, &out, &flags)
}

const LEVELS: [Containment; 2] = [Containment::AnyFault, Containment::Guarded];

#[test]
fn a_bad_counter_name_quarantines_its_tenant_and_the_others_keep_exact_counts() {
    let nf = CNf::load_with(&names_nf(None), Containment::AnyFault).unwrap();
    assert_eq!(nf.name(), "names");
    let mut p = Pipeline::new(nf, cfg(2, Domain::None)).unwrap();
    // 2: a wild pointer; 3: a guard page of the tenant arena; 4: no NUL within 63 bytes;
    // 5: a crash in buffet_summary; 6: a null name (that counter is left out); 1, 7: fine.
    let modes = [
        (2, "badptr"),
        (3, "arena"),
        (4, "long"),
        (5, "crash"),
        (6, "null"),
    ];
    for t in 1..=7u32 {
        let mode = modes.iter().find(|(m, _)| *m == t).map_or("none", |m| m.1);
        p.admit(spec(t, json!({ "summary": mode, "canary": 100 * t })))
            .unwrap();
    }
    let push = |p: &mut Pipeline<CNf>, n: u64| {
        for r in 0..n {
            for t in 1..=7u32 {
                p.push(r, 0, &frame(t, 53, 20));
            }
        }
    };
    push(&mut p, 10);
    p.flush();
    // The summary reads every tenant's counters: the process survives the bad names.
    let report = p.report();
    for t in &report.tenants {
        let id = t.id.0;
        assert!(!t.quarantined, "tenant {id}");
        assert_eq!(t.packets, 10, "tenant {id}");
        match id {
            2..=5 => assert!(t.nf.is_empty(), "tenant {id}: {:?}", t.nf),
            6 => {
                assert_eq!(t.nf.get("packets"), Some(&10));
                assert_eq!(t.nf.get("canary"), Some(&600));
                assert_eq!(t.nf.len(), 2, "{:?}", t.nf);
            }
            _ => {
                assert_eq!(t.nf.get("packets"), Some(&10), "tenant {id}");
                assert_eq!(t.nf.get("second"), Some(&2), "tenant {id}");
                assert_eq!(t.nf.get("canary"), Some(&(100 * u64::from(id))));
            }
        }
    }
    let faults = p.nf().faults();
    assert_eq!(faults.len(), 4, "{faults:?}");
    for f in &faults {
        assert_eq!(f.during, "buffet_summary", "{f}");
    }
    let of = |t: u32| faults.iter().find(|f| f.tenant == TenantId(t)).unwrap();
    assert_eq!(
        of(2).kind,
        FaultKind::Signal {
            signal: libc::SIGSEGV,
            code: 1
        }
    );
    assert_eq!(of(2).addr, 0x1234);
    assert_eq!(of(3).kind, FaultKind::GuardPage, "{}", of(3));
    assert!(
        matches!(of(4).kind, FaultKind::BadName { index: 1, .. }),
        "{}",
        of(4)
    );
    assert_eq!(
        of(4).to_string(),
        "tenant 4: buffet_summary returned counter 1 with a name that is not \
         NUL-terminated within 63 bytes"
    );
    assert_eq!(of(5).addr, 0);
    assert!(
        of(2)
            .to_string()
            .starts_with("tenant 2: buffet_summary raised SIGSEGV at 0x1234 (address not mapped)"),
        "{}",
        of(2)
    );
    // A second summary does not call the NF again for them (no new fault records).
    let _ = p.report();
    assert_eq!(p.nf().faults().len(), 4);

    // Their next packet quarantines them, saying why; the others carry on, exactly.
    push(&mut p, 10);
    p.flush();
    let events = p.events().to_vec();
    for t in 2..=5u32 {
        let message = events
            .iter()
            .find_map(|e| match e {
                WorkerEvent::Fault {
                    tenant, message, ..
                } if *tenant == TenantId(t) => Some(message.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("tenant {t} was not quarantined: {events:?}"));
        assert!(message.contains("buffet_summary"), "tenant {t}: {message}");
    }
    assert_eq!(p.nf().faults().len(), 4, "{:?}", p.nf().faults());
    let report = p.finish();
    for t in &report.tenants {
        let id = t.id.0;
        let bad = (2..=5).contains(&id);
        assert_eq!(t.quarantined, bad, "tenant {id}");
        if bad {
            assert_eq!((t.packets, t.passed), (20, 10), "tenant {id}");
        } else {
            assert_eq!((t.packets, t.passed), (20, 20), "tenant {id}");
            assert_eq!(t.nf.get("packets"), Some(&20), "tenant {id}");
            assert_eq!(t.nf.get("canary"), Some(&(100 * u64::from(id))));
        }
    }
}

/// A tenant whose summary faults before its first packet: the fault is recorded, under
/// its id, at that packet, which quarantines it.
#[test]
fn a_summary_fault_before_any_packet_is_recorded_at_the_tenants_first_packet() {
    let nf = CNf::load_with(&names_nf(None), Containment::AnyFault).unwrap();
    let mut p = Pipeline::new(nf, cfg(1, Domain::None)).unwrap();
    p.admit(spec(1, json!({}))).unwrap();
    p.admit(spec(2, json!({ "summary": "badptr" }))).unwrap();
    let report = p.report();
    assert!(report
        .tenants
        .iter()
        .all(|t| t.id == TenantId(1) || t.nf.is_empty()));
    assert!(p.nf().faults().is_empty());
    for r in 0..4 {
        p.push(r, 0, &frame(1, 53, 20));
        p.push(r, 0, &frame(2, 53, 20));
    }
    p.flush();
    let faults = p.nf().faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!((faults[0].tenant, faults[0].addr), (TenantId(2), 0x1234));
    let report = p.finish();
    for t in &report.tenants {
        assert_eq!(t.quarantined, t.id == TenantId(2));
        let passed = if t.id == TenantId(2) { 0 } else { 4 };
        assert_eq!((t.packets, t.passed), (4, passed), "tenant {}", t.id);
    }
}

fn load_error(define: &str, containment: Containment) -> CNfLoadError {
    match CNf::load_with(&names_nf(Some(define)), containment) {
        Ok(nf) => panic!("{define} loaded: {nf:?}"),
        Err(e) => e,
    }
}

#[test]
fn an_unreadable_nf_name_refuses_the_load_naming_the_symbol() {
    for level in LEVELS {
        let e = load_error("NAME_BADPTR", level);
        assert!(
            matches!(
                e,
                CNfLoadError::Call {
                    symbol: "buffet_nf_name",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "the C NF's `buffet_nf_name` raised SIGSEGV at 0x1234 (address not mapped), \
             contained (a crash while loading refuses the NF): not loaded",
            "{level:?}"
        );
        let e = load_error("NAME_LONG", level).to_string();
        assert_eq!(
            e,
            "the C NF's `buffet_nf_name` returned a name that is not NUL-terminated within \
             63 bytes: not loaded",
            "{level:?}"
        );
    }
}

#[test]
fn a_crash_in_mem_register_or_abi_version_refuses_the_load() {
    for level in LEVELS {
        for (define, symbol) in [
            ("MEMREG_CRASH", "buffet_mem_register"),
            ("ABI_CRASH", "buffet_abi_version"),
        ] {
            let e = load_error(define, level).to_string();
            assert_eq!(
                e,
                format!(
                    "the C NF's `{symbol}` raised SIGSEGV at 0x0 (address not mapped), \
                     contained (a crash while loading refuses the NF): not loaded"
                ),
                "{level:?}"
            );
        }
    }
    // The process is still here, and loads a good NF after them.
    let nf = CNf::load_with(&names_nf(None), Containment::AnyFault).unwrap();
    assert!(nf.state_bytes() >= 20);
}
