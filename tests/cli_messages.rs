//! What `buffet replay` says to its user, end to end: a file given to `--nf-lib` that is
//! no shared object (an eBPF object, a text file) is named for what it is, with the
//! option that loads it; a contained fault's reason is printed once; an `unknown NF` in a
//! tenants file lists every NF the program could run there, its registered ones too; a
//! quarantined tenant with a chain keeps its `chain` array in `--stats-json`; the
//! `trusted-native` warning once; a default `mpk` level MPK cannot give says it was the
//! default; a C stage that does not load, or whose region the arena cannot give, is named
//! by the file's field before any tenant is admitted; a tenant the NF refuses is named
//! once; a pcapng, a tenants file or a trace of the wrong kind is named for what it is.
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

/// `buffet replay ARGS` in `dir` with protection keys looking absent (`BUFFET_MPK=off`),
/// so a run that would pick `mpk` fails the same way on every CPU.
fn replay_without_mpk(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .current_dir(dir)
        .arg("replay")
        .args(args)
        .args(["--input", "in.pcap", "--no-pin"])
        .env("BUFFET_MPK", "off")
        .output()
        .unwrap()
}

/// `dir/t.toml`: tenant 7 ("a"), whose chain is the one stage `nf`.
fn c_stage_tenants(dir: &Path, nf: &str) {
    std::fs::write(
        dir.join("t.toml"),
        format!(
            "[[tenant]]\nid = 7\nname = \"a\"\nrules = [ {{ dst_ip = \"10.1.0.0/16\" }} ]\n\
             [[tenant.chain]]\nnf = \"{nf}\"\n"
        ),
    )
    .unwrap();
}

#[test]
fn the_trusted_native_warning_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "portblock");
    traffic(dir.path());
    c_stage_tenants(dir.path(), &format!("c:{}", nf.display()));
    let out = replay_without_mpk(
        dir.path(),
        &[
            "--nf",
            "monitor",
            "--isolation",
            "trusted-native",
            "--tenants",
            "t.toml",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("WARNING: isolation: trusted-native").count(),
        1,
        "{stderr}"
    );
    // A C NF alone (no chain) warns once too.
    std::fs::write(
        dir.path().join("plain.toml"),
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
    )
    .unwrap();
    let out = replay_without_mpk(
        dir.path(),
        &[
            "--nf-lib",
            nf.to_str().unwrap(),
            "--isolation",
            "trusted-native",
            "--tenants",
            "plain.toml",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("WARNING: isolation: trusted-native").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn a_default_mpk_level_that_is_unavailable_says_it_was_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let nf = build_nf(dir.path(), "portblock");
    traffic(dir.path());
    let stage = format!("c:{}", nf.display());
    c_stage_tenants(dir.path(), &stage);
    // A C chain stage under --nf monitor, no --isolation: mpk is the chain's default.
    let out = replay_without_mpk(dir.path(), &["--nf", "monitor", "--tenants", "t.toml"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: no --isolation given: the default isolation level for a C NF (t.toml: \
             tenant 7 (\"a\"): chain[0].nf = {stage:?}) is mpk, and MPK isolation is \
             unavailable: "
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("pass --isolation trusted-native") && !stderr.contains("--isolation mpk"),
        "{stderr}"
    );
    // --nf-lib without --isolation: the same, naming the flag.
    std::fs::write(
        dir.path().join("plain.toml"),
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
    )
    .unwrap();
    let lib = nf.to_str().unwrap();
    let out = replay_without_mpk(dir.path(), &["--nf-lib", lib, "--tenants", "plain.toml"]);
    let (_, stderr) = text(&out);
    assert!(
        stderr.starts_with(&format!(
            "error: no --isolation given: the default isolation level for a C NF (--nf-lib \
             {lib}) is mpk"
        )),
        "{stderr}"
    );
    // Asked for: the flag's own error.
    let out = replay_without_mpk(
        dir.path(),
        &[
            "--nf-lib",
            lib,
            "--isolation",
            "mpk",
            "--tenants",
            "plain.toml",
        ],
    );
    let (_, stderr) = text(&out);
    assert!(
        stderr.starts_with("error: --isolation mpk: MPK isolation is unavailable"),
        "{stderr}"
    );
    // The help says which NFs default to mpk.
    let help = buffet(dir.path(), &["replay", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    assert!(
        help.contains("when a chain stage of the tenants file is a C NF"),
        "{help}"
    );
}

#[test]
fn a_c_stage_that_does_not_load_is_named_like_the_files_other_errors() {
    let dir = tempfile::tempdir().unwrap();
    traffic(dir.path());
    c_stage_tenants(dir.path(), "c:x.so");
    let out = replay_without_mpk(
        dir.path(),
        &[
            "--nf",
            "monitor",
            "--isolation",
            "trusted-native",
            "--tenants",
            "t.toml",
        ],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let error = stderr.lines().last().unwrap();
    assert!(
        error.starts_with("error: t.toml: tenant 7 (\"a\"): chain[0].nf: cannot load C NF x.so: "),
        "{stderr}"
    );
    assert!(!error.contains("chain stage NF"), "{stderr}");
}

/// Writes and builds `dir/fat.so`, a C NF that registers `bytes` of state per tenant.
fn fat_nf(dir: &Path, bytes: u64) -> std::path::PathBuf {
    let src = dir.join("fat.c");
    std::fs::write(
        &src,
        format!(
            "#include \"buffet.h\"\n\
             const char *buffet_nf_name(void) {{ return \"fat\"; }}\n\
             uint32_t buffet_abi_version(void) {{ return BUFFET_ABI_VERSION; }}\n\
             size_t buffet_mem_register(void) {{ return {bytes}ull; }}\n\
             int buffet_state_init(const char *p, void *s, size_t len, char *err, size_t n) {{\n\
             (void)p; (void)s; (void)len; (void)err; (void)n; return 0; }}\n\
             buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *s, size_t len) {{\n\
             (void)pkt; (void)s; (void)len; return BUFFET_PASS; }}\n"
        ),
    )
    .unwrap();
    let so = dir.join("fat.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-nostartfiles",
            "-fno-stack-protector",
        ])
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .arg("-o")
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(st.success());
    so
}

#[test]
fn a_c_stage_too_large_for_the_arena_is_named_before_any_tenant_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    traffic(dir.path());
    // 32 MiB per stage: a chain region holds 8 such parts, past a 64 MiB arena.
    let so = fat_nf(dir.path(), 32 << 20);
    let stage = format!("c:{}", so.display());
    c_stage_tenants(dir.path(), &stage);
    let out = replay_without_mpk(
        dir.path(),
        &[
            "--nf",
            "monitor",
            "--isolation",
            "trusted-native",
            "--arena-mib",
            "64",
            "--tenants",
            "t.toml",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let error = stderr.lines().last().unwrap();
    // The C NF's part holds its 32 MiB and the loader's few bytes of its own.
    assert!(
        error.starts_with(&format!("error: t.toml: chain stage NF {stage} asks 3355")),
        "{stderr}"
    );
    assert!(
        error.contains(
            " bytes per tenant, and every tenant's chain region holds 8 parts of the largest \
             stage NF: "
        ),
        "{stderr}"
    );
    assert!(error.contains("--arena-mib"), "{stderr}");
    assert!(!stderr.contains("cannot admit"), "{stderr}");
    // With the arena it asks for, the run goes ahead.
    let out = replay_without_mpk(
        dir.path(),
        &[
            "--nf",
            "monitor",
            "--isolation",
            "trusted-native",
            "--arena-mib",
            "1024",
            "--tenants",
            "t.toml",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
}

#[test]
fn a_policy_the_nf_refuses_names_the_tenant_once() {
    let dir = tempfile::tempdir().unwrap();
    traffic(dir.path());
    std::fs::write(
        dir.path().join("t.toml"),
        "[[tenant]]\nid = 1\nname = \"a\"\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [tenant.policy]\nflow_capacity = 0\n",
    )
    .unwrap();
    let out = replay_without_mpk(dir.path(), &["--nf", "monitor", "--tenants", "t.toml"]);
    let (_, stderr) = text(&out);
    assert_eq!(
        stderr,
        "error: t.toml: cannot admit tenant 1 (\"a\"): invalid policy field `flow_capacity`: \
         must be at least 1\n"
    );
    // A chain stage's policy of the wrong type names the field inside it.
    std::fs::write(
        dir.path().join("t.toml"),
        "[[tenant]]\nid = 1\nname = \"a\"\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [[tenant.chain]]\nnf = \"firewall\"\n\
         [[tenant.chain]]\nnf = \"monitor\"\npolicy = { flow_capacity = \"many\" }\n",
    )
    .unwrap();
    let out = replay_without_mpk(dir.path(), &["--tenants", "t.toml"]);
    let (_, stderr) = text(&out);
    assert!(
        stderr.starts_with(
            "error: t.toml: tenant 1 (\"a\"): chain[1].policy.flow_capacity: invalid type: \
             string \"many\""
        ),
        "{stderr}"
    );
}

#[test]
fn inputs_of_the_wrong_kind_are_named_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    traffic(dir.path());
    std::fs::write(
        dir.path().join("t.toml"),
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
    )
    .unwrap();
    // A pcapng Section Header Block, as editcap writes one.
    let mut shb = Vec::new();
    for w in [0x0A0D_0D0Au32, 28, 0x1A2B_3C4D] {
        shb.extend_from_slice(&w.to_le_bytes());
    }
    shb.extend_from_slice(&[1, 0, 0, 0]);
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    shb.extend_from_slice(&28u32.to_le_bytes());
    std::fs::write(dir.path().join("in.pcapng"), &shb).unwrap();
    let replay = |input: &str| {
        let out = buffet(
            dir.path(),
            &[
                "replay",
                "--nf",
                "monitor",
                "--tenants",
                "t.toml",
                "--input",
                input,
            ],
        );
        text(&out).1
    };
    assert_eq!(
        replay("in.pcapng"),
        "error: in.pcapng is a pcapng file, which buffet does not read; convert it with \
         `editcap -F pcap in.pcapng out.pcap`\n"
    );
    assert_eq!(
        replay("t.toml"),
        "error: t.toml is not a pcap file: unknown magic number\n"
    );

    // demo --tenants is a count.
    let out = buffet(dir.path(), &["demo", "--tenants", "t.toml"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "demo --tenants takes a count of tenants (a whole number); to run a tenants file \
             use `buffet replay --tenants FILE`"
        ),
        "{stderr}"
    );

    // trace: --input or --frames, named both; a pcap named as one; a bad line prints
    // nothing before the error.
    let trace = |args: &[&str]| {
        let mut all = vec!["trace", "--workers", "2", "--worker-max", "3"];
        all.extend_from_slice(args);
        buffet(dir.path(), &all)
    };
    let out = trace(&[]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("<--input <INPUT>|--frames <FRAMES>>"),
        "{stderr}"
    );
    let out = trace(&["--input", "in.pcap"]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.starts_with(
            "error: in.pcap is a pcap file: --input takes a CSV trace, one `ts_ns,tenant_id` \
             line per packet; to run a pcap through the Packet Dispatcher and the workers use \
             `buffet replay --input FILE`"
        ),
        "{stderr}"
    );
    std::fs::write(dir.path().join("bad.csv"), "0,0\n1,x\n").unwrap();
    let out = trace(&["--input", "bad.csv"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stdout.is_empty(), "printed before the error: {stdout}");
    assert!(stderr.starts_with("error: bad.csv: line 2: "), "{stderr}");
    std::fs::write(dir.path().join("good.csv"), "0,0\n1,1\n").unwrap();
    let out = trace(&["--input", "good.csv"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "0,0,pass,0\n1,1,pass,1\n");
}
