//! `chains`: what a per-tenant service chain (docs/chains.md) costs on one core.
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
//!   policies (k = 1 … 4); goal: `chain-4` at least 0.95 of `fused-4`'s throughput;
//! * `chains-flowfwd/…` — the same with flowfwd (exact-match 5-tuple table) stages.
//!
//! Stage timing (`Chain::timed`) is off in the `chain-k` arms and on in `chain-k-timed`
//! of the no-op group, so its cost is on record too.
//!
//! Run: `cargo bench --bench chains` (one group: `cargo bench --bench chains -- chains-noop`).

use std::hint::black_box;
use std::time::Duration;

use buffet::config::chain::{Chain, ChainPolicy, ChainState};
use buffet::config::registry::RegisteredNf;
use buffet::nfs::firewall::Firewall;
use buffet::nfs::flowfwd::FlowFwd;
use buffet::sdk::{MemorySpec, NetworkFunction, Packet, PacketMeta, Verdict, GROUP_CHUNK};
use buffet_testkit::Rng;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use etherparse::PacketBuilder;
use serde_json::json;

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

/// k firewall (or flowfwd) lookups in one NF: the hand-fused baseline.
struct Fused<N: NetworkFunction>(N, usize);

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
    for chunk in frames.chunks_mut(GROUP_CHUNK) {
        let mut pkts: Vec<Packet<'_>> = chunk
            .iter_mut()
            .map(|b| Packet::parse(b, PacketMeta::default()).unwrap())
            .collect();
        let n = pkts.len();
        f(&mut pkts, &mut verdicts[..n]);
        black_box(&verdicts);
    }
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
    for k in 1..=4usize {
        let policies: Vec<serde_json::Value> = (0..k).map(policy).collect();
        let typed: Vec<N::Policy> = policies
            .iter()
            .map(|p| serde_json::from_value(p.clone()).unwrap())
            .collect();
        let fused = Fused(nf(), k);
        let mut fs = FusedState::default();
        fused.init(&typed, &mut fs).unwrap();
        g.bench_function(BenchmarkId::new("fused", k), |b| {
            b.iter(|| groups(&mut buf, |p, v| fused.handle_group(p, &mut fs, v)))
        });
        let chain = Chain::new().timed(false).with_nf(key, nf());
        let mut s = ChainState::default();
        chain.init(&chain_of(key, &policies), &mut s).unwrap();
        g.bench_function(BenchmarkId::new("chain", k), |b| {
            b.iter(|| groups(&mut buf, |p, v| chain.handle_group(p, &mut s, v)))
        });
    }
    g.finish();
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

criterion_group!(benches, noop, firewall, flowfwd);
criterion_main!(benches);
