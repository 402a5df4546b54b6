//! The nfp offload check: reads the compiled nic-firmware/xdp/dispatcher_offload.bpf.c
//! (ELF, with the `object` crate) and fails on anything Netronome's nfp JIT rejects,
//! following drivers/net/ethernet/netronome/nfp/bpf/verifier.c, jit.c and offload.c:
//!
//! - helpers other than map_lookup/update/delete_elem, get_prandom_u32,
//!   perf_event_output, xdp_adjust_head and xdp_adjust_tail;
//! - kfunc calls; instructions the JIT has no translation for (modulo, division by a
//!   register, sign-extending loads and moves, legacy packet loads, atomics other than a
//!   plain add of 32 or 64 bits);
//! - maps that are not ARRAY or HASH, that have flags, or keys/values beyond 64 bytes
//!   (the firmware's usual limits); BTF-defined maps (`.maps`), whose types this check
//!   cannot read, are refused too;
//! - more than 2,800 instructions;
//! - an exit whose return value is not a constant XDP_ABORTED, XDP_DROP, XDP_PASS or
//!   XDP_TX (no XDP_REDIRECT on the nfp).
//!
//! What it cannot see statically, and the kernel's offload verifier checks on the device:
//! variable map-value offsets, stores to context fields other than rx_queue_index, stack
//! pointers that vary. The program is written to avoid them (see its header).
//!
//! Negative tests feed it the driver-mode dispatcher (clock, ring buffer, redirect, per-CPU
//! maps) and hand-assembled instructions, and see each rejected for its reason.

use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

const HELPERS_OK: [(i32, &str); 7] = [
    (1, "map_lookup_elem"),
    (2, "map_update_elem"),
    (3, "map_delete_elem"),
    (7, "get_prandom_u32"),
    (25, "perf_event_output"),
    (44, "xdp_adjust_head"),
    (65, "xdp_adjust_tail"),
];
const MAX_INSNS: usize = 2800;
/// XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX.
const RETURN_CODES: [i32; 4] = [0, 1, 2, 3];

#[derive(Clone, Copy, Debug)]
struct Insn {
    code: u8,
    dst: u8,
    src: u8,
    off: i16,
    imm: i32,
}

fn decode(bytes: &[u8]) -> Vec<Insn> {
    bytes
        .chunks_exact(8)
        .map(|b| Insn {
            code: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
        .collect()
}

/// Violations in one program's instructions.
fn check_insns(insns: &[Insn]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut i = 0;
    let mut count = 0;
    while i < insns.len() {
        let n = insns[i];
        count += 1;
        let class = n.code & 0x07;
        let op = n.code & 0xf0;
        let mode = n.code & 0xe0;
        let size = n.code & 0x18;
        match class {
            // LD: only the 64-bit immediate load (two slots).
            0x00 => {
                if n.code == 0x18 {
                    i += 1;
                } else {
                    bad.push(format!("insn {i}: legacy packet load {:#04x}", n.code));
                }
            }
            // LDX: plain memory loads only.
            0x01 => {
                if mode != 0x60 {
                    bad.push(format!(
                        "insn {i}: load mode {:#04x} (sign-extending?)",
                        n.code
                    ));
                }
            }
            0x02 => {
                if mode != 0x60 {
                    bad.push(format!("insn {i}: store mode {:#04x}", n.code));
                }
            }
            0x03 => match mode {
                0x60 => {}
                0xc0 => {
                    if size != 0x00 && size != 0x18 {
                        bad.push(format!("insn {i}: atomic of size {size:#04x}"));
                    } else if n.imm != 0x00 {
                        bad.push(format!(
                            "insn {i}: atomic op {:#x} (only a plain add)",
                            n.imm
                        ));
                    }
                }
                _ => bad.push(format!("insn {i}: store mode {:#04x}", n.code)),
            },
            0x04 | 0x07 => {
                let is_x = n.code & 0x08 != 0;
                match op {
                    0x90 => bad.push(format!("insn {i}: modulo")),
                    0x30 if is_x => bad.push(format!("insn {i}: division by a register")),
                    0xd0 if class == 0x07 => bad.push(format!("insn {i}: 64-bit byte swap")),
                    0xe0 | 0xf0 => bad.push(format!("insn {i}: ALU op {op:#04x}")),
                    _ => {}
                }
                if n.off != 0 {
                    bad.push(format!("insn {i}: signed division or sign-extending move"));
                }
            }
            0x05 | 0x06 => match op {
                0x80 if class == 0x05 => match n.src {
                    0 => {
                        if let Some((_, name)) = HELPERS_OK.iter().find(|(id, _)| *id == n.imm) {
                            let _ = name;
                        } else {
                            bad.push(format!("insn {i}: helper {}", n.imm));
                        }
                    }
                    1 => {} // a BPF-to-BPF call
                    _ => bad.push(format!("insn {i}: kfunc call")),
                },
                0x90 if class == 0x05 => {
                    if let Some(why) = return_value_problem(insns, i) {
                        bad.push(format!("insn {i}: exit {why}"));
                    }
                }
                0xe0 | 0xf0 => bad.push(format!("insn {i}: jump op {op:#04x}")),
                0x80 | 0x90 => bad.push(format!("insn {i}: 32-bit call/exit")),
                _ => {}
            },
            _ => bad.push(format!("insn {i}: class {class:#x}")),
        }
        i += 1;
    }
    if count > MAX_INSNS {
        bad.push(format!(
            "{count} instructions (the nfp takes about {MAX_INSNS})"
        ));
    }
    bad
}

/// The value an exit returns must be one of [`RETURN_CODES`]: `r0 = imm` before it, or
/// `r0 = rN` with every immediate written to rN in the program one of them.
fn return_value_problem(insns: &[Insn], exit: usize) -> Option<String> {
    let is_mov_k = |n: &Insn| n.code == 0xb7 || n.code == 0xb4;
    let is_mov_x = |n: &Insn| n.code == 0xbf || n.code == 0xbc;
    let def = insns[..exit].iter().rev().find(|n| {
        n.dst == 0
            && n.code & 0x07 != 0x05
            && n.code & 0x07 != 0x06
            && n.code & 0x07 != 0x03
            && n.code & 0x07 != 0x02
    })?;
    if is_mov_k(def) {
        return (!RETURN_CODES.contains(&def.imm)).then(|| format!("returns {}", def.imm));
    }
    if is_mov_x(def) {
        let r = def.src;
        let imms: Vec<i32> = insns
            .iter()
            .filter(|n| n.dst == r && is_mov_k(n))
            .map(|n| n.imm)
            .collect();
        if imms.is_empty() {
            return Some(format!("returns r{r}, never set to a constant"));
        }
        return imms
            .iter()
            .find(|v| !RETURN_CODES.contains(v))
            .map(|v| format!("may return {v} (through r{r})"));
    }
    Some(format!(
        "returns a computed value (insn code {:#04x})",
        def.code
    ))
}

/// Violations in a whole object: every program section, and the maps.
fn check_object(elf: &[u8]) -> Vec<String> {
    // The embedded bytes need not be aligned as ELF headers want: parse a heap copy.
    let elf = elf.to_vec();
    let file = object::File::parse(&*elf).expect("an ELF object");
    let mut bad = Vec::new();
    let mut programs = 0;
    for s in file.sections() {
        let name = s.name().unwrap_or("?").to_string();
        if s.kind() == SectionKind::Text && s.size() > 0 {
            programs += 1;
            let insns = decode(s.data().unwrap());
            bad.extend(
                check_insns(&insns)
                    .into_iter()
                    .map(|b| format!("{name}: {b}")),
            );
        }
        if name == ".maps" {
            bad.push("BTF-defined maps (.maps): use legacy `maps` definitions".into());
        }
        if name == "maps" {
            let data = s.data().unwrap();
            for sym in file
                .symbols()
                .filter(|y| y.section_index() == Some(s.index()))
            {
                let at = sym.address() as usize;
                let word = |k: usize| {
                    u32::from_le_bytes(data[at + 4 * k..at + 4 * k + 4].try_into().unwrap())
                };
                let (ty, key, val, flags) = (word(0), word(1), word(2), word(4));
                let m = sym.name().unwrap_or("?");
                if ty != 1 && ty != 2 {
                    bad.push(format!("map {m}: type {ty} (only HASH 1 and ARRAY 2)"));
                }
                if flags != 0 {
                    bad.push(format!("map {m}: flags {flags:#x}"));
                }
                if key > 64 || val > 64 {
                    bad.push(format!(
                        "map {m}: key {key} / value {val} bytes (at most 64)"
                    ));
                }
            }
        }
    }
    if programs == 0 {
        bad.push("no program".into());
    }
    bad
}

fn offload_object(test: &str) -> Option<&'static [u8]> {
    match buffet_xdp::offload_object() {
        Ok(o) => Some(o),
        Err(e) => {
            buffet_testkit::gate::skip_privileged(test, e);
            None
        }
    }
}

#[test]
fn offload_program_is_in_the_nfp_subset() {
    let Some(obj) = offload_object("offload_program_is_in_the_nfp_subset") else {
        return;
    };
    let bad = check_object(obj);
    assert!(bad.is_empty(), "{bad:#?}");
    // Stricter than the nfp: the only map write is an atomic add (no update/delete).
    let obj = obj.to_vec();
    let file = object::File::parse(&*obj).unwrap();
    let xdp = file.section_by_name("xdp").expect("an xdp section");
    let insns = decode(xdp.data().unwrap());
    let helpers: Vec<i32> = insns
        .iter()
        .filter(|n| n.code == 0x85 && n.src == 0)
        .map(|n| n.imm)
        .collect();
    assert!(helpers.iter().all(|&h| h == 1), "{helpers:?}");
    assert!(
        insns.iter().any(|n| n.code == 0xdb),
        "counts with 64-bit atomic adds"
    );
    // It selects the RX queue: a 32-bit store at xdp_md's rx_queue_index (offset 16).
    assert!(
        insns.iter().any(|n| n.code == 0x63 && n.off == 16),
        "no queue select"
    );
}

#[test]
fn driver_mode_dispatcher_is_rejected_for_each_reason() {
    let Ok(obj) = buffet_xdp::dispatcher_object() else {
        let _ = offload_object("driver_mode_dispatcher_is_rejected_for_each_reason");
        return;
    };
    let bad = check_object(obj).join("\n");
    for why in ["helper 5", "helper 130", "helper 51", "BTF-defined maps"] {
        assert!(bad.contains(why), "{why} not reported in:\n{bad}");
    }
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}

#[test]
fn forbidden_instructions_are_reported() {
    let exit = insn(0x95, 0, 0, 0, 0);
    let pass = insn(0xb7, 0, 0, 0, 2);
    // A clock read: bpf_ktime_get_ns is helper 5.
    let bad = check_insns(&[insn(0x85, 0, 0, 0, 5), pass, exit]);
    assert_eq!(bad, ["insn 0: helper 5"]);
    // Returning XDP_REDIRECT (4).
    let bad = check_insns(&[insn(0xb7, 0, 0, 0, 4), exit]);
    assert_eq!(bad, ["insn 1: exit returns 4"]);
    // An atomic fetch-add, and a 32-bit modulo.
    let bad = check_insns(&[
        insn(0xdb, 1, 2, 0, 0x01),
        insn(0x94, 3, 0, 0, 7),
        pass,
        exit,
    ]);
    assert_eq!(bad.len(), 2, "{bad:?}");
    // Division by a register; a kfunc call.
    let bad = check_insns(&[insn(0x3f, 1, 2, 0, 0), insn(0x85, 0, 2, 0, 9), pass, exit]);
    assert_eq!(
        bad,
        ["insn 0: division by a register", "insn 1: kfunc call"]
    );
    // The allowed forms pass: lookup, plain atomic add, constant division, PASS.
    let ok = check_insns(&[
        insn(0x85, 0, 0, 0, 1),
        insn(0xdb, 0, 1, 0, 0),
        insn(0x37, 1, 0, 0, 4),
        pass,
        exit,
    ]);
    assert!(ok.is_empty(), "{ok:?}");
    // Too long.
    let mut long = vec![insn(0x07, 1, 0, 0, 1); MAX_INSNS];
    long.extend([pass, exit]);
    assert_eq!(check_insns(&long).len(), 1);
}
