//! The DPDK port's only `unsafe`: the calls into DPDK (through the C shim `shim.c`,
//! which build.rs compiles against the installed headers) and the mbufs it hands out.
//!
//! Everything here is a safe function or type over those calls: an EAL that cleans up
//! when dropped ([`Eal`]), an mbuf pool ([`Pool`]), an owned mbuf that goes back to its
//! pool when dropped ([`Mbuf`]), and a burst array for receive and transmit ([`Burst`]).
//! No DPDK structure layout is known on this side: the shim reads and writes mbuf fields.

use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr::NonNull;

use buffet_sdk::PortId;

use crate::buf::{FrameOwner, PacketBuf};

/// `struct rte_mempool`, opaque.
#[repr(C)]
pub(super) struct RteMempool {
    _private: [u8; 0],
}

/// `struct rte_mbuf`, opaque.
#[repr(C)]
pub(super) struct RteMbuf {
    _private: [u8; 0],
}

extern "C" {
    fn buffet_dpdk_eal_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn buffet_dpdk_eal_cleanup() -> c_int;
    fn buffet_dpdk_errno() -> c_int;
    fn buffet_dpdk_strerror(err: c_int) -> *const c_char;
    fn buffet_dpdk_port_count() -> u16;
    fn buffet_dpdk_first_port() -> c_int;
    fn buffet_dpdk_port_by_name(name: *const c_char) -> c_int;
    fn buffet_dpdk_port_name(port: u16, name: *mut c_char, len: usize) -> c_int;
    fn buffet_dpdk_socket_id(port: u16) -> c_int;
    fn buffet_dpdk_pool_create(
        name: *const c_char,
        n: u32,
        cache: u32,
        data_room: u16,
        socket: c_int,
    ) -> *mut RteMempool;
    fn buffet_dpdk_pool_free(pool: *mut RteMempool);
    fn buffet_dpdk_configure(
        port: u16,
        rxq: u16,
        txq: u16,
        nb_rxd: *mut u16,
        nb_txd: *mut u16,
    ) -> c_int;
    fn buffet_dpdk_rx_queue_setup(
        port: u16,
        queue: u16,
        nb_desc: u16,
        socket: c_int,
        pool: *mut RteMempool,
    ) -> c_int;
    fn buffet_dpdk_tx_queue_setup(port: u16, queue: u16, nb_desc: u16, socket: c_int) -> c_int;
    fn buffet_dpdk_start(port: u16) -> c_int;
    fn buffet_dpdk_promiscuous_enable(port: u16) -> c_int;
    fn buffet_dpdk_stop(port: u16) -> c_int;
    fn buffet_dpdk_close(port: u16) -> c_int;
    fn buffet_dpdk_stats(port: u16, out: *mut u64) -> c_int;
    fn buffet_dpdk_rx_burst(port: u16, queue: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    fn buffet_dpdk_tx_burst(port: u16, queue: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    fn buffet_dpdk_mbuf_alloc(pool: *mut RteMempool) -> *mut RteMbuf;
    fn buffet_dpdk_mbuf_free(m: *mut RteMbuf);
    fn buffet_dpdk_mbuf_view(
        m: *const RteMbuf,
        data_len: *mut u32,
        room: *mut u32,
        segs: *mut u32,
    ) -> *mut u8;
    fn buffet_dpdk_mbuf_set_len(m: *mut RteMbuf, len: u32) -> c_int;
}

/// DPDK's `rte_errno` (the reason of the last failed call on this thread).
pub(super) fn errno() -> i32 {
    // SAFETY: reads a thread-local integer; no arguments.
    unsafe { buffet_dpdk_errno() }
}

/// DPDK's text for an error number (its own codes and the C library's).
pub(super) fn strerror(err: i32) -> String {
    // SAFETY: `rte_strerror` returns a pointer to a NUL-terminated string, static or in
    // a thread-local buffer that stays valid until the next call on this thread; it is
    // copied out at once.
    unsafe {
        let s = buffet_dpdk_strerror(err);
        if s.is_null() {
            return format!("error {err}");
        }
        CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// An initialised EAL: [`Eal::init`] runs `rte_eal_init`, dropping it runs
/// `rte_eal_cleanup`. The caller makes sure `init` runs at most once per process.
pub(super) struct Eal {
    _private: (),
}

impl Eal {
    /// `rte_eal_init` with `args` (the first one is the program name); the `rte_errno`
    /// on failure. The strings are kept for the life of the process: the EAL may keep
    /// pointers into its argument vector.
    pub(super) fn init(args: Vec<CString>) -> Result<Eal, i32> {
        let mut argv: Vec<*mut c_char> = args.into_iter().map(CString::into_raw).collect();
        let argc = c_int::try_from(argv.len()).map_err(|_| libc::E2BIG)?;
        argv.push(std::ptr::null_mut());
        let argv = argv.leak();
        // SAFETY: `argv` holds `argc` pointers to NUL-terminated strings and a final
        // null, all leaked (valid for the rest of the process), so the EAL may reorder
        // them and keep pointers into them.
        let rc = unsafe { buffet_dpdk_eal_init(argc, argv.as_mut_ptr()) };
        if rc < 0 {
            Err(errno())
        } else {
            Ok(Eal { _private: () })
        }
    }

    /// Leaves the EAL up for the rest of the process (memory is still lent out).
    pub(super) fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // SAFETY: the EAL was initialised (an `Eal` exists only after a successful init)
        // and is cleaned up once (this value is not `Clone`); its owner has closed its
        // port and freed its pool first.
        unsafe {
            buffet_dpdk_eal_cleanup();
        }
    }
}

/// Ports DPDK found (`rte_eth_dev_count_avail`).
pub(super) fn port_count(_eal: &Eal) -> u16 {
    // SAFETY: no arguments; the EAL is up (`_eal`).
    unsafe { buffet_dpdk_port_count() }
}

/// The first available port.
pub(super) fn first_port(_eal: &Eal) -> Option<u16> {
    // SAFETY: no arguments; the EAL is up (`_eal`).
    let rc = unsafe { buffet_dpdk_first_port() };
    u16::try_from(rc).ok()
}

/// The port of the device called `name` (`net_af_packet0`).
pub(super) fn port_by_name(_eal: &Eal, name: &CStr) -> Option<u16> {
    // SAFETY: `name` is NUL-terminated and outlives the call; the EAL is up.
    let rc = unsafe { buffet_dpdk_port_by_name(name.as_ptr()) };
    u16::try_from(rc).ok()
}

/// The device name of `port`.
pub(super) fn port_name(port: u16) -> Option<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: `buf` is writable for its length, which is passed; the shim writes at most
    // that many bytes, NUL included.
    let rc = unsafe { buffet_dpdk_port_name(port, buf.as_mut_ptr(), buf.len()) };
    if rc < 0 {
        return None;
    }
    // SAFETY: on success the shim NUL-terminated `buf`.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// The NUMA socket of `port` (negative: unknown, any socket).
pub(super) fn socket_id(port: u16) -> i32 {
    // SAFETY: plain integer argument; DPDK checks the port id.
    unsafe { buffet_dpdk_socket_id(port) }
}

/// Turns a DPDK return code (0 or a negative errno) into a result.
fn check(rc: c_int) -> Result<(), i32> {
    if rc < 0 {
        Err(-rc)
    } else {
        Ok(())
    }
}

/// Configures `port` with one receive and one transmit queue and no offloads; adjusts
/// the descriptor counts to what the device accepts.
pub(super) fn configure(port: u16, nb_rxd: &mut u16, nb_txd: &mut u16) -> Result<(), i32> {
    // SAFETY: the two counts are valid, writable `u16`s for the duration of the call.
    check(unsafe { buffet_dpdk_configure(port, 1, 1, nb_rxd, nb_txd) })
}

/// Sets up receive queue 0 of `port`, filled from `pool`.
pub(super) fn rx_queue_setup(port: u16, nb_desc: u16, socket: i32, pool: &Pool) -> Result<(), i32> {
    // SAFETY: `pool` is a live mempool; the caller keeps it until the port is closed
    // (the port owns both and closes the device first).
    check(unsafe { buffet_dpdk_rx_queue_setup(port, 0, nb_desc, socket, pool.ptr.as_ptr()) })
}

/// Sets up transmit queue 0 of `port`.
pub(super) fn tx_queue_setup(port: u16, nb_desc: u16, socket: i32) -> Result<(), i32> {
    // SAFETY: integer arguments; DPDK checks the port's state.
    check(unsafe { buffet_dpdk_tx_queue_setup(port, 0, nb_desc, socket) })
}

/// `rte_eth_dev_start`.
pub(super) fn start(port: u16) -> Result<(), i32> {
    // SAFETY: integer argument; DPDK checks the port's state.
    check(unsafe { buffet_dpdk_start(port) })
}

/// `rte_eth_promiscuous_enable`.
pub(super) fn promiscuous_enable(port: u16) -> Result<(), i32> {
    // SAFETY: integer argument; DPDK checks the port's state.
    check(unsafe { buffet_dpdk_promiscuous_enable(port) })
}

/// `rte_eth_dev_stop`.
pub(super) fn stop(port: u16) -> Result<(), i32> {
    // SAFETY: integer argument; DPDK checks the port's state.
    check(unsafe { buffet_dpdk_stop(port) })
}

/// `rte_eth_dev_close`: frees the queues and the mbufs they hold.
pub(super) fn close(port: u16) -> Result<(), i32> {
    // SAFETY: integer argument; the caller no longer uses the port's queues.
    check(unsafe { buffet_dpdk_close(port) })
}

/// The device's counters, in this order: ipackets, opackets, imissed, ierrors,
/// oerrors, rx_nombuf.
pub(super) fn stats(port: u16) -> Option<[u64; 6]> {
    let mut out = [0u64; 6];
    // SAFETY: `out` has the six writable `u64`s the shim fills.
    let rc = unsafe { buffet_dpdk_stats(port, out.as_mut_ptr()) };
    (rc >= 0).then_some(out)
}

/// A packet mbuf pool (`rte_pktmbuf_pool_create`), freed when dropped.
pub(super) struct Pool {
    ptr: NonNull<RteMempool>,
}

// SAFETY: a mempool is made for use from any thread (its default ring is multi-producer,
// multi-consumer); the handle is only a pointer to it.
unsafe impl Send for Pool {}

impl Pool {
    /// `n` mbufs of `data_room` bytes (headroom included), with a per-lcore cache of
    /// `cache`, on NUMA socket `socket`; the `rte_errno` on failure.
    pub(super) fn create(
        _eal: &Eal,
        name: &CStr,
        n: u32,
        cache: u32,
        data_room: u16,
        socket: i32,
    ) -> Result<Pool, i32> {
        // SAFETY: `name` is NUL-terminated and outlives the call (DPDK copies it); the
        // EAL is up (`_eal`).
        let ptr = unsafe { buffet_dpdk_pool_create(name.as_ptr(), n, cache, data_room, socket) };
        NonNull::new(ptr).map(|ptr| Pool { ptr }).ok_or_else(errno)
    }

    /// An empty mbuf, `None` when the pool has none free.
    pub(super) fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is live (`self`).
        NonNull::new(unsafe { buffet_dpdk_mbuf_alloc(self.ptr.as_ptr()) }).map(Mbuf)
    }

    /// Keeps the pool for the rest of the process (mbufs of it are still lent out).
    pub(super) fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: the pool is live and freed once; its owner drops it only after closing
        // the device that received into it and when none of its mbufs is lent out.
        unsafe { buffet_dpdk_pool_free(self.ptr.as_ptr()) }
    }
}

/// What [`Mbuf::view`] sees.
#[derive(Clone, Copy, Debug)]
pub(super) struct View {
    /// Bytes of data in the first segment.
    pub(super) len: usize,
    /// Bytes from the start of the data to the end of the data room.
    pub(super) room: usize,
    /// Segments in the chain.
    pub(super) segs: u32,
}

/// One mbuf this side owns; freed back to its pool when dropped.
#[repr(transparent)]
pub(super) struct Mbuf(NonNull<RteMbuf>);

// SAFETY: an `Mbuf` is the only handle to its mbuf (it came from a receive burst or an
// allocation, or back from the `PacketBuf` it was lent as), and freeing it from any
// thread is safe (the pool is multi-producer, multi-consumer).
unsafe impl Send for Mbuf {}

impl Mbuf {
    fn raw_view(&self) -> (NonNull<u8>, View) {
        let (mut len, mut room, mut segs) = (0u32, 0u32, 0u32);
        // SAFETY: `self.0` is a valid mbuf this value owns; the three outputs are
        // writable `u32`s.
        let data =
            unsafe { buffet_dpdk_mbuf_view(self.0.as_ptr(), &mut len, &mut room, &mut segs) };
        let view = View {
            len: len as usize,
            room: room as usize,
            segs,
        };
        (NonNull::new(data).unwrap_or(NonNull::dangling()), view)
    }

    /// Its length, room and segments.
    pub(super) fn view(&self) -> View {
        self.raw_view().1
    }

    /// Makes it a single segment of `len` bytes; false when that does not fit.
    pub(super) fn set_len(&mut self, len: usize) -> bool {
        let Ok(len) = u32::try_from(len) else {
            return false;
        };
        // SAFETY: `self.0` is a valid mbuf this value owns.
        unsafe { buffet_dpdk_mbuf_set_len(self.0.as_ptr(), len) == 0 }
    }

    /// Copies `frame` in as its only segment; false (nothing copied) when it does not
    /// fit.
    pub(super) fn write(&mut self, frame: &[u8]) -> bool {
        if !self.set_len(frame.len()) {
            return false;
        }
        let (data, v) = self.raw_view();
        if v.len != frame.len() || v.room < frame.len() {
            return false;
        }
        // SAFETY: `data` points to `v.room >= frame.len()` writable bytes of the mbuf's
        // data room, which this value owns exclusively; `frame` is another allocation.
        unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), data.as_ptr(), frame.len()) };
        true
    }

    /// Lends the mbuf's data room as a port-owned [`PacketBuf`] (no copy): its frame is
    /// the first segment's data, its capacity the room after it, and
    /// `FrameOwner::frame` the mbuf's address, by which [`Mbuf::reclaim`] takes it back.
    pub(super) fn lend(self, port: PortId) -> PacketBuf {
        let (data, v) = self.raw_view();
        let owner = FrameOwner {
            port,
            frame: self.0.as_ptr() as usize as u64,
        };
        std::mem::forget(self);
        // SAFETY: `data` points to `v.room` bytes of the mbuf's data room, valid for
        // reads and writes while the mbuf is not freed; ownership of the mbuf moves into
        // the `PacketBuf` (this handle is forgotten), and DPDK does not touch an mbuf the
        // application holds. It comes back through `reclaim` (by `port`, which keeps the
        // pool alive while any is lent).
        unsafe { PacketBuf::from_port_frame(data, v.room, v.len, owner) }
    }

    /// Takes back an mbuf lent by [`Mbuf::lend`] for port `port`; `None` for any other
    /// buffer (a heap frame, another port's frame).
    pub(super) fn reclaim(buf: PacketBuf, port: PortId) -> Option<Mbuf> {
        let owner = buf.owner().filter(|o| o.port == port)?;
        drop(buf);
        let ptr = NonNull::new(owner.frame as usize as *mut RteMbuf)?;
        // Only `lend` makes port frames owned by a DPDK port's id: `from_port_frame`'s
        // contract has its caller name the port whose memory the frame is, and this port
        // lends nothing else. So `ptr` is the mbuf `lend` gave away, and the `PacketBuf`
        // (its only user) is gone.
        Some(Mbuf(ptr))
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: this value owns the mbuf (see the `Send` impl) and frees it once.
        unsafe { buffet_dpdk_mbuf_free(self.0.as_ptr()) }
    }
}

/// The pointer array of one queue's bursts.
pub(super) struct Burst {
    ptrs: Box<[*mut RteMbuf]>,
    got: usize,
}

// SAFETY: the array holds mbufs received by its owner and not yet taken (owned, like an
// `Mbuf`), or nulls; moving it moves that ownership.
unsafe impl Send for Burst {}

impl Burst {
    /// An array for bursts of up to `n` mbufs (allocated once).
    pub(super) fn new(n: usize) -> Burst {
        Burst {
            ptrs: vec![std::ptr::null_mut(); n.clamp(1, usize::from(u16::MAX))].into_boxed_slice(),
            got: 0,
        }
    }

    /// Most mbufs per burst.
    pub(super) fn capacity(&self) -> usize {
        self.ptrs.len()
    }

    /// Receives up to `max` mbufs from queue 0 of `port`; take them with
    /// [`Burst::take`]. Mbufs of the previous burst not taken are freed first.
    pub(super) fn rx(&mut self, port: u16, max: usize) -> usize {
        for _ in self.take() {}
        let n = max.min(self.ptrs.len()) as u16;
        // SAFETY: `ptrs` has room for `n` pointers, which the driver writes; the queue is
        // used from this one owner only (`&mut self` of the port).
        let k = unsafe { buffet_dpdk_rx_burst(port, 0, self.ptrs.as_mut_ptr(), n) };
        self.got = usize::from(k).min(self.ptrs.len());
        self.got
    }

    /// The mbufs of the last [`Burst::rx`], each once.
    pub(super) fn take(&mut self) -> impl Iterator<Item = Mbuf> + '_ {
        let got = std::mem::take(&mut self.got);
        self.ptrs[..got]
            .iter_mut()
            .filter_map(|p| NonNull::new(std::mem::replace(p, std::ptr::null_mut())).map(Mbuf))
    }

    /// Sends `mbufs` on queue 0 of `port` from the front: those the driver took leave
    /// the vector (they are the device's now), the rest stay in it. Returns how many
    /// were taken.
    pub(super) fn tx(port: u16, mbufs: &mut Vec<Mbuf>) -> usize {
        let n = mbufs.len().min(usize::from(u16::MAX)) as u16;
        // SAFETY: `Mbuf` is a transparent `NonNull<RteMbuf>`, so the vector's buffer is
        // `n` valid mbuf pointers; the driver takes ownership of the first `k` it returns
        // and leaves the rest to us.
        let k = unsafe { buffet_dpdk_tx_burst(port, 0, mbufs.as_mut_ptr().cast(), n) };
        let k = usize::from(k).min(mbufs.len());
        mbufs.drain(..k).for_each(std::mem::forget);
        k
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        for _ in self.take() {}
    }
}
