//! The `buffet` command as a library: the binary's `main` is [`main`], and an NF
//! author's binary is the same command with their NF registered ([`main_with`],
//! [`nf_main!`](crate::nf_main)), so `replay --nf my-nf` and `demo --nf my-nf` run it
//! with the tenant table, `--stats-json`, `--output` and everything else.
//!
//! One module per subcommand ([`demo`], [`replay`], [`live`] for `run`, [`trace`], [`nf`];
//! [`client`] for `tenant`, `stats`, `workers` and `events`, the client of buffetd); [`run`] is what
//! `demo` and `replay` share (admission, driving a pipeline, printing its report);
//! [`registry`] holds the NFs `--nf` can name; `chain` wraps the run's NF in a
//! tenant-chain runner when the tenants file names chains; [`output`] opens the files a run writes
//! (checked before the run, renamed into place after it); [`limits`] bounds arguments
//! that cost threads and memory; [`errors`] prints an error's chain once.
//!
//! Argument parsing and output only: the tenants schema, isolation resolution and the
//! trace runner are buffet-config's, the pipeline is buffet-worker's.

pub(crate) mod chain;
pub mod client;
pub mod demo;
pub mod errors;
pub mod limits;
pub mod live;
pub mod nf;
pub mod output;
pub mod registry;
pub mod replay;
pub mod run;
pub mod sim;
pub mod trace;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::builder::PossibleValuesParser;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub use registry::{RegisterError, Registry};

/// Buffet: multi-tenant network functions, one process, thousands of tenants.
#[derive(Parser, Debug)]
#[command(name = "buffet", version, about)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run synthetic multi-tenant traffic through the dispatcher and workers (no root, no NIC).
    Demo(demo::DemoArgs),
    /// Replay a pcap through the dispatcher and workers running an NF.
    Replay(replay::ReplayArgs),
    /// Run the dispatcher and workers on a live interface (needs CAP_NET_RAW).
    Run(live::RunArgs),
    /// Run the timeslot scheduler over a `ts_ns,tenant_id` trace, or the classifier and
    /// the scheduler over a `ts_ns,hex_frame` trace with a tenants file (`--frames`).
    Trace(trace::TraceArgs),
    /// The paper's scheduling simulation (Figs. 7–8): overload and migrations per policy.
    Sim(sim::SimArgs),
    /// Inspect NF programs: `buffet nf check file.o` verifies an eBPF NF.
    Nf(nf::NfArgs),
    /// Tenants of a running buffetd: add, update, rm, ls, show, apply a tenants file, token.
    Tenant(client::TenantArgs),
    /// Per-tenant statistics of a running buffetd.
    Stats(client::StatsArgs),
    /// Workers of a running buffetd: ls, add, rm.
    Workers(client::WorkersArgs),
    /// Servers of a cluster, from buffet-orchestrator: ls, drain, undrain.
    Servers(client::ServersArgs),
    /// Scheduler events of a running buffetd (migrations, overload reports, quarantines).
    Events(client::EventsArgs),
    /// Make a running buffetd read its config again and apply what may change (as SIGHUP).
    Reload(client::ReloadArgs),
}

/// The `buffet` command with the reference NFs only.
pub fn main() -> ExitCode {
    main_with(|_| {})
}

/// The `buffet` command with the NFs `register` adds: parses the process's arguments,
/// runs the subcommand, prints an error as one line on stderr (`error: ...`, each cause
/// once) and returns the exit status (0, 1 on an error, 2 on bad usage).
///
/// ```no_run
/// # #[derive(Default)] struct MyNf;
/// # impl buffet::sdk::NetworkFunction for MyNf {
/// #     type State = (); type Policy = ();
/// #     fn name(&self) -> &'static str { "my-nf" }
/// #     fn register(&self) -> buffet::sdk::MemorySpec { buffet::sdk::MemorySpec::of::<()>() }
/// #     fn init(&self, _: &(), _: &mut ()) -> Result<(), buffet::sdk::InitError> { Ok(()) }
/// #     fn handle(&self, _: &mut buffet::sdk::Packet<'_>, _: &mut ()) -> buffet::sdk::Verdict {
/// #         buffet::sdk::Verdict::Pass
/// #     }
/// # }
/// # impl buffet::config::RegisteredNf for MyNf {}
/// fn main() -> std::process::ExitCode {
///     buffet::cli::main_with(|nfs| {
///         nfs.add::<MyNf>("my-nf");
///     })
/// }
/// ```
pub fn main_with(register: impl FnOnce(&mut Registry)) -> ExitCode {
    let mut registry = Registry::new();
    register(&mut registry);
    let result = match registry.errors().first() {
        Some(e) => Err(anyhow::Error::new(e.clone())),
        None => run_args(std::env::args_os(), &registry),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of the output went away (`buffet sim | head`): nothing to say, and
        // saying it to a closed stderr must not panic.
        Err(e) if broken_pipe(&e) => ExitCode::FAILURE,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "error: {}", errors::chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Parses `args` (the first is the program name) against `registry` and runs the
/// subcommand. A usage error prints clap's message and exits the process (status 2),
/// `--help` and `--version` print and exit 0.
pub fn run_args<I, T>(args: I, registry: &Registry) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    // clap keeps possible values as `&'static str`; the names live as long as the process.
    let names: Vec<&'static str> = registry
        .names()
        .into_iter()
        .map(|n| &*Box::leak(n.into_boxed_str()))
        .collect();
    let nf_values = || PossibleValuesParser::new(names.iter().copied());
    let cmd = Cli::command()
        .mut_subcommand("replay", |c| {
            c.mut_arg("nf", |a| a.value_parser(nf_values()))
        })
        .mut_subcommand("demo", |c| c.mut_arg("nf", |a| a.value_parser(nf_values())))
        .mut_subcommand("run", |c| c.mut_arg("nf", |a| a.value_parser(nf_values())));
    let matches = cmd.get_matches_from(args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    run_command(&cli.command, registry)
}

/// Runs one parsed subcommand.
pub fn run_command(command: &Command, registry: &Registry) -> anyhow::Result<()> {
    match command {
        Command::Demo(a) => demo::run(a, registry),
        Command::Replay(a) => replay::run(a, registry),
        Command::Run(a) => live::run(a, registry),
        Command::Trace(a) => trace::run(a, registry),
        Command::Sim(a) => sim::run(a),
        Command::Nf(a) => nf::run(a),
        Command::Tenant(a) => client::tenant(a),
        Command::Stats(a) => client::stats(a),
        Command::Workers(a) => client::workers(a),
        Command::Servers(a) => client::servers(a),
        Command::Events(a) => client::events(a),
        Command::Reload(a) => client::reload(a),
    }
}

/// `fn main` for an NF author's binary: the full `buffet` command with the NFs named
/// here registered (each type implements [`RegisteredNf`](crate::config::RegisteredNf)
/// and `Default`).
///
/// ```ignore
/// buffet::nf_main!("my-nf" => MyNf, "my-other-nf" => OtherNf);
/// ```
#[macro_export]
macro_rules! nf_main {
    ($($name:literal => $nf:ty),+ $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            $crate::cli::main_with(|registry| {
                $( registry.add::<$nf>($name); )+
            })
        }
    };
}
