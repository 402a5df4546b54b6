//! Persistent Packet Buffers and their weighted deficit round robin: order within a
//! tenant across bursts and migrations, the latency bound on a virtual clock, DRR shares,
//! a flooding tenant against a well-behaved one, and nothing lost on stop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use buffet_dispatch::{DispatcherConfig, SchedulerConfig, TenantSlot};
use buffet_memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet_sdk::{InitError, MemorySpec, NetworkFunction, Packet, TenantId, Verdict};
use buffet_worker::{
    BufferConfig, ClockSource, PacketBuf, Pipeline, PipelineConfig, VirtualClock, Worker,
    WorkerEvent,
};

mod common;
use common::{spec_with, udp_frame};

/// What the probe NF saw of one tenant.
#[derive(Default)]
struct Seen {
    count: u64,
    last: u64,
    out_of_order: u64,
}

/// Counts packets, checks that each tenant's timestamps only grow, and spends
/// `cost_ns[tenant id]` of virtual time per packet; `max_wait[tenant id]` is the longest
/// a packet waited from its timestamp until its handler ran (on the virtual clock).
#[derive(Default)]
struct Probe {
    clock: Option<VirtualClock>,
    cost_ns: Vec<u64>,
    max_wait: Arc<Vec<AtomicU64>>,
}

impl NetworkFunction for Probe {
    type State = Seen;
    type Policy = ();
    fn name(&self) -> &'static str {
        "probe"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<Seen>()
    }
    fn init(&self, _: &(), _: &mut Seen) -> Result<(), InitError> {
        Ok(())
    }
    fn handle(&self, pkt: &mut Packet<'_>, st: &mut Seen) -> Verdict {
        let ts = pkt.meta().ts_ns;
        if st.count > 0 && ts <= st.last {
            st.out_of_order += 1;
        }
        st.last = ts;
        st.count += 1;
        if let Some(c) = &self.clock {
            let id = pkt.tenant().0 as usize;
            if let Some(w) = self.max_wait.get(id) {
                w.fetch_max(c.now_ns().saturating_sub(ts), Ordering::Relaxed);
            }
            c.advance(self.cost_ns.get(id).copied().unwrap_or(0));
        }
        Verdict::Pass
    }
    fn summary(&self, st: &Seen) -> Vec<(&'static str, u64)> {
        vec![("seen", st.count), ("out_of_order", st.out_of_order)]
    }
}

/// A frame of `tenant` from UDP port 1000 with 18 zero bytes of payload.
fn frame(tenant: u32) -> Vec<u8> {
    udp_frame(tenant, 1000, &[0; 18])
}

/// A packet of tenant slot `t` stamped `ts` (its arrival, for the order check and the
/// latency measurement).
fn pkt(t: u32, ts: u64) -> PacketBuf {
    let mut m = PacketBuf::heap();
    assert!(m.fill(&frame(t)));
    m.tenant = TenantSlot(t);
    m.ts_ns = ts;
    m
}

/// An inline worker over `tenants` probe tenants (slot i = tenant id i), on `clock`.
fn engine(tenants: u32, nf: Probe, cfg: BufferConfig, clock: &VirtualClock) -> Worker<Probe> {
    let storage = MemoryStorage::new(ArenaConfig::default()).unwrap();
    let table = Arc::new(TenantTable::new(storage, tenants));
    for i in 0..tenants {
        table
            .admit(
                TenantSlot(i),
                TenantId(i),
                nf.register().bytes,
                Seen::default(),
            )
            .unwrap();
    }
    Worker::new(Arc::new(nf), table).with_buffers(cfg, ClockSource::Virtual(clock.clone()))
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn order_within_a_tenant_holds_across_bursts_and_nothing_is_lost() {
    let clock = VirtualClock::new();
    let cfg = BufferConfig {
        group: 4,
        latency_ns: 1_000,
        quantum: 1,
        capacity: 64,
    };
    let mut w = engine(8, Probe::default(), cfg, &clock);
    let mut rng = Lcg(7);
    let (mut burst, mut out) = (Vec::new(), Vec::new());
    let mut ts = 0u64;
    let mut sent = 0usize;
    for _ in 0..2_000 {
        for _ in 0..rng.next(40) {
            ts += 1;
            // Skewed: tenant 0 sends half of everything.
            let t = if rng.next(2) == 0 {
                0
            } else {
                rng.next(8) as u32
            };
            burst.push(pkt(t, ts));
            sent += 1;
        }
        clock.advance(100);
        w.enqueue(&mut burst, &mut out);
        assert!(w.held() <= 64 + 40, "held {}", w.held());
    }
    w.flush(&mut out);
    assert_eq!(w.held(), 0);
    assert_eq!(out.len(), sent, "every packet leaves exactly once");
    let mut last = [0u64; 8];
    for m in &out {
        let t = m.tenant.0 as usize;
        assert!(m.ts_ns > last[t], "tenant {t} reordered");
        last[t] = m.ts_ns;
        assert_eq!(m.outcome, buffet_worker::Outcome::Nf(Verdict::Pass));
    }
    assert_eq!(w.packets(), sent as u64);
}

#[test]
fn a_lone_packet_of_a_quiet_tenant_leaves_at_the_latency_bound() {
    let clock = VirtualClock::new();
    let cfg = BufferConfig {
        group: 32,
        latency_ns: 50_000,
        ..BufferConfig::default()
    };
    let mut w = engine(2, Probe::default(), cfg, &clock);
    let (mut burst, mut out) = (Vec::new(), Vec::new());
    let mut left_at = None;
    let mut ts = 0;
    // Tenant 0 keeps the worker busy with 16 packets every 10 us (never a full group,
    // so its own packets wait for the bound too); tenant 1 sends one packet at 20 us.
    for step in 0..20u64 {
        let now = step * 10_000;
        clock.set(now);
        for _ in 0..16 {
            ts += 1;
            burst.push(pkt(0, ts));
        }
        if now == 20_000 {
            burst.push(pkt(1, u64::MAX / 2));
        }
        w.enqueue(&mut burst, &mut out);
        for m in out.drain(..) {
            if m.tenant.0 == 1 {
                left_at = Some(now);
            }
        }
        if now < 70_000 {
            assert!(left_at.is_none(), "left before the bound, at {now}");
        }
    }
    assert_eq!(left_at, Some(70_000), "waited exactly the 50 us bound");
}

/// An inline worker over probe tenants with these per-packet virtual costs and weights,
/// groups of `group` packets and a DRR quantum of 4,000 ns.
fn weighted(
    weights: &[u32],
    cost_ns: &[u64],
    group: usize,
) -> (Worker<Probe>, VirtualClock, Arc<Vec<AtomicU64>>) {
    let clock = VirtualClock::new();
    let cfg = BufferConfig {
        group,
        latency_ns: 50_000,
        quantum: 4_000,
        capacity: 16_384,
    };
    let max_wait: Arc<Vec<AtomicU64>> =
        Arc::new(weights.iter().map(|_| AtomicU64::new(0)).collect());
    let nf = Probe {
        clock: Some(clock.clone()),
        cost_ns: cost_ns.to_vec(),
        max_wait: max_wait.clone(),
    };
    let w = engine(weights.len() as u32, nf, cfg, &clock);
    for (t, &wt) in weights.iter().enumerate() {
        w.set_weight(TenantSlot(t as u32), wt);
    }
    (w, clock, max_wait)
}

/// Every tenant backlogged with `backlog` packets at once: the order the worker runs them
/// in (tenant slots of `out`, in order).
fn service_order(weights: &[u32], cost_ns: &[u64], backlog: usize, group: usize) -> Vec<u32> {
    let (mut w, _, _) = weighted(weights, cost_ns, group);
    let mut burst = Vec::new();
    for i in 0..backlog {
        for t in 0..weights.len() as u32 {
            burst.push(pkt(t, i as u64 + 1));
        }
    }
    let mut out = Vec::new();
    w.enqueue(&mut burst, &mut out);
    w.flush(&mut out);
    assert_eq!(out.len(), backlog * weights.len());
    out.iter().map(|m| m.tenant.0).collect()
}

#[test]
fn backlogged_tenants_share_the_worker_by_weight() {
    let weights = [1, 2, 3, 2];
    // While every tenant is still backlogged (the first 8,000 of 4 x 4,000 packets, all
    // of the same cost), each gets the worker in proportion to its weight.
    let order = service_order(&weights, &[100; 4], 4_000, 8);
    let prefix = &order[..8_000];
    let wsum: u32 = weights.iter().sum();
    for (t, &wt) in weights.iter().enumerate() {
        let got = prefix.iter().filter(|&&x| x == t as u32).count();
        let share = got as f64 / prefix.len() as f64;
        let want = f64::from(wt) / f64::from(wsum);
        assert!(
            (share - want).abs() <= 0.03 * want,
            "tenant {t}: share {share:.4}, weight share {want:.4}"
        );
    }
}

#[test]
fn heavy_nf_work_is_charged_in_time_not_packets() {
    // Equal weights; tenant 0's packets cost ten times tenant 1's. While both are
    // backlogged, each gets half of the worker's time: tenant 1 ten times the packets.
    let cost = [1_000u64, 100];
    let order = service_order(&[1, 1], &cost, 3_000, 8);
    let mut served = [0u64; 2];
    for &t in &order {
        served[t as usize] += 1;
        if served[1] == 2_500 {
            break;
        }
    }
    let work = [served[0] * cost[0], served[1] * cost[1]];
    let share0 = work[0] as f64 / (work[0] + work[1]) as f64;
    assert!(
        (share0 - 0.5).abs() < 0.03,
        "work share {share0:.3} ({served:?})"
    );
}

#[test]
fn a_flooding_tenant_cannot_take_a_well_behaved_tenants_share() {
    // Tenant 0 floods with expensive packets (its buffer topped up to 256 at every call);
    // tenant 1 sends 8 cheap packets per call. Tenant 1 is never starved: each of its
    // packets waits at most the latency bound plus two DRR rounds, however much the
    // flood costs.
    let cost = [2_000u64, 100];
    let (mut w, clock, max_wait) = weighted(&[1, 1], &cost, 32);
    let (mut burst, mut out) = (Vec::new(), Vec::new());
    let (mut flood_out, mut served) = (0usize, [0u64; 2]);
    let calls = 500;
    for _ in 0..calls {
        for _ in 0..256 - flood_out {
            burst.push(pkt(0, clock.now_ns()));
        }
        flood_out = 256;
        for _ in 0..8 {
            burst.push(pkt(1, clock.now_ns()));
        }
        w.enqueue(&mut burst, &mut out);
        for m in out.drain(..) {
            let t = m.tenant.0 as usize;
            served[t] += 1;
            if t == 0 {
                flood_out -= 1;
            }
        }
    }
    let max_wait = max_wait[1].load(Ordering::Relaxed);
    assert!(served[1] >= (calls - 8) * 8, "{served:?}");
    let round = 4_000 + 32 * cost[0] + 32 * cost[1];
    assert!(
        max_wait <= 50_000 + 2 * round,
        "waited {max_wait} ns (bound 50 us, round {round} ns)"
    );
}

/// With persistent Packet Buffers (the new worker keeps a migrated tenant gated) and
/// without them (the data plane holds its frames): while the old worker still has a
/// migrated tenant's earlier packets, none of its later ones runs.
#[test]
fn migrations_neither_reorder_nor_lose_a_tenants_packets() {
    for flush_packets in [0, 16] {
        let cfg = PipelineConfig {
            workers: 2,
            pin: false,
            ring_size: 256,
            burst: 32,
            // Timeslots of 1024 ns of packet time and a tiny MAX_NB: tenants migrate often.
            worker_max_nb: 6,
            dispatcher: DispatcherConfig {
                sched: SchedulerConfig {
                    shift: 10,
                    threshold: 1_000_000,
                },
                ..DispatcherConfig::default()
            },
            flush_packets,
            flush_ns: 10_000_000,
            ..PipelineConfig::default()
        };
        let mut p = Pipeline::new(Probe::default(), cfg).unwrap();
        for t in 0..6 {
            p.admit(spec_with(t, ())).unwrap();
        }
        let mut rng = Lcg(3);
        let n = 60_000u64;
        for i in 0..n {
            let t = if rng.next(3) == 0 {
                0
            } else {
                rng.next(6) as u32
            };
            p.push(100 * (i + 1), 0, &frame(t));
        }
        let r = p.finish();
        let migrations = r
            .events
            .iter()
            .filter(|e| matches!(e, WorkerEvent::Migration { .. }))
            .count();
        assert!(
            migrations > 20,
            "flush_packets {flush_packets}: only {migrations} migrations"
        );
        let mut total = 0;
        for t in &r.tenants {
            assert_eq!(
                t.nf["out_of_order"], 0,
                "flush_packets {flush_packets}: tenant {} reordered",
                t.id
            );
            assert_eq!(t.nf["seen"], t.packets);
            total += t.packets;
        }
        assert_eq!(total, n, "flush_packets {flush_packets}");
    }
}

#[test]
fn stopping_flushes_every_buffer_and_loses_nothing() {
    for flush_packets in [0, 1, 32, 256] {
        let cfg = PipelineConfig {
            workers: 2,
            pin: false,
            flush_packets,
            // Far beyond the run: only a flush moves a partial buffer.
            flush_ns: u64::MAX / 4,
            ..PipelineConfig::default()
        };
        let mut p = Pipeline::new(Probe::default(), cfg).unwrap();
        for t in 0..50 {
            p.admit(spec_with(t, ())).unwrap();
        }
        for i in 0..5_000u64 {
            p.push(i + 1, 0, &frame((i % 50) as u32));
        }
        let r = p.finish();
        let total: u64 = r.tenants.iter().map(|t| t.packets).sum();
        assert_eq!(total, 5_000, "flush_packets {flush_packets}");
        assert_eq!(r.workers.iter().map(|w| w.packets).sum::<u64>(), 5_000);
    }
}

/// Past 2,048 cached tenants a worker prefetches the next groups' rows, entries, states
/// and headers: with 3,000 tenants, on both the burst path (`process`) and the Packet
/// Buffer path (`enqueue`/`flush`), every packet still reaches its own tenant's state
/// exactly once and in order, and one tenant's replacement mid-run is seen at once.
#[test]
fn with_thousands_of_tenants_every_packet_reaches_its_own_state_once() {
    const N: u32 = 3_000;
    for buffered in [false, true] {
        let storage = MemoryStorage::new(ArenaConfig::default()).unwrap();
        let table = Arc::new(TenantTable::new(storage, N));
        for i in 0..N {
            table
                .admit(TenantSlot(i), TenantId(i), 4096, Seen::default())
                .unwrap();
        }
        let clock = VirtualClock::new();
        let mut w = Worker::new(Arc::new(Probe::default()), table.clone());
        if buffered {
            let cfg = BufferConfig {
                group: 4,
                latency_ns: 1_000,
                quantum: 1,
                capacity: 1024,
            };
            w = w.with_buffers(cfg, ClockSource::Virtual(clock.clone()));
        }
        let mut rng = Lcg(11);
        let mut sent = vec![0u64; N as usize];
        let (mut burst, mut out) = (Vec::new(), Vec::new());
        let mut ts = 0u64;
        for round in 0..200 {
            if round == 100 {
                // Tenant 5's state replaced: the packets after this count from zero.
                table
                    .replace_with(TenantId(5), 4096, Seen::default(), |_, _| {
                        Ok::<(), std::convert::Infallible>(())
                    })
                    .unwrap();
                sent[5] = 0;
            }
            for _ in 0..256 {
                ts += 1;
                // Every tenant at first, so the worker caches them all; then skewed.
                let t = if round < 20 {
                    (ts % u64::from(N)) as u32
                } else {
                    rng.next(u64::from(N)) as u32
                };
                burst.push(pkt(t, ts));
                sent[t as usize] += 1;
            }
            clock.advance(100);
            if buffered {
                w.enqueue(&mut burst, &mut out);
                // Packets of tenant 5 queued before the replacement run on the new
                // state: flush at the boundary so the count starts there.
                if round == 99 {
                    w.flush(&mut out);
                }
            } else {
                w.process(&mut burst);
                out.append(&mut burst);
            }
        }
        if buffered {
            w.flush(&mut out);
        }
        assert_eq!(w.held(), 0);
        assert!(out
            .iter()
            .all(|m| m.outcome == buffet_worker::Outcome::Nf(Verdict::Pass)));
        for i in 0..N {
            let r = table.get(TenantSlot(i));
            let st = r.entry().unwrap().lock();
            assert_eq!(
                st.count, sent[i as usize],
                "tenant {i} (buffered {buffered})"
            );
            assert_eq!(st.out_of_order, 0, "tenant {i} (buffered {buffered})");
        }
    }
}
