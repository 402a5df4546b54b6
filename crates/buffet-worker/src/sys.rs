//! The only platform-specific code of the crate: the cycle counter, core pinning, cache
//! prefetch hints, a worker thread's CPU time (for the supervision of stuck workers) and
//! the zeroed allocation of its counter rows.

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

/// Asks the CPU to bring every cache line of the `len` bytes at `p` towards L1 (at most
/// [`PREFETCH_MAX_LINES`] lines): a Tenant Table entry, a counter row, a state's first
/// bytes. A hint: `p` is never dereferenced, it may dangle or point into memory the thread
/// may not access (another tenant's region under MPK), and nothing observable changes.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let first = p as usize & !63;
        let last = (p as usize).wrapping_add(len.max(1) - 1) & !63;
        let lines = (last.wrapping_sub(first) >> 6).min(PREFETCH_MAX_LINES - 1);
        let base = p.cast::<i8>().wrapping_sub(p as usize - first);
        for l in 0..=lines {
            // SAFETY: PREFETCHT0 is a hint: it performs no architectural access, cannot
            // fault for any address (unmapped, guard page, protection key closed), and has
            // no visible effect; `wrapping_sub`/`wrapping_add` only form the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(l << 6)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// The most cache lines one [`prefetch`] call asks for.
pub(crate) const PREFETCH_MAX_LINES: usize = 4;

/// CPU time the thread behind `handle` has used so far; `None` when the system does not
/// tell (the thread has ended, or no per-thread CPU clock).
pub(crate) fn thread_cpu_time(handle: &std::thread::JoinHandle<()>) -> Option<std::time::Duration> {
    use std::os::unix::thread::JoinHandleExt;
    let thread = handle.as_pthread_t();
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `thread` names a thread that has not been joined or detached (we hold its
    // handle), as pthread_getcpuclockid requires; `clock` is a valid out-pointer.
    if unsafe { libc::pthread_getcpuclockid(thread, &mut clock) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; an unknown clock is an error return.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(std::time::Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

/// The calling thread's kernel id (`gettid`); `None` where there is none.
pub(crate) fn current_tid() -> Option<i32> {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    (tid > 0).then_some(tid)
}

/// A thread's scheduling state, as /proc shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ThreadState(pub u8);

impl ThreadState {
    /// Waiting in the kernel: interruptible (`S`) or uninterruptible (`D`) sleep, or
    /// stopped (`T`, `t`) — not running and not waiting for a CPU (`R`).
    pub(crate) fn is_blocked(self) -> bool {
        matches!(self.0, b'S' | b'D' | b'T' | b't')
    }
}

/// The state of thread `tid` of this process (`/proc/self/task/<tid>/stat`'s third
/// field); `None` when the thread is gone or /proc does not tell. Reads a file: for
/// supervision off the hot path only.
pub(crate) fn thread_state(tid: i32) -> Option<ThreadState> {
    let stat = std::fs::read(format!("/proc/self/task/{tid}/stat")).ok()?;
    // `pid (comm) S ...`: comm may hold spaces and parentheses, the state follows the
    // last `)`.
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied().map(ThreadState)
}

/// An `eventfd(2)` counter: one thread [`notify`](EventFd::notify)s, another waits for it
/// to become readable (`poll(2)`, with the sockets it waits on) and
/// [`drain`](EventFd::drain)s it. Non-blocking, closed on exec.
#[derive(Debug)]
pub(crate) struct EventFd(std::os::fd::OwnedFd);

impl EventFd {
    pub(crate) fn new() -> std::io::Result<EventFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor eventfd just opened and nothing else owns.
        Ok(EventFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    /// Makes the counter readable. Cannot block (the counter would have to reach
    /// 2^64 - 1 first); an error leaves the waiter to its timeout.
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives across the call, to an open
        // eventfd this value owns.
        let _ = unsafe { libc::write(self.raw(), (&raw const one).cast(), 8) };
    }

    /// Resets the counter (readable no more until the next notify).
    pub(crate) fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads at most 8 bytes into `n`, which lives across the call, from an
        // open non-blocking eventfd this value owns (EAGAIN when it was not readable).
        let _ = unsafe { libc::read(self.raw(), (&raw mut n).cast(), 8) };
    }
}

/// A worker's tenant counter rows, one per Tenant Table slot, in an anonymous mapping of
/// their own, on small pages. The kernel commits a page of it only when a row on it is
/// first written, so rows for slots no tenant of this worker uses cost no memory: written
/// row by row at start, 16,384 slots of 128 bytes (2 MiB per worker) made `buffet demo
/// --workers 128` take 0.9 GB and seconds to start. (`calloc` does not promise this: glibc
/// clears a block it takes from memory it already holds. And with transparent huge pages
/// always on, a 2 MiB mapping would be committed whole at its first write.)
pub(crate) struct Rows {
    ptr: std::ptr::NonNull<crate::stats::TenantCounters>,
    len: usize,
}

// SAFETY: `Rows` owns its mapping as a `Box<[TenantCounters]>` owns its allocation, and
// `TenantCounters` (atomics only) is `Send` and `Sync` (checked below).
unsafe impl Send for Rows {}
// SAFETY: as above: shared access is only through `&[TenantCounters]`.
unsafe impl Sync for Rows {}

const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<crate::stats::TenantCounters>();
};

impl Rows {
    /// `n` rows, every counter zero.
    pub(crate) fn zeroed(n: usize) -> Rows {
        let layout = std::alloc::Layout::array::<crate::stats::TenantCounters>(n)
            .expect("tenant counter rows fit in the address space");
        if layout.size() == 0 {
            return Rows {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
            };
        }
        // SAFETY: a fresh private anonymous mapping: no address hint, no descriptor; the
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: advice on the mapping just made, of its size; it changes no contents.
        // Refused (a kernel without THP), the pages are small anyway.
        let _ = unsafe { libc::madvise(p, layout.size(), libc::MADV_NOHUGEPAGE) };
        Rows {
            // A mapping is page-aligned (more than the rows' 64) and never null.
            ptr: std::ptr::NonNull::new(p.cast()).expect("mmap returned a mapping"),
            len: n,
        }
    }
}

impl std::ops::Deref for Rows {
    type Target = [crate::stats::TenantCounters];

    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        // SAFETY: `ptr` is aligned and points to `len` rows the mapping holds (or is
        // dangling with `len` 0), zero-filled by the kernel: every field of
        // `TenantCounters` is an atomic counter or an array of them, for which all-zero
        // bytes are a valid value (zero), and its padding needs no value. The rows are
        // only ever reached through this shared slice (atomics for every write), and the
        // mapping lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Rows {
    fn drop(&mut self) {
        let size = std::mem::size_of::<crate::stats::TenantCounters>() * self.len;
        if size != 0 {
            // SAFETY: the mapping `zeroed` made, of this size, unmapped once: no slice of
            // it outlives `self` (`deref` borrows `self`).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), size) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn zeroed_rows_are_zero_counters_each_on_its_own_lines() {
        let rows = Rows::zeroed(1000);
        assert_eq!(rows.len(), 1000);
        let mut report = crate::stats::TenantReport::default();
        for r in rows.iter() {
            assert_eq!(r as *const _ as usize % 64, 0, "cache-line aligned");
            r.add_into(&mut report);
        }
        assert_eq!(report, crate::stats::TenantReport::default());
        rows[999].packets.store(7, Relaxed);
        rows[999].nf_drops[0].store(3, Relaxed);
        let mut one = crate::stats::TenantReport::default();
        rows[999].add_into(&mut one);
        assert_eq!((one.packets, one.dropped()), (7, 3));
        assert!(Rows::zeroed(0).is_empty());
    }

    /// Resident kB of the mapping holding `addr` (`/proc/self/smaps`).
    fn resident_kb(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("Rss:") {
                    return kb.trim().trim_end_matches(" kB").trim().parse().unwrap();
                }
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    fn rows_no_tenant_wrote_cost_no_memory() {
        // 16,384 slots' rows, as a worker of the default Tenant Table has.
        let rows = Rows::zeroed(16_384);
        assert_eq!(std::mem::size_of_val(&*rows), 2 << 20, "128 bytes a row");
        let addr = rows.as_ptr() as usize;
        let mut sum = crate::stats::TenantReport::default();
        rows[100].add_into(&mut sum);
        let kb = resident_kb(addr);
        assert!(kb <= 8, "{kb} kB resident before a write");
        // Small pages whatever the transparent huge page setting.
        rows[100].packets.store(1, Relaxed);
        rows[16_000].packets.store(1, Relaxed);
        let kb = resident_kb(addr);
        assert!(kb <= 16, "two rows written: {kb} kB resident of 2 MiB");
    }
}
