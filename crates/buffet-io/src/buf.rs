//! [`PacketBuf`]: one frame in flight, in a heap buffer or in a port's own memory.
//!
//! A `PacketBuf` is what a [`Port`](crate::Port) hands out on receive, what the Packet
//! Dispatcher classifies and what a worker runs an NF over — the same value moved from
//! thread to thread, never copied. Its storage is either
//!
//! * a heap frame of [`FRAME_CAPACITY`] bytes ([`PacketBuf::heap`]), which the pipeline
//!   keeps in a pool and reuses (file and generator ports fill these), or
//! * a frame in memory a port owns — an AF_XDP UMEM frame, a DPDK mbuf's data room —
//!   wrapped without copying by [`PacketBuf::from_port_frame`] and given back to its port
//!   (by [`FrameOwner`]) when the packet is done.
//!
//! Next to the bytes it carries the metadata every stage needs: arrival time, input port,
//! the tenant slot the dispatcher chose, the header offsets the dispatcher parsed (so a
//! worker need not parse again) and, after a worker ran, the [`Outcome`].

use buffet_sdk::{Layout, PortId, TenantSlot, Verdict};

use crate::sys::PortFrame;

/// Bytes of a heap frame. Larger frames are refused by [`PacketBuf::fill`].
pub const FRAME_CAPACITY: usize = 2048;

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
    /// It arrived without the Packet Dispatcher's tenant tag (an AF_XDP frame with no
    /// metadata): it belongs to no tenant and is not processed.
    Untagged,
}

/// Who gets a port frame back: the port that lent it, and the frame's index in that
/// port's memory (a UMEM frame number, a mempool element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameOwner {
    /// The port whose memory holds the frame.
    pub port: PortId,
    /// The frame's index (or address) in that memory, as the port understands it.
    pub frame: u64,
}

enum Storage {
    Heap(Box<[u8; FRAME_CAPACITY]>),
    Port(PortFrame),
}

/// One packet in flight: its frame and its metadata. See the module docs.
pub struct PacketBuf {
    storage: Storage,
    len: u32,
    /// Arrival timestamp (ns).
    pub ts_ns: u64,
    /// Input port.
    pub in_port: PortId,
    /// The tenant slot the dispatcher assigned.
    pub tenant: TenantSlot,
    /// Header offsets found by the dispatcher's parse, valid for the current bytes (`None`
    /// until parsed, and again after anything rewrote the frame outside an NF).
    pub layout: Option<Layout>,
    /// What happened to it in the worker.
    pub outcome: Outcome,
}

impl std::fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketBuf")
            .field("len", &self.len)
            .field("ts_ns", &self.ts_ns)
            .field("in_port", &self.in_port)
            .field("tenant", &self.tenant)
            .field("owner", &self.owner())
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl PacketBuf {
    /// A fresh, empty heap frame of [`FRAME_CAPACITY`] bytes.
    pub fn heap() -> PacketBuf {
        PacketBuf::with_storage(Storage::Heap(Box::new([0; FRAME_CAPACITY])))
    }

    /// A packet over a port frame (see [`PacketBuf::from_port_frame`]).
    pub(crate) fn over_port_frame(frame: PortFrame, len: usize) -> PacketBuf {
        let mut b = PacketBuf::with_storage(Storage::Port(frame));
        b.len = len.min(b.capacity()) as u32;
        b
    }

    fn with_storage(storage: Storage) -> PacketBuf {
        PacketBuf {
            storage,
            len: 0,
            ts_ns: 0,
            in_port: 0,
            tenant: TenantSlot(0),
            layout: None,
            outcome: Outcome::Pending,
        }
    }

    /// The port a port frame must go back to; `None` for heap frames.
    pub fn owner(&self) -> Option<FrameOwner> {
        match &self.storage {
            Storage::Heap(_) => None,
            Storage::Port(f) => Some(f.owner()),
        }
    }

    /// Stamps a frame a port just received: its arrival time and port, its tenant slot
    /// (0 until the dispatcher tags it, unless the port knows it), not processed, no
    /// parse attached.
    #[inline]
    pub fn received(&mut self, ts_ns: u64, in_port: PortId, tenant: TenantSlot) {
        self.ts_ns = ts_ns;
        self.in_port = in_port;
        self.tenant = tenant;
        self.outcome = Outcome::Pending;
        self.layout = None;
    }

    /// Copies `frame` in and resets the metadata; false (and nothing copied) when it does
    /// not fit.
    pub fn fill(&mut self, frame: &[u8]) -> bool {
        match self.buffer_mut().get_mut(..frame.len()) {
            Some(dst) => {
                dst.copy_from_slice(frame);
                self.len = frame.len() as u32;
                self.layout = None;
                self.outcome = Outcome::Pending;
                true
            }
            None => false,
        }
    }

    /// The frame.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buffer()[..self.len as usize]
    }

    /// The frame, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len as usize;
        &mut self.buffer_mut()[..len]
    }

    /// The whole buffer (frame plus spare capacity).
    #[inline]
    pub fn buffer(&self) -> &[u8] {
        match &self.storage {
            Storage::Heap(b) => &b[..],
            Storage::Port(f) => f.bytes(),
        }
    }

    /// The whole buffer, writable, for NFs that grow the frame.
    #[inline]
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Heap(b) => &mut b[..],
            Storage::Port(f) => f.bytes_mut(),
        }
    }

    /// Bytes the frame may grow to.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.buffer().len()
    }

    /// Sets the frame length after an NF resized the frame in place (clamped to the
    /// buffer).
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity()) as u32;
    }

    /// Frame length.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for an empty frame.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_frames_fill_and_refuse_oversize() {
        let mut b = PacketBuf::heap();
        assert!(b.fill(&[1, 2, 3]));
        assert_eq!(b.data(), &[1, 2, 3]);
        assert_eq!(b.owner(), None);
        assert!(!b.fill(&[0; FRAME_CAPACITY + 1]));
        assert_eq!(b.data(), &[1, 2, 3], "a refused fill changes nothing");
        b.set_len(FRAME_CAPACITY * 2);
        assert_eq!(b.len(), FRAME_CAPACITY);
    }

    #[test]
    #[allow(unsafe_code)]
    fn port_frames_are_used_in_place() {
        let mut memory = vec![0u8; 256];
        let base = std::ptr::NonNull::new(memory.as_mut_ptr()).unwrap();
        let owner = FrameOwner { port: 3, frame: 1 };
        {
            // SAFETY: `memory` outlives `b` and nothing else touches it meanwhile.
            let mut b = unsafe { PacketBuf::from_port_frame(base, 128, 4, owner) };
            assert_eq!(b.owner(), Some(owner));
            assert_eq!(b.capacity(), 128);
            b.data_mut().copy_from_slice(b"abcd");
        }
        assert_eq!(
            &memory[..4],
            b"abcd",
            "written where the port keeps the frame"
        );
    }
}
