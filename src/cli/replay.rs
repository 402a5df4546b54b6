//! `buffet replay`: a pcap through the dispatcher and the workers running an NF — a
//! reference NF or a registered one (`--nf`), a C NF loaded from a shared object
//! (`--nf-lib`) or an eBPF NF from a clang BPF object (`--nf-ebpf`), at an isolation level
//! (`--isolation safe|mpk|trusted-native|ebpf`).
//!
//! Before anything runs, the outputs (`--output`, `--stats-json`) are checked: none may
//! be an input of the run (compared by device and inode), and each is opened as a
//! temporary file beside it ([`output`]), renamed into place when the run
//! succeeds. Records the capture cut short (snap length) are replayed as captured and
//! counted (`input.truncated` in the JSON).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use buffet_config::chain;
use buffet_config::isolation::{self, Isolation};
use buffet_config::registry::{
    EbpfEngine, LoadedNf, NfKind, NfName, NfSpec, NfVisitor, RegisteredNf,
};
use buffet_config::TenantConfig;
use buffet_dispatch::{DispatcherConfig, Planner, SchedulerConfig};
use buffet_io::pcap::{PcapCounters, PcapReader, PcapWriter};
use buffet_io::{PacketSource, SourcePort};
use buffet_memory::ArenaConfig;
use buffet_sdk::TenantId;
use buffet_worker::{Pipeline, PipelineConfig, Report, WorkerEvent};
use clap::Args;

use super::chain::{self as cli_chain, ChainRun};
use super::output::{self, OutputFile};
use super::registry::{Registry, Selected, Visit};
use super::run::{self, Capacity};

/// Which NF the tenants run, under which isolation, and the tenants file: the flags
/// `buffet replay` and `buffet run` share.
#[derive(Args, Debug)]
pub struct NfChoice {
    /// The NF every tenant runs: a reference NF or one registered by the program. With
    /// chains in the tenants file (docs/chains.md) it is the one-stage chain of the
    /// tenants that name none, and optional when every tenant names one.
    #[arg(
        long,
        value_name = "NF",
        conflicts_with_all = ["nf_lib", "nf_ebpf"]
    )]
    pub nf: Option<String>,
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
    /// for C NFs), `trusted-native` (C NFs you trust on a CPU without protection keys:
    /// guard pages and fault containment, NO hardware isolation) or `ebpf` (verified
    /// bytecode; required for --nf-ebpf).
    /// Default: the tenants file's `isolation` if every tenant names the same one, else
    /// `mpk` with --nf-lib or when a chain stage of the tenants file is a C NF (`c:...`),
    /// `ebpf` with --nf-ebpf, and `safe` with --nf otherwise. On a CPU without protection
    /// keys, pass `--isolation trusted-native` to run C NFs.
    #[arg(long, value_enum)]
    pub isolation: Option<Isolation>,
    /// The tenants file: TOML (`.toml`) or JSON (`.json`).
    #[arg(long)]
    pub tenants: PathBuf,
}

impl NfChoice {
    /// The NF the flags name.
    pub(crate) fn chosen(&self, registry: &Registry) -> anyhow::Result<Chosen> {
        choose(
            self.nf.as_deref(),
            self.nf_lib.as_deref(),
            self.nf_ebpf.as_deref(),
            self.ebpf_engine,
            registry,
        )
    }

    /// The files these flags name, by flag (the run reads them).
    pub(crate) fn inputs(&self) -> Vec<(&'static str, &Path)> {
        let mut v = vec![("--tenants", self.tenants.as_path())];
        if let Some(p) = &self.nf_lib {
            v.push(("--nf-lib", p));
        }
        if let Some(p) = &self.nf_ebpf {
            v.push(("--nf-ebpf", p));
        }
        v
    }
}

/// `buffet replay` arguments.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The NF, its isolation and the tenants file.
    #[command(flatten)]
    pub choice: NfChoice,
    /// The pcap to replay (Ethernet link type).
    #[arg(long)]
    pub input: PathBuf,
    /// Write the packets the NF passes to this pcap (never the --input file).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Threads, arena and Tenant Table slots.
    #[command(flatten)]
    pub capacity: Capacity,
    /// Each worker's MAX_NB per timeslot (0 = unlimited: never overloaded).
    #[arg(long, default_value_t = 0)]
    pub worker_max: u64,
    /// Timeslot = timestamp_ns >> shift.
    #[arg(long, default_value_t = 30)]
    pub shift: u32,
    /// Overload reports once a worker's TIMES exceeds this.
    #[arg(long, default_value_t = 3)]
    pub threshold: u32,
    /// Who moves tenants off overloaded workers: greedy (the paper's Algorithm 1, per
    /// packet) or ours (a plan at every timeslot boundary; docs/scheduler.md).
    #[arg(long, default_value = "greedy")]
    pub planner: Planner,
    /// Write per-tenant statistics as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Do not pin workers to cores.
    #[arg(long)]
    pub no_pin: bool,
}

/// The NF the arguments name, before it is loaded (shared with `buffet run`).
pub(crate) enum Chosen {
    /// A reference, C or eBPF NF.
    Spec(NfSpec),
    /// An NF registered by name.
    Registered(String),
    /// None: only a run whose every tenant names its own chain can go on.
    Nothing,
}

impl ReplayArgs {
    /// The NF the arguments name.
    fn chosen(&self, registry: &Registry) -> anyhow::Result<Chosen> {
        self.choice.chosen(registry)
    }

    /// The files the run reads, by flag.
    fn inputs(&self) -> Vec<(&'static str, &Path)> {
        let mut v = vec![("--input", self.input.as_path())];
        v.extend(self.choice.inputs());
        v
    }

    /// The files the run writes, by flag.
    fn outputs(&self) -> Vec<(&'static str, &Path)> {
        let mut v = Vec::new();
        if let Some(p) = &self.output {
            v.push(("--output", p.as_path()));
        }
        if let Some(p) = &self.stats_json {
            v.push(("--stats-json", p.as_path()));
        }
        v
    }
}

/// The NF `--nf`, `--nf-lib` or `--nf-ebpf` names (shared with `buffet run`).
pub(crate) fn choose(
    nf: Option<&str>,
    nf_lib: Option<&Path>,
    nf_ebpf: Option<&Path>,
    ebpf_engine: EbpfEngine,
    registry: &Registry,
) -> anyhow::Result<Chosen> {
    Ok(match (nf_lib, nf_ebpf, nf) {
        (Some(lib), _, _) => Chosen::Spec(NfSpec::C(lib.to_owned())),
        (None, Some(obj), _) => Chosen::Spec(NfSpec::Ebpf {
            path: obj.to_owned(),
            engine: ebpf_engine,
        }),
        (None, None, Some(name)) if registry.is_registered(name) => {
            Chosen::Registered(name.to_owned())
        }
        (None, None, Some(name)) => Chosen::Spec(NfSpec::Reference(name.parse()?)),
        (None, None, None) => Chosen::Nothing,
    })
}

/// The scheduler and placement flags `replay` and `run` share, applied to `cfg`:
/// `--worker-max` (0 = no limit), `--shift`, `--threshold`, `--planner` and pinning.
pub(crate) fn set_schedule(
    cfg: &mut PipelineConfig,
    worker_max: u64,
    sched: SchedulerConfig,
    planner: Planner,
    pin: bool,
) {
    cfg.worker_max_nb = if worker_max == 0 {
        u64::MAX
    } else {
        worker_max
    };
    cfg.dispatcher = DispatcherConfig {
        sched,
        planner,
        ..DispatcherConfig::default()
    };
    cfg.pin = pin;
}

/// The isolation level of a run of `chosen` over `tenants` (read from `file`), saying on
/// stderr how many protection keys MPK has (shared with `buffet run`).
pub(crate) fn isolation_level(
    requested: Option<Isolation>,
    chosen: &Chosen,
    tenants: &[TenantConfig],
    file: &Path,
) -> anyhow::Result<Isolation> {
    // A registered NF is safe Rust, resolved like a reference NF.
    let kind_of = match chosen {
        Chosen::Spec(spec) => spec.clone(),
        Chosen::Registered(_) => NfSpec::Reference(NfName::Monitor),
        Chosen::Nothing => anyhow::bail!(NO_NF),
    };
    let level = isolation::resolve(requested, &kind_of, tenants, file)?;
    announce_mpk(level, requested, chosen, tenants, file)?;
    Ok(level)
}

/// At the `mpk` level: checks the CPU's protection keys and says how many cache tenant
/// regions. When the level was nobody's choice (no `--isolation`, no `isolation` in
/// the tenants file) and MPK is unavailable, the error says `mpk` is the default for
/// the C NF of the run, and how to run it without protection keys.
pub(crate) fn announce_mpk(
    level: Isolation,
    requested: Option<Isolation>,
    chosen: &Chosen,
    tenants: &[TenantConfig],
    file: &Path,
) -> anyhow::Result<()> {
    if level != Isolation::Mpk {
        return Ok(());
    }
    let mpk = match (isolation::mpk(), requested) {
        (Ok(mpk), _) => mpk,
        (Err(e), Some(_)) => return Err(e.into()),
        (Err(isolation::IsolationError::MpkUnavailable(e)), None) => {
            return Err(mpk_default_error(&e, chosen, tenants, file))
        }
        (Err(e), None) => return Err(e.into()),
    };
    eprintln!(
        "isolation: mpk ({} protection keys cache tenant regions)",
        mpk.cache_keys()
    );
    Ok(())
}

/// The error of a run whose `mpk` level came from a default (no `--isolation`) on a
/// machine without protection keys: who chose `mpk` and what to pass instead.
fn mpk_default_error(
    e: &buffet_memory::MpkError,
    chosen: &Chosen,
    tenants: &[TenantConfig],
    file: &Path,
) -> anyhow::Error {
    const TRUSTED: &str = "to run native NF code you trust without hardware isolation \
        (guard pages and fault containment only; docs/isolation.md)";
    if !tenants.is_empty() && tenants.iter().all(|t| t.isolation == Some(Isolation::Mpk)) {
        return anyhow::anyhow!(
            "{}: every tenant names isolation \"mpk\", and {e}; {TRUSTED}, name isolation \
             \"trusted-native\" there instead",
            file.display()
        );
    }
    let which = match chosen {
        Chosen::Spec(NfSpec::C(lib)) => format!("--nf-lib {}", lib.display()),
        _ => tenants
            .iter()
            .find_map(|t| {
                let k = t.chain.iter().position(|s| s.nf.kind() == NfKind::C)?;
                Some(format!(
                    "{}: tenant {} ({:?}): chain[{k}].nf = {:?}",
                    file.display(),
                    t.id,
                    t.name,
                    t.chain[k].nf.to_string()
                ))
            })
            .unwrap_or_else(|| "this run".to_owned()),
    };
    anyhow::anyhow!(
        "no --isolation given: the default isolation level for a C NF ({which}) is mpk, \
         and {e}; pass --isolation trusted-native {TRUSTED}"
    )
}

/// Loads `chosen` at `level` and hands it, as its own type, to `visitor` (a registered
/// NF through `wrap`, which names the command) (shared with `buffet run`).
pub(crate) fn load_and_visit<'v, V>(
    chosen: Chosen,
    level: Isolation,
    registry: &Registry,
    visitor: V,
    wrap: impl FnOnce(V) -> Visit<'v>,
) -> anyhow::Result<()>
where
    V: NfVisitor<Output = anyhow::Result<()>>,
{
    match chosen {
        Chosen::Spec(spec) => {
            let nf = spec.load_at(level)?;
            if let (LoadedNf::Ebpf(nf), Some(obj)) = (&nf, spec.path()) {
                let p = nf.program();
                eprintln!(
                    "isolation: ebpf ({}: {} instructions verified, engine {})",
                    obj.display(),
                    p.verified().instructions,
                    p.engine().name()
                );
            }
            nf.visit(visitor)
        }
        Chosen::Registered(name) => match registry.select(&name) {
            Some(Selected::Registered(nf)) => nf.run(wrap(visitor)),
            _ => anyhow::bail!("NF {name:?} is not registered"),
        },
        Chosen::Nothing => anyhow::bail!(NO_NF),
    }
}

/// The error of a run that names no NF while a tenant has no chain of its own.
const NO_NF: &str = "give --nf, --nf-lib or --nf-ebpf";

/// The isolation level of a run and, when a tenant names a chain, the tenants as the
/// chain admits them (each one's policy is its chain) (shared with `buffet run`).
pub(crate) fn plan(
    requested: Option<Isolation>,
    chosen: &Chosen,
    tenants: &[TenantConfig],
    file: &Path,
) -> anyhow::Result<(Isolation, Option<Vec<TenantConfig>>)> {
    if chain::any_chain(tenants) {
        let level = cli_chain::level(requested, chosen, tenants, file)?;
        Ok((level, Some(chain::chained_tenants(tenants))))
    } else {
        Ok((isolation_level(requested, chosen, tenants, file)?, None))
    }
}

/// [`load_and_visit`], with a chain around the NF when `chain` gives the tenants as the
/// file names them and the file; `arena` is the run's, which every tenant's chain region
/// must fit (shared with `buffet run`).
pub(crate) fn visit_run<'v, V>(
    chosen: Chosen,
    level: Isolation,
    chain: Option<(&'v [TenantConfig], &'v Path)>,
    arena: &ArenaConfig,
    registry: &'v Registry,
    visitor: V,
    wrap: impl FnOnce(V) -> Visit<'v>,
) -> anyhow::Result<()>
where
    V: NfVisitor<Output = anyhow::Result<()>>,
{
    // Said once, before anything is loaded: when the run's NF is native code (a C NF or
    // a reference NF run at this level) or a chain stage is a C NF.
    let native_stage = chain.is_some_and(|(tenants, _)| {
        chain::stage_specs(tenants)
            .iter()
            .any(|s| s.kind() == NfKind::C)
    });
    if level == Isolation::TrustedNative && (matches!(chosen, Chosen::Spec(_)) || native_stage) {
        eprintln!("{}", isolation::TRUSTED_NATIVE_WARNING);
    }
    match chain {
        Some((tenants, file)) => {
            let run = ChainRun {
                tenants,
                level,
                file,
                registry,
                largest_region: arena.largest_region(),
            };
            cli_chain::visit(chosen, run, registry, visitor, wrap)
        }
        None => load_and_visit(chosen, level, registry, visitor, wrap),
    }
}

/// Runs `buffet replay` with the NFs of `registry`.
pub fn run(a: &ReplayArgs, registry: &Registry) -> anyhow::Result<()> {
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let mut cfg = PipelineConfig::default();
    a.capacity.apply(&mut cfg)?;
    let chosen = a.chosen(registry)?;
    // Outputs first: nothing may be opened for writing that is an input.
    output::refuse_same_files(&a.inputs(), &a.outputs())?;
    let outputs = Outputs {
        pcap: a
            .output
            .as_deref()
            .map(|p| OutputFile::create("--output", p))
            .transpose()?,
        stats: a
            .stats_json
            .as_deref()
            .map(|p| OutputFile::create("--stats-json", p))
            .transpose()?,
    };
    let tenants = cli_chain::load_tenants(&a.choice.tenants, registry)?;
    let (level, chained) = plan(a.choice.isolation, &chosen, &tenants, &a.choice.tenants)?;
    let mut source = PcapReader::open(&a.input)?;
    if source.is_at_end()? {
        anyhow::bail!(
            "{}: the pcap holds no packets (only its global header): nothing to replay",
            a.input.display()
        );
    }
    let sched = SchedulerConfig {
        shift: a.shift,
        threshold: a.threshold,
    };
    set_schedule(&mut cfg, a.worker_max, sched, a.planner, !a.no_pin);
    cfg.domain = level.domain();
    let counters = source.counters();
    let arena = cfg.arena;
    let replay = Replay {
        a,
        tenants: chained.as_deref().unwrap_or(&tenants),
        cfg,
        source,
        counters,
        outputs,
    };
    let chain = chained
        .is_some()
        .then_some((tenants.as_slice(), a.choice.tenants.as_path()));
    visit_run(chosen, level, chain, &arena, registry, replay, |r| {
        Visit::Replay(Box::new(r))
    })
}

/// The files a replay writes, opened before it starts.
struct Outputs {
    pcap: Option<OutputFile>,
    stats: Option<OutputFile>,
}

/// Replays with whichever NF was loaded.
pub(crate) struct Replay<'a> {
    a: &'a ReplayArgs,
    tenants: &'a [TenantConfig],
    cfg: PipelineConfig,
    source: PcapReader,
    counters: PcapCounters,
    outputs: Outputs,
}

impl NfVisitor for Replay<'_> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        replay_with(nf, self)
    }
}

fn replay_with<N: RegisteredNf>(nf: N, r: Replay<'_>) -> anyhow::Result<()> {
    let Replay {
        a,
        tenants,
        cfg,
        source,
        counters,
        mut outputs,
    } = r;
    let mut p = Pipeline::new(nf, cfg)?;
    run::admit_all(&mut p, tenants, &a.choice.tenants)?;
    let bar = run::progress(source.size_hint(), "replay");
    // The pcap is port 0: Pass, Tx and Forward(0) go to --output.
    let mut port = SourcePort::new(0, format!("pcap:{}", a.input.display()), source);
    if let Some(out) = &mut outputs.pcap {
        let file = out.take_file().context("--output opened twice")?;
        port = port.with_output(PcapWriter::new(file, out.path())?);
    }
    let (n, took) = run::drive(&mut p, Box::new(port), &bar)?;
    let faults = p.nf().contained_faults();
    let report = p.finish();
    if let Some(e) = &report.sink_error {
        anyhow::bail!(
            "writing {}: {e}",
            a.output.as_deref().unwrap_or(a.input.as_path()).display()
        );
    }
    let truncated = counters.truncated();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run::print_tenants(&mut out, &report)?;
    if truncated > 0 {
        writeln!(
            out,
            "input {truncated} of {n} records truncated by the capture's snap length (replayed as captured)"
        )?;
    }
    run::print_events(&mut out, &report, EVENTS_SHOWN)?;
    print_faults(&mut out, &report.events, &faults, EVENTS_SHOWN)?;
    eprintln!(
        "replayed {n} packets in {:.3} s ({:.2} Mpps)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(1e-9) / 1e6
    );
    if let Some(pcap) = outputs.pcap.take() {
        pcap.commit()?;
    }
    if let Some(mut stats) = outputs.stats.take() {
        let input = serde_json::json!({
            "file": a.input.display().to_string(),
            "packets": n,
            "truncated": truncated,
        });
        write_stats(&mut stats, &report, input)?;
        stats.commit()?;
    }
    Ok(())
}

/// How many scheduler events a run's text report lists (the rest are counted).
pub(crate) const EVENTS_SHOWN: usize = 20;

/// Prints the NF's contained faults (`tenant N: reason`, from
/// [`RegisteredNf::contained_faults`]) that the first `shown` events (the ones
/// [`run::print_events`] listed) do not already say: a tenant's quarantine event carries
/// the NF's reason, and printing it again as a `contained fault:` line says it twice. A
/// fault whose details the event lacks (a C NF's signal and address behind a chain
/// stage's "reported a fault"), or whose event is past the listed ones, is printed
/// (shared with `buffet run`).
pub(crate) fn print_faults(
    out: &mut dyn Write,
    events: &[WorkerEvent],
    faults: &[String],
    shown: usize,
) -> std::io::Result<()> {
    // Each listed quarantine event accounts for at most one contained fault.
    let mut listed: Vec<Option<(TenantId, &str)>> = events
        .iter()
        .take(shown)
        .filter_map(|e| match e {
            WorkerEvent::Fault {
                tenant, message, ..
            } => Some(Some((*tenant, message.as_str()))),
            _ => None,
        })
        .collect();
    for f in faults {
        let said = f.split_once(": ").and_then(|(who, reason)| {
            let tenant = TenantId(who.strip_prefix("tenant ")?.parse().ok()?);
            listed.iter().position(|l| {
                l.is_some_and(|(t, message)| t == tenant && message.ends_with(reason))
            })
        });
        match said {
            Some(i) => listed[i] = None,
            None => writeln!(out, "  contained fault: {f}")?,
        }
    }
    Ok(())
}

/// The report as JSON, with an `input` section saying what the run read (replay:
/// `{"file", "packets", "truncated"}`) (shared with `buffet run`).
pub(crate) fn write_stats(
    out: &mut OutputFile,
    report: &Report,
    input: serde_json::Value,
) -> anyhow::Result<()> {
    let mut json = serde_json::to_value(report)?;
    if let Some(obj) = json.as_object_mut() {
        obj.insert("input".to_owned(), input);
    }
    // Each chained tenant's stages, in chain order (additive: `nf` keeps the flat keys).
    if let Some(rows) = json.get_mut("tenants").and_then(|t| t.as_array_mut()) {
        for (row, t) in rows.iter_mut().zip(&report.tenants) {
            let stages = chain::stage_rows(&t.nf);
            if let (false, Some(obj)) = (stages.is_empty(), row.as_object_mut()) {
                obj.insert("chain".to_owned(), serde_json::to_value(stages)?);
            }
        }
    }
    let mut f = std::io::BufWriter::new(out.take_file().context("--stats-json opened twice")?);
    serde_json::to_writer_pretty(&mut f, &json)
        .map_err(std::io::Error::from)
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.flush())
        .map_err(|e| out.write_error(e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([192, 168, 1, 10], dst, 64)
            .udp(40000, dport)
            .write(&mut v, b"payload")
            .unwrap();
        v
    }

    fn args(dir: &std::path::Path, nf: NfName, tenants: &str, stats: &str) -> ReplayArgs {
        ReplayArgs {
            choice: NfChoice {
                nf: Some(nf.name().to_owned()),
                nf_lib: None,
                nf_ebpf: None,
                ebpf_engine: EbpfEngine::Interpreter,
                isolation: None,
                tenants: dir.join(tenants),
            },
            input: dir.join("in.pcap"),
            output: None,
            capacity: Capacity::default(),
            worker_max: 0,
            shift: 30,
            threshold: 3,
            planner: Planner::Greedy,
            stats_json: Some(dir.join(stats)),
            no_pin: true,
        }
    }

    fn run_default(a: &ReplayArgs) -> anyhow::Result<()> {
        run(a, &Registry::new())
    }

    /// What a run did per tenant, without the timings.
    fn outcome(path: &std::path::Path) -> Vec<serde_json::Value> {
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        json["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                serde_json::json!([
                    t["id"],
                    t["name"],
                    t["packets"],
                    t["passed"],
                    t["drops"],
                    t["nf"]
                ])
            })
            .collect()
    }

    #[test]
    fn a_json_tenants_file_replays_like_the_toml_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = PcapWriter::create(dir.path().join("in.pcap")).unwrap();
        for i in 0..40u64 {
            let port = if i % 2 == 0 { 53 } else { 123 };
            w.write(i * 1000, &udp([10, 7 + (i % 2) as u8, 0, 1], port))
                .unwrap();
        }
        w.flush().unwrap();
        std::fs::write(
            dir.path().join("t.toml"),
            r#"
[[tenant]]
id = 7
name = "dns-only"
rules = [ { dst_ip = "10.7.0.0/16" } ]
[tenant.policy]
default = "deny"
rules = [ { action = "allow", proto = "udp", dst_port = 53 } ]

[[tenant]]
id = 8
rules = [ { dst_ip = "10.8.0.0/16", protocol = "udp", dst_port = "100-200" } ]
[tenant.policy]
default = "allow"
rules = [ { action = "deny", proto = "udp", dst_port = "120-130" } ]
"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("t.json"),
            r#"{ "tenant": [
  { "id": 7, "name": "dns-only", "rules": [ { "dst_ip": "10.7.0.0/16" } ],
    "policy": { "default": "deny",
                "rules": [ { "action": "allow", "proto": "udp", "dst_port": 53 } ] } },
  { "id": 8, "rules": [ { "dst_ip": "10.8.0.0/16", "protocol": "udp", "dst_port": "100-200" } ],
    "policy": { "default": "allow",
                "rules": [ { "action": "deny", "proto": "udp", "dst_port": "120-130" } ] } } ] }"#,
        )
        .unwrap();
        run_default(&args(dir.path(), NfName::Firewall, "t.toml", "toml.json")).unwrap();
        run_default(&args(dir.path(), NfName::Firewall, "t.json", "json.json")).unwrap();
        let (from_toml, from_json) = (
            outcome(&dir.path().join("toml.json")),
            outcome(&dir.path().join("json.json")),
        );
        assert_eq!(from_toml, from_json);
        // Tenant 7 passed its 20 DNS packets; tenant 8 denied all 20 of port 123.
        assert_eq!(from_toml[0][2], 20);
        assert_eq!(from_toml[0][3], 20);
        assert_eq!(from_toml[1][2], 20);
        assert_eq!(from_toml[1][3], 0);
    }

    #[test]
    fn other_tenants_file_extensions_are_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.yaml"), "tenant: []\n").unwrap();
        let a = args(dir.path(), NfName::Monitor, "t.yaml", "stats.json");
        let e = format!("{:#}", run_default(&a).unwrap_err());
        assert!(
            e.ends_with("t.yaml: a tenants file is .toml or .json"),
            "{e}"
        );
        assert!(!dir.path().join("stats.json").exists());
    }

    #[test]
    fn a_fault_its_quarantine_event_already_says_is_printed_once() {
        let fault = |tenant, message: &str| WorkerEvent::Fault {
            tenant: TenantId(tenant),
            worker: 1,
            message: message.to_owned(),
        };
        let events = [
            fault(
                2,
                "the NF reported a fault (Verdict::Fault): return value 0xdead is not a verdict",
            ),
            fault(
                3,
                "the NF reported a fault (Verdict::Fault): chain stage 1 (c): reported a fault",
            ),
            fault(
                5,
                "the NF reported a fault (Verdict::Fault): return value 0xbad is not a verdict",
            ),
        ];
        let faults = [
            "tenant 2: return value 0xdead is not a verdict".to_owned(),
            // What the event does not say: printed.
            "tenant 3: buffet_pkt_handler raised SIGSEGV at 0x0 (address not mapped)".to_owned(),
            // Said by tenant 2's event, but that event already accounts for one fault.
            "tenant 2: return value 0xdead is not a verdict".to_owned(),
            // Tenant 5's event is past the listed ones.
            "tenant 5: return value 0xbad is not a verdict".to_owned(),
        ];
        let mut out = Vec::new();
        print_faults(&mut out, &events, &faults, 2).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  contained fault: tenant 3: buffet_pkt_handler raised SIGSEGV at 0x0 (address not mapped)\n\
             \x20 contained fault: tenant 2: return value 0xdead is not a verdict\n\
             \x20 contained fault: tenant 5: return value 0xbad is not a verdict\n"
        );
        // Every event listed and each fault said by one: nothing more to print.
        let mut out = Vec::new();
        print_faults(
            &mut out,
            &events,
            &[faults[0].clone(), faults[3].clone()],
            20,
        )
        .unwrap();
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    }
}
