//! A Zipf-skewed choice over `0..n`, for traces where a few tenants send most packets and
//! a long tail sends few (the FastPaas paper's per-AS traffic, the Buffet paper's
//! skewed tenants).
//!
//! Rank `k` (0-based) has weight `1 / (k + 1)^s`; sampling inverts the cumulative
//! distribution by binary search over a table built once (O(n) memory, O(log n) per
//! draw), driven by a seeded [`Rng`], so one seed gives one trace. What it does not do:
//! build frames or timestamps — each benchmark turns the drawn ranks into its own traffic.

use crate::Rng;

/// Zipf(`s`) over `0..n`.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `0..n` (`n` at least 1) with exponent `s` (1.0: classic Zipf).
    ///
    /// # Panics
    /// When `n` is 0 or `s` is negative or not finite: a trace needs at least one rank.
    pub fn new(n: u32, s: f64) -> Zipf {
        assert!(n > 0, "Zipf over 0 ranks");
        assert!(
            s.is_finite() && s >= 0.0,
            "Zipf exponent {s} is not a finite s >= 0"
        );
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += f64::from(k).powf(-s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf { cdf }
    }

    /// Number of ranks.
    pub fn len(&self) -> u32 {
        self.cdf.len() as u32
    }

    /// Always false: a distribution has at least one rank.
    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// The probability of rank `k` (0 outside `0..n`).
    pub fn probability(&self, k: u32) -> f64 {
        let k = k as usize;
        match k {
            0 => self.cdf.first().copied().unwrap_or(0.0),
            _ if k < self.cdf.len() => self.cdf[k] - self.cdf[k - 1],
            _ => 0.0,
        }
    }

    /// One rank drawn with `r`.
    #[inline]
    pub fn sample(&self, r: &mut Rng) -> u32 {
        let u = r.unit();
        (self.cdf.partition_point(|&c| c <= u) as u32).min(self.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_follow_the_weights() {
        let z = Zipf::new(1000, 1.0);
        let mut r = Rng::new(7);
        let draws = 400_000;
        let mut hits = vec![0u32; 1000];
        for _ in 0..draws {
            hits[z.sample(&mut r) as usize] += 1;
        }
        // H(1000) = 7.4855: rank 0 has 13.36 %, rank 1 half of it, rank 9 a tenth.
        for k in [0u32, 1, 9] {
            let want = z.probability(k);
            let got = f64::from(hits[k as usize]) / f64::from(draws);
            assert!(
                (got - want).abs() < 0.05 * want,
                "rank {k}: {got} vs {want}"
            );
        }
        assert!((z.probability(0) - 1.0 / 7.4855).abs() < 1e-4);
        // The tail is reached: most ranks are drawn at least once.
        assert!(hits.iter().filter(|&&h| h > 0).count() > 900);
    }

    #[test]
    fn exponent_zero_is_uniform_and_one_rank_is_always_drawn() {
        let z = Zipf::new(4, 0.0);
        for k in 0..4 {
            assert!((z.probability(k) - 0.25).abs() < 1e-12);
        }
        assert_eq!(z.probability(4), 0.0);
        let one = Zipf::new(1, 1.0);
        let mut r = Rng::new(1);
        assert!((0..100).all(|_| one.sample(&mut r) == 0));
    }

    #[test]
    fn one_seed_one_trace() {
        let z = Zipf::new(1000, 1.0);
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        let x: Vec<u32> = (0..64).map(|_| z.sample(&mut a)).collect();
        let y: Vec<u32> = (0..64).map(|_| z.sample(&mut b)).collect();
        assert_eq!(x, y);
    }
}
