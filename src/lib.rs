//! Buffet: one network-function process serving thousands of tenants, isolated and fast.
//!
//! This facade re-exports the workspace's crates under one name:
//! [`sdk`] (what NF authors implement), [`memory`] (Memory Manager), [`dispatch`]
//! (Packet Dispatcher), [`worker`] (Worker Pool), [`io`] (ports: pcap, traffic
//! generator, AF_PACKET), [`nfs`] (reference NFs), [`cnf`] (C NFs under MPK), [`ebpf`]
//! (verified eBPF NFs), [`config`] (tenants files, NF registry, isolation resolution,
//! trace runner).
//!
//! [`cli`] is the `buffet` command line (`buffet demo`, `buffet replay`, `buffet run`,
//! `buffet trace`, `buffet nf check`) as a library: the `buffet` binary calls
//! [`cli::main`], and an NF author's binary calls [`cli::main_with`] (or [`nf_main!`])
//! to be the same command with their own NF selectable by `--nf` (docs/nf-authors.md).
#![forbid(unsafe_code)]

pub mod cli;

pub use buffet_cnf as cnf;
pub use buffet_config as config;
pub use buffet_dispatch as dispatch;
pub use buffet_ebpf as ebpf;
pub use buffet_io as io;
pub use buffet_memory as memory;
pub use buffet_nfs as nfs;
pub use buffet_sdk as sdk;
pub use buffet_worker as worker;
