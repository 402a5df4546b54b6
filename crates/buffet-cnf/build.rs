//! Compiles the fault-containment shim (csrc/guard.c) against include/buffet.h.

fn main() {
    let include = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"),
    )
    .join("../../include");
    println!("cargo:rerun-if-changed=csrc/guard.c");
    println!(
        "cargo:rerun-if-changed={}",
        include.join("buffet.h").display()
    );
    cc::Build::new()
        .file("csrc/guard.c")
        .include(&include)
        .flag_if_supported("-fno-omit-frame-pointer")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("buffet_cnf_guard");
    println!("cargo:include={}", include.display());
}
