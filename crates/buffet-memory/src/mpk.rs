//! The MPK isolation domain: Intel memory protection keys, virtualised over any number of
//! tenant regions.
//!
//! # The model
//!
//! A CPU has 16 protection keys; key 0 is every page's default and stays open, so stack,
//! heap, code and packet buffers are always accessible. [`Mpk::get`] allocates the others
//! once per process (15 on Linux when nobody else took any): one **parking key** and up
//! to 14 **cache keys**. Every tenant region of an MPK table carries a non-zero key:
//!
//! * a cache key while it is *loaded* (the tenant ran recently);
//! * the parking key otherwise.
//!
//! Each thread's PKRU register closes every one of these keys (access- and write-disable)
//! except while that thread holds a tenant's state guard: [`TenantEntry::lock`] loads the
//! tenant's key and writes PKRU = "everything as before, all managed keys closed, this
//! tenant's cache key open"; dropping the guard writes the previous PKRU back. That is one
//! `RDPKRU` and two `WRPKRU` per packet group, never per packet.
//!
//! # Key virtualisation (libmpk-style)
//!
//! Loading a tenant whose region already carries a cache key is a *hit*: one atomic pin of
//! that key's slot, no syscall. Otherwise it is a *miss*: under one process-wide lock the
//! least recently used unpinned cache key is taken from its owner — whose region is
//! re-tagged to the parking key with `pkey_mprotect` — and the tenant's region is tagged
//! with it (a second `pkey_mprotect`). The cache is per process, shared by every worker,
//! and a key that another thread is running with (pinned) is never taken: its group keeps
//! its key until its guard drops. A miss costs two `pkey_mprotect` calls plus the TLB
//! shootdown they imply; [`MpkStats`] counts hits, misses and the time spent in misses.
//! While the number of tenants that run concurrently or in quick succession — across all
//! workers — stays at or below the number of cache keys, every group is a hit.
//!
//! What this does not do: protect anything but tenant regions (a tenant's heap data, if
//! its state keeps any, is key 0 like everything else), or stop native code that executes
//! `WRPKRU` or `pkey_mprotect` itself — MPK contains stray accesses of buggy native NFs,
//! not deliberately malicious machine code (that is what the eBPF level is for).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

use crate::sys::{self, RegionTag, SysError};

/// The most cache keys there can be (16 keys, minus key 0, minus the parking key).
pub const MAX_CACHE_KEYS: usize = 14;

/// Set to `off` to make [`Mpk::get`] report MPK as unavailable, as on a CPU without it.
pub const DISABLE_ENV: &str = "BUFFET_MPK";

/// `PKEY_DISABLE_ACCESS`: the initial rights of a new key for the allocating thread.
const PKEY_DISABLE_ACCESS: u32 = 1;

/// A slot's pin count while a miss re-tags it.
const EVICTING: u32 = u32::MAX;

/// `VKey::slot` when the region holds no cache key (it carries the parking key).
const PARKED: u32 = u32::MAX;

/// Why MPK isolation cannot be used in this process.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MpkError {
    /// The CPU or the kernel has no protection keys (no `pku`/`ospke` in /proc/cpuinfo),
    /// or MPK was turned off with `BUFFET_MPK=off`.
    #[error("MPK isolation is unavailable: {reason}")]
    Unavailable {
        /// What is missing.
        reason: String,
    },
    /// Fewer than two protection keys could be allocated (one parking key and at least
    /// one cache key are needed): another library in this process holds the others.
    #[error("MPK isolation needs at least 2 free protection keys, got {got}: {cause}")]
    TooFewKeys {
        /// Keys allocated before `pkey_alloc` failed.
        got: usize,
        /// The failing call.
        cause: SysError,
    },
}

/// Counters of the key cache (since the process started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpkStats {
    /// Cache keys (tenants that can be loaded at once).
    pub cache_keys: usize,
    /// Domain entries whose region already had its key.
    pub hits: u64,
    /// Domain entries that had to re-tag regions.
    pub misses: u64,
    /// Nanoseconds spent in misses (lock, victim choice, two `pkey_mprotect`s).
    pub miss_ns: u64,
}

/// The process's MPK key cache. One per process ([`Mpk::get`]), shared by every MPK
/// Tenant Table and every worker thread.
pub struct Mpk {
    parking: i32,
    /// AD|WD bits of every key this cache manages (parking and cache keys).
    mask: u32,
    slots: Box<[Slot]>,
    /// The miss lock: which virtual key owns each slot. Only misses and removals take it.
    owners: Mutex<Box<[Option<Arc<VKeyShared>>]>>,
    /// Advances on every miss: "recency" of a slot is the miss count when it last ran.
    clock: AtomicU64,
    misses: AtomicU64,
    miss_ns: AtomicU64,
    next_id: AtomicU64,
}

/// One cache key. Aligned to a cache line: the running worker writes it once per group.
#[repr(align(64))]
struct Slot {
    pkey: i32,
    /// Threads running with this key right now, or [`EVICTING`].
    pins: AtomicU32,
    /// Id of the virtual key holding it (0: none).
    owner: AtomicU64,
    /// `clock` when it was last entered.
    last_used: AtomicU64,
    hits: AtomicU64,
}

impl Slot {
    /// Pins the slot unless a miss is re-tagging it.
    #[inline]
    fn try_pin(&self) -> bool {
        let mut p = self.pins.load(Ordering::Relaxed);
        loop {
            if p == EVICTING {
                return false;
            }
            match self
                .pins
                .compare_exchange_weak(p, p + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => p = now,
            }
        }
    }

    #[inline]
    fn unpin(&self) {
        self.pins.fetch_sub(1, Ordering::Release);
    }
}

/// A tenant region's virtual key: which cache key it holds, if any.
pub(crate) struct VKeyShared {
    id: u64,
    slot: AtomicU32,
    tag: RegionTag,
}

/// What [`Mpk::enter`] hands back for [`Mpk::leave`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entered {
    slot: u32,
    saved_pkru: u32,
}

static PROCESS: OnceLock<Result<Mpk, MpkError>> = OnceLock::new();

impl Mpk {
    /// The process's key cache; the first call allocates the protection keys. Fails with
    /// a message saying what is missing when the CPU, the kernel or the environment
    /// (`BUFFET_MPK=off`) does not allow MPK.
    pub fn get() -> Result<&'static Mpk, MpkError> {
        PROCESS
            .get_or_init(Mpk::setup)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Whether [`Mpk::get`] succeeds, without the error.
    pub fn available() -> bool {
        Mpk::get().is_ok()
    }

    fn setup() -> Result<Mpk, MpkError> {
        if std::env::var(DISABLE_ENV).is_ok_and(|v| v == "off" || v == "0") {
            return Err(MpkError::Unavailable {
                reason: format!("turned off by {DISABLE_ENV}=off"),
            });
        }
        if !sys::pku_supported() {
            return Err(MpkError::Unavailable {
                reason: "the CPU or the kernel does not support protection keys \
                         (no `pku`/`ospke` flag in /proc/cpuinfo)"
                    .into(),
            });
        }
        let mut keys = Vec::new();
        let cause = loop {
            if keys.len() == MAX_CACHE_KEYS + 1 {
                break None;
            }
            match sys::pkey_alloc(PKEY_DISABLE_ACCESS) {
                Ok(k) if (1..16).contains(&k) => keys.push(k),
                Ok(k) => {
                    // Not a key PKRU can express in our masks: give it back and stop.
                    sys::pkey_free(k);
                    break None;
                }
                Err(e) => break Some(e),
            }
        };
        if keys.len() < 2 {
            keys.into_iter().for_each(sys::pkey_free);
            return Err(match cause {
                Some(e) if e.errno == libc::ENOSYS || e.errno == libc::EINVAL => {
                    MpkError::Unavailable {
                        reason: format!("the kernel refused protection keys: {e}"),
                    }
                }
                Some(cause) => MpkError::TooFewKeys { got: 0, cause },
                None => MpkError::TooFewKeys {
                    got: 0,
                    cause: SysError {
                        call: "pkey_alloc",
                        errno: libc::ENOSPC,
                    },
                },
            });
        }
        let parking = keys[0];
        let mask = keys.iter().fold(0u32, |m, &k| m | key_bits(k));
        let slots: Box<[Slot]> = keys[1..]
            .iter()
            .map(|&pkey| Slot {
                pkey,
                pins: AtomicU32::new(0),
                owner: AtomicU64::new(0),
                last_used: AtomicU64::new(0),
                hits: AtomicU64::new(0),
            })
            .collect();
        let owners = (0..slots.len()).map(|_| None).collect();
        Ok(Mpk {
            parking,
            mask,
            slots,
            owners: Mutex::new(owners),
            clock: AtomicU64::new(1),
            misses: AtomicU64::new(0),
            miss_ns: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
        })
    }

    /// Number of cache keys: tenants whose regions can be open to some thread at once.
    pub fn cache_keys(&self) -> usize {
        self.slots.len()
    }

    /// The key evicted regions carry.
    pub fn parking_key(&self) -> i32 {
        self.parking
    }

    /// Hits, misses and time spent in misses so far.
    pub fn stats(&self) -> MpkStats {
        MpkStats {
            cache_keys: self.slots.len(),
            hits: self
                .slots
                .iter()
                .map(|s| s.hits.load(Ordering::Relaxed))
                .sum(),
            misses: self.misses.load(Ordering::Relaxed),
            miss_ns: self.miss_ns.load(Ordering::Relaxed),
        }
    }

    /// The PKRU value of a thread that has every key of this cache closed, starting from
    /// the calling thread's current PKRU.
    pub fn closed_pkru(&self) -> u32 {
        sys::rdpkru() | self.mask
    }

    /// This thread's PKRU (for tests and diagnostics).
    pub fn current_pkru(&self) -> u32 {
        sys::rdpkru()
    }

    /// A virtual key for a freshly placed region, which is tagged with the parking key.
    pub(crate) fn register(&self, tag: RegionTag) -> Result<Arc<VKeyShared>, SysError> {
        tag.set_pkey(self.parking)?;
        Ok(Arc::new(VKeyShared {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            slot: AtomicU32::new(PARKED),
            tag,
        }))
    }

    /// Drops a virtual key before its region is released: gives up its cache key (it is
    /// unpinned: no guard of it is alive) and tags the region with key 0 again so that the
    /// state can be dropped in place and the region scrubbed from any thread.
    pub(crate) fn unregister(&self, v: &Arc<VKeyShared>) {
        let mut owners = self.owners();
        let s = v.slot.load(Ordering::Acquire);
        if s != PARKED {
            let slot = &self.slots[s as usize];
            // Only a stale prober (a tenant that lost this key) can hold a transient pin.
            while slot
                .pins
                .compare_exchange(0, EVICTING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::hint::spin_loop();
            }
            owners[s as usize] = None;
            slot.owner.store(0, Ordering::Release);
            v.slot.store(PARKED, Ordering::Release);
            slot.pins.store(0, Ordering::Release);
        }
        drop(owners);
        if let Err(e) = v.tag.set_pkey(0) {
            // Fail closed: the region keeps a closed key; dropping the state in place would
            // fault, so stop here with the reason.
            panic!("buffet-memory: cannot give a released region back key 0: {e}");
        }
    }

    /// Loads `v`'s cache key (a hit, or a miss that re-tags) and opens it — and only it,
    /// of all the keys this cache manages — in this thread's PKRU.
    #[inline]
    pub(crate) fn enter(&self, v: &Arc<VKeyShared>) -> Entered {
        let slot = self.pin(v);
        let s = &self.slots[slot as usize];
        let now = self.clock.load(Ordering::Relaxed);
        if s.last_used.load(Ordering::Relaxed) != now {
            s.last_used.store(now, Ordering::Relaxed);
        }
        let saved_pkru = sys::rdpkru();
        sys::wrpkru((saved_pkru | self.mask) & !key_bits(s.pkey));
        Entered { slot, saved_pkru }
    }

    /// Restores the PKRU [`enter`](Self::enter) found and unpins the key.
    #[inline]
    pub(crate) fn leave(&self, e: Entered) {
        sys::wrpkru(e.saved_pkru);
        self.slots[e.slot as usize].unpin();
    }

    #[inline]
    fn pin(&self, v: &Arc<VKeyShared>) -> u32 {
        let s = v.slot.load(Ordering::Acquire);
        if s != PARKED {
            let slot = &self.slots[s as usize];
            if slot.try_pin() {
                if slot.owner.load(Ordering::Acquire) == v.id {
                    slot.hits.fetch_add(1, Ordering::Relaxed);
                    return s;
                }
                slot.unpin();
            }
        }
        self.miss(v)
    }

    #[cold]
    fn miss(&self, v: &Arc<VKeyShared>) -> u32 {
        let t0 = Instant::now();
        loop {
            let mut owners = self.owners();
            // Still ours? (The fast path can fail spuriously while a stale prober holds a
            // transient pin; the owner cannot change while we hold the lock.)
            let s = v.slot.load(Ordering::Acquire);
            if s != PARKED && self.slots[s as usize].try_pin() {
                self.slots[s as usize].hits.fetch_add(1, Ordering::Relaxed);
                return s;
            }
            // The least recently used unpinned slot; free slots first.
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| slot.pins.load(Ordering::Relaxed) == 0)
                .min_by_key(|(i, slot)| match owners[*i] {
                    None => 0,
                    Some(_) => slot.last_used.load(Ordering::Relaxed),
                })
                .map(|(i, _)| i);
            let Some(i) = victim else {
                // Every key is in use by a running group: wait for one to finish.
                drop(owners);
                std::thread::yield_now();
                continue;
            };
            let slot = &self.slots[i];
            if slot
                .pins
                .compare_exchange(0, EVICTING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if let Some(old) = owners[i].take() {
                // Fail closed: if the victim cannot be parked it must not keep a key that
                // is about to open for someone else.
                if let Err(e) = old.tag.set_pkey(self.parking) {
                    panic!("buffet-memory: MPK eviction cannot re-tag a region: {e}");
                }
                old.slot.store(PARKED, Ordering::Release);
            }
            if let Err(e) = v.tag.set_pkey(slot.pkey) {
                panic!("buffet-memory: MPK cannot tag a region with its key: {e}");
            }
            owners[i] = Some(Arc::clone(v));
            slot.owner.store(v.id, Ordering::Release);
            v.slot.store(i as u32, Ordering::Release);
            slot.last_used.store(
                self.clock.fetch_add(1, Ordering::Relaxed) + 1,
                Ordering::Relaxed,
            );
            // EVICTING -> pinned once, by us.
            slot.pins.store(1, Ordering::Release);
            drop(owners);
            self.misses.fetch_add(1, Ordering::Relaxed);
            self.miss_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            return i as u32;
        }
    }

    fn owners(&self) -> MutexGuard<'_, Box<[Option<Arc<VKeyShared>>]>> {
        // Every critical section leaves the table consistent before it can panic (a panic
        // there means a failed re-tag, after which nothing is half-updated in the table).
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl VKeyShared {
    /// The hardware key this region carries right now (the parking key or a cache key).
    pub(crate) fn pkey(&self, mpk: &Mpk) -> i32 {
        match self.slot.load(Ordering::Acquire) {
            PARKED => mpk.parking,
            s => mpk.slots[s as usize].pkey,
        }
    }
}

/// AD and WD bits of `key` in PKRU.
const fn key_bits(key: i32) -> u32 {
    0b11 << (2 * key as u32)
}

impl std::fmt::Debug for Mpk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpk")
            .field("parking", &self.parking)
            .field(
                "cache_keys",
                &self.slots.iter().map(|s| s.pkey).collect::<Vec<_>>(),
            )
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::sync::atomic::AtomicBool;
    use std::sync::Barrier;

    use buffet_sdk::{TenantId, TenantSlot};
    use buffet_testkit::require_mpk;

    use super::*;
    use crate::{AdmitWithError, ArenaConfig, Domain, MemoryStorage, TenantTable};

    fn table<S: Send + 'static>(mpk: &'static Mpk, slots: u32) -> TenantTable<S> {
        let storage = MemoryStorage::new(ArenaConfig { capacity: 64 << 20 }).unwrap();
        TenantTable::with_mpk(storage, slots, mpk)
    }

    /// The keys of `mpk` that `pkru` leaves open.
    fn open_keys(mpk: &Mpk, pkru: u32) -> Vec<i32> {
        std::iter::once(mpk.parking)
            .chain(mpk.slots.iter().map(|s| s.pkey))
            .filter(|&k| pkru & key_bits(k) == 0)
            .collect()
    }

    #[test]
    fn a_guard_opens_its_own_key_and_nothing_else() {
        let Some(mpk) = require_mpk("a_guard_opens_its_own_key_and_nothing_else", Mpk::get) else {
            return;
        };
        let t = table::<[u64; 8]>(mpk, 4);
        t.admit(TenantSlot(0), TenantId(1), 4096, [1; 8]).unwrap();
        t.admit(TenantSlot(1), TenantId(2), 4096, [2; 8]).unwrap();
        let (a, b) = (
            t.get_arc(TenantSlot(0)).unwrap(),
            t.get_arc(TenantSlot(1)).unwrap(),
        );
        assert_eq!(a.domain(), Domain::Mpk);
        // Closed outside any guard.
        assert_eq!(open_keys(mpk, mpk.current_pkru()), Vec::<i32>::new());
        // Load both, so both carry cache keys.
        drop(b.lock());
        {
            let g = a.lock();
            assert_eq!(g[0], 1);
            let (ka, kb) = (a.pkey().unwrap(), b.pkey().unwrap());
            assert_ne!(ka, mpk.parking);
            assert_ne!(ka, kb, "two loaded regions never share a key");
            assert_eq!(open_keys(mpk, mpk.current_pkru()), vec![ka]);
        }
        assert_eq!(open_keys(mpk, mpk.current_pkru()), Vec::<i32>::new());
        // The whole region is open inside the guard: the bytes past the state too.
        let mut g = b.lock();
        let (state, tail) = g.split();
        assert_eq!(state[7], 2);
        assert_eq!(tail.len(), 4096 - 64);
        tail[tail.len() - 1] = 9;
        assert_eq!(tail[tail.len() - 1], 9);
    }

    #[test]
    fn admit_with_runs_init_in_the_region_and_rolls_back_on_error() {
        let Some(mpk) = require_mpk(
            "admit_with_runs_init_in_the_region_and_rolls_back_on_error",
            Mpk::get,
        ) else {
            return;
        };
        let t = table::<u64>(mpk, 4);
        let regions_before = t.storage().stats().regions;
        let e = t
            .admit_with(TenantSlot(0), TenantId(1), 8192, 5, |s, tail| {
                *s += 1;
                tail.fill(7);
                Err("policy refused")
            })
            .unwrap_err();
        assert_eq!(e, AdmitWithError::Init("policy refused"));
        assert!(t.get(TenantSlot(0)).entry().is_none() && t.is_empty());
        assert_eq!(t.storage().stats().regions, regions_before);
        t.admit_with(TenantSlot(0), TenantId(1), 8192, 5, |s, tail| {
            *s += 1;
            assert!(tail.iter().all(|&b| b == 0), "a reused region is scrubbed");
            tail[0] = 42;
            Ok::<(), ()>(())
        })
        .unwrap();
        let e = t.get_arc(TenantSlot(0)).unwrap();
        let mut g = e.lock();
        let (s, tail) = g.split();
        assert_eq!((*s, tail[0], tail.len()), (6, 42, 8192 - 64));
    }

    /// More tenants than keys, two threads: every lock sees its own state, exactly one
    /// managed key open, and no update is lost.
    #[test]
    fn forty_tenants_over_the_key_cache_from_two_threads() {
        let Some(mpk) = require_mpk(
            "forty_tenants_over_the_key_cache_from_two_threads",
            Mpk::get,
        ) else {
            return;
        };
        const TENANTS: u32 = 40;
        const ROUNDS: u64 = 300;
        let t = Arc::new(table::<[u64; 2]>(mpk, TENANTS));
        for i in 0..TENANTS {
            t.admit(TenantSlot(i), TenantId(i), 4096, [u64::from(i), 0])
                .unwrap();
        }
        let misses_before = mpk.stats().misses;
        let barrier = Arc::new(Barrier::new(2));
        let bad = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2u32)
            .map(|w| {
                let (t, barrier, bad) = (t.clone(), barrier.clone(), bad.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for r in 0..ROUNDS {
                        // Each thread walks all tenants, in opposite directions, so both
                        // touch every tenant and compete for the keys.
                        for k in 0..TENANTS {
                            let i = if (w + r as u32) % 2 == 0 {
                                k
                            } else {
                                TENANTS - 1 - k
                            };
                            let e = t.get_arc(TenantSlot(i)).unwrap();
                            let mut g = e.lock();
                            let open = open_keys(mpk, mpk.current_pkru());
                            if g[0] != u64::from(i) || open != vec![e.pkey().unwrap()] {
                                bad.store(true, Ordering::Relaxed);
                            }
                            g[1] += 1;
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert!(
            !bad.load(Ordering::Relaxed),
            "a guard saw the wrong state or keys"
        );
        for i in 0..TENANTS {
            assert_eq!(
                t.get_arc(TenantSlot(i)).unwrap().lock()[1],
                2 * ROUNDS,
                "tenant {i}"
            );
        }
        let misses = mpk.stats().misses - misses_before;
        assert!(
            misses >= u64::from(TENANTS),
            "40 tenants over {} keys must miss: {misses}",
            mpk.cache_keys()
        );
    }

    #[test]
    fn removed_regions_go_back_to_key_zero_and_are_reused() {
        let Some(mpk) = require_mpk(
            "removed_regions_go_back_to_key_zero_and_are_reused",
            Mpk::get,
        ) else {
            return;
        };
        let t = table::<u64>(mpk, 2);
        t.admit(TenantSlot(0), TenantId(1), 4096, 11).unwrap();
        let base = t.get_arc(TenantSlot(0)).unwrap().extent().base;
        *t.get_arc(TenantSlot(0)).unwrap().lock() += 1;
        drop(t.remove(TenantSlot(0)));
        // The same range comes back, scrubbed, and works in a plain table too.
        let plain = TenantTable::<u64>::new(t.storage().clone(), 2);
        plain.admit(TenantSlot(0), TenantId(2), 4096, 0).unwrap();
        let e = plain.get_arc(TenantSlot(0)).unwrap();
        assert_eq!(e.extent().base, base);
        assert_eq!(*e.lock(), 0);
        assert_eq!(e.pkey(), None);
    }

    const CHILD_ENV: &str = "BUFFET_MPK_TEST_CHILD";

    fn run_child(mode: &str) -> std::process::Output {
        let name = format!(
            "{}::fault_child",
            module_path!().split_once("::").map_or("", |(_, m)| m)
        );
        Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mode)
            .output()
            .unwrap()
    }

    /// Not a test on its own: what `cross_tenant_reads_fault` runs in a child process.
    #[test]
    fn fault_child() {
        let Ok(mode) = std::env::var(CHILD_ENV) else {
            return;
        };
        if mode == "disabled" {
            println!("child: {}", Mpk::get().unwrap_err());
            return;
        }
        crate::sys::disable_core_dumps();
        let mpk = Mpk::get().unwrap();
        let t = table::<u64>(mpk, 2);
        t.admit(TenantSlot(0), TenantId(1), 4096, 1).unwrap();
        t.admit(TenantSlot(1), TenantId(2), 4096, 2).unwrap();
        let (a, b) = (
            t.get_arc(TenantSlot(0)).unwrap(),
            t.get_arc(TenantSlot(1)).unwrap(),
        );
        drop(b.lock());
        let g = a.lock();
        println!("child: touching {mode}");
        let got = match mode.as_str() {
            "own" => crate::sys::peek(a.extent().base),
            // B is loaded (holds a cache key) but not open on this thread.
            "neighbour-cached" => crate::sys::peek(b.extent().base),
            "after-leave" => {
                drop(g);
                crate::sys::peek(a.extent().base)
            }
            other => panic!("unknown mode {other}"),
        };
        println!("child: survived {mode}: {got}");
    }

    #[test]
    fn cross_tenant_reads_fault() {
        use std::os::unix::process::ExitStatusExt;
        if std::env::var_os(CHILD_ENV).is_some()
            || require_mpk("cross_tenant_reads_fault", Mpk::get).is_none()
        {
            return;
        }
        let own = run_child("own");
        let out = String::from_utf8_lossy(&own.stdout);
        assert!(
            own.status.success() && out.contains("survived own: 1"),
            "{out}"
        );
        for mode in ["neighbour-cached", "after-leave"] {
            let o = run_child(mode);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("child: touching"), "child did not run: {out}");
            assert_eq!(
                o.status.signal(),
                Some(libc::SIGSEGV),
                "reading {mode} must die of SIGSEGV: {out}"
            );
        }
    }

    #[test]
    fn unavailable_mpk_is_a_clear_error() {
        if std::env::var_os(CHILD_ENV).is_some() {
            return;
        }
        let o = Command::new(std::env::current_exe().unwrap())
            .args(["mpk::tests::fault_child", "--exact", "--nocapture"])
            .env(CHILD_ENV, "disabled")
            .env(DISABLE_ENV, "off")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("child: MPK isolation is unavailable: turned off by BUFFET_MPK=off"),
            "{out}"
        );
    }
}
