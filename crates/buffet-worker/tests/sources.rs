//! Workers fed by their own sources (as the XDP Packet Dispatcher feeds each worker's
//! AF_XDP socket) instead of the software dispatcher: every tagged frame is processed by
//! its worker and counted for its tenant, rejected frames are handed back unprocessed,
//! and the events of the outside dispatcher become the run's events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet_dispatch::{Event, TenantSlot, WorkerId};
use buffet_io::PacketBuf;
use buffet_nfs::monitor::Monitor;
use buffet_sdk::TenantId;
use buffet_worker::{Pipeline, PipelineConfig, PipelineError, WorkerEvent, WorkerSource};

mod common;
use common::{plain_frame, spec, tagged_buf, test_sources, TestSource};

fn tagged(tenant: u32, slot: TenantSlot) -> PacketBuf {
    tagged_buf(&plain_frame(tenant), slot)
}

#[test]
fn sources_must_match_the_workers() {
    let sources: Vec<Box<dyn WorkerSource>> =
        vec![Box::new(TestSource(Arc::default())) as Box<dyn WorkerSource>];
    let cfg = PipelineConfig {
        workers: 2,
        pin: false,
        ..PipelineConfig::default()
    };
    let e = Pipeline::with_sources(Monitor::default(), cfg, sources)
        .err()
        .unwrap();
    assert!(matches!(e, PipelineError::Config(_)), "{e}");
}

#[test]
fn workers_process_what_their_own_sources_deliver() {
    let (inboxes, sources) = test_sources(2);
    let cfg = PipelineConfig {
        workers: 2,
        pin: false,
        ..PipelineConfig::default()
    };
    let mut p = Pipeline::with_sources(Monitor::default(), cfg, sources).unwrap();
    let s1 = p.admit(spec(1)).unwrap();
    let s2 = p.admit(spec(2)).unwrap();
    // Tenant 1's frames on worker 0, tenant 2's on worker 1, and one frame each worker
    // rejects (it had no tenant tag).
    {
        let mut a = inboxes[0].lock().unwrap();
        a.frames.extend((0..300).map(|_| tagged(1, s1)));
        a.rejected.push(tagged(1, TenantSlot(0)));
        let mut b = inboxes[1].lock().unwrap();
        b.frames.extend((0..200).map(|_| tagged(2, s2)));
        b.rejected.push(tagged(2, TenantSlot(0)));
    }
    // No port delivers anything, yet the turns that took the workers' finished frames
    // are not idle: a loop that backs off on idle must keep sending and recycling them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut received, mut completed, mut busy_turns) = (0, 0, 0);
    loop {
        let polled = p.dataplane().poll().unwrap();
        received += polled.received;
        completed += polled.completed;
        busy_turns += usize::from(!polled.is_idle());
        let r = p.report();
        let got: Vec<u64> = r.tenants.iter().map(|t| t.packets).collect();
        if got == [300, 200] && completed >= 502 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processed {got:?}, {completed} completions taken"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(received, 0, "no port was added");
    assert_eq!(
        completed, 502,
        "every frame, the two rejected ones included"
    );
    assert!(busy_turns > 0);
    // The outside dispatcher's events.
    p.control().dispatcher_events(vec![
        Event::Migration {
            tenant: s1,
            from: WorkerId(0),
            to: WorkerId(1),
            slot: 7,
        },
        Event::Overload {
            worker: WorkerId(0),
            slot: 7,
        },
    ]);
    p.dataplane().apply_commands();
    let r = p.finish();
    let by_id: Vec<(u32, u64, u64, u64)> = r
        .tenants
        .iter()
        .map(|t| (t.id.0, t.packets, t.passed, t.migrations))
        .collect();
    assert_eq!(by_id, [(1, 300, 300, 1), (2, 200, 200, 0)]);
    let per_worker: Vec<(u64, u64)> = r
        .workers
        .iter()
        .map(|w| (w.packets, w.dispatched))
        .collect();
    // Completed frames count as dispatched (the rejected one too: it came back).
    assert_eq!(per_worker, [(300, 301), (200, 201)]);
    assert_eq!(
        r.events,
        [
            WorkerEvent::Migration {
                seq: 0,
                tenant: TenantId(1),
                from: 0,
                to: 1,
                slot: 7
            },
            WorkerEvent::Overload {
                seq: 0,
                worker: 0,
                slot: 7
            }
        ]
    );
    assert_eq!(r.global.input_packets, 0, "no software dispatch");
    // The rejected frames are nobody's: counted once, globally, and not as a tenant's
    // frames lost with a dying worker.
    assert_eq!(r.global.untagged, 2);
    for t in &r.tenants {
        assert_eq!(t.drops.get("worker_died"), None, "tenant {}", t.id.0);
    }
}

/// A run whose ports bring nothing (`buffet run --dispatch xdp`: every frame reaches the
/// workers through their own sockets) keeps every event all the same, more than the
/// channel holds: `Pipeline::run` takes them off the channel once it is half full, not
/// only as its ports' packets arrive.
#[test]
fn a_run_whose_ports_bring_nothing_keeps_more_events_than_the_channel_holds() {
    // Small enough that even chunks applied together stay far below the capacity.
    const CHUNK: u64 = 4_096;
    let chunks = 2 * buffet_worker::EVENT_CAPACITY as u64 / CHUNK;
    let batches = (0..chunks)
        .map(|c| {
            (0..CHUNK)
                .map(|i| Event::Overload {
                    worker: WorkerId(0),
                    slot: c * CHUNK + i,
                })
                .collect()
        })
        .collect();
    let mut p = run_with_dispatcher_events(PipelineConfig::default(), batches);
    let slots: Vec<u64> = p
        .events()
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Overload { slot, .. } => Some(*slot),
            _ => None,
        })
        .collect();
    assert_eq!(p.control().events_dropped(), 0);
    assert_eq!(slots.len() as u64, chunks * CHUNK);
    assert!(slots.windows(2).all(|w| w[0] + 1 == w[1]), "in order");
}

/// A run keeps its first `events_kept` scheduler events and counts the rest, so a run
/// that reports an overload every timeslot for days does not grow without bound; its
/// report still says how many there were of each kind.
#[test]
fn a_run_keeps_its_first_scheduler_events_and_counts_the_rest() {
    let cfg = PipelineConfig {
        events_kept: 100,
        ..PipelineConfig::default()
    };
    // 300 timeslots, each with an overload report and a migration.
    let events = (0..300)
        .flat_map(|slot| {
            [
                Event::Overload {
                    worker: WorkerId(0),
                    slot,
                },
                Event::Migration {
                    tenant: TenantSlot(0),
                    from: WorkerId(0),
                    to: WorkerId(0),
                    slot,
                },
            ]
        })
        .collect();
    let mut p = run_with_dispatcher_events(cfg, vec![events]);
    let slots: Vec<u64> = p
        .events()
        .iter()
        .map(|e| match e {
            WorkerEvent::Overload { slot, .. } | WorkerEvent::Migration { slot, .. } => *slot,
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    // The first 100, in order: 50 timeslots' pairs.
    assert_eq!(slots, (0..50).flat_map(|s| [s, s]).collect::<Vec<_>>());
    let r = p.report();
    assert_eq!(r.events.len(), 100);
    assert_eq!(r.global.overloads_not_kept, 250);
    assert_eq!(r.global.migrations_not_kept, 250);
    let r = p.finish();
    assert_eq!(r.events.len(), 100);
    assert_eq!(
        r.global.overloads_not_kept + r.global.migrations_not_kept,
        500
    );
    assert_eq!(r.global.events_dropped, 0);
}

/// Runs a one-worker pipeline (`cfg` otherwise) fed by its own (empty) sources while
/// another thread hands it `batches` of the XDP program's events, each applied before
/// the next is sent, then stops it.
fn run_with_dispatcher_events(cfg: PipelineConfig, batches: Vec<Vec<Event>>) -> Pipeline<Monitor> {
    let (inboxes, sources) = test_sources(1);
    let cfg = PipelineConfig {
        workers: 1,
        pin: false,
        ..cfg
    };
    let mut p = Pipeline::with_sources(Monitor::default(), cfg, sources).unwrap();
    let control = p.control().clone();
    let outside = std::thread::spawn(move || {
        for events in batches {
            control.dispatcher_events(events);
            // Answered once the events before it were applied.
            control.report().unwrap();
        }
        control.stop();
    });
    p.run(|_| {}).unwrap();
    outside.join().unwrap();
    // The sources' inboxes lived through the whole run, as in a real one.
    drop(inboxes);
    p
}
