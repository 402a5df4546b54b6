//! The FFI to nic-firmware/common (compiled by build.rs): the C structs mirrored with
//! `#[repr(C)]` and one safe function per C entry point. All of this crate's `unsafe`
//! is here.
#![allow(unsafe_code)]

use std::os::raw::c_int;

pub(crate) use crate::abi::{TenantRow, WorkerRow};

/// `struct bf_sched`.
#[repr(C)]
struct Sched {
    tenants: *mut TenantRow,
    n_tenants: u32,
    shift: u32,
    workers: *mut WorkerRow,
    n_workers: u32,
    threshold: u32,
}

/// `struct bf_outcome`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outcome {
    pub overload_slot: u64,
    pub kind: u8,
    pub migrated: u8,
    pub overload: u8,
    pub pad: u8,
    pub worker: u16,
    pub from: u16,
    pub overload_worker: u16,
    pub pad2: [u16; 3],
}

pub(crate) const PASS: u8 = 0;
pub(crate) const POLICED: u8 = 1;
pub(crate) const NO_LIVE_WORKER: u8 = 2;

/// `struct bf_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Key {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub in_port: u16,
    pub vlan: u16,
    pub l3_offset: u16,
    pub l4_offset: u16,
    pub src_port: u16,
    pub dst_port: u16,
    pub has_vlan: u8,
    pub is_v6: u8,
    pub has_ports: u8,
    pub proto: u8,
    pub dscp: u8,
    pub pad: [u8; 3],
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
}

extern "C" {
    fn bf_timeslot(ts_ns: u64, shift: u32) -> u64;
    fn bf_schedule(s: *mut Sched, ts_ns: u64, tenant: u32, out: *mut Outcome);
    fn bf_checksum_update(hc: u16, old_word: u16, new_word: u16) -> u16;
    fn bf_tag_dscp(bytes: *mut u8, len: u32, l3_offset: u32, is_v4: bool, dscp: u8) -> c_int;
    fn bf_extract_key(data: *const u8, len: u32, in_port: u16, key: *mut Key) -> c_int;
}

pub(crate) fn timeslot(ts_ns: u64, shift: u32) -> u64 {
    // SAFETY: a pure function of two integers.
    unsafe { bf_timeslot(ts_ns, shift) }
}

pub(crate) fn checksum_update(hc: u16, old: u16, new: u16) -> u16 {
    // SAFETY: a pure function of three integers.
    unsafe { bf_checksum_update(hc, old, new) }
}

/// One `bf_schedule` step over the two tables. Slices longer than `u32::MAX` rows are
/// seen up to `u32::MAX` (the callers never grow them that far).
pub(crate) fn schedule(
    tenants: &mut [TenantRow],
    workers: &mut [WorkerRow],
    shift: u32,
    threshold: u32,
    ts_ns: u64,
    tenant: u32,
) -> Outcome {
    let mut s = Sched {
        tenants: tenants.as_mut_ptr(),
        n_tenants: u32::try_from(tenants.len()).unwrap_or(u32::MAX),
        shift,
        workers: workers.as_mut_ptr(),
        n_workers: u32::try_from(workers.len()).unwrap_or(u32::MAX),
        threshold,
    };
    let mut out = Outcome::default();
    // SAFETY: `s` points at the two exclusively borrowed slices with their lengths (never
    // more), which outlive the call; the C code indexes only below those lengths and keeps
    // no pointer after returning; `out` is a valid, writable `Outcome`.
    unsafe { bf_schedule(&mut s, ts_ns, tenant, &mut out) };
    out
}

/// `bf_tag_dscp` on `bytes` (an error code, 0 for success).
pub(crate) fn tag_dscp(bytes: &mut [u8], l3_offset: u32, is_v4: bool, dscp: u8) -> c_int {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    // SAFETY: the C code reads and writes only within `len` bytes (it checks
    // `l3_offset + header length <= len` in 64-bit arithmetic first), and `len` is at
    // most the exclusively borrowed slice's length.
    unsafe { bf_tag_dscp(bytes.as_mut_ptr(), len, l3_offset, is_v4, dscp) }
}

/// `bf_extract_key` on `data` (an error code, 0 for success, and the key).
pub(crate) fn extract_key(data: &[u8], in_port: u16) -> (c_int, Key) {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut key = Key::default();
    // SAFETY: the C code reads only below `len` (every offset is checked against it
    // before use), `len` is at most the slice's length, and `key` is a valid, writable
    // `Key` it fills; no pointer is kept.
    let rc = unsafe { bf_extract_key(data.as_ptr(), len, in_port, &mut key) };
    (rc, key)
}
