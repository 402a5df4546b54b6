//! One worker thread: pop a burst, group it into per-tenant Packet Buffers, run the NF.
//!
//! A worker's burst comes from its input ring (filled by the software Packet Dispatcher)
//! or, when the Packet Dispatcher runs in the NIC path, from its own [`WorkerSource`]
//! (its AF_XDP socket) handed over when it is spawned.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrayvec::ArrayVec;
use buffet_dispatch::{TenantSlot, WorkerId};
use buffet_memory::{TenantEntry, TenantTable};
use buffet_sdk::{NetworkFunction, Packet, PacketMeta, Verdict, WorkerThreadError, GROUP_CHUNK};
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::Backoff;

use crate::stats::{bump, GroupTally, WorkerCounters};
use crate::sys;
use buffet_io::{Outcome, PacketBuf};

/// A message from a worker to the control side.
pub(crate) enum Notice {
    /// The handler panicked while processing this tenant's group.
    Fault {
        tenant: TenantSlot,
        worker: WorkerId,
        message: String,
    },
}

/// What a worker thread shares with the pipeline.
pub(crate) struct Shared<N: NetworkFunction> {
    pub nf: Arc<N>,
    pub table: Arc<TenantTable<N::State>>,
    /// Indexed by tenant slot; set once a tenant faulted.
    pub quarantined: Arc<[AtomicBool]>,
    pub notices: Arc<ArrayQueue<Notice>>,
}

impl<N: NetworkFunction> Clone for Shared<N> {
    fn clone(&self) -> Self {
        Shared {
            nf: self.nf.clone(),
            table: self.table.clone(),
            quarantined: self.quarantined.clone(),
            notices: self.notices.clone(),
        }
    }
}

/// A worker's own packet source, polled by its thread instead of its input ring: the
/// worker's AF_XDP socket when the XDP Packet Dispatcher already classified, scheduled
/// and tagged every frame (each frame's `tenant` is set).
pub trait WorkerSource: Send + 'static {
    /// Adds up to `max` frames to `burst`, each tagged with its tenant slot; frames that
    /// must not be processed (no tenant tag) go to `rejected`, handed back to the data
    /// plane untouched. Returns how many went to `burst`. Never blocks.
    fn receive(
        &mut self,
        burst: &mut Vec<PacketBuf>,
        rejected: &mut Vec<PacketBuf>,
        max: usize,
    ) -> usize;
}

pub(crate) struct WorkerThread<N: NetworkFunction> {
    pub engine: Worker<N>,
    pub rx: Arc<ArrayQueue<PacketBuf>>,
    /// Polled instead of `rx` when set.
    pub source: Option<Box<dyn WorkerSource>>,
    pub done: Arc<ArrayQueue<PacketBuf>>,
    pub stop: Arc<AtomicBool>,
    pub burst: usize,
    pub pin: Option<usize>,
    /// Told once the NF prepared the thread (or why it could not).
    pub ready: Option<std::sync::mpsc::SyncSender<Result<(), WorkerThreadError>>>,
}

/// What one worker does to a burst, without the thread around it: group by tenant into
/// Packet Buffers, load each tenant's state once, run the NF, account. The worker
/// threads run it; benchmarks and embedders can run it inline on their own core.
pub struct Worker<N: NetworkFunction> {
    id: WorkerId,
    shared: Shared<N>,
    counters: Arc<WorkerCounters>,
    groups: PacketBuffers,
    cache: EntryCache<N::State>,
}

impl<N: NetworkFunction> WorkerThread<N> {
    pub(crate) fn run(mut self) {
        if let Some(core) = self.pin {
            sys::pin_to_core(core);
        }
        let prepared = self.engine.shared.nf.prepare_worker_thread();
        let ok = prepared.is_ok();
        if let Some(ready) = self.ready.take() {
            let _ = ready.send(prepared);
        }
        if !ok {
            return;
        }
        let mut in_flight = InFlight {
            burst: Vec::with_capacity(self.burst),
            done: &self.done,
        };
        let burst = &mut in_flight.burst;
        let mut rejected: Vec<PacketBuf> = Vec::with_capacity(self.burst);
        let backoff = Backoff::new();
        loop {
            match &mut self.source {
                None => {
                    while burst.len() < self.burst {
                        match self.rx.pop() {
                            Some(m) => burst.push(m),
                            None => break,
                        }
                    }
                }
                Some(source) => {
                    source.receive(burst, &mut rejected, self.burst);
                    for m in rejected.drain(..) {
                        push_done(&self.done, m);
                    }
                }
            }
            if burst.is_empty() {
                if self.stop.load(Ordering::Acquire) && self.rx.is_empty() {
                    return;
                }
                if backoff.is_completed() {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                } else {
                    backoff.snooze();
                }
                continue;
            }
            backoff.reset();
            self.engine.process(burst);
            for m in burst.drain(..) {
                push_done(&self.done, m);
            }
        }
    }
}

/// The burst a worker thread holds. Should the thread die outside a handler (a panic
/// the per-group containment does not cover), its frames still go back to the data plane
/// on the way out, those it had not finished still `Pending`: the data plane counts them
/// as lost with the worker, under their tenants, instead of losing track of them.
struct InFlight<'a> {
    burst: Vec<PacketBuf>,
    done: &'a ArrayQueue<PacketBuf>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for m in self.burst.drain(..) {
                push_done(self.done, m);
            }
        }
    }
}

/// Hands a frame back to the data plane, waiting while its completion ring is full.
#[inline]
fn push_done(done: &ArrayQueue<PacketBuf>, m: PacketBuf) {
    let mut m = m;
    let back = Backoff::new();
    while let Err(again) = done.push(m) {
        m = again;
        back.snooze();
    }
}

impl<N: NetworkFunction> Worker<N> {
    pub(crate) fn with_shared(
        id: WorkerId,
        shared: Shared<N>,
        counters: Arc<WorkerCounters>,
    ) -> Self {
        Worker {
            id,
            shared,
            counters,
            groups: PacketBuffers::default(),
            cache: EntryCache::default(),
        }
    }

    /// An engine over `table` (tenant slots below `capacity`), for running bursts
    /// inline. Tenant ids in packet metadata come from the table.
    pub fn new(nf: Arc<N>, table: Arc<TenantTable<N::State>>) -> Self {
        let cap = table.capacity();
        let shared = Shared {
            nf,
            table,
            quarantined: (0..cap).map(|_| AtomicBool::new(false)).collect(),
            notices: Arc::new(ArrayQueue::new(64)),
        };
        Worker {
            id: WorkerId(0),
            shared,
            counters: Arc::new(WorkerCounters::new(cap)),
            groups: PacketBuffers::default(),
            cache: EntryCache::default(),
        }
    }

    /// Packets processed so far.
    pub fn packets(&self) -> u64 {
        self.counters.packets.load(Ordering::Relaxed)
    }

    /// Runs one burst: group it by tenant into Packet Buffers (a counting sort over
    /// indices, O(burst), stable, no allocation), then one state load per group. Each
    /// mbuf's `outcome` holds the result afterwards.
    pub fn process(&mut self, burst: &mut [PacketBuf]) {
        let t0 = sys::cycles();
        let mut groups = std::mem::take(&mut self.groups);
        let mut cache = std::mem::take(&mut self.cache);
        groups.build(burst);
        cache.revalidate(&self.shared.table);
        let mut t = t0;
        for g in 0..groups.active.len() {
            let (tenant, members) = groups.group(g);
            let entry = cache.lookup(&self.shared.table, tenant);
            t = self.run_group(TenantSlot(tenant), entry, burst, members, t);
        }
        self.groups = groups;
        self.cache = cache;
        bump(&self.counters.packets, burst.len() as u64);
        bump(&self.counters.bursts, 1);
        bump(&self.counters.busy_cycles, t.wrapping_sub(t0));
    }

    /// Runs the packets `members` (indices into `burst`) of one tenant; `t0` is the
    /// cycle count when the group started, the return value when it ended.
    fn run_group(
        &self,
        tenant: TenantSlot,
        entry: Option<&TenantEntry<N::State>>,
        burst: &mut [PacketBuf],
        members: &[u32],
        t0: u64,
    ) -> u64 {
        let idx = tenant.0 as usize;
        let mut tally = GroupTally::default();
        let quarantined = self
            .shared
            .quarantined
            .get(idx)
            .is_none_or(|q| q.load(Ordering::Acquire));
        match (entry, quarantined) {
            (Some(entry), false) => {
                let id = entry.id();
                let nf = &*self.shared.nf;
                let mut state = entry.lock();
                // Chunks of up to GROUP_CHUNK packets: parse them, one `handle_group`
                // call, count.
                let result = catch_unwind(AssertUnwindSafe(|| {
                    for chunk in members.chunks(GROUP_CHUNK) {
                        if !run_chunk(nf, &mut state, id, burst, chunk, &mut tally) {
                            // A fault verdict: the rest of the group stays pending and is
                            // quarantined below.
                            break;
                        }
                    }
                }));
                drop(state);
                let result = match result {
                    Ok(())
                        if members
                            .iter()
                            .any(|&i| burst[i as usize].outcome == Outcome::Pending) =>
                    {
                        Err(Box::new("the NF reported a fault (Verdict::Fault)")
                            as Box<dyn std::any::Any + Send>)
                    }
                    other => other,
                };
                if let Err(panic) = result {
                    tally.quarantined +=
                        self.quarantine(tenant, panic_message(&*panic), burst, members);
                    tally.bytes = group_bytes(burst, members);
                }
            }
            (Some(_), true) => {
                tally.quarantined = members.len() as u64;
                tally.bytes = group_bytes(burst, members);
                members
                    .iter()
                    .for_each(|&i| burst[i as usize].outcome = Outcome::Quarantined);
            }
            (None, _) => {
                tally.no_tenant = members.len() as u64;
                tally.bytes = group_bytes(burst, members);
                members
                    .iter()
                    .for_each(|&i| burst[i as usize].outcome = Outcome::NoTenant);
            }
        }
        tally.packets = members.len() as u64;
        let t1 = sys::cycles();
        if let Some(row) = self.counters.tenants.get(idx) {
            row.publish(&tally, t1.wrapping_sub(t0));
        }
        t1
    }

    fn quarantine(
        &self,
        tenant: TenantSlot,
        message: String,
        burst: &mut [PacketBuf],
        members: &[u32],
    ) -> u64 {
        if let Some(q) = self.shared.quarantined.get(tenant.0 as usize) {
            q.store(true, Ordering::Release);
        }
        // Packets of the faulting group that had not completed are dropped as quarantined;
        // the ones the handler finished before the fault keep their verdicts.
        let mut dropped = 0;
        for &i in members {
            let m = &mut burst[i as usize];
            if m.outcome == Outcome::Pending {
                m.outcome = Outcome::Quarantined;
                dropped += 1;
            }
        }
        let _ = self.shared.notices.push(Notice::Fault {
            tenant,
            worker: self.id,
            message,
        });
        dropped
    }
}

/// Runs one chunk of a tenant's group: `chunk` holds ascending burst indices, at most
/// [`GROUP_CHUNK`]. Parses each packet (malformed ones are counted and never reach the
/// NF), hands the parsed ones to `handle_group` in one call, and records every outcome in
/// arrival order. Returns false when the NF reported a fault: that packet and the ones
/// after it stay pending. A panic in the NF is re-raised after the verdicts already
/// written are recorded, so the packets before it keep theirs.
fn run_chunk<N: NetworkFunction>(
    nf: &N,
    state: &mut N::State,
    id: buffet_sdk::TenantId,
    burst: &mut [PacketBuf],
    chunk: &[u32],
    tally: &mut GroupTally,
) -> bool {
    debug_assert!(chunk.len() <= GROUP_CHUNK && chunk.windows(2).all(|w| w[0] < w[1]));
    let mut verdicts = [Verdict::Fault; GROUP_CHUNK];
    let mut lens = [0usize; GROUP_CHUNK];
    // Per chunk position: the index into `pkts`, or None when the frame did not parse.
    let mut parsed: ArrayVec<Option<usize>, GROUP_CHUNK> = ArrayVec::new();
    let panicked = {
        let mut pkts: ArrayVec<Packet<'_>, GROUP_CHUNK> = ArrayVec::new();
        // Disjoint `&mut` to the members: walk the burst once, splitting at each index.
        let mut rest: &mut [PacketBuf] = burst;
        let mut base = 0usize;
        for &i in chunk {
            let i = i as usize;
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - base);
            let Some((m, tail)) = tail.split_first_mut() else {
                break;
            };
            rest = tail;
            base = i + 1;
            tally.bytes += m.len() as u64;
            let meta = PacketMeta {
                in_port: m.in_port,
                ts_ns: m.ts_ns,
                tenant: id,
            };
            let len = m.len();
            // The dispatcher's parse travels with the packet; parse here only without one.
            let parsed_pkt = match m.layout {
                Some(layout) => Packet::from_layout(m.buffer_mut(), len, meta, layout),
                None => Packet::parse_with_capacity(m.buffer_mut(), len, meta),
            };
            match parsed_pkt {
                Ok(pkt) => {
                    parsed.push(Some(pkts.len()));
                    pkts.push(pkt);
                }
                Err(_) => parsed.push(None),
            }
        }
        let n = pkts.len();
        let r = catch_unwind(AssertUnwindSafe(|| {
            nf.handle_group(&mut pkts, state, &mut verdicts[..n])
        }));
        for (l, p) in lens.iter_mut().zip(&pkts) {
            *l = p.len();
        }
        r.err()
    };
    let mut go_on = true;
    for (&i, &slot) in chunk.iter().zip(&parsed) {
        let m = &mut burst[i as usize];
        let Some(k) = slot else {
            tally.malformed += 1;
            m.outcome = Outcome::Malformed;
            continue;
        };
        match verdicts[k] {
            // Left pending: the rest of the group is quarantined.
            Verdict::Fault => {
                go_on = false;
                break;
            }
            Verdict::Drop(cause) => {
                tally.nf_drops[cause.index()] += 1;
                m.outcome = Outcome::Nf(Verdict::Drop(cause));
            }
            v => {
                tally.passed += 1;
                m.set_len(lens[k]);
                m.layout = None;
                m.outcome = Outcome::Nf(v);
            }
        }
    }
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
    go_on
}

fn group_bytes(burst: &[PacketBuf], members: &[u32]) -> u64 {
    members
        .iter()
        .map(|&i| burst[i as usize].len() as u64)
        .sum()
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "handler panicked".to_string()
    }
}

/// A worker's cache of Tenant Table entries, revalidated by slot generation: a hit costs
/// one plain load instead of an atomic reference-count round trip per Packet Buffer.
/// When anything in the table changed, entries whose slot moved on are dropped, so a
/// removed tenant's region is released even if its slot is never seen again.
struct EntryCache<S> {
    entries: Vec<Option<(u64, Arc<TenantEntry<S>>)>>,
    /// Slots with a cached entry.
    cached: Vec<u32>,
    seen_changes: u64,
}

impl<S> Default for EntryCache<S> {
    fn default() -> Self {
        EntryCache {
            entries: Vec::new(),
            cached: Vec::new(),
            seen_changes: 0,
        }
    }
}

impl<S: Send + 'static> EntryCache<S> {
    fn revalidate(&mut self, table: &TenantTable<S>) {
        let changes = table.changes();
        if changes == self.seen_changes {
            return;
        }
        self.seen_changes = changes;
        let entries = &mut self.entries;
        self.cached.retain(|&slot| {
            let keep =
                matches!(&entries[slot as usize], Some((g, _)) if *g == table.generation(TenantSlot(slot)));
            if !keep {
                entries[slot as usize] = None;
            }
            keep
        });
    }

    #[inline]
    fn lookup(&mut self, table: &TenantTable<S>, slot: u32) -> Option<&TenantEntry<S>> {
        let i = slot as usize;
        let generation = table.generation(TenantSlot(slot));
        if i >= self.entries.len() {
            self.entries
                .resize_with((i + 1).max(table.capacity() as usize), || None);
        }
        let hit = matches!(&self.entries[i], Some((g, _)) if *g == generation);
        if !hit {
            let was_cached = self.entries[i].is_some();
            self.entries[i] = table.get_arc(TenantSlot(slot)).map(|e| (generation, e));
            match (was_cached, self.entries[i].is_some()) {
                (false, true) => self.cached.push(slot),
                (true, false) => self.cached.retain(|&s| s != slot),
                _ => {}
            }
        }
        self.entries[i].as_ref().map(|(_, e)| &**e)
    }
}

/// Per-worker scratch for grouping a burst into Packet Buffers by tenant slot.
///
/// Counting sort over indices: the per-slot arrays are sized to the Tenant Table once;
/// `epoch` marks which slots this burst touched, so nothing is cleared per burst.
#[derive(Default)]
struct PacketBuffers {
    epoch: u32,
    seen: Vec<u32>,
    count: Vec<u32>,
    /// Slots of this burst in first-seen order.
    active: Vec<u32>,
    /// Start of each active group in `order`.
    starts: Vec<u32>,
    /// Burst indices grouped by tenant, arrival order within a group.
    order: Vec<u32>,
    /// Each packet's tenant slot, read once from its mbuf.
    tags: Vec<u32>,
}

impl PacketBuffers {
    fn build(&mut self, burst: &[PacketBuf]) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
        self.active.clear();
        self.tags.clear();
        for m in burst {
            // The groups run in tenant order, not arrival order: start loading each
            // frame's headers now, while the walk is sequential, so the parse of a
            // group does not wait for memory packet by packet (the tag lives in the
            // `PacketBuf`, apart from the frame, so this walk touches no frame itself).
            sys::prefetch_headers(m.data());
            let t = m.tenant.0 as usize;
            self.tags.push(t as u32);
            if t >= self.seen.len() {
                self.seen.resize(t + 1, 0);
                self.count.resize(t + 1, 0);
            }
            if self.seen[t] != self.epoch {
                self.seen[t] = self.epoch;
                self.count[t] = 0;
                self.active.push(t as u32);
            }
            self.count[t] += 1;
        }
        self.starts.clear();
        let mut at = 0u32;
        for &t in &self.active {
            self.starts.push(at);
            let n = self.count[t as usize];
            // `count` now holds the next write position of the group.
            self.count[t as usize] = at;
            at += n;
        }
        self.order.clear();
        self.order.resize(burst.len(), 0);
        for (i, &t) in self.tags.iter().enumerate() {
            let t = t as usize;
            self.order[self.count[t] as usize] = i as u32;
            self.count[t] += 1;
        }
    }

    /// Group `g`: its tenant slot and the burst indices of its packets.
    fn group(&self, g: usize) -> (u32, &[u32]) {
        let start = self.starts[g] as usize;
        let end = self
            .starts
            .get(g + 1)
            .map_or(self.order.len(), |&e| e as usize);
        (self.active[g], &self.order[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_stable_and_complete() {
        let burst: Vec<PacketBuf> = [3u32, 1, 3, 2, 1, 3]
            .iter()
            .map(|t| {
                let mut m = PacketBuf::heap();
                m.tenant = TenantSlot(*t);
                m
            })
            .collect();
        let mut g = PacketBuffers::default();
        for _ in 0..3 {
            g.build(&burst);
            let got: Vec<(u32, Vec<u32>)> = (0..g.active.len())
                .map(|i| (g.group(i).0, g.group(i).1.to_vec()))
                .collect();
            assert_eq!(got, vec![(3, vec![0, 2, 5]), (1, vec![1, 4]), (2, vec![3])]);
        }
        g.build(&burst[..1]);
        assert_eq!((g.group(0).0, g.group(0).1), (3, &[0u32][..]));
    }
}
