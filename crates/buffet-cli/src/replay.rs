//! `buffet replay`: a pcap through the dispatcher and the workers running an NF — a
//! reference NF (`--nf`), a C NF loaded from a shared object (`--nf-lib`) or an eBPF NF
//! from a clang BPF object (`--nf-ebpf`), at an isolation level
//! (`--isolation safe|mpk|ebpf`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use buffet_dispatch::{DispatcherConfig, SchedulerConfig};
use buffet_io::pcap::{PcapReader, PcapWriter};
use buffet_io::{PacketSource, SourcePort};
use buffet_memory::{Domain, Mpk};
use buffet_sdk::NetworkFunction;
use buffet_worker::{Pipeline, PipelineConfig, Report};
use clap::Args;

use crate::ebpf::EbpfEngine;
use crate::nfs::NfName;
use crate::run;
use crate::tenants::{Isolation, TenantConfig};

/// `buffet replay` arguments.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The NF every tenant runs (a reference NF).
    #[arg(
        long,
        value_enum,
        required_unless_present_any = ["nf_lib", "nf_ebpf"],
        conflicts_with_all = ["nf_lib", "nf_ebpf"]
    )]
    pub nf: Option<NfName>,
    /// Run a C NF instead: a shared object implementing include/buffet.h.
    #[arg(long, value_name = "PATH", conflicts_with = "nf_ebpf")]
    pub nf_lib: Option<PathBuf>,
    /// Run an eBPF NF instead: a `clang -target bpf` object (include/buffet_ebpf.h of
    /// buffet-ebpf), verified before anything runs; implies `--isolation ebpf`.
    #[arg(long, value_name = "PATH")]
    pub nf_ebpf: Option<PathBuf>,
    /// How eBPF NFs run.
    #[arg(long, value_enum, default_value_t = EbpfEngine::Interpreter)]
    pub ebpf_engine: EbpfEngine,
    /// Isolation level: `safe` (type system; Rust NFs), `mpk` (Intel protection keys;
    /// required for C NFs) or `ebpf` (verified bytecode; required for --nf-ebpf).
    /// Default: the tenants file's `isolation` if every tenant names the same one, else
    /// `mpk` with --nf-lib, `ebpf` with --nf-ebpf and `safe` with --nf.
    #[arg(long, value_enum)]
    pub isolation: Option<Isolation>,
    /// The tenants file (TOML).
    #[arg(long)]
    pub tenants: PathBuf,
    /// The pcap to replay (Ethernet link type).
    #[arg(long)]
    pub input: PathBuf,
    /// Write the packets the NF passes to this pcap.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: u16,
    /// Each worker's MAX_NB per timeslot (0 = unlimited: never overloaded).
    #[arg(long, default_value_t = 0)]
    pub worker_max: u64,
    /// Timeslot = timestamp_ns >> shift.
    #[arg(long, default_value_t = 30)]
    pub shift: u32,
    /// Overload reports once a worker's TIMES exceeds this.
    #[arg(long, default_value_t = 3)]
    pub threshold: u32,
    /// Write per-tenant statistics as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Do not pin workers to cores.
    #[arg(long)]
    pub no_pin: bool,
}

pub fn run(a: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let tenants = crate::tenants::load(&a.tenants)?;
    let level = isolation_level(a, &tenants)?;
    let domain = match (level, &a.nf_lib) {
        (Isolation::Ebpf, Some(lib)) => anyhow::bail!(
            "--isolation ebpf cannot run the C NF {}: it runs verified eBPF programs only \
             (--nf-ebpf path/to/nf.o); use --isolation mpk",
            lib.display()
        ),
        (Isolation::Ebpf, None) if a.nf_ebpf.is_none() => anyhow::bail!(
            "--isolation ebpf runs eBPF NFs: give --nf-ebpf path/to/nf.o (see `buffet nf check`)"
        ),
        // The verifier and the VM isolate eBPF tenants; regions need no hardware domain.
        (Isolation::Ebpf, _) => Domain::None,
        (_, _) if a.nf_ebpf.is_some() => anyhow::bail!(
            "--nf-ebpf runs under --isolation ebpf, not {}",
            level.name()
        ),
        (Isolation::Safe, Some(lib)) => anyhow::bail!(
            "--isolation safe cannot run the C NF {}: native code is not isolated by the \
             type system; use --isolation mpk",
            lib.display()
        ),
        (Isolation::Safe, None) => Domain::None,
        (Isolation::Mpk, _) => {
            let mpk = Mpk::get().context("--isolation mpk")?;
            eprintln!(
                "isolation: mpk ({} protection keys cache tenant regions)",
                mpk.cache_keys()
            );
            Domain::Mpk
        }
    };
    if let Some(obj) = &a.nf_ebpf {
        let opts = buffet_ebpf::LoadOptions {
            engine: a.ebpf_engine.into(),
            ..buffet_ebpf::LoadOptions::default()
        };
        let nf = buffet_ebpf::EbpfNf::from_file(obj, opts)?;
        let p = nf.program();
        eprintln!(
            "isolation: ebpf ({}: {} instructions verified, engine {})",
            obj.display(),
            p.verified().instructions,
            p.engine().name()
        );
        return replay_with(nf, a, &tenants, domain, |nf| {
            nf.faults().iter().map(ToString::to_string).collect()
        });
    }
    match (&a.nf_lib, a.nf) {
        (Some(lib), _) => {
            let nf = buffet_cnf::CNf::load(lib)?;
            replay_with(nf, a, &tenants, domain, |nf| {
                nf.faults().iter().map(ToString::to_string).collect()
            })
        }
        (None, Some(name)) => {
            crate::with_nf!(name, |nf| replay_with(nf, a, &tenants, domain, |_| {
                Vec::new()
            }))
        }
        (None, None) => anyhow::bail!("give --nf or --nf-lib"),
    }
}

/// The run's isolation level: `--isolation`, else the one every tenant names, else the
/// default for the kind of NF. Every tenant that names a level must get that one.
fn isolation_level(a: &ReplayArgs, tenants: &[TenantConfig]) -> anyhow::Result<Isolation> {
    let named: Vec<Isolation> = tenants.iter().filter_map(|t| t.isolation).collect();
    let level = a.isolation.unwrap_or_else(|| match named.first() {
        Some(&first) if named.len() == tenants.len() && named.iter().all(|&l| l == first) => first,
        _ if a.nf_lib.is_some() => Isolation::Mpk,
        _ if a.nf_ebpf.is_some() => Isolation::Ebpf,
        _ => Isolation::Safe,
    });
    if let Some(t) = tenants
        .iter()
        .find(|t| t.isolation.is_some_and(|l| l != level))
    {
        anyhow::bail!(
            "{}: tenant {} ({:?}) asks for isolation {} but this replay runs {}: one replay \
             runs one isolation level",
            a.tenants.display(),
            t.id,
            t.name,
            t.isolation.map_or("?", Isolation::name),
            level.name()
        );
    }
    Ok(level)
}

fn replay_with<N: NetworkFunction>(
    nf: N,
    a: &ReplayArgs,
    tenants: &[TenantConfig],
    domain: Domain,
    faults: impl FnOnce(&N) -> Vec<String>,
) -> anyhow::Result<()> {
    let cfg = PipelineConfig {
        workers: a.workers,
        worker_max_nb: if a.worker_max == 0 {
            u64::MAX
        } else {
            a.worker_max
        },
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: a.shift,
                threshold: a.threshold,
            },
            ..DispatcherConfig::default()
        },
        pin: !a.no_pin,
        domain,
        ..PipelineConfig::default()
    };
    let source = PcapReader::open(&a.input)?;
    let mut p = Pipeline::new(nf, cfg)?;
    run::admit_all(&mut p, tenants, &a.tenants)?;
    let bar = run::progress(source.size_hint(), "replay");
    // The pcap is port 0: Pass, Tx and Forward(0) go to --output.
    let mut port = SourcePort::new(0, format!("pcap:{}", a.input.display()), source);
    if let Some(out) = &a.output {
        port = port.with_output(PcapWriter::create(out)?);
    }
    let (n, took) = run::drive(&mut p, Box::new(port), &bar)?;
    let faults = faults(p.nf());
    let report = p.finish();
    if let Some(e) = &report.sink_error {
        anyhow::bail!(
            "writing {}: {e}",
            a.output.as_deref().unwrap_or(a.input.as_path()).display()
        );
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run::print_tenants(&mut out, &report)?;
    run::print_events(&mut out, &report, 20)?;
    for f in &faults {
        writeln!(out, "  contained fault: {f}")?;
    }
    eprintln!(
        "replayed {n} packets in {:.3} s ({:.2} Mpps)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(1e-9) / 1e6
    );
    if let Some(path) = &a.stats_json {
        write_stats(path, &report)?;
    }
    Ok(())
}

fn write_stats(path: &std::path::Path, report: &Report) -> anyhow::Result<()> {
    let mut f = std::fs::File::create(path).with_context(|| format!("{}", path.display()))?;
    serde_json::to_writer_pretty(&mut f, report)?;
    f.write_all(b"\n")?;
    Ok(())
}
