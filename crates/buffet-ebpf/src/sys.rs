//! Every `unsafe` block of the crate: helpers touching the running program's memory,
//! entering JIT-compiled code, and the verifier's child process (fork, address-space
//! limit, deadline, reaping).
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

/// How a child started by [`run_in_child`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChildEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it (not ours).
    Signaled(i32),
    /// It was still running at the deadline and was killed (SIGKILL).
    TimedOut,
    /// Its resident memory grew past the budget and it was killed (SIGKILL).
    OverMemory,
}

/// How often the parent checks the child's resident memory.
const MEMORY_CHECK: std::time::Duration = std::time::Duration::from_millis(2);

/// Runs `work` in a forked child process and waits at most `time_budget` for it: past
/// the deadline it is killed. Its memory is bounded twice: the parent checks the child's
/// resident set every few milliseconds and kills it once that grew by more than
/// `memory_budget` bytes since the fork (the child touches free heap the parent had
/// reserved, which no address-space limit sees), and the child's address space may grow
/// by at most `memory_budget` bytes (`RLIMIT_AS`: a large reservation fails at once, and
/// Rust aborts on the failed allocation). Returns how it ended and the
/// bytes `work` returned (written back through a pipe). The child is always reaped
/// before this returns, so nothing is left behind.
///
/// The child starts as a copy of the calling thread only: `work` must not wait for a
/// lock another thread could have held at the fork (the allocator is safe: glibc
/// resets its locks in the child). A child that deadlocks anyway runs into the time
/// budget and is killed. It leaves with `_exit`: no destructors, no atexit handlers,
/// no flushing of buffers it shares with the parent.
pub(crate) fn run_in_child(
    memory_budget: u64,
    time_budget: std::time::Duration,
    work: impl FnOnce() -> Vec<u8>,
) -> io::Result<(ChildEnd, Vec<u8>)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    let deadline = std::time::Instant::now() + time_budget;
    // SAFETY: fork has no memory-safety preconditions; the child below only runs
    // `work` on data it owns and leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        close(rd);
        close(wr);
        return Err(e);
    }
    if pid == 0 {
        close(rd);
        limit_address_space(memory_budget);
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let code = match out {
            Ok(bytes) => {
                if write_all(wr, &bytes) {
                    0
                } else {
                    2
                }
            }
            Err(_) => 3,
        };
        // SAFETY: `_exit` ends the child at once; nothing of the parent's is flushed.
        unsafe { libc::_exit(code) }
    }
    close(wr);
    let statm = format!("/proc/{pid}/statm");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let resident = || -> Option<u64> {
        let s = std::fs::read_to_string(&statm).ok()?;
        let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * page)
    };
    let base = resident().unwrap_or(0);
    let mut out = Vec::new();
    let mut killed = None;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            killed = Some(ChildEnd::TimedOut);
            break;
        }
        if resident().is_some_and(|r| r.saturating_sub(base) > memory_budget) {
            killed = Some(ChildEnd::OverMemory);
            break;
        }
        let left = left.min(MEMORY_CHECK);
        let mut pfd = libc::pollfd {
            fd: rd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if r == 0 {
            continue;
        }
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let n = unsafe { libc::read(rd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    close(rd);
    if killed.is_some() {
        // SAFETY: `pid` is our own child, not yet reaped (so the id is not reused).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid int; `pid` is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::last_os_error());
        }
    }
    let end = if let Some(k) = killed {
        k
    } else if libc::WIFEXITED(status) {
        ChildEnd::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        ChildEnd::Signaled(libc::WTERMSIG(status))
    } else {
        ChildEnd::Exited(-1)
    };
    Ok((end, out))
}

fn close(fd: i32) {
    // SAFETY: `fd` is a descriptor this module opened and closes once.
    unsafe { libc::close(fd) };
}

fn write_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for `bytes.len()` bytes of reads.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// In the child: caps the address space at its current size plus `budget` bytes.
/// Reads `/proc/self/statm` with plain system calls into a stack buffer.
fn limit_address_space(budget: u64) {
    let mut buf = [0u8; 128];
    let path = b"/proc/self/statm\0";
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    let mut pages = 0u64;
    if fd >= 0 {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        close(fd);
        for &b in buf.iter().take(n.max(0) as usize) {
            if !b.is_ascii_digit() {
                break;
            }
            pages = pages * 10 + u64::from(b - b'0');
        }
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let limit = pages.saturating_mul(page).saturating_add(budget);
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: `rl` is a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) };
}
