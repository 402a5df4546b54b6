//! The three-function NF contract and its small value types.

use std::fmt;

use serde::de::DeserializeOwned;

use crate::packet::Packet;

/// A tenant's identity, as the provider names it (configuration, API, stats).
///
/// The data plane maps it once, at admission, to a dense index; the hot path never
/// hashes a `TenantId`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A tenant's dense index in the Tenant Table, handed out at admission by the Memory
/// Manager's registry and used by every table that is indexed per tenant (the dispatcher's
/// Load Monitor rows, the workers' counters). Not the tenant's identity: a removed
/// tenant's slot is reused by a later one. Not a *timeslot* either (that is time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantSlot(pub u32);

impl TenantSlot {
    /// The slot as a `usize` index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TenantSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {}", self.0)
    }
}

/// An output port number (for [`Verdict::Forward`]).
pub type PortId = u16;

/// Why a packet was dropped, for per-tenant accounting ("drops by reason").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropCause {
    /// The tenant's policy said so (ACL deny, blacklisted host, blocked signature).
    Policy,
    /// The NF could not make sense of the packet (truncated payload, bad lengths).
    Malformed,
    /// A rate limit (token bucket) was exceeded.
    RateLimited,
    /// Cryptographic integrity failed (bad ICV, unknown SPI).
    Integrity,
    /// A replayed or too-old sequence number.
    Replay,
    /// The NF's per-tenant table is full and the packet cannot be tracked.
    TableFull,
}

impl DropCause {
    /// Every cause, in a fixed order (for tables and counters indexed by cause).
    pub const ALL: [DropCause; 6] = [
        DropCause::Policy,
        DropCause::Malformed,
        DropCause::RateLimited,
        DropCause::Integrity,
        DropCause::Replay,
        DropCause::TableFull,
    ];

    /// A stable, lower-case name (stats JSON keys, table headers).
    pub const fn name(self) -> &'static str {
        match self {
            DropCause::Policy => "policy",
            DropCause::Malformed => "malformed",
            DropCause::RateLimited => "rate_limited",
            DropCause::Integrity => "integrity",
            DropCause::Replay => "replay",
            DropCause::TableFull => "table_full",
        }
    }

    /// Position of this cause in [`DropCause::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// What an NF decided about one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let the packet continue on its way (default output).
    Pass,
    /// Send the packet out of the given port.
    Forward(PortId),
    /// Send the (possibly rewritten) packet back out of the port it came in on.
    Tx,
    /// Drop the packet, with the reason it is counted under.
    Drop(DropCause),
    /// The NF could not run this tenant's code safely (a sandbox or hardware fault, a
    /// verifier-rejected program): the packet is dropped and the tenant quarantined, as
    /// if its handler had panicked. Other tenants are not affected.
    Fault,
}

impl Verdict {
    /// True for every verdict that lets the packet leave the NF.
    pub const fn is_pass(self) -> bool {
        !matches!(self, Verdict::Drop(_) | Verdict::Fault)
    }
}

/// Most packets [`NetworkFunction::handle_group`] gets at once: a longer Packet Buffer is
/// handed over in chunks of this many.
pub const GROUP_CHUNK: usize = 32;

/// How much memory one tenant's state needs (the answer of `buffet_mem_register`).
///
/// The Memory Manager rounds it up to whole pages and places the tenant's region,
/// guarded on both sides, in its arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySpec {
    /// Bytes of the tenant's region.
    pub bytes: usize,
}

impl MemorySpec {
    /// Exactly enough for one value of `S`.
    pub const fn of<S>() -> Self {
        MemorySpec {
            bytes: std::mem::size_of::<S>(),
        }
    }

    /// Room for `S` plus `extra` bytes of tables the state sizes at `init`.
    pub const fn with_extra<S>(extra: usize) -> Self {
        MemorySpec {
            bytes: std::mem::size_of::<S>() + extra,
        }
    }
}

/// Why a tenant's state could not be built from its policy.
///
/// Returned by [`NetworkFunction::init`]; the framework rejects the tenant with this
/// message and leaves every other tenant untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitError {
    /// A policy field has a value the NF cannot use.
    #[error("invalid policy field `{field}`: {message}")]
    InvalidPolicy {
        /// The field's name, as written in the policy (e.g. `rules[2].src_ip`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The policy needs more memory than the NF registered for a tenant.
    #[error("policy needs {needed} bytes of tenant memory but the region has {available}")]
    OutOfMemory {
        /// Bytes the policy needs.
        needed: usize,
        /// Bytes the tenant's region has.
        available: usize,
    },
}

impl InitError {
    /// Shorthand for [`InitError::InvalidPolicy`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        InitError::InvalidPolicy {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Why a worker thread could not be prepared for an NF
/// ([`NetworkFunction::prepare_worker_thread`]); the worker is not launched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WorkerThreadError(pub String);

/// A multi-tenant network function: the paper's three functions.
///
/// The framework calls [`register`](Self::register) once, [`init`](Self::init) once per
/// admitted tenant, and [`handle`](Self::handle) for every packet of that tenant, always on the
/// worker core the tenant is assigned to, with that tenant's state only.
pub trait NetworkFunction: Send + Sync + 'static {
    /// One tenant's state; lives in the tenant's region of the Memory Manager.
    type State: Default + Send + 'static;
    /// One tenant's configuration (TOML/JSON via serde).
    type Policy: DeserializeOwned;

    /// A short, stable name (`monitor`, `firewall`, …).
    fn name(&self) -> &'static str;

    /// `buffet_mem_register`: how much memory one tenant's state needs.
    fn register(&self) -> MemorySpec;

    /// `buffet_state_init`: build one tenant's state from its policy.
    ///
    /// On error the tenant is not admitted and `state` is discarded.
    fn init(&self, policy: &Self::Policy, state: &mut Self::State) -> Result<(), InitError>;

    /// `buffet_state_init` as the framework calls it: `state` already sits in the
    /// tenant's region and `region` is the rest of that region — the bytes past `State`,
    /// zero-filled, exclusively this tenant's. NFs whose per-tenant state is (partly)
    /// untyped memory — C NFs, eBPF programs — build it there and may keep a handle to it
    /// in `State`; the bytes stay in place for the tenant's lifetime and are reachable
    /// only while the framework runs this tenant's code.
    ///
    /// Default: ignores `region` and calls [`init`](Self::init).
    fn init_in_region(
        &self,
        policy: &Self::Policy,
        state: &mut Self::State,
        region: &mut [u8],
    ) -> Result<(), InitError> {
        let _ = region;
        self.init(policy, state)
    }

    /// `buffet_pkt_handler`: process one packet of the tenant owning `state`.
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut Self::State) -> Verdict;

    /// `true` for an NF that keeps the default [`handle_group`](Self::handle_group): the
    /// worker then calls [`handle`](Self::handle) on each packet as soon as it is parsed
    /// and records its verdict at once, instead of staging a chunk of parsed packets and
    /// their verdicts for one `handle_group` call (the same decisions, fewer
    /// instructions per packet). Leave it `false` (the default) in an NF that overrides
    /// `handle_group`: with `true` the worker never calls that override.
    const PER_PACKET: bool = false;

    /// The batch form: process `pkts` — consecutive packets of one tenant's Packet Buffer,
    /// in arrival order, at most [`GROUP_CHUNK`] at a time — writing `verdicts[i]` for
    /// `pkts[i]` (`verdicts.len() == pkts.len()`). The worker calls this, once per chunk,
    /// inside the tenant's isolation domain.
    ///
    /// A [`Verdict::Fault`] at `i` ends the group: packets after `i` are not handled and
    /// the tenant is quarantined. The worker fills `verdicts` with `Verdict::Fault` before
    /// the call, so a handler that panics at packet `k` leaves the verdicts of `0..k` in
    /// place and the rest quarantined.
    ///
    /// Default: [`handle`](Self::handle) for each packet, in order, stopping after a
    /// fault. NFs override it to pay a per-call cost once per chunk — C NFs enter their
    /// fault-containment shim once for the whole chunk.
    #[inline]
    fn handle_group(
        &self,
        pkts: &mut [Packet<'_>],
        state: &mut Self::State,
        verdicts: &mut [Verdict],
    ) {
        for (pkt, v) in pkts.iter_mut().zip(verdicts.iter_mut()) {
            *v = self.handle(pkt, state);
            if *v == Verdict::Fault {
                break;
            }
        }
    }

    /// Called once on each worker thread, on that thread, before the first packet it
    /// hands this NF: where an NF confines the threads that run its code (a C NF at the
    /// `mpk` level installs its seccomp filter and NF stack here). An error stops that
    /// worker's launch with the error. Default: nothing.
    fn prepare_worker_thread(&self) -> Result<(), WorkerThreadError> {
        Ok(())
    }

    /// Why this tenant's last [`Verdict::Fault`] happened, in words (an eBPF program's
    /// cost over its budget, with both figures), appended to the fault event the worker
    /// raises. Called once per fault, on the control side, after the tenant was
    /// quarantined; it must only read `state`, never run tenant code. Default: none.
    fn fault_reason(&self, state: &Self::State) -> Option<String> {
        let _ = state;
        None
    }

    /// Named counters summarising one tenant's state, for stats output (replay's stats
    /// JSON, the daemon's per-tenant stats). Called off the hot path. Default: none.
    fn summary(&self, state: &Self::State) -> Vec<(&'static str, u64)> {
        let _ = state;
        Vec::new()
    }

    /// [`summary`](Self::summary) for a tenant a fault quarantined: only the counters
    /// that can be read from `state` without running tenant code (as
    /// [`fault_reason`](Self::fault_reason)); stats output then has them instead of
    /// none (a chain: each stage's packets, verdicts and faults). Called off the hot
    /// path. Default: none.
    fn quarantined_summary(&self, state: &Self::State) -> Vec<(&'static str, u64)> {
        let _ = state;
        Vec::new()
    }
}
