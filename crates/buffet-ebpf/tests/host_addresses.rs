//! A program never observes a host address: every way a pointer's value could flow into
//! a number the program can output (return value, counters, packet bytes, maps) is
//! rejected at load time. Each attack is hand-assembled and loaded through the verifier;
//! should one ever be accepted, it is run on both engines and its outputs searched for
//! the real packet, region and stack addresses before the test fails anyway.

use buffet_ebpf::abi::{helper, CtxFields, CTX_DATA, CTX_DATA_END};
use buffet_ebpf::elf::{Image, MapDef, MapKind};
use buffet_ebpf::{Engine, LoadOptions, Program};

fn ins(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = op;
    b[1] = dst | (src << 4);
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}
const LDXDW: u8 = 0x79;
const LDXW: u8 = 0x61;
const STXDW: u8 = 0x7b;
const STB: u8 = 0x72;
const MOV64_IMM: u8 = 0xb7;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;
const ADD64_REG: u8 = 0x0f;
const SUB64_REG: u8 = 0x1f;
const ADD32_IMM: u8 = 0x04;
const JGT_REG: u8 = 0x2d;
const JGT_REG32: u8 = 0x2e;
const JEQ_REG: u8 = 0x1d;
const JSET_REG: u8 = 0x4d;
const JEQ_IMM: u8 = 0x15;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LDDW: u8 = 0x18;

/// `r2 = data; r3 = data_end; if r2 + 16 > r3: return 0` — the common prologue.
fn prologue() -> Vec<[u8; 8]> {
    vec![
        ins(LDXDW, 2, 1, CTX_DATA as i16, 0),
        ins(LDXDW, 3, 1, CTX_DATA_END as i16, 0),
        ins(MOV64_REG, 4, 2, 0, 0),
        ins(ADD64_IMM, 4, 0, 0, 16),
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(JGT_REG, 4, 3, 1, 0),
        ins(JEQ_IMM, 0, 0, 1, 0), // always taken: skip the exit
        ins(EXIT, 0, 0, 0, 0),
    ]
}

/// `counter_add(0, r<reg>); r0 = 0; exit`.
fn emit(reg: u8) -> Vec<[u8; 8]> {
    vec![
        ins(MOV64_REG, 2, reg, 0, 0),
        ins(MOV64_IMM, 1, 0, 0, 0),
        ins(CALL, 0, 0, 0, helper::COUNTER_ADD),
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(EXIT, 0, 0, 0, 0),
    ]
}

/// `if r<a> <op> r<b>: r0 = 1 else r0 = 0; exit` (a bit of the comparison in r0).
fn bit(op: u8, a: u8, b: u8) -> Vec<[u8; 8]> {
    vec![
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(op, a, b, 1, 0),
        ins(EXIT, 0, 0, 0, 0),
        ins(MOV64_IMM, 0, 0, 0, 1),
        ins(EXIT, 0, 0, 0, 0),
    ]
}

fn cat(parts: &[Vec<[u8; 8]>]) -> Vec<[u8; 8]> {
    parts.concat()
}

fn image(code: &[[u8; 8]], maps: Vec<MapDef>) -> Image {
    Image {
        section: "buffet".into(),
        function: "attack".into(),
        insns: code.iter().flatten().copied().collect(),
        maps,
        counter_names: vec![],
    }
}

fn value_map() -> MapDef {
    MapDef {
        name: "m".into(),
        kind: MapKind::Array,
        key_size: 4,
        value_size: 16,
        max_entries: 1,
        scratch: false,
    }
}

/// One attack: its name, its code, its maps.
type Attack = (&'static str, Vec<[u8; 8]>, Vec<MapDef>);

/// The attacks.
fn attacks() -> Vec<Attack> {
    let number = |reg: u8, v: i32| ins(MOV64_IMM, reg, 0, 0, v);
    // r6 = map value pointer (or exit when NULL), for the map attacks.
    let lookup = vec![
        ins(MOV64_REG, 9, 2, 0, 0),
        ins(LDDW, 1, 1, 0, 0), // map 0
        ins(0, 0, 0, 0, 0),
        ins(MOV64_IMM, 2, 0, 0, 0),
        ins(CALL, 0, 0, 0, helper::MAP_LOOKUP),
        ins(MOV64_REG, 6, 0, 0, 0),
        ins(MOV64_IMM, 0, 0, 0, 0),
        ins(JEQ_IMM, 6, 0, 1, 0),
        ins(JEQ_IMM, 0, 0, 1, 0),
        ins(EXIT, 0, 0, 0, 0),
    ];
    vec![
        // Rebuild ctx->data bit by bit: compare the packet pointer with numbers.
        (
            "packet pointer > number",
            cat(&[prologue(), vec![number(5, 0x1000)], bit(JGT_REG, 2, 5)]),
            vec![],
        ),
        (
            "packet pointer == number",
            cat(&[prologue(), vec![number(5, 0x1000)], bit(JEQ_REG, 2, 5)]),
            vec![],
        ),
        (
            "packet pointer & number (JSET)",
            cat(&[prologue(), vec![number(5, 0x1000)], bit(JSET_REG, 2, 5)]),
            vec![],
        ),
        (
            "32-bit compare of two packet pointers",
            cat(&[prologue(), bit(JGT_REG32, 2, 3)]),
            vec![],
        ),
        (
            "stack pointer > number",
            cat(&[
                prologue(),
                vec![number(5, 0x1000), ins(MOV64_REG, 6, 10, 0, 0)],
                bit(JGT_REG, 6, 5),
            ]),
            vec![],
        ),
        (
            "context pointer > number",
            cat(&[prologue(), vec![number(5, 0x1000)], bit(JGT_REG, 1, 5)]),
            vec![],
        ),
        (
            "map value pointer > number",
            cat(&[
                prologue(),
                lookup.clone(),
                vec![number(5, 0x1000)],
                bit(JGT_REG, 6, 5),
            ]),
            vec![value_map()],
        ),
        // Write a pointer where the program's output is.
        (
            "store the packet pointer into the packet",
            cat(&[
                prologue(),
                vec![ins(STXDW, 2, 2, 0, 0)],
                vec![ins(MOV64_IMM, 0, 0, 0, 0), ins(EXIT, 0, 0, 0, 0)],
            ]),
            vec![],
        ),
        (
            "store the packet pointer into a map",
            cat(&[
                prologue(),
                lookup.clone(),
                vec![ins(STXDW, 6, 9, 0, 0)],
                vec![ins(MOV64_IMM, 0, 0, 0, 0), ins(EXIT, 0, 0, 0, 0)],
            ]),
            vec![value_map()],
        ),
        // Turn a pointer into a number by arithmetic.
        (
            "add two packet pointers",
            cat(&[prologue(), vec![ins(ADD64_REG, 2, 3, 0, 0)], emit(2)]),
            vec![],
        ),
        (
            "number minus packet pointer",
            cat(&[
                prologue(),
                vec![number(5, 0), ins(SUB64_REG, 5, 2, 0, 0)],
                emit(5),
            ]),
            vec![],
        ),
        (
            "context pointer minus packet pointer",
            cat(&[
                prologue(),
                vec![ins(MOV64_REG, 5, 1, 0, 0), ins(SUB64_REG, 5, 2, 0, 0)],
                emit(5),
            ]),
            vec![],
        ),
        (
            "32-bit add to the packet pointer",
            cat(&[prologue(), vec![ins(ADD32_IMM, 2, 0, 0, 0)], emit(2)]),
            vec![],
        ),
        (
            "the packet pointer as a helper argument",
            cat(&[prologue(), emit(2)]),
            vec![],
        ),
        (
            "the packet pointer as the return value",
            cat(&[
                prologue(),
                vec![ins(MOV64_REG, 0, 2, 0, 0), ins(EXIT, 0, 0, 0, 0)],
            ]),
            vec![],
        ),
        // Spill a pointer, read it back as a number.
        (
            "spill the packet pointer, reload 4 bytes of it",
            cat(&[
                prologue(),
                vec![ins(STXDW, 10, 2, -8, 0), ins(LDXW, 5, 10, -8, 0)],
                emit(5),
            ]),
            vec![],
        ),
        (
            "spill the packet pointer, overwrite a byte, reload it",
            cat(&[
                prologue(),
                vec![
                    ins(STXDW, 10, 2, -8, 0),
                    ins(STB, 10, 0, -8, 0),
                    ins(LDXDW, 5, 10, -8, 0),
                ],
                emit(5),
            ]),
            vec![],
        ),
    ]
}

fn engines() -> Vec<Engine> {
    if cfg!(all(target_arch = "x86_64", unix)) {
        vec![Engine::Interpreter, Engine::Jit]
    } else {
        vec![Engine::Interpreter]
    }
}

/// Whether `out` holds 3 or more consecutive low-order bytes of `addr` (little- or
/// big-endian), or the value itself within 64 KiB.
fn leaks(out: &[u8], addr: u64) -> bool {
    let le = addr.to_le_bytes();
    let be = addr.to_be_bytes();
    out.windows(3).any(|w| w == &le[..3] || w == &be[5..]) || {
        out.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .any(|v| v.abs_diff(addr) < 0x1_0000)
    }
}

#[test]
fn no_attack_observes_a_host_address() {
    let mut report = Vec::new();
    for (name, code, maps) in attacks() {
        for engine in engines() {
            let opts = LoadOptions {
                engine,
                ..LoadOptions::default()
            };
            let p = match Program::from_image(image(&code, maps.clone()), &opts) {
                Err(e) => {
                    report.push(format!("{name}: rejected: {e}"));
                    break;
                }
                Ok(p) => p,
            };
            let mut packet = vec![0u8; 64];
            let mut region = vec![0u8; p.region_len()];
            let addrs = [packet.as_ptr() as u64, region.as_ptr() as u64];
            let r0 = p
                .run(&mut packet, &mut region, &CtxFields::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut out = r0.to_le_bytes().to_vec();
            out.extend_from_slice(&packet);
            // The region after the context: counters and maps (the context holds
            // data/data_end, written by the host).
            out.extend_from_slice(&region[buffet_ebpf::abi::CTX_SIZE..]);
            for a in addrs {
                assert!(
                    !leaks(&out, a),
                    "{name} ({engine:?}) leaked {a:#x}: r0 = {r0:#x}"
                );
            }
            // The stack: compare with this thread's stack (rbpf's interpreter stack and
            // the JIT's stack are on it).
            let here = &r0 as *const u64 as u64;
            assert!(
                !out.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .any(|v| v.abs_diff(here) < 1 << 20),
                "{name} ({engine:?}) leaked a stack address"
            );
            // A comparison result is one bit; it must not depend on the address.
            assert!(r0 <= 1, "{name}: r0 = {r0:#x}");
            report.push(format!("{name}: accepted, r0 = {r0} ({engine:?})"));
        }
    }
    println!("{}", report.join("\n"));
    let accepted: Vec<&String> = report.iter().filter(|r| !r.contains("rejected")).collect();
    assert!(accepted.is_empty(), "accepted: {accepted:#?}");
}

#[test]
fn comparisons_that_reveal_nothing_stay_allowed() {
    // Two packet pointers (the bounds check every program makes), a NULL test of a map
    // value, and numbers with numbers: accepted and run on both engines.
    let code = cat(&[
        prologue(),
        vec![ins(MOV64_IMM, 5, 0, 0, 1), ins(MOV64_IMM, 6, 0, 0, 2)],
        bit(JGT_REG, 6, 5),
    ]);
    for engine in engines() {
        let opts = LoadOptions {
            engine,
            ..LoadOptions::default()
        };
        let p = Program::from_image(image(&code, vec![]), &opts).unwrap_or_else(|e| panic!("{e}"));
        let mut packet = vec![0u8; 64];
        let mut region = vec![0u8; p.region_len()];
        assert_eq!(
            p.run(&mut packet, &mut region, &CtxFields::default()),
            Ok(1)
        );
    }
}
