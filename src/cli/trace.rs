//! `buffet trace`: the timeslot scheduler alone over a `ts_ns,tenant_id` trace
//! (`--input`), or the classifier and the scheduler over a `ts_ns,hex_frame` trace of
//! whole frames with a tenants file (`--frames`, `--tenants`)
//! ([`buffet_config::trace`] does the work; this reads the files and writes the output).

use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use buffet_config::trace;
use clap::Args;

use super::registry::Registry;

/// `buffet trace` arguments.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The trace: one `ts_ns,tenant_id` line per packet.
    #[arg(long, required_unless_present = "frames", conflicts_with_all = ["frames", "tenants"])]
    input: Option<PathBuf>,
    /// A trace of whole frames: one `ts_ns,hex_frame` line per frame (needs --tenants).
    #[arg(long, requires = "tenants")]
    frames: Option<PathBuf>,
    /// With --frames: the tenants file (TOML or JSON, as for replay and run) whose rules
    /// classify the frames; tenants get slots in file order, worker tenant_id mod K, and
    /// MAX_NB their max_nb (0: --tenant-max).
    #[arg(long, requires = "frames")]
    tenants: Option<PathBuf>,
    /// Number of workers K (initial placement: tenant_id mod K).
    #[arg(long)]
    workers: u16,
    /// Every worker's MAX_NB per timeslot.
    #[arg(long)]
    worker_max: u64,
    /// Every tenant's MAX_NB per timeslot (0 = unlimited); with --frames, of the tenants
    /// whose max_nb is 0.
    #[arg(long, default_value_t = 0)]
    tenant_max: u64,
    /// Timeslot = ts_ns >> shift.
    #[arg(long, default_value_t = 30)]
    shift: u32,
    /// Overload reports once a worker's TIMES exceeds this.
    #[arg(long, default_value_t = 3)]
    threshold: u32,
    /// The implementation: rust (buffet-dispatch), c (nic-firmware/common built for the
    /// host) or xdp (nic-firmware/xdp in the kernel through BPF_PROG_TEST_RUN; needs
    /// CAP_BPF). Every engine prints the same bytes.
    #[arg(long, value_enum, default_value_t = trace::TraceEngine::Rust)]
    engine: trace::TraceEngine,
}

/// Runs `buffet trace`.
pub fn run(a: &TraceArgs, registry: &Registry) -> anyhow::Result<()> {
    anyhow::ensure!(a.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(a.worker_max > 0, "--worker-max must be at least 1");
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let cfg = trace::TraceConfig {
        workers: a.workers,
        worker_max: a.worker_max,
        tenant_max: a.tenant_max,
        shift: a.shift,
        threshold: a.threshold,
        engine: a.engine,
    };
    let open = |path: &PathBuf| {
        std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    };
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut out = BufWriter::new(stdout.lock());
    let mut err = BufWriter::new(stderr.lock());
    match (&a.input, &a.frames, &a.tenants) {
        (Some(input), None, None) => {
            trace::run_trace(BufReader::new(open(input)?), &mut out, &mut err, &cfg)
                .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
        }
        (None, Some(frames), Some(tenants_file)) => {
            let tenants = super::chain::load_tenants(tenants_file, registry)?;
            let file = open(frames)?;
            trace::frames::run_frame_trace(
                BufReader::new(file),
                &tenants,
                &mut out,
                &mut err,
                &cfg,
            )
            .map_err(|e| match e {
                e @ trace::TraceError::Rules { .. } => {
                    anyhow::anyhow!("{}: {e}", tenants_file.display())
                }
                e => anyhow::anyhow!("{}: {e}", frames.display()),
            })?;
        }
        // clap enforces the combinations.
        _ => anyhow::bail!("give --input, or --frames with --tenants"),
    }
    out.flush()?;
    err.flush()?;
    Ok(())
}
