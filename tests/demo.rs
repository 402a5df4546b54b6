//! End to end: `buffet demo` runs without root or configuration, shows a migration off
//! an overloaded worker, and prints the same thing twice.

use std::process::Command;

fn demo(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .arg("demo")
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn demo_shows_migrations_and_is_deterministic() {
    let first = demo(&[]);
    assert!(first.contains("migrate tenant"), "{first}");
    assert!(
        first.contains("policed="),
        "the policed tenant shows its drops: {first}"
    );
    let migrations: usize = first
        .lines()
        .find_map(|l| l.strip_prefix("scheduler events: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("an events line");
    assert!(migrations >= 1);
    // 12 tenant rows.
    assert_eq!(
        first.lines().filter(|l| l.contains("tenant-")).count(),
        12,
        "{first}"
    );
    let second = demo(&[]);
    assert_eq!(first, second, "same seed, same output");
}

/// `(migrations, overload reports)` from the demo's events line.
fn events(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("scheduler events: "))
        .expect("an events line");
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    (nums[0], nums[1])
}

/// The same traffic under both planners: the slot-boundary planner migrates no more
/// tenants than Algorithm 1 and leaves fewer overload detections (the demo's traffic is
/// seeded and runs in virtual time, so both runs see the same packets).
#[test]
fn demo_planner_ours_migrates_no_more_for_less_overload() {
    let greedy = demo(&["--planner", "greedy"]);
    let ours = demo(&["--planner", "ours"]);
    assert!(ours.contains("planner ours"), "{ours}");
    let (gm, go) = events(&greedy);
    let (om, oo) = events(&ours);
    assert!(om <= gm, "ours {om} migrations, greedy {gm}");
    assert!(oo < go, "ours {oo} overload reports, greedy {go}");
}

/// Every reference NF the demo offers runs in it: those without a default policy (ids,
/// policer) get the demo's own.
#[test]
fn demo_runs_every_reference_nf() {
    for nf in [
        "monitor", "firewall", "ids", "ipsec", "dpi", "macswap", "policer", "l2fwd", "flowfwd",
    ] {
        let out = demo(&["--nf", nf, "--tenants", "4"]);
        assert!(out.contains("tenant-04"), "{nf}: {out}");
    }
}
