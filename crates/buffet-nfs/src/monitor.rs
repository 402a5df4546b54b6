//! Monitor: per-flow statistics (5-tuple → packets, bytes, first/last seen, TCP flags).
//!
//! A flow is a [`FlowKey`]: address family, addresses, IP protocol and ports (TCP, UDP
//! and SCTP; 0 for protocols without ports). SCTP associations are told apart by their
//! ports, and IPv4 `10.0.0.1` and IPv6 `::ffff:10.0.0.1` are different hosts.
//!
//! Each tenant has a fixed-capacity flow table, sized at `init` from the tenant's policy
//! (at most what [`Monitor::register`](buffet_sdk::NetworkFunction::register) reserved)
//! and never grown afterwards: no allocation on the packet path.
//!
//! **Eviction policy.** The table is open-addressed with linear probing over a window of
//! [`PROBE_WINDOW`] slots. A new flow takes the first free slot in its window; when the
//! window is full, the flow in it that was seen least recently is evicted (approximate
//! LRU) and counted in [`FlowTable::evictions`]. Every packet passes.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! flow_capacity = 4096   # optional; default and maximum: the NF's registered capacity
//! ```

use std::hash::{BuildHasher, Hash};

use buffet_sdk::{FlowKey, InitError, MemorySpec, NetworkFunction, Packet, Verdict};
use rustc_hash::FxBuildHasher;
use serde::Deserialize;

/// Slots probed for a flow before evicting.
pub const PROBE_WINDOW: usize = 8;

/// Default per-tenant flow capacity.
pub const DEFAULT_FLOWS: u32 = 4096;

/// One flow's statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// The flow's 5-tuple and address family.
    pub key: FlowKey,
    /// Packets seen.
    pub packets: u64,
    /// Frame bytes seen.
    pub bytes: u64,
    /// Timestamp of the first packet (ns).
    pub first_ns: u64,
    /// Timestamp of the last packet (ns).
    pub last_ns: u64,
    /// OR of the TCP flag bytes seen (FIN=0x01, SYN=0x02, RST=0x04, PSH=0x08, ACK=0x10, …).
    pub tcp_flags: u8,
}

/// A fixed-capacity flow table (see the module doc for the eviction policy).
#[derive(Debug, Default)]
pub struct FlowTable {
    slots: Vec<Option<FlowStats>>,
    mask: usize,
    len: usize,
    evictions: u64,
    packets: u64,
    bytes: u64,
}

impl FlowTable {
    /// A table with room for `capacity` flows (rounded up to a power of two, at least
    /// [`PROBE_WINDOW`]).
    pub fn with_capacity(capacity: usize) -> Self {
        let cap = capacity.max(PROBE_WINDOW).next_power_of_two();
        FlowTable {
            slots: vec![None; cap],
            mask: cap - 1,
            ..FlowTable::default()
        }
    }

    /// Records one packet. Never allocates.
    #[inline]
    pub fn record(&mut self, pkt: &Packet<'_>) {
        if self.slots.is_empty() {
            return;
        }
        let key = pkt.flow_key();
        let now = pkt.meta().ts_ns;
        let len = pkt.len() as u64;
        let flags = pkt.tcp().map_or(0, |t| t.slice()[13]);
        self.packets += 1;
        self.bytes += len;
        let start = hash(&key) & self.mask;
        let mut victim = start;
        let mut oldest = u64::MAX;
        for i in 0..PROBE_WINDOW {
            let idx = (start + i) & self.mask;
            match &mut self.slots[idx] {
                Some(f) if f.key == key => {
                    f.packets += 1;
                    f.bytes += len;
                    f.last_ns = now;
                    f.tcp_flags |= flags;
                    return;
                }
                Some(f) => {
                    if f.last_ns < oldest {
                        oldest = f.last_ns;
                        victim = idx;
                    }
                }
                None => {
                    victim = idx;
                    self.len += 1;
                    break;
                }
            }
        }
        if self.slots[victim].is_some() {
            self.evictions += 1;
        }
        self.slots[victim] = Some(FlowStats {
            key,
            packets: 1,
            bytes: len,
            first_ns: now,
            last_ns: now,
            tcp_flags: flags,
        });
    }

    /// The statistics of one flow, if it is in the table.
    pub fn get(&self, key: &FlowKey) -> Option<&FlowStats> {
        if self.slots.is_empty() {
            return None;
        }
        let start = hash(key) & self.mask;
        (0..PROBE_WINDOW)
            .filter_map(|i| self.slots[(start + i) & self.mask].as_ref())
            .find(|f| f.key == *key)
    }

    /// Every tracked flow.
    pub fn flows(&self) -> impl Iterator<Item = &FlowStats> {
        self.slots.iter().flatten()
    }

    /// Flows tracked now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no flow is tracked.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots in the table.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Flows evicted to make room for new ones.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Packets recorded.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Bytes recorded.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[inline]
fn hash(key: &FlowKey) -> usize {
    let mut h = FxBuildHasher.build_hasher();
    key.hash(&mut h);
    std::hash::Hasher::finish(&h) as usize
}

/// The Monitor NF (multi-tenant).
#[derive(Debug, Clone)]
pub struct Monitor {
    max_flows: u32,
}

impl Default for Monitor {
    fn default() -> Self {
        Monitor {
            max_flows: DEFAULT_FLOWS,
        }
    }
}

impl Monitor {
    /// A monitor whose tenants may track up to `max_flows` flows each.
    pub fn with_max_flows(max_flows: u32) -> Self {
        Monitor { max_flows }
    }
}

/// A tenant's Monitor policy.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorPolicy {
    /// Flow-table capacity; default and maximum: the NF's registered capacity.
    pub flow_capacity: Option<u32>,
}

impl NetworkFunction for Monitor {
    type State = FlowTable;
    type Policy = MonitorPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "monitor"
    }

    fn register(&self) -> MemorySpec {
        let slots = (self.max_flows as usize)
            .max(PROBE_WINDOW)
            .next_power_of_two();
        MemorySpec::with_extra::<FlowTable>(slots * std::mem::size_of::<Option<FlowStats>>())
    }

    fn init(&self, policy: &MonitorPolicy, state: &mut FlowTable) -> Result<(), InitError> {
        let cap = policy.flow_capacity.unwrap_or(self.max_flows);
        if cap == 0 {
            return Err(InitError::invalid("flow_capacity", "must be at least 1"));
        }
        if cap > self.max_flows {
            return Err(InitError::invalid(
                "flow_capacity",
                format!("{cap} exceeds the registered maximum of {}", self.max_flows),
            ));
        }
        *state = FlowTable::with_capacity(cap as usize);
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut FlowTable) -> Verdict {
        state.record(pkt);
        Verdict::Pass
    }

    fn summary(&self, state: &FlowTable) -> Vec<(&'static str, u64)> {
        vec![
            ("flows", state.len() as u64),
            ("flow_evictions", state.evictions()),
            ("monitored_packets", state.packets()),
            ("monitored_bytes", state.bytes()),
        ]
    }
}

/// The single-tenant Monitor: the same logic over one plain flow table, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantMonitor {
    /// The one flow table.
    pub table: FlowTable,
}

impl SingleTenantMonitor {
    /// A monitor tracking up to `capacity` flows.
    pub fn new(capacity: usize) -> Self {
        SingleTenantMonitor {
            table: FlowTable::with_capacity(capacity),
        }
    }

    /// Processes one packet.
    #[inline]
    pub fn handle(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        self.table.record(pkt);
        Verdict::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_sdk::PacketMeta;
    use etherparse::PacketBuilder;

    fn tcp(src_port: u16, syn: bool, ts: u64) -> (Vec<u8>, PacketMeta) {
        let mut v = Vec::new();
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([192, 168, 0, 1], [192, 168, 0, 2], 64)
            .tcp(src_port, 80, 1, 1000);
        let b = if syn { b.syn() } else { b.ack(1) };
        b.write(&mut v, b"data").unwrap();
        (
            v,
            PacketMeta {
                ts_ns: ts,
                ..Default::default()
            },
        )
    }

    #[test]
    fn counts_per_flow_with_flags_and_times() {
        let nf = Monitor::default();
        let mut st = FlowTable::default();
        nf.init(&MonitorPolicy::default(), &mut st).unwrap();
        for (i, syn) in [(0, true), (1, false), (2, false)] {
            let (mut b, m) = tcp(1000, syn, 100 + i);
            let mut p = Packet::parse(&mut b, m).unwrap();
            assert_eq!(nf.handle(&mut p, &mut st), Verdict::Pass);
        }
        let (mut b, m) = tcp(1000, false, 0);
        let key = Packet::parse(&mut b, m).unwrap().flow_key();
        let f = st.get(&key).unwrap();
        assert_eq!((f.packets, f.first_ns, f.last_ns), (3, 100, 102));
        assert_eq!(f.tcp_flags & 0x12, 0x12, "SYN and ACK both seen");
        assert_eq!(f.bytes, 3 * b.len() as u64);
        assert_eq!(st.len(), 1);
    }

    #[test]
    fn full_table_evicts_least_recent_and_counts() {
        let mut st = FlowTable::with_capacity(8);
        for port in 0..100u16 {
            let (mut b, m) = tcp(port, false, port as u64);
            st.record(&Packet::parse(&mut b, m).unwrap());
        }
        assert_eq!(st.len(), 8);
        assert_eq!(st.evictions(), 92);
        // The most recent flow always survives.
        let (mut b, m) = tcp(99, false, 0);
        assert!(st
            .get(&Packet::parse(&mut b, m).unwrap().flow_key())
            .is_some());
    }

    fn record_all(frames: &[Vec<u8>]) -> FlowTable {
        let mut st = FlowTable::with_capacity(64);
        for f in frames {
            let mut b = f.clone();
            st.record(&Packet::parse(&mut b, PacketMeta::default()).unwrap());
        }
        st
    }

    /// SCTP associations are keyed by their ports, as TCP and UDP flows are.
    #[test]
    fn sctp_associations_differing_only_in_ports_are_two_flows() {
        use crate::test_frames::sctp;
        let a = sctp("10.0.0.1", "10.0.0.2", 3868, 3868, b"x");
        let b = sctp("10.0.0.1", "10.0.0.2", 3869, 3868, b"x");
        let st = record_all(&[a.clone(), b, a.clone()]);
        assert_eq!(st.len(), 2);
        let mut a = a;
        let key = Packet::parse(&mut a, PacketMeta::default())
            .unwrap()
            .flow_key();
        let f = st.get(&key).unwrap();
        assert_eq!(
            (f.key.proto, f.key.src_port, f.key.dst_port),
            (132, 3868, 3868)
        );
        assert_eq!(f.packets, 2);
    }

    /// IPv4 `10.3.1.1` and IPv6 `::ffff:10.3.1.1` are different hosts: their flows are
    /// never merged, and each keeps its own family.
    #[test]
    fn ipv4_and_ipv4_mapped_ipv6_flows_are_two_flows() {
        use crate::test_frames::udp;
        let v4 = udp("10.3.1.1", "10.3.1.2", 5000, 53, b"q");
        let v6 = udp("::ffff:10.3.1.1", "::ffff:10.3.1.2", 5000, 53, b"q");
        let st = record_all(&[v4.clone(), v6.clone(), v6]);
        assert_eq!(st.len(), 2);
        let mut srcs: Vec<(String, u64)> = st
            .flows()
            .map(|f| (f.key.src_addr().to_string(), f.packets))
            .collect();
        srcs.sort();
        assert_eq!(
            srcs,
            [
                ("10.3.1.1".to_string(), 1),
                ("::ffff:10.3.1.1".to_string(), 2)
            ]
        );
    }

    #[test]
    fn policy_errors_name_the_field() {
        let nf = Monitor::with_max_flows(16);
        let mut st = FlowTable::default();
        let p: MonitorPolicy = toml::from_str("flow_capacity = 17").unwrap();
        let e = nf.init(&p, &mut st).unwrap_err().to_string();
        assert!(e.contains("flow_capacity") && e.contains("16"), "{e}");
        assert!(toml::from_str::<MonitorPolicy>("flows = 3").is_err());
    }
}
