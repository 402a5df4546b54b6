//! `buffet`: the command line ([`buffet::cli`] does the work).
//!
//! Offline commands, no daemon needed:
//! * `buffet demo` — synthetic multi-tenant traffic through the whole pipeline;
//! * `buffet replay` — a pcap through the same pipeline with a tenants file;
//! * `buffet trace` — the timeslot scheduler alone over a `ts_ns,tenant_id` trace;
//! * `buffet nf check file.o` — verify an eBPF NF and print the verifier's verdict.
//!
//! An NF author's binary is the same command with their NF registered:
//! [`buffet::cli::main_with`] or [`buffet::nf_main!`].
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    buffet::cli::main()
}
