//! The tenants file (`tenants.toml`): ids, names, classifier rules, MAX_NB, NF policy.
//!
//! ```toml
//! [[tenant]]
//! id = 7                      # tenant id (u32)
//! name = "acme"
//! rules = [ { dst_ip = "10.7.0.0/16" },
//!           { src_ip = "192.168.7.0/24", protocol = "udp", dst_port = "5000-5099", priority = 10 } ]
//! max_nb = 0                  # MAX_NB per timeslot, 0 = unlimited
//! isolation = "mpk"           # optional: safe | mpk | ebpf (must match the run's level)
//! [tenant.policy]             # handed to the NF's init, NF-specific
//! ```
//!
//! Rule fields: `priority` (lower wins, default 100), `in_port`, `src_mac`, `dst_mac`,
//! `vlan`, `src_ip`, `dst_ip` (IPv4/IPv6 with optional `/prefix`), `protocol` (`tcp`,
//! `udp`, `icmp`, `icmpv6`, `sctp`, `gre`, `esp` or a number), `src_port`, `dst_port`
//! (`80` or `"5000-5099"`), `dscp` (0–63). Values parse with [`buffet_sdk::policy`].
//! Every error names the file, the tenant and the field, and nothing runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use buffet_dispatch::{IpPrefix, Match, PortRange};
use buffet_sdk::policy::{parse_mac, NumOrName};
use buffet_sdk::TenantId;
use serde::Deserialize;

/// Priority of a rule that does not give one.
pub const DEFAULT_PRIORITY: u32 = 100;

/// One tenant, validated; the policy is still NF-agnostic TOML.
#[derive(Clone, Debug)]
pub struct TenantConfig {
    /// Tenant id.
    pub id: TenantId,
    /// Name (defaults to `tenant-<id>`).
    pub name: String,
    /// `(priority, match)` rules.
    pub rules: Vec<(u32, Match)>,
    /// MAX_NB per timeslot.
    pub max_nb: u64,
    /// The isolation level the tenant asks for (`isolation = "mpk"`), if any.
    pub isolation: Option<Isolation>,
    /// The NF policy table.
    pub policy: toml::Table,
}

/// An isolation level (docs/isolation.md): what keeps one tenant's NF code away from the
/// others' state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The type system: safe Rust NFs, each handler sees one tenant's state.
    Safe,
    /// Intel memory protection keys: native (C or unsafe Rust) NFs, faults contained.
    Mpk,
    /// Verified eBPF bytecode (buffet-ebpf).
    Ebpf,
}

impl Isolation {
    /// `safe`, `mpk` or `ebpf`.
    pub const fn name(self) -> &'static str {
        match self {
            Isolation::Safe => "safe",
            Isolation::Mpk => "mpk",
            Isolation::Ebpf => "ebpf",
        }
    }
}

/// A tenants file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// Unreadable file.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML, or a value of the wrong shape.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A field of one tenant is invalid.
    #[error("{path}: tenant {tenant}: {field}: {message}")]
    Field {
        /// The file.
        path: PathBuf,
        /// `7 ("acme")` or `#3` when there is no id.
        tenant: String,
        /// The field, e.g. `rules[1].dst_ip`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tenant: Vec<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    id: u32,
    name: Option<String>,
    #[serde(default)]
    rules: Vec<toml::Value>,
    #[serde(default)]
    max_nb: u64,
    #[serde(default)]
    isolation: Option<Isolation>,
    #[serde(default)]
    policy: toml::Table,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRule {
    priority: Option<u32>,
    in_port: Option<u16>,
    src_mac: Option<String>,
    dst_mac: Option<String>,
    vlan: Option<u16>,
    src_ip: Option<String>,
    dst_ip: Option<String>,
    protocol: Option<NumOrName>,
    src_port: Option<NumOrName>,
    dst_port: Option<NumOrName>,
    dscp: Option<u8>,
}

/// Reads and validates a tenants file.
pub fn load(path: &Path) -> Result<Vec<TenantConfig>, TenantsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// Validates tenants-file text (`path` only names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<Vec<TenantConfig>, TenantsError> {
    let syntax = |message: String| TenantsError::Syntax {
        path: path.to_owned(),
        message,
    };
    let raw: RawFile = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
    if raw.tenant.is_empty() {
        return Err(syntax("no [[tenant]] entries".into()));
    }
    let mut out = Vec::with_capacity(raw.tenant.len());
    let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, value) in raw.tenant.into_iter().enumerate() {
        let label = tenant_label(&value, i);
        let field_err = |field: &str, message: String| TenantsError::Field {
            path: path.to_owned(),
            tenant: label.clone(),
            field: field.to_owned(),
            message,
        };
        let t: RawTenant = value
            .try_into()
            .map_err(|e: toml::de::Error| field_err("(tenant)", e.message().trim().to_owned()))?;
        if let Some(first) = seen.insert(t.id, i) {
            return Err(field_err(
                "id",
                format!("duplicate tenant id {} (also tenant #{})", t.id, first + 1),
            ));
        }
        let mut rules = Vec::with_capacity(t.rules.len());
        for (r, rule) in t.rules.into_iter().enumerate() {
            let at = |f: &str| format!("rules[{r}]{}{f}", if f.is_empty() { "" } else { "." });
            let raw: RawRule = rule
                .try_into()
                .map_err(|e: toml::de::Error| field_err(&at(""), e.message().trim().to_owned()))?;
            rules.push(build_rule(raw).map_err(|(f, m)| field_err(&at(f), m))?);
        }
        if rules.is_empty() {
            return Err(field_err(
                "rules",
                "at least one classifier rule is needed".into(),
            ));
        }
        out.push(TenantConfig {
            id: TenantId(t.id),
            name: t.name.unwrap_or_else(|| format!("tenant-{}", t.id)),
            rules,
            max_nb: t.max_nb,
            isolation: t.isolation,
            policy: t.policy,
        });
    }
    Ok(out)
}

fn tenant_label(value: &toml::Value, i: usize) -> String {
    let id = value.get("id").and_then(|v| v.as_integer());
    let name = value.get("name").and_then(|v| v.as_str());
    match (id, name) {
        (Some(id), Some(n)) => format!("{id} ({n:?})"),
        (Some(id), None) => id.to_string(),
        _ => format!("#{}", i + 1),
    }
}

type FieldError = (&'static str, String);

fn build_rule(raw: RawRule) -> Result<(u32, Match), FieldError> {
    let mut m = Match {
        in_port: raw.in_port,
        vlan: raw.vlan,
        ..Match::default()
    };
    if let Some(v) = raw.vlan {
        if v > 4095 {
            return Err(("vlan", format!("{v} is not a VLAN id (0-4095)")));
        }
    }
    if let Some(d) = raw.dscp {
        if d > 63 {
            return Err(("dscp", format!("{d} does not fit in 6 bits (0-63)")));
        }
        m.dscp = Some(d);
    }
    m.src_mac = raw
        .src_mac
        .map(|s| parse_mac(&s))
        .transpose()
        .map_err(|e| ("src_mac", e.to_string()))?;
    m.dst_mac = raw
        .dst_mac
        .map(|s| parse_mac(&s))
        .transpose()
        .map_err(|e| ("dst_mac", e.to_string()))?;
    m.src_ip = raw
        .src_ip
        .map(|s| prefix(&s))
        .transpose()
        .map_err(|e| ("src_ip", e))?;
    m.dst_ip = raw
        .dst_ip
        .map(|s| prefix(&s))
        .transpose()
        .map_err(|e| ("dst_ip", e))?;
    m.protocol = raw
        .protocol
        .map(|p| p.protocol())
        .transpose()
        .map_err(|e| ("protocol", e.to_string()))?;
    m.src_port = raw
        .src_port
        .map(|p| ports(&p))
        .transpose()
        .map_err(|e| ("src_port", e))?;
    m.dst_port = raw
        .dst_port
        .map(|p| ports(&p))
        .transpose()
        .map_err(|e| ("dst_port", e))?;
    if (m.src_port.is_some() || m.dst_port.is_some())
        && !matches!(m.protocol, Some(6) | Some(17) | Some(132))
    {
        return Err((
            "protocol",
            "port rules need protocol = \"tcp\", \"udp\" or \"sctp\"".into(),
        ));
    }
    if let (Some(s), Some(d)) = (&m.src_ip, &m.dst_ip) {
        if s.is_ipv4() != d.is_ipv4() {
            return Err((
                "dst_ip",
                "src_ip and dst_ip are of different IP versions".into(),
            ));
        }
    }
    if m == Match::default() {
        return Err(("(rule)", "a rule must match at least one field".into()));
    }
    Ok((raw.priority.unwrap_or(DEFAULT_PRIORITY), m))
}

fn prefix(s: &str) -> Result<IpPrefix, String> {
    s.parse::<IpPrefix>()
        .map_err(|e| format!("invalid prefix {s:?}: {e}"))
}

fn ports(p: &NumOrName) -> Result<PortRange, String> {
    p.port_range()
        .map_err(|e| format!("invalid port or range {:?}: {e}", p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("t.toml"), text).unwrap_err().to_string()
    }

    #[test]
    fn parses_the_documented_example() {
        let t = parse(
            Path::new("t.toml"),
            r#"
[[tenant]]
id = 7
name = "acme"
rules = [ { dst_ip = "10.7.0.0/16" }, { src_ip = "192.168.7.0/24", protocol = "udp", dst_port = "5000-5099", priority = 5 } ]
max_nb = 0
[tenant.policy]
flow_capacity = 128

[[tenant]]
id = 8
rules = [ { dst_ip = "2001:db8::/32", vlan = 12, src_mac = "02:00:00:00:00:01", dscp = 10, in_port = 1, dst_port = 443, protocol = 6 } ]
"#,
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].rules[0].0, DEFAULT_PRIORITY);
        assert_eq!(t[0].rules[1].0, 5);
        assert_eq!(t[0].rules[1].1.protocol, Some(17));
        assert_eq!(
            t[0].rules[1].1.dst_port,
            Some(PortRange { lo: 5000, hi: 5099 })
        );
        assert_eq!(
            t[0].policy
                .get("flow_capacity")
                .and_then(|v| v.as_integer()),
            Some(128)
        );
        assert_eq!(t[1].name, "tenant-8");
        assert_eq!(t[1].rules[0].1.src_mac, Some([2, 0, 0, 0, 0, 1]));
    }

    #[test]
    fn errors_name_file_tenant_and_field() {
        let e =
            err("[[tenant]]\nid = 7\nname = \"acme\"\nrules = [ { dst_ip = \"10.0.0.0/33\" } ]\n");
        assert!(
            e.contains("t.toml") && e.contains("7 (\"acme\")") && e.contains("rules[0].dst_ip"),
            "{e}"
        );
        let e = err("[[tenant]]\nid = 7\nrules = [ { dst_ipp = \"10.0.0.0/8\" } ]\n");
        assert!(e.contains("rules[0]") && e.contains("dst_ipp"), "{e}");
        let e = err("[[tenant]]\nid = 7\ncolour = 1\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n");
        assert!(e.contains("colour"), "{e}");
        let e = err("[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n");
        assert!(e.contains("duplicate tenant id 7"), "{e}");
        let e = err("[[tenant]]\nid = 7\nrules = [ { dst_port = 80 } ]\n");
        assert!(e.contains("protocol"), "{e}");
        let e =
            err("[[tenant]]\nid = 7\nrules = [ { protocol = \"udp\", dst_port = \"90-80\" } ]\n");
        assert!(e.contains("rules[0].dst_port"), "{e}");
        let e = err("[[tenant]]\nid = 7\nrules = [ { src_mac = \"zz:00:00:00:00:00\" } ]\n");
        assert!(e.contains("src_mac"), "{e}");
        let e = err("[[tenant]]\nid = 7\nrules = []\n");
        assert!(e.contains("rules"), "{e}");
        let e = err("[[tenants]]\nid = 7\n");
        assert!(e.contains("tenants"), "{e}");
        let e = err(
            "[[tenant]]\nid = 7\nisolation = \"vm\"\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n",
        );
        assert!(e.contains("vm") && e.contains("mpk"), "{e}");
    }

    #[test]
    fn isolation_is_optional_per_tenant() {
        let t = parse(
            Path::new("t.toml"),
            "[[tenant]]\nid = 1\nisolation = \"mpk\"\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n\
             [[tenant]]\nid = 2\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
        )
        .unwrap();
        assert_eq!(t[0].isolation, Some(Isolation::Mpk));
        assert_eq!(t[1].isolation, None);
    }
}
