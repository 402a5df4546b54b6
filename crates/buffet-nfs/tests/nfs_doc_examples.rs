//! The policy examples in docs/nfs.md and in each NF's module documentation parse into
//! the NF's policy type and are accepted by its `init`: the documentation cannot drift
//! from the code.

use buffet_nfs::{Dpi, Firewall, FlowFwd, Ids, L2Fwd, MacSwap, Monitor, Policer};
use buffet_sdk::NetworkFunction;

/// The ```toml blocks of a markdown text.
fn toml_blocks(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        let t = line.trim_start();
        match &mut current {
            None if t.starts_with("```toml") => current = Some(String::new()),
            Some(_) if t.starts_with("```") => out.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The module documentation (`//!` lines) of a source file, as markdown.
fn module_doc(source: &str) -> String {
    source
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parses a tenants-file fragment and checks its `[tenant.policy]` with `nf.init`.
fn check<N: NetworkFunction>(nf: &N, where_: &str, block: &str) {
    let doc: toml::Table = toml::from_str(block)
        .unwrap_or_else(|e| panic!("{where_}: {} example is not TOML: {e}", nf.name()));
    let policy = doc
        .get("tenant")
        .and_then(|t| t.get("policy"))
        .cloned()
        .unwrap_or_else(|| panic!("{where_}: {} example has no [tenant.policy]", nf.name()));
    let policy: N::Policy = policy
        .try_into()
        .unwrap_or_else(|e| panic!("{where_}: {} example: {e}", nf.name()));
    let mut state = N::State::default();
    nf.init(&policy, &mut state)
        .unwrap_or_else(|e| panic!("{where_}: {} example rejected: {e}", nf.name()));
}

fn check_sections<N: NetworkFunction>(nf: N, source: &str) {
    let module_blocks = toml_blocks(&module_doc(source));
    assert!(
        !module_blocks.is_empty(),
        "{}: no TOML example in the module doc",
        nf.name()
    );
    for b in &module_blocks {
        check(&nf, "module doc", b);
    }
    let docs = include_str!("../../../docs/nfs.md");
    let heading = format!("\n## {}\n", nf.name());
    let start = docs
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/nfs.md has no section for {}", nf.name()));
    let section = &docs[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let blocks = toml_blocks(section);
    assert!(
        !blocks.is_empty(),
        "docs/nfs.md: no TOML example for {}",
        nf.name()
    );
    for b in &blocks {
        check(&nf, "docs/nfs.md", b);
    }
}

#[test]
fn documented_policies_are_accepted() {
    check_sections(Monitor::default(), include_str!("../src/monitor.rs"));
    check_sections(Firewall::default(), include_str!("../src/firewall/mod.rs"));
    check_sections(Ids::default(), include_str!("../src/ids.rs"));
    check_sections(Dpi::default(), include_str!("../src/dpi.rs"));
    check_sections(MacSwap, include_str!("../src/macswap.rs"));
    check_sections(Policer, include_str!("../src/policer.rs"));
    check_sections(L2Fwd::default(), include_str!("../src/l2fwd.rs"));
    check_sections(FlowFwd::default(), include_str!("../src/flowfwd.rs"));
}

#[test]
fn documented_rule_file_parses() {
    let docs = include_str!("../../../docs/nfs.md");
    let start = docs.find("### Rule format").unwrap();
    let block = &docs[start..];
    let block = &block[block.find("```text\n").unwrap() + 8..];
    let block = &block[..block.find("```").unwrap()];
    let sigs = buffet_nfs::ids::parse_rules(block).unwrap();
    assert_eq!(sigs.len(), 4);
    let module = module_doc(include_str!("../src/ids.rs"));
    let start = module.find("```text\n").unwrap() + 8;
    let block = &module[start..];
    let block = &block[..block.find("```").unwrap()];
    assert_eq!(buffet_nfs::ids::parse_rules(block).unwrap().len(), 4);
}
