//! The hot path does not allocate: `Dispatcher::dispatch` and `schedule_tagged`, with
//! classification, the exact-match cache, policing, migrations, overload reports and
//! DSCP tagging all exercised, are run under a counting allocator.
//!
//! The global allocator of this test binary is `buffet_testkit::CountingAllocator`, which
//! only counts and delegates to the system allocator (its `unsafe impl` lives in the
//! testkit's `sys` module); this file has no `unsafe`.

use buffet_dispatch::{
    Decision, Dispatcher, DispatcherConfig, Match, PortRange, SchedulerConfig, TagMode, TenantSlot,
    UnmatchedPolicy, WorkerId,
};
use buffet_testkit::{allocations_during, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn frame(dst_port: u16, v6: bool) -> Vec<u8> {
    let mut v = Vec::new();
    let b = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6]);
    if v6 {
        b.ipv6([1; 16], [2; 16], 64)
            .udp(4000, dst_port)
            .write(&mut v, b"payload")
            .unwrap();
    } else {
        b.ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(4000, dst_port)
            .write(&mut v, b"payload")
            .unwrap();
    }
    v
}

#[test]
fn dispatch_does_not_allocate() {
    let mut d = Dispatcher::new(DispatcherConfig {
        sched: SchedulerConfig {
            shift: 10,
            threshold: 0,
        },
        tag: TagMode::Dscp,
        unmatched: UnmatchedPolicy::Drop,
        ..DispatcherConfig::default()
    });
    for _ in 0..3 {
        d.add_worker(200);
    }
    for t in 0..16u32 {
        let rules = vec![(
            t,
            Match {
                dst_port: Some(PortRange {
                    lo: 1000 + 10 * t as u16,
                    hi: 1009 + 10 * t as u16,
                }),
                ..Match::default()
            },
        )];
        // All on w0 at first: it overloads and tenants migrate.
        d.admit_on(TenantSlot(t), rules, 20, WorkerId(0)).unwrap();
    }
    let mut frames: Vec<Vec<u8>> = (0..200)
        .map(|i| frame(995 + (i * 7 % 170) as u16, i % 3 == 0))
        .collect();
    frames.push(vec![0; 10]); // malformed
    let mut ts = 0u64;
    let mut run = |d: &mut Dispatcher, rounds: usize| {
        let (mut pass, mut drop, mut events) = (0u64, 0u64, 0u64);
        for r in 0..rounds {
            for (i, f) in frames.iter_mut().enumerate() {
                ts += 3 + (i as u64 % 5);
                match d.dispatch(ts, 0, f) {
                    Decision::Pass { .. } => pass += 1,
                    Decision::Drop(_) => drop += 1,
                }
                if d.schedule_tagged(ts, TenantSlot((i % 17) as u32)).is_pass() {
                    pass += 1;
                }
            }
            if r % 4 == 3 {
                events += d.drain_events().count() as u64;
            }
        }
        (pass, drop, events)
    };
    // Warm up: cache, event buffer capacity.
    run(&mut d, 20);
    let mut counts = (0, 0, 0);
    let n = allocations_during(|| counts = run(&mut d, 200));
    let (pass, drop, _events) = counts;
    assert!(pass > 0 && drop > 0, "{counts:?}");
    let st = d.stats();
    assert!(st.migrations > 0 && st.overloads > 0, "{st:?}");
    assert!(st.policed.iter().sum::<u64>() > 0, "{st:?}");
    assert_eq!(n, 0, "allocations on the hot path");
}
