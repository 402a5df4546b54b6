//! `buffet run`: the whole pipeline on a live interface — the software Packet Dispatcher
//! reads an AF_PACKET port (or, with `--port af-xdp`, an AF_XDP socket on one queue,
//! whose UMEM frames the workers process in place) and feeds the workers, which run an NF chosen exactly as
//! `replay` chooses it (`--nf`, `--nf-lib`, `--nf-ebpf`, `--isolation`). Frames the NF
//! passes leave through the same interface, or through `--tx-iface`. Runs until SIGINT
//! or SIGTERM (a second one ends the process at once) or `--duration` seconds, then
//! prints the per-tenant table `replay` prints and writes `--stats-json` in its schema
//! (the `input` section names the interface and the ports' counters).
//!
//! Before any traffic: the ports are opened, so a missing privilege (CAP_NET_RAW /
//! CAP_NET_ADMIN, and CAP_BPF for AF_XDP), an interface that does not exist or one
//! that is down, or a queue it does not have, is a clear error and nothing runs (and
//! nothing stays attached). An AF_XDP run attaches its redirect program when it opens
//! the port and detaches it when the port closes, after SIGINT, SIGTERM or
//! `--duration`; a leftover of a killed run is replaced.
//!
//! With `--port af-xdp --tx-iface IF`, passed frames are copied from their UMEM frame
//! into a heap frame for the AF_PACKET transmit port, and the UMEM frame goes back to the
//! socket's fill ring at once.
//!
//! Not built yet (a clear error): `--dispatch xdp` (the XDP Packet Dispatcher).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use buffet_config::registry::{NfVisitor, RegisteredNf};
use buffet_config::{tenants, TenantConfig};
use buffet_dispatch::{DispatcherConfig, SchedulerConfig};
use buffet_io::afpacket::{self, AfPacketConfig, AfPacketPort};
use buffet_io::afxdp::{AfXdpConfig, AfXdpPort, XdpMode};
use buffet_io::{HeapPool, PacketBuf, Port, PortError, PortStats, Rx};
use buffet_worker::{Pipeline, PipelineConfig};
use clap::{Args, ValueEnum};

use super::output::{self, OutputFile};
use super::registry::{Registry, Visit};
use super::replay::{self, NfChoice};
use super::run::{self, Capacity};

/// Where the Packet Dispatcher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DispatchMode {
    /// One dispatcher thread reads the port and feeds the workers.
    Software,
    /// The XDP program dispatches in the NIC path (not built yet).
    Xdp,
}

/// The port backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PortKind {
    /// AF_PACKET with a TPACKET_V3 ring: works on every interface.
    AfPacket,
    /// An AF_XDP socket on one queue (`--queue`), frames processed in the UMEM.
    AfXdp,
}

/// Where the AF_XDP port's redirect program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum XdpModeArg {
    /// In the driver (fails where the driver has no XDP).
    Native,
    /// In the generic path, on every interface.
    Generic,
}

/// `buffet run` arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The interface to read (and, without --tx-iface, to write passed frames to).
    #[arg(long, value_name = "IF")]
    pub iface: String,
    /// Write the frames the NF passes to this interface instead.
    #[arg(long, value_name = "IF")]
    pub tx_iface: Option<String>,
    /// Where the Packet Dispatcher runs.
    #[arg(long, value_enum, default_value_t = DispatchMode::Software)]
    pub dispatch: DispatchMode,
    /// The port backend.
    #[arg(long, value_enum, default_value_t = PortKind::AfPacket)]
    pub port: PortKind,
    /// Where the AF_XDP redirect program runs (default: the driver where it supports
    /// XDP, else generic).
    #[arg(long, value_enum)]
    pub xdp_mode: Option<XdpModeArg>,
    /// The interface queue the AF_XDP socket reads.
    #[arg(long, default_value_t = 0)]
    pub queue: u32,
    /// Put the interface in promiscuous mode while running.
    #[arg(long)]
    pub promisc: bool,
    /// The NF, its isolation and the tenants file, as for `replay`.
    #[command(flatten)]
    pub choice: NfChoice,
    /// Threads, arena and Tenant Table slots.
    #[command(flatten)]
    pub capacity: Capacity,
    /// Each worker's MAX_NB per timeslot (0 = unlimited: never overloaded).
    #[arg(long, default_value_t = 0)]
    pub worker_max: u64,
    /// Timeslot = receive time in ns >> shift (30 ≈ 1.07 s).
    #[arg(long, default_value_t = 30)]
    pub shift: u32,
    /// Overload reports once a worker's TIMES exceeds this.
    #[arg(long, default_value_t = 3)]
    pub threshold: u32,
    /// Stop after this many seconds (default: run until SIGINT or SIGTERM).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
    /// Write per-tenant statistics as JSON to this file (replay's schema).
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Do not pin workers to cores.
    #[arg(long)]
    pub no_pin: bool,
}

/// Runs `buffet run` with the NFs of `registry`.
pub fn run(a: &RunArgs, registry: &Registry) -> anyhow::Result<()> {
    if a.dispatch == DispatchMode::Xdp {
        anyhow::bail!(
            "--dispatch xdp is not built yet: the XDP Packet Dispatcher is still to come; \
             use --dispatch software"
        );
    }
    if a.port == PortKind::AfPacket && (a.xdp_mode.is_some() || a.queue != 0) {
        anyhow::bail!("--xdp-mode and --queue apply to --port af-xdp only");
    }
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    let duration = match a.duration {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            anyhow::bail!("--duration must be a positive number of seconds, not {s}")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let mut cfg = PipelineConfig::default();
    a.capacity.apply(&mut cfg)?;
    let chosen = a.choice.chosen(registry)?;
    let stats_out: Vec<(&'static str, &Path)> = a
        .stats_json
        .as_deref()
        .map(|p| ("--stats-json", p))
        .into_iter()
        .collect();
    output::refuse_same_files(&a.choice.inputs(), &stats_out)?;
    // Signals stop the run from here on: a port that attaches a program detaches it
    // on the way out instead of dying with it attached.
    afpacket::stop_on_signals().context("installing the SIGINT/SIGTERM handler")?;
    // The ports first: privilege and interface errors come before anything else.
    let rx: Box<dyn Port> = match a.port {
        PortKind::AfPacket => Box::new(AfPacketPort::open(AfPacketConfig {
            promisc: a.promisc,
            ..AfPacketConfig::new(&a.iface, 0)
        })?),
        PortKind::AfXdp => {
            anyhow::ensure!(
                !a.promisc,
                "--promisc applies to --port af-packet only (an XDP program sees every frame)"
            );
            let port = AfXdpPort::open(AfXdpConfig {
                queue: a.queue,
                redirect: Some(match a.xdp_mode {
                    None => XdpMode::Auto,
                    Some(XdpModeArg::Native) => XdpMode::Native,
                    Some(XdpModeArg::Generic) => XdpMode::Generic,
                }),
                ..AfXdpConfig::new(&a.iface, 0)
            })?;
            if let Some(p) = port.program() {
                eprintln!(
                    "af_xdp on {} queue {}: {} mode, redirect program in {} mode{}",
                    a.iface,
                    a.queue,
                    if port.is_zero_copy() {
                        "zero-copy"
                    } else {
                        "copy"
                    },
                    if p.is_generic() { "generic" } else { "native" },
                    p.replaced_leftover()
                        .map(|id| format!(
                            " (replaced program {id}, left attached by a run that ended \
                             without detaching)"
                        ))
                        .unwrap_or_default()
                );
            }
            Box::new(port)
        }
    };
    let tx = match &a.tx_iface {
        Some(name) => Some(AfPacketPort::open(AfPacketConfig {
            rx: false,
            ..AfPacketConfig::new(name, 1)
        })?),
        None => None,
    };
    let tenants = tenants::load(&a.choice.tenants)?;
    let stats = a
        .stats_json
        .as_deref()
        .map(|p| OutputFile::create("--stats-json", p))
        .transpose()?;
    let level = replay::isolation_level(a.choice.isolation, &chosen, &tenants, &a.choice.tenants)?;
    cfg.worker_max_nb = if a.worker_max == 0 {
        u64::MAX
    } else {
        a.worker_max
    };
    cfg.dispatcher = DispatcherConfig {
        sched: SchedulerConfig {
            shift: a.shift,
            threshold: a.threshold,
        },
        ..DispatcherConfig::default()
    };
    cfg.pin = !a.no_pin;
    cfg.domain = level.domain();
    if tx.is_some() {
        // Frames from port 0 pass to port 1.
        cfg.routes = vec![1];
    }
    let live = Live {
        a,
        tenants: &tenants,
        cfg,
        rx,
        tx,
        stats,
        duration,
    };
    replay::load_and_visit(chosen, level, registry, live, |l| Visit::Live(Box::new(l)))
}

/// A live run with whichever NF was loaded.
pub(crate) struct Live<'a> {
    a: &'a RunArgs,
    tenants: &'a [TenantConfig],
    cfg: PipelineConfig,
    rx: Box<dyn Port>,
    tx: Option<AfPacketPort>,
    stats: Option<OutputFile>,
    duration: Option<Duration>,
}

impl NfVisitor for Live<'_> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        live_with(nf, self)
    }
}

/// A port that also publishes how many frames it received, for the live rate line (one
/// atomic add per burst).
struct Counted<P> {
    inner: P,
    received: Arc<AtomicU64>,
}

impl<P: Port> Port for Counted<P> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let rx = self.inner.rx_burst(pool, out, max)?;
        if let Rx::Packets(n) = rx {
            self.received.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(rx)
    }
    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        self.inner.tx_burst(pkts, pool)
    }
    fn recycle(&mut self, buf: PacketBuf) {
        self.inner.recycle(buf)
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
    fn stats(&self) -> PortStats {
        self.inner.stats()
    }
    fn flush(&mut self) -> Result<(), PortError> {
        self.inner.flush()
    }
}

fn port_json(name: &str, s: &PortStats) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "rx": s.rx,
        "tx": s.tx,
        "rx_dropped": s.rx_dropped,
        "tx_dropped": s.tx_dropped,
    })
}

fn live_with<N: RegisteredNf>(nf: N, l: Live<'_>) -> anyhow::Result<()> {
    let Live {
        a,
        tenants,
        cfg,
        rx,
        tx,
        mut stats,
        duration,
    } = l;
    let mut p = Pipeline::new(nf, cfg)?;
    run::admit_all(&mut p, tenants, &a.choice.tenants)?;
    let stop = afpacket::stop_on_signals().context("installing the SIGINT/SIGTERM handler")?;
    let received = Arc::new(AtomicU64::new(0));
    p.add_port(Box::new(Counted {
        inner: rx,
        received: received.clone(),
    }));
    if let Some(tx) = tx {
        p.add_port(Box::new(tx));
    }
    eprintln!(
        "running on {}{} with {} workers: stop with Ctrl-C{}",
        a.iface,
        a.tx_iface
            .as_deref()
            .map(|t| format!(" (passed frames out of {t})"))
            .unwrap_or_default(),
        a.capacity.workers,
        duration
            .map(|d| format!(" or after {:.1} s", d.as_secs_f64()))
            .unwrap_or_default()
    );
    // The watcher stops the data plane on a signal or at the deadline, and prints the
    // rate every second when stderr is a terminal.
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let watcher = {
        let control = p.control().clone();
        let done = done.clone();
        let received = received.clone();
        let tty = std::io::stderr().is_terminal();
        std::thread::Builder::new()
            .name("buffet-run-watch".into())
            .spawn(move || {
                let (mut last_n, mut last_t) = (0u64, Instant::now());
                while !done.load(Ordering::Acquire) {
                    if stop.load(Ordering::Acquire)
                        || duration.is_some_and(|d| start.elapsed() >= d)
                    {
                        control.stop();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    if tty && last_t.elapsed() >= Duration::from_secs(1) {
                        let n = received.load(Ordering::Relaxed);
                        let dt = last_t.elapsed().as_secs_f64();
                        eprint!(
                            "\r{:>8.1} s  {n:>12} packets  {:>10.1} kpps   ",
                            start.elapsed().as_secs_f64(),
                            (n - last_n) as f64 / dt / 1e3
                        );
                        (last_n, last_t) = (n, Instant::now());
                    }
                }
                if tty {
                    eprintln!();
                }
            })
            .context("starting the stop watcher")?
    };
    let result = p.run(|_| {});
    done.store(true, Ordering::Release);
    let _ = watcher.join();
    let n = result?;
    let took = start.elapsed();
    let ports = p.dataplane().port_stats();
    let faults = p.nf().contained_faults();
    let report = p.finish();
    if let Some(e) = &report.sink_error {
        anyhow::bail!("{}: {e}", a.iface);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run::print_tenants(&mut out, &report)?;
    for (name, s) in &ports {
        writeln!(
            out,
            "port {name}: rx {} tx {} rx_dropped {} tx_dropped {}",
            s.rx, s.tx, s.rx_dropped, s.tx_dropped
        )?;
    }
    run::print_events(&mut out, &report, 20)?;
    for f in &faults {
        writeln!(out, "  contained fault: {f}")?;
    }
    eprintln!(
        "received {n} packets on {} in {:.3} s ({:.2} kpps)",
        a.iface,
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(1e-9) / 1e3
    );
    if let Some(mut f) = stats.take() {
        let input = serde_json::json!({
            "iface": a.iface,
            "packets": n,
            "seconds": took.as_secs_f64(),
            "ports": ports.iter().map(|(name, s)| port_json(name, s)).collect::<Vec<_>>(),
        });
        replay::write_stats(&mut f, &report, input)?;
        f.commit()?;
    }
    Ok(())
}
