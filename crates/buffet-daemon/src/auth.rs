//! Bearer tokens: one admin token (every request) and tenant-scoped tokens (reads of
//! their own tenant only). The code lives in `buffet_config::auth`, shared with
//! buffet-orchestrator's API; this module names it where the daemon has always found it.
//! Which route needs which principal is [`crate::api`]'s decision.

pub use buffet_config::auth::*;
