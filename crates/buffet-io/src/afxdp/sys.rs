//! The system calls of the AF_XDP port, each behind a safe function: the UMEM mapping,
//! the XDP socket (UMEM registration, ring sizes, ring mappings, bind, statistics, the
//! transmit kick), the four rings shared with the kernel, `bpf(2)` (XSKMAP, program
//! load, program info) and the rtnetlink requests that attach, query and detach an XDP
//! program on an interface.
//!
//! Nothing here decides anything: sizes, order of set-up, which program to load and
//! error wording are the caller's ([`super`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::buf::{FrameOwner, PacketBuf};

fn check(call_result: libc::c_int) -> io::Result<libc::c_int> {
    if call_result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(call_result)
    }
}

/// Takes ownership of a descriptor a system call just returned.
fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: callers pass a descriptor that was just returned by a successful system
    // call and is owned by nothing else.
    unsafe { OwnedFd::from_raw_fd(fd) }
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

/// The interface's `IFF_*` flags (`SIOCGIFFLAGS` on a throw-away UDP socket, which needs
/// no privilege).
pub(crate) fn if_flags(iface: &str) -> io::Result<libc::c_int> {
    // SAFETY: plain system call with constant arguments; the result is checked.
    let fd = owned(check(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?);
    let mut req = crate::sys::named_ifreq(iface)?;
    // SAFETY: SIOCGIFFLAGS reads `ifr_name` and writes `ifr_flags` of the `ifreq` we own.
    check(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SIOCGIFFLAGS as _,
            &mut req as *mut libc::ifreq,
        )
    })?;
    // SAFETY: the kernel filled the `ifru_flags` member of the union.
    Ok(libc::c_int::from(unsafe { req.ifr_ifru.ifru_flags }))
}

/// Whether process `pid` exists (`kill(pid, 0)`: EPERM means it exists but is not ours).
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The current wall-clock time in ns since the Unix epoch (`CLOCK_REALTIME`, the clock
/// AF_PACKET stamps frames with; a vDSO call, no system call).
pub(crate) fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The UMEM: `len` bytes of anonymous memory, split by the caller into frames that the
/// kernel and this process hand to each other through the rings.
pub(crate) struct Umem {
    base: NonNull<u8>,
    len: usize,
    /// Frames lent out as [`PacketBuf`]s may outlive the port: then the mapping is kept.
    keep_mapped: AtomicBool,
}

// SAFETY: the mapping is owned by this value alone (like a `Box<[u8]>`); frames lent out
// are exclusively owned by their `PacketBuf`s, and the kernel's side is synchronised
// through the rings, not through the thread that holds this value.
unsafe impl Send for Umem {}

// SAFETY: shared (`Arc`) between the port that owns the fill ring and the receivers of
// sockets sharing the UMEM: every access through `&Umem` touches one frame only, and a
// frame has one owner at a time (the kernel, the port's free list, or the one holder that
// read it off a ring), handed over through the rings' acquire/release indices or a
// channel between threads.
unsafe impl Sync for Umem {}

impl Umem {
    /// Maps `len` bytes (page-aligned, zeroed, populated now so the data path never
    /// faults them in).
    pub(crate) fn new(len: usize) -> io::Result<Umem> {
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Umem {
            base,
            len,
            keep_mapped: AtomicBool::new(false),
        })
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Keeps the memory mapped after this value is dropped (frames still lent out).
    pub(crate) fn keep_mapped(&self) {
        self.keep_mapped.store(true, Ordering::Relaxed);
    }

    /// Lends bytes `addr..addr + capacity` as a [`PacketBuf`] of `len` bytes owned by
    /// `owner`. The caller lends a frame only when the kernel handed it over (read from
    /// the receive ring) and not again until it came back; `None` if the range is
    /// outside the UMEM.
    pub(crate) fn lend(
        &self,
        addr: u64,
        capacity: usize,
        len: usize,
        owner: FrameOwner,
    ) -> Option<PacketBuf> {
        let start = usize::try_from(addr).ok()?;
        if start.checked_add(capacity)? > self.len || len > capacity {
            return None;
        }
        // SAFETY: `start < len` of the mapping (checked), so the pointer stays inside it.
        let ptr = unsafe { self.base.as_ptr().add(start) };
        let ptr = NonNull::new(ptr)?;
        // SAFETY: `capacity` bytes from `ptr` lie inside the mapping (checked), which
        // stays mapped while any frame is lent (`keep_mapped`); the frame belongs to this
        // process (the kernel handed it over) and the caller lends it once until it comes
        // back, so nothing else reads or writes it meanwhile.
        Some(unsafe { PacketBuf::from_port_frame(ptr, capacity, len, owner) })
    }

    /// Reads the (native-endian) u32 at `addr` of a frame the caller owns (the kernel
    /// handed it over and it is not lent); `None` outside the UMEM or unaligned.
    pub(crate) fn read_u32(&self, addr: u64) -> Option<u32> {
        let start = usize::try_from(addr).ok()?;
        if start.checked_add(4)? > self.len || start % 4 != 0 {
            return None;
        }
        // SAFETY: 4 bytes from `start` lie inside the mapping (checked) and are 4-byte
        // aligned (the mapping is page-aligned); the frame is the caller's, so nothing
        // writes it meanwhile.
        Some(unsafe { std::ptr::read_volatile(self.base.as_ptr().add(start).cast::<u32>()) })
    }

    /// Copies `data` into the frame at `addr` (a free frame, not lent and not in a
    /// ring); false if it does not fit inside the UMEM.
    pub(crate) fn write(&self, addr: u64, data: &[u8]) -> bool {
        let Ok(start) = usize::try_from(addr) else {
            return false;
        };
        match start.checked_add(data.len()) {
            Some(end) if end <= self.len => {}
            _ => return false,
        }
        // SAFETY: `start..start + data.len()` lies inside the mapping (checked); the frame
        // is free (the caller's contract), so neither the kernel, a `PacketBuf` nor another
        // thread accesses it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(start), data.len());
        }
        true
    }

    /// The UMEM address of `ptr`, if it points inside the UMEM.
    pub(crate) fn addr_of(&self, ptr: *const u8) -> Option<u64> {
        let off = (ptr as usize).checked_sub(self.base.as_ptr() as usize)?;
        (off < self.len).then_some(off as u64)
    }

    fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        if *self.keep_mapped.get_mut() {
            return;
        }
        // SAFETY: unmaps exactly the mapping `new` made; no frame of it is lent out
        // (otherwise `keep_mapped` is set) and the socket that used it is closed first.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// An entry of a ring shared with the kernel: a UMEM address (fill, completion) or a
/// descriptor (receive, transmit).
pub(crate) trait RingEntry: Copy {}
impl RingEntry for u64 {}
impl RingEntry for libc::xdp_desc {}

/// One of the four rings of an XDP socket, mapped into this process: a producer and a
/// consumer index (free-running u32, shared with the kernel) and `size` entries.
pub(crate) struct Ring<T: RingEntry> {
    map: NonNull<u8>,
    map_len: usize,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    entries: NonNull<T>,
    size: u32,
}

// SAFETY: the mapping is owned by this value alone; the kernel's side is synchronised
// through the atomic producer/consumer indices, not through the thread that holds it.
unsafe impl<T: RingEntry> Send for Ring<T> {}

impl<T: RingEntry> Ring<T> {
    /// The producer index.
    pub(crate) fn producer(&self) -> &AtomicU32 {
        // SAFETY: the kernel's offset for the producer index, inside the mapping, 4-byte
        // aligned; an `AtomicU32` has the layout of the u32 the kernel accesses atomically.
        unsafe { self.producer.as_ref() }
    }

    /// The consumer index.
    pub(crate) fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.consumer.as_ref() }
    }

    /// Entries in the ring (a power of two).
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Reads entry `index` (masked into the ring). The caller reads only entries it owns
    /// (between the consumer and an acquired producer index).
    pub(crate) fn read(&self, index: u32) -> T {
        let i = (index & (self.size - 1)) as usize;
        // SAFETY: `i < size`, so the entry lies inside the mapping (sized for `size`
        // entries); entries are plain data and read by value.
        unsafe { std::ptr::read_volatile(self.entries.as_ptr().add(i)) }
    }

    /// Writes entry `index` (masked into the ring). The caller writes only entries it
    /// owns (between its producer and the released consumer index).
    pub(crate) fn write(&mut self, index: u32, value: T) {
        let i = (index & (self.size - 1)) as usize;
        // SAFETY: `i < size`, so the entry lies inside the mapping; the kernel does not
        // read it before the producer index is released past it.
        unsafe { std::ptr::write_volatile(self.entries.as_ptr().add(i), value) }
    }
}

impl<T: RingEntry> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `XskSocket::map_ring` made; no reference into
        // it outlives `self`.
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.map_len);
        }
    }
}

/// Which ring to size or map.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RingKind {
    Fill,
    Completion,
    Rx,
    Tx,
}

impl RingKind {
    fn option(self) -> libc::c_int {
        match self {
            RingKind::Fill => libc::XDP_UMEM_FILL_RING,
            RingKind::Completion => libc::XDP_UMEM_COMPLETION_RING,
            RingKind::Rx => libc::XDP_RX_RING,
            RingKind::Tx => libc::XDP_TX_RING,
        }
    }

    fn page_offset(self) -> libc::off_t {
        match self {
            RingKind::Fill => libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
            RingKind::Completion => libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
            RingKind::Rx => libc::XDP_PGOFF_RX_RING,
            RingKind::Tx => libc::XDP_PGOFF_TX_RING,
        }
    }

    fn offsets(self, o: &libc::xdp_mmap_offsets) -> libc::xdp_ring_offset {
        match self {
            RingKind::Fill => o.fr,
            RingKind::Completion => o.cr,
            RingKind::Rx => o.rx,
            RingKind::Tx => o.tx,
        }
    }
}

/// An AF_XDP socket.
pub(crate) struct XskSocket {
    fd: OwnedFd,
}

impl XskSocket {
    /// `socket(AF_XDP, SOCK_RAW)`.
    pub(crate) fn open() -> io::Result<XskSocket> {
        // SAFETY: plain system call with constant arguments; the result is checked.
        let fd =
            check(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        Ok(XskSocket { fd: owned(fd) })
    }

    /// The descriptor (for an XSKMAP entry).
    pub(crate) fn borrowed(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn setsockopt<T>(&self, name: libc::c_int, value: &T) -> io::Result<()> {
        // SAFETY: `value` points to a live `T` of the size passed; the kernel only reads it.
        check(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                name,
                (value as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    fn getsockopt<T: Copy>(&self, name: libc::c_int, init: T) -> io::Result<T> {
        self.getsockopt_len(name, init).map(|(v, _)| v)
    }

    /// As `getsockopt`, with the number of bytes the kernel wrote (a kernel older than
    /// `T` fills only the part of it that it knows).
    fn getsockopt_len<T: Copy>(&self, name: libc::c_int, init: T) -> io::Result<(T, usize)> {
        let mut v = init;
        let mut len = std::mem::size_of::<T>() as libc::socklen_t;
        // SAFETY: `v` and `len` are live and sized as passed; the kernel writes at most
        // `len` bytes of plain data and sets `len` to what it wrote.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                name,
                (&mut v as *mut T).cast(),
                &mut len,
            )
        })?;
        Ok((v, len as usize))
    }

    /// Registers `umem` split into `chunk_size`-byte frames (`XDP_UMEM_REG`).
    pub(crate) fn register_umem(&self, umem: &Umem, chunk_size: u32) -> io::Result<()> {
        let reg = libc::xdp_umem_reg {
            addr: umem.as_ptr() as u64,
            len: umem.len() as u64,
            chunk_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        self.setsockopt(libc::XDP_UMEM_REG, &reg)
    }

    /// Sets the number of entries of one ring.
    pub(crate) fn set_ring_size(&self, kind: RingKind, entries: u32) -> io::Result<()> {
        self.setsockopt(kind.option(), &entries)
    }

    /// Maps one ring (sized before) into this process.
    pub(crate) fn map_ring<T: RingEntry>(&self, kind: RingKind, size: u32) -> io::Result<Ring<T>> {
        // SAFETY: plain old data; all-zero is a valid value.
        let zero: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let off = kind.offsets(&self.getsockopt(libc::XDP_MMAP_OFFSETS, zero)?);
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring at the kernel's page offset
        // for it, of the size the ring was given; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.fd.as_raw_fd(),
                kind.page_offset(),
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        let at = |o: u64| -> io::Result<NonNull<u8>> {
            if o as usize >= len {
                return Err(io::Error::other("ring offset outside its mapping"));
            }
            // SAFETY: `o < len` (checked), so the pointer stays inside the mapping.
            NonNull::new(unsafe { map.as_ptr().add(o as usize) })
                .ok_or_else(|| io::Error::other("mmap: null"))
        };
        let ring = Ring {
            producer: at(off.producer)?.cast(),
            consumer: at(off.consumer)?.cast(),
            entries: at(off.desc)?.cast(),
            map,
            map_len: len,
            size,
        };
        Ok(ring)
    }

    /// Binds to queue `queue` of interface `ifindex` with `XDP_*` bind `flags`.
    pub(crate) fn bind(&self, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `addr` is a valid `sockaddr_xdp` of the size passed.
        check(unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// Binds to the same queue of the same interface as `owner`, sharing its UMEM and
    /// its fill and completion rings (`XDP_SHARED_UMEM`); this socket has no UMEM, fill
    /// or completion ring of its own.
    pub(crate) fn bind_shared(
        &self,
        ifindex: u32,
        queue: u32,
        owner: &XskSocket,
    ) -> io::Result<()> {
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_SHARED_UMEM,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: owner.fd.as_raw_fd() as u32,
        };
        // SAFETY: `addr` is a valid `sockaddr_xdp` of the size passed.
        check(unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// Whether the bound socket runs in zero-copy mode (`XDP_OPTIONS`).
    pub(crate) fn zero_copy(&self) -> io::Result<bool> {
        let o = self.getsockopt(libc::XDP_OPTIONS, libc::xdp_options { flags: 0 })?;
        Ok(o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
    }

    /// The kernel's counters for this socket and whether the kernel filled the whole
    /// struct (Linux 5.9 and later: `rx_ring_full`, `rx_fill_ring_empty_descs`,
    /// `tx_ring_empty_descs` after the first three) or only its first version
    /// (`rx_dropped`, `rx_invalid_descs`, `tx_invalid_descs`; the rest stays zero).
    pub(crate) fn statistics_versioned(&self) -> io::Result<(libc::xdp_statistics, bool)> {
        // SAFETY: plain old data; all-zero is a valid value.
        let zero: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let (s, len) = self.getsockopt_len(libc::XDP_STATISTICS, zero)?;
        if len < std::mem::size_of::<libc::xdp_statistics_v1>() {
            return Err(io::Error::other(format!(
                "getsockopt(XDP_STATISTICS) returned {len} bytes, less than its first version"
            )));
        }
        Ok((s, len >= std::mem::size_of::<libc::xdp_statistics>()))
    }

    /// Tells the kernel that the transmit ring has new descriptors (copy mode sends only
    /// from this call). Never blocks.
    pub(crate) fn kick_tx(&self) -> io::Result<()> {
        // SAFETY: a zero-length send with no buffer: the kernel reads nothing from us.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

// ---- bpf(2) ----

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;

/// `union bpf_attr`, as bytes (the kernel wants unused bytes zero).
struct BpfAttr([u8; 128]);

impl BpfAttr {
    fn new() -> BpfAttr {
        BpfAttr([0; 128])
    }
    fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, at: usize, name: &str) -> &mut Self {
        let n = name.len().min(15);
        self.0[at..at + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }
}

fn bpf(cmd: libc::c_int, attr: &mut BpfAttr) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a live, zero-padded 128-byte `bpf_attr` for `cmd`; any pointers
    // in it were set by the caller to buffers that outlive this call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            attr.0.len() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as libc::c_int)
    }
}

/// A new XSKMAP (u32 queue index -> XDP socket) of `entries` entries named `name`.
pub(crate) fn create_xskmap(entries: u32, name: &str) -> io::Result<OwnedFd> {
    let mut a = BpfAttr::new();
    a.u32(0, BPF_MAP_TYPE_XSKMAP)
        .u32(4, 4)
        .u32(8, 4)
        .u32(12, entries)
        .name(28, name);
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// `map[key] = value` for a map of u32 keys and u32 values.
pub(crate) fn map_update_u32(map: &OwnedFd, key: u32, value: u32) -> io::Result<()> {
    let (k, v) = (key, value);
    let mut a = BpfAttr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, &k as *const u32 as u64)
        .u64(16, &v as *const u32 as u64);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

/// Loads an XDP program of `insns` (raw 8-byte instructions) named `name` under
/// `license`. On failure, the verifier's log comes with the error.
pub(crate) fn load_xdp(
    insns: &[u64],
    name: &str,
    license: &str,
) -> Result<OwnedFd, (io::Error, String)> {
    let license = CString::new(license)
        .map_err(|_| (io::Error::from_raw_os_error(libc::EINVAL), String::new()))?;
    let mut log = vec![0u8; 64 * 1024];
    let mut a = BpfAttr::new();
    a.u32(0, BPF_PROG_TYPE_XDP)
        .u32(4, insns.len() as u32)
        .u64(8, insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .u32(24, 1)
        .u32(28, log.len() as u32)
        .u64(32, log.as_mut_ptr() as u64)
        .name(48, name);
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(owned(fd)),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).into_owned()))
        }
    }
}

/// A descriptor of BPF program `id` (`BPF_PROG_GET_FD_BY_ID`: needs CAP_SYS_ADMIN).
pub(crate) fn prog_fd(id: u32) -> io::Result<OwnedFd> {
    let mut a = BpfAttr::new();
    a.u32(0, id);
    Ok(owned(bpf(BPF_PROG_GET_FD_BY_ID, &mut a)?))
}

/// The name of the BPF program behind `fd` (as the kernel keeps it: at most 15 bytes).
pub(crate) fn prog_name_of(fd: &OwnedFd) -> io::Result<String> {
    // `struct bpf_prog_info` up to and including `name[16]` at offset 64.
    let mut info = [0u8; 80];
    let mut a = BpfAttr::new();
    a.u32(0, fd.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let name = &info[64..80];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

// ---- rtnetlink: XDP attach, query, detach ----

/// A NETLINK_ROUTE socket for one request and its answer.
struct Netlink {
    fd: OwnedFd,
}

impl Netlink {
    fn open() -> io::Result<Netlink> {
        // SAFETY: plain system call with constant arguments; the result is checked.
        let fd = check(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        })?;
        Ok(Netlink { fd: owned(fd) })
    }

    /// Sends `msg` and reads answers into `buf` until one for `seq` arrives; returns its
    /// length.
    fn request(&self, msg: &[u8], seq: u32, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `sockaddr_nl` is plain old data; all-zero (then the family) addresses
        // the kernel.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `msg` and `kernel` are live for the call and sized as passed.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            // SAFETY: `buf` is live and writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            if n >= 16 && u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]) == seq {
                return Ok(n);
            }
        }
    }
}

const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const IFLA_XDP: u16 = 43;
const NLA_F_NESTED: u16 = 1 << 15;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_EXPECTED_FD: u16 = 8;

fn nl_header(msg: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, ifindex: u32) {
    msg.extend_from_slice(&0u32.to_ne_bytes()); // length, set at the end
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    // struct ifinfomsg: family, pad, type, index, flags, change.
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    msg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
}

fn nl_attr_u32(msg: &mut Vec<u8>, kind: u16, v: u32) {
    msg.extend_from_slice(&8u16.to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&v.to_ne_bytes());
}

fn nl_finish(msg: &mut [u8]) {
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());
}

/// The error an `NLMSG_ERROR` answer carries (0: acknowledged).
fn nl_ack(buf: &[u8]) -> io::Result<()> {
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    if kind != NLMSG_ERROR || buf.len() < 20 {
        return Err(io::Error::other("rtnetlink: unexpected answer"));
    }
    let err = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
    if err == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-err))
    }
}

static SEQ: AtomicU32 = AtomicU32::new(1);

fn next_seq() -> u32 {
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Attaches program `fd` (or, with `fd = -1`, detaches) on `ifindex` with `XDP_FLAGS_*`
/// `flags`; with `expected`, only if that program is the one attached now
/// (`XDP_FLAGS_REPLACE`).
pub(crate) fn xdp_set(
    ifindex: u32,
    fd: RawFd,
    flags: u32,
    expected: Option<RawFd>,
) -> io::Result<()> {
    let nl = Netlink::open()?;
    let seq = next_seq();
    let mut msg = Vec::with_capacity(64);
    nl_header(
        &mut msg,
        RTM_SETLINK,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        ifindex,
    );
    let nested = 4 + 8 + 8 + if expected.is_some() { 8 } else { 0 };
    msg.extend_from_slice(&(nested as u16).to_ne_bytes());
    msg.extend_from_slice(&(IFLA_XDP | NLA_F_NESTED).to_ne_bytes());
    nl_attr_u32(&mut msg, IFLA_XDP_FD, fd as u32);
    nl_attr_u32(&mut msg, IFLA_XDP_FLAGS, flags);
    if let Some(e) = expected {
        nl_attr_u32(&mut msg, IFLA_XDP_EXPECTED_FD, e as u32);
    }
    nl_finish(&mut msg);
    let mut buf = vec![0u8; 8192];
    let n = nl.request(&msg, seq, &mut buf)?;
    nl_ack(&buf[..n])
}

/// The XDP program attached to `ifindex`: `(program id, IFLA_XDP_ATTACHED mode)`, or
/// `None`.
pub(crate) fn xdp_query(ifindex: u32) -> io::Result<Option<(u32, u8)>> {
    let nl = Netlink::open()?;
    let seq = next_seq();
    let mut msg = Vec::with_capacity(32);
    nl_header(&mut msg, RTM_GETLINK, NLM_F_REQUEST, seq, ifindex);
    nl_finish(&mut msg);
    let mut buf = vec![0u8; 64 * 1024];
    let n = nl.request(&msg, seq, &mut buf)?;
    let buf = &buf[..n];
    if u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        nl_ack(buf)?;
        return Ok(None);
    }
    let len = (u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize).min(buf.len());
    let (mut attached, mut id) = (0u8, 0u32);
    for (kind, value) in attrs(buf.get(32..len).unwrap_or(&[])) {
        if kind & 0x3fff != IFLA_XDP {
            continue;
        }
        for (k, v) in attrs(value) {
            match k & 0x3fff {
                IFLA_XDP_ATTACHED if !v.is_empty() => attached = v[0],
                IFLA_XDP_PROG_ID if v.len() >= 4 => {
                    id = u32::from_ne_bytes([v[0], v[1], v[2], v[3]])
                }
                _ => {}
            }
        }
    }
    Ok((attached != 0 && id != 0).then_some((id, attached)))
}

/// The `(type, value)` netlink attributes in `b`, stopping at the first malformed one.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]);
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((kind, value))
    })
}
