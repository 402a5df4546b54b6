//! `buffetd`: the provider's daemon (see crates/buffet-daemon and docs/daemon.md).

fn main() -> std::process::ExitCode {
    buffet_daemon::main()
}
