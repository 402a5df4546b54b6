//! Fairness by chain cost (docs/chains.md, "Fairness by chain cost"): a worker's weighted
//! deficit round robin charges each tenant group the work its *whole* chain took, so a
//! tenant whose chain has four costly stages gets the same share of an overloaded
//! worker's NF time as a tenant with one stage — not four times it — and with weights
//! 2:1 the shares follow the weights.
//!
//! Both tests run a 2-worker [`Pipeline`] of the real [`Chain`] with persistent Packet
//! Buffers (`flush_packets` 32), the path `buffet replay --flush-packets 32` runs. To
//! overload a worker deterministically, each worker first runs one packet of a *gate*
//! tenant whose stage waits until the test opens it; meanwhile the test queues every
//! other packet on that worker, so that when the gate opens the worker holds thousands
//! of packets of each tenant at once and the DRR alone decides the order in which they
//! run. Every measured chain ends with a stage that stamps the time at the end of each
//! group: the time between two stamps of one worker is the later group's cost, which is
//! what the worker's DRR charges. A tenant's share of NF time is the time its groups
//! took, up to the moment the first tenant's backlog ran out (after that, the others
//! are no longer competing), over the worker's time until then.
//!
//! * `charges_virtual_time_of_every_stage`: exact, on a [`VirtualClock`]: the costly
//!   stage is a test NF that advances the virtual clock by a fixed cost per packet, and
//!   the worker's DRR charges the virtual time a group took. Worker 0: tenant 3 runs four
//!   such stages, tenants 5 and 7 one, all weight 1 → each a third of the time (± 0.03).
//!   Worker 1: tenant 4 runs four stages with weight 2, tenants 6 and 8 one stage with
//!   weight 1 → a half, a quarter, a quarter. The workers run one after the other, since
//!   they share the virtual clock.
//! * `charges_cycles_of_every_stage`: the same shapes on the real clock (the DRR charges
//!   CPU cycles), the costly stage being the reference IDS with 400 signatures (half of
//!   them `nocase`, so both of its automata scan) over a 1,400-byte payload; both workers run at once; margins of ± 0.12 for a loaded 2-core
//!   machine.
//!
//! How it was checked that the tests would catch a DRR that charges packets instead of
//! work: with the charge in `Worker::round` (crates/buffet-worker/src/worker.rs) replaced
//! by `n * quantum / group` (each group charged a fixed amount per packet), both tests
//! fail at their first check: the four-stage tenant of worker 0 took 0.670 of the time on
//! the virtual clock and 0.698 on the real clock, instead of a third.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use buffet::config::chain::{Chain, ChainPolicy};
use buffet::config::registry::RegisteredNf;
use buffet::dispatch::{DispatcherConfig, Match, SchedulerConfig};
use buffet::nfs::Ids;
use buffet::sdk::{InitError, MemorySpec, NetworkFunction, Packet, TenantId, Verdict};
use buffet::worker::{ClockSource, Pipeline, PipelineConfig, TenantSpec, VirtualClock};
use etherparse::PacketBuilder;
use serde_json::json;

/// One stamp: the tenant, the packets of the group, the time at the group's end.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    tenant: u32,
    packets: u32,
    at: u64,
}

/// A stage that costs `ns` virtual nanoseconds per packet (it advances the run's virtual
/// clock) and, with `stamp`, records the end of each group it sees: virtual time on a
/// virtual clock, else nanoseconds of the wall clock since the NF was made.
struct Meter {
    clock: Option<VirtualClock>,
    origin: Instant,
    log: Arc<Mutex<Vec<Stamp>>>,
}

#[derive(Clone, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct MeterPolicy {
    ns: u64,
    stamp: bool,
}

#[derive(Default)]
struct MeterState {
    policy: MeterPolicy,
}

impl NetworkFunction for Meter {
    type State = MeterState;
    type Policy = MeterPolicy;

    fn name(&self) -> &'static str {
        "meter"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec { bytes: 64 }
    }

    fn init(&self, policy: &MeterPolicy, state: &mut MeterState) -> Result<(), InitError> {
        state.policy = policy.clone();
        Ok(())
    }

    fn handle(&self, _pkt: &mut Packet<'_>, state: &mut MeterState) -> Verdict {
        if let Some(c) = &self.clock {
            c.advance(state.policy.ns);
        }
        Verdict::Pass
    }

    fn handle_group(&self, pkts: &mut [Packet<'_>], state: &mut MeterState, v: &mut [Verdict]) {
        let n = pkts.len() as u64;
        v.fill(Verdict::Pass);
        let at = match &self.clock {
            Some(c) => {
                c.advance(state.policy.ns * n);
                c.now_ns()
            }
            None => self.origin.elapsed().as_nanos() as u64,
        };
        if state.policy.stamp {
            if let Some(p) = pkts.first() {
                self.log.lock().unwrap().push(Stamp {
                    tenant: p.tenant().0,
                    packets: n as u32,
                    at,
                });
            }
        }
    }
}

impl RegisteredNf for Meter {}

/// A stage that, on its first group, says it entered and waits until its gate opens.
struct Gate(Arc<Gates>);

#[derive(Default)]
struct Gates {
    entered: [AtomicBool; 2],
    open: [AtomicBool; 2],
}

#[derive(Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GatePolicy {
    gate: usize,
}

impl NetworkFunction for Gate {
    type State = GatePolicy;
    type Policy = GatePolicy;

    fn name(&self) -> &'static str {
        "gate"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec { bytes: 64 }
    }

    fn init(&self, policy: &GatePolicy, state: &mut GatePolicy) -> Result<(), InitError> {
        *state = policy.clone();
        Ok(())
    }

    fn handle(&self, _pkt: &mut Packet<'_>, state: &mut GatePolicy) -> Verdict {
        let g = state.gate;
        self.0.entered[g].store(true, Ordering::Release);
        while !self.0.open[g].load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(200));
        }
        Verdict::Pass
    }
}

impl RegisteredNf for Gate {}

fn frame(t: u32, seq: u32, payload: usize) -> Vec<u8> {
    let mut body = vec![b'x'; payload.max(4)];
    body[..4].copy_from_slice(&seq.to_le_bytes());
    // Varied text, so that an IDS scan walks its automaton for real.
    for (i, b) in body.iter_mut().enumerate().skip(4) {
        *b = b"abcdefghijklmnopqrstuvwxyz0123456789 /.-"[(i * 7 + seq as usize) % 40];
    }
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 0, 1], [10, 0, t as u8, 1], 64)
        .udp(1000 + t as u16, 5000)
        .write(&mut v, &body)
        .unwrap();
    v
}

fn spec(t: u32, stages: serde_json::Value) -> TenantSpec<ChainPolicy> {
    TenantSpec {
        id: TenantId(t),
        name: format!("t{t}"),
        rules: vec![(
            100,
            Match {
                dst_ip: Some(format!("10.0.{t}.0/24").parse().unwrap()),
                ..Match::default()
            },
        )],
        max_nb: 0,
        policy: serde_json::from_value(json!({ "stages": stages })).unwrap(),
    }
}

/// Packets per measured tenant: all of them are queued on their worker at once.
const PACKETS: u32 = 2048;

fn config(clock: ClockSource) -> PipelineConfig {
    PipelineConfig {
        workers: 2,
        pin: false,
        // Room for every queued packet: the worker takes them in one burst.
        ring_size: 8192,
        burst: 8192,
        flush_packets: 32,
        flush_ns: 50_000,
        drr_quantum: 16_384,
        clock,
        dispatcher: DispatcherConfig {
            // Timeslots of about 18 minutes: no migration, and a gate that waits is not
            // taken for a stuck worker.
            sched: SchedulerConfig {
                shift: 40,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    }
}

/// The measured tenants: worker 0 runs 3 (the long chain), 5 and 7; worker 1 runs 4
/// (the long chain, weight 2), 6 and 8. Tenants 1 and 2 hold the gates of workers 0 and 1
/// (tenants are placed on the worker with the fewest, ties by lowest id).
const WORKER0: [u32; 3] = [3, 5, 7];
const WORKER1: [u32; 3] = [4, 6, 8];

/// Builds the run, queues every packet behind the closed gates, and returns the
/// pipeline (gates still closed).
fn queued(
    chain: Chain,
    clock: ClockSource,
    gates: &Arc<Gates>,
    long: &serde_json::Value,
    short: &serde_json::Value,
    payload: usize,
) -> Pipeline<Chain> {
    let mut p = Pipeline::new(chain, config(clock)).unwrap();
    for g in 0..2u32 {
        p.admit(spec(
            g + 1,
            json!([{ "nf": "gate", "policy": { "gate": g } }]),
        ))
        .unwrap();
    }
    for t in 3..=8u32 {
        let stages = if t == 3 || t == 4 { long } else { short };
        p.admit(spec(t, stages.clone())).unwrap();
    }
    p.set_weight(TenantId(4), 2).unwrap();
    for (w, t) in [0u32, 1].into_iter().zip([1u32, 2]) {
        assert_eq!(
            p.report().tenants[w as usize].worker,
            w as u16,
            "gate of worker {w}"
        );
        p.push(0, 0, &frame(t, 0, 64));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !gates.entered.iter().all(|e| e.load(Ordering::Acquire)) {
        assert!(Instant::now() < deadline, "the gates were never reached");
        p.poll_completions();
        std::thread::sleep(Duration::from_millis(1));
    }
    let frames: BTreeMap<u32, Vec<u8>> = (3..=8).map(|t| (t, frame(t, 0, payload))).collect();
    for seq in 0..PACKETS {
        for t in 3..=8u32 {
            p.push(u64::from(seq), 0, &frames[&t]);
        }
    }
    p
}

/// Tenants with odd ids ran on worker 0, the others on worker 1 (a report taken while a
/// gate holds its worker would wait for the gate tenant's state).
fn check_placement(r: &buffet::worker::Report) {
    for t in &r.tenants {
        let want = if t.id.0 % 2 == 1 { 0 } else { 1 };
        assert_eq!(t.worker, want, "tenant {} is on worker {}", t.id, t.worker);
    }
}

/// Waits until the stamps show every packet of `tenants` run.
fn wait_done(log: &Mutex<Vec<Stamp>>, tenants: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done: u64 = log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| tenants.contains(&s.tenant))
            .map(|s| u64::from(s.packets))
            .sum();
        if done == u64::from(PACKETS) * tenants.len() as u64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tenants {tenants:?}: {done} packets run"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Each tenant's share of the worker's NF time while all of `tenants` were backlogged:
/// the stamps of these tenants (one worker's, in the order they ran) from `start`, up to
/// the stamp at which the first tenant's last packet ran.
fn shares(log: &[Stamp], tenants: &[u32], start: u64) -> BTreeMap<u32, f64> {
    let mut left: BTreeMap<u32, u64> = tenants.iter().map(|&t| (t, u64::from(PACKETS))).collect();
    let mut time: BTreeMap<u32, u64> = tenants.iter().map(|&t| (t, 0)).collect();
    let mut last = start;
    for s in log.iter().filter(|s| tenants.contains(&s.tenant)) {
        *time.get_mut(&s.tenant).unwrap() += s.at.saturating_sub(last);
        last = s.at;
        let l = left.get_mut(&s.tenant).unwrap();
        *l -= u64::from(s.packets);
        if *l == 0 {
            break;
        }
    }
    let total = (last - start) as f64;
    time.into_iter()
        .map(|(t, ns)| (t, ns as f64 / total))
        .collect()
}

fn check(what: &str, got: &BTreeMap<u32, f64>, want: &[(u32, f64)], margin: f64) {
    eprintln!("{what}: shares {got:.3?}");
    for &(t, w) in want {
        let g = got[&t];
        assert!(
            (g - w).abs() <= margin,
            "{what}: tenant {t} got {g:.3} of the worker's NF time, its weight's share is \
             {w:.3} (± {margin}); all: {got:.3?}"
        );
    }
}

#[test]
fn charges_virtual_time_of_every_stage() {
    let clock = VirtualClock::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let gates = Arc::new(Gates::default());
    let meter = || Meter {
        clock: Some(clock.clone()),
        origin: Instant::now(),
        log: log.clone(),
    };
    let chain = Chain::new()
        .with_nf("gate", Gate(gates.clone()))
        .with_nf("cost", meter());
    // 250 virtual ns per packet per stage: a long chain's group costs 32,000 ns, a short
    // one's 8,000 (the DRR quantum is 16,384 per unit of weight).
    let stage = |stamp: bool| json!({ "nf": "cost", "policy": { "ns": 250, "stamp": stamp } });
    let long = json!([stage(false), stage(false), stage(false), stage(true)]);
    let short = json!([stage(true)]);
    let p = queued(
        chain,
        ClockSource::Virtual(clock.clone()),
        &gates,
        &long,
        &short,
        64,
    );
    // One worker at a time: they share the virtual clock.
    let start0 = clock.now_ns();
    gates.open[0].store(true, Ordering::Release);
    wait_done(&log, &WORKER0);
    let start1 = clock.now_ns();
    gates.open[1].store(true, Ordering::Release);
    wait_done(&log, &WORKER1);
    let report = p.finish();
    check_placement(&report);
    let stamps = log.lock().unwrap().clone();

    let s0 = shares(&stamps, &WORKER0, start0);
    check(
        "equal weights",
        &s0,
        &[(3, 1.0 / 3.0), (5, 1.0 / 3.0), (7, 1.0 / 3.0)],
        0.03,
    );
    let s1 = shares(&stamps, &WORKER1, start1);
    check(
        "weights 2:1:1",
        &s1,
        &[(4, 0.5), (6, 0.25), (8, 0.25)],
        0.03,
    );

    // Not vacuous: the long chains really cost four times as much per packet, every
    // packet ran every stage, and all packets were served in the end.
    let by_id: BTreeMap<u32, _> = report.tenants.iter().map(|t| (t.id.0, t)).collect();
    for t in 3..=8u32 {
        let r = by_id[&t];
        assert_eq!(r.passed, u64::from(PACKETS), "tenant {t}");
        let stages = if t == 3 || t == 4 { 4 } else { 1 };
        for k in 0..stages {
            assert_eq!(
                r.nf[format!("chain.{k}.meter.packets").as_str()],
                u64::from(PACKETS),
                "tenant {t} stage {k}"
            );
        }
    }
}

#[test]
fn charges_cycles_of_every_stage() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let gates = Arc::new(Gates::default());
    let chain = Chain::new()
        .with_nf("gate", Gate(gates.clone()))
        .with_nf("ids", Ids::default())
        .with_nf(
            "stamp",
            Meter {
                clock: None,
                origin: Instant::now(),
                log: log.clone(),
            },
        );
    let rules: String = (0..400)
        .map(|i| {
            let nocase = if i % 2 == 0 { " nocase;" } else { "" };
            format!(
                "alert udp any any (msg:\"s{i}\"; content:\"sig{i:05}-zz\";{nocase} sid:{};)\n",
                i + 1
            )
        })
        .collect();
    let ids = json!({ "nf": "ids", "policy": { "rules": rules } });
    let stamp = json!({ "nf": "stamp", "policy": { "stamp": true } });
    let long = json!([ids, ids, ids, ids, stamp]);
    let short = json!([ids, stamp]);
    let p = queued(chain, ClockSource::System, &gates, &long, &short, 1400);
    // Both workers at once: each charges its own cycles.
    gates.open[0].store(true, Ordering::Release);
    gates.open[1].store(true, Ordering::Release);
    wait_done(&log, &[3, 4, 5, 6, 7, 8]);
    let report = p.finish();
    check_placement(&report);
    let stamps = log.lock().unwrap().clone();
    // A worker's time starts at its first stamp (the gate's wait is not NF time): the
    // first group is left out of the shares.
    let first = |tenants: &[u32]| {
        stamps
            .iter()
            .find(|s| tenants.contains(&s.tenant))
            .map(|s| s.at)
            .unwrap()
    };
    let s0 = shares(&stamps, &WORKER0, first(&WORKER0));
    check(
        "equal weights, real clock",
        &s0,
        &[(3, 1.0 / 3.0), (5, 1.0 / 3.0), (7, 1.0 / 3.0)],
        0.12,
    );
    let s1 = shares(&stamps, &WORKER1, first(&WORKER1));
    check(
        "weights 2:1:1, real clock",
        &s1,
        &[(4, 0.5), (6, 0.25), (8, 0.25)],
        0.12,
    );
    let by_id: BTreeMap<u32, _> = report.tenants.iter().map(|t| (t.id.0, t)).collect();
    for t in 3..=8u32 {
        let r = by_id[&t];
        assert_eq!(r.passed, u64::from(PACKETS), "tenant {t}");
        let stages = if t == 3 || t == 4 { 4 } else { 1 };
        assert_eq!(
            r.nf[format!("chain.{}.ids.packets", stages - 1).as_str()],
            u64::from(PACKETS),
            "tenant {t}"
        );
    }
    // The long chain really costs more per packet (its IDS stages' time).
    let ns = |t: u32| -> u64 {
        let r = by_id[&t];
        let stages = if t == 3 || t == 4 { 4 } else { 1 };
        (0..stages)
            .map(|k| r.nf[format!("chain.{k}.ids.ns").as_str()])
            .sum()
    };
    assert!(ns(3) > 2 * ns(5), "long {} short {}", ns(3), ns(5));
}
