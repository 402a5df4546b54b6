//! Compiles nic-firmware/xdp's BPF programs with `clang -target bpf -O2 -g` into OUT_DIR.
//!
//! When clang or the libbpf headers are missing the build still succeeds: the objects
//! are left empty and `BUFFET_XDP_UNAVAILABLE` tells the crate why, so the engine reports
//! it at run time instead of failing the whole workspace. A program that does not compile
//! is a build error.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (object name, source under nic-firmware/xdp, extra defines).
const PROGRAMS: [(&str, &str, &[&str]); 3] = [
    ("dispatcher", "dispatcher", &[]),
    ("dispatcher_offload", "dispatcher_offload", &[]),
    // The offload subset without its queue-select store, which the kernel refuses from
    // a program not bound to an offload device: the host half's tests load this one.
    (
        "dispatcher_offload_host",
        "dispatcher_offload",
        &["-DBF_OFFLOAD_HOST_BUILD"],
    ),
];

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
        .join("../../nic-firmware");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for f in [
        "common/buffet_core.h",
        "common/buffet_core_impl.h",
        "xdp/buffet_xdp.h",
        "xdp/dispatcher.bpf.c",
        "xdp/dispatcher_offload.bpf.c",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=BUFFET_CLANG");
    let clang = std::env::var("BUFFET_CLANG").unwrap_or_else(|_| "clang".into());
    let unavailable = if Command::new(&clang).arg("--version").output().is_err() {
        Some("clang not found".to_string())
    } else if !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        Some("libbpf headers not found (install libbpf-dev)".to_string())
    } else {
        None
    };
    for (p, src, defines) in PROGRAMS {
        let obj = out.join(format!("{p}.bpf.o"));
        if unavailable.is_some() {
            std::fs::write(&obj, b"").expect("write placeholder object");
            continue;
        }
        let mut cmd = Command::new(&clang);
        cmd.args([
            "-target",
            "bpf",
            "-O2",
            "-g",
            "-ffreestanding",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-I")
        .arg(root.join("common"))
        .arg("-I")
        .arg(root.join("xdp"))
        .args(defines);
        // <linux/bpf.h> pulls in <asm/types.h>, which Debian keeps under the multiarch dir.
        for multiarch in [
            "/usr/include/x86_64-linux-gnu",
            "/usr/include/aarch64-linux-gnu",
        ] {
            if Path::new(multiarch).join("asm/types.h").exists() {
                cmd.arg("-I").arg(multiarch);
            }
        }
        cmd.arg("-c")
            .arg(root.join(format!("xdp/{src}.bpf.c")))
            .arg("-o")
            .arg(&obj);
        let status = cmd.status().expect("run clang");
        assert!(
            status.success(),
            "clang failed on nic-firmware/xdp/{src}.bpf.c ({p})"
        );
    }
    if let Some(why) = unavailable {
        // Cargo does not run this script again when clang appears later: say how to
        // rebuild, here and wherever the engine is refused at run time.
        let why = format!(
            "{why} when buffet-xdp was built; install clang and libbpf-dev, then \
             `cargo clean -p buffet-xdp` and build again"
        );
        println!("cargo:rustc-env=BUFFET_XDP_UNAVAILABLE={why}");
        println!("cargo:warning=xdp engine unavailable: {why}");
    }
}
