//! The C twins of the protection benchmark's NFs (examples/c-nf/macswap.c and
//! policer.c) decide as the reference Rust NFs: the same pcap through `buffet replay
//! --nf-lib X.so --isolation trusted-native` and `--nf X` gives the same per-tenant
//! verdicts, and both objects pass the inspection the mpk level runs before loading.

use std::process::Command;

mod common;
use common::cnf::{build_nf, nf_lib_args, tenant, tenants_file, udp, write_pcap};

fn replay(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let out = Command::new(env!("CARGO_BIN_EXE_buffet"))
        .arg("replay")
        .args(args)
        .arg("--stats-json")
        .arg(&stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap()
}

/// Per tenant: (passed, dropped, drop reasons).
fn verdicts(stats: &serde_json::Value, ids: &[u64]) -> Vec<(u64, u64, String)> {
    ids.iter()
        .map(|&id| {
            let t = tenant(stats, id);
            let drops = t["drops"].as_object().unwrap();
            (
                t["passed"].as_u64().unwrap(),
                drops.values().map(|n| n.as_u64().unwrap()).sum(),
                t["drops"].to_string(),
            )
        })
        .collect()
}

#[test]
fn macswap_and_policer_c_nfs_decide_as_the_rust_nfs() {
    let dir = tempfile::tempdir().unwrap();
    // 600 frames, 3 tenants, 1 µs apart in packet time (write_pcap's spacing).
    let frames: Vec<Vec<u8>> = (0..600).map(|i| udp((i % 3) as u8 + 1, 53)).collect();
    let pcap = dir.path().join("in.pcap");
    write_pcap(&pcap, &frames);
    for (nf, policies) in [
        ("macswap", vec![(1u8, ""), (2, ""), (3, "")]),
        (
            "policer",
            vec![
                (1u8, "rate = 20000\nburst = 600\nunit = \"bytes\""),
                (2, "rate = 100\nburst = 5\nunit = \"packets\""),
                (3, "rate = 1000000\nburst = 100000"),
            ],
        ),
    ] {
        let so = build_nf(dir.path(), nf);
        buffet::cnf::inspect::inspect(&so)
            .unwrap_or_else(|e| panic!("{nf}.so fails inspection: {e}"));
        let tenants = tenants_file(dir.path(), None, &policies);
        let rust = replay(&[
            "--nf".as_ref(),
            nf.as_ref(),
            "--tenants".as_ref(),
            tenants.as_os_str(),
            "--input".as_ref(),
            pcap.as_os_str(),
        ]);
        let c = replay(&nf_lib_args(&so, "trusted-native", &tenants, &pcap));
        let (r, cv) = (verdicts(&rust, &[1, 2, 3]), verdicts(&c, &[1, 2, 3]));
        assert_eq!(r, cv, "{nf}: C against Rust");
        if nf == "policer" {
            // The policies limit tenants 1 and 2, not 3: the test sees real drops.
            assert!(r[0].1 > 0 && r[1].1 > 0 && r[2].1 == 0, "{r:?}");
        }
    }
}
