//! Per-tenant service chains: a tenant's own ordered NFs, run to completion in one
//! worker pass (docs/chains.md; FastPaas's service graphs).
//!
//! A [`Chain`] is itself a [`NetworkFunction`], so the data plane runs it like any NF:
//! one Tenant Table, one Packet Buffer per tenant, one `handle_group` call per group. Its
//! per-tenant policy ([`ChainPolicy`]) is the tenant's list of stages; its per-tenant
//! state ([`ChainState`]) holds each stage's own state and counters. The NFs the stages
//! name (reference, C and eBPF NFs, or an author's own registered NF, [`RegisteredStages`])
//! are loaded once per run and held
//! behind a small object-safe trait, so one chain serves stages of different types with
//! one dynamic call per stage per *group*, never per packet.
//!
//! What a group does ([`Chain::handle_group`]):
//!
//! * it passes the stages in order, as a vector: the packets a stage's `when`
//!   ([`Guard`]) selects are gathered (a stable partition by swaps, undone afterwards,
//!   so the order within the tenant is kept) and handed to the stage in one call;
//! * a `Drop` ends the chain for that packet and is counted at the stage that said it; a
//!   `Fault` (or a panic) ends it for that packet and every later one of the group, and
//!   the tenant is quarantined by the worker as for any NF: packets before it keep going;
//! * a passing verdict moves the packet on; `Forward`/`Tx` is remembered as its egress
//!   (the last one named wins; none: `Pass`);
//! * a stage that may have rewritten headers ([`Packet::headers_written`]) makes the
//!   chain walk the headers again before the next stage — only then; a frame that no
//!   longer parses is dropped as malformed at that stage;
//! * [`Packet::mark`] travels from stage to stage and a later `when` can match it.
//!
//! Memory: the chain's [`register`](NetworkFunction::register) covers [`MAX_STAGES`]
//! stages of the largest stage region of the run, each page-aligned; a stage gets its own
//! disjoint part of the tenant's region through `init_in_region` (a C stage's memory is
//! there; an eBPF stage's memory is its own sandboxed buffer; a Rust stage's typed state
//! is owned by the chain state). With [`Chain::stage_keys`] (a run at `mpk`), each C
//! stage's part also gets its own protection key ([`PartKey`]), opened only around that
//! stage's call, so a C stage reaches neither the chain's state nor another stage's part
//! of the same tenant. This module does not charge the DRR by chain cost (the worker's
//! cycle count around the whole chain does) and does not pre-split groups in the
//! dispatcher: docs/chains.md says why.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use buffet_dispatch::Match;
use buffet_memory::{Mpk, PartKey, SealError, SealedPages};
use buffet_sdk::{
    DropCause, InitError, MemorySpec, NetworkFunction, Packet, Verdict, WorkerThreadError,
    GROUP_CHUNK,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::isolation::{Isolation, IsolationError};
use crate::registry::{LoadedNf, NfKind, NfSpec, NfVisitor, RegisteredNf, RegistryError};
use crate::tenants::{guard_from_json, Policy, TenantConfig, TenantsError};

/// Most stages a chain has.
pub const MAX_STAGES: usize = 8;

/// The page size stage regions are aligned to.
pub const PAGE: usize = 4096;

/// The key of the run's default NF in a [`Chain`]: the one-stage chain of a tenant that
/// names none. Never a valid stage NF name, so it cannot collide with one (the `buffet`
/// command refuses to register an NF under it).
pub const DEFAULT_KEY: &str = "default";

const _: () = assert!(GROUP_CHUNK <= 64, "groups are tracked in a u64 bitmask");

/// A stage's `when`: header fields (a classifier rule without priority) and the packet's
/// mark. A stage with a guard runs only for the packets it matches.
#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    rule: Match,
    any_field: bool,
    mark: Option<u32>,
    source: serde_json::Value,
}

impl Guard {
    /// A guard on these header fields and, if given, this mark.
    pub fn new(rule: Match, mark: Option<u32>) -> Guard {
        let source = guard_json(&rule, mark);
        Guard {
            any_field: rule != Match::default(),
            rule,
            mark,
            source,
        }
    }

    /// The header fields.
    pub fn rule(&self) -> &Match {
        &self.rule
    }

    /// The mark a packet must carry, if any.
    pub fn mark(&self) -> Option<u32> {
        self.mark
    }

    /// Whether `pkt` passes the guard. No allocation.
    #[inline]
    pub fn matches(&self, pkt: &Packet<'_>) -> bool {
        self.mark.is_none_or(|m| m == pkt.mark()) && (!self.any_field || self.rule.matches(pkt))
    }
}

/// The guard in its written form (the JSON `when`), for serializing a [`ChainPolicy`].
fn guard_json(m: &Match, mark: Option<u32>) -> serde_json::Value {
    let mut o = serde_json::Map::new();
    let mac = |a: [u8; 6]| {
        a.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    let range = |r: buffet_dispatch::PortRange| {
        if r.lo == r.hi {
            serde_json::json!(r.lo)
        } else {
            serde_json::json!(format!("{}-{}", r.lo, r.hi))
        }
    };
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            o.insert(k.to_owned(), v);
        }
    };
    put("in_port", m.in_port.map(Into::into));
    put("src_mac", m.src_mac.map(|a| mac(a).into()));
    put("dst_mac", m.dst_mac.map(|a| mac(a).into()));
    put("vlan", m.vlan.map(Into::into));
    put("src_ip", m.src_ip.map(|p| p.to_string().into()));
    put("dst_ip", m.dst_ip.map(|p| p.to_string().into()));
    put("protocol", m.protocol.map(Into::into));
    put("src_port", m.src_port.map(range));
    put("dst_port", m.dst_port.map(range));
    put("dscp", m.dscp.map(Into::into));
    put("mark", mark.map(Into::into));
    serde_json::Value::Object(o)
}

impl Serialize for Guard {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.source.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Guard {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Guard, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        guard_from_json(v).map_err(|(f, m)| serde::de::Error::custom(format!("when{f}: {m}")))
    }
}

/// One stage of a [`ChainPolicy`]: which NF of the run (its key in the [`Chain`]), its
/// policy and its guard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagePolicy {
    /// The NF's key in the chain: its spec as written (`firewall`, `c:x.so`,
    /// `ebpf:x.o`, a registered NF's name) or [`DEFAULT_KEY`].
    pub nf: String,
    /// The stage's policy, decoded by its NF.
    #[serde(default)]
    pub policy: Policy,
    /// The stage's guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Guard>,
}

/// A tenant's chain: the [`Chain`]'s per-tenant policy. In JSON:
/// `{"stages": [{"nf": "firewall", "policy": {…}, "when": {…}}, …]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainPolicy {
    /// The stages, in order (1 to [`MAX_STAGES`]).
    pub stages: Vec<StagePolicy>,
}

impl ChainPolicy {
    /// The chain a tenant of the tenants file runs: its `[[tenant.chain]]` stages, or,
    /// without any, the run's default NF with the tenant's policy.
    pub fn of_tenant(t: &TenantConfig) -> ChainPolicy {
        if t.chain.is_empty() {
            return ChainPolicy {
                stages: vec![StagePolicy {
                    nf: DEFAULT_KEY.to_owned(),
                    policy: t.policy.clone(),
                    when: None,
                }],
            };
        }
        ChainPolicy {
            stages: t
                .chain
                .iter()
                .map(|s| StagePolicy {
                    nf: s.nf.to_string(),
                    policy: s.policy.clone(),
                    when: s.when.clone(),
                })
                .collect(),
        }
    }
}

/// Whether any tenant names a chain (then the run's NF is a [`Chain`]).
pub fn any_chain(tenants: &[TenantConfig]) -> bool {
    tenants.iter().any(|t| !t.chain.is_empty())
}

/// The tenants with their policy replaced by their [`ChainPolicy`] (as JSON), so that
/// `TenantConfig::policy_as::<ChainPolicy>` gives each its chain.
pub fn chained_tenants(tenants: &[TenantConfig]) -> Vec<TenantConfig> {
    tenants
        .iter()
        .map(|t| {
            let mut t = t.clone();
            let json = serde_json::to_value(ChainPolicy::of_tenant(&t))
                .expect("a chain policy is plain JSON");
            t.policy = match json {
                serde_json::Value::Object(m) => Policy::from_map(m),
                _ => unreachable!("a chain policy is an object"),
            };
            t
        })
        .collect()
}

/// The NFs the tenants' stages name, each once, in order of first appearance.
pub fn stage_specs(tenants: &[TenantConfig]) -> Vec<NfSpec> {
    let mut out: Vec<NfSpec> = Vec::new();
    for s in tenants.iter().flat_map(|t| &t.chain) {
        if !out.contains(&s.nf) {
            out.push(s.nf.clone());
        }
    }
    out
}

/// Builds, for a chain's stages, the NFs a program registered by name
/// ([`NfSpec::Registered`]): the `buffet` command's NF registry implements it for the NFs
/// an author added (`nf_main!`, `main_with`), and buffetd takes one from a program that
/// embeds it (`nf.offered` and tenants' chains then name those NFs). `()` registers none.
pub trait RegisteredStages {
    /// The registered names, in order of registration: what [`NfSpec`]'s parser accepts
    /// as [`NfSpec::Registered`] inside
    /// [`with_registered_names`](crate::registry::with_registered_names).
    /// None by default, so an implementation written before names were asked for keeps
    /// building (its NFs then cannot be named in a daemon's `nf.offered`).
    fn registered_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Adds the NF registered as `name` to `chain`, under `name` ([`Chain::with_nf`]);
    /// gives `chain` back unchanged when no NF has that name.
    fn add_stage(&self, name: &str, chain: Chain) -> Result<Chain, Chain>;
}

impl RegisteredStages for () {
    fn add_stage(&self, _name: &str, chain: Chain) -> Result<Chain, Chain> {
        Err(chain)
    }
}

/// Why a chained run cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A stage's NF could not be loaded: named by the first tenant and stage that name
    /// it, as the tenants file's other errors name a field (`chain[k].nf`).
    #[error("{}: tenant {tenant}: chain[{stage}].nf: {source}", file.display())]
    Load {
        /// The tenants file.
        file: std::path::PathBuf,
        /// The first tenant naming the NF, `7 ("acme")`.
        tenant: String,
        /// That tenant's stage index.
        stage: usize,
        /// The NF.
        spec: NfSpec,
        /// Why.
        source: Box<RegistryError>,
    },
    /// A stage's NF cannot run at the run's isolation level.
    #[error(
        "{}: tenant {tenant}: chain[{stage}].nf: the C NF {spec} cannot run at isolation \
         {level}; use --isolation mpk (or trusted-native)",
        file.display()
    )]
    Level {
        /// The tenants file.
        file: std::path::PathBuf,
        /// The tenant, `7 ("acme")`.
        tenant: String,
        /// The stage index.
        stage: usize,
        /// The NF.
        spec: NfSpec,
        /// The run's level.
        level: Isolation,
    },
    /// A tenant asks for another level than the run's.
    #[error(transparent)]
    Isolation(#[from] IsolationError),
    /// A tenant's chain is not valid for the NFs of the run.
    #[error(transparent)]
    Tenants(#[from] TenantsError),
    /// One stage NF's region makes every tenant's chain region larger than the arena can
    /// give ([`Chain::check_region`]).
    #[error(
        "chain stage NF {nf} asks {stage_bytes} bytes per tenant, and every tenant's chain \
         region holds {MAX_STAGES} parts of the largest stage NF: {region} bytes, more than \
         the {limit} bytes the arena gives one region; give {nf} a smaller region or a \
         larger arena (at least {arena_mib} MiB: --arena-mib, dataplane.arena_mib)"
    )]
    RegionTooLarge {
        /// The stage NF with the largest region (its spec, `c:x.so`, or name).
        nf: String,
        /// The bytes it registers.
        stage_bytes: usize,
        /// The chain's region per tenant.
        region: usize,
        /// The largest region the arena gives.
        limit: usize,
        /// An arena size, in MiB, that holds one such region.
        arena_mib: usize,
    },
}

/// The isolation level of a chained run. Reference and eBPF stages run at every level
/// (their isolation is the type system and the verifier); a C stage needs `mpk` or
/// `trusted-native`. Default: the level every tenant names, else `mpk` when any stage
/// (or the default NF) is C, else `ebpf` when the default NF is eBPF, else `safe`.
pub fn resolve_level(
    requested: Option<Isolation>,
    default: Option<&NfSpec>,
    tenants: &[TenantConfig],
    file: &Path,
) -> Result<Isolation, ChainError> {
    let has_c = default.is_some_and(|s| s.kind() == NfKind::C)
        || tenants
            .iter()
            .flat_map(|t| &t.chain)
            .any(|s| s.nf.kind() == NfKind::C);
    let fallback = if has_c {
        Isolation::Mpk
    } else if default.is_some_and(|s| s.kind() == NfKind::Ebpf) {
        Isolation::Ebpf
    } else {
        Isolation::Safe
    };
    let level = crate::isolation::run_level(requested, fallback, tenants, file)?;
    let native_ok = matches!(level, Isolation::Mpk | Isolation::TrustedNative);
    for t in tenants {
        for (k, s) in t.chain.iter().enumerate() {
            if s.nf.kind() == NfKind::C && !native_ok {
                return Err(ChainError::Level {
                    file: file.to_owned(),
                    tenant: format!("{} ({:?})", t.id, t.name),
                    stage: k,
                    spec: s.nf.clone(),
                    level,
                });
            }
        }
    }
    Ok(level)
}

/// One stage's counters, per tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCounters {
    /// Packets the stage handled.
    pub packets: u64,
    /// Packets it passed on (Pass, Forward, Tx).
    pub passed: u64,
    /// Packets it dropped, by [`DropCause::index`] (a frame that no longer parses after
    /// the stage rewrote it counts as `malformed` here).
    pub drops: [u64; DropCause::ALL.len()],
    /// Faults (or panics) of the stage.
    pub faults: u64,
    /// Wall-clock nanoseconds spent in the stage (when the chain is timed).
    pub ns: u64,
}

/// A stage's NF with its type erased: what the chain needs of it.
trait ChainNf: Send + Sync {
    fn name(&self) -> &'static str;
    fn kind(&self) -> NfKind;
    fn region_bytes(&self) -> usize;
    fn build(&self, policy: &Policy, region: &mut [u8]) -> Result<Box<dyn StageRun>, InitError>;
    fn prepare_worker_thread(&self) -> Result<(), WorkerThreadError>;
    fn contained_faults(&self) -> Vec<String>;
}

/// One tenant's stage: its NF and its state.
trait StageRun: Send {
    fn run(&mut self, pkts: &mut [Packet<'_>], verdicts: &mut [Verdict]);
    fn summary(&self) -> Vec<(&'static str, u64)>;
    fn quarantined_summary(&self) -> Vec<(&'static str, u64)>;
    fn fault_reason(&self) -> Option<String>;
}

struct Entry<N> {
    nf: Arc<N>,
    kind: NfKind,
}

struct Running<N: NetworkFunction> {
    nf: Arc<N>,
    state: N::State,
}

impl<N: RegisteredNf> ChainNf for Entry<N> {
    fn name(&self) -> &'static str {
        self.nf.name()
    }

    fn kind(&self) -> NfKind {
        self.kind
    }

    fn region_bytes(&self) -> usize {
        self.nf.register().bytes
    }

    fn build(&self, policy: &Policy, region: &mut [u8]) -> Result<Box<dyn StageRun>, InitError> {
        // `policy` or the field inside it (`policy.flow_capacity`).
        let p: N::Policy = policy
            .decode_field()
            .map_err(|e| InitError::invalid(e.field(), e.message))?;
        let mut state = N::State::default();
        self.nf.init_in_region(&p, &mut state, region)?;
        Ok(Box::new(Running {
            nf: Arc::clone(&self.nf),
            state,
        }))
    }

    fn prepare_worker_thread(&self) -> Result<(), WorkerThreadError> {
        self.nf.prepare_worker_thread()
    }

    fn contained_faults(&self) -> Vec<String> {
        self.nf.contained_faults()
    }
}

impl<N: RegisteredNf> StageRun for Running<N> {
    #[inline]
    fn run(&mut self, pkts: &mut [Packet<'_>], verdicts: &mut [Verdict]) {
        self.nf.handle_group(pkts, &mut self.state, verdicts);
    }

    fn summary(&self) -> Vec<(&'static str, u64)> {
        self.nf.summary(&self.state)
    }

    fn quarantined_summary(&self) -> Vec<(&'static str, u64)> {
        self.nf.quarantined_summary(&self.state)
    }

    fn fault_reason(&self) -> Option<String> {
        self.nf.fault_reason(&self.state)
    }
}

/// One stage of a tenant's chain, built.
struct Stage {
    name: &'static str,
    run: Box<dyn StageRun>,
    when: Option<Guard>,
    counters: StageCounters,
    /// A native stage's own protection key, under [`Chain::stage_keys`]. Declared after
    /// `run`: the stage's state is dropped before its part goes back to the region.
    key: Option<PartKey>,
}

impl Stage {
    /// The stage NF's own counters, read with its key open (a C NF reads its part).
    fn summary(&self) -> Vec<(&'static str, u64)> {
        let _open = self.key.as_ref().map(PartKey::open);
        self.run.summary()
    }

    /// [`summary`](Self::summary) of a quarantined tenant's stage: what the stage NF
    /// reads from its state without running its code.
    fn quarantined_summary(&self) -> Vec<(&'static str, u64)> {
        let _open = self.key.as_ref().map(PartKey::open);
        self.run.quarantined_summary()
    }
}

/// A tenant's chain state: each stage's state and counters, and the last fault.
#[derive(Default)]
pub struct ChainState {
    stages: Vec<Stage>,
    fault: Option<String>,
    /// The guard pages sealed on either side of each C stage's part (without stage keys).
    guards: Vec<SealedPages>,
}

impl fmt::Debug for ChainState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainState")
            .field(
                "stages",
                &self
                    .stages
                    .iter()
                    .map(|s| (s.name, s.counters))
                    .collect::<Vec<_>>(),
            )
            .field("fault", &self.fault)
            .field("guard_pages", &self.guards.len())
            .finish()
    }
}

impl ChainState {
    /// Each stage's NF name and counters, in chain order.
    pub fn stages(&self) -> impl Iterator<Item = (&'static str, &StageCounters)> {
        self.stages.iter().map(|s| (s.name, &s.counters))
    }

    /// Stage `i`'s own summary (its NF's counters for this tenant).
    pub fn stage_summary(&self, i: usize) -> Vec<(&'static str, u64)> {
        self.stages.get(i).map(Stage::summary).unwrap_or_default()
    }
}

/// A multi-stage NF: runs each tenant's own chain of the NFs it was given.
pub struct Chain {
    entries: Vec<(String, Box<dyn ChainNf>)>,
    timed: bool,
    keys: Option<&'static Mpk>,
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field(
                "nfs",
                &self
                    .entries
                    .iter()
                    .map(|(k, e)| (k.as_str(), e.name()))
                    .collect::<Vec<_>>(),
            )
            .field("timed", &self.timed)
            .field("stage_keys", &self.keys.is_some())
            .finish()
    }
}

impl Default for Chain {
    fn default() -> Self {
        Chain::new()
    }
}

impl Chain {
    /// A chain with no NFs yet; stages are timed.
    pub fn new() -> Chain {
        Chain {
            entries: Vec::new(),
            timed: true,
            keys: None,
        }
    }

    /// Gives every native (C) stage's part of a tenant's region its own protection key
    /// of `mpk`, opened only while that stage runs (a run at `mpk`, whose Tenant Table
    /// regions are under `mpk`). A tenant whose chain has more C stages than the cache
    /// can hold with the tenant's own key is refused at admission
    /// ([`Mpk::check_parts`]). Off by default: then a C stage's part is under its
    /// tenant's key, with the chain's state and the other stages' parts.
    pub fn stage_keys(mut self, mpk: &'static Mpk) -> Chain {
        self.keys = Some(mpk);
        self
    }

    /// Whether each stage's wall-clock time is measured (one clock read per stage per
    /// group). On by default.
    pub fn timed(mut self, on: bool) -> Chain {
        self.timed = on;
        self
    }

    /// Adds a safe Rust NF (a reference NF or an author's own) under `key`.
    pub fn with_nf<N: RegisteredNf>(self, key: impl Into<String>, nf: N) -> Chain {
        self.with_kind(key, nf, NfKind::Reference)
    }

    /// Adds `nf` of `kind` under `key`; a later NF with the same key replaces it.
    pub fn with_kind<N: RegisteredNf>(
        mut self,
        key: impl Into<String>,
        nf: N,
        kind: NfKind,
    ) -> Chain {
        let key = key.into();
        self.entries.retain(|(k, _)| *k != key);
        self.entries.push((
            key,
            Box::new(Entry {
                nf: Arc::new(nf),
                kind,
            }),
        ));
        self
    }

    /// Adds a loaded NF under its spec's text (`firewall`, `c:x.so`, `ebpf:x.o`).
    pub fn with_loaded(self, spec: &NfSpec, nf: LoadedNf) -> Chain {
        struct Add<'a>(Chain, &'a NfSpec);
        impl NfVisitor for Add<'_> {
            type Output = Chain;
            fn visit<N: RegisteredNf>(self, nf: N) -> Chain {
                self.0.with_kind(self.1.to_string(), nf, self.1.kind())
            }
        }
        nf.visit(Add(self, spec))
    }

    /// Loads every NF the tenants' stages name, at `level`, and adds it. A stage naming a
    /// registered NF ([`NfSpec::Registered`]) needs [`load_stages_with`](Self::load_stages_with).
    pub fn load_stages(
        self,
        tenants: &[TenantConfig],
        level: Isolation,
        file: &Path,
    ) -> Result<Chain, ChainError> {
        self.load_stages_with(tenants, level, file, &())
    }

    /// [`load_stages`](Self::load_stages), with the NFs `registered` builds for the
    /// stages that name a registered NF (each added under its name, as a safe Rust NF).
    pub fn load_stages_with(
        mut self,
        tenants: &[TenantConfig],
        level: Isolation,
        file: &Path,
        registered: &dyn RegisteredStages,
    ) -> Result<Chain, ChainError> {
        for spec in stage_specs(tenants) {
            let (tenant, stage) = tenants
                .iter()
                .find_map(|t| {
                    let k = t.chain.iter().position(|s| s.nf == spec)?;
                    Some((format!("{} ({:?})", t.id, t.name), k))
                })
                .unwrap_or_default();
            let load_err = |source| ChainError::Load {
                file: file.to_owned(),
                tenant: tenant.clone(),
                stage,
                spec: spec.clone(),
                source: Box::new(source),
            };
            if let NfSpec::Registered(name) = &spec {
                self = registered
                    .add_stage(name, self)
                    .map_err(|_| load_err(RegistryError::NotLoadable(name.clone())))?;
                continue;
            }
            let nf = spec.load_at(level).map_err(load_err)?;
            self = self.with_loaded(&spec, nf);
        }
        Ok(self)
    }

    /// The keys of the NFs the chain holds.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    fn entry(&self, key: &str) -> Option<&dyn ChainNf> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, e)| &**e)
    }

    /// Bytes of one stage's part of a tenant region: the largest NF's, in whole pages.
    pub fn stage_region(&self) -> usize {
        self.entries
            .iter()
            .map(|(_, e)| e.region_bytes().next_multiple_of(PAGE))
            .max()
            .unwrap_or(0)
            .max(PAGE)
    }

    /// Checks, before any tenant is admitted, that a tenant's chain region
    /// ([`register`](NetworkFunction::register): [`MAX_STAGES`] parts of the largest stage
    /// NF's region, whatever stages the tenant names) fits `limit`, the largest region
    /// the Memory Manager's arena gives (`ArenaConfig::largest_region`). The refusal names
    /// the stage NF whose size made it too large, its size, and the limit.
    pub fn check_region(&self, limit: usize) -> Result<(), ChainError> {
        let region = self.register().bytes;
        if region <= limit {
            return Ok(());
        }
        let (key, entry) = self
            .entries
            .iter()
            .max_by_key(|(_, e)| e.region_bytes())
            .map(|(k, e)| (k.as_str(), &**e))
            .expect("a chain with a region larger than any limit has a stage NF");
        let nf = if key == DEFAULT_KEY {
            entry.name().to_owned()
        } else {
            key.to_owned()
        };
        Err(ChainError::RegionTooLarge {
            nf,
            stage_bytes: entry.region_bytes(),
            region,
            limit,
            arena_mib: (region + (4 << 20)).div_ceil(1 << 20),
        })
    }

    /// Checks every tenant's chain against the NFs of the run before any is admitted:
    /// each stage's NF is loaded, and each stage's policy builds that NF's state (C
    /// stages: their policy is only checked to be an object, their init runs at
    /// admission, in the tenant's region). The error names the file, the tenant, the
    /// stage and the field.
    pub fn check_tenants(&self, tenants: &[TenantConfig], file: &Path) -> Result<(), TenantsError> {
        for t in tenants {
            let label = format!("{} ({:?})", t.id, t.name);
            let err = |field: String, message: String| TenantsError::Field {
                path: file.to_owned(),
                tenant: label.clone(),
                field,
                message,
            };
            let chain = ChainPolicy::of_tenant(t);
            for (k, stage) in chain.stages.iter().enumerate() {
                let (nf_field, policy_field) = if t.chain.is_empty() {
                    ("nf".to_owned(), "policy".to_owned())
                } else {
                    (format!("chain[{k}].nf"), format!("chain[{k}].policy"))
                };
                let Some(entry) = self.entry(&stage.nf) else {
                    return Err(err(
                        nf_field,
                        if stage.nf == DEFAULT_KEY {
                            "the tenant names no chain and the run names no NF \
                             (give --nf, --nf-lib or --nf-ebpf)"
                                .to_owned()
                        } else {
                            format!("{} is not loaded in this run", stage.nf)
                        },
                    ));
                };
                if entry.kind() == NfKind::C {
                    continue;
                }
                let mut scratch = vec![0u8; entry.region_bytes().min(1 << 24)];
                if let Err(e) = entry.build(&stage.policy, &mut scratch) {
                    // A field the policy's type refused is named inside the stage's
                    // policy (`chain[1].policy.flow_capacity`).
                    let inside = match &e {
                        InitError::InvalidPolicy { field, message } => field
                            .strip_prefix("policy")
                            .filter(|rest| rest.starts_with(['.', '[']))
                            .map(|rest| (format!("{policy_field}{rest}"), message.clone())),
                        _ => None,
                    };
                    return Err(match inside {
                        Some((field, message)) => err(field, message),
                        None => err(policy_field, init_message(&e)),
                    });
                }
            }
        }
        Ok(())
    }

    fn build(
        &self,
        policy: &ChainPolicy,
        state: &mut ChainState,
        mut region: Option<&mut [u8]>,
    ) -> Result<(), InitError> {
        let n = policy.stages.len();
        if n == 0 || n > MAX_STAGES {
            return Err(InitError::invalid(
                "stages",
                format!("{n} stages: a chain has 1 to {MAX_STAGES} stages"),
            ));
        }
        let part = self.stage_region();
        // Page-align the first part: the region after the chain's own state. The parts
        // follow a guard page, each part followed by its own: `G p0 G p1 G …`.
        let needed = |skip: usize| skip + PAGE + n * (part + PAGE);
        let mut lead: &mut [u8] = &mut [];
        let mut rest: &mut [u8] = match region.take() {
            Some(r) => {
                let addr = r.as_ptr() as usize;
                let skip = addr.next_multiple_of(PAGE) - addr;
                let available = r.len();
                let oom = InitError::OutOfMemory {
                    needed: needed(skip),
                    available,
                };
                if available < needed(skip) {
                    return Err(oom);
                }
                let (g, tail) = r[skip..].split_at_mut(PAGE);
                lead = g;
                tail
            }
            None => &mut [],
        };
        let carve = !rest.is_empty();
        // The guard pages: before stage 0 and after each stage.
        let mut guard_pages: Vec<&mut [u8]> = Vec::with_capacity(n + 1);
        guard_pages.push(lead);
        let mut is_c = Vec::with_capacity(n);
        let keys = self.keys.filter(|_| carve);
        if let Some(mpk) = keys {
            let native = policy
                .stages
                .iter()
                .filter(|sp| self.entry(&sp.nf).is_some_and(|e| e.kind() == NfKind::C))
                .count();
            mpk.check_parts(native)
                .map_err(|e| InitError::invalid("chain", e.to_string()))?;
        }
        let mut stages = Vec::with_capacity(n);
        for (k, sp) in policy.stages.iter().enumerate() {
            let entry = self.entry(&sp.nf).ok_or_else(|| {
                InitError::invalid(
                    format!("chain[{k}].nf"),
                    format!("{} is not loaded in this run", sp.nf),
                )
            })?;
            let own: &mut [u8] = if carve {
                let available = rest.len();
                if available < part + PAGE {
                    return Err(InitError::OutOfMemory {
                        needed: (part + PAGE) * n,
                        available,
                    });
                }
                let (own, tail) = std::mem::take(&mut rest).split_at_mut(part);
                let (guard, tail) = tail.split_at_mut(PAGE);
                guard_pages.push(guard);
                rest = tail;
                own
            } else {
                &mut []
            };
            is_c.push(entry.kind() == NfKind::C);
            let run = entry.build(&sp.policy, &mut *own).map_err(|e| match e {
                // Named as the tenants file names the stage (`chain[k]`); a C NF's
                // refusal is of its whole policy.
                InitError::InvalidPolicy { field, message } => InitError::InvalidPolicy {
                    field: match field.as_str() {
                        "(policy)" => format!("chain[{k}].policy"),
                        "(state)" => format!("chain[{k}]"),
                        f => format!("chain[{k}].{f}"),
                    },
                    message,
                },
                other => other,
            })?;
            // The stage built its state in its part; once this call's borrow of the region
            // ends, only its key opens it (until then it keeps the tenant's key), and the
            // Memory Manager hands out no slice over the region while the part has a key.
            let key = match keys {
                Some(mpk) if entry.kind() == NfKind::C => Some(
                    mpk.carve_part(own)
                        .map_err(|e| InitError::invalid(format!("chain[{k}]"), e.to_string()))?,
                ),
                _ => None,
            };
            stages.push(Stage {
                name: entry.name(),
                run,
                when: sp.when.clone(),
                counters: StageCounters::default(),
                key,
            });
        }
        // Without stage keys (trusted-native), the guard pages on either side of each C
        // stage's part are sealed, so a C stage running off its part faults there (and its
        // tenant is quarantined) instead of writing into the next stage's state. With
        // stage keys (mpk) they carry the tenant's key, closed while a C stage runs. The
        // Memory Manager seals them when this call's borrow of the region ends, and from
        // then on hands out no slice over the region's bytes until they are unsealed
        // (when this state drops).
        let mut guards = Vec::new();
        if carve && keys.is_none() {
            for (g, page) in guard_pages.into_iter().enumerate() {
                let before_c = is_c.get(g).copied().unwrap_or(false);
                let after_c = g > 0 && is_c.get(g - 1).copied().unwrap_or(false);
                if !(before_c || after_c) {
                    continue;
                }
                match buffet_memory::seal_pages(page) {
                    Ok(sealed) => guards.push(sealed),
                    // A region outside any tenant arena (a test's buffer): no guards.
                    Err(SealError::NotInRegion { .. }) => break,
                    // A region under a protection key: sealed pages would be opened again
                    // by its re-tags, so its C stages need stage keys instead.
                    Err(SealError::Tagged { .. }) => {
                        return Err(InitError::invalid(
                            "chain",
                            "the tenant's region is under a protection key (mpk), where guard \
                             pages cannot be sealed: give the chain stage keys \
                             (Chain::stage_keys) so each C stage's part gets its own key",
                        ))
                    }
                    Err(e) => return Err(InitError::invalid("chain", format!("guard page: {e}"))),
                }
            }
        }
        *state = ChainState {
            stages,
            fault: None,
            guards,
        };
        Ok(())
    }

    /// One chunk of at most [`GROUP_CHUNK`] packets; false after a fault.
    ///
    /// The chunk's verdicts are written in place: every packet starts at `Pass`, a stage's
    /// `Forward`/`Tx`/`Drop` replaces it (its `Pass` leaves the earlier decision), and
    /// the packets from a fault on end as `Fault`.
    fn run_chunk(
        &self,
        pkts: &mut [Packet<'_>],
        state: &mut ChainState,
        verdicts: &mut [Verdict],
    ) -> bool {
        let n = pkts.len().min(verdicts.len());
        debug_assert!(n <= GROUP_CHUNK);
        let pkts = &mut pkts[..n];
        let outcome = &mut verdicts[..n];
        outcome.fill(Verdict::Pass);
        let mut alive = low_bits(n);
        let mut fault_at = n;
        let last = state.stages.len().saturating_sub(1);
        let mut clock = self.timed.then(Instant::now);
        for (s, stage) in state.stages.iter_mut().enumerate() {
            if alive == 0 {
                break;
            }
            let sel = match &stage.when {
                None => alive,
                Some(g) => {
                    let mut m = 0u64;
                    let mut bits = alive;
                    while bits != 0 {
                        let i = bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        if g.matches(&pkts[i]) {
                            m |= 1 << i;
                        }
                    }
                    m
                }
            };
            if sel == 0 {
                continue;
            }
            let k = sel.count_ones() as usize;
            let lo = sel.trailing_zeros() as usize;
            // Contiguous (every unguarded stage while nothing dropped): packet `j` of the
            // sub-group is packet `lo + j` of the group, no positions to gather.
            let contiguous = sel == low_bits(k) << lo;
            let mut pos = [0u8; GROUP_CHUNK];
            if !contiguous {
                let mut bits = sel;
                for p in pos.iter_mut().take(k) {
                    *p = bits.trailing_zeros() as u8;
                    bits &= bits - 1;
                }
            }
            let mut sv = [Verdict::Fault; GROUP_CHUNK];
            let run = &mut stage.run;
            // A native stage's own key: open for its call only, the tenant's closed.
            let open = stage.key.as_ref().map(PartKey::open);
            let panicked = if contiguous {
                // Hand the slice over as it is.
                call(run, &mut pkts[lo..lo + k], &mut sv[..k])
            } else {
                // A stable partition of the selected packets to the front, by swaps,
                // undone afterwards: the tenant's order is kept.
                for (w, &p) in pos[..k].iter().enumerate() {
                    pkts.swap(w, p as usize);
                }
                let r = call(run, &mut pkts[..k], &mut sv[..k]);
                for (w, &p) in pos[..k].iter().enumerate().rev() {
                    pkts.swap(w, p as usize);
                }
                r
            };
            drop(open);
            // The verdicts, counted in locals and added to the stage's counters once; the
            // loop is specialised for the common case (contiguous, or the last stage, which
            // needs no fresh parse) so it carries no per-packet test of either.
            let reparse = s < last;
            let mut settled = Settled {
                alive,
                passed: 0,
                drops: [0; DropCause::ALL.len()],
                fault: None,
            };
            match (contiguous, reparse) {
                (true, true) => {
                    settle::<true, true>(&sv[..k], lo, &pos, pkts, outcome, &mut settled)
                }
                (true, false) => {
                    settle::<true, false>(&sv[..k], lo, &pos, pkts, outcome, &mut settled)
                }
                (false, true) => {
                    settle::<false, true>(&sv[..k], lo, &pos, pkts, outcome, &mut settled)
                }
                (false, false) => {
                    settle::<false, false>(&sv[..k], lo, &pos, pkts, outcome, &mut settled)
                }
            }
            alive = settled.alive;
            let c = &mut stage.counters;
            let mut handled = k;
            if let Some((j, i)) = settled.fault {
                handled = j + 1;
                c.faults += 1;
                fault_at = i;
                alive &= low_bits(i);
                let why = match &panicked {
                    Some(m) => format!("panicked: {m}"),
                    None => stage
                        .run
                        .fault_reason()
                        .unwrap_or_else(|| "reported a fault".to_owned()),
                };
                state.fault = Some(format!("chain stage {s} ({}): {why}", stage.name));
            }
            c.packets += handled as u64;
            c.passed += settled.passed;
            for (total, d) in c.drops.iter_mut().zip(settled.drops) {
                *total += d;
            }
            if let Some(t0) = clock {
                let t1 = Instant::now();
                c.ns += u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX);
                clock = Some(t1);
            }
        }
        if fault_at < n {
            outcome[fault_at..].fill(Verdict::Fault);
        }
        fault_at == n
    }
}

/// What one stage's verdicts did to a chunk, before it goes into the stage's counters.
struct Settled {
    /// The chunk's packets still in the chain.
    alive: u64,
    /// Packets passed on to the next stage.
    passed: u64,
    /// Drops by [`DropCause::index`] (a rewrite that no longer parses is `Malformed`).
    drops: [u64; DropCause::ALL.len()],
    /// The first fault: its index in the sub-group and its packet's index in the chunk.
    fault: Option<(usize, usize)>,
}

/// Applies one stage's verdicts `sv` (packet `j` of the sub-group is the chunk's packet
/// `lo + j` when `CONTIGUOUS`, else `pos[j]`) to the chunk's `outcome`; with `REPARSE` a
/// packet whose headers the stage rewrote gets a fresh parse for the next stage. Stops at
/// the first fault.
#[inline(always)]
fn settle<const CONTIGUOUS: bool, const REPARSE: bool>(
    sv: &[Verdict],
    lo: usize,
    pos: &[u8; GROUP_CHUNK],
    pkts: &mut [Packet<'_>],
    outcome: &mut [Verdict],
    out: &mut Settled,
) {
    // Counted in locals (registers), stored once.
    let mut alive = out.alive;
    let mut passed = 0u64;
    let mut fault = None;
    if CONTIGUOUS {
        // Straight zips over the sub-group's own ranges: no index per packet.
        let range = lo..lo + sv.len();
        let sub = sv
            .iter()
            .zip(&mut outcome[range.clone()])
            .zip(&mut pkts[range]);
        for (j, ((&v, o), pkt)) in sub.enumerate() {
            let i = lo + j;
            if !settle_one::<REPARSE>(v, o, pkt, i, &mut alive, &mut passed, &mut out.drops) {
                fault = Some((j, i));
                break;
            }
        }
    } else {
        for (j, (&v, &p)) in sv.iter().zip(pos.iter()).enumerate() {
            let i = p as usize;
            let (o, pkt) = (&mut outcome[i], &mut pkts[i]);
            if !settle_one::<REPARSE>(v, o, pkt, i, &mut alive, &mut passed, &mut out.drops) {
                fault = Some((j, i));
                break;
            }
        }
    }
    out.alive = alive;
    out.passed = passed;
    out.fault = fault;
}

/// One packet's verdict (the chunk's packet `i`); false on a fault.
#[inline(always)]
fn settle_one<const REPARSE: bool>(
    v: Verdict,
    outcome: &mut Verdict,
    pkt: &mut Packet<'_>,
    i: usize,
    alive: &mut u64,
    passed: &mut u64,
    drops: &mut [u64; DropCause::ALL.len()],
) -> bool {
    match v {
        Verdict::Pass => {}
        Verdict::Forward(_) | Verdict::Tx => *outcome = v,
        Verdict::Drop(cause) => {
            drops[cause.index()] += 1;
            *alive &= !(1 << i);
            *outcome = v;
            return true;
        }
        Verdict::Fault => return false,
    }
    // A fresh parse for the next stage, only after a rewrite.
    if REPARSE && pkt.headers_written() && pkt.reparse().is_err() {
        drops[DropCause::Malformed.index()] += 1;
        *alive &= !(1 << i);
        *outcome = Verdict::Drop(DropCause::Malformed);
    } else {
        *passed += 1;
    }
    true
}

/// The `n` low bits set.
#[inline]
fn low_bits(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Runs one stage over a sub-group; a panic becomes a fault at the first packet whose
/// verdict was not written (the verdicts are pre-filled with `Fault`), with its message.
#[inline]
fn call(
    run: &mut Box<dyn StageRun>,
    pkts: &mut [Packet<'_>],
    verdicts: &mut [Verdict],
) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.run(pkts, verdicts)))
        .err()
        .map(|p| {
            p.downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned())
        })
}

fn init_message(e: &InitError) -> String {
    match e {
        InitError::InvalidPolicy { field, message } if field == "policy" => message.clone(),
        InitError::InvalidPolicy { field, message } => format!("{field}: {message}"),
        other => other.to_string(),
    }
}

/// A `&'static str` for a summary key built at run time (the stage's index and NF name):
/// each distinct key is leaked once per process, off the hot path, so the set is bounded
/// by [`MAX_STAGES`] times the keys of the run's NFs.
fn intern(key: String) -> &'static str {
    static KEYS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut set = KEYS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(k) = set.get(key.as_str()) {
        return k;
    }
    let k: &'static str = Box::leak(key.into_boxed_str());
    set.insert(k);
    k
}

/// The prefix of stage `i`'s summary keys: `chain.<i>.<nf>.` (dots in the NF's name
/// become `_`).
pub fn stage_key(i: usize, nf: &str, counter: &str) -> String {
    format!("chain.{i}.{}.{counter}", nf.replace('.', "_"))
}

/// One stage's counters, read back from a tenant's NF summary (the keys
/// [`stage_key`] writes: `chain.<i>.<nf>.<counter>`), for the CLI's tables and
/// `--stats-json`, and the daemon's stats and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StageRow {
    /// Its index in the chain.
    pub stage: usize,
    /// Its NF.
    pub nf: String,
    /// Packets it handled.
    pub packets: u64,
    /// Packets it passed on.
    pub passed: u64,
    /// Packets it dropped, by cause.
    pub drops: BTreeMap<String, u64>,
    /// Faults (or panics) it raised.
    pub faults: u64,
    /// Nanoseconds spent in it, when the chain is timed ([`Chain::timed`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns: Option<u64>,
    /// The stage NF's own counters for this tenant.
    pub counters: BTreeMap<String, u64>,
}

/// The stages in a tenant's NF summary, in chain order; empty for an NF that is not a
/// chain.
pub fn stage_rows(nf: &BTreeMap<&'static str, u64>) -> Vec<StageRow> {
    let mut rows: BTreeMap<usize, StageRow> = Default::default();
    for (&key, &v) in nf {
        let mut parts = key.splitn(4, '.');
        let (Some("chain"), Some(i), Some(name), Some(counter)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(i) = i.parse::<usize>() else {
            continue;
        };
        let row = rows.entry(i).or_insert_with(|| StageRow {
            stage: i,
            nf: name.to_owned(),
            ..StageRow::default()
        });
        match counter {
            "packets" => row.packets = v,
            "passed" => row.passed = v,
            "faults" => row.faults = v,
            "ns" => row.ns = Some(v),
            c => {
                if let Some(cause) = c.strip_prefix("drop.") {
                    row.drops.insert(cause.to_owned(), v);
                } else if let Some(own) = c.strip_prefix("nf.") {
                    row.counters.insert(own.to_owned(), v);
                }
            }
        }
    }
    rows.into_values().collect()
}

impl NetworkFunction for Chain {
    type State = ChainState;
    type Policy = ChainPolicy;

    fn name(&self) -> &'static str {
        "chain"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec {
            // Page alignment, a guard page, then each stage's part and the guard after it.
            bytes: std::mem::size_of::<ChainState>()
                + 2 * PAGE
                + MAX_STAGES * (self.stage_region() + PAGE),
        }
    }

    fn init(&self, policy: &ChainPolicy, state: &mut ChainState) -> Result<(), InitError> {
        self.build(policy, state, None)
    }

    fn init_in_region(
        &self,
        policy: &ChainPolicy,
        state: &mut ChainState,
        region: &mut [u8],
    ) -> Result<(), InitError> {
        self.build(policy, state, Some(region))
    }

    fn handle(&self, pkt: &mut Packet<'_>, state: &mut ChainState) -> Verdict {
        let mut v = [Verdict::Fault];
        self.run_chunk(std::slice::from_mut(pkt), state, &mut v);
        v[0]
    }

    fn handle_group(
        &self,
        pkts: &mut [Packet<'_>],
        state: &mut ChainState,
        verdicts: &mut [Verdict],
    ) {
        let n = pkts.len().min(verdicts.len());
        let mut start = 0;
        while start < n {
            let end = (start + GROUP_CHUNK).min(n);
            if !self.run_chunk(&mut pkts[start..end], state, &mut verdicts[start..end]) {
                verdicts[end..n].fill(Verdict::Fault);
                return;
            }
            start = end;
        }
    }

    fn prepare_worker_thread(&self) -> Result<(), WorkerThreadError> {
        self.entries
            .iter()
            .try_for_each(|(_, e)| e.prepare_worker_thread())
    }

    fn fault_reason(&self, state: &ChainState) -> Option<String> {
        state.fault.clone()
    }

    fn summary(&self, state: &ChainState) -> Vec<(&'static str, u64)> {
        self.stages_summary(state, Stage::summary)
    }

    /// A quarantined tenant's chain: every stage's counters, which the chain keeps
    /// itself (packets, passed, drops, faults, time), and what each stage NF reads from
    /// its state without running its code (a C stage: nothing).
    fn quarantined_summary(&self, state: &ChainState) -> Vec<(&'static str, u64)> {
        self.stages_summary(state, Stage::quarantined_summary)
    }
}

impl Chain {
    /// The per-stage summary keys ([`stage_key`]), each stage NF's own counters from
    /// `nf_counters`.
    fn stages_summary(
        &self,
        state: &ChainState,
        nf_counters: fn(&Stage) -> Vec<(&'static str, u64)>,
    ) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for (i, s) in state.stages.iter().enumerate() {
            let c = &s.counters;
            let key = |counter: &str| intern(stage_key(i, s.name, counter));
            out.push((key("packets"), c.packets));
            out.push((key("passed"), c.passed));
            for cause in DropCause::ALL {
                let n = c.drops[cause.index()];
                if n != 0 {
                    out.push((key(&format!("drop.{}", cause.name())), n));
                }
            }
            if c.faults != 0 {
                out.push((key("faults"), c.faults));
            }
            if self.timed {
                out.push((key("ns"), c.ns));
            }
            for (k, v) in nf_counters(s) {
                out.push((key(&format!("nf.{k}")), v));
            }
        }
        out
    }
}

impl RegisteredNf for Chain {
    fn contained_faults(&self) -> Vec<String> {
        self.entries
            .iter()
            .flat_map(|(_, e)| e.contained_faults())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{parse, Format};

    const FILE: &str = r#"
[[tenant]]
id = 1
rules = [ { vlan = 1 } ]
[[tenant.chain]]
nf = "firewall"
policy = { default = "deny" }
[[tenant.chain]]
nf = "monitor"
when = { protocol = "udp", dst_port = "53-54", mark = 3 }
[[tenant.chain]]
nf = "firewall"

[[tenant]]
id = 2
rules = [ { vlan = 2 } ]
[tenant.policy]
flow_capacity = 8
"#;

    fn tenants() -> Vec<TenantConfig> {
        parse(Format::Toml, Path::new("t.toml"), FILE).unwrap()
    }

    /// A stage NF that registers `bytes`.
    struct Fat(usize);

    impl NetworkFunction for Fat {
        type State = ();
        type Policy = serde_json::Value;
        fn name(&self) -> &'static str {
            "fat"
        }
        fn register(&self) -> MemorySpec {
            MemorySpec { bytes: self.0 }
        }
        fn init(&self, _: &Self::Policy, _: &mut ()) -> Result<(), InitError> {
            Ok(())
        }
        fn handle(&self, _: &mut Packet<'_>, _: &mut ()) -> Verdict {
            Verdict::Pass
        }
    }

    impl RegisteredNf for Fat {}

    #[test]
    fn a_region_past_the_arena_names_the_stage_that_made_it() {
        let c = Chain::new()
            .with_nf(DEFAULT_KEY, Fat(PAGE))
            .with_nf("c:big.so", Fat(3 << 30))
            .with_nf("ebpf:small.o", Fat(64 << 10));
        let region = c.register().bytes;
        assert!(region > MAX_STAGES * (3 << 30));
        c.check_region(region).unwrap();
        let e = c.check_region(16 << 30).unwrap_err();
        assert!(
            matches!(
                &e,
                ChainError::RegionTooLarge { nf, stage_bytes, limit, .. }
                    if nf == "c:big.so" && *stage_bytes == 3 << 30 && *limit == 16 << 30
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with("chain stage NF c:big.so asks 3221225472 bytes per tenant"),
            "{text}"
        );
        assert!(text.contains("more than the 17179869184 bytes"), "{text}");
        // Without the fat stage the same arena holds the region.
        let thin = Chain::new()
            .with_nf(DEFAULT_KEY, Fat(PAGE))
            .with_nf("ebpf:small.o", Fat(64 << 10));
        thin.check_region(16 << 30).unwrap();
    }

    #[test]
    fn a_tenant_file_becomes_chain_policies() {
        let t = tenants();
        assert!(any_chain(&t));
        assert_eq!(
            stage_specs(&t)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["firewall", "monitor"]
        );
        let chained = chained_tenants(&t);
        let p: ChainPolicy = chained[0].policy_as(Path::new("t.toml")).unwrap();
        assert_eq!(p, ChainPolicy::of_tenant(&t[0]));
        assert_eq!(p.stages.len(), 3);
        assert_eq!(p.stages[1].when, t[0].chain[1].when);
        // A tenant without a chain: the run's NF with the tenant's policy.
        let p: ChainPolicy = chained[1].policy_as(Path::new("t.toml")).unwrap();
        assert_eq!(p.stages.len(), 1);
        assert_eq!(p.stages[0].nf, DEFAULT_KEY);
        assert_eq!(p.stages[0].policy, t[1].policy);
    }

    #[test]
    fn the_level_follows_the_stages() {
        let t = tenants();
        let f = Path::new("t.toml");
        assert_eq!(resolve_level(None, None, &t, f).unwrap(), Isolation::Safe);
        let c: NfSpec = "c:x.so".parse().unwrap();
        assert_eq!(
            resolve_level(None, Some(&c), &t, f).unwrap(),
            Isolation::Mpk
        );
        let mut with_c = t.clone();
        with_c[0].chain[2].nf = c.clone();
        let e = resolve_level(Some(Isolation::Safe), None, &with_c, f)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tenant 1 (\"tenant-1\"): chain[2].nf: the C NF c:x.so cannot run at isolation safe"),
            "{e}"
        );
        assert_eq!(
            resolve_level(Some(Isolation::TrustedNative), None, &with_c, f).unwrap(),
            Isolation::TrustedNative
        );
        let mut asks = t.clone();
        asks[1].isolation = Some(Isolation::Ebpf);
        assert!(resolve_level(None, None, &asks, f).is_err());
    }

    #[test]
    fn a_stage_nf_that_does_not_load_is_named_by_its_tenant_and_stage() {
        let mut t = tenants();
        t[0].chain[1].nf = "c:no-such-nf.so".parse().unwrap();
        let Err(e) = Chain::new().load_stages(&t, Isolation::TrustedNative, Path::new("t.toml"))
        else {
            panic!("a missing shared object does not load");
        };
        let e = e.to_string();
        assert!(
            e.starts_with(
                "t.toml: tenant 1 (\"tenant-1\"): chain[1].nf: cannot load C NF no-such-nf.so: "
            ),
            "{e}"
        );
        assert!(!e.contains("chain stage NF"), "{e}");
    }

    #[test]
    fn check_tenants_names_the_stage_and_needs_a_default() {
        let chain = Chain::new()
            .with_nf("firewall", buffet_nfs::Firewall::default())
            .with_nf("monitor", buffet_nfs::Monitor::default());
        let t = tenants();
        let f = Path::new("t.toml");
        let e = chain.check_tenants(&t, f).unwrap_err().to_string();
        assert!(
            e.starts_with("t.toml: tenant 2 (\"tenant-2\"): nf: the tenant names no chain"),
            "{e}"
        );
        let chain = chain.with_nf(DEFAULT_KEY, buffet_nfs::Monitor::default());
        chain.check_tenants(&t, f).unwrap();
        let mut bad = t.clone();
        bad[0].chain[2].policy = Policy::from_map(
            serde_json::json!({ "default": "maybe" })
                .as_object()
                .unwrap()
                .clone(),
        );
        let e = chain.check_tenants(&bad, f).unwrap_err().to_string();
        assert!(
            e.starts_with("t.toml: tenant 1 (\"tenant-1\"): chain[2].policy.default: "),
            "{e}"
        );
        assert!(e.contains("maybe"), "{e}");
        // A field of the wrong type is named inside the stage's policy, once.
        let mut bad = t.clone();
        bad[0].chain[1].policy = Policy::from_map(
            serde_json::json!({ "flow_capacity": "many" })
                .as_object()
                .unwrap()
                .clone(),
        );
        let e = chain.check_tenants(&bad, f).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "t.toml: tenant 1 (\"tenant-1\"): chain[1].policy.flow_capacity: invalid type: \
                 string \"many\""
            ),
            "{e}"
        );
        assert_eq!(e.matches("flow_capacity").count(), 1, "{e}");
    }
}

/// A C stage running off the end of its part, at trusted-native (no stage keys): the
/// guard page after the part stops it, so the next stage's state is untouched.
#[cfg(test)]
mod guard_tests {
    use super::*;
    use buffet_cnf::{CNf, Containment, FaultKind};
    use buffet_memory::{ArenaConfig, MemoryStorage};
    use buffet_sdk::PacketMeta;
    use std::path::PathBuf;
    use std::process::Command;

    fn malicious(dir: &Path) -> PathBuf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = dir.join("malicious.so");
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args([
                "-O2",
                "-fPIC",
                "-shared",
                "-nostartfiles",
                "-fno-stack-protector",
            ])
            .arg("-I")
            .arg(root.join("include"))
            .arg("-o")
            .arg(&out)
            .arg(root.join("examples/c-nf/malicious.c"))
            .status()
            .unwrap();
        assert!(status.success());
        out
    }

    /// Ethernet, IPv4, UDP to port 53, 8 bytes of payload.
    fn udp_frame() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 8];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&36u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, 2]);
        f[30..34].copy_from_slice(&[10, 0, 1, 1]);
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        f[38..40].copy_from_slice(&16u16.to_be_bytes());
        f
    }

    #[test]
    fn a_c_stage_overrunning_its_part_faults_on_the_guard_page_not_the_next_stage() {
        let dir = tempfile::tempdir().unwrap();
        let nf = CNf::load_with(&malicious(dir.path()), Containment::AnyFault).unwrap();
        let nf = Arc::new(nf);
        let c = Chain::new().with_kind(
            "c:malicious".to_owned(),
            SharedC(Arc::clone(&nf)),
            NfKind::C,
        );
        let bytes = c.register().bytes;
        let storage = MemoryStorage::new(ArenaConfig::for_regions(1, bytes)).unwrap();
        let mut region = storage.alloc(bytes).unwrap();
        let pol: ChainPolicy = serde_json::from_value(serde_json::json!({ "stages": [
            { "nf": "c:malicious", "policy": { "attack": "overrun", "attack_after": 3 } },
            { "nf": "c:malicious", "policy": { "canary": 77 } },
        ] }))
        .unwrap();
        let mut state = ChainState::default();
        c.init_in_region(&pol, &mut state, &mut region.bytes_mut().unwrap())
            .unwrap();
        assert_eq!(state.guards.len(), 3, "{state:?}");
        // Sealed once the borrow ended: no safe accessor reaches the region's bytes now.
        assert!(region.has_sealed_pages());
        assert!(region.bytes().is_err() && region.bytes_mut().is_err());
        let mut verdicts = Vec::new();
        for _ in 0..6 {
            let mut f = udp_frame();
            let mut pkt = Packet::parse(&mut f, PacketMeta::default()).unwrap();
            let mut v = [Verdict::Fault];
            c.handle_group(std::slice::from_mut(&mut pkt), &mut state, &mut v);
            verdicts.push(v[0]);
            if v[0] == Verdict::Fault {
                break;
            }
        }
        assert_eq!(
            verdicts,
            [Verdict::Pass, Verdict::Pass, Verdict::Pass, Verdict::Fault]
        );
        let faults = nf.faults();
        assert_eq!(faults.len(), 1, "{faults:?}");
        assert_eq!(faults[0].kind, FaultKind::GuardPage, "{}", faults[0]);
        // The next stage's state: exactly the packets it was handed, its canary intact.
        let next: BTreeMap<_, _> = state.stage_summary(1).into_iter().collect();
        assert_eq!(next.get("packets"), Some(&3), "{next:?}");
        assert_eq!(next.get("canary"), Some(&77), "{next:?}");
        // Dropping the state opens the guard pages again: the region is reachable whole.
        drop(state);
        region.bytes_mut().unwrap().fill(0);
    }

    /// The process's MPK key cache, or `None` (and the hardware skip line) on a CPU
    /// without protection keys; under `BUFFET_REQUIRE_PKU=1` that is a failure, as in
    /// buffet-testkit's `require_mpk` (not a dependency of this crate).
    fn mpk_or_skip(test: &str) -> Option<&'static Mpk> {
        match Mpk::get() {
            Ok(mpk) => Some(mpk),
            Err(e) if std::env::var("BUFFET_REQUIRE_PKU").is_ok_and(|v| v == "1") => {
                panic!("{test}: BUFFET_REQUIRE_PKU=1 but {e}")
            }
            Err(e) => {
                eprintln!("SKIP (hardware: no pku): {test}: {e}");
                None
            }
        }
    }

    #[test]
    fn under_mpk_a_chain_without_stage_keys_is_refused_and_stage_keys_close_the_region() {
        let Some(mpk) = mpk_or_skip(
            "under_mpk_a_chain_without_stage_keys_is_refused_and_stage_keys_close_the_region",
        ) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let nf = Arc::new(CNf::load_with(&malicious(dir.path()), Containment::AnyFault).unwrap());
        let chain = || {
            Chain::new().with_kind(
                "c:malicious".to_owned(),
                SharedC(Arc::clone(&nf)),
                NfKind::C,
            )
        };
        let bytes = chain().register().bytes;
        let storage = MemoryStorage::new(ArenaConfig::for_regions(2, bytes)).unwrap();
        let table = buffet_memory::TenantTable::<ChainState>::with_mpk(storage, 2, mpk);
        let pol: ChainPolicy = serde_json::from_value(serde_json::json!({ "stages": [
            { "nf": "c:malicious", "policy": { "canary": 1 } },
            { "nf": "c:malicious", "policy": { "canary": 2 } },
        ] }))
        .unwrap();
        let plain = chain();
        let e = table
            .admit_with(
                buffet_sdk::TenantSlot(0),
                buffet_sdk::TenantId(1),
                bytes,
                ChainState::default(),
                |state, region| plain.init_in_region(&pol, state, region),
            )
            .unwrap_err();
        let buffet_memory::AdmitWithError::Init(InitError::InvalidPolicy { field, message }) = e
        else {
            panic!("refused for another reason: {e:?}");
        };
        assert_eq!(field, "chain");
        assert!(message.contains("stage keys"), "{message}");
        assert!(table.is_empty());
        let keyed = chain().stage_keys(mpk);
        table
            .admit_with(
                buffet_sdk::TenantSlot(0),
                buffet_sdk::TenantId(1),
                bytes,
                ChainState::default(),
                |state, region| keyed.init_in_region(&pol, state, region),
            )
            .unwrap();
        let entry = table.get_arc(buffet_sdk::TenantSlot(0)).unwrap();
        let mut guard = entry.lock();
        assert_eq!(
            guard.split().err(),
            Some(buffet_memory::RegionSealed { ranges: 2 }),
            "the stages' parts are out of reach of a slice under the tenant's key"
        );
        let summary: BTreeMap<_, _> = guard.stage_summary(1).into_iter().collect();
        assert_eq!(summary.get("canary"), Some(&2), "{summary:?}");
    }

    /// The loaded C NF shared with the test, which reads its faults.
    struct SharedC(Arc<CNf>);

    impl NetworkFunction for SharedC {
        type State = <CNf as NetworkFunction>::State;
        type Policy = <CNf as NetworkFunction>::Policy;
        fn name(&self) -> &'static str {
            self.0.name()
        }
        fn register(&self) -> MemorySpec {
            self.0.register()
        }
        fn init(&self, p: &Self::Policy, s: &mut Self::State) -> Result<(), InitError> {
            self.0.init(p, s)
        }
        fn init_in_region(
            &self,
            p: &Self::Policy,
            s: &mut Self::State,
            region: &mut [u8],
        ) -> Result<(), InitError> {
            self.0.init_in_region(p, s, region)
        }
        fn handle(&self, pkt: &mut Packet<'_>, s: &mut Self::State) -> Verdict {
            self.0.handle(pkt, s)
        }
        fn handle_group(&self, pkts: &mut [Packet<'_>], s: &mut Self::State, v: &mut [Verdict]) {
            self.0.handle_group(pkts, s, v)
        }
        fn summary(&self, s: &Self::State) -> Vec<(&'static str, u64)> {
            self.0.summary(s)
        }
    }

    impl RegisteredNf for SharedC {}
}
