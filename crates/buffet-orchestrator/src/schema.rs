//! What the Orchestrator and the Agents write to etcd: the key layout and the JSON value
//! of every key. Both sides use this module, so that the layout is written down once.
//!
//! ```text
//! /buffet/servers/<server>               ServerLoad   under the Agent's lease
//! /buffet/placements/<server>/<tenant>   tenant doc   written by the leader
//! /buffet/tenants/<tenant>               TenantRecord written by the leader
//! /buffet/status/<tenant>                Status       written by the Agent it is placed on
//! /buffet/orchestrator/leader            etcd election name (keys under it are etcd's)
//! ```
//!
//! This module talks to nobody: it names keys and (de)serialises values.

use std::collections::BTreeMap;
use std::path::Path;

use buffet_config::registry::{registrable_name, with_registered_names};
use buffet_config::tenants::{self, Format, TenantConfig};
use etcd_client::{Client, GetOptions, GetResponse};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest tenant document the Orchestrator stores, bytes of JSON: during an update
/// a record holds it twice (the document and the one before it), and it is written
/// beside its placement, all within etcd's default 1.5 MiB request limit.
pub const MAX_DOC_BYTES: usize = 256 << 10;

/// The largest reply a read of a whole prefix (every tenant, every status, a server's
/// placements) may be: far above gRPC's 4 MiB default, which a few thousand tenants'
/// documents exceed.
pub const MAX_READ_BYTES: usize = 1 << 30;

/// The keys (no values) under `prefix` as they were at revision `rev`, with their
/// revisions.
pub async fn keys_at(
    client: &Client,
    prefix: impl Into<Vec<u8>>,
    rev: i64,
) -> Result<GetResponse, etcd_client::Error> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_revision(rev);
    get_all(client, prefix, Some(opts)).await
}

/// Reads `key` (with `options`) through a client that takes replies up to
/// [`MAX_READ_BYTES`].
pub async fn get_all(
    client: &Client,
    key: impl Into<Vec<u8>>,
    options: Option<GetOptions>,
) -> Result<GetResponse, etcd_client::Error> {
    client
        .kv_client()
        .max_decoding_message_size(MAX_READ_BYTES)
        .get(key, options)
        .await
}

/// Every key of a cluster starts with this.
pub const ROOT: &str = "/buffet/";
/// Prefix of the servers' registrations.
pub const SERVERS: &str = "/buffet/servers/";
/// Prefix of every placement.
pub const PLACEMENTS: &str = "/buffet/placements/";
/// Prefix of the Orchestrator's tenant records.
pub const TENANTS: &str = "/buffet/tenants/";
/// Prefix of the Agents' admission outcomes.
pub const STATUS: &str = "/buffet/status/";
/// Prefix of the servers an operator drains (no lease: a drain outlasts restarts).
pub const DRAINS: &str = "/buffet/drain/";
/// The etcd election the Orchestrators campaign in.
pub const ELECTION: &str = "/buffet/orchestrator/leader";

/// `/buffet/servers/<server>`.
pub fn server_key(server: &str) -> String {
    format!("{SERVERS}{server}")
}

/// `/buffet/drain/<server>`.
pub fn drain_key(server: &str) -> String {
    format!("{DRAINS}{server}")
}

/// The server id of a `/buffet/drain/<server>` key.
pub fn drained_of(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key).ok()?.strip_prefix(DRAINS)
}

/// `/buffet/placements/<server>/` (a server's placements).
pub fn placements_of(server: &str) -> String {
    format!("{PLACEMENTS}{server}/")
}

/// `/buffet/placements/<server>/<tenant>`.
pub fn placement_key(server: &str, tenant: u32) -> String {
    format!("{PLACEMENTS}{server}/{tenant}")
}

/// `/buffet/tenants/<tenant>`.
pub fn tenant_key(tenant: u32) -> String {
    format!("{TENANTS}{tenant}")
}

/// `/buffet/status/<tenant>`.
pub fn status_key(tenant: u32) -> String {
    format!("{STATUS}{tenant}")
}

/// The last path segment of `key` after `prefix`, as a tenant id.
pub fn tenant_of(key: &[u8], prefix: &str) -> Option<u32> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(prefix)?
        .rsplit('/')
        .next()?
        .parse()
        .ok()
}

/// The server id of a `/buffet/servers/<server>` key.
pub fn server_of(key: &[u8]) -> Option<&str> {
    std::str::from_utf8(key).ok()?.strip_prefix(SERVERS)
}

/// A server id is a non-empty `[A-Za-z0-9._-]` word of at most 64 bytes, other than
/// `.` and `..` (it is a path segment of the keys and of the API's URLs).
pub fn valid_server_id(id: &str) -> bool {
    !id.is_empty()
        && id != "."
        && id != ".."
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One worker's load, as an Agent publishes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerLoad {
    /// Worker id.
    pub id: u16,
    /// Live (not terminated).
    pub live: bool,
    /// Packets it processed per timeslot over the last report interval.
    pub pkts_per_slot: f64,
}

/// The value of `/buffet/servers/<server>`: the registration and the last load report.
/// Rates are packets per second of wall-clock time; per-slot figures use the server's
/// timeslot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerLoad {
    /// The server id (the key's last segment).
    pub server: String,
    /// buffetd's API address, for operators.
    #[serde(default)]
    pub api: Option<String>,
    /// Length of a timeslot, ns (`1 << dataplane.shift`).
    pub slot_ns: u64,
    /// A worker's MAX_NB per timeslot; 0 = unlimited.
    pub worker_max_nb: u64,
    /// Live workers now.
    pub live_workers: u16,
    /// Most workers the Agent may launch (`dataplane.max_workers`).
    pub max_workers: u16,
    /// Per worker.
    pub workers: Vec<WorkerLoad>,
    /// Tenants admitted now.
    pub tenants: u32,
    /// Tenant Table slots.
    pub tenant_slots: u32,
    /// Packets per second the server's tenants received, in total.
    pub pps: f64,
    /// Per tenant: packets per second.
    #[serde(default)]
    pub tenant_pps: BTreeMap<u32, f64>,
    /// Set while the server reports sustained overload it cannot fix itself (no worker
    /// left to launch): the reason.
    #[serde(default)]
    pub overloaded: Option<String>,
    /// Report counter (0 = registration).
    #[serde(default)]
    pub seq: u64,
    /// Which buffetd registered the id: a random id kept in its data directory, so a
    /// restarted server takes its registration back and a second server started with
    /// the same `server_id` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Which process of that buffetd: a random id made at each start. A registration
    /// with this buffetd's instance id and another run is its previous life, unless it
    /// is written while this one is registered: then another buffetd shares its data
    /// directory's identity (a copied `cluster-instance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The NFs tenants' chains may name on it (its `nf.offered`, as a chain's stages name
    /// them); empty: it runs one NF for every tenant and takes no chain. `None`: not
    /// reported (a buffetd from before this field), taken to run any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered: Option<Vec<String>>,
}

impl ServerLoad {
    /// What the server can carry at most, packets per second: every worker it may
    /// launch at its MAX_NB. `None` when MAX_NB is unlimited.
    pub fn capacity_pps(&self) -> Option<f64> {
        if self.worker_max_nb == 0 || self.slot_ns == 0 {
            return None;
        }
        let per_worker = self.worker_max_nb as f64 * 1e9 / self.slot_ns as f64;
        Some(per_worker * f64::from(self.max_workers.max(1)))
    }

    /// Converts packets per timeslot to packets per second.
    pub fn per_slot_to_pps(&self, per_slot: f64) -> f64 {
        if self.slot_ns == 0 {
            0.0
        } else {
            per_slot * 1e9 / self.slot_ns as f64
        }
    }
}

/// The value of `/buffet/tenants/<tenant>`: what the Orchestrator admitted and where.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// The admission document (buffetd's tenants-file schema, as JSON).
    pub doc: Value,
    /// The tenant's expected rate, packets per second.
    pub expected_pps: f64,
    /// The server it is placed on; `None` while it fits nowhere.
    pub server: Option<String>,
    /// Why it is not placed.
    #[serde(default)]
    pub reason: Option<String>,
    /// While an update of the document is being applied: the document before it, put back
    /// if the server refuses the update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Value>,
    /// While an update that moved it is being applied: the server it ran `previous` on.
    /// Its chain named an NF that server does not offer, so the update placed it on one
    /// that does; a refusal there puts it back here with `previous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// Placed before its current placement (re-placed off a server that went away, or
    /// moved off an overloaded one): its admission was answered long ago, so a server
    /// refusing it leaves it unplaced, with the reason, instead of removing it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub moved: bool,
    /// Servers that refused it since it was last live: not chosen for it again until it
    /// is live somewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_by: Vec<String>,
}

impl TenantRecord {
    /// The NFs its document's chain names ([`chain_nfs`]); none for a document that does
    /// not parse (the API writes none such).
    pub fn nfs(&self) -> Vec<String> {
        doc_nfs(&self.doc)
    }

    /// Forgets an update being applied (the document to put back, and the server to put
    /// it back on): the tenant is placed anew, or its update was decided.
    pub fn forget_update(&mut self) {
        self.previous = None;
        self.moved_from = None;
    }
}

/// The NFs an admission document's chain names ([`chain_nfs`]); none for a document
/// that does not parse.
pub fn doc_nfs(doc: &Value) -> Vec<String> {
    parse_tenant(doc).map(|t| chain_nfs(&t)).unwrap_or_default()
}

/// An admission document (buffetd's tenants-file entry, as JSON), validated by
/// buffetd's tenants-file code ("request: tenant 5: rules[0].dst_ip: ..."), except that a
/// chain's stage may name any NF a program could register (`my-nf`): which servers run
/// it is the placement's question ([`ServerLoad::offered`]), and the server's own check.
pub fn parse_tenant(doc: &Value) -> Result<TenantConfig, String> {
    let names: Vec<String> = doc
        .get("chain")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|stage| stage.get("nf")?.as_str())
        .filter(|n| registrable_name(n))
        .map(str::to_owned)
        .collect();
    let text = serde_json::json!({ "tenant": [doc] }).to_string();
    with_registered_names(&names, || {
        tenants::parse(Format::Json, Path::new("request"), &text)
    })
    .map_err(|e| e.to_string())?
    .pop()
    .ok_or_else(|| "no tenant".to_owned())
}

/// The NFs the chain of `t` names, each once, as servers' `nf.offered` names them
/// (`firewall`, `c:nf.so`, `my-nf`); empty when it names no chain of its own.
pub fn chain_nfs(t: &TenantConfig) -> Vec<String> {
    let mut nfs: Vec<String> = Vec::new();
    for s in &t.chain {
        let key = s.nf.to_string();
        if !nfs.contains(&key) {
            nfs.push(key);
        }
    }
    nfs
}

/// An admission's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Admitted: its traffic flows on `server`.
    Live,
    /// The server refused it.
    Failed,
}

/// The value of `/buffet/status/<tenant>`, written by the Agent of `server` only while
/// the placement it answers is current (a transaction compares its revision).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The server that admitted (or refused) it.
    pub server: String,
    /// The outcome.
    pub state: State,
    /// The mod revision of the placement this answers.
    pub placement_rev: i64,
    /// Why it failed.
    #[serde(default)]
    pub reason: Option<String>,
    /// buffetd's HTTP status for a refusal (409, 422, 503...).
    #[serde(default)]
    pub code: Option<u16>,
    /// The placement changed the document of a tenant the server already served (an
    /// update through buffetd's own update path), rather than admitting it. A refused
    /// update leaves the tenant serving its previous document.
    #[serde(default)]
    pub update: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        assert_eq!(placement_key("s1", 7), "/buffet/placements/s1/7");
        assert_eq!(tenant_of(b"/buffet/placements/s1/7", PLACEMENTS), Some(7));
        assert_eq!(tenant_of(b"/buffet/status/12", STATUS), Some(12));
        assert_eq!(tenant_of(b"/buffet/status/x", STATUS), None);
        assert_eq!(server_of(b"/buffet/servers/a-1"), Some("a-1"));
        assert_eq!(drained_of(drain_key("a-1").as_bytes()), Some("a-1"));
        assert_eq!(drained_of(b"/buffet/servers/a-1"), None);
        assert!(valid_server_id("node-3.rack_2"));
        assert!(!valid_server_id("a/b"));
        assert!(!valid_server_id(""));
        assert!(!valid_server_id(".."));
        assert!(valid_server_id("..a"));
    }

    #[test]
    fn capacity_is_every_worker_at_max_nb() {
        let l = ServerLoad {
            slot_ns: 1 << 30,
            worker_max_nb: 1 << 20,
            max_workers: 4,
            ..ServerLoad::default()
        };
        let c = l.capacity_pps().unwrap();
        assert!((c - 4.0 * 1e9 / 1024.0).abs() < 1e-6, "{c}");
        assert_eq!(ServerLoad::default().capacity_pps(), None);
    }

    #[test]
    fn a_chain_may_name_any_registrable_nf_and_its_nfs_are_listed_once() {
        let doc = serde_json::json!({
            "id": 5,
            "rules": [ { "dst_ip": "10.0.0.0/24" } ],
            "chain": [
                { "nf": "firewall", "policy": { "default": "allow" } },
                { "nf": "my-nf" },
                { "nf": "firewall", "policy": { "default": "deny" } },
            ],
        });
        let t = parse_tenant(&doc).unwrap();
        assert_eq!(t.id.0, 5);
        assert_eq!(chain_nfs(&t), ["firewall", "my-nf"]);
        let rec = TenantRecord {
            doc: doc.clone(),
            expected_pps: 1.0,
            server: None,
            reason: None,
            previous: None,
            moved_from: None,
            moved: false,
            refused_by: Vec::new(),
        };
        assert_eq!(rec.nfs(), ["firewall", "my-nf"]);
        // No chain: no NF of its own.
        let plain = serde_json::json!({ "id": 6, "rules": [ { "dst_ip": "10.0.1.0/24" } ] });
        assert!(chain_nfs(&parse_tenant(&plain).unwrap()).is_empty());
        // A name no program could register is still an unknown NF, named by its field.
        for bad in ["My NF", "default", ""] {
            let mut d = doc.clone();
            d["chain"][1]["nf"] = serde_json::json!(bad);
            let e = parse_tenant(&d).unwrap_err();
            assert!(
                e.contains("chain[1].nf") && e.contains("unknown NF"),
                "{bad:?}: {e}"
            );
        }
        // The rest of the document is checked as buffetd checks it.
        let mut d = doc;
        d["rules"][0]["dst_ip"] = serde_json::json!("10.0.0.0/99");
        let e = parse_tenant(&d).unwrap_err();
        assert!(e.starts_with("request: tenant 5: rules[0].dst_ip"), "{e}");
    }
}
