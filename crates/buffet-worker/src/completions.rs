//! A worker's completion ring: the frames a worker ran go back to the data plane a batch
//! at a time, not one by one.
//!
//! Handing frames back one by one costs a compare-and-swap on a shared index and a cache
//! line that changes cores for every frame, on both sides. The worker already finishes
//! its frames a burst at a time, so it hands them back that way: a batch is a `Vec` of
//! frames that travels to the data plane and, emptied, back to the worker, so no batch is
//! allocated after the ring is built. (The input ring stays per frame: the data plane
//! takes back the frames of a lost worker from it one by one, and a worker that pops what
//! is there takes bursts as large as the input allows.)
//!
//! See docs/results/notes.md, "The completion ring in batches", for what it bought.

use buffet_io::PacketBuf;
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::Backoff;

/// One worker's completion ring (worker → data plane): one thread hands frames back with
/// [`send`](Self::send), another takes them with [`take`](Self::take) and returns the
/// emptied batch with [`recycle`](Self::recycle). The pipeline's worker threads use one
/// each; an embedder running [`Worker`](crate::Worker) on its own threads can too.
pub struct Completions {
    /// Batches handed back, oldest first.
    full: ArrayQueue<Vec<PacketBuf>>,
    /// Emptied batches, for the worker to fill.
    empty: ArrayQueue<Vec<PacketBuf>>,
    /// Frames per batch at most.
    batch: usize,
}

impl Completions {
    /// A ring with room for `frames` frames in full batches of `batch`, and twice as many
    /// batches, so a worker handing back bursts smaller than `batch` (a light load) still
    /// has room for many of them before it waits for the data plane.
    pub fn new(frames: usize, batch: usize) -> Self {
        let batch = batch.max(1);
        let batches = 2 * frames.div_ceil(batch).max(1);
        let empty = ArrayQueue::new(batches);
        for _ in 0..batches {
            // Cannot fail: the queue holds `batches`.
            let _ = empty.push(Vec::with_capacity(batch));
        }
        Completions {
            full: ArrayQueue::new(batches),
            empty,
            batch,
        }
    }

    /// Worker side: hands every frame of `frames` back in order, leaving it empty. Waits
    /// while every batch is with the data plane.
    pub fn send(&self, frames: &mut Vec<PacketBuf>) {
        let mut rest = frames.drain(..);
        let backoff = Backoff::new();
        while rest.len() > 0 {
            let Some(mut batch) = self.empty.pop() else {
                backoff.snooze();
                continue;
            };
            batch.extend(rest.by_ref().take(self.batch));
            // Cannot fail: there are only as many batches as `full` holds.
            let _ = self.full.push(batch);
        }
    }

    /// Data plane side: the oldest batch handed back, if any. Give it back emptied with
    /// [`recycle`](Self::recycle).
    pub fn take(&self) -> Option<Vec<PacketBuf>> {
        self.full.pop()
    }

    /// Data plane side: returns a batch [`take`](Self::take) gave, for the worker to
    /// fill again. Frames still in it are dropped.
    pub fn recycle(&self, mut batch: Vec<PacketBuf>) {
        batch.clear();
        // Cannot fail: there are only as many batches as `empty` holds.
        let _ = self.empty.push(batch);
    }

    /// Whether no batch waits for the data plane.
    pub fn is_empty(&self) -> bool {
        self.full.is_empty()
    }

    /// Data plane side: drops every frame handed back so far.
    pub fn discard(&self) {
        while let Some(batch) = self.take() {
            self.recycle(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u64) -> PacketBuf {
        let mut m = PacketBuf::heap();
        m.ts_ns = n;
        m
    }

    #[test]
    fn frames_come_back_in_order_in_batches_of_at_most_the_batch_size() {
        let ring = Completions::new(64, 8);
        let mut out: Vec<PacketBuf> = (0..20).map(frame).collect();
        ring.send(&mut out);
        assert!(out.is_empty());
        let mut seen = Vec::new();
        let mut sizes = Vec::new();
        while let Some(mut b) = ring.take() {
            sizes.push(b.len());
            seen.extend(b.drain(..).map(|m| m.ts_ns));
            ring.recycle(b);
        }
        assert_eq!(sizes, [8, 8, 4]);
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        assert!(ring.is_empty());
    }

    #[test]
    fn a_worker_waits_for_the_data_plane_when_every_batch_is_out() {
        // Two batches of 2 (room for 2 frames, twice over): the third batch's frames
        // need a batch back first.
        let ring = std::sync::Arc::new(Completions::new(2, 2));
        let sender = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                let mut out: Vec<PacketBuf> = (0..6).map(frame).collect();
                ring.send(&mut out);
            })
        };
        let mut seen = Vec::new();
        while seen.len() < 6 {
            if let Some(mut b) = ring.take() {
                seen.extend(b.drain(..).map(|m| m.ts_ns));
                ring.recycle(b);
            }
        }
        sender.join().unwrap();
        assert_eq!(seen, (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn discarding_empties_the_ring_and_keeps_every_batch() {
        let ring = Completions::new(4, 4);
        let mut out: Vec<PacketBuf> = (0..8).map(frame).collect();
        ring.send(&mut out);
        ring.discard();
        assert!(ring.is_empty());
        // Both batches are back for the worker: it can hand back 8 frames again without
        // waiting (a lost batch would leave this test hanging).
        let mut out: Vec<PacketBuf> = (0..8).map(frame).collect();
        ring.send(&mut out);
        assert_eq!(ring.take().map(|b| b.len()), Some(4));
    }
}
