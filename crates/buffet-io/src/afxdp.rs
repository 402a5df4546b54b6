//! The AF_XDP port: a live Linux interface through an XDP socket whose frames are the
//! data plane's packet buffers.
//!
//! One [`AfXdpPort`] is one socket bound to one queue of one interface
//! ([`AfXdpConfig::queue`]), or one socket per queue of several
//! ([`AfXdpConfig::queues`]), with one UMEM (a region of `frames × frame_size` bytes
//! this process maps and registers with the kernel) and the rings shared with the
//! kernel: per socket a fill ring (frames the kernel may receive into) and a receive
//! ring; on the first queue's socket also the transmit and completion (frames the kernel
//! has sent) rings.
//!
//! * Receive: [`rx_burst`](Port::rx_burst) reads descriptors off the receive ring and
//!   hands each frame out as a port-owned [`PacketBuf`] over the UMEM — no copy between
//!   the socket and the NF. [`recycle`](Port::recycle) takes a frame back and the next
//!   burst returns it to the fill ring. The arrival time is the wall clock read once per
//!   burst (AF_XDP carries no kernel receive time).
//! * Transmit: a frame of this port's UMEM goes on the transmit ring as it is (no copy);
//!   a heap frame (or another port's) is copied into a free UMEM frame. The completion
//!   ring is reaped before every burst, returning sent frames to the free list. Copy
//!   mode sends only from a `sendto` kick; the kernel sends at most 32 frames per kick,
//!   so the port kicks until the ring is empty or the kernel is busy, and kicks again on
//!   the next burst while frames are waiting. While the kernel refuses the kick because
//!   the interface is down or gone (`ENETDOWN`, `ENXIO`), frames to send are dropped and
//!   counted instead of queued (the ring gives no way to take back the descriptors of
//!   the burst that found out: those go out once the interface is up again). An
//!   interface up without carrier takes each frame and its device drops it: the kick
//!   fails with `EBUSY` for that frame (copy mode), which is counted as dropped, not
//!   sent, and the port kicks again until the ring is empty.
//! * Counters: frames received, frames sent (the kernel's completions; at the end of a
//!   run, [`Port::flush`] counts what it has not completed as dropped), the kernel's drops
//!   (`XDP_STATISTICS`: no fill-ring frame, receive ring full, invalid descriptors) and
//!   the transmit descriptors it refused. Each socket's own kernel counters, apart
//!   ([`XskStatistics`]: which ring ran full or empty), come from
//!   [`AfXdpPort::statistics_reader`], for the port's sockets and its shared receivers
//!   alike, readable from any thread.
//! * Mode: bound without `XDP_COPY`/`XDP_ZEROCOPY` the kernel uses zero copy where the
//!   driver supports it and copy mode elsewhere (veth); [`CopyMode`] forces either.
//!
//! A socket receives only what an XDP program redirects to it. With
//! [`AfXdpConfig::redirect`] set the port loads and attaches its own six-instruction
//! program ([`RedirectProgram`]: `bpf_redirect_map(&xskmap, ctx->rx_queue_index,
//! XDP_PASS)`) and detaches it when dropped; a Ctrl-C or SIGTERM stops the run, which
//! drops the port. A program of an earlier run that was killed before it could detach is
//! recognised by its name (`bfxsk_` and the run's pid, which no longer exists) and
//! replaced; a live run's program or anyone else's is an error, not replaced. With
//! `redirect: None` no program is attached: a caller with its own XSKMAP (one socket
//! per (queue, worker), as the XDP Packet Dispatcher does) inserts
//! [`AfXdpPort::socket_fd`] or its receivers' sockets there itself.
//!
//! Opening checks, before anything is attached: the interface exists in this network
//! namespace and is up, the queue exists, the sizes are usable, the process may open an
//! XDP socket and load and attach a program (`CAP_NET_ADMIN`, `CAP_NET_RAW`,
//! `CAP_BPF`); each failure is its own [`AfXdpError`].
//!
//! Several queues ([`AfXdpConfig::queues`]): a NIC spreads what it receives over its
//! queues (RSS), and a socket sees only its own queue's share. The sockets after the
//! first bind their own queue with the first socket's UMEM (`XDP_SHARED_UMEM` across
//! queues, Linux 5.10 and later), for which the kernel wants each to have its own fill
//! and completion rings. One UMEM rather than one per queue: a frame received on any
//! queue leaves through the transmit queue without a copy, and a frame coming back needs
//! no lookup of whose memory it is. Each fill ring holds at most its share of half the
//! UMEM (`frames / (2 × queues)`, capped at its ring size), so that no queue takes every
//! free frame. [`rx_burst`](Port::rx_burst) reads the queues round robin: each burst
//! starts one queue further, and every queue may take its share of the burst (`max /
//! queues`, rounded up) before any takes more, so a busy queue never starves another.
//! Frames are sent on the first queue only ([`AfXdpConfig::queue`]). The redirect
//! program's XSKMAP has an entry per queue. A [`PacketBuf`] has no field for the queue
//! it came on: [`AfXdpPort::received_per_queue`] counts per queue instead. A queue the
//! interface lacks is [`AfXdpError::QueueOutOfRange`] naming it and the interface's
//! queue count, before anything is opened.
//!
//! Several sockets on one queue ([`AfXdpPort::shared_receiver_on`], `XDP_SHARED_UMEM`):
//! the kernel delivers an XSKMAP redirect only to a socket bound to the frame's own
//! (interface, queue), so the XDP Packet Dispatcher gives each worker one socket on each
//! of the port's queues, all sharing this port's UMEM. A shared receiver on queue q binds
//! with the port's socket on q and shares that queue's fill and completion rings
//! (single producer, single consumer each): those stay with the port (its thread
//! recycles frames to every queue's fill ring, reaps completions and transmits), while
//! each [`XskReceiver`] owns only its socket's receive ring and is moved to the worker
//! thread that polls it. A worker with several ([`XskReceivers`]) reads them round robin
//! with a fair share each, as [`rx_burst`](Port::rx_burst) reads the port's queues. A
//! queue the port was not opened on is [`AfXdpError::Config`] naming it. With [`AfXdpConfig::metadata`], frames carry the tenant
//! slot the dispatcher's program wrote into the XDP metadata (the 4 bytes before the
//! frame): the port marks each frame's metadata word before handing it to the kernel, so
//! a frame that arrives without metadata is recognised, counted and dropped, never given
//! a stale tenant.
//!
//! Not here: multi-buffer (jumbo) frames, need-wakeup, unaligned chunks, the XDP Packet
//! Dispatcher's program.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use buffet_sdk::{PortId, TenantSlot};

use crate::buf::{FrameOwner, Outcome, PacketBuf};
use crate::port::{HeapPool, Port, PortError, PortStats, Rx};

#[allow(unsafe_code)]
mod sys;

/// Prefix of the redirect program's name; the run's pid (8 hex digits) follows.
const PROG_PREFIX: &str = "bfxsk_";
/// Most frames the kernel sends per `sendto` kick in copy mode (`TX_BATCH_SIZE`).
const KERNEL_TX_BATCH: usize = 32;

/// What one transmit kick did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kick {
    /// The kernel took frames off the ring (or is busy sending: `EAGAIN`).
    Taken,
    /// Copy mode: the device dropped the one frame the kernel was sending (`EBUSY`).
    Dropped,
    /// The kernel refused the kick (interface down or gone, or another error).
    Refused,
}

/// Zero copy or copy mode for the socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMode {
    /// Zero copy where the driver supports it, copy mode elsewhere (the kernel decides).
    #[default]
    Auto,
    /// Always copy mode (`XDP_COPY`).
    Copy,
    /// Zero copy or fail (`XDP_ZEROCOPY`).
    ZeroCopy,
}

/// Where the redirect program runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver where it supports XDP, else generic.
    #[default]
    Auto,
    /// In the driver (`XDP_FLAGS_DRV_MODE`).
    Native,
    /// In the generic path after the driver (`XDP_FLAGS_SKB_MODE`), on every interface.
    Generic,
}

const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_FLAGS_HW_MODE: u32 = 1 << 3;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;

/// How an [`AfXdpPort`] is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfXdpConfig {
    /// The interface (`eth0`, `veth-a`).
    pub iface: String,
    /// The port id its received frames carry (and its frames' [`FrameOwner::port`]).
    pub id: PortId,
    /// The interface queue the (first) socket binds to and frames are sent on.
    pub queue: u32,
    /// The receive queues, one socket each over the one UMEM (see the module docs);
    /// `queue` must be among them. Empty: `queue` alone.
    pub queues: Vec<u32>,
    /// Frames in the UMEM (at least twice `ring_size`).
    pub frames: u32,
    /// Bytes per frame: 2048 or 4096.
    pub frame_size: u32,
    /// Entries of each of the four rings (a power of two).
    pub ring_size: u32,
    /// Zero copy or copy.
    pub copy: CopyMode,
    /// Attach this port's redirect program in this mode; `None`: the caller redirects
    /// to [`AfXdpPort::socket_fd`] itself.
    pub redirect: Option<XdpMode>,
    /// Frames carry a 32-bit tenant slot in their XDP metadata (written by the XDP
    /// Packet Dispatcher's program); received frames take it as their tenant, and a
    /// frame without it is dropped and counted (`rx_dropped`).
    pub metadata: bool,
}

impl AfXdpConfig {
    /// The frames a port on `queues` receive queues needs at least: the default 4096,
    /// or 128 per queue (each fill ring holds a share of half the UMEM, at least 64).
    pub fn frames_for_queues(queues: usize) -> u32 {
        u32::try_from(queues.saturating_mul(128))
            .unwrap_or(u32::MAX)
            .max(4096)
    }

    /// Queue 0 of `iface`, 4096 frames of 2048 bytes (8 MiB), rings of 2048 entries,
    /// zero copy where possible, and the port's own redirect program.
    pub fn new(iface: impl Into<String>, id: PortId) -> AfXdpConfig {
        AfXdpConfig {
            iface: iface.into(),
            id,
            queue: 0,
            queues: Vec::new(),
            frames: 4096,
            frame_size: 2048,
            ring_size: 2048,
            copy: CopyMode::Auto,
            redirect: Some(XdpMode::Auto),
            metadata: false,
        }
    }

    /// The receive queues in the order the port's sockets are opened and read: `queue`
    /// first, then the others of [`queues`](Self::queues) as listed.
    pub fn receive_queues(&self) -> Vec<u32> {
        let mut v = vec![self.queue];
        v.extend(self.queues.iter().copied().filter(|&q| q != self.queue));
        v
    }
}

/// Why an AF_XDP port (or its redirect program) could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AfXdpError {
    /// The process may not open the socket or load or attach the program.
    #[error(
        "af_xdp on {iface}: {call}: permission denied ({source}): an AF_XDP run needs \
         CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (CAP_SYS_ADMIN on kernels before 5.8); run \
         it as root or grant them with `setcap cap_net_admin,cap_net_raw,cap_bpf+ep <binary>`"
    )]
    Privilege {
        /// The interface.
        iface: String,
        /// The call refused.
        call: &'static str,
        /// What the OS said.
        source: io::Error,
    },
    /// No interface of that name in this network namespace.
    #[error("interface {iface:?} does not exist in this network namespace (see `ip link`)")]
    NoSuchInterface {
        /// The interface.
        iface: String,
    },
    /// The interface is administratively down.
    #[error("interface {iface} is down: bring it up first (`ip link set {iface} up`)")]
    Down {
        /// The interface.
        iface: String,
    },
    /// The interface has no such receive queue.
    #[error(
        "af_xdp on {iface}: queue {queue} does not exist: the interface has {queues} receive \
         queue(s), numbered from 0 (`ethtool -l {iface}`)"
    )]
    QueueOutOfRange {
        /// The interface.
        iface: String,
        /// The queue asked for.
        queue: u32,
        /// Receive queues the interface has.
        queues: u32,
    },
    /// The sizes are not usable.
    #[error("af_xdp on {iface}: {why}")]
    Config {
        /// The interface.
        iface: String,
        /// What is wrong.
        why: String,
    },
    /// The driver's native XDP cannot take frames of the interface's MTU (the kernel's
    /// `ERANGE`).
    #[error("af_xdp on {iface}: {why}")]
    NativeMtu {
        /// The interface.
        iface: String,
        /// What it means and what to do ([`native_mtu_refused`]).
        why: String,
    },
    /// Another XDP program is attached and is not a leftover of a Buffet run.
    #[error(
        "af_xdp on {iface}: XDP program {name:?} (id {id}) is attached already{why}; {advice}"
    )]
    Busy {
        /// The interface.
        iface: String,
        /// The attached program's id.
        id: u32,
        /// Its name.
        name: String,
        /// Whose it is, when known.
        why: String,
        /// What to do: stop the run holding it, or detach a program nobody runs.
        advice: String,
    },
    /// The kernel refused the redirect program.
    #[error("af_xdp on {iface}: loading the redirect program: {source}\n{log}")]
    Load {
        /// The interface.
        iface: String,
        /// What the OS said.
        source: io::Error,
        /// The verifier's log.
        log: String,
    },
    /// A set-up call failed.
    #[error("af_xdp on {iface}: {call}: {source}")]
    Sys {
        /// The interface.
        iface: String,
        /// The call.
        call: &'static str,
        /// What the OS said.
        source: io::Error,
    },
}

/// The largest MTU a veth takes with an XDP program in native mode: one page (4 KiB on
/// x86-64) less the 256 bytes of XDP headroom, the skb's shared info and the Ethernet
/// header (the kernel's check in `veth_xdp_set`).
pub const VETH_NATIVE_XDP_MAX_MTU: u32 = 3506;

/// What the kernel's `ERANGE` on attaching an XDP program in native mode to `iface`
/// means, and what to do: its driver's native XDP handles frames of one page only, and
/// the MTU (`/sys/class/net/IF/mtu`; a veth's peer's counts too) is larger.
pub fn native_mtu_refused(iface: &str) -> String {
    native_mtu_refused_or(iface, "--xdp-mode generic")
}

/// [`native_mtu_refused`], naming `generic` as the way to generic mode (a program's
/// own setting for it, e.g. a config key).
pub fn native_mtu_refused_or(iface: &str, generic: &str) -> String {
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()
        .and_then(|m| m.trim().parse::<u32>().ok());
    format!(
        "native XDP cannot take frames of this interface's MTU{} (the kernel said ERANGE): \
         the driver's native XDP handles frames of one memory page only. Lower the MTU \
         (a veth takes at most {max} with 4 KiB pages, on both ends: `ip link set dev \
         {iface} mtu {max}` and the same on its peer) or use {generic}",
        mtu.map(|m| format!(" ({m} bytes)")).unwrap_or_default(),
        max = VETH_NATIVE_XDP_MAX_MTU
    )
}

fn sys_error(iface: &str, call: &'static str, source: io::Error) -> AfXdpError {
    match source.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => AfXdpError::Privilege {
            iface: iface.to_owned(),
            call,
            source,
        },
        // Every socket is a descriptor: one per (queue, worker) with the XDP Packet
        // Dispatcher.
        Some(libc::EMFILE) | Some(libc::ENFILE) => AfXdpError::Config {
            iface: iface.to_owned(),
            why: format!(
                "{call}: {source}: each AF_XDP socket (one per queue and worker with \
                 --dispatch xdp) is a file descriptor; raise RLIMIT_NOFILE (`ulimit -n`) \
                 or use fewer workers or queues"
            ),
        },
        _ => AfXdpError::Sys {
            iface: iface.to_owned(),
            call,
            source,
        },
    }
}

/// The interface's index, after checking it exists and is up.
fn usable_interface(iface: &str) -> Result<u32, AfXdpError> {
    let missing = || AfXdpError::NoSuchInterface {
        iface: iface.to_owned(),
    };
    let ifindex = sys::if_index(iface).map_err(|e| match e.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::ENXIO) => missing(),
        _ => sys_error(iface, "if_nametoindex", e),
    })?;
    let flags = sys::if_flags(iface).map_err(|e| match e.raw_os_error() {
        Some(libc::ENODEV) => missing(),
        _ => sys_error(iface, "ioctl(SIOCGIFFLAGS)", e),
    })?;
    if flags & libc::IFF_UP == 0 {
        return Err(AfXdpError::Down {
            iface: iface.to_owned(),
        });
    }
    Ok(ifindex)
}

/// The receive queues of `iface` (as sysfs lists them) that are not among `queues`:
/// where a NIC's RSS puts frames that sockets on `queues` never see. Empty when sysfs
/// cannot be read.
pub fn unread_queues(iface: &str, queues: &[u32]) -> Vec<u32> {
    let n = rx_queues(iface).unwrap_or(0);
    (0..n).filter(|q| !queues.contains(q)).collect()
}

/// Receive queues of `iface` as sysfs lists them (`queues/rx-N`); `None` if unreadable.
fn rx_queues(iface: &str) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{iface}/queues")).ok()?;
    let n = dir
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    u32::try_from(n).ok().filter(|&n| n > 0)
}

/// One eBPF instruction as the kernel reads it (`struct bpf_insn`, little-endian
/// hosts): opcode, destination and source registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = (dst & 0xf) | (src << 4);
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    u64::from_le_bytes(b)
}

/// The redirect program: `return bpf_redirect_map(&xskmap, ctx->rx_queue_index,
/// XDP_PASS);` — a frame on a queue without a socket goes on to the stack.
fn redirect_program(map_fd: i32) -> [u64; 6] {
    const BPF_PSEUDO_MAP_FD: u8 = 1;
    const BPF_FUNC_REDIRECT_MAP: i32 = 51;
    const XDP_PASS: i32 = 2;
    [
        insn(0x61, 2, 1, 16, 0), // r2 = *(u32 *)(r1 + 16): rx_queue_index
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = &xskmap (ld_imm64)
        insn(0, 0, 0, 0, 0),
        insn(0xb7, 3, 0, 0, XDP_PASS), // r3 = fallback action
        insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP), // call bpf_redirect_map
        insn(0x95, 0, 0, 0, 0),        // exit (r0: the helper's verdict)
    ]
}

/// The name the kernel shows for the XDP Packet Dispatcher's program (buffet-xdp loads
/// it from nic-firmware/xdp/dispatcher.bpf.c's function of that name).
pub const DISPATCHER_PROGRAM: &str = "buffet_dispatch";

/// Removes from `iface` an XDP program that a Buffet run left behind when it died, so
/// that this run can attach its own; refuses anything else ([`AfXdpError::Busy`]) and
/// changes nothing then. Buffet's programs are the AF_XDP port's redirect program,
/// whose name carries its run's pid (a leftover when that process is gone), and the XDP
/// Packet Dispatcher's ([`DISPATCHER_PROGRAM`]: a leftover when no process in sight
/// holds it, neither by a file descriptor nor by a BPF link, and netlink can detach it —
/// a live dispatcher's BPF link refuses that). Any other program is the operator's, and is
/// never touched. The removal replaces only the program checked (`XDP_FLAGS_REPLACE`).
/// Identifying the program needs CAP_SYS_ADMIN. Returns the id of the program removed,
/// `None` when the hook was free.
pub fn clear_leftover_program(iface: &str) -> Result<Option<u32>, AfXdpError> {
    let ifindex = usable_interface(iface)?;
    RedirectProgram::clear_leftover(iface, ifindex)
}

/// A process holding BPF program `id` open (a program fd or a BPF link to it), with its
/// `comm`, from the `/proc/<pid>/fdinfo` this process can read. Best effort: processes
/// whose open files cannot be read (another user namespace's init, say) or that live in
/// another PID namespace are not seen. What keeps a live XDP Packet Dispatcher's program
/// safe regardless is the kernel: on Linux 5.9 and later it is attached through a BPF
/// link, which netlink cannot detach (the detach then fails with EBUSY and is refused).
fn program_holder(id: u32) -> Option<(u32, String)> {
    let want = format!("prog_id:\t{id}\n");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_to_string(fd.path()).is_ok_and(|info| info.contains(&want)));
        if holds {
            let comm = std::fs::read_to_string(p.path().join("comm"))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_default();
            return Some((pid, comm));
        }
    }
    None
}

/// The pid a redirect program's name carries, when it is one of Buffet's.
fn program_pid(name: &str) -> Option<u32> {
    let hex = name.strip_prefix(PROG_PREFIX)?;
    (hex.len() == 8).then_some(())?;
    u32::from_str_radix(hex, 16).ok()
}

/// An XSKMAP and the program redirecting an interface's queues to it, attached to the
/// interface until dropped. See the module docs.
pub struct RedirectProgram {
    iface: String,
    ifindex: u32,
    map: OwnedFd,
    prog: OwnedFd,
    flags: u32,
    replaced: Option<u32>,
}

impl std::fmt::Debug for RedirectProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedirectProgram")
            .field("iface", &self.iface)
            .field("generic", &self.is_generic())
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

impl RedirectProgram {
    /// Loads the program with an XSKMAP of `queues` entries and attaches it to `iface`
    /// in `mode`, replacing a leftover of a dead Buffet run. Sockets are inserted with
    /// [`insert`](Self::insert); until then frames go on to the stack.
    pub fn attach(iface: &str, mode: XdpMode, queues: u32) -> Result<RedirectProgram, AfXdpError> {
        let ifindex = usable_interface(iface)?;
        let replaced = Self::clear_leftover(iface, ifindex)?;
        Self::attach_cleared(iface, ifindex, mode, queues, replaced)
    }

    fn attach_cleared(
        iface: &str,
        ifindex: u32,
        mode: XdpMode,
        queues: u32,
        replaced: Option<u32>,
    ) -> Result<RedirectProgram, AfXdpError> {
        let map = sys::create_xskmap(queues.max(1), "bfxsk_map")
            .map_err(|e| sys_error(iface, "bpf(BPF_MAP_CREATE, XSKMAP)", e))?;
        let name = format!("{PROG_PREFIX}{:08x}", std::process::id());
        let insns = redirect_program(map.as_raw_fd());
        let prog =
            sys::load_xdp(&insns, &name, "Apache-2.0").map_err(|(source, log)| {
                match source.raw_os_error() {
                    Some(libc::EPERM) | Some(libc::EACCES) => AfXdpError::Privilege {
                        iface: iface.to_owned(),
                        call: "bpf(BPF_PROG_LOAD)",
                        source,
                    },
                    _ => AfXdpError::Load {
                        iface: iface.to_owned(),
                        source,
                        log,
                    },
                }
            })?;
        let try_attach = |flags: u32| {
            sys::xdp_set(
                ifindex,
                prog.as_raw_fd(),
                flags | XDP_FLAGS_UPDATE_IF_NOEXIST,
                None,
            )
        };
        let flags = match mode {
            XdpMode::Native => XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
            XdpMode::Auto => match try_attach(XDP_FLAGS_DRV_MODE) {
                Ok(()) => {
                    return Ok(RedirectProgram {
                        iface: iface.to_owned(),
                        ifindex,
                        map,
                        prog,
                        flags: XDP_FLAGS_DRV_MODE,
                        replaced,
                    })
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) => {
                    return Err(sys_error(iface, "rtnetlink(RTM_SETLINK, IFLA_XDP)", e))
                }
                Err(_) => XDP_FLAGS_SKB_MODE,
            },
        };
        try_attach(flags).map_err(|e| match e.raw_os_error() {
            Some(libc::ERANGE) if flags == XDP_FLAGS_DRV_MODE => AfXdpError::NativeMtu {
                iface: iface.to_owned(),
                why: native_mtu_refused(iface),
            },
            _ => sys_error(iface, "rtnetlink(RTM_SETLINK, IFLA_XDP)", e),
        })?;
        Ok(RedirectProgram {
            iface: iface.to_owned(),
            ifindex,
            map,
            prog,
            flags,
            replaced,
        })
    }

    /// Detaches a leftover of a Buffet run that no longer exists; refuses any other
    /// program. Returns the id of the program replaced. See [`clear_leftover_program`].
    fn clear_leftover(iface: &str, ifindex: u32) -> Result<Option<u32>, AfXdpError> {
        let query = "rtnetlink(RTM_GETLINK)";
        let Some((id, attached)) =
            sys::xdp_query(ifindex).map_err(|e| sys_error(iface, query, e))?
        else {
            return Ok(None);
        };
        // Whose it is: the kernel names a program by id only to CAP_SYS_ADMIN. The
        // descriptor is closed again before the holders are looked for (it would be one).
        let open = || {
            sys::prog_fd(id).map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => AfXdpError::Config {
                    iface: iface.to_owned(),
                    why: format!(
                        "XDP program {id} is attached already, and telling whether a Buffet run \
                     that ended left it needs CAP_SYS_ADMIN (bpf(BPF_PROG_GET_FD_BY_ID): \
                     {e}); if it is such a leftover, detach it first (`ip link set dev \
                     {iface} xdp off`, or `xdpgeneric off`)"
                    ),
                },
                _ => sys_error(iface, "bpf(BPF_PROG_GET_FD_BY_ID)", e),
            })
        };
        let name = sys::prog_name_of(&open()?)
            .map_err(|e| sys_error(iface, "bpf(BPF_OBJ_GET_INFO_BY_FD)", e))?;
        let busy = |why: String, advice: String| AfXdpError::Busy {
            iface: iface.to_owned(),
            id,
            name: name.clone(),
            why,
            advice,
        };
        let detach = format!("detach it (`ip link set dev {iface} xdp off`, or `xdpgeneric off`)");
        let stop = || {
            format!(
                "stop that run first (it detaches its program when it ends); if no such run \
                 exists, {detach}"
            )
        };
        let own = || {
            busy(
                format!(" by this process (pid {})", std::process::id()),
                "this process attached it already: let go of its own port or dispatcher on \
                 the interface first (one per interface)"
                    .into(),
            )
        };
        if let Some(pid) = program_pid(&name) {
            if pid == std::process::id() {
                return Err(own());
            }
            if sys::process_alive(pid) {
                return Err(busy(
                    format!(" by the Buffet run of pid {pid}, still running"),
                    stop(),
                ));
            }
        } else if name == DISPATCHER_PROGRAM {
            if let Some((pid, comm)) = program_holder(id) {
                if pid == std::process::id() {
                    return Err(own());
                }
                return Err(busy(
                    format!(" and held by {comm:?} (pid {pid}), still running"),
                    stop(),
                ));
            }
        } else {
            return Err(busy(String::new(), format!("{detach} first")));
        }
        let flags = match attached {
            1 => XDP_FLAGS_DRV_MODE,
            2 => XDP_FLAGS_SKB_MODE,
            3 => XDP_FLAGS_HW_MODE,
            _ => 0,
        };
        // Only that program: another attached since the checks above stays.
        let fd = open()?;
        sys::xdp_set(ifindex, -1, flags | XDP_FLAGS_REPLACE, Some(fd.as_raw_fd())).map_err(
            |e| match e.raw_os_error() {
                // A BPF link holds it (netlink cannot detach those): its owner is alive.
                Some(libc::EBUSY) => busy(
                    " through a BPF link, which a live process holds".into(),
                    "stop the process holding the link first".into(),
                ),
                _ => sys_error(iface, "rtnetlink(RTM_SETLINK, detach leftover)", e),
            },
        )?;
        Ok(Some(id))
    }

    /// Redirects queue `queue` to the socket `fd`.
    pub fn insert(&self, queue: u32, fd: BorrowedFd<'_>) -> Result<(), AfXdpError> {
        sys::map_update_u32(&self.map, queue, fd.as_raw_fd() as u32)
            .map_err(|e| sys_error(&self.iface, "bpf(BPF_MAP_UPDATE_ELEM, XSKMAP)", e))
    }

    /// True when attached in generic (SKB) mode, false in the driver.
    pub fn is_generic(&self) -> bool {
        self.flags == XDP_FLAGS_SKB_MODE
    }

    /// The id of a dead run's program this one replaced.
    pub fn replaced_leftover(&self) -> Option<u32> {
        self.replaced
    }
}

impl Drop for RedirectProgram {
    fn drop(&mut self) {
        // Only if ours is still the one attached (XDP_FLAGS_REPLACE with our fd).
        let _ = sys::xdp_set(
            self.ifindex,
            -1,
            self.flags | XDP_FLAGS_REPLACE,
            Some(self.prog.as_raw_fd()),
        );
    }
}

/// Entries ready to consume in a ring whose producer is `prod` and consumer `cons`
/// (free-running u32 indices).
fn ring_ready(prod: u32, cons: u32) -> u32 {
    prod.wrapping_sub(cons)
}

/// Entries free to produce into a ring of `size` entries.
fn ring_room(prod: u32, cons: u32, size: u32) -> u32 {
    size.saturating_sub(prod.wrapping_sub(cons))
}

/// The start of the frame holding UMEM address `addr` (aligned chunks of
/// `frame_size`, a power of two), and the offset of `addr` inside it.
fn frame_of(addr: u64, frame_size: u32) -> (u64, u64) {
    let mask = u64::from(frame_size) - 1;
    (addr & !mask, addr & mask)
}

/// Where the XDP metadata word of a frame lies: just before the frame's data, which the
/// kernel places `XDP_PACKET_HEADROOM` bytes into the frame (no UMEM headroom here).
const META_AT: u64 = 256 - 4;
/// The metadata word a frame carries until a program writes a tenant slot there.
const NO_META: u32 = u32::MAX;

/// The tenant slot in the metadata before the frame at UMEM address `addr`, or `None`
/// when the program wrote none.
fn metadata_tenant(umem: &sys::Umem, addr: u64, frame_size: u32) -> Option<TenantSlot> {
    let (_, off) = frame_of(addr, frame_size);
    if off < 4 {
        return None;
    }
    umem.read_u32(addr - 4)
        .filter(|&t| t != NO_META)
        .map(TenantSlot)
}

/// Counters the receivers of shared sockets keep for their port (one add per burst).
#[derive(Debug, Default)]
struct SharedCounters {
    /// Frames the receivers lent out as `PacketBuf`s (they come back through the port).
    lent: AtomicU64,
    /// Frames the receivers took off their receive rings.
    rx: AtomicU64,
    /// Frames dropped there (no metadata, outside the UMEM).
    rx_dropped: AtomicU64,
}

/// One AF_XDP socket's counters as the kernel keeps them (`getsockopt(SOL_XDP,
/// XDP_STATISTICS)`), cumulative since the socket was opened. Kernels before 5.9 know
/// only the first three (and count a full receive ring in `rx_dropped`): the others are
/// `None` there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStatistics {
    /// Frames redirected to the socket that the kernel dropped for want of a UMEM frame
    /// (copy mode: the fill ring was empty) or because they did not fit in one.
    pub rx_dropped: u64,
    /// Receive-side descriptors the kernel found invalid.
    pub rx_invalid_descs: u64,
    /// Transmit descriptors the kernel refused (an address outside the UMEM, a bad
    /// length).
    pub tx_invalid_descs: u64,
    /// Frames dropped because the socket's receive ring was full (its reader is behind).
    pub rx_ring_full: Option<u64>,
    /// Times the kernel wanted a frame from the fill ring and found it empty (one per
    /// frame dropped for it in copy mode). Counted per fill ring: sockets that share one
    /// (an [`XskReceiver`] and its port) each report the same count.
    pub rx_fill_ring_empty_descs: Option<u64>,
    /// Times the kernel looked at the transmit ring and found nothing to send (a kick
    /// with an empty ring, not a loss).
    pub tx_ring_empty_descs: Option<u64>,
}

/// Of the `rx_dropped` the kernel counted at the sockets sharing one fill ring (the
/// sum over those sockets), the frames it dropped because they were larger than a UMEM
/// frame: in copy mode the kernel counts a frame too large for a frame, and one for
/// which the fill ring had no frame, both in `rx_dropped`, and the latter also once in
/// the fill ring's `rx_fill_ring_empty_descs`, so the difference is the former. 0 on a
/// kernel before 5.9, which does not count an empty fill ring apart.
pub fn oversize_drops(rx_dropped: u64, fill_ring_empty: Option<u64>) -> u64 {
    fill_ring_empty.map_or(0, |e| rx_dropped.saturating_sub(e))
}

/// What the kernel dropped at the shared receivers' sockets of a port (the workers'
/// sockets the XDP Packet Dispatcher redirects to) before their readers saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverDrops {
    /// Frames larger than a UMEM frame (GRO/LRO, TSO/GSO super-packets).
    pub oversize: u64,
    /// The others: a receive ring full, no frame in the fill ring, an invalid
    /// descriptor.
    pub dropped: u64,
}

/// Of `sockets` (an [`XskStatsReader`]'s), what the kernel dropped at the shared
/// receivers' (`receiver` is `Some`; the port's own sockets are left out): every
/// `rx_lost`, of which [`oversize_drops`] per queue (the receivers on one queue share
/// its fill ring, whose empty count each of them reports) are oversize.
pub fn receiver_drops(sockets: &[SocketStatistics]) -> ReceiverDrops {
    let receivers = || sockets.iter().filter(|k| k.receiver.is_some());
    let lost: u64 = receivers().map(|k| k.stats.rx_lost()).sum();
    let mut queues: Vec<u32> = receivers().map(|k| k.queue).collect();
    queues.sort_unstable();
    queues.dedup();
    let oversize: u64 = queues
        .iter()
        .map(|&q| {
            let on = || receivers().filter(move |k| k.queue == q);
            let dropped = on().map(|k| k.stats.rx_dropped).sum();
            let empty = on()
                .map(|k| k.stats.rx_fill_ring_empty_descs)
                .collect::<Option<Vec<u64>>>()
                .map(|v| v.into_iter().max().unwrap_or(0));
            oversize_drops(dropped, empty)
        })
        .sum();
    let oversize = oversize.min(lost);
    ReceiverDrops {
        oversize,
        dropped: lost - oversize,
    }
}

impl XskStatistics {
    /// Frames redirected to this socket that never reached its receive ring:
    /// `rx_dropped + rx_ring_full + rx_invalid_descs`.
    pub fn rx_lost(&self) -> u64 {
        self.rx_dropped + self.rx_ring_full.unwrap_or(0) + self.rx_invalid_descs
    }

    fn from_kernel((k, extended): (libc::xdp_statistics, bool)) -> XskStatistics {
        XskStatistics {
            rx_dropped: k.rx_dropped,
            rx_invalid_descs: k.rx_invalid_descs,
            tx_invalid_descs: k.tx_invalid_descs,
            rx_ring_full: extended.then_some(k.rx_ring_full),
            rx_fill_ring_empty_descs: extended.then_some(k.rx_fill_ring_empty_descs),
            tx_ring_empty_descs: extended.then_some(k.tx_ring_empty_descs),
        }
    }
}

/// The counters of one socket of an [`AfXdpPort`], with which socket it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketStatistics {
    /// The interface queue the socket is bound to.
    pub queue: u32,
    /// `None` for the port's own socket on that queue; `Some(i)` for the port's `i`-th
    /// shared receiver ([`AfXdpPort::shared_receiver`], counted from 0 in the order
    /// they were opened).
    pub receiver: Option<usize>,
    /// Frames its reader took off its receive ring (the port, or the shared receiver).
    pub received: u64,
    /// What the kernel counted.
    pub stats: XskStatistics,
}

/// Reads the kernel's counters of an [`AfXdpPort`]'s sockets and of its shared
/// receivers', from any thread, while the port and its receivers run on theirs — and
/// after they are dropped: the reader holds the sockets open (not their rings or
/// UMEM), so drop it before binding the same queue again.
pub struct XskStatsReader {
    iface: String,
    sockets: Vec<ReadSocket>,
}

/// One socket an [`XskStatsReader`] reads: its queue, which receiver it is (`None`: the
/// port's own), the socket, and its reader's count of frames received.
type ReadSocket = (u32, Option<usize>, Arc<sys::XskSocket>, Arc<AtomicU64>);

impl std::fmt::Debug for XskStatsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskStatsReader")
            .field("iface", &self.iface)
            .field("sockets", &self.sockets.len())
            .finish()
    }
}

impl XskStatsReader {
    /// Every socket's counters: the port's, one per queue in the order the port reads
    /// them, then its shared receivers' in the order they were opened.
    pub fn read(&self) -> Result<Vec<SocketStatistics>, AfXdpError> {
        self.sockets
            .iter()
            .map(|(queue, receiver, socket, received)| {
                let k = socket.statistics_versioned().map_err(|e| {
                    sys_error(&self.iface, "getsockopt(SOL_XDP, XDP_STATISTICS)", e)
                })?;
                Ok(SocketStatistics {
                    queue: *queue,
                    receiver: *receiver,
                    received: received.load(Ordering::Relaxed),
                    stats: XskStatistics::from_kernel(k),
                })
            })
            .collect()
    }
}

/// A bound socket with its UMEM and rings.
struct Bound {
    socket: sys::XskSocket,
    umem: sys::Umem,
    fill: sys::Ring<u64>,
    comp: sys::Ring<u64>,
    rx: sys::Ring<libc::xdp_desc>,
    tx: sys::Ring<libc::xdp_desc>,
}

/// One receive queue of an [`AfXdpPort`]: its socket's fill and receive rings.
struct RxQueue {
    /// The interface queue.
    queue: u32,
    fill: sys::Ring<u64>,
    rx: sys::Ring<libc::xdp_desc>,
    /// Frames taken off its receive ring (one add per burst; read by
    /// [`XskStatsReader`]).
    received: Arc<AtomicU64>,
    /// For a queue after the first: the completion ring the kernel requires of a socket
    /// with its own fill ring (it stays empty: the port sends on its first queue only)
    /// and the socket, dropped in that order. `None` for the first queue, whose socket
    /// is the port's.
    own: Option<(sys::Ring<u64>, Arc<sys::XskSocket>)>,
}

/// Live interface queues as a [`Port`] over XDP sockets. See the module docs.
pub struct AfXdpPort {
    cfg: AfXdpConfig,
    // Dropped in this order: the program, the receive queues (rings, then the sockets of
    // the queues after the first), the first socket's other rings, its socket, then the
    // UMEM.
    program: Option<RedirectProgram>,
    /// The first is `cfg.queue`, the one frames are sent on.
    queues: Vec<RxQueue>,
    comp: sys::Ring<u64>,
    tx: sys::Ring<libc::xdp_desc>,
    socket: Arc<sys::XskSocket>,
    umem: Arc<sys::Umem>,
    ifindex: u32,
    /// The shared receivers opened so far, in order, with their queue and their count of
    /// frames received (for their counters; a receiver dropped is gone).
    receivers: Vec<(u32, std::sync::Weak<sys::XskSocket>, Arc<AtomicU64>)>,
    /// Frames that are nowhere: not in a ring, not lent.
    free: Vec<u64>,
    /// Frames this port lent out as `PacketBuf`s, less those that came back (those its
    /// receivers lent come back here too: wrapping, summed with theirs at the end).
    lent: u64,
    zero_copy: bool,
    /// `tx` counts completions ([`reap`](Self::reap)): a frame counts as sent once the
    /// kernel is done with it, not when it goes on the transmit ring.
    stats: PortStats,
    /// Descriptors on the transmit ring or in the kernel, not yet completed.
    tx_in_kernel: u64,
    /// Of them, those [`flush`](Port::flush) already counted as `tx_dropped` (their
    /// completions, if any still come, are not counted again).
    tx_written_off: u64,
    /// The last transmit kick was refused because the interface is down or gone
    /// (`ENETDOWN`, `ENXIO`): frames to send are dropped and counted until a kick
    /// succeeds again, rather than held on the ring (with their UMEM frames) to go out
    /// late.
    tx_down: bool,
    /// The receivers' counters, once a shared receiver exists.
    shared: Option<Arc<SharedCounters>>,
    /// Frames each fill ring holds at most: its size on one queue, a share of the UMEM
    /// on several (so that no queue takes every free frame).
    fill_target: u32,
    /// The queue the next burst reads (and refills) first: round robin.
    next: usize,
}

impl std::fmt::Debug for AfXdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfXdpPort")
            .field("cfg", &self.cfg)
            .field("zero_copy", &self.zero_copy)
            .field("program", &self.program)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl AfXdpPort {
    /// Opens the port: checks the interface, queues and sizes, sets up the UMEM and the
    /// rings, binds a socket per queue, then (with [`AfXdpConfig::redirect`]) attaches
    /// the redirect program. Nothing stays attached if any step fails.
    pub fn open(cfg: AfXdpConfig) -> Result<AfXdpPort, AfXdpError> {
        let iface = cfg.iface.as_str();
        let ifindex = usable_interface(iface)?;
        let queues = rx_queues(iface);
        let config = |why: String| AfXdpError::Config {
            iface: iface.to_owned(),
            why,
        };
        let wanted = cfg.receive_queues();
        if !cfg.queues.is_empty() {
            if !cfg.queues.contains(&cfg.queue) {
                return Err(config(format!(
                    "frames are sent on queue {}, which is not among the receive queues {:?}",
                    cfg.queue, cfg.queues
                )));
            }
            let mut sorted = cfg.queues.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) || wanted.len() != cfg.queues.len() {
                return Err(config(format!(
                    "receive queues {:?}: a queue is named twice",
                    cfg.queues
                )));
            }
        }
        if !matches!(cfg.frame_size, 2048 | 4096) {
            return Err(config(format!(
                "frames of {} bytes: 2048 or 4096",
                cfg.frame_size
            )));
        }
        if !cfg.ring_size.is_power_of_two() || cfg.ring_size < 64 || cfg.ring_size > 1 << 16 {
            return Err(config(format!(
                "rings of {} entries: a power of two from 64 to 65536",
                cfg.ring_size
            )));
        }
        if cfg.frames < 2 * cfg.ring_size
            || u64::from(cfg.frames) * u64::from(cfg.frame_size) > 1 << 30
        {
            return Err(config(format!(
                "{} frames: at least twice the ring size ({}), at most 1 GiB in all",
                cfg.frames, cfg.ring_size
            )));
        }
        // On several queues each fill ring holds its share of half the UMEM: the other
        // half is in flight (lent, in a receive or transmit ring).
        let n_queues = wanted.len() as u32;
        let fill_target = cfg.ring_size.min(cfg.frames / (2 * n_queues));
        if fill_target < 64 {
            return Err(config(format!(
                "{} frames for {n_queues} queues: at least 128 per queue",
                cfg.frames
            )));
        }
        if let Some(q) = queues {
            if let Some(&bad) = wanted.iter().find(|&&w| w >= q) {
                return Err(AfXdpError::QueueOutOfRange {
                    iface: iface.to_owned(),
                    queue: bad,
                    queues: q,
                });
            }
        }
        let socket = sys::XskSocket::open().map_err(|e| sys_error(iface, "socket(AF_XDP)", e))?;
        // A live run's program is refused (and a dead one's removed) before binding: a
        // live run's socket holds the queue.
        let replaced = match cfg.redirect {
            Some(_) => RedirectProgram::clear_leftover(iface, ifindex)?,
            None => None,
        };
        // A killed run's socket is released by the kernel a little after the process
        // ends: a queue still busy is tried again for up to a second.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut socket = socket;
        let Bound {
            socket,
            umem,
            fill,
            comp,
            rx,
            tx,
        } = loop {
            match Self::bind(socket, &cfg, ifindex, queues) {
                Ok(b) => break b,
                Err((e, true)) if std::time::Instant::now() < deadline => {
                    drop(e);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    socket = sys::XskSocket::open()
                        .map_err(|e| sys_error(iface, "socket(AF_XDP)", e))?;
                }
                Err((e, _)) => return Err(e),
            }
        };
        let zero_copy = socket
            .zero_copy()
            .map_err(|e| sys_error(iface, "getsockopt(XDP_OPTIONS)", e))?;
        let frame = u64::from(cfg.frame_size);
        let free = (0..u64::from(cfg.frames))
            .rev()
            .map(|i| i * frame)
            .collect();
        let mut port = AfXdpPort {
            program: None,
            queues: vec![RxQueue {
                queue: cfg.queue,
                fill,
                rx,
                received: Arc::default(),
                own: None,
            }],
            comp,
            tx,
            socket: Arc::new(socket),
            umem: Arc::new(umem),
            ifindex,
            receivers: Vec::new(),
            free,
            lent: 0,
            zero_copy,
            stats: PortStats::default(),
            tx_in_kernel: 0,
            tx_written_off: 0,
            tx_down: false,
            shared: None,
            fill_target,
            next: 0,
            cfg,
        };
        for &q in &wanted[1..] {
            let rxq = port.open_queue(q)?;
            port.queues.push(rxq);
        }
        port.refill();
        if let Some(mode) = port.cfg.redirect {
            let entries = wanted.iter().max().map_or(1, |&q| q + 1);
            let program =
                RedirectProgram::attach_cleared(&port.cfg.iface, ifindex, mode, entries, replaced)?;
            // The program is detached (dropped) before the sockets close.
            program.insert(port.cfg.queue, port.socket_fd())?;
            for rxq in &port.queues {
                if let Some((_, socket)) = &rxq.own {
                    program.insert(rxq.queue, socket.borrowed())?;
                }
            }
            port.program = Some(program);
        }
        Ok(port)
    }

    /// Opens the socket of receive queue `queue` after the first: it shares the first
    /// socket's UMEM (`XDP_SHARED_UMEM` on another queue, which the kernel allows only
    /// with the socket's own fill and completion rings) and has a receive ring. A queue
    /// still held by a killed run's socket is tried again for up to a second.
    fn open_queue(&self, queue: u32) -> Result<RxQueue, AfXdpError> {
        let iface = self.cfg.iface.as_str();
        let n = self.cfg.ring_size;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            let socket =
                sys::XskSocket::open().map_err(|e| sys_error(iface, "socket(AF_XDP)", e))?;
            for (kind, call) in [
                (sys::RingKind::Fill, "setsockopt(XDP_UMEM_FILL_RING)"),
                (
                    sys::RingKind::Completion,
                    "setsockopt(XDP_UMEM_COMPLETION_RING)",
                ),
                (sys::RingKind::Rx, "setsockopt(XDP_RX_RING)"),
            ] {
                socket
                    .set_ring_size(kind, n)
                    .map_err(|e| sys_error(iface, call, e))?;
            }
            let map = |e| sys_error(iface, "mmap(XDP ring)", e);
            let fill = socket.map_ring(sys::RingKind::Fill, n).map_err(map)?;
            let comp = socket.map_ring(sys::RingKind::Completion, n).map_err(map)?;
            let rx = socket.map_ring(sys::RingKind::Rx, n).map_err(map)?;
            match socket.bind_shared(self.ifindex, queue, &self.socket) {
                Ok(()) => {
                    return Ok(RxQueue {
                        queue,
                        fill,
                        rx,
                        received: Arc::default(),
                        own: Some((comp, Arc::new(socket))),
                    })
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(AfXdpError::Config {
                        iface: iface.to_owned(),
                        why: format!(
                            "queue {queue} is in use by another AF_XDP socket (another run \
                             on this interface?)"
                        ),
                    })
                }
                Err(e) => return Err(sys_error(iface, "bind(AF_XDP, XDP_SHARED_UMEM)", e)),
            }
        }
    }

    /// Sets up the UMEM and rings of `socket` and binds it. The error says whether the
    /// queue was busy (worth trying again).
    fn bind(
        socket: sys::XskSocket,
        cfg: &AfXdpConfig,
        ifindex: u32,
        queues: Option<u32>,
    ) -> Result<Bound, (AfXdpError, bool)> {
        let iface = cfg.iface.as_str();
        let config = |why: String| AfXdpError::Config {
            iface: iface.to_owned(),
            why,
        };
        let fail = |e: AfXdpError| (e, false);
        let umem = sys::Umem::new(cfg.frames as usize * cfg.frame_size as usize)
            .map_err(|e| sys_error(iface, "mmap(UMEM)", e))
            .map_err(fail)?;
        socket
            .register_umem(&umem, cfg.frame_size)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::ENOBUFS) => config(format!(
                    "setsockopt(XDP_UMEM_REG): {e}: the UMEM is locked memory; raise \
                     RLIMIT_MEMLOCK (`ulimit -l`) or use fewer frames"
                )),
                _ => sys_error(iface, "setsockopt(XDP_UMEM_REG)", e),
            })
            .map_err(fail)?;
        let n = cfg.ring_size;
        for (kind, call) in [
            (sys::RingKind::Fill, "setsockopt(XDP_UMEM_FILL_RING)"),
            (
                sys::RingKind::Completion,
                "setsockopt(XDP_UMEM_COMPLETION_RING)",
            ),
            (sys::RingKind::Rx, "setsockopt(XDP_RX_RING)"),
            (sys::RingKind::Tx, "setsockopt(XDP_TX_RING)"),
        ] {
            socket
                .set_ring_size(kind, n)
                .map_err(|e| sys_error(iface, call, e))
                .map_err(fail)?;
        }
        let map = |e| sys_error(iface, "mmap(XDP ring)", e);
        let fill = socket
            .map_ring(sys::RingKind::Fill, n)
            .map_err(map)
            .map_err(fail)?;
        let comp = socket
            .map_ring(sys::RingKind::Completion, n)
            .map_err(map)
            .map_err(fail)?;
        let rx = socket
            .map_ring(sys::RingKind::Rx, n)
            .map_err(map)
            .map_err(fail)?;
        let tx = socket
            .map_ring(sys::RingKind::Tx, n)
            .map_err(map)
            .map_err(fail)?;
        let bind_flags = match cfg.copy {
            CopyMode::Auto => 0,
            CopyMode::Copy => libc::XDP_COPY,
            CopyMode::ZeroCopy => libc::XDP_ZEROCOPY,
        };
        socket.bind(ifindex, cfg.queue, bind_flags).map_err(|e| {
            match (e.raw_os_error(), queues) {
                (Some(libc::EINVAL), None) if cfg.queue > 0 => fail(AfXdpError::QueueOutOfRange {
                    iface: iface.to_owned(),
                    queue: cfg.queue,
                    queues: 0,
                }),
                (Some(libc::EBUSY), _) => (
                    config(format!(
                        "queue {} is in use by another AF_XDP socket (another run on this \
                         interface?)",
                        cfg.queue
                    )),
                    true,
                ),
                _ => fail(sys_error(iface, "bind(AF_XDP)", e)),
            }
        })?;
        Ok(Bound {
            socket,
            umem,
            fill,
            comp,
            rx,
            tx,
        })
    }

    /// Opens one more socket on this port's first queue ([`AfXdpConfig::queue`]) that
    /// shares its UMEM: [`shared_receiver_on`](Self::shared_receiver_on) that queue.
    pub fn shared_receiver(&mut self) -> Result<XskReceiver, AfXdpError> {
        self.shared_receiver_on(self.cfg.queue)
    }

    /// Opens one more socket on receive queue `queue` of this port that shares its UMEM
    /// (`XDP_SHARED_UMEM` with the port's socket on that queue; see the module docs) and
    /// has a receive ring only: on its queue it shares the port's fill and completion
    /// rings, which the port keeps refilled. Its frames come back through this port
    /// ([`recycle`](Port::recycle), or its transmit ring). The socket receives only what
    /// an XDP program redirects to [`XskReceiver::socket_fd`]. A queue the port was not
    /// opened on is [`AfXdpError::Config`] naming it and the port's queues.
    pub fn shared_receiver_on(&mut self, queue: u32) -> Result<XskReceiver, AfXdpError> {
        let iface = self.cfg.iface.as_str();
        let Some(rxq) = self.queues.iter().find(|q| q.queue == queue) else {
            let queues: Vec<u32> = self.queues.iter().map(|q| q.queue).collect();
            return Err(AfXdpError::Config {
                iface: iface.to_owned(),
                why: format!(
                    "a socket sharing queue {queue}: the port was opened on queue(s) \
                     {queues:?} only"
                ),
            });
        };
        let owner = match &rxq.own {
            Some((_, socket)) => socket.clone(),
            None => self.socket.clone(),
        };
        let socket = sys::XskSocket::open().map_err(|e| sys_error(iface, "socket(AF_XDP)", e))?;
        let n = self.cfg.ring_size;
        socket
            .set_ring_size(sys::RingKind::Rx, n)
            .map_err(|e| sys_error(iface, "setsockopt(XDP_RX_RING)", e))?;
        let rx = socket
            .map_ring(sys::RingKind::Rx, n)
            .map_err(|e| sys_error(iface, "mmap(XDP ring)", e))?;
        socket
            .bind_shared(self.ifindex, queue, &owner)
            .map_err(|e| sys_error(iface, "bind(AF_XDP, XDP_SHARED_UMEM)", e))?;
        let counters = self.shared.get_or_insert_with(Default::default).clone();
        let socket = Arc::new(socket);
        let received = Arc::new(AtomicU64::new(0));
        self.receivers
            .push((queue, Arc::downgrade(&socket), received.clone()));
        Ok(XskReceiver {
            id: self.cfg.id,
            iface: self.cfg.iface.clone(),
            queue,
            frame_size: self.cfg.frame_size,
            metadata: self.cfg.metadata,
            rx,
            socket,
            umem: self.umem.clone(),
            counters,
            received,
        })
    }

    /// The receive queues, in the order the port reads them (the first is the queue
    /// frames are sent on).
    pub fn queues(&self) -> Vec<u32> {
        self.queues.iter().map(|q| q.queue).collect()
    }

    /// A reader of the kernel's counters ([`XskStatistics`]) of this port's sockets and
    /// of the shared receivers opened so far (see [`XskStatsReader`]).
    pub fn statistics_reader(&self) -> XskStatsReader {
        let own = self.queues.iter().map(|q| match &q.own {
            Some((_, socket)) => (q.queue, None, socket.clone(), q.received.clone()),
            None => (q.queue, None, self.socket.clone(), q.received.clone()),
        });
        let receivers =
            self.receivers
                .iter()
                .enumerate()
                .filter_map(|(i, (queue, w, received))| {
                    Some((*queue, Some(i), w.upgrade()?, received.clone()))
                });
        XskStatsReader {
            iface: self.cfg.iface.clone(),
            sockets: own.chain(receivers).collect(),
        }
    }

    /// The kernel's counters of this port's sockets and its live shared receivers' now
    /// (as [`XskStatsReader::read`]).
    pub fn socket_statistics(&self) -> Result<Vec<SocketStatistics>, AfXdpError> {
        self.statistics_reader().read()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &AfXdpConfig {
        &self.cfg
    }

    /// The socket, for a caller's own XSKMAP (see [`AfXdpConfig::redirect`]).
    pub fn socket_fd(&self) -> BorrowedFd<'_> {
        self.socket.borrowed()
    }

    /// Frames received on each queue so far, as `(queue, frames)` in the order the
    /// sockets are read (the first is the queue frames are sent on).
    pub fn received_per_queue(&self) -> Vec<(u32, u64)> {
        self.queues
            .iter()
            .map(|q| (q.queue, q.received.load(Ordering::Relaxed)))
            .collect()
    }

    /// True when the kernel runs the socket in zero-copy mode.
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The redirect program this port attached, if any.
    pub fn program(&self) -> Option<&RedirectProgram> {
        self.program.as_ref()
    }

    /// Gives free frames to the kernel's fill rings, each up to its target, starting at
    /// the queue the next burst reads first.
    fn refill(&mut self) {
        let n = self.queues.len();
        for i in 0..n {
            let q = &mut self.queues[(self.next + i) % n];
            let prod = q.fill.producer().load(Ordering::Relaxed);
            let cons = q.fill.consumer().load(Ordering::Acquire);
            let k = self
                .fill_target
                .saturating_sub(ring_ready(prod, cons))
                .min(ring_room(prod, cons, q.fill.size()))
                .min(self.free.len() as u32);
            for j in 0..k {
                let Some(addr) = self.free.pop() else { break };
                if self.cfg.metadata {
                    // The frame is free (ours): mark its metadata word as not written.
                    self.umem.write(addr + META_AT, &NO_META.to_ne_bytes());
                }
                q.fill.write(prod.wrapping_add(j), addr);
            }
            q.fill
                .producer()
                .store(prod.wrapping_add(k), Ordering::Release);
        }
    }

    /// Takes up to `max` frames off the receive ring of `self.queues[qi]` into `out`;
    /// `ts` is the burst's arrival time, read at its first frame. Returns (descriptors
    /// consumed, frames handed out).
    fn take(
        &mut self,
        qi: usize,
        out: &mut Vec<PacketBuf>,
        max: u32,
        ts: &mut Option<u64>,
    ) -> (u32, usize) {
        let q = &mut self.queues[qi];
        let prod = q.rx.producer().load(Ordering::Acquire);
        let cons = q.rx.consumer().load(Ordering::Relaxed);
        let k = ring_ready(prod, cons).min(max);
        if k == 0 {
            return (0, 0);
        }
        let ts_ns = *ts.get_or_insert_with(sys::realtime_ns);
        let mut n = 0;
        for i in 0..k {
            let d = q.rx.read(cons.wrapping_add(i));
            let (base, off) = frame_of(d.addr, self.cfg.frame_size);
            let capacity = (u64::from(self.cfg.frame_size) - off) as usize;
            let owner = FrameOwner {
                port: self.cfg.id,
                frame: base,
            };
            self.stats.rx += 1;
            let tenant = if self.cfg.metadata {
                match metadata_tenant(&self.umem, d.addr, self.cfg.frame_size) {
                    Some(t) => t,
                    None => {
                        self.stats.rx_dropped += 1;
                        self.free.push(base);
                        continue;
                    }
                }
            } else {
                TenantSlot(0)
            };
            match self.umem.lend(d.addr, capacity, d.len as usize, owner) {
                Some(mut b) => {
                    b.received(ts_ns, self.cfg.id, tenant);
                    out.push(b);
                    self.lent = self.lent.wrapping_add(1);
                    n += 1;
                }
                None => {
                    if d.len as usize > capacity {
                        self.stats.rx_oversize += 1;
                    }
                    self.stats.rx_dropped += 1;
                    self.free.push(base);
                }
            }
        }
        q.rx.consumer()
            .store(cons.wrapping_add(k), Ordering::Release);
        q.received.fetch_add(u64::from(k), Ordering::Relaxed);
        (k, n)
    }

    /// Frames on the transmit ring or in the kernel that may still complete: those not
    /// completed and not written off, less the descriptors the kernel refused as invalid
    /// (never completed; [`stats`](Port::stats) counts them as `tx_dropped` already).
    fn tx_pending(&self) -> u64 {
        let others = self.queues.iter().filter_map(|q| q.own.as_ref());
        let invalid: u64 = std::iter::once(&self.socket)
            .chain(others.map(|(_, s)| s))
            .filter_map(|socket| socket.statistics_versioned().ok())
            .map(|(k, _)| k.tx_invalid_descs)
            .sum();
        (self.tx_in_kernel - self.tx_written_off).saturating_sub(invalid)
    }

    /// Takes frames the kernel has sent back to the free list, and counts them as sent.
    fn reap(&mut self) {
        let prod = self.comp.producer().load(Ordering::Acquire);
        let cons = self.comp.consumer().load(Ordering::Relaxed);
        let k = ring_ready(prod, cons);
        for i in 0..k {
            let addr = self.comp.read(cons.wrapping_add(i));
            self.free.push(frame_of(addr, self.cfg.frame_size).0);
        }
        self.comp
            .consumer()
            .store(cons.wrapping_add(k), Ordering::Release);
        let k = u64::from(k);
        let late = k.min(self.tx_written_off);
        self.tx_written_off -= late;
        self.tx_in_kernel = self.tx_in_kernel.saturating_sub(k);
        self.stats.tx += k - late;
    }

    /// One transmit kick. Notes in `tx_down` whether the kernel refused it because the
    /// interface is down (`ENETDOWN`: it then takes nothing off the ring) or gone
    /// (`ENXIO`).
    ///
    /// In copy mode, `EBUSY` says the device dropped the frame the kernel was sending
    /// (`NET_XMIT_DROP`: an interface up without carrier, say): that one frame left the
    /// ring and completes, but was not sent, so it is counted as `tx_dropped` now and its
    /// completion is not counted as sent.
    fn kick_once(&mut self) -> Kick {
        match self.socket.kick_tx() {
            Ok(()) => {
                self.tx_down = false;
                Kick::Taken
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                self.tx_down = false;
                Kick::Taken
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !self.zero_copy => {
                self.tx_down = false;
                self.stats.tx_dropped += 1;
                self.tx_written_off += 1;
                Kick::Dropped
            }
            Err(e) => {
                self.tx_down = matches!(e.raw_os_error(), Some(libc::ENETDOWN | libc::ENXIO));
                Kick::Refused
            }
        }
    }

    /// Kicks the kernel until the transmit ring is empty, it is busy or it refuses. A
    /// kick whose frame the device dropped does not count against the kicks `queued`
    /// asks for: the kernel stops at such a frame, so each drop takes one more kick,
    /// and a link without carrier empties the ring (every frame counted as dropped)
    /// instead of holding its frames to go out late.
    fn kick(&mut self, queued: usize) {
        let mut kicks = queued / KERNEL_TX_BATCH + 2;
        // Each drop takes one frame off the ring, so the ring's size bounds them; the
        // bound also ends the loop should a kernel ever say `EBUSY` and take nothing.
        let mut drops = self.tx.size();
        while kicks > 0 {
            let prod = self.tx.producer().load(Ordering::Relaxed);
            let cons = self.tx.consumer().load(Ordering::Acquire);
            if ring_ready(prod, cons) == 0 {
                return;
            }
            match self.kick_once() {
                Kick::Taken => kicks -= 1,
                Kick::Dropped if drops > 0 => drops -= 1,
                Kick::Dropped | Kick::Refused => return,
            }
        }
    }

    fn give_back(&mut self, buf: PacketBuf, pool: &mut HeapPool) {
        match buf.owner() {
            None => pool.give(buf),
            Some(_) => self.recycle(buf),
        }
    }
}

impl std::os::fd::AsFd for AfXdpPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket_fd()
    }
}

impl Port for AfXdpPort {
    fn name(&self) -> String {
        let queues: Vec<String> = self.queues.iter().map(|q| q.queue.to_string()).collect();
        format!("af_xdp:{}:{}", self.cfg.iface, queues.join(","))
    }

    fn rx_burst(
        &mut self,
        _pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        self.reap();
        self.refill();
        self.kick(0);
        let max = max.min(u32::MAX as usize);
        let queues = self.queues.len();
        let start = self.next;
        self.next = (start + 1) % queues;
        let (mut n, mut ts) = (0usize, None);
        fair_round_robin(queues, start, max, |q, quota| {
            // `quota` <= `max`, which fits in a u32.
            let (k, m) = self.take(q, out, quota as u32, &mut ts);
            n += m;
            k as usize
        });
        self.refill();
        Ok(if n == 0 { Rx::Idle } else { Rx::Packets(n) })
    }

    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        self.reap();
        if self.tx_down && !pkts.is_empty() {
            // Refused at the last kick: look again (once the interface is up, this also
            // sends what waited on the ring).
            self.kick_once();
        }
        if self.tx_down {
            // Nothing would leave. Descriptors cannot be taken back off the ring (the
            // kernel may have read the producer index), so these are not put on it:
            // dropped now, their frames free again, rather than sent when the link is
            // back.
            for buf in pkts.drain(..) {
                self.stats.tx_dropped += 1;
                self.give_back(buf, pool);
            }
            return Ok(());
        }
        let mut prod = self.tx.producer().load(Ordering::Relaxed);
        let cons = self.tx.consumer().load(Ordering::Acquire);
        let mut room = ring_room(prod, cons, self.tx.size());
        let mut queued = 0usize;
        let frame_size = u64::from(self.cfg.frame_size);
        for buf in pkts.drain(..) {
            if room == 0 {
                self.stats.tx_dropped += 1;
                self.give_back(buf, pool);
                continue;
            }
            let own = buf.owner().filter(|o| o.port == self.cfg.id);
            let desc = match own {
                Some(o) => {
                    let addr = self.umem.addr_of(buf.data().as_ptr());
                    match addr {
                        Some(a) if a >= o.frame && a + buf.len() as u64 <= o.frame + frame_size => {
                            let d = libc::xdp_desc {
                                addr: a,
                                len: buf.len() as u32,
                                options: 0,
                            };
                            // The frame now belongs to the transmit ring until completion.
                            self.lent = self.lent.wrapping_sub(1);
                            drop(buf);
                            d
                        }
                        _ => {
                            self.stats.tx_dropped += 1;
                            self.give_back(buf, pool);
                            continue;
                        }
                    }
                }
                None => {
                    let Some(frame) = self.free.pop() else {
                        self.stats.tx_dropped += 1;
                        self.give_back(buf, pool);
                        continue;
                    };
                    if buf.len() as u64 > frame_size || !self.umem.write(frame, buf.data()) {
                        self.free.push(frame);
                        self.stats.tx_dropped += 1;
                        self.give_back(buf, pool);
                        continue;
                    }
                    let d = libc::xdp_desc {
                        addr: frame,
                        len: buf.len() as u32,
                        options: 0,
                    };
                    // A heap frame goes back to the pool; another port's frame cannot go
                    // back to its port from here and is dropped (its port counts it lent).
                    if buf.owner().is_none() {
                        pool.give(buf);
                    }
                    d
                }
            };
            self.tx.write(prod, desc);
            prod = prod.wrapping_add(1);
            room -= 1;
            queued += 1;
        }
        self.tx.producer().store(prod, Ordering::Release);
        self.tx_in_kernel += queued as u64;
        self.kick(queued);
        Ok(())
    }

    /// At the end of a run: kicks out what the transmit ring still holds and waits up to
    /// 100 ms for the kernel to complete it. What it has not completed then is counted
    /// as `tx_dropped` (the socket closes with it), so `tx + tx_dropped` is every frame
    /// given to [`tx_burst`](Port::tx_burst).
    fn flush(&mut self) -> Result<(), PortError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
        loop {
            self.reap();
            let pending = self.tx_pending();
            if pending == 0 || std::time::Instant::now() >= deadline {
                self.stats.tx_dropped += pending;
                self.tx_written_off += pending;
                return Ok(());
            }
            self.kick(usize::try_from(pending).unwrap_or(usize::MAX));
            if self.tx_down {
                self.kick_once();
            }
            if self.tx_down {
                // Nothing leaves a down interface: no use waiting.
                self.reap();
                let pending = self.tx_pending();
                self.stats.tx_dropped += pending;
                self.tx_written_off += pending;
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn recycle(&mut self, buf: PacketBuf) {
        if let Some(o) = buf.owner().filter(|o| o.port == self.cfg.id) {
            drop(buf);
            self.lent = self.lent.wrapping_sub(1);
            self.free.push(o.frame);
        }
    }

    fn is_live(&self) -> bool {
        true
    }

    /// Every queue's socket: readable when its receive ring holds a frame.
    fn readiness_fds(&self) -> Option<Vec<RawFd>> {
        Some(
            self.queues
                .iter()
                .map(|q| match &q.own {
                    Some((_, socket)) => socket.borrowed().as_raw_fd(),
                    None => self.socket.borrowed().as_raw_fd(),
                })
                .collect(),
        )
    }

    fn stats(&self) -> PortStats {
        let mut s = self.stats;
        // Completions not reaped yet are frames sent too (beyond those written off).
        let done = ring_ready(
            self.comp.producer().load(Ordering::Acquire),
            self.comp.consumer().load(Ordering::Relaxed),
        );
        s.tx += u64::from(done).saturating_sub(self.tx_written_off);
        if let Some(c) = &self.shared {
            s.rx += c.rx.load(Ordering::Relaxed);
            s.rx_dropped += c.rx_dropped.load(Ordering::Relaxed);
        }
        let others = self.queues.iter().filter_map(|q| q.own.as_ref());
        for socket in std::iter::once(&self.socket).chain(others.map(|(_, s)| s)) {
            if let Ok((k, extended)) = socket.statistics_versioned() {
                s.rx_dropped += k.rx_dropped + k.rx_ring_full + k.rx_invalid_descs;
                // Each of the port's own sockets has its own fill ring: its drops beyond
                // the times it found that ring empty are frames too large for a frame.
                s.rx_oversize +=
                    oversize_drops(k.rx_dropped, extended.then_some(k.rx_fill_ring_empty_descs));
                // Never completed, so never in `tx`.
                s.tx_dropped += k.tx_invalid_descs;
            }
        }
        s
    }
}

impl Drop for AfXdpPort {
    fn drop(&mut self) {
        let by_receivers = self
            .shared
            .as_ref()
            .map_or(0, |c| c.lent.load(Ordering::Acquire));
        if self.lent.wrapping_add(by_receivers) != 0 {
            // Frames still lent out as `PacketBuf`s keep pointing into the UMEM.
            self.umem.keep_mapped();
        }
    }
}

/// The receive side of one socket sharing an [`AfXdpPort`]'s UMEM on its queue (see
/// the module docs): moved to the thread that polls it (a worker of the XDP Packet
/// Dispatcher). Its frames are the port's: they go back through the port.
pub struct XskReceiver {
    id: PortId,
    iface: String,
    /// The interface queue it is bound to.
    queue: u32,
    frame_size: u32,
    metadata: bool,
    // Dropped in this order: the ring, the socket (closed once a [`XskStatsReader`]
    // holding it is gone too), then (its share of) the UMEM.
    rx: sys::Ring<libc::xdp_desc>,
    socket: Arc<sys::XskSocket>,
    umem: Arc<sys::Umem>,
    counters: Arc<SharedCounters>,
    /// Frames taken off its receive ring (read by [`XskStatsReader`]).
    received: Arc<AtomicU64>,
}

impl std::fmt::Debug for XskReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskReceiver")
            .field("port", &self.id)
            .field("queue", &self.queue)
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

impl XskReceiver {
    /// The socket, for the XSKMAP entry that redirects to it.
    pub fn socket_fd(&self) -> BorrowedFd<'_> {
        self.socket.borrowed()
    }

    /// The interface queue the socket is bound to (an XSKMAP redirect reaches it only
    /// for frames received on that queue).
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Frames taken off its receive ring so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The kernel's counters for this socket now.
    pub fn statistics(&self) -> Result<XskStatistics, AfXdpError> {
        self.socket
            .statistics_versioned()
            .map(XskStatistics::from_kernel)
            .map_err(|e| sys_error(&self.iface, "getsockopt(SOL_XDP, XDP_STATISTICS)", e))
    }

    /// Takes up to `max` frames off the receive ring into `out` as port-owned
    /// [`PacketBuf`]s, stamped with the wall clock once per burst and, with
    /// [`AfXdpConfig::metadata`], tagged with the tenant slot of their metadata. A frame
    /// without metadata goes to `rejected` instead (counted as the port's `rx_dropped`),
    /// to be handed back to the port unprocessed. Returns how many went to `out`. Never
    /// blocks; no allocation while the vectors have room.
    pub fn receive(
        &mut self,
        out: &mut Vec<PacketBuf>,
        rejected: &mut Vec<PacketBuf>,
        max: usize,
    ) -> usize {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let cons = self.rx.consumer().load(Ordering::Relaxed);
        let k = ring_ready(prod, cons).min(u32::try_from(max).unwrap_or(u32::MAX));
        if k == 0 {
            return 0;
        }
        let ts_ns = sys::realtime_ns();
        let (mut lent, mut n) = (0u64, 0usize);
        for i in 0..k {
            let d = self.rx.read(cons.wrapping_add(i));
            let (base, off) = frame_of(d.addr, self.frame_size);
            let capacity = (u64::from(self.frame_size) - off) as usize;
            let owner = FrameOwner {
                port: self.id,
                frame: base,
            };
            let tenant = if self.metadata {
                metadata_tenant(&self.umem, d.addr, self.frame_size)
            } else {
                Some(TenantSlot(0))
            };
            let Some(mut b) = self.umem.lend(d.addr, capacity, d.len as usize, owner) else {
                // Outside the UMEM: a kernel bug; the frame is lost to this run.
                self.counters.rx_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            b.received(ts_ns, self.id, TenantSlot(0));
            lent += 1;
            match tenant {
                Some(t) => {
                    b.tenant = t;
                    out.push(b);
                    n += 1;
                }
                None => {
                    b.tenant = TenantSlot(0);
                    b.outcome = Outcome::Untagged;
                    self.counters.rx_dropped.fetch_add(1, Ordering::Relaxed);
                    rejected.push(b);
                }
            }
        }
        self.rx
            .consumer()
            .store(cons.wrapping_add(k), Ordering::Release);
        self.counters.rx.fetch_add(u64::from(k), Ordering::Relaxed);
        self.counters.lent.fetch_add(lent, Ordering::Relaxed);
        self.received.fetch_add(u64::from(k), Ordering::Relaxed);
        n
    }
}

/// The sockets one reader polls, one per receive queue (a worker of the XDP Packet
/// Dispatcher on a port of several queues: see the module docs), read round robin like
/// the port's own queues: each call starts one socket further, and every socket may
/// take its share of the call's `max` (rounded up) before any takes more, so a busy
/// queue never starves another. No allocation while the vectors have room.
#[derive(Debug)]
pub struct XskReceivers {
    sockets: Vec<XskReceiver>,
    /// The socket the next call reads first.
    next: usize,
}

impl XskReceivers {
    /// Polls `sockets` in this order (one per queue, usually).
    pub fn new(sockets: Vec<XskReceiver>) -> XskReceivers {
        XskReceivers { sockets, next: 0 }
    }

    /// The sockets, in the order given.
    pub fn sockets(&self) -> &[XskReceiver] {
        &self.sockets
    }

    /// Their descriptors, each readable (`poll(2)`) when its receive ring holds a frame.
    pub fn readiness_fds(&self) -> Vec<RawFd> {
        self.sockets
            .iter()
            .map(|s| s.socket_fd().as_raw_fd())
            .collect()
    }

    /// As [`XskReceiver::receive`], over every socket round robin: at most `max` frames
    /// in all go to `out` and `rejected`. Returns how many went to `out`.
    pub fn receive(
        &mut self,
        out: &mut Vec<PacketBuf>,
        rejected: &mut Vec<PacketBuf>,
        max: usize,
    ) -> usize {
        let k = self.sockets.len();
        if k == 0 {
            return 0;
        }
        let start = self.next;
        self.next = (start + 1) % k;
        let mut n = 0usize;
        fair_round_robin(k, start, max, |i, quota| {
            let before = rejected.len();
            let got = self.sockets[i].receive(out, rejected, quota);
            n += got;
            got + (rejected.len() - before)
        });
        n
    }
}

/// Reads at most `max` descriptors from `k` sources round robin, starting at source
/// `start` (a caller starts one further on each call): every source may take its share
/// (`max / k`, rounded up) before any takes more, so a busy source never starves
/// another. `take(i, quota)` reads up to `quota` from source `i` and returns how many
/// descriptors it consumed.
fn fair_round_robin(
    k: usize,
    start: usize,
    max: usize,
    mut take: impl FnMut(usize, usize) -> usize,
) {
    let share = max.div_ceil(k);
    let mut budget = max;
    for pass in 0..2 {
        for i in 0..k {
            if budget == 0 {
                return;
            }
            let quota = if pass == 0 { share.min(budget) } else { budget };
            budget -= take((start + i) % k, quota);
        }
        if k == 1 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(queue: u32, receiver: Option<usize>, stats: XskStatistics) -> SocketStatistics {
        SocketStatistics {
            queue,
            receiver,
            received: 0,
            stats,
        }
    }

    /// The receivers' drops only (the port's own socket left out), each queue's
    /// oversize its receivers' `rx_dropped` beyond its fill ring's empty count (which
    /// each of them reports once), the rest of every loss dropped.
    #[test]
    fn receiver_drops_split_oversize_from_the_rest_per_queue() {
        let k = |dropped, full, empty| XskStatistics {
            rx_dropped: dropped,
            rx_ring_full: Some(full),
            rx_fill_ring_empty_descs: empty,
            ..XskStatistics::default()
        };
        let sockets = [
            // The port's own socket: never counted.
            socket(0, None, k(100, 100, Some(0))),
            // Queue 0: 7 dropped, 3 of them for an empty fill ring (both report it):
            // 4 oversize; 5 + 2 receive rings full.
            socket(0, Some(0), k(5, 5, Some(3))),
            socket(0, Some(1), k(2, 2, Some(3))),
            // Queue 1: 4 dropped, all for an empty fill ring; 1 ring full.
            socket(1, Some(2), k(4, 1, Some(4))),
        ];
        assert_eq!(
            receiver_drops(&sockets),
            ReceiverDrops {
                oversize: 4,
                dropped: 3 + 7 + 4 + 1,
            }
        );
        // A kernel before 5.9 does not tell: everything is dropped, nothing oversize.
        let old = [socket(
            0,
            Some(0),
            XskStatistics {
                rx_dropped: 6,
                rx_invalid_descs: 1,
                ..XskStatistics::default()
            },
        )];
        assert_eq!(
            receiver_drops(&old),
            ReceiverDrops {
                oversize: 0,
                dropped: 7,
            }
        );
    }

    #[test]
    fn out_of_descriptors_says_which_limit_to_raise() {
        for errno in [libc::EMFILE, libc::ENFILE] {
            let e = sys_error(
                "eth0",
                "socket(AF_XDP)",
                io::Error::from_raw_os_error(errno),
            );
            let msg = e.to_string();
            assert!(msg.starts_with("af_xdp on eth0: socket(AF_XDP): "), "{msg}");
            assert!(msg.contains("raise RLIMIT_NOFILE (`ulimit -n`)"), "{msg}");
        }
        let e = sys_error("eth0", "bind", io::Error::from_raw_os_error(libc::EBUSY));
        assert!(!e.to_string().contains("RLIMIT_NOFILE"), "{e}");
    }

    #[test]
    fn frames_for_queues_give_every_fill_ring_its_64_and_fit_in_1_gib() {
        let cfg = AfXdpConfig::new("x", 0);
        assert_eq!(AfXdpConfig::frames_for_queues(1), cfg.frames);
        assert_eq!(AfXdpConfig::frames_for_queues(32), cfg.frames);
        assert_eq!(AfXdpConfig::frames_for_queues(64), 8192);
        for q in 1..=1024u32 {
            let frames = AfXdpConfig::frames_for_queues(q as usize);
            // The port's own check: each fill ring's share of half the UMEM.
            assert!(cfg.ring_size.min(frames / (2 * q)) >= 64, "{q} queues");
            assert!(frames >= 2 * cfg.ring_size);
            assert!(u64::from(frames) * u64::from(cfg.frame_size) <= 1 << 30);
        }
    }

    #[test]
    fn round_robin_gives_each_source_its_share_before_any_takes_more() {
        // Sources holding 100, 1 and 100 descriptors; 30 to read, starting at source 1.
        let run = |start: usize, max: usize| {
            let mut left = [100usize, 1, 100];
            let mut order = Vec::new();
            fair_round_robin(3, start, max, |i, quota| {
                let got = quota.min(left[i]);
                left[i] -= got;
                order.push((i, got));
                got
            });
            order
        };
        // Shares of 10: the first pass takes 1 + 10 + 10, the second the 9 left from the
        // first source with more, in the same order.
        assert_eq!(run(1, 30), [(1, 1), (2, 10), (0, 10), (1, 0), (2, 9)]);
        assert_eq!(run(0, 0), []);
        let one = {
            let mut calls = Vec::new();
            fair_round_robin(1, 0, 8, |i, quota| {
                calls.push((i, quota));
                2
            });
            calls
        };
        assert_eq!(one, [(0, 8)], "one source: one read of everything");
    }

    #[test]
    fn ring_indices_wrap_around_u32() {
        assert_eq!(ring_ready(5, 5), 0);
        assert_eq!(ring_ready(7, 5), 2);
        assert_eq!(
            ring_ready(3, u32::MAX - 1),
            5,
            "producer wrapped, consumer not"
        );
        assert_eq!(ring_room(3, u32::MAX - 1, 8), 3);
        assert_eq!(ring_room(10, 2, 8), 0, "full");
        assert_eq!(ring_room(2, 2, 8), 8, "empty");
        assert_eq!(
            ring_room(u32::MAX, u32::MAX - 8, 8),
            0,
            "full across the wrap"
        );
    }

    #[test]
    fn addresses_map_to_their_frame() {
        assert_eq!(frame_of(0, 2048), (0, 0));
        assert_eq!(frame_of(2048 + 256, 2048), (2048, 256));
        assert_eq!(frame_of(4095, 4096), (0, 4095));
        assert_eq!(frame_of(3 * 4096 + 256, 4096), (3 * 4096, 256));
    }

    #[test]
    fn the_tenant_comes_from_the_metadata_word_before_the_frame() {
        let umem = sys::Umem::new(4 * 2048).unwrap();
        // A frame given to the kernel carries the "no metadata" mark ...
        assert!(umem.write(2048 + META_AT, &NO_META.to_ne_bytes()));
        assert_eq!(metadata_tenant(&umem, 2048 + 256, 2048), None);
        // ... until the program writes a slot there (32 bits: more than 63 tenants).
        assert!(umem.write(2048 + META_AT, &70_000u32.to_ne_bytes()));
        assert_eq!(
            metadata_tenant(&umem, 2048 + 256, 2048),
            Some(TenantSlot(70_000))
        );
        // No room for metadata at the very start of a frame.
        assert_eq!(metadata_tenant(&umem, 2048, 2048), None);
    }

    #[test]
    fn redirect_program_encodes_as_the_kernel_reads_it() {
        let p = redirect_program(7);
        let bytes: Vec<[u8; 8]> = p.iter().map(|i| i.to_le_bytes()).collect();
        assert_eq!(
            bytes[0],
            [0x61, 0x12, 16, 0, 0, 0, 0, 0],
            "ldxw r2, [r1+16]"
        );
        assert_eq!(
            bytes[1],
            [0x18, 0x11, 0, 0, 7, 0, 0, 0],
            "lddw r1, map fd 7"
        );
        assert_eq!(bytes[2], [0; 8]);
        assert_eq!(bytes[3], [0xb7, 0x03, 0, 0, 2, 0, 0, 0], "mov r3, XDP_PASS");
        assert_eq!(
            bytes[4],
            [0x85, 0, 0, 0, 51, 0, 0, 0],
            "call bpf_redirect_map"
        );
        assert_eq!(bytes[5], [0x95, 0, 0, 0, 0, 0, 0, 0], "exit");
    }

    #[test]
    fn only_buffet_programs_name_a_pid() {
        assert_eq!(program_pid("bfxsk_0000002a"), Some(42));
        assert_eq!(program_pid("bfxsk_2a"), None);
        assert_eq!(program_pid("xdp_dispatcher"), None);
        assert_eq!(program_pid("bfxsk_zzzzzzzz"), None);
    }

    #[test]
    fn bad_sizes_are_refused_before_anything_is_opened() {
        let e = AfXdpPort::open(AfXdpConfig {
            frame_size: 1000,
            ..AfXdpConfig::new("lo", 0)
        })
        .unwrap_err();
        assert!(matches!(e, AfXdpError::Config { .. }), "{e}");
        let e = AfXdpPort::open(AfXdpConfig {
            ring_size: 1000,
            ..AfXdpConfig::new("lo", 0)
        })
        .unwrap_err();
        assert!(matches!(e, AfXdpError::Config { .. }), "{e}");
        let e = AfXdpPort::open(AfXdpConfig::new("buffet-nope0", 0)).unwrap_err();
        assert!(matches!(e, AfXdpError::NoSuchInterface { .. }), "{e}");
        let e = AfXdpPort::open(AfXdpConfig {
            queue: 4096,
            ..AfXdpConfig::new("lo", 0)
        })
        .unwrap_err();
        assert!(matches!(e, AfXdpError::QueueOutOfRange { .. }), "{e}");
        assert!(e.to_string().contains("queue 4096 does not exist"), "{e}");
    }

    #[test]
    fn a_queue_set_is_checked_before_anything_is_opened() {
        let lo = |queue: u32, queues: Vec<u32>| AfXdpConfig {
            queue,
            queues,
            ..AfXdpConfig::new("lo", 0)
        };
        assert_eq!(lo(2, vec![0, 2, 3]).receive_queues(), [2, 0, 3]);
        assert_eq!(lo(1, vec![]).receive_queues(), [1]);
        let e = AfXdpPort::open(lo(0, vec![1, 2])).unwrap_err();
        assert!(
            e.to_string().contains(
                "frames are sent on queue 0, which is not among the receive queues [1, 2]"
            ),
            "{e}"
        );
        for twice in [vec![0, 1, 0], vec![0, 1, 1]] {
            let e = AfXdpPort::open(lo(0, twice)).unwrap_err();
            assert!(e.to_string().contains("a queue is named twice"), "{e}");
        }
        // Metadata frames (the XDP Packet Dispatcher's) on several queues pass the
        // configuration checks and reach the interface's: `lo` has one queue.
        let e = AfXdpPort::open(AfXdpConfig {
            metadata: true,
            ..lo(0, vec![0, 1])
        })
        .unwrap_err();
        assert!(
            matches!(e, AfXdpError::QueueOutOfRange { queue: 1, .. }),
            "{e}"
        );
        let e = AfXdpPort::open(AfXdpConfig {
            frames: 128,
            ring_size: 64,
            ..lo(0, vec![0, 1])
        })
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("128 frames for 2 queues: at least 128 per queue"),
            "{e}"
        );
        // `lo` has one receive queue: the first queue it lacks is named, with the count.
        let e = AfXdpPort::open(lo(0, vec![0, 1, 2])).unwrap_err();
        assert!(
            e.to_string().contains(
                "af_xdp on lo: queue 1 does not exist: the interface has 1 receive queue(s)"
            ),
            "{e}"
        );
    }
}
