//! The pipeline: software Packet Dispatcher on the calling thread + the Worker Pool.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use buffet_dispatch::{
    Decision, DispatchDrop, Dispatcher, DispatcherConfig, Event, Match, TenantSlot, WorkerId,
};
use buffet_memory::{
    AdmitWithError, ArenaConfig, Domain, MemoryStorage, Mpk, MpkError, TenantTable,
};
use buffet_sdk::{InitError, NetworkFunction, PortId, TenantId, Verdict};
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::Backoff;
use serde::Serialize;

use crate::mbuf::{Mbuf, Outcome, MBUF_CAPACITY};
use crate::stats::{DropReason, GlobalReport, Report, TenantReport, WorkerCounters, WorkerReport};
use crate::worker::{Engine, Notice, Shared, WorkerThread};

/// How a [`Pipeline`] is built.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Workers launched at start.
    pub workers: u16,
    /// Each worker's MAX_NB: packets per timeslot before the scheduler calls it overloaded.
    pub worker_max_nb: u64,
    /// Dispatcher settings (timeslot shift, overload threshold, tagging, unmatched policy).
    pub dispatcher: DispatcherConfig,
    /// Slots of each worker's input ring.
    pub ring_size: usize,
    /// Packets a worker pops at once (a burst, grouped into Packet Buffers).
    pub burst: usize,
    /// Most tenants admitted at once (Tenant Table slots).
    pub tenant_capacity: u32,
    /// The Memory Manager's arena.
    pub arena: ArenaConfig,
    /// Pin worker `i` to core `i`.
    pub pin: bool,
    /// The isolation domain of every tenant region: [`Domain::None`] (type system only,
    /// for safe Rust NFs) or [`Domain::Mpk`] (Intel protection keys, for native NFs).
    pub domain: Domain,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            workers: 2,
            worker_max_nb: u64::MAX,
            dispatcher: DispatcherConfig::default(),
            ring_size: 1024,
            burst: 256,
            tenant_capacity: 16_384,
            arena: ArenaConfig::default(),
            pin: true,
            domain: Domain::None,
        }
    }
}

/// A tenant to admit.
#[derive(Clone, Debug)]
pub struct TenantSpec<P> {
    /// The tenant's id.
    pub id: TenantId,
    /// A human name for tables.
    pub name: String,
    /// Classifier rules `(priority, match)`; lower priority wins.
    pub rules: Vec<(u32, Match)>,
    /// MAX_NB per timeslot (0 = unlimited).
    pub max_nb: u64,
    /// The NF policy handed to `init`.
    pub policy: P,
}

/// Why a tenant could not be admitted or removed. Nothing changed when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The id is taken.
    #[error("tenant {0} is already admitted")]
    Duplicate(TenantId),
    /// No such tenant.
    #[error("tenant {0} is not admitted")]
    Unknown(TenantId),
    /// Every Tenant Table slot is in use.
    #[error("too many tenants: all {0} slots are in use")]
    TooMany(u32),
    /// The NF rejected the policy.
    #[error("tenant {tenant}: {source}")]
    Policy {
        /// The tenant.
        tenant: TenantId,
        /// The NF's reason.
        source: InitError,
    },
    /// The Memory Manager could not place the tenant.
    #[error("tenant {tenant}: {source}")]
    Memory {
        /// The tenant.
        tenant: TenantId,
        /// Its reason.
        source: buffet_memory::AdmitError,
    },
    /// The dispatcher rejected the rules.
    #[error("tenant {tenant}: {source}")]
    Dispatch {
        /// The tenant.
        tenant: TenantId,
        /// Its reason.
        source: buffet_dispatch::AdmitError,
    },
}

/// Why a pipeline operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The arena could not be reserved.
    #[error("memory arena: {0}")]
    Arena(#[from] buffet_memory::ArenaError),
    /// A configuration value is unusable.
    #[error("invalid pipeline configuration: {0}")]
    Config(String),
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Spawn(std::io::Error),
    /// The isolation domain asked for cannot be set up on this machine.
    #[error("isolation: {0}")]
    Isolation(#[from] MpkError),
    /// No such worker, or it is already terminated.
    #[error("worker {0} is not live")]
    NotLive(u16),
    /// Terminating it would leave no worker.
    #[error("worker {0} is the last live worker")]
    LastWorker(u16),
}

/// Something the control side should know about, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// The scheduler moved a tenant off an overloaded worker (at input packet `seq`).
    Migration {
        /// Input packet index that triggered it.
        seq: u64,
        /// The tenant.
        tenant: TenantId,
        /// Old worker.
        from: u16,
        /// New worker.
        to: u16,
        /// Timeslot.
        slot: u64,
    },
    /// A worker stayed overloaded for more than `threshold` checks: report to the Agent.
    Overload {
        /// Input packet index.
        seq: u64,
        /// The worker.
        worker: u16,
        /// Timeslot.
        slot: u64,
    },
    /// A handler fault quarantined a tenant.
    Fault {
        /// The tenant.
        tenant: TenantId,
        /// Where it ran.
        worker: u16,
        /// The panic message.
        message: String,
    },
    /// A worker was launched at run time.
    WorkerLaunched {
        /// Its id.
        worker: u16,
    },
    /// A worker was terminated; its tenants moved.
    WorkerTerminated {
        /// Its id.
        worker: u16,
        /// Tenants reassigned.
        reassigned: usize,
    },
}

/// Where passed packets go (a pcap writer, a TX port).
pub trait PacketSink {
    /// One packet the NF let through, with its verdict.
    fn emit(&mut self, ts_ns: u64, in_port: PortId, verdict: Verdict, data: &[u8]);

    /// Flushes and closes the sink after the last packet; the error ends up in
    /// [`Report::sink_error`].
    fn close(&mut self) -> Result<(), String> {
        Ok(())
    }
}

struct WorkerSlot {
    rx: Arc<ArrayQueue<Box<Mbuf>>>,
    done: Arc<ArrayQueue<Box<Mbuf>>>,
    stop: Arc<AtomicBool>,
    counters: Arc<WorkerCounters>,
    thread: Option<JoinHandle<()>>,
    live: bool,
    dispatched: u64,
    completed: u64,
}

struct TenantInfo {
    id: TenantId,
    name: String,
    /// Counters this slot had when the tenant was admitted (slots are reused).
    baseline: TenantReport,
}

/// The software pipeline: dispatcher on the calling thread, workers on their own.
pub struct Pipeline<N: NetworkFunction> {
    cfg: PipelineConfig,
    shared: Shared<N>,
    dispatcher: Dispatcher,
    workers: Vec<WorkerSlot>,
    // Boxed on purpose: 2 KiB buffers travel between threads as one pointer.
    #[allow(clippy::vec_box)]
    free: Vec<Box<Mbuf>>,
    tenants: Vec<Option<TenantInfo>>,
    by_id: BTreeMap<TenantId, u32>,
    free_slots: Vec<u32>,
    /// Removed slots waiting for their queued packets to drain: (slot, dispatched per worker).
    retiring: Vec<(u32, Vec<u64>)>,
    next_slot: u32,
    policed: Vec<u64>,
    migrations: Vec<u64>,
    global: GlobalReport,
    events: Vec<WorkerEvent>,
    sink: Option<Box<dyn PacketSink>>,
    seq: u64,
}

impl<N: NetworkFunction> Pipeline<N> {
    /// Reserves the arena and launches `cfg.workers` workers.
    pub fn new(nf: N, cfg: PipelineConfig) -> Result<Self, PipelineError> {
        if cfg.workers == 0 {
            return Err(PipelineError::Config(
                "at least one worker is needed".into(),
            ));
        }
        if cfg.worker_max_nb == 0 {
            return Err(PipelineError::Config(
                "worker MAX_NB must be at least 1".into(),
            ));
        }
        if cfg.burst == 0 || cfg.ring_size < cfg.burst {
            return Err(PipelineError::Config("need 1 <= burst <= ring_size".into()));
        }
        if cfg.tenant_capacity == 0 {
            return Err(PipelineError::Config(
                "tenant capacity must be at least 1".into(),
            ));
        }
        let storage = MemoryStorage::new(cfg.arena)?;
        let cap = cfg.tenant_capacity;
        let table = match cfg.domain {
            Domain::Mpk => {
                let mpk = Mpk::get()?;
                check_mpk_workers(mpk, cfg.workers)?;
                TenantTable::with_mpk(storage, cap, mpk)
            }
            _ => TenantTable::new(storage, cap),
        };
        let shared = Shared {
            nf: Arc::new(nf),
            table: Arc::new(table),
            quarantined: (0..cap).map(|_| AtomicBool::new(false)).collect(),
            notices: Arc::new(ArrayQueue::new(1024)),
            ids: (0..cap).map(|_| AtomicU32::new(0)).collect(),
        };
        let mut p = Pipeline {
            dispatcher: Dispatcher::new(cfg.dispatcher),
            shared,
            workers: Vec::new(),
            free: Vec::new(),
            tenants: (0..cap).map(|_| None).collect(),
            by_id: BTreeMap::new(),
            free_slots: Vec::new(),
            retiring: Vec::new(),
            next_slot: 0,
            policed: vec![0; cap as usize],
            migrations: vec![0; cap as usize],
            global: GlobalReport::default(),
            events: Vec::new(),
            sink: None,
            seq: 0,
            cfg,
        };
        for _ in 0..p.cfg.workers {
            p.spawn_worker()?;
        }
        Ok(p)
    }

    /// Sends every passed packet to `sink` from now on.
    pub fn set_sink(&mut self, sink: Box<dyn PacketSink>) {
        self.sink = Some(sink);
    }

    /// The NF.
    pub fn nf(&self) -> &N {
        &self.shared.nf
    }

    /// The dispatcher (read-only: tables, stats).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    fn spawn_worker(&mut self) -> Result<WorkerId, PipelineError> {
        let id = self.dispatcher.add_worker(self.cfg.worker_max_nb);
        debug_assert_eq!(id.0 as usize, self.workers.len());
        let slot = WorkerSlot {
            rx: Arc::new(ArrayQueue::new(self.cfg.ring_size)),
            done: Arc::new(ArrayQueue::new(self.cfg.ring_size)),
            stop: Arc::new(AtomicBool::new(false)),
            counters: Arc::new(WorkerCounters::new(self.cfg.tenant_capacity)),
            thread: None,
            live: true,
            dispatched: 0,
            completed: 0,
        };
        let thread = WorkerThread {
            engine: Engine::with_shared(id, self.shared.clone(), slot.counters.clone()),
            rx: slot.rx.clone(),
            done: slot.done.clone(),
            stop: slot.stop.clone(),
            burst: self.cfg.burst,
            pin: self.cfg.pin.then_some(id.0 as usize),
        };
        let handle = std::thread::Builder::new()
            .name(format!("buffet-worker-{}", id.0))
            .spawn(move || thread.run())
            .map_err(PipelineError::Spawn)?;
        self.workers.push(WorkerSlot {
            thread: Some(handle),
            ..slot
        });
        // Enough buffers to fill this worker's input and completion rings.
        self.free
            .extend((0..2 * self.cfg.ring_size).map(|_| Mbuf::boxed()));
        Ok(id)
    }

    /// Launches one more worker at run time.
    pub fn launch_worker(&mut self) -> Result<WorkerId, PipelineError> {
        if self.cfg.domain == Domain::Mpk {
            let live = self.workers.iter().filter(|w| w.live).count();
            check_mpk_workers(Mpk::get()?, live as u16 + 1)?;
        }
        let id = self.spawn_worker()?;
        self.events
            .push(WorkerEvent::WorkerLaunched { worker: id.0 });
        Ok(id)
    }

    /// Terminates a worker at run time: its tenants are reassigned to live workers, and
    /// the packets already queued to it are still processed before its thread exits.
    pub fn terminate_worker(&mut self, w: WorkerId) -> Result<(), PipelineError> {
        let live = self.workers.iter().filter(|s| s.live).count();
        match self.workers.get(w.0 as usize) {
            Some(s) if s.live => {}
            _ => return Err(PipelineError::NotLive(w.0)),
        }
        if live == 1 {
            return Err(PipelineError::LastWorker(w.0));
        }
        let moved = self.dispatcher.terminate_worker(w);
        let slot = &mut self.workers[w.0 as usize];
        slot.live = false;
        slot.stop.store(true, Ordering::Release);
        self.events.push(WorkerEvent::WorkerTerminated {
            worker: w.0,
            reassigned: moved.len(),
        });
        Ok(())
    }

    /// Ids of the live workers.
    pub fn live_workers(&self) -> Vec<WorkerId> {
        (0..self.workers.len())
            .filter(|&i| self.workers[i].live)
            .map(|i| WorkerId(i as u16))
            .collect()
    }

    /// Admits a tenant: `init` builds its state, the Memory Manager places it in a
    /// region of its own, the dispatcher learns its rules. Changes nothing on error.
    pub fn admit(&mut self, spec: TenantSpec<N::Policy>) -> Result<TenantSlot, AdmitError> {
        let id = spec.id;
        if self.by_id.contains_key(&id) {
            return Err(AdmitError::Duplicate(id));
        }
        self.reclaim_retired();
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None if self.next_slot < self.cfg.tenant_capacity => {
                self.next_slot += 1;
                self.next_slot - 1
            }
            None => return Err(AdmitError::TooMany(self.cfg.tenant_capacity)),
        };
        let bytes = self.shared.nf.register().bytes;
        // `init` runs on the state in its region, inside the tenant's isolation domain.
        let nf = &self.shared.nf;
        let admitted =
            self.shared
                .table
                .admit_with(slot, id, bytes, N::State::default(), |state, region| {
                    nf.init_in_region(&spec.policy, state, region)
                });
        if let Err(e) = admitted {
            self.free_slots.push(slot);
            return Err(match e {
                AdmitWithError::Init(source) => AdmitError::Policy { tenant: id, source },
                AdmitWithError::Admit(source) => AdmitError::Memory { tenant: id, source },
            });
        }
        if let Err(source) = self
            .dispatcher
            .admit(TenantSlot(slot), id, spec.rules, spec.max_nb)
        {
            self.shared.table.remove(slot);
            self.free_slots.push(slot);
            return Err(AdmitError::Dispatch { tenant: id, source });
        }
        let i = slot as usize;
        self.shared.ids[i].store(id.0, Ordering::Relaxed);
        self.shared.quarantined[i].store(false, Ordering::Release);
        self.policed[i] = 0;
        self.migrations[i] = 0;
        let mut baseline = TenantReport::default();
        for w in &self.workers {
            w.counters.tenants[i].add_into(&mut baseline);
        }
        self.tenants[i] = Some(TenantInfo {
            id,
            name: spec.name,
            baseline,
        });
        self.by_id.insert(id, slot);
        Ok(TenantSlot(slot))
    }

    /// Removes a tenant at run time. Its queued packets are dropped (`no_tenant`), its
    /// region is zeroed and returned; other tenants are not paused.
    pub fn remove(&mut self, id: TenantId) -> Result<(), AdmitError> {
        let slot = *self.by_id.get(&id).ok_or(AdmitError::Unknown(id))?;
        self.dispatcher
            .remove(TenantSlot(slot))
            .map_err(|source| AdmitError::Dispatch { tenant: id, source })?;
        self.shared.table.remove(slot);
        self.by_id.remove(&id);
        self.tenants[slot as usize] = None;
        let snapshot = self.workers.iter().map(|w| w.dispatched).collect();
        self.retiring.push((slot, snapshot));
        Ok(())
    }

    /// Makes removed slots reusable once every packet dispatched before the removal has
    /// completed, so a queued packet can never meet the next tenant's state.
    fn reclaim_retired(&mut self) {
        let workers = &self.workers;
        self.retiring.retain(|(slot, snap)| {
            let drained = snap.iter().zip(workers).all(|(d, w)| w.completed >= *d);
            if drained {
                self.free_slots.push(*slot);
            }
            !drained
        });
    }

    /// The slot of an admitted tenant.
    pub fn slot_of(&self, id: TenantId) -> Option<TenantSlot> {
        self.by_id.get(&id).map(|s| TenantSlot(*s))
    }

    /// Offers one frame. Blocks (polling completions) while the chosen worker's ring or
    /// the buffer pool is full: replay is lossless.
    pub fn push(&mut self, ts_ns: u64, in_port: PortId, frame: &[u8]) {
        let seq = self.seq;
        self.seq += 1;
        self.global.input_packets += 1;
        if frame.len() > MBUF_CAPACITY {
            self.global.oversize += 1;
            return;
        }
        if seq % 32 == 0 {
            self.poll_completions();
        }
        let mut m = self.take_mbuf();
        m.fill(frame);
        m.ts_ns = ts_ns;
        m.in_port = in_port;
        let decision = self.dispatcher.dispatch(ts_ns, in_port, m.data_mut());
        self.collect_events(seq);
        match decision {
            Decision::Pass { worker, tenant } => {
                m.tenant = tenant;
                self.send(worker, m);
            }
            Decision::Drop(why) => {
                match why {
                    DispatchDrop::Malformed(e) => self.global.add_malformed(e),
                    DispatchDrop::Unmatched => self.global.unmatched += 1,
                    DispatchDrop::Policed(t) => self.policed[t.0 as usize] += 1,
                    DispatchDrop::NoLiveWorker => self.global.no_live_worker += 1,
                }
                self.free.push(m);
            }
        }
    }

    fn take_mbuf(&mut self) -> Box<Mbuf> {
        let backoff = Backoff::new();
        loop {
            if let Some(m) = self.free.pop() {
                return m;
            }
            self.poll_completions();
            backoff.snooze();
        }
    }

    fn send(&mut self, worker: WorkerId, m: Box<Mbuf>) {
        let i = worker.0 as usize;
        let rx = self.workers[i].rx.clone();
        let backoff = Backoff::new();
        let mut m = m;
        while let Err(back) = rx.push(m) {
            m = back;
            self.poll_completions();
            backoff.snooze();
        }
        self.workers[i].dispatched += 1;
    }

    fn collect_events(&mut self, seq: u64) {
        for e in self.dispatcher.drain_events() {
            match e {
                Event::Migration {
                    tenant,
                    from,
                    to,
                    slot,
                } => {
                    self.migrations[tenant.0 as usize] += 1;
                    let id = TenantId(self.shared.ids[tenant.0 as usize].load(Ordering::Relaxed));
                    self.events.push(WorkerEvent::Migration {
                        seq,
                        tenant: id,
                        from: from.0,
                        to: to.0,
                        slot,
                    });
                }
                Event::Overload { worker, slot } => self.events.push(WorkerEvent::Overload {
                    seq,
                    worker: worker.0,
                    slot,
                }),
            }
        }
    }

    /// Takes processed packets back from the workers: passes go to the sink, buffers
    /// return to the pool, worker notices become events.
    pub fn poll_completions(&mut self) {
        for w in &mut self.workers {
            while let Some(m) = w.done.pop() {
                w.completed += 1;
                if let (Outcome::Nf(v), Some(sink)) = (m.outcome, self.sink.as_mut()) {
                    if v.is_pass() {
                        sink.emit(m.ts_ns, m.in_port, v, m.data());
                    }
                }
                self.free.push(m);
            }
        }
        while let Some(Notice::Fault {
            tenant,
            worker,
            message,
        }) = self.shared.notices.pop()
        {
            let id = TenantId(self.shared.ids[tenant.0 as usize].load(Ordering::Relaxed));
            self.events.push(WorkerEvent::Fault {
                tenant: id,
                worker: worker.0,
                message,
            });
        }
    }

    fn in_flight(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.dispatched - w.completed)
            .sum()
    }

    /// Waits until every packet pushed so far has been processed.
    pub fn flush(&mut self) {
        let backoff = Backoff::new();
        while self.in_flight() > 0 {
            self.poll_completions();
            backoff.snooze();
        }
        self.poll_completions();
    }

    /// Events so far (scheduler migrations and overloads, faults, worker changes).
    pub fn events(&self) -> &[WorkerEvent] {
        &self.events
    }

    /// A snapshot of everything counted so far (call [`flush`](Self::flush) first for
    /// exact numbers).
    pub fn report(&self) -> Report {
        let mut tenants = Vec::new();
        for (i, info) in self.tenants.iter().enumerate() {
            let Some(info) = info else { continue };
            let mut r = TenantReport {
                id: info.id,
                name: info.name.clone(),
                ..Default::default()
            };
            for w in &self.workers {
                w.counters.tenants[i].add_into(&mut r);
            }
            subtract(&mut r, &info.baseline);
            r.add_drop(DropReason::Policed, self.policed[i]);
            r.migrations = self.migrations[i];
            r.quarantined = self.shared.quarantined[i].load(Ordering::Acquire);
            if let Some(row) = self.dispatcher.scheduler().tenant(TenantSlot(i as u32)) {
                r.worker = row.worker.0;
            }
            if let Some(entry) = &*self.shared.table.get(i as u32) {
                if !r.quarantined {
                    let state = entry.lock();
                    r.nf = self.shared.nf.summary(&state).into_iter().collect();
                }
            }
            tenants.push(r);
        }
        tenants.sort_by_key(|t| t.id);
        let workers = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| WorkerReport {
                id: i as u16,
                live: w.live,
                packets: w.counters.packets.load(Ordering::Relaxed),
                bursts: w.counters.bursts.load(Ordering::Relaxed),
                busy_cycles: w.counters.busy_cycles.load(Ordering::Relaxed),
                dispatched: w.dispatched,
            })
            .collect();
        Report {
            tenants,
            workers,
            global: self.global.clone(),
            events: self.events.clone(),
            sink_error: None,
        }
    }

    /// Processes everything in flight, stops and joins every worker, and reports.
    pub fn finish(mut self) -> Report {
        self.flush();
        for w in &self.workers {
            w.stop.store(true, Ordering::Release);
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        self.poll_completions();
        let mut report = self.report();
        if let Some(sink) = self.sink.as_mut() {
            report.sink_error = sink.close().err();
        }
        report
    }
}

impl<N: NetworkFunction> Drop for Pipeline<N> {
    fn drop(&mut self) {
        for w in &self.workers {
            w.stop.store(true, Ordering::Release);
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                // Workers only exit once their ring is empty; drain completions meanwhile.
                while !t.is_finished() {
                    while w.done.pop().is_some() {}
                    std::thread::yield_now();
                }
                let _ = t.join();
            }
        }
    }
}

/// MPK: every worker may pin one cache key at a time and the control thread one more
/// (reports lock tenants); more would make groups wait for keys.
fn check_mpk_workers(mpk: &Mpk, workers: u16) -> Result<(), PipelineError> {
    if usize::from(workers) + 1 > mpk.cache_keys() {
        return Err(PipelineError::Config(format!(
            "MPK isolation: {workers} workers need {} protection keys, this process has {}",
            usize::from(workers) + 1,
            mpk.cache_keys()
        )));
    }
    Ok(())
}

fn subtract(r: &mut TenantReport, base: &TenantReport) {
    r.packets -= base.packets;
    r.bytes -= base.bytes;
    r.passed -= base.passed;
    r.cycles -= base.cycles;
    r.groups -= base.groups;
    for (k, v) in &base.drops {
        if let Some(n) = r.drops.get_mut(k) {
            *n -= v;
        }
    }
    r.drops.retain(|_, n| *n != 0);
}
