//! The control handle and the data plane on different threads: tenants are admitted,
//! updated and removed from one thread while another runs traffic through ports, and no other tenant
//! loses or reorders a packet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use buffet_dispatch::{DispatcherConfig, Match};
use buffet_io::{HeapPool, PacketBuf, Port, PortError, PortStats, Rx};
use buffet_nfs::monitor::{Monitor, MonitorPolicy};
use buffet_sdk::{InitError, MemorySpec, NetworkFunction, Packet, TenantId, Verdict};
use buffet_worker::{build, Control, Dataplane, PipelineConfig, PipelineError};

mod common;
use common::{answered, seq_frame, seq_of, spec};

/// Victim tenants whose packets are checked one by one.
const VICTIMS: u32 = 4;
/// Packets per victim.
const PER_VICTIM: u32 = 30_000;
/// The tenant admitted and removed over and over.
const CHURN: u32 = 50;

/// A port over frames in memory that records what is sent on it: (tenant octet, seq).
/// `live`: it stands for an interface (the dispatcher drops at a full worker ring rather
/// than wait).
struct MemPort {
    frames: std::vec::IntoIter<Vec<u8>>,
    sent: Arc<Mutex<Vec<(u8, u32)>>>,
    stats: PortStats,
    live: bool,
}

impl Port for MemPort {
    fn name(&self) -> String {
        "mem".into()
    }
    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let mut n = 0;
        while n < max {
            let Some(mut b) = pool.take() else { break };
            let Some(f) = self.frames.next() else {
                pool.give(b);
                return Ok(if n == 0 { Rx::End } else { Rx::Packets(n) });
            };
            assert!(b.fill(&f));
            b.ts_ns = u64::from(self.stats.rx as u32);
            b.in_port = 0;
            out.push(b);
            self.stats.rx += 1;
            n += 1;
        }
        Ok(if n == 0 { Rx::Idle } else { Rx::Packets(n) })
    }
    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        let mut sent = self.sent.lock().unwrap();
        for b in pkts.drain(..) {
            let d = b.data();
            sent.push((d[14 + 18], seq_of(d)));
            self.stats.tx += 1;
            pool.give(b);
        }
        Ok(())
    }
    fn is_live(&self) -> bool {
        self.live
    }
    fn stats(&self) -> PortStats {
        self.stats
    }
}

#[test]
fn handles_are_send_and_sync() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Dataplane<Monitor>>();
    send_sync::<Control<Monitor>>();
}

#[test]
fn admissions_from_another_thread_cost_other_tenants_nothing() {
    let cfg = PipelineConfig {
        workers: 2,
        pin: false,
        ring_size: 256,
        burst: 64,
        dispatcher: DispatcherConfig::default(),
        ..PipelineConfig::default()
    };
    let (control, mut dataplane) = build(Monitor::default(), cfg).unwrap();
    // Victims and churn frames interleaved; the churn tenant's frames are unmatched
    // whenever it is out.
    let mut frames = Vec::new();
    for seq in 0..PER_VICTIM {
        for t in 1..=VICTIMS {
            frames.push(seq_frame(t, seq));
        }
        frames.push(seq_frame(CHURN, seq));
    }
    let sent = Arc::new(Mutex::new(Vec::new()));
    dataplane.add_port(Box::new(MemPort {
        frames: frames.into_iter(),
        sent: sent.clone(),
        stats: PortStats::default(),
        live: false,
    }));
    for t in 1..=VICTIMS {
        // Before the data plane runs, answers come when it starts applying commands.
        let c = control.clone();
        answered(&mut dataplane, move || c.admit(spec(t)).unwrap());
    }
    let done = Arc::new(AtomicBool::new(false));
    let churner = {
        let control = control.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut cycles = 0u32;
            // Until the data plane stops (then every call answers `Stopped`).
            while !done.load(Ordering::Acquire) {
                match control.admit(spec(CHURN)) {
                    Ok(_) => {}
                    Err(PipelineError::Stopped) => break,
                    Err(e) => panic!("admit: {e}"),
                }
                // Duplicate admission is refused and changes nothing.
                match control.admit(spec(CHURN)) {
                    Err(PipelineError::Duplicate(_)) => {}
                    Err(PipelineError::Stopped) => break,
                    other => panic!("duplicate admit: {other:?}"),
                }
                // A victim's policy is replaced under traffic (it must lose nothing),
                // and a policy its NF rejects changes nothing.
                let update = |cap| MonitorPolicy {
                    flow_capacity: Some(cap),
                };
                match control.update_policy(TenantId(1), &update(1024)) {
                    Ok(()) => {}
                    Err(PipelineError::Stopped) => break,
                    Err(e) => panic!("update: {e}"),
                }
                match control.update_policy(TenantId(2), &update(0)) {
                    Err(PipelineError::Policy { .. }) => {}
                    Err(PipelineError::Stopped) => break,
                    other => panic!("rejected update: {other:?}"),
                }
                match control.remove(TenantId(CHURN)) {
                    Ok(()) => {}
                    Err(PipelineError::Stopped) => break,
                    Err(e) => panic!("remove: {e}"),
                }
                cycles += 1;
            }
            cycles
        })
    };
    let runner = std::thread::spawn(move || {
        let n = dataplane.run(|_| {}).unwrap();
        let report = dataplane.finish();
        (n, report)
    });
    let (n, report) = runner.join().unwrap();
    done.store(true, Ordering::Release);
    let cycles = churner.join().unwrap();
    assert_eq!(n, u64::from(PER_VICTIM * (VICTIMS + 1)));
    assert!(
        cycles > 0,
        "the churn thread admitted and removed at least once"
    );

    let sent = sent.lock().unwrap();
    for t in 1..=VICTIMS {
        let seqs: Vec<u32> = sent
            .iter()
            .filter(|(o, _)| u32::from(*o) == t)
            .map(|&(_, s)| s)
            .collect();
        assert_eq!(
            seqs,
            (0..PER_VICTIM).collect::<Vec<_>>(),
            "tenant {t}: every packet, in order"
        );
        let r = report.tenants.iter().find(|r| r.id == TenantId(t)).unwrap();
        assert_eq!(
            (r.packets, r.passed, r.dropped()),
            (u64::from(PER_VICTIM), u64::from(PER_VICTIM), 0)
        );
    }
    // Every churn packet is accounted for exactly once: processed while its tenant was
    // in, unmatched while it was out, or dropped because it was still queued when its
    // tenant was removed.
    let churn_out = sent.iter().filter(|(o, _)| u32::from(*o) == CHURN).count() as u64;
    assert_eq!(
        churn_out + report.global.unmatched + report.global.removed_tenant,
        u64::from(PER_VICTIM),
        "{cycles} churn cycles"
    );
    assert!(report.global.unmatched > 0 || churn_out == u64::from(PER_VICTIM));
    // After the run, control calls fail cleanly instead of hanging.
    assert!(control.admit(spec(99)).is_err());
}

#[test]
fn reconfigure_swaps_rules_max_nb_and_name_between_bursts() {
    let cfg = PipelineConfig {
        workers: 1,
        pin: false,
        dispatcher: DispatcherConfig::default(),
        ..PipelineConfig::default()
    };
    let (control, mut dataplane) = build(Monitor::default(), cfg).unwrap();
    let c = control.clone();
    answered(&mut dataplane, move || c.admit(spec(1)).unwrap());
    // Timeslot 0 before the swap, timeslot 2 after (the default shift is 30).
    let send = |dp: &mut Dataplane<Monitor>, ts0: u64, octet: u32, n: u32| {
        for seq in 0..n {
            dp.push(ts0 + u64::from(seq), 0, &seq_frame(octet, seq));
        }
        dp.flush();
    };
    // Before: 10.0.1.0/24 is tenant 1's, 10.0.7.0/24 nobody's.
    send(&mut dataplane, 0, 1, 100);
    send(&mut dataplane, 0, 7, 100);
    let r = dataplane.report();
    assert_eq!(r.tenants[0].packets, 100);
    assert_eq!(r.global.unmatched, 100);

    // An invalid rule: refused, nothing changed.
    let c = control.clone();
    let bad = Match {
        dscp: Some(99),
        ..Match::default()
    };
    let e = answered(&mut dataplane, move || {
        c.reconfigure(TenantId(1), "x".into(), vec![(100, bad)], 0)
    });
    assert!(matches!(e, Err(PipelineError::Dispatch { .. })), "{e:?}");
    assert!(matches!(
        control.reconfigure(TenantId(9), "x".into(), vec![], 0),
        Err(PipelineError::Unknown(_))
    ));
    send(&mut dataplane, 0, 1, 10);
    assert_eq!(dataplane.report().tenants[0].packets, 110);

    // The swap: the new prefix reaches the tenant, the old one no longer does, its
    // counters carry on, its name and MAX_NB are the new ones.
    let c = control.clone();
    let mut moved = spec(7);
    moved.max_nb = 50;
    answered(&mut dataplane, move || {
        c.reconfigure(TenantId(1), "moved".into(), moved.rules, moved.max_nb)
            .unwrap();
    });
    send(&mut dataplane, 2 << 30, 7, 100);
    send(&mut dataplane, 2 << 30, 1, 100);
    let r = dataplane.report();
    let t = &r.tenants[0];
    assert_eq!((t.id, t.name.as_str()), (TenantId(1), "moved"));
    // 100 of the new prefix: MAX_NB 50 of them in this timeslot reach the NF, the rest
    // is policed; the old prefix's 100 are unmatched.
    assert_eq!(t.packets, 110 + 50, "{t:?}");
    assert_eq!(t.drops.get("policed"), Some(&50), "{t:?}");
    assert_eq!(r.global.unmatched, 100 + 100);
}

/// A Monitor that takes its time (about a microsecond per packet), so that a live
/// dispatcher outruns its worker, and drops every fifth packet of a tenant (by its
/// sequence number) for its policy.
struct SlowMonitor(Monitor);

impl NetworkFunction for SlowMonitor {
    type State = <Monitor as NetworkFunction>::State;
    type Policy = MonitorPolicy;

    fn name(&self) -> &'static str {
        "slow-monitor"
    }

    fn register(&self) -> MemorySpec {
        self.0.register()
    }

    fn init(&self, p: &MonitorPolicy, s: &mut Self::State) -> Result<(), InitError> {
        self.0.init(p, s)
    }

    fn handle(&self, pkt: &mut Packet<'_>, s: &mut Self::State) -> Verdict {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_micros(1) {
            std::hint::spin_loop();
        }
        let seq = seq_of(pkt.data());
        let v = self.0.handle(pkt, s);
        if seq % 5 == 0 {
            Verdict::Drop(buffet_sdk::DropCause::Policy)
        } else {
            v
        }
    }
}

#[test]
fn a_live_runs_ring_full_drops_are_counted_under_their_tenants() {
    let cfg = PipelineConfig {
        workers: 1,
        pin: false,
        ring_size: 16,
        burst: 16,
        ..PipelineConfig::default()
    };
    let (control, mut dataplane) = build(SlowMonitor(Monitor::default()), cfg).unwrap();
    const PER_TENANT: u32 = 5_000;
    let mut frames = Vec::new();
    for seq in 0..PER_TENANT {
        for t in 1..=3 {
            frames.push(seq_frame(t, seq));
        }
    }
    dataplane.add_port(Box::new(MemPort {
        frames: frames.into_iter(),
        sent: Arc::default(),
        stats: PortStats::default(),
        live: true,
    }));
    for t in 1..=3 {
        let c = control.clone();
        answered(&mut dataplane, move || c.admit(spec(t)).unwrap());
    }
    dataplane.run(|_| {}).unwrap();
    let report = dataplane.finish();
    let ring_full: Vec<u64> = report
        .tenants
        .iter()
        .map(|t| t.drops.get("ring_full").copied().unwrap_or(0))
        .collect();
    assert!(
        report.global.ring_full > 0,
        "the dispatcher never found the ring full: the test shows nothing"
    );
    assert_eq!(ring_full.iter().sum::<u64>(), report.global.ring_full);
    for t in &report.tenants {
        // Every frame of the tenant is passed or a counted drop (the NF's drops among
        // them) ...
        assert_eq!(
            t.passed + t.dropped(),
            u64::from(PER_TENANT),
            "tenant {}: {:?}",
            t.id.0,
            t.drops
        );
        // ... and every frame the NF did not see is a ring_full drop.
        let ring_full = t.drops.get("ring_full").copied().unwrap_or(0);
        assert_eq!(
            t.packets + ring_full,
            u64::from(PER_TENANT),
            "tenant {}",
            t.id.0
        );
    }
    let nf_drops: u64 = report
        .tenants
        .iter()
        .map(|t| t.drops.get("policy").copied().unwrap_or(0))
        .sum();
    assert!(nf_drops > 0, "the NF dropped nothing: the test shows less");
}
