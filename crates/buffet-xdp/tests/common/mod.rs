//! What the tests that load buffet-xdp's programs share: the privilege gate, rules
//! written as `key=value,...`, and a UDP frame.

use buffet_dispatch::Match;
use buffet_testkit::gate::{self, Capability};
use etherparse::PacketBuilder;

/// Whether `test` can load BPF programs here (a privilege skip otherwise, a failure in
/// CI), and this build has them (clang at build time).
pub fn ready(test: &str) -> bool {
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        return gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
    }
    gate::require_capabilities(test, &[Capability::Bpf, Capability::NetAdmin])
}

/// A rule from `dst_ip=...,src_ip=...,protocol=...,src_port=...,dst_port=...`.
pub fn rule(text: &str) -> Match {
    let mut m = Match::default();
    for kv in text.split(',') {
        let (k, v) = kv.split_once('=').unwrap();
        match k {
            "dst_ip" => m.dst_ip = Some(v.parse().unwrap()),
            "src_ip" => m.src_ip = Some(v.parse().unwrap()),
            "protocol" => m.protocol = Some(v.parse().unwrap()),
            "src_port" => m.src_port = Some(v.parse().unwrap()),
            "dst_port" => m.dst_port = Some(v.parse().unwrap()),
            _ => panic!("{k}"),
        }
    }
    m
}

/// A UDP datagram from 172.16.0.1:4000 to `dst:dport`, 7 bytes of payload.
pub fn udp4(dst: [u8; 4], dport: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([172, 16, 0, 1], dst, 64)
        .udp(4000, dport);
    let mut out = Vec::new();
    b.write(&mut out, b"payload").unwrap();
    out
}
