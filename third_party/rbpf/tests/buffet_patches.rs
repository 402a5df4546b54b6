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
