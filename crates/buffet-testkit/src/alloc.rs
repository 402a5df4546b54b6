//! Counting allocations on the packet path.
//!
//! A test crate installs [`CountingAllocator`] as its global allocator and wraps the code
//! under test in [`allocations_during`]. Only allocations on the calling thread while the
//! closure runs are counted; other test threads do not disturb the count. Frees are not
//! counted: a path that allocates and frees again still allocated.

pub use crate::sys::CountingAllocator;

/// How many times `f` allocated (or reallocated) on this thread. Meaningful only in a
/// crate whose global allocator is [`CountingAllocator`]; otherwise it returns 0.
pub fn allocations_during(f: impl FnOnce()) -> u64 {
    crate::sys::start_counting();
    f();
    crate::sys::stop_counting()
}
