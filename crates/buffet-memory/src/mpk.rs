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
//! that key's slot, no syscall. Otherwise it is a *miss*: under one process-wide lock an
//! unpinned cache key is taken from its owner — whose region is re-tagged to the parking
//! key with `pkey_mprotect` — and the tenant's region is tagged with it (a second
//! `pkey_mprotect`). The key taken is a free one, else the least recently used one whose
//! owner is no hotter ([`Heat`]: entries, decaying) than the tenant, else the coolest
//! owner's: with more tenants than keys, the heaviest keep theirs (as many as there are
//! keys) while the light ones share the rest. The cache is per process, shared by every
//! worker, and a key that another thread is running with (pinned) is never taken: its
//! group keeps its key until its guard drops. A miss costs two `pkey_mprotect` calls plus the TLB
//! shootdown they imply; [`MpkStats`] counts hits, misses and the time spent in misses.
//! While the number of tenants that run concurrently or in quick succession — across all
//! workers — stays at or below the number of cache keys, every group is a hit.
//!
//! # Part keys (per-stage keys of a chain)
//!
//! A tenant region can hand whole pages of itself to their own virtual key: a **part**
//! ([`Mpk::carve_part`], [`PartKey`]). A chain gives each native stage's part one, so
//! that while that stage runs ([`PartKey::open`], inside the tenant's guard) PKRU opens
//! the part's key and closes every other managed key — the tenant's own, which its
//! other stages' parts and the chain's state carry, included. A part is a virtual key
//! like a region's, in the same cache: it hits, misses, is evicted to the parking key
//! and counted the same way, so the cache holds (tenant, stage) parts and tenants side
//! by side. The region's own key re-tags the region *except* its parts (its holes), so
//! loading or evicting the tenant never changes a part's key, and the reverse. A part
//! dropped while its region lives goes back to the region's key; a region released
//! first takes its parts' cache keys away and gives all its pages key 0.
//!
//! A stage runs with two keys pinned (its tenant's and its part's), so a tenant whose
//! chain has `n` native stages runs hit-only with `n + 1` cache keys free, and
//! [`Mpk::check_parts`] refuses a chain that could never have them.
//!
//! What this does not do: protect anything but tenant regions (a tenant's heap data, if
//! its state keeps any, is key 0 like everything else), or stop native code that executes
//! `WRPKRU` or `pkey_mprotect` itself — MPK contains stray accesses of buggy native NFs,
//! not deliberately malicious machine code (that is what the eBPF level is for).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
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

/// A slot's pin count once it is retired: a re-tag with its key failed and could not be
/// undone, so pages of a region may still carry the key, which nobody may open again.
const RETIRED: u32 = u32::MAX - 1;

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

/// Why a part of a region cannot get its own key ([`Mpk::carve_part`],
/// [`Mpk::check_parts`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartKeyError {
    /// The bytes are not whole pages inside one live region of this key cache.
    #[error("a part of {len} bytes at {addr:#x} is not whole pages inside one region under MPK")]
    NotInRegion {
        /// Its first address.
        addr: usize,
        /// Its length.
        len: usize,
    },
    /// The pages overlap a part that already has its own key.
    #[error("a part of {len} bytes at {addr:#x} overlaps another part of its region")]
    Overlaps {
        /// Its first address.
        addr: usize,
        /// Its length.
        len: usize,
    },
    /// More parts with their own key than the cache can ever hold with their region's.
    #[error(
        "{parts} native stages need {needed} protection keys at once (one each and the \
         tenant's), and this process has {cache_keys} cache keys"
    )]
    TooManyParts {
        /// The parts asked for.
        parts: usize,
        /// Keys they need at once (`parts + 1`).
        needed: usize,
        /// Cache keys there are.
        cache_keys: usize,
    },
    /// The part's pages could not be tagged.
    #[error("cannot tag a part with its protection key: {0}")]
    Tag(SysError),
}

/// Why a region could not be loaded into the key cache ([`TenantEntry::lock_checked`]):
/// its state was not opened, and no other region's protection changed.
///
/// [`TenantEntry::lock_checked`]: crate::TenantEntry::lock_checked
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnterError {
    /// `pkey_mprotect` failed moving a cache key from the region that held it to this one.
    #[error("cannot load the region's protection key: {0}")]
    Retag(SysError),
    /// Every cache key was retired after failed re-tags ([`MpkStats::retired_keys`]).
    #[error(
        "cannot load the region's protection key: every cache key was given up after a \
         re-tag failed"
    )]
    NoKey,
}

/// Counters of the key cache (since the process started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MpkStats {
    /// Cache keys (tenants that can be loaded at once).
    pub cache_keys: usize,
    /// Parts of regions with their own virtual key right now ([`PartKey`]).
    pub parts: usize,
    /// Domain entries whose region already had its key.
    pub hits: u64,
    /// Domain entries that had to re-tag regions.
    pub misses: u64,
    /// Nanoseconds spent in misses (lock, victim choice, two `pkey_mprotect`s).
    pub miss_ns: u64,
    /// Re-tags of misses that failed: of the region being loaded
    /// ([`EnterError::Retag`]: it was not loaded), or of a victim that could not be
    /// parked (it keeps its key, and the miss took another).
    pub retag_failures: u64,
    /// Cache keys given up because a failed re-tag could not be undone: some pages of a
    /// region may still carry them, so no region gets them again.
    pub retired_keys: usize,
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
    /// Live region keys by first address, to find the region of a part. Lock order:
    /// `owners`, then `live`, then a key's `holes`.
    live: Mutex<BTreeMap<usize, Weak<VKeyShared>>>,
    parts: AtomicUsize,
    /// Misses whose re-tag failed.
    retag_failures: AtomicU64,
    /// Tests: PKRU and page keys simulated in memory instead of the hardware's.
    #[cfg(any(test, feature = "mpk-sim"))]
    sim: Option<Arc<sim::SimMemory>>,
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
    /// A cache slot for `pkey`, held by no virtual key.
    fn free(pkey: i32) -> Slot {
        Slot {
            pkey,
            pins: AtomicU32::new(0),
            owner: AtomicU64::new(0),
            last_used: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// Pins the slot unless a miss is re-tagging it or it is retired.
    #[inline]
    fn try_pin(&self) -> bool {
        let mut p = self.pins.load(Ordering::Relaxed);
        loop {
            if p >= RETIRED {
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

/// A tenant region's (or a part's) virtual key: which cache key it holds, if any.
/// Aligned to a cache line: the worker running the tenant writes its heat once per group,
/// and another tenant's worker must not share that line.
#[repr(align(64))]
pub(crate) struct VKeyShared {
    id: u64,
    slot: AtomicU32,
    tag: Tag,
    /// A region's parts with their own key (sorted `(addr, len)`): its re-tags skip them.
    holes: Mutex<Vec<(usize, usize)>>,
    /// A region's parts carved while a borrow of its bytes covering them is alive: they
    /// keep the region's key (its re-tags cover them) until that borrow ends and they
    /// become holes ([`Mpk::finish_part`]).
    pending: Mutex<Vec<(usize, usize)>>,
    /// A part's region.
    parent: Option<Arc<VKeyShared>>,
    /// A region that was unregistered (its pages carry key 0 until released).
    gone: AtomicBool,
    /// How often it was entered lately ([`Heat`]): what a miss weighs before it takes a
    /// key from its owner.
    heat: AtomicU64,
}

/// The pages a virtual key re-tags.
pub(crate) enum Tag {
    /// Real pages of a [`MemoryStorage`](crate::MemoryStorage) region.
    Hw(RegionTag),
    /// Tests: pages whose keys [`sim::SimMemory`] keeps.
    #[cfg(any(test, feature = "mpk-sim"))]
    Sim(sim::SimTag),
}

impl Tag {
    fn addr(&self) -> usize {
        match self {
            Tag::Hw(t) => t.addr(),
            #[cfg(any(test, feature = "mpk-sim"))]
            Tag::Sim(t) => t.addr,
        }
    }

    fn len(&self) -> usize {
        match self {
            Tag::Hw(t) => t.len(),
            #[cfg(any(test, feature = "mpk-sim"))]
            Tag::Sim(t) => t.len,
        }
    }

    fn part(&self, addr: usize, len: usize) -> Option<Tag> {
        match self {
            Tag::Hw(t) => t.part(addr, len).map(Tag::Hw),
            #[cfg(any(test, feature = "mpk-sim"))]
            Tag::Sim(t) => t.part(addr, len).map(Tag::Sim),
        }
    }

    /// Records these pages as a carved part of their region, whose accessors refuse to
    /// hand out its bytes from now on; `apply` runs when the borrow of the region's bytes
    /// covering them ends (at once in the simulation, which has no borrows).
    fn add_part(&self, apply: sys::PartApply) -> Result<(), SysError> {
        match self {
            Tag::Hw(t) => t.add_part(apply),
            #[cfg(any(test, feature = "mpk-sim"))]
            Tag::Sim(_) => {
                apply();
                Ok(())
            }
        }
    }

    /// Forgets what [`add_part`](Self::add_part) recorded.
    fn remove_part(&self) {
        match self {
            Tag::Hw(t) => t.remove_part(),
            #[cfg(any(test, feature = "mpk-sim"))]
            Tag::Sim(_) => {}
        }
    }

    fn set_pkey_except(&self, key: i32, holes: &[(usize, usize)]) -> Result<(), SysError> {
        match self {
            Tag::Hw(t) => t.set_pkey_except(key, holes),
            #[cfg(any(test, feature = "mpk-sim"))]
            Tag::Sim(t) => t.set_pkey_except(key, holes),
        }
    }
}

impl VKeyShared {
    /// Tags this key's pages, but not its parts', with `key`.
    fn retag(&self, key: i32) -> Result<(), SysError> {
        let holes = self.holes.lock().unwrap_or_else(PoisonError::into_inner);
        self.tag.set_pkey_except(key, &holes)
    }
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
        let slots: Box<[Slot]> = keys[1..].iter().map(|&pkey| Slot::free(pkey)).collect();
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
            live: Mutex::new(BTreeMap::new()),
            parts: AtomicUsize::new(0),
            retag_failures: AtomicU64::new(0),
            #[cfg(any(test, feature = "mpk-sim"))]
            sim: None,
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
            parts: self.parts.load(Ordering::Relaxed),
            retag_failures: self.retag_failures.load(Ordering::Relaxed),
            retired_keys: self
                .slots
                .iter()
                .filter(|s| s.pins.load(Ordering::Relaxed) == RETIRED)
                .count(),
        }
    }

    /// Refuses a tenant whose chain would give `parts` native stages their own key when
    /// the cache can never hold them and the tenant's key together (`parts + 1` keys).
    pub fn check_parts(&self, parts: usize) -> Result<(), PartKeyError> {
        let needed = parts + 1;
        if parts > 0 && needed > self.slots.len() {
            return Err(PartKeyError::TooManyParts {
                parts,
                needed,
                cache_keys: self.slots.len(),
            });
        }
        Ok(())
    }

    /// Gives `part` — whole pages inside a live region of this cache, not already a part
    /// — its own virtual key ([`PartKey`]): once the borrow of the region's bytes that
    /// `part` was reached through ends (the [`RegionBytesMut`](crate::RegionBytesMut)
    /// from [`StateGuard::split`](crate::StateGuard::split) drops or is sealed), only
    /// [`PartKey::open`] opens the pages, and the region's own key no longer covers them.
    /// Until then they keep the region's key, so the bytes borrowed stay reachable; from
    /// then on they carry the parking key until the part first runs.
    ///
    /// From this call until the `PartKey` drops (or the tenant leaves), the region's
    /// accessors ([`StateGuard::split`](crate::StateGuard::split), `Region::bytes`,
    /// `Region::bytes_mut`) refuse to hand out its bytes
    /// ([`RegionSealed`](crate::RegionSealed)): a slice over the part would fault under
    /// the tenant's key. A part carved from bytes that no such borrow covers keeps the
    /// region's key (no isolation from the tenant's own key, none lost to anyone else).
    pub fn carve_part(&'static self, part: &mut [u8]) -> Result<PartKey, PartKeyError> {
        let v = self.carve(part.as_ptr() as usize, part.len())?;
        Ok(PartKey { mpk: self, v })
    }

    fn carve(&'static self, addr: usize, len: usize) -> Result<Arc<VKeyShared>, PartKeyError> {
        let not_in = PartKeyError::NotInRegion { addr, len };
        let owners = self.owners();
        let region = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .range(..=addr)
            .next_back()
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| not_in.clone())?;
        let tag = region.tag.part(addr, len).ok_or(not_in)?;
        let holes = region.holes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = region
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let overlaps = holes
            .iter()
            .chain(pending.iter())
            .any(|&(h, l)| h < addr + len && addr < h + l);
        if overlaps {
            return Err(PartKeyError::Overlaps { addr, len });
        }
        pending.push((addr, len));
        drop(pending);
        drop(holes);
        drop(owners);
        self.parts.fetch_add(1, Ordering::Relaxed);
        let v = Arc::new(VKeyShared {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            slot: AtomicU32::new(PARKED),
            tag,
            holes: Mutex::new(Vec::new()),
            pending: Mutex::new(Vec::new()),
            parent: Some(region),
            gone: AtomicBool::new(false),
            heat: AtomicU64::new(0),
        });
        // The pages move to the part's key when the borrow they were reached through
        // ends; until the part drops, its region hands out no slice over them.
        let part = Arc::downgrade(&v);
        if let Err(e) = v.tag.add_part(Box::new(move || self.finish_part(&part))) {
            self.drop_part(&v);
            return Err(PartKeyError::Tag(e));
        }
        Ok(v)
    }

    /// Moves a carved part's pages to its own key (the parking key, or the cache key it
    /// took if it ran meanwhile), and out of its region's re-tags: the borrow of the
    /// region's bytes it was carved from ended. Nothing if the part or its region is gone.
    fn finish_part(&self, part: &Weak<VKeyShared>) {
        let owners = self.owners();
        let Some(v) = part.upgrade() else {
            return;
        };
        let region = v.parent.as_ref().expect("a part has a region");
        let at = (v.tag.addr(), v.tag.len());
        let mut pending = region
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(i) = pending.iter().position(|&p| p == at) else {
            return;
        };
        pending.swap_remove(i);
        drop(pending);
        if region.gone.load(Ordering::Acquire) {
            // Key 0 with the rest of the region (see `unregister`).
            return;
        }
        // Tagged first, a hole only then: until it is one, the region's re-tags cover it.
        if let Err(e) = v.tag.set_pkey_except(v.pkey(self), &[]) {
            // Back to the region's key, and pending again: the part stays covered by the
            // region's re-tags, with the region's protection, as while it was borrowed.
            if v.tag.set_pkey_except(region.pkey(self), &[]).is_ok() {
                region
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(at);
                return;
            }
            // Fail closed, as for any re-tag that cannot be done: the pages must not keep
            // a key the region may give up.
            panic!("buffet-memory: cannot tag a part with its protection key: {e}");
        }
        let mut holes = region.holes.lock().unwrap_or_else(PoisonError::into_inner);
        let i = holes.partition_point(|&(h, _)| h < at.0);
        holes.insert(i, at);
        drop(holes);
        drop(owners);
        drop(v);
    }

    /// Gives up a part's cache key and gives its pages back to its region: the region's
    /// current key, or key 0 once the region was unregistered.
    fn drop_part(&self, v: &Arc<VKeyShared>) {
        let owners = self.owners();
        let region = v.parent.as_ref().expect("a part has a region");
        if !region.gone.load(Ordering::Acquire) {
            // Re-tagged while the part still holds its key: a key is handed to nobody
            // while pages carry it. (Once unregistered, the region's pages, parts
            // included, are key 0 already: see `unregister`.)
            let key = region.pkey(self);
            if let Err(e) = v.tag.set_pkey_except(key, &[]) {
                // Fail closed: some pages may still carry the part's key, so nobody gets
                // it again.
                drop(self.take_slot(owners, v, RETIRED));
                panic!("buffet-memory: cannot give a part back its region's key: {e}");
            }
        }
        let owners = self.free_slot(owners, v);
        let mut holes = region.holes.lock().unwrap_or_else(PoisonError::into_inner);
        holes.retain(|&(h, _)| h != v.tag.addr());
        drop(holes);
        let mut pending = region
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        pending.retain(|&(h, _)| h != v.tag.addr());
        drop(pending);
        // The region's bytes are handed out again (once no other part or seal is left).
        v.tag.remove_part();
        self.parts.fetch_sub(1, Ordering::Relaxed);
        drop(owners);
    }

    /// Takes `v`'s cache key away, if it holds one (it is unpinned: no guard of it is
    /// alive, only a stale prober can hold a transient pin), under the miss lock.
    fn free_slot<'a>(
        &'a self,
        owners: MutexGuard<'a, Box<[Option<Arc<VKeyShared>>]>>,
        v: &VKeyShared,
    ) -> MutexGuard<'a, Box<[Option<Arc<VKeyShared>>]>> {
        self.take_slot(owners, v, 0)
    }

    /// Takes `v`'s cache key away, as [`free_slot`](Self::free_slot) does, leaving the
    /// slot's pin count at `leave`: 0 (free) or [`RETIRED`] (nobody gets the key again).
    fn take_slot<'a>(
        &'a self,
        mut owners: MutexGuard<'a, Box<[Option<Arc<VKeyShared>>]>>,
        v: &VKeyShared,
        leave: u32,
    ) -> MutexGuard<'a, Box<[Option<Arc<VKeyShared>>]>> {
        let s = v.slot.load(Ordering::Acquire);
        if s != PARKED {
            let slot = &self.slots[s as usize];
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
            slot.pins.store(leave, Ordering::Release);
        }
        owners
    }

    #[inline]
    fn rdpkru(&self) -> u32 {
        #[cfg(any(test, feature = "mpk-sim"))]
        if self.sim.is_some() {
            return sim::rdpkru();
        }
        sys::rdpkru()
    }

    #[inline]
    fn wrpkru(&self, value: u32) {
        #[cfg(any(test, feature = "mpk-sim"))]
        if self.sim.is_some() {
            return sim::wrpkru(value);
        }
        sys::wrpkru(value)
    }

    /// The PKRU value of a thread that has every key of this cache closed, starting from
    /// the calling thread's current PKRU.
    pub fn closed_pkru(&self) -> u32 {
        self.rdpkru() | self.mask
    }

    /// This thread's PKRU (for tests and diagnostics).
    pub fn current_pkru(&self) -> u32 {
        self.rdpkru()
    }

    /// A virtual key for a freshly placed region, which is tagged with the parking key.
    pub(crate) fn register(&self, tag: RegionTag) -> Result<Arc<VKeyShared>, SysError> {
        #[cfg(any(test, feature = "mpk-sim"))]
        if let Some(sim) = self.sim_tag(tag.addr(), tag.len()) {
            return self.register_tag(sim);
        }
        self.register_tag(Tag::Hw(tag))
    }

    fn register_tag(&self, tag: Tag) -> Result<Arc<VKeyShared>, SysError> {
        tag.set_pkey_except(self.parking, &[])?;
        let v = Arc::new(VKeyShared {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            slot: AtomicU32::new(PARKED),
            tag,
            holes: Mutex::new(Vec::new()),
            pending: Mutex::new(Vec::new()),
            parent: None,
            gone: AtomicBool::new(false),
            heat: AtomicU64::new(0),
        });
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(v.tag.addr(), Arc::downgrade(&v));
        Ok(v)
    }

    /// Drops a region's virtual key before the region is released: gives up its cache
    /// key and its parts' (they are unpinned: no guard of the region is alive) and tags
    /// the whole region, parts included, with key 0 again so that the state can be
    /// dropped in place and the region scrubbed from any thread.
    pub(crate) fn unregister(&self, v: &Arc<VKeyShared>) {
        let mut owners = self.free_slot(self.owners(), v);
        // Its parts' keys: an eviction must never re-tag a part of a released region.
        for i in 0..owners.len() {
            let part = owners[i]
                .as_ref()
                .filter(|o| o.parent.as_ref().is_some_and(|p| Arc::ptr_eq(p, v)))
                .map(Arc::clone);
            if let Some(part) = part {
                owners = self.free_slot(owners, &part);
            }
        }
        v.gone.store(true, Ordering::Release);
        {
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            let addr = v.tag.addr();
            if live
                .get(&addr)
                .is_some_and(|w| w.ptr_eq(&Arc::downgrade(v)))
            {
                live.remove(&addr);
            }
        }
        drop(owners);
        if let Err(e) = v.tag.set_pkey_except(0, &[]) {
            // Fail closed: the region keeps a closed key; dropping the state in place would
            // fault, so stop here with the reason.
            panic!("buffet-memory: cannot give a released region back key 0: {e}");
        }
    }

    /// Loads `v`'s cache key (a hit, or a miss that re-tags) and opens it — and only it,
    /// of all the keys this cache manages — in this thread's PKRU. A miss whose re-tag
    /// fails leaves PKRU and every region's key as they were and the error is returned
    /// ([`EnterError`]); the cache stays usable for every other region.
    #[inline]
    pub(crate) fn enter(&self, v: &Arc<VKeyShared>) -> Result<Entered, EnterError> {
        // Counted before the pin, so that a miss weighs this entry too. A plain load and
        // store: `enter` runs under the tenant's lock, so the count has one writer.
        v.heat.store(
            Heat::bumped(
                v.heat.load(Ordering::Relaxed),
                self.clock.load(Ordering::Relaxed),
            ),
            Ordering::Relaxed,
        );
        let slot = self.pin(v)?;
        let s = &self.slots[slot as usize];
        // Recency read after the pin: a miss just advanced the clock, and other threads'
        // misses may have while this one waited for the miss lock.
        let now = self.clock.load(Ordering::Relaxed);
        if s.last_used.load(Ordering::Relaxed) != now {
            s.last_used.store(now, Ordering::Relaxed);
        }
        let saved_pkru = self.rdpkru();
        self.wrpkru((saved_pkru | self.mask) & !key_bits(s.pkey));
        Ok(Entered { slot, saved_pkru })
    }

    /// Restores the PKRU [`enter`](Self::enter) found and unpins the key.
    #[inline]
    pub(crate) fn leave(&self, e: Entered) {
        self.wrpkru(e.saved_pkru);
        self.slots[e.slot as usize].unpin();
    }

    #[inline]
    fn pin(&self, v: &Arc<VKeyShared>) -> Result<u32, EnterError> {
        let s = v.slot.load(Ordering::Acquire);
        if s != PARKED {
            let slot = &self.slots[s as usize];
            if slot.try_pin() {
                if slot.owner.load(Ordering::Acquire) == v.id {
                    slot.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(s);
                }
                slot.unpin();
            }
        }
        self.miss(v)
    }

    #[cold]
    fn miss(&self, v: &Arc<VKeyShared>) -> Result<u32, EnterError> {
        let t0 = Instant::now();
        // Slots whose owner could not be parked in this miss (at most 15 keys), and the
        // last such failure.
        let mut skipped = 0u32;
        let mut failed = None;
        loop {
            let mut owners = self.owners();
            // Still ours? (The fast path can fail spuriously while a stale prober holds a
            // transient pin; the owner cannot change while we hold the lock.)
            let s = v.slot.load(Ordering::Acquire);
            if s != PARKED && self.slots[s as usize].try_pin() {
                self.slots[s as usize].hits.fetch_add(1, Ordering::Relaxed);
                return Ok(s);
            }
            // Free slots first; then the least recently used unpinned slot whose owner
            // is no hotter than `v`; only when every owner is hotter, the coolest. Never
            // a retired key, nor one whose owner could not be parked in this miss.
            let now = self.clock.load(Ordering::Relaxed);
            let mine = Heat::of(v.heat.load(Ordering::Relaxed), now);
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter(|(i, slot)| {
                    slot.pins.load(Ordering::Relaxed) == 0 && skipped & (1 << i) == 0
                })
                .min_by_key(|(i, slot)| {
                    let recency = slot.last_used.load(Ordering::Relaxed);
                    match &owners[*i] {
                        None => (0, 0, 0),
                        Some(o) => match Heat::of(o.heat.load(Ordering::Relaxed), now) {
                            h if h <= mine => (1, 0, recency),
                            h => (2, h, recency),
                        },
                    }
                })
                .map(|(i, _)| i);
            let Some(i) = victim else {
                if let Some(e) = failed {
                    // Every key this miss could take has an owner that cannot be parked
                    // right now (`pkey_mprotect` failing for every call, say): this entry
                    // fails; a later one tries again.
                    return Err(EnterError::Retag(e));
                }
                if self
                    .slots
                    .iter()
                    .all(|slot| slot.pins.load(Ordering::Relaxed) == RETIRED)
                {
                    return Err(EnterError::NoKey);
                }
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
                // is about to open for someone else. (A region's parts keep theirs.)
                if let Err(e) = old.retag(self.parking) {
                    // Some of its pages may be parked already: give them their key back
                    // and the victim keeps it, counted as just used so that the next
                    // misses try the others first; if even that fails, nobody gets the
                    // key again, and the victim takes another at its next entry. Either
                    // way it is the victim's failure, not `v`'s: `v` tries another key.
                    self.retag_failures.fetch_add(1, Ordering::Relaxed);
                    skipped |= 1 << i;
                    failed = Some(e);
                    if old.retag(slot.pkey).is_ok() {
                        owners[i] = Some(old);
                        slot.last_used.store(
                            self.clock.fetch_add(1, Ordering::Relaxed) + 1,
                            Ordering::Relaxed,
                        );
                        slot.pins.store(0, Ordering::Release);
                    } else {
                        old.slot.store(PARKED, Ordering::Release);
                        slot.owner.store(0, Ordering::Release);
                        slot.pins.store(RETIRED, Ordering::Release);
                    }
                    continue;
                }
                old.slot.store(PARKED, Ordering::Release);
                slot.owner.store(0, Ordering::Release);
            }
            if let Err(e) = v.retag(slot.pkey) {
                // Pages of `v` tagged already go back to the parking key, and the key is
                // free again; if they cannot, nobody gets the key again.
                let undone = v.retag(self.parking).is_ok();
                slot.pins
                    .store(if undone { 0 } else { RETIRED }, Ordering::Release);
                return Err(self.retag_failed(e));
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
            return Ok(i as u32);
        }
    }

    /// Counts a miss whose re-tag failed.
    #[cold]
    fn retag_failed(&self, e: SysError) -> EnterError {
        self.retag_failures.fetch_add(1, Ordering::Relaxed);
        EnterError::Retag(e)
    }

    fn owners(&self) -> MutexGuard<'_, Box<[Option<Arc<VKeyShared>>]>> {
        // Every critical section leaves the table consistent before it can panic: a miss
        // does not panic; a part's `finish_part` and `drop_part` panic only on a re-tag
        // they cannot undo, after the holes and keys were left as they were or the key
        // was retired.
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

/// A virtual key's heat: how many times it was entered, halved every
/// 2^[`HEAT_HALF_LIFE`] misses of the cache, packed as `epoch << 32 | count` (the epoch is
/// the miss clock's high bits when it was last counted, so a key that has not run for a
/// while cools down without anyone touching it).
///
/// Why (docs/isolation.md): with more tenants active than cache keys, plain LRU takes
/// the key of a heavy tenant for every light one that passes, and the heavy one misses
/// on its next group. Making a miss take a key only from an owner no hotter than the
/// newcomer (the least recently used of those), or else from the coolest owner, keeps the
/// heavy tenants' keys while the light ones share the rest.
struct Heat;

/// Heat halves every 2^13 = 8,192 misses.
const HEAT_HALF_LIFE: u32 = 13;

/// Heat counts up to 2^16 entries, so that a tenant that stops sending gives its key up
/// within 17 half-lives (about 140,000 misses) however long it ran before.
const HEAT_MAX: u32 = 1 << 16;

impl Heat {
    /// The packed heat `packed` seen at miss clock `now`: its count, halved once per
    /// epoch that passed since it was counted.
    #[inline]
    fn of(packed: u64, now: u64) -> u32 {
        // Epochs are kept mod 2^32 (2^45 misses); one stored ahead of `now` (a count
        // that raced a miss) has not decayed.
        let passed = Self::epoch(now).wrapping_sub((packed >> 32) as u32);
        let passed = if passed > u32::MAX / 2 { 0 } else { passed };
        ((packed as u32) as u64 >> passed.min(32)) as u32
    }

    #[inline]
    fn epoch(now: u64) -> u32 {
        (now >> HEAT_HALF_LIFE) as u32
    }

    /// `packed` with one more entry, at miss clock `now`.
    #[inline]
    fn bumped(packed: u64, now: u64) -> u64 {
        let count = (Self::of(packed, now) + 1).min(HEAT_MAX);
        u64::from(Self::epoch(now)) << 32 | u64::from(count)
    }
}

/// AD and WD bits of `key` in PKRU: bit `2 * key` is access-disable, bit `2 * key + 1`
/// write-disable (Intel SDM vol. 3A, 4.6.2).
const fn key_bits(key: i32) -> u32 {
    0b11 << (2 * key as u32)
}

/// A part of a tenant region with its own protection key ([`Mpk::carve_part`]): while
/// [`open`](Self::open) holds, this thread reaches the part's pages and no other page
/// under a managed key. Dropping it gives the pages back to the region's key.
pub struct PartKey {
    mpk: &'static Mpk,
    v: Arc<VKeyShared>,
}

impl PartKey {
    /// Loads the part's key (a hit, or a miss that re-tags) and makes it the only managed
    /// key open on this thread — closing the tenant's own key until the guard drops, which
    /// writes the PKRU it found back. Call it inside the tenant's state guard.
    ///
    /// # Panics
    ///
    /// If the part's key cannot be loaded ([`EnterError`]): called from a handler, the
    /// worker contains the panic and quarantines the tenant; the key cache stays usable.
    #[inline]
    pub fn open(&self) -> PartOpen<'_> {
        let entered = match self.mpk.enter(&self.v) {
            Ok(e) => e,
            Err(e) => panic!("buffet-memory: a native stage's part: {e}"),
        };
        PartOpen {
            mpk: self.mpk,
            entered: Some(entered),
        }
    }

    /// The hardware key the part carries right now (the parking key or a cache key).
    pub fn pkey(&self) -> i32 {
        self.v.pkey(self.mpk)
    }

    /// First address and length of the part.
    pub fn extent(&self) -> (usize, usize) {
        (self.v.tag.addr(), self.v.tag.len())
    }
}

impl Drop for PartKey {
    fn drop(&mut self) {
        self.mpk.drop_part(&self.v);
    }
}

impl std::fmt::Debug for PartKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (addr, len) = self.extent();
        f.debug_struct("PartKey")
            .field("addr", &format_args!("{addr:#x}"))
            .field("len", &len)
            .field("pkey", &self.pkey())
            .finish()
    }
}

/// A part's key open on this thread ([`PartKey::open`]); dropping it restores PKRU.
#[must_use = "the part closes again when this guard drops"]
pub struct PartOpen<'a> {
    mpk: &'a Mpk,
    entered: Option<Entered>,
}

impl Drop for PartOpen<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(e) = self.entered.take() {
            self.mpk.leave(e);
        }
    }
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

/// Tests without the hardware: the key cache's own code, with PKRU and the pages' keys
/// kept in memory. `wrpkru`/`rdpkru` act on a per-thread value and `pkey_mprotect` on a
/// map of page -> key; everything else — pinning, misses, eviction, parts and their
/// holes — is the code the hardware runs.
///
/// Outside this crate's own tests it exists only with the `mpk-sim` feature, for the
/// tests of crates that run tenants under MPK on machines without `pku`
/// ([`Mpk::simulated`], [`TenantTable::with_mpk`](crate::TenantTable::with_mpk)). No
/// page is protected by it: it is for testing the Memory Manager's and the workers' own
/// code, never for running tenants.
#[cfg(any(test, feature = "mpk-sim"))]
pub mod sim {
    use std::cell::Cell;
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::{Arc, Mutex, PoisonError};

    use super::{key_bits, Mpk, Slot, Tag};
    use crate::sys::{runs_between, SysError};

    /// The simulated page size.
    pub const PAGE: usize = 4096;

    thread_local! {
        static PKRU: Cell<u32> = const { Cell::new(0) };
    }

    pub(crate) fn rdpkru() -> u32 {
        PKRU.with(Cell::get)
    }

    pub(crate) fn wrpkru(v: u32) {
        assert!(v & 0b11 == 0, "PKRU {v:#x} would close protection key 0");
        PKRU.with(|p| p.set(v));
    }

    /// The protection key of every simulated page, and the pages whose re-tags fail.
    #[derive(Default)]
    pub struct SimMemory {
        keys: Mutex<BTreeMap<usize, i32>>,
        /// (page, key): re-tags of that page to that key fail.
        failing: Mutex<BTreeSet<(usize, i32)>>,
    }

    impl SimMemory {
        /// The key of the page holding `addr`.
        ///
        /// # Panics
        ///
        /// If no simulated region ever tagged that page.
        pub fn key(&self, addr: usize) -> i32 {
            self.keys.lock().unwrap_or_else(PoisonError::into_inner)[&(addr / PAGE * PAGE)]
        }

        /// Whether this thread's simulated PKRU lets it read `addr`.
        pub fn readable(&self, addr: usize) -> bool {
            rdpkru() & (1 << (2 * self.key(addr))) == 0
        }

        /// From now on, every re-tag to `key` that reaches the page holding `addr` fails
        /// there as `pkey_mprotect` would (`EINVAL`), after re-tagging the pages before it,
        /// until [`heal`](Self::heal).
        pub fn fail_retags(&self, addr: usize, key: i32) {
            self.failing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((addr / PAGE * PAGE, key));
        }

        /// Every re-tag succeeds again.
        pub fn heal(&self) {
            self.failing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
    }

    /// A simulated region's (or part's) pages.
    pub(crate) struct SimTag {
        pub(crate) mem: Arc<SimMemory>,
        pub(crate) addr: usize,
        pub(crate) len: usize,
    }

    impl SimTag {
        pub(crate) fn part(&self, addr: usize, len: usize) -> Option<SimTag> {
            let inside = addr >= self.addr
                && len > 0
                && addr % PAGE == 0
                && len % PAGE == 0
                && addr + len <= self.addr + self.len;
            inside.then(|| SimTag {
                mem: Arc::clone(&self.mem),
                addr,
                len,
            })
        }

        pub(crate) fn set_pkey_except(
            &self,
            key: i32,
            holes: &[(usize, usize)],
        ) -> Result<(), SysError> {
            let failing = self
                .mem
                .failing
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut keys = self.mem.keys.lock().unwrap_or_else(PoisonError::into_inner);
            for (a, l) in runs_between(self.addr, self.len, holes) {
                for page in (a..a + l).step_by(PAGE) {
                    if failing.contains(&(page, key)) {
                        return Err(SysError {
                            call: "pkey_mprotect",
                            errno: libc::EINVAL,
                        });
                    }
                    keys.insert(page, key);
                }
            }
            Ok(())
        }
    }

    impl Mpk {
        /// A key cache over simulated keys: parking key 1, cache keys 2, 3, … Regions
        /// registered with it (a [`TenantTable::with_mpk`](crate::TenantTable::with_mpk)
        /// over it, say) keep their keys in the returned [`SimMemory`], and every thread's
        /// PKRU is a simulated value: nothing is protected.
        ///
        /// # Panics
        ///
        /// If `cache_keys` is 0 or more than [`MAX_CACHE_KEYS`](super::MAX_CACHE_KEYS).
        pub fn simulated(cache_keys: usize) -> (&'static Mpk, Arc<SimMemory>) {
            assert!((1..=super::MAX_CACHE_KEYS).contains(&cache_keys));
            let mem = Arc::new(SimMemory::default());
            let keys: Vec<i32> = (1..=cache_keys as i32 + 1).collect();
            let slots = keys[1..].iter().map(|&pkey| Slot::free(pkey)).collect();
            let mpk = Mpk {
                parking: 1,
                mask: keys.iter().fold(0, |m, &k| m | key_bits(k)),
                slots,
                owners: Mutex::new((0..cache_keys).map(|_| None).collect()),
                clock: AtomicU64::new(1),
                misses: AtomicU64::new(0),
                miss_ns: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
                live: Mutex::new(BTreeMap::new()),
                parts: AtomicUsize::new(0),
                retag_failures: AtomicU64::new(0),
                sim: Some(Arc::clone(&mem)),
            };
            // Threads start with every managed key closed, as `pkey_alloc` leaves them.
            wrpkru(mpk.mask);
            (Box::leak(Box::new(mpk)), mem)
        }

        /// A region of `pages` simulated pages at `addr`.
        #[cfg(test)]
        pub(crate) fn sim_region(
            &self,
            mem: &Arc<SimMemory>,
            addr: usize,
            pages: usize,
        ) -> Result<Arc<super::VKeyShared>, SysError> {
            self.register_tag(Tag::Sim(SimTag {
                mem: Arc::clone(mem),
                addr,
                len: pages * PAGE,
            }))
        }

        /// The simulated tag of a real region's pages, if this cache is simulated.
        pub(crate) fn sim_tag(&self, addr: usize, len: usize) -> Option<Tag> {
            let mem = self.sim.as_ref()?;
            Some(Tag::Sim(SimTag {
                mem: Arc::clone(mem),
                addr,
                len,
            }))
        }
    }
}

#[cfg(test)]
mod part_tests {
    //! The part-key logic without the hardware ([`sim`]): distinct keys per native stage,
    //! eviction accounting, the budget, and no (tenant, stage) part ever under another's
    //! key.
    use super::sim::{SimMemory, PAGE};
    use super::*;

    /// A region (the chain's state page, then `parts` one-page stage parts) at `base`.
    fn region(
        mpk: &'static Mpk,
        mem: &Arc<SimMemory>,
        base: usize,
        parts: usize,
    ) -> (Arc<VKeyShared>, Vec<PartKey>) {
        let r = mpk.sim_region(mem, base, 1 + parts).unwrap();
        let keys = (0..parts)
            .map(|i| PartKey {
                mpk,
                v: mpk.carve(base + (1 + i) * PAGE, PAGE).unwrap(),
            })
            .collect();
        (r, keys)
    }

    /// Every virtual key holding a cache key holds a different one, and every page of
    /// every key carries the key that key believes it holds.
    fn consistent(mpk: &Mpk, mem: &SimMemory, keys: &[&Arc<VKeyShared>]) {
        let mut held = Vec::new();
        for v in keys {
            let k = v.pkey(mpk);
            if k != mpk.parking {
                assert!(!held.contains(&k), "two parts under key {k}");
                held.push(k);
            }
            let holes = v.holes.lock().unwrap().clone();
            for (a, l) in crate::sys::runs_between(v.tag.addr(), v.tag.len(), &holes) {
                for page in (a..a + l).step_by(PAGE) {
                    assert_eq!(mem.key(page), k, "page {page:#x} of key {}", v.id);
                }
            }
        }
    }

    #[test]
    fn each_native_stage_runs_under_its_own_key_and_sees_only_its_part() {
        let (mpk, mem) = Mpk::simulated(14);
        let base = 0x10_0000;
        let (r, parts) = region(mpk, &mem, base, 3);
        let header = base;
        let entered = mpk.enter(&r).unwrap();
        // The tenant's guard: its state page and (not yet carved ones aside) nothing else.
        assert!(mem.readable(header));
        assert!(parts.iter().all(|p| !mem.readable(p.extent().0)));
        let mut seen = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let open = p.open();
            let k = p.pkey();
            assert_ne!(k, r.pkey(mpk), "stage {i} shares the tenant's key");
            assert!(
                !seen.contains(&k),
                "stage {i} shares a key with an earlier stage"
            );
            seen.push(k);
            assert!(
                mem.readable(p.extent().0),
                "stage {i} cannot reach its part"
            );
            assert!(!mem.readable(header), "stage {i} reaches the chain's state");
            for (j, q) in parts.iter().enumerate() {
                if j != i {
                    assert!(!mem.readable(q.extent().0), "stage {i} reaches stage {j}");
                }
            }
            drop(open);
            // Back in the tenant's guard: the chain's state again, no part.
            assert!(mem.readable(header) && !mem.readable(p.extent().0));
        }
        mpk.leave(entered);
        assert!(!mem.readable(header));
        consistent(mpk, &mem, &[&r, &parts[0].v, &parts[1].v, &parts[2].v]);
        assert_eq!(mpk.stats().parts, 3);
        assert_eq!(mpk.stats().misses, 4, "one miss per key, then hits");
    }

    #[test]
    fn parts_and_tenants_share_the_cache_and_never_each_others_keys() {
        // 5 cache keys, 3 tenants with 2 native stages each: 9 virtual keys.
        let (mpk, mem) = Mpk::simulated(5);
        let tenants: Vec<_> = (0..3)
            .map(|t| region(mpk, &mem, 0x100_0000 * (t + 1), 2))
            .collect();
        let all: Vec<&Arc<VKeyShared>> = tenants
            .iter()
            .flat_map(|(r, p)| std::iter::once(r).chain(p.iter().map(|k| &k.v)))
            .collect();
        let mut expected_misses = 0;
        // A deterministic walk: tenant t runs its chain; each step checks every key.
        let mut x = 0x2545_f491_u32;
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let (r, parts) = &tenants[x as usize % 3];
            let before = mpk.stats().misses;
            let had = r.slot.load(Ordering::Relaxed) != PARKED;
            let e = mpk.enter(r).unwrap();
            expected_misses += u64::from(!had);
            assert_eq!(mpk.stats().misses - before, u64::from(!had));
            for p in parts {
                let had = p.v.slot.load(Ordering::Relaxed) != PARKED;
                let open = p.open();
                expected_misses += u64::from(!had);
                assert!(mem.readable(p.extent().0));
                assert!(!mem.readable(r.tag.addr()));
                for (other, oparts) in &tenants {
                    assert!(!mem.readable(other.tag.addr()));
                    for q in oparts.iter().filter(|q| !Arc::ptr_eq(&q.v, &p.v)) {
                        assert!(!mem.readable(q.extent().0));
                    }
                }
                drop(open);
                consistent(mpk, &mem, &all);
            }
            mpk.leave(e);
        }
        let stats = mpk.stats();
        assert_eq!(stats.misses, expected_misses);
        assert!(stats.misses > 5, "9 keys over 5 slots must miss: {stats:?}");
        assert_eq!(stats.hits + stats.misses, 400 * 3);
    }

    #[test]
    fn a_chain_with_more_native_stages_than_keys_is_refused() {
        let (mpk, _) = Mpk::simulated(4);
        mpk.check_parts(0).unwrap();
        mpk.check_parts(3).unwrap();
        assert_eq!(
            mpk.check_parts(4).unwrap_err().to_string(),
            "4 native stages need 5 protection keys at once (one each and the tenant's), \
             and this process has 4 cache keys"
        );
        let (mpk, _) = Mpk::simulated(MAX_CACHE_KEYS);
        mpk.check_parts(8).unwrap();
    }

    #[test]
    fn bad_parts_are_refused_and_change_nothing() {
        let (mpk, mem) = Mpk::simulated(4);
        let base = 0x40_0000;
        let r = mpk.sim_region(&mem, base, 4).unwrap();
        let p = mpk.carve(base + PAGE, PAGE).unwrap();
        let err = |addr: usize, len: usize| mpk.carve(addr, len).map(drop).unwrap_err();
        assert_eq!(
            err(base + PAGE, PAGE),
            PartKeyError::Overlaps {
                addr: base + PAGE,
                len: PAGE
            }
        );
        assert!(matches!(err(base, 2 * PAGE), PartKeyError::Overlaps { .. }));
        assert!(matches!(
            err(base + 100, PAGE),
            PartKeyError::NotInRegion { .. }
        ));
        assert!(matches!(
            err(base + 3 * PAGE, 2 * PAGE),
            PartKeyError::NotInRegion { .. }
        ));
        assert!(matches!(
            err(0x1000, PAGE),
            PartKeyError::NotInRegion { .. }
        ));
        assert_eq!(*r.holes.lock().unwrap(), [(base + PAGE, PAGE)]);
        assert_eq!(mpk.stats().parts, 1);
        drop(p);
    }

    #[test]
    fn a_dropped_part_rejoins_its_region_and_a_released_region_takes_its_parts_keys() {
        let (mpk, mem) = Mpk::simulated(4);
        let base = 0x80_0000;
        let (r, mut parts) = region(mpk, &mem, base, 2);
        let e = mpk.enter(&r).unwrap();
        drop(parts[0].open());
        let k = r.pkey(mpk);
        // Dropped while the region lives (a failed admission): back under its key.
        let first = parts.remove(0);
        let addr = first.extent().0;
        drop(first);
        assert_eq!(mem.key(addr), k);
        assert!(mem.readable(addr));
        mpk.leave(e);
        consistent(mpk, &mem, &[&r, &parts[0].v]);
        // Released: the region and its remaining part are key 0, the part's cache key is
        // free again, and dropping the part afterwards changes nothing.
        let e = mpk.enter(&r).unwrap();
        drop(parts[0].open());
        mpk.leave(e);
        assert_ne!(parts[0].pkey(), mpk.parking);
        mpk.unregister(&r);
        assert_eq!(parts[0].pkey(), mpk.parking);
        assert!(mpk.owners().iter().all(Option::is_none));
        for page in (base..base + 3 * PAGE).step_by(PAGE) {
            assert_eq!(mem.key(page), 0);
        }
        drop(parts);
        assert_eq!(mem.key(base + 2 * PAGE), 0);
        assert_eq!(mpk.stats().parts, 0);
    }
}

#[cfg(test)]
mod replacement_tests {
    //! Which key a miss takes ([`Heat`]), without the hardware ([`sim`]).
    use super::sim::{SimMemory, PAGE};
    use super::*;

    /// `n` one-page simulated regions from `base`.
    fn regions(mpk: &Mpk, mem: &Arc<SimMemory>, base: usize, n: usize) -> Vec<Arc<VKeyShared>> {
        (0..n)
            .map(|i| mpk.sim_region(mem, base + i * PAGE, 1).unwrap())
            .collect()
    }

    /// Enters `v` (asserting its page is open, and only while entered) and leaves.
    fn run(mpk: &Mpk, mem: &SimMemory, v: &Arc<VKeyShared>) {
        let e = mpk.enter(v).unwrap();
        assert!(mem.readable(v.tag.addr()), "region {} not open", v.id);
        mpk.leave(e);
        assert!(!mem.readable(v.tag.addr()));
    }

    /// Every region holding a cache key holds its own, and its page carries it.
    fn consistent(mpk: &Mpk, mem: &SimMemory, all: &[Arc<VKeyShared>]) {
        let mut held = Vec::new();
        for v in all {
            let k = v.pkey(mpk);
            assert_eq!(mem.key(v.tag.addr()), k, "region {}", v.id);
            if k != mpk.parking {
                assert!(!held.contains(&k), "two regions under key {k}");
                held.push(k);
            }
        }
    }

    #[test]
    fn heat_counts_entries_and_halves_each_half_life() {
        let epoch = 1u64 << HEAT_HALF_LIFE;
        let mut h = 0;
        for _ in 0..100 {
            h = Heat::bumped(h, 5);
        }
        assert_eq!(Heat::of(h, 5), 100);
        assert_eq!(Heat::of(h, epoch - 1), 100, "same epoch: no decay");
        assert_eq!(Heat::of(h, epoch), 50);
        assert_eq!(Heat::of(h, 3 * epoch + 7), 12);
        assert_eq!(Heat::of(h, 40 * epoch), 0);
        // Counting later first applies the decay.
        assert_eq!(Heat::of(Heat::bumped(h, 2 * epoch), 2 * epoch), 26);
        let mut h = 0;
        for _ in 0..100_000 {
            h = Heat::bumped(h, 0);
        }
        assert_eq!(Heat::of(h, 0), HEAT_MAX, "counts stop at HEAT_MAX");
        assert_eq!(Heat::of(h, 17 * epoch), 0);
        // The epoch wraps after 2^32 of them; decay goes on across the wrap.
        let wrap = (1u64 << 32) * epoch;
        let h = Heat::bumped(Heat::bumped(0, wrap - epoch), wrap - epoch);
        assert_eq!(Heat::of(h, wrap - epoch), 2);
        assert_eq!(Heat::of(h, wrap), 1);
        // A count stored an epoch ahead of the clock read (it raced a miss): no decay.
        assert_eq!(Heat::of(Heat::bumped(0, 5 * epoch), 4 * epoch), 1);
    }

    #[test]
    fn heavy_tenants_keep_their_keys_while_a_stream_of_light_ones_passes() {
        // 6 keys, 4 heavy tenants, 200 light ones. Between two groups of a heavy tenant
        // 10 light tenants run: 13 other regions, so LRU would take every heavy tenant's
        // key each round (4 misses per round). Here the light ones share the 2 spare keys.
        let (mpk, mem) = Mpk::simulated(6);
        let heavy = regions(mpk, &mem, 0x100_0000, 4);
        let light = regions(mpk, &mem, 0x200_0000, 200);
        for _ in 0..20 {
            heavy.iter().for_each(|v| run(mpk, &mem, v));
        }
        let before = mpk.stats();
        let mut next = 0;
        for _ in 0..100 {
            for v in &heavy {
                run(mpk, &mem, v);
                for _ in 0..10 {
                    run(mpk, &mem, &light[next % light.len()]);
                    next += 1;
                }
            }
        }
        let after = mpk.stats();
        assert_eq!(
            after.misses - before.misses,
            next as u64,
            "every light group misses (200 of them cycle through 2 keys), no heavy one"
        );
        assert_eq!(after.hits - before.hits, 400, "every heavy group hits");
        let all: Vec<_> = heavy.iter().chain(&light).cloned().collect();
        consistent(mpk, &mem, &all);
    }

    #[test]
    fn a_tenant_that_stopped_running_cools_down_and_gives_its_key_up() {
        // 2 keys: A ran 1,000 times, then only light tenants run, each once every 10,000
        // misses (so its own heat stays at a few entries). A keeps its key while its
        // heat is above theirs, and loses it once it has halved to theirs: after about
        // eight half-lives of misses, not before, and not never.
        let (mpk, mem) = Mpk::simulated(2);
        let a = mpk.sim_region(&mem, 0x100_0000, 1).unwrap();
        let light = regions(mpk, &mem, 0x200_0000, 10_000);
        for _ in 0..1000 {
            run(mpk, &mem, &a);
        }
        let ka = a.pkey(mpk);
        assert_ne!(ka, mpk.parking);
        let mut misses = 0u64;
        let mut n = 0;
        while a.pkey(mpk) == ka {
            // Each light tenant runs twice in a row: heat 2 after its miss, then a hit.
            for _ in 0..2 {
                run(mpk, &mem, &light[n % light.len()]);
            }
            n += 1;
            misses += 1;
            assert!(misses < 40 << HEAT_HALF_LIFE, "A never gave its key up");
        }
        let half_lives = misses >> HEAT_HALF_LIFE;
        assert!(
            (7..=9).contains(&half_lives),
            "A (heat 1,000) gave its key up after {misses} misses, {half_lives} half-lives"
        );
        let all: Vec<_> = std::iter::once(a).chain(light).collect();
        consistent(mpk, &mem, &all);
    }
}

#[cfg(test)]
mod retag_failure_tests {
    //! A miss whose `pkey_mprotect` fails, without the hardware ([`sim`]): an error for
    //! the region entered, never a panic, and the cache stays consistent and usable.
    use super::sim::{SimMemory, PAGE};
    use super::*;

    /// A two-page simulated region at `addr`.
    fn region(mpk: &Mpk, mem: &Arc<SimMemory>, addr: usize) -> Arc<VKeyShared> {
        mpk.sim_region(mem, addr, 2).unwrap()
    }

    /// Both pages of `v` carry `key`.
    fn carries(mem: &SimMemory, v: &VKeyShared, key: i32) {
        for page in [v.tag.addr(), v.tag.addr() + PAGE] {
            assert_eq!(mem.key(page), key, "page {page:#x} of region {}", v.id);
        }
    }

    fn refused(e: Result<Entered, EnterError>) -> EnterError {
        match e {
            Ok(_) => panic!("entered a region whose re-tag fails"),
            Err(e) => e,
        }
    }

    const EINVAL: EnterError = EnterError::Retag(SysError {
        call: "pkey_mprotect",
        errno: libc::EINVAL,
    });

    #[test]
    fn a_region_that_cannot_be_tagged_is_refused_and_the_key_goes_to_the_next() {
        let (mpk, mem) = Mpk::simulated(2);
        let (a, b, c) = (
            region(mpk, &mem, 0x10_0000),
            region(mpk, &mem, 0x20_0000),
            region(mpk, &mem, 0x30_0000),
        );
        mpk.leave(mpk.enter(&a).unwrap());
        mpk.leave(mpk.enter(&b).unwrap());
        // `c`'s second page cannot take either cache key: its first page is tagged, then
        // the call fails.
        mem.fail_retags(c.tag.addr() + PAGE, 2);
        mem.fail_retags(c.tag.addr() + PAGE, 3);
        let pkru = mpk.current_pkru();
        assert_eq!(refused(mpk.enter(&c)), EINVAL);
        assert_eq!(mpk.current_pkru(), pkru, "PKRU changed by a failed entry");
        // Back on the parking key, page for page; the victim parked; the key is free.
        carries(&mem, &c, mpk.parking);
        assert_eq!(c.slot.load(Ordering::Relaxed), PARKED);
        let stats = mpk.stats();
        assert_eq!((stats.retag_failures, stats.retired_keys), (1, 0));
        let held = [&a, &b]
            .iter()
            .filter(|v| v.slot.load(Ordering::Relaxed) != PARKED)
            .count();
        assert_eq!(
            held, 1,
            "the victim was parked, its key not handed to anyone"
        );
        assert_eq!(mpk.owners().iter().filter(|o| o.is_some()).count(), 1);
        // Everyone else still runs: both keys are usable, and each region carries its own.
        for v in [&a, &b, &a, &b] {
            let e = mpk.enter(v).unwrap();
            carries(&mem, v, v.pkey(mpk));
            mpk.leave(e);
        }
        assert_ne!(a.pkey(mpk), b.pkey(mpk));
        // Once the call succeeds again, `c` runs too.
        mem.heal();
        let e = mpk.enter(&c).unwrap();
        carries(&mem, &c, c.pkey(mpk));
        assert_ne!(c.pkey(mpk), mpk.parking);
        mpk.leave(e);
    }

    /// The region loading is not blamed for a victim that cannot be parked: the victim
    /// keeps its key, counted as just used, and the miss takes another.
    #[test]
    fn a_victim_that_cannot_be_parked_keeps_its_key_and_the_miss_takes_another() {
        let (mpk, mem) = Mpk::simulated(2);
        let (a, b, c) = (
            region(mpk, &mem, 0x10_0000),
            region(mpk, &mem, 0x20_0000),
            region(mpk, &mem, 0x30_0000),
        );
        mpk.leave(mpk.enter(&a).unwrap());
        mpk.leave(mpk.enter(&b).unwrap());
        // `a`, the least recently used, cannot be parked (its second page refuses).
        mem.fail_retags(a.tag.addr() + PAGE, mpk.parking);
        let e = mpk.enter(&c).unwrap();
        mpk.leave(e);
        // `a` has its key on both pages again; `b` was parked for `c`.
        carries(&mem, &a, a.pkey(mpk));
        assert_ne!(a.pkey(mpk), mpk.parking);
        carries(&mem, &b, mpk.parking);
        carries(&mem, &c, c.pkey(mpk));
        assert_ne!(c.pkey(mpk), a.pkey(mpk));
        let stats = mpk.stats();
        assert_eq!((stats.retag_failures, stats.retired_keys), (1, 0));
        // While `a` still cannot be parked, every entry succeeds all the same, and `a`
        // hits.
        for v in [&b, &c, &a, &b] {
            let e = mpk.enter(v).unwrap();
            carries(&mem, v, v.pkey(mpk));
            mpk.leave(e);
        }
        // Once it can be parked again, it is a victim like any other.
        mem.heal();
        let failures = mpk.stats().retag_failures;
        for v in [&c, &b, &c] {
            mpk.leave(mpk.enter(v).unwrap());
        }
        assert_eq!(mpk.stats().retag_failures, failures);
        assert_eq!(
            a.slot.load(Ordering::Relaxed),
            PARKED,
            "a was not taken once it could be"
        );
    }

    /// When no owner can be parked, the entry fails; it is not the end of the key: a later
    /// entry, once the call succeeds again, takes it.
    #[test]
    fn when_no_owner_can_be_parked_the_entry_fails_and_a_later_one_takes_the_key() {
        let (mpk, mem) = Mpk::simulated(1);
        let (a, b) = (region(mpk, &mem, 0x10_0000), region(mpk, &mem, 0x20_0000));
        mpk.leave(mpk.enter(&a).unwrap());
        mem.fail_retags(a.tag.addr() + PAGE, mpk.parking);
        assert_eq!(refused(mpk.enter(&b)), EINVAL);
        // `a` has its key on both pages again and hits; `b` stays parked.
        carries(&mem, &a, 2);
        carries(&mem, &b, mpk.parking);
        let misses = mpk.stats().misses;
        mpk.leave(mpk.enter(&a).unwrap());
        let stats = mpk.stats();
        assert_eq!(
            (stats.misses, stats.retag_failures, stats.retired_keys),
            (misses, 1, 0)
        );
        mem.heal();
        let e = mpk.enter(&b).unwrap();
        carries(&mem, &b, 2);
        carries(&mem, &a, mpk.parking);
        mpk.leave(e);
    }

    #[test]
    fn a_key_whose_retag_cannot_be_undone_is_retired_and_never_opened_again() {
        let (mpk, mem) = Mpk::simulated(1);
        let (a, b) = (region(mpk, &mem, 0x10_0000), region(mpk, &mem, 0x20_0000));
        mpk.leave(mpk.enter(&a).unwrap());
        // Parking `a` fails at its second page, and so does giving it its key back.
        mem.fail_retags(a.tag.addr() + PAGE, mpk.parking);
        mem.fail_retags(a.tag.addr() + PAGE, 2);
        assert_eq!(refused(mpk.enter(&b)), EINVAL);
        let stats = mpk.stats();
        assert_eq!((stats.retag_failures, stats.retired_keys), (1, 1));
        assert_eq!(a.slot.load(Ordering::Relaxed), PARKED);
        // A page of `a` may still carry key 2: nobody gets it again. With no other key
        // left, an entry is refused at once instead of waiting for one forever.
        mem.heal();
        assert_eq!(refused(mpk.enter(&a)), EnterError::NoKey);
        assert_eq!(refused(mpk.enter(&b)), EnterError::NoKey);
        assert!(mpk.owners().iter().all(Option::is_none));
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
    use crate::{AdmitWithError, ArenaConfig, Domain, MemoryStorage, RegionSealed, TenantTable};

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
        let (state, mut tail) = g.split().unwrap();
        assert_eq!(state[7], 2);
        assert_eq!(tail.len(), 4096 - 64);
        let last = tail.len() - 1;
        tail[last] = 9;
        assert_eq!(tail[last], 9);
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
        let (s, tail) = g.split().unwrap();
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
        // The same range comes back, scrubbed, and works in a plain table too: there the
        // state is packed and the range holds the bytes past it.
        let plain = TenantTable::<u64>::new(t.storage().clone(), 2);
        plain.admit(TenantSlot(0), TenantId(2), 4096, 0).unwrap();
        let e = plain.get_arc(TenantSlot(0)).unwrap();
        assert_eq!(e.tail_extent().map(|t| t.base), Some(base));
        assert_eq!(*e.lock(), 0);
        assert!(e.lock().split().unwrap().1.iter().all(|&b| b == 0));
        assert_eq!(e.pkey(), None);
    }

    /// Admits tenant `id` at `slot` whose init carves the first whole page of the bytes
    /// past its state out under its own key, then keeps using the bytes it borrowed
    /// (the part's included): they keep the tenant's key until that borrow ends.
    fn admit_carving(t: &TenantTable<Vec<PartKey>>, mpk: &'static Mpk, slot: u32, id: u32) {
        t.admit_with(
            TenantSlot(slot),
            TenantId(id),
            4 * PAGE,
            Vec::new(),
            |parts, tail| {
                let skip = (tail.as_ptr() as usize).next_multiple_of(PAGE) - tail.as_ptr() as usize;
                let part = mpk.carve_part(&mut tail[skip..skip + PAGE])?;
                // Still the borrower's: reading and writing them must not fault.
                tail[skip] = 0x42;
                tail[skip + PAGE - 1] = tail[skip] + 1;
                tail[0] = 9;
                parts.push(part);
                Ok::<(), PartKeyError>(())
            },
        )
        .unwrap();
    }

    const PAGE: usize = 4096;

    #[test]
    fn a_carved_part_stays_open_until_the_borrow_ends_then_no_accessor_reaches_it() {
        let Some(mpk) = require_mpk(
            "a_carved_part_stays_open_until_the_borrow_ends_then_no_accessor_reaches_it",
            Mpk::get,
        ) else {
            return;
        };
        let t = table::<Vec<PartKey>>(mpk, 2);
        admit_carving(&t, mpk, 0, 1);
        let e = t.get_arc(TenantSlot(0)).unwrap();
        let mut g = e.lock();
        let (addr, len) = g[0].extent();
        // The borrow ended: the part left the tenant's key for its own.
        assert_ne!(
            open_keys(mpk, mpk.current_pkru()),
            vec![g[0].pkey()],
            "the part is closed while only the tenant's key is open"
        );
        assert_eq!(
            g.split().err(),
            Some(RegionSealed { ranges: 1 }),
            "a slice over the part would fault under the tenant's key"
        );
        {
            // The PartKey itself lives on the heap (key 0); the Vec holding it is in the
            // region, closed while the part is open.
            let part: &PartKey = &g[0];
            let _open = part.open();
            assert_eq!(open_keys(mpk, mpk.current_pkru()), vec![part.pkey()]);
            assert_eq!(
                (crate::sys::peek(addr), crate::sys::peek(addr + len - 1)),
                (0x42, 0x43),
                "the part kept what init wrote into it"
            );
        }
        // The part dropped: its pages are the tenant's again, and so are the bytes.
        g.clear();
        let (_, tail) = g.split().expect("no part left");
        let skip = addr - tail.as_ptr() as usize;
        assert_eq!((tail[0], tail[skip], tail[skip + len - 1]), (9, 0x42, 0x43));
    }

    #[test]
    fn a_tenant_leaving_with_a_carved_part_leaves_its_range_open_and_zero() {
        let Some(mpk) = require_mpk(
            "a_tenant_leaving_with_a_carved_part_leaves_its_range_open_and_zero",
            Mpk::get,
        ) else {
            return;
        };
        let t = table::<Vec<PartKey>>(mpk, 2);
        admit_carving(&t, mpk, 0, 1);
        let base = t.get_arc(TenantSlot(0)).unwrap().extent().base;
        assert!(t.get_arc(TenantSlot(0)).unwrap().lock().split().is_err());
        // It leaves with its part still carved: the part goes with it.
        drop(t.remove(TenantSlot(0)));
        t.admit(TenantSlot(0), TenantId(2), 4 * PAGE, Vec::new())
            .unwrap();
        let e = t.get_arc(TenantSlot(0)).unwrap();
        assert_eq!(e.extent().base, base, "the same range again");
        let mut g = e.lock();
        let (_, tail) = g.split().expect("the successor's bytes are handed out");
        assert!(
            tail.iter().all(|&b| b == 0),
            "scrubbed, the part's pages too"
        );
    }

    #[test]
    fn carving_refuses_overlaps_and_a_failed_admission_gives_the_part_back() {
        let Some(mpk) = require_mpk(
            "carving_refuses_overlaps_and_a_failed_admission_gives_the_part_back",
            Mpk::get,
        ) else {
            return;
        };
        let t = table::<Vec<PartKey>>(mpk, 2);
        let e = t
            .admit_with(
                TenantSlot(0),
                TenantId(1),
                4 * PAGE,
                Vec::new(),
                |parts, tail| {
                    let skip =
                        (tail.as_ptr() as usize).next_multiple_of(PAGE) - tail.as_ptr() as usize;
                    parts.push(mpk.carve_part(&mut tail[skip..skip + PAGE]).unwrap());
                    let twice = mpk.carve_part(&mut tail[skip..skip + PAGE]).unwrap_err();
                    assert!(matches!(twice, PartKeyError::Overlaps { .. }), "{twice}");
                    tail[skip] = 1;
                    Err("a later stage refused")
                },
            )
            .unwrap_err();
        assert_eq!(e, AdmitWithError::Init("a later stage refused"));
        t.admit(TenantSlot(0), TenantId(1), 4 * PAGE, Vec::new())
            .unwrap();
        let e = t.get_arc(TenantSlot(0)).unwrap();
        assert!(e.lock().split().unwrap().1.iter().all(|&b| b == 0));
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
        if mode == "carved-part" {
            let t = table::<Vec<PartKey>>(mpk, 1);
            admit_carving(&t, mpk, 0, 1);
            let e = t.get_arc(TenantSlot(0)).unwrap();
            let g = e.lock();
            let (addr, _) = g[0].extent();
            println!("child: touching {mode}");
            let got = crate::sys::peek(addr);
            println!("child: survived {mode}: {got}");
            return;
        }
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
        for mode in ["neighbour-cached", "after-leave", "carved-part"] {
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
