//! Everything `unsafe` in buffet-xdp: the `aya::Pod` promises for the map layouts, and
//! the shared mapping of the state map (the Tenant Table and Worker Table the program
//! updates while the host reads and writes rows).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use crate::layout::{
    Config, DecisionRecord, RuleKey, RuleVal, State, TenantRow, Tuple, WorkerRow, MAX_TENANTS,
    MAX_WORKERS,
};

// SAFETY: `Config` is `#[repr(C)]`, made of integers only, with explicit padding fields
// (its size is checked against the C struct), so every bit pattern is a valid value.
unsafe impl aya::Pod for Config {}
// SAFETY: as for `Config`: `#[repr(C)]`, integers and an integer array, no implicit padding.
unsafe impl aya::Pod for Tuple {}
// SAFETY: as for `Config`: `#[repr(C)]`, integers, explicit `pad`, no implicit padding.
unsafe impl aya::Pod for RuleKey {}
// SAFETY: as for `Config`: `#[repr(C)]`, integers only, no implicit padding.
unsafe impl aya::Pod for RuleVal {}
// SAFETY: as for `Config`: `#[repr(C)]`, integers, explicit `pad`, no implicit padding.
unsafe impl aya::Pod for DecisionRecord {}

/// The state map's single value, mapped shared into this process. The kernel updates it
/// while packets run, so rows are only ever copied in and out (volatile accesses), never
/// borrowed.
pub(crate) struct StateMapping {
    base: NonNull<State>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; moving the owner to
// another thread moves no thread-bound resource.
unsafe impl Send for StateMapping {}

impl StateMapping {
    /// Maps the (BPF_F_MMAPABLE, one-entry) array map `fd` whose value is a `State`.
    pub(crate) fn new(fd: BorrowedFd<'_>) -> io::Result<StateMapping> {
        let len = size_of::<State>();
        // SAFETY: a fresh shared mapping of `len` bytes of the map's value area, at an
        // address the kernel chooses; no existing memory is touched. The result is
        // checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p.cast::<State>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(StateMapping { base, len })
    }

    pub(crate) fn tenant(&self, i: u32) -> TenantRow {
        assert!(i < MAX_TENANTS);
        // SAFETY: `i` is in bounds of the mapped `State`'s tenant array, the mapping is
        // live for `self`'s lifetime and page-aligned, and every bit pattern is a valid
        // `TenantRow` (integers only).
        unsafe { std::ptr::addr_of!((*self.base.as_ptr()).tenants[i as usize]).read_volatile() }
    }

    pub(crate) fn set_tenant(&mut self, i: u32, row: TenantRow) {
        assert!(i < MAX_TENANTS);
        // SAFETY: in bounds (checked above), live, writable shared mapping; a plain copy.
        unsafe {
            std::ptr::addr_of_mut!((*self.base.as_ptr()).tenants[i as usize]).write_volatile(row)
        }
    }

    pub(crate) fn worker(&self, i: u16) -> WorkerRow {
        assert!(i < MAX_WORKERS);
        // SAFETY: as in `tenant`, for the worker array.
        unsafe { std::ptr::addr_of!((*self.base.as_ptr()).workers[i as usize]).read_volatile() }
    }

    pub(crate) fn set_worker(&mut self, i: u16, row: WorkerRow) {
        assert!(i < MAX_WORKERS);
        // SAFETY: as in `set_tenant`, for the worker array.
        unsafe {
            std::ptr::addr_of_mut!((*self.base.as_ptr()).workers[i as usize]).write_volatile(row)
        }
    }
}

impl Drop for StateMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region `new` mapped; no row reference outlives it
        // (rows are only copied).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
