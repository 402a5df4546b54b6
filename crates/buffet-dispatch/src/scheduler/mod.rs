//! Load Monitor + Tenant Assigner: the timeslot scheduler (the Buffet paper's
//! Algorithm 1, exactly as docs/scheduler.md specifies it).
//!
//! Two roles of the paper, two modules: the [Load Monitor](load_monitor) (the paper's
//! two tables of Fig. 4: [`TenantRow`]s indexed by [`TenantSlot`] and the Worker Table
//! of [`WorkerRow`]s indexed by [`WorkerId`]) and the [Tenant Assigner](tenant_assigner)
//! (where a tenant goes). The [`Scheduler`] owns the tables; [`Scheduler::schedule`]
//! runs one step per packet, given the packet's timestamp and its (already classified)
//! tenant.
//!
//! Two kinds of "slot" meet here and are never mixed up: a **timeslot** is a span of
//! packet time, numbered `ts_ns >> shift` ([`Scheduler::timeslot_of`]); the `cur_slot`
//! fields and [`OverloadReport::slot`] are timeslots. A **tenant slot** ([`TenantSlot`])
//! is a tenant's row index in the Tenant Table. In the steps below `slot` is the
//! packet's timeslot:
//!
//! 1. `slot = ts_ns >> shift`; `wid = T[tid].worker`. `prev(x)` means
//!    `x.cur_slot == Some(slot - 1)` (timeslot 0 has no previous timeslot).
//! 2. Same timeslot as the tenant's current one: `T.pkt_nb += 1`; if `T.max_nb != 0 &&
//!    T.pkt_nb > T.max_nb` the packet is **policed** (dropped; the worker is not charged).
//! 3. Otherwise (the tenant's first packet in this timeslot): `tmp = prev(T) ? T.pkt_nb :
//!    0` (policed packets included); `T.cur_slot = slot; T.pkt_nb = 1`; roll `W[wid]`
//!    into the timeslot. If `W[wid].last_nb < W[wid].max_nb` then `W[wid].times = 0`;
//!    else roll every worker, let `mig` be the live worker with the lowest `last_nb`
//!    (ties: lowest id); if `mig != wid && W[mig].last_nb + tmp < W[mig].max_nb` move the
//!    tenant to `mig` (`W[wid].last_nb -= tmp` saturating, `W[mig].last_nb += tmp`) and
//!    send this packet there. Either way `W[wid].times += 1`, and `times > threshold`
//!    yields an [`OverloadReport`] `(wid, slot)`.
//! 4. Roll the chosen worker into the timeslot, `W[w].pkt_nb += 1`, **pass** to it.
//!
//! "Rolling" worker `w` into timeslot `slot`: if `w.cur_slot != Some(slot)` then
//! `w.last_nb = prev(w) ? w.pkt_nb : 0; w.cur_slot = Some(slot); w.pkt_nb = 0`. Workers
//! are rolled lazily, so a row read through [`Scheduler::worker`] may still describe an
//! older timeslot; [`WorkerRow::rolled`] shows it as of a given timeslot.
//!
//! Literal consequences, kept on purpose because the C core, the XDP program and the
//! Micro-C plugin must agree bit for bit:
//! * `times` counts overload *detections* (one per tenant's first packet in a timeslot on
//!   an overloaded worker), not overloaded timeslots, and is reset by the first
//!   non-overloaded detection.
//! * A worker `max_nb` of 0 means "always overloaded" (`last_nb < 0` never holds). Callers
//!   validate worker capacities (> 0); a tenant `max_nb` of 0 means unlimited.
//! * A timestamp whose timeslot differs from the tenant's current one, even an *older*
//!   one, starts a new timeslot for that tenant (the spec only tests equality).
//! * A `shift` of 64 or more maps every timestamp to timeslot 0.
//!
//! Beyond the spec (control plane, never on the packet path): only live workers are
//! candidates; a worker that stops being live hands its tenants to the live workers
//! ([`Scheduler::terminate_worker`]); tenants stranded when no worker was live are
//! adopted when one comes back. A dead worker never receives a [`SchedOutcome::Pass`].
//!
//! Also beyond the spec, and off by default: with [`Planner::Ours`]
//! ([`Scheduler::set_planner`]) the first packet of every new timeslot first runs the
//! [`planner`] over the previous timeslot's tenant counts (`tmp` of every tenant)
//! and applies its moves (tenant rows, and each worker's `last_nb` adjusted as step 3
//! adjusts it); step 3 then still detects overload and reports it, but never migrates.
//! The moves are kept for the caller ([`Scheduler::take_planned`]). The C core, the XDP
//! program and the Micro-C plugin implement [`Planner::Greedy`] only.

pub mod load_monitor;
pub mod planner;
pub mod tenant_assigner;

use crate::{TenantSlot, WorkerId};
use load_monitor::is_prev;
pub use load_monitor::{OverloadReport, TenantRow, WorkerRow};
pub use planner::Planner;

/// Largest number of tenant slots a scheduler accepts (tenant slots are dense indices into
/// `Vec`s; this guards against a stray huge index allocating gigabytes).
pub const MAX_TENANT_SLOTS: u32 = 1 << 24;

/// Scheduler parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Timeslot of a timestamp: `ts_ns >> shift`. The default, 30, gives timeslots of
    /// ≈1.07 s.
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
    /// Dropped: the tenant exceeded its `max_nb` in this timeslot.
    Policed,
    /// Dropped: the tenant's worker is not live and no live worker exists.
    NoLiveWorker,
    /// Dropped: no tenant occupies this tenant slot. Nothing was counted.
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
    /// The tenant slot is already occupied.
    #[error("{0} is already occupied")]
    DuplicateSlot(TenantSlot),
    /// No tenant occupies the tenant slot.
    #[error("no tenant in {0}")]
    UnknownTenant(TenantSlot),
    /// The tenant slot is at or beyond [`MAX_TENANT_SLOTS`].
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

/// The Load Monitor's tables (tenant rows and the Worker Table) and the per-packet
/// scheduling step that counts into them and applies the Tenant Assigner's choices.
#[derive(Clone, Debug, Default)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    tenants: Vec<Option<TenantRow>>,
    workers: Vec<WorkerRow>,
    /// Tenants assigned to each worker (for spread placement).
    load: Vec<u32>,
    n_tenants: usize,
    planner: Planner,
    /// The timeslot the planner last ran for.
    planned_slot: Option<u64>,
    /// Moves the planner made and the caller has not taken: `(tenant, from, to)`.
    planned: Vec<(TenantSlot, WorkerId, WorkerId)>,
    /// Scratch for the planner, kept to avoid allocating per timeslot.
    scratch: PlanScratch,
}

#[derive(Clone, Debug, Default)]
struct PlanScratch {
    slots: Vec<TenantSlot>,
    loads: Vec<u64>,
    worker_of: Vec<u16>,
    capacity: Vec<u64>,
    live: Vec<bool>,
    moves: Vec<planner::Move>,
}

/// A [`Scheduler::schedule_burst`] result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BurstOutcome {
    /// The first packet's outcome (for a pass: its worker, a migration, a report).
    pub first: SchedOutcome,
    /// Packets passed (to the first packet's worker).
    pub passed: u64,
    /// Packets policed.
    pub policed: u64,
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
    pub fn timeslot_of(&self, ts_ns: u64) -> u64 {
        ts_ns.checked_shr(self.cfg.shift).unwrap_or(0)
    }

    /// Adds a live worker with capacity `max_nb` packets per timeslot (taken literally: 0
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
    /// Returns the moves made, `(tenant, new worker)`, in tenant-slot order.
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

    /// Stops a worker: it is no longer live, and each of its tenants (in tenant-slot order)
    /// moves
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
    /// under spread placement ([`tenant_assigner::spread_choice`]). `None` when no worker
    /// is live.
    pub fn spread_choice(&self) -> Option<WorkerId> {
        tenant_assigner::spread_choice(&self.workers, &self.load)
    }

    /// Admits a tenant in tenant slot `tenant`, on `worker`, with `max_nb` packets per
    /// timeslot (0: unlimited). Its counters start at 0 with no current timeslot.
    pub fn add_tenant(
        &mut self,
        tenant: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TenantError> {
        self.check_new_slot(tenant)?;
        self.check_live(worker)?;
        let i = tenant.index();
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

    /// Checks that tenant slot `tenant` could be admitted (free and in range) without
    /// changing anything.
    pub fn check_new_slot(&self, tenant: TenantSlot) -> Result<(), TenantError> {
        if tenant.0 >= MAX_TENANT_SLOTS {
            return Err(TenantError::SlotOutOfRange(tenant));
        }
        if self.tenant(tenant).is_some() {
            return Err(TenantError::DuplicateSlot(tenant));
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

    /// Removes the tenant in tenant slot `tenant`, returning its last row.
    pub fn remove_tenant(&mut self, tenant: TenantSlot) -> Result<TenantRow, TenantError> {
        let row = self
            .tenants
            .get_mut(tenant.index())
            .and_then(Option::take)
            .ok_or(TenantError::UnknownTenant(tenant))?;
        self.load[row.worker.index()] -= 1;
        self.n_tenants -= 1;
        Ok(row)
    }

    /// Moves a tenant to a live worker (a planner's decision, applied between packets).
    /// Counters are kept: the tenant's next packet in a new timeslot is scheduled from
    /// there.
    pub fn assign(&mut self, tenant: TenantSlot, worker: WorkerId) -> Result<(), TenantError> {
        if self.tenant(tenant).is_none() {
            return Err(TenantError::UnknownTenant(tenant));
        }
        self.check_live(worker)?;
        self.move_tenant(tenant.index(), worker);
        Ok(())
    }

    /// Changes a tenant's per-timeslot budget (0: unlimited).
    pub fn set_tenant_max(&mut self, tenant: TenantSlot, max_nb: u64) -> Result<(), TenantError> {
        self.tenants
            .get_mut(tenant.index())
            .and_then(Option::as_mut)
            .ok_or(TenantError::UnknownTenant(tenant))?
            .max_nb = max_nb;
        Ok(())
    }

    /// The row of the tenant in tenant slot `tenant`.
    pub fn tenant(&self, tenant: TenantSlot) -> Option<&TenantRow> {
        self.tenants.get(tenant.index())?.as_ref()
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

    /// All tenants with their tenant slots, in tenant-slot order.
    pub fn tenants(&self) -> impl Iterator<Item = (TenantSlot, &TenantRow)> + '_ {
        self.tenants
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((TenantSlot(i as u32), t.as_ref()?)))
    }

    /// The tenants assigned to `w`, in tenant-slot order.
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

    /// Selects the planner (see the module docs). [`Planner::Greedy`] by default.
    pub fn set_planner(&mut self, planner: Planner) {
        self.planner = planner;
        self.planned_slot = None;
    }

    /// The planner in use.
    pub fn planner(&self) -> Planner {
        self.planner
    }

    /// Takes the moves [`Planner::Ours`] made since the last call, `(tenant, from, to)`,
    /// in the order made. Empty with [`Planner::Greedy`].
    pub fn take_planned(&mut self) -> impl Iterator<Item = (TenantSlot, WorkerId, WorkerId)> + '_ {
        self.planned.drain(..)
    }

    /// Whether planned moves are waiting for [`Scheduler::take_planned`].
    pub fn has_planned(&self) -> bool {
        !self.planned.is_empty()
    }

    /// Runs the planner for timeslot `s` from the previous timeslot's counters and applies
    /// its moves. Once per timeslot; allocates only while its scratch grows.
    fn replan(&mut self, s: u64) {
        self.planned_slot = Some(s);
        for w in self.workers.iter_mut() {
            w.roll(s);
        }
        let sc = &mut self.scratch;
        sc.slots.clear();
        sc.loads.clear();
        sc.worker_of.clear();
        for (i, t) in self.tenants.iter().enumerate() {
            let Some(t) = t else { continue };
            sc.slots.push(TenantSlot(i as u32));
            sc.loads
                .push(if is_prev(t.cur_slot, s) { t.pkt_nb } else { 0 });
            sc.worker_of.push(t.worker.0);
        }
        sc.capacity.clear();
        sc.capacity.extend(self.workers.iter().map(|w| w.max_nb));
        sc.live.clear();
        sc.live.extend(self.workers.iter().map(|w| w.live));
        let problem = planner::PlanProblem {
            loads: &sc.loads,
            worker_of: &sc.worker_of,
            capacity: &sc.capacity,
            live: &sc.live,
        };
        planner::plan_ours(&problem, &mut sc.moves);
        for m in &sc.moves {
            let slot = sc.slots[m.tenant as usize];
            let tmp = sc.loads[m.tenant as usize];
            let from = WorkerId(sc.worker_of[m.tenant as usize]);
            let to = WorkerId(m.to);
            let i = slot.index();
            if let Some(row) = self.tenants[i].as_mut() {
                self.load[row.worker.index()] -= 1;
                self.load[to.index()] += 1;
                row.worker = to;
            }
            let wf = &mut self.workers[from.index()];
            wf.last_nb = wf.last_nb.saturating_sub(tmp);
            self.workers[to.index()].last_nb += tmp;
            self.planned.push((slot, from, to));
        }
    }

    /// [`Scheduler::schedule`] for `n` packets of one tenant arriving at the same `ts_ns`,
    /// exactly as `n` consecutive calls would decide (all but the first packet are in the
    /// tenant's current timeslot, so they only count, and are policed past `max_nb`).
    /// `n = 0` changes nothing and reports `first` as [`SchedOutcome::UnknownTenant`]
    /// with nothing passed or policed.
    pub fn schedule_burst(&mut self, ts_ns: u64, tenant: TenantSlot, n: u64) -> BurstOutcome {
        if n == 0 {
            return BurstOutcome {
                first: SchedOutcome::UnknownTenant,
                passed: 0,
                policed: 0,
            };
        }
        let first = self.schedule(ts_ns, tenant);
        let (mut passed, mut policed) = match first {
            SchedOutcome::Pass { .. } => (1, 0),
            SchedOutcome::Policed => (0, 1),
            SchedOutcome::NoLiveWorker | SchedOutcome::UnknownTenant => {
                return BurstOutcome {
                    first,
                    passed: 0,
                    policed: 0,
                }
            }
        };
        let rest = n - 1;
        if rest > 0 {
            let t = self.tenants[tenant.index()]
                .as_mut()
                .expect("scheduled tenant exists");
            let before = t.pkt_nb;
            t.pkt_nb = t.pkt_nb.saturating_add(rest);
            let ok = if t.max_nb == 0 {
                rest
            } else {
                // Packets numbered before+1 ..= before+rest pass while <= max_nb.
                t.max_nb.saturating_sub(before).min(rest)
            };
            policed += rest - ok;
            passed += ok;
            let w = &mut self.workers[t.worker.index()];
            w.pkt_nb = w.pkt_nb.saturating_add(ok);
        }
        BurstOutcome {
            first,
            passed,
            policed,
        }
    }

    /// One scheduling step for a packet of the tenant in tenant slot `tenant`, arriving
    /// at `ts_ns` (see the module docs). Never allocates (except when [`Planner::Ours`]
    /// plans a new timeslot), never panics.
    pub fn schedule(&mut self, ts_ns: u64, tenant: TenantSlot) -> SchedOutcome {
        // The packet's timeslot (`slot` in the module docs).
        let s = self.timeslot_of(ts_ns);
        let threshold = self.cfg.threshold;
        if self.planner == Planner::Ours
            && self.planned_slot != Some(s)
            && matches!(self.tenants.get(tenant.index()), Some(Some(_)))
        {
            self.replan(s);
        }
        let migrate = self.planner == Planner::Greedy;
        let Some(Some(t)) = self.tenants.get_mut(tenant.index()) else {
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
            // Step 2: same timeslot.
            t.pkt_nb = t.pkt_nb.saturating_add(1);
            if t.max_nb != 0 && t.pkt_nb > t.max_nb {
                return SchedOutcome::Policed;
            }
        } else {
            // Step 3: the tenant's first packet in this timeslot.
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
                let mig = tenant_assigner::migration_candidate(workers).unwrap_or(wid);
                if migrate && mig != wid && tenant_assigner::fits(&workers[mig], tmp) {
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

#[cfg(test)]
mod tests {
    //! Hand-computed vectors. `shift = 0` throughout (so `ts == timeslot`) unless a test says
    //! otherwise; each table row is `(ts, tenant) -> expected`, where `P(w)` is a pass to
    //! worker `w` and `D` a policing drop. Comments derive every number.
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Exp {
        P(u16),
        D,
    }
    use Exp::{D, P};

    fn sched(threshold: u32) -> Scheduler {
        Scheduler::new(SchedulerConfig {
            shift: 0,
            threshold,
        })
    }

    /// Runs a table; returns the outcomes for closer inspection.
    fn run(s: &mut Scheduler, steps: &[(u64, u32, Exp)]) -> Vec<SchedOutcome> {
        steps
            .iter()
            .enumerate()
            .map(|(i, &(ts, t, want))| {
                let out = s.schedule(ts, TenantSlot(t));
                let got = match out {
                    SchedOutcome::Pass { worker, .. } => P(worker.0),
                    SchedOutcome::Policed => D,
                    other => panic!("step {i} ({ts}, {t}): unexpected {other:?}"),
                };
                assert_eq!(got, want, "step {i}: ({ts}, {t})");
                out
            })
            .collect()
    }

    fn w(s: &Scheduler, id: u16) -> WorkerRow {
        *s.worker(WorkerId(id)).unwrap()
    }

    fn t(s: &Scheduler, tenant: u32) -> TenantRow {
        *s.tenant(TenantSlot(tenant)).unwrap()
    }

    #[test]
    fn same_timeslot_and_policing() {
        let mut s = sched(3);
        let w0 = s.add_worker(100);
        s.add_tenant(TenantSlot(0), w0, 2).unwrap(); // A, budget 2
        s.add_tenant(TenantSlot(1), w0, 0).unwrap(); // B, unlimited
        run(
            &mut s,
            &[
                // A's first packet: no current timeslot, tmp = 0; w0 rolled from None:
                // last_nb = 0 < 100 -> times = 0; w0.pkt_nb = 1.
                (5, 0, P(0)),
                // Same timeslot: A.pkt_nb = 2 <= 2 -> pass; w0.pkt_nb = 2.
                (5, 0, P(0)),
                // A.pkt_nb = 3 > 2 -> policed; w0 not charged (stays 2).
                (5, 0, D),
                // A.pkt_nb = 4 > 2 -> policed.
                (5, 0, D),
            ],
        );
        assert_eq!(t(&s, 0).pkt_nb, 4, "policed packets are counted");
        assert_eq!(w(&s, 0).pkt_nb, 2, "the worker is not charged");
        // B: max_nb 0 is unlimited.
        for _ in 0..1000 {
            run(&mut s, &[(5, 1, P(0))]);
        }
        assert_eq!(w(&s, 0).pkt_nb, 1002);
        run(
            &mut s,
            &[
                // Timeslot 6: A's first packet; prev(A) (cur 5 = 6-1). w0 rolled: prev, so
                // last_nb = 1002 >= 100 -> overload branch; only worker, mig = w0 = wid, no
                // migration; times = 1.
                (6, 0, P(0)),
            ],
        );
        assert_eq!(t(&s, 0).pkt_nb, 1);
        assert_eq!(t(&s, 0).cur_slot, Some(6));
        assert_eq!(w(&s, 0).last_nb, 1002);
        assert_eq!(w(&s, 0).pkt_nb, 1);
        assert_eq!(w(&s, 0).times, 1);
    }

    #[test]
    fn migration_moves_tmp_including_policed_packets() {
        let mut s = sched(3);
        let w0 = s.add_worker(3);
        s.add_worker(10);
        s.add_tenant(TenantSlot(0), w0, 2).unwrap(); // A, budget 2
        s.add_tenant(TenantSlot(1), w0, 0).unwrap(); // B, unlimited
        let out = run(
            &mut s,
            &[
                // Timeslot 1. A new: w0 rolled from None, last 0 < 3, times 0; w0.pkt 1.
                (1, 0, P(0)),
                (1, 0, P(0)), // A.pkt 2, w0.pkt 2
                (1, 0, D),    // A.pkt 3 > 2
                (1, 0, D),    // A.pkt 4 > 2
                (1, 1, P(0)), // B new (tmp 0); w0 already in timeslot 1, last 0 < 3; w0.pkt 3
                (1, 1, P(0)), // w0.pkt 4
                // Timeslot 2. A new: prev(A) -> tmp = 4 (2 passed + 2 policed). w0 rolled:
                // last = 4 >= 3 -> overload. Roll all: w1 from None -> last 0.
                // mig = w1 (0 < 4); 0 + 4 < 10 -> migrate: w0.last = 4 - 4 = 0,
                // w1.last = 0 + 4 = 4. w0.times = 1 (not > 3). Packet goes to w1.
                (2, 0, P(1)),
                // B new: tmp = 2; w0.last is now 0 < 3 -> times = 0; stays on w0.
                // (Without the LAST_NB adjustment B would have seen an overload too.)
                (2, 1, P(0)),
            ],
        );
        assert_eq!(
            out[6],
            SchedOutcome::Pass {
                worker: WorkerId(1),
                migrated_from: Some(WorkerId(0)),
                overload: None
            }
        );
        assert_eq!(w(&s, 1).last_nb, 4, "tmp counts the policed packets");
        assert_eq!(w(&s, 0).last_nb, 0);
        assert_eq!(w(&s, 0).times, 0, "reset by B's non-overloaded detection");
        assert_eq!((w(&s, 0).pkt_nb, w(&s, 1).pkt_nb), (1, 1));
        assert_eq!(t(&s, 0).worker, WorkerId(1));
        assert_eq!(s.tenant_count(WorkerId(0)), 1);
        assert_eq!(s.tenant_count(WorkerId(1)), 1);
        assert_eq!(
            s.tenants_of(WorkerId(1)).collect::<Vec<_>>(),
            [TenantSlot(0)]
        );
    }

    #[test]
    fn migration_saturates_last_nb_at_zero() {
        let mut s = sched(3);
        let w0 = s.add_worker(1);
        s.add_worker(10);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap();
        s.add_tenant(TenantSlot(1), w0, 0).unwrap();
        run(
            &mut s,
            &[
                // Timeslot 0: A 1 packet, B 1 packet: w0.pkt 2.
                (0, 0, P(0)),
                (0, 1, P(0)),
                // Timeslot 1: A: tmp 1; w0.last 2 >= 1 -> overload; w1.last 0 -> mig w1;
                // 0 + 1 < 10 -> move; w0.last = 1, w1.last = 1.
                (1, 0, P(1)),
                // B: tmp 1; w0.last 1 >= 1 -> overload; lowest last_nb: w0 1, w1 1 ->
                // tie -> w0 = wid -> no migration; w0.times = 2.
                (1, 1, P(0)),
            ],
        );
        assert_eq!((w(&s, 0).last_nb, w(&s, 1).last_nb), (1, 1));
        assert_eq!(w(&s, 0).times, 2);
        // Saturation: policed packets are in tmp but were never charged to the worker,
        // so tmp can exceed the old worker's last_nb.
        let mut s = sched(3);
        let w0 = s.add_worker(1);
        s.add_worker(100);
        s.add_tenant(TenantSlot(0), w0, 1).unwrap(); // budget 1
        let mut steps = vec![(0, 0, P(0))]; // timeslot 0: 1 pass (w0.pkt 1) ...
        steps.extend([(0, 0, D); 10]); // ... and 10 policed: A.pkt 11
                                       // Timeslot 1: tmp 11; w0.last 1 >= 1 -> overload; w1.last 0 -> mig w1;
                                       // 0 + 11 < 100 -> move; w0.last = 1 - 11 saturates to 0; w1.last = 11.
        steps.push((1, 0, P(1)));
        run(&mut s, &steps);
        assert_eq!((w(&s, 0).last_nb, w(&s, 1).last_nb), (0, 11));
        assert_eq!(w(&s, 0).times, 1);
    }

    #[test]
    fn worker_capacity_zero_is_always_overloaded() {
        let mut s = sched(3);
        let w0 = s.add_worker(0); // literal: `last_nb < 0` never holds
        s.add_worker(10);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap();
        s.add_tenant(TenantSlot(1), w0, 0).unwrap();
        run(
            &mut s,
            &[
                // Timeslot 0: A's first packet; w0.last 0 >= max 0 -> overload branch; roll
                // all: w1 last 0; lowest: tie (0, 0) -> w0 = wid -> no move; times 1.
                (0, 0, P(0)),
                (0, 0, P(0)), // w0.pkt 2
                // Timeslot 1: B (tmp 0, never seen): w0.last 2 >= 0 -> overload; w1.last 0
                // -> mig w1, 0 + 0 < 10 -> B moves, carrying tmp 0 (last_nb unchanged).
                (1, 1, P(1)),
                // A: tmp 2; w0.last 2 -> overload; lowest is w1 (0); 0 + 2 < 10 -> move;
                // w0.last = 2 - 2 = 0; w1.last = 2.
                (1, 0, P(1)),
            ],
        );
        assert_eq!((w(&s, 0).last_nb, w(&s, 1).last_nb), (0, 2));
        assert_eq!(w(&s, 0).times, 3);
    }

    #[test]
    fn overload_without_room_only_counts_times() {
        let mut s = sched(3);
        let w0 = s.add_worker(3);
        let w1 = s.add_worker(3);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap(); // A
        s.add_tenant(TenantSlot(1), w0, 0).unwrap(); // B
        s.add_tenant(TenantSlot(2), w1, 0).unwrap(); // C
        let out = run(
            &mut s,
            &[
                // Timeslot 0: w0 gets A 2 + B 2 = 4 packets, w1 gets C 3.
                (0, 0, P(0)),
                (0, 0, P(0)),
                (0, 1, P(0)),
                (0, 1, P(0)),
                (0, 2, P(1)),
                (0, 2, P(1)),
                (0, 2, P(1)),
                // Timeslot 1. A: tmp 2; w0.last 4 >= 3 -> overload; roll all: w1.last 3;
                // mig = w1 (3 < 4); 3 + 2 < 3 fails -> no migration; w0.times 1.
                (1, 0, P(0)),
                // B: tmp 2; w0.last still 4 -> overload again; same check fails;
                // w0.times 2 (times counts detections, not timeslots).
                (1, 1, P(0)),
                // C: tmp 3; w1.last 3 >= 3 -> overload; lowest last_nb: w0 4, w1 3 -> w1,
                // which is wid -> no migration; w1.times 1.
                (1, 2, P(1)),
            ],
        );
        assert!(out.iter().all(|o| matches!(
            o,
            SchedOutcome::Pass {
                migrated_from: None,
                overload: None,
                ..
            }
        )));
        assert_eq!((w(&s, 0).times, w(&s, 1).times), (2, 1));
        assert_eq!((w(&s, 0).last_nb, w(&s, 1).last_nb), (4, 3));
    }

    #[test]
    fn ties_go_to_the_lowest_id_and_dead_workers_are_never_chosen() {
        for kill_w0 in [false, true] {
            let mut s = sched(3);
            s.add_worker(10);
            s.add_worker(10);
            let w2 = s.add_worker(10);
            s.add_tenant(TenantSlot(0), w2, 0).unwrap(); // A
            s.add_tenant(TenantSlot(1), w2, 0).unwrap(); // B
            let mut steps = vec![(0, 0, P(2)); 6]; // A: 6 packets
            steps.extend([(0, 1, P(2)); 4]); // B: 4 packets -> w2.pkt 10
            run(&mut s, &steps);
            if kill_w0 {
                // w0 has no tenants: nothing moves, but it is out of the running.
                assert_eq!(s.terminate_worker(WorkerId(0)), []);
            }
            // Timeslot 1. A: tmp 6; w2.last 10 >= 10 -> overload; roll all: w0 and w1 were
            // never used -> last 0 each. Lowest last_nb: tie 0/0 -> lowest id, w0 —
            // or w1 when w0 is dead (a dead worker's 0 does not count). 0 + 6 < 10 ->
            // move; w2.last = 4, new.last = 6.
            let to = if kill_w0 { 1 } else { 0 };
            run(
                &mut s,
                &[
                    (1, 0, P(to)),
                    // B: tmp 4; w2.last 4 < 10 -> times 0; stays.
                    (1, 1, P(2)),
                ],
            );
            assert_eq!(w(&s, to).last_nb, 6);
            assert_eq!(w(&s, 2).last_nb, 4);
            assert_eq!(w(&s, 2).times, 0);
        }
    }

    #[test]
    fn report_when_times_exceeds_threshold_then_idle_resets() {
        let mut s = sched(3);
        let w0 = s.add_worker(1);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap();
        // Timeslot 0: first packet, w0 last 0 < 1 -> times 0; w0.pkt 2 after two packets.
        run(&mut s, &[(0, 0, P(0)), (0, 0, P(0))]);
        // Slots 1..=5, two packets each: each first packet sees w0.last = 2 >= 1 ->
        // overload, the only candidate is w0 itself -> times = 1, 2, 3, 4, 5. A report
        // while times > 3: timeslots 4 and 5.
        for slot in 1..=5u64 {
            let out = s.schedule(slot, TenantSlot(0));
            let want = (slot > 3).then_some(OverloadReport { worker: w0, slot });
            assert_eq!(
                out,
                SchedOutcome::Pass {
                    worker: w0,
                    migrated_from: None,
                    overload: want
                },
                "slot {slot}"
            );
            assert_eq!(w(&s, 0).times, slot as u32);
            run(&mut s, &[(slot, 0, P(0))]);
        }
        // Idle in timeslots 6 and 7. Timeslot 8: w0.cur_slot is 5, not 7 -> stale -> last 0 < 1
        // -> times = 0, no report. Tenant tmp also 0 (not prev).
        assert_eq!(w(&s, 0).rolled(8).last_nb, 0);
        assert_eq!(w(&s, 0).rolled(6).last_nb, 2);
        run(&mut s, &[(8, 0, P(0))]);
        assert_eq!(w(&s, 0).times, 0);
        assert_eq!(w(&s, 0).last_nb, 0);
        // Timeslot 9 after one packet in 8: last 1 >= max 1 (literal `<`) -> times 1.
        run(&mut s, &[(9, 0, P(0))]);
        assert_eq!(w(&s, 0).times, 1);
    }

    #[test]
    fn threshold_zero_reports_on_first_detection() {
        let mut s = sched(0);
        let w0 = s.add_worker(1);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap();
        run(&mut s, &[(0, 0, P(0))]);
        // Timeslot 1: last 1 >= 1 -> times 1 > 0 -> report (w0, 1).
        assert_eq!(
            s.schedule(1, TenantSlot(0)),
            SchedOutcome::Pass {
                worker: w0,
                migrated_from: None,
                overload: Some(OverloadReport {
                    worker: w0,
                    slot: 1
                })
            }
        );
    }

    #[test]
    fn idle_previous_timeslot_counts_zero() {
        let mut s = sched(3);
        let w0 = s.add_worker(5);
        s.add_worker(5);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap(); // A
        s.add_tenant(TenantSlot(1), w0, 0).unwrap(); // B
        let mut steps = vec![(0, 0, P(0)); 6]; // timeslot 0: A x6 -> w0.pkt 6
        steps.extend([
            // Timeslot 1. B's first packet ever: tmp 0. w0.last 6 >= 5 -> overload; w1
            // never used -> last 0 -> mig w1; 0 + 0 < 5 -> B moves, carrying tmp 0:
            // w0.last stays 6, w1.last stays 0. w0.times 1.
            (1, 1, P(1)),
            // A: tmp 6; w0.last 6 -> overload; mig w1 (0); 0 + 6 < 5 fails -> stays;
            // w0.times 2.
            (1, 0, P(0)),
            // A idle in timeslots 2 and 3. Timeslot 4: tmp 0 (cur 1 is not 3); w0.cur 1 is not 3
            // -> last 0 < 5 -> times 0.
            (4, 0, P(0)),
        ]);
        run(&mut s, &steps);
        assert_eq!(w(&s, 0).last_nb, 0);
        assert_eq!(w(&s, 0).times, 0);
        // w1 was last written in timeslot 1 (B's packet): as seen in timeslot 4 it is stale too.
        assert_eq!(w(&s, 1).cur_slot, Some(1));
        assert_eq!(w(&s, 1).rolled(2).last_nb, 1);
        assert_eq!(w(&s, 1).rolled(4).last_nb, 0);
    }

    #[test]
    fn timeslot_zero_has_no_previous_timeslot_and_time_may_go_backwards() {
        let mut s = sched(3);
        let w0 = s.add_worker(1);
        s.add_tenant(TenantSlot(0), w0, 0).unwrap();
        // Timeslot 0, first packet: nothing is prev; last 0 < 1.
        run(&mut s, &[(0, 0, P(0)), (0, 0, P(0))]);
        assert_eq!(w(&s, 0).times, 0);
        // Timeslot 3, then back to timeslot 2: the spec only tests equality, so timeslot 2 is a new
        // timeslot for the tenant and the worker, and 3 is not 2 - 1: stale, 0.
        run(&mut s, &[(3, 0, P(0)), (2, 0, P(0))]);
        assert_eq!(t(&s, 0).cur_slot, Some(2));
        assert_eq!(w(&s, 0).last_nb, 0);
        assert_eq!(w(&s, 0).pkt_nb, 1);
    }

    #[test]
    fn shift_defines_the_timeslot() {
        let s = Scheduler::new(SchedulerConfig::default());
        assert_eq!(s.timeslot_of((1 << 30) - 1), 0);
        assert_eq!(s.timeslot_of(1 << 30), 1);
        let s = Scheduler::new(SchedulerConfig {
            shift: 64,
            threshold: 3,
        });
        assert_eq!(s.timeslot_of(u64::MAX), 0);
        let mut s = Scheduler::new(SchedulerConfig {
            shift: 10,
            threshold: 3,
        });
        let w0 = s.add_worker(100);
        s.add_tenant(TenantSlot(0), w0, 1).unwrap();
        // 0 and 1023 share timeslot 0 -> the second is policed; 1024 is timeslot 1.
        run(&mut s, &[(0, 0, P(0)), (1023, 0, D), (1024, 0, P(0))]);
    }

    #[test]
    fn terminate_spreads_tenants_and_orphans_are_adopted() {
        let mut s = sched(3);
        for _ in 0..3 {
            s.add_worker(100);
        }
        for i in 0..6 {
            let to = s.spread_choice().unwrap();
            s.add_tenant(TenantSlot(i), to, 0).unwrap();
            // Spread: 0->w0, 1->w1, 2->w2, 3->w0, 4->w1, 5->w2.
            assert_eq!(to, WorkerId((i % 3) as u16));
        }
        // w1's tenants, in tenant-slot order: 1 -> fewest tenants: w0 2, w2 2 -> tie -> w0;
        // 4 -> w0 3, w2 2 -> w2.
        assert_eq!(
            s.terminate_worker(WorkerId(1)),
            [(TenantSlot(1), WorkerId(0)), (TenantSlot(4), WorkerId(2))]
        );
        assert!(!w(&s, 1).live);
        assert_eq!(s.tenant_count(WorkerId(1)), 0);
        assert_eq!(s.schedule(0, TenantSlot(1)).worker(), Some(WorkerId(0)));
        // Dead workers refuse placements.
        assert_eq!(
            s.add_tenant(TenantSlot(9), WorkerId(1), 0),
            Err(TenantError::WorkerNotLive(WorkerId(1)))
        );
        assert_eq!(
            s.assign(TenantSlot(0), WorkerId(1)),
            Err(TenantError::WorkerNotLive(WorkerId(1)))
        );
        // Kill the rest: with no live worker the tenants stay put and are dropped.
        s.terminate_worker(WorkerId(0));
        assert_eq!(s.tenant_count(WorkerId(2)), 6);
        assert_eq!(s.terminate_worker(WorkerId(2)), []);
        assert_eq!(s.schedule(0, TenantSlot(3)), SchedOutcome::NoLiveWorker);
        assert_eq!(s.spread_choice(), None);
        // A new worker adopts every orphan.
        let w3 = s.add_worker(100);
        assert_eq!(s.tenant_count(w3), 6);
        assert_eq!(s.schedule(1, TenantSlot(3)).worker(), Some(w3));
        // Reviving w0 moves nothing (no orphans left).
        assert_eq!(s.set_worker_live(WorkerId(0), true), Ok(vec![]));
        assert_eq!(
            s.set_worker_live(WorkerId(7), true),
            Err(WorkerError::UnknownWorker(WorkerId(7)))
        );
        assert_eq!(s.terminate_worker(WorkerId(7)), []);
    }

    #[test]
    fn tenant_table_errors() {
        let mut s = sched(3);
        assert_eq!(
            s.add_tenant(TenantSlot(0), WorkerId(0), 0),
            Err(TenantError::UnknownWorker(WorkerId(0)))
        );
        let w0 = s.add_worker(10);
        s.add_tenant(TenantSlot(3), w0, 0).unwrap();
        assert_eq!(
            s.add_tenant(TenantSlot(3), w0, 0),
            Err(TenantError::DuplicateSlot(TenantSlot(3)))
        );
        assert_eq!(
            s.add_tenant(TenantSlot(MAX_TENANT_SLOTS), w0, 0),
            Err(TenantError::SlotOutOfRange(TenantSlot(MAX_TENANT_SLOTS)))
        );
        assert_eq!(s.schedule(0, TenantSlot(2)), SchedOutcome::UnknownTenant);
        assert_eq!(
            s.schedule(0, TenantSlot(u32::MAX)),
            SchedOutcome::UnknownTenant
        );
        assert_eq!(s.len(), 1);
        let row = s.remove_tenant(TenantSlot(3)).unwrap();
        assert_eq!(row.worker, w0);
        assert_eq!(
            s.remove_tenant(TenantSlot(3)),
            Err(TenantError::UnknownTenant(TenantSlot(3)))
        );
        assert!(s.is_empty());
        assert_eq!(s.tenant_count(w0), 0);
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Random packets, terminations and revivals: a dead worker never gets a pass,
    /// tenant counts stay consistent, and a migration always lands on a live worker.
    #[test]
    fn random_operations_keep_invariants() {
        let mut rng = 0x1234_5678_9abc_def1u64;
        let mut s = sched(2);
        for _ in 0..4 {
            s.add_worker(20);
        }
        for i in 0..16 {
            let to = s.spread_choice().unwrap();
            s.add_tenant(TenantSlot(i), to, 8).unwrap();
        }
        let mut ts = 0u64;
        for step in 0..50_000 {
            ts += xorshift(&mut rng) % 3;
            let r = xorshift(&mut rng);
            if r % 997 == 0 {
                let wk = WorkerId((r >> 20) as u16 % 4);
                let live = (r >> 30) & 1 == 1;
                let moves = s.set_worker_live(wk, live).unwrap();
                for (_, to) in moves {
                    assert!(w(&s, to.0).live);
                }
                continue;
            }
            let tenant = TenantSlot((r >> 8) as u32 % 16);
            let any_live = s.live_workers() > 0;
            match s.schedule(ts, tenant) {
                SchedOutcome::Pass {
                    worker,
                    migrated_from,
                    ..
                } => {
                    assert!(w(&s, worker.0).live, "step {step}");
                    assert_eq!(t(&s, tenant.0).worker, worker);
                    if let Some(from) = migrated_from {
                        assert_ne!(from, worker);
                    }
                }
                SchedOutcome::NoLiveWorker => assert!(!any_live, "step {step}"),
                SchedOutcome::Policed => {}
                SchedOutcome::UnknownTenant => unreachable!(),
            }
            for wid in 0..4u16 {
                assert_eq!(
                    s.tenant_count(WorkerId(wid)),
                    s.tenants_of(WorkerId(wid)).count()
                );
            }
        }
    }

    /// Rows of every tenant and worker, to compare two schedulers.
    fn snapshot(s: &Scheduler) -> (Vec<(TenantSlot, TenantRow)>, Vec<WorkerRow>) {
        (
            s.tenants().map(|(k, r)| (k, *r)).collect(),
            s.workers().map(|(_, r)| *r).collect(),
        )
    }

    #[test]
    fn schedule_burst_decides_as_that_many_single_steps() {
        let mut rng = 0x0bad_cafe_f00d_1234u64;
        let mut a = sched(1);
        for cap in [40, 60, 90] {
            a.add_worker(cap);
        }
        for i in 0..10 {
            let to = a.spread_choice().unwrap();
            a.add_tenant(TenantSlot(i), to, if i % 3 == 0 { 0 } else { 12 })
                .unwrap();
        }
        let mut b = a.clone();
        let mut ts = 0u64;
        for step in 0..5_000 {
            ts += xorshift(&mut rng) % 2;
            let r = xorshift(&mut rng);
            let tenant = TenantSlot((r >> 8) as u32 % 11); // 10 is unknown
            let n = (r >> 20) % 25;
            let burst = a.schedule_burst(ts, tenant, n);
            let (mut passed, mut policed) = (0, 0);
            let mut first = None;
            for _ in 0..n {
                let o = b.schedule(ts, tenant);
                first.get_or_insert(o);
                match o {
                    SchedOutcome::Pass { .. } => passed += 1,
                    SchedOutcome::Policed => policed += 1,
                    _ => {}
                }
            }
            if n > 0 {
                assert_eq!(Some(burst.first), first, "step {step}");
            }
            assert_eq!(
                (burst.passed, burst.policed),
                (passed, policed),
                "step {step}"
            );
            assert_eq!(snapshot(&a), snapshot(&b), "step {step}");
        }
    }

    #[test]
    fn planner_ours_moves_at_the_slot_boundary_and_never_per_packet() {
        let mut s = sched(0);
        for _ in 0..3 {
            s.add_worker(10);
        }
        s.set_planner(Planner::Ours);
        // Timeslot 0: worker 0 carries tenants 0 (6) and 3 (5) = 11; worker 1 tenant 1 (2);
        // worker 2 tenant 2 (3).
        for (i, w) in [0u16, 1, 2, 0].into_iter().enumerate() {
            s.add_tenant(TenantSlot(i as u32), WorkerId(w), 0).unwrap();
        }
        for (i, n) in [6u64, 2, 3, 5].into_iter().enumerate() {
            s.schedule_burst(0, TenantSlot(i as u32), n);
        }
        // Planning for timeslot 0 saw no previous timeslot: nothing moved.
        assert!(!s.has_planned());
        // Timeslot 1's first packet (tenant 1) plans: worker 0's excess is 2 (11 - 10 + 1);
        // the smallest tenant covering it is tenant 3 (5), and the least room that takes
        // it is worker 2's (10 - 3 = 7 against worker 1's 8).
        let o = s.schedule(1, TenantSlot(1));
        assert_eq!(o.worker(), Some(WorkerId(1)));
        let moves: Vec<_> = s.take_planned().collect();
        assert_eq!(moves, vec![(TenantSlot(3), WorkerId(0), WorkerId(2))]);
        assert_eq!(t(&s, 3).worker, WorkerId(2));
        assert_eq!(w(&s, 0).last_nb, 6);
        assert_eq!(w(&s, 2).last_nb, 8);
        // Tenant 3's first packet of timeslot 1 goes to worker 2; tenant 0's stays on 0.
        assert_eq!(s.schedule(1, TenantSlot(3)).worker(), Some(WorkerId(2)));
        assert_eq!(s.schedule(1, TenantSlot(0)).worker(), Some(WorkerId(0)));
        assert!(!s.has_planned());
        assert_eq!(s.tenant_count(WorkerId(2)), 2);
    }

    #[test]
    fn planner_ours_reports_overload_it_cannot_clear_and_does_not_migrate() {
        let mut s = sched(0);
        for _ in 0..2 {
            s.add_worker(10);
        }
        s.set_planner(Planner::Ours);
        s.add_tenant(TenantSlot(0), WorkerId(0), 0).unwrap();
        s.add_tenant(TenantSlot(1), WorkerId(1), 0).unwrap();
        // Both workers at capacity: nothing fits anywhere.
        s.schedule_burst(0, TenantSlot(0), 10);
        s.schedule_burst(0, TenantSlot(1), 10);
        match s.schedule(1, TenantSlot(0)) {
            SchedOutcome::Pass {
                worker,
                migrated_from,
                overload,
            } => {
                assert_eq!(worker, WorkerId(0));
                assert_eq!(migrated_from, None);
                // threshold 0: the first detection reports.
                assert!(overload.is_some());
            }
            o => panic!("{o:?}"),
        }
        assert!(!s.has_planned());
        assert_eq!(w(&s, 0).times, 1);
    }
}
