//! `buffet-orchestrator`: places tenants on buffetd servers through etcd (see
//! crates/buffet-orchestrator and docs/cluster.md).

fn main() -> std::process::ExitCode {
    buffet_orchestrator::main()
}
