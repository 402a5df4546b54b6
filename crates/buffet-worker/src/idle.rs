//! How a thread of the pipeline (the data plane running [`Dataplane::run`], a worker)
//! waits when its loop finds nothing to do. While frames arrive it never waits. Once a
//! turn finds nothing it spins and yields a few turns, then naps briefly between turns
//! (the thread's own short nap); after [`IDLE_AFTER`] of finding nothing it blocks in
//! `poll(2)` for at most the idle wait (default [`DEFAULT_IDLE_WAIT`]) on the
//! descriptors of what only it drains (the live ports' sockets for the data plane, a
//! worker's own AF_XDP sockets) and on its [`Waker`], which the other threads notify
//! when they hand it work: the data plane when it pushes frames into a worker's ring, a
//! flush request or stop; a worker when it hands frames back; a command sent to the
//! data plane. A thread never blocks on a descriptor another thread drains: that one
//! could take the frame first, and the sleeper, woken, would find nothing readable and
//! sleep on. A data plane whose ports must be polled (files, the generator, DPDK) keeps
//! napping and never blocks.
//!
//! No wake-up is lost: the sleeper marks itself asleep, then looks for work once more,
//! then blocks; the thread handing it work publishes the work, then looks at the mark.
//! Both steps are sequentially consistent, so one of the two sees the other's.
//!
//! [`Dataplane::run`]: crate::Dataplane::run

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam::utils::Backoff;

use crate::sys::EventFd;

/// How long a thread finds nothing, after spinning, before it blocks on its
/// descriptors.
pub const IDLE_AFTER: Duration = Duration::from_micros(200);

/// The longest a blocked thread waits before it looks again when no frame arrives: how
/// late a command (an admission, a report, stop) may be seen by an idle data plane, and a
/// frame whose arrival no descriptor announced.
pub const DEFAULT_IDLE_WAIT: Duration = Duration::from_millis(1);

/// What the data plane and its workers share about waiting: the idle wait.
#[derive(Debug)]
pub(crate) struct IdleShared {
    /// The idle wait in ns; 0 never blocks.
    wait_ns: AtomicU64,
}

impl Default for IdleShared {
    fn default() -> Self {
        IdleShared {
            wait_ns: AtomicU64::new(DEFAULT_IDLE_WAIT.as_nanos() as u64),
        }
    }
}

impl IdleShared {
    pub(crate) fn set_wait(&self, wait: Duration) {
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.wait_ns.store(ns, Ordering::Relaxed);
    }

    pub(crate) fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Ordering::Relaxed))
    }
}

/// How one thread is woken from its idle wait: a mark saying it sleeps (or is about to)
/// and an eventfd it blocks on beside its sockets.
#[derive(Debug)]
pub(crate) struct Waker {
    asleep: AtomicBool,
    /// `None` where no eventfd could be made: the thread then never blocks.
    fd: Option<EventFd>,
}

impl Waker {
    pub(crate) fn new() -> Waker {
        Waker {
            asleep: AtomicBool::new(false),
            fd: EventFd::new().ok(),
        }
    }

    /// After publishing work for the thread (a sequentially consistent write, or a
    /// read-modify-write such as a ring's push): wakes it if it sleeps. One load while
    /// it is awake; the first caller after it fell asleep also writes the eventfd.
    #[inline]
    pub(crate) fn wake(&self) {
        if self.asleep.load(Ordering::SeqCst) && self.asleep.swap(false, Ordering::SeqCst) {
            if let Some(fd) = &self.fd {
                fd.notify();
            }
        }
    }

    /// Wakes the thread whatever its mark says (it may be just about to sleep): for rare
    /// requests published with weaker orderings (stop, flush, a command). The next
    /// sleep returns at once and finds the request.
    pub(crate) fn notify(&self) {
        self.asleep.store(false, Ordering::SeqCst);
        if let Some(fd) = &self.fd {
            fd.notify();
        }
    }
}

/// One thread's state of idleness.
pub(crate) struct Idle {
    backoff: Backoff,
    /// Since when the thread found nothing (after spinning), or was last woken.
    since: Option<Instant>,
}

impl Idle {
    pub(crate) fn new() -> Idle {
        Idle {
            backoff: Backoff::new(),
            since: None,
        }
    }

    /// The loop found work.
    pub(crate) fn busy(&mut self) {
        self.backoff.reset();
        self.since = None;
    }

    /// The loop found nothing: spins, or naps with `nap`, or, idle long enough, blocks
    /// on `waker` and on `fds` (descriptors only this thread drains; `None`: something
    /// must be polled, so it naps) for at most `wait` (zero: never blocks). `has_work`
    /// looks once more after the thread marked itself asleep. Returns the descriptor of
    /// `fds` that woke it with an error condition, if one did: the caller reads that error
    /// from its port ([`Port::take_error`](buffet_io::Port::take_error)), or every
    /// following wait returns at once.
    pub(crate) fn empty(
        &mut self,
        wait: Duration,
        waker: &Waker,
        fds: Option<&[RawFd]>,
        has_work: impl FnOnce() -> bool,
        nap: impl FnOnce(),
    ) -> Option<RawFd> {
        if !self.backoff.is_completed() {
            self.backoff.snooze();
            return None;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if wait.is_zero() || now.duration_since(since) < IDLE_AFTER {
            nap();
            return None;
        }
        let (Some(fds), Some(efd)) = (fds, &waker.fd) else {
            nap();
            return None;
        };
        if fds.len() >= buffet_io::MAX_WAIT_FDS {
            // More than one wait can watch: some would go unwatched.
            nap();
            return None;
        }
        let mut set = [0 as RawFd; buffet_io::MAX_WAIT_FDS];
        set[..fds.len()].copy_from_slice(fds);
        set[fds.len()] = efd.raw();
        waker.asleep.store(true, Ordering::SeqCst);
        let ready = if has_work() {
            buffet_io::Ready {
                woken: true,
                failed: None,
            }
        } else {
            buffet_io::wait_ready(&set[..=fds.len()], wait)
        };
        waker.asleep.store(false, Ordering::SeqCst);
        efd.drain();
        if ready.woken {
            // Look for what follows before blocking again.
            self.since = Some(Instant::now());
        }
        ready.failed
    }
}
