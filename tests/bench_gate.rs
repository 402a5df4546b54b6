//! benches/gate.py, the regression gate over criterion baselines: passes within the
//! allowed loss, fails on a larger loss and on a benchmark that lost its measurement.

use std::path::Path;
use std::process::Command;

/// Writes one criterion result: `full_id` measured at `ns` per iteration of `elements`.
fn result(root: &Path, full_id: &str, baseline: &str, ns: f64, elements: u64) {
    let dir = root.join(full_id).join(baseline);
    std::fs::create_dir_all(&dir).unwrap();
    let (g, rest) = full_id.split_once('/').unwrap();
    let (f, v) = rest.split_once('/').unwrap();
    std::fs::write(
        dir.join("benchmark.json"),
        format!(
            r#"{{"group_id":"{g}","function_id":"{f}","value_str":"{v}","throughput":{{"Elements":{elements}}},"full_id":"{full_id}","directory_name":"{full_id}","title":"{full_id}"}}"#
        ),
    )
    .unwrap();
    let est = |x: f64| {
        format!(
            r#"{{"confidence_interval":{{"confidence_level":0.95,"lower_bound":{x},"upper_bound":{x}}},"point_estimate":{x},"standard_error":1.0}}"#
        )
    };
    std::fs::write(
        dir.join("estimates.json"),
        format!(
            r#"{{"mean":{},"median":{},"median_abs_dev":{},"slope":{},"std_dev":{}}}"#,
            est(ns),
            est(ns),
            est(1.0),
            est(ns),
            est(1.0)
        ),
    )
    .unwrap();
}

fn gate(root: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/gate.py"))
        .args(["before", "after", "--criterion"])
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn gate_passes_small_losses_and_fails_large_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // 256 elements in 1000 ns before; 1040 ns after: a 3.8 % loss, allowed.
    result(root, "multitenancy/buffet/8", "before", 1000.0, 256);
    result(root, "multitenancy/buffet/8", "after", 1040.0, 256);
    // Faster after: a gain.
    result(root, "multitenancy/buffet/64", "before", 2000.0, 256);
    result(root, "multitenancy/buffet/64", "after", 1500.0, 256);
    let (code, out) = gate(root, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 compared, 0 failed"), "{out}");
    // 1100 ns: a 9.1 % loss fails, and the line says which benchmark.
    result(root, "multitenancy/buffet/1024", "before", 1000.0, 256);
    result(root, "multitenancy/buffet/1024", "after", 1100.0, 256);
    let (code, out) = gate(root, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("REGRESSED multitenancy/buffet/1024"), "{out}");
    // A looser limit lets it through; a filter leaves it out.
    assert_eq!(gate(root, &["--max-loss", "0.10"]).0, 0);
    assert_eq!(gate(root, &["--filter", "buffet/(8|64)$"]).0, 0);
}

#[test]
fn gate_fails_when_a_benchmark_stopped_running_or_nothing_matches() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    result(root, "nfs/monitor/8", "before", 1000.0, 256);
    let (code, out) = gate(root, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("MISSING  nfs/monitor/8"), "{out}");
    let (code, out) = gate(&root.join("nowhere"), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no criterion output"), "{out}");
}
