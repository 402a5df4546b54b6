//! Receive throughput of one reader on a veth pair: the AF_XDP port (its redirect
//! program in native and in generic mode, the socket in copy mode as veth has it)
//! against the AF_PACKET port, in one run, on the same link and the same sender (root only).
//!
//! A sender thread blasts 64-byte UDP frames out of one end through an AF_PACKET port
//! for `--seconds` (default 3); one reader thread reads the other end through the port
//! under test, gives every frame straight back (heap frames to the pool, UMEM frames to
//! the port) and counts them. Printed per port: frames sent, received, the port's drop
//! counter, and the received rate. The kernel's receive work (veth, XDP, the packet
//! socket) runs in softirq on the sending CPU, so the figure is the rate frames reach a
//! reader through each port, not the cost of one layer alone.
//!
//! ```sh
//! cargo run --release -p buffet-io --example port_rate -- --seconds 3 [--rings N]
//! ```
//!
//! `--rings N` sizes the AF_XDP rings (default 2048, the port's default; the UMEM gets
//! `2 N` frames).
//!
//! It creates a network namespace `buffet-rate-PID` with a veth pair, re-runs itself
//! inside it, and deletes it at the end.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet_io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet_io::afxdp::{AfXdpConfig, AfXdpPort, XdpMode};
use buffet_io::{HeapPool, PacketBuf, Port};

const INNER_ENV: &str = "BUFFET_PORT_RATE_INNER";

fn ip(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

fn frame(i: u16) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xa1]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xb1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&46u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 2]);
    f[30..34].copy_from_slice(&[10, 0, 0, 1]);
    f[34..36].copy_from_slice(&(10_000 + i % 64).to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&26u16.to_be_bytes());
    f
}

/// Sends until `stop`; returns frames sent.
fn send(iface: &str, stop: &AtomicBool, sent: &AtomicU64) {
    let mut tx = AfPacketPort::open(AfPacketConfig {
        rx: false,
        ..AfPacketConfig::new(iface, 1)
    })
    .expect("sender port");
    let frames: Vec<Vec<u8>> = (0..64).map(frame).collect();
    let mut pool = HeapPool::new(64);
    let mut burst: Vec<PacketBuf> = Vec::with_capacity(64);
    while !stop.load(Ordering::Relaxed) {
        for f in &frames {
            let mut b = pool.take().expect("64 frames");
            b.fill(f);
            burst.push(b);
        }
        tx.tx_burst(&mut burst, &mut pool).expect("send");
    }
    sent.store(tx.stats().tx, Ordering::Relaxed);
}

/// Reads `port` for `secs` while the sender runs; prints one line.
fn measure(name: &str, mut port: Box<dyn Port>, secs: f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || send("brb", &stop, &sent))
    };
    let mut pool = HeapPool::new(4096);
    let mut out = Vec::with_capacity(256);
    // Warm up, then count.
    let warm = Instant::now() + Duration::from_millis(300);
    while Instant::now() < warm {
        port.rx_burst(&mut pool, &mut out, 256).expect("rx");
        for b in out.drain(..) {
            match b.owner() {
                Some(_) => port.recycle(b),
                None => pool.give(b),
            }
        }
    }
    let before = port.stats();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < until {
        port.rx_burst(&mut pool, &mut out, 256).expect("rx");
        n += out.len() as u64;
        for b in out.drain(..) {
            match b.owner() {
                Some(_) => port.recycle(b),
                None => pool.give(b),
            }
        }
    }
    let took = start.elapsed().as_secs_f64();
    let after = port.stats();
    stop.store(true, Ordering::Relaxed);
    sender.join().expect("sender");
    println!(
        "{name:<11} received {n:>10} in {took:.2} s = {:>7.3} Mpps   port rx_dropped {:>9}   (sender total {})",
        n as f64 / took / 1e6,
        after.rx_dropped - before.rx_dropped,
        sent.load(Ordering::Relaxed),
    );
}

fn inner(secs: f64, rings: u32) {
    ip(&["link", "add", "bra", "type", "veth", "peer", "name", "brb"]);
    ip(&["link", "set", "bra", "up"]);
    ip(&["link", "set", "brb", "up"]);
    for _ in 0..2 {
        let p = AfPacketPort::open(AfPacketConfig::new("bra", 0)).expect("af_packet on bra");
        measure("af_packet", Box::new(p), secs);
        for (name, mode) in [
            ("xdp-native", XdpMode::Native),
            ("xdp-generic", XdpMode::Generic),
        ] {
            let p = AfXdpPort::open(AfXdpConfig {
                redirect: Some(mode),
                ring_size: rings,
                frames: 2 * rings,
                ..AfXdpConfig::new("bra", 0)
            })
            .expect("af_xdp on bra");
            assert!(!p.is_zero_copy(), "veth runs AF_XDP in copy mode");
            measure(name, Box::new(p), secs);
        }
    }
}

fn main() {
    let mut secs = 3.0;
    let mut rings = AfXdpConfig::new("", 0).ring_size;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                secs = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds S")
            }
            "--rings" => rings = args.next().and_then(|s| s.parse().ok()).expect("--rings N"),
            _ => panic!("usage: port_rate [--seconds S] [--rings N]"),
        }
    }
    if std::env::var_os(INNER_ENV).is_some() {
        inner(secs, rings);
        return;
    }
    if !buffet_testkit::gate::is_root() {
        eprintln!("port_rate: needs root (a network namespace, a veth pair, XDP)");
        return;
    }
    let ns = format!("buffet-rate-{}", std::process::id());
    ip(&["netns", "add", &ns]);
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe().expect("own path"))
        .args([
            "--seconds",
            &secs.to_string(),
            "--rings",
            &rings.to_string(),
        ])
        .env(INNER_ENV, "1")
        .status();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "the run inside {ns} failed"
    );
}
