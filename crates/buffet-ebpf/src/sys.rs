//! Every `unsafe` block of the crate: helpers touching the running program's memory, and
//! entering JIT-compiled code.
//!
//! While a program runs, the host holds no Rust reference to the packet or the tenant
//! region: rbpf got them as `&mut [u8]` and works on raw addresses it exposed. A helper
//! receives numbers; it may touch `[addr, addr + len)` only after checking that the
//! range lies inside one of the two areas recorded for the current run ([`Area`]), and
//! only for the duration of the helper call.

use std::io;

/// An address range a running program owns: `(start, len)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Area {
    pub start: u64,
    pub len: u64,
}

impl Area {
    pub fn of(bytes: &mut [u8]) -> Area {
        Area {
            start: bytes.as_mut_ptr() as u64,
            len: bytes.len() as u64,
        }
    }

    /// `[start + off, start + off + len)` if it lies inside this area.
    fn sub(&self, off: u64, len: u64) -> Option<u64> {
        let end = off.checked_add(len)?;
        (end <= self.len).then(|| self.start + off)
    }
}

/// Runs `f` on bytes `[off, off + len)` of `area`; `None` when they are outside it.
pub(crate) fn with_bytes<R>(
    area: Area,
    off: u64,
    len: u64,
    f: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    let addr = area.sub(off, len)?;
    if len == 0 {
        return Some(f(&[]));
    }
    // SAFETY: `area` is the packet or the tenant region handed to rbpf for the run in
    // progress (recorded by `Program::run` from a live `&mut [u8]` just before the run,
    // cleared right after); the range was checked to lie inside it. The program is
    // suspended in this helper call and the host holds no other reference to that
    // memory, so a shared slice for the duration of `f` aliases nothing that writes.
    // The address was exposed when rbpf received the slice.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            std::ptr::with_exposed_provenance::<u8>(addr as usize),
            len as usize,
        )
    };
    Some(f(bytes))
}

/// Runs `f` on bytes `[off, off + len)` of `area`, writable; `None` when they are outside it.
pub(crate) fn with_bytes_mut<R>(
    area: Area,
    off: u64,
    len: u64,
    f: impl FnOnce(&mut [u8]) -> R,
) -> Option<R> {
    let addr = area.sub(off, len)?;
    if len == 0 {
        return Some(f(&mut []));
    }
    // SAFETY: as in `with_bytes`; the area was handed to rbpf as `&mut [u8]`, so it is
    // writable, and no other reference to it is alive during the helper call.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            std::ptr::with_exposed_provenance_mut::<u8>(addr as usize),
            len as usize,
        )
    };
    Some(f(bytes))
}

/// Runs JIT-compiled code (compiled with the instruction meter) on a packet and a
/// tenant region, charging `meter` (word 0: what is left of the budget).
pub(crate) fn run_jit(
    vm: &rbpf::EbpfVmMbuff<'_>,
    packet: &mut [u8],
    region: &mut [u8],
    meter: &std::cell::Cell<[i64; 2]>,
) -> io::Result<u64> {
    // SAFETY: JIT code has no bounds checks of its own. It runs only programs that
    // PREVAIL accepted against the model in `verify.rs`, which matches this call:
    // r1 is `region`, whose first bytes are the context with `data`/`data_end` set to
    // `packet`'s bounds (written by `Program::run` just before); the packet is exactly
    // `packet`; map pointers come from `buffet_map_lookup`, which returns addresses
    // inside `region` only; the stack is the JIT's own reserve. Both slices are
    // exclusively borrowed for the duration of the call. The program was compiled by
    // `jit_compile_metered` (`Program::prepare`), as `execute_program_jit_metered`
    // requires; the meter is a `Cell` the JIT code and the helpers write through shared
    // access only, while the host holds no reference into it across the call.
    unsafe { vm.execute_program_jit_metered(packet, region, meter) }
}
