//! `buffet demo`: seeded synthetic multi-tenant traffic through the software Packet
//! Dispatcher and the Worker Pool running the Monitor NF (or another NF `--nf` names,
//! with its default policy). Tenant 1 names its own three-stage chain (firewall, then
//! DPI for web traffic only, then monitor; docs/chains.md) and its per-stage counters are
//! printed under its row. Needs no root, no NIC and no configuration; two runs with
//! the same arguments print the same standard output (timings go to standard error).

use std::io::Write;
use std::path::Path;

use buffet_config::chain::{self, Chain, DEFAULT_KEY};
use buffet_config::registry::{NfName, NfSpec, NfVisitor, RegisteredNf};
use buffet_config::tenants::{Policy, StageConfig};
use buffet_config::{Isolation, TenantConfig};
use buffet_dispatch::{DispatcherConfig, Match, Planner, SchedulerConfig};
use buffet_io::gen::{tenant_dst_prefix, GenConfig, Generator};
use buffet_io::{PacketSource, SourcePort};
use buffet_sdk::TenantId;
use buffet_worker::{Pipeline, PipelineConfig};
use clap::Args;

use super::registry::{Registry, Selected, Visit};
use super::run::{self, Capacity};

/// `buffet demo` arguments.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// The NF every tenant runs, with its default policy: a reference NF or one
    /// registered by the program. The two reference NFs that have no default policy get
    /// one here: ids a single signature (`content:"attack"`), policer 100 Mbit/s with a
    /// 64 KB burst.
    #[arg(long, value_name = "NF", default_value = "monitor")]
    pub nf: String,
    /// How many tenants share the NF (a count: `replay` and `run` take a tenants file).
    #[arg(long, value_name = "N", default_value_t = 12, value_parser = tenant_count)]
    pub tenants: u32,
    /// Threads, arena and Tenant Table slots.
    #[command(flatten)]
    pub capacity: Capacity,
    /// Seed of the traffic generator.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Virtual seconds of traffic.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Mean aggregate rate, packets per virtual second.
    #[arg(long, default_value_t = 400_000.0)]
    pub rate: f64,
    /// Timeslot = timestamp_ns >> shift (24 ≈ 16.8 ms).
    #[arg(long, default_value_t = 24)]
    pub shift: u32,
    /// Each worker's MAX_NB per timeslot; default: 60% of the mean per-slot load.
    #[arg(long)]
    pub worker_max: Option<u64>,
    /// Overload reports once a worker's TIMES exceeds this.
    #[arg(long, default_value_t = 3)]
    pub threshold: u32,
    /// Who moves tenants off overloaded workers: greedy (the paper's Algorithm 1, per
    /// packet) or ours (a plan at every timeslot boundary; docs/scheduler.md).
    #[arg(long, default_value = "greedy")]
    pub planner: Planner,
}

/// `--tenants`: a count. A file name there is someone reaching for `replay`'s
/// `--tenants FILE`, so the error says where that is.
fn tenant_count(s: &str) -> Result<u32, String> {
    s.parse().map_err(|_| {
        "demo --tenants takes a count of tenants (a whole number); to run a tenants file use \
         `buffet replay --tenants FILE`"
            .to_owned()
    })
}

/// Runs `buffet demo` with the NFs of `registry`.
pub fn run(a: &DemoArgs, registry: &Registry) -> anyhow::Result<()> {
    anyhow::ensure!(a.tenants >= 1, "--tenants must be at least 1");
    anyhow::ensure!(
        a.tenants <= a.capacity.tenant_slots,
        "--tenants {} exceeds the {} Tenant Table slots (--tenant-slots)",
        a.tenants,
        a.capacity.tenant_slots
    );
    let mut cfg = PipelineConfig::default();
    a.capacity.apply(&mut cfg)?;
    let demo = Demo { a, cfg };
    match registry.select(&a.nf) {
        Some(Selected::Reference(name)) => {
            buffet_config::NfSpec::Reference(name).load()?.visit(demo)
        }
        Some(Selected::Registered(nf)) => nf.run(Visit::Demo(demo)),
        None => anyhow::bail!(
            "unknown NF {:?}: give one of {}",
            a.nf,
            registry.names().join(", ")
        ),
    }
}

/// Runs the demo with whichever NF was selected.
pub(crate) struct Demo<'a> {
    a: &'a DemoArgs,
    cfg: PipelineConfig,
}

impl NfVisitor for Demo<'_> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        let file = Path::new("(demo)");
        let tenants = demo_tenants(self.a)?;
        let chain =
            Chain::new()
                .with_nf(DEFAULT_KEY, nf)
                .load_stages(&tenants, Isolation::Safe, file)?;
        chain.check_tenants(&tenants, file)?;
        demo_with(chain, self.a, self.cfg, &chain::chained_tenants(&tenants))
    }
}

/// The chain of the demo's tenant 1: the firewall (deny MySQL), DPI for HTTP only (by
/// its guard), then the monitor.
fn demo_chain() -> anyhow::Result<Vec<StageConfig>> {
    let policy = |v: serde_json::Value| match v {
        serde_json::Value::Object(m) => Policy::from_map(m),
        _ => Policy::new(),
    };
    let when = serde_json::json!({ "protocol": "tcp", "dst_port": 80 });
    let mut dpi = StageConfig::new(NfSpec::Reference(NfName::Dpi), Policy::new());
    dpi.when = Some(serde_json::from_value(when)?);
    Ok(vec![
        StageConfig::new(
            NfSpec::Reference(NfName::Firewall),
            policy(serde_json::json!({
                "default": "allow",
                "rules": [ { "action": "deny", "proto": "tcp", "dst_port": 3306 } ]
            })),
        ),
        dpi,
        StageConfig::new(NfSpec::Reference(NfName::Monitor), Policy::new()),
    ])
}

/// Tenant i owns the generator's destination prefix i; the last tenant is policed to
/// show MAX_NB at work; the first runs its own chain.
fn demo_tenants(a: &DemoArgs) -> anyhow::Result<Vec<TenantConfig>> {
    let per_slot = per_slot(a);
    let policed = a.tenants;
    let mut tenants: Vec<TenantConfig> = (0..a.tenants)
        .map(|i| {
            let (addr, len) = tenant_dst_prefix(i);
            let prefix = format!("{addr}/{len}")
                .parse()
                .expect("generator prefixes are valid");
            let mut t = TenantConfig::new(
                TenantId(i + 1),
                vec![(
                    100,
                    Match {
                        dst_ip: Some(prefix),
                        ..Match::default()
                    },
                )],
            );
            t.name = format!("tenant-{:02}", i + 1);
            t.policy = demo_policy(&a.nf);
            t.max_nb = if i + 1 == policed {
                (per_slot / a.tenants as f64 * 0.5) as u64 + 1
            } else {
                0
            };
            t
        })
        .collect();
    if let Some(first) = tenants.first_mut() {
        first.chain = demo_chain()?;
    }
    Ok(tenants)
}

/// The policy every demo tenant gets for `nf`: empty (the NF's defaults) but for the
/// reference NFs that need one.
fn demo_policy(nf: &str) -> Policy {
    let v = match nf {
        "ids" => serde_json::json!({
            "rules": "alert tcp any any (msg:\"demo signature\"; content:\"attack\"; sid:1;)"
        }),
        "policer" => serde_json::json!({ "rate": 12_500_000, "burst": 65_536 }),
        _ => return Policy::new(),
    };
    match v {
        serde_json::Value::Object(m) => Policy::from_map(m),
        _ => Policy::new(),
    }
}

/// Mean packets per timeslot.
fn per_slot(a: &DemoArgs) -> f64 {
    a.rate * (1u64 << a.shift.min(63)) as f64 / 1e9
}

fn demo_with<N: RegisteredNf>(
    nf: N,
    a: &DemoArgs,
    base: PipelineConfig,
    tenants: &[TenantConfig],
) -> anyhow::Result<()> {
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    anyhow::ensure!(
        a.seconds > 0.0 && a.rate > 0.0,
        "--seconds and --rate must be positive"
    );
    let duration_ns = (a.seconds * 1e9) as u64;
    let slot_ns = 1u64 << a.shift;
    let per_slot = per_slot(a);
    let worker_max = a
        .worker_max
        .unwrap_or_else(|| ((per_slot * 0.6) as u64).max(1));
    let gen_cfg = GenConfig {
        seed: a.seed,
        tenants: a.tenants,
        duration_ns,
        mean_rate_pps: a.rate,
        ..GenConfig::default()
    };
    let source = Generator::new(gen_cfg)?;
    let policed = a.tenants;

    let cfg = PipelineConfig {
        worker_max_nb: worker_max,
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: a.shift,
                threshold: a.threshold,
            },
            planner: a.planner,
            ..DispatcherConfig::default()
        },
        ..base
    };
    let workers = cfg.workers;
    let nf_label = if a.nf == "monitor" {
        "Monitor NF".to_owned()
    } else {
        format!("NF {}", a.nf)
    };
    let mut p = Pipeline::new(nf, cfg)?;
    run::admit_all(&mut p, tenants, Path::new("(demo)"))?;

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(
        out,
        "buffet demo: {} tenants, {} workers, {nf_label}, seed {}, {:.1} virtual s at {:.0} pps mean",
        a.tenants, workers, a.seed, a.seconds, a.rate
    )?;
    writeln!(
        out,
        "timeslot 2^{} ns ({:.1} ms), worker MAX_NB {} packets/slot, overload threshold {}, planner {}, tenant {} MAX_NB {}",
        a.shift,
        slot_ns as f64 / 1e6,
        worker_max,
        a.threshold,
        a.planner.name(),
        policed,
        tenants.last().map_or(0, |t| t.max_nb)
    )?;
    let bar = run::progress(source.size_hint(), "demo");
    let (n, took) = run::drive(
        &mut p,
        Box::new(SourcePort::new(0, "generator", source)),
        &bar,
    )?;
    let report = p.finish();
    writeln!(out)?;
    run::print_tenants(&mut out, &report)?;
    writeln!(out)?;
    run::print_events(&mut out, &report, 25)?;
    for w in &report.workers {
        writeln!(out, "worker {}: {} packets", w.id, w.packets)?;
    }
    eprintln!(
        "{n} packets in {:.3} s wall ({:.2} Mpps through dispatcher + {} workers)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(1e-9) / 1e6,
        workers
    );
    let migrations = report
        .events
        .iter()
        .filter(|e| matches!(e, buffet_worker::WorkerEvent::Migration { .. }))
        .count();
    if migrations == 0 {
        writeln!(
            out,
            "note: no worker was overloaded; lower --worker-max to see migrations"
        )?;
    }
    Ok(())
}
