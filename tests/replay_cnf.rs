//! End to end: `buffet replay --nf-lib nf.so --isolation mpk` with the example C NFs —
//! exact per-tenant counts, and an attacking tenant quarantined while the others carry on.
//! Needs a CPU with `pku`: without one it is a hardware skip (`buffet_testkit::require_mpk`),
//! a failure only under `BUFFET_REQUIRE_PKU=1`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use buffet_testkit::require_mpk;
use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

/// Compiles examples/c-nf/<name>.c with the system C compiler into `dir`.
fn build_nf(dir: &Path, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(format!("{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args([
            "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-I",
        ])
        .arg(root.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("examples/c-nf").join(format!("{name}.c")))
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(st.success());
    out
}

fn udp(tenant: u8, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 1, 10], [10, tenant, 0, 1], 64)
        .udp(40000, dport)
        .write(&mut v, b"payload!")
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
        let ts = Duration::from_micros(i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .unwrap();
    }
}

fn tenants_file(dir: &Path, policies: &[(u8, &str)]) -> PathBuf {
    let mut text = String::new();
    for (t, policy) in policies {
        text.push_str(&format!(
            "[[tenant]]\nid = {t}\nisolation = \"mpk\"\nrules = [ {{ dst_ip = \"10.{t}.0.0/16\" }} ]\n[tenant.policy]\n{policy}\n\n"
        ));
    }
    let path = dir.join("tenants.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn replay(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .arg("replay")
        .args(args)
        .output()
        .unwrap()
}

fn tenant(stats: &serde_json::Value, id: u64) -> &serde_json::Value {
    stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap()
}

#[test]
fn replay_runs_a_c_nf_under_mpk_and_contains_an_attacker() {
    if require_mpk(
        "replay_runs_a_c_nf_under_mpk_and_contains_an_attacker",
        buffet::memory::Mpk::get,
    )
    .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "malicious");
    let tenants = tenants_file(
        dir.path(),
        &[
            (1, "canary = 11"),
            (2, "attack = \"read-write\"\nattack_after = 40"),
            (3, "canary = 33"),
            (4, "canary = 44"),
        ],
    );
    let mut frames = Vec::new();
    for _ in 0..100 {
        for t in 1..=4u8 {
            for _ in 0..4 {
                frames.push(udp(t, 53));
            }
        }
    }
    let pcap = dir.path().join("in.pcap");
    write_pcap(&pcap, &frames);
    let stats = dir.path().join("stats.json");
    let out = replay(&[
        "--nf-lib".as_ref(),
        nf.as_os_str(),
        "--isolation".as_ref(),
        "mpk".as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
        "--input".as_ref(),
        pcap.as_os_str(),
        "--stats-json".as_ref(),
        stats.as_os_str(),
        "--no-pin".as_ref(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("QUARANTINED"), "{stdout}");
    assert!(
        stdout.contains("contained fault: tenant 2: buffet_pkt_handler touched"),
        "{stdout}"
    );
    let stats: serde_json::Value = serde_json::from_reader(File::open(&stats).unwrap()).unwrap();
    for id in [1u64, 3, 4] {
        let t = tenant(&stats, id);
        assert_eq!(t["packets"], 400, "{t}");
        assert_eq!(t["passed"], 400, "{t}");
        assert_eq!(t["quarantined"], false, "{t}");
        assert_eq!(t["nf"]["packets"], 400, "{t}");
        assert_eq!(t["nf"]["canary"], 11 * id, "{t}");
    }
    let attacker = tenant(&stats, 2);
    assert_eq!(attacker["quarantined"], true, "{attacker}");
    assert_eq!(attacker["passed"], 40, "{attacker}");
}

#[test]
fn replay_refuses_what_it_cannot_isolate() {
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "portblock");
    let tenants = tenants_file(dir.path(), &[(1, "blocked_ports = [22]")]);
    let pcap = dir.path().join("in.pcap");
    write_pcap(&pcap, &[udp(1, 22)]);
    let plain = dir.path().join("plain.toml");
    std::fs::write(
        &plain,
        std::fs::read_to_string(&tenants)
            .unwrap()
            .replace("isolation = \"mpk\"\n", ""),
    )
    .unwrap();
    let common = |isolation: &'static str| {
        replay(&[
            "--nf-lib".as_ref(),
            nf.as_os_str(),
            "--isolation".as_ref(),
            isolation.as_ref(),
            "--tenants".as_ref(),
            plain.as_os_str(),
            "--input".as_ref(),
            pcap.as_os_str(),
            "--no-pin".as_ref(),
        ])
    };
    for (level, expect) in [
        ("safe", "native code is not isolated by the type system"),
        ("ebpf", "it runs verified eBPF programs only"),
    ] {
        let out = common(level);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{level}");
        assert!(stderr.contains(expect), "{level}: {stderr}");
    }
    // A Rust NF under the tenants' `isolation = "mpk"` while the run says safe.
    let out = replay(&[
        "--nf".as_ref(),
        "monitor".as_ref(),
        "--isolation".as_ref(),
        "safe".as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
        "--input".as_ref(),
        pcap.as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("asks for isolation mpk but this replay runs safe"),
        "{stderr}"
    );
}
