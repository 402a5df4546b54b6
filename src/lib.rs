//! Buffet: one network-function process serving thousands of tenants, isolated and fast.
//!
//! This facade re-exports the workspace's crates under one name:
//! [`sdk`] (what NF authors implement), [`memory`] (Memory Manager), [`dispatch`]
//! (Packet Dispatcher), [`worker`] (Worker Pool), [`io`] (pcap and traffic generator),
//! [`nfs`] (reference NFs), [`cnf`] (C NFs under MPK), [`ebpf`] (verified eBPF NFs),
//! [`config`] (tenants files, NF registry, isolation resolution, trace runner). The
//! `buffet` binary is the command line (`buffet demo`, `buffet replay`, `buffet trace`,
//! `buffet nf check`).

pub use buffet_cnf as cnf;
pub use buffet_config as config;
pub use buffet_dispatch as dispatch;
pub use buffet_ebpf as ebpf;
pub use buffet_io as io;
pub use buffet_memory as memory;
pub use buffet_nfs as nfs;
pub use buffet_sdk as sdk;
pub use buffet_worker as worker;
