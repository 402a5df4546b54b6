//! The pipeline, split in two: a [`Control`] handle (`Send + Sync + Clone`) that admits
//! and removes tenants, launches and terminates workers, and asks for reports; and a
//! [`Dataplane`] that owns the software Packet Dispatcher, the worker rings and the
//! ports, and applies the control handle's [`Command`]s between bursts. Events (scheduler
//! migrations and overload reports, faults, worker changes) leave through a bounded
//! channel; when nobody drains it, new events are counted as dropped, never queued
//! without bound.
//!
//! A tenant's `init` runs on the control side (in its region, in its isolation domain),
//! never on the data plane's thread: admitting a tenant whose policy takes long to compile
//! does not pause anyone's traffic. The data plane only learns the tenant's rules.
//!
//! When the Packet Dispatcher runs outside the data plane (the XDP program in the NIC
//! path), [`build_with_sources`] gives each worker its own [`WorkerSource`] to poll; the
//! data plane then only takes finished frames back, routes and transmits them, and
//! records the outside dispatcher's events ([`Control::dispatcher_events`]).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use buffet_dispatch::{
    Decision, DispatchDrop, DispatchError, Dispatcher, DispatcherConfig, Event, Match, TenantSlot,
    WorkerId,
};
use buffet_io::{HeapPool, Outcome, PacketBuf, Port, PortError, PortStats, Rx};
use buffet_memory::{
    AdmitWithError, ArenaConfig, Domain, MemoryError, MemoryStorage, Mpk, MpkError, Replacement,
    TenantEntry, TenantTable,
};
use buffet_sdk::{InitError, NetworkFunction, PortId, RegistryError, TenantId, Verdict};
use crossbeam::channel::{self, Receiver, Sender};
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::Backoff;
use serde::Serialize;

use crate::buffers::{BufferConfig, ClockSource};
use crate::completions::Completions;
use crate::idle::{Idle, IdleShared, Waker};
use crate::stats::{
    DropReason, GlobalReport, Report, TenantReport, WorkerCounters, WorkerReport, RUNNING_WAITS,
};
use crate::worker::{FlushSync, Notice, Shared, Worker, WorkerSource, WorkerThread, GATE_OPEN};

/// Events the channel holds before new ones are counted as dropped.
pub const EVENT_CAPACITY: usize = 1 << 16;

/// Scheduler events (migrations and overload reports) a [`Pipeline`] keeps for its
/// report by default ([`PipelineConfig::events_kept`]).
pub const EVENTS_KEPT: usize = 1 << 18;

/// How a [`Pipeline`] is built.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Workers launched at start.
    pub workers: u16,
    /// Each worker's MAX_NB: packets per timeslot before the scheduler calls it overloaded.
    pub worker_max_nb: u64,
    /// Dispatcher settings (timeslot shift, overload threshold, tagging, unmatched policy).
    pub dispatcher: DispatcherConfig,
    /// Slots of each worker's input ring. Its completion ring has room for `ring_size`
    /// frames in batches of [`Completions::BATCH`], four times over, so a worker handing
    /// back a few frames at a time still has `ring_size / 8` batches before it waits.
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
    /// Where [`Verdict::Pass`] sends a packet, by input port: `routes[in_port]` (a port
    /// missing here passes packets back out of the port they came in on).
    pub routes: Vec<PortId>,
    /// Packets that make a tenant's persistent Packet Buffer a full group, run at once
    /// (32 is the paper's figure). 0, the default, turns persistence off: each burst is
    /// grouped and run as it arrives (docs/RESULTS.md, issue 14, says why it is off).
    pub flush_packets: usize,
    /// Latency bound (ns): a buffer whose oldest packet waited this long runs even when
    /// not full. A worker whose input runs dry runs every buffer at once anyway.
    pub flush_ns: u64,
    /// Weighted deficit round robin quantum per unit of tenant weight, in units of NF
    /// work (CPU cycles; virtual nanoseconds on a [`ClockSource::Virtual`] clock).
    pub drr_quantum: u64,
    /// Where workers read time for the latency bound and the DRR charge.
    pub clock: ClockSource,
    /// Scheduler events (migrations and overload reports) a [`Pipeline`] keeps for its
    /// report: the first this many of a run. Later ones are only counted
    /// ([`GlobalReport::migrations_not_kept`], [`GlobalReport::overloads_not_kept`]), so
    /// a run that goes on for days under overload, which reports every timeslot, does
    /// not grow without bound. Faults and worker changes are always kept.
    pub events_kept: usize,
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
            routes: Vec::new(),
            flush_packets: 0,
            flush_ns: 50_000,
            drr_quantum: 16_384,
            clock: ClockSource::System,
            events_kept: EVENTS_KEPT,
        }
    }
}

impl PipelineConfig {
    /// The Packet Buffer settings of each worker (`None`: persistence off).
    fn buffers(&self) -> Option<BufferConfig> {
        (self.flush_packets > 0).then(|| BufferConfig {
            group: self.flush_packets,
            latency_ns: self.flush_ns,
            quantum: self.drr_quantum,
            capacity: self.ring_size.max(self.burst),
        })
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

/// Why a pipeline operation failed: building it, a control call (admit, update, remove,
/// workers), a port. When a control call returns it, nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
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
        source: MemoryError,
    },
    /// The Packet Dispatcher rejected the rules.
    #[error("tenant {tenant}: {source}")]
    Dispatch {
        /// The tenant.
        tenant: TenantId,
        /// Its reason.
        source: DispatchError,
    },
    /// The arena could not be reserved.
    #[error("memory arena: {0}")]
    Arena(#[from] buffet_memory::ArenaError),
    /// A configuration value is unusable.
    #[error("invalid pipeline configuration: {0}")]
    Config(String),
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Spawn(std::io::Error),
    /// The NF could not prepare a new worker thread
    /// ([`NetworkFunction::prepare_worker_thread`]); the worker was not launched.
    #[error("worker {worker}: the NF could not prepare its thread: {source}")]
    WorkerSetup {
        /// The worker that was being started.
        worker: u16,
        /// The NF's reason.
        source: buffet_sdk::WorkerThreadError,
    },
    /// The isolation domain asked for cannot be set up on this machine.
    #[error("isolation: {0}")]
    Isolation(#[from] MpkError),
    /// No such worker, or it is already terminated.
    #[error("worker {0} is not live")]
    NotLive(u16),
    /// Terminating it would leave no worker.
    #[error("worker {0} is the last live worker")]
    LastWorker(u16),
    /// The data plane has stopped.
    #[error("the data plane has stopped")]
    Stopped,
    /// [`Control::release`] of a tenant that is not quarantined.
    #[error("tenant {0} is not quarantined")]
    NotQuarantined(TenantId),
    /// [`Control::release`] of a tenant whose state a stuck worker still holds.
    #[error(
        "tenant {0}'s state is held by a worker stuck in its handler: replace the state \
         first (update its policy), then release it"
    )]
    StateHeldByStuckWorker(TenantId),
    /// [`Control::release`] within the tenant's backoff: it faulted again too recently.
    #[error(
        "tenant {tenant} faulted {faults} times; it can be released in {} ms (backoff of {} ms \
         from its last fault)",
        remaining.as_millis(),
        backoff.as_millis()
    )]
    QuarantineBackoff {
        /// The tenant.
        tenant: TenantId,
        /// Faults since its admission.
        faults: u32,
        /// The backoff its fault count earns.
        backoff: Duration,
        /// What is left of it.
        remaining: Duration,
    },
    /// A port failed. A file's error names the file already, so only a live port's
    /// error names the port.
    #[error("{}", port_failed(.port, .source))]
    Port {
        /// The port's name.
        port: String,
        /// What failed.
        source: PortError,
    },
}

impl PipelineError {
    /// A port's interface went down or away ([`PortError::LinkLost`]): a notice the data
    /// plane raised as a [`WorkerEvent::PortDown`] and went on after, not a failure.
    pub fn is_link_lost(&self) -> bool {
        matches!(
            self,
            PipelineError::Port {
                source: PortError::LinkLost { .. },
                ..
            }
        )
    }
}

fn port_failed(port: &str, source: &PortError) -> String {
    match source {
        PortError::Source(_) | PortError::Pcap(_) => source.to_string(),
        _ => format!("port {port}: {source}"),
    }
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
        /// The panic message, or for a [`Verdict::Fault`] what the NF says about it
        /// (an eBPF program over its cost budget: the units it spent and the budget).
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
    /// A worker thread died outside a handler (a panic the per-group containment does not
    /// cover). Its tenants moved to live workers; the frames still in its input ring went
    /// to their tenants' new workers; the frames of the burst it held came back
    /// unprocessed and are counted as `worker_died` drops of their tenants.
    WorkerDied {
        /// Its id.
        worker: u16,
        /// Why it died (the panic message).
        message: String,
        /// Tenants reassigned.
        reassigned: usize,
        /// Queued frames handed to live workers.
        requeued: u64,
        /// Frames of its burst dropped unprocessed.
        dropped: u64,
    },
    /// A worker made no progress for half a timeslot (at least
    /// [`MIN_STALL`]) with packets queued: a handler that never returns, which a safe
    /// Rust NF cannot be interrupted in. The tenants whose state it holds are
    /// quarantined (their packets are dropped, counted, wherever they are sent, without
    /// touching that state); its tenants moved to live workers and the frames in its
    /// input ring with them. Its thread is left to run and never joined.
    WorkerStuck {
        /// Its id.
        worker: u16,
        /// The tenants it is stuck in (quarantined).
        tenants: Vec<TenantId>,
        /// Tenants reassigned.
        reassigned: usize,
        /// Queued frames handed to live workers.
        requeued: u64,
        /// Frames in the burst it holds (global `stuck_in_worker`).
        stuck: u64,
    },
    /// A live port's interface went down or away (its socket reported it while the data
    /// plane waited). Down, frames arrive again once it is up; gone, the port receives
    /// nothing more. The data plane goes on with its other ports.
    PortDown {
        /// The port's name.
        port: String,
        /// What happened, in words.
        message: String,
    },
    /// The operator released a quarantined tenant ([`Control::release`]).
    Released {
        /// The tenant.
        tenant: TenantId,
        /// Faults since its admission.
        faults: u32,
    },
}

/// Shortest time without progress before a worker with queued packets counts as stuck
/// (otherwise half a timeslot); its thread must also have run for a quarter of it.
pub const MIN_STALL: Duration = Duration::from_millis(500);

/// The backoff after a tenant's second fault, doubled by every fault after it (see
/// [`Control::release`]); change it with [`Control::set_quarantine_backoff`].
pub const QUARANTINE_BACKOFF: Duration = Duration::from_secs(1);

/// A request from a [`Control`] handle, applied by the [`Dataplane`] between bursts. Each
/// carries the channel its answer goes back on.
pub enum Command {
    /// Teach the dispatcher a tenant already placed in the Tenant Table.
    Admit {
        /// The tenant's slot (from the Tenant Table).
        slot: TenantSlot,
        /// Its name, for reports.
        name: String,
        /// Classifier rules.
        rules: Vec<(u32, Match)>,
        /// MAX_NB per timeslot.
        max_nb: u64,
        /// The answer.
        reply: Sender<Result<WorkerId, DispatchError>>,
    },
    /// Forget a tenant: its rules, its Load Monitor row; its slot retires until the
    /// packets already queued under it drain.
    Remove {
        /// The tenant's slot.
        slot: TenantSlot,
        /// Workers fed by their own source that may still hold frames of the slot (see
        /// [`Control::remove_holding`]).
        hold: Vec<WorkerId>,
        /// The answer.
        reply: Sender<Result<(), DispatchError>>,
    },
    /// Swap an admitted tenant's name, classifier rules, MAX_NB and (optionally) NF state
    /// in one data-plane step (see [`Control::update`] and [`Control::reconfigure`]).
    Update {
        /// The tenant.
        id: TenantId,
        /// Its slot when the update was asked for.
        slot: TenantSlot,
        /// Its new name.
        name: String,
        /// Its new classifier rules.
        rules: Vec<(u32, Match)>,
        /// Its new MAX_NB per timeslot.
        max_nb: u64,
        /// Publishes the tenant's new state, already built (`None`: the state stays).
        publish: Option<Box<dyn FnOnce() -> Result<(), PipelineError> + Send>>,
        /// The answer.
        reply: Sender<Result<(), PipelineError>>,
    },
    /// Start one more worker.
    LaunchWorker {
        /// Its own packet source (`None`: fed by this data plane's dispatcher).
        source: Option<Box<dyn WorkerSource>>,
        /// The answer.
        reply: Sender<Result<WorkerId, PipelineError>>,
    },
    /// Stop a worker; its tenants move to live workers, its queued packets still run.
    TerminateWorker {
        /// The worker.
        worker: WorkerId,
        /// The answer.
        reply: Sender<Result<(), PipelineError>>,
    },
    /// Lift a tenant's quarantine (see [`Control::release`]).
    Release {
        /// The tenant's slot.
        slot: TenantSlot,
        /// The answer.
        reply: Sender<Result<(), PipelineError>>,
    },
    /// A snapshot of every counter.
    Report {
        /// The answer.
        reply: Sender<Report>,
    },
    /// Migrations and overload reports of a Packet Dispatcher outside this data plane
    /// (the XDP program's ring buffer): recorded and sent on like the software
    /// dispatcher's.
    DispatcherEvents(Vec<Event>),
    /// Finish what is in flight and stop running.
    Stop,
}

/// What the control side and the data plane share.
pub(crate) struct Core<N: NetworkFunction> {
    shared: Shared<N>,
    /// Tenant names by slot (reports only).
    names: Mutex<Vec<Option<String>>>,
    events_dropped: AtomicU64,
    stopped: AtomicBool,
    /// [`QUARANTINE_BACKOFF`] or what the operator set, in nanoseconds.
    backoff_ns: AtomicU64,
    /// Every worker's counters, by worker id (read by [`Control::worker_progress`]).
    counters: Mutex<Vec<Arc<WorkerCounters>>>,
}

/// The control handle: `Send + Sync + Clone`, usable from any thread (a daemon's API
/// tasks, an Agent, a test thread) while the data plane runs elsewhere. Every call is
/// applied by the data plane between bursts; calls that need an answer block until the
/// data plane gave it, so a data plane must be running (or be driven, as [`Pipeline`]
/// does) for them to return.
pub struct Control<N: NetworkFunction> {
    core: Arc<Core<N>>,
    commands: Sender<Command>,
    events: Receiver<WorkerEvent>,
    /// The data plane's: woken when a command is sent.
    waker: Arc<Waker>,
}

impl<N: NetworkFunction> Clone for Control<N> {
    fn clone(&self) -> Self {
        Control {
            core: self.core.clone(),
            commands: self.commands.clone(),
            events: self.events.clone(),
            waker: self.waker.clone(),
        }
    }
}

impl<N: NetworkFunction> Control<N> {
    /// The NF.
    pub fn nf(&self) -> &N {
        &self.core.shared.nf
    }

    /// The events channel: migrations, overload reports, faults, worker changes, in the
    /// order they happened. Bounded ([`EVENT_CAPACITY`]); see [`events_dropped`](Self::events_dropped).
    pub fn events(&self) -> &Receiver<WorkerEvent> {
        &self.events
    }

    /// Events dropped because the channel was full.
    pub fn events_dropped(&self) -> u64 {
        self.core.events_dropped.load(Ordering::Relaxed)
    }

    /// The slot of an admitted tenant.
    pub fn slot_of(&self, id: TenantId) -> Option<TenantSlot> {
        self.core.shared.table.slot_of(id)
    }

    /// The Memory Manager's counters: regions and bytes in use, free space.
    pub fn memory_stats(&self) -> buffet_memory::StorageStats {
        self.core.shared.table.storage().stats()
    }

    fn ask<T>(&self, make: impl FnOnce(Sender<T>) -> Command) -> Option<Receiver<T>> {
        let (tx, rx) = channel::bounded(1);
        self.command(make(tx)).then_some(rx)
    }

    /// Admits a tenant: `init` builds its state in its own region (on this thread, in the
    /// tenant's isolation domain), then the data plane learns its rules. Changes nothing
    /// on error.
    pub fn admit(&self, spec: TenantSpec<N::Policy>) -> Result<TenantSlot, PipelineError> {
        let pending = self.admit_start(spec)?;
        pending.wait(self)
    }

    fn admit_start(&self, spec: TenantSpec<N::Policy>) -> Result<PendingAdmit, PipelineError> {
        let id = spec.id;
        if self.core.stopped.load(Ordering::Acquire) {
            return Err(PipelineError::Stopped);
        }
        let shared = &self.core.shared;
        let bytes = shared.nf.register().bytes;
        let nf = &shared.nf;
        let slot = shared
            .table
            .admit_next(id, bytes, N::State::default(), |state, region| {
                nf.init_in_region(&spec.policy, state, region)
            })
            .map_err(|e| tenant_error(id, e))?;
        shared.quarantined[slot.index()].store(false, Ordering::Release);
        shared.weights[slot.index()].store(1, Ordering::Relaxed);
        let reply = self.ask(|reply| Command::Admit {
            slot,
            name: spec.name,
            rules: spec.rules,
            max_nb: spec.max_nb,
            reply,
        });
        Ok(PendingAdmit { slot, id, reply })
    }

    /// Replaces tenant `id`'s NF policy at run time: `init` builds a new state from
    /// `policy` in a new region (on this thread, in the tenant's isolation domain) and,
    /// only if it accepts the policy, the new state replaces the old one in one atomic
    /// swap; the tenant keeps its slot, rules, worker and counters. The NF state starts
    /// afresh from the new policy (what `init` builds; NF-internal tables such as
    /// connection tracking are not carried over). Packets already being processed finish
    /// on the old state. On error the old state keeps serving, unchanged. A quarantined
    /// tenant stays quarantined.
    pub fn update_policy(&self, id: TenantId, policy: &N::Policy) -> Result<(), PipelineError> {
        if self.core.stopped.load(Ordering::Acquire) {
            return Err(PipelineError::Stopped);
        }
        let new = self.build_state(id, policy)?;
        let old = self
            .core
            .shared
            .table
            .publish(new)
            .map_err(|source| PipelineError::Memory { tenant: id, source })?;
        // The old state and region go when the last worker holding them lets go.
        drop(old);
        Ok(())
    }

    /// Builds tenant `id`'s new NF state from `policy` in a new region, on this thread,
    /// while its old state keeps serving; unpublished (dropping it frees the region).
    fn build_state(
        &self,
        id: TenantId,
        policy: &N::Policy,
    ) -> Result<Replacement<N::State>, PipelineError> {
        let shared = &self.core.shared;
        let nf = &shared.nf;
        shared
            .table
            .prepare_replacement(
                id,
                nf.register().bytes,
                N::State::default(),
                |state, region| nf.init_in_region(policy, state, region),
            )
            .map_err(|e| tenant_error(id, e))
    }

    /// Removes a tenant at run time. Its queued packets are dropped (counted in the
    /// report's `global.removed_tenant`, as the tenant's own row leaves with it), its
    /// region is zeroed and returned; other tenants are not paused.
    pub fn remove(&self, id: TenantId) -> Result<(), PipelineError> {
        self.remove_holding(id, &[])
    }

    /// [`remove`](Self::remove) when workers fed by their own source (the XDP Packet
    /// Dispatcher's) may still hold frames tagged with the tenant's slot — ones that did
    /// not empty their sockets in time: the slot stays retired, so no later tenant is
    /// admitted into it, until each of them has found its input empty since (it ran
    /// everything it held; those frames met no tenant) or its thread ended. Workers
    /// found stuck are held so by every removal.
    pub fn remove_holding(&self, id: TenantId, hold: &[WorkerId]) -> Result<(), PipelineError> {
        let rx = self.remove_start(id, hold.to_vec())?;
        finish_remove(id, rx.recv().ok())
    }

    fn remove_start(
        &self,
        id: TenantId,
        hold: Vec<WorkerId>,
    ) -> Result<Receiver<Result<(), DispatchError>>, PipelineError> {
        let slot = self.slot_of(id).ok_or(PipelineError::Unknown(id))?;
        self.ask(|reply| Command::Remove { slot, hold, reply })
            .ok_or(PipelineError::Stopped)
    }

    /// Replaces tenant `id`'s name, classifier rules and MAX_NB in one step, applied by
    /// the data plane between bursts: a packet is classified either under the old rules
    /// or under the new ones, never a mix. The rules are validated first; on error
    /// nothing changed. The tenant keeps its slot, state, worker and counters. Checking
    /// that the new rules do not overlap another tenant's is the caller's business (as at
    /// admission).
    pub fn reconfigure(
        &self,
        id: TenantId,
        name: String,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
    ) -> Result<(), PipelineError> {
        self.update(id, name, rules, max_nb, None)
    }

    /// Replaces tenant `id`'s name, classifier rules, MAX_NB and — given a `policy` — its
    /// NF state in one data-plane step, so that no packet meets the new rules with the
    /// old state or the old rules with the new state. First, on this thread and while
    /// the old state and rules serve, `init` builds the new state from `policy` in a new
    /// region (as [`update_policy`](Self::update_policy) does); then the data plane,
    /// between bursts, lets every packet already dispatched finish on the old state (it
    /// asks the workers to flush their Packet Buffers and waits for their answer, a pause
    /// of the dispatcher that is one flush round trip long), publishes the new state and
    /// installs the new rules before it dispatches the next packet. The rules are
    /// validated first; on any error nothing changed (the new state is dropped unused),
    /// and a tenant removed meanwhile is [`PipelineError::Unknown`], whoever took its slot.
    /// Workers fed by their own source (the XDP Packet Dispatcher) are not ordered with
    /// this data plane's dispatcher: there the two halves are still two steps.
    pub fn update(
        &self,
        id: TenantId,
        name: String,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
        policy: Option<&N::Policy>,
    ) -> Result<(), PipelineError> {
        if self.core.stopped.load(Ordering::Acquire) {
            return Err(PipelineError::Stopped);
        }
        let slot = self.slot_of(id).ok_or(PipelineError::Unknown(id))?;
        let publish = match policy {
            None => None,
            Some(policy) => {
                let prepared = self.build_state(id, policy)?;
                let core = self.core.clone();
                let publish: Box<dyn FnOnce() -> Result<(), PipelineError> + Send> =
                    Box::new(move || {
                        // The old state goes when the last worker holding it lets go.
                        core.shared
                            .table
                            .publish(prepared)
                            .map(drop)
                            .map_err(|source| PipelineError::Memory { tenant: id, source })
                    });
                Some(publish)
            }
        };
        let rx = self
            .ask(|reply| Command::Update {
                id,
                slot,
                name,
                rules,
                max_nb,
                publish,
                reply,
            })
            .ok_or(PipelineError::Stopped)?;
        rx.recv().unwrap_or(Err(PipelineError::Stopped))
    }

    /// Sets tenant `id`'s weight in the weighted deficit round robin that serves the
    /// Packet Buffers of its worker (default 1; 0 counts as 1): with every tenant of a
    /// worker backlogged, each gets worker time in proportion to its weight.
    pub fn set_weight(&self, id: TenantId, weight: u32) -> Result<(), PipelineError> {
        let slot = self.slot_of(id).ok_or(PipelineError::Unknown(id))?;
        self.core.shared.weights[slot.index()].store(weight.max(1), Ordering::Relaxed);
        Ok(())
    }

    /// Launches one more worker.
    pub fn launch_worker(&self) -> Result<WorkerId, PipelineError> {
        self.ask_pipeline(|reply| Command::LaunchWorker {
            source: None,
            reply,
        })?
        .recv()
        .unwrap_or(Err(PipelineError::Stopped))
    }

    /// Launches one more worker that polls its own `source` (the Packet Dispatcher runs
    /// outside the data plane, e.g. a new AF_XDP socket the XDP program redirects to).
    pub fn launch_worker_with(
        &self,
        source: Box<dyn WorkerSource>,
    ) -> Result<WorkerId, PipelineError> {
        self.ask_pipeline(|reply| Command::LaunchWorker {
            source: Some(source),
            reply,
        })?
        .recv()
        .unwrap_or(Err(PipelineError::Stopped))
    }

    /// Worker `w`'s progress through its input, for a caller that must know when the
    /// frames in it at some moment have all been run: (passes of its thread that found
    /// its input empty with nothing held back, frames it took from its own source). Once
    /// the first count moved past a value read earlier, everything in its input then has
    /// been run and handed back. `None` for a worker that does not exist.
    pub fn worker_progress(&self, w: WorkerId) -> Option<(u64, u64)> {
        let counters = self
            .core
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counters.get(usize::from(w.0)).map(|c| {
            (
                c.idle.load(Ordering::Acquire),
                c.received.load(Ordering::Acquire),
            )
        })
    }

    /// Terminates a worker: its tenants are reassigned to live workers, and the packets
    /// already queued to it are still processed before its thread exits.
    pub fn terminate_worker(&self, worker: WorkerId) -> Result<(), PipelineError> {
        self.ask_pipeline(|reply| Command::TerminateWorker { worker, reply })?
            .recv()
            .unwrap_or(Err(PipelineError::Stopped))
    }

    /// Sends a command whose answer is a pipeline result.
    fn ask_pipeline<T>(
        &self,
        make: impl FnOnce(Sender<Result<T, PipelineError>>) -> Command,
    ) -> Result<Receiver<Result<T, PipelineError>>, PipelineError> {
        self.ask(make).ok_or(PipelineError::Stopped)
    }

    /// A snapshot of every counter (its `events` are empty: events leave through
    /// [`events`](Self::events)).
    pub fn report(&self) -> Result<Report, PipelineError> {
        let rx = self
            .ask(|reply| Command::Report { reply })
            .ok_or(PipelineError::Stopped)?;
        rx.recv().map_err(|_| PipelineError::Stopped)
    }

    /// Hands the data plane the events (migrations, overload reports) of a Packet
    /// Dispatcher that runs outside it (the XDP program): they count and appear among
    /// its events as the software dispatcher's do.
    pub fn dispatcher_events(&self, events: Vec<Event>) {
        if !events.is_empty() {
            self.command(Command::DispatcherEvents(events));
        }
    }

    /// Lifts tenant `id`'s quarantine: its packets reach its handler again, on the state
    /// it had (replace it first with [`update_policy`](Self::update_policy) for a fresh
    /// one). Only the operator releases a tenant; nothing does it on a timer. Backoff: a
    /// tenant's first fault may be released at once; after its second fault a release is
    /// refused ([`PipelineError::QuarantineBackoff`]) until the backoff
    /// ([`QUARANTINE_BACKOFF`] by default) has passed since that fault, and every further
    /// fault doubles it (up to 2^16 times). Faults count from the tenant's admission.
    pub fn release(&self, id: TenantId) -> Result<(), PipelineError> {
        let slot = self.slot_of(id).ok_or(PipelineError::Unknown(id))?;
        self.ask_pipeline(|reply| Command::Release { slot, reply })?
            .recv()
            .unwrap_or(Err(PipelineError::Stopped))
    }

    /// Sets the backoff after a second fault (see [`release`](Self::release)).
    pub fn set_quarantine_backoff(&self, backoff: Duration) {
        self.core.backoff_ns.store(
            u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Asks the data plane to finish what is in flight and return from
    /// [`Dataplane::run`].
    pub fn stop(&self) {
        self.command(Command::Stop);
    }

    /// Sends `cmd` to the data plane and wakes it; false when it is gone.
    fn command(&self, cmd: Command) -> bool {
        let sent = self.commands.send(cmd).is_ok();
        self.waker.notify();
        sent
    }
}

/// How many turns of a loop driving the data plane pass between two looks at the ports'
/// pending errors ([`Port::take_error`]) when nothing woke it with one: about 0.1 s of a
/// busy data plane (a turn is a burst), a system call per port each time.
const LINK_LOOK_TURNS: u32 = 1024;

/// How long a report waits for a tenant's state that a worker holds (see
/// `Dataplane::report`); also a fault's reason and a release (a quarantined tenant's
/// state is held only by a worker stuck in it).
const REPORT_LOCK_WAIT: Duration = Duration::from_millis(5);

/// The tenant's state, once no worker holds it, or `None` after `wait` (or when its
/// isolation domain cannot be entered: a fault the tenant's worker reports).
fn lock_within<S: Send>(
    entry: &buffet_memory::TenantEntry<S>,
    wait: Duration,
) -> Option<buffet_memory::StateGuard<'_, S>> {
    match lock_state_within(entry, wait) {
        Locked::State(g) => Some(g),
        Locked::Held | Locked::Unenterable => None,
    }
}

/// What [`lock_state_within`] found.
enum Locked<'a, S> {
    /// The state, no worker holding it.
    State(buffet_memory::StateGuard<'a, S>),
    /// A worker still held it after the wait.
    Held,
    /// Its isolation domain could not be entered (under MPK: its protection key could not
    /// be loaded).
    Unenterable,
}

/// The tenant's state once no worker holds it, waiting at most `wait`.
fn lock_state_within<S: Send>(
    entry: &buffet_memory::TenantEntry<S>,
    wait: Duration,
) -> Locked<'_, S> {
    let t0 = Instant::now();
    let backoff = Backoff::new();
    loop {
        match entry.try_lock_checked() {
            Some(Ok(g)) => return Locked::State(g),
            Some(Err(_)) => return Locked::Unenterable,
            None => {}
        }
        if t0.elapsed() >= wait {
            return Locked::Held;
        }
        backoff.snooze();
    }
}

/// Whether a worker still holds the tenant's state after `wait`.
fn held_after<S: Send>(entry: &buffet_memory::TenantEntry<S>, wait: Duration) -> bool {
    let t0 = Instant::now();
    let backoff = Backoff::new();
    while entry.is_locked() {
        if t0.elapsed() >= wait {
            return true;
        }
        backoff.snooze();
    }
    false
}

/// A Memory Manager refusal (or the NF's, from `init`) as the pipeline's error.
fn tenant_error(id: TenantId, e: AdmitWithError<InitError>) -> PipelineError {
    match e {
        AdmitWithError::Init(source) => PipelineError::Policy { tenant: id, source },
        AdmitWithError::Memory(MemoryError::Registry(RegistryError::AlreadyAdmitted {
            ..
        })) => PipelineError::Duplicate(id),
        AdmitWithError::Memory(MemoryError::Registry(RegistryError::Full { capacity })) => {
            PipelineError::TooMany(capacity)
        }
        AdmitWithError::Memory(MemoryError::Registry(RegistryError::Unknown(_))) => {
            PipelineError::Unknown(id)
        }
        AdmitWithError::Memory(source) => PipelineError::Memory { tenant: id, source },
    }
}

/// The answer to a removal (`None`: the data plane stopped first).
fn finish_remove(
    id: TenantId,
    answer: Option<Result<(), DispatchError>>,
) -> Result<(), PipelineError> {
    match answer {
        Some(r) => r.map_err(|source| PipelineError::Dispatch { tenant: id, source }),
        None => Err(PipelineError::Stopped),
    }
}

/// An admission whose data-plane half is in flight.
struct PendingAdmit {
    slot: TenantSlot,
    id: TenantId,
    reply: Option<Receiver<Result<WorkerId, DispatchError>>>,
}

impl PendingAdmit {
    fn wait<N: NetworkFunction>(self, c: &Control<N>) -> Result<TenantSlot, PipelineError> {
        let answer = match &self.reply {
            Some(rx) => rx.recv().ok(),
            None => None,
        };
        match answer {
            Some(Ok(_)) => Ok(self.slot),
            Some(Err(source)) => {
                // Nothing was dispatched under the slot: free it at once.
                c.core.shared.table.remove(self.slot);
                Err(PipelineError::Dispatch {
                    tenant: self.id,
                    source,
                })
            }
            None => {
                c.core.shared.table.remove(self.slot);
                Err(PipelineError::Stopped)
            }
        }
    }
}

struct WorkerSlot {
    rx: Arc<ArrayQueue<PacketBuf>>,
    /// Woken after frames are pushed into `rx`, and with a flush request or stop.
    waker: Arc<Waker>,
    done: Arc<Completions>,
    stop: Arc<AtomicBool>,
    flush: Arc<FlushSync>,
    counters: Arc<WorkerCounters>,
    thread: Option<JoinHandle<()>>,
    live: bool,
    /// Fed by its own [`WorkerSource`], not by this data plane's dispatcher: what it
    /// completes counts as dispatched too.
    sourced: bool,
    dispatched: u64,
    completed: u64,
    /// Its thread died or is stuck: no longer waited for (flush, shutdown).
    lost: bool,
    /// Its thread is stuck in a handler: never joined.
    stuck: bool,
    /// Frames it handed back unprocessed as its thread died.
    died_with: u64,
    /// Bursts completed at the last check, and since when (and from which CPU time of
    /// its thread) it has been busy without completing one.
    progress: (u64, Option<(Instant, Option<Duration>)>),
    /// Its thread's kernel id (for its scheduling state), once it is ready.
    tid: Option<i32>,
}

impl WorkerSlot {
    /// Asks its thread to stop (after what it holds) and wakes it.
    fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.waker.notify();
    }

    /// Asks its thread to run what it buffered up to the `dispatched`-th frame promptly,
    /// and wakes it.
    fn request_flush(&self, dispatched: u64) {
        self.flush.until.fetch_max(dispatched, Ordering::AcqRel);
        self.waker.notify();
    }
}

/// Per-slot counters the data plane keeps beside the workers' (the tenant's identity is
/// the Tenant Table's).
#[derive(Default, Clone)]
struct SlotInfo {
    /// Counters this slot had when the tenant was admitted (slots are reused).
    baseline: TenantReport,
    policed: u64,
    migrations: u64,
    /// Packets lost unprocessed with a worker that died.
    worker_died: u64,
    /// Live packets dropped at their worker's full ring.
    ring_full: u64,
    /// Faults since admission, and when the last one was seen.
    faults: u32,
    last_fault: Option<Instant>,
    /// The region (its base) of a quarantined tenant's state that a report could not
    /// enter (under MPK, its protection key could not be loaded): reports leave that
    /// state alone until the tenant is released or its state replaced. Each try would be
    /// a key miss, parking another tenant's key, that fails again.
    unenterable: std::cell::Cell<Option<usize>>,
}

/// A migrated tenant whose old worker may still hold packets dispatched to it before the
/// migration: until that worker answers a flush covering them, only it may run the tenant
/// (the tenant's gate names it), so the new worker keeps the tenant's packets buffered.
struct Handover {
    slot: TenantSlot,
    from: WorkerId,
    /// Where the migration sent the tenant: where the frames the data plane held for it
    /// go (a later migration waits for this one first).
    to: WorkerId,
    /// Packets dispatched to `from` before the migration.
    dispatched: u64,
}

/// What one [`Dataplane::poll`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Polled {
    /// Frames the ports delivered.
    pub received: usize,
    /// Frames the workers had finished, taken off their completion queues since the last
    /// poll (sent, or given back to their port or the pool).
    pub completed: usize,
    /// Every port has ended (files, the generator); a live port never ends.
    pub ended: bool,
}

impl Polled {
    /// Nothing arrived and nothing was finished: the caller may back off. With workers
    /// reading their own sources the ports deliver nothing, so a turn that only took
    /// completions is not idle: its frames' buffers go back to the port only on the
    /// next turns.
    pub fn is_idle(&self) -> bool {
        self.received == 0 && self.completed == 0
    }
}

/// The data plane: the software Packet Dispatcher, the worker rings, the heap frame pool
/// and the ports. `Send`: build it anywhere, run it on the thread (core) of your choice
/// with [`run`](Self::run), or drive it frame by frame through [`Pipeline`].
pub struct Dataplane<N: NetworkFunction> {
    cfg: PipelineConfig,
    /// The key cache of every tenant region under [`Domain::Mpk`].
    mpk: Option<&'static Mpk>,
    core: Arc<Core<N>>,
    commands: Receiver<Command>,
    events: Sender<WorkerEvent>,
    dispatcher: Dispatcher,
    workers: Vec<WorkerSlot>,
    pool: HeapPool,
    ports: Vec<Box<dyn Port>>,
    /// Each port's oversize drops as last counted into the report's input and oversize:
    /// a file or generator port's `rx_dropped` (such a port drops a frame only when it
    /// is larger than a frame buffer), a live port's `rx_oversize`.
    port_dropped: Vec<u64>,
    /// Per port: packets waiting for its next `tx_burst`.
    tx: Vec<Vec<PacketBuf>>,
    /// Per port: it has ended (a file, read to its end); ended ports are not waited on.
    ended: Vec<bool>,
    /// When the ports were last asked about an interface found down
    /// ([`Port::recheck_link`]); `None` while none is down.
    links_down: Option<std::time::Instant>,
    /// Turns since the ports were last asked for a pending error
    /// ([`LINK_LOOK_TURNS`]).
    turns_unlooked: u32,
    slots: Vec<SlotInfo>,
    /// Removed slots waiting for their queued packets to drain.
    retiring: Vec<Retiring>,
    /// Migrations whose old worker may still hold the tenant's earlier packets.
    handovers: Vec<Handover>,
    /// Without persistent Packet Buffers (no gate in the workers): frames of tenants with
    /// a hand-over pending, in arrival order, with whether they came from a live port;
    /// sent to the tenant's new worker once its old worker ran the earlier ones.
    held: Vec<(PacketBuf, bool)>,
    /// Migrations the dispatcher just raised, to start hand-overs for.
    migrated: Vec<(TenantSlot, WorkerId, WorkerId)>,
    global: GlobalReport,
    seq: u64,
    burst: Vec<PacketBuf>,
    stopping: bool,
    port_error: Option<PipelineError>,
    /// Frames taken off the workers' completion queues since the last
    /// [`poll`](Self::poll), wherever they were taken (commands wait for completions too).
    completed_since_poll: usize,
    /// The idle wait (see `idle.rs`), shared with the workers.
    idle: Arc<IdleShared>,
    /// This data plane's waker: the workers wake it when they hand frames back, and
    /// [`Control`] when it sends a command.
    waker: Arc<Waker>,
    /// Told of each worker found stuck or dead ([`on_worker_lost`](Self::on_worker_lost)).
    worker_lost: Option<Box<dyn FnMut(WorkerId) + Send>>,
}

/// Builds a pipeline: reserves the arena, starts `cfg.workers` workers, and returns the
/// control handle and the data plane.
pub fn build<N: NetworkFunction>(
    nf: N,
    cfg: PipelineConfig,
) -> Result<(Control<N>, Dataplane<N>), PipelineError> {
    build_with_sources(nf, cfg, Vec::new())
}

/// [`build`], with worker `i` polling `sources[i]` instead of its input ring (the Packet
/// Dispatcher runs outside the data plane, e.g. the XDP program feeding each worker's
/// AF_XDP socket). `sources` is empty (every worker fed by the software dispatcher) or
/// holds one source per worker. Workers launched later are fed by the software
/// dispatcher.
pub fn build_with_sources<N: NetworkFunction>(
    nf: N,
    cfg: PipelineConfig,
    sources: Vec<Box<dyn WorkerSource>>,
) -> Result<(Control<N>, Dataplane<N>), PipelineError> {
    let mpk = match cfg.domain {
        Domain::Mpk => Some(Mpk::get()?),
        _ => None,
    };
    build_on(nf, cfg, sources, mpk)
}

/// [`build_with_sources`] over the key cache `mpk` (`Some` exactly under
/// [`Domain::Mpk`]; the tests give a simulated one).
fn build_on<N: NetworkFunction>(
    nf: N,
    cfg: PipelineConfig,
    sources: Vec<Box<dyn WorkerSource>>,
    mpk: Option<&'static Mpk>,
) -> Result<(Control<N>, Dataplane<N>), PipelineError> {
    if !sources.is_empty() && sources.len() != usize::from(cfg.workers) {
        return Err(PipelineError::Config(format!(
            "{} worker sources for {} workers",
            sources.len(),
            cfg.workers
        )));
    }
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
    if cfg.flush_packets > cfg.ring_size.max(cfg.burst) {
        return Err(PipelineError::Config(format!(
            "a full Packet Buffer of {} packets cannot exceed the ring size ({})",
            cfg.flush_packets, cfg.ring_size
        )));
    }
    let cap = cfg.tenant_capacity;
    let table = match mpk {
        Some(mpk) => {
            check_mpk_workers(mpk, cfg.workers)?;
            TenantTable::with_mpk(storage, cap, mpk)
        }
        None => TenantTable::new(storage, cap),
    };
    let shared = Shared::new(Arc::new(nf), Arc::new(table), 1024);
    let core = Arc::new(Core {
        shared,
        names: Mutex::new(vec![None; cap as usize]),
        events_dropped: AtomicU64::new(0),
        stopped: AtomicBool::new(false),
        backoff_ns: AtomicU64::new(QUARANTINE_BACKOFF.as_nanos() as u64),
        counters: Mutex::new(Vec::new()),
    });
    let (cmd_tx, cmd_rx) = channel::unbounded();
    let (ev_tx, ev_rx) = channel::bounded(EVENT_CAPACITY);
    let mut d = Dataplane {
        dispatcher: Dispatcher::new(cfg.dispatcher),
        core: core.clone(),
        commands: cmd_rx,
        events: ev_tx,
        workers: Vec::new(),
        pool: HeapPool::default(),
        port_dropped: Vec::new(),
        ports: Vec::new(),
        tx: Vec::new(),
        ended: Vec::new(),
        links_down: None,
        turns_unlooked: 0,
        slots: vec![SlotInfo::default(); cap as usize],
        retiring: Vec::new(),
        handovers: Vec::new(),
        held: Vec::new(),
        migrated: Vec::new(),
        global: GlobalReport::default(),
        seq: 0,
        burst: Vec::with_capacity(cfg.burst),
        stopping: false,
        port_error: None,
        completed_since_poll: 0,
        idle: Arc::new(IdleShared::default()),
        waker: Arc::new(Waker::new()),
        worker_lost: None,
        mpk,
        cfg,
    };
    let mut sources = sources.into_iter();
    for _ in 0..d.cfg.workers {
        d.spawn_worker(sources.next())?;
    }
    let control = Control {
        core,
        commands: cmd_tx,
        events: ev_rx,
        waker: d.waker.clone(),
    };
    Ok((control, d))
}

impl<N: NetworkFunction> Dataplane<N> {
    /// Adds a port; its id is its index (the first port is 0). Frames it receives carry
    /// that id as their input port; `Verdict::Forward(id)` sends to it.
    pub fn add_port(&mut self, port: Box<dyn Port>) -> PortId {
        self.ports.push(port);
        self.port_dropped.push(0);
        self.tx.push(Vec::new());
        self.ended.push(false);
        (self.ports.len() - 1) as PortId
    }

    /// The ports' counters, by port id.
    pub fn port_stats(&self) -> Vec<(String, PortStats)> {
        self.ports.iter().map(|p| (p.name(), p.stats())).collect()
    }

    /// Frames the ports still expect to deliver, when they know.
    pub fn size_hint(&self) -> Option<u64> {
        self.ports.iter().map(|p| p.size_hint()).sum()
    }

    /// The dispatcher (read-only: tables, stats).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    fn spawn_worker(
        &mut self,
        source: Option<Box<dyn WorkerSource>>,
    ) -> Result<WorkerId, PipelineError> {
        // The id the dispatcher will give it; it learns of the worker only once the
        // thread is ready, so a worker whose thread the NF refused leaves no trace.
        let id = WorkerId(self.workers.len() as u16);
        let slot = WorkerSlot {
            rx: Arc::new(ArrayQueue::new(self.cfg.ring_size)),
            waker: Arc::new(Waker::new()),
            done: Arc::new(Completions::new(self.cfg.ring_size)),
            stop: Arc::new(AtomicBool::new(false)),
            flush: Arc::new(FlushSync::default()),
            counters: Arc::new(WorkerCounters::new(self.cfg.tenant_capacity)),
            thread: None,
            live: true,
            sourced: source.is_some(),
            dispatched: 0,
            completed: 0,
            lost: false,
            stuck: false,
            died_with: 0,
            progress: (0, None),
            tid: None,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let mut engine = Worker::with_shared(id, self.core.shared.clone(), slot.counters.clone());
        if let Some(buffers) = self.cfg.buffers() {
            engine = engine.with_buffers(buffers, self.cfg.clock.clone());
        }
        let thread = WorkerThread {
            engine,
            rx: slot.rx.clone(),
            source,
            done: slot.done.clone(),
            stop: slot.stop.clone(),
            flush: slot.flush.clone(),
            idle: self.idle.clone(),
            waker: slot.waker.clone(),
            dataplane: self.waker.clone(),
            burst: self.cfg.burst,
            pin: self.cfg.pin.then_some(id.0 as usize),
            ready: Some(ready_tx),
        };
        let handle = std::thread::Builder::new()
            .name(format!("buffet-worker-{}", id.0))
            .spawn(move || thread.run())
            .map_err(PipelineError::Spawn)?;
        // Control path: wait until the thread has run the NF's preparation.
        let ready = ready_rx.recv().unwrap_or_else(|_| {
            Err(buffet_sdk::WorkerThreadError(
                "the worker thread ended before it was ready".into(),
            ))
        });
        let tid = match ready {
            Ok(tid) => tid,
            Err(source) => {
                let _ = handle.join();
                return Err(PipelineError::WorkerSetup {
                    worker: id.0,
                    source,
                });
            }
        };
        let added = self.dispatcher.add_worker(self.cfg.worker_max_nb);
        debug_assert_eq!(added, id);
        self.core
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(slot.counters.clone());
        self.workers.push(WorkerSlot {
            thread: Some(handle),
            tid,
            ..slot
        });
        // Enough frames to fill this worker's input and completion rings.
        self.pool.grow(2 * self.cfg.ring_size);
        Ok(id)
    }

    fn launch_worker(
        &mut self,
        source: Option<Box<dyn WorkerSource>>,
    ) -> Result<WorkerId, PipelineError> {
        if let Some(mpk) = self.mpk {
            let live = self.workers.iter().filter(|w| w.live).count();
            check_mpk_workers(mpk, live as u16 + 1)?;
        }
        let id = self.spawn_worker(source)?;
        self.emit(WorkerEvent::WorkerLaunched { worker: id.0 });
        Ok(id)
    }

    fn terminate_worker(&mut self, w: WorkerId) -> Result<(), PipelineError> {
        let live = self.workers.iter().filter(|s| s.live).count();
        match self.workers.get(w.0 as usize) {
            Some(s) if s.live => {}
            _ => return Err(PipelineError::NotLive(w.0)),
        }
        if live == 1 {
            return Err(PipelineError::LastWorker(w.0));
        }
        let moved = self.dispatcher.terminate_worker(w);
        for &(tenant, to) in &moved {
            self.begin_handover(tenant, w, to);
        }
        let slot = &mut self.workers[w.0 as usize];
        slot.live = false;
        slot.request_stop();
        self.emit(WorkerEvent::WorkerTerminated {
            worker: w.0,
            reassigned: moved.len(),
        });
        Ok(())
    }

    fn emit(&self, e: WorkerEvent) {
        send_event(&self.events, &self.core.events_dropped, e);
    }

    /// Applies every pending command; true while the data plane should keep running.
    pub fn apply_commands(&mut self) -> bool {
        while let Ok(cmd) = self.commands.try_recv() {
            self.apply(cmd);
        }
        !self.stopping
    }

    fn apply(&mut self, cmd: Command) {
        match cmd {
            Command::Admit {
                slot,
                name,
                rules,
                max_nb,
                reply,
            } => {
                let r = self.dispatcher.admit(slot, rules, max_nb);
                if r.is_ok() {
                    let i = slot.index();
                    let mut baseline = TenantReport::default();
                    for w in &self.workers {
                        w.counters.tenants[i].add_into(&mut baseline);
                    }
                    self.slots[i] = SlotInfo {
                        baseline,
                        ..SlotInfo::default()
                    };
                    self.core
                        .names
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)[i] = Some(name);
                }
                let _ = reply.send(r);
            }
            Command::Remove { slot, hold, reply } => {
                // No packet of the slot may stay gated once it retires.
                self.wait_handover(slot);
                let r = self.dispatcher.remove(slot);
                if r.is_ok() {
                    self.core.shared.table.remove_and_retire(slot);
                    let snapshot: Vec<u64> = self.workers.iter().map(|w| w.dispatched).collect();
                    // Workers run what they buffered before the removal promptly.
                    for (w, &d) in self.workers.iter().zip(&snapshot) {
                        w.request_flush(d);
                    }
                    // Held too: every worker fed by its own source found stuck, whose
                    // thread may come back with frames of the slot in hand.
                    let stuck = (0..self.workers.len())
                        .filter(|&i| self.workers[i].sourced && self.workers[i].stuck);
                    let mut held: Vec<(usize, u64)> = hold
                        .iter()
                        .map(|w| usize::from(w.0))
                        .chain(stuck)
                        .filter_map(|i| {
                            let c = self.workers.get(i)?.counters.idle.load(Ordering::Acquire);
                            Some((i, c))
                        })
                        .collect();
                    held.sort_unstable();
                    held.dedup_by_key(|h| h.0);
                    self.retiring.push(Retiring {
                        slot,
                        snapshot,
                        held,
                    });
                }
                let _ = reply.send(r);
            }
            Command::Update {
                id,
                slot,
                name,
                rules,
                max_nb,
                publish,
                reply,
            } => {
                let _ = reply.send(self.update(id, slot, name, rules, max_nb, publish));
            }
            Command::LaunchWorker { source, reply } => {
                let _ = reply.send(self.launch_worker(source));
            }
            Command::TerminateWorker { worker, reply } => {
                let _ = reply.send(self.terminate_worker(worker));
            }
            Command::Release { slot, reply } => {
                let _ = reply.send(self.release(slot));
            }
            Command::Report { reply } => {
                self.count_live_oversize();
                let _ = reply.send(self.report());
            }
            Command::DispatcherEvents(events) => {
                for e in events {
                    record_event(&mut self.slots, &self.core, &self.events, e, self.seq);
                }
            }
            Command::Stop => self.stopping = true,
        }
    }

    /// [`Command::Update`]: the rules validated, every packet dispatched so far run on the
    /// tenant's old state, then the new rules and state installed before the next packet
    /// is dispatched.
    fn update(
        &mut self,
        id: TenantId,
        slot: TenantSlot,
        name: String,
        rules: Vec<(u32, Match)>,
        max_nb: u64,
        publish: Option<Box<dyn FnOnce() -> Result<(), PipelineError> + Send>>,
    ) -> Result<(), PipelineError> {
        // The slot was looked up on the caller's thread: the tenant may have been removed
        // since (its slot released, and perhaps given to another tenant), which would
        // otherwise get these rules and this name.
        let tenant = self.core.shared.table.published_id(slot);
        if tenant != Some(id) {
            return Err(PipelineError::Unknown(id));
        }
        let tenant = id;
        let dispatch = |source| PipelineError::Dispatch { tenant, source };
        if !self.dispatcher.has_tenant(slot) {
            return Err(dispatch(DispatchError::UnknownTenant(slot)));
        }
        for (index, (_, m)) in rules.iter().enumerate() {
            m.validate()
                .map_err(|source| dispatch(DispatchError::InvalidRule { index, source }))?;
        }
        if publish.is_some() {
            self.wait_handover(slot);
            self.quiesce();
        }
        // The state first: its publication is refused when the tenant left the slot, or
        // was removed and admitted again there, since the state was prepared (removals
        // and admissions are applied on this thread, but may have been queued before this
        // update), and then nothing changed. No packet is dispatched between the two.
        if let Some(publish) = publish {
            publish()?;
        }
        // Cannot fail here in practice (the tenant is there, its rules valid); if it
        // does, the tenant keeps its old rules with the new state, and says so.
        self.dispatcher
            .replace_rules(slot, rules, max_nb)
            .map_err(dispatch)?;
        self.core
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[slot.index()] = Some(name);
        Ok(())
    }

    /// Waits, taking completions back, until every packet dispatched so far has been run
    /// by its worker (each live worker asked to flush its Packet Buffers); lost workers
    /// are not waited for. Other tenants' packets wait in the ports meanwhile.
    fn quiesce(&mut self) {
        let snapshot: Vec<u64> = self.workers.iter().map(|w| w.dispatched).collect();
        for (w, &d) in self.workers.iter().zip(&snapshot) {
            w.request_flush(d);
        }
        let backoff = Backoff::new();
        loop {
            let drained = self
                .workers
                .iter()
                .zip(&snapshot)
                .all(|(w, &d)| w.lost || w.flush.done.load(Ordering::Acquire) >= d);
            if drained {
                return;
            }
            self.poll_completions();
            self.flush_tx();
            backoff.snooze();
        }
    }

    /// Makes removed slots reusable once every packet dispatched before the removal has
    /// completed, so a queued packet can never meet the next tenant's state.
    fn reclaim_retired(&mut self) {
        if self.retiring.is_empty() {
            return;
        }
        let workers = &self.workers;
        let table = &self.core.shared.table;
        self.retiring.retain(|r| {
            // Completed in count, and (buffers hand packets back out of order across
            // tenants) answered a flush covering them.
            let drained = r.snapshot.iter().zip(workers).all(|(d, w)| {
                w.completed >= *d && (w.sourced || w.flush.done.load(Ordering::Acquire) >= *d)
            });
            // A held worker found its input empty since, or its thread ended.
            let held = r.held.iter().all(|&(i, idle0)| {
                let w = &workers[i];
                w.counters.idle.load(Ordering::Acquire) > idle0
                    || w.thread.as_ref().is_none_or(|t| t.is_finished())
            });
            if drained && held {
                table.release(r.slot);
            }
            !(drained && held)
        });
    }

    /// Offers one frame that arrived on `in_port` at `ts_ns` (copied into a pooled heap
    /// frame). Waits, polling completions, while the chosen worker's ring or the pool is
    /// full: offline input is lossless.
    pub fn push(&mut self, ts_ns: u64, in_port: PortId, frame: &[u8]) {
        let mut m = self.take_frame();
        if !m.fill(frame) {
            self.global.input_packets += 1;
            self.global.oversize += 1;
            self.pool.give(m);
            return;
        }
        m.ts_ns = ts_ns;
        m.in_port = in_port;
        self.dispatch(m, false);
    }

    fn take_frame(&mut self) -> PacketBuf {
        let backoff = Backoff::new();
        loop {
            if let Some(m) = self.pool.take() {
                return m;
            }
            self.poll_completions();
            backoff.snooze();
        }
    }

    /// Classifies, schedules and hands one packet to its worker. `live`: drop (counted)
    /// instead of waiting when the worker's ring is full.
    fn dispatch(&mut self, mut m: PacketBuf, live: bool) {
        let seq = self.seq;
        self.seq += 1;
        self.global.input_packets += 1;
        if seq % 32 == 0 {
            self.poll_completions();
        }
        let (ts_ns, in_port) = (m.ts_ns, m.in_port);
        // One parse per frame: the dispatcher's layout travels to the worker.
        let (decision, layout) = self
            .dispatcher
            .dispatch_with_layout(ts_ns, in_port, m.data_mut());
        self.collect_events(seq);
        match decision {
            Decision::Pass { worker, tenant } => {
                m.tenant = tenant;
                m.layout = layout;
                if !self.handovers.is_empty() && self.holds(tenant) {
                    self.held.push((m, live));
                    return;
                }
                self.send(worker, m, live);
            }
            Decision::Drop(why) => {
                match why {
                    DispatchDrop::Malformed(e) => self.global.add_malformed(e),
                    DispatchDrop::Unmatched => self.global.unmatched += 1,
                    DispatchDrop::Policed(t) => self.slots[t.index()].policed += 1,
                    DispatchDrop::NoLiveWorker => self.global.no_live_worker += 1,
                }
                self.recycle(m);
            }
        }
    }

    fn recycle(&mut self, m: PacketBuf) {
        match m.owner() {
            None => self.pool.give(m),
            Some(o) => match self.ports.get_mut(usize::from(o.port)) {
                Some(p) => p.recycle(m),
                None => drop(m),
            },
        }
    }

    fn send(&mut self, worker: WorkerId, m: PacketBuf, live: bool) {
        let i = worker.0 as usize;
        // The common case through a borrow: no reference count touched per packet.
        let mut m = match self.workers[i].rx.push(m) {
            Ok(()) => {
                self.workers[i].dispatched += 1;
                self.workers[i].waker.wake();
                return;
            }
            Err(back) => back,
        };
        // The ring is full: hold it by its own handle, as waiting polls completions
        // (which need `self`).
        let rx = self.workers[i].rx.clone();
        let backoff = Backoff::new();
        loop {
            if live {
                self.global.ring_full += 1;
                if let Some(info) = self.slots.get_mut(m.tenant.index()) {
                    info.ring_full += 1;
                }
                self.recycle(m);
                return;
            }
            self.poll_completions();
            if self.workers[i].lost {
                // Found dead or stuck while waiting: the frame goes where its tenant went.
                return self.send_to(None, m, live);
            }
            backoff.snooze();
            match rx.push(m) {
                Ok(()) => break,
                Err(back) => m = back,
            }
        }
        self.workers[i].dispatched += 1;
        self.workers[i].waker.wake();
    }

    fn collect_events(&mut self, seq: u64) {
        for e in self.dispatcher.drain_events() {
            if let Event::Migration {
                tenant, from, to, ..
            } = e
            {
                self.migrated.push((tenant, from, to));
            }
            record_event(&mut self.slots, &self.core, &self.events, e, seq);
        }
        if !self.migrated.is_empty() {
            let mut migrated = std::mem::take(&mut self.migrated);
            for &(tenant, from, to) in &migrated {
                self.begin_handover(tenant, from, to);
            }
            migrated.clear();
            self.migrated = migrated;
        }
    }

    /// Tenant `tenant` moved off worker `from` to worker `to`, and `from`'s Packet
    /// Buffers (or ring) may still hold its earlier packets: until `from` has run them,
    /// only `from` may run the tenant, and `from` is asked to flush. Called before the
    /// first packet goes to the new worker. With persistent Packet Buffers the new worker
    /// keeps the tenant's packets gated; without, the data plane holds them
    /// ([`holds`](Self::holds)) and then sends them to `to` (a later migration of the
    /// tenant waits for this hand-over first, so they reach `to` before it moves on).
    /// Either way a tenant's packets never run out of order, nor on two workers at once.
    /// Workers fed by their own source are not tracked (their frames never pass here).
    fn begin_handover(&mut self, tenant: TenantSlot, from: WorkerId, to: WorkerId) {
        let Some(w) = self.workers.get(from.0 as usize) else {
            return;
        };
        if w.sourced {
            return;
        }
        // One hand-over per tenant at a time (migrations of a tenant are a timeslot apart).
        self.wait_handover(tenant);
        let w = &self.workers[from.0 as usize];
        let dispatched = w.dispatched;
        if w.flush.done.load(Ordering::Acquire) >= dispatched {
            return;
        }
        if self.cfg.buffers().is_some() {
            self.core.shared.gates[tenant.index()].store(u32::from(from.0), Ordering::Release);
        }
        w.request_flush(dispatched);
        self.handovers.push(Handover {
            slot: tenant,
            from,
            to,
            dispatched,
        });
    }

    /// Waits (taking completions back) until tenant `tenant` has no hand-over pending.
    fn wait_handover(&mut self, tenant: TenantSlot) {
        let backoff = Backoff::new();
        while self.handovers.iter().any(|h| h.slot == tenant) {
            self.poll_completions();
            self.flush_tx();
            backoff.snooze();
        }
    }

    /// Whether the data plane holds tenant `tenant`'s frames back: no persistent Packet
    /// Buffers, and a hand-over of the tenant pending.
    fn holds(&self, tenant: TenantSlot) -> bool {
        self.cfg.buffers().is_none() && self.handovers.iter().any(|h| h.slot == tenant)
    }

    /// Opens the gates of tenants whose old worker answered the flush covering them, and
    /// sends the frames the data plane held for them to their new workers, in order.
    fn release_handovers(&mut self) {
        if self.handovers.is_empty() {
            return;
        }
        let (workers, gates) = (&self.workers, &self.core.shared.gates);
        let mut released = Vec::new();
        self.handovers.retain(|h| {
            let from = &workers[h.from.0 as usize];
            // A lost worker (dead or stuck) never confirms: what it had queued was handed
            // to the tenants' new workers when it was evacuated.
            let done = from.lost || from.flush.done.load(Ordering::Acquire) >= h.dispatched;
            if done {
                gates[h.slot.index()].store(GATE_OPEN, Ordering::Release);
                released.push((h.slot, h.to));
            }
            !done
        });
        if self.held.is_empty() {
            return;
        }
        for (slot, to) in released {
            let (go, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
                .into_iter()
                .partition(|(m, _)| m.tenant == slot);
            self.held = keep;
            for (m, live) in go {
                self.send_to(Some(to), m, live);
            }
        }
    }

    /// Sends `m` to worker `to` if it is live, else to the worker its tenant is on now;
    /// with neither live, it is counted as `no_live_worker` and recycled.
    fn send_to(&mut self, to: Option<WorkerId>, m: PacketBuf, live: bool) {
        let is_live = |w: WorkerId| self.workers.get(w.0 as usize).is_some_and(|s| s.live);
        let now = || {
            self.dispatcher
                .scheduler()
                .tenant(m.tenant)
                .map(|r| r.worker)
        };
        match to
            .filter(|&w| is_live(w))
            .or_else(|| now().filter(|&w| is_live(w)))
        {
            Some(to) => self.send(to, m, live),
            None => {
                self.global.no_live_worker += 1;
                self.recycle(m);
            }
        }
    }

    /// Takes processed packets back from the workers: passes go to their output port's
    /// transmit queue, other frames back to the pool, worker notices become events.
    pub fn poll_completions(&mut self) -> usize {
        let mut taken = 0;
        for wi in 0..self.workers.len() {
            while let Some(mut batch) = self.workers[wi].done.take() {
                for m in batch.drain(..) {
                    taken += 1;
                    let w = &mut self.workers[wi];
                    w.completed += 1;
                    if w.sourced {
                        w.dispatched += 1;
                    }
                    if w.stuck {
                        // Its handler came back after all: the frame is no longer caught.
                        self.global.stuck_in_worker = self.global.stuck_in_worker.saturating_sub(1);
                    }
                    if m.outcome == Outcome::Pending {
                        // Only a dying worker hands back a frame it did not process.
                        w.died_with += 1;
                        if let Some(info) = self.slots.get_mut(m.tenant.index()) {
                            info.worker_died += 1;
                        }
                        self.recycle(m);
                        continue;
                    }
                    self.route(m);
                }
                self.workers[wi].done.recycle(batch);
            }
        }
        while let Some(Notice::Fault {
            tenant,
            worker,
            message,
        }) = self.core.shared.notices.pop()
        {
            let id = self
                .core
                .shared
                .table
                .published_id(tenant)
                .unwrap_or_default();
            let message = self.with_fault_reason(tenant, message);
            if let Some(info) = self.slots.get_mut(tenant.index()) {
                info.faults = info.faults.saturating_add(1);
                info.last_fault = Some(Instant::now());
            }
            self.emit(WorkerEvent::Fault {
                tenant: id,
                worker: worker.0,
                message,
            });
        }
        self.check_workers();
        self.release_handovers();
        self.reclaim_retired();
        self.completed_since_poll += taken;
        taken
    }

    /// Supervision, at every completion poll: a live worker whose thread ended by itself
    /// died; one with queued packets and no burst completed for the stall bound is stuck.
    /// Either way its tenants move to live workers at once — well within the timeslot.
    fn check_workers(&mut self) {
        let bound = self.stall_bound();
        for wi in 0..self.workers.len() {
            let w = &mut self.workers[wi];
            // A terminated worker is still watched while it runs what it was given: the
            // hand-overs of the tenants it had wait for it, so stuck there, or dead, it is
            // lost like a live one. Finished cleanly, it answered them all.
            let terminated = !w.live && !w.lost && w.thread.is_some();
            if !terminated && (!w.live || w.lost || w.stop.load(Ordering::Acquire)) {
                continue;
            }
            if w.thread.as_ref().is_some_and(|t| t.is_finished()) {
                if terminated && w.flush.done.load(Ordering::Acquire) == u64::MAX {
                    // Its clean end: joined, and no longer watched.
                    if let Some(t) = w.thread.take() {
                        let _ = t.join();
                    }
                } else {
                    self.worker_died(wi);
                }
                continue;
            }
            let bursts = w.counters.bursts.load(Ordering::Relaxed);
            // A worker fed by its own source is busy while it holds frames it took in
            // and has not handed back.
            let busy = if w.sourced {
                w.counters.received.load(Ordering::Acquire) > w.completed
            } else {
                w.dispatched != w.completed
            };
            // A worker waiting for a state another thread holds is not stuck itself: the
            // holder gives it back, or is found stuck and its tenant quarantined, and the
            // waiter goes on. Its clock starts again once it no longer waits. Read last:
            // the worker writes that line at every group, so only a worker without
            // progress has it read (not every worker at every poll).
            let waits = || w.counters.running.load(Ordering::Acquire) & RUNNING_WAITS != 0;
            if bursts != w.progress.0 || !busy || waits() {
                w.progress = (bursts, None);
                continue;
            }
            // Busy and no burst completed since the last check: the clock starts now (the
            // data plane may not have looked for a while), and is read only in this case.
            // Stuck means running without progress: the thread must also have used CPU
            // time (a quarter of the bound) — a thread the OS did not schedule on a loaded
            // machine is slow, not stuck — or be blocked in the kernel (asleep on a lock,
            // a pipe, a sleep: a worker with queued packets never waits there itself).
            let now = Instant::now();
            let cpu = || w.thread.as_ref().and_then(crate::sys::thread_cpu_time);
            match w.progress.1 {
                None => w.progress.1 = Some((now, cpu())),
                Some((since, cpu0)) if now.duration_since(since) > bound => {
                    let ran = match (cpu0, cpu()) {
                        (Some(a), Some(b)) => b.saturating_sub(a) >= bound / 4,
                        _ => true,
                    };
                    // Blocked counts only inside a handler (a tenant's state is locked): a
                    // worker waiting for a hand-over's gate sleeps between its checks.
                    // /proc is read only when the CPU clock did not already decide.
                    let tid = w.tid;
                    let blocked = || {
                        tid.and_then(crate::sys::thread_state)
                            .is_some_and(|s| s.is_blocked())
                    };
                    if ran || (blocked() && self.stuck_in(wi).is_some()) {
                        self.worker_stuck(wi);
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// Half a timeslot, at least [`MIN_STALL`].
    fn stall_bound(&self) -> Duration {
        let shift = self.dispatcher.config().sched.shift.min(63);
        Duration::from_nanos((1u64 << shift) / 2).max(MIN_STALL)
    }

    /// Marks worker `wi` lost, moves its tenants to live workers and hands the frames in
    /// its input ring to their tenants' new workers. Returns (tenants moved, frames moved).
    fn evacuate(&mut self, wi: usize) -> (usize, u64) {
        let w = WorkerId(wi as u16);
        self.workers[wi].live = false;
        self.workers[wi].lost = true;
        self.workers[wi].request_stop();
        let moved = self.dispatcher.terminate_worker(w);
        let rx = self.workers[wi].rx.clone();
        let mut requeued = 0;
        while let Some(m) = rx.pop() {
            // Taken back unprocessed: it no longer counts against this worker.
            self.workers[wi].completed += 1;
            let slot = m.tenant;
            if self.retiring.iter().any(|r| r.slot == slot) {
                self.global.removed_tenant += 1;
                self.recycle(m);
                continue;
            }
            match self.dispatcher.scheduler().tenant(slot).map(|r| r.worker) {
                Some(to) if self.workers.get(to.0 as usize).is_some_and(|t| t.live) => {
                    requeued += 1;
                    self.send(to, m, false);
                }
                _ => {
                    self.global.no_live_worker += 1;
                    self.recycle(m);
                }
            }
        }
        (moved.len(), requeued)
    }

    fn worker_died(&mut self, wi: usize) {
        let message = match self.workers[wi].thread.take().map(JoinHandle::join) {
            Some(Err(panic)) => panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "worker thread panicked".into()),
            _ => "worker thread ended".into(),
        };
        let (reassigned, requeued) = self.evacuate(wi);
        // The burst it held came back through its completion ring (see worker.rs's
        // `InFlight`): what it finished is routed, what it had not is dropped, counted
        // under its tenant (`poll_completions`).
        loop {
            self.poll_completions();
            let w = &mut self.workers[wi];
            if w.done.is_empty() {
                // Nothing more can come back from a thread that is gone.
                w.completed = w.completed.max(w.dispatched);
                break;
            }
        }
        let dropped = self.workers[wi].died_with;
        self.emit(WorkerEvent::WorkerDied {
            worker: wi as u16,
            message,
            reassigned,
            requeued,
            dropped,
        });
        self.tell_worker_lost(wi);
    }

    /// Says that worker `wi` was found stuck or dead to the
    /// [`on_worker_lost`](Self::on_worker_lost) callback, if any.
    fn tell_worker_lost(&mut self, wi: usize) {
        if let Some(f) = &mut self.worker_lost {
            f(WorkerId(wi as u16));
        }
    }

    /// The tenant worker `wi` is stuck in: the one whose group it is running (it says
    /// which, `WorkerCounters::running`), if that tenant's state is held — by `wi`, in its
    /// handler. Exact whoever placed the tenant there: a migration, a hand-over, or an
    /// outside dispatcher that moved it without the data plane's Worker Table rows
    /// knowing. (A worker that waits for a state another thread holds says so, and is not
    /// taken for stuck: `check_workers`.)
    fn stuck_in(&self, wi: usize) -> Option<TenantSlot> {
        let running = self.workers[wi].counters.running.load(Ordering::Acquire);
        let slot = TenantSlot((running & !RUNNING_WAITS).checked_sub(1)?);
        let held = self
            .core
            .shared
            .table
            .get(slot)
            .entry()
            .is_some_and(TenantEntry::is_locked);
        held.then_some(slot)
    }

    fn worker_stuck(&mut self, wi: usize) {
        let table = &self.core.shared.table;
        let mut tenants = Vec::new();
        if let Some(s) = self.stuck_in(wi) {
            self.core.shared.quarantined[s.index()].store(true, Ordering::Release);
            tenants.push(table.published_id(s).unwrap_or_default());
        }
        let (reassigned, requeued) = self.evacuate(wi);
        let slot = &mut self.workers[wi];
        slot.stuck = true;
        let stuck = if slot.sourced {
            // What it took from its own source and never handed back.
            slot.counters
                .received
                .load(Ordering::Acquire)
                .saturating_sub(slot.completed)
        } else {
            slot.dispatched - slot.completed
        };
        self.global.stuck_in_worker += stuck;
        self.emit(WorkerEvent::WorkerStuck {
            worker: wi as u16,
            tenants,
            reassigned,
            requeued,
            stuck,
        });
        self.tell_worker_lost(wi);
    }

    fn release(&mut self, slot: TenantSlot) -> Result<(), PipelineError> {
        let i = slot.index();
        let id = self.core.shared.table.published_id(slot);
        let id = id.ok_or(PipelineError::Unknown(TenantId::default()))?;
        if !self.core.shared.quarantined[i].load(Ordering::Acquire) {
            return Err(PipelineError::NotQuarantined(id));
        }
        // A quarantined tenant runs nowhere, so a worker that holds its state is stuck in
        // it (and may never let go): released, its next packet would stall another worker
        // on the same lock.
        let held = match &*self.core.shared.table.get(slot) {
            Some(entry) => held_after(entry, REPORT_LOCK_WAIT),
            None => false,
        };
        if held {
            return Err(PipelineError::StateHeldByStuckWorker(id));
        }
        let info = &self.slots[i];
        if info.faults >= 2 {
            let base = Duration::from_nanos(self.core.backoff_ns.load(Ordering::Relaxed));
            let backoff = base.saturating_mul(1 << (info.faults - 2).min(16));
            let since = info.last_fault.map_or(backoff, |t| t.elapsed());
            if since < backoff {
                return Err(PipelineError::QuarantineBackoff {
                    tenant: id,
                    faults: info.faults,
                    backoff,
                    remaining: backoff - since,
                });
            }
        }
        self.slots[i].unenterable.set(None);
        self.core.shared.quarantined[i].store(false, Ordering::Release);
        self.emit(WorkerEvent::Released {
            tenant: id,
            faults: info.faults,
        });
        Ok(())
    }

    /// `message`, followed by the NF's own account of the fault
    /// ([`NetworkFunction::fault_reason`]: an eBPF program's cost and its budget) when it
    /// has one. The tenant is quarantined: no worker runs its code any more.
    fn with_fault_reason(&self, tenant: TenantSlot, message: String) -> String {
        // Not waited for longer: another worker may have taken the state meanwhile (a
        // migration's overlap) and be stuck in it; the message goes without the reason.
        let reason = match &*self.core.shared.table.get(tenant) {
            Some(entry) => lock_within(entry, REPORT_LOCK_WAIT)
                .and_then(|state| self.core.shared.nf.fault_reason(&state)),
            None => None,
        };
        match reason {
            Some(r) => format!("{message}: {r}"),
            None => message,
        }
    }

    /// Sends a processed packet where its verdict says.
    fn route(&mut self, m: PacketBuf) {
        let out = match m.outcome {
            Outcome::Nf(Verdict::Pass) => Some(
                self.cfg
                    .routes
                    .get(usize::from(m.in_port))
                    .copied()
                    .unwrap_or(m.in_port),
            ),
            Outcome::Nf(Verdict::Tx) => Some(m.in_port),
            Outcome::Nf(Verdict::Forward(p)) => Some(p),
            Outcome::NoTenant => {
                // Its tenant's counters left with it: count the packet here.
                self.global.removed_tenant += 1;
                None
            }
            Outcome::Untagged => {
                // No tenant to count it under.
                self.global.untagged += 1;
                None
            }
            _ => None,
        };
        match out {
            Some(p) if usize::from(p) < self.ports.len() => {
                // A port sends heap frames and its own frames only: a frame lent by
                // another port (an AF_XDP UMEM frame leaving through AF_PACKET) is copied
                // into a heap frame here and goes straight back to the port that lent it.
                let m = match m.owner() {
                    Some(o) if o.port != p => match self.copy_to_heap(m) {
                        Some(h) => h,
                        None => return,
                    },
                    _ => m,
                };
                self.tx[usize::from(p)].push(m)
            }
            Some(_) => {
                self.global.no_port += 1;
                self.recycle(m);
            }
            None => self.recycle(m),
        }
    }

    /// Counts the frames port `pi` dropped for being larger than a frame buffer since
    /// the last call as input and oversize, as a frame too large for a heap frame is
    /// counted when it is offered ([`push`](Self::push)); without this they vanished
    /// from the report. A file or generator port's every drop is one; a live port says
    /// which of its drops are (`rx_oversize`). Live ports are counted when a report is
    /// asked for and when the data plane finishes ([`count_live_oversize`]), not per
    /// burst (reading a live port's counters may take system calls).
    ///
    /// [`count_live_oversize`]: Self::count_live_oversize
    fn count_port_oversize(&mut self, pi: usize) {
        let s = self.ports[pi].stats();
        let dropped = if self.ports[pi].is_live() {
            s.rx_oversize
        } else {
            s.rx_dropped
        };
        let seen = &mut self.port_dropped[pi];
        if dropped > *seen {
            let new = dropped - *seen;
            *seen = dropped;
            self.global.oversize += new;
            self.global.input_packets += new;
        }
    }

    /// Counts every live port's oversize drops since the last count
    /// ([`count_port_oversize`](Self::count_port_oversize)): called before a report is
    /// built, so that a report taken while the data plane runs has them too.
    fn count_live_oversize(&mut self) {
        for pi in 0..self.ports.len() {
            if self.ports[pi].is_live() {
                self.count_port_oversize(pi);
            }
        }
    }

    /// A heap copy of a port's frame (metadata and verdict included), the frame itself
    /// given back to its port; `None` (counted) when no heap frame is free or the frame is
    /// larger than one.
    fn copy_to_heap(&mut self, m: PacketBuf) -> Option<PacketBuf> {
        let Some(mut h) = self.pool.take() else {
            self.global.tx_no_buffer += 1;
            self.recycle(m);
            return None;
        };
        if !h.fill(m.data()) {
            self.pool.give(h);
            self.global.oversize += 1;
            self.recycle(m);
            return None;
        }
        h.ts_ns = m.ts_ns;
        h.in_port = m.in_port;
        h.tenant = m.tenant;
        h.outcome = m.outcome;
        self.recycle(m);
        Some(h)
    }

    /// Transmits what the workers let through, port by port.
    fn flush_tx(&mut self) {
        for (i, port) in self.ports.iter_mut().enumerate() {
            if self.tx[i].is_empty() {
                continue;
            }
            if let Err(source) = port.tx_burst(&mut self.tx[i], &mut self.pool) {
                if self.port_error.is_none() {
                    self.port_error = Some(PipelineError::Port {
                        port: port.name(),
                        source,
                    });
                }
            }
            // A port that failed midway leaves frames behind: they go back to the pool.
            for m in self.tx[i].drain(..) {
                match m.owner() {
                    None => self.pool.give(m),
                    Some(_) => port.recycle(m),
                }
            }
        }
    }

    fn in_flight(&self) -> u64 {
        self.workers
            .iter()
            .filter(|w| !w.lost)
            .map(|w| w.dispatched - w.completed)
            .sum()
    }

    /// Waits until every packet pushed so far has been processed and transmitted.
    pub fn flush(&mut self) {
        let backoff = Backoff::new();
        while self.in_flight() > 0 || !self.held.is_empty() {
            self.poll_completions();
            self.flush_tx();
            backoff.snooze();
        }
        self.poll_completions();
        self.flush_tx();
    }

    /// One turn of the loop: commands, one burst from every port, completions, transmit.
    /// Returns what the turn found ([`Polled`]): a caller that sleeps when idle must look
    /// at the workers' completions as well as at the ports, since with workers reading
    /// their own sources (the XDP Packet Dispatcher's sockets) the ports deliver nothing
    /// while the frames the workers finish still have to be sent and their buffers given
    /// back to the port.
    pub fn poll(&mut self) -> Result<Polled, PipelineError> {
        self.apply_commands();
        let mut got = 0;
        let mut ended = true;
        for pi in 0..self.ports.len() {
            let mut burst = std::mem::take(&mut self.burst);
            let live = self.ports[pi].is_live();
            let room = if live {
                self.cfg.burst
            } else {
                self.cfg.burst.min(self.pool.available())
            };
            let rx = self.ports[pi].rx_burst(&mut self.pool, &mut burst, room);
            if !live {
                self.count_port_oversize(pi);
            }
            match rx {
                Ok(Rx::End) => self.ended[pi] = true,
                Ok(Rx::Idle) => ended = false,
                Ok(Rx::Packets(n)) => {
                    got += n;
                    ended = false;
                }
                Err(source) => {
                    self.burst = burst;
                    return Err(PipelineError::Port {
                        port: self.ports[pi].name(),
                        source,
                    });
                }
            }
            for m in burst.drain(..) {
                self.dispatch(m, live);
            }
            self.burst = burst;
        }
        self.poll_completions();
        let completed = std::mem::take(&mut self.completed_since_poll);
        self.flush_tx();
        if let Some(e) = self.port_error.take() {
            return Err(e);
        }
        Ok(Polled {
            received: got,
            completed,
            ended,
        })
    }

    /// Runs until every port has ended (files, the generator) or a [`Command::Stop`]
    /// arrives, then processes what is in flight and flushes the ports. `progress` is
    /// called with the frames received so far every few thousand frames, and whenever
    /// the events channel is half full (take them off it there: [`Pipeline::run`] does).
    pub fn run(&mut self, mut progress: impl FnMut(u64)) -> Result<u64, PipelineError> {
        let mut total = 0u64;
        let mut last = 0u64;
        let mut idle = Idle::new();
        let ports = self.readiness_fds();
        self.run_loop(&mut total, &mut last, &mut idle, ports, &mut progress)?;
        self.flush();
        for p in &mut self.ports {
            p.flush().map_err(|source| PipelineError::Port {
                port: p.name(),
                source,
            })?;
        }
        progress(total);
        Ok(total)
    }

    /// What a loop driving the data plane, idle, blocks on beside its waker: the
    /// descriptors of the ports that have not ended, which only it drains (`None`: such a
    /// port must be polled).
    fn readiness_fds(&self) -> Option<Vec<RawFd>> {
        self.ports
            .iter()
            .zip(&self.ended)
            .filter(|(_, &ended)| !ended)
            .map(|(p, _)| p.readiness_fds())
            .collect::<Option<Vec<_>>>()
            .map(|v| v.concat())
    }

    /// Runs until a [`Command::Stop`] arrives, as a daemon's data plane does: unlike
    /// [`run`](Self::run), ports that end (a pcap) leave it idle, still applying
    /// commands, and a port's error goes to `on_error` (the loop naps 10 ms and goes
    /// on). Idle, it blocks as `run` does, for at most the
    /// [idle wait](Self::set_idle_wait), on the descriptors of the ports that have not
    /// ended (once every port has, on commands and completions alone). Call
    /// [`finish`](Self::finish) after it returns.
    pub fn serve(&mut self, mut on_error: impl FnMut(PipelineError)) {
        let mut idle = Idle::new();
        let mut fds = self.readiness_fds();
        let mut ended = self.ended.iter().filter(|&&e| e).count();
        loop {
            if !self.apply_commands() {
                break;
            }
            for e in self.watch_links() {
                on_error(e);
            }
            match self.poll() {
                Ok(polled) => {
                    let now = self.ended.iter().filter(|&&e| e).count();
                    if now != ended {
                        // A port ended (a pcap read to its end): no longer polled for, so
                        // the live ports' descriptors (or, with none left, commands and
                        // completions alone) wake it.
                        ended = now;
                        fds = self.readiness_fds();
                    }
                    if !polled.is_idle() {
                        idle.busy();
                    } else {
                        match self.idle_turn(&mut idle, fds.as_deref()) {
                            Ok(None) => {}
                            // A port's interface went down or away: said once (the socket's
                            // error is read and cleared), and the data plane goes on.
                            Ok(Some(e)) | Err(e) => on_error(e),
                        }
                    }
                }
                Err(e) => {
                    on_error(e);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }

    /// Calls `f` on this data plane's thread with each worker found stuck in a handler or
    /// dead, once its tenants were moved to live workers in the data plane's own Worker
    /// Table (after its `WorkerStuck` or `WorkerDied` event). For a Packet Dispatcher that
    /// runs outside the data plane (the XDP program), which must stop sending that
    /// worker's tenants to it. Keep `f` short: the data plane waits for it.
    pub fn on_worker_lost(&mut self, f: impl FnMut(WorkerId) + Send + 'static) {
        self.worker_lost = Some(Box::new(f));
    }

    /// How long an idle thread blocks, at most, before it looks again when no frame
    /// arrives (default [`DEFAULT_IDLE_WAIT`](crate::DEFAULT_IDLE_WAIT)); zero: idle
    /// threads never block (they nap briefly between polls, as before a frame arrives).
    pub fn set_idle_wait(&mut self, wait: std::time::Duration) {
        self.idle.set_wait(wait);
    }

    /// [`run`](Self::run)'s loop.
    fn run_loop(
        &mut self,
        total: &mut u64,
        last: &mut u64,
        idle: &mut Idle,
        fds: Option<Vec<RawFd>>,
        progress: &mut impl FnMut(u64),
    ) -> Result<(), PipelineError> {
        loop {
            if !self.apply_commands() {
                break;
            }
            // An interface that went down or away is an event; the watcher of a live run
            // ends it. Any other error a port's socket reports ends the run.
            if let Some(e) = self.watch_links().into_iter().find(|e| !e.is_link_lost()) {
                return Err(e);
            }
            let polled = self.poll()?;
            let (n, ended) = (polled.received, polled.ended);
            *total += n as u64;
            // Also when the events channel is half full: a caller that takes the events
            // off it in `progress` (as `Pipeline::run` does) loses none while the ports
            // bring nothing (workers fed by their own sources).
            if *total - *last >= 8192 || self.events.len() >= EVENT_CAPACITY / 2 {
                *last = *total;
                progress(*total);
            }
            if ended && !self.ports.is_empty() {
                break;
            }
            if polled.is_idle() {
                // A port whose interface went down is an event, not the run's end.
                self.idle_turn(idle, fds.as_deref())?;
            } else {
                idle.busy();
            }
        }
        Ok(())
    }

    /// One idle turn of a loop driving the data plane: spins, naps, or blocks on the
    /// waker and `fds` (see [`Idle::empty`]); a command that arrives while it naps is
    /// applied. A port whose descriptor woke it with an error condition is asked for the
    /// error ([`Port::take_error`], which clears it): an interface that went down or away
    /// is a [`WorkerEvent::PortDown`], also returned as a notice (`Ok(Some)`); any other
    /// error is returned as such.
    fn idle_turn(
        &mut self,
        idle: &mut Idle,
        fds: Option<&[RawFd]>,
    ) -> Result<Option<PipelineError>, PipelineError> {
        // Frames in the workers' hands wake it when they come back; a hand-over
        // and a retiring slot wait for a worker's flush or idle count, which it
        // looks for.
        let wait = if self.handovers.is_empty() && self.retiring.is_empty() {
            self.idle.wait()
        } else {
            std::time::Duration::ZERO
        };
        let mut cmd = None;
        let (commands, workers) = (&self.commands, &self.workers);
        let failed = idle.empty(
            wait,
            &self.waker,
            fds,
            || !commands.is_empty() || workers.iter().any(|w| !w.done.is_empty()),
            // Idle: wait for a command instead of spinning.
            || {
                cmd = self
                    .commands
                    .recv_timeout(std::time::Duration::from_micros(50))
                    .ok()
            },
        );
        if let Some(cmd) = cmd {
            self.apply(cmd);
        }
        let Some(fd) = failed else {
            return Ok(None);
        };
        let ended = &self.ended;
        let Some(pi) =
            self.ports.iter().zip(ended).position(|(p, &ended)| {
                !ended && p.readiness_fds().is_some_and(|v| v.contains(&fd))
            })
        else {
            return Ok(None);
        };
        match self.take_port_error(pi) {
            Some(e) if !e.is_link_lost() => Err(e),
            notice => Ok(notice),
        }
    }

    /// Reads and clears the error pending on port `pi` ([`Port::take_error`]): an
    /// interface that went down or away is a [`WorkerEvent::PortDown`], returned as well
    /// ([`PipelineError::is_link_lost`]), and one that is down is looked at again about
    /// once a second ([`watch_links`](Self::watch_links)); any other error is returned as
    /// such.
    fn take_port_error(&mut self, pi: usize) -> Option<PipelineError> {
        let source = self.ports[pi].take_error().err()?;
        let port = self.ports[pi].name();
        if !matches!(source, PortError::LinkLost { .. }) {
            return Some(PipelineError::Port { port, source });
        }
        if matches!(source, PortError::LinkLost { gone: false, .. }) {
            self.links_down.get_or_insert_with(std::time::Instant::now);
        }
        Some(self.link_lost(port, source))
    }

    /// Raises [`WorkerEvent::PortDown`] for `port`'s `source` (a [`PortError::LinkLost`]);
    /// the same as a notice.
    fn link_lost(&self, port: String, source: PortError) -> PipelineError {
        self.emit(WorkerEvent::PortDown {
            port: port.clone(),
            message: source.to_string(),
        });
        PipelineError::Port { port, source }
    }

    /// Called once per turn of a loop driving the data plane. Every [`LINK_LOOK_TURNS`]
    /// turns it asks the ports that have not ended for an error pending on their sockets
    /// ([`take_port_error`](Self::take_port_error)): a data plane that never blocks on a
    /// port's socket (busy, an idle wait of zero, a polled port beside it, a
    /// transmit-only socket) learns of a link that went down that way. About once a
    /// second while an interface is down, it asks the ports ([`Port::recheck_link`])
    /// whether it came back or went away: gone, it is a [`WorkerEvent::PortDown`] again.
    /// Returns what it found, link notices and errors alike.
    fn watch_links(&mut self) -> Vec<PipelineError> {
        let mut found = Vec::new();
        self.turns_unlooked += 1;
        if self.turns_unlooked >= LINK_LOOK_TURNS {
            self.turns_unlooked = 0;
            for pi in 0..self.ports.len() {
                if !self.ended[pi] {
                    found.extend(self.take_port_error(pi));
                }
            }
        }
        let Some(since) = self.links_down else {
            return found;
        };
        if since.elapsed() < std::time::Duration::from_secs(1) {
            return found;
        }
        let (mut down, mut gone) = (false, Vec::new());
        for (port, _) in self.ports.iter_mut().zip(&self.ended).filter(|(_, &e)| !e) {
            match port.recheck_link() {
                Ok(d) => down |= d,
                Err(source) => gone.push((port.name(), source)),
            }
        }
        self.links_down = down.then(std::time::Instant::now);
        found.extend(
            gone.into_iter()
                .map(|(port, source)| self.link_lost(port, source)),
        );
        found
    }

    /// A snapshot of everything counted so far (call [`flush`](Self::flush) first for
    /// exact numbers). `events` is empty: events leave through the channel.
    pub fn report(&self) -> Report {
        let names = self
            .core
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut tenants = Vec::new();
        // The dispatcher's tenants (a tenant admitted in the Tenant Table but not yet
        // known to the dispatcher has no rebased counters yet), named by the published
        // entries: no lock an admission's `init` could hold.
        let slots: Vec<TenantSlot> = self
            .dispatcher
            .scheduler()
            .tenants()
            .map(|(s, _)| s)
            .collect();
        for slot in slots {
            let Some(id) = self.core.shared.table.published_id(slot) else {
                continue;
            };
            let (i, info) = (slot.index(), &self.slots[slot.index()]);
            let mut r = TenantReport {
                id,
                name: names[i].clone().unwrap_or_default(),
                ..Default::default()
            };
            for w in &self.workers {
                w.counters.tenants[i].add_into(&mut r);
            }
            subtract(&mut r, &info.baseline);
            r.add_drop(DropReason::Policed, info.policed);
            r.add_drop(DropReason::WorkerDied, info.worker_died);
            r.add_drop(DropReason::RingFull, info.ring_full);
            r.migrations = info.migrations;
            r.quarantined = self.core.shared.quarantined[i].load(Ordering::Acquire);
            if let Some(row) = self.dispatcher.scheduler().tenant(TenantSlot(i as u32)) {
                r.worker = row.worker.0;
            }
            if let Some(entry) = &*self.core.shared.table.get(slot) {
                // Never wait on a handler for long: one that does not return (a stuck
                // worker) would stop this thread, and with it the supervision that finds
                // the worker stuck. A state held past REPORT_LOCK_WAIT leaves this
                // snapshot without the tenant's NF counters. A quarantined tenant's NF
                // code is not run again: only what its state holds is read, and a state
                // it could not be entered into once is not tried again (see
                // `SlotInfo::unenterable`).
                let region = entry.extent().base;
                if !(r.quarantined && info.unenterable.get() == Some(region)) {
                    match lock_state_within(entry, REPORT_LOCK_WAIT) {
                        Locked::State(state) => {
                            let nf = &self.core.shared.nf;
                            let summary = if r.quarantined {
                                nf.quarantined_summary(&state)
                            } else {
                                nf.summary(&state)
                            };
                            r.nf = summary.into_iter().collect();
                        }
                        Locked::Unenterable if r.quarantined => {
                            info.unenterable.set(Some(region));
                        }
                        Locked::Unenterable | Locked::Held => {}
                    }
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
        let mut global = self.global.clone();
        global.events_dropped = self.core.events_dropped.load(Ordering::Relaxed);
        Report {
            tenants,
            workers,
            global,
            events: Vec::new(),
            sink_error: None,
        }
    }

    fn shutdown(&mut self) {
        self.core.stopped.store(true, Ordering::Release);
        // Nothing is waited for any more: no worker may keep packets gated, and what the
        // data plane held goes to the tenants' new workers, which run it before they stop.
        let handovers = std::mem::take(&mut self.handovers);
        for h in &handovers {
            self.core.shared.gates[h.slot.index()].store(GATE_OPEN, Ordering::Release);
        }
        for (m, live) in std::mem::take(&mut self.held) {
            let to = handovers.iter().find(|h| h.slot == m.tenant).map(|h| h.to);
            self.send_to(to, m, live);
        }
        for w in &self.workers {
            w.request_stop();
        }
        for w in &mut self.workers {
            if w.stuck {
                // Never joined: it may never come back from its handler.
                drop(w.thread.take());
                continue;
            }
            if let Some(t) = w.thread.take() {
                // Workers only exit once their ring is empty; drain completions meanwhile.
                while !t.is_finished() {
                    w.done.discard();
                    std::thread::yield_now();
                }
                let _ = t.join();
            }
        }
        // Answer what is still queued: reports get one, the rest see the channel close
        // (their callers get `Stopped`).
        while let Ok(cmd) = self.commands.try_recv() {
            if let Command::Report { reply } = cmd {
                let _ = reply.send(self.report());
            }
        }
    }

    /// Processes everything in flight, stops and joins every worker, and reports.
    pub fn finish(self) -> Report {
        self.finish_with_port_stats().0
    }

    /// [`finish`](Self::finish), and the ports' counters read after the last frame was
    /// transmitted and every port flushed: with workers reading their own sources, the
    /// frames they complete while stopping are sent only here, so counters read before
    /// this miss them.
    pub fn finish_with_port_stats(mut self) -> (Report, Vec<(String, PortStats)>) {
        self.flush();
        for w in &self.workers {
            w.request_stop();
        }
        for w in &mut self.workers {
            if w.stuck {
                drop(w.thread.take());
                continue;
            }
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        self.poll_completions();
        self.flush_tx();
        self.count_live_oversize();
        let mut report = self.report();
        for p in &mut self.ports {
            if let Err(e) = p.flush() {
                report.sink_error.get_or_insert_with(|| e.to_string());
            }
        }
        if let Some(e) = self.port_error.take() {
            report.sink_error.get_or_insert_with(|| e.to_string());
        }
        let ports = self.port_stats();
        (report, ports)
    }
}

impl<N: NetworkFunction> Drop for Dataplane<N> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Counts a dispatcher event (migrations per tenant) and sends it on as raised at input
/// packet `seq`.
fn record_event<N: NetworkFunction>(
    slots: &mut [SlotInfo],
    core: &Core<N>,
    events: &Sender<WorkerEvent>,
    e: Event,
    seq: u64,
) {
    let ev = match e {
        Event::Migration {
            tenant,
            from,
            to,
            slot,
        } => {
            if let Some(info) = slots.get_mut(tenant.index()) {
                info.migrations += 1;
            }
            let id = core.shared.table.published_id(tenant).unwrap_or_default();
            WorkerEvent::Migration {
                seq,
                tenant: id,
                from: from.0,
                to: to.0,
                slot,
            }
        }
        Event::Overload { worker, slot } => WorkerEvent::Overload {
            seq,
            worker: worker.0,
            slot,
        },
    };
    send_event(events, &core.events_dropped, ev);
}

/// Sends an event, or counts it as dropped when the channel is full (or nobody listens).
fn send_event(events: &Sender<WorkerEvent>, dropped: &AtomicU64, e: WorkerEvent) {
    if events.try_send(e).is_err() {
        dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// A pipeline driven from one thread: the [`Control`] handle and the [`Dataplane`]
/// together, for offline runs (`buffet replay`, `buffet demo`), tests and embedders that
/// push frames themselves. Control calls apply at once. For a data plane on its own
/// thread, use [`build`] and move the [`Dataplane`] there.
pub struct Pipeline<N: NetworkFunction> {
    control: Control<N>,
    dataplane: Dataplane<N>,
    events: KeptEvents,
}

/// The events a [`Pipeline`] keeps for its report: every fault and worker change, and
/// the first `cap` scheduler events; the scheduler events after those are counted only.
#[derive(Debug)]
struct KeptEvents {
    list: Vec<WorkerEvent>,
    /// Scheduler events kept so far, and how many may be.
    scheduler: usize,
    cap: usize,
    migrations_not_kept: u64,
    overloads_not_kept: u64,
}

impl KeptEvents {
    fn new(cap: usize) -> Self {
        KeptEvents {
            list: Vec::new(),
            scheduler: 0,
            cap,
            migrations_not_kept: 0,
            overloads_not_kept: 0,
        }
    }

    fn extend(&mut self, events: impl IntoIterator<Item = WorkerEvent>) {
        for e in events {
            let count = match e {
                WorkerEvent::Migration { .. } => &mut self.migrations_not_kept,
                WorkerEvent::Overload { .. } => &mut self.overloads_not_kept,
                _ => {
                    self.list.push(e);
                    continue;
                }
            };
            if self.scheduler < self.cap {
                self.scheduler += 1;
                self.list.push(e);
            } else {
                *count += 1;
            }
        }
    }

    /// Puts what was kept and counted into `r`.
    fn report_into(&self, r: &mut Report) {
        r.events = self.list.clone();
        r.global.migrations_not_kept = self.migrations_not_kept;
        r.global.overloads_not_kept = self.overloads_not_kept;
    }
}

impl<N: NetworkFunction> Pipeline<N> {
    /// Reserves the arena and launches `cfg.workers` workers.
    pub fn new(nf: N, cfg: PipelineConfig) -> Result<Self, PipelineError> {
        Self::with_sources(nf, cfg, Vec::new())
    }

    /// [`new`](Self::new), the workers polling their own sources (see
    /// [`build_with_sources`]).
    pub fn with_sources(
        nf: N,
        cfg: PipelineConfig,
        sources: Vec<Box<dyn WorkerSource>>,
    ) -> Result<Self, PipelineError> {
        let kept = KeptEvents::new(cfg.events_kept);
        let (control, dataplane) = build_with_sources(nf, cfg, sources)?;
        Ok(Pipeline {
            control,
            dataplane,
            events: kept,
        })
    }

    /// The control handle (clone it to admit or remove tenants from other threads while
    /// [`run`](Self::run) drives traffic).
    pub fn control(&self) -> &Control<N> {
        &self.control
    }

    /// The data plane.
    pub fn dataplane(&mut self) -> &mut Dataplane<N> {
        &mut self.dataplane
    }

    /// The NF.
    pub fn nf(&self) -> &N {
        self.control.nf()
    }

    /// The dispatcher (read-only: tables, stats).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dataplane.dispatcher
    }

    /// How long an idle thread blocks at most (see [`Dataplane::set_idle_wait`]).
    pub fn set_idle_wait(&mut self, wait: Duration) {
        self.dataplane.set_idle_wait(wait);
    }

    /// Adds a port (see [`Dataplane::add_port`]).
    pub fn add_port(&mut self, port: Box<dyn Port>) -> PortId {
        self.dataplane.add_port(port)
    }

    /// Admits a tenant (see [`Control::admit`]).
    pub fn admit(&mut self, spec: TenantSpec<N::Policy>) -> Result<TenantSlot, PipelineError> {
        let pending = self.control.admit_start(spec)?;
        self.dataplane.apply_commands();
        pending.wait(&self.control)
    }

    /// Replaces a tenant's NF policy (see [`Control::update_policy`]).
    pub fn update_policy(&mut self, id: TenantId, policy: &N::Policy) -> Result<(), PipelineError> {
        self.control.update_policy(id, policy)
    }

    /// Sets a tenant's DRR weight (see [`Control::set_weight`]).
    pub fn set_weight(&mut self, id: TenantId, weight: u32) -> Result<(), PipelineError> {
        self.control.set_weight(id, weight)
    }

    /// Removes a tenant (see [`Control::remove`]).
    pub fn remove(&mut self, id: TenantId) -> Result<(), PipelineError> {
        let rx = self.control.remove_start(id, Vec::new())?;
        self.dataplane.apply_commands();
        finish_remove(id, rx.recv().ok())
    }

    /// Launches one more worker.
    pub fn launch_worker(&mut self) -> Result<WorkerId, PipelineError> {
        let rx = self.control.ask_pipeline(|reply| Command::LaunchWorker {
            source: None,
            reply,
        })?;
        self.apply_and_answer(rx)
    }

    /// Lifts a tenant's quarantine (see [`Control::release`]).
    pub fn release(&mut self, id: TenantId) -> Result<(), PipelineError> {
        let slot = self.slot_of(id).ok_or(PipelineError::Unknown(id))?;
        let rx = self
            .control
            .ask_pipeline(|reply| Command::Release { slot, reply })?;
        self.apply_and_answer(rx)
    }

    /// Terminates a worker (see [`Control::terminate_worker`]).
    pub fn terminate_worker(&mut self, worker: WorkerId) -> Result<(), PipelineError> {
        let rx = self
            .control
            .ask_pipeline(|reply| Command::TerminateWorker { worker, reply })?;
        self.apply_and_answer(rx)
    }

    /// Applies the command just sent and returns its answer.
    fn apply_and_answer<T>(
        &mut self,
        rx: Receiver<Result<T, PipelineError>>,
    ) -> Result<T, PipelineError> {
        self.dataplane.apply_commands();
        self.drain_events();
        rx.recv().unwrap_or(Err(PipelineError::Stopped))
    }

    /// Ids of the live workers.
    pub fn live_workers(&self) -> Vec<WorkerId> {
        (0..self.dataplane.workers.len())
            .filter(|&i| self.dataplane.workers[i].live)
            .map(|i| WorkerId(i as u16))
            .collect()
    }

    /// The slot of an admitted tenant.
    pub fn slot_of(&self, id: TenantId) -> Option<TenantSlot> {
        self.control.slot_of(id)
    }

    fn drain_events(&mut self) {
        self.events.extend(self.control.events.try_iter());
    }

    /// Offers one frame (see [`Dataplane::push`]); lossless.
    pub fn push(&mut self, ts_ns: u64, in_port: PortId, frame: &[u8]) {
        self.dataplane.push(ts_ns, in_port, frame);
        if self.control.events.len() > EVENT_CAPACITY / 2 {
            self.drain_events();
        }
    }

    /// Runs the ports to their end (see [`Dataplane::run`]), keeping the events.
    pub fn run(&mut self, progress: impl FnMut(u64)) -> Result<u64, PipelineError> {
        let events = self.control.events.clone();
        let kept = &mut self.events;
        let mut progress = progress;
        let r = self.dataplane.run(|n| {
            kept.extend(events.try_iter());
            progress(n)
        });
        self.drain_events();
        r
    }

    /// Takes processed packets back (see [`Dataplane::poll_completions`]).
    pub fn poll_completions(&mut self) {
        self.dataplane.poll_completions();
        self.dataplane.flush_tx();
        self.drain_events();
    }

    /// Waits until every packet pushed so far has been processed.
    pub fn flush(&mut self) {
        self.dataplane.flush();
        self.drain_events();
    }

    /// Events so far, in order (this single-threaded pipeline keeps them, the
    /// scheduler's up to [`PipelineConfig::events_kept`]; a [`Control`] consumer reads
    /// the channel instead).
    pub fn events(&mut self) -> &[WorkerEvent] {
        self.drain_events();
        &self.events.list
    }

    /// A snapshot of everything counted so far, with the events kept so far.
    pub fn report(&mut self) -> Report {
        self.drain_events();
        self.dataplane.count_live_oversize();
        let mut r = self.dataplane.report();
        self.events.report_into(&mut r);
        r
    }

    /// Processes everything in flight, stops and joins every worker, and reports.
    pub fn finish(self) -> Report {
        self.finish_with_port_stats().0
    }

    /// [`finish`](Self::finish), and the ports' counters once everything was sent (see
    /// [`Dataplane::finish_with_port_stats`]).
    pub fn finish_with_port_stats(self) -> (Report, Vec<(String, PortStats)>) {
        let Pipeline {
            control,
            mut dataplane,
            mut events,
        } = self;
        dataplane.flush();
        events.extend(control.events.try_iter());
        let (mut r, ports) = dataplane.finish_with_port_stats();
        events.extend(control.events.try_iter());
        events.report_into(&mut r);
        (r, ports)
    }
}

/// A removed slot waiting for the packets queued under it to drain before it is reused.
struct Retiring {
    slot: TenantSlot,
    /// Packets dispatched to each worker when it retired.
    snapshot: Vec<u64>,
    /// Workers fed by their own source that may still hold frames of the slot, with
    /// their `idle` count when it retired.
    held: Vec<(usize, u64)>,
}

/// MPK: every worker may pin one cache key at a time and the control thread one more
/// (reports lock tenants); more would make groups wait for keys. One key beyond that is
/// kept spare: a chain's C stage opens its own part key while its tenant's key is pinned
/// (two at once, nested), and with every key pinned by threads each waiting for a second
/// one none could go on; with one spare, some thread always gets its second key.
fn check_mpk_workers(mpk: &Mpk, workers: u16) -> Result<(), PipelineError> {
    let needed = usize::from(workers) + 2;
    if needed > mpk.cache_keys() {
        return Err(PipelineError::Config(format!(
            "MPK isolation: {workers} workers need {needed} protection keys (one per \
             worker, one for the control thread, one spare for nested part keys), this \
             process has {}",
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

#[cfg(test)]
mod update_tests {
    use buffet_dispatch::Match;
    use buffet_nfs::monitor::{Monitor, MonitorPolicy};

    use super::*;

    /// Monitor tenant `id` on 10.0.`net`.0/24.
    pub(super) fn spec(id: u32, net: u8) -> TenantSpec<MonitorPolicy> {
        TenantSpec {
            id: TenantId(id),
            name: format!("t{id}"),
            rules: vec![(
                100,
                Match {
                    dst_ip: Some(format!("10.0.{net}.0/24").parse().unwrap()),
                    ..Match::default()
                },
            )],
            max_nb: 0,
            policy: MonitorPolicy::default(),
        }
    }

    /// An update looks its tenant's slot up on the caller's thread; the data plane
    /// applies it later. Tenant 7 removed and tenant 9 admitted at the same slot in
    /// between: the update of 7 is refused and 9 keeps its name and rules.
    #[test]
    fn an_update_of_a_removed_tenant_leaves_the_tenant_now_at_its_slot_alone() {
        let mut p = Pipeline::new(
            Monitor::default(),
            PipelineConfig {
                workers: 1,
                pin: false,
                // One slot: tenant 9 gets the one tenant 7 had.
                tenant_capacity: 1,
                ..PipelineConfig::default()
            },
        )
        .unwrap();
        let slot = p.admit(spec(7, 7)).unwrap();
        p.remove(TenantId(7)).unwrap();
        // The slot is reclaimed at the next look at the workers.
        p.dataplane().poll_completions();
        assert_eq!(
            p.admit(spec(9, 9)).unwrap(),
            slot,
            "the slot was not reused"
        );
        let rules_of_9 = format!("{:?}", p.dispatcher().classifier().rules_of(slot));
        let (reply, answer) = channel::bounded(1);
        p.dataplane().apply(Command::Update {
            id: TenantId(7),
            slot,
            name: "seven".into(),
            rules: spec(7, 77).rules,
            max_nb: 5,
            publish: None,
            reply,
        });
        assert!(
            matches!(
                answer.recv().unwrap(),
                Err(PipelineError::Unknown(TenantId(7)))
            ),
            "the update of a removed tenant was applied"
        );
        assert_eq!(
            format!("{:?}", p.dispatcher().classifier().rules_of(slot)),
            rules_of_9
        );
        let names = p.control().core.names.lock().unwrap();
        assert_eq!(names[slot.index()].as_deref(), Some("t9"));
    }
}

#[cfg(test)]
mod unenterable_tests {
    use buffet_nfs::monitor::Monitor;
    use etherparse::PacketBuilder;

    use super::update_tests::spec;
    use super::*;

    fn frame(id: u32) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4([192, 168, 0, 1], [10, 0, id as u8, 1], 64)
            .udp(1000, 53)
            .write(&mut v, b"payload")
            .unwrap();
        v
    }

    fn monitored(r: &Report, id: u32) -> Option<u64> {
        let t = r.tenants.iter().find(|t| t.id == TenantId(id)).unwrap();
        t.nf.get("monitored_packets").copied()
    }

    /// Under MPK (simulated keys, no `pku` needed), a tenant whose region can no longer
    /// be given a protection key is quarantined by its worker; reports then read its
    /// state once, find it cannot be entered, and leave it alone: no report after that
    /// takes a key miss for it (each would park a neighbour's key and fail again), and
    /// the neighbours' NF counters are read as always. Released once its key can be
    /// loaded again, its state is read as before.
    #[test]
    fn reports_do_not_retry_a_quarantined_tenant_whose_key_cannot_be_loaded() {
        let (mpk, mem) = Mpk::simulated(3);
        let cfg = PipelineConfig {
            workers: 1,
            pin: false,
            domain: Domain::Mpk,
            tenant_capacity: 8,
            ..PipelineConfig::default()
        };
        let (control, dataplane) =
            build_on(Monitor::default(), cfg, Vec::new(), Some(mpk)).unwrap();
        let mut p = Pipeline {
            control,
            dataplane,
            events: KeptEvents::new(EVENTS_KEPT),
        };
        // Five tenants on three keys: each admission's `init` took a key, so the last
        // three hold them and tenant 2's region is parked.
        for t in 1..=5 {
            p.admit(spec(t, t as u8)).unwrap();
        }
        let bad = p.slot_of(TenantId(2)).unwrap();
        let base = p
            .control()
            .core
            .shared
            .table
            .get(bad)
            .entry()
            .unwrap()
            .extent()
            .base;
        // Every cache key (2, 3, 4) refuses tenant 2's region.
        for key in 2..=4 {
            mem.fail_retags(base, key);
        }
        for ts in 0..3 {
            for t in 1..=5 {
                p.push(ts, 0, &frame(t));
            }
        }
        p.flush();
        let r = p.report();
        let two = r.tenants.iter().find(|t| t.id == TenantId(2)).unwrap();
        assert!(two.quarantined, "{two:?}");
        assert_eq!(two.drops.get("quarantined"), Some(&3), "{two:?}");
        assert_eq!(monitored(&r, 2), None);
        for t in [1, 3, 4, 5] {
            assert_eq!(monitored(&r, t), Some(3), "tenant {t}");
        }
        // That report tried tenant 2's state once more; from now on, none does.
        let failures = mpk.stats().retag_failures;
        for _ in 0..5 {
            let r = p.report();
            assert_eq!(monitored(&r, 2), None);
            for t in [1, 3, 4, 5] {
                assert_eq!(monitored(&r, t), Some(3), "tenant {t}");
            }
        }
        assert_eq!(
            mpk.stats().retag_failures,
            failures,
            "a report tried the quarantined tenant's key again"
        );
        // Its key can be loaded again: released, its state is read as before.
        mem.heal();
        p.release(TenantId(2)).unwrap();
        let r = p.report();
        assert_eq!(monitored(&r, 2), Some(0));
        for ts in 3..5 {
            p.push(ts, 0, &frame(2));
        }
        p.flush();
        assert_eq!(monitored(&p.report(), 2), Some(2));
    }
}

#[cfg(test)]
mod kept_events_tests {
    use super::*;

    #[test]
    fn faults_and_worker_changes_are_kept_past_the_scheduler_events_cap() {
        let overload = |slot| WorkerEvent::Overload {
            seq: 0,
            worker: 0,
            slot,
        };
        let migration = |slot| WorkerEvent::Migration {
            seq: 0,
            tenant: TenantId(1),
            from: 0,
            to: 1,
            slot,
        };
        let fault = WorkerEvent::Fault {
            tenant: TenantId(1),
            worker: 0,
            message: "boom".into(),
        };
        let mut kept = KeptEvents::new(2);
        kept.extend([overload(0), migration(0), fault.clone()]);
        kept.extend([
            overload(1),
            migration(1),
            WorkerEvent::WorkerLaunched { worker: 1 },
        ]);
        kept.extend([migration(2)]);
        let mut r = Report::default();
        kept.report_into(&mut r);
        assert_eq!(
            r.events,
            vec![
                overload(0),
                migration(0),
                fault,
                WorkerEvent::WorkerLaunched { worker: 1 }
            ]
        );
        assert_eq!(r.global.overloads_not_kept, 1);
        assert_eq!(r.global.migrations_not_kept, 2);
    }
}
