//! Connection tracking: a fixed-capacity, open-addressed table of allowed flows (the
//! module doc of [`super`] gives the policy side). It does not look at the ACL.

use std::hash::Hash;

use rustc_hash::FxBuildHasher;

use super::acl::AclKey;
use super::CONN_PROBE_WINDOW;

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ConnSlot {
    key: AclKey,
    last_ns: u64,
    used: bool,
}

/// A fixed-capacity table of allowed flows (see the module doc).
#[derive(Debug, Default)]
pub struct ConnTable {
    slots: Vec<ConnSlot>,
    mask: usize,
    timeout_ns: u64,
    evictions: u64,
}

impl ConnTable {
    /// Room for `capacity` flows (rounded up to a power of two, at least the probe
    /// window); a flow expires `timeout_ns` after it was last seen.
    pub fn new(capacity: usize, timeout_ns: u64) -> Self {
        let cap = capacity.max(CONN_PROBE_WINDOW).next_power_of_two();
        ConnTable {
            slots: vec![ConnSlot::default(); cap],
            mask: cap - 1,
            timeout_ns,
            evictions: 0,
        }
    }

    #[inline]
    fn live(&self, s: &ConnSlot, now: u64) -> bool {
        s.used && now.saturating_sub(s.last_ns) <= self.timeout_ns
    }

    /// If `key` is tracked and alive, refreshes it and returns true.
    #[inline]
    pub(super) fn touch(&mut self, key: &AclKey, now: u64) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let start = hash_of(key) & self.mask;
        for i in 0..CONN_PROBE_WINDOW {
            let idx = (start + i) & self.mask;
            let s = self.slots[idx];
            if s.used && s.key == *key {
                if self.live(&s, now) {
                    self.slots[idx].last_ns = self.slots[idx].last_ns.max(now);
                    return true;
                }
                return false;
            }
        }
        false
    }

    /// Records (or refreshes) `key`; evicts the least recently seen live flow of the
    /// probe window when it has no free or expired slot.
    #[inline]
    pub(super) fn insert(&mut self, key: &AclKey, now: u64) {
        if self.slots.is_empty() {
            return;
        }
        let start = hash_of(key) & self.mask;
        let mut free = None;
        let mut victim = start;
        let mut oldest = u64::MAX;
        for i in 0..CONN_PROBE_WINDOW {
            let idx = (start + i) & self.mask;
            let s = self.slots[idx];
            if s.used && s.key == *key {
                self.slots[idx].last_ns = s.last_ns.max(now);
                return;
            }
            if !self.live(&s, now) {
                free.get_or_insert(idx);
            } else if s.last_ns < oldest {
                oldest = s.last_ns;
                victim = idx;
            }
        }
        let idx = match free {
            Some(idx) => idx,
            None => {
                self.evictions += 1;
                victim
            }
        };
        self.slots[idx] = ConnSlot {
            key: *key,
            last_ns: now,
            used: true,
        };
    }

    /// Slots holding a flow (live or expired but not yet reused).
    pub fn occupied(&self) -> usize {
        self.slots.iter().filter(|s| s.used).count()
    }

    /// Slots in the table.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Live flows evicted to make room for new ones.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[inline]
fn hash_of<K: Hash>(key: &K) -> usize {
    use std::hash::BuildHasher;
    FxBuildHasher.hash_one(key) as usize
}
