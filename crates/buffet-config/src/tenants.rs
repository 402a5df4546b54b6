//! The tenants file: ids, names, classifier rules, MAX_NB, isolation level, NF policy.
//!
//! The same schema in two formats, chosen by the file's extension (`.toml` or `.json`):
//!
//! ```toml
//! [[tenant]]
//! id = 7                      # tenant id (u32)
//! name = "acme"
//! rules = [ { dst_ip = "10.7.0.0/16" },
//!           { src_ip = "192.168.7.0/24", protocol = "udp", dst_port = "5000-5099", priority = 10 } ]
//! max_nb = 0                  # MAX_NB per timeslot, 0 = unlimited
//! weight = 1                  # optional: share of its worker's time when backlogged (DRR)
//! isolation = "mpk"           # optional: safe | mpk | ebpf | trusted-native (must match the run's level)
//! [tenant.policy]             # handed to the NF's init, NF-specific
//! ```
//!
//! ```json
//! { "tenant": [
//!   { "id": 7, "name": "acme",
//!     "rules": [ { "dst_ip": "10.7.0.0/16" },
//!                { "src_ip": "192.168.7.0/24", "protocol": "udp", "dst_port": "5000-5099", "priority": 10 } ],
//!     "max_nb": 0, "isolation": "mpk",
//!     "policy": { } } ] }
//! ```
//!
//! Rule fields: `priority` (lower wins, default 100), `in_port`, `src_mac`, `dst_mac`,
//! `vlan`, `src_ip`, `dst_ip` (IPv4/IPv6 with optional `/prefix`), `protocol` (`tcp`,
//! `udp`, `icmp`, `icmpv6`, `sctp`, `gre`, `esp` or a number), `src_port`, `dst_port`
//! (`80` or `"5000-5099"`; a rule with a port needs `protocol` `tcp`, `udp` or `sctp`,
//! the same check as admission), `dscp` (0–63). Values parse with [`buffet_sdk::policy`].
//! Every error names the file, the tenant and the field, and nothing runs.
//!
//! The policy is kept as a format-neutral [`Policy`] (a JSON object; TOML values map to
//! their JSON equivalents, datetimes to their RFC 3339 text), so a TOML file and a JSON
//! file with the same content give every NF the same policy. It is checked against an
//! NF only when [`TenantConfig::policy_as`] builds that NF's `Policy` type.
//!
//! A tenant may name its own chain of NFs (docs/chains.md), stage by stage, instead of
//! running the run's NF:
//!
//! ```toml
//! [[tenant.chain]]
//! nf = "firewall"             # a reference NF; or nf_lib = "x.so" (C), nf_ebpf = "x.o" (eBPF)
//! policy = { default = "allow", rules = [ { action = "deny", proto = "tcp", dst_port = 80 } ] }
//! [[tenant.chain]]
//! nf = "dpi"
//! when = { protocol = "tcp", dst_port = 443 }   # the rule fields (no priority) and `mark`
//! ```
//!
//! (JSON: `"chain": [ { "nf": "firewall", "policy": { … } }, { "nf": "dpi", "when": { … } } ]`.)
//! A stage names exactly one of `nf`, `nf_lib`, `nf_ebpf`; a chain has 1 to
//! [`MAX_STAGES`] stages; `when` is checked like a rule (plus `mark`, a `u32`). Errors
//! name the file, the tenant, the stage (`chain[1].when.dst_port`). Whether a stage's
//! policy suits its NF is checked when the NFs are loaded ([`crate::chain`]). A tenant's
//! own single NF (`nf` on the tenant) is reserved: rejected with "not supported yet"; a
//! one-stage chain says the same.
//! This module does not read clocks, admit tenants or know which NF a run uses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use buffet_dispatch::{IpPrefix, Match, PortRange};
use buffet_sdk::policy::{parse_mac, NumOrName};
use buffet_sdk::TenantId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::chain::{Guard, MAX_STAGES};
use crate::isolation::Isolation;
use crate::registry::{EbpfEngine, NfSpec};

/// Priority of a rule that does not give one.
pub const DEFAULT_PRIORITY: u32 = 100;

/// Most classifier rules one tenant may have.
pub const MAX_RULES_PER_TENANT: usize = 256;

/// Most tuple-space entries one tenant's rules may expand to (a port range is the
/// prefixes that cover it: `1-65534` is 30 of them, a pair of such ranges 900). Every
/// entry is memory in the Classifier and work when the tenant leaves.
pub const MAX_RULE_KEYS_PER_TENANT: usize = 4096;

/// Longest tenant name, in bytes. A name travels in every report, metrics label, event
/// and log line that names its tenant.
pub const MAX_NAME_BYTES: usize = 256;

/// The two forms of a tenants file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// TOML: `[[tenant]]` tables.
    Toml,
    /// JSON: `{ "tenant": [ ... ] }`.
    Json,
}

impl Format {
    /// The format a file's extension names (`.toml` or `.json`, any case).
    pub fn of_path(path: &Path) -> Result<Format, TenantsError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("toml") => Ok(Format::Toml),
            Some("json") => Ok(Format::Json),
            _ => Err(TenantsError::Format {
                path: path.to_owned(),
            }),
        }
    }

    /// `toml` or `json`.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Toml => "toml",
            Format::Json => "json",
        }
    }
}

/// A tenant's NF policy, independent of the file format it came from: a JSON object.
///
/// Any NF's `Policy: DeserializeOwned` is built from it ([`Policy::decode`]); a C NF's
/// policy is this object itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Policy(serde_json::Value);

impl Default for Policy {
    fn default() -> Self {
        Policy(serde_json::Value::Object(serde_json::Map::new()))
    }
}

impl Policy {
    /// An empty policy (`{}`): every field at the NF's default.
    pub fn new() -> Policy {
        Policy::default()
    }

    /// The policy made of these fields.
    pub fn from_map(map: serde_json::Map<String, serde_json::Value>) -> Policy {
        Policy(serde_json::Value::Object(map))
    }

    /// The fields.
    pub fn as_map(&self) -> &serde_json::Map<String, serde_json::Value> {
        match &self.0 {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("a Policy is always an object"),
        }
    }

    /// The policy as a JSON value (always an object).
    pub fn as_value(&self) -> &serde_json::Value {
        &self.0
    }

    /// Builds an NF's policy type from it; the error is the deserializer's message.
    pub fn decode<P: DeserializeOwned>(&self) -> Result<P, String> {
        P::deserialize(&self.0).map_err(|e| e.to_string())
    }

    /// [`decode`](Self::decode) whose error also names the field the NF's policy type
    /// refused (`policy.flow_capacity`, `policy.rules[2].proto`).
    pub fn decode_field<P: DeserializeOwned>(&self) -> Result<P, PolicyError> {
        serde_path_to_error::deserialize(&self.0).map_err(|e| PolicyError {
            path: path_text(e.path()),
            message: e.inner().to_string().trim().to_owned(),
        })
    }
}

/// A policy the NF's policy type refused ([`Policy::decode_field`]); shown as
/// `policy.flow_capacity: invalid type: ...`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", self.field())]
pub struct PolicyError {
    /// The refused field inside the policy (`flow_capacity`, `rules[2].proto`); empty
    /// when it is the policy as a whole (an unknown field, which the message names).
    pub path: String,
    /// The deserializer's message.
    pub message: String,
}

impl PolicyError {
    /// The field as the tenants file names it: `policy`, `policy.flow_capacity`.
    pub fn field(&self) -> String {
        join_field("policy", &self.path)
    }
}

/// `base` and a path below it: `rules[0]` + `vlan` is `rules[0].vlan`, `chain` + `[1]`
/// is `chain[1]`, and an empty path is `base`.
fn join_field(base: &str, path: &str) -> String {
    match path.chars().next() {
        None => base.to_owned(),
        Some('[') => format!("{base}{path}"),
        Some(_) if base.is_empty() => path.to_owned(),
        Some(_) => format!("{base}.{path}"),
    }
}

/// A deserializer's path as a field name (`rules[2].proto`); empty at the top, and cut
/// before a segment it cannot name.
fn path_text(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => out = join_field(&out, key),
            Segment::Enum { variant } => out = join_field(&out, variant),
            Segment::Unknown => break,
        }
    }
    out
}

/// One stage of a tenant's chain (`[[tenant.chain]]`), validated.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StageConfig {
    /// The stage's NF (`nf`, `nf_lib = "x.so"` as `c:x.so`, `nf_ebpf = "x.o"` as
    /// `ebpf:x.o`).
    pub nf: NfSpec,
    /// The stage's policy.
    pub policy: Policy,
    /// The stage runs only for packets this guard matches (`when`); `None`: every packet.
    pub when: Option<Guard>,
}

impl StageConfig {
    /// A stage running `nf` with `policy` for every packet.
    pub fn new(nf: NfSpec, policy: Policy) -> StageConfig {
        StageConfig {
            nf,
            policy,
            when: None,
        }
    }
}

/// What is wrong with the tenants of `tenants` whose rules match on `vlan` where frames
/// reach the data plane through XDP (an XDP program or an AF_XDP socket), one sentence
/// naming them, or `None` when no rule does: where the NIC or its driver takes the
/// 802.1Q tag out of a received frame (VLAN offload), the tag is not in the bytes XDP
/// sees, so such a rule matches no such frame. `buffet run` and buffetd each add their
/// own prefix and remedy.
pub fn stripped_vlan_problem<'a>(
    tenants: impl IntoIterator<Item = &'a TenantConfig>,
) -> Option<String> {
    let ids: Vec<String> = tenants
        .into_iter()
        .filter(|t| t.rules.iter().any(|(_, m)| m.vlan.is_some()))
        .map(|t| t.id.to_string())
        .collect();
    if ids.is_empty() {
        return None;
    }
    Some(format!(
        "tenant{} {} match{} on vlan, but an XDP program and an AF_XDP socket see a frame \
         without its 802.1Q tag where the NIC or its driver takes the tag out on receive \
         (VLAN offload): such frames match no vlan rule",
        if ids.len() > 1 { "s" } else { "" },
        ids.join(", "),
        if ids.len() > 1 { "" } else { "es" },
    ))
}

/// One tenant, validated; the policy is still NF-agnostic.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TenantConfig {
    /// Tenant id.
    pub id: TenantId,
    /// Name (defaults to `tenant-<id>`).
    pub name: String,
    /// `(priority, match)` rules.
    pub rules: Vec<(u32, Match)>,
    /// MAX_NB per timeslot.
    pub max_nb: u64,
    /// Weight in the deficit round robin of its worker's Packet Buffers (at least 1).
    pub weight: u32,
    /// The isolation level the tenant asks for (`isolation = "mpk"`), if any.
    pub isolation: Option<Isolation>,
    /// The NF policy.
    pub policy: Policy,
    /// The tenant's own NF instead of the run's. Reserved: always `None` for now.
    pub nf: Option<NfSpec>,
    /// The tenant's chain of NFs (1 to [`MAX_STAGES`] stages); empty: the run's NF, with
    /// [`policy`](Self::policy), is the tenant's one-stage chain.
    pub chain: Vec<StageConfig>,
}

impl TenantConfig {
    /// A tenant named `tenant-<id>` with these rules, no MAX_NB, no isolation request
    /// and an empty policy.
    pub fn new(id: TenantId, rules: Vec<(u32, Match)>) -> TenantConfig {
        TenantConfig {
            id,
            name: format!("tenant-{}", id.0),
            rules,
            max_nb: 0,
            weight: 1,
            isolation: None,
            policy: Policy::new(),
            nf: None,
            chain: Vec::new(),
        }
    }

    /// Builds the tenant's policy for an NF whose policy type is `P`; the error names
    /// `file` (the tenants file, or whatever the tenants came from), the tenant and
    /// `policy`.
    pub fn policy_as<P: DeserializeOwned>(&self, file: &Path) -> Result<P, TenantsError> {
        self.policy.decode_field().map_err(|e| TenantsError::Field {
            path: file.to_owned(),
            tenant: format!("{} ({:?})", self.id, self.name),
            field: e.field(),
            message: e.message,
        })
    }
}

/// A tenants file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// The extension names no known format.
    #[error("{}: a tenants file is .toml or .json", path.display())]
    Format {
        /// The file.
        path: PathBuf,
    },
    /// Unreadable file.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML or JSON, or a value of the wrong shape.
    #[error("{}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A field of one tenant is invalid.
    #[error("{}: tenant {tenant}: {field}: {message}", path.display())]
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

/// A parsed document of either format: what validation needs from it.
trait Doc: DeserializeOwned {
    fn int(&self, key: &str) -> Option<i64>;
    fn str(&self, key: &str) -> Option<&str>;
    /// Converts to `T`; the error is the path of the refused field inside the value
    /// (`max_nb`, `""` for the value as a whole) and the message alone (no position).
    fn decode<T: DeserializeOwned>(self) -> Result<T, (String, String)>;
    /// The value as a policy object.
    fn into_policy(self) -> Result<Policy, String>;
}

impl Doc for toml::Value {
    fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(toml::Value::as_integer)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(toml::Value::as_str)
    }

    fn decode<T: DeserializeOwned>(self) -> Result<T, (String, String)> {
        serde_path_to_error::deserialize(self).map_err(|e| {
            let path = path_text(e.path());
            (path, e.into_inner().message().trim().to_owned())
        })
    }

    fn into_policy(self) -> Result<Policy, String> {
        match toml_to_json(self)? {
            serde_json::Value::Object(m) => Ok(Policy::from_map(m)),
            _ => Err("a policy is a table".into()),
        }
    }
}

impl Doc for serde_json::Value {
    fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(serde_json::Value::as_i64)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(serde_json::Value::as_str)
    }

    fn decode<T: DeserializeOwned>(self) -> Result<T, (String, String)> {
        serde_path_to_error::deserialize(self).map_err(|e| {
            let path = path_text(e.path());
            (path, e.into_inner().to_string().trim().to_owned())
        })
    }

    fn into_policy(self) -> Result<Policy, String> {
        match self {
            serde_json::Value::Object(m) => Ok(Policy::from_map(m)),
            _ => Err("a policy is an object".into()),
        }
    }
}

/// TOML to its JSON equivalent: datetimes become their text; NaN and infinities, which
/// JSON cannot hold, are an error.
fn toml_to_json(v: toml::Value) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match v {
        toml::Value::String(s) => J::String(s),
        toml::Value::Integer(i) => J::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f)
            .map(J::Number)
            .ok_or_else(|| format!("{f} has no JSON equivalent"))?,
        toml::Value::Boolean(b) => J::Bool(b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(a) => {
            J::Array(a.into_iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(t) => J::Object(
            t.into_iter()
                .map(|(k, v)| toml_to_json(v).map(|v| (k, v)))
                .collect::<Result<_, _>>()?,
        ),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound = "V: DeserializeOwned")]
struct RawFile<V> {
    #[serde(default = "Vec::new")]
    tenant: Vec<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound = "V: DeserializeOwned")]
struct RawTenant<V> {
    id: u32,
    name: Option<String>,
    #[serde(default = "Vec::new")]
    rules: Vec<V>,
    #[serde(default)]
    max_nb: u64,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    isolation: Option<Isolation>,
    #[serde(default = "Option::default")]
    policy: Option<V>,
    // Reserved (see the module docs): accepted by the parser so that the error can say
    // what they are, then rejected.
    #[serde(default = "Option::default")]
    nf: Option<V>,
    #[serde(default = "Option::default")]
    chain: Option<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound = "V: DeserializeOwned")]
struct RawStage<V> {
    nf: Option<String>,
    nf_lib: Option<PathBuf>,
    nf_ebpf: Option<PathBuf>,
    #[serde(default = "Option::default")]
    policy: Option<V>,
    #[serde(default = "Option::default")]
    when: Option<V>,
}

/// A stage's `when`: a rule's match fields without `priority`, plus the packet's mark.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGuard {
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
    mark: Option<u32>,
}

fn build_stage<V: Doc>(raw: V) -> Result<StageConfig, (String, String)> {
    let raw: RawStage<V> = raw.decode()?;
    let nf = match (raw.nf, raw.nf_lib, raw.nf_ebpf) {
        (Some(nf), None, None) => nf
            .parse::<NfSpec>()
            .map_err(|e| ("nf".to_owned(), e.to_string()))?,
        (None, Some(lib), None) => NfSpec::C(lib),
        (None, None, Some(obj)) => NfSpec::Ebpf {
            path: obj,
            engine: EbpfEngine::Interpreter,
        },
        (None, None, None) => {
            return Err((
                "nf".to_owned(),
                "a stage names its NF: nf, nf_lib or nf_ebpf".to_owned(),
            ))
        }
        (nf, lib, _) => {
            let field = if nf.is_some() && lib.is_some() {
                "nf_lib"
            } else {
                "nf_ebpf"
            };
            return Err((
                field.to_owned(),
                "a stage names one NF: give only one of nf, nf_lib and nf_ebpf".to_owned(),
            ));
        }
    };
    let policy = match raw.policy {
        Some(p) => p.into_policy().map_err(|e| ("policy".to_owned(), e))?,
        None => Policy::new(),
    };
    let when = match raw.when {
        Some(w) => {
            let json: serde_json::Value =
                w.decode().map_err(|(p, e)| (join_field("when", &p), e))?;
            Some(guard_from_json(json).map_err(|(f, m)| (format!("when{f}"), m))?)
        }
        None => None,
    };
    Ok(StageConfig { nf, policy, when })
}

/// Parses a `when` guard from its JSON form (the tenants file's, after TOML maps to
/// JSON, and a chain policy's); the error's field is `""` or `.dst_port`-like.
pub(crate) fn guard_from_json(value: serde_json::Value) -> Result<Guard, (String, String)> {
    let g: RawGuard = serde_json::from_value(value).map_err(|e| (String::new(), e.to_string()))?;
    let rule = RawRule {
        priority: None,
        in_port: g.in_port,
        src_mac: g.src_mac,
        dst_mac: g.dst_mac,
        vlan: g.vlan,
        src_ip: g.src_ip,
        dst_ip: g.dst_ip,
        protocol: g.protocol,
        src_port: g.src_port,
        dst_port: g.dst_port,
        dscp: g.dscp,
    };
    let m = match build_rule(rule) {
        Ok((_, m)) => m,
        // Only the mark: every header matches.
        Err(("(rule)", _)) if g.mark.is_some() => Match::default(),
        Err(("(rule)", _)) => {
            return Err((
                String::new(),
                "a guard must match at least one field (a rule field or mark)".to_owned(),
            ))
        }
        Err((f, m)) => return Err((format!(".{f}"), m)),
    };
    Ok(Guard::new(m, g.mark))
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

/// Reads and validates a tenants file, in the format its extension names.
pub fn load(path: &Path) -> Result<Vec<TenantConfig>, TenantsError> {
    let format = Format::of_path(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(format, path, &text)
}

/// Validates tenants-file text in `format` (`path` only names it in errors).
pub fn parse(format: Format, path: &Path, text: &str) -> Result<Vec<TenantConfig>, TenantsError> {
    let syntax = |message: String| TenantsError::Syntax {
        path: path.to_owned(),
        message,
    };
    match format {
        Format::Toml => {
            let raw: RawFile<toml::Value> =
                toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
            if raw.tenant.is_empty() {
                return Err(syntax("no [[tenant]] entries".into()));
            }
            validate(path, raw.tenant)
        }
        Format::Json => {
            let raw: RawFile<serde_json::Value> =
                serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?;
            if raw.tenant.is_empty() {
                return Err(syntax("no \"tenant\" entries".into()));
            }
            validate(path, raw.tenant)
        }
    }
}

fn validate<V: Doc>(path: &Path, tenants: Vec<V>) -> Result<Vec<TenantConfig>, TenantsError> {
    let mut out = Vec::with_capacity(tenants.len());
    // Each id's entry (its index) and name, for a duplicate's error.
    let mut seen: BTreeMap<u32, (usize, Option<String>)> = BTreeMap::new();
    for (i, value) in tenants.into_iter().enumerate() {
        let label = tenant_label(&value, i);
        let field_err = |field: &str, message: String| TenantsError::Field {
            path: path.to_owned(),
            tenant: label.clone(),
            field: field.to_owned(),
            message,
        };
        // A field of the wrong type is named (`max_nb`); a missing one is the entry's.
        let t: RawTenant<V> = value
            .decode()
            .map_err(|(p, e)| field_err(if p.is_empty() { "(tenant)" } else { &p }, e))?;
        if let Some((first, first_name)) = seen.get(&t.id) {
            let named = first_name
                .as_ref()
                .map_or(String::new(), |n| format!(", {n:?}"));
            return Err(field_err(
                "id",
                format!(
                    "duplicate tenant id {} (also the {} tenant entry{named})",
                    t.id,
                    ordinal(first + 1),
                ),
            ));
        }
        seen.insert(t.id, (i, t.name.clone()));
        if t.nf.is_some() {
            return Err(field_err(
                "nf",
                "a tenant's own NF is not supported yet: every tenant runs the run's NF".into(),
            ));
        }
        let chain = match t.chain {
            None => Vec::new(),
            Some(c) => {
                let stages: Vec<V> = c
                    .decode()
                    .map_err(|(p, e)| field_err(&join_field("chain", &p), e))?;
                if stages.is_empty() || stages.len() > MAX_STAGES {
                    return Err(field_err(
                        "chain",
                        format!(
                            "{} stages: a chain has 1 to {MAX_STAGES} stages",
                            stages.len()
                        ),
                    ));
                }
                if t.policy.is_some() {
                    return Err(field_err(
                        "policy",
                        "a tenant with a chain gives each stage its policy \
                         ([[tenant.chain]] policy = { ... }), not the tenant"
                            .into(),
                    ));
                }
                let mut out = Vec::with_capacity(stages.len());
                for (k, stage) in stages.into_iter().enumerate() {
                    out.push(build_stage(stage).map_err(|(f, m)| {
                        field_err(
                            &format!("chain[{k}]{}{f}", if f.is_empty() { "" } else { "." }),
                            m,
                        )
                    })?);
                }
                out
            }
        };
        if t.rules.len() > MAX_RULES_PER_TENANT {
            return Err(field_err(
                "rules",
                format!(
                    "{} classifier rules; a tenant has at most {MAX_RULES_PER_TENANT}",
                    t.rules.len()
                ),
            ));
        }
        let mut rules = Vec::with_capacity(t.rules.len());
        let mut keys = 0;
        for (r, rule) in t.rules.into_iter().enumerate() {
            let at = |f: &str| format!("rules[{r}]{}{f}", if f.is_empty() { "" } else { "." });
            let raw: RawRule = rule.decode().map_err(|(p, e)| field_err(&at(&p), e))?;
            let (priority, m) = build_rule(raw).map_err(|(f, m)| field_err(&at(f), m))?;
            keys += m.key_count();
            if keys > MAX_RULE_KEYS_PER_TENANT {
                return Err(field_err(
                    &at(""),
                    format!(
                        "the rules up to this one expand to {keys} classifier entries (port \
                         ranges become the prefixes covering them); a tenant has at most \
                         {MAX_RULE_KEYS_PER_TENANT}: use fewer or aligned port ranges"
                    ),
                ));
            }
            rules.push((priority, m));
        }
        if rules.is_empty() {
            return Err(field_err(
                "rules",
                "at least one classifier rule is needed".into(),
            ));
        }
        let policy = match t.policy {
            Some(p) => p.into_policy().map_err(|e| field_err("policy", e))?,
            None => Policy::new(),
        };
        let mut tenant = TenantConfig::new(TenantId(t.id), rules);
        if let Some(name) = t.name {
            if name.len() > MAX_NAME_BYTES {
                return Err(field_err(
                    "name",
                    format!("{} bytes; a name has at most {MAX_NAME_BYTES}", name.len()),
                ));
            }
            if name.chars().any(char::is_control) {
                // It would break a log line or forge one.
                return Err(field_err(
                    "name",
                    "control characters (a newline, a tab, …) are not allowed".into(),
                ));
            }
            tenant.name = name;
        }
        tenant.max_nb = t.max_nb;
        tenant.weight = match t.weight {
            None => 1,
            Some(0) => return Err(field_err("weight", "must be at least 1".into())),
            Some(w) => w,
        };
        tenant.isolation = t.isolation;
        tenant.policy = policy;
        tenant.chain = chain;
        out.push(tenant);
    }
    Ok(out)
}

/// `1st`, `2nd`, `3rd`, `4th`, ..., `11th`, ..., `21st`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn tenant_label<V: Doc>(value: &V, i: usize) -> String {
    match (value.int("id"), value.str("name")) {
        // A name too long or with control characters is refused: its error names the
        // tenant by id alone.
        (Some(id), Some(n)) if n.len() <= MAX_NAME_BYTES && !n.chars().any(char::is_control) => {
            format!("{id} ({n:?})")
        }
        (Some(id), _) => id.to_string(),
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
    // The same check, and message, as admission (`Match::validate`); a tenants file also
    // names the protocol of a port rule.
    m.check_port_protocol()
        .map_err(|e| ("protocol", e.to_string()))?;
    if (m.src_port.is_some() || m.dst_port.is_some()) && m.protocol.is_none() {
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

    fn toml(text: &str) -> Result<Vec<TenantConfig>, TenantsError> {
        parse(Format::Toml, Path::new("t.toml"), text)
    }

    fn json(text: &str) -> Result<Vec<TenantConfig>, TenantsError> {
        parse(Format::Json, Path::new("t.json"), text)
    }

    fn err(text: &str) -> String {
        toml(text).unwrap_err().to_string()
    }

    fn json_err(text: &str) -> String {
        json(text).unwrap_err().to_string()
    }

    const EXAMPLE_TOML: &str = r#"
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
"#;

    const EXAMPLE_JSON: &str = r#"
{ "tenant": [
  { "id": 7, "name": "acme",
    "rules": [ { "dst_ip": "10.7.0.0/16" },
               { "src_ip": "192.168.7.0/24", "protocol": "udp", "dst_port": "5000-5099", "priority": 5 } ],
    "max_nb": 0,
    "policy": { "flow_capacity": 128 } },
  { "id": 8,
    "rules": [ { "dst_ip": "2001:db8::/32", "vlan": 12, "src_mac": "02:00:00:00:00:01", "dscp": 10,
                 "in_port": 1, "dst_port": 443, "protocol": 6 } ] } ] }
"#;

    #[test]
    fn parses_the_documented_example() {
        let t = toml(EXAMPLE_TOML).unwrap();
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
                .as_map()
                .get("flow_capacity")
                .and_then(|v| v.as_i64()),
            Some(128)
        );
        assert_eq!(t[1].name, "tenant-8");
        assert_eq!(t[1].rules[0].1.src_mac, Some([2, 0, 0, 0, 0, 1]));
        assert!(t.iter().all(|t| t.nf.is_none() && t.chain.is_empty()));
    }

    #[test]
    fn a_tenant_s_rules_and_their_classifier_entries_are_bounded() {
        let rules = |n: usize, rule: &str| {
            let r: Vec<String> = (0..n)
                .map(|i| {
                    rule.replace("I", &(i % 256).to_string())
                        .replace("J", &(i / 256).to_string())
                })
                .collect();
            format!("[[tenant]]\nid = 1\nrules = [ {} ]\n", r.join(", "))
        };
        let one = "{ dst_ip = \"10.J.I.0/24\" }";
        assert_eq!(
            toml(&rules(MAX_RULES_PER_TENANT, one)).unwrap()[0]
                .rules
                .len(),
            256
        );
        let e = err(&rules(MAX_RULES_PER_TENANT + 1, one));
        assert!(
            e.contains("rules: 257 classifier rules; a tenant has at most 256"),
            "{e}"
        );
        // 1-65534 is 30 prefixes: one rule with two such ranges is 900 entries, the fifth
        // passes 4,096 and is named.
        let wide = "{ dst_ip = \"10.J.I.0/24\", protocol = \"tcp\", src_port = \"1-65534\", dst_port = \"1-65534\" }";
        assert_eq!(toml(&rules(4, wide)).unwrap()[0].rules.len(), 4);
        let e = err(&rules(5, wide));
        assert!(
            e.contains("rules[4]: the rules up to this one expand to 4500 classifier entries")
                && e.contains("at most 4096"),
            "{e}"
        );
    }

    #[test]
    fn weight_defaults_to_one_and_zero_is_refused() {
        let t = toml(EXAMPLE_TOML).unwrap();
        assert!(t.iter().all(|t| t.weight == 1));
        let t = toml("[[tenant]]\nid = 1\nweight = 3\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n")
            .unwrap();
        assert_eq!(t[0].weight, 3);
        let e = err("[[tenant]]\nid = 1\nweight = 0\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n");
        assert!(e.contains("weight") && e.contains("at least 1"), "{e}");
    }

    #[test]
    fn json_and_toml_give_the_same_tenants() {
        assert_eq!(json(EXAMPLE_JSON).unwrap(), toml(EXAMPLE_TOML).unwrap());
    }

    #[test]
    fn json_and_toml_give_every_nf_the_same_policy() {
        // Nested tables, arrays of tables, strings, numbers, booleans.
        let t = toml(
            r#"
[[tenant]]
id = 1
rules = [ { vlan = 100 } ]
[tenant.policy]
default = "deny"
allow_established = true
conntrack_capacity = 64
rules = [ { action = "allow", proto = "udp", dst_port = 53 },
          { action = "allow", proto = "tcp", dst_port = "8000-8080", src = "10.0.0.0/8" } ]
"#,
        )
        .unwrap();
        let j = json(
            r#"{ "tenant": [ { "id": 1, "rules": [ { "vlan": 100 } ], "policy": {
                "default": "deny", "allow_established": true, "conntrack_capacity": 64,
                "rules": [ { "action": "allow", "proto": "udp", "dst_port": 53 },
                           { "action": "allow", "proto": "tcp", "dst_port": "8000-8080", "src": "10.0.0.0/8" } ]
            } } ] }"#,
        )
        .unwrap();
        assert_eq!(t[0].policy, j[0].policy);
        // Decoded by a real NF's policy type, they are the same policy.
        type Fw = buffet_nfs::firewall::FirewallPolicy;
        let from_toml: Fw = t[0].policy_as(Path::new("t.toml")).unwrap();
        let from_json: Fw = j[0].policy_as(Path::new("t.json")).unwrap();
        assert_eq!(from_toml, from_json);
        assert_eq!(from_toml.rules.len(), 2);
        // And an empty policy is the NF's default, in both.
        let t = toml("[[tenant]]\nid = 2\nrules = [ { vlan = 1 } ]\n").unwrap();
        let j = json(r#"{"tenant":[{"id":2,"rules":[{"vlan":1}]}]}"#).unwrap();
        assert_eq!(t[0].policy, Policy::new());
        assert_eq!(j[0].policy, Policy::new());
    }

    #[test]
    fn toml_values_map_to_json() {
        let t = toml(
            "[[tenant]]\nid = 1\nrules = [ { vlan = 1 } ]\n[tenant.policy]\n\
             rate = 1.5\nwhen = 1979-05-27T07:32:00Z\nlist = [1, 2]\n",
        )
        .unwrap();
        assert_eq!(
            t[0].policy.as_value(),
            &serde_json::json!({ "rate": 1.5, "when": "1979-05-27T07:32:00Z", "list": [1, 2] })
        );
        let e = err("[[tenant]]\nid = 1\nrules = [ { vlan = 1 } ]\n[tenant.policy]\nrate = nan\n");
        assert!(e.contains("tenant 1: policy: NaN"), "{e}");
    }

    #[test]
    fn policy_errors_name_file_tenant_and_policy() {
        let t = toml(
            "[[tenant]]\nid = 7\nname = \"acme\"\nrules = [ { vlan = 1 } ]\n[tenant.policy]\nflow_capacityy = 3\n",
        )
        .unwrap();
        let e = t[0]
            .policy_as::<buffet_nfs::monitor::MonitorPolicy>(Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "t.toml: tenant 7 (\"acme\"): policy.flow_capacityy: unknown field `flow_capacityy`"
            ),
            "{e}"
        );
    }

    #[test]
    fn type_errors_name_the_field_not_the_whole_entry() {
        // A policy field of the wrong type, from the file and as the NF decodes it.
        let t = toml(
            "[[tenant]]\nid = 1\nname = \"a\"\nrules = [ { vlan = 1 } ]\n[tenant.policy]\nflow_capacity = -1\n",
        )
        .unwrap();
        let e = t[0]
            .policy_as::<buffet_nfs::monitor::MonitorPolicy>(Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.toml: tenant 1 (\"a\"): policy.flow_capacity: invalid value: integer `-1`, expected u32"
        );
        let j =
            json(r#"{"tenant":[{"id":1,"rules":[{"vlan":1}],"policy":{"flow_capacity":"x"}}]}"#)
                .unwrap();
        let e = j[0]
            .policy_as::<buffet_nfs::monitor::MonitorPolicy>(Path::new("t.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.json: tenant 1 (\"tenant-1\"): policy.flow_capacity: invalid type"),
            "{e}"
        );
        // Nested: the index and the field inside it.
        let e = Policy::from_map(
            serde_json::json!({ "rules": [ { "action": "allow" }, { "action": 3 } ] })
                .as_object()
                .unwrap()
                .clone(),
        )
        .decode_field::<buffet_nfs::firewall::FirewallPolicy>()
        .unwrap_err();
        assert_eq!(e.field(), "policy.rules[1].action", "{e}");
        // A tenant's own field of the wrong type, in both formats.
        let e = err("[[tenant]]\nid = 1\nname = \"a\"\nmax_nb = -5\nrules = [ { vlan = 1 } ]\n");
        assert_eq!(
            e,
            "t.toml: tenant 1 (\"a\"): max_nb: invalid value: integer `-5`, expected u64"
        );
        let e = json(r#"{"tenant":[{"id":1,"weight":"x","rules":[{"vlan":1}]}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tenant 1: weight: invalid type"), "{e}");
        // A rule's field of the wrong type.
        let e = err("[[tenant]]\nid = 1\nrules = [ { vlan = 1 }, { vlan = \"x\" } ]\n");
        assert!(e.contains("tenant 1: rules[1].vlan: invalid type"), "{e}");
        // A missing field is the entry's.
        let e = err("[[tenant]]\nname = \"a\"\nrules = [ { vlan = 1 } ]\n");
        assert!(e.contains("(tenant): missing field `id`"), "{e}");
    }

    #[test]
    fn a_name_too_long_or_with_control_characters_is_refused_by_id() {
        let rules = "rules = [ { vlan = 1 } ]\n";
        let at_limit = "n".repeat(MAX_NAME_BYTES);
        let t = toml(&format!(
            "[[tenant]]\nid = 1\nname = \"{at_limit}\"\n{rules}"
        ))
        .unwrap();
        assert_eq!(t[0].name, at_limit);
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(
            err(&format!("[[tenant]]\nid = 1\nname = \"{long}\"\n{rules}")),
            "t.toml: tenant 1: name: 257 bytes; a name has at most 256"
        );
        let e = json(r#"{"tenant":[{"id":2,"name":"ok\nbuffetd: forged","rules":[{"vlan":1}]}]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.json: tenant 2: name: control characters (a newline, a tab, …) are not allowed"
        );
    }

    #[test]
    fn a_duplicate_id_names_the_first_entry_by_position_and_name() {
        let two = "rules = [ { vlan = 1 } ]\n";
        let e = err(&format!(
            "[[tenant]]\nid = 1\nname = \"a\"\n{two}[[tenant]]\nid = 1\nname = \"b\"\n{two}"
        ));
        assert_eq!(
            e,
            "t.toml: tenant 1 (\"b\"): id: duplicate tenant id 1 (also the 1st tenant entry, \"a\")"
        );
        let e = err(&format!(
            "[[tenant]]\nid = 2\n{two}[[tenant]]\nid = 1\n{two}[[tenant]]\nid = 1\n{two}"
        ));
        assert!(e.ends_with("(also the 2nd tenant entry)"), "{e}");
        let e = json(
            r#"{"tenant":[{"id":5,"name":"x","rules":[{"vlan":1}]},{"id":5,"rules":[{"vlan":1}]}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.ends_with("(also the 1st tenant entry, \"x\")"), "{e}");
        assert_eq!(
            [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111].map(ordinal),
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
                "111th"
            ]
        );
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
        let e = err("[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\npolicy = 3\n");
        assert!(e.contains("tenant 7: policy: a policy is a table"), "{e}");
    }

    /// What the tenants-file check accepts, admission accepts, and what admission
    /// refuses, the check refuses with admission's own message: SCTP has ports, ICMP has
    /// none.
    #[test]
    fn port_rules_check_agrees_with_admission() {
        let t = toml("[[tenant]]\nid = 7\nrules = [ { protocol = \"sctp\", dst_port = 80 } ]\n")
            .unwrap();
        let (_, m) = &t[0].rules[0];
        assert_eq!(
            (m.protocol, m.dst_port),
            (Some(132), Some(PortRange::single(80)))
        );
        assert_eq!(
            m.validate(),
            Ok(()),
            "admission validates with Match::validate"
        );
        for proto in ["\"icmp\"", "1", "\"gre\""] {
            let e = err(&format!(
                "[[tenant]]\nid = 7\nrules = [ {{ protocol = {proto}, dst_port = 80 }} ]\n"
            ));
            let refused = Match {
                protocol: Some(if proto == "\"gre\"" { 47 } else { 1 }),
                dst_port: Some(PortRange::single(80)),
                ..Match::default()
            }
            .validate()
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("rules[0].protocol") && e.contains(&refused),
                "{e} / {refused}"
            );
        }
    }

    #[test]
    fn json_errors_are_the_toml_errors() {
        // Same file, same tenant, same field, same message; only the file name differs.
        let cases = [
            (
                "[[tenant]]\nid = 7\nname = \"acme\"\nrules = [ { dst_ip = \"10.0.0.0/33\" } ]\n",
                r#"{"tenant":[{"id":7,"name":"acme","rules":[{"dst_ip":"10.0.0.0/33"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dst_ipp = \"10.0.0.0/8\" } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"dst_ipp":"10.0.0.0/8"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\ncolour = 1\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n",
                r#"{"tenant":[{"id":7,"colour":1,"rules":[{"dst_ip":"10.0.0.0/8"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"dst_ip":"10.0.0.0/8"}]},{"id":7,"rules":[{"dst_ip":"10.1.0.0/16"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dst_port = 80 } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"dst_port":80}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { protocol = \"udp\", dst_port = \"90-80\" } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"protocol":"udp","dst_port":"90-80"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { src_mac = \"zz:00:00:00:00:00\" } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"src_mac":"zz:00:00:00:00:00"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { vlan = 5000 } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"vlan":5000}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dscp = 64 } ]\n",
                r#"{"tenant":[{"id":7,"rules":[{"dscp":64}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = []\n",
                r#"{"tenant":[{"id":7,"rules":[]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nisolation = \"vm\"\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n",
                r#"{"tenant":[{"id":7,"isolation":"vm","rules":[{"dst_ip":"10.0.0.0/8"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\nnf = \"firewall\"\n",
                r#"{"tenant":[{"id":7,"rules":[{"dst_ip":"10.0.0.0/8"}],"nf":"firewall"}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nname = \"a\"\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n[[tenant.chain]]\nnf = \"walls\"\n",
                r#"{"tenant":[{"id":7,"name":"a","rules":[{"dst_ip":"10.0.0.0/8"}],"chain":[{"nf":"walls"}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n[[tenant.chain]]\nnf = \"monitor\"\n[[tenant.chain]]\nnf = \"dpi\"\nwhen = { protocol = \"udp\", dst_port = \"90-80\" }\n",
                r#"{"tenant":[{"id":7,"rules":[{"dst_ip":"10.0.0.0/8"}],"chain":[{"nf":"monitor"},{"nf":"dpi","when":{"protocol":"udp","dst_port":"90-80"}}]}]}"#,
            ),
            (
                "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n[[tenant.chain]]\nnf_lib = \"a.so\"\nnf_ebpf = \"a.o\"\n",
                r#"{"tenant":[{"id":7,"rules":[{"dst_ip":"10.0.0.0/8"}],"chain":[{"nf_lib":"a.so","nf_ebpf":"a.o"}]}]}"#,
            ),
        ];
        for (t, j) in cases {
            let (te, je) = (err(t), json_err(j));
            assert!(te.starts_with("t.toml: tenant "), "{te}");
            assert_eq!(te.strip_prefix("t.toml"), je.strip_prefix("t.json"), "{t}");
        }
    }

    #[test]
    fn json_syntax_errors() {
        let e = json_err(r#"{"tenant": [ {"id": 7, } ]}"#);
        assert!(e.starts_with("t.json: ") && e.contains("line 1"), "{e}");
        let e = json_err(r#"{"tenants": []}"#);
        assert!(e.contains("tenants"), "{e}");
        let e = json_err(r#"{"tenant": []}"#);
        assert!(e.contains("no \"tenant\" entries"), "{e}");
        let e = json_err(r#"{"tenant": [ {"id": 7, "rules": [ {"vlan": 1} ], "policy": [] } ]}"#);
        assert!(e.contains("tenant 7: policy: a policy is an object"), "{e}");
    }

    #[test]
    fn own_nfs_are_reserved() {
        let e = err("[[tenant]]\nid = 7\nnf = \"monitor\"\nrules = [ { vlan = 1 } ]\n");
        assert!(
            e.contains("tenant 7: nf: a tenant's own NF is not supported yet"),
            "{e}"
        );
    }

    const CHAIN_TOML: &str = r#"
[[tenant]]
id = 7
rules = [ { dst_ip = "10.7.0.0/16" } ]
[[tenant.chain]]
nf = "firewall"
policy = { default = "allow", rules = [ { action = "deny", proto = "tcp", dst_port = 80 } ] }
[[tenant.chain]]
nf = "dpi"
when = { protocol = "tcp", dst_port = 443 }   # this stage runs only for matching packets
[[tenant.chain]]
nf = "monitor"
[[tenant.chain]]
nf_ebpf = "x.o"
when = { mark = 7 }
[[tenant.chain]]
nf_lib = "x.so"
policy = { k = 1 }

[[tenant]]
id = 8
rules = [ { dst_ip = "10.8.0.0/16" } ]
"#;

    const CHAIN_JSON: &str = r#"{ "tenant": [
  { "id": 7, "rules": [ { "dst_ip": "10.7.0.0/16" } ],
    "chain": [
      { "nf": "firewall",
        "policy": { "default": "allow", "rules": [ { "action": "deny", "proto": "tcp", "dst_port": 80 } ] } },
      { "nf": "dpi", "when": { "protocol": "tcp", "dst_port": 443 } },
      { "nf": "monitor" },
      { "nf_ebpf": "x.o", "when": { "mark": 7 } },
      { "nf_lib": "x.so", "policy": { "k": 1 } } ] },
  { "id": 8, "rules": [ { "dst_ip": "10.8.0.0/16" } ] } ] }"#;

    #[test]
    fn chains_parse_as_the_issue_writes_them() {
        let t = toml(CHAIN_TOML).unwrap();
        assert_eq!(t, json(CHAIN_JSON).unwrap());
        let c = &t[0].chain;
        assert_eq!(c.len(), 5);
        assert_eq!(c[0].nf.to_string(), "firewall");
        assert_eq!(
            c[0].policy.as_value()["rules"][0]["dst_port"],
            serde_json::json!(80)
        );
        assert_eq!(c[0].when, None);
        let w = c[1].when.as_ref().unwrap();
        assert_eq!(w.rule().protocol, Some(6));
        assert_eq!(w.rule().dst_port, Some(PortRange::single(443)));
        assert_eq!(w.mark(), None);
        assert_eq!(c[2].policy, Policy::new());
        assert_eq!(c[3].nf.to_string(), "ebpf:x.o");
        assert_eq!(c[3].when.as_ref().unwrap().mark(), Some(7));
        assert_eq!(c[3].when.as_ref().unwrap().rule(), &Match::default());
        assert_eq!(c[4].nf.to_string(), "c:x.so");
        assert!(t[1].chain.is_empty());
    }

    #[test]
    fn bad_chains_name_the_tenant_the_stage_and_the_field() {
        let stage = |body: &str| {
            err(&format!(
                "[[tenant]]\nid = 7\nname = \"a\"\nrules = [ {{ vlan = 1 }} ]\n\
                 [[tenant.chain]]\nnf = \"monitor\"\n[[tenant.chain]]\n{body}\n"
            ))
        };
        let e = stage("nf = \"walls\"");
        assert!(
            e.starts_with("t.toml: tenant 7 (\"a\"): chain[1].nf: unknown NF \"walls\""),
            "{e}"
        );
        let e = stage("nf_lib = \"a.so\"\nnf_ebpf = \"a.o\"");
        assert!(
            e.contains("tenant 7 (\"a\"): chain[1].nf_ebpf: a stage names one NF"),
            "{e}"
        );
        let e = stage("nf = \"dpi\"\nnf_lib = \"a.so\"");
        assert!(e.contains("chain[1].nf_lib: a stage names one NF"), "{e}");
        let e = stage("policy = { a = 1 }");
        assert!(e.contains("chain[1].nf: a stage names its NF"), "{e}");
        let e = stage("nf = \"dpi\"\nwhen = { dst_port = 443 }");
        assert!(e.contains("chain[1].when.protocol: port rules need"), "{e}");
        let e = stage("nf = \"dpi\"\nwhen = { dst_ip = \"10.0.0.0/33\" }");
        assert!(e.contains("chain[1].when.dst_ip: invalid prefix"), "{e}");
        let e = stage("nf = \"dpi\"\nwhen = { priority = 3, vlan = 1 }");
        assert!(e.contains("chain[1].when: unknown field `priority`"), "{e}");
        let e = stage("nf = \"dpi\"\nwhen = {}");
        assert!(
            e.contains("chain[1].when: a guard must match at least one field"),
            "{e}"
        );
        let e = stage("nf = \"dpi\"\nwhen = { mark = -1 }");
        assert!(e.contains("chain[1].when"), "{e}");
        let e = stage("nf = \"dpi\"\ncolour = 1");
        assert!(e.contains("chain[1].colour: unknown field `colour`"), "{e}");
        let e = stage("nf = \"dpi\"\npolicy = 3");
        assert!(e.contains("chain[1].policy: a policy is a table"), "{e}");
        // Over the limit, and empty.
        let mut long = "[[tenant]]\nid = 7\nrules = [ { vlan = 1 } ]\n".to_owned();
        for _ in 0..=MAX_STAGES {
            long.push_str("[[tenant.chain]]\nnf = \"monitor\"\n");
        }
        let e = err(&long);
        assert!(
            e.contains("tenant 7: chain: 9 stages: a chain has 1 to 8 stages"),
            "{e}"
        );
        let e = json_err(r#"{"tenant":[{"id":7,"rules":[{"vlan":1}],"chain":[]}]}"#);
        assert!(e.contains("tenant 7: chain: 0 stages"), "{e}");
        // A tenant's policy beside a chain would be ignored: refused.
        let e = err("[[tenant]]\nid = 7\nrules = [ { vlan = 1 } ]\n[tenant.policy]\na = 1\n[[tenant.chain]]\nnf = \"monitor\"\n");
        assert!(e.contains("tenant 7: policy: a tenant with a chain"), "{e}");
    }

    #[test]
    fn the_format_follows_the_extension() {
        assert_eq!(
            Format::of_path(Path::new("a/t.toml")).unwrap(),
            Format::Toml
        );
        assert_eq!(Format::of_path(Path::new("t.JSON")).unwrap(), Format::Json);
        for bad in ["t.yaml", "tenants", "t.toml.bak"] {
            let e = Format::of_path(Path::new(bad)).unwrap_err().to_string();
            assert_eq!(e, format!("{bad}: a tenants file is .toml or .json"));
        }
        // The format is checked before the file is read.
        let e = load(Path::new("/nonexistent/t.yml")).unwrap_err();
        assert!(matches!(e, TenantsError::Format { .. }), "{e}");
    }

    #[test]
    fn load_reads_both_formats() {
        let dir = std::env::temp_dir().join(format!("buffet-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (t, j) = (dir.join("t.toml"), dir.join("t.json"));
        std::fs::write(&t, EXAMPLE_TOML).unwrap();
        std::fs::write(&j, EXAMPLE_JSON).unwrap();
        let (from_t, from_j) = (load(&t), load(&j));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(from_t.unwrap(), from_j.unwrap());
        let e = load(&dir.join("gone.json")).unwrap_err().to_string();
        assert!(e.contains("gone.json"), "{e}");
    }

    #[test]
    fn isolation_is_optional_per_tenant() {
        let t = toml(
            "[[tenant]]\nid = 1\nisolation = \"mpk\"\nrules = [ { dst_ip = \"10.0.0.0/8\" } ]\n\
             [[tenant]]\nid = 2\nrules = [ { dst_ip = \"10.1.0.0/16\" } ]\n",
        )
        .unwrap();
        assert_eq!(t[0].isolation, Some(Isolation::Mpk));
        assert_eq!(t[1].isolation, None);
    }
}
