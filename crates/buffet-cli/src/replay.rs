//! `buffet replay`: a pcap through the dispatcher and the workers running an NF.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use buffet_dispatch::{DispatcherConfig, SchedulerConfig};
use buffet_io::pcap::{PcapReader, PcapWriter};
use buffet_io::PacketSource;
use buffet_sdk::{NetworkFunction, PortId, Verdict};
use buffet_worker::{PacketSink, Pipeline, PipelineConfig, Report};
use clap::Args;

use crate::nfs::NfName;
use crate::run;

/// `buffet replay` arguments.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The NF every tenant runs.
    #[arg(long, value_enum)]
    pub nf: NfName,
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

struct PcapSink {
    writer: PcapWriter,
    error: Option<String>,
}

impl PacketSink for PcapSink {
    fn emit(&mut self, ts_ns: u64, _in_port: PortId, _verdict: Verdict, data: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.writer.write(ts_ns, data) {
                self.error = Some(e.to_string());
            }
        }
    }

    fn close(&mut self) -> Result<(), String> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.writer.flush().map_err(|e| e.to_string())
    }
}

pub fn run(a: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let tenants = crate::tenants::load(&a.tenants)?;
    crate::with_nf!(a.nf, |nf| replay_with(nf, a, &tenants))
}

fn replay_with<N: NetworkFunction>(
    nf: N,
    a: &ReplayArgs,
    tenants: &[crate::tenants::TenantConfig],
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
        ..PipelineConfig::default()
    };
    let mut source = PcapReader::open(&a.input)?;
    let mut p = Pipeline::new(nf, cfg)?;
    run::admit_all(&mut p, tenants, &a.tenants)?;
    if let Some(out) = &a.output {
        let writer = PcapWriter::create(out)?;
        p.set_sink(Box::new(PcapSink {
            writer,
            error: None,
        }));
    }
    let bar = run::progress(source.size_hint(), "replay");
    let (n, took) = run::drive(&mut p, &mut source, &bar)?;
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
