//! Values that policies are written in: IP prefixes, L4 port ranges, MAC addresses and
//! IP protocols, parsed from the text of a policy file and checked once.
//!
//! * [`IpPrefix`] — an IPv4 or IPv6 prefix with no host bits set (`"10.0.0.0/16"`,
//!   `"2001:db8::/32"`, a bare address for a host). Tests membership of an [`IpAddr`]
//!   ([`IpPrefix::contains`]) or of a [`FlowKey`](crate::FlowKey)'s address in its own
//!   family ([`IpPrefix::contains_flow_src`], [`IpPrefix::contains_flow_dst`]).
//! * [`PortRange`] — an inclusive port range (`80`, `"5000-5099"`) that can split itself
//!   into aligned power-of-two blocks for mask-based lookup tables
//!   ([`PortRange::prefixes`]).
//! * [`MacAddr`] / [`parse_mac`] — `aa:bb:cc:dd:ee:ff` (or with `-`).
//! * [`parse_protocol`] — `tcp`, `udp`, `icmp`, `icmpv6`, `sctp`, `gre`, `esp` or a
//!   number.
//! * [`NumOrName`] — a policy field written as a number or as text, kept as written so
//!   that `init` can validate it and name the field in its [`InitError`](crate::InitError).
//!
//! `IpPrefix`, `PortRange` and `MacAddr` also deserialize (serde) from the same text
//! (and `PortRange` from a bare number), for policies that take them directly.
//!
//! What this module does not do: it has no wildcard keyword (`any`) — a policy field
//! that may be omitted is an `Option`, and an NF that accepts `any` says so itself —
//! and its parsers take the text exactly: no surrounding blanks, no `+` signs, no
//! abbreviations. Every function is total: bad input gives a [`PolicyValueError`] whose
//! message quotes the value, never a panic. Nothing here allocates except the error
//! values and [`PortRange::prefixes`].
//!
//! ```
//! use buffet_sdk::policy::{parse_mac, parse_protocol, IpPrefix, PortRange};
//!
//! let net: IpPrefix = "10.7.0.0/16".parse()?;
//! assert!(net.contains("10.7.3.4".parse()?));
//! assert!(!net.contains("2001:db8::1".parse()?)); // an IPv4 prefix holds only IPv4
//! assert!("10.7.0.1/16".parse::<IpPrefix>().is_err()); // host bits set
//!
//! let web: PortRange = "8000-8191".parse()?;
//! assert!(web.contains(8080));
//! // 8000-8063 (the top 10 bits of 8000) and 8064-8191 (the top 9 bits of 8064).
//! assert_eq!(web.prefixes(), [(8000, 10), (8064, 9)]);
//!
//! assert_eq!(parse_mac("02-00-00-00-00-0A")?, [2, 0, 0, 0, 0, 10]);
//! assert_eq!(parse_protocol("udp")?, 17);
//! assert_eq!(parse_protocol("47")?, 47);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// Why a policy value does not parse. Each message quotes the offending value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyValueError {
    /// Not an IPv4 or IPv6 address (the address part of a prefix).
    #[error("`{0}` is not an IPv4 or IPv6 address")]
    BadAddress(String),
    /// The prefix length (after `/`) is not a decimal number.
    #[error("the prefix length in `{0}` is not a number")]
    BadPrefixLength(String),
    /// The prefix length exceeds the address width.
    #[error("prefix length {len} exceeds {max}")]
    PrefixTooLong {
        /// The length given (saturated at `u32::MAX`).
        len: u32,
        /// 32 or 128.
        max: u8,
    },
    /// Bits beyond the prefix length are set in the address.
    #[error("`{prefix}` has host bits set beyond the prefix length (the network is {network})")]
    HostBitsSet {
        /// The prefix as given.
        prefix: String,
        /// The network it is in: the address with the host bits cleared.
        network: IpPrefix,
    },
    /// Not a port or a `lo-hi` port range.
    #[error("`{0}` is not a port or a port range (80, 5000-5099)")]
    BadPort(String),
    /// A port number outside `0..=65535`.
    #[error("port {0} is not in 0..=65535")]
    PortOutOfRange(i64),
    /// A port range whose low end is above its high end.
    #[error("empty port range {lo}-{hi} (low end above high end)")]
    EmptyPortRange {
        /// Low end.
        lo: u16,
        /// High end.
        hi: u16,
    },
    /// Not six two-digit hexadecimal bytes separated by `:` or `-`.
    #[error("`{0}` is not a MAC address (aa:bb:cc:dd:ee:ff)")]
    BadMac(String),
    /// Neither a known protocol name nor a number.
    #[error("unknown protocol `{0}` (tcp, udp, icmp, icmpv6, sctp, gre, esp or 0..=255)")]
    UnknownProtocol(String),
    /// A protocol number outside `0..=255`.
    #[error("protocol number {0} is not in 0..=255")]
    ProtocolOutOfRange(i64),
}

// ---------------------------------------------------------------------------------------
// IpPrefix

/// An IPv4 or IPv6 prefix with no host bits set. Parses from `"10.0.0.0/16"`,
/// `"2001:db8::/32"`, or a bare address (a host prefix: `/32` or `/128`).
///
/// A prefix has one IP version: `0.0.0.0/0` holds every IPv4 address and no IPv6 one.
/// Internally the address is kept in the IPv4-mapped IPv6 space (`::ffff:a.b.c.d`) that
/// [`FlowKey`](crate::FlowKey) uses, so [`contains_mapped`](Self::contains_mapped) is
/// one mask and one compare.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    /// The network address, IPv4 mapped into `::ffff:0:0/96`.
    bits: u128,
    /// Prefix length within the address family (0..=32 or 0..=128).
    len: u8,
    v4: bool,
}

/// The top `len` bits of 128.
const fn mask128(len: u32) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    }
}

/// `ip` in the IPv4-mapped IPv6 space, as a number.
fn mapped128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from_be_bytes(a.to_ipv6_mapped().octets()),
        IpAddr::V6(a) => u128::from_be_bytes(a.octets()),
    }
}

impl IpPrefix {
    /// A prefix of `len` bits; fails when `len` exceeds the address width (32 or 128) or
    /// `addr` has bits set beyond `len`.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, PolicyValueError> {
        let v4 = addr.is_ipv4();
        let max = if v4 { 32 } else { 128 };
        if len > max {
            return Err(PolicyValueError::PrefixTooLong {
                len: u32::from(len),
                max,
            });
        }
        let given = IpPrefix {
            bits: mapped128(addr),
            len,
            v4,
        };
        let mask = given.mapped_mask();
        if given.bits & !mask != 0 {
            return Err(PolicyValueError::HostBitsSet {
                prefix: given.to_string(),
                network: IpPrefix {
                    bits: given.bits & mask,
                    ..given
                },
            });
        }
        Ok(given)
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        if self.v4 {
            IpAddr::V4(Ipv4Addr::from_bits(self.bits as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from_bits(self.bits))
        }
    }

    /// The prefix length in bits, within the address family (an IPv4 `/24` is 24).
    pub fn len(&self) -> u8 {
        self.len
    }

    /// True for a zero-length prefix (holds every address of its version).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True for an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.v4
    }

    /// Whether `ip` falls in the prefix. An address of the other IP version never does
    /// (`::ffff:10.0.0.1` is IPv6, so not in `10.0.0.0/8`).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.v4 && mapped128(ip) & self.mapped_mask() == self.bits
    }

    /// Whether `addr`, in the IPv4-mapped 128-bit form of [`FlowKey`](crate::FlowKey)
    /// (IPv4 as `::ffff:a.b.c.d`), falls in the prefix. The 16 bytes alone do not keep the
    /// IP version, so an IPv4 prefix also holds the IPv6 address `::ffff:a.b.c.d` of one
    /// of its IPv4 addresses: to match a packet, use [`contains_flow_src`] /
    /// [`contains_flow_dst`] (or [`contains`](Self::contains) with
    /// [`FlowKey::src_addr`](crate::FlowKey::src_addr)), or match the version separately,
    /// as a mask-based table does with [`mapped_mask`](Self::mapped_mask) /
    /// [`mapped_bits`](Self::mapped_bits) and [`is_ipv4`](Self::is_ipv4).
    ///
    /// [`contains_flow_src`]: Self::contains_flow_src
    /// [`contains_flow_dst`]: Self::contains_flow_dst
    #[inline]
    pub fn contains_mapped(&self, addr: &[u8; 16]) -> bool {
        u128::from_be_bytes(*addr) & self.mapped_mask() == self.bits
    }

    /// Whether the source address of `key` falls in the prefix, in the key's own address
    /// family: an IPv4 prefix never holds an IPv6 source, not even `::ffff:a.b.c.d`.
    #[inline]
    pub fn contains_flow_src(&self, key: &crate::FlowKey) -> bool {
        self.in_family(key.l3) && self.contains_mapped(&key.src)
    }

    /// Whether the destination address of `key` falls in the prefix, in the key's own
    /// address family.
    #[inline]
    pub fn contains_flow_dst(&self, key: &crate::FlowKey) -> bool {
        self.in_family(key.l3) && self.contains_mapped(&key.dst)
    }

    #[inline]
    fn in_family(&self, l3: crate::L3Kind) -> bool {
        self.v4 == (l3 == crate::L3Kind::Ipv4)
    }

    /// The prefix length in the mapped 128-bit space (an IPv4 `/24` is 120).
    pub fn mapped_len(&self) -> u8 {
        if self.v4 {
            self.len + 96
        } else {
            self.len
        }
    }

    /// The network address in the mapped 128-bit space, as a number (the value half of
    /// a (mask, value) pair).
    pub fn mapped_bits(&self) -> u128 {
        self.bits
    }

    /// The mask of [`mapped_len`](Self::mapped_len) leading ones (the mask half).
    #[inline]
    pub fn mapped_mask(&self) -> u128 {
        mask128(u32::from(self.mapped_len()))
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.len)
    }
}

impl fmt::Debug for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpPrefix({self})")
    }
}

impl FromStr for IpPrefix {
    type Err = PolicyValueError;

    fn from_str(s: &str) -> Result<Self, PolicyValueError> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| PolicyValueError::BadAddress(a.to_string()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => {
                if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(PolicyValueError::BadPrefixLength(s.to_string()));
                }
                match l.parse::<u8>() {
                    Ok(n) => n,
                    // All digits but more than a u8: certainly too long.
                    Err(_) => {
                        let len = l.parse::<u32>().unwrap_or(u32::MAX);
                        return Err(PolicyValueError::PrefixTooLong { len, max });
                    }
                }
            }
        };
        IpPrefix::new(addr, len)
    }
}

/// Deserializes a `T` from a string with its `FromStr`; `.0` says what is expected.
struct FromStrVisitor<T>(&'static str, PhantomData<T>);

impl<T: FromStr<Err = PolicyValueError>> Visitor<'_> for FromStrVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for IpPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(FromStrVisitor(
            "an IP prefix such as \"10.0.0.0/16\" or \"2001:db8::/32\"",
            PhantomData,
        ))
    }
}

// ---------------------------------------------------------------------------------------
// PortRange

/// An inclusive L4 port range. Parses from `"80"` or `"5000-5099"`; deserializes from
/// those or from a number.
///
/// The fields are public, so a range built by hand may be empty (`lo > hi`);
/// [`validate`](Self::validate) says so. Parsed ranges never are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// Lowest port matched.
    pub lo: u16,
    /// Highest port matched.
    pub hi: u16,
}

impl PortRange {
    /// Every port, `0-65535`.
    pub const ALL: PortRange = PortRange {
        lo: 0,
        hi: u16::MAX,
    };

    /// `lo..=hi`; fails when `lo > hi`.
    pub fn new(lo: u16, hi: u16) -> Result<Self, PolicyValueError> {
        let r = PortRange { lo, hi };
        r.validate()?;
        Ok(r)
    }

    /// Exactly one port.
    pub const fn single(port: u16) -> Self {
        PortRange { lo: port, hi: port }
    }

    /// One port given as a policy number; fails outside `0..=65535`.
    pub fn from_number(n: i64) -> Result<Self, PolicyValueError> {
        u16::try_from(n)
            .map(PortRange::single)
            .map_err(|_| PolicyValueError::PortOutOfRange(n))
    }

    /// Whether `port` is in the range.
    #[inline]
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }

    /// Fails for an empty range (`lo > hi`).
    pub fn validate(&self) -> Result<(), PolicyValueError> {
        if self.lo > self.hi {
            return Err(PolicyValueError::EmptyPortRange {
                lo: self.lo,
                hi: self.hi,
            });
        }
        Ok(())
    }

    /// The range as aligned power-of-two blocks `(value, prefix length)`, the fewest
    /// that cover it exactly (range-to-prefix expansion; at most 30 for 16-bit ports).
    /// A port `p` is in block `(v, l)` when its top `l` bits equal `v`'s. Empty for an
    /// empty range.
    pub fn prefixes(&self) -> Vec<(u16, u8)> {
        let mut out = Vec::new();
        let (mut lo, hi) = (u32::from(self.lo), u32::from(self.hi));
        while lo <= hi {
            // The largest aligned block starting at `lo` that stays within `hi`.
            let mut k = if lo == 0 {
                16
            } else {
                lo.trailing_zeros().min(16)
            };
            while lo + (1 << k) - 1 > hi {
                k -= 1;
            }
            out.push((lo as u16, 16 - k as u8));
            lo += 1 << k;
        }
        out
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl FromStr for PortRange {
    type Err = PolicyValueError;

    fn from_str(s: &str) -> Result<Self, PolicyValueError> {
        let port = |p: &str| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(PolicyValueError::BadPort(s.to_string()));
            }
            p.parse::<u16>()
                .map_err(|_| PolicyValueError::BadPort(s.to_string()))
        };
        match s.split_once('-') {
            None => Ok(PortRange::single(port(s)?)),
            Some((lo, hi)) => PortRange::new(port(lo)?, port(hi)?),
        }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortRange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port (80) or a port range (\"5000-5099\")")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortRange, E> {
                PortRange::from_number(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortRange, E> {
                PortRange::from_number(i64::try_from(v).unwrap_or(i64::MAX)).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PortRange, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------
// MAC addresses

/// An Ethernet MAC address. Parses from `aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff` (any
/// case; see [`parse_mac`]); displays as lower-case `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

/// Parses a MAC address: six two-digit hexadecimal bytes (any case) separated by `:` or
/// `-`.
pub fn parse_mac(text: &str) -> Result<[u8; 6], PolicyValueError> {
    let bad = || PolicyValueError::BadMac(text.to_string());
    let mut mac = [0u8; 6];
    let mut parts = text.split([':', '-']);
    for b in &mut mac {
        let p = parts.next().ok_or_else(bad)?;
        if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

impl FromStr for MacAddr {
    type Err = PolicyValueError;

    fn from_str(s: &str) -> Result<Self, PolicyValueError> {
        parse_mac(s).map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(b: [u8; 6]) -> Self {
        MacAddr(b)
    }
}

impl From<MacAddr> for [u8; 6] {
    fn from(m: MacAddr) -> Self {
        m.0
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(FromStrVisitor(
            "a MAC address such as \"02:00:00:00:00:01\"",
            PhantomData,
        ))
    }
}

// ---------------------------------------------------------------------------------------
// IP protocols

/// Parses an IP protocol: a name (any case) — `tcp` 6, `udp` 17, `icmp` 1, `icmpv6` (or
/// `ipv6-icmp`) 58, `sctp` 132, `gre` 47, `esp` 50 — or a decimal number 0..=255.
pub fn parse_protocol(text: &str) -> Result<u8, PolicyValueError> {
    const NAMES: [(&str, u8); 8] = [
        ("tcp", 6),
        ("udp", 17),
        ("icmp", 1),
        ("icmpv6", 58),
        ("ipv6-icmp", 58),
        ("sctp", 132),
        ("gre", 47),
        ("esp", 50),
    ];
    if let Some(&(_, n)) = NAMES.iter().find(|(n, _)| text.eq_ignore_ascii_case(n)) {
        return Ok(n);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u8>().map_err(|_| {
            PolicyValueError::ProtocolOutOfRange(text.parse::<i64>().unwrap_or(i64::MAX))
        });
    }
    Err(PolicyValueError::UnknownProtocol(text.to_string()))
}

// ---------------------------------------------------------------------------------------
// NumOrName

/// A policy field written as a number or as text (`proto = 6` or `proto = "tcp"`,
/// `dst_port = 80` or `dst_port = "80-90"`), kept as written. Deserialize a policy
/// field into it and convert it in `init`, where the error can name the field:
///
/// ```
/// use buffet_sdk::policy::NumOrName;
/// use buffet_sdk::InitError;
///
/// #[derive(serde::Deserialize)]
/// struct Policy { proto: NumOrName }
///
/// let p: Policy = serde_json::from_str(r#"{ "proto": "udp" }"#).unwrap();
/// assert_eq!(p.proto.protocol(), Ok(17));
/// let p: Policy = serde_json::from_str(r#"{ "proto": 256 }"#).unwrap();
/// let e = p.proto.protocol().map_err(|e| InitError::invalid("proto", e.to_string()));
/// assert!(e.unwrap_err().to_string().contains("proto"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum NumOrName {
    /// A number.
    Num(i64),
    /// A name, or a range, written as text.
    Name(String),
}

impl NumOrName {
    /// The value as an IP protocol number ([`parse_protocol`] for text).
    pub fn protocol(&self) -> Result<u8, PolicyValueError> {
        match self {
            NumOrName::Num(n) => {
                u8::try_from(*n).map_err(|_| PolicyValueError::ProtocolOutOfRange(*n))
            }
            NumOrName::Name(s) => parse_protocol(s),
        }
    }

    /// The value as a port range: a number is one port, text parses as a [`PortRange`].
    pub fn port_range(&self) -> Result<PortRange, PolicyValueError> {
        match self {
            NumOrName::Num(n) => PortRange::from_number(*n),
            NumOrName::Name(s) => s.parse(),
        }
    }
}

impl fmt::Display for NumOrName {
    /// The value as written (text without quotes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumOrName::Num(n) => write!(f, "{n}"),
            NumOrName::Name(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn mapped(s: &str) -> [u8; 16] {
        match ip(s) {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        }
    }

    #[test]
    fn prefixes_parse_and_reject() {
        let p: IpPrefix = "10.0.0.0/16".parse().unwrap();
        assert_eq!((p.addr(), p.len()), (ip("10.0.0.0"), 16));
        assert_eq!(p.to_string(), "10.0.0.0/16");
        let p: IpPrefix = "2001:db8::/32".parse().unwrap();
        assert!(!p.is_ipv4());
        assert!(p.contains(ip("2001:db8::1")));
        assert!(!p.contains(ip("2001:db9::1")));
        assert_eq!("10.1.2.3".parse::<IpPrefix>().unwrap().len(), 32);
        assert_eq!("::1".parse::<IpPrefix>().unwrap().len(), 128);
        assert_eq!("0.0.0.0/0".parse::<IpPrefix>().unwrap().len(), 0);
        let e = "10.0.0.1/16".parse::<IpPrefix>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "`10.0.0.1/16` has host bits set beyond the prefix length (the network is 10.0.0.0/16)"
        );
        assert_eq!(
            "2001:db8::1/32".parse::<IpPrefix>().unwrap_err(),
            PolicyValueError::HostBitsSet {
                prefix: "2001:db8::1/32".into(),
                network: "2001:db8::/32".parse().unwrap(),
            }
        );
        assert_eq!(
            "10.0.0.0/33".parse::<IpPrefix>().unwrap_err(),
            PolicyValueError::PrefixTooLong { len: 33, max: 32 }
        );
        assert_eq!(
            "::/129".parse::<IpPrefix>().unwrap_err(),
            PolicyValueError::PrefixTooLong { len: 129, max: 128 }
        );
        assert_eq!(
            "::/999".parse::<IpPrefix>(),
            Err(PolicyValueError::PrefixTooLong { len: 999, max: 128 })
        );
        assert!(matches!(
            "::/99999999999".parse::<IpPrefix>(),
            Err(PolicyValueError::PrefixTooLong { max: 128, .. })
        ));
        for bad in [
            "",
            "foo",
            "host",
            "any",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "1.2.3.4 /8",
            " 10.0.0.0/8",
            "300.0.0.0/8",
        ] {
            assert!(
                matches!(
                    bad.parse::<IpPrefix>(),
                    Err(PolicyValueError::BadAddress(_))
                ),
                "{bad}"
            );
        }
        for bad in ["10.0.0.0/", "10.0.0.0/x", "10.0.0.0/-1", "10.0.0.0/+8"] {
            assert!(
                matches!(
                    bad.parse::<IpPrefix>(),
                    Err(PolicyValueError::BadPrefixLength(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            IpPrefix::new(ip("10.0.0.0"), 33),
            Err(PolicyValueError::PrefixTooLong { len: 33, max: 32 })
        );
        assert_eq!(IpPrefix::new(ip("10.0.0.0"), 8), "10.0.0.0/8".parse());
    }

    #[test]
    fn prefixes_in_the_mapped_space() {
        let p: IpPrefix = "192.168.0.0/16".parse().unwrap();
        assert_eq!(p.mapped_len(), 112);
        assert_eq!(p.to_string(), "192.168.0.0/16");
        assert!(p.contains_mapped(&Ipv4Addr::new(192, 168, 9, 9).to_ipv6_mapped().octets()));
        assert!(!p.contains_mapped(&Ipv4Addr::new(192, 169, 0, 1).to_ipv6_mapped().octets()));
        assert_eq!(
            "2001:db8::/32".parse::<IpPrefix>().unwrap().to_string(),
            "2001:db8::/32"
        );
        assert_eq!("10.0.0.1".parse::<IpPrefix>().unwrap().mapped_len(), 128);
        // An IPv4 /0 is ::ffff:0:0/96: every IPv4 address, no native IPv6 one.
        let all4: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert_eq!(all4.mapped_len(), 96);
        assert!(all4.contains_mapped(&mapped("8.8.8.8")));
        assert!(!all4.contains_mapped(&mapped("2001:db8::1")));
        assert_eq!(all4.mapped_bits(), u128::from_be_bytes(mapped("0.0.0.0")));
        assert_eq!(all4.mapped_mask(), !0u128 << 32);
        // The mapped form drops the version; contains() keeps it.
        let ten: IpPrefix = "10.0.0.0/8".parse().unwrap();
        assert!(ten.contains_mapped(&mapped("::ffff:10.1.0.1")));
        assert!(!ten.contains(ip("::ffff:10.1.0.1")));
        assert!(ten.contains(ip("10.1.0.1")));
        // A FlowKey keeps the family: so do contains_flow_src/dst.
        let key = |s: &str, d: &str| crate::FlowKey::new(ip(s), ip(d), 17, 1, 2).unwrap();
        assert!(ten.contains_flow_src(&key("10.1.0.1", "192.0.2.1")));
        assert!(!ten.contains_flow_dst(&key("10.1.0.1", "192.0.2.1")));
        assert!(ten.contains_flow_dst(&key("192.0.2.1", "10.1.0.1")));
        assert!(!ten.contains_flow_src(&key("::ffff:10.1.0.1", "::1")));
        assert!(!ten.contains_flow_dst(&key("::1", "::ffff:10.1.0.1")));
        let mapped96: IpPrefix = "::ffff:0:0/96".parse().unwrap();
        assert!(mapped96.contains_flow_src(&key("::ffff:10.1.0.1", "::1")));
        assert!(!mapped96.contains_flow_src(&key("10.1.0.1", "10.0.0.2")));
        let all6: IpPrefix = "::/0".parse().unwrap();
        assert_eq!((all6.mapped_len(), all6.mapped_mask()), (0, 0));
        assert!(all6.contains_mapped(&mapped("10.0.0.1")));
        assert!(!all6.contains(ip("10.0.0.1")));
        for s in [
            "10.0.0.0/8",
            "10.1.2.3",
            "::/0",
            "fe80::/10",
            "::ffff:0:0/96",
        ] {
            let p: IpPrefix = s.parse().unwrap();
            assert_eq!(IpPrefix::new(p.addr(), p.len()), Ok(p), "{s}");
            assert_eq!(p.to_string().parse::<IpPrefix>(), Ok(p), "{s}");
        }
    }

    /// Whether `port` is in the block `(v, l)` of [`PortRange::prefixes`].
    fn in_block(port: u16, (v, l): (u16, u8)) -> bool {
        let mask = if l == 0 { 0 } else { u16::MAX << (16 - l) };
        port & mask == v
    }

    #[test]
    fn port_ranges_parse_and_expand() {
        assert_eq!("80".parse::<PortRange>(), Ok(PortRange::single(80)));
        assert_eq!(
            "5000-5099".parse::<PortRange>(),
            Ok(PortRange { lo: 5000, hi: 5099 })
        );
        assert_eq!(
            "99-5".parse::<PortRange>(),
            Err(PolicyValueError::EmptyPortRange { lo: 99, hi: 5 })
        );
        for bad in ["", "x", "70000", "-5", "5-", "1-2-3", " 80", "+80", "any"] {
            assert!(
                matches!(bad.parse::<PortRange>(), Err(PolicyValueError::BadPort(_))),
                "{bad}"
            );
        }
        assert_eq!(
            PortRange::from_number(70000),
            Err(PolicyValueError::PortOutOfRange(70000))
        );
        assert_eq!(
            PortRange::from_number(-1).unwrap_err().to_string(),
            "port -1 is not in 0..=65535"
        );
        assert_eq!(PortRange::ALL.prefixes(), [(0, 0)]);
        assert_eq!(PortRange { lo: 0, hi: 65535 }.prefixes(), [(0, 0)]);
        assert_eq!(PortRange::single(80).prefixes(), [(80, 16)]);
        assert_eq!(PortRange::single(65535).prefixes(), [(65535, 16)]);
        assert_eq!(PortRange { lo: 0, hi: 1023 }.prefixes(), [(0, 6)]);
        assert_eq!(
            PortRange {
                lo: 1024,
                hi: 65535
            }
            .prefixes()
            .len(),
            6
        );
        assert_eq!(
            PortRange {
                lo: 32768,
                hi: 65535
            }
            .prefixes(),
            [(32768, 1)]
        );
        assert!(PortRange { lo: 9, hi: 8 }.prefixes().is_empty());
        // 1-65534 is the worst case: 15 blocks growing up to 32768, 15 shrinking.
        assert_eq!(PortRange { lo: 1, hi: 65534 }.prefixes().len(), 30);
        // Exact cover, by brute force, for edge and random ranges.
        let mut seed = 99u64;
        let mut ranges = vec![
            (0, 0),
            (0, 1),
            (3, 17),
            (100, 1000),
            (0, 65535),
            (1, 65534),
            (1, 1),
            (65535, 65535),
            (5000, 5099),
        ];
        for _ in 0..16 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let (a, b) = (seed as u16, (seed >> 16) as u16);
            ranges.push((a.min(b), a.max(b)));
        }
        for (lo, hi) in ranges {
            let pieces = PortRange { lo, hi }.prefixes();
            assert!(pieces.len() <= 30);
            for port in 0..=u16::MAX {
                let hits = pieces.iter().filter(|&&b| in_block(port, b)).count();
                assert_eq!(
                    hits,
                    usize::from((lo..=hi).contains(&port)),
                    "{lo}-{hi} at {port}"
                );
            }
        }
    }

    #[test]
    fn port_range_contains_validates_and_displays() {
        let r = PortRange::new(1000, 2000).unwrap();
        assert!(r.contains(1000) && r.contains(2000) && !r.contains(999) && !r.contains(2001));
        assert_eq!(r.to_string(), "1000-2000");
        assert_eq!(PortRange::single(53).to_string(), "53");
        assert_eq!(
            PortRange { lo: 9, hi: 8 }.validate(),
            Err(PolicyValueError::EmptyPortRange { lo: 9, hi: 8 })
        );
        assert_eq!(
            PortRange::new(9, 8).unwrap_err().to_string(),
            "empty port range 9-8 (low end above high end)"
        );
    }

    #[test]
    fn macs_parse_and_reject() {
        assert_eq!(parse_mac("02:00:00:00:00:01"), Ok([2, 0, 0, 0, 0, 1]));
        assert_eq!(parse_mac("02-00-00-00-00-0A"), Ok([2, 0, 0, 0, 0, 10]));
        assert_eq!(parse_mac("ff:FF:ff:ff:ff:ff"), Ok([0xff; 6]));
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:01:02",
            "02:00:00:00:00:zz",
            "2:0:0:0:0:1",
            "002:00:00:00:00:01",
            "+2:00:00:00:00:01",
            " 02:00:00:00:00:01",
            "02:00:00:00:00:01:",
        ] {
            assert_eq!(
                parse_mac(bad),
                Err(PolicyValueError::BadMac(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_mac("zz").unwrap_err().to_string(),
            "`zz` is not a MAC address (aa:bb:cc:dd:ee:ff)"
        );
        let m: MacAddr = "02-00-00-00-00-0A".parse().unwrap();
        assert_eq!(m.to_string(), "02:00:00:00:00:0a");
        assert_eq!(<[u8; 6]>::from(m), [2, 0, 0, 0, 0, 10]);
        assert_eq!(MacAddr::from([0xff; 6]).to_string(), "ff:ff:ff:ff:ff:ff");
    }

    #[test]
    fn protocols_by_name_or_number() {
        for (name, n) in [
            ("tcp", 6),
            ("UDP", 17),
            ("icmp", 1),
            ("icmpv6", 58),
            ("ipv6-icmp", 58),
            ("sctp", 132),
            ("gre", 47),
            ("esp", 50),
            ("0", 0),
            ("255", 255),
        ] {
            assert_eq!(parse_protocol(name), Ok(n), "{name}");
        }
        assert_eq!(
            parse_protocol("256"),
            Err(PolicyValueError::ProtocolOutOfRange(256))
        );
        for bad in ["", "tcpp", "any", " tcp", "-1", "+6"] {
            assert_eq!(
                parse_protocol(bad),
                Err(PolicyValueError::UnknownProtocol(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(NumOrName::Num(6).protocol(), Ok(6));
        assert_eq!(
            NumOrName::Num(300).protocol(),
            Err(PolicyValueError::ProtocolOutOfRange(300))
        );
        assert_eq!(NumOrName::Name("esp".into()).protocol(), Ok(50));
        assert_eq!(NumOrName::Num(80).port_range(), Ok(PortRange::single(80)));
        assert_eq!(
            NumOrName::Name("80-90".into()).port_range(),
            Ok(PortRange { lo: 80, hi: 90 })
        );
        assert_eq!(
            NumOrName::Num(65536).port_range(),
            Err(PolicyValueError::PortOutOfRange(65536))
        );
        assert_eq!(NumOrName::Name("80-90".into()).to_string(), "80-90");
    }

    #[test]
    fn values_deserialize_from_policy_text() {
        #[derive(Deserialize, Debug)]
        struct P {
            net: IpPrefix,
            port: PortRange,
            range: PortRange,
            mac: MacAddr,
            proto: NumOrName,
        }
        let p: P = serde_json::from_str(
            r#"{ "net": "2001:db8::/32", "port": 443, "range": "1024-65535",
                 "mac": "02:00:00:00:00:01", "proto": "tcp" }"#,
        )
        .unwrap();
        assert_eq!(p.net, "2001:db8::/32".parse().unwrap());
        assert_eq!(p.port, PortRange::single(443));
        assert_eq!(
            p.range,
            PortRange {
                lo: 1024,
                hi: 65535
            }
        );
        assert_eq!(p.mac, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(p.proto.protocol(), Ok(6));
        for (json, needle) in [(r#""10.0.0.1/8""#, "host bits"), (r#"7"#, "IP prefix")] {
            let e = serde_json::from_str::<IpPrefix>(json)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{json}: {e}");
        }
        for (json, needle) in [
            (r#"70000"#, "port 70000"),
            (r#"-1"#, "port -1"),
            (r#""90-80""#, "empty port range 90-80"),
            (r#"true"#, "port range"),
        ] {
            let e = serde_json::from_str::<PortRange>(json)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{json}: {e}");
        }
        let e = serde_json::from_str::<MacAddr>(r#""02:00""#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a MAC address"), "{e}");
    }
}
