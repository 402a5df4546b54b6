//! Untrusted network functions as eBPF: C compiled with `clang -target bpf`, verified by
//! PREVAIL, run by rbpf against one packet and one tenant's region.
//!
//! The path of a program, and the module that owns each step:
//!
//! 1. [`elf`] reads the clang object, finds the program section (`buffet` by default),
//!    appends the code its bpf-to-bpf calls reach, and turns map references into the
//!    map indices the verifier and the helpers use. Global data is refused.
//! 2. [`verify`] runs PREVAIL with a platform description of Buffet's context (packet,
//!    packet end, tenant region and its size), termination checking on, in a child
//!    process within a time and a memory budget, verdicts cached by SHA-256; then rejects comparisons
//!    that could reveal a host address (a program never observes one). A rejection
//!    carries the verifier's message.
//! 3. [`Program`] lays out the tenant region (context, 16 counters, maps), builds the
//!    rbpf VM (`EbpfVmMbuff`: the packet is `mem`, the tenant region is `mbuff`) with the
//!    [helpers](abi::helper), and optionally JIT-compiles it. One program is shared by all
//!    tenants.
//! 4. [`EbpfNf`] is the [`NetworkFunction`](buffet_sdk::NetworkFunction): `State` is the
//!    tenant's region ([`EbpfState`]), `Policy` ([`EbpfPolicy`]) the initial contents of
//!    its maps (and optionally a program of its own). The return value is the verdict
//!    ([`abi::verdict_of`]); a run-time error, an unknown return value or a packet over
//!    the tenant's cost budget (instructions metered by both engines plus helper work,
//!    policy `cost_budget`) is [`Verdict::Fault`](buffet_sdk::Verdict::Fault), which
//!    quarantines that tenant only.
//!
//! The ABI (context layout, return values, map types, helpers) is written down in
//! `include/buffet_ebpf.h` and `docs/ebpf.md`.
//!
//! What this crate does not do: load programs into the kernel, BTF-defined maps, global
//! variables, tail calls, atomics, packet resizing, or more than one level of bpf-to-bpf
//! calls. The JIT is rbpf's x86-64 JIT with Buffet's patches (`third_party/rbpf`); on other
//! architectures only the interpreter runs.
//!
//! All `unsafe` code is in the private `sys` module.
#![deny(unsafe_code)]

pub mod abi;
pub mod elf;
mod helpers;
mod nf;
mod program;
#[allow(unsafe_code)]
mod sys;
pub mod verify;

pub use helpers::csum_update;
pub use nf::{EbpfFault, EbpfFileError, EbpfNf, EbpfPolicy, EbpfState, MapInit};
pub use program::{
    check, CheckReport, Engine, GroupRun, LoadOptions, Program, ProgramError, RunError,
    DEFAULT_COST_BUDGET, MAX_REGION_BYTES, MAX_STRSET_KEY,
};
