//! Packet buffers: preallocated once, moved between threads by pointer.

use buffet_dispatch::TenantSlot;
use buffet_sdk::{PortId, Verdict};

/// Bytes one [`Mbuf`] holds. Larger frames are counted as `oversize` and dropped.
pub const MBUF_CAPACITY: usize = 2048;

/// One packet in flight: its bytes, metadata, and (after a worker ran) its verdict.
///
/// `repr(C)` with the metadata first, so the metadata shares its cache line with the
/// first bytes of the frame (the headers every NF reads).
#[repr(C)]
pub struct Mbuf {
    len: u16,
    /// Arrival timestamp (ns).
    pub ts_ns: u64,
    /// Input port.
    pub in_port: PortId,
    /// The tenant the dispatcher assigned.
    pub tenant: TenantSlot,
    /// What happened to it in the worker.
    pub outcome: Outcome,
    buf: [u8; MBUF_CAPACITY],
}

/// What a worker did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not processed yet.
    Pending,
    /// The NF's verdict.
    Nf(Verdict),
    /// The worker could not parse it.
    Malformed,
    /// The tenant was removed while the packet was queued.
    NoTenant,
    /// The tenant is quarantined.
    Quarantined,
}

impl Mbuf {
    /// A fresh, empty, heap-allocated buffer.
    pub fn boxed() -> Box<Mbuf> {
        Box::new(Mbuf {
            buf: [0; MBUF_CAPACITY],
            len: 0,
            ts_ns: 0,
            in_port: 0,
            tenant: TenantSlot(0),
            outcome: Outcome::Pending,
        })
    }

    /// Copies `frame` in; false (and nothing copied) when it does not fit.
    pub fn fill(&mut self, frame: &[u8]) -> bool {
        match self.buf.get_mut(..frame.len()) {
            Some(dst) => {
                dst.copy_from_slice(frame);
                self.len = frame.len() as u16;
                self.outcome = Outcome::Pending;
                true
            }
            None => false,
        }
    }

    /// The frame.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    /// The frame, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len as usize]
    }

    /// The whole buffer (frame plus spare capacity), for NFs that grow the frame.
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Sets the frame length after an NF resized the frame in place (clamped to the
    /// buffer).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(MBUF_CAPACITY) as u16;
    }

    /// Frame length.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for an empty frame.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
