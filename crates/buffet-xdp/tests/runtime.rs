//! The XDP Packet Dispatcher's maps changed while it runs (what buffetd does at run
//! time), checked through the program itself with BPF_PROG_TEST_RUN: a tenant's rules
//! and MAX_NB replaced in place (its row and counters kept), a dry-run rules check that
//! refuses what the classifier cannot express and changes nothing, and a worker's row
//! closed with its tenants moved to live workers. Needs CAP_BPF and CAP_NET_ADMIN (root);
//! skipped otherwise (a failure in CI).

mod common;

use buffet_dispatch::{TenantSlot, WorkerId};
use buffet_xdp::{
    AdmitError, RuleCheckError, WorkerTableError, XdpConfig, XdpDecision, XdpDispatcher, MAX_TUPLES,
};
use common::{ready, rule, udp4};

/// A test-mode dispatcher with `workers` workers of MAX_NB 1000 (never overloaded here).
fn loaded(workers: u16) -> XdpDispatcher {
    let mut x = XdpDispatcher::load(XdpConfig {
        test_mode: true,
        shift: 30,
        threshold: 3,
        ..XdpConfig::default()
    })
    .unwrap();
    for _ in 0..workers {
        x.add_worker(1000).unwrap();
    }
    x
}

/// The tenant a frame goes to at `ts` (None: unmatched), or the decision itself.
fn tenant_of(x: &mut XdpDispatcher, ts: u64, frame: &[u8]) -> Option<u32> {
    match x.run(ts, frame).unwrap().decision {
        XdpDecision::Pass { tenant, .. } => Some(tenant.0),
        XdpDecision::Unmatched => None,
        other => panic!("{other:?}"),
    }
}

#[test]
fn replace_rules_swaps_classification_and_keeps_the_row() {
    let test = "replace_rules_swaps_classification_and_keeps_the_row";
    if !ready(test) {
        return;
    }
    let mut x = loaded(2);
    let (t, other) = (TenantSlot(3), TenantSlot(4));
    x.admit(t, &[(10, rule("dst_ip=10.1.0.0/16"))], 0, WorkerId(1))
        .unwrap();
    x.admit(other, &[(10, rule("dst_ip=10.2.0.0/16"))], 0, WorkerId(0))
        .unwrap();
    let old_only = udp4([10, 1, 200, 1], 80);
    let both = udp4([10, 1, 0, 1], 80);
    let new_only = udp4([10, 3, 0, 1], 80);
    let others = udp4([10, 2, 0, 1], 80);
    let ts = 5u64 << 30;
    assert_eq!(tenant_of(&mut x, ts, &old_only), Some(3));
    assert_eq!(tenant_of(&mut x, ts, &both), Some(3));
    assert_eq!(tenant_of(&mut x, ts, &new_only), None);
    assert_eq!(x.tenant_row(t), Some((WorkerId(1), 2)));
    // New rules (another mask than the old one) and a MAX_NB of 3.
    x.replace_rules(
        t,
        &[
            (10, rule("dst_ip=10.1.0.0/24")),
            (10, rule("dst_ip=10.3.0.0/16")),
        ],
        3,
    )
    .unwrap();
    assert_eq!(tenant_of(&mut x, ts, &old_only), None, "old rule gone");
    assert_eq!(tenant_of(&mut x, ts, &both), Some(3));
    // Same worker, and the slot's count went on from 2 (the row was kept): the third
    // packet in this timeslot passes, the fourth is over the new MAX_NB.
    assert_eq!(x.tenant_row(t), Some((WorkerId(1), 3)));
    assert_eq!(
        x.run(ts, &new_only).unwrap().decision,
        XdpDecision::Policed(t)
    );
    assert_eq!(x.policed(t).unwrap(), 1);
    assert_eq!(
        tenant_of(&mut x, ts, &others),
        Some(4),
        "other tenant untouched"
    );
    // The next timeslot: under MAX_NB again.
    assert_eq!(tenant_of(&mut x, ts + (1 << 30), &new_only), Some(3));
    // Removing it takes the new rules out too.
    assert!(x.remove(t).unwrap());
    assert_eq!(tenant_of(&mut x, ts + (1 << 30), &both), None);
    assert_eq!(tenant_of(&mut x, ts + (1 << 30), &new_only), None);
    assert!(matches!(
        x.replace_rules(t, &[], 0),
        Err(AdmitError::NotAdmitted(TenantSlot(3)))
    ));
}

#[test]
fn a_rule_the_classifier_cannot_express_is_refused_by_a_dry_run_and_nothing_changes() {
    let test = "a_rule_the_classifier_cannot_express_is_refused_by_a_dry_run_and_nothing_changes";
    if !ready(test) {
        return;
    }
    let mut x = loaded(1);
    let t = TenantSlot(1);
    x.admit(t, &[(1, rule("dst_ip=10.1.0.0/16"))], 0, WorkerId(0))
        .unwrap();
    // 1-65534 on both ports: 15 x 15 = 225 masks, more than the program probes.
    let wide = rule("src_port=1-65534,dst_port=1-65534");
    let ok = rule("dst_ip=10.9.0.0/16");
    match x.check_rules(&[(1, ok.clone()), (2, wide.clone())]) {
        Err(e @ RuleCheckError::TooManyMasks { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("rules[1]: the XDP classifier cannot express it")
                    && msg.contains(&MAX_TUPLES.to_string()),
                "{msg}"
            );
        }
        r => panic!("{r:?}"),
    }
    x.check_rules(&[(1, ok.clone())]).unwrap();
    // An update to them is refused too, and the old rules keep classifying.
    assert!(matches!(
        x.replace_rules(t, &[(1, ok), (2, wide)], 0),
        Err(AdmitError::TooManyMasks { index: 1, .. })
    ));
    assert_eq!(tenant_of(&mut x, 0, &udp4([10, 1, 0, 1], 80)), Some(1));
    assert_eq!(tenant_of(&mut x, 0, &udp4([10, 9, 0, 1], 80)), None);
}

#[test]
fn closing_a_worker_moves_its_tenants_to_live_workers() {
    let test = "closing_a_worker_moves_its_tenants_to_live_workers";
    if !ready(test) {
        return;
    }
    let mut x = loaded(3);
    // Tenants 0..6 spread by least_loaded_worker: two per worker.
    for i in 0..6u8 {
        let w = x.least_loaded_worker(None).unwrap();
        assert_eq!(w, WorkerId(u16::from(i % 3)), "spread over the workers");
        x.admit(
            TenantSlot(u32::from(i)),
            &[(1, rule(&format!("dst_ip=10.{i}.0.0/16")))],
            0,
            w,
        )
        .unwrap();
    }
    let moves = x.close_worker(WorkerId(1)).unwrap();
    assert_eq!(moves.len(), 2);
    assert!(moves.iter().all(|(_, to)| *to != WorkerId(1)));
    assert_eq!(x.live_workers(), vec![WorkerId(0), WorkerId(2)]);
    // Every tenant's packets now go to a live worker; worker 1 gets nothing.
    for i in 0..6u8 {
        match x.run(1 << 30, &udp4([10, i, 0, 1], 80)).unwrap().decision {
            XdpDecision::Pass { worker, tenant, .. } => {
                assert_ne!(worker, WorkerId(1), "tenant {tenant:?}");
                assert_eq!(x.tenant_row(tenant).unwrap().0, worker);
            }
            other => panic!("{other:?}"),
        }
    }
    // A closed worker is never a migration target nor chosen for a new tenant.
    assert_ne!(x.least_loaded_worker(None), Some(WorkerId(1)));
    assert!(x.resettle(WorkerId(1)).is_empty());
    assert!(matches!(
        x.close_worker(WorkerId(1)),
        Err(WorkerTableError::NotLive(1))
    ));
    x.close_worker(WorkerId(0)).unwrap();
    assert!(matches!(
        x.close_worker(WorkerId(2)),
        Err(WorkerTableError::LastWorker(2))
    ));
    // A worker added later takes new tenants (it has the fewest).
    let w = x.add_worker(1000).unwrap();
    assert_eq!(w, WorkerId(3));
    assert_eq!(x.least_loaded_worker(None), Some(w));
    x.clear_worker_socket(WorkerId(1)).unwrap();
}
