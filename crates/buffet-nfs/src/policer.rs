//! Policer: a per-tenant token bucket (FastPaas's policer), in bytes or packets.
//!
//! The bucket holds at most `burst` tokens and fills at `rate` tokens per second of
//! **packet time** (`PacketMeta::ts_ns`, never a clock). A packet costs its frame length
//! in tokens (`unit = "bytes"`) or one token (`unit = "packets"`); it passes and spends
//! them when the bucket holds enough, otherwise it is dropped with
//! [`DropCause::RateLimited`] and spends nothing. The bucket starts full at the tenant's
//! first packet. A timestamp earlier than the latest one seen adds no tokens (time never
//! runs backwards for the bucket). A frame longer than `burst` bytes can never pass in
//! byte mode.
//!
//! Arithmetic is exact integer arithmetic in token-nanoseconds (`u128`), so the result
//! depends only on the packets and their timestamps.
//!
//! Policy (TOML):
//! ```toml
//! [tenant.policy]
//! rate = 1_250_000      # tokens per second (here 10 Mbit/s of frames)
//! burst = 15_000        # bucket depth in tokens
//! unit = "bytes"        # optional: "bytes" (default) or "packets"
//! ```

use buffet_sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, Verdict};
use serde::Deserialize;

const NS_PER_SEC: u128 = 1_000_000_000;

/// What one token is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicerUnit {
    /// One byte of frame.
    #[default]
    Bytes,
    /// One packet.
    Packets,
}

/// A tenant's Policer policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicerPolicy {
    /// Tokens added per second; at least 1.
    pub rate: u64,
    /// Bucket depth in tokens; at least 1.
    pub burst: u64,
    /// Bytes (default) or packets.
    #[serde(default)]
    pub unit: PolicerUnit,
}

/// Counters of one tenant's policer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicerCounters {
    /// Packets within the rate.
    pub passed: u64,
    /// Frame bytes within the rate.
    pub passed_bytes: u64,
    /// Packets over the rate (dropped).
    pub dropped: u64,
    /// Frame bytes over the rate.
    pub dropped_bytes: u64,
}

/// One tenant's token bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u64,
    unit: PolicerUnit,
    /// Capacity in token-nanoseconds (`burst * 10^9`).
    cap: u128,
    /// Current content in token-nanoseconds.
    credit: u128,
    last_ns: u64,
    started: bool,
    counters: PolicerCounters,
}

impl TokenBucket {
    /// A full bucket for `policy`.
    pub fn from_policy(policy: &PolicerPolicy) -> Result<Self, InitError> {
        if policy.rate == 0 {
            return Err(InitError::invalid(
                "rate",
                "must be at least 1 token per second",
            ));
        }
        if policy.burst == 0 {
            return Err(InitError::invalid("burst", "must be at least 1 token"));
        }
        let cap = u128::from(policy.burst) * NS_PER_SEC;
        Ok(TokenBucket {
            rate: policy.rate,
            unit: policy.unit,
            cap,
            credit: cap,
            last_ns: 0,
            started: false,
            counters: PolicerCounters::default(),
        })
    }

    /// Polices one packet. Never allocates.
    #[inline]
    pub fn process(&mut self, pkt: &Packet<'_>) -> Verdict {
        let now = pkt.meta().ts_ns;
        if !self.started {
            self.started = true;
            self.last_ns = now;
        } else if now > self.last_ns {
            let added = u128::from(now - self.last_ns) * u128::from(self.rate);
            self.credit = self.credit.saturating_add(added).min(self.cap);
            self.last_ns = now;
        }
        let len = pkt.len() as u64;
        let tokens = match self.unit {
            PolicerUnit::Bytes => len,
            PolicerUnit::Packets => 1,
        };
        let cost = u128::from(tokens) * NS_PER_SEC;
        if self.credit >= cost {
            self.credit -= cost;
            self.counters.passed += 1;
            self.counters.passed_bytes += len;
            Verdict::Pass
        } else {
            self.counters.dropped += 1;
            self.counters.dropped_bytes += len;
            Verdict::Drop(DropCause::RateLimited)
        }
    }

    /// Whole tokens in the bucket now.
    pub fn tokens(&self) -> u64 {
        (self.credit / NS_PER_SEC) as u64
    }

    /// The counters.
    pub fn counters(&self) -> &PolicerCounters {
        &self.counters
    }

    /// Named counters, as `summary()` reports them.
    pub fn summary(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        vec![
            ("passed", c.passed),
            ("passed_bytes", c.passed_bytes),
            ("dropped", c.dropped),
            ("dropped_bytes", c.dropped_bytes),
            ("tokens", self.tokens()),
        ]
    }
}

/// The Policer NF (multi-tenant).
#[derive(Clone, Copy, Debug, Default)]
pub struct Policer;

impl NetworkFunction for Policer {
    type State = TokenBucket;
    type Policy = PolicerPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "policer"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec::of::<TokenBucket>()
    }

    fn init(&self, policy: &PolicerPolicy, state: &mut TokenBucket) -> Result<(), InitError> {
        *state = TokenBucket::from_policy(policy)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut TokenBucket) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &TokenBucket) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant Policer: the same logic over one plain bucket, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantPolicer {
    /// The one tenant's bucket.
    pub bucket: TokenBucket,
}

impl SingleTenantPolicer {
    /// A policer enforcing `policy`.
    pub fn new(policy: &PolicerPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantPolicer {
            bucket: TokenBucket::from_policy(policy)?,
        })
    }

    /// Processes one packet.
    #[inline]
    pub fn handle(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        self.bucket.process(pkt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_sdk::PacketMeta;
    use etherparse::PacketBuilder;

    const MS: u64 = 1_000_000;
    const LIMITED: Verdict = Verdict::Drop(DropCause::RateLimited);

    /// A UDP frame of exactly `len` bytes.
    fn frame(len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([192, 168, 0, 1], [192, 168, 0, 2], 64)
            .udp(1000, 2000)
            .write(&mut v, &vec![0u8; len - 42])
            .unwrap();
        assert_eq!(v.len(), len);
        v
    }

    fn run(st: &mut TokenBucket, bytes: &[u8], ts_ns: u64) -> Verdict {
        let mut b = bytes.to_vec();
        let meta = PacketMeta {
            ts_ns,
            ..Default::default()
        };
        let mut p = Packet::parse(&mut b, meta).unwrap();
        Policer.handle(&mut p, st)
    }

    fn bucket(toml_text: &str) -> TokenBucket {
        let p: PolicerPolicy = toml::from_str(toml_text).unwrap();
        let mut st = TokenBucket::default();
        Policer.init(&p, &mut st).unwrap();
        st
    }

    #[test]
    fn packet_mode_allows_the_burst_then_the_rate() {
        let mut st = bucket("rate = 1000\nburst = 10\nunit = \"packets\"");
        let f = frame(100);
        let t0 = 7_000 * MS;
        let first: Vec<_> = (0..20).map(|_| run(&mut st, &f, t0)).collect();
        assert_eq!(first.iter().filter(|v| v.is_pass()).count(), 10);
        assert_eq!(first[10], LIMITED);
        // 5 ms later: 5 tokens.
        let later: Vec<_> = (0..10).map(|_| run(&mut st, &f, t0 + 5 * MS)).collect();
        assert_eq!(later.iter().filter(|v| v.is_pass()).count(), 5);
        // A long pause refills to the burst, not beyond.
        let after: Vec<_> = (0..20)
            .map(|_| run(&mut st, &f, t0 + 60_000 * MS))
            .collect();
        assert_eq!(after.iter().filter(|v| v.is_pass()).count(), 10);
        let c = *st.counters();
        assert_eq!((c.passed, c.dropped), (25, 25));
        assert_eq!(c.dropped_bytes, 25 * 100);
    }

    #[test]
    fn byte_mode_charges_frame_length_and_refills_fractionally() {
        // 1 MB/s: one byte per microsecond.
        let mut st = bucket("rate = 1_000_000\nburst = 3000");
        let big = frame(1500);
        assert!(run(&mut st, &big, 0).is_pass());
        assert!(run(&mut st, &big, 0).is_pass());
        assert_eq!(run(&mut st, &big, 0), LIMITED);
        assert_eq!(st.tokens(), 0);
        // 1499 µs later: one byte short.
        assert_eq!(run(&mut st, &big, 1_499_000), LIMITED);
        // Fractions of a token accumulate: 999 ns + 1 ns is one byte.
        assert_eq!(run(&mut st, &big, 1_499_999), LIMITED);
        assert!(run(&mut st, &big, 1_500_000).is_pass());
        // A small frame fits where a big one did not.
        assert_eq!(run(&mut st, &big, 1_564_000), LIMITED);
        assert!(run(&mut st, &frame(64), 1_564_000).is_pass());
        // A frame larger than the burst never passes.
        let mut tiny = bucket("rate = 1_000_000\nburst = 1000");
        assert_eq!(run(&mut tiny, &big, 0), LIMITED);
        assert_eq!(run(&mut tiny, &big, 10_000 * MS), LIMITED);
    }

    #[test]
    fn timestamps_going_backwards_add_nothing() {
        let mut st = bucket("rate = 1000\nburst = 2\nunit = \"packets\"");
        let f = frame(64);
        assert!(run(&mut st, &f, 10 * MS).is_pass());
        assert!(run(&mut st, &f, 10 * MS).is_pass());
        assert_eq!(run(&mut st, &f, 0), LIMITED);
        assert_eq!(run(&mut st, &f, 10 * MS), LIMITED);
        assert!(run(&mut st, &f, 11 * MS).is_pass());
    }

    #[test]
    fn huge_rates_and_gaps_do_not_overflow() {
        let mut st = bucket(&format!("rate = {}\nburst = {}", i64::MAX, i64::MAX));
        let f = frame(64);
        assert!(run(&mut st, &f, 0).is_pass());
        assert!(run(&mut st, &f, u64::MAX).is_pass());
        assert!(st.tokens() > 0);
    }

    #[test]
    fn truncated_frames_never_reach_or_panic_the_policer() {
        let good = frame(200);
        let mut st = bucket("rate = 10\nburst = 1\nunit = \"packets\"");
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            if let Ok(mut p) = Packet::parse(&mut b, PacketMeta::default()) {
                Policer.handle(&mut p, &mut st);
            }
        }
        assert_eq!(*st.counters(), PolicerCounters::default());
    }

    #[test]
    fn invalid_policies_name_the_field() {
        for (text, field) in [
            ("rate = 0\nburst = 10", "rate"),
            ("rate = 10\nburst = 0", "burst"),
        ] {
            let p: PolicerPolicy = toml::from_str(text).unwrap();
            let e = Policer
                .init(&p, &mut TokenBucket::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{field}`")), "{text}: {e}");
        }
        for bad in [
            "rate = 10\nburst = 1\nunit = \"bits\"",
            "rate = 10",
            "rate = -1\nburst = 1",
            "rate = 10\nburst = 1\nceil = 3",
        ] {
            assert!(toml::from_str::<PolicerPolicy>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_policy_and_state() {
        // The same 192.168.0.0/16 frames, two buckets with different rates.
        let mut a = bucket("rate = 1000\nburst = 3\nunit = \"packets\"");
        let mut b = bucket("rate = 1000\nburst = 1000\nunit = \"bytes\"");
        let f = frame(300);
        let va: Vec<_> = (0..5).map(|_| run(&mut a, &f, 0).is_pass()).collect();
        let vb: Vec<_> = (0..5).map(|_| run(&mut b, &f, 0).is_pass()).collect();
        assert_eq!(va, [true, true, true, false, false]);
        assert_eq!(vb, [true, true, true, false, false]);
        // Draining one bucket leaves the other untouched.
        let va2: Vec<_> = (0..2).map(|_| run(&mut a, &f, MS).is_pass()).collect();
        assert_eq!(va2, [true, false]);
        assert_eq!((a.counters().passed, b.counters().passed), (4, 3));
        assert_eq!((a.tokens(), b.tokens()), (0, 100));
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let policy: PolicerPolicy =
            toml::from_str("rate = 100\nburst = 2\nunit = \"packets\"").unwrap();
        let mut single = SingleTenantPolicer::new(&policy).unwrap();
        let mut st = TokenBucket::default();
        Policer.init(&policy, &mut st).unwrap();
        for i in 0..10u64 {
            let f = frame(64);
            let mut b = f.clone();
            let meta = PacketMeta {
                ts_ns: i * MS,
                ..Default::default()
            };
            let mut p = Packet::parse(&mut b, meta).unwrap();
            assert_eq!(single.handle(&mut p), run(&mut st, &f, i * MS));
        }
        assert_eq!(single.bucket, st);
    }
}
