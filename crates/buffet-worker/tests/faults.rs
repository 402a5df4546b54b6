//! Fault injection: a worker thread that dies outside a handler, a worker stuck in a
//! handler that never returns, a tenant that faults again and again, an exhausted arena.
//! Every test accounts for every packet: per tenant, sent = received + counted drops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use buffet_dispatch::WorkerId;
use buffet_memory::ArenaConfig;
use buffet_sdk::{InitError, MemorySpec, NetworkFunction, Packet, TenantId, Verdict};
use buffet_worker::{Pipeline, PipelineConfig, PipelineError, Report, WorkerEvent, MIN_STALL};

mod common;
use common::{cfg, frame, spec_with, tagged_buf, test_sources};

fn worker_of(r: &Report, t: u32) -> u16 {
    r.tenants
        .iter()
        .find(|x| x.id == TenantId(t))
        .unwrap()
        .worker
}

/// Per tenant: every packet sent was received by its NF's Packet Buffer or counted as a
/// drop outside it (`worker_died`); what was received passed or was dropped for a
/// counted reason.
fn assert_accounted(r: &Report, sent: &dyn Fn(TenantId) -> u64) {
    for t in &r.tenants {
        let died = t.drops.get("worker_died").copied().unwrap_or(0);
        assert_eq!(t.packets + died, sent(t.id), "tenant {}: {t:?}", t.id);
        assert_eq!(
            t.passed + t.dropped() - died,
            t.packets,
            "tenant {}: {t:?}",
            t.id
        );
    }
}

/// Passes everything; a tenant admitted with policy `true` panics when its state is torn
/// down — on the worker thread that drops it last, outside any handler.
struct Teardown;

#[derive(Default)]
struct TeardownState {
    boom: bool,
}

impl Drop for TeardownState {
    fn drop(&mut self) {
        if self.boom {
            panic!("tenant state teardown failed");
        }
    }
}

impl NetworkFunction for Teardown {
    type State = TeardownState;
    type Policy = bool;
    fn name(&self) -> &'static str {
        "teardown"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<TeardownState>()
    }
    fn init(&self, boom: &bool, state: &mut TeardownState) -> Result<(), InitError> {
        state.boom = *boom;
        Ok(())
    }
    fn handle(&self, _pkt: &mut Packet<'_>, _state: &mut TeardownState) -> Verdict {
        Verdict::Pass
    }
}

#[test]
fn a_worker_that_dies_outside_a_handler_loses_its_tenants_to_live_workers_and_no_packet_goes_unaccounted(
) {
    let mut p = Pipeline::new(Teardown, cfg(3, 30)).unwrap();
    p.admit(spec_with(1, true)).unwrap();
    for t in 2..=9 {
        p.admit(spec_with(t, false)).unwrap();
    }
    let r = p.report();
    let dead = worker_of(&r, 1);
    let victims: Vec<u32> = (2..=9).filter(|&t| worker_of(&r, t) == dead).collect();
    assert!(!victims.is_empty());
    let mut sent = [0u64; 10];
    // Tenant 1's state is cached by its worker, which therefore drops it last.
    for r in 0..50u64 {
        for t in 1..=9u32 {
            p.push(r, 0, &frame(t, b"x"));
            sent[t as usize] += 1;
        }
    }
    p.flush();
    p.remove(TenantId(1)).unwrap();
    // All timestamps lie in timeslot 0 (2^30 ns): the death is detected and the victims
    // moved within it.
    let t0 = Instant::now();
    for r in 50..2050u64 {
        for t in 2..=9u32 {
            p.push(r, 0, &frame(t, b"x"));
            sent[t as usize] += 1;
        }
    }
    p.flush();
    let report = p.report();
    let took = t0.elapsed();
    let died: Vec<&WorkerEvent> = report
        .events
        .iter()
        .filter(|e| matches!(e, WorkerEvent::WorkerDied { .. }))
        .collect();
    assert_eq!(died.len(), 1, "{:?}", report.events);
    let WorkerEvent::WorkerDied {
        worker,
        message,
        reassigned,
        dropped,
        requeued,
    } = died[0]
    else {
        unreachable!()
    };
    assert_eq!(*worker, dead);
    assert!(
        message.contains("tenant state teardown failed"),
        "{message}"
    );
    assert_eq!(*reassigned, victims.len());
    assert!(!report.workers[dead as usize].live);
    for &v in &victims {
        assert_ne!(
            worker_of(&report, v),
            dead,
            "tenant {v} still on the dead worker"
        );
    }
    assert_accounted(&report, &|id| sent[id.0 as usize]);
    let lost: u64 = report
        .tenants
        .iter()
        .map(|t| t.drops.get("worker_died").copied().unwrap_or(0))
        .sum();
    assert_eq!(lost, *dropped);
    // Only the victims of the dead worker can have lost a packet, and only its last burst.
    for t in &report.tenants {
        if !victims.contains(&t.id.0) {
            assert_eq!(t.passed, sent[t.id.0 as usize], "tenant {}", t.id);
        }
    }
    assert!(*dropped <= 32, "{dropped}");
    println!(
        "worker {dead} died: {reassigned} tenants moved, {requeued} queued frames moved, \
         {dropped} frames of its burst dropped (counted), in {took:?} of wall time"
    );
    p.finish();
}

/// Panics on a packet whose payload is `boom`.
struct Fragile;

impl NetworkFunction for Fragile {
    type State = u64;
    type Policy = ();
    fn name(&self) -> &'static str {
        "fragile"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<u64>()
    }
    fn init(&self, _: &(), _: &mut u64) -> Result<(), InitError> {
        Ok(())
    }
    fn handle(&self, pkt: &mut Packet<'_>, seen: &mut u64) -> Verdict {
        *seen += 1;
        if pkt.payload() == b"boom" {
            panic!("boom");
        }
        Verdict::Pass
    }
}

#[test]
fn a_tenant_that_faults_again_is_released_only_by_the_operator_after_a_growing_backoff() {
    let mut p = Pipeline::new(Fragile, cfg(2, 30)).unwrap();
    p.admit(spec_with(1, ())).unwrap();
    p.admit(spec_with(2, ())).unwrap();
    let backoff = Duration::from_millis(300);
    p.control().set_quarantine_backoff(backoff);
    let mut sent = [0u64; 3];
    let mut send = |p: &mut Pipeline<Fragile>, t: u32, payload: &[u8]| {
        p.push(0, 0, &frame(t, payload));
        sent[t as usize] += 1;
        p.flush();
    };
    assert!(matches!(
        p.release(TenantId(2)),
        Err(PipelineError::NotQuarantined(TenantId(2)))
    ));
    // First fault: quarantined until released; nothing does it on a timer.
    send(&mut p, 1, b"boom");
    send(&mut p, 1, b"ok");
    send(&mut p, 2, b"ok");
    std::thread::sleep(backoff);
    send(&mut p, 1, b"ok");
    let r = p.report();
    let t1 = &r.tenants[0];
    assert!(t1.quarantined);
    assert_eq!((t1.passed, t1.drops.get("quarantined")), (0, Some(&3)));
    // A first fault may be released at once.
    p.release(TenantId(1)).unwrap();
    send(&mut p, 1, b"ok");
    assert_eq!(p.report().tenants[0].passed, 1);
    // Second fault: the release is refused for the backoff.
    send(&mut p, 1, b"boom");
    let e = p.release(TenantId(1)).unwrap_err();
    match &e {
        PipelineError::QuarantineBackoff {
            tenant,
            faults,
            backoff: b,
            remaining,
        } => {
            assert_eq!((*tenant, *faults, *b), (TenantId(1), 2, backoff));
            assert!(*remaining <= backoff);
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("tenant 1 faulted 2 times"), "{e}");
    send(&mut p, 1, b"ok");
    assert!(p.report().tenants[0].quarantined);
    std::thread::sleep(backoff);
    p.release(TenantId(1)).unwrap();
    send(&mut p, 1, b"ok");
    // Third fault: twice the backoff.
    send(&mut p, 1, b"boom");
    std::thread::sleep(backoff);
    match p.release(TenantId(1)) {
        Err(PipelineError::QuarantineBackoff {
            faults, backoff: b, ..
        }) => {
            assert_eq!((faults, b), (3, 2 * backoff));
        }
        other => panic!("{other:?}"),
    }
    std::thread::sleep(backoff);
    p.release(TenantId(1)).unwrap();
    send(&mut p, 1, b"ok");
    let r = p.finish();
    let released: Vec<u32> = r
        .events
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Released { tenant, faults } if *tenant == TenantId(1) => Some(*faults),
            _ => None,
        })
        .collect();
    assert_eq!(released, vec![1, 2, 3], "{:?}", r.events);
    let faults = r
        .events
        .iter()
        .filter(|e| matches!(e, WorkerEvent::Fault { .. }))
        .count();
    assert_eq!(faults, 3, "{:?}", r.events);
    let (t1, t2) = (&r.tenants[0], &r.tenants[1]);
    assert!(!t1.quarantined);
    assert_eq!(t1.packets, sent[1], "{t1:?}");
    assert_eq!(t1.passed, 3);
    assert_eq!(t1.drops.get("quarantined"), Some(&6));
    assert_eq!((t2.packets, t2.passed), (sent[2], sent[2]));
}

/// Passes everything; each tenant takes a 256 KiB region.
struct Big;

impl NetworkFunction for Big {
    type State = u64;
    type Policy = ();
    fn name(&self) -> &'static str {
        "big"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::with_extra::<u64>(256 << 10)
    }
    fn init(&self, _: &(), _: &mut u64) -> Result<(), InitError> {
        Ok(())
    }
    fn handle(&self, _pkt: &mut Packet<'_>, _state: &mut u64) -> Verdict {
        Verdict::Pass
    }
}

#[test]
fn an_exhausted_arena_refuses_admission_cleanly_and_costs_the_others_nothing() {
    let mut p = Pipeline::new(
        Big,
        PipelineConfig {
            arena: ArenaConfig { capacity: 1 << 20 },
            ..cfg(2, 30)
        },
    )
    .unwrap();
    let mut admitted = Vec::new();
    let err = loop {
        let t = admitted.len() as u32 + 1;
        match p.admit(spec_with(t, ())) {
            Ok(_) => admitted.push(t),
            Err(e) => break e,
        }
        assert!(t < 16, "a 1 MiB arena cannot hold 16 regions of 256 KiB");
    };
    assert!(!admitted.is_empty());
    let refused = admitted.len() as u32 + 1;
    assert!(
        matches!(err, PipelineError::Memory { tenant, .. } if tenant == TenantId(refused)),
        "{err:?}"
    );
    assert!(err.to_string().contains("arena exhausted"), "{err}");
    assert!(p.slot_of(TenantId(refused)).is_none());
    for r in 0..500u64 {
        for &t in &admitted {
            p.push(r, 0, &frame(t, b"x"));
        }
        // The refused tenant's traffic matches no rule.
        p.push(r, 0, &frame(refused, b"x"));
    }
    // Removing a tenant gives its region back (once no worker holds its state: a worker
    // lets go of a removed tenant at its next burst), and the refused one fits.
    p.remove(TenantId(admitted[0])).unwrap();
    for r in 500..600u64 {
        for &t in &admitted[1..] {
            p.push(r, 0, &frame(t, b"x"));
        }
    }
    p.flush();
    p.admit(spec_with(refused, ())).unwrap();
    let r = p.finish();
    for t in &r.tenants {
        if t.id == TenantId(refused) {
            continue;
        }
        assert_eq!((t.packets, t.passed), (600, 600), "tenant {}", t.id);
    }
    assert_eq!(r.global.unmatched, 500);
}

/// Passes everything, but a tenant admitted with policy `true` spins on a packet whose
/// payload is `spin` until its flag is cleared: a safe Rust handler that never returns.
/// Each test has its own flag (tests run side by side).
struct Spinner(&'static AtomicBool);

static SPIN: AtomicBool = AtomicBool::new(true);
static HANG: AtomicBool = AtomicBool::new(true);

/// Held by a test while its handler spins: one spinning core at a time, so that on a
/// two-core machine the tests beside it (the backoff test's timing) still get a core.
static SPINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl NetworkFunction for Spinner {
    type State = bool;
    type Policy = bool;
    fn name(&self) -> &'static str {
        "spinner"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<bool>()
    }
    fn init(&self, spin: &bool, state: &mut bool) -> Result<(), InitError> {
        *state = *spin;
        Ok(())
    }
    fn handle(&self, pkt: &mut Packet<'_>, spin: &mut bool) -> Verdict {
        if *spin && pkt.payload() == b"spin" {
            while self.0.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
        Verdict::Pass
    }
}

/// Passes everything, but a tenant admitted with policy `true` sleeps on a packet whose
/// payload is `spin` until its flag is cleared: a handler blocked in the kernel, using no
/// CPU time. Each test has its own flag.
struct Sleeper(&'static AtomicBool);

static BLOCK: AtomicBool = AtomicBool::new(true);
static PAUSE: AtomicBool = AtomicBool::new(true);

impl NetworkFunction for Sleeper {
    type State = bool;
    type Policy = bool;
    fn name(&self) -> &'static str {
        "sleeper"
    }
    fn register(&self) -> MemorySpec {
        MemorySpec::of::<bool>()
    }
    fn init(&self, block: &bool, state: &mut bool) -> Result<(), InitError> {
        *state = *block;
        Ok(())
    }
    fn handle(&self, pkt: &mut Packet<'_>, block: &mut bool) -> Verdict {
        if *block && pkt.payload() == b"spin" {
            while self.0.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Verdict::Pass
    }
}

/// A worker terminated while it is stuck in a handler: its other tenant moves, and that
/// tenant's hand-over (its packets queued behind the stuck one) ends when the worker is
/// found stuck, so its later packets (held meanwhile) flow on the new worker, every one
/// counted, and its removal does not wait forever.
#[test]
fn a_worker_terminated_while_stuck_in_a_handler_does_not_hold_its_tenants_forever() {
    let _one = SPINNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    terminated_while_stuck(Spinner(&HANG), &HANG);
}

/// The same with a handler blocked in the kernel (asleep, using no CPU time): the worker
/// no longer has the tenant's row in the Worker Table once terminated, and is found
/// stuck in it all the same.
#[test]
fn a_worker_terminated_while_blocked_in_a_handler_does_not_hold_its_tenants_forever() {
    // Not spinning, but the data plane polls without a break while it waits.
    let _one = SPINNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    terminated_while_stuck(Sleeper(&PAUSE), &PAUSE);
}

/// Tenant 1 (policy `true`) gets stuck in `nf`'s handler on its `spin` packet, whose
/// worker is then terminated, with packets of its neighbour (the victim) queued behind
/// it and more of both sent after. Within the test's bound the worker is found stuck in
/// tenant 1, which is quarantined (its later packets dropped, counted, wherever they
/// went); the victim passes all it was sent on another worker and can be removed.
/// `release` lets the handler return at the end.
fn terminated_while_stuck<N: NetworkFunction<Policy = bool>>(nf: N, release: &'static AtomicBool) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut p = Pipeline::new(nf, cfg(2, 30)).unwrap();
        p.admit(spec_with(1, true)).unwrap();
        for t in 2..=5 {
            p.admit(spec_with(t, false)).unwrap();
        }
        let r = p.report();
        let on = worker_of(&r, 1);
        let victim = (2..=5).find(|&t| worker_of(&r, t) == on).unwrap();
        p.push(0, 0, &frame(1, b"spin"));
        // The worker takes the stuck packet alone, then the victim's queue behind it.
        std::thread::sleep(Duration::from_millis(50));
        for r in 0..5u64 {
            p.push(1 + r, 0, &frame(victim, b"x"));
        }
        p.terminate_worker(WorkerId(on)).unwrap();
        for r in 0..10u64 {
            p.push(10 + r, 0, &frame(victim, b"x"));
        }
        for r in 0..3u64 {
            p.push(20 + r, 0, &frame(1, b"x"));
        }
        p.flush();
        let report = p.report();
        p.remove(TenantId(victim)).unwrap();
        let _ = tx.send((on, victim, report));
        let _ = p.finish();
    });
    let got = rx.recv_timeout(Duration::from_secs(20));
    // The handler returns, whatever the outcome: its thread ends with the test.
    release.store(false, Ordering::Relaxed);
    let (on, victim, report) =
        got.expect("the terminated worker's stuck hand-over held its tenant's packets forever");
    let tenants = report
        .events
        .iter()
        .find_map(|e| match e {
            WorkerEvent::WorkerStuck {
                worker, tenants, ..
            } if *worker == on => Some(tenants.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no WorkerStuck event: {:?}", report.events));
    assert_eq!(tenants, vec![TenantId(1)]);
    let t1 = report.tenants.iter().find(|t| t.id == TenantId(1)).unwrap();
    assert!(t1.quarantined, "{t1:?}");
    assert_ne!(t1.worker, on);
    // Its packets sent after the termination reached no handler: dropped, counted.
    assert_eq!(t1.drops.get("quarantined"), Some(&3), "{t1:?}");
    assert_eq!(report.global.stuck_in_worker, 1);
    let v = report
        .tenants
        .iter()
        .find(|t| t.id == TenantId(victim))
        .unwrap();
    assert_eq!((v.packets, v.passed), (15, 15), "tenant {victim}");
    assert_ne!(v.worker, on);
}

#[test]
fn a_worker_stuck_in_a_handler_is_found_within_a_timeslot_and_its_other_tenants_keep_flowing() {
    let _one = SPINNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stuck_worker_is_found(Spinner(&SPIN));
    // Let the handler return so the detached thread ends with the test.
    SPIN.store(false, Ordering::Relaxed);
}

#[test]
fn a_worker_blocked_in_a_handler_without_using_cpu_is_found_too() {
    stuck_worker_is_found(Sleeper(&BLOCK));
    BLOCK.store(false, Ordering::Relaxed);
}

/// Tenant 1 (policy `true`) gets stuck in `nf`'s handler on its `spin` packet, with eight
/// other tenants on three workers: the stuck worker is found within two timeslots, the
/// tenant is quarantined, its neighbours move and lose only the frames caught with it.
fn stuck_worker_is_found<N: NetworkFunction<Policy = bool>>(nf: N) {
    // Timeslots of 2^30 ns (1.07 s): the stall bound is half of one (537 ms).
    let shift = 30;
    let slot = Duration::from_nanos(1 << shift);
    assert!(MIN_STALL < slot);
    let mut p = Pipeline::new(nf, cfg(3, shift)).unwrap();
    p.admit(spec_with(1, true)).unwrap();
    for t in 2..=9 {
        p.admit(spec_with(t, false)).unwrap();
    }
    let r = p.report();
    let stuck_on = worker_of(&r, 1);
    let victims: Vec<u32> = (2..=9).filter(|&t| worker_of(&r, t) == stuck_on).collect();
    assert!(!victims.is_empty());
    let mut sent = [0u64; 10];
    let t0 = Instant::now();
    p.push(0, 0, &frame(1, b"spin"));
    sent[1] += 1;
    for r in 0..300u64 {
        for t in 1..=9u32 {
            p.push(r, 0, &frame(t, b"x"));
            sent[t as usize] += 1;
        }
    }
    p.flush();
    let report = p.report();
    let ev = report
        .events
        .iter()
        .find_map(|e| match e {
            WorkerEvent::WorkerStuck {
                worker,
                tenants,
                reassigned,
                requeued,
                stuck,
            } => Some((*worker, tenants.clone(), *reassigned, *requeued, *stuck)),
            _ => None,
        })
        .expect("a WorkerStuck event");
    let took = t0.elapsed();
    let (worker, tenants, reassigned, requeued, stuck) = ev;
    assert_eq!(worker, stuck_on);
    assert_eq!(tenants, vec![TenantId(1)]);
    assert_eq!(reassigned, victims.len() + 1);
    assert!(!report.workers[stuck_on as usize].live);
    assert!(took < 2 * slot, "found after {took:?}");
    // The stuck tenant is quarantined; every other tenant, its former neighbours
    // included, passed everything but the frames caught in the stuck burst.
    let t1 = report.tenants.iter().find(|t| t.id == TenantId(1)).unwrap();
    assert!(t1.quarantined);
    let mut caught = 0;
    for t in &report.tenants {
        let s = sent[t.id.0 as usize];
        caught += s - t.packets;
        if t.id != TenantId(1) {
            assert!(!t.quarantined);
            assert_eq!(t.passed, t.packets, "tenant {}", t.id);
            assert_ne!(t.worker, stuck_on);
            if !victims.contains(&t.id.0) {
                assert_eq!(t.packets, s, "tenant {}", t.id);
            }
        }
    }
    assert_eq!(caught, report.global.stuck_in_worker);
    assert_eq!(caught, stuck);
    println!(
        "worker {worker} stuck: found after {took:?}, {reassigned} tenants moved, \
         {requeued} queued frames moved, {stuck} frames caught in its burst"
    );
    // The stuck handler still holds tenant 1's state: released as it is, its next
    // packet would stall another worker on that lock. Refused, nothing changed; a new
    // state (a policy update builds it in a new region) makes the release safe, and the
    // tenant's packets flow again on a live worker.
    let refused = p.release(TenantId(1)).unwrap_err();
    assert!(
        matches!(refused, PipelineError::StateHeldByStuckWorker(TenantId(1))),
        "{refused}"
    );
    assert!(p
        .report()
        .tenants
        .iter()
        .any(|t| t.id == TenantId(1) && t.quarantined));
    p.update_policy(TenantId(1), &false).unwrap();
    p.release(TenantId(1)).unwrap();
    let before = p
        .report()
        .tenants
        .iter()
        .find(|t| t.id == TenantId(1))
        .unwrap()
        .packets;
    for r in 0..10u64 {
        p.push(1_000 + r, 0, &frame(1, b"spin"));
    }
    p.flush();
    let after = p.report();
    let t1 = after.tenants.iter().find(|t| t.id == TenantId(1)).unwrap();
    assert_eq!((t1.packets - before, t1.quarantined), (10, false));
    let _ = p.finish();
    let _ = WorkerId(0);
}

static MOVED: AtomicBool = AtomicBool::new(true);

/// Clears its flag when dropped.
struct ClearOnDrop(&'static AtomicBool);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Workers fed by their own sources (the XDP Packet Dispatcher in the NIC path) run
/// whatever their source hands them, and the outside dispatcher may move a tenant whose
/// handler is stuck to another worker before the stall is found; the data plane's own
/// Worker Table rows may place it on a third. The stuck worker still names the tenant it
/// is stuck in, and the worker the tenant's packets reach next waits for its held state
/// only until the tenant is quarantined: it drops them then, as quarantined, runs its
/// other tenant's packets, and is not itself found stuck.
#[test]
fn a_stuck_tenant_moved_to_another_sourced_worker_stalls_that_worker_only_until_quarantined() {
    let _one = SPINNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Lets the handler return when the test ends, failed or not.
    let _release = ClearOnDrop(&MOVED);
    let (inboxes, sources) = test_sources(3);
    // Timeslots of 2^30 ns (1.07 s): the stall bound is half of one (537 ms).
    let shift = 30;
    let slot = Duration::from_nanos(1 << shift);
    let mut p = Pipeline::with_sources(Spinner(&MOVED), cfg(3, shift), sources).unwrap();
    let hostile = p.admit(spec_with(1, true)).unwrap();
    let victim = p.admit(spec_with(2, false)).unwrap();
    // Stuck on a worker other than the one its row names, moved to the third.
    let row = worker_of(&p.report(), 1) as usize;
    let (stuck_on, moved_to) = ((row + 1) % 3, (row + 2) % 3);
    inboxes[stuck_on]
        .lock()
        .unwrap()
        .frames
        .push(tagged_buf(&frame(1, b"spin"), hostile));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(50) {
        p.dataplane().poll().unwrap();
    }
    p.control()
        .dispatcher_events(vec![buffet_dispatch::Event::Migration {
            tenant: hostile,
            from: WorkerId(stuck_on as u16),
            to: WorkerId(moved_to as u16),
            slot: 1,
        }]);
    // The hostile tenant's next frames first, then the victim's, on the worker it moved
    // to; then the victim's in batches while the stall is being found.
    const VICTIM: u64 = 400;
    let mut sent_victim = 0u64;
    let send_victim = |n: u64| {
        inboxes[moved_to]
            .lock()
            .unwrap()
            .frames
            .extend((0..n).map(|_| tagged_buf(&frame(2, b"x"), victim)));
        n
    };
    inboxes[moved_to]
        .lock()
        .unwrap()
        .frames
        .extend((0..8).map(|_| tagged_buf(&frame(1, b"x"), hostile)));
    sent_victim += send_victim(8);
    // Generous: the stall is found within two timeslots (the other stuck-worker tests
    // bound that); this bounds only a hang.
    let deadline = t0 + 10 * slot;
    let mut last_look = Instant::now();
    let report = loop {
        p.dataplane().poll().unwrap();
        if sent_victim < VICTIM && t0.elapsed() > Duration::from_millis(50 + sent_victim) {
            sent_victim += send_victim(49.min(VICTIM - sent_victim));
        }
        // A report waits a few ms for the stuck tenant's state: look now and then only.
        if last_look.elapsed() < Duration::from_millis(50) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        last_look = Instant::now();
        let r = p.report();
        let v = r.tenants.iter().find(|t| t.id == TenantId(2)).unwrap();
        let found = r
            .events
            .iter()
            .any(|e| matches!(e, WorkerEvent::WorkerStuck { .. }));
        if found && sent_victim == VICTIM && v.packets == VICTIM {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "victim ran {} of {sent_victim}; events {:?}",
            v.packets,
            r.events
        );
    };
    let stuck: Vec<(u16, Vec<TenantId>)> = report
        .events
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::WorkerStuck {
                worker, tenants, ..
            } => Some((*worker, tenants.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(stuck, [(stuck_on as u16, vec![TenantId(1)])]);
    assert!(report.workers[moved_to].live, "{:?}", report.workers);
    let h = report.tenants.iter().find(|t| t.id == TenantId(1)).unwrap();
    assert!(h.quarantined);
    assert_eq!(h.drops.get("quarantined"), Some(&8), "{h:?}");
    let v = report.tenants.iter().find(|t| t.id == TenantId(2)).unwrap();
    assert_eq!((v.passed, v.quarantined), (VICTIM, false), "{v:?}");
    println!(
        "worker {stuck_on} stuck in tenant 1 (its row: worker {row}); worker {moved_to} \
         dropped its 8 moved frames and ran all {VICTIM} of tenant 2's"
    );
    let _ = p.finish();
}
