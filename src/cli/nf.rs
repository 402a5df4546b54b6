//! `buffet nf check file.o`: load and verify an eBPF NF, print the verifier's verdict.

use std::io::Write;
use std::path::PathBuf;

use buffet_ebpf::elf::MapKind;
use buffet_ebpf::{check, CheckReport, LoadOptions};
use clap::{Args, Subcommand};

/// `buffet nf` arguments.
#[derive(Args, Debug)]
pub struct NfArgs {
    #[command(subcommand)]
    pub command: NfCommand,
}

/// `buffet nf` subcommands.
#[derive(Subcommand, Debug)]
pub enum NfCommand {
    /// Load an eBPF NF (clang -target bpf object), verify it with PREVAIL and print the
    /// verdict: what was proven, or the verifier's message. Exit status 1 on rejection.
    Check(CheckArgs),
}

/// `buffet nf check` arguments.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The object file.
    pub path: PathBuf,
    /// The ELF section holding the program.
    #[arg(long, default_value = buffet_ebpf::elf::DEFAULT_SECTION)]
    pub section: String,
    /// Reject programs with a loop that may run more iterations than this per packet.
    #[arg(long, default_value_t = buffet_ebpf::verify::PREVAIL_LOOP_LIMIT)]
    pub max_loop_iterations: u32,
}

/// Runs `buffet nf ...`.
pub fn run(a: &NfArgs) -> anyhow::Result<()> {
    match &a.command {
        NfCommand::Check(c) => run_check(c),
    }
}

fn run_check(a: &CheckArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&a.path).map_err(|e| anyhow::anyhow!("{}: {e}", a.path.display()))?;
    let mut opts = LoadOptions {
        section: Some(a.section.clone()),
        ..LoadOptions::default()
    };
    opts.verifier.max_loop_iterations = a.max_loop_iterations;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match check(&bytes, &opts) {
        Ok(report) => {
            print_pass(&mut out, &a.path, &report)?;
            Ok(())
        }
        Err(e) => {
            writeln!(out, "FAIL: {}: {e}", a.path.display())?;
            out.flush()?;
            anyhow::bail!("{} was not accepted", a.path.display())
        }
    }
}

fn print_pass(
    out: &mut impl Write,
    path: &std::path::Path,
    r: &CheckReport,
) -> std::io::Result<()> {
    let img = &r.image;
    let v = &r.verified;
    writeln!(
        out,
        "PASS: {} (section {}, function {})",
        path.display(),
        img.section,
        if img.function.is_empty() {
            "?"
        } else {
            &img.function
        }
    )?;
    writeln!(out, "  instructions: {}", v.instructions)?;
    if v.max_loop_count == 0 {
        writeln!(out, "  loops: none")?;
    } else {
        writeln!(
            out,
            "  loops: terminate; every loop head runs at most {} times per packet",
            v.max_loop_count
        )?;
    }
    writeln!(out, "  return value (r0 at exit): {}", v.exit_value)?;
    writeln!(out, "  tenant region: {} bytes", r.region_len)?;
    for m in &img.maps {
        match m.kind {
            MapKind::Array => writeln!(
                out,
                "  map {}: array, {} x {} bytes",
                m.name, m.max_entries, m.value_size
            )?,
            MapKind::StrSet => writeln!(
                out,
                "  map {}: strset, up to {} strings of up to {} bytes",
                m.name, m.max_entries, m.key_size
            )?,
        }
    }
    if !img.counter_names.is_empty() {
        writeln!(out, "  counters: {}", img.counter_names.join(", "))?;
    }
    Ok(())
}
