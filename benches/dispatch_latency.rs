//! `dispatch_latency`: the Buffet paper's Fig. 9 analogue — per-packet latency and
//! throughput of the Packet Dispatcher in the NIC path (`buffet run --dispatch xdp`, the
//! XDP program in generic mode) against the dispatcher on a CPU core (`--dispatch
//! software`, AF_PACKET), for monitor, firewall, ids and ipsec, on the same veth.
//!
//! Setup, per (NF, mode): two network namespaces joined by a veth pair; `buffet run` on
//! end A (2 workers, not pinned, 8 tenants owning `10.<t>.0.0/16`); this binary re-runs
//! itself inside namespace B as the sender. Every frame Buffet passes goes back out of
//! A's end and arrives on B's.
//!
//! - **Latency**: ping-pong, one UDP frame in flight (64 bytes, tenants round robin): the
//!   time from just before the sender's `send` to the kernel's receive timestamp of the
//!   frame that comes back on B's end (AF_PACKET `tp_sec/tp_nsec`, so the sender's own
//!   ring-retire delay is not counted). Both directions of the veth and the sender's
//!   syscall are in every sample of both modes; the difference between modes is the
//!   dispatch path: AF_PACKET receive (1 ms TPACKET_V3 block timeout), the dispatcher
//!   thread and the worker rings, against XDP classification and scheduling in the
//!   driver hook and a redirect into the worker's own AF_XDP socket.
//! - **Throughput**: the sender transmits `FRAMES` frames as fast as one core lets it,
//!   while a second socket counts the frames back; frames back per second from the first
//!   send to the last frame back, and the share lost.
//! - **Where the frames went**, per run: `buffet run --stats-json` gives, for the whole
//!   run (pings and flood), what the XDP program dropped in the hook (or, with software
//!   dispatch, what the Packet Dispatcher dropped: mostly a worker's ring full), what the kernel
//!   dropped at each AF_XDP socket (receive ring full, fill ring empty, other drops:
//!   `XDP_STATISTICS`), what the port received and dropped (AF_PACKET's ring drops for
//!   software dispatch), what the workers processed and the NF dropped, and what the
//!   port sent and could not send; the sender adds what its own receive ring dropped of
//!   the frames coming back. A second table puts them side by side with the frames sent
//!   and back, and `unaccounted` is what none of those counters saw (lost on the veth or
//!   in the kernel's stack, beyond the counters).
//!
//! Needs root (namespaces, XDP); without it, it says so and measures nothing. Run:
//! `cargo bench --bench dispatch_latency` (the paper's four NFs, both modes; about two
//! minutes). Environment: `BUFFET_FIG9_PINGS` (default 2000), `BUFFET_FIG9_FRAMES`
//! (default 100000), `BUFFET_FIG9_NFS` (comma-separated, default
//! `monitor,firewall,ids,ipsec`), `BUFFET_FIG9_CSV` (a file for the CSV lines).
//! `cargo bench --bench dispatch_latency -- --test` is the smoke mode CI runs (20 pings
//! and 500 frames per run; it checks the bench works, its figures mean nothing). On a
//! 2-core machine the sender, the workers and the dispatcher share the cores: the ratio
//! between modes is the result, not the absolute figures.

#[path = "common/report.rs"]
mod report;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use buffet::io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet::io::{HeapPool, Port};
use buffet_testkit::gate;
use report::{env_or, percentile};

const BUFFET: &str = env!("CARGO_BIN_EXE_buffet");
const TENANTS: u8 = 8;
const MARK: &[u8] = b"BUFFET-FIG9";

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One UDP/IPv4 frame to tenant `t` (64 bytes on the wire before the FCS).
fn frame(t: u8, seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    payload.resize(18, 0);
    let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
        .ipv4([172, 16, 0, 1], [10, t, (seq >> 8) as u8, seq as u8], 64)
        .udp(40000, 80);
    let mut f = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut f, &payload).unwrap();
    f
}

/// The tenants file for `nf`: 8 tenants, each with a policy that passes the traffic.
fn tenants_file(nf: &str) -> String {
    let mut s = String::new();
    for t in 1..=TENANTS {
        s.push_str(&format!(
            "[[tenant]]\nid = {t}\nname = \"t{t}\"\nrules = [ {{ dst_ip = \"10.{t}.0.0/16\" }} ]\n"
        ));
        match nf {
            "ids" => s.push_str(
                "[tenant.policy]\nrules = '''\nalert tcp any 80 (msg:\"evil\"; content:\"evil\"; sid:1;)\n'''\n",
            ),
            // Default deny, the traffic (UDP to port 80) allowed by a rule: one ACL lookup.
            "firewall" => s.push_str(
                "[tenant.policy]\ndefault = \"deny\"\n[[tenant.policy.rules]]\naction = \"allow\"\nproto = \"udp\"\ndst_port = 80\n",
            ),
            "ipsec" => s.push_str(&format!(
                "[tenant.policy]\n[[tenant.policy.outbound]]\nspi = {}\nkey = \"{}\"\n\
                 local = \"203.0.113.1\"\nremote = \"198.51.100.{t}\"\nselector = \"10.{t}.0.0/16\"\n",
                0x1000 + u32::from(t),
                format!("{t:02x}").repeat(36)
            )),
            _ => {}
        }
        s.push('\n');
    }
    s
}

/// What the sender measured.
struct Measured {
    rtt_ns: Vec<u64>,
    lost_pings: u64,
    sent: u64,
    back: u64,
    secs: f64,
    /// Frames coming back that the sender's counting socket's ring dropped.
    back_dropped: u64,
    /// Where `buffet run` saw the frames go.
    at: Counted,
}

/// What `buffet run --stats-json` counted over the whole run (pings and flood).
#[derive(Clone, Copy, Default)]
struct Counted {
    /// Frames the XDP program saw (`None`: software dispatch).
    hook: Option<u64>,
    /// Frames it dropped there: unmatched, malformed, policed, no live worker.
    hook_dropped: u64,
    /// Frames the software Packet Dispatcher dropped (`global`: a worker's ring full,
    /// oversize, and with software dispatch unmatched, malformed, no live worker).
    dispatch_dropped: u64,
    /// AF_XDP sockets (summed): frames dropped because a receive ring was full.
    ring_full: u64,
    /// AF_XDP sockets: frames dropped for want of a fill-ring frame (`rx_dropped`,
    /// which also counts the rare frame too large for a UMEM frame).
    fill_empty: u64,
    /// Frames the receive port (or, with XDP dispatch, the workers' sockets) received.
    received: u64,
    /// Frames the port dropped on receive (AF_PACKET: the kernel's ring drops; AF_XDP:
    /// its own sockets' kernel drops plus frames without a tenant tag), plus the
    /// kernel drops of the workers' sockets with XDP dispatch, which the port's
    /// counter does not include.
    rx_dropped: u64,
    /// Packets the workers' NF handlers saw, and of those dropped.
    processed: u64,
    nf_dropped: u64,
    /// Frames the port sent, and could not send.
    tx: u64,
    tx_dropped: u64,
}

/// Reads what `buffet run` wrote to `--stats-json`.
fn counted(stats: &serde_json::Value) -> Counted {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let input = &stats["input"];
    let port = &input["ports"][0];
    let mut c = Counted {
        received: n(&port["rx"]),
        rx_dropped: n(&port["rx_dropped"]),
        tx: n(&port["tx"]),
        tx_dropped: n(&port["tx_dropped"]),
        ..Counted::default()
    };
    let global = &stats["global"];
    c.dispatch_dropped = n(&global["ring_full"]) + n(&global["oversize"]);
    if input.get("xdp").is_none() {
        c.dispatch_dropped += n(&global["unmatched"])
            + n(&global["no_live_worker"])
            + global["malformed"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(_, v)| n(v))
                .sum::<u64>();
    }
    if let Some(x) = input.get("xdp") {
        c.hook = Some(n(&x["packets"]));
        c.hook_dropped = ["unmatched", "malformed", "policed", "no_live_worker"]
            .iter()
            .map(|k| n(&x[k]))
            .sum();
    }
    for s in port["sockets"].as_array().into_iter().flatten() {
        c.ring_full += n(&s["rx_ring_full"]);
        c.fill_empty += n(&s["rx_dropped"]);
        if s["socket"].as_str() != Some("port") {
            // A worker's own socket (XDP dispatch): its kernel drops are not in the
            // port's rx_dropped.
            c.rx_dropped += n(&s["rx_dropped"]) + n(&s["rx_ring_full"]) + n(&s["rx_invalid_descs"]);
        }
    }
    for t in stats["tenants"].as_array().into_iter().flatten() {
        c.processed += n(&t["packets"]);
        // A tenant's `ring_full` drops are the dispatcher's, counted above.
        c.nf_dropped += t["drops"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != "ring_full")
            .map(|(_, v)| n(v))
            .sum::<u64>();
    }
    c
}

/// Runs in namespace B: the ping-pong, then the flood.
fn sender(iface: &str, pings: u32, frames: u32, out: &Path) {
    let mut port = AfPacketPort::open(AfPacketConfig::new(iface, 0)).unwrap();
    let mut pool = HeapPool::new(4096);
    let mut burst = Vec::new();
    let mut rx = Vec::new();
    // Drain anything from before.
    let _ = port.rx_burst(&mut pool, &mut rx, 1024);
    for b in rx.drain(..) {
        pool.give(b);
    }
    let mut rtt = Vec::with_capacity(pings as usize);
    let mut lost = 0u64;
    for seq in 0..pings {
        let mut b = pool.take().unwrap();
        assert!(b.fill(&frame((seq % u32::from(TENANTS)) as u8 + 1, seq)));
        burst.push(b);
        let t0 = now_ns();
        port.tx_burst(&mut burst, &mut pool).unwrap();
        let deadline = Instant::now() + Duration::from_millis(50);
        let mut got = None;
        while got.is_none() && Instant::now() < deadline {
            port.rx_burst(&mut pool, &mut rx, 64).unwrap();
            for b in rx.drain(..) {
                let d = b.data();
                if got.is_none() && d.len() >= 34 && d[12..14] == [0x08, 0x00] {
                    got = Some(b.ts_ns.saturating_sub(t0));
                }
                pool.give(b);
            }
        }
        match got {
            Some(ns) => rtt.push(ns),
            None => lost += 1,
        }
    }
    // The flood: a receive-only socket counts in a thread while this one sends.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let counter = {
        let stop = stop.clone();
        let iface = iface.to_owned();
        std::thread::spawn(move || {
            let mut port = AfPacketPort::open(AfPacketConfig::new(iface, 1)).unwrap();
            let mut pool = HeapPool::new(4096);
            let mut rx = Vec::new();
            let (mut back, mut last) = (0u64, 0u64);
            let dropped_before = port.stats().rx_dropped;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                port.rx_burst(&mut pool, &mut rx, 256).unwrap();
                for b in rx.drain(..) {
                    let d = b.data();
                    if d.len() >= 34 && d[12..14] == [0x08, 0x00] {
                        back += 1;
                        last = b.ts_ns;
                    }
                    pool.give(b);
                }
            }
            (back, last, port.stats().rx_dropped - dropped_before)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut tx_cfg = AfPacketConfig::new(iface, 2);
    tx_cfg.rx = false;
    let mut tx = AfPacketPort::open(tx_cfg).unwrap();
    let first = now_ns();
    let mut sent = 0u64;
    let mut seq = 0u32;
    while seq < frames {
        while burst.len() < 32 && seq < frames {
            let mut b = pool.take().unwrap();
            assert!(b.fill(&frame((seq % u32::from(TENANTS)) as u8 + 1, seq)));
            burst.push(b);
            seq += 1;
        }
        let before = burst.len() as u64;
        tx.tx_burst(&mut burst, &mut pool).unwrap();
        sent += before - burst.len() as u64;
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (back, last, back_dropped) = counter.join().unwrap();
    let secs = last.saturating_sub(first) as f64 / 1e9;
    let mut s = format!("{lost} {sent} {back} {secs} {back_dropped}\n");
    for r in &rtt {
        s.push_str(&format!("{r}\n"));
    }
    std::fs::write(out, s).unwrap();
}

fn ip(args: &[&str]) {
    let s = Command::new("ip").args(args).status().unwrap();
    assert!(s.success(), "ip {args:?}");
}

/// A veth pair across two fresh namespaces; deleted on drop.
struct Namespaces {
    a: String,
    b: String,
}

impl Namespaces {
    fn new() -> Namespaces {
        let tag = std::process::id() % 100_000;
        let ns = Namespaces {
            a: format!("f9a{tag}"),
            b: format!("f9b{tag}"),
        };
        for n in [&ns.a, &ns.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
            ip(&["netns", "add", n]);
        }
        ip(&[
            "link", "add", "f9va", "type", "veth", "peer", "name", "f9vb",
        ]);
        ip(&["link", "set", "f9va", "netns", &ns.a]);
        ip(&["link", "set", "f9vb", "netns", &ns.b]);
        ip(&["-n", &ns.a, "link", "set", "f9va", "up"]);
        ip(&["-n", &ns.b, "link", "set", "f9vb", "up"]);
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// One (NF, mode) measurement.
fn measure(nf: &str, mode: &str, pings: u32, frames: u32) -> Measured {
    let ns = Namespaces::new();
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, tenants_file(nf)).unwrap();
    let stats = dir.path().join("stats.json");
    let mut run = Command::new("ip");
    run.args(["netns", "exec", &ns.a, BUFFET, "run", "--iface", "f9va"])
        .args(["--nf", nf, "--workers", "2", "--no-pin", "--dispatch", mode])
        .arg("--tenants")
        .arg(&tenants)
        .arg("--stats-json")
        .arg(&stats);
    if mode == "xdp" {
        run.args(["--xdp-mode", "generic"]);
    }
    let mut child = run
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "buffet run --dispatch {mode} --nf {nf} ended before running"
        );
        if line.starts_with("running on") {
            break;
        }
    }
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let out = dir.path().join("sender.txt");
    let status = Command::new("ip")
        .args(["netns", "exec", &ns.b])
        .arg(std::env::current_exe().unwrap())
        .env("BUFFET_FIG9_SENDER", "f9vb")
        .env("BUFFET_FIG9_OUT", &out)
        .env("BUFFET_FIG9_PINGS", pings.to_string())
        .env("BUFFET_FIG9_FRAMES", frames.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "the sender failed");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let st = child.wait().unwrap();
    let log = drain.join().unwrap();
    assert!(st.success(), "buffet run: {log}");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(' ').collect();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    Measured {
        lost_pings: head[0].parse().unwrap(),
        sent: head[1].parse().unwrap(),
        back: head[2].parse().unwrap(),
        secs: head[3].parse().unwrap(),
        back_dropped: head[4].parse().unwrap(),
        rtt_ns: lines.map(|l| l.parse().unwrap()).collect(),
        at: counted(&json),
    }
}

/// One run's frames from the sender to the sender again, and what no counter saw.
struct Where {
    c: Counted,
    /// Frames the sender sent (pings and flood) and got back.
    sent: u64,
    back: u64,
    back_dropped: u64,
    /// `sent - back` less every drop counted on the way (0 if the counters account for
    /// more: a frame can be counted twice, e.g. a ping that came back after its
    /// deadline).
    unaccounted: u64,
}

impl Where {
    fn of(m: &Measured, pings: u32) -> Where {
        let c = m.at;
        let sent = m.sent + u64::from(pings);
        let back = m.back + u64::from(pings) - m.lost_pings;
        // Every socket's kernel drops are in `rx_dropped` (the port's own through the
        // port's counter, the workers' added by `counted`): counted once.
        let counted = c.hook_dropped
            + c.dispatch_dropped
            + c.rx_dropped
            + c.nf_dropped
            + c.tx_dropped
            + m.back_dropped;
        Where {
            sent,
            back,
            back_dropped: m.back_dropped,
            unaccounted: sent.saturating_sub(back).saturating_sub(counted),
            c,
        }
    }
}

fn main() {
    if let Ok(iface) = std::env::var("BUFFET_FIG9_SENDER") {
        let out = std::env::var("BUFFET_FIG9_OUT").unwrap();
        sender(
            &iface,
            env_or("BUFFET_FIG9_PINGS", 2000),
            env_or("BUFFET_FIG9_FRAMES", 100_000),
            Path::new(&out),
        );
        return;
    }
    if !gate::require_root("dispatch_latency") {
        return;
    }
    // `cargo bench -- --test` (criterion's smoke mode, which CI runs): every NF and mode
    // once, with a handful of frames, to prove the bench still works.
    let smoke = std::env::args().any(|a| a == "--test");
    let (pings, frames) = if smoke { (20, 500) } else { (2000, 100_000) };
    let pings: u32 = env_or("BUFFET_FIG9_PINGS", pings);
    let frames: u32 = env_or("BUFFET_FIG9_FRAMES", frames);
    let nfs: String = env_or("BUFFET_FIG9_NFS", "monitor,firewall,ids,ipsec".to_owned());
    let mut csv = String::from(
        "nf,dispatch,p50_us,p99_us,lost_pings,sent,back,throughput_kpps,\
         lost_in_hook,socket_ring_full,socket_fill_empty,port_rx_dropped,nf_dropped,\
         tx_dropped,sender_rx_dropped,unaccounted,dispatcher_dropped\n",
    );
    let mut wheres = Vec::new();
    println!(
        "dispatch_latency: {pings} pings, {frames} frames per (NF, dispatch); 8 tenants, 2 workers, veth"
    );
    println!(
        "{:<9} {:<9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>11}",
        "nf", "dispatch", "p50 µs", "p99 µs", "lost", "sent", "back", "back kpps"
    );
    for nf in nfs.split(',') {
        for mode in ["software", "xdp"] {
            let mut m = measure(nf, mode, pings, frames);
            m.rtt_ns.sort_unstable();
            let (p50, p99) = (
                percentile(&m.rtt_ns, 0.50) / 1e3,
                percentile(&m.rtt_ns, 0.99) / 1e3,
            );
            let kpps = if m.secs > 0.0 {
                m.back as f64 / m.secs / 1e3
            } else {
                0.0
            };
            println!(
                "{nf:<9} {mode:<9} {p50:>9.1} {p99:>9.1} {:>6} {:>9} {:>9} {kpps:>11.1}",
                m.lost_pings, m.sent, m.back
            );
            let w = Where::of(&m, pings);
            csv.push_str(&format!(
                "{nf},{mode},{p50:.1},{p99:.1},{},{},{},{kpps:.1},{},{},{},{},{},{},{},{},{}\n",
                m.lost_pings,
                m.sent,
                m.back,
                w.c.hook_dropped,
                w.c.ring_full,
                w.c.fill_empty,
                w.c.rx_dropped,
                w.c.nf_dropped,
                w.c.tx_dropped,
                m.back_dropped,
                w.unaccounted,
                w.c.dispatch_dropped
            ));
            wheres.push((nf.to_owned(), mode, w));
        }
    }
    println!();
    println!(
        "where the frames went (whole run: {pings} pings + the flood; socket columns: the \
         kernel's XDP_STATISTICS summed over the run's AF_XDP sockets)"
    );
    println!(
        "{:<9} {:<9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "nf",
        "dispatch",
        "sent",
        "hook",
        "hook_drp",
        "disp_drp",
        "ring_full",
        "fill_empt",
        "received",
        "rx_drop",
        "nf_drop",
        "tx",
        "tx_drop",
        "back",
        "back_drp",
        "unacct"
    );
    for (nf, mode, w) in &wheres {
        let c = &w.c;
        println!(
            "{nf:<9} {mode:<9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            w.sent,
            c.hook.map_or_else(|| "-".to_owned(), |h| h.to_string()),
            c.hook_dropped,
            c.dispatch_dropped,
            c.ring_full,
            c.fill_empty,
            c.received,
            c.rx_dropped,
            c.nf_dropped,
            c.tx,
            c.tx_dropped,
            w.back,
            w.back_dropped,
            w.unaccounted
        );
    }
    if let Ok(path) = std::env::var("BUFFET_FIG9_CSV") {
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(csv.as_bytes()))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}
