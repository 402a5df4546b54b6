//! With the `io-dpdk` feature: compiles the DPDK port's C shim (src/dpdk/shim.c) against
//! the installed DPDK (pkg-config `libdpdk`, Debian's dpdk-dev 22.11) and links the DPDK
//! libraries it calls. Without the feature it does nothing: the default build needs no
//! DPDK, no pkg-config and no C compiler for this crate.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "io-dpdk")]
    dpdk::build();
}

#[cfg(feature = "io-dpdk")]
mod dpdk {
    use std::process::Command;

    /// The DPDK libraries the shim calls into. Drivers (`net_af_packet`, the mempool
    /// ring) are not linked: Debian's shared DPDK loads them as plugins from its
    /// `RTE_EAL_PMD_PATH` at EAL init.
    const LIBS: [&str; 5] = [
        "rte_eal",
        "rte_ethdev",
        "rte_mbuf",
        "rte_mempool",
        "rte_ring",
    ];

    fn pkg_config(arg: &str) -> String {
        let out = Command::new("pkg-config")
            .args([arg, "libdpdk"])
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "the io-dpdk feature needs pkg-config and DPDK's development files: \
                     running pkg-config failed ({e}); install them with \
                     `apt-get install pkg-config dpdk-dev`"
                )
            });
        if !out.status.success() {
            panic!(
                "the io-dpdk feature needs DPDK's development files (pkg-config libdpdk: {}); \
                 install them with `apt-get install dpdk-dev` (Debian 12: DPDK 22.11)",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn build() {
        println!("cargo:rerun-if-changed=src/dpdk/shim.c");
        println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
        let version = pkg_config("--modversion");
        println!("cargo:rustc-env=BUFFET_DPDK_VERSION={}", version.trim());
        let cflags = pkg_config("--cflags");
        let mut build = cc::Build::new();
        build.file("src/dpdk/shim.c").warnings(true).opt_level(2);
        // DPDK's own flags: include paths, `-include rte_config.h` and the ISA baseline
        // Debian built it for (`-march=corei7`).
        let mut flags = cflags.split_whitespace();
        while let Some(f) = flags.next() {
            if let Some(dir) = f.strip_prefix("-I") {
                build.include(dir);
            } else if f == "-include" {
                if let Some(h) = flags.next() {
                    build.flag("-include").flag(h);
                }
            } else {
                build.flag(f);
            }
        }
        build.compile("buffet_dpdk_shim");
        for f in pkg_config("--libs-only-L").split_whitespace() {
            if let Some(dir) = f.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={dir}");
            }
        }
        for lib in LIBS {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}
