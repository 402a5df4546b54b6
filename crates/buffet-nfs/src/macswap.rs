//! MacSwap: swap the source and destination MAC addresses and send the frame back out
//! of the port it came in on ([`Verdict::Tx`]) — the minimal NF of the FastPaas
//! evaluation, which measures the framework rather than the NF.
//!
//! Nothing else in the frame changes. The per-tenant state is two counters. A frame too
//! short for two MAC addresses cannot get past [`Packet::parse`]; should one reach the
//! NF anyway it is dropped with [`DropCause::Malformed`] and counted.
//!
//! Policy (TOML): there is nothing to configure; the table must be empty (unknown fields
//! are rejected).
//! ```toml
//! [tenant.policy]
//! ```

use buffet_sdk::{DropCause, InitError, MemorySpec, NetworkFunction, Packet, Verdict};
use serde::Deserialize;

/// A tenant's MacSwap policy: empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MacSwapPolicy {}

/// One tenant's MacSwap state: its counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MacSwapState {
    /// Frames swapped and sent back.
    pub swapped: u64,
    /// Frame bytes swapped and sent back.
    pub bytes: u64,
    /// Frames too short to carry two MAC addresses (dropped).
    pub malformed: u64,
}

impl MacSwapState {
    /// Swaps one frame's MAC addresses. Never allocates.
    #[inline]
    pub fn process(&mut self, pkt: &mut Packet<'_>) -> Verdict {
        let data = pkt.data_mut();
        let len = data.len() as u64;
        let Some(macs) = data.get_mut(..12) else {
            self.malformed += 1;
            return Verdict::Drop(DropCause::Malformed);
        };
        let (dst, src) = macs.split_at_mut(6);
        dst.swap_with_slice(src);
        self.swapped += 1;
        self.bytes += len;
        Verdict::Tx
    }

    /// Named counters, as `summary()` reports them.
    pub fn summary(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("swapped", self.swapped),
            ("swapped_bytes", self.bytes),
            ("malformed", self.malformed),
        ]
    }
}

/// The MacSwap NF (multi-tenant).
#[derive(Clone, Copy, Debug, Default)]
pub struct MacSwap;

impl NetworkFunction for MacSwap {
    type State = MacSwapState;
    type Policy = MacSwapPolicy;

    // The default handle_group: the worker runs each packet as it parses it.
    const PER_PACKET: bool = true;

    fn name(&self) -> &'static str {
        "macswap"
    }

    fn register(&self) -> MemorySpec {
        MemorySpec::of::<MacSwapState>()
    }

    fn init(&self, _policy: &MacSwapPolicy, state: &mut MacSwapState) -> Result<(), InitError> {
        *state = MacSwapState::default();
        Ok(())
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut MacSwapState) -> Verdict {
        state.process(pkt)
    }

    fn summary(&self, state: &MacSwapState) -> Vec<(&'static str, u64)> {
        state.summary()
    }
}

/// The single-tenant MacSwap: the same logic over one plain state, no framework.
/// The benchmark baseline.
#[derive(Debug, Default)]
pub struct SingleTenantMacSwap {
    /// The one tenant's state.
    pub state: MacSwapState,
}

impl SingleTenantMacSwap {
    /// A MacSwap with zeroed counters.
    pub fn new(_policy: &MacSwapPolicy) -> Result<Self, InitError> {
        Ok(SingleTenantMacSwap::default())
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
    use buffet_sdk::PacketMeta;
    use etherparse::PacketBuilder;

    const A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

    fn frame(src_ip: [u8; 4]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2(A, B)
            .ipv4(src_ip, [192, 168, 0, 2], 64)
            .udp(1000, 2000)
            .write(&mut v, b"payload")
            .unwrap();
        v
    }

    #[test]
    fn swaps_macs_and_transmits_leaving_the_rest_alone() {
        let mut st = MacSwapState::default();
        MacSwap.init(&MacSwapPolicy::default(), &mut st).unwrap();
        let orig = frame([192, 168, 0, 1]);
        let mut b = orig.clone();
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        assert_eq!(MacSwap.handle(&mut p, &mut st), Verdict::Tx);
        let eth = p.ethernet().unwrap();
        assert_eq!((eth.source(), eth.destination()), (B, A));
        assert_eq!(p.payload(), b"payload");
        assert_eq!(b[12..], orig[12..]);
        assert_eq!((st.swapped, st.bytes), (1, orig.len() as u64));
        // Swapping twice restores the frame.
        let mut p = Packet::parse(&mut b, PacketMeta::default()).unwrap();
        MacSwap.handle(&mut p, &mut st);
        assert_eq!(b, orig);
    }

    #[test]
    fn short_frames_never_reach_or_panic_the_nf() {
        let good = frame([192, 168, 0, 1]);
        let mut st = MacSwapState::default();
        for n in 0..good.len() {
            let mut b = good[..n].to_vec();
            if let Ok(mut p) = Packet::parse(&mut b, PacketMeta::default()) {
                MacSwap.handle(&mut p, &mut st);
            }
        }
        assert_eq!(st, MacSwapState::default());
    }

    #[test]
    fn policy_is_empty_and_strict() {
        assert!(toml::from_str::<MacSwapPolicy>("").is_ok());
        assert!(toml::from_str::<MacSwapPolicy>("swap_ip = true").is_err());
    }

    #[test]
    fn two_tenants_with_overlapping_addresses_keep_their_own_state() {
        let (mut a, mut b) = (MacSwapState::default(), MacSwapState::default());
        MacSwap.init(&MacSwapPolicy::default(), &mut a).unwrap();
        MacSwap.init(&MacSwapPolicy::default(), &mut b).unwrap();
        let pkt = frame([192, 168, 0, 1]);
        for _ in 0..3 {
            let mut bytes = pkt.clone();
            let mut p = Packet::parse(&mut bytes, PacketMeta::default()).unwrap();
            assert_eq!(MacSwap.handle(&mut p, &mut a), Verdict::Tx);
        }
        let mut bytes = pkt.clone();
        let mut p = Packet::parse(&mut bytes, PacketMeta::default()).unwrap();
        MacSwap.handle(&mut p, &mut b);
        assert_eq!((a.swapped, b.swapped), (3, 1));
        assert_eq!(MacSwap.summary(&b)[0], ("swapped", 1));
    }

    #[test]
    fn single_tenant_variant_matches_the_nf() {
        let mut single = SingleTenantMacSwap::new(&MacSwapPolicy::default()).unwrap();
        let mut st = MacSwapState::default();
        let (mut x, mut y) = (frame([1; 4]), frame([1; 4]));
        let mut p = Packet::parse(&mut x, PacketMeta::default()).unwrap();
        let mut q = Packet::parse(&mut y, PacketMeta::default()).unwrap();
        assert_eq!(single.handle(&mut p), MacSwap.handle(&mut q, &mut st));
        assert_eq!(x, y);
        assert_eq!(single.state, st);
    }
}
