//! Firewall: a per-tenant ordered ACL with optional connection tracking.
//!
//! Each rule matches on source/destination prefixes (IPv4 or IPv6), IP protocol and
//! source/destination port ranges, and says `allow` or `deny`. The **first matching rule
//! in ACL order wins** (the lowest index); a packet no rule matches gets the tenant's
//! `default` action. Denied packets are dropped with [`DropCause::Policy`].
//!
//! **Lookup is not a linear scan.** At `init` every rule is compiled into a tuple-space
//! search ([`buffet_sdk::tss::TupleSpace`], with rule indices as entries): port ranges
//! are expanded into port prefixes, and each (src prefix, dst prefix, proto, src-port
//! prefix, dst-port prefix) combination goes into the hash table of its *mask tuple* (the
//! five prefix lengths). Fully specified rules (host addresses, a protocol and single
//! ports) all land in one tuple, the exact-match hash. A lookup masks the packet's
//! 5-tuple once per tuple and probes that tuple's hash; the tuples are sorted by the
//! lowest rule index they hold, so the search stops as soon as the best match found so
//! far comes before every rule of the remaining tuples. Each hash entry keeps the lowest
//! rule index for its key, which preserves first-match semantics.
//!
//! **Connection tracking** (`allow_established = true`): every allowed packet records its
//! flow in a fixed-capacity per-tenant table; a packet whose *reverse* flow is recorded
//! and alive (seen within `established_timeout_s` of packet time) passes without
//! consulting the ACL ("established"). There is no TCP state machine: any allowed packet
//! opens the connection. The table is open-addressed with a probe window of
//! [`CONN_PROBE_WINDOW`] slots; expired entries are reused, and when the window holds only
//! live entries the least recently seen one is evicted and counted.
//!
//! A prefix matches only packets of its own IP version: an IPv4 prefix never matches an
//! IPv6 packet, not even one whose addresses are IPv4-mapped (`::ffff:a.b.c.d`), and an
//! IPv6 prefix never matches an IPv4 packet; `any` (or an omitted field) matches both. A
//! rule whose `src` and `dst` are of different versions therefore matches nothing. The
//! connection table keys flows with their address family too: an IPv6 flow between
//! `::ffff:`-mapped addresses never lets IPv4 traffic back in as established, nor the
//! other way round.
//!
//! Ports are read for TCP, UDP and SCTP. Packets without ports (ICMP, non-first
//! fragments) are matched with ports 0; a TCP, UDP or SCTP packet that carries no L4
//! header (a non-first fragment) is counted as a fragment.
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

use std::sync::Mutex;

use buffet_sdk::{DropCause, InitError, L4Kind, MemorySpec, NetworkFunction, Packet, Verdict};

mod acl;
mod conntrack;
mod policy;
#[cfg(test)]
mod tests;

use acl::AclKey;
pub use acl::{Acl, Rule};
use conntrack::ConnSlot;
pub use conntrack::ConnTable;
use policy::compile_rule;
pub(crate) use policy::{prefix_or_any, proto_or_any};
pub use policy::{Action, FirewallPolicy, NumOrName, RulePolicy};

/// Slots of the connection table probed for a flow before evicting.
pub const CONN_PROBE_WINDOW: usize = 8;

/// Default idle timeout of a tracked connection, in seconds of packet time.
pub const DEFAULT_ESTABLISHED_TIMEOUT_S: u32 = 300;

/// IP protocol numbers that carry 16-bit ports in the first four L4 bytes.
const PORT_PROTOS: [u8; 3] = [6, 17, 132];

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
            hits: vec![0; acl.rules().len()],
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
                self.acl.rules()[i].action
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

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

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
