//! The verifier's budgets: PREVAIL runs in a child process that is killed past its time
//! budget and cannot grow past its memory budget, so neither a slow program nor a stream
//! of them leaves a thread or a process behind, and a normal program is still verified
//! once and then served from the cache.
//!
//! One test in its own binary, so that the threads and child processes it counts are its
//! own. Without clang it prints `skipped: ...` and passes, unless `CI=true` or
//! `BUFFET_REQUIRE_PRIVILEGED=1`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use buffet_ebpf::verify::{cached_verdicts, VerifierConfig, VerifyError};
use buffet_ebpf::{LoadOptions, Program, ProgramError};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The object of `examples/ebpf/<name>.c`; `None` (test skipped) without clang.
fn object(name: &str) -> Option<Vec<u8>> {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ebpf-budget");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}.{}.o", std::process::id()));
    let r = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror",
        ])
        .arg("-I")
        .arg(root().join("crates/buffet-ebpf/include"))
        .arg("-c")
        .arg(root().join(format!("examples/ebpf/{name}.c")))
        .arg("-o")
        .arg(&out)
        .output();
    match r {
        Ok(r) if r.status.success() => {
            let bytes = std::fs::read(&out).unwrap();
            let _ = std::fs::remove_file(&out);
            Some(bytes)
        }
        Ok(r) => panic!(
            "{clang} failed on {name}.c:\n{}",
            String::from_utf8_lossy(&r.stderr)
        ),
        Err(e) => {
            let required = std::env::var("CI").is_ok_and(|v| v == "true")
                || std::env::var("BUFFET_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
            assert!(!required, "cannot run `{clang}`: {e}");
            eprintln!("skipped: cannot run `{clang}`: {e}");
            None
        }
    }
}

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Child processes of this process (any thread's).
fn children() -> Vec<u32> {
    let mut pids = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = t.unwrap().path().join("children");
        if let Ok(s) = std::fs::read_to_string(path) {
            pids.extend(s.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
        }
    }
    pids
}

/// Settings whose loop limit makes a cache key of its own (the limit is part of it), so
/// that each call here really runs the verifier.
fn cfg(loop_limit: u32, time: Duration, memory: u64) -> LoadOptions {
    LoadOptions {
        verifier: VerifierConfig {
            max_loop_iterations: loop_limit,
            time_budget: time,
            memory_budget: memory,
        },
        ..LoadOptions::default()
    }
}

#[test]
fn verification_is_bounded_in_time_and_memory_and_leaves_nothing_behind() {
    let Some(slow) = object("loops") else { return };
    let Some(normal) = object("counter") else {
        return;
    };
    let base_threads = threads();
    assert_eq!(children(), Vec::<u32>::new());

    // A stream of distinct slow verifications, four at a time, each far over its budget
    // (`loops` needs seconds): every one is rejected within its budget plus a margin for
    // the fork and the kill, and afterwards no verifier thread or process is left.
    let budget = Duration::from_millis(20);
    for round in 0..3u32 {
        let handles: Vec<_> = (0..4u32)
            .map(|i| {
                let slow = slow.clone();
                let opts = cfg(90_000 + round * 10 + i, budget, 1 << 30);
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let r = Program::load(&slow, &opts).map(|_| ());
                    (r, t.elapsed())
                })
            })
            .collect();
        for h in handles {
            let (r, took) = h.join().unwrap();
            let e = r.expect_err("over its time budget");
            assert!(
                matches!(e, ProgramError::Verify(VerifyError::TimeBudget { .. })),
                "{e}"
            );
            assert!(
                e.to_string()
                    .contains("did not finish within its time budget of 20 ms"),
                "{e}"
            );
            assert!(took < budget + Duration::from_millis(1500), "{took:?}");
        }
    }
    assert_eq!(threads(), base_threads, "a verifier thread was left behind");
    assert_eq!(
        children(),
        Vec::<u32>::new(),
        "a verifier process was left behind"
    );

    // The same program asked again within no larger a budget is rejected at once.
    let t = Instant::now();
    let e = Program::load(&slow, &cfg(90_000, budget, 1 << 30)).map(|_| ());
    assert!(matches!(
        e,
        Err(ProgramError::Verify(VerifyError::TimeBudget { .. }))
    ));
    assert!(t.elapsed() < Duration::from_millis(20), "{:?}", t.elapsed());

    // A verification that needs more memory than its budget is rejected cleanly.
    let t = Instant::now();
    let e = Program::load(&slow, &cfg(80_000, Duration::from_secs(60), 1 << 20))
        .map(|_| ())
        .expect_err("over its memory budget");
    assert!(
        matches!(e, ProgramError::Verify(VerifyError::MemoryBudget { budget }) if budget == 1 << 20),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("ran out of its memory budget of 1 MiB"),
        "{e}"
    );
    println!("memory budget of 1 MiB exceeded after {:?}", t.elapsed());
    assert_eq!(threads(), base_threads);
    assert_eq!(children(), Vec::<u32>::new());

    // A normal program is verified within the default budgets and cached: asked again
    // with a budget no verification could meet, it is served from the cache.
    let cached = cached_verdicts();
    let t = Instant::now();
    Program::load(&normal, &LoadOptions::default()).unwrap();
    let first = t.elapsed();
    assert!(cached_verdicts() > cached || cached > 0);
    Program::load(
        &normal,
        &cfg(
            VerifierConfig::default().max_loop_iterations,
            Duration::from_nanos(1),
            1,
        ),
    )
    .expect("served from the cache");
    assert_eq!(threads(), base_threads);
    assert_eq!(children(), Vec::<u32>::new());
    println!("counter verified in {first:?}, then from the cache");
}
