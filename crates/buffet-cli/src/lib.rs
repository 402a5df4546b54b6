//! `buffet`: the command-line front end.
//!
//! Offline commands, no daemon needed:
//! * `buffet demo` — synthetic multi-tenant traffic through the whole pipeline;
//! * `buffet replay` — a pcap through the same pipeline with a tenants file;
//! * `buffet trace` — the timeslot scheduler alone over a `ts_ns,tenant_id` trace;
//! * `buffet nf check file.o` — verify an eBPF NF and print the verifier's verdict.
#![forbid(unsafe_code)]

mod demo;
mod ebpf;
mod replay;
mod run;

use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use buffet_config::trace;
use clap::{Args, Parser, Subcommand};

/// Buffet: multi-tenant network functions, one process, thousands of tenants.
#[derive(Parser, Debug)]
#[command(name = "buffet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run synthetic multi-tenant traffic through the dispatcher and workers (no root, no NIC).
    Demo(demo::DemoArgs),
    /// Replay a pcap through the dispatcher and workers running an NF.
    Replay(replay::ReplayArgs),
    /// Run only the timeslot scheduler over a `ts_ns,tenant_id` trace.
    Trace(TraceArgs),
    /// Inspect NF programs: `buffet nf check file.o` verifies an eBPF NF.
    Nf(ebpf::NfArgs),
}

/// `buffet trace` arguments.
#[derive(Args, Debug)]
struct TraceArgs {
    /// The trace: one `ts_ns,tenant_id` line per packet.
    #[arg(long)]
    input: PathBuf,
    /// Number of workers K (initial placement: tenant_id mod K).
    #[arg(long)]
    workers: u16,
    /// Every worker's MAX_NB per timeslot.
    #[arg(long)]
    worker_max: u64,
    /// Every tenant's MAX_NB per timeslot (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    tenant_max: u64,
    /// Timeslot = ts_ns >> shift.
    #[arg(long, default_value_t = 30)]
    shift: u32,
    /// Overload reports once a worker's TIMES exceeds this.
    #[arg(long, default_value_t = 3)]
    threshold: u32,
}

/// Parses the command line and runs it; the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => demo::run(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Trace(a) => run_trace(&a),
        Command::Nf(a) => ebpf::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_trace(a: &TraceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(a.worker_max > 0, "--worker-max must be at least 1");
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let file =
        std::fs::File::open(&a.input).map_err(|e| anyhow::anyhow!("{}: {e}", a.input.display()))?;
    let cfg = trace::TraceConfig {
        workers: a.workers,
        worker_max: a.worker_max,
        tenant_max: a.tenant_max,
        shift: a.shift,
        threshold: a.threshold,
    };
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut out = BufWriter::new(stdout.lock());
    let mut err = BufWriter::new(stderr.lock());
    trace::run_trace(BufReader::new(file), &mut out, &mut err, &cfg)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.input.display()))?;
    out.flush()?;
    err.flush()?;
    Ok(())
}
