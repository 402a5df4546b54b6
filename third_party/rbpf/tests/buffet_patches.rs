// SPDX-License-Identifier: (Apache-2.0 OR MIT)
//! Buffet: one test per patch in BUFFET.md. Each runs the interpreter and the x86-64 JIT
//! on the same program and expects the result the eBPF ISA (RFC 9669) and Linux give.
#![cfg(all(not(windows), target_arch = "x86_64"))]

use rbpf::ebpf::{self, Insn};

fn prog(insns: &[Insn]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.to_array()).collect()
}

fn insn(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        opc,
        dst,
        src,
        off,
        imm,
    }
}

/// Runs `code` with both engines on an 8-byte packet and a 16-byte metadata buffer;
/// returns (interpreter, JIT).
fn both(code: &[u8], helpers: &[(u32, rbpf::Helper)]) -> (u64, u64) {
    let mut vm = rbpf::EbpfVmMbuff::new(Some(code)).unwrap();
    for &(k, h) in helpers {
        vm.register_helper(k, h).unwrap();
    }
    let mut mem = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let mut mbuff = [0u8; 16];
    let interp = vm.execute_program_mut(&mut mem, &mut mbuff).unwrap();
    vm.jit_compile().unwrap();
    // SAFETY: the test programs only touch their stack and registers.
    let jit = unsafe { vm.execute_program_jit(&mut mem, &mut mbuff).unwrap() };
    (interp, jit)
}

#[test]
fn jit_sizes_its_buffer_from_the_program() {
    // 10,000 64-bit divisions by a register (the longest x86 sequence) then exit:
    // upstream's one-page buffer panicked around 800 instructions.
    let mut insns = vec![
        insn(ebpf::MOV64_IMM, 0, 0, 0, 1 << 30),
        insn(ebpf::MOV64_IMM, 1, 0, 0, 1),
    ];
    for _ in 0..10_000 {
        insns.push(insn(ebpf::DIV64_REG, 0, 1, 0, 0));
    }
    insns.push(insn(ebpf::EXIT, 0, 0, 0, 0));
    assert_eq!(both(&prog(&insns), &[]), (1 << 30, 1 << 30));
}

#[test]
fn mov32_and_le_zero_extend_in_the_jit() {
    let code = prog(&[
        insn(ebpf::LD_DW_IMM, 1, 0, 0, 0x1234_5678),
        insn(0, 0, 0, 0, 0x7fff_ffff),
        insn(ebpf::MOV32_REG, 0, 1, 0, 0), // w0 = w1
        insn(ebpf::LD_DW_IMM, 2, 0, 0, 0x0000_beef),
        insn(0, 0, 0, 0, 0x1111_1111),
        insn(ebpf::LE, 2, 0, 0, 16), // r2 = le16(r2)
        insn(ebpf::ADD64_REG, 0, 2, 0, 0),
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(both(&code, &[]), (0x1234_5678 + 0xbeef, 0x1234_5678 + 0xbeef));
}

#[test]
fn mod32_by_zero_zero_extends() {
    let code = prog(&[
        insn(ebpf::LD_DW_IMM, 0, 0, 0, 7),
        insn(0, 0, 0, 0, 1),
        insn(ebpf::MOV64_IMM, 1, 0, 0, 0),
        insn(ebpf::MOD32_REG, 0, 1, 0, 0),
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(both(&code, &[]), (7, 7));
}

#[test]
fn jeq_immediate_is_sign_extended() {
    let code = prog(&[
        insn(ebpf::MOV64_IMM, 1, 0, 0, -1), // r1 = 0xffff_ffff_ffff_ffff
        insn(ebpf::MOV64_IMM, 0, 0, 0, 1),
        insn(ebpf::JEQ_IMM, 1, 0, 1, -1),
        insn(ebpf::MOV64_IMM, 0, 0, 0, 2),
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(both(&code, &[]), (1, 1));
}

#[repr(align(16))]
struct Aligned([u8; 16]);

fn stack_alignment(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    let a = Aligned([0; 16]);
    (std::hint::black_box(&a) as *const Aligned as usize % 16) as u64
}

#[test]
fn helpers_run_on_an_aligned_stack() {
    // A helper called from the program's top level and from a bpf-to-bpf callee.
    let code = prog(&[
        insn(ebpf::CALL, 0, 0, 0, 1),
        insn(ebpf::MOV64_REG, 6, 0, 0, 0),
        insn(ebpf::CALL, 0, 1, 0, 2), // local call to insn 4
        insn(ebpf::ADD64_REG, 0, 6, 0, 0),
        insn(ebpf::EXIT, 0, 0, 0, 0),
        insn(ebpf::CALL, 0, 0, 0, 1),
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(both(&code, &[(1, stack_alignment)]), (0, 0));
}

#[test]
fn a_callee_does_not_overwrite_its_callers_frame() {
    let code = prog(&[
        insn(ebpf::ST_DW_IMM, 10, 0, -8, 11), // *(u64 *)(r10 - 8) = 11
        insn(ebpf::CALL, 0, 1, 0, 2),         // call insn 4
        insn(ebpf::LD_DW_REG, 0, 10, -8, 0),  // r0 = *(u64 *)(r10 - 8)
        insn(ebpf::EXIT, 0, 0, 0, 0),
        insn(ebpf::ST_DW_IMM, 10, 0, -8, 22), // the callee's own slot
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(both(&code, &[]), (11, 11));
}

#[test]
fn a_backward_call_works_in_debug_builds() {
    let code = prog(&[
        insn(ebpf::JA, 0, 0, 2, 0), // skip the function
        insn(ebpf::MOV64_IMM, 0, 0, 0, 5),
        insn(ebpf::EXIT, 0, 0, 0, 0),
        insn(ebpf::CALL, 0, 1, 0, -3), // call insn 1
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(both(&code, &[]), (5, 5));
}

#[test]
fn the_vm_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<rbpf::EbpfVmMbuff<'static>>();
}

#[test]
fn stores_through_mem_and_mbuff_are_visible() {
    // *(u8 *)(r1 + 0) = 9 on the metadata buffer, via execute_program_mut.
    let code = prog(&[
        insn(ebpf::ST_B_IMM, 1, 0, 0, 9),
        insn(ebpf::MOV64_IMM, 0, 0, 0, 0),
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    let vm = rbpf::EbpfVmMbuff::new(Some(&code)).unwrap();
    let mut mem = [0u8; 4];
    let mut mbuff = [0u8; 4];
    vm.execute_program_mut(&mut mem, &mut mbuff).unwrap();
    assert_eq!(mbuff[0], 9);
}

#[test]
fn the_instruction_meter_stops_both_engines_at_the_same_charge() {
    // r0 = 0; loop: r0 += 1; if r0 < 1000 goto loop (a backward jump of 2); exit.
    let code = prog(&[
        insn(ebpf::MOV64_IMM, 0, 0, 0, 0),
        insn(ebpf::ADD64_IMM, 0, 0, 0, 1),
        insn(ebpf::JLT_IMM, 0, 0, -2, 1000),
        insn(ebpf::EXIT, 0, 0, 0, 0),
    ]);
    let mut vm = rbpf::EbpfVmMbuff::new(Some(&code)).unwrap();
    vm.jit_compile_metered().unwrap();
    let (mut mem, mut mbuff) = ([0u8; 8], [0u8; 16]);
    for (budget, stops) in [(2_000i64, false), (5_000, false), (1_999, true), (10, true)] {
        let meter = std::cell::Cell::new(budget);
        let interp = vm.execute_program_metered(&mut mem, &mut mbuff, &meter);
        let left_interp = meter.get();
        let jit_meter = std::cell::Cell::new([budget, 0]);
        // SAFETY: the program only touches its registers; compiled metered above.
        let jit = unsafe { vm.execute_program_jit_metered(&mut mem, &mut mbuff, &jit_meter) };
        assert_eq!(left_interp, jit_meter.get()[0], "budget {budget}");
        assert_eq!(interp.is_err(), stops, "budget {budget}");
        assert_eq!(left_interp < 0, stops, "budget {budget}");
        if !stops {
            // 999 taken jumps and the final not-taken one: 1000 charges of 2.
            assert_eq!((interp.unwrap(), jit.unwrap()), (1000, 1000));
            assert_eq!(left_interp, budget - 2_000);
        }
    }
}

// Inline helpers: what the Rust helpers below compute, the metered JIT emits inline.
thread_local! {
    static METER: std::cell::Cell<[i64; 2]> = const { std::cell::Cell::new([0; 2]) };
    static MBUFF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

const COUNTERS: u32 = 48;
const NCOUNTERS: u32 = 16;
const COST: u32 = 16;
// Map 0: 4 x 8 bytes at 176; map 1: none; map 2: 3 x 12 bytes at 208.
const ARRAYS: [Option<(u32, u32, u32)>; 3] = [Some((176, 8, 4)), None, Some((208, 12, 3))];

fn charge(units: u32) -> bool {
    METER.with(|m| {
        let [left, jit] = m.get();
        if left < 0 {
            return false;
        }
        let left = left - i64::from(units);
        m.set([left, jit]);
        left >= 0
    })
}

fn counter_add(index: u64, delta: u64, _: u64, _: u64, _: u64) -> u64 {
    if !charge(COST) || index as u32 >= NCOUNTERS {
        return u64::MAX;
    }
    let at = MBUFF.with(|m| m.get()) + COUNTERS as usize + 8 * (index as u32 as usize);
    // SAFETY: `at` is one of the 16 counters of the test's 256-byte mbuff, which the
    // run owns while this helper runs.
    unsafe {
        let p = at as *mut u64;
        p.write_unaligned(p.read_unaligned().wrapping_add(delta));
    }
    0
}

fn array_lookup(map: u64, index: u64, _: u64, _: u64, _: u64) -> u64 {
    if !charge(COST) {
        return 0;
    }
    match usize::try_from(map).ok().and_then(|m| ARRAYS.get(m)) {
        Some(Some((offset, elem, entries))) if (index as u32) < *entries => {
            (MBUFF.with(|m| m.get()) + *offset as usize + (index as u32 * elem) as usize) as u64
        }
        _ => 0,
    }
}

fn not_inlined(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0xdead
}

#[test]
fn inline_helpers_give_the_called_helpers_results_at_every_budget() {
    // (helper, r1, r2): in and out of range, indices truncated to 32 bits, wrapping adds,
    // a map the lookup answers 0 for, a map index past the table and one that is only
    // small in its low 32 bits.
    let calls: [(i32, u64, u64); 14] = [
        (2, 0, 1),
        (2, 15, u64::MAX),
        (2, 15, 2),
        (2, 16, 1),
        (2, 0x1_0000_0003, 7),
        (2, u64::MAX, 1),
        (1, 0, 3),
        (1, 0, 4),
        (1, 1, 0),
        (1, 2, 0x1_0000_0002),
        (1, 3, 0),
        (1, 0x1_0000_0000, 0),
        (2, 3, 5),
        (1, 2, 2),
    ];
    let mut insns = vec![
        insn(ebpf::MOV64_REG, 9, 1, 0, 0), // r9 = mbuff
        insn(ebpf::MOV64_IMM, 8, 0, 0, 0),
    ];
    for &(id, a1, a2) in &calls {
        insns.push(insn(ebpf::LD_DW_IMM, 1, 0, 0, a1 as u32 as i32));
        insns.push(insn(0, 0, 0, 0, (a1 >> 32) as u32 as i32));
        insns.push(insn(ebpf::LD_DW_IMM, 2, 0, 0, a2 as u32 as i32));
        insns.push(insn(0, 0, 0, 0, (a2 >> 32) as u32 as i32));
        insns.push(insn(ebpf::CALL, 0, 0, 0, id));
        if id == 1 {
            // An address is made relative to mbuff (0 stays 0).
            insns.push(insn(ebpf::JEQ_IMM, 0, 0, 1, 0));
            insns.push(insn(ebpf::SUB64_REG, 0, 9, 0, 0));
        }
        insns.push(insn(ebpf::MUL64_IMM, 8, 0, 0, 31));
        insns.push(insn(ebpf::ADD64_REG, 8, 0, 0, 0));
    }
    insns.push(insn(ebpf::MOV64_REG, 0, 8, 0, 0));
    insns.push(insn(ebpf::EXIT, 0, 0, 0, 0));
    let code = prog(&insns);
    let mut vm = rbpf::EbpfVmMbuff::new(Some(&code)).unwrap();
    // The JIT is compiled while the ids name a helper that does nothing: the results
    // below can only come from the inline code. The interpreter then calls the real ones.
    vm.register_helper(1, not_inlined).unwrap();
    vm.register_helper(2, not_inlined).unwrap();
    let inline = [
        (
            1,
            ebpf::InlineHelper::MbuffArrayLookup {
                arrays: ARRAYS.to_vec(),
                cost: COST,
            },
        ),
        (
            2,
            ebpf::InlineHelper::MbuffCounterAdd {
                base: COUNTERS,
                count: NCOUNTERS,
                cost: COST,
            },
        ),
    ];
    vm.jit_compile_metered_inline(&inline).unwrap();
    vm.register_helper(1, array_lookup).unwrap();
    vm.register_helper(2, counter_add).unwrap();
    let mut mem = [0u8; 8];
    let full = (COST as i64) * calls.len() as i64;
    let mut seen = std::collections::HashSet::new();
    for budget in (-1..=full + 1).chain([1 << 20]) {
        let mut out = vec![];
        for jit in [false, true] {
            let mut mbuff = [0u8; 256];
            for (i, b) in mbuff.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37);
            }
            MBUFF.with(|m| m.set(mbuff.as_mut_ptr() as usize));
            METER.with(|m| m.set([budget, 0]));
            let r0 = METER.with(|m| {
                if jit {
                    // SAFETY: compiled metered above; the program touches registers only,
                    // the inline helpers mbuff's counters and arrays (inside its 256 bytes).
                    unsafe { vm.execute_program_jit_metered(&mut mem, &mut mbuff, m) }
                } else {
                    let words: &std::cell::Cell<[i64]> = m;
                    vm.execute_program_metered(&mut mem, &mut mbuff, &words.as_slice_of_cells()[0])
                }
            });
            out.push((r0.unwrap(), mbuff, METER.with(|m| m.get()[0])));
        }
        assert_eq!(out[0], out[1], "budget {budget}");
        seen.insert(out[0].0);
    }
    // The budgets above stop the helpers at every call in turn; 8 of the calls change
    // the result when they succeed, so 9 distinct results (none of them all-failures
    // only).
    assert_eq!(seen.len(), 9, "{seen:?}");
}
