//! What the C NF tests share: building the example NFs, frames. (The MPK skip gate is
//! `buffet_testkit::require_mpk`.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `examples/c-nf/<name>.c` into a shared object under the target's test
/// directory (once per process) and returns its path.
pub fn example_nf(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("examples/c-nf").join(format!("{name}.c"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-nf");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{}.so", std::process::id()));
    if out.exists() {
        return out;
    }
    let tmp = dir.join(format!(
        "{name}-{}-{:?}.so.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-I",
        ])
        .arg(root.join("include"))
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
    assert!(status.success(), "compiling {}", src.display());
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// A UDP frame to 10.0.<tenant>.1, destination port `dport`.
pub fn frame(tenant: u32, dport: u16, payload_len: usize) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([192, 168, 0, 1], [10, 0, tenant as u8, 1], 64)
        .udp(1000 + tenant as u16, dport)
        .write(&mut v, &vec![tenant as u8; payload_len])
        .unwrap();
    v
}
