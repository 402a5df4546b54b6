//! The Worker Pool: the data plane that runs an NF for many tenants.
//!
//! [`build`] returns a [`Control`] handle (`Send + Sync`, for any thread) and a
//! [`Dataplane`] (the software Packet Dispatcher, the worker rings and the ports), which
//! applies the handle's [`Command`]s between bursts; [`Pipeline`] drives both from one
//! thread. Workers run one thread each, pinned to cores and fed by single-producer rings (or,
//! when the Packet Dispatcher runs in the NIC path, each by its own [`WorkerSource`]: its
//! AF_XDP socket; see [`build_with_sources`]). Each worker
//! pops a burst, groups it by tenant into Packet Buffers (a stable in-place sort, no
//! allocation), loads each tenant's state from the Memory Manager once per group, runs
//! the NF over the group, and hands the packets back with their verdicts, a batch at a
//! time through its completion ring. With
//! [`PipelineConfig::flush_packets`] set, the Packet Buffers persist across bursts
//! instead (one preallocated slab per worker): a tenant's group runs when its buffer is
//! full or its oldest packet reached the latency bound, and ready buffers are served by
//! weighted deficit round robin charged in the cycles of NF work.
//!
//! What it guarantees:
//! * tenant-level affinity — a tenant's packets run on the worker the dispatcher chose;
//!   during a migration the tenant's state lock keeps two workers from touching it at once;
//! * nothing allocated or locked per packet (packets are [`PacketBuf`]s from a
//!   preallocated pool or a port's own memory, moved between threads, never copied);
//! * fault containment — a panicking handler quarantines its tenant only: that tenant's
//!   packets are dropped and counted, an event is raised, every other tenant carries on;
//! * per-tenant accounting: packets, bytes, passes, drops by reason, CPU cycles;
//! * workers can be launched and terminated at run time; a terminated worker's tenants
//!   are reassigned and the packets already queued to it are still processed.
//!
//! What it does not do: read packets from a NIC (that is buffet-io's Port) or decide
//! placement (that is buffet-dispatch's scheduler).
#![deny(unsafe_code)]

mod buffers;
mod completions;
mod idle;
mod pipeline;
mod stats;
#[allow(unsafe_code)]
mod sys;
mod worker;

pub use buffers::{BufferConfig, ClockSource, VirtualClock};
pub use buffet_io::{Outcome, PacketBuf, FRAME_CAPACITY};
pub use completions::Completions;
pub use idle::{DEFAULT_IDLE_WAIT, IDLE_AFTER};
pub use pipeline::{
    build, build_with_sources, Command, Control, Dataplane, Pipeline, PipelineConfig,
    PipelineError, Polled, TenantSpec, WorkerEvent, EVENTS_KEPT, EVENT_CAPACITY, MIN_STALL,
    QUARANTINE_BACKOFF,
};
pub use stats::{DropReason, GlobalReport, Report, TenantReport, WorkerReport};
pub use worker::{Worker, WorkerSource};
