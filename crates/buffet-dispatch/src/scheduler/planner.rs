//! Slot-boundary planners: from the last timeslot's per-tenant loads, choose tenant moves
//! that clear every overloaded worker with as few migrations as possible.
//!
//! Algorithm 1 (the paper's greedy step, [`Scheduler::schedule`](super::Scheduler::schedule))
//! decides per packet, tenant by tenant in arrival order, and always offers a tenant to the
//! least-loaded worker. A planner sees the whole Worker Table at once, so it can pick *which*
//! tenants to move: the one tenant whose load covers a worker's excess rather than the first
//! small one to arrive, and a destination where it fits best. Two planners live here:
//!
//! - [`plan_ours`]: a polynomial heuristic (per overloaded worker, the smallest single tenant
//!   that clears the excess and fits somewhere, else the largest that fits, best-fit
//!   destinations), completed by the exact search under a node budget when the heuristic
//!   leaves a worker overloaded and the problem is small.
//! - [`plan_optimal`]: the exact optimum, branch and bound: among the placements in which no
//!   worker is overloaded, one with the fewest migrations; when no such placement exists,
//!   no move at all (every placement is overloaded, so moving buys nothing).
//!
//! Both read a [`PlanProblem`] and write [`Move`]s; neither allocates per tenant beyond the
//! scratch vectors they own per call, reads a clock or touches the tables: the
//! [`Scheduler`](super::Scheduler) applies a plan at every timeslot boundary with
//! [`Planner::Ours`], and `buffet sim` compares the planners
//! on the paper's simulation setup ([`crate::sim`]).
//!
//! **Overload** means what Algorithm 1 tests: a worker whose load reached its capacity
//! (`load >= max_nb`); a worker with no load is never overloaded. A tenant *fits* on a
//! worker when `load + tenant < max_nb` (Algorithm 1's `fits`). Planners never move a
//! tenant with no load, and a worker that was not overloaded before a plan is not
//! overloaded after it: the heuristic only moves tenants off overloaded workers to where
//! they fit, and the exact search only returns placements with no overloaded worker (it
//! may move a tenant of a worker that was fine, to make room: a repacking).

/// Which planner the [`Scheduler`](super::Scheduler) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Planner {
    /// Algorithm 1 only: tenants move one at a time, per packet (the paper).
    #[default]
    Greedy,
    /// [`plan_ours`] at every slot boundary; the per-packet migration of Algorithm 1 is
    /// off (overload detection and reports stay).
    Ours,
}

impl Planner {
    /// The name used on command lines and in config files.
    pub fn name(self) -> &'static str {
        match self {
            Planner::Greedy => "greedy",
            Planner::Ours => "ours",
        }
    }
}

impl std::str::FromStr for Planner {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "greedy" => Ok(Planner::Greedy),
            "ours" => Ok(Planner::Ours),
            _ => Err(format!(
                "unknown planner {s:?} (expected \"greedy\" or \"ours\")"
            )),
        }
    }
}

/// One slot's scheduling problem. Tenants and workers are positions in the slices.
#[derive(Clone, Copy, Debug)]
pub struct PlanProblem<'a> {
    /// Each tenant's load in the last timeslot (packets, or any unit shared with
    /// `capacity`).
    pub loads: &'a [u64],
    /// Each tenant's worker (an index into `capacity`).
    pub worker_of: &'a [u16],
    /// Each worker's capacity (`max_nb`).
    pub capacity: &'a [u64],
    /// Whether each worker may receive tenants. Tenants of workers that are not live are
    /// left alone (the scheduler evacuates them).
    pub live: &'a [bool],
}

/// Move `tenant` to worker `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Move {
    /// Position of the tenant in [`PlanProblem::loads`].
    pub tenant: u32,
    /// The new worker.
    pub to: u16,
}

/// How [`min_moves`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExactOutcome {
    /// A placement with no overloaded worker and the fewest moves was found (the moves are
    /// in the output vector).
    Optimal,
    /// No placement avoids overload.
    Infeasible,
    /// The node budget ran out first; the output vector holds the best placement found, if
    /// any (empty otherwise).
    BudgetExceeded,
}

/// Problems with at most this many loaded tenants get the exact search when the heuristic
/// of [`plan_ours`] leaves a worker overloaded.
pub const EXACT_FALLBACK_TENANTS: usize = 64;
/// The exact search's node budget inside [`plan_ours`].
pub const EXACT_FALLBACK_NODES: u64 = 20_000;

/// Each worker's load under the problem's placement.
pub fn worker_loads(p: &PlanProblem<'_>) -> Vec<u64> {
    let mut l = vec![0u64; p.capacity.len()];
    for (&r, &w) in p.loads.iter().zip(p.worker_of) {
        if let Some(x) = l.get_mut(w as usize) {
            *x = x.saturating_add(r);
        }
    }
    l
}

/// Whether a worker with this load and capacity is overloaded (see the module docs).
pub fn overloaded(load: u64, capacity: u64) -> bool {
    load > 0 && load >= capacity
}

/// Whether a tenant of load `r` fits on a worker with this load and capacity.
fn fits(load: u64, r: u64, capacity: u64) -> bool {
    load.saturating_add(r) < capacity
}

/// Whether any live worker is overloaded after applying `moves`.
pub fn any_overloaded(p: &PlanProblem<'_>, moves: &[Move]) -> bool {
    let mut l = worker_loads(p);
    for m in moves {
        let r = p.loads[m.tenant as usize];
        let from = p.worker_of[m.tenant as usize] as usize;
        l[from] -= r;
        l[m.to as usize] += r;
    }
    l.iter()
        .zip(p.capacity)
        .zip(p.live)
        .any(|((&l, &c), &live)| live && overloaded(l, c))
}

/// Our planner (see the module docs). Writes the moves to `out` (cleared first).
pub fn plan_ours(p: &PlanProblem<'_>, out: &mut Vec<Move>) {
    out.clear();
    let mut load = worker_loads(p);
    let nw = load.len();
    let is_over = |l: &[u64], w: usize| {
        p.live.get(w).copied().unwrap_or(false) && overloaded(l[w], p.capacity[w])
    };
    let mut over: Vec<usize> = (0..nw).filter(|&w| is_over(&load, w)).collect();
    if over.is_empty() {
        return;
    }
    // Most overloaded first: it needs the most room.
    over.sort_by_key(|&w| std::cmp::Reverse(load[w].saturating_sub(p.capacity[w])));
    let mut is_src = vec![false; nw];
    for &w in &over {
        is_src[w] = true;
    }
    let mut by_worker: Vec<Vec<u32>> = vec![Vec::new(); nw];
    for (t, (&r, &w)) in p.loads.iter().zip(p.worker_of).enumerate() {
        if r > 0 && is_src.get(w as usize).copied().unwrap_or(false) {
            by_worker[w as usize].push(t as u32);
        }
    }
    // Room of a destination: the largest tenant it takes (`load + r < capacity`).
    let room = |load: &[u64], d: usize| -> Option<u64> {
        (p.live[d] && !overloaded(load[d], p.capacity[d]))
            .then(|| p.capacity[d].saturating_sub(load[d]).saturating_sub(1))
    };
    // Best fit: the destination with the least room that still takes `r`.
    let best_fit = |load: &[u64], from: usize, r: u64| -> Option<usize> {
        (0..nw)
            .filter(|&d| d != from)
            .filter_map(|d| room(load, d).filter(|&x| x >= r).map(|x| (x, d)))
            .min()
            .map(|(_, d)| d)
    };
    for &w in &over {
        let ts = &mut by_worker[w];
        // Smallest first; ties by tenant position, for determinism.
        ts.sort_by_key(|&t| (p.loads[t as usize], t));
        let mut taken = vec![false; ts.len()];
        while overloaded(load[w], p.capacity[w]) {
            // The excess to remove: after it the worker is below capacity.
            let excess = load[w] - p.capacity[w] + 1;
            let max_room = (0..nw)
                .filter(|&d| d != w)
                .filter_map(|d| room(&load, d))
                .max()
                .unwrap_or(0);
            // The smallest single tenant that clears the excess and fits somewhere;
            // else the largest that fits anywhere.
            let fits_any = |i: usize| p.loads[ts[i] as usize] <= max_room;
            let first_big = ts.partition_point(|&t| p.loads[t as usize] < excess);
            let end = ts.partition_point(|&t| p.loads[t as usize] <= max_room);
            let single = (first_big..end).find(|&i| !taken[i]);
            let pick = single.or_else(|| (0..end.min(first_big)).rev().find(|&i| !taken[i]));
            let Some(i) = pick.filter(|&i| fits_any(i)) else {
                break;
            };
            let t = ts[i];
            let r = p.loads[t as usize];
            let Some(d) = best_fit(&load, w, r) else {
                break;
            };
            taken[i] = true;
            load[w] -= r;
            load[d] += r;
            out.push(Move {
                tenant: t,
                to: d as u16,
            });
        }
    }
    let still = (0..nw).any(|w| is_over(&load, w));
    let loaded = p.loads.iter().filter(|&&r| r > 0).count();
    if still && loaded <= EXACT_FALLBACK_TENANTS {
        let mut exact = Vec::new();
        if min_moves(p, Some(EXACT_FALLBACK_NODES), &mut exact) != ExactOutcome::Infeasible
            && !exact.is_empty()
        {
            *out = exact;
        }
    }
}

/// The exact optimum (see the module docs). Writes the moves to `out` (cleared first).
/// Exponential in the worst case; fast on the paper's setup (3 workers, ≤ 20 tenants).
pub fn plan_optimal(p: &PlanProblem<'_>, out: &mut Vec<Move>) {
    if min_moves(p, None, out) != ExactOutcome::Optimal {
        out.clear();
    }
}

/// Branch and bound for the placement with no overloaded live worker and the fewest
/// moves, exploring at most `budget` nodes (`None`: no limit). Writes the best placement
/// found as moves to `out` (cleared first).
pub fn min_moves(p: &PlanProblem<'_>, budget: Option<u64>, out: &mut Vec<Move>) -> ExactOutcome {
    out.clear();
    let nw = p.capacity.len();
    let live_cap: Vec<u64> = (0..nw)
        .map(|w| if p.live[w] { p.capacity[w] } else { 0 })
        .collect();
    // Tenants with load on live workers, largest first. Tenants with no load never move
    // and never overload; tenants of dead workers are not ours to place.
    let mut items: Vec<u32> = (0..p.loads.len() as u32)
        .filter(|&t| p.loads[t as usize] > 0 && p.live[p.worker_of[t as usize] as usize])
        .collect();
    items.sort_by_key(|&t| (std::cmp::Reverse(p.loads[t as usize]), t));
    let already_fine = {
        let l = worker_loads(p);
        !(0..nw).any(|w| p.live[w] && overloaded(l[w], p.capacity[w]))
    };
    if already_fine {
        return ExactOutcome::Optimal;
    }
    let mut s = Search {
        p,
        cap: live_cap,
        items: &items,
        bins: vec![0; nw],
        home_rest: vec![0; nw],
        assign: vec![0; items.len()],
        best: None,
        best_cost: usize::MAX,
        nodes: 0,
        budget: budget.unwrap_or(u64::MAX),
        out_of_budget: false,
    };
    // Feasibility first (with symmetry breaking), which also gives an upper bound.
    if !s.feasible(0) {
        return if s.out_of_budget {
            ExactOutcome::BudgetExceeded
        } else {
            ExactOutcome::Infeasible
        };
    }
    for &t in &items {
        s.home_rest[p.worker_of[t as usize] as usize] += p.loads[t as usize];
    }
    s.bins.iter_mut().for_each(|b| *b = 0);
    s.min_cost(0, 0);
    let Some(best) = s.best.take() else {
        return ExactOutcome::BudgetExceeded;
    };
    for (i, &t) in items.iter().enumerate() {
        if best[i] != p.worker_of[t as usize] {
            out.push(Move {
                tenant: t,
                to: best[i],
            });
        }
    }
    if s.out_of_budget {
        ExactOutcome::BudgetExceeded
    } else {
        ExactOutcome::Optimal
    }
}

struct Search<'a> {
    p: &'a PlanProblem<'a>,
    /// Capacity per worker; 0 for workers that are not live (nothing fits there).
    cap: Vec<u64>,
    /// Loaded tenants, largest first.
    items: &'a [u32],
    /// Load placed on each worker so far.
    bins: Vec<u64>,
    /// Per worker, the load of its own tenants not yet placed.
    home_rest: Vec<u64>,
    /// Worker chosen for each item so far.
    assign: Vec<u16>,
    best: Option<Vec<u16>>,
    best_cost: usize,
    nodes: u64,
    budget: u64,
    out_of_budget: bool,
}

impl Search<'_> {
    fn tick(&mut self) -> bool {
        self.nodes += 1;
        if self.nodes > self.budget {
            self.out_of_budget = true;
        }
        !self.out_of_budget
    }

    fn load(&self, i: usize) -> u64 {
        self.p.loads[self.items[i] as usize]
    }

    fn home(&self, i: usize) -> u16 {
        self.p.worker_of[self.items[i] as usize]
    }

    /// Whether items `i..` can be placed without overload; on success `assign` holds a
    /// placement and `best`/`best_cost` are set from it.
    fn feasible(&mut self, i: usize) -> bool {
        if !self.tick() {
            return false;
        }
        if i == self.items.len() {
            let cost = (0..i).filter(|&k| self.assign[k] != self.home(k)).count();
            self.best = Some(self.assign.clone());
            self.best_cost = cost;
            return true;
        }
        let r = self.load(i);
        let nw = self.bins.len();
        // Try the home worker first, then the others.
        let home = self.home(i) as usize;
        for k in 0..nw {
            let w = if k == 0 {
                home
            } else if k <= home {
                k - 1
            } else {
                k
            };
            if !fits(self.bins[w], r, self.cap[w]) {
                continue;
            }
            // Symmetry: a worker identical (capacity, load) to one already tried gives the
            // same subproblem as far as feasibility goes.
            let dup = (0..k).any(|j| {
                let v = if j == 0 {
                    home
                } else if j <= home {
                    j - 1
                } else {
                    j
                };
                self.cap[v] == self.cap[w] && self.bins[v] == self.bins[w]
            });
            if dup {
                continue;
            }
            self.bins[w] += r;
            self.assign[i] = w as u16;
            let ok = self.feasible(i + 1);
            self.bins[w] -= r;
            if ok {
                return true;
            }
            if self.out_of_budget {
                return false;
            }
        }
        false
    }

    /// A lower bound on the moves still needed for items `i..`: per worker, its own unplaced
    /// tenants must shed at least enough to leave it below capacity, largest first.
    fn lower_bound(&self, i: usize) -> usize {
        let nw = self.bins.len();
        let mut lb = 0;
        for w in 0..nw {
            let total = self.bins[w] + self.home_rest[w];
            if total == 0 || total < self.cap[w] {
                continue;
            }
            let mut need = total - self.cap[w] + 1;
            for k in i..self.items.len() {
                if self.home(k) as usize != w {
                    continue;
                }
                lb += 1;
                let r = self.load(k);
                if r >= need {
                    need = 0;
                    break;
                }
                need -= r;
            }
            if need > 0 {
                // Its own tenants cannot bring it below capacity: no completion exists.
                return usize::MAX / 2;
            }
        }
        lb
    }

    fn min_cost(&mut self, i: usize, cost: usize) {
        if !self.tick() {
            return;
        }
        if cost + self.lower_bound(i) >= self.best_cost {
            return;
        }
        if i == self.items.len() {
            self.best_cost = cost;
            self.best = Some(self.assign.clone());
            return;
        }
        let r = self.load(i);
        let home = self.home(i) as usize;
        self.home_rest[home] -= r;
        let nw = self.bins.len();
        for k in 0..nw {
            let w = if k == 0 {
                home
            } else if k <= home {
                k - 1
            } else {
                k
            };
            if !fits(self.bins[w], r, self.cap[w]) {
                continue;
            }
            self.bins[w] += r;
            self.assign[i] = w as u16;
            self.min_cost(i + 1, cost + usize::from(w != home));
            self.bins[w] -= r;
            if self.out_of_budget {
                break;
            }
        }
        self.home_rest[home] += r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem<'a>(
        loads: &'a [u64],
        worker_of: &'a [u16],
        capacity: &'a [u64],
        live: &'a [bool],
    ) -> PlanProblem<'a> {
        PlanProblem {
            loads,
            worker_of,
            capacity,
            live,
        }
    }

    fn apply(p: &PlanProblem<'_>, moves: &[Move]) -> Vec<u64> {
        let mut l = worker_loads(p);
        for m in moves {
            let r = p.loads[m.tenant as usize];
            l[p.worker_of[m.tenant as usize] as usize] -= r;
            l[m.to as usize] += r;
        }
        l
    }

    #[test]
    fn no_overload_no_moves() {
        let p = problem(&[3, 3, 3], &[0, 1, 2], &[10, 10, 10], &[true; 3]);
        let mut out = vec![Move { tenant: 9, to: 9 }];
        plan_ours(&p, &mut out);
        assert!(out.is_empty());
        plan_optimal(&p, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn ours_moves_the_one_tenant_that_covers_the_excess() {
        // Worker 0: 1 + 1 + 1 + 6 = 9 of capacity 8: excess 2 (9 - 8 + 1). Algorithm 1 in
        // arrival order would move the small tenants one by one (1, then 1: two moves);
        // the smallest single tenant >= 2 is the 6, and it fits on worker 1 (2 + 6 < 10).
        let p = problem(&[1, 1, 1, 6, 2], &[0, 0, 0, 0, 1], &[8, 10], &[true; 2]);
        let mut out = Vec::new();
        plan_ours(&p, &mut out);
        assert_eq!(out, vec![Move { tenant: 3, to: 1 }]);
        assert_eq!(apply(&p, &out), vec![3, 8]);
        plan_optimal(&p, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn each_overloaded_worker_sheds_its_smallest_sufficient_tenant_best_fit() {
        // Workers 0 and 1 hold 5 of capacity 5 (overloaded, excess 1 each). Worker 2 holds 1
        // of 6, worker 3 holds 3 of 6. Worker 0 sheds its 1 into worker 3 (the least room
        // that takes it); worker 1 sheds its 2, which no longer fits on worker 3 (4 + 2),
        // into worker 2.
        let p = problem(
            &[4, 1, 2, 3, 1, 3],
            &[0, 0, 1, 1, 2, 3],
            &[5, 5, 6, 6],
            &[true; 4],
        );
        let mut out = Vec::new();
        plan_ours(&p, &mut out);
        let l = apply(&p, &out);
        assert!(!any_overloaded(&p, &out), "{l:?} after {out:?}");
        assert_eq!(
            out,
            vec![Move { tenant: 1, to: 3 }, Move { tenant: 2, to: 2 }]
        );
    }

    #[test]
    fn infeasible_problems_make_no_optimal_moves() {
        // Four tenants of 5 on three workers of capacity 9: two must share, 10 >= 9.
        let p = problem(&[5, 5, 5, 5], &[0, 0, 1, 2], &[9, 9, 9], &[true; 3]);
        let mut out = Vec::new();
        assert_eq!(min_moves(&p, None, &mut out), ExactOutcome::Infeasible);
        plan_optimal(&p, &mut out);
        assert!(out.is_empty());
        // Ours never moves a tenant where it does not fit, so it cannot move either.
        plan_ours(&p, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn exact_search_repacks_when_no_single_move_helps() {
        // Worker 0 holds 6 + 5 = 11 of capacity 10; workers 1 and 2 hold 4 + 4 each.
        let loads = [6, 5, 4, 4, 4, 4];
        let homes = [0, 0, 1, 1, 2, 2];
        let mut out = Vec::new();
        // With capacities 10, 10, 10 no placement avoids overload: the 6 can share with
        // nothing (6 + 4 = 10), the 5 with one 4, which leaves three 4s for one worker.
        let p = problem(&loads, &homes, &[10, 10, 10], &[true; 3]);
        assert_eq!(min_moves(&p, None, &mut out), ExactOutcome::Infeasible);
        // With capacity 11 on worker 2, {5, 4} {4, 4} {6, 4} exists: the 6 goes to worker
        // 2 and one of worker 2's 4s to worker 0 (2 moves). No single move works: the 6
        // and the 5 fit nowhere (8 + 5 >= 10, 8 + 5 >= 11).
        let p = problem(&loads, &homes, &[10, 10, 11], &[true; 3]);
        assert_eq!(min_moves(&p, None, &mut out), ExactOutcome::Optimal);
        assert!(!any_overloaded(&p, &out));
        assert_eq!(out.len(), 2, "{out:?}");
        // The heuristic finds no single fitting move, so it falls back to the exact search
        // and ends overload-free too.
        plan_ours(&p, &mut out);
        assert!(!any_overloaded(&p, &out), "{out:?}");
        assert_eq!(out.len(), 2, "{out:?}");
    }

    #[test]
    fn dead_workers_take_nothing_and_their_tenants_stay() {
        let p = problem(&[6, 6, 1], &[0, 0, 1], &[10, 100, 10], &[true, false, true]);
        let mut out = Vec::new();
        plan_ours(&p, &mut out);
        // Either 6 may go (equal loads); only worker 2 takes it.
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].to, 2);
        plan_optimal(&p, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].to, 2);
    }

    #[test]
    fn budget_is_honoured() {
        let loads: Vec<u64> = (0..40).map(|i| 100 + i).collect();
        let worker_of: Vec<u16> = (0..40).map(|i| (i % 2) as u16).collect();
        // Worker 0 overloaded, worker 2 empty but small.
        let p = problem(&loads, &worker_of, &[2000, 3000, 500], &[true; 3]);
        let mut out = Vec::new();
        let o = min_moves(&p, Some(10), &mut out);
        assert_eq!(o, ExactOutcome::BudgetExceeded);
    }

    #[test]
    fn planner_names_round_trip() {
        for p in [Planner::Greedy, Planner::Ours] {
            assert_eq!(p.name().parse::<Planner>(), Ok(p));
        }
        assert!("optimal".parse::<Planner>().unwrap_err().contains("greedy"));
    }
}
