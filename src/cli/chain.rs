//! Chained runs: when a tenant of the tenants file names its own chain
//! (`[[tenant.chain]]`, docs/chains.md), `replay`, `run` and `demo` run a
//! [`Chain`] — the run's `--nf` (if any) is the one-stage chain of the tenants that name
//! none — and print each tenant's per-stage counters under its row. A stage may name a
//! reference NF, a C or eBPF object, or an NF the program registered ([`Registry`]):
//! [`load_tenants`] parses the tenants file with the registered names in scope.
//!
//! Without any chain nothing here runs: the run's NF is handed to the pipeline directly.
//! This module loads nothing itself beyond what [`Chain::load_stages`] loads, and decides
//! no isolation beyond [`chain::resolve_level`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use buffet_config::chain::{self, stage_rows, Chain, DEFAULT_KEY};
use buffet_config::isolation::{self, Isolation};
use buffet_config::registry::{NfKind, NfSpec, NfVisitor, RegisteredNf};
use buffet_config::TenantConfig;

use super::registry::{Registry, Visit};
use super::replay::{self, Chosen};

/// What a chained run needs besides the command's own visitor: the tenants as the file
/// gives them (their stages), the run's level, the file (for errors) and the registry
/// (the author's NFs a stage may name).
#[derive(Clone, Copy)]
pub(crate) struct ChainRun<'a> {
    pub tenants: &'a [TenantConfig],
    pub level: Isolation,
    pub file: &'a Path,
    pub registry: &'a Registry,
    /// The largest region the run's arena gives (`ArenaConfig::largest_region`): every
    /// tenant's chain region must fit it.
    pub largest_region: usize,
}

/// Builds the [`Chain`] around the run's NF, then hands it to the command.
pub(crate) struct Chained<'a, V> {
    pub inner: V,
    pub run: ChainRun<'a>,
    pub kind: NfKind,
}

impl<V: NfVisitor<Output = anyhow::Result<()>>> NfVisitor for Chained<'_, V> {
    type Output = anyhow::Result<()>;

    fn visit<N: RegisteredNf>(self, nf: N) -> anyhow::Result<()> {
        finish(
            Chain::new().with_kind(DEFAULT_KEY, nf, self.kind),
            self.run,
            self.inner,
        )
    }
}

/// Loads the stages' NFs, checks every tenant's chain against them and the chain's
/// region against the arena (nothing is admitted before all pass), and runs the command
/// with the chain.
fn finish<V: NfVisitor<Output = anyhow::Result<()>>>(
    chain: Chain,
    run: ChainRun<'_>,
    inner: V,
) -> anyhow::Result<()> {
    let mut chain = chain.load_stages_with(run.tenants, run.level, run.file, run.registry)?;
    if run.level == Isolation::Mpk {
        // Each C stage's part of a tenant's region under its own protection key.
        chain = chain.stage_keys(isolation::mpk()?);
    }
    chain
        .check_region(run.largest_region)
        .map_err(|e| anyhow::anyhow!("{}: {e}", run.file.display()))?;
    chain.check_tenants(run.tenants, run.file)?;
    let stages = run.tenants.iter().map(|t| t.chain.len().max(1)).max();
    eprintln!(
        "chains: {} tenants, {} of them with their own chain (up to {} stages)",
        run.tenants.len(),
        run.tenants.iter().filter(|t| !t.chain.is_empty()).count(),
        stages.unwrap_or(1)
    );
    inner.visit(chain)
}

/// Reads the tenants file with the registry's NFs accepted as stage names
/// (`[[tenant.chain]] nf = "my-nf"`); any other unknown name is the file's usual error.
pub(crate) fn load_tenants(path: &Path, registry: &Registry) -> anyhow::Result<Vec<TenantConfig>> {
    let names = registry.registered_names();
    Ok(buffet_config::registry::with_registered_names(
        &names,
        || buffet_config::tenants::load(path),
    )?)
}

/// The isolation level of a chained run (see [`chain::resolve_level`]), saying on
/// stderr how many protection keys MPK has.
pub(crate) fn level(
    requested: Option<Isolation>,
    chosen: &Chosen,
    tenants: &[TenantConfig],
    file: &Path,
) -> anyhow::Result<Isolation> {
    let default = match chosen {
        Chosen::Spec(spec) => Some(spec.clone()),
        Chosen::Registered(_) => Some(NfSpec::Reference(buffet_config::registry::NfName::Monitor)),
        Chosen::Nothing => None,
    };
    let level = chain::resolve_level(requested, default.as_ref(), tenants, file)?;
    replay::announce_mpk(level, requested, chosen, tenants, file)?;
    Ok(level)
}

/// Runs the command's `visitor` with a [`Chain`] around `chosen` (or around no default
/// NF when every tenant names a chain).
pub(crate) fn visit<'v, V>(
    chosen: Chosen,
    run: ChainRun<'v>,
    registry: &'v Registry,
    visitor: V,
    wrap: impl FnOnce(V) -> Visit<'v>,
) -> anyhow::Result<()>
where
    V: NfVisitor<Output = anyhow::Result<()>>,
{
    let kind = match &chosen {
        Chosen::Spec(spec) => spec.kind(),
        Chosen::Registered(_) => NfKind::Reference,
        Chosen::Nothing => return finish(Chain::new(), run, visitor),
    };
    replay::load_and_visit(
        chosen,
        run.level,
        registry,
        Chained {
            inner: visitor,
            run,
            kind,
        },
        move |c| {
            Visit::Chained(Box::new(Chained {
                inner: wrap(c.inner),
                run: c.run,
                kind: c.kind,
            }))
        },
    )
}

/// Prints a tenant's stage lines when its chain has more than one stage (a one-stage
/// chain is the tenant's row itself; `--stats-json` has every chain). No timings: the
/// text output stays the same from run to run.
pub(crate) fn print_stages(
    out: &mut dyn Write,
    nf: &BTreeMap<&'static str, u64>,
) -> std::io::Result<()> {
    let stages = stage_rows(nf);
    if stages.len() < 2 {
        return Ok(());
    }
    for s in stages {
        let drops = super::run::drops_text(&s.drops);
        writeln!(
            out,
            "{:>6} stage {} {:<10} {:>10} in {:>10} passed {:>8} dropped  {}{}",
            "",
            s.stage,
            s.nf,
            s.packets,
            s.passed,
            s.drops.values().sum::<u64>(),
            drops,
            if s.faults > 0 {
                format!(" faults={}", s.faults)
            } else {
                String::new()
            }
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_rows_come_back_from_the_summary_keys() {
        let nf: BTreeMap<&'static str, u64> = [
            ("chain.0.firewall.packets", 10),
            ("chain.0.firewall.passed", 7),
            ("chain.0.firewall.drop.policy", 3),
            ("chain.0.firewall.ns", 99),
            ("chain.0.firewall.nf.denied", 3),
            ("chain.1.monitor.packets", 7),
            ("chain.1.monitor.passed", 7),
            ("flows", 1),
        ]
        .into_iter()
        .collect();
        let rows = stage_rows(&nf);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].nf, "firewall");
        assert_eq!((rows[0].packets, rows[0].passed), (10, 7));
        assert_eq!(rows[0].drops["policy"], 3);
        assert_eq!(rows[0].ns, Some(99));
        assert_eq!(rows[0].counters["denied"], 3);
        assert_eq!((rows[1].stage, rows[1].packets), (1, 7));
        let mut text = Vec::new();
        print_stages(&mut text, &nf).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("stage 0 firewall"), "{text}");
        assert!(text.contains("policy=3"), "{text}");
        assert!(!text.contains("99"), "no timings in text: {text}");
        assert!(stage_rows(&BTreeMap::from([("flows", 1)])).is_empty());
    }
}
