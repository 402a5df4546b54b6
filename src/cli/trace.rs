//! `buffet trace`: the timeslot scheduler alone over a `ts_ns,tenant_id` trace
//! ([`buffet_config::trace`] does the work; this reads the file and writes the output).

use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use buffet_config::trace;
use clap::Args;

/// `buffet trace` arguments.
#[derive(Args, Debug)]
pub struct TraceArgs {
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
    /// The scheduler implementation: rust (buffet-dispatch), c (nic-firmware/common built
    /// for the host) or xdp (nic-firmware/xdp in the kernel through BPF_PROG_TEST_RUN;
    /// needs CAP_BPF). Every engine prints the same bytes.
    #[arg(long, value_enum, default_value_t = trace::TraceEngine::Rust)]
    engine: trace::TraceEngine,
}

/// Runs `buffet trace`.
pub fn run(a: &TraceArgs) -> anyhow::Result<()> {
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
        engine: a.engine,
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
