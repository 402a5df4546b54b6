//! The subcommands of `buffet`, one module each; [`run`] is what `demo` and `replay`
//! share (admission, driving a pipeline, printing its report).

pub mod demo;
pub mod nf;
pub mod replay;
pub mod run;
pub mod trace;
