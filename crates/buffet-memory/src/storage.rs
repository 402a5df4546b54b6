//! Memory Storage: one reserved arena, carved into page-aligned, guard-separated regions
//! and packed chunks.
//!
//! Layout of the arena (`G` = guard page, never accessible):
//!
//! ```text
//! | G | region 1 | G | region 2 | G |   free ...   | packed chunk | G | region 3 | G | free |
//! ```
//!
//! The first page is a guard; every region is followed by its own guard page. A block
//! handed out is `region + guard`, so regions never touch and a linear overrun or
//! underrun of any region hits `PROT_NONE` and faults.
//!
//! Packed regions ([`MemoryStorage::alloc_packed`]: small typed states where the type
//! system, not the page table, isolates tenants) are cache-line-aligned parts of a packed
//! chunk: a 2 MiB span, aligned on 2 MiB and hinted for a transparent huge page where the
//! arena allows (so thousands of states share one TLB entry), otherwise 64 KiB on
//! ordinary pages. A chunk is a block like any other, followed by its guard page; inside
//! it, packed regions sit side by side with no guard between them. A second free list
//! (best fit, coalescing, by offset) hands out the chunks' parts; a released part is
//! zeroed by hand before it goes back, and a chunk that empties is scrubbed and returned
//! to the arena (the last one stays, for the next admission).
//!
//! Free blocks are kept by offset (to coalesce neighbours on release) and by size (best
//! fit, lowest address on ties), so a released range is reused by the next request that
//! fits it. The free list sits behind a `Mutex`: allocation and release are control-path
//! operations (admission, removal), never per packet. The syscalls (`mprotect`,
//! `madvise`) run outside that lock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::domain::RegionExtent;
use crate::sys::{
    self, Mapping, OpenError, OpenSpan, PackedBlock, RegionBytesMut, RegionSealed, Scrub, SysError,
};

/// Alignment, and size granularity, of packed regions: one cache line.
pub const PACKED_ALIGN: usize = 64;

/// The largest packed region: [`MemoryStorage::alloc_packed`] gives larger requests a page
/// region. A state this small shares its pages with its neighbours; a larger one has pages
/// of its own anyway.
pub const PACKED_MAX_BYTES: usize = 2048;

/// A packed chunk where the arena has room for one aligned on its size: one transparent
/// huge page on x86-64.
const HUGE_CHUNK: usize = 2 << 20;

/// A packed chunk where it has not (a small arena): ordinary pages.
const SMALL_CHUNK: usize = 64 << 10;

/// How much address space the arena reserves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Bytes of address space to reserve (rounded up to whole pages). Reserving costs no
    /// memory: pages are backed only while a region using them is allocated and touched.
    pub capacity: usize,
}

impl ArenaConfig {
    /// The default reservation: 256 GiB of address space. It costs no memory (the
    /// reservation is `PROT_NONE`, `MAP_NORESERVE`; a region's pages are committed when
    /// the NF first touches them), and it holds 10,000 tenants of the reference NF with
    /// the largest registered region (ids, 8.8 MB), so the arena is not what limits
    /// tenants: the Tenant Table's slots and the memory the tenants really use are.
    pub const DEFAULT_CAPACITY: usize = 256 << 30;

    /// An arena of `mib` MiB of address space (`--arena-mib`, `dataplane.arena_mib`);
    /// a size past the address space is capped at `usize::MAX`.
    pub fn mib(mib: u64) -> ArenaConfig {
        ArenaConfig {
            capacity: mib
                .checked_mul(1 << 20)
                .and_then(|b| usize::try_from(b).ok())
                .unwrap_or(usize::MAX),
        }
    }

    /// An arena for `regions` regions of `bytes` each, and not much more: each region
    /// rounded up to whole pages plus its guard page, counted for pages of up to 64 KiB,
    /// with 16 MiB to spare. For a known set of tenants (a benchmark, a test) that should
    /// not reserve the default's address space, e.g. under valgrind, whose address space
    /// is smaller.
    pub fn for_regions(regions: usize, bytes: usize) -> ArenaConfig {
        const MAX_PAGE: usize = 64 << 10;
        let per_region = (bytes.div_ceil(MAX_PAGE) + 2) * MAX_PAGE;
        ArenaConfig {
            capacity: per_region * regions + (16 << 20),
        }
    }
}

impl ArenaConfig {
    /// The largest region an empty arena of this capacity gives: its pages less the
    /// leading guard page and the region's own ([`AllocError::TooLarge`]'s `max`).
    pub fn largest_region(&self) -> usize {
        let page = sys::page_size();
        self.capacity
            .checked_next_multiple_of(page)
            .map_or(usize::MAX - 2 * page, |c| c.saturating_sub(2 * page))
    }
}

impl Default for ArenaConfig {
    /// [`ArenaConfig::DEFAULT_CAPACITY`] of address space.
    fn default() -> Self {
        ArenaConfig {
            capacity: Self::DEFAULT_CAPACITY,
        }
    }
}

/// Why the arena could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArenaError {
    /// The capacity cannot hold even one page-sized region and its two guard pages.
    #[error("arena capacity of {capacity} bytes is too small: at least {minimum} bytes (3 pages) are needed")]
    TooSmall {
        /// The capacity asked for.
        capacity: usize,
        /// The smallest usable capacity.
        minimum: usize,
    },
    /// The capacity does not fit the address space once rounded up to pages.
    #[error("arena capacity of {capacity} bytes is larger than the address space")]
    TooLarge {
        /// The capacity asked for.
        capacity: usize,
    },
    /// The kernel refused the reservation.
    #[error("reserving {capacity} bytes of address space: {cause}")]
    Reserve {
        /// The (page-rounded) capacity asked for.
        capacity: usize,
        /// The failed call (`mmap`).
        cause: SysError,
    },
}

/// Why a region could not be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// More than the whole arena could ever give, even empty.
    #[error("region of {requested} bytes exceeds the largest possible region ({max} bytes)")]
    TooLarge {
        /// Bytes asked for.
        requested: usize,
        /// The largest region an empty arena could give.
        max: usize,
    },
    /// No free range is large enough right now.
    #[error("arena exhausted: no free range for a region of {requested} bytes (largest free region: {largest_free} bytes)")]
    Exhausted {
        /// Bytes asked for, rounded up to pages.
        requested: usize,
        /// The largest region that could be allocated now.
        largest_free: usize,
    },
    /// The kernel refused to make the region accessible. `ENOMEM` here usually means the
    /// process hit `vm.max_map_count`: each live region costs about two mappings.
    #[error("making a region of {len} bytes accessible: {cause}")]
    Protect {
        /// The region's length.
        len: usize,
        /// The failed call (`mprotect`).
        cause: SysError,
    },
}

/// A snapshot of the storage's accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Bytes of address space reserved for the arena.
    pub reserved: usize,
    /// Bytes in live regions (guard pages not counted).
    pub in_use: usize,
    /// Number of live regions.
    pub regions: usize,
    /// Bytes in free ranges (including the guard page each future region will take).
    pub free: usize,
    /// The largest region that could be allocated right now.
    pub largest_free: usize,
    /// Bytes withdrawn from use because they could not be made inaccessible again after
    /// release (they were zeroed; they are never handed out again).
    pub quarantined: usize,
    /// Live packed regions (counted in `regions` too).
    pub packed_regions: usize,
    /// Packed chunks open.
    pub packed_chunks: usize,
    /// Packed chunks hinted for transparent huge pages (`madvise(MADV_HUGEPAGE)`
    /// accepted).
    pub huge_chunks: usize,
}

/// The arena and its free list. Cheap to clone: all clones share one arena.
///
/// Regions keep the arena alive: it is unmapped only when the last handle and the last
/// [`Region`] are gone.
#[derive(Clone)]
pub struct MemoryStorage {
    inner: Arc<Inner>,
}

struct Inner {
    map: Arc<Mapping>,
    page: usize,
    scrub: Scrub,
    books: Mutex<Books>,
}

/// Everything the free-list lock protects.
struct Books {
    free: FreeList,
    in_use: usize,
    regions: usize,
    quarantined: usize,
    /// Free parts of the packed chunks (offsets in the arena).
    packed: FreeList,
    /// The packed chunks by offset.
    chunks: BTreeMap<usize, Chunk>,
    packed_regions: usize,
}

/// One packed chunk: an open span whose parts are packed regions.
struct Chunk {
    span: OpenSpan,
    /// Bytes of it in live packed regions.
    used: usize,
    huge: bool,
}

impl MemoryStorage {
    /// Reserves the arena (`mmap` of `PROT_NONE`, `MAP_NORESERVE` address space).
    pub fn new(cfg: ArenaConfig) -> Result<Self, ArenaError> {
        Self::with_scrub(cfg, Scrub::PLATFORM)
    }

    pub(crate) fn with_scrub(cfg: ArenaConfig, scrub: Scrub) -> Result<Self, ArenaError> {
        let page = sys::page_size();
        let minimum = 3 * page;
        let capacity = cfg
            .capacity
            .checked_next_multiple_of(page)
            .ok_or(ArenaError::TooLarge {
                capacity: cfg.capacity,
            })?;
        if capacity < minimum {
            return Err(ArenaError::TooSmall {
                capacity: cfg.capacity,
                minimum,
            });
        }
        let map = Mapping::reserve(capacity, page)
            .map_err(|cause| ArenaError::Reserve { capacity, cause })?;
        // Page 0 is the leading guard; everything after it is one free block.
        let mut free = FreeList::default();
        free.give(page, capacity - page);
        Ok(MemoryStorage {
            inner: Arc::new(Inner {
                map,
                page,
                scrub,
                books: Mutex::new(Books {
                    free,
                    in_use: 0,
                    regions: 0,
                    quarantined: 0,
                    packed: FreeList::default(),
                    chunks: BTreeMap::new(),
                    packed_regions: 0,
                }),
            }),
        })
    }

    /// The page size regions are rounded to and aligned on.
    pub fn page_size(&self) -> usize {
        self.inner.page
    }

    /// The length a region of `bytes` gets: rounded up to whole pages, at least one page.
    pub fn region_len(&self, bytes: usize) -> Result<usize, AllocError> {
        let max = self.inner.map.len() - 2 * self.inner.page;
        match bytes.max(1).checked_next_multiple_of(self.inner.page) {
            Some(len) if len <= max => Ok(len),
            _ => Err(AllocError::TooLarge {
                requested: bytes,
                max,
            }),
        }
    }

    /// Allocates a zero-filled, readable and writable region of at least `bytes` bytes
    /// (rounded up to whole pages; at least one page), with a guard page on each side.
    pub fn alloc(&self, bytes: usize) -> Result<Region, AllocError> {
        let page = self.inner.page;
        let len = self.region_len(bytes)?;
        let block = len + page;
        let off = {
            let mut books = self.inner.books();
            let off = books.free.take(block).ok_or(AllocError::Exhausted {
                requested: len,
                largest_free: books.free.largest().saturating_sub(page),
            })?;
            books.in_use += len;
            books.regions += 1;
            off
        };
        match self.inner.map.open(off, len) {
            Ok(span) => Ok(Region {
                backing: Backing::Pages(span),
                storage: Arc::clone(&self.inner),
            }),
            Err(OpenError::Sys(cause)) => {
                let mut books = self.inner.books();
                books.free.give(off, block);
                books.in_use -= len;
                books.regions -= 1;
                Err(AllocError::Protect { len, cause })
            }
            Err(bug) => panic!(
                "buffet-memory free list handed out [{off}, +{len}) which the arena refused: {bug:?}"
            ),
        }
    }

    /// Allocates a zero-filled, readable and writable region of at least `bytes` bytes,
    /// packed: rounded up to a multiple of [`PACKED_ALIGN`], aligned on it, beside other
    /// packed regions in a shared chunk — no guard pages, so nothing but the type system
    /// keeps a neighbour out. For small typed states at the `safe` level, where guard pages
    /// buy nothing and a page per tenant costs a TLB entry per tenant. Requests larger
    /// than [`PACKED_MAX_BYTES`] get a page region ([`alloc`](Self::alloc)) instead.
    pub fn alloc_packed(&self, bytes: usize) -> Result<Region, AllocError> {
        let len = bytes.max(1).next_multiple_of(PACKED_ALIGN);
        if len > PACKED_MAX_BYTES {
            return self.alloc(bytes);
        }
        loop {
            {
                let mut books = self.inner.books();
                if let Some(off) = books.packed.take(len) {
                    let (_, chunk) = books
                        .chunks
                        .range_mut(..=off)
                        .next_back()
                        .expect("every packed part lies in a chunk");
                    chunk.used += len;
                    let block = PackedBlock::new(&chunk.span, off, len);
                    books.in_use += len;
                    books.regions += 1;
                    books.packed_regions += 1;
                    return Ok(Region {
                        backing: Backing::Packed(block),
                        storage: Arc::clone(&self.inner),
                    });
                }
            }
            self.add_chunk()?;
        }
    }

    /// Opens one more packed chunk: [`HUGE_CHUNK`] bytes aligned on their size and hinted
    /// for a huge page where the arena has such a range free, [`SMALL_CHUNK`] otherwise.
    /// The `mprotect` and `madvise` run outside the books' lock.
    fn add_chunk(&self) -> Result<(), AllocError> {
        let page = self.inner.page;
        let base = self.inner.map.base_addr();
        let (off, len) = {
            let mut books = self.inner.books();
            match books.free.take_aligned(HUGE_CHUNK + page, base, HUGE_CHUNK) {
                Some(off) => (off, HUGE_CHUNK),
                None => {
                    let len = SMALL_CHUNK.max(page);
                    let off = books.free.take(len + page).ok_or(AllocError::Exhausted {
                        requested: len,
                        largest_free: books.free.largest().saturating_sub(page),
                    })?;
                    (off, len)
                }
            }
        };
        let span = match self.inner.map.open_chunk(off, len) {
            Ok(span) => span,
            Err(OpenError::Sys(cause)) => {
                self.inner.books().free.give(off, len + page);
                return Err(AllocError::Protect { len, cause });
            }
            Err(bug) => panic!(
                "buffet-memory free list handed out chunk [{off}, +{len}) which the arena refused: {bug:?}"
            ),
        };
        let huge = len == HUGE_CHUNK && self.inner.map.hint_huge(off, len);
        let mut books = self.inner.books();
        books.chunks.insert(
            off,
            Chunk {
                span,
                used: 0,
                huge,
            },
        );
        books.packed.give(off, len);
        Ok(())
    }

    /// Reserved bytes, bytes and regions in use, free space.
    pub fn stats(&self) -> StorageStats {
        let books = self.inner.books();
        StorageStats {
            reserved: self.inner.map.len(),
            in_use: books.in_use,
            regions: books.regions,
            free: books.free.total(),
            largest_free: books.free.largest().saturating_sub(self.inner.page),
            quarantined: books.quarantined,
            packed_regions: books.packed_regions,
            packed_chunks: books.chunks.len(),
            huge_chunks: books.chunks.values().filter(|c| c.huge).count(),
        }
    }

    /// First address of the arena (for tests and diagnostics).
    pub fn arena_base(&self) -> usize {
        self.inner.map.base_addr()
    }

    #[cfg(test)]
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.inner.map
    }
}

impl fmt::Debug for MemoryStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStorage")
            .field("arena_base", &format_args!("{:#x}", self.arena_base()))
            .field("page_size", &self.inner.page)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Inner {
    fn books(&self) -> MutexGuard<'_, Books> {
        // The books are updated in single statements that cannot panic halfway, so a
        // poisoned lock still guards consistent data.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Scrubs, seals and returns a region's range to the free list.
    fn release(&self, span: &mut OpenSpan) {
        let (off, len) = (span.off(), span.len());
        let sealed = span.retire(self.scrub);
        let mut books = self.books();
        books.in_use -= len;
        books.regions -= 1;
        match sealed {
            Ok(()) => books.free.give(off, len + self.page),
            // Zeroed but still accessible: never reuse it.
            Err(_) => books.quarantined += len + self.page,
        }
    }

    /// Zeroes a packed region and returns it to its chunk; scrubs, seals and returns the
    /// chunk to the arena when it empties and another chunk remains.
    fn release_packed(&self, block: &mut PackedBlock) {
        // Zeroed before the part is free again: no later tenant sees these bytes.
        block.bytes_mut().fill(0);
        let (off, len) = (block.off(), block.len());
        let mut books = self.books();
        books.packed.give(off, len);
        books.in_use -= len;
        books.regions -= 1;
        books.packed_regions -= 1;
        let many = books.chunks.len() > 1;
        let (&chunk_off, chunk) = books
            .chunks
            .range_mut(..=off)
            .next_back()
            .expect("every packed part lies in a chunk");
        chunk.used -= len;
        if chunk.used > 0 || !many {
            return;
        }
        // Chunks are separated by guard pages, so an empty chunk is one free part.
        let chunk_len = chunk.span.len();
        books.packed.remove(chunk_off, chunk_len);
        let mut chunk = books.chunks.remove(&chunk_off).expect("found above");
        drop(books);
        let sealed = chunk.span.retire(self.scrub);
        let mut books = self.books();
        match sealed {
            Ok(()) => books.free.give(chunk_off, chunk_len + self.page),
            Err(_) => books.quarantined += chunk_len + self.page,
        }
    }
}

/// One allocated region: owns `[base, base + len)` of the arena, readable and writable.
///
/// A page region ([`MemoryStorage::alloc`]) is whole pages between guard pages; on drop its
/// bytes are scrubbed to zero (`madvise(MADV_DONTNEED)`: the kernel maps fresh zero pages
/// on next touch and takes the memory back; explicit zeroing if that call fails), the
/// range is made `PROT_NONE` again, and it returns to the free list. A packed region
/// ([`MemoryStorage::alloc_packed`]) is a cache-line-aligned part of a packed chunk; on
/// drop it is zeroed and returned to the chunk.
pub struct Region {
    backing: Backing,
    storage: Arc<Inner>,
}

enum Backing {
    Pages(OpenSpan),
    Packed(PackedBlock),
}

impl Region {
    /// First byte of the region: page-aligned, or for a packed region aligned on
    /// [`PACKED_ALIGN`].
    pub fn base(&self) -> NonNull<u8> {
        match &self.backing {
            Backing::Pages(span) => span.ptr(),
            Backing::Packed(block) => block.ptr(),
        }
    }

    /// Length in bytes, never 0: whole pages, or for a packed region a multiple of
    /// [`PACKED_ALIGN`].
    pub fn len(&self) -> usize {
        match &self.backing {
            Backing::Pages(span) => span.len(),
            Backing::Packed(block) => block.len(),
        }
    }

    /// Always `false`: a region has at least one page or one cache line.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the region is packed among others in a chunk, with no guard pages.
    pub fn is_packed(&self) -> bool {
        matches!(self.backing, Backing::Packed(_))
    }

    /// Where the region lies.
    pub fn extent(&self) -> RegionExtent {
        RegionExtent {
            base: self.base().as_ptr() as usize,
            len: self.len(),
        }
    }

    /// The region's bytes. Refused while pages inside it are sealed
    /// ([`seal_pages`](crate::seal_pages)): a reference over them would fault.
    pub fn bytes(&self) -> Result<&[u8], RegionSealed> {
        match &self.backing {
            Backing::Pages(span) => span.bytes(),
            Backing::Packed(block) => Ok(block.bytes()),
        }
    }

    /// The region's bytes, mutably, for as long as the region is borrowed. Refused while
    /// pages inside it are sealed; pages [`seal_pages`](crate::seal_pages) is given
    /// inside them are sealed when the borrow ends (the [`RegionBytesMut`] drops).
    pub fn bytes_mut(&mut self) -> Result<RegionBytesMut<'_>, RegionSealed> {
        match &mut self.backing {
            Backing::Pages(span) => span.bytes_mut(),
            Backing::Packed(block) => Ok(block.bytes_mut()),
        }
    }

    /// Whether pages inside the region are sealed (or given to
    /// [`seal_pages`](crate::seal_pages) and sealed when the current borrow ends): while
    /// they are, [`bytes`](Self::bytes) and [`bytes_mut`](Self::bytes_mut) refuse.
    pub fn has_sealed_pages(&self) -> bool {
        match &self.backing {
            Backing::Pages(span) => span.check_unsealed().is_err(),
            Backing::Packed(_) => false,
        }
    }

    /// The span of a page region, for [`sys::StateCell`] (protection-key tags).
    pub(crate) fn span(&self) -> Option<&OpenSpan> {
        match &self.backing {
            Backing::Pages(span) => Some(span),
            Backing::Packed(_) => None,
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match &mut self.backing {
            Backing::Pages(span) => self.storage.release(span),
            Backing::Packed(block) => self.storage.release_packed(block),
        }
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("base", &self.base())
            .field("len", &self.len())
            .field("packed", &self.is_packed())
            .finish()
    }
}

/// Free blocks of the arena, by offset and by size.
#[derive(Debug, Default)]
struct FreeList {
    by_off: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
    total: usize,
}

impl FreeList {
    /// Best fit: the smallest free block of at least `size` bytes (lowest offset among
    /// equals); takes its front and keeps the rest.
    fn take(&mut self, size: usize) -> Option<usize> {
        let &(found, off) = self.by_size.range((size, 0)..).next()?;
        self.remove(off, found);
        if found > size {
            self.insert(off + size, found - size);
        }
        Some(off)
    }

    /// Like [`take`](Self::take), but the block taken starts where `base + off` is a
    /// multiple of `align` (a power of two): from the smallest free block holding such a
    /// range, the highest one, so that page regions, taken from the low end, stay side
    /// by side; what lies before and after it stays free.
    fn take_aligned(&mut self, size: usize, base: usize, align: usize) -> Option<usize> {
        debug_assert!(align.is_power_of_two());
        let (found, off, at) = self.by_size.range((size, 0)..).find_map(|&(found, off)| {
            let at = ((base + off + found - size) & !(align - 1)).checked_sub(base)?;
            (at >= off).then_some((found, off, at))
        })?;
        self.remove(off, found);
        if at > off {
            self.insert(off, at - off);
        }
        if off + found > at + size {
            self.insert(at + size, off + found - at - size);
        }
        Some(at)
    }

    /// Returns `[off, off+size)`, merged with free neighbours.
    fn give(&mut self, mut off: usize, mut size: usize) {
        if let Some((&p_off, &p_size)) = self.by_off.range(..off).next_back() {
            debug_assert!(p_off + p_size <= off, "double free at {off}");
            if p_off + p_size == off {
                self.remove(p_off, p_size);
                off = p_off;
                size += p_size;
            }
        }
        if let Some((&n_off, &n_size)) = self.by_off.range(off..).next() {
            debug_assert!(off + size <= n_off, "double free at {off}");
            if off + size == n_off {
                self.remove(n_off, n_size);
                size += n_size;
            }
        }
        self.insert(off, size);
    }

    fn insert(&mut self, off: usize, size: usize) {
        self.by_off.insert(off, size);
        self.by_size.insert((size, off));
        self.total += size;
    }

    fn remove(&mut self, off: usize, size: usize) {
        self.by_off.remove(&off);
        self.by_size.remove(&(size, off));
        self.total -= size;
    }

    fn largest(&self) -> usize {
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn an_arena_for_regions_holds_them_all() {
        for bytes in [1, 4096, 70_000] {
            let s = MemoryStorage::new(ArenaConfig::for_regions(40, bytes)).unwrap();
            let regions: Vec<Region> = (0..40).map(|_| s.alloc(bytes).unwrap()).collect();
            assert!(regions.iter().all(|r| r.len() >= bytes));
        }
    }

    fn storage(pages: usize) -> MemoryStorage {
        MemoryStorage::new(ArenaConfig {
            capacity: pages * sys::page_size(),
        })
        .unwrap()
    }

    /// Deterministic xorshift64*, so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Every live region is page-aligned, inside the arena after the leading guard, and
    /// separated from the next by at least one page nobody owns.
    fn assert_disjoint_with_guards(s: &MemoryStorage, live: &[Region]) {
        let page = s.page_size();
        let lo = s.arena_base() + page;
        let hi = s.arena_base() + s.stats().reserved;
        let mut ext: Vec<RegionExtent> = live.iter().map(Region::extent).collect();
        ext.sort_by_key(|e| e.base);
        for e in &ext {
            assert_eq!(e.base % page, 0, "{e:?} not page-aligned");
            assert_eq!(e.len % page, 0, "{e:?} not whole pages");
            assert!(
                e.base >= lo && e.end() + page <= hi,
                "{e:?} outside the arena"
            );
        }
        for w in ext.windows(2) {
            assert!(
                w[0].end() + page <= w[1].base,
                "no guard page between {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }

    #[test]
    fn an_arena_in_mib_is_that_many_mebibytes_capped_at_the_address_space() {
        assert_eq!(ArenaConfig::mib(1).capacity, 1 << 20);
        assert_eq!(ArenaConfig::mib(1024).capacity, 1 << 30);
        assert_eq!(ArenaConfig::mib(u64::MAX).capacity, usize::MAX);
    }

    #[test]
    fn largest_region_is_what_an_empty_arena_gives() {
        for pages in [3, 16, 1000] {
            let cfg = ArenaConfig {
                capacity: pages * sys::page_size(),
            };
            let s = MemoryStorage::new(cfg).unwrap();
            let max = cfg.largest_region();
            assert_eq!(max, s.stats().largest_free);
            assert!(s.alloc(max).is_ok());
            let s = MemoryStorage::new(cfg).unwrap();
            assert_eq!(
                s.alloc(max + 1).err(),
                Some(AllocError::TooLarge {
                    requested: max + 1,
                    max
                })
            );
        }
    }

    #[test]
    fn config_is_validated() {
        let page = sys::page_size();
        assert_eq!(
            MemoryStorage::new(ArenaConfig { capacity: 2 * page }).err(),
            Some(ArenaError::TooSmall {
                capacity: 2 * page,
                minimum: 3 * page
            })
        );
        assert_eq!(
            MemoryStorage::new(ArenaConfig {
                capacity: usize::MAX
            })
            .err(),
            Some(ArenaError::TooLarge {
                capacity: usize::MAX
            })
        );
        assert!(matches!(
            MemoryStorage::new(ArenaConfig {
                capacity: usize::MAX / 2
            }),
            Err(ArenaError::Reserve {
                cause: SysError { call: "mmap", .. },
                ..
            })
        ));
        let s = storage(3);
        assert_eq!(s.stats().reserved, 3 * page);
        assert_eq!(s.stats().largest_free, page);
    }

    #[test]
    fn default_reserves_256_gib_without_using_it() {
        let s = MemoryStorage::new(ArenaConfig::default()).unwrap();
        let st = s.stats();
        assert_eq!(st.reserved, 256 << 30);
        assert_eq!((st.in_use, st.regions), (0, 0));
    }

    #[test]
    fn lengths_round_to_pages() {
        let s = storage(64);
        let page = s.page_size();
        for (bytes, pages) in [(0, 1), (1, 1), (page, 1), (page + 1, 2), (5 * page - 1, 5)] {
            let r = s.alloc(bytes).unwrap();
            assert_eq!(r.len(), pages * page, "alloc({bytes})");
            assert!(!r.is_empty());
            assert_eq!(r.base().as_ptr() as usize % page, 0);
        }
    }

    #[test]
    fn regions_never_overlap_and_have_guard_pages() {
        let s = storage(4096);
        let page = s.page_size();
        let mut rng = Rng(0x5EED_0001);
        let mut live: Vec<Region> = Vec::new();
        let mut allocated = 0;
        for round in 0..4000 {
            if !live.is_empty() && rng.below(3) == 0 {
                let i = rng.below(live.len() as u64) as usize;
                live.swap_remove(i);
            } else {
                let bytes = 1 + rng.below(6 * page as u64) as usize;
                match s.alloc(bytes) {
                    Ok(mut r) => {
                        // Every byte is ours and writable.
                        r.bytes_mut().unwrap().fill((round % 251) as u8);
                        live.push(r);
                        allocated += 1;
                    }
                    Err(AllocError::Exhausted { .. }) => live.clear(),
                    Err(e) => panic!("{e}"),
                }
            }
            if round % 50 == 0 {
                assert_disjoint_with_guards(&s, &live);
            }
        }
        assert_disjoint_with_guards(&s, &live);
        assert!(allocated > 2000, "the test should exercise reuse");
        let st = s.stats();
        assert_eq!(st.regions, live.len());
        assert_eq!(st.in_use, live.iter().map(Region::len).sum::<usize>());
        drop(live);
        let st = s.stats();
        assert_eq!((st.in_use, st.regions), (0, 0));
        // Everything coalesced back into one block.
        assert_eq!(st.largest_free, st.reserved - 2 * page);
        assert_eq!(st.free, st.reserved - page);
    }

    #[test]
    fn released_regions_are_zeroed_on_reuse() {
        for scrub in [Scrub::Discard, Scrub::Zero] {
            let s = MemoryStorage::with_scrub(
                ArenaConfig {
                    capacity: 64 * sys::page_size(),
                },
                scrub,
            )
            .unwrap();
            let _before = s.alloc(1).unwrap();
            let mut r = s.alloc(3 * s.page_size()).unwrap();
            let _after = s.alloc(1).unwrap();
            let base = r.base();
            for (i, b) in r.bytes_mut().unwrap().iter_mut().enumerate() {
                *b = (i % 255) as u8 + 1;
            }
            drop(r);
            let r = s.alloc(3 * s.page_size()).unwrap();
            assert_eq!(r.base(), base, "{scrub:?}: the freed range is reused");
            assert!(
                r.bytes().unwrap().iter().all(|&b| b == 0),
                "{scrub:?}: reused region still holds old bytes"
            );
        }
    }

    #[test]
    fn a_freed_range_is_reused_by_a_smaller_region() {
        let s = storage(64);
        let page = s.page_size();
        let big = s.alloc(8 * page).unwrap();
        let _pin = s.alloc(page).unwrap();
        let base = big.base().as_ptr() as usize;
        drop(big);
        let small = s.alloc(2 * page).unwrap();
        assert_eq!(small.base().as_ptr() as usize, base);
        assert!(small.bytes().unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn exhaustion_and_oversize_are_errors_that_change_nothing() {
        let s = storage(16);
        let page = s.page_size();
        assert_eq!(
            s.alloc(15 * page).err(),
            Some(AllocError::TooLarge {
                requested: 15 * page,
                max: 14 * page
            })
        );
        let whole = s.alloc(14 * page).unwrap();
        let before = s.stats();
        assert_eq!(
            s.alloc(1).err(),
            Some(AllocError::Exhausted {
                requested: page,
                largest_free: 0
            })
        );
        assert_eq!(s.stats(), before);
        drop(whole);
        let halves = (s.alloc(6 * page).unwrap(), s.alloc(6 * page).unwrap());
        assert!(matches!(
            s.alloc(2 * page),
            Err(AllocError::Exhausted {
                largest_free: 0,
                ..
            })
        ));
        drop(halves);
        assert_eq!(s.stats().largest_free, 14 * page);
    }

    #[test]
    fn regions_outlive_their_storage_handle() {
        let s = storage(8);
        let mut r = s.alloc(1).unwrap();
        drop(s);
        r.bytes_mut().unwrap()[0] = 7;
        assert_eq!(r.bytes().unwrap()[0], 7);
    }

    #[test]
    fn free_list_best_fit_and_coalescing() {
        let mut f = FreeList::default();
        f.give(0, 100);
        assert_eq!(f.take(10), Some(0));
        assert_eq!(f.take(20), Some(10));
        assert_eq!(f.take(30), Some(30));
        // Free: [60, 100). Return [10, 30): best fit for 20 is it, not the tail.
        f.give(10, 20);
        assert_eq!(f.take(15), Some(10));
        assert_eq!(f.take(5), Some(25));
        f.give(25, 5);
        f.give(10, 15);
        f.give(0, 10);
        f.give(30, 30);
        assert_eq!(f.by_off.len(), 1, "{f:?}");
        assert_eq!((f.largest(), f.total()), (100, 100));
        assert_eq!(f.take(101), None);
    }

    /// The packed chunk a live packed region lies in, from the books.
    fn chunk_of(s: &MemoryStorage, r: &Region) -> (usize, usize) {
        let off = r.base().as_ptr() as usize - s.arena_base();
        let books = s.inner.books();
        let (&c, chunk) = books.chunks.range(..=off).next_back().unwrap();
        (c, chunk.span.len())
    }

    #[test]
    fn packed_regions_are_aligned_disjoint_and_zero_on_reuse() {
        let s = storage(4096);
        let page = s.page_size();
        let mut rng = Rng(0x5EED_0002);
        // Each live region with the byte it was filled with.
        let mut live: Vec<(Region, u8)> = Vec::new();
        let (mut packed, mut reused) = (0, 0);
        let mut seen = std::collections::HashSet::new();
        for round in 0..6000u32 {
            if !live.is_empty() && rng.below(5) < 2 {
                let i = rng.below(live.len() as u64) as usize;
                live.swap_remove(i);
                continue;
            }
            let fill = (round % 250) as u8 + 1;
            // Mostly packed states, sometimes a page region between them.
            let r = if rng.below(8) == 0 {
                s.alloc(1 + rng.below(2 * page as u64) as usize)
            } else {
                let bytes = 1 + rng.below(PACKED_MAX_BYTES as u64) as usize;
                s.alloc_packed(bytes).inspect(|r| {
                    assert!(r.is_packed());
                    assert!(r.len() >= bytes && r.len() < bytes + PACKED_ALIGN);
                })
            };
            let mut r = r.unwrap();
            if r.is_packed() {
                packed += 1;
                let e = r.extent();
                assert_eq!((e.base % PACKED_ALIGN, e.len % PACKED_ALIGN), (0, 0));
                let (c, len) = chunk_of(&s, &r);
                let off = e.base - s.arena_base();
                assert!(
                    off >= c && off + e.len <= c + len,
                    "{e:?} outside its chunk"
                );
                if !seen.insert(e.base) {
                    reused += 1;
                }
            }
            assert!(
                r.bytes().unwrap().iter().all(|&b| b == 0),
                "round {round}: a new region holds old bytes"
            );
            r.bytes_mut().unwrap().fill(fill);
            live.push((r, fill));
        }
        assert!(
            packed > 3000 && reused > 500,
            "{packed} packed, {reused} reused"
        );
        // No region wrote into another: each still holds only its own byte.
        for (r, fill) in &live {
            assert!(
                r.bytes().unwrap().iter().all(|b| b == fill),
                "{:?} overwritten",
                r.extent()
            );
        }
        let mut ext: Vec<RegionExtent> = live.iter().map(|(r, _)| r.extent()).collect();
        ext.sort_by_key(|e| e.base);
        assert!(ext.windows(2).all(|w| w[0].end() <= w[1].base), "overlap");
        let st = s.stats();
        assert_eq!(st.regions, live.len());
        assert_eq!(
            st.packed_regions,
            live.iter().filter(|(r, _)| r.is_packed()).count()
        );
        assert_eq!(st.in_use, live.iter().map(|(r, _)| r.len()).sum::<usize>());
        drop(live);
        let st = s.stats();
        assert_eq!((st.in_use, st.regions, st.packed_regions), (0, 0, 0));
        // One chunk stays open for the next packed region; the rest went back.
        assert_eq!(st.packed_chunks, 1);
    }

    #[test]
    fn a_packed_chunk_is_a_huge_page_where_the_arena_has_room_and_small_pages_otherwise() {
        // 64 MiB: room for a 2 MiB chunk on a 2 MiB boundary.
        let s = storage(16 << 10);
        let r = s.alloc_packed(100).unwrap();
        let (c, len) = chunk_of(&s, &r);
        assert_eq!((len, (s.arena_base() + c) % HUGE_CHUNK), (HUGE_CHUNK, 0));
        assert_eq!(
            r.extent().base,
            s.arena_base() + c,
            "first fit at the chunk start"
        );
        assert_eq!(r.len(), 128);
        let st = s.stats();
        assert_eq!((st.packed_chunks, st.packed_regions), (1, 1));
        // Whether the kernel took the hint depends on its THP setting.
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|t| !t.contains("[never]"));
        if thp {
            assert_eq!(st.huge_chunks, 1);
        }
        // 256 KiB: no 2 MiB boundary with room, so a small chunk.
        let s = storage(64);
        let r = s.alloc_packed(1).unwrap();
        assert_eq!(chunk_of(&s, &r).1, SMALL_CHUNK);
        assert_eq!(r.len(), PACKED_ALIGN);
        assert_eq!(s.stats().huge_chunks, 0);
    }

    #[test]
    fn packed_chunks_fill_densely_and_empty_ones_go_back() {
        let s = storage(64);
        let page = s.page_size();
        let per_chunk = SMALL_CHUNK / PACKED_ALIGN;
        let regions: Vec<Region> = (0..per_chunk + 1)
            .map(|_| s.alloc_packed(PACKED_ALIGN).unwrap())
            .collect();
        // The first chunk holds exactly `per_chunk` states, back to back.
        let mut bases: Vec<usize> = regions[..per_chunk]
            .iter()
            .map(|r| r.extent().base)
            .collect();
        bases.sort_unstable();
        assert!(bases.windows(2).all(|w| w[1] - w[0] == PACKED_ALIGN));
        assert_eq!(s.stats().packed_chunks, 2);
        drop(regions);
        let st = s.stats();
        assert_eq!((st.packed_chunks, st.in_use), (1, 0));
        // All free but the leading guard and the chunk kept open (with its guard page).
        assert_eq!(st.free, st.reserved - page - (SMALL_CHUNK + page));
    }

    #[test]
    fn large_packed_requests_get_a_page_region() {
        let s = storage(64);
        let r = s.alloc_packed(PACKED_MAX_BYTES + 1).unwrap();
        assert!(!r.is_packed());
        assert_eq!(r.len() % s.page_size(), 0);
        assert_eq!(s.stats().packed_chunks, 0);
        assert!(s.alloc_packed(PACKED_MAX_BYTES).unwrap().is_packed());
    }

    const CHILD_ENV: &str = "BUFFET_MEMORY_FAULT_CHILD";

    /// Runs `fault_child` in a fresh copy of this test binary with `mode`; returns how it ended.
    fn run_child(mode: &str) -> std::process::ExitStatus {
        let name = format!(
            "{}::fault_child",
            module_path!().split_once("::").map_or("", |(_, m)| m)
        );
        let out = Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("child: touching"),
            "the child did not run `{name}` in mode {mode}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.status
    }

    /// Not a test on its own: the body a child process runs for `guard_pages_fault`.
    #[test]
    fn fault_child() {
        let Ok(mode) = std::env::var(CHILD_ENV) else {
            return;
        };
        sys::disable_core_dumps();
        let s = storage(64);
        let page = s.page_size();
        let first = s.alloc(2 * page).unwrap();
        let mut second = s.alloc(page).unwrap();
        let mut packed = s.alloc_packed(64).unwrap();
        let released = s.alloc(page).unwrap();
        let released_off = released.base().as_ptr() as usize - s.arena_base();
        drop(released);
        let first_off = first.base().as_ptr() as usize - s.arena_base();
        let second_off = second.base().as_ptr() as usize - s.arena_base();
        let (chunk_off, chunk_len) = chunk_of(&s, &packed);
        println!("child: touching {mode}");
        match mode.as_str() {
            // Control: the last byte of a region is writable.
            "inside" => second.bytes_mut().unwrap()[page - 1] = 1,
            "before-first" => s.mapping().poke(first_off - 1),
            "after-first" => s.mapping().poke(first_off + first.len()),
            "before-second" => s.mapping().poke(second_off - 1),
            "released" => s.mapping().poke(released_off),
            // Control: a packed region is writable.
            "packed" => packed.bytes_mut().unwrap()[63] = 1,
            "before-chunk" => s.mapping().poke(chunk_off - 1),
            "after-chunk" => s.mapping().poke(chunk_off + chunk_len),
            other => panic!("unknown mode {other}"),
        }
        println!("child: survived {mode}");
    }

    #[test]
    fn guard_pages_fault() {
        use std::os::unix::process::ExitStatusExt;
        if std::env::var_os(CHILD_ENV).is_some() {
            return;
        }
        for mode in ["inside", "packed"] {
            let ok = run_child(mode);
            assert!(ok.success(), "writing {mode} must work: {ok:?}");
        }
        for mode in [
            "before-first",
            "after-first",
            "before-second",
            "released",
            "before-chunk",
            "after-chunk",
        ] {
            let st = run_child(mode);
            assert_eq!(
                st.signal(),
                Some(libc::SIGSEGV),
                "writing {mode} must die of SIGSEGV, got {st:?}"
            );
        }
    }
}
