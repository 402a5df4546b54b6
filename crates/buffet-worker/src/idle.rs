//! How a thread of the pipeline (the data plane running [`Dataplane::run`], a worker)
//! waits when its loop finds nothing to do. While frames arrive it never waits. Once a
//! turn finds nothing it spins and yields a few turns, then naps briefly between turns
//! (the thread's own short nap); after [`IDLE_AFTER`] of finding nothing it blocks in
//! `poll(2)` on the descriptors that become readable when frames arrive (the live ports'
//! sockets, a worker's own AF_XDP sockets) for at most the idle wait (default
//! [`DEFAULT_IDLE_WAIT`]). A frame arriving wakes it at once; it then keeps looking,
//! napping briefly, for [`IDLE_AFTER`] again before it blocks, so the frames the other
//! threads pass on to it meanwhile (dispatched to a worker's ring, completed by a
//! worker) are seen without waiting. A thread with no such descriptors (a port that
//! must be polled: files, the generator, DPDK) keeps napping and never blocks.
//!
//! [`Dataplane::run`]: crate::Dataplane::run

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam::utils::Backoff;

/// How long a thread finds nothing, after spinning, before it blocks on its
/// descriptors.
pub const IDLE_AFTER: Duration = Duration::from_micros(200);

/// The longest a blocked thread waits before it looks again when no frame arrives: how
/// late a command (an admission, a report, stop) may be seen by an idle data plane, and a
/// frame whose arrival no descriptor announced.
pub const DEFAULT_IDLE_WAIT: Duration = Duration::from_millis(1);

/// What the data plane and its workers share about waiting.
#[derive(Debug)]
pub(crate) struct IdleShared {
    /// The live ports' descriptors, published by the data plane while it runs; `None`
    /// when a port must be polled (or the data plane is not running its loop).
    ports: Mutex<Option<Arc<[RawFd]>>>,
    /// The idle wait in ns; 0 never blocks.
    wait_ns: AtomicU64,
}

impl Default for IdleShared {
    fn default() -> Self {
        IdleShared {
            ports: Mutex::new(None),
            wait_ns: AtomicU64::new(DEFAULT_IDLE_WAIT.as_nanos() as u64),
        }
    }
}

impl IdleShared {
    pub(crate) fn set_ports(&self, fds: Option<Arc<[RawFd]>>) {
        *self.ports.lock().unwrap_or_else(PoisonError::into_inner) = fds;
    }

    pub(crate) fn ports(&self) -> Option<Arc<[RawFd]>> {
        self.ports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_wait(&self, wait: Duration) {
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.wait_ns.store(ns, Ordering::Relaxed);
    }

    pub(crate) fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Ordering::Relaxed))
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

    /// The loop found nothing: spins, or naps with `nap`, or, idle long enough and with
    /// descriptors to wait on (`fds`, asked only then), blocks on them for at most `wait`
    /// (zero: never blocks).
    pub(crate) fn empty(
        &mut self,
        wait: Duration,
        fds: impl FnOnce() -> Option<Arc<[RawFd]>>,
        nap: impl FnOnce(),
    ) {
        if !self.backoff.is_completed() {
            self.backoff.snooze();
            return;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if wait.is_zero() || now.duration_since(since) < IDLE_AFTER {
            return nap();
        }
        match fds() {
            Some(fds) => {
                if buffet_io::wait_readable(&fds, wait) {
                    // Woken by a frame: look for what follows before blocking again.
                    self.since = Some(Instant::now());
                }
            }
            None => nap(),
        }
    }
}
