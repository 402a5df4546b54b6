//! What the `isolation` and `ebpf` benchmarks share: the burst shape of one iteration
//! and the loop that runs a Worker over it. Included with `#[path]`; not a crate.
//!
//! One iteration is [`BURSTS`] bursts of [`BURST`] packets; burst `k` holds
//! [`GROUPS_PER_BURST`] groups of [`GROUP`] packets, of tenants `8k..8k+7` (mod `n`), so
//! with 1,000 tenants each runs one group per iteration. Packet time advances by 1 ns per
//! packet. What the frames are is each benchmark's own business.
#![allow(dead_code)]

use buffet::dispatch::TenantSlot;
use buffet::sdk::NetworkFunction;
use buffet::worker::{PacketBuf, Worker};

/// One burst: boxed, as the Worker Pool moves packet buffers between threads by pointer.
#[allow(clippy::vec_box)]
pub type Burst = Vec<PacketBuf>;

/// Packets of one tenant group in a burst.
pub const GROUP: usize = 32;
/// Tenant groups per burst.
pub const GROUPS_PER_BURST: usize = 8;
/// Packets per burst.
pub const BURST: usize = GROUP * GROUPS_PER_BURST;
/// Bursts per iteration: enough for 1,000 tenants to each run one group.
pub const BURSTS: usize = 125;
/// Packets per iteration.
pub const PACKETS: usize = BURST * BURSTS;
/// The tenant counts every group is measured at.
pub const TENANT_COUNTS: [u32; 2] = [8, 1000];

/// The bursts of one iteration for `n` tenants; packet `i` of tenant `t`'s group is
/// `frame(t, i)`.
pub fn bursts(n: u32, frame: impl Fn(u32, usize) -> Vec<u8>) -> Vec<Burst> {
    (0..BURSTS)
        .map(|k| {
            let mut burst = Vec::with_capacity(BURST);
            for g in 0..GROUPS_PER_BURST {
                let t = ((k * GROUPS_PER_BURST + g) as u32) % n;
                for i in 0..GROUP {
                    let mut m = PacketBuf::heap();
                    assert!(m.fill(&frame(t, i)));
                    m.tenant = TenantSlot(t);
                    m.ts_ns = (k * BURST + g * GROUP + i) as u64;
                    burst.push(m);
                }
            }
            burst
        })
        .collect()
}

/// Runs `e` over every burst; the Worker's packet count after.
pub fn run<N: NetworkFunction>(e: &mut Worker<N>, bursts: &mut [Burst]) -> u64 {
    for b in bursts.iter_mut() {
        e.process(b);
    }
    e.packets()
}
