//! Firewall: a per-tenant ordered ACL with optional connection tracking.
//!
//! Each rule matches on source/destination prefixes (IPv4 or IPv6), IP protocol and
//! source/destination port ranges, and says `allow` or `deny`. The **first matching rule
//! in ACL order wins** (the lowest index); a packet no rule matches gets the tenant's
//! `default` action. Denied packets are dropped with [`DropCause::Policy`].
//!
//! **Lookup is not a linear scan.** At `init` every rule is compiled into tuple-space
//! search tables: port ranges are expanded into port prefixes, and each (src prefix,
//! dst prefix, proto, src-port prefix, dst-port prefix) combination goes into the hash
//! table of its *mask tuple* (the five prefix lengths). Fully specified rules (host
//! addresses, a protocol and single ports) all land in one tuple, the exact-match hash.
//! A lookup masks the packet's 5-tuple once per tuple and probes that tuple's hash; the
//! tuples are sorted by the lowest rule index they hold, so the search stops as soon as
//! the best match found so far comes before every rule of the remaining tuples. Each hash
//! entry keeps the lowest rule index for its key, which preserves first-match semantics.
//!
//! **Connection tracking** (`allow_established = true`): every allowed packet records its
//! flow in a fixed-capacity per-tenant table; a packet whose *reverse* flow is recorded
//! and alive (seen within `established_timeout_s` of packet time) passes without
//! consulting the ACL ("established"). There is no TCP state machine: any allowed packet
//! opens the connection. The table is open-addressed with a probe window of
//! [`CONN_PROBE_WINDOW`] slots; expired entries are reused, and when the window holds only
//! live entries the least recently seen one is evicted and counted.
//!
//! Addresses are matched in the IPv4-mapped IPv6 space of [`FlowKey`]: an IPv4 prefix
//! matches only IPv4 packets, `any` (or an omitted field) matches both families.
//! Packets without ports (ICMP, non-first fragments) are matched with ports 0; a TCP or
//! UDP packet that carries no L4 header (a non-first fragment) is counted as a fragment.
//!
//! Per-rule hit counters are kept in the state ([`FirewallState::rule_hits`]) and exported
//! by `summary()` as `rule_hits[<index>]`.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! default = "deny"              # action when no rule matches: "allow" | "deny"
//! allow_established = true      # optional (default false): connection tracking
//! conntrack_capacity = 4096     # optional; default and maximum: the NF's registered limit
//! established_timeout_s = 300   # optional (default 300): idle time before a flow expires
//!
//! [[tenant.policy.rules]]
//! action = "allow"
//! src = "192.168.0.0/16"        # optional prefix, IPv4 or IPv6 ("any" or omitted: any)
//! dst = "10.0.0.0/8"
//! proto = "tcp"                 # optional: tcp | udp | icmp | icmpv6 | sctp | any | 0..=255
//! dst_port = "80-90"            # optional: a port, "lo-hi", or "any" (needs tcp/udp/sctp)
//!
//! [[tenant.policy.rules]]
//! action = "deny"
//! src = "2001:db8::/32"
//! proto = 17
//! src_port = 53
//! ```

use std::hash::Hash;
use std::sync::Mutex;

use buffet_sdk::policy::{parse_protocol, IpPrefix, PolicyValueError, PortRange};
use buffet_sdk::{
    DropCause, FlowKey, InitError, L4Kind, MemorySpec, NetworkFunction, Packet, Verdict,
};
use rustc_hash::{FxBuildHasher, FxHashMap};
use serde::Deserialize;

/// Slots of the connection table probed for a flow before evicting.
pub const CONN_PROBE_WINDOW: usize = 8;

/// Default idle timeout of a tracked connection, in seconds of packet time.
pub const DEFAULT_ESTABLISHED_TIMEOUT_S: u32 = 300;

/// IP protocol numbers that carry 16-bit ports in the first four L4 bytes.
const PORT_PROTOS: [u8; 3] = [6, 17, 132];

/// What a rule (or the default) does with a packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let the packet pass.
    Allow,
    /// Drop the packet ([`DropCause::Policy`]).
    #[default]
    Deny,
}

/// A number or a name, as written in a policy (`proto = 6` or `proto = "tcp"`,
/// `dst_port = 80` or `dst_port = "80-90"`). Validated by `init`, which names the field.
pub use buffet_sdk::policy::NumOrName;

/// One ACL rule as written in a policy. Every match field is optional (omitted: any).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulePolicy {
    /// `allow` or `deny`.
    pub action: Action,
    /// Source prefix (`a.b.c.d/n`, `x::/n`, a bare address, or `any`).
    pub src: Option<String>,
    /// Destination prefix.
    pub dst: Option<String>,
    /// IP protocol: a name (`tcp`, `udp`, `icmp`, `icmpv6`, `sctp`, `any`) or a number.
    pub proto: Option<NumOrName>,
    /// Source port or range (`80`, `"1024-65535"`, `"any"`); needs a port protocol.
    pub src_port: Option<NumOrName>,
    /// Destination port or range.
    pub dst_port: Option<NumOrName>,
}

/// A tenant's Firewall policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirewallPolicy {
    /// Action for packets no rule matches (default `deny`).
    #[serde(default)]
    pub default: Action,
    /// Let packets of a flow whose reverse direction was allowed pass (default false).
    #[serde(default)]
    pub allow_established: bool,
    /// Connection-table capacity; default and maximum: the NF's registered limit. Only
    /// meaningful with `allow_established`.
    pub conntrack_capacity: Option<u32>,
    /// Idle time (seconds of packet time) after which a tracked flow expires.
    pub established_timeout_s: Option<u32>,
    /// The ordered ACL: the first matching rule wins.
    #[serde(default)]
    pub rules: Vec<RulePolicy>,
}

#[inline]
fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    }
}

#[inline]
fn mask16(len: u8) -> u16 {
    if len == 0 {
        0
    } else {
        u16::MAX << (16 - u32::from(len.min(16)))
    }
}

/// True for the policy keyword `any` (any case, surrounding blanks ignored).
fn is_any(text: &str) -> bool {
    text.trim().eq_ignore_ascii_case("any")
}

/// Parses a prefix ([`IpPrefix`]: IPv4 or IPv6, host bits zero) or `any` (`None`: every
/// address of both families). Surrounding blanks are ignored.
pub(crate) fn prefix_or_any(text: &str) -> Result<Option<IpPrefix>, PolicyValueError> {
    if is_any(text) {
        return Ok(None);
    }
    text.trim().parse().map(Some)
}

/// Parses an IP protocol name or number ([`parse_protocol`]), or `any` / `ip` (`None`).
pub(crate) fn proto_or_any(spec: &NumOrName) -> Result<Option<u8>, PolicyValueError> {
    match spec {
        NumOrName::Name(s) if is_any(s) || s.trim().eq_ignore_ascii_case("ip") => Ok(None),
        NumOrName::Name(s) => parse_protocol(s.trim()).map(Some),
        NumOrName::Num(_) => spec.protocol().map(Some),
    }
}

/// Parses a port or an inclusive port range (`80`, `"80"`, `"1024-65535"`), or `any`.
fn ports_or_any(spec: &NumOrName) -> Result<PortRange, PolicyValueError> {
    match spec {
        NumOrName::Name(s) if is_any(s) => Ok(PortRange::ALL),
        NumOrName::Name(s) => s.trim().parse(),
        NumOrName::Num(_) => spec.port_range(),
    }
}

/// A rule's prefix in the mapped 128-bit space of [`FlowKey`]: (length, bits); `any` is
/// the zero-length prefix, which both IPv4 and IPv6 addresses fall in.
fn mapped(p: Option<IpPrefix>) -> (u8, u128) {
    p.map_or((0, 0), |p| (p.mapped_len(), p.mapped_bits()))
}

/// An inclusive port range as the fewest (value, prefix length) port prefixes.
fn port_prefixes((lo, hi): (u16, u16)) -> Vec<(u16, u8)> {
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
    /// The rule's predicate, evaluated directly (what a linear scan would do).
    pub fn matches(&self, key: &FlowKey) -> bool {
        self.src.is_none_or(|p| p.contains_mapped(&key.src))
            && self.dst.is_none_or(|p| p.contains_mapped(&key.dst))
            && self.proto.is_none_or(|p| p == key.proto)
            && (self.src_ports.0..=self.src_ports.1).contains(&key.src_port)
            && (self.dst_ports.0..=self.dst_ports.1).contains(&key.dst_port)
    }
}

/// The 5-tuple as the ACL hashes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct AclKey {
    src: u128,
    dst: u128,
    src_port: u16,
    dst_port: u16,
    proto: u8,
}

impl AclKey {
    #[inline]
    fn of(key: &FlowKey) -> Self {
        AclKey {
            src: u128::from_be_bytes(key.src),
            dst: u128::from_be_bytes(key.dst),
            src_port: key.src_port,
            dst_port: key.dst_port,
            proto: key.proto,
        }
    }

    #[inline]
    fn reversed(&self) -> Self {
        AclKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
        }
    }
}

/// The five prefix lengths that define one tuple of the tuple-space search.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct MaskTuple {
    src: u8,
    dst: u8,
    proto: bool,
    src_port: u8,
    dst_port: u8,
}

/// One tuple: its masks and the hash of masked keys -> lowest rule index.
#[derive(Debug)]
struct TupleTable {
    src: u128,
    dst: u128,
    src_port: u16,
    dst_port: u16,
    proto: u8,
    /// The lowest rule index in `map` (the tuple cannot yield a better match).
    best: u32,
    map: FxHashMap<AclKey, u32>,
}

impl TupleTable {
    fn new(t: MaskTuple) -> Self {
        TupleTable {
            src: mask128(t.src),
            dst: mask128(t.dst),
            src_port: mask16(t.src_port),
            dst_port: mask16(t.dst_port),
            proto: if t.proto { u8::MAX } else { 0 },
            best: u32::MAX,
            map: FxHashMap::default(),
        }
    }

    #[inline]
    fn mask(&self, k: &AclKey) -> AclKey {
        AclKey {
            src: k.src & self.src,
            dst: k.dst & self.dst,
            src_port: k.src_port & self.src_port,
            dst_port: k.dst_port & self.dst_port,
            proto: k.proto & self.proto,
        }
    }
}

/// A compiled ACL: the rules in order plus their tuple-space search tables.
#[derive(Debug, Default)]
pub struct Acl {
    rules: Vec<Rule>,
    tuples: Vec<TupleTable>,
    entries: usize,
}

impl Acl {
    /// Compiles `rules` (in ACL order). Fails when they expand to more than
    /// `max_entries` hash entries.
    pub fn compile(rules: Vec<Rule>, max_entries: usize) -> Result<Acl, InitError> {
        let mut index: FxHashMap<MaskTuple, usize> = FxHashMap::default();
        let mut tuples: Vec<TupleTable> = Vec::new();
        let mut entries = 0usize;
        for (i, r) in rules.iter().enumerate() {
            let (src_len, src_bits) = mapped(r.src);
            let (dst_len, dst_bits) = mapped(r.dst);
            let sports = port_prefixes(r.src_ports);
            let dports = port_prefixes(r.dst_ports);
            for &(sp, sl) in &sports {
                for &(dp, dl) in &dports {
                    let t = MaskTuple {
                        src: src_len,
                        dst: dst_len,
                        proto: r.proto.is_some(),
                        src_port: sl,
                        dst_port: dl,
                    };
                    let slot = *index.entry(t).or_insert_with(|| {
                        tuples.push(TupleTable::new(t));
                        tuples.len() - 1
                    });
                    let table = &mut tuples[slot];
                    let key = AclKey {
                        src: src_bits,
                        dst: dst_bits,
                        src_port: sp,
                        dst_port: dp,
                        proto: r.proto.unwrap_or(0),
                    };
                    // Keep the first rule for a key: later ones are shadowed by it.
                    let e = table.map.entry(key).or_insert_with(|| {
                        entries += 1;
                        i as u32
                    });
                    table.best = table.best.min(*e);
                }
            }
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
        tuples.sort_by_key(|t| t.best);
        for t in &mut tuples {
            t.map.shrink_to_fit();
        }
        Ok(Acl {
            rules,
            tuples,
            entries,
        })
    }

    /// Index of the first rule (in ACL order) matching `key`, by tuple-space search.
    #[inline]
    pub fn classify(&self, key: &FlowKey) -> Option<usize> {
        self.classify_key(&AclKey::of(key))
    }

    #[inline]
    fn classify_key(&self, key: &AclKey) -> Option<usize> {
        let mut best = u32::MAX;
        for t in &self.tuples {
            if t.best >= best {
                break;
            }
            if let Some(&r) = t.map.get(&t.mask(key)) {
                best = best.min(r);
            }
        }
        (best != u32::MAX).then_some(best as usize)
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
        self.tuples.len()
    }

    /// Number of hash entries over all tuples.
    pub fn entry_count(&self) -> usize {
        self.entries
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct ConnSlot {
    key: AclKey,
    last_ns: u64,
    used: bool,
}

/// A fixed-capacity table of allowed flows (see the module doc).
#[derive(Debug, Default)]
pub struct ConnTable {
    slots: Vec<ConnSlot>,
    mask: usize,
    timeout_ns: u64,
    evictions: u64,
}

impl ConnTable {
    /// Room for `capacity` flows (rounded up to a power of two, at least the probe
    /// window); a flow expires `timeout_ns` after it was last seen.
    pub fn new(capacity: usize, timeout_ns: u64) -> Self {
        let cap = capacity.max(CONN_PROBE_WINDOW).next_power_of_two();
        ConnTable {
            slots: vec![ConnSlot::default(); cap],
            mask: cap - 1,
            timeout_ns,
            evictions: 0,
        }
    }

    #[inline]
    fn live(&self, s: &ConnSlot, now: u64) -> bool {
        s.used && now.saturating_sub(s.last_ns) <= self.timeout_ns
    }

    /// If `key` is tracked and alive, refreshes it and returns true.
    #[inline]
    fn touch(&mut self, key: &AclKey, now: u64) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let start = hash_of(key) & self.mask;
        for i in 0..CONN_PROBE_WINDOW {
            let idx = (start + i) & self.mask;
            let s = self.slots[idx];
            if s.used && s.key == *key {
                if self.live(&s, now) {
                    self.slots[idx].last_ns = self.slots[idx].last_ns.max(now);
                    return true;
                }
                return false;
            }
        }
        false
    }

    /// Records (or refreshes) `key`; evicts the least recently seen live flow of the
    /// probe window when it has no free or expired slot.
    #[inline]
    fn insert(&mut self, key: &AclKey, now: u64) {
        if self.slots.is_empty() {
            return;
        }
        let start = hash_of(key) & self.mask;
        let mut free = None;
        let mut victim = start;
        let mut oldest = u64::MAX;
        for i in 0..CONN_PROBE_WINDOW {
            let idx = (start + i) & self.mask;
            let s = self.slots[idx];
            if s.used && s.key == *key {
                self.slots[idx].last_ns = s.last_ns.max(now);
                return;
            }
            if !self.live(&s, now) {
                free.get_or_insert(idx);
            } else if s.last_ns < oldest {
                oldest = s.last_ns;
                victim = idx;
            }
        }
        let idx = match free {
            Some(idx) => idx,
            None => {
                self.evictions += 1;
                victim
            }
        };
        self.slots[idx] = ConnSlot {
            key: *key,
            last_ns: now,
            used: true,
        };
    }

    /// Slots holding a flow (live or expired but not yet reused).
    pub fn occupied(&self) -> usize {
        self.slots.iter().filter(|s| s.used).count()
    }

    /// Slots in the table.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Live flows evicted to make room for new ones.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[inline]
fn hash_of<K: Hash>(key: &K) -> usize {
    use std::hash::BuildHasher;
    FxBuildHasher.hash_one(key) as usize
}

/// Counters of one tenant's firewall.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FirewallCounters {
    /// Packets seen.
    pub packets: u64,
    /// Packets passed (by a rule, the default, or as established).
    pub allowed: u64,
    /// Packets dropped (by a rule or the default).
    pub denied: u64,
    /// Packets no rule matched (they got the default action).
    pub default_hits: u64,
    /// Packets passed because their reverse flow was allowed.
    pub established: u64,
    /// TCP/UDP/SCTP packets without an L4 header (non-first fragments), matched with
    /// ports 0.
    pub fragments: u64,
}

/// One tenant's firewall state.
#[derive(Debug, Default)]
pub struct FirewallState {
    acl: Acl,
    hits: Vec<u64>,
    default: Action,
    allow_established: bool,
    conns: ConnTable,
    counters: FirewallCounters,
}

impl FirewallState {
    /// Builds a tenant's state from its policy, within `limits`.
    pub fn from_policy(
        policy: &FirewallPolicy,
        limits: &FirewallLimits,
    ) -> Result<Self, InitError> {
        if policy.rules.len() > limits.max_rules as usize {
            return Err(InitError::invalid(
                "rules",
                format!(
                    "{} rules exceed the registered maximum of {}",
                    policy.rules.len(),
                    limits.max_rules
                ),
            ));
        }
        let mut rules = Vec::with_capacity(policy.rules.len());
        for (i, r) in policy.rules.iter().enumerate() {
            rules.push(compile_rule(i, r)?);
        }
        let acl = Acl::compile(rules, limits.max_entries as usize)?;
        let conns = if policy.allow_established {
            let cap = policy.conntrack_capacity.unwrap_or(limits.max_conns);
            if cap == 0 || cap > limits.max_conns {
                return Err(InitError::invalid(
                    "conntrack_capacity",
                    format!(
                        "{cap} is not in 1..={} (the registered maximum)",
                        limits.max_conns
                    ),
                ));
            }
            let timeout = policy
                .established_timeout_s
                .unwrap_or(DEFAULT_ESTABLISHED_TIMEOUT_S);
            if timeout == 0 {
                return Err(InitError::invalid(
                    "established_timeout_s",
                    "must be at least 1",
                ));
            }
            ConnTable::new(cap as usize, u64::from(timeout) * 1_000_000_000)
        } else {
            if policy.conntrack_capacity.is_some() {
                return Err(InitError::invalid(
                    "conntrack_capacity",
                    "set without allow_established = true",
                ));
            }
            if policy.established_timeout_s.is_some() {
                return Err(InitError::invalid(
                    "established_timeout_s",
                    "set without allow_established = true",
                ));
            }
            ConnTable::default()
        };
        Ok(FirewallState {
            hits: vec![0; acl.rules.len()],
            acl,
            default: policy.default,
            allow_established: policy.allow_established,
            conns,
            counters: FirewallCounters::default(),
        })
    }

    /// Decides one packet. Never allocates.
    #[inline]
    pub fn process(&mut self, pkt: &Packet<'_>) -> Verdict {
        let c = &mut self.counters;
        c.packets += 1;
        let flow = pkt.flow_key();
        if pkt.l4_kind() == L4Kind::Other && PORT_PROTOS.contains(&flow.proto) {
            c.fragments += 1;
        }
        let key = AclKey::of(&flow);
        let now = pkt.meta().ts_ns;
        if self.allow_established && self.conns.touch(&key.reversed(), now) {
            c.established += 1;
            c.allowed += 1;
            return Verdict::Pass;
        }
        let action = match self.acl.classify_key(&key) {
            Some(i) => {
                self.hits[i] += 1;
                self.acl.rules[i].action
            }
            None => {
                c.default_hits += 1;
                self.default
            }
        };
        match action {
            Action::Allow => {
                c.allowed += 1;
                if self.allow_established {
                    self.conns.insert(&key, now);
                }
                Verdict::Pass
            }
            Action::Deny => {
                c.denied += 1;
                Verdict::Drop(DropCause::Policy)
            }
        }
    }

    /// Hits per rule, in ACL order.
    pub fn rule_hits(&self) -> &[u64] {
        &self.hits
    }

    /// The counters.
    pub fn counters(&self) -> &FirewallCounters {
        &self.counters
    }

    /// The compiled ACL.
    pub fn acl(&self) -> &Acl {
        &self.acl
    }

    /// The connection table (empty unless `allow_established`).
    pub fn conns(&self) -> &ConnTable {
        &self.conns
    }

    /// Named counters, as `summary()` reports them.
    pub fn summary(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let mut v = vec![
            ("packets", c.packets),
            ("allowed", c.allowed),
            ("denied", c.denied),
            ("default_hits", c.default_hits),
            ("established", c.established),
            ("fragments", c.fragments),
            ("conntrack_flows", self.conns.occupied() as u64),
            ("conntrack_evictions", self.conns.evictions()),
        ];
        v.extend(
            self.hits
                .iter()
                .enumerate()
                .map(|(i, &h)| (rule_hits_name(i), h)),
        );
        v
    }
}

fn compile_rule(i: usize, r: &RulePolicy) -> Result<Rule, InitError> {
    let field = |f: &str| format!("rules[{i}].{f}");
    let invalid = |f: &str, e: PolicyValueError| InitError::invalid(field(f), e.to_string());
    let prefix = |f: &str, v: &Option<String>| match v {
        None => Ok(None),
        Some(s) => prefix_or_any(s).map_err(|e| invalid(f, e)),
    };
    let src = prefix("src", &r.src)?;
    let dst = prefix("dst", &r.dst)?;
    let proto = match &r.proto {
        None => None,
        Some(p) => proto_or_any(p).map_err(|e| invalid("proto", e))?,
    };
    let ports = |f: &str, v: &Option<NumOrName>| -> Result<(u16, u16), InitError> {
        let Some(v) = v else { return Ok((0, u16::MAX)) };
        let r = ports_or_any(v).map_err(|e| invalid(f, e))?;
        let range = (r.lo, r.hi);
        if range != (0, u16::MAX) && !proto.is_some_and(|p| PORT_PROTOS.contains(&p)) {
            return Err(InitError::invalid(
                field(f),
                "a port match needs proto = \"tcp\", \"udp\" or \"sctp\"",
            ));
        }
        Ok(range)
    };
    Ok(Rule {
        action: r.action,
        src,
        dst,
        proto,
        src_ports: ports("src_port", &r.src_port)?,
        dst_ports: ports("dst_port", &r.dst_port)?,
    })
}

/// The static counter name `rule_hits[i]`.
pub(crate) fn rule_hits_name(i: usize) -> &'static str {
    indexed_counter_name("rule_hits", i)
}

/// The static counter name `<prefix>[i]` (`rule_hits[3]`, `blacklist_hits[0]`).
///
/// `summary()` names are `&'static str`; each distinct name is formatted and leaked once
/// per process, so the memory is bounded by the largest table ever summarised.
pub(crate) fn indexed_counter_name(prefix: &'static str, i: usize) -> &'static str {
    static NAMES: Mutex<Vec<(&'static str, Vec<&'static str>)>> = Mutex::new(Vec::new());
    let mut all = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let pos = match all.iter().position(|(p, _)| *p == prefix) {
        Some(pos) => pos,
        None => {
            all.push((prefix, Vec::new()));
            all.len() - 1
        }
    };
    let names = &mut all[pos].1;
    while names.len() <= i {
        let n = names.len();
        names.push(Box::leak(format!("{prefix}[{n}]").into_boxed_str()));
    }
    names[i]
}

/// Per-tenant limits the Firewall registers memory for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirewallLimits {
    /// Rules per tenant.
    pub max_rules: u32,
    /// Tuple-space hash entries per tenant (port ranges expand into several).
    pub max_entries: u32,
    /// Connection-table capacity per tenant.
    pub max_conns: u32,
}

impl Default for FirewallLimits {
    fn default() -> Self {
        FirewallLimits {
            max_rules: 4096,
            max_entries: 65_536,
            max_conns: 4096,
        }
    }
}

/// The Firewall NF (multi-tenant).
#[derive(Clone, Debug, Default)]
pub struct Firewall {
    limits: FirewallLimits,
}

impl Firewall {
    /// A firewall whose tenants stay within `limits`.
    pub fn with_limits(limits: FirewallLimits) -> Self {
        Firewall { limits }
    }
}

impl NetworkFunction for Firewall {
    type State = FirewallState;
    type Policy = FirewallPolicy;

    fn name(&self) -> &'static str {
        "firewall"
    }

    fn register(&self) -> MemorySpec {
        let l = &self.limits;
        let conns = (l.max_conns as usize)
            .max(CONN_PROBE_WINDOW)
            .next_power_of_two();
        // Rules and their hit counters, hash entries (key + index, about 1/0.875 load
        // overhead), connection slots.
        let extra = l.max_rules as usize * (std::mem::size_of::<Rule>() + 8)
            + l.max_entries as usize * (std::mem::size_of::<AclKey>() + 4) * 8 / 7
            + conns * std::mem::size_of::<ConnSlot>();
        MemorySpec::with_extra::<FirewallState>(extra)
    }

    fn init(&self, policy: &FirewallPolicy, state: &mut FirewallState) -> Result<(), InitError> {
        *state = FirewallState::from_policy(policy, &self.limits)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut FirewallState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &FirewallState) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant Firewall: the same logic over one plain state, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantFirewall {
    /// The one tenant's state.
    pub state: FirewallState,
}

impl SingleTenantFirewall {
    /// A firewall enforcing `policy` with the default limits.
    pub fn new(policy: &FirewallPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantFirewall {
            state: FirewallState::from_policy(policy, &FirewallLimits::default())?,
        })
    }

    /// Processes one packet.
    #[inline]
    pub fn handle(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        self.state.process(pkt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_sdk::PacketMeta;
    use etherparse::PacketBuilder;
    use std::net::Ipv4Addr;

    fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src, dst, 64)
            .tcp(sport, dport, 1, 1000)
            .write(&mut v, b"hello")
            .unwrap();
        v
    }

    fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src, dst, 64)
            .udp(sport, dport)
            .write(&mut v, b"hello")
            .unwrap();
        v
    }

    fn run(st: &mut FirewallState, bytes: &[u8], ts: u64) -> Verdict {
        let mut b = bytes.to_vec();
        let meta = PacketMeta {
            ts_ns: ts,
            ..Default::default()
        };
        let mut p = Packet::parse(&mut b, meta).unwrap();
        Firewall::default().handle(&mut p, st)
    }

    fn state(toml_text: &str) -> FirewallState {
        let p: FirewallPolicy = toml::from_str(toml_text).unwrap();
        let mut st = FirewallState::default();
        Firewall::default().init(&p, &mut st).unwrap();
        st
    }

    fn init_err(toml_text: &str) -> String {
        let p: FirewallPolicy = toml::from_str(toml_text).unwrap();
        let mut st = FirewallState::default();
        Firewall::default()
            .init(&p, &mut st)
            .unwrap_err()
            .to_string()
    }

    const DROP: Verdict = Verdict::Drop(DropCause::Policy);

    /// The ACL's port masks select exactly the ports of each range's prefixes.
    #[test]
    fn port_ranges_become_minimal_prefixes() {
        assert_eq!(port_prefixes((0, 65535)), vec![(0, 0)]);
        assert_eq!(port_prefixes((80, 80)), vec![(80, 16)]);
        assert_eq!(port_prefixes((1024, 65535)).len(), 6);
        assert_eq!(port_prefixes((1, 65534)).len(), 30);
        for (lo, hi) in [(3u16, 17u16), (0, 1), (100, 1000), (65535, 65535)] {
            let ps = port_prefixes((lo, hi));
            for p in 0..=u16::MAX {
                let inside = ps.iter().filter(|&&(v, l)| p & mask16(l) == v).count();
                assert_eq!(
                    inside,
                    usize::from((lo..=hi).contains(&p)),
                    "{lo}-{hi} at {p}"
                );
            }
        }
    }

    /// Prefixes are `buffet_sdk::policy::IpPrefix` (tested there); the firewall adds
    /// `any` and ignores surrounding blanks.
    #[test]
    fn prefixes_parse_and_reject() {
        let prefix = |s: &str| prefix_or_any(s).unwrap().unwrap();
        let p = prefix("192.168.0.0/16");
        assert_eq!(p.mapped_len(), 112);
        assert_eq!(p.to_string(), "192.168.0.0/16");
        assert!(p.contains_mapped(&Ipv4Addr::new(192, 168, 9, 9).to_ipv6_mapped().octets()));
        assert!(!p.contains_mapped(&Ipv4Addr::new(192, 169, 0, 1).to_ipv6_mapped().octets()));
        assert_eq!(prefix("2001:db8::/32").to_string(), "2001:db8::/32");
        assert_eq!(prefix("10.0.0.1").mapped_len(), 128);
        assert_eq!(prefix(" 10.0.0.0/8 ").to_string(), "10.0.0.0/8");
        assert_eq!(prefix_or_any("any"), Ok(None));
        assert_eq!(prefix_or_any(" ANY "), Ok(None));
        for bad in [
            "10.0.0.0/33",
            "10.0.0.1/8",
            "300.0.0.0/8",
            "10.0.0.0/x",
            "::/129",
            "host",
        ] {
            assert!(prefix_or_any(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn protocols_and_ports_accept_any() {
        let name = |s: &str| NumOrName::Name(s.into());
        assert_eq!(proto_or_any(&name(" TCP ")), Ok(Some(6)));
        assert_eq!(proto_or_any(&name("ipv6-icmp")), Ok(Some(58)));
        assert_eq!(proto_or_any(&name("any")), Ok(None));
        assert_eq!(proto_or_any(&name("ip")), Ok(None));
        assert_eq!(proto_or_any(&NumOrName::Num(47)), Ok(Some(47)));
        assert!(proto_or_any(&NumOrName::Num(256)).is_err());
        assert!(proto_or_any(&name("tcpp")).is_err());
        assert_eq!(ports_or_any(&name("Any")), Ok(PortRange::ALL));
        assert_eq!(
            ports_or_any(&name(" 80-90 ")),
            Ok(PortRange { lo: 80, hi: 90 })
        );
        assert_eq!(ports_or_any(&NumOrName::Num(53)), Ok(PortRange::single(53)));
        assert!(ports_or_any(&NumOrName::Num(70000)).is_err());
        assert!(ports_or_any(&name("90-80")).is_err());
    }

    #[test]
    fn first_matching_rule_wins_and_default_applies() {
        let mut st = state(
            r#"
            default = "deny"
            [[rules]]
            action = "deny"
            src = "192.168.1.0/24"
            proto = "tcp"
            dst_port = 22
            [[rules]]
            action = "allow"
            src = "192.168.0.0/16"
            proto = "tcp"
            dst_port = "1-1023"
            [[rules]]
            action = "allow"
            proto = "udp"
            dst_port = 53
            "#,
        );
        let ssh_bad = tcp4([192, 168, 1, 5], [10, 0, 0, 1], 40000, 22);
        let ssh_ok = tcp4([192, 168, 2, 5], [10, 0, 0, 1], 40000, 22);
        let web = tcp4([192, 168, 1, 5], [10, 0, 0, 1], 40000, 80);
        let high = tcp4([192, 168, 1, 5], [10, 0, 0, 1], 40000, 8080);
        let dns = udp4([172, 16, 0, 1], [8, 8, 8, 8], 5353, 53);
        let other = tcp4([172, 16, 0, 1], [10, 0, 0, 1], 1, 80);
        assert_eq!(run(&mut st, &ssh_bad, 0), DROP);
        assert_eq!(run(&mut st, &ssh_ok, 0), Verdict::Pass);
        assert_eq!(run(&mut st, &web, 0), Verdict::Pass);
        assert_eq!(run(&mut st, &high, 0), DROP);
        assert_eq!(run(&mut st, &dns, 0), Verdict::Pass);
        assert_eq!(run(&mut st, &other, 0), DROP);
        assert_eq!(st.rule_hits(), &[1, 2, 1]);
        let c = *st.counters();
        assert_eq!(
            (c.packets, c.allowed, c.denied, c.default_hits),
            (6, 3, 3, 2)
        );
        let s = Firewall::default().summary(&st);
        assert!(
            s.contains(&("rule_hits[1]", 2)) && s.contains(&("denied", 3)),
            "{s:?}"
        );
    }

    #[test]
    fn ipv6_rules_match_ipv6_only() {
        let mut st = state(
            r#"
            default = "allow"
            [[rules]]
            action = "deny"
            src = "2001:db8::/32"
            [[rules]]
            action = "deny"
            dst = "0.0.0.0/0"
            proto = "udp"
            "#,
        );
        let mut v6 = Vec::new();
        let mut src = [0u8; 16];
        src[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        src[15] = 1;
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6(src, [9; 16], 64)
            .tcp(1, 2, 0, 100)
            .write(&mut v6, b"")
            .unwrap();
        assert_eq!(run(&mut st, &v6, 0), DROP);
        let mut v6udp = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6([7; 16], [9; 16], 64)
            .udp(1, 2)
            .write(&mut v6udp, b"")
            .unwrap();
        // 0.0.0.0/0 is an IPv4 prefix: it does not match IPv6.
        assert_eq!(run(&mut st, &v6udp, 0), Verdict::Pass);
        assert_eq!(
            run(&mut st, &udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2), 0),
            DROP
        );
    }

    #[test]
    fn established_flows_pass_in_reverse_and_expire() {
        let mut st = state(
            r#"
            default = "deny"
            allow_established = true
            established_timeout_s = 10
            [[rules]]
            action = "allow"
            src = "192.168.0.0/16"
            proto = "tcp"
            dst_port = 80
            "#,
        );
        let out = tcp4([192, 168, 0, 7], [93, 184, 216, 34], 40000, 80);
        let back = tcp4([93, 184, 216, 34], [192, 168, 0, 7], 80, 40000);
        let sec = 1_000_000_000;
        assert_eq!(run(&mut st, &back, 0), DROP, "no connection yet");
        assert_eq!(run(&mut st, &out, sec), Verdict::Pass);
        assert_eq!(run(&mut st, &back, 2 * sec), Verdict::Pass);
        assert_eq!(
            run(&mut st, &back, 11 * sec),
            Verdict::Pass,
            "refreshed at 2 s"
        );
        assert_eq!(run(&mut st, &back, 30 * sec), DROP, "expired");
        let c = *st.counters();
        assert_eq!((c.established, c.denied, c.allowed), (2, 2, 3));
    }

    #[test]
    fn full_conntrack_table_evicts_and_counts() {
        let mut st = state(
            r#"
            default = "allow"
            allow_established = true
            conntrack_capacity = 8
            "#,
        );
        for port in 0..100u16 {
            let out = tcp4([192, 168, 0, 1], [10, 0, 0, 1], 1000 + port, 80);
            assert_eq!(run(&mut st, &out, u64::from(port)), Verdict::Pass);
        }
        assert_eq!(st.conns().capacity(), 8);
        assert_eq!(st.conns().occupied(), 8);
        assert_eq!(st.conns().evictions(), 92);
    }

    #[test]
    fn fragments_and_portless_packets_match_with_port_zero() {
        let mut st = state(
            r#"
            default = "allow"
            [[rules]]
            action = "deny"
            proto = "tcp"
            dst_port = 80
            [[rules]]
            action = "deny"
            proto = "icmp"
            "#,
        );
        // A non-first TCP fragment: proto 6, no parsable ports.
        let mut frag = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 80);
        frag[20] = 0x00;
        frag[21] = 0x10; // fragment offset 16 (x8 bytes)
        assert_eq!(run(&mut st, &frag, 0), Verdict::Pass);
        assert_eq!(st.counters().fragments, 1);
        let mut icmp = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([1, 1, 1, 1], [2, 2, 2, 2], 64)
            .icmpv4_echo_request(1, 1)
            .write(&mut icmp, b"ping")
            .unwrap();
        assert_eq!(run(&mut st, &icmp, 0), DROP);
        assert_eq!(st.rule_hits(), &[0, 1]);
    }

    #[test]
    fn malformed_frames_never_reach_or_panic_the_firewall() {
        let good = tcp4([192, 168, 0, 1], [10, 0, 0, 1], 1, 80);
        let mut st = state("default = \"allow\"\nallow_established = true");
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            if let Ok(mut p) = Packet::parse(&mut b, PacketMeta::default()) {
                let _ = Firewall::default().handle(&mut p, &mut st);
            }
        }
        // Only the full frame parses (the IP total length covers all of it).
        assert_eq!(st.counters().packets, 0);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let cases = [
            (
                "[[rules]]\naction = \"allow\"\nsrc = \"10.0.0.1/8\"",
                "rules[0].src",
            ),
            (
                "[[rules]]\naction = \"allow\"\ndst = \"10.0.0.0/40\"",
                "rules[0].dst",
            ),
            (
                "[[rules]]\naction = \"allow\"\nproto = \"tcpp\"",
                "rules[0].proto",
            ),
            (
                "[[rules]]\naction = \"allow\"\nproto = 300",
                "rules[0].proto",
            ),
            (
                "[[rules]]\naction = \"allow\"\ndst_port = 80",
                "rules[0].dst_port",
            ),
            (
                "[[rules]]\naction = \"allow\"\nproto = \"tcp\"\nsrc_port = \"90-80\"",
                "rules[0].src_port",
            ),
            (
                "[[rules]]\naction = \"allow\"\nproto = \"udp\"\nsrc_port = 70000",
                "rules[0].src_port",
            ),
            (
                "allow_established = true\nconntrack_capacity = 0",
                "conntrack_capacity",
            ),
            ("conntrack_capacity = 5", "conntrack_capacity"),
            (
                "allow_established = true\nestablished_timeout_s = 0",
                "established_timeout_s",
            ),
        ];
        for (text, field) in cases {
            let e = init_err(text);
            assert!(e.contains(field), "{text}: {e}");
        }
        for unknown in [
            "[[rules]]\naction = \"allow\"\nsource = \"10.0.0.0/8\"",
            "defualt = \"deny\"",
            "[[rules]]\naction = \"reject\"",
        ] {
            assert!(
                toml::from_str::<FirewallPolicy>(unknown).is_err(),
                "{unknown}"
            );
        }
        let nf = Firewall::with_limits(FirewallLimits {
            max_rules: 1,
            max_entries: 40,
            max_conns: 8,
        });
        let two: FirewallPolicy =
            toml::from_str("[[rules]]\naction = \"allow\"\n[[rules]]\naction = \"deny\"").unwrap();
        let e = nf
            .init(&two, &mut FirewallState::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`rules`"), "{e}");
        let wide: FirewallPolicy = toml::from_str(
            "[[rules]]\naction = \"allow\"\nproto = \"tcp\"\nsrc_port = \"1-65534\"\ndst_port = \"1-2\"",
        )
        .unwrap();
        let e = nf
            .init(&wide, &mut FirewallState::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("rules[0]") && e.contains("60"), "{e}");
    }

    /// xorshift64*: a tiny deterministic generator for the cross-check.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Addresses from a small pool so that random rules and packets overlap often.
    fn pool_addr(rng: &mut Rng) -> [u8; 4] {
        [
            192,
            168,
            rng.below(4) as u8,
            [1, 2, 3, 128, 200, 255][rng.below(6) as usize],
        ]
    }

    fn random_prefix(rng: &mut Rng) -> Option<String> {
        let a = pool_addr(rng);
        let len = [0u8, 8, 16, 22, 24, 25, 31, 32][rng.below(8) as usize];
        if len == 0 {
            return None;
        }
        let m = u32::from_be_bytes(a) & (u32::MAX << (32 - u32::from(len)));
        Some(format!("{}/{len}", Ipv4Addr::from(m)))
    }

    fn random_ports(rng: &mut Rng) -> Option<NumOrName> {
        let points = [
            0u16, 1, 22, 53, 79, 80, 81, 443, 1023, 1024, 8080, 40000, 65535,
        ];
        match rng.below(4) {
            0 => None,
            1 => Some(NumOrName::Num(i64::from(points[rng.below(13) as usize]))),
            _ => {
                let a = points[rng.below(13) as usize];
                let b = points[rng.below(13) as usize];
                Some(NumOrName::Name(format!("{}-{}", a.min(b), a.max(b))))
            }
        }
    }

    #[test]
    fn tuple_space_search_agrees_with_a_linear_scan() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut matched, mut unmatched) = (0u32, 0u32);
        for round in 0..40 {
            let n = 1 + rng.below(if round < 30 { 60 } else { 600 }) as usize;
            let rules: Vec<RulePolicy> = (0..n)
                .map(|_| {
                    let proto = match rng.below(4) {
                        0 => None,
                        1 => Some(NumOrName::Name("tcp".into())),
                        2 => Some(NumOrName::Name("udp".into())),
                        _ => Some(NumOrName::Num(6)),
                    };
                    let with_ports = proto.is_some();
                    RulePolicy {
                        action: if rng.below(2) == 0 {
                            Action::Allow
                        } else {
                            Action::Deny
                        },
                        src: random_prefix(&mut rng),
                        dst: random_prefix(&mut rng),
                        proto,
                        src_port: if with_ports {
                            random_ports(&mut rng)
                        } else {
                            None
                        },
                        dst_port: if with_ports {
                            random_ports(&mut rng)
                        } else {
                            None
                        },
                    }
                })
                .collect();
            let policy = FirewallPolicy {
                default: Action::Deny,
                rules,
                ..Default::default()
            };
            let mut st = FirewallState::from_policy(&policy, &FirewallLimits::default()).unwrap();
            let mut expected_hits = vec![0u64; n];
            for _ in 0..2000 {
                let points = [
                    0u16, 1, 22, 53, 79, 80, 81, 443, 1023, 1024, 8080, 40000, 65535,
                ];
                let sport = points[rng.below(13) as usize];
                let dport = if rng.below(3) == 0 {
                    rng.below(65536) as u16
                } else {
                    points[rng.below(13) as usize]
                };
                let (s, d) = (pool_addr(&mut rng), pool_addr(&mut rng));
                let bytes = if rng.below(2) == 0 {
                    tcp4(s, d, sport, dport)
                } else {
                    udp4(s, d, sport, dport)
                };
                let mut b = bytes.clone();
                let p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
                let key = p.flow_key();
                let linear = st.acl().classify_linear(&key);
                assert_eq!(st.acl().classify(&key), linear, "round {round}, {key:?}");
                let want = match linear {
                    Some(i) => {
                        matched += 1;
                        expected_hits[i] += 1;
                        policy.rules[i].action
                    }
                    None => {
                        unmatched += 1;
                        Action::Deny
                    }
                };
                let got = st.process(&p);
                assert_eq!(got == Verdict::Pass, want == Action::Allow);
            }
            assert_eq!(st.rule_hits(), &expected_hits[..]);
        }
        // The generator exercises both outcomes substantially.
        assert!(
            matched > 10_000 && unmatched > 2_000,
            "{matched} / {unmatched}"
        );
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
        // Both tenants use 192.168.0.0/16; only their policies differ.
        let mut a = state(
            r#"
            default = "allow"
            [[rules]]
            action = "deny"
            src = "192.168.1.0/24"
            proto = "tcp"
            dst_port = 80
            "#,
        );
        let mut b = state(
            r#"
            default = "deny"
            [[rules]]
            action = "allow"
            src = "192.168.0.0/16"
            proto = "udp"
            "#,
        );
        let packets = [
            tcp4([192, 168, 1, 10], [192, 168, 2, 1], 5000, 80),
            udp4([192, 168, 1, 10], [192, 168, 2, 1], 5000, 53),
            tcp4([192, 168, 3, 10], [192, 168, 2, 1], 5000, 80),
        ];
        let va: Vec<_> = packets.iter().map(|p| run(&mut a, p, 0)).collect();
        let vb: Vec<_> = packets.iter().map(|p| run(&mut b, p, 0)).collect();
        assert_eq!(va, [DROP, Verdict::Pass, Verdict::Pass]);
        assert_eq!(vb, [DROP, Verdict::Pass, DROP]);
        assert_eq!(a.rule_hits(), &[1]);
        assert_eq!(b.rule_hits(), &[1]);
        assert_eq!((a.counters().denied, b.counters().denied), (1, 2));
        assert_eq!(
            (a.counters().default_hits, b.counters().default_hits),
            (2, 2)
        );
        assert_eq!(a.counters().packets, 3);
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let policy: FirewallPolicy =
            toml::from_str("[[rules]]\naction = \"allow\"\nproto = \"udp\"").unwrap();
        let mut single = SingleTenantFirewall::new(&policy).unwrap();
        let mut st = FirewallState::default();
        Firewall::default().init(&policy, &mut st).unwrap();
        for pkt in [udp4([1; 4], [2; 4], 1, 2), tcp4([1; 4], [2; 4], 1, 2)] {
            let mut b = pkt.clone();
            let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            assert_eq!(single.handle(&mut p), run(&mut st, &pkt, 0));
        }
        assert_eq!(single.state.counters(), st.counters());
    }
}
