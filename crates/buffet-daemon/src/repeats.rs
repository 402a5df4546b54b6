//! Repeated error lines, printed once per period with a count instead of on every
//! occurrence. The data plane retries a failing port every 10 ms; without this, a port
//! whose receive or send keeps failing would print a hundred lines a second, burying
//! every other line of the log. (An interface that goes down is said once by the kernel
//! and printed as it comes, not through this.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often, at most, one message is printed while it repeats.
pub const REPEAT_PERIOD: Duration = Duration::from_secs(10);

/// Distinct messages remembered at once; the one printed longest ago is forgotten first
/// (a forgotten message that comes back is printed again at once).
const REMEMBERED: usize = 64;

/// One message's record: when it was last printed and how often it came since.
struct Seen {
    printed: Instant,
    since: u64,
}

/// Which lines of a stream of messages to print: each distinct message the first time it
/// comes; then, while it repeats, at most once per [`REPEAT_PERIOD`] with the number of
/// times it came since it was last printed. Other messages are unaffected: each has its own
/// record. [`finish`](Self::finish) gives the counts not yet printed.
pub struct RepeatedLines {
    period: Duration,
    seen: HashMap<String, Seen>,
}

impl Default for RepeatedLines {
    fn default() -> Self {
        Self::new(REPEAT_PERIOD)
    }
}

impl RepeatedLines {
    /// Messages repeat at most once per `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            seen: HashMap::new(),
        }
    }

    /// `msg` came at `now`: the lines to print (none while it repeats within the period;
    /// with a message forgotten to make room, that message's count not yet printed).
    pub fn lines(&mut self, msg: &str, now: Instant) -> Vec<String> {
        if let Some(s) = self.seen.get_mut(msg) {
            s.since += 1;
            let elapsed = now.saturating_duration_since(s.printed);
            if elapsed < self.period {
                return Vec::new();
            }
            let line = format!(
                "{msg} (came {} in the last {})",
                times(s.since),
                seconds(elapsed)
            );
            *s = Seen {
                printed: now,
                since: 0,
            };
            return vec![line];
        }
        let mut out = Vec::new();
        if self.seen.len() >= REMEMBERED {
            // The one printed longest ago, preferring one with nothing left to say.
            let oldest = self
                .seen
                .iter()
                .min_by_key(|(_, s)| (s.since > 0, s.printed))
                .map(|(m, _)| m.clone());
            if let Some((m, s)) = oldest.and_then(|m| self.seen.remove_entry(&m)) {
                if s.since > 0 {
                    out.push(more_line(&m, &s, now));
                }
            }
        }
        self.seen.insert(
            msg.to_owned(),
            Seen {
                printed: now,
                since: 0,
            },
        );
        out.push(msg.to_owned());
        out
    }

    /// The lines for messages that came again after they were last printed (at the end of
    /// the stream, so that no occurrence goes uncounted), in the order they were printed.
    pub fn finish(&mut self, now: Instant) -> Vec<String> {
        let mut left: Vec<(String, Seen)> =
            self.seen.drain().filter(|(_, s)| s.since > 0).collect();
        left.sort_by_key(|(_, s)| s.printed);
        left.into_iter()
            .map(|(msg, s)| more_line(&msg, &s, now))
            .collect()
    }
}

/// `msg` came `s.since` more times after it was last printed.
fn more_line(msg: &str, s: &Seen, now: Instant) -> String {
    format!(
        "{msg} (came {} in the last {})",
        more_times(s.since),
        seconds(now.saturating_duration_since(s.printed))
    )
}

fn times(n: u64) -> String {
    if n == 1 {
        "once".into()
    } else {
        format!("{n} times")
    }
}

fn more_times(n: u64) -> String {
    if n == 1 {
        "once more".into()
    } else {
        format!("{n} more times")
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_message_that_repeats_every_10_ms_prints_once_per_period_with_its_count() {
        let t0 = Instant::now();
        let mut r = RepeatedLines::new(Duration::from_secs(10));
        let msg = "port 1 (afpacket on veth0): receive: Network is down";
        let printed: Vec<(u64, String)> = (0..=3000u64)
            .flat_map(|i| {
                r.lines(msg, at(t0, i * 10))
                    .into_iter()
                    .map(move |l| (i * 10, l))
            })
            .collect();
        assert_eq!(
            printed,
            vec![
                (0, msg.to_owned()),
                (
                    10_000,
                    format!("{msg} (came 1000 times in the last 10.0 s)")
                ),
                (
                    20_000,
                    format!("{msg} (came 1000 times in the last 10.0 s)")
                ),
                (
                    30_000,
                    format!("{msg} (came 1000 times in the last 10.0 s)")
                ),
            ]
        );
        assert!(
            r.finish(at(t0, 30_005)).is_empty(),
            "every occurrence was printed"
        );
    }

    #[test]
    fn each_message_has_its_own_record_and_the_rest_is_counted_at_the_end() {
        let t0 = Instant::now();
        let mut r = RepeatedLines::new(Duration::from_secs(10));
        assert_eq!(r.lines("a", at(t0, 0)), ["a"]);
        assert_eq!(r.lines("b", at(t0, 1)), ["b"]);
        assert!(r.lines("a", at(t0, 2)).is_empty());
        assert!(r.lines("b", at(t0, 3)).is_empty());
        assert!(r.lines("a", at(t0, 4)).is_empty());
        assert_eq!(r.lines("c", at(t0, 5)), ["c"]);
        assert_eq!(
            r.finish(at(t0, 2_500)),
            vec![
                "a (came 2 more times in the last 2.5 s)".to_owned(),
                "b (came once more in the last 2.5 s)".to_owned(),
            ]
        );
    }

    #[test]
    fn a_forgotten_message_is_printed_again_and_memory_stays_bounded() {
        let t0 = Instant::now();
        let mut r = RepeatedLines::new(Duration::from_secs(10));
        for i in 0..REMEMBERED as u64 + 10 {
            assert_eq!(r.lines(&format!("m{i}"), at(t0, i)), [format!("m{i}")]);
            assert!(r.seen.len() <= REMEMBERED);
        }
        // m0 was printed longest ago and forgotten; the newest is still remembered.
        assert_eq!(r.lines("m0", at(t0, 100)), ["m0"]);
        let newest = format!("m{}", REMEMBERED as u64 + 9);
        assert!(r.lines(&newest, at(t0, 101)).is_empty());
    }

    #[test]
    fn a_message_forgotten_with_a_count_not_yet_printed_says_it_first() {
        let t0 = Instant::now();
        let mut r = RepeatedLines::new(Duration::from_secs(10));
        // Every remembered message has come again since it was printed.
        for i in 0..REMEMBERED as u64 {
            let m = format!("m{i}");
            assert_eq!(r.lines(&m, at(t0, i)), std::slice::from_ref(&m));
            assert!(r.lines(&m, at(t0, 1000 + i)).is_empty());
        }
        assert_eq!(
            r.lines("new", at(t0, 2000)),
            ["m0 (came once more in the last 2.0 s)", "new"]
        );
        assert_eq!(r.finish(at(t0, 2000)).len(), REMEMBERED - 1);
    }
}
