//! The host half of the nfp offload (nic-firmware/xdp/dispatcher_offload.bpf.c): the NIC
//! classifies, counts, tags and selects each tenant's worker queue, but has no clock, so
//! the timeslot boundary of Algorithm 1 runs here, from the NIC's per-tenant counters.
//!
//! [`OffloadPlanner::boundary`] takes the packets each tenant sent in the timeslot that
//! just ended and applies step 3 of docs/scheduler.md to every tenant, in tenant-slot
//! order, as if each sent its first packet of the new timeslot now: `tmp` is the tenant's
//! count, a worker's `last_nb` the sum of its tenants' counts, an overloaded worker
//! (`last_nb >= MAX_NB`) gives the tenant to the live worker with the lowest `last_nb`
//! (ties: lowest id) if it fits, `times` counts detections and a report is due while
//! `times > threshold`. The caller writes the moves into the NIC's tenant rows.
//!
//! Where decisions differ from the driver-mode program (which runs the step per packet):
//! a tenant moves at the boundary, before its first packet, and every tenant is visited
//! even if it stays idle in the new timeslot; tenants are visited in slot order, not in
//! the order their first packets arrive; and no packet is policed in the NIC (a
//! tenant's MAX_NB cannot be enforced without a clock).
//!
//! What it does not do: read the maps (the caller passes counts), or place tenants.

use buffet_dispatch::{OverloadReport, TenantSlot, WorkerId};

/// One tenant's move at a boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The tenant.
    pub tenant: TenantSlot,
    /// Its old worker.
    pub from: WorkerId,
    /// Its new worker.
    pub to: WorkerId,
}

/// What a boundary decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundaryPlan {
    /// Tenants to move (write their rows' worker).
    pub moves: Vec<Move>,
    /// Overload reports for the Agent.
    pub overloads: Vec<OverloadReport>,
}

#[derive(Clone, Copy, Debug)]
struct Worker {
    max_nb: u64,
    times: u32,
    live: bool,
}

/// The host's Tenant Table (tenant -> worker) and Worker Table (MAX_NB, TIMES) for an
/// offloaded dispatcher.
#[derive(Clone, Debug, Default)]
pub struct OffloadPlanner {
    tenants: Vec<Option<WorkerId>>,
    workers: Vec<Worker>,
    threshold: u32,
}

impl OffloadPlanner {
    /// No workers, no tenants; overload reports while TIMES exceeds `threshold`.
    pub fn new(threshold: u32) -> Self {
        OffloadPlanner {
            threshold,
            ..OffloadPlanner::default()
        }
    }

    /// Adds a live worker with MAX_NB `max_nb`.
    pub fn add_worker(&mut self, max_nb: u64) -> WorkerId {
        self.workers.push(Worker {
            max_nb,
            times: 0,
            live: true,
        });
        WorkerId((self.workers.len() - 1) as u16)
    }

    /// Places tenant `slot` on `worker`.
    pub fn assign(&mut self, slot: TenantSlot, worker: WorkerId) {
        let i = slot.0 as usize;
        if self.tenants.len() <= i {
            self.tenants.resize(i + 1, None);
        }
        self.tenants[i] = Some(worker);
    }

    /// The worker of `slot`.
    pub fn worker_of(&self, slot: TenantSlot) -> Option<WorkerId> {
        self.tenants.get(slot.0 as usize).copied().flatten()
    }

    /// The boundary into timeslot `slot`: `counts[t]` is what tenant slot `t` sent in the
    /// timeslot that ended (missing entries count 0).
    pub fn boundary(&mut self, slot: u64, counts: &[u64]) -> BoundaryPlan {
        let mut last = vec![0u64; self.workers.len()];
        for (t, w) in self.tenants.iter().enumerate() {
            if let (Some(w), Some(&n)) = (w, counts.get(t)) {
                if let Some(l) = last.get_mut(w.index()) {
                    *l = l.saturating_add(n);
                }
            }
        }
        let mut plan = BoundaryPlan::default();
        for t in 0..self.tenants.len() {
            let Some(w) = self.tenants[t] else { continue };
            let wi = w.index();
            if wi >= self.workers.len() || !self.workers[wi].live {
                continue;
            }
            let tmp = counts.get(t).copied().unwrap_or(0);
            if last[wi] < self.workers[wi].max_nb {
                self.workers[wi].times = 0;
                continue;
            }
            let mig = (0..self.workers.len())
                .filter(|&i| self.workers[i].live)
                .min_by_key(|&i| (last[i], i))
                .unwrap_or(wi);
            if mig != wi && last[mig].saturating_add(tmp) < self.workers[mig].max_nb {
                let to = WorkerId(mig as u16);
                self.tenants[t] = Some(to);
                last[wi] = last[wi].saturating_sub(tmp);
                last[mig] += tmp;
                plan.moves.push(Move {
                    tenant: TenantSlot(t as u32),
                    from: w,
                    to,
                });
            }
            let wk = &mut self.workers[wi];
            wk.times = wk.times.saturating_add(1);
            if wk.times > self.threshold {
                plan.overloads.push(OverloadReport { worker: w, slot });
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two workers of MAX_NB 10; tenants 0 (8 packets) and 1 (4) on w0, 2 (1) on w1;
    /// threshold 0.
    #[test]
    fn boundary_moves_the_first_tenant_that_fits_and_reports() {
        let mut p = OffloadPlanner::new(0);
        let (w0, w1) = (p.add_worker(10), p.add_worker(10));
        p.assign(TenantSlot(0), w0);
        p.assign(TenantSlot(1), w0);
        p.assign(TenantSlot(2), w1);
        // w0.last = 12 >= 10: overloaded. Tenant 0 (tmp 8): lowest last is w1 (1);
        // 1 + 8 < 10 -> moves (w0.last 4, w1.last 9); times(w0) 1 > 0 -> report.
        // Tenant 1: w0.last 4 < 10 -> not overloaded, times(w0) = 0. Tenant 2: w1.last
        // 9 < 10 -> times(w1) = 0.
        let plan = p.boundary(5, &[8, 4, 1]);
        assert_eq!(
            plan.moves,
            [Move {
                tenant: TenantSlot(0),
                from: w0,
                to: w1
            }]
        );
        assert_eq!(
            plan.overloads,
            [OverloadReport {
                worker: w0,
                slot: 5
            }]
        );
        assert_eq!(p.worker_of(TenantSlot(0)), Some(w1));
        // Next boundary: w1 carries 8 + 1 = 9 < 10, w0 4: nothing moves.
        let plan = p.boundary(6, &[8, 4, 1]);
        assert_eq!(plan, BoundaryPlan::default());
    }

    /// An overloaded worker whose tenant fits nowhere keeps it; `times` grows and the
    /// reports start once it exceeds the threshold; a quiet slot resets it.
    #[test]
    fn no_fit_counts_detections_and_a_quiet_slot_resets() {
        let mut p = OffloadPlanner::new(1);
        let (w0, w1) = (p.add_worker(4), p.add_worker(4));
        p.assign(TenantSlot(0), w0);
        p.assign(TenantSlot(1), w1);
        // w0.last 6 >= 4; w1.last 3: 3 + 6 < 4 fails -> stays; times 1 (not > 1).
        let plan = p.boundary(1, &[6, 3]);
        assert!(plan.moves.is_empty() && plan.overloads.is_empty());
        // Again: times 2 > 1 -> report.
        let plan = p.boundary(2, &[6, 3]);
        assert_eq!(
            plan.overloads,
            [OverloadReport {
                worker: w0,
                slot: 2
            }]
        );
        // Quiet: w0.last 0 < 4 -> times 0; then overloaded again: times 1, no report.
        assert_eq!(p.boundary(3, &[0, 3]), BoundaryPlan::default());
        assert_eq!(p.boundary(4, &[6, 3]), BoundaryPlan::default());
        // Tenant 2 joins w0. w0.last 3 + 2 >= 4 (tenant 1 idle: counts 0). Tenant 0
        // (tmp 3): w1.last 0 + 3 < 4 -> moves; times(w0) 2 > 1 -> report. Tenant 2:
        // w0.last 2 < 4 -> times 0.
        p.assign(TenantSlot(2), w0);
        let plan = p.boundary(5, &[3, 0, 2]);
        assert_eq!(
            plan.moves,
            [Move {
                tenant: TenantSlot(0),
                from: w0,
                to: w1
            }]
        );
        assert_eq!(
            plan.overloads,
            [OverloadReport {
                worker: w0,
                slot: 5
            }]
        );
    }
}
