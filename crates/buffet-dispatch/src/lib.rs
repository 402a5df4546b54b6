//! The Buffet Packet Dispatcher, sans-IO.
//!
//! What it does: given a frame and its arrival time, decide which tenant the frame
//! belongs to ([`classifier`]), whether that tenant is over its per-timeslot budget and
//! which worker core gets it ([`scheduler`], the Buffet paper's Algorithm 1 as specified
//! in docs/scheduler.md), and optionally tag the tenant into the DSCP
//! bits so the worker need not classify again ([`tagging`]). [`Dispatcher`] ties the
//! three together and returns a small `Copy` [`Decision`] per frame; migrations and
//! overload reports accumulate as [`Event`]s for the control plane.
//!
//! What it does not do: it never reads a clock (time is the `ts_ns` argument), never
//! spawns a thread, never touches a socket or a queue, and contains no `unsafe`. Moving
//! the frame to the chosen worker is the caller's business. The same semantics are
//! mirrored by the C core, the XDP program and the Micro-C plugin; the trace vectors in
//! `buffet-config`'s `trace` module are the common yardstick.
//!
//! # Example
//!
//! ```
//! use buffet_dispatch::{Decision, Dispatcher, DispatcherConfig, Match, TenantSlot};
//!
//! let mut d = Dispatcher::new(DispatcherConfig::default());
//! let w0 = d.add_worker(1_000_000); // packets per timeslot
//! let web = Match {
//!     protocol: Some(6),
//!     dst_ip: Some("10.0.0.0/24".parse()?),
//!     dst_port: Some("80".parse()?),
//!     ..Match::default()
//! };
//! d.admit(TenantSlot(0), vec![(10, web)], 0)?;
//!
//! let mut frame = Vec::new();
//! etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
//!     .ipv4([192, 0, 2, 1], [10, 0, 0, 2], 64)
//!     .tcp(5555, 80, 1, 1024)
//!     .write(&mut frame, b"GET /")?;
//! let decision = d.dispatch(/* ts_ns */ 0, /* in_port */ 0, &mut frame);
//! assert_eq!(decision, Decision::Pass { worker: w0, tenant: TenantSlot(0) });
//! assert_eq!(d.drain_events().count(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Hot paths ([`Dispatcher::dispatch`], [`Dispatcher::schedule_tagged`],
//! [`Classifier::classify`], [`Scheduler::schedule`]) do not allocate (the event buffer
//! is reused and bounded) and do not panic on any input bytes.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod classifier;
mod dispatcher;
pub mod scheduler;
pub mod sim;
pub mod tagging;

pub use buffet_sdk::{TenantId, TenantSlot};

pub use classifier::{
    Classifier, IpPrefix, Match, PacketFields, PortRange, Rule, RuleError, RuleHandle,
};
pub use dispatcher::{
    Decision, DispatchDrop, DispatchError, DispatchStats, Dispatcher, DispatcherConfig, Event,
    TagMode, UnmatchedPolicy, MAX_PENDING_EVENTS,
};
pub use scheduler::{
    BurstOutcome, OverloadReport, Planner, SchedOutcome, Scheduler, SchedulerConfig, TenantError,
    TenantRow, WorkerError, WorkerRow,
};
pub use tagging::{read_dscp, tag_dscp, TagError};

use std::fmt;

/// A worker (one core). Ids are dense, handed out by [`Scheduler::add_worker`] in order
/// from 0 and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u16);

impl WorkerId {
    /// The id as a `usize` index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", self.0)
    }
}
