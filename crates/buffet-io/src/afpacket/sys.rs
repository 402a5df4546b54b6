//! The system calls of the AF_PACKET port and of live runs, each behind a safe function:
//! the packet socket (options, bind, statistics, batched send), the TPACKET_V3 receive
//! ring mapped into this process, interface lookups, and the SIGINT/SIGTERM flag.
//!
//! Nothing here decides anything: sizes, order of set-up and error wording are the
//! caller's ([`super`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, Ordering};

use crate::buf::PacketBuf;
use crate::sys::named_ifreq;

/// Frames one `sendmmsg` call carries at most (the arrays live on the stack).
const SEND_CHUNK: usize = 64;

fn check(call_result: libc::c_int) -> io::Result<libc::c_int> {
    if call_result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(call_result)
    }
}

/// An AF_PACKET raw socket.
pub(crate) struct Socket {
    fd: OwnedFd,
}

impl Socket {
    /// A raw packet socket that receives nothing until [`bind`](Self::bind) names a
    /// protocol (protocol 0 here), so no frame is queued before the ring exists.
    pub(crate) fn open() -> io::Result<Socket> {
        // SAFETY: plain system call with constant arguments; the result is checked.
        let fd = check(unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: `fd` was just returned by `socket` and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Socket { fd })
    }

    /// A datagram socket of this namespace for interface queries (`SIOCGIFFLAGS`): it
    /// needs no privilege, unlike a packet socket.
    pub(crate) fn query() -> io::Result<Socket> {
        // SAFETY: plain system call with constant arguments; the result is checked.
        let fd = check(unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: `fd` was just returned by `socket` and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Socket { fd })
    }

    /// The descriptor, for `poll(2)`.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    fn setsockopt<T>(&self, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
        // SAFETY: `value` points to a live `T` of the size passed; the kernel only reads it.
        check(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (value as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// `SOL_PACKET` option `name` set to an integer.
    pub(crate) fn set_packet_int(&self, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
        self.setsockopt(libc::SOL_PACKET, name, &value)
    }

    /// `PACKET_RX_RING` with a TPACKET_V3 request.
    pub(crate) fn set_rx_ring(&self, req: &libc::tpacket_req3) -> io::Result<()> {
        self.setsockopt(libc::SOL_PACKET, libc::PACKET_RX_RING, req)
    }

    /// Puts the interface in promiscuous mode for as long as this socket lives.
    pub(crate) fn add_promisc(&self, ifindex: u32) -> io::Result<()> {
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as libc::c_int,
            mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        self.setsockopt(libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
    }

    /// Binds to one interface and every protocol (`ETH_P_ALL`) or, with `all = false`,
    /// to the interface only (a transmit-only socket that receives nothing).
    pub(crate) fn bind(&self, ifindex: u32, all: bool) -> io::Result<()> {
        // SAFETY: `sockaddr_ll` is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as libc::c_ushort;
        addr.sll_protocol = if all {
            (libc::ETH_P_ALL as u16).to_be()
        } else {
            0
        };
        addr.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `addr` is a valid `sockaddr_ll` of the size passed.
        check(unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// The interface's `IFF_*` flags (`SIOCGIFFLAGS`).
    pub(crate) fn if_flags(&self, iface: &str) -> io::Result<libc::c_int> {
        let mut req = named_ifreq(iface)?;
        // SAFETY: SIOCGIFFLAGS reads `ifr_name` and writes `ifr_flags` of the `ifreq` we
        // own; the result is checked.
        check(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::SIOCGIFFLAGS as _,
                &mut req as *mut libc::ifreq,
            )
        })?;
        // SAFETY: the kernel filled the `ifru_flags` member of the union.
        Ok(libc::c_int::from(unsafe { req.ifr_ifru.ifru_flags }))
    }

    /// Whether the interface's link is up, as its driver says now (`ETHTOOL_GLINK`: the
    /// carrier, not the operational state the kernel derives from it up to a second
    /// later). `None` when the driver cannot say (`EOPNOTSUPP`) or the call failed.
    pub(crate) fn link_detected(&self, iface: &str) -> Option<bool> {
        /// `ETHTOOL_GLINK` of linux/ethtool.h.
        const ETHTOOL_GLINK: u32 = 0x0000_000a;
        /// `struct ethtool_value` of linux/ethtool.h.
        #[repr(C)]
        struct EthtoolValue {
            cmd: u32,
            data: u32,
        }
        let mut value = EthtoolValue {
            cmd: ETHTOOL_GLINK,
            data: 0,
        };
        let mut req = named_ifreq(iface).ok()?;
        req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        // SAFETY: SIOCETHTOOL with ETHTOOL_GLINK reads `ifr_name` and the command word at
        // `ifr_data`, and writes the `ethtool_value` there, which we own and which outlives
        // the call; the result is checked.
        check(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::SIOCETHTOOL as _,
                &mut req as *mut libc::ifreq,
            )
        })
        .ok()?;
        Some(value.data != 0)
    }

    /// The error pending on the socket, read and cleared (`SO_ERROR`): `ENETDOWN` once the
    /// bound interface went down or was removed. `None` when nothing is pending.
    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `err` and `len` are live and sized as the kernel expects for SO_ERROR.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
        Ok((err != 0).then(|| io::Error::from_raw_os_error(err)))
    }

    /// `PACKET_STATISTICS` since the last call (reading resets the kernel's counters).
    pub(crate) fn take_stats(&self) -> io::Result<libc::tpacket_stats_v3> {
        // SAFETY: plain old data; all-zero is a valid value.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: `st` and `len` are live and sized as the kernel expects for TPACKET_V3.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        })?;
        Ok(st)
    }

    /// Sends the first frames of `pkts` (up to 64) on the bound interface without
    /// blocking, in one `sendmmsg`; returns how many were sent (at least one), or the
    /// error of the first.
    pub(crate) fn send_batch(&self, pkts: &[PacketBuf]) -> io::Result<usize> {
        let n = pkts.len().min(SEND_CHUNK);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: plain old data; all-zero is a valid value (null pointers, zero lengths).
        let mut iov: [libc::iovec; SEND_CHUNK] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; SEND_CHUNK] = unsafe { std::mem::zeroed() };
        for (i, p) in pkts[..n].iter().enumerate() {
            let data = p.data();
            iov[i].iov_base = data.as_ptr() as *mut libc::c_void;
            iov[i].iov_len = data.len();
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at frames borrowed from
        // `pkts` for the duration of the call; the kernel only reads them (and writes
        // `msg_len`).
        let sent = check(unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        })?;
        Ok(sent as usize)
    }

    /// Waits up to `ms` milliseconds for room to send.
    pub(crate) fn wait_writable(&self, ms: libc::c_int) {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid `pollfd`; the result only tells whether to retry.
        let _ = unsafe { libc::poll(&mut pfd, 1, ms) };
    }

    /// Maps the receive ring set up by [`set_rx_ring`](Self::set_rx_ring).
    pub(crate) fn map_ring(&self, block_size: usize, block_nr: usize) -> io::Result<Ring> {
        let len = block_size * block_nr;
        // SAFETY: a fresh shared mapping of the socket's ring, of the size the ring was
        // requested with; the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED,
                self.fd.as_raw_fd(),
                0,
            )
        };
        let ptr = if ptr == libc::MAP_FAILED {
            // MAP_LOCKED needs RLIMIT_MEMLOCK room; without it, map unlocked.
            // SAFETY: as above, without MAP_LOCKED.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.fd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            p
        } else {
            ptr
        };
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Ring {
            base,
            block_size,
            block_nr,
        })
    }
}

/// What a TPACKET_V3 frame header says, checked against its block.
pub(crate) struct RingFrame<'a> {
    /// Offset of the next frame from this one (0: last of its block).
    pub(crate) next_offset: u32,
    /// Kernel receive time, ns since the Unix epoch.
    pub(crate) ts_ns: u64,
    /// Length on the wire.
    pub(crate) len: u32,
    /// The 802.1Q tag the kernel took out of the frame (`TP_STATUS_VLAN_VALID`):
    /// `(tpid, tci)`.
    pub(crate) vlan: Option<(u16, u16)>,
    /// The bytes captured (from the MAC header on; may be shorter than `len`).
    pub(crate) data: &'a [u8],
}

/// The TPACKET_V3 receive ring: `block_nr` blocks of `block_size` bytes shared with the
/// kernel. A block belongs to this process while its status has `TP_STATUS_USER`, until
/// [`release`](Self::release) hands it back.
pub(crate) struct Ring {
    base: NonNull<u8>,
    block_size: usize,
    block_nr: usize,
}

// SAFETY: the mapping is owned by this value alone (like a `Box<[u8]>`); the kernel's
// side is synchronised through the block status word, not through the thread that holds it.
unsafe impl Send for Ring {}

impl Ring {
    pub(crate) fn blocks(&self) -> usize {
        self.block_nr
    }

    fn block_ptr(&self, block: usize) -> *mut u8 {
        assert!(block < self.block_nr, "block index out of the ring");
        // SAFETY: `block < block_nr`, so the offset stays inside the mapping.
        unsafe { self.base.as_ptr().add(block * self.block_size) }
    }

    fn status_ptr(&self, block: usize) -> *mut u32 {
        let desc = self.block_ptr(block).cast::<libc::tpacket_block_desc>();
        // SAFETY: the block starts with a `tpacket_block_desc` (page aligned); taking a
        // field's address creates no reference.
        unsafe { std::ptr::addr_of_mut!((*desc).hdr.bh1.block_status) }
    }

    /// Whether the kernel handed block `block` to user space; if so its contents are
    /// visible (acquire) and stay put until [`release`](Self::release).
    pub(crate) fn ready(&self, block: usize) -> bool {
        // SAFETY: an aligned u32 inside the mapping; volatile because the kernel writes it.
        let status = unsafe { std::ptr::read_volatile(self.status_ptr(block)) };
        if status & libc::TP_STATUS_USER != 0 {
            fence(Ordering::Acquire);
            true
        } else {
            false
        }
    }

    /// `(num_pkts, offset_to_first_pkt)` of a block that is [`ready`](Self::ready).
    pub(crate) fn header(&self, block: usize) -> (u32, u32) {
        let desc = self.block_ptr(block).cast::<libc::tpacket_block_desc>();
        // SAFETY: the block is user-owned (ready), so the kernel does not write its
        // header; reads by value of plain integers.
        unsafe {
            (
                std::ptr::read_volatile(std::ptr::addr_of!((*desc).hdr.bh1.num_pkts)),
                std::ptr::read_volatile(std::ptr::addr_of!((*desc).hdr.bh1.offset_to_first_pkt)),
            )
        }
    }

    /// The frame at `offset` in a ready block, or `None` when its header or bytes would
    /// reach outside the block.
    pub(crate) fn frame(&self, block: usize, offset: usize) -> Option<RingFrame<'_>> {
        let hdr_len = std::mem::size_of::<libc::tpacket3_hdr>();
        if offset % 4 != 0 || offset.checked_add(hdr_len)? > self.block_size {
            return None;
        }
        // SAFETY: `offset + size_of::<tpacket3_hdr>()` lies inside the block (checked),
        // the offset is 4-aligned as the header's fields need, and the block is
        // user-owned while `self` is borrowed (release takes `&mut self`).
        let h: libc::tpacket3_hdr = unsafe {
            std::ptr::read_volatile(
                self.block_ptr(block)
                    .add(offset)
                    .cast::<libc::tpacket3_hdr>(),
            )
        };
        let start = offset.checked_add(usize::from(h.tp_mac))?;
        let end = start.checked_add(h.tp_snaplen as usize)?;
        if end > self.block_size {
            return None;
        }
        // SAFETY: `start..end` lies inside the block (checked); nothing writes it while
        // the block is user-owned, and the slice cannot outlive the shared borrow of
        // `self` that `release` would need exclusively.
        let data =
            unsafe { std::slice::from_raw_parts(self.block_ptr(block).add(start), end - start) };
        Some(RingFrame {
            next_offset: h.tp_next_offset,
            ts_ns: u64::from(h.tp_sec) * 1_000_000_000 + u64::from(h.tp_nsec),
            len: h.tp_len,
            vlan: (h.tp_status & libc::TP_STATUS_VLAN_VALID != 0).then(|| {
                let tpid = if h.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                    h.hv1.tp_vlan_tpid
                } else {
                    0x8100
                };
                (tpid, h.hv1.tp_vlan_tci as u16)
            }),
            data,
        })
    }

    /// Hands block `block` back to the kernel (release: our reads happen before).
    pub(crate) fn release(&mut self, block: usize) {
        fence(Ordering::Release);
        // SAFETY: an aligned u32 inside the mapping; volatile because the kernel reads it.
        unsafe { std::ptr::write_volatile(self.status_ptr(block), libc::TP_STATUS_KERNEL) };
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map_ring` made; no slice into it outlives
        // `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.block_size * self.block_nr);
        }
    }
}

/// The index of interface `name` in this network namespace.
pub(crate) fn if_index(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::ENODEV))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::SeqCst);
}

/// Installs a one-shot SIGINT and SIGTERM handler that sets a flag, and returns the flag.
pub(crate) fn stop_on_signals() -> io::Result<&'static AtomicBool> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: plain old data; all-zero is a valid value (empty mask, no flags).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // One-shot: a second SIGINT or SIGTERM takes the default action (ends the process).
        sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
        // SAFETY: `sa` is a valid action whose handler only stores to an atomic; the
        // previous action is not needed.
        check(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) })?;
    }
    Ok(&STOP)
}
