//! Frames for the NFs' unit tests: Ethernet + IPv4 or IPv6 (chosen by the addresses'
//! family, so `::ffff:a.b.c.d` builds an IPv6 packet) + UDP or SCTP.

use std::net::IpAddr;

use etherparse::{IpNumber, PacketBuilder, PacketBuilderStep};

fn ip(src: &str, dst: &str) -> PacketBuilderStep<etherparse::IpHeaders> {
    let b = PacketBuilder::ethernet2([1; 6], [2; 6]);
    match (
        src.parse::<IpAddr>().unwrap(),
        dst.parse::<IpAddr>().unwrap(),
    ) {
        (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s.octets(), d.octets(), 64),
        _ => panic!("{src} and {dst} are of different families"),
    }
}

/// A UDP datagram `src:sport -> dst:dport` carrying `payload`.
pub(crate) fn udp(src: &str, dst: &str, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    ip(src, dst)
        .udp(sport, dport)
        .write(&mut v, payload)
        .unwrap();
    v
}

/// An SCTP packet `src:sport -> dst:dport` (verification tag 7, checksum 0) whose one
/// DATA chunk carries `payload`.
pub(crate) fn sctp(src: &str, dst: &str, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend(sport.to_be_bytes());
    l4.extend(dport.to_be_bytes());
    l4.extend(7u32.to_be_bytes());
    l4.extend(0u32.to_be_bytes());
    // DATA chunk: type 0, flags, length, TSN, stream id, stream seq, PPID, data.
    let len = 16 + payload.len() as u16;
    l4.extend([0, 3]);
    l4.extend(len.to_be_bytes());
    l4.extend([0; 12]);
    l4.extend(payload);
    let mut v = Vec::new();
    ip(src, dst).write(&mut v, IpNumber(132), &l4).unwrap();
    v
}
