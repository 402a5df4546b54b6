//! The compiled ACL: rules in order and their tuple-space search tables (the module doc
//! of [`super`] describes the lookup). Parsing policies and tracking connections happen
//! elsewhere.

use buffet_sdk::policy::{IpPrefix, PortRange};
use buffet_sdk::tss::{MaskedKey, TupleSpace};
use buffet_sdk::{FlowKey, InitError, L3Kind};

use super::policy::Action;

#[inline]
pub(super) fn mask16(len: u8) -> u16 {
    if len == 0 {
        0
    } else {
        u16::MAX << (16 - u32::from(len.min(16)))
    }
}

/// A rule's prefix as a (mask, value) pair over the 128-bit address form of [`FlowKey`]
/// (IPv4 mapped into `::ffff:0:0/96`); `any` is the empty mask. The address family is
/// matched separately ([`AclKey::v6`]).
fn mapped(p: Option<IpPrefix>) -> (u128, u128) {
    p.map_or((0, 0), |p| (p.mapped_mask(), p.mapped_bits()))
}

/// An inclusive port range as the fewest (value, prefix length) port prefixes.
pub(super) fn port_prefixes((lo, hi): (u16, u16)) -> Vec<(u16, u8)> {
    PortRange { lo, hi }.prefixes()
}

/// One compiled ACL rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// What the rule does.
    pub action: Action,
    /// Source prefix (`None`: any address, IPv4 or IPv6).
    pub src: Option<IpPrefix>,
    /// Destination prefix (`None`: any address).
    pub dst: Option<IpPrefix>,
    /// IP protocol (`None`: any).
    pub proto: Option<u8>,
    /// Inclusive source-port range.
    pub src_ports: (u16, u16),
    /// Inclusive destination-port range.
    pub dst_ports: (u16, u16),
}

impl Rule {
    /// The rule's predicate, evaluated directly (what a linear scan would do) for a
    /// packet with flow `key`. A prefix matches only addresses of its own family (the
    /// key's [`l3`](FlowKey::l3)), so a rule whose source and destination prefixes differ
    /// in family matches nothing.
    pub fn matches(&self, key: &FlowKey) -> bool {
        self.src.is_none_or(|p| p.contains_flow_src(key))
            && self.dst.is_none_or(|p| p.contains_flow_dst(key))
            && self.proto.is_none_or(|p| p == key.proto)
            && (self.src_ports.0..=self.src_ports.1).contains(&key.src_port)
            && (self.dst_ports.0..=self.dst_ports.1).contains(&key.dst_port)
    }
}

/// The 5-tuple and address family as the ACL and the connection table hash it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct AclKey {
    src: u128,
    dst: u128,
    src_port: u16,
    dst_port: u16,
    proto: u8,
    /// The packet is IPv6. Rules with a prefix match on it, and tracked connections
    /// include it, so the 128-bit address form (which an IPv6 `::ffff:a.b.c.d` shares with
    /// IPv4 `a.b.c.d`) never mixes families.
    v6: bool,
}

impl AclKey {
    #[inline]
    pub(super) fn of(key: &FlowKey) -> Self {
        AclKey {
            src: u128::from_be_bytes(key.src),
            dst: u128::from_be_bytes(key.dst),
            src_port: key.src_port,
            dst_port: key.dst_port,
            proto: key.proto,
            v6: key.l3 == L3Kind::Ipv6,
        }
    }

    #[inline]
    pub(super) fn reversed(&self) -> Self {
        AclKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
            v6: self.v6,
        }
    }
}

impl MaskedKey for AclKey {
    #[inline]
    fn masked(&self, m: &Self) -> Self {
        AclKey {
            src: self.src & m.src,
            dst: self.dst & m.dst,
            src_port: self.src_port & m.src_port,
            dst_port: self.dst_port & m.dst_port,
            proto: self.proto & m.proto,
            v6: self.v6 & m.v6,
        }
    }
}

/// A compiled ACL: the rules in order plus their tuple-space search
/// ([`TupleSpace`], entries are rule indices: the lowest, the first in ACL order, wins).
#[derive(Debug, Default)]
pub struct Acl {
    rules: Vec<Rule>,
    tss: TupleSpace<AclKey, u32>,
}

impl Acl {
    /// Compiles `rules` (in ACL order). Fails when they expand to more than
    /// `max_entries` hash entries.
    pub fn compile(rules: Vec<Rule>, max_entries: usize) -> Result<Acl, InitError> {
        let mut tss = TupleSpace::new();
        for (i, r) in rules.iter().enumerate() {
            let (src_mask, src_bits) = mapped(r.src);
            let (dst_mask, dst_bits) = mapped(r.dst);
            // The IP version the rule's prefixes require (`None`: no prefix, any version).
            let v6 = match (r.src, r.dst) {
                (None, None) => None,
                (Some(p), None) | (None, Some(p)) => Some(!p.is_ipv4()),
                (Some(s), Some(d)) if s.is_ipv4() == d.is_ipv4() => Some(!s.is_ipv4()),
                // Prefixes of both versions: no packet matches the rule.
                (Some(_), Some(_)) => continue,
            };
            let sports = port_prefixes(r.src_ports);
            let dports = port_prefixes(r.dst_ports);
            for &(sp, sl) in &sports {
                for &(dp, dl) in &dports {
                    let mask = AclKey {
                        src: src_mask,
                        dst: dst_mask,
                        src_port: mask16(sl),
                        dst_port: mask16(dl),
                        proto: if r.proto.is_some() { u8::MAX } else { 0 },
                        v6: v6.is_some(),
                    };
                    let value = AclKey {
                        src: src_bits,
                        dst: dst_bits,
                        src_port: sp,
                        dst_port: dp,
                        proto: r.proto.unwrap_or(0),
                        v6: v6 == Some(true),
                    };
                    // Keep the first rule for a key: later ones are shadowed by it.
                    if tss.get(&mask, &value).is_none() {
                        tss.insert(mask, value, i as u32);
                    }
                }
            }
            let entries = tss.value_count();
            if entries > max_entries {
                return Err(InitError::invalid(
                    format!("rules[{i}]"),
                    format!(
                        "the rules up to here expand to {entries} lookup entries (port ranges \
                         become port prefixes), more than the registered maximum of {max_entries}"
                    ),
                ));
            }
        }
        tss.shrink_to_fit();
        Ok(Acl { rules, tss })
    }

    /// Index of the first rule (in ACL order) matching a packet with flow `key`, by
    /// tuple-space search.
    #[inline]
    pub fn classify(&self, key: &FlowKey) -> Option<usize> {
        self.classify_key(&AclKey::of(key))
    }

    #[inline]
    pub(super) fn classify_key(&self, key: &AclKey) -> Option<usize> {
        self.tss.lookup(key).map(|i| i as usize)
    }

    /// Index of the first rule matching `key`, by scanning every rule in order (the
    /// reference the tuple-space search is tested against).
    pub fn classify_linear(&self, key: &FlowKey) -> Option<usize> {
        self.rules.iter().position(|r| r.matches(key))
    }

    /// The rules, in ACL order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Number of mask tuples (hash tables probed in the worst case).
    pub fn tuple_count(&self) -> usize {
        self.tss.tuple_count()
    }

    /// Number of hash entries over all tuples.
    pub fn entry_count(&self) -> usize {
        self.tss.value_count()
    }
}
