//! Configuration as a library: what the `buffet` command and the daemon share.
//!
//! * [`tenants`] — the tenants file, in TOML or JSON with the same fields and the same
//!   validation: ids, names, classifier rules, MAX_NB, the isolation level a tenant asks
//!   for and its NF policy, carried in a format-neutral [`Policy`] that
//!   any NF's `Policy: DeserializeOwned` is built from;
//! * [`chain`] — per-tenant service chains: a [`Chain`] is the NF that runs each tenant's
//!   own stages (reference, C or eBPF NFs, each with its policy and `when` guard) to
//!   completion, with per-stage counters;
//! * [`isolation`] — the isolation levels (safe, mpk, trusted-native, ebpf), which level a run uses and
//!   which kinds of NF each level accepts, and the Memory Manager domain it maps to;
//! * [`registry`] — naming an NF ([`NfSpec`]: a reference NF, a C
//!   shared object, an eBPF object and its engine), loading it, and running one generic
//!   function over whichever NF it is ([`NfVisitor`]);
//! * [`auth`] — bearer tokens (admin and tenant-scoped), kept hashed and compared in
//!   constant time: buffetd's and buffet-orchestrator's APIs both use it;
//! * [`trace`] — the timeslot scheduler alone over a `ts_ns,tenant_id` trace, the
//!   yardstick every scheduler implementation is checked against.
//!
//! It does not build or drive a pipeline, open ports, parse command lines or print
//! reports: those belong to the binaries. Apart from loading an NF object and probing
//! for protection keys, nothing here has side effects; parsing never touches the data
//! plane.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
pub mod chain;
pub mod isolation;
pub mod registry;
pub mod tenants;
pub mod trace;

pub use chain::{Chain, ChainError, ChainPolicy, ChainState};
pub use isolation::{Isolation, IsolationError};
pub use registry::{LoadedNf, NfSpec, NfVisitor, RegisteredNf, RegistryError};
pub use tenants::{Policy, TenantConfig, TenantsError};
