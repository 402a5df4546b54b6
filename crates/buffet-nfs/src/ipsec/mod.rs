//! IPsec gateway: ESP (RFC 4303) in tunnel mode with AES-256-GCM (RFC 4106), per tenant.
//!
//! Each tenant has its own security associations (SAs). How the NF decides what to do
//! with a packet:
//!
//! 1. **Inbound.** An IPv4 packet with protocol 50 (ESP) whose destination is one of the
//!    tenant's tunnel endpoints (the `local` address of any of its SAs) is decapsulated:
//!    the SPI selects the inbound SA (unknown SPI, or outer addresses other than the SA's
//!    endpoints: dropped as [`DropCause::Integrity`]); the sequence number is checked
//!    against the SA's anti-replay window (RFC 4303 §3.4.3 sliding window, 64 packets
//!    unless configured; replayed or too old: [`DropCause::Replay`]); the ICV is verified
//!    and the payload decrypted (bad ICV: [`DropCause::Integrity`]); the window advances
//!    only then. The padding must be RFC 4303's 1, 2, 3, … and the next header 4 (IPv4),
//!    the inner packet a whole IPv4 packet (TFC padding after it is stripped), else
//!    [`DropCause::Malformed`]. The inner packet then leaves in a frame with the received
//!    frame's Ethernet header (its MAC addresses rewritten if the policy says so).
//! 2. **Outbound.** Any other IPv4 packet whose destination falls in an outbound SA's
//!    `selector` (longest prefix wins) is encapsulated: outer IPv4 header from the SA's
//!    `local` to its `remote` (DSCP and DF copied from the inner header, ECN not-ECT as
//!    in RFC 6040's compatibility mode), ESP header, 8-byte explicit IV, the inner packet,
//!    RFC 4303 padding, pad length, next header 4, and the 16-byte ICV. The IV is the
//!    64-bit big-endian sequence number, so it never repeats under one key; the
//!    nonce is salt ‖ IV and the AAD is SPI ‖ sequence number (RFC 4106 §5). With
//!    extended sequence numbers (`esn = true` on both ends) the AAD is SPI ‖ 64-bit
//!    number and the receiver infers the high half from its window (RFC 4303 Appendix
//!    A2). After 2³² − 1 packets (2⁶⁴ − 1 with ESN) an SA is exhausted and its traffic
//!    dropped (there is no IKE to rekey it).
//! 3. **Everything else** (IPv6, IPv4 matching no SA) is passed or dropped per the
//!    policy's `unmatched` (default: drop, [`DropCause::Policy`]).
//!
//! The frame grows by 54–57 bytes on encapsulation: the NF uses
//! [`Packet::resize`], so the framework must hand it a packet parsed with room
//! ([`Packet::parse_with_capacity`]); without room (or beyond the tenant's `mtu`), the
//! packet is dropped and counted as `esp_too_big`. Every outcome has a counter
//! ([`IpsecCounters`], the NF's `summary`). Nothing on the packet path allocates or panics.
//!
//! Not supported: IKE (keys come from the policy), transport mode, IPv6 (inner or
//! outer), NAT traversal (ESP in UDP), fragmentation or reassembly,
//! ciphers other than AES-GCM with a 16-byte ICV, RFC 6040 ECN propagation, inbound
//! "SPD" checks beyond the optional inner-source `selector`.
//!
//! Policy (TOML; keys are hex: the 32-byte AES-256 key followed by the 4-byte salt, as in
//! RFC 4106 keying material, Linux `ip xfrm … aead 'rfc4106(gcm(aes))'`, scapy and
//! Wireshark):
//! ```toml
//! [tenant.policy]
//! replay_window = 64        # optional; default 64 packets, 1..=4096
//! unmatched = "drop"        # optional; "pass" or "drop" (default) for non-IPsec traffic
//! mtu = 1500                # optional; largest outer packet (IPv4 total length)
//! outbound_port = 1         # optional; Forward encapsulated packets here (default: Pass)
//! inbound_port = 0          # optional; Forward decapsulated packets here (default: Pass)
//! outbound_eth = { src = "02:00:00:00:00:01", dst = "02:00:00:00:00:02" }  # optional
//!
//! [[tenant.policy.outbound]]
//! spi = 0x1001
//! key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fcafebabe"
//! local = "203.0.113.1"     # outer source: this gateway
//! remote = "198.51.100.1"   # outer destination: the peer gateway
//! selector = "10.2.0.0/16"  # inner destinations sent through this SA
//! ttl = 64                  # optional; outer TTL
//! esn = false               # optional; 64-bit extended sequence numbers (both ends)
//!
//! [[tenant.policy.inbound]]
//! spi = 0x2001
//! key = "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3fdecafbad"
//! local = "203.0.113.1"     # outer destination: this gateway
//! remote = "198.51.100.1"   # outer source: the peer gateway
//! selector = "10.2.0.0/16"  # optional; inner sources accepted through this SA
//! replay_window = 128       # optional; overrides the tenant default
//! ```
//!
//! Below the NF, [`EspCipher`], [`esp_seal`] and [`esp_open`] are the sans-IO ESP wire
//! format: no state, bytes in, bytes out. The known-answer and interoperability tests
//! (`tests/ipsec_interop.rs`) drive them and the NF against draft-mcgrew-gcm-test-01,
//! Wireshark and scapy.

use std::fmt;
use std::net::Ipv4Addr;

use buffet_sdk::etherparse::{IpDscp, IpNumber, Ipv4Header, Ipv4HeaderSlice};
use buffet_sdk::policy;
use buffet_sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, PortId, Verdict};
use ring::aead;
use serde::Deserialize;

/// Bytes of the ESP header: SPI and sequence number.
pub const ESP_HEADER_LEN: usize = 8;
/// Bytes of the explicit AES-GCM IV carried in each packet (RFC 4106 §3.1).
pub const ESP_IV_LEN: usize = 8;
/// Bytes of the ICV (AES-GCM tag); only the 16-byte variant is supported.
pub const ESP_ICV_LEN: usize = 16;
/// Bytes of the salt at the end of RFC 4106 keying material.
pub const ESP_SALT_LEN: usize = 4;
/// Bytes of the keying material a policy gives for one SA: AES-256 key then salt.
pub const KEYMAT_LEN: usize = 32 + ESP_SALT_LEN;
/// Anti-replay window when the policy sets none.
pub const DEFAULT_REPLAY_WINDOW: u32 = 64;
/// Largest anti-replay window a policy may ask for.
pub const MAX_REPLAY_WINDOW: u32 = 4096;
/// Default per-tenant limit on SAs in each direction.
pub const DEFAULT_MAX_SAS: usize = 64;
/// Outer TTL when the policy sets none.
pub const DEFAULT_TTL: u8 = 64;

const IPPROTO_ESP: u8 = 50;
const NEXT_HEADER_IPV4: u8 = 4;
const NEXT_HEADER_NONE: u8 = 59;
const OUTER_IP_LEN: usize = 20;
/// Bytes before the ciphertext: ESP header and IV.
const ESP_PREFIX_LEN: usize = ESP_HEADER_LEN + ESP_IV_LEN;

// ---------------------------------------------------------------------------------------
// Wire format (sans-IO)
// ---------------------------------------------------------------------------------------

/// Why keying material was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Neither 20 bytes (AES-128 + salt) nor 36 (AES-256 + salt).
    #[error("AES-GCM keying material must be 20 or 36 bytes (key, then 4-byte salt), got {0}")]
    Length(usize),
}

/// The cryptographic half of one SA: an AES-GCM key (RFC 4106, 16-byte ICV) and its salt.
///
/// Built from RFC 4106 keying material: the AES key followed by the 4-byte salt. The
/// policy only accepts AES-256 (36 bytes); AES-128 (20 bytes) is here for published test
/// vectors and peers that use it. `Debug` never prints key material.
#[derive(Clone)]
pub struct EspCipher {
    key: aead::LessSafeKey,
    salt: [u8; ESP_SALT_LEN],
}

impl EspCipher {
    /// From keying material: 36 bytes (AES-256 key, salt) or 20 (AES-128 key, salt).
    pub fn new(keymat: &[u8]) -> Result<Self, KeyError> {
        let (algorithm, key_len) = match keymat.len() {
            36 => (&aead::AES_256_GCM, 32),
            20 => (&aead::AES_128_GCM, 16),
            n => return Err(KeyError::Length(n)),
        };
        let (key, salt) = keymat.split_at(key_len);
        let unbound =
            aead::UnboundKey::new(algorithm, key).map_err(|_| KeyError::Length(keymat.len()))?;
        let mut s = [0; ESP_SALT_LEN];
        s.copy_from_slice(salt);
        Ok(EspCipher {
            key: aead::LessSafeKey::new(unbound),
            salt: s,
        })
    }

    /// AES key size in bits (128 or 256).
    pub fn key_bits(&self) -> usize {
        self.key.algorithm().key_len() * 8
    }

    fn nonce(&self, iv: &[u8; ESP_IV_LEN]) -> aead::Nonce {
        let mut n = [0u8; aead::NONCE_LEN];
        n[..ESP_SALT_LEN].copy_from_slice(&self.salt);
        n[ESP_SALT_LEN..].copy_from_slice(iv);
        aead::Nonce::assume_unique_for_key(n)
    }
}

impl fmt::Debug for EspCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EspCipher")
            .field("key_bits", &self.key_bits())
            .finish_non_exhaustive()
    }
}

/// Padding bytes RFC 4303 §2.4 needs after a payload of `payload_len` bytes, so that
/// payload, padding, pad length and next header end on a 4-byte boundary (AES-GCM is a
/// stream mode: no block alignment beyond that).
pub const fn esp_pad_len(payload_len: usize) -> usize {
    (4 - (payload_len + 2) % 4) % 4
}

/// Bytes of the ESP packet (header through ICV) carrying `payload_len` bytes.
pub const fn esp_len(payload_len: usize) -> usize {
    ESP_PREFIX_LEN + payload_len + esp_pad_len(payload_len) + 2 + ESP_ICV_LEN
}

/// SPI and sequence number of an ESP packet, if the header is there.
pub fn esp_header(esp: &[u8]) -> Option<(u32, u32)> {
    let h = esp.get(..ESP_HEADER_LEN)?;
    Some((
        u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
        u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
    ))
}

/// Why [`esp_seal`] could not build a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The buffer is shorter than [`esp_len`] of the payload.
    #[error("ESP packet needs {needed} bytes, buffer has {available}")]
    BufferTooSmall {
        /// `esp_len(payload_len)`.
        needed: usize,
        /// The buffer's length.
        available: usize,
    },
    /// More plaintext than AES-GCM may encrypt under one nonce (never for IP packets).
    #[error("payload too long for AES-GCM")]
    TooLong,
}

/// Builds one ESP packet in place and returns its length ([`esp_len`] of the payload).
///
/// On entry `esp[16..16 + payload_len]` holds the payload (16: ESP header and IV). On
/// return `esp[..len]` is the packet: SPI, `seq` (the low 32 bits of the sequence
/// number), `iv`, the encrypted payload, padding (1, 2, 3, …), pad length and
/// `next_header`, then the ICV over the AAD and the ciphertext, with nonce salt ‖ `iv`.
/// The AAD is SPI ‖ `seq`, or SPI ‖ `seq_hi` ‖ `seq` with extended sequence numbers
/// (`seq_hi: Some(_)`, RFC 4106 §5). The caller guarantees `iv` is never reused under
/// this key (the NF uses the sequence number).
#[allow(clippy::too_many_arguments)]
pub fn esp_seal(
    cipher: &EspCipher,
    spi: u32,
    seq: u32,
    seq_hi: Option<u32>,
    iv: [u8; ESP_IV_LEN],
    next_header: u8,
    esp: &mut [u8],
    payload_len: usize,
) -> Result<usize, SealError> {
    let needed = esp_len(payload_len);
    let available = esp.len();
    let esp = esp
        .get_mut(..needed)
        .ok_or(SealError::BufferTooSmall { needed, available })?;
    let pad = esp_pad_len(payload_len);
    let trailer = ESP_PREFIX_LEN + payload_len;
    for (i, b) in esp[trailer..trailer + pad].iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    esp[trailer + pad] = pad as u8;
    esp[trailer + pad + 1] = next_header;
    seal_raw(cipher, spi, seq, seq_hi, iv, esp)?;
    Ok(needed)
}

/// Seals `esp` whose bytes between the IV and the last 16 (the ICV's place) are the whole
/// plaintext, trailer included.
fn seal_raw(
    cipher: &EspCipher,
    spi: u32,
    seq: u32,
    seq_hi: Option<u32>,
    iv: [u8; ESP_IV_LEN],
    esp: &mut [u8],
) -> Result<(), SealError> {
    let available = esp.len();
    let icv_at = available
        .checked_sub(ESP_ICV_LEN)
        .filter(|&n| n >= ESP_PREFIX_LEN)
        .ok_or(SealError::BufferTooSmall {
            needed: ESP_PREFIX_LEN + ESP_ICV_LEN,
            available,
        })?;
    let aad = Aad::new(spi, seq, seq_hi);
    esp[..4].copy_from_slice(&spi.to_be_bytes());
    esp[4..ESP_HEADER_LEN].copy_from_slice(&seq.to_be_bytes());
    esp[ESP_HEADER_LEN..ESP_PREFIX_LEN].copy_from_slice(&iv);
    let (body, icv) = esp.split_at_mut(icv_at);
    let tag = cipher
        .key
        .seal_in_place_separate_tag(
            cipher.nonce(&iv),
            aead::Aad::from(aad.as_bytes()),
            &mut body[ESP_PREFIX_LEN..],
        )
        .map_err(|_| SealError::TooLong)?;
    icv.copy_from_slice(tag.as_ref());
    Ok(())
}

/// RFC 4106 §5 AAD: SPI ‖ 32-bit sequence number, or SPI ‖ 64-bit ESN.
struct Aad {
    bytes: [u8; 12],
    len: usize,
}

impl Aad {
    fn new(spi: u32, seq: u32, seq_hi: Option<u32>) -> Aad {
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&spi.to_be_bytes());
        let len = match seq_hi {
            None => {
                bytes[4..8].copy_from_slice(&seq.to_be_bytes());
                8
            }
            Some(hi) => {
                bytes[4..8].copy_from_slice(&hi.to_be_bytes());
                bytes[8..12].copy_from_slice(&seq.to_be_bytes());
                12
            }
        };
        Aad { bytes, len }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What [`esp_open`] found in a verified ESP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EspOpened {
    /// The packet's SPI.
    pub spi: u32,
    /// The packet's sequence number (its low 32 bits, with ESN).
    pub seq: u32,
    /// Bytes of payload (before padding), now at the start of the buffer.
    pub payload_len: usize,
    /// The pad length field.
    pub pad_len: u8,
    /// The next header field (4: an IPv4 packet, tunnel mode).
    pub next_header: u8,
}

/// Why [`esp_open`] refused an ESP packet. Small and `Copy`: a hot-path outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Too short for header, IV, a 4-byte aligned trailer and the ICV.
    #[error("ESP packet too short")]
    Truncated,
    /// The ciphertext does not end on a 4-byte boundary (RFC 4303 §2.4).
    #[error("ESP ciphertext not 4-byte aligned")]
    Misaligned,
    /// The ICV does not match: wrong key, or the packet was altered.
    #[error("ESP ICV mismatch")]
    Integrity,
    /// Authentic, but the pad length or the padding bytes are wrong.
    #[error("ESP padding invalid")]
    BadPadding,
}

/// Verifies and decrypts the ESP packet `buf[esp_at..]` (header through ICV, nothing
/// after it) and moves the plaintext to the start of `buf`, overwriting what is before
/// the packet (an outer IP header, for tunnel mode). With extended sequence numbers,
/// `seq_hi` is the high half the receiver inferred ([`ReplayWindow::infer_esn`]); it is
/// authenticated, not transmitted.
///
/// On success `buf[..payload_len]` is the payload; the trailer is checked (padding bytes
/// 1, 2, 3, …). [`OpenError::BadPadding`] is returned only for authentic packets. On any
/// error the contents of `buf` are unspecified.
pub fn esp_open(
    cipher: &EspCipher,
    buf: &mut [u8],
    esp_at: usize,
    seq_hi: Option<u32>,
) -> Result<EspOpened, OpenError> {
    let esp = buf.get(esp_at..).ok_or(OpenError::Truncated)?;
    // Smallest ciphertext: 4 bytes (2 of padding, pad length, next header).
    if esp.len() < ESP_PREFIX_LEN + 4 + ESP_ICV_LEN {
        return Err(OpenError::Truncated);
    }
    let ct_len = esp.len() - ESP_PREFIX_LEN - ESP_ICV_LEN;
    if ct_len % 4 != 0 {
        return Err(OpenError::Misaligned);
    }
    let (spi, seq) = esp_header(esp).ok_or(OpenError::Truncated)?;
    let mut iv = [0u8; ESP_IV_LEN];
    iv.copy_from_slice(&esp[ESP_HEADER_LEN..ESP_PREFIX_LEN]);
    let plain = cipher
        .key
        .open_within(
            cipher.nonce(&iv),
            aead::Aad::from(Aad::new(spi, seq, seq_hi).as_bytes()),
            buf,
            esp_at + ESP_PREFIX_LEN..,
        )
        .map_err(|_| OpenError::Integrity)?;
    let n = plain.len();
    let next_header = plain[n - 1];
    let pad_len = plain[n - 2];
    let payload_len = n
        .checked_sub(2 + pad_len as usize)
        .ok_or(OpenError::BadPadding)?;
    let padding_ok = plain[payload_len..n - 2]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == i as u8 + 1);
    if !padding_ok {
        return Err(OpenError::BadPadding);
    }
    Ok(EspOpened {
        spi,
        seq,
        payload_len,
        pad_len,
        next_header,
    })
}

// ---------------------------------------------------------------------------------------
// Anti-replay window
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------------------

/// What happens to traffic that is neither inbound ESP nor matched by an outbound SA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    /// Let it through in clear (an RFC 4301 BYPASS).
    Pass,
    /// Drop it, counted as [`DropCause::Policy`] (an RFC 4301 DISCARD).
    #[default]
    Drop,
}

/// MAC addresses written into frames leaving in one direction.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EthRewrite {
    /// Source MAC (`aa:bb:cc:dd:ee:ff`); unchanged when absent.
    pub src: Option<String>,
    /// Destination MAC; unchanged when absent.
    pub dst: Option<String>,
}

/// One outbound SA: traffic to `selector` is encapsulated towards `remote`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundSaPolicy {
    /// SPI the peer chose for this SA (256 and up; 0–255 are reserved).
    pub spi: u32,
    /// Hex keying material: 32-byte AES-256 key then 4-byte salt (72 hex digits, optional `0x`).
    pub key: String,
    /// Outer source address: this gateway's tunnel endpoint.
    pub local: String,
    /// Outer destination address: the peer's tunnel endpoint.
    pub remote: String,
    /// Inner destination prefix (`10.2.0.0/16`) sent through this SA.
    pub selector: String,
    /// Outer TTL (default 64).
    pub ttl: Option<u8>,
    /// Extended (64-bit) sequence numbers, RFC 4303 §2.2.1; both ends must agree.
    #[serde(default)]
    pub esn: bool,
}

/// One inbound SA: ESP from `remote` to `local` with this SPI is decapsulated.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboundSaPolicy {
    /// SPI this gateway chose for the SA (256 and up).
    pub spi: u32,
    /// Hex keying material: 32-byte AES-256 key then 4-byte salt.
    pub key: String,
    /// Outer destination address: this gateway's tunnel endpoint.
    pub local: String,
    /// Outer source address: the peer's tunnel endpoint.
    pub remote: String,
    /// Inner source prefix the SA may carry; any when absent.
    pub selector: Option<String>,
    /// Anti-replay window for this SA (default: the tenant's `replay_window`).
    pub replay_window: Option<u32>,
    /// Extended (64-bit) sequence numbers; both ends must agree.
    #[serde(default)]
    pub esn: bool,
}

/// A tenant's IPsec policy (see the module doc for a TOML example).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpsecPolicy {
    /// Outbound SAs, selected by inner destination (longest prefix).
    #[serde(default)]
    pub outbound: Vec<OutboundSaPolicy>,
    /// Inbound SAs, selected by SPI.
    #[serde(default)]
    pub inbound: Vec<InboundSaPolicy>,
    /// Default anti-replay window in packets (64).
    pub replay_window: Option<u32>,
    /// Traffic matching no SA: `"pass"` or `"drop"` (default).
    #[serde(default)]
    pub unmatched: Unmatched,
    /// Largest outer IPv4 packet (total length); larger ones are dropped, not fragmented.
    pub mtu: Option<u16>,
    /// Forward encapsulated packets to this port (default: [`Verdict::Pass`]).
    pub outbound_port: Option<PortId>,
    /// Forward decapsulated packets to this port (default: [`Verdict::Pass`]).
    pub inbound_port: Option<PortId>,
    /// MAC addresses for encapsulated frames.
    pub outbound_eth: Option<EthRewrite>,
    /// MAC addresses for decapsulated frames.
    pub inbound_eth: Option<EthRewrite>,
}

/// An IPv4 prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prefix {
    addr: u32,
    len: u8,
}

impl Prefix {
    fn mask(self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - self.len)
        }
    }

    #[inline]
    fn contains(self, a: [u8; 4]) -> bool {
        u32::from_be_bytes(a) & self.mask() == self.addr
    }

    fn parse(s: &str) -> Result<Prefix, String> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}` is not a prefix (expected a.b.c.d/len)"))?;
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("`{a}` is not an IPv4 address"))?;
        let len: u8 = l
            .parse()
            .ok()
            .filter(|&n| n <= 32)
            .ok_or_else(|| format!("prefix length `{l}` is not 0..=32"))?;
        let p = Prefix {
            addr: u32::from(addr),
            len,
        };
        if p.addr & !p.mask() != 0 {
            return Err(format!("`{s}` has host bits set"));
        }
        Ok(p)
    }
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let h = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if h.is_empty() {
        return Err("must not be empty".into());
    }
    if h.len() % 2 != 0 {
        return Err(format!("odd number of hex digits ({})", h.len()));
    }
    h.as_bytes()
        .chunks(2)
        .map(|p| {
            let d = |c: u8| (c as char).to_digit(16);
            match (d(p[0]), d(p[1])) {
                (Some(hi), Some(lo)) => Ok((hi * 16 + lo) as u8),
                _ => Err(format!(
                    "`{}` is not hexadecimal",
                    String::from_utf8_lossy(p)
                )),
            }
        })
        .collect()
}

fn parse_key(field: &str, s: &str) -> Result<(EspCipher, [u8; 32]), InitError> {
    let bytes = parse_hex(s).map_err(|m| InitError::invalid(field, m))?;
    if bytes.len() != KEYMAT_LEN {
        return Err(InitError::invalid(
            field,
            format!(
                "must be {KEYMAT_LEN} bytes (a 32-byte AES-256 key followed by the 4-byte salt), got {}",
                bytes.len()
            ),
        ));
    }
    let cipher = EspCipher::new(&bytes).map_err(|e| InitError::invalid(field, e.to_string()))?;
    let mut aes = [0u8; 32];
    aes.copy_from_slice(&bytes[..32]);
    Ok((cipher, aes))
}

fn parse_addr(field: &str, s: &str) -> Result<[u8; 4], InitError> {
    s.parse::<Ipv4Addr>()
        .map(|a| a.octets())
        .map_err(|_| InitError::invalid(field, format!("`{s}` is not an IPv4 address")))
}

fn parse_spi(field: &str, spi: u32) -> Result<u32, InitError> {
    if spi < 256 {
        return Err(InitError::invalid(
            field,
            format!("SPI {spi} is reserved (RFC 4303: 0-255); use 256 or more"),
        ));
    }
    Ok(spi)
}

fn parse_window(field: &str, w: u32) -> Result<u32, InitError> {
    if w == 0 || w > MAX_REPLAY_WINDOW {
        return Err(InitError::invalid(
            field,
            format!("{w} is not 1..={MAX_REPLAY_WINDOW} packets"),
        ));
    }
    Ok(w)
}

fn parse_mac(field: &str, s: &str) -> Result<[u8; 6], InitError> {
    policy::parse_mac(s).map_err(|e| InitError::invalid(field, e.to_string()))
}

fn parse_eth(field: &str, e: &Option<EthRewrite>) -> Result<Option<MacRewrite>, InitError> {
    let Some(e) = e else { return Ok(None) };
    let src = e
        .src
        .as_deref()
        .map(|s| parse_mac(&format!("{field}.src"), s))
        .transpose()?;
    let dst = e
        .dst
        .as_deref()
        .map(|s| parse_mac(&format!("{field}.dst"), s))
        .transpose()?;
    Ok(Some(MacRewrite { src, dst }))
}

// ---------------------------------------------------------------------------------------
// Per-tenant state
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Default)]
struct MacRewrite {
    src: Option<[u8; 6]>,
    dst: Option<[u8; 6]>,
}

impl MacRewrite {
    fn apply(self, frame: &mut [u8]) {
        if let Some(d) = self.dst {
            frame[..6].copy_from_slice(&d);
        }
        if let Some(s) = self.src {
            frame[6..12].copy_from_slice(&s);
        }
    }
}

#[derive(Debug)]
struct OutboundSa {
    spi: u32,
    cipher: EspCipher,
    local: [u8; 4],
    remote: [u8; 4],
    selector: Prefix,
    ttl: u8,
    esn: bool,
    /// Next sequence number to send (the IV, and with ESN the whole 64-bit number).
    next_seq: u64,
    /// The last number (2³² − 1, or 2⁶⁴ − 1 with ESN) was sent.
    exhausted: bool,
}

#[derive(Debug)]
struct InboundSa {
    spi: u32,
    cipher: EspCipher,
    local: [u8; 4],
    remote: [u8; 4],
    selector: Option<Prefix>,
    esn: bool,
    window: ReplayWindow,
}

/// Every outcome of the IPsec NF for one tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpsecCounters {
    /// Packets encapsulated (outbound).
    pub encapsulated: u64,
    /// Packets decapsulated (inbound).
    pub decapsulated: u64,
    /// Unmatched packets passed in clear.
    pub bypassed: u64,
    /// Unmatched packets dropped ([`DropCause::Policy`]).
    pub unmatched_dropped: u64,
    /// Inbound ESP with an SPI the tenant has no SA for ([`DropCause::Integrity`]).
    pub unknown_spi: u64,
    /// Inbound ESP whose outer addresses are not its SA's endpoints ([`DropCause::Integrity`]).
    pub wrong_endpoint: u64,
    /// Inbound ESP whose ICV did not verify ([`DropCause::Integrity`]).
    pub bad_icv: u64,
    /// Inbound ESP with a sequence number already received ([`DropCause::Replay`]).
    pub replayed: u64,
    /// Inbound ESP with a sequence number left of the window ([`DropCause::Replay`]).
    pub too_old: u64,
    /// Inbound ESP too short to hold header, IV, trailer and ICV ([`DropCause::Malformed`]).
    pub truncated: u64,
    /// Inbound ESP whose ciphertext is not 4-byte aligned ([`DropCause::Malformed`]).
    pub misaligned: u64,
    /// Inbound ESP in an IP fragment: no reassembly ([`DropCause::Malformed`]).
    pub fragmented: u64,
    /// Authentic inbound ESP with bad padding ([`DropCause::Malformed`]).
    pub bad_padding: u64,
    /// Authentic inbound ESP whose next header is not 4 ([`DropCause::Malformed`]).
    pub bad_next_header: u64,
    /// Authentic inbound ESP whose payload is not a whole IPv4 packet ([`DropCause::Malformed`]).
    pub bad_inner: u64,
    /// Dummy packets (next header 59), discarded as RFC 4303 says ([`DropCause::Policy`]).
    pub dummy: u64,
    /// Decapsulated packets whose inner source is outside the SA's selector ([`DropCause::Policy`]).
    pub selector_mismatch: u64,
    /// Packets that would exceed the buffer or the tenant's MTU once encapsulated ([`DropCause::Policy`]).
    pub too_big: u64,
    /// Packets for an SA whose 2³² − 1 sequence numbers are used up ([`DropCause::Policy`]).
    pub seq_exhausted: u64,
}

impl IpsecCounters {
    /// The counters with stable names (stats JSON keys).
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("esp_encapsulated", self.encapsulated),
            ("esp_decapsulated", self.decapsulated),
            ("esp_bypassed", self.bypassed),
            ("esp_unmatched_dropped", self.unmatched_dropped),
            ("esp_unknown_spi", self.unknown_spi),
            ("esp_wrong_endpoint", self.wrong_endpoint),
            ("esp_bad_icv", self.bad_icv),
            ("esp_replayed", self.replayed),
            ("esp_too_old", self.too_old),
            ("esp_truncated", self.truncated),
            ("esp_misaligned", self.misaligned),
            ("esp_fragmented", self.fragmented),
            ("esp_bad_padding", self.bad_padding),
            ("esp_bad_next_header", self.bad_next_header),
            ("esp_bad_inner", self.bad_inner),
            ("esp_dummy", self.dummy),
            ("esp_selector_mismatch", self.selector_mismatch),
            ("esp_too_big", self.too_big),
            ("esp_seq_exhausted", self.seq_exhausted),
        ]
    }
}

/// One tenant's IPsec state: its SAs (keys, sequence counters, replay windows), its
/// policy choices and its counters. Built by [`IpsecState::from_policy`].
#[derive(Debug, Default)]
pub struct IpsecState {
    /// Longest selector first, so the first match is the longest-prefix match.
    outbound: Vec<OutboundSa>,
    /// Sorted by SPI.
    inbound: Vec<InboundSa>,
    /// This tenant's tunnel endpoints (every SA's `local`), sorted.
    endpoints: Vec<[u8; 4]>,
    unmatched: Unmatched,
    mtu: Option<u16>,
    outbound_port: Option<PortId>,
    inbound_port: Option<PortId>,
    outbound_eth: Option<MacRewrite>,
    inbound_eth: Option<MacRewrite>,
    counters: IpsecCounters,
}

impl IpsecState {
    /// Validates `policy` and builds the state; at most `max_sas` SAs per direction.
    ///
    /// Errors name the policy field: a key that is empty, not hex, or not 36 bytes; a
    /// reserved or duplicate SPI; a bad address or prefix; two outbound SAs with the same
    /// selector; an AES key used by two SAs (GCM nonces would repeat across them); a
    /// window, TTL or MTU out of range.
    pub fn from_policy(policy: &IpsecPolicy, max_sas: usize) -> Result<Self, InitError> {
        for (name, n) in [
            ("outbound", policy.outbound.len()),
            ("inbound", policy.inbound.len()),
        ] {
            if n > max_sas {
                return Err(InitError::invalid(
                    name,
                    format!("{n} SAs exceed the registered maximum of {max_sas}"),
                ));
            }
        }
        let default_window = match policy.replay_window {
            Some(w) => parse_window("replay_window", w)?,
            None => DEFAULT_REPLAY_WINDOW,
        };
        if let Some(mtu) = policy.mtu {
            if mtu < 68 {
                return Err(InitError::invalid(
                    "mtu",
                    format!("{mtu} is below IPv4's minimum of 68"),
                ));
            }
        }
        let mut keys: Vec<([u8; 32], String)> = Vec::new();
        let mut check_key_reuse = |aes: [u8; 32], field: String| -> Result<(), InitError> {
            if let Some((_, other)) = keys.iter().find(|(k, _)| *k == aes) {
                return Err(InitError::invalid(
                    field,
                    format!(
                        "the same AES key is used by `{other}`; every SA needs its own key \
                         (AES-GCM nonces would repeat across them)"
                    ),
                ));
            }
            keys.push((aes, field));
            Ok(())
        };

        let mut outbound = Vec::with_capacity(policy.outbound.len());
        for (i, sa) in policy.outbound.iter().enumerate() {
            let f = |name: &str| format!("outbound[{i}].{name}");
            let spi = parse_spi(&f("spi"), sa.spi)?;
            let (cipher, aes) = parse_key(&f("key"), &sa.key)?;
            check_key_reuse(aes, f("key"))?;
            let local = parse_addr(&f("local"), &sa.local)?;
            let remote = parse_addr(&f("remote"), &sa.remote)?;
            let selector =
                Prefix::parse(&sa.selector).map_err(|m| InitError::invalid(f("selector"), m))?;
            let ttl = sa.ttl.unwrap_or(DEFAULT_TTL);
            if ttl == 0 {
                return Err(InitError::invalid(f("ttl"), "must be at least 1"));
            }
            if let Some(j) = policy.outbound[..i]
                .iter()
                .position(|o| o.spi == sa.spi && parse_addr("", &o.remote).ok() == Some(remote))
            {
                return Err(InitError::invalid(
                    f("spi"),
                    format!(
                        "duplicate SPI {:#x} towards {} (also outbound[{j}])",
                        sa.spi, sa.remote
                    ),
                ));
            }
            if let Some(j) = outbound
                .iter()
                .position(|o: &OutboundSa| o.selector == selector)
            {
                return Err(InitError::invalid(
                    f("selector"),
                    format!("`{}` is already the selector of outbound[{j}]", sa.selector),
                ));
            }
            outbound.push(OutboundSa {
                spi,
                cipher,
                local,
                remote,
                selector,
                ttl,
                esn: sa.esn,
                next_seq: 1,
                exhausted: false,
            });
        }
        outbound.sort_by_key(|sa| std::cmp::Reverse(sa.selector.len));

        let mut inbound: Vec<InboundSa> = Vec::with_capacity(policy.inbound.len());
        for (i, sa) in policy.inbound.iter().enumerate() {
            let f = |name: &str| format!("inbound[{i}].{name}");
            let spi = parse_spi(&f("spi"), sa.spi)?;
            if let Some(j) = policy.inbound[..i].iter().position(|o| o.spi == sa.spi) {
                return Err(InitError::invalid(
                    f("spi"),
                    format!("duplicate SPI {:#x} (also inbound[{j}])", sa.spi),
                ));
            }
            let (cipher, aes) = parse_key(&f("key"), &sa.key)?;
            check_key_reuse(aes, f("key"))?;
            let local = parse_addr(&f("local"), &sa.local)?;
            let remote = parse_addr(&f("remote"), &sa.remote)?;
            let selector = sa
                .selector
                .as_deref()
                .map(Prefix::parse)
                .transpose()
                .map_err(|m| InitError::invalid(f("selector"), m))?;
            let window = match sa.replay_window {
                Some(w) => parse_window(&f("replay_window"), w)?,
                None => default_window,
            };
            inbound.push(InboundSa {
                spi,
                cipher,
                local,
                remote,
                selector,
                esn: sa.esn,
                window: ReplayWindow::new(window),
            });
        }
        inbound.sort_by_key(|sa| sa.spi);

        let mut endpoints: Vec<[u8; 4]> = outbound
            .iter()
            .map(|sa| sa.local)
            .chain(inbound.iter().map(|sa| sa.local))
            .collect();
        endpoints.sort_unstable();
        endpoints.dedup();

        Ok(IpsecState {
            outbound,
            inbound,
            endpoints,
            unmatched: policy.unmatched,
            mtu: policy.mtu,
            outbound_port: policy.outbound_port,
            inbound_port: policy.inbound_port,
            outbound_eth: parse_eth("outbound_eth", &policy.outbound_eth)?,
            inbound_eth: parse_eth("inbound_eth", &policy.inbound_eth)?,
            counters: IpsecCounters::default(),
        })
    }

    /// The tenant's counters.
    pub fn counters(&self) -> &IpsecCounters {
        &self.counters
    }

    /// Sequence number the outbound SA with `spi` will use next (`None`: no such SA).
    pub fn next_outbound_seq(&self, spi: u32) -> Option<u64> {
        self.outbound
            .iter()
            .find(|sa| sa.spi == spi)
            .map(|sa| sa.next_seq)
    }

    /// Highest sequence number accepted on the inbound SA with `spi`.
    pub fn inbound_top(&self, spi: u32) -> Option<u64> {
        self.inbound
            .iter()
            .find(|sa| sa.spi == spi)
            .map(|sa| sa.window.top())
    }

    /// Processes one packet of this tenant (see the module doc). Never panics, never
    /// allocates.
    pub fn process(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        let Some(ip) = pkt.ipv4() else {
            return self.unmatched();
        };
        let (src, dst, proto) = (ip.source(), ip.destination(), ip.protocol().0);
        let fragment = ip.more_fragments() || ip.fragments_offset().value() != 0;
        if proto == IPPROTO_ESP && self.endpoints.binary_search(&dst).is_ok() {
            if fragment {
                self.counters.fragmented += 1;
                return Verdict::Drop(DropCause::Malformed);
            }
            return self.decapsulate(pkt, src, dst);
        }
        match self
            .outbound
            .iter()
            .position(|sa| sa.selector.contains(dst))
        {
            Some(i) => self.encapsulate(pkt, i),
            None => self.unmatched(),
        }
    }

    fn unmatched(&mut self) -> Verdict {
        match self.unmatched {
            Unmatched::Pass => {
                self.counters.bypassed += 1;
                Verdict::Pass
            }
            Unmatched::Drop => {
                self.counters.unmatched_dropped += 1;
                Verdict::Drop(DropCause::Policy)
            }
        }
    }

    fn encapsulate(&mut self, pkt: &mut Packet<'_>, sa: usize) -> Verdict {
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

    fn decapsulate(&mut self, pkt: &mut Packet<'_>, src: [u8; 4], dst: [u8; 4]) -> Verdict {
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
        if sa.selector.is_some_and(|p| !p.contains(inner_src)) {
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

// ---------------------------------------------------------------------------------------
// The NF
// ---------------------------------------------------------------------------------------

/// The IPsec gateway NF (multi-tenant).
#[derive(Debug, Clone)]
pub struct Ipsec {
    max_sas: usize,
}

impl Default for Ipsec {
    fn default() -> Self {
        Ipsec {
            max_sas: DEFAULT_MAX_SAS,
        }
    }
}

impl Ipsec {
    /// An IPsec NF whose tenants may have up to `max_sas` SAs in each direction.
    pub fn with_max_sas(max_sas: usize) -> Self {
        Ipsec { max_sas }
    }
}

impl NetworkFunction for Ipsec {
    type State = IpsecState;
    type Policy = IpsecPolicy;

    fn name(&self) -> &'static str {
        "ipsec"
    }

    fn register(&self) -> MemorySpec {
        let window_words = (DEFAULT_REPLAY_WINDOW.div_ceil(64) as usize + 1).next_power_of_two();
        let per_pair = std::mem::size_of::<OutboundSa>()
            + std::mem::size_of::<InboundSa>()
            + window_words * 8
            + 2 * std::mem::size_of::<[u8; 4]>();
        MemorySpec::with_extra::<IpsecState>(self.max_sas * per_pair)
    }

    fn init(&self, policy: &IpsecPolicy, state: &mut IpsecState) -> Result<(), InitError> {
        *state = IpsecState::from_policy(policy, self.max_sas)?;
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut IpsecState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &IpsecState) -> Vec<(&'static str, u64)> {
        state.counters().named()
    }
}

/// The single-tenant IPsec gateway: the same logic over one plain state, no framework.
/// The benchmark baseline.
#[derive(Debug)]
pub struct SingleTenantIpsec {
    /// The one tenant's state.
    pub state: IpsecState,
}

impl SingleTenantIpsec {
    /// A gateway with `policy` (no limit on SAs beyond the policy's own).
    pub fn new(policy: &IpsecPolicy) -> Result<Self, InitError> {
        let max = policy.outbound.len().max(policy.inbound.len());
        Ok(SingleTenantIpsec {
            state: IpsecState::from_policy(policy, max)?,
        })
    }

    /// Processes one packet.
    #[inline]
    pub fn handle(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        self.state.process(pkt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use buffet_sdk::{PacketMeta, TenantId};
    use etherparse::PacketBuilder;
    use std::collections::BTreeSet;

    const GW_A: &str = "203.0.113.1";
    const GW_B: &str = "198.51.100.1";
    const BUF: usize = 2048;

    fn key(seed: u8) -> String {
        (0..KEYMAT_LEN as u8)
            .map(|i| format!("{:02x}", i.wrapping_mul(7) ^ seed))
            .collect()
    }

    fn out_sa(spi: u32, k: &str, selector: &str) -> OutboundSaPolicy {
        OutboundSaPolicy {
            spi,
            key: k.into(),
            local: GW_A.into(),
            remote: GW_B.into(),
            selector: selector.into(),
            ttl: None,
            esn: false,
        }
    }

    fn in_sa(spi: u32, k: &str) -> InboundSaPolicy {
        InboundSaPolicy {
            spi,
            key: k.into(),
            local: GW_B.into(),
            remote: GW_A.into(),
            selector: None,
            replay_window: None,
            esn: false,
        }
    }

    /// Gateway A encrypts 10.2/16 with SPI 0x1001; gateway B is its peer.
    fn pair() -> (IpsecState, IpsecState) {
        let a = IpsecPolicy {
            outbound: vec![out_sa(0x1001, &key(1), "10.2.0.0/16")],
            ..Default::default()
        };
        let b = IpsecPolicy {
            inbound: vec![in_sa(0x1001, &key(1))],
            ..Default::default()
        };
        (
            IpsecState::from_policy(&a, 8).unwrap(),
            IpsecState::from_policy(&b, 8).unwrap(),
        )
    }

    fn udp(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(src, dst, 33)
            .udp(4000, 5000)
            .write(&mut v, payload)
            .unwrap();
        v
    }

    /// Runs `frame` through `st` in a 2048-byte buffer; returns the verdict and the frame after.
    fn run(st: &mut IpsecState, frame: &[u8]) -> (Verdict, Vec<u8>) {
        let mut buf = vec![0xa5u8; BUF];
        buf[..frame.len()].copy_from_slice(frame);
        let meta = PacketMeta {
            tenant: TenantId(1),
            ..Default::default()
        };
        let mut pkt = Packet::parse_with_capacity(&mut buf, frame.len(), meta).unwrap();
        let v = st.process(&mut pkt);
        let out = pkt.data().to_vec();
        (v, out)
    }

    fn esp_frame(a: &mut IpsecState, payload: &[u8]) -> Vec<u8> {
        let (v, out) = run(a, &udp([10, 1, 0, 1], [10, 2, 0, 1], payload));
        assert_eq!(v, Verdict::Pass);
        out
    }

    #[test]
    fn encapsulates_and_decapsulates_every_padding_length() {
        let (mut a, mut b) = pair();
        for n in 0..40usize {
            let payload: Vec<u8> = (0..n as u8).collect();
            let inner = udp([10, 1, 0, 1], [10, 2, 0, 1], &payload);
            let enc = esp_frame(&mut a, &payload);
            let inner_ip = &inner[14..];
            assert_eq!(enc.len(), 14 + 20 + esp_len(inner_ip.len()));
            assert_eq!(enc[..14], inner[..14], "L2 header kept");
            let outer = Ipv4HeaderSlice::from_slice(&enc[14..]).unwrap();
            assert_eq!(outer.protocol(), IpNumber(50));
            assert_eq!(outer.source(), [203, 0, 113, 1]);
            assert_eq!(outer.destination(), [198, 51, 100, 1]);
            assert_eq!(outer.ttl(), DEFAULT_TTL);
            assert_eq!(outer.total_len() as usize, enc.len() - 14);
            assert_eq!(
                outer.header_checksum(),
                outer.to_header().calc_header_checksum()
            );
            let (spi, seq) = esp_header(&enc[34..]).unwrap();
            assert_eq!((spi, seq), (0x1001, n as u32 + 1));
            assert_eq!(
                &enc[42..50],
                &u64::from(seq).to_be_bytes(),
                "IV is the sequence number"
            );
            assert!(!enc.windows(payload.len().max(4)).any(|w| w == &payload[..]) || n < 4);
            let (v, dec) = run(&mut b, &enc);
            assert_eq!(v, Verdict::Pass, "n={n}");
            assert_eq!(dec, inner, "n={n}");
        }
        assert_eq!(a.counters().encapsulated, 40);
        assert_eq!(b.counters().decapsulated, 40);
        assert_eq!(a.next_outbound_seq(0x1001), Some(41));
        assert_eq!(b.inbound_top(0x1001), Some(40));
    }

    #[test]
    fn copies_dscp_and_df_and_strips_ethernet_padding() {
        let (mut a, mut b) = pair();
        let mut inner = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 1, 0, 1], [10, 2, 0, 1], 9)
            .udp(1, 2)
            .write(&mut inner, b"x")
            .unwrap();
        inner[15] = (46 << 2) | 1; // DSCP EF, ECN ECT(1)
        let mut ip = Ipv4HeaderSlice::from_slice(&inner[14..])
            .unwrap()
            .to_header();
        ip.header_checksum = ip.calc_header_checksum();
        inner[14..34].copy_from_slice(&ip.to_bytes());
        let mut padded = inner.clone();
        padded.extend_from_slice(&[0; 17]);
        let (_, enc) = run(&mut a, &padded);
        let outer = Ipv4HeaderSlice::from_slice(&enc[14..]).unwrap();
        assert_eq!(outer.dcp().value(), 46);
        assert_eq!(
            outer.ecn().value(),
            0,
            "outer ECN not-ECT (RFC 6040 compatibility)"
        );
        assert!(outer.dont_fragment());
        let (_, dec) = run(&mut b, &enc);
        assert_eq!(dec, inner, "inner TOS untouched, Ethernet padding gone");
    }

    #[test]
    fn longest_prefix_selects_the_outbound_sa() {
        let p = IpsecPolicy {
            outbound: vec![
                out_sa(0x1001, &key(1), "10.0.0.0/8"),
                out_sa(0x1002, &key(2), "10.2.3.0/24"),
                out_sa(0x1003, &key(3), "0.0.0.0/0"),
            ],
            ..Default::default()
        };
        let mut st = IpsecState::from_policy(&p, 8).unwrap();
        for (dst, spi) in [
            ([10, 2, 3, 4], 0x1002),
            ([10, 2, 4, 4], 0x1001),
            ([8, 8, 8, 8], 0x1003),
        ] {
            let (_, enc) = run(&mut st, &udp([10, 1, 0, 1], dst, b"p"));
            assert_eq!(esp_header(&enc[34..]).unwrap().0, spi, "{dst:?}");
        }
    }

    #[test]
    fn unmatched_traffic_passes_or_drops_per_policy() {
        let (mut a, _) = pair();
        let clear = udp([10, 1, 0, 1], [10, 3, 0, 1], b"clear");
        assert_eq!(
            run(&mut a, &clear),
            (Verdict::Drop(DropCause::Policy), clear.clone())
        );
        let mut v6 = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6([1; 16], [2; 16], 4)
            .udp(1, 2)
            .write(&mut v6, b"six")
            .unwrap();
        assert_eq!(run(&mut a, &v6).0, Verdict::Drop(DropCause::Policy));
        assert_eq!(a.counters().unmatched_dropped, 2);

        let p = IpsecPolicy {
            unmatched: Unmatched::Pass,
            ..Default::default()
        };
        let mut st = IpsecState::from_policy(&p, 8).unwrap();
        assert_eq!(run(&mut st, &clear), (Verdict::Pass, clear.clone()));
        assert_eq!(run(&mut st, &v6), (Verdict::Pass, v6));
        assert_eq!(st.counters().bypassed, 2);
    }

    #[test]
    fn ports_and_mac_rewrite() {
        let toml = format!(
            r#"
            outbound_port = 3
            inbound_port = 4
            outbound_eth = {{ src = "02:00:00:00:00:0a", dst = "02:00:00:00:00:0b" }}
            inbound_eth = {{ dst = "02-00-00-00-00-0c" }}
            [[outbound]]
            spi = 0x1001
            key = "{k1}"
            local = "{GW_A}"
            remote = "{GW_B}"
            selector = "10.2.0.0/16"
            ttl = 7
            [[inbound]]
            spi = 0x2001
            key = "0x{k2}"
            local = "{GW_A}"
            remote = "{GW_B}"
            "#,
            k1 = key(1),
            k2 = key(2)
        );
        let p: IpsecPolicy = toml::from_str(&toml).unwrap();
        let mut a = IpsecState::from_policy(&p, 8).unwrap();
        let (v, enc) = run(&mut a, &udp([10, 1, 0, 1], [10, 2, 0, 1], b"x"));
        assert_eq!(v, Verdict::Forward(3));
        assert_eq!(&enc[..12], &[2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa]);
        assert_eq!(Ipv4HeaderSlice::from_slice(&enc[14..]).unwrap().ttl(), 7);

        // The peer sends back through SPI 0x2001.
        let b = IpsecPolicy {
            outbound: vec![OutboundSaPolicy {
                local: GW_B.into(),
                remote: GW_A.into(),
                ..out_sa(0x2001, &key(2), "10.1.0.0/16")
            }],
            ..Default::default()
        };
        let mut b = IpsecState::from_policy(&b, 8).unwrap();
        let (_, back) = run(&mut b, &udp([10, 2, 0, 1], [10, 1, 0, 1], b"y"));
        let (v, dec) = run(&mut a, &back);
        assert_eq!(v, Verdict::Forward(4));
        assert_eq!(&dec[..6], &[2, 0, 0, 0, 0, 0xc]);
        assert_eq!(&dec[6..12], &[1; 6], "source MAC kept");
    }

    #[test]
    fn bad_icv_anywhere_is_an_integrity_drop() {
        let (mut a, mut b) = pair();
        let enc = esp_frame(&mut a, b"integrity");
        // Flip one bit in every byte after the SPI: seq, IV, ciphertext, ICV.
        for i in 38..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x10;
            let (v, _) = run(&mut b, &bad);
            assert_eq!(v, Verdict::Drop(DropCause::Integrity), "byte {i}");
        }
        assert_eq!(b.counters().bad_icv, (enc.len() - 38) as u64);
        assert_eq!(
            b.inbound_top(0x1001),
            Some(0),
            "failed packets never move the window"
        );
        assert_eq!(
            run(&mut b, &enc).0,
            Verdict::Pass,
            "the genuine packet still gets in"
        );
    }

    #[test]
    fn replayed_and_too_old_are_replay_drops() {
        let (mut a, mut b) = pair();
        let pkts: Vec<Vec<u8>> = (0..100).map(|i| esp_frame(&mut a, &[i as u8; 3])).collect();
        assert_eq!(run(&mut b, &pkts[5]).0, Verdict::Pass);
        assert_eq!(run(&mut b, &pkts[5]).0, Verdict::Drop(DropCause::Replay));
        assert_eq!(
            run(&mut b, &pkts[2]).0,
            Verdict::Pass,
            "out of order inside the window"
        );
        assert_eq!(run(&mut b, &pkts[99]).0, Verdict::Pass); // seq 100; window 37..=100
        assert_eq!(
            run(&mut b, &pkts[36]).0,
            Verdict::Pass,
            "seq 37 is the window's left edge"
        );
        assert_eq!(
            run(&mut b, &pkts[35]).0,
            Verdict::Drop(DropCause::Replay),
            "seq 36 too old"
        );
        assert_eq!(run(&mut b, &pkts[99]).0, Verdict::Drop(DropCause::Replay));
        let c = b.counters();
        assert_eq!((c.replayed, c.too_old, c.decapsulated), (2, 1, 4));
    }

    #[test]
    fn replay_window_matches_a_reference_model() {
        for size in [1u32, 2, 31, 32, 63, 64, 65, 100, 128, 1000, 4096] {
            // Start at 0 and just below 2^32 (the 32-bit and ESN boundary).
            for start in [0u64, (1 << 32) - 5_000] {
                let mut w = ReplayWindow::new(size);
                let mut seen = BTreeSet::new();
                let mut top = start;
                if start > 0 {
                    w.accept(start);
                    seen.insert(start);
                }
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(size) ^ start;
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly near the top, sometimes far behind, sometimes a jump ahead.
                    let r = x >> 8;
                    let seq = match x % 10 {
                        0 => r % (top + 1),
                        1 => top + r % 20_000,
                        _ => (top + 8).saturating_sub(r % (u64::from(size) + 16)),
                    };
                    let want = if seq == 0 || (seq <= top && top - seq >= u64::from(size)) {
                        Err(ReplayError::TooOld)
                    } else if seen.contains(&seq) {
                        Err(ReplayError::Duplicate)
                    } else {
                        Ok(())
                    };
                    // ESN inference recovers every number the window could still accept.
                    if seq > top.saturating_sub(u64::from(size)) && seq <= top + (1 << 31) {
                        assert_eq!(w.infer_esn(seq as u32), seq, "size {size} top {top}");
                    }
                    assert_eq!(w.check(seq), want, "size {size} top {top} seq {seq}");
                    if want.is_ok() {
                        w.accept(seq);
                        seen.insert(seq);
                        top = top.max(seq);
                    }
                }
                assert_eq!(w.top(), top);
            }
        }
    }

    #[test]
    fn replay_window_across_the_32_bit_boundary() {
        let max = u64::from(u32::MAX);
        let mut w = ReplayWindow::new(64);
        w.accept(max - 1);
        assert_eq!(w.check(max), Ok(()));
        w.accept(max);
        assert_eq!(w.check(max), Err(ReplayError::Duplicate));
        assert_eq!(w.check(max - 63), Ok(()));
        assert_eq!(w.check(max - 64), Err(ReplayError::TooOld));
        assert_eq!(w.check(0), Err(ReplayError::TooOld));
        // With ESN the counter goes on: low half 0 after the wrap is 2^32.
        assert_eq!(w.infer_esn(0), 1 << 32);
        assert_eq!(w.infer_esn(u32::MAX - 10), max - 10);
        w.accept(1 << 32);
        w.accept((1 << 32) + 5);
        // The window now straddles the wrap (case B): old low halves belong to 0.
        assert_eq!(w.infer_esn(u32::MAX - 3), max - 3);
        assert_eq!(w.infer_esn(3), (1 << 32) + 3);
        assert_eq!(w.check(max - 3), Ok(()));
        assert_eq!(w.check(max), Err(ReplayError::Duplicate));
        // An empty window guesses the first subspace.
        let fresh = ReplayWindow::new(64);
        assert_eq!((fresh.infer_esn(7), fresh.infer_esn(u32::MAX)), (7, max));
        assert_eq!(ReplayWindow::default().infer_esn(7), 7);
    }

    #[test]
    fn configured_window_size_is_used() {
        let (mut a, _) = pair();
        let p = IpsecPolicy {
            inbound: vec![InboundSaPolicy {
                replay_window: Some(4),
                ..in_sa(0x1001, &key(1))
            }],
            ..Default::default()
        };
        let mut b = IpsecState::from_policy(&p, 8).unwrap();
        let pkts: Vec<Vec<u8>> = (0..10).map(|_| esp_frame(&mut a, b"w")).collect();
        assert_eq!(run(&mut b, &pkts[9]).0, Verdict::Pass); // seq 10
        assert_eq!(run(&mut b, &pkts[6]).0, Verdict::Pass); // seq 7: 10 - 7 < 4
        assert_eq!(run(&mut b, &pkts[5]).0, Verdict::Drop(DropCause::Replay)); // seq 6
    }

    #[test]
    fn unknown_spi_and_wrong_endpoints_are_integrity_drops() {
        let (mut a, mut b) = pair();
        let enc = esp_frame(&mut a, b"spi");
        let mut other = enc.clone();
        other[37] ^= 1; // SPI 0x1000
        assert_eq!(run(&mut b, &other).0, Verdict::Drop(DropCause::Integrity));
        assert_eq!(b.counters().unknown_spi, 1);
        // Same SPI but from another source: rewrite the outer source and checksum.
        let mut spoof = enc.clone();
        let mut h = Ipv4HeaderSlice::from_slice(&spoof[14..])
            .unwrap()
            .to_header();
        h.source = [192, 0, 2, 66];
        h.header_checksum = h.calc_header_checksum();
        spoof[14..34].copy_from_slice(&h.to_bytes());
        assert_eq!(run(&mut b, &spoof).0, Verdict::Drop(DropCause::Integrity));
        assert_eq!(b.counters().wrong_endpoint, 1);
        // ESP to an address that is not ours is ordinary (unmatched) traffic.
        let mut elsewhere = enc.clone();
        h.source = [203, 0, 113, 1];
        h.destination = [192, 0, 2, 1];
        h.header_checksum = h.calc_header_checksum();
        elsewhere[14..34].copy_from_slice(&h.to_bytes());
        assert_eq!(run(&mut b, &elsewhere).0, Verdict::Drop(DropCause::Policy));
        assert_eq!(b.counters().unmatched_dropped, 1);
        assert_eq!(run(&mut b, &enc).0, Verdict::Pass);
    }

    /// An ESP frame from A to B whose plaintext is exactly `plain` (trailer included).
    fn crafted(spi: u32, seq: u32, k: &str, plain: &[u8]) -> Vec<u8> {
        let cipher = EspCipher::new(&parse_hex(k).unwrap()).unwrap();
        let mut esp = vec![0u8; ESP_PREFIX_LEN + plain.len() + ESP_ICV_LEN];
        esp[ESP_PREFIX_LEN..ESP_PREFIX_LEN + plain.len()].copy_from_slice(plain);
        seal_raw(&cipher, spi, seq, None, [9; 8], &mut esp).unwrap();
        let mut v = Vec::new();
        PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([203, 0, 113, 1], [198, 51, 100, 1], 64)
            .write(&mut v, IpNumber(50), &esp)
            .unwrap();
        v
    }

    #[test]
    fn authentic_but_malformed_payloads_are_counted() {
        let (_, mut b) = pair();
        let k = key(1);
        let inner = udp([10, 1, 0, 1], [10, 2, 0, 1], b"ok");
        let ip = &inner[14..]; // 30 bytes: pad 0
        let with = |trailer: &[u8]| [ip, trailer].concat();
        let cases: Vec<(Vec<u8>, DropCause, &str)> = vec![
            (with(&[0, 41]), DropCause::Malformed, "next header 41"),
            (with(&[0, 59]), DropCause::Policy, "dummy"),
            (
                [&ip[..28], &[9, 9, 2, 4]].concat(),
                DropCause::Malformed,
                "padding 9 9",
            ),
            (
                [&ip[..26], &[1, 2, 3, 4, 9, 4]].concat(),
                DropCause::Malformed,
                "pad length 9 > payload",
            ),
            (
                [&[0x45u8, 0, 0, 99][..], &ip[4..], &[0, 4]].concat(),
                DropCause::Malformed,
                "inner total length beyond payload",
            ),
            (
                [&[0x60u8][..], &ip[1..], &[0, 4]].concat(),
                DropCause::Malformed,
                "inner not IPv4",
            ),
            (vec![1, 2, 2, 4], DropCause::Malformed, "empty inner packet"),
        ];
        for (seq, (plain, cause, what)) in cases.iter().enumerate() {
            let f = crafted(0x1001, seq as u32 + 1, &k, plain);
            assert_eq!(run(&mut b, &f).0, Verdict::Drop(*cause), "{what}");
        }
        let c = b.counters();
        assert_eq!(
            (c.bad_next_header, c.dummy, c.bad_padding, c.bad_inner),
            (1, 1, 2, 3)
        );
        assert_eq!(
            b.inbound_top(0x1001),
            Some(cases.len() as u64),
            "authentic: window moved"
        );

        // TFC padding after the inner packet is stripped.
        let tfc = [ip, &[0xee; 8][..], &[1, 2, 3, 4, 4, 4]].concat();
        assert_eq!(tfc.len() % 4, 0);
        let (v, out) = run(&mut b, &crafted(0x1001, 100, &k, &tfc));
        assert_eq!((v, out), (Verdict::Pass, inner));
    }

    #[test]
    fn inbound_selector_limits_inner_sources() {
        let (mut a, _) = pair();
        let p = IpsecPolicy {
            inbound: vec![InboundSaPolicy {
                selector: Some("10.9.0.0/16".into()),
                ..in_sa(0x1001, &key(1))
            }],
            ..Default::default()
        };
        let mut b = IpsecState::from_policy(&p, 8).unwrap();
        let enc = esp_frame(&mut a, b"from 10.1.0.1");
        assert_eq!(run(&mut b, &enc).0, Verdict::Drop(DropCause::Policy));
        assert_eq!(b.counters().selector_mismatch, 1);
        let (v, _) = run(&mut a, &udp([10, 9, 0, 1], [10, 2, 0, 1], b"from 10.9"));
        assert_eq!(v, Verdict::Pass);
    }

    #[test]
    fn truncated_and_garbage_esp_never_panic() {
        let (mut a, mut b) = pair();
        let enc = esp_frame(&mut a, b"some payload to cut short");
        for cut in 34..enc.len() {
            let mut f = enc[..cut].to_vec();
            let mut h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap().to_header();
            h.total_len = (cut - 14) as u16;
            h.header_checksum = h.calc_header_checksum();
            f[14..34].copy_from_slice(&h.to_bytes());
            let (v, _) = run(&mut b, &f);
            assert!(
                matches!(
                    v,
                    Verdict::Drop(DropCause::Malformed | DropCause::Integrity)
                ),
                "cut {cut}: {v:?}"
            );
        }
        let c = *b.counters();
        assert!(
            c.truncated > 0 && c.misaligned > 0 && c.bad_icv > 0,
            "{c:?}"
        );
        assert_eq!(c.decapsulated, 0);
        // Random bit flips in SPI..ICV, random lengths, lengths kept consistent.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = 34 + (x as usize % (enc.len() - 33));
            let mut f = enc[..n].to_vec();
            for (i, byte) in f[34..].iter_mut().enumerate() {
                *byte ^= (x >> (i % 57)) as u8 & (x >> 60) as u8;
            }
            if n > 34 {
                f[34 + (x >> 20) as usize % (n - 34)] ^= 1 << ((x >> 40) % 8);
            }
            let mut h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap().to_header();
            h.total_len = (n - 14) as u16;
            h.header_checksum = h.calc_header_checksum();
            f[14..34].copy_from_slice(&h.to_bytes());
            let (v, _) = run(&mut b, &f);
            assert!(!v.is_pass(), "{f:02x?}");
        }
        assert_eq!(b.counters().decapsulated, 0);
    }

    #[test]
    fn fragments_of_esp_are_dropped() {
        let (mut a, mut b) = pair();
        let mut f = esp_frame(&mut a, b"frag");
        let mut h = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap().to_header();
        h.more_fragments = true;
        h.header_checksum = h.calc_header_checksum();
        f[14..34].copy_from_slice(&h.to_bytes());
        assert_eq!(run(&mut b, &f).0, Verdict::Drop(DropCause::Malformed));
        assert_eq!(b.counters().fragmented, 1);
    }

    #[test]
    fn no_room_or_beyond_mtu_is_counted_not_sent() {
        let (mut a, _) = pair();
        let mut frame = udp([10, 1, 0, 1], [10, 2, 0, 1], b"no room");
        let mut pkt = Packet::parse(&mut frame, PacketMeta::default()).unwrap();
        assert_eq!(a.process(&mut pkt), Verdict::Drop(DropCause::Policy));
        assert_eq!(a.counters().too_big, 1);
        assert_eq!(
            a.next_outbound_seq(0x1001),
            Some(1),
            "no sequence number spent"
        );

        let p = IpsecPolicy {
            mtu: Some(100),
            outbound: vec![out_sa(0x1001, &key(1), "10.2.0.0/16")],
            ..Default::default()
        };
        let mut st = IpsecState::from_policy(&p, 8).unwrap();
        // 28 + 18 = 46 inner bytes -> 20 + 16 + 46 + 0 + 2 + 16 = 100: fits exactly.
        assert_eq!(
            run(&mut st, &udp([10, 1, 0, 1], [10, 2, 0, 1], &[0; 18])).0,
            Verdict::Pass
        );
        assert_eq!(
            run(&mut st, &udp([10, 1, 0, 1], [10, 2, 0, 1], &[0; 19])).0,
            Verdict::Drop(DropCause::Policy)
        );
        assert_eq!(st.counters().too_big, 1);
    }

    #[test]
    fn exhausted_sequence_space_stops_the_sa() {
        let (mut a, mut b) = pair();
        a.outbound[0].next_seq = u64::from(u32::MAX);
        let last = esp_frame(&mut a, b"last");
        assert_eq!(esp_header(&last[34..]).unwrap().1, u32::MAX);
        let (v, _) = run(&mut a, &udp([10, 1, 0, 1], [10, 2, 0, 1], b"one more"));
        assert_eq!(v, Verdict::Drop(DropCause::Policy));
        assert_eq!(a.counters().seq_exhausted, 1);
        assert_eq!(run(&mut b, &last).0, Verdict::Pass);
    }

    fn esn_pair(a_esn: bool, b_esn: bool) -> (IpsecState, IpsecState) {
        let a = IpsecPolicy {
            outbound: vec![OutboundSaPolicy {
                esn: a_esn,
                ..out_sa(0x1001, &key(1), "10.2.0.0/16")
            }],
            ..Default::default()
        };
        let b = IpsecPolicy {
            inbound: vec![InboundSaPolicy {
                esn: b_esn,
                ..in_sa(0x1001, &key(1))
            }],
            ..Default::default()
        };
        (
            IpsecState::from_policy(&a, 8).unwrap(),
            IpsecState::from_policy(&b, 8).unwrap(),
        )
    }

    #[test]
    fn extended_sequence_numbers_cross_the_32_bit_wrap() {
        let (mut a, mut b) = esn_pair(true, true);
        let start = (1u64 << 32) - 3;
        a.outbound[0].next_seq = start;
        let pkts: Vec<Vec<u8>> = (0..8).map(|i| esp_frame(&mut a, &[i; 5])).collect();
        for (i, p) in pkts.iter().enumerate() {
            let full = start + i as u64;
            assert_eq!(
                esp_header(&p[34..]).unwrap().1,
                full as u32,
                "low half on the wire"
            );
            assert_eq!(&p[42..50], &full.to_be_bytes(), "IV is the 64-bit number");
        }
        // Out of order across the wrap, then replays of both sides of it.
        for i in [0, 4, 1, 3, 7, 2, 6, 5] {
            assert_eq!(run(&mut b, &pkts[i]).0, Verdict::Pass, "packet {i}");
        }
        assert_eq!(b.inbound_top(0x1001), Some(start + 7));
        for i in [1, 6] {
            assert_eq!(run(&mut b, &pkts[i]).0, Verdict::Drop(DropCause::Replay));
        }
        assert_eq!(b.counters().decapsulated, 8);

        // Both ends must agree: a 12-byte AAD never verifies as an 8-byte one.
        let (mut a, mut b) = esn_pair(true, false);
        assert_eq!(
            run(&mut b, &esp_frame(&mut a, b"x")).0,
            Verdict::Drop(DropCause::Integrity)
        );
        let (mut a, mut b) = esn_pair(false, true);
        assert_eq!(
            run(&mut b, &esp_frame(&mut a, b"x")).0,
            Verdict::Drop(DropCause::Integrity)
        );

        // An ESN SA is exhausted only after 2^64 - 1.
        let (mut a, mut b) = esn_pair(true, true);
        a.outbound[0].next_seq = u64::MAX;
        b.inbound[0].window.accept(u64::MAX - 1);
        let last = esp_frame(&mut a, b"last");
        assert_eq!(run(&mut b, &last).0, Verdict::Pass);
        let (v, _) = run(&mut a, &udp([10, 1, 0, 1], [10, 2, 0, 1], b"none left"));
        assert_eq!(v, Verdict::Drop(DropCause::Policy));
        assert_eq!(a.counters().seq_exhausted, 1);
    }

    #[test]
    fn policy_errors_name_the_field() {
        type Edit = fn(&mut IpsecPolicy);
        let base = || IpsecPolicy {
            outbound: vec![out_sa(0x1001, &key(1), "10.2.0.0/16")],
            inbound: vec![in_sa(0x2001, &key(2))],
            ..Default::default()
        };
        let cases: &[(&str, &str, Edit)] = &[
            ("outbound[0].key", "empty", |p| p.outbound[0].key.clear()),
            ("outbound[0].key", "36 bytes", |p| {
                p.outbound[0].key.truncate(64)
            }),
            ("inbound[0].key", "got 37", |p| {
                p.inbound[0].key.push_str("00")
            }),
            ("outbound[0].key", "not hexadecimal", |p| {
                p.outbound[0].key = p.outbound[0].key.replace('0', "g")
            }),
            ("outbound[0].key", "odd", |p| {
                p.outbound[0].key.remove(0);
            }),
            ("inbound[1].spi", "duplicate SPI 0x2001", |p| {
                p.inbound.push(in_sa(0x2001, &key(3)))
            }),
            ("outbound[1].spi", "duplicate SPI 0x1001", |p| {
                p.outbound.push(out_sa(0x1001, &key(3), "10.3.0.0/16"))
            }),
            ("outbound[0].spi", "reserved", |p| p.outbound[0].spi = 255),
            ("outbound[0].selector", "0..=32", |p| {
                p.outbound[0].selector = "10.2.0.0/33".into()
            }),
            ("outbound[0].selector", "host bits", |p| {
                p.outbound[0].selector = "10.2.0.1/16".into()
            }),
            ("outbound[0].selector", "not a prefix", |p| {
                p.outbound[0].selector = "10.2.0.0".into()
            }),
            ("outbound[0].selector", "not an IPv4 address", |p| {
                p.outbound[0].selector = "10.2.0.300/16".into()
            }),
            ("inbound[0].selector", "not an IPv4 address", |p| {
                p.inbound[0].selector = Some("x/8".into())
            }),
            ("outbound[0].remote", "not an IPv4 address", |p| {
                p.outbound[0].remote = "gw".into()
            }),
            ("inbound[0].local", "not an IPv4 address", |p| {
                p.inbound[0].local = "::1".into()
            }),
            ("outbound[1].selector", "already the selector", |p| {
                p.outbound.push(out_sa(0x1002, &key(3), "10.2.0.0/16"))
            }),
            (
                "inbound[0].key",
                "same AES key is used by `outbound[0].key`",
                |p| p.inbound[0].key = key(1),
            ),
            ("replay_window", "1..=4096", |p| p.replay_window = Some(0)),
            ("inbound[0].replay_window", "1..=4096", |p| {
                p.inbound[0].replay_window = Some(5000)
            }),
            ("outbound[0].ttl", "at least 1", |p| {
                p.outbound[0].ttl = Some(0)
            }),
            ("mtu", "68", |p| p.mtu = Some(60)),
            ("inbound_eth.src", "MAC", |p| {
                p.inbound_eth = Some(EthRewrite {
                    src: Some("02:00:00:00:00".into()),
                    dst: None,
                })
            }),
            ("inbound", "maximum of 2", |p| {
                p.inbound
                    .extend((0..2).map(|i| in_sa(0x3000 + i, &key(10 + i as u8))))
            }),
        ];
        let nf = Ipsec::with_max_sas(2);
        nf.init(&base(), &mut IpsecState::default()).unwrap();
        for (field, msg, edit) in cases {
            let mut policy = base();
            edit(&mut policy);
            let e = nf
                .init(&policy, &mut IpsecState::default())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("`{field}`")) && e.contains(msg),
                "want {field} / {msg}, got: {e}"
            );
        }
        assert!(toml::from_str::<IpsecPolicy>("replay = 3").is_err());
        assert!(toml::from_str::<IpsecPolicy>("unmatched = \"maybe\"").is_err());
        let unknown_sa_field = "[[outbound]]\nspi = 300\nkey = \"\"\nlocal = \"\"\n\
                                remote = \"\"\nselector = \"\"\ncipher = \"aes\"";
        assert!(toml::from_str::<IpsecPolicy>(unknown_sa_field).is_err());
    }

    #[test]
    fn documented_policy_example_is_valid() {
        let doc = include_str!("../../../docs/ipsec.md");
        let start = doc
            .find("```toml\n")
            .expect("docs/ipsec.md has a TOML example")
            + 8;
        let example = &doc[start..start + doc[start..].find("```").unwrap()];
        #[derive(Deserialize)]
        struct File {
            tenant: Tenant,
        }
        #[derive(Deserialize)]
        struct Tenant {
            policy: IpsecPolicy,
        }
        let file: File = toml::from_str(example).unwrap();
        let st = IpsecState::from_policy(&file.tenant.policy, DEFAULT_MAX_SAS).unwrap();
        assert_eq!((st.outbound.len(), st.inbound.len()), (1, 1));
        assert_eq!(st.inbound[0].window.size(), 128);
        assert_eq!(st.outbound_port, Some(1));
    }

    #[test]
    fn debug_never_prints_key_material() {
        let (a, _) = pair();
        let s = format!("{a:?}");
        assert!(s.contains("key_bits: 256"), "{s}");
        assert!(!s.contains("cipher: LessSafeKey"));
        let k = parse_hex(&key(1)).unwrap();
        let needle = format!("{:?}", &k[..4]);
        assert!(!s.contains(&needle[1..needle.len() - 1]));
    }

    /// The paper's motivating bug: two tenants with the same private addresses must never
    /// share keys, sequence numbers or replay state.
    #[test]
    fn two_tenants_with_overlapping_addresses_never_mix() {
        let nf = Ipsec::default();
        // Both tenants protect 192.168.0.0/16 with the same SPIs and endpoints, different keys.
        let policy = |seed: u8| IpsecPolicy {
            outbound: vec![OutboundSaPolicy {
                selector: "192.168.0.0/16".into(),
                ..out_sa(0x1001, &key(seed), "")
            }],
            inbound: vec![InboundSaPolicy {
                local: GW_A.into(),
                remote: GW_B.into(),
                ..in_sa(0x2001, &key(seed + 100))
            }],
            ..Default::default()
        };
        let peer = |seed: u8| IpsecPolicy {
            outbound: vec![OutboundSaPolicy {
                local: GW_B.into(),
                remote: GW_A.into(),
                selector: "192.168.0.0/16".into(),
                ..out_sa(0x2001, &key(seed + 100), "")
            }],
            inbound: vec![in_sa(0x1001, &key(seed))],
            ..Default::default()
        };
        let (mut t1, mut t2, mut p1, mut p2) = Default::default();
        nf.init(&policy(1), &mut t1).unwrap();
        nf.init(&policy(2), &mut t2).unwrap();
        nf.init(&peer(1), &mut p1).unwrap();
        nf.init(&peer(2), &mut p2).unwrap();
        let handle = |st: &mut IpsecState, frame: &[u8]| {
            let mut buf = vec![0u8; BUF];
            buf[..frame.len()].copy_from_slice(frame);
            let mut pkt =
                Packet::parse_with_capacity(&mut buf, frame.len(), PacketMeta::default()).unwrap();
            let v = nf.handle(&mut pkt, st);
            (v, pkt.data().to_vec())
        };
        let inner = udp([192, 168, 1, 1], [192, 168, 2, 2], b"same addresses");
        // Tenant 1 sends three packets, tenant 2 one: their sequence numbers are their own.
        for _ in 0..3 {
            handle(&mut t1, &inner);
        }
        let (_, from_t1) = handle(&mut t1, &inner);
        let (_, from_t2) = handle(&mut t2, &inner);
        assert_eq!(esp_header(&from_t1[34..]).unwrap(), (0x1001, 4));
        assert_eq!(esp_header(&from_t2[34..]).unwrap(), (0x1001, 1));
        assert_ne!(
            from_t1[50..],
            from_t2[50..],
            "different keys, different ciphertext"
        );
        // Each peer opens only its own tenant's traffic, though SPI and addresses collide.
        assert_eq!(
            handle(&mut p2, &from_t1).0,
            Verdict::Drop(DropCause::Integrity)
        );
        assert_eq!(
            handle(&mut p1, &from_t2).0,
            Verdict::Drop(DropCause::Integrity)
        );
        assert_eq!(handle(&mut p1, &from_t1), (Verdict::Pass, inner.clone()));
        assert_eq!(handle(&mut p2, &from_t2), (Verdict::Pass, inner.clone()));
        // Replay state is per tenant: p1 having seen seq 4 does not affect p2.
        assert_eq!(
            (p1.inbound_top(0x1001), p2.inbound_top(0x1001)),
            (Some(4), Some(1))
        );
        // Return traffic: the same SPI 0x2001 for both tenants, each with its own key.
        let back = udp([192, 168, 2, 2], [192, 168, 1, 1], b"reply");
        let (_, r1) = handle(&mut p1, &back);
        let (_, r2) = handle(&mut p2, &back);
        assert_eq!(handle(&mut t2, &r1).0, Verdict::Drop(DropCause::Integrity));
        assert_eq!(handle(&mut t1, &r1), (Verdict::Pass, back.clone()));
        assert_eq!(handle(&mut t2, &r2), (Verdict::Pass, back.clone()));
        // Counters never leak across tenants.
        let s = |st: &IpsecState| {
            nf.summary(st)
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>()
        };
        assert_eq!(
            (s(&t1)["esp_encapsulated"], s(&t2)["esp_encapsulated"]),
            (4, 1)
        );
        assert_eq!((s(&t1)["esp_bad_icv"], s(&t2)["esp_bad_icv"]), (0, 1));
        assert_eq!((s(&p1)["esp_bad_icv"], s(&p2)["esp_bad_icv"]), (1, 1));
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let (_, mut b) = pair();
        let p = IpsecPolicy {
            outbound: vec![out_sa(0x1001, &key(1), "10.2.0.0/16")],
            ..Default::default()
        };
        let mut single = SingleTenantIpsec::new(&p).unwrap();
        let frame = udp([10, 1, 0, 1], [10, 2, 0, 1], b"baseline");
        let mut buf = vec![0u8; BUF];
        buf[..frame.len()].copy_from_slice(&frame);
        let mut pkt =
            Packet::parse_with_capacity(&mut buf, frame.len(), PacketMeta::default()).unwrap();
        assert_eq!(single.handle(&mut pkt), Verdict::Pass);
        let enc = pkt.data().to_vec();
        assert_eq!(run(&mut b, &enc), (Verdict::Pass, frame));
        assert_eq!(single.state.counters().encapsulated, 1);
        assert!(Ipsec::default().register().bytes > std::mem::size_of::<IpsecState>());
    }
}
