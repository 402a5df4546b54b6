//! The testkit's only `unsafe` code: the counting global allocator, opening a
//! pseudo-terminal ([`open_pty`]) and setting UDP GSO on a socket.
//!
//! [`CountingAllocator`] forwards every call to [`System`] and, while counting is on for
//! the calling thread, counts `alloc`, `alloc_zeroed` and `realloc` calls. The counters
//! are const-initialised thread-locals, which never allocate themselves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// A global allocator that counts allocations made on a thread while
/// [`allocations_during`](crate::allocations_during) runs there, and otherwise behaves
/// exactly as the system allocator. Install it in a test crate with
/// `#[global_allocator] static GLOBAL: CountingAllocator = CountingAllocator;`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAllocator;

fn note() {
    // `try_with`: thread-locals may be gone during thread teardown.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

/// Turns counting on for this thread with the count at zero.
pub(crate) fn start_counting() {
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
}

/// Turns counting off for this thread; the allocations since [`start_counting`].
pub(crate) fn stop_counting() -> u64 {
    COUNTING.with(|on| on.set(false));
    ALLOCS.with(Cell::get)
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counting touches only const-initialised thread-locals,
// which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded from our caller, who upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded from our caller, who upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc*` with this layout (we only forward).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded from our caller, who upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// A new pseudo-terminal: (controller side, terminal side).
pub(crate) fn open_pty() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let (mut controller, mut terminal) = (-1, -1);
    // SAFETY: openpty writes two new descriptors into the two ints; the name, termios and
    // window size arguments may be null.
    let r = unsafe {
        libc::openpty(
            &mut controller,
            &mut terminal,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    let (controller, terminal) = unsafe {
        (
            std::fs::File::from_raw_fd(controller),
            std::os::fd::OwnedFd::from_raw_fd(terminal),
        )
    };
    // Close-on-exec, so that only the child given the terminal side holds it (a child
    // another thread starts meanwhile inherits neither), and the controller sees the
    // terminal close when that child ends. A child's stdio gets its own copy (dup2
    // clears the flag on the copy).
    for fd in [controller.as_raw_fd(), terminal.as_raw_fd()] {
        // SAFETY: F_SETFD on a descriptor this function owns; no pointer is passed.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((controller, terminal))
}

/// Sets `UDP_SEGMENT` (UDP GSO) on a UDP socket: each datagram it sends is cut into
/// segments of `size` payload bytes — below the socket, as one super-packet.
pub(crate) fn set_udp_segment(fd: std::os::fd::BorrowedFd<'_>, size: u16) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::from(size);
    // SAFETY: `v` lives across the call and the length passed is its size; the kernel
    // only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
