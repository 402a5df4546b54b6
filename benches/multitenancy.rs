//! `multitenancy`: what serving many tenants costs a worker core.
//!
//! One core, the Monitor NF, packets in memory. The baseline is the single-tenant
//! Monitor (one plain flow table, no dispatcher tables, no regions); against it, in the
//! same group, Buffet's worker path with 1, 8, 64, 1024 and 10,000 tenants: packets
//! arrive tagged with their tenant (as the NIC dispatcher delivers them), a burst is
//! grouped into per-tenant Packet Buffers, each tenant's state is loaded from the
//! Tenant Table once per group, and the same Monitor logic runs on it. `buffet` parses
//! each frame in the worker; `buffet-layout` gets the dispatcher's parse with the frame
//! (as the pipeline delivers it) and does not parse again — the difference is the
//! saving of parsing once. `specialised` is the fair baseline at large tenant counts:
//! the multi-tenant Monitor a provider would write by hand without Buffet (one vector of
//! per-tenant flow tables, no regions, no isolation).
//!
//! `benches/ratios.py` runs each tenant count in its own process, several rounds, and
//! reports every ratio to the single-tenant baseline of the same process with its range
//! (docs/RESULTS.md says why).
//!
//! A second group, `dispatcher`, measures the software Packet Dispatcher (parse,
//! classify, schedule) per packet for the same tenant counts, against parsing alone.
//!
//! Run: `cargo bench --bench multitenancy`.

use std::hint::black_box;
use std::sync::Arc;

use buffet::dispatch::{Dispatcher, DispatcherConfig, Match, SchedulerConfig, TenantSlot};
use buffet::io::gen::{tenant_dst_prefix, GenConfig, Generator};
use buffet::io::PacketSource;
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::monitor::{FlowTable, Monitor, MonitorPolicy, SingleTenantMonitor};
use buffet::sdk::{Layout, NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{PacketBuf, Worker};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const PACKETS: usize = 32 * 1024;
/// Packets a worker pops at once: the Worker Pool's default `PipelineConfig::burst`.
const BURST: usize = 256;
const TENANT_COUNTS: [u32; 5] = [1, 8, 64, 1024, 10_000];

/// Generated traffic for `tenants` tenants: frames with their tenant index.
fn traffic(tenants: u32) -> Vec<(u32, Vec<u8>)> {
    let mut g = Generator::new(GenConfig {
        seed: 11,
        tenants,
        duration_ns: 1_000_000_000,
        mean_rate_pps: 200_000.0,
        max_packets: Some(PACKETS as u64),
        ..GenConfig::default()
    })
    .expect("valid generator config");
    let mut out = Vec::with_capacity(PACKETS);
    while let Some(p) = g.next_packet().expect("generator never fails") {
        let data = p.data.to_vec();
        out.push((g.tenant_of_last(), data));
    }
    out
}

// Boxed like the Worker Pool's buffers, which travel between threads as one pointer.
#[allow(clippy::vec_box)]
fn mbufs(traffic: &[(u32, Vec<u8>)]) -> Vec<PacketBuf> {
    traffic
        .iter()
        .enumerate()
        .map(|(i, (t, data))| {
            let mut m = PacketBuf::heap();
            assert!(m.fill(data));
            m.tenant = TenantSlot(*t);
            m.ts_ns = i as u64;
            m
        })
        .collect()
}

fn flows_in(traffic: &[(u32, Vec<u8>)]) -> usize {
    let mut keys: Vec<_> = traffic
        .iter()
        .map(|(_, d)| {
            let mut d = d.clone();
            Packet::parse(&mut d, PacketMeta::default())
                .expect("generated frames parse")
                .flow_key()
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys.len()
}

fn worker_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("multitenancy");
    group.throughput(Throughput::Elements(PACKETS as u64));
    for &n in &TENANT_COUNTS {
        let t = traffic(n);
        let flows = flows_in(&t);
        let mut bufs = mbufs(&t);

        // Baseline: the single-tenant Monitor over the same frames, in bursts.
        group.bench_function(BenchmarkId::new("single-tenant", n), |b| {
            let mut nf = SingleTenantMonitor::new(flows * 2);
            b.iter(|| {
                for burst in bufs.chunks_mut(BURST) {
                    for m in burst.iter_mut() {
                        let meta = PacketMeta {
                            in_port: m.in_port,
                            ts_ns: m.ts_ns,
                            tenant: TenantId(0),
                        };
                        if let Ok(mut p) = Packet::parse(m.data_mut(), meta) {
                            black_box(nf.handle(&mut p));
                        }
                    }
                }
            })
        });

        let per_tenant = (flows * 2 / n as usize).max(64) as u32;

        // The specialised multi-tenant Monitor a provider would write by hand without
        // Buffet (the paper's Table I "Specialization"): one process, one vector holding
        // every tenant's flow table indexed by tenant, packets handled one by one in
        // arrival order; no regions, no Tenant Table, no isolation, no accounting.
        group.bench_function(BenchmarkId::new("specialised", n), |b| {
            let mut tables: Vec<FlowTable> = (0..n)
                .map(|_| FlowTable::with_capacity(per_tenant as usize))
                .collect();
            b.iter(|| {
                for burst in bufs.chunks_mut(BURST) {
                    for m in burst.iter_mut() {
                        let meta = PacketMeta {
                            in_port: m.in_port,
                            ts_ns: m.ts_ns,
                            tenant: TenantId(m.tenant.0 + 1),
                        };
                        let table = &mut tables[m.tenant.0 as usize];
                        if let Ok(p) = Packet::parse(m.data_mut(), meta) {
                            table.record(&p);
                            black_box(Verdict::Pass);
                        }
                    }
                }
            })
        });

        // Buffet: n tenants, each with its own region and flow table.
        let monitor = Monitor::with_max_flows(per_tenant);
        let storage = MemoryStorage::new(ArenaConfig::default()).expect("arena");
        let table = Arc::new(TenantTable::new(storage, n));
        for i in 0..n {
            let mut state = Default::default();
            monitor
                .init(&MonitorPolicy::default(), &mut state)
                .expect("policy");
            table
                .admit(
                    TenantSlot(i),
                    TenantId(i + 1),
                    monitor.register().bytes,
                    state,
                )
                .expect("admit");
        }
        let mut engine = Worker::new(Arc::new(monitor), table);
        // The dispatcher's parse of each frame. A worker drops a packet's layout once
        // the NF ran (the NF may have changed the frame), so `buffet-layout` hands the
        // layouts over again each iteration, one burst at a time (the burst is in cache
        // when the worker takes it); `buffet` leaves them `None`, as the worker found
        // them, and parses.
        let layouts: Vec<Option<Layout>> = bufs
            .iter_mut()
            .map(|m| {
                Packet::parse(m.data_mut(), PacketMeta::default())
                    .ok()
                    .map(|p| p.layout())
            })
            .collect();
        for (name, with_layout) in [("buffet", false), ("buffet-layout", true)] {
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter(|| {
                    for (burst, ls) in bufs.chunks_mut(BURST).zip(layouts.chunks(BURST)) {
                        if with_layout {
                            for (m, l) in burst.iter_mut().zip(ls) {
                                m.layout = *l;
                            }
                        }
                        engine.process(burst);
                    }
                    black_box(engine.packets())
                })
            });
        }
    }
    group.finish();
}

fn dispatcher(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatcher");
    group.throughput(Throughput::Elements(PACKETS as u64));
    for &n in &TENANT_COUNTS {
        let t = traffic(n);
        let mut frames: Vec<Vec<u8>> = t.into_iter().map(|(_, d)| d).collect();
        group.bench_function(BenchmarkId::new("parse-only", n), |b| {
            b.iter(|| {
                for f in frames.iter_mut() {
                    black_box(Packet::parse(f, PacketMeta::default()).is_ok());
                }
            })
        });
        let mut d = Dispatcher::new(DispatcherConfig {
            sched: SchedulerConfig {
                shift: 20,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        });
        for _ in 0..2 {
            d.add_worker(u64::MAX);
        }
        for i in 0..n {
            let (addr, len) = tenant_dst_prefix(i);
            let m = Match {
                dst_ip: Some(format!("{addr}/{len}").parse().expect("prefix")),
                ..Match::default()
            };
            d.admit(TenantSlot(i), vec![(100, m)], 0).expect("admit");
        }
        group.bench_function(BenchmarkId::new("dispatch", n), |b| {
            let mut ts = 0u64;
            b.iter(|| {
                for f in frames.iter_mut() {
                    ts += 100;
                    black_box(d.dispatch(ts, 0, f));
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, worker_path, dispatcher);
criterion_main!(benches);
