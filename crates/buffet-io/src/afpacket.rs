//! The AF_PACKET port: a live Linux interface through a packet socket.
//!
//! Receive reads a TPACKET_V3 ring mapped into this process (PACKET_MMAP): the kernel
//! fills blocks of frames, [`rx_burst`](Port::rx_burst) walks the blocks it handed over,
//! copies each frame into a heap [`PacketBuf`] from the data plane's [`HeapPool`] and
//! gives the block back once every frame of it is copied. Copying is the choice here
//! on purpose: lending ring frames would pin a whole block until its last packet left
//! the workers, so one slow tenant could stall the ring for everyone; zero-copy receive
//! is the AF_XDP port's job (UMEM frames are independent). A frame larger than
//! [`FRAME_CAPACITY`](crate::FRAME_CAPACITY), or cut short by the ring, is counted in
//! [`PortStats::rx_dropped`] with what the kernel dropped for lack of ring room
//! (`PACKET_STATISTICS` `tp_drops`). When the pool is empty (workers behind), frames
//! stay in the ring and the kernel drops and counts what does not fit.
//!
//! Transmit sends a burst with `sendmmsg` (one system call per 64 frames, never
//! blocking): the frames are heap buffers already, so a TPACKET TX ring would add a copy
//! into the ring and still need a `send` to kick it. Frames the kernel refuses are
//! counted in [`PortStats::tx_dropped`]. `PACKET_IGNORE_OUTGOING` keeps what this
//! process (or anyone) sends on the interface out of its own receive ring.
//!
//! Opening checks, before any traffic: that the process may open a packet socket (it
//! needs `CAP_NET_RAW`; promiscuous mode `CAP_NET_ADMIN`), that the interface exists in
//! this network namespace and that it is up; each failure is its own
//! [`AfPacketError`] with a message that says what to do.
//!
//! The kernel takes a received frame's 802.1Q tag out of the frame (into the ring's
//! frame header); the port puts it back, so VLAN rules see the frame as it was on the
//! wire.
//!
//! Fanout: ports opened with the same [`AfPacketConfig::fanout`] group on one interface
//! share its traffic (`PACKET_FANOUT_HASH`): the kernel gives each frame to exactly one
//! member, chosen by a hash of its flow, so several readers (one per worker, say) see
//! every frame once between them and a flow always on the same reader.
//!
//! Not here: fanout modes other than hash, and timestamps other than the kernel's
//! receive time.

use std::cell::Cell;
use std::io;
use std::sync::atomic::AtomicBool;

use buffet_sdk::{PortId, TenantSlot};

use crate::buf::PacketBuf;
use crate::port::{HeapPool, Port, PortError, PortStats, Rx};

#[allow(unsafe_code)]
mod sys;

/// How an [`AfPacketPort`] is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfPacketConfig {
    /// The interface (`eth0`, `veth-a`).
    pub iface: String,
    /// The port id its received frames carry.
    pub id: PortId,
    /// Receive on it (false: a transmit-only port, e.g. a `--tx-iface`).
    pub rx: bool,
    /// Put the interface in promiscuous mode while the port is open.
    pub promisc: bool,
    /// Bytes per ring block (a multiple of the page size).
    pub block_size: u32,
    /// Blocks in the ring.
    pub block_nr: u32,
    /// Milliseconds after which the kernel hands over a block that is not full.
    pub block_timeout_ms: u32,
    /// Join this fanout group (`PACKET_FANOUT_HASH`): the group's members on the
    /// interface share its frames by flow hash, each frame going to one member.
    pub fanout: Option<u16>,
}

impl AfPacketConfig {
    /// A receive-and-transmit port on `iface` with an 8 MiB ring of 256 KiB blocks
    /// retired after 1 ms.
    pub fn new(iface: impl Into<String>, id: PortId) -> AfPacketConfig {
        AfPacketConfig {
            iface: iface.into(),
            id,
            rx: true,
            promisc: false,
            block_size: 1 << 18,
            block_nr: 32,
            block_timeout_ms: 1,
            fanout: None,
        }
    }
}

/// Why an AF_PACKET port could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AfPacketError {
    /// The process may not open a packet socket.
    #[error(
        "af_packet on {iface}: permission denied ({source}): a live run needs CAP_NET_RAW \
         (and CAP_NET_ADMIN for promiscuous mode); run it as root or grant them with \
         `setcap cap_net_raw,cap_net_admin+ep <binary>`"
    )]
    Privilege {
        /// The interface.
        iface: String,
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
    /// The ring sizes are not usable.
    #[error("af_packet on {iface}: {why}")]
    Config {
        /// The interface.
        iface: String,
        /// What is wrong.
        why: String,
    },
    /// A set-up call failed.
    #[error("af_packet on {iface}: {call}: {source}")]
    Sys {
        /// The interface.
        iface: String,
        /// The call.
        call: &'static str,
        /// What the OS said.
        source: io::Error,
    },
}

/// A live interface as a [`Port`]. See the module docs.
pub struct AfPacketPort {
    cfg: AfPacketConfig,
    socket: sys::Socket,
    /// The interface's index when the port was opened: the socket stays bound to it.
    ifindex: u32,
    /// The socket said the interface went down, and it was still there then.
    down: bool,
    /// The interface was found gone: said once, never looked at again.
    gone: bool,
    /// A send was refused because the interface is down or gone (a transmit-only socket,
    /// bound to no protocol, is never told otherwise); [`take_error`](Port::take_error)
    /// reports it once.
    send_refused: bool,
    /// The last look found the interface up without carrier (its driver says no link):
    /// its device drops every frame while the send still succeeds, so the port drops
    /// them itself and counts them as `tx_dropped`, looking again at each transmit burst.
    /// Looked at when opened and at every link look ([`take_error`](Port::take_error)).
    no_carrier: bool,
    ring: Option<sys::Ring>,
    /// The block being read, whether we are inside it, frames left and the next offset.
    block: usize,
    in_block: bool,
    left: u32,
    offset: usize,
    stats: PortStats,
    /// Kernel drops read so far (reading `PACKET_STATISTICS` resets the kernel's count).
    kernel_drops: Cell<u64>,
}

impl std::fmt::Debug for AfPacketPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacketPort")
            .field("cfg", &self.cfg)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl AfPacketPort {
    /// Opens the port: checks privilege, the interface and its state, then sets up the
    /// ring and binds. Nothing is received before this returns.
    pub fn open(cfg: AfPacketConfig) -> Result<AfPacketPort, AfPacketError> {
        let iface = cfg.iface.clone();
        let sys_err = |call: &'static str| {
            let iface = iface.clone();
            move |source: io::Error| AfPacketError::Sys {
                iface,
                call,
                source,
            }
        };
        let socket = sys::Socket::open().map_err(|source| match source.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => AfPacketError::Privilege {
                iface: iface.clone(),
                source,
            },
            _ => AfPacketError::Sys {
                iface: iface.clone(),
                call: "socket(AF_PACKET)",
                source,
            },
        })?;
        let ifindex = sys::if_index(&cfg.iface).map_err(|e| match e.raw_os_error() {
            Some(libc::ENODEV) | Some(libc::ENXIO) => AfPacketError::NoSuchInterface {
                iface: iface.clone(),
            },
            _ => sys_err("if_nametoindex")(e),
        })?;
        let flags = socket
            .if_flags(&cfg.iface)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENODEV) => AfPacketError::NoSuchInterface {
                    iface: iface.clone(),
                },
                _ => sys_err("ioctl(SIOCGIFFLAGS)")(e),
            })?;
        if flags & libc::IFF_UP == 0 {
            return Err(AfPacketError::Down { iface });
        }
        let mut ring = None;
        if cfg.rx {
            let page = 4096u32;
            if cfg.block_size == 0
                || cfg.block_size % page != 0
                || cfg.block_nr == 0
                || (cfg.block_size as u64) * (cfg.block_nr as u64) > 1 << 30
            {
                return Err(AfPacketError::Config {
                    iface,
                    why: format!(
                        "ring of {} blocks of {} bytes: blocks are a non-zero multiple of \
                         4096 bytes, at most 1 GiB in all",
                        cfg.block_nr, cfg.block_size
                    ),
                });
            }
            socket
                .set_packet_int(
                    libc::PACKET_VERSION,
                    libc::tpacket_versions::TPACKET_V3 as _,
                )
                .map_err(sys_err("setsockopt(PACKET_VERSION, TPACKET_V3)"))?;
            socket
                .set_packet_int(libc::PACKET_IGNORE_OUTGOING, 1)
                .map_err(sys_err("setsockopt(PACKET_IGNORE_OUTGOING)"))?;
            let frame_size = 2048u32;
            let req = libc::tpacket_req3 {
                tp_block_size: cfg.block_size,
                tp_block_nr: cfg.block_nr,
                tp_frame_size: frame_size,
                tp_frame_nr: cfg.block_size / frame_size * cfg.block_nr,
                tp_retire_blk_tov: cfg.block_timeout_ms.max(1),
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            socket
                .set_rx_ring(&req)
                .map_err(sys_err("setsockopt(PACKET_RX_RING)"))?;
            ring = Some(
                socket
                    .map_ring(cfg.block_size as usize, cfg.block_nr as usize)
                    .map_err(sys_err("mmap(rx ring)"))?,
            );
        }
        socket
            .bind(ifindex, cfg.rx)
            .map_err(sys_err("bind(AF_PACKET)"))?;
        if let Some(group) = cfg.fanout {
            if !cfg.rx {
                return Err(AfPacketError::Config {
                    iface,
                    why: "a transmit-only port cannot join a fanout group".into(),
                });
            }
            // Group id in the low 16 bits, the mode and flags in the high 16. The group
            // has its own hook: PACKET_IGNORE_OUTGOING must be said again for it.
            let mode = (libc::PACKET_FANOUT_HASH | libc::PACKET_FANOUT_FLAG_IGNORE_OUTGOING)
                as libc::c_int;
            let arg = libc::c_int::from(group) | (mode << 16);
            socket
                .set_packet_int(libc::PACKET_FANOUT, arg)
                .map_err(sys_err("setsockopt(PACKET_FANOUT, HASH)"))?;
        }
        if cfg.promisc {
            socket
                .add_promisc(ifindex)
                .map_err(|source| match source.raw_os_error() {
                    Some(libc::EPERM) | Some(libc::EACCES) => AfPacketError::Privilege {
                        iface: iface.clone(),
                        source,
                    },
                    _ => sys_err("setsockopt(PACKET_ADD_MEMBERSHIP, PROMISC)")(source),
                })?;
        }
        let mut port = AfPacketPort {
            cfg,
            socket,
            ifindex,
            down: false,
            gone: false,
            send_refused: false,
            no_carrier: false,
            ring,
            block: 0,
            in_block: false,
            left: 0,
            offset: 0,
            stats: PortStats::default(),
            kernel_drops: Cell::new(0),
        };
        port.look_at_carrier();
        Ok(port)
    }

    /// Whether the interface's name still resolves to the index the socket is bound to:
    /// `Some(false)` when it resolves to another or to none (`ENODEV`: deleted, or moved
    /// to another namespace), `None` when the lookup itself failed (out of descriptors).
    fn same_interface(&self) -> Option<bool> {
        match sys::if_index(&self.cfg.iface) {
            Ok(i) => Some(i == self.ifindex),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENXIO)) => Some(false),
            Err(_) => None,
        }
    }

    /// Looks whether the interface is up and has lost its carrier (`SIOCGIFFLAGS`, then
    /// `ETHTOOL_GLINK`: the driver's word now; `IFF_RUNNING` follows it only up to a
    /// second later, and a veth carries frames meanwhile), keeps the answer in
    /// `no_carrier` and returns it. A driver that cannot say, or a failed look, counts as
    /// carrier; an interface that is down or gone is not "without carrier": sends to it
    /// are refused (`ENETDOWN`), which is how a transmit-only socket learns it.
    fn look_at_carrier(&mut self) -> bool {
        self.no_carrier = link_of(&self.socket, &self.cfg.iface) == Some(Link::NoCarrier);
        self.no_carrier
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &AfPacketConfig {
        &self.cfg
    }
}

impl Port for AfPacketPort {
    fn name(&self) -> String {
        format!("af_packet:{}", self.cfg.iface)
    }

    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let Some(ring) = &mut self.ring else {
            return Ok(Rx::Idle);
        };
        let mut n = 0;
        while n < max {
            if !self.in_block {
                if !ring.ready(self.block) {
                    break;
                }
                let (num, first) = ring.header(self.block);
                self.left = num;
                self.offset = first as usize;
                self.in_block = true;
            }
            if self.left == 0 {
                ring.release(self.block);
                self.block = (self.block + 1) % ring.blocks();
                self.in_block = false;
                continue;
            }
            // No free frame: leave the rest in the ring until workers give frames back.
            let Some(mut buf) = pool.take() else { break };
            match ring.frame(self.block, self.offset) {
                Some(f) => {
                    self.stats.rx += 1;
                    if (f.data.len() as u64) < u64::from(f.len) || !fill(&mut buf, &f) {
                        // Cut short by the ring (its frames hold a frame buffer) or too
                        // large for one once its VLAN tag is back.
                        let tag = if f.vlan.is_some() { 4 } else { 0 };
                        if f.len as usize + tag > crate::buf::FRAME_CAPACITY {
                            self.stats.rx_oversize += 1;
                        }
                        self.stats.rx_dropped += 1;
                        pool.give(buf);
                    } else {
                        buf.received(f.ts_ns, self.cfg.id, TenantSlot(0));
                        out.push(buf);
                        n += 1;
                    }
                    self.offset += f.next_offset as usize;
                    self.left -= 1;
                    if f.next_offset == 0 {
                        self.left = 0;
                    }
                }
                None => {
                    // A header outside its block: skip the rest of the block.
                    pool.give(buf);
                    self.left = 0;
                }
            }
        }
        Ok(if n == 0 { Rx::Idle } else { Rx::Packets(n) })
    }

    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        // Without carrier (since the last look): one look per burst until it is back,
        // which costs nothing next to the frames it would drop.
        if self.no_carrier && self.look_at_carrier() {
            self.stats.tx_dropped += pkts.len() as u64;
            for buf in pkts.drain(..) {
                pool.give(buf);
            }
            return Ok(());
        }
        let mut i = 0;
        let mut waited = false;
        while i < pkts.len() {
            match self.socket.send_batch(&pkts[i..]) {
                Ok(k) => {
                    i += k.max(1);
                    self.stats.tx += k as u64;
                    if k == 0 {
                        self.stats.tx_dropped += 1;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOBUFS)) => {
                    if waited {
                        // Still no room: the rest of the burst is dropped, counted.
                        self.stats.tx_dropped += (pkts.len() - i) as u64;
                        break;
                    }
                    self.socket.wait_writable(1);
                    waited = true;
                }
                Err(e) => {
                    // This frame is refused (too large for the link, link gone): count it
                    // and go on with the next. A link that is down or gone is told once.
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENETDOWN | libc::ENXIO | libc::ENODEV)
                    ) {
                        self.send_refused = true;
                    }
                    self.stats.tx_dropped += 1;
                    i += 1;
                }
            }
        }
        for buf in pkts.drain(..) {
            pool.give(buf);
        }
        Ok(())
    }

    fn is_live(&self) -> bool {
        true
    }

    /// The socket: readable once the kernel retired a block of the ring to us (full, or
    /// after `block_timeout_ms`), which is also when [`rx_burst`](Port::rx_burst) sees
    /// its frames.
    fn readiness_fds(&self) -> Option<Vec<std::os::fd::RawFd>> {
        Some(match self.ring {
            Some(_) => vec![self.socket.raw_fd()],
            None => Vec::new(),
        })
    }

    /// The kernel reports `ENETDOWN` on the socket once when the interface goes down or
    /// is removed. Down, the socket receives again once the interface is up; removed (or
    /// moved to another namespace), it never does, even if an interface of the same name
    /// comes back: the name no longer resolves to the index the socket is bound to. A
    /// transmit-only socket is not told; a send it had refused for that reason counts
    /// instead.
    fn take_error(&mut self) -> Result<(), PortError> {
        self.look_at_carrier();
        let refused = std::mem::take(&mut self.send_refused) && !self.down && !self.gone;
        let lost = match self.socket.take_error() {
            Ok(None) => refused,
            Ok(Some(e)) if e.raw_os_error() == Some(libc::ENETDOWN) => true,
            Ok(Some(source)) => {
                return Err(PortError::Io {
                    call: "receive",
                    source,
                })
            }
            Err(source) => {
                return Err(PortError::Io {
                    call: "getsockopt(SO_ERROR)",
                    source,
                })
            }
        };
        if !lost {
            return Ok(());
        }
        // Not sure it is gone: down, looked at again later.
        self.gone = self.same_interface() == Some(false);
        self.down = !self.gone;
        Err(PortError::LinkLost {
            iface: self.cfg.iface.clone(),
            gone: self.gone,
        })
    }

    fn recheck_link(&mut self) -> Result<bool, PortError> {
        if !self.down {
            return Ok(false);
        }
        match self.same_interface() {
            Some(false) => {
                (self.down, self.gone) = (false, true);
                Err(PortError::LinkLost {
                    iface: self.cfg.iface.clone(),
                    gone: true,
                })
            }
            // The lookup failed: still down as far as is known; looked at again.
            None => Ok(true),
            Some(true) => {
                // The port's own socket answers SIOCGIFFLAGS.
                let flags = self.socket.if_flags(&self.cfg.iface);
                self.down = flags.map_or(true, |f| f & libc::IFF_UP == 0);
                // Sends refused while it was down are not news once it is up.
                self.send_refused = false;
                Ok(self.down)
            }
        }
    }

    fn stats(&self) -> PortStats {
        if self.ring.is_some() {
            if let Ok(st) = self.socket.take_stats() {
                self.kernel_drops
                    .set(self.kernel_drops.get() + u64::from(st.tp_drops));
            }
        }
        let mut s = self.stats;
        s.rx_dropped += self.kernel_drops.get();
        s
    }
}

/// Copies a ring frame into `buf`, putting back the 802.1Q tag the kernel took out of it
/// (so VLAN rules classify as on the wire); false when it does not fit.
fn fill(buf: &mut PacketBuf, f: &sys::RingFrame<'_>) -> bool {
    let Some((tpid, tci)) = f.vlan else {
        return buf.fill(f.data);
    };
    if f.data.len() < 12 || !buf.fill(f.data) {
        return false;
    }
    let len = f.data.len() + 4;
    let Some(b) = buf.buffer_mut().get_mut(..len) else {
        return false;
    };
    b.copy_within(12..len - 4, 16);
    b[12..14].copy_from_slice(&tpid.to_be_bytes());
    b[14..16].copy_from_slice(&tci.to_be_bytes());
    buf.set_len(len);
    true
}

/// The index of interface `name` in this network namespace, or `None` when no
/// interface has that name (any more): a live run compares it with the index it
/// started with to find its interface deleted, or moved to another namespace.
pub fn interface_index(name: &str) -> Option<u32> {
    sys::if_index(name).ok()
}

/// The state of an interface's link, as a live run reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Up, with a carrier (or a driver that cannot say whether it has one).
    Up,
    /// Down (`IFF_UP` clear): set down on this host.
    Down,
    /// Up, but its driver sees no carrier: the cable or the far end is down (for a veth,
    /// its peer). Nothing arrives, and an AF_PACKET port counts what it would send as
    /// `tx_dropped`.
    NoCarrier,
}

/// The link of interface `name` of this network namespace ([`Link`]), or `None` when it
/// cannot be told (no such interface): a live run watches it to say when its interface
/// goes down or loses its carrier, and when it is up again.
pub fn interface_link(name: &str) -> Option<Link> {
    link_of(&sys::Socket::query().ok()?, name)
}

/// [`interface_link`] through `socket` (`SIOCGIFFLAGS`, then `ETHTOOL_GLINK` for an
/// interface that is up; a driver that cannot say counts as carrier).
fn link_of(socket: &sys::Socket, name: &str) -> Option<Link> {
    let flags = socket.if_flags(name).ok()?;
    Some(if flags & libc::IFF_UP == 0 {
        Link::Down
    } else if socket.link_detected(name) == Some(false) {
        Link::NoCarrier
    } else {
        Link::Up
    })
}

/// Installs SIGINT and SIGTERM handlers for a live run and returns the flag they set
/// (once set, it stays set). The handler does nothing else: the run polls the flag and
/// stops its pipeline. Each handler fires once: a second signal of the same kind takes
/// the default action and ends the process, for a run that does not stop.
pub fn stop_on_signals() -> io::Result<&'static AtomicBool> {
    sys::stop_on_signals()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_ETHERTYPE: [u8; 2] = [0x88, 0xb5]; // IEEE local experimental

    fn frame(i: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xb1]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xb2]);
        f[12..14].copy_from_slice(&TEST_ETHERTYPE);
        f[14] = i;
        f[15..20].copy_from_slice(b"bufft");
        f
    }

    fn can_open(test: &str) -> bool {
        match AfPacketPort::open(AfPacketConfig::new("lo", 0)) {
            Ok(_) => true,
            Err(e @ AfPacketError::Privilege { .. }) => {
                buffet_testkit::gate::skip_privileged(test, e)
            }
            Err(e) => panic!("{test}: {e}"),
        }
    }

    #[test]
    fn frames_sent_on_loopback_are_received_once_and_counted() {
        if !can_open("afpacket::frames_sent_on_loopback_are_received_once_and_counted") {
            return;
        }
        let mut rx = AfPacketPort::open(AfPacketConfig::new("lo", 3)).unwrap();
        let mut tx = AfPacketPort::open(AfPacketConfig {
            rx: false,
            ..AfPacketConfig::new("lo", 4)
        })
        .unwrap();
        let mut pool = HeapPool::new(256);
        let mut burst: Vec<PacketBuf> = (0..100u8)
            .map(|i| {
                let mut b = pool.take().unwrap();
                assert!(b.fill(&frame(i)));
                b
            })
            .collect();
        tx.tx_burst(&mut burst, &mut pool).unwrap();
        assert_eq!(tx.stats().tx, 100);
        assert_eq!(pool.available(), 256, "sent frames go back to the pool");
        // Collect ours (lo carries other traffic too) until all arrived or 2 s passed.
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut out = Vec::new();
        while seen.len() < 100 && std::time::Instant::now() < deadline {
            rx.rx_burst(&mut pool, &mut out, 64).unwrap();
            for b in out.drain(..) {
                if b.data().get(12..14) == Some(&TEST_ETHERTYPE[..])
                    && b.data().get(15..20) == Some(&b"bufft"[..])
                {
                    assert_eq!(b.in_port, 3);
                    assert!(
                        b.ts_ns > 1_600_000_000_000_000_000,
                        "kernel wall-clock time"
                    );
                    seen.push(b.data()[14]);
                }
                pool.give(b);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..100u8).collect::<Vec<_>>(),
            "each frame once, none lost"
        );
        assert!(rx.stats().rx >= 100);
        assert_eq!(tx.stats().rx, 0, "a transmit-only port receives nothing");
    }

    #[test]
    fn a_vlan_tag_the_kernel_took_out_is_put_back() {
        if !can_open("afpacket::a_vlan_tag_the_kernel_took_out_is_put_back") {
            return;
        }
        let mut rx = AfPacketPort::open(AfPacketConfig::new("lo", 0)).unwrap();
        let mut tx = AfPacketPort::open(AfPacketConfig {
            rx: false,
            ..AfPacketConfig::new("lo", 1)
        })
        .unwrap();
        let mut tagged = frame(7);
        tagged.splice(12..12, [0x81, 0x00, 0x20, 0x2a]); // PCP 1, VLAN 42
        tagged[22..27].copy_from_slice(b"vlan!");
        let mut pool = HeapPool::new(64);
        let mut b = pool.take().unwrap();
        assert!(b.fill(&tagged));
        tx.tx_burst(&mut vec![b], &mut pool).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut out = Vec::new();
        let mut got = None;
        while got.is_none() && std::time::Instant::now() < deadline {
            rx.rx_burst(&mut pool, &mut out, 64).unwrap();
            for b in out.drain(..) {
                if b.data().get(22..27) == Some(&b"vlan!"[..]) {
                    got = Some(b.data().to_vec());
                }
                pool.give(b);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            got.as_deref(),
            Some(&tagged[..]),
            "received as sent, tag included"
        );
    }

    /// A UDP/IPv4 frame of flow `flow` (source port), marked with `i`.
    fn flow_frame(flow: u16, i: u16) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xb1]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xb2]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&50u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[127, 0, 0, 1]);
        f[30..34].copy_from_slice(&[127, 0, 0, 1]);
        f[34..36].copy_from_slice(&flow.to_be_bytes());
        f[36..38].copy_from_slice(&9u16.to_be_bytes());
        f[38..40].copy_from_slice(&30u16.to_be_bytes());
        f[42..48].copy_from_slice(b"fanout");
        f[48..50].copy_from_slice(&i.to_be_bytes());
        f
    }

    #[test]
    fn two_fanout_members_see_every_frame_exactly_once() {
        if !can_open("afpacket::two_fanout_members_see_every_frame_exactly_once") {
            return;
        }
        let group = (std::process::id() & 0xffff) as u16;
        let member = |id| {
            AfPacketPort::open(AfPacketConfig {
                fanout: Some(group),
                ..AfPacketConfig::new("lo", id)
            })
            .unwrap()
        };
        let mut members = [member(0), member(1)];
        let mut tx = AfPacketPort::open(AfPacketConfig {
            rx: false,
            ..AfPacketConfig::new("lo", 2)
        })
        .unwrap();
        let mut pool = HeapPool::new(1024);
        const N: u16 = 400;
        let mut burst: Vec<PacketBuf> = (0..N)
            .map(|i| {
                let mut b = pool.take().unwrap();
                assert!(b.fill(&flow_frame(20_000 + i % 40, i)));
                b
            })
            .collect();
        tx.tx_burst(&mut burst, &mut pool).unwrap();
        assert_eq!(tx.stats().tx, u64::from(N));
        let mut seen = vec![[0u32; 2]; usize::from(N)];
        let mut flows = std::collections::HashMap::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut out = Vec::new();
        let total = |seen: &[[u32; 2]]| seen.iter().map(|s| s[0] + s[1]).sum::<u32>();
        while total(&seen) < u32::from(N) && std::time::Instant::now() < deadline {
            for (m, port) in members.iter_mut().enumerate() {
                port.rx_burst(&mut pool, &mut out, 64).unwrap();
                for b in out.drain(..) {
                    let d = b.data();
                    if d.get(42..48) == Some(&b"fanout"[..]) {
                        let i = usize::from(u16::from_be_bytes([d[48], d[49]]));
                        let flow = u16::from_be_bytes([d[34], d[35]]);
                        seen[i][m] += 1;
                        assert_eq!(
                            *flows.entry(flow).or_insert(m),
                            m,
                            "flow {flow} stays on one member"
                        );
                    }
                    pool.give(b);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Anything late would be a duplicate: look once more.
        std::thread::sleep(std::time::Duration::from_millis(50));
        for (m, port) in members.iter_mut().enumerate() {
            port.rx_burst(&mut pool, &mut out, 1024).unwrap();
            for b in out.drain(..) {
                let d = b.data();
                if d.get(42..48) == Some(&b"fanout"[..]) {
                    seen[usize::from(u16::from_be_bytes([d[48], d[49]]))][m] += 1;
                }
                pool.give(b);
            }
        }
        for (i, s) in seen.iter().enumerate() {
            assert_eq!(s[0] + s[1], 1, "frame {i} seen {s:?} (member 0, member 1)");
        }
        let per_member = [0, 1].map(|m| seen.iter().filter(|s| s[m] == 1).count());
        assert!(
            per_member.iter().all(|&n| n > 0),
            "40 flows hash to both members: {per_member:?}"
        );
    }

    #[test]
    fn missing_and_down_interfaces_are_refused_by_name() {
        if !can_open("afpacket::missing_and_down_interfaces_are_refused_by_name") {
            return;
        }
        let e = AfPacketPort::open(AfPacketConfig::new("buffet-nope0", 0)).unwrap_err();
        assert!(matches!(e, AfPacketError::NoSuchInterface { .. }), "{e}");
        assert!(
            e.to_string().contains("\"buffet-nope0\" does not exist"),
            "{e}"
        );
        let e = AfPacketPort::open(AfPacketConfig {
            block_size: 1000,
            ..AfPacketConfig::new("lo", 0)
        })
        .unwrap_err();
        assert!(matches!(e, AfPacketError::Config { .. }), "{e}");
    }
}
