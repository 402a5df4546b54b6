//! The only platform-specific code of the crate: the cycle counter and core pinning.

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
