//! Persistent per-tenant Packet Buffers (the paper's Fig. 3) and the bookkeeping of the
//! weighted deficit round robin that serves them.
//!
//! A worker keeps one Packet Buffer per tenant across bursts. A buffer becomes *ready*
//! when it holds a full group ([`BufferConfig::group`] packets) or when its oldest
//! packet has waited [`BufferConfig::latency_ns`]; the worker serves ready buffers in
//! deficit round robin order (see `Worker::enqueue`), and flushes every buffer when its
//! input runs dry, when asked to (a hand-over, a removal, stop) and before it exits.
//!
//! Memory: the buffers share one slab of [`BufferConfig::capacity`] packet slots per
//! worker, allocated once; a buffer is a FIFO list threaded through the slab, so an idle
//! tenant costs one 24-byte queue head, not 32 slots, and 10,000 tenants on a worker
//! cost what the worker actually holds. Nothing here allocates per packet or locks.
//!
//! What it does not do: run the NF, charge cycles or read a clock — the worker does, and
//! hands the time in; tests drive it on a [`VirtualClock`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use buffet_io::PacketBuf;

/// How a worker's persistent Packet Buffers behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferConfig {
    /// Packets that make a buffer ready (a full group); at most this many run per group.
    pub group: usize,
    /// Latency bound: a buffer whose oldest packet has waited this long is ready.
    pub latency_ns: u64,
    /// DRR quantum per unit of weight, in units of NF work (CPU cycles on the system
    /// clock, nanoseconds on a [`VirtualClock`]).
    pub quantum: u64,
    /// Packets the worker may hold in all its buffers at once (the slab size).
    pub capacity: usize,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            group: 32,
            latency_ns: 50_000,
            quantum: 16_384,
            capacity: 1024,
        }
    }
}

/// A clock that only moves when told to: for tests of the latency bound and of the DRR
/// (whose charge, on this clock, is the virtual time an NF spends). Clones share one time.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock at 0 ns.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current virtual time.
    pub fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Sets the time.
    pub fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Release);
    }

    /// Moves the time forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::AcqRel);
    }
}

/// Where a worker reads time for its latency bound and its DRR charge.
#[derive(Clone, Debug, Default)]
pub enum ClockSource {
    /// The monotonic clock (read once per burst) and the CPU cycle counter (the DRR
    /// charges the cycles each group took, which the worker measures anyway).
    #[default]
    System,
    /// A [`VirtualClock`]: the DRR charges the virtual time that passed during a group.
    Virtual(VirtualClock),
}

/// A worker's clock.
pub(crate) enum Clock {
    System(Instant),
    Virtual(VirtualClock),
}

impl Clock {
    pub(crate) fn new(source: &ClockSource) -> Self {
        match source {
            ClockSource::System => Clock::System(Instant::now()),
            ClockSource::Virtual(v) => Clock::Virtual(v.clone()),
        }
    }

    /// Nanoseconds since the worker started (or the virtual time).
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        match self {
            Clock::System(origin) => origin.elapsed().as_nanos() as u64,
            Clock::Virtual(v) => v.now_ns(),
        }
    }

    /// The work counter the DRR charges, given the cycle count `cycles` just read.
    #[inline]
    pub(crate) fn work(&self, cycles: u64) -> u64 {
        match self {
            Clock::System(_) => cycles,
            Clock::Virtual(v) => v.now_ns(),
        }
    }
}

const NIL: u32 = u32::MAX;

/// Where a tenant's buffer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Empty.
    Idle,
    /// Holds packets, not ready; it has an entry in the aging heap.
    Waiting,
    /// In the ready list.
    Ready,
    /// Ready, but another worker still owes this tenant's earlier packets (a hand-over).
    Parked,
}

/// One tenant's Packet Buffer: a FIFO list through the slab, and its DRR deficit.
#[derive(Clone, Copy, Debug)]
struct Queue {
    head: u32,
    tail: u32,
    len: u32,
    phase: Phase,
    deficit: i64,
}

const EMPTY: Queue = Queue {
    head: NIL,
    tail: NIL,
    len: 0,
    phase: Phase::Idle,
    deficit: 0,
};

/// Every tenant's Packet Buffer on one worker.
pub(crate) struct TenantBuffers {
    pub cfg: BufferConfig,
    slots: Vec<Option<PacketBuf>>,
    next: Vec<u32>,
    /// When each held packet arrived (the worker's clock, read once per burst).
    arrived: Vec<u64>,
    /// Each held packet's position in the worker's input (0 = the first it ever took).
    seq: Vec<u64>,
    free: Vec<u32>,
    queues: Vec<Queue>,
    /// The DRR's active list: tenants whose buffer is ready.
    ready: VecDeque<u32>,
    /// Waiting buffers by the time their oldest packet reaches the latency bound (may hold
    /// stale entries; each is checked against the buffer when it comes up).
    aging: BinaryHeap<Reverse<(u64, u32)>>,
    parked: Vec<u32>,
}

impl TenantBuffers {
    /// Buffers for tenant slots below `tenants`.
    pub(crate) fn new(cfg: BufferConfig, tenants: usize) -> Self {
        let cap = cfg.capacity.max(1);
        let cfg = BufferConfig {
            group: cfg.group.max(1),
            capacity: cap,
            quantum: cfg.quantum.max(1),
            ..cfg
        };
        TenantBuffers {
            cfg,
            slots: (0..cap).map(|_| None).collect(),
            next: vec![NIL; cap],
            arrived: vec![0; cap],
            seq: vec![0; cap],
            free: (0..cap as u32).rev().collect(),
            queues: vec![EMPTY; tenants],
            ready: VecDeque::with_capacity(tenants.min(1 << 16)),
            aging: BinaryHeap::with_capacity(cap),
            parked: Vec::new(),
        }
    }

    /// Packets held.
    pub(crate) fn held(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Free packet slots.
    pub(crate) fn room(&self) -> usize {
        self.free.len()
    }

    /// Doubles the slab (only when every buffer left is gated on a hand-over and a burst
    /// still has to go somewhere).
    pub(crate) fn grow(&mut self) {
        let old = self.slots.len();
        let new = old * 2;
        self.slots.resize_with(new, || None);
        self.next.resize(new, NIL);
        self.arrived.resize(new, 0);
        self.seq.resize(new, 0);
        self.free.extend((old..new).rev().map(|i| i as u32));
    }

    /// Adds a packet that arrived at `now`, the worker's `seq`-th, to its tenant's buffer;
    /// hands it back when the slab is full.
    pub(crate) fn push(&mut self, m: PacketBuf, now: u64, seq: u64) -> Result<(), PacketBuf> {
        let t = m.tenant.0 as usize;
        let Some(i) = self.free.pop() else {
            return Err(m);
        };
        if t >= self.queues.len() {
            // A slot beyond the table the buffers were sized for: grow once.
            self.queues.resize(t + 1, EMPTY);
        }
        let iu = i as usize;
        self.slots[iu] = Some(m);
        self.next[iu] = NIL;
        self.arrived[iu] = now;
        self.seq[iu] = seq;
        let group = self.cfg.group as u32;
        let q = &mut self.queues[t];
        if q.len == 0 {
            q.head = i;
        } else {
            self.next[q.tail as usize] = i;
        }
        q.tail = i;
        q.len += 1;
        match q.phase {
            Phase::Idle if q.len >= group => {
                q.phase = Phase::Ready;
                self.ready.push_back(t as u32);
            }
            Phase::Idle => {
                q.phase = Phase::Waiting;
                self.aging
                    .push(Reverse((now.saturating_add(self.cfg.latency_ns), t as u32)));
            }
            Phase::Waiting if q.len >= group => {
                q.phase = Phase::Ready;
                self.ready.push_back(t as u32);
            }
            _ => {}
        }
        Ok(())
    }

    /// Makes ready every waiting buffer whose oldest packet reached the latency bound.
    pub(crate) fn expire(&mut self, now: u64) {
        while let Some(&Reverse((due, t))) = self.aging.peek() {
            if due > now {
                break;
            }
            self.aging.pop();
            let q = &mut self.queues[t as usize];
            if q.phase == Phase::Waiting
                && self.arrived[q.head as usize].saturating_add(self.cfg.latency_ns) <= now
            {
                q.phase = Phase::Ready;
                self.ready.push_back(t);
            }
        }
    }

    /// Makes every waiting buffer ready (a flush).
    pub(crate) fn force_all(&mut self) {
        while let Some(Reverse((_, t))) = self.aging.pop() {
            let q = &mut self.queues[t as usize];
            if q.phase == Phase::Waiting {
                q.phase = Phase::Ready;
                self.ready.push_back(t);
            }
        }
    }

    /// Makes the oldest waiting buffers ready until ready buffers hold at least `need`
    /// packets or none is waiting (the slab is short of room).
    pub(crate) fn force_oldest(&mut self, need: usize) {
        let mut have: usize = self
            .ready
            .iter()
            .map(|&t| self.queues[t as usize].len as usize)
            .sum();
        while have < need {
            let Some(Reverse((_, t))) = self.aging.pop() else {
                break;
            };
            let q = &mut self.queues[t as usize];
            if q.phase == Phase::Waiting {
                q.phase = Phase::Ready;
                self.ready.push_back(t);
                have += q.len as usize;
            }
        }
    }

    /// Parked buffers whose tenant `open` now allows go back to the ready list.
    pub(crate) fn unpark(&mut self, open: impl Fn(u32) -> bool) {
        if self.parked.is_empty() {
            return;
        }
        let (queues, ready) = (&mut self.queues, &mut self.ready);
        self.parked.retain(|&t| {
            if open(t) {
                queues[t as usize].phase = Phase::Ready;
                ready.push_back(t);
                false
            } else {
                true
            }
        });
    }

    /// The input position of the oldest packet kept aside for a hand-over, if any.
    pub(crate) fn oldest_parked(&self) -> Option<u64> {
        self.parked
            .iter()
            .map(|&t| self.seq[self.queues[t as usize].head as usize])
            .min()
    }

    /// Buffers in the ready list now (one DRR round visits this many).
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// The next ready buffer's tenant.
    pub(crate) fn next_ready(&mut self) -> Option<u32> {
        self.ready.pop_front()
    }

    /// The tenant `k` places behind the front of the ready list (0: the next one
    /// [`next_ready`](Self::next_ready) returns), to prefetch what its visit touches.
    pub(crate) fn peek_ready(&self, k: usize) -> Option<u32> {
        self.ready.get(k).copied()
    }

    /// Starts loading tenant `t`'s queue head (its length, deficit, first packet).
    #[inline]
    pub(crate) fn prefetch_queue(&self, t: u32) {
        if let Some(q) = self.queues.get(t as usize) {
            crate::sys::prefetch(q, std::mem::size_of::<Queue>());
        }
    }

    /// Starts loading the headers of the first `max` packets in tenant `t`'s buffer
    /// (reads its queue head and the slab's links, which the visit reads anyway).
    #[inline]
    pub(crate) fn prefetch_headers(&self, t: u32, max: usize) {
        let Some(q) = self.queues.get(t as usize) else {
            return;
        };
        let mut i = q.head;
        for _ in 0..max.min(q.len as usize) {
            let Some(Some(m)) = self.slots.get(i as usize) else {
                return;
            };
            crate::sys::prefetch_headers(m.data());
            i = self.next[i as usize];
        }
    }

    /// Keeps tenant `t` (just taken from the ready list) aside until its hand-over ends.
    pub(crate) fn park(&mut self, t: u32) {
        self.queues[t as usize].phase = Phase::Parked;
        self.parked.push(t);
    }

    /// Tenant `t`'s DRR deficit.
    pub(crate) fn deficit(&mut self, t: u32) -> &mut i64 {
        &mut self.queues[t as usize].deficit
    }

    /// Packets in tenant `t`'s buffer.
    pub(crate) fn len(&self, t: u32) -> usize {
        self.queues[t as usize].len as usize
    }

    /// Whether tenant `t`'s oldest packet has reached the latency bound at `now`.
    pub(crate) fn aged(&self, t: u32, now: u64) -> bool {
        let q = &self.queues[t as usize];
        q.len > 0 && self.arrived[q.head as usize].saturating_add(self.cfg.latency_ns) <= now
    }

    /// Moves up to `max` packets of tenant `t`, oldest first, to the end of `out`.
    pub(crate) fn take(&mut self, t: u32, max: usize, out: &mut Vec<PacketBuf>) -> usize {
        let q = &mut self.queues[t as usize];
        let mut n = 0;
        while n < max && q.len > 0 {
            let i = q.head as usize;
            if let Some(m) = self.slots[i].take() {
                out.push(m);
            }
            q.head = self.next[i];
            q.len -= 1;
            self.free.push(i as u32);
            n += 1;
        }
        if q.len == 0 {
            q.head = NIL;
            q.tail = NIL;
        }
        n
    }

    /// Settles tenant `t` after its DRR visit: a buffer still ready (full, aged, or
    /// `force`) goes to the back of the ready list; an empty one goes idle, any other waits
    /// for the latency bound. A buffer that leaves the ready list forgets its credit but
    /// keeps its debt: the charge comes after the work, and a tenant that empties its buffer
    /// every round must not have the last group's overdraft forgiven each time.
    pub(crate) fn settle(&mut self, t: u32, now: u64, force: bool) {
        let group = self.cfg.group as u32;
        let bound = self.cfg.latency_ns;
        let q = &mut self.queues[t as usize];
        if q.len == 0 {
            q.phase = Phase::Idle;
            q.deficit = q.deficit.min(0);
            return;
        }
        let head_due = self.arrived[q.head as usize].saturating_add(bound);
        if force || q.len >= group || head_due <= now {
            q.phase = Phase::Ready;
            self.ready.push_back(t);
        } else {
            q.phase = Phase::Waiting;
            q.deficit = q.deficit.min(0);
            self.aging.push(Reverse((head_due, t)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_dispatch::TenantSlot;

    fn pkt(t: u32, seq: u64) -> PacketBuf {
        let mut m = PacketBuf::heap();
        m.tenant = TenantSlot(t);
        m.ts_ns = seq;
        m
    }

    #[test]
    fn a_buffer_is_ready_when_full_or_aged_and_keeps_fifo_order() {
        let cfg = BufferConfig {
            group: 4,
            latency_ns: 100,
            quantum: 1,
            capacity: 16,
        };
        let mut b = TenantBuffers::new(cfg, 8);
        for s in 0..3 {
            b.push(pkt(1, s), 0, 0).unwrap();
        }
        b.push(pkt(2, 10), 50, 0).unwrap();
        assert_eq!(b.ready_len(), 0);
        b.push(pkt(1, 3), 60, 0).unwrap();
        assert_eq!(b.next_ready(), Some(1));
        let mut out = Vec::new();
        assert_eq!(b.take(1, 3, &mut out), 3);
        b.settle(1, 60, false);
        // One left, arrived at 60: waits until 160.
        b.expire(149);
        assert_eq!(b.ready_len(), 0);
        b.expire(150);
        assert_eq!(
            b.next_ready(),
            Some(2),
            "tenant 2 arrived at 50, due at 150"
        );
        b.expire(160);
        assert_eq!(b.next_ready(), Some(1));
        b.take(1, 8, &mut out);
        assert_eq!(
            out.iter().map(|m| m.ts_ns).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(b.held(), 1);
    }

    #[test]
    fn a_full_slab_hands_the_packet_back() {
        let cfg = BufferConfig {
            capacity: 2,
            ..BufferConfig::default()
        };
        let mut b = TenantBuffers::new(cfg, 1);
        b.push(pkt(0, 0), 0, 0).unwrap();
        b.push(pkt(5, 1), 0, 0).unwrap();
        assert!(b.push(pkt(0, 2), 0, 0).is_err());
        assert_eq!(b.room(), 0);
        b.force_oldest(1);
        assert_eq!(b.ready_len(), 1);
        b.force_all();
        assert_eq!(b.ready_len(), 2);
    }
}
