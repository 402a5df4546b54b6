//! Compiles nic-firmware/common/buffet_core.c (freestanding: no libc) for the host.

fn main() {
    let common = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"),
    )
    .join("../../nic-firmware/common");
    for f in ["buffet_core.c", "buffet_core.h", "buffet_core_impl.h"] {
        println!("cargo:rerun-if-changed={}", common.join(f).display());
    }
    cc::Build::new()
        .file(common.join("buffet_core.c"))
        .include(&common)
        .std("c11")
        .flag("-ffreestanding")
        .flag_if_supported("-fno-builtin")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("buffet_nicfw_core");
}
