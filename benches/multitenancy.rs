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
//! `buffet-buffered` runs the same worker with Packet Buffers that persist across bursts
//! (`Worker::enqueue`, a pipeline's `flush_packets = 32`): a tenant's group runs when its buffer
//! holds 32 packets or its oldest packet waited 50 us, served by weighted deficit round
//! robin; each iteration ends with a flush, so every packet is processed once.
//!
//! `cargo bench --bench multitenancy -- latency` (not part of the groups) prints the
//! latency each packet sees from the call that took it in to the call that handed it
//! back (p50/p99), per-burst against persistent buffers, with bursts back to back (a
//! saturated worker: the case in which buffering waits longest).
//!
//! `benches/ratios.py` runs each tenant count in its own process, several rounds, and
//! reports every ratio to the single-tenant baseline of the same process with its range
//! (docs/RESULTS.md says why).
//!
//! A second group, `dispatcher`, measures the software Packet Dispatcher (parse,
//! classify, schedule) per packet for the same tenant counts, against parsing alone,
//! and `dataplane`: a pipeline's whole data plane with one worker thread (a frame copied
//! in, dispatched, through the worker's rings and the Monitor, and back).
//!
//! Run: `cargo bench --bench multitenancy`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet::dispatch::{Dispatcher, DispatcherConfig, Match, SchedulerConfig, TenantSlot};
use buffet::io::gen::{tenant_dst_prefix, GenConfig, Generator};
use buffet::io::PacketSource;
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::monitor::{FlowTable, Monitor, MonitorPolicy, SingleTenantMonitor};
use buffet::sdk::{Layout, NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{
    BufferConfig, ClockSource, PacketBuf, Pipeline, PipelineConfig, TenantSpec, Worker,
};
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
        let table = monitor_table(&monitor, n);
        let monitor = Arc::new(monitor);
        let mut engine = Worker::new(monitor.clone(), table.clone());
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

        // Persistent Packet Buffers: the same packets, taken in a burst at a time.
        let mut buffered = Worker::new(monitor.clone(), table.clone())
            .with_buffers(BufferConfig::default(), ClockSource::System);
        group.bench_function(BenchmarkId::new("buffet-buffered", n), |b| {
            let mut scratch = Scratch::default();
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    spent += run_buffered(&mut buffered, &mut bufs, &mut scratch, None);
                }
                spent
            })
        });
    }
    group.finish();
}

/// The vectors [`run_buffered`] reuses from one iteration to the next, as a worker thread
/// reuses its burst and completion vectors: allocating them per iteration put the page
/// faults of first writing a fresh 2.6 MB vector into the measured time.
#[derive(Default)]
struct Scratch {
    burst: Vec<PacketBuf>,
    out: Vec<PacketBuf>,
    /// Where each packet goes back to (by `ts_ns`).
    slots: Vec<Option<PacketBuf>>,
    /// When each packet was taken in (by `ts_ns`), for the latency report.
    arrived: Vec<Option<Instant>>,
}

/// Runs `bufs` (packet `i` stamped `ts_ns = i`) through `engine` a burst at a time with
/// persistent Packet Buffers, flushes, and puts every packet back at its index. Returns
/// the time spent in the worker's calls: taking a burst from the input and putting the
/// packets handed back in place are not counted, as the `buffet` arm runs its bursts in
/// place and pays neither. With `lat`, also writes there each packet's latency in
/// microseconds: from the start of the call that took its burst in to the end of the call
/// that handed it back.
fn run_buffered(
    engine: &mut Worker<Monitor>,
    bufs: &mut Vec<PacketBuf>,
    s: &mut Scratch,
    mut lat: Option<&mut Vec<f64>>,
) -> Duration {
    let n = bufs.len();
    s.slots.clear();
    s.slots.resize_with(n, || None);
    if let Some(lat) = lat.as_deref_mut() {
        lat.clear();
        lat.resize(n, 0.0);
        s.arrived.clear();
        s.arrived.resize(n, None);
    }
    let mut spent = Duration::ZERO;
    let mut rest = bufs.drain(..);
    loop {
        s.burst.extend(rest.by_ref().take(BURST));
        let done = s.burst.is_empty();
        let t0 = Instant::now();
        if lat.is_some() {
            for m in &s.burst {
                s.arrived[m.ts_ns as usize] = Some(t0);
            }
        }
        if done {
            engine.flush(&mut s.out);
        } else {
            engine.enqueue(&mut s.burst, &mut s.out);
        }
        let t1 = Instant::now();
        spent += t1 - t0;
        for m in s.out.drain(..) {
            let i = m.ts_ns as usize;
            if let Some(lat) = lat.as_deref_mut() {
                let took = t1 - s.arrived[i].expect("taken in");
                lat[i] = took.as_secs_f64() * 1e6;
            }
            s.slots[i] = Some(m);
        }
        if done {
            break;
        }
    }
    drop(rest);
    bufs.extend(
        s.slots
            .iter_mut()
            .map(|m| m.take().expect("every packet comes back")),
    );
    spent
}

/// A Tenant Table of `n` Monitor tenants, each with its own region and flow table.
fn monitor_table(monitor: &Monitor, n: u32) -> Arc<TenantTable<FlowTable>> {
    // An arena sized to the tenants, not the default 256 GiB reservation, so the bench
    // also runs under valgrind (callgrind), whose address space is smaller.
    let storage = MemoryStorage::new(ArenaConfig::for_regions(
        n as usize,
        monitor.register().bytes,
    ))
    .expect("arena");
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
    table
}

/// p50 and p99 of `v` (sorted in place), in microseconds.
fn percentiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.50), at(0.99))
}

/// Per packet: from the call that took it in to the call that handed it back, per-burst
/// grouping against persistent Packet Buffers (printed, not a criterion group).
fn latency_report() {
    println!("latency per packet, back-to-back bursts of {BURST} (us): per-burst p50 / p99 | buffered p50 / p99");
    for &n in &TENANT_COUNTS {
        let t = traffic(n);
        let mut bufs = mbufs(&t);
        let per_tenant = (flows_in(&t) * 2 / n as usize).max(64) as u32;
        let monitor = Monitor::with_max_flows(per_tenant);
        let table = monitor_table(&monitor, n);
        let monitor = Arc::new(monitor);
        // Per burst: every packet of a burst leaves when the burst is done.
        let mut plain = Worker::new(monitor.clone(), table.clone());
        let mut per_burst = Vec::with_capacity(bufs.len());
        for _ in 0..3 {
            per_burst.clear();
            for burst in bufs.chunks_mut(BURST) {
                let t0 = Instant::now();
                plain.process(burst);
                let us = t0.elapsed().as_secs_f64() * 1e6;
                per_burst.extend(std::iter::repeat_n(us, burst.len()));
            }
        }
        let mut buffered =
            Worker::new(monitor, table).with_buffers(BufferConfig::default(), ClockSource::System);
        // Two warm-up runs, then the measured one.
        let (mut scratch, mut lat) = (Scratch::default(), Vec::new());
        for _ in 0..3 {
            run_buffered(&mut buffered, &mut bufs, &mut scratch, Some(&mut lat));
        }
        let (a50, a99) = percentiles(&mut per_burst);
        let (b50, b99) = percentiles(&mut lat);
        println!("{n:>6} tenants: {a50:8.1} / {a99:8.1} | {b50:8.1} / {b99:8.1}");
    }
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
        let mut d = Dispatcher::new(dispatcher_config());
        for _ in 0..2 {
            d.add_worker(u64::MAX);
        }
        for i in 0..n {
            d.admit(TenantSlot(i), vec![(100, tenant_rule(i))], 0)
                .expect("admit");
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

        // The whole data plane of a pipeline with one worker thread: each frame copied
        // into a pooled frame, dispatched, handed to the worker's input ring, run through
        // the Monitor and taken back from the completion ring; `flush` waits for the last.
        let mut pipe = monitor_pipeline(n, &frames);
        group.bench_function(BenchmarkId::new("dataplane", n), |b| {
            let mut ts = 0u64;
            b.iter(|| {
                for f in &frames {
                    ts += 100;
                    pipe.push(ts, 0, f);
                }
                pipe.flush();
            })
        });
        let report = pipe.finish();
        let handled: u64 = report.tenants.iter().map(|t| t.packets).sum();
        assert_eq!(
            handled, report.global.input_packets,
            "every frame reaches its tenant's Monitor ({:?})",
            report.global
        );
    }
    group.finish();
}

/// The `dispatcher` group's settings: timeslots of 2^20 ns (about 1 ms), and an overload
/// report once a worker's run of overload detections (`times`) exceeds 3.
fn dispatcher_config() -> DispatcherConfig {
    DispatcherConfig {
        sched: SchedulerConfig {
            shift: 20,
            threshold: 3,
        },
        ..DispatcherConfig::default()
    }
}

/// Tenant `i`'s classifier rule: the destination prefix the generator addresses it by.
fn tenant_rule(i: u32) -> Match {
    let (addr, len) = tenant_dst_prefix(i);
    Match {
        dst_ip: Some(format!("{addr}/{len}").parse().expect("prefix")),
        ..Match::default()
    }
}

/// A pipeline of one worker running the Monitor for `n` tenants, matched by destination
/// prefix as the generator addresses them, each flow table with room for twice a
/// tenant's share of the frames (at least 64 flows).
fn monitor_pipeline(n: u32, frames: &[Vec<u8>]) -> Pipeline<Monitor> {
    let per_tenant = (frames.len() * 2 / n as usize).max(64) as u32;
    let monitor = Monitor::with_max_flows(per_tenant);
    let cfg = PipelineConfig {
        workers: 1,
        arena: ArenaConfig::for_regions(n as usize, monitor.register().bytes),
        dispatcher: dispatcher_config(),
        ..PipelineConfig::default()
    };
    let mut pipe = Pipeline::new(monitor, cfg).expect("pipeline");
    for i in 0..n {
        pipe.admit(TenantSpec {
            id: TenantId(i + 1),
            name: format!("t{i}"),
            rules: vec![(100, tenant_rule(i))],
            max_nb: 0,
            policy: MonitorPolicy::default(),
        })
        .expect("admit");
    }
    pipe
}

fn buffering_latency(_: &mut Criterion) {
    if std::env::args().skip(1).any(|a| a == "latency") {
        latency_report();
    }
}

criterion_group!(benches, worker_path, dispatcher, buffering_latency);
criterion_main!(benches);
