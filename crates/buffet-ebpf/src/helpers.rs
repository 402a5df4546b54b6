//! The helpers programs call, and the per-run context they check their arguments against.
//!
//! rbpf helpers are plain `fn(u64, u64, u64, u64, u64) -> u64` without state, so the run
//! in progress is described in a thread-local [`RunCtx`]: the packet and tenant-region
//! address ranges and the program's map layout. Every pointer a helper returns and every
//! byte it touches lies inside the current packet or the current tenant's region;
//! anything else is an error value, never an access. A helper called outside a run
//! (impossible through `Program::run`) returns an error value too.
//!
//! Every helper also charges the run's cost meter ([`METER`], [`charge`]): a fixed
//! [`HELPER_CALL_COST`] per call plus the bytes it reads, hashes or compares. The engines
//! charge the same meter for the program's own instructions (at backward jumps and
//! bpf-to-bpf calls, rbpf's metered interpreter and JIT). Once it is negative, every
//! further helper call returns an error value at once without doing its work, the engine
//! stops the program at its next backward jump or call, and `Program::run` turns the run
//! into a fault.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use buffet_sdk::http::normalise_host;

use crate::abi::{self, MAX_COUNTERS};
use crate::sys::{self, Area};

/// Where one map's storage sits in the tenant region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapSlot {
    /// STRSET (else ARRAY or SCRATCH: elements the program addresses).
    pub strset: bool,
    /// Offset of its storage in the region.
    pub offset: u64,
    /// Array: element size. Strset: longest string.
    pub elem: u64,
    /// Array: elements. Strset: strings.
    pub entries: u64,
    /// Strset: the most hash slots it can need (a power of two). Array: 0.
    pub slots: u64,
    /// Bytes of storage.
    pub len: u64,
}

/// Strset storage, packed at the start of the map so that a small set spans a cache
/// line or two whatever its capacity:
///
/// ```text
/// 0: u32 slots (a power of two)   4: u32 strings
/// 8: u32 slot[slots]              (0: empty, else 1 + offset of a record in the map)
///    records: u16 index, u16 len, len bytes (lowercase), one after the other
/// ```
const STRSET_HEADER: u64 = 8;
/// Bytes of one record's header (index and length).
const STRSET_RECORD_HEADER: u64 = 4;

/// The most bytes a strset can need: header, `slots` slot words, `entries` records.
pub(crate) fn strset_bytes(slots: u64, entries: u64, key_size: u64) -> u64 {
    STRSET_HEADER
        .saturating_add(slots.saturating_mul(4))
        .saturating_add(entries.saturating_mul(STRSET_RECORD_HEADER + key_size))
}

fn word(table: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    let w = table.get(at..at.checked_add(4)?)?;
    Some(u64::from(u32::from_le_bytes(w.try_into().ok()?)))
}

/// The run in progress on this thread.
pub(crate) struct RunCtx {
    /// Identity of the program whose maps are in `maps`.
    pub program: u64,
    pub packet: Area,
    pub region: Area,
    pub maps: Vec<MapSlot>,
    pub active: bool,
}

/// Cost units of any helper call, before the bytes it touches.
pub const HELPER_CALL_COST: u64 = 16;

impl RunCtx {
    const IDLE: RunCtx = RunCtx {
        program: 0,
        packet: Area { start: 0, len: 0 },
        region: Area { start: 0, len: 0 },
        maps: Vec::new(),
        active: false,
    };

    /// Charges `units` to the run's meter; `false` when the budget is spent (the caller
    /// then does nothing).
    pub fn charge(&mut self, units: u64) -> bool {
        charge(units)
    }
}

thread_local! {
    /// The cost meter of the run in progress: word 0 is what is left of the budget
    /// (negative: spent), word 1 belongs to the JIT (its saved stack pointer). Set by
    /// `Program::run`; charged by the helpers and by the engines.
    pub(crate) static METER: Cell<[i64; 2]> = const { Cell::new([0; 2]) };
}

/// Charges `units` to [`METER`]; `false` when the budget is (now) spent.
pub(crate) fn charge(units: u64) -> bool {
    METER.with(|m| {
        let [left, jit] = m.get();
        if left < 0 {
            return false;
        }
        let left = left.saturating_sub(i64::try_from(units).unwrap_or(i64::MAX));
        m.set([left, jit]);
        left >= 0
    })
}

thread_local! {
    // `const`: no lazy-initialisation check on the helpers' path.
    pub(crate) static RUN: RefCell<RunCtx> = const { RefCell::new(RunCtx::IDLE) };
}

const ERR: u64 = (-1i64) as u64;
const ERR_RANGE: u64 = (-2i64) as u64;

/// Runs `f` on the run in progress after charging [`HELPER_CALL_COST`]; `default` outside
/// a run or once the budget is spent.
fn with_run<R>(default: R, f: impl FnOnce(&mut RunCtx) -> R) -> R {
    RUN.with(|r| match r.try_borrow_mut() {
        Ok(mut run) => {
            if run.active && run.charge(HELPER_CALL_COST) {
                f(&mut run)
            } else {
                default
            }
        }
        Err(_) => default,
    })
}

/// A name as the native NFs compare it: surrounding blanks and one trailing `.` removed
/// (ASCII case is ignored by the comparison itself). Strset entries are stored this way
/// and plain lookups normalise their key the same way.
pub(crate) fn normalise_name(name: &[u8]) -> &[u8] {
    let n = name.trim_ascii();
    n.strip_suffix(b".").unwrap_or(n)
}

/// `void *buffet_map_lookup(void *map, u32 index)`: the element's address, or 0.
pub(crate) fn map_lookup(map: u64, index: u64, _: u64, _: u64, _: u64) -> u64 {
    with_run(0, |run| {
        let Some(slot) = usize::try_from(map).ok().and_then(|m| run.maps.get(m)) else {
            return 0;
        };
        let index = index as u32 as u64;
        if slot.strset || index >= slot.entries {
            return 0;
        }
        let off = slot.offset + index * slot.elem;
        // Inside the region by construction of the layout; checked again anyway.
        if off + slot.elem > run.region.len {
            return 0;
        }
        run.region.start + off
    })
}

/// `long buffet_counter_add(u32 index, u64 delta)`.
pub(crate) fn counter_add(index: u64, delta: u64, _: u64, _: u64, _: u64) -> u64 {
    with_run(ERR, |run| {
        let index = index as u32 as u64;
        if index >= MAX_COUNTERS as u64 {
            return ERR;
        }
        let off = abi::COUNTERS_OFFSET as u64 + 8 * index;
        sys::with_bytes_mut(run.region, off, 8, |b| {
            let v = u64::from_le_bytes(b.try_into().expect("8 bytes")).wrapping_add(delta);
            b.copy_from_slice(&v.to_le_bytes());
            0
        })
        .unwrap_or(ERR)
    })
}

/// One's-complement sum folding, RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`.
pub fn csum_update(csum: u16, from: u32, to: u32, size: u32) -> u16 {
    let mut sum = u32::from(!csum);
    let words = |v: u32| -> [u16; 2] {
        if size == 4 {
            [(v >> 16) as u16, v as u16]
        } else {
            [0, v as u16]
        }
    };
    for (old, new) in words(from).into_iter().zip(words(to)) {
        sum += u32::from(!old) + u32::from(new);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// `long buffet_csum_replace(u32 csum_off, u64 from, u64 to, u32 size)`.
pub(crate) fn csum_replace(csum_off: u64, from: u64, to: u64, size: u64, _: u64) -> u64 {
    let size = size as u32;
    if size != 2 && size != 4 {
        return ERR;
    }
    with_run(ERR, |run| {
        sys::with_bytes_mut(run.packet, csum_off as u32 as u64, 2, |b| {
            let new = csum_update(
                u16::from_be_bytes([b[0], b[1]]),
                from as u32,
                to as u32,
                size,
            );
            b.copy_from_slice(&new.to_be_bytes());
            0
        })
        .unwrap_or(ERR)
    })
}

/// `long buffet_strset_lookup(void *map, u32 off, u32 len, u32 flags)`.
pub(crate) fn strset_lookup(map: u64, off: u64, len: u64, flags: u64, _: u64) -> u64 {
    with_run(ERR, |run| {
        let Some(slot) = usize::try_from(map)
            .ok()
            .and_then(|m| run.maps.get(m))
            .copied()
        else {
            return ERR;
        };
        if !slot.strset {
            return ERR;
        }
        let (off, len) = (off as u32 as u64, len as u32 as u64);
        let suffixes = flags & abi::STRSET_SUFFIXES != 0;
        // Reading the range (normalising it, finding its dots) costs its length; then
        // every probe hashes and compares at most `key_size` bytes.
        if !run.charge(len) {
            return ERR;
        }
        sys::with_bytes(run.packet, off, len, |key| {
            let key = if flags & abi::STRSET_HOST != 0 {
                let host = normalise_host(key);
                if host.is_empty() {
                    return abi::STRSET_EMPTY_HOST as u64;
                }
                if host.len() as u64 > slot.elem {
                    return abi::STRSET_HOST_TOO_LONG as u64;
                }
                host
            } else {
                normalise_name(key)
            };
            let probes = if suffixes {
                1 + memchr::memchr_iter(b'.', key).count() as u64
            } else {
                1
            };
            let per_probe = (key.len() as u64).min(slot.elem) + 4;
            if !charge(probes.saturating_mul(per_probe)) {
                return ERR;
            }
            sys::with_bytes(
                run.region,
                slot.offset,
                slot.len,
                |table| match strset_find(table, &slot, key, suffixes, &mut charge) {
                    Some(i) => i,
                    None => ERR,
                },
            )
            .unwrap_or(ERR)
        })
        .unwrap_or(ERR_RANGE)
    })
}

/// `long buffet_pkt_find(u32 off, u32 len, u32 byte)`: the offset of the first `byte` in
/// the frame's `[off, off + len)`, -1 if none, -2 when the range is outside the frame.
pub(crate) fn pkt_find(off: u64, len: u64, byte: u64, _: u64, _: u64) -> u64 {
    let (off, len) = (off as u32 as u64, len as u32 as u64);
    with_run(ERR, |run| {
        if !run.charge(len.min(run.packet.len)) {
            return ERR;
        }
        sys::with_bytes(run.packet, off, len, |b| {
            match u8::try_from(byte).ok().and_then(|c| memchr::memchr(c, b)) {
                Some(i) => off + i as u64,
                None => ERR,
            }
        })
        .unwrap_or(ERR_RANGE)
    })
}

/// Longest DNS name in presentation form, without the trailing dot (RFC 1035).
pub const MAX_DNS_NAME: usize = 253;

/// Reads the uncompressed DNS name (length-prefixed labels ending with a 0 byte) that
/// starts at `at` in `frame` into `out` in presentation form without the root dot
/// (`3www7example3com0` → `www.example.com`); its length, `Err(-2)` when the name runs
/// past the frame, `Err(-5)` for a compression pointer, a label over 63 bytes or a name
/// over [`MAX_DNS_NAME`] bytes.
pub(crate) fn dns_name(
    frame: &[u8],
    mut at: usize,
    out: &mut [u8; MAX_DNS_NAME + 1],
) -> Result<usize, i64> {
    let mut n = 0usize;
    loop {
        let len = usize::from(*frame.get(at).ok_or(abi::STRSET_OUT_OF_RANGE)?);
        at += 1;
        if len == 0 {
            return Ok(n);
        }
        if len > 63 {
            return Err(abi::DNS_BAD_NAME);
        }
        let label = frame.get(at..at + len).ok_or(abi::STRSET_OUT_OF_RANGE)?;
        let dot = usize::from(n != 0);
        if n + dot + len > MAX_DNS_NAME {
            return Err(abi::DNS_BAD_NAME);
        }
        if dot == 1 {
            out[n] = b'.';
        }
        out[n + dot..n + dot + len].copy_from_slice(label);
        n += dot + len;
        at += len;
    }
}

/// `long buffet_dns_lookup(void *map, u32 off, u32 flags)`: the uncompressed DNS name at
/// packet offset `off` looked up in a STRSET map (ASCII case ignored; with
/// `BUFFET_STRSET_SUFFIXES` also its parent domains, longest first). The index of the
/// first match, -1 none (also the root name), -2 the name runs past the frame, -5 not an
/// uncompressed name.
pub(crate) fn dns_lookup(map: u64, off: u64, flags: u64, _: u64, _: u64) -> u64 {
    with_run(ERR, |run| {
        let Some(slot) = usize::try_from(map)
            .ok()
            .and_then(|m| run.maps.get(m))
            .copied()
        else {
            return ERR;
        };
        if !slot.strset {
            return ERR;
        }
        let suffixes = flags & abi::STRSET_SUFFIXES != 0;
        let mut name = [0u8; MAX_DNS_NAME + 1];
        let parsed = sys::with_bytes(run.packet, 0, run.packet.len, |frame| {
            dns_name(frame, off as u32 as usize, &mut name)
        });
        let len = match parsed {
            Some(Ok(len)) => len,
            Some(Err(code)) => return code as u64,
            None => return ERR_RANGE,
        };
        let len64 = len as u64;
        let probes = if suffixes {
            1 + memchr::memchr_iter(b'.', &name[..len]).count() as u64
        } else {
            1
        };
        if !run.charge(len64.saturating_add(probes * (len64.min(slot.elem) + 4))) {
            return ERR;
        }
        if len == 0 {
            return ERR;
        }
        sys::with_bytes(run.region, slot.offset, slot.len, |table| {
            strset_find(table, &slot, &name[..len], suffixes, &mut charge).unwrap_or(ERR)
        })
        .unwrap_or(ERR)
    })
}

/// The strsets' hash: SipHash over the ASCII-lowercased bytes, keyed once per process
/// with random keys, so that no policy can choose strings that collide into one long
/// probe run (FNV, unkeyed, let a tenant's blocklist do exactly that).
pub(crate) fn strset_hash(key: &[u8]) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    let mut h = KEYS.get_or_init(RandomState::new).build_hasher();
    let mut lower = [0u8; 64];
    // Always the same chunks for the same bytes, so a key hashes the same every time.
    for chunk in key.chunks(lower.len()) {
        let l = &mut lower[..chunk.len()];
        l.copy_from_slice(chunk);
        l.make_ascii_lowercase();
        h.write(l);
    }
    h.finish()
}

/// Units a probe pays for each slot it visits past its first.
pub(crate) const STRSET_SLOT_COST: u64 = 4;

/// Looks `key` (and, with `suffixes`, every suffix after a `.`) up in a strset's storage
/// (layout at [`STRSET_HEADER`]); the matching string's index.
///
/// The storage is treated as untrusted: every offset is checked against the map and the
/// slot count against the map's capacity, and a probe visits each slot at most once.
/// `charge` pays for the walk as it goes: [`STRSET_SLOT_COST`] per slot past a probe's
/// first and the length of every stored string compared with the key; when it refuses,
/// the lookup stops and finds nothing.
pub(crate) fn strset_find(
    table: &[u8],
    slot: &MapSlot,
    key: &[u8],
    suffixes: bool,
    charge: &mut impl FnMut(u64) -> bool,
) -> Option<u64> {
    let mut k = key;
    loop {
        if let Some(i) = strset_find_one(table, slot, k, charge) {
            return Some(i);
        }
        if !suffixes {
            return None;
        }
        let dot = k.iter().position(|&b| b == b'.')?;
        k = &k[dot + 1..];
    }
}

fn strset_find_one(
    table: &[u8],
    slot: &MapSlot,
    key: &[u8],
    charge: &mut impl FnMut(u64) -> bool,
) -> Option<u64> {
    if key.is_empty() || key.len() as u64 > slot.elem {
        return None;
    }
    let slots = word(table, 0)?;
    if slots == 0 || !slots.is_power_of_two() || slots > slot.slots {
        return None;
    }
    let mask = slots - 1;
    let mut s = strset_hash(key) & mask;
    for visited in 0..slots {
        if visited > 0 && !charge(STRSET_SLOT_COST) {
            return None;
        }
        let v = word(table, STRSET_HEADER + s * 4)?;
        if v == 0 {
            return None;
        }
        let r = usize::try_from(v - 1).ok()?;
        let head = table.get(r..r.checked_add(STRSET_RECORD_HEADER as usize)?)?;
        let idx = u64::from(u16::from_le_bytes([head[0], head[1]]));
        let n = usize::from(u16::from_le_bytes([head[2], head[3]]));
        let start = r + STRSET_RECORD_HEADER as usize;
        if let Some(stored) = table.get(start..start.checked_add(n)?) {
            if n == key.len() && !charge(n as u64) {
                return None;
            }
            if stored.eq_ignore_ascii_case(key) {
                return Some(idx);
            }
        }
        s = (s + 1) & mask;
    }
    None
}

/// Writes `keys` (normalised with [`normalise_name`], lowercased, de-duplicated, indexed
/// in order) into a strset's storage; the number stored. The storage must be zeroed and
/// `keys` already validated (at most `entries`, each 1..=`key_size` bytes once
/// normalised).
pub(crate) fn strset_build(table: &mut [u8], slot: &MapSlot, keys: &[Vec<u8>]) -> u64 {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    let mut unique: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
    for k in keys {
        let k = normalise_name(k).to_ascii_lowercase();
        if seen.insert(k.clone()) {
            unique.push(k);
        }
    }
    let slots = (2 * unique.len() as u64)
        .next_power_of_two()
        .clamp(2, slot.slots.max(2));
    table[0..4].copy_from_slice(&(slots as u32).to_le_bytes());
    table[4..8].copy_from_slice(&(unique.len() as u32).to_le_bytes());
    let mut rec = STRSET_HEADER + slots * 4;
    let mask = slots - 1;
    for (i, key) in unique.iter().enumerate() {
        let r = rec as usize;
        table[r..r + 2].copy_from_slice(&(i as u16).to_le_bytes());
        table[r + 2..r + 4].copy_from_slice(&(key.len() as u16).to_le_bytes());
        table[r + 4..r + 4 + key.len()].copy_from_slice(key);
        let mut s = strset_hash(key) & mask;
        loop {
            let at = (STRSET_HEADER + s * 4) as usize;
            if table[at..at + 4] == [0; 4] {
                table[at..at + 4].copy_from_slice(&((rec + 1) as u32).to_le_bytes());
                break;
            }
            s = (s + 1) & mask;
        }
        rec += STRSET_RECORD_HEADER + key.len() as u64;
    }
    unique.len() as u64
}

/// The helpers, by id, as rbpf registers them.
pub(crate) const TABLE: [(u32, rbpf::Helper); 6] = [
    (abi::helper::MAP_LOOKUP as u32, map_lookup),
    (abi::helper::COUNTER_ADD as u32, counter_add),
    (abi::helper::CSUM_REPLACE as u32, csum_replace),
    (abi::helper::STRSET_LOOKUP as u32, strset_lookup),
    (abi::helper::PKT_FIND as u32, pkt_find),
    (abi::helper::DNS_LOOKUP as u32, dns_lookup),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn set(keys: &[&str], elem: u64, entries: u64) -> (Vec<u8>, MapSlot) {
        let slots = (entries * 2).next_power_of_two();
        let slot = MapSlot {
            strset: true,
            offset: 0,
            elem,
            entries,
            slots,
            len: strset_bytes(slots, entries, elem),
        };
        let mut table = vec![0u8; slot.len as usize];
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        strset_build(&mut table, &slot, &keys);
        (table, slot)
    }

    #[test]
    fn strset_matches_case_insensitively_and_by_suffix() {
        let (t, s) = set(&["example.com", "Ads.Tracker.NET", "example.com"], 64, 8);
        assert_eq!(
            strset_find(&t, &s, b"EXAMPLE.com", false, &mut |_| true),
            Some(0)
        );
        assert_eq!(
            strset_find(&t, &s, b"www.example.com", false, &mut |_| true),
            None
        );
        assert_eq!(
            strset_find(&t, &s, b"www.example.com", true, &mut |_| true),
            Some(0)
        );
        assert_eq!(
            strset_find(&t, &s, b"x.ads.tracker.net", true, &mut |_| true),
            Some(1)
        );
        assert_eq!(
            strset_find(&t, &s, b"tracker.net", true, &mut |_| true),
            None
        );
        assert_eq!(
            strset_find(&t, &s, b"badexample.com", true, &mut |_| true),
            None
        );
        assert_eq!(strset_find(&t, &s, b"", true, &mut |_| true), None);
        // Longer than the key size: never a match, but its suffixes may be.
        let long = format!("{}.example.com", "a".repeat(100));
        assert_eq!(
            strset_find(&t, &s, long.as_bytes(), true, &mut |_| true),
            Some(0)
        );
    }

    #[test]
    fn a_strset_walk_is_charged_slot_by_slot_and_stops_when_refused() {
        // The worst probe run: storage (untrusted, like any) in which every slot points at
        // a record of the key's length that is not the key. The walk visits every slot and
        // compares at every one, and pays for each.
        let (_, s) = set(&["aaaaaaaa"], 8, 64);
        let slots = s.slots;
        let mut t = vec![0u8; s.len as usize];
        t[0..4].copy_from_slice(&(slots as u32).to_le_bytes());
        t[4..8].copy_from_slice(&1u32.to_le_bytes());
        let r = (STRSET_HEADER + slots * 4) as usize;
        t[r..r + 4].copy_from_slice(&[0, 0, 8, 0]);
        t[r + 4..r + 12].copy_from_slice(b"aaaaaaaa");
        for i in 0..slots {
            let at = (STRSET_HEADER + i * 4) as usize;
            t[at..at + 4].copy_from_slice(&(r as u32 + 1).to_le_bytes());
        }
        let mut spent = 0;
        let found = strset_find(&t, &s, b"bbbbbbbb", false, &mut |u| {
            spent += u;
            true
        });
        assert_eq!(found, None);
        assert_eq!(spent, (slots - 1) * STRSET_SLOT_COST + slots * 8);
        // A meter with 100 units left: the walk stops once they are gone.
        let (mut left, mut calls) = (100i64, 0);
        let found = strset_find(&t, &s, b"bbbbbbbb", false, &mut |u| {
            calls += 1;
            left -= u as i64;
            left >= 0
        });
        assert_eq!(found, None);
        assert!(left < 0 && left > -(8 + STRSET_SLOT_COST as i64), "{left}");
        assert!(calls < 2 * 100 / 12 + 2, "{calls} charges");
        // And the key itself is found only when its compare can be paid for.
        let (t, s) = set(&["example.com"], 64, 8);
        assert_eq!(
            strset_find(&t, &s, b"example.com", false, &mut |_| false),
            None
        );
        assert_eq!(
            strset_find(&t, &s, b"example.com", false, &mut |_| true),
            Some(0)
        );
    }

    #[test]
    fn the_strset_hash_is_keyed_case_blind_and_stable() {
        let a = strset_hash(b"Example.COM");
        assert_eq!(a, strset_hash(b"example.com"));
        assert_eq!(a, strset_hash(b"EXAMPLE.com"));
        assert_ne!(a, strset_hash(b"example.net"));
        // Longer than a chunk: the same bytes hash the same, whatever their case.
        let long = "Ab".repeat(100);
        assert_eq!(
            strset_hash(long.as_bytes()),
            strset_hash(long.to_lowercase().as_bytes())
        );
        // Not FNV-1a: the unkeyed hash a policy could choose collisions for.
        let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in b"example.com" {
            fnv ^= u64::from(b);
            fnv = fnv.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_ne!(a, fnv);
    }

    #[test]
    fn strset_survives_garbage_storage() {
        let (_, s) = set(&["a"], 8, 4);
        for fill in [0u8, 1, 0x7f, 0xff] {
            let t = vec![fill; s.len as usize];
            let _ = strset_find(&t, &s, b"abc.def", true, &mut |_| true);
        }
        // Truncated storage.
        let _ = strset_find(&[1, 0, 0], &s, b"a", true, &mut |_| true);
    }

    #[test]
    fn csum_update_matches_a_full_recomputation() {
        // IPv4 header checksum before and after changing the TTL/protocol word.
        let mut hdr = [
            0x45u8, 0, 0, 0x54, 0x12, 0x34, 0x40, 0, 0x40, 0x11, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let full = |h: &[u8]| {
            let mut s: u32 = h
                .chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            while s >> 16 != 0 {
                s = (s & 0xffff) + (s >> 16);
            }
            !(s as u16)
        };
        let c = full(&hdr);
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
        let old = u32::from(u16::from_be_bytes([hdr[8], hdr[9]]));
        hdr[8] = 0x3f;
        let new = u32::from(u16::from_be_bytes([hdr[8], hdr[9]]));
        let updated = csum_update(c, old, new, 2);
        hdr[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(updated, full(&hdr));
        // A 4-byte field (an address).
        hdr[10..12].copy_from_slice(&updated.to_be_bytes());
        let old = u32::from_be_bytes([hdr[12], hdr[13], hdr[14], hdr[15]]);
        hdr[12..16].copy_from_slice(&[192, 168, 7, 9]);
        let u2 = csum_update(updated, old, u32::from_be_bytes([192, 168, 7, 9]), 4);
        hdr[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(u2, full(&hdr));
    }

    #[test]
    fn helpers_outside_a_run_touch_nothing() {
        assert_eq!(map_lookup(0, 0, 0, 0, 0), 0);
        assert_eq!(counter_add(0, 1, 0, 0, 0), ERR);
        assert_eq!(csum_replace(0, 0, 0, 2, 0), ERR);
        assert_eq!(strset_lookup(0, 0, 1, 0, 0), ERR);
        assert_eq!(pkt_find(0, 1, 0, 0, 0), ERR);
        assert_eq!(dns_lookup(0, 0, 0, 0, 0), ERR);
    }

    #[test]
    fn strset_entries_and_keys_are_normalised_like_the_native_nfs() {
        let (t, s) = set(&["Example.COM.", " ads.net "], 64, 8);
        assert_eq!(
            strset_find(&t, &s, normalise_name(b"example.com."), false, &mut |_| {
                true
            }),
            Some(0)
        );
        assert_eq!(
            strset_find(&t, &s, b"EXAMPLE.com", false, &mut |_| true),
            Some(0)
        );
        assert_eq!(
            strset_find(&t, &s, b"x.ADS.net", true, &mut |_| true),
            Some(1)
        );
    }

    #[test]
    fn dns_names_are_read_in_presentation_form() {
        let mut out = [0u8; MAX_DNS_NAME + 1];
        let q = b"\x03www\x07Example\x03com\x00rest";
        let n = dns_name(q, 0, &mut out).unwrap();
        assert_eq!(&out[..n], b"www.Example.com");
        assert_eq!(dns_name(b"\x00", 0, &mut out), Ok(0));
        assert_eq!(
            dns_name(b"\x03ww", 0, &mut out),
            Err(abi::STRSET_OUT_OF_RANGE)
        );
        assert_eq!(dns_name(b"\xc0\x0c", 0, &mut out), Err(abi::DNS_BAD_NAME));
        assert_eq!(dns_name(b"\x40", 0, &mut out), Err(abi::DNS_BAD_NAME));
        let mut long = Vec::new();
        for _ in 0..5 {
            long.push(63u8);
            long.extend_from_slice(&[b'a'; 63]);
        }
        long.push(0);
        assert_eq!(dns_name(&long, 0, &mut out), Err(abi::DNS_BAD_NAME));
        assert_eq!(dns_name(b"", 0, &mut out), Err(abi::STRSET_OUT_OF_RANGE));
    }

    #[test]
    fn hosts_are_normalised_like_the_native_dpi() {
        for (raw, want) in [
            ("example.com", "example.com"),
            ("  Example.COM:8080 ", "Example.COM"),
            ("user:pw@a.b.c.:1", "a.b.c"),
            ("[::1]:80", "[::1]"),
            ("[::1", "[::1"),
            ("x@", ""),
            ("\t", ""),
            ("a..", "a."),
        ] {
            assert_eq!(normalise_host(raw.as_bytes()), want.as_bytes(), "{raw:?}");
        }
    }
}
