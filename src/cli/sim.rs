//! `buffet sim`: the Buffet paper's scheduling simulation (Figs. 7–8) — overload and
//! migration percentages and the time each policy takes to decide, per tenant count.
//!
//! [`buffet_dispatch::sim`] draws the cases and runs the policies; this module spreads the
//! cases over threads, times each decision, and prints a table or CSV.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use buffet_dispatch::sim::{Case, Policy, Runner, SimRng, SimSetup};
use clap::Args;

/// Tenant counts above this are refused for the exact optimum (its search is exponential).
pub const OPTIMAL_MAX_TENANTS: usize = 24;

/// `buffet sim` arguments.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// Cases per tenant count (the paper: one million).
    #[arg(long, default_value_t = 1_000_000)]
    cases: u64,
    /// Tenant counts to simulate, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,12,16,20")]
    tenants: Vec<usize>,
    /// Seed of the case generator (the same seed draws the same cases).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Policies to compare, comma-separated: none (fixed mapping), greedy (the paper's
    /// Algorithm 1), optimal (fewest migrations among overload-free placements), ours.
    #[arg(
        long = "planner",
        value_delimiter = ',',
        default_value = "none,greedy,optimal,ours"
    )]
    planners: Vec<Policy>,
    /// Workers (the paper: 3).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Each worker's capacity in Gbit/s (the paper: 4.2).
    #[arg(long, default_value_t = 4.2)]
    capacity_gbps: f64,
    /// Offered load in Gbit/s, all tenants together (default: the paper's 10 Gbit/s for 3
    /// workers of 4.2, i.e. 10/12.6 of the total capacity, for any worker count).
    #[arg(long)]
    total_gbps: Option<f64>,
    /// Threads, 1 to 1024 (default: the available cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// One CSV line per (tenant count, policy) instead of a table.
    #[arg(long)]
    csv: bool,
}

/// Most cases per tenant count: a hundred times the paper's million (4 bytes of timing
/// each are kept for the p99).
const MAX_CASES: u64 = 100_000_000;

/// Most workers a simulated server has (worker ids are 16 bits).
const MAX_WORKERS: usize = u16::MAX as usize;

/// One (tenant count, policy) result.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRow {
    /// Tenants.
    pub tenants: usize,
    /// The policy.
    pub policy: Policy,
    /// Cases simulated.
    pub cases: u64,
    /// Percentage of cases with a worker overloaded after scheduling.
    pub overload_pct: f64,
    /// Migrated tenants over all tenants of all cases, in percent.
    pub migrated_pct: f64,
    /// Mean decision time per case.
    pub mean: Duration,
    /// 99th percentile of the decision time per case.
    pub p99: Duration,
}

/// The first value of `xs` that an earlier one equals (the lists are a few items long).
fn repeated<T: PartialEq>(xs: &[T]) -> Option<&T> {
    xs.iter()
        .enumerate()
        .find(|(i, x)| xs[..*i].contains(x))
        .map(|(_, x)| x)
}

/// Runs `buffet sim`.
pub fn run(a: &SimArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_CASES).contains(&a.cases),
        "--cases must be 1 to {MAX_CASES} (each case's decision time is kept for the p99), \
         not {}",
        a.cases
    );
    anyhow::ensure!(
        (1..=MAX_WORKERS).contains(&a.workers),
        "--workers must be 1 to {MAX_WORKERS}, not {}",
        a.workers
    );
    if let Some(n) = repeated(&a.tenants) {
        anyhow::bail!("--tenants names {n} twice");
    }
    if let Some(p) = repeated(&a.planners) {
        anyhow::bail!("--planner names {} twice", p.name());
    }
    anyhow::ensure!(!a.tenants.is_empty(), "--tenants needs at least one count");
    anyhow::ensure!(
        !a.planners.is_empty(),
        "--planner needs at least one policy"
    );
    anyhow::ensure!(
        a.capacity_gbps.is_finite() && a.capacity_gbps > 0.0,
        "--capacity-gbps must be a positive number"
    );
    let capacity = (a.capacity_gbps * 1e6).round() as u64;
    let total = match a.total_gbps {
        Some(t) => {
            anyhow::ensure!(
                t.is_finite() && t > 0.0,
                "--total-gbps must be a positive number"
            );
            (t * 1e6).round() as u64
        }
        None => (capacity as f64 * a.workers as f64 * (10.0 / 12.6)).round() as u64,
    };
    let threads = a.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    );
    let mut setups = Vec::new();
    for &n in &a.tenants {
        let setup = SimSetup {
            workers: a.workers,
            capacity,
            total,
            tenants: n,
        };
        setup
            .check()
            .map_err(|e| anyhow::anyhow!("--tenants {n}: {e}"))?;
        if a.planners.contains(&Policy::Optimal) && n > OPTIMAL_MAX_TENANTS {
            anyhow::bail!(
                "--tenants {n}: the optimal policy's search is exponential; it runs up to \
                 {OPTIMAL_MAX_TENANTS} tenants (leave it out with --planner none,greedy,ours)"
            );
        }
        setups.push(setup);
    }
    let combos = (setups.len() * a.planners.len()) as u64;
    let bar = super::run::progress(Some(a.cases.saturating_mul(combos)), "sim");
    let done = AtomicU64::new(0);
    let mut rows = Vec::new();
    for setup in &setups {
        for &policy in &a.planners {
            rows.push(simulate(
                setup, policy, a.cases, a.seed, threads, &done, &bar,
            ));
        }
    }
    bar.finish_and_clear();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if a.csv {
        write_csv(&mut out, &rows)?;
    } else {
        writeln!(
            out,
            "{} cases per tenant count; {} workers × {} Gbit/s, {} Gbit/s offered; seed {}",
            a.cases,
            a.workers,
            a.capacity_gbps,
            total as f64 / 1e6,
            a.seed
        )?;
        write_table(&mut out, &rows)?;
    }
    out.flush().context("writing the results")?;
    Ok(())
}

/// Simulates `cases` cases of one setup under one policy on `threads` threads.
pub fn simulate(
    setup: &SimSetup,
    policy: Policy,
    cases: u64,
    seed: u64,
    threads: usize,
    done: &AtomicU64,
    bar: &indicatif::ProgressBar,
) -> SimRow {
    struct Part {
        overloaded: u64,
        migrated: u64,
        times_ns: Vec<u32>,
    }
    let parts: Vec<Part> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|tid| {
                scope.spawn(move || {
                    let mut part = Part {
                        overloaded: 0,
                        migrated: 0,
                        times_ns: Vec::with_capacity((cases / threads as u64 + 1) as usize),
                    };
                    let mut runner = Runner::new(*setup, policy);
                    let mut case = Case::default();
                    let mut k = tid;
                    let mut local = 0u64;
                    while k < cases {
                        let mut rng = SimRng::for_case(seed, setup.tenants, k);
                        case.draw(setup, &mut rng);
                        runner.prepare(&case, &mut rng);
                        let t0 = Instant::now();
                        runner.decide(&case);
                        let dt = t0.elapsed();
                        let o = runner.outcome(&case);
                        part.overloaded += u64::from(o.overloaded);
                        part.migrated += u64::from(o.migrated);
                        part.times_ns
                            .push(u32::try_from(dt.as_nanos()).unwrap_or(u32::MAX));
                        k += threads as u64;
                        local += 1;
                        if local == 4096 {
                            done.fetch_add(local, Ordering::Relaxed);
                            local = 0;
                        }
                    }
                    done.fetch_add(local, Ordering::Relaxed);
                    part
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            bar.set_position(done.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    bar.set_position(done.load(Ordering::Relaxed));
    let overloaded: u64 = parts.iter().map(|p| p.overloaded).sum();
    let migrated: u64 = parts.iter().map(|p| p.migrated).sum();
    let mut times: Vec<u32> = parts.into_iter().flat_map(|p| p.times_ns).collect();
    let mean_ns = times.iter().map(|&t| t as f64).sum::<f64>() / times.len() as f64;
    let i99 = ((times.len() as f64 * 0.99).ceil() as usize).clamp(1, times.len()) - 1;
    let (_, p99, _) = times.select_nth_unstable(i99);
    SimRow {
        tenants: setup.tenants,
        policy,
        cases,
        overload_pct: 100.0 * overloaded as f64 / cases as f64,
        migrated_pct: 100.0 * migrated as f64 / (cases as f64 * setup.tenants as f64),
        mean: Duration::from_nanos(mean_ns.round() as u64),
        p99: Duration::from_nanos(u64::from(*p99)),
    }
}

/// The CSV form: a header, then one line per row.
pub fn write_csv(out: &mut impl Write, rows: &[SimRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "tenants,policy,overload_pct,migrated_pct,mean_us,p99_us"
    )?;
    for r in rows {
        writeln!(
            out,
            "{},{},{:.4},{:.4},{:.3},{:.3}",
            r.tenants,
            r.policy.name(),
            r.overload_pct,
            r.migrated_pct,
            r.mean.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6
        )?;
    }
    Ok(())
}

/// The human form.
pub fn write_table(out: &mut impl Write, rows: &[SimRow]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>7}  {:<8} {:>10} {:>10} {:>10} {:>10}",
        "tenants", "policy", "overload%", "migrated%", "mean µs", "p99 µs"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:>7}  {:<8} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            r.tenants,
            r.policy.name(),
            r.overload_pct,
            r.migrated_pct,
            r.mean.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6
        )?;
    }
    Ok(())
}
