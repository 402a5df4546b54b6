//! The zero-copy [`Packet`] view.
//!
//! [`Packet::parse`] walks the headers once with etherparse header slices, checks every
//! length, and remembers only offsets. The accessors rebuild header slices from those
//! offsets; none of them can panic, whatever the bytes are, and none allocates.
//!
//! Accepted: Ethernet II, optionally one 802.1Q/802.1ad tag, then IPv4 or IPv6. TCP, UDP
//! and SCTP headers are parsed when present (first fragment only); any other IP protocol
//! is accepted with its payload starting right after the IP header. Everything else is a
//! [`ParseError`], which the framework counts per reason and drops.
//!
//! etherparse has no SCTP header; [`SctpHeaderSlice`] is a checked view of SCTP's 12-byte
//! common header (ports, verification tag, checksum) in the same style. Chunks are not
//! parsed: the L4 payload of an SCTP packet starts at its first chunk.
//!
//! **Address families.** Addresses are handed out as 16 bytes, IPv4 in the IPv4-mapped
//! form `::ffff:a.b.c.d`, always together with the packet's [`L3Kind`]: a [`FlowKey`]
//! carries it, so the IPv4 flow `10.0.0.1 -> …` and the IPv6 flow `::ffff:10.0.0.1 -> …`
//! are different keys, and [`FlowKey::src_addr`] gives back the address of the packet's
//! own family.
//!
//! **Growing and shrinking.** A packet parsed with [`Packet::parse_with_capacity`] sits in
//! a larger buffer; [`Packet::resize`] moves its end within that buffer (bounds-checked,
//! never reallocating), so an NF can add headers (an IPsec tunnel) or strip them. Bytes
//! that a resize exposes are zeroed first: a buffer reused across packets never shows an
//! NF another packet's bytes. After rewriting headers, [`Packet::reparse`] refreshes the
//! offsets the accessors use.
//!
//! **Written headers and the mark.** [`Packet::data_mut`] and [`Packet::resize`] may
//! change headers, so they set a flag ([`Packet::headers_written`]) that
//! [`Packet::reparse`] clears: a framework running several NFs over one packet (a
//! tenant's chain) walks the headers again only after an NF may have changed them. The
//! 32-bit [`Packet::mark`] travels with the packet from one NF of a chain to the next
//! (0 when the packet arrives); an NF sets it to steer later stages.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2HeaderSlice, IpNumber, Ipv4HeaderSlice, Ipv6HeaderSlice,
    SingleVlanHeaderSlice, TcpHeaderSlice, UdpHeaderSlice,
};

use crate::nf::{PortId, TenantId};

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
/// Length of SCTP's common header (RFC 9260, section 3.1).
pub const SCTP_HEADER_LEN: usize = 12;

/// Why [`Packet::resize`] refused a new length. Small and `Copy`: it is a hot-path outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ResizeError {
    /// The new length does not fit in the buffer the packet was parsed in.
    #[error("{requested} bytes exceed the packet buffer's capacity of {capacity}")]
    BeyondCapacity {
        /// The length asked for.
        requested: usize,
        /// The buffer's capacity ([`Packet::capacity`]).
        capacity: usize,
    },
}

/// Why a packet could not be parsed. Small and `Copy`: it is a hot-path outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, thiserror::Error)]
pub enum ParseError {
    /// Shorter than an Ethernet II header.
    #[error("truncated Ethernet header")]
    TruncatedEthernet,
    /// A VLAN tag that does not fit in the packet.
    #[error("truncated VLAN tag")]
    TruncatedVlan,
    /// An EtherType that is neither IPv4, IPv6 nor a single VLAN tag.
    #[error("unsupported EtherType")]
    UnsupportedEtherType,
    /// The IP header does not fit in the packet.
    #[error("truncated IP header")]
    TruncatedIp,
    /// The IP version nibble disagrees with the EtherType.
    #[error("bad IP version")]
    BadIpVersion,
    /// IPv4 IHL below 5 (a header shorter than 20 bytes).
    #[error("IPv4 IHL below 5")]
    BadIhl,
    /// The IP total/payload length claims more bytes than the packet has.
    #[error("IP length beyond the buffer")]
    LengthBeyondBuffer,
    /// The TCP, UDP or SCTP header does not fit inside the IP payload.
    #[error("truncated L4 header")]
    TruncatedL4,
    /// A TCP data offset below 5 or beyond the IP payload.
    #[error("bad TCP data offset")]
    BadTcpOffset,
}

impl ParseError {
    /// Every error, in a fixed order (for counters indexed by reason).
    pub const ALL: [ParseError; 9] = [
        ParseError::TruncatedEthernet,
        ParseError::TruncatedVlan,
        ParseError::UnsupportedEtherType,
        ParseError::TruncatedIp,
        ParseError::BadIpVersion,
        ParseError::BadIhl,
        ParseError::LengthBeyondBuffer,
        ParseError::TruncatedL4,
        ParseError::BadTcpOffset,
    ];

    /// A stable, lower-case name for stats.
    pub const fn name(self) -> &'static str {
        match self {
            ParseError::TruncatedEthernet => "truncated_ethernet",
            ParseError::TruncatedVlan => "truncated_vlan",
            ParseError::UnsupportedEtherType => "unsupported_ethertype",
            ParseError::TruncatedIp => "truncated_ip",
            ParseError::BadIpVersion => "bad_ip_version",
            ParseError::BadIhl => "bad_ihl",
            ParseError::LengthBeyondBuffer => "length_beyond_buffer",
            ParseError::TruncatedL4 => "truncated_l4",
            ParseError::BadTcpOffset => "bad_tcp_offset",
        }
    }

    /// Position of this error in [`ParseError::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The network layer of a parsed packet: the address family of its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum L3Kind {
    /// IPv4.
    #[default]
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// The transport layer of a parsed packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum L4Kind {
    /// A TCP header was parsed.
    Tcp,
    /// A UDP header was parsed.
    Udp,
    /// An SCTP common header was parsed ([`SctpHeaderSlice`]).
    Sctp,
    /// Another protocol, or a non-first fragment: no ports.
    #[default]
    Other,
}

/// Metadata travelling with a packet (not part of its bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketMeta {
    /// The port the packet came in on.
    pub in_port: PortId,
    /// Arrival time in nanoseconds (from the port or the trace; never from a clock here).
    pub ts_ns: u64,
    /// The tenant the dispatcher classified the packet to.
    pub tenant: TenantId,
}

/// A flow's 5-tuple and address family. `Hash + Eq + Copy`, ready to key a flow table.
///
/// Addresses are 16 bytes, IPv4 stored IPv4-mapped (`::ffff:a.b.c.d`); `l3` says which
/// family they are, so an IPv4 flow and an IPv6 flow between `::ffff:`-mapped addresses
/// of the same IPv4 addresses are different keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FlowKey {
    /// The address family (the packet's IP version).
    pub l3: L3Kind,
    /// Source address (IPv4-mapped for IPv4).
    pub src: [u8; 16],
    /// Destination address (IPv4-mapped for IPv4).
    pub dst: [u8; 16],
    /// IP protocol number.
    pub proto: u8,
    /// Source port (0 when the protocol has none).
    pub src_port: u16,
    /// Destination port (0 when the protocol has none).
    pub dst_port: u16,
}

impl FlowKey {
    /// The key of a flow between two addresses of one family (`None` when `src` and `dst`
    /// are of different families); IPv4 addresses are stored IPv4-mapped.
    pub fn new(src: IpAddr, dst: IpAddr, proto: u8, src_port: u16, dst_port: u16) -> Option<Self> {
        let (l3, src, dst) = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                (L3Kind::Ipv4, v4_mapped(s.octets()), v4_mapped(d.octets()))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => (L3Kind::Ipv6, s.octets(), d.octets()),
            _ => return None,
        };
        Some(FlowKey {
            l3,
            src,
            dst,
            proto,
            src_port,
            dst_port,
        })
    }
    /// The source address as an [`IpAddr`] of the key's family (an IPv6 `::ffff:a.b.c.d`
    /// stays IPv6).
    pub fn src_addr(&self) -> IpAddr {
        to_ip(self.l3, self.src)
    }
    /// The destination address as an [`IpAddr`] of the key's family.
    pub fn dst_addr(&self) -> IpAddr {
        to_ip(self.l3, self.dst)
    }
    /// The key of the opposite direction of the same connection (same family).
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            l3: self.l3,
            src: self.dst,
            dst: self.src,
            proto: self.proto,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

fn to_ip(l3: L3Kind, a: [u8; 16]) -> IpAddr {
    match l3 {
        L3Kind::Ipv4 => IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15])),
        L3Kind::Ipv6 => IpAddr::V6(Ipv6Addr::from(a)),
    }
}

/// Maps an IPv4 address into the IPv4-mapped IPv6 space (`::ffff:a.b.c.d`).
pub(crate) fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

/// The header offsets [`Packet::parse`] found; 16 bytes, `Copy`.
///
/// The Packet Dispatcher parses every frame to classify it; it keeps the layout next to
/// the frame so the worker rebuilds the [`Packet`] with [`Packet::from_layout`] instead of
/// walking the headers a second time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    vlan: Option<u16>,
    l3: u16,
    l4: u16,
    payload: u16,
    /// One past the last byte the IP header accounts for (excludes Ethernet padding).
    end: u16,
    l3_kind: L3Kind,
    l4_kind: L4Kind,
    proto: u8,
}

/// One packet: its bytes (mutable, so NFs can rewrite in place), its metadata, and the
/// header offsets found when it was parsed.
///
/// The frame is the first [`len`](Self::len) bytes of a buffer of
/// [`capacity`](Self::capacity) bytes; `len <= capacity` always holds.
#[derive(Debug)]
pub struct Packet<'a> {
    buf: &'a mut [u8],
    len: usize,
    meta: PacketMeta,
    layout: Layout,
    mark: u32,
    written: bool,
}

impl<'a> Packet<'a> {
    /// Parses `data` once, checking every header length. Never panics.
    ///
    /// The frame is all of `data`, and so is the capacity: such a packet can shrink but
    /// not grow. Use [`parse_with_capacity`](Self::parse_with_capacity) to leave room.
    pub fn parse(data: &'a mut [u8], meta: PacketMeta) -> Result<Self, ParseError> {
        let len = data.len();
        Self::parse_with_capacity(data, len, meta)
    }

    /// Parses the frame `buf[..len]`, keeping the rest of `buf` as room to grow into
    /// with [`resize`](Self::resize). Never panics.
    ///
    /// A `len` beyond `buf.len()` is [`ParseError::LengthBeyondBuffer`].
    pub fn parse_with_capacity(
        buf: &'a mut [u8],
        len: usize,
        meta: PacketMeta,
    ) -> Result<Self, ParseError> {
        let frame = buf.get(..len).ok_or(ParseError::LengthBeyondBuffer)?;
        let layout = parse_layout(frame)?;
        Ok(Packet {
            buf,
            len,
            meta,
            layout,
            mark: 0,
            written: false,
        })
    }

    /// A packet over `buf[..len]` with the header offsets of an earlier parse of the same
    /// bytes (see [`Layout`]), without walking the headers again. The offsets are checked
    /// against `len` (so accessors stay total); that they describe these very bytes is the
    /// caller's word — a stale layout misreads headers but never panics.
    pub fn from_layout(
        buf: &'a mut [u8],
        len: usize,
        meta: PacketMeta,
        layout: Layout,
    ) -> Result<Self, ParseError> {
        if len > buf.len() {
            return Err(ParseError::LengthBeyondBuffer);
        }
        let end = usize::from(layout.end);
        if end > len
            || usize::from(layout.l3) > end
            || usize::from(layout.l4) > end
            || usize::from(layout.payload) > end
        {
            return Err(ParseError::LengthBeyondBuffer);
        }
        Ok(Packet {
            buf,
            len,
            meta,
            layout,
            mark: 0,
            written: false,
        })
    }

    /// The header offsets of this packet, to rebuild it later with
    /// [`from_layout`](Self::from_layout).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The whole frame.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The whole frame, writable. Rewriting headers is the NF's business; the offsets
    /// found at parse time stay as they were until [`reparse`](Self::reparse).
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.written = true;
        &mut self.buf[..self.len]
    }

    /// True once [`data_mut`](Self::data_mut) or [`resize`](Self::resize) handed out or
    /// changed the frame since the last parse: the header offsets may be stale. Cleared
    /// by a successful [`reparse`](Self::reparse).
    pub fn headers_written(&self) -> bool {
        self.written
    }

    /// The packet's mark: 32 bits an NF sets ([`set_mark`](Self::set_mark)) for the NFs
    /// after it in the tenant's chain (a chain stage's `when` guard can match it). 0 when
    /// the packet arrives; never part of the frame.
    pub fn mark(&self) -> u32 {
        self.mark
    }

    /// Sets the packet's [`mark`](Self::mark).
    pub fn set_mark(&mut self, mark: u32) {
        self.mark = mark;
    }

    /// Bytes the frame may grow to: the length of the buffer it was parsed in.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Sets the frame length to `new_len`, growing into or shrinking within the buffer.
    ///
    /// Bytes between the old and the new length are zeroed when the frame grows. The
    /// header offsets are not recomputed (call [`reparse`](Self::reparse) once the new
    /// headers are written); accessors stay total meanwhile. On error nothing changes.
    pub fn resize(&mut self, new_len: usize) -> Result<(), ResizeError> {
        let capacity = self.buf.len();
        let grown = self.buf.get_mut(self.len..new_len.max(self.len)).ok_or(
            ResizeError::BeyondCapacity {
                requested: new_len,
                capacity,
            },
        )?;
        grown.fill(0);
        self.len = new_len;
        self.written = true;
        Ok(())
    }

    /// Walks the headers of the current frame again (after an NF rewrote them) and
    /// refreshes the offsets the accessors use. On error the old offsets are kept and the
    /// frame is not a packet this SDK can parse; the NF should drop it.
    pub fn reparse(&mut self) -> Result<(), ParseError> {
        self.layout = parse_layout(&self.buf[..self.len])?;
        self.written = false;
        Ok(())
    }

    /// The packet's metadata.
    pub fn meta(&self) -> PacketMeta {
        self.meta
    }

    /// The tenant this packet belongs to.
    pub fn tenant(&self) -> TenantId {
        self.meta.tenant
    }

    /// Frame length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty frame (never the case for a freshly parsed packet).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The Ethernet II header.
    pub fn ethernet(&self) -> Option<Ethernet2HeaderSlice<'_>> {
        Ethernet2HeaderSlice::from_slice(self.data()).ok()
    }

    /// The VLAN id, when the frame carries one tag.
    pub fn vlan_id(&self) -> Option<u16> {
        self.layout.vlan
    }

    /// IPv4 or IPv6.
    pub fn l3_kind(&self) -> L3Kind {
        self.layout.l3_kind
    }

    /// TCP, UDP, SCTP or other.
    pub fn l4_kind(&self) -> L4Kind {
        self.layout.l4_kind
    }

    /// The IP protocol number (IPv6: the first next-header).
    pub fn ip_proto(&self) -> u8 {
        self.layout.proto
    }

    /// Byte offset of the IP header in the frame.
    pub fn l3_offset(&self) -> usize {
        self.layout.l3 as usize
    }

    /// Byte offset of the L4 header (or of the IP payload when there is none parsed).
    pub fn l4_offset(&self) -> usize {
        self.layout.l4 as usize
    }

    /// Byte offset of the L4 payload.
    pub fn payload_offset(&self) -> usize {
        self.layout.payload as usize
    }

    /// One past the last byte the IP header accounts for.
    pub fn ip_end(&self) -> usize {
        self.layout.end as usize
    }

    /// The IPv4 header, when the packet is IPv4.
    pub fn ipv4(&self) -> Option<Ipv4HeaderSlice<'_>> {
        match self.layout.l3_kind {
            L3Kind::Ipv4 => Ipv4HeaderSlice::from_slice(self.data().get(self.l3_offset()..)?).ok(),
            L3Kind::Ipv6 => None,
        }
    }

    /// The IPv6 header, when the packet is IPv6.
    pub fn ipv6(&self) -> Option<Ipv6HeaderSlice<'_>> {
        match self.layout.l3_kind {
            L3Kind::Ipv6 => Ipv6HeaderSlice::from_slice(self.data().get(self.l3_offset()..)?).ok(),
            L3Kind::Ipv4 => None,
        }
    }

    /// The TCP header, when there is one.
    pub fn tcp(&self) -> Option<TcpHeaderSlice<'_>> {
        match self.layout.l4_kind {
            L4Kind::Tcp => TcpHeaderSlice::from_slice(self.l4_bytes()?).ok(),
            _ => None,
        }
    }

    /// The UDP header, when there is one.
    pub fn udp(&self) -> Option<UdpHeaderSlice<'_>> {
        match self.layout.l4_kind {
            L4Kind::Udp => UdpHeaderSlice::from_slice(self.l4_bytes()?).ok(),
            _ => None,
        }
    }

    /// The SCTP common header, when there is one.
    pub fn sctp(&self) -> Option<SctpHeaderSlice<'_>> {
        match self.layout.l4_kind {
            L4Kind::Sctp => SctpHeaderSlice::from_slice(self.l4_bytes()?).ok(),
            _ => None,
        }
    }

    fn l4_bytes(&self) -> Option<&[u8]> {
        self.data().get(self.l4_offset()..self.ip_end())
    }

    /// The L4 payload (after the TCP/UDP/SCTP header; the IP payload for other protocols),
    /// without Ethernet padding.
    pub fn payload(&self) -> &[u8] {
        self.data()
            .get(self.payload_offset()..self.ip_end())
            .unwrap_or(&[])
    }

    /// The L4 payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.payload_offset(), self.ip_end());
        self.data_mut().get_mut(start..end).unwrap_or(&mut [])
    }

    /// Source and destination ports (TCP, UDP or SCTP with its header parsed), else
    /// `None`.
    pub fn ports(&self) -> Option<(u16, u16)> {
        let l4 = self.l4_bytes()?;
        match self.layout.l4_kind {
            L4Kind::Tcp | L4Kind::Udp | L4Kind::Sctp if l4.len() >= 4 => Some((
                u16::from_be_bytes([l4[0], l4[1]]),
                u16::from_be_bytes([l4[2], l4[3]]),
            )),
            _ => None,
        }
    }

    /// The DSCP (upper six bits of the IPv4 TOS / IPv6 traffic class).
    pub fn dscp(&self) -> u8 {
        match self.layout.l3_kind {
            L3Kind::Ipv4 => self.ipv4().map_or(0, |h| h.dcp().value()),
            L3Kind::Ipv6 => self.ipv6().map_or(0, |h| h.traffic_class() >> 2),
        }
    }

    /// Source and destination addresses, IPv4 mapped into IPv6. The 16 bytes alone do
    /// not tell IPv4 `a.b.c.d` from IPv6 `::ffff:a.b.c.d`: pair them with
    /// [`l3_kind`](Self::l3_kind), or use [`flow_key`](Self::flow_key), which does.
    pub fn addrs(&self) -> ([u8; 16], [u8; 16]) {
        match self.layout.l3_kind {
            L3Kind::Ipv4 => self.ipv4().map_or(([0; 16], [0; 16]), |h| {
                (v4_mapped(h.source()), v4_mapped(h.destination()))
            }),
            L3Kind::Ipv6 => self
                .ipv6()
                .map_or(([0; 16], [0; 16]), |h| (h.source(), h.destination())),
        }
    }

    /// The 5-tuple and address family (ports 0 for protocols without them).
    pub fn flow_key(&self) -> FlowKey {
        let (src, dst) = self.addrs();
        let (src_port, dst_port) = self.ports().unwrap_or((0, 0));
        FlowKey {
            l3: self.layout.l3_kind,
            src,
            dst,
            proto: self.layout.proto,
            src_port,
            dst_port,
        }
    }
}

fn parse_layout(data: &[u8]) -> Result<Layout, ParseError> {
    let eth = Ethernet2HeaderSlice::from_slice(data).map_err(|_| ParseError::TruncatedEthernet)?;
    let mut ether_type = eth.ether_type();
    let mut l3 = ETH_LEN;
    let mut vlan = None;
    if ether_type == EtherType::VLAN_TAGGED_FRAME || ether_type == EtherType::PROVIDER_BRIDGING {
        let tag = SingleVlanHeaderSlice::from_slice(&data[ETH_LEN..])
            .map_err(|_| ParseError::TruncatedVlan)?;
        vlan = Some(tag.vlan_identifier().value());
        ether_type = tag.ether_type();
        l3 += VLAN_LEN;
    }
    let rest = &data[l3..];
    let mut layout = Layout {
        vlan,
        l3: l3 as u16,
        ..Layout::default()
    };
    let (proto, ip_payload_start, end, l4_parsable) = match ether_type {
        EtherType::IPV4 => {
            if rest.len() < 20 {
                return Err(ParseError::TruncatedIp);
            }
            if rest[0] >> 4 != 4 {
                return Err(ParseError::BadIpVersion);
            }
            if rest[0] & 0x0f < 5 {
                return Err(ParseError::BadIhl);
            }
            let ip = Ipv4HeaderSlice::from_slice(rest).map_err(|e| {
                use etherparse::err::ipv4::HeaderSliceError as E;
                match e {
                    E::Len(_) => ParseError::TruncatedIp,
                    E::Content(_) => ParseError::BadIhl,
                }
            })?;
            let total = ip.total_len() as usize;
            let hlen = ip.slice().len();
            if total > rest.len() {
                return Err(ParseError::LengthBeyondBuffer);
            }
            if total < hlen {
                return Err(ParseError::TruncatedIp);
            }
            layout.l3_kind = L3Kind::Ipv4;
            let first_fragment = ip.fragments_offset().value() == 0;
            (ip.protocol(), l3 + hlen, l3 + total, first_fragment)
        }
        EtherType::IPV6 => {
            if rest.len() < IPV6_LEN {
                return Err(ParseError::TruncatedIp);
            }
            if rest[0] >> 4 != 6 {
                return Err(ParseError::BadIpVersion);
            }
            let ip = Ipv6HeaderSlice::from_slice(rest).map_err(|_| ParseError::TruncatedIp)?;
            let total = IPV6_LEN + ip.payload_length() as usize;
            if total > rest.len() {
                return Err(ParseError::LengthBeyondBuffer);
            }
            layout.l3_kind = L3Kind::Ipv6;
            (ip.next_header(), l3 + IPV6_LEN, l3 + total, true)
        }
        _ => return Err(ParseError::UnsupportedEtherType),
    };
    if end > u16::MAX as usize {
        return Err(ParseError::LengthBeyondBuffer);
    }
    layout.proto = proto.0;
    layout.l4 = ip_payload_start as u16;
    layout.payload = ip_payload_start as u16;
    layout.end = end as u16;
    let l4 = &data[ip_payload_start..end];
    if l4_parsable && proto == IpNumber::TCP {
        if l4.len() < 20 {
            return Err(ParseError::TruncatedL4);
        }
        let offset = (l4[12] >> 4) as usize * 4;
        if offset < 20 || offset > l4.len() {
            return Err(ParseError::BadTcpOffset);
        }
        let tcp = TcpHeaderSlice::from_slice(l4).map_err(|_| ParseError::BadTcpOffset)?;
        layout.l4_kind = L4Kind::Tcp;
        layout.payload = (ip_payload_start + tcp.slice().len()) as u16;
    } else if l4_parsable && proto == IpNumber::UDP {
        let udp = UdpHeaderSlice::from_slice(l4).map_err(|_| ParseError::TruncatedL4)?;
        layout.l4_kind = L4Kind::Udp;
        layout.payload = (ip_payload_start + udp.slice().len().min(UDP_LEN)) as u16;
    } else if l4_parsable && proto == IpNumber::SCTP {
        let sctp = SctpHeaderSlice::from_slice(l4)?;
        layout.l4_kind = L4Kind::Sctp;
        layout.payload = (ip_payload_start + sctp.slice().len()) as u16;
    }
    Ok(layout)
}

/// A checked view of an SCTP common header (RFC 9260, section 3.1): source port,
/// destination port, verification tag, checksum, 12 bytes in network byte order.
///
/// Built only by [`from_slice`](Self::from_slice), which checks the length; the
/// accessors then cannot panic. The CRC32c checksum is not verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SctpHeaderSlice<'a> {
    slice: &'a [u8; SCTP_HEADER_LEN],
}

impl<'a> SctpHeaderSlice<'a> {
    /// The header at the start of `data`; [`ParseError::TruncatedL4`] when `data` is
    /// shorter than [`SCTP_HEADER_LEN`] bytes.
    pub fn from_slice(data: &'a [u8]) -> Result<Self, ParseError> {
        let slice = data
            .get(..SCTP_HEADER_LEN)
            .and_then(|s| <&[u8; SCTP_HEADER_LEN]>::try_from(s).ok())
            .ok_or(ParseError::TruncatedL4)?;
        Ok(SctpHeaderSlice { slice })
    }

    /// The 12 header bytes.
    pub fn slice(&self) -> &'a [u8] {
        self.slice
    }

    /// Source port.
    pub fn source_port(&self) -> u16 {
        u16::from_be_bytes([self.slice[0], self.slice[1]])
    }

    /// Destination port.
    pub fn destination_port(&self) -> u16 {
        u16::from_be_bytes([self.slice[2], self.slice[3]])
    }

    /// Verification tag.
    pub fn verification_tag(&self) -> u32 {
        u32::from_be_bytes([self.slice[4], self.slice[5], self.slice[6], self.slice[7]])
    }

    /// Checksum field (CRC32c, as carried; not verified).
    pub fn checksum(&self) -> u32 {
        u32::from_be_bytes([self.slice[8], self.slice[9], self.slice[10], self.slice[11]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    fn udp4(payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1000, 2000)
            .write(&mut v, payload)
            .unwrap();
        v
    }

    #[test]
    fn parses_udp_v4() {
        let mut b = udp4(b"hello");
        let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!(p.l4_kind(), L4Kind::Udp);
        assert_eq!(p.ports(), Some((1000, 2000)));
        assert_eq!(p.payload(), b"hello");
        assert_eq!(
            p.flow_key().src_addr(),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn parses_vlan_tcp_v6() {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .single_vlan(etherparse::VlanId::try_new(42).unwrap())
            .ipv6([1; 16], [2; 16], 64)
            .tcp(80, 443, 7, 1000)
            .write(&mut v, b"abc")
            .unwrap();
        let p = Packet::parse(&mut v, PacketMeta::default()).unwrap();
        assert_eq!(p.vlan_id(), Some(42));
        assert_eq!(p.l3_kind(), L3Kind::Ipv6);
        assert_eq!(p.tcp().unwrap().destination_port(), 443);
        assert_eq!(p.payload(), b"abc");
    }

    /// An Ethernet + IP frame carrying `l4` as the payload of IP protocol 132 (SCTP).
    fn sctp_frame(v6: bool, src: [u8; 16], dst: [u8; 16], l4: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([1; 6], [2; 6]);
        let ip = if v6 {
            b.ipv6(src, dst, 64)
        } else {
            let s = [src[12], src[13], src[14], src[15]];
            let d = [dst[12], dst[13], dst[14], dst[15]];
            b.ipv4(s, d, 64)
        };
        let mut v = Vec::new();
        ip.write(&mut v, IpNumber::SCTP, l4).unwrap();
        v
    }

    /// SCTP common header: ports 3868 -> 3869, tag 0x01020304, checksum 0xa0b0c0d0,
    /// then one chunk.
    const SCTP_L4: [u8; 16] = [
        0x0f, 0x1c, 0x0f, 0x1d, 1, 2, 3, 4, 0xa0, 0xb0, 0xc0, 0xd0, 3, 0, 0, 4,
    ];

    #[test]
    fn parses_the_sctp_common_header() {
        let v4 = v4_mapped([10, 0, 0, 1]);
        for v6 in [false, true] {
            let mut b = sctp_frame(v6, v4, v4_mapped([10, 0, 0, 2]), &SCTP_L4);
            let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            assert_eq!(p.l4_kind(), L4Kind::Sctp);
            assert_eq!(p.ip_proto(), 132);
            assert_eq!(p.ports(), Some((3868, 3869)));
            let h = p.sctp().unwrap();
            assert_eq!((h.source_port(), h.destination_port()), (3868, 3869));
            assert_eq!(
                (h.verification_tag(), h.checksum()),
                (0x0102_0304, 0xa0b0_c0d0)
            );
            assert_eq!(
                p.payload(),
                &[3, 0, 0, 4],
                "chunks follow the 12-byte header"
            );
            let k = p.flow_key();
            assert_eq!((k.proto, k.src_port, k.dst_port), (132, 3868, 3869));
            assert!(p.tcp().is_none() && p.udp().is_none());
        }
        // A header of exactly 12 bytes and no chunk is still a header.
        let mut b = sctp_frame(false, v4, v4, &SCTP_L4[..12]);
        let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!((p.ports(), p.payload()), (Some((3868, 3869)), &[][..]));
    }

    #[test]
    fn truncated_sctp_is_truncated_l4_and_fragments_have_no_ports() {
        let a = v4_mapped([10, 0, 0, 1]);
        for n in 0..SCTP_HEADER_LEN {
            for v6 in [false, true] {
                let mut b = sctp_frame(v6, a, a, &SCTP_L4[..n]);
                assert_eq!(
                    Packet::parse(&mut b, PacketMeta::default()).unwrap_err(),
                    ParseError::TruncatedL4,
                    "{n} bytes, v6 {v6}"
                );
            }
        }
        // A non-first IPv4 fragment carries no SCTP header: no ports, like TCP/UDP.
        let mut b = sctp_frame(false, a, a, &SCTP_L4[..8]);
        b[14 + 6] = 0x00;
        b[14 + 7] = 0x02; // fragment offset 2 (16 bytes)
        let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!(
            (p.l4_kind(), p.ports(), p.ip_proto()),
            (L4Kind::Other, None, 132)
        );
        assert!(p.sctp().is_none());
        assert!(SctpHeaderSlice::from_slice(&SCTP_L4[..11]).is_err());
    }

    #[test]
    fn flow_keys_keep_the_address_family() {
        let mut b4 = udp4(b"x");
        let k4 = Packet::parse(&mut b4, PacketMeta::default())
            .unwrap()
            .flow_key();
        let mut b6 = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6(v4_mapped([10, 0, 0, 1]), v4_mapped([10, 0, 0, 2]), 64)
            .udp(1000, 2000)
            .write(&mut b6, b"x")
            .unwrap();
        let k6 = Packet::parse(&mut b6, PacketMeta::default())
            .unwrap()
            .flow_key();
        assert_eq!((k4.src, k4.dst), (k6.src, k6.dst), "same 16 address bytes");
        assert_eq!((k4.l3, k6.l3), (L3Kind::Ipv4, L3Kind::Ipv6));
        assert_ne!(k4, k6);
        assert_ne!(k4.reversed(), k6.reversed());
        assert_eq!(k4.src_addr(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(k6.src_addr(), "::ffff:10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(
            k6.reversed().src_addr(),
            "::ffff:10.0.0.2".parse::<IpAddr>().unwrap()
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            FlowKey::new(ip("10.0.0.1"), ip("10.0.0.2"), 17, 1000, 2000),
            Some(k4)
        );
        assert_eq!(
            FlowKey::new(ip("::ffff:10.0.0.1"), ip("::ffff:10.0.0.2"), 17, 1000, 2000),
            Some(k6)
        );
        assert_eq!(FlowKey::new(ip("10.0.0.1"), ip("::1"), 17, 1, 2), None);
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        let mut b = udp4(b"x");
        b.extend_from_slice(&[0; 20]);
        let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!(p.payload(), b"x");
    }

    #[test]
    fn malformed_inputs_are_errors() {
        let good = udp4(b"payload");
        let cases: Vec<(Vec<u8>, ParseError)> = vec![
            (good[..10].to_vec(), ParseError::TruncatedEthernet),
            (good[..20].to_vec(), ParseError::TruncatedIp),
            (
                {
                    let mut b = good.clone();
                    b[14] = 0x44;
                    b
                },
                ParseError::BadIhl,
            ),
            (
                {
                    let mut b = good.clone();
                    b[14] = 0x65;
                    b
                },
                ParseError::BadIpVersion,
            ),
            (
                {
                    let mut b = good.clone();
                    b[16] = 0xff;
                    b
                },
                ParseError::LengthBeyondBuffer,
            ),
            (
                {
                    let mut b = good.clone();
                    b[12] = 0x12;
                    b[13] = 0x34;
                    b
                },
                ParseError::UnsupportedEtherType,
            ),
            (
                {
                    let mut b = good[..14 + 20 + 4].to_vec();
                    b[16] = 0;
                    b[17] = 24;
                    b
                },
                ParseError::TruncatedL4,
            ),
        ];
        for (mut bytes, want) in cases {
            assert_eq!(
                Packet::parse(&mut bytes, PacketMeta::default()).unwrap_err(),
                want
            );
        }
    }

    #[test]
    fn parse_with_capacity_sees_only_the_frame() {
        let frame = udp4(b"hello");
        let mut buf = [0xeeu8; 256];
        buf[..frame.len()].copy_from_slice(&frame);
        let p = Packet::parse_with_capacity(&mut buf, frame.len(), PacketMeta::default()).unwrap();
        assert_eq!(p.data(), &frame[..]);
        assert_eq!((p.len(), p.capacity()), (frame.len(), 256));
        assert_eq!(p.payload(), b"hello");
        let mut short = [0u8; 8];
        assert_eq!(
            Packet::parse_with_capacity(&mut short, 9, PacketMeta::default()).unwrap_err(),
            ParseError::LengthBeyondBuffer
        );
        // `parse` keeps working and has no room to grow.
        let mut b = udp4(b"x");
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!(p.capacity(), p.len());
        let len = p.len();
        assert_eq!(
            p.resize(len + 1),
            Err(ResizeError::BeyondCapacity {
                requested: len + 1,
                capacity: len
            })
        );
    }

    #[test]
    fn resize_grows_zeroed_shrinks_and_refuses_beyond_capacity() {
        let frame = udp4(b"abc");
        let mut buf = [0xeeu8; 128];
        buf[..frame.len()].copy_from_slice(&frame);
        let mut p =
            Packet::parse_with_capacity(&mut buf, frame.len(), PacketMeta::default()).unwrap();
        p.resize(frame.len() + 10).unwrap();
        assert_eq!(p.len(), frame.len() + 10);
        assert_eq!(
            &p.data()[frame.len()..],
            &[0u8; 10],
            "grown bytes are zeroed"
        );
        assert_eq!(&p.data()[..frame.len()], &frame[..]);
        assert_eq!(p.payload(), b"abc", "offsets unchanged until reparse");
        assert_eq!(
            p.resize(129),
            Err(ResizeError::BeyondCapacity {
                requested: 129,
                capacity: 128
            })
        );
        assert_eq!(
            p.len(),
            frame.len() + 10,
            "a refused resize changes nothing"
        );
        p.resize(20).unwrap();
        assert_eq!(p.data(), &frame[..20]);
        // Accessors stay total on a frame shorter than its stale offsets.
        let _ = (p.payload(), p.flow_key(), p.udp(), p.ipv4());
        let _ = p.payload_mut().len();
        p.resize(128).unwrap();
        assert!(p.data()[20..].iter().all(|&b| b == 0));
    }

    #[test]
    fn reparse_follows_rewritten_headers() {
        let frame = udp4(b"abc");
        let mut buf = [0u8; 128];
        buf[..frame.len()].copy_from_slice(&frame);
        let mut p =
            Packet::parse_with_capacity(&mut buf, frame.len(), PacketMeta::default()).unwrap();
        // Rewrite the whole frame as a longer TCP packet.
        let mut tcp = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 9], [10, 0, 0, 8], 64)
            .tcp(1, 2, 3, 4)
            .write(&mut tcp, b"longer payload")
            .unwrap();
        p.resize(tcp.len()).unwrap();
        p.data_mut().copy_from_slice(&tcp);
        p.reparse().unwrap();
        assert_eq!(p.l4_kind(), L4Kind::Tcp);
        assert_eq!(p.payload(), b"longer payload");
        assert_eq!(p.ports(), Some((1, 2)));
        // A rewrite into garbage is an error and keeps the old offsets.
        p.data_mut()[14] = 0x41;
        assert_eq!(p.reparse(), Err(ParseError::BadIhl));
        assert_eq!(p.l4_kind(), L4Kind::Tcp);
    }

    #[test]
    fn never_panics_on_prefixes_and_garbage() {
        let good = udp4(b"some payload bytes");
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            let _ = Packet::parse(&mut b, PacketMeta::default());
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 120) as usize;
            let mut b: Vec<u8> = (0..len).map(|i| (seed >> (i % 56)) as u8).collect();
            if b.len() > 13 {
                b[12] = 0x08;
                b[13] = if seed & 1 == 0 { 0x00 } else { 0xdd };
            }
            if let Ok(p) = Packet::parse(&mut b, PacketMeta::default()) {
                let _ = (
                    p.payload(),
                    p.flow_key(),
                    p.dscp(),
                    p.tcp(),
                    p.udp(),
                    p.sctp(),
                );
            }
        }
    }
}
