//! Buffet's reference network functions, each an ordinary implementation of
//! [`buffet_sdk::NetworkFunction`], and each with a single-tenant variant (same logic,
//! state in a plain struct, no framework tables) used as the benchmark baseline.
//!
//! * [`monitor`] — per-flow statistics in a fixed-capacity per-tenant table.
//! * [`firewall`] — ordered per-tenant ACL (tuple-space search) with connection tracking.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod firewall;
pub mod monitor;

pub use firewall::Firewall;
pub use monitor::Monitor;
