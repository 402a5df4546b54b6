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

use std::net::{IpAddr, Ipv4Addr};

use buffet_sdk::policy::IpPrefix;
use buffet_sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, PortId, Verdict};

mod decap;
mod encap;
mod esp;
mod policy;
mod replay;
#[cfg(test)]
mod tests;

pub use esp::{
    esp_header, esp_len, esp_open, esp_pad_len, esp_seal, EspCipher, EspOpened, KeyError,
    OpenError, SealError,
};
pub use policy::{EthRewrite, InboundSaPolicy, IpsecPolicy, OutboundSaPolicy, Unmatched};
pub use replay::{ReplayError, ReplayWindow};

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
    selector: IpPrefix,
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
    selector: Option<IpPrefix>,
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
            .position(|sa| sa.selector.contains(IpAddr::V4(Ipv4Addr::from(dst))))
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

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

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
