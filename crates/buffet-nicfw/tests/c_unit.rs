//! Builds and runs the C core's host unit tests (nic-firmware/common/test/test_core.c)
//! with the system C compiler (`$CC`, else `cc`), and checks that the core itself
//! compiles freestanding with no libc.

use std::path::Path;
use std::process::Command;

fn common() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../nic-firmware/common")
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_owned())
}

fn ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (a C compiler is required)"));
    assert!(
        out.status.success(),
        "{cmd:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn c_unit_tests_pass() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("test_core");
    let c = common();
    ok(Command::new(cc())
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(c.join("test/test_core.c"))
        .arg(c.join("buffet_core.c"))
        .arg("-o")
        .arg(&bin));
    let out = ok(&mut Command::new(&bin));
    assert!(String::from_utf8_lossy(&out.stdout).contains("all checks passed"));
}

#[test]
fn core_builds_freestanding_without_libc() {
    let dir = tempfile::tempdir().unwrap();
    ok(Command::new(cc())
        .args(["-std=c11", "-ffreestanding", "-nostdlib", "-fno-builtin"])
        .args(["-Wall", "-Wextra", "-Wpedantic", "-Werror", "-c"])
        .arg(common().join("buffet_core.c"))
        .arg("-o")
        .arg(dir.path().join("core.o")));
}
