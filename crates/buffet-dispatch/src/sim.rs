//! The scheduling simulation of the Buffet paper (section IV.C, Figs. 7–8): how often a
//! scheduling policy leaves a worker overloaded, and how many tenants it migrates.
//!
//! The paper's setup: 3 workers of 4.2 Gbps each; N tenants whose rates are uniform in
//! [0, 4.2] Gbps, scaled so that they sum to 10 Gbps (a case is redrawn when a scaled rate
//! exceeds 4.2 Gbps); tenant `i` starts on worker `i mod 3`. Rates are integers in kbit/s
//! here, so a worker's capacity is `4_200_000` — the same unit plays the role of Algorithm
//! 1's packet counts. Each case is scheduled once, as at the start of a timeslot after one
//! timeslot of that traffic, by one [`Policy`]:
//!
//! - [`Policy::None`]: the fixed mapping.
//! - [`Policy::Greedy`]: Algorithm 1 itself — a real [`Scheduler`] is given the case's
//!   counts for timeslot 0 ([`Scheduler::schedule_burst`]), then each tenant's first
//!   packet of timeslot 1 in a random order (as first packets arrive), and the tenant rows
//!   are read back.
//! - [`Policy::Optimal`]: [`planner::plan_optimal`] — the fewest migrations among the
//!   placements in which no worker is overloaded.
//! - [`Policy::Ours`]: [`planner::plan_ours`], the planner the [`Scheduler`] runs with
//!   [`Planner::Ours`](crate::Planner::Ours).
//!
//! A case *ends overloaded* when some worker's load reaches its capacity after scheduling
//! ([`planner::overloaded`], Algorithm 1's test). Cases are drawn from a seed and the case
//! number only, so results do not depend on how cases are spread over threads. This module
//! draws and decides; timing and threads are the caller's (`buffet sim`).

use crate::scheduler::planner::{self, Move, PlanProblem};
use crate::{Scheduler, SchedulerConfig, TenantSlot, WorkerId};

/// A scheduling policy compared by the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The fixed initial mapping.
    None,
    /// The paper's Algorithm 1.
    Greedy,
    /// The exact optimum.
    Optimal,
    /// Our planner.
    Ours,
}

impl Policy {
    /// All policies, in the order reports list them.
    pub const ALL: [Policy; 4] = [Policy::None, Policy::Greedy, Policy::Optimal, Policy::Ours];

    /// The name used on the command line and in CSV output.
    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Greedy => "greedy",
            Policy::Optimal => "optimal",
            Policy::Ours => "ours",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown policy {s:?} (expected none, greedy, optimal or ours)"))
    }
}

/// The simulated server and its load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimSetup {
    /// Workers.
    pub workers: usize,
    /// Capacity of each worker (kbit/s).
    pub capacity: u64,
    /// Sum of all tenants' rates (kbit/s).
    pub total: u64,
    /// Tenants.
    pub tenants: usize,
}

impl SimSetup {
    /// The paper's setup with `tenants` tenants: 3 × 4.2 Gbps, 10 Gbps offered.
    pub fn paper(tenants: usize) -> Self {
        SimSetup {
            workers: 3,
            capacity: 4_200_000,
            total: 10_000_000,
            tenants,
        }
    }

    /// Why the setup cannot be simulated, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.workers == 0 || self.workers > u16::MAX as usize {
            return Err(format!("workers must be 1..=65535, not {}", self.workers));
        }
        if self.tenants == 0 {
            return Err("at least one tenant is needed".into());
        }
        if self.capacity == 0 {
            return Err("a worker's capacity must be above 0".into());
        }
        // Rates are uniform before scaling, so the largest of many is about twice the
        // mean: with a mean above half a worker's capacity nearly every draw would be
        // redrawn.
        if (self.total as u128) * 2 > (self.capacity as u128) * (self.tenants as u128) {
            return Err(format!(
                "{} tenants offering {} kbit/s in all average more than half a worker's \
                 {} kbit/s, so nearly every draw would have a tenant above one worker; \
                 offer less or add tenants",
                self.tenants, self.total, self.capacity
            ));
        }
        Ok(())
    }
}

/// The simulation's random numbers: SplitMix64 (small, fast, and reproducible across
/// platforms; statistical quality is ample for drawing rates).
#[derive(Clone, Copy, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// The generator for case `case` of the run seeded `seed` with `tenants` tenants.
    pub fn for_case(seed: u64, tenants: usize, case: u64) -> Self {
        let mut r = SimRng(seed ^ (tenants as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        r.0 ^= r.next_u64() ^ case.wrapping_mul(0xD1B5_4A32_D192_ED03);
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift.
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * n as u64) >> 32) as u32
    }
}

/// One drawn case.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Case {
    /// Each tenant's rate (kbit/s).
    pub rates: Vec<u64>,
    /// Each tenant's initial worker (`i mod workers`).
    pub worker_of: Vec<u16>,
}

impl Case {
    /// Draws a case (see the module docs) into `self`, reusing its vectors.
    pub fn draw(&mut self, setup: &SimSetup, rng: &mut SimRng) {
        let n = setup.tenants;
        let mut u = vec![0f64; n];
        loop {
            let mut sum = 0.0;
            for x in u.iter_mut() {
                *x = rng.unit();
                sum += *x;
            }
            if sum <= 0.0 {
                continue;
            }
            let scale = setup.total as f64 / sum;
            self.rates.clear();
            self.rates
                .extend(u.iter().map(|&x| (x * scale).round() as u64));
            if self.rates.iter().all(|&r| r <= setup.capacity) {
                break;
            }
        }
        self.worker_of.clear();
        self.worker_of
            .extend((0..n).map(|i| (i % setup.workers) as u16));
    }
}

/// What a policy did to a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Some worker is overloaded after scheduling.
    pub overloaded: bool,
    /// Tenants on a different worker than at the start.
    pub migrated: u32,
}

/// Runs policies on cases, reusing its buffers. [`Runner::prepare`] sets a case up
/// (including, for [`Policy::Greedy`], the scheduler's timeslot-0 counts and the arrival
/// order); [`Runner::decide`] is the policy's decision alone, which is what a caller times;
/// [`Runner::outcome`] reads the result.
#[derive(Debug)]
pub struct Runner {
    setup: SimSetup,
    policy: Policy,
    sched: Scheduler,
    order: Vec<u32>,
    moves: Vec<Move>,
    capacity: Vec<u64>,
    live: Vec<bool>,
    final_worker: Vec<u16>,
}

impl Runner {
    /// A runner for one setup and policy.
    pub fn new(setup: SimSetup, policy: Policy) -> Self {
        Runner {
            setup,
            policy,
            sched: Scheduler::default(),
            order: Vec::new(),
            moves: Vec::new(),
            capacity: vec![setup.capacity; setup.workers],
            live: vec![true; setup.workers],
            final_worker: Vec::new(),
        }
    }

    /// Sets `case` up for the policy; `rng` gives Algorithm 1's arrival order.
    pub fn prepare(&mut self, case: &Case, rng: &mut SimRng) {
        if self.policy != Policy::Greedy {
            return;
        }
        // Timeslots are the timestamps themselves (shift 0); no overload reports matter.
        self.sched = Scheduler::new(SchedulerConfig {
            shift: 0,
            threshold: u32::MAX,
        });
        for _ in 0..self.setup.workers {
            self.sched.add_worker(self.setup.capacity);
        }
        for (i, (&r, &w)) in case.rates.iter().zip(&case.worker_of).enumerate() {
            let slot = TenantSlot(i as u32);
            // Cannot fail: fresh slots, live workers.
            let _ = self.sched.add_tenant(slot, WorkerId(w), 0);
            self.sched.schedule_burst(0, slot, r);
        }
        self.order.clear();
        self.order.extend(0..case.rates.len() as u32);
        // Fisher–Yates.
        for i in (1..self.order.len()).rev() {
            let j = rng.below(i as u32 + 1) as usize;
            self.order.swap(i, j);
        }
    }

    /// The policy's decision for the prepared case.
    pub fn decide(&mut self, case: &Case) {
        let p = PlanProblem {
            loads: &case.rates,
            worker_of: &case.worker_of,
            capacity: &self.capacity,
            live: &self.live,
        };
        match self.policy {
            Policy::None => self.moves.clear(),
            Policy::Greedy => {
                for &t in &self.order {
                    self.sched.schedule(1, TenantSlot(t));
                }
            }
            Policy::Optimal => planner::plan_optimal(&p, &mut self.moves),
            Policy::Ours => planner::plan_ours(&p, &mut self.moves),
        }
    }

    /// The result of the last [`Runner::decide`].
    pub fn outcome(&mut self, case: &Case) -> Outcome {
        self.final_worker.clear();
        self.final_worker.extend_from_slice(&case.worker_of);
        if self.policy == Policy::Greedy {
            for (i, w) in self.final_worker.iter_mut().enumerate() {
                if let Some(row) = self.sched.tenant(TenantSlot(i as u32)) {
                    *w = row.worker.0;
                }
            }
        } else {
            for m in &self.moves {
                self.final_worker[m.tenant as usize] = m.to;
            }
        }
        let mut load = vec![0u64; self.setup.workers];
        for (&r, &w) in case.rates.iter().zip(&self.final_worker) {
            load[w as usize] += r;
        }
        Outcome {
            overloaded: load
                .iter()
                .any(|&l| planner::overloaded(l, self.setup.capacity)),
            migrated: self
                .final_worker
                .iter()
                .zip(&case.worker_of)
                .filter(|(a, b)| a != b)
                .count() as u32,
        }
    }
}

/// Runs one case under one policy: draw, prepare, decide, outcome.
pub fn run_case(setup: &SimSetup, policy: Policy, seed: u64, case_no: u64) -> Outcome {
    let mut rng = SimRng::for_case(seed, setup.tenants, case_no);
    let mut case = Case::default();
    case.draw(setup, &mut rng);
    let mut r = Runner::new(*setup, policy);
    r.prepare(&case, &mut rng);
    r.decide(&case);
    r.outcome(&case)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_follow_the_paper() {
        for n in [8, 12, 16, 20] {
            let setup = SimSetup::paper(n);
            for k in 0..200 {
                let mut rng = SimRng::for_case(7, n, k);
                let mut c = Case::default();
                c.draw(&setup, &mut rng);
                assert_eq!(c.rates.len(), n);
                assert!(c.rates.iter().all(|&r| r <= 4_200_000));
                let sum: u64 = c.rates.iter().sum();
                assert!(sum.abs_diff(10_000_000) <= n as u64, "{sum}");
                assert_eq!(c.worker_of[4], (4 % 3) as u16);
            }
        }
    }

    #[test]
    fn cases_depend_on_seed_and_number_only() {
        let setup = SimSetup::paper(12);
        let a = run_case(&setup, Policy::Ours, 1, 5);
        let b = run_case(&setup, Policy::Ours, 1, 5);
        assert_eq!(a, b);
        let mut c1 = Case::default();
        let mut c2 = Case::default();
        c1.draw(&setup, &mut SimRng::for_case(1, 12, 5));
        c2.draw(&setup, &mut SimRng::for_case(1, 12, 6));
        assert_ne!(c1, c2);
    }

    /// The greedy policy is Algorithm 1: on a hand-made case the scheduler moves exactly
    /// the tenants the paper's rule moves.
    #[test]
    fn greedy_is_algorithm_1() {
        let setup = SimSetup {
            workers: 3,
            capacity: 10,
            total: 0,
            tenants: 4,
        };
        // Worker 0: tenants 0 (6) and 3 (5) = 11 >= 10; worker 1: 1 (2); worker 2: 2 (3).
        let case = Case {
            rates: vec![6, 2, 3, 5],
            worker_of: vec![0, 1, 2, 0],
        };
        let mut r = Runner::new(setup, Policy::Greedy);
        // Arrival order 3, 0, 1, 2: tenant 3 arrives first on overloaded worker 0; the
        // least-loaded worker is 1 (2): 2 + 5 < 10, so tenant 3 moves; worker 0 is at 6,
        // and tenant 0 stays.
        r.order = vec![3, 0, 1, 2];
        r.prepare_greedy_without_shuffle(&case);
        r.decide(&case);
        assert_eq!(
            r.outcome(&case),
            Outcome {
                overloaded: false,
                migrated: 1
            }
        );
        assert_eq!(r.final_worker, vec![0, 1, 2, 1]);
        // Order 0, 3, ...: tenant 0 (6) arrives first and moves to worker 1 (2 + 6 < 10).
        r.order = vec![0, 3, 1, 2];
        r.prepare_greedy_without_shuffle(&case);
        r.decide(&case);
        r.outcome(&case);
        assert_eq!(r.final_worker, vec![1, 1, 2, 0]);
    }

    impl Runner {
        fn prepare_greedy_without_shuffle(&mut self, case: &Case) {
            let order = self.order.clone();
            self.prepare(case, &mut SimRng(0));
            self.order = order;
        }
    }

    /// What must hold on every case (checked on many random ones): no policy makes a
    /// worker overloaded that was not; the optimum is overloaded only when no placement
    /// avoids it, so every other policy is then overloaded too; whenever ours (or greedy)
    /// ends overload-free, the optimum migrates no more tenants; no policy migrates when
    /// nothing was overloaded; greedy only moves tenants off overloaded workers.
    #[test]
    fn policies_keep_their_guarantees_on_random_cases() {
        for n in [5usize, 8, 12, 16] {
            let setup = SimSetup::paper(n);
            for k in 0..400 {
                let mut rng = SimRng::for_case(99, n, k);
                let mut case = Case::default();
                case.draw(&setup, &mut rng);
                let mut out = [Outcome {
                    overloaded: false,
                    migrated: 0,
                }; 4];
                let mut finals: Vec<Vec<u16>> = Vec::new();
                for (i, p) in Policy::ALL.into_iter().enumerate() {
                    let mut r = Runner::new(setup, p);
                    r.prepare(&case, &mut rng.clone());
                    r.decide(&case);
                    out[i] = r.outcome(&case);
                    finals.push(r.final_worker.clone());
                }
                let [none, greedy, optimal, ours] = out;
                let mut before = [0u64; 3];
                for (&r, &w) in case.rates.iter().zip(&case.worker_of) {
                    before[w as usize] += r;
                }
                for (f, name) in finals.iter().zip(["none", "greedy", "optimal", "ours"]) {
                    let mut after = [0u64; 3];
                    for (&r, &w) in case.rates.iter().zip(f) {
                        after[w as usize] += r;
                    }
                    for w in 0..3 {
                        if !planner::overloaded(before[w], setup.capacity) {
                            assert!(
                                !planner::overloaded(after[w], setup.capacity),
                                "{name} overloaded worker {w} in case {k} of {n}"
                            );
                        }
                    }
                    // Algorithm 1 moves only tenants of overloaded workers (the exact
                    // search, and ours when it falls back to it, may repack).
                    for (t, (&a, &b)) in f.iter().zip(&case.worker_of).enumerate() {
                        if name == "greedy" && a != b {
                            assert!(
                                planner::overloaded(before[b as usize], setup.capacity),
                                "{name} moved tenant {t} off a worker that was fine"
                            );
                        }
                    }
                }
                if !none.overloaded {
                    assert_eq!(
                        (greedy.migrated, optimal.migrated, ours.migrated),
                        (0, 0, 0)
                    );
                }
                if optimal.overloaded {
                    assert!(greedy.overloaded && ours.overloaded && none.overloaded);
                    assert_eq!(optimal.migrated, 0);
                }
                for other in [greedy, ours] {
                    if !other.overloaded {
                        assert!(!optimal.overloaded);
                        assert!(optimal.migrated <= other.migrated, "case {k} of {n}");
                    }
                }
            }
        }
    }
}
