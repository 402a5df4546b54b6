//! `buffet`: the command line. Argument parsing and output only; the tenants schema, the
//! NF registry, isolation resolution and the trace runner are buffet-config's, the
//! pipeline is buffet-worker's.
//!
//! Offline commands, no daemon needed:
//! * `buffet demo` — synthetic multi-tenant traffic through the whole pipeline;
//! * `buffet replay` — a pcap through the same pipeline with a tenants file;
//! * `buffet trace` — the timeslot scheduler alone over a `ts_ns,tenant_id` trace;
//! * `buffet nf check file.o` — verify an eBPF NF and print the verifier's verdict.
#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::{demo, nf, replay, trace};

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
    Trace(trace::TraceArgs),
    /// Inspect NF programs: `buffet nf check file.o` verifies an eBPF NF.
    Nf(nf::NfArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => demo::run(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Trace(a) => trace::run(&a),
        Command::Nf(a) => nf::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
