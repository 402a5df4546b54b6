//! The traffic both key-cache examples run (`mpk_key_misses` counts the key cache's
//! misses on it, `key_cache_bound` the fewest any cache could have): `buffet demo`'s
//! generator with the demo's defaults (`buffet demo --help`), and the tenant counts of
//! the command line.

use buffet_io::gen::{GenConfig, GenError, Generator};

pub const SEED: u64 = 7;
pub const SECONDS: f64 = 2.0;
pub const RATE_PPS: f64 = 400_000.0;
/// Workers the tenants are spread over.
pub const WORKERS: u16 = 2;

/// The demo's traffic for `tenants` tenants.
pub fn generator(tenants: u32) -> Result<Generator, GenError> {
    Generator::new(GenConfig {
        seed: SEED,
        tenants,
        duration_ns: (SECONDS * 1e9) as u64,
        mean_rate_pps: RATE_PPS,
        ..GenConfig::default()
    })
}

/// The tenant counts given on the command line (default: 100 and 1,000).
pub fn tenant_counts() -> Result<Vec<u32>, String> {
    match std::env::args().skip(1).collect::<Vec<_>>() {
        a if a.is_empty() => Ok(vec![100, 1000]),
        a => a
            .iter()
            .map(|s| {
                s.parse()
                    .map_err(|e| format!("tenant count {s:?}: {e} (give whole numbers)"))
            })
            .collect(),
    }
}
