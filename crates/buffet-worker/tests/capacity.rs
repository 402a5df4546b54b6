//! Capacity: 10,000 tenants of every reference NF admitted into one pipeline with default
//! settings (the default arena reserves address space only; a region's pages cost memory
//! once the NF touches them). Prints the resident memory each tenant added, per NF
//! (`cargo test -p buffet-worker --test capacity -- --nocapture`).

use buffet_dispatch::Match;
use buffet_nfs::policer::PolicerPolicy;
use buffet_nfs::{Dpi, Firewall, FlowFwd, Ids, Ipsec, L2Fwd, MacSwap, Monitor, Policer};
use buffet_sdk::{NetworkFunction, TenantId};
use buffet_worker::{Pipeline, PipelineConfig, TenantSpec};

const TENANTS: u32 = 10_000;

/// Resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Admits `TENANTS` tenants of `N` (the NF's default settings), each with `policy`;
/// returns resident KiB per tenant added by the admissions.
fn admit_all<N>(policy: N::Policy) -> f64
where
    N: NetworkFunction + Default,
    N::Policy: Clone,
{
    let cfg = PipelineConfig {
        pin: false,
        ..PipelineConfig::default()
    };
    let mut p = Pipeline::new(N::default(), cfg).unwrap();
    let before = rss_kib();
    for i in 0..TENANTS {
        let dst = format!("10.{}.{}.0/24", i >> 8, i & 255).parse().unwrap();
        let spec = TenantSpec {
            id: TenantId(i + 1),
            name: String::new(),
            rules: vec![(
                100,
                Match {
                    dst_ip: Some(dst),
                    ..Match::default()
                },
            )],
            max_nb: 0,
            policy: policy.clone(),
        };
        if let Err(e) = p.admit(spec) {
            panic!("{}: tenant {i}: {e}", N::default().name());
        }
    }
    let per = (rss_kib().saturating_sub(before)) as f64 / f64::from(TENANTS);
    eprintln!(
        "{:>8}: {TENANTS} tenants, {:>8.1} KiB resident per tenant, region {} bytes",
        N::default().name(),
        per,
        N::default().register().bytes
    );
    drop(p);
    per
}

#[test]
fn ten_thousand_tenants_of_every_reference_nf_are_admitted_with_defaults() {
    let per_tenant = [
        admit_all::<Monitor>(Default::default()),
        admit_all::<Firewall>(Default::default()),
        admit_all::<Ids>(Default::default()),
        admit_all::<Ipsec>(Default::default()),
        admit_all::<Dpi>(Default::default()),
        admit_all::<MacSwap>(Default::default()),
        // A policer needs a rate; nothing else has a required field.
        admit_all::<Policer>(PolicerPolicy {
            rate: 1_000_000,
            burst: 10_000,
            ..Default::default()
        }),
        admit_all::<L2Fwd>(Default::default()),
        admit_all::<FlowFwd>(Default::default()),
    ];
    // All nine at once must fit a 24 GiB machine.
    let total_gib: f64 = per_tenant.iter().sum::<f64>() * f64::from(TENANTS) / (1 << 20) as f64;
    assert!(
        total_gib < 24.0,
        "{total_gib:.1} GiB resident for 10,000 tenants of each NF"
    );
}
