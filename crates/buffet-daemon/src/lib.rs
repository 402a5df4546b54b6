//! `buffetd`, the provider's daemon: one process that runs the data plane of a config
//! (ports, Packet Dispatcher, workers running one NF for every tenant) and serves its
//! control plane — an HTTP/JSON API with bearer-token auth to admit, update and remove
//! tenants and to launch and terminate workers while traffic flows, per-tenant stats,
//! scheduler events as a server-sent-event stream, Prometheus `/metrics` — and keeps the
//! tenants in a crash-safe store (redb) so that a restart re-admits them.
//!
//! * [`config`] — `buffet.toml`;
//! * [`plane`] — the data plane behind an NF-independent trait object, on its own thread;
//! * [`api`] — routes, auth per request, the write-ahead ordering of every change;
//! * [`serve`] — the HTTP/1.1 accept loop (the Orchestrator's, re-exported): connection limit,
//!   header-read timeout, lingering close;
//! * [`auth`] — tokens, hashed, compared in constant time;
//! * [`store`] — redb;
//! * [`metrics`] — the Prometheus exposition;
//! * [`daemon`] — start, the Agent, config reload, stop;
//! * [`cluster`] — agent mode: registration, load reports and placements through etcd;
//! * [`xdp`] — `[dispatch] mode = "xdp"`: the XDP Packet Dispatcher on the `af_xdp`
//!   port, its maps kept in step with admissions, removals, updates and workers.
//!
//! tokio lives here only: the data plane is driven by its own thread and reached through
//! the pipeline's control handle. Not here yet: TLS (see docs/daemon.md).
#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod metrics;
pub mod plane;
mod repeats;
pub mod serve;
pub mod store;
pub mod xdp;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

pub use config::DaemonConfig;
pub use daemon::{ConfigSource, Daemon, DaemonError, PlaneStarter, ReloadError};

/// `buffetd` command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "buffetd",
    version,
    about = "Buffet's daemon: the data plane and its control API"
)]
pub struct Args {
    /// The configuration file (see deploy/buffet.example.toml).
    #[arg(long)]
    pub config: PathBuf,
    /// The API's address (overrides `api.listen`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The data directory (overrides `data_dir`).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// The `buffetd` binary: runs until SIGTERM or SIGINT, then stops intake, drains the
/// data plane and exits 0. An error is one line on stderr and exit status 1.
pub fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The message alone: every error here already ends with its cause
            // (`path: why`), so walking the cause chain would print each cause twice.
            eprintln!("buffetd: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The config file with the command line's overrides.
fn load(args: &Args) -> Result<DaemonConfig, config::ConfigError> {
    let mut cfg = DaemonConfig::load(&args.config)?;
    if let Some(l) = args.listen {
        cfg.api.listen = l;
    }
    if let Some(d) = &args.data_dir {
        cfg.data_dir = d.clone();
    }
    Ok(cfg)
}

fn run(args: &Args) -> anyhow::Result<()> {
    let daemon = Daemon::start(load(args)?, &args.config)?;
    // SIGHUP and `POST /v1/reload` read the file again with the same overrides.
    let again = args.clone();
    daemon.set_config_source(std::sync::Arc::new(move || load(&again)));
    wait_for_signal(|| reload(&daemon))?;
    eprintln!("buffetd: stopping: no new requests, draining the data plane");
    let report = daemon.stop()?;
    let g = &report.global;
    let mut lost = String::new();
    if g.socket_dropped > 0 {
        let n = g.socket_dropped;
        lost += &format!(", {n} dropped by the kernel at the workers' AF_XDP sockets");
    }
    if g.oversize > 0 {
        lost += &format!(", {} too large for a frame (oversize)", g.oversize);
    }
    eprintln!(
        "buffetd: stopped: {} input packets{lost}; {} tenants",
        g.input_packets,
        report.tenants.len()
    );
    Ok(())
}

/// SIGHUP: reads the config again and applies what can change while running (the path
/// `POST /v1/reload` takes too); one line on stderr either way (never a token).
fn reload(daemon: &Daemon) {
    match daemon.reload_config() {
        Ok(changed) if changed.is_empty() => {
            eprintln!("buffetd: SIGHUP: config reloaded: nothing changed");
        }
        Ok(changed) => eprintln!("buffetd: SIGHUP: config reloaded: {}", changed.join(", ")),
        Err(e) => eprintln!("buffetd: SIGHUP: reload refused, nothing changed: {e}"),
    }
}

/// Blocks until SIGTERM or SIGINT; calls `on_hup` at every SIGHUP.
fn wait_for_signal(mut on_hup: impl FnMut()) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = hup.recv() => on_hup(),
            }
        }
    })
}
