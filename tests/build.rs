//! Builds the eBPF examples (`examples/ebpf/*.c`) with `clang -target bpf`, for the tests
//! and the benchmark that run them. Also a test of its own: every example compiles.
//!
//! Without clang the eBPF tests are privilege skips (one `SKIP` line each), unless
//! `CI=true` or `BUFFET_REQUIRE_PRIVILEGED=1` is set: then a missing clang is a failure. The objects
//! go to cargo's per-target temporary directory; nothing built is committed.
//!
//! Other test files use it with `#[path = "build.rs"] mod build;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The C sources, without `.c`.
pub const EXAMPLES: [&str; 15] = [
    "dpi",
    "subprog",
    "dpi_scan",
    "counter",
    "flowmon",
    "portblock",
    "ttl",
    "fault",
    "reject_oob",
    "reject_loop",
    "reject_helper",
    "reject_uninit",
    "reject_bounds_state",
    "macswap",
    "policer",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn clang() -> String {
    std::env::var("CLANG").unwrap_or_else(|_| "clang".into())
}

/// Compiles `examples/ebpf/<name>.c` into `dir`; the object's path.
fn compile(name: &str, dir: &Path) -> Result<PathBuf, String> {
    let src = root().join("examples/ebpf").join(format!("{name}.c"));
    let out = dir.join(format!("{name}.o"));
    // Unique temporary name, then an atomic rename: test binaries build concurrently.
    let tmp = dir.join(format!("{name}.o.{}.tmp", std::process::id()));
    let result = Command::new(clang())
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-I",
        ])
        .arg(root().join("crates/buffet-ebpf/include"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&tmp)
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", clang()))?;
    if !result.status.success() {
        return Err(format!(
            "{} failed on {}:\n{}",
            clang(),
            src.display(),
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    std::fs::rename(&tmp, &out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// The directory holding every example's object, built once per process; `Err` when
/// clang is missing or an example does not compile.
pub fn objects() -> Result<&'static Path, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ebpf");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for name in EXAMPLES {
            compile(name, &dir)?;
        }
        Ok(dir)
    })
    .as_ref()
    .map(|d| d.as_path())
    .map_err(Clone::clone)
}

/// The object of example `name`, or `None` after a privilege skip (one `SKIP` line; a
/// failure under `CI=true` or `BUFFET_REQUIRE_PRIVILEGED=1`, see `buffet_testkit::gate`).
pub fn object(test: &str, name: &str) -> Option<PathBuf> {
    match objects() {
        Ok(dir) => Some(dir.join(format!("{name}.o"))),
        Err(e) => {
            buffet_testkit::skip_privileged(
                test,
                format_args!(
                    "the eBPF examples do not build: {e} (install clang to run the eBPF tests)"
                ),
            );
            None
        }
    }
}

/// The bytes of example `name`'s object, or `None` (skipped, see [`object`]).
pub fn elf(test: &str, name: &str) -> Option<Vec<u8>> {
    let path = object(test, name)?;
    Some(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

#[test]
fn every_ebpf_example_compiles() {
    let Some(dir) = object("every_ebpf_example_compiles", "dpi") else {
        return;
    };
    let dir = dir.parent().unwrap();
    for name in EXAMPLES {
        let o = dir.join(format!("{name}.o"));
        let bytes = std::fs::read(&o).unwrap();
        assert_eq!(&bytes[..4], b"\x7fELF", "{}", o.display());
    }
}
