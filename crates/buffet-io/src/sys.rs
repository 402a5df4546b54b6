//! The one place buffet-io touches raw memory: frames that live in a port's own memory
//! (AF_XDP UMEM, DPDK mbufs) viewed as byte slices, waiting on descriptors, and the
//! `ifreq` the ports' interface ioctls share.

use std::ptr::NonNull;

use crate::buf::{FrameOwner, PacketBuf};

/// A frame in a port's memory, exclusively lent to one [`PacketBuf`].
pub(crate) struct PortFrame {
    ptr: NonNull<u8>,
    capacity: usize,
    owner: FrameOwner,
}

// SAFETY: a `PortFrame` is the only handle to its bytes (the contract of `new`), so moving
// it to another thread moves exclusive access, as moving a `Box<[u8]>` does.
unsafe impl Send for PortFrame {}

impl PortFrame {
    /// # Safety
    /// `ptr` points to `capacity` bytes valid for reads and writes, which nothing else
    /// accesses until this frame is dropped or handed back to `owner.port`.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, capacity: usize, owner: FrameOwner) -> Self {
        PortFrame {
            ptr,
            capacity,
            owner,
        }
    }

    pub(crate) fn owner(&self) -> FrameOwner {
        self.owner
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `new`'s contract: `capacity` valid bytes, accessed through this frame only;
        // the shared borrow of `self` keeps `bytes_mut` away meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the exclusive borrow of `self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }
}

impl PacketBuf {
    /// Wraps a frame that lives in a port's own memory, without copying it; `len` bytes
    /// of it are the frame (clamped to `capacity`).
    ///
    /// # Safety
    /// `ptr` must point to `capacity` bytes that are valid for reads and writes and that
    /// nothing else reads or writes (no other `PacketBuf`, no device, no kernel ring)
    /// until this `PacketBuf` is dropped or handed back to `owner.port` — the port keeps
    /// the memory mapped at least that long.
    pub unsafe fn from_port_frame(
        ptr: NonNull<u8>,
        capacity: usize,
        len: usize,
        owner: FrameOwner,
    ) -> PacketBuf {
        // SAFETY: the caller's contract is exactly `PortFrame::new`'s.
        let frame = unsafe { PortFrame::new(ptr, capacity, owner) };
        PacketBuf::over_port_frame(frame, len)
    }
}

/// How many descriptors [`poll_readable`] watches at most.
pub(crate) const MAX_POLL_FDS: usize = 256;

/// `poll(2)` for `POLLIN` on the first [`MAX_POLL_FDS`] of `fds`, at most `timeout`
/// (`ppoll` takes it in nanoseconds; the timer's slack may add a little): whether one is
/// readable or reports an error condition (`POLLERR`), and the first that reports one. An
/// empty `fds` just sleeps.
pub(crate) fn poll_readable(
    fds: &[std::os::fd::RawFd],
    timeout: std::time::Duration,
) -> crate::port::Ready {
    const MAX: usize = MAX_POLL_FDS;
    let mut set = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX];
    let n = fds.len().min(MAX);
    for (p, &fd) in set.iter_mut().zip(fds) {
        *p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64 / 1000) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `set` holds `n` (at most MAX) initialised `pollfd`s the kernel may write
    // `revents` into; `ts` is a valid timespec read by the kernel; no signal mask is
    // passed (null). The result is read as a count or an error, and `revents` of the
    // first `n` entries, which the kernel wrote, once it returns.
    let r = unsafe { libc::ppoll(set.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    crate::port::Ready {
        woken: r > 0,
        failed: if r > 0 {
            set[..n]
                .iter()
                .find(|p| p.revents & libc::POLLERR != 0)
                .map(|p| p.fd)
        } else {
            None
        },
    }
}

/// An all-zero `ifreq` naming `iface` (`ENODEV` when the name does not fit), for the
/// interface ioctls.
pub(crate) fn named_ifreq(iface: &str) -> std::io::Result<libc::ifreq> {
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = iface.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return Err(std::io::Error::from_raw_os_error(libc::ENODEV));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}
