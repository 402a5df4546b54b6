//! Tenant Table: a dense slot index -> the tenant admitted there, its region and its state.
//!
//! Readers (workers) go through [`TenantTable::get`]: one array index and one `arc_swap`
//! load, no lock and no allocation. Writers (the control thread: [`TenantTable::admit`],
//! [`TenantTable::remove`]; the data plane: [`TenantTable::remove_and_retire`],
//! [`TenantTable::release`], [`TenantTable::publish`]) serialise on a `Mutex` that readers
//! never touch, and publish an entry with a single atomic swap of its slot, so admitting
//! or removing one tenant never pauses traffic of the others.
//!
//! That `Mutex` guards bookkeeping only and is never held while an NF's `init` runs, which
//! may take long (an eBPF tenant's own program is verified there): an admission reserves
//! its slot and its id under the lock, builds and initialises the entry without it, and
//! takes it again to publish the entry or, if that failed, to give the reservation back.
//! A reserved slot is neither handed to another admission nor seen as admitted.
//!
//! A removed entry stays alive as long as some worker still holds it (it holds an `Arc`);
//! its state is dropped and its region scrubbed and released when the last one lets go —
//! which may be on that worker's thread.

use std::fmt;
use std::mem;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use arc_swap::{ArcSwapOption, Guard};
use buffet_sdk::{RegistryError, TenantId, TenantRegistry, TenantSlot};

use crate::domain::{Domain, RegionExtent};
use crate::mpk::{EnterError, Entered, Mpk, VKeyShared};
use crate::storage::{AllocError, MemoryStorage, Region, PACKED_ALIGN, PACKED_MAX_BYTES};
use crate::sys::{CellGuard, PlaceError, StateCell, SysError};

/// Why the Memory Manager did not admit (or re-initialise) a tenant. Whatever the
/// reason, the table is left unchanged (and the state passed in is dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The tenant registry refused: duplicate id, slot occupied, retired or out of range,
    /// table full, unknown tenant.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The state is larger than the region asked for.
    #[error("tenant state of {state_bytes} bytes does not fit a region of {region_bytes} bytes")]
    StateTooLarge {
        /// `size_of` the state type.
        state_bytes: usize,
        /// The region size asked for.
        region_bytes: usize,
    },
    /// The state type needs more alignment than a page gives.
    #[error("tenant state needs {align}-byte alignment, more than a page ({page_size} bytes)")]
    StateOverAligned {
        /// `align_of` the state type.
        align: usize,
        /// The page size.
        page_size: usize,
    },
    /// No region could be allocated (too large, arena exhausted, kernel refusal).
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The region could not be tagged with its MPK protection key.
    #[error("tagging the tenant region with its protection key: {0}")]
    Tag(SysError),
    /// The pages the initialiser sealed inside the region (guard pages) could not be
    /// sealed.
    #[error("sealing guard pages inside the tenant region: {0} (each sealed range splits a kernel mapping: if this is ENOMEM, raise `sysctl vm.max_map_count`)")]
    Seal(SysError),
    /// The new region could not be opened in its MPK domain to run the initialiser.
    #[error(transparent)]
    Enter(#[from] EnterError),
    /// A [`Replacement`] was prepared for an earlier admission of its tenant: the tenant
    /// was removed and admitted again at the same slot since, and the new admission's
    /// state is not the one it was built to replace.
    #[error(
        "the tenant was removed and admitted again at its slot since its new state was \
         prepared; the new state is dropped: update the tenant as it is admitted now"
    )]
    StaleReplacement {
        /// The tenant.
        tenant: TenantId,
    },
}

/// Why [`TenantTable::admit_with`] did not admit a tenant: the table refused, or the
/// initialiser did. Either way the table is unchanged.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmitWithError<E> {
    /// The table refused (slot, id, size, memory).
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The initialiser returned an error.
    #[error("initialising the tenant state in its region: {0}")]
    Init(E),
}

/// One admitted tenant: its id, its region, and its state `S`, which lives in the region.
///
/// Laid out for the worker, which reads the id, the isolation key and the state's address
/// and takes the state lock once per group: those come first, in one cache line (the
/// entry is line-aligned; the `Arc`'s counts sit in the line before, which a worker that
/// keeps its `Arc` never touches).
#[repr(C, align(64))]
pub struct TenantEntry<S> {
    id: TenantId,
    slot: TenantSlot,
    /// The region's MPK virtual key (MPK tables only).
    vkey: Option<(&'static Mpk, Arc<VKeyShared>)>,
    /// Its state pointer and lock first, then the region.
    cell: StateCell<S>,
    domain: Domain,
    extent: RegionExtent,
    tail: Option<RegionExtent>,
}

// The fields a worker touches per group (id, isolation key, state pointer and lock) share
// the entry's first cache line.
const _: () = assert!(
    mem::offset_of!(TenantEntry<u64>, cell) + crate::sys::CELL_HOT_BYTES <= 64
        && mem::align_of::<TenantEntry<u64>>() == 64
);

impl<S> Drop for TenantEntry<S> {
    fn drop(&mut self) {
        // Before the cell drops the state in place and releases the region: give up the
        // cache key and tag the region with key 0 again.
        if let Some((mpk, v)) = &self.vkey {
            mpk.unregister(v);
        }
    }
}

impl<S: Send> TenantEntry<S> {
    /// The tenant.
    pub fn id(&self) -> TenantId {
        self.id
    }

    /// The slot it was admitted at.
    pub fn slot(&self) -> TenantSlot {
        self.slot
    }

    /// Bytes of its regions: the state's and, when they are apart, its untyped bytes'.
    pub fn region_len(&self) -> usize {
        self.cell.region_len()
    }

    /// Where the region holding its state lies (the state at its base).
    pub fn extent(&self) -> RegionExtent {
        self.extent
    }

    /// Where its untyped bytes ([`StateGuard::split`]) lie when they have a page region of
    /// their own, apart from a packed state; `None` when they follow the state in its
    /// region, or it has none.
    pub fn tail_extent(&self) -> Option<RegionExtent> {
        self.tail
    }

    /// Its isolation domain.
    pub fn domain(&self) -> Domain {
        self.domain
    }

    /// The protection key its region carries right now: a cache key while loaded, the
    /// parking key otherwise. `None` outside the MPK domain.
    pub fn pkey(&self) -> Option<i32> {
        self.vkey.as_ref().map(|(mpk, v)| v.pkey(mpk))
    }

    /// Exclusive access to the state, for one group of packets.
    ///
    /// One atomic compare-and-swap when uncontended. While another thread holds it —
    /// only for the instant a tenant migrates between workers — this spins, then yields.
    /// Not reentrant: locking twice on one thread never returns.
    ///
    /// Enters the entry's isolation domain; the guard leaves it when dropped. A panic while
    /// holding the guard releases the lock (no poisoning): quarantining the tenant is the
    /// caller's decision.
    ///
    /// # Panics
    ///
    /// If the domain cannot be entered (MPK: the region's key could not be loaded,
    /// [`EnterError`]). Code that must go on — a worker — uses
    /// [`lock_checked`](Self::lock_checked).
    #[inline]
    pub fn lock(&self) -> StateGuard<'_, S> {
        self.lock_checked().unwrap_or_else(|e| self.cannot_enter(e))
    }

    /// Like [`lock`](Self::lock), but a domain that cannot be entered is an error instead
    /// of a panic: the lock is released again, the state untouched, and the failure
    /// belongs to this tenant alone (the key cache stays usable for the others). Always
    /// `Ok` outside the MPK domain.
    #[inline]
    pub fn lock_checked(&self) -> Result<StateGuard<'_, S>, EnterError> {
        self.guard(self.cell.lock())
    }

    /// Like [`lock`](Self::lock), but `None` instead of waiting if another thread holds it.
    ///
    /// # Panics
    ///
    /// As [`lock`](Self::lock).
    #[inline]
    pub fn try_lock(&self) -> Option<StateGuard<'_, S>> {
        self.try_lock_checked()
            .map(|r| r.unwrap_or_else(|e| self.cannot_enter(e)))
    }

    /// Like [`try_lock`](Self::try_lock), with the domain's failure as an error
    /// ([`lock_checked`](Self::lock_checked)).
    #[inline]
    pub fn try_lock_checked(&self) -> Option<Result<StateGuard<'_, S>, EnterError>> {
        self.cell.try_lock().map(|g| self.guard(g))
    }

    /// Whether a thread holds the state right now (a worker running a group of it), without
    /// taking it or entering its domain.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.cell.is_locked()
    }

    // Always inlined: once per packet group on the worker path, where a call cost as much
    // as the rest of taking the lock (docs/results/notes.md).
    #[inline(always)]
    fn guard<'a>(&'a self, inner: CellGuard<'a, S>) -> Result<StateGuard<'a, S>, EnterError> {
        let entered = match &self.vkey {
            Some((mpk, v)) => Some((*mpk, mpk.enter(v)?)),
            None => None,
        };
        Ok(StateGuard { inner, entered })
    }

    #[cold]
    #[inline(never)]
    fn cannot_enter(&self, e: EnterError) -> ! {
        panic!("buffet-memory: tenant {}: {e}", self.id)
    }
}

impl<S> fmt::Debug for TenantEntry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantEntry")
            .field("id", &self.id)
            .field("slot", &self.slot)
            .field("domain", &self.domain)
            .field("extent", &self.extent)
            .finish_non_exhaustive()
    }
}

/// Exclusive access to one tenant's state; derefs to it. Unlocks (and leaves the
/// isolation domain) on drop.
///
/// In the MPK domain the thread that holds the guard is the only one whose PKRU opens the
/// tenant's region, and only until the guard drops: do not keep references into the
/// region beyond it, and do not hand them to another thread.
pub struct StateGuard<'a, S> {
    inner: CellGuard<'a, S>,
    entered: Option<(&'static Mpk, Entered)>,
}

impl<S> StateGuard<'_, S> {
    /// The state and the bytes of the region past it — from `size_of::<S>()` rounded up to
    /// 64 bytes to the end of the region; empty when the state fills it — both exclusive
    /// for as long as the guard is borrowed. For NFs whose state is (also) untyped memory:
    /// C NFs, eBPF programs.
    ///
    /// Refused while pages of those bytes are sealed ([`seal_pages`](crate::seal_pages),
    /// e.g. the guard pages a chain keeps between its stages' parts): a reference over a
    /// sealed page would fault. Pages sealed during the borrow are sealed when the
    /// [`RegionBytesMut`](crate::RegionBytesMut) drops.
    pub fn split(&mut self) -> Result<(&mut S, crate::RegionBytesMut<'_>), crate::RegionSealed> {
        self.inner.split()
    }
}

impl<S> Deref for StateGuard<'_, S> {
    type Target = S;
    #[inline]
    fn deref(&self) -> &S {
        &self.inner
    }
}

impl<S> DerefMut for StateGuard<'_, S> {
    #[inline]
    fn deref_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S> Drop for StateGuard<'_, S> {
    #[inline]
    fn drop(&mut self) {
        // Runs before `inner` drops, so the domain closes before the lock opens.
        if let Some((mpk, e)) = self.entered.take() {
            mpk.leave(e);
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for StateGuard<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// What [`TenantTable::get`] returns: a cheap, non-allocating hold on one slot's current
/// entry (an `arc_swap` guard). Derefs to `Option<Arc<TenantEntry<S>>>` (`None`: the slot
/// is empty or out of range). Hold it for one packet group, not indefinitely: convert with
/// [`TenantRef::into_arc`] to keep the entry longer.
pub struct TenantRef<S>(Guard<Option<Arc<TenantEntry<S>>>>);

impl<S> TenantRef<S> {
    /// The entry, if the slot holds one.
    #[inline]
    pub fn entry(&self) -> Option<&TenantEntry<S>> {
        self.0.as_deref()
    }

    /// A full reference-counted handle to the entry.
    pub fn into_arc(self) -> Option<Arc<TenantEntry<S>>> {
        Guard::into_inner(self.0)
    }
}

impl<S> Deref for TenantRef<S> {
    type Target = Option<Arc<TenantEntry<S>>>;
    #[inline]
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<S> fmt::Debug for TenantRef<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TenantRef").field(&self.entry()).finish()
    }
}

/// A tenant's new entry, built and initialised but not yet published (see
/// [`TenantTable::prepare_replacement`]), for the admission of the tenant it was built
/// for.
pub struct Replacement<S> {
    entry: Arc<TenantEntry<S>>,
    /// The slot's admission count when it was prepared ([`Registry::admissions`]).
    admission: u64,
}

impl<S> fmt::Debug for Replacement<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replacement")
            .field("tenant", &self.entry.id)
            .field("admission", &self.admission)
            .finish()
    }
}

/// The tenant registry, and which of its tenants are still being admitted.
struct Registry {
    /// Tenant id <-> slot, free and retired slots. A tenant being admitted is recorded
    /// here from the start, so neither its slot nor its id is handed out twice.
    tenants: TenantRegistry,
    /// Slots reserved by admissions whose entry is not published yet (its `init` runs
    /// without the lock). Few: one per admission in progress.
    admitting: Vec<TenantSlot>,
    /// Per slot: admissions published there so far. A replacement is published only over
    /// the admission it was prepared for.
    admissions: Box<[u64]>,
}

impl Registry {
    fn is_admitting(&self, slot: TenantSlot) -> bool {
        self.admitting.contains(&slot)
    }

    /// The tenant whose entry is published at `slot` (not one still being admitted).
    fn id_of(&self, slot: TenantSlot) -> Option<TenantId> {
        self.tenants
            .id_of(slot)
            .filter(|_| !self.is_admitting(slot))
    }

    /// The slot of tenant `id`, if its entry is published.
    fn slot_of(&self, id: TenantId) -> Option<TenantSlot> {
        self.tenants
            .slot_of(id)
            .filter(|&slot| !self.is_admitting(slot))
    }

    /// Records tenant `id` at the slot `pick` chooses (and checks) as being admitted.
    fn reserve(
        &mut self,
        pick: impl FnOnce(&mut TenantRegistry) -> Result<TenantSlot, RegistryError>,
    ) -> Result<TenantSlot, RegistryError> {
        let slot = pick(&mut self.tenants)?;
        self.admitting.push(slot);
        Ok(slot)
    }

    /// Ends the admission in progress at `slot`: its entry is about to be published.
    fn admitted(&mut self, slot: TenantSlot) {
        if let Some(i) = self.admitting.iter().position(|&s| s == slot) {
            self.admitting.swap_remove(i);
        }
    }
}

/// An admission in progress: its tenant holds `slot` in the registry, its entry not yet
/// published. Dropped unpublished (the build failed, or `init` panicked), it gives
/// the slot and the id back.
struct Reservation<'a, S: Send + 'static> {
    table: &'a TenantTable<S>,
    slot: TenantSlot,
}

impl<S: Send + 'static> Reservation<'_, S> {
    /// Publishes the entry built for the reserved slot.
    fn publish(self, entry: Arc<TenantEntry<S>>) {
        let slot = self.slot;
        let table = self.table;
        mem::forget(self);
        let mut registry = table.registry();
        registry.admitted(slot);
        registry.admissions[slot.index()] += 1;
        table.slots[slot.index()].store(Some(entry));
        table.bump(slot);
        table.len.fetch_add(1, Ordering::Release);
    }
}

impl<S: Send + 'static> Drop for Reservation<'_, S> {
    fn drop(&mut self) {
        let mut registry = self.table.registry();
        registry.admitted(self.slot);
        registry.tenants.remove(self.slot);
    }
}

/// The Tenant Table: a fixed number of slots, each empty or holding one [`TenantEntry`].
pub struct TenantTable<S> {
    slots: Box<[ArcSwapOption<TenantEntry<S>>]>,
    /// Per slot: bumped after every admit or remove at that slot, so a reader may cache
    /// an entry and revalidate it with one plain load.
    generations: Box<[AtomicU64]>,
    /// Bumped after every admit or remove anywhere.
    changes: AtomicU64,
    /// The tenant registry (tenant id <-> slot, free and retired slots) and the
    /// admissions in progress. Also serialises every change to the table; never held
    /// while an NF's `init` runs, so the data plane may take it.
    registry: Mutex<Registry>,
    len: AtomicUsize,
    storage: MemoryStorage,
    mpk: Option<&'static Mpk>,
}

impl<S: Send + 'static> TenantTable<S> {
    /// An empty table of `capacity_slots` slots (8 bytes each) whose regions come from
    /// `storage`. Entries get [`Domain::None`].
    pub fn new(storage: MemoryStorage, capacity_slots: u32) -> Self {
        TenantTable {
            slots: (0..capacity_slots)
                .map(|_| ArcSwapOption::empty())
                .collect(),
            generations: (0..capacity_slots).map(|_| AtomicU64::new(0)).collect(),
            changes: AtomicU64::new(0),
            registry: Mutex::new(Registry {
                tenants: TenantRegistry::new(capacity_slots),
                admitting: Vec::new(),
                admissions: vec![0; capacity_slots as usize].into_boxed_slice(),
            }),
            len: AtomicUsize::new(0),
            storage,
            mpk: None,
        }
    }

    /// Like [`new`](Self::new), but entries get [`Domain::Mpk`]: every region carries a
    /// non-zero protection key of `mpk` and is open only to the thread holding its guard.
    pub fn with_mpk(storage: MemoryStorage, capacity_slots: u32, mpk: &'static Mpk) -> Self {
        TenantTable {
            mpk: Some(mpk),
            ..TenantTable::new(storage, capacity_slots)
        }
    }

    /// The isolation domain of every entry.
    pub fn domain(&self) -> Domain {
        match self.mpk {
            Some(_) => Domain::Mpk,
            None => Domain::None,
        }
    }

    /// Admits tenant `id` at `slot`: allocates a region of `bytes` (rounded up to pages;
    /// must hold `S`), moves `state` into it, and publishes the entry. Readers see either
    /// no entry or the complete one. On error nothing changes and `state` is dropped.
    pub fn admit(
        &self,
        slot: TenantSlot,
        id: TenantId,
        bytes: usize,
        state: S,
    ) -> Result<(), MemoryError> {
        self.admit_with(slot, id, bytes, state, |_, _| {
            Ok::<(), std::convert::Infallible>(())
        })
        .map_err(|e| match e {
            AdmitWithError::Memory(e) => e,
            AdmitWithError::Init(never) => match never {},
        })
    }

    /// Like [`admit`](Self::admit), but before publishing runs `init` on the state *in its
    /// region*, inside the entry's isolation domain, with the region's bytes past the state
    /// (see [`StateGuard::split`]) — the paper's `buffet_state_init(policy, region)`. If
    /// `init` fails, nothing is published, the state is dropped and the region released.
    ///
    /// `init` runs without the table's lock, so it may take long without holding up any
    /// other change to the table (removals, releases, replacements, other admissions).
    /// Meanwhile `slot` and `id` are reserved: another admission of either is refused
    /// (`SlotOccupied`, `AlreadyAdmitted`), and the tenant is not admitted yet to
    /// [`slot_of`](Self::slot_of), [`id_of`](Self::id_of), [`ids`](Self::ids),
    /// [`remove`](Self::remove) or a replacement.
    pub fn admit_with<E>(
        &self,
        slot: TenantSlot,
        id: TenantId,
        bytes: usize,
        state: S,
        init: impl FnOnce(&mut S, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), AdmitWithError<E>> {
        let reservation = self.reserve(|r| r.admit(slot, id).map(|()| slot))?;
        let entry = self.build_entry(slot, id, bytes, state, init)?;
        reservation.publish(entry);
        Ok(())
    }

    /// Reserves the slot `pick` records tenant `id` at, until the returned reservation is
    /// published or dropped.
    fn reserve(
        &self,
        pick: impl FnOnce(&mut TenantRegistry) -> Result<TenantSlot, RegistryError>,
    ) -> Result<Reservation<'_, S>, MemoryError> {
        let slot = self.registry().reserve(pick)?;
        Ok(Reservation { table: self, slot })
    }

    /// Admits tenant `id` like [`admit_with`](Self::admit_with) in a slot the registry
    /// picks: the lowest slot neither occupied nor retired (see
    /// [`remove_and_retire`](Self::remove_and_retire)). This is the one admission path of
    /// a pipeline: the slot it returns is the tenant's index in every other per-tenant
    /// table (dispatcher, worker counters).
    pub fn admit_next<E>(
        &self,
        id: TenantId,
        bytes: usize,
        state: S,
        init: impl FnOnce(&mut S, &mut [u8]) -> Result<(), E>,
    ) -> Result<TenantSlot, AdmitWithError<E>> {
        let reservation = self.reserve(|r| r.admit_next(id))?;
        let slot = reservation.slot;
        let entry = self.build_entry(slot, id, bytes, state, init)?;
        reservation.publish(entry);
        Ok(slot)
    }

    /// Re-initialises tenant `id` (a policy update): builds a new entry in its slot
    /// exactly as [`admit_with`](Self::admit_with) does — new region, `state` moved in,
    /// `init` run in its domain — and, only if that succeeded, publishes it in place of
    /// the old one with one atomic swap. Workers finish the group they hold on the old
    /// entry and pick up the new one at their next lookup (the slot's generation
    /// changes). On error the old entry keeps serving, unchanged. Returns the old entry.
    ///
    /// [`prepare_replacement`](Self::prepare_replacement) then [`publish`](Self::publish):
    /// `init` runs without the table's lock, and a tenant removed meanwhile is refused
    /// (`Unknown`, or `StaleReplacement` once admitted again at the slot) with the new
    /// entry dropped.
    pub fn replace_with<E>(
        &self,
        id: TenantId,
        bytes: usize,
        state: S,
        init: impl FnOnce(&mut S, &mut [u8]) -> Result<(), E>,
    ) -> Result<Arc<TenantEntry<S>>, AdmitWithError<E>> {
        let new = self.prepare_replacement(id, bytes, state, init)?;
        Ok(self.publish(new)?)
    }

    /// The first half of [`replace_with`](Self::replace_with), for a caller that must
    /// publish the new entry at a moment of its choosing (a policy and a rules change in
    /// one data-plane step): builds and initialises tenant `id`'s new entry in a new
    /// region while the old one keeps serving, and returns it unpublished. Dropping the
    /// [`Replacement`] frees its region; [`publish`](Self::publish) swaps it in.
    pub fn prepare_replacement<E>(
        &self,
        id: TenantId,
        bytes: usize,
        state: S,
        init: impl FnOnce(&mut S, &mut [u8]) -> Result<(), E>,
    ) -> Result<Replacement<S>, AdmitWithError<E>> {
        let (slot, admission) = {
            let registry = self.registry();
            let slot = registry
                .slot_of(id)
                .ok_or(MemoryError::from(RegistryError::Unknown(id)))?;
            (slot, registry.admissions[slot.index()])
        };
        let entry = self.build_entry(slot, id, bytes, state, init)?;
        Ok(Replacement { entry, admission })
    }

    /// Publishes a [`Replacement`] in place of its tenant's entry with one atomic swap (as
    /// [`replace_with`](Self::replace_with) does) and returns the old entry. Refused, the
    /// replacement dropped, when the tenant no longer holds the slot it was built for
    /// (`Unknown`), or holds it under a later admission (`StaleReplacement`: removed and
    /// admitted again since it was prepared).
    pub fn publish(&self, r: Replacement<S>) -> Result<Arc<TenantEntry<S>>, MemoryError> {
        let Replacement { entry, admission } = r;
        let registry = self.registry();
        let (id, slot) = (entry.id, entry.slot);
        // A tenant admitted again at the same slot and still in its `init` has nothing
        // published to replace: `id_of` does not count it.
        if registry.id_of(slot) != Some(id) {
            return Err(RegistryError::Unknown(id).into());
        }
        if registry.admissions[slot.index()] != admission {
            return Err(MemoryError::StaleReplacement { tenant: id });
        }
        let old = self.slots[slot.index()]
            .swap(Some(entry))
            .ok_or(MemoryError::from(RegistryError::Unknown(id)))?;
        self.bump(slot);
        drop(registry);
        Ok(old)
    }

    /// A new, initialised entry for `id` at `slot`, not yet published.
    fn build_entry<E>(
        &self,
        slot: TenantSlot,
        id: TenantId,
        bytes: usize,
        state: S,
        init: impl FnOnce(&mut S, &mut [u8]) -> Result<(), E>,
    ) -> Result<Arc<TenantEntry<S>>, AdmitWithError<E>> {
        let page = self.storage.page_size();
        if mem::align_of::<S>() > page {
            return Err(MemoryError::StateOverAligned {
                align: mem::align_of::<S>(),
                page_size: page,
            }
            .into());
        }
        if mem::size_of::<S>() > bytes {
            return Err(MemoryError::StateTooLarge {
                state_bytes: mem::size_of::<S>(),
                region_bytes: bytes,
            }
            .into());
        }
        let (region, tail) = self.regions(bytes)?;
        let extent = region.extent();
        let tail_extent = tail.as_ref().map(Region::extent);
        let state = StateCell::place(region, tail, state).map_err(|e| match e {
            // Both checked above; kept as errors rather than panics all the same.
            PlaceError::TooLarge { size, region } => MemoryError::StateTooLarge {
                state_bytes: size,
                region_bytes: region,
            },
            PlaceError::Misaligned { align } => MemoryError::StateOverAligned {
                align,
                page_size: page,
            },
        })?;
        let vkey = match self.mpk {
            Some(mpk) => {
                let tag = state
                    .tag()
                    .expect("an MPK table keeps each state and its bytes in one page region");
                Some((mpk, mpk.register(tag).map_err(MemoryError::Tag)?))
            }
            None => None,
        };
        let entry = Arc::new(TenantEntry {
            id,
            slot,
            domain: self.domain(),
            extent,
            tail: tail_extent,
            vkey,
            cell: state,
        });
        {
            let mut guard = entry.lock_checked().map_err(MemoryError::from)?;
            let (state, mut tail) = guard.split().expect("a new region has no sealed pages");
            init(state, &mut tail).map_err(AdmitWithError::Init)?;
            // The guard pages `init` sealed, sealed now that its borrow of the bytes ended.
            tail.seal().map_err(MemoryError::Seal)?;
        }
        Ok(entry)
    }

    /// Where a state of type `S` with `bytes` in all goes. The layout follows the isolation
    /// level: outside MPK the type system keeps tenants apart, so a small state is packed
    /// beside its neighbours ([`MemoryStorage::alloc_packed`]) and the untyped bytes past
    /// it, if any (C and eBPF NFs keep their state there), get a page region of their own
    /// between guard pages. In the MPK domain a protection key tags whole pages, so the
    /// state and its bytes share one page region, as do states too large or too aligned
    /// to pack.
    fn regions(&self, bytes: usize) -> Result<(Region, Option<Region>), MemoryError> {
        let state = mem::size_of::<S>();
        let packable =
            self.mpk.is_none() && mem::align_of::<S>() <= PACKED_ALIGN && state <= PACKED_MAX_BYTES;
        if !packable {
            return Ok((self.storage.alloc(bytes)?, None));
        }
        // The tail first: if the state's part then fails, the page region goes back
        // whole, and a failed admission leaves the storage as it was.
        let tail = match bytes.saturating_sub(crate::sys::tail_offset::<S>()) {
            0 => None,
            tail => Some(self.storage.alloc(tail)?),
        };
        Ok((self.storage.alloc_packed(state)?, tail))
    }

    /// Removes the tenant at `slot` like [`remove`](Self::remove), but keeps the slot from
    /// reuse: packets of the removed tenant may still be queued under it.
    /// [`release`](Self::release) makes it reusable once they drained; `remove` alone makes
    /// it reusable at once.
    pub fn remove_and_retire(&self, slot: TenantSlot) -> Option<Arc<TenantEntry<S>>> {
        let mut registry = self.registry();
        // Only a slot whose entry is published retires (the registry would retire a free
        // one too, or one an admission in progress reserved).
        registry.id_of(slot)?;
        registry.tenants.retire(slot)?;
        self.unpublish(slot)
    }

    /// Makes a retired slot reusable.
    pub fn release(&self, slot: TenantSlot) {
        self.registry().tenants.release(slot);
    }

    /// The entry at `slot`, for one packet group. Lock-free, no allocation.
    #[inline]
    pub fn get(&self, slot: TenantSlot) -> TenantRef<S> {
        match self.slots.get(slot.index()) {
            Some(cell) => TenantRef(cell.load()),
            None => TenantRef(Guard::from_inner(None)),
        }
    }

    /// The entry at `slot` as a full `Arc` (one reference-count increment), for holders
    /// that keep it beyond one packet group.
    pub fn get_arc(&self, slot: TenantSlot) -> Option<Arc<TenantEntry<S>>> {
        self.slots.get(slot.index())?.load_full()
    }

    /// Unpublishes the entry at `slot` and returns it. New lookups miss at once; its state
    /// and region are released when the last holder (this `Arc`, an in-flight reader)
    /// drops it. `None`, changing nothing, when no entry is published there (also while
    /// an admission at `slot` is still in its `init`).
    pub fn remove(&self, slot: TenantSlot) -> Option<Arc<TenantEntry<S>>> {
        let mut registry = self.registry();
        registry.id_of(slot)?;
        registry.tenants.remove(slot)?;
        self.unpublish(slot)
    }

    /// Empties a slot the registry just let go of (caller holds the registry lock).
    fn unpublish(&self, slot: TenantSlot) -> Option<Arc<TenantEntry<S>>> {
        let old = self.slots.get(slot.index())?.swap(None)?;
        self.bump(slot);
        self.len.fetch_sub(1, Ordering::Release);
        Some(old)
    }

    /// Marks `slot` changed; called after the slot's new content is published, so a
    /// reader that sees the new generation also sees the new content.
    fn bump(&self, slot: TenantSlot) {
        self.generations[slot.index()].fetch_add(1, Ordering::Release);
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The generation of `slot`: it changes whenever the slot's entry is admitted,
    /// replaced or removed. A worker that cached an entry under generation `g` may keep
    /// using it while `generation(slot) == g` (one plain load instead of a reference-count
    /// round trip per packet group). 0 for slots out of range.
    #[inline]
    pub fn generation(&self, slot: TenantSlot) -> u64 {
        self.generations
            .get(slot.index())
            .map_or(0, |g| g.load(Ordering::Acquire))
    }

    /// Admissions, replacements and removals so far, anywhere in the table: cheap to poll
    /// for "something changed, revalidate cached entries".
    #[inline]
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Number of admitted tenants.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether no tenant is admitted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The slot tenant `id` is admitted at (`None` while its admission is in progress).
    pub fn slot_of(&self, id: TenantId) -> Option<TenantSlot> {
        self.registry().slot_of(id)
    }

    /// The tenant admitted at `slot` (`None` while its admission is in progress). Takes
    /// the table's lock, briefly; [`published_id`](Self::published_id) takes none.
    pub fn id_of(&self, slot: TenantSlot) -> Option<TenantId> {
        self.registry().id_of(slot)
    }

    /// The tenant whose entry is published at `slot`, without taking any lock (one
    /// `arc_swap` load): for the data plane's per-slot lookups.
    pub fn published_id(&self, slot: TenantSlot) -> Option<TenantId> {
        self.get(slot).entry().map(|e| e.id)
    }

    /// Every admitted tenant with its slot, in slot order.
    pub fn ids(&self) -> Vec<(TenantSlot, TenantId)> {
        let registry = self.registry();
        registry
            .tenants
            .iter()
            .filter(|&(slot, _)| !registry.is_admitting(slot))
            .collect()
    }

    /// The storage regions come from.
    pub fn storage(&self) -> &MemoryStorage {
        &self.storage
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // Mutated only by single non-panicking calls, so still consistent if poisoned.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S> fmt::Debug for TenantTable<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantTable")
            .field("capacity", &self.slots.len())
            .field("len", &self.len.load(Ordering::Relaxed))
            .field("domain", &self.mpk.map_or(Domain::None, |_| Domain::Mpk))
            .field("storage", &self.storage)
            .finish()
    }
}
