//! Inbound: checking, decrypting and decapsulating one ESP packet through an inbound SA.

use std::net::{IpAddr, Ipv4Addr};

use buffet_sdk::etherparse::Ipv4HeaderSlice;
use buffet_sdk::{DropCause, Packet, Verdict};

use super::esp::{esp_header, esp_open};
use super::{IpsecState, OpenError, ReplayError, NEXT_HEADER_IPV4, NEXT_HEADER_NONE};

impl IpsecState {
    pub(super) fn decapsulate(
        &mut self,
        pkt: &mut Packet<'_>,
        src: [u8; 4],
        dst: [u8; 4],
    ) -> Verdict {
        let (l3, l4, end) = (pkt.l3_offset(), pkt.l4_offset(), pkt.ip_end());
        let c = &mut self.counters;
        let Some((spi, seq_lo)) = pkt.data().get(l4..end).and_then(esp_header) else {
            c.truncated += 1;
            return Verdict::Drop(DropCause::Malformed);
        };
        let Ok(i) = self.inbound.binary_search_by_key(&spi, |sa| sa.spi) else {
            c.unknown_spi += 1;
            return Verdict::Drop(DropCause::Integrity);
        };
        let sa = &mut self.inbound[i];
        if sa.local != dst || sa.remote != src {
            c.wrong_endpoint += 1;
            return Verdict::Drop(DropCause::Integrity);
        }
        let seq = if sa.esn {
            sa.window.infer_esn(seq_lo)
        } else {
            u64::from(seq_lo)
        };
        match sa.window.check(seq) {
            Ok(()) => {}
            Err(ReplayError::Duplicate) => {
                c.replayed += 1;
                return Verdict::Drop(DropCause::Replay);
            }
            Err(ReplayError::TooOld) => {
                c.too_old += 1;
                return Verdict::Drop(DropCause::Replay);
            }
        }
        let Some(frame) = pkt.data_mut().get_mut(l3..end) else {
            c.truncated += 1;
            return Verdict::Drop(DropCause::Malformed);
        };
        let seq_hi = sa.esn.then_some((seq >> 32) as u32);
        let opened = match esp_open(&sa.cipher, frame, l4 - l3, seq_hi) {
            Ok(o) => o,
            Err(e) => {
                let (counter, cause) = match e {
                    OpenError::Truncated => (&mut c.truncated, DropCause::Malformed),
                    OpenError::Misaligned => (&mut c.misaligned, DropCause::Malformed),
                    OpenError::Integrity => (&mut c.bad_icv, DropCause::Integrity),
                    OpenError::BadPadding => {
                        sa.window.accept(seq);
                        (&mut c.bad_padding, DropCause::Malformed)
                    }
                };
                *counter += 1;
                return Verdict::Drop(cause);
            }
        };
        // Authentic: the window moves whatever the payload turns out to be.
        sa.window.accept(seq);
        match opened.next_header {
            NEXT_HEADER_IPV4 => {}
            NEXT_HEADER_NONE => {
                c.dummy += 1;
                return Verdict::Drop(DropCause::Policy);
            }
            _ => {
                c.bad_next_header += 1;
                return Verdict::Drop(DropCause::Malformed);
            }
        }
        let inner = &frame[..opened.payload_len];
        let (inner_len, inner_src) = match Ipv4HeaderSlice::from_slice(inner) {
            Ok(h) if (h.slice().len()..=inner.len()).contains(&(h.total_len() as usize)) => {
                (h.total_len() as usize, h.source())
            }
            _ => {
                c.bad_inner += 1;
                return Verdict::Drop(DropCause::Malformed);
            }
        };
        if sa
            .selector
            .is_some_and(|p| !p.contains(IpAddr::V4(Ipv4Addr::from(inner_src))))
        {
            c.selector_mismatch += 1;
            return Verdict::Drop(DropCause::Policy);
        }
        if pkt.resize(l3 + inner_len).is_err() || pkt.reparse().is_err() {
            c.bad_inner += 1;
            return Verdict::Drop(DropCause::Malformed);
        }
        if let Some(eth) = self.inbound_eth {
            eth.apply(pkt.data_mut());
        }
        c.decapsulated += 1;
        self.inbound_port.map_or(Verdict::Pass, Verdict::Forward)
    }
}
