//! `buffet run`: the whole pipeline on a live interface — the software Packet Dispatcher
//! reads an AF_PACKET port (or, with `--port af-xdp`, an AF_XDP socket on one queue —
//! with `--queues`, one socket per queue over one UMEM, read round robin — whose UMEM
//! frames the workers process in place) and feeds the workers, which run an NF chosen exactly as
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
//! `--port dpdk` (a build with the cargo feature `io-dpdk`): a DPDK port read by the
//! software dispatcher. The EAL arguments come from `--iface` (DPDK's `net_af_packet`
//! vdev on it, `--no-pci`, `--in-memory`, `--no-huge` where no hugepages are reserved)
//! followed by `--eal`; an `--eal` that chooses devices itself (`--vdev`, `-a`) replaces
//! the vdev. The run prints the EAL arguments it uses. Without the feature, `--port dpdk`
//! is refused with a message saying how to build it.
//!
//! `--dispatch xdp`: the XDP Packet Dispatcher (nic-firmware/xdp, through buffet-xdp)
//! classifies, runs Algorithm 1 on `bpf_ktime_get_ns()`, writes the tenant slot into the
//! frame's XDP metadata (never into DSCP: the frame keeps its own) and redirects each
//! frame to its worker's own AF_XDP socket on the frame's receive queue; there is no dispatcher
//! thread. Every worker has a socket on the queue (`--queue`), or on each of `--queues`,
//! all sharing one UMEM (`XDP_SHARED_UMEM`): each worker polls its own receive rings,
//! round robin, and takes the tenant from the metadata; the data-plane thread owns each
//! queue's fill and completion rings and the transmit ring (it recycles frames and sends
//! passed ones back out of the first queue). Tenants are admitted to the pipeline (regions,
//! state, the software tables the report reads) and to the XDP maps with the same slot,
//! rules, MAX_NB and worker; a rule the XDP classifier cannot express is an error before
//! anything is attached. The program's ring-buffer events (migrations, overload reports)
//! become the run's events, and its counters and Tenant Table rows go into
//! `--stats-json` (`input.xdp`); its frames seen, unmatched, malformed, no-live-worker
//! and no-socket counts are the report's global ones (the pipeline's own dispatcher sees
//! no frame), and the frames it policed are their tenants' `policed` drops. The program
//! is detached when the run ends.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use buffet_config::registry::{NfVisitor, RegisteredNf};
use buffet_config::TenantConfig;
use buffet_io::afpacket::{self, AfPacketConfig, AfPacketPort};
use buffet_io::afxdp::{AfXdpConfig, AfXdpPort, XdpMode};
use buffet_io::afxdp::{SocketStatistics, XskReceiver, XskReceivers, XskStatsReader};
use buffet_io::{HeapPool, PacketBuf, Port, PortError, PortStats, Rx};
use buffet_worker::{DropReason, Pipeline, PipelineConfig, WorkerSource};
use buffet_xdp::{AttachMode, XdpConfig, XdpDispatcher, XdpStats};
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
    /// The XDP program dispatches in the NIC path, straight to each worker's AF_XDP
    /// socket.
    Xdp,
}

/// The port backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PortKind {
    /// AF_PACKET with a TPACKET_V3 ring: works on every interface.
    AfPacket,
    /// An AF_XDP socket on one queue (`--queue`), frames processed in the UMEM.
    AfXdp,
    /// A DPDK port (`--eal`), frames processed in its mbufs; needs a build with the
    /// cargo feature `io-dpdk`.
    Dpdk,
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
    /// The port backend (with --dispatch xdp the workers always read their own AF_XDP
    /// sockets).
    #[arg(long, value_enum, default_value_t = PortKind::AfPacket)]
    pub port: PortKind,
    /// Where the AF_XDP redirect program (or, with --dispatch xdp, the XDP Packet
    /// Dispatcher) runs (default: the driver where it supports XDP, else generic; with
    /// --dispatch xdp, generic).
    #[arg(long, value_enum)]
    pub xdp_mode: Option<XdpModeArg>,
    /// The interface queue the AF_XDP socket (every worker's, with --dispatch xdp) reads
    /// (--queues: several).
    #[arg(long, default_value_t = 0)]
    pub queue: u32,
    /// Several receive queues for --port af-xdp (one socket each over one UMEM, read
    /// round robin) or --dispatch xdp (one socket per queue and worker): a range and/or
    /// list (`0-3`, `0,2`, `0-1,4`). Passed frames leave through the first.
    #[arg(long, value_name = "LIST", conflicts_with = "queue", value_parser = parse_queues)]
    pub queues: Option<QueueList>,
    /// More DPDK EAL arguments for --port dpdk, whitespace-separated (repeatable), after
    /// those derived from --iface: e.g. --eal "--no-huge -l 0" or, to use a NIC bound to
    /// a DPDK driver instead of the net_af_packet vdev, --eal "-a 0000:3b:00.0".
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub eal: Vec<String>,
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
    /// Who moves tenants off overloaded workers: greedy (the paper's Algorithm 1, per
    /// packet) or ours (a plan at every timeslot boundary; software dispatch only).
    #[arg(long, default_value = "greedy")]
    pub planner: buffet_dispatch::Planner,
    /// Stop after this many seconds (default: run until SIGINT or SIGTERM).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
    /// Write per-tenant statistics as JSON to this file (replay's schema).
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Do not pin workers to cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Idle threads: after 200 µs without a frame, the dispatcher and the workers block
    /// (on the port's sockets and on each other's notices: a frame or a command wakes
    /// them at once) and look again at least this often, in µs (a backstop); 0 = never
    /// block (they poll, napping some 20-50 µs between polls).
    #[arg(long, value_name = "US", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub idle_wait_us: u64,
}

/// Runs `buffet run` with the NFs of `registry`.
pub fn run(a: &RunArgs, registry: &Registry) -> anyhow::Result<()> {
    let xdp = a.dispatch == DispatchMode::Xdp;
    if !xdp && a.port != PortKind::AfXdp && (a.xdp_mode.is_some() || a.queue != 0) {
        anyhow::bail!("--xdp-mode and --queue apply to --port af-xdp or --dispatch xdp only");
    }
    if a.queues.is_some() && !xdp && a.port != PortKind::AfXdp {
        anyhow::bail!("--queues applies to --port af-xdp or --dispatch xdp only");
    }
    if xdp && a.promisc {
        anyhow::bail!(
            "--promisc applies to --port af-packet only (an XDP program sees every frame)"
        );
    }
    if a.port == PortKind::Dpdk && xdp {
        anyhow::bail!(
            "--port dpdk needs --dispatch software (the XDP program feeds AF_XDP sockets)"
        );
    }
    if a.port != PortKind::Dpdk && !a.eal.is_empty() {
        anyhow::bail!("--eal applies to --port dpdk only");
    }
    anyhow::ensure!(a.shift < 64, "--shift must be below 64");
    if xdp && a.planner != buffet_dispatch::Planner::Greedy {
        anyhow::bail!(
            "--planner {} needs --dispatch software: the XDP Packet Dispatcher runs \
             Algorithm 1 only",
            a.planner.name()
        );
    }
    let duration = match a.duration {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            anyhow::bail!("--duration must be a positive number of seconds, not {s}")
        }
        Some(s) => Some(Duration::try_from_secs_f64(s).map_err(|_| {
            anyhow::anyhow!(
                "--duration must be at most {} seconds, not {s:e}",
                Duration::MAX.as_secs()
            )
        })?),
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
    let mut xdp_parts = None;
    // The kernel's counters of every AF_XDP socket (the port's, the workers'), for the
    // report.
    let mut xsk = None;
    let rx: Box<dyn Port> = match a.port {
        _ if xdp => {
            let (port, parts) = open_xdp(a)?;
            xdp_parts = Some(parts);
            xsk = Some(port.statistics_reader());
            Box::new(port)
        }
        PortKind::AfPacket => Box::new(AfPacketPort::open(AfPacketConfig {
            promisc: a.promisc,
            ..AfPacketConfig::new(&a.iface, 0)
        })?),
        PortKind::AfXdp => {
            anyhow::ensure!(
                !a.promisc,
                "--promisc applies to --port af-packet only (an XDP program sees every frame)"
            );
            let queues = a.queues.clone().map(|q| q.0).unwrap_or_default();
            let port = AfXdpPort::open(AfXdpConfig {
                queue: queues.first().copied().unwrap_or(a.queue),
                redirect: Some(match a.xdp_mode {
                    None => XdpMode::Auto,
                    Some(XdpModeArg::Native) => XdpMode::Native,
                    Some(XdpModeArg::Generic) => XdpMode::Generic,
                }),
                frames: AfXdpConfig::frames_for_queues(queues.len()),
                queues,
                ..AfXdpConfig::new(&a.iface, 0)
            })?;
            if let Some(p) = port.program() {
                let on: Vec<String> = port
                    .config()
                    .receive_queues()
                    .iter()
                    .map(u32::to_string)
                    .collect();
                eprintln!(
                    "af_xdp on {} queue{} {}: {} mode, redirect program in {} mode{}",
                    a.iface,
                    if on.len() > 1 { "s" } else { "" },
                    on.join(","),
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
            xsk = Some(port.statistics_reader());
            Box::new(port)
        }
        PortKind::Dpdk => open_dpdk(a)?,
    };
    let tx = match &a.tx_iface {
        Some(name) => Some(AfPacketPort::open(AfPacketConfig {
            rx: false,
            ..AfPacketConfig::new(name, 1)
        })?),
        None => None,
    };
    let tenants = super::chain::load_tenants(&a.choice.tenants, registry)?;
    anyhow::ensure!(
        !xdp || tenants.len() <= buffet_xdp::MAX_TENANTS as usize,
        "{}: {} tenants, more than the {} the XDP Packet Dispatcher's maps hold \
         (--dispatch xdp); run them with --dispatch software",
        a.choice.tenants.display(),
        tenants.len(),
        buffet_xdp::MAX_TENANTS
    );
    if xdp || a.port == PortKind::AfXdp {
        if let Some(w) = stripped_vlan_warning(&tenants, &a.choice.tenants, &a.iface) {
            eprintln!("{w}");
        }
    }
    let stats = a
        .stats_json
        .as_deref()
        .map(|p| OutputFile::create("--stats-json", p))
        .transpose()?;
    let (level, chained) = replay::plan(a.choice.isolation, &chosen, &tenants, &a.choice.tenants)?;
    let sched = buffet_dispatch::SchedulerConfig {
        shift: a.shift,
        threshold: a.threshold,
    };
    replay::set_schedule(&mut cfg, a.worker_max, sched, a.planner, !a.no_pin);
    cfg.domain = level.domain();
    if tx.is_some() {
        // Frames from port 0 pass to port 1.
        cfg.routes = vec![1];
    }
    let live = Live {
        a,
        tenants: chained.as_deref().unwrap_or(&tenants),
        cfg,
        rx,
        tx,
        stats,
        duration,
        xdp: xdp_parts,
        xsk,
    };
    let chain = chained
        .is_some()
        .then_some((tenants.as_slice(), a.choice.tenants.as_path()));
    replay::visit_run(
        chosen,
        level,
        chain,
        &a.capacity.arena(),
        registry,
        live,
        |l| Visit::Live(Box::new(l)),
    )
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
    xdp: Option<XdpParts>,
    xsk: Option<XskStatsReader>,
}

/// What `--dispatch xdp` opened before the NF is loaded: per worker, one receiver per
/// queue, sharing the port's UMEM.
pub(crate) struct XdpParts {
    /// Per worker, its sockets in the order of `queues`.
    receivers: Vec<Vec<XskReceiver>>,
    /// The receive queues (the first is the one frames are sent on).
    queues: Vec<u32>,
    mode: AttachMode,
}

/// Opens the UMEM owner's sockets (the data-plane thread's port: one per queue, each with
/// its queue's fill and completion rings; the first also with the transmit ring) and
/// per worker one shared-UMEM socket on each queue.
fn open_xdp(a: &RunArgs) -> anyhow::Result<(AfXdpPort, XdpParts)> {
    buffet_xdp::dispatcher_object()?;
    let workers = a.capacity.workers;
    anyhow::ensure!(
        (1..=buffet_xdp::MAX_WORKERS).contains(&workers),
        "--dispatch xdp: --workers must be 1 to {} (the XDP program's Worker Table)",
        buffet_xdp::MAX_WORKERS
    );
    let queues = a.queues.clone().map_or_else(|| vec![a.queue], |q| q.0);
    buffet_xdp::check_queues(&queues).context("--dispatch xdp")?;
    let unread = buffet_io::afxdp::unread_queues(&a.iface, &queues);
    if !unread.is_empty() {
        eprintln!(
            "warning: {} also receives on queue(s) {unread:?}, which this run does not read: \
             the XDP Packet Dispatcher drops the frames it finds there and counts them as \
             no_socket (read them with --queues)",
            a.iface
        );
    }
    let mut port = AfXdpPort::open(AfXdpConfig {
        queue: queues[0],
        queues: if queues.len() > 1 {
            queues.clone()
        } else {
            Vec::new()
        },
        redirect: None,
        metadata: true,
        frames: AfXdpConfig::frames_for_queues(queues.len()),
        ..AfXdpConfig::new(&a.iface, 0)
    })?;
    let receivers = (0..workers)
        .map(|_| {
            queues
                .iter()
                .map(|&q| port.shared_receiver_on(q))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| {
            format!(
                "--dispatch xdp: a socket per worker on each of {} queue(s) {queues:?}, \
                 sharing one UMEM",
                a.iface
            )
        })?;
    let mode = match a.xdp_mode {
        Some(XdpModeArg::Native) => AttachMode::Native,
        None | Some(XdpModeArg::Generic) => AttachMode::Generic,
    };
    Ok((
        port,
        XdpParts {
            receivers,
            queues,
            mode,
        },
    ))
}

/// `--queues`: the receive queues, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueList(pub Vec<u32>);

/// The warning `--port af-xdp` and `--dispatch xdp` print when a tenant's rule matches on
/// `vlan`, or `None` when none does. Where the NIC or its driver takes the 802.1Q tag out
/// of a received frame (receive VLAN offload) it is not in the bytes an XDP program or an
/// AF_XDP socket sees, so such a rule cannot match there; the AF_PACKET port puts the tag
/// back. (Reading the tag from the driver, `bpf_xdp_metadata_rx_vlan_tag`, needs Linux
/// 6.8 and a driver that supports it.)
fn stripped_vlan_warning(tenants: &[TenantConfig], file: &Path, iface: &str) -> Option<String> {
    let problem = buffet_config::tenants::stripped_vlan_problem(tenants)?;
    Some(format!(
        "warning: {}: {problem}. Turn the offload off (ethtool -K {iface} rxvlan off) or use \
         --port af-packet, which puts the tag back",
        file.display(),
    ))
}

/// `--queues`: queue numbers and ranges separated by commas (`0-3`, `0,2`, `0-1,4`), each
/// queue once.
fn parse_queues(s: &str) -> Result<QueueList, String> {
    let mut out: Vec<u32> = Vec::new();
    for part in s.split(',').map(str::trim) {
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("{x:?} is not a queue number (in {s:?})"))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (num(lo)?, num(hi)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi || hi - lo >= 1024 {
            return Err(format!(
                "{part:?}: a range runs from low to high, at most 1024 queues"
            ));
        }
        for q in lo..=hi {
            if out.contains(&q) {
                return Err(format!("queue {q} is named twice in {s:?}"));
            }
            out.push(q);
        }
    }
    Ok(QueueList(out))
}

/// Opens the DPDK port of `--port dpdk` (see the module docs).
#[cfg(feature = "io-dpdk")]
fn open_dpdk(a: &RunArgs) -> anyhow::Result<Box<dyn Port>> {
    use buffet_io::dpdk::{DpdkConfig, DpdkPort, DPDK_VERSION};
    let extra: Vec<String> = a
        .eal
        .iter()
        .flat_map(|s| s.split_whitespace().map(str::to_owned))
        .collect();
    let cfg = DpdkConfig {
        promisc: a.promisc,
        ..DpdkConfig::for_iface(&a.iface, &extra, 0)
    };
    eprintln!(
        "dpdk {DPDK_VERSION} on {}: EAL arguments: {}",
        a.iface,
        cfg.eal_args.join(" ")
    );
    let port = DpdkPort::open(cfg)?;
    eprintln!(
        "dpdk on {}: port {} ({})",
        a.iface,
        port.port_id(),
        port.device()
    );
    Ok(Box::new(port))
}

/// `--port dpdk` in a build without DPDK.
#[cfg(not(feature = "io-dpdk"))]
fn open_dpdk(_a: &RunArgs) -> anyhow::Result<Box<dyn Port>> {
    anyhow::bail!(
        "--port dpdk: this buffet was built without the io-dpdk feature; build it with \
         `cargo build --release --features io-dpdk` (needs Debian's dpdk-dev 22.11, see \
         docs/ports.md)"
    )
}

/// A worker's AF_XDP sockets (one per queue, read round robin) as its [`WorkerSource`],
/// counting what it received for the live rate line (one atomic add per burst).
struct XskSource {
    rx: XskReceivers,
    received: Arc<AtomicU64>,
}

impl WorkerSource for XskSource {
    fn receive(
        &mut self,
        burst: &mut Vec<PacketBuf>,
        rejected: &mut Vec<PacketBuf>,
        max: usize,
    ) -> usize {
        let n = self.rx.receive(burst, rejected, max);
        if n > 0 {
            self.received.fetch_add(n as u64, Ordering::Relaxed);
        }
        n
    }

    fn readiness_fds(&self) -> Option<Vec<std::os::fd::RawFd>> {
        Some(self.rx.readiness_fds())
    }
}

impl NfVisitor for Live<'_> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        live_with(nf, self)
    }
}

/// A port that also publishes how many frames it received, for the live rate line (one
/// atomic add per burst), and about once a second looks whether it dropped frames larger
/// than a frame buffer, to say so once.
struct Counted<P> {
    inner: P,
    received: Arc<AtomicU64>,
    oversize: Arc<OversizeWarning>,
    checked: Instant,
}

/// The warning, once per run, that the interface delivers frames larger than a frame
/// buffer (GRO/LRO or TSO/GSO super-packets), which are dropped and counted as oversize.
struct OversizeWarning {
    iface: String,
    said: AtomicBool,
}

impl OversizeWarning {
    /// `n` frames too large were dropped so far: says so the first time `n` is not 0.
    fn saw(&self, n: u64) {
        if n > 0 && !self.said.swap(true, Ordering::AcqRel) {
            let i = &self.iface;
            eprintln!(
                "warning: {i} delivers frames larger than a {}-byte frame buffer ({n} so far): \
                 GRO/LRO super-packets on {i} or TSO/GSO super-packets from its sending peer \
                 (a veth's other end, a local sender). Buffet does not segment them: they are \
                 dropped and counted as oversize. Turn the offloads off with \
                 `ethtool -K {i} gro off lro off` and, on the sending peer, \
                 `ethtool -K PEER tso off gso off`",
                buffet_io::FRAME_CAPACITY
            );
        }
    }
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
        if self.checked.elapsed() >= Duration::from_secs(1) {
            self.checked = Instant::now();
            if !self.oversize.said.load(Ordering::Relaxed) {
                self.oversize.saw(self.inner.stats().rx_oversize);
            }
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
    fn readiness_fds(&self) -> Option<Vec<std::os::fd::RawFd>> {
        self.inner.readiness_fds()
    }
    fn take_error(&mut self) -> Result<(), PortError> {
        self.inner.take_error()
    }
    fn recheck_link(&mut self) -> Result<bool, PortError> {
        self.inner.recheck_link()
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

/// The worker reading shared receiver `i` when each worker has `per_worker` of them,
/// opened worker by worker (one per queue).
fn receiver_worker(i: usize, per_worker: usize) -> usize {
    i / per_worker.max(1)
}

/// Who reads an AF_XDP socket: the port (the data-plane thread, or the software
/// dispatcher) or, with `--dispatch xdp`, a worker (receivers are opened worker by worker,
/// `per_worker` each: one per queue).
fn socket_owner(k: &SocketStatistics, per_worker: usize) -> String {
    match k.receiver {
        None => "port".to_owned(),
        Some(i) => format!("worker {}", receiver_worker(i, per_worker)),
    }
}

/// One AF_XDP socket's kernel counters for `--stats-json` (`null`: a kernel before 5.9
/// does not count it), and the frames its reader took off its receive ring.
fn socket_json(k: &SocketStatistics, per_worker: usize) -> serde_json::Value {
    let s = &k.stats;
    let mut v = serde_json::json!({
        "socket": socket_owner(k, per_worker),
        "queue": k.queue,
        "received": k.received,
        "rx_dropped": s.rx_dropped,
        "rx_invalid_descs": s.rx_invalid_descs,
        "tx_invalid_descs": s.tx_invalid_descs,
        "rx_ring_full": s.rx_ring_full,
        "rx_fill_ring_empty_descs": s.rx_fill_ring_empty_descs,
        "tx_ring_empty_descs": s.tx_ring_empty_descs,
    });
    if let Some(i) = k.receiver {
        v["worker"] = receiver_worker(i, per_worker).into();
    }
    v
}

/// One AF_XDP socket's kernel counters for the final table, and the frames its reader
/// received.
fn socket_line(k: &SocketStatistics, per_worker: usize) -> String {
    let s = &k.stats;
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "socket {} (queue {}): rx_dropped {} rx_ring_full {} rx_fill_ring_empty {} \
         rx_invalid {} tx_invalid {} tx_ring_empty {} received {}",
        socket_owner(k, per_worker),
        k.queue,
        s.rx_dropped,
        opt(s.rx_ring_full),
        opt(s.rx_fill_ring_empty_descs),
        s.rx_invalid_descs,
        s.tx_invalid_descs,
        opt(s.tx_ring_empty_descs),
        k.received
    )
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
        xdp,
        xsk,
    } = l;
    let received = Arc::new(AtomicU64::new(0));
    // Shared receivers per worker: one per queue with --dispatch xdp.
    let per_worker = xdp.as_ref().map_or(1, |x| x.queues.len());
    let (mut p, mut dispatcher) = match xdp {
        None => {
            let mut p = Pipeline::new(nf, cfg)?;
            run::admit_all(&mut p, tenants, &a.choice.tenants)?;
            (p, None)
        }
        Some(parts) => {
            let (p, d) = start_xdp(nf, cfg, parts, a, tenants, &received)?;
            (p, Some(d))
        }
    };
    p.set_idle_wait(Duration::from_micros(a.idle_wait_us));
    // A worker found stuck or dead loses its tenants in the data plane's Worker Table;
    // the watcher then moves their rows in the XDP program's maps too, so the program
    // stops sending them to that worker's sockets.
    let lost = dispatcher.is_some().then(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        p.dataplane().on_worker_lost(move |w| {
            let _ = tx.send(w);
        });
        rx
    });
    let stop = afpacket::stop_on_signals().context("installing the SIGINT/SIGTERM handler")?;
    let oversize = Arc::new(OversizeWarning {
        iface: a.iface.clone(),
        said: AtomicBool::new(false),
    });
    p.add_port(Box::new(Counted {
        inner: rx,
        received: received.clone(),
        oversize: oversize.clone(),
        checked: Instant::now(),
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
    // The watcher stops the data plane on a signal or at the deadline, or when an
    // interface of the run is gone (its name no longer resolves to the index it had:
    // deleted, or moved to another namespace; looked up once a second), says when one goes
    // down or loses its carrier and when it is up again (the run goes on meanwhile), and
    // prints the rate every second when stderr is a terminal.
    let watched: Vec<(String, u32)> = std::iter::once(&a.iface)
        .chain(&a.tx_iface)
        .filter_map(|name| Some((name.clone(), afpacket::interface_index(name)?)))
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    // With --dispatch xdp it also moves the program's ring-buffer events into the run's.
    let watcher = {
        let control = p.control().clone();
        let done = done.clone();
        let received = received.clone();
        let tty = std::io::stderr().is_terminal();
        let mut dispatcher = dispatcher.take();
        let oversize = oversize.clone();
        std::thread::Builder::new()
            .name("buffet-run-watch".into())
            .spawn(move || {
                let (mut last_n, mut last_t) = (0u64, Instant::now());
                let mut checked = Instant::now();
                let mut looked = Instant::now();
                let mut gone = None;
                let mut links = vec![afpacket::Link::Up; watched.len()];
                while !done.load(Ordering::Acquire) {
                    if looked.elapsed() >= Duration::from_secs(1) {
                        looked = Instant::now();
                        gone = watched
                            .iter()
                            .find(|(name, i)| afpacket::interface_index(name) != Some(*i))
                            .map(|(name, _)| name.clone());
                        if gone.is_some() {
                            control.stop();
                            break;
                        }
                        for (i, ((name, _), was)) in watched.iter().zip(&mut links).enumerate() {
                            use afpacket::Link;
                            let now = afpacket::interface_link(name).unwrap_or(Link::Up);
                            if now != *was {
                                *was = now;
                                let what = match now {
                                    Link::Down => "is down",
                                    Link::NoCarrier => {
                                        "has no carrier (its cable or far end is down)"
                                    }
                                    Link::Up => "is up again",
                                };
                                // The first is --iface; a --tx-iface only sends.
                                let until = match (now, i) {
                                    (Link::Up, _) => "",
                                    (_, 0) => ": nothing arrives until it is up again",
                                    _ => {
                                        ": passed frames are not sent (counted as tx_dropped) \
                                         until it is up again"
                                    }
                                };
                                let cr = if tty { "\r" } else { "" };
                                eprintln!("{cr}interface {name} {what}{until}");
                            }
                        }
                    }
                    if let Some(d) = &mut dispatcher {
                        for w in lost.iter().flat_map(|rx| rx.try_iter()) {
                            close_lost_worker(d, w, tty);
                        }
                        control.dispatcher_events(d.drain_events());
                        // The kernel drops frames too large for a UMEM frame at the
                        // workers' sockets: their counters say so, not the port's.
                        if checked.elapsed() >= Duration::from_secs(1) {
                            checked = Instant::now();
                            if let Some(Ok(s)) = xsk.as_ref().map(XskStatsReader::read) {
                                oversize.saw(buffet_io::afxdp::receiver_drops(&s).oversize);
                            }
                        }
                    }
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
                (dispatcher, xsk, gone, lost)
            })
            .context("starting the stop watcher")?
    };
    let result = p.run(|_| {});
    done.store(true, Ordering::Release);
    let (mut dispatcher, xsk, gone, lost) = watcher.join().unwrap_or((None, None, None, None));
    if let Some(name) = &gone {
        eprintln!(
            "stopping: interface {name} is gone (deleted, or moved to another network \
             namespace)"
        );
    }
    // Detached before the report: nothing arrives any more; a detach that fails is said.
    let xdp_json = match &mut dispatcher {
        Some(d) => {
            // A worker found lost after the watcher's last look: its rows move before the
            // program's last events are read.
            for w in lost.iter().flat_map(|rx| rx.try_iter()) {
                close_lost_worker(d, w, false);
            }
            let late = d.drain_events();
            // A deleted interface took the program with it.
            if let Err(e) = d.detach() {
                if gone.is_none() {
                    eprintln!("detaching the XDP Packet Dispatcher from {}: {e}", a.iface);
                }
            }
            p.control().dispatcher_events(late);
            p.dataplane().apply_commands();
            let s = d
                .stats()
                .context("reading the XDP Packet Dispatcher's counters")?;
            Some((s, xdp_json(d, &s, &p, tenants)))
        }
        None => None,
    };
    let (xdp_stats, xdp_json) = xdp_json.unzip();
    // Packets the program policed never reach a worker: each tenant's row says how many
    // of its own were, as with the software dispatcher.
    let xdp_policed: Vec<(buffet_dispatch::TenantId, u64)> = match &dispatcher {
        Some(d) => tenants
            .iter()
            .filter_map(|t| Some((t.id, d.policed(p.slot_of(t.id)?).ok()?)))
            .filter(|&(_, n)| n > 0)
            .collect(),
        None => Vec::new(),
    };
    // Read once nothing arrives any more (the program is detached, the workers stopped).
    let sockets = match xsk.as_ref().map(XskStatsReader::read).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            eprintln!("reading the AF_XDP sockets' counters: {e}");
            Vec::new()
        }
    };
    drop(xsk);
    let n = match (result, &dispatcher) {
        (Ok(_), Some(_)) => received.load(Ordering::Relaxed),
        (r, _) => r?,
    };
    let took = start.elapsed();
    let faults = p.nf().contained_faults();
    // The ports' counters once the workers' last frames were sent (with --dispatch xdp,
    // those they finish while stopping leave only in `finish`).
    let (mut report, ports) = p.finish_with_port_stats();
    for (id, n) in xdp_policed {
        if let Some(t) = report.tenants.iter_mut().find(|t| t.id == id) {
            *t.drops.entry(DropReason::Policed.name()).or_default() += n;
        }
    }
    // The program sees every frame and the pipeline's own dispatcher none: its frames
    // seen, unmatched, malformed, no-live-worker and no-socket counts are the run's
    // global ones, as buffetd reports them.
    if let Some(s) = xdp_stats {
        let g = &mut report.global;
        g.input_packets += s.packets;
        g.unmatched += s.unmatched;
        g.no_live_worker += s.no_live_worker;
        g.no_socket += s.no_socket;
        if s.malformed > 0 {
            *g.malformed.entry("xdp").or_default() += s.malformed;
        }
        // The frames it passed that the kernel dropped at a worker's socket (its receive
        // ring full, no frame in the fill ring) never reached a worker, nor any tenant's
        // row: without them the global counts would not add up to the frames seen. Those
        // too large for a UMEM frame (GRO/LRO, TSO/GSO super-packets) are oversize.
        let lost = buffet_io::afxdp::receiver_drops(&sockets);
        g.oversize += lost.oversize;
        g.socket_dropped += lost.dropped;
        oversize.saw(lost.oversize);
    }
    // Frames too large that arrived in the last second, or in a run shorter than one.
    if let Some((_, s)) = ports.first() {
        oversize.saw(s.rx_oversize);
    }
    if let Some(e) = &report.sink_error {
        // Sending to a vanished interface fails too: the report still comes first.
        match &gone {
            None => anyhow::bail!("{}: {e}", a.iface),
            Some(_) => eprintln!("{}: {e}", a.iface),
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run::print_tenants(&mut out, &report)?;
    for (i, (name, s)) in ports.iter().enumerate() {
        writeln!(
            out,
            "port {name}: rx {} tx {} rx_dropped {} tx_dropped {}",
            s.rx, s.tx, s.rx_dropped, s.tx_dropped
        )?;
        // The receive port (the first) owns the AF_XDP sockets.
        if i == 0 {
            for k in &sockets {
                writeln!(out, "  {}", socket_line(k, per_worker))?;
            }
        }
    }
    if let Some(x) = &xdp_json {
        writeln!(
            out,
            "xdp dispatcher: packets {} passed {} unmatched {} malformed {} policed {} \
             no_live_worker {} events_lost {} no_socket {}",
            x["packets"],
            x["passed"],
            x["unmatched"],
            x["malformed"],
            x["policed"],
            x["no_live_worker"],
            x["events_lost"],
            x["no_socket"]
        )?;
    }
    run::print_events(&mut out, &report, 20)?;
    replay::print_faults(&mut out, &report.events, &faults, 20)?;
    eprintln!(
        "received {n} packets on {} in {:.3} s ({:.2} kpps)",
        a.iface,
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(1e-9) / 1e3
    );
    if let Some(mut f) = stats.take() {
        let mut input = serde_json::json!({
            "iface": a.iface,
            "packets": n,
            "seconds": took.as_secs_f64(),
            "ports": ports.iter().map(|(name, s)| port_json(name, s)).collect::<Vec<_>>(),
        });
        if !sockets.is_empty() {
            input["ports"][0]["sockets"] =
                sockets.iter().map(|k| socket_json(k, per_worker)).collect();
        }
        if let Some(x) = xdp_json {
            input["dispatch"] = "xdp".into();
            input["xdp"] = x;
        }
        replay::write_stats(&mut f, &report, input)?;
        f.commit()?;
    }
    if let Some(name) = gone {
        anyhow::bail!(
            "interface {name} is gone (deleted, or moved to another network namespace) \
             during the run"
        );
    }
    Ok(())
}

/// Stops the XDP program sending to worker `w`, found stuck or dead: its tenants' rows
/// to live workers and its Worker Table row closed; after [`buffet_xdp::GRACE`] the rows
/// fixed again (a program run that read the row as live just before it closed may have
/// migrated a tenant to it) and its sockets out of the XSKMAP. Says so on stderr.
fn close_lost_worker(d: &mut XdpDispatcher, w: buffet_dispatch::WorkerId, tty: bool) {
    let cr = if tty { "\r" } else { "" };
    match d.close_worker(w) {
        Ok(moved) => {
            std::thread::sleep(buffet_xdp::GRACE);
            let moved = moved.len() + d.resettle(w).len();
            eprintln!(
                "{cr}worker {} lost: its row in the XDP program's Worker Table closed, \
                 {moved} tenant(s) moved to live workers",
                w.0
            );
            if let Err(e) = d.clear_worker_socket(w) {
                eprintln!("worker {}: its sockets stay in the XSKMAP: {e}", w.0);
            }
        }
        Err(e) => eprintln!(
            "{cr}worker {} lost: the XDP program still sends its tenants to it: {e}",
            w.0
        ),
    }
}

/// Builds the pipeline with each worker polling its own socket, admits every tenant to
/// it and to the XDP maps (same slot, rules, MAX_NB and worker), then attaches the
/// program. An admission the maps refuse is an error before anything is attached.
fn start_xdp<N: RegisteredNf>(
    nf: N,
    cfg: PipelineConfig,
    parts: XdpParts,
    a: &RunArgs,
    tenants: &[TenantConfig],
    received: &Arc<AtomicU64>,
) -> anyhow::Result<(Pipeline<N>, XdpDispatcher)> {
    let mut d = XdpDispatcher::load(XdpConfig {
        shift: a.shift,
        threshold: a.threshold,
        // The workers take the tenant from the metadata alone; a DSCP tag would only
        // overwrite the frame's own DSCP, which the NFs (a chain's `dscp` guard, IPsec's
        // outer header) and the wire should see as it arrived.
        tag_dscp: false,
        metadata: true,
        test_mode: false,
        in_port: 0,
    })
    .context("--dispatch xdp")?;
    for sockets in &parts.receivers {
        let w = d.add_worker(cfg.worker_max_nb).context("--dispatch xdp")?;
        for rx in sockets {
            d.set_worker_socket(w, rx.queue(), &rx.socket_fd())
                .context("--dispatch xdp")?;
        }
    }
    let sources: Vec<Box<dyn WorkerSource>> = parts
        .receivers
        .into_iter()
        .map(|rx| {
            Box::new(XskSource {
                rx: XskReceivers::new(rx),
                received: received.clone(),
            }) as Box<dyn WorkerSource>
        })
        .collect();
    let mut p = Pipeline::with_sources(nf, cfg, sources)?;
    run::admit_all(&mut p, tenants, &a.choice.tenants)?;
    for t in tenants {
        let slot = p
            .slot_of(t.id)
            .with_context(|| format!("tenant {} has no slot", t.id))?;
        let worker = p
            .dispatcher()
            .scheduler()
            .tenant(slot)
            .map(|r| r.worker)
            .with_context(|| format!("tenant {} has no worker", t.id))?;
        d.admit(slot, &t.rules, t.max_nb, worker).with_context(|| {
            format!(
                "{}: tenant {} ({:?}) cannot be admitted to the XDP Packet Dispatcher",
                a.choice.tenants.display(),
                t.id,
                t.name
            )
        })?;
    }
    d.attach(&a.iface, parts.mode)
        .with_context(|| format!("--dispatch xdp on {}", a.iface))?;
    let on: Vec<String> = parts.queues.iter().map(u32::to_string).collect();
    eprintln!(
        "xdp dispatcher attached to {} in {} mode, {} workers' sockets on queue{} {}{}",
        a.iface,
        match parts.mode {
            AttachMode::Generic => "generic",
            AttachMode::Native => "native",
        },
        d.worker_count(),
        if on.len() > 1 { "s" } else { "" },
        on.join(","),
        if d.replaced_leftover() {
            " (replaced a program left attached by a run that ended without detaching)"
        } else {
            ""
        }
    );
    Ok((p, d))
}

/// The XDP program's counters and each tenant's Tenant Table row (worker, packets in
/// its current timeslot), for the report.
fn xdp_json<N: RegisteredNf>(
    d: &XdpDispatcher,
    s: &XdpStats,
    p: &Pipeline<N>,
    tenants: &[TenantConfig],
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = tenants
        .iter()
        .filter_map(|t| {
            let slot = p.slot_of(t.id)?;
            let (worker, pkt_nb) = d.tenant_row(slot)?;
            Some(serde_json::json!({
                "id": t.id,
                "slot": slot.0,
                "worker": worker.0,
                "slot_packets": pkt_nb,
                "policed": d.policed(slot).unwrap_or(0),
            }))
        })
        .collect();
    serde_json::json!({
        "packets": s.packets,
        "passed": s.passed,
        "unmatched": s.unmatched,
        "malformed": s.malformed,
        "policed": s.policed,
        "no_live_worker": s.no_live_worker,
        "events_lost": s.events_lost,
        "no_socket": s.no_socket,
        "tenants": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_queues, stripped_vlan_warning, QueueList};
    use buffet_config::TenantConfig;
    use std::path::Path;

    fn parse(s: &str) -> Result<Vec<u32>, String> {
        parse_queues(s).map(|QueueList(q)| q)
    }

    #[test]
    fn queues_are_ranges_and_lists_each_queue_once() {
        assert_eq!(parse("0-3"), Ok(vec![0, 1, 2, 3]));
        assert_eq!(parse("2"), Ok(vec![2]));
        assert_eq!(parse("0-1, 4"), Ok(vec![0, 1, 4]));
        let e = parse("0-2,1").unwrap_err();
        assert!(e.contains("queue 1 is named twice"), "{e}");
        let e = parse("3-1").unwrap_err();
        assert!(e.contains("from low to high"), "{e}");
        let e = parse("0-x").unwrap_err();
        assert!(e.contains("\"x\" is not a queue number"), "{e}");
        assert!(parse("").is_err());
    }

    #[test]
    fn a_vlan_rule_under_xdp_is_warned_about_naming_its_tenants() {
        let tenants = |toml: &str| -> Vec<TenantConfig> {
            use buffet_config::tenants::{parse, Format};
            parse(Format::Toml, Path::new("t.toml"), toml).unwrap()
        };
        let none = tenants("[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n");
        assert_eq!(
            stripped_vlan_warning(&none, Path::new("t.toml"), "eth0"),
            None
        );
        let two = tenants(
            "[[tenant]]\nid = 1\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n\
             [[tenant]]\nid = 4\nrules = [ { vlan = 12 } ]\n\
             [[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.7.0.0/16\" }, { vlan = 7, dst_port = 80, protocol = \"tcp\" } ]\n",
        );
        let w = stripped_vlan_warning(&two, Path::new("t.toml"), "eth0").unwrap();
        assert!(
            w.starts_with("warning: t.toml: tenants 4, 7 match on vlan"),
            "{w}"
        );
        assert!(w.contains("ethtool -K eth0 rxvlan off"), "{w}");
        assert!(w.contains("--port af-packet"), "{w}");
    }
}
