//! The XDP Packet Dispatcher in the daemon (`[dispatch] mode = "xdp"`): the program of
//! nic-firmware/xdp (through buffet-xdp) attached to the one `af_xdp` port's interface,
//! classifying, scheduling (Algorithm 1 on `bpf_ktime_get_ns()`) and tagging every frame
//! and redirecting it to its worker's own AF_XDP socket on the frame's receive queue, all
//! sockets sharing the port's UMEM. The port reads `queue`, or each of `queues`: every
//! worker has one socket per queue (the kernel delivers a redirect only to a socket of
//! the frame's own queue) and polls them round robin. The data plane's thread owns the
//! port (per queue its fill and completion rings, and the transmit ring).
//!
//! What it does: opens the sockets (one set, a socket per queue, per worker the config
//! allows, `max_workers`, so that workers launched later get one), loads and attaches
//! the program, and mirrors every control change into its maps, in the order that keeps
//! frames safe:
//!
//! * admission: the data plane admits first (state built off the data path), then the
//!   tenant's rules, MAX_NB and initial worker (the live worker with the fewest tenants)
//!   go into the maps; rules the XDP classifier cannot express are refused by
//!   [`XdpSide::check_rules`] before anything changes;
//! * removal: out of the maps first; then a grace period ([`GRACE`]) for program runs
//!   that already chose a socket, then every live worker is waited for until its socket
//!   was seen empty ([`XdpSide::drain`]); only then does the data plane free the state;
//! * update: the new state is published by the data plane (one atomic swap), then the
//!   rules change in one step ([`buffet_xdp::XdpDispatcher::replace_rules`]: written
//!   into the program's inactive rule bank, which then becomes the active one), so a
//!   packet is classified entirely under the old rules or entirely under the new ones;
//!   docs/daemon.md says which state each may run on;
//! * launch: a spare set of sockets goes to the new worker, then each into the XSKMAP at
//!   its queue's key, then its Worker Table row opens;
//! * terminate (and a worker found stuck or dead): its tenants' rows are rewritten to
//!   live workers and its row closed, then after [`GRACE`] its sockets leave the XSKMAP
//!   (every queue's) and only then is the worker stopped — it runs everything in its
//!   sockets before it exits (a stuck one cannot: what is in its sockets stays there).
//!
//! The program's ring-buffer events (migrations, overload reports) are moved into the
//! data plane's events every [`EVENT_PERIOD`] by a thread of this module, so the Agent,
//! `/v1/events` and `/metrics` see them like the software dispatcher's. What the kernel
//! dropped at the workers' sockets ([`XdpSide::socket_drops`]) goes into every report
//! taken while the daemon runs (`/v1/stats`, `/metrics`) as `global.socket_dropped` and
//! `global.oversize`, as `buffet run --dispatch xdp` counts it, and into the final report
//! `Daemon::stop` returns, with the program's counters.
//!
//! What it does not do: offload to a NIC (the nfp subset), the "ours" planner. Worker ids are the same in the data plane and the program's Worker
//! Table; a terminated worker's row is never reused, so at most
//! [`buffet_xdp::MAX_WORKERS`] workers are ever launched in one run.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use buffet_dispatch::{Match, TenantSlot, WorkerId};
use buffet_io::afxdp::{AfXdpConfig, AfXdpPort, ReceiverDrops, XskReceivers, XskStatsReader};
use buffet_io::{Outcome, PacketBuf};
use buffet_worker::WorkerSource;
use buffet_xdp::{AttachMode, XdpConfig, XdpDispatcher, XdpStats};
use crossbeam::channel::{Receiver, Sender};

use crate::config::{AfXdpPortConfig, DaemonConfig};

pub use buffet_xdp::GRACE;

/// How often the program's ring buffer is drained into the data plane's events.
pub const EVENT_PERIOD: Duration = Duration::from_millis(20);

/// How long a removal waits for the workers to empty their sockets before it goes on
/// (a worker stuck in a handler never does; see docs/daemon.md).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Most frames a worker takes from its socket at once (the data plane's burst).
const WORKER_BURST: u64 = 256;

/// Why the XDP Packet Dispatcher could not start; nothing stays attached.
#[derive(Debug, thiserror::Error)]
pub enum XdpStartError {
    /// The port or a worker's socket.
    #[error("port[0]: {0}")]
    Port(String),
    /// Loading the program or filling its Worker Table.
    #[error("dispatch.mode = \"xdp\": {0}")]
    Program(String),
    /// Attaching the program to the interface (names the interface; native mode on an
    /// MTU the driver's native XDP cannot take says what to do, as `buffet run` does).
    #[error("dispatch.mode = \"xdp\": {0}")]
    Attach(buffet_xdp::AttachError),
}

/// The attach error as buffetd shows it: native mode refused for the interface's MTU
/// names the port's `xdp_mode` setting as the way to generic mode (not `buffet run`'s
/// flag).
fn attach_error(e: buffet_xdp::AttachError) -> XdpStartError {
    XdpStartError::Attach(match e {
        buffet_xdp::AttachError::NativeMtu { iface, .. } => buffet_xdp::AttachError::NativeMtu {
            why: buffet_io::afxdp::native_mtu_refused_or(
                &iface,
                "xdp_mode = \"generic\" in port[0]",
            ),
            iface,
        },
        e => e,
    })
}

/// Why an XDP map change was refused; when it is, nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum XdpChangeError {
    /// A tenant's rules cannot go into the XDP classifier (names the rule).
    #[error("tenant {tenant}: {source}")]
    Rules {
        /// The tenant.
        tenant: u32,
        /// Why.
        source: buffet_xdp::RuleCheckError,
    },
    /// The Worker Table refused (not live, the last live worker).
    #[error(transparent)]
    Worker(#[from] buffet_xdp::WorkerTableError),
    /// No worker can be launched: its Worker Table or its sockets are used up.
    #[error("{0}")]
    Capacity(String),
    /// A map write failed.
    #[error("the XDP dispatcher's maps: {0}")]
    Map(String),
}

/// What `start` opened before the NF is loaded: the port, the program, the sockets.
pub struct XdpStart {
    pub(crate) port: AfXdpPort,
    pub(crate) side: Arc<XdpSide>,
    /// The initial workers' sources, in worker order.
    pub(crate) sources: Vec<Box<dyn WorkerSource>>,
    pub(crate) iface: String,
    pub(crate) mode: AttachMode,
}

/// Opens the `af_xdp` port (no redirect program of its own, metadata on) on its queues,
/// per worker up to `dataplane.max_workers` one socket per queue sharing its UMEM, loads
/// the program and fills its Worker Table with the initial workers. The program is
/// attached by `XdpSide::attach` once the data plane runs.
pub fn open(cfg: &DaemonConfig, x: &AfXdpPortConfig) -> Result<XdpStart, XdpStartError> {
    buffet_xdp::dispatcher_object().map_err(|e| XdpStartError::Program(e.to_string()))?;
    let queues = x.queues.clone().unwrap_or_else(|| vec![x.tx_queue()]);
    buffet_xdp::check_queues(&queues).map_err(|e| XdpStartError::Port(e.to_string()))?;
    let unread = buffet_io::afxdp::unread_queues(&x.iface, &queues);
    if !unread.is_empty() {
        eprintln!(
            "buffetd: warning: {} also receives on queue(s) {unread:?}, which the config's \
             queues do not name: the XDP Packet Dispatcher drops the frames it finds there \
             and counts them as no_socket",
            x.iface
        );
    }
    let mut port = AfXdpPort::open(AfXdpConfig {
        queue: x.tx_queue(),
        queues: if queues.len() > 1 {
            queues.clone()
        } else {
            Vec::new()
        },
        redirect: None,
        metadata: true,
        frames: AfXdpConfig::frames_for_queues(queues.len()),
        ..AfXdpConfig::new(&x.iface, 0)
    })
    .map_err(|e| XdpStartError::Port(e.to_string()))?;
    let d = &cfg.dataplane;
    let mut receivers = Vec::new();
    for _ in 0..d.max_workers.max(d.workers) {
        let mut set = Vec::with_capacity(queues.len());
        for &q in &queues {
            set.push(port.shared_receiver_on(q).map_err(|e| {
                XdpStartError::Port(format!(
                    "a socket per worker on each of {} queue(s) {queues:?}, sharing one \
                     UMEM: {e}",
                    x.iface
                ))
            })?);
        }
        receivers.push(XskReceivers::new(set));
    }
    // Every worker's socket is open (a launched worker takes a spare set): the reader
    // sees them all for the whole run.
    let sockets = port.statistics_reader();
    let mut dispatcher = XdpDispatcher::load(XdpConfig {
        shift: d.shift,
        threshold: d.threshold,
        // The workers take the tenant from the metadata alone; a DSCP tag would only
        // overwrite the frame's own DSCP, which the NFs and the wire should see as it
        // arrived.
        tag_dscp: false,
        metadata: true,
        test_mode: false,
        in_port: 0,
    })
    .map_err(|e| XdpStartError::Program(e.to_string()))?;
    let worker_max_nb = if d.worker_max_nb == 0 {
        u64::MAX
    } else {
        d.worker_max_nb
    };
    let (back_tx, back_rx) = crossbeam::channel::unbounded();
    let spare = receivers
        .split_off(usize::from(d.workers))
        .into_iter()
        .map(|rx| (rx, false))
        .collect();
    let mut sources: Vec<Box<dyn WorkerSource>> = Vec::new();
    for rx in receivers {
        let w = dispatcher
            .add_worker(worker_max_nb)
            .map_err(|e| XdpStartError::Program(e.to_string()))?;
        for socket in rx.sockets() {
            dispatcher
                .set_worker_socket(w, socket.queue(), &socket.socket_fd())
                .map_err(|e| XdpStartError::Program(e.to_string()))?;
        }
        sources.push(Box::new(XdpSource::new(rx, back_tx.clone(), false)));
    }
    let mode = match x.xdp_mode.as_str() {
        "native" => AttachMode::Native,
        // "auto" and "generic": generic, as `buffet run --dispatch xdp`.
        _ => AttachMode::Generic,
    };
    let side = Arc::new(XdpSide {
        d: Mutex::new(dispatcher),
        spare: Mutex::new(spare),
        back_tx,
        back_rx,
        worker_max_nb,
        ring_size: port.config().ring_size,
        queues: queues.len() as u32,
        sockets,
        admitted: Mutex::new(std::collections::HashMap::new()),
        stop: AtomicBool::new(false),
        pump: Mutex::new(None),
    });
    Ok(XdpStart {
        port,
        side,
        sources,
        iface: x.iface.clone(),
        mode,
    })
}

/// A worker's AF_XDP sockets (one per queue, read round robin) as its [`WorkerSource`].
/// When the worker's thread ends (a terminated worker, after it emptied the sockets; or
/// a dead one) the sockets go back to the spare ones for the next launch.
struct XdpSource {
    rx: Option<XskReceivers>,
    back: Sender<XskReceivers>,
    /// Sockets an earlier worker left behind: what is still in them (a dead worker's
    /// frames) was redirected before that worker ended, under tenant slots that may have
    /// been removed and reused since. Handed back unrun, as `NoTenant`, until the
    /// sockets are first found empty (all of them in one call).
    stale: bool,
}

impl XdpSource {
    fn new(rx: XskReceivers, back: Sender<XskReceivers>, stale: bool) -> XdpSource {
        XdpSource {
            rx: Some(rx),
            back,
            stale,
        }
    }
}

impl WorkerSource for XdpSource {
    fn receive(
        &mut self,
        burst: &mut Vec<PacketBuf>,
        rejected: &mut Vec<PacketBuf>,
        max: usize,
    ) -> usize {
        let Some(rx) = &mut self.rx else {
            return 0;
        };
        if !self.stale {
            return rx.receive(burst, rejected, max);
        }
        let (start, before) = (burst.len(), rejected.len());
        rx.receive(burst, rejected, max);
        if burst.len() == start && rejected.len() == before {
            self.stale = false;
        }
        for mut m in burst.drain(start..) {
            m.outcome = Outcome::NoTenant;
            rejected.push(m);
        }
        0
    }

    /// The worker's sockets: an idle worker blocks on them (a frame redirected to one
    /// wakes it).
    fn readiness_fds(&self) -> Option<Vec<std::os::fd::RawFd>> {
        self.rx.as_ref().map(XskReceivers::readiness_fds)
    }
}

impl Drop for XdpSource {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            let _ = self.back.send(rx);
        }
    }
}

/// A worker's sockets for the XSKMAP: `(queue, descriptor)`, one per queue.
pub type SocketFds = Vec<(u32, RawFd)>;

/// A tenant's classifier rules and MAX_NB, as last put into the maps.
type KeptRules = (Vec<(u32, Match)>, u64);

/// The program and the sockets, shared by the data plane's control surface and the
/// event thread. Every map change is made under its lock, one at a time.
pub struct XdpSide {
    d: Mutex<XdpDispatcher>,
    /// Socket sets (one socket per queue) no worker holds, each with whether a worker
    /// held it before (stale).
    spare: Mutex<Vec<(XskReceivers, bool)>>,
    back_tx: Sender<XskReceivers>,
    back_rx: Receiver<XskReceivers>,
    worker_max_nb: u64,
    /// Descriptors each socket's receive ring holds.
    ring_size: u32,
    /// Sockets per worker (one per queue).
    queues: u32,
    /// The kernel's counters of the port's sockets and of every worker's.
    sockets: XskStatsReader,
    /// Per admitted slot: its rules and MAX_NB (to put it back if a removal fails half
    /// way).
    admitted: Mutex<std::collections::HashMap<u32, KeptRules>>,
    stop: AtomicBool,
    pump: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn map_err(e: impl std::fmt::Display) -> XdpChangeError {
    XdpChangeError::Map(e.to_string())
}

impl XdpSide {
    /// Attaches the program to `iface` and starts the event thread, which hands the
    /// program's events to `sink` every [`EVENT_PERIOD`].
    pub(crate) fn attach(
        self: &Arc<Self>,
        iface: &str,
        mode: AttachMode,
        sink: impl Fn(Vec<buffet_dispatch::Event>) + Send + 'static,
    ) -> Result<(), XdpStartError> {
        {
            let mut d = lock(&self.d);
            d.attach(iface, mode).map_err(attach_error)?;
            eprintln!(
                "buffetd: XDP Packet Dispatcher attached to {iface} in {} mode, {} workers{}",
                match mode {
                    AttachMode::Generic => "generic",
                    AttachMode::Native => "native",
                },
                d.worker_count(),
                if d.replaced_leftover() {
                    " (replaced a program left attached by a run that ended without detaching)"
                } else {
                    ""
                }
            );
        }
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("buffetd-xdp".into())
            .spawn(move || {
                while !me.stop.load(Ordering::Acquire) {
                    let events = lock(&me.d).drain_events();
                    if !events.is_empty() {
                        sink(events);
                    }
                    std::thread::sleep(EVENT_PERIOD);
                }
            })
            .map_err(|e| XdpStartError::Program(format!("cannot start its event thread: {e}")))?;
        *lock(&self.pump) = Some(thread);
        Ok(())
    }

    /// Detaches the program (nothing new arrives), then stops the event thread after a
    /// last drain.
    pub(crate) fn detach(
        &self,
        sink: impl Fn(Vec<buffet_dispatch::Event>),
    ) -> Result<(), buffet_xdp::AttachError> {
        let mut d = lock(&self.d);
        let iface = d.attached_to().unwrap_or_default().to_owned();
        let r = d
            .detach()
            .map_err(|source| buffet_xdp::AttachError::Attach { iface, source });
        self.stop.store(true, Ordering::Release);
        let late = d.drain_events();
        drop(d);
        if let Some(t) = lock(&self.pump).take() {
            let _ = t.join();
        }
        sink(late);
        r
    }

    /// Whether the XDP classifier can hold `rules` of tenant `tenant` next to every rule
    /// it holds now (for an update, the tenant's old rules count as still there).
    pub fn check_rules(&self, tenant: u32, rules: &[(u32, Match)]) -> Result<(), XdpChangeError> {
        lock(&self.d)
            .check_rules(rules)
            .map_err(|source| XdpChangeError::Rules { tenant, source })
    }

    /// Puts an admitted tenant (slot `slot`) into the maps on the live worker with the
    /// fewest tenants.
    pub fn admit(
        &self,
        tenant: u32,
        slot: TenantSlot,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<WorkerId, XdpChangeError> {
        let mut d = lock(&self.d);
        let w = d
            .least_loaded_worker(None)
            .ok_or_else(|| XdpChangeError::Capacity("no live worker".into()))?;
        d.admit(slot, rules, max_nb, w).map_err(|e| match e {
            buffet_xdp::AdmitError::InvalidRule { index, source, .. } => XdpChangeError::Rules {
                tenant,
                source: buffet_xdp::RuleCheckError::InvalidRule { index, source },
            },
            other => XdpChangeError::Map(format!("tenant {tenant}: {other}")),
        })?;
        lock(&self.admitted).insert(slot.0, (rules.to_vec(), max_nb));
        Ok(w)
    }

    /// Replaces an admitted tenant's rules and MAX_NB in the maps, the rules in one step
    /// (see the module docs). On error the program's rules did not change.
    pub fn update(
        &self,
        tenant: u32,
        slot: TenantSlot,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<(), XdpChangeError> {
        lock(&self.d)
            .replace_rules(slot, rules, max_nb)
            .map_err(|e| XdpChangeError::Map(format!("tenant {tenant}: {e}")))?;
        lock(&self.admitted).insert(slot.0, (rules.to_vec(), max_nb));
        Ok(())
    }

    /// Takes tenant slot `slot` out of the maps: from the return on, the program counts
    /// its frames as unmatched.
    pub fn remove(&self, slot: TenantSlot) -> Result<(), XdpChangeError> {
        lock(&self.d).remove(slot).map_err(map_err)?;
        Ok(())
    }

    /// Puts a slot taken out by [`remove`](Self::remove) back (a removal the data plane
    /// then refused).
    pub fn restore(&self, tenant: u32, slot: TenantSlot) -> Result<(), XdpChangeError> {
        let kept = lock(&self.admitted).get(&slot.0).cloned();
        match kept {
            Some((rules, max_nb)) => self.admit(tenant, slot, &rules, max_nb).map(drop),
            None => Ok(()),
        }
    }

    /// Forgets what [`restore`](Self::restore) would need of a removed slot.
    pub fn forget(&self, slot: TenantSlot) {
        lock(&self.admitted).remove(&slot.0);
    }

    /// Waits until no frame the program redirected before now is still in a live
    /// worker's socket or burst: [`GRACE`] for program runs in progress, then until every
    /// live worker either reported its input empty with nothing held back since, or took
    /// more frames from its socket since than the socket's ring and one burst hold (its
    /// ring is first in, first out: everything that was in it has then been taken, and
    /// run before its next receive; with several queues, all its sockets' rings). `progress` is the data plane's
    /// `Control::worker_progress`. A worker that does neither within [`DRAIN_TIMEOUT`]
    /// (stuck in a handler) is not waited for; returns the workers not waited for.
    pub fn drain(&self, progress: impl Fn(WorkerId) -> Option<(u64, u64)>) -> Vec<WorkerId> {
        std::thread::sleep(GRACE);
        let live = lock(&self.d).live_workers();
        let snap: Vec<(WorkerId, Option<(u64, u64)>)> =
            live.iter().map(|&w| (w, progress(w))).collect();
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        let window = u64::from(self.ring_size) * u64::from(self.queues) + WORKER_BURST;
        loop {
            let waiting: Vec<WorkerId> = snap
                .iter()
                .filter(|(w, before)| match (before, progress(*w)) {
                    (Some((idle0, rx0)), Some((idle, rx))) => {
                        idle <= *idle0 && rx.wrapping_sub(*rx0) <= window
                    }
                    _ => false,
                })
                .map(|(w, _)| *w)
                .collect();
            if waiting.is_empty() || Instant::now() >= deadline {
                return waiting;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A spare set of sockets (one per queue) for a worker about to be launched, and
    /// their (queue, descriptor) for the XSKMAP; refused when the Worker Table or the
    /// sockets are used up.
    pub fn take_socket(&self) -> Result<(Box<dyn WorkerSource>, SocketFds), XdpChangeError> {
        let n = lock(&self.d).worker_count();
        if n >= buffet_xdp::MAX_WORKERS {
            return Err(XdpChangeError::Capacity(format!(
                "the XDP dispatcher's Worker Table is full: {n} workers were launched in \
                 this run (a terminated worker's row is not reused)"
            )));
        }
        let mut spare = lock(&self.spare);
        spare.extend(self.back_rx.try_iter().map(|rx| (rx, true)));
        let (rx, stale) = spare.pop().ok_or_else(|| {
            XdpChangeError::Capacity(
                "no spare set of AF_XDP sockets (one per queue): there are dataplane.max_workers of them (at start) \
                 and every one is held by a worker (one found stuck keeps its own)"
                    .into(),
            )
        })?;
        let fds = rx
            .sockets()
            .iter()
            .map(|s| (s.queue(), s.socket_fd().as_raw_fd()))
            .collect();
        Ok((
            Box::new(XdpSource::new(rx, self.back_tx.clone(), stale)),
            fds,
        ))
    }

    /// Opens worker `w` (just launched by the data plane, polling the sockets `fds`, one
    /// `(queue, descriptor)` per queue): each socket into the XSKMAP at its queue's key,
    /// then its Worker Table row. On error its entries are taken out again.
    pub fn open_worker(&self, w: WorkerId, fds: &[(u32, RawFd)]) -> Result<(), XdpChangeError> {
        let mut d = lock(&self.d);
        if d.worker_count() != w.0 {
            return Err(XdpChangeError::Capacity(format!(
                "worker {} would be row {} of the XDP dispatcher's Worker Table: the data \
                 plane and the program disagree on worker ids (restart the daemon)",
                w.0,
                d.worker_count()
            )));
        }
        for &(queue, fd) in fds {
            if let Err(e) = d.set_worker_socket(w, queue, &fd) {
                let _ = d.clear_worker_socket(w);
                return Err(map_err(e));
            }
        }
        let row = match d.add_worker(self.worker_max_nb) {
            Ok(row) => row,
            Err(e) => {
                let _ = d.clear_worker_socket(w);
                return Err(XdpChangeError::Map(e.to_string()));
            }
        };
        debug_assert_eq!(row, w);
        Ok(())
    }

    /// Takes worker `w`'s sockets out of the XSKMAP on every queue (none left: nothing).
    pub fn clear_sockets(&self, w: WorkerId) -> Result<(), XdpChangeError> {
        lock(&self.d).clear_worker_socket(w).map_err(map_err)
    }

    /// Stops the program choosing worker `w`: its tenants' rows to live workers, its row
    /// closed, then after [`GRACE`] the rows fixed again (a program run that read the row
    /// as live before it closed may have migrated a tenant to it) and its sockets out of
    /// the XSKMAP (on every queue). Returns how many tenants moved. Nothing changed when refused.
    pub fn close_worker(&self, w: WorkerId) -> Result<usize, XdpChangeError> {
        let moved = lock(&self.d).close_worker(w)?.len();
        std::thread::sleep(GRACE);
        let mut d = lock(&self.d);
        let late = d.resettle(w).len();
        d.clear_worker_socket(w).map_err(map_err)?;
        Ok(moved + late)
    }

    /// Whether worker `w`'s Worker Table row is open.
    pub fn is_live(&self, w: WorkerId) -> bool {
        lock(&self.d).live_workers().contains(&w)
    }

    /// What the kernel dropped at the workers' sockets so far (cumulative): frames the
    /// program passed that never reached a worker ([`buffet_io::afxdp::receiver_drops`]).
    /// Nothing when the counters cannot be read.
    pub fn socket_drops(&self) -> ReceiverDrops {
        self.sockets
            .read()
            .map(|s| buffet_io::afxdp::receiver_drops(&s))
            .unwrap_or_default()
    }

    /// The program's counters, and per admitted slot its Tenant Table worker and the
    /// frames the program policed.
    pub fn snapshot(&self, slots: &[TenantSlot]) -> (XdpStats, Vec<Option<(WorkerId, u64)>>) {
        let d = lock(&self.d);
        let stats = d.stats().unwrap_or_default();
        let rows = slots
            .iter()
            .map(|&s| {
                let (w, _) = d.tenant_row(s)?;
                Some((w, d.policed(s).unwrap_or(0)))
            })
            .collect();
        (stats, rows)
    }
}
