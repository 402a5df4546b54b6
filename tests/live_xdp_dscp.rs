//! End to end on a live link (root only): `buffet run --dispatch xdp` leaves each frame's
//! DSCP as it arrived. The XDP Packet Dispatcher hands the tenant slot to the workers in
//! the frame's XDP metadata; nothing reads a slot from DSCP, so the program must not
//! write one there. Frames marked DSCP 46 (EF, with ECN bits set too), IPv4 and IPv6,
//! for three tenants (fewer than 64, so every slot would fit in DSCP) are sent from
//! namespace B into a run on namespace A's end of a veth pair; every frame the NF passes
//! comes back byte for byte as it was sent: traffic class, header checksum and all.
//!
//! The sender is this test binary itself, re-run inside namespace B (`ip netns exec`) as
//! the ignored test `echo_helper`, which sends a pcap through buffet's own AF_PACKET port
//! and writes the marked frames that come back into another pcap.
//!
//! Without root the test skips with a `SKIP (privilege)` line; under
//! `BUFFET_REQUIRE_PRIVILEGED=1` (or CI) that skip is a failure.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use buffet::io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet::io::pcap::{PcapReader, PcapWriter};
use buffet::io::{HeapPool, PacketSource, Port};

mod common;
use common::netns::{privileged, start_run, tenant_rows, NsPair};
use etherparse::PacketBuilder;

/// Marks the payload of every frame that should come back.
const MARK: &[u8] = b"BUFFET-DSCP";
/// Expedited Forwarding, the DSCP every frame is sent with.
const EF: u8 = 46;
/// The ECN field of every frame sent (ECT(0)): the tag, when written, replaced all of
/// DSCP but kept ECN, so the whole traffic-class byte is checked.
const ECN: u8 = 0b10;

const TENANTS: &str = r#"
[[tenant]]
id = 1
name = "voice"
rules = [ { dst_ip = "10.1.0.0/16" } ]

[[tenant]]
id = 2
name = "video"
rules = [ { dst_ip = "10.2.0.0/16", protocol = "udp" } ]

[[tenant]]
id = 3
name = "voice-v6"
rules = [ { dst_ip = "fd00:3::/32" } ]
"#;

/// The payload: the mark and a sequence number, which names the frame that came back.
fn payload(seq: u32) -> Vec<u8> {
    let mut p = MARK.to_vec();
    p.extend_from_slice(&seq.to_be_bytes());
    p
}

/// A UDP/IPv4 frame to `dst` with DSCP 46 and ECT(0), header checksum valid.
fn udp4_ef(dst: [u8; 4], seq: u32) -> Vec<u8> {
    let mut v = Vec::new();
    let mut ip =
        etherparse::Ipv4Header::new(0, 64, etherparse::IpNumber::UDP, [172, 16, 0, 1], dst)
            .unwrap();
    ip.dscp = etherparse::IpDscp::try_new(EF).unwrap();
    ip.ecn = etherparse::IpEcn::try_new(ECN).unwrap();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
        .udp(40000, 5004)
        .write(&mut v, &payload(seq))
        .unwrap();
    assert_eq!(v[15], EF << 2 | ECN, "the frame carries DSCP 46 and ECT(0)");
    v
}

/// A UDP/IPv6 frame to `dst` with traffic class DSCP 46 and ECT(0).
fn udp6_ef(dst: [u8; 16], seq: u32) -> Vec<u8> {
    let mut v = Vec::new();
    let ip = etherparse::Ipv6Header {
        traffic_class: EF << 2 | ECN,
        flow_label: Default::default(),
        payload_length: 0,
        next_header: etherparse::IpNumber::UDP,
        hop_limit: 64,
        source: [0xfd, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        destination: dst,
    };
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ip(etherparse::IpHeaders::Ipv6(ip, Default::default()))
        .udp(40000, 5004)
        .write(&mut v, &payload(seq))
        .unwrap();
    assert_eq!(
        v[14] << 4 | v[15] >> 4,
        EF << 2 | ECN,
        "the frame carries DSCP 46 and ECT(0)"
    );
    v
}

/// The frames, with their sequence numbers 0.., and how many each tenant gets.
fn traffic() -> (Vec<Vec<u8>>, Vec<(u64, u64)>) {
    let mut frames = Vec::new();
    let (k1, k2, k3) = (23u32, 31u32, 17u32);
    for i in 0..k1.max(k2).max(k3) {
        let i8 = (i % 200) as u8 + 1;
        if i < k1 {
            frames.push(udp4_ef([10, 1, 0, i8], frames.len() as u32));
        }
        if i < k2 {
            frames.push(udp4_ef([10, 2, i8, 9], frames.len() as u32));
        }
        if i < k3 {
            let mut dst = [0xfd, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            dst[15] = i8;
            frames.push(udp6_ef(dst, frames.len() as u32));
        }
    }
    (
        frames,
        vec![(1, u64::from(k1)), (2, u64::from(k2)), (3, u64::from(k3))],
    )
}

/// Runs in namespace B: sends the pcap in `BUFFET_ECHO_SEND` out of `BUFFET_ECHO_IFACE`,
/// then collects the frames carrying [`MARK`] that come back until `BUFFET_ECHO_EXPECT`
/// arrived (and 300 ms more, to see any extra) or 5 s passed, and writes them to the pcap
/// `BUFFET_ECHO_BACK`. Does nothing when `BUFFET_ECHO_SEND` is unset (the helper run as an
/// ordinary ignored test).
#[test]
#[ignore = "helper: run by xdp_dispatch_keeps_each_frames_dscp inside a network namespace"]
fn echo_helper() {
    let Ok(pcap) = std::env::var("BUFFET_ECHO_SEND") else {
        return;
    };
    let iface = std::env::var("BUFFET_ECHO_IFACE").unwrap();
    let expect: usize = std::env::var("BUFFET_ECHO_EXPECT")
        .unwrap()
        .parse()
        .unwrap();
    let mut back = PcapWriter::create(std::env::var("BUFFET_ECHO_BACK").unwrap()).unwrap();
    let mut port = AfPacketPort::open(AfPacketConfig::new(&iface, 0)).unwrap();
    let mut pool = HeapPool::new(512);
    let mut reader = PcapReader::open(Path::new(&pcap)).unwrap();
    let mut burst = Vec::new();
    let mut sent = 0u64;
    while let Some(p) = reader.next_packet().unwrap() {
        let mut b = pool.take().unwrap();
        assert!(b.fill(p.data));
        burst.push(b);
        if burst.len() == 16 {
            sent += burst.len() as u64;
            port.tx_burst(&mut burst, &mut pool).unwrap();
            // Paced: the receiving rings are never the limit here.
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    sent += burst.len() as u64;
    port.tx_burst(&mut burst, &mut pool).unwrap();
    assert_eq!(port.stats().tx, sent, "the sender sent every frame");
    let mut rx = Vec::new();
    let mut got = 0usize;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut until = deadline;
    while Instant::now() < until {
        port.rx_burst(&mut pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            if b.data().windows(MARK.len()).any(|w| w == MARK) {
                back.write(got as u64, b.data()).unwrap();
                got += 1;
            }
            pool.give(b);
        }
        if got >= expect && until == deadline {
            until = Instant::now() + Duration::from_millis(300);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    back.flush().unwrap();
}

/// The sequence number in a marked frame's payload.
fn seq_of(frame: &[u8]) -> u32 {
    let at = frame
        .windows(MARK.len())
        .position(|w| w == MARK)
        .expect("a marked frame")
        + MARK.len();
    u32::from_be_bytes(frame[at..at + 4].try_into().unwrap())
}

#[test]
fn xdp_dispatch_keeps_each_frames_dscp() {
    if !privileged("live_xdp_dscp::xdp_dispatch_keeps_each_frames_dscp") {
        return;
    }
    let ns = NsPair::new();
    let (frames, per_tenant) = traffic();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let send = dir.path().join("send.pcap");
    let mut w = PcapWriter::create(&send).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write(i as u64 * 1000, f).unwrap();
    }
    w.flush().unwrap();
    let stats = dir.path().join("stats.json");
    let args: Vec<&std::ffi::OsStr> = [
        "--iface".as_ref(),
        ns.va.as_ref(),
        "--dispatch".as_ref(),
        "xdp".as_ref(),
        "--xdp-mode".as_ref(),
        "generic".as_ref(),
        "--no-pin".as_ref(),
        "--duration".as_ref(),
        "6".as_ref(),
        "--nf".as_ref(),
        "monitor".as_ref(),
        "--workers".as_ref(),
        "2".as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
        "--stats-json".as_ref(),
        stats.as_os_str(),
    ]
    .to_vec();
    let (child, stderr) = start_run(&ns.a, &args);
    let back = dir.path().join("back.pcap");
    let sender = Command::new("ip")
        .args(["netns", "exec", &ns.b])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "echo_helper", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("BUFFET_ECHO_SEND", &send)
        .env("BUFFET_ECHO_IFACE", &ns.vb)
        .env("BUFFET_ECHO_EXPECT", frames.len().to_string())
        .env("BUFFET_ECHO_BACK", &back)
        .output()
        .unwrap();
    assert!(
        sender.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sender.stdout),
        String::from_utf8_lossy(&sender.stderr)
    );
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    // The program classified every frame to its tenant (whose slot would fit in DSCP).
    assert_eq!(json["input"]["dispatch"].as_str(), Some("xdp"), "{json}");
    let want: Vec<(u64, u64, u64)> = per_tenant.iter().map(|&(id, k)| (id, k, k)).collect();
    assert_eq!(
        tenant_rows(&json),
        want,
        "per tenant (id, packets, passed)\n{err}{stdout}"
    );
    let slots: Vec<u64> = json["input"]["xdp"]["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["slot"].as_u64().unwrap())
        .collect();
    assert!(slots.iter().all(|&s| s <= 63), "slots {slots:?}");
    // Every frame came back once, exactly as it was sent.
    let mut got: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut r = PcapReader::open(&back).unwrap();
    while let Some(p) = r.next_packet().unwrap() {
        let seq = seq_of(p.data);
        assert!(
            got.insert(seq, p.data.to_vec()).is_none(),
            "frame {seq} came back twice"
        );
    }
    assert_eq!(
        got.len(),
        frames.len(),
        "every frame came back\n{err}{stdout}"
    );
    let mut by_dscp: BTreeMap<u8, usize> = BTreeMap::new();
    for (seq, f) in &got {
        let tc = match f[12..14] {
            [0x08, 0x00] => f[15],
            _ => f[14] << 4 | f[15] >> 4,
        };
        *by_dscp.entry(tc >> 2).or_default() += 1;
        assert_eq!(
            f,
            &frames[*seq as usize],
            "frame {seq} came back changed (traffic class {tc:#04x}, sent {:#04x})",
            EF << 2 | ECN
        );
    }
    assert_eq!(
        by_dscp,
        BTreeMap::from([(EF, frames.len())]),
        "frames back by DSCP: all as sent"
    );
}
