//! Capacity limits the command puts on its arguments, so that a typo cannot ask for
//! minutes of CPU and gigabytes of memory: the number of workers.
//!
//! Every worker is a thread polling its ring (it spins while idle) and owns its rings
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
