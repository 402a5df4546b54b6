//! NF selection by name (`--nf`).

use clap::ValueEnum;

/// The NFs `replay` can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NfName {
    /// Per-flow statistics.
    Monitor,
}
