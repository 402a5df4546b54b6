//! End to end: `buffet replay --nf-lib nf.so --isolation mpk` with the example C NFs —
//! exact per-tenant counts, and an attacking tenant quarantined while the others carry on.
//! Needs a CPU with `pku`: without one it is a hardware skip (`buffet_testkit::require_mpk`),
//! a failure only under `BUFFET_REQUIRE_PKU=1`.

use std::fs::File;
use std::process::Command;

use buffet_testkit::require_mpk;
mod common;
use common::cnf::{build_nf, nf_lib_args, tenant, tenants_file, udp, write_pcap};

fn replay(args: &[&std::ffi::OsStr]) -> std::process::Output {
    replay_env(args, &[])
}

/// [`replay`] with `vars` set in its environment.
fn replay_env(args: &[&std::ffi::OsStr], vars: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .arg("replay")
        .args(args)
        .envs(vars.iter().copied())
        .output()
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
        Some("mpk"),
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
        // Timeslots of 2^33 ns: the capture's 1.6 ms are one slot at 30 or 33, and the
        // Worker Pool's stall bound (half a timeslot) allows 4.3 s rather than 0.54 s for a
        // worker's first burst, which under emulated pku (scripts/mpk-vm.sh) is slow.
        "--shift".as_ref(),
        "33".as_ref(),
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
    let tenants = tenants_file(dir.path(), Some("mpk"), &[(1, "blocked_ports = [22]")]);
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
        let mut args = nf_lib_args(&nf, isolation, &plain, &pcap);
        args.push("--no-pin".as_ref());
        replay(&args)
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

/// `BUFFET_CNF_WATCHDOG_MS` sets the watchdog's budget of the C NFs a run loads (at
/// `trusted-native` here, which every CPU has); a value that is no budget stops the run
/// before any packet with an error that names the variable and what it takes.
#[test]
fn the_watchdog_budget_comes_from_the_environment_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "portblock");
    let tenants = tenants_file(dir.path(), None, &[(1, "blocked_ports = [22]")]);
    let pcap = dir.path().join("in.pcap");
    write_pcap(&pcap, &[udp(1, 22), udp(1, 53)]);
    let mut args = nf_lib_args(&nf, "trusted-native", &tenants, &pcap);
    args.push("--no-pin".as_ref());
    let run = |budget: &str| replay_env(&args, &[("BUFFET_CNF_WATCHDOG_MS", budget)]);
    let out = run("250");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in ["0", "10ms"] {
        let out = run(bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "BUFFET_CNF_WATCHDOG_MS={bad:?}: expected the watchdog's budget per C NF call \
                 in whole milliseconds, 1 to 60000"
            )),
            "{bad}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{bad}: {stderr}");
    }
}
