//! End to end: `buffet trace` over a hand-computed trace (docs/scheduler.md, the
//! scheduler semantics), and the committed trace vectors (tests/vectors/: `trace.csv`
//! ones for the scheduler alone, `frames.csv` ones for the classifier and the scheduler
//! with a tenants file) through every engine: the Rust dispatcher, the C core and the XDP program in the kernel (the last
//! needs CAP_BPF and clang at build time; without them its checks skip, and fail under
//! BUFFET_REQUIRE_PRIVILEGED=1 or CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use buffet_config::trace::frames::run_frame_trace;
use buffet_config::trace::{run_trace, TraceConfig, TraceEngine, TraceError};
use buffet_testkit::gate::{self, Capability};

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

/// Whether the xdp engine can run here; skips (a failure under
/// BUFFET_REQUIRE_PRIVILEGED=1 or CI) with the reason when it cannot.
fn xdp_ready(test: &str) -> bool {
    if !gate::require_capabilities(test, &[Capability::Bpf, Capability::NetAdmin]) {
        return false;
    }
    let cfg = TraceConfig {
        workers: 1,
        worker_max: 1,
        tenant_max: 0,
        shift: 0,
        threshold: 0,
        engine: TraceEngine::Xdp,
    };
    match run_trace(&b"0,1\n"[..], std::io::sink(), std::io::sink(), &cfg) {
        Ok(_) => true,
        Err(e @ TraceError::EngineUnavailable { .. }) => gate::skip_privileged(test, e),
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn trace_engine_xdp_prints_the_same_bytes() {
    let test = "trace_engine_xdp_prints_the_same_bytes";
    if !xdp_ready(test) {
        return;
    }
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
    let (rust, xdp) = (run("rust"), run("xdp"));
    assert!(
        xdp.status.success(),
        "{}",
        String::from_utf8_lossy(&xdp.stderr)
    );
    assert_eq!((&rust.stdout, &rust.stderr), (&xdp.stdout, &xdp.stderr));
    assert_eq!(
        String::from_utf8(xdp.stdout).unwrap(),
        "0,0,pass,0\n1,0,pass,0\n2,0,drop,\n3,2,pass,1\n4,0,pass,0\n5,1,pass,1\n"
    );
}

/// Where the xdp engine cannot run, `buffet trace --engine xdp` fails before printing any
/// decision and names the engine.
#[test]
fn trace_engine_xdp_errors_name_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    std::fs::write(&input, "0,1\n").unwrap();
    // One more worker than the XDP dispatcher's Worker Table holds.
    let too_many = (buffet_xdp::MAX_WORKERS + 1).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .args(["trace", "--workers", &too_many, "--worker-max", "1"])
        .args(["--engine", "xdp", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xdp engine"), "{err}");
}

/// Seeded random traces (many tenants, bursts, idle and older timestamps) through the
/// rust and the xdp engine: the same bytes.
#[test]
fn random_traces_agree_between_rust_and_xdp() {
    let test = "random_traces_agree_between_rust_and_xdp";
    if !xdp_ready(test) {
        return;
    }
    let mut rng = buffet_testkit::Rng::new(0x7ace_0009);
    let mut exercised = (0, 0, 0);
    let mut wide_migrations = 0;
    for round in 0..6 {
        let tenants = 20 + rng.below(180);
        let mut trace = String::from("ts_ns,tenant_id\n");
        let mut ts = 0u64;
        for _ in 0..2000 {
            ts = match rng.below(25) {
                0 => ts.saturating_sub(rng.below(40)),
                1 => ts + 8 * (1 + rng.below(4)),
                _ => ts + rng.below(2),
            };
            // A few heavy tenants and a long tail; ids are arbitrary u32s.
            let t = if rng.chance(40) {
                rng.below(4)
            } else {
                rng.below(tenants)
            };
            trace.push_str(&format!("{ts},{}\n", t * 7919 + 3));
        }
        // Small Worker Tables, and from round 4 on large ones (the overload scan of the
        // XDP program is a bpf_loop over up to MAX_WORKERS rows).
        let workers = if round < 4 {
            1 + rng.below(16) as u16
        } else {
            17 + rng.below(u64::from(buffet_xdp::MAX_WORKERS) - 16) as u16
        };
        let cfg = TraceConfig {
            workers,
            // Around the ~16 packets a timeslot carries, spread over the workers.
            worker_max: 1 + rng.below(1 + 24 / u64::from(workers)),
            tenant_max: rng.below(6),
            shift: 3,
            threshold: rng.below(3) as u32,
            engine: TraceEngine::Rust,
        };
        let run = |engine| {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let s = run_trace(
                trace.as_bytes(),
                &mut out,
                &mut err,
                &TraceConfig { engine, ..cfg },
            )
            .unwrap_or_else(|e| panic!("round {round} ({engine}): {e}"));
            (out, err, s)
        };
        let (want, got) = (run(TraceEngine::Rust), run(TraceEngine::Xdp));
        assert_eq!(got, want, "round {round}: {cfg:?}");
        exercised.0 += want.2.migrations;
        exercised.1 += want.2.overloads;
        exercised.2 += want.2.dropped;
        if round >= 4 {
            wide_migrations += want.2.migrations;
        }
    }
    // The large Worker Tables' overload scans chose migration targets.
    assert!(wide_migrations > 0);
    // Migrations, overload reports and policing all happened.
    assert!(
        exercised.0 > 0 && exercised.1 > 0 && exercised.2 > 0,
        "{exercised:?}"
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

/// The vector directories holding `input` (`trace.csv` or `frames.csv`), sorted.
fn vector_dirs(input: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in &dirs {
        let (ids, frames) = (d.join("trace.csv").exists(), d.join("frames.csv").exists());
        assert!(
            ids != frames,
            "{}: trace.csv or frames.csv, one of them",
            d.display()
        );
    }
    dirs.retain(|d| d.join(input).exists());
    dirs
}

fn vectors() -> Vec<Vector> {
    vectors_of(vector_dirs("trace.csv"))
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

/// Every vector through the Rust, the C and (where it can run) the XDP engine, via the
/// library and (where the command line accepts the parameters) via `buffet trace
/// --engine`, against the committed expectations. `BUFFET_BLESS_VECTORS=1` rewrites the expectations from the Rust engine
/// instead (review the diff: several vectors are checked by hand in their comments).
#[test]
fn committed_vectors_agree_on_every_engine() {
    let vs = vectors();
    assert!(vs.len() >= 10, "{} vectors", vs.len());
    let bless = std::env::var_os("BUFFET_BLESS_VECTORS").is_some();
    let mut engines = vec![TraceEngine::Rust, TraceEngine::C];
    if xdp_ready("committed_vectors_agree_on_every_engine (xdp)") {
        engines.push(TraceEngine::Xdp);
    }
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
        for &engine in &engines {
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

/// A committed frame vector: `args`, `tenants.toml`, `frames.csv`, `expected.out`,
/// `expected.err` (tests/vectors/README.md).
fn frame_vectors() -> Vec<Vector> {
    let vs = vectors_of(vector_dirs("frames.csv"));
    for v in &vs {
        assert!(v.dir.join("tenants.toml").exists(), "{}", v.dir.display());
    }
    vs
}

/// Parses each directory's `args` as [`vectors`] does.
fn vectors_of(dirs: Vec<PathBuf>) -> Vec<Vector> {
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

fn run_frames_lib(v: &Vector, engine: TraceEngine) -> (String, String) {
    let tenants = buffet_config::tenants::load(&v.dir.join("tenants.toml"))
        .unwrap_or_else(|e| panic!("{}: {e}", v.dir.display()));
    let input = std::fs::read(v.dir.join("frames.csv")).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let cfg = TraceConfig { engine, ..v.cfg };
    run_frame_trace(&input[..], &tenants, &mut out, &mut err, &cfg)
        .unwrap_or_else(|e| panic!("{} ({engine}): {e}", v.dir.display()));
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// Every frame vector through the Rust, the C and (where it can run) the XDP engine, via
/// the library and via `buffet trace --frames --tenants --engine`, against the committed
/// expectations, which are derived by hand from the frames' comments (never blessed
/// from an engine).
#[test]
fn committed_frame_vectors_agree_on_every_engine() {
    let vs = frame_vectors();
    assert!(vs.len() >= 3, "{} frame vectors", vs.len());
    let mut engines = vec![TraceEngine::Rust, TraceEngine::C];
    if xdp_ready("committed_frame_vectors_agree_on_every_engine (xdp)") {
        engines.push(TraceEngine::Xdp);
    }
    let mut seen = (0, 0, 0);
    for v in &vs {
        let name = v.dir.file_name().unwrap().to_string_lossy().into_owned();
        let want = (
            std::fs::read_to_string(v.dir.join("expected.out")).unwrap(),
            std::fs::read_to_string(v.dir.join("expected.err")).unwrap(),
        );
        assert!(!want.0.is_empty(), "{name}: empty expectation");
        seen.0 += want.0.matches(",unmatched,").count();
        seen.1 += want.0.matches(",malformed,").count();
        seen.2 += want.1.lines().count();
        for &engine in &engines {
            assert_eq!(
                run_frames_lib(v, engine),
                want,
                "{name}: library, engine {engine}"
            );
            let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
                .arg("trace")
                .args(&v.args)
                .args(["--engine", engine.name(), "--frames"])
                .arg(v.dir.join("frames.csv"))
                .arg("--tenants")
                .arg(v.dir.join("tenants.toml"))
                .output()
                .unwrap();
            let got = (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            );
            assert!(out.status.success(), "{name}: {engine}: {}", got.1);
            assert_eq!(got, want, "{name}: buffet trace --frames --engine {engine}");
        }
    }
    // Unmatched and malformed frames and overload reports are all in the vectors.
    assert!(seen.0 > 0 && seen.1 > 0 && seen.2 > 0, "{seen:?}");
}

/// `--frames` needs `--tenants` and excludes `--input`; bad lines name the file and the
/// line; a rule an engine cannot express stops the run before any output, naming the
/// tenant and the rule.
#[test]
fn trace_frames_command_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("f.csv");
    let tenants = dir.path().join("t.toml");
    let ids = dir.path().join("t.csv");
    // An ARP frame, then a line with a bad hex digit.
    let arp = "020000000002020000000001080600010800060400010200000000010a090909";
    std::fs::write(&frames, format!("ts_ns,hex_frame\n0,{arp}\n1,{arp}x\n")).unwrap();
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n\
         [[tenant]]\nid = 2\nrules = [ { protocol = \"sctp\", dst_port = 9 } ]\n",
    )
    .unwrap();
    std::fs::write(&ids, "0,1\n").unwrap();
    let buffet = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_buffet"))
            .args(["trace", "--workers", "2", "--worker-max", "10"])
            .args(args)
            .output()
            .unwrap()
    };
    let os = |p: &Path| p.as_os_str().to_owned();
    let (f, t, i) = (os(&frames), os(&tenants), os(&ids));
    let flag = |s: &str| std::ffi::OsString::from(s);

    // Usage errors (status 2): --frames alone, --frames with --input, neither.
    for args in [
        vec![flag("--frames"), f.clone()],
        vec![
            flag("--frames"),
            f.clone(),
            flag("--tenants"),
            t.clone(),
            flag("--input"),
            i.clone(),
        ],
        vec![flag("--tenants"), t.clone(), flag("--input"), i.clone()],
        vec![],
    ] {
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = buffet(&refs);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
    }

    // The rust engine takes the SCTP port rule; line 3 is refused, and nothing is printed
    // before the error (not even the lines before it).
    let out = buffet(&[&flag("--frames"), &f, &flag("--tenants"), &t]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("f.csv: line 3: hex_frame: 'x' (hex digit 65) is not a hex digit"),
        "{err}"
    );

    // The c engine cannot express it: refused before the first frame, naming tenant and rule.
    let out = buffet(&[
        &flag("--frames"),
        &f,
        &flag("--tenants"),
        &t,
        &flag("--engine"),
        &flag("c"),
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("t.toml: tenant 2: c engine: rules[0]: the c engine cannot express it"),
        "{err}"
    );
}

/// A trace whose output outgrows what is kept in memory (8 MiB) goes through a temporary
/// file and comes out whole and in order; the same trace with TMPDIR pointing nowhere is
/// refused naming TMPDIR, with nothing on standard output, while a short trace needs no
/// temporary directory at all.
#[test]
fn a_long_traces_output_goes_through_a_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    // 700,000 packets of 50 tenants: over 8 MiB of `seq,tenant,pass,worker` lines.
    let n = 700_000u64;
    let mut text = String::from("ts_ns,tenant_id\n");
    for i in 0..n {
        text.push_str(&format!("{i},{}\n", i % 50));
    }
    let input = dir.path().join("long.csv");
    std::fs::write(&input, text).unwrap();
    let run = |input: &Path, tmpdir: &Path| {
        Command::new(env!("CARGO_BIN_EXE_buffet"))
            .args(["trace", "--workers", "2", "--worker-max", "1000000000"])
            .arg("--input")
            .arg(input)
            .env("TMPDIR", tmpdir)
            .output()
            .unwrap()
    };
    let out = run(&input, dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.len() > 8 << 20, "{} bytes", stdout.len());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len() as u64, n);
    for (i, l) in lines.iter().enumerate().step_by(9973) {
        let want = format!("{i},{},pass,{}", i % 50, i % 50 % 2);
        assert_eq!(*l, want);
    }
    assert_eq!(
        *lines.last().unwrap(),
        format!("{},{},pass,{}", n - 1, (n - 1) % 50, (n - 1) % 50 % 2)
    );

    let nowhere = dir.path().join("no-such-dir");
    let out = run(&input, &nowhere);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing printed before the error");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("temporary file under") && err.contains("(TMPDIR)"),
        "{err}"
    );

    let short = dir.path().join("short.csv");
    std::fs::write(&short, "ts_ns,tenant_id\n0,1\n1,2\n").unwrap();
    let out = run(&short, &nowhere);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "0,1,pass,1\n1,2,pass,0\n"
    );
}
