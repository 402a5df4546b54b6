//! A tenant's rule change in the XDP Packet Dispatcher is seen by every packet entirely
//! or not at all, checked while another thread classifies packets through the program
//! (BPF_PROG_TEST_RUN) in a tight loop; and a change that fails part way changes nothing.
//! Needs CAP_BPF and CAP_NET_ADMIN (root); skipped otherwise (a failure in CI).
//!
//! The set-up makes a half-applied change observable. Tenant A's rules alternate between
//! R1 = {dst 10.1.0.0/16} and R2 = {dst 10.2.0.0/16} (both at priority 10, next to
//! filler rules that make a change write many entries); tenant B holds {dst 10.0.0.0/8}
//! at priority 20. Packet p1 (to 10.1.0.1) goes to A under R1 and to B under R2; p2 (to
//! 10.2.0.1) goes to B under R1 and to A under R2. Every outcome therefore names the one
//! rule set it was classified under. With the k-th change (counted from 1) tenant A has
//! R1 when k is even and R2 when k is odd. A packet classified while changes
//! `c+1 ..= s` were under way (c completed before the run, s started after it) must be
//! classified under the rule set of some change `g` in `c ..= s`, and `g` never goes
//! back from one packet to the next. Seeing both rules of A at once (the union: p1 -> A
//! then p2 -> A then p1 -> A) or neither (p1 -> B, p2 -> B) breaks that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use buffet_dispatch::{Match, TenantSlot, WorkerId};
use buffet_testkit::gate::{self, Capability};
use buffet_xdp::{XdpConfig, XdpDecision, XdpDispatcher};
use etherparse::PacketBuilder;

fn ready(test: &str) -> bool {
    if let Some(why) = buffet_xdp::UNAVAILABLE {
        return gate::skip_privileged(test, format_args!("xdp engine unavailable: {why}"));
    }
    gate::require_capabilities(test, &[Capability::Bpf, Capability::NetAdmin])
}

fn loaded() -> XdpDispatcher {
    let mut x = XdpDispatcher::load(XdpConfig {
        test_mode: true,
        shift: 30,
        threshold: 3,
        ..XdpConfig::default()
    })
    .unwrap();
    x.add_worker(u64::MAX).unwrap();
    x
}

fn udp(dst: [u8; 4]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([172, 16, 0, 1], dst, 64)
        .udp(4000, 80);
    let mut out = Vec::new();
    b.write(&mut out, b"payload").unwrap();
    out
}

fn dst(net: &str) -> Match {
    Match {
        dst_ip: Some(net.parse().unwrap()),
        ..Match::default()
    }
}

const A: TenantSlot = TenantSlot(1);
const B: TenantSlot = TenantSlot(2);
/// Filler rules of tenant A (never matching p1 or p2): a change writes and removes this
/// many entries besides the one that matters.
const FILLERS: u8 = 100;

/// R1: the fillers, then 10.1.0.0/16 (written last, taken out last).
fn r1() -> Vec<(u32, Match)> {
    let mut r: Vec<(u32, Match)> = (0..FILLERS)
        .map(|i| (10, dst(&format!("10.200.{i}.0/24"))))
        .collect();
    r.push((10, dst("10.1.0.0/16")));
    r
}

/// R2: 10.2.0.0/16 (written first, taken out first), then the fillers.
fn r2() -> Vec<(u32, Match)> {
    let mut r = vec![(10, dst("10.2.0.0/16"))];
    r.extend((0..FILLERS).map(|i| (10, dst(&format!("10.200.{i}.0/24")))));
    r
}

/// Which rule set of A an outcome shows: 0 for R1, 1 for R2.
fn set_of(packet: usize, tenant: TenantSlot) -> u64 {
    match (packet, tenant) {
        (0, A) | (1, B) => 0,
        (0, B) | (1, A) => 1,
        other => panic!("unexpected outcome {other:?}"),
    }
}

#[test]
fn a_packet_stream_sees_every_rule_change_entirely_or_not_at_all() {
    let test = "a_packet_stream_sees_every_rule_change_entirely_or_not_at_all";
    if !ready(test) {
        return;
    }
    const CHANGES: u64 = 300;
    let mut x = loaded();
    x.admit(A, &r1(), 0, WorkerId(0)).unwrap();
    x.admit(B, &[(20, dst("10.0.0.0/8"))], 0, WorkerId(0))
        .unwrap();
    let frames = [udp([10, 1, 0, 1]), udp([10, 2, 0, 1])];
    let started = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut runner = x.test_runner().unwrap();
    let classifier = {
        let (started, completed, stop) = (started.clone(), completed.clone(), stop.clone());
        std::thread::spawn(move || {
            // (packets, packets classified while a change was under way)
            let (mut n, mut during) = (0u64, 0u64);
            let mut last_g = 0u64;
            let mut history: Vec<(usize, TenantSlot, u64, u64)> = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let p = (n % 2) as usize;
                let c = completed.load(Ordering::SeqCst);
                let d = runner.run(&frames[p]).unwrap();
                let s = started.load(Ordering::SeqCst);
                let XdpDecision::Pass { tenant, .. } = d else {
                    panic!("packet {n} (p{}): {d:?}", p + 1);
                };
                let set = set_of(p, tenant);
                history.push((p, tenant, c, s));
                if history.len() > 8 {
                    history.remove(0);
                }
                // The first change g >= last_g within c..=s whose rule set is `set`.
                let from = c.max(last_g);
                let Some(g) = (from..=s).find(|g| g % 2 == set) else {
                    panic!(
                        "packet {n}: p{} went to tenant {} (rule set R{}) while changes \
                         {}..={} were under way, after an earlier packet was classified \
                         under change {last_g}; the last packets (packet, tenant, \
                         completed before, started after): {history:?}",
                        p + 1,
                        tenant.0,
                        set + 1,
                        c + 1,
                        s
                    );
                };
                last_g = g;
                n += 1;
                if s != c {
                    during += 1;
                }
            }
            (n, during)
        })
    };
    for k in 1..=CHANGES {
        let rules = if k % 2 == 1 { r2() } else { r1() };
        started.store(k, Ordering::SeqCst);
        x.replace_rules(A, &rules, 0).unwrap();
        completed.store(k, Ordering::SeqCst);
    }
    stop.store(true, Ordering::Release);
    let (n, during) = classifier.join().unwrap();
    eprintln!("{test}: {n} packets, {during} of them during a change, {CHANGES} changes");
    assert!(
        during >= 100,
        "only {during} of {n} packets ran during a change: the test did not exercise it"
    );
}

/// The dispatcher's own rules map, opened a second time by id.
fn rules_map_of(x: &XdpDispatcher) -> aya::maps::HashMap<aya::maps::MapData, [u8; 64], [u8; 16]> {
    let prog = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == x.program_id().unwrap())
        .expect("the loaded program");
    let ids = prog.map_ids().unwrap().expect("map ids");
    for id in ids {
        let info = aya::maps::MapInfo::from_id(id).unwrap();
        if info.name_as_str() == Some("bf_rules") {
            let data = aya::maps::MapData::from_id(id).unwrap();
            return aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).unwrap();
        }
    }
    panic!("no bf_rules map");
}

#[test]
fn an_update_whose_map_writes_fail_part_way_changes_nothing() {
    let test = "an_update_whose_map_writes_fail_part_way_changes_nothing";
    if !ready(test) {
        return;
    }
    let mut x = loaded();
    x.admit(A, &[(10, dst("10.1.0.0/16"))], 0, WorkerId(0))
        .unwrap();
    x.admit(B, &[(20, dst("10.0.0.0/8"))], 0, WorkerId(0))
        .unwrap();
    let (p1, p2, p3) = (udp([10, 1, 0, 1]), udp([10, 2, 0, 1]), udp([10, 3, 0, 1]));
    let tenant = |x: &mut XdpDispatcher, f: &[u8]| match x.run(0, f).unwrap().decision {
        XdpDecision::Pass { tenant, .. } => tenant,
        other => panic!("{other:?}"),
    };
    // Fill the kernel's rules map to its last entry with keys of no bank (bank word 7):
    // the update below then removes one entry from the inactive bank, writes one, and
    // fails on the next.
    let mut junk = rules_map_of(&x);
    let mut filled = Vec::new();
    for i in 0u32.. {
        let mut key = [0u8; 64];
        key[4..8].copy_from_slice(&7u32.to_ne_bytes());
        key[8..12].copy_from_slice(&i.to_ne_bytes());
        match junk.insert(key, [0u8; 16], 0) {
            Ok(()) => filled.push(key),
            Err(_) => break,
        }
    }
    assert!(filled.len() > 100_000, "{} junk entries", filled.len());
    let r2 = [(10, dst("10.2.0.0/16")), (10, dst("10.3.0.0/16"))];
    match x.replace_rules(A, &r2, 0) {
        Err(buffet_xdp::AdmitError::Map(_)) => {}
        other => panic!("the update went through a full map: {other:?}"),
    }
    // The old rules serve, whole: p1 to A, p2 and p3 to B.
    for _ in 0..3 {
        assert_eq!(tenant(&mut x, &p1), A);
        assert_eq!(tenant(&mut x, &p2), B);
        assert_eq!(tenant(&mut x, &p3), B);
    }
    // With room again, the same update goes through exactly, and so does the way back
    // (both banks are in step with the rules again).
    for key in &filled {
        junk.remove(key).unwrap();
    }
    x.replace_rules(A, &r2, 0).unwrap();
    assert_eq!(tenant(&mut x, &p1), B);
    assert_eq!(tenant(&mut x, &p2), A);
    assert_eq!(tenant(&mut x, &p3), A);
    x.replace_rules(A, &[(10, dst("10.1.0.0/16"))], 0).unwrap();
    assert_eq!(tenant(&mut x, &p1), A);
    assert_eq!(tenant(&mut x, &p2), B);
    assert_eq!(tenant(&mut x, &p3), B);
    x.replace_rules(A, &r2, 0).unwrap();
    assert_eq!(tenant(&mut x, &p1), B);
    assert_eq!(tenant(&mut x, &p3), A);
    // Removal is one step too: nothing of A is left.
    assert!(x.remove(A).unwrap());
    assert_eq!(tenant(&mut x, &p2), B);
    assert_eq!(tenant(&mut x, &p3), B);
}
