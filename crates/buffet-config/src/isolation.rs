//! Isolation levels (docs/isolation.md): what keeps one tenant's NF code away from the
//! others' state, which level a run uses, which kinds of NF each level accepts, and the
//! Memory Manager [`Domain`] a level maps to.
//!
//! [`resolve`] is a pure function of the request, the NF and the tenants; only [`mpk`]
//! touches the machine (it probes for protection keys). Nothing here loads an NF or
//! prints: a command that runs at [`Isolation::TrustedNative`] prints
//! [`TRUSTED_NATIVE_WARNING`] itself.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use buffet_memory::{Domain, Mpk, MpkError};
use buffet_sdk::TenantId;
use serde::{Deserialize, Serialize};

use crate::registry::NfSpec;
use crate::tenants::TenantConfig;

/// An isolation level: what keeps one tenant's NF code away from the others' state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The type system: safe Rust NFs, each handler sees one tenant's state.
    Safe,
    /// Intel memory protection keys: native (C or unsafe Rust) NFs, faults contained.
    Mpk,
    /// Native code the operator trusts, on CPUs without protection keys: guard pages
    /// between tenant regions and fault containment (any crash of a tenant's C code
    /// quarantines that tenant), but **no hardware isolation** — a stray write that lands
    /// in another tenant's region is not stopped. Never a default: chosen explicitly.
    #[serde(rename = "trusted-native")]
    #[cfg_attr(feature = "clap", value(name = "trusted-native"))]
    TrustedNative,
    /// Verified eBPF bytecode (buffet-ebpf).
    Ebpf,
}

impl Isolation {
    /// Every level.
    pub const ALL: [Isolation; 4] = [
        Isolation::Safe,
        Isolation::Mpk,
        Isolation::TrustedNative,
        Isolation::Ebpf,
    ];

    /// `safe`, `mpk`, `trusted-native` or `ebpf`.
    pub const fn name(self) -> &'static str {
        match self {
            Isolation::Safe => "safe",
            Isolation::Mpk => "mpk",
            Isolation::TrustedNative => "trusted-native",
            Isolation::Ebpf => "ebpf",
        }
    }

    /// The Memory Manager domain of tenant regions at this level: protection keys for
    /// `mpk`; none for `safe` (the type system isolates), `ebpf` (the verifier and the
    /// VM do, regions need no hardware domain) and `trusted-native` (nothing does: regions
    /// keep only their guard pages).
    pub const fn domain(self) -> Domain {
        match self {
            Isolation::Mpk => Domain::Mpk,
            Isolation::Safe | Isolation::TrustedNative | Isolation::Ebpf => Domain::None,
        }
    }
}

/// The line a command prints on stderr when it runs at [`Isolation::TrustedNative`].
pub const TRUSTED_NATIVE_WARNING: &str = "WARNING: isolation: trusted-native — NO hardware \
     isolation between tenants: native NF code can read and write every tenant's state; \
     only guard pages and fault containment (a crashing tenant is quarantined). Run only \
     NF code you trust; see docs/isolation.md";

impl Isolation {
    /// Whether a C NF at this level has every fault of its code contained (`trusted-native`,
    /// where no hardware tells a tenant's fault from a plain bug), not only the faults a
    /// tenant's access to memory it may not touch raises (`mpk`).
    pub const fn contains_any_fault(self) -> bool {
        matches!(self, Isolation::TrustedNative)
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Not an isolation level's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown isolation level {0:?} (safe, mpk, trusted-native or ebpf)")]
pub struct ParseIsolationError(pub String);

impl FromStr for Isolation {
    type Err = ParseIsolationError;

    fn from_str(s: &str) -> Result<Isolation, ParseIsolationError> {
        Isolation::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| ParseIsolationError(s.to_owned()))
    }
}

/// A run that cannot go ahead at the isolation level asked for.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IsolationError {
    /// A tenant names a level other than the run's.
    #[error(
        "{}: tenant {tenant} ({name:?}) asks for isolation {asked} but this replay runs \
         {level}: one replay runs one isolation level",
        file.display()
    )]
    TenantLevel {
        /// The tenants file.
        file: PathBuf,
        /// The tenant.
        tenant: TenantId,
        /// Its name.
        name: String,
        /// The level it asks for.
        asked: Isolation,
        /// The run's level.
        level: Isolation,
    },
    /// `ebpf` with a C NF.
    #[error(
        "--isolation ebpf cannot run the C NF {}: it runs verified eBPF programs only \
         (--nf-ebpf path/to/nf.o); use --isolation mpk",
        lib.display()
    )]
    EbpfRunsNoC {
        /// The shared object.
        lib: PathBuf,
    },
    /// `ebpf` with a reference (Rust) NF.
    #[error("--isolation ebpf runs eBPF NFs: give --nf-ebpf path/to/nf.o (see `buffet nf check`)")]
    EbpfNeedsProgram,
    /// An eBPF NF at a level other than `ebpf`.
    #[error("--nf-ebpf runs under --isolation ebpf, not {level}")]
    ProgramNeedsEbpf {
        /// The level asked for.
        level: Isolation,
    },
    /// `safe` with a C NF.
    #[error(
        "--isolation safe cannot run the C NF {}: native code is not isolated by the \
         type system; use --isolation mpk",
        lib.display()
    )]
    SafeRunsNoC {
        /// The shared object.
        lib: PathBuf,
    },
    /// `mpk` on a machine (CPU, kernel, environment) without protection keys. The message
    /// says how to run a C NF there: `trusted-native`.
    #[error(
        "--isolation mpk: {0}; to run native NF code you trust without hardware isolation \
         (guard pages and fault containment only), choose --isolation trusted-native \
         (docs/isolation.md)"
    )]
    MpkUnavailable(MpkError),
}

/// The run's level, before any check of what runs at it: `requested`, else the one every
/// tenant names, else `default`. Fails when a tenant names another level than that.
pub fn run_level(
    requested: Option<Isolation>,
    default: Isolation,
    tenants: &[TenantConfig],
    file: &Path,
) -> Result<Isolation, IsolationError> {
    let named: Vec<Isolation> = tenants.iter().filter_map(|t| t.isolation).collect();
    let level = requested.unwrap_or(match named.first() {
        Some(&first) if named.len() == tenants.len() && named.iter().all(|&l| l == first) => first,
        _ => default,
    });
    match tenants
        .iter()
        .find(|t| t.isolation.is_some_and(|l| l != level))
    {
        Some(t) => Err(IsolationError::TenantLevel {
            file: file.to_owned(),
            tenant: t.id,
            name: t.name.clone(),
            asked: t.isolation.unwrap_or(level),
            level,
        }),
        None => Ok(level),
    }
}

/// The run's isolation level: `requested`, else the one every tenant names, else the
/// default for the kind of NF (`mpk` for a C NF, `ebpf` for an eBPF NF, `safe` for a
/// reference NF). Fails when a tenant names another level than the run's (`file` names
/// the tenants file in that error) or when the level cannot run the NF: C NFs run at
/// `mpk` or `trusted-native`, eBPF NFs at `ebpf` only, reference NFs at `safe`, `mpk` or
/// `trusted-native` (where they are as safe as at `safe`). `trusted-native` is never a
/// default: a request or every tenant must name it.
pub fn resolve(
    requested: Option<Isolation>,
    nf: &NfSpec,
    tenants: &[TenantConfig],
    file: &Path,
) -> Result<Isolation, IsolationError> {
    let default = match nf {
        NfSpec::C(_) => Isolation::Mpk,
        NfSpec::Ebpf { .. } => Isolation::Ebpf,
        NfSpec::Reference(_) | NfSpec::Registered(_) => Isolation::Safe,
    };
    let level = run_level(requested, default, tenants, file)?;
    match (level, nf) {
        (Isolation::Ebpf, NfSpec::C(lib)) => Err(IsolationError::EbpfRunsNoC { lib: lib.clone() }),
        (Isolation::Ebpf, NfSpec::Reference(_) | NfSpec::Registered(_)) => {
            Err(IsolationError::EbpfNeedsProgram)
        }
        (Isolation::Ebpf, NfSpec::Ebpf { .. }) => Ok(level),
        (_, NfSpec::Ebpf { .. }) => Err(IsolationError::ProgramNeedsEbpf { level }),
        (Isolation::Safe, NfSpec::C(lib)) => Err(IsolationError::SafeRunsNoC { lib: lib.clone() }),
        (Isolation::Safe, NfSpec::Reference(_) | NfSpec::Registered(_))
        | (Isolation::Mpk, _)
        | (Isolation::TrustedNative, _) => Ok(level),
    }
}

/// The process's protection-key cache, for a run at `mpk`; the error says what the
/// machine lacks.
pub fn mpk() -> Result<&'static Mpk, IsolationError> {
    Mpk::get().map_err(IsolationError::MpkUnavailable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{EbpfEngine, NfName};
    use buffet_dispatch::Match;

    fn tenant(id: u32, level: Option<Isolation>) -> TenantConfig {
        let mut t = TenantConfig::new(
            TenantId(id),
            vec![(
                100,
                Match {
                    vlan: Some(1),
                    ..Match::default()
                },
            )],
        );
        t.isolation = level;
        t
    }

    fn rust() -> NfSpec {
        NfSpec::Reference(NfName::Monitor)
    }

    fn c() -> NfSpec {
        NfSpec::C("nf.so".into())
    }

    fn ebpf() -> NfSpec {
        NfSpec::Ebpf {
            path: "nf.o".into(),
            engine: EbpfEngine::Interpreter,
        }
    }

    fn resolve(
        requested: Option<Isolation>,
        nf: &NfSpec,
        tenants: &[TenantConfig],
    ) -> Result<Isolation, IsolationError> {
        super::resolve(requested, nf, tenants, Path::new("t.toml"))
    }

    #[test]
    fn names_parse_and_print() {
        for l in Isolation::ALL {
            assert_eq!(l.name().parse::<Isolation>(), Ok(l));
            assert_eq!(l.to_string(), l.name());
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(json, format!("\"{}\"", l.name()));
            assert_eq!(serde_json::from_str::<Isolation>(&json).unwrap(), l);
        }
        assert_eq!(
            "vm".parse::<Isolation>().unwrap_err().to_string(),
            "unknown isolation level \"vm\" (safe, mpk, trusted-native or ebpf)"
        );
        assert_eq!(Isolation::Mpk.domain(), Domain::Mpk);
        assert_eq!(Isolation::Safe.domain(), Domain::None);
        assert_eq!(Isolation::Ebpf.domain(), Domain::None);
        assert_eq!(Isolation::TrustedNative.domain(), Domain::None);
        assert_eq!(
            "trusted-native".parse::<Isolation>(),
            Ok(Isolation::TrustedNative)
        );
        assert_eq!(
            serde_json::to_string(&Isolation::TrustedNative).unwrap(),
            "\"trusted-native\""
        );
        assert!(Isolation::TrustedNative.contains_any_fault());
        assert!(!Isolation::Mpk.contains_any_fault());
    }

    #[test]
    fn trusted_native_runs_native_nfs_and_is_never_a_default() {
        let ts = [tenant(1, None)];
        let ok = |l, nf: &NfSpec| resolve(Some(l), nf, &ts).map_err(|e| e.to_string());
        assert_eq!(
            ok(Isolation::TrustedNative, &c()),
            Ok(Isolation::TrustedNative)
        );
        assert_eq!(
            ok(Isolation::TrustedNative, &rust()),
            Ok(Isolation::TrustedNative)
        );
        assert_eq!(
            ok(Isolation::TrustedNative, &ebpf()),
            Err("--nf-ebpf runs under --isolation ebpf, not trusted-native".into())
        );
        // Without a request, a C NF defaults to mpk, never to trusted-native...
        assert_eq!(resolve(None, &c(), &ts).unwrap(), Isolation::Mpk);
        // ... unless every tenant names it.
        let named = [
            tenant(1, Some(Isolation::TrustedNative)),
            tenant(2, Some(Isolation::TrustedNative)),
        ];
        assert_eq!(
            resolve(None, &c(), &named).unwrap(),
            Isolation::TrustedNative
        );
    }

    #[test]
    fn the_mpk_error_says_how_to_choose_trusted_native() {
        let e = IsolationError::MpkUnavailable(MpkError::Unavailable {
            reason: "this CPU has no pku".into(),
        })
        .to_string();
        assert!(
            e.starts_with("--isolation mpk: MPK isolation is unavailable: this CPU has no pku;"),
            "{e}"
        );
        assert!(e.contains("choose --isolation trusted-native"), "{e}");
        assert!(std::error::Error::source(&IsolationError::MpkUnavailable(
            MpkError::Unavailable { reason: "x".into() }
        ))
        .is_none());
        assert!(TRUSTED_NATIVE_WARNING.contains("NO hardware isolation"));
    }

    #[test]
    fn defaults_follow_the_kind_of_nf() {
        let ts = [tenant(1, None), tenant(2, None)];
        assert_eq!(resolve(None, &rust(), &ts).unwrap(), Isolation::Safe);
        assert_eq!(resolve(None, &c(), &ts).unwrap(), Isolation::Mpk);
        assert_eq!(resolve(None, &ebpf(), &ts).unwrap(), Isolation::Ebpf);
        assert_eq!(resolve(None, &rust(), &[]).unwrap(), Isolation::Safe);
    }

    #[test]
    fn the_tenants_level_applies_when_all_agree() {
        let ts = [
            tenant(1, Some(Isolation::Mpk)),
            tenant(2, Some(Isolation::Mpk)),
        ];
        assert_eq!(resolve(None, &rust(), &ts).unwrap(), Isolation::Mpk);
        // Not all name one: the NF's default, and the tenant that named another fails.
        let ts = [tenant(1, Some(Isolation::Mpk)), tenant(2, None)];
        let e = resolve(None, &rust(), &ts).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml: tenant 1 (\"tenant-1\") asks for isolation mpk but this replay runs \
             safe: one replay runs one isolation level"
        );
        // The request wins over the tenants, and must agree with every one that names.
        let ts = [tenant(1, None), tenant(2, Some(Isolation::Safe))];
        assert_eq!(
            resolve(Some(Isolation::Safe), &rust(), &ts).unwrap(),
            Isolation::Safe
        );
        assert!(matches!(
            resolve(Some(Isolation::Mpk), &rust(), &ts),
            Err(IsolationError::TenantLevel {
                tenant: TenantId(2),
                asked: Isolation::Safe,
                level: Isolation::Mpk,
                ..
            })
        ));
    }

    #[test]
    fn each_level_accepts_its_kinds_of_nf() {
        let ts = [tenant(1, None)];
        let ok = |l, nf: &NfSpec| resolve(Some(l), nf, &ts).map_err(|e| e.to_string());
        assert_eq!(ok(Isolation::Safe, &rust()), Ok(Isolation::Safe));
        assert_eq!(ok(Isolation::Mpk, &rust()), Ok(Isolation::Mpk));
        assert_eq!(ok(Isolation::Mpk, &c()), Ok(Isolation::Mpk));
        assert_eq!(ok(Isolation::Ebpf, &ebpf()), Ok(Isolation::Ebpf));
        assert_eq!(
            ok(Isolation::Ebpf, &c()),
            Err(
                "--isolation ebpf cannot run the C NF nf.so: it runs verified eBPF programs \
                 only (--nf-ebpf path/to/nf.o); use --isolation mpk"
                    .into()
            )
        );
        assert_eq!(
            ok(Isolation::Ebpf, &rust()),
            Err(
                "--isolation ebpf runs eBPF NFs: give --nf-ebpf path/to/nf.o (see `buffet nf check`)"
                    .into()
            )
        );
        for l in [Isolation::Safe, Isolation::Mpk] {
            assert_eq!(
                ok(l, &ebpf()),
                Err(format!("--nf-ebpf runs under --isolation ebpf, not {l}"))
            );
        }
        assert_eq!(
            ok(Isolation::Safe, &c()),
            Err(
                "--isolation safe cannot run the C NF nf.so: native code is not isolated by \
                 the type system; use --isolation mpk"
                    .into()
            )
        );
    }

    #[test]
    fn a_tenant_level_that_cannot_run_the_nf_fails_on_the_nf() {
        // Every tenant asks for ebpf, the NF is C: the level is ebpf and C cannot run there.
        let ts = [tenant(1, Some(Isolation::Ebpf))];
        assert!(matches!(
            resolve(None, &c(), &ts),
            Err(IsolationError::EbpfRunsNoC { .. })
        ));
    }
}
