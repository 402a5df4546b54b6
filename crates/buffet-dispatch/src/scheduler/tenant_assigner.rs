//! The Tenant Assigner: which worker a tenant goes to.
//!
//! Three choices, each a pure function of the [Load Monitor](super::load_monitor)'s
//! Worker Table, so the XDP program and the Micro-C plugin can mirror them line by line:
//! where a new or evacuated tenant goes ([`spread_choice`]), which worker an overloaded
//! worker's tenant may move to ([`migration_candidate`]), and whether it fits there
//! ([`fits`]). [`Scheduler`](super::Scheduler) applies them (Algorithm 1, step 3).

use super::load_monitor::WorkerRow;
use crate::WorkerId;

/// The live worker with the fewest tenants (`load[i]` tenants on worker `i`; ties: lowest
/// id): where a new tenant goes, and where a stopped worker's tenants go. `None` when no
/// worker is live.
pub fn spread_choice(workers: &[WorkerRow], load: &[u32]) -> Option<WorkerId> {
    workers
        .iter()
        .zip(load)
        .enumerate()
        .filter(|(_, (w, _))| w.live)
        .min_by_key(|&(i, (_, &n))| (n, i))
        .map(|(i, _)| WorkerId(i as u16))
}

/// `mig` of Algorithm 1: the live worker with the lowest `last_nb` (ties: lowest id),
/// rows already rolled into the current timeslot. `None` when no worker is live.
pub fn migration_candidate(workers: &[WorkerRow]) -> Option<usize> {
    workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.live)
        .min_by_key(|&(i, w)| (w.last_nb, i))
        .map(|(i, _)| i)
}

/// Whether a tenant that sent `tmp` packets in the previous timeslot fits on `to`:
/// `to.last_nb + tmp < to.max_nb` (saturating).
pub fn fits(to: &WorkerRow, tmp: u64) -> bool {
    to.last_nb.saturating_add(tmp) < to.max_nb
}
