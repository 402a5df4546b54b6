//! End to end: `buffet trace` over a hand-computed trace (docs/scheduler.md, the
//! scheduler semantics).

use std::process::Command;

#[test]
fn trace_prints_decisions_and_overload_reports() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    // shift 0: every ts is its own slot. K = 2, worker MAX_NB 2, tenant MAX_NB 2, threshold 0.
    // Tenants 0 and 2 start on worker 0, tenant 1 on worker 1.
    //
    // slot 0: t0 x3 -> pass 0, pass 0, drop (3 > tenant MAX_NB 2; worker not charged).
    //         W0.pkt_nb = 2.
    // slot 1: t2 (first in slot 1): tmp = 0; roll W0: last_nb = 2 (prev), pkt_nb 0.
    //         last_nb 2 >= max 2 -> overloaded; roll all: W1 last_nb 0 (never used).
    //         mig = W1 (lowest last_nb); 0 + tmp 0 < 2 -> t2 moves to W1, packet to W1.
    //         W0.times = 1 > threshold 0 -> overload report (worker 0, slot 1).
    // slot 1: t0 (first in slot 1): tmp = 3 (pkt_nb counts the policed one); W0 last_nb
    //         2 >= 2 -> overloaded; mig = W1 (last_nb 0); 0 + 3 < 2? no -> stays on W0.
    //         W0.times = 2 -> report (worker 0, slot 1). pass 0.
    // slot 2: t1 (first ever): tmp 0; roll W1: prev(W1) = slot 1 with pkt_nb 1 -> last_nb 1
    //         < 2 -> times 0; pass 1.
    std::fs::write(&input, "ts_ns,tenant_id\n0,0\n0,0\n0,0\n1,2\n1,0\n2,1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args([
            "trace",
            "--workers",
            "2",
            "--worker-max",
            "2",
            "--tenant-max",
            "2",
        ])
        .args(["--shift", "0", "--threshold", "0", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "0,0,pass,0\n1,0,pass,0\n2,0,drop,\n3,2,pass,1\n4,0,pass,0\n5,1,pass,1\n"
    );
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "overload,3,0,1\noverload,4,0,1\n"
    );
}

#[test]
fn trace_rejects_bad_lines_with_their_number() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    std::fs::write(&input, "0,1\n5,x\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(["trace", "--workers", "2", "--worker-max", "10", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("t.csv") && err.contains('2'), "{err}");
}
