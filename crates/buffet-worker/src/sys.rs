//! The only platform-specific code of the crate: the cycle counter, core pinning and a
//! cache prefetch hint.

/// Reads the CPU's time-stamp counter (0 on targets without one).
#[inline]
pub(crate) fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions on x86_64; it only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Pins the calling thread to core `index % cores`; false when the OS refused.
pub(crate) fn pin_to_core(index: usize) -> bool {
    match core_affinity::get_core_ids() {
        Some(ids) if !ids.is_empty() => core_affinity::set_for_current(ids[index % ids.len()]),
        _ => false,
    }
}

/// Asks the CPU to bring the first two cache lines of `bytes` (a frame's Ethernet, IP and
/// transport headers) towards L1. A hint: it never faults and changes no result.
#[inline(always)]
pub(crate) fn prefetch_headers(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = bytes.as_ptr().cast::<i8>();
        // SAFETY: PREFETCHT0 only hints the cache: it does not access memory
        // architecturally, cannot fault (not even for an address past the slice, which
        // `wrapping_add` may produce for a short frame), and has no visible effect.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
