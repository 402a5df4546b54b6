//! `buffet run --port dpdk` end to end on a live link (root only, cargo feature
//! `io-dpdk`): DPDK's `net_af_packet` vdev on one end of a veth pair in network namespace
//! A (EAL arguments `--no-huge --no-pci --vdev net_af_packet0,iface=…`), traffic for
//! three tenants plus unmatched frames sent from the other end in namespace B; the
//! per-tenant counts of the sender are checked against `--stats-json`, the port's
//! counters against what was sent, and the frames the NF passes are counted back in B —
//! on the same link, or with `--tx-iface` on a second veth pair (mbufs copied into the
//! AF_PACKET transmit port's heap frames). Also: an interface that does not exist is
//! refused before the EAL starts; and buffetd with a `kind = "dpdk"` port in its config
//! (the same vdev), tenants applied through the `buffet` client, counts each tenant's
//! frames exactly and sends the passed ones back. A 3000-byte frame from DPDK's
//! `net_pcap` vdev (two mbuf segments) is counted as oversize.
//!
//! The sender is this test binary itself, re-run inside namespace B (`ip netns exec`)
//! as the ignored test `dpdk_sender_helper`, which sends a pcap through buffet's own
//! AF_PACKET port and counts what comes back.
//!
//! Without root every test skips with a `SKIP (privilege)` line; under
//! `BUFFET_REQUIRE_PRIVILEGED=1` (or CI) that skip is a failure.
#![cfg(feature = "io-dpdk")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use buffet::io::pcap::PcapWriter;

mod common;
use common::daemon::{config_head, write_config, Daemon};
use common::netns::{self, ip, privileged, start_run, tenant_rows, NsPair};
use etherparse::PacketBuilder;

const BUFFET: &str = env!("CARGO_BIN_EXE_buffet");
/// Marks the payload of every frame the test sends.
const MARK: &[u8] = b"BUFFET-DPDK";

const TENANTS: &str = r#"
[[tenant]]
id = 1
name = "alpha"
rules = [ { dst_ip = "10.1.0.0/16" } ]

[[tenant]]
id = 2
name = "beta"
rules = [ { dst_ip = "10.2.0.0/16", protocol = "udp", dst_port = "5000-5099" } ]

[[tenant]]
id = 3
name = "gamma"
rules = [ { src_ip = "192.168.3.0/24" } ]
"#;

/// One UDP/IPv4 frame carrying the mark and a sequence number.
fn udp4(src: [u8; 4], dst: [u8; 4], dport: u16, seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ipv4(src, dst, 64)
        .udp(40000, dport)
        .write(&mut v, &payload)
        .unwrap();
    v
}

/// Writes `frames` to the pcap `path`, 1 µs apart.
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::create(path).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write(i as u64 * 1000, f).unwrap();
    }
    w.flush().unwrap();
}

/// The frames, round robin over the tenants and the unmatched ones; each tenant's count;
/// the unmatched count.
fn traffic() -> (Vec<Vec<u8>>, Vec<(u64, u64)>, u64) {
    let other = [172, 16, 0, 1];
    let mut per: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut seq = 0;
    for (t, k) in [(1u8, 40u32), (2, 55), (3, 70)] {
        let mut v = Vec::new();
        for i in 0..k {
            seq += 1;
            let i8 = (i % 200) as u8 + 1;
            v.push(match t {
                1 => udp4(other, [10, 1, i8, 7], 80, seq),
                2 => udp4(other, [10, 2, 0, i8], 5000 + (i % 100) as u16, seq),
                _ => udp4([192, 168, 3, i8], [198, 18, 0, 1], 443, seq),
            });
        }
        per.push(v);
    }
    // Nobody's: tenant 2's network outside its port range, and an unknown address.
    let unmatched: Vec<Vec<u8>> = (0..12u32)
        .map(|i| match i % 2 {
            0 => udp4(other, [10, 2, 0, 1], 6000, 100_000 + i),
            _ => udp4(other, [198, 51, 100, 1], 80, 100_000 + i),
        })
        .collect();
    let counts = per
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u64 + 1, v.len() as u64))
        .collect();
    let n_unmatched = unmatched.len() as u64;
    let mut iters: Vec<_> = per.into_iter().map(|v| v.into_iter()).collect();
    iters.push(unmatched.into_iter());
    let mut frames = Vec::new();
    loop {
        let before = frames.len();
        for it in &mut iters {
            frames.extend(it.next());
        }
        if frames.len() == before {
            break;
        }
    }
    (frames, counts, n_unmatched)
}

/// [`dpdk_sender_helper`] in namespace B, sending `pcap` and expecting `expect` frames
/// back; it writes its counts to `out`.
fn sender(ns: &NsPair, pcap: &Path, expect: u64, out: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns.b])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "dpdk_sender_helper",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("BUFFET_LIVE_SEND", pcap)
        .env("BUFFET_LIVE_IFACE", &ns.vb)
        .env("BUFFET_LIVE_EXPECT", expect.to_string())
        .env("BUFFET_LIVE_OUT", out);
    c
}

/// Runs in namespace B: [`netns::sender`] with this test's mark.
#[test]
#[ignore = "helper: run by dpdk_port_counts_agree inside a network namespace"]
fn dpdk_sender_helper() {
    netns::sender(MARK);
}

#[test]
fn dpdk_port_counts_agree() {
    if !privileged("live_dpdk::dpdk_port_counts_agree") {
        return;
    }
    run_and_check(&NsPair::new(), None);
}

#[test]
fn dpdk_frames_leave_through_an_af_packet_tx_iface() {
    if !privileged("live_dpdk::dpdk_frames_leave_through_an_af_packet_tx_iface") {
        return;
    }
    let ns = NsPair::new();
    let (va2, vb2) = ns.second_pair();
    run_and_check(&ns, Some((&va2, &vb2)));
}

/// Sends the traffic from B into `buffet run --port dpdk` on A and checks every count;
/// with `tx = (A side, B side)` of a second pair, passed frames must come back on that
/// pair.
fn run_and_check(ns: &NsPair, tx: Option<(&str, &str)>) {
    let dir = tempfile::tempdir().unwrap();
    let (frames, per_tenant, unmatched) = traffic();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &frames);
    let stats = dir.path().join("stats.json");
    let eal = format!("--no-huge --no-pci --vdev net_af_packet0,iface={}", ns.va);
    let mut args: Vec<std::ffi::OsString> = [
        "--port",
        "dpdk",
        "--iface",
        &ns.va,
        "--eal",
        &eal,
        "--nf",
        "monitor",
        "--workers",
        "2",
        "--no-pin",
        "--duration",
        "6",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.extend(["--tenants".into(), tenants.into_os_string()]);
    args.extend(["--stats-json".into(), stats.clone().into_os_string()]);
    if let Some((a, _)) = tx {
        args.extend(["--tx-iface".into(), a.into()]);
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (child, stderr) = start_run(&ns.a, &args);
    let passed: u64 = per_tenant.iter().map(|(_, k)| k).sum();
    let result = dir.path().join("sender.txt");
    let sender = sender(ns, &pcap, passed, &result)
        .envs(tx.map(|(_, b)| ("BUFFET_LIVE_CAPTURE", b)))
        .output()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    assert!(
        sender.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sender.stdout),
        String::from_utf8_lossy(&sender.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    assert!(
        err.contains(&format!("EAL arguments: --no-shconf --no-telemetry {eal}")),
        "the run says which EAL arguments it used: {err}"
    );
    let r = std::fs::read_to_string(&result).unwrap();
    let n: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (sent, back_iface, back_tx) = (n[0], n[1], n[2]);
    assert_eq!(sent, frames.len() as u64);

    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let by_id = tenant_rows(&json);
    let want: Vec<(u64, u64, u64)> = per_tenant.iter().map(|&(id, k)| (id, k, k)).collect();
    assert_eq!(
        by_id, want,
        "per tenant (id, packets, passed): workers vs sender\n{stdout}\n{err}"
    );
    let g = &json["global"];
    assert_eq!(g["input_packets"].as_u64(), Some(sent), "{stdout}");
    assert_eq!(g["unmatched"].as_u64(), Some(unmatched), "{stdout}");
    let ports = json["input"]["ports"].as_array().unwrap();
    let port = &ports[0];
    assert_eq!(port["name"].as_str(), Some("dpdk:net_af_packet0"), "{port}");
    assert_eq!(port["rx"].as_u64(), Some(sent), "{port}");
    assert_eq!(port["rx_dropped"].as_u64(), Some(0), "{port}");
    assert_eq!(port["tx_dropped"].as_u64(), Some(0), "{port}");
    match tx {
        None => {
            assert_eq!(ports.len(), 1, "{ports:?}");
            assert_eq!(port["tx"].as_u64(), Some(passed), "{port}");
            assert_eq!(back_iface, passed, "every passed frame came back out, once");
        }
        Some(_) => {
            assert_eq!(ports.len(), 2, "{ports:?}");
            assert_eq!(port["tx"].as_u64(), Some(0), "{port}");
            assert_eq!(ports[1]["tx"].as_u64(), Some(passed), "{}", ports[1]);
            assert_eq!(back_iface, 0, "nothing came back on the receiving link");
            assert_eq!(
                back_tx, passed,
                "every passed frame left through --tx-iface, once"
            );
        }
    }
}

/// For a test that needs root (`None`, having said so, without): the namespace pair, a
/// directory, and [`TENANTS`] written there as tenants.toml.
fn setup(test: &str) -> Option<(NsPair, tempfile::TempDir, PathBuf)> {
    if !privileged(test) {
        return None;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    Some((ns, dir, tenants))
}

#[test]
fn dpdk_on_a_missing_interface_is_refused_before_the_eal_starts() {
    let Some((ns, _dir, tenants)) =
        setup("live_dpdk::dpdk_on_a_missing_interface_is_refused_before_the_eal_starts")
    else {
        return;
    };
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.a, BUFFET, "run", "--port", "dpdk"])
        .args(["--iface", "buffet-nope0", "--nf", "monitor", "--tenants"])
        .arg(&tenants)
        .args(["--duration", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("\"buffet-nope0\" does not exist"),
        "a clear error: {err}"
    );
    assert!(!err.contains("running on"), "nothing ran: {err}");
    assert!(!err.contains("EAL: "), "the EAL never started: {err}");
}

/// buffetd started from a config with a `kind = "dpdk"` port (EAL arguments in the
/// config, as `buffet run --eal` takes them) in namespace A; tenants applied with the
/// `buffet` client (run in A too, where the API listens); the frames sent from B are
/// counted per tenant exactly, the unmatched ones not at all, and the passed ones come
/// back out of the interface. SIGTERM ends it with status 0.
#[test]
fn buffetd_serves_a_dpdk_port() {
    if !privileged("live_dpdk::buffetd_serves_a_dpdk_port") {
        return;
    }
    let ns = NsPair::new();
    ip(&["-n", &ns.a, "link", "set", "lo", "up"]);
    let dir = tempfile::tempdir().unwrap();
    let token = "admin-token-for-the-dpdk-daemon-test";
    let cfg = write_config(
        dir.path(),
        &format!(
            "{}[dataplane]\nworkers = 2\narena_mib = 64\ntenant_slots = 16\npin = false\n\
             [[port]]\nkind = \"dpdk\"\niface = \"{iface}\"\n\
             eal = [\"--no-huge --no-pci\", \"--vdev net_af_packet0,iface={iface}\"]\n",
            config_head(&dir.path().join("data"), 7980, "monitor"),
            iface = ns.va
        ),
    );
    let tenants = dir.path().join("tenants.toml");
    // The daemon refuses overlapping rules at one priority: gamma's source prefix could
    // overlap the others' destinations, so it gets its own (its frames match it alone).
    let src_rule = r#"{ src_ip = "192.168.3.0/24" }"#;
    assert!(TENANTS.contains(src_rule));
    let daemon_tenants =
        TENANTS.replace(src_rule, r#"{ src_ip = "192.168.3.0/24", priority = 50 }"#);
    std::fs::write(&tenants, daemon_tenants).unwrap();
    let mut daemon = Daemon::start_in(&ns.a, &cfg, 7980, token);
    let (ok, _, err) = daemon.client(&["tenant".as_ref(), "apply".as_ref(), tenants.as_os_str()]);
    assert!(ok, "{err}");
    let (frames, per_tenant, _unmatched) = traffic();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &frames);
    let passed: u64 = per_tenant.iter().map(|(_, k)| k).sum();
    let result = dir.path().join("sender.txt");
    let sender = sender(&ns, &pcap, passed, &result).output().unwrap();
    assert!(
        sender.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sender.stdout),
        String::from_utf8_lossy(&sender.stderr)
    );
    let r = std::fs::read_to_string(&result).unwrap();
    let n: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(n[0], frames.len() as u64, "sent");
    let counts = |v: &serde_json::Value| -> Vec<(u64, u64, u64)> {
        let mut c: Vec<(u64, u64, u64)> = v["tenants"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| {
                        (
                            t["id"].as_u64().unwrap_or(0),
                            t["packets"].as_u64().unwrap_or(0),
                            t["passed"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        c.sort_unstable();
        c
    };
    let want: Vec<(u64, u64, u64)> = per_tenant.iter().map(|&(id, k)| (id, k, k)).collect();
    let t0 = Instant::now();
    loop {
        let (ok, v, err) = daemon.client(&["stats"]);
        assert!(ok, "{err}");
        if counts(&v) == want {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "per tenant (id, packets, passed): daemon {:?}, sender {want:?}\n{v}",
            counts(&v)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(n[1], passed, "every passed frame came back out, once");
    daemon.signal("TERM");
    let status = daemon.child.wait().unwrap();
    let mut err = String::new();
    let _ = daemon.child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "EAL arguments: --no-shconf --no-telemetry --no-huge --no-pci --vdev \
             net_af_packet0,iface={}",
            ns.va
        )),
        "buffetd says which EAL arguments it used: {err}"
    );
}

/// A frame larger than a frame buffer on a DPDK port: DPDK's `net_pcap` vdev reads a
/// pcap holding five frames for tenant 1 and one of 3000 bytes, which it hands over as
/// an mbuf chain of two segments. The port counts it as oversize (`rx_oversize`), and the
/// report as input and `global.oversize`.
#[test]
fn a_dpdk_frame_larger_than_a_frame_buffer_is_oversize() {
    let Some((ns, dir, tenants)) =
        setup("live_dpdk::a_dpdk_frame_larger_than_a_frame_buffer_is_oversize")
    else {
        return;
    };
    let pcap = dir.path().join("jumbo.pcap");
    let mut w = PcapWriter::create(&pcap).unwrap();
    for seq in 0..5 {
        w.write(
            seq * 1000,
            &udp4([172, 16, 0, 1], [10, 1, 0, 1], 80, seq as u32),
        )
        .unwrap();
    }
    let mut jumbo = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ipv4([172, 16, 0, 1], [10, 1, 0, 1], 64)
        .udp(40000, 80)
        .write(&mut jumbo, &[b'j'; 2958])
        .unwrap();
    assert_eq!(jumbo.len(), 3000);
    w.write(6000, &jumbo).unwrap();
    w.flush().unwrap();
    let stats = dir.path().join("stats.json");
    let eal = format!(
        "--no-huge --no-pci --vdev net_pcap0,rx_pcap={}",
        pcap.display()
    );
    let args = [
        "--port",
        "dpdk",
        "--iface",
        &ns.va,
        "--eal",
        &eal,
        "--nf",
        "monitor",
        "--no-pin",
        "--duration",
        "2",
        "--tenants",
        tenants.to_str().unwrap(),
        "--stats-json",
        stats.to_str().unwrap(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let (child, stderr) = start_run(&ns.a, &args);
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    assert!(out.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let g = &json["global"];
    assert_eq!(g["oversize"].as_u64(), Some(1), "{g}\n{err}");
    assert_eq!(g["input_packets"].as_u64(), Some(6), "{g}");
    assert_eq!(tenant_rows(&json).first().map(|r| r.1), Some(5), "{json}");
}
