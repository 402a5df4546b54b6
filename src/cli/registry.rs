//! The NFs `--nf` can name: the reference NFs of buffet-nfs, and the Rust NFs an author
//! registers by name before the command runs ([`Registry::add`], usually through
//! [`main_with`](super::main_with) or [`nf_main!`](crate::nf_main)).
//!
//! An NF is selected by name at run time but must reach the pipeline as its concrete
//! type (the data plane is generic over the NF; nothing is dispatched dynamically per
//! packet). A registered NF is therefore stored as a constructor behind a small
//! object-safe trait whose one method hands the NF, as its own type, to the visitor of
//! the command being run (`replay`, `demo`) — the same [`NfVisitor`] that the built-in
//! NFs are handed to by [`LoadedNf::visit`](buffet_config::LoadedNf::visit).
//!
//! A registered NF is also a stage name of a tenants file's chains
//! (`[[tenant.chain]] nf = "my-nf"`): the command parses the file inside
//! [`with_registered_names`](buffet_config::registry::with_registered_names) with
//! [`Registry::registered_names`], and the registry builds the stage NF for the
//! [`Chain`] ([`RegisteredStages`]).
//!
//! This module does not load C or eBPF objects (`--nf-lib`, `--nf-ebpf` do that) and
//! decides nothing about isolation.

use std::fmt;

use buffet_config::chain::{Chain, RegisteredStages, DEFAULT_KEY};
use buffet_config::registry::{registrable_name, NfName, NfVisitor, RegisteredNf};

use super::{chain, demo, live, replay};

/// Why a name could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The name is empty or holds characters other than `a-z`, `0-9`, `-` and `_`.
    #[error("cannot register NF {0:?}: a name is lower-case letters, digits, '-' and '_'")]
    BadName(String),
    /// A reference NF or an earlier registration has the name.
    #[error("cannot register NF {0:?}: the name is taken")]
    Taken(String),
    /// The name a chain gives the run's default NF (`default`).
    #[error("cannot register NF {0:?}: the name is reserved for the run's default chain stage")]
    Reserved(String),
}

/// What `--nf NAME` selected.
pub(crate) enum Selected {
    /// A reference NF.
    Reference(NfName),
    /// A registered NF, built.
    Registered(Box<dyn ErasedNf>),
}

/// The command a registered NF is handed to.
pub(crate) enum Visit<'a> {
    Replay(Box<replay::Replay<'a>>),
    Demo(demo::Demo<'a>),
    Live(Box<live::Live<'a>>),
    /// A command whose tenants name chains: the registered NF becomes their default stage.
    Chained(Box<chain::Chained<'a, Visit<'a>>>),
}

impl NfVisitor for Visit<'_> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        match self {
            Visit::Replay(r) => (*r).visit(nf),
            Visit::Demo(d) => d.visit(nf),
            Visit::Live(l) => (*l).visit(nf),
            Visit::Chained(c) => (*c).visit(nf),
        }
    }
}

/// A registered NF, built, without its type in the signature.
pub(crate) trait ErasedNf {
    /// Hands the NF, as its own type, to the command.
    fn run(self: Box<Self>, visit: Visit<'_>) -> anyhow::Result<()>;
    /// Adds the NF to `chain` under `key`, as a stage NF.
    fn into_stage(self: Box<Self>, key: &str, chain: Chain) -> Chain;
}

struct Typed<N>(N);

impl<N: RegisteredNf> ErasedNf for Typed<N> {
    fn run(self: Box<Self>, visit: Visit<'_>) -> anyhow::Result<()> {
        visit.visit(self.0)
    }

    fn into_stage(self: Box<Self>, key: &str, chain: Chain) -> Chain {
        chain.with_nf(key, self.0)
    }
}

type Make = Box<dyn Fn() -> Box<dyn ErasedNf> + Send + Sync>;

/// The NFs `--nf` accepts: the reference NFs, then the registered ones.
#[derive(Default)]
pub struct Registry {
    added: Vec<(String, Make)>,
    errors: Vec<RegisterError>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field(
                "added",
                &self.added.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("errors", &self.errors)
            .finish()
    }
}

impl Registry {
    /// Only the reference NFs.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers `N` under `name`; each run builds it with `N::default()`.
    ///
    /// A name that is invalid or taken is not registered; the command then stops with
    /// that error before doing anything (see [`errors`](Self::errors)).
    pub fn add<N: RegisteredNf + Default>(&mut self, name: &str) -> &mut Registry {
        self.add_with(name, N::default)
    }

    /// Registers the NF `make` builds under `name` (for an NF without `Default`, or
    /// configured by the program that registers it). `make` is `Send + Sync` so that a
    /// registry can move into the data plane's starter of an embedded buffetd.
    pub fn add_with<N, F>(&mut self, name: &str, make: F) -> &mut Registry
    where
        N: RegisteredNf,
        F: Fn() -> N + Send + Sync + 'static,
    {
        if name == DEFAULT_KEY {
            self.errors.push(RegisterError::Reserved(name.to_owned()));
        } else if !registrable_name(name) {
            self.errors.push(RegisterError::BadName(name.to_owned()));
        } else if self.names().iter().any(|n| n == name) {
            self.errors.push(RegisterError::Taken(name.to_owned()));
        } else {
            self.added.push((
                name.to_owned(),
                Box::new(move || Box::new(Typed(make())) as Box<dyn ErasedNf>),
            ));
        }
        self
    }

    /// Every name `--nf` accepts, reference NFs first.
    pub fn names(&self) -> Vec<String> {
        NfName::ALL
            .iter()
            .map(|n| n.name().to_owned())
            .chain(self.added.iter().map(|(n, _)| n.clone()))
            .collect()
    }

    /// The registrations that were refused.
    pub fn errors(&self) -> &[RegisterError] {
        &self.errors
    }

    /// The registered NFs' names (not the reference NFs'), in order of registration: what
    /// a tenants file's stages may name besides the reference NFs.
    pub fn registered_names(&self) -> Vec<String> {
        self.added.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Whether `name` is a registered (not a reference) NF.
    pub fn is_registered(&self, name: &str) -> bool {
        self.added.iter().any(|(n, _)| n == name)
    }

    /// Builds the NF `name` selects.
    pub(crate) fn select(&self, name: &str) -> Option<Selected> {
        if let Ok(n) = name.parse::<NfName>() {
            return Some(Selected::Reference(n));
        }
        self.added
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, make)| Selected::Registered(make()))
    }
}

impl RegisteredStages for Registry {
    fn registered_names(&self) -> Vec<String> {
        Registry::registered_names(self)
    }

    fn add_stage(&self, name: &str, chain: Chain) -> Result<Chain, Chain> {
        match self.added.iter().find(|(n, _)| n == name) {
            Some((_, make)) => Ok(make().into_stage(name, chain)),
            None => Err(chain),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_listed_after_the_reference_nfs() {
        let mut r = Registry::new();
        r.add::<buffet_nfs::Monitor>("my-monitor")
            .add::<buffet_nfs::Monitor>("monitor")
            .add::<buffet_nfs::Monitor>("my-monitor")
            .add::<buffet_nfs::Monitor>("Bad Name")
            .add::<buffet_nfs::Monitor>("")
            .add::<buffet_nfs::Monitor>("default");
        assert_eq!(r.names().last().unwrap(), "my-monitor");
        assert_eq!(r.names().len(), NfName::ALL.len() + 1);
        assert_eq!(
            r.errors(),
            [
                RegisterError::Taken("monitor".into()),
                RegisterError::Taken("my-monitor".into()),
                RegisterError::BadName("Bad Name".into()),
                RegisterError::BadName(String::new()),
                RegisterError::Reserved("default".into()),
            ]
        );
        assert_eq!(r.registered_names(), ["my-monitor"]);
        assert!(r.is_registered("my-monitor") && !r.is_registered("monitor"));
        assert!(matches!(
            r.select("firewall"),
            Some(Selected::Reference(NfName::Firewall))
        ));
        assert!(matches!(
            r.select("my-monitor"),
            Some(Selected::Registered(_))
        ));
        assert!(r.select("nope").is_none());
        // As a chain's stage NF: added under its name; an unknown name gives the chain back.
        let chain = r.add_stage("my-monitor", Chain::new()).ok().unwrap();
        assert_eq!(chain.keys().collect::<Vec<_>>(), ["my-monitor"]);
        assert!(r.add_stage("nope", chain).is_err());
    }
}
