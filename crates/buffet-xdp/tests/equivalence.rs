//! The XDP Packet Dispatcher in the kernel (BPF_PROG_TEST_RUN, injected timestamps)
//! against buffet-dispatch's Dispatcher: same decisions, events, tags and metadata for
//! seeded random rules and frames; and the admission errors for what the XDP maps cannot
//! hold. Needs CAP_BPF (root): skipped otherwise, a failure under
//! BUFFET_REQUIRE_PRIVILEGED=1 or CI.

use std::net::IpAddr;

use buffet_dispatch::{
    Decision, DispatchDrop, Dispatcher, DispatcherConfig, Event, Match, SchedulerConfig, TagMode,
    TenantSlot, UnmatchedPolicy, WorkerId,
};
use buffet_testkit::gate::{self, Capability};
use buffet_testkit::Rng;
use buffet_xdp::{AdmitError, XdpConfig, XdpDecision, XdpDispatcher, MAX_TENANTS, MAX_TUPLES};
use etherparse::{IpNumber, PacketBuilder};

fn ready(test: &str) -> bool {
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        return gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
    }
    gate::require_capabilities(test, &[Capability::Bpf, Capability::NetAdmin])
}

#[derive(Clone, Copy, Debug)]
struct Pk {
    in_port: u16,
    vlan: Option<u16>,
    src: IpAddr,
    dst: IpAddr,
    /// 6 TCP, 17 UDP, 132 SCTP, anything else: raw payload with that protocol.
    proto: u8,
    sport: u16,
    dport: u16,
    dscp: u8,
}

impl Pk {
    fn frame(&self) -> Vec<u8> {
        let ip = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
            _ => unreachable!("mixed versions"),
        };
        let mut l3 = Vec::new();
        match self.proto {
            6 => ip
                .tcp(self.sport, self.dport, 1, 1000)
                .write(&mut l3, b"tcp")
                .unwrap(),
            17 => ip
                .udp(self.sport, self.dport)
                .write(&mut l3, b"udp")
                .unwrap(),
            132 => {
                let mut sctp = Vec::new();
                sctp.extend(self.sport.to_be_bytes());
                sctp.extend(self.dport.to_be_bytes());
                sctp.extend([0, 0, 0, 7, 0, 0, 0, 0]);
                ip.write(&mut l3, IpNumber(132), &sctp).unwrap()
            }
            p => ip.write(&mut l3, IpNumber(p), b"raw").unwrap(),
        }
        buffet_dispatch::tag_dscp(&mut l3, 0, self.src.is_ipv4(), self.dscp).unwrap();
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if let Some(v) = self.vlan {
            f.extend(0x8100u16.to_be_bytes());
            f.extend(v.to_be_bytes());
        }
        f.extend(
            if self.src.is_ipv4() {
                0x0800u16
            } else {
                0x86dd
            }
            .to_be_bytes(),
        );
        f.extend(l3);
        f
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const V4: [&str; 8] = [
    "10.0.0.1",
    "10.0.1.7",
    "10.1.0.1",
    "10.1.2.3",
    "192.168.1.1",
    "192.168.7.9",
    "172.16.0.5",
    "0.0.0.1",
];
const V6: [&str; 5] = [
    "2001:db8::1",
    "2001:db8:1::1",
    "2001:db8:1:2::9",
    "fe80::1",
    "::ffff:10.0.0.1",
];
const PORTS: [u16; 10] = [53, 80, 443, 1024, 1500, 2047, 4100, 6000, 6009, 65535];

/// A random rule from a few shapes (prefixes, source prefixes, port ranges, exact
/// tuples, VLAN, DSCP), kept to few distinct masks so the XDP classifier holds them.
fn random_rule(rng: &mut Rng) -> Match {
    let pre = |rng: &mut Rng, pool: &[&str]| Some(rng.pick(pool).parse().unwrap());
    let range = |rng: &mut Rng| {
        Some(
            rng.pick(&["1024-2047", "4096-4351", "443", "6000-6009", "0-65535"])
                .parse()
                .unwrap(),
        )
    };
    match rng.below(9) {
        0 => Match {
            dst_ip: pre(
                rng,
                &[
                    "10.0.0.0/8",
                    "10.1.0.0/16",
                    "10.0.1.0/24",
                    "10.0.1.7/32",
                    "192.168.0.0/16",
                ],
            ),
            ..Match::default()
        },
        1 => Match {
            src_ip: pre(rng, &["10.0.0.0/16", "192.168.1.0/24", "172.16.0.0/12"]),
            ..Match::default()
        },
        2 => Match {
            protocol: Some(*rng.pick(&[6u8, 17])),
            dst_port: range(rng),
            ..Match::default()
        },
        3 => Match {
            dst_ip: pre(rng, &["2001:db8::/32", "2001:db8:1::/48", "fe80::/10"]),
            ..Match::default()
        },
        4 => Match {
            src_ip: pre(rng, &["10.0.0.0/16", "192.168.1.0/24"]),
            src_port: range(rng),
            ..Match::default()
        },
        5 => Match {
            src_ip: Some(format!("{}/32", rng.pick(&V4)).parse().unwrap()),
            dst_ip: Some(format!("{}/32", rng.pick(&V4)).parse().unwrap()),
            protocol: Some(*rng.pick(&[6u8, 17, 132])),
            src_port: Some(rng.pick(&PORTS).to_string().parse().unwrap()),
            dst_port: Some(rng.pick(&PORTS).to_string().parse().unwrap()),
            ..Match::default()
        },
        6 => Match {
            vlan: Some(*rng.pick(&[0u16, 7])),
            in_port: Some(0),
            ..Match::default()
        },
        7 => Match {
            dscp: Some(*rng.pick(&[0u8, 10, 46])),
            ..Match::default()
        },
        _ => Match {
            dst_port: range(rng),
            ..Match::default()
        },
    }
}

fn random_packet(rng: &mut Rng) -> Vec<u8> {
    let v6 = rng.chance(30);
    let (src, dst) = if v6 {
        (ip(rng.pick::<&str>(&V6)), ip(rng.pick::<&str>(&V6)))
    } else {
        (ip(rng.pick::<&str>(&V4)), ip(rng.pick::<&str>(&V4)))
    };
    let pk = Pk {
        in_port: 0,
        vlan: *rng.pick(&[None, None, Some(0), Some(7)]),
        src,
        dst,
        proto: *rng.pick(&[6u8, 17, 17, 132, 1]),
        sport: *rng.pick(&PORTS),
        dport: *rng.pick(&PORTS),
        dscp: *rng.pick(&[0u8, 10, 46]),
    };
    let _ = pk.in_port;
    let mut f = pk.frame();
    // Now and then a malformed frame: truncated anywhere past the Ethernet header
    // (BPF_PROG_TEST_RUN refuses frames shorter than that; so do NICs).
    if rng.chance(3) {
        f.truncate(14 + rng.index(f.len() - 14));
    }
    f
}

struct Setup {
    tenants: u32,
    tag: bool,
    seed: u64,
    packets: usize,
}

fn compare(test: &str, s: &Setup) {
    let mut rng = Rng::new(s.seed);
    let (shift, threshold, workers) = (4, 1, 4u16);
    let mut rust = Dispatcher::new(DispatcherConfig {
        sched: SchedulerConfig { shift, threshold },
        tag: if s.tag { TagMode::Dscp } else { TagMode::None },
        unmatched: UnmatchedPolicy::Drop,
        ..DispatcherConfig::default()
    });
    let mut xdp = XdpDispatcher::load(XdpConfig {
        shift,
        threshold,
        tag_dscp: s.tag,
        metadata: true,
        test_mode: true,
        in_port: 0,
    })
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    for _ in 0..workers {
        let max = 2 + rng.below(4);
        rust.add_worker(max);
        xdp.add_worker(max).unwrap();
    }
    for t in 0..s.tenants {
        let n = 1 + rng.index(3);
        let rules: Vec<(u32, Match)> = (0..n)
            .map(|_| (rng.below(8) as u32, random_rule(&mut rng)))
            .collect();
        let max = if rng.chance(30) { 2 + rng.below(4) } else { 0 };
        let w = WorkerId((t % u32::from(workers)) as u16);
        rust.admit_on(TenantSlot(t), rules.clone(), max, w).unwrap();
        xdp.admit(TenantSlot(t), &rules, max, w)
            .unwrap_or_else(|e| panic!("{test}: {e}"));
    }
    let mut ts = 0u64;
    let (mut passes, mut tagged_checked, mut events) = (0, 0, 0);
    for i in 0..s.packets {
        ts = match rng.below(20) {
            0 => ts.saturating_sub(rng.below(64)), // an older timestamp
            1 => ts + 16 * (1 + rng.below(3)),     // idle timeslots
            _ => ts + rng.below(3),
        };
        let frame = random_packet(&mut rng);
        let mut rust_frame = frame.clone();
        let want = rust.dispatch(ts, 0, &mut rust_frame);
        let want_events: Vec<Event> = rust.drain_events().collect();
        let got = xdp
            .run(ts, &frame)
            .unwrap_or_else(|e| panic!("{test}: packet {i}: {e}"));
        let got_events = xdp.drain_events();
        assert_eq!(got_events, want_events, "{test}: packet {i}: events");
        events += want_events.len();
        let mig = want_events.iter().find_map(|e| match e {
            Event::Migration { from, .. } => Some(*from),
            _ => None,
        });
        let ovl = want_events.iter().find_map(|e| match e {
            Event::Overload { worker, slot } => Some(buffet_dispatch::OverloadReport {
                worker: *worker,
                slot: *slot,
            }),
            _ => None,
        });
        let want_x = match want {
            Decision::Pass { worker, tenant } => XdpDecision::Pass {
                worker,
                tenant,
                migrated_from: mig,
                overload: ovl,
            },
            Decision::Drop(DispatchDrop::Malformed(e)) => XdpDecision::Malformed(e),
            Decision::Drop(DispatchDrop::Unmatched) => XdpDecision::Unmatched,
            Decision::Drop(DispatchDrop::Policed(t)) => XdpDecision::Policed(t),
            Decision::Drop(DispatchDrop::NoLiveWorker) => XdpDecision::NoLiveWorker,
        };
        assert_eq!(
            got.decision, want_x,
            "{test}: packet {i} at {ts}: {frame:02x?}"
        );
        if let Decision::Pass { tenant, .. } = want {
            passes += 1;
            assert_eq!(got.metadata, Some(tenant.0), "{test}: packet {i}: metadata");
            assert_eq!(
                got.frame, rust_frame,
                "{test}: packet {i}: frame bytes (DSCP tag)"
            );
            if s.tag && rust_frame != frame {
                tagged_checked += 1;
            }
        } else {
            assert_eq!(got.metadata, None, "{test}: packet {i}: metadata on a drop");
            assert_eq!(
                got.frame, frame,
                "{test}: packet {i}: a dropped frame changed"
            );
        }
    }
    let st = xdp.stats().unwrap();
    assert_eq!(st.packets, s.packets as u64);
    assert_eq!(st.passed, passes);
    assert_eq!(st.malformed, rust.stats().malformed_total());
    // The random mix must exercise what it claims to.
    assert!(
        passes > s.packets as u64 / 4,
        "{test}: only {passes} passes"
    );
    assert!(events > 10, "{test}: only {events} events");
    if s.tag {
        assert!(
            tagged_checked > 100,
            "{test}: only {tagged_checked} retagged frames"
        );
    }
}

#[test]
fn random_frames_decide_the_same_with_many_tenants() {
    let test = "random_frames_decide_the_same_with_many_tenants";
    if !ready(test) {
        return;
    }
    // > 63 tenants: the tenant reaches the worker in the metadata only.
    compare(
        test,
        &Setup {
            tenants: 150,
            tag: false,
            seed: 0x5eed_0009,
            packets: 4000,
        },
    );
}

#[test]
fn random_frames_decide_and_tag_the_same() {
    let test = "random_frames_decide_and_tag_the_same";
    if !ready(test) {
        return;
    }
    compare(
        test,
        &Setup {
            tenants: 60,
            tag: true,
            seed: 0x5eed_0063,
            packets: 3000,
        },
    );
}

fn loaded(test: &str) -> XdpDispatcher {
    let mut x = XdpDispatcher::load(XdpConfig {
        test_mode: true,
        ..XdpConfig::default()
    })
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    x.add_worker(10).unwrap();
    x
}

#[test]
fn more_tenants_than_the_maps_hold_are_refused_by_name() {
    let test = "more_tenants_than_the_maps_hold_are_refused_by_name";
    if !ready(test) {
        return;
    }
    let mut x = loaded(test);
    let e = x
        .admit(TenantSlot(MAX_TENANTS), &[], 0, WorkerId(0))
        .unwrap_err();
    assert!(matches!(e, AdmitError::TooManyTenants { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&MAX_TENANTS.to_string())
            && msg.contains(&format!("{}", TenantSlot(MAX_TENANTS))),
        "{msg}"
    );
    // The last slot the maps hold is fine.
    x.admit(TenantSlot(MAX_TENANTS - 1), &[], 0, WorkerId(0))
        .unwrap();
}

#[test]
fn rules_beyond_the_mask_budget_are_refused_and_nothing_changes() {
    let test = "rules_beyond_the_mask_budget_are_refused_and_nothing_changes";
    if !ready(test) {
        return;
    }
    let mut x = loaded(test);
    let ok = Match {
        dst_ip: Some("10.0.0.0/8".parse().unwrap()),
        ..Match::default()
    };
    // 1-65534 on both ports: 15 x 15 = 225 masks > 64.
    let wide = Match {
        src_port: Some("1-65534".parse().unwrap()),
        dst_port: Some("1-65534".parse().unwrap()),
        ..Match::default()
    };
    let e = x
        .admit(TenantSlot(7), &[(1, ok.clone()), (2, wide)], 0, WorkerId(0))
        .unwrap_err();
    match &e {
        AdmitError::TooManyMasks {
            tenant,
            index,
            capacity,
            ..
        } => {
            assert_eq!((*tenant, *index, *capacity), (TenantSlot(7), 1, MAX_TUPLES));
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("rule 1") && msg.contains("cannot express"),
        "{msg}"
    );
    // Nothing was admitted: the slot is free, and a packet to 10/8 is unmatched.
    assert_eq!(x.tenant_row(TenantSlot(7)), None);
    let frame = Pk {
        in_port: 0,
        vlan: None,
        src: ip("10.0.0.1"),
        dst: ip("10.0.0.2"),
        proto: 17,
        sport: 1,
        dport: 2,
        dscp: 0,
    }
    .frame();
    assert_eq!(x.run(0, &frame).unwrap().decision, XdpDecision::Unmatched);
    x.admit(TenantSlot(7), &[(1, ok)], 0, WorkerId(0)).unwrap();
    assert!(matches!(
        x.run(0, &frame).unwrap().decision,
        XdpDecision::Pass {
            tenant: TenantSlot(7),
            ..
        }
    ));
    // Removal takes the rules out again.
    assert!(x.remove(TenantSlot(7)).unwrap());
    assert_eq!(x.run(1, &frame).unwrap().decision, XdpDecision::Unmatched);
}
