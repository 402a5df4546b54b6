//! Packet sources and sinks for Buffet: pcap read/write, a seeded synthetic
//! multi-tenant traffic generator and live AF_PACKET and AF_XDP ports.
//!
//! Everything here hands out frames through one trait, [`PacketSource`]: a
//! lending iterator over timestamped Ethernet II frames ([`RawPacket`]). The
//! returned slice borrows the source's internal buffer, so reading a packet
//! allocates nothing; the slice is valid until the next call.
//!
//! * [`pcap::PcapReader`] replays a classic pcap file (microsecond or nanosecond
//!   timestamps, either byte order, Ethernet link type only) and
//!   [`pcap::PcapWriter`] writes one (nanosecond timestamps).
//! * [`gen::Generator`] synthesises multi-tenant traffic with time-varying,
//!   staggered per-tenant rates and data-centre flow sizes, from a seed, on
//!   virtual time. Its address plan ([`gen::tenant_dst_prefix`]) lets
//!   classifier rules be written for the tenants it generates.
//!
//! Frames enter and leave Buffet through the [`Port`] seam ([`port`]): bursts of
//! [`PacketBuf`]s ([`buf`]), whose storage is a heap frame or a port's own memory.
//! [`SourcePort`] makes any source a port, [`PcapTap`] records any port to a pcap.
//!
//! [`afpacket::AfPacketPort`] is a live interface (TPACKET_V3 receive ring, batched
//! send, optional hash fanout over several sockets), copying frames into heap buffers.
//! [`afxdp::AfXdpPort`] is a live interface queue through an AF_XDP socket whose UMEM
//! frames are handed out as port-owned buffers (no copy between socket and NF), with the
//! XDP program that redirects the queue to it.
//!
//! `dpdk::DpdkPort` (cargo feature `io-dpdk`, bound to the system's DPDK 22.11) is one
//! DPDK ethdev — on a kernel interface, DPDK's `net_af_packet` vdev — whose mbufs are
//! handed out as port-owned buffers.
//!
//! What this crate does not do: no pcapng, no link types other than
//! Ethernet, no threads, no async. No clock, except the AF_XDP port's arrival time (the
//! wall clock once per burst; otherwise timestamps come from the file, the generator's
//! virtual time or the kernel's receive time). Its only `unsafe` is the view of a port
//! frame, in `sys`, and the system calls of the live ports, in `afpacket::sys` and
//! `afxdp::sys` (and the DPDK calls, in `dpdk::sys`).
//!
//! ```
//! use buffet_io::{gen::{GenConfig, Generator}, PacketSource};
//!
//! let cfg = GenConfig { max_packets: Some(1_000), ..GenConfig::default() };
//! let mut gen = Generator::new(cfg)?;
//! let mut n = 0;
//! while let Some(pkt) = gen.next_packet()? {
//!     assert!(pkt.data.len() >= 64);
//!     n += 1;
//! }
//! assert_eq!(n, 1_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod afpacket;
pub mod afxdp;
pub mod buf;
#[cfg(feature = "io-dpdk")]
pub mod dpdk;
pub mod gen;
pub mod pcap;
pub mod port;
#[allow(unsafe_code)]
mod sys;

pub use buf::{FrameOwner, Outcome, PacketBuf, FRAME_CAPACITY};
pub use port::{
    wait_ready, HeapPool, PcapTap, Port, PortError, PortStats, Ready, Rx, SourcePort, TapDirection,
    MAX_WAIT_FDS,
};

pub use gen::GenError;
pub use pcap::PcapError;

/// One timestamped frame, borrowed from the source that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPacket<'a> {
    /// Timestamp in nanoseconds: since the Unix epoch for pcap files, since the
    /// start of the run for the generator (virtual time, starts at 0).
    pub ts_ns: u64,
    /// The frame, starting with its Ethernet II header (no FCS).
    pub data: &'a [u8],
}

/// Why a [`PacketSource`] could not produce its next packet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// Reading a pcap file failed.
    #[error(transparent)]
    Pcap(#[from] PcapError),
    /// The generator failed.
    #[error(transparent)]
    Gen(#[from] GenError),
}

/// A source of timestamped frames.
///
/// Lending style: the packet returned by [`next_packet`](Self::next_packet)
/// borrows the source and is valid until the next call. Implementations reuse
/// an internal buffer and allocate nothing per packet.
///
/// `Ok(None)` means the source is exhausted; after that, and after an error,
/// further calls return `Ok(None)`.
pub trait PacketSource {
    /// The next frame, `Ok(None)` at the end.
    fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError>;

    /// An estimate of how many packets are still to come, if the source knows
    /// one. For progress reporting only: it is not a bound.
    fn size_hint(&self) -> Option<u64> {
        None
    }
}

impl<S: PacketSource + ?Sized> PacketSource for &mut S {
    fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError> {
        (**self).next_packet()
    }
    fn size_hint(&self) -> Option<u64> {
        (**self).size_hint()
    }
}

impl<S: PacketSource + ?Sized> PacketSource for Box<S> {
    fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError> {
        (**self).next_packet()
    }
    fn size_hint(&self) -> Option<u64> {
        (**self).size_hint()
    }
}
