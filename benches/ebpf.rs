//! `ebpf`: what running an NF as verified eBPF costs a worker core, against the same NF
//! in native Rust — the NSX DPI (HTTP Host blacklist), `buffet_nfs::Dpi` vs
//! `examples/ebpf/dpi.c` (the same verdicts and counters, tested in `tests/ebpf.rs`).
//!
//! One core, packets in memory, `buffet_worker::Worker` inline (as in `multitenancy` and
//! `isolation`): bursts of 256 packets made of eight 32-packet tenant groups; with 8
//! tenants every burst holds all of them, with 1,000 tenants consecutive bursts walk
//! through all tenants round robin. Every packet is an HTTP request (the DPI's worst
//! case: the whole request line and header block are scanned), half of them to a
//! blacklisted host (the NSX paper's yahoo.com, facebook.com, example.com, youtube.com)
//! and half to clean ones (vmware.com, google.com, slashdot.org, ...).
//!
//! Arms, in one criterion group so that the ratio is the result:
//!
//! * `native` — `buffet_nfs::Dpi` (Rust, hash-set lookups of each parent domain);
//! * `ebpf-interp` — `dpi.c` verified by PREVAIL, run by rbpf's interpreter (every memory
//!   access checked at run time);
//! * `ebpf-jit` — the same program through rbpf's x86-64 JIT (Buffet-patched; no run-time
//!   checks: the verifier's proof is the safety argument). x86-64 only;
//! * `ebpf-jit-scan` — `examples/ebpf/dpi_scan.c` through the JIT: the same DPI scanning
//!   every payload byte in the program instead of calling `buffet_pkt_find` (memchr) and
//!   the host-normalising lookup.
//!
//! Run: `cargo bench --bench ebpf`. Needs clang (`clang -target bpf`); without it the
//! eBPF arms are skipped with a message.

#[path = "../tests/build.rs"]
mod build;
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use buffet::ebpf::{EbpfNf, EbpfPolicy, Engine as EbpfEngine, LoadOptions, MapInit};
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::dpi::{Dpi, DpiPolicy};
use buffet::sdk::{NetworkFunction, TenantId, TenantSlot};
use buffet::worker::Worker;
use common::{bursts, run, PACKETS, TENANT_COUNTS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const BLACKLIST: [&str; 4] = ["yahoo.com", "facebook.com", "example.com", "youtube.com"];
const HOSTS: [&str; 8] = [
    "www.yahoo.com",
    "www.vmware.com",
    "m.facebook.com",
    "www.google.com",
    "example.com",
    "slashdot.org",
    "www.youtube.com:80",
    "news.ycombinator.com",
];

/// An HTTP request of tenant `t` to `HOSTS[i % 8]`, as wget sends it.
fn frame(t: u32, i: usize) -> Vec<u8> {
    let host = HOSTS[i % HOSTS.len()];
    let req = format!(
        "GET /index.html HTTP/1.1\r\nUser-Agent: Wget/1.21.3\r\nAccept: */*\r\n\
         Accept-Encoding: identity\r\nHost: {host}\r\nConnection: Keep-Alive\r\n\r\n"
    );
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([192, 168, 0, 1], [10, (t >> 8) as u8, t as u8, 1], 64)
        .tcp(40000 + i as u16, 80, 1, 64240)
        .write(&mut v, req.as_bytes())
        .expect("frame");
    v
}

fn engine<N: NetworkFunction>(nf: N, policy: &N::Policy, n: u32) -> Worker<N> {
    let storage = MemoryStorage::new(ArenaConfig::default()).expect("arena");
    let table = Arc::new(TenantTable::new(storage, n));
    for t in 0..n {
        let mut state = N::State::default();
        nf.init(policy, &mut state).expect("policy");
        table
            .admit(TenantSlot(t), TenantId(t + 1), nf.register().bytes, state)
            .expect("admit");
    }
    Worker::new(Arc::new(nf), table)
}

fn dpi(c: &mut Criterion) {
    let elf = match build::objects() {
        Ok(dir) => Some((
            std::fs::read(dir.join("dpi.o")).expect("dpi.o"),
            std::fs::read(dir.join("dpi_scan.o")).expect("dpi_scan.o"),
        )),
        Err(e) => {
            eprintln!("ebpf: eBPF arms skipped: {e}");
            None
        }
    };
    let native_policy = DpiPolicy {
        blacklist: BLACKLIST.iter().map(|s| s.to_string()).collect(),
        ports: None,
    };
    let ebpf_policy = EbpfPolicy {
        maps: [(
            "blacklist".to_owned(),
            MapInit {
                strings: Some(native_policy.blacklist.clone()),
                ..MapInit::default()
            },
        )]
        .into(),
        ..EbpfPolicy::default()
    };
    let mut arms = vec![("ebpf-interp", EbpfEngine::Interpreter, false)];
    if cfg!(all(target_arch = "x86_64", unix)) {
        arms.push(("ebpf-jit", EbpfEngine::Jit, false));
        arms.push(("ebpf-jit-scan", EbpfEngine::Jit, true));
    }
    let mut group = c.benchmark_group("dpi");
    group
        .throughput(Throughput::Elements(PACKETS as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .sample_size(20);
    for &n in &TENANT_COUNTS {
        let mut b = bursts(n, frame);
        let mut native = engine(Dpi::with_max_domains(64), &native_policy, n);
        group.bench_function(BenchmarkId::new("native", n), |bch| {
            bch.iter(|| black_box(run(&mut native, &mut b)))
        });
        let Some((dpi, dpi_scan)) = &elf else {
            continue;
        };
        for &(arm, kind, scan) in &arms {
            let opts = LoadOptions {
                engine: kind,
                ..LoadOptions::default()
            };
            let obj = if scan { dpi_scan } else { dpi };
            let nf = EbpfNf::from_elf(obj, opts).expect("the DPI object loads");
            let mut e = engine(nf, &ebpf_policy, n);
            group.bench_function(BenchmarkId::new(arm, n), |bch| {
                bch.iter(|| black_box(run(&mut e, &mut b)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, dpi);
criterion_main!(benches);
