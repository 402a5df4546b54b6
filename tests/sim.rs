//! End to end: `buffet sim` on the paper's setup, and its errors.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .arg("sim")
        .args(args)
        .output()
        .unwrap()
}

#[derive(Debug)]
struct Row {
    tenants: usize,
    policy: String,
    overload: f64,
    migrated: f64,
}

fn rows(csv: &str) -> Vec<Row> {
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("tenants,policy,overload_pct,migrated_pct,mean_us,p99_us")
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 6, "{l}");
            let mean: f64 = f[4].parse().unwrap();
            let p99: f64 = f[5].parse().unwrap();
            assert!(mean >= 0.0 && p99 >= 0.0);
            Row {
                tenants: f[0].parse().unwrap(),
                policy: f[1].to_owned(),
                overload: f[2].parse().unwrap(),
                migrated: f[3].parse().unwrap(),
            }
        })
        .collect()
}

/// 20,000 cases per count: our planner is within the goals of the optimum (overload
/// within 0.5 point, migrations within 1 point), scheduling beats the fixed mapping, and
/// the same seed prints the same percentages.
#[test]
fn sim_csv_compares_the_policies() {
    let out = sim(&["--cases", "20000", "--csv", "--seed", "3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = String::from_utf8(out.stdout).unwrap();
    let table = rows(&csv);
    assert_eq!(table.len(), 16, "{csv}");
    for n in [8, 12, 16, 20] {
        let get = |p: &str| {
            table
                .iter()
                .find(|r| r.tenants == n && r.policy == p)
                .unwrap_or_else(|| panic!("no {p} row for {n}: {csv}"))
        };
        let (none, greedy, optimal, ours) =
            (get("none"), get("greedy"), get("optimal"), get("ours"));
        assert_eq!(none.migrated, 0.0);
        assert!(none.overload > greedy.overload, "{csv}");
        assert!(optimal.overload <= greedy.overload && optimal.overload <= ours.overload);
        assert!(ours.overload <= optimal.overload + 0.5, "{csv}");
        assert!(ours.migrated <= optimal.migrated + 1.0, "{csv}");
    }
    let again = sim(&["--cases", "20000", "--csv", "--seed", "3", "--threads", "1"]);
    let again = rows(&String::from_utf8(again.stdout).unwrap());
    for (a, b) in table.iter().zip(&again) {
        assert_eq!((a.overload, a.migrated), (b.overload, b.migrated));
    }
}

#[test]
fn sim_rejects_bad_input_with_one_clear_line() {
    for (args, want) in [
        (&["--planner", "best"][..], "unknown policy \"best\""),
        (
            &["--tenants", "40"][..],
            "optimal policy's search is exponential",
        ),
        (&["--tenants", "2"][..], "--tenants 2:"),
        (&["--cases", "0"][..], "--cases must be 1 to 100000000"),
        (
            &["--cases", "100000000000"][..],
            "--cases must be 1 to 100000000",
        ),
        (&["--threads", "100000"][..], "--threads"),
        (&["--threads", "0"][..], "--threads"),
        (
            &["--workers", "0"][..],
            "--workers must be 1 to 65535, not 0",
        ),
        (&["--tenants", "8,8"][..], "--tenants names 8 twice"),
        (
            &["--planner", "greedy,greedy"][..],
            "--planner names greedy twice",
        ),
        (
            &["--capacity-gbps", "0"][..],
            "--capacity-gbps must be a positive number",
        ),
    ] {
        let out = sim(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // Without the optimum, large problems run: 10,000 tenants on 64 workers.
    let out = sim(&[
        "--cases",
        "20",
        "--tenants",
        "10000",
        "--workers",
        "64",
        "--planner",
        "greedy,ours",
        "--total-gbps",
        "260",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A reader that goes away (`buffet sim 2>&1 | true`) ends the run with status 1, not a
/// panic at reporting the error to the same closed pipe.
#[test]
fn sim_into_a_closed_pipe_fails_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args([
            "sim",
            "--cases",
            "2000",
            "--tenants",
            "8",
            "--planner",
            "none",
            "--csv",
        ])
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status}");
}
