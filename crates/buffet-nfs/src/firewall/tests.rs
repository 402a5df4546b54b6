use super::acl::{mask16, port_prefixes};
use super::policy::ports_or_any;
use super::*;
use buffet_sdk::policy::PortRange;
use buffet_sdk::PacketMeta;
use etherparse::PacketBuilder;
use std::net::Ipv4Addr;

fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4(src, dst, 64)
        .tcp(sport, dport, 1, 1000)
        .write(&mut v, b"hello")
        .unwrap();
    v
}

fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut v, b"hello")
        .unwrap();
    v
}

fn run(st: &mut FirewallState, bytes: &[u8], ts: u64) -> Verdict {
    let mut b = bytes.to_vec();
    let meta = PacketMeta {
        ts_ns: ts,
        ..Default::default()
    };
    let mut p = Packet::parse(&mut b, meta).unwrap();
    Firewall::default().handle(&mut p, st)
}

fn state(toml_text: &str) -> FirewallState {
    let p: FirewallPolicy = toml::from_str(toml_text).unwrap();
    let mut st = FirewallState::default();
    Firewall::default().init(&p, &mut st).unwrap();
    st
}

fn init_err(toml_text: &str) -> String {
    let p: FirewallPolicy = toml::from_str(toml_text).unwrap();
    let mut st = FirewallState::default();
    Firewall::default()
        .init(&p, &mut st)
        .unwrap_err()
        .to_string()
}

const DROP: Verdict = Verdict::Drop(DropCause::Policy);

/// The ACL's port masks select exactly the ports of each range's prefixes.
#[test]
fn port_ranges_become_minimal_prefixes() {
    assert_eq!(port_prefixes((0, 65535)), vec![(0, 0)]);
    assert_eq!(port_prefixes((80, 80)), vec![(80, 16)]);
    assert_eq!(port_prefixes((1024, 65535)).len(), 6);
    assert_eq!(port_prefixes((1, 65534)).len(), 30);
    for (lo, hi) in [(3u16, 17u16), (0, 1), (100, 1000), (65535, 65535)] {
        let ps = port_prefixes((lo, hi));
        for p in 0..=u16::MAX {
            let inside = ps.iter().filter(|&&(v, l)| p & mask16(l) == v).count();
            assert_eq!(
                inside,
                usize::from((lo..=hi).contains(&p)),
                "{lo}-{hi} at {p}"
            );
        }
    }
}

/// Prefixes are `buffet_sdk::policy::IpPrefix` (tested there); the firewall adds
/// `any` and ignores surrounding blanks.
#[test]
fn prefixes_parse_and_reject() {
    let prefix = |s: &str| prefix_or_any(s).unwrap().unwrap();
    let p = prefix("192.168.0.0/16");
    assert_eq!(p.mapped_len(), 112);
    assert_eq!(p.to_string(), "192.168.0.0/16");
    assert!(p.contains_mapped(&Ipv4Addr::new(192, 168, 9, 9).to_ipv6_mapped().octets()));
    assert!(!p.contains_mapped(&Ipv4Addr::new(192, 169, 0, 1).to_ipv6_mapped().octets()));
    assert_eq!(prefix("2001:db8::/32").to_string(), "2001:db8::/32");
    assert_eq!(prefix("10.0.0.1").mapped_len(), 128);
    assert_eq!(prefix(" 10.0.0.0/8 ").to_string(), "10.0.0.0/8");
    assert_eq!(prefix_or_any("any"), Ok(None));
    assert_eq!(prefix_or_any(" ANY "), Ok(None));
    for bad in [
        "10.0.0.0/33",
        "10.0.0.1/8",
        "300.0.0.0/8",
        "10.0.0.0/x",
        "::/129",
        "host",
    ] {
        assert!(prefix_or_any(bad).is_err(), "{bad}");
    }
}

#[test]
fn protocols_and_ports_accept_any() {
    let name = |s: &str| NumOrName::Name(s.into());
    assert_eq!(proto_or_any(&name(" TCP ")), Ok(Some(6)));
    assert_eq!(proto_or_any(&name("ipv6-icmp")), Ok(Some(58)));
    assert_eq!(proto_or_any(&name("any")), Ok(None));
    assert_eq!(proto_or_any(&name("ip")), Ok(None));
    assert_eq!(proto_or_any(&NumOrName::Num(47)), Ok(Some(47)));
    assert!(proto_or_any(&NumOrName::Num(256)).is_err());
    assert!(proto_or_any(&name("tcpp")).is_err());
    assert_eq!(ports_or_any(&name("Any")), Ok(PortRange::ALL));
    assert_eq!(
        ports_or_any(&name(" 80-90 ")),
        Ok(PortRange { lo: 80, hi: 90 })
    );
    assert_eq!(ports_or_any(&NumOrName::Num(53)), Ok(PortRange::single(53)));
    assert!(ports_or_any(&NumOrName::Num(70000)).is_err());
    assert!(ports_or_any(&name("90-80")).is_err());
}

#[test]
fn first_matching_rule_wins_and_default_applies() {
    let mut st = state(
        r#"
        default = "deny"
        [[rules]]
        action = "deny"
        src = "192.168.1.0/24"
        proto = "tcp"
        dst_port = 22
        [[rules]]
        action = "allow"
        src = "192.168.0.0/16"
        proto = "tcp"
        dst_port = "1-1023"
        [[rules]]
        action = "allow"
        proto = "udp"
        dst_port = 53
        "#,
    );
    let ssh_bad = tcp4([192, 168, 1, 5], [10, 0, 0, 1], 40000, 22);
    let ssh_ok = tcp4([192, 168, 2, 5], [10, 0, 0, 1], 40000, 22);
    let web = tcp4([192, 168, 1, 5], [10, 0, 0, 1], 40000, 80);
    let high = tcp4([192, 168, 1, 5], [10, 0, 0, 1], 40000, 8080);
    let dns = udp4([172, 16, 0, 1], [8, 8, 8, 8], 5353, 53);
    let other = tcp4([172, 16, 0, 1], [10, 0, 0, 1], 1, 80);
    assert_eq!(run(&mut st, &ssh_bad, 0), DROP);
    assert_eq!(run(&mut st, &ssh_ok, 0), Verdict::Pass);
    assert_eq!(run(&mut st, &web, 0), Verdict::Pass);
    assert_eq!(run(&mut st, &high, 0), DROP);
    assert_eq!(run(&mut st, &dns, 0), Verdict::Pass);
    assert_eq!(run(&mut st, &other, 0), DROP);
    assert_eq!(st.rule_hits(), &[1, 2, 1]);
    let c = *st.counters();
    assert_eq!(
        (c.packets, c.allowed, c.denied, c.default_hits),
        (6, 3, 3, 2)
    );
    let s = Firewall::default().summary(&st);
    assert!(
        s.contains(&("rule_hits[1]", 2)) && s.contains(&("denied", 3)),
        "{s:?}"
    );
}

#[test]
fn ipv6_rules_match_ipv6_only() {
    let mut st = state(
        r#"
        default = "allow"
        [[rules]]
        action = "deny"
        src = "2001:db8::/32"
        [[rules]]
        action = "deny"
        dst = "0.0.0.0/0"
        proto = "udp"
        "#,
    );
    let mut v6 = Vec::new();
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    src[15] = 1;
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv6(src, [9; 16], 64)
        .tcp(1, 2, 0, 100)
        .write(&mut v6, b"")
        .unwrap();
    assert_eq!(run(&mut st, &v6, 0), DROP);
    let mut v6udp = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv6([7; 16], [9; 16], 64)
        .udp(1, 2)
        .write(&mut v6udp, b"")
        .unwrap();
    // 0.0.0.0/0 is an IPv4 prefix: it does not match IPv6.
    assert_eq!(run(&mut st, &v6udp, 0), Verdict::Pass);
    assert_eq!(
        run(&mut st, &udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2), 0),
        DROP
    );
}

/// The IP version is part of every prefix match: an IPv6 packet whose addresses are
/// IPv4-mapped is not an IPv4 packet, and an IPv6 prefix never matches IPv4.
#[test]
fn prefixes_never_match_the_other_ip_version_even_ipv4_mapped() {
    let mut st = state(
        r#"
        default = "allow"
        [[rules]]
        action = "deny"
        src = "10.0.0.0/8"
        [[rules]]
        action = "deny"
        dst = "::/0"
        proto = "udp"
        [[rules]]
        action = "deny"
        src = "10.0.0.0/8"
        dst = "::ffff:0:0/96"
        "#,
    );
    let v6 = |src: [u8; 16], dst: [u8; 16], udp: bool| {
        let mut v = Vec::new();
        let b = PacketBuilder::ethernet2([1; 6], [2; 6]).ipv6(src, dst, 64);
        if udp {
            b.udp(1, 2).write(&mut v, b"").unwrap();
        } else {
            b.tcp(1, 2, 0, 100).write(&mut v, b"").unwrap();
        }
        v
    };
    let mapped = |a: [u8; 4]| Ipv4Addr::from(a).to_ipv6_mapped().octets();
    let frames = [
        // ::ffff:10.0.0.1 over IPv6: not in 10.0.0.0/8, and rule 2 mixes versions.
        (
            v6(mapped([10, 0, 0, 1]), mapped([10, 0, 0, 2]), false),
            None,
        ),
        (tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2), Some(0)),
        // ::/0 is IPv6: not every IPv4 packet.
        (udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2), None),
        (
            v6(mapped([1, 1, 1, 1]), mapped([2, 2, 2, 2]), true),
            Some(1),
        ),
    ];
    for (i, (bytes, want)) in frames.iter().enumerate() {
        let mut b = bytes.clone();
        let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        let key = p.flow_key();
        assert_eq!(st.acl().classify(&key), *want, "frame {i}");
        assert_eq!(st.acl().classify_linear(&key), *want, "frame {i}");
        let verdict = if want.is_some() { DROP } else { Verdict::Pass };
        assert_eq!(run(&mut st, bytes, 0), verdict, "frame {i}");
    }
}

#[test]
fn established_flows_pass_in_reverse_and_expire() {
    let mut st = state(
        r#"
        default = "deny"
        allow_established = true
        established_timeout_s = 10
        [[rules]]
        action = "allow"
        src = "192.168.0.0/16"
        proto = "tcp"
        dst_port = 80
        "#,
    );
    let out = tcp4([192, 168, 0, 7], [93, 184, 216, 34], 40000, 80);
    let back = tcp4([93, 184, 216, 34], [192, 168, 0, 7], 80, 40000);
    let sec = 1_000_000_000;
    assert_eq!(run(&mut st, &back, 0), DROP, "no connection yet");
    assert_eq!(run(&mut st, &out, sec), Verdict::Pass);
    assert_eq!(run(&mut st, &back, 2 * sec), Verdict::Pass);
    assert_eq!(
        run(&mut st, &back, 11 * sec),
        Verdict::Pass,
        "refreshed at 2 s"
    );
    assert_eq!(run(&mut st, &back, 30 * sec), DROP, "expired");
    let c = *st.counters();
    assert_eq!((c.established, c.denied, c.allowed), (2, 2, 3));
}

#[test]
fn full_conntrack_table_evicts_and_counts() {
    let mut st = state(
        r#"
        default = "allow"
        allow_established = true
        conntrack_capacity = 8
        "#,
    );
    for port in 0..100u16 {
        let out = tcp4([192, 168, 0, 1], [10, 0, 0, 1], 1000 + port, 80);
        assert_eq!(run(&mut st, &out, u64::from(port)), Verdict::Pass);
    }
    assert_eq!(st.conns().capacity(), 8);
    assert_eq!(st.conns().occupied(), 8);
    assert_eq!(st.conns().evictions(), 92);
}

#[test]
fn fragments_and_portless_packets_match_with_port_zero() {
    let mut st = state(
        r#"
        default = "allow"
        [[rules]]
        action = "deny"
        proto = "tcp"
        dst_port = 80
        [[rules]]
        action = "deny"
        proto = "icmp"
        "#,
    );
    // A non-first TCP fragment: proto 6, no parsable ports.
    let mut frag = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 80);
    frag[20] = 0x00;
    frag[21] = 0x10; // fragment offset 16 (x8 bytes)
    assert_eq!(run(&mut st, &frag, 0), Verdict::Pass);
    assert_eq!(st.counters().fragments, 1);
    let mut icmp = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([1, 1, 1, 1], [2, 2, 2, 2], 64)
        .icmpv4_echo_request(1, 1)
        .write(&mut icmp, b"ping")
        .unwrap();
    assert_eq!(run(&mut st, &icmp, 0), DROP);
    assert_eq!(st.rule_hits(), &[0, 1]);
}

#[test]
fn malformed_frames_never_reach_or_panic_the_firewall() {
    let good = tcp4([192, 168, 0, 1], [10, 0, 0, 1], 1, 80);
    let mut st = state("default = \"allow\"\nallow_established = true");
    for n in 0..good.len() {
        let mut b = good[..n].to_vec();
        if let Ok(mut p) = Packet::parse(&mut b, PacketMeta::default()) {
            let _ = Firewall::default().handle(&mut p, &mut st);
        }
    }
    // Only the full frame parses (the IP total length covers all of it).
    assert_eq!(st.counters().packets, 0);
}

#[test]
fn invalid_policies_name_the_field() {
    let cases = [
        (
            "[[rules]]\naction = \"allow\"\nsrc = \"10.0.0.1/8\"",
            "rules[0].src",
        ),
        (
            "[[rules]]\naction = \"allow\"\ndst = \"10.0.0.0/40\"",
            "rules[0].dst",
        ),
        (
            "[[rules]]\naction = \"allow\"\nproto = \"tcpp\"",
            "rules[0].proto",
        ),
        (
            "[[rules]]\naction = \"allow\"\nproto = 300",
            "rules[0].proto",
        ),
        (
            "[[rules]]\naction = \"allow\"\ndst_port = 80",
            "rules[0].dst_port",
        ),
        (
            "[[rules]]\naction = \"allow\"\nproto = \"tcp\"\nsrc_port = \"90-80\"",
            "rules[0].src_port",
        ),
        (
            "[[rules]]\naction = \"allow\"\nproto = \"udp\"\nsrc_port = 70000",
            "rules[0].src_port",
        ),
        (
            "allow_established = true\nconntrack_capacity = 0",
            "conntrack_capacity",
        ),
        ("conntrack_capacity = 5", "conntrack_capacity"),
        (
            "allow_established = true\nestablished_timeout_s = 0",
            "established_timeout_s",
        ),
    ];
    for (text, field) in cases {
        let e = init_err(text);
        assert!(e.contains(field), "{text}: {e}");
    }
    for unknown in [
        "[[rules]]\naction = \"allow\"\nsource = \"10.0.0.0/8\"",
        "defualt = \"deny\"",
        "[[rules]]\naction = \"reject\"",
    ] {
        assert!(
            toml::from_str::<FirewallPolicy>(unknown).is_err(),
            "{unknown}"
        );
    }
    let nf = Firewall::with_limits(FirewallLimits {
        max_rules: 1,
        max_entries: 40,
        max_conns: 8,
    });
    let two: FirewallPolicy =
        toml::from_str("[[rules]]\naction = \"allow\"\n[[rules]]\naction = \"deny\"").unwrap();
    let e = nf
        .init(&two, &mut FirewallState::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`rules`"), "{e}");
    let wide: FirewallPolicy = toml::from_str(
        "[[rules]]\naction = \"allow\"\nproto = \"tcp\"\nsrc_port = \"1-65534\"\ndst_port = \"1-2\"",
    )
    .unwrap();
    let e = nf
        .init(&wide, &mut FirewallState::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rules[0]") && e.contains("60"), "{e}");
}

/// xorshift64*: a tiny deterministic generator for the cross-check.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Addresses from a small pool so that random rules and packets overlap often.
fn pool_addr(rng: &mut Rng) -> [u8; 4] {
    [
        192,
        168,
        rng.below(4) as u8,
        [1, 2, 3, 128, 200, 255][rng.below(6) as usize],
    ]
}

fn random_prefix(rng: &mut Rng) -> Option<String> {
    let a = pool_addr(rng);
    let len = [0u8, 8, 16, 22, 24, 25, 31, 32][rng.below(8) as usize];
    if len == 0 {
        return None;
    }
    let m = u32::from_be_bytes(a) & (u32::MAX << (32 - u32::from(len)));
    Some(format!("{}/{len}", Ipv4Addr::from(m)))
}

fn random_ports(rng: &mut Rng) -> Option<NumOrName> {
    let points = [
        0u16, 1, 22, 53, 79, 80, 81, 443, 1023, 1024, 8080, 40000, 65535,
    ];
    match rng.below(4) {
        0 => None,
        1 => Some(NumOrName::Num(i64::from(points[rng.below(13) as usize]))),
        _ => {
            let a = points[rng.below(13) as usize];
            let b = points[rng.below(13) as usize];
            Some(NumOrName::Name(format!("{}-{}", a.min(b), a.max(b))))
        }
    }
}

#[test]
fn tuple_space_search_agrees_with_a_linear_scan() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut matched, mut unmatched) = (0u32, 0u32);
    for round in 0..40 {
        let n = 1 + rng.below(if round < 30 { 60 } else { 600 }) as usize;
        let rules: Vec<RulePolicy> = (0..n)
            .map(|_| {
                let proto = match rng.below(4) {
                    0 => None,
                    1 => Some(NumOrName::Name("tcp".into())),
                    2 => Some(NumOrName::Name("udp".into())),
                    _ => Some(NumOrName::Num(6)),
                };
                let with_ports = proto.is_some();
                RulePolicy {
                    action: if rng.below(2) == 0 {
                        Action::Allow
                    } else {
                        Action::Deny
                    },
                    src: random_prefix(&mut rng),
                    dst: random_prefix(&mut rng),
                    proto,
                    src_port: if with_ports {
                        random_ports(&mut rng)
                    } else {
                        None
                    },
                    dst_port: if with_ports {
                        random_ports(&mut rng)
                    } else {
                        None
                    },
                }
            })
            .collect();
        let policy = FirewallPolicy {
            default: Action::Deny,
            rules,
            ..Default::default()
        };
        let mut st = FirewallState::from_policy(&policy, &FirewallLimits::default()).unwrap();
        let mut expected_hits = vec![0u64; n];
        for _ in 0..2000 {
            let points = [
                0u16, 1, 22, 53, 79, 80, 81, 443, 1023, 1024, 8080, 40000, 65535,
            ];
            let sport = points[rng.below(13) as usize];
            let dport = if rng.below(3) == 0 {
                rng.below(65536) as u16
            } else {
                points[rng.below(13) as usize]
            };
            let (s, d) = (pool_addr(&mut rng), pool_addr(&mut rng));
            let bytes = if rng.below(2) == 0 {
                tcp4(s, d, sport, dport)
            } else {
                udp4(s, d, sport, dport)
            };
            let mut b = bytes.clone();
            let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            let key = p.flow_key();
            let linear = st.acl().classify_linear(&key);
            assert_eq!(st.acl().classify(&key), linear, "round {round}, {key:?}");
            let want = match linear {
                Some(i) => {
                    matched += 1;
                    expected_hits[i] += 1;
                    policy.rules[i].action
                }
                None => {
                    unmatched += 1;
                    Action::Deny
                }
            };
            let got = st.process(&p);
            assert_eq!(got == Verdict::Pass, want == Action::Allow);
        }
        assert_eq!(st.rule_hits(), &expected_hits[..]);
    }
    // The generator exercises both outcomes substantially.
    assert!(
        matched > 10_000 && unmatched > 2_000,
        "{matched} / {unmatched}"
    );
}

#[test]
fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
    // Both tenants use 192.168.0.0/16; only their policies differ.
    let mut a = state(
        r#"
        default = "allow"
        [[rules]]
        action = "deny"
        src = "192.168.1.0/24"
        proto = "tcp"
        dst_port = 80
        "#,
    );
    let mut b = state(
        r#"
        default = "deny"
        [[rules]]
        action = "allow"
        src = "192.168.0.0/16"
        proto = "udp"
        "#,
    );
    let packets = [
        tcp4([192, 168, 1, 10], [192, 168, 2, 1], 5000, 80),
        udp4([192, 168, 1, 10], [192, 168, 2, 1], 5000, 53),
        tcp4([192, 168, 3, 10], [192, 168, 2, 1], 5000, 80),
    ];
    let va: Vec<_> = packets.iter().map(|p| run(&mut a, p, 0)).collect();
    let vb: Vec<_> = packets.iter().map(|p| run(&mut b, p, 0)).collect();
    assert_eq!(va, [DROP, Verdict::Pass, Verdict::Pass]);
    assert_eq!(vb, [DROP, Verdict::Pass, DROP]);
    assert_eq!(a.rule_hits(), &[1]);
    assert_eq!(b.rule_hits(), &[1]);
    assert_eq!((a.counters().denied, b.counters().denied), (1, 2));
    assert_eq!(
        (a.counters().default_hits, b.counters().default_hits),
        (2, 2)
    );
    assert_eq!(a.counters().packets, 3);
}

#[test]
fn single_tenant_variant_matches_the_nf() {
    let policy: FirewallPolicy =
        toml::from_str("[[rules]]\naction = \"allow\"\nproto = \"udp\"").unwrap();
    let mut single = SingleTenantFirewall::new(&policy).unwrap();
    let mut st = FirewallState::default();
    Firewall::default().init(&policy, &mut st).unwrap();
    for pkt in [udp4([1; 4], [2; 4], 1, 2), tcp4([1; 4], [2; 4], 1, 2)] {
        let mut b = pkt.clone();
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!(single.handle(&mut p), run(&mut st, &pkt, 0));
    }
    assert_eq!(single.state.counters(), st.counters());
}

/// SCTP carries ports like TCP and UDP: a port rule with `proto = "sctp"` matches on
/// them, and a whole SCTP packet is not a fragment.
#[test]
fn sctp_port_rules_match_sctp_ports() {
    use crate::test_frames::sctp;
    let mut st = state(
        r#"
        default = "deny"
        [[rules]]
        action = "allow"
        proto = "sctp"
        dst_port = 3868
        "#,
    );
    let to = |port| sctp("10.0.0.1", "10.0.0.2", 40000, port, b"diameter");
    assert_eq!(run(&mut st, &to(3868), 0), Verdict::Pass);
    assert_eq!(run(&mut st, &to(3869), 0), DROP);
    let v6 = sctp("2001:db8::1", "2001:db8::2", 40000, 3868, b"diameter");
    assert_eq!(run(&mut st, &v6, 0), Verdict::Pass);
    let c = *st.counters();
    assert_eq!((c.allowed, c.denied, c.fragments), (2, 1, 0));
    assert_eq!(st.rule_hits(), &[2]);
    // Source ports and ranges too.
    let mut st = state(
        r#"
        default = "deny"
        [[rules]]
        action = "allow"
        proto = "sctp"
        src_port = "2905-2910"
        "#,
    );
    let from = |port| sctp("10.0.0.1", "10.0.0.2", port, 9, b"m3ua");
    assert_eq!(run(&mut st, &from(2905), 0), Verdict::Pass);
    assert_eq!(run(&mut st, &from(2911), 0), DROP);
}

/// The cross-family pinhole: a flow allowed over IPv6 between IPv4-mapped addresses
/// (`::ffff:10.3.1.1`) is an IPv6 connection; IPv4 traffic between the IPv4 addresses it
/// maps is not its reply and is never passed as established. And an IPv4 host rule does
/// not allow the IPv6 `::ffff:` form of its address.
#[test]
fn conntrack_never_crosses_address_families() {
    use crate::test_frames::udp;
    let mut st = state(
        r#"
        default = "deny"
        allow_established = true
        [[rules]]
        action = "allow"
        src = "::ffff:10.3.1.1"
        "#,
    );
    let out6 = udp("::ffff:10.3.1.1", "::ffff:10.3.1.2", 5000, 53, b"q");
    let back6 = udp("::ffff:10.3.1.2", "::ffff:10.3.1.1", 53, 5000, b"r");
    let back4 = udp("10.3.1.2", "10.3.1.1", 53, 5000, b"r");
    assert_eq!(run(&mut st, &out6, 1), Verdict::Pass);
    assert_eq!(
        run(&mut st, &back4, 2),
        DROP,
        "IPv4 is not the IPv6 flow's reply"
    );
    assert_eq!(st.counters().established, 0);
    assert_eq!(run(&mut st, &back6, 3), Verdict::Pass);
    assert_eq!(st.counters().established, 1);

    let mut st = state(
        r#"
        default = "deny"
        allow_established = true
        [[rules]]
        action = "allow"
        src = "10.3.1.1"
        "#,
    );
    let out4 = udp("10.3.1.1", "10.3.1.2", 5000, 53, b"q");
    assert_eq!(run(&mut st, &out6, 1), DROP, "IPv4 rule, IPv6 packet");
    assert_eq!(run(&mut st, &back4, 2), DROP);
    assert_eq!(run(&mut st, &out4, 3), Verdict::Pass);
    assert_eq!(
        run(&mut st, &back6, 4),
        DROP,
        "IPv6 is not the IPv4 flow's reply"
    );
    assert_eq!(run(&mut st, &back4, 5), Verdict::Pass);
    let c = *st.counters();
    assert_eq!((c.established, c.allowed, c.denied), (1, 2, 3));
}
