//! What `buffet replay` says to its user, end to end: a file given to `--nf-lib` that is
//! no shared object (an eBPF object, a text file) is named for what it is, with the
//! option that loads it; a contained fault's reason is printed once; an `unknown NF` in a
//! tenants file lists every NF the program could run there, its registered ones too; a
//! quarantined tenant with a chain keeps its `chain` array in `--stats-json`.
//!
//! The eBPF objects come from tests/build.rs (clang; without it those tests are privilege
//! skips, a failure under `CI=true` or `BUFFET_REQUIRE_PRIVILEGED=1`). The C NFs are built
//! with the system C compiler, as in tests/replay_trusted.rs; everything runs at the
//! `trusted-native` level, so no `pku` is needed.

#[path = "build.rs"]
mod build;
mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output};

use common::cnf::{build_nf, tenant, udp, write_pcap};

fn buffet(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Tenants 1 and 2, 100 packets each, to port 53.
fn traffic(dir: &Path) {
    let frames: Vec<Vec<u8>> = (0..100).flat_map(|_| [udp(1, 53), udp(2, 53)]).collect();
    write_pcap(&dir.join("in.pcap"), &frames);
}

/// `buffet replay --nf-lib <lib> --isolation trusted-native` over a two-tenant file.
fn replay_nf_lib(dir: &Path, lib: &str) -> Output {
    std::fs::write(
        dir.join("tenants.toml"),
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
    )
    .unwrap();
    traffic(dir);
    buffet(
        dir,
        &[
            "replay",
            "--nf-lib",
            lib,
            "--isolation",
            "trusted-native",
            "--tenants",
            "tenants.toml",
            "--input",
            "in.pcap",
            "--no-pin",
        ],
    )
}

#[test]
fn nf_lib_names_a_file_that_is_no_shared_object_for_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nf.c"), "int x;\n").unwrap();
    let out = replay_nf_lib(dir.path(), "nf.c");
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr
            .contains("error: cannot load C NF nf.c: it is not a shared object (not an ELF file)"),
        "{stderr}"
    );

    let Some(obj) = build::object("nf_lib_names_an_ebpf_object", "fault") else {
        return;
    };
    let out = replay_nf_lib(dir.path(), obj.to_str().unwrap());
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "error: cannot load C NF {}: it is an eBPF object (ELF machine BPF), not a shared \
             object: load eBPF NFs with --nf-ebpf",
            obj.display()
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("cannot open shared object file"),
        "{stderr}"
    );
}

#[test]
fn a_contained_faults_reason_is_printed_once() {
    let Some(obj) = build::object("a_contained_faults_reason_is_printed_once", "fault") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Tenant 2's program returns 0xdead from its 41st packet on.
    std::fs::write(
        dir.path().join("tenants.toml"),
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [tenant.policy.maps]\nconfig = { u32 = [0] }\n\n\
         [[tenant]]\nid = 2\nrules = [ { dst_ip = \"10.2.0.0/16\" } ]\n\
         [tenant.policy.maps]\nconfig = { u32 = [40] }\n",
    )
    .unwrap();
    traffic(dir.path());
    let out = buffet(
        dir.path(),
        &[
            "replay",
            "--nf-ebpf",
            obj.to_str().unwrap(),
            "--tenants",
            "tenants.toml",
            "--input",
            "in.pcap",
            "--no-pin",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let reason = "return value 0xdead is not a verdict";
    assert_eq!(stdout.matches(reason).count(), 1, "{stdout}");
    // The quarantine event carries it; no `contained fault:` line repeats it.
    assert!(
        stdout.contains(&format!(
            "quarantined: the NF reported a fault (Verdict::Fault): {reason}\n"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("contained fault:"), "{stdout}");
}

#[test]
fn a_quarantined_tenant_keeps_its_chain_in_the_stats() {
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "malicious");
    let nf = nf.to_str().unwrap();
    // Tenant 1: monitor then the C NF, behaving; tenant 2: the same chain, its C stage
    // writing to NULL after 40 packets.
    std::fs::write(
        dir.path().join("tenants.toml"),
        format!(
            "[[tenant]]\nid = 1\nrules = [ {{ dst_ip = \"10.1.0.0/16\" }} ]\n\
             [[tenant.chain]]\nnf = \"monitor\"\n\
             [[tenant.chain]]\nnf = \"c:{nf}\"\npolicy = {{ canary = 11 }}\n\n\
             [[tenant]]\nid = 2\nrules = [ {{ dst_ip = \"10.2.0.0/16\" }} ]\n\
             [[tenant.chain]]\nnf = \"monitor\"\n\
             [[tenant.chain]]\nnf = \"c:{nf}\"\npolicy = {{ attack = \"null\", attack_after = 40 }}\n"
        ),
    )
    .unwrap();
    traffic(dir.path());
    let out = buffet(
        dir.path(),
        &[
            "replay",
            "--isolation",
            "trusted-native",
            "--tenants",
            "tenants.toml",
            "--input",
            "in.pcap",
            "--stats-json",
            "stats.json",
            "--no-pin",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let stats: serde_json::Value =
        serde_json::from_reader(File::open(dir.path().join("stats.json")).unwrap()).unwrap();
    let healthy = tenant(&stats, 1);
    assert_eq!(healthy["quarantined"], false, "{healthy}");
    assert_eq!(healthy["chain"][1]["packets"], 100, "{healthy}");
    let faulty = tenant(&stats, 2);
    assert_eq!(faulty["quarantined"], true, "{faulty}");
    let chain = faulty["chain"]
        .as_array()
        .unwrap_or_else(|| panic!("{faulty}"));
    assert_eq!(chain.len(), 2, "{faulty}");
    assert_eq!(chain[0]["nf"], "monitor", "{faulty}");
    assert_eq!(chain[1]["nf"], "malicious", "{faulty}");
    // The counters the chain keeps per stage: the 41st packet faulted in stage 1 (stage 0
    // ran over the whole chunk it came in). The stage NFs' own counters are not read:
    // that would run the quarantined tenant's code.
    let first = chain[0]["packets"].as_u64().unwrap();
    assert!(first >= 41, "{faulty}");
    assert_eq!(chain[0]["passed"], first, "{faulty}");
    assert_eq!(chain[1]["packets"], 41, "{faulty}");
    assert_eq!(chain[1]["passed"], 40, "{faulty}");
    assert_eq!(chain[1]["faults"], 1, "{faulty}");
}

#[test]
fn an_unknown_nf_lists_every_nf_the_program_runs() {
    let dir = tempfile::tempdir().unwrap();
    traffic(dir.path());
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [[tenant.chain]]\nnf = \"firewall\"\n[[tenant.chain]]\nnf = \"my-monitr\"\n",
    )
    .unwrap();
    let mut registry = buffet::cli::Registry::new();
    registry.add::<buffet::nfs::Monitor>("my-monitor");
    let pcap = dir.path().join("in.pcap");
    let args = [
        "buffet",
        "replay",
        "--tenants",
        tenants.to_str().unwrap(),
        "--input",
        pcap.to_str().unwrap(),
        "--no-pin",
    ];
    let e = buffet::cli::run_args(args, &registry).unwrap_err();
    let e = buffet::cli::errors::chain(&e);
    assert!(
        e.ends_with(
            "chain[1].nf: unknown NF \"my-monitr\": give a reference NF (monitor, firewall, \
             ids, ipsec, dpi, macswap, policer, l2fwd, flowfwd), an NF this program \
             registered (my-monitor), c:PATH or ebpf[+jit]:PATH"
        ),
        "{e}"
    );
    // The `buffet` binary registers none: the list is the reference NFs and objects.
    let out = buffet(
        dir.path(),
        &["replay", "--tenants", "tenants.toml", "--input", "in.pcap"],
    );
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains(
            "unknown NF \"my-monitr\": give a reference NF (monitor, firewall, ids, ipsec, \
             dpi, macswap, policer, l2fwd, flowfwd), c:PATH or ebpf[+jit]:PATH\n"
        ),
        "{stderr}"
    );
}
