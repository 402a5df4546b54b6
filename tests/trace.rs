//! End to end: `buffet trace` over a hand-computed trace (docs/scheduler.md, the
//! scheduler semantics), and the committed trace vectors (tests/vectors/) through every
//! engine built: the Rust dispatcher and the C core.

use std::path::{Path, PathBuf};
use std::process::Command;

use buffet_config::trace::{run_trace, TraceConfig, TraceEngine};

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

#[test]
fn trace_engine_c_prints_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    std::fs::write(&input, "ts_ns,tenant_id\n0,0\n0,0\n0,0\n1,2\n1,0\n2,1\n").unwrap();
    let run = |engine: &str| {
        Command::new(env!("CARGO_BIN_EXE_buffet"))
            .args(["trace", "--workers", "2", "--worker-max", "2"])
            .args(["--tenant-max", "2", "--shift", "0", "--threshold", "0"])
            .args(["--engine", engine, "--input"])
            .arg(&input)
            .output()
            .unwrap()
    };
    let (rust, c) = (run("rust"), run("c"));
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert_eq!((&rust.stdout, &rust.stderr), (&c.stdout, &c.stderr));
    assert_eq!(
        String::from_utf8(c.stdout).unwrap(),
        "0,0,pass,0\n1,0,pass,0\n2,0,drop,\n3,2,pass,1\n4,0,pass,0\n5,1,pass,1\n"
    );
}

#[test]
fn trace_engine_xdp_is_not_built_yet() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    std::fs::write(&input, "0,1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args([
            "trace",
            "--workers",
            "1",
            "--worker-max",
            "1",
            "--engine",
            "xdp",
        ])
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("xdp trace engine is not built yet (needs the XDP dispatcher)"),
        "{err}"
    );
}

/// One committed vector: `args` (the `buffet trace` flags, `#` comments allowed),
/// `trace.csv`, and the expected `expected.out` (decisions) and `expected.err` (overload
/// reports).
struct Vector {
    dir: PathBuf,
    args: Vec<String>,
    cfg: TraceConfig,
}

fn vectors() -> Vec<Vector> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|dir| {
            let text = std::fs::read_to_string(dir.join("args")).unwrap();
            let args: Vec<String> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .flat_map(str::split_whitespace)
                .map(str::to_owned)
                .collect();
            // The command line's defaults.
            let mut cfg = TraceConfig {
                workers: 0,
                worker_max: 0,
                tenant_max: 0,
                shift: 30,
                threshold: 3,
                engine: TraceEngine::Rust,
            };
            for pair in args.chunks(2) {
                let [flag, value] = pair else {
                    panic!("{}: odd args", dir.display())
                };
                let at = format!("{}: {flag}", dir.display());
                match flag.as_str() {
                    "--workers" => cfg.workers = num(&at, value),
                    "--worker-max" => cfg.worker_max = num(&at, value),
                    "--tenant-max" => cfg.tenant_max = num(&at, value),
                    "--shift" => cfg.shift = num(&at, value),
                    "--threshold" => cfg.threshold = num(&at, value),
                    other => panic!("{}: unknown flag {other}", dir.display()),
                }
            }
            Vector { dir, args, cfg }
        })
        .collect()
}

fn num<T: std::str::FromStr>(at: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| panic!("{at}: bad value {value:?}"))
}

fn run_lib(v: &Vector, engine: TraceEngine) -> (String, String) {
    let input = std::fs::read(v.dir.join("trace.csv")).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let cfg = TraceConfig { engine, ..v.cfg };
    run_trace(&input[..], &mut out, &mut err, &cfg)
        .unwrap_or_else(|e| panic!("{} ({engine}): {e}", v.dir.display()));
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// Every vector through the Rust and the C engine, via the library and (where the command
/// line accepts the parameters) via `buffet trace --engine`, against the committed
/// expectations. `BUFFET_BLESS_VECTORS=1` rewrites the expectations from the Rust engine
/// instead (review the diff: several vectors are checked by hand in their comments).
#[test]
fn committed_vectors_agree_on_every_engine() {
    let vs = vectors();
    assert!(vs.len() >= 10, "{} vectors", vs.len());
    let bless = std::env::var_os("BUFFET_BLESS_VECTORS").is_some();
    for v in &vs {
        let name = v.dir.file_name().unwrap().to_string_lossy().into_owned();
        if bless {
            let (out, err) = run_lib(v, TraceEngine::Rust);
            std::fs::write(v.dir.join("expected.out"), out).unwrap();
            std::fs::write(v.dir.join("expected.err"), err).unwrap();
        }
        let want = (
            std::fs::read_to_string(v.dir.join("expected.out")).unwrap(),
            std::fs::read_to_string(v.dir.join("expected.err")).unwrap(),
        );
        assert!(!want.0.is_empty(), "{name}: empty expectation");
        for engine in [TraceEngine::Rust, TraceEngine::C] {
            assert_eq!(run_lib(v, engine), want, "{name}: library, engine {engine}");
            if v.cfg.worker_max == 0 || v.cfg.shift >= 64 {
                continue; // outside what the command line accepts
            }
            let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
                .arg("trace")
                .args(&v.args)
                .args(["--engine", engine.name(), "--input"])
                .arg(v.dir.join("trace.csv"))
                .output()
                .unwrap();
            assert!(out.status.success(), "{name}: {engine}");
            let got = (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            );
            assert_eq!(got, want, "{name}: buffet trace --engine {engine}");
        }
    }
}
