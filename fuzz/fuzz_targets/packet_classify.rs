//! Fuzz target: the packet view and the Packet Dispatcher over arbitrary bytes.
//!
//! The input is one frame. It is parsed with `Packet::parse` and every accessor is
//! called; then two Dispatchers (one tagging the tenant into DSCP, one not) with a few
//! tenants' rules classify, schedule and tag it. Nothing may panic, and the answers must
//! agree with each other: a passed frame's tenant is the classifier's, a DSCP-tagged frame
//! carries its tenant and keeps its layout.
#![no_main]

use buffet_dispatch::{
    read_dscp, Decision, DispatchDrop, Dispatcher, DispatcherConfig, Match, TagMode, TenantSlot,
    UnmatchedPolicy,
};
use buffet_sdk::{L3Kind, Packet, PacketMeta, TenantId};
use libfuzzer_sys::fuzz_target;

fn m(f: impl FnOnce(&mut Match)) -> Match {
    let mut m = Match::default();
    f(&mut m);
    m
}

/// A tenant to admit: its slot, its `(priority, match)` rules and its MAX_NB.
type TenantSpec = (TenantSlot, Vec<(u32, Match)>, u64);

/// Four tenants whose rules cover every field a rule can match.
fn tenants() -> Vec<TenantSpec> {
    vec![
        (
            TenantSlot(1),
            vec![(100, m(|m| m.dst_ip = Some("10.1.0.0/16".parse().unwrap())))],
            0,
        ),
        (
            TenantSlot(2),
            vec![
                (
                    10,
                    m(|m| {
                        m.protocol = Some(6);
                        m.dst_ip = Some("10.2.0.0/16".parse().unwrap());
                        m.dst_port = Some("1-1023".parse().unwrap());
                    }),
                ),
                (
                    20,
                    m(|m| {
                        m.protocol = Some(17);
                        m.src_port = Some("53".parse().unwrap());
                        m.dst_ip = Some("2001:db8::/32".parse().unwrap());
                    }),
                ),
            ],
            0,
        ),
        (
            TenantSlot(3),
            vec![
                (5, m(|m| m.vlan = Some(7))),
                (
                    6,
                    m(|m| {
                        m.src_mac = Some([2, 0, 0, 0, 0, 1]);
                        m.in_port = Some(1);
                    }),
                ),
                (7, m(|m| m.dscp = Some(46))),
                (
                    8,
                    m(|m| {
                        m.protocol = Some(132);
                        m.src_ip = Some("192.168.0.0/16".parse().unwrap());
                        m.dst_port = Some("36412".parse().unwrap());
                    }),
                ),
            ],
            // Policed: MAX_NB of 2 per timeslot.
            2,
        ),
        (
            TenantSlot(4),
            vec![(1_000, m(|m| m.dst_mac = Some([0xff; 6])))],
            0,
        ),
    ]
}

fn dispatcher(tag: TagMode, unmatched: UnmatchedPolicy) -> Dispatcher {
    let mut d = Dispatcher::new(DispatcherConfig {
        tag,
        unmatched,
        ..DispatcherConfig::default()
    });
    d.add_worker(1_000);
    d.add_worker(1_000);
    for (slot, rules, max_nb) in tenants() {
        d.admit(slot, rules, max_nb)
            .expect("valid tenants are admitted");
    }
    d
}

/// Calls every accessor of the view; they are total.
fn touch(pkt: &mut Packet<'_>) {
    let _ = pkt.ethernet().map(|e| e.ether_type());
    let _ = (pkt.vlan_id(), pkt.l3_kind(), pkt.l4_kind(), pkt.ip_proto());
    let (l3, l4, pl, end) = (
        pkt.l3_offset(),
        pkt.l4_offset(),
        pkt.payload_offset(),
        pkt.ip_end(),
    );
    assert!(l3 <= pkt.len() && l4 <= pkt.len() && pl <= pkt.len() && end <= pkt.len());
    let _ = pkt.ipv4().map(|h| h.total_len());
    let _ = pkt.ipv6().map(|h| h.payload_length());
    let _ = pkt.tcp().map(|h| h.fin());
    let _ = pkt.udp().map(|h| h.length());
    let _ = pkt.sctp().map(|h| h.verification_tag());
    let _ = (pkt.payload().len(), pkt.payload_mut().len());
    let _ = (pkt.ports(), pkt.dscp(), pkt.addrs());
    let key = pkt.flow_key();
    assert_eq!(key.reversed().reversed(), key);
}

fuzz_target!(|data: &[u8]| {
    if data.len() > 16 * 1024 {
        return;
    }
    let meta = PacketMeta {
        in_port: 1,
        ts_ns: 0,
        tenant: TenantId(0),
    };

    // The view alone, then rebuilt from its layout, then shrunk and re-parsed.
    let mut frame = data.to_vec();
    let parsed = match Packet::parse(&mut frame, meta) {
        Ok(mut pkt) => {
            touch(&mut pkt);
            Some(pkt.layout())
        }
        Err(_) => None,
    };
    if let Some(layout) = parsed {
        let len = frame.len();
        let mut pkt = Packet::from_layout(&mut frame, len, meta, layout)
            .expect("a parse's own layout is accepted");
        touch(&mut pkt);
        let _ = pkt.resize(len / 2);
        if pkt.reparse().is_ok() {
            touch(&mut pkt);
        }
        let _ = pkt.resize(len);
        let _ = pkt.resize(len + 1);
    }
    let mut roomy = data.to_vec();
    roomy.resize(data.len() + 64, 0);
    if let Ok(mut pkt) = Packet::parse_with_capacity(&mut roomy, data.len(), meta) {
        let _ = pkt.resize(data.len() + 64);
        let _ = pkt.resize(data.len() + 65);
    }

    // The dispatcher, twice per frame (the second may be policed), in both tag modes.
    for (tag, unmatched) in [
        (TagMode::None, UnmatchedPolicy::Drop),
        (TagMode::Dscp, UnmatchedPolicy::ToTenant(TenantSlot(4))),
    ] {
        let mut d = dispatcher(tag, unmatched);
        for round in 0..3u64 {
            let mut bytes = data.to_vec();
            let (decision, layout) = d.dispatch_with_layout(round * 10, 1, &mut bytes);
            match decision {
                Decision::Drop(DispatchDrop::Malformed(_)) => assert!(layout.is_none()),
                Decision::Pass { tenant, .. } => {
                    let layout = layout.expect("a passed frame parsed");
                    if tag == TagMode::Dscp {
                        let pkt = Packet::parse(&mut bytes, meta).expect("a tagged frame parses");
                        assert_eq!(pkt.layout(), layout, "tagging moves no header");
                        let v4 = pkt.l3_kind() == L3Kind::Ipv4;
                        let (l3, bytes) = (pkt.l3_offset(), pkt.data());
                        assert_eq!(read_dscp(bytes, l3, v4), Ok(tenant.0 as u8));
                    } else {
                        let mut again = data.to_vec();
                        let pkt = Packet::parse(&mut again, meta).expect("a passed frame parses");
                        assert_eq!(d.classifier().lookup(&pkt), Some(tenant));
                    }
                }
                _ => {}
            }
        }
        let _ = d.drain_events().count();
        let stats = d.stats();
        let _ = (stats.malformed_total(), stats.unmatched);
    }
});
