//! `buffet nf check` and `buffet replay --nf-ebpf` on the C examples: the verifier's
//! verdict on the command line, and the eBPF DPI giving the native DPI's per-tenant
//! results on the same pcap.

#[path = "build.rs"]
mod build;

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

fn buffet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
}

#[test]
fn nf_check_prints_the_verifiers_verdict() {
    let test = "nf check";
    let (Some(good), Some(bad)) = (
        build::object(test, "dpi"),
        build::object(test, "reject_oob"),
    ) else {
        return;
    };
    let ok = buffet().arg("nf").arg("check").arg(&good).output().unwrap();
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(out.starts_with("PASS: "), "{out}");
    for want in [
        "function dpi",
        "instructions:",
        "loops: terminate",
        "map blacklist: strset",
        "counters: packets, http_requests",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let fail = buffet().arg("nf").arg("check").arg(&bad).output().unwrap();
    let out = String::from_utf8_lossy(&fail.stdout);
    assert_eq!(fail.status.code(), Some(1));
    assert!(out.starts_with("FAIL: "), "{out}");
    assert!(
        out.contains("rejected by the verifier: ")
            && out.contains("Upper bound must be at most packet_size"),
        "{out}"
    );
    let loop_ = build::object(test, "reject_loop").unwrap();
    let fail = buffet()
        .arg("nf")
        .arg("check")
        .arg(&loop_)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&fail.stdout).contains("Loop counter is too large"));
}

fn http(dst: [u8; 4], host: &str, path: &str) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 1, 10], dst, 64)
        .tcp(40000, 80, 1, 1000)
        .write(
            &mut v,
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n").as_bytes(),
        )
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
        let ts = Duration::from_micros(100 * i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .unwrap();
    }
}

/// Per tenant: (packets, passed, drops, NF counters) from a replay's stats JSON.
fn results(stats: &Path) -> Vec<(u64, serde_json::Value)> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(stats).unwrap()).unwrap();
    json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut nf = t["nf"].clone();
            if let Some(m) = nf.as_object_mut() {
                m.retain(|k, _| !k.starts_with("blacklist_hits") && k != "faults");
            }
            (
                t["id"].as_u64().unwrap(),
                serde_json::json!({
                    "packets": t["packets"],
                    "passed": t["passed"],
                    "drops": t["drops"],
                    "nf": nf,
                }),
            )
        })
        .collect()
}

#[test]
fn replay_with_the_ebpf_dpi_matches_the_native_dpi_on_the_same_pcap() {
    let Some(dpi) = build::object("replay --nf-ebpf", "dpi") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hosts = [
        "example.com",
        "www.Example.com:8080",
        "news.org",
        "fine.net",
        "a.ads.tracker.net",
        "example.org",
    ];
    let mut frames = Vec::new();
    for round in 0..20 {
        for (t, dst) in [[10, 1, 0, 1], [10, 2, 0, 1], [10, 3, 0, 1]]
            .iter()
            .enumerate()
        {
            let h = hosts[(round + t) % hosts.len()];
            frames.push(http(*dst, h, &format!("/r{round}")));
        }
    }
    let input = dir.path().join("http.pcap");
    write_pcap(&input, &frames);
    let native_tenants = dir.path().join("native.toml");
    let ebpf_tenants = dir.path().join("ebpf.toml");
    let lists = [
        r#"["example.com", "ads.tracker.net"]"#,
        r#"["news.org"]"#,
        r#"["example.org", "fine.net"]"#,
    ];
    let mut native = String::new();
    let mut ebpf = String::new();
    for (i, l) in lists.iter().enumerate() {
        let id = i + 1;
        let head =
            format!("[[tenant]]\nid = {id}\nrules = [ {{ dst_ip = \"10.{id}.0.0/16\" }} ]\n");
        native.push_str(&format!("{head}[tenant.policy]\nblacklist = {l}\n\n"));
        ebpf.push_str(&format!(
            "{head}isolation = \"ebpf\"\n[tenant.policy.maps]\nblacklist = {{ strings = {l} }}\n\n"
        ));
    }
    std::fs::write(&native_tenants, native).unwrap();
    std::fs::write(&ebpf_tenants, ebpf).unwrap();
    let replay = |args: &[&str], tenants: &Path, stats: &Path| {
        let out = buffet()
            .arg("replay")
            .args(args)
            .args(["--workers", "2", "--no-pin", "--tenants"])
            .arg(tenants)
            .arg("--input")
            .arg(&input)
            .arg("--stats-json")
            .arg(stats)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let native_stats = dir.path().join("native.json");
    replay(&["--nf", "dpi"], &native_tenants, &native_stats);
    let want = results(&native_stats);
    assert!(
        want.iter()
            .all(|(_, r)| r["passed"].as_u64() < r["packets"].as_u64()),
        "every tenant blocks something: {want:?}"
    );
    for engine in ["interpreter", "jit"] {
        if engine == "jit" && !cfg!(target_arch = "x86_64") {
            continue;
        }
        let stats = dir.path().join(format!("{engine}.json"));
        let dpi = dpi.to_str().unwrap();
        let stderr = replay(
            &["--nf-ebpf", dpi, "--ebpf-engine", engine],
            &ebpf_tenants,
            &stats,
        );
        assert!(stderr.contains("isolation: ebpf"), "{stderr}");
        assert_eq!(results(&stats), want, "{engine}");
    }
    // --isolation ebpf without a program, and an eBPF program under another level, are
    // refused before anything runs.
    let out = buffet()
        .args(["replay", "--nf", "dpi", "--isolation", "ebpf", "--tenants"])
        .arg(&native_tenants)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --nf-ebpf"));
}
