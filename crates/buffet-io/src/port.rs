//! The Port seam: where frames enter and leave Buffet.
//!
//! A [`Port`] moves bursts of [`PacketBuf`]s: [`rx_burst`](Port::rx_burst) appends what
//! arrived (each stamped with its input port and arrival time), [`tx_burst`](Port::tx_burst)
//! sends what the NFs let out. Ports that copy frames into heap memory (files, the
//! generator, AF_PACKET) take empty frames from a [`HeapPool`] and give sent ones back to
//! it; ports with their own memory (AF_XDP UMEM, DPDK) hand out [`PacketBuf`]s over that
//! memory and take their frames back through [`recycle`](Port::recycle). The data plane
//! never copies a frame between receive and transmit.
//!
//! Here: [`SourcePort`] turns any [`PacketSource`] (a pcap file, the generator) into a
//! port whose transmit side optionally writes a pcap; [`PcapTap`] wraps any port and
//! writes what it receives and/or sends to a pcap, as smoltcp's `PcapWriter` wraps a
//! device. Live ports (AF_PACKET, AF_XDP, DPDK) implement the same trait.
//!
//! Not here: threads, clocks (a port's timestamps are the source's), routing (the data
//! plane decides which port a verdict names).

use std::os::fd::RawFd;

use buffet_sdk::{PortId, TenantSlot};

use crate::buf::PacketBuf;
use crate::pcap::{PcapError, PcapWriter};
use crate::{PacketSource, SourceError};

/// Why a port failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// The source behind a [`SourcePort`] failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Writing a pcap (a port's output or a tap) failed.
    #[error(transparent)]
    Pcap(#[from] PcapError),
    /// An I/O error on a live port, with the call that failed.
    #[error("{call}: {source}")]
    Io {
        /// The system call or operation.
        call: &'static str,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A live port's interface went down, or away.
    #[error("{}", link_lost(.iface, *.gone))]
    LinkLost {
        /// The interface.
        iface: String,
        /// It no longer exists under its name with the index the port is bound to
        /// (deleted, or moved to another network namespace): nothing arrives any more.
        gone: bool,
    },
}

fn link_lost(iface: &str, gone: bool) -> String {
    if gone {
        format!(
            "interface {iface} is gone (deleted, or moved to another network namespace): \
             this port receives nothing more; restart once the interface is back"
        )
    } else {
        format!("interface {iface} went down: nothing arrives until it is up again")
    }
}

/// What [`Port::rx_burst`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rx {
    /// This many packets were appended.
    Packets(usize),
    /// Nothing right now; try again later (live ports).
    Idle,
    /// The port has no more packets and never will (end of file, generator done).
    End,
}

/// Counters every port keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub rx: u64,
    /// Frames sent.
    pub tx: u64,
    /// Received frames dropped by the port itself (larger than a frame, no buffer free).
    pub rx_dropped: u64,
    /// Frames the port could not send.
    pub tx_dropped: u64,
    /// Of `rx_dropped`, the frames dropped because they are larger than a frame buffer
    /// (a jumbo frame; on a live port, a GRO/LRO or TSO/GSO super-packet): the pipeline
    /// counts them as input and oversize.
    pub rx_oversize: u64,
}

/// Empty heap frames for ports that copy into heap memory. The data plane owns one and
/// lends it to its ports; frames come back to it when a packet is done.
#[derive(Debug, Default)]
pub struct HeapPool {
    free: Vec<PacketBuf>,
}

impl HeapPool {
    /// A pool of `n` heap frames (allocated now, never per packet).
    pub fn new(n: usize) -> HeapPool {
        HeapPool {
            free: (0..n).map(|_| PacketBuf::heap()).collect(),
        }
    }

    /// Adds `n` more frames.
    pub fn grow(&mut self, n: usize) {
        self.free.extend((0..n).map(|_| PacketBuf::heap()));
    }

    /// An empty frame, or `None` when all are in flight.
    pub fn take(&mut self) -> Option<PacketBuf> {
        self.free.pop()
    }

    /// Returns a heap frame to the pool (its metadata is reset when it is filled again).
    pub fn give(&mut self, buf: PacketBuf) {
        debug_assert!(buf.owner().is_none(), "port frames go back to their port");
        self.free.push(buf);
    }

    /// Frames free now.
    pub fn available(&self) -> usize {
        self.free.len()
    }
}

/// A place frames enter and leave. See the module docs.
pub trait Port: Send {
    /// A name for tables and errors (`pcap:in.pcap`, `af_packet:eth0`).
    fn name(&self) -> String;

    /// Receives up to `max` frames into `out` (appended, each with `in_port` and `ts_ns`
    /// set), taking heap frames from `pool` if the port copies. Never blocks.
    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError>;

    /// Sends every frame of `pkts` (draining it). Heap frames that are done go to `pool`;
    /// port frames this port keeps until the device is done with them. A frame that
    /// cannot be sent is counted in [`PortStats::tx_dropped`] and still given back.
    fn tx_burst(&mut self, pkts: &mut Vec<PacketBuf>, pool: &mut HeapPool)
        -> Result<(), PortError>;

    /// Takes back a frame of this port's own memory that was dropped instead of sent.
    /// Ports that only lend heap frames never see this.
    fn recycle(&mut self, buf: PacketBuf) {
        drop(buf);
    }

    /// True for a port fed by a live link: when the workers fall behind, its frames are
    /// dropped and counted. False for files and the generator, which are replayed
    /// losslessly (the data plane waits for room instead).
    fn is_live(&self) -> bool;

    /// Frames still to come, when the port knows (for progress bars).
    fn size_hint(&self) -> Option<u64> {
        None
    }

    /// The port's counters.
    fn stats(&self) -> PortStats;

    /// Flushes whatever the port buffers (a pcap writer) at the end of a run.
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }

    /// Descriptors that `poll(2)` reports readable (`POLLIN`) whenever this port has
    /// frames to receive, for a data plane that waits on them ([`wait_ready`])
    /// instead of polling when nothing arrives: `None` when the port cannot say (it must
    /// be polled: files, the generator, DPDK), empty when it never receives.
    fn readiness_fds(&self) -> Option<Vec<RawFd>> {
        None
    }

    /// Reads and clears the error pending on the port's descriptors, called when
    /// [`wait_ready`] found one of its [`readiness_fds`](Self::readiness_fds) reporting an
    /// error condition: a live port says what happened to its interface. `Ok` when nothing
    /// is pending (the default, for ports whose descriptors never report one).
    fn take_error(&mut self) -> Result<(), PortError> {
        Ok(())
    }

    /// Looks again at an interface [`take_error`](Self::take_error) found down (the data
    /// plane calls it about once a second while one is): `Ok(true)` while it is still
    /// down, `Ok(false)` once it is up again or when nothing is down (the default), and
    /// [`PortError::LinkLost`] with `gone` once it went away meanwhile. (The kernel says
    /// "down" once, also for an interface being deleted, whose name may still resolve for
    /// a moment: only a later look tells.)
    fn recheck_link(&mut self) -> Result<bool, PortError> {
        Ok(false)
    }
}

/// The most descriptors [`wait_ready`] watches; a caller with more must not block on
/// them (the rest would go unwatched).
pub const MAX_WAIT_FDS: usize = crate::sys::MAX_POLL_FDS;

/// What [`wait_ready`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// A descriptor is readable or reports an error condition.
    pub woken: bool,
    /// The first descriptor that reports an error condition (`POLLERR`: a socket with an
    /// error pending, such as a packet socket whose interface went down). Until the error
    /// is read ([`Port::take_error`]) every wait returns at once.
    pub failed: Option<RawFd>,
}

/// Waits until one of `fds` is readable or reports an error, or `timeout` passed (at most
/// about 24 days). Interrupted by a signal, it returns early. With no `fds` it sleeps
/// `timeout`. Only the first [`MAX_WAIT_FDS`] are watched.
pub fn wait_ready(fds: &[RawFd], timeout: std::time::Duration) -> Ready {
    crate::sys::poll_readable(fds, timeout)
}

/// Any [`PacketSource`] as a port: receive reads the source, transmit writes a pcap (or
/// counts and discards when no output was given). Offline: replayed losslessly, as fast
/// as it is read, or [paced](Self::paced) to the wall clock.
pub struct SourcePort<S> {
    id: PortId,
    name: String,
    source: S,
    output: Option<PcapWriter>,
    stats: PortStats,
    ended: bool,
    /// When pacing: the instant packet time 0 corresponds to.
    pace: Option<std::time::Instant>,
    /// When pacing: a frame read but not yet due.
    pending: Option<PacketBuf>,
}

impl<S: PacketSource + Send> SourcePort<S> {
    /// A port numbered `id` reading `source`.
    pub fn new(id: PortId, name: impl Into<String>, source: S) -> Self {
        SourcePort {
            id,
            name: name.into(),
            source,
            output: None,
            stats: PortStats::default(),
            ended: false,
            pace: None,
            pending: None,
        }
    }

    /// Paces the source to the wall clock from now on: a frame whose timestamp is `t`
    /// is received no earlier than `t` after this call (a generator's virtual time then
    /// becomes real time, and so do the timeslots).
    pub fn paced(mut self) -> Self {
        self.pace = Some(std::time::Instant::now());
        self
    }

    /// Writes every frame sent on this port to `writer`.
    pub fn with_output(mut self, writer: PcapWriter) -> Self {
        self.output = Some(writer);
        self
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }
}

impl<S: PacketSource + Send> Port for SourcePort<S> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        if self.ended && self.pending.is_none() {
            return Ok(Rx::End);
        }
        let now = self
            .pace
            .map(|t0| u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let mut n = 0;
        while n < max {
            let buf = match self.pending.take() {
                Some(buf) => buf,
                None if self.ended => break,
                None => {
                    let Some(mut buf) = pool.take() else { break };
                    match self.source.next_packet() {
                        Ok(Some(pkt)) => {
                            self.stats.rx += 1;
                            if !buf.fill(pkt.data) {
                                self.stats.rx_dropped += 1;
                                pool.give(buf);
                                continue;
                            }
                            buf.received(pkt.ts_ns, self.id, TenantSlot(0));
                            buf
                        }
                        Ok(None) => {
                            pool.give(buf);
                            self.ended = true;
                            break;
                        }
                        Err(e) => {
                            pool.give(buf);
                            self.ended = true;
                            return Err(e.into());
                        }
                    }
                }
            };
            if now.is_some_and(|now| buf.ts_ns > now) {
                self.pending = Some(buf);
                break;
            }
            out.push(buf);
            n += 1;
        }
        Ok(match (n, self.ended && self.pending.is_none()) {
            (0, true) => Rx::End,
            (0, false) => Rx::Idle,
            (n, _) => Rx::Packets(n),
        })
    }

    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        let mut result = Ok(());
        for buf in pkts.drain(..) {
            match &mut self.output {
                Some(w) if result.is_ok() => match w.write(buf.ts_ns, buf.data()) {
                    Ok(()) => self.stats.tx += 1,
                    Err(e) => {
                        self.stats.tx_dropped += 1;
                        result = Err(e.into());
                    }
                },
                Some(_) => self.stats.tx_dropped += 1,
                None => self.stats.tx += 1,
            }
            pool.give(buf);
        }
        result
    }

    fn is_live(&self) -> bool {
        false
    }

    fn size_hint(&self) -> Option<u64> {
        self.source.size_hint()
    }

    fn stats(&self) -> PortStats {
        self.stats
    }

    fn flush(&mut self) -> Result<(), PortError> {
        match &mut self.output {
            Some(w) => w.flush().map_err(Into::into),
            None => Ok(()),
        }
    }
}

/// Which direction a [`PcapTap`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapDirection {
    /// Frames the port received.
    Rx,
    /// Frames sent on the port.
    Tx,
    /// Both, in the order they passed.
    Both,
}

/// Wraps any port and writes the frames it receives and/or sends to a pcap file, without
/// changing what the port does.
pub struct PcapTap<P> {
    inner: P,
    writer: PcapWriter,
    direction: TapDirection,
    error: Option<PcapError>,
}

impl<P: Port> PcapTap<P> {
    /// Taps `inner` into `writer`.
    pub fn new(inner: P, writer: PcapWriter, direction: TapDirection) -> Self {
        PcapTap {
            inner,
            writer,
            direction,
            error: None,
        }
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    fn record(&mut self, bufs: &[PacketBuf]) {
        if self.error.is_some() {
            return;
        }
        for b in bufs {
            if let Err(e) = self.writer.write(b.ts_ns, b.data()) {
                self.error = Some(e);
                return;
            }
        }
    }
}

impl<P: Port> Port for PcapTap<P> {
    fn name(&self) -> String {
        format!(
            "{} (tap {})",
            self.inner.name(),
            self.writer.path().display()
        )
    }

    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let before = out.len();
        let rx = self.inner.rx_burst(pool, out, max)?;
        if self.direction != TapDirection::Tx {
            self.record(&out[before..]);
        }
        Ok(rx)
    }

    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        if self.direction != TapDirection::Rx {
            self.record(pkts);
        }
        self.inner.tx_burst(pkts, pool)
    }

    fn recycle(&mut self, buf: PacketBuf) {
        self.inner.recycle(buf);
    }

    fn is_live(&self) -> bool {
        self.inner.is_live()
    }

    fn size_hint(&self) -> Option<u64> {
        self.inner.size_hint()
    }

    fn stats(&self) -> PortStats {
        self.inner.stats()
    }

    fn flush(&mut self) -> Result<(), PortError> {
        if let Some(e) = self.error.take() {
            return Err(e.into());
        }
        self.writer.flush()?;
        self.inner.flush()
    }

    fn readiness_fds(&self) -> Option<Vec<RawFd>> {
        self.inner.readiness_fds()
    }

    fn take_error(&mut self) -> Result<(), PortError> {
        self.inner.take_error()
    }

    fn recheck_link(&mut self) -> Result<bool, PortError> {
        self.inner.recheck_link()
    }
}

impl Port for Box<dyn Port> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        (**self).rx_burst(pool, out, max)
    }
    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        (**self).tx_burst(pkts, pool)
    }
    fn recycle(&mut self, buf: PacketBuf) {
        (**self).recycle(buf)
    }
    fn is_live(&self) -> bool {
        (**self).is_live()
    }
    fn size_hint(&self) -> Option<u64> {
        (**self).size_hint()
    }
    fn stats(&self) -> PortStats {
        (**self).stats()
    }
    fn flush(&mut self) -> Result<(), PortError> {
        (**self).flush()
    }
    fn readiness_fds(&self) -> Option<Vec<RawFd>> {
        (**self).readiness_fds()
    }
    fn take_error(&mut self) -> Result<(), PortError> {
        (**self).take_error()
    }
    fn recheck_link(&mut self) -> Result<bool, PortError> {
        (**self).recheck_link()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RawPacket, SourceError};

    /// Frames at fixed timestamps.
    struct At(Vec<u64>, usize, [u8; 60]);

    impl PacketSource for At {
        fn next_packet(&mut self) -> Result<Option<RawPacket<'_>>, SourceError> {
            let Some(&ts_ns) = self.0.get(self.1) else {
                return Ok(None);
            };
            self.1 += 1;
            Ok(Some(RawPacket {
                ts_ns,
                data: &self.2,
            }))
        }
    }

    #[test]
    fn a_paced_source_holds_frames_until_they_are_due_and_loses_none() {
        let hour = 3_600_000_000_000;
        let mut pool = HeapPool::new(8);
        let mut out = Vec::new();
        // Unpaced: everything at once, then the end.
        let mut p = SourcePort::new(0, "s", At(vec![0, hour], 0, [0; 60]));
        assert_eq!(p.rx_burst(&mut pool, &mut out, 8).unwrap(), Rx::Packets(2));
        assert_eq!(p.rx_burst(&mut pool, &mut out, 8).unwrap(), Rx::End);
        for b in out.drain(..) {
            pool.give(b);
        }
        // Paced: the frame due in an hour waits (idle, not ended), counted once.
        let mut p = SourcePort::new(0, "s", At(vec![0, hour], 0, [0; 60])).paced();
        assert_eq!(p.rx_burst(&mut pool, &mut out, 8).unwrap(), Rx::Packets(1));
        assert_eq!(p.rx_burst(&mut pool, &mut out, 8).unwrap(), Rx::Idle);
        assert_eq!(p.rx_burst(&mut pool, &mut out, 8).unwrap(), Rx::Idle);
        assert_eq!(p.stats().rx, 2);
        assert_eq!(out.len(), 1);
    }
}
