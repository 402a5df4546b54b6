//! Every `unsafe` operation of buffet-memory lives here, and only here.
//!
//! Three small pieces, each keeping its own invariant so that the safe code around it
//! cannot break memory safety even if it has a bug:
//!
//! * [`Mapping`]: one anonymous `PROT_NONE` reservation (`mmap` / `munmap`), plus a
//!   *claim registry* of the ranges currently handed out. [`Mapping::open`] refuses a
//!   range that overlaps a live claim, so two [`OpenSpan`]s never alias, whatever the
//!   allocator in `storage.rs` does.
//! * [`OpenSpan`]: exclusive ownership of one claimed, readable and writable range.
//!   [`OpenSpan::retire`] scrubs it to zero, makes it `PROT_NONE` and drops the claim.
//! * [`PackedBlock`]: exclusive ownership of a cache-line-aligned part of an open span (a
//!   packed chunk); the storage's packed free list hands each part to one block at a time
//!   and keeps the chunk open while any of its blocks lives.
//! * [`StateCell`]: a value of type `S` placed at the start of a [`Region`], behind a
//!   one-word spin lock; the lock's guard is the only way to reach the value (and the
//!   region's untyped bytes, past it or in a region of their own, [`CellGuard::split`]).
//! * Intel MPK: `pkey_alloc` / `pkey_mprotect` by raw syscall, `RDPKRU` / `WRPKRU` by
//!   inline assembly, and [`RegionTag`], the capability to move one live region to another
//!   protection key. The key cache built on them is `mpk.rs`.
//!
//! Every syscall failure becomes a [`SysError`] carrying the call's name and `errno`.

use std::collections::BTreeMap;
use std::io;
use std::marker::PhantomData;
use std::mem;
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::storage::Region;

/// A system call failed: which one, and the `errno` it left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{call}` failed: {}", io::Error::from_raw_os_error(*errno))]
pub struct SysError {
    /// The call's name (`mmap`, `mprotect`, `madvise`, …).
    pub call: &'static str,
    /// The `errno` value it returned.
    pub errno: i32,
}

impl SysError {
    /// The error of the call that just failed, read from `errno`.
    fn last(call: &'static str) -> Self {
        SysError {
            call,
            errno: io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }

    /// The same error as a [`std::io::Error`].
    pub fn io_error(&self) -> io::Error {
        io::Error::from_raw_os_error(self.errno)
    }
}

/// The size of a virtual-memory page, in bytes.
pub(crate) fn page_size() -> usize {
    // SAFETY: `sysconf` only reads a system constant; `_SC_PAGESIZE` is a valid name and
    // the call has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    // POSIX requires the page size to be known; fall back to the smallest common one.
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// How a released range is brought back to all-zero bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scrub {
    /// `madvise(MADV_DONTNEED)`: for a private anonymous mapping the kernel drops the pages
    /// and maps zero-filled ones on the next touch; the physical memory goes back to the
    /// system. Falls back to [`Scrub::Zero`] if the call fails.
    Discard,
    /// Write zeros over the range (keeps the pages resident).
    Zero,
}

impl Scrub {
    /// `Discard` where `MADV_DONTNEED` is known to give zero pages (Linux); `Zero` elsewhere.
    pub(crate) const PLATFORM: Scrub = if cfg!(target_os = "linux") {
        Scrub::Discard
    } else {
        Scrub::Zero
    };
}

/// Why [`Mapping::open`] refused a range.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OpenError {
    /// The range is empty, unaligned or not inside the reservation.
    OutOfBounds,
    /// The range overlaps one that is handed out: the allocator has a bug.
    Overlap { other_off: usize, other_len: usize },
    /// `mprotect` refused to make the range accessible.
    Sys(SysError),
}

/// One anonymous reservation of address space, `PROT_NONE` except where an [`OpenSpan`]
/// has opened it. Unmapped when the last reference (the storage or any span) goes away.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
    page: usize,
    /// Live claims by offset. Disjoint by construction (see [`Mapping::open`]).
    claims: Mutex<BTreeMap<usize, Claim>>,
}

/// One live claim of a [`Mapping`]: its length, and the pages sealed inside it.
struct Claim {
    len: usize,
    /// Whether pages of it may be sealed ([`seal_pages`]): a page region's yes, a packed
    /// chunk's no (its bytes are other regions').
    sealable: bool,
    /// A protection-key tag was handed out for it ([`OpenSpan::tag`]): re-tagging would
    /// open sealed pages again, so none may be sealed.
    tagged: bool,
    /// The sealed ranges: whole pages, disjoint, inside the claim.
    seals: Vec<Seal>,
    /// The parts carved out of it under their own protection key (`Mpk::carve_part`):
    /// whole pages, disjoint, inside the claim.
    parts: Vec<Part>,
    /// `seals.len() + parts.len()`, shared with the claim's [`OpenSpan`], whose
    /// accessors read it without the lock. Also the claim's identity (a later claim of
    /// the same range has another).
    sealed: Arc<AtomicUsize>,
}

/// The claim at `off` in `claims` if it is still the one whose identity is `id` (a claim
/// retired meanwhile is gone; one made again at the same offset is another region's).
fn live_claim<'a>(
    claims: &'a mut BTreeMap<usize, Claim>,
    off: usize,
    id: &Arc<AtomicUsize>,
) -> Option<&'a mut Claim> {
    claims.get_mut(&off).filter(|c| Arc::ptr_eq(&c.sealed, id))
}

impl Claim {
    /// Publishes how many ranges of it are out of reach of its accessors.
    fn publish(&self) {
        self.sealed
            .store(self.seals.len() + self.parts.len(), Ordering::Release);
    }
}

/// A range of a claim carved out under its own protection key ([`RegionTag::add_part`]).
struct Part {
    off: usize,
    len: usize,
    /// Moves the pages to the part's key; run once, when the borrow the part was reached
    /// through ends (until then the pages keep the region's key). `None` once run.
    apply: Option<PartApply>,
}

/// What moves a carved part's pages to its own key (see [`Part::apply`]).
pub(crate) type PartApply = Box<dyn FnOnce() + Send>;

/// A range of a claim given to [`seal_pages`].
struct Seal {
    off: usize,
    len: usize,
    /// Made `PROT_NONE` (when the borrow it was reached through ended); until then
    /// pending, still readable and writable.
    applied: bool,
}

// SAFETY: `base` is only used to compute addresses inside the reservation; those go to
// thread-safe syscalls or into `OpenSpan`s / `StateCell`s whose exclusivity the `claims`
// registry (behind a Mutex) enforces. No thread-affine state is involved.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: every `&self` method either only reads immutable fields, goes
// through the `claims` Mutex, or issues a syscall, all of which are safe from any thread.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Reserves `len` bytes (a multiple of `page`) of address space: `PROT_NONE`,
    /// `MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`, so it costs no memory until opened.
    pub(crate) fn reserve(len: usize, page: usize) -> Result<Arc<Self>, SysError> {
        assert!(page.is_power_of_two() && len > 0 && len % page == 0);
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing (NULL
        // hint, no MAP_FIXED) cannot replace or alias any existing mapping. The result is
        // checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last("mmap"));
        }
        let Some(base) = NonNull::new(p.cast::<u8>()) else {
            // Only possible with vm.mmap_min_addr = 0; a null base would break NonNull
            // users, so give it back and report it as "no memory".
            // SAFETY: [p, p+len) is exactly the mapping mmap just returned, and nothing
            // refers to it yet.
            unsafe { libc::munmap(p, len) };
            return Err(SysError {
                call: "mmap",
                errno: libc::ENOMEM,
            });
        };
        register_arena(base.as_ptr() as usize, len);
        let map = Arc::new(Mapping {
            base,
            len,
            page,
            claims: Mutex::new(BTreeMap::new()),
        });
        let mut live = LIVE_MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner);
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&map));
        Ok(map)
    }

    /// Bytes reserved.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first address of the reservation.
    pub(crate) fn base_addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// A pointer `off` bytes into the reservation (keeps the mapping's provenance).
    fn at(&self, off: usize) -> *mut u8 {
        self.base.as_ptr().wrapping_add(off)
    }

    /// Claims `[off, off+len)` for a page region and makes it readable and writable.
    pub(crate) fn open(self: &Arc<Self>, off: usize, len: usize) -> Result<OpenSpan, OpenError> {
        self.open_with(off, len, true)
    }

    /// Like [`open`](Self::open), for a packed chunk: no pages of it can be sealed.
    pub(crate) fn open_chunk(
        self: &Arc<Self>,
        off: usize,
        len: usize,
    ) -> Result<OpenSpan, OpenError> {
        self.open_with(off, len, false)
    }

    fn open_with(
        self: &Arc<Self>,
        off: usize,
        len: usize,
        sealable: bool,
    ) -> Result<OpenSpan, OpenError> {
        let sealed = self.claim(off, len, sealable)?;
        if let Err(e) = self.protect(off, len, libc::PROT_READ | libc::PROT_WRITE) {
            self.unclaim(off);
            return Err(OpenError::Sys(e));
        }
        Ok(OpenSpan {
            map: Arc::clone(self),
            off,
            len,
            live: true,
            sealed,
        })
    }

    fn claim(&self, off: usize, len: usize, sealable: bool) -> Result<Arc<AtomicUsize>, OpenError> {
        let end = off.checked_add(len).ok_or(OpenError::OutOfBounds)?;
        if len == 0 || end > self.len || off % self.page != 0 || len % self.page != 0 {
            return Err(OpenError::OutOfBounds);
        }
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        // Claims are disjoint, so the one starting last before `end` is the only candidate
        // for an overlap: any other overlapping claim would overlap it too.
        if let Some((&o, c)) = claims.range(..end).next_back() {
            if o + c.len > off {
                return Err(OpenError::Overlap {
                    other_off: o,
                    other_len: c.len,
                });
            }
        }
        let sealed = Arc::new(AtomicUsize::new(0));
        claims.insert(
            off,
            Claim {
                len,
                sealable,
                tagged: false,
                seals: Vec::new(),
                parts: Vec::new(),
                sealed: Arc::clone(&sealed),
            },
        );
        Ok(sealed)
    }

    fn unclaim(&self, off: usize) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let was = claims.remove(&off);
        debug_assert!(was.is_some(), "unclaiming an unclaimed range at {off}");
    }

    /// `mprotect` a range of this reservation.
    fn protect(&self, off: usize, len: usize, prot: libc::c_int) -> Result<(), SysError> {
        debug_assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: [off, off+len) lies inside this reservation (callers pass a claimed
        // range), so only pages this Mapping owns change protection. When `prot` removes
        // access, the caller has given up every way to form a Rust reference into the
        // range (`OpenSpan::retire`), or the pages are sealed ones (`seal_pages`), applied
        // only once the borrow they were reached through ended (`RegionBytesMut`), and
        // while they stay sealed every accessor of their region refuses to hand out its
        // bytes (`OpenSpan::sealed`).
        let rc = unsafe { libc::mprotect(self.at(off).cast(), len, prot) };
        if rc == 0 {
            Ok(())
        } else {
            Err(SysError::last("mprotect"))
        }
    }

    /// Makes a claimed range `PROT_NONE` again — and gives it back protection key 0, so a
    /// range that an MPK domain had tagged is plain memory when it is next handed out —
    /// and drops the claim, both under the claims lock, so that no [`RegionTag`] can
    /// reopen the range in between. The claim is dropped even if the call fails.
    fn seal_and_unclaim(&self, off: usize, len: usize) -> Result<(), SysError> {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let sealed = if pku_supported() {
            pkey_mprotect_raw(self.at(off), len, libc::PROT_NONE, 0)
        } else {
            self.protect(off, len, libc::PROT_NONE)
        };
        let was = claims.remove(&off);
        debug_assert!(was.is_some(), "unclaiming an unclaimed range at {off}");
        sealed
    }

    /// `madvise(MADV_DONTNEED)` a range of this reservation.
    fn discard(&self, off: usize, len: usize) -> Result<(), SysError> {
        debug_assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: the range lies inside this private anonymous reservation and is owned
        // by the calling span, which holds no reference into it across this call. For such
        // a mapping MADV_DONTNEED only replaces the contents with zero-fill-on-demand
        // pages; it cannot affect memory outside the range.
        let rc = unsafe { libc::madvise(self.at(off).cast(), len, libc::MADV_DONTNEED) };
        if rc == 0 {
            Ok(())
        } else {
            Err(SysError::last("madvise"))
        }
    }

    /// `madvise(MADV_HUGEPAGE)` a range of this reservation: asks the kernel to back it
    /// with transparent huge pages. A hint: `false` (THP off or unsupported) leaves it on
    /// ordinary pages, which work the same.
    pub(crate) fn hint_huge(&self, off: usize, len: usize) -> bool {
        debug_assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: the range lies inside this private anonymous reservation. MADV_HUGEPAGE
        // only changes how the kernel may back the range later; it neither moves, frees nor
        // changes the contents of any page, so no reference into it is affected.
        let rc = unsafe { libc::madvise(self.at(off).cast(), len, libc::MADV_HUGEPAGE) };
        rc == 0
    }

    /// Test only: writes one byte `off` bytes into the reservation, whatever its
    /// protection — used to prove that guard pages fault.
    #[cfg(test)]
    pub(crate) fn poke(&self, off: usize) {
        assert!(off < self.len, "poke outside the reservation");
        // SAFETY: the address is inside our own reservation, so it is never memory that
        // belongs to anything but this Mapping. Tests call this only on ranges no span
        // owns (guard pages, released regions), in a child process that is expected to
        // die of SIGSEGV right here; were the page accessible, the write would land in
        // bytes nobody references.
        unsafe { ptr::write_volatile(self.at(off), 0xA5) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        unregister_arena(self.base.as_ptr() as usize);
        // SAFETY: [base, base+len) is exactly the mapping `reserve` created. Every span
        // holds an `Arc<Mapping>`, so when this runs no span, region or state cell — and
        // so no reference into the range — is left.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Every reservation made, to find the one a range lies in ([`seal_pages`]).
static LIVE_MAPPINGS: Mutex<Vec<std::sync::Weak<Mapping>>> = Mutex::new(Vec::new());

/// Why [`seal_pages`] could not seal a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The range is empty, not whole pages, or not inside one live page region of an
    /// arena (a packed region's bytes are never whole pages of their own).
    #[error("{len} bytes at {addr:#x} are not whole pages of one live tenant region")]
    NotInRegion {
        /// First address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// The region carries a protection key (MPK), and re-tagging it would open the pages
    /// again: under MPK, give the pages their own key instead (`Mpk::carve_part`).
    #[error("{len} bytes at {addr:#x} lie in a region under a protection key, which would open them again; give them a key of their own instead")]
    Tagged {
        /// First address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// Some of the pages are sealed already.
    #[error("{len} bytes at {addr:#x} overlap pages that are sealed already")]
    Overlap {
        /// First address.
        addr: usize,
        /// Length.
        len: usize,
    },
}

/// A region's bytes can not be handed out: pages inside them are sealed
/// ([`seal_pages`]) or carved out under a protection key of their own
/// (`Mpk::carve_part`), and a reference over such a page would fault when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{ranges} range(s) of pages inside this region are sealed or under a protection key of their own: its bytes are handed out again once their `SealedPages` or `PartKey`s are dropped")]
pub struct RegionSealed {
    /// Sealed (or pending) ranges and carved parts inside the region.
    pub ranges: usize,
}

/// Whole pages of a live page region that [`seal_pages`] seals (`PROT_NONE`): an access
/// to them faults, and fault handlers see an address in a tenant arena (a guard page).
/// While it lives, no accessor of the region hands out its bytes ([`RegionSealed`]).
/// Dropping it makes the pages readable and writable again, if the region is still live;
/// a region released first is scrubbed whole, sealed pages included.
pub struct SealedPages {
    map: Arc<Mapping>,
    /// The claim the pages lie in, and its identity.
    claim_off: usize,
    claim: Arc<AtomicUsize>,
    off: usize,
    len: usize,
}

impl std::fmt::Debug for SealedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedPages")
            .field(
                "addr",
                &format_args!("{:#x}", self.map.base_addr() + self.off),
            )
            .field("len", &self.len)
            .finish()
    }
}

/// Seals `pages` — whole pages inside one live page region of a tenant arena — until the
/// returned [`SealedPages`] drops. For guard pages inside a region, between parts of it
/// that different code owns.
///
/// The pages are sealed when the borrow they were reached through ends: when the
/// [`RegionBytesMut`] that `pages` borrows from ([`Region::bytes_mut`],
/// [`StateGuard::split`](crate::StateGuard::split)) is dropped or
/// [sealed](RegionBytesMut::seal) — so no reference over them is alive once they are
/// `PROT_NONE`. Until then they stay readable and writable. From then on, while the
/// `SealedPages` lives, the region's accessors refuse to hand out its bytes
/// ([`RegionSealed`]), so safe code can never form a reference over a sealed page.
pub fn seal_pages(pages: &mut [u8]) -> Result<SealedPages, SealError> {
    let (addr, len) = (pages.as_ptr() as usize, pages.len());
    let not_in = SealError::NotInRegion { addr, len };
    let map = LIVE_MAPPINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .find(|m| addr.wrapping_sub(m.base_addr()) < m.len)
        .ok_or(not_in)?;
    let off = addr - map.base_addr();
    if len == 0 || off % map.page != 0 || len % map.page != 0 {
        return Err(not_in);
    }
    let mut claims = map.claims.lock().unwrap_or_else(PoisonError::into_inner);
    let (claim_off, claim) = claims
        .range_mut(..=off)
        .next_back()
        .filter(|(&o, c)| off + len <= o + c.len && c.sealable)
        .ok_or(not_in)?;
    if claim.tagged {
        return Err(SealError::Tagged { addr, len });
    }
    if claim
        .seals
        .iter()
        .any(|s| s.off < off + len && off < s.off + s.len)
    {
        return Err(SealError::Overlap { addr, len });
    }
    claim.seals.push(Seal {
        off,
        len,
        applied: false,
    });
    claim.publish();
    let (claim_off, claim) = (*claim_off, Arc::clone(&claim.sealed));
    drop(claims);
    Ok(SealedPages {
        map,
        claim_off,
        claim,
        off,
        len,
    })
}

impl Drop for SealedPages {
    fn drop(&mut self) {
        // A claim gone was retired with its region (scrubbed whole, sealed anyway); one
        // claimed again is another region's, which opened it whole.
        let mut claims = self
            .map
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(claim) = live_claim(&mut claims, self.claim_off, &self.claim) else {
            return;
        };
        let Some(i) = claim
            .seals
            .iter()
            .position(|s| (s.off, s.len) == (self.off, self.len))
        else {
            return;
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        if claim.seals[i].applied && self.map.protect(self.off, self.len, rw).is_err() {
            // Still PROT_NONE: stays recorded, so the region's bytes stay out of reach
            // (its release opens and scrubs it whole).
            return;
        }
        claim.seals.swap_remove(i);
        claim.publish();
    }
}

impl Mapping {
    /// Seals the pending seals of claim `claim_off` that lie in `[off, off+len)` (the
    /// bytes of a borrow that just ended). The first `mprotect` failure is returned; the
    /// seals not applied stay pending (their pages readable and writable, the region's
    /// bytes out of reach).
    ///
    /// The parts carved inside that range during the borrow move to their own key first
    /// (outside the claims lock: moving them re-tags through a [`RegionTag`]).
    fn apply_seals(&self, claim_off: usize, off: usize, len: usize) -> Result<(), SysError> {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(claim) = claims.get_mut(&claim_off) else {
            return Ok(());
        };
        let parts: Vec<PartApply> = claim
            .parts
            .iter_mut()
            .filter(|p| p.off >= off && p.off + p.len <= off + len)
            .filter_map(|p| p.apply.take())
            .collect();
        let mut r = Ok(());
        for s in &mut claim.seals {
            if !s.applied && s.off >= off && s.off + s.len <= off + len {
                if let Err(e) = self.protect(s.off, s.len, libc::PROT_NONE) {
                    r = Err(e);
                    break;
                }
                s.applied = true;
            }
        }
        drop(claims);
        parts.into_iter().for_each(|apply| apply());
        r
    }

    /// Forgets every seal and carved part of claim `claim_off`, whose pages were all made
    /// readable and writable again, under key 0 (before it is scrubbed by hand).
    fn clear_seals(&self, claim_off: usize) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claim) = claims.get_mut(&claim_off) {
            claim.seals.clear();
            claim.parts.clear();
            claim.publish();
        }
    }
}

/// A page region's bytes (or a part of them), mutably, for as long as the region (or the
/// state guard) they come from is borrowed: derefs to `[u8]`. When it drops — or
/// [`seal`](Self::seal) consumes it — the pages [`seal_pages`] was given inside it during
/// the borrow are made `PROT_NONE`.
pub struct RegionBytesMut<'a> {
    ptr: NonNull<u8>,
    len: usize,
    /// The page region's span, whose seals inside these bytes apply when the borrow ends
    /// (`None`: a packed region, or already applied).
    span: Option<&'a OpenSpan>,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: it is a `&'a mut [u8]` (exclusive, Send and Sync like one) plus a shared
// `&'a OpenSpan`, whose only use here is through the mapping's claims Mutex and syscalls.
unsafe impl Send for RegionBytesMut<'_> {}
// SAFETY: as for `Send`: `&RegionBytesMut` gives only `&[u8]`.
unsafe impl Sync for RegionBytesMut<'_> {}

impl<'a> RegionBytesMut<'a> {
    /// Bytes `[ptr, ptr+len)`; `span` is the page region they lie in (`None` for a packed
    /// region, which has no seals).
    ///
    /// # Safety
    ///
    /// The bytes are readable, writable and initialised, none of them sealed, and nothing
    /// else reads or writes them for `'a` (the caller holds them exclusively for `'a`).
    unsafe fn new(ptr: *mut u8, len: usize, span: Option<&'a OpenSpan>) -> Self {
        RegionBytesMut {
            ptr: NonNull::new(ptr).expect("region bytes are never at address 0"),
            len,
            span,
            _borrow: PhantomData,
        }
    }

    /// Ends the borrow now and seals the pages [`seal_pages`] was given inside these
    /// bytes, reporting an `mprotect` failure (dropping does the same, silently).
    pub fn seal(mut self) -> Result<(), SysError> {
        self.apply()
    }

    fn apply(&mut self) -> Result<(), SysError> {
        let Some(span) = self.span.take() else {
            return Ok(());
        };
        if span.sealed.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let off = self.ptr.as_ptr() as usize - span.map.base_addr();
        span.map.apply_seals(span.off, off, self.len)
    }
}

impl Deref for RegionBytesMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `new`'s callers hand over bytes exclusively borrowed for `'a`, readable,
        // writable and initialised; none of them is sealed while this lives (seals
        // given during the borrow apply only in `apply`, from `drop` or `seal`, which
        // take the value whole, so no reference derived from it is alive then).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for RegionBytesMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RegionBytesMut<'_> {
    fn drop(&mut self) {
        let _ = self.apply();
    }
}

impl std::fmt::Debug for RegionBytesMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionBytesMut")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// Most arenas [`in_tenant_arena`] knows about at once (more still work; they are just not
/// recognised by fault handlers).
const MAX_ARENAS: usize = 64;

/// Live arenas as (base, len); len 0 = free entry. Read from signal handlers.
static ARENAS: [(AtomicUsize, AtomicUsize); MAX_ARENAS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_ARENAS];

fn register_arena(base: usize, len: usize) {
    for (b, l) in &ARENAS {
        if b.compare_exchange(0, base, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            l.store(len, Ordering::Release);
            return;
        }
    }
}

fn unregister_arena(base: usize) {
    for (b, l) in &ARENAS {
        if b.load(Ordering::Acquire) == base {
            l.store(0, Ordering::Release);
            b.store(0, Ordering::Release);
            return;
        }
    }
}

/// Whether `addr` lies in the address space of a live tenant arena (a region, a guard page,
/// or free arena space). Only atomic loads: safe to call from a signal handler, which is
/// what it is for — telling a tenant's stray access apart from a bug elsewhere.
pub fn in_tenant_arena(addr: usize) -> bool {
    ARENAS.iter().any(|(b, l)| {
        let len = l.load(Ordering::Acquire);
        let base = b.load(Ordering::Acquire);
        len != 0 && addr.wrapping_sub(base) < len
    })
}

/// Exclusive ownership of one claimed range of a [`Mapping`] that is readable and
/// writable, until [`OpenSpan::retire`] (or drop) scrubs it, seals it and drops the claim.
pub(crate) struct OpenSpan {
    map: Arc<Mapping>,
    off: usize,
    len: usize,
    /// False once retired: the range is no longer ours and may be `PROT_NONE`.
    live: bool,
    /// How many ranges of pages inside it are sealed (or pending) or carved out under
    /// their own protection key: its bytes are handed out only while none is. Shared with
    /// its claim.
    sealed: Arc<AtomicUsize>,
}

impl OpenSpan {
    /// Offset of the range in the reservation.
    pub(crate) fn off(&self) -> usize {
        self.off
    }

    /// Length of the range in bytes (a multiple of the page size, never 0).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// First byte of the range.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        NonNull::new(self.map.at(self.off)).expect("mapping base is non-null")
    }

    /// Refused while pages inside the range are sealed (or pending).
    pub(crate) fn check_unsealed(&self) -> Result<(), RegionSealed> {
        match self.sealed.load(Ordering::Acquire) {
            0 => Ok(()),
            ranges => Err(RegionSealed { ranges }),
        }
    }

    /// The range's bytes; refused while pages of it are sealed.
    pub(crate) fn bytes(&self) -> Result<&[u8], RegionSealed> {
        assert!(self.live, "span used after retire");
        self.check_unsealed()?;
        // SAFETY: the claim registry makes this span the only owner of the range; it is
        // readable (opened RW, `live`, no page of it sealed: checked above, and sealing
        // needs a `&mut` borrow of it, which `&self` rules out while this lives), inside a
        // mapping kept alive by `self.map`, and initialized (zero pages from the kernel
        // or bytes written through this span). `&self` rules out a concurrent `&mut`.
        Ok(unsafe { std::slice::from_raw_parts(self.map.at(self.off), self.len) })
    }

    /// The range's bytes, mutably; refused while pages of it are sealed. Pages sealed
    /// during the borrow are sealed when it ends.
    pub(crate) fn bytes_mut(&mut self) -> Result<RegionBytesMut<'_>, RegionSealed> {
        assert!(self.live, "span used after retire");
        self.check_unsealed()?;
        let ptr = self.map.at(self.off);
        // SAFETY: as in `bytes`, and `&mut self`, borrowed for the result's lifetime,
        // makes it the only reference to the range.
        Ok(unsafe { RegionBytesMut::new(ptr, self.len, Some(self)) })
    }

    /// Scrubs the range to zero, makes it `PROT_NONE` and drops the claim. Idempotent.
    ///
    /// `Err` means the range must not be handed out again (quarantine it): either it is
    /// zeroed and unclaimed but `mprotect(PROT_NONE)` failed, so it is still accessible,
    /// or opening its sealed pages to zero it by hand failed, so it is still live and
    /// claimed with its old bytes (a later `retire`, at the latest on drop, tries again).
    pub(crate) fn retire(&mut self, scrub: Scrub) -> Result<(), SysError> {
        if !self.live {
            return Ok(());
        }
        let zero_by_hand = match scrub {
            Scrub::Discard => self.map.discard(self.off, self.len).is_err(),
            Scrub::Zero => true,
        };
        if zero_by_hand {
            // Pages sealed inside the span (`seal_pages`) are opened again first.
            self.map
                .protect(self.off, self.len, libc::PROT_READ | libc::PROT_WRITE)?;
            self.map.clear_seals(self.off);
            self.bytes_mut()
                .expect("no seal is left after clear_seals")
                .fill(0);
        }
        self.live = false;
        self.map.seal_and_unclaim(self.off, self.len)
    }

    /// The capability to move this span to another protection key while it is live. From
    /// now on no page of it can be sealed (a re-tag would open it again).
    pub(crate) fn tag(&self) -> RegionTag {
        if let Some(c) = self
            .map
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&self.off)
        {
            c.tagged = true;
        }
        RegionTag {
            map: Arc::clone(&self.map),
            claim_off: self.off,
            claim_len: self.len,
            claim: Arc::clone(&self.sealed),
            off: self.off,
            len: self.len,
        }
    }
}

impl Drop for OpenSpan {
    fn drop(&mut self) {
        // Normally retired by its Region already (then a no-op). If not, still never
        // leave a readable range with old bytes behind.
        let _ = self.retire(Scrub::Discard);
    }
}

/// Exclusive ownership of `[off, off+len)` of a [`Mapping`]: a cache-line-aligned part
/// of an open packed chunk (an [`OpenSpan`] the storage keeps open while any block of it
/// lives). Unlike a span, a block has no claim of its own and no guard pages: the
/// storage's packed free list hands each part of a chunk to one block at a time.
pub(crate) struct PackedBlock {
    map: Arc<Mapping>,
    off: usize,
    len: usize,
}

impl PackedBlock {
    /// The block `[off, off+len)` of `chunk`. Panics unless the range lies inside the
    /// chunk; the caller (the storage's packed free list) guarantees that no other live
    /// block overlaps it.
    pub(crate) fn new(chunk: &OpenSpan, off: usize, len: usize) -> PackedBlock {
        assert!(
            chunk.live
                && len > 0
                && off >= chunk.off
                && off
                    .checked_add(len)
                    .is_some_and(|e| e <= chunk.off + chunk.len),
            "packed block [{off}, +{len}) outside its chunk [{}, +{})",
            chunk.off,
            chunk.len
        );
        PackedBlock {
            map: Arc::clone(&chunk.map),
            off,
            len,
        }
    }

    /// Offset of the block in the reservation.
    pub(crate) fn off(&self) -> usize {
        self.off
    }

    /// Length of the block in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// First byte of the block.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        NonNull::new(self.map.at(self.off)).expect("mapping base is non-null")
    }

    /// The block's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the block lies inside an open (readable, writable) chunk, checked in
        // `new`, which the storage keeps open while this block lives; the packed free list
        // gives the range to this block alone, so no other reference to it exists outside
        // this block's borrows. The bytes are initialised (zero pages from the kernel,
        // zeros written at the previous release, or bytes written through this block), and
        // `self.map` keeps the mapping alive.
        unsafe { std::slice::from_raw_parts(self.map.at(self.off), self.len) }
    }

    /// The block's bytes, mutably. A packed block has no seals.
    pub(crate) fn bytes_mut(&mut self) -> RegionBytesMut<'_> {
        // SAFETY: as in `bytes`; `&mut self`, borrowed for the result's lifetime, makes it
        // the only reference to the range. No page of a chunk is ever sealed
        // (`Mapping::open_chunk`).
        unsafe { RegionBytesMut::new(self.map.at(self.off), self.len, None) }
    }
}

/// Why a value could not be placed in a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlaceError {
    TooLarge { size: usize, region: usize },
    Misaligned { align: usize },
}

/// A value of type `S` living at the start of a [`Region`], behind a spin lock, with the
/// tenant's untyped bytes either after it in the same region or in a `tail` region of
/// their own.
///
/// The regions are private to the cell: nothing can read or write their bytes except
/// through a [`CellGuard`], and the cell drops `S` in place before the regions are
/// released.
///
/// `repr(C)`: the pointer and the lock, which every locked access reads and writes, come
/// first (see `TenantEntry`'s layout).
#[repr(C)]
pub(crate) struct StateCell<S> {
    ptr: NonNull<S>,
    locked: AtomicBool,
    region: Region,
    /// The untyped bytes, when they do not follow the state in `region`.
    tail: Option<Region>,
    _owns: PhantomData<S>,
}

// SAFETY: the cell owns its `S` (like a Box), so sending the cell sends the `S`: requires
// `S: Send`. The regions are `Send` on their own.
unsafe impl<S: Send> Send for StateCell<S> {}
// SAFETY: `&StateCell` hands out access to `S` only through the lock, one holder at a
// time (Acquire/Release on `locked`), exactly like `Mutex<S>`: requires `S: Send` only.
unsafe impl<S: Send> Sync for StateCell<S> {}

/// Bytes at the start of a [`StateCell`] that a locked access reads and writes: the state
/// pointer and the lock.
pub(crate) const CELL_HOT_BYTES: usize = mem::offset_of!(StateCell<u64>, locked) + 1;

impl<S> StateCell<S> {
    /// Moves `state` to the start of `region`. The untyped bytes ([`CellGuard::split`])
    /// are `tail`'s, or without one `region`'s past the state. Fails (dropping all) if `S`
    /// is larger than the region or needs more alignment than its base has.
    pub(crate) fn place(
        region: Region,
        tail: Option<Region>,
        state: S,
    ) -> Result<Self, PlaceError> {
        if mem::size_of::<S>() > region.len() {
            return Err(PlaceError::TooLarge {
                size: mem::size_of::<S>(),
                region: region.len(),
            });
        }
        let ptr = region.base().cast::<S>();
        if !ptr.as_ptr().is_aligned() {
            return Err(PlaceError::Misaligned {
                align: mem::align_of::<S>(),
            });
        }
        // SAFETY: `region` is readable, writable and exclusively owned (an open, claimed
        // span, or a packed block its free list gave to it alone), of at least
        // size_of::<S>() bytes, and `ptr` is its base, aligned for `S` (both checked
        // above). The region moves into the cell below and is reachable from nowhere
        // else, so this value is only ever accessed through the cell.
        unsafe { ptr.as_ptr().write(state) };
        Ok(StateCell {
            ptr,
            locked: AtomicBool::new(false),
            region,
            tail,
            _owns: PhantomData,
        })
    }

    /// Bytes of the regions holding the state and its untyped bytes.
    pub(crate) fn region_len(&self) -> usize {
        self.region.len() + self.tail.as_ref().map_or(0, Region::len)
    }

    /// The capability to retag the region with another protection key; `None` for a
    /// packed region or one with a separate tail (never in an MPK domain).
    pub(crate) fn tag(&self) -> Option<RegionTag> {
        match self.tail {
            Some(_) => None,
            None => self.region.span().map(OpenSpan::tag),
        }
    }

    /// Takes the lock if it is free.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<CellGuard<'_, S>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| CellGuard {
                cell: self,
                _excl: PhantomData,
            })
    }

    /// Whether a thread holds the lock.
    #[inline]
    pub(crate) fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Acquire)
    }

    /// Takes the lock, spinning (then yielding) while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> CellGuard<'_, S> {
        if let Some(g) = self.try_lock() {
            return g;
        }
        self.lock_contended()
    }

    #[cold]
    fn lock_contended(&self) -> CellGuard<'_, S> {
        let mut spins = 0u32;
        loop {
            // Test-and-test-and-set: wait on a plain load, not on failing CASes.
            while self.locked.load(Ordering::Relaxed) {
                if spins < 128 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(g) = self.try_lock() {
                return g;
            }
        }
    }
}

impl<S> Drop for StateCell<S> {
    fn drop(&mut self) {
        // SAFETY: `place` wrote an initialized `S` at `ptr`, and only guards touch it
        // afterwards; `&mut self` proves no guard is alive. Drop runs once, and the region
        // (a field, dropped right after) is released without reading the bytes as `S`.
        unsafe { ptr::drop_in_place(self.ptr.as_ptr()) };
    }
}

/// Proof that the current thread holds a [`StateCell`]'s lock; derefs to the state.
pub(crate) struct CellGuard<'a, S> {
    cell: &'a StateCell<S>,
    /// Behaves like `&mut S` for auto traits: `Sync` only if `S: Sync`.
    _excl: PhantomData<&'a mut S>,
}

/// Where the bytes of a region past its state begin ([`StateGuard::split`]):
/// `size_of::<S>()` rounded up to a cache line (64 bytes). A state type that wants `n`
/// bytes of untyped memory after it registers `region_tail_offset::<S>() + n` bytes.
///
/// [`StateGuard::split`]: crate::StateGuard::split
pub const fn tail_offset<S>() -> usize {
    mem::size_of::<S>().next_multiple_of(TAIL_ALIGN)
}

/// Alignment of the region bytes past the state ([`CellGuard::split`]).
pub(crate) const TAIL_ALIGN: usize = 64;

impl<S> CellGuard<'_, S> {
    /// The state and its untyped bytes — the tail region's, or the region's past the
    /// state (`tail_offset::<S>()..region_len`, empty when the state fills the region) —
    /// both exclusive for as long as the borrow lasts. Refused while pages of those bytes
    /// are sealed ([`seal_pages`]); pages sealed during the borrow are sealed when it ends.
    pub(crate) fn split(&mut self) -> Result<(&mut S, RegionBytesMut<'_>), RegionSealed> {
        let (tail, tail_len, span) = match &self.cell.tail {
            Some(t) => (t.base().as_ptr(), t.len(), t.span()),
            None => {
                let region_len = self.cell.region.len();
                let off = tail_offset::<S>().min(region_len);
                // `base` is the region's first byte (the state is placed at the region
                // base, with the mapping's provenance); `off` stays inside the region.
                let base = self.cell.ptr.as_ptr().cast::<u8>();
                (
                    base.wrapping_add(off),
                    region_len - off,
                    self.cell.region.span(),
                )
            }
        };
        if let Some(span) = span {
            span.check_unsealed()?;
        }
        // SAFETY: the lock is held by this guard and `&mut self` makes these the only
        // references derived from it. The state occupies [0, size_of::<S>()) of its region.
        // The untyped bytes are either the whole tail region — a different region, owned
        // by the cell and reached only through its guards — or the state's region from
        // `off` (>= size_of::<S>(), or the region's end) to its end; either way they never
        // overlap the state, are readable, writable (no page of their span sealed,
        // checked above; a packed region has none) and initialised (zero pages from the
        // kernel or bytes written through earlier guards), and live as long as the cell the
        // guard borrows.
        unsafe {
            Ok((
                &mut *self.cell.ptr.as_ptr(),
                RegionBytesMut::new(tail, tail_len, span),
            ))
        }
    }
}

impl<S> Deref for CellGuard<'_, S> {
    type Target = S;
    #[inline]
    fn deref(&self) -> &S {
        // SAFETY: the lock is held by this guard, so no other reference to the state
        // exists; the state is initialized and lives as long as the cell, which the guard
        // borrows.
        unsafe { self.cell.ptr.as_ref() }
    }
}

impl<S> DerefMut for CellGuard<'_, S> {
    #[inline]
    fn deref_mut(&mut self) -> &mut S {
        // SAFETY: as in `deref`; `&mut self` makes the returned reference unique.
        unsafe { &mut *self.cell.ptr.as_ptr() }
    }
}

impl<S> Drop for CellGuard<'_, S> {
    #[inline]
    fn drop(&mut self) {
        self.cell.locked.store(false, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------
// Intel MPK (memory protection keys)
// ---------------------------------------------------------------------------------------

/// Whether this CPU has protection keys *and* the kernel enabled them (CPUID leaf 7,
/// ECX bit 4, `OSPKE`: CR4.PKE is set, so `RDPKRU`/`WRPKRU` do not fault). Cached.
pub fn pku_supported() -> bool {
    use std::sync::atomic::AtomicU8;
    static CACHED: AtomicU8 = AtomicU8::new(0);
    match CACHED.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = detect_ospke();
            CACHED.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_ospke() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // `__cpuid*` became safe functions in later Rust versions; `unused_unsafe` keeps both
    // compiling without warnings.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86_64 CPU and only reads identification registers;
    // leaf 0 is always valid.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf < 7 {
        return false;
    }
    #[allow(unused_unsafe)]
    // SAFETY: leaf 7 sub-leaf 0 is valid because the maximum basic leaf is at least 7.
    let ecx = unsafe { __cpuid_count(7, 0) }.ecx;
    ecx & (1 << 4) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_ospke() -> bool {
    false
}

/// `pkey_alloc(0, access_rights)`: a new protection key. The calling thread gets
/// `access_rights` for it (`PKEY_DISABLE_ACCESS` here: closed); every other thread keeps the
/// rights its PKRU already has for that key (closed by default on Linux).
pub(crate) fn pkey_alloc(access_rights: u32) -> Result<i32, SysError> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        // SAFETY: pkey_alloc takes two integers and touches no memory of ours; it only
        // reserves a key number in the process and sets this thread's rights for it.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pkey_alloc,
                0 as libc::c_ulong,
                libc::c_ulong::from(access_rights),
            )
        };
        if rc < 0 {
            Err(SysError::last("pkey_alloc"))
        } else {
            Ok(rc as i32)
        }
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = access_rights;
        Err(SysError {
            call: "pkey_alloc",
            errno: libc::ENOSYS,
        })
    }
}

/// `pkey_free(key)`: gives a key back (only ever called for keys no page carries yet).
pub(crate) fn pkey_free(key: i32) {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    // SAFETY: pkey_free takes an integer and touches no memory; callers free only keys they
    // allocated and never used to tag a page, so no mapping is left with a stale key.
    unsafe {
        libc::syscall(libc::SYS_pkey_free, libc::c_long::from(key));
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    let _ = key;
}

/// `pkey_mprotect` of an address range: not exposed; [`RegionTag::set_pkey_except`] and
/// [`Mapping::seal_and_unclaim`] call it on ranges they own.
fn pkey_mprotect_raw(
    addr: *mut u8,
    len: usize,
    prot: libc::c_int,
    key: i32,
) -> Result<(), SysError> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        // SAFETY: the callers pass a range of a `Mapping` they hold a claim on (under the
        // claims lock): only pages that belong to one live region (or one being sealed)
        // change their protection and key, and `prot` is either PROT_NONE (sealing, after
        // every reference into the range is gone) or the PROT_READ | PROT_WRITE the region
        // already has. No memory outside our own reservation is affected.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pkey_mprotect,
                addr as libc::c_ulong,
                len as libc::size_t,
                libc::c_ulong::from(prot as u32),
                libc::c_long::from(key),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(SysError::last("pkey_mprotect"))
        }
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = (addr, len, prot, key);
        Err(SysError {
            call: "pkey_mprotect",
            errno: libc::ENOSYS,
        })
    }
}

/// The capability to change the protection key of one live region, or of whole pages
/// inside it (a part, [`RegionTag::part`]): held by the MPK virtual key of that region or
/// part, used by whichever thread loads or evicts that key.
pub(crate) struct RegionTag {
    map: Arc<Mapping>,
    /// The region's claim, which must still be live for any re-tag.
    claim_off: usize,
    claim_len: usize,
    /// The claim's identity ([`Claim::sealed`]).
    claim: Arc<AtomicUsize>,
    /// The pages this tag re-tags: the whole claim, or a part of it.
    off: usize,
    len: usize,
}

impl RegionTag {
    /// First address of the pages this tag covers.
    pub(crate) fn addr(&self) -> usize {
        self.map.at(self.off) as usize
    }

    /// Bytes this tag covers (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A tag for `[addr, addr + len)`, whole pages inside this tag's range, or `None`
    /// when the range is empty, not page-aligned or not inside.
    pub(crate) fn part(&self, addr: usize, len: usize) -> Option<RegionTag> {
        let page = self.map.page;
        let start = self.addr();
        let inside = addr >= start
            && len > 0
            && addr % page == 0
            && len % page == 0
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= start + self.len);
        inside.then(|| RegionTag {
            map: Arc::clone(&self.map),
            claim_off: self.claim_off,
            claim_len: self.claim_len,
            claim: Arc::clone(&self.claim),
            off: self.off + (addr - start),
            len,
        })
    }

    /// Records this tag's pages as a part of its region carved out under its own key:
    /// from now on, until [`remove_part`](Self::remove_part) or the region's release, the
    /// region's accessors refuse to hand out its bytes ([`RegionSealed`]), since the part's
    /// pages are closed to whoever holds only the region's key. `apply` moves the pages
    /// to the part's key; it runs when the borrow of the region's bytes (a
    /// [`RegionBytesMut`]) covering the part ends, so no reference over them is alive
    /// then. Refused (`EINVAL`) if the claim is no longer live.
    pub(crate) fn add_part(&self, apply: PartApply) -> Result<(), SysError> {
        let mut claims = self
            .map
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let claim = live_claim(&mut claims, self.claim_off, &self.claim).ok_or(SysError {
            call: "pkey_mprotect",
            errno: libc::EINVAL,
        })?;
        claim.parts.push(Part {
            off: self.off,
            len: self.len,
            apply: Some(apply),
        });
        claim.publish();
        Ok(())
    }

    /// Forgets the part [`add_part`](Self::add_part) recorded for this tag's pages (its
    /// `apply` too, if it has not run), if its claim is still the same live one.
    pub(crate) fn remove_part(&self) {
        let mut claims = self
            .map
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(claim) = live_claim(&mut claims, self.claim_off, &self.claim) else {
            return;
        };
        let removed = claim
            .parts
            .iter()
            .position(|p| (p.off, p.len) == (self.off, self.len))
            .map(|i| claim.parts.swap_remove(i));
        claim.publish();
        drop(claims);
        // Dropped outside the lock: the `apply` it may still hold owns key-cache handles.
        drop(removed);
    }

    /// Tags the pages with protection key `key` (they stay readable and writable; the
    /// thread's PKRU decides who may touch them), except `holes` (sorted, disjoint
    /// `(addr, len)` page ranges inside the range, which keep the key they carry): one
    /// `pkey_mprotect` per run of pages between holes.
    ///
    /// Refuses (`EINVAL`) if the region is no longer a live claim, so a stale tag can never
    /// reopen a released range or a guard page. The claims lock is held across the calls:
    /// the region cannot be sealed in between.
    pub(crate) fn set_pkey_except(
        &self,
        key: i32,
        holes: &[(usize, usize)],
    ) -> Result<(), SysError> {
        let claims = self
            .map
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A claim with sealed pages is refused too: the re-tag would open them (sealing
        // refuses a tagged claim, so this only guards against a tag taken after a seal).
        let live = claims
            .get(&self.claim_off)
            .is_some_and(|c| c.len == self.claim_len && c.seals.is_empty());
        if !live {
            return Err(SysError {
                call: "pkey_mprotect",
                errno: libc::EINVAL,
            });
        }
        let r = runs_between(self.addr(), self.len, holes).try_for_each(|(addr, len)| {
            pkey_mprotect_raw(
                self.map.at(self.off + (addr - self.addr())),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                key,
            )
        });
        drop(claims);
        r
    }
}

/// The runs of `[start, start + len)` outside `holes` (sorted, disjoint ranges inside
/// it), in order; empty runs are skipped.
pub(crate) fn runs_between(
    start: usize,
    len: usize,
    holes: &[(usize, usize)],
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let end = start + len;
    let mut at = start;
    let mut holes = holes.iter();
    let mut done = false;
    std::iter::from_fn(move || loop {
        if done {
            return None;
        }
        match holes.next() {
            Some(&(h, hl)) => {
                let run = (at, h.saturating_sub(at));
                at = h + hl;
                if run.1 > 0 {
                    return Some(run);
                }
            }
            None => {
                done = true;
                return (at < end).then_some((at, end - at));
            }
        }
    })
}

/// Reads this thread's PKRU register.
///
/// Only call when [`pku_supported`] is true (`RDPKRU` raises #UD otherwise): the key cache,
/// which alone calls this, exists only then.
#[inline]
pub(crate) fn rdpkru() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert!(pku_supported());
        let eax: u32;
        // SAFETY: RDPKRU needs ECX = 0 and CR4.PKE = 1 (callers only run once
        // `pku_supported()` said so); it writes EAX and EDX and nothing else. Not `nomem`:
        // we want no memory access reordered around the PKRU accesses of a domain switch.
        unsafe {
            std::arch::asm!(
                "rdpkru",
                in("ecx") 0u32,
                out("eax") eax,
                out("edx") _,
                options(nostack, preserves_flags),
            );
        }
        eax
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// This thread's PKRU register, or `None` on a CPU or kernel without protection keys.
pub fn current_pkru() -> Option<u32> {
    pku_supported().then(rdpkru)
}

/// Writes this thread's PKRU register. Panics if `value` would close protection key 0.
///
/// Key 0 carries everything that is not a tenant region — code, stack, heap, packet
/// buffers — so with it open, writing PKRU can only change access to tenant regions, which
/// the crate reaches exclusively through guards that open their own key first.
#[inline]
pub(crate) fn wrpkru(value: u32) {
    assert!(
        value & 0b11 == 0,
        "PKRU {value:#x} would close protection key 0"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: WRPKRU needs ECX = EDX = 0 and CR4.PKE = 1 (only reachable through the key
    // cache, which exists only when `pku_supported()`). It changes this thread's access
    // rights to user pages by key; key 0 stays open (asserted above), so no stack, heap or
    // code the program relies on becomes inaccessible. Deliberately not `nomem`: the
    // compiler must not move loads or stores of tenant memory across the switch.
    unsafe {
        std::arch::asm!(
            "wrpkru",
            in("eax") value,
            in("ecx") 0u32,
            in("edx") 0u32,
            options(nostack, preserves_flags),
        );
    }
}

/// Test only: reads one byte at `addr` whatever its protection — used by child processes
/// to prove that a protection key stops the read.
#[cfg(test)]
pub(crate) fn peek(addr: usize) -> u8 {
    // SAFETY: tests pass addresses of tenant regions they allocated themselves (live, so
    // mapped); if the thread's PKRU closes the page's key the read faults, which the
    // child process running this expects and dies of; otherwise it reads an initialised
    // byte nobody writes concurrently.
    unsafe { ptr::read_volatile(addr as *const u8) }
}

/// Test only: no core files from the child processes that fault on purpose.
#[cfg(test)]
pub(crate) fn disable_core_dumps() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `setrlimit` reads the struct we pass by reference and nothing else.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(pages: usize) -> Arc<Mapping> {
        let page = page_size();
        Mapping::reserve(pages * page, page).unwrap()
    }

    #[test]
    fn overlapping_claims_are_refused() {
        let page = page_size();
        let m = mapping(8);
        let a = m.open(page, 2 * page).unwrap();
        for (off, len) in [(0, 2 * page), (2 * page, page), (page, page), (0, 8 * page)] {
            assert!(
                matches!(m.open(off, len), Err(OpenError::Overlap { .. })),
                "[{off}, +{len}) overlaps [{page}, +{})",
                2 * page
            );
        }
        // Adjacent ranges are fine.
        let b = m.open(0, page).unwrap();
        let c = m.open(3 * page, page).unwrap();
        drop((a, b, c));
        // Released claims can be taken again.
        let _all = m.open(0, 8 * page).unwrap();
    }

    #[test]
    fn bad_ranges_are_refused() {
        let page = page_size();
        let m = mapping(4);
        for (off, len) in [(0, 0), (1, page), (0, page + 1), (3 * page, 2 * page)] {
            assert_eq!(m.open(off, len).err(), Some(OpenError::OutOfBounds));
        }
        assert_eq!(
            m.open(usize::MAX - page + 1, page).err(),
            Some(OpenError::OutOfBounds)
        );
    }

    #[test]
    fn retire_zeroes_with_either_scrub() {
        let page = page_size();
        let m = mapping(4);
        for scrub in [Scrub::Discard, Scrub::Zero] {
            let mut s = m.open(page, 2 * page).unwrap();
            s.bytes_mut().unwrap().fill(0x5A);
            s.retire(scrub).unwrap();
            assert!(s.retire(scrub).is_ok(), "retire is idempotent");
            drop(s);
            let s = m.open(page, 2 * page).unwrap();
            assert!(
                s.bytes().unwrap().iter().all(|&b| b == 0),
                "{scrub:?} left bytes"
            );
        }
    }

    #[test]
    fn sys_error_names_the_call() {
        let e = SysError {
            call: "mprotect",
            errno: libc::ENOMEM,
        };
        let text = e.to_string();
        assert!(text.starts_with("`mprotect` failed: "), "{text}");
        assert_eq!(e.io_error().raw_os_error(), Some(libc::ENOMEM));
    }
}
