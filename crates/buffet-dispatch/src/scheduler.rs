//! Load Monitor + Tenant Assigner: the timeslot scheduler (the Buffet paper's
//! Algorithm 1, exactly as ARCHITECTURE.md "Scheduler semantics" specifies it).
//!
//! The [`Scheduler`] owns the paper's two tables (Fig. 4): a Tenant Table of
//! [`TenantRow`]s indexed by [`TenantSlot`] and a Worker Table of [`WorkerRow`]s indexed
//! by [`WorkerId`]. [`Scheduler::schedule`] runs one step per packet, given the packet's
//! timestamp and its (already classified) tenant:
//!
//! 1. `slot = ts_ns >> shift`; `wid = T[tid].worker`. `prev(x)` means
//!    `x.cur_slot == Some(slot - 1)` (slot 0 has no previous slot).
//! 2. Same slot as the tenant's current one: `T.pkt_nb += 1`; if `T.max_nb != 0 &&
//!    T.pkt_nb > T.max_nb` the packet is **policed** (dropped; the worker is not charged).
//! 3. Otherwise (the tenant's first packet in this slot): `tmp = prev(T) ? T.pkt_nb : 0`
//!    (policed packets included); `T.cur_slot = slot; T.pkt_nb = 1`; roll `W[wid]` into
//!    the slot. If `W[wid].last_nb < W[wid].max_nb` then `W[wid].times = 0`; else roll
//!    every worker, let `mig` be the live worker with the lowest `last_nb` (ties: lowest
//!    id); if `mig != wid && W[mig].last_nb + tmp < W[mig].max_nb` move the tenant to
//!    `mig` (`W[wid].last_nb -= tmp` saturating, `W[mig].last_nb += tmp`) and send this
//!    packet there. Either way `W[wid].times += 1`, and `times > threshold` yields an
//!    [`OverloadReport`] `(wid, slot)`.
//! 4. Roll the chosen worker into the slot, `W[w].pkt_nb += 1`, **pass** to it.
//!
//! "Rolling" worker `w` into `slot`: if `w.cur_slot != Some(slot)` then
//! `w.last_nb = prev(w) ? w.pkt_nb : 0; w.cur_slot = Some(slot); w.pkt_nb = 0`. Workers
//! are rolled lazily, so a row read through [`Scheduler::worker`] may still describe an
//! older slot; [`WorkerRow::rolled`] shows it as of a given slot.
//!
//! Literal consequences, kept on purpose because the C core, the XDP program and the
//! Micro-C plugin must agree bit for bit:
//! * `times` counts overload *detections* (one per tenant's first packet in a slot on an
//!   overloaded worker), not overloaded slots, and is reset by the first non-overloaded
//!   detection.
//! * A worker `max_nb` of 0 means "always overloaded" (`last_nb < 0` never holds). Callers
//!   validate worker capacities (> 0); a tenant `max_nb` of 0 means unlimited.
//! * A timestamp whose slot differs from the tenant's current slot, even an *older* one,
//!   starts a new slot for that tenant (the spec only tests equality).
//! * A `shift` of 64 or more maps every timestamp to slot 0.
//!
//! Beyond the spec (control plane, never on the packet path): only live workers are
//! candidates; a worker that stops being live hands its tenants to the live workers
//! ([`Scheduler::terminate_worker`]); tenants stranded when no worker was live are
//! adopted when one comes back. A dead worker never receives a [`SchedOutcome::Pass`].

use crate::{TenantSlot, WorkerId};

/// Largest number of tenant slots a scheduler accepts (slots are dense indices into
/// `Vec`s; this guards against a stray huge index allocating gigabytes).
pub const MAX_TENANT_SLOTS: u32 = 1 << 24;

/// Scheduler parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// `slot = ts_ns >> shift`. The default, 30, gives slots of ≈1.07 s.
    pub shift: u32,
    /// An overload report is emitted while a worker's `times` exceeds this.
    pub threshold: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            shift: 30,
            threshold: 3,
        }
    }
}

/// One row of the Tenant Table (paper Fig. 4a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantRow {
    /// The worker this tenant's packets go to.
    pub worker: WorkerId,
    /// The slot of the tenant's last packet; `None` before its first packet.
    pub cur_slot: Option<u64>,
    /// Packets (passed and policed) of the tenant in `cur_slot`.
    pub pkt_nb: u64,
    /// Packets allowed per slot; 0 means unlimited.
    pub max_nb: u64,
}

/// One row of the Worker Table (paper Fig. 4b).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerRow {
    /// Whether the worker may receive packets and tenants.
    pub live: bool,
    /// The slot the counters below refer to; `None` before the worker is first rolled.
    pub cur_slot: Option<u64>,
    /// Packets passed to the worker in `cur_slot`.
    pub pkt_nb: u64,
    /// Packets of the previous slot, as adjusted by migrations in this slot.
    pub last_nb: u64,
    /// Capacity in packets per slot (taken literally; see the module docs).
    pub max_nb: u64,
    /// Consecutive overload detections.
    pub times: u32,
}

impl WorkerRow {
    fn new(max_nb: u64) -> Self {
        WorkerRow {
            live: true,
            cur_slot: None,
            pkt_nb: 0,
            last_nb: 0,
            max_nb,
            times: 0,
        }
    }

    /// Rolls the row into `slot` (see the module docs).
    fn roll(&mut self, slot: u64) {
        if self.cur_slot != Some(slot) {
            self.last_nb = if is_prev(self.cur_slot, slot) {
                self.pkt_nb
            } else {
                0
            };
            self.cur_slot = Some(slot);
            self.pkt_nb = 0;
        }
    }

    /// This row as the scheduler would see it in `slot` (rolled into it).
    pub fn rolled(&self, slot: u64) -> WorkerRow {
        let mut r = *self;
        r.roll(slot);
        r
    }
}

/// `prev(x)`: the row's current slot is the one just before `slot`.
fn is_prev(cur: Option<u64>, slot: u64) -> bool {
    match (cur, slot.checked_sub(1)) {
        (Some(c), Some(p)) => c == p,
        _ => false,
    }
}

/// A worker overloaded for more than `threshold` consecutive detections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OverloadReport {
    /// The overloaded worker.
    pub worker: WorkerId,
    /// The slot in which it was detected.
    pub slot: u64,
}

/// What the scheduler decided for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedOutcome {
    /// Send the packet to `worker`.
    Pass {
        /// The worker that gets the packet.
        worker: WorkerId,
        /// `Some(old)` when this packet moved its tenant from `old` to `worker`.
        migrated_from: Option<WorkerId>,
        /// An overload report raised by this packet.
        overload: Option<OverloadReport>,
    },
    /// Dropped: the tenant exceeded its `max_nb` in this slot.
    Policed,
    /// Dropped: the tenant's worker is not live and no live worker exists.
    NoLiveWorker,
    /// Dropped: no tenant occupies this slot. Nothing was counted.
    UnknownTenant,
}

impl SchedOutcome {
    /// The worker, for a pass.
    pub fn worker(self) -> Option<WorkerId> {
        match self {
            SchedOutcome::Pass { worker, .. } => Some(worker),
            _ => None,
        }
    }
}

/// Why a worker operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// No worker has this id.
    #[error("unknown {0}")]
    UnknownWorker(WorkerId),
    /// All 65 536 worker ids are taken.
    #[error("too many workers (ids are 16-bit)")]
    TooManyWorkers,
}

/// Why a tenant-table operation failed. On error nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// The slot is already occupied.
    #[error("{0} is already occupied")]
    DuplicateSlot(TenantSlot),
    /// No tenant occupies the slot.
    #[error("no tenant in {0}")]
    UnknownTenant(TenantSlot),
    /// The slot index is at or beyond [`MAX_TENANT_SLOTS`].
    #[error("{0} is out of range (at most {MAX_TENANT_SLOTS} slots)")]
    SlotOutOfRange(TenantSlot),
    /// No worker has this id.
    #[error("unknown {0}")]
    UnknownWorker(WorkerId),
    /// The worker exists but is not live.
    #[error("{0} is not live")]
    WorkerNotLive(WorkerId),
    /// No worker is live, so the tenant cannot be placed.
    #[error("no live worker")]
    NoLiveWorker,
}

/// The Tenant Table, the Worker Table and the per-packet scheduling step.
#[derive(Clone, Debug, Default)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    tenants: Vec<Option<TenantRow>>,
    workers: Vec<WorkerRow>,
    /// Tenants assigned to each worker (for spread placement).
    load: Vec<u32>,
    n_tenants: usize,
}

impl Scheduler {
    /// An empty scheduler: no workers, no tenants.
    pub fn new(cfg: SchedulerConfig) -> Self {
        Scheduler {
            cfg,
            ..Scheduler::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> SchedulerConfig {
        self.cfg
    }

    /// The timeslot of a timestamp: `ts_ns >> shift` (0 when `shift >= 64`).
    pub fn slot_of(&self, ts_ns: u64) -> u64 {
        ts_ns.checked_shr(self.cfg.shift).unwrap_or(0)
    }

    /// Adds a live worker with capacity `max_nb` packets per slot (taken literally: 0
    /// means always overloaded). Tenants stranded on dead workers (possible only while no
    /// worker was live) are adopted by it.
    ///
    /// # Panics
    /// When 65 536 workers already exist; [`Scheduler::try_add_worker`] returns an error
    /// instead.
    pub fn add_worker(&mut self, max_nb: u64) -> WorkerId {
        match self.try_add_worker(max_nb) {
            Ok(w) => w,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`Scheduler::add_worker`], failing instead of panicking when ids run out.
    pub fn try_add_worker(&mut self, max_nb: u64) -> Result<WorkerId, WorkerError> {
        let id = u16::try_from(self.workers.len()).map_err(|_| WorkerError::TooManyWorkers)?;
        self.workers.push(WorkerRow::new(max_nb));
        self.load.push(0);
        self.adopt_orphans();
        Ok(WorkerId(id))
    }

    /// Number of workers ever added (live or not).
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Number of live workers.
    pub fn live_workers(&self) -> usize {
        self.workers.iter().filter(|w| w.live).count()
    }

    /// Changes a worker's capacity.
    pub fn set_worker_max(&mut self, w: WorkerId, max_nb: u64) -> Result<(), WorkerError> {
        self.workers
            .get_mut(w.index())
            .ok_or(WorkerError::UnknownWorker(w))?
            .max_nb = max_nb;
        Ok(())
    }

    /// Marks a worker live or not. Setting it not live moves its tenants to live workers
    /// (as [`Scheduler::terminate_worker`]); setting it live adopts stranded tenants.
    /// Returns the moves made, `(tenant, new worker)`, in slot order.
    pub fn set_worker_live(
        &mut self,
        w: WorkerId,
        live: bool,
    ) -> Result<Vec<(TenantSlot, WorkerId)>, WorkerError> {
        let row = self
            .workers
            .get_mut(w.index())
            .ok_or(WorkerError::UnknownWorker(w))?;
        row.live = live;
        if live {
            Ok(self.adopt_orphans())
        } else {
            Ok(self.evacuate(w))
        }
    }

    /// Stops a worker: it is no longer live, and each of its tenants (in slot order) moves
    /// to the live worker with the fewest tenants (ties: lowest id). Returns the moves.
    /// With no live worker left the tenants stay (their packets are dropped as
    /// [`SchedOutcome::NoLiveWorker`]) until a worker becomes live. An unknown id does
    /// nothing and returns no moves.
    pub fn terminate_worker(&mut self, w: WorkerId) -> Vec<(TenantSlot, WorkerId)> {
        self.set_worker_live(w, false).unwrap_or_default()
    }

    fn evacuate(&mut self, w: WorkerId) -> Vec<(TenantSlot, WorkerId)> {
        let mut moves = Vec::new();
        for i in 0..self.tenants.len() {
            let Some(row) = self.tenants[i] else { continue };
            if row.worker != w {
                continue;
            }
            let Some(to) = self.spread_choice() else {
                break;
            };
            self.move_tenant(i, to);
            moves.push((TenantSlot(i as u32), to));
        }
        moves
    }

    fn adopt_orphans(&mut self) -> Vec<(TenantSlot, WorkerId)> {
        let mut moves = Vec::new();
        for i in 0..self.tenants.len() {
            let Some(row) = self.tenants[i] else { continue };
            if self.workers[row.worker.index()].live {
                continue;
            }
            let Some(to) = self.spread_choice() else {
                break;
            };
            self.move_tenant(i, to);
            moves.push((TenantSlot(i as u32), to));
        }
        moves
    }

    fn move_tenant(&mut self, i: usize, to: WorkerId) {
        if let Some(row) = self.tenants[i].as_mut() {
            self.load[row.worker.index()] -= 1;
            self.load[to.index()] += 1;
            row.worker = to;
        }
    }

    /// The live worker with the fewest tenants (ties: lowest id): where a new tenant goes
    /// under spread placement. `None` when no worker is live.
    pub fn spread_choice(&self) -> Option<WorkerId> {
        self.workers
            .iter()
            .zip(&self.load)
            .enumerate()
            .filter(|(_, (w, _))| w.live)
            .min_by_key(|&(i, (_, &n))| (n, i))
            .map(|(i, _)| WorkerId(i as u16))
    }

    /// Admits a tenant on `worker` with `max_nb` packets per slot (0: unlimited). Its
    /// counters start at 0 with no current slot.
    pub fn add_tenant(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TenantError> {
        self.check_new_slot(slot)?;
        self.check_live(worker)?;
        let i = slot.index();
        if self.tenants.len() <= i {
            self.tenants.resize(i + 1, None);
        }
        self.tenants[i] = Some(TenantRow {
            worker,
            cur_slot: None,
            pkt_nb: 0,
            max_nb,
        });
        self.load[worker.index()] += 1;
        self.n_tenants += 1;
        Ok(())
    }

    /// Checks that `slot` could be admitted (free and in range) without changing anything.
    pub fn check_new_slot(&self, slot: TenantSlot) -> Result<(), TenantError> {
        if slot.0 >= MAX_TENANT_SLOTS {
            return Err(TenantError::SlotOutOfRange(slot));
        }
        if self.tenant(slot).is_some() {
            return Err(TenantError::DuplicateSlot(slot));
        }
        Ok(())
    }

    /// Checks that `w` exists and is live.
    pub fn check_live(&self, w: WorkerId) -> Result<(), TenantError> {
        match self.workers.get(w.index()) {
            None => Err(TenantError::UnknownWorker(w)),
            Some(row) if !row.live => Err(TenantError::WorkerNotLive(w)),
            Some(_) => Ok(()),
        }
    }

    /// Removes a tenant, returning its last row.
    pub fn remove_tenant(&mut self, slot: TenantSlot) -> Result<TenantRow, TenantError> {
        let row = self
            .tenants
            .get_mut(slot.index())
            .and_then(Option::take)
            .ok_or(TenantError::UnknownTenant(slot))?;
        self.load[row.worker.index()] -= 1;
        self.n_tenants -= 1;
        Ok(row)
    }

    /// Moves a tenant to a live worker (a planner's decision, applied between packets).
    /// Counters are kept: the tenant's next packet in a new slot is scheduled from there.
    pub fn assign(&mut self, slot: TenantSlot, worker: WorkerId) -> Result<(), TenantError> {
        if self.tenant(slot).is_none() {
            return Err(TenantError::UnknownTenant(slot));
        }
        self.check_live(worker)?;
        self.move_tenant(slot.index(), worker);
        Ok(())
    }

    /// Changes a tenant's per-slot budget (0: unlimited).
    pub fn set_tenant_max(&mut self, slot: TenantSlot, max_nb: u64) -> Result<(), TenantError> {
        self.tenants
            .get_mut(slot.index())
            .and_then(Option::as_mut)
            .ok_or(TenantError::UnknownTenant(slot))?
            .max_nb = max_nb;
        Ok(())
    }

    /// A tenant's row.
    pub fn tenant(&self, slot: TenantSlot) -> Option<&TenantRow> {
        self.tenants.get(slot.index())?.as_ref()
    }

    /// A worker's row, as last written (rolled lazily; see [`WorkerRow::rolled`]).
    pub fn worker(&self, w: WorkerId) -> Option<&WorkerRow> {
        self.workers.get(w.index())
    }

    /// All workers with their ids.
    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &WorkerRow)> + '_ {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| (WorkerId(i as u16), w))
    }

    /// All tenants with their slots, in slot order.
    pub fn tenants(&self) -> impl Iterator<Item = (TenantSlot, &TenantRow)> + '_ {
        self.tenants
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((TenantSlot(i as u32), t.as_ref()?)))
    }

    /// The tenants assigned to `w`, in slot order.
    pub fn tenants_of(&self, w: WorkerId) -> impl Iterator<Item = TenantSlot> + '_ {
        self.tenants()
            .filter(move |(_, t)| t.worker == w)
            .map(|(s, _)| s)
    }

    /// Number of tenants assigned to `w` (0 for an unknown worker).
    pub fn tenant_count(&self, w: WorkerId) -> usize {
        self.load.get(w.index()).map_or(0, |&n| n as usize)
    }

    /// Number of admitted tenants.
    pub fn len(&self) -> usize {
        self.n_tenants
    }

    /// True when no tenant is admitted.
    pub fn is_empty(&self) -> bool {
        self.n_tenants == 0
    }

    /// One scheduling step for a packet of tenant `slot` arriving at `ts_ns` (see the
    /// module docs). Never allocates, never panics.
    pub fn schedule(&mut self, ts_ns: u64, slot: TenantSlot) -> SchedOutcome {
        let s = self.slot_of(ts_ns);
        let threshold = self.cfg.threshold;
        let Some(Some(t)) = self.tenants.get_mut(slot.index()) else {
            return SchedOutcome::UnknownTenant;
        };
        let workers = &mut self.workers;
        let wid = t.worker.index();
        if !workers[wid].live {
            // Only when no worker is live: dead workers hand their tenants over.
            return SchedOutcome::NoLiveWorker;
        }
        let mut chosen = wid;
        let mut migrated_from = None;
        let mut overload = None;
        if t.cur_slot == Some(s) {
            // Step 2: same slot.
            t.pkt_nb = t.pkt_nb.saturating_add(1);
            if t.max_nb != 0 && t.pkt_nb > t.max_nb {
                return SchedOutcome::Policed;
            }
        } else {
            // Step 3: the tenant's first packet in this slot.
            let tmp = if is_prev(t.cur_slot, s) { t.pkt_nb } else { 0 };
            t.cur_slot = Some(s);
            t.pkt_nb = 1;
            workers[wid].roll(s);
            if workers[wid].last_nb < workers[wid].max_nb {
                workers[wid].times = 0;
            } else {
                for w in workers.iter_mut() {
                    w.roll(s);
                }
                // `wid` is live, so a candidate exists.
                let mig = workers
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| w.live)
                    .min_by_key(|&(i, w)| (w.last_nb, i))
                    .map_or(wid, |(i, _)| i);
                if mig != wid && workers[mig].last_nb.saturating_add(tmp) < workers[mig].max_nb {
                    t.worker = WorkerId(mig as u16);
                    workers[wid].last_nb = workers[wid].last_nb.saturating_sub(tmp);
                    workers[mig].last_nb += tmp;
                    self.load[wid] -= 1;
                    self.load[mig] += 1;
                    chosen = mig;
                    migrated_from = Some(WorkerId(wid as u16));
                }
                let old = &mut workers[wid];
                old.times = old.times.saturating_add(1);
                if old.times > threshold {
                    overload = Some(OverloadReport {
                        worker: WorkerId(wid as u16),
                        slot: s,
                    });
                }
            }
        }
        // Step 4.
        let w = &mut workers[chosen];
        w.roll(s);
        w.pkt_nb = w.pkt_nb.saturating_add(1);
        SchedOutcome::Pass {
            worker: WorkerId(chosen as u16),
            migrated_from,
            overload,
        }
    }
}
