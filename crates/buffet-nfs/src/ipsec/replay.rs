//! The anti-replay window (RFC 4303 §3.4.3 sliding window, with extended sequence
//! number inference, Appendix A2). It checks and records sequence numbers; it does not
//! decrypt or look at packets.

/// Why [`ReplayWindow::check`] refused a sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Already received within the window.
    #[error("replayed sequence number")]
    Duplicate,
    /// Left of the window (or 0, which a sender never uses).
    #[error("sequence number left of the anti-replay window")]
    TooOld,
}

/// RFC 4303 §3.4.3 receiver window over sequence numbers (32-bit, or 64-bit with ESN).
///
/// The bitmap is a ring of 64-bit words indexed by `seq / 64` (RFC 6479's layout): moving
/// the window right clears whole words, never shifts. It keeps one spare word so the
/// `size` newest numbers never share a word with a stale one. Check before verifying the
/// ICV, [`accept`](Self::accept) after.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    size: u32,
    top: u64,
    bits: Vec<u64>,
}

impl ReplayWindow {
    /// A window of `size` packets (at least 1).
    pub fn new(size: u32) -> Self {
        let size = size.max(1);
        let words = (size.div_ceil(64) as usize + 1).next_power_of_two();
        ReplayWindow {
            size,
            top: 0,
            bits: vec![0; words],
        }
    }

    /// Window size in packets.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Highest sequence number accepted so far (0: none).
    pub fn top(&self) -> u64 {
        self.top
    }

    #[inline]
    fn slot(&self, seq: u64) -> (usize, u64) {
        (
            ((seq >> 6) as usize) & (self.bits.len() - 1),
            1u64 << (seq & 63),
        )
    }

    /// The full 64-bit sequence number of a packet carrying the low half `seq_lo`, as
    /// RFC 4303 Appendix A2.2 infers it: the high half of the window's top, one more when
    /// `seq_lo` is below the window (the counter wrapped), one less when the window
    /// straddles a wrap and `seq_lo` is in its older part. The ICV then tells whether the
    /// guess was the sender's number.
    #[inline]
    pub fn infer_esn(&self, seq_lo: u32) -> u64 {
        let (th, tl) = ((self.top >> 32) as u32, self.top as u32);
        let span = self.size.saturating_sub(1);
        let bottom = tl.wrapping_sub(span);
        let hi = if tl >= span {
            // Case A: the window lies within one 2^32 subspace.
            if seq_lo >= bottom {
                th
            } else {
                th.wrapping_add(1)
            }
        } else if seq_lo >= bottom {
            // Case B, older part of a window that straddles a wrap (none below 0).
            th.saturating_sub(1)
        } else {
            th
        };
        (u64::from(hi) << 32) | u64::from(seq_lo)
    }

    /// Whether `seq` may be accepted: new, and not left of the window.
    #[inline]
    pub fn check(&self, seq: u64) -> Result<(), ReplayError> {
        if seq == 0 || self.bits.is_empty() {
            return Err(ReplayError::TooOld);
        }
        if seq > self.top {
            return Ok(());
        }
        if self.top - seq >= u64::from(self.size) {
            return Err(ReplayError::TooOld);
        }
        let (w, b) = self.slot(seq);
        if self.bits[w] & b != 0 {
            Err(ReplayError::Duplicate)
        } else {
            Ok(())
        }
    }

    /// Records `seq` as received (after [`check`](Self::check) passed and the ICV was
    /// verified), sliding the window when `seq` is the new highest.
    #[inline]
    pub fn accept(&mut self, seq: u64) {
        if self.bits.is_empty() {
            return;
        }
        if seq > self.top {
            let (old, new) = (self.top >> 6, seq >> 6);
            let stale = (new - old).min(self.bits.len() as u64);
            for i in 1..=stale {
                let w = (old.wrapping_add(i) as usize) & (self.bits.len() - 1);
                self.bits[w] = 0;
            }
            self.top = seq;
        }
        let (w, b) = self.slot(seq);
        self.bits[w] |= b;
    }
}
