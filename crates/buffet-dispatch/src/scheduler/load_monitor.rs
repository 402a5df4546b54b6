//! The Load Monitor: per-tenant and per-worker packet counts by timeslot.
//!
//! The paper's Fig. 4 keeps two tables for it: one row per tenant ([`TenantRow`], the
//! paper's "Tenant Table" of the dispatcher — not the Memory Manager's Tenant Table of
//! regions, which `buffet-memory` implements) and one row per worker ([`WorkerRow`], the
//! Worker Table). This module holds the rows and how a worker row *rolls* into a new
//! timeslot; [`Scheduler`](super::Scheduler) owns the tables and counts into them per
//! packet, and the [Tenant Assigner](super::tenant_assigner) reads them to choose.

use crate::WorkerId;

/// One tenant's row (paper Fig. 4a), indexed by tenant slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantRow {
    /// The worker this tenant's packets go to.
    pub worker: WorkerId,
    /// The timeslot of the tenant's last packet; `None` before its first packet.
    pub cur_slot: Option<u64>,
    /// Packets (passed and policed) of the tenant in `cur_slot`.
    pub pkt_nb: u64,
    /// Packets allowed per timeslot; 0 means unlimited.
    pub max_nb: u64,
}

/// One row of the Worker Table (paper Fig. 4b), indexed by worker id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerRow {
    /// Whether the worker may receive packets and tenants.
    pub live: bool,
    /// The timeslot the counters below refer to; `None` before the worker is first
    /// rolled.
    pub cur_slot: Option<u64>,
    /// Packets passed to the worker in `cur_slot`.
    pub pkt_nb: u64,
    /// Packets of the previous timeslot, as adjusted by migrations in this timeslot.
    pub last_nb: u64,
    /// Capacity in packets per timeslot (taken literally; see the module docs).
    pub max_nb: u64,
    /// Consecutive overload detections.
    pub times: u32,
}

impl WorkerRow {
    pub(crate) fn new(max_nb: u64) -> Self {
        WorkerRow {
            live: true,
            cur_slot: None,
            pkt_nb: 0,
            last_nb: 0,
            max_nb,
            times: 0,
        }
    }

    /// Rolls the row into `timeslot` (see the module docs).
    pub(crate) fn roll(&mut self, timeslot: u64) {
        if self.cur_slot != Some(timeslot) {
            self.last_nb = if is_prev(self.cur_slot, timeslot) {
                self.pkt_nb
            } else {
                0
            };
            self.cur_slot = Some(timeslot);
            self.pkt_nb = 0;
        }
    }

    /// This row as the scheduler would see it in `timeslot` (rolled into it).
    pub fn rolled(&self, timeslot: u64) -> WorkerRow {
        let mut r = *self;
        r.roll(timeslot);
        r
    }
}

/// `prev(x)`: the row's current timeslot is the one just before `timeslot`.
pub(crate) fn is_prev(cur: Option<u64>, timeslot: u64) -> bool {
    match (cur, timeslot.checked_sub(1)) {
        (Some(c), Some(p)) => c == p,
        _ => false,
    }
}

/// A worker overloaded for more than `threshold` consecutive detections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OverloadReport {
    /// The overloaded worker.
    pub worker: WorkerId,
    /// The timeslot in which it was detected.
    pub slot: u64,
}
