//! The ESP wire format (RFC 4303 with AES-GCM, RFC 4106), sans-IO: the cipher, sealing
//! and opening one ESP payload. No SA state, no replay checking, no packet handling.

use std::fmt;

use ring::aead;

use super::{ESP_HEADER_LEN, ESP_ICV_LEN, ESP_IV_LEN, ESP_PREFIX_LEN, ESP_SALT_LEN};

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
pub(super) fn seal_raw(
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
/// `seq_hi` is the high half the receiver inferred ([`ReplayWindow::infer_esn`](super::ReplayWindow::infer_esn)); it is
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
