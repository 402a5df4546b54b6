//! What Buffet's tests and benchmarks share. A dev-dependency only: no library crate of
//! the workspace depends on it, and it is never published.
//!
//! * [`gate`]: whether a test that needs something this machine may lack runs, skips with
//!   one line on stderr, or fails. Two kinds of need, treated differently:
//!   - a **privilege** (root, a capability, a tool such as clang): its skip becomes a
//!     failure when `BUFFET_REQUIRE_PRIVILEGED=1` (or `CI=true`), because CI provides it;
//!   - **hardware** (a CPU with `pku`, Intel MPK): its skip is never a failure by default,
//!     since no environment variable can give a CPU a feature, and becomes one only when
//!     `BUFFET_REQUIRE_PKU=1` (CI sets it when /proc/cpuinfo lists `pku`).
//! * [`alloc`]: a global allocator that counts allocations on the current thread, for the
//!   "the packet path does not allocate" tests.
//! * [`rng`]: a small seeded generator (xorshift64\*, seeded through splitmix64), so
//!   random inputs in tests and benchmarks are the same on every run.
//! * [`zipf`]: a Zipf-skewed choice of rank (tenant, flow) over that generator, for
//!   skewed multi-tenant traces.
//! * [`http`]: one request to a JSON API with a bearer token, answered as `(status, JSON)`.
//! * [`cpu`]: the CPU time a process has used (do idle threads sleep?).
//!
//! What it does not do: build NFs, frames or pipelines (each test crate keeps its own
//! fixtures), or depend on any Buffet crate — a crate's own unit tests can use it without
//! linking a second copy of that crate.
//!
//! The `unsafe` code (the allocator's `unsafe impl GlobalAlloc`, opening a
//! pseudo-terminal, setting UDP GSO on a socket) is in the private `sys` module, with a `// SAFETY:` comment on every
//! block.
#![deny(unsafe_code)]

pub mod alloc;
pub mod cpu;
pub mod gate;
pub mod http;
pub mod net;
pub mod rng;
#[allow(unsafe_code)]
mod sys;
pub mod tty;
pub mod zipf;

pub use alloc::{allocations_during, CountingAllocator};
pub use cpu::{cores_used_over, cpu_seconds};
pub use gate::{
    pku_required, privileged_required, require_mpk, require_pku, require_root, require_tool,
    skip_privileged,
};
pub use rng::Rng;
pub use zipf::Zipf;
