//! Tuple-space search: which (mask, value) rule matches a key best, without a linear scan.
//!
//! A rule that matches "these bits of the key equal these values" is a (mask, value) pair:
//! a key matches when `key & mask == value`. Rules with wildcards, prefixes or port ranges
//! become one or more such pairs (a port range expands into aligned power-of-two blocks,
//! see [`PortRange::prefixes`](crate::policy::PortRange::prefixes)). [`TupleSpace`]
//! groups the pairs by mask: each distinct mask is a *tuple* holding a hash map from
//! masked value to the best entry with that value. A lookup masks the key once per tuple
//! and probes that tuple's map; it never visits a rule that cannot match.
//!
//! **Best** is the entry type's [`Ord`]: the *lowest* entry wins. An entry is whatever
//! identifies a rule and ranks it: a rule index for "first rule in order wins", a
//! `(priority, insertion sequence, payload)` triple for OpenFlow-like priorities, or
//! `(Reverse(prefix length), index)` for a longest-prefix match. Equal entries are never
//! told apart, so make entries unique if ties matter.
//!
//! Tuples are kept sorted by the best entry each holds, so a lookup stops as soon as the
//! best match found so far is no worse than everything the remaining tuples hold: with
//! few, well-ranked tuples most lookups probe one or two hash maps.
//!
//! What it does:
//! * [`TupleSpace::lookup`] takes `&self`, never allocates and never panics; its cost is
//!   at most one mask and one hash probe per tuple.
//! * [`TupleSpace::insert`] and [`TupleSpace::remove`] keep every entry, so removing the
//!   best entry of a value brings back the next best; they allocate (they are control
//!   path operations).
//!
//! What it does not do: no key extraction from packets (the caller builds its key type and
//! implements [`MaskedKey`] for it), no range matching other than through masks, no
//! caching of whole-key results (put an exact-match cache in front if lookups repeat), and
//! no locking (wrap it as the caller's concurrency model requires).
//!
//! The maps use Fx hashing by default (fast and unkeyed): their keys come from rules, and
//! packets only probe them. Choose another [`BuildHasher`] with the third type parameter.
//!
//! # Example
//!
//! Destination-prefix rules over IPv4 addresses (`u32` keys), where the lowest rule number
//! wins:
//!
//! ```
//! use buffet_sdk::tss::TupleSpace;
//!
//! let prefix = |a: [u8; 4], len: u32| {
//!     let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
//!     (mask, u32::from_be_bytes(a) & mask)
//! };
//! let mut rules: TupleSpace<u32, u32> = TupleSpace::new();
//! let (mask, value) = prefix([10, 1, 0, 0], 16);
//! rules.insert(mask, value, 0); // rule 0: 10.1.0.0/16
//! let (mask, value) = prefix([10, 0, 0, 0], 8);
//! rules.insert(mask, value, 1); // rule 1: 10.0.0.0/8
//! let (mask, value) = prefix([0, 0, 0, 0], 0);
//! rules.insert(mask, value, 2); // rule 2: everything
//!
//! let addr = |a: [u8; 4]| u32::from_be_bytes(a);
//! assert_eq!(rules.lookup(&addr([10, 1, 2, 3])), Some(0));
//! assert_eq!(rules.lookup(&addr([10, 9, 2, 3])), Some(1));
//! assert_eq!(rules.lookup(&addr([192, 0, 2, 1])), Some(2));
//! assert_eq!(rules.tuple_count(), 3);
//!
//! // Removing rule 1 leaves 10.9.2.3 to the catch-all.
//! let (mask, value) = prefix([10, 0, 0, 0], 8);
//! assert!(rules.remove(&mask, &value, &1));
//! assert_eq!(rules.lookup(&addr([10, 9, 2, 3])), Some(2));
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// The default hasher of [`TupleSpace`]: Fx (`rustc-hash`; fast, unkeyed).
pub use rustc_hash::FxBuildHasher;

/// A key type a [`TupleSpace`] can search: a fixed-width value whose bits can be masked.
///
/// The same type serves as key, mask and masked value. Implemented for the unsigned
/// integers and for arrays of them; implement it for a struct by masking each field.
///
/// ```
/// use buffet_sdk::tss::MaskedKey;
///
/// #[derive(Clone, Copy, PartialEq, Eq, Hash)]
/// struct FiveTuple { src: u32, dst: u32, ports: [u16; 2], proto: u8 }
///
/// impl MaskedKey for FiveTuple {
///     fn masked(&self, m: &Self) -> Self {
///         FiveTuple {
///             src: self.src.masked(&m.src),
///             dst: self.dst.masked(&m.dst),
///             ports: self.ports.masked(&m.ports),
///             proto: self.proto.masked(&m.proto),
///         }
///     }
/// }
/// ```
pub trait MaskedKey: Copy + Eq + Hash {
    /// `self` with only the bits set in `mask` kept (a bitwise and, field by field).
    fn masked(&self, mask: &Self) -> Self;
}

macro_rules! masked_key_uint {
    ($($t:ty),*) => {$(
        impl MaskedKey for $t {
            #[inline]
            fn masked(&self, mask: &Self) -> Self {
                self & mask
            }
        }
    )*};
}
masked_key_uint!(u8, u16, u32, u64, u128, usize);

impl<T: MaskedKey, const N: usize> MaskedKey for [T; N] {
    #[inline]
    fn masked(&self, mask: &Self) -> Self {
        std::array::from_fn(|i| self[i].masked(&mask[i]))
    }
}

/// One tuple: the pairs sharing a mask.
#[derive(Clone)]
struct Tuple<K, E, S> {
    mask: K,
    /// The lowest entry in `best` (nothing in this tuple can beat it).
    best: E,
    /// Masked value -> the best entry with that value (the only one a lookup reads).
    map: HashMap<K, E, S>,
    /// Masked value -> the other entries with that value, kept for when the best goes.
    shadowed: HashMap<K, Vec<E>, S>,
}

/// Rules as (mask, value, entry) triples, searched by tuple space (see the module docs).
///
/// `K` is the key (and mask) type, `E` the entry: the lowest matching entry wins. `S`
/// hashes keys (Fx by default).
#[derive(Clone)]
pub struct TupleSpace<K, E, S = FxBuildHasher> {
    /// Sorted by `best`, ascending.
    tuples: Vec<Tuple<K, E, S>>,
    /// Mask -> index in `tuples`.
    by_mask: HashMap<K, usize, S>,
    /// Distinct (mask, value) pairs.
    values: usize,
    /// Entries, shadowed ones included.
    entries: usize,
}

impl<K, E, S> fmt::Debug for TupleSpace<K, E, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The maps can be large: show sizes, not contents.
        f.debug_struct("TupleSpace")
            .field("tuples", &self.tuples.len())
            .field("values", &self.values)
            .field("entries", &self.entries)
            .finish()
    }
}

impl<K, E, S: Default> Default for TupleSpace<K, E, S> {
    fn default() -> Self {
        TupleSpace {
            tuples: Vec::new(),
            by_mask: HashMap::default(),
            values: 0,
            entries: 0,
        }
    }
}

impl<K, E, S> TupleSpace<K, E, S>
where
    K: MaskedKey,
    E: Copy + Ord,
    S: BuildHasher + Default,
{
    /// An empty tuple space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `entry` for the keys `k` with `k & mask == value & mask` (bits of `value`
    /// outside `mask` are ignored). Several entries may share a (mask, value); the lowest
    /// is the one lookups see.
    pub fn insert(&mut self, mask: K, value: K, entry: E) {
        let value = value.masked(&mask);
        let ti = match self.by_mask.get(&mask) {
            Some(&i) => i,
            None => {
                self.tuples.push(Tuple {
                    mask,
                    best: entry,
                    map: HashMap::default(),
                    shadowed: HashMap::default(),
                });
                self.by_mask.insert(mask, self.tuples.len() - 1);
                self.tuples.len() - 1
            }
        };
        let t = &mut self.tuples[ti];
        match t.map.get_mut(&value) {
            None => {
                t.map.insert(value, entry);
                self.values += 1;
            }
            Some(best) => {
                let worse = if entry < *best {
                    std::mem::replace(best, entry)
                } else {
                    entry
                };
                t.shadowed.entry(value).or_default().push(worse);
            }
        }
        self.entries += 1;
        if entry < t.best {
            t.best = entry;
        }
        self.sift_up(ti);
    }

    /// Removes one entry equal to `entry` from (mask, value); false when there is none.
    /// When it was the value's best, the next best of that value takes its place.
    pub fn remove(&mut self, mask: &K, value: &K, entry: &E) -> bool {
        let value = value.masked(mask);
        let Some(&ti) = self.by_mask.get(mask) else {
            return false;
        };
        let t = &mut self.tuples[ti];
        let Some(best) = t.map.get_mut(&value) else {
            return false;
        };
        let was_best = *best == *entry;
        if was_best {
            let next = t.shadowed.get_mut(&value).and_then(|rest| {
                let (i, _) = rest.iter().enumerate().min_by_key(|&(_, e)| *e)?;
                Some(rest.swap_remove(i))
            });
            match next {
                Some(next) => {
                    *best = next;
                    if t.shadowed.get(&value).is_some_and(Vec::is_empty) {
                        t.shadowed.remove(&value);
                    }
                }
                None => {
                    t.map.remove(&value);
                    self.values -= 1;
                }
            }
        } else {
            let Some(rest) = t.shadowed.get_mut(&value) else {
                return false;
            };
            let Some(i) = rest.iter().position(|e| e == entry) else {
                return false;
            };
            rest.swap_remove(i);
            if rest.is_empty() {
                t.shadowed.remove(&value);
            }
        }
        self.entries -= 1;
        if !was_best || *entry > t.best {
            // The tuple's best is still there.
            return true;
        }
        match t.map.values().min() {
            Some(&b) => {
                t.best = b;
                self.sift_down(ti);
            }
            None => {
                self.tuples.remove(ti);
                self.by_mask.remove(mask);
                for (i, t) in self.tuples.iter().enumerate().skip(ti) {
                    self.by_mask.insert(t.mask, i);
                }
            }
        }
        true
    }

    /// The best entry for exactly (mask, value), if any: what a lookup would get from
    /// this pair. Not a lookup by key (see [`lookup`](Self::lookup)).
    pub fn get(&self, mask: &K, value: &K) -> Option<E> {
        let t = &self.tuples[*self.by_mask.get(mask)?];
        t.map.get(&value.masked(mask)).copied()
    }

    /// The lowest entry of every pair matching `key` (`key & mask == value`), or `None`.
    /// Never allocates; probes the tuples in order of their best entry and stops as soon
    /// as no remaining tuple can hold a lower entry than the one found.
    #[inline]
    pub fn lookup(&self, key: &K) -> Option<E> {
        let mut found: Option<E> = None;
        for t in &self.tuples {
            if found.is_some_and(|f| t.best >= f) {
                break;
            }
            if let Some(&e) = t.map.get(&key.masked(&t.mask)) {
                if found.is_none_or(|f| e < f) {
                    found = Some(e);
                }
            }
        }
        found
    }

    /// Number of tuples (distinct masks): the most hash probes a lookup makes.
    pub fn tuple_count(&self) -> usize {
        self.tuples.len()
    }

    /// Number of distinct (mask, value) pairs: the entries lookups can see.
    pub fn value_count(&self) -> usize {
        self.values
    }

    /// Number of entries, shadowed ones included.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.tuples.clear();
        self.by_mask.clear();
        self.values = 0;
        self.entries = 0;
    }

    /// Releases spare capacity of every map (for tables built once, then only read).
    pub fn shrink_to_fit(&mut self) {
        self.tuples.shrink_to_fit();
        self.by_mask.shrink_to_fit();
        for t in &mut self.tuples {
            t.map.shrink_to_fit();
            t.shadowed.shrink_to_fit();
        }
    }

    /// Moves tuple `i`, whose best went down, towards the front.
    fn sift_up(&mut self, mut i: usize) {
        while i > 0 && self.tuples[i - 1].best > self.tuples[i].best {
            self.swap(i - 1, i);
            i -= 1;
        }
    }

    /// Moves tuple `i`, whose best went up, towards the back.
    fn sift_down(&mut self, mut i: usize) {
        while i + 1 < self.tuples.len() && self.tuples[i + 1].best < self.tuples[i].best {
            self.swap(i, i + 1);
            i += 1;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.tuples.swap(a, b);
        self.by_mask.insert(self.tuples[a].mask, a);
        self.by_mask.insert(self.tuples[b].mask, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// The reference: the lowest entry of every live triple whose masked value matches.
    /// (mask, value, entry): entries tie on the priority byte, the sequence breaks ties.
    type Triple = ([u16; 2], [u16; 2], (u8, u32));

    fn linear(rules: &[Triple], key: &[u16; 2]) -> Option<(u8, u32)> {
        rules
            .iter()
            .filter(|(m, v, _)| key.masked(m) == v.masked(m))
            .map(|&(_, _, e)| e)
            .min()
    }

    /// A mask of `len` leading ones on 16 bits, from a small set so tuples are shared.
    fn mask16(rng: &mut u64) -> u16 {
        let len = [0u32, 4, 8, 12, 15, 16][(xorshift(rng) % 6) as usize];
        if len == 0 {
            0
        } else {
            u16::MAX << (16 - len)
        }
    }

    #[test]
    fn agrees_with_a_linear_scan_through_inserts_and_removes() {
        for seed in 1..=40u64 {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut tss: TupleSpace<[u16; 2], (u8, u32)> = TupleSpace::new();
            let mut live: Vec<Triple> = Vec::new();
            // Values and keys from a small pool, so masks collide, values repeat and
            // entries shadow each other.
            let pool = |rng: &mut u64| (xorshift(rng) % 8) as u16 * 0x2111;
            for step in 0..300u32 {
                if live.is_empty() || xorshift(&mut rng) % 3 != 0 {
                    let m = [mask16(&mut rng), mask16(&mut rng)];
                    let v = [pool(&mut rng), pool(&mut rng)];
                    // Priorities tie often; the sequence number breaks ties.
                    let e = ((xorshift(&mut rng) % 4) as u8, step);
                    tss.insert(m, v, e);
                    live.push((m, v, e));
                } else {
                    let i = (xorshift(&mut rng) % live.len() as u64) as usize;
                    let (m, v, e) = live.swap_remove(i);
                    assert!(tss.remove(&m, &v, &e), "seed {seed} step {step}");
                    assert!(!tss.remove(&m, &v, &e), "removed twice");
                }
                assert_eq!(tss.len(), live.len());
                for _ in 0..20 {
                    let key = [pool(&mut rng) ^ 1, pool(&mut rng)];
                    assert_eq!(
                        tss.lookup(&key),
                        linear(&live, &key),
                        "seed {seed} step {step} key {key:?}"
                    );
                }
                // Tuples stay sorted by their best entry, which is their lowest one.
                for w in tss.tuples.windows(2) {
                    assert!(w[0].best <= w[1].best);
                }
                for t in &tss.tuples {
                    assert_eq!(Some(&t.best), t.map.values().min());
                    assert_eq!(
                        tss.by_mask[&t.mask],
                        tss.tuples.iter().position(|u| u.mask == t.mask).unwrap()
                    );
                }
            }
            while let Some((m, v, e)) = live.pop() {
                assert!(tss.remove(&m, &v, &e));
            }
            assert!(tss.is_empty());
            assert_eq!((tss.tuple_count(), tss.value_count()), (0, 0));
        }
    }

    #[test]
    fn value_bits_outside_the_mask_are_ignored_and_get_reads_one_pair() {
        let mut tss: TupleSpace<u32, u32> = TupleSpace::new();
        tss.insert(0xffff_0000, 0x0a01_ffff, 7);
        assert_eq!(tss.get(&0xffff_0000, &0x0a01_0000), Some(7));
        assert_eq!(tss.get(&0xff00_0000, &0x0a00_0000), None);
        assert_eq!(tss.lookup(&0x0a01_0203), Some(7));
        tss.insert(0xffff_0000, 0x0a01_0000, 3);
        assert_eq!((tss.len(), tss.value_count()), (2, 1));
        assert_eq!(tss.lookup(&0x0a01_0203), Some(3));
        assert!(!tss.remove(&0xffff_0000, &0x0a01_0000, &9));
        assert!(tss.remove(&0xffff_0000, &0x0a01_0000, &3));
        assert_eq!(tss.lookup(&0x0a01_0203), Some(7));
        tss.clear();
        assert_eq!(tss.lookup(&0x0a01_0203), None);
    }
}
