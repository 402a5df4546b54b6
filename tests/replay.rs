//! End to end: `buffet replay` on a pcap built here, checked tenant by tenant.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output};

use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;
use std::time::Duration;

fn udp(dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 1, 10], dst, 64)
        .udp(40000, dport)
        .write(&mut v, payload)
        .unwrap();
    v
}

fn tcp6(dst_last: u8) -> Vec<u8> {
    let mut dst = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    dst[15] = dst_last;
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6([0xfe; 16], dst, 64)
        .tcp(1234, 80, 1, 1000)
        .write(&mut v, b"GET / HTTP/1.1\r\n\r\n")
        .unwrap();
    v
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(File::create(path).unwrap(), header).unwrap();
    for (i, f) in frames.iter().enumerate() {
        let ts = Duration::from_micros(1000 * i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .unwrap();
    }
}

/// `buffet replay --nf <nf> --no-pin --tenants <tenants> --input <input>` plus `extra`.
fn replay(nf: &str, tenants: &Path, input: &Path, extra: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(["replay", "--nf", nf, "--no-pin"])
        .arg("--tenants")
        .arg(tenants)
        .arg("--input")
        .arg(input)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn replay_counts_every_tenant_and_every_bad_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut frames = Vec::new();
    // Tenant 7: everything to 10.7.0.0/16 — 30 packets.
    for i in 0..30u8 {
        frames.push(udp([10, 7, 0, i], 53, b"seven"));
    }
    // Tenant 8: UDP 5000-5099 to 10.8.0.0/16 (higher priority than tenant 9's rule).
    for p in [5000u16, 5050, 5099] {
        frames.push(udp([10, 8, 1, 1], p, b"eight"));
    }
    // Tenant 9: the rest of 10.8.0.0/16, and IPv6 2001:db8::/64.
    frames.push(udp([10, 8, 1, 1], 5100, b"nine"));
    for i in 0..4 {
        frames.push(tcp6(i));
    }
    // Unmatched.
    for _ in 0..5 {
        frames.push(udp([172, 16, 0, 1], 53, b"nobody"));
    }
    // Malformed: truncated Ethernet, truncated IP, IHL < 5, total length beyond the
    // buffer, unknown EtherType, truncated UDP.
    let good = udp([10, 7, 0, 1], 53, b"x");
    let mut malformed = vec![good[..8].to_vec(), good[..20].to_vec()];
    let mut ihl = good.clone();
    ihl[14] = 0x43;
    malformed.push(ihl);
    let mut long = good.clone();
    long[16] = 0x05;
    malformed.push(long);
    let mut ethertype = good.clone();
    ethertype[12] = 0x88;
    ethertype[13] = 0xb5;
    malformed.push(ethertype);
    let mut short_udp = good[..14 + 20 + 4].to_vec();
    short_udp[17] = 24;
    malformed.push(short_udp);
    for _ in 0..10 {
        frames.extend(malformed.iter().cloned());
    }
    // Larger than a frame buffer (2 KiB): counted as input and oversize, nothing else.
    frames.push(udp([10, 7, 0, 1], 53, &[0x55; 3000]));
    frames.push(udp([10, 7, 0, 2], 53, &[0x55; 9000]));
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &frames);
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        r#"
[[tenant]]
id = 7
name = "acme"
rules = [ { dst_ip = "10.7.0.0/16" } ]

[[tenant]]
id = 8
name = "globex"
rules = [ { dst_ip = "10.8.0.0/16", protocol = "udp", dst_port = "5000-5099", priority = 10 } ]
[tenant.policy]
flow_capacity = 64

[[tenant]]
id = 9
name = "initech"
rules = [ { dst_ip = "10.8.0.0/16", priority = 50 }, { dst_ip = "2001:db8::/64" } ]
"#,
    )
    .unwrap();
    let output = dir.path().join("out.pcap");
    let stats = dir.path().join("stats.json");
    let run = replay(
        "monitor",
        &tenants,
        &input,
        &[
            "--workers".as_ref(),
            "2".as_ref(),
            "--output".as_ref(),
            output.as_os_str(),
            "--stats-json".as_ref(),
            stats.as_os_str(),
        ],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let tenant = |id: u64| {
        json["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(tenant(7)["packets"], 30);
    assert_eq!(tenant(7)["passed"], 30);
    assert_eq!(tenant(7)["nf"]["flows"], 30);
    assert_eq!(tenant(8)["packets"], 3);
    assert_eq!(tenant(9)["packets"], 5);
    assert_eq!(tenant(9)["nf"]["flows"], 5);
    let bytes7: usize = frames[..30].iter().map(Vec::len).sum();
    assert_eq!(tenant(7)["bytes"], bytes7 as u64);
    let g = &json["global"];
    assert_eq!(g["input_packets"], frames.len() as u64);
    assert_eq!(g["oversize"], 2, "{g}");
    assert_eq!(g["unmatched"], 5);
    for reason in [
        "truncated_ethernet",
        "truncated_ip",
        "bad_ihl",
        "length_beyond_buffer",
        "unsupported_ethertype",
        "truncated_l4",
    ] {
        assert_eq!(g["malformed"][reason], 10, "{reason}: {g}");
    }
    // The output holds exactly the passed packets.
    let mut r = PcapReader::new(File::open(&output).unwrap()).unwrap();
    let mut n = 0;
    while let Some(p) = r.next_packet() {
        p.unwrap();
        n += 1;
    }
    assert_eq!(n, 30 + 3 + 5);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("acme") && stdout.contains("initech"),
        "{stdout}"
    );
}

#[test]
fn replay_rejects_a_bad_tenants_file_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[udp([10, 7, 0, 1], 53, b"x")]);
    let tenants = dir.path().join("bad.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 7\nname = \"acme\"\nrules = [ { dst_ip = \"10.7.0.0/33\" } ]\n",
    )
    .unwrap();
    let stats = dir.path().join("stats.json");
    let run = replay(
        "monitor",
        &tenants,
        &input,
        &["--stats-json".as_ref(), stats.as_os_str()],
    );
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("acme") && err.contains("rules[0].dst_ip"),
        "{err}"
    );
    assert!(!stats.exists(), "nothing may run on a bad tenants file");

    // A policy the NF rejects names the tenant and the field too.
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.7.0.0/16\" } ]\n[tenant.policy]\nflow_capacity = 0\n",
    )
    .unwrap();
    let run = replay("monitor", &tenants, &input, &[]);
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("tenant 7") && err.contains("flow_capacity"),
        "{err}"
    );
}

#[test]
fn replay_runs_a_firewall_per_tenant_with_overlapping_addresses() {
    // Two tenants with the same private addresses, told apart by VLAN: each has its own
    // ACL, and the drops land on the right tenant.
    let dir = tempfile::tempdir().unwrap();
    let vlan_udp = |vlan: u16, dport: u16| {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .single_vlan(etherparse::VlanId::try_new(vlan).unwrap())
            .ipv4([192, 168, 0, 1], [192, 168, 0, 2], 64)
            .udp(40000, dport)
            .write(&mut v, b"x")
            .unwrap();
        v
    };
    let mut frames = Vec::new();
    for _ in 0..10 {
        frames.push(vlan_udp(100, 53));
        frames.push(vlan_udp(100, 123));
        frames.push(vlan_udp(200, 53));
        frames.push(vlan_udp(200, 123));
    }
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &frames);
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        r#"
[[tenant]]
id = 1
name = "dns-only"
rules = [ { vlan = 100 } ]
[tenant.policy]
default = "deny"
rules = [ { action = "allow", proto = "udp", dst_port = 53 } ]

[[tenant]]
id = 2
name = "no-dns"
rules = [ { vlan = 200 } ]
[tenant.policy]
default = "allow"
rules = [ { action = "deny", proto = "udp", dst_port = 53 } ]
"#,
    )
    .unwrap();
    let stats = dir.path().join("stats.json");
    let run = replay(
        "firewall",
        &tenants,
        &input,
        &["--stats-json".as_ref(), stats.as_os_str()],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    for t in json["tenants"].as_array().unwrap() {
        assert_eq!(t["packets"], 20, "{t}");
        assert_eq!(t["passed"], 10, "{t}");
        assert_eq!(t["drops"]["policy"], 10, "{t}");
    }
}
