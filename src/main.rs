//! The `buffet` binary; everything lives in buffet-cli.

fn main() -> std::process::ExitCode {
    buffet_cli::main()
}
