//! The DPDK port (cargo feature `io-dpdk`): one DPDK ethdev as a [`Port`], bound to the
//! system's DPDK (Debian's dpdk-dev 22.11, found with pkg-config by build.rs).
//!
//! [`DpdkPort::open`] initialises DPDK's EAL with [`DpdkConfig::eal_args`] — once per
//! process: the EAL cannot be initialised again, even after it was cleaned up, so a
//! second open is [`DpdkError::EalOnce`] — then takes one port (the device
//! [`DpdkConfig::device`] names, or the first the EAL found), makes an mbuf pool, sets up
//! one receive and one transmit queue and starts the device.
//!
//! * Receive: [`rx_burst`](Port::rx_burst) calls `rte_eth_rx_burst` and hands each
//!   mbuf's data room out as a port-owned [`PacketBuf`] — no copy between the driver's
//!   mbuf and the NF. [`recycle`](Port::recycle) frees a dropped frame's mbuf back to
//!   the pool. The arrival time is the wall clock, read once per burst. A frame in more
//!   than one segment (larger than an mbuf) is counted in
//!   [`PortStats::rx_dropped`] and [`PortStats::rx_oversize`] and freed.
//! * Transmit: a frame of this port's own mbufs goes to `rte_eth_tx_burst` as it is; a
//!   heap frame (or another port's) is copied into a fresh mbuf. What the driver does not
//!   take after a few tries is freed and counted in [`PortStats::tx_dropped`].
//! * Counters: frames received and sent by the port, plus the device's own
//!   (`rte_eth_stats_get`): `imissed`, `ierrors` and `rx_nombuf` are receive drops,
//!   `oerrors` transmit drops.
//! * Stop: dropping the port stops and closes the device, frees the pool and cleans the
//!   EAL up (`rte_eal_cleanup`). While frames are still lent out as `PacketBuf`s the pool
//!   and the EAL are left in place, since those frames point into the pool.
//!
//! On a kernel interface (a veth, any NIC without a DPDK driver) the device is DPDK's
//! `net_af_packet` vdev; [`DpdkConfig::for_iface`] derives those EAL arguments (and
//! `--no-huge` where no hugepages are reserved). A NIC bound to a DPDK driver (vfio-pci)
//! is chosen with the EAL's own `-a`/`--allow` argument.
//!
//! Not here: more than one queue, multi-segment (jumbo) frames, offloads (checksum,
//! VLAN strip, RSS), several DPDK ports in one process, secondary processes. All of the
//! `unsafe` is in `dpdk::sys`, over a small C shim that build.rs compiles.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use buffet_sdk::{PortId, TenantSlot};

use crate::buf::PacketBuf;
use crate::port::{HeapPool, Port, PortError, PortStats, Rx};

#[allow(unsafe_code)]
mod sys;

/// The DPDK release build.rs found (pkg-config `libdpdk --modversion`).
pub const DPDK_VERSION: &str = env!("BUFFET_DPDK_VERSION");

/// Set once `rte_eal_init` was called in this process (it cannot be called again).
static EAL_USED: AtomicBool = AtomicBool::new(false);

/// Mbufs per receive or transmit burst.
const BURST: usize = 256;
/// Bytes of an mbuf's data room: DPDK's 128-byte headroom plus a 2048-byte frame, as
/// large as a heap frame ([`FRAME_CAPACITY`](crate::FRAME_CAPACITY)).
const DATA_ROOM: u16 = 128 + 2048;
/// Tries of `rte_eth_tx_burst` before what is left of a burst is dropped.
const TX_TRIES: usize = 4;

/// How a [`DpdkPort`] is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpdkConfig {
    /// The EAL's arguments, without the program name (`--no-huge`, `--vdev=…`).
    pub eal_args: Vec<String>,
    /// The ethdev to use, by DPDK's device name (`net_af_packet0`); `None`: the first
    /// port the EAL found.
    pub device: Option<String>,
    /// The kernel interface behind a `net_af_packet` vdev, checked (exists, up) before
    /// the EAL starts; `None` for other devices.
    pub iface: Option<String>,
    /// The port id its received frames carry (and its frames' owner).
    pub id: PortId,
    /// Mbufs in the pool (a power of two minus one suits DPDK's ring best).
    pub mbufs: u32,
    /// Receive descriptors (adjusted to what the device accepts).
    pub rx_desc: u16,
    /// Transmit descriptors (adjusted likewise).
    pub tx_desc: u16,
    /// Put the device in promiscuous mode.
    pub promisc: bool,
}

impl DpdkConfig {
    /// A port on the device `eal_args` create (the first port), with 8191 mbufs (some
    /// 20 MB: the EAL has 64 MB in all under `--no-huge` unless `-m` says more) and
    /// 1024 descriptors per queue.
    pub fn new(eal_args: Vec<String>, id: PortId) -> DpdkConfig {
        DpdkConfig {
            eal_args,
            device: None,
            iface: None,
            id,
            mbufs: 8191,
            rx_desc: 1024,
            tx_desc: 1024,
            promisc: false,
        }
    }

    /// A port on the kernel interface `iface` through DPDK's `net_af_packet` vdev,
    /// unless `extra` chooses devices itself (`--vdev`, `-a`/`--allow`, `-b`/`--block`):
    /// see [`eal_args_for_iface`].
    pub fn for_iface(iface: &str, extra: &[String], id: PortId) -> DpdkConfig {
        let args = eal_args_for_iface(iface, extra, hugepages_reserved());
        let own_device = !chooses_device(extra);
        DpdkConfig {
            device: own_device.then(|| AF_PACKET_VDEV.to_owned()),
            iface: own_device.then(|| iface.to_owned()),
            ..DpdkConfig::new(args, id)
        }
    }
}

/// The name of the `net_af_packet` vdev [`DpdkConfig::for_iface`] creates.
pub const AF_PACKET_VDEV: &str = "net_af_packet0";

fn has_arg(args: &[String], names: &[&str]) -> bool {
    args.iter().any(|a| {
        names.iter().any(|n| {
            a == n
                || a.strip_prefix(n).is_some_and(|rest| rest.starts_with('='))
                // Short options take their value glued on too (`-a0000:01:00.0`).
                || (n.len() == 2 && !n.starts_with("--") && a.starts_with(n) && a.len() > 2)
        })
    })
}

fn chooses_device(extra: &[String]) -> bool {
    has_arg(extra, &["--vdev", "-a", "--allow", "-b", "--block"])
}

/// The EAL arguments for a port on kernel interface `iface`, followed by `extra`:
///
/// * no files shared with other DPDK processes, so runs do not collide: `--in-memory`
///   with hugepages, `--no-shconf` without (the EAL refuses `--in-memory` with
///   `--no-huge`) — unless `extra` sets the process type, a file prefix or either;
/// * `--no-telemetry`, unless `extra` says something about telemetry;
/// * unless `extra` chooses devices (`--vdev`, `-a`, `--allow`, `-b`, `--block`):
///   `--no-pci` and `--vdev=net_af_packet0,iface=IF`;
/// * `--no-huge` when `hugepages` is false and `extra` says nothing about memory
///   (`--no-huge`, `-m`, `--socket-mem`, `--huge-dir`).
pub fn eal_args_for_iface(iface: &str, extra: &[String], hugepages: bool) -> Vec<String> {
    let mut args = Vec::new();
    let add_no_huge =
        !hugepages && !has_arg(extra, &["--no-huge", "-m", "--socket-mem", "--huge-dir"]);
    let no_huge = add_no_huge || has_arg(extra, &["--no-huge"]);
    if !has_arg(
        extra,
        &["--in-memory", "--file-prefix", "--proc-type", "--no-shconf"],
    ) {
        args.push(
            if no_huge {
                "--no-shconf"
            } else {
                "--in-memory"
            }
            .to_owned(),
        );
    }
    if !has_arg(extra, &["--telemetry", "--no-telemetry"]) {
        args.push("--no-telemetry".to_owned());
    }
    if !chooses_device(extra) {
        if !has_arg(extra, &["--no-pci"]) {
            args.push("--no-pci".to_owned());
        }
        args.push(format!("--vdev={AF_PACKET_VDEV},iface={iface}"));
    }
    if add_no_huge {
        args.push("--no-huge".to_owned());
    }
    args.extend(extra.iter().cloned());
    args
}

/// Whether the kernel has hugepages reserved (/proc/meminfo `HugePages_Total`).
fn hugepages_reserved() -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Total:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .is_some_and(|n| n > 0)
}

/// Why a DPDK port could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DpdkError {
    /// The EAL was initialised in this process already.
    #[error(
        "dpdk: the EAL was initialised in this process already and cannot be again \
         (even after cleanup): one DPDK port per process"
    )]
    EalOnce,
    /// An EAL argument cannot be passed to C.
    #[error("dpdk: EAL argument {arg:?} contains a NUL byte")]
    EalArg {
        /// The argument.
        arg: String,
    },
    /// `rte_eal_init` failed.
    #[error(
        "dpdk: EAL init with `{args}` failed: {reason} (the EAL's own messages above say \
         why; hugepages need root and reserved pages, or --no-huge; the net_af_packet \
         vdev needs CAP_NET_RAW)"
    )]
    EalInit {
        /// The arguments, as one line.
        args: String,
        /// DPDK's `rte_errno` text.
        reason: String,
    },
    /// The kernel interface behind the `net_af_packet` vdev does not exist.
    #[error("interface {iface:?} does not exist in this network namespace (see `ip link`)")]
    NoSuchInterface {
        /// The interface.
        iface: String,
    },
    /// The kernel interface behind the `net_af_packet` vdev is down.
    #[error("interface {iface} is down: bring it up first (`ip link set {iface} up`)")]
    Down {
        /// The interface.
        iface: String,
    },
    /// The process may not open the packet socket the `net_af_packet` vdev needs.
    #[error(
        "dpdk on {iface}: the net_af_packet vdev needs CAP_NET_RAW (a packet socket); run \
         it as root or grant it with `setcap cap_net_raw,cap_net_admin+ep <binary>`"
    )]
    Privilege {
        /// The interface.
        iface: String,
    },
    /// The EAL found no port at all.
    #[error(
        "dpdk: no port after EAL init with `{args}`: create one with \
         --vdev=net_af_packet0,iface=IF or bind a NIC to a DPDK driver and allow it (-a)"
    )]
    NoPort {
        /// The arguments, as one line.
        args: String,
    },
    /// No port has the device name asked for.
    #[error("dpdk: no port is device {device:?} after EAL init with `{args}` ({ports} found)")]
    NoSuchDevice {
        /// The device name.
        device: String,
        /// The arguments, as one line.
        args: String,
        /// Ports the EAL found.
        ports: u16,
    },
    /// The mbuf pool could not be made.
    #[error(
        "dpdk: mempool of {mbufs} mbufs of {data_room} bytes: {reason} (EAL memory: with \
         --no-huge it is 64 MB unless -m gives more; with hugepages, what is reserved)"
    )]
    Mempool {
        /// Mbufs asked for.
        mbufs: u32,
        /// Bytes per mbuf data room.
        data_room: u16,
        /// DPDK's `rte_errno` text.
        reason: String,
    },
    /// A queue could not be set up.
    #[error("dpdk port {port} ({device}): {dir} queue 0 with {descriptors} descriptors: {reason}")]
    QueueSetup {
        /// The port.
        port: u16,
        /// Its device name.
        device: String,
        /// `receive` or `transmit`.
        dir: &'static str,
        /// Descriptors asked for.
        descriptors: u16,
        /// DPDK's text for the error.
        reason: String,
    },
    /// Configuring, starting or setting the mode of the device failed.
    #[error("dpdk port {port} ({device}): {call}: {reason}")]
    Device {
        /// The port.
        port: u16,
        /// Its device name.
        device: String,
        /// The DPDK call.
        call: &'static str,
        /// DPDK's text for the error.
        reason: String,
    },
}

/// One DPDK ethdev as a [`Port`]. See the module docs.
pub struct DpdkPort {
    cfg: DpdkConfig,
    port: u16,
    device: String,
    burst: sys::Burst,
    tx: Vec<sys::Mbuf>,
    started: bool,
    /// Frames lent out as `PacketBuf`s and not back yet.
    lent: u64,
    stats: PortStats,
    // Dropped after the device is closed (see `Drop`): the pool, then the EAL.
    pool: Option<sys::Pool>,
    eal: Option<sys::Eal>,
}

impl std::fmt::Debug for DpdkPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DpdkPort")
            .field("cfg", &self.cfg)
            .field("port", &self.port)
            .field("device", &self.device)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Whether this process has `CAP_NET_RAW` (/proc/self/status `CapEff`, bit 13).
fn has_net_raw() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 13) != 0)
}

/// Checks the kernel interface behind a `net_af_packet` vdev: it exists, it is up, and
/// this process may open a packet socket.
fn check_iface(iface: &str) -> Result<(), DpdkError> {
    let dir = std::path::Path::new("/sys/class/net").join(iface);
    if iface.is_empty() || iface.contains('/') || !dir.exists() {
        return Err(DpdkError::NoSuchInterface {
            iface: iface.to_owned(),
        });
    }
    let flags = std::fs::read_to_string(dir.join("flags"))
        .ok()
        .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok());
    if flags.is_some_and(|f| f & libc::IFF_UP as u32 == 0) {
        return Err(DpdkError::Down {
            iface: iface.to_owned(),
        });
    }
    if !has_net_raw() {
        return Err(DpdkError::Privilege {
            iface: iface.to_owned(),
        });
    }
    Ok(())
}

impl DpdkPort {
    /// Initialises the EAL and opens the port: see the module docs. Nothing is received
    /// before this returns; on an error everything set up so far is undone (the EAL
    /// stays unusable for this process).
    pub fn open(cfg: DpdkConfig) -> Result<DpdkPort, DpdkError> {
        if let Some(iface) = &cfg.iface {
            check_iface(iface)?;
        }
        let line = cfg.eal_args.join(" ");
        let mut argv = vec![CString::new("buffet").unwrap_or_default()];
        for a in &cfg.eal_args {
            argv.push(CString::new(a.as_str()).map_err(|_| DpdkError::EalArg { arg: a.clone() })?);
        }
        if EAL_USED.swap(true, Ordering::AcqRel) {
            return Err(DpdkError::EalOnce);
        }
        let eal = sys::Eal::init(argv).map_err(|e| DpdkError::EalInit {
            args: line.clone(),
            reason: sys::strerror(e),
        })?;
        let ports = sys::port_count(&eal);
        let port = match &cfg.device {
            Some(name) => {
                let c = CString::new(name.as_str())
                    .map_err(|_| DpdkError::EalArg { arg: name.clone() })?;
                sys::port_by_name(&eal, &c).ok_or_else(|| DpdkError::NoSuchDevice {
                    device: name.clone(),
                    args: line.clone(),
                    ports,
                })?
            }
            None => sys::first_port(&eal).ok_or(DpdkError::NoPort { args: line })?,
        };
        let device = sys::port_name(port).unwrap_or_else(|| format!("port{port}"));
        let socket = sys::socket_id(port);
        let pool = sys::Pool::create(&eal, c"buffet_mbufs", cfg.mbufs, 256, DATA_ROOM, socket)
            .map_err(|e| DpdkError::Mempool {
                mbufs: cfg.mbufs,
                data_room: DATA_ROOM,
                reason: sys::strerror(e),
            })?;
        let mut p = DpdkPort {
            cfg,
            port,
            device,
            burst: sys::Burst::new(BURST),
            tx: Vec::with_capacity(BURST),
            started: false,
            lent: 0,
            stats: PortStats::default(),
            pool: Some(pool),
            eal: Some(eal),
        };
        p.set_up(socket)?;
        Ok(p)
    }

    fn device_error(&self, call: &'static str, err: i32) -> DpdkError {
        DpdkError::Device {
            port: self.port,
            device: self.device.clone(),
            call,
            reason: sys::strerror(err),
        }
    }

    /// Configures the device, sets up its queues and starts it.
    fn set_up(&mut self, socket: i32) -> Result<(), DpdkError> {
        let (mut rxd, mut txd) = (self.cfg.rx_desc, self.cfg.tx_desc);
        sys::configure(self.port, &mut rxd, &mut txd)
            .map_err(|e| self.device_error("rte_eth_dev_configure", e))?;
        let queue_error = |dir, descriptors, e| DpdkError::QueueSetup {
            port: self.port,
            device: self.device.clone(),
            dir,
            descriptors,
            reason: sys::strerror(e),
        };
        let Some(pool) = &self.pool else {
            return Err(queue_error("receive", rxd, libc::ENOMEM));
        };
        sys::rx_queue_setup(self.port, rxd, socket, pool)
            .map_err(|e| queue_error("receive", rxd, e))?;
        sys::tx_queue_setup(self.port, txd, socket).map_err(|e| queue_error("transmit", txd, e))?;
        sys::start(self.port).map_err(|e| self.device_error("rte_eth_dev_start", e))?;
        self.started = true;
        if self.cfg.promisc {
            sys::promiscuous_enable(self.port)
                .map_err(|e| self.device_error("rte_eth_promiscuous_enable", e))?;
        }
        Ok(())
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &DpdkConfig {
        &self.cfg
    }

    /// DPDK's port number.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// DPDK's name of the device (`net_af_packet0`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Sends what is queued in `self.tx`, trying a few times; drops and counts the rest.
    fn flush_tx(&mut self) {
        for _ in 0..TX_TRIES {
            if self.tx.is_empty() {
                return;
            }
            let k = sys::Burst::tx(self.port, &mut self.tx);
            self.stats.tx += k as u64;
            if k == 0 {
                std::thread::yield_now();
            }
        }
        self.stats.tx_dropped += self.tx.len() as u64;
        self.tx.clear();
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Port for DpdkPort {
    fn name(&self) -> String {
        format!("dpdk:{}", self.device)
    }

    fn rx_burst(
        &mut self,
        _pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let k = self.burst.rx(self.port, max.min(self.burst.capacity()));
        if k == 0 {
            return Ok(Rx::Idle);
        }
        let ts_ns = now_ns();
        let mut n = 0;
        for m in self.burst.take() {
            self.stats.rx += 1;
            let v = m.view();
            // Larger than a frame buffer (an mbuf's data room): oversize, as the other
            // live ports count it.
            if v.segs != 1 || v.len > v.room {
                self.stats.rx_dropped += 1;
                self.stats.rx_oversize += 1;
                continue;
            }
            let mut b = m.lend(self.cfg.id);
            b.received(ts_ns, self.cfg.id, TenantSlot(0));
            out.push(b);
            n += 1;
        }
        self.lent += n as u64;
        Ok(if n == 0 { Rx::Idle } else { Rx::Packets(n) })
    }

    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        for buf in pkts.drain(..) {
            let len = buf.len();
            let mbuf = match buf.owner() {
                Some(o) if o.port == self.cfg.id => {
                    let m = sys::Mbuf::reclaim(buf, self.cfg.id);
                    if m.is_some() {
                        self.lent = self.lent.saturating_sub(1);
                    }
                    m.and_then(|mut m| m.set_len(len).then_some(m))
                }
                owner => {
                    let m = self
                        .pool
                        .as_ref()
                        .and_then(|p| p.alloc())
                        .and_then(|mut m| m.write(buf.data()).then_some(m));
                    // A heap frame goes back to the pool; another port's frame cannot go
                    // back to its port from here and is dropped (its port counts it lent).
                    if owner.is_none() {
                        pool.give(buf);
                    }
                    m
                }
            };
            match mbuf {
                Some(m) => self.tx.push(m),
                None => self.stats.tx_dropped += 1,
            }
            if self.tx.len() == BURST {
                self.flush_tx();
            }
        }
        self.flush_tx();
        Ok(())
    }

    fn recycle(&mut self, buf: PacketBuf) {
        if sys::Mbuf::reclaim(buf, self.cfg.id).is_some() {
            self.lent = self.lent.saturating_sub(1);
        }
    }

    fn is_live(&self) -> bool {
        true
    }

    fn stats(&self) -> PortStats {
        let mut s = self.stats;
        if let Some([_, _, imissed, ierrors, oerrors, rx_nombuf]) = sys::stats(self.port) {
            s.rx_dropped += imissed + ierrors + rx_nombuf;
            s.tx_dropped += oerrors;
            s.tx = s.tx.saturating_sub(oerrors);
        }
        s
    }
}

impl Drop for DpdkPort {
    fn drop(&mut self) {
        // Errors here have nowhere to go: the device is being given up either way.
        if self.started {
            let _ = sys::stop(self.port);
        }
        let _ = sys::close(self.port);
        for _ in self.burst.take() {}
        self.tx.clear();
        if self.lent != 0 {
            // `PacketBuf`s still point into the pool's memory: keep it, and the EAL.
            if let Some(p) = self.pool.take() {
                p.keep();
            }
            if let Some(e) = self.eal.take() {
                e.keep();
            }
            return;
        }
        drop(self.pool.take());
        drop(self.eal.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn an_interface_gets_an_af_packet_vdev_and_no_huge_without_hugepages() {
        assert_eq!(
            eal_args_for_iface("veth0", &[], false),
            s(&[
                "--no-shconf",
                "--no-telemetry",
                "--no-pci",
                "--vdev=net_af_packet0,iface=veth0",
                "--no-huge"
            ])
        );
        assert_eq!(
            eal_args_for_iface("eth1", &s(&["-l", "0"]), true),
            s(&[
                "--in-memory",
                "--no-telemetry",
                "--no-pci",
                "--vdev=net_af_packet0,iface=eth1",
                "-l",
                "0"
            ])
        );
    }

    #[test]
    fn extra_arguments_that_choose_say_so_once() {
        let extra = s(&[
            "--no-huge",
            "--no-pci",
            "--vdev",
            "net_af_packet0,iface=vethA",
        ]);
        assert_eq!(
            eal_args_for_iface("vethA", &extra, false),
            s(&[
                "--no-shconf",
                "--no-telemetry",
                "--no-huge",
                "--no-pci",
                "--vdev",
                "net_af_packet0,iface=vethA"
            ])
        );
        let extra = s(&["-a0000:3b:00.0", "--file-prefix=b1", "-m", "512"]);
        assert_eq!(
            eal_args_for_iface("eth0", &extra, false),
            s(&[
                "--no-telemetry",
                "-a0000:3b:00.0",
                "--file-prefix=b1",
                "-m",
                "512"
            ])
        );
        let cfg = DpdkConfig::for_iface("eth0", &s(&["--allow=0000:3b:00.0"]), 2);
        assert_eq!((cfg.device, cfg.iface, cfg.id), (None, None, 2));
        let cfg = DpdkConfig::for_iface("eth0", &[], 0);
        assert_eq!(cfg.device.as_deref(), Some(AF_PACKET_VDEV));
        assert_eq!(cfg.iface.as_deref(), Some("eth0"));
    }

    #[test]
    fn a_missing_interface_is_refused_before_the_eal_starts() {
        let e = DpdkPort::open(DpdkConfig::for_iface("buffet-nope0", &[], 0)).unwrap_err();
        assert!(matches!(e, DpdkError::NoSuchInterface { .. }), "{e}");
        assert!(!EAL_USED.load(Ordering::Acquire), "the EAL was not touched");
    }
}
