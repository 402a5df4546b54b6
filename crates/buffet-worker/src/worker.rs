//! One worker thread: pop a burst, add it to the per-tenant Packet Buffers, serve the
//! ready buffers by weighted deficit round robin, run the NF once per group.
//!
//! A worker's burst comes from its input ring (filled by the software Packet Dispatcher)
//! or, when the Packet Dispatcher runs in the NIC path, from its own [`WorkerSource`]
//! (its AF_XDP socket) handed over when it is spawned.
//!
//! With persistent buffers configured (`PipelineConfig::flush_packets`), Packet Buffers
//! persist across bursts ([`Worker::enqueue`], see the `buffers` module):
//! a tenant's group runs once its buffer holds a full group or its oldest packet reached
//! the latency bound, and every buffer is flushed when the input runs dry, when the data
//! plane asks (a migration hand-over, a removal) and before the thread exits. Within a
//! tenant, packets always leave in arrival order. The ready buffers are served by a
//! weighted deficit round robin charged in the CPU cycles of the NF work each group took
//! (measured anyway for accounting), so a tenant whose packets are expensive gets the
//! same share of the worker's time as a cheap one of equal weight, not the same share of
//! packets. [`Worker::process`] keeps the one-burst form: group one burst and run it all.

use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;
use buffet_dispatch::{TenantSlot, WorkerId};
use buffet_memory::{EnterError, StateGuard, TenantEntry, TenantTable};
use buffet_sdk::{NetworkFunction, Packet, PacketMeta, Verdict, WorkerThreadError, GROUP_CHUNK};
use crossbeam::queue::ArrayQueue;

use crate::buffers::{BufferConfig, Clock, ClockSource, TenantBuffers};
use crate::completions::Completions;
use crate::idle::{Idle, IdleShared, Waker};
use crate::stats::{bump, Drops, GroupTally, WorkerCounters, RUNNING_WAITS};
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
    /// Indexed by tenant slot: the tenant's DRR weight (at least 1).
    pub weights: Arc<[AtomicU32]>,
    /// Indexed by tenant slot: [`GATE_OPEN`], or the worker that alone may run the
    /// tenant while it still holds the tenant's packets from before a migration.
    pub gates: Arc<[AtomicU32]>,
}

/// A tenant's gate when no hand-over is pending: its current worker runs it.
pub(crate) const GATE_OPEN: u32 = u32::MAX;

impl<N: NetworkFunction> Shared<N> {
    /// Shared state for an NF over `table`, every tenant unquarantined, weight 1, no
    /// hand-over pending.
    pub(crate) fn new(nf: Arc<N>, table: Arc<TenantTable<N::State>>, notices: usize) -> Self {
        let cap = table.capacity();
        Shared {
            nf,
            table,
            quarantined: (0..cap).map(|_| AtomicBool::new(false)).collect(),
            notices: Arc::new(ArrayQueue::new(notices)),
            weights: (0..cap).map(|_| AtomicU32::new(1)).collect(),
            gates: (0..cap).map(|_| AtomicU32::new(GATE_OPEN)).collect(),
        }
    }
}

/// A flush request from the data plane to one worker thread, and its answer.
#[derive(Default)]
pub(crate) struct FlushSync {
    /// Asked: flush every buffer once at least this many packets were taken from the ring.
    pub until: AtomicU64,
    /// Answered: every packet among the first `done` taken from the ring has been run and
    /// handed back, except those of tenants gated on another worker's hand-over.
    pub done: AtomicU64,
}

impl<N: NetworkFunction> Clone for Shared<N> {
    fn clone(&self) -> Self {
        Shared {
            nf: self.nf.clone(),
            table: self.table.clone(),
            quarantined: self.quarantined.clone(),
            notices: self.notices.clone(),
            weights: self.weights.clone(),
            gates: self.gates.clone(),
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

    /// Descriptors that `poll(2)` reports readable whenever the source has frames, on
    /// which an idle worker blocks instead of polling (see [`crate::IDLE_AFTER`]); `None`
    /// (the default): the source must be polled, and the worker only naps briefly.
    fn readiness_fds(&self) -> Option<Vec<std::os::fd::RawFd>> {
        None
    }
}

pub(crate) struct WorkerThread<N: NetworkFunction> {
    pub engine: Worker<N>,
    pub rx: Arc<ArrayQueue<PacketBuf>>,
    /// Polled instead of `rx` when set.
    pub source: Option<Box<dyn WorkerSource>>,
    pub done: Arc<Completions>,
    pub stop: Arc<AtomicBool>,
    pub flush: Arc<FlushSync>,
    /// The idle wait.
    pub idle: Arc<IdleShared>,
    /// Woken by the data plane when it hands this worker frames, a flush or stop.
    pub waker: Arc<Waker>,
    /// The data plane's: woken when this worker hands frames back.
    pub dataplane: Arc<Waker>,
    pub burst: usize,
    pub pin: Option<usize>,
    /// Told once the NF prepared the thread (or why it could not).
    /// Told once the thread is prepared: its kernel thread id, or why it cannot run.
    pub ready: Option<std::sync::mpsc::SyncSender<Result<Option<i32>, WorkerThreadError>>>,
}

/// What one worker does to its packets, without the thread around it: keep them in
/// per-tenant Packet Buffers, load each tenant's state once per group, run the NF,
/// account. The worker threads run it; benchmarks and embedders can run it inline on
/// their own core.
pub struct Worker<N: NetworkFunction> {
    id: WorkerId,
    shared: Shared<N>,
    counters: Arc<WorkerCounters>,
    groups: PacketBuffers,
    cache: EntryCache<N::State>,
    /// Persistent Packet Buffers (`None`: each burst's groups run at once).
    buffers: Option<TenantBuffers>,
    clock: Clock,
    /// `0, 1, 2, …`: the member indices of a group taken from its buffer (it runs at the
    /// end of the output vector).
    members: Vec<u32>,
    /// Packets taken in by [`enqueue`](Self::enqueue) so far.
    taken: u64,
    /// Which bursts [`process`](Self::process) times its small groups in.
    sampler: CycleSampler,
}

impl<N: NetworkFunction> WorkerThread<N> {
    pub(crate) fn run(mut self) {
        if let Some(core) = self.pin {
            sys::pin_to_core(core);
        }
        let prepared = self.engine.shared.nf.prepare_worker_thread();
        let ok = prepared.is_ok();
        if let Some(ready) = self.ready.take() {
            let _ = ready.send(prepared.map(|()| sys::current_tid()));
        }
        if !ok {
            return;
        }
        let mut in_flight = InFlight {
            burst: Vec::with_capacity(self.burst),
            out: Vec::with_capacity(self.engine.capacity() + self.burst),
            done: self.done.clone(),
            dataplane: self.dataplane.clone(),
        };
        let InFlight { burst, out, .. } = &mut in_flight;
        let mut rejected: Vec<PacketBuf> = Vec::with_capacity(self.burst);
        // How many of the packets taken from the input are known run and handed back.
        let mut acked = 0u64;
        let mut idle = Idle::new();
        // An idle worker blocks on its waker, and on its own source's descriptors (its
        // for its life; a source that cannot name them must be polled).
        let own_fds: Option<Vec<RawFd>> = match &self.source {
            None => Some(Vec::new()),
            Some(s) => s.readiness_fds(),
        };
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
                    let n = source.receive(burst, &mut rejected, self.burst) + rejected.len();
                    if n > 0 {
                        bump(&self.engine.counters.received, n as u64);
                    }
                    for m in &mut rejected {
                        // A frame the source turned away without saying why had no
                        // tenant tag: not a tenant's, and not lost by this worker.
                        if m.outcome == Outcome::Pending {
                            m.outcome = Outcome::Untagged;
                        }
                    }
                    if !rejected.is_empty() {
                        self.done.send(&mut rejected);
                        self.dataplane.wake();
                    }
                }
            }
            if !burst.is_empty() {
                idle.busy();
                self.engine.enqueue(burst, out);
                self.done.send(out);
                self.dataplane.wake();
                if self.flush.until.load(Ordering::Acquire) > acked {
                    self.flush_all(out);
                    acked = self.engine.settled();
                    self.flush.done.store(acked, Ordering::Release);
                }
                continue;
            }
            // Nothing new: a worker with time to spare holds nothing back.
            if self.engine.held() > 0 {
                self.flush_all(out);
            }
            if acked < self.engine.settled() {
                acked = self.engine.settled();
                self.flush.done.store(acked, Ordering::Release);
            }
            if self.engine.held() == 0 {
                // Published after the frames it handed back (see
                // `Control::worker_progress`).
                self.engine.counters.idle.fetch_add(1, Ordering::Release);
            }
            if self.stop.load(Ordering::Acquire) && self.rx.is_empty() && self.engine.held() == 0 {
                self.flush.done.store(u64::MAX, Ordering::Release);
                return;
            }
            // Blocks only with nothing held back (a gated tenant's packets wait for a
            // hand-over the worker must keep looking at).
            let wait = if self.engine.held() == 0 {
                self.idle.wait()
            } else {
                Duration::ZERO
            };
            let (rx, stop, flush) = (&self.rx, &self.stop, &self.flush);
            // A worker's own descriptors are AF_XDP sockets, which never report an error
            // condition to poll(2) (their interface's loss reaches the data plane's port).
            let _failed = idle.empty(
                wait,
                &self.waker,
                own_fds.as_deref(),
                || {
                    !rx.is_empty()
                        || stop.load(Ordering::SeqCst)
                        || flush.until.load(Ordering::SeqCst) > acked
                },
                || std::thread::sleep(Duration::from_micros(20)),
            );
        }
    }

    /// Runs every Packet Buffer not gated on a hand-over and hands the packets back.
    fn flush_all(&mut self, out: &mut Vec<PacketBuf>) {
        self.engine.flush(out);
        self.done.send(out);
        self.dataplane.wake();
    }
}

/// The burst a worker thread holds. Should the thread die outside a handler (a panic
/// the per-group containment does not cover), its frames still go back to the data plane
/// on the way out, those it had not finished still `Pending`: the data plane counts them
/// as lost with the worker, under their tenants, instead of losing track of them.
struct InFlight {
    burst: Vec<PacketBuf>,
    /// Packets run and not yet handed back.
    out: Vec<PacketBuf>,
    done: Arc<Completions>,
    /// Woken once the frames are back.
    dataplane: Arc<Waker>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.done.send(&mut self.burst);
            self.done.send(&mut self.out);
            self.dataplane.wake();
        }
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
            buffers: None,
            clock: Clock::new(&ClockSource::System),
            members: Vec::new(),
            taken: 0,
            sampler: CycleSampler::new(u64::from(id.0)),
        }
    }

    /// An engine over `table` (tenant slots below `capacity`), for running bursts
    /// inline. Tenant ids in packet metadata come from the table. Without
    /// [`with_buffers`](Self::with_buffers), [`enqueue`](Self::enqueue) runs each burst
    /// at once, as [`process`](Self::process) does.
    pub fn new(nf: Arc<N>, table: Arc<TenantTable<N::State>>) -> Self {
        let cap = table.capacity();
        Self::with_shared(
            WorkerId(0),
            Shared::new(nf, table, 64),
            Arc::new(WorkerCounters::new(cap)),
        )
    }

    /// Keeps packets in persistent per-tenant Packet Buffers (see [`enqueue`](Self::enqueue)),
    /// served by weighted deficit round robin, with time read from `clock`.
    pub fn with_buffers(mut self, cfg: BufferConfig, clock: ClockSource) -> Self {
        let cfg = BufferConfig {
            group: cfg.group.max(1),
            ..cfg
        };
        self.buffers = Some(TenantBuffers::new(
            cfg,
            self.shared.table.capacity() as usize,
        ));
        self.clock = Clock::new(&clock);
        self.members = (0..cfg.group as u32).collect();
        self
    }

    /// Sets tenant `tenant`'s DRR weight (0 counts as 1); its quantum is its weight
    /// times the configured quantum.
    pub fn set_weight(&self, tenant: TenantSlot, weight: u32) {
        if let Some(w) = self.shared.weights.get(tenant.index()) {
            w.store(weight.max(1), Ordering::Relaxed);
        }
    }

    /// Packets held in Packet Buffers, waiting for their group to run.
    pub fn held(&self) -> usize {
        self.buffers.as_ref().map_or(0, TenantBuffers::held)
    }

    /// Packets the Packet Buffers hold before the oldest waiting ones are forced out.
    pub fn capacity(&self) -> usize {
        self.buffers.as_ref().map_or(0, |b| b.cfg.capacity)
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
        // With few tenants their rows stay in cache and prefetching them only costs
        // instructions (measured: 9 % slower at 64 tenants, 1.8x faster at 10,000): below
        // FAR_TENANTS the grouping pass loads the headers, as it always did, and nothing
        // else is prefetched.
        let far = cache.cached.len() >= FAR_TENANTS;
        groups.build(burst, !far);
        cache.revalidate(&self.shared.table);
        let view = groups.view();
        let n = view.len();
        // The groups' order is known now: prime the first groups' rows and headers, then
        // keep loading the rows of the group ROWS_AHEAD on, the entry and state of the one
        // ENTRY_AHEAD on, and the headers of the one HEADERS_AHEAD on, while each runs.
        let ahead = if far { n } else { 0 };
        for g in 0..ahead.min(ROWS_AHEAD) {
            self.prefetch_rows(&cache, view.tenant(g));
        }
        for g in 0..ahead.min(HEADERS_AHEAD) {
            prefetch_group_headers(burst, view.group(g).1);
        }
        // The end of the last timed group (the burst's start before the first group):
        // `None` after a group that was not timed.
        let mut last = Some(t0);
        // The shortest group this burst times (see `CycleSampler`).
        let timed_from = CycleSampler::timed_from(self.sampler.burst());
        // One `catch_unwind` for the burst, not one per group (a closure call and its
        // captures cost about 60 instructions per group, docs/results/notes.md): should a
        // group's NF panic, its tenant is quarantined here and the burst goes on with
        // the next group, in a fresh `catch_unwind`. `g`, `tally` and `start` live out
        // here so the handler knows which group panicked, what it had counted and when it
        // began. `in_group` tells a group's panic from one in the loop's own steps
        // (dropping a replaced tenant's state on a cache miss, say), which is raised
        // again: the worker dies outside a handler, as it always did.
        let mut g = 0usize;
        let mut tally = GroupTally::default();
        let mut start: Option<u64> = None;
        let mut in_group = false;
        while g < n {
            let run = catch_unwind(AssertUnwindSafe(|| {
                while g < n {
                    if far {
                        if g + ROWS_AHEAD < n {
                            self.prefetch_rows(&cache, view.tenant(g + ROWS_AHEAD));
                        }
                        if g + ENTRY_AHEAD < n {
                            cache.prefetch_entry(view.tenant(g + ENTRY_AHEAD));
                        }
                        if g + HEADERS_AHEAD < n {
                            prefetch_group_headers(burst, view.group(g + HEADERS_AHEAD).1);
                        }
                    }
                    let (tenant, members) = view.group(g);
                    let entry = cache.lookup(&self.shared.table, tenant);
                    // The tenant's counter row, looked up once for its drops and its tally.
                    let row = self.counters.tenants.get(tenant as usize);
                    start = (members.len() >= timed_from).then(|| last.unwrap_or_else(sys::cycles));
                    tally = GroupTally::default();
                    // Below FAR_TENANTS the grouping pass loaded every header already.
                    in_group = true;
                    self.run_unguarded(
                        TenantSlot(tenant),
                        entry,
                        burst,
                        members,
                        far,
                        Drops(row),
                        &mut tally,
                    );
                    in_group = false;
                    last = stamp(start);
                    if let Some(row) = row {
                        row.publish(&tally, charged(start, last, members.len()));
                    }
                    g += 1;
                }
            }));
            if let Err(panic) = run {
                if !in_group {
                    std::panic::resume_unwind(panic);
                }
                in_group = false;
                // Group `g`'s NF panicked (its state lock was released on the way out).
                let (tenant, members) = view.group(g);
                self.fault(TenantSlot(tenant), panic, burst, members, &mut tally);
                last = stamp(start);
                self.publish(tenant, &tally, charged(start, last, members.len()));
                g += 1;
            }
        }
        self.groups = groups;
        self.cache = cache;
        let end = last.unwrap_or_else(sys::cycles);
        bump(&self.counters.packets, burst.len() as u64);
        bump(&self.counters.bursts, 1);
        bump(&self.counters.busy_cycles, end.wrapping_sub(t0));
    }

    /// Adds `burst` to the tenants' Packet Buffers and serves the buffers that are ready
    /// (full, or their oldest packet older than the latency bound) in weighted deficit
    /// round robin rounds until none is ready, checking the latency bound again after
    /// each round: the worker is work-conserving, and while several tenants are
    /// backlogged the DRR decides whose packets go first, by weight and by the work their
    /// groups took. Every packet run is moved to `out` with its outcome.
    /// Without persistent buffers, runs the whole burst as [`process`](Self::process)
    /// does and moves it to `out`. No allocation: the buffers share a preallocated slab;
    /// when it is short of room the oldest buffers run first.
    pub fn enqueue(&mut self, burst: &mut Vec<PacketBuf>, out: &mut Vec<PacketBuf>) {
        let Some(mut bufs) = self.buffers.take() else {
            self.taken += burst.len() as u64;
            self.process(burst);
            out.append(burst);
            return;
        };
        let t0 = sys::cycles();
        let before = out.len();
        let now = self.clock.now_ns();
        bufs.unpark(|t| self.gate_open(t));
        if bufs.room() < burst.len() {
            bufs.force_oldest(burst.len() - bufs.room());
            while bufs.room() < burst.len() && bufs.ready_len() > 0 {
                self.round(&mut bufs, out, now, false);
            }
        }
        for m in burst.drain(..) {
            let seq = self.taken;
            self.taken += 1;
            if let Err(m) = bufs.push(m, now, seq) {
                // Every buffer left is gated on a hand-over: grow rather than reorder.
                bufs.grow();
                let _ = bufs.push(m, now, seq);
            }
        }
        let mut now = now;
        loop {
            bufs.expire(now);
            if bufs.ready_len() == 0 {
                break;
            }
            self.round(&mut bufs, out, now, false);
            now = self.clock.now_ns();
        }
        self.buffers = Some(bufs);
        self.account(out.len() - before, t0);
    }

    /// Runs every Packet Buffer now, in DRR order, and moves the packets to `out`. A
    /// tenant gated on another worker's hand-over keeps its packets until the gate opens.
    pub fn flush(&mut self, out: &mut Vec<PacketBuf>) {
        let Some(mut bufs) = self.buffers.take() else {
            return;
        };
        let t0 = sys::cycles();
        let before = out.len();
        loop {
            let now = self.clock.now_ns();
            bufs.unpark(|t| self.gate_open(t));
            bufs.force_all();
            if bufs.ready_len() == 0 {
                break;
            }
            self.round(&mut bufs, out, now, true);
        }
        self.buffers = Some(bufs);
        self.account(out.len() - before, t0);
    }

    /// How many of the packets taken in so far are known run and handed back after a
    /// [`flush`](Self::flush): all of them but those from the oldest packet kept aside for
    /// a hand-over on.
    pub(crate) fn settled(&self) -> u64 {
        self.buffers
            .as_ref()
            .and_then(TenantBuffers::oldest_parked)
            .unwrap_or(self.taken)
    }

    fn account(&self, packets: usize, t0: u64) {
        if packets > 0 {
            bump(&self.counters.packets, packets as u64);
            bump(&self.counters.bursts, 1);
            bump(&self.counters.busy_cycles, sys::cycles().wrapping_sub(t0));
        }
    }

    /// Whether this worker may run tenant `t` now (no other worker still owes its
    /// earlier packets).
    #[inline]
    fn gate_open(&self, t: u32) -> bool {
        self.shared.gates.get(t as usize).is_none_or(|g| {
            let v = g.load(Ordering::Acquire);
            v == GATE_OPEN || v == u32::from(self.id.0)
        })
    }

    /// One weighted deficit round robin round: each buffer ready when the round starts
    /// is visited once, its deficit grows by weight × quantum, and it runs groups (oldest
    /// packets first, at most a full group each) while its deficit is positive and it is
    /// still ready, each group charged the work it took. `force`: every non-empty buffer
    /// counts as ready. Returns the packets run.
    fn round(
        &mut self,
        bufs: &mut TenantBuffers,
        out: &mut Vec<PacketBuf>,
        now: u64,
        force: bool,
    ) -> usize {
        let mut cache = std::mem::take(&mut self.cache);
        cache.revalidate(&self.shared.table);
        let (group, quantum) = (bufs.cfg.group, bufs.cfg.quantum);
        let mut served = 0;
        let mut t = sys::cycles();
        let far = cache.cached.len() >= FAR_TENANTS;
        for _ in 0..bufs.ready_len() {
            let Some(tenant) = bufs.next_ready() else {
                break;
            };
            // As in `process` (with FAR_TENANTS cached): load the rows of the tenant visited ROWS_AHEAD on, and the
            // entry, state and first packets' headers of the next one, while this one runs.
            if let Some(ahead) = bufs.peek_ready(ROWS_AHEAD - 1).filter(|_| far) {
                self.prefetch_rows(&cache, ahead);
                bufs.prefetch_queue(ahead);
                if let Some(w) = self.shared.weights.get(ahead as usize) {
                    sys::prefetch(w, 4);
                }
                if let Some(g) = self.shared.gates.get(ahead as usize) {
                    sys::prefetch(g, 4);
                }
            }
            if let Some(ahead) = bufs.peek_ready(ENTRY_AHEAD - 1).filter(|_| far) {
                cache.prefetch_entry(ahead);
                bufs.prefetch_headers(ahead, group.min(GROUP_CHUNK));
            }
            if !self.gate_open(tenant) {
                bufs.park(tenant);
                continue;
            }
            let weight = self
                .shared
                .weights
                .get(tenant as usize)
                .map_or(1, |w| u64::from(w.load(Ordering::Relaxed).max(1)));
            let credit = i64::try_from(quantum.saturating_mul(weight)).unwrap_or(i64::MAX);
            let d = bufs.deficit(tenant);
            *d = d.saturating_add(credit);
            while *bufs.deficit(tenant) > 0 && bufs.len(tenant) > 0 {
                // The group is taken straight to the end of `out` and runs there, in
                // place: staging it apart and appending it afterwards moved every packet
                // once more (docs/results/notes.md).
                let at = out.len();
                let n = bufs.take(tenant, group, out);
                let stage = &mut out[at..];
                // Start loading the group's headers while its state is looked up; the
                // parse then does not wait for memory packet by packet.
                stage.iter().for_each(|m| sys::prefetch_headers(m.data()));
                let entry = cache.lookup(&self.shared.table, tenant);
                let w0 = self.clock.work(t);
                // Every staged header is loading already (above). The DRR charges each
                // group what it took, so every group here is timed.
                let tally =
                    self.run_group(TenantSlot(tenant), entry, stage, &self.members[..n], false);
                let t1 = sys::cycles();
                self.publish(tenant, &tally, t1.wrapping_sub(t));
                t = t1;
                let cost = i64::try_from(self.clock.work(t).wrapping_sub(w0)).unwrap_or(i64::MAX);
                let d = bufs.deficit(tenant);
                *d = d.saturating_sub(cost);
                served += n;
                if self.quarantined(tenant) {
                    // Its packets are only dropped from now on: drain it without charge.
                    *d = (*d).max(1);
                    continue;
                }
                if !force && bufs.len(tenant) < group && !bufs.aged(tenant, now) {
                    break;
                }
            }
            bufs.settle(tenant, now, force);
        }
        self.cache = cache;
        served
    }

    /// Starts loading the per-tenant rows running `tenant`'s group touches in this
    /// worker: the entry cache's row, the tenant's counter row (its first line, the one a
    /// group updates) and its quarantine flag. A hint; no effect on any result.
    #[inline]
    fn prefetch_rows(&self, cache: &EntryCache<N::State>, tenant: u32) {
        let i = tenant as usize;
        cache.prefetch_row(tenant);
        if let Some(row) = self.counters.tenants.get(i) {
            sys::prefetch(row, 64);
        }
        if let Some(q) = self.shared.quarantined.get(i) {
            sys::prefetch(q, 1);
        }
    }

    fn quarantined(&self, tenant: u32) -> bool {
        self.shared
            .quarantined
            .get(tenant as usize)
            .is_none_or(|q| q.load(Ordering::Relaxed))
    }

    /// Adds one group's tally and the cycles charged to it to `tenant`'s counter row.
    #[inline]
    fn publish(&self, tenant: u32, tally: &GroupTally, cycles: u64) {
        if let Some(row) = self.counters.tenants.get(tenant as usize) {
            row.publish(tally, cycles);
        }
    }

    /// Runs the packets `members` (indices into `burst`) of one tenant and returns what
    /// they came to (the caller publishes it with the group's cycles).
    /// `next_chunks`: load each next chunk's headers while a chunk runs (false when the
    /// caller already started loading every member's headers).
    ///
    /// Always inlined, with [`run_each`]: once per group, the calls, the register saves
    /// around them and the tally copied out cost as much as the group's bookkeeping
    /// (docs/results/notes.md).
    #[inline(always)]
    fn run_group(
        &self,
        tenant: TenantSlot,
        entry: Option<&TenantEntry<N::State>>,
        burst: &mut [PacketBuf],
        members: &[u32],
        next_chunks: bool,
    ) -> GroupTally {
        let mut tally = GroupTally::default();
        let drops = Drops(self.counters.tenants.get(tenant.index()));
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.run_unguarded(
                tenant,
                entry,
                burst,
                members,
                next_chunks,
                drops,
                &mut tally,
            );
        }));
        if let Err(panic) = result {
            self.fault(tenant, panic, burst, members, &mut tally);
        }
        tally
    }

    /// [`run_group`](Self::run_group) without containing a panic of the NF: the caller
    /// catches it and calls [`fault`](Self::fault). Counts drops into `drops` (the
    /// tenant's counter row) and the rest into `tally`, which starts at zero; on a panic,
    /// `tally` holds what the packets before it came to.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn run_unguarded(
        &self,
        tenant: TenantSlot,
        entry: Option<&TenantEntry<N::State>>,
        burst: &mut [PacketBuf],
        members: &[u32],
        next_chunks: bool,
        drops: Drops<'_>,
        tally: &mut GroupTally,
    ) {
        let idx = tenant.0 as usize;
        tally.packets = members.len() as u64;
        let quarantined = self
            .shared
            .quarantined
            .get(idx)
            .is_none_or(|q| q.load(Ordering::Acquire));
        match (entry, quarantined) {
            (Some(entry), false) => {
                let id = entry.id();
                let nf = &*self.shared.nf;
                // Cleared when the group is over (by `fault` after a panic).
                self.counters.running.store(tenant.0 + 1, Ordering::Relaxed);
                // Released when dropped, on a panic too (no poisoning).
                let locked = match entry.try_lock_checked() {
                    Some(locked) => Some(locked),
                    None => self.wait_for_state(tenant, entry),
                };
                let mut state = match locked {
                    Some(Ok(state)) => state,
                    Some(Err(e)) => {
                        // Its isolation domain could not be entered (MPK: the region's key
                        // could not be loaded): no packet of it ran. A fault of this tenant
                        // alone; the key cache stays usable for the others.
                        self.counters.running.store(0, Ordering::Relaxed);
                        self.cannot_enter(tenant, e, burst, members, tally, drops);
                        return;
                    }
                    None => {
                        // Quarantined while another thread held its state.
                        self.counters.running.store(0, Ordering::Relaxed);
                        drop_quarantined(burst, members, tally, drops);
                        return;
                    }
                };
                // Whether every chunk recorded an outcome for each of its packets.
                let mut completed = true;
                if members.len() <= GROUP_CHUNK {
                    // The usual group: one chunk, whose headers are loading already.
                    completed = if N::PER_PACKET {
                        run_each(nf, &mut state, id, burst, members, tally, drops)
                    } else {
                        run_chunk(nf, &mut state, id, burst, members, tally, drops)
                    };
                } else {
                    // Chunks of up to GROUP_CHUNK packets.
                    for (c, chunk) in members.chunks(GROUP_CHUNK).enumerate() {
                        // A group larger than a chunk: load the next chunk's headers while
                        // this one runs (the first chunk's were loaded before the group),
                        // unless the caller loaded the whole group's already.
                        if next_chunks {
                            if let Some(next) = members.get((c + 1) * GROUP_CHUNK..) {
                                prefetch_group_headers(burst, next);
                            }
                        }
                        // An NF with the default `handle_group` runs each packet as soon as
                        // it is parsed, handled where the parse wrote it: nothing is staged.
                        // (Staging a chunk copied each parsed packet with wide loads from
                        // bytes just written by narrower stores, a store-forwarding stall
                        // per packet: multitenancy at 8 tenants went from 0.87 to 1.03 of
                        // the single-tenant NF without it, docs/results/notes.md.)
                        let done = if N::PER_PACKET {
                            run_each(nf, &mut state, id, burst, chunk, tally, drops)
                        } else {
                            run_chunk(nf, &mut state, id, burst, chunk, tally, drops)
                        };
                        if !done {
                            // A fault verdict: the rest of the group stays pending and is
                            // quarantined below.
                            completed = false;
                            break;
                        }
                    }
                }
                drop(state);
                self.counters.running.store(0, Ordering::Relaxed);
                // A chunk that completed left none of its packets pending, so the group
                // is only searched for pending packets after one did not.
                if !completed
                    && members
                        .iter()
                        .any(|&i| burst[i as usize].outcome == Outcome::Pending)
                {
                    let message = "the NF reported a fault (Verdict::Fault)".to_string();
                    drops.quarantined(self.quarantine(tenant, message, burst, members));
                    tally.bytes = group_bytes(burst, members);
                }
            }
            (Some(_), true) => drop_quarantined(burst, members, tally, drops),
            (None, _) => {
                drops.no_tenant(members.len() as u64);
                tally.bytes = group_bytes(burst, members);
                members
                    .iter()
                    .for_each(|&i| burst[i as usize].outcome = Outcome::NoTenant);
            }
        }
    }

    /// Another thread holds tenant `tenant`'s state: waits for it as the lock does
    /// (spinning, then yielding), but only while the tenant is not quarantined, and says
    /// it waits ([`RUNNING_WAITS`]) so that stall detection does not take it for stuck.
    /// The holder may be a worker stuck in the tenant's handler, whose tenant an outside
    /// dispatcher (the XDP program) moved here before the stall was found: once stall
    /// detection quarantines the tenant, `None`, and this worker goes on with its other
    /// tenants instead of waiting forever.
    #[cold]
    #[inline(never)]
    fn wait_for_state<'e>(
        &self,
        tenant: TenantSlot,
        entry: &'e TenantEntry<N::State>,
    ) -> Option<Result<StateGuard<'e, N::State>, EnterError>> {
        let running = &self.counters.running;
        running.store((tenant.0 + 1) | RUNNING_WAITS, Ordering::Relaxed);
        let backoff = crossbeam::utils::Backoff::new();
        loop {
            if self.quarantined(tenant.0) {
                return None;
            }
            // A plain load while it is held; the compare-and-swap only once it looks free.
            if !entry.is_locked() {
                if let Some(locked) = entry.try_lock_checked() {
                    running.store(tenant.0 + 1, Ordering::Relaxed);
                    return Some(locked);
                }
            }
            backoff.snooze();
        }
    }

    /// Tenant `tenant`'s state could not be entered for the group `members`: quarantines
    /// the tenant, with the reason, and drops the group's packets (none of them ran).
    #[cold]
    #[inline(never)]
    fn cannot_enter(
        &self,
        tenant: TenantSlot,
        e: EnterError,
        burst: &mut [PacketBuf],
        members: &[u32],
        tally: &mut GroupTally,
        drops: Drops<'_>,
    ) {
        let message = format!("its state could not be opened: {e}");
        drops.quarantined(self.quarantine(tenant, message, burst, members));
        tally.bytes = group_bytes(burst, members);
    }

    /// After tenant `tenant`'s NF panicked running the group `members`: quarantines the
    /// tenant, drops the group's packets that had no outcome yet, and completes `tally`
    /// (the packets before the panic keep their verdicts and counts).
    #[cold]
    #[inline(never)]
    fn fault(
        &self,
        tenant: TenantSlot,
        panic: Box<dyn std::any::Any + Send>,
        burst: &mut [PacketBuf],
        members: &[u32],
        tally: &mut GroupTally,
    ) {
        self.counters.running.store(0, Ordering::Relaxed);
        let drops = Drops(self.counters.tenants.get(tenant.index()));
        drops.quarantined(self.quarantine(tenant, panic_message(&*panic), burst, members));
        tally.packets = members.len() as u64;
        tally.bytes = group_bytes(burst, members);
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

/// Drops the group `members` of a quarantined tenant: none of its packets runs.
#[cold]
#[inline(never)]
fn drop_quarantined(
    burst: &mut [PacketBuf],
    members: &[u32],
    tally: &mut GroupTally,
    drops: Drops<'_>,
) {
    drops.quarantined(members.len() as u64);
    tally.bytes = group_bytes(burst, members);
    members
        .iter()
        .for_each(|&i| burst[i as usize].outcome = Outcome::Quarantined);
}

/// Which groups of a burst [`Worker::process`] reads the cycle counter around, to
/// charge each tenant the CPU cycles its groups took (`TenantReport::cycles`).
///
/// Reading the counter (`rdtsc`) costs about 15 ns back to back on the development
/// machine (a Xeon under KVM): as much as the NF work of a two-packet group of the
/// Monitor NF, the typical group at 1,024 tenants. So a group of at least
/// [`TIME_GROUPS_FROM`] packets is always timed; the smaller ones only in one burst in
/// [`CYCLE_SAMPLE`], drawn at random, and charged `CYCLE_SAMPLE` times what they took.
/// The draw does not depend on the tenants, so a tenant's cycles stay an unbiased
/// estimate of what its groups cost, whose error shrinks as its packets grow; the
/// worker's busy cycles are read at every burst's start and end, exactly. Groups run
/// from persistent Packet Buffers are all timed: the DRR charges each group its cost.
struct CycleSampler {
    /// xorshift64 state, never zero.
    state: u64,
}

/// The end of a group that began at `start` (`None`: not timed, and nothing read).
#[inline(always)]
fn stamp(start: Option<u64>) -> Option<u64> {
    start.map(|_| sys::cycles())
}

/// The cycles a group of `len` packets that ran from `start` to `end` is charged: what it
/// took times [`CycleSampler::weight`], 0 when it was not timed.
#[inline(always)]
fn charged(start: Option<u64>, end: Option<u64>, len: usize) -> u64 {
    match (start, end) {
        (Some(s), Some(e)) => e.wrapping_sub(s).saturating_mul(CycleSampler::weight(len)),
        _ => 0,
    }
}

/// Groups of at least this many packets are always timed.
const TIME_GROUPS_FROM: usize = 8;
/// Smaller groups are timed in one burst in this many, on average.
const CYCLE_SAMPLE: u64 = 8;

impl CycleSampler {
    fn new(seed: u64) -> Self {
        // Spread small seeds (worker ids) over the state; any non-zero state will do.
        CycleSampler {
            state: (seed.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// Whether this burst times its small groups (probability 1 / [`CYCLE_SAMPLE`]).
    #[inline]
    fn burst(&mut self) -> bool {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        (x >> 32) % CYCLE_SAMPLE == 0
    }

    /// The shortest group a burst times: every group in a sampled burst, only the groups
    /// of at least [`TIME_GROUPS_FROM`] packets in the others. Once per burst, so a group
    /// pays one compare to know whether it is timed.
    #[inline]
    fn timed_from(sampled: bool) -> usize {
        if sampled {
            0
        } else {
            TIME_GROUPS_FROM
        }
    }

    /// What a timed group of `len` packets' measured cycles count for: 1 (such groups
    /// are always timed) or [`CYCLE_SAMPLE`] (a small group, timed in sampled bursts
    /// only).
    #[inline(always)]
    fn weight(len: usize) -> u64 {
        if len >= TIME_GROUPS_FROM {
            1
        } else {
            CYCLE_SAMPLE
        }
    }
}

/// Tenants cached by a worker from which on it prefetches the next groups' rows, entries,
/// states and headers while a group runs. Below it they stay in the CPU's caches and the
/// prefetches cost more than they save (measured on the idle 2-core machine:
/// `multitenancy` 9 % slower at 64 tenants, about as fast at 1,024, 1.8x faster at
/// 10,000 with them).
const FAR_TENANTS: usize = 2048;

/// How many groups ahead of the running one the worker starts loading the per-tenant
/// rows (entry cache row, counter row, quarantine flag).
const ROWS_AHEAD: usize = 2;
/// How many groups ahead it starts loading the Tenant Table entry and the state's first
/// lines (their addresses come from the entry cache row loaded `ROWS_AHEAD` before).
const ENTRY_AHEAD: usize = 1;
/// How many groups ahead it starts loading the packets' headers (up to one chunk).
const HEADERS_AHEAD: usize = 1;

/// Starts loading the headers of the first [`GROUP_CHUNK`] packets `members` (indices
/// into `burst`) of a group that runs soon.
#[inline]
fn prefetch_group_headers(burst: &[PacketBuf], members: &[u32]) {
    for &i in members.iter().take(GROUP_CHUNK) {
        if let Some(m) = burst.get(i as usize) {
            sys::prefetch_headers(m.data());
        }
    }
}

/// Runs one chunk of a tenant's group: `chunk` holds ascending burst indices, at most
/// [`GROUP_CHUNK`]. Parses each packet (malformed ones are counted and never reach the
/// NF), hands the parsed ones to `handle_group` in one call, and records every outcome in
/// arrival order. Returns false when the NF reported a fault: that packet and the ones
/// after it stay pending (false too should an index lie outside `burst`: that packet and
/// the ones after it stay pending). Returns true only when every packet of the chunk has
/// its outcome. A panic in the NF is re-raised after the verdicts already written are
/// recorded, so the packets before it keep theirs.
fn run_chunk<N: NetworkFunction>(
    nf: &N,
    state: &mut N::State,
    id: buffet_sdk::TenantId,
    burst: &mut [PacketBuf],
    chunk: &[u32],
    tally: &mut GroupTally,
    drops: Drops<'_>,
) -> bool {
    const { assert!(GROUP_CHUNK <= 64) };
    debug_assert!(chunk.len() <= GROUP_CHUNK && chunk.windows(2).all(|w| w[0] < w[1]));
    let mut verdicts = [Verdict::Fault; GROUP_CHUNK];
    let mut lens = [0usize; GROUP_CHUNK];
    // Bit `k` set: the chunk's `k`-th packet did not parse (it is not among `pkts`).
    let mut malformed = 0u64;
    // Packets of the chunk found in `burst` (all of them unless an index is out of range).
    let mut walked = 0usize;
    let mut bytes = 0u64;
    let panicked = {
        let mut pkts: ArrayVec<Packet<'_>, GROUP_CHUNK> = ArrayVec::new();
        // Disjoint `&mut` to the members: walk the burst once, splitting at each index.
        let mut rest: &mut [PacketBuf] = burst;
        let mut base = 0usize;
        for (k, &i) in chunk.iter().enumerate() {
            let i = i as usize;
            let Some((m, tail)) = std::mem::take(&mut rest)
                .get_mut(i - base..)
                .and_then(<[PacketBuf]>::split_first_mut)
            else {
                break;
            };
            rest = tail;
            base = i + 1;
            walked = k + 1;
            let len = m.len();
            bytes += len as u64;
            let meta = PacketMeta {
                in_port: m.in_port,
                ts_ns: m.ts_ns,
                tenant: id,
            };
            // The dispatcher's parse travels with the packet; parse here only without one.
            let parsed_pkt = match m.layout {
                Some(layout) => Packet::from_layout(m.buffer_mut(), len, meta, layout),
                None => Packet::parse_with_capacity(m.buffer_mut(), len, meta),
            };
            match parsed_pkt {
                Ok(pkt) => pkts.push(pkt),
                Err(_) => malformed |= 1 << k,
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
    tally.bytes += bytes;
    let walked = &chunk[..walked];
    let mut passed = 0u64;
    let mut go_on = walked.len() == chunk.len();
    if malformed == 0 {
        // Every packet parsed: the `k`-th packet's verdict is `verdicts[k]`.
        for ((&i, &v), &len) in walked.iter().zip(&verdicts).zip(&lens) {
            let m = &mut burst[i as usize];
            if !record_verdict(m, v, len, &mut passed, drops) {
                go_on = false;
                break;
            }
        }
    } else {
        let mut k = 0usize;
        for (pos, &i) in walked.iter().enumerate() {
            let m = &mut burst[i as usize];
            if malformed & (1 << pos) != 0 {
                drops.malformed(1);
                m.outcome = Outcome::Malformed;
                continue;
            }
            if !record_verdict(m, verdicts[k], lens[k], &mut passed, drops) {
                go_on = false;
                break;
            }
            k += 1;
        }
    }
    tally.passed += passed;
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
    go_on
}

/// [`run_chunk`] for an NF that keeps the default `handle_group`
/// ([`NetworkFunction::PER_PACKET`]): each packet is parsed, handed to `handle` and its
/// verdict recorded before the next is parsed, so nothing is staged. Same outcomes and
/// counts as `run_chunk`: malformed packets are counted and never reach the NF; a
/// [`Verdict::Fault`] leaves that packet and the rest of the chunk pending (returns
/// false); a panic in the NF unwinds from here with the verdicts before it recorded.
#[inline(always)]
fn run_each<N: NetworkFunction>(
    nf: &N,
    state: &mut N::State,
    id: buffet_sdk::TenantId,
    burst: &mut [PacketBuf],
    chunk: &[u32],
    tally: &mut GroupTally,
    drops: Drops<'_>,
) -> bool {
    let mut go_on = true;
    for &i in chunk {
        let Some(m) = burst.get_mut(i as usize) else {
            // An index outside the burst: it and the rest stay pending.
            go_on = false;
            break;
        };
        let len = m.len();
        tally.bytes += len as u64;
        let meta = PacketMeta {
            in_port: m.in_port,
            ts_ns: m.ts_ns,
            tenant: id,
        };
        let mut parsed = match m.layout {
            Some(layout) => Packet::from_layout(m.buffer_mut(), len, meta, layout),
            None => Packet::parse_with_capacity(m.buffer_mut(), len, meta),
        };
        // The packet is handled where the parse wrote it: moving it out of the `Result`
        // first copied it with wide loads from bytes just written by narrower stores, a
        // store-forwarding stall per packet.
        let (v, new_len) = match &mut parsed {
            Ok(pkt) => {
                let v = nf.handle(pkt, state);
                (v, pkt.len())
            }
            Err(_) => {
                drops.malformed(1);
                m.outcome = Outcome::Malformed;
                continue;
            }
        };
        // Counted at once: a panic in a later packet's handler keeps this one's count.
        let mut passed = 0u64;
        let recorded = record_verdict(m, v, new_len, &mut passed, drops);
        tally.passed += passed;
        if !recorded {
            go_on = false;
            break;
        }
    }
    go_on
}

/// Records the NF's verdict `v` on packet `m`, whose frame is now `len` bytes long.
/// Returns false on [`Verdict::Fault`], leaving `m` pending.
#[inline(always)]
fn record_verdict(
    m: &mut PacketBuf,
    v: Verdict,
    len: usize,
    passed: &mut u64,
    drops: Drops<'_>,
) -> bool {
    match v {
        // Left pending: the rest of the group is quarantined.
        Verdict::Fault => return false,
        Verdict::Drop(cause) => {
            drops.nf(cause, 1);
            m.outcome = Outcome::Nf(Verdict::Drop(cause));
        }
        v => {
            *passed += 1;
            if len != m.len() {
                m.set_len(len);
            }
            m.layout = None;
            m.outcome = Outcome::Nf(v);
        }
    }
    true
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
///
/// While nothing in the table changed since the last [`revalidate`](Self::revalidate)
/// (one load of the table's change count, a line every group reads), every cached entry
/// is current and a hit reads no per-slot generation; only after a change does a hit
/// compare its slot's generation. Each entry also keeps its state's address, so the
/// worker can prefetch the state of a group it will run soon without touching the entry.
struct EntryCache<S> {
    entries: Vec<Option<Cached<S>>>,
    /// Slots with a cached entry.
    cached: Vec<u32>,
    seen_changes: u64,
}

/// One cached Tenant Table entry.
struct Cached<S> {
    /// The slot's generation when the entry was loaded.
    generation: u64,
    entry: Arc<TenantEntry<S>>,
    /// Where the tenant's state starts (its region's base).
    state: usize,
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
            let keep = matches!(&entries[slot as usize],
                Some(c) if c.generation == table.generation(TenantSlot(slot)));
            if !keep {
                entries[slot as usize] = None;
            }
            keep
        });
    }

    /// The cached entry of `slot`, loading it on a miss. A hit (the common case: one
    /// per packet group) is inlined into the caller; the miss is out of line.
    #[inline(always)]
    fn lookup(&mut self, table: &TenantTable<S>, slot: u32) -> Option<&TenantEntry<S>> {
        // `revalidate` read the change count before checking every cached generation,
        // and the table bumps a slot's generation before the change count: with the
        // count unchanged, no slot changed since, so every cached entry is current.
        let hit = match self.entries.get(slot as usize) {
            Some(Some(c)) => {
                table.changes() == self.seen_changes
                    || c.generation == table.generation(TenantSlot(slot))
            }
            _ => false,
        };
        if !hit {
            self.load(table, slot);
        }
        self.entries
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map(|c| &*c.entry)
    }

    /// Loads `slot`'s entry from the table into the cache (or forgets it when the slot
    /// is empty now).
    #[cold]
    #[inline(never)]
    fn load(&mut self, table: &TenantTable<S>, slot: u32) {
        let i = slot as usize;
        if i >= self.entries.len() {
            self.entries
                .resize_with((i + 1).max(table.capacity() as usize), || None);
        }
        let generation = table.generation(TenantSlot(slot));
        let was_cached = self.entries[i].is_some();
        self.entries[i] = table.get_arc(TenantSlot(slot)).map(|entry| Cached {
            generation,
            state: entry.extent().base,
            entry,
        });
        match (was_cached, self.entries[i].is_some()) {
            (false, true) => self.cached.push(slot),
            (true, false) => self.cached.retain(|&s| s != slot),
            _ => {}
        }
    }

    /// Starts loading the cache's own row for `slot` (far ahead of its group: the row
    /// holds the entry's and the state's addresses, read by [`prefetch_entry`]).
    ///
    /// [`prefetch_entry`]: Self::prefetch_entry
    #[inline]
    fn prefetch_row(&self, slot: u32) {
        if let Some(row) = self.entries.get(slot as usize) {
            sys::prefetch(row, std::mem::size_of_val(row));
        }
    }

    /// Starts loading what running `slot`'s group touches first: its Tenant Table entry
    /// (id, state lock, isolation key) and the first lines of its state. Reads the
    /// cache's row (prefetched earlier by [`prefetch_row`](Self::prefetch_row)); nothing
    /// when the slot is not cached.
    #[inline]
    fn prefetch_entry(&self, slot: u32) {
        if let Some(Some(c)) = self.entries.get(slot as usize) {
            sys::prefetch(Arc::as_ptr(&c.entry), std::mem::size_of::<TenantEntry<S>>());
            sys::prefetch(
                c.state as *const u8,
                std::mem::size_of::<S>().clamp(1, 2 * 64),
            );
        }
    }
}

/// Per-worker scratch for grouping a burst into Packet Buffers by tenant slot.
///
/// Counting sort over indices: the per-slot arrays are sized to the Tenant Table once;
/// `epoch` marks which slots this burst touched, so nothing is cleared per burst.
#[derive(Default)]
struct PacketBuffers {
    epoch: u32,
    /// Per tenant slot: the burst that last saw it and its count (one cache line per
    /// slot touched, not two).
    slots: Vec<SlotCount>,
    /// Slots of this burst in first-seen order.
    active: Vec<u32>,
    /// Start of each active group in `order`, then the end of the last.
    starts: Vec<u32>,
    /// Burst indices grouped by tenant, arrival order within a group.
    order: Vec<u32>,
}

impl PacketBuffers {
    /// Groups `burst` by tenant. `headers`: start loading every frame's headers during
    /// the walk (with few tenants, where the worker prefetches nothing else).
    ///
    /// Two passes over the burst's tags (the walk that counts, the scatter) and one over
    /// its groups; the arrays are written by index, not pushed, as a push's capacity test
    /// cost more than the write (25 instructions per packet at 1,024 tenants).
    fn build(&mut self, burst: &[PacketBuf], headers: bool) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.slots.iter_mut().for_each(|s| s.epoch = 0);
            self.epoch = 1;
        }
        // At most one group per packet.
        self.active.resize(burst.len(), 0);
        // The tag lives in the `PacketBuf`, apart from the frame: this walk touches no
        // frame. The groups run in tenant order, not arrival order. With few tenants the
        // headers start loading here, while the walk is sequential; with many
        // (`FAR_TENANTS`) the worker loads each group's headers a group ahead of its run
        // instead (`HEADERS_AHEAD`), as hundreds of back-to-back prefetches here stall the
        // walk. Two instances, so the walk does not test `headers` per packet.
        let groups = if headers {
            self.walk::<true>(burst)
        } else {
            self.walk::<false>(burst)
        };
        self.active.truncate(groups);
        self.starts.clear();
        self.order.clear();
        if groups == 1 {
            // One group: the whole burst, in order.
            self.starts.extend([0, burst.len() as u32]);
            self.order.extend(0..burst.len() as u32);
            return;
        }
        self.starts.resize(groups + 1, 0);
        self.order.resize(burst.len(), 0);
        // The arrays as local slices: the loops below write through them, and the
        // vectors' pointers and lengths would otherwise be read again for every packet.
        let slots = &mut self.slots[..];
        let starts = &mut self.starts[..];
        let order = &mut self.order[..];
        let mut at = 0u32;
        for (start, &t) in starts.iter_mut().zip(&self.active) {
            *start = at;
            let slot = &mut slots[t as usize];
            let n = slot.count;
            // `count` now holds the next write position of the group.
            slot.count = at;
            at += n;
        }
        // The last group's end.
        starts[groups] = at;
        for (i, m) in burst.iter().enumerate() {
            let slot = &mut slots[m.tenant.0 as usize];
            order[slot.count as usize] = i as u32;
            slot.count += 1;
        }
    }

    /// Counts the burst's tags by runs of one tenant (a packet of the same tenant as the
    /// one before it costs a compare and an increment, and the per-slot arrays are
    /// touched once per run), listing each tenant in `active` when first seen. Returns
    /// how many it listed. `HEADERS`: start loading every frame's headers on the way.
    #[inline(always)]
    fn walk<const HEADERS: bool>(&mut self, burst: &[PacketBuf]) -> usize {
        let mut runs = Runs {
            epoch: self.epoch,
            slots: &mut self.slots,
            active: &mut self.active,
            listed: 0,
        };
        let mut packets = burst.iter();
        let Some(first) = packets.next() else {
            return 0;
        };
        if HEADERS {
            sys::prefetch_headers(first.data());
        }
        let (mut run_t, mut run_n) = (first.tenant.0, 1u32);
        for m in packets {
            if HEADERS {
                sys::prefetch_headers(m.data());
            }
            let t = m.tenant.0;
            if t == run_t {
                run_n += 1;
            } else {
                runs.add(run_t, run_n);
                (run_t, run_n) = (t, 1);
            }
        }
        runs.add(run_t, run_n);
        runs.listed
    }

    /// The groups built last, to read by index.
    #[inline(always)]
    fn view(&self) -> Groups<'_> {
        let n = self.active.len();
        Groups {
            active: &self.active,
            // Sliced to exactly one more than `active`: an index below `active.len()`
            // needs no bounds check on either (once per group).
            starts: &self.starts[..=n],
            order: &self.order,
        }
    }

    #[cfg(test)]
    fn group(&self, g: usize) -> (u32, &[u32]) {
        self.view().group(g)
    }
}

/// The groups of a burst, as [`PacketBuffers::build`] left them.
struct Groups<'a> {
    /// Each group's tenant slot.
    active: &'a [u32],
    /// Each group's start in `order`, then the end of the last (one more than `active`).
    starts: &'a [u32],
    /// Burst indices grouped by tenant.
    order: &'a [u32],
}

impl<'a> Groups<'a> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.active.len()
    }

    /// Group `g`'s tenant slot.
    #[inline(always)]
    fn tenant(&self, g: usize) -> u32 {
        self.active[g]
    }

    /// Group `g`: its tenant slot and the burst indices of its packets. Once per group:
    /// always inlined (`starts` ends with the burst's length, so no end case).
    #[inline(always)]
    fn group(&self, g: usize) -> (u32, &'a [u32]) {
        let (start, end) = (self.starts[g] as usize, self.starts[g + 1] as usize);
        (self.active[g], &self.order[start..end])
    }
}

/// The per-slot arrays of [`PacketBuffers`] while a burst's tags are counted.
struct Runs<'a> {
    epoch: u32,
    slots: &'a mut Vec<SlotCount>,
    /// Sized to the burst; the first `listed` hold this burst's slots.
    active: &'a mut [u32],
    listed: usize,
}

impl Runs<'_> {
    /// Adds a run of `n` packets of tenant slot `t` to its count (a new group when the
    /// burst had none of its packets yet).
    #[inline(always)]
    fn add(&mut self, t: u32, n: u32) {
        let i = t as usize;
        let slot = match self.slots.get_mut(i) {
            Some(slot) => slot,
            None => grow(self.slots, i),
        };
        if slot.epoch != self.epoch {
            *slot = SlotCount {
                epoch: self.epoch,
                count: n,
            };
            self.active[self.listed] = t;
            self.listed += 1;
        } else {
            slot.count += n;
        }
    }
}

/// A tenant slot's entry in [`PacketBuffers`].
#[derive(Clone, Copy, Default)]
struct SlotCount {
    /// The burst (`PacketBuffers::epoch`) that last saw the slot.
    epoch: u32,
    /// Its packets in that burst; then the next write position of its group.
    count: u32,
}

/// Grows the per-slot array to hold slot `i` and returns its entry (once per new
/// highest slot: kept out of line).
#[cold]
#[inline(never)]
fn grow(slots: &mut Vec<SlotCount>, i: usize) -> &mut SlotCount {
    slots.resize(i + 1, SlotCount::default());
    &mut slots[i]
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
            g.build(&burst, true);
            let got: Vec<(u32, Vec<u32>)> = (0..g.active.len())
                .map(|i| (g.group(i).0, g.group(i).1.to_vec()))
                .collect();
            assert_eq!(got, vec![(3, vec![0, 2, 5]), (1, vec![1, 4]), (2, vec![3])]);
        }
        g.build(&burst[..1], true);
        assert_eq!((g.group(0).0, g.group(0).1), (3, &[0u32][..]));
    }

    /// An NF whose verdicts follow the packet: it records each packet's timestamp in its
    /// tenant's state (the order a tenant's packets reached it), drops when `ts % 5 == 0`
    /// (cause by `ts % 3`), shortens the frame by one byte and sends it back when
    /// `ts % 5 == 1`, and passes the rest.
    struct Script;

    fn scripted(ts: u64) -> Verdict {
        match ts % 5 {
            0 => Verdict::Drop(buffet_sdk::DropCause::ALL[(ts % 3) as usize]),
            1 => Verdict::Tx,
            _ => Verdict::Pass,
        }
    }

    impl NetworkFunction for Script {
        type State = Vec<u64>;
        type Policy = ();
        fn name(&self) -> &'static str {
            "script"
        }
        fn register(&self) -> buffet_sdk::MemorySpec {
            buffet_sdk::MemorySpec::of::<Vec<u64>>()
        }
        fn init(&self, _: &(), _: &mut Vec<u64>) -> Result<(), buffet_sdk::InitError> {
            Ok(())
        }
        fn handle(&self, pkt: &mut Packet<'_>, seen: &mut Vec<u64>) -> Verdict {
            let ts = pkt.meta().ts_ns;
            seen.push(ts);
            let v = scripted(ts);
            if v == Verdict::Tx {
                let len = pkt.len();
                pkt.resize(len - 1).expect("shrinks");
            }
            v
        }
    }

    /// [`Script`], on the per-packet path when `EACH` ([`run_each`] instead of
    /// [`run_chunk`]), and with `FAULTS` also faulting (`Verdict::Fault`) and panicking
    /// mid-group, by timestamp.
    struct Probe<const EACH: bool, const FAULTS: bool>;

    impl<const EACH: bool, const FAULTS: bool> NetworkFunction for Probe<EACH, FAULTS> {
        type State = Vec<u64>;
        type Policy = ();
        const PER_PACKET: bool = EACH;
        fn name(&self) -> &'static str {
            "probe"
        }
        fn register(&self) -> buffet_sdk::MemorySpec {
            Script.register()
        }
        fn init(&self, p: &(), s: &mut Vec<u64>) -> Result<(), buffet_sdk::InitError> {
            Script.init(p, s)
        }
        fn handle(&self, pkt: &mut Packet<'_>, seen: &mut Vec<u64>) -> Verdict {
            let ts = pkt.meta().ts_ns;
            match ts % 97 {
                41 if FAULTS => Verdict::Fault,
                83 if FAULTS => panic!("scripted panic at {ts}"),
                _ => Script.handle(pkt, seen),
            }
        }
    }

    /// A Tenant Table with `tenants` tenants admitted at slots `0..tenants` (ids from 1),
    /// each with an empty `Vec<u64>` state.
    fn admitted(tenants: u32) -> Arc<TenantTable<Vec<u64>>> {
        let storage =
            buffet_memory::MemoryStorage::new(buffet_memory::ArenaConfig { capacity: 64 << 20 })
                .unwrap();
        let table = Arc::new(TenantTable::new(storage, tenants));
        for t in 0..tenants {
            table
                .admit(TenantSlot(t), buffet_sdk::TenantId(t + 1), 4096, Vec::new())
                .unwrap();
        }
        table
    }

    /// Runs the same seeded bursts (60 of up to 300 packets over `tenants` slots, a tenth
    /// of the frames malformed, half with the dispatcher's parse) through a worker of
    /// `nf`; returns each packet's (outcome, length) and each slot's counters.
    fn outcomes_of<N: NetworkFunction<State = Vec<u64>, Policy = ()>>(
        nf: N,
        tenants: u32,
    ) -> (Vec<(Outcome, usize)>, Vec<Vec<u64>>) {
        let mut rng = buffet_testkit::rng::Rng::new(11);
        let mut w = Worker::new(Arc::new(nf), admitted(tenants));
        let mut out = Vec::new();
        let mut ts = 0u64;
        for _ in 0..60 {
            let mut burst: Vec<PacketBuf> = (0..1 + rng.index(300))
                .map(|_| {
                    let bad = rng.below(10) == 0;
                    let mut m = random_packet(&mut rng, bad);
                    m.tenant = TenantSlot(rng.below(u64::from(tenants)) as u32);
                    m.ts_ns = ts;
                    ts += 1;
                    m
                })
                .collect();
            w.process(&mut burst);
            out.extend(burst.iter().map(|m| (m.outcome, m.len())));
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let rows = (0..tenants as usize)
            .map(|t| {
                let r = &w.counters.tenants[t];
                let mut v = vec![
                    load(&r.packets),
                    load(&r.bytes),
                    load(&r.passed),
                    load(&r.malformed),
                    load(&r.no_tenant),
                    load(&r.quarantined),
                    load(&r.groups),
                ];
                v.extend(r.nf_drops.iter().map(load));
                v
            })
            .collect();
        (out, rows)
    }

    #[test]
    fn the_per_packet_path_decides_and_counts_as_the_chunk_path() {
        for tenants in [1u32, 5, 40] {
            let chunk = outcomes_of(Probe::<false, false>, tenants);
            assert_eq!(
                outcomes_of(Probe::<true, false>, tenants),
                chunk,
                "{tenants} tenants"
            );
            // Faults and panics: the same packets keep their verdicts, the same are
            // quarantined, and the counters agree.
            let chunk = outcomes_of(Probe::<false, true>, tenants);
            let quarantined = chunk
                .0
                .iter()
                .filter(|(o, _)| *o == Outcome::Quarantined)
                .count();
            assert!(quarantined > 0, "the script faults and panics");
            assert_eq!(
                outcomes_of(Probe::<true, true>, tenants),
                chunk,
                "{tenants} tenants"
            );
        }
    }

    #[test]
    fn the_cycle_sampler_times_one_burst_in_eight_and_every_large_group() {
        let mut s = CycleSampler::new(0);
        let bursts = 80_000usize;
        let sampled = (0..bursts).filter(|_| s.burst()).count();
        let want = bursts / CYCLE_SAMPLE as usize;
        assert!(
            sampled.abs_diff(want) < want / 20,
            "{sampled} of {bursts} bursts sampled, want about {want}"
        );
        // Never a run that would leave a small tenant untimed for long.
        let mut s = CycleSampler::new(1);
        let longest = (0..bursts)
            .map(|_| s.burst())
            .fold((0usize, 0usize), |(run, max), hit| {
                let run = if hit { 0 } else { run + 1 };
                (run, max.max(run))
            })
            .1;
        assert!(longest < 200, "{longest} bursts in a row without a sample");
        // Large groups are timed in every burst and count once; small ones only in a
        // sampled burst, where they count CYCLE_SAMPLE times.
        for sampled in [false, true] {
            for len in [TIME_GROUPS_FROM, GROUP_CHUNK * 3] {
                assert!(len >= CycleSampler::timed_from(sampled));
                assert_eq!(CycleSampler::weight(len), 1);
            }
        }
        for len in [1, TIME_GROUPS_FROM - 1] {
            assert!(len >= CycleSampler::timed_from(true));
            assert!(len < CycleSampler::timed_from(false));
            assert_eq!(CycleSampler::weight(len), CYCLE_SAMPLE);
        }
    }

    /// Runs `bursts` bursts of `per_tenant` packets of each of `tenants` tenants through
    /// one worker; returns each tenant's cycles and the worker's busy cycles.
    fn cycles_of(tenants: u32, per_tenant: usize, bursts: usize) -> (Vec<u64>, u64) {
        let mut w = Worker::new(Arc::new(Probe::<true, false>), admitted(tenants));
        let frame = udp_frame(18);
        let mut burst: Vec<PacketBuf> = (0..tenants)
            .flat_map(|t| (0..per_tenant).map(move |_| t))
            .map(|t| {
                let mut m = PacketBuf::heap();
                assert!(m.fill(&frame));
                m.tenant = TenantSlot(t);
                // Passed by `Script` (ts % 5 == 2): the frame keeps its length.
                m.ts_ns = 2;
                m
            })
            .collect();
        for _ in 0..bursts {
            w.process(&mut burst);
            for m in &mut burst {
                assert_eq!(m.outcome, Outcome::Nf(Verdict::Pass));
                m.outcome = Outcome::Pending;
            }
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let cycles = (0..tenants as usize)
            .map(|t| load(&w.counters.tenants[t].cycles))
            .collect();
        (cycles, load(&w.counters.busy_cycles))
    }

    #[test]
    fn large_groups_are_timed_in_every_burst_and_small_ones_are_sampled() {
        // Groups of TIME_GROUPS_FROM packets: every one timed, inside the burst's time.
        let (cycles, busy) = cycles_of(4, TIME_GROUPS_FROM, 1);
        assert!(
            cycles.iter().all(|&c| c > 0),
            "every large group timed: {cycles:?}"
        );
        assert!(
            cycles.iter().sum::<u64>() <= busy,
            "groups timed within the burst: {cycles:?} of {busy}"
        );
        // One-packet groups: one burst in CYCLE_SAMPLE times them, so every tenant has
        // cycles after a few hundred bursts (each burst sampled or not as a whole).
        let (cycles, busy) = cycles_of(16, 1, 600);
        assert!(
            cycles.iter().all(|&c| c > 0),
            "every tenant sampled: {cycles:?}"
        );
        assert!(busy > 0);
    }

    /// A random frame in a heap buffer: when `bad`, shorter than an Ethernet header;
    /// else a UDP frame of 0 to 39 payload bytes, half of them with the dispatcher's parse.
    /// Panics on a packet whose `ts_ns` is 1,000 or more; passes the others.
    struct Panicky;

    impl NetworkFunction for Panicky {
        type State = Vec<u64>;
        type Policy = ();
        fn name(&self) -> &'static str {
            "panicky"
        }
        fn register(&self) -> buffet_sdk::MemorySpec {
            buffet_sdk::MemorySpec::of::<Vec<u64>>()
        }
        fn init(&self, _: &(), _: &mut Vec<u64>) -> Result<(), buffet_sdk::InitError> {
            Ok(())
        }
        fn handle(&self, pkt: &mut Packet<'_>, seen: &mut Vec<u64>) -> Verdict {
            let ts = pkt.meta().ts_ns;
            assert!(ts < 1_000, "boom at {ts}");
            seen.push(ts);
            Verdict::Pass
        }
    }

    /// `process` contains a panic per burst, not per group: whichever group panics (the
    /// first, one in the middle, the last), only its tenant is quarantined, its packets
    /// before the panic keep their verdicts, the ones after it are dropped as
    /// quarantined, every other group of the burst runs, every counter is exact, and the
    /// tenant's state is unlocked again.
    #[test]
    fn a_panic_in_any_group_of_a_burst_quarantines_only_its_tenant() {
        for bad in 0..3u32 {
            let storage = buffet_memory::MemoryStorage::new(buffet_memory::ArenaConfig {
                capacity: 16 << 20,
            })
            .unwrap();
            let table = Arc::new(TenantTable::new(storage, 3));
            for t in 0..3 {
                table
                    .admit(TenantSlot(t), buffet_sdk::TenantId(t + 1), 4096, Vec::new())
                    .unwrap();
            }
            let mut w = Worker::new(Arc::new(Panicky), table.clone());
            // Tenants 0, 1, 2 in that order of first appearance, three packets each,
            // interleaved; tenant `bad`'s second packet panics.
            let mut burst: Vec<PacketBuf> = (0..9u64)
                .map(|i| {
                    let t = (i % 3) as u32;
                    let mut m = PacketBuf::heap();
                    assert!(m.fill(&udp_frame(4)));
                    m.tenant = TenantSlot(t);
                    m.ts_ns = if t == bad && i / 3 == 1 { 1_000 + i } else { i };
                    m
                })
                .collect();
            w.process(&mut burst);
            for (i, m) in burst.iter().enumerate() {
                let t = (i % 3) as u32;
                let want = match (t == bad, i / 3) {
                    (false, _) | (true, 0) => Outcome::Nf(Verdict::Pass),
                    (true, _) => Outcome::Quarantined,
                };
                assert_eq!(m.outcome, want, "bad {bad}, packet {i}");
            }
            for t in 0..3u32 {
                let row = &w.counters.tenants[t as usize];
                let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
                let want = if t == bad { (3, 1, 2, 1) } else { (3, 3, 0, 1) };
                assert_eq!(
                    (
                        load(&row.packets),
                        load(&row.passed),
                        load(&row.quarantined),
                        load(&row.groups)
                    ),
                    want,
                    "bad {bad}, tenant {t}"
                );
                assert_eq!(w.quarantined(t), t == bad, "bad {bad}, tenant {t}");
                let got = table.get(TenantSlot(t));
                let entry = got.entry().unwrap();
                let state = entry.try_lock().expect("unlocked after the burst");
                assert_eq!(state.len(), if t == bad { 1 } else { 3 }, "bad {bad}");
            }
            assert!(matches!(
                w.shared.notices.pop(),
                Some(Notice::Fault { tenant, message, .. })
                    if tenant == TenantSlot(bad) && message.contains("boom")
            ));
        }
    }

    /// Under MPK, a tenant whose region cannot be given a protection key (the
    /// `pkey_mprotect` of the key cache's miss fails; simulated keys, no `pku` needed) is
    /// quarantined and reported like a faulting handler, its packets dropped and counted,
    /// while the tenants beside it run, burst after burst, on the same key cache.
    #[test]
    fn a_tenant_whose_protection_key_cannot_be_loaded_is_quarantined_and_the_others_run() {
        let (mpk, mem) = buffet_memory::Mpk::simulated(2);
        let storage =
            buffet_memory::MemoryStorage::new(buffet_memory::ArenaConfig { capacity: 16 << 20 })
                .unwrap();
        let table = Arc::new(TenantTable::with_mpk(storage, 3, mpk));
        for t in 0..3 {
            table
                .admit(TenantSlot(t), buffet_sdk::TenantId(t + 1), 4096, Vec::new())
                .unwrap();
        }
        let bad = 1u32;
        let base = table.get(TenantSlot(bad)).entry().unwrap().extent().base;
        for key in 2..=3 {
            mem.fail_retags(base, key);
        }
        let mut w = Worker::new(Arc::new(Panicky), table.clone());
        let mut misses = 0;
        for round in 1..=3u64 {
            let mut burst: Vec<PacketBuf> = (0..9u64)
                .map(|i| {
                    let mut m = PacketBuf::heap();
                    assert!(m.fill(&udp_frame(4)));
                    m.tenant = TenantSlot((i % 3) as u32);
                    m.ts_ns = i;
                    m
                })
                .collect();
            w.process(&mut burst);
            for (i, m) in burst.iter().enumerate() {
                let want = if i as u32 % 3 == bad {
                    Outcome::Quarantined
                } else {
                    Outcome::Nf(Verdict::Pass)
                };
                assert_eq!(m.outcome, want, "round {round}, packet {i}");
            }
            for t in 0..3u32 {
                let row = &w.counters.tenants[t as usize];
                let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
                let want = if t == bad {
                    (3 * round, 0, 3 * round)
                } else {
                    (3 * round, 3 * round, 0)
                };
                assert_eq!(
                    (
                        load(&row.packets),
                        load(&row.passed),
                        load(&row.quarantined)
                    ),
                    want,
                    "round {round}, tenant {t}"
                );
            }
            // The failed miss gave its key back: the two tenants left keep one each, and
            // from the second burst on every group of theirs is a hit.
            if round > 1 {
                assert_eq!(mpk.stats().misses, misses, "round {round}");
            }
            misses = mpk.stats().misses;
        }
        assert!(w.quarantined(bad));
        assert!(!w.quarantined(0) && !w.quarantined(2));
        // Reported once, with the reason: its first group faulted; the later ones found
        // it quarantined and never tried the key again.
        match w.shared.notices.pop() {
            Some(Notice::Fault {
                tenant, message, ..
            }) => {
                assert_eq!(tenant, TenantSlot(bad));
                assert!(message.contains("pkey_mprotect"), "{message}");
            }
            None => panic!("no fault reported"),
        }
        assert!(w.shared.notices.pop().is_none());
        assert_eq!(mpk.stats().retag_failures, 1);
        assert_eq!(mpk.stats().retired_keys, 0);
        let got = table.get(TenantSlot(bad));
        assert!(got.entry().unwrap().lock_checked().is_err());
        assert!(!got.entry().unwrap().is_locked());
    }

    fn random_packet(rng: &mut buffet_testkit::rng::Rng, bad: bool) -> PacketBuf {
        let frame = if bad {
            vec![0xabu8; 1 + rng.index(13)]
        } else {
            udp_frame(rng.index(40))
        };
        let mut m = PacketBuf::heap();
        assert!(m.fill(&frame));
        if !bad && rng.below(2) == 0 {
            m.layout = Packet::parse(m.data_mut(), PacketMeta::default())
                .ok()
                .map(|p| p.layout());
            assert!(m.layout.is_some());
        }
        m
    }

    fn udp_frame(payload: usize) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1000, 2000);
        let mut out = Vec::with_capacity(b.size(payload));
        b.write(&mut out, &vec![7u8; payload]).expect("frame");
        out
    }

    /// Against a model of the documented semantics, for random bursts (lengths 1 to 300,
    /// runs of one tenant and mixtures, malformed frames, tenants never admitted): every
    /// packet's outcome and frame length, each tenant's packets reaching its state once and
    /// in arrival order, and each tenant's counters (packets, bytes, passed, drops by
    /// cause, malformed, no tenant, groups).
    #[test]
    fn process_matches_a_model_of_the_worker_path() {
        /// What the model expects in a tenant's counter row.
        #[derive(Default, Clone)]
        struct ModelCounts {
            packets: u64,
            bytes: u64,
            passed: u64,
            nf_drops: [u64; buffet_sdk::DropCause::ALL.len()],
            malformed: u64,
            no_tenant: u64,
        }
        let mut rng = buffet_testkit::rng::Rng::new(7);
        for &tenants in &[1u32, 3, 9, 70] {
            let storage = buffet_memory::MemoryStorage::new(buffet_memory::ArenaConfig {
                capacity: 64 << 20,
            })
            .unwrap();
            let table = Arc::new(TenantTable::new(storage, tenants + 1));
            // Every third slot stays empty: its packets are "no tenant".
            let admitted = |t: u32| t % 3 != 2;
            for t in (0..tenants).filter(|&t| admitted(t)) {
                table
                    .admit(TenantSlot(t), buffet_sdk::TenantId(t + 1), 4096, Vec::new())
                    .unwrap();
            }
            let mut w = Worker::new(Arc::new(Script), table.clone());
            let mut expected_order: Vec<Vec<u64>> = vec![Vec::new(); tenants as usize];
            let mut expected = vec![ModelCounts::default(); tenants as usize];
            let mut groups = vec![0u64; tenants as usize];
            let mut ts = 0u64;
            for _ in 0..60 {
                let len = 1 + rng.index(300);
                let runs = rng.below(2) == 0;
                let mut t = rng.below(u64::from(tenants)) as u32;
                let mut burst = Vec::with_capacity(len);
                let mut in_burst = vec![false; tenants as usize];
                for _ in 0..len {
                    if !runs || rng.below(4) == 0 {
                        t = rng.below(u64::from(tenants)) as u32;
                    }
                    let bad = rng.below(11) == 0;
                    let mut m = random_packet(&mut rng, bad);
                    m.tenant = TenantSlot(t);
                    m.ts_ns = ts;
                    ts += 1;
                    burst.push(m);
                }
                let lens: Vec<usize> = burst.iter().map(PacketBuf::len).collect();
                w.process(&mut burst);
                for (m, &len) in burst.iter().zip(&lens) {
                    let t = m.tenant.0 as usize;
                    let e = &mut expected[t];
                    in_burst[t] = true;
                    e.packets += 1;
                    e.bytes += len as u64;
                    let (outcome, new_len) = if !admitted(m.tenant.0) {
                        e.no_tenant += 1;
                        (Outcome::NoTenant, len)
                    } else if len < 42 {
                        e.malformed += 1;
                        (Outcome::Malformed, len)
                    } else {
                        expected_order[t].push(m.ts_ns);
                        match scripted(m.ts_ns) {
                            Verdict::Drop(c) => {
                                e.nf_drops[c.index()] += 1;
                                (Outcome::Nf(Verdict::Drop(c)), len)
                            }
                            Verdict::Tx => {
                                e.passed += 1;
                                (Outcome::Nf(Verdict::Tx), len - 1)
                            }
                            v => {
                                e.passed += 1;
                                (Outcome::Nf(v), len)
                            }
                        }
                    };
                    assert_eq!((m.outcome, m.len()), (outcome, new_len), "ts {}", m.ts_ns);
                    // A passed packet's frame may have changed: its layout is dropped.
                    if matches!(outcome, Outcome::Nf(Verdict::Pass | Verdict::Tx)) {
                        assert!(m.layout.is_none());
                    }
                }
                for (g, seen) in groups.iter_mut().zip(&in_burst) {
                    *g += u64::from(*seen);
                }
            }
            for t in 0..tenants as usize {
                let row = &w.counters.tenants[t];
                let e = &expected[t];
                let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
                assert_eq!(
                    (
                        load(&row.packets),
                        load(&row.bytes),
                        load(&row.passed),
                        load(&row.malformed),
                        load(&row.no_tenant),
                        load(&row.quarantined),
                        load(&row.groups),
                    ),
                    (
                        e.packets,
                        e.bytes,
                        e.passed,
                        e.malformed,
                        e.no_tenant,
                        0,
                        groups[t]
                    ),
                    "tenant {t} of {tenants}"
                );
                let drops: Vec<u64> = row.nf_drops.iter().map(load).collect();
                assert_eq!(drops, e.nf_drops.to_vec(), "tenant {t} of {tenants}");
                if admitted(t as u32) {
                    let got = table.get(TenantSlot(t as u32));
                    let entry = got.entry().unwrap();
                    assert_eq!(*entry.lock(), expected_order[t], "tenant {t} of {tenants}");
                }
            }
            assert_eq!(w.packets(), ts);
        }
    }

    fn table(slots: u32) -> TenantTable<u64> {
        let storage =
            buffet_memory::MemoryStorage::new(buffet_memory::ArenaConfig { capacity: 16 << 20 })
                .unwrap();
        TenantTable::new(storage, slots)
    }

    /// A hit without a per-slot generation check is only taken while nothing in the table
    /// changed: a replacement, a removal or an admission after the last revalidation is
    /// seen by the very next lookup, revalidated or not.
    #[test]
    fn entry_cache_sees_every_change_without_revalidating() {
        let t = table(4);
        t.admit(TenantSlot(1), buffet_sdk::TenantId(10), 4096, 1)
            .unwrap();
        let mut c = EntryCache::default();
        c.revalidate(&t);
        assert_eq!(c.lookup(&t, 1).map(|e| *e.lock()), Some(1));
        assert!(c.lookup(&t, 2).is_none());
        // Replaced after the last revalidation: the next lookup has the new state.
        t.replace_with(buffet_sdk::TenantId(10), 4096, 2, |_, _| {
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
        assert_eq!(c.lookup(&t, 1).map(|e| *e.lock()), Some(2));
        // Admitted at a slot that missed before.
        t.admit(TenantSlot(2), buffet_sdk::TenantId(20), 4096, 3)
            .unwrap();
        assert_eq!(c.lookup(&t, 2).map(|e| *e.lock()), Some(3));
        // Revalidated, then removed: gone at once.
        c.revalidate(&t);
        assert_eq!(c.lookup(&t, 1).map(|e| *e.lock()), Some(2));
        drop(t.remove(TenantSlot(1)));
        assert!(c.lookup(&t, 1).is_none());
        assert_eq!(c.lookup(&t, 2).map(|e| *e.lock()), Some(3));
        // The state address kept for prefetching is the entry's region base.
        let base = t.get(TenantSlot(2)).entry().unwrap().extent().base;
        assert!(matches!(&c.entries[2], Some(e) if e.state == base));
    }

    /// Prefetch hints never fault, whatever the address: null, unmapped, the top of the
    /// address space, a range longer than the line cap.
    #[test]
    fn prefetch_hints_never_fault() {
        sys::prefetch(std::ptr::null::<u8>(), 1);
        sys::prefetch(std::ptr::null::<u8>(), 0);
        sys::prefetch(usize::MAX as *const u8, 4096);
        sys::prefetch(std::ptr::without_provenance::<u64>(0x10), 1 << 20);
        let t = table(2);
        t.admit(TenantSlot(0), buffet_sdk::TenantId(1), 4096, 7)
            .unwrap();
        let mut c = EntryCache::default();
        c.prefetch_row(0);
        c.prefetch_entry(0);
        c.lookup(&t, 0);
        c.prefetch_row(0);
        c.prefetch_entry(0);
        c.prefetch_entry(1);
        c.prefetch_row(u32::MAX);
        let extent = t.get(TenantSlot(0)).entry().unwrap().extent();
        drop(t.remove(TenantSlot(0)));
        // The cache lets go of the entry: its region is released (inaccessible again).
        assert!(c.lookup(&t, 0).is_none());
        c.prefetch_entry(0);
        sys::prefetch(extent.base as *const u8, 64);
    }
}
