//! The example binary is the full `buffet` command: `replay --nf my-nf` runs the NF on
//! a pcap generated here, and its per-tenant counters reach the stats JSON.

use std::path::Path;
use std::process::Command;

use etherparse::PacketBuilder;

fn udp(dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 1, 10], dst, 64)
        .udp(40000, dport)
        .write(&mut v, b"payload")
        .unwrap();
    v
}

fn my_nf() -> Command {
    Command::new(env!("CARGO_BIN_EXE_my-nf"))
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = buffet::io::pcap::PcapWriter::create(path).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write(i as u64 * 1_000, f).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn replay_runs_my_nf_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let mut frames = Vec::new();
    for i in 0..20 {
        frames.push(udp([10, 1, 0, 1], if i % 2 == 0 { 53 } else { 443 }));
        frames.push(udp([10, 2, 0, 1], 53));
    }
    write_pcap(&input, &frames);
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        r#"
[[tenant]]
id = 1
name = "no-dns"
rules = [ { dst_ip = "10.1.0.0/16" } ]
[tenant.policy]
block_udp_ports = [53]

[[tenant]]
id = 2
name = "open"
rules = [ { dst_ip = "10.2.0.0/16" } ]
"#,
    )
    .unwrap();
    let stats = dir.path().join("stats.json");
    let out_pcap = dir.path().join("out.pcap");
    let out = my_nf()
        .args(["replay", "--nf", "my-nf", "--no-pin", "--tenants"])
        .arg(&tenants)
        .arg("--input")
        .arg(&input)
        .arg("--stats-json")
        .arg(&stats)
        .arg("--output")
        .arg(&out_pcap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("no-dns") && stdout.contains("open"),
        "{stdout}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let tenant = |id: u64| {
        json["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap()
            .clone()
    };
    // The NF ran: its own counters, per tenant.
    assert_eq!(tenant(1)["nf"]["packets"], 20);
    assert_eq!(tenant(1)["nf"]["blocked"], 10);
    assert_eq!(tenant(1)["passed"], 10);
    assert_eq!(tenant(1)["drops"]["policy"], 10);
    assert_eq!(tenant(2)["nf"]["udp"], 20);
    assert_eq!(tenant(2)["passed"], 20);
    // The passed packets reached --output.
    let mut r = buffet::io::pcap::PcapReader::open(&out_pcap).unwrap();
    let mut n = 0;
    while r.read_packet().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 30);
}

#[test]
fn the_reference_nfs_and_the_other_commands_are_still_there() {
    let help = my_nf().args(["replay", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("my-nf") && help.contains("firewall"),
        "{help}"
    );
    let out = my_nf()
        .args([
            "replay",
            "--nf",
            "nope",
            "--tenants",
            "t.toml",
            "--input",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("my-nf"), "{err}");
    let out = my_nf()
        .args([
            "demo",
            "--nf",
            "my-nf",
            "--tenants",
            "3",
            "--seconds",
            "0.05",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("NF my-nf"));
}

#[test]
fn a_bad_policy_names_the_tenant_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[udp([10, 1, 0, 1], 53)]);
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n[tenant.policy]\nblock_udp_ports = [0]\n",
    )
    .unwrap();
    let out = my_nf()
        .args(["replay", "--nf", "my-nf", "--no-pin", "--tenants"])
        .arg(&tenants)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tenant 1") && err.contains("block_udp_ports"),
        "{err}"
    );
}

/// `examples/my-nf/chains.toml`: tenant 1 runs the firewall, then `my-nf`; tenant 2 runs
/// `my-nf` for DNS only, then the monitor. No `--nf`: every tenant names its chain.
#[test]
fn a_tenants_chain_names_my_nf_next_to_reference_nfs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let mut frames = Vec::new();
    for i in 0..30 {
        // Tenant 1: 10 each to 53 (my-nf drops), 443 (the firewall drops) and 123.
        frames.push(udp([10, 1, 0, 1], [53, 443, 123][i % 3]));
        // Tenant 2: 15 to 53 (my-nf's guard selects them), 15 to 80.
        frames.push(udp([10, 2, 0, 1], if i % 2 == 0 { 53 } else { 80 }));
    }
    write_pcap(&input, &frames);
    let tenants = Path::new(env!("CARGO_MANIFEST_DIR")).join("chains.toml");
    let stats = dir.path().join("stats.json");
    let out = my_nf()
        .args(["replay", "--no-pin", "--tenants"])
        .arg(&tenants)
        .arg("--input")
        .arg(&input)
        .arg("--stats-json")
        .arg(&stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("stage 0 firewall") && stdout.contains("stage 1 my-nf"),
        "{stdout}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let tenant = |id: u64| {
        json["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap()
            .clone()
    };
    let t1 = tenant(1);
    assert_eq!(t1["passed"], 10, "{t1}");
    let (fw, mine) = (&t1["chain"][0], &t1["chain"][1]);
    assert_eq!(fw["nf"], "firewall");
    assert_eq!((&fw["packets"], &fw["passed"]), (&30.into(), &20.into()));
    assert_eq!(fw["drops"]["policy"], 10);
    // my-nf saw only what the firewall passed, with its own policy and counters.
    assert_eq!(mine["nf"], "my-nf");
    assert_eq!(
        (&mine["packets"], &mine["passed"]),
        (&20.into(), &10.into())
    );
    assert_eq!(mine["drops"]["policy"], 10);
    assert_eq!(mine["counters"]["blocked"], 10);
    assert_eq!(mine["counters"]["udp"], 20);
    let t2 = tenant(2);
    assert_eq!(t2["passed"], 30, "{t2}");
    let (mine, mon) = (&t2["chain"][0], &t2["chain"][1]);
    // Its guard gave my-nf the DNS packets only; its default policy blocks nothing.
    assert_eq!(
        (&mine["nf"], &mine["packets"]),
        (&"my-nf".into(), &15.into())
    );
    assert_eq!(mine["counters"]["blocked"], 0);
    assert_eq!(
        (&mon["nf"], &mon["packets"]),
        (&"monitor".into(), &30.into())
    );
}

/// A stage naming a misspelt NF, or giving `my-nf` a policy it refuses, is one error
/// naming the file, the tenant, the stage and the field; nothing runs.
#[test]
fn bad_my_nf_stages_name_the_tenant_and_stage() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[udp([10, 1, 0, 1], 53)]);
    let tenants = dir.path().join("t.toml");
    let run = |stage: &str| {
        std::fs::write(
            &tenants,
            format!(
                "[[tenant]]\nid = 7\nname = \"a\"\nrules = [ {{ dst_ip = \"10.1.0.0/16\" }} ]\n\
                 [[tenant.chain]]\nnf = \"firewall\"\n[[tenant.chain]]\n{stage}\n"
            ),
        )
        .unwrap();
        let out = my_nf()
            .args(["replay", "--no-pin", "--tenants"])
            .arg(&tenants)
            .arg("--input")
            .arg(&input)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run("nf = \"my-nff\"");
    assert!(
        e.contains("tenant 7 (\"a\"): chain[1].nf: unknown NF \"my-nff\": give a reference NF"),
        "{e}"
    );
    let e = run("nf = \"my-nf\"\npolicy = { block_udp_ports = [0] }");
    assert!(
        e.contains("tenant 7 (\"a\"): chain[1].policy: block_udp_ports: port 0 cannot be blocked"),
        "{e}"
    );
    let e = run("nf = \"my-nf\"\npolicy = { block_tcp = true }");
    assert!(
        e.contains("tenant 7 (\"a\"): chain[1].policy.block_tcp: unknown field `block_tcp`"),
        "{e}"
    );
}
