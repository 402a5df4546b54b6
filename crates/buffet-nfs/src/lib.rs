//! Buffet's reference network functions, each an ordinary implementation of
//! [`buffet_sdk::NetworkFunction`], and each with a single-tenant variant (same logic,
//! state in a plain struct, no framework tables) used as the benchmark baseline.
//!
//! * [`monitor`] — per-flow statistics in a fixed-capacity per-tenant table.
//! * [`firewall`] — ordered per-tenant ACL (tuple-space search) with connection tracking.
//! * [`ids`] — Snort-like content signatures matched with Aho-Corasick; alert or block.
//! * [`dpi`] — drops HTTP requests whose Host is on a per-tenant domain blacklist.
//! * [`macswap`] — swaps source and destination MAC and sends the frame back.
//! * [`policer`] — per-tenant token bucket (bytes or packets per second of packet time).
//! * [`l2fwd`] / [`flowfwd`] — forward by destination MAC / exact 5-tuple to an output port.
//! * [`ipsec`] — ESP tunnel-mode gateway (AES-256-GCM) with per-tenant SAs.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod dpi;
pub mod firewall;
pub mod flowfwd;
pub mod ids;
pub mod ipsec;
pub mod l2fwd;
pub mod macswap;
pub mod monitor;
pub mod policer;
#[cfg(test)]
mod test_frames;

pub use dpi::Dpi;
pub use firewall::Firewall;
pub use flowfwd::FlowFwd;
pub use ids::Ids;
pub use ipsec::Ipsec;
pub use l2fwd::L2Fwd;
pub use macswap::MacSwap;
pub use monitor::Monitor;
pub use policer::Policer;
