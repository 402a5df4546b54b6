//! `buffet replay`: a pcap through the dispatcher and the workers running an NF — a
//! reference NF (`--nf`), a C NF loaded from a shared object (`--nf-lib`) or an eBPF NF
//! from a clang BPF object (`--nf-ebpf`), at an isolation level
//! (`--isolation safe|mpk|trusted-native|ebpf`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use buffet_config::isolation::{self, Isolation};
use buffet_config::registry::{EbpfEngine, LoadedNf, NfName, NfSpec, NfVisitor, RegisteredNf};
use buffet_config::{tenants, TenantConfig};
use buffet_dispatch::{DispatcherConfig, SchedulerConfig};
use buffet_io::pcap::{PcapReader, PcapWriter};
use buffet_io::{PacketSource, SourcePort};
use buffet_memory::Domain;
use buffet_worker::{Pipeline, PipelineConfig, Report};
use clap::Args;

use super::run;

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
    /// for C NFs), `trusted-native` (C NFs you trust on a CPU without protection keys:
    /// guard pages and fault containment, NO hardware isolation) or `ebpf` (verified
    /// bytecode; required for --nf-ebpf).
    /// Default: the tenants file's `isolation` if every tenant names the same one, else
    /// `mpk` with --nf-lib, `ebpf` with --nf-ebpf and `safe` with --nf.
    #[arg(long, value_enum)]
    pub isolation: Option<Isolation>,
    /// The tenants file: TOML (`.toml`) or JSON (`.json`).
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

impl ReplayArgs {
    /// The NF the arguments name.
    fn nf_spec(&self) -> anyhow::Result<NfSpec> {
        Ok(match (&self.nf_lib, &self.nf_ebpf, self.nf) {
            (Some(lib), _, _) => NfSpec::C(lib.clone()),
            (None, Some(obj), _) => NfSpec::Ebpf {
                path: obj.clone(),
                engine: self.ebpf_engine,
            },
            (None, None, Some(name)) => NfSpec::Reference(name),
            (None, None, None) => anyhow::bail!("give --nf or --nf-lib"),
        })
    }
}

pub fn run(a: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let spec = a.nf_spec()?;
    let tenants = tenants::load(&a.tenants)?;
    let level = isolation::resolve(a.isolation, &spec, &tenants, &a.tenants)?;
    if level == Isolation::Mpk {
        let mpk = isolation::mpk()?;
        eprintln!(
            "isolation: mpk ({} protection keys cache tenant regions)",
            mpk.cache_keys()
        );
    }
    if level == Isolation::TrustedNative {
        eprintln!("{}", isolation::TRUSTED_NATIVE_WARNING);
    }
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
    nf.visit(Replay {
        a,
        tenants: &tenants,
        domain: level.domain(),
    })
}

/// Replays with whichever NF was loaded.
struct Replay<'a> {
    a: &'a ReplayArgs,
    tenants: &'a [TenantConfig],
    domain: Domain,
}

impl NfVisitor for Replay<'_> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        replay_with(nf, self.a, self.tenants, self.domain)
    }
}

fn replay_with<N: RegisteredNf>(
    nf: N,
    a: &ReplayArgs,
    tenants: &[TenantConfig],
    domain: Domain,
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
    let faults = p.nf().contained_faults();
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
            nf: Some(nf),
            nf_lib: None,
            nf_ebpf: None,
            ebpf_engine: EbpfEngine::Interpreter,
            isolation: None,
            tenants: dir.join(tenants),
            input: dir.join("in.pcap"),
            output: None,
            workers: 2,
            worker_max: 0,
            shift: 30,
            threshold: 3,
            stats_json: Some(dir.join(stats)),
            no_pin: true,
        }
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
        run(&args(dir.path(), NfName::Firewall, "t.toml", "toml.json")).unwrap();
        run(&args(dir.path(), NfName::Firewall, "t.json", "json.json")).unwrap();
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
        let e = format!("{:#}", run(&a).unwrap_err());
        assert!(
            e.ends_with("t.yaml: a tenants file is .toml or .json"),
            "{e}"
        );
        assert!(!dir.path().join("stats.json").exists());
    }
}
