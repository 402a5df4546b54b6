//! The packet path of firewall, ids, dpi, macswap, policer, l2fwd and flowfwd does not
//! allocate: after `init`, `handle` runs over packets that exercise every branch (rule
//! hits, defaults, connection tracking with evictions, signature matches with alert
//! records and rate limiting, blocked and hostless HTTP, policing, table hits and misses)
//! under a counting allocator.
//!
//! The global allocator of this test binary is `buffet_testkit::CountingAllocator`, which
//! only counts and delegates to the system allocator (its `unsafe impl` lives in the
//! testkit's `sys` module); this file has no `unsafe`.

use buffet_nfs::{Dpi, Firewall, FlowFwd, Ids, L2Fwd, MacSwap, Policer};
use buffet_sdk::{NetworkFunction, Packet, PacketMeta};
use buffet_testkit::{allocations_during, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src, dst, 64)
        .tcp(sport, dport, 1, 1000)
        .write(&mut v, payload)
        .unwrap();
    v
}

fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 9])
        .ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut v, payload)
        .unwrap();
    v
}

/// An SCTP packet (common header, then the payload as chunk bytes).
fn sctp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend(sport.to_be_bytes());
    l4.extend(dport.to_be_bytes());
    l4.extend([0, 0, 0, 7, 0, 0, 0, 0]);
    l4.extend(payload);
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src, dst, 64)
        .write(&mut v, etherparse::IpNumber::SCTP, &l4)
        .unwrap();
    v
}

/// A mixed trace: several flows in both directions, HTTP with and without hosts,
/// signature hits, DNS, SCTP.
fn trace() -> Vec<Vec<u8>> {
    let mut t = Vec::new();
    for i in 0..64u8 {
        let client = [192, 168, 0, i];
        let server = [192, 168, 1, 1];
        let port = 40000 + u16::from(i);
        t.push(tcp(
            client,
            server,
            port,
            80,
            b"GET / HTTP/1.1\r\nHost: www.evil.com\r\n\r\n",
        ));
        t.push(tcp(
            client,
            server,
            port,
            80,
            b"GET / HTTP/1.1\r\nHost: ok.org:80\r\n\r\n",
        ));
        t.push(tcp(
            client,
            server,
            port,
            80,
            b"GET / HTTP/1.0\r\nAccept: */*\r\n\r\n",
        ));
        t.push(tcp(
            server,
            client,
            80,
            port,
            b"HTTP/1.1 200 OK\r\n\r\nAtTaCk",
        ));
        t.push(tcp(client, server, port, 22, b"ssh"));
        t.push(udp(client, [10, 0, 0, 53], port, 53, b"\x03bad\x03com\x00"));
        t.push(sctp(client, server, port, 3868, b"diameter request"));
    }
    t
}

/// Runs the trace three times (2 s of packet time apart) under the counter; returns the
/// NF's summary so callers can check the interesting branches were taken.
fn assert_no_alloc<N: NetworkFunction>(nf: N, policy_toml: &str) -> Vec<(&'static str, u64)> {
    let policy: N::Policy = toml::from_str(policy_toml).unwrap();
    let mut state = N::State::default();
    nf.init(&policy, &mut state).unwrap();
    let mut frames = trace();
    let n = allocations_during(|| {
        for round in 0..3u64 {
            for (i, f) in frames.iter_mut().enumerate() {
                let meta = PacketMeta {
                    ts_ns: round * 2_000_000_000 + i as u64 * 1_000,
                    ..Default::default()
                };
                let mut p = Packet::parse(f, meta).unwrap();
                std::hint::black_box(nf.handle(&mut p, &mut state));
            }
        }
    });
    assert_eq!(n, 0, "{} allocated {n} times on the packet path", nf.name());
    nf.summary(&state)
}

fn get(summary: &[(&'static str, u64)], key: &str) -> u64 {
    summary
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, v)| *v)
}

#[test]
fn the_counter_sees_allocations() {
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);
}

#[test]
fn firewall_packet_path_does_not_allocate() {
    let s = assert_no_alloc(
        Firewall::default(),
        r#"
        default = "deny"
        allow_established = true
        conntrack_capacity = 16
        [[rules]]
        action = "deny"
        src = "192.168.0.0/26"
        proto = "tcp"
        dst_port = 22
        [[rules]]
        action = "allow"
        src = "192.168.0.0/16"
        proto = "tcp"
        dst_port = "1-1023"
        [[rules]]
        action = "allow"
        dst = "10.0.0.53"
        proto = "udp"
        dst_port = 53
        [[rules]]
        action = "allow"
        proto = "sctp"
        dst_port = 3868
        "#,
    );
    for key in [
        "denied",
        "established",
        "conntrack_evictions",
        "rule_hits[0]",
        "rule_hits[2]",
        "rule_hits[3]",
    ] {
        assert!(get(&s, key) > 0, "{key}: {s:?}");
    }
}

#[test]
fn ids_packet_path_does_not_allocate() {
    let rules = r#"
        rules = '''
        alert tcp any 80 (msg:"evil"; content:"evil"; nocase; sid:1;)
        alert tcp any any (content:"HTTP/1.1"; content:"Host"; sid:2;)
        alert ip any any (content:"AtTaCk"; sid:3;)
        alert udp any any -> 10.0.0.0/8 53 (content:"|03|bad|03|com"; sid:4;)
        alert sctp any any -> any 3868 (content:"diameter"; sid:5;)
        '''
        log_per_second = 5
        recent_alerts = 8
    "#;
    let alert = assert_no_alloc(Ids::default(), &format!("mode = \"alert\"\n{rules}"));
    let block = assert_no_alloc(Ids::default(), &format!("mode = \"block\"\n{rules}"));
    for key in [
        "rule_hits[0]",
        "rule_hits[1]",
        "rule_hits[2]",
        "rule_hits[3]",
        "rule_hits[4]",
        "logged",
    ] {
        assert!(get(&alert, key) > 0, "{key}: {alert:?}");
    }
    assert!(get(&alert, "log_suppressed") > 0 && get(&block, "blocked") > 0);
}

#[test]
fn dpi_packet_path_does_not_allocate() {
    let s = assert_no_alloc(Dpi::default(), r#"blacklist = ["evil.com", "example.net"]"#);
    assert!(get(&s, "blocked") > 0 && get(&s, "no_host") > 0, "{s:?}");
}

#[test]
fn forwarders_macswap_and_policer_do_not_allocate() {
    assert_no_alloc(MacSwap, "");
    let s = assert_no_alloc(Policer, "rate = 1000\nburst = 50\nunit = \"packets\"");
    assert!(get(&s, "passed") > 0 && get(&s, "dropped") > 0, "{s:?}");
    let s = assert_no_alloc(
        L2Fwd::default(),
        "default = 3\n[[entries]]\nmac = \"02:00:00:00:00:02\"\nport = 1",
    );
    assert!(
        get(&s, "forwarded") > 0 && get(&s, "default_forwarded") > 0,
        "{s:?}"
    );
    let s = assert_no_alloc(
        FlowFwd::default(),
        r#"
        [[flows]]
        src = "192.168.0.1"
        dst = "192.168.1.1"
        proto = "tcp"
        src_port = 40001
        dst_port = 80
        port = 2
        "#,
    );
    assert!(get(&s, "forwarded") > 0 && get(&s, "dropped") > 0, "{s:?}");
}
