//! `isolation`: what each isolation level costs a worker core, per packet.
//!
//! One core, packets in memory, `buffet_worker::Worker` inline (as in `multitenancy`):
//! bursts of 256 packets made of eight 32-packet tenant groups (the Packet Buffers a
//! worker runs with one state load — and, under MPK, one domain switch — each). With 8
//! tenants every burst holds all of them; with 1,000 tenants consecutive bursts walk
//! through all tenants round robin, so each group's tenant last ran 124 bursts ago.
//!
//! Two logics, each a criterion group, with these arms:
//!
//! * `monitor` — per-flow packet/byte counters. Rust: `buffet_nfs::Monitor`; C:
//!   `examples/c-nf/flowmon.c` (the same table shape, in the tenant's region).
//! * `firewall` — drop by destination port. Rust: `buffet_nfs::Firewall` (ordered ACL,
//!   tuple-space search), two deny rules; C: `examples/c-nf/portblock.c` (counters and a
//!   blocked-port list). A quarter of the packets go to a blocked port.
//!
//! | arm        | NF code | domain       | calls                                   |
//! |------------|---------|--------------|-----------------------------------------|
//! | `none`     | C       | `Domain::None` | direct (`Containment::Unguarded`)     |
//! | `none+guard` | C     | `Domain::None` | through the fault-containment shim    |
//! | `mpk`      | C       | `Domain::Mpk`  | through the fault-containment shim    |
//! | `safe`     | Rust    | `Domain::None` | direct                                |
//! | `safe+mpk` | Rust    | `Domain::Mpk`  | direct                                |
//! | `ebpf`     | eBPF    | `Domain::None` | rbpf interpreter (checks every access) |
//! | `ebpf-jit` | eBPF    | `Domain::None` | rbpf x86-64 JIT (Buffet-patched)      |
//!
//! `none` → `mpk` is the full price of MPK for native code (PKRU switch per group, key
//! cache, the shim's setjmp per chunk of up to 32 packets); `none` → `none+guard` is the
//! shim alone, and `safe` → `safe+mpk` the domain switch alone on
//! identical Rust code. `none` vs `safe` compares C and Rust implementations of similar,
//! not identical, logic. The eBPF arms run `examples/ebpf/flowmon.c` and
//! `examples/ebpf/portblock.c` — the same logic as the C NFs, as verified bytecode
//! (buffet-ebpf); they need clang and are skipped with a message without it.
//!
//! FastPaas's protection figures (Figs. 5–7) and NSX-BPF's Table 1 add two more logics,
//! the cheapest NFs, so that what each level adds per packet shows: `macswap` (swap the
//! Ethernet addresses, send back; Rust `buffet_nfs::MacSwap`, C
//! `examples/c-nf/macswap.c`, eBPF `examples/ebpf/macswap.c`) and `policer` (a token
//! bucket in packets whose bucket no run empties; `buffet_nfs::Policer`,
//! `examples/c-nf/policer.c`, `examples/ebpf/policer.c`), each at 64- and 1,500-byte
//! frames: groups `macswap-64B`, `macswap-1500B`, `policer-64B`, `policer-1500B`, with the
//! same arms.
//!
//! A last group, `mpk-key`, measures one state lock + unlock (enter + leave the domain):
//! `none` (no domain), `hit` (the key is cached), `miss` (15 tenants locked round robin
//! over 14 cache keys, equally hot: every lock misses — two `pkey_mprotect`s). The key cache's own
//! average miss time (`MpkStats::miss_ns / misses`) is printed at the end.
//!
//! Run: `cargo bench --bench isolation`. Needs a C compiler; the MPK arms need `pku`
//! and the eBPF arms clang (each is skipped with a message without it).

#[path = "../tests/build.rs"]
mod build;
mod common;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use buffet::cnf::{CNf, Containment};
use buffet::ebpf::{EbpfNf, EbpfPolicy, Engine as EbpfEngine, LoadOptions, MapInit};
use buffet::memory::{ArenaConfig, Domain, MemoryStorage, Mpk, TenantTable};
use buffet::nfs::firewall::{Firewall, FirewallLimits, FirewallPolicy};
use buffet::nfs::macswap::{MacSwap, MacSwapPolicy};
use buffet::nfs::monitor::{Monitor, MonitorPolicy};
use buffet::nfs::policer::{Policer, PolicerPolicy, PolicerUnit};
use buffet::sdk::{NetworkFunction, TenantId, TenantSlot};
use buffet::worker::Worker;
use common::{bursts, run, PACKETS, TENANT_COUNTS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Compiles examples/c-nf/<name>.c (once per bench process).
fn c_nf(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-c-nf");
    std::fs::create_dir_all(&dir).expect("bench tmp dir");
    let out = dir.join(format!("{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-O2", "-fPIC", "-shared", "-nostartfiles"])
        // docs/nf-authors.md: what a C NF needs to pass inspection at the mpk level.
        .args([
            "-fno-stack-protector",
            "-fstack-clash-protection",
            "-U_FORTIFY_SOURCE",
        ])
        .arg("-I")
        .arg(root.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("examples/c-nf").join(format!("{name}.c")))
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(st.success(), "compiling {name}.c");
    out
}

/// A UDP frame of tenant `t` (60-byte frame), flow `f` of 4: destination ports 53, 80,
/// 443 and 22 (the blocked one).
fn frame(t: u32, f: u32) -> Vec<u8> {
    let dport = [53u16, 80, 443, 22][f as usize % 4];
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([192, 168, 0, 1], [10, (t >> 8) as u8, t as u8, 1], 64)
        .udp(40000 + f as u16, dport)
        .write(&mut v, &[0u8; 18])
        .expect("frame");
    v
}

/// A Tenant Table for `n` tenants of `bytes` each. The arena is sized to them rather than
/// the default reservation, so that the bench also runs under valgrind (callgrind).
fn table<S: Send + 'static>(domain: Domain, n: u32, bytes: usize) -> Arc<TenantTable<S>> {
    let storage = MemoryStorage::new(ArenaConfig::for_regions(n as usize, bytes)).expect("arena");
    Arc::new(match domain {
        Domain::Mpk => TenantTable::with_mpk(storage, n, Mpk::get().expect("mpk")),
        _ => TenantTable::new(storage, n),
    })
}

/// An engine whose `n` tenants run `nf`, each admitted with `policy` initialised in place.
fn engine<N: NetworkFunction>(nf: N, policy: &N::Policy, domain: Domain, n: u32) -> Worker<N> {
    let table = table::<N::State>(domain, n, nf.register().bytes);
    for t in 0..n {
        table
            .admit_with(
                TenantSlot(t),
                TenantId(t + 1),
                nf.register().bytes,
                N::State::default(),
                |s, r| nf.init_in_region(policy, s, r),
            )
            .expect("admit");
    }
    Worker::new(Arc::new(nf), table)
}

fn firewall_policy() -> FirewallPolicy {
    serde_json::from_value(serde_json::json!({
        "default": "allow",
        "rules": [
            { "action": "deny", "proto": "udp", "dst_port": 22 },
            { "action": "deny", "proto": "udp", "dst_port": 23 },
        ],
    }))
    .expect("firewall policy")
}

/// The eBPF twin of a logic: `examples/ebpf/<name>.c`'s object and its tenant policy;
/// `None` (arms skipped, with a message) without clang.
fn ebpf_nf(name: &str, policy: EbpfPolicy) -> Option<(Vec<u8>, EbpfPolicy)> {
    match build::objects() {
        Ok(dir) => Some((
            std::fs::read(dir.join(format!("{name}.o"))).expect("eBPF object"),
            policy,
        )),
        Err(e) => {
            eprintln!("isolation: eBPF arms skipped: {e}");
            None
        }
    }
}

fn ebpf_map(name: &str, init: MapInit) -> EbpfPolicy {
    EbpfPolicy {
        maps: [(name.to_owned(), init)].into(),
        ..EbpfPolicy::default()
    }
}

/// One logic: its C NF (`c`, with `c_policy`), its Rust NF and its eBPF NF, all arms,
/// over the 60-byte frames of [`frame`].
#[allow(clippy::too_many_arguments)]
fn logic_group<R: NetworkFunction + Clone>(
    c: &mut Criterion,
    name: &str,
    c_path: &Path,
    c_policy: serde_json::Value,
    rust: R,
    rust_policy: R::Policy,
    ebpf: Option<(Vec<u8>, EbpfPolicy)>,
    mpk: bool,
) {
    logic_group_with(
        c,
        name,
        &|t, i| frame(t, i as u32),
        c_path,
        c_policy,
        rust,
        rust_policy,
        ebpf,
        mpk,
    );
}

/// [`logic_group`] over the frames `make(tenant, i)` makes.
#[allow(clippy::too_many_arguments)]
fn logic_group_with<R: NetworkFunction + Clone>(
    c: &mut Criterion,
    name: &str,
    make: &dyn Fn(u32, usize) -> Vec<u8>,
    c_path: &Path,
    c_policy: serde_json::Value,
    rust: R,
    rust_policy: R::Policy,
    ebpf: Option<(Vec<u8>, EbpfPolicy)>,
    mpk: bool,
) {
    let mut group = c.benchmark_group(name);
    group
        .throughput(Throughput::Elements(PACKETS as u64))
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);
    for &n in &TENANT_COUNTS {
        let mut b = bursts(n, make);
        let load = |containment| CNf::load_with(c_path, containment).expect("load C NF");
        let mut none = engine(load(Containment::Unguarded), &c_policy, Domain::None, n);
        group.bench_function(BenchmarkId::new("none", n), |bch| {
            bch.iter(|| black_box(run(&mut none, &mut b)))
        });
        // The shim alone, without MPK: how much of `mpk` is fault containment.
        let mut guarded = engine(load(Containment::Guarded), &c_policy, Domain::None, n);
        group.bench_function(BenchmarkId::new("none+guard", n), |bch| {
            bch.iter(|| black_box(run(&mut guarded, &mut b)))
        });
        let mut safe = engine(rust.clone(), &rust_policy, Domain::None, n);
        group.bench_function(BenchmarkId::new("safe", n), |bch| {
            bch.iter(|| black_box(run(&mut safe, &mut b)))
        });
        if mpk {
            let mut m = engine(load(Containment::Guarded), &c_policy, Domain::Mpk, n);
            group.bench_function(BenchmarkId::new("mpk", n), |bch| {
                bch.iter(|| black_box(run(&mut m, &mut b)))
            });
            let mut sm = engine(rust.clone(), &rust_policy, Domain::Mpk, n);
            group.bench_function(BenchmarkId::new("safe+mpk", n), |bch| {
                bch.iter(|| black_box(run(&mut sm, &mut b)))
            });
        }
        if let Some((obj, policy)) = &ebpf {
            for (arm, kind) in [
                ("ebpf", EbpfEngine::Interpreter),
                ("ebpf-jit", EbpfEngine::Jit),
            ] {
                if kind == EbpfEngine::Jit && !cfg!(all(target_arch = "x86_64", unix)) {
                    continue;
                }
                let opts = LoadOptions {
                    engine: kind,
                    ..LoadOptions::default()
                };
                let nf = EbpfNf::from_elf(obj, opts).expect("the eBPF NF verifies");
                let mut e = engine(nf, policy, Domain::None, n);
                group.bench_function(BenchmarkId::new(arm, n), |bch| {
                    bch.iter(|| black_box(run(&mut e, &mut b)))
                });
            }
        }
    }
    group.finish();
}

fn isolation(c: &mut Criterion) {
    let mpk = match Mpk::get() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("isolation: MPK arms skipped: {e}");
            false
        }
    };
    logic_group(
        c,
        "monitor",
        &c_nf("flowmon"),
        serde_json::json!({ "flow_capacity": 64 }),
        Monitor::with_max_flows(64),
        MonitorPolicy::default(),
        ebpf_nf(
            "flowmon",
            ebpf_map(
                "config",
                MapInit {
                    u32: Some(vec![64]),
                    ..MapInit::default()
                },
            ),
        ),
        mpk,
    );
    logic_group(
        c,
        "firewall",
        &c_nf("portblock"),
        serde_json::json!({ "blocked_ports": [22, 23] }),
        Firewall::with_limits(FirewallLimits {
            max_rules: 8,
            max_entries: 64,
            max_conns: 64,
        }),
        firewall_policy(),
        ebpf_nf(
            "portblock",
            ebpf_map(
                "blocked",
                MapInit {
                    u16: Some(vec![22, 23]),
                    ..MapInit::default()
                },
            ),
        ),
        mpk,
    );
}

/// A UDP frame of tenant `t` of exactly `len` bytes (flow `f` of 4, as [`frame`]).
fn frame_of(len: usize, t: u32, f: u32) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([192, 168, 0, 1], [10, (t >> 8) as u8, t as u8, 1], 64)
        .udp(40000 + f as u16, [53u16, 80, 443, 22][f as usize % 4])
        .write(&mut out, &vec![0u8; len - 42])
        .expect("frame");
    out
}

/// FastPaas's protection figures (Figs. 5–7, NSX Table 1): macswap and a policer, the
/// cheapest NFs, so that what each isolation level adds per packet shows, at 64- and
/// 1,500-byte frames (`macswap-64B`, `policer-1500B`, ...). The policer counts packets,
/// with a bucket no run empties (every packet passes: the arms do the same work).
fn protection(c: &mut Criterion) {
    let mpk = Mpk::get().is_ok();
    for len in [64usize, 1500] {
        let make = move |t: u32, i: usize| frame_of(len, t, i as u32);
        logic_group_with(
            c,
            &format!("macswap-{len}B"),
            &make,
            &c_nf("macswap"),
            serde_json::json!({}),
            MacSwap,
            MacSwapPolicy {},
            ebpf_nf("macswap", EbpfPolicy::default()),
            mpk,
        );
        let (rate, burst) = (1_000_000u64, 1u64 << 32);
        logic_group_with(
            c,
            &format!("policer-{len}B"),
            &make,
            &c_nf("policer"),
            serde_json::json!({ "rate": rate, "burst": burst, "unit": "packets" }),
            Policer,
            PolicerPolicy {
                rate,
                burst,
                unit: PolicerUnit::Packets,
            },
            ebpf_nf(
                "policer",
                ebpf_map(
                    "bucket",
                    MapInit {
                        u64: Some(vec![rate, burst, 1]),
                        ..MapInit::default()
                    },
                ),
            ),
            mpk,
        );
    }
}

/// One lock + unlock of a tenant's state: no domain, an MPK hit, an MPK miss.
fn key_cache(c: &mut Criterion) {
    let Ok(mpk) = Mpk::get() else {
        return;
    };
    let mut group = c.benchmark_group("mpk-key");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let tenants = mpk.cache_keys() as u32 + 1;
    for domain in [Domain::None, Domain::Mpk] {
        let t = table::<u64>(domain, tenants, 4096);
        for i in 0..tenants {
            t.admit(TenantSlot(i), TenantId(i + 1), 4096, 0)
                .expect("admit");
        }
        let entries: Vec<_> = (0..tenants)
            .map(|i| t.get_arc(TenantSlot(i)).expect("entry"))
            .collect();
        let label = if domain == Domain::None {
            "none"
        } else {
            "hit"
        };
        group.bench_function(label, |b| {
            b.iter(|| {
                *entries[0].lock() += 1;
            })
        });
        if domain == Domain::Mpk {
            let mut i = 0;
            group.bench_function("miss", |b| {
                b.iter(|| {
                    i = (i + 1) % entries.len();
                    *entries[i].lock() += 1;
                })
            });
        }
    }
    group.finish();
    let s = mpk.stats();
    eprintln!(
        "mpk-key: {} cache keys; {} hits, {} misses, {:.0} ns per miss inside the key cache",
        s.cache_keys,
        s.hits,
        s.misses,
        s.miss_ns as f64 / s.misses.max(1) as f64
    );
}

criterion_group!(benches, isolation, protection, key_cache);
criterion_main!(benches);
