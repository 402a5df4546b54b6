//! The API's HTTP/1.1 server loop, shared with the Orchestrator: it lives in
//! [`buffet_orchestrator::serve`] (connection limit, deadline for the request head,
//! lingering close, bounded drain on shutdown); the request timeout of
//! [`crate::api::router`] starts only once the head is read.

pub use buffet_orchestrator::serve::{serve, ConnSetup, DRAIN, LINGER, LINGER_BYTES};
