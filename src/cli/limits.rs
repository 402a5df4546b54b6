//! Capacity limits the command puts on its arguments, so that a typo cannot ask for
//! minutes of CPU and gigabytes of memory: the number of workers.
//!
//! Every worker is a thread polling its ring while it has work (idle, it naps, then
//! blocks until handed work) and owns its rings
//! and Packet Buffers (several MB), so more workers than cores only slows a run down.
//! `--workers` is bounded by the cores available ([`std::thread::available_parallelism`],
//! at least [`ALWAYS_ALLOWED`]) unless `--allow-oversubscribe` is given, and never
//! exceeds [`MAX_WORKERS`]. The other capacity limits (arena bytes, Tenant Table slots)
//! are flags of their own, documented in docs/cli.md.

/// Workers always allowed, even on a machine with fewer cores (the default run).
pub const ALWAYS_ALLOWED: u16 = 2;

/// The most workers a run may start, even with `--allow-oversubscribe`.
pub const MAX_WORKERS: u16 = 256;

/// Why `--workers` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkersError {
    /// Zero workers.
    #[error("--workers must be at least 1")]
    Zero,
    /// More workers than cores, without `--allow-oversubscribe`.
    #[error(
        "--workers {asked} exceeds the {cores} cores available: each worker is a polling \
         thread; give --allow-oversubscribe to run more workers than cores (at most {MAX_WORKERS})"
    )]
    MoreThanCores {
        /// Workers asked for.
        asked: u16,
        /// Cores available to this process.
        cores: u16,
    },
    /// Above the hard limit.
    #[error("--workers {asked} exceeds the limit of {MAX_WORKERS} workers")]
    AboveLimit {
        /// Workers asked for.
        asked: u16,
    },
}

/// Page size the Memory Manager's regions are rounded to, for the figures below.
pub const PAGE: u64 = 4096;

/// How many tenants an arena of `arena_bytes` holds when each region is
/// `region_bytes` (what the NF's `register` asks for): every region is rounded up to
/// whole pages and followed by a guard page, and the arena starts with one.
pub fn tenants_in_arena(region_bytes: u64, arena_bytes: u64) -> u64 {
    let block = region_bytes.max(1).div_ceil(PAGE) * PAGE + PAGE;
    arena_bytes.saturating_sub(PAGE) / block
}

/// Cores available to this process (1 when unknown).
pub fn cores() -> u16 {
    std::thread::available_parallelism()
        .map(|n| u16::try_from(n.get()).unwrap_or(u16::MAX))
        .unwrap_or(1)
}

/// Checks `--workers asked` on a machine with `cores` cores.
pub fn check_workers(asked: u16, cores: u16, oversubscribe: bool) -> Result<u16, WorkersError> {
    if asked == 0 {
        return Err(WorkersError::Zero);
    }
    if asked > MAX_WORKERS {
        return Err(WorkersError::AboveLimit { asked });
    }
    if !oversubscribe && asked > cores.max(ALWAYS_ALLOWED) {
        return Err(WorkersError::MoreThanCores { asked, cores });
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_config::registry::{NfName, NfSpec, NfVisitor, RegisteredNf};

    struct RegionBytes;

    impl NfVisitor for RegionBytes {
        type Output = u64;

        fn visit<N: RegisteredNf>(self, nf: N) -> u64 {
            nf.register().bytes as u64
        }
    }

    /// docs/cli.md's table of tenants per default arena is what the NFs register today.
    #[test]
    fn the_documented_arena_figures_are_current() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
        let mut table = String::new();
        for name in NfName::ALL {
            let bytes = NfSpec::Reference(name).load().unwrap().visit(RegionBytes);
            let tenants = tenants_in_arena(bytes, 1 << 30);
            table.push_str(&format!("| {name} | {bytes} | {tenants} |\n"));
        }
        for row in table.lines() {
            assert!(doc.contains(row), "docs/cli.md lacks {row:?} of\n{table}");
        }
        // The figures measured by admitting tenants until the arena was full.
        let firewall = NfSpec::Reference(NfName::Firewall)
            .load()
            .unwrap()
            .visit(RegionBytes);
        let monitor = NfSpec::Reference(NfName::Monitor)
            .load()
            .unwrap()
            .visit(RegionBytes);
        assert_eq!(tenants_in_arena(firewall, 1 << 30), 237);
        assert_eq!(tenants_in_arena(monitor, 1 << 30), 3542);
    }

    #[test]
    fn workers_are_bounded_by_cores_unless_oversubscribed() {
        assert_eq!(check_workers(4, 8, false), Ok(4));
        assert_eq!(check_workers(2, 1, false), Ok(2));
        assert_eq!(
            check_workers(9, 8, false),
            Err(WorkersError::MoreThanCores { asked: 9, cores: 8 })
        );
        assert_eq!(check_workers(9, 8, true), Ok(9));
        assert_eq!(
            check_workers(65535, 8, true),
            Err(WorkersError::AboveLimit { asked: 65535 })
        );
        assert_eq!(check_workers(0, 8, true), Err(WorkersError::Zero));
        let msg = WorkersError::MoreThanCores { asked: 9, cores: 8 }.to_string();
        assert!(
            msg.contains("8 cores") && msg.contains("--allow-oversubscribe"),
            "{msg}"
        );
    }
}
