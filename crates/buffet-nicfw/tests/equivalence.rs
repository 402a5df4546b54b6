//! The C core against the Rust reference on seeded random inputs: scheduler decisions
//! and overload reports (`buffet_dispatch::scheduler::Scheduler`), DSCP tagging bytes
//! (`buffet_dispatch::tagging`), and key extraction (`buffet_sdk::Packet::parse`).

use buffet_dispatch::scheduler::{Scheduler, SchedulerConfig};
use buffet_dispatch::{tagging, TenantSlot, WorkerId};
use buffet_nicfw::{extract_key, CScheduler};
use buffet_sdk::etherparse::PacketBuilder;
use buffet_sdk::{L3Kind, Packet, PacketMeta};
use buffet_testkit::Rng;

#[test]
fn random_traces_decide_the_same() {
    let mut rng = Rng::new(0x00b0_ffe7);
    let mut passes = [0u64; 4];
    for case in 0..3000 {
        let cfg = SchedulerConfig {
            shift: *rng.pick(&[0, 0, 0, 1, 3, 30, 63, 64, 70]),
            threshold: *rng.pick(&[0, 1, 3]),
        };
        let (mut r, mut c) = (Scheduler::new(cfg), CScheduler::new(cfg));
        let n_workers = 1 + rng.index(4);
        for _ in 0..n_workers {
            let max = *rng.pick(&[0, 1, 2, 3, 5, 8, 20, u64::MAX]);
            assert_eq!(r.add_worker(max), c.add_worker(max).unwrap());
        }
        let n_tenants = 1 + rng.below(8) as u32;
        for t in 0..n_tenants {
            let w = WorkerId(rng.index(n_workers) as u16);
            let max = *rng.pick(&[0, 0, 1, 2, 3, 6]);
            r.add_tenant(TenantSlot(t), w, max).unwrap();
            c.add_tenant(TenantSlot(t), w, max).unwrap();
        }
        let mut ts = rng.below(4);
        for step in 0..300 {
            match rng.below(20) {
                0 => ts = ts.saturating_sub(rng.below(3)), // an older timestamp
                1 => ts = ts.saturating_add(rng.below(5)), // skip timeslots
                2 => ts = rng.next_u64(),                  // anywhere
                3..=6 => ts = ts.saturating_add(1),
                _ => {}
            }
            // Now and then a tenant slot nobody occupies.
            let t = TenantSlot(rng.below(u64::from(n_tenants) + 1) as u32);
            let (a, b) = (r.schedule(ts, t), c.schedule(ts, t));
            assert_eq!(a, b, "case {case} step {step}: ({ts}, {t:?}) cfg {cfg:?}");
            passes[match a {
                buffet_dispatch::scheduler::SchedOutcome::Pass {
                    migrated_from: Some(_),
                    ..
                } => 0,
                buffet_dispatch::scheduler::SchedOutcome::Pass {
                    overload: Some(_), ..
                } => 1,
                buffet_dispatch::scheduler::SchedOutcome::Policed => 2,
                _ => 3,
            }] += 1;
        }
        for (id, w) in r.workers() {
            let cw = c.worker(id).unwrap();
            assert_eq!(
                (w.cur_slot, w.pkt_nb, w.last_nb, w.times),
                (cw.cur_slot, cw.pkt_nb, cw.last_nb, cw.times),
                "case {case}: worker {id:?}"
            );
        }
        for (s, t) in r.tenants() {
            let ct = c.tenant(s).unwrap();
            assert_eq!(
                (t.worker, t.cur_slot, t.pkt_nb),
                (ct.worker, ct.cur_slot, ct.pkt_nb)
            );
        }
    }
    // The traces exercised migrations, overload reports and policing.
    assert!(passes.iter().all(|&n| n > 100), "{passes:?}");
}

#[test]
fn c_admission_errors_match_rust() {
    let cfg = SchedulerConfig::default();
    let (mut r, mut c) = (Scheduler::new(cfg), CScheduler::new(cfg));
    r.add_worker(5);
    c.add_worker(5).unwrap();
    let cases = [
        (TenantSlot(0), WorkerId(0)),
        (TenantSlot(0), WorkerId(0)),
        (TenantSlot(1), WorkerId(7)),
        (TenantSlot(u32::MAX), WorkerId(0)),
    ];
    for (s, w) in cases {
        assert_eq!(r.add_tenant(s, w, 0), c.add_tenant(s, w, 0));
    }
}

fn frame(rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    let payload: Vec<u8> = (0..rng.index(24)).map(|i| i as u8).collect();
    let eth = PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]);
    let (sp, dp) = (rng.below(65536) as u16, rng.below(65536) as u16);
    let v4 = |b: [u8; 4]| b;
    let (a4, b4) = (
        v4((rng.next_u64() as u32).to_be_bytes()),
        v4((rng.next_u64() as u32).to_be_bytes()),
    );
    let (mut a6, mut b6) = ([0u8; 16], [0u8; 16]);
    rng.fill(&mut a6);
    rng.fill(&mut b6);
    match rng.below(6) {
        0 => eth.ipv4(a4, b4, 64).udp(sp, dp).write(&mut v, &payload),
        1 => eth
            .ipv4(a4, b4, 64)
            .tcp(sp, dp, 1, 1000)
            .write(&mut v, &payload),
        2 => eth
            .single_vlan(buffet_sdk::etherparse::VlanId::try_new(rng.below(4096) as u16).unwrap())
            .ipv6(a6, b6, 9)
            .tcp(sp, dp, 1, 1000)
            .write(&mut v, &payload),
        3 => eth.ipv6(a6, b6, 9).udp(sp, dp).write(&mut v, &payload),
        4 => eth
            .single_vlan(buffet_sdk::etherparse::VlanId::try_new(7).unwrap())
            .ipv4(a4, b4, 64)
            .udp(sp, dp)
            .write(&mut v, &payload),
        _ => eth
            .ipv4(a4, b4, 64)
            .icmpv4_echo_request(1, 2)
            .write(&mut v, &payload),
    }
    .unwrap();
    v
}

#[test]
fn dscp_tagging_is_byte_identical() {
    let mut rng = Rng::new(42);
    for _ in 0..20_000 {
        let mut f = frame(&mut rng);
        // Random TOS / traffic class and header bytes, checksum left as it comes.
        let (l3, is_v4) = {
            let mut g = f.clone();
            let p = Packet::parse(&mut g, PacketMeta::default()).unwrap();
            (p.l3_offset(), p.l3_kind() == L3Kind::Ipv4)
        };
        f[l3 + 1] = rng.next_u64() as u8;
        if rng.chance(30) {
            f[l3 + 10] = rng.next_u64() as u8;
        }
        let dscp = rng.below(70) as u8; // 64..69 out of range
        let off = match rng.below(10) {
            0 => rng.index(f.len() + 4),
            _ => l3,
        };
        let v4 = if rng.chance(5) { !is_v4 } else { is_v4 };
        let (mut a, mut b) = (f.clone(), f.clone());
        let ra = tagging::tag_dscp(&mut a, off, v4, dscp);
        let rb = buffet_nicfw::tag_dscp(&mut b, off, v4, dscp);
        assert_eq!(ra, rb, "{f:02x?} at {off}");
        assert_eq!(a, b);
    }
    let mut b = vec![0x45u8; 20];
    assert_eq!(
        buffet_nicfw::tag_dscp(&mut b, usize::MAX, true, 1),
        tagging::tag_dscp(&mut b.clone(), usize::MAX, true, 1)
    );
    for _ in 0..100_000 {
        let (hc, old, new) = (
            rng.next_u64() as u16,
            rng.next_u64() as u16,
            rng.next_u64() as u16,
        );
        assert_eq!(
            buffet_nicfw::checksum_update(hc, old, new),
            tagging::checksum_update(hc, old, new)
        );
    }
}

#[test]
fn key_extraction_matches_packet_parse() {
    let mut rng = Rng::new(7);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..50_000 {
        let mut f = frame(&mut rng);
        // Mutate a few header bytes, and sometimes truncate.
        for _ in 0..rng.below(3) {
            let i = rng.index(f.len().min(70));
            f[i] = *rng.pick(&[0, 1, 4, 5, 6, 0x11, 0x45, 0x60, 0x81, 0x86, 0xdd, 0xff]);
        }
        if rng.chance(20) {
            f.truncate(rng.index(f.len() + 1));
        }
        let in_port = rng.below(4) as u16;
        let c = extract_key(&f, in_port);
        let mut g = f.clone();
        let meta = PacketMeta {
            in_port,
            ..PacketMeta::default()
        };
        match (Packet::parse(&mut g, meta), c) {
            (Err(a), Err(b)) => {
                assert_eq!(a, b, "{f:02x?}");
                err += 1;
            }
            (Ok(p), Ok(k)) => {
                let eth = p.ethernet().unwrap();
                let (src, dst) = p.addrs();
                assert_eq!(k.in_port, in_port);
                assert_eq!(k.src_mac, eth.source());
                assert_eq!(k.dst_mac, eth.destination());
                assert_eq!(k.vlan, p.vlan_id());
                assert_eq!(k.is_v6, p.l3_kind() == L3Kind::Ipv6);
                assert_eq!(k.proto, p.ip_proto());
                assert_eq!(k.dscp, p.dscp());
                assert_eq!(k.ports, p.ports(), "{f:02x?}");
                assert_eq!((k.src_addr, k.dst_addr), (src, dst));
                assert_eq!(usize::from(k.l3_offset), p.l3_offset());
                ok += 1;
            }
            (a, b) => panic!("{f:02x?}: rust {:?}, c {b:?}", a.map(|_| ())),
        }
    }
    assert!(ok > 10_000 && err > 5_000, "{ok} parsed, {err} refused");
}
