//! What the bench binaries without criterion (`dispatch_latency`, `procs`) share: their
//! settings from the environment and the percentiles they report. Included with
//! `#[path]`; not a crate.

/// The environment variable `name` parsed, or `default` when unset. A value that is set
/// but does not parse stops the bench with a message naming the variable, rather than
/// running a measurement the user did not ask for.
pub fn env_or<T>(name: &str, default: T) -> T
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => default,
        Err(std::env::VarError::NotUnicode(v)) => panic!("{name}: {v:?} is not UTF-8"),
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {v:?} does not parse ({e})")),
    }
}

/// The `p` quantile (0..=1) of sorted samples, nearest rank; NaN without samples.
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64
}
