//! `chains`: what a per-tenant service chain (docs/chains.md) costs, on one core and
//! across threads, and how a skewed multi-tenant trace fragments its groups.
//!
//! Packets are parsed from memory and handed over in groups of `GROUP_CHUNK` (32), as a
//! worker hands a tenant's Packet Buffer to its NF; parsing is in every arm alike.
//!
//! * `chains-noop/direct` — a no-op NF called directly (`handle_group`), the baseline;
//!   `chains-noop/chain-k` — a [`Chain`] of k no-op stages (k = 1, 2, 4, 8): the
//!   difference to `chain-1`, divided by k − 1, is the framework's cost per packet per
//!   extra stage (goal: at most 5 ns);
//! * `chains-firewall/fused-k` — one hand-fused NF doing k firewall lookups (k firewall
//!   states, each with its own 16-rule ACL, one after the other in one `handle`), the
//!   baseline; `chains-firewall/chain-k` — a chain of k firewall stages with the same
//!   policies (k = 1 … 4), run to completion on the calling thread; goal: `chain-4` at
//!   least 0.95 of `fused-4`'s throughput; `fused-vec-k` — the same hand-fused lookups
//!   table-at-a-time over the group (the chain's order), to tell order from overhead;
//! * `chains-firewall/pipelined-k` — FastPaas Fig. 1's "across cores": the same k stages,
//!   one stage per thread, behind a source thread that parses the frames, stamps the
//!   time and hands each chunk of 32 over (k + 1 threads); the chunks travel through
//!   bounded SPSC rings (crossbeam's `ArrayQueue`, 8 chunks each) as boxes that own
//!   their frames — a pointer moves, the bytes never do — with the header offsets of the
//!   source's parse, and come back to the source from the last stage. Each stage is a
//!   one-stage `Chain` with the same policy, so a stage's work is the run-to-completion
//!   chain's; `chains-firewall/pipelined-2t-k` (k ≥ 2) cuts the chain in two halves over
//!   2 threads (the source runs the first ⌊k/2⌋ stages), so no more threads poll than
//!   there are cores on a 2-core machine. Threads are not pinned; an idle thread spins,
//!   then yields (crossbeam's `Backoff`), so where threads outnumber cores (pipelined-k,
//!   k ≥ 2, on 2 cores) they time-share them;
//! * `chains-flowfwd/…` — the same with flowfwd (exact-match 5-tuple table) stages.
//!
//! After the criterion measurements of the firewall and flowfwd groups, an untimed pass
//! per arm (100 × 4,096 packets) times each chunk from its first stage's input to its
//! last stage's output (across threads: stamped by the source before its first stage or
//! hand-over, read by the thread that ran the last stage, so ring waits count) and
//! writes rate, p50 and p99 per packet to `results/chains.csv` under `CARGO_TARGET_DIR`
//! (default `target/`).
//!
//! * `chains-batching` — FastPaas Fig. 2: a 32,768-packet trace of 1,000 tenants, each
//!   packet's tenant drawn Zipf(1) (`buffet_testkit::Zipf`), 30 % TCP to port 80 (the
//!   web path), the rest UDP to port 53, 100 ns apart in packet time, read by a
//!   [`Worker`] in bursts of 128; every tenant runs the chain firewall → firewall only
//!   `when = { protocol = "tcp", dst_port = 80 }` → firewall. Arms: `in-chain` (the
//!   dispatcher's slot is the tenant; the chain splits the web path off inside each
//!   group) and `presplit` (the slot is (tenant, path), as if the classifier returned
//!   both: every group arrives on one path; 2,000 slots, each with its own chain state),
//!   each with groups cut per burst (`burst`) and with persistent Packet Buffers
//!   (`buffers-50us`: group 32, latency bound 50 µs, on a virtual clock advanced with
//!   packet time). Before the timing, one pass per configuration (latency bounds none,
//!   50 µs, 500 µs) counts the groups the first stage and the guarded stage are handed
//!   and writes their sizes (per 128 packets, mean, packet-weighted mean, p50/p90/p99),
//!   and the distinct slots per 128-packet burst, to `results/chains_batching.csv`.
//!
//! Stage timing (`Chain::timed`) is off in the `chain-k` arms and on in `chain-k-timed`
//! of the no-op group, so its cost is on record too.
//!
//! Run: `cargo bench --bench chains` (one group: `cargo bench --bench chains --
//! chains-noop`; the untimed passes and their CSV rows run only for the groups the
//! filter, taken as a plain substring, selects; `-- --test` runs each once and writes
//! nothing).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet::config::chain::{Chain, ChainPolicy, ChainState};
use buffet::config::registry::RegisteredNf;
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::firewall::{Firewall, FirewallLimits};
use buffet::nfs::flowfwd::FlowFwd;
use buffet::sdk::{
    Layout, MemorySpec, NetworkFunction, Packet, PacketMeta, TenantId, TenantSlot, Verdict,
    GROUP_CHUNK,
};
use buffet::worker::{BufferConfig, ClockSource, Outcome, PacketBuf, VirtualClock, Worker};
use buffet_testkit::{Rng, Zipf};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::Backoff;
use etherparse::PacketBuilder;
use serde_json::json;

#[path = "common/report.rs"]
#[allow(dead_code)]
mod report;
use report::percentile;

/// Packets per iteration.
const PACKETS: usize = 4096;

/// An NF that passes everything.
#[derive(Default)]
struct NoOp;

impl NetworkFunction for NoOp {
    type State = u64;
    type Policy = serde_json::Value;

    fn name(&self) -> &'static str {
        "noop"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec::of::<u64>()
    }

    fn init(&self, _: &serde_json::Value, _: &mut u64) -> Result<(), buffet::sdk::InitError> {
        Ok(())
    }

    #[inline]
    fn handle(&self, _: &mut Packet<'_>, state: &mut u64) -> Verdict {
        *state += 1;
        Verdict::Pass
    }
}

impl RegisteredNf for NoOp {}

/// k firewall (or flowfwd) lookups in one NF: the hand-fused baseline. `Fused(nf, k,
/// false)` does a packet's k lookups one after the other, then the next packet's
/// (packet-at-a-time: `fused-k`); `Fused(nf, k, true)` does the first lookup for every
/// packet of the group, then the second for those still passing, and so on
/// (table-at-a-time, the order a chain runs its stages in: `fused-vec-k`). Both do the
/// same work per packet, with no sharing between lookups (each lookup extracts and hashes
/// the key again, as a chain's independent stages must); they differ only in order.
struct Fused<N: NetworkFunction>(N, usize, bool);

struct FusedState<S>(Vec<S>);

impl<S> Default for FusedState<S> {
    fn default() -> Self {
        FusedState(Vec::new())
    }
}

impl<N: NetworkFunction> NetworkFunction for Fused<N> {
    type State = FusedState<N::State>;
    type Policy = Vec<N::Policy>;

    fn name(&self) -> &'static str {
        "fused"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec {
            bytes: self.0.register().bytes * self.1,
        }
    }

    fn init(&self, p: &Vec<N::Policy>, s: &mut Self::State) -> Result<(), buffet::sdk::InitError> {
        for p in p {
            let mut st = N::State::default();
            self.0.init(p, &mut st)?;
            s.0.push(st);
        }
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, s: &mut Self::State) -> Verdict {
        let mut out = Verdict::Pass;
        for st in &mut s.0 {
            out = self.0.handle(pkt, st);
            if !out.is_pass() {
                break;
            }
        }
        out
    }

    #[inline]
    fn handle_group(&self, pkts: &mut [Packet<'_>], s: &mut Self::State, verdicts: &mut [Verdict]) {
        if !self.2 {
            for (pkt, v) in pkts.iter_mut().zip(verdicts.iter_mut()) {
                *v = self.handle(pkt, s);
            }
            return;
        }
        let n = pkts.len().min(verdicts.len());
        verdicts[..n].fill(Verdict::Pass);
        for st in &mut s.0 {
            for (pkt, v) in pkts[..n].iter_mut().zip(verdicts[..n].iter_mut()) {
                if v.is_pass() {
                    *v = self.0.handle(pkt, st);
                }
            }
        }
    }
}

fn frames(seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..PACKETS)
        .map(|_| {
            let mut v = Vec::new();
            let host = (rng.next_u64() % 64) as u8;
            let dport = [80u16, 443, 53, 8080][(rng.next_u64() % 4) as usize];
            PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                .ipv4([192, 168, 0, host], [10, 0, 0, 1], 64)
                .udp(40000 + u16::from(host), dport)
                .write(&mut v, &[0u8; 18])
                .unwrap();
            v
        })
        .collect()
}

/// Runs `f` over the frames in groups of [`GROUP_CHUNK`] parsed packets.
#[inline]
fn groups(frames: &mut [Vec<u8>], mut f: impl FnMut(&mut [Packet<'_>], &mut [Verdict])) {
    let mut verdicts = [Verdict::Pass; GROUP_CHUNK];
    let mut scratch: Vec<Packet<'static>> = Vec::with_capacity(GROUP_CHUNK);
    for chunk in frames.chunks_mut(GROUP_CHUNK) {
        let mut pkts = recycle(std::mem::take(&mut scratch));
        pkts.extend(
            chunk
                .iter_mut()
                .map(|b| Packet::parse(b, PacketMeta::default()).unwrap()),
        );
        let n = pkts.len();
        f(&mut pkts, &mut verdicts[..n]);
        black_box(&verdicts);
        scratch = recycle(pkts);
    }
}

/// An emptied vector of packet views, its allocation kept for views of other buffers (an
/// in-place collect of an empty iterator: no allocation per group).
#[inline]
fn recycle<'b>(mut v: Vec<Packet<'_>>) -> Vec<Packet<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

fn chain_of(nf_key: &str, policies: &[serde_json::Value]) -> ChainPolicy {
    let stages: Vec<_> = policies
        .iter()
        .map(|p| json!({ "nf": nf_key, "policy": p }))
        .collect();
    serde_json::from_value(json!({ "stages": stages })).unwrap()
}

fn noop(c: &mut Criterion) {
    let mut g = c.benchmark_group("chains-noop");
    g.throughput(Throughput::Elements(PACKETS as u64));
    g.measurement_time(Duration::from_secs(3));
    let mut buf = frames(1);
    let mut st = 0u64;
    g.bench_function("direct", |b| {
        b.iter(|| groups(&mut buf, |p, v| NoOp.handle_group(p, &mut st, v)))
    });
    for timed in [false, true] {
        for k in [1usize, 2, 4, 8] {
            let chain = Chain::new().timed(timed).with_nf("noop", NoOp);
            let mut s = ChainState::default();
            chain
                .init(&chain_of("noop", &vec![json!(null); k]), &mut s)
                .unwrap();
            let name = if timed {
                format!("chain-{k}-timed")
            } else {
                format!("chain-{k}")
            };
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| groups(&mut buf, |p, v| chain.handle_group(p, &mut s, v)))
            });
        }
    }
    g.finish();
}

fn firewall_policy(i: usize) -> serde_json::Value {
    let rules: Vec<_> = (0..16)
        .map(|r| json!({ "action": "deny", "proto": "tcp", "dst_port": 1000 + i * 16 + r }))
        .collect();
    json!({ "default": "allow", "rules": rules })
}

fn flowfwd_policy(i: usize) -> serde_json::Value {
    let flows: Vec<_> = (0..64)
        .map(|h| {
            json!({ "src": format!("192.168.0.{h}"), "dst": "10.0.0.1", "proto": "udp",
                    "src_port": 40000 + h, "dst_port": 53, "port": 1 + i })
        })
        .collect();
    json!({ "default": 0, "flows": flows })
}

fn lookups<N: RegisteredNf>(
    c: &mut Criterion,
    group: &str,
    key: &str,
    nf: fn() -> N,
    policy: fn(usize) -> serde_json::Value,
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(PACKETS as u64));
    g.measurement_time(Duration::from_secs(3));
    let mut buf = frames(2);
    let latency = selected(group);
    let mut rows = String::new();
    for k in 1..=4usize {
        let policies: Vec<serde_json::Value> = (0..k).map(policy).collect();
        let typed: Vec<N::Policy> = policies
            .iter()
            .map(|p| serde_json::from_value(p.clone()).unwrap())
            .collect();
        let fused = Fused(nf(), k, false);
        let mut fs = FusedState::default();
        fused.init(&typed, &mut fs).unwrap();
        g.bench_function(BenchmarkId::new("fused", k), |b| {
            b.iter(|| groups(&mut buf, |p, v| fused.handle_group(p, &mut fs, v)))
        });
        let fused_vec = Fused(nf(), k, true);
        let mut fvs = FusedState::default();
        fused_vec.init(&typed, &mut fvs).unwrap();
        g.bench_function(BenchmarkId::new("fused-vec", k), |b| {
            b.iter(|| groups(&mut buf, |p, v| fused_vec.handle_group(p, &mut fvs, v)))
        });
        let chain = Chain::new().timed(false).with_nf(key, nf());
        let mut s = ChainState::default();
        chain.init(&chain_of(key, &policies), &mut s).unwrap();
        g.bench_function(BenchmarkId::new("chain", k), |b| {
            b.iter(|| groups(&mut buf, |p, v| chain.handle_group(p, &mut s, v)))
        });
        if latency {
            let (mpps, lat) = timed_groups(&mut buf, |p, v| fused.handle_group(p, &mut fs, v));
            rows.push_str(&latency_row(key, "fused", k, 1, mpps, lat));
            let (mpps, lat) = timed_groups(&mut buf, |p, v| chain.handle_group(p, &mut s, v));
            rows.push_str(&latency_row(key, "chain", k, 1, mpps, lat));
        }
        // The same stages across threads: one stage per thread behind a source thread
        // (k + 1 threads), and the chain cut in two halves over 2 threads.
        for (arm, per_thread) in [("pipelined", true), ("pipelined-2t", false)] {
            if !per_thread && k == 1 {
                continue; // one stage over 2 threads is `pipelined/1`
            }
            let stages: Vec<PipeStage> = policies
                .iter()
                .map(|p| PipeStage::new(key, nf(), p))
                .collect();
            let segments: Vec<usize> = if per_thread {
                std::iter::once(0)
                    .chain(std::iter::repeat_n(1, k))
                    .collect()
            } else {
                vec![k / 2, k - k / 2]
            };
            let threads = segments.len();
            let mut pipe = Pipeline::new(frames(2), stages, &segments);
            g.bench_function(BenchmarkId::new(arm, k), |b| b.iter(|| pipe.run(None)));
            if latency {
                let mut lat = Vec::with_capacity(PACKETS * latency_iters());
                let t0 = Instant::now();
                for _ in 0..latency_iters() {
                    pipe.run(Some(&mut lat));
                }
                let mpps = lat.len() as f64 / t0.elapsed().as_secs_f64() / 1e6;
                rows.push_str(&latency_row(key, arm, k, threads, mpps, lat));
            }
        }
    }
    g.finish();
    if latency {
        write_csv("chains.csv", LATENCY_HEADER, key, &rows);
    }
}

fn firewall(c: &mut Criterion) {
    lookups(
        c,
        "chains-firewall",
        "firewall",
        Firewall::default,
        firewall_policy,
    );
}

fn flowfwd(c: &mut Criterion) {
    lookups(
        c,
        "chains-flowfwd",
        "flowfwd",
        FlowFwd::default,
        flowfwd_policy,
    );
}

// ---------------------------------------------------------------------------------------
// FastPaas Fig. 1: the same stages across threads
// ---------------------------------------------------------------------------------------

/// Batches a ring between two stage threads holds (8 × 32 = 256 packets in flight).
const RING: usize = 8;

/// One chunk of frames handed from thread to thread. The frames move with the box — a
/// pointer hand-over, the bytes are never copied — together with the header offsets of
/// the source's parse (each stage rebuilds its packet views with `Packet::from_layout`,
/// as a worker does with the Packet Dispatcher's layout), the verdicts so far, and the
/// time the chunk entered the first stage.
struct Batch {
    frames: Vec<Vec<u8>>,
    lens: [usize; GROUP_CHUNK],
    layouts: [Layout; GROUP_CHUNK],
    verdicts: [Verdict; GROUP_CHUNK],
    t0: Instant,
    /// Set at the last stage's output.
    latency_ns: u64,
}

/// One stage of a pipelined chain: a one-stage [`Chain`] (so each stage runs the same
/// code as a stage of the run-to-completion chain: one dynamic call per chunk, its
/// counters) and its state.
struct PipeStage {
    chain: Chain,
    state: ChainState,
}

impl PipeStage {
    fn new<N: RegisteredNf>(key: &str, nf: N, policy: &serde_json::Value) -> PipeStage {
        let chain = Chain::new().timed(false).with_nf(key, nf);
        let mut state = ChainState::default();
        chain
            .init(&chain_of(key, std::slice::from_ref(policy)), &mut state)
            .unwrap();
        PipeStage { chain, state }
    }

    /// Runs the stage over the batch's packets still in the chain (verdict a pass), as
    /// the chain does: a drop ends a packet's chain, a `Forward`/`Tx` is kept as its egress
    /// unless a later stage decides otherwise, a rewrite gets a fresh parse.
    #[inline]
    fn run(&mut self, b: &mut Batch, scratch: &mut Vec<Packet<'static>>) {
        let mut idx = [0u8; GROUP_CHUNK];
        let mut pkts = recycle(std::mem::take(scratch));
        for (i, f) in b.frames.iter_mut().enumerate() {
            if b.verdicts[i].is_pass() {
                idx[pkts.len()] = i as u8;
                pkts.push(
                    Packet::from_layout(f, b.lens[i], PacketMeta::default(), b.layouts[i]).unwrap(),
                );
            }
        }
        let k = pkts.len();
        if k > 0 {
            let mut sv = [Verdict::Fault; GROUP_CHUNK];
            self.chain
                .handle_group(&mut pkts, &mut self.state, &mut sv[..k]);
            for (j, p) in pkts.iter_mut().enumerate() {
                let i = idx[j] as usize;
                let mut v = sv[j];
                if v.is_pass() && p.headers_written() && p.reparse().is_err() {
                    v = Verdict::Drop(buffet::sdk::DropCause::Malformed);
                }
                b.lens[i] = p.len();
                b.layouts[i] = p.layout();
                if v != Verdict::Pass {
                    b.verdicts[i] = v;
                }
            }
        }
        *scratch = recycle(pkts);
    }
}

/// A ring of batches between two threads.
type Ring = Arc<ArrayQueue<Box<Batch>>>;

/// Hands `b` to `q`, spinning (then yielding) while the ring is full.
#[inline]
fn push_spin(q: &ArrayQueue<Box<Batch>>, mut b: Box<Batch>) {
    let backoff = Backoff::new();
    while let Err(again) = q.push(b) {
        b = again;
        backoff.snooze();
    }
}

/// A chain cut into segments, one thread each, connected by SPSC rings of boxed
/// [`Batch`]es: the calling thread is the source (it parses, stamps the time, runs the
/// first segment — possibly empty — and hands the batch over) and the sink (it takes the
/// batches back from the last thread); each further thread runs its segment and passes
/// the batch on. Idle threads poll with crossbeam's `Backoff` (spin, then yield the
/// core), so threads beyond the cores time-share them instead of starving each other.
struct Pipeline {
    head: Vec<PipeStage>,
    first: Ring,
    back: Ring,
    /// Boxed: a batch moves between threads by pointer (the rings hold boxes).
    #[allow(clippy::vec_box)]
    free: Vec<Box<Batch>>,
    #[allow(clippy::vec_box)]
    done: Vec<Box<Batch>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    scratch: Vec<Packet<'static>>,
}

impl Pipeline {
    /// `segments[i]` stages on thread `i` (thread 0 is the caller's); the last segment is
    /// not empty.
    fn new(frames: Vec<Vec<u8>>, stages: Vec<PipeStage>, segments: &[usize]) -> Pipeline {
        assert_eq!(segments.iter().sum::<usize>(), stages.len());
        assert!(segments.len() >= 2 && *segments.last().unwrap() > 0);
        let mut frames = frames.into_iter();
        let mut free = Vec::new();
        loop {
            let chunk: Vec<Vec<u8>> = frames.by_ref().take(GROUP_CHUNK).collect();
            if chunk.is_empty() {
                break;
            }
            free.push(Box::new(Batch {
                frames: chunk,
                lens: [0; GROUP_CHUNK],
                layouts: [Layout::default(); GROUP_CHUNK],
                verdicts: [Verdict::Pass; GROUP_CHUNK],
                t0: Instant::now(),
                latency_ns: 0,
            }));
        }
        let back: Ring = Arc::new(ArrayQueue::new(free.len()));
        let first: Ring = Arc::new(ArrayQueue::new(RING));
        let stop = Arc::new(AtomicBool::new(false));
        let mut stages = stages.into_iter();
        let head: Vec<PipeStage> = stages.by_ref().take(segments[0]).collect();
        let mut input = first.clone();
        let mut threads = Vec::new();
        for (j, &n) in segments.iter().enumerate().skip(1) {
            let last = j == segments.len() - 1;
            let output: Ring = if last {
                back.clone()
            } else {
                Arc::new(ArrayQueue::new(RING))
            };
            let mut own: Vec<PipeStage> = stages.by_ref().take(n).collect();
            let (inq, outq, stop) = (input.clone(), output.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let backoff = Backoff::new();
                let mut scratch = Vec::with_capacity(GROUP_CHUNK);
                loop {
                    if let Some(mut b) = inq.pop() {
                        for st in &mut own {
                            st.run(&mut b, &mut scratch);
                        }
                        if last {
                            b.latency_ns = b.t0.elapsed().as_nanos() as u64;
                        }
                        push_spin(&outq, b);
                        backoff.reset();
                    } else if stop.load(Ordering::Acquire) {
                        return;
                    } else {
                        backoff.snooze();
                    }
                }
            }));
            input = output;
        }
        Pipeline {
            head,
            first,
            back,
            done: Vec::with_capacity(free.len()),
            free,
            stop,
            threads,
            scratch: Vec::with_capacity(GROUP_CHUNK),
        }
    }

    /// Takes back what the last thread finished; how many batches.
    #[inline]
    fn collect(&mut self, lat: &mut Option<&mut Vec<u64>>) -> usize {
        let mut n = 0;
        while let Some(b) = self.back.pop() {
            if let Some(l) = lat.as_deref_mut() {
                l.extend(std::iter::repeat_n(b.latency_ns, b.frames.len()));
            }
            black_box(&b.verdicts);
            self.done.push(b);
            n += 1;
        }
        n
    }

    /// Every frame once through the chain; with `lat`, each packet's time from the first
    /// stage's input to the last stage's output is appended.
    fn run(&mut self, mut lat: Option<&mut Vec<u64>>) {
        let total = self.free.len();
        let mut got = 0;
        let backoff = Backoff::new();
        while got < total {
            if let Some(mut b) = self.free.pop() {
                b.verdicts = [Verdict::Pass; GROUP_CHUNK];
                for (i, f) in b.frames.iter_mut().enumerate() {
                    let p = Packet::parse(f, PacketMeta::default()).unwrap();
                    b.layouts[i] = p.layout();
                    b.lens[i] = p.len();
                }
                b.t0 = Instant::now();
                for st in &mut self.head {
                    st.run(&mut b, &mut self.scratch);
                }
                while let Err(again) = self.first.push(b) {
                    b = again;
                    got += self.collect(&mut lat);
                    backoff.snooze();
                }
                backoff.reset();
            }
            let n = self.collect(&mut lat);
            got += n;
            if n == 0 && self.free.is_empty() {
                backoff.snooze();
            }
        }
        std::mem::swap(&mut self.free, &mut self.done);
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Latency passes and the CSV files
// ---------------------------------------------------------------------------------------

const LATENCY_HEADER: &str = "nf,arm,stages,threads,mpps,p50_ns,p99_ns";

/// Whether criterion's smoke mode (`-- --test`) is on.
fn smoke() -> bool {
    std::env::args().any(|a| a == "--test")
}

/// Iterations of a latency pass (one in smoke mode).
fn latency_iters() -> usize {
    if smoke() {
        1
    } else {
        100
    }
}

/// Whether the command line's benchmark filter (criterion's positional argument, taken
/// here as a plain substring) selects anything of `group`: the untimed passes that write
/// the CSV files run only then.
fn selected(group: &str) -> bool {
    const WITH_VALUE: [&str; 14] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--save-baseline",
        "--baseline",
        "--load-baseline",
        "--output-format",
        "--color",
        "--plotting-backend",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--nresamples",
        "--profile-time",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut filter = None;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if WITH_VALUE.contains(&a.as_str()) {
            i += 2;
            continue;
        }
        if !a.starts_with('-') {
            filter = Some(a.clone());
        }
        i += 1;
    }
    filter.is_none_or(|f| group.contains(&f) || f.starts_with(group))
}

/// Runs `f` over the frames in groups, as [`groups`] does, `latency_iters()` times,
/// timing each group from its first stage's input to its last stage's output: the rate
/// (Mpps) and each packet's latency.
fn timed_groups(
    frames: &mut [Vec<u8>],
    mut f: impl FnMut(&mut [Packet<'_>], &mut [Verdict]),
) -> (f64, Vec<u64>) {
    let mut lat = Vec::with_capacity(frames.len() * latency_iters());
    let mut verdicts = [Verdict::Pass; GROUP_CHUNK];
    let mut scratch: Vec<Packet<'static>> = Vec::with_capacity(GROUP_CHUNK);
    let start = Instant::now();
    for _ in 0..latency_iters() {
        for chunk in frames.chunks_mut(GROUP_CHUNK) {
            let mut pkts = recycle(std::mem::take(&mut scratch));
            pkts.extend(
                chunk
                    .iter_mut()
                    .map(|b| Packet::parse(b, PacketMeta::default()).unwrap()),
            );
            let n = pkts.len();
            let t0 = Instant::now();
            f(&mut pkts, &mut verdicts[..n]);
            let ns = t0.elapsed().as_nanos() as u64;
            black_box(&verdicts);
            lat.extend(std::iter::repeat_n(ns, n));
            scratch = recycle(pkts);
        }
    }
    let mpps = lat.len() as f64 / start.elapsed().as_secs_f64() / 1e6;
    (mpps, lat)
}

/// One row of `chains.csv` (and a line on stdout).
fn latency_row(
    nf: &str,
    arm: &str,
    k: usize,
    threads: usize,
    mpps: f64,
    mut lat: Vec<u64>,
) -> String {
    lat.sort_unstable();
    let (p50, p99) = (percentile(&lat, 0.50), percentile(&lat, 0.99));
    println!(
        "chains latency: {nf} {arm}/{k} ({threads} thread(s)): {mpps:.2} Mpps, \
         p50 {p50:.0} ns, p99 {p99:.0} ns"
    );
    format!("{nf},{arm},{k},{threads},{mpps:.3},{p50:.0},{p99:.0}\n")
}

/// Where the CSV files go: `$CARGO_TARGET_DIR/results` (else `target/results`).
fn results_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("results")
}

/// Writes `rows` under `header` into `results/<name>`, keeping the rows of other keys
/// (first column) from an earlier run, so groups can be run one at a time (an empty
/// `key` replaces the whole file). Nothing in smoke mode.
fn write_csv(name: &str, header: &str, key: &str, rows: &str) {
    if smoke() {
        return;
    }
    let dir = results_dir();
    let path = dir.join(name);
    let mut out = format!("{header}\n");
    let old = if key.is_empty() {
        None
    } else {
        std::fs::read_to_string(&path).ok()
    };
    if let Some(old) = old {
        if old.lines().next() == Some(header) {
            for l in old.lines().skip(1) {
                if !l.starts_with(&format!("{key},")) {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
    }
    out.push_str(rows);
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, out))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    println!("chains: wrote {}", path.display());
}

// ---------------------------------------------------------------------------------------
// FastPaas Fig. 2: fragmentation of tenant groups
// ---------------------------------------------------------------------------------------

/// Tenants of the skewed trace.
const F2_TENANTS: u32 = 1000;
/// Packets a worker reads at once (FastPaas's NIC batch).
const F2_BURST: usize = 128;
/// Bursts of the trace.
const F2_BURSTS: usize = 256;
/// Packet time between consecutive packets (10 Mpps offered).
const F2_GAP_NS: u64 = 100;
/// Share of the trace, in percent, on the web path (TCP to port 80: the chain's guard).
const WEB_PCT: u64 = 30;
/// The latency bounds of the persistent Packet Buffers measured (`None`: groups cut per
/// burst).
const F2_BOUNDS: [Option<u64>; 3] = [None, Some(50_000), Some(500_000)];

/// How many groups of each size (0 ..= `GROUP_CHUNK` packets) a stage was handed.
struct Hist([AtomicU64; GROUP_CHUNK + 1]);

impl Hist {
    fn new() -> Arc<Hist> {
        Arc::new(Hist(std::array::from_fn(|_| AtomicU64::new(0))))
    }

    fn counts(&self) -> Vec<u64> {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// An NF that counts the size of every group it is handed, then runs `N` on it.
struct Sizes<N> {
    nf: N,
    hist: Arc<Hist>,
}

impl<N: NetworkFunction> NetworkFunction for Sizes<N> {
    type State = N::State;
    type Policy = N::Policy;

    fn name(&self) -> &'static str {
        self.nf.name()
    }

    fn register(&self) -> MemorySpec {
        self.nf.register()
    }

    fn init(&self, p: &N::Policy, s: &mut N::State) -> Result<(), buffet::sdk::InitError> {
        self.nf.init(p, s)
    }

    fn init_in_region(
        &self,
        p: &N::Policy,
        s: &mut N::State,
        region: &mut [u8],
    ) -> Result<(), buffet::sdk::InitError> {
        self.nf.init_in_region(p, s, region)
    }

    fn handle(&self, pkt: &mut Packet<'_>, s: &mut N::State) -> Verdict {
        self.hist.0[1].fetch_add(1, Ordering::Relaxed);
        self.nf.handle(pkt, s)
    }

    fn handle_group(&self, pkts: &mut [Packet<'_>], s: &mut N::State, v: &mut [Verdict]) {
        self.hist.0[pkts.len().min(GROUP_CHUNK)].fetch_add(1, Ordering::Relaxed);
        self.nf.handle_group(pkts, s, v);
    }
}

impl<N: NetworkFunction> RegisteredNf for Sizes<N> {}

/// One packet of the skewed trace: its tenant, whether it is on the web path, its frame.
struct TracePacket {
    tenant: u32,
    web: bool,
    frame: Vec<u8>,
}

/// `F2_BURSTS × F2_BURST` packets, tenants Zipf(1) over [`F2_TENANTS`], [`WEB_PCT`] % TCP
/// to port 80, the rest UDP to port 53.
fn skewed_trace() -> Vec<TracePacket> {
    let zipf = Zipf::new(F2_TENANTS, 1.0);
    let mut r = Rng::new(16);
    (0..F2_BURSTS * F2_BURST)
        .map(|_| {
            let t = zipf.sample(&mut r);
            let web = r.chance(WEB_PCT);
            let host = r.below(256) as u8;
            let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(
                [192, 168, 1, host],
                [10, (t >> 8) as u8, t as u8, 1],
                64,
            );
            let mut frame = Vec::new();
            if web {
                b.tcp(40000 + u16::from(host), 80, 1, 1024)
                    .write(&mut frame, &[0u8; 18])
                    .unwrap();
            } else {
                b.udp(40000 + u16::from(host), 53)
                    .write(&mut frame, &[0u8; 18])
                    .unwrap();
            }
            TracePacket {
                tenant: t,
                web,
                frame,
            }
        })
        .collect()
}

/// The Packet Dispatcher's slot for a packet: its tenant, or with pre-splitting its
/// (tenant, path) — the classifier returning tenant and path.
fn slot(p: &TracePacket, presplit: bool) -> u32 {
    if presplit {
        p.tenant * 2 + u32::from(p.web)
    } else {
        p.tenant
    }
}

/// The measured chain: firewall, a second firewall only for the web path
/// (`when = { protocol = "tcp", dst_port = 80 }`), a third firewall; each stage counts
/// the groups it is handed.
fn batching_chain() -> (Chain, ChainPolicy, [Arc<Hist>; 3]) {
    let limits = FirewallLimits {
        max_rules: 64,
        max_entries: 256,
        max_conns: 256,
    };
    let hists = [Hist::new(), Hist::new(), Hist::new()];
    let mut chain = Chain::new().timed(false);
    for (i, h) in hists.iter().enumerate() {
        chain = chain.with_nf(
            format!("fw{i}"),
            Sizes {
                nf: Firewall::with_limits(limits),
                hist: h.clone(),
            },
        );
    }
    let policy = serde_json::from_value(json!({ "stages": [
        { "nf": "fw0", "policy": firewall_policy(0) },
        { "nf": "fw1", "policy": firewall_policy(1),
          "when": { "protocol": "tcp", "dst_port": 80 } },
        { "nf": "fw2", "policy": firewall_policy(2) },
    ] }))
    .unwrap();
    (chain, policy, hists)
}

/// A worker running the measured chain for every slot of the trace, its bursts, and the
/// stage histograms.
struct Batching {
    worker: Worker<Chain>,
    bursts: Vec<Vec<PacketBuf>>,
    out: Vec<PacketBuf>,
    clock: Option<VirtualClock>,
    hists: [Arc<Hist>; 3],
}

impl Batching {
    fn new(trace: &[TracePacket], presplit: bool, bound: Option<u64>) -> Batching {
        let (chain, policy, hists) = batching_chain();
        let slots = if presplit { F2_TENANTS * 2 } else { F2_TENANTS };
        let storage = MemoryStorage::new(ArenaConfig::default()).expect("arena");
        let table = Arc::new(TenantTable::new(storage, slots));
        for s in 0..slots {
            let mut state = ChainState::default();
            chain.init(&policy, &mut state).expect("chain");
            table
                .admit(
                    TenantSlot(s),
                    TenantId(s + 1),
                    chain.register().bytes,
                    state,
                )
                .expect("admit");
        }
        let worker = Worker::new(Arc::new(chain), table);
        let (worker, clock) = match bound {
            None => (worker, None),
            Some(latency_ns) => {
                let clock = VirtualClock::new();
                let cfg = BufferConfig {
                    latency_ns,
                    ..BufferConfig::default()
                };
                (
                    worker.with_buffers(cfg, ClockSource::Virtual(clock.clone())),
                    Some(clock),
                )
            }
        };
        let bursts = trace
            .chunks(F2_BURST)
            .enumerate()
            .map(|(k, ps)| {
                ps.iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let mut m = PacketBuf::heap();
                        assert!(m.fill(&p.frame));
                        m.tenant = TenantSlot(slot(p, presplit));
                        m.ts_ns = (k * F2_BURST + i) as u64 * F2_GAP_NS;
                        m
                    })
                    .collect()
            })
            .collect();
        Batching {
            worker,
            bursts,
            out: Vec::with_capacity(trace.len()),
            clock,
            hists,
        }
    }

    /// The whole trace through the worker, burst by burst, packet time advancing by
    /// [`F2_GAP_NS`] per packet; then the flush a worker does when its input runs dry.
    fn pass(&mut self) {
        for b in &mut self.bursts {
            if let Some(c) = &self.clock {
                c.advance(b.len() as u64 * F2_GAP_NS);
            }
            self.worker.enqueue(b, &mut self.out);
        }
        self.worker.flush(&mut self.out);
    }

    /// Puts the packets back into their bursts, in trace order (untimed).
    fn restore(&mut self) {
        self.out.sort_unstable_by_key(|m| m.ts_ns);
        for (i, mut m) in self.out.drain(..).enumerate() {
            m.outcome = Outcome::Pending;
            self.bursts[i / F2_BURST].push(m);
        }
    }
}

/// Group-size statistics from a histogram: (groups, mean, packet-weighted mean, p50, p90,
/// p99 of the groups' sizes).
fn group_stats(counts: &[u64]) -> (u64, f64, f64, f64, f64, f64) {
    let groups: u64 = counts.iter().sum();
    let packets: u64 = counts.iter().enumerate().map(|(s, c)| s as u64 * c).sum();
    let squares: u64 = counts
        .iter()
        .enumerate()
        .map(|(s, c)| (s * s) as u64 * c)
        .sum();
    let quantile = |p: f64| {
        let want = ((groups as f64) * p).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (s, c) in counts.iter().enumerate() {
            acc += c;
            if acc >= want {
                return s as f64;
            }
        }
        f64::NAN
    };
    (
        groups,
        packets as f64 / groups.max(1) as f64,
        squares as f64 / packets.max(1) as f64,
        quantile(0.50),
        quantile(0.90),
        quantile(0.99),
    )
}

const BATCHING_HEADER: &str =
    "buffers,presplit,what,per_128_packets,mean,pkt_weighted_mean,p50,p90,p99";

fn batching(c: &mut Criterion) {
    let trace = skewed_trace();
    let web = trace.iter().filter(|p| p.web).count();
    let measure = selected("chains-batching");
    let mut rows = String::new();
    if measure {
        // FastPaas Fig. 2(a): distinct tenants (slots) per 128-packet burst.
        for presplit in [false, true] {
            let mut distinct: Vec<u64> = trace
                .chunks(F2_BURST)
                .map(|b| {
                    let mut s: Vec<u32> = b.iter().map(|p| slot(p, presplit)).collect();
                    s.sort_unstable();
                    s.dedup();
                    s.len() as u64
                })
                .collect();
            distinct.sort_unstable();
            let mean = distinct.iter().sum::<u64>() as f64 / distinct.len() as f64;
            let line = format!(
                "none,{},distinct-slots-per-burst,{mean:.1},{:.2},,{},{},{}\n",
                if presplit { "yes" } else { "no" },
                F2_BURST as f64 / mean,
                percentile(&distinct, 0.5),
                percentile(&distinct, 0.9),
                percentile(&distinct, 0.99)
            );
            print!("chains batching: {line}");
            rows.push_str(&line);
        }
        // FastPaas Fig. 2(b): packets per group each stage is handed.
        for bound in F2_BOUNDS {
            for presplit in [false, true] {
                let mut b = Batching::new(&trace, presplit, bound);
                b.pass();
                let buffers = bound.map_or("none".to_owned(), |ns| format!("{}us", ns / 1000));
                for (what, h, packets) in [
                    ("stage0-groups", &b.hists[0], trace.len()),
                    ("stage1-web-groups", &b.hists[1], web),
                ] {
                    let (groups, mean, weighted, p50, p90, p99) = group_stats(&h.counts());
                    let per128 = groups as f64 * F2_BURST as f64 / packets as f64;
                    let line = format!(
                        "{buffers},{},{what},{per128:.1},{mean:.2},{weighted:.2},{p50},{p90},{p99}\n",
                        if presplit { "yes" } else { "no" },
                    );
                    print!("chains batching: {line}");
                    rows.push_str(&line);
                }
            }
        }
        write_csv("chains_batching.csv", BATCHING_HEADER, "", &rows);
    }
    let mut g = c.benchmark_group("chains-batching");
    g.throughput(Throughput::Elements(trace.len() as u64));
    g.measurement_time(Duration::from_secs(3));
    for bound in [None, Some(50_000u64)] {
        for presplit in [false, true] {
            let mut b = Batching::new(&trace, presplit, bound);
            let arm = if presplit { "presplit" } else { "in-chain" };
            let value = bound.map_or("burst".to_owned(), |ns| format!("buffers-{}us", ns / 1000));
            g.bench_function(BenchmarkId::new(arm, value), |bench| {
                bench.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let t0 = Instant::now();
                        b.pass();
                        total += t0.elapsed();
                        b.restore();
                    }
                    total
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, noop, firewall, flowfwd, batching);
criterion_main!(benches);
