//! What the live-link tests share (tests/live.rs, tests/live_dpdk.rs): two network
//! namespaces joined by a veth pair, the privilege gate, `buffet run` started inside a
//! namespace, and the sender that runs in the peer namespace.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use buffet::io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet::io::pcap::PcapReader;
use buffet::io::{HeapPool, PacketSource, Port};
use buffet_testkit::gate;

const BUFFET: &str = env!("CARGO_BIN_EXE_buffet");

/// Two network namespaces joined by a veth pair, named uniquely for this run; deleted
/// (with the pair) on drop, panics included.
pub struct NsPair {
    pub a: String,
    pub b: String,
    pub va: String,
    pub vb: String,
}

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NsPair {
    pub fn new() -> NsPair {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}x{}",
            std::process::id() % 100_000,
            N.fetch_add(1, Ordering::Relaxed)
        );
        let ns = NsPair {
            a: format!("buffet-a-{tag}"),
            b: format!("buffet-b-{tag}"),
            va: format!("bfa{tag}"),
            vb: format!("bfb{tag}"),
        };
        ip(&["netns", "add", &ns.a]);
        ip(&["netns", "add", &ns.b]);
        for n in [&ns.a, &ns.b] {
            // No IPv6 on the links: no router solicitations or MLD reports in the counts.
            ip(&[
                "netns",
                "exec",
                n,
                "sysctl",
                "-qw",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]);
        }
        ip(&[
            "link", "add", &ns.va, "netns", &ns.a, "type", "veth", "peer", "name", &ns.vb, "netns",
            &ns.b,
        ]);
        ip(&["-n", &ns.a, "link", "set", &ns.va, "up"]);
        ip(&["-n", &ns.b, "link", "set", &ns.vb, "up"]);
        ns
    }

    /// A second veth pair between the two namespaces, up: its (A side, B side) names,
    /// those of the first with a `t` appended (a `--tx-iface` and its capture).
    pub fn second_pair(&self) -> (String, String) {
        let (va2, vb2) = (format!("{}t", self.va), format!("{}t", self.vb));
        ip(&[
            "link", "add", &va2, "netns", &self.a, "type", "veth", "peer", "name", &vb2, "netns",
            &self.b,
        ]);
        ip(&["-n", &self.a, "link", "set", &va2, "up"]);
        ip(&["-n", &self.b, "link", "set", &vb2, "up"]);
        (va2, vb2)
    }
}

impl Drop for NsPair {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Whether a live-link test can run: root and iproute2 (a privilege skip otherwise).
pub fn privileged(test: &str) -> bool {
    gate::require_root(test)
        && gate::require_tool(
            test,
            "ip (iproute2)",
            Command::new("ip").args(["netns", "list"]),
            "install iproute2",
        )
}

/// `buffet run` inside namespace `ns` with `args`; waits until it says it is running.
pub fn start_run(
    ns: &str,
    args: &[&std::ffi::OsStr],
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, BUFFET, "run"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let mut out = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            panic!("buffet run ended before running: {seen}{out}");
        }
        seen.push_str(&line);
        if line.starts_with("running on") {
            break;
        }
    }
    let rest = std::thread::spawn(move || {
        let mut s = seen;
        let _ = err.read_to_string(&mut s);
        s
    });
    (child, rest)
}

/// Sends signal `sig` (`TERM`, `INT`) to `child`, which must still be there to get it.
pub fn signal(child: &std::process::Child, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {}", child.id());
}

/// The sender, run in namespace B by a test's ignored helper test: sends the pcap in
/// `BUFFET_LIVE_SEND` out of `BUFFET_LIVE_IFACE`, then counts the frames carrying `mark`
/// coming back on it and on `BUFFET_LIVE_CAPTURE` (if given) until `BUFFET_LIVE_EXPECT`
/// arrived (and 300 ms more, to see any extra) or 5 s passed, and writes `sent
/// back_on_iface back_on_capture` to `BUFFET_LIVE_OUT`; with `BUFFET_LIVE_DSCP_OUT`, also
/// the IPv4 frames back by DSCP and those with a wrong header checksum. Does nothing when
/// `BUFFET_LIVE_SEND` is unset (the helper run as an ordinary ignored test).
pub fn sender(mark: &[u8]) {
    let Ok(pcap) = std::env::var("BUFFET_LIVE_SEND") else {
        return;
    };
    let iface = std::env::var("BUFFET_LIVE_IFACE").unwrap();
    let expect: u64 = std::env::var("BUFFET_LIVE_EXPECT")
        .unwrap()
        .parse()
        .unwrap();
    let out = std::env::var("BUFFET_LIVE_OUT").unwrap();
    let mut port = AfPacketPort::open(AfPacketConfig::new(&iface, 0)).unwrap();
    let mut capture = std::env::var("BUFFET_LIVE_CAPTURE")
        .ok()
        .map(|c| AfPacketPort::open(AfPacketConfig::new(c, 1)).unwrap());
    let mut pool = HeapPool::new(512);
    let mut reader = PcapReader::open(Path::new(&pcap)).unwrap();
    let mut burst = Vec::new();
    let mut sent = 0u64;
    loop {
        let pkt = reader.next_packet().unwrap();
        let done = pkt.is_none();
        if let Some(p) = pkt {
            let mut b = pool.take().unwrap();
            assert!(b.fill(p.data));
            burst.push(b);
        }
        if burst.len() == 16 || (done && !burst.is_empty()) {
            sent += burst.len() as u64;
            port.tx_burst(&mut burst, &mut pool).unwrap();
            // Paced: the receiving rings are never the limit in this test.
            std::thread::sleep(Duration::from_micros(500));
        }
        if done {
            break;
        }
    }
    assert_eq!(port.stats().tx, sent, "the sender sent every frame");
    let mut back = [0u64; 2];
    let mut rx = Vec::new();
    // Marked IPv4 frames back, by DSCP, and those whose header checksum is wrong.
    let mut dscp = [0u64; 64];
    let mut bad_checksum = 0u64;
    let mut count = |p: &mut AfPacketPort, pool: &mut HeapPool, n: &mut u64| {
        p.rx_burst(pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            if b.data().windows(mark.len()).any(|w| w == mark) {
                *n += 1;
                let d = b.data();
                if d.len() >= 34 && d[12..14] == [0x08, 0x00] {
                    dscp[usize::from(d[15] >> 2)] += 1;
                    let ihl = usize::from(d[14] & 0xf) * 4;
                    let sum = d[14..14 + ihl]
                        .chunks(2)
                        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                        .sum::<u32>();
                    let folded = (sum & 0xffff) + (sum >> 16);
                    if (folded & 0xffff) + (folded >> 16) != 0xffff {
                        bad_checksum += 1;
                    }
                }
            }
            pool.give(b);
        }
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    // Until the expected count, then a little longer: anything beyond it is an error too.
    let mut until = deadline;
    while Instant::now() < until {
        count(&mut port, &mut pool, &mut back[0]);
        if let Some(c) = &mut capture {
            count(c, &mut pool, &mut back[1]);
        }
        if back[0] + back[1] >= expect && until == deadline {
            until = Instant::now() + Duration::from_millis(300);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::fs::write(out, format!("{sent} {} {}\n", back[0], back[1])).unwrap();
    if let Ok(tos) = std::env::var("BUFFET_LIVE_DSCP_OUT") {
        let mut s = format!("bad_checksum {bad_checksum}\n");
        for (d, n) in dscp.iter().enumerate().filter(|(_, n)| **n > 0) {
            s.push_str(&format!("{d} {n}\n"));
        }
        std::fs::write(tos, s).unwrap();
    }
}

/// `(id, packets, passed)` of every tenant of a `buffet run --stats-json` file, as the workers counted them.
pub fn tenant_rows(json: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    json["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["id"].as_u64().unwrap(),
                x["packets"].as_u64().unwrap(),
                x["passed"].as_u64().unwrap(),
            )
        })
        .collect()
}
