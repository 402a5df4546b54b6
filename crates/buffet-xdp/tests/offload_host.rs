//! The host half of the nfp offload (buffet-xdp's `offload::OffloadDispatcher`) over the
//! offloaded program's own maps in the kernel: frames run through the program's host
//! build with BPF_PROG_TEST_RUN, the host reads its counters, polices within a timeslot,
//! and at the boundary moves tenants off an overloaded worker by rewriting their rows;
//! the next frames go to the new worker. Its classifier subset decides as buffet-dispatch's
//! classifier for every rule set it admits, and refuses, changing nothing, what it cannot
//! express. Needs CAP_BPF and CAP_NET_ADMIN (root); skipped otherwise (a failure in CI).

mod common;

use buffet_dispatch::classifier::{Classifier, Rule};
use buffet_dispatch::{Event, Match, OverloadReport, TenantSlot, WorkerId};
use buffet_sdk::{Packet, PacketMeta};
use buffet_testkit::rng::Rng;
use buffet_xdp::offload::{
    Move, OffloadAdmitError, OffloadConfig, OffloadDispatcher, OffloadVerdict,
};
use common::{ready, rule, udp4};
use etherparse::{PacketBuilder, SlicedPacket};

/// Timeslots of 1,024 ns of virtual time; reports from the first detection on.
const SHIFT: u32 = 10;
const SLOT: u64 = 1 << SHIFT;

fn loaded(workers: &[u64]) -> OffloadDispatcher {
    let mut x = OffloadDispatcher::load_host_build(OffloadConfig {
        shift: SHIFT,
        threshold: 0,
    })
    .unwrap();
    for &m in workers {
        x.add_worker(m).unwrap();
    }
    x
}

fn tcp6(dst: [u8; 16], dport: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6([0xfd; 16], dst, 64)
        .tcp(4000, dport, 1, 1024);
    let mut out = Vec::new();
    b.write(&mut out, b"payload").unwrap();
    out
}

const V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

fn pass(x: &mut OffloadDispatcher, frame: &[u8]) -> (u32, u16) {
    match x.run(frame).unwrap().0 {
        OffloadVerdict::Pass { tenant, worker } => (tenant.0, worker.0),
        other => panic!("expected a pass, got {other:?}"),
    }
}

/// Tenants 0 (exact UDP rule) and 1 (address only) on worker 0, tenant 2 (exact IPv6
/// TCP rule) on worker 1; both workers of MAX_NB 10. Worker 0 carries 12 packets in
/// slot 0: at the boundary tenant 0 (8 packets) moves to worker 1 (1 + 8 < 10), and
/// worker 0 is reported; its next frames go to worker 1, tagged as before.
#[test]
fn the_boundary_moves_a_tenant_from_the_nics_counters() {
    if !ready("offload_host::the_boundary_moves_a_tenant_from_the_nics_counters") {
        return;
    }
    let mut x = loaded(&[10, 10]);
    let (w0, w1) = (WorkerId(0), WorkerId(1));
    x.admit(
        TenantSlot(0),
        &[(1, rule("dst_ip=10.0.0.1/32,protocol=17,dst_port=80"))],
        0,
        w0,
    )
    .unwrap();
    x.admit(TenantSlot(1), &[(1, rule("dst_ip=10.0.0.2/32"))], 0, w0)
        .unwrap();
    x.admit(
        TenantSlot(2),
        &[(1, rule("dst_ip=2001:db8::1/128,protocol=6,dst_port=443"))],
        0,
        w1,
    )
    .unwrap();
    assert_eq!(
        x.tick(0).unwrap().boundary,
        None,
        "the first tick starts slot 0"
    );

    let (t0, t1, t2) = (
        udp4([10, 0, 0, 1], 80),
        udp4([10, 0, 0, 2], 9),
        tcp6(V6, 443),
    );
    for _ in 0..8 {
        assert_eq!(pass(&mut x, &t0), (0, 0));
    }
    for _ in 0..4 {
        assert_eq!(pass(&mut x, &t1), (1, 0));
    }
    let (v, out) = x.run(&t2).unwrap();
    assert_eq!(
        v,
        OffloadVerdict::Pass {
            tenant: TenantSlot(2),
            worker: w1
        }
    );
    // IPv6: the tenant slot in the traffic class's DSCP bits.
    let ip6 = etherparse::Ipv6HeaderSlice::from_slice(&out[14..]).unwrap();
    assert_eq!(ip6.traffic_class() >> 2, 2, "tenant 2 tagged in DSCP");
    assert_eq!(x.worker_packets().unwrap(), [12, 1]);
    // Same slot: nothing moves, nobody is policed (no MAX_NB).
    assert_eq!(x.tick(SLOT - 1).unwrap(), Default::default());

    let tick = x.tick(SLOT).unwrap();
    let plan = tick.boundary.expect("a boundary");
    assert_eq!(
        plan.moves,
        [Move {
            tenant: TenantSlot(0),
            from: w0,
            to: w1
        }]
    );
    assert_eq!(
        plan.overloads,
        [OverloadReport {
            worker: w0,
            slot: 1
        }]
    );
    assert_eq!(
        x.row(TenantSlot(0)).unwrap(),
        (w1, false),
        "the move is in the NIC's row"
    );
    assert_eq!(x.row(TenantSlot(1)).unwrap(), (w0, false));
    assert_eq!(
        x.drain_events(),
        [
            Event::Migration {
                tenant: TenantSlot(0),
                from: w0,
                to: w1,
                slot: 1
            },
            Event::Overload {
                worker: w0,
                slot: 1
            }
        ]
    );
    let (v, out) = x.run(&t0).unwrap();
    assert_eq!(
        v,
        OffloadVerdict::Pass {
            tenant: TenantSlot(0),
            worker: w1
        }
    );
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&out[14..]).unwrap();
    assert_eq!(ip.dcp().value(), 0, "tenant 0 tagged in DSCP");
    assert_eq!(
        ip.to_header().calc_header_checksum(),
        ip.header_checksum(),
        "the checksum was fixed after the tag"
    );
    assert_eq!(pass(&mut x, &t1), (1, 0));
    assert_eq!(x.worker_packets().unwrap(), [13, 2]);
    // Slot 1 carried 1 on worker 0 and 2 on worker 1: a quiet boundary.
    let plan = x.tick(2 * SLOT).unwrap().boundary.unwrap();
    assert!(
        plan.moves.is_empty() && plan.overloads.is_empty(),
        "{plan:?}"
    );
}

/// A tenant of MAX_NB 3 is policed by the first tick after its fourth packet of the
/// timeslot (the NIC has no clock: it passes what arrives before the host looks), its
/// packets are dropped and still counted as its own, and the boundary lifts it.
#[test]
fn the_host_polices_within_the_slot_and_the_boundary_lifts_it() {
    if !ready("offload_host::the_host_polices_within_the_slot_and_the_boundary_lifts_it") {
        return;
    }
    let mut x = loaded(&[1000]);
    let (t, other) = (TenantSlot(5), TenantSlot(6));
    x.admit(t, &[(1, rule("dst_ip=10.0.0.5/32"))], 3, WorkerId(0))
        .unwrap();
    x.admit(other, &[(1, rule("dst_ip=10.0.0.6/32"))], 3, WorkerId(0))
        .unwrap();
    x.tick(0).unwrap();
    let (f, g) = (udp4([10, 0, 0, 5], 1), udp4([10, 0, 0, 6], 1));
    for _ in 0..2 {
        assert_eq!(pass(&mut x, &f), (5, 0));
    }
    // IPv4: the tenant slot in DSCP, the ECN bits kept, the checksum fixed.
    let mut ecn = f.clone();
    ecn[15] = 0x02;
    let h = etherparse::Ipv4HeaderSlice::from_slice(&ecn[14..])
        .unwrap()
        .to_header();
    ecn[24..26].copy_from_slice(&h.calc_header_checksum().to_be_bytes());
    let (v, out) = x.run(&ecn).unwrap();
    assert_eq!(
        v,
        OffloadVerdict::Pass {
            tenant: t,
            worker: WorkerId(0)
        }
    );
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&out[14..]).unwrap();
    assert_eq!((ip.dcp().value(), ip.ecn().value()), (5, 2), "{out:02x?}");
    assert_eq!(
        ip.to_header().calc_header_checksum(),
        ip.header_checksum(),
        "the checksum was fixed after the tag"
    );
    assert!(
        x.tick(1).unwrap().policed.is_empty(),
        "3 is within MAX_NB 3"
    );
    assert_eq!(pass(&mut x, &f), (5, 0), "the host has not looked yet");
    let tick = x.tick(2).unwrap();
    assert_eq!(tick.policed, [t]);
    assert_eq!(x.row(t).unwrap(), (WorkerId(0), true));
    assert_eq!(x.run(&f).unwrap().0, OffloadVerdict::Policed(t));
    assert_eq!(x.run(&f).unwrap().0, OffloadVerdict::Policed(t));
    assert_eq!(pass(&mut x, &g), (6, 0), "the other tenant is not policed");
    assert_eq!(x.drops().unwrap(), (0, 0, 2));
    assert_eq!(
        x.tenant_packets(t).unwrap(),
        6,
        "policed packets count as its own"
    );
    assert_eq!(x.worker_packets().unwrap(), [5], "but not as its worker's");
    assert!(x.tick(3).unwrap().policed.is_empty(), "policed once");
    x.tick(SLOT).unwrap().boundary.unwrap();
    assert_eq!(
        x.row(t).unwrap(),
        (WorkerId(0), false),
        "lifted at the boundary"
    );
    assert_eq!(pass(&mut x, &f), (5, 0));
    // Policed again, then removed and its slot admitted afresh: a new row, not policed,
    // and its count in the timeslot starts from its admission.
    for _ in 0..4 {
        pass(&mut x, &f);
    }
    assert_eq!(x.tick(SLOT + 1).unwrap().policed, [t]);
    x.remove(t).unwrap();
    assert_eq!(x.run(&f).unwrap().0, OffloadVerdict::Unmatched);
    x.admit(t, &[(1, rule("dst_ip=10.0.0.7/32"))], 3, WorkerId(0))
        .unwrap();
    assert_eq!(x.row(t).unwrap(), (WorkerId(0), false));
    let h = udp4([10, 0, 0, 7], 1);
    for _ in 0..3 {
        assert_eq!(pass(&mut x, &h), (5, 0));
    }
    assert!(
        x.tick(SLOT + 2).unwrap().policed.is_empty(),
        "3 since its admission"
    );
}

/// A policed tenant's packets are its own (`tmp`) but never reach its worker: they do
/// not make the worker look overloaded (docs/scheduler.md step 2: the worker is not
/// charged), so nothing moves and nothing is reported.
#[test]
fn policed_packets_do_not_load_the_worker() {
    if !ready("offload_host::policed_packets_do_not_load_the_worker") {
        return;
    }
    let mut x = loaded(&[10, 10]);
    let t = TenantSlot(0);
    x.admit(t, &[(1, rule("dst_ip=10.0.0.1/32"))], 4, WorkerId(0))
        .unwrap();
    x.tick(0).unwrap();
    let f = udp4([10, 0, 0, 1], 1);
    for _ in 0..5 {
        pass(&mut x, &f);
    }
    assert_eq!(x.tick(1).unwrap().policed, [t]);
    for _ in 0..20 {
        assert_eq!(x.run(&f).unwrap().0, OffloadVerdict::Policed(t));
    }
    assert_eq!(x.tenant_packets(t).unwrap(), 25);
    assert_eq!(x.worker_packets().unwrap(), [5, 0]);
    // 25 >= MAX_NB 10 by the tenant's count, 5 < 10 by what reached the worker.
    let plan = x.tick(SLOT).unwrap().boundary.unwrap();
    assert!(
        plan.moves.is_empty() && plan.overloads.is_empty(),
        "{plan:?}"
    );
    assert!(x.drain_events().is_empty());
}

/// Ticks that miss timeslots spread the counts over the slots they cover: 30 packets
/// over three slots are 10 a slot, at MAX_NB 10 an overload; over one, 30.
#[test]
fn a_late_tick_spreads_the_counts_over_the_slots_it_missed() {
    if !ready("offload_host::a_late_tick_spreads_the_counts_over_the_slots_it_missed") {
        return;
    }
    for (late_slots, overloaded) in [(3u64, true), (4, false)] {
        let mut x = loaded(&[10, 100]);
        x.admit(
            TenantSlot(0),
            &[(1, rule("dst_ip=10.0.0.1/32"))],
            0,
            WorkerId(0),
        )
        .unwrap();
        x.tick(0).unwrap();
        let f = udp4([10, 0, 0, 1], 1);
        for _ in 0..30 {
            pass(&mut x, &f);
        }
        let plan = x.tick(late_slots * SLOT).unwrap().boundary.unwrap();
        // 30 / 3 = 10 >= 10: overloaded, and worker 1 (0 + 10 < 100) takes the tenant.
        assert_eq!(!plan.moves.is_empty(), overloaded, "{late_slots}: {plan:?}");
    }
}

/// Each rule the exact-match tables cannot express is refused with what it asks for,
/// and nothing is written: the frames still go where they went.
#[test]
fn rules_it_cannot_express_are_refused_and_change_nothing() {
    if !ready("offload_host::rules_it_cannot_express_are_refused_and_change_nothing") {
        return;
    }
    let mut x = loaded(&[100, 100]);
    x.admit(
        TenantSlot(0),
        &[
            (5, rule("dst_ip=10.0.0.1/32,protocol=17,dst_port=53")),
            (5, rule("dst_ip=10.0.0.3/32")),
        ],
        0,
        WorkerId(0),
    )
    .unwrap();
    let probes = [
        udp4([10, 0, 0, 1], 53),
        udp4([10, 0, 0, 1], 54),
        udp4([10, 0, 0, 3], 9),
        udp4([10, 0, 0, 2], 9),
        udp4([10, 0, 0, 4], 80),
    ];
    let before: Vec<OffloadVerdict> = probes.iter().map(|p| x.run(p).unwrap().0).collect();
    assert_eq!(
        before[..4],
        [
            OffloadVerdict::Pass {
                tenant: TenantSlot(0),
                worker: WorkerId(0)
            },
            OffloadVerdict::Unmatched,
            OffloadVerdict::Pass {
                tenant: TenantSlot(0),
                worker: WorkerId(0)
            },
            OffloadVerdict::Unmatched,
        ]
    );
    // (rules, what the message must say). Each set's last rule is the bad one, after a
    // good one that must not be left behind.
    let good = (1, rule("dst_ip=10.0.0.4/32,protocol=17,dst_port=80"));
    let cases: Vec<((u32, Match), &str)> = vec![
        ((1, rule("dst_ip=10.0.0.0/24")), "10.0.0.0/24 is a prefix"),
        (
            (1, rule("dst_ip=10.0.0.2/32,protocol=6,dst_port=80-90")),
            "the port range 80-90",
        ),
        (
            (1, rule("dst_ip=10.0.0.2/32,src_ip=10.9.0.0/16")),
            "it matches src_ip",
        ),
        (
            (1, rule("dst_ip=10.0.0.2/32,protocol=1")),
            "protocol 1 without a destination port",
        ),
        (
            (1, rule("dst_ip=10.0.0.2/32,protocol=132,dst_port=80")),
            "ports of protocol 132",
        ),
        (
            (1, rule("dst_ip=10.0.0.2/32,dst_port=80")),
            "a destination port without protocol tcp or udp",
        ),
        (
            (1, rule("protocol=17,dst_port=80")),
            "no destination address",
        ),
        (
            (1, rule("dst_ip=10.0.0.1/32,protocol=17,dst_port=53")),
            "10.0.0.1 udp/53 already belongs to tenant slot 0",
        ),
        // Tenant 0's exact rule on 10.0.0.1 has priority 5; an address-only rule of
        // priority 4 would win in software but lose in the NIC.
        ((4, rule("dst_ip=10.0.0.1/32")), "priority 4"),
        // An exact rule of priority 5 ties tenant 0's address-only 10.0.0.3 (priority 5,
        // admitted first, so it wins in software); the NIC would pick the exact one.
        (
            (5, rule("dst_ip=10.0.0.3/32,protocol=17,dst_port=9")),
            "the NIC always prefers exact rules",
        ),
    ];
    for (bad, want) in cases {
        let err = x
            .admit(TenantSlot(1), &[good.clone(), bad.clone()], 0, WorkerId(1))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, OffloadAdmitError::Rule { .. }),
            "{bad:?}: {msg}"
        );
        assert!(msg.contains(want), "{bad:?}: {msg:?} should say {want:?}");
        assert!(msg.contains("rule 1"), "{msg}");
        assert!(x.check_rules(&[bad]).is_err(), "check_rules refuses it too");
        let after: Vec<OffloadVerdict> = probes.iter().map(|p| x.run(p).unwrap().0).collect();
        assert_eq!(after, before, "nothing written after refusing {want:?}");
        assert_eq!(x.worker_of(TenantSlot(1)), None);
    }
    // What is allowed next to tenant 0's rules: its address-only rule behind a better
    // exact one, and an address-only rule of worse priority than tenant 0's exact one.
    x.admit(
        TenantSlot(1),
        &[
            good,
            (4, rule("dst_ip=10.0.0.3/32,protocol=17,dst_port=9")),
            (6, rule("dst_ip=10.0.0.1/32")),
        ],
        0,
        WorkerId(1),
    )
    .unwrap();
    assert_eq!(pass(&mut x, &probes[0]), (0, 0));
    assert_eq!(pass(&mut x, &probes[1]), (1, 1), "10.0.0.1 other ports");
    assert_eq!(pass(&mut x, &probes[2]), (1, 1), "the exact rule wins");
    assert_eq!(pass(&mut x, &probes[4]), (1, 1));
    // A tenant's best priority on a key is what counts: tenant 2's address-only rules on
    // 10.0.0.8 at 1 and 5 beat an exact rule of priority 3 in software.
    x.admit(
        TenantSlot(2),
        &[
            (1, rule("dst_ip=10.0.0.8/32")),
            (5, rule("dst_ip=10.0.0.8/32")),
        ],
        0,
        WorkerId(0),
    )
    .unwrap();
    let err = x
        .admit(
            TenantSlot(3),
            &[(3, rule("dst_ip=10.0.0.8/32,protocol=17,dst_port=80"))],
            0,
            WorkerId(0),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("this exact rule (priority 3) would lose to tenant slot 2's address-only rule (priority 1)")
            && err.contains("give this rule a priority below 1"),
        "{err}"
    );
    x.remove(TenantSlot(2)).unwrap();
    // Slots, workers, duplicates.
    let r = [(1, rule("dst_ip=10.0.0.9/32"))];
    let msg = |e: OffloadAdmitError| e.to_string();
    assert!(msg(x.admit(TenantSlot(64), &r, 0, WorkerId(0)).unwrap_err()).contains("0..64"));
    assert!(msg(x.admit(TenantSlot(2), &r, 0, WorkerId(2)).unwrap_err()).contains("no worker 2"));
    assert!(
        msg(x.admit(TenantSlot(1), &r, 0, WorkerId(0)).unwrap_err()).contains("already admitted")
    );
    // Removing tenant 1 takes its keys out; its slot can be admitted afresh.
    x.remove(TenantSlot(1)).unwrap();
    assert_eq!(x.run(&probes[4]).unwrap().0, OffloadVerdict::Unmatched);
    assert_eq!(pass(&mut x, &probes[2]), (0, 0), "tenant 0's rule again");
    x.admit(TenantSlot(1), &r, 0, WorkerId(0)).unwrap();
    assert_eq!(pass(&mut x, &udp4([10, 0, 0, 9], 1)), (1, 0));
    assert!(matches!(
        x.remove(TenantSlot(7)),
        Err(OffloadAdmitError::NotAdmitted(_))
    ));
}

/// Unparsable frames are dropped and counted, never passed.
#[test]
fn malformed_frames_are_counted_and_dropped() {
    if !ready("offload_host::malformed_frames_are_counted_and_dropped") {
        return;
    }
    let mut x = loaded(&[100]);
    x.admit(
        TenantSlot(0),
        &[(1, rule("dst_ip=10.0.0.1/32"))],
        0,
        WorkerId(0),
    )
    .unwrap();
    let good = udp4([10, 0, 0, 1], 80);
    let mut bad_version = good.clone();
    bad_version[14] = 0x35;
    let arp = {
        let mut f = good[..42].to_vec();
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f
    };
    for f in [&good[..20], &good[..36], &bad_version[..], &arp[..]] {
        assert_eq!(x.run(f).unwrap().0, OffloadVerdict::Malformed, "{f:02x?}");
    }
    assert_eq!(x.drops().unwrap(), (4, 0, 0));
    assert_eq!(x.worker_packets().unwrap(), [0]);
}

/// Random rule sets over a few addresses, admitted where the NIC accepts them (and
/// into buffet-dispatch's classifier only then), and random frames to those
/// addresses: UDP, TCP, ICMP, IPv4 and IPv6, VLAN-tagged or not, first and later
/// fragments. For every frame, the tenant the NIC picks is the software classifier's.
#[test]
fn what_it_admits_classifies_as_the_software_classifier() {
    if !ready("offload_host::what_it_admits_classifies_as_the_software_classifier") {
        return;
    }
    let addrs4: [[u8; 4]; 3] = [[10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 3]];
    let addrs6: [[u8; 16]; 2] = [V6, {
        let mut a = V6;
        a[15] = 2;
        a
    }];
    let ports = [53u16, 80, 443];
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let (mut admitted, mut refused, mut frames) = (0, 0, 0);
    for round in 0..12 {
        let mut x = loaded(&[1 << 40, 1 << 40]);
        let mut c = Classifier::new();
        for slot in 0..8u32 {
            let n = 1 + rng.below(3) as usize;
            let rules: Vec<(u32, Match)> = (0..n)
                .map(|_| {
                    let v6 = rng.below(3) == 0;
                    let dst = if v6 {
                        let a = addrs6[rng.below(2) as usize];
                        format!("{}/128", std::net::Ipv6Addr::from(a))
                    } else {
                        let a = addrs4[rng.below(3) as usize];
                        format!("{}/32", std::net::Ipv4Addr::from(a))
                    };
                    let text = match rng.below(3) {
                        0 => format!("dst_ip={dst}"),
                        k => format!(
                            "dst_ip={dst},protocol={},dst_port={}",
                            if k == 1 { 17 } else { 6 },
                            ports[rng.below(3) as usize]
                        ),
                    };
                    (rng.below(4) as u32, rule(&text))
                })
                .collect();
            if x.admit(TenantSlot(slot), &rules, 0, WorkerId((slot % 2) as u16))
                .is_err()
            {
                refused += 1;
                continue;
            }
            admitted += 1;
            for (priority, fields) in rules {
                c.insert(Rule {
                    priority,
                    tenant: TenantSlot(slot),
                    fields,
                })
                .unwrap();
            }
        }
        for _ in 0..200 {
            let v6 = rng.below(3) == 0;
            let port = if rng.below(4) == 0 {
                1234
            } else {
                ports[rng.below(3) as usize]
            };
            let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
            let proto = rng.below(3);
            let mut f = Vec::new();
            let vlan = rng.below(4) == 0;
            if v6 {
                let dst = addrs6[rng.below(2) as usize];
                let b = if vlan {
                    eth.single_vlan(7u16.try_into().unwrap())
                        .ipv6([0xfd; 16], dst, 64)
                } else {
                    eth.ipv6([0xfd; 16], dst, 64)
                };
                match proto {
                    0 => b.udp(1, port).write(&mut f, b"x").unwrap(),
                    1 => b.tcp(1, port, 1, 1024).write(&mut f, b"x").unwrap(),
                    _ => b.icmpv6_echo_request(1, 1).write(&mut f, b"x").unwrap(),
                }
            } else {
                let dst = addrs4[rng.below(3) as usize];
                let b = if vlan {
                    eth.single_vlan(7u16.try_into().unwrap())
                        .ipv4([172, 16, 0, 1], dst, 64)
                } else {
                    eth.ipv4([172, 16, 0, 1], dst, 64)
                };
                match proto {
                    0 => b.udp(1, port).write(&mut f, b"x").unwrap(),
                    1 => b.tcp(1, port, 1, 1024).write(&mut f, b"x").unwrap(),
                    _ => b.icmpv4_echo_request(1, 1).write(&mut f, b"x").unwrap(),
                }
                // A later fragment (offset 8 bytes) now and then: no ports in it.
                if rng.below(5) == 0 {
                    let ip = if vlan { 18 } else { 14 };
                    f[ip + 6] = 0x00;
                    f[ip + 7] = 0x01;
                    let h = etherparse::Ipv4HeaderSlice::from_slice(&f[ip..])
                        .unwrap()
                        .to_header();
                    let sum = h.calc_header_checksum().to_be_bytes();
                    f[ip + 10..ip + 12].copy_from_slice(&sum);
                }
            }
            assert!(SlicedPacket::from_ethernet(&f).is_ok());
            let nic = match x.run(&f).unwrap().0 {
                OffloadVerdict::Pass { tenant, .. } => Some(tenant),
                OffloadVerdict::Unmatched => None,
                other => panic!("round {round}: {other:?} for {f:02x?}"),
            };
            let mut buf = f.clone();
            let sw = Packet::parse(&mut buf, PacketMeta::default())
                .ok()
                .and_then(|p| c.lookup(&p));
            assert_eq!(nic, sw, "round {round}: frame {f:02x?}");
            frames += 1;
        }
    }
    // The sets must exercise both outcomes.
    assert!(
        admitted > 40 && refused > 5,
        "{admitted} admitted, {refused} refused"
    );
    assert_eq!(frames, 12 * 200);
}

/// The one documented difference from the software classifier: the NIC reads no ports
/// of an IPv4 packet with options, so only an address-only rule can match it.
#[test]
fn ipv4_options_hide_the_ports_from_the_nic() {
    if !ready("offload_host::ipv4_options_hide_the_ports_from_the_nic") {
        return;
    }
    let mut x = loaded(&[100]);
    x.admit(
        TenantSlot(0),
        &[(1, rule("dst_ip=10.0.0.1/32,protocol=17,dst_port=80"))],
        0,
        WorkerId(0),
    )
    .unwrap();
    let plain = udp4([10, 0, 0, 1], 80);
    // The same datagram with 4 bytes of options (NOP x 3, EOL): IHL 6.
    let mut opts = plain[..34].to_vec();
    opts[14] = 0x46;
    opts.extend_from_slice(&[1, 1, 1, 0]);
    opts.extend_from_slice(&plain[34..]);
    let total = (opts.len() - 14) as u16;
    opts[16..18].copy_from_slice(&total.to_be_bytes());
    let h = etherparse::Ipv4HeaderSlice::from_slice(&opts[14..])
        .unwrap()
        .to_header();
    opts[24..26].copy_from_slice(&h.calc_header_checksum().to_be_bytes());
    assert_eq!(pass(&mut x, &plain), (0, 0));
    assert_eq!(x.run(&opts).unwrap().0, OffloadVerdict::Unmatched);
    let mut c = Classifier::new();
    c.insert(Rule {
        priority: 1,
        tenant: TenantSlot(0),
        fields: rule("dst_ip=10.0.0.1/32,protocol=17,dst_port=80"),
    })
    .unwrap();
    let mut buf = opts.clone();
    let p = Packet::parse(&mut buf, PacketMeta::default()).unwrap();
    assert_eq!(
        c.lookup(&p),
        Some(TenantSlot(0)),
        "the software classifier reads the ports after the options"
    );
    x.admit(
        TenantSlot(1),
        &[(2, rule("dst_ip=10.0.0.1/32"))],
        0,
        WorkerId(0),
    )
    .unwrap();
    assert_eq!(
        pass(&mut x, &opts),
        (1, 0),
        "an address-only rule matches it"
    );
}
