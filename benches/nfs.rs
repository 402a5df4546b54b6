//! `nfs`: every reference NF, single-tenant and specialised multi-tenant against Buffet, with
//! 8 and 1,000 tenants.
//!
//! One core, packets in memory, one criterion group per NF: `monitor`, `firewall`, `ids`,
//! `ipsec` (outbound: ESP encapsulation), `ipsec-inbound` (decapsulation), `dpi`,
//! `macswap`, `policer`, `l2fwd`, `flowfwd`. For each tenant count `n` a group has
//!
//! * `single-tenant/n` — the baseline: one generic `SingleTenant<N>` for every NF (one
//!   plain state built by the NF's `init`, the NF's own `handle`; no Tenant Table, no
//!   grouping) over the frames of the `n` tenants' traffic, one pass per packet: parse,
//!   handle;
//! * `specialised/n` — the second baseline, fair at large tenant counts: the specialised
//!   multi-tenant NF a provider would write by hand without Buffet (the Buffet paper's
//!   Table I, "Specialization"). One process, one structure holding every tenant's state
//!   (a `Vec` indexed by the tenant slot the dispatcher tagged, each state built by `init`
//!   from that tenant's own policy, exactly as Buffet's), one pass per packet: parse,
//!   index, handle. No regions, no isolation, no grouping, no counters. Buffet against
//!   it is the price of the framework alone; against `single-tenant` it also includes
//!   what holding `n` tenants' distinct policies and tables costs any implementation
//!   (cache capacity);
//! * `buffet/n` — the same frames, each tagged with its tenant slot as the dispatcher
//!   delivers them, through `Worker::process` in bursts of 256: grouped into per-tenant
//!   Packet Buffers, each tenant's own state (built by `init` from its own policy, in its
//!   own region of the Tenant Table) loaded once per group.
//!
//! **Traffic** is built once per group and tenant count with etherparse, deterministically
//! (xorshift64*): the tenant of each packet is drawn from a Zipf(1) distribution over the
//! `n` tenants (8 tenants: 37 % … 5 % of the packets; 1,000 tenants: 13 % for the largest,
//! about 2 packets in 16 Ki for the smallest), each tenant's flows Zipf(1) from its own
//! pool of 256 5-tuples (addresses overlap between tenants: everyone uses 192.168.0.0/16
//! and 10.0.0.0/16), frame sizes the simple IMIX 64 / 594 / 1400 bytes (7:4:1); in the
//! common traffic (monitor, firewall, ids, macswap, policer) a quarter of the packets go
//! in the reply direction. What each NF's traffic and policies add is in its function's
//! doc. Every tenant has its own policy (own rules, keys, blacklists,
//! tables), with small per-tenant limits so that 1,000 tenants fit easily.
//!
//! **The single-tenant baseline** runs tenant 0's policy (the largest tenant), except
//! where one tenant's policy cannot serve everyone's traffic: monitor and the firewall's
//! connection table are sized for all flows, the policer's rate is the aggregate's, and
//! l2fwd / flowfwd hold the union of all tenants' tables.
//!
//! **Time.** Packets are 100 ns apart in packet time (`ts_ns`), and time keeps running
//! across iterations. Before each timed iteration, untimed, both arms restamp the frames;
//! `ipsec` also restores the original frames (encapsulation grows them in place), and
//! `ipsec-inbound` has a peer gateway encrypt fresh ESP with new sequence numbers (the
//! anti-replay window would drop a replayed iteration).
//!
//! After each measurement one more untimed pass prints that arm's verdict mix to stderr
//! (`nfs: firewall buffet/8: pass 78.1% ...`), so the traffic's drop rates are on record.
//!
//! **Scale** (REEdge Fig. 5 / Table 2): the `scale-*` groups run l2fwd and flowfwd with 1
//! to 16,384 tenants at fixed 64- and 1,500-byte frames ([`scale`] says how).
//!
//! Run: `cargo bench --bench nfs` (one NF: `cargo bench --bench nfs -- firewall/`; the
//! scale groups alone: `cargo bench --bench nfs -- scale-`).

use std::collections::HashSet;
use std::fmt;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet::dispatch::TenantSlot;
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::dpi::{Dpi, DpiPolicy};
use buffet::nfs::firewall::{
    Action, Firewall, FirewallLimits, FirewallPolicy, NumOrName, RulePolicy,
};
use buffet::nfs::flowfwd::{FlowEntry, FlowFwd, FlowFwdPolicy};
use buffet::nfs::ids::{Ids, IdsLimits, IdsMode, IdsPolicy};
use buffet::nfs::ipsec::{
    EthRewrite, InboundSaPolicy, Ipsec, IpsecPolicy, IpsecState, OutboundSaPolicy, Unmatched,
};
use buffet::nfs::l2fwd::{L2Fwd, L2FwdPolicy, MacEntry};
use buffet::nfs::macswap::{MacSwap, MacSwapPolicy};
use buffet::nfs::monitor::{Monitor, MonitorPolicy};
use buffet::nfs::policer::{Policer, PolicerPolicy, PolicerUnit};
use buffet::sdk::{FlowKey, NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{Outcome, PacketBuf, Worker};
// xorshift64* seeded through splitmix64: one seed, one traffic trace.
use buffet_testkit::Rng;
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use etherparse::PacketBuilder;

/// Packets per iteration.
const PACKETS: usize = 16 * 1024;
/// Packets a worker pops at once: the Worker Pool's default `PipelineConfig::burst`.
const BURST: usize = 256;
const TENANT_COUNTS: [u32; 2] = [8, 1000];
/// Packet time between consecutive packets (10 Mpps offered).
const GAP_NS: u64 = 100;
/// Distinct 5-tuples each tenant draws its packets from.
const FLOWS_PER_TENANT: u32 = 256;
/// Share of packets sent in the reply direction, in percent.
const REPLY_PCT: u64 = 25;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

// ---------------------------------------------------------------------------------------
// Deterministic generation
// ---------------------------------------------------------------------------------------

/// Zipf(1) over `0..n`: rank `k` has weight `1 / (k + 1)`.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u32) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / f64::from(k);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf { cdf }
    }

    fn sample(&self, r: &mut Rng) -> u32 {
        let u = r.unit();
        (self.cdf.partition_point(|&c| c < u) as u32).min(self.cdf.len() as u32 - 1)
    }
}

/// Generated traffic: each packet's tenant index and frame.
type Frames = Vec<(u32, Vec<u8>)>;

/// `PACKETS` frames; the tenant of each drawn Zipf(1) over `n`, the frame made by `make`.
fn generate(n: u32, seed: u64, mut make: impl FnMut(&mut Rng, u32) -> Vec<u8>) -> Frames {
    let tenants = Zipf::new(n);
    let mut r = Rng::new(seed ^ (u64::from(n) << 40));
    (0..PACKETS)
        .map(|_| {
            let t = tenants.sample(&mut r);
            (t, make(&mut r, t))
        })
        .collect()
}

/// One direction of a TCP or UDP flow as the client sends it.
#[derive(Clone, Copy, Debug)]
struct Flow {
    src: [u8; 4],
    dst: [u8; 4],
    tcp: bool,
    sport: u16,
    dport: u16,
}

const TCP_SERVICES: [u16; 8] = [80, 443, 443, 22, 25, 8080, 3306, 5432];
const UDP_SERVICES: [u16; 4] = [53, 123, 161, 5060];

/// Flow `i` of tenant `t`: a client in 192.168.0.0/22, a server in 10.0.0.0/20, 80 % TCP.
fn flow(t: u32, i: u32) -> Flow {
    let mut r = Rng::new((u64::from(t) << 32) | u64::from(i));
    let tcp = r.below(10) < 8;
    Flow {
        src: [192, 168, r.below(4) as u8, 1 + r.below(254) as u8],
        dst: [10, 0, r.below(16) as u8, 1 + r.below(254) as u8],
        tcp,
        sport: 1024 + r.below(64_512) as u16,
        dport: if tcp {
            *r.pick(&TCP_SERVICES)
        } else {
            *r.pick(&UDP_SERVICES)
        },
    }
}

/// Simple IMIX frame length: 64, 594, 1400 bytes in the ratio 7:4:1.
fn imix(r: &mut Rng) -> usize {
    match r.below(12) {
        0..7 => 64,
        7..11 => 594,
        _ => 1400,
    }
}

/// L4 payload bytes that make a frame of `frame_len` bytes.
fn payload_len(frame_len: usize, tcp: bool) -> usize {
    frame_len.saturating_sub(14 + 20 + if tcp { 20 } else { 8 })
}

/// An Ethernet/IPv4/TCP-or-UDP frame of `f` (reversed when `reply`).
fn l4_frame(macs: ([u8; 6], [u8; 6]), f: &Flow, reply: bool, payload: &[u8]) -> Vec<u8> {
    let (src, dst, sport, dport) = if reply {
        (f.dst, f.src, f.dport, f.sport)
    } else {
        (f.src, f.dst, f.sport, f.dport)
    };
    let ip = PacketBuilder::ethernet2(macs.0, macs.1).ipv4(src, dst, 64);
    let mut v = Vec::with_capacity(64 + payload.len());
    let written = if f.tcp {
        let seq = u32::from(sport) << 16 | u32::from(dport);
        ip.tcp(sport, dport, seq, 64_240)
            .ack(seq.rotate_left(7))
            .psh()
            .write(&mut v, payload)
    } else {
        ip.udp(sport, dport).write(&mut v, payload)
    };
    written.expect("generated frames are well formed");
    v
}

/// The common traffic: tenant flows (Zipf over 256), IMIX sizes, `REPLY_PCT` % replies.
fn flow_traffic(n: u32, seed: u64) -> Frames {
    let flows = Zipf::new(FLOWS_PER_TENANT);
    generate(n, seed, |r, t| {
        let f = flow(t, flows.sample(r));
        let reply = r.below(100) < REPLY_PCT;
        let payload = vec![0x5a; payload_len(imix(r), f.tcp)];
        l4_frame((MAC_A, MAC_B), &f, reply, &payload)
    })
}

/// Distinct directional 5-tuples of each tenant.
fn flows_per_tenant(frames: &[(u32, Vec<u8>)], n: u32) -> Vec<usize> {
    let mut seen: HashSet<(u32, FlowKey)> = HashSet::new();
    for (t, data) in frames {
        let mut d = data.clone();
        let key = Packet::parse(&mut d, PacketMeta::default())
            .expect("generated frames parse")
            .flow_key();
        seen.insert((*t, key));
    }
    let mut per = vec![0; n as usize];
    seen.iter().for_each(|(t, _)| per[*t as usize] += 1);
    per
}

fn table_size(entries: usize) -> u32 {
    (2 * entries).max(64).next_power_of_two() as u32
}

// ---------------------------------------------------------------------------------------
// The two arms
// ---------------------------------------------------------------------------------------

/// The single-tenant baseline of any NF: one plain state, built by the NF's own `init`
/// from one policy, and the NF's own `handle` over it — no Tenant Table, no region, no
/// grouping. Both arms of a group therefore run the same packet code; the ratio is the
/// cost of serving many tenants.
struct SingleTenant<N: NetworkFunction> {
    nf: N,
    state: N::State,
}

impl<N: NetworkFunction> SingleTenant<N> {
    /// `nf` (with the limits the baseline needs) serving `policy` alone.
    fn new(nf: N, policy: &N::Policy) -> Self {
        let mut state = N::State::default();
        nf.init(policy, &mut state)
            .unwrap_or_else(|e| panic!("{}: baseline policy: {e}", nf.name()));
        SingleTenant { nf, state }
    }

    #[inline]
    fn handle(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        self.nf.handle(pkt, &mut self.state)
    }
}

/// The specialised multi-tenant baseline: every tenant's plain state in one `Vec`
/// indexed by tenant slot, each built by the NF's own `init` from that tenant's policy,
/// and the NF's own `handle` — what a provider writes by hand for many tenants without
/// Buffet (no Tenant Table, no regions, no grouping, no per-tenant counters).
struct Specialised<'a, N: NetworkFunction> {
    nf: &'a N,
    states: Vec<N::State>,
}

impl<'a, N: NetworkFunction> Specialised<'a, N> {
    /// `nf` serving tenant `i` with `policies[i]`.
    fn new(nf: &'a N, policies: &[N::Policy]) -> Self {
        let states = policies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut state = N::State::default();
                nf.init(p, &mut state)
                    .unwrap_or_else(|e| panic!("{}: tenant {i}: {e}", nf.name()));
                state
            })
            .collect();
        Specialised { nf, states }
    }
}

/// Verdicts of one pass.
#[derive(Default)]
struct Mix {
    pass: u64,
    forward: u64,
    tx: u64,
    drop: u64,
    other: u64,
}

impl Mix {
    #[inline]
    fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Pass => self.pass += 1,
            Verdict::Forward(_) => self.forward += 1,
            Verdict::Tx => self.tx += 1,
            Verdict::Drop(_) => self.drop += 1,
            Verdict::Fault => self.other += 1,
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = (self.pass + self.forward + self.tx + self.drop + self.other).max(1) as f64;
        let pct = |x: u64| 100.0 * x as f64 / total;
        write!(
            f,
            "pass {:.1}% forward {:.1}% tx {:.1}% drop {:.1}% other {:.1}%",
            pct(self.pass),
            pct(self.forward),
            pct(self.tx),
            pct(self.drop),
            pct(self.other)
        )
    }
}

// Boxed like the Worker Pool's buffers, which travel between threads as one pointer.
#[allow(clippy::vec_box)]
fn mbufs(frames: &[(u32, Vec<u8>)]) -> Vec<PacketBuf> {
    frames
        .iter()
        .map(|(t, data)| {
            let mut m = PacketBuf::heap();
            assert!(m.fill(data), "frame fits an mbuf");
            m.tenant = TenantSlot(*t);
            m
        })
        .collect()
}

/// Copies the original frames back (for NFs that rewrite them in place).
fn refill(bufs: &mut [PacketBuf], frames: &[(u32, Vec<u8>)]) {
    for (m, (_, data)) in bufs.iter_mut().zip(frames) {
        m.fill(data);
    }
}

/// Gives the next `bufs.len()` packet times to the frames.
fn stamp(bufs: &mut [PacketBuf], clock: &mut u64) {
    for m in bufs.iter_mut() {
        m.ts_ns = *clock;
        *clock += GAP_NS;
    }
}

/// The single-tenant baseline over `bufs`, packet by packet ([`handle_one`]).
#[inline]
fn run_single<N: NetworkFunction>(nf: &mut SingleTenant<N>, bufs: &mut [PacketBuf]) -> Mix {
    let mut mix = Mix::default();
    for m in bufs.iter_mut() {
        handle_one(m, TenantId(1), &mut mix, |p| nf.handle(p));
    }
    mix
}

/// The specialised baseline's per-packet work: parse as the baseline does, look the
/// tenant's state up by the slot the dispatcher tagged, handle. The tenant id in the
/// packet's metadata is the one Buffet's Tenant Table gives the slot.
#[inline]
fn run_specialised<N: NetworkFunction>(nf: &mut Specialised<'_, N>, bufs: &mut [PacketBuf]) -> Mix {
    let mut mix = Mix::default();
    let Specialised { nf, states } = nf;
    for m in bufs.iter_mut() {
        let slot = m.tenant.0;
        let Some(state) = states.get_mut(slot as usize) else {
            mix.other += 1;
            continue;
        };
        handle_one(m, TenantId(slot + 1), &mut mix, |p| nf.handle(p, state));
    }
    mix
}

/// Both baselines' work on one packet: parse it with the mbuf's room to grow, run
/// `handle`, keep the new length of a passing frame (as the worker does), count the
/// verdict.
#[inline(always)]
fn handle_one(
    m: &mut PacketBuf,
    tenant: TenantId,
    mix: &mut Mix,
    handle: impl FnOnce(&mut Packet<'_>) -> Verdict,
) {
    let meta = PacketMeta {
        in_port: m.in_port,
        ts_ns: m.ts_ns,
        tenant,
    };
    let len = m.len();
    match Packet::parse_with_capacity(m.buffer_mut(), len, meta) {
        Ok(mut p) => {
            let v = handle(&mut p);
            let new_len = p.len();
            if v.is_pass() {
                m.set_len(new_len);
            }
            mix.add(v);
        }
        Err(_) => mix.other += 1,
    }
}

fn outcomes(bufs: &[PacketBuf]) -> Mix {
    let mut mix = Mix::default();
    for m in bufs {
        match m.outcome {
            Outcome::Nf(v) => mix.add(v),
            _ => mix.other += 1,
        }
    }
    mix
}

/// Admits tenant `i` with `policies[i]` at slot `i`, each in its own region.
fn tenant_table<N: NetworkFunction>(nf: &N, policies: &[N::Policy]) -> Arc<TenantTable<N::State>> {
    let bytes = nf.register().bytes;
    // Regions are whole pages plus a guard page; allow for 64 KiB pages.
    let per_tenant = (bytes.div_ceil(64 << 10) + 2) * (64 << 10);
    let storage = MemoryStorage::new(ArenaConfig {
        capacity: per_tenant * policies.len() + (16 << 20),
    })
    .expect("arena");
    let table = Arc::new(TenantTable::new(storage, policies.len() as u32));
    for (i, p) in policies.iter().enumerate() {
        let mut state = N::State::default();
        nf.init(p, &mut state)
            .unwrap_or_else(|e| panic!("{}: tenant {i}: {e}", nf.name()));
        table
            .admit(TenantSlot(i as u32), TenantId(i as u32 + 1), bytes, state)
            .unwrap_or_else(|e| panic!("{}: admit tenant {i}: {e}", nf.name()));
    }
    table
}

/// Mean packets per tenant group when `frames` are cut into bursts.
fn mean_group(frames: &[(u32, Vec<u8>)]) -> f64 {
    let groups: usize = frames
        .chunks(BURST)
        .map(|b| b.iter().map(|(t, _)| *t).collect::<HashSet<_>>().len())
        .sum();
    frames.len() as f64 / groups as f64
}

/// One NF at one tenant count: its traffic, the NF, every tenant's policy, the baseline.
struct Case<'a, N: NetworkFunction> {
    frames: &'a [(u32, Vec<u8>)],
    nf: N,
    policies: Vec<N::Policy>,
    baseline: SingleTenant<N>,
}

fn no_prep(_: &mut [PacketBuf]) {}

fn compare<N: NetworkFunction>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    case: Case<'_, N>,
) {
    compare_with(g, name, case, no_prep, no_prep);
}

/// `single-tenant/n`, `specialised/n` and `buffet/n` over `case.frames`; `prep_*` run
/// untimed before every iteration of their arm (after which the frames are restamped);
/// the specialised arm serves every tenant's own policy, as Buffet does, and so uses
/// `prep_buffet`.
fn compare_with<N: NetworkFunction>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    case: Case<'_, N>,
    mut prep_single: impl FnMut(&mut [PacketBuf]),
    mut prep_buffet: impl FnMut(&mut [PacketBuf]),
) {
    let Case {
        frames,
        nf,
        policies,
        mut baseline,
    } = case;
    let n = policies.len();
    eprintln!(
        "nfs: {name} n={n}: {} packets, {:.1} packets per tenant group per burst of {BURST}",
        frames.len(),
        mean_group(frames)
    );
    let mut bufs = mbufs(frames);

    let mix = bench_arm(g, "single-tenant", n, &mut bufs, &mut prep_single, |b| {
        run_single(&mut baseline, b)
    });
    eprintln!("nfs: {name} single-tenant/{n}: {mix}");
    drop(baseline);

    let mut special = Specialised::new(&nf, &policies);
    let mix = bench_arm(g, "specialised", n, &mut bufs, &mut prep_buffet, |b| {
        run_specialised(&mut special, b)
    });
    eprintln!("nfs: {name} specialised/{n}: {mix}");
    drop(special);

    let table = tenant_table(&nf, &policies);
    let mut engine = Worker::new(Arc::new(nf), table);
    bench_arm(g, "buffet", n, &mut bufs, &mut prep_buffet, |b| {
        run_buffet(&mut engine, b)
    });
    eprintln!("nfs: {name} buffet/{n}: {}", outcomes(&bufs));
}

/// Times one arm as `<arm>/<n>`: before each timed iteration, untimed, `prep` and a
/// restamp of the frames (packet time starts at 0 for each arm, whose state is fresh);
/// then `run` over all of them. Returns what one more untimed pass returns, for the
/// verdict mix the caller prints.
fn bench_arm<R>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    arm: &str,
    n: usize,
    bufs: &mut [PacketBuf],
    prep: &mut impl FnMut(&mut [PacketBuf]),
    mut run: impl FnMut(&mut [PacketBuf]) -> R,
) -> R {
    let mut clock = 0u64;
    g.bench_function(BenchmarkId::new(arm, n), |b| {
        b.iter_custom(|iters| {
            let mut busy = Duration::ZERO;
            for _ in 0..iters {
                prep(bufs);
                stamp(bufs, &mut clock);
                let t0 = Instant::now();
                black_box(run(bufs));
                busy += t0.elapsed();
            }
            busy
        })
    });
    prep(bufs);
    stamp(bufs, &mut clock);
    run(bufs)
}

/// Buffet's worker path over `bufs` in bursts of [`BURST`]; the outcomes stay in the
/// mbufs.
fn run_buffet<N: NetworkFunction>(engine: &mut Worker<N>, bufs: &mut [PacketBuf]) {
    for burst in bufs.chunks_mut(BURST) {
        engine.process(burst);
    }
    black_box(engine.packets());
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(PACKETS as u64));
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    g
}

// ---------------------------------------------------------------------------------------
// The NFs
// ---------------------------------------------------------------------------------------

/// Monitor over the common traffic; each tenant's flow table sized to twice its flows,
/// the baseline's to twice all flows.
fn monitor(c: &mut Criterion) {
    let mut g = group(c, "monitor");
    for &n in &TENANT_COUNTS {
        let frames = flow_traffic(n, 1);
        let flows = flows_per_tenant(&frames, n);
        let policies: Vec<MonitorPolicy> = flows
            .iter()
            .map(|&f| MonitorPolicy {
                flow_capacity: Some(table_size(f)),
            })
            .collect();
        let max = policies.iter().filter_map(|p| p.flow_capacity).max();
        let all: usize = flows.iter().sum();
        let case = Case {
            frames: &frames,
            nf: Monitor::with_max_flows(max.unwrap_or(64)),
            policies,
            baseline: SingleTenant::new(
                Monitor::with_max_flows(table_size(all)),
                &MonitorPolicy {
                    flow_capacity: None,
                },
            ),
        };
        compare(&mut g, "monitor", case);
    }
    g.finish();
}

fn rule(
    action: Action,
    src: Option<String>,
    dst: Option<String>,
    proto: Option<&str>,
    src_port: Option<&str>,
    dst_port: Option<&str>,
) -> RulePolicy {
    let name = |s: &str| NumOrName::Name(s.to_string());
    RulePolicy {
        action,
        src,
        dst,
        proto: proto.map(name),
        src_port: src_port.map(name),
        dst_port: dst_port.map(name),
    }
}

/// Tenant `t`'s ACL: 100 rules, first match wins, default deny, connection tracking:
/// SSH/telnet locked out from some client /28s, quarantined servers and blocked clients
/// denied; published services allowed (host, protocol, port: the exact-match tuple);
/// SMTP only to two relays and SNMP only from the management /24, both explicitly
/// denied otherwise; some UDP port ranges denied; subnet-to-subnet TCP port ranges, UDP
/// services per subnet, and web, DNS, NTP and application ports from all clients allowed.
fn firewall_policy(t: u32, conntrack: u32) -> FirewallPolicy {
    use Action::{Allow, Deny};
    let mut r = Rng::new(0xf1e0_0000 + u64::from(t));
    let mut rules = Vec::with_capacity(100);
    let server = |r: &mut Rng| format!("10.0.{}.{}", r.below(16), 1 + r.below(254));
    let clients = || Some("192.168.0.0/16".to_string());
    for _ in 0..8 {
        let src = format!("192.168.{}.{}/28", r.below(4), 16 * r.below(16));
        rules.push(rule(
            Deny,
            Some(src),
            None,
            Some("tcp"),
            None,
            Some("20-23"),
        ));
    }
    for _ in 0..12 {
        rules.push(rule(Deny, None, Some(server(&mut r)), None, None, None));
    }
    for _ in 0..5 {
        let src = format!("192.168.{}.{}", r.below(4), 1 + r.below(254));
        rules.push(rule(Deny, Some(src), None, None, None, None));
    }
    for _ in 0..20 {
        let (proto, port) = if r.below(10) < 8 {
            ("tcp", *r.pick(&TCP_SERVICES))
        } else {
            ("udp", *r.pick(&UDP_SERVICES))
        };
        let port = port.to_string();
        rules.push(rule(
            Allow,
            None,
            Some(server(&mut r)),
            Some(proto),
            None,
            Some(&port),
        ));
    }
    for _ in 0..2 {
        rules.push(rule(
            Allow,
            clients(),
            Some(server(&mut r)),
            Some("tcp"),
            None,
            Some("25"),
        ));
    }
    rules.push(rule(Deny, None, None, Some("tcp"), None, Some("25")));
    let nms = Some(format!("192.168.{}.0/24", r.below(4)));
    rules.push(rule(Allow, nms, None, Some("udp"), None, Some("161-162")));
    rules.push(rule(Deny, None, None, Some("udp"), None, Some("161-162")));
    for _ in 0..8 {
        let lo = 1024 + r.below(4000);
        let range = format!("{lo}-{}", lo + 1 + r.below(300));
        rules.push(rule(Deny, None, None, Some("udp"), None, Some(&range)));
    }
    for _ in 0..20 {
        let src = r.pick(&["192.168.0.0/22", "192.168.0.0/23"]).to_string();
        let dst = format!("10.0.{}.0/24", r.below(16));
        let ports = *r.pick(&["1-1023", "8000-8099", "3000-6999", "1024-65535"]);
        rules.push(rule(
            Allow,
            Some(src),
            Some(dst),
            Some("tcp"),
            None,
            Some(ports),
        ));
    }
    for _ in 0..10 {
        let dst = format!("10.0.{}.0/24", r.below(16));
        let ports = *r.pick(&["53", "123", "5000-5999", "5060-5061"]);
        rules.push(rule(Allow, None, Some(dst), Some("udp"), None, Some(ports)));
    }
    for _ in 0..5 {
        let src = format!("192.168.{}.0/24", r.below(4));
        let dst = format!("10.0.{}.0/25", r.below(16));
        let port = *r.pick(&["443", "80", "8080"]);
        let sport = Some("1024-65535");
        rules.push(rule(
            Allow,
            Some(src),
            Some(dst),
            Some("tcp"),
            sport,
            Some(port),
        ));
    }
    for (proto, ports) in [
        ("tcp", "80"),
        ("tcp", "443"),
        ("tcp", "8000-8099"),
        ("tcp", "3000-6999"),
        ("udp", "53"),
        ("udp", "123"),
        ("udp", "5000-5999"),
    ] {
        rules.push(rule(Allow, clients(), None, Some(proto), None, Some(ports)));
    }
    assert_eq!(rules.len(), 100);
    FirewallPolicy {
        default: Deny,
        allow_established: true,
        conntrack_capacity: Some(conntrack),
        established_timeout_s: Some(300),
        rules,
    }
}

/// Firewall over the common traffic; 100 rules per tenant, connection tables sized to
/// twice the tenant's flows (the baseline's to twice all flows).
fn firewall(c: &mut Criterion) {
    let mut g = group(c, "firewall");
    for &n in &TENANT_COUNTS {
        let frames = flow_traffic(n, 2);
        let flows = flows_per_tenant(&frames, n);
        let policies: Vec<FirewallPolicy> = (0..n)
            .map(|t| firewall_policy(t, table_size(flows[t as usize])))
            .collect();
        let limits = |conns: u32| FirewallLimits {
            max_rules: 128,
            max_entries: 4096,
            max_conns: conns,
        };
        let max_conns = policies.iter().filter_map(|p| p.conntrack_capacity).max();
        let all = table_size(flows.iter().sum());
        // Tenant 0's rules with a connection table for everyone's flows, beyond the
        // default limits.
        let single = firewall_policy(0, all);
        let case = Case {
            frames: &frames,
            nf: Firewall::with_limits(limits(max_conns.unwrap_or(64))),
            policies,
            baseline: SingleTenant::new(Firewall::with_limits(limits(all)), &single),
        };
        compare(&mut g, "firewall", case);
    }
    g.finish();
}

/// Attack strings every tenant picks 12 of (`true`: case-insensitive).
const COMMON_CONTENTS: [(&str, bool); 24] = [
    ("/etc/passwd", false),
    ("cmd.exe", true),
    ("<script>", true),
    ("union select", true),
    ("/bin/sh", false),
    ("wget http", false),
    ("xp_cmdshell", true),
    ("../../", false),
    ("base64_decode", false),
    ("powershell -enc", true),
    ("SELECT * FROM users", true),
    ("jndi:ldap", true),
    ("/wp-admin/setup", false),
    ("phpmyadmin", true),
    (".htaccess", false),
    ("/.git/config", false),
    ("nc -e /bin", false),
    ("chmod 777", false),
    ("curl -s http", false),
    ("base64 -d", false),
    ("/proc/self/environ", false),
    ("DROP TABLE", true),
    ("onerror=alert", true),
    ("/cgi-bin/", false),
];

const WORDS: [&str; 32] = [
    "the",
    "user",
    "id=",
    "session",
    "GET",
    "POST",
    "json",
    "value",
    "Accept:",
    "text/html",
    "200",
    "OK",
    "cache",
    "control",
    "max-age=3600",
    "data",
    "items",
    "name",
    "price",
    "count",
    "true",
    "false",
    "null",
    "0",
    "17",
    "42",
    "image/png",
    "cookie",
    "lang=en",
    "utf-8",
    "content",
    "length",
];

/// `len` bytes of HTTP-ish text.
fn text(r: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        v.extend_from_slice(r.pick(&WORDS).as_bytes());
        v.push(*r.pick(b"  &=\n"));
    }
    v.truncate(len);
    v
}

/// Tenant `t`'s signatures: 12 of the common attack strings and 20 tenant-specific
/// tokens (honeytokens, leaked-secret markers), some on port 80 or UDP 53 only, some
/// with two contents. Returns the policy and the tokens.
fn ids_policy(t: u32) -> (IdsPolicy, Vec<String>) {
    let mut r = Rng::new(0x1d5_0000 + u64::from(t));
    let mut idx: Vec<usize> = (0..COMMON_CONTENTS.len()).collect();
    for i in 0..12 {
        let j = i + r.below((idx.len() - i) as u64) as usize;
        idx.swap(i, j);
    }
    let mut rules = String::new();
    for (k, &i) in idx[..12].iter().enumerate() {
        let (content, nocase) = COMMON_CONTENTS[i];
        let header = [
            "alert tcp any any -> any 80",
            "alert ip any any",
            "alert tcp any any",
        ][k % 3];
        let nocase = if nocase { " nocase;" } else { "" };
        rules.push_str(&format!(
            "{header} (msg:\"attack {i}\"; content:\"{content}\";{nocase} sid:{};)\n",
            1000 + k
        ));
    }
    let mut tokens = Vec::new();
    for k in 0..20u32 {
        let token = format!("tk{t:04x}{k:02x}{:08x}", r.next_u64() as u32);
        let line = match k % 5 {
            3 => format!(
                "alert udp any any -> any 53 (msg:\"dns token {k}\"; content:\"{token}\"; sid:{};)",
                2000 + k
            ),
            4 => format!(
                "alert tcp any any (msg:\"posted token {k}\"; content:\"POST\"; content:\"{token}\"; sid:{};)",
                2000 + k
            ),
            _ => format!(
                "alert ip any any (msg:\"token {k}\"; content:\"{token}\"; nocase; sid:{};)",
                2000 + k
            ),
        };
        rules.push_str(&line);
        rules.push('\n');
        tokens.push(token);
    }
    let policy = IdsPolicy {
        mode: IdsMode::Alert,
        rules,
        log_per_second: Some(10),
        recent_alerts: Some(16),
    };
    (policy, tokens)
}

/// IDS over the common flows with HTTP-ish text payloads; 1 % of the packets carry one of
/// the 24 common attack strings (half of them on the tenant's list), 1 % one of the
/// tenant's own tokens. Alert mode.
fn ids(c: &mut Criterion) {
    let mut g = group(c, "ids");
    for &n in &TENANT_COUNTS {
        let (policies, tokens): (Vec<IdsPolicy>, Vec<Vec<String>>) = (0..n).map(ids_policy).unzip();
        let flows = Zipf::new(FLOWS_PER_TENANT);
        let frames = generate(n, 3, |r, t| {
            let f = flow(t, flows.sample(r));
            let reply = r.below(100) < REPLY_PCT;
            let len = payload_len(imix(r), f.tcp).max(8);
            let mut payload = text(r, len);
            let inject: Option<&[u8]> = match r.below(100) {
                0 => Some(r.pick(&COMMON_CONTENTS).0.as_bytes()),
                1 => Some(r.pick(&tokens[t as usize]).as_bytes()),
                _ => None,
            };
            if let Some(s) = inject {
                let at = r.below((payload.len() - s.len().min(payload.len()) + 1) as u64) as usize;
                payload.splice(at..(at + s.len()).min(payload.len()), s.iter().copied());
            }
            l4_frame((MAC_A, MAC_B), &f, reply, &payload)
        });
        let limits = IdsLimits {
            max_rules: 64,
            max_automaton_bytes: 1 << 20,
            max_recent_alerts: 16,
        };
        let case = Case {
            frames: &frames,
            baseline: SingleTenant::new(Ids::default(), &policies[0]),
            nf: Ids::with_limits(limits),
            policies,
        };
        compare(&mut g, "ids", case);
    }
    g.finish();
}

fn key_hex(r: &mut Rng) -> String {
    (0..36)
        .map(|_| format!("{:02x}", r.next_u64() as u8))
        .collect()
}

/// Tenant `t`'s gateway address (outer source of its ESP).
fn gateway(t: u32) -> String {
    format!("198.18.{}.{}", t >> 8, t & 255)
}

/// The address of tenant `t`'s peer gateway `k`.
fn peer_gateway(t: u32, k: u32) -> String {
    format!("198.19.{}.{}", (t >> 8) * 4 + k, t & 255)
}

/// Tenant `t`'s SAs: outbound `k` (k = 0..3) sends 10.{k+1}.0.0/16 to peer `k`;
/// inbound `k` takes ESP from peer `k` carrying sources in 10.{k+1}.0.0/16. Every SA
/// has its own key and SPI; every tenant its own gateway address.
fn ipsec_policy(t: u32) -> IpsecPolicy {
    let mut r = Rng::new(0x1b5e_c000 + u64::from(t));
    let outbound = (0..3)
        .map(|k| OutboundSaPolicy {
            spi: 0x1000 + t * 4 + k,
            key: key_hex(&mut r),
            local: gateway(t),
            remote: peer_gateway(t, k),
            selector: format!("10.{}.0.0/16", k + 1),
            ttl: Some(64),
            esn: false,
        })
        .collect();
    let inbound = (0..3)
        .map(|k| InboundSaPolicy {
            spi: 0x10_0000 + t * 4 + k,
            key: key_hex(&mut r),
            local: gateway(t),
            remote: peer_gateway(t, k),
            selector: Some(format!("10.{}.0.0/16", k + 1)),
            replay_window: None,
            esn: false,
        })
        .collect();
    IpsecPolicy {
        outbound,
        inbound,
        replay_window: Some(64),
        unmatched: Unmatched::Drop,
        mtu: Some(1500),
        outbound_port: Some(1),
        inbound_port: Some(0),
        outbound_eth: Some(EthRewrite {
            src: Some("02:00:00:00:00:01".into()),
            dst: Some("02:00:00:00:00:fe".into()),
        }),
        inbound_eth: Some(EthRewrite {
            src: None,
            dst: Some("02:00:00:00:00:0a".into()),
        }),
    }
}

/// Tenant `t`'s peers as one gateway: outbound SA `k` is tenant `t`'s inbound SA `k`
/// (same SPI and key), selected by inner destination 192.168.k.0/24.
fn ipsec_peer(t: u32) -> IpsecState {
    let tenant = ipsec_policy(t);
    let outbound = tenant
        .inbound
        .iter()
        .zip(0u32..)
        .map(|(sa, k)| OutboundSaPolicy {
            spi: sa.spi,
            key: sa.key.clone(),
            local: peer_gateway(t, k),
            remote: gateway(t),
            selector: format!("192.168.{k}.0/24"),
            ttl: Some(64),
            esn: false,
        })
        .collect();
    let policy = IpsecPolicy {
        outbound,
        ..IpsecPolicy::default()
    };
    IpsecState::from_policy(&policy, 4).expect("peer policy")
}

/// Inner packets for the tenant's SAs, IMIX sizes (at most 1400 bytes: encapsulation
/// adds 54–57). Outbound: 192.168.0.0/22 to 10.{1,2,3}.x.y; inbound (as the peer sends
/// them before encryption): 10.{k+1}.x.y to 192.168.k.z.
fn ipsec_traffic(n: u32, seed: u64, inbound: bool) -> Frames {
    let flows = Zipf::new(FLOWS_PER_TENANT);
    generate(n, seed, |r, t| {
        let mut f = flow(t, flows.sample(r));
        let k = f.dst[2] % 3;
        if inbound {
            f = Flow {
                src: [10, k + 1, f.dst[2], f.dst[3]],
                dst: [192, 168, k, f.src[3]],
                sport: f.dport,
                dport: f.sport,
                ..f
            };
        } else {
            f.dst[1] = k + 1;
        }
        let payload = vec![0x6b; payload_len(imix(r), f.tcp)];
        l4_frame((MAC_A, MAC_B), &f, false, &payload)
    })
}

/// Restores the inner frames and has the peer encrypt them: each becomes new ESP from
/// its tenant's peer (`peers[0]` for all when `single`), with the next sequence numbers.
fn encrypt(
    bufs: &mut [PacketBuf],
    frames: &[(u32, Vec<u8>)],
    peers: &mut [IpsecState],
    single: bool,
) {
    for (m, (t, data)) in bufs.iter_mut().zip(frames) {
        m.fill(data);
        let peer = &mut peers[if single { 0 } else { *t as usize }];
        let len = m.len();
        let mut p = Packet::parse_with_capacity(m.buffer_mut(), len, PacketMeta::default())
            .expect("inner frames parse");
        let v = peer.process(&mut p);
        assert_eq!(v, Verdict::Pass, "the peer encapsulates every inner frame");
        let new_len = p.len();
        m.set_len(new_len);
    }
}

fn ipsec_limits() -> Ipsec {
    Ipsec::with_max_sas(4)
}

/// The baseline's IPsec: exactly as many SAs as `policy` has in either direction.
fn ipsec_baseline(policy: &IpsecPolicy) -> Ipsec {
    Ipsec::with_max_sas(policy.outbound.len().max(policy.inbound.len()))
}

/// IPsec outbound: every packet matches one of the tenant's three outbound SAs and is
/// encapsulated (AES-256-GCM). The frames are restored before each iteration.
fn ipsec(c: &mut Criterion) {
    let mut g = group(c, "ipsec");
    for &n in &TENANT_COUNTS {
        let frames = ipsec_traffic(n, 4, false);
        let policies: Vec<IpsecPolicy> = (0..n).map(ipsec_policy).collect();
        let case = Case {
            frames: &frames,
            baseline: SingleTenant::new(ipsec_baseline(&policies[0]), &policies[0]),
            nf: ipsec_limits(),
            policies,
        };
        let restore = |bufs: &mut [PacketBuf]| refill(bufs, &frames);
        compare_with(&mut g, "ipsec", case, restore, restore);
    }
    g.finish();
}

/// IPsec inbound: every packet is ESP from one of the tenant's peers, decrypted,
/// checked against the anti-replay window and the SA's selector, and decapsulated.
/// Before each iteration the peers encrypt the inner frames afresh (untimed).
fn ipsec_inbound(c: &mut Criterion) {
    let mut g = group(c, "ipsec-inbound");
    for &n in &TENANT_COUNTS {
        let frames = ipsec_traffic(n, 5, true);
        let policies: Vec<IpsecPolicy> = (0..n).map(ipsec_policy).collect();
        let mut single_peer = vec![ipsec_peer(0)];
        let mut peers: Vec<IpsecState> = (0..n).map(ipsec_peer).collect();
        let case = Case {
            frames: &frames,
            baseline: SingleTenant::new(ipsec_baseline(&policies[0]), &policies[0]),
            nf: ipsec_limits(),
            policies,
        };
        compare_with(
            &mut g,
            "ipsec-inbound",
            case,
            |bufs| encrypt(bufs, &frames, &mut single_peer, true),
            |bufs| encrypt(bufs, &frames, &mut peers, false),
        );
    }
    g.finish();
}

fn benign_host(k: u64) -> String {
    match k % 4 {
        0 => format!("www.site{k}.com"),
        1 => format!("cdn{k}.static-edge.net"),
        2 => format!("api.service{k}.io"),
        _ => format!("img{k}.photos-cdn.org"),
    }
}

const BAD_DOMAINS: u64 = 2000;

fn bad_domain(k: u64) -> String {
    match k % 3 {
        0 => format!("ads{k}.tracker-net.com"),
        1 => format!("malware{k}.example"),
        _ => format!("phish{k}.login-verify.net"),
    }
}

/// Tenant `t`'s blacklist: 48 of 2,000 known-bad domains and two of its own; even
/// tenants inspect ports 80 and 8080 only, odd ones every port.
fn dpi_policy(t: u32) -> DpiPolicy {
    let mut r = Rng::new(0xd910_0000 + u64::from(t));
    let mut blacklist: Vec<String> = (0..48).map(|_| bad_domain(r.below(BAD_DOMAINS))).collect();
    blacklist.push(format!("t{t}-blocked.example.org"));
    blacklist.push(format!("Intranet-T{t}.corp.example."));
    DpiPolicy {
        blacklist,
        ports: (t % 2 == 0).then(|| vec![80, 8080]),
    }
}

const USER_AGENT: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";

/// DPI: TCP to port 80 (8080 for a tenth). Three quarters of the packets are HTTP GET
/// requests with a browser's headers; their Host is benign (90 %), on the tenant's own
/// blacklist or a subdomain of it (6 %), or another known-bad domain (4 %). The rest are
/// responses and continuation segments (no request line).
fn dpi(c: &mut Criterion) {
    let mut g = group(c, "dpi");
    for &n in &TENANT_COUNTS {
        let policies: Vec<DpiPolicy> = (0..n).map(dpi_policy).collect();
        let flows = Zipf::new(FLOWS_PER_TENANT);
        let frames = generate(n, 6, |r, t| {
            let mut f = flow(t, flows.sample(r));
            f.tcp = true;
            f.dport = if r.below(10) == 0 { 8080 } else { 80 };
            if r.below(4) == 0 {
                let len = payload_len(imix(r), true).max(16);
                let mut body = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html>".to_vec();
                body.extend(text(r, len));
                body.truncate(len);
                return l4_frame((MAC_B, MAC_A), &f, true, &body);
            }
            let host = match r.below(100) {
                0..90 => benign_host(r.below(400)),
                90..96 => {
                    let d = r.pick(&policies[t as usize].blacklist).clone();
                    if r.below(2) == 0 {
                        format!("www.{d}")
                    } else {
                        d
                    }
                }
                _ => bad_domain(r.below(BAD_DOMAINS)),
            };
            let request = format!(
                "GET /static/app{}.js?v={} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n\
                 Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.5\r\n\
                 Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n\r\n",
                r.below(1000),
                r.below(100_000)
            );
            l4_frame((MAC_A, MAC_B), &f, false, request.as_bytes())
        });
        let case = Case {
            frames: &frames,
            baseline: SingleTenant::new(Dpi::default(), &policies[0]),
            nf: Dpi::with_max_domains(64),
            policies,
        };
        compare(&mut g, "dpi", case);
    }
    g.finish();
}

/// MacSwap over the common traffic (its policy is empty; its state is counters).
fn macswap(c: &mut Criterion) {
    let mut g = group(c, "macswap");
    for &n in &TENANT_COUNTS {
        let frames = flow_traffic(n, 7);
        let case = Case {
            frames: &frames,
            nf: MacSwap,
            policies: vec![MacSwapPolicy {}; n as usize],
            baseline: SingleTenant::new(MacSwap, &MacSwapPolicy {}),
        };
        compare(&mut g, "macswap", case);
    }
    g.finish();
}

/// Policer over the common traffic. Tenant `t`'s rate is its offered load (its share of
/// the 10 Mpps of packet time) times a factor in 0.6..1.4, so some tenants are policed;
/// a third of the tenants count packets, the rest bytes; buckets hold 1 ms of rate.
/// The baseline polices the aggregate at 0.9 of the offered bytes.
fn policer(c: &mut Criterion) {
    let mut g = group(c, "policer");
    for &n in &TENANT_COUNTS {
        let frames = flow_traffic(n, 8);
        let span_ns = (PACKETS as u64 * GAP_NS) as f64;
        let per_s = |x: u64| x as f64 * 1e9 / span_ns;
        let (mut bytes, mut pkts) = (vec![0u64; n as usize], vec![0u64; n as usize]);
        for (t, f) in &frames {
            bytes[*t as usize] += f.len() as u64;
            pkts[*t as usize] += 1;
        }
        let policies = (0..n)
            .map(|t| {
                let mut r = Rng::new(0x901_0000 + u64::from(t));
                let factor = 0.6 + 0.8 * r.unit();
                let i = t as usize;
                let (unit, offered, min_burst) = if t % 3 == 2 {
                    (PolicerUnit::Packets, per_s(pkts[i]), 2)
                } else {
                    (PolicerUnit::Bytes, per_s(bytes[i]), 1500)
                };
                let rate = ((offered * factor) as u64).max(1);
                PolicerPolicy {
                    rate,
                    burst: (rate / 1000).max(min_burst),
                    unit,
                }
            })
            .collect();
        let rate = (0.9 * per_s(bytes.iter().sum())) as u64;
        let single = PolicerPolicy {
            rate,
            burst: (rate / 1000).max(1500),
            unit: PolicerUnit::Bytes,
        };
        let case = Case {
            frames: &frames,
            nf: Policer,
            policies,
            baseline: SingleTenant::new(Policer, &single),
        };
        compare(&mut g, "policer", case);
    }
    g.finish();
}

const L2_HOSTS: u32 = 32;

fn mac(t: u32, k: u32) -> String {
    format!(
        "02:{:02x}:{:02x}:00:{:02x}:{:02x}",
        t >> 8,
        t & 255,
        k >> 8,
        k & 255
    )
}

fn mac_bytes(t: u32, k: u32) -> [u8; 6] {
    [0x02, (t >> 8) as u8, t as u8, 0, (k >> 8) as u8, k as u8]
}

/// Tenant `t`'s MAC table: its 32 hosts on ports 1..=15; odd tenants also list the
/// broadcast address and flood misses to port 0, even ones drop misses.
fn l2fwd_policy(t: u32) -> L2FwdPolicy {
    let mut r = Rng::new(0x12f0_0000 + u64::from(t));
    let mut entries: Vec<MacEntry> = (0..L2_HOSTS)
        .map(|k| MacEntry {
            mac: mac(t, k),
            port: 1 + r.below(15) as u16,
        })
        .collect();
    let odd = t % 2 == 1;
    if odd {
        entries.push(MacEntry {
            mac: "ff:ff:ff:ff:ff:ff".into(),
            port: 15,
        });
    }
    L2FwdPolicy {
        default: odd.then_some(NumOrName::Num(0)),
        entries,
    }
}

/// L2Fwd: frames of the common flows to one of the tenant's 32 hosts (94 %), an unknown
/// unicast MAC (5 %) or broadcast (1 %). The baseline holds every tenant's hosts.
fn l2fwd(c: &mut Criterion) {
    let mut g = group(c, "l2fwd");
    for &n in &TENANT_COUNTS {
        let flows = Zipf::new(FLOWS_PER_TENANT);
        let frames = generate(n, 9, |r, t| {
            let f = flow(t, flows.sample(r));
            let dst = match r.below(100) {
                0..94 => mac_bytes(t, r.below(u64::from(L2_HOSTS)) as u32),
                94..99 => mac_bytes(t, L2_HOSTS + r.below(200) as u32),
                _ => [0xff; 6],
            };
            let payload = vec![0x5a; payload_len(imix(r), f.tcp)];
            l4_frame((MAC_A, dst), &f, false, &payload)
        });
        let policies: Vec<L2FwdPolicy> = (0..n).map(l2fwd_policy).collect();
        let union = L2FwdPolicy {
            default: None,
            entries: policies
                .iter()
                .flat_map(|p| p.entries.iter().filter(|e| !e.mac.starts_with("ff")))
                .cloned()
                .collect(),
        };
        let case = Case {
            frames: &frames,
            nf: L2Fwd::with_max_entries(64),
            policies,
            baseline: SingleTenant::new(L2Fwd::default(), &union),
        };
        compare(&mut g, "l2fwd", case);
    }
    g.finish();
}

const FWD_FLOWS: u32 = 64;

/// Tenant `t`'s flow table: its 64 heaviest flows, each to a port in 1..=15; misses go
/// to the slow-path port 0, except for every fourth tenant, which drops them.
fn flowfwd_policy(t: u32) -> FlowFwdPolicy {
    let mut r = Rng::new(0xf10f_0000 + u64::from(t));
    let ip = |a: [u8; 4]| format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]);
    let flows = (0..FWD_FLOWS)
        .map(|i| {
            let f = flow(t, i);
            FlowEntry {
                src: ip(f.src),
                dst: ip(f.dst),
                proto: NumOrName::Name(if f.tcp { "tcp" } else { "udp" }.into()),
                src_port: Some(f.sport),
                dst_port: Some(f.dport),
                port: 1 + r.below(15) as u16,
            }
        })
        .collect();
    FlowFwdPolicy {
        default: (t % 4 != 3).then_some(NumOrName::Num(0)),
        flows,
    }
}

/// FlowFwd: the common flows, client to server only (entries are directional); a
/// tenant's table holds its 64 heaviest of 256 flows (about three quarters of its
/// packets). The baseline holds every tenant's entries.
fn flowfwd(c: &mut Criterion) {
    let mut g = group(c, "flowfwd");
    for &n in &TENANT_COUNTS {
        let flows = Zipf::new(FLOWS_PER_TENANT);
        let frames = generate(n, 10, |r, t| {
            let f = flow(t, flows.sample(r));
            let payload = vec![0x5a; payload_len(imix(r), f.tcp)];
            l4_frame((MAC_A, MAC_B), &f, false, &payload)
        });
        let policies: Vec<FlowFwdPolicy> = (0..n).map(flowfwd_policy).collect();
        let union = FlowFwdPolicy {
            default: Some(NumOrName::Num(0)),
            flows: policies
                .iter()
                .flat_map(|p| p.flows.iter().cloned())
                .collect(),
        };
        let case = Case {
            frames: &frames,
            nf: FlowFwd::with_max_flows(FWD_FLOWS),
            policies,
            baseline: SingleTenant::new(FlowFwd::default(), &union),
        };
        compare(&mut g, "flowfwd", case);
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------
// Scale (REEdge Fig. 5 / Table 2)
// ---------------------------------------------------------------------------------------

/// Tenant counts of the scale groups: 1 to 16,384 in powers of 4.
const SCALE_COUNTS: [u32; 8] = [1, 4, 16, 64, 256, 1024, 4096, 16384];

/// Scale: l2fwd (MAC lookup) and flowfwd (5-tuple lookup) with 1 to 16,384 tenants, every
/// frame 64 or 1,500 bytes, tenants drawn uniformly (so at 16,384 tenants a burst of 256
/// holds 256 different tenants and each group is one packet), every frame hitting its
/// tenant's table. Groups `scale-l2fwd-64B`, `scale-l2fwd-1500B`, `scale-flowfwd-64B`,
/// `scale-flowfwd-1500B`, each with `specialised/n` and `buffet/n` and, at `n = 1`, the
/// single-tenant NF; the result is how the rate falls with `n` against `buffet/1` of the
/// same group (REEdge claims a flat line to 4,096 ports), and how much of that fall the
/// specialised multi-tenant NF shows too (what `n` tenants' tables cost any
/// implementation) against what Buffet adds.
fn scale(c: &mut Criterion) {
    for size in [64usize, 1500] {
        scale_group(
            c,
            "l2fwd",
            size,
            0x5ca1e,
            |r, t| {
                let f = flow(t, r.below(u64::from(FLOWS_PER_TENANT)) as u32);
                let dst = mac_bytes(t, r.below(u64::from(L2_HOSTS)) as u32);
                (f, dst)
            },
            || L2Fwd::with_max_entries(64),
            l2fwd_policy,
        );
        scale_group(
            c,
            "flowfwd",
            size,
            0xf5ca1e,
            |r, t| (flow(t, r.below(u64::from(FWD_FLOWS)) as u32), MAC_B),
            || FlowFwd::with_max_flows(FWD_FLOWS),
            flowfwd_policy,
        );
    }
}

/// Group `scale-<name>-<size>B`: for every tenant count, `PACKETS` frames of `size` bytes
/// to tenants drawn uniformly, each frame's flow and destination MAC from `pick`.
fn scale_group<N: NetworkFunction + Clone>(
    c: &mut Criterion,
    name: &str,
    size: usize,
    seed: u64,
    mut pick: impl FnMut(&mut Rng, u32) -> (Flow, [u8; 6]),
    nf: impl Fn() -> N,
    policy: impl Fn(u32) -> N::Policy,
) {
    let mut g = group(c, &format!("scale-{name}-{size}B"));
    for &n in &SCALE_COUNTS {
        let mut r = Rng::new(seed ^ (u64::from(n) << 20));
        let frames: Frames = (0..PACKETS)
            .map(|_| {
                let t = r.below(u64::from(n)) as u32;
                let (f, dst) = pick(&mut r, t);
                let payload = vec![0x5a; payload_len(size, f.tcp)];
                (t, l4_frame((MAC_A, dst), &f, false, &payload))
            })
            .collect();
        let policies: Vec<N::Policy> = (0..n).map(&policy).collect();
        scale_case(&mut g, name, &frames, nf(), policies);
    }
    g.finish();
}

/// `specialised/n` and `buffet/n` over `frames` (and `single-tenant/1` when there is one
/// tenant).
fn scale_case<N: NetworkFunction + Clone>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    frames: &[(u32, Vec<u8>)],
    nf: N,
    policies: Vec<N::Policy>,
) {
    let n = policies.len();
    let mut bufs = mbufs(frames);
    if n == 1 {
        let mut single = SingleTenant::new(nf.clone(), &policies[0]);
        let mix = bench_arm(g, "single-tenant", n, &mut bufs, &mut no_prep, |b| {
            run_single(&mut single, b)
        });
        eprintln!("nfs: scale-{name} single-tenant/{n}: {mix}");
    }
    let mut special = Specialised::new(&nf, &policies);
    let mix = bench_arm(g, "specialised", n, &mut bufs, &mut no_prep, |b| {
        run_specialised(&mut special, b)
    });
    eprintln!("nfs: scale-{name} specialised/{n}: {mix}");
    drop(special);
    let table = tenant_table(&nf, &policies);
    let mut engine = Worker::new(Arc::new(nf), table);
    bench_arm(g, "buffet", n, &mut bufs, &mut no_prep, |b| {
        run_buffet(&mut engine, b)
    });
    eprintln!("nfs: scale-{name} buffet/{n}: {}", outcomes(&bufs));
}

criterion_group!(
    benches,
    monitor,
    firewall,
    ids,
    ipsec,
    ipsec_inbound,
    dpi,
    macswap,
    policer,
    l2fwd,
    flowfwd,
    scale
);
criterion_main!(benches);
