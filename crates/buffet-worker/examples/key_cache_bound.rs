//! The fewest MPK key misses any key assignment could have on the demo's traffic: a
//! lower bound for `mpk_key_misses`, computed without protection keys.
//!
//! `buffet demo`'s traffic (seed 7, 2 virtual seconds at 400,000 packets/s, as in the
//! `mpk_key_misses` example) is split over 2 workers as admission spreads tenants (tenant
//! `i` on worker `i mod 2`); each worker takes its packets in bursts of `B` and runs one
//! group per tenant per burst, and the two workers' groups interleave burst by burst. A
//! group needs its tenant's region under one of `K` cache keys. For that sequence of
//! groups the example counts the groups and the misses of the optimal offline assignment
//! (Belady: on a miss, take the key of the tenant whose next group comes last), which no
//! key cache — LRU, frequency-based, or one told the future by the scheduler — can beat
//! with `K` keys on these groups in this order. Fewer misses need larger groups or
//! another order of them (which this does not explore), not a better cache.
//!
//! It models the grouping (a live worker's bursts are as large as its ring holds when it
//! takes one), so it bounds the misses for groups of that size, not the emulated run's
//! exact count.
//!
//! ```text
//! cargo run --release -p buffet-worker --example key_cache_bound -- [TENANTS...]
//! ```

use std::collections::{BinaryHeap, HashMap};

use buffet_io::gen::tenant_of_dst;
use buffet_io::PacketSource;

mod demo_traffic;
use demo_traffic::{RATE_PPS, SECONDS, SEED};

/// Workers the tenants are spread over.
const WORKERS: u32 = demo_traffic::WORKERS as u32;
const KEYS: usize = 14;
const BURSTS: [usize; 3] = [32, 64, 256];

/// Offset of the IPv4 destination address in the generator's untagged Ethernet frames.
const DST: std::ops::Range<usize> = 30..34;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let counts = demo_traffic::tenant_counts()?;
    println!(
        "demo traffic (seed {SEED}, {SECONDS} virtual s at {RATE_PPS} pps), {WORKERS} workers, \
         {KEYS} cache keys, one group per tenant per burst"
    );
    println!(
        "tenants  packets  heaviest_{KEYS}_share  burst  groups_per_1000_packets  \
         optimal_misses_per_1000_packets"
    );
    for tenants in counts {
        let tenant_of = packets(tenants)?;
        let share = heaviest_share(&tenant_of, KEYS);
        for burst in BURSTS {
            let groups = groups(&tenant_of, burst);
            let misses = belady(&groups, KEYS);
            let per_1000 = |x: usize| x as f64 * 1000.0 / tenant_of.len().max(1) as f64;
            println!(
                "{tenants}  {}  {share:.3}  {burst}  {:.1}  {:.1}",
                tenant_of.len(),
                per_1000(groups.len()),
                per_1000(misses)
            );
        }
    }
    Ok(())
}

/// The tenant of every packet of the demo's traffic, in arrival order.
fn packets(tenants: u32) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let mut source = demo_traffic::generator(tenants)?;
    let mut out = Vec::new();
    while let Some(pkt) = source.next_packet()? {
        let d = pkt
            .data
            .get(DST)
            .ok_or("a generated frame is shorter than an IPv4 header")?;
        let t = tenant_of_dst([d[0], d[1], d[2], d[3]].into())
            .ok_or("a generated frame's destination is outside 10.0.0.0/8")?;
        out.push(t);
    }
    Ok(out)
}

/// The share of the packets that the `k` tenants with the most packets carry.
fn heaviest_share(tenant_of: &[u32], k: usize) -> f64 {
    let mut per: HashMap<u32, u64> = HashMap::new();
    for &t in tenant_of {
        *per.entry(t).or_default() += 1;
    }
    let mut counts: Vec<u64> = per.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts.iter().take(k).sum::<u64>() as f64 / tenant_of.len().max(1) as f64
}

/// The groups, in the order the workers run them: each worker's packets cut into bursts
/// of `burst`, a burst's tenants in order of first appearance, the workers' bursts taken
/// in turn by when each burst filled.
fn groups(tenant_of: &[u32], burst: usize) -> Vec<u32> {
    let mut pending: Vec<Vec<u32>> = vec![Vec::with_capacity(burst); WORKERS as usize];
    let mut out = Vec::new();
    let flush = |b: &mut Vec<u32>, out: &mut Vec<u32>| {
        let mut seen: Vec<u32> = Vec::new();
        for &t in b.iter() {
            if !seen.contains(&t) {
                seen.push(t);
            }
        }
        out.extend(seen);
        b.clear();
    };
    for &t in tenant_of {
        let b = &mut pending[(t % WORKERS) as usize];
        b.push(t);
        if b.len() == burst {
            flush(b, &mut out);
        }
    }
    for b in &mut pending {
        flush(b, &mut out);
    }
    out
}

/// Misses of Belady's optimal replacement with `keys` keys over `seq`.
fn belady(seq: &[u32], keys: usize) -> usize {
    // next[i]: where seq[i]'s tenant comes next (usize::MAX: never).
    let mut next = vec![usize::MAX; seq.len()];
    let mut last: HashMap<u32, usize> = HashMap::new();
    for (i, &t) in seq.iter().enumerate().rev() {
        next[i] = last.insert(t, i).unwrap_or(usize::MAX);
    }
    // Held tenants with their next use; the heap holds (next use, tenant), stale entries
    // skipped on pop.
    let mut held: HashMap<u32, usize> = HashMap::new();
    let mut heap: BinaryHeap<(usize, u32)> = BinaryHeap::new();
    let mut misses = 0;
    for (i, &t) in seq.iter().enumerate() {
        if held.insert(t, next[i]).is_none() {
            misses += 1;
            if held.len() > keys {
                // Evict the held tenant (other than t) whose next use is furthest.
                while let Some((n, v)) = heap.pop() {
                    if v != t && held.get(&v) == Some(&n) {
                        held.remove(&v);
                        break;
                    }
                }
            }
        }
        heap.push((next[i], t));
    }
    misses
}
