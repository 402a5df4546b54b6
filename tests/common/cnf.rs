//! Helpers shared by the C NF replay tests (tests/replay_cnf.rs, tests/replay_trusted.rs,
//! tests/c_twins.rs):
//! building an example C NF, frames, pcaps, tenants files and reading the stats JSON.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;

/// `buffet replay`'s arguments that run the C NF `so` at `isolation` over `pcap` for the
/// tenants of `tenants` (callers add what their run needs besides).
pub fn nf_lib_args<'a>(
    so: &'a Path,
    isolation: &'a str,
    tenants: &'a Path,
    pcap: &'a Path,
) -> Vec<&'a OsStr> {
    vec![
        "--nf-lib".as_ref(),
        so.as_os_str(),
        "--isolation".as_ref(),
        isolation.as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
        "--input".as_ref(),
        pcap.as_os_str(),
    ]
}

/// Compiles examples/c-nf/<name>.c with the system C compiler into `dir`.
pub fn build_nf(dir: &Path, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(format!("{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args([
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-shared",
            "-nostartfiles",
        ])
        // docs/nf-authors.md: what a C NF needs to pass inspection at the mpk level.
        .args([
            "-fno-stack-protector",
            "-fstack-clash-protection",
            "-U_FORTIFY_SOURCE",
        ])
        .arg("-I")
        .arg(root.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("examples/c-nf").join(format!("{name}.c")))
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(st.success());
    out
}

/// A UDP frame to 10.`tenant`.0.1, port `dport`.
pub fn udp(tenant: u8, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 1, 10], [10, tenant, 0, 1], 64)
        .udp(40000, dport)
        .write(&mut v, b"payload!")
        .unwrap();
    v
}

/// Writes `frames` as an Ethernet pcap, one microsecond apart.
pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
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

/// Writes `dir/tenants.toml`: tenant `t` owns 10.t.0.0/16, with its policy (TOML
/// lines) and, if given, its `isolation` level.
pub fn tenants_file(dir: &Path, isolation: Option<&str>, policies: &[(u8, &str)]) -> PathBuf {
    let level = isolation.map_or(String::new(), |l| format!("isolation = \"{l}\"\n"));
    let mut text = String::new();
    for (t, policy) in policies {
        text.push_str(&format!(
            "[[tenant]]\nid = {t}\n{level}rules = [ {{ dst_ip = \"10.{t}.0.0/16\" }} ]\n[tenant.policy]\n{policy}\n\n"
        ));
    }
    let path = dir.join("tenants.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The stats JSON's row of tenant `id`.
pub fn tenant(stats: &serde_json::Value, id: u64) -> &serde_json::Value {
    stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap()
}
