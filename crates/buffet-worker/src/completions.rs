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
//! See docs/results/notes.md, "2026-11-29: the completion ring in batches", for what it
//! bought.

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
}

impl Completions {
    /// Frames per batch at most: enough that one exchange between the cores serves many
    /// frames, small enough that a worker under a light load, handing back a few frames
    /// at a time, has many batches before it waits.
    pub const BATCH: usize = 32;

    /// A ring with room for `frames` frames in full batches four times over: a worker
    /// handing back bursts smaller than [`BATCH`](Self::BATCH) (a light load) still has
    /// `frames / 8` batches, at least 8, before it waits for the data plane.
    pub fn new(frames: usize) -> Self {
        let batches = 4 * frames.div_ceil(Self::BATCH).max(2);
        let empty = ArrayQueue::new(batches);
        for _ in 0..batches {
            // Cannot fail: the queue holds `batches`.
            let _ = empty.push(Vec::with_capacity(Self::BATCH));
        }
        Completions {
            full: ArrayQueue::new(batches),
            empty,
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
            batch.extend(rest.by_ref().take(Self::BATCH));
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
    /// fill again. Frames still in it are dropped; a batch beyond the ring's count (one
    /// it did not give) is dropped too.
    pub fn recycle(&self, mut batch: Vec<PacketBuf>) {
        batch.clear();
        // Cannot fail: there are only as many batches as `empty` holds.
        let _ = self.empty.push(batch);
    }

    /// Whether no batch waits for the data plane (read sequentially consistently, as
    /// the hand-back's push writes: see the pipeline's idle wait).
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
        let ring = Completions::new(256);
        let mut out: Vec<PacketBuf> = (0..80).map(frame).collect();
        ring.send(&mut out);
        assert!(out.is_empty());
        let mut seen = Vec::new();
        let mut sizes = Vec::new();
        while let Some(mut b) = ring.take() {
            sizes.push(b.len());
            seen.extend(b.drain(..).map(|m| m.ts_ns));
            ring.recycle(b);
        }
        assert_eq!(sizes, [32, 32, 16]);
        assert_eq!(seen, (0..80).collect::<Vec<_>>());
        assert!(ring.is_empty());
    }

    #[test]
    fn a_worker_waits_for_the_data_plane_when_every_batch_is_out() {
        // 8 batches (the least): the ninth hand-over needs a batch back first.
        let ring = std::sync::Arc::new(Completions::new(1));
        let sender = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for n in 0..12 {
                    ring.send(&mut vec![frame(n)]);
                }
            })
        };
        let mut seen = Vec::new();
        while seen.len() < 12 {
            if let Some(mut b) = ring.take() {
                seen.extend(b.drain(..).map(|m| m.ts_ns));
                ring.recycle(b);
            }
        }
        sender.join().unwrap();
        assert_eq!(seen, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn a_light_load_gets_many_batches_and_discarding_gives_every_one_back() {
        let ring = Completions::new(1024);
        // 128 hand-overs of one frame each fit without the data plane taking any (a
        // lost batch, or fewer, would leave this test hanging).
        for n in 0..128 {
            ring.send(&mut vec![frame(n)]);
        }
        ring.discard();
        assert!(ring.is_empty());
        for n in 0..128 {
            ring.send(&mut vec![frame(n)]);
        }
        assert_eq!(ring.take().map(|b| b[0].ts_ns), Some(0));
    }
}
