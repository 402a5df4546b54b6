//! Hand-assembled programs through the verifier and both engines (no clang needed; the C
//! examples are tested from the workspace root, `tests/ebpf.rs`).

use std::sync::Arc;

use buffet_ebpf::abi::{helper, CTX_DATA, CTX_DATA_END};
use buffet_ebpf::elf::{self, ElfError, Image, MapDef, MapKind};
use buffet_ebpf::{EbpfNf, EbpfPolicy, EbpfState, Engine, LoadOptions, MapInit, Program};
use buffet_sdk::{DropCause, NetworkFunction, Packet, PacketMeta, Verdict};

// A tiny assembler: one 8-byte instruction.
fn ins(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = op;
    b[1] = dst | (src << 4);
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}
const LDXDW: u8 = 0x79;
const LDXB: u8 = 0x71;
const STXDW: u8 = 0x7b;
const MOV64_IMM: u8 = 0xb7;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;
const JGT_REG: u8 = 0x2d;
const JEQ_IMM: u8 = 0x15;
const JA: u8 = 0x05;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LDDW: u8 = 0x18;

fn image(code: &[[u8; 8]], maps: Vec<MapDef>) -> Image {
    Image {
        section: "buffet".into(),
        function: "test".into(),
        insns: code.iter().flatten().copied().collect(),
        maps,
        counter_names: vec!["first".into()],
    }
}

/// `r2 = data; r3 = data_end; if r2 + 14 > r3: return 3; r0 = data[12]; exit`.
fn read_ethertype_byte() -> Vec<[u8; 8]> {
    vec![
        ins(LDXDW, 2, 1, CTX_DATA as i16, 0),
        ins(LDXDW, 3, 1, CTX_DATA_END as i16, 0),
        ins(MOV64_REG, 4, 2, 0, 0),
        ins(ADD64_IMM, 4, 0, 0, 14),
        ins(MOV64_IMM, 0, 0, 0, 3),
        ins(JGT_REG, 4, 3, 2, 0),
        ins(LDXB, 0, 2, 12, 0),
        ins(ADD64_IMM, 0, 0, 0, -8), // IPv4 (0x08) -> 0 = PASS
        ins(EXIT, 0, 0, 0, 0),
    ]
}

fn udp() -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(1, 2)
        .write(&mut v, b"hi")
        .unwrap();
    v
}

fn run(nf: &EbpfNf, st: &mut EbpfState, frame: &[u8]) -> Verdict {
    let mut b = frame.to_vec();
    nf.handle(
        &mut Packet::parse(&mut b, PacketMeta::default()).unwrap(),
        st,
    )
}

fn nf(code: &[[u8; 8]], maps: Vec<MapDef>, engine: Engine) -> EbpfNf {
    let opts = LoadOptions {
        engine,
        ..LoadOptions::default()
    };
    let p = Program::from_image(image(code, maps), &opts).unwrap_or_else(|e| panic!("{e}"));
    EbpfNf::with_program(Arc::new(p), opts)
}

fn engines() -> Vec<Engine> {
    if cfg!(all(target_arch = "x86_64", unix)) {
        vec![Engine::Interpreter, Engine::Jit]
    } else {
        vec![Engine::Interpreter]
    }
}

fn rejection(code: &[[u8; 8]]) -> String {
    Program::from_image(image(code, vec![]), &LoadOptions::default())
        .expect_err("must be rejected")
        .to_string()
}

#[test]
fn a_bounds_checked_read_verifies_and_runs_on_both_engines() {
    for engine in engines() {
        let nf = nf(&read_ethertype_byte(), vec![], engine);
        let mut st = EbpfState::default();
        nf.init(&EbpfPolicy::default(), &mut st).unwrap();
        assert_eq!(run(&nf, &mut st, &udp()), Verdict::Pass, "{engine:?}");
        // A state that was never initialised faults instead of running.
        let mut empty = EbpfState::default();
        assert_eq!(run(&nf, &mut empty, &udp()), Verdict::Fault);
        assert!(empty.last_fault().unwrap().contains("tenant region"));
    }
}

/// A group runs with one run context: every packet before a fault gets its verdict, the
/// fault stops the group there (later packets keep the worker's `Fault` fill and are not
/// run), and the state's fault count says one.
#[test]
fn a_group_runs_until_its_first_fault() {
    let ipv6 = {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6([1; 16], [2; 16], 64)
            .udp(1, 2)
            .write(&mut v, b"hi")
            .unwrap();
        v
    };
    for engine in engines() {
        let nf = nf(&read_ethertype_byte(), vec![], engine);
        let mut st = EbpfState::default();
        nf.init(&EbpfPolicy::default(), &mut st).unwrap();
        // The program passes IPv4 and returns a value outside the ABI for IPv6.
        let mut frames = [udp(), udp(), udp()];
        let mut pkts: Vec<Packet<'_>> = frames
            .iter_mut()
            .map(|f| Packet::parse(f, PacketMeta::default()).unwrap())
            .collect();
        let mut verdicts = [Verdict::Fault; 3];
        nf.handle_group(&mut pkts, &mut st, &mut verdicts);
        assert_eq!(verdicts, [Verdict::Pass; 3], "{engine:?}");
        assert_eq!(st.faults(), 0);

        let mut frames = [udp(), ipv6.clone(), udp(), udp()];
        let mut pkts: Vec<Packet<'_>> = frames
            .iter_mut()
            .map(|f| Packet::parse(f, PacketMeta::default()).unwrap())
            .collect();
        let mut verdicts = [Verdict::Fault; 4];
        nf.handle_group(&mut pkts, &mut st, &mut verdicts);
        assert_eq!(
            verdicts,
            [
                Verdict::Pass,
                Verdict::Fault,
                Verdict::Fault,
                Verdict::Fault
            ],
            "{engine:?}"
        );
        assert_eq!(st.faults(), 1, "{engine:?}");
        assert!(
            st.last_fault().unwrap().contains("not a verdict"),
            "{engine:?}"
        );
        // The run context was released: a later single packet runs again.
        assert_eq!(run(&nf, &mut st, &udp()), Verdict::Pass, "{engine:?}");
    }
}

#[test]
fn the_verifier_rejects_with_its_message() {
    // Read 100 bytes into the packet without a check.
    let oob = [
        ins(LDXDW, 2, 1, CTX_DATA as i16, 0),
        ins(LDXB, 0, 2, 100, 0),
        ins(EXIT, 0, 0, 0, 0),
    ];
    assert!(
        rejection(&oob).contains("Upper bound must be at most packet_size"),
        "{}",
        rejection(&oob)
    );
    // An unknown helper.
    let helper = [ins(CALL, 0, 0, 0, 77), ins(EXIT, 0, 0, 0, 0)];
    assert!(
        rejection(&helper).contains("helper function is unavailable"),
        "{}",
        rejection(&helper)
    );
    // A loop without exit.
    let spin = [
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(ADD64_IMM, 0, 0, 0, 1),
        ins(JA, 0, 0, -2, 0),
        ins(EXIT, 0, 0, 0, 0),
    ];
    let e = rejection(&spin);
    assert!(e.contains("rejected by the verifier"), "{e}");
    // r0 never written.
    let uninit = [ins(EXIT, 0, 0, 0, 0)];
    assert!(
        rejection(&uninit).contains("rejected"),
        "{}",
        rejection(&uninit)
    );
    // Writing the packet pointer in the context.
    let ctx_write = [
        ins(MOV64_IMM, 2, 0, 0, 0),
        ins(STXDW, 1, 2, CTX_DATA as i16, 0),
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(EXIT, 0, 0, 0, 0),
    ];
    assert!(
        rejection(&ctx_write).contains("Cannot write to context pointer field"),
        "{}",
        rejection(&ctx_write)
    );
    // Beyond the 48-byte context.
    let ctx_oob = [ins(LDXDW, 0, 1, 48, 0), ins(EXIT, 0, 0, 0, 0)];
    assert!(
        rejection(&ctx_oob).contains("Upper bound must be at most 48"),
        "{}",
        rejection(&ctx_oob)
    );
    // Buffet's own prechecks: legacy packet loads, map-value pseudo loads.
    let ld_abs = [ins(0x30, 0, 0, 0, 12), ins(EXIT, 0, 0, 0, 0)];
    assert!(
        rejection(&ld_abs).contains("LD_ABS"),
        "{}",
        rejection(&ld_abs)
    );
    let lddw_value = [
        ins(LDDW, 1, 2, 0, 0),
        ins(0, 0, 0, 0, 0),
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(EXIT, 0, 0, 0, 0),
    ];
    assert!(
        rejection(&lddw_value).contains("map value"),
        "{}",
        rejection(&lddw_value)
    );
}

#[test]
fn a_return_value_outside_the_abi_is_a_fault() {
    for engine in engines() {
        let nf = nf(
            &[ins(MOV64_IMM, 0, 0, 0, 99), ins(EXIT, 0, 0, 0, 0)],
            vec![],
            engine,
        );
        let mut st = EbpfState::default();
        nf.init(&EbpfPolicy::default(), &mut st).unwrap();
        assert_eq!(run(&nf, &mut st, &udp()), Verdict::Fault);
        assert_eq!(st.faults(), 1);
        assert_eq!(st.last_fault(), Some("return value 0x63 is not a verdict"));
        // Forward is in the ABI.
        let (fwd, mut st) = nf_returning(0x1_0007, engine);
        assert_eq!(run(&fwd, &mut st, &udp()), Verdict::Forward(7));
    }
}

/// An NF returning a constant, with a fresh state.
fn nf_returning(r0: i32, engine: Engine) -> (EbpfNf, EbpfState) {
    let nf = nf(
        &[ins(MOV64_IMM, 0, 0, 0, r0), ins(EXIT, 0, 0, 0, 0)],
        vec![],
        engine,
    );
    let mut st = EbpfState::default();
    nf.init(&EbpfPolicy::default(), &mut st).unwrap();
    (nf, st)
}

fn array(name: &str, value_size: u32, entries: u32) -> MapDef {
    MapDef {
        name: name.into(),
        kind: MapKind::Array,
        key_size: 4,
        value_size,
        max_entries: entries,
        scratch: false,
    }
}

#[test]
fn helpers_check_their_arguments() {
    // r6 = lookup(map 0, index 2); r7 = lookup(map 0, index 4 = out of range);
    // counter_add(0, 5); r8 = counter_add(16, 1) (out of range);
    // r0 = (r6 != 0) + 2 * (r7 == 0) + 4 * (r8 == -1)  -> 7 expected; returned as 7 =
    // BUFFET_DROP_REPLAY.
    let code = [
        ins(LDDW, 1, 1, 0, 0),
        ins(0, 0, 0, 0, 0),
        ins(MOV64_IMM, 2, 0, 0, 2),
        ins(CALL, 0, 0, 0, helper::MAP_LOOKUP),
        ins(MOV64_REG, 6, 0, 0, 0),
        ins(LDDW, 1, 1, 0, 0),
        ins(0, 0, 0, 0, 0),
        ins(MOV64_IMM, 2, 0, 0, 4),
        ins(CALL, 0, 0, 0, helper::MAP_LOOKUP),
        ins(MOV64_REG, 7, 0, 0, 0),
        ins(MOV64_IMM, 1, 0, 0, 0),
        ins(MOV64_IMM, 2, 0, 0, 5),
        ins(CALL, 0, 0, 0, helper::COUNTER_ADD),
        ins(MOV64_IMM, 1, 0, 0, 16),
        ins(MOV64_IMM, 2, 0, 0, 1),
        ins(CALL, 0, 0, 0, helper::COUNTER_ADD),
        ins(MOV64_REG, 8, 0, 0, 0),
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(JEQ_IMM, 6, 0, 1, 0),
        ins(ADD64_IMM, 0, 0, 0, 1),
        ins(0x55, 7, 0, 1, 0), // if r7 != 0 skip
        ins(ADD64_IMM, 0, 0, 0, 2),
        ins(0x55, 8, 0, 1, -1), // if r8 != -1 skip
        ins(ADD64_IMM, 0, 0, 0, 4),
        ins(EXIT, 0, 0, 0, 0),
    ];
    for engine in engines() {
        let nf = nf(&code, vec![array("state", 8, 4)], engine);
        let mut st = EbpfState::default();
        let policy = EbpfPolicy {
            maps: [(
                "state".to_owned(),
                MapInit {
                    u64: Some(vec![1, 2, 3, 4]),
                    ..MapInit::default()
                },
            )]
            .into(),
            ..EbpfPolicy::default()
        };
        nf.init(&policy, &mut st).unwrap();
        assert_eq!(
            run(&nf, &mut st, &udp()),
            Verdict::Drop(DropCause::Replay),
            "{engine:?}"
        );
        assert_eq!(st.counter(0), 5);
        assert_eq!(nf.summary(&st)[0], ("first", 5));
        let state = nf.map_bytes(&st, "state").unwrap();
        assert_eq!(&state[16..24], &3u64.to_le_bytes());
    }
}

#[test]
fn the_loader_refuses_what_is_not_a_bpf_object() {
    assert!(matches!(
        elf::load(b"not an elf", None),
        Err(ElfError::Parse(_))
    ));
    let me = std::fs::read("/proc/self/exe").unwrap();
    let e = elf::load(&me, None).unwrap_err();
    assert!(matches!(e, ElfError::NotBpf(_)), "{e}");
}

#[test]
fn map_layouts_are_checked() {
    let bad = |m: MapDef| {
        Program::from_image(
            image(
                &[ins(MOV64_IMM, 0, 0, 0, 0), ins(EXIT, 0, 0, 0, 0)],
                vec![m],
            ),
            &LoadOptions::default(),
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad(array("a", 0, 1)).contains("value_size is 0"));
    assert!(bad(array("a", 8, 0)).contains("max_entries is 0"));
    assert!(bad(array("a", 1 << 20, 1 << 10)).contains("more than"));
    let strset = MapDef {
        name: "s".into(),
        kind: MapKind::StrSet,
        key_size: 0,
        value_size: 0,
        max_entries: 4,
        scratch: false,
    };
    assert!(bad(strset).contains("key_size"));
}

/// A tenant's program cannot buy unpaid work with SCRATCH maps, which are zeroed before
/// every packet: thousands of them (64 MiB, a memset of milliseconds per packet, with a
/// program of two instructions) are refused at load; what is allowed is charged to the
/// packet's budget, and a budget that cannot pay for it is refused at admission.
#[test]
fn scratch_maps_are_bounded_and_their_zeroing_is_charged() {
    let scratch = |name: &str, bytes: u32| MapDef {
        scratch: true,
        ..array(name, bytes, 1)
    };
    let code = [ins(MOV64_IMM, 0, 0, 0, 0), ins(EXIT, 0, 0, 0, 0)];
    let many: Vec<MapDef> = (0..4095)
        .map(|i| scratch(&format!("s{i}"), 16 * 1024))
        .collect();
    let err = Program::from_image(image(&code, many), &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("map `s1`:")
            && err.contains("SCRATCH maps hold 32768 bytes")
            && err.contains("at most 16384"),
        "{err}"
    );
    for engine in engines() {
        // Two of 8 KiB: the most a program may have, 256 units per packet.
        let nf = nf(
            &code,
            vec![scratch("a", 8 * 1024), scratch("b", 8 * 1024)],
            engine,
        );
        let mut st = EbpfState::default();
        let err = nf
            .init(
                &EbpfPolicy {
                    cost_budget: Some(255),
                    ..EbpfPolicy::default()
                },
                &mut st,
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cost_budget") && err.contains("255 is less than the 256 units"),
            "{err}"
        );
        nf.init(
            &EbpfPolicy {
                cost_budget: Some(256),
                ..EbpfPolicy::default()
            },
            &mut st,
        )
        .unwrap();
        assert_eq!(run(&nf, &mut st, &udp()), Verdict::Pass, "{engine:?}");
        assert_eq!(st.faults(), 0);
    }
}

/// Under the JIT `buffet_counter_add` and `buffet_map_lookup` are inline code, under the
/// interpreter helper calls: at every cost budget, from one that stops the first call to
/// one that lets every call work, both engines leave the same counters and maps and give
/// the same verdict (a fault once the budget is crossed).
#[test]
fn inline_counters_and_lookups_match_the_helpers_at_every_budget() {
    const ADD64_REG: u8 = 0x0f;
    const MUL64_IMM: u8 = 0x27;
    let mut code = vec![ins(MOV64_IMM, 6, 0, 0, 0)];
    // Counter indices in and out of range (16 counters), deltas 1..=6.
    for (i, idx) in [0, 3, 16, 15, 17, 1].into_iter().enumerate() {
        code.push(ins(MOV64_IMM, 1, 0, 0, idx));
        code.push(ins(MOV64_IMM, 2, 0, 0, i as i32 + 1));
        code.push(ins(CALL, 0, 0, 0, helper::COUNTER_ADD));
        code.push(ins(MUL64_IMM, 6, 0, 0, 3));
        code.push(ins(ADD64_REG, 6, 0, 0, 0));
    }
    // Elements of `state` (4 entries) in and out of range, read when found.
    for idx in [2, 4, 0] {
        code.push(ins(LDDW, 1, 1, 0, 0));
        code.push(ins(0, 0, 0, 0, 0));
        code.push(ins(MOV64_IMM, 2, 0, 0, idx));
        code.push(ins(CALL, 0, 0, 0, helper::MAP_LOOKUP));
        code.push(ins(MUL64_IMM, 6, 0, 0, 3));
        code.push(ins(JEQ_IMM, 0, 0, 2, 0));
        code.push(ins(LDXDW, 0, 0, 0, 0));
        code.push(ins(ADD64_REG, 6, 0, 0, 0));
    }
    // out[0] = what the calls returned.
    code.push(ins(LDDW, 1, 1, 0, 1));
    code.push(ins(0, 0, 0, 0, 0));
    code.push(ins(MOV64_IMM, 2, 0, 0, 0));
    code.push(ins(CALL, 0, 0, 0, helper::MAP_LOOKUP));
    code.push(ins(JEQ_IMM, 0, 0, 1, 0));
    code.push(ins(STXDW, 0, 6, 0, 0));
    code.push(ins(MOV64_IMM, 0, 0, 0, 0));
    code.push(ins(EXIT, 0, 0, 0, 0));
    let maps = || vec![array("state", 8, 4), array("out", 8, 1)];
    let engines = engines();
    let nfs: Vec<EbpfNf> = engines.iter().map(|&e| nf(&code, maps(), e)).collect();
    // Ten calls of 16 units each.
    for budget in 1..=170u64 {
        let mut seen = vec![];
        for nf in &nfs {
            let mut st = EbpfState::default();
            let policy = EbpfPolicy {
                maps: [(
                    "state".to_owned(),
                    MapInit {
                        u64: Some(vec![11, 22, 33, 44]),
                        ..MapInit::default()
                    },
                )]
                .into(),
                cost_budget: Some(budget),
                ..EbpfPolicy::default()
            };
            nf.init(&policy, &mut st).unwrap();
            let verdict = run(nf, &mut st, &udp());
            // Everything after the context (whose packet addresses differ per run).
            let after_ctx = st.region()[buffet_ebpf::abi::COUNTERS_OFFSET..].to_vec();
            seen.push((verdict, after_ctx, st.faults()));
        }
        for (engine, s) in engines.iter().zip(&seen) {
            assert_eq!(s, &seen[0], "budget {budget}: {engine:?} differs");
        }
        let (verdict, _, _) = &seen[0];
        assert_eq!(
            *verdict == Verdict::Pass,
            budget >= 160,
            "budget {budget}: {verdict:?}"
        );
    }
    // With every call done: counters 0, 3, 15 and 1 got 1, 2, 4 and 6.
    let mut st = EbpfState::default();
    nfs.last()
        .unwrap()
        .init(&EbpfPolicy::default(), &mut st)
        .unwrap();
    assert_eq!(run(nfs.last().unwrap(), &mut st, &udp()), Verdict::Pass);
    let counters: Vec<u64> = (0..16).map(|i| st.counter(i)).collect();
    assert_eq!(
        counters,
        [1, 6, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4],
        "{counters:?}"
    );
}
