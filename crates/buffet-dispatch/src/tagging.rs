//! DSCP tagging: the dispatcher writes the tenant's index into the 6-bit DSCP field so a
//! worker can trust the tag and skip re-classification (the Buffet paper, §III-E).
//!
//! IPv4: the upper six bits of the TOS byte; the ECN bits are kept and the header
//! checksum is fixed incrementally (RFC 1624, eqn. 3: `HC' = ~(~HC + ~m + m')`), so a
//! correct checksum stays correct and an incorrect one stays incorrect by the same
//! amount. IPv6: the upper six bits of the traffic class (no header checksum).
//!
//! Neither function panics: offsets are checked against the buffer, and the version
//! nibble must agree with `is_v4`.

/// Why a tag could not be written or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// DSCP values are six bits.
    #[error("DSCP {0} does not fit in 6 bits")]
    DscpOutOfRange(u8),
    /// The IP header does not fit in the buffer at the given offset.
    #[error("IP header at offset {offset} does not fit in {len} bytes")]
    Truncated {
        /// The offset given.
        offset: usize,
        /// The buffer length.
        len: usize,
    },
    /// The version nibble at the offset is not the one `is_v4` announced.
    #[error("IP version nibble {found} where {expected} was expected")]
    WrongIpVersion {
        /// The version announced by the caller.
        expected: u8,
        /// The nibble found.
        found: u8,
    },
}

/// The largest value the DSCP field can carry.
pub const MAX_DSCP: u8 = 63;

fn header(bytes: &[u8], l3_offset: usize, is_v4: bool) -> Result<(), TagError> {
    let need = if is_v4 { 20 } else { 40 };
    let fits = l3_offset
        .checked_add(need)
        .is_some_and(|end| end <= bytes.len());
    if !fits {
        return Err(TagError::Truncated {
            offset: l3_offset,
            len: bytes.len(),
        });
    }
    let expected = if is_v4 { 4 } else { 6 };
    let found = bytes[l3_offset] >> 4;
    if found != expected {
        return Err(TagError::WrongIpVersion { expected, found });
    }
    Ok(())
}

/// Writes `dscp` into the IP header at `l3_offset` (ECN bits kept; IPv4 checksum fixed
/// per RFC 1624). On error the bytes are unchanged.
pub fn tag_dscp(bytes: &mut [u8], l3_offset: usize, is_v4: bool, dscp: u8) -> Result<(), TagError> {
    if dscp > MAX_DSCP {
        return Err(TagError::DscpOutOfRange(dscp));
    }
    header(bytes, l3_offset, is_v4)?;
    let h = &mut bytes[l3_offset..];
    if is_v4 {
        let old_word = u16::from_be_bytes([h[0], h[1]]);
        h[1] = (dscp << 2) | (h[1] & 0x03);
        let new_word = u16::from_be_bytes([h[0], h[1]]);
        let hc = u16::from_be_bytes([h[10], h[11]]);
        let fixed = checksum_update(hc, old_word, new_word);
        h[10..12].copy_from_slice(&fixed.to_be_bytes());
    } else {
        // Traffic class = low nibble of byte 0 (upper 4 bits) + high nibble of byte 1.
        let tc = (h[0] << 4) | (h[1] >> 4);
        let tc = (dscp << 2) | (tc & 0x03);
        h[0] = (h[0] & 0xf0) | (tc >> 4);
        h[1] = (tc << 4) | (h[1] & 0x0f);
    }
    Ok(())
}

/// Reads the DSCP of the IP header at `l3_offset`.
pub fn read_dscp(bytes: &[u8], l3_offset: usize, is_v4: bool) -> Result<u8, TagError> {
    header(bytes, l3_offset, is_v4)?;
    let h = &bytes[l3_offset..];
    Ok(if is_v4 {
        h[1] >> 2
    } else {
        ((h[0] << 4) | (h[1] >> 4)) >> 2
    })
}

/// RFC 1624 eqn. 3: the checksum `hc` after one 16-bit word changed from `old` to `new`.
pub fn checksum_update(hc: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Ipv4Header, Ipv6Header};

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn v4_header(seed: &mut u64) -> Vec<u8> {
        let r = xorshift(seed);
        let mut h = Ipv4Header::new(
            (r & 0x3ff) as u16,
            (r >> 10) as u8,
            etherparse::IpNumber((r >> 18) as u8),
            (xorshift(seed) as u32).to_be_bytes(),
            (xorshift(seed) as u32).to_be_bytes(),
        )
        .unwrap();
        h.identification = (r >> 26) as u16;
        h.dscp = etherparse::IpDscp::try_new(((r >> 42) & 0x3f) as u8).unwrap();
        h.ecn = etherparse::IpEcn::try_new(((r >> 48) & 0x3) as u8).unwrap();
        h.header_checksum = h.calc_header_checksum();
        h.to_bytes().to_vec()
    }

    #[test]
    fn v4_checksum_equals_full_recomputation() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut b = vec![0xaa; 3];
            b.extend(v4_header(&mut seed));
            let dscp = (xorshift(&mut seed) % 64) as u8;
            let ecn_before = b[4] & 3;
            tag_dscp(&mut b, 3, true, dscp).unwrap();
            let (h, _) = Ipv4Header::from_slice(&b[3..]).unwrap();
            assert_eq!(h.dscp.value(), dscp);
            assert_eq!(b[4] & 3, ecn_before, "ECN kept");
            assert_eq!(h.header_checksum, h.calc_header_checksum(), "{b:02x?}");
            assert_eq!(read_dscp(&b, 3, true), Ok(dscp));
            assert_eq!(&b[..3], &[0xaa; 3]);
        }
    }

    #[test]
    fn v4_checksum_edge_values() {
        // Headers whose checksum is 0x0000 or 0xffff-adjacent after re-tagging: search
        // a few thousand random headers for each DSCP and compare every result.
        let mut seed = 7u64;
        let mut zero_seen = false;
        for _ in 0..200_000 {
            let mut b = v4_header(&mut seed);
            let dscp = (xorshift(&mut seed) % 64) as u8;
            tag_dscp(&mut b, 0, true, dscp).unwrap();
            let (h, _) = Ipv4Header::from_slice(&b).unwrap();
            zero_seen |= h.header_checksum == 0;
            assert_eq!(h.header_checksum, h.calc_header_checksum());
        }
        assert!(zero_seen, "the search should hit a zero checksum");
    }

    #[test]
    fn v6_traffic_class() {
        let h = Ipv6Header {
            traffic_class: 0b1010_1011,
            flow_label: etherparse::Ipv6FlowLabel::try_new(0xfedcb).unwrap(),
            payload_length: 0,
            next_header: etherparse::IpNumber::UDP,
            hop_limit: 9,
            source: [1; 16],
            destination: [2; 16],
        };
        let mut b = h.to_bytes().to_vec();
        tag_dscp(&mut b, 0, false, 5).unwrap();
        let (h2, _) = Ipv6Header::from_slice(&b).unwrap();
        assert_eq!(h2.traffic_class, (5 << 2) | 0b11);
        assert_eq!(h2.flow_label, h.flow_label);
        assert_eq!(h2.source, h.source);
        assert_eq!(read_dscp(&b, 0, false), Ok(5));
    }

    #[test]
    fn errors_leave_bytes_unchanged() {
        let mut seed = 1u64;
        let mut b = v4_header(&mut seed);
        let orig = b.clone();
        assert_eq!(
            tag_dscp(&mut b, 0, true, 64),
            Err(TagError::DscpOutOfRange(64))
        );
        assert_eq!(
            tag_dscp(&mut b, 1, true, 1),
            Err(TagError::Truncated { offset: 1, len: 20 })
        );
        assert_eq!(
            tag_dscp(&mut b, usize::MAX, true, 1),
            Err(TagError::Truncated {
                offset: usize::MAX,
                len: 20
            })
        );
        assert_eq!(
            tag_dscp(&mut b, 0, false, 1),
            Err(TagError::Truncated { offset: 0, len: 20 })
        );
        b.extend([0; 20]);
        assert_eq!(
            tag_dscp(&mut b, 0, false, 1),
            Err(TagError::WrongIpVersion {
                expected: 6,
                found: 4
            })
        );
        assert_eq!(&b[..20], &orig[..]);
    }
}
