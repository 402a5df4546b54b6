//! The ABI between Buffet and an eBPF NF, mirrored in `include/buffet_ebpf.h`.
//!
//! A tenant's region (the `mbuff` rbpf hands the program in r1) is laid out as
//!
//! ```text
//! 0                CTX_SIZE            MAPS_OFFSET
//! | struct buffet_ctx | counters[16] (u64) | map 0 | map 1 | ...
//! ```
//!
//! The context is rewritten by the host before every packet; the counters are written by
//! the `buffet_counter_add` helper only; maps are reached through the lookup helpers.

use buffet_sdk::{DropCause, Verdict};

/// Bytes of `struct buffet_ctx`.
pub const CTX_SIZE: usize = 48;
/// Offset of `ctx->data` (the frame's first byte, a 64-bit address).
pub const CTX_DATA: usize = 0;
/// Offset of `ctx->data_end`.
pub const CTX_DATA_END: usize = 8;
/// Counters `buffet_counter_add` can address.
pub const MAX_COUNTERS: usize = 16;
/// Offset of the counters in the region.
pub const COUNTERS_OFFSET: usize = CTX_SIZE;
/// Offset of the first map in the region.
pub const MAPS_OFFSET: usize = COUNTERS_OFFSET + 8 * MAX_COUNTERS;

/// `BUFFET_MAP_ARRAY`: `max_entries` elements of `value_size` bytes, 4-byte keys.
pub const MAP_ARRAY: u32 = 2;
/// `BUFFET_MAP_STRSET`: up to `max_entries` byte strings of at most `key_size` bytes,
/// looked up ignoring ASCII case.
pub const MAP_STRSET: u32 = 40;
/// `BUFFET_MAP_SCRATCH`: one element of `value_size` bytes, zeroed before every packet:
/// per-invocation scratch memory the program reaches with `buffet_map_lookup(&map, 0)`.
/// A program's SCRATCH maps hold at most [`MAX_SCRATCH_BYTES`] in all.
pub const MAP_SCRATCH: u32 = 41;
/// Most bytes a program's `BUFFET_MAP_SCRATCH` maps hold together: they are zeroed before
/// every packet, so this bounds that work whatever the program declares.
pub const MAX_SCRATCH_BYTES: u32 = 16 * 1024;
/// Bytes of SCRATCH map zeroed per unit of the cost budget (a cache line per unit),
/// charged before every packet.
pub const SCRATCH_BYTES_PER_UNIT: u64 = 64;

/// Helper ids (the `imm` of a `call`).
pub mod helper {
    /// `void *buffet_map_lookup(void *map, u32 index)`.
    pub const MAP_LOOKUP: i32 = 1;
    /// `long buffet_counter_add(u32 index, u64 delta)`.
    pub const COUNTER_ADD: i32 = 2;
    /// `long buffet_csum_replace(u32 csum_off, u64 from, u64 to, u32 size)`.
    pub const CSUM_REPLACE: i32 = 3;
    /// `long buffet_strset_lookup(void *map, u32 off, u32 len, u32 flags)`.
    pub const STRSET_LOOKUP: i32 = 4;
    /// `long buffet_pkt_find(u32 off, u32 len, u32 byte)`.
    pub const PKT_FIND: i32 = 5;
    /// `long buffet_dns_lookup(void *map, u32 off, u32 flags)`.
    pub const DNS_LOOKUP: i32 = 6;
    /// Every helper id, in order.
    pub const ALL: [i32; 6] = [
        MAP_LOOKUP,
        COUNTER_ADD,
        CSUM_REPLACE,
        STRSET_LOOKUP,
        PKT_FIND,
        DNS_LOOKUP,
    ];
}

/// `BUFFET_STRSET_SUFFIXES`: also look up every suffix after a `.`.
pub const STRSET_SUFFIXES: u64 = 1;
/// `BUFFET_STRSET_HOST`: normalise the bytes as a URL/HTTP host first.
pub const STRSET_HOST: u64 = 2;
/// `buffet_strset_lookup`: the range is outside the frame.
pub const STRSET_OUT_OF_RANGE: i64 = -2;
/// `buffet_strset_lookup` with `BUFFET_STRSET_HOST`: the host is empty.
pub const STRSET_EMPTY_HOST: i64 = -3;
/// `buffet_strset_lookup` with `BUFFET_STRSET_HOST`: the host is longer than `key_size`.
pub const STRSET_HOST_TOO_LONG: i64 = -4;
/// `buffet_dns_lookup`: the bytes at the offset are not an uncompressed DNS name
/// (a compression pointer, a label longer than 63 bytes, a name longer than 253).
pub const DNS_BAD_NAME: i64 = -5;

/// Return values (`r0` at exit).
pub mod ret {
    /// `BUFFET_PASS`.
    pub const PASS: u64 = 0;
    /// `BUFFET_DROP` (policy).
    pub const DROP: u64 = 1;
    /// `BUFFET_TX`.
    pub const TX: u64 = 2;
    /// `BUFFET_DROP_MALFORMED`.
    pub const DROP_MALFORMED: u64 = 3;
    /// `BUFFET_DROP_RATE_LIMITED`.
    pub const DROP_RATE_LIMITED: u64 = 4;
    /// `BUFFET_DROP_TABLE_FULL`.
    pub const DROP_TABLE_FULL: u64 = 5;
    /// `BUFFET_DROP_INTEGRITY`.
    pub const DROP_INTEGRITY: u64 = 6;
    /// `BUFFET_DROP_REPLAY`.
    pub const DROP_REPLAY: u64 = 7;
    /// `BUFFET_FORWARD(0)`; `BUFFET_FORWARD(p)` is `FORWARD_BASE + p`.
    pub const FORWARD_BASE: u64 = 0x1_0000;
}

/// The verdict a program's return value stands for; `None` for a value outside the ABI
/// (the caller turns it into a fault).
pub fn verdict_of(r0: u64) -> Option<Verdict> {
    Some(match r0 {
        ret::PASS => Verdict::Pass,
        ret::DROP => Verdict::Drop(DropCause::Policy),
        ret::TX => Verdict::Tx,
        ret::DROP_MALFORMED => Verdict::Drop(DropCause::Malformed),
        ret::DROP_RATE_LIMITED => Verdict::Drop(DropCause::RateLimited),
        ret::DROP_TABLE_FULL => Verdict::Drop(DropCause::TableFull),
        ret::DROP_INTEGRITY => Verdict::Drop(DropCause::Integrity),
        ret::DROP_REPLAY => Verdict::Drop(DropCause::Replay),
        r if (ret::FORWARD_BASE..ret::FORWARD_BASE + 0x1_0000).contains(&r) => {
            Verdict::Forward((r - ret::FORWARD_BASE) as u16)
        }
        _ => return None,
    })
}

/// What the host writes into `struct buffet_ctx` before a packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtxFields {
    /// Address of the frame's first byte.
    pub data: u64,
    /// One past its last byte.
    pub data_end: u64,
    /// Arrival time.
    pub ts_ns: u64,
    /// Tenant id.
    pub tenant: u32,
    /// Input port.
    pub in_port: u16,
    /// 4 or 6.
    pub l3_kind: u8,
    /// 6 (TCP), 17 (UDP), 132 (SCTP) when that header was parsed, else 0.
    pub l4_kind: u8,
    /// IP header offset.
    pub l3_off: u16,
    /// L4 header offset.
    pub l4_off: u16,
    /// L4 payload offset.
    pub payload_off: u16,
    /// End of the IP datagram.
    pub ip_end: u16,
    /// IP protocol.
    pub ip_proto: u8,
}

impl CtxFields {
    /// Writes the 48 bytes of `struct buffet_ctx` into `region[..CTX_SIZE]`, each field
    /// with one store of its own width (what [`CtxFields::to_bytes`] returns).
    ///
    /// # Panics
    ///
    /// If `region` is shorter than [`CTX_SIZE`].
    #[inline(always)]
    pub fn write_to(&self, region: &mut [u8]) {
        let b: &mut [u8; CTX_SIZE] = (&mut region[..CTX_SIZE]).try_into().expect("48 bytes");
        b[0..8].copy_from_slice(&self.data.to_le_bytes());
        b[8..16].copy_from_slice(&self.data_end.to_le_bytes());
        b[16..24].copy_from_slice(&self.ts_ns.to_le_bytes());
        b[24..28].copy_from_slice(&self.tenant.to_le_bytes());
        b[28..30].copy_from_slice(&self.in_port.to_le_bytes());
        b[30] = self.l3_kind;
        b[31] = self.l4_kind;
        b[32..34].copy_from_slice(&self.l3_off.to_le_bytes());
        b[34..36].copy_from_slice(&self.l4_off.to_le_bytes());
        b[36..38].copy_from_slice(&self.payload_off.to_le_bytes());
        b[38..40].copy_from_slice(&self.ip_end.to_le_bytes());
        b[40..48].copy_from_slice(&u64::from(self.ip_proto).to_le_bytes());
    }

    /// The 48 bytes of `struct buffet_ctx`, little-endian.
    pub fn to_bytes(&self) -> [u8; CTX_SIZE] {
        let mut b = [0u8; CTX_SIZE];
        self.write_to(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_values_map_to_verdicts() {
        assert_eq!(verdict_of(0), Some(Verdict::Pass));
        assert_eq!(verdict_of(1), Some(Verdict::Drop(DropCause::Policy)));
        assert_eq!(verdict_of(2), Some(Verdict::Tx));
        assert_eq!(verdict_of(3), Some(Verdict::Drop(DropCause::Malformed)));
        assert_eq!(verdict_of(7), Some(Verdict::Drop(DropCause::Replay)));
        assert_eq!(verdict_of(0x1_0000 + 9), Some(Verdict::Forward(9)));
        assert_eq!(verdict_of(0x1_ffff), Some(Verdict::Forward(0xffff)));
        for bad in [8, 0xffff, 0x2_0000, u64::MAX] {
            assert_eq!(verdict_of(bad), None, "{bad:#x}");
        }
    }

    #[test]
    fn ctx_layout_matches_the_header() {
        let c = CtxFields {
            data: 0x1111,
            data_end: 0x2222,
            ts_ns: 3,
            tenant: 4,
            in_port: 5,
            l3_kind: 4,
            l4_kind: 6,
            l3_off: 14,
            l4_off: 34,
            payload_off: 54,
            ip_end: 60,
            ip_proto: 6,
        };
        let b = c.to_bytes();
        assert_eq!(&b[CTX_DATA..CTX_DATA + 8], &0x1111u64.to_le_bytes());
        assert_eq!(&b[CTX_DATA_END..CTX_DATA_END + 8], &0x2222u64.to_le_bytes());
        assert_eq!((b[30], b[31], b[40]), (4, 6, 6));
        assert_eq!(u16::from_le_bytes([b[36], b[37]]), 54);
        assert_eq!(MAPS_OFFSET % 8, 0);
    }

    #[test]
    fn write_to_overwrites_every_context_byte_and_nothing_else() {
        let c = CtxFields {
            data: 0x1111,
            data_end: 0x2222,
            ts_ns: 3,
            tenant: 4,
            in_port: 5,
            l3_kind: 4,
            l4_kind: 17,
            l3_off: 14,
            l4_off: 34,
            payload_off: 42,
            ip_end: 60,
            ip_proto: 17,
        };
        // A region whose context still holds another packet's bytes (and its counters).
        let mut region = [0xa5u8; CTX_SIZE + 8];
        c.write_to(&mut region);
        assert_eq!(region[..CTX_SIZE], c.to_bytes());
        assert_eq!(region[CTX_SIZE..], [0xa5; 8]);
        assert_eq!(
            &region[41..48],
            &[0; 7],
            "the padding after ip_proto is zeroed"
        );
    }
}
