//! The NF registry: naming an NF, loading it, and running one generic function over it.
//!
//! An [`NfSpec`] names one of four kinds of NF: a reference NF of buffet-nfs by name
//! (`monitor`), a C NF as a shared object implementing `include/buffet.h` (`c:nf.so`,
//! run by buffet-cnf), an eBPF NF as a `clang -target bpf` object with the engine
//! that runs it (`ebpf:nf.o`, `ebpf+jit:nf.o`, run by buffet-ebpf), or an author's own
//! Rust NF by the name the program that runs it registered (`my-nf`). [`NfSpec::load`]
//! builds the first three ([`LoadedNf`]); [`LoadedNf::visit`] hands it, as its concrete
//! type, to an [`NfVisitor`], so that one generic function
//! (`fn run<N: RegisteredNf>(nf: N)`) serves every NF. An author's own NF implements
//! [`RegisteredNf`]; the program that registered it builds it and passes it to the same
//! visitor directly.
//!
//! A registered name is known only to the program that registered it, so
//! [`NfSpec`]'s parser accepts one only inside [`with_registered_names`] (the command
//! parses its tenants file there); everywhere else, `my-nf` is an unknown NF, with the
//! same error as any misspelt name.
//!
//! Loading a C object maps it into the process; loading an eBPF object verifies it. This
//! module decides nothing about isolation (see [`crate::isolation`]); [`NfSpec::load_at`]
//! only follows the level decided there (which faults a C NF's calls contain).

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use buffet_cnf::{CNf, Containment};
use buffet_ebpf::{EbpfNf, Engine, LoadOptions};
use buffet_nfs::{Dpi, Firewall, FlowFwd, Ids, Ipsec, L2Fwd, MacSwap, Monitor, Policer};
use buffet_sdk::NetworkFunction;

use crate::isolation::Isolation;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The reference NFs (see docs/nfs.md for each one's policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
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

impl NfName {
    /// Every reference NF.
    pub const ALL: [NfName; 9] = [
        NfName::Monitor,
        NfName::Firewall,
        NfName::Ids,
        NfName::Ipsec,
        NfName::Dpi,
        NfName::Macswap,
        NfName::Policer,
        NfName::L2fwd,
        NfName::Flowfwd,
    ];

    /// The name as written (`monitor`, `l2fwd`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            NfName::Monitor => "monitor",
            NfName::Firewall => "firewall",
            NfName::Ids => "ids",
            NfName::Ipsec => "ipsec",
            NfName::Dpi => "dpi",
            NfName::Macswap => "macswap",
            NfName::Policer => "policer",
            NfName::L2fwd => "l2fwd",
            NfName::Flowfwd => "flowfwd",
        }
    }
}

impl fmt::Display for NfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for NfName {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<NfName, RegistryError> {
        NfName::ALL
            .into_iter()
            .find(|n| n.name() == s)
            .ok_or_else(|| RegistryError::unknown(s))
    }
}

/// How an eBPF NF runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum EbpfEngine {
    /// rbpf's interpreter: every memory access also checked at run time.
    #[default]
    Interpreter,
    /// rbpf's x86-64 JIT (Buffet-patched): native code, safe as far as the verifier's proof.
    Jit,
}

impl EbpfEngine {
    /// `interpreter` or `jit`.
    pub const fn name(self) -> &'static str {
        match self {
            EbpfEngine::Interpreter => "interpreter",
            EbpfEngine::Jit => "jit",
        }
    }
}

impl From<EbpfEngine> for Engine {
    fn from(e: EbpfEngine) -> Engine {
        match e {
            EbpfEngine::Interpreter => Engine::Interpreter,
            EbpfEngine::Jit => Engine::Jit,
        }
    }
}

impl FromStr for EbpfEngine {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<EbpfEngine, RegistryError> {
        [EbpfEngine::Interpreter, EbpfEngine::Jit]
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| RegistryError::UnknownEngine(s.to_owned()))
    }
}

/// The kind of NF a spec names, which decides the isolation levels it can run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NfKind {
    /// Safe Rust: a reference NF, or an author's own registered NF.
    Reference,
    /// A C shared object.
    C,
    /// An eBPF object.
    Ebpf,
}

/// Which NF to run.
///
/// Written `monitor` (any [`NfName`]), `c:PATH` (a C shared object), `ebpf:PATH` or
/// `ebpf+ENGINE:PATH` (an eBPF object, `ENGINE` `interpreter` — the default — or `jit`),
/// or the name of an NF the running program registered (parsed only inside
/// [`with_registered_names`]). Serialized as that text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NfSpec {
    /// A reference NF of buffet-nfs, default-configured.
    Reference(NfName),
    /// A C NF: a shared object implementing `include/buffet.h`.
    C(PathBuf),
    /// An eBPF NF: a `clang -target bpf` object, verified when loaded.
    Ebpf {
        /// The object.
        path: PathBuf,
        /// How it runs.
        engine: EbpfEngine,
    },
    /// An author's own Rust NF, by the name the running program registered it under. Only
    /// that program can build it: [`NfSpec::load`] refuses it.
    Registered(String),
}

impl NfSpec {
    /// The kind of NF (a registered NF is safe Rust: [`NfKind::Reference`]).
    pub fn kind(&self) -> NfKind {
        match self {
            NfSpec::Reference(_) | NfSpec::Registered(_) => NfKind::Reference,
            NfSpec::C(_) => NfKind::C,
            NfSpec::Ebpf { .. } => NfKind::Ebpf,
        }
    }

    /// The object file, for C and eBPF NFs.
    pub fn path(&self) -> Option<&Path> {
        match self {
            NfSpec::Reference(_) | NfSpec::Registered(_) => None,
            NfSpec::C(p) | NfSpec::Ebpf { path: p, .. } => Some(p),
        }
    }

    /// Builds the NF: a reference NF's default instance, a loaded C object, or a loaded
    /// and verified eBPF object. Errors are the loaders' own, naming the file. A
    /// registered NF is refused ([`RegistryError::NotLoadable`]): the program that
    /// registered it builds it.
    pub fn load(&self) -> Result<LoadedNf, RegistryError> {
        self.load_at(Isolation::Mpk)
    }

    /// [`NfSpec::load`] for a run at `level`: a C NF at `trusted-native` has every fault
    /// of its code contained ([`Containment::AnyFault`]), at any other level only a
    /// tenant's faults ([`Containment::Guarded`]). Other NFs load the same at every level.
    pub fn load_at(&self, level: Isolation) -> Result<LoadedNf, RegistryError> {
        let containment = if level.contains_any_fault() {
            Containment::AnyFault
        } else {
            Containment::Guarded
        };
        Ok(match self {
            NfSpec::Reference(name) => match name {
                NfName::Monitor => LoadedNf::Monitor(Monitor::default()),
                NfName::Firewall => LoadedNf::Firewall(Firewall::default()),
                NfName::Ids => LoadedNf::Ids(Ids::default()),
                NfName::Ipsec => LoadedNf::Ipsec(Ipsec::default()),
                NfName::Dpi => LoadedNf::Dpi(Dpi::default()),
                NfName::Macswap => LoadedNf::Macswap(MacSwap),
                NfName::Policer => LoadedNf::Policer(Policer),
                NfName::L2fwd => LoadedNf::L2fwd(L2Fwd::default()),
                NfName::Flowfwd => LoadedNf::Flowfwd(FlowFwd::default()),
            },
            NfSpec::C(path) => LoadedNf::C(CNf::load_with(path, containment)?),
            NfSpec::Ebpf { path, engine } => {
                let opts = LoadOptions {
                    engine: (*engine).into(),
                    ..LoadOptions::default()
                };
                LoadedNf::Ebpf(EbpfNf::from_file(path, opts)?)
            }
            NfSpec::Registered(name) => return Err(RegistryError::NotLoadable(name.clone())),
        })
    }
}

impl fmt::Display for NfSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NfSpec::Reference(name) => f.write_str(name.name()),
            NfSpec::C(path) => write!(f, "c:{}", path.display()),
            NfSpec::Ebpf {
                path,
                engine: EbpfEngine::Interpreter,
            } => write!(f, "ebpf:{}", path.display()),
            NfSpec::Ebpf { path, engine } => write!(f, "ebpf+{}:{}", engine.name(), path.display()),
            NfSpec::Registered(name) => f.write_str(name),
        }
    }
}

impl FromStr for NfSpec {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<NfSpec, RegistryError> {
        let Some((kind, path)) = s.split_once(':') else {
            return match s.parse() {
                Ok(name) => Ok(NfSpec::Reference(name)),
                Err(_) if is_registered_name(s) => Ok(NfSpec::Registered(s.to_owned())),
                Err(e) => Err(e),
            };
        };
        let (kind, engine) = match kind.split_once('+') {
            Some((k, e)) => (k, Some(e.parse::<EbpfEngine>()?)),
            None => (kind, None),
        };
        let path = || {
            if path.is_empty() {
                Err(RegistryError::NoPath(s.to_owned()))
            } else {
                Ok(PathBuf::from(path))
            }
        };
        match (kind, engine) {
            ("c", None) => Ok(NfSpec::C(path()?)),
            ("ebpf", engine) => Ok(NfSpec::Ebpf {
                path: path()?,
                engine: engine.unwrap_or_default(),
            }),
            _ => Err(RegistryError::unknown(s)),
        }
    }
}

impl Serialize for NfSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NfSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NfSpec, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

thread_local! {
    /// The names [`with_registered_names`] put in scope on this thread.
    static REGISTERED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Whether `name` is in scope as a registered NF on this thread.
fn is_registered_name(name: &str) -> bool {
    REGISTERED.with(|r| r.borrow().iter().any(|n| n == name))
}

/// Whether a program may register an NF under `name`: lower-case letters, digits, `-`
/// and `_`, not empty, and not `default` (a chain's name for the run's default NF).
/// Whether a reference NF has the name already is the registry's own check.
pub fn registrable_name(name: &str) -> bool {
    !name.is_empty()
        && name != crate::chain::DEFAULT_KEY
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Runs `f` with `names` — the NFs the running program registered — accepted by
/// [`NfSpec`]'s parser as [`NfSpec::Registered`] (a tenants file's
/// `[[tenant.chain]] nf = "my-nf"`). Outside, and for any other name, the parser answers
/// as always: unknown NF. Scopes nest; the previous names come back when `f` returns or
/// panics. Only the calling thread is affected.
pub fn with_registered_names<R>(names: &[String], f: impl FnOnce() -> R) -> R {
    struct Restore(Vec<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = std::mem::take(&mut self.0);
            REGISTERED.with(|r| *r.borrow_mut() = old);
        }
    }
    let old = REGISTERED.with(|r| std::mem::replace(&mut *r.borrow_mut(), names.to_vec()));
    let _restore = Restore(old);
    f()
}

/// An NF that can be named in a configuration and run by any [`NfVisitor`]: a
/// [`NetworkFunction`] that may also report the faults it contained.
pub trait RegisteredNf: NetworkFunction {
    /// The faults contained so far, one line each (for C and eBPF NFs: a tenant's code
    /// that faulted and was quarantined). Default: none.
    fn contained_faults(&self) -> Vec<String> {
        Vec::new()
    }
}

impl RegisteredNf for Monitor {}
impl RegisteredNf for Firewall {}
impl RegisteredNf for Ids {}
impl RegisteredNf for Ipsec {}
impl RegisteredNf for Dpi {}
impl RegisteredNf for MacSwap {}
impl RegisteredNf for Policer {}
impl RegisteredNf for L2Fwd {}
impl RegisteredNf for FlowFwd {}

impl RegisteredNf for CNf {
    fn contained_faults(&self) -> Vec<String> {
        self.faults().iter().map(ToString::to_string).collect()
    }
}

impl RegisteredNf for EbpfNf {
    fn contained_faults(&self) -> Vec<String> {
        self.faults().iter().map(ToString::to_string).collect()
    }
}

/// One generic function over any NF: [`LoadedNf::visit`] calls [`NfVisitor::visit`] with
/// the NF as its concrete type.
pub trait NfVisitor {
    /// What the visit returns.
    type Output;
    /// Runs with the NF.
    fn visit<N: RegisteredNf>(self, nf: N) -> Self::Output;
}

/// A loaded NF, one variant per type.
#[derive(Debug)]
pub enum LoadedNf {
    /// [`Monitor`].
    Monitor(Monitor),
    /// [`Firewall`].
    Firewall(Firewall),
    /// [`Ids`].
    Ids(Ids),
    /// [`Ipsec`].
    Ipsec(Ipsec),
    /// [`Dpi`].
    Dpi(Dpi),
    /// [`MacSwap`].
    Macswap(MacSwap),
    /// [`Policer`].
    Policer(Policer),
    /// [`L2Fwd`].
    L2fwd(L2Fwd),
    /// [`FlowFwd`].
    Flowfwd(FlowFwd),
    /// A C NF.
    C(CNf),
    /// An eBPF NF.
    Ebpf(EbpfNf),
}

impl LoadedNf {
    /// Hands the NF to `v`.
    pub fn visit<V: NfVisitor>(self, v: V) -> V::Output {
        match self {
            LoadedNf::Monitor(nf) => v.visit(nf),
            LoadedNf::Firewall(nf) => v.visit(nf),
            LoadedNf::Ids(nf) => v.visit(nf),
            LoadedNf::Ipsec(nf) => v.visit(nf),
            LoadedNf::Dpi(nf) => v.visit(nf),
            LoadedNf::Macswap(nf) => v.visit(nf),
            LoadedNf::Policer(nf) => v.visit(nf),
            LoadedNf::L2fwd(nf) => v.visit(nf),
            LoadedNf::Flowfwd(nf) => v.visit(nf),
            LoadedNf::C(nf) => v.visit(nf),
            LoadedNf::Ebpf(nf) => v.visit(nf),
        }
    }
}

/// An NF that cannot be named or loaded.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Neither a reference NF, nor an NF registered in scope, nor `c:`/`ebpf:` followed by
    /// a path.
    #[error("unknown NF {name:?}: give {}", choices(registered))]
    UnknownNf {
        /// The name as given.
        name: String,
        /// The registered NFs in scope where it was given ([`with_registered_names`]).
        registered: Vec<String>,
    },
    /// `c:` or `ebpf:` without a path.
    #[error("NF {0:?} names no file")]
    NoPath(String),
    /// `ebpf+ENGINE:` with an unknown engine.
    #[error("unknown eBPF engine {0:?} (interpreter or jit)")]
    UnknownEngine(String),
    /// A registered NF asked to be loaded from its spec alone.
    #[error(
        "NF {0:?} is registered by the program that runs it and only that program can build it"
    )]
    NotLoadable(String),
    /// The C object could not be loaded.
    #[error(transparent)]
    C(#[from] buffet_cnf::CNfLoadError),
    /// The eBPF object could not be read or verified.
    #[error(transparent)]
    Ebpf(#[from] buffet_ebpf::EbpfFileError),
}

impl RegistryError {
    /// [`RegistryError::UnknownNf`] for `name`, listing the registered NFs in scope.
    fn unknown(name: &str) -> RegistryError {
        RegistryError::UnknownNf {
            name: name.to_owned(),
            registered: REGISTERED.with(|r| r.borrow().clone()),
        }
    }
}

/// What an NF name may be: the reference NFs, the `registered` ones, and C or eBPF objects.
fn choices(registered: &[String]) -> String {
    let reference: Vec<&str> = NfName::ALL.iter().map(|n| n.name()).collect();
    let mut s = format!("a reference NF ({})", reference.join(", "));
    if !registered.is_empty() {
        s.push_str(&format!(
            ", an NF this program registered ({})",
            registered.join(", ")
        ));
    }
    s.push_str(", c:PATH or ebpf[+jit]:PATH");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::any::type_name;

    #[test]
    fn specs_parse_and_print() {
        for name in NfName::ALL {
            let spec: NfSpec = name.name().parse().unwrap();
            assert_eq!(spec, NfSpec::Reference(name));
            assert_eq!(spec.to_string(), name.name());
            assert_eq!(spec.kind(), NfKind::Reference);
            assert_eq!(spec.path(), None);
        }
        let cases = [
            ("c:nf.so", NfSpec::C("nf.so".into())),
            ("c:/a/b:c.so", NfSpec::C("/a/b:c.so".into())),
            (
                "ebpf:x/dpi.o",
                NfSpec::Ebpf {
                    path: "x/dpi.o".into(),
                    engine: EbpfEngine::Interpreter,
                },
            ),
            (
                "ebpf+jit:dpi.o",
                NfSpec::Ebpf {
                    path: "dpi.o".into(),
                    engine: EbpfEngine::Jit,
                },
            ),
        ];
        for (text, spec) in cases {
            assert_eq!(text.parse::<NfSpec>().unwrap(), spec, "{text}");
            assert_eq!(spec.to_string().parse::<NfSpec>().unwrap(), spec);
        }
        assert_eq!(
            "ebpf+interpreter:dpi.o"
                .parse::<NfSpec>()
                .unwrap()
                .to_string(),
            "ebpf:dpi.o"
        );
        assert_eq!("c:nf.so".parse::<NfSpec>().unwrap().kind(), NfKind::C);
        assert_eq!(
            "ebpf:nf.o".parse::<NfSpec>().unwrap().path(),
            Some(Path::new("nf.o"))
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let err = |s: &str| s.parse::<NfSpec>().unwrap_err().to_string();
        assert!(err("monitr").starts_with("unknown NF \"monitr\": give a reference NF"));
        assert!(err("Monitor").starts_with("unknown NF \"Monitor\""));
        assert!(err("").starts_with("unknown NF \"\""));
        assert!(err("lua:x.lua").starts_with("unknown NF \"lua:x.lua\""));
        assert!(err("c+jit:x.so").starts_with("unknown NF \"c+jit:x.so\""));
        assert_eq!(err("c:"), "NF \"c:\" names no file");
        assert_eq!(err("ebpf+jit:"), "NF \"ebpf+jit:\" names no file");
        assert_eq!(
            err("ebpf+aot:x.o"),
            "unknown eBPF engine \"aot\" (interpreter or jit)"
        );
    }

    #[test]
    fn specs_are_strings_in_serde() {
        let spec: NfSpec = serde_json::from_str("\"ebpf+jit:dpi.o\"").unwrap();
        assert_eq!(serde_json::to_string(&spec).unwrap(), "\"ebpf+jit:dpi.o\"");
        #[derive(Deserialize)]
        struct Stage {
            nf: NfSpec,
        }
        let s: Stage = toml::from_str("nf = \"firewall\"").unwrap();
        assert_eq!(s.nf, NfSpec::Reference(NfName::Firewall));
        let e = toml::from_str::<Stage>("nf = \"walls\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("unknown NF \"walls\""), "{e}");
        assert_eq!(serde_json::to_string(&EbpfEngine::Jit).unwrap(), "\"jit\"");
        assert_eq!("jit".parse::<EbpfEngine>().unwrap(), EbpfEngine::Jit);
        assert_eq!(Engine::from(EbpfEngine::Jit), Engine::Jit);
    }

    #[test]
    fn registered_names_parse_only_in_their_scope() {
        let names = ["my-nf".to_owned(), "edge_2".to_owned()];
        let err = |s: &str| s.parse::<NfSpec>().unwrap_err().to_string();
        // Outside the scope: an unknown NF, exactly as any misspelt name.
        assert_eq!(
            err("my-nf"),
            "unknown NF \"my-nf\": give a reference NF (monitor, firewall, ids, ipsec, dpi, \
             macswap, policer, l2fwd, flowfwd), c:PATH or ebpf[+jit]:PATH"
        );
        let spec = with_registered_names(&names, || {
            // Reference NFs and objects parse as always; a name not registered is unknown.
            assert_eq!(
                "firewall".parse::<NfSpec>().unwrap(),
                NfSpec::Reference(NfName::Firewall)
            );
            assert_eq!(
                "c:x.so".parse::<NfSpec>().unwrap(),
                NfSpec::C("x.so".into())
            );
            assert!(err("walls").starts_with("unknown NF \"walls\": give a reference NF"));
            // Every name the program accepts here is listed.
            assert!(
                err("walls").ends_with(
                    "l2fwd, flowfwd), an NF this program registered (my-nf, edge_2), \
                     c:PATH or ebpf[+jit]:PATH"
                ),
                "{}",
                err("walls")
            );
            // Nested scopes see only their own names, and give the outer ones back.
            with_registered_names(&[], || assert!(err("my-nf").starts_with("unknown NF")));
            "my-nf".parse::<NfSpec>().unwrap()
        });
        assert_eq!(spec, NfSpec::Registered("my-nf".into()));
        assert_eq!(spec.to_string(), "my-nf");
        assert_eq!(spec.kind(), NfKind::Reference);
        assert_eq!(spec.path(), None);
        assert!(err("my-nf").starts_with("unknown NF"), "the scope ended");
        // A panic inside the scope still ends it.
        let r = std::panic::catch_unwind(|| with_registered_names(&names, || panic!("boom")));
        assert!(r.is_err());
        assert!(err("edge_2").starts_with("unknown NF"));
        // Only the program that registered it can build it.
        assert_eq!(
            spec.load().unwrap_err().to_string(),
            "NF \"my-nf\" is registered by the program that runs it and only that program \
             can build it"
        );
    }

    /// Reports which type it was handed and what that NF registers.
    struct Probe;

    impl NfVisitor for Probe {
        type Output = (&'static str, usize, Vec<String>);

        fn visit<N: RegisteredNf>(self, nf: N) -> Self::Output {
            (type_name::<N>(), nf.register().bytes, nf.contained_faults())
        }
    }

    #[test]
    fn the_visitor_reaches_every_reference_nf() {
        let want = [
            type_name::<Monitor>(),
            type_name::<Firewall>(),
            type_name::<Ids>(),
            type_name::<Ipsec>(),
            type_name::<Dpi>(),
            type_name::<MacSwap>(),
            type_name::<Policer>(),
            type_name::<L2Fwd>(),
            type_name::<FlowFwd>(),
        ];
        for (name, want) in NfName::ALL.into_iter().zip(want) {
            let nf = NfSpec::Reference(name).load().unwrap();
            let (got, state, faults) = nf.visit(Probe);
            assert_eq!(got, want, "{name}");
            assert!(state > 0, "{name}: registers no state");
            assert!(faults.is_empty());
        }
    }

    #[test]
    fn loading_a_missing_object_names_it() {
        let e = NfSpec::C("/nonexistent/nf.so".into())
            .load()
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/nf.so"), "{e}");
        let e = NfSpec::Ebpf {
            path: "/nonexistent/nf.o".into(),
            engine: EbpfEngine::Jit,
        }
        .load()
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/nf.o"), "{e}");
    }
}
