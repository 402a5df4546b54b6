//! The Firewall's policy: what a tenant writes (TOML/JSON) and how one rule of it is
//! validated and compiled into a [`Rule`]. No lookup happens here.

use buffet_sdk::policy::{parse_protocol, IpPrefix, PolicyValueError, PortRange};
use buffet_sdk::InitError;
use serde::Deserialize;

use super::acl::Rule;
use super::PORT_PROTOS;

/// What a rule (or the default) does with a packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let the packet pass.
    Allow,
    /// Drop the packet ([`DropCause::Policy`](buffet_sdk::DropCause::Policy)).
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
pub(super) fn ports_or_any(spec: &NumOrName) -> Result<PortRange, PolicyValueError> {
    match spec {
        NumOrName::Name(s) if is_any(s) => Ok(PortRange::ALL),
        NumOrName::Name(s) => s.trim().parse(),
        NumOrName::Num(_) => spec.port_range(),
    }
}

pub(super) fn compile_rule(i: usize, r: &RulePolicy) -> Result<Rule, InitError> {
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
