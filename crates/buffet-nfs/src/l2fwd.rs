//! L2Fwd: forward by destination MAC through a per-tenant table (a REEdge logic).
//!
//! Each tenant has a static table `MAC -> output port`, built at `init` and never grown.
//! A frame whose destination MAC is in the table is forwarded out of that port
//! ([`Verdict::Forward`]). Any other frame (unknown unicast, broadcast and multicast
//! included, unless listed) gets the tenant's `default`: dropped with
//! [`DropCause::Policy`] (`"drop"`, the default) or forwarded out of a given port.
//! There is no learning: the table is the policy.
//!
//! See also [`flowfwd`](crate::flowfwd), the same logic keyed by the 5-tuple.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! default = "drop"            # optional: "drop" (default) or an output port, e.g. 0
//!
//! [[tenant.policy.entries]]
//! mac = "02:00:00:00:00:01"   # also 02-00-00-00-00-01; case-insensitive
//! port = 1
//!
//! [[tenant.policy.entries]]
//! mac = "ff:ff:ff:ff:ff:ff"
//! port = 7
//! ```

use std::hash::Hash;

use buffet_sdk::policy::{parse_mac, NumOrName};
use buffet_sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, PortId, Verdict};
use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::firewall::indexed_counter_name;

/// Default maximum table entries per tenant.
pub const DEFAULT_MAX_ENTRIES: u32 = 65_536;

/// One MAC table entry as written in a policy.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MacEntry {
    /// Destination MAC (`aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff`).
    pub mac: String,
    /// Output port.
    pub port: PortId,
}

/// A tenant's L2Fwd policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L2FwdPolicy {
    /// What happens on a miss: `"drop"` (default) or an output port number.
    pub default: Option<NumOrName>,
    /// The table.
    #[serde(default)]
    pub entries: Vec<MacEntry>,
}

/// What a forwarder does with a packet its table does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissAction {
    /// Drop ([`DropCause::Policy`]).
    #[default]
    Drop,
    /// Forward out of this port.
    Forward(PortId),
}

impl MissAction {
    /// Parses the `default` field (`"drop"`, a port number, or a port number as text).
    pub(crate) fn parse(spec: &Option<NumOrName>) -> Result<MissAction, InitError> {
        let port = |n: i64| {
            PortId::try_from(n)
                .map(MissAction::Forward)
                .map_err(|_| InitError::invalid("default", format!("port {n} is not in 0..=65535")))
        };
        match spec {
            None => Ok(MissAction::Drop),
            Some(NumOrName::Num(n)) => port(*n),
            Some(NumOrName::Name(s)) if s.trim().eq_ignore_ascii_case("drop") => {
                Ok(MissAction::Drop)
            }
            Some(NumOrName::Name(s)) => match s.trim().parse::<i64>() {
                Ok(n) => port(n),
                Err(_) => Err(InitError::invalid(
                    "default",
                    format!("`{s}` is neither \"drop\" nor a port number"),
                )),
            },
        }
    }

    #[inline]
    pub(crate) fn verdict(self) -> Verdict {
        match self {
            MissAction::Drop => Verdict::Drop(DropCause::Policy),
            MissAction::Forward(p) => Verdict::Forward(p),
        }
    }
}

/// Counters of one tenant's forwarder (L2Fwd or FlowFwd).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FwdCounters {
    /// Packets seen.
    pub packets: u64,
    /// Packets forwarded by a table entry.
    pub forwarded: u64,
    /// Misses forwarded to the default port.
    pub default_forwarded: u64,
    /// Misses dropped.
    pub dropped: u64,
}

impl FwdCounters {
    #[inline]
    pub(crate) fn miss(&mut self, miss: MissAction) -> Verdict {
        match miss {
            MissAction::Drop => self.dropped += 1,
            MissAction::Forward(_) => self.default_forwarded += 1,
        }
        miss.verdict()
    }
}

/// The exact-match table both forwarders are: key -> entry (policy order) -> output
/// port, with a hit counter per entry, the forwarder's counters and the tenant's miss
/// action. Built in `init`, never grown by packets.
#[derive(Debug)]
pub(crate) struct FwdTable<K> {
    /// Key -> entry index.
    index: FxHashMap<K, u32>,
    ports: Vec<PortId>,
    hits: Vec<u64>,
    miss: MissAction,
    counters: FwdCounters,
}

impl<K> Default for FwdTable<K> {
    fn default() -> Self {
        FwdTable {
            index: FxHashMap::default(),
            ports: Vec::new(),
            hits: Vec::new(),
            miss: MissAction::default(),
            counters: FwdCounters::default(),
        }
    }
}

impl<K: Hash + Eq> FwdTable<K> {
    /// An empty table with room for `entries` entries.
    pub(crate) fn with_capacity(miss: MissAction, entries: usize) -> Self {
        let mut index = FxHashMap::default();
        index.reserve(entries);
        FwdTable {
            index,
            ports: Vec::with_capacity(entries),
            hits: Vec::with_capacity(entries),
            miss,
            counters: FwdCounters::default(),
        }
    }

    /// Appends the next entry. When `key` is already in the table, returns the index of
    /// the entry holding it and changes nothing.
    pub(crate) fn push(&mut self, key: K, port: PortId) -> Result<(), u32> {
        if let Some(&j) = self.index.get(&key) {
            return Err(j);
        }
        self.index.insert(key, self.ports.len() as u32);
        self.ports.push(port);
        self.hits.push(0);
        Ok(())
    }

    /// Counts one packet and forwards it by `key`; a packet without a key (`None`) or
    /// with an unknown one gets the miss action. Never allocates.
    #[inline]
    pub(crate) fn forward(&mut self, key: Option<&K>) -> Verdict {
        self.counters.packets += 1;
        match key.and_then(|k| self.index.get(k)) {
            Some(&i) => {
                self.hits[i as usize] += 1;
                self.counters.forwarded += 1;
                Verdict::Forward(self.ports[i as usize])
            }
            None => self.counters.miss(self.miss),
        }
    }

    /// Packets forwarded per entry, in policy order.
    pub(crate) fn hits(&self) -> &[u64] {
        &self.hits
    }

    /// The counters.
    pub(crate) fn counters(&self) -> &FwdCounters {
        &self.counters
    }

    /// Named counters: the [`FwdCounters`] and `entry_hits[i]`.
    pub(crate) fn summary(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let mut v = vec![
            ("packets", c.packets),
            ("forwarded", c.forwarded),
            ("default_forwarded", c.default_forwarded),
            ("dropped", c.dropped),
        ];
        v.extend(
            self.hits
                .iter()
                .enumerate()
                .map(|(i, &h)| (indexed_counter_name("entry_hits", i), h)),
        );
        v
    }
}

/// One tenant's L2Fwd state.
#[derive(Debug, Default)]
pub struct L2FwdState {
    /// Destination MAC -> output port.
    fwd: FwdTable<[u8; 6]>,
}

impl L2FwdState {
    /// Builds a tenant's state from its policy; at most `max_entries` entries.
    pub fn from_policy(policy: &L2FwdPolicy, max_entries: u32) -> Result<Self, InitError> {
        if policy.entries.len() > max_entries as usize {
            return Err(InitError::invalid(
                "entries",
                format!(
                    "{} entries exceed the registered maximum of {max_entries}",
                    policy.entries.len()
                ),
            ));
        }
        let miss = MissAction::parse(&policy.default)?;
        let mut fwd = FwdTable::with_capacity(miss, policy.entries.len());
        for (i, e) in policy.entries.iter().enumerate() {
            let field = || format!("entries[{i}].mac");
            let mac =
                parse_mac(e.mac.trim()).map_err(|m| InitError::invalid(field(), m.to_string()))?;
            fwd.push(mac, e.port).map_err(|j| {
                InitError::invalid(field(), format!("{} is already in entries[{j}]", e.mac))
            })?;
        }
        Ok(L2FwdState { fwd })
    }

    /// Forwards one frame. Never allocates.
    #[inline]
    pub fn process(&mut self, pkt: &Packet<'_>) -> Verdict {
        let dst = pkt
            .data()
            .get(..6)
            .and_then(|d| <[u8; 6]>::try_from(d).ok());
        self.fwd.forward(dst.as_ref())
    }

    /// Frames forwarded per entry, in policy order.
    pub fn entry_hits(&self) -> &[u64] {
        self.fwd.hits()
    }

    /// The counters.
    pub fn counters(&self) -> &FwdCounters {
        self.fwd.counters()
    }

    /// Named counters, as `summary()` reports them.
    pub fn summary(&self) -> Vec<(&'static str, u64)> {
        self.fwd.summary()
    }
}

/// The L2Fwd NF (multi-tenant).
#[derive(Clone, Debug)]
pub struct L2Fwd {
    max_entries: u32,
}

impl Default for L2Fwd {
    fn default() -> Self {
        L2Fwd {
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl L2Fwd {
    /// A forwarder whose tenants may have up to `max_entries` MACs each.
    pub fn with_max_entries(max_entries: u32) -> Self {
        L2Fwd { max_entries }
    }
}

impl NetworkFunction for L2Fwd {
    type State = L2FwdState;
    type Policy = L2FwdPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "l2fwd"
    }

    fn register(&self) -> MemorySpec {
        // Per entry: hash slot (MAC + index + control byte, 8/7 load), port, hit counter.
        let per_entry = (6 + 4 + 1) * 8 / 7 + 2 + 8;
        MemorySpec::with_extra::<L2FwdState>(self.max_entries as usize * per_entry)
    }

    fn init(&self, policy: &L2FwdPolicy, state: &mut L2FwdState) -> Result<(), InitError> {
        *state = L2FwdState::from_policy(policy, self.max_entries)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut L2FwdState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &L2FwdState) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant L2Fwd: the same logic over one plain table, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantL2Fwd {
    /// The one tenant's state.
    pub state: L2FwdState,
}

impl SingleTenantL2Fwd {
    /// A forwarder with `policy`'s table.
    pub fn new(policy: &L2FwdPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantL2Fwd {
            state: L2FwdState::from_policy(policy, DEFAULT_MAX_ENTRIES)?,
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

    const DROP: Verdict = Verdict::Drop(DropCause::Policy);

    fn frame(dst: [u8; 6]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0x02, 0, 0, 0, 0, 0xee], dst)
            .ipv4([192, 168, 0, 1], [192, 168, 0, 2], 64)
            .udp(1, 2)
            .write(&mut v, b"x")
            .unwrap();
        v
    }

    fn run(st: &mut L2FwdState, bytes: &[u8]) -> Verdict {
        let mut b = bytes.to_vec();
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        L2Fwd::default().handle(&mut p, st)
    }

    fn state(toml_text: &str) -> L2FwdState {
        let p: L2FwdPolicy = toml::from_str(toml_text).unwrap();
        let mut st = L2FwdState::default();
        L2Fwd::default().init(&p, &mut st).unwrap();
        st
    }

    const TABLE: &str = r#"
        [[entries]]
        mac = "02:00:00:00:00:01"
        port = 1
        [[entries]]
        mac = "02-00-00-00-00-0A"
        port = 2
        [[entries]]
        mac = "ff:ff:ff:ff:ff:ff"
        port = 7
    "#;

    #[test]
    fn forwards_known_macs_and_applies_the_default() {
        let mut st = state(TABLE);
        assert_eq!(
            run(&mut st, &frame([2, 0, 0, 0, 0, 1])),
            Verdict::Forward(1)
        );
        assert_eq!(
            run(&mut st, &frame([2, 0, 0, 0, 0, 0x0a])),
            Verdict::Forward(2)
        );
        assert_eq!(run(&mut st, &frame([0xff; 6])), Verdict::Forward(7));
        assert_eq!(run(&mut st, &frame([2, 0, 0, 0, 0, 9])), DROP);
        assert_eq!(run(&mut st, &frame([1, 0, 0x5e, 0, 0, 1])), DROP);
        assert_eq!(st.entry_hits(), &[1, 1, 1]);
        let c = *st.counters();
        assert_eq!((c.packets, c.forwarded, c.dropped), (5, 3, 2));

        let mut to_port = state(&format!("default = 9\n{TABLE}"));
        assert_eq!(
            run(&mut to_port, &frame([2, 0, 0, 0, 0, 9])),
            Verdict::Forward(9)
        );
        let mut text_port = state("default = \"4\"");
        assert_eq!(
            run(&mut text_port, &frame([2, 0, 0, 0, 0, 9])),
            Verdict::Forward(4)
        );
        assert_eq!(text_port.counters().default_forwarded, 1);
        let s = L2Fwd::default().summary(&st);
        assert!(s.contains(&("entry_hits[2]", 1)) && s.contains(&("dropped", 2)));
    }

    #[test]
    fn truncated_frames_never_reach_or_panic_the_nf() {
        let good = frame([2, 0, 0, 0, 0, 1]);
        let mut st = state(TABLE);
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            if let Ok(mut p) = Packet::parse(&mut b, PacketMeta::default()) {
                L2Fwd::default().handle(&mut p, &mut st);
            }
        }
        assert_eq!(st.counters().packets, 0);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        for (text, field) in [
            ("default = \"flood\"", "default"),
            ("default = 70000", "default"),
            ("default = -1", "default"),
            ("[[entries]]\nmac = \"02:00:00:00:00\"\nport = 1", "entries[0].mac"),
            ("[[entries]]\nmac = \"02:00:00:00:00:zz\"\nport = 1", "entries[0].mac"),
            ("[[entries]]\nmac = \"2:0:0:0:0:1\"\nport = 1", "entries[0].mac"),
            (
                "[[entries]]\nmac = \"02:00:00:00:00:01\"\nport = 1\n[[entries]]\nmac = \"02-00-00-00-00-01\"\nport = 2",
                "entries[1].mac",
            ),
        ] {
            let p: L2FwdPolicy = toml::from_str(text).unwrap();
            let e = L2Fwd::default()
                .init(&p, &mut L2FwdState::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{field}`")), "{text}: {e}");
        }
        assert!(toml::from_str::<L2FwdPolicy>(
            "[[entries]]\nmac = \"02:00:00:00:00:01\"\nport = 1\nvlan = 3"
        )
        .is_err());
        assert!(toml::from_str::<L2FwdPolicy>(
            "[[entries]]\nmac = \"02:00:00:00:00:01\"\nport = 65536"
        )
        .is_err());
        let e = L2Fwd::with_max_entries(2)
            .init(&toml::from_str(TABLE).unwrap(), &mut L2FwdState::default())
            .unwrap_err();
        assert!(e.to_string().contains("`entries`"), "{e}");
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
        // Same IPs (192.168.0.0/16) and even the same MACs, different tables.
        let mut a = state("[[entries]]\nmac = \"02:00:00:00:00:01\"\nport = 1");
        let mut b = state("default = 5\n[[entries]]\nmac = \"02:00:00:00:00:01\"\nport = 3");
        let known = frame([2, 0, 0, 0, 0, 1]);
        let unknown = frame([2, 0, 0, 0, 0, 2]);
        assert_eq!(
            [run(&mut a, &known), run(&mut a, &unknown)],
            [Verdict::Forward(1), DROP]
        );
        assert_eq!(
            [
                run(&mut b, &known),
                run(&mut b, &unknown),
                run(&mut b, &known)
            ],
            [
                Verdict::Forward(3),
                Verdict::Forward(5),
                Verdict::Forward(3)
            ]
        );
        assert_eq!((a.entry_hits(), b.entry_hits()), (&[1u64][..], &[2u64][..]));
        assert_eq!(
            (a.counters().dropped, b.counters().default_forwarded),
            (1, 1)
        );
        assert_eq!((a.counters().packets, b.counters().packets), (2, 3));
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let policy: L2FwdPolicy = toml::from_str(TABLE).unwrap();
        let mut single = SingleTenantL2Fwd::new(&policy).unwrap();
        let mut st = state(TABLE);
        for pkt in [frame([2, 0, 0, 0, 0, 1]), frame([9; 6])] {
            let mut b = pkt.clone();
            let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            assert_eq!(single.handle(&mut p), run(&mut st, &pkt));
        }
        assert_eq!(single.state.counters(), st.counters());
    }
}
