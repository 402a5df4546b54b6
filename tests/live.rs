//! End to end on a live link (root only): `buffet run --dispatch software` on one end
//! of a veth pair in network namespace A, traffic for 10 tenants (plus unmatched and
//! malformed frames) sent from the other end in namespace B, and the per-tenant counts
//! of the sender checked against the workers' report; the frames the NF passes are
//! captured back in B and counted; the same over `--port af-xdp` (its redirect program
//! in native and in generic mode). Also the errors before traffic: an interface that
//! does not exist, one that is down, a queue it does not have, and a run without
//! privileges; for AF_XDP, that nothing stays attached after an error or a SIGTERM, that
//! a killed run's program is replaced and a live run's is not; and the AF_XDP socket
//! inserted into a caller's own XSKMAP, echoing UMEM frames back without a copy.
//! Every reference NF runs this way (monitor, firewall and ids each with its own
//! policies; dpi, macswap, policer, l2fwd, flowfwd and ipsec with policies that pass or
//! forward back every frame), and so do a C NF and an eBPF NF.
//!
//! Several queues: on a veth pair with four queues a side, a peer sends on each of its
//! four transmit queues (one AF_XDP socket per queue, run as the ignored test
//! `multiqueue_sender_helper`); one AF_XDP port on queues 0-3 receives every frame, on
//! more than one queue, in native and in generic mode; `buffet run --port af-xdp
//! --queues 0-3` counts every tenant exactly; so does `buffet run --dispatch xdp --queues
//! 0-3` (a socket per queue and worker, each receiving exactly its queue's frames), in
//! native and generic mode; a queue the interface lacks is refused.
//!
//! The sockets' kernel counters (`XDP_STATISTICS`): 300 frames at a socket with a
//! 64-entry receive ring that nobody reads — the port's own socket, then a shared
//! receiver — and the frames in its ring plus the drops the kernel counted equal the
//! frames sent; `buffet run --dispatch xdp` reports every socket's counters.
//!
//! `--dispatch xdp --xdp-mode generic`: the XDP Packet Dispatcher redirects each frame to
//! its worker's own socket (all on the veth's single queue, sharing one UMEM); the
//! per-tenant counts of the sender, the XDP maps and the workers agree exactly, passed
//! frames come back with their DSCP as sent (the tenant travels in metadata, not in the
//! frame: as the sender's socket reads them and as tshark, capturing on B's end, decodes
//! them on the wire), a
//! MAX_NB exceeded shows migrations among the run's events, SIGTERM
//! detaches the program, and a rule the XDP classifier cannot express is refused before
//! anything is attached. Its passed frames also leave through an AF_PACKET `--tx-iface`
//! on a second pair, with every count of the software dispatcher's test agreeing (the
//! program's frames seen, unmatched and malformed are the report's global counts). A
//! worker stuck in a tenant's C handler (asleep in the kernel) loses its tenants' rows
//! in the program's Tenant Table to the live worker: the victims' later frames all pass.
//!
//! An interface deleted mid-run (each dispatcher and port) stops the run with its report
//! and an error naming the interface. UDP GSO super-packets from the peer are counted as
//! oversize, with one warning; buffetd (each live port kind) counts them in `/v1/stats`
//! while it runs. Stopped by SIGTERM in the middle of a flood, a `--dispatch xdp` run's port counters
//! are read after the workers' last frames were sent: `tx` + `tx_dropped` are the
//! frames the tenants passed.
//!
//! The rate line: with stderr on a pseudo-terminal, `buffet run` (either dispatcher)
//! prints the packets received so far once a second, and they follow the traffic sent
//! from B; with stderr on a pipe, as in every other test here, it prints none.
//!
//! The sender is this test binary itself, re-run inside namespace B (`ip netns exec`)
//! as the ignored test `sender_helper`, which sends a pcap through buffet's own
//! AF_PACKET port and counts what comes back.
//!
//! Without root every test skips with a `SKIP (privilege)` line; under
//! `BUFFET_REQUIRE_PRIVILEGED=1` (or CI) that skip is a failure.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use buffet::io::pcap::PcapWriter;
use buffet::io::{HeapPool, Port};
use buffet_testkit::gate;

#[path = "build.rs"]
mod build;
mod common;
use buffet_testkit::cores_used_over;
use common::daemon::{config_head, write_config, Daemon};
use common::netns::{self, ip, privileged, signal, start_run, tenant_rows, NsPair};
use etherparse::PacketBuilder;

const BUFFET: &str = env!("CARGO_BIN_EXE_buffet");
/// Marks the payload of every frame that should come back.
const MARK: &[u8] = b"BUFFET-LIVE";

/// One UDP/IPv4 frame carrying the mark and a sequence number.
fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut v, &payload)
        .unwrap();
    v
}

fn tcp4(src: [u8; 4], dst: [u8; 4], dport: u16, seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ipv4(src, dst, 64)
        .tcp(40000, dport, seq, 1000)
        .write(&mut v, &payload)
        .unwrap();
    v
}

fn udp6(dst: [u8; 16], seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ipv6(
            [0xfd, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst,
            64,
        )
        .udp(40000, 7000)
        .write(&mut v, &payload)
        .unwrap();
    v
}

const TENANTS: &str = r#"
[[tenant]]
id = 1
name = "prefix"
rules = [ { dst_ip = "10.1.0.0/16" } ]

[[tenant]]
id = 2
name = "host"
rules = [ { dst_ip = "10.2.0.5" } ]

[[tenant]]
id = 3
name = "port-range"
rules = [ { protocol = "udp", dst_port = "5000-5099" } ]

[[tenant]]
id = 4
name = "src-prefix"
rules = [ { src_ip = "192.168.7.0/24" } ]

[[tenant]]
id = 5
name = "tcp-net"
rules = [ { dst_ip = "10.5.0.0/24", protocol = "tcp" } ]

[[tenant]]
id = 6
name = "dns"
rules = [ { dst_ip = "10.6.1.1", protocol = "udp", dst_port = 53 } ]

[[tenant]]
id = 7
name = "wide"
rules = [ { dst_ip = "10.7.0.0/16" } ]

[[tenant]]
id = 8
name = "ipv6"
rules = [ { dst_ip = "fd00:8::/32" } ]

[[tenant]]
id = 9
name = "src-ports"
rules = [ { dst_ip = "10.9.0.0/16", protocol = "udp", src_port = "1000-1999" } ]

[[tenant]]
id = 10
name = "ten"
rules = [ { dst_ip = "10.10.0.0/16" } ]
"#;

/// The traffic: (tenant id or 0 for unmatched/malformed, frame), and how many frames
/// per tenant.
struct Traffic {
    frames: Vec<Vec<u8>>,
    /// Per frame, its tenant's id (0: unmatched or malformed).
    tenant_of: Vec<u32>,
    per_tenant: Vec<(u32, u64)>,
    unmatched: u64,
    malformed: u64,
}

fn traffic() -> Traffic {
    let other: [u8; 4] = [172, 16, 0, 1];
    let mut by_tenant: Vec<(u32, Vec<Vec<u8>>)> = Vec::new();
    let mut seq = 0u32;
    for t in 1..=10u32 {
        let k = 20 + 3 * t; // different counts catch a frame counted for the wrong tenant
        let mut v = Vec::new();
        for i in 0..k {
            seq += 1;
            let i8 = (i % 200) as u8 + 1;
            v.push(match t {
                1 => udp4(other, [10, 1, i8, 3], 40000, 80, seq),
                2 => udp4(other, [10, 2, 0, 5], 40000, 80, seq),
                3 => udp4(other, [203, 0, 113, 9], 40000, 5000 + (i % 100) as u16, seq),
                4 => udp4([192, 168, 7, i8], [198, 18, 0, 1], 40000, 80, seq),
                5 => tcp4(other, [10, 5, 0, i8], 443, seq),
                6 => udp4(other, [10, 6, 1, 1], 40000, 53, seq),
                7 => udp4(other, [10, 7, i8, i8], 40000, 123, seq),
                8 => udp6([0xfd, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, i8], seq),
                9 => udp4(other, [10, 9, 0, 1], 1000 + i as u16 * 7, 80, seq),
                _ => udp4(other, [10, 10, 0, i8], 40000, 8080, seq),
            });
        }
        by_tenant.push((t, v));
    }
    // Unmatched: nobody's address, ports or source; and tenant 9's address from a port
    // outside its range.
    let mut unmatched = Vec::new();
    for i in 0..15u32 {
        unmatched.push(udp4(other, [198, 51, 100, 1], 40000, 9999, 100_000 + i));
    }
    for i in 0..5u32 {
        unmatched.push(udp4(other, [10, 9, 0, 1], 3000, 80, 200_000 + i));
    }
    // Malformed: IPv4 cut inside its header, and an IPv4 length beyond the frame.
    let mut malformed = Vec::new();
    let good = udp4(other, [10, 1, 0, 1], 40000, 80, 0);
    for _ in 0..6 {
        malformed.push(good[..20].to_vec());
    }
    for _ in 0..4 {
        let mut f = good.clone();
        f[16] = 0xff;
        malformed.push(f);
    }
    // Interleave tenants round robin, unmatched and malformed among them.
    let mut frames = Vec::new();
    let mut tenant_of = Vec::new();
    let ids: Vec<u32> = by_tenant.iter().map(|(t, _)| *t).collect();
    let per_tenant = by_tenant
        .iter()
        .map(|(t, v)| (*t, v.len() as u64))
        .collect();
    let mut iters: Vec<_> = by_tenant.into_iter().map(|(_, v)| v.into_iter()).collect();
    let (mut um, mut mf) = (unmatched.clone().into_iter(), malformed.clone().into_iter());
    loop {
        let mut any = false;
        for (it, &id) in iters.iter_mut().zip(&ids) {
            if let Some(f) = it.next() {
                frames.push(f);
                tenant_of.push(id);
                any = true;
            }
        }
        for f in um.next().into_iter().chain(mf.next()) {
            frames.push(f);
            tenant_of.push(0);
            any = true;
        }
        if !any {
            break;
        }
    }
    Traffic {
        frames,
        tenant_of,
        per_tenant,
        unmatched: unmatched.len() as u64,
        malformed: malformed.len() as u64,
    }
}

/// Runs in namespace B (see the module docs): sends the pcap in `BUFFET_LIVE_SEND` out
/// of `BUFFET_LIVE_IFACE`, then counts marked frames coming back on it and on
/// `BUFFET_LIVE_CAPTURE` (if given) until `BUFFET_LIVE_EXPECT` arrived or 5 s passed,
/// and writes `sent back_on_iface back_on_capture` to `BUFFET_LIVE_OUT`.
#[test]
#[ignore = "helper: run by live_traffic_counts_agree inside a network namespace"]
fn sender_helper() {
    netns::sender(MARK);
}

/// This test binary run inside network namespace `ns` for the one ignored helper test
/// `test` (single-threaded, its output shown): how a test puts a socket or a sender on
/// the far side of a veth pair.
fn ns_helper(ns: &str, test: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ]);
    c
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::create(path).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write(i as u64 * 1000, f).unwrap();
    }
    w.flush().unwrap();
}

#[test]
fn live_traffic_counts_agree() {
    if !privileged("live::live_traffic_counts_agree") {
        return;
    }
    run_and_check(&NsPair::new(), None, Nf::Monitor);
}

#[test]
fn live_firewall_policies_apply_per_tenant() {
    if !privileged("live::live_firewall_policies_apply_per_tenant") {
        return;
    }
    run_and_check(&NsPair::new(), None, Nf::FirewallDenyingEvenTenants);
}

/// Every kind of NF runs live as it does in `replay`: the IDS (signatures matched on live
/// frames: even tenants block on the frames' mark, odd ones alert), a C NF (`--nf-lib`,
/// examples/c-nf/flowmon.c, at `trusted-native`: not every CPU has protection keys) and
/// an eBPF NF (`--nf-ebpf`, examples/ebpf/flowmon.c, verified, run by the JIT), the last
/// two with either dispatcher. The per-tenant counts of the workers agree with the
/// sender's, and every frame the NF passes comes back.
#[test]
fn ids_c_and_ebpf_nfs_run_live() {
    let test = "live::ids_c_and_ebpf_nfs_run_live";
    if !privileged(test) {
        return;
    }
    let Some(ebpf) = build::object(test, "flowmon") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let c = common::cnf::build_nf(dir.path(), "flowmon");
    let (c, ebpf) = (c.to_str().unwrap(), ebpf.to_str().unwrap());
    // The IDS blocks even tenants on the frames' mark and only alerts for odd ones.
    run_and_check(&NsPair::new(), None, Nf::IdsBlockingEvenTenants);
    let nfs: [&[&str]; 2] = [
        &["--nf-lib", c, "--isolation", "trusted-native"],
        &["--nf-ebpf", ebpf, "--ebpf-engine", "jit"],
    ];
    let t = traffic();
    let packets: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
    let want: Vec<(u64, u64, u64)> = t
        .per_tenant
        .iter()
        .map(|&(id, k)| (u64::from(id), k, k))
        .collect();
    for nf in nfs {
        // The software Packet Dispatcher (every check of run_and_check).
        run_and_check_with(&NsPair::new(), None, Nf::PassingAll, nf);
        // The XDP Packet Dispatcher.
        let (json, out, (sent, back)) = run_xdp(&NsPair::new(), TENANTS, &t.frames, packets, nf);
        assert_eq!(sent, t.frames.len() as u64, "{nf:?}");
        assert_eq!(tenant_rows(&json), want, "{nf:?}: workers vs sender\n{out}");
        assert_eq!(
            back, packets,
            "{nf:?}: every frame came back out, once\n{out}"
        );
    }
}

/// The NF of a run, and what it should let through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nf {
    /// Passes everything.
    Monitor,
    /// Even tenant ids deny everything, odd ones allow everything.
    FirewallDenyingEvenTenants,
    /// The IDS with one signature, the frames' mark: even tenant ids block on it, odd
    /// ones only alert.
    IdsBlockingEvenTenants,
    /// The NF named by the caller's extra arguments (`--nf X`, `--nf-lib`, `--nf-ebpf`),
    /// which passes everything.
    PassingAll,
    /// A reference NF (`--nf name`) with every tenant on a policy that lets every frame
    /// back out of the port it came in on.
    PassingWith {
        /// The `--nf` name.
        name: &'static str,
        /// Each tenant's `[tenant.policy]` body.
        policy: &'static str,
    },
}

/// The reference NFs no other live test runs, each with a policy that passes (or forwards
/// back out of port 0, the receiving interface) every frame of [`traffic`]: nothing in it
/// is blacklisted, the rate is far above the test's, the tables miss and take the
/// default, and no frame matches an SA.
const PASSING_POLICIES: [(&str, &str); 6] = [
    ("dpi", "blacklist = [\"blocked.example\"]\nports = [80]"),
    ("macswap", ""),
    (
        "policer",
        "rate = 1_000_000_000\nburst = 1_000_000_000\nunit = \"packets\"",
    ),
    ("l2fwd", "default = 0"),
    ("flowfwd", "default = 0"),
    ("ipsec", "unmatched = \"pass\""),
];

/// Every reference NF runs live as in `replay`: with each of the six above (monitor,
/// firewall and ids have their own tests), the per-tenant counts of the workers agree
/// with the sender's and every frame comes back out, once.
#[test]
fn every_reference_nf_runs_live() {
    if !privileged("live::every_reference_nf_runs_live") {
        return;
    }
    // Each NF in turn; a failure of one does not hide the others'.
    let failed: Vec<&str> = PASSING_POLICIES
        .iter()
        .filter(|&&(name, policy)| {
            let run = std::panic::AssertUnwindSafe(|| {
                run_and_check(&NsPair::new(), None, Nf::PassingWith { name, policy })
            });
            std::panic::catch_unwind(run).is_err()
        })
        .map(|&(name, _)| name)
        .collect();
    assert!(failed.is_empty(), "failed live (see above): {failed:?}");
}

impl Nf {
    /// The `--nf` argument, `None` when the caller names the NF itself.
    fn name(self) -> Option<&'static str> {
        match self {
            Nf::Monitor => Some("monitor"),
            Nf::FirewallDenyingEvenTenants => Some("firewall"),
            Nf::IdsBlockingEvenTenants => Some("ids"),
            Nf::PassingAll => None,
            Nf::PassingWith { name, .. } => Some(name),
        }
    }

    /// The tenants file: [`TENANTS`], with each tenant's policy for the firewall and the
    /// IDS.
    fn tenants(self) -> String {
        let with_policy = |policy: fn(bool) -> String| -> String {
            TENANTS
                .split("[[tenant]]")
                .filter(|b| !b.trim().is_empty())
                .enumerate()
                .map(|(i, b)| {
                    format!(
                        "[[tenant]]{b}[tenant.policy]\n{}\n\n",
                        policy((i + 1) % 2 == 0)
                    )
                })
                .collect()
        };
        match self {
            Nf::Monitor | Nf::PassingAll => TENANTS.to_owned(),
            Nf::FirewallDenyingEvenTenants => {
                with_policy(|even| format!("default = \"{}\"", if even { "deny" } else { "allow" }))
            }
            Nf::PassingWith { policy, .. } => TENANTS
                .split("[[tenant]]")
                .filter(|b| !b.trim().is_empty())
                .map(|b| format!("[[tenant]]{b}[tenant.policy]\n{policy}\n\n"))
                .collect(),
            Nf::IdsBlockingEvenTenants => with_policy(|even| {
                format!(
                    "mode = \"{}\"\nrules = 'alert ip any any (msg:\"mark\"; content:\"{}\"; sid:1;)'",
                    if even { "block" } else { "alert" },
                    String::from_utf8_lossy(MARK)
                )
            }),
        }
    }

    fn passes(self, tenant: u32) -> bool {
        match self {
            Nf::Monitor | Nf::PassingAll | Nf::PassingWith { .. } => true,
            Nf::FirewallDenyingEvenTenants | Nf::IdsBlockingEvenTenants => tenant % 2 == 1,
        }
    }
}

#[test]
fn passed_frames_leave_through_the_tx_iface() {
    if !privileged("live::passed_frames_leave_through_the_tx_iface") {
        return;
    }
    let ns = NsPair::new();
    let (va2, vb2) = ns.second_pair();
    run_and_check(&ns, Some((&va2, &vb2)), Nf::Monitor);
}

/// Frames received into AF_XDP UMEM frames leave through an AF_PACKET `--tx-iface`: the
/// pipeline copies each into a heap frame and returns the UMEM frame to its socket, so
/// every count still agrees and every passed frame leaves once.
#[test]
fn af_xdp_frames_leave_through_an_af_packet_tx_iface() {
    if !privileged("live::af_xdp_frames_leave_through_an_af_packet_tx_iface") {
        return;
    }
    let ns = NsPair::new();
    let (va2, vb2) = ns.second_pair();
    run_and_check_with(
        &ns,
        Some((&va2, &vb2)),
        Nf::Monitor,
        &["--port", "af-xdp", "--xdp-mode", "generic"],
    );
}

/// The XDP Packet Dispatcher's frames (UMEM frames each worker took from its own AF_XDP
/// socket) leave through an AF_PACKET `--tx-iface`: every count agrees and every passed
/// frame leaves once through the second pair, none through the receiving link.
#[test]
fn xdp_dispatch_frames_leave_through_an_af_packet_tx_iface() {
    let test = "live::xdp_dispatch_frames_leave_through_an_af_packet_tx_iface";
    if !privileged(test) {
        return;
    }
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
        return;
    }
    let ns = NsPair::new();
    let (va2, vb2) = ns.second_pair();
    run_and_check_with(
        &ns,
        Some((&va2, &vb2)),
        Nf::Monitor,
        &["--dispatch", "xdp", "--xdp-mode", "generic"],
    );
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "detached at the end");
}

/// Sends the traffic from B into `buffet run` on A and checks every count; with
/// `tx = (A side, B side)` of a second pair, passed frames must come back on that pair.
fn run_and_check(ns: &NsPair, tx: Option<(&str, &str)>, nf: Nf) {
    run_and_check_with(ns, tx, nf, &[]);
}

/// [`run_and_check`] with more `buffet run` arguments (`--port af-xdp`, `--dispatch
/// xdp`).
fn run_and_check_with(ns: &NsPair, tx: Option<(&str, &str)>, nf: Nf, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let t = traffic();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, nf.tenants()).unwrap();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &t.frames);
    let stats = dir.path().join("stats.json");
    let mut args: Vec<std::ffi::OsString> = [
        "--iface",
        &ns.va,
        "--workers",
        "2",
        "--no-pin",
        "--duration",
        "6",
    ]
    .iter()
    .map(Into::into)
    .collect();
    if let Some(name) = nf.name() {
        args.extend(["--nf".into(), name.into()]);
    }
    args.extend(["--tenants".into(), tenants.clone().into_os_string()]);
    args.extend(["--stats-json".into(), stats.clone().into_os_string()]);
    if let Some((a, _)) = tx {
        args.extend(["--tx-iface".into(), a.into()]);
    }
    args.extend(extra.iter().map(Into::into));
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (child, stderr) = start_run(&ns.a, &args);
    let passed: u64 = t
        .per_tenant
        .iter()
        .filter(|(id, _)| nf.passes(*id))
        .map(|(_, k)| k)
        .sum();
    let packets: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
    let result = dir.path().join("sender.txt");
    let sender = ns_helper(&ns.b, "sender_helper")
        .env("BUFFET_LIVE_SEND", &pcap)
        .env("BUFFET_LIVE_IFACE", &ns.vb)
        .env("BUFFET_LIVE_EXPECT", passed.to_string())
        .env("BUFFET_LIVE_OUT", &result)
        .envs(tx.map(|(_, b)| ("BUFFET_LIVE_CAPTURE", b)))
        .output()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    assert!(
        sender.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sender.stdout),
        String::from_utf8_lossy(&sender.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    assert_no_rate_line(&err);
    let r = std::fs::read_to_string(&result).unwrap();
    let n: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (sent, back_iface, back_tx) = (n[0], n[1], n[2]);
    assert_eq!(sent, t.frames.len() as u64);

    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let by_id = tenant_rows(&json);
    let want: Vec<(u64, u64, u64)> = t
        .per_tenant
        .iter()
        .map(|&(id, k)| (u64::from(id), k, if nf.passes(id) { k } else { 0 }))
        .collect();
    assert_eq!(
        by_id, want,
        "per tenant (id, packets, passed): workers vs sender\n{stdout}"
    );
    let g = &json["global"];
    assert_eq!(g["input_packets"].as_u64(), Some(sent), "{stdout}");
    assert_eq!(g["unmatched"].as_u64(), Some(t.unmatched), "{stdout}");
    let malformed: u64 = g["malformed"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(malformed, t.malformed, "{stdout}");
    let workers: u64 = json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["packets"].as_u64().unwrap())
        .sum();
    assert_eq!(workers, packets, "the workers ran every tenant packet");
    let port = &json["input"]["ports"][0];
    if extra.windows(2).any(|w| w == ["--dispatch", "xdp"]) {
        // The XDP program saw every frame and redirected only the tenants' to the
        // workers' sockets: the port received those.
        let x = &json["input"]["xdp"];
        assert_eq!(x["packets"].as_u64(), Some(sent), "{x}");
        assert_eq!(x["passed"].as_u64(), Some(packets), "{x}");
        assert_eq!(x["unmatched"].as_u64(), Some(t.unmatched), "{x}");
        assert_eq!(x["malformed"].as_u64(), Some(t.malformed), "{x}");
        assert_eq!(port["rx"].as_u64(), Some(packets), "{port}");
    } else {
        assert_eq!(port["rx"].as_u64(), Some(sent), "{port}");
    }
    assert_eq!(port["rx_dropped"].as_u64(), Some(0), "{port}");
    let ports = json["input"]["ports"].as_array().unwrap();
    match tx {
        None => {
            assert_eq!(ports.len(), 1);
            assert_eq!(port["tx"].as_u64(), Some(passed), "{port}");
            assert_eq!(back_iface, passed, "every passed frame came back out, once");
        }
        Some(_) => {
            assert_eq!(ports.len(), 2);
            assert_eq!(port["tx"].as_u64(), Some(0), "{port}");
            assert_eq!(ports[1]["tx"].as_u64(), Some(passed), "{}", ports[1]);
            assert_eq!(ports[1]["rx"].as_u64(), Some(0), "a transmit-only port");
            assert_eq!(back_iface, 0, "nothing came back on the receiving link");
            assert_eq!(
                back_tx, passed,
                "every passed frame left through --tx-iface, once"
            );
        }
    }
    assert!(stdout.contains("input"), "{stdout}");
}

fn run_output(ns: Option<&str>, args: &[&str]) -> Output {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, BUFFET]);
            c
        }
        None => Command::new(BUFFET),
    };
    c.arg("run").args(args).output().unwrap()
}

/// The software Packet Dispatcher's arguments (none), and `--dispatch xdp`'s where this
/// build has the XDP program (clang at build time); without it, `test`'s xdp case is a
/// privilege skip (a failure in CI).
fn dispatch_variants(test: &str) -> Vec<&'static [&'static str]> {
    let mut v: Vec<&'static [&'static str]> = vec![&[]];
    match buffet_xdp::UNAVAILABLE {
        None => v.push(&["--dispatch", "xdp"]),
        Some(why) => {
            gate::skip_privileged(
                &format!("{test} (--dispatch xdp)"),
                format_args!("xdp engine unavailable: {why}"),
            );
        }
    }
    v
}

#[test]
fn a_missing_or_down_interface_is_refused_before_traffic() {
    if !privileged("live::a_missing_or_down_interface_is_refused_before_traffic") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let t = tenants.to_str().unwrap();
    let stats = dir.path().join("s.json");
    let s = stats.to_str().unwrap();
    for extra in dispatch_variants("live::a_missing_or_down_interface_is_refused_before_traffic") {
        let mut args = vec![
            "--iface",
            "buffet-nope0",
            "--nf",
            "monitor",
            "--tenants",
            t,
            "--stats-json",
            s,
        ];
        args.extend_from_slice(extra);
        let o = run_output(Some(&ns.a), &args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?}");
        assert!(
            e.contains("interface \"buffet-nope0\" does not exist in this network namespace"),
            "{extra:?}: {e}"
        );
        assert!(!stats.exists(), "{extra:?}: nothing ran, nothing written");
    }
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "nothing attached");
    ip(&["-n", &ns.a, "link", "set", &ns.va, "down"]);
    // With the software dispatcher, and with the XDP Packet Dispatcher: refused before
    // anything is attached.
    for extra in dispatch_variants("live::a_missing_or_down_interface_is_refused_before_traffic") {
        let mut args = vec![
            "--iface",
            &ns.va,
            "--nf",
            "monitor",
            "--tenants",
            t,
            "--stats-json",
            s,
        ];
        args.extend_from_slice(extra);
        let o = run_output(Some(&ns.a), &args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?}");
        assert!(
            e.contains(&format!("interface {} is down: bring it up first", ns.va)),
            "{extra:?}: {e}"
        );
        assert!(!stats.exists(), "{extra:?}: nothing ran, nothing written");
    }
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "nothing attached");
}

#[test]
fn without_privileges_run_names_the_capabilities() {
    if !privileged("live::without_privileges_run_names_the_capabilities") {
        return;
    }
    let probe = Command::new("setpriv").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        gate::skip_privileged(
            "live::without_privileges_run_names_the_capabilities",
            "setpriv (util-linux) is missing",
        );
        return;
    }
    // `buffet` as nobody, with no capabilities, in a directory nobody may write to.
    let unprivileged = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "nobody",
                "--regid",
                "nogroup",
                "--clear-groups",
                "--inh-caps=-all",
                BUFFET,
            ])
            .args(args)
            .current_dir("/")
            .output()
            .unwrap()
    };
    // `--dispatch xdp` where this build has the XDP program (clang at build time).
    let dispatches: &[&str] = match buffet_xdp::UNAVAILABLE {
        Some(why) => {
            gate::skip_privileged(
                "live::without_privileges_run_names_the_capabilities (--dispatch xdp)",
                format_args!("xdp engine unavailable: {why}"),
            );
            &["software"]
        }
        None => &["software", "xdp"],
    };
    for &dispatch in dispatches {
        let o = unprivileged(&[
            "run",
            "--iface",
            "lo",
            "--dispatch",
            dispatch,
            "--nf",
            "monitor",
            "--tenants",
            "/nonexistent/t.toml",
        ]);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{dispatch}: {e}");
        assert!(
            e.contains("CAP_NET_RAW") && e.contains("CAP_NET_ADMIN"),
            "{dispatch}: {e}"
        );
        assert!(e.contains("permission denied"), "{dispatch}: {e}");
        if dispatch == "xdp" {
            assert!(e.contains("CAP_BPF"), "{e}");
        }
    }
    // What needs no privilege keeps working without it: demo, replay, trace.
    let root = env!("CARGO_MANIFEST_DIR");
    let pcap = format!("{root}/examples/sample.pcap");
    let tenants = format!("{root}/examples/tenants.toml");
    let vector = format!("{root}/tests/vectors/overload_migration");
    let trace = format!("{vector}/trace.csv");
    let expected = std::fs::read_to_string(format!("{vector}/expected.out")).unwrap();
    // The vector's own flags (its `args` file; `#` lines are comments).
    let flags: Vec<String> = std::fs::read_to_string(format!("{vector}/args"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let trace_args = |engine: &'static str| -> Vec<&str> {
        ["trace", "--input", trace.as_str()]
            .into_iter()
            .chain(flags.iter().map(String::as_str))
            .chain(["--engine", engine])
            .collect()
    };
    let runs: [(&str, Vec<&str>); 4] = [
        ("demo", vec!["demo", "--seconds", "0.2", "--tenants", "4"]),
        (
            "replay",
            vec![
                "replay",
                "--input",
                &pcap,
                "--tenants",
                &tenants,
                "--nf",
                "monitor",
                "--no-pin",
            ],
        ),
        ("trace --engine rust", trace_args("rust")),
        ("trace --engine c", trace_args("c")),
    ];
    for (what, args) in runs {
        let o = unprivileged(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{what} without privileges: {e}{out}");
        if what.starts_with("trace") {
            assert_eq!(out, expected, "{what}: the vector's decisions");
        } else {
            assert!(
                out.contains("tenant"),
                "{what}: its per-tenant table\n{out}"
            );
        }
    }
}

#[test]
fn sigterm_stops_a_run_and_its_report_is_written() {
    if !privileged("live::sigterm_stops_a_run_and_its_report_is_written") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let stats = dir.path().join("s.json");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--iface".as_ref(),
        ns.va.as_ref(),
        "--nf".as_ref(),
        "firewall".as_ref(),
        "--no-pin".as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
        "--stats-json".as_ref(),
        stats.as_os_str(),
    ];
    let (child, stderr) = start_run(&ns.a, &args);
    let start = Instant::now();
    // `ip netns exec` execs buffet: the child's pid is buffet's.
    signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    assert!(out.status.success(), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5), "stopped promptly");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(json["tenants"].as_array().unwrap().len(), 10);
    assert_eq!(json["input"]["iface"].as_str(), Some(ns.va.as_str()));
}

/// One line of the rate `buffet run` prints on stderr once a second when stderr is a
/// terminal (`\r<secs> s  <n> packets  <kpps> kpps`): seconds since the start, packets
/// received so far, and the rate over the last second in kpps.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RateLine {
    secs: f64,
    packets: u64,
    kpps: f64,
}

/// Every complete rate line in `stderr`, in order (lines end at `\r` or `\n`).
fn rate_lines(stderr: &str) -> Vec<RateLine> {
    stderr
        .split(['\r', '\n'])
        .filter_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [secs, "s", packets, "packets", kpps, "kpps"] => Some(RateLine {
                    secs: secs.parse().ok()?,
                    packets: packets.parse().ok()?,
                    kpps: kpps.parse().ok()?,
                }),
                _ => None,
            },
        )
        .collect()
}

/// A run whose stderr is no terminal (a pipe) prints no rate line.
fn assert_no_rate_line(stderr: &str) {
    assert!(
        rate_lines(stderr).is_empty() && !stderr.contains('\r'),
        "stderr is a pipe, not a terminal: no rate line expected\n{stderr:?}"
    );
}

/// The controlling side of a pseudo-terminal whose other side a child has as its
/// stderr: a thread reads what the child writes, and a test waits for what it expects.
struct Terminal {
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
}

impl Terminal {
    /// A new pseudo-terminal: the reader, and the terminal side to give a child.
    fn open() -> (Terminal, std::os::fd::OwnedFd) {
        let (master, slave) = buffet_testkit::tty::open_pty().expect("openpty");
        let (tx, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut master = master;
            let mut buf = [0u8; 4096];
            // Once every copy of the terminal side is closed, read fails (EIO).
            while let Ok(n @ 1..) = master.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        (
            Terminal {
                chunks,
                seen: Vec::new(),
            },
            slave,
        )
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Waits at most `within` until `done` holds for what the terminal shows so far.
    fn wait_for(&mut self, what: &str, within: Duration, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + within;
        while !done(&self.text()) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(c) => self.seen.extend_from_slice(&c),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                    "{what}: not within {within:?}; the terminal shows {:?}",
                    self.text()
                ),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!(
                    "{what}: the terminal closed first; it shows {:?}",
                    self.text()
                ),
            }
        }
    }

    /// Everything the terminal showed, once the child closed it.
    fn finish(mut self) -> String {
        while let Ok(c) = self.chunks.recv_timeout(Duration::from_secs(10)) {
            self.seen.extend_from_slice(&c);
        }
        self.text()
    }
}

/// With stderr on a terminal, `buffet run` prints the packets received so far and the
/// rate once a second, on one line it rewrites (`\r`): with either dispatcher, traffic
/// sent from B in two batches shows up in those lines as it arrives — the count never
/// decreases, it reaches each batch's total, each line's rate is the count's growth over
/// its second (0.0 when nothing arrived) — and the final summary starts on a line of its
/// own. Without a terminal no such line is printed (`assert_no_rate_line` in the other
/// runs).
#[test]
fn the_rate_line_follows_live_traffic_on_a_terminal() {
    if !privileged("live::the_rate_line_follows_live_traffic_on_a_terminal") {
        return;
    }
    let t = traffic();
    let packets: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &t.frames);
    for extra in dispatch_variants("live::the_rate_line_follows_live_traffic_on_a_terminal") {
        let xdp = !extra.is_empty();
        let ns = NsPair::new();
        let stats = dir.path().join("stats.json");
        let _ = std::fs::remove_file(&stats);
        let (mut term, tty) = Terminal::open();
        // `ip netns exec` execs buffet: the child's pid is buffet's. --duration only
        // bounds a run the test fails to stop.
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.a, BUFFET, "run", "--iface", &ns.va])
            .args(["--nf", "monitor", "--workers", "2", "--no-pin"])
            .args(["--duration", "30", "--tenants"])
            .arg(&tenants)
            .arg("--stats-json")
            .arg(&stats)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(tty))
            .spawn()
            .unwrap();
        // The Command above is gone: the child holds the only terminal side, so the
        // reader sees the terminal close when the child ends.
        term.wait_for(
            &format!("{extra:?}: buffet run starts"),
            Duration::from_secs(20),
            |s| s.contains("running on"),
        );
        // The frames the run receives per batch: the software dispatcher's port reads
        // every frame; the XDP program redirects only the tenants' to the workers'.
        let per_batch = if xdp { packets } else { t.frames.len() as u64 };
        for batch in 1..=2u64 {
            let (sent, back) = send_from_b(&ns, &pcap, packets, &dir.path().join("sent.txt"));
            assert_eq!(sent, t.frames.len() as u64, "{extra:?}");
            assert_eq!(back, packets, "{extra:?}: every tenant frame came back");
            term.wait_for(
                &format!(
                    "{extra:?}: a rate line showing batch {batch}'s {} packets",
                    batch * per_batch
                ),
                Duration::from_secs(5),
                |s| rate_lines(s).last().map(|l| l.packets) == Some(batch * per_batch),
            );
        }
        signal(&child, "TERM");
        let out = child.wait_with_output().unwrap();
        let shown = term.finish();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{extra:?}: buffet run: {shown}{stdout}"
        );
        let lines = rate_lines(&shown);
        let total = 2 * per_batch;
        assert!(
            lines.len() >= 2,
            "{extra:?}: at least two rate lines\n{shown:?}"
        );
        let last = lines.last().unwrap();
        assert!(last.packets > 0, "{extra:?}: {lines:?}");
        assert_eq!(last.packets, total, "{extra:?}: {lines:?}");
        // Each line against the one before (the first against the start: 0 s, 0
        // packets).
        let start = RateLine {
            secs: 0.0,
            packets: 0,
            kpps: 0.0,
        };
        for (before, l) in std::iter::once(&start).chain(&lines).zip(&lines) {
            assert!(
                l.packets >= before.packets,
                "{extra:?}: the count never decreases: {before:?} then {l:?}\n{lines:?}"
            );
            assert!(
                l.secs > before.secs,
                "{extra:?}: time goes on: {before:?} then {l:?}\n{lines:?}"
            );
            // The rate over the second since the line before: the printed seconds are
            // rounded to 0.1 s and the rate to 0.1 kpps.
            let want = (l.packets - before.packets) as f64 / (l.secs - before.secs) / 1e3;
            assert!(
                (l.kpps - want).abs() <= 0.05 + 0.15 * want,
                "{extra:?}: {l:?} after {before:?}: about {want:.3} kpps expected\n{lines:?}"
            );
        }
        // The watcher ends its line before the summary.
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with(&format!("received {total} packets on {}", ns.va))),
            "{extra:?}: the summary on a line of its own\n{shown:?}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert_eq!(json["input"]["packets"].as_u64(), Some(total), "{extra:?}");
    }
}

/// The XDP program attached to `iface` in namespace `ns`, as `ip link` shows it
/// (`prog/xdp id N` and the mode), or `None`.
fn xdp_attached(ns: &str, iface: &str) -> Option<String> {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", iface])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.contains("prog/xdp").then_some(s)
}

#[test]
fn live_traffic_counts_agree_over_af_xdp() {
    if !privileged("live::live_traffic_counts_agree_over_af_xdp") {
        return;
    }
    let ns = NsPair::new();
    run_and_check_with(&ns, None, Nf::Monitor, &["--port", "af-xdp"]);
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "detached at the end");
}

#[test]
fn af_xdp_firewall_over_a_generic_mode_program() {
    if !privileged("live::af_xdp_firewall_over_a_generic_mode_program") {
        return;
    }
    let ns = NsPair::new();
    run_and_check_with(
        &ns,
        None,
        Nf::FirewallDenyingEvenTenants,
        &["--port", "af-xdp", "--xdp-mode", "generic"],
    );
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "detached at the end");
}

/// A run killed with SIGKILL leaves its program attached; the next run replaces it and
/// detaches on SIGTERM. A second run while the first is alive is refused and changes
/// nothing.
#[test]
fn af_xdp_leftover_is_replaced_and_sigterm_detaches() {
    if !privileged("live::af_xdp_leftover_is_replaced_and_sigterm_detaches") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let args: Vec<&std::ffi::OsStr> = vec![
        "--iface".as_ref(),
        ns.va.as_ref(),
        "--port".as_ref(),
        "af-xdp".as_ref(),
        "--nf".as_ref(),
        "monitor".as_ref(),
        "--no-pin".as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
    ];
    let (mut first, _err) = start_run(&ns.a, &args);
    let attached = xdp_attached(&ns.a, &ns.va).expect("attached while running");
    // Another run on the same interface while the first lives: refused.
    let o = run_output(
        Some(&ns.a),
        &[
            "--iface",
            &ns.va,
            "--port",
            "af-xdp",
            "--nf",
            "monitor",
            "--tenants",
            tenants.to_str().unwrap(),
            "--duration",
            "1",
        ],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("is attached already by the Buffet run of pid")
            && e.contains("still running; stop that run first"),
        "a live run's program: stop the run first: {e}"
    );
    assert_eq!(
        xdp_attached(&ns.a, &ns.va).as_deref(),
        Some(attached.as_str()),
        "the live run's program stays"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(
        xdp_attached(&ns.a, &ns.va).is_some(),
        "SIGKILL leaves the program attached"
    );
    let (second, err) = start_run(&ns.a, &args);
    signal(&second, "TERM");
    let out = second.wait_with_output().unwrap();
    let err = err.join().unwrap();
    assert!(out.status.success(), "{err}");
    assert!(err.contains("(replaced program"), "{err}");
    assert_eq!(
        xdp_attached(&ns.a, &ns.va),
        None,
        "SIGTERM detached the program"
    );
}

#[test]
fn af_xdp_errors_come_before_traffic_and_leave_nothing_attached() {
    if !privileged("live::af_xdp_errors_come_before_traffic_and_leave_nothing_attached") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let t = tenants.to_str().unwrap();
    let run = |iface: &str, more: &[&str]| {
        let mut args = vec![
            "--iface",
            iface,
            "--port",
            "af-xdp",
            "--nf",
            "monitor",
            "--tenants",
            t,
        ];
        args.extend_from_slice(more);
        let o = run_output(Some(&ns.a), &args);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = run(&ns.va, &["--queue", "3"]);
    assert!(
        e.contains(&format!(
            "af_xdp on {}: queue 3 does not exist: the interface has 1 receive queue(s)",
            ns.va
        )),
        "{e}"
    );
    let e = run("buffet-nope0", &[]);
    assert!(
        e.contains("interface \"buffet-nope0\" does not exist in this network namespace"),
        "{e}"
    );
    ip(&["-n", &ns.a, "link", "set", &ns.va, "down"]);
    let e = run(&ns.va, &[]);
    assert!(e.contains(&format!("interface {} is down", ns.va)), "{e}");
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "nothing left attached");
    // Without privileges: the capabilities are named.
    let probe = Command::new("setpriv").arg("--version").output();
    if probe.is_ok_and(|o| o.status.success()) {
        let o = Command::new("setpriv")
            .args([
                "--reuid",
                "nobody",
                "--regid",
                "nogroup",
                "--clear-groups",
                "--inh-caps=-all",
                BUFFET,
            ])
            .args([
                "run",
                "--iface",
                "lo",
                "--port",
                "af-xdp",
                "--nf",
                "monitor",
                "--tenants",
                t,
            ])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(
            e.contains("CAP_NET_ADMIN") && e.contains("CAP_NET_RAW") && e.contains("CAP_BPF"),
            "{e}"
        );
    }
}

/// Runs in namespace A (see `af_xdp_socket_in_a_callers_map`): an AF_XDP port that
/// attaches no program, inserted into a separately attached program's XSKMAP, as a
/// caller with its own XDP program does. Echoes every marked frame back unchanged (a
/// UMEM frame on the transmit ring, no copy), then sends 5 marked heap frames (copied
/// into the UMEM), and writes `marked_received tx` to `BUFFET_XSK_OUT`.
#[test]
#[ignore = "helper: run by af_xdp_socket_in_a_callers_map inside a network namespace"]
fn afxdp_callers_map_helper() {
    use buffet::io::afxdp::{AfXdpConfig, AfXdpPort, RedirectProgram, XdpMode};
    let Ok(iface) = std::env::var("BUFFET_XSK_IFACE") else {
        return;
    };
    let expect: u64 = std::env::var("BUFFET_XSK_EXPECT").unwrap().parse().unwrap();
    let out = std::env::var("BUFFET_XSK_OUT").unwrap();
    let mut port = AfXdpPort::open(AfXdpConfig {
        redirect: None,
        ..AfXdpConfig::new(&iface, 0)
    })
    .unwrap();
    assert!(port.program().is_none());
    let program = RedirectProgram::attach(&iface, XdpMode::Generic, 1).unwrap();
    assert!(program.is_generic());
    program.insert(0, port.socket_fd()).unwrap();
    println!("XSK-READY");
    let mut pool = HeapPool::new(64);
    let mut rx = Vec::new();
    let mut echo = Vec::new();
    let mut marked = 0u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while marked < expect && Instant::now() < deadline {
        port.rx_burst(&mut pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            assert!(b.owner().is_some(), "received frames are UMEM frames");
            if b.data().windows(MARK.len()).any(|w| w == MARK) {
                marked += 1;
                echo.push(b);
            } else {
                port.recycle(b);
            }
        }
        port.tx_burst(&mut echo, &mut pool).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut heap: Vec<_> = (0..5u32)
        .map(|i| {
            let mut b = pool.take().unwrap();
            assert!(b.fill(&udp4(
                [172, 16, 0, 1],
                [10, 1, 0, 1],
                40000,
                80,
                900_000 + i
            )));
            b
        })
        .collect();
    port.tx_burst(&mut heap, &mut pool).unwrap();
    assert_eq!(
        pool.available(),
        64,
        "heap frames were copied and given back"
    );
    // Let the completions come back.
    for _ in 0..50 {
        port.rx_burst(&mut pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            port.recycle(b);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = port.stats();
    assert_eq!(s.tx_dropped, 0, "{s:?}");
    std::fs::write(out, format!("{marked} {}\n", s.tx)).unwrap();
}

#[test]
fn af_xdp_socket_in_a_callers_map() {
    if !privileged("live::af_xdp_socket_in_a_callers_map") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let frames: Vec<Vec<u8>> = (0..50u32)
        .map(|i| udp4([172, 16, 0, 1], [10, 1, 0, (i % 200) as u8], 40000, 80, i))
        .collect();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &frames);
    let (helper_out, sender_out) = (dir.path().join("xsk.txt"), dir.path().join("sender.txt"));
    let mut helper = ns_helper(&ns.a, "afxdp_callers_map_helper")
        .env("BUFFET_XSK_IFACE", &ns.va)
        .env("BUFFET_XSK_EXPECT", "50")
        .env("BUFFET_XSK_OUT", &helper_out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(helper.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("XSK-READY") {
        if lines.read_line(&mut seen).unwrap() == 0 {
            let out = helper.wait_with_output().unwrap();
            panic!("{seen}{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let sender = ns_helper(&ns.b, "sender_helper")
        .env("BUFFET_LIVE_SEND", &pcap)
        .env("BUFFET_LIVE_IFACE", &ns.vb)
        .env("BUFFET_LIVE_EXPECT", "55")
        .env("BUFFET_LIVE_OUT", &sender_out)
        .output()
        .unwrap();
    let _ = lines.read_to_string(&mut seen);
    let out = helper.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{seen}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        sender.status.success(),
        "{}",
        String::from_utf8_lossy(&sender.stderr)
    );
    let read = |p: &Path| -> Vec<u64> {
        std::fs::read_to_string(p)
            .unwrap()
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect()
    };
    assert_eq!(read(&helper_out), vec![50, 55], "marked received, sent");
    let s = read(&sender_out);
    assert_eq!(
        (s[0], s[1]),
        (50, 55),
        "sent, came back: 50 echoed + 5 copied"
    );
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "detached when dropped");
}

/// Runs in namespace A (see `af_xdp_socket_counters_account_for_every_frame`): an AF_XDP
/// port of 128 frames and rings of 64 whose socket (`BUFFET_XSK_SOCKET=port`) or shared
/// receiver (`receiver`) gets the queue's frames from a redirect program and is never
/// read. Once stdin says the sender is done, it detaches the program and writes
/// `queued rx_dropped rx_ring_full rx_invalid_descs other_socket_lost` to
/// `BUFFET_XSK_OUT`: the frames waiting in the socket's receive ring and its kernel
/// counters, and the drops of the port's other socket.
#[test]
#[ignore = "helper: run by af_xdp_socket_counters_account_for_every_frame inside a network namespace"]
fn xsk_overfill_helper() {
    use buffet::io::afxdp::{AfXdpConfig, AfXdpPort, RedirectProgram, XdpMode};
    let Ok(iface) = std::env::var("BUFFET_XSK_IFACE") else {
        return;
    };
    let receiver = std::env::var("BUFFET_XSK_SOCKET").unwrap() == "receiver";
    let out = std::env::var("BUFFET_XSK_OUT").unwrap();
    let mut port = AfXdpPort::open(AfXdpConfig {
        redirect: None,
        frames: 128,
        ring_size: 64,
        ..AfXdpConfig::new(&iface, 0)
    })
    .unwrap();
    let mut rx = receiver.then(|| port.shared_receiver().unwrap());
    let reader = port.statistics_reader();
    let program = RedirectProgram::attach(&iface, XdpMode::Generic, 1).unwrap();
    match &rx {
        Some(r) => program.insert(0, r.socket_fd()),
        None => program.insert(0, port.socket_fd()),
    }
    .unwrap();
    println!("XSK-READY");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    drop(program);
    let stats = reader.read().unwrap();
    let want = if receiver { Some(0) } else { None };
    let own = stats.iter().find(|k| k.receiver == want).unwrap().stats;
    let other: u64 = stats
        .iter()
        .filter(|k| k.receiver != want)
        .map(|k| k.stats.rx_lost())
        .sum();
    assert_eq!(stats.len(), if receiver { 2 } else { 1 }, "{stats:?}");
    // The frames waiting in the receive ring.
    let mut pool = HeapPool::new(64);
    let mut bufs = Vec::new();
    let queued = match &mut rx {
        Some(r) => {
            let mut rejected = Vec::new();
            r.receive(&mut bufs, &mut rejected, 1024);
            bufs.append(&mut rejected);
            bufs.len()
        }
        None => {
            port.rx_burst(&mut pool, &mut bufs, 1024).unwrap();
            bufs.len()
        }
    };
    for b in bufs.drain(..) {
        port.recycle(b);
    }
    if !receiver {
        let p = port.stats();
        assert_eq!(p.rx_dropped, own.rx_lost(), "the port's rx_dropped: {p:?}");
    }
    std::fs::write(
        out,
        format!(
            "{queued} {} {} {} {other}\n",
            own.rx_dropped,
            own.rx_ring_full
                .expect("a kernel from 5.9 on counts a full ring apart"),
            own.rx_invalid_descs
        ),
    )
    .unwrap();
}

#[test]
fn af_xdp_socket_counters_account_for_every_frame() {
    if !privileged("live::af_xdp_socket_counters_account_for_every_frame") {
        return;
    }
    // 300 frames at a socket with a 64-entry receive ring and 64 frames in its fill
    // ring, read by nobody: at most 64 wait in the ring, the kernel counts every other
    // one as dropped, and the two add up to what was sent — for the port's own socket
    // and for a shared receiver (an XDP Packet Dispatcher worker's kind of socket).
    for socket in ["port", "receiver"] {
        let ns = NsPair::new();
        let dir = tempfile::tempdir().unwrap();
        let frames: Vec<Vec<u8>> = (0..300u32)
            .map(|i| udp4([172, 16, 0, 1], [10, 1, 0, (i % 200) as u8], 40000, 80, i))
            .collect();
        let pcap = dir.path().join("send.pcap");
        write_pcap(&pcap, &frames);
        let helper_out = dir.path().join("xsk.txt");
        let mut helper = ns_helper(&ns.a, "xsk_overfill_helper")
            .env("BUFFET_XSK_IFACE", &ns.va)
            .env("BUFFET_XSK_SOCKET", socket)
            .env("BUFFET_XSK_OUT", &helper_out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(helper.stdout.take().unwrap());
        let mut seen = String::new();
        while !seen.contains("XSK-READY") {
            if lines.read_line(&mut seen).unwrap() == 0 {
                let out = helper.wait_with_output().unwrap();
                panic!("{seen}{}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let (sent, _) = send_from_b(&ns, &pcap, 0, &dir.path().join("sender.txt"));
        assert_eq!(sent, 300);
        {
            use std::io::Write;
            let mut stdin = helper.stdin.take().unwrap();
            stdin.write_all(b"sent\n").unwrap();
        }
        let _ = lines.read_to_string(&mut seen);
        let out = helper.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{socket}: {seen}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n: Vec<u64> = std::fs::read_to_string(&helper_out)
            .unwrap()
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let (queued, dropped, ring_full, invalid, other) = (n[0], n[1], n[2], n[3], n[4]);
        assert!(queued <= 64, "{socket}: {n:?}");
        assert!(
            ring_full + dropped > 0,
            "{socket}: the kernel counted drops: {n:?}"
        );
        assert_eq!(
            queued + dropped + ring_full + invalid,
            sent,
            "{socket}: frames in the ring + the kernel's drops = frames sent (queued, \
             rx_dropped, rx_ring_full, rx_invalid_descs, other socket's drops = {n:?})"
        );
        assert_eq!(other, 0, "{socket}: the other socket got nothing");
    }
}

/// Runs the sender in namespace B (see [`sender_helper`]): sends `pcap` out of `ns.vb`,
/// waits for `expect` marked frames back; returns (sent, back).
fn send_from_b(ns: &NsPair, pcap: &Path, expect: u64, out: &Path) -> (u64, u64) {
    let sender = ns_helper(&ns.b, "sender_helper")
        .env("BUFFET_LIVE_SEND", pcap)
        .env("BUFFET_LIVE_IFACE", &ns.vb)
        .env("BUFFET_LIVE_EXPECT", expect.to_string())
        .env("BUFFET_LIVE_OUT", out)
        .env("BUFFET_LIVE_DSCP_OUT", out.with_extension("dscp"))
        .output()
        .unwrap();
    assert!(
        sender.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sender.stdout),
        String::from_utf8_lossy(&sender.stderr)
    );
    let r = std::fs::read_to_string(out).unwrap();
    let n: Vec<u64> = r.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (n[0], n[1])
}

/// What the last [`send_from_b`] writing `out` saw of the IPv4 frames back: frames by
/// DSCP, and frames with a wrong header checksum.
fn dscp_back(out: &Path) -> (std::collections::BTreeMap<u64, u64>, u64) {
    let s = std::fs::read_to_string(out.with_extension("dscp")).unwrap();
    let mut by = std::collections::BTreeMap::new();
    let mut bad = u64::MAX;
    for line in s.lines() {
        let (k, v) = line.split_once(' ').unwrap();
        let v: u64 = v.parse().unwrap();
        match k {
            "bad_checksum" => bad = v,
            d => {
                by.insert(d.parse().unwrap(), v);
            }
        }
    }
    (by, bad)
}

/// Each tenant's packets in the XDP Tenant Table (`slot_packets` of the stats JSON's
/// `input.xdp.tenants`, a timeslot longer than the run) are what the sender sent it.
fn assert_xdp_table_agrees(x: &serde_json::Value, t: &Traffic, ctx: &str) {
    let in_maps: Vec<(u64, u64)> = x["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_u64().unwrap(),
                r["slot_packets"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(u64, u64)> = t
        .per_tenant
        .iter()
        .map(|&(id, k)| (u64::from(id), k))
        .collect();
    assert_eq!(
        in_maps, want,
        "{ctx}: per tenant, the XDP Tenant Table vs sender"
    );
}

/// tshark capturing what arrives on B's veth end while a test sends, into a pcapng file:
/// the wire as an independent tool sees it, next to what the sender's own socket saw.
struct WireCapture {
    child: std::process::Child,
    file: PathBuf,
}

impl WireCapture {
    /// Starts tshark in `ns` on `iface` and waits until it captures. It sees both
    /// directions (libpcap's `inbound` filter drops the frames that come back from an
    /// AF_XDP socket on the veth peer here, and the capture records no direction), so a
    /// test accounts for the frames it sent itself.
    fn start(ns: &str, iface: &str, file: PathBuf) -> WireCapture {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "tshark", "-q", "-i", iface])
            .args(["-w"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tshark starts");
        // tshark says "Capturing on 'IFACE'" once the capture is open.
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            line.clear();
            let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap_or(0);
            assert!(n > 0, "tshark ended before capturing");
            if line.contains("Capturing on") {
                break;
            }
            assert!(Instant::now() < deadline, "tshark did not start capturing");
        }
        // dumpcap says so a moment before its socket receives.
        std::thread::sleep(Duration::from_secs(2));
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        WireCapture { child, file }
    }

    /// Stops the capture and reads it back with tshark: marked IPv4 frames (both
    /// directions) by DSCP, and how many of them had a bad header checksum (tshark's own
    /// check).
    fn finish(mut self) -> (std::collections::BTreeMap<u64, u64>, u64) {
        // Give the last frames time to be written, then stop tshark as Ctrl-C would.
        std::thread::sleep(Duration::from_millis(500));
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let out = Command::new("tshark")
            .arg("-r")
            .arg(&self.file)
            .args(["-o", "ip.check_checksum:TRUE", "-T", "fields"])
            .args(["-e", "ip.dsfield.dscp", "-e", "ip.checksum.status"])
            .args(["-Y", "ip && frame contains \"BUFFET-LIVE\""])
            .output()
            .expect("tshark reads the capture");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut by = std::collections::BTreeMap::new();
        let mut bad = 0;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let (d, status) = line.split_once('\t').unwrap_or((line, ""));
            *by.entry(d.trim().parse::<u64>().unwrap()).or_insert(0) += 1;
            // 1: good; 0: bad; 2: not verified.
            if status.trim() != "1" {
                bad += 1;
            }
        }
        (by, bad)
    }
}

/// `buffet run --dispatch xdp --xdp-mode generic` on A with `tenants` and `extra`
/// arguments, `frames` sent from B; returns the stats JSON, stdout and stderr, and what
/// the sender saw `(sent, back)`.
fn run_xdp(
    ns: &NsPair,
    tenants: &str,
    frames: &[Vec<u8>],
    expect_back: u64,
    extra: &[&str],
) -> (serde_json::Value, String, (u64, u64)) {
    run_live(ns, tenants, frames, expect_back, extra, true)
}

/// [`run_xdp`], or with `xdp` false the same run with the software Packet Dispatcher
/// (AF_PACKET): no program attached, no DSCP tags.
fn run_live(
    ns: &NsPair,
    tenants: &str,
    frames: &[Vec<u8>],
    expect_back: u64,
    extra: &[&str],
    xdp: bool,
) -> (serde_json::Value, String, (u64, u64)) {
    let dir = tempfile::tempdir().unwrap();
    let tenants_file = dir.path().join("tenants.toml");
    std::fs::write(&tenants_file, tenants).unwrap();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, frames);
    let stats = dir.path().join("stats.json");
    let dispatch: &[&str] = if xdp {
        &["--dispatch", "xdp", "--xdp-mode", "generic"]
    } else {
        &[]
    };
    let mut args: Vec<std::ffi::OsString> = ["--iface", &ns.va, "--no-pin", "--duration", "6"]
        .iter()
        .chain(dispatch)
        .map(Into::into)
        .collect();
    if !["--nf", "--nf-lib", "--nf-ebpf"]
        .iter()
        .any(|a| extra.contains(a))
    {
        args.extend(["--nf".into(), "monitor".into()]);
    }
    if !extra.contains(&"--workers") {
        args.extend(["--workers".into(), "2".into()]);
    }
    args.extend(["--tenants".into(), tenants_file.into_os_string()]);
    args.extend(["--stats-json".into(), stats.clone().into_os_string()]);
    args.extend(extra.iter().map(Into::into));
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (child, stderr) = start_run(&ns.a, &args);
    assert_eq!(
        xdp_attached(&ns.a, &ns.va).is_some_and(|s| s.contains("xdpgeneric")),
        xdp,
        "the XDP Packet Dispatcher is attached in generic mode while running, and only then"
    );
    let wire = (xdp && tshark_available())
        .then(|| WireCapture::start(&ns.b, &ns.vb, dir.path().join("wire.pcapng")));
    let sender_out = dir.path().join("sender.txt");
    let sent = send_from_b(ns, &pcap, expect_back, &sender_out);
    let (by_dscp, bad_checksum) = dscp_back(&sender_out);
    let on_wire = wire.map(WireCapture::finish);
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    assert_no_rate_line(&err);
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "detached at the end");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    // What the sender saw of the tags, for the caller.
    json["sender_dscp"] = serde_json::json!({
        "bad_checksum": bad_checksum,
        "by_dscp": by_dscp.iter().map(|(d, n)| [*d, *n]).collect::<Vec<_>>(),
    });
    if let Some((by, bad)) = on_wire {
        json["tshark_dscp"] = serde_json::json!({
            "bad_checksum": bad,
            "by_dscp": by.iter().map(|(d, n)| [*d, *n]).collect::<Vec<_>>(),
        });
    }
    (json, format!("{err}{stdout}"), sent)
}

/// `buffet run --dispatch xdp`: tenant 1's C NF (examples/c-nf/malicious.c, `attack =
/// "sleep"`) never returns from its sixth packet: asleep in the kernel, it stalls its
/// worker (at `trusted-native`, where no seccomp filter traps its raw system call). The
/// worker is found stuck, tenant 1 quarantined, and the run moves the worker's tenants'
/// rows in the XDP program's Tenant Table to the live worker: the victims' frames sent
/// after that all
/// reach a worker and come back out, those of the victim that shared the stuck worker
/// included (before, the program kept sending them to the stuck worker's socket, where
/// nobody reads them any more).
#[test]
fn xdp_dispatch_moves_a_stuck_workers_tenants_to_the_live_worker() {
    let test = "live::xdp_dispatch_moves_a_stuck_workers_tenants_to_the_live_worker";
    if !privileged(test) {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let nf = common::cnf::build_nf(dir.path(), "malicious");
    let mut tenants = String::new();
    for id in 1..=4 {
        let attack = if id == 1 { "sleep" } else { "none" };
        tenants.push_str(&format!(
            "[[tenant]]\nid = {id}\nrules = [ {{ dst_ip = \"10.{id}.0.0/16\" }} ]\n\
             [tenant.policy]\nattack = \"{attack}\"\nattack_after = 5\n\n"
        ));
    }
    let tenants_file = dir.path().join("tenants.toml");
    std::fs::write(&tenants_file, tenants).unwrap();
    let other = [172, 16, 0, 1];
    let mut seq = 0;
    let mut frames_to = |ids: &[u8], each: usize| -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        for _ in 0..each {
            for &id in ids {
                seq += 1;
                v.push(udp4(other, [10, id, 0, 1], 40000, 80, seq));
            }
        }
        v
    };
    let phases = [
        ("before", frames_to(&[2, 3, 4], 10), 30),
        ("stall", frames_to(&[1], 10), 0),
        ("after", frames_to(&[2, 3, 4], 40), 120),
    ];
    let stats = dir.path().join("stats.json");
    let args: Vec<std::ffi::OsString> = [
        "--iface",
        &ns.va,
        "--no-pin",
        "--duration",
        "8",
        "--dispatch",
        "xdp",
        "--xdp-mode",
        "generic",
        "--workers",
        "2",
        // Timeslots of 2^28 ns: a worker is stuck after MIN_STALL (0.5 s).
        "--shift",
        "28",
        "--isolation",
        "trusted-native",
        "--nf-lib",
    ]
    .iter()
    .map(Into::into)
    .chain([nf.into_os_string()])
    .chain(["--tenants".into(), tenants_file.into_os_string()])
    .chain(["--stats-json".into(), stats.clone().into_os_string()])
    .collect();
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (child, stderr) = start_run(&ns.a, &args);
    let mut back = Vec::new();
    for (name, frames, expect) in &phases {
        let pcap = dir.path().join(format!("{name}.pcap"));
        write_pcap(&pcap, frames);
        let (sent, n) = send_from_b(&ns, &pcap, *expect, &dir.path().join(format!("{name}.txt")));
        assert_eq!(sent, frames.len() as u64, "{name}");
        back.push(n);
        if *name == "stall" {
            // Found stuck after MIN_STALL, checked about every 100 ms.
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{err}{stdout}");
    assert!(out.status.success(), "buffet run: {all}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let stuck: Vec<&serde_json::Value> = json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "worker_stuck")
        .collect();
    assert_eq!(stuck.len(), 1, "one worker found stuck\n{all}");
    assert_eq!(stuck[0]["tenants"], serde_json::json!([1]), "{all}");
    let worker = stuck[0]["worker"].as_u64().unwrap();
    // Tenant 1 and one victim shared it; both rows moved.
    assert_eq!(stuck[0]["reassigned"].as_u64(), Some(2), "{all}");
    // Tenant 1's frames before the sleeping one may be held with it in the stuck burst.
    assert!(back[1] <= 5, "{back:?}\n{all}");
    assert_eq!(
        [back[0], back[2]],
        [30, 120],
        "the victims' frames came back out\n{all}"
    );
    let rows = tenant_rows(&json);
    for id in 2..=4 {
        assert!(
            rows.contains(&(id, 50, 50)),
            "victim {id} lost nothing: {rows:?}\n{all}"
        );
    }
    assert!(
        err.contains(&format!(
            "worker {worker} lost: its row in the XDP program's Worker Table closed, 2 \
             tenant(s) moved to live workers"
        )),
        "{all}"
    );
    let t1 = &json["tenants"][0];
    assert_eq!(t1["id"], 1);
    assert_eq!(t1["quarantined"], true, "{all}");
}

#[test]
fn xdp_dispatch_counts_agree_at_sender_maps_and_workers() {
    if !privileged("live::xdp_dispatch_counts_agree_at_sender_maps_and_workers") {
        return;
    }
    let ns = NsPair::new();
    let t = traffic();
    let packets: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
    // One timeslot for the whole run (2^40 ns ≈ 18 min): the Tenant Table's pkt_nb is
    // then each tenant's total.
    let (json, out, (sent, back)) = run_xdp(&ns, TENANTS, &t.frames, packets, &["--shift", "40"]);
    assert_eq!(sent, t.frames.len() as u64);
    // Workers vs sender.
    let by_id = tenant_rows(&json);
    let want: Vec<(u64, u64, u64)> = t
        .per_tenant
        .iter()
        .map(|&(id, k)| (u64::from(id), k, k))
        .collect();
    assert_eq!(
        by_id, want,
        "per tenant (id, packets, passed): workers vs sender\n{out}"
    );
    let workers: u64 = json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["packets"].as_u64().unwrap())
        .sum();
    assert_eq!(
        workers, packets,
        "the workers ran every tenant packet\n{out}"
    );
    // The XDP maps vs sender.
    let x = &json["input"]["xdp"];
    assert_eq!(json["input"]["dispatch"].as_str(), Some("xdp"));
    assert_eq!(x["packets"].as_u64(), Some(sent), "{x}");
    assert_eq!(x["passed"].as_u64(), Some(packets), "{x}");
    assert_eq!(x["unmatched"].as_u64(), Some(t.unmatched), "{x}");
    assert_eq!(x["malformed"].as_u64(), Some(t.malformed), "{x}");
    assert_eq!(x["policed"].as_u64(), Some(0), "{x}");
    assert_xdp_table_agrees(x, &t, "");
    // Each tenant ran on the worker the XDP Tenant Table names (no migration here).
    for (w, r) in json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .zip(x["tenants"].as_array().unwrap())
    {
        assert_eq!(w["worker"], r["worker"], "{w} {r}");
    }
    assert!(json["events"].as_array().unwrap().is_empty(), "{out}");
    // The sockets: every redirected frame received, none dropped; every pass sent back.
    let port = &json["input"]["ports"][0];
    assert_eq!(port["rx"].as_u64(), Some(packets), "{port}");
    assert_eq!(port["rx_dropped"].as_u64(), Some(0), "{port}");
    assert_eq!(port["tx"].as_u64(), Some(packets), "{port}");
    assert_eq!(back, packets, "every passed frame came back out, once");
    assert_eq!(json["input"]["packets"].as_u64(), Some(packets));
    // The kernel's counters of every AF_XDP socket, the port's and each worker's: none
    // dropped a frame.
    let sockets = port["sockets"].as_array().unwrap();
    let owners: Vec<&str> = sockets
        .iter()
        .map(|k| k["socket"].as_str().unwrap())
        .collect();
    assert_eq!(owners, ["port", "worker 0", "worker 1"], "{port}");
    for k in sockets {
        assert_eq!(k["queue"].as_u64(), Some(0), "{k}");
        assert_eq!(k["rx_dropped"].as_u64(), Some(0), "{k}");
        assert_eq!(k["rx_ring_full"].as_u64(), Some(0), "{k}");
        assert_eq!(k["rx_invalid_descs"].as_u64(), Some(0), "{k}");
    }
    assert!(
        out.contains("  socket worker 1 (queue 0): rx_dropped 0 rx_ring_full 0"),
        "{out}"
    );
    // The tenant travels in the frame's metadata, never in the frame: every IPv4 frame
    // comes back with the DSCP it was sent with (0), its header checksum still valid.
    let mut back_v4 = 0u64;
    for r in x["tenants"].as_array().unwrap() {
        let id = r["id"].as_u64().unwrap();
        if id == 8 {
            continue; // the IPv6 tenant
        }
        back_v4 += t
            .per_tenant
            .iter()
            .find(|(i, _)| u64::from(*i) == id)
            .unwrap()
            .1;
    }
    let want = vec![[0u64, back_v4]];
    let got: Vec<[u64; 2]> =
        serde_json::from_value(json["sender_dscp"]["by_dscp"].clone()).unwrap();
    assert_eq!(got, want, "IPv4 frames back by DSCP: as sent");
    assert_eq!(json["sender_dscp"]["bad_checksum"].as_u64(), Some(0));
    // The same on the wire, as tshark decodes it: the capture holds the marked IPv4
    // frames B sent (DSCP 0, unmatched and malformed ones included) and the frames that
    // came back, unchanged.
    if tshark_required("live::xdp_dispatch_counts_agree_at_sender_maps_and_workers") {
        let sent_v4: Vec<&Vec<u8>> = t
            .frames
            .iter()
            .filter(|f| f.len() >= 34 && f[12..14] == [0x08, 0x00])
            .filter(|f| f.windows(MARK.len()).any(|w| w == MARK))
            .collect();
        let ipv4_sent = sent_v4.len() as u64;
        // The malformed frames with a rewritten length keep their old checksum.
        let sent_bad = sent_v4
            .iter()
            .filter(|f| {
                let sum: u32 = f[14..34]
                    .chunks(2)
                    .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                    .sum();
                let folded = (sum & 0xffff) + (sum >> 16);
                (folded & 0xffff) + (folded >> 16) != 0xffff
            })
            .count() as u64;
        let mut on_wire: std::collections::BTreeMap<u64, u64> =
            want.iter().map(|[d, n]| (*d, *n)).collect();
        *on_wire.entry(0).or_insert(0) += ipv4_sent;
        let on_wire: Vec<[u64; 2]> = on_wire.into_iter().map(|(d, n)| [d, n]).collect();
        let wire: Vec<[u64; 2]> =
            serde_json::from_value(json["tshark_dscp"]["by_dscp"].clone()).unwrap();
        assert_eq!(
            wire, on_wire,
            "tshark: marked IPv4 frames on the wire by DSCP"
        );
        assert!(sent_bad > 0, "the malformed frames are on the wire too");
        assert_eq!(
            json["tshark_dscp"]["bad_checksum"].as_u64(),
            Some(sent_bad),
            "tshark: every frame that came back has a valid header checksum"
        );
    }
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether the tshark part of a test can run: true when tshark is installed; otherwise a
/// privilege-class skip (a failure in CI, which installs it).
fn tshark_required(test: &str) -> bool {
    gate::require_tool(
        test,
        "tshark",
        Command::new("tshark").arg("--version"),
        "install tshark",
    )
}

#[test]
fn xdp_dispatch_migrates_a_tenant_when_max_nb_is_exceeded() {
    if !privileged("live::xdp_dispatch_migrates_a_tenant_when_max_nb_is_exceeded") {
        return;
    }
    migrates_a_tenant_when_max_nb_is_exceeded(true);
}

#[test]
fn software_dispatch_migrates_a_tenant_when_max_nb_is_exceeded() {
    if !privileged("live::software_dispatch_migrates_a_tenant_when_max_nb_is_exceeded") {
        return;
    }
    migrates_a_tenant_when_max_nb_is_exceeded(false);
}

/// Migration and overload reports on live traffic, with the XDP Packet Dispatcher (`xdp`;
/// its ring buffer's reports) or the software one: the events of the run show both.
fn migrates_a_tenant_when_max_nb_is_exceeded(xdp: bool) {
    // Twenty tenants spread over two workers (odd ids on worker 0); only worker 0's ten
    // send, so worker 0 exceeds its MAX_NB while each tenant stays below it, and the
    // scheduler moves tenants to the idle worker.
    let tenants: String = (1..=20)
        .map(|i| format!("[[tenant]]\nid = {i}\nname = \"t{i}\"\nrules = [ {{ dst_ip = \"10.{i}.0.0/16\" }} ]\n\n"))
        .collect();
    let mut frames = Vec::new();
    let mut per = [0u64; 21];
    let ns = NsPair::new();
    for seq in 0..12_000u32 {
        let id = (seq % 10) as u8 * 2 + 1;
        frames.push(udp4([172, 16, 0, 1], [10, id, 0, 1], 40000, 80, seq));
        per[usize::from(id)] += 1;
    }
    let n = frames.len() as u64;
    // 2^26 ns ≈ 67 ms timeslots. Worker 0 gets all the frames of a timeslot, each tenant
    // a tenth: with MAX_NB 300, any sender rate from ≈ 4.5k to 45k frames/s (at most
    // 32k here) overloads the worker and leaves every tenant below MAX_NB, so it can move.
    // Threshold 0: every timeslot a worker is found overloaded is reported.
    let (json, out, (sent, back)) = run_live(
        &ns,
        &tenants,
        &frames,
        n,
        &["--shift", "26", "--worker-max", "300", "--threshold", "0"],
        xdp,
    );
    assert_eq!(sent, n);
    let events = json["events"].as_array().unwrap();
    let migrations: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "migration")
        .collect();
    assert!(
        !migrations.is_empty(),
        "a migration among the events\n{out}"
    );
    // The first off the overloaded worker 0 to the idle worker 1 (later ones may move
    // back once worker 1 is loaded in turn); only tenants that send move.
    assert_eq!(migrations[0]["from"].as_u64(), Some(0), "{}", migrations[0]);
    assert_eq!(migrations[0]["to"].as_u64(), Some(1), "{}", migrations[0]);
    for m in &migrations {
        assert_eq!(m["tenant"].as_u64().unwrap() % 2, 1, "{m}");
    }
    // The overloaded worker was reported (worker 0 first: it is the one that overloads
    // before any tenant moved).
    let overloads: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["event"] == "overload").collect();
    assert!(
        !overloads.is_empty(),
        "an overload report among the events\n{out}"
    );
    assert_eq!(overloads[0]["worker"].as_u64(), Some(0), "{}", overloads[0]);
    let moved: u64 = json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["migrations"].as_u64().unwrap())
        .sum();
    assert_eq!(moved, migrations.len() as u64, "counted per tenant");
    // Still exact: nothing lost or doubled across the move.
    let by_id: Vec<(u64, u64)> = json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["id"].as_u64().unwrap(), x["packets"].as_u64().unwrap()))
        .collect();
    let want: Vec<(u64, u64)> = (1..=20u64).map(|i| (i, per[i as usize])).collect();
    assert_eq!(by_id, want, "{out}");
    let workers: Vec<u64> = json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["packets"].as_u64().unwrap())
        .collect();
    assert!(
        workers[1] > 0,
        "the idle worker took tenants over: {workers:?}"
    );
    assert_eq!(workers.iter().sum::<u64>(), n);
    if xdp {
        assert_eq!(json["input"]["xdp"]["passed"].as_u64(), Some(n));
    }
    // Every pass was sent back out (the sender counts what comes back only once it has
    // sent everything, so its receive ring, not this run, bounds `back` here).
    let port = &json["input"]["ports"][0];
    assert_eq!(port["tx"].as_u64(), Some(n), "{port}");
    assert_eq!(port["tx_dropped"].as_u64(), Some(0), "{port}");
    assert!(back > 0);
}

/// More workers than the XDP program's Worker Table held before its overload scan became
/// a bpf_loop (16): each of 24 workers polls its own AF_XDP socket, the program redirects
/// to every XSKMAP entry, and the counts agree exactly.
#[test]
fn xdp_dispatch_feeds_24_workers_and_96_tenants_by_metadata() {
    if !privileged("live::xdp_dispatch_feeds_24_workers_and_96_tenants_by_metadata") {
        return;
    }
    const WORKERS: u64 = 24;
    // 96 tenants: more than DSCP's 63, so each frame's tenant reaches its worker only in
    // the XDP metadata (the program does not tag DSCP then).
    const TENANTS_N: u64 = 4 * WORKERS;
    let tenants: String = (1..=TENANTS_N)
        .map(|i| format!("[[tenant]]\nid = {i}\nrules = [ {{ dst_ip = \"10.{i}.0.0/16\" }} ]\n\n"))
        .collect();
    let mut frames = Vec::new();
    for seq in 0..(40 * TENANTS_N) as u32 {
        let id = (seq % TENANTS_N as u32) as u8 + 1;
        frames.push(udp4([172, 16, 0, 1], [10, id, 0, 1], 40000, 80, seq));
    }
    let n = frames.len() as u64;
    let ns = NsPair::new();
    let (json, out, (sent, _)) = run_xdp(
        &ns,
        &tenants,
        &frames,
        n,
        &["--workers", "24", "--allow-oversubscribe"],
    );
    assert_eq!(sent, n);
    let workers: Vec<u64> = json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["packets"].as_u64().unwrap())
        .collect();
    assert_eq!(workers.len() as u64, WORKERS, "{out}");
    assert!(
        workers.iter().all(|&p| p > 0),
        "every worker, the 17th to the 24th too, got frames: {workers:?}\n{out}"
    );
    assert_eq!(workers.iter().sum::<u64>(), n, "{out}");
    let rows = json["tenants"].as_array().unwrap();
    assert_eq!(rows.len() as u64, TENANTS_N);
    for t in rows {
        assert_eq!(t["packets"].as_u64(), Some(40), "{t}");
    }
    assert_eq!(json["input"]["xdp"]["passed"].as_u64(), Some(n));
    // No DSCP tag: every frame that came back carries DSCP 0.
    let by_dscp: Vec<[u64; 2]> =
        serde_json::from_value(json["sender_dscp"]["by_dscp"].clone()).unwrap();
    assert!(
        !by_dscp.is_empty() && by_dscp.iter().all(|[d, _]| *d == 0),
        "{by_dscp:?}"
    );
}

/// Packets the XDP program polices (a tenant over its MAX_NB) are reported under that
/// tenant, as the software dispatcher reports them, and never reach a worker.
#[test]
fn xdp_dispatch_reports_policed_packets_per_tenant() {
    if !privileged("live::xdp_dispatch_reports_policed_packets_per_tenant") {
        return;
    }
    // Tenant 1 may send 50 packets per timeslot, tenant 3 120; one timeslot for the run.
    let tenants: String = [(1, 50), (2, 0), (3, 120)]
        .iter()
        .map(|(i, max)| {
            format!(
                "[[tenant]]\nid = {i}\nname = \"t{i}\"\nrules = [ {{ dst_ip = \"10.{i}.0.0/16\" }} ]\nmax_nb = {max}\n\n"
            )
        })
        .collect();
    let ns = NsPair::new();
    let mut frames = Vec::new();
    for seq in 0..600u32 {
        let id = (seq % 3) as u8 + 1;
        frames.push(udp4([172, 16, 0, 1], [10, id, 0, 1], 40000, 80, seq));
    }
    let (json, out, (sent, back)) =
        run_xdp(&ns, &tenants, &frames, 600 - 150 - 80, &["--shift", "40"]);
    assert_eq!(sent, 600);
    let tenant = |id: u64| {
        json["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap()
            .clone()
    };
    // 200 frames each: tenant 1 keeps 50, tenant 3 keeps 120, tenant 2 all.
    for (id, packets, policed) in [(1u64, 50u64, 150u64), (2, 200, 0), (3, 120, 80)] {
        let t = tenant(id);
        assert_eq!(t["packets"].as_u64(), Some(packets), "tenant {id}: {out}");
        assert_eq!(
            t["drops"]["policed"].as_u64().unwrap_or(0),
            policed,
            "tenant {id}: {t}"
        );
    }
    let x = &json["input"]["xdp"];
    assert_eq!(x["policed"].as_u64(), Some(230), "{x}");
    let per_row: u64 = x["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policed"].as_u64().unwrap())
        .sum();
    assert_eq!(per_row, 230, "{x}");
    assert_eq!(back, 600 - 230, "every kept frame came back once");
}

#[test]
fn xdp_dispatch_sigterm_detaches() {
    if !privileged("live::xdp_dispatch_sigterm_detaches") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let stats = dir.path().join("s.json");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--iface".as_ref(),
        ns.va.as_ref(),
        "--dispatch".as_ref(),
        "xdp".as_ref(),
        "--xdp-mode".as_ref(),
        "generic".as_ref(),
        "--nf".as_ref(),
        "monitor".as_ref(),
        "--no-pin".as_ref(),
        "--tenants".as_ref(),
        tenants.as_os_str(),
        "--stats-json".as_ref(),
        stats.as_os_str(),
    ];
    let (child, stderr) = start_run(&ns.a, &args);
    assert!(
        xdp_attached(&ns.a, &ns.va).is_some(),
        "attached while running"
    );
    signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    assert!(out.status.success(), "{err}");
    assert_eq!(
        xdp_attached(&ns.a, &ns.va),
        None,
        "SIGTERM detached the program"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(json["tenants"].as_array().unwrap().len(), 10);
    assert_eq!(json["input"]["dispatch"].as_str(), Some("xdp"));
}

/// `--dispatch xdp` and a program a dead run left on the interface: a `--port af-xdp`
/// run killed with SIGKILL leaves its redirect program behind; the next `--dispatch xdp`
/// run replaces it, says so, and detaches on Ctrl-C (SIGINT). (That the operator's own
/// program or a live dispatcher's is refused is buffet-xdp's tests/attach.rs; a live
/// `--port af-xdp` run also holds the queue, which a second run cannot bind.)
#[test]
fn xdp_dispatch_replaces_a_dead_runs_program_and_sigint_detaches() {
    if !privileged("live::xdp_dispatch_replaces_a_dead_runs_program_and_sigint_detaches") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let t = tenants.to_str().unwrap();
    let os = |args: &[&str]| -> Vec<std::ffi::OsString> {
        args.iter().map(std::ffi::OsString::from).collect()
    };
    let port_run = os(&[
        "--iface",
        &ns.va,
        "--port",
        "af-xdp",
        "--nf",
        "monitor",
        "--no-pin",
        "--tenants",
        t,
    ]);
    let xdp_run = os(&[
        "--iface",
        &ns.va,
        "--dispatch",
        "xdp",
        "--xdp-mode",
        "generic",
        "--nf",
        "monitor",
        "--no-pin",
        "--tenants",
        t,
    ]);
    fn refs(v: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
        v.iter().map(|a| a.as_os_str()).collect()
    }
    let (mut first, _err) = start_run(&ns.a, &refs(&port_run));
    let theirs = xdp_attached(&ns.a, &ns.va).expect("attached while running");
    assert!(theirs.contains("bfxsk_"), "{theirs}");
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(
        xdp_attached(&ns.a, &ns.va).is_some(),
        "SIGKILL leaves the program attached"
    );
    let (second, err) = start_run(&ns.a, &refs(&xdp_run));
    let ours = xdp_attached(&ns.a, &ns.va).expect("attached while running");
    assert!(
        ours.contains("buffet_dispatch") && !ours.contains("bfxsk_"),
        "{ours}"
    );
    signal(&second, "INT");
    let out = second.wait_with_output().unwrap();
    let err = err.join().unwrap();
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("(replaced a program left attached by a run that ended without detaching)"),
        "{err}"
    );
    assert_eq!(
        xdp_attached(&ns.a, &ns.va),
        None,
        "Ctrl-C detached the program"
    );
}

#[test]
fn xdp_dispatch_refuses_an_inexpressible_rule_or_too_many_tenants_before_attaching() {
    if !privileged(
        "live::xdp_dispatch_refuses_an_inexpressible_rule_or_too_many_tenants_before_attaching",
    ) {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    // Two wide port ranges: their prefix expansion needs far more distinct masks than
    // the program's tuple-space search probes.
    let bad = format!(
        "{TENANTS}\n[[tenant]]\nid = 11\nname = \"ranges\"\nrules = [ {{ protocol = \"udp\", src_port = \"1-65534\", dst_port = \"3-65533\" }} ]\n"
    );
    let stats = dir.path().join("s.json");
    // Runs with `tenants_text` and `extra`: refused before traffic, nothing written or
    // attached; the error text for the caller's own checks.
    let refused = |tenants_text: &str, extra: &[&str]| -> String {
        std::fs::write(&tenants, tenants_text).unwrap();
        let mut args = vec![
            "--iface",
            &ns.va,
            "--dispatch",
            "xdp",
            "--xdp-mode",
            "generic",
            "--nf",
            "monitor",
            "--no-pin",
            "--tenants",
            tenants.to_str().unwrap(),
            "--stats-json",
            stats.to_str().unwrap(),
            "--duration",
            "2",
        ];
        args.extend_from_slice(extra);
        let o = run_output(Some(&ns.a), &args);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{e}");
        assert!(!e.contains("running on"), "no traffic ran: {e}");
        assert!(!stats.exists(), "nothing ran, nothing written");
        assert_eq!(xdp_attached(&ns.a, &ns.va), None, "nothing attached");
        e
    };
    let e = refused(&bad, &[]);
    assert!(
        e.contains("tenant 11 (\"ranges\") cannot be admitted to the XDP Packet Dispatcher"),
        "{e}"
    );
    assert!(e.contains("the XDP classifier cannot express it"), "{e}");

    // More tenants than the program's maps hold (16,384 slots): refused the same way.
    let many: String = (1..=16_385u32)
        .map(|i| {
            format!(
                "[[tenant]]\nid = {i}\nrules = [ {{ dst_ip = \"10.{}.{}.0/24\" }} ]\n",
                i / 256,
                i % 256
            )
        })
        .collect();
    let e = refused(&many, &["--tenant-slots", "20000"]);
    assert!(
        e.contains("16385 tenants, more than the 16384 the XDP Packet Dispatcher's maps hold"),
        "{e}"
    );
}

/// buffetd in namespace A of `ns` (its loopback up: the API listens there) with the NF
/// and API port of `(port, nf)`, `tail` after the config's head (`[dataplane]`, the
/// ports), its data under `dir`; started and answering.
fn daemon_in_a(
    ns: &NsPair,
    dir: &Path,
    (port, nf): (u16, &str),
    tail: &str,
    token: &str,
) -> Daemon {
    ip(&["-n", &ns.a, "link", "set", "lo", "up"]);
    let head = config_head(&dir.join("data"), port, nf);
    let cfg = write_config(dir, &format!("{head}{tail}"));
    Daemon::start_in(&ns.a, &cfg, port, token)
}

/// A buffetd config's `[dataplane]` with `workers` workers and one `af_packet` port on
/// `iface`.
fn af_packet_dataplane(workers: u32, iface: &str) -> String {
    format!(
        "[dataplane]\nworkers = {workers}\narena_mib = 64\ntenant_slots = 16\n\
         [[port]]\nkind = \"af_packet\"\niface = \"{iface}\"\n"
    )
}

/// buffetd on a live interface: a `kind = "af_packet"` port in its config, inside
/// namespace A; tenants admitted through the `buffet` client (run in A too, where the
/// API listens); frames sent from B are counted per tenant exactly and passed frames come
/// back out of the interface.
#[test]
fn buffetd_serves_a_live_af_packet_port() {
    if !privileged("live::buffetd_serves_a_live_af_packet_port") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tail = af_packet_dataplane(2, &ns.va);
    let mut daemon = daemon_in_a(
        &ns,
        dir.path(),
        (7979, "firewall"),
        &tail,
        "admin-token-for-the-live-daemon-test",
    );
    // Tenant 1 passes everything, tenant 2 denies UDP to port 53.
    for (id, policy) in [
        (1, r#"{"default":"allow"}"#),
        (
            2,
            r#"{"default":"allow","rules":[{"action":"deny","proto":"udp","dst_port":53}]}"#,
        ),
    ] {
        let rule = format!("dst_ip=10.{id}.0.0/16");
        let id = id.to_string();
        let (ok, _, err) = daemon.client(&[
            "tenant", "add", "--id", &id, "--rule", &rule, "--policy", policy,
        ]);
        assert!(ok, "{err}");
    }
    let mut frames = Vec::new();
    for seq in 0..600u32 {
        let (id, dport) = match seq % 3 {
            0 => (1, 80),
            1 => (2, 80),
            _ => (2, 53),
        };
        frames.push(udp4([172, 16, 0, 1], [10, id, 0, 1], 40000, dport, seq));
    }
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &frames);
    // Tenant 1's 200 and tenant 2's 200 to port 80 pass and come back.
    let (sent, back) = send_from_b(&ns, &pcap, 400, &dir.path().join("sender.txt"));
    assert_eq!(sent, 600);
    let t0 = Instant::now();
    let stats = loop {
        let (ok, v, err) = daemon.client(&["stats"]);
        assert!(ok, "{err}");
        let packets = |id: u64| {
            v["tenants"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["id"].as_u64() == Some(id))
                .and_then(|t| t["packets"].as_u64())
        };
        if packets(1) == Some(200) && packets(2) == Some(400) {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let tenant = |id: u64| {
        stats["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"].as_u64() == Some(id))
            .unwrap()
            .clone()
    };
    assert_eq!(tenant(1)["passed"].as_u64(), Some(200), "{stats}");
    assert_eq!(tenant(2)["passed"].as_u64(), Some(200), "{stats}");
    assert_eq!(back, 400, "passed frames went back out of the interface");
    // SIGTERM: drains and exits 0.
    // (`ip netns exec` executes buffetd in its own process: the child is the daemon.)
    daemon.signal("TERM");
    assert!(daemon.child.wait().unwrap().success());
}

/// A second veth pair between `ns`'s namespaces with `queues` transmit and receive
/// queues on each end; returns (A side, B side).
fn multiqueue_pair(ns: &NsPair, queues: u32) -> (String, String) {
    let (va, vb) = (format!("{}q", ns.va), format!("{}q", ns.vb));
    let n = queues.to_string();
    ip(&[
        "link",
        "add",
        &va,
        "netns",
        &ns.a,
        "numtxqueues",
        &n,
        "numrxqueues",
        &n,
        "type",
        "veth",
        "peer",
        "name",
        &vb,
        "netns",
        &ns.b,
        "numtxqueues",
        &n,
        "numrxqueues",
        &n,
    ]);
    ip(&["-n", &ns.a, "link", "set", &va, "up"]);
    ip(&["-n", &ns.b, "link", "set", &vb, "up"]);
    (va, vb)
}

/// Runs in namespace B (see `af_xdp_port_reads_every_queue_it_is_given`): sends the pcap
/// in `BUFFET_MQ_SEND` out of `BUFFET_MQ_IFACE` on its `BUFFET_MQ_QUEUES` transmit
/// queues, through one AF_XDP socket per queue (copy mode: the kernel transmits each
/// frame on the socket's own queue, and veth hands it to the peer's receive queue of
/// that number). Frame `i` goes on queue `i % queues`, or, with `BUFFET_MQ_COUNTS`
/// (`10,20,30,40`), the first 10 frames on queue 0, the next 20 on queue 1, and so on.
/// Then counts marked frames coming back (an AF_PACKET socket on the interface) until
/// `BUFFET_MQ_EXPECT` arrived or 5 s passed, and writes `back sent_on_0 sent_on_1 …` to
/// `BUFFET_MQ_OUT`.
#[test]
#[ignore = "helper: run by the multi-queue AF_XDP tests inside a network namespace"]
fn multiqueue_sender_helper() {
    use buffet::io::afpacket::{AfPacketConfig, AfPacketPort};
    use buffet::io::afxdp::{AfXdpConfig, AfXdpPort, CopyMode};
    use buffet::io::pcap::PcapReader;
    use buffet::io::PacketSource;
    let Ok(pcap) = std::env::var("BUFFET_MQ_SEND") else {
        return;
    };
    let iface = std::env::var("BUFFET_MQ_IFACE").unwrap();
    let queues: u32 = std::env::var("BUFFET_MQ_QUEUES").unwrap().parse().unwrap();
    let expect: u64 = std::env::var("BUFFET_MQ_EXPECT").unwrap().parse().unwrap();
    let counts: Option<Vec<u64>> = std::env::var("BUFFET_MQ_COUNTS")
        .ok()
        .map(|c| c.split(',').map(|x| x.parse().unwrap()).collect());
    let mut back_port = AfPacketPort::open(AfPacketConfig::new(&iface, 99)).unwrap();
    let mut ports: Vec<AfXdpPort> = (0..queues)
        .map(|q| {
            AfXdpPort::open(AfXdpConfig {
                queue: q,
                redirect: None,
                copy: CopyMode::Copy,
                frames: 512,
                ring_size: 256,
                ..AfXdpConfig::new(&iface, q as u16)
            })
            .unwrap()
        })
        .collect();
    let queue_of = |i: u64| -> usize {
        match &counts {
            None => (i % u64::from(queues)) as usize,
            Some(c) => {
                let mut left = i;
                for (q, &k) in c.iter().enumerate() {
                    if left < k {
                        return q;
                    }
                    left -= k;
                }
                panic!("frame {i} is beyond BUFFET_MQ_COUNTS")
            }
        }
    };
    let mut pool = HeapPool::new(1024);
    let mut reader = PcapReader::open(Path::new(&pcap)).unwrap();
    let mut bursts: Vec<Vec<_>> = (0..queues).map(|_| Vec::new()).collect();
    let mut i = 0u64;
    let mut rx = Vec::new();
    loop {
        let pkt = reader.next_packet().unwrap();
        let done = pkt.is_none();
        if let Some(p) = pkt {
            let mut b = pool.take().unwrap();
            assert!(b.fill(p.data));
            bursts[queue_of(i)].push(b);
            i += 1;
        }
        if done || i % 16 == 0 {
            for (port, burst) in ports.iter_mut().zip(&mut bursts) {
                port.tx_burst(burst, &mut pool).unwrap();
                // Completions back to the port's free frames.
                port.rx_burst(&mut pool, &mut rx, 64).unwrap();
                for b in rx.drain(..) {
                    port.recycle(b);
                }
            }
            // Paced: the receiving rings are never the limit in this test.
            std::thread::sleep(Duration::from_micros(500));
        }
        if done {
            break;
        }
    }
    let mut back = 0u64;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut until = if expect == 0 {
        Instant::now() + Duration::from_millis(300)
    } else {
        deadline
    };
    while Instant::now() < until {
        back_port.rx_burst(&mut pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            if b.data().windows(MARK.len()).any(|w| w == MARK) {
                back += 1;
            }
            pool.give(b);
        }
        if expect > 0 && back >= expect && until == deadline {
            until = Instant::now() + Duration::from_millis(300);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut line = back.to_string();
    for p in &ports {
        let s = p.stats();
        assert_eq!(s.tx_dropped, 0, "{s:?}");
        line.push_str(&format!(" {}", s.tx));
    }
    std::fs::write(std::env::var("BUFFET_MQ_OUT").unwrap(), line + "\n").unwrap();
}

/// `buffet run` in A with `args` while B sends `pcap` on `vb`'s four transmit queues
/// (frame `i` on queue `i % 4`) and waits for `expect` frames back; returns what the
/// sender counted (`back sent_on_0 … sent_on_3`), and the run's output and stderr.
fn run_sending_on_four_queues(
    ns: &NsPair,
    args: &[&std::ffi::OsStr],
    pcap: &std::path::Path,
    vb: &str,
    expect: u64,
) -> (Vec<u64>, std::process::Output, String) {
    let (child, stderr) = start_run(&ns.a, args);
    let sent = send_on_queues(
        ns,
        &[
            ("BUFFET_MQ_SEND", pcap.display().to_string()),
            ("BUFFET_MQ_IFACE", vb.to_owned()),
            ("BUFFET_MQ_QUEUES", "4".into()),
            ("BUFFET_MQ_EXPECT", expect.to_string()),
        ],
    );
    let out = child.wait_with_output().unwrap();
    (sent, out, stderr.join().unwrap())
}

/// Runs `multiqueue_sender_helper` in namespace B with `env`; returns its numbers:
/// frames back, then frames sent on each queue.
fn send_on_queues(ns: &NsPair, env: &[(&str, String)]) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mq.txt");
    let sender = ns_helper(&ns.b, "multiqueue_sender_helper")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("BUFFET_MQ_OUT", &out)
        .output()
        .unwrap();
    assert!(
        sender.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sender.stdout),
        String::from_utf8_lossy(&sender.stderr)
    );
    std::fs::read_to_string(&out)
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

/// Runs in namespace A (see `af_xdp_port_reads_every_queue_it_is_given`): one AF_XDP
/// port on queues 0-3 of `BUFFET_MQR_IFACE`, its redirect program in mode
/// `BUFFET_MQR_MODE`; receives until `BUFFET_MQR_EXPECT` marked frames arrived or 10 s
/// passed, and writes `received_on_0 received_on_1 … port_rx` to `BUFFET_MQR_OUT`.
#[test]
#[ignore = "helper: run by af_xdp_port_reads_every_queue_it_is_given inside a network namespace"]
fn multiqueue_receiver_helper() {
    use buffet::io::afxdp::{AfXdpConfig, AfXdpPort, XdpMode};
    let Ok(iface) = std::env::var("BUFFET_MQR_IFACE") else {
        return;
    };
    let mode = match std::env::var("BUFFET_MQR_MODE").unwrap().as_str() {
        "native" => XdpMode::Native,
        _ => XdpMode::Generic,
    };
    let expect: u64 = std::env::var("BUFFET_MQR_EXPECT").unwrap().parse().unwrap();
    let mut port = AfXdpPort::open(AfXdpConfig {
        queues: vec![0, 1, 2, 3],
        redirect: Some(mode),
        ..AfXdpConfig::new(&iface, 0)
    })
    .unwrap();
    assert_eq!(
        port.program().unwrap().is_generic(),
        mode == XdpMode::Generic
    );
    assert_eq!(port.name(), format!("af_xdp:{iface}:0,1,2,3"));
    println!("MQ-READY");
    let mut pool = HeapPool::new(64);
    let mut rx = Vec::new();
    let mut marked = 0u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while marked < expect && Instant::now() < deadline {
        port.rx_burst(&mut pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            if b.data().windows(MARK.len()).any(|w| w == MARK) {
                marked += 1;
            }
            port.recycle(b);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut line = String::new();
    for (q, n) in port.received_per_queue() {
        assert_eq!(q as usize, line.split_whitespace().count(), "queue order");
        line.push_str(&format!("{n} "));
    }
    let s = port.stats();
    assert_eq!(s.rx_dropped, 0, "{s:?}");
    line.push_str(&s.rx.to_string());
    std::fs::write(std::env::var("BUFFET_MQR_OUT").unwrap(), line + "\n").unwrap();
}

/// One AF_XDP port on all four queues of a four-queue veth: a peer sending 10, 20, 30
/// and 40 frames on its transmit queues 0-3 (one AF_XDP socket each: the kernel keeps a
/// frame on its socket's queue) reaches the port on several receive queues, and the port
/// receives every frame, with its redirect program in native and in generic mode. How
/// the queues map is the kernel's (see docs/ports.md): in native mode veth hands a frame
/// sent on queue q to the peer's receive queue q; in generic mode the frame keeps the
/// sender's queue mapping, which the receive path reads as queue q - 1 (queue 0 for q = 0).
#[test]
fn af_xdp_port_reads_every_queue_it_is_given() {
    if !privileged("live::af_xdp_port_reads_every_queue_it_is_given") {
        return;
    }
    for (mode, want) in [("native", [10, 20, 30, 40]), ("generic", [30, 30, 40, 0])] {
        let ns = NsPair::new();
        let (va, vb) = multiqueue_pair(&ns, 4);
        let dir = tempfile::tempdir().unwrap();
        let frames: Vec<Vec<u8>> = (0..100u32)
            .map(|i| udp4([172, 16, 0, 1], [10, 1, 0, (i % 200) as u8], 40000, 80, i))
            .collect();
        let pcap = dir.path().join("send.pcap");
        write_pcap(&pcap, &frames);
        let out = dir.path().join("mqr.txt");
        let mut helper = ns_helper(&ns.a, "multiqueue_receiver_helper")
            .env("BUFFET_MQR_IFACE", &va)
            .env("BUFFET_MQR_MODE", mode)
            .env("BUFFET_MQR_EXPECT", "100")
            .env("BUFFET_MQR_OUT", &out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(helper.stdout.take().unwrap());
        let mut seen = String::new();
        while !seen.contains("MQ-READY") {
            if lines.read_line(&mut seen).unwrap() == 0 {
                let out = helper.wait_with_output().unwrap();
                panic!("{mode}: {seen}{}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let sent = send_on_queues(
            &ns,
            &[
                ("BUFFET_MQ_SEND", pcap.display().to_string()),
                ("BUFFET_MQ_IFACE", vb.clone()),
                ("BUFFET_MQ_QUEUES", "4".into()),
                ("BUFFET_MQ_COUNTS", "10,20,30,40".into()),
                ("BUFFET_MQ_EXPECT", "0".into()),
            ],
        );
        assert_eq!(sent, [0, 10, 20, 30, 40], "{mode}: back, sent per queue");
        let _ = lines.read_to_string(&mut seen);
        let o = helper.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{mode}: {seen}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got: Vec<u64> = std::fs::read_to_string(&out)
            .unwrap()
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(got[..4], want, "{mode}: received per queue 0-3");
        assert!(
            got[..4].iter().filter(|&&n| n > 0).count() > 1,
            "{mode}: frames arrived on more than one queue"
        );
        assert_eq!(got[4], 100, "{mode}: the port received every frame");
        assert_eq!(
            xdp_attached(&ns.a, &va),
            None,
            "{mode}: detached when dropped"
        );
    }
}

/// `buffet run --port af-xdp --queues 0-3` on a four-queue veth: the traffic of the
/// ten-tenant test, sent round robin on the peer's four transmit queues, is counted per
/// tenant exactly, the port received every frame (on all four queues, in native mode),
/// and every passed frame comes back out of the first queue. A queue the interface does
/// not have is refused first, with the interface's queue count, and leaves nothing
/// attached.
#[test]
fn af_xdp_run_on_four_queues_counts_every_tenant_exactly() {
    if !privileged("live::af_xdp_run_on_four_queues_counts_every_tenant_exactly") {
        return;
    }
    let ns = NsPair::new();
    let (va, vb) = multiqueue_pair(&ns, 4);
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let t = tenants.to_str().unwrap();
    let o = run_output(
        Some(&ns.a),
        &[
            "--iface",
            &va,
            "--port",
            "af-xdp",
            "--queues",
            "0-4",
            "--nf",
            "monitor",
            "--tenants",
            t,
        ],
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "af_xdp on {va}: queue 4 does not exist: the interface has 4 receive queue(s)"
        )),
        "{e}"
    );
    assert_eq!(xdp_attached(&ns.a, &va), None, "nothing left attached");

    let traffic = traffic();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &traffic.frames);
    let stats = dir.path().join("stats.json");
    let args: Vec<&std::ffi::OsStr> = [
        "--iface",
        va.as_str(),
        "--port",
        "af-xdp",
        "--queues",
        "0-3",
        "--xdp-mode",
        "native",
        "--nf",
        "monitor",
        "--workers",
        "2",
        "--no-pin",
        "--duration",
        "6",
        "--tenants",
        t,
        "--stats-json",
        stats.to_str().unwrap(),
    ]
    .iter()
    .map(|s| std::ffi::OsStr::new(*s))
    .collect();
    let packets: u64 = traffic.per_tenant.iter().map(|(_, k)| k).sum();
    let (sent, out, err) = run_sending_on_four_queues(&ns, &args, &pcap, &vb, packets);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    assert!(
        err.contains(&format!("af_xdp on {va} queues 0,1,2,3: copy mode")),
        "{err}"
    );
    let total = traffic.frames.len() as u64;
    assert_eq!(sent[1..].iter().sum::<u64>(), total, "sent: {sent:?}");
    assert!(
        sent[1..].iter().all(|&n| n > 0),
        "every queue sent: {sent:?}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let by_id = tenant_rows(&json);
    let want: Vec<(u64, u64, u64)> = traffic
        .per_tenant
        .iter()
        .map(|&(id, k)| (u64::from(id), k, k))
        .collect();
    assert_eq!(by_id, want, "per tenant (id, packets, passed)\n{stdout}");
    let g = &json["global"];
    assert_eq!(g["input_packets"].as_u64(), Some(total), "{stdout}");
    assert_eq!(g["unmatched"].as_u64(), Some(traffic.unmatched), "{stdout}");
    let port = &json["input"]["ports"][0];
    assert_eq!(
        port["name"].as_str(),
        Some(format!("af_xdp:{va}:0,1,2,3").as_str())
    );
    assert_eq!(port["rx"].as_u64(), Some(total), "{port}");
    assert_eq!(port["rx_dropped"].as_u64(), Some(0), "{port}");
    assert_eq!(port["tx"].as_u64(), Some(packets), "{port}");
    assert_eq!(sent[0], packets, "every passed frame came back out, once");
    assert_eq!(xdp_attached(&ns.a, &va), None, "detached at the end");
}

/// buffetd with `[dispatch] mode = "xdp"` on the veth's end in namespace A, a sender in
/// B: four tenants admitted through the HTTP API (the `buffet` client), then two more
/// while traffic flows, one removed mid-run (its later frames are the program's
/// unmatched), one worker launched and one terminated while traffic flows. Every frame is
/// accounted for exactly: per tenant, what the workers ran plus its counted drops is what
/// was sent; frames of a tenant not yet admitted or removed are unmatched; none is lost
/// at a worker's termination and none reaches a dead worker.
#[test]
fn buffetd_runs_the_xdp_dispatcher_with_tenants_and_workers_changing_under_traffic() {
    let test =
        "live::buffetd_runs_the_xdp_dispatcher_with_tenants_and_workers_changing_under_traffic";
    if !privileged(test) {
        return;
    }
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = daemon_in_a(
        &ns,
        dir.path(),
        (7980, "monitor"),
        &format!(
            "[dataplane]\nworkers = 2\nmax_workers = 3\narena_mib = 64\ntenant_slots = 16\n\
             [dispatch]\nmode = \"xdp\"\n\
             [[port]]\nkind = \"af_xdp\"\niface = \"{}\"\nxdp_mode = \"generic\"\n",
            ns.va
        ),
        "admin-token-for-the-live-xdp-daemon-test",
    );
    assert!(
        xdp_attached(&ns.a, &ns.va).is_some(),
        "the XDP Packet Dispatcher is attached"
    );
    let add = |id: u32| {
        let rule = format!("dst_ip=10.{id}.0.0/16");
        let (ok, _, err) =
            daemon.client(&["tenant", "add", "--id", &id.to_string(), "--rule", &rule]);
        assert!(ok, "tenant {id}: {err}");
    };
    for id in 1..=4 {
        add(id);
    }
    let stats = || {
        let (ok, v, err) = daemon.client(&["stats"]);
        assert!(ok, "{err}");
        v
    };
    // Everything the program sent tenant `id`'s way: the packets its workers ran (any
    // verdict or drop reason there) plus the frames the program policed, which never
    // reach a worker.
    let seen = |v: &serde_json::Value, id: u64| -> Option<u64> {
        let t = v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"].as_u64() == Some(id))?;
        Some(t["packets"].as_u64().unwrap() + t["drops"]["policed"].as_u64().unwrap_or(0))
    };
    let unmatched = |v: &serde_json::Value| v["global"]["unmatched"].as_u64().unwrap();
    let wait = |what: &str, check: &dyn Fn(&serde_json::Value) -> bool| {
        let t0 = Instant::now();
        loop {
            let v = stats();
            if check(&v) {
                return v;
            }
            assert!(t0.elapsed() < Duration::from_secs(15), "{what}: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // `n` frames to each tenant prefix of `ids`, interleaved.
    let pcap_for = |name: &str, ids: &[u8], n: u32| -> PathBuf {
        let mut frames = Vec::new();
        for seq in 0..n {
            for &id in ids {
                frames.push(udp4([172, 16, 0, 1], [10, id, 0, 1], 40000, 80, seq));
            }
        }
        let p = dir.path().join(name);
        write_pcap(&p, &frames);
        p
    };

    // Phase 1: 1500 frames to each of tenants 1..6 while 5 and 6 are admitted.
    let before = stats();
    let u0 = unmatched(&before);
    let p1 = pcap_for("p1.pcap", &[1, 2, 3, 4, 5, 6], 1500);
    std::thread::scope(|s| {
        let sender = s.spawn(|| send_from_b(&ns, &p1, 0, &dir.path().join("p1.txt")));
        std::thread::sleep(Duration::from_millis(100));
        add(5);
        add(6);
        assert_eq!(sender.join().unwrap().0, 9000);
    });
    let v = wait("phase 1", &|v| {
        (1..=4).all(|id| seen(v, id) == Some(1500))
            && seen(v, 5).unwrap_or(0) + seen(v, 6).unwrap_or(0) + unmatched(v) - u0 == 3000
    });
    assert!(
        seen(&v, 5).unwrap() + seen(&v, 6).unwrap() > 0,
        "admitted while traffic flowed: {v}"
    );
    let counted5 = seen(&v, 5).unwrap();
    let counted6 = seen(&v, 6).unwrap();

    // Phase 2: tenant 3 removed; its later frames are unmatched by the program.
    let (ok, _, err) = daemon.client(&["tenant", "rm", "3"]);
    assert!(ok, "{err}");
    let u1 = unmatched(&stats());
    let p2 = pcap_for("p2.pcap", &[1, 2, 3, 4, 5, 6], 200);
    assert_eq!(
        send_from_b(&ns, &p2, 1000, &dir.path().join("p2.txt")).0,
        1200
    );
    let v = wait("phase 2", &|v| {
        [1, 2, 4].iter().all(|&id| seen(v, id) == Some(1700))
            && seen(v, 5) == Some(counted5 + 200)
            && seen(v, 6) == Some(counted6 + 200)
    });
    assert_eq!(unmatched(&v), u1 + 200, "tenant 3's frames: {v}");
    assert_eq!(seen(&v, 3), None, "tenant 3 is gone: {v}");

    // Phase 3: a worker launched and worker 0 terminated while traffic flows.
    let p3 = pcap_for("p3.pcap", &[1, 2, 4, 5, 6], 1500);
    std::thread::scope(|s| {
        let sender = s.spawn(|| send_from_b(&ns, &p3, 7500, &dir.path().join("p3.txt")));
        std::thread::sleep(Duration::from_millis(100));
        let (ok, w, err) = daemon.client(&["workers", "add"]);
        assert!(ok, "{err}");
        assert_eq!(w["id"].as_u64(), Some(2), "{w}");
        let (ok, _, err) = daemon.client(&["workers", "rm", "0"]);
        assert!(ok, "{err}");
        assert_eq!(sender.join().unwrap().0, 7500);
    });
    let v = wait("phase 3", &|v| {
        [1, 2, 4].iter().all(|&id| seen(v, id) == Some(3200))
            && seen(v, 5) == Some(counted5 + 1700)
            && seen(v, 6) == Some(counted6 + 1700)
    });
    assert_eq!(v["global"]["no_live_worker"].as_u64(), Some(0), "{v}");
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers[0]["live"], serde_json::json!(false), "{v}");
    assert!(workers[2]["packets"].as_u64().unwrap() > 0, "{v}");
    for t in v["tenants"].as_array().unwrap() {
        assert_ne!(t["worker"].as_u64(), Some(0), "{v}");
    }
    // SIGTERM: detaches the program, drains, exits 0.
    daemon.signal("TERM");
    assert!(daemon.child.wait().unwrap().success());
    assert_eq!(xdp_attached(&ns.a, &ns.va), None, "detached on SIGTERM");
}

/// `buffet run --dispatch xdp --queues 0-3` on a four-queue veth, in native and in generic
/// mode: the ten-tenant traffic sent round robin on the peer's four transmit queues is
/// counted per tenant exactly by the sender, the XDP program's Tenant Table and the
/// workers; every worker has a socket on each queue, and each socket received exactly
/// the passed frames of its queue (native: sent on q, received on q; generic: on q - 1,
/// queue 0 for 0), on more than one queue; no socket dropped a frame; every passed
/// frame came back out. A queue the interface lacks, or one beyond the program's
/// XSKMAP, is refused first and leaves nothing attached.
/// `--dispatch xdp` reading two of a four-queue interface's queues (native mode, which
/// keeps a frame on the queue it was sent on): the passed frames that arrive on queues 2
/// and 3 find no worker socket there, so the program drops them — none reaches a worker,
/// A's own stack (tshark on A's end sees none) or comes back out — and counts each as
/// `no_socket`; the run warns at start.
#[test]
fn xdp_dispatch_drops_and_counts_frames_on_queues_it_does_not_read() {
    let test = "live::xdp_dispatch_drops_and_counts_frames_on_queues_it_does_not_read";
    if !privileged(test) {
        return;
    }
    let t = traffic();
    let packets: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
    // Frame i goes on queue i % 4; queues 0 and 1 are read.
    let mut read_per_tenant: std::collections::BTreeMap<u64, u64> = t
        .per_tenant
        .iter()
        .map(|&(id, _)| (u64::from(id), 0))
        .collect();
    let mut unread = 0u64;
    for (i, &id) in t.tenant_of.iter().enumerate() {
        if id != 0 {
            if i % 4 < 2 {
                *read_per_tenant.get_mut(&u64::from(id)).unwrap() += 1;
            } else {
                unread += 1;
            }
        }
    }
    assert!(unread > 0 && unread < packets);
    let ns = NsPair::new();
    let (va, vb) = multiqueue_pair(&ns, 4);
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let pcap = dir.path().join("send.pcap");
    write_pcap(&pcap, &t.frames);
    let stats = dir.path().join("stats.json");
    let args: Vec<&std::ffi::OsStr> = [
        "--iface",
        va.as_str(),
        "--dispatch",
        "xdp",
        "--xdp-mode",
        "native",
        "--queues",
        "0-1",
        "--nf",
        "monitor",
        "--workers",
        "2",
        "--shift",
        "40",
        "--no-pin",
        "--duration",
        "6",
        "--tenants",
        tenants.to_str().unwrap(),
        "--stats-json",
        stats.to_str().unwrap(),
    ]
    .iter()
    .map(|s| std::ffi::OsStr::new(*s))
    .collect();
    // What reaches A's own stack (or leaves A) on its end, as an independent tool sees it.
    let wire = WireCapture::start(&ns.a, &va, dir.path().join("a.pcapng"));
    let (sent, out, err) = run_sending_on_four_queues(&ns, &args, &pcap, &vb, packets - unread);
    // Dropped frames never reach the stack (an `XDP_PASS` fallback hands the unread
    // queues' frames to it: 144 of the 172 were seen here so), and frames sent back out
    // through AF_XDP do not pass the capture's tap.
    let (on_a, _) = wire.finish();
    assert!(
        on_a.is_empty(),
        "frames reached A's stack past the NF, by DSCP tag: {on_a:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    assert!(
        err.contains(&format!(
            "warning: {va} also receives on queue(s) [2, 3], which this run does not read"
        )),
        "{err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let x = &json["input"]["xdp"];
    assert_eq!(x["passed"].as_u64(), Some(packets), "{x}");
    assert_eq!(x["no_socket"].as_u64(), Some(unread), "{x}");
    // The report's global counts hold them too, so every frame the program saw is in
    // exactly one count: a tenant's packets or policed drops, or a global drop.
    let g = &json["global"];
    assert_eq!(g["no_socket"].as_u64(), Some(unread), "{g}");
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let in_tenants: u64 = json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| n(&r["packets"]) + n(&r["drops"]["policed"]))
        .sum();
    let malformed: u64 = g["malformed"]
        .as_object()
        .map_or(0, |m| m.values().map(n).sum());
    assert_eq!(
        n(&g["input_packets"]),
        in_tenants + n(&g["unmatched"]) + malformed + n(&g["no_live_worker"]) + unread,
        "{json}"
    );
    assert!(stdout.contains(&format!("no_socket {unread}")), "{stdout}");
    let workers: std::collections::BTreeMap<u64, u64> = json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_u64().unwrap(), r["packets"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        workers, read_per_tenant,
        "per tenant, the workers ran exactly the frames of the queues read"
    );
    assert_eq!(
        sent[0],
        packets - unread,
        "only the frames of the queues read came back out"
    );
    assert_eq!(xdp_attached(&ns.a, &va), None, "detached at the end");
}

#[test]
fn xdp_dispatch_on_four_queues_counts_every_tenant_exactly() {
    let test = "live::xdp_dispatch_on_four_queues_counts_every_tenant_exactly";
    if !privileged(test) {
        return;
    }
    let t = traffic();
    let packets: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
    let total = t.frames.len() as u64;
    for mode in ["native", "generic"] {
        let ns = NsPair::new();
        let (va, vb) = multiqueue_pair(&ns, 4);
        let dir = tempfile::tempdir().unwrap();
        let tenants = dir.path().join("tenants.toml");
        std::fs::write(&tenants, TENANTS).unwrap();
        let tf = tenants.to_str().unwrap();
        for (queues, want) in [
            (
                "0-4",
                format!(
                    "af_xdp on {va}: queue 4 does not exist: the interface has 4 receive queue(s)"
                ),
            ),
            (
                "0,64",
                "receive queue 64: the XDP dispatcher's XSKMAP holds sockets for queues 0 to 63"
                    .to_owned(),
            ),
        ] {
            let o = run_output(
                Some(&ns.a),
                &[
                    "--iface",
                    &va,
                    "--dispatch",
                    "xdp",
                    "--xdp-mode",
                    mode,
                    "--queues",
                    queues,
                    "--nf",
                    "monitor",
                    "--tenants",
                    tf,
                ],
            );
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{mode} {queues}: {e}");
            assert!(e.contains(&want), "{mode} {queues}: {e}");
            assert_eq!(
                xdp_attached(&ns.a, &va),
                None,
                "{mode} {queues}: nothing attached"
            );
        }

        let pcap = dir.path().join("send.pcap");
        write_pcap(&pcap, &t.frames);
        let stats = dir.path().join("stats.json");
        let args: Vec<&std::ffi::OsStr> = [
            "--iface",
            va.as_str(),
            "--dispatch",
            "xdp",
            "--xdp-mode",
            mode,
            "--queues",
            "0-3",
            "--nf",
            "monitor",
            "--workers",
            "2",
            "--shift",
            "40",
            "--no-pin",
            "--duration",
            "6",
            "--tenants",
            tf,
            "--stats-json",
            stats.to_str().unwrap(),
        ]
        .iter()
        .map(|s| std::ffi::OsStr::new(*s))
        .collect();
        let (sent, out, err) = run_sending_on_four_queues(&ns, &args, &pcap, &vb, packets);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode}: buffet run: {err}{stdout}");
        assert!(
            err.contains(&format!(
                "xdp dispatcher attached to {va} in {mode} mode, 2 workers' sockets on queues 0,1,2,3"
            )),
            "{mode}: {err}"
        );
        assert_eq!(
            sent[1..].iter().sum::<u64>(),
            total,
            "{mode}: sent {sent:?}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        // Workers vs sender.
        let by_id = tenant_rows(&json);
        let want: Vec<(u64, u64, u64)> = t
            .per_tenant
            .iter()
            .map(|&(id, k)| (u64::from(id), k, k))
            .collect();
        assert_eq!(
            by_id, want,
            "{mode}: per tenant (id, packets, passed)\n{stdout}"
        );
        // The XDP maps vs sender.
        let x = &json["input"]["xdp"];
        assert_eq!(x["packets"].as_u64(), Some(total), "{mode}: {x}");
        assert_eq!(x["passed"].as_u64(), Some(packets), "{mode}: {x}");
        assert_eq!(x["unmatched"].as_u64(), Some(t.unmatched), "{mode}: {x}");
        assert_eq!(x["malformed"].as_u64(), Some(t.malformed), "{mode}: {x}");
        assert_eq!(x["no_socket"].as_u64(), Some(0), "{mode}: {x}");
        assert_xdp_table_agrees(x, &t, mode);
        // Per receive queue: the passed frames the sender put on each transmit queue
        // (frame i on queue i % 4), moved as the mode moves them.
        let mut per_queue = [0u64; 4];
        for (i, &id) in t.tenant_of.iter().enumerate() {
            if id != 0 {
                let q = i % 4;
                let rq = if mode == "native" {
                    q
                } else {
                    q.saturating_sub(1)
                };
                per_queue[rq] += 1;
            }
        }
        let port = &json["input"]["ports"][0];
        assert_eq!(port["rx"].as_u64(), Some(packets), "{mode}: {port}");
        assert_eq!(port["rx_dropped"].as_u64(), Some(0), "{mode}: {port}");
        assert_eq!(port["tx"].as_u64(), Some(packets), "{mode}: {port}");
        assert_eq!(
            sent[0], packets,
            "{mode}: every passed frame came back out, once"
        );
        let sockets = port["sockets"].as_array().unwrap();
        let who: Vec<(String, u64)> = sockets
            .iter()
            .map(|k| {
                (
                    k["socket"].as_str().unwrap().to_owned(),
                    k["queue"].as_u64().unwrap(),
                )
            })
            .collect();
        let mut want_who: Vec<(String, u64)> = (0..4).map(|q| ("port".to_owned(), q)).collect();
        for w in 0..2 {
            want_who.extend((0..4).map(|q| (format!("worker {w}"), q)));
        }
        assert_eq!(who, want_who, "{mode}: one socket per (queue, worker)");
        let mut got_queue = [0u64; 4];
        for k in sockets {
            assert_eq!(k["rx_dropped"].as_u64(), Some(0), "{mode}: {k}");
            assert_eq!(k["rx_ring_full"].as_u64(), Some(0), "{mode}: {k}");
            assert_eq!(k["rx_invalid_descs"].as_u64(), Some(0), "{mode}: {k}");
            let n = k["received"].as_u64().unwrap();
            if k["socket"] == "port" {
                assert_eq!(
                    n, 0,
                    "{mode}: nothing is redirected to the port's sockets: {k}"
                );
            } else {
                got_queue[k["queue"].as_u64().unwrap() as usize] += n;
            }
        }
        assert_eq!(
            got_queue, per_queue,
            "{mode}: passed frames received per queue"
        );
        assert!(
            got_queue.iter().filter(|&&n| n > 0).count() > 1,
            "{mode}: frames arrived on more than one queue: {got_queue:?}"
        );
        let busy = sockets
            .iter()
            .filter(|k| k["socket"] != "port" && k["received"].as_u64() > Some(0))
            .count();
        assert!(
            busy > 2,
            "{mode}: several workers' sockets received: {port}"
        );
        assert!(
            stdout.contains("  socket worker 1 (queue 2): rx_dropped 0 rx_ring_full 0"),
            "{mode}: {stdout}"
        );
        assert_eq!(
            xdp_attached(&ns.a, &va),
            None,
            "{mode}: detached at the end"
        );
    }
}

/// Runs in namespace B: sends the frames of the pcap `BUFFET_FLOOD_SEND` round robin out
/// of `BUFFET_FLOOD_IFACE`, in bursts of 64 and as fast as the link takes them, for
/// `BUFFET_FLOOD_SECS` seconds, then prints `FLOOD-SENT <frames>`. Does nothing when
/// `BUFFET_FLOOD_SEND` is unset.
#[test]
#[ignore = "helper: run by the flood tests inside a network namespace"]
fn flood_helper() {
    let Ok(pcap) = std::env::var("BUFFET_FLOOD_SEND") else {
        return;
    };
    let iface = std::env::var("BUFFET_FLOOD_IFACE").unwrap();
    let secs: f64 = std::env::var("BUFFET_FLOOD_SECS").unwrap().parse().unwrap();
    let mut frames = Vec::new();
    let mut reader = buffet::io::pcap::PcapReader::open(Path::new(&pcap)).unwrap();
    while let Some(p) = buffet::io::PacketSource::next_packet(&mut reader).unwrap() {
        frames.push(p.data.to_vec());
    }
    let mut port = buffet::io::afpacket::AfPacketPort::open(
        buffet::io::afpacket::AfPacketConfig::new(&iface, 0),
    )
    .unwrap();
    let mut pool = HeapPool::new(256);
    let mut burst = Vec::new();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut i = 0;
    while Instant::now() < until {
        for _ in 0..64 {
            let mut b = pool.take().unwrap();
            assert!(b.fill(&frames[i % frames.len()]));
            burst.push(b);
            i += 1;
        }
        port.tx_burst(&mut burst, &mut pool).unwrap();
    }
    println!("FLOOD-SENT {}", port.stats().tx);
}

/// Floods `ns.vb` with `frames` for `secs` seconds from namespace B (see
/// [`flood_helper`]); the caller waits for the child.
fn start_flood(ns: &NsPair, dir: &Path, frames: &[Vec<u8>], secs: f64) -> std::process::Child {
    let pcap = dir.join("flood.pcap");
    write_pcap(&pcap, frames);
    ns_helper(&ns.b, "flood_helper")
        .env("BUFFET_FLOOD_SEND", &pcap)
        .env("BUFFET_FLOOD_IFACE", &ns.vb)
        .env("BUFFET_FLOOD_SECS", secs.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `buffet run --dispatch xdp --xdp-mode generic` (plus `extra`) on A, flooded from B
/// with `frames` (with `pause`, buffet is stopped, SIGSTOP, for a second of it: its
/// workers read nothing meanwhile); SIGTERM while the flood still runs; returns the stats
/// JSON and stdout.
fn xdp_run_stopped_under_flood(
    ns: &NsPair,
    frames: &[Vec<u8>],
    extra: &[&str],
    pause: bool,
) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("t.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let stats = dir.path().join("s.json");
    let fixed = [
        "--iface",
        ns.va.as_str(),
        "--dispatch",
        "xdp",
        "--xdp-mode",
        "generic",
        "--nf",
        "monitor",
        "--no-pin",
    ];
    let mut args: Vec<&std::ffi::OsStr> = fixed.iter().map(|s| s.as_ref()).collect();
    args.extend(extra.iter().map(|s| -> &std::ffi::OsStr { s.as_ref() }));
    args.extend(["--tenants".as_ref(), tenants.as_os_str()]);
    args.extend(["--stats-json".as_ref(), stats.as_os_str()]);
    let (child, stderr) = start_run(&ns.a, &args);
    let flood = start_flood(ns, dir.path(), frames, 4.0);
    if pause {
        std::thread::sleep(Duration::from_millis(500));
        signal(&child, "STOP");
        std::thread::sleep(Duration::from_millis(1000));
        signal(&child, "CONT");
        std::thread::sleep(Duration::from_millis(500));
    } else {
        std::thread::sleep(Duration::from_millis(2000));
    }
    signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    let f = flood.wait_with_output().unwrap();
    assert!(
        f.status.success(),
        "flood: {}{}",
        String::from_utf8_lossy(&f.stdout),
        String::from_utf8_lossy(&f.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{err}{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    (json, stdout)
}

/// `--dispatch xdp` stopped by SIGTERM in the middle of a flood: the frames the workers
/// complete while stopping are sent before the port's counters are read, so the port's
/// `tx` and `tx_dropped` (in `--stats-json` and on stdout) add up to the frames the
/// tenants passed, exactly.
#[test]
fn xdp_dispatch_stopped_under_flood_reports_every_passed_frame_sent() {
    let test = "live::xdp_dispatch_stopped_under_flood_reports_every_passed_frame_sent";
    if !privileged(test) {
        return;
    }
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
        return;
    }
    let ns = NsPair::new();
    let t = traffic();
    let frames: Vec<Vec<u8>> = t
        .frames
        .iter()
        .zip(&t.tenant_of)
        .filter(|(_, &id)| id != 0)
        .map(|(f, _)| f.clone())
        .collect();
    let (json, stdout) = xdp_run_stopped_under_flood(&ns, &frames, &["--workers", "2"], false);
    let passed: u64 = tenant_rows(&json).iter().map(|r| r.2).sum();
    assert!(passed > 10_000, "a flood: {passed} frames passed");
    let port = &json["input"]["ports"][0];
    let (tx, tx_dropped) = (
        port["tx"].as_u64().unwrap(),
        port["tx_dropped"].as_u64().unwrap(),
    );
    assert_eq!(
        tx + tx_dropped,
        passed,
        "the port's tx + tx_dropped are the frames passed: {port}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("port "))
        .unwrap_or_default();
    assert!(
        line.contains(&format!(" tx {tx} "))
            && line.ends_with(&format!(" tx_dropped {tx_dropped}")),
        "stdout says the same: {stdout}"
    );
}

/// `--dispatch xdp` with one worker flooded while it reads nothing (buffet stopped with
/// SIGSTOP for a second): the kernel drops frames at the worker's AF_XDP socket (its
/// receive ring full, its fill ring empty)
/// that the program counted as passed. They are `global.socket_dropped` (and a line
/// under the table's `input` line), so the global counts still add up to the frames the
/// program saw: tenants' packets and policed + unmatched + malformed + no_live_worker +
/// no_socket + untagged + socket_dropped = input.
#[test]
fn xdp_dispatch_counts_frames_dropped_at_a_workers_socket_globally() {
    let test = "live::xdp_dispatch_counts_frames_dropped_at_a_workers_socket_globally";
    if !privileged(test) {
        return;
    }
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
        return;
    }
    let ns = NsPair::new();
    let t = traffic();
    let (json, stdout) = xdp_run_stopped_under_flood(&ns, &t.frames, &["--workers", "1"], true);
    let g = &json["global"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let socket_dropped = n(&g["socket_dropped"]);
    let lost: u64 = json["input"]["ports"][0]["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["worker"].is_u64())
        .map(|s| n(&s["rx_dropped"]) + n(&s["rx_ring_full"]) + n(&s["rx_invalid_descs"]))
        .sum();
    assert!(lost > 0, "the flood overran the worker's socket: {json}");
    assert_eq!(socket_dropped, lost, "the workers' sockets' drops: {g}");
    let tenants: u64 = json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| n(&x["packets"]) + n(&x["drops"]["policed"]))
        .sum();
    let malformed: u64 = g["malformed"].as_object().unwrap().values().map(n).sum();
    let accounted = tenants
        + n(&g["unmatched"])
        + malformed
        + n(&g["no_live_worker"])
        + n(&g["no_socket"])
        + n(&g["untagged"])
        + socket_dropped;
    assert_eq!(
        n(&g["input_packets"]),
        accounted,
        "every frame the program saw is accounted for: {g}"
    );
    assert_eq!(
        json["input"]["xdp"]["passed"].as_u64().unwrap(),
        n(&json["input"]["packets"]) + n(&g["no_socket"]) + socket_dropped,
        "the program's passed frames: received by the workers, or dropped at their sockets"
    );
    assert!(
        stdout.contains(&format!("(socket_dropped): {socket_dropped}\n")),
        "{stdout}"
    );
}

/// Runs in namespace B: sends `BUFFET_GSO_COUNT` UDP datagrams of 8000 bytes with UDP
/// GSO (8 segments of 1000 bytes) to `BUFFET_GSO_DST`: each crosses the veth as one
/// super-packet. Does nothing when `BUFFET_GSO_DST` is unset.
#[test]
#[ignore = "helper: run by live_super_packets_are_oversize inside a network namespace"]
fn gso_sender_helper() {
    let Ok(dst) = std::env::var("BUFFET_GSO_DST") else {
        return;
    };
    let n: u32 = std::env::var("BUFFET_GSO_COUNT").unwrap().parse().unwrap();
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    buffet_testkit::net::set_udp_segment(&s, 1000).unwrap();
    for _ in 0..n {
        assert_eq!(s.send_to(&[b'g'; 8000], dst.as_str()).unwrap(), 8000);
    }
}

/// Frames larger than a frame buffer on a live port — here UDP GSO super-packets from
/// the veth peer (8 segments of 1000 bytes crossing as one 8 kB frame; GRO/LRO on a
/// NIC makes the same) — are counted as input and oversize in the report, with every
/// port: AF_PACKET, `--port af-xdp` (generic mode: the kernel drops them at the socket)
/// and `--dispatch xdp` (dropped at the worker's socket); and the run warns once on
/// stderr, naming the interface and the ethtool commands that turn the offloads off.
#[test]
fn live_super_packets_are_oversize() {
    let test = "live::live_super_packets_are_oversize";
    if !privileged(test) {
        return;
    }
    let mut variants: Vec<&[&str]> = vec![&[], &["--port", "af-xdp", "--xdp-mode", "generic"]];
    match buffet_xdp::UNAVAILABLE {
        None => variants.push(&["--dispatch", "xdp", "--xdp-mode", "generic"]),
        Some(why) => {
            gate::skip_privileged(
                &format!("{test} (--dispatch xdp)"),
                format_args!("xdp engine unavailable: {why}"),
            );
        }
    }
    for extra in variants {
        let ns = NsPair::new();
        let dir = tempfile::tempdir().unwrap();
        let tenants = dir.path().join("t.toml");
        std::fs::write(&tenants, TENANTS).unwrap();
        let stats = dir.path().join("s.json");
        // B reaches 10.1.0.1 (tenant 1's prefix) through the veth, at A's address.
        let link = Command::new("ip")
            .args(["-n", &ns.a, "link", "show", &ns.va])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&link.stdout).into_owned();
        let mac = link
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap()
            .to_owned();
        ip(&["-n", &ns.b, "addr", "add", "10.1.0.2/16", "dev", &ns.vb]);
        ip(&[
            "-n", &ns.b, "neigh", "add", "10.1.0.1", "lladdr", &mac, "dev", &ns.vb,
        ]);
        let fixed = ["--iface", ns.va.as_str(), "--nf", "monitor", "--no-pin"];
        let mut args: Vec<&std::ffi::OsStr> = fixed.iter().map(|s| s.as_ref()).collect();
        args.extend(extra.iter().map(|s| -> &std::ffi::OsStr { s.as_ref() }));
        args.extend(["--tenants".as_ref(), tenants.as_os_str()]);
        args.extend(["--stats-json".as_ref(), stats.as_os_str()]);
        let (child, stderr) = start_run(&ns.a, &args);
        let sender = ns_helper(&ns.b, "gso_sender_helper")
            .env("BUFFET_GSO_DST", "10.1.0.1:53")
            .env("BUFFET_GSO_COUNT", "20")
            .output()
            .unwrap();
        assert!(
            sender.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&sender.stderr)
        );
        std::thread::sleep(Duration::from_millis(1500));
        signal(&child, "TERM");
        let out = child.wait_with_output().unwrap();
        let err = stderr.join().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{extra:?}: {err}{stdout}");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        let g = &json["global"];
        assert_eq!(g["oversize"].as_u64(), Some(20), "{extra:?}: {g}\n{stdout}");
        assert_eq!(g["input_packets"].as_u64(), Some(20), "{extra:?}: {g}");
        assert_eq!(g.get("socket_dropped"), None, "{extra:?}: {g}");
        assert!(
            stdout.contains("oversize 20\n"),
            "{extra:?}: the table's input line\n{stdout}"
        );
        let warned: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
        assert_eq!(warned.len(), 1, "{extra:?}: one warning\n{err}");
        let w = warned[0];
        for part in [
            format!(
                "{} delivers frames larger than a 2048-byte frame buffer",
                ns.va
            ),
            "GRO/LRO".to_owned(),
            "TSO/GSO".to_owned(),
            format!("`ethtool -K {} gro off lro off`", ns.va),
            "`ethtool -K PEER tso off gso off`".to_owned(),
        ] {
            assert!(w.contains(&part), "{extra:?}: {part:?} in {w}");
        }
    }
}

/// The interface deleted in the middle of a run (here the veth, with the software
/// dispatcher, `--port af-xdp` and `--dispatch xdp`): the run notices within about a
/// second, stops, prints its report and writes `--stats-json` as on SIGTERM, and ends
/// with an error naming the interface (exit status 1).
#[test]
fn a_deleted_interface_stops_the_run_with_its_report_and_an_error() {
    let test = "live::a_deleted_interface_stops_the_run_with_its_report_and_an_error";
    if !privileged(test) {
        return;
    }
    let mut variants = dispatch_variants(test);
    variants.push(&["--port", "af-xdp", "--xdp-mode", "generic"]);
    for extra in variants {
        let ns = NsPair::new();
        let dir = tempfile::tempdir().unwrap();
        let tenants = dir.path().join("t.toml");
        std::fs::write(&tenants, TENANTS).unwrap();
        let stats = dir.path().join("s.json");
        let fixed = ["--iface", ns.va.as_str(), "--nf", "monitor", "--no-pin"];
        let mut args: Vec<&std::ffi::OsStr> = fixed.iter().map(|s| s.as_ref()).collect();
        args.extend(extra.iter().map(|s| -> &std::ffi::OsStr { s.as_ref() }));
        args.extend(["--tenants".as_ref(), tenants.as_os_str()]);
        args.extend(["--stats-json".as_ref(), stats.as_os_str()]);
        let (child, stderr) = start_run(&ns.a, &args);
        std::thread::sleep(Duration::from_millis(500));
        ip(&["-n", &ns.a, "link", "del", &ns.va]);
        let deleted = Instant::now();
        let mut child = child;
        while child.try_wait().unwrap().is_none() {
            if deleted.elapsed() > Duration::from_secs(8) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{extra:?}: still running 8 s after its interface was deleted\n{}",
                    stderr.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err = stderr.join().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "{extra:?}: stopped promptly"
        );
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}{stdout}");
        assert!(
            err.contains(&format!(
                "error: interface {} is gone (deleted, or moved to another network \
                 namespace) during the run",
                ns.va
            )),
            "{extra:?}: {err}"
        );
        assert!(
            stdout.contains("tenant name") && stdout.contains("\ninput "),
            "{extra:?}: the report\n{stdout}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert_eq!(json["tenants"].as_array().unwrap().len(), 10, "{extra:?}");
    }
}

/// An idle `buffet run` (either dispatcher, AF_PACKET and AF_XDP ports) blocks on its
/// sockets instead of polling: over 2 s without traffic it uses well below a core
/// (polling, its dispatcher and two workers used about half a core here, over a core on
/// an idle machine), and frames sent after the idle period still all get through.
#[test]
fn an_idle_run_sleeps_and_still_wakes_for_traffic() {
    if !privileged("live::an_idle_run_sleeps_and_still_wakes_for_traffic") {
        return;
    }
    let variants: [&[&str]; 3] = [
        &[],
        &["--port", "af-xdp", "--xdp-mode", "generic"],
        &["--dispatch", "xdp", "--xdp-mode", "generic"],
    ];
    for extra in variants {
        let ns = NsPair::new();
        let dir = tempfile::tempdir().unwrap();
        let t = traffic();
        let tenants = dir.path().join("tenants.toml");
        std::fs::write(&tenants, TENANTS).unwrap();
        let pcap = dir.path().join("send.pcap");
        write_pcap(&pcap, &t.frames);
        let stats = dir.path().join("stats.json");
        let mut args: Vec<std::ffi::OsString> = [
            "--iface",
            &ns.va,
            "--workers",
            "2",
            "--no-pin",
            "--duration",
            "7",
            "--nf",
            "monitor",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.extend(["--tenants".into(), tenants.into_os_string()]);
        args.extend(["--stats-json".into(), stats.clone().into_os_string()]);
        args.extend(extra.iter().map(Into::into));
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let (child, stderr) = start_run(&ns.a, &args);
        std::thread::sleep(Duration::from_millis(500));
        let cores = cores_used_over(child.id(), Duration::from_secs(2));
        eprintln!("idle buffet run {extra:?}: {cores:.3} cores");
        assert!(
            cores < 0.2,
            "idle buffet run {extra:?} used {cores:.3} cores over 2 s without traffic"
        );
        let passed: u64 = t.per_tenant.iter().map(|(_, k)| k).sum();
        let (sent, back) = send_from_b(&ns, &pcap, passed, &dir.path().join("sender.txt"));
        let out = child.wait_with_output().unwrap();
        let err = stderr.join().unwrap();
        assert!(out.status.success(), "buffet run {extra:?}: {err}");
        assert_eq!(sent, t.frames.len() as u64);
        assert_eq!(
            back, passed,
            "{extra:?}: every tenant frame came back after idling"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        let want: Vec<(u64, u64, u64)> = t
            .per_tenant
            .iter()
            .map(|&(id, k)| (u64::from(id), k, k))
            .collect();
        assert_eq!(tenant_rows(&json), want, "{extra:?}");
    }
}

/// Native XDP on a veth whose MTU is 9000: the kernel refuses the program with a bare
/// ERANGE; `--port af-xdp` and `--dispatch xdp` say what it means (the driver's native
/// XDP cannot take frames of that MTU) and what to do (the veth's limit, or generic
/// mode), and leave nothing attached.
#[test]
fn native_xdp_on_a_jumbo_mtu_veth_says_what_to_do() {
    if !privileged("live::native_xdp_on_a_jumbo_mtu_veth_says_what_to_do") {
        return;
    }
    let ns = NsPair::new();
    ip(&["-n", &ns.a, "link", "set", &ns.va, "mtu", "9000"]);
    ip(&["-n", &ns.b, "link", "set", &ns.vb, "mtu", "9000"]);
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let tenants = tenants.to_str().unwrap();
    let variants = dispatch_variants("live::native_xdp_on_a_jumbo_mtu_veth_says_what_to_do");
    // The software dispatcher's AF_XDP port, and the XDP Packet Dispatcher where built.
    for dispatch in variants.iter().map(|v| match v {
        [] => &["--port", "af-xdp"][..],
        v => v,
    }) {
        let mut args = vec![
            "--iface",
            &ns.va,
            "--nf",
            "monitor",
            "--tenants",
            tenants,
            "--duration",
            "1",
            "--xdp-mode",
            "native",
        ];
        args.extend_from_slice(dispatch);
        let out = run_output(Some(&ns.a), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{dispatch:?}: {err}");
        assert!(
            err.contains("native XDP cannot take frames of this interface's MTU (9000 bytes)")
                && err.contains("at most 3506")
                && err.contains("--xdp-mode generic"),
            "{dispatch:?}: {err}"
        );
        assert!(!err.contains("Numerical result out of range"), "{err}");
        assert_eq!(xdp_attached(&ns.a, &ns.va), None, "{dispatch:?}");
    }
}

/// buffetd on a live port — AF_PACKET, an AF_XDP port (generic mode) and the XDP Packet
/// Dispatcher — while UDP GSO super-packets come from the veth peer: `/v1/stats` counts
/// them as input and oversize while the daemon runs, not only in the report it ends
/// with (a live port's oversize drops are read when a report is asked for; the XDP
/// Packet Dispatcher's, from the workers' sockets).
#[test]
fn buffetd_counts_super_packets_as_oversize_while_it_runs() {
    let test = "live::buffetd_counts_super_packets_as_oversize_while_it_runs";
    if !privileged(test) {
        return;
    }
    let mut ports = vec![
        "kind = \"af_packet\"\n",
        "kind = \"af_xdp\"\nxdp_mode = \"generic\"\n",
    ];
    match buffet_xdp::UNAVAILABLE {
        None => {
            ports.push("kind = \"af_xdp\"\nxdp_mode = \"generic\"\n[dispatch]\nmode = \"xdp\"\n")
        }
        Some(why) => {
            gate::skip_privileged(
                &format!("{test} (dispatch.mode = \"xdp\")"),
                format_args!("xdp engine unavailable: {why}"),
            );
        }
    }
    for port in ports {
        let ns = NsPair::new();
        let dir = tempfile::tempdir().unwrap();
        // The port table last: the XDP variant's [dispatch] table follows it.
        let mut daemon = daemon_in_a(
            &ns,
            dir.path(),
            (7981, "monitor"),
            &format!(
                "[dataplane]\nworkers = 1\narena_mib = 64\ntenant_slots = 16\n\
                 [[port]]\niface = \"{}\"\n{port}",
                ns.va
            ),
            "admin-token-for-the-live-oversize-test",
        );
        let (ok, _, err) =
            daemon.client(&["tenant", "add", "--id", "1", "--rule", "dst_ip=10.1.0.0/16"]);
        assert!(ok, "{port:?}: {err}");
        // B reaches 10.1.0.1 (tenant 1's prefix) through the veth, at A's address.
        let link = Command::new("ip")
            .args(["-n", &ns.a, "link", "show", &ns.va])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&link.stdout).into_owned();
        let mac = link
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap()
            .to_owned();
        ip(&["-n", &ns.b, "addr", "add", "10.1.0.2/16", "dev", &ns.vb]);
        ip(&[
            "-n", &ns.b, "neigh", "add", "10.1.0.1", "lladdr", &mac, "dev", &ns.vb,
        ]);
        let sender = ns_helper(&ns.b, "gso_sender_helper")
            .env("BUFFET_GSO_DST", "10.1.0.1:53")
            .env("BUFFET_GSO_COUNT", "20")
            .output()
            .unwrap();
        assert!(
            sender.status.success(),
            "{port:?}: {}",
            String::from_utf8_lossy(&sender.stderr)
        );
        let t0 = Instant::now();
        let v = loop {
            let (ok, v, err) = daemon.client(&["stats"]);
            assert!(ok, "{port:?}: {err}");
            if v["global"]["oversize"].as_u64() == Some(20) {
                break v;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{port:?}: 20 oversize while buffetd runs: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let g = &v["global"];
        assert_eq!(g["input_packets"].as_u64(), Some(20), "{port:?}: {g}");
        assert_eq!(g.get("socket_dropped"), None, "{port:?}: {g}");
        // Asked again, nothing counts twice.
        let (_, again, _) = daemon.client(&["stats"]);
        assert_eq!(again["global"]["oversize"].as_u64(), Some(20), "{port:?}");
        daemon.signal("TERM");
        assert!(daemon.child.wait().unwrap().success(), "{port:?}");
    }
}

/// Lines of a child's stderr as they come, kept for the test to wait on.
struct Lines(std::sync::Arc<std::sync::Mutex<String>>);

impl Lines {
    fn read(from: impl Read + Send + 'static) -> Lines {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { break };
                let mut s = into.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Lines(seen)
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    /// Waits up to 5 s for a line containing `what`.
    fn wait_for(&self, what: &str) {
        let t0 = Instant::now();
        while !self.text().contains(what) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "no line with {what:?} in:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `n` marked UDP frames to tenant 1 (10.1.0.0/16), in a pcap under `dir`.
fn frames_to_tenant_1(dir: &Path, n: u32) -> PathBuf {
    let frames: Vec<Vec<u8>> = (0..n)
        .map(|seq| udp4([172, 16, 0, 1], [10, 1, 0, 1], 40000, 80, seq))
        .collect();
    let pcap = dir.join(format!("tenant1-{n}.pcap"));
    write_pcap(&pcap, &frames);
    pcap
}

/// buffetd's interface goes down under it, comes back, goes down again and is deleted.
/// The packet socket reports the loss once (POLLERR until its error is read): buffetd
/// says so once, does not spin on the socket meanwhile (it used about 0.3 cores,
/// silently, before it read the error), and counts frames again once the interface is
/// up. Deleted while down, it says the interface is gone.
#[test]
fn buffetd_says_when_its_interface_goes_down_and_counts_again_once_up() {
    if !privileged("live::buffetd_says_when_its_interface_goes_down_and_counts_again_once_up") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tail = af_packet_dataplane(1, &ns.va);
    let mut daemon = daemon_in_a(
        &ns,
        dir.path(),
        (7982, "monitor"),
        &tail,
        "admin-token-for-the-link-loss-test",
    );
    let stderr = Lines::read(daemon.child.stderr.take().unwrap());
    let (ok, _, err) =
        daemon.client(&["tenant", "add", "--id", "1", "--rule", "dst_ip=10.1.0.0/16"]);
    assert!(ok, "{err}");
    let pid = daemon.child.id();

    ip(&["-n", &ns.a, "link", "set", &ns.va, "down"]);
    let down = format!(
        "interface {} went down: nothing arrives until it is up again",
        ns.va
    );
    stderr.wait_for(&down);
    let cores = cores_used_over(pid, Duration::from_secs(2));
    assert!(
        cores < 0.15,
        "buffetd used {cores:.3} cores with its interface down (idle: about 0.05)"
    );

    ip(&["-n", &ns.a, "link", "set", &ns.va, "up"]);
    // The link needs a moment before a veth carries frames again.
    std::thread::sleep(Duration::from_millis(500));
    let pcap = frames_to_tenant_1(dir.path(), 100);
    let (sent, back) = send_from_b(&ns, &pcap, 100, &dir.path().join("sender.txt"));
    assert_eq!((sent, back), (100, 100), "{}", stderr.text());
    let (ok, v, err) = daemon.client(&["stats"]);
    assert!(ok, "{err}");
    assert_eq!(tenant_rows(&v), vec![(1, 100, 100)], "{v}");

    let text = stderr.text();
    assert_eq!(text.matches(&down).count(), 1, "said once:\n{text}");

    // Down again, then deleted while down: the socket says nothing more (it no longer
    // receives), so only buffetd's second look (about once a second while an interface
    // is down) finds it gone.
    ip(&["-n", &ns.a, "link", "set", &ns.va, "down"]);
    let t0 = Instant::now();
    while stderr.text().matches(&down).count() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(5), "{}", stderr.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    ip(&["-n", &ns.a, "link", "del", &ns.va]);
    stderr.wait_for(&format!(
        "interface {} is gone (deleted, or moved to another network namespace)",
        ns.va
    ));
    let cores = cores_used_over(pid, Duration::from_secs(1));
    assert!(
        cores < 0.15,
        "buffetd used {cores:.3} cores without its interface"
    );
    daemon.signal("TERM");
    assert!(daemon.child.wait().unwrap().success());
}

/// buffetd whose data plane never blocks on its socket (`idle_wait_us = 0`: it naps
/// between polls, so poll(2) never reports the socket's error) still says when its
/// interface goes down: it asks the socket for a pending error every so many turns. Up
/// again, it counts what arrives.
#[test]
fn buffetd_that_never_blocks_still_says_when_its_interface_goes_down() {
    if !privileged("live::buffetd_that_never_blocks_still_says_when_its_interface_goes_down") {
        return;
    }
    let ns = NsPair::new();
    let dir = tempfile::tempdir().unwrap();
    let tail =
        af_packet_dataplane(1, &ns.va).replace("[dataplane]\n", "[dataplane]\nidle_wait_us = 0\n");
    let mut daemon = daemon_in_a(
        &ns,
        dir.path(),
        (7983, "monitor"),
        &tail,
        "admin-token-for-the-busy-link-loss-test",
    );
    let stderr = Lines::read(daemon.child.stderr.take().unwrap());
    let (ok, _, err) =
        daemon.client(&["tenant", "add", "--id", "1", "--rule", "dst_ip=10.1.0.0/16"]);
    assert!(ok, "{err}");

    ip(&["-n", &ns.a, "link", "set", &ns.va, "down"]);
    let down = format!(
        "interface {} went down: nothing arrives until it is up again",
        ns.va
    );
    stderr.wait_for(&down);
    ip(&["-n", &ns.a, "link", "set", &ns.va, "up"]);
    std::thread::sleep(Duration::from_millis(500));
    let pcap = frames_to_tenant_1(dir.path(), 100);
    let (sent, back) = send_from_b(&ns, &pcap, 100, &dir.path().join("sender.txt"));
    assert_eq!((sent, back), (100, 100), "{}", stderr.text());
    let text = stderr.text();
    assert_eq!(text.matches(&down).count(), 1, "said once:\n{text}");
    daemon.signal("TERM");
    assert!(daemon.child.wait().unwrap().success());
}

/// `buffet run`'s interface goes down mid-run and comes back: the run goes on (it ended,
/// or spun on the socket's error, before), says both on stderr, lists the port's event in
/// its report, and counts the frames sent once the interface is up again.
#[test]
fn a_run_goes_on_when_its_interface_goes_down_and_comes_back() {
    if !privileged("live::a_run_goes_on_when_its_interface_goes_down_and_comes_back") {
        return;
    }
    let ns = NsPair::new();
    let r = run_through_a_link_change(&ns, &ns.a, &ns.va);
    assert!(
        r.cores_while_down < 0.15,
        "buffet run used {:.3} cores with its interface down (idle: about 0.05)",
        r.cores_while_down
    );
    let down = format!(
        "interface {} is down: nothing arrives until it is up again",
        ns.va
    );
    let up = format!("interface {} is up again", ns.va);
    let (d, u) = (r.stderr.find(&down), r.stderr.find(&up));
    assert!(d.is_some() && u > d, "down, then up:\n{}", r.stderr);
    assert!(
        r.stdout.contains(&format!(
            "port af_packet:{0}: interface {0} went down: nothing arrives until it is up again",
            ns.va
        )),
        "{}",
        r.stdout
    );
}

/// The far end of `buffet run`'s link goes down mid-run (the veth peer, as a pulled
/// cable would): the interface stays up but has no carrier. The run says so, not
/// "down", goes on, says when it is up again, and counts the frames sent then.
#[test]
fn a_run_says_when_its_link_loses_its_carrier_and_gets_it_back() {
    if !privileged("live::a_run_says_when_its_link_loses_its_carrier_and_gets_it_back") {
        return;
    }
    let ns = NsPair::new();
    let r = run_through_a_link_change(&ns, &ns.b, &ns.vb);
    let lost = format!(
        "interface {} has no carrier (its cable or far end is down): nothing arrives until \
         it is up again",
        ns.va
    );
    let up = format!("interface {} is up again", ns.va);
    let (l, u) = (r.stderr.find(&lost), r.stderr.find(&up));
    assert!(l.is_some() && u > l, "no carrier, then up:\n{}", r.stderr);
    assert!(
        !r.stderr.contains(&format!("interface {} is down", ns.va)),
        "{}",
        r.stderr
    );
}

/// What [`run_through_a_link_change`] saw.
struct LinkChangeRun {
    stderr: String,
    stdout: String,
    /// Cores the run used while the link was down.
    cores_while_down: f64,
}

/// Runs `buffet run` on `ns.va` (monitor, tenant 1, 7 s), sets `iface` of namespace
/// `netns` down for 1.5 s and up again, then sends 100 frames of tenant 1 from the far
/// end: the run must end well, with every frame back and counted.
fn run_through_a_link_change(ns: &NsPair, netns: &str, iface: &str) -> LinkChangeRun {
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
    )
    .unwrap();
    let stats = dir.path().join("stats.json");
    let args: Vec<std::ffi::OsString> = vec![
        "--iface".into(),
        ns.va.clone().into(),
        "--nf".into(),
        "monitor".into(),
        "--workers".into(),
        "1".into(),
        "--no-pin".into(),
        "--duration".into(),
        "7".into(),
        "--tenants".into(),
        tenants.into_os_string(),
        "--stats-json".into(),
        stats.clone().into_os_string(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (child, stderr) = start_run(&ns.a, &args);
    ip(&["-n", netns, "link", "set", iface, "down"]);
    // The run's watcher looks once a second; the data plane reads the socket's error
    // at once.
    std::thread::sleep(Duration::from_millis(1500));
    let cores_while_down = cores_used_over(child.id(), Duration::from_millis(1500));
    ip(&["-n", netns, "link", "set", iface, "up"]);
    std::thread::sleep(Duration::from_millis(1500));
    let pcap = frames_to_tenant_1(dir.path(), 100);
    let (sent, back) = send_from_b(ns, &pcap, 100, &dir.path().join("sender.txt"));
    let out = child.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "buffet run: {err}{stdout}");
    assert_eq!((sent, back), (100, 100), "{err}{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(tenant_rows(&json), vec![(1, 100, 100)], "{json}");
    LinkChangeRun {
        stderr: err,
        stdout,
        cores_while_down,
    }
}
