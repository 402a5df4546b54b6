//! eBPF NFs end to end, on the C examples of `examples/ebpf` built by `tests/build.rs`:
//!
//! * the verifier accepts the good programs and rejects the bad ones with its message;
//! * the eBPF DPI gives the native DPI's verdicts and counters on generated HTTP traffic
//!   for several tenants with different blacklists, with the interpreter and the JIT;
//! * the helpers do what the header says (TTL rewrite with an incremental checksum);
//! * fault containment: a tenant whose program faults is quarantined and a tenant whose
//!   program the verifier rejects is refused at admission, while several tenants'
//!   traffic is in flight — and nobody else loses a packet.
//!
//! Without clang every test skips with a message (fails under CI, see `tests/build.rs`).

#[path = "build.rs"]
mod build;

use std::collections::BTreeMap;
use std::sync::Arc;

use buffet::dispatch::{DispatcherConfig, Match, SchedulerConfig, TenantSlot};
use buffet::ebpf::{check, EbpfNf, EbpfPolicy, EbpfState, Engine, LoadOptions, MapInit};
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::dpi::{Dpi, DpiPolicy, DpiState};
use buffet::sdk::{DropCause, InitError, NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{Outcome, PacketBuf, Pipeline, PipelineConfig, PipelineError, Worker};
use buffet::worker::{TenantSpec, WorkerEvent};
use buffet_testkit::Rng;
use etherparse::PacketBuilder;

fn opts(engine: Engine) -> LoadOptions {
    LoadOptions {
        engine,
        ..LoadOptions::default()
    }
}

fn engines() -> Vec<Engine> {
    if cfg!(all(target_arch = "x86_64", unix)) {
        vec![Engine::Interpreter, Engine::Jit]
    } else {
        vec![Engine::Interpreter]
    }
}

// ---------------------------------------------------------------------------------------
// The verifier

#[test]
fn the_verifier_accepts_the_examples_and_rejects_the_bad_programs_with_its_message() {
    let test = "verifier";
    for good in [
        "dpi",
        "dpi_scan",
        "counter",
        "flowmon",
        "portblock",
        "ttl",
        "fault",
        "subprog",
        "macswap",
        "policer",
    ] {
        let Some(elf) = build::elf(test, good) else {
            return;
        };
        let report = check(&elf, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{good}.o should verify: {e}"));
        assert!(report.verified.instructions > 0);
        assert!(report.region_len >= buffet::ebpf::abi::MAPS_OFFSET);
    }
    let rejects = [
        ("reject_oob", "Upper bound must be at most packet_size"),
        ("reject_loop", "Loop counter is too large"),
        ("reject_helper", "helper function is unavailable"),
        ("reject_uninit", "Invalid type"),
        (
            "reject_bounds_state",
            "Upper bound must be at most r0.shared_region_size",
        ),
    ];
    for (bad, message) in rejects {
        let Some(elf) = build::elf(test, bad) else {
            return;
        };
        let err = check(&elf, &LoadOptions::default())
            .expect_err(&format!("{bad}.o must be rejected"))
            .to_string();
        assert!(
            err.starts_with("rejected by the verifier: "),
            "{bad}: {err}"
        );
        assert!(err.contains(message), "{bad}: {err}");
        // And nothing of it runs: building an NF from it fails the same way.
        let nf = EbpfNf::from_elf(&elf, LoadOptions::default());
        assert_eq!(nf.unwrap_err().to_string(), err);
    }
    // The DPI's loops are proven to end: within the payload's length.
    let dpi = check(&build::elf(test, "dpi").unwrap(), &LoadOptions::default()).unwrap();
    assert!(dpi.verified.max_loop_count <= 0xffff, "{:?}", dpi.verified);
}

#[test]
fn a_loop_budget_below_the_proven_bound_is_a_rejection() {
    let Some(elf) = build::elf("loop budget", "dpi") else {
        return;
    };
    let mut o = LoadOptions::default();
    o.verifier.max_loop_iterations = 1000;
    let err = check(&elf, &o).unwrap_err().to_string();
    assert!(err.contains("the limit is 1000"), "{err}");
}

// ---------------------------------------------------------------------------------------
// DPI: eBPF == native

/// The two eBPF DPIs: with scanning helpers, and scanning every byte itself.
const DPI_PROGRAMS: [&str; 2] = ["dpi", "dpi_scan"];

const DOMAINS: [&str; 10] = [
    "example.com",
    "ads.tracker.net",
    "news.org",
    "evil.co.uk",
    "example.org",
    "localhost",
    "shop.example.com",
    "tracker.net",
    "xn--bcher-kva.example",
    "d7.test",
];

fn host(r: &mut Rng) -> String {
    let mut h = match r.index(12) {
        0 => format!("www.{}", r.pick(&DOMAINS)),
        1 => format!("a.b.{}", r.pick(&DOMAINS)),
        2 => format!("bad{}", r.pick(&DOMAINS)),
        3 => "[2001:db8::1]".to_owned(),
        4 => "10.1.2.3".to_owned(),
        5 => format!("{}.{}", "x".repeat(120 + r.index(140)), r.pick(&DOMAINS)),
        6 => format!("d{}.test", r.index(300)),
        _ => r.pick(&DOMAINS).to_string(),
    };
    if r.chance(30) {
        h = h
            .chars()
            .map(|c| {
                if r.chance(50) {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
    }
    if r.chance(10) {
        h.push('.');
    }
    if r.chance(15) {
        h = format!("{h}:{}", r.index(65536));
    }
    if r.chance(8) {
        h = format!("user{}@{h}", if r.chance(50) { ":pw" } else { "" });
    }
    if r.chance(10) {
        h = format!(" \t{h}  ");
    }
    h
}

fn http_payload(r: &mut Rng) -> Vec<u8> {
    let eol = if r.chance(85) { "\r\n" } else { "\n" };
    let method = *r.pick(&[
        "GET", "GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "CONNECT",
        "get", "GETX", "BREW",
    ]);
    let mut s = match (method, r.index(6)) {
        ("CONNECT", _) => format!("CONNECT {} HTTP/1.1{eol}", host(r)),
        (m, 0) => format!("{m} http://{}/p?q=1 HTTP/1.1{eol}", host(r)),
        (m, 1) => format!(
            "{m} {}://{}#frag HTTP/1.0{eol}",
            r.pick(&["HTTP", "https", "ftp", "h"]),
            host(r)
        ),
        (m, 2) => format!("{m} * HTTP/1.1{eol}"),
        (m, _) => format!("{m} /index.html?x=1 HTTP/1.1{eol}"),
    };
    for _ in 0..r.index(4) {
        let name = r.pick(&["User-Agent", "Accept", "X-Host", "Hostname"]);
        s.push_str(&format!("{name}: v{eol}"));
    }
    for _ in 0..r.index(3) {
        let name = r.pick(&["Host", "host", "HOST", "hOsT"]);
        let sep = r.pick(&[":", ": ", ":\t"]);
        let value = if r.chance(5) { String::new() } else { host(r) };
        s.push_str(&format!("{name}{sep}{value}{eol}"));
    }
    if r.chance(90) {
        s.push_str(eol);
        if r.chance(20) {
            s.push_str(&format!("Host: {}{eol}", host(r)));
        }
    }
    let mut bytes = s.into_bytes();
    if r.chance(15) {
        let cut = r.index(bytes.len() + 1);
        bytes.truncate(cut);
    }
    bytes
}

fn payload(r: &mut Rng) -> Vec<u8> {
    match r.index(20) {
        0 => b"HTTP/1.1 200 OK\r\nHost: example.com\r\n\r\n".to_vec(),
        1 => vec![0x16, 0x03, 0x01, 0x02, 0x00, b'e', b'x'],
        2 => Vec::new(),
        _ => http_payload(r),
    }
}

/// A frame to `tenant`'s server network: TCP (mostly), UDP, IPv4 or IPv6.
fn frame(r: &mut Rng, tenant: u8) -> Vec<u8> {
    let dport = *[80u16, 8080, 443, 3128].get(r.index(4)).unwrap();
    let body = payload(r);
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let mut v = Vec::new();
    if r.chance(20) {
        let mut dst = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        dst[5] = tenant;
        let ip = b.ipv6([0xfe; 16], dst, 64);
        if r.chance(10) {
            ip.udp(40000, dport).write(&mut v, &body).unwrap();
        } else {
            ip.tcp(40000, dport, 1, 1000).write(&mut v, &body).unwrap();
        }
    } else {
        let ip = b.ipv4([192, 168, 0, 10], [10, tenant, 0, 1], 64);
        if r.chance(10) {
            ip.udp(40000, dport).write(&mut v, &body).unwrap();
        } else {
            ip.tcp(40000, dport, 1, 1000).write(&mut v, &body).unwrap();
        }
    }
    v
}

/// Tenants with different blacklists (and one with a port filter).
fn dpi_tenants() -> Vec<(Vec<String>, Option<Vec<u16>>)> {
    let list = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        (list(&["example.com", "ads.tracker.net"]), None),
        (list(&["news.org"]), Some(vec![80, 8080])),
        (Vec::new(), None),
        (
            list(&[
                "evil.co.uk",
                "example.org",
                "localhost",
                "xn--bcher-kva.example",
            ]),
            None,
        ),
        ((0..200).map(|i| format!("d{i}.test")).collect(), None),
        (list(&["tracker.net", "com"]), Some(vec![3128])),
    ]
}

fn ebpf_policy(blacklist: &[String], ports: &Option<Vec<u16>>) -> EbpfPolicy {
    let mut maps = BTreeMap::new();
    maps.insert(
        "blacklist".to_owned(),
        MapInit {
            strings: Some(blacklist.to_vec()),
            ..MapInit::default()
        },
    );
    if let Some(p) = ports {
        maps.insert(
            "ports".to_owned(),
            MapInit {
                u16: Some(p.clone()),
                ..MapInit::default()
            },
        );
    }
    EbpfPolicy {
        maps,
        ..EbpfPolicy::default()
    }
}

#[test]
fn ebpf_dpi_gives_the_native_dpis_verdicts_and_counters() {
    for program in DPI_PROGRAMS {
        let Some(elf) = build::elf("dpi equivalence", program) else {
            return;
        };
        let native = Dpi::default();
        let tenants = dpi_tenants();
        for engine in engines() {
            let nf = EbpfNf::from_elf(&elf, opts(engine)).unwrap();
            let mut states: Vec<(DpiState, EbpfState)> = tenants
                .iter()
                .map(|(bl, ports)| {
                    let mut n = DpiState::default();
                    native
                        .init(
                            &DpiPolicy {
                                blacklist: bl.clone(),
                                ports: ports.clone(),
                            },
                            &mut n,
                        )
                        .unwrap();
                    let mut e = EbpfState::default();
                    nf.init(&ebpf_policy(bl, ports), &mut e).unwrap();
                    (n, e)
                })
                .collect();
            let mut r = Rng::new(0x5eed_0000_0000_0001);
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            for k in 0..6000 {
                let t = r.index(tenants.len());
                let bytes = frame(&mut r, t as u8 + 1);
                let (ns, es) = &mut states[t];
                let meta = PacketMeta {
                    tenant: TenantId(t as u32 + 1),
                    ..PacketMeta::default()
                };
                let mut a = bytes.clone();
                let want = native.handle(&mut Packet::parse(&mut a, meta).unwrap(), ns);
                let mut b = bytes.clone();
                let got = nf.handle(&mut Packet::parse(&mut b, meta).unwrap(), es);
                assert_eq!(
                    got,
                    want,
                    "{program} {engine:?}, packet {k}, tenant {t}: {:?}",
                    String::from_utf8_lossy(&bytes[54.min(bytes.len())..])
                );
                *seen.entry(format!("{want:?}")).or_default() += 1;
            }
            // The traffic exercises every outcome.
            for v in ["Pass", "Drop(Policy)", "Drop(Malformed)"] {
                assert!(seen.get(v).is_some_and(|&n| n > 20), "{v}: {seen:?}");
            }
            for (t, (ns, es)) in states.iter().enumerate() {
                let want: BTreeMap<&str, u64> = ns
                    .summary()
                    .into_iter()
                    .filter(|(k, _)| !k.starts_with("blacklist_hits"))
                    .collect();
                let got: BTreeMap<&str, u64> = nf
                    .summary(es)
                    .into_iter()
                    .filter(|(k, _)| *k != "faults")
                    .collect();
                assert_eq!(got, want, "{program} {engine:?}, tenant {t}: counters");
                let hits: Vec<u64> = nf
                    .map_bytes(es, "hits")
                    .unwrap()
                    .chunks(8)
                    .take(ns.domain_hits().len())
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                assert_eq!(
                    hits,
                    ns.domain_hits(),
                    "{program} {engine:?}, tenant {t}: hits"
                );
                assert_eq!(es.faults(), 0);
            }
        }
    }
}

#[test]
fn ebpf_dpi_matches_the_native_unit_cases() {
    for program in DPI_PROGRAMS {
        let Some(elf) = build::elf("dpi unit cases", program) else {
            return;
        };
        let tcp = |dport: u16, payload: &[u8]| {
            let mut v = Vec::new();
            PacketBuilder::ethernet2([1; 6], [2; 6])
                .ipv4([192, 168, 0, 10], [192, 168, 1, 1], 64)
                .tcp(40000, dport, 1, 1000)
                .write(&mut v, payload)
                .unwrap();
            v
        };
        let mut cases: Vec<Vec<u8>> = [
            "example.com",
            "EXAMPLE.com",
            "www.example.com",
            "a.b.c.Example.COM",
            "example.com:8080",
            "example.com.",
            "  example.com  ",
            "user@example.com:80",
            "ads.tracker.net",
            "x.ads.tracker.net",
            "badexample.com",
            "example.com.evil",
            "tracker.net",
            "[::1]:80",
            "10.0.0.1",
            "",
        ]
        .iter()
        .map(|h| {
            tcp(
                80,
                format!("GET /i HTTP/1.1\r\nUser-Agent: t\r\nHost: {h}\r\n\r\n").as_bytes(),
            )
        })
        .collect();
        for p in [
            &b"GET http://www.example.com:80/x HTTP/1.1\r\nHost: fine.org\r\n\r\n"[..],
            b"GET https://fine.org/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
            b"CONNECT example.com:443 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: fine.org\r\nhOsT:example.com\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: fine.org\r\n\r\nHost: example.com\r\n",
            b"GET / HTTP/1.0\nHost: example.com\n\n",
            b"GET / HTTP/1.1\r\nHost: example.c",
            b"GET / HTTP/1.1\r\nHost: example.com\r\nAccept: te",
            b"GET /very/long",
            b"HTTP/1.1 200 OK\r\nHost: example.com\r\n\r\n",
            b"get / HTTP/1.1\r\nHost: example.com\r\n\r\n",
            b"GET http:///x HTTP/1.1\r\n\r\n",
            b"GET ftp://example.com/ HTTP/1.1\r\nHost: fine.org\r\n\r\n",
        ] {
            cases.push(tcp(80, p));
        }
        cases.push(tcp(
            80,
            format!("GET / HTTP/1.1\r\nHost: {}.com\r\n\r\n", "a".repeat(300)).as_bytes(),
        ));
        let full = b"GET http://x.example.com/ HTTP/1.1\r\nHost: a@example.com:1\r\n\r\n";
        for n in 0..full.len() {
            cases.push(tcp(80, &full[..n]));
        }
        let bl = vec!["example.com".to_owned(), "ads.tracker.net".to_owned()];
        for engine in engines() {
            let nf = EbpfNf::from_elf(&elf, opts(engine)).unwrap();
            let mut e = EbpfState::default();
            nf.init(&ebpf_policy(&bl, &None), &mut e).unwrap();
            let mut n = DpiState::default();
            Dpi::default()
                .init(
                    &DpiPolicy {
                        blacklist: bl.clone(),
                        ports: None,
                    },
                    &mut n,
                )
                .unwrap();
            for c in &cases {
                let (mut a, mut b) = (c.clone(), c.clone());
                let want = Dpi::default().handle(
                    &mut Packet::parse(&mut a, PacketMeta::default()).unwrap(),
                    &mut n,
                );
                let got = nf.handle(
                    &mut Packet::parse(&mut b, PacketMeta::default()).unwrap(),
                    &mut e,
                );
                assert_eq!(
                    got,
                    want,
                    "{engine:?}: {:?}",
                    String::from_utf8_lossy(&c[54..])
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

#[test]
fn the_ttl_example_rewrites_the_packet_and_keeps_its_checksum_valid() {
    let Some(elf) = build::elf("ttl", "ttl") else {
        return;
    };
    for engine in engines() {
        let nf = EbpfNf::from_elf(&elf, opts(engine)).unwrap();
        let mut st = EbpfState::default();
        nf.init(&EbpfPolicy::default(), &mut st).unwrap();
        for ttl in [64u8, 2, 1, 0] {
            let mut v = Vec::new();
            PacketBuilder::ethernet2([1; 6], [2; 6])
                .ipv4([10, 0, 0, 1], [10, 9, 8, 7], ttl)
                .udp(1, 2)
                .write(&mut v, b"payload")
                .unwrap();
            let verdict = nf.handle(
                &mut Packet::parse(&mut v, PacketMeta::default()).unwrap(),
                &mut st,
            );
            let ip = etherparse::Ipv4HeaderSlice::from_slice(&v[14..]).unwrap();
            if ttl <= 1 {
                assert_eq!(verdict, Verdict::Drop(DropCause::Policy));
                assert_eq!(ip.ttl(), ttl);
            } else {
                assert_eq!(verdict, Verdict::Tx);
                assert_eq!(ip.ttl(), ttl - 1);
                assert_eq!(
                    ip.header_checksum(),
                    ip.to_header().calc_header_checksum(),
                    "{engine:?}: incremental checksum"
                );
            }
        }
        let s: BTreeMap<_, _> = nf.summary(&st).into_iter().collect();
        assert_eq!((s["forwarded"], s["expired"]), (2, 2));
    }
}

#[test]
fn the_monitor_and_firewall_examples_count_flows_and_block_ports() {
    let test = "flowmon/portblock";
    let (Some(flowmon), Some(portblock)) =
        (build::elf(test, "flowmon"), build::elf(test, "portblock"))
    else {
        return;
    };
    // 40 flows (ports 1000..1040 to 10.0.0.x:22/53/80/443), each seen 3 times.
    let frames: Vec<Vec<u8>> = (0..120u16)
        .map(|i| {
            let f = i % 40;
            let mut v = Vec::new();
            PacketBuilder::ethernet2([1; 6], [2; 6])
                .ipv4([192, 168, 0, 1], [10, 0, 0, (f % 7) as u8], 64)
                .udp(1000 + f, [22u16, 53, 80, 443][usize::from(f % 4)])
                .write(&mut v, b"abcd")
                .unwrap();
            v
        })
        .collect();
    let maps = |name: &str, init: MapInit| EbpfPolicy {
        maps: [(name.to_owned(), init)].into(),
        ..EbpfPolicy::default()
    };
    for engine in engines() {
        // A table of 64 flows holds all 40; of 8 flows, evicts.
        for (capacity, evict) in [(64u32, false), (8, true)] {
            let nf = EbpfNf::from_elf(&flowmon, opts(engine)).unwrap();
            let mut st = EbpfState::default();
            let cfg = MapInit {
                u32: Some(vec![capacity]),
                ..MapInit::default()
            };
            nf.init(&maps("config", cfg), &mut st).unwrap();
            for f in &frames {
                let mut b = f.clone();
                let v = nf.handle(
                    &mut Packet::parse(&mut b, PacketMeta::default()).unwrap(),
                    &mut st,
                );
                assert_eq!(v, Verdict::Pass);
            }
            let s: BTreeMap<_, _> = nf.summary(&st).into_iter().collect();
            assert_eq!(s["monitored_packets"], 120, "{engine:?}");
            if evict {
                assert!(s["flow_evictions"] > 0, "{engine:?}: {s:?}");
                assert!(s["flows"] <= 8, "{engine:?}: {s:?}");
            } else {
                assert_eq!((s["flows"], s["flow_evictions"]), (40, 0), "{engine:?}");
            }
        }
        let nf = EbpfNf::from_elf(&portblock, opts(engine)).unwrap();
        let mut st = EbpfState::default();
        let blocked = MapInit {
            u16: Some(vec![22, 23]),
            ..MapInit::default()
        };
        nf.init(&maps("blocked", blocked), &mut st).unwrap();
        let mut dropped = 0;
        for f in &frames {
            let mut b = f.clone();
            let v = nf.handle(
                &mut Packet::parse(&mut b, PacketMeta::default()).unwrap(),
                &mut st,
            );
            if v == Verdict::Drop(DropCause::Policy) {
                dropped += 1;
            }
        }
        let s: BTreeMap<_, _> = nf.summary(&st).into_iter().collect();
        assert_eq!(
            (dropped, s["dropped"], s["packets"]),
            (30, 30, 120),
            "{engine:?}"
        );
    }
}

/// The protection benchmark's eBPF twins decide as the Rust NFs: macswap rewrites every
/// frame identically, the policer passes and drops the same packets (bytes and packets
/// units, a rate that drops about half, timestamps that jump and go backwards).
#[test]
fn the_macswap_and_policer_examples_decide_as_the_rust_nfs() {
    use buffet::nfs::macswap::{MacSwap, MacSwapPolicy, MacSwapState};
    use buffet::nfs::policer::{Policer, PolicerPolicy, PolicerUnit, TokenBucket};
    let test = "macswap/policer";
    let (Some(macswap), Some(policer)) = (build::elf(test, "macswap"), build::elf(test, "policer"))
    else {
        return;
    };
    let mut r = Rng::new(0x0901_1ce5);
    let frames: Vec<(u64, Vec<u8>)> = {
        let mut ts = 1_000u64;
        (0..2_000u32)
            .map(|i| {
                ts = match r.below(20) {
                    0 => ts.saturating_sub(r.below(50_000)),
                    1 => ts + 5_000_000,
                    _ => ts + r.below(20_000),
                };
                let mut v = Vec::new();
                let len = 42 + r.below(1400) as usize;
                PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
                    .ipv4([192, 168, 0, 1], [10, 0, 0, (i % 7) as u8], 64)
                    .udp(1000, 80)
                    .write(&mut v, &vec![0u8; len - 42])
                    .unwrap();
                (ts, v)
            })
            .collect()
    };
    for engine in engines() {
        let nf = EbpfNf::from_elf(&macswap, opts(engine)).unwrap();
        let mut st = EbpfState::default();
        nf.init(&EbpfPolicy::default(), &mut st).unwrap();
        let mut rust = MacSwapState::default();
        MacSwap.init(&MacSwapPolicy {}, &mut rust).unwrap();
        for (_, f) in &frames {
            let (mut a, mut b) = (f.clone(), f.clone());
            let va = nf.handle(
                &mut Packet::parse(&mut a, PacketMeta::default()).unwrap(),
                &mut st,
            );
            let vb = MacSwap.handle(
                &mut Packet::parse(&mut b, PacketMeta::default()).unwrap(),
                &mut rust,
            );
            assert_eq!((va, &a), (vb, &b), "{engine:?}");
        }
        for (unit, code, rate, burst) in [
            (PolicerUnit::Bytes, 0u64, 20_000_000u64, 10_000u64),
            (PolicerUnit::Packets, 1, 50_000, 20),
        ] {
            let nf = EbpfNf::from_elf(&policer, opts(engine)).unwrap();
            let mut st = EbpfState::default();
            let init = MapInit {
                u64: Some(vec![rate, burst, code]),
                ..MapInit::default()
            };
            let policy = EbpfPolicy {
                maps: [("bucket".to_owned(), init)].into(),
                ..EbpfPolicy::default()
            };
            nf.init(&policy, &mut st).unwrap();
            let mut rust = TokenBucket::default();
            Policer
                .init(&PolicerPolicy { rate, burst, unit }, &mut rust)
                .unwrap();
            let mut dropped = 0;
            for (ts, f) in &frames {
                let meta = PacketMeta {
                    ts_ns: *ts,
                    ..PacketMeta::default()
                };
                let (mut a, mut b) = (f.clone(), f.clone());
                let va = nf.handle(&mut Packet::parse(&mut a, meta).unwrap(), &mut st);
                let vb = Policer.handle(&mut Packet::parse(&mut b, meta).unwrap(), &mut rust);
                assert_eq!(va, vb, "{engine:?} {unit:?} at {ts}");
                dropped += usize::from(va != Verdict::Pass);
            }
            assert!(
                (200..1_800).contains(&dropped),
                "{engine:?} {unit:?}: the rate limits some packets, not all ({dropped})"
            );
        }
    }
}

#[test]
fn a_bpf_to_bpf_call_is_linked_and_gets_its_own_frame() {
    let Some(elf) = build::elf("bpf-to-bpf call", "subprog") else {
        return;
    };
    let image = buffet::ebpf::elf::load(&elf, None).unwrap();
    // The callee lives in .text: the loader appended it after the program and turned the
    // relocated call into a pc-relative one.
    let calls: Vec<i32> = image
        .insns
        .chunks(8)
        .filter(|i| i[0] == 0x85 && i[1] >> 4 == 1)
        .map(|i| i32::from_le_bytes(i[4..8].try_into().unwrap()))
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0] > 0,
        "a forward call into the appended .text: {calls:?}"
    );
    for engine in engines() {
        let nf = EbpfNf::from_elf(&elf, opts(engine)).unwrap();
        let mut st = EbpfState::default();
        nf.init(&EbpfPolicy::default(), &mut st).unwrap();
        let mut good = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1, 2)
            .write(&mut good, b"x")
            .unwrap();
        let mut bad = good.clone();
        bad[24] ^= 0x55; // the IPv4 header checksum
        for (frame, want) in [
            (good, Verdict::Pass),
            (bad, Verdict::Drop(DropCause::Integrity)),
        ] {
            let mut b = frame.clone();
            let got = nf.handle(
                &mut Packet::parse(&mut b, PacketMeta::default()).unwrap(),
                &mut st,
            );
            assert_eq!(got, want, "{engine:?}");
        }
        let s: BTreeMap<_, _> = nf.summary(&st).into_iter().collect();
        assert_eq!((s["checked"], s["bad"]), (2, 1), "{engine:?}");
    }
}

#[test]
fn map_policies_are_checked_at_admission() {
    let Some(elf) = build::elf("policies", "counter") else {
        return;
    };
    let nf = EbpfNf::from_elf(&elf, LoadOptions::default()).unwrap();
    let bad = |maps: &[(&str, MapInit)]| {
        let p = EbpfPolicy {
            maps: maps
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..EbpfPolicy::default()
        };
        let mut st = EbpfState::default();
        nf.init(&p, &mut st).unwrap_err()
    };
    let field = |e: InitError| match e {
        InitError::InvalidPolicy { field, message } => format!("{field}: {message}"),
        other => panic!("{other:?}"),
    };
    let e = field(bad(&[("nope", MapInit::default())]));
    assert!(
        e.contains("maps.nope") && e.contains("per_proto, config"),
        "{e}"
    );
    let e = field(bad(&[(
        "config",
        MapInit {
            u32: Some(vec![1, 2]),
            ..MapInit::default()
        },
    )]));
    assert!(
        e.contains("maps.config") && e.contains("the map has 4"),
        "{e}"
    );
    let e = field(bad(&[(
        "config",
        MapInit {
            strings: Some(vec!["x".into()]),
            ..MapInit::default()
        },
    )]));
    assert!(e.contains("not strings"), "{e}");
    let e = field(bad(&[(
        "config",
        MapInit {
            u8: Some(vec![1]),
            u16: Some(vec![1]),
            ..MapInit::default()
        },
    )]));
    assert!(e.contains("exactly one"), "{e}");
    // A tenant program the verifier rejects, named in the policy.
    let reject = build::object("policies", "reject_oob").unwrap();
    let mut st = EbpfState::default();
    let e = field(
        nf.init(
            &EbpfPolicy {
                program: Some(reject),
                ..EbpfPolicy::default()
            },
            &mut st,
        )
        .unwrap_err(),
    );
    assert!(
        e.starts_with("program: ") && e.contains("Upper bound must be at most packet_size"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------
// Fault containment

fn udp_frame(tenant: u32, seq: u32) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([192, 168, 0, 1], [10, 0, tenant as u8, 1], 64)
        .udp(1000 + tenant as u16, 53)
        .write(&mut v, &seq.to_le_bytes())
        .unwrap();
    v
}

#[test]
fn a_faulting_tenant_is_quarantined_and_the_others_lose_nothing() {
    let test = "fault containment";
    let (Some(counter), Some(fault)) = (build::elf(test, "counter"), build::object(test, "fault"))
    else {
        return;
    };
    for engine in engines() {
        let nf = Arc::new(EbpfNf::from_elf(&counter, opts(engine)).unwrap());
        let storage = MemoryStorage::new(ArenaConfig { capacity: 64 << 20 }).unwrap();
        let table = Arc::new(TenantTable::new(storage, 4));
        for slot in 0..4u32 {
            // Tenant 3 (slot 2) runs its own program, which faults after 20 packets.
            let policy = if slot == 2 {
                EbpfPolicy {
                    program: Some(fault.clone()),
                    maps: [(
                        "config".to_owned(),
                        MapInit {
                            u32: Some(vec![20]),
                            ..MapInit::default()
                        },
                    )]
                    .into(),
                    ..EbpfPolicy::default()
                }
            } else {
                EbpfPolicy::default()
            };
            let mut st = EbpfState::default();
            nf.init(&policy, &mut st).unwrap();
            table
                .admit(
                    TenantSlot(slot),
                    TenantId(slot + 1),
                    nf.register().bytes,
                    st,
                )
                .unwrap();
        }
        let mut worker = Worker::new(nf.clone(), table.clone());
        let mut outcomes = vec![Vec::new(); 4];
        for burst_no in 0..10u32 {
            // 32 packets per burst, the four tenants interleaved.
            let mut burst: Vec<PacketBuf> = (0..32u32)
                .map(|k| {
                    let slot = k % 4;
                    let mut m = PacketBuf::heap();
                    assert!(m.fill(&udp_frame(slot + 1, burst_no * 32 + k)));
                    m.tenant = TenantSlot(slot);
                    m
                })
                .collect();
            worker.process(&mut burst);
            for m in &burst {
                outcomes[m.tenant.0 as usize].push(m.outcome);
            }
        }
        let count = |o: &[Outcome], want: Outcome| o.iter().filter(|&&x| x == want).count();
        let pass = Outcome::Nf(Verdict::Pass);
        assert_eq!(count(&outcomes[2], pass), 20, "{engine:?}");
        assert_eq!(count(&outcomes[2], Outcome::Quarantined), 60, "{engine:?}");
        for slot in [0, 1, 3] {
            assert_eq!(count(&outcomes[slot], pass), 80, "{engine:?}, slot {slot}");
        }
        // The faulting tenant's state says why; the others counted every packet.
        let faulty = table.get_arc(TenantSlot(2)).unwrap();
        let st = faulty.lock();
        assert_eq!(st.faults(), 1);
        assert_eq!(
            st.last_fault(),
            Some("return value 0xdead is not a verdict"),
            "{engine:?}"
        );
        drop(st);
        for slot in [0u32, 1, 3] {
            let e = table.get_arc(TenantSlot(slot)).unwrap();
            let s: BTreeMap<_, _> = nf.summary(&e.lock()).into_iter().collect();
            assert_eq!((s["packets"], s["udp"], s["faults"]), (80, 80, 0));
        }
    }
}

fn rules(tenant: u32) -> Vec<(u32, Match)> {
    vec![(
        100,
        Match {
            dst_ip: Some(format!("10.0.{tenant}.0/24").parse().unwrap()),
            ..Match::default()
        },
    )]
}

fn dpi_spec(t: u32, policy: EbpfPolicy) -> TenantSpec<EbpfPolicy> {
    TenantSpec {
        id: TenantId(t),
        name: format!("t{t}"),
        rules: rules(t),
        max_nb: 0,
        policy,
    }
}

#[test]
fn a_rejected_program_is_an_admission_error_that_changes_nothing_under_traffic() {
    let test = "admission";
    let (Some(dpi), Some(reject), Some(fault)) = (
        build::elf(test, "dpi"),
        build::object(test, "reject_loop"),
        build::object(test, "fault"),
    ) else {
        return;
    };
    let nf = EbpfNf::from_elf(&dpi, LoadOptions::default()).unwrap();
    let cfg = PipelineConfig {
        workers: 2,
        pin: false,
        ring_size: 64,
        burst: 32,
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: 30,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = Pipeline::new(nf, cfg).unwrap();
    for t in 1..=3 {
        p.admit(dpi_spec(t, ebpf_policy(&["example.com".into()], &None)))
            .unwrap();
    }
    // Tenant 5 faults after 10 packets (its own program); tenant 4 comes later.
    p.admit(dpi_spec(
        5,
        EbpfPolicy {
            program: Some(fault),
            maps: [(
                "config".to_owned(),
                MapInit {
                    u32: Some(vec![10]),
                    ..MapInit::default()
                },
            )]
            .into(),
            ..EbpfPolicy::default()
        },
    ))
    .unwrap();
    let mut sent = [0u64; 6];
    let push = |p: &mut Pipeline<EbpfNf>, sent: &mut [u64; 6], round: u32| {
        for t in [1u32, 2, 3, 4, 5] {
            for k in 0..10 {
                p.push(u64::from(round * 100 + k), 0, &udp_frame(t, round * 10 + k));
                sent[t as usize] += 1;
            }
        }
    };
    for round in 0..5 {
        push(&mut p, &mut sent, round);
    }
    // The verifier rejects tenant 4's program: a clear admission error, nothing changes.
    let before = p.report();
    let err = p
        .admit(dpi_spec(
            4,
            EbpfPolicy {
                program: Some(reject),
                ..EbpfPolicy::default()
            },
        ))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            PipelineError::Policy {
                tenant: TenantId(4),
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("rejected by the verifier") && msg.contains("Loop counter is too large"),
        "{msg}"
    );
    assert!(p.slot_of(TenantId(4)).is_none());
    assert_eq!(p.report().tenants.len(), before.tenants.len());
    for round in 5..10 {
        push(&mut p, &mut sent, round);
    }
    let report = p.finish();
    let by_id: BTreeMap<u32, _> = report.tenants.iter().map(|t| (t.id.0, t)).collect();
    for t in [1u32, 2, 3] {
        let r = by_id[&t];
        assert_eq!(r.packets, sent[t as usize], "tenant {t}");
        assert_eq!(r.passed, sent[t as usize], "tenant {t} lost a packet");
        assert!(!r.quarantined);
    }
    assert!(!by_id.contains_key(&4), "tenant 4 was never admitted");
    assert_eq!(
        report.global.unmatched, sent[4],
        "its traffic matches no tenant"
    );
    let r5 = by_id[&5];
    assert!(r5.quarantined);
    assert_eq!(r5.passed, 10);
    assert_eq!(r5.packets, sent[5]);
    assert!(report.events.iter().any(|e| matches!(
        e,
        WorkerEvent::Fault {
            tenant: TenantId(5),
            ..
        }
    )));
}
