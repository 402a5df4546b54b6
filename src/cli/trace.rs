//! `buffet trace`: the timeslot scheduler alone over a `ts_ns,tenant_id` trace
//! (`--input`), or the classifier and the scheduler over a `ts_ns,hex_frame` trace of
//! whole frames with a tenants file (`--frames`, `--tenants`)
//! ([`buffet_config::trace`] does the work; this reads the files and writes the output).
//!
//! The output is written once the whole trace has run (kept meanwhile in memory, and
//! past 8 MiB in unnamed temporary files): a malformed line stops the command with
//! nothing on standard output. A capture file (pcap, pcapng) or any other
//! binary file given as a trace is named for what it is before a line is read.

use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use buffet_config::trace;
use buffet_io::pcap::{capture_kind, CaptureKind};
use clap::{ArgGroup, Args};
use tempfile::SpooledTempFile;

use super::registry::Registry;

/// `buffet trace` arguments.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("trace").required(true).args(["input", "frames"])))]
pub struct TraceArgs {
    /// The trace: one `ts_ns,tenant_id` line per packet.
    #[arg(long, conflicts_with_all = ["frames", "tenants"])]
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
    // Both outputs are kept until the trace has run, in memory up to SPILL_AFTER bytes
    // each and then in unnamed temporary files (a trace of a billion packets is tens of
    // GB of output): an error prints nothing else.
    let mut out = spill();
    let mut err = spill();
    // What failed to be written went to a temporary file, not to the trace.
    let blame = |e: trace::TraceError, file: &Path| match e {
        trace::TraceError::Write(source) => spill_error(source),
        e => anyhow::anyhow!("{}: {e}", file.display()),
    };
    match (&a.input, &a.frames, &a.tenants) {
        (Some(input), None, None) => {
            let file = open_text(input, "--input", "ts_ns,tenant_id")?;
            trace::run_trace(file, &mut out, &mut err, &cfg).map_err(|e| blame(e, input))?;
        }
        (None, Some(frames), Some(tenants_file)) => {
            let tenants = super::chain::load_tenants(tenants_file, registry)?;
            let file = open_text(frames, "--frames", "ts_ns,hex_frame")?;
            trace::frames::run_frame_trace(file, &tenants, &mut out, &mut err, &cfg).map_err(
                |e| match e {
                    e @ trace::TraceError::Rules { .. } => blame(e, tenants_file),
                    e => blame(e, frames),
                },
            )?;
        }
        // clap enforces the combinations.
        _ => anyhow::bail!("give --input, or --frames with --tenants"),
    }
    // Both complete before either is printed: a failure here prints nothing either.
    let mut out = rewound(out)?;
    let mut err = rewound(err)?;
    copy_out(&mut out, &mut std::io::stdout().lock())?;
    copy_out(&mut err, &mut std::io::stderr().lock())?;
    Ok(())
}

/// How much of an output is kept in memory before the rest goes to a temporary file.
const SPILL_AFTER: usize = 8 << 20;

/// Where an output waits until the trace has run: memory up to [`SPILL_AFTER`] bytes,
/// then a temporary file no one else sees (gone when closed), so a long trace's output
/// is not held in memory and a short one needs no temporary directory.
fn spill() -> BufWriter<SpooledTempFile> {
    BufWriter::with_capacity(1 << 16, SpooledTempFile::new(SPILL_AFTER))
}

/// An output's temporary file could not be written.
fn spill_error(source: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "keeping the output in a temporary file under {} (TMPDIR) until the trace has run: \
         {source}",
        std::env::temp_dir().display()
    )
}

/// What `spilled` holds, written out and read from its start.
fn rewound(spilled: BufWriter<SpooledTempFile>) -> anyhow::Result<SpooledTempFile> {
    let mut f = spilled
        .into_inner()
        .map_err(|e| spill_error(e.into_error()))?;
    f.seek(SeekFrom::Start(0)).map_err(spill_error)?;
    Ok(f)
}

/// Writes what `spilled` holds to `to`.
fn copy_out(spilled: &mut SpooledTempFile, to: &mut impl Write) -> anyhow::Result<()> {
    std::io::copy(spilled, to)?;
    to.flush()?;
    Ok(())
}

/// Opens the trace `path` (given as `flag`, whose lines are `ts_ns,{what}`), refusing a
/// capture or another binary file before any line is read.
fn open_text(path: &Path, flag: &str, line: &str) -> anyhow::Result<BufReader<std::fs::File>> {
    let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut r = BufReader::new(file);
    let head = r
        .fill_buf()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Some(why) = not_a_trace(head) {
        anyhow::bail!(
            "{} is {why}: {flag} takes a CSV trace, one `{line}` line per packet; to run a \
             pcap through the Packet Dispatcher and the workers use `buffet replay --input \
             FILE`",
            path.display()
        );
    }
    Ok(r)
}

/// What `head`, a file's first bytes, is when it is no CSV text: a capture or binary.
fn not_a_trace(head: &[u8]) -> Option<&'static str> {
    match capture_kind(head) {
        Some(CaptureKind::Pcap) => return Some("a pcap file"),
        Some(CaptureKind::Pcapng) => return Some("a pcapng file"),
        None => {}
    }
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        // Cut inside a character at the end of the buffer: the rest is text.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
        Err(_) => return Some("a binary file (not UTF-8 text)"),
    };
    text.contains('\0')
        .then_some("a binary file (it holds NUL bytes)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_and_binary_files_are_not_traces() {
        assert_eq!(
            not_a_trace(&0xa1b2_c3d4u32.to_le_bytes()),
            Some("a pcap file")
        );
        assert_eq!(
            not_a_trace(&[0x0a, 0x0d, 0x0d, 0x0a, 28, 0]),
            Some("a pcapng file")
        );
        assert!(not_a_trace(b"\x7fELF\x02\x01\x01\0").is_some());
        assert!(not_a_trace(&[0xff, 0xfe, b'0', b',']).is_some());
        assert_eq!(not_a_trace(b"ts_ns,tenant_id\n0,1\n"), None);
        assert_eq!(not_a_trace(b""), None);
        // A character cut by the end of the buffer is still text.
        assert_eq!(
            not_a_trace("0,1 # é".as_bytes().split_last().unwrap().1),
            None
        );
    }
}
