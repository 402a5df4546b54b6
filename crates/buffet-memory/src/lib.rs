//! Buffet's Memory Manager: where each tenant's state lives, and how workers find it.
//!
//! * [`MemoryStorage`] reserves one arena of address space at start-up (`mmap`,
//!   `PROT_NONE`, `MAP_NORESERVE`: it costs no memory until used) and carves
//!   [`Region`]s from it. A page region ([`MemoryStorage::alloc`]) is page-aligned with
//!   an inaccessible guard page on either side, readable and writable only while
//!   allocated. On release it is scrubbed with `madvise(MADV_DONTNEED)` — for a private
//!   anonymous mapping the kernel then supplies zero-filled pages on the next touch, and
//!   takes the memory back — or by writing zeros if that call fails, made `PROT_NONE`
//!   again, and returned to a best-fit, coalescing free list. A packed region
//!   ([`MemoryStorage::alloc_packed`], at most [`PACKED_MAX_BYTES`]) is a cache-line-aligned
//!   part of a shared 2 MiB chunk hinted for a transparent huge page, zeroed by hand on
//!   release. No tenant ever sees another tenant's old bytes, and a linear overrun past
//!   a page region faults.
//! * [`TenantTable`] maps a dense slot index to a [`TenantEntry`]: tenant id, region, and
//!   the tenant's state `S`, moved *into* the region. The layout follows the isolation
//!   level: outside MPK a small state is packed beside the other tenants' (the type system
//!   keeps them apart; one TLB entry covers thousands of states) and the untyped bytes
//!   past it, if the NF asked for any, are a page region of their own; in the MPK domain
//!   state and bytes share one page region carrying the tenant's key. Workers look an entry up once per
//!   packet group, lock-free and without allocating ([`TenantTable::get`]), and take the
//!   state with [`TenantEntry::lock`] — one atomic CAS, contended only while a tenant
//!   migrates between workers. Admission, policy updates ([`TenantTable::replace_with`])
//!   and removal run on a control thread and publish with one atomic swap per slot:
//!   other tenants' traffic never pauses. The table owns the process's tenant registry
//!   ([`buffet_sdk::TenantRegistry`]): it picks the slot of a new tenant
//!   ([`TenantTable::admit_next`]) and is the one place that maps tenant ids to slots.
//! * [`Domain`] tags each entry with its isolation domain: [`Domain::None`] (the
//!   type-system-only "safe" level) or [`Domain::Mpk`]: every region carries a non-zero
//!   Intel protection key, open only to the thread that holds the tenant's state guard,
//!   keys virtualised over any number of tenants by a per-process cache ([`Mpk`]).
//!
//! What this crate does not do: choose tenant ids (the provider does),
//! build state from a policy (the NF's `init`, called by the worker), run NF code, catch
//! faults (the worker's fault containment does; here a guard-page or protection-key hit
//! is a plain `SIGSEGV`). The state `S` is moved into its region by value, so very large
//! states pass through the stack once; the bytes of a region past the state are reachable
//! through [`StateGuard::split`] (C and eBPF NFs keep their state there). Whole pages of
//! a page region can be sealed ([`seal_pages`]: guard pages between parts of a tenant's
//! region, a chain's stages); the region knows them, and while any is sealed its bytes are
//! not handed out ([`RegionSealed`]), so safe code never holds a reference over a sealed
//! page. No NUMA
//! placement; huge pages only where the kernel's transparent huge pages allow them.
//!
//! Limits: Linux only (`MADV_DONTNEED` zero-fill semantics). Each live page region splits
//! the arena's mapping, costing about two kernel memory mappings (packed regions cost none
//! of their own: their chunk does), so the default `vm.max_map_count` (65530) allows
//! roughly 32 000 live page regions per process; past that,
//! allocation fails with `mprotect` / `ENOMEM` ([`AllocError::Protect`]) until the sysctl is
//! raised.
//!
//! All `unsafe` code is in the private `sys` module, each block with a `// SAFETY:`
//! comment; the rest of the crate is safe Rust (`#![deny(unsafe_code)]` outside `sys`).
//!
//! ```
//! use buffet_memory::{ArenaConfig, MemoryStorage, TenantTable};
//! use buffet_sdk::{TenantId, TenantSlot};
//!
//! #[derive(Default)]
//! struct Counter { packets: u64 }
//!
//! let storage = MemoryStorage::new(ArenaConfig { capacity: 64 << 20 })?;
//! let table = TenantTable::<Counter>::new(storage, 1024);
//! table.admit(TenantSlot(7), TenantId(42), 4096, Counter::default())?;
//!
//! // A worker, once per packet group:
//! if let Some(entry) = table.get(TenantSlot(7)).entry() {
//!     entry.lock().packets += 3;
//! }
//! let removed = table.remove(TenantSlot(7)).unwrap();
//! assert_eq!(removed.lock().packets, 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod domain;
mod mpk;
mod storage;
#[allow(unsafe_code)]
mod sys;
mod table;

pub use domain::{Domain, RegionExtent};
#[cfg(feature = "mpk-sim")]
pub use mpk::sim;
pub use mpk::{
    EnterError, Mpk, MpkError, MpkStats, PartKey, PartKeyError, PartOpen,
    DISABLE_ENV as MPK_DISABLE_ENV, MAX_CACHE_KEYS,
};
pub use storage::{
    AllocError, ArenaConfig, ArenaError, MemoryStorage, Region, StorageStats, PACKED_ALIGN,
    PACKED_MAX_BYTES,
};
pub use sys::{
    current_pkru, in_tenant_arena, pku_supported, seal_pages, tail_offset as region_tail_offset,
    RegionBytesMut, RegionSealed, SealError, SealedPages, SysError,
};
pub use table::{
    AdmitWithError, MemoryError, Replacement, StateGuard, TenantEntry, TenantRef, TenantTable,
};

#[cfg(test)]
mod tests;
