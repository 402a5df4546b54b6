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
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::cnf::{build_nf, tenant, udp, write_pcap};

fn buffet(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_buffet"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// `buffet replay ARGS --input in.pcap --no-pin` in `dir`, not yet run.
fn replay_command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_buffet"));
    cmd.current_dir(dir)
        .arg("replay")
        .args(args)
        .args(["--input", "in.pcap", "--no-pin"]);
    cmd
}

/// `buffet replay ARGS --input in.pcap --no-pin` in `dir`.
fn replay(dir: &Path, args: &[&str]) -> Output {
    replay_command(dir, args).output().unwrap()
}

/// `buffet replay ARGS --input in.pcap --no-pin` in `dir` with protection keys looking
/// absent (`BUFFET_MPK=off`), so a run that would pick `mpk` fails the same way on every
/// CPU.
fn replay_without_mpk(dir: &Path, args: &[&str]) -> Output {
    replay_command(dir, args)
        .env("BUFFET_MPK", "off")
        .output()
        .unwrap()
}

/// `replay_without_mpk` with `--nf monitor --isolation trusted-native ARGS --tenants t.toml`.
fn trusted_monitor(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--nf", "monitor", "--isolation", "trusted-native"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--tenants", "t.toml"]);
    replay_without_mpk(dir, &all)
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The stdout and stderr of a run that exited with `code`.
#[track_caller]
fn exited(out: &Output, code: i32) -> (String, String) {
    let (stdout, stderr) = text(out);
    assert_eq!(out.status.code(), Some(code), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The stdout and stderr of a run that succeeded.
#[track_caller]
fn succeeded(out: &Output) -> (String, String) {
    let (stdout, stderr) = text(out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The stderr of a run that failed.
#[track_caller]
fn failed(out: &Output) -> String {
    let (stdout, stderr) = text(out);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    stderr
}

#[track_caller]
fn assert_has(text: &str, part: &str) {
    assert!(text.contains(part), "{text}");
}

#[track_caller]
fn assert_starts(text: &str, prefix: &str) {
    assert!(text.starts_with(prefix), "{text}");
}

/// Writes `contents` to `dir/name`.
fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) {
    std::fs::write(dir.join(name), contents).unwrap();
}

/// `dir/name`: tenant 1 on 10.1.0.0/16, with no chain.
fn one_tenant(dir: &Path, name: &str) {
    write(
        dir,
        name,
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
    );
}

/// Tenants 1 and 2, 100 packets each, to port 53.
fn traffic(dir: &Path) {
    let frames: Vec<Vec<u8>> = (0..100).flat_map(|_| [udp(1, 53), udp(2, 53)]).collect();
    write_pcap(&dir.join("in.pcap"), &frames);
}

/// A new temporary directory with `traffic` in it.
fn traffic_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    traffic(dir.path());
    dir
}

/// `buffet replay --nf-lib <lib> --isolation trusted-native` over a two-tenant file.
fn replay_nf_lib(dir: &Path, lib: &str) -> Output {
    one_tenant(dir, "tenants.toml");
    traffic(dir);
    replay(
        dir,
        &[
            "--nf-lib",
            lib,
            "--isolation",
            "trusted-native",
            "--tenants",
            "tenants.toml",
        ],
    )
}

#[test]
fn nf_lib_names_a_file_that_is_no_shared_object_for_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "nf.c", "int x;\n");
    let stderr = failed(&replay_nf_lib(dir.path(), "nf.c"));
    assert_has(
        &stderr,
        "error: cannot load C NF nf.c: it is not a shared object (not an ELF file)",
    );

    let Some(obj) = build::object("nf_lib_names_an_ebpf_object", "fault") else {
        return;
    };
    let stderr = failed(&replay_nf_lib(dir.path(), obj.to_str().unwrap()));
    assert_has(
        &stderr,
        &format!(
            "error: cannot load C NF {}: it is an eBPF object (ELF machine BPF), not a shared \
             object: load eBPF NFs with --nf-ebpf",
            obj.display()
        ),
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
    let dir = traffic_dir();
    // Tenant 2's program returns 0xdead from its 41st packet on.
    write(
        dir.path(),
        "tenants.toml",
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [tenant.policy.maps]\nconfig = { u32 = [0] }\n\n\
         [[tenant]]\nid = 2\nrules = [ { dst_ip = \"10.2.0.0/16\" } ]\n\
         [tenant.policy.maps]\nconfig = { u32 = [40] }\n",
    );
    let (stdout, _) = succeeded(&replay(
        dir.path(),
        &[
            "--nf-ebpf",
            obj.to_str().unwrap(),
            "--tenants",
            "tenants.toml",
        ],
    ));
    let reason = "return value 0xdead is not a verdict";
    assert_eq!(stdout.matches(reason).count(), 1, "{stdout}");
    // The quarantine event carries it; no `contained fault:` line repeats it.
    assert_has(
        &stdout,
        &format!("quarantined: the NF reported a fault (Verdict::Fault): {reason}\n"),
    );
    assert!(!stdout.contains("contained fault:"), "{stdout}");
}

#[test]
fn a_quarantined_tenant_keeps_its_chain_in_the_stats() {
    let dir = traffic_dir();
    let nf = build_nf(dir.path(), "malicious");
    let nf = nf.to_str().unwrap();
    // Tenant 1: monitor then the C NF, behaving; tenant 2: the same chain, its C stage
    // writing to NULL after 40 packets.
    write(
        dir.path(),
        "tenants.toml",
        format!(
            "[[tenant]]\nid = 1\nrules = [ {{ dst_ip = \"10.1.0.0/16\" }} ]\n\
             [[tenant.chain]]\nnf = \"monitor\"\n\
             [[tenant.chain]]\nnf = \"c:{nf}\"\npolicy = {{ canary = 11 }}\n\n\
             [[tenant]]\nid = 2\nrules = [ {{ dst_ip = \"10.2.0.0/16\" }} ]\n\
             [[tenant.chain]]\nnf = \"monitor\"\n\
             [[tenant.chain]]\nnf = \"c:{nf}\"\npolicy = {{ attack = \"null\", attack_after = 40 }}\n"
        ),
    );
    succeeded(&replay(
        dir.path(),
        &[
            "--isolation",
            "trusted-native",
            "--tenants",
            "tenants.toml",
            "--stats-json",
            "stats.json",
        ],
    ));
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
    let dir = traffic_dir();
    write(
        dir.path(),
        "tenants.toml",
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [[tenant.chain]]\nnf = \"firewall\"\n[[tenant.chain]]\nnf = \"my-monitr\"\n",
    );
    let mut registry = buffet::cli::Registry::new();
    registry.add::<buffet::nfs::Monitor>("my-monitor");
    let tenants = dir.path().join("tenants.toml");
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
    assert_has(
        &text(&out).1,
        "unknown NF \"my-monitr\": give a reference NF (monitor, firewall, ids, ipsec, \
         dpi, macswap, policer, l2fwd, flowfwd), c:PATH or ebpf[+jit]:PATH\n",
    );
}

/// `dir/t.toml`: tenant 7 ("a"), whose chain is the one stage `nf`.
fn c_stage_tenants(dir: &Path, nf: &str) {
    write(
        dir,
        "t.toml",
        format!(
            "[[tenant]]\nid = 7\nname = \"a\"\nrules = [ {{ dst_ip = \"10.1.0.0/16\" }} ]\n\
             [[tenant.chain]]\nnf = \"{nf}\"\n"
        ),
    );
}

/// `c_stage_tenants` with the C NF `so` as the stage; its `c:PATH`.
fn c_stage(dir: &Path, so: &Path) -> String {
    let stage = format!("c:{}", so.display());
    c_stage_tenants(dir, &stage);
    stage
}

#[test]
fn the_trusted_native_warning_is_printed_once() {
    let dir = traffic_dir();
    let nf = build_nf(dir.path(), "portblock");
    c_stage(dir.path(), &nf);
    one_tenant(dir.path(), "plain.toml");
    let runs = [
        // A C chain stage.
        trusted_monitor(dir.path(), &[]),
        // A C NF alone (no chain).
        replay_without_mpk(
            dir.path(),
            &[
                "--nf-lib",
                nf.to_str().unwrap(),
                "--isolation",
                "trusted-native",
                "--tenants",
                "plain.toml",
            ],
        ),
    ];
    for out in &runs {
        let (_, stderr) = succeeded(out);
        assert_eq!(
            stderr.matches("WARNING: isolation: trusted-native").count(),
            1,
            "{stderr}"
        );
    }
}

#[test]
fn a_default_mpk_level_that_is_unavailable_says_it_was_the_default() {
    let dir = traffic_dir();
    let nf = build_nf(dir.path(), "portblock");
    let stage = c_stage(dir.path(), &nf);
    // A C chain stage under --nf monitor, no --isolation: mpk is the chain's default.
    let out = replay_without_mpk(dir.path(), &["--nf", "monitor", "--tenants", "t.toml"]);
    let (_, stderr) = exited(&out, 1);
    assert_starts(
        &stderr,
        &format!(
            "error: no --isolation given: the default isolation level for a C NF (t.toml: \
             tenant 7 (\"a\"): chain[0].nf = {stage:?}) is mpk, and MPK isolation is \
             unavailable: "
        ),
    );
    assert!(
        stderr.contains("pass --isolation trusted-native") && !stderr.contains("--isolation mpk"),
        "{stderr}"
    );
    one_tenant(dir.path(), "plain.toml");
    let lib = nf.to_str().unwrap();
    let default_nf_lib = format!(
        "error: no --isolation given: the default isolation level for a C NF (--nf-lib \
         {lib}) is mpk"
    );
    for (args, prefix) in [
        // --nf-lib without --isolation: the same, naming the flag.
        (
            &["--nf-lib", lib, "--tenants", "plain.toml"][..],
            default_nf_lib.as_str(),
        ),
        // Asked for: the flag's own error.
        (
            &[
                "--nf-lib",
                lib,
                "--isolation",
                "mpk",
                "--tenants",
                "plain.toml",
            ][..],
            "error: --isolation mpk: MPK isolation is unavailable",
        ),
    ] {
        assert_starts(&text(&replay_without_mpk(dir.path(), args)).1, prefix);
    }
    // The help says which NFs default to mpk.
    let help = buffet(dir.path(), &["replay", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    assert_has(&help, "when a chain stage of the tenants file is a C NF");
}

#[test]
fn a_c_stage_that_does_not_load_is_named_like_the_files_other_errors() {
    let dir = traffic_dir();
    c_stage_tenants(dir.path(), "c:x.so");
    let (_, stderr) = exited(&trusted_monitor(dir.path(), &[]), 1);
    let error = stderr.lines().last().unwrap();
    assert!(
        error.starts_with("error: t.toml: tenant 7 (\"a\"): chain[0].nf: cannot load C NF x.so: "),
        "{stderr}"
    );
    assert!(!error.contains("chain stage NF"), "{stderr}");
}

/// Writes and builds `dir/fat.so`, a C NF that registers `bytes` of state per tenant.
fn fat_nf(dir: &Path, bytes: u64) -> PathBuf {
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
    let dir = traffic_dir();
    // 32 MiB per stage: a chain region holds 8 such parts, past a 64 MiB arena.
    let stage = c_stage(dir.path(), &fat_nf(dir.path(), 32 << 20));
    let (_, stderr) = exited(&trusted_monitor(dir.path(), &["--arena-mib", "64"]), 1);
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
    succeeded(&trusted_monitor(dir.path(), &["--arena-mib", "1024"]));
}

#[test]
fn a_policy_the_nf_refuses_names_the_tenant_once() {
    let dir = traffic_dir();
    write(
        dir.path(),
        "t.toml",
        "[[tenant]]\nid = 1\nname = \"a\"\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [tenant.policy]\nflow_capacity = 0\n",
    );
    let out = replay_without_mpk(dir.path(), &["--nf", "monitor", "--tenants", "t.toml"]);
    assert_eq!(
        text(&out).1,
        "error: t.toml: cannot admit tenant 1 (\"a\"): invalid policy field `flow_capacity`: \
         must be at least 1\n"
    );
    // A chain stage's policy of the wrong type names the field inside it.
    write(
        dir.path(),
        "t.toml",
        "[[tenant]]\nid = 1\nname = \"a\"\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n\
         [[tenant.chain]]\nnf = \"firewall\"\n\
         [[tenant.chain]]\nnf = \"monitor\"\npolicy = { flow_capacity = \"many\" }\n",
    );
    let out = replay_without_mpk(dir.path(), &["--tenants", "t.toml"]);
    assert_starts(
        &text(&out).1,
        "error: t.toml: tenant 1 (\"a\"): chain[1].policy.flow_capacity: invalid type: \
         string \"many\"",
    );
}

#[test]
fn inputs_of_the_wrong_kind_are_named_for_what_they_are() {
    let dir = traffic_dir();
    one_tenant(dir.path(), "t.toml");
    // A pcapng Section Header Block, as editcap writes one.
    let mut shb = Vec::new();
    for w in [0x0A0D_0D0Au32, 28, 0x1A2B_3C4D] {
        shb.extend_from_slice(&w.to_le_bytes());
    }
    shb.extend_from_slice(&[1, 0, 0, 0]);
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    shb.extend_from_slice(&28u32.to_le_bytes());
    write(dir.path(), "in.pcapng", &shb);
    let replay_input = |input: &str| {
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
        replay_input("in.pcapng"),
        "error: in.pcapng is a pcapng file, which buffet does not read; convert it with \
         `editcap -F pcap in.pcapng out.pcap`\n"
    );
    assert_eq!(
        replay_input("t.toml"),
        "error: t.toml is not a pcap file: unknown magic number\n"
    );

    // demo --tenants is a count.
    let (_, stderr) = exited(&buffet(dir.path(), &["demo", "--tenants", "t.toml"]), 2);
    assert_has(
        &stderr,
        "demo --tenants takes a count of tenants (a whole number); to run a tenants file \
         use `buffet replay --tenants FILE`",
    );

    // trace: --input or --frames, named both; a pcap named as one; a bad line prints
    // nothing before the error.
    let trace = |args: &[&str]| {
        let mut all = vec!["trace", "--workers", "2", "--worker-max", "3"];
        all.extend_from_slice(args);
        buffet(dir.path(), &all)
    };
    let (_, stderr) = exited(&trace(&[]), 2);
    assert_has(&stderr, "<--input <INPUT>|--frames <FRAMES>>");
    let (stdout, stderr) = text(&trace(&["--input", "in.pcap"]));
    assert!(stdout.is_empty(), "{stdout}");
    assert_starts(
        &stderr,
        "error: in.pcap is a pcap file: --input takes a CSV trace, one `ts_ns,tenant_id` \
         line per packet; to run a pcap through the Packet Dispatcher and the workers use \
         `buffet replay --input FILE`",
    );
    write(dir.path(), "bad.csv", "0,0\n1,x\n");
    let (stdout, stderr) = exited(&trace(&["--input", "bad.csv"]), 1);
    assert!(stdout.is_empty(), "printed before the error: {stdout}");
    assert_starts(&stderr, "error: bad.csv: line 2: ");
    write(dir.path(), "good.csv", "0,0\n1,1\n");
    let (stdout, _) = succeeded(&trace(&["--input", "good.csv"]));
    assert_eq!(stdout, "0,0,pass,0\n1,1,pass,1\n");
}
