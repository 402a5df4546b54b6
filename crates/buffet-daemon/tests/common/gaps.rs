//! The largest traffic gap of running tenants, seen from outside: a sampler polls
//! `GET /v1/stats` and records the longest interval in which one of the watched tenants'
//! packet counters did not advance. Shared by the API tests and the `measure` example.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What the sampler saw while the work ran.
#[derive(Clone, Copy, Debug)]
pub struct Gaps {
    /// Longest interval in which one watched tenant's counter did not advance (an upper
    /// bound on the real gap, at the sampler's resolution).
    pub worst: Duration,
    /// Polls made.
    pub samples: u64,
    /// The slowest poll (the sampler's own resolution at its worst).
    pub worst_poll: Duration,
    /// What the work returned (its duration).
    pub took: Duration,
}

/// The packet counters of tenants `ids`, in that order (0 for a tenant not listed).
pub fn packets(agent: &ureq::Agent, base: &str, token: &str, ids: &[u64]) -> Vec<u64> {
    let v: Value = agent
        .get(&format!("{base}/v1/stats"))
        .set("Authorization", &format!("Bearer {token}"))
        .call()
        .expect("GET /v1/stats")
        .into_json()
        .expect("stats JSON");
    let rows = v["tenants"].as_array().cloned().unwrap_or_default();
    ids.iter()
        .map(|id| {
            rows.iter()
                .find(|t| t["id"].as_u64() == Some(*id))
                .and_then(|t| t["packets"].as_u64())
                .unwrap_or(0)
        })
        .collect()
}

/// Polls tenants `ids`' packet counters at `base` while `work` runs.
pub fn sample_gaps(base: &str, token: &str, ids: &[u64], work: impl FnOnce() -> Duration) -> Gaps {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, base, token, ids) = (
            stop.clone(),
            base.to_owned(),
            token.to_owned(),
            ids.to_vec(),
        );
        std::thread::spawn(move || {
            let agent = ureq::AgentBuilder::new().build();
            let mut last = packets(&agent, &base, &token, &ids);
            let mut since = vec![Instant::now(); last.len()];
            let (mut worst, mut samples, mut worst_poll) = (Duration::ZERO, 0u64, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let now = packets(&agent, &base, &token, &ids);
                worst_poll = worst_poll.max(t.elapsed());
                samples += 1;
                for (i, (&n, &l)) in now.iter().zip(&last).enumerate() {
                    if n > l {
                        worst = worst.max(since[i].elapsed());
                        since[i] = Instant::now();
                    }
                }
                last = now;
            }
            // A tenant that never advanced again counts up to the end.
            for s in since {
                worst = worst.max(s.elapsed());
            }
            (worst, samples, worst_poll)
        })
    };
    let took = work();
    stop.store(true, Ordering::Relaxed);
    let (worst, samples, worst_poll) = sampler.join().expect("the sampler");
    Gaps {
        worst,
        samples,
        worst_poll,
        took,
    }
}
