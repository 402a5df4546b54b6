//! The rows of nic-firmware/common's tables as the C core lays them out
//! (`buffet_core.h`), for every Rust side that shares memory with it: this crate's FFI
//! and the XDP program's maps (`buffet-xdp`). Field for field the C structs; `pad` is
//! the explicit padding the C layout has.
#![allow(missing_docs)]

/// `struct bf_tenant_row`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantRow {
    pub cur_slot: u64,
    pub pkt_nb: u64,
    pub max_nb: u64,
    pub worker: u16,
    pub has_slot: u8,
    pub present: u8,
    pub pad: u32,
}

/// `struct bf_worker_row`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerRow {
    pub cur_slot: u64,
    pub pkt_nb: u64,
    pub last_nb: u64,
    pub max_nb: u64,
    pub times: u32,
    pub has_slot: u8,
    pub live: u8,
    pub pad: u16,
}
