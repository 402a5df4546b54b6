//! The `procs` benchmark's shared memory: a file under /dev/shm mapped into the
//! dispatcher process and one NF process, holding two single-producer single-consumer
//! rings of fixed-size packet slots (dispatcher → NF, NF → dispatcher) and a stop flag.
//! All `unsafe` of the benchmark is here.

use std::cell::Cell;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots per ring (a power of two).
pub const CAP: u64 = 256;
/// Bytes of one slot: a 16-byte header (length, tenant, timestamp) and the frame.
pub const SLOT: usize = 2048;
/// The largest frame a slot holds.
pub const MAX_FRAME: usize = SLOT - 16;

#[repr(C, align(64))]
struct Index(AtomicU64);

#[repr(C)]
struct RingHeader {
    head: Index,
    tail: Index,
}

#[repr(C)]
struct Header {
    stop: Index,
    rings: [RingHeader; 2],
}

const RING_BYTES: usize = SLOT * CAP as usize;
/// Bytes of one mapping.
pub const SIZE: usize = std::mem::size_of::<Header>() + 2 * RING_BYTES;

/// One mapping (see the module docs), with this side's view of the other side's indexes.
pub struct Shm {
    base: *mut u8,
    /// Per ring: the consumer's head as the producer last read it. The producer reads
    /// the shared head again only when this says the ring is full, the consumer the
    /// shared tail only when its copy says empty: a ring in use moves the other side's
    /// index line between cores once per run of packets, not once per packet (the
    /// cached-index ring of DPDK's `rte_ring` and of Lamport's queue with caching).
    seen_head: [Cell<u64>; 2],
    /// Per ring: the producer's tail as the consumer last read it.
    seen_tail: [Cell<u64>; 2],
}

// SAFETY: the mapping is shared memory accessed only through atomics (indexes, flag) and
// through slots that the SPSC protocol gives to one side at a time; the cached indexes
// are this side's own (`Cell`s: the value moves with it, and is not `Sync`).
unsafe impl Send for Shm {}

/// Which ring: packets to the NF, or back from it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Dispatcher → NF.
    ToNf = 0,
    /// NF → dispatcher.
    Back = 1,
}

/// A slot's header.
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotHeader {
    /// Frame length (0: the NF dropped it).
    pub len: u32,
    /// Tenant index.
    pub tenant: u32,
    /// The dispatcher's timestamp (ns since its start).
    pub ts_ns: u64,
}

impl Shm {
    /// Creates (or truncates) `path` at [`SIZE`] bytes and maps it.
    pub fn create(path: &Path) -> std::io::Result<Shm> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(SIZE as u64)?;
        Shm::map(&f)
    }

    /// Maps an existing `path`.
    pub fn open(path: &Path) -> std::io::Result<Shm> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Shm::map(&f)
    }

    fn map(f: &std::fs::File) -> std::io::Result<Shm> {
        // SAFETY: a fresh shared mapping of a file of at least SIZE bytes (create sets
        // the length; open maps what create made); the result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Shm {
            base: p.cast(),
            seen_head: Default::default(),
            seen_tail: Default::default(),
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (zeroed by ftruncate: valid atomics),
        // page-aligned, alive as long as self.
        unsafe { &*self.base.cast::<Header>() }
    }

    fn slot(&self, dir: Dir, i: u64) -> *mut u8 {
        let off =
            std::mem::size_of::<Header>() + dir as usize * RING_BYTES + (i % CAP) as usize * SLOT;
        // SAFETY: off + SLOT <= SIZE by construction.
        unsafe { self.base.add(off) }
    }

    /// Asks the NF process to stop.
    pub fn stop(&self) {
        self.header().stop.0.store(1, Ordering::Release);
    }

    /// Whether the dispatcher asked to stop.
    pub fn stopping(&self) -> bool {
        self.header().stop.0.load(Ordering::Acquire) != 0
    }

    /// Producer side: appends a frame; false when the ring is full. Only one thread or
    /// process may push to a ring.
    pub fn push(&self, dir: Dir, h: SlotHeader, frame: &[u8]) -> bool {
        let r = &self.header().rings[dir as usize];
        let tail = r.tail.0.load(Ordering::Relaxed);
        let seen = &self.seen_head[dir as usize];
        if tail - seen.get() == CAP {
            seen.set(r.head.0.load(Ordering::Acquire));
            if tail - seen.get() == CAP {
                return false;
            }
        }
        let len = frame.len().min(MAX_FRAME);
        let s = self.slot(dir, tail);
        // SAFETY: slot `tail` belongs to the producer until the tail store below: the
        // consumer only reads slots before tail, and an Acquire load of head (this
        // call's or an earlier one's, as `seen_head` holds) saw it done with the slot's
        // previous frame; 16 + len <= SLOT.
        unsafe {
            s.cast::<u32>().write_unaligned(h.len);
            s.add(4).cast::<u32>().write_unaligned(h.tenant);
            s.add(8).cast::<u64>().write_unaligned(h.ts_ns);
            std::ptr::copy_nonoverlapping(frame.as_ptr(), s.add(16), len);
        }
        r.tail.0.store(tail + 1, Ordering::Release);
        true
    }

    /// Consumer side: copies the oldest frame into `buf` (at least [`MAX_FRAME`] bytes)
    /// and returns its header. Only one thread or process may pop from a ring.
    pub fn pop(&self, dir: Dir, buf: &mut [u8]) -> Option<SlotHeader> {
        let r = &self.header().rings[dir as usize];
        let head = r.head.0.load(Ordering::Relaxed);
        let seen = &self.seen_tail[dir as usize];
        if head == seen.get() {
            seen.set(r.tail.0.load(Ordering::Acquire));
            if head == seen.get() {
                return None;
            }
        }
        let s = self.slot(dir, head);
        // SAFETY: slot `head` was published by the producer's Release store of a tail
        // beyond it, which an Acquire load read (this call's or an earlier one's: the
        // cached `seen_tail` only ever holds a tail so read), and stays the consumer's
        // until the head store below; the copy is bounded by MAX_FRAME and buf's length.
        let h = unsafe {
            let h = SlotHeader {
                len: s.cast::<u32>().read_unaligned(),
                tenant: s.add(4).cast::<u32>().read_unaligned(),
                ts_ns: s.add(8).cast::<u64>().read_unaligned(),
            };
            let n = (h.len as usize).min(MAX_FRAME).min(buf.len());
            std::ptr::copy_nonoverlapping(s.add(16), buf.as_mut_ptr(), n);
            h
        };
        r.head.0.store(head + 1, Ordering::Release);
        Some(h)
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what map() mapped; no reference into it outlives self.
        unsafe {
            libc::munmap(self.base.cast(), SIZE);
        }
    }
}
