//! What the C NF tests share: building the example NFs, frames, tenant specs and
//! pipeline configurations. (The MPK skip gate is
//! `buffet_testkit::require_mpk`.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use buffet_dispatch::{DispatcherConfig, Match, SchedulerConfig};
use buffet_memory::Domain;
use buffet_sdk::TenantId;
use buffet_worker::{PipelineConfig, TenantSpec};

/// The flags docs/nf-authors.md documents for building a C NF that passes inspection
/// (plus warnings as errors).
pub const NF_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fPIC",
    "-shared",
    "-nostartfiles",
    "-fno-stack-protector",
    "-fstack-clash-protection",
    "-U_FORTIFY_SOURCE",
];

/// Compiles `examples/c-nf/<name>.c` into a shared object under the target's test
/// directory (once per process) and returns its path.
pub fn example_nf(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    build_nf(
        &root.join("examples/c-nf").join(format!("{name}.c")),
        name,
        NF_CFLAGS,
    )
}

/// Compiles `tests/nf/<name>.c` (attack NFs) like [`example_nf`].
pub fn test_nf(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nf")
        .join(format!("{name}.c"));
    build_nf(&src, name, NF_CFLAGS)
}

/// Compiles the C source `src` with `flags` into `<out_name>-<pid>.so` under the target's
/// test directory (once per process and name) and returns its path.
pub fn build_nf(src: &Path, out_name: &str, flags: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-nf");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{out_name}-{}.so", std::process::id()));
    if out.exists() {
        return out;
    }
    let tmp = dir.join(format!(
        "{out_name}-{}-{:?}.so.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(flags)
        .arg("-I")
        .arg(root.join("include"))
        .arg("-o")
        .arg(&tmp)
        .arg(src)
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

/// Tenant `t` owns 10.0.t.0/24, unpoliced, with a JSON policy.
pub fn spec(t: u32, policy: serde_json::Value) -> TenantSpec<serde_json::Value> {
    TenantSpec {
        id: TenantId(t),
        name: format!("t{t}"),
        rules: vec![(
            100,
            Match {
                dst_ip: Some(format!("10.0.{t}.0/24").parse().unwrap()),
                ..Match::default()
            },
        )],
        max_nb: 0,
        policy,
    }
}

/// `workers` unpinned worker threads in isolation domain `domain`.
pub fn cfg(workers: u16, domain: Domain) -> PipelineConfig {
    PipelineConfig {
        workers,
        pin: false,
        ring_size: 256,
        burst: 64,
        domain,
        dispatcher: DispatcherConfig {
            // Timeslots of 2^33 ns (8.6 s): every packet of these tests is in slot 0 at any
            // shift from 10 up, and the Worker Pool's supervision, which takes a worker
            // with queued packets and no completed burst for half a timeslot for stuck,
            // allows 4.3 s. At 2^30 (0.54 s) a worker's first burst under emulated pku
            // (scripts/mpk-vm.sh: QEMU TCG translating the code on its first run, on a
            // shared host) outlasted it and the worker was evacuated as stuck.
            sched: SchedulerConfig {
                shift: 33,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    }
}

/// Runs the test `name` of the current test binary again, alone, in a child process with
/// `env` set (the test sees the variable and does its child part), and checks it died of
/// `signal` after printing `child: <reached>` and before printing `child: survived`.
pub fn child_dies_of(name: &str, env: &str, reached: &str, signal: i32) {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("child: {reached}")), "{stdout}");
    assert!(!stdout.contains("child: survived"), "{stdout}");
    assert_eq!(out.status.signal(), Some(signal), "{stdout}");
}
