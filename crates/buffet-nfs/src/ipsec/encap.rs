//! Outbound: encapsulating one packet into ESP tunnel mode through an outbound SA.

use buffet_sdk::etherparse::{IpDscp, IpNumber, Ipv4Header};
use buffet_sdk::{DropCause, Packet, Verdict};

use super::esp::{esp_len, esp_seal};
use super::{IpsecState, ESP_PREFIX_LEN, IPPROTO_ESP, NEXT_HEADER_IPV4, OUTER_IP_LEN};

impl IpsecState {
    pub(super) fn encapsulate(&mut self, pkt: &mut Packet<'_>, sa: usize) -> Verdict {
        let (l3, end) = (pkt.l3_offset(), pkt.ip_end());
        let Some(inner) = pkt.ipv4() else {
            return self.unmatched();
        };
        let (dscp, df) = (inner.dcp(), inner.dont_fragment());
        let sa = &mut self.outbound[sa];
        if sa.exhausted {
            self.counters.seq_exhausted += 1;
            return Verdict::Drop(DropCause::Policy);
        }
        let full_seq = sa.next_seq;
        let seq = full_seq as u32;
        let seq_hi = sa.esn.then_some((full_seq >> 32) as u32);
        let inner_len = end - l3;
        let esp_total = esp_len(inner_len);
        let outer_total = OUTER_IP_LEN + esp_total;
        let fits_mtu = self.mtu.is_none_or(|m| outer_total <= usize::from(m));
        let outer = Ipv4Header::new(
            esp_total.try_into().unwrap_or(u16::MAX),
            sa.ttl,
            IpNumber(IPPROTO_ESP),
            sa.local,
            sa.remote,
        );
        let (Ok(mut outer), true) = (outer, fits_mtu) else {
            self.counters.too_big += 1;
            return Verdict::Drop(DropCause::Policy);
        };
        if pkt.resize(l3 + outer_total).is_err() {
            self.counters.too_big += 1;
            return Verdict::Drop(DropCause::Policy);
        }
        outer.dscp = IpDscp::try_new(dscp.value()).unwrap_or_default();
        outer.dont_fragment = df;
        outer.identification = seq as u16;
        outer.header_checksum = outer.calc_header_checksum();

        let data = pkt.data_mut();
        let esp_at = l3 + OUTER_IP_LEN;
        data.copy_within(l3..end, esp_at + ESP_PREFIX_LEN);
        data[l3..esp_at].copy_from_slice(&outer.to_bytes());
        let iv = full_seq.to_be_bytes();
        if esp_seal(
            &sa.cipher,
            sa.spi,
            seq,
            seq_hi,
            iv,
            NEXT_HEADER_IPV4,
            &mut data[esp_at..],
            inner_len,
        )
        .is_err()
        {
            // Unreachable: the frame was resized to hold exactly this packet.
            self.counters.too_big += 1;
            return Verdict::Drop(DropCause::Policy);
        }
        let last = if sa.esn {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        };
        if full_seq == last {
            sa.exhausted = true;
        } else {
            sa.next_seq += 1;
        }
        if let Some(eth) = self.outbound_eth {
            eth.apply(data);
        }
        if pkt.reparse().is_err() {
            self.counters.bad_inner += 1;
            return Verdict::Drop(DropCause::Malformed);
        }
        self.counters.encapsulated += 1;
        self.outbound_port.map_or(Verdict::Pass, Verdict::Forward)
    }
}
