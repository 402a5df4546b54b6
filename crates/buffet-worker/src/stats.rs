//! Per-tenant and per-worker accounting.
//!
//! Each worker owns one [`TenantCounters`] row per tenant slot and is the only writer
//! of its rows, so updates are plain relaxed load + store (no locked instruction): the
//! packet, byte and pass counts once per Packet Buffer, a drop when it happens (drops are
//! rare). Anyone may read them at any time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use buffet_sdk::{DropCause, ParseError, TenantId};
use serde::Serialize;

/// Why the framework or the NF dropped a packet of a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The NF dropped it for this cause.
    Nf(DropCause),
    /// Over the tenant's MAX_NB in its timeslot (dispatcher policing).
    Policed,
    /// The worker could not parse it.
    Malformed,
    /// The tenant was removed while its packet was queued.
    NoTenant,
    /// The tenant is quarantined after a fault in its handler.
    Quarantined,
    /// No live worker could take it.
    NoLiveWorker,
    /// Its worker thread died (outside a handler) with the packet in its burst,
    /// unprocessed.
    WorkerDied,
    /// A live run's Packet Dispatcher found its worker's ring full and dropped it rather
    /// than wait (also in the run-wide `global.ring_full`).
    RingFull,
}

impl DropReason {
    /// Stable name for tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Nf(c) => c.name(),
            DropReason::Policed => "policed",
            DropReason::Malformed => "malformed",
            DropReason::NoTenant => "no_tenant",
            DropReason::Quarantined => "quarantined",
            DropReason::NoLiveWorker => "no_live_worker",
            DropReason::WorkerDied => "worker_died",
            DropReason::RingFull => "ring_full",
        }
    }
}

const NF_CAUSES: usize = DropCause::ALL.len();

/// One worker's counters for one tenant. The fields every Packet Buffer updates share
/// the row's first cache line; the NF drop counters, touched only when the NF drops,
/// take the second. Every field is an atomic counter, zero when its bytes are: a
/// worker's rows are mapped zero-filled ([`crate::sys::Rows`]).
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct TenantCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub passed: AtomicU64,
    pub cycles: AtomicU64,
    pub groups: AtomicU64,
    pub malformed: AtomicU64,
    pub no_tenant: AtomicU64,
    pub quarantined: AtomicU64,
    pub nf_drops: [AtomicU64; NF_CAUSES],
}

/// Adds `n` to a counter that only the calling thread writes.
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    if n != 0 {
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }
}

/// Adds `n` to a counter that only the calling thread writes, without testing `n`.
#[inline(always)]
fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// Totals gathered over one Packet Buffer before they are published: the counts every
/// group adds to. Drops, rare, go straight to the counter row as they happen
/// ([`Drops`]), so the tally stays three words the worker keeps in registers.
#[derive(Default, Clone, Copy)]
pub(crate) struct GroupTally {
    pub packets: u64,
    pub bytes: u64,
    pub passed: u64,
}

/// Where a worker counts one tenant's drops as they happen: its counter row (`None` for
/// a slot beyond the counters: nothing is counted).
#[derive(Clone, Copy)]
pub(crate) struct Drops<'a>(pub Option<&'a TenantCounters>);

impl Drops<'_> {
    /// `n` packets the NF dropped for `cause`.
    #[inline]
    pub(crate) fn nf(self, cause: DropCause, n: u64) {
        if let Some(r) = self.0 {
            bump(&r.nf_drops[cause.index()], n);
        }
    }

    /// `n` packets that did not parse.
    #[inline]
    pub(crate) fn malformed(self, n: u64) {
        if let Some(r) = self.0 {
            bump(&r.malformed, n);
        }
    }

    /// `n` packets of a quarantined tenant.
    #[inline]
    pub(crate) fn quarantined(self, n: u64) {
        if let Some(r) = self.0 {
            bump(&r.quarantined, n);
        }
    }

    /// `n` packets of a slot with no tenant.
    #[inline]
    pub(crate) fn no_tenant(self, n: u64) {
        if let Some(r) = self.0 {
            bump(&r.no_tenant, n);
        }
    }
}

impl TenantCounters {
    /// Adds one group's tally and cycles (its drops were counted as they happened).
    #[inline(always)]
    pub(crate) fn publish(&self, t: &GroupTally, cycles: u64) {
        // A group has at least one packet and one byte.
        add(&self.packets, t.packets);
        add(&self.bytes, t.bytes);
        add(&self.groups, 1);
        bump(&self.passed, t.passed);
        bump(&self.cycles, cycles);
    }

    pub(crate) fn add_into(&self, r: &mut TenantReport) {
        r.packets += self.packets.load(Relaxed);
        r.bytes += self.bytes.load(Relaxed);
        r.passed += self.passed.load(Relaxed);
        r.cycles += self.cycles.load(Relaxed);
        r.groups += self.groups.load(Relaxed);
        for (cause, c) in DropCause::ALL.iter().zip(&self.nf_drops) {
            r.add_drop(DropReason::Nf(*cause), c.load(Relaxed));
        }
        r.add_drop(DropReason::Malformed, self.malformed.load(Relaxed));
        r.add_drop(DropReason::NoTenant, self.no_tenant.load(Relaxed));
        r.add_drop(DropReason::Quarantined, self.quarantined.load(Relaxed));
    }
}

/// One worker's counter block: a row per tenant slot plus totals.
pub(crate) struct WorkerCounters {
    pub tenants: crate::sys::Rows,
    pub packets: AtomicU64,
    pub bursts: AtomicU64,
    pub busy_cycles: AtomicU64,
    /// Frames a worker fed by its own source took from it (rejected ones included).
    pub received: AtomicU64,
    /// Passes of its thread that found its input empty and nothing held back.
    pub idle: AtomicU64,
    /// The tenant slot + 1 whose packet group the worker is running or waiting to run
    /// (0: none), with [`RUNNING_WAITS`] set while it waits for another thread to give
    /// the tenant's state back: the tenant a worker found stuck is stuck in. Its own
    /// line, written twice per group by the worker alone and read only by stall detection.
    pub running: crossbeam::utils::CachePadded<std::sync::atomic::AtomicU32>,
}

/// Set in [`WorkerCounters::running`] while the worker waits for a state another thread
/// holds: it is not stuck itself, and goes on once the holder gives the state back or the
/// tenant is quarantined.
pub(crate) const RUNNING_WAITS: u32 = 1 << 31;

impl WorkerCounters {
    pub(crate) fn new(slots: u32) -> Self {
        WorkerCounters {
            tenants: crate::sys::Rows::zeroed(slots as usize),
            packets: AtomicU64::new(0),
            bursts: AtomicU64::new(0),
            busy_cycles: AtomicU64::new(0),
            received: AtomicU64::new(0),
            idle: AtomicU64::new(0),
            running: Default::default(),
        }
    }
}

/// A tenant's line in a [`Report`].
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TenantReport {
    /// The tenant's id.
    pub id: TenantId,
    /// The tenant's name.
    pub name: String,
    /// The worker it is assigned to now.
    pub worker: u16,
    /// Packets that reached its NF handler's Packet Buffer.
    pub packets: u64,
    /// Frame bytes of those packets.
    pub bytes: u64,
    /// Packets the NF passed (Pass, Forward or Tx).
    pub passed: u64,
    /// Drops by reason (only reasons that occurred).
    pub drops: BTreeMap<&'static str, u64>,
    /// Times the scheduler moved it to another worker.
    pub migrations: u64,
    /// CPU cycles its handler groups took (rdtsc). Groups of fewer than 8 packets run
    /// from a burst (no persistent Packet Buffers) are timed in one burst in 8, at random,
    /// and count 8 times: an unbiased estimate, exact for larger groups and for groups
    /// run by the DRR.
    pub cycles: u64,
    /// Packet Buffers (groups) processed.
    pub groups: u64,
    /// True when a fault quarantined it.
    pub quarantined: bool,
    /// The NF's own counters for this tenant.
    pub nf: BTreeMap<&'static str, u64>,
}

impl TenantReport {
    pub(crate) fn add_drop(&mut self, reason: DropReason, n: u64) {
        if n != 0 {
            *self.drops.entry(reason.name()).or_default() += n;
        }
    }

    /// All drops of this tenant.
    pub fn dropped(&self) -> u64 {
        self.drops.values().sum()
    }
}

/// A worker's line in a [`Report`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct WorkerReport {
    /// Worker id.
    pub id: u16,
    /// False once terminated.
    pub live: bool,
    /// Packets it processed.
    pub packets: u64,
    /// Bursts it popped.
    pub bursts: u64,
    /// Cycles spent in NF groups.
    pub busy_cycles: u64,
    /// Packets the dispatcher sent to it.
    pub dispatched: u64,
}

/// Drops that belong to no tenant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GlobalReport {
    /// Frames offered to the pipeline.
    pub input_packets: u64,
    /// Frames the dispatcher could not parse, by reason.
    pub malformed: BTreeMap<&'static str, u64>,
    /// Frames no classifier rule matched.
    pub unmatched: u64,
    /// Frames larger than a frame buffer.
    pub oversize: u64,
    /// Frames dropped because no live worker was left.
    pub no_live_worker: u64,
    /// Live frames dropped because their worker's ring was full (each also under its
    /// tenant's drops as `ring_full`).
    #[serde(skip_serializing_if = "is_zero")]
    pub ring_full: u64,
    /// Packets whose verdict named a port that does not exist.
    #[serde(skip_serializing_if = "is_zero")]
    pub no_port: u64,
    /// Packets not sent because copying a port's frame to another port found no free
    /// heap frame.
    #[serde(skip_serializing_if = "is_zero")]
    pub tx_no_buffer: u64,
    /// Events dropped because nobody drained the events channel.
    #[serde(skip_serializing_if = "is_zero")]
    pub events_dropped: u64,
    /// Migrations a [`Pipeline`](crate::Pipeline) counted but did not keep in
    /// [`Report::events`]: they came after its first
    /// [`events_kept`](crate::PipelineConfig::events_kept) scheduler events.
    #[serde(skip_serializing_if = "is_zero")]
    pub migrations_not_kept: u64,
    /// Overload reports counted but not kept, as [`migrations_not_kept`](Self::migrations_not_kept).
    #[serde(skip_serializing_if = "is_zero")]
    pub overloads_not_kept: u64,
    /// Packets still queued for a tenant when it was removed, dropped (the removed
    /// tenant's own row is no longer reported).
    #[serde(skip_serializing_if = "is_zero")]
    pub removed_tenant: u64,
    /// Packets in the burst of a worker found stuck (its thread never came back from a
    /// handler), not processed; they complete normally should the thread ever return.
    #[serde(skip_serializing_if = "is_zero")]
    pub stuck_in_worker: u64,
    /// Frames a worker's own source (an AF_XDP socket the XDP Packet Dispatcher
    /// redirects to) delivered without the dispatcher's tenant tag: not processed, and
    /// attributable to no tenant.
    #[serde(skip_serializing_if = "is_zero")]
    pub untagged: u64,
    /// Frames the XDP Packet Dispatcher classified and passed to their tenant's worker
    /// but dropped in the NIC path, because they arrived on a receive queue where that
    /// worker has no AF_XDP socket (the interface has queues the run does not read).
    /// The program counts them only in total, not per tenant.
    #[serde(skip_serializing_if = "is_zero")]
    pub no_socket: u64,
    /// Frames the XDP Packet Dispatcher redirected to a worker's AF_XDP socket that the
    /// kernel dropped there before the worker read them (the socket's receive ring full,
    /// no free frame in the fill ring, an invalid descriptor: its `rx_ring_full`,
    /// `rx_dropped` and `rx_invalid_descs`). They never reach userspace, so they are
    /// counted only in total, not per tenant.
    #[serde(skip_serializing_if = "is_zero")]
    pub socket_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl GlobalReport {
    pub(crate) fn add_malformed(&mut self, e: ParseError) {
        *self.malformed.entry(e.name()).or_default() += 1;
    }

    /// All malformed frames.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.values().sum()
    }
}

/// Everything a run counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Per tenant, in admission order.
    pub tenants: Vec<TenantReport>,
    /// Per worker.
    pub workers: Vec<WorkerReport>,
    /// Not attributable to a tenant.
    pub global: GlobalReport,
    /// Scheduler and fault events, in the order they happened.
    pub events: Vec<crate::WorkerEvent>,
    /// Set when the packet sink failed (e.g. the output pcap could not be written).
    pub sink_error: Option<String>,
}
