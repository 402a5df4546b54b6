//! The `#[repr(C)]` twins of nic-firmware/xdp/buffet_xdp.h and of the common core's
//! table rows: what the loader reads and writes in the XDP program's maps. Sizes are
//! checked at compile time against the C static asserts.

/// Tenant Table rows the program holds (`BF_XDP_MAX_TENANTS`).
pub const MAX_TENANTS: u32 = 16384;
/// Worker Table rows (`BF_XDP_MAX_WORKERS`).
pub const MAX_WORKERS: u16 = 256;
/// Receive queues the XSKMAP has room for (`BF_XDP_MAX_QUEUES`): queues 0 to
/// `MAX_QUEUES - 1`.
pub const MAX_QUEUES: u32 = 64;
/// XSKMAP keys per receive queue (`BF_XDP_XSK_STRIDE`): worker `w`'s socket on queue `q`
/// is at key `q * XSK_STRIDE + w`.
pub const XSK_STRIDE: u32 = MAX_WORKERS as u32;
/// Tuples (distinct masks) of the tuple-space search (`BF_XDP_MAX_TUPLES`).
pub const MAX_TUPLES: u32 = 64;
/// (tuple, masked key) entries per rule bank (`BF_XDP_MAX_RULE_ENTRIES`).
pub const MAX_RULE_ENTRIES: u32 = 65536;
/// Rule banks (`BF_XDP_BANKS`): the program classifies against the active one, the
/// loader writes the other.
pub(crate) const BANKS: u32 = 2;
/// Words of the classification key.
pub const KEY_WORDS: usize = buffet_dispatch::classifier::KEY_WORDS;

pub(crate) const F_TEST: u32 = 1;
pub(crate) const F_TAG_DSCP: u32 = 2;
pub(crate) const F_META: u32 = 4;

/// `struct bf_xdp_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Config {
    pub test_ts: u64,
    pub flags: u32,
    pub shift: u32,
    pub threshold: u32,
    pub n_workers: u32,
    pub reserved: u32,
    pub in_port: u16,
    pub pad: u16,
}

/// `struct bf_tenant_row` and `struct bf_worker_row`: the C core's own rows.
pub(crate) use buffet_nicfw::abi::{TenantRow, WorkerRow};

/// `struct bf_xdp_banks`: the active rule bank and each bank's tuples in use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Banks {
    pub active: u32,
    pub n_tuples: [u32; BANKS as usize],
    pub pad: u32,
}

/// `struct bf_xdp_state`: the Tenant Table, the Worker Table, the rule banks' header.
#[repr(C)]
pub(crate) struct State {
    pub tenants: [TenantRow; MAX_TENANTS as usize],
    pub workers: [WorkerRow; MAX_WORKERS as usize],
    pub banks: Banks,
}

/// `struct bf_xdp_tuple`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tuple {
    pub mask: [u64; KEY_WORDS],
}

/// `struct bf_xdp_rule_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RuleKey {
    pub tuple: u32,
    pub bank: u32,
    pub bits: [u64; KEY_WORDS],
}

/// `struct bf_xdp_rule_val`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RuleVal {
    pub priority: u32,
    pub tenant: u32,
    pub seq: u64,
}

/// `enum bf_xdp_verdict` (2, UNMATCHED, and 5, UNKNOWN, both read as unmatched).
pub(crate) mod verdict {
    pub const PASS: u32 = 0;
    pub const MALFORMED: u32 = 1;
    pub const POLICED: u32 = 3;
    pub const NO_WORKER: u32 = 4;
}

/// `struct bf_xdp_decision`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DecisionRecord {
    pub seq: u64,
    pub verdict: u32,
    pub tenant: u32,
    pub parse_error: u32,
    pub worker: u16,
    pub from: u16,
    pub migrated: u8,
    pub overload: u8,
    pub overload_worker: u16,
    pub pad: u32,
    pub overload_slot: u64,
}

/// `enum bf_xdp_event_kind`.
pub(crate) const EV_OVERLOAD: u32 = 1;
pub(crate) const EV_MIGRATION: u32 = 2;

/// `struct bf_xdp_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EventRecord {
    pub slot: u64,
    pub kind: u32,
    pub tenant: u32,
    pub worker: u16,
    pub from: u16,
    pub pad: u32,
}

/// `enum bf_xdp_stat`.
pub(crate) mod stat {
    pub const PACKETS: u32 = 0;
    pub const PASSED: u32 = 1;
    pub const MALFORMED: u32 = 2;
    pub const UNMATCHED: u32 = 3;
    pub const POLICED: u32 = 4;
    pub const NO_WORKER: u32 = 5;
    pub const EVENTS_LOST: u32 = 6;
    pub const NO_SOCKET: u32 = 7;
}

const _: () = {
    assert!(size_of::<TenantRow>() == 32);
    assert!(size_of::<WorkerRow>() == 40);
    assert!(size_of::<Config>() == 32);
    assert!(size_of::<Tuple>() == 56);
    assert!(size_of::<RuleKey>() == 64);
    assert!(size_of::<Banks>() == 16);
    assert!(size_of::<RuleVal>() == 16);
    assert!(size_of::<DecisionRecord>() == 40);
    assert!(size_of::<EventRecord>() == 24);
};
