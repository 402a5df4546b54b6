//! On a live link (root only): an AF_XDP port whose interface is down neither counts
//! frames as sent nor keeps them for later. A veth pair in one network namespace, the
//! port on one end (copy mode, its redirect program attached), an AF_PACKET socket on the
//! other counting what arrives. With the port's end down, a first burst is queued on the
//! transmit ring before the kernel says the interface is down (`ENETDOWN` at the kick:
//! the ring gives no way to take descriptors back), and every later burst is dropped at
//! once and counted as `tx_dropped`; `tx` counts only frames the kernel completed. Once
//! the end is up again, the first burst and the next one go out, the dropped burst never
//! does, and `tx` + `tx_dropped` account for every frame. Then the other end goes down:
//! the port's interface is up without carrier, the kernel takes each frame off the ring
//! and the device drops it, and the port counts those as dropped, not sent; once the
//! carrier is back, the next burst goes out and none of those does.
//!
//! An AF_PACKET port without carrier: the kernel would take its sends and drop them; the
//! port, having looked at the link (the data plane's link look), counts every frame of
//! the bursts after that as dropped, none as sent, and the first burst after the
//! carrier's return goes out.
//!
//! Each port runs in this test binary re-run inside the namespace (`ip netns exec`) as an
//! ignored helper test (`link_down_helper`, `no_carrier_helper`). Without root the test skips with a
//! `SKIP (privilege)` line; under `BUFFET_REQUIRE_PRIVILEGED=1` (or CI) that skip is a
//! failure.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use buffet::io::afpacket::{AfPacketConfig, AfPacketPort};
use buffet::io::afxdp::{AfXdpConfig, AfXdpPort};
use buffet::io::{HeapPool, PacketBuf, Port};

mod common;
use common::netns::{ip, privileged};
use etherparse::PacketBuilder;

/// Marks the payload of every frame the test sends.
const MARK: &[u8] = b"BUFFET-XSKDOWN";
/// Frames per burst.
const BURST: u32 = 8;

/// One UDP/IPv4 frame carrying the mark and `seq`.
fn frame(seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.extend_from_slice(&seq.to_be_bytes());
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0xb, 1], [2, 0, 0, 0, 0xa, 1])
        .ipv4([172, 16, 0, 1], [10, 1, 0, 1], 64)
        .udp(40000, 80)
        .write(&mut v, &payload)
        .unwrap();
    v
}

/// Heap frames with sequence numbers `seqs`.
fn burst(pool: &mut HeapPool, seqs: std::ops::Range<u32>) -> Vec<PacketBuf> {
    seqs.map(|s| {
        let mut b = pool.take().unwrap();
        assert!(b.fill(&frame(s)));
        b
    })
    .collect()
}

/// Whether `iface` has its carrier (both ends of the veth up).
fn carrier(iface: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/carrier"))
        .is_ok_and(|s| s.trim() == "1")
}

/// Waits up to 5 s for `iface` to have its carrier (`on`) or to lose it.
fn await_carrier(iface: &str, on: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while carrier(iface) != on {
        let what = if on {
            "has no carrier again"
        } else {
            "keeps its carrier"
        };
        assert!(Instant::now() < deadline, "{iface} {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Gives the port time to reap completions (each receive burst does), `rounds` of 2 ms,
/// and collects the marked frames' sequence numbers arriving at `peer` into `seen`.
fn settle(
    port: &mut AfXdpPort,
    peer: &mut AfPacketPort,
    pool: &mut HeapPool,
    seen: &mut Vec<u32>,
    rounds: u32,
) {
    let mut rx = Vec::new();
    for _ in 0..rounds {
        port.rx_burst(pool, &mut rx, 64).unwrap();
        for b in rx.drain(..) {
            port.recycle(b);
        }
        collect_marked(peer, pool, &mut rx, seen);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Receives a burst at `peer` (through `rx`, left empty) and adds the sequence numbers of
/// the marked frames in it to `seen`.
fn collect_marked(
    peer: &mut AfPacketPort,
    pool: &mut HeapPool,
    rx: &mut Vec<PacketBuf>,
    seen: &mut Vec<u32>,
) {
    peer.rx_burst(pool, rx, 64).unwrap();
    for b in rx.drain(..) {
        if let Some(at) = b.data().windows(MARK.len()).position(|w| w == MARK) {
            let at = at + MARK.len();
            seen.push(u32::from_be_bytes(b.data()[at..at + 4].try_into().unwrap()));
        }
        pool.give(b);
    }
}

/// Runs inside the namespace named by the test: the port on `BUFFET_XSKDOWN_PORT`, the
/// counting socket on `BUFFET_XSKDOWN_PEER`. Does nothing when they are unset (the helper
/// run as an ordinary ignored test).
#[test]
#[ignore = "helper: run by af_xdp_port_with_its_link_down_drops_and_counts inside a network namespace"]
fn link_down_helper() {
    let (Ok(va), Ok(vb)) = (
        std::env::var("BUFFET_XSKDOWN_PORT"),
        std::env::var("BUFFET_XSKDOWN_PEER"),
    ) else {
        return;
    };
    let mut port = AfXdpPort::open(AfXdpConfig::new(&va, 0)).unwrap();
    assert!(!port.is_zero_copy(), "a veth runs AF_XDP in copy mode");
    let mut peer = AfPacketPort::open(AfPacketConfig::new(&vb, 1)).unwrap();
    let mut pool = HeapPool::new(64);
    let mut seen = Vec::new();

    // Up: a burst goes out and is counted once the kernel completed it.
    port.tx_burst(&mut burst(&mut pool, 0..BURST), &mut pool)
        .unwrap();
    settle(&mut port, &mut peer, &mut pool, &mut seen, 50);
    assert_eq!(seen, (0..BURST).collect::<Vec<_>>(), "sent while up");
    let s = port.stats();
    assert_eq!((s.tx, s.tx_dropped), (u64::from(BURST), 0), "{s:?}");

    ip(&["link", "set", &va, "down"]);
    // The first burst while down: on the ring before the kernel can say so.
    port.tx_burst(&mut burst(&mut pool, 100..100 + BURST), &mut pool)
        .unwrap();
    // Every later one: dropped at once, nothing queued.
    for k in 0..3 {
        let first = 200 + k * BURST;
        port.tx_burst(&mut burst(&mut pool, first..first + BURST), &mut pool)
            .unwrap();
    }
    assert_eq!(pool.available(), 64, "heap frames were given back");
    settle(&mut port, &mut peer, &mut pool, &mut seen, 25);
    let s = port.stats();
    assert_eq!(
        s.tx,
        u64::from(BURST),
        "frames on the ring of a down interface are not sent: {s:?}"
    );
    assert_eq!(
        s.tx_dropped,
        u64::from(3 * BURST),
        "bursts after the kernel said down are dropped: {s:?}"
    );
    assert_eq!(seen.len(), BURST as usize, "nothing left while down");

    ip(&["link", "set", &va, "up"]);
    await_carrier(&va, true);
    port.tx_burst(&mut burst(&mut pool, 300..300 + BURST), &mut pool)
        .unwrap();
    settle(&mut port, &mut peer, &mut pool, &mut seen, 100);
    let up: BTreeSet<u32> = seen.iter().copied().collect();
    let want: BTreeSet<u32> = (0..BURST)
        .chain(100..100 + BURST)
        .chain(300..300 + BURST)
        .collect();
    assert_eq!(
        up, want,
        "up again: the burst queued before the kernel said down and the new one, never \
         the dropped ones"
    );
    let s = port.stats();
    assert_eq!(s.tx, u64::from(3 * BURST), "{s:?}");
    assert_eq!(s.tx_dropped, u64::from(3 * BURST), "{s:?}");

    // No carrier: the port's end up, the peer's down. The kernel takes each frame off
    // the ring and the device drops it (`EBUSY` at the kick): counted as dropped, never
    // as sent, and nothing is left on the ring to go out once the carrier is back.
    ip(&["link", "set", &vb, "down"]);
    await_carrier(&va, false);
    for k in 0..3 {
        let first = 400 + k * BURST;
        port.tx_burst(&mut burst(&mut pool, first..first + BURST), &mut pool)
            .unwrap();
        settle(&mut port, &mut peer, &mut pool, &mut seen, 5);
        let s = port.stats();
        assert_eq!(
            (s.tx, s.tx_dropped),
            (u64::from(3 * BURST), u64::from((4 + k) * BURST)),
            "without carrier, burst {k}: every frame dropped and counted, none sent: {s:?}"
        );
    }
    ip(&["link", "set", &vb, "up"]);
    await_carrier(&va, true);
    port.tx_burst(&mut burst(&mut pool, 500..500 + BURST), &mut pool)
        .unwrap();
    settle(&mut port, &mut peer, &mut pool, &mut seen, 100);
    let seen: BTreeSet<u32> = seen.into_iter().collect();
    let want: BTreeSet<u32> = want.into_iter().chain(500..500 + BURST).collect();
    assert_eq!(
        seen, want,
        "carrier again: the new burst goes out, none of those dropped without carrier"
    );
    let s = port.stats();
    assert_eq!(s.tx, u64::from(4 * BURST), "{s:?}");
    assert_eq!(s.tx_dropped, u64::from(6 * BURST), "{s:?}");
    println!("LINK-DOWN-OK");
}

#[test]
fn af_xdp_port_with_its_link_down_drops_and_counts() {
    let test = "live_afxdp_link_down::af_xdp_port_with_its_link_down_drops_and_counts";
    if privileged(test) {
        in_namespace("xd", "link_down_helper");
    }
}

/// Runs inside the namespace named by the test: the AF_PACKET port on
/// `BUFFET_XSKDOWN_PORT`, the counting socket on `BUFFET_XSKDOWN_PEER`. Does nothing
/// when they are unset (the helper run as an ordinary ignored test).
#[test]
#[ignore = "helper: run by af_packet_port_without_carrier_counts_drops_not_sends inside a network namespace"]
fn no_carrier_helper() {
    let (Ok(va), Ok(vb)) = (
        std::env::var("BUFFET_XSKDOWN_PORT"),
        std::env::var("BUFFET_XSKDOWN_PEER"),
    ) else {
        return;
    };
    let mut cfg = AfPacketConfig::new(&va, 0);
    // Transmit only, as a `--tx-iface` is: nothing to receive here.
    cfg.rx = false;
    let mut port = AfPacketPort::open(cfg).unwrap();
    let mut peer = AfPacketPort::open(AfPacketConfig::new(&vb, 1)).unwrap();
    let mut pool = HeapPool::new(64);
    let mut seen = Vec::new();
    let collect = |peer: &mut AfPacketPort, pool: &mut HeapPool, seen: &mut Vec<u32>| {
        let mut rx = Vec::new();
        for _ in 0..50 {
            collect_marked(peer, pool, &mut rx, seen);
            std::thread::sleep(Duration::from_millis(2));
        }
    };

    port.tx_burst(&mut burst(&mut pool, 0..BURST), &mut pool)
        .unwrap();
    collect(&mut peer, &mut pool, &mut seen);
    assert_eq!(seen, (0..BURST).collect::<Vec<_>>(), "sent with carrier");
    let s = port.stats();
    assert_eq!((s.tx, s.tx_dropped), (u64::from(BURST), 0), "{s:?}");

    // The peer goes down: the port's end is up without carrier. The data plane's next
    // link look (`take_error`) finds it; from then on every burst is dropped and counted
    // as such, none counted as sent (the kernel would take each and drop it).
    ip(&["link", "set", &vb, "down"]);
    await_carrier(&va, false);
    port.take_error().unwrap();
    for k in 0..3 {
        let first = 100 + k * BURST;
        port.tx_burst(&mut burst(&mut pool, first..first + BURST), &mut pool)
            .unwrap();
        let s = port.stats();
        assert_eq!(
            (s.tx, s.tx_dropped),
            (u64::from(BURST), u64::from((k + 1) * BURST)),
            "without carrier, burst {k}: every frame dropped and counted, none sent: {s:?}"
        );
    }
    assert_eq!(pool.available(), 64, "heap frames were given back");

    // The carrier is back: the next burst looks, finds it, and goes out, with no link
    // look in between.
    ip(&["link", "set", &vb, "up"]);
    await_carrier(&va, true);
    port.tx_burst(&mut burst(&mut pool, 500..500 + BURST), &mut pool)
        .unwrap();
    collect(&mut peer, &mut pool, &mut seen);
    let want: BTreeSet<u32> = (0..BURST).chain(500..500 + BURST).collect();
    assert_eq!(
        seen.into_iter().collect::<BTreeSet<u32>>(),
        want,
        "carrier again: the new burst goes out"
    );
    let s = port.stats();
    assert_eq!(
        (s.tx, s.tx_dropped),
        (u64::from(2 * BURST), u64::from(3 * BURST)),
        "{s:?}"
    );
    println!("LINK-DOWN-OK");
}

#[test]
fn af_packet_port_without_carrier_counts_drops_not_sends() {
    let test = "live_afxdp_link_down::af_packet_port_without_carrier_counts_drops_not_sends";
    if privileged(test) {
        in_namespace("pc", "no_carrier_helper");
    }
}

/// Creates a network namespace with a veth pair, both ends up, and runs this test
/// binary's ignored test `helper` inside it, the port's end and the peer's named in
/// `BUFFET_XSKDOWN_PORT` and `BUFFET_XSKDOWN_PEER`; asserts it passed.
fn in_namespace(kind: &str, helper: &str) {
    let tag = std::process::id() % 100_000;
    let (ns, va, vb) = (
        format!("buffet-{kind}-{tag}"),
        format!("b{kind}{tag}a"),
        format!("b{kind}{tag}b"),
    );
    ip(&["netns", "add", &ns]);
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }
    let _ns = Ns(ns.clone());
    ip(&[
        "netns",
        "exec",
        &ns,
        "sysctl",
        "-qw",
        "net.ipv6.conf.default.disable_ipv6=1",
    ]);
    ip(&[
        "link", "add", &va, "netns", &ns, "type", "veth", "peer", "name", &vb, "netns", &ns,
    ]);
    ip(&["-n", &ns, "link", "set", &va, "up"]);
    ip(&["-n", &ns, "link", "set", &vb, "up"]);
    let out = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", helper, "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("BUFFET_XSKDOWN_PORT", &va)
        .env("BUFFET_XSKDOWN_PEER", &vb)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("LINK-DOWN-OK"),
        "{text}"
    );
}
