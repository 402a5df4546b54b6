//! End to end: `buffet replay --nf-lib nf.so --isolation trusted-native`, the level for C
//! NFs on CPUs without protection keys — exact per-tenant counts with several tenants, a
//! NULL-writing tenant quarantined while the others carry on, the warning on stderr, a
//! bare `--nf-lib` file name, and the `mpk` error pointing at this level. Runs on every
//! machine (no `pku` needed).

use std::fs::File;
use std::path::Path;
use std::process::Command;

mod common;
use common::cnf::{build_nf, tenant, tenants_file, udp, write_pcap};

fn buffet(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// Tenants 1..=4, 100 rounds of 4 packets each to port 53 plus one to port 22.
fn traffic(dir: &Path) {
    let mut frames = Vec::new();
    for _ in 0..100 {
        for t in 1..=4u8 {
            for i in 0..5 {
                frames.push(udp(t, if i == 4 { 22 } else { 53 }));
            }
        }
    }
    write_pcap(&dir.join("in.pcap"), &frames);
}

#[test]
fn trusted_native_runs_a_c_nf_for_several_tenants_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // A bare file name: the object in the current directory.
    build_nf(dir.path(), "portblock");
    tenants_file(
        dir.path(),
        None,
        &[
            (1, "blocked_ports = [22]\ncanary = 1"),
            (2, "blocked_ports = [22]\ncanary = 2"),
            (3, "blocked_ports = []\ncanary = 3"),
            (4, "blocked_ports = [22]\ncanary = 4"),
        ],
    );
    traffic(dir.path());
    let out = buffet(
        dir.path(),
        &[
            "replay",
            "--nf-lib",
            "portblock.so",
            "--isolation",
            "trusted-native",
            "--tenants",
            "tenants.toml",
            "--input",
            "in.pcap",
            "--stats-json",
            "stats.json",
            "--no-pin",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("WARNING: isolation: trusted-native — NO hardware isolation"),
        "{stderr}"
    );
    let stats: serde_json::Value =
        serde_json::from_reader(File::open(dir.path().join("stats.json")).unwrap()).unwrap();
    for id in 1..=4u64 {
        let t = tenant(&stats, id);
        let passed = if id == 3 { 500 } else { 400 };
        assert_eq!(t["packets"], 500, "{t}");
        assert_eq!(t["passed"], passed, "{t}");
        assert_eq!(t["quarantined"], false, "{t}");
        assert_eq!(t["nf"]["packets"], 500, "{t}");
        assert_eq!(t["nf"]["canary"], id, "{t}");
    }
}

#[test]
fn trusted_native_quarantines_a_null_write_and_the_others_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "malicious");
    tenants_file(
        dir.path(),
        None,
        &[
            (1, "canary = 11"),
            (2, "attack = \"null\"\nattack_after = 40"),
            (3, "canary = 33"),
            (4, "canary = 44"),
        ],
    );
    traffic(dir.path());
    let out = buffet(
        dir.path(),
        &[
            "replay",
            "--nf-lib",
            nf.to_str().unwrap(),
            "--isolation",
            "trusted-native",
            "--tenants",
            "tenants.toml",
            "--input",
            "in.pcap",
            "--stats-json",
            "stats.json",
            "--no-pin",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("QUARANTINED"), "{stdout}");
    assert!(
        stdout.contains(
            "contained fault: tenant 2: buffet_pkt_handler raised SIGSEGV at 0x0 \
             (address not mapped)"
        ),
        "{stdout}"
    );
    let stats: serde_json::Value =
        serde_json::from_reader(File::open(dir.path().join("stats.json")).unwrap()).unwrap();
    for id in [1u64, 3, 4] {
        let t = tenant(&stats, id);
        assert_eq!(t["packets"], 500, "{t}");
        assert_eq!(t["passed"], 500, "{t}");
        assert_eq!(t["quarantined"], false, "{t}");
        assert_eq!(t["nf"]["canary"], 11 * id, "{t}");
    }
    let faulty = tenant(&stats, 2);
    assert_eq!(faulty["quarantined"], true, "{faulty}");
    assert_eq!(faulty["passed"], 40, "{faulty}");
}

/// Without protection keys (`BUFFET_MPK=off` makes them look absent), `--isolation mpk`
/// fails and says how to choose trusted-native.
#[test]
fn the_mpk_error_names_trusted_native() {
    let dir = tempfile::tempdir().unwrap();
    build_nf(dir.path(), "portblock");
    tenants_file(dir.path(), None, &[(1, "blocked_ports = [22]")]);
    write_pcap(&dir.path().join("in.pcap"), &[udp(1, 53)]);
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .current_dir(dir.path())
        .env("BUFFET_MPK", "off")
        .args([
            "replay",
            "--nf-lib",
            "portblock.so",
            "--isolation",
            "mpk",
            "--tenants",
            "tenants.toml",
            "--input",
            "in.pcap",
            "--no-pin",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // Without --isolation, mpk is the default, and the error says that instead
    // (tests/cli_messages.rs).
    assert!(
        stderr.contains("error: --isolation mpk: MPK isolation is unavailable"),
        "{stderr}"
    );
    assert!(
        stderr.contains("choose --isolation trusted-native"),
        "{stderr}"
    );
}
