//! Property tests (proptest, shrinking to a minimal counterexample): the Classifier —
//! exact-match cache plus tuple-space search — gives every packet the tenant a naive
//! matcher gives it: the matching rule with the lowest priority, ties to the earliest
//! inserted; before and after removing rules.

use buffet_dispatch::{Classifier, IpPrefix, Match, PortRange, Rule, TenantSlot};
use buffet_sdk::{Packet, PacketMeta};
use proptest::prelude::*;

/// A small address space, so that random rules and packets meet often.
fn prefix() -> impl Strategy<Value = IpPrefix> {
    (0u8..4, prop_oneof![Just(8u8), Just(16), Just(24), Just(32)]).prop_map(|(b, len)| {
        let addr = u32::from_be_bytes([10, 0, b, 1]);
        let net = if len == 0 {
            0
        } else {
            addr & (u32::MAX << (32 - len))
        };
        let [a, b, c, d] = net.to_be_bytes();
        format!("{a}.{b}.{c}.{d}/{len}").parse().unwrap()
    })
}

fn ports() -> impl Strategy<Value = PortRange> {
    (0u16..8, 0u16..4).prop_map(|(lo, w)| PortRange {
        lo: 1000 + lo,
        hi: 1000 + lo + w,
    })
}

fn rule_match() -> impl Strategy<Value = Match> {
    (
        proptest::option::of(0u16..2),
        proptest::option::of(prefix()),
        proptest::option::of(prefix()),
        proptest::option::of(prop_oneof![Just(6u8), Just(17)]),
        proptest::option::of(ports()),
        proptest::option::of(ports()),
        proptest::option::of(0u8..3),
    )
        .prop_map(
            |(in_port, src_ip, dst_ip, protocol, src_port, dst_port, dscp)| {
                // Port rules need a protocol with ports.
                let protocol = if src_port.is_some() || dst_port.is_some() {
                    Some(protocol.unwrap_or(17))
                } else {
                    protocol
                };
                Match {
                    in_port,
                    src_ip,
                    dst_ip,
                    protocol,
                    src_port,
                    dst_port,
                    dscp,
                    ..Match::default()
                }
            },
        )
}

#[derive(Clone, Debug)]
struct Pkt {
    in_port: u16,
    src: [u8; 4],
    dst: [u8; 4],
    tcp: bool,
    sport: u16,
    dport: u16,
    dscp: u8,
}

fn pkt() -> impl Strategy<Value = Pkt> {
    (
        0u16..2,
        (0u8..4, 0u8..3),
        (0u8..4, 0u8..3),
        any::<bool>(),
        1000u16..1012,
        1000u16..1012,
        0u8..3,
    )
        .prop_map(|(in_port, s, d, tcp, sport, dport, dscp)| Pkt {
            in_port,
            src: [10, 0, s.0, s.1],
            dst: [10, 0, d.0, d.1],
            tcp,
            sport,
            dport,
            dscp,
        })
}

fn frame(p: &Pkt) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6]).ip(etherparse::IpHeaders::Ipv4(
        {
            let mut h = etherparse::Ipv4Header::new(
                0,
                64,
                if p.tcp {
                    etherparse::IpNumber::TCP
                } else {
                    etherparse::IpNumber::UDP
                },
                p.src,
                p.dst,
            )
            .unwrap();
            h.dscp = etherparse::IpDscp::try_new(p.dscp).unwrap();
            h
        },
        Default::default(),
    ));
    let mut v = Vec::new();
    if p.tcp {
        b.tcp(p.sport, p.dport, 1, 1024)
            .write(&mut v, b"x")
            .unwrap();
    } else {
        b.udp(p.sport, p.dport).write(&mut v, b"x").unwrap();
    }
    v
}

/// The naive matcher: every live rule in insertion order, the lowest priority wins.
fn naive(rules: &[(Rule, bool)], pkt: &Packet<'_>) -> Option<TenantSlot> {
    rules
        .iter()
        .filter(|(r, live)| *live && r.fields.matches(pkt))
        .min_by_key(|(r, _)| r.priority)
        .map(|(r, _)| r.tenant)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_classifier_agrees_with_a_naive_matcher(
        rules in proptest::collection::vec((0u32..6, rule_match()), 1..24),
        remove in proptest::collection::vec(any::<bool>(), 24),
        pkts in proptest::collection::vec(pkt(), 1..32),
        cache in prop_oneof![Just(0usize), Just(64)],
    ) {
        let mut c = Classifier::with_cache(cache);
        let mut live: Vec<(Rule, bool)> = Vec::new();
        let mut handles = Vec::new();
        for (i, (priority, fields)) in rules.into_iter().enumerate() {
            let rule = Rule { priority, tenant: TenantSlot(i as u32), fields };
            handles.push(c.insert(rule.clone()).unwrap());
            live.push((rule, true));
        }
        for round in 0..2 {
            for p in &pkts {
                let mut f = frame(p);
                let meta = PacketMeta { in_port: p.in_port, ..PacketMeta::default() };
                let parsed = Packet::parse(&mut f, meta).unwrap();
                let want = naive(&live, &parsed);
                prop_assert_eq!(c.lookup(&parsed), want, "lookup, round {}", round);
                // Twice through the cache: a hit must give the same answer.
                prop_assert_eq!(c.classify(&parsed), want, "classify, round {}", round);
                prop_assert_eq!(c.classify(&parsed), want, "cached, round {}", round);
            }
            // Then without some of the rules.
            for (i, h) in handles.iter().enumerate() {
                if remove[i] && live[i].1 {
                    prop_assert!(c.remove(*h).is_some());
                    live[i].1 = false;
                }
            }
        }
    }
}

/// The overlap test by definition: some pair of the two rules' (mask, value) pairs agrees
/// on every bit both masks cover.
fn overlap_by_key_pairs(a: &Match, b: &Match) -> bool {
    let (ka, kb) = (a.key_pairs(), b.key_pairs());
    ka.iter().any(|(ma, va)| {
        kb.iter().any(|(mb, vb)| {
            ma.iter()
                .zip(va)
                .zip(mb.iter().zip(vb))
                .all(|((ma, va), (mb, vb))| (va ^ vb) & ma & mb == 0)
        })
    })
}

/// Like [`rule_match`], with VLANs and IPv6 prefixes in the mix (each rule one version).
fn overlap_match() -> impl Strategy<Value = Match> {
    (
        rule_match(),
        proptest::option::of(0u16..3),
        any::<bool>(),
        proptest::option::of(0u8..2),
    )
        .prop_map(|(mut m, vlan, v6, mac)| {
            m.vlan = vlan;
            m.src_mac = mac.map(|b| [2, 0, 0, 0, 0, b]);
            if v6 {
                let to_v6 = |p: IpPrefix| -> IpPrefix {
                    let s = p.to_string();
                    let (addr, len) = s.split_once('/').unwrap();
                    let b: Vec<u8> = addr.split('.').map(|x| x.parse().unwrap()).collect();
                    format!(
                        "2001:db8:{:x}{:02x}::/{}",
                        b[2],
                        b[3],
                        32 + len.parse::<u8>().unwrap() / 2
                    )
                    .parse()
                    .unwrap()
                };
                m.src_ip = m.src_ip.map(to_v6);
                m.dst_ip = m.dst_ip.map(to_v6);
            }
            m
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// `Match::overlaps`, field by field, says exactly what comparing every pair of the
    /// two rules' expanded keys says (the admission check's old, quadratic way).
    #[test]
    fn overlaps_agrees_with_the_expanded_keys(a in overlap_match(), b in overlap_match()) {
        prop_assert!(a.validate().is_ok() && b.validate().is_ok());
        prop_assert_eq!(a.overlaps(&b), overlap_by_key_pairs(&a, &b), "{:?} / {:?}", a, b);
        prop_assert_eq!(a.overlaps(&b), b.overlaps(&a));
        prop_assert_eq!(a.key_count(), a.key_pairs().len());
    }
}
