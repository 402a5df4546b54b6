//! Fuzz target: every reference NF's `handle` with a valid policy and arbitrary packets.
//!
//! Input layout, split by hand so seeds stay readable:
//! `[nf] [variant] [16 parameter bytes] ([len: u16 BE] [frame bytes])*`.
//! `nf` picks one of the nine NFs of buffet-nfs, `variant` one of its policies: the
//! documented example (which must be accepted) or one built from the parameter bytes
//! (which may be rejected, as an `InitError`). Every frame that parses is handled with
//! room to grow (IPsec encapsulates), alternately one by one and as a group. Nothing may
//! panic, and a handled packet stays within its buffer.
#![no_main]

use buffet_nfs::{Dpi, Firewall, FlowFwd, Ids, Ipsec, L2Fwd, MacSwap, Monitor, Policer};
use buffet_sdk::{NetworkFunction, Packet, PacketMeta, TenantId, Verdict, GROUP_CHUNK};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const PARAMS: usize = 16;
/// Headroom past each frame for NFs that grow packets.
const ROOM: usize = 256;

fn ip4(p: &[u8]) -> String {
    format!("{}.{}.{}.{}", p[0], p[1], p[2], p[3])
}

fn mac(p: &[u8]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        p[0], p[1], p[2], p[3], p[4], p[5]
    )
}

fn proto(b: u8) -> &'static str {
    ["tcp", "udp", "sctp", "icmp", "icmpv6", "any"][usize::from(b) % 6]
}

fn port_range(p: &[u8]) -> String {
    let (a, b) = (
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
    );
    format!("{}-{}", a.min(b), a.max(b))
}

fn firewall(v: u8, p: &[u8]) -> (Value, bool) {
    if v.is_multiple_of(2) {
        let doc = json!({
            "default": "deny", "allow_established": true,
            "conntrack_capacity": 4096, "established_timeout_s": 300,
            "rules": [
                { "action": "deny", "src": "192.168.1.0/24", "proto": "tcp", "dst_port": 22 },
                { "action": "allow", "src": "192.168.0.0/16", "proto": "tcp", "dst_port": "1-1023" },
                { "action": "allow", "dst": "2001:db8::53", "proto": "udp", "dst_port": 53 }
            ]
        });
        return (doc, true);
    }
    let fuzzed = json!({
        "default": if p[0] & 1 == 0 { "allow" } else { "deny" },
        "allow_established": p[0] & 2 != 0,
        "conntrack_capacity": 1 + u32::from(p[1] % 8),
        "established_timeout_s": u32::from(p[2] % 4),
        "rules": [
            { "action": "deny", "src": format!("{}/{}", ip4(&p[3..7]), p[7] % 33),
              "proto": proto(p[8]), "dst_port": port_range(&p[9..13]) },
            { "action": "allow", "dst": format!("2001:db8::{:x}/{}", p[13], 96 + p[14] % 33),
              "proto": proto(p[15]) },
            { "action": "allow", "proto": "any" }
        ]
    });
    (fuzzed, false)
}

fn ids(v: u8, p: &[u8]) -> (Value, bool) {
    if v.is_multiple_of(2) {
        let rules = "alert tcp any 80 (msg:\"evil in HTTP\"; content:\"evil\"; nocase; sid:1001;)\n\
                     alert udp any any -> any 53 (msg:\"bad domain\"; content:\"|03|bad|03|com\"; sid:1002;)\n";
        let doc =
            json!({ "mode": "block", "log_per_second": 10, "recent_alerts": 64, "rules": rules });
        return (doc, true);
    }
    let hex: Vec<String> = p[2..2 + 1 + usize::from(p[1] % 12)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let rules = format!(
        "alert {} any any -> any any (msg:\"fuzzed\"; content:\"|{}|\"; {}sid:7;)\n\
         alert ip any any -> any any (msg:\"short\"; content:\"{}\"; sid:8;)\n",
        proto(p[0]),
        hex.join(" "),
        if p[0] & 0x80 != 0 { "nocase; " } else { "" },
        char::from(b'a' + p[15] % 26),
    );
    let doc = json!({
        "mode": if p[0] & 0x40 != 0 { "block" } else { "alert" },
        "log_per_second": u32::from(p[14] % 3),
        "recent_alerts": 1 + u32::from(p[13] % 4),
        "rules": rules
    });
    (doc, false)
}

fn dpi(v: u8, p: &[u8]) -> (Value, bool) {
    if v.is_multiple_of(2) {
        let doc = json!({ "blacklist": ["example.com", "ads.tracker.net"], "ports": [80, 8080] });
        return (doc, true);
    }
    let label: String = p[1..1 + usize::from(p[0] % 15)]
        .iter()
        .map(|b| char::from(b'a' + b % 26))
        .collect();
    let doc = json!({ "blacklist": [format!("{label}.com"), label, "*.example.org"] });
    (doc, false)
}

fn policer(v: u8, p: &[u8]) -> (Value, bool) {
    if v.is_multiple_of(2) {
        return (
            json!({ "rate": 1_250_000, "burst": 15_000, "unit": "bytes" }),
            true,
        );
    }
    let rate = u64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
    let burst = u64::from(u16::from_be_bytes([p[4], p[5]]));
    let unit = if p[6] & 1 == 0 { "bytes" } else { "packets" };
    (json!({ "rate": rate, "burst": burst, "unit": unit }), false)
}

fn l2fwd(v: u8, p: &[u8]) -> (Value, bool) {
    if v.is_multiple_of(2) {
        let doc = json!({ "default": "drop", "entries": [
            { "mac": "02:00:00:00:00:01", "port": 1 },
            { "mac": "ff:ff:ff:ff:ff:ff", "port": 7 }
        ]});
        return (doc, true);
    }
    let doc = json!({ "default": u16::from(p[12]), "entries": [
        { "mac": mac(&p[0..6]), "port": u16::from(p[13]) },
        { "mac": mac(&p[6..12]).to_uppercase().replace(':', "-"), "port": 65535 }
    ]});
    (doc, false)
}

fn flowfwd(v: u8, p: &[u8]) -> (Value, bool) {
    if v.is_multiple_of(2) {
        let doc = json!({ "default": 0, "flows": [
            { "src": "192.168.0.1", "dst": "10.0.0.1", "proto": "tcp",
              "src_port": 40000, "dst_port": 80, "port": 2 },
            { "src": "2001:db8::1", "dst": "2001:db8::2", "proto": "icmpv6", "port": 3 }
        ]});
        return (doc, true);
    }
    let ports = p[8] % 3 < 2;
    let l4 = ["tcp", "udp", "sctp"][usize::from(p[8] % 3)];
    let mut flow = json!({ "src": ip4(&p[0..4]), "dst": ip4(&p[4..8]), "proto": l4, "port": 9 });
    if ports {
        flow["src_port"] = json!(u16::from_be_bytes([p[9], p[10]]));
        flow["dst_port"] = json!(u16::from_be_bytes([p[11], p[12]]));
    }
    let default = if p[13] & 1 == 0 {
        json!("drop")
    } else {
        json!(1)
    };
    (json!({ "default": default, "flows": [flow] }), false)
}

fn ipsec(v: u8, p: &[u8]) -> (Value, bool) {
    let key_out = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fcafebabe";
    let key_in = "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3fdecafbad";
    if v.is_multiple_of(2) {
        let doc = json!({
            "replay_window": 64, "unmatched": "drop", "mtu": 1500,
            "outbound_port": 1, "inbound_port": 0,
            "outbound_eth": { "src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02" },
            "inbound_eth": { "dst": "02:00:00:00:00:03" },
            "outbound": [{ "spi": 0x1001, "key": key_out, "local": "203.0.113.1",
                "remote": "198.51.100.1", "selector": "10.2.0.0/16", "ttl": 64, "esn": false }],
            "inbound": [{ "spi": 0x2001, "key": key_in, "local": "203.0.113.1",
                "remote": "198.51.100.1", "selector": "10.2.0.0/16", "replay_window": 128 }]
        });
        return (doc, true);
    }
    // Everything goes through the SA, which is also the inbound one: outbound ESP
    // packets fed back come in again.
    let doc = json!({
        "replay_window": 1 + u32::from(u16::from_be_bytes([p[0], p[1]]) % 4096),
        "unmatched": if p[2] & 1 == 0 { "pass" } else { "drop" },
        "mtu": 68 + u32::from(u16::from_be_bytes([p[3], p[4]]) % 1500),
        "outbound": [{ "spi": 0x1001, "key": key_out, "local": "203.0.113.1",
            "remote": "198.51.100.1", "selector": "0.0.0.0/0", "esn": p[2] & 2 != 0 }],
        "inbound": [{ "spi": 0x1001, "key": key_out, "local": "198.51.100.1",
            "remote": "203.0.113.1", "esn": p[2] & 2 != 0 }]
    });
    (doc, false)
}

/// Frames of the input: `[len: u16 BE][bytes]`, the last one possibly short.
fn frames(mut rest: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while rest.len() >= 2 && out.len() < 64 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let end = (2 + len).min(rest.len());
        out.push(&rest[2..end]);
        rest = &rest[end..];
    }
    out
}

fn run<N: NetworkFunction>(nf: &N, (policy, documented): (Value, bool), input: &[&[u8]]) {
    let policy: N::Policy = match serde_json::from_value(policy) {
        Ok(p) => p,
        Err(e) => {
            assert!(
                !documented,
                "{}: documented policy rejected: {e}",
                nf.name()
            );
            return;
        }
    };
    let mut state = N::State::default();
    if let Err(e) = nf.init(&policy, &mut state) {
        assert!(
            !documented,
            "{}: documented policy rejected: {e}",
            nf.name()
        );
        return;
    }
    let mut bufs: Vec<Vec<u8>> = input
        .iter()
        .map(|f| {
            let mut b = f.to_vec();
            b.resize(f.len() + ROOM, 0);
            b
        })
        .collect();
    let mut ts = 1_000_000_000u64;
    let mut group: Vec<Packet<'_>> = Vec::new();
    for (i, (buf, frame)) in bufs.iter_mut().zip(input).enumerate() {
        ts += 1_000_000 * (1 + frame.len() as u64 % 7);
        let meta = PacketMeta {
            in_port: (i % 3) as u16,
            ts_ns: ts,
            tenant: TenantId(1),
        };
        let Ok(mut pkt) = Packet::parse_with_capacity(buf, frame.len(), meta) else {
            continue;
        };
        if i % 2 == 0 {
            let _ = nf.handle(&mut pkt, &mut state);
            assert!(pkt.len() <= pkt.capacity());
        } else {
            group.push(pkt);
        }
    }
    for chunk in group.chunks_mut(GROUP_CHUNK) {
        let mut verdicts = vec![Verdict::Fault; chunk.len()];
        nf.handle_group(chunk, &mut state, &mut verdicts);
        assert!(chunk.iter().all(|p| p.len() <= p.capacity()));
    }
    let _ = nf.summary(&state);
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 + PARAMS {
        return;
    }
    let (nf, variant) = (data[0] % 9, data[1]);
    let p = &data[2..2 + PARAMS];
    let input = frames(&data[2 + PARAMS..]);
    match nf {
        0 => {
            let policy = if variant.is_multiple_of(2) {
                json!({})
            } else {
                json!({ "flow_capacity": 1 + u32::from(p[0] % 16) })
            };
            run(&Monitor::default(), (policy, true), &input)
        }
        1 => run(&Firewall::default(), firewall(variant, p), &input),
        2 => run(&Ids::default(), ids(variant, p), &input),
        3 => run(&Dpi::default(), dpi(variant, p), &input),
        4 => run(&MacSwap, (json!({}), true), &input),
        5 => run(&Policer, policer(variant, p), &input),
        6 => run(&L2Fwd::default(), l2fwd(variant, p), &input),
        7 => run(&FlowFwd::default(), flowfwd(variant, p), &input),
        _ => run(&Ipsec::default(), ipsec(variant, p), &input),
    }
});
