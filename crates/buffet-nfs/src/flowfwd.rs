//! FlowFwd: forward by exact 5-tuple through a per-tenant table (a REEdge logic).
//!
//! Each tenant has a static table `(src, dst, proto, src port, dst port) -> output port`,
//! built at `init` and never grown. A packet whose 5-tuple is in the table is forwarded
//! out of that port ([`Verdict::Forward`]); anything else gets the tenant's `default`:
//! dropped with [`DropCause::Policy`](buffet_sdk::DropCause::Policy) (`"drop"`, the default) or forwarded out of a given
//! port. Entries are directional: the reply of a flow needs its own entry. TCP, UDP and
//! SCTP entries need both ports; for protocols without ports the ports are 0 and must be
//! omitted; a non-first fragment of a TCP, UDP or SCTP flow carries no ports, looks up
//! with ports 0, and so takes the default. Addresses keep their family: an IPv4 entry
//! never forwards an IPv6 packet, not even one whose addresses are the IPv4-mapped form
//! (`::ffff:a.b.c.d`) of the entry's.
//!
//! See also [`l2fwd`](crate::l2fwd), the same logic keyed by destination MAC.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! default = 0                 # optional: "drop" (default) or an output port
//!
//! [[tenant.policy.flows]]
//! src = "192.168.0.1"         # IPv4 or IPv6 address (both of one entry in one family)
//! dst = "10.0.0.1"
//! proto = "tcp"               # tcp | udp | sctp | icmp | icmpv6 | a number
//! src_port = 40000            # required for tcp/udp/sctp, absent otherwise
//! dst_port = 80
//! port = 2                    # output port
//! ```

use std::net::IpAddr;

use buffet_sdk::policy::NumOrName;
use buffet_sdk::{FlowKey, InitError, MemorySpec, NetworkFunction, Packet, PortId, Verdict};
use serde::Deserialize;

use crate::firewall::proto_or_any;
use crate::l2fwd::{FwdCounters, FwdTable, MissAction};

/// Default maximum flow entries per tenant.
pub const DEFAULT_MAX_FLOWS: u32 = 65_536;

const PORT_PROTOS: [u8; 3] = [6, 17, 132];

/// One flow entry as written in a policy.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowEntry {
    /// Source address.
    pub src: String,
    /// Destination address.
    pub dst: String,
    /// IP protocol (name or number).
    pub proto: NumOrName,
    /// Source port (TCP/UDP/SCTP only).
    pub src_port: Option<u16>,
    /// Destination port (TCP/UDP/SCTP only).
    pub dst_port: Option<u16>,
    /// Output port.
    pub port: PortId,
}

/// A tenant's FlowFwd policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowFwdPolicy {
    /// What happens on a miss: `"drop"` (default) or an output port number.
    pub default: Option<NumOrName>,
    /// The table.
    #[serde(default)]
    pub flows: Vec<FlowEntry>,
}

/// One tenant's FlowFwd state.
#[derive(Debug, Default)]
pub struct FlowFwdState {
    /// 5-tuple -> output port.
    fwd: FwdTable<FlowKey>,
}

fn addr(i: usize, field: &str, text: &str) -> Result<IpAddr, InitError> {
    text.trim().parse::<IpAddr>().map_err(|_| {
        InitError::invalid(
            format!("flows[{i}].{field}"),
            format!(
                "`{text}` is not an IPv4 or IPv6 address (FlowFwd matches exactly, no prefixes)"
            ),
        )
    })
}

fn compile_flow(i: usize, e: &FlowEntry) -> Result<FlowKey, InitError> {
    let field = |f: &str| format!("flows[{i}].{f}");
    let (src, dst) = (addr(i, "src", &e.src)?, addr(i, "dst", &e.dst)?);
    let family_error = || {
        InitError::invalid(
            field("dst"),
            "src and dst must be of the same address family",
        )
    };
    if src.is_ipv4() != dst.is_ipv4() {
        return Err(family_error());
    }
    let proto = proto_or_any(&e.proto)
        .map_err(|m| InitError::invalid(field("proto"), m.to_string()))?
        .ok_or_else(|| {
            InitError::invalid(
                field("proto"),
                "FlowFwd matches one protocol exactly, not any",
            )
        })?;
    let ports = PORT_PROTOS.contains(&proto);
    let port = |f: &str, v: Option<u16>| match (ports, v) {
        (true, Some(p)) => Ok(p),
        (true, None) => Err(InitError::invalid(
            field(f),
            "required for tcp, udp and sctp",
        )),
        (false, None) => Ok(0),
        (false, Some(_)) => Err(InitError::invalid(field(f), "this protocol has no ports")),
    };
    let (src_port, dst_port) = (port("src_port", e.src_port)?, port("dst_port", e.dst_port)?);
    FlowKey::new(src, dst, proto, src_port, dst_port).ok_or_else(family_error)
}

impl FlowFwdState {
    /// Builds a tenant's state from its policy; at most `max_flows` entries.
    pub fn from_policy(policy: &FlowFwdPolicy, max_flows: u32) -> Result<Self, InitError> {
        if policy.flows.len() > max_flows as usize {
            return Err(InitError::invalid(
                "flows",
                format!(
                    "{} flows exceed the registered maximum of {max_flows}",
                    policy.flows.len()
                ),
            ));
        }
        let miss = MissAction::parse(&policy.default)?;
        let mut fwd = FwdTable::with_capacity(miss, policy.flows.len());
        for (i, e) in policy.flows.iter().enumerate() {
            fwd.push(compile_flow(i, e)?, e.port).map_err(|j| {
                InitError::invalid(
                    format!("flows[{i}]"),
                    format!("the same 5-tuple as flows[{j}]"),
                )
            })?;
        }
        Ok(FlowFwdState { fwd })
    }

    /// Forwards one packet. Never allocates.
    #[inline]
    pub fn process(&mut self, pkt: &Packet<'_>) -> Verdict {
        self.fwd.forward(Some(&pkt.flow_key()))
    }

    /// Packets forwarded per entry, in policy order.
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

/// The FlowFwd NF (multi-tenant).
#[derive(Clone, Debug)]
pub struct FlowFwd {
    max_flows: u32,
}

impl Default for FlowFwd {
    fn default() -> Self {
        FlowFwd {
            max_flows: DEFAULT_MAX_FLOWS,
        }
    }
}

impl FlowFwd {
    /// A forwarder whose tenants may have up to `max_flows` entries each.
    pub fn with_max_flows(max_flows: u32) -> Self {
        FlowFwd { max_flows }
    }
}

impl NetworkFunction for FlowFwd {
    type State = FlowFwdState;
    type Policy = FlowFwdPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "flowfwd"
    }

    fn register(&self) -> MemorySpec {
        // Per entry: hash slot (key + index + control byte, 8/7 load), port, hit counter.
        let per_entry = (std::mem::size_of::<FlowKey>() + 4 + 1) * 8 / 7 + 2 + 8;
        MemorySpec::with_extra::<FlowFwdState>(self.max_flows as usize * per_entry)
    }

    fn init(&self, policy: &FlowFwdPolicy, state: &mut FlowFwdState) -> Result<(), InitError> {
        *state = FlowFwdState::from_policy(policy, self.max_flows)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut FlowFwdState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &FlowFwdState) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant FlowFwd: the same logic over one plain table, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantFlowFwd {
    /// The one tenant's state.
    pub state: FlowFwdState,
}

impl SingleTenantFlowFwd {
    /// A forwarder with `policy`'s table.
    pub fn new(policy: &FlowFwdPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantFlowFwd {
            state: FlowFwdState::from_policy(policy, DEFAULT_MAX_FLOWS)?,
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
    use buffet_sdk::{DropCause, PacketMeta};
    use etherparse::PacketBuilder;

    const DROP: Verdict = Verdict::Drop(DropCause::Policy);

    fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src, dst, 64)
            .tcp(sport, dport, 1, 1000)
            .write(&mut v, b"x")
            .unwrap();
        v
    }

    fn run(st: &mut FlowFwdState, bytes: &[u8]) -> Verdict {
        let mut b = bytes.to_vec();
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        FlowFwd::default().handle(&mut p, st)
    }

    fn state(toml_text: &str) -> FlowFwdState {
        let p: FlowFwdPolicy = toml::from_str(toml_text).unwrap();
        let mut st = FlowFwdState::default();
        FlowFwd::default().init(&p, &mut st).unwrap();
        st
    }

    /// SCTP entries need and match ports, like TCP and UDP.
    #[test]
    fn sctp_entries_match_sctp_ports() {
        use crate::test_frames::sctp;
        let mut st = state(
            r#"
            [[flows]]
            src = "10.0.0.1"
            dst = "10.0.0.2"
            proto = "sctp"
            src_port = 3868
            dst_port = 3868
            port = 4
            "#,
        );
        let f = |sport| sctp("10.0.0.1", "10.0.0.2", sport, 3868, b"x");
        assert_eq!(run(&mut st, &f(3868)), Verdict::Forward(4));
        assert_eq!(run(&mut st, &f(3869)), DROP);
        assert_eq!(st.entry_hits(), &[1]);
    }

    /// An IPv4 entry never forwards the IPv6 packet whose addresses are the IPv4-mapped
    /// form of its addresses, and an `::ffff:` IPv6 entry never forwards IPv4.
    #[test]
    fn entries_keep_their_address_family() {
        use crate::test_frames::udp;
        let mut st = state(
            r#"
            [[flows]]
            src = "10.3.1.1"
            dst = "10.3.1.2"
            proto = "udp"
            src_port = 5000
            dst_port = 53
            port = 1
            [[flows]]
            src = "::ffff:10.3.1.9"
            dst = "::ffff:10.3.1.2"
            proto = "udp"
            src_port = 5000
            dst_port = 53
            port = 2
            "#,
        );
        let v4 = |s| udp(s, "10.3.1.2", 5000, 53, b"q");
        let v6 = |s| udp(s, "::ffff:10.3.1.2", 5000, 53, b"q");
        assert_eq!(run(&mut st, &v4("10.3.1.1")), Verdict::Forward(1));
        assert_eq!(run(&mut st, &v6("::ffff:10.3.1.1")), DROP);
        assert_eq!(run(&mut st, &v6("::ffff:10.3.1.9")), Verdict::Forward(2));
        assert_eq!(run(&mut st, &v4("10.3.1.9")), DROP);
        assert_eq!(st.entry_hits(), &[1, 1]);
    }

    const TABLE: &str = r#"
        [[flows]]
        src = "192.168.0.1"
        dst = "192.168.1.1"
        proto = "tcp"
        src_port = 40000
        dst_port = 80
        port = 2
        [[flows]]
        src = "2001:db8::1"
        dst = "2001:db8::2"
        proto = 17
        src_port = 53
        dst_port = 53
        port = 3
        [[flows]]
        src = "192.168.0.1"
        dst = "192.168.1.1"
        proto = "icmp"
        port = 4
    "#;

    #[test]
    fn forwards_exact_flows_only() {
        let mut st = state(TABLE);
        let flow = tcp([192, 168, 0, 1], [192, 168, 1, 1], 40000, 80);
        assert_eq!(run(&mut st, &flow), Verdict::Forward(2));
        // Reverse direction, other ports, other addresses: misses.
        assert_eq!(
            run(&mut st, &tcp([192, 168, 1, 1], [192, 168, 0, 1], 80, 40000)),
            DROP
        );
        assert_eq!(
            run(&mut st, &tcp([192, 168, 0, 1], [192, 168, 1, 1], 40001, 80)),
            DROP
        );
        assert_eq!(
            run(&mut st, &tcp([192, 168, 0, 2], [192, 168, 1, 1], 40000, 80)),
            DROP
        );
        let mut v6 = Vec::new();
        let (mut s6, mut d6) = ([0u8; 16], [0u8; 16]);
        s6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        d6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        s6[15] = 1;
        d6[15] = 2;
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6(s6, d6, 64)
            .udp(53, 53)
            .write(&mut v6, b"q")
            .unwrap();
        assert_eq!(run(&mut st, &v6), Verdict::Forward(3));
        let mut icmp = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([192, 168, 0, 1], [192, 168, 1, 1], 64)
            .icmpv4_echo_request(7, 1)
            .write(&mut icmp, b"ping")
            .unwrap();
        assert_eq!(run(&mut st, &icmp), Verdict::Forward(4));
        assert_eq!(st.entry_hits(), &[1, 1, 1]);
        assert_eq!((st.counters().forwarded, st.counters().dropped), (3, 3));
        let mut to_port = state(&format!("default = \"0\"\n{TABLE}"));
        assert_eq!(
            run(&mut to_port, &tcp([1; 4], [2; 4], 1, 2)),
            Verdict::Forward(0)
        );
        assert_eq!(to_port.counters().default_forwarded, 1);
    }

    #[test]
    fn fragments_and_truncated_frames_never_panic() {
        let mut st = state(TABLE);
        let mut frag = tcp([192, 168, 0, 1], [192, 168, 1, 1], 40000, 80);
        frag[21] = 0x10; // fragment offset: no ports -> a miss
        assert_eq!(run(&mut st, &frag), DROP);
        let good = tcp([192, 168, 0, 1], [192, 168, 1, 1], 40000, 80);
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            if let Ok(mut p) = Packet::parse(&mut b, PacketMeta::default()) {
                FlowFwd::default().handle(&mut p, &mut st);
            }
        }
        assert_eq!(st.counters().packets, 1);
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let entry = |body: &str| format!("[[flows]]\nport = 1\n{body}");
        for (text, field) in [
            (
                entry("src = \"10.0.0.0/8\"\ndst = \"10.0.0.1\"\nproto = \"icmp\""),
                "flows[0].src",
            ),
            (
                entry("src = \"10.0.0.1\"\ndst = \"::1\"\nproto = \"icmp\""),
                "flows[0].dst",
            ),
            (
                entry("src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nproto = \"any\""),
                "flows[0].proto",
            ),
            (
                entry("src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nproto = \"tcp\"\ndst_port = 80"),
                "flows[0].src_port",
            ),
            (
                entry("src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nproto = \"icmp\"\nsrc_port = 1"),
                "flows[0].src_port",
            ),
            (
                format!(
                    "{}\n{}",
                    entry("src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nproto = 1"),
                    entry("src = \"10.0.0.1\"\ndst = \"10.0.0.2\"\nproto = \"icmp\"")
                ),
                "flows[1]",
            ),
            ("default = \"nowhere\"".to_string(), "default"),
        ] {
            let p: FlowFwdPolicy = toml::from_str(&text).unwrap();
            let e = FlowFwd::default()
                .init(&p, &mut FlowFwdState::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{field}`")), "{text}: {e}");
        }
        assert!(toml::from_str::<FlowFwdPolicy>(&entry(
            "src = \"a\"\ndst = \"b\"\nproto = 1\nout = 2"
        ))
        .is_err());
        assert!(
            toml::from_str::<FlowFwdPolicy>("[[flows]]\nsrc = \"10.0.0.1\"\nport = 1").is_err()
        );
        let e = FlowFwd::with_max_flows(1)
            .init(
                &toml::from_str(TABLE).unwrap(),
                &mut FlowFwdState::default(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("`flows`"), "{e}");
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
        // Both tenants use the same 192.168.0.0/16 5-tuple; it goes to different ports.
        let flow = "src = \"192.168.0.1\"\ndst = \"192.168.1.1\"\nproto = \"tcp\"\nsrc_port = 40000\ndst_port = 80";
        let mut a = state(&format!("[[flows]]\n{flow}\nport = 1"));
        let mut b = state(&format!("default = 9\n[[flows]]\n{flow}\nport = 2"));
        let pkt = tcp([192, 168, 0, 1], [192, 168, 1, 1], 40000, 80);
        let other = tcp([192, 168, 0, 1], [192, 168, 1, 1], 40000, 81);
        assert_eq!(
            [run(&mut a, &pkt), run(&mut a, &other)],
            [Verdict::Forward(1), DROP]
        );
        assert_eq!(
            [run(&mut b, &pkt), run(&mut b, &pkt), run(&mut b, &other)],
            [
                Verdict::Forward(2),
                Verdict::Forward(2),
                Verdict::Forward(9)
            ]
        );
        assert_eq!((a.entry_hits(), b.entry_hits()), (&[1u64][..], &[2u64][..]));
        assert_eq!((a.counters().dropped, b.counters().dropped), (1, 0));
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let policy: FlowFwdPolicy = toml::from_str(TABLE).unwrap();
        let mut single = SingleTenantFlowFwd::new(&policy).unwrap();
        let mut st = state(TABLE);
        for pkt in [
            tcp([192, 168, 0, 1], [192, 168, 1, 1], 40000, 80),
            tcp([1; 4], [2; 4], 1, 2),
        ] {
            let mut b = pkt.clone();
            let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
            assert_eq!(single.handle(&mut p), run(&mut st, &pkt));
        }
        assert_eq!(single.state.counters(), st.counters());
    }
}
