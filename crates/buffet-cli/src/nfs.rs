//! NF selection by name (`--nf`).

use clap::ValueEnum;

/// The NFs `replay` can run (see docs/nfs.md for each one's policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NfName {
    /// Per-flow statistics.
    Monitor,
    /// Ordered per-tenant ACL with optional connection tracking.
    Firewall,
    /// Content signatures (Aho-Corasick); alert or block.
    Ids,
    /// ESP tunnel-mode gateway, AES-256-GCM.
    Ipsec,
    /// HTTP Host blacklist.
    Dpi,
    /// Swap MACs and send back.
    Macswap,
    /// Per-tenant token bucket.
    Policer,
    /// Forward by destination MAC.
    L2fwd,
    /// Forward by 5-tuple.
    Flowfwd,
}

/// Runs `$body` with `$nf` bound to a default instance of the named NF.
#[macro_export]
macro_rules! with_nf {
    ($name:expr, |$nf:ident| $body:expr) => {
        match $name {
            $crate::nfs::NfName::Monitor => {
                let $nf = buffet_nfs::Monitor::default();
                $body
            }
            $crate::nfs::NfName::Firewall => {
                let $nf = buffet_nfs::Firewall::default();
                $body
            }
            $crate::nfs::NfName::Ids => {
                let $nf = buffet_nfs::Ids::default();
                $body
            }
            $crate::nfs::NfName::Ipsec => {
                let $nf = buffet_nfs::Ipsec::default();
                $body
            }
            $crate::nfs::NfName::Dpi => {
                let $nf = buffet_nfs::Dpi::default();
                $body
            }
            $crate::nfs::NfName::Macswap => {
                let $nf = buffet_nfs::MacSwap;
                $body
            }
            $crate::nfs::NfName::Policer => {
                let $nf = buffet_nfs::Policer;
                $body
            }
            $crate::nfs::NfName::L2fwd => {
                let $nf = buffet_nfs::L2Fwd::default();
                $body
            }
            $crate::nfs::NfName::Flowfwd => {
                let $nf = buffet_nfs::FlowFwd::default();
                $body
            }
        }
    };
}
