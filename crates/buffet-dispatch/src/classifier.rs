//! Traffic Classifier: OpenFlow-like prioritised rules -> tenant.
//!
//! A [`Rule`] matches any subset of: in-port, source/destination MAC, VLAN id,
//! source/destination IP prefix (IPv4 or IPv6), IP protocol, source/destination L4 port
//! range, DSCP. Lower `priority` wins; among rules of equal priority the one inserted
//! first wins. A packet no rule matches classifies to `None`. Prefixes and port ranges
//! are [`buffet_sdk::policy`]'s [`IpPrefix`] and [`PortRange`], re-exported here.
//!
//! How: every packet is reduced once to a fixed-width key (in-port, MACs, VLAN, IP
//! version, both addresses as 128 bits with IPv4 mapped into `::ffff:0:0/96`, protocol,
//! ports, DSCP, and presence bits for the VLAN tag and the ports). The IP version bit is
//! what keeps IPv4 `a.b.c.d` and IPv6 `::ffff:a.b.c.d` apart: every rule with a prefix
//! matches on it. Each rule becomes one
//! or more (mask, value) pairs over that key — a port range is expanded into aligned
//! power-of-two blocks (range-to-prefix expansion), so `1-65534` costs 30 pairs per port
//! field, and a rule with both port ranges costs their product. The pairs go into a
//! [`buffet_sdk::tss::TupleSpace`], the SDK's tuple-space search: pairs sharing
//! a mask form a *tuple*, a hash map from masked key to the best rule with that value,
//! where "best" is the lowest (priority, insertion sequence). Tuples are kept sorted by
//! the best rule they hold, so a search stops as soon as no remaining tuple can beat what
//! it already found.
//!
//! In front of the tuples sits an exact-match cache: a fixed, direct-mapped table
//! keyed by the full packet key (hit: one hash, one compare). It is allocated once,
//! invalidated in O(1) by a generation number on every rule change, and used only by
//! [`Classifier::classify`] (which therefore takes `&mut self`);
//! [`Classifier::lookup`] is the same search through `&self`, without the cache.
//!
//! Neither path allocates or panics. Semantics worth knowing:
//! * a rule with an IP prefix matches only packets of that IP version;
//! * a rule with a port range matches only packets with ports (TCP, UDP or SCTP, first
//!   fragment), so `0-65535` means "any TCP, UDP or SCTP port"; a port range with a
//!   protocol that has no ports is refused ([`RuleError::PortsNeedPortProtocol`]);
//! * a rule with a VLAN id matches only tagged frames with that id;
//! * IPv6's protocol is the first next-header (extension headers are not skipped).
//!
//! The maps use Fx hashing (fast, unkeyed); the keys in them come from admitted rules,
//! packets only probe them.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use buffet_sdk::policy::PolicyValueError;
use buffet_sdk::tss::{MaskedKey, TupleSpace};
use buffet_sdk::{L3Kind, Packet};
use rustc_hash::{FxBuildHasher, FxHashMap};

use crate::TenantSlot;

/// The prefix and port-range types of rules are the SDK's policy values; their parse
/// errors convert into [`RuleError`].
pub use buffet_sdk::policy::{IpPrefix, PortRange};

/// Why a rule (or a prefix / port range in one) is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Not an IPv4 or IPv6 address.
    #[error("bad IP address {0:?}")]
    BadAddress(String),
    /// The prefix length is not a number.
    #[error("bad prefix length in {0:?}")]
    BadPrefixLength(String),
    /// The prefix length exceeds the address width.
    #[error("prefix length {len} exceeds {max}")]
    PrefixTooLong {
        /// The length given.
        len: u8,
        /// 32 or 128.
        max: u8,
    },
    /// Bits beyond the prefix length are set.
    #[error("{0} has host bits set")]
    HostBitsSet(String),
    /// Not a port or `lo-hi` port range.
    #[error("bad port or port range {0:?}")]
    BadPort(String),
    /// A port range with `lo > hi`.
    #[error("empty port range {lo}-{hi}")]
    EmptyPortRange {
        /// Low end.
        lo: u16,
        /// High end.
        hi: u16,
    },
    /// VLAN ids are 12 bits.
    #[error("VLAN id {0} exceeds 4095")]
    VlanOutOfRange(u16),
    /// DSCP values are 6 bits.
    #[error("DSCP {0} exceeds 63")]
    DscpOutOfRange(u8),
    /// Source and destination prefixes of different IP versions can never match.
    #[error("source and destination prefixes are of different IP versions")]
    MixedIpVersions,
    /// Ports are only seen for TCP (6), UDP (17) and SCTP (132): [`PORT_PROTOCOLS`].
    #[error("port rules need protocol = \"tcp\", \"udp\" or \"sctp\" (protocol {0} has no ports)")]
    PortsNeedPortProtocol(u8),
    /// A policy value that is neither a prefix nor a port range (a MAC address or an IP
    /// protocol) did not parse; see [`RuleError::from`].
    #[error(transparent)]
    Value(PolicyValueError),
}

/// Prefix and port-range errors keep their `RuleError` names; other policy values (MAC
/// addresses, protocols) become [`RuleError::Value`].
impl From<PolicyValueError> for RuleError {
    fn from(e: PolicyValueError) -> Self {
        match e {
            PolicyValueError::BadAddress(a) => RuleError::BadAddress(a),
            PolicyValueError::BadPrefixLength(s) => RuleError::BadPrefixLength(s),
            PolicyValueError::PrefixTooLong { len, max } => RuleError::PrefixTooLong {
                len: u8::try_from(len).unwrap_or(u8::MAX),
                max,
            },
            PolicyValueError::HostBitsSet { prefix, .. } => RuleError::HostBitsSet(prefix),
            PolicyValueError::BadPort(s) => RuleError::BadPort(s),
            PolicyValueError::PortOutOfRange(n) => RuleError::BadPort(n.to_string()),
            PolicyValueError::EmptyPortRange { lo, hi } => RuleError::EmptyPortRange { lo, hi },
            e @ (PolicyValueError::BadMac(_)
            | PolicyValueError::UnknownProtocol(_)
            | PolicyValueError::ProtocolOutOfRange(_)) => RuleError::Value(e),
        }
    }
}

/// The IP protocols whose packets carry ports a rule can match: TCP, UDP and SCTP.
pub const PORT_PROTOCOLS: [u8; 3] = [6, 17, 132];

/// The fields a rule matches; `None` is a wildcard. The default matches everything.
#[derive(Default, Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// Ingress port.
    pub in_port: Option<u16>,
    /// Ethernet source.
    pub src_mac: Option<[u8; 6]>,
    /// Ethernet destination.
    pub dst_mac: Option<[u8; 6]>,
    /// VLAN id (0..=4095); only tagged frames match.
    pub vlan: Option<u16>,
    /// Source prefix; only packets of its IP version match.
    pub src_ip: Option<IpPrefix>,
    /// Destination prefix; only packets of its IP version match.
    pub dst_ip: Option<IpPrefix>,
    /// IP protocol (IPv6: first next-header).
    pub protocol: Option<u8>,
    /// Source port range; only TCP, UDP and SCTP packets match.
    pub src_port: Option<PortRange>,
    /// Destination port range; only TCP, UDP and SCTP packets match.
    pub dst_port: Option<PortRange>,
    /// DSCP (0..=63).
    pub dscp: Option<u8>,
}

impl Match {
    /// Checks the fields can ever match together.
    pub fn validate(&self) -> Result<(), RuleError> {
        if let Some(v) = self.vlan.filter(|&v| v > 4095) {
            return Err(RuleError::VlanOutOfRange(v));
        }
        if let Some(d) = self.dscp.filter(|&d| d > 63) {
            return Err(RuleError::DscpOutOfRange(d));
        }
        if let (Some(s), Some(d)) = (&self.src_ip, &self.dst_ip) {
            if s.is_ipv4() != d.is_ipv4() {
                return Err(RuleError::MixedIpVersions);
            }
        }
        self.check_port_protocol()?;
        for r in [self.src_port, self.dst_port].into_iter().flatten() {
            r.validate()?;
        }
        Ok(())
    }

    /// The part of [`validate`](Self::validate) that pairs ports with a protocol: a
    /// port range with a protocol outside [`PORT_PROTOCOLS`] can never match. (Ports
    /// without a protocol match TCP, UDP and SCTP packets alike.)
    pub fn check_port_protocol(&self) -> Result<(), RuleError> {
        let has_ports = self.src_port.is_some() || self.dst_port.is_some();
        match self.protocol {
            Some(p) if has_ports && !PORT_PROTOCOLS.contains(&p) => {
                Err(RuleError::PortsNeedPortProtocol(p))
            }
            _ => Ok(()),
        }
    }

    /// Whether the packet matches, field by field (the reference semantics; the
    /// classifier's tuple search must agree with it).
    pub fn matches(&self, pkt: &Packet<'_>) -> bool {
        let v4 = pkt.l3_kind() == L3Kind::Ipv4;
        let (src, dst) = pkt.addrs();
        let ip = |a: [u8; 16]| -> IpAddr {
            if v4 {
                IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
            } else {
                IpAddr::V6(Ipv6Addr::from(a))
            }
        };
        let eth = pkt.ethernet();
        let ports = pkt.ports();
        self.in_port.is_none_or(|p| p == pkt.meta().in_port)
            && self
                .src_mac
                .is_none_or(|m| eth.as_ref().is_some_and(|e| e.source() == m))
            && self
                .dst_mac
                .is_none_or(|m| eth.as_ref().is_some_and(|e| e.destination() == m))
            && self.vlan.is_none_or(|v| pkt.vlan_id() == Some(v))
            && self.src_ip.is_none_or(|p| p.contains(ip(src)))
            && self.dst_ip.is_none_or(|p| p.contains(ip(dst)))
            && self.protocol.is_none_or(|p| p == pkt.ip_proto())
            && self
                .src_port
                .is_none_or(|r| ports.is_some_and(|(s, _)| r.contains(s)))
            && self
                .dst_port
                .is_none_or(|r| ports.is_some_and(|(_, d)| r.contains(d)))
            && self.dscp.is_none_or(|d| d == pkt.dscp())
    }
}

/// A classifier rule: lower `priority` wins; equal priorities: first inserted wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Lower wins.
    pub priority: u32,
    /// The tenant a matching packet belongs to.
    pub tenant: TenantSlot,
    /// What to match.
    pub fields: Match,
}

/// Names an inserted rule, for [`Classifier::remove`]. Handles are never reused, and
/// their order is insertion order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleHandle(u64);

// ---------------------------------------------------------------------------------------
// The fixed-width key.

/// Words of the fixed-width classification key ([`Match::key_pairs`]).
pub const KEY_WORDS: usize = 7;

/// Word 0: in_port [0,16) | vlan id [16,28) | vlan present 28 | IPv6 29 | ports present 30
/// | proto [32,40) | dscp [40,46). Words 1/2: src/dst MAC << 16 | src/dst port. Words
/// 3-4 / 5-6: src/dst address, high word first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Key([u64; KEY_WORDS]);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for w in self.0 {
            state.write_u64(w);
        }
    }
}

const VLAN_SHIFT: u32 = 16;
const VLAN_PRESENT: u64 = 1 << 28;
const IS_V6: u64 = 1 << 29;
const PORTS_PRESENT: u64 = 1 << 30;
const PROTO_SHIFT: u32 = 32;
const DSCP_SHIFT: u32 = 40;

/// The fields of a packet the classifier looks at, for a caller that extracted them
/// itself (the C core's key extraction, `buffet_nicfw::extract_key`) and wants the
/// classifier's answer on them: [`Classifier::lookup_fields`]. A parsed [`Packet`]
/// reduces to exactly these fields ([`PacketFields::of`]); both go through one encoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketFields {
    /// Ingress port.
    pub in_port: u16,
    /// Ethernet source.
    pub src_mac: [u8; 6],
    /// Ethernet destination.
    pub dst_mac: [u8; 6],
    /// The VLAN id of the one tag, if the frame has one (12 bits are used).
    pub vlan: Option<u16>,
    /// IPv6 (else IPv4).
    pub is_v6: bool,
    /// IPv4 protocol / IPv6 first next-header.
    pub proto: u8,
    /// DSCP (6 bits are used).
    pub dscp: u8,
    /// Source and destination ports (TCP, UDP, SCTP; first fragment only).
    pub ports: Option<(u16, u16)>,
    /// Source address, IPv4 mapped into `::ffff:0:0/96`.
    pub src_addr: [u8; 16],
    /// Destination address, likewise.
    pub dst_addr: [u8; 16],
}

impl PacketFields {
    /// The fields of a parsed packet.
    pub fn of(pkt: &Packet<'_>) -> PacketFields {
        let (src_mac, dst_mac) = pkt
            .ethernet()
            .map_or(([0; 6], [0; 6]), |e| (e.source(), e.destination()));
        let (src_addr, dst_addr) = pkt.addrs();
        PacketFields {
            in_port: pkt.meta().in_port,
            src_mac,
            dst_mac,
            vlan: pkt.vlan_id(),
            is_v6: pkt.l3_kind() == L3Kind::Ipv6,
            proto: pkt.ip_proto(),
            dscp: pkt.dscp(),
            ports: pkt.ports(),
            src_addr,
            dst_addr,
        }
    }
}

impl Key {
    #[inline]
    fn of(pkt: &Packet<'_>) -> Key {
        Key::of_fields(&PacketFields::of(pkt))
    }

    #[inline]
    fn of_fields(f: &PacketFields) -> Key {
        let mut k = [0u64; KEY_WORDS];
        k[0] = u64::from(f.in_port)
            | u64::from(f.proto) << PROTO_SHIFT
            | u64::from(f.dscp & 0x3f) << DSCP_SHIFT;
        if let Some(v) = f.vlan {
            k[0] |= VLAN_PRESENT | u64::from(v & 0xfff) << VLAN_SHIFT;
        }
        if f.is_v6 {
            k[0] |= IS_V6;
        }
        k[1] = mac64(f.src_mac) << 16;
        k[2] = mac64(f.dst_mac) << 16;
        if let Some((s, d)) = f.ports {
            k[0] |= PORTS_PRESENT;
            k[1] |= u64::from(s);
            k[2] |= u64::from(d);
        }
        set128(&mut k, 3, u128::from_be_bytes(f.src_addr));
        set128(&mut k, 5, u128::from_be_bytes(f.dst_addr));
        Key(k)
    }
}

impl MaskedKey for Key {
    #[inline]
    fn masked(&self, mask: &Key) -> Key {
        let mut out = [0u64; KEY_WORDS];
        for (o, (a, m)) in out.iter_mut().zip(self.0.iter().zip(&mask.0)) {
            *o = a & m;
        }
        Key(out)
    }
}

fn mac64(m: [u8; 6]) -> u64 {
    m.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b))
}

fn set128(k: &mut [u64; KEY_WORDS], at: usize, v: u128) {
    k[at] = (v >> 64) as u64;
    k[at + 1] = v as u64;
}

fn port_mask(len: u8) -> u64 {
    if len == 0 {
        0
    } else {
        u64::from(!0u16 << (16 - len))
    }
}

impl Match {
    /// The (mask, value) pairs this match expands to over the classifier's fixed-width
    /// key, as the tuple-space search stores them: word 0 is in_port `[0,16)` | VLAN id
    /// `[16,28)` | VLAN present 28 | IPv6 29 | ports present 30 | protocol `[32,40)` |
    /// DSCP `[40,46)`; words 1 and 2 are the source / destination MAC `<< 16` | port;
    /// words 3-4 and 5-6 the source / destination address (IPv4 mapped into
    /// `::ffff:0:0/96`), high word first. For classifiers outside this crate that must
    /// agree with this one bit for bit (the XDP Packet Dispatcher's maps). The match must
    /// be valid ([`Match::validate`]).
    pub fn key_pairs(&self) -> Vec<([u64; KEY_WORDS], [u64; KEY_WORDS])> {
        expand(self).into_iter().map(|(m, v)| (m.0, v.0)).collect()
    }

    /// How many (mask, value) pairs the match expands to in the tuple space (a port
    /// range is the prefixes that cover it): what the rule costs the Classifier.
    pub fn key_count(&self) -> usize {
        let n = |r: Option<PortRange>| r.map_or(1, |r| r.prefixes().len());
        n(self.src_port) * n(self.dst_port)
    }

    /// True when a key could match both `self` and `other`: some pair of their
    /// [`key_pairs`](Self::key_pairs) agrees on every bit both masks cover. Decided field
    /// by field (a range against a range, a prefix against a prefix), without expanding
    /// either, so its cost does not grow with the port ranges. Both must be valid.
    pub fn overlaps(&self, other: &Match) -> bool {
        fn differ<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            matches!((a, b), (Some(a), Some(b)) if a != b)
        }
        fn disjoint_prefixes(a: &Option<IpPrefix>, b: &Option<IpPrefix>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => {
                    (a.mapped_bits() ^ b.mapped_bits()) & a.mapped_mask() & b.mapped_mask() != 0
                }
                _ => false,
            }
        }
        fn disjoint_ranges(a: &Option<PortRange>, b: &Option<PortRange>) -> bool {
            matches!((a, b), (Some(a), Some(b)) if a.hi < b.lo || b.hi < a.lo)
        }
        let version = |m: &Match| m.src_ip.or(m.dst_ip).map(|p| p.is_ipv4());
        !(differ(&self.in_port, &other.in_port)
            || differ(&self.vlan, &other.vlan)
            || differ(&self.protocol, &other.protocol)
            || differ(&self.dscp, &other.dscp)
            || differ(&self.src_mac, &other.src_mac)
            || differ(&self.dst_mac, &other.dst_mac)
            || differ(&version(self), &version(other))
            || disjoint_prefixes(&self.src_ip, &other.src_ip)
            || disjoint_prefixes(&self.dst_ip, &other.dst_ip)
            || disjoint_ranges(&self.src_port, &other.src_port)
            || disjoint_ranges(&self.dst_port, &other.dst_port))
    }
}

/// The (mask, value) pairs a rule expands to. The match must be valid.
fn expand(m: &Match) -> Vec<(Key, Key)> {
    let mut mask = [0u64; KEY_WORDS];
    let mut val = [0u64; KEY_WORDS];
    if let Some(p) = m.in_port {
        mask[0] |= 0xffff;
        val[0] |= u64::from(p);
    }
    if let Some(v) = m.vlan {
        mask[0] |= VLAN_PRESENT | 0xfff << VLAN_SHIFT;
        val[0] |= VLAN_PRESENT | u64::from(v) << VLAN_SHIFT;
    }
    if let Some(p) = m.protocol {
        mask[0] |= 0xff << PROTO_SHIFT;
        val[0] |= u64::from(p) << PROTO_SHIFT;
    }
    if let Some(d) = m.dscp {
        mask[0] |= 0x3f << DSCP_SHIFT;
        val[0] |= u64::from(d) << DSCP_SHIFT;
    }
    if let Some(a) = m.src_mac {
        mask[1] |= mac64([0xff; 6]) << 16;
        val[1] |= mac64(a) << 16;
    }
    if let Some(a) = m.dst_mac {
        mask[2] |= mac64([0xff; 6]) << 16;
        val[2] |= mac64(a) << 16;
    }
    for (p, at) in [(m.src_ip, 3), (m.dst_ip, 5)] {
        if let Some(p) = p {
            mask[0] |= IS_V6;
            if !p.is_ipv4() {
                val[0] |= IS_V6;
            }
            set128(&mut mask, at, p.mapped_mask());
            set128(&mut val, at, p.mapped_bits());
        }
    }
    if m.src_port.is_some() || m.dst_port.is_some() {
        mask[0] |= PORTS_PRESENT;
        val[0] |= PORTS_PRESENT;
    }
    let any = [(0u16, 0u8)];
    let src = m.src_port.map(|r| r.prefixes());
    let dst = m.dst_port.map(|r| r.prefixes());
    let src = src.as_deref().unwrap_or(&any);
    let dst = dst.as_deref().unwrap_or(&any);
    let mut out = Vec::with_capacity(src.len() * dst.len());
    for &(sv, sl) in src {
        for &(dv, dl) in dst {
            let (mut mk, mut vk) = (mask, val);
            mk[1] |= port_mask(sl);
            vk[1] |= u64::from(sv);
            mk[2] |= port_mask(dl);
            vk[2] |= u64::from(dv);
            out.push((Key(mk), Key(vk)));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Tuple-space search entries.

/// One rule's presence under one (mask, value) pair. Ordered by (priority, insertion
/// sequence): the lowest is the best; sequences are unique, so the tenant never decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    priority: u32,
    seq: u64,
    tenant: TenantSlot,
}

impl Entry {
    fn of(seq: u64, rule: &Rule) -> Entry {
        Entry {
            priority: rule.priority,
            seq,
            tenant: rule.tenant,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct CacheEntry {
    key: Key,
    generation: u64,
    result: Option<TenantSlot>,
}

/// Default number of exact-match cache entries.
pub const DEFAULT_CACHE_ENTRIES: usize = 4096;

/// Rules -> tenant, by exact-match cache + tuple-space search. See the module docs.
#[derive(Clone)]
pub struct Classifier {
    rules: FxHashMap<u64, Rule>,
    next_seq: u64,
    tss: TupleSpace<Key, Entry>,
    cache: Vec<CacheEntry>,
    generation: u64,
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The tables can be large: show their sizes, not their contents.
        f.debug_struct("Classifier")
            .field("rules", &self.rules.len())
            .field("tuples", &self.tss.tuple_count())
            .field("cache_entries", &self.cache.len())
            .field("generation", &self.generation)
            .finish()
    }
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier::new()
    }
}

impl Classifier {
    /// An empty classifier with a [`DEFAULT_CACHE_ENTRIES`]-entry exact-match cache.
    pub fn new() -> Self {
        Classifier::with_cache(DEFAULT_CACHE_ENTRIES)
    }

    /// An empty classifier whose exact-match cache has `entries` slots (rounded up to a
    /// power of two; 0 disables the cache).
    pub fn with_cache(entries: usize) -> Self {
        let n = if entries == 0 {
            0
        } else {
            entries.next_power_of_two()
        };
        Classifier {
            rules: FxHashMap::default(),
            next_seq: 0,
            tss: TupleSpace::new(),
            cache: vec![CacheEntry::default(); n],
            generation: 1,
        }
    }

    /// Adds a rule. Fails, changing nothing, when its match is invalid
    /// ([`Match::validate`]).
    pub fn insert(&mut self, rule: Rule) -> Result<RuleHandle, RuleError> {
        rule.fields.validate()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = Entry::of(seq, &rule);
        for (mask, val) in expand(&rule.fields) {
            self.tss.insert(mask, val, entry);
        }
        self.rules.insert(seq, rule);
        self.generation += 1;
        Ok(RuleHandle(seq))
    }

    /// Removes one rule, returning it (`None` for an unknown handle).
    pub fn remove(&mut self, h: RuleHandle) -> Option<Rule> {
        let rule = self.rules.remove(&h.0)?;
        self.unlink(h.0, &rule);
        self.generation += 1;
        Some(rule)
    }

    /// Removes every rule of `tenant`; returns how many there were.
    ///
    /// Worst entries first: the tuple space looks for a tuple's next best entry only
    /// when its best one goes, so taking a tenant's rules out best first would make
    /// every removal search its tuple again (quadratic in the tenant's rules, while the
    /// dispatcher waits).
    pub fn remove_tenant(&mut self, tenant: TenantSlot) -> usize {
        let mut seqs: Vec<(u32, u64)> = self
            .rules
            .iter()
            .filter(|(_, r)| r.tenant == tenant)
            .map(|(&s, r)| (r.priority, s))
            .collect();
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        for &(_, s) in &seqs {
            if let Some(rule) = self.rules.remove(&s) {
                self.unlink(s, &rule);
            }
        }
        if !seqs.is_empty() {
            self.generation += 1;
        }
        seqs.len()
    }

    /// Takes a rule's entries out of the tuple space (the cache is the caller's to
    /// invalidate).
    fn unlink(&mut self, seq: u64, rule: &Rule) {
        let entry = Entry::of(seq, rule);
        for (mask, val) in expand(&rule.fields) {
            self.tss.remove(&mask, &val, &entry);
        }
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Number of distinct masks (tuples) a full search may probe.
    pub fn tuple_count(&self) -> usize {
        self.tss.tuple_count()
    }

    /// The rules of `tenant`, in insertion order.
    pub fn rules_of(&self, tenant: TenantSlot) -> Vec<(RuleHandle, &Rule)> {
        let mut v: Vec<_> = self
            .rules
            .iter()
            .filter(|(_, r)| r.tenant == tenant)
            .map(|(&s, r)| (RuleHandle(s), r))
            .collect();
        v.sort_by_key(|(h, _)| *h);
        v
    }

    /// The tenant of the best matching rule, through the exact-match cache.
    pub fn classify(&mut self, pkt: &Packet<'_>) -> Option<TenantSlot> {
        let key = Key::of(pkt);
        if self.cache.is_empty() {
            return self.search(&key);
        }
        let i = (FxBuildHasher.hash_one(key) as usize) & (self.cache.len() - 1);
        let e = self.cache[i];
        if e.generation == self.generation && e.key == key {
            return e.result;
        }
        let result = self.search(&key);
        self.cache[i] = CacheEntry {
            key,
            generation: self.generation,
            result,
        };
        result
    }

    /// The tenant of the best matching rule, without touching the cache.
    pub fn lookup(&self, pkt: &Packet<'_>) -> Option<TenantSlot> {
        self.search(&Key::of(pkt))
    }

    /// The tenant of the best matching rule for fields extracted elsewhere (without
    /// touching the cache): what [`lookup`](Self::lookup) answers for a packet with
    /// these [`PacketFields`].
    pub fn lookup_fields(&self, fields: &PacketFields) -> Option<TenantSlot> {
        self.search(&Key::of_fields(fields))
    }

    #[inline]
    fn search(&self, key: &Key) -> Option<TenantSlot> {
        self.tss.lookup(key).map(|e| e.tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_sdk::PacketMeta;
    use etherparse::{IpNumber, PacketBuilder};

    /// A packet description the tests build real frames from.
    #[derive(Clone, Copy, Debug)]
    struct Pk {
        in_port: u16,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        vlan: Option<u16>,
        src: IpAddr,
        dst: IpAddr,
        /// 6 TCP, 17 UDP, 132 SCTP, anything else: raw IP payload with that protocol.
        proto: u8,
        sport: u16,
        dport: u16,
        dscp: u8,
    }

    impl Default for Pk {
        fn default() -> Self {
            Pk {
                in_port: 0,
                src_mac: [2, 0, 0, 0, 0, 1],
                dst_mac: [2, 0, 0, 0, 0, 2],
                vlan: None,
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                proto: 17,
                sport: 1000,
                dport: 2000,
                dscp: 0,
            }
        }
    }

    impl Pk {
        fn frame(&self) -> Vec<u8> {
            let ip = match (self.src, self.dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
                (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
                _ => panic!("mixed versions"),
            };
            let mut l3 = Vec::new();
            match self.proto {
                6 => ip
                    .tcp(self.sport, self.dport, 1, 1000)
                    .write(&mut l3, b"tcp")
                    .unwrap(),
                17 => ip
                    .udp(self.sport, self.dport)
                    .write(&mut l3, b"udp")
                    .unwrap(),
                132 => {
                    let mut sctp = Vec::new();
                    sctp.extend(self.sport.to_be_bytes());
                    sctp.extend(self.dport.to_be_bytes());
                    sctp.extend([0, 0, 0, 7, 0, 0, 0, 0]);
                    ip.write(&mut l3, IpNumber(132), &sctp).unwrap()
                }
                p => ip.write(&mut l3, IpNumber(p), b"raw").unwrap(),
            }
            crate::tagging::tag_dscp(&mut l3, 0, self.src.is_ipv4(), self.dscp).unwrap();
            let mut f = Vec::new();
            f.extend(self.dst_mac);
            f.extend(self.src_mac);
            let ethertype: u16 = if self.src.is_ipv4() { 0x0800 } else { 0x86dd };
            if let Some(v) = self.vlan {
                f.extend(0x8100u16.to_be_bytes());
                f.extend(v.to_be_bytes());
            }
            f.extend(ethertype.to_be_bytes());
            f.extend(l3);
            f
        }

        /// Classifies through both paths (cache and no cache) and checks they agree.
        fn classify(&self, c: &mut Classifier) -> Option<TenantSlot> {
            let mut bytes = self.frame();
            let meta = PacketMeta {
                in_port: self.in_port,
                ..PacketMeta::default()
            };
            let pkt = Packet::parse(&mut bytes, meta).unwrap();
            let a = c.lookup(&pkt);
            let b = c.classify(&pkt);
            let b2 = c.classify(&pkt); // cached now
            assert_eq!(a, b);
            assert_eq!(b, b2);
            a
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn rule(priority: u32, tenant: u32, fields: Match) -> Rule {
        Rule {
            priority,
            tenant: TenantSlot(tenant),
            fields,
        }
    }

    fn dst(p: &str) -> Match {
        Match {
            dst_ip: Some(p.parse().unwrap()),
            ..Match::default()
        }
    }

    /// Prefix and port-range parsing is `buffet_sdk::policy`'s (tested there); its errors
    /// keep their `RuleError` names and messages here.
    #[test]
    fn policy_value_errors_become_rule_errors() {
        let prefix = |s: &str| s.parse::<IpPrefix>().map_err(RuleError::from);
        let ports = |s: &str| s.parse::<PortRange>().map_err(RuleError::from);
        let p = prefix("10.0.0.0/16").unwrap();
        assert_eq!((p.addr(), p.len()), (ip("10.0.0.0"), 16));
        let e = prefix("10.0.0.1/16").unwrap_err();
        assert_eq!(e.to_string(), "10.0.0.1/16 has host bits set");
        assert_eq!(
            prefix("2001:db8::1/32").unwrap_err(),
            RuleError::HostBitsSet("2001:db8::1/32".into())
        );
        assert_eq!(
            prefix("10.0.0.0/33").unwrap_err(),
            RuleError::PrefixTooLong { len: 33, max: 32 }
        );
        assert_eq!(
            prefix("::/129").unwrap_err(),
            RuleError::PrefixTooLong { len: 129, max: 128 }
        );
        assert!(matches!(
            prefix("::/999"),
            Err(RuleError::PrefixTooLong { max: 128, .. })
        ));
        for bad in ["", "foo", "10.0.0/8", "10.0.0.0.0/8", "1.2.3.4 /8"] {
            assert!(
                matches!(prefix(bad), Err(RuleError::BadAddress(_))),
                "{bad}"
            );
        }
        for bad in ["10.0.0.0/", "10.0.0.0/x", "10.0.0.0/-1", "10.0.0.0/+8"] {
            assert!(
                matches!(prefix(bad), Err(RuleError::BadPrefixLength(_))),
                "{bad}"
            );
        }
        assert_eq!(ports("80"), Ok(PortRange::single(80)));
        assert_eq!(
            ports("99-5"),
            Err(RuleError::EmptyPortRange { lo: 99, hi: 5 })
        );
        for bad in ["", "x", "70000", "-5", "5-", "1-2-3", " 80"] {
            assert!(matches!(ports(bad), Err(RuleError::BadPort(_))), "{bad}");
        }
        assert_eq!(
            RuleError::from(PolicyValueError::PortOutOfRange(70000)),
            RuleError::BadPort("70000".into())
        );
        let e = RuleError::from(PolicyValueError::UnknownProtocol("tcpp".into()));
        assert_eq!(
            e,
            RuleError::Value(PolicyValueError::UnknownProtocol("tcpp".into()))
        );
        assert!(e.to_string().contains("tcpp"), "{e}");
    }

    /// The classifier's port masks select exactly the ports of each range's blocks (the
    /// blocks themselves are checked by brute force in `buffet_sdk::policy`).
    #[test]
    fn port_masks_cover_range_prefixes() {
        assert_eq!(PortRange { lo: 1, hi: 65534 }.prefixes().len(), 30);
        for (lo, hi) in [
            (0, 0),
            (0, 65535),
            (1, 65534),
            (1, 1),
            (65535, 65535),
            (5000, 5099),
        ] {
            let pieces = PortRange { lo, hi }.prefixes();
            for port in 0..=u16::MAX {
                let hits = pieces
                    .iter()
                    .filter(|&&(v, l)| u64::from(port) & port_mask(l) == u64::from(v))
                    .count();
                assert_eq!(
                    hits,
                    usize::from((lo..=hi).contains(&port)),
                    "{lo}-{hi} at {port}"
                );
            }
        }
    }

    #[test]
    fn match_validation() {
        let bad = [
            (
                Match {
                    vlan: Some(4096),
                    ..Match::default()
                },
                RuleError::VlanOutOfRange(4096),
            ),
            (
                Match {
                    dscp: Some(64),
                    ..Match::default()
                },
                RuleError::DscpOutOfRange(64),
            ),
            (
                Match {
                    src_ip: Some("10.0.0.0/8".parse().unwrap()),
                    dst_ip: Some("::/0".parse().unwrap()),
                    ..Match::default()
                },
                RuleError::MixedIpVersions,
            ),
            (
                Match {
                    protocol: Some(1),
                    dst_port: Some(PortRange::single(80)),
                    ..Match::default()
                },
                RuleError::PortsNeedPortProtocol(1),
            ),
            (
                Match {
                    src_port: Some(PortRange { lo: 9, hi: 8 }),
                    ..Match::default()
                },
                RuleError::EmptyPortRange { lo: 9, hi: 8 },
            ),
        ];
        let mut c = Classifier::new();
        for (m, e) in bad {
            assert_eq!(c.insert(rule(1, 0, m)), Err(e));
        }
        assert!(c.is_empty());
        assert_eq!(c.tuple_count(), 0);
    }

    #[test]
    fn priorities_and_first_inserted_wins_ties() {
        let mut c = Classifier::new();
        let pk = Pk::default(); // 10.0.0.1 -> 10.0.0.2 UDP 1000 -> 2000
        assert_eq!(pk.classify(&mut c), None, "empty classifier");
        c.insert(rule(10, 1, dst("10.0.0.0/8"))).unwrap();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(1)));
        // A better (lower) priority inserted later wins, and the cache notices.
        c.insert(rule(
            5,
            2,
            Match {
                protocol: Some(17),
                ..Match::default()
            },
        ))
        .unwrap();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(2)));
        // A longer prefix does not win by itself: priority decides.
        c.insert(rule(7, 3, dst("10.0.0.2/32"))).unwrap();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(2)));
        // Equal priority: the first inserted wins, also within one tuple and bucket.
        c.insert(rule(
            5,
            4,
            Match {
                protocol: Some(17),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(5, 5, dst("10.0.0.0/24"))).unwrap();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(2)));
        assert_eq!(c.remove_tenant(TenantSlot(2)), 1);
        // Now 4 (same bucket, promoted from the rest list) ties with 5; 4 came first.
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(4)));
        assert_eq!(c.remove_tenant(TenantSlot(4)), 1);
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(5)));
        assert_eq!(c.remove_tenant(TenantSlot(5)), 1);
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(3)));
        assert_eq!(c.remove_tenant(TenantSlot(3)), 1);
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(c.remove_tenant(TenantSlot(9)), 0);
    }

    #[test]
    fn removing_a_bucket_best_promotes_the_next_best() {
        // Three rules with the same match share one bucket: best 1, rest [5, 3].
        let mut c = Classifier::new();
        let m = || dst("10.0.0.0/8");
        c.insert(rule(5, 5, m())).unwrap();
        let h1 = c.insert(rule(1, 1, m())).unwrap();
        let h3 = c.insert(rule(3, 3, m())).unwrap();
        c.insert(rule(3, 33, m())).unwrap(); // ties with 3, inserted later
        let pk = Pk::default();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(1)));
        c.remove(h1).unwrap();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(3)));
        c.remove(h3).unwrap();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(33)));
        assert_eq!(c.remove_tenant(TenantSlot(33)), 1);
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(5)));
        assert_eq!(c.tuple_count(), 1);
    }

    #[test]
    fn prefixes_select_by_version() {
        let mut c = Classifier::new();
        c.insert(rule(1, 1, dst("10.1.0.0/16"))).unwrap();
        c.insert(rule(2, 2, dst("10.0.0.0/8"))).unwrap();
        c.insert(rule(3, 3, dst("2001:db8::/32"))).unwrap();
        c.insert(rule(4, 4, dst("0.0.0.0/0"))).unwrap();
        let v4 = |d: &str| Pk {
            dst: ip(d),
            ..Pk::default()
        };
        let v6 = |d: &str| Pk {
            src: ip("2001:db8::1"),
            dst: ip(d),
            ..Pk::default()
        };
        assert_eq!(v4("10.1.200.3").classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(v4("10.2.0.1").classify(&mut c), Some(TenantSlot(2)));
        assert_eq!(v4("192.168.0.1").classify(&mut c), Some(TenantSlot(4)));
        assert_eq!(v6("2001:db8:ffff::9").classify(&mut c), Some(TenantSlot(3)));
        // 0.0.0.0/0 is IPv4-only; an IPv4-mapped IPv6 address is still IPv6.
        assert_eq!(v6("2001:db9::1").classify(&mut c), None);
        assert_eq!(v6("::ffff:10.1.0.1").classify(&mut c), None);
        c.insert(rule(5, 5, dst("::/0"))).unwrap();
        assert_eq!(v6("::ffff:10.1.0.1").classify(&mut c), Some(TenantSlot(5)));
        assert_eq!(v4("192.168.0.1").classify(&mut c), Some(TenantSlot(4)));
        // Source prefixes too.
        c.insert(rule(
            0,
            6,
            Match {
                src_ip: Some("10.9.0.0/16".parse().unwrap()),
                ..Match::default()
            },
        ))
        .unwrap();
        let p = Pk {
            src: ip("10.9.1.1"),
            ..Pk::default()
        };
        assert_eq!(p.classify(&mut c), Some(TenantSlot(6)));
    }

    #[test]
    fn port_ranges_need_ports() {
        let mut c = Classifier::new();
        c.insert(rule(
            1,
            1,
            Match {
                dst_port: Some("0-65535".parse().unwrap()),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            0,
            2,
            Match {
                dst_port: Some("1-65534".parse().unwrap()),
                protocol: Some(6),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            0,
            3,
            Match {
                src_port: Some("5000-5099".parse().unwrap()),
                dst_port: Some("80".parse().unwrap()),
                ..Match::default()
            },
        ))
        .unwrap();
        let udp = |s, d| Pk {
            sport: s,
            dport: d,
            ..Pk::default()
        };
        let tcp = |d| Pk {
            proto: 6,
            dport: d,
            ..Pk::default()
        };
        assert_eq!(udp(1, 0).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(udp(1, 65535).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(tcp(0).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(tcp(1).classify(&mut c), Some(TenantSlot(2)));
        assert_eq!(tcp(65534).classify(&mut c), Some(TenantSlot(2)));
        assert_eq!(tcp(65535).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(udp(5000, 80).classify(&mut c), Some(TenantSlot(3)));
        assert_eq!(udp(5099, 80).classify(&mut c), Some(TenantSlot(3)));
        assert_eq!(udp(5100, 80).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(udp(4999, 80).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(udp(5050, 81).classify(&mut c), Some(TenantSlot(1)));
        // No ports (ICMP): even 0-65535 does not match.
        let icmp = Pk {
            proto: 1,
            ..Pk::default()
        };
        assert_eq!(icmp.classify(&mut c), None);
    }

    /// SCTP carries ports like TCP and UDP: `protocol = 132` with ports is a valid rule
    /// and matches on them, and a port-only rule matches SCTP packets too.
    #[test]
    fn sctp_port_rules_match_sctp_ports() {
        let mut c = Classifier::new();
        c.insert(rule(
            1,
            1,
            Match {
                protocol: Some(132),
                dst_port: Some("3868".parse().unwrap()),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            2,
            2,
            Match {
                src_port: Some("2905-2910".parse().unwrap()),
                ..Match::default()
            },
        ))
        .unwrap();
        let sctp = |s, d| Pk {
            proto: 132,
            sport: s,
            dport: d,
            ..Pk::default()
        };
        assert_eq!(sctp(40000, 3868).classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(sctp(40000, 3869).classify(&mut c), None);
        assert_eq!(sctp(2905, 3869).classify(&mut c), Some(TenantSlot(2)));
        assert_eq!(sctp(2911, 3869).classify(&mut c), None);
        // A UDP packet to 3868 is not SCTP.
        let udp = Pk {
            dport: 3868,
            ..Pk::default()
        };
        assert_eq!(udp.classify(&mut c), None);
    }

    /// The address family is part of the key: an IPv4 host rule never matches the IPv6
    /// packet from its `::ffff:` form, and the `::ffff:` IPv6 rule never matches IPv4.
    #[test]
    fn ipv4_rules_never_match_ipv4_mapped_ipv6() {
        let mut c = Classifier::new();
        let src = |p: &str| Match {
            src_ip: Some(p.parse().unwrap()),
            ..Match::default()
        };
        c.insert(rule(1, 1, src("10.3.1.1"))).unwrap();
        c.insert(rule(1, 2, src("::ffff:10.3.1.1"))).unwrap();
        let v4 = Pk {
            src: ip("10.3.1.1"),
            dst: ip("10.3.1.2"),
            ..Pk::default()
        };
        let v6 = Pk {
            src: ip("::ffff:10.3.1.1"),
            dst: ip("::ffff:10.3.1.2"),
            ..Pk::default()
        };
        assert_eq!(v4.classify(&mut c), Some(TenantSlot(1)));
        assert_eq!(v6.classify(&mut c), Some(TenantSlot(2)));
        c.remove_tenant(TenantSlot(2));
        assert_eq!(v6.classify(&mut c), None);
        c.remove_tenant(TenantSlot(1));
        c.insert(rule(1, 2, src("::ffff:10.3.1.1"))).unwrap();
        assert_eq!(v4.classify(&mut c), None);
    }

    #[test]
    fn l2_fields_and_dscp() {
        let mut c = Classifier::new();
        c.insert(rule(
            1,
            1,
            Match {
                vlan: Some(42),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            2,
            2,
            Match {
                src_mac: Some([2, 0, 0, 0, 0, 9]),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            3,
            3,
            Match {
                dst_mac: Some([0xff; 6]),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            4,
            4,
            Match {
                dscp: Some(46),
                ..Match::default()
            },
        ))
        .unwrap();
        c.insert(rule(
            5,
            5,
            Match {
                in_port: Some(3),
                vlan: Some(0),
                ..Match::default()
            },
        ))
        .unwrap();
        let base = Pk::default();
        assert_eq!(base.classify(&mut c), None);
        assert_eq!(
            Pk {
                vlan: Some(42),
                ..base
            }
            .classify(&mut c),
            Some(TenantSlot(1))
        );
        assert_eq!(
            Pk {
                vlan: Some(43),
                ..base
            }
            .classify(&mut c),
            None
        );
        // VLAN 0 (priority tag) is a tag; an untagged frame is not VLAN 0.
        assert_eq!(
            Pk {
                vlan: Some(0),
                in_port: 3,
                ..base
            }
            .classify(&mut c),
            Some(TenantSlot(5))
        );
        assert_eq!(Pk { in_port: 3, ..base }.classify(&mut c), None);
        assert_eq!(
            Pk {
                vlan: Some(0),
                in_port: 2,
                ..base
            }
            .classify(&mut c),
            None
        );
        assert_eq!(
            Pk {
                src_mac: [2, 0, 0, 0, 0, 9],
                ..base
            }
            .classify(&mut c),
            Some(TenantSlot(2))
        );
        assert_eq!(
            Pk {
                dst_mac: [0xff; 6],
                ..base
            }
            .classify(&mut c),
            Some(TenantSlot(3))
        );
        assert_eq!(
            Pk { dscp: 46, ..base }.classify(&mut c),
            Some(TenantSlot(4))
        );
        let v6 = Pk {
            src: ip("fe80::1"),
            dst: ip("fe80::2"),
            dscp: 46,
            ..base
        };
        assert_eq!(v6.classify(&mut c), Some(TenantSlot(4)));
        assert_eq!(Pk { dscp: 45, ..v6 }.classify(&mut c), None);
    }

    #[test]
    fn remove_by_handle_and_tenant_cleans_tuples() {
        let mut c = Classifier::new();
        let h = c
            .insert(rule(
                1,
                1,
                Match {
                    dst_port: Some("1-65534".parse().unwrap()),
                    ..Match::default()
                },
            ))
            .unwrap();
        assert_eq!(c.tuple_count(), 15, "1-65534 spans prefix lengths 2..=16");
        c.insert(rule(2, 2, dst("10.0.0.0/8"))).unwrap();
        c.insert(rule(3, 2, dst("10.0.0.0/16"))).unwrap();
        let pk = Pk::default();
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(1)));
        let r = c.remove(h).unwrap();
        assert_eq!(r.tenant, TenantSlot(1));
        assert_eq!(c.remove(h), None);
        assert_eq!(c.tuple_count(), 2);
        assert_eq!(pk.classify(&mut c), Some(TenantSlot(2)));
        assert_eq!(c.rules_of(TenantSlot(2)).len(), 2);
        assert_eq!(c.remove_tenant(TenantSlot(2)), 2);
        assert_eq!(c.tuple_count(), 0);
        assert!(c.is_empty());
        assert_eq!(pk.classify(&mut c), None);
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn pick<T: Copy>(rng: &mut u64, items: &[T]) -> T {
        items[(xorshift(rng) % items.len() as u64) as usize]
    }

    /// Random rules over small value pools (so they overlap a lot) and random packets
    /// from the same pools, against a naive scan with [`Match::matches`]; rules are
    /// removed along the way. The cache is tiny so entries collide and get replaced.
    #[test]
    fn randomized_cross_check_against_linear_scan() {
        let mut rng = 0x0bad_5eed_1234_5678u64;
        let v4s = ["10.0.0.1", "10.0.1.7", "10.1.0.1", "192.168.1.1", "0.0.0.1"];
        let v6s = ["2001:db8::1", "2001:db8:1::1", "fe80::1", "::ffff:10.0.0.1"];
        let v4p = [
            "10.0.0.0/8",
            "10.0.0.0/16",
            "10.0.0.0/24",
            "10.0.1.7/32",
            "0.0.0.0/0",
            "192.168.0.0/16",
        ];
        let v6p = [
            "2001:db8::/32",
            "2001:db8::/48",
            "::/0",
            "fe80::/10",
            "::ffff:0:0/96",
        ];
        let ports = [0u16, 1, 53, 80, 443, 1023, 1024, 5000, 5099, 65534, 65535];
        let macs = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [0xff; 6]];
        let (mut hits, mut misses) = (0, 0);
        for round in 0..3 {
            let mut c = Classifier::with_cache(16);
            let mut rules: Vec<(RuleHandle, Rule)> = Vec::new();
            for i in 0..150 {
                let mut m = Match::default();
                let v6 = xorshift(&mut rng) % 3 == 0;
                let r = xorshift(&mut rng);
                // Each field present with probability 3/4.
                let on = |i: u32| (r >> (2 * i)) & 3 != 0;
                // Port ranges with 1/4: each expands into many tuples.
                let rare = |i: u32| (r >> (2 * i)) & 3 == 0;
                if on(0) {
                    m.in_port = Some(pick(&mut rng, &[0, 1]));
                }
                if on(1) {
                    m.src_mac = Some(pick(&mut rng, &macs));
                }
                if on(2) {
                    m.dst_mac = Some(pick(&mut rng, &macs));
                }
                if on(3) {
                    m.vlan = Some(pick(&mut rng, &[0, 7]));
                }
                if on(4) {
                    let p = if v6 {
                        pick(&mut rng, &v6p)
                    } else {
                        pick(&mut rng, &v4p)
                    };
                    m.src_ip = Some(p.parse().unwrap());
                }
                if on(5) {
                    let p = if v6 {
                        pick(&mut rng, &v6p)
                    } else {
                        pick(&mut rng, &v4p)
                    };
                    m.dst_ip = Some(p.parse().unwrap());
                }
                if on(6) {
                    m.protocol = Some(pick(&mut rng, &[6, 17, 1]));
                }
                let range = |rng: &mut u64| {
                    let (a, b) = (pick(rng, &ports), pick(rng, &ports));
                    PortRange {
                        lo: a.min(b),
                        hi: a.max(b),
                    }
                };
                if rare(7) && m.protocol != Some(1) {
                    m.src_port = Some(range(&mut rng));
                }
                if rare(8) && m.protocol != Some(1) {
                    m.dst_port = Some(range(&mut rng));
                }
                if on(9) {
                    m.dscp = Some(pick(&mut rng, &[0, 10, 46]));
                }
                if !rules.is_empty() && xorshift(&mut rng) % 5 == 0 {
                    // Same match as an earlier rule: shares its tuple buckets.
                    let j = (xorshift(&mut rng) % rules.len() as u64) as usize;
                    m = rules[j].1.fields.clone();
                }
                let rl = rule((xorshift(&mut rng) % 20) as u32, i, m);
                let h = c.insert(rl.clone()).unwrap();
                rules.push((h, rl));
            }
            for step in 0..1500 {
                if step % 20 == 19 && !rules.is_empty() {
                    let i = (xorshift(&mut rng) % rules.len() as u64) as usize;
                    let (h, _) = rules.remove(i);
                    assert!(c.remove(h).is_some());
                }
                let v6 = xorshift(&mut rng) % 3 == 0;
                let (src, dst) = if v6 {
                    (ip(pick(&mut rng, &v6s)), ip(pick(&mut rng, &v6s)))
                } else {
                    (ip(pick(&mut rng, &v4s)), ip(pick(&mut rng, &v4s)))
                };
                let pk = Pk {
                    in_port: pick(&mut rng, &[0, 1]),
                    src_mac: pick(&mut rng, &macs),
                    dst_mac: pick(&mut rng, &macs),
                    vlan: pick(&mut rng, &[None, Some(0), Some(7)]),
                    src,
                    dst,
                    proto: pick(&mut rng, &[6, 17, 1]),
                    sport: pick(&mut rng, &ports),
                    dport: pick(&mut rng, &ports),
                    dscp: pick(&mut rng, &[0, 10, 46]),
                };
                let mut bytes = pk.frame();
                let meta = PacketMeta {
                    in_port: pk.in_port,
                    ..PacketMeta::default()
                };
                let pkt = Packet::parse(&mut bytes, meta).unwrap();
                // Naive: lowest priority, then earliest insertion (handles are ordered).
                let want = rules
                    .iter()
                    .filter(|(_, r)| r.fields.matches(&pkt))
                    .min_by_key(|(h, r)| (r.priority, *h))
                    .map(|(_, r)| r.tenant);
                assert_eq!(c.lookup(&pkt), want, "round {round} step {step} {pk:?}");
                assert_eq!(c.classify(&pkt), want, "round {round} step {step} {pk:?}");
                if want.is_some() {
                    hits += 1;
                } else {
                    misses += 1;
                }
            }
        }
        // The pools must make both outcomes common, or the check proves little.
        assert!(hits > 800 && misses > 800, "hits {hits} misses {misses}");
    }

    /// Fields extracted elsewhere classify as the packet they came from.
    #[test]
    fn lookup_fields_answers_as_lookup() {
        let mut c = Classifier::new();
        let rule = Match {
            protocol: Some(17),
            dst_port: Some("2000".parse().unwrap()),
            ..Match::default()
        };
        c.insert(Rule {
            priority: 1,
            tenant: TenantSlot(3),
            fields: rule,
        })
        .unwrap();
        for (pk, want) in [
            (Pk::default(), Some(TenantSlot(3))),
            (
                Pk {
                    dport: 2001,
                    ..Pk::default()
                },
                None,
            ),
        ] {
            let mut f = pk.frame();
            let p = Packet::parse(&mut f, PacketMeta::default()).unwrap();
            assert_eq!(c.lookup(&p), want);
            assert_eq!(c.lookup_fields(&PacketFields::of(&p)), want);
        }
    }
}
