use super::esp::seal_raw;
use super::policy::parse_hex;
use super::*;
use buffet_sdk::etherparse::{IpNumber, Ipv4HeaderSlice};
use buffet_sdk::{PacketMeta, TenantId};
use etherparse::PacketBuilder;
use serde::Deserialize;
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
    let doc = include_str!("../../../../docs/ipsec.md");
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
