//! The Buffet NF SDK: everything a network-function author depends on.
//!
//! An NF is three functions, the Buffet paper's `buffet_mem_register`,
//! `buffet_state_init` and `buffet_pkt_handler`, written here as the
//! [`NetworkFunction`] trait:
//!
//! * [`NetworkFunction::register`] says how much memory one tenant's state needs
//!   ([`MemorySpec`]); the Memory Manager carves that tenant's region from its arena.
//! * [`NetworkFunction::init`] builds one tenant's state from that tenant's policy
//!   (rules, keys, signatures — any `serde` type).
//! * [`NetworkFunction::handle`] processes one [`Packet`] against one tenant's state and
//!   returns a [`Verdict`]. It sees exactly one tenant's state: it cannot name another.
//!
//! [`policy`] parses the values policies are written in (IP prefixes, port ranges, MAC
//! addresses, IP protocols) with one error type, so every NF reads them the same way.
//! [`tss`] is a tuple-space search (masked-key rules, best entry wins, allocation-free
//! lookups) for NFs that classify packets against many rules.
//!
//! What this crate does not do: no threads, no I/O, no clock, no `unsafe`. Packet
//! parsing goes through etherparse header slices; every accessor of [`Packet`] is
//! total (returns `Option`/`Result`, never panics) on any input bytes.
//!
//! # A tiny NF
//!
//! ```
//! use buffet_sdk::{InitError, MemorySpec, NetworkFunction, Packet, Verdict, DropCause};
//! use serde::Deserialize;
//!
//! /// Counts packets per tenant and drops UDP to one port.
//! struct PortBlock;
//!
//! #[derive(Deserialize)]
//! struct Policy { blocked_port: u16 }
//!
//! #[derive(Default)]
//! struct State { blocked_port: u16, seen: u64, dropped: u64 }
//!
//! impl NetworkFunction for PortBlock {
//!     type State = State;
//!     type Policy = Policy;
//!     fn name(&self) -> &'static str { "portblock" }
//!     fn register(&self) -> MemorySpec { MemorySpec::of::<State>() }
//!     fn init(&self, policy: &Policy, state: &mut State) -> Result<(), InitError> {
//!         if policy.blocked_port == 0 {
//!             return Err(InitError::invalid("blocked_port", "must not be 0"));
//!         }
//!         state.blocked_port = policy.blocked_port;
//!         Ok(())
//!     }
//!     fn handle(&self, pkt: &mut Packet<'_>, state: &mut State) -> Verdict {
//!         state.seen += 1;
//!         match pkt.udp() {
//!             Some(udp) if udp.destination_port() == state.blocked_port => {
//!                 state.dropped += 1;
//!                 Verdict::Drop(DropCause::Policy)
//!             }
//!             _ => Verdict::Pass,
//!         }
//!     }
//! }
//!
//! // Drive it by hand: build a real UDP packet and hand it to the handler.
//! let mut bytes = Vec::new();
//! etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
//!     .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
//!     .udp(1234, 53)
//!     .write(&mut bytes, b"query")
//!     .unwrap();
//! let nf = PortBlock;
//! let mut state = State::default();
//! nf.init(&Policy { blocked_port: 53 }, &mut state).unwrap();
//! let mut pkt = Packet::parse(&mut bytes, Default::default()).unwrap();
//! assert_eq!(nf.handle(&mut pkt, &mut state), Verdict::Drop(DropCause::Policy));
//! assert_eq!(state.seen, 1);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod http;
mod nf;
mod packet;
pub mod policy;
pub mod registry;
pub mod tss;

pub use nf::{
    DropCause, InitError, MemorySpec, NetworkFunction, PortId, TenantId, TenantSlot, Verdict,
    WorkerThreadError, GROUP_CHUNK,
};
pub use packet::{
    FlowKey, L3Kind, L4Kind, Layout, Packet, PacketMeta, ParseError, ResizeError, SctpHeaderSlice,
    SCTP_HEADER_LEN,
};
pub use registry::{RegistryError, TenantRegistry};

/// Re-export of the header-slice library the [`Packet`] view is built on, so NFs name
/// the same types without a second dependency.
pub use etherparse;
