//! Everything `unsafe` in buffet-xdp: the `aya::Pod` promises for the map layouts, and
//! the shared mapping of the state map (the Tenant Table and Worker Table the program
//! updates while the host reads and writes rows).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use crate::layout::{
    Config, DecisionRecord, RuleKey, RuleVal, State, TenantRow, Tuple, WorkerRow, BANKS,
    MAX_TENANTS, MAX_WORKERS,
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
// SAFETY: `#[repr(C)]`: a byte array, a u16 and two u8 (20 bytes, no padding), the twin of
// `struct bf_off_key`; every bit pattern is a valid value.
unsafe impl aya::Pod for crate::offload::OffKey {}
// SAFETY: `#[repr(C)]`: two u32, no padding, the twin of `struct bf_off_tenant`.
unsafe impl aya::Pod for crate::offload::OffTenant {}

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

impl StateMapping {
    /// Writes only tenant row `i`'s worker field: the program's own updates of the row's
    /// counters (`cur_slot`, `pkt_nb`) are not overwritten by a stale copy.
    pub(crate) fn set_tenant_worker(&mut self, i: u32, worker: u16) {
        assert!(i < MAX_TENANTS);
        // SAFETY: in bounds (checked above), live, writable shared mapping; a plain
        // aligned 16-bit store into the row's `worker` field.
        unsafe {
            std::ptr::addr_of_mut!((*self.base.as_ptr()).tenants[i as usize].worker)
                .write_volatile(worker)
        }
    }

    /// Writes only tenant row `i`'s MAX_NB.
    pub(crate) fn set_tenant_max_nb(&mut self, i: u32, max_nb: u64) {
        assert!(i < MAX_TENANTS);
        // SAFETY: as in `set_tenant_worker`, for the aligned 64-bit `max_nb` field.
        unsafe {
            std::ptr::addr_of_mut!((*self.base.as_ptr()).tenants[i as usize].max_nb)
                .write_volatile(max_nb)
        }
    }

    /// Flips the program to rule bank `bank` (0 or 1): one aligned 32-bit store into the
    /// active word, then a full fence, so that every later load of this thread (the
    /// reader counts the loader then waits on) is ordered after it.
    pub(crate) fn set_active_bank(&mut self, bank: u32) {
        assert!(bank < BANKS);
        // SAFETY: as in `set_tenant_worker`, for the banks header's aligned 32-bit
        // `active` word (a single store the program reads whole).
        unsafe { std::ptr::addr_of_mut!((*self.base.as_ptr()).banks.active).write_volatile(bank) }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes the number of tuples in use of rule bank `bank` (inactive when written).
    pub(crate) fn set_bank_tuples(&mut self, bank: u32, n: u32) {
        assert!(bank < BANKS);
        // SAFETY: as in `set_tenant_worker`, for the aligned 32-bit `n_tuples[bank]`
        // (`bank` checked above).
        unsafe {
            std::ptr::addr_of_mut!((*self.base.as_ptr()).banks.n_tuples[bank as usize])
                .write_volatile(n)
        }
    }

    /// Writes only worker row `i`'s `live` flag.
    pub(crate) fn set_worker_live(&mut self, i: u16, live: bool) {
        assert!(i < MAX_WORKERS);
        // SAFETY: as in `set_tenant_worker`, for the worker array's one-byte `live` field.
        unsafe {
            std::ptr::addr_of_mut!((*self.base.as_ptr()).workers[i as usize].live)
                .write_volatile(u8::from(live))
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

/// `struct bpf_attr`'s `test` member (BPF_PROG_TEST_RUN), as far as it is used here.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

/// BPF_PROG_TEST_RUN of program `prog` on `data` (one run), the output frame into `out`:
/// (the program's return value, bytes written to `out`). aya runs a program only through
/// its owner; this runs a second descriptor of it from another thread.
pub(crate) fn prog_test_run(
    prog: BorrowedFd<'_>,
    data: &[u8],
    out: &mut [u8],
) -> io::Result<(u32, usize)> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: u32::try_from(data.len()).map_err(io::Error::other)?,
        data_size_out: u32::try_from(out.len()).map_err(io::Error::other)?,
        data_in: data.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is a valid, fully initialised prefix of `union bpf_attr`'s `test`
    // member (the kernel zero-extends a shorter attr); the buffers it points to, `data`
    // (read) and `out` (written, at most `data_size_out` bytes), outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            std::ptr::addr_of_mut!(attr),
            size_of::<TestRunAttr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((attr.retval, (attr.data_size_out as usize).min(out.len())))
}
