//! Verification with PREVAIL (the abstract-interpretation eBPF verifier, Rust port) against
//! a platform description of Buffet's context.
//!
//! What PREVAIL is told (the [`BuffetPlatform`]):
//!
//! * **Context** (r1 at entry): `struct buffet_ctx`, [`crate::abi::CTX_SIZE`]
//!   bytes, with the packet start at offset 0 and the packet end at offset 8 (64-bit
//!   pointers). A load of those two fields yields a packet pointer; every packet access
//!   must be proven within `[data, data_end)`; stores to the two pointer fields are
//!   rejected; other context bytes are plain numbers. Accesses beyond the 48 bytes are
//!   rejected, so the counters and maps that follow the context in the tenant's region
//!   are out of reach through r1.
//! * **Tenant region**: every map is a PREVAIL map (`EbpfMapDescriptor`) with its real
//!   size. `buffet_map_lookup` is declared as returning `PtrToMapValueOrNull` of the
//!   map's `value_size`, so the program must test for NULL and stay within one element;
//!   it only accepts ARRAY maps, `buffet_strset_lookup` only STRSET maps (PREVAIL's
//!   allowed-map-type check).
//! * **Stack**: two frames of 256 bytes (the program and one level of bpf-to-bpf calls),
//!   laid out exactly as rbpf's interpreter and (patched) JIT lay them out; reads of
//!   uninitialised stack are rejected.
//! * **Helpers**: only the five Buffet helpers exist (an unknown helper id is rejected),
//!   with argument types that take no pointer PREVAIL would have to trust — the helpers
//!   take offsets and check them at run time.
//! * **Instructions**: base 32/64-bit ALU, jumps, div/mod (conformance groups `base32`,
//!   `base64`, `divmul32`, `divmul64`); no atomics (rbpf has none), no legacy packet
//!   loads (`LD_ABS`/`LD_IND`), no `callx`.
//! * **Termination**: on — every loop head gets a counter that must be proven bounded
//!   (PREVAIL's limit is 100,000 iterations per loop head over a whole run; Buffet can
//!   lower it, see [`VerifierConfig::max_loop_iterations`]).
//!
//! **Off the data path, bounded in time and memory.** [`verify`] runs PREVAIL in a child
//! process (a `fork` of the caller, from a thread of its own with a large stack): the child
//! is killed when its resident memory grew by more than [`VerifierConfig::memory_budget`]
//! bytes (checked every 2 ms; its address space is capped at the same growth with
//! `RLIMIT_AS` as well) or when it runs past [`VerifierConfig::time_budget`]. PREVAIL's time and memory grow far faster than program
//! length, and it has no cancellation: a thread past its budget would keep a core busy
//! until it finished, and a stream of distinct slow programs would pile such threads up.
//! A killed child takes its work and memory with it, and is reaped before [`verify`]
//! returns, so nothing is left behind whatever the program. Past the time budget the
//! program is rejected with [`VerifyError::TimeBudget`], past the memory budget with
//! [`VerifyError::MemoryBudget`]. A fork (rather than a helper binary or a re-executed
//! binary with a hidden mode) works the same from every caller — the `buffet` binary,
//! a daemon, a test harness or a fuzzer — with nothing to install or find at run time.
//!
//! Completed verdicts are cached by the SHA-256 of the program, its maps and the loop
//! limit, so a program is verified once per process however many tenants name it. A
//! budget rejection is remembered too, with the budget it exceeded: the same program
//! asked again within no larger a budget is rejected at once instead of being run again.
//!
//! What it does not check, and who does: the return value (the host maps it, an
//! unknown value is a run-time fault) and helper arguments that are numbers (offsets,
//! counter indices; the helpers check them).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prevail::crab::ebpf_domain::DomainContext;
use prevail::crab::var_registry::VariableRegistry;
use prevail::elf_loader::UnmarshalError;
use prevail::fwd_analyzer;
use prevail::ir::program::Program as PrevailProgram;
use prevail::ir::syntax::{Condition, Instruction, Value};
use prevail::ir::unmarshal;
use prevail::linux::linux_platform::conformance_groups as groups;
use prevail::linux::spec_prototypes::{map_type_bit, HelperPrototype};
use prevail::platform::EbpfPlatform;
use prevail::spec::config::{EbpfRuntimeConfig, EbpfVerifierOptions, VerbosityOptions};
use prevail::spec::ebpf_base::{EbpfArgumentType as Arg, EbpfCtxDescriptor, EbpfReturnType};
use prevail::spec::type_descriptors::{
    EbpfMapDescriptor, EbpfMapType, EbpfMapValueType, EbpfProgramType, ProgramInfo,
};
use prevail::spec::vm_isa::EbpfInst;

use crate::abi::{self, helper, CTX_SIZE};
use crate::elf::{Image, MapKind};
use crate::sys::ChildEnd;

/// The context PREVAIL checks accesses through r1 against.
static BUFFET_CTX: EbpfCtxDescriptor = EbpfCtxDescriptor {
    size: CTX_SIZE as i32,
    data: abi::CTX_DATA as i32,
    end: abi::CTX_DATA_END as i32,
    meta: -1,
};

/// Bytes of one stack frame (rbpf's `LOCAL_FUNCTION_STACK_SIZE`).
pub const FRAME_SIZE: i32 = 256;
/// Frames: the program and one level of bpf-to-bpf calls (2 × 256 = rbpf's 512-byte stack).
pub const MAX_FRAMES: i32 = 2;
/// PREVAIL's own bound on a loop head's iterations.
pub const PREVAIL_LOOP_LIMIT: u32 = 100_000;
/// Longest program accepted, in instructions.
pub const MAX_INSNS: usize = 32_768;
/// Longest frame a program is run on (the context's offsets are 16-bit); longer frames
/// are dropped as malformed without running the program.
pub const MAX_FRAME_LEN: usize = 0xffff;
/// The packet size PREVAIL assumes as an upper bound. Larger than [`MAX_FRAME_LEN`] on
/// purpose: a program may compare `data + ctx->l4_off + 20` (a 16-bit offset plus a
/// header) with `data_end`, and PREVAIL only accepts pointer comparisons within
/// `max_packet_size`; below 100,000 so that a loop bounded by the packet end is still
/// proven to terminate within PREVAIL's loop limit. Sound because real frames are
/// shorter.
pub const VERIFIER_MAX_PACKET: i32 = 98_304;

const fn proto(
    name: &'static str,
    return_type: EbpfReturnType,
    args: [Arg; 5],
    allowed_map_types: u64,
) -> HelperPrototype {
    HelperPrototype {
        name,
        return_type,
        argument_type: args,
        reallocate_packet: false,
        ctx_descriptor: None,
        unsupported: false,
        might_sleep: false,
        zero_args_mask: 0,
        allowed_map_types,
    }
}

/// Prototypes of helpers 1..=6 (index = id - 1).
static HELPERS: [HelperPrototype; 6] = [
    proto(
        "buffet_map_lookup",
        EbpfReturnType::PtrToMapValueOrNull,
        [
            Arg::PtrToMap,
            Arg::Anything,
            Arg::DontCare,
            Arg::DontCare,
            Arg::DontCare,
        ],
        map_type_bit(abi::MAP_ARRAY) | map_type_bit(abi::MAP_SCRATCH),
    ),
    proto(
        "buffet_counter_add",
        EbpfReturnType::Integer,
        [
            Arg::Anything,
            Arg::Anything,
            Arg::DontCare,
            Arg::DontCare,
            Arg::DontCare,
        ],
        0,
    ),
    proto(
        "buffet_csum_replace",
        EbpfReturnType::Integer,
        [
            Arg::Anything,
            Arg::Anything,
            Arg::Anything,
            Arg::Anything,
            Arg::DontCare,
        ],
        0,
    ),
    proto(
        "buffet_strset_lookup",
        EbpfReturnType::Integer,
        [
            Arg::PtrToMap,
            Arg::Anything,
            Arg::Anything,
            Arg::Anything,
            Arg::DontCare,
        ],
        map_type_bit(abi::MAP_STRSET),
    ),
    proto(
        "buffet_pkt_find",
        EbpfReturnType::Integer,
        [
            Arg::Anything,
            Arg::Anything,
            Arg::Anything,
            Arg::DontCare,
            Arg::DontCare,
        ],
        0,
    ),
    proto(
        "buffet_dns_lookup",
        EbpfReturnType::Integer,
        [
            Arg::PtrToMap,
            Arg::Anything,
            Arg::Anything,
            Arg::DontCare,
            Arg::DontCare,
        ],
        map_type_bit(abi::MAP_STRSET),
    ),
];

static UNKNOWN_HELPER: HelperPrototype = HelperPrototype {
    name: "unknown",
    return_type: EbpfReturnType::Unsupported,
    argument_type: [Arg::DontCare; 5],
    reallocate_packet: false,
    ctx_descriptor: None,
    unsupported: true,
    might_sleep: false,
    zero_args_mask: 0,
    allowed_map_types: 0,
};

/// PREVAIL's view of Buffet: program type, helpers, maps.
pub struct BuffetPlatform {
    maps: Vec<EbpfMapDescriptor>,
}

impl BuffetPlatform {
    fn new(image: &Image) -> Self {
        let maps = image
            .maps
            .iter()
            .enumerate()
            .map(|(i, m)| EbpfMapDescriptor {
                original_fd: i as i32,
                map_type: match m.kind {
                    MapKind::Array if m.scratch => abi::MAP_SCRATCH,
                    MapKind::Array => abi::MAP_ARRAY,
                    MapKind::StrSet => abi::MAP_STRSET,
                },
                key_size: m.key_size,
                value_size: m.value_size,
                max_entries: m.max_entries,
                inner_map_fd: -1,
                name: m.name.clone(),
                is_inner_map_template: false,
            })
            .collect();
        BuffetPlatform { maps }
    }

    fn program_type() -> EbpfProgramType {
        EbpfProgramType {
            name: "buffet".into(),
            ctx_descriptor: Some(&BUFFET_CTX),
            platform_specific_data: 0,
            section_prefixes: vec![crate::elf::DEFAULT_SECTION.into()],
            is_privileged: false,
            is_sleepable: false,
        }
    }
}

impl EbpfPlatform for BuffetPlatform {
    fn get_program_type(&self, _section: &str, _path: &str) -> EbpfProgramType {
        Self::program_type()
    }

    fn get_helper_prototype(&self, n: i32) -> &HelperPrototype {
        self.try_get_helper_prototype(n).unwrap_or(&UNKNOWN_HELPER)
    }

    fn try_get_helper_prototype(&self, n: i32) -> Option<&HelperPrototype> {
        usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| HELPERS.get(i))
    }

    fn is_helper_usable(&self, n: i32) -> bool {
        helper::ALL.contains(&n)
    }

    fn map_record_size(&self) -> usize {
        20
    }

    fn parse_maps_section(
        &mut self,
        _descriptors: &mut Vec<EbpfMapDescriptor>,
        _data: &[u8],
        _record_size: usize,
        _count: usize,
        _options: &EbpfVerifierOptions,
    ) {
        // Buffet's own loader (crate::elf) reads the maps; PREVAIL's ELF loader is unused.
    }

    fn resolve_inner_map_references(
        &self,
        _descriptors: &mut Vec<EbpfMapDescriptor>,
    ) -> Result<(), UnmarshalError> {
        Ok(())
    }

    fn get_map_descriptor(&self, map_fd: i32) -> Option<&EbpfMapDescriptor> {
        self.maps.iter().find(|m| m.original_fd == map_fd)
    }

    fn get_map_type(&self, platform_specific_type: u32) -> EbpfMapType {
        let (name, is_array) = match platform_specific_type {
            abi::MAP_ARRAY => ("array", true),
            abi::MAP_STRSET => ("strset", false),
            abi::MAP_SCRATCH => ("scratch", true),
            _ => ("unsupported", false),
        };
        EbpfMapType {
            platform_specific_type,
            name: name.into(),
            is_array,
            value_type: EbpfMapValueType::Any,
        }
    }

    fn supported_conformance_groups(&self) -> u32 {
        groups::BASE32 | groups::BASE64 | groups::DIVMUL32 | groups::DIVMUL64
    }
}

/// How long [`verify`] waits for PREVAIL by default.
pub const DEFAULT_TIME_BUDGET: Duration = Duration::from_secs(60);

/// How much address space [`verify`]'s child process may add by default (1 GiB).
pub const DEFAULT_MEMORY_BUDGET: u64 = 1 << 30;

/// Verifier settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifierConfig {
    /// Most iterations any one loop head may run per packet, as proven by PREVAIL
    /// (at most [`PREVAIL_LOOP_LIMIT`]). Together with the program's length this bounds
    /// the instructions one packet can cost.
    pub max_loop_iterations: u32,
    /// Longest the verification of one program may take (default
    /// [`DEFAULT_TIME_BUDGET`]); past it the program is rejected.
    pub time_budget: Duration,
    /// Most bytes of address space the verification of one program may add (default
    /// [`DEFAULT_MEMORY_BUDGET`]); past it the program is rejected.
    pub memory_budget: u64,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        VerifierConfig {
            max_loop_iterations: PREVAIL_LOOP_LIMIT,
            time_budget: DEFAULT_TIME_BUDGET,
            memory_budget: DEFAULT_MEMORY_BUDGET,
        }
    }
}

/// What verification proved about an accepted program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Instructions (an `ld_imm64` counts as two).
    pub instructions: usize,
    /// The largest iteration count PREVAIL proved for any loop head (0: no loops).
    pub max_loop_count: u32,
    /// Possible return values, as PREVAIL's interval for r0 at exit.
    pub exit_value: String,
}

/// Why a program was rejected. Its `Display` is the verifier's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Too many instructions.
    #[error("{0} instructions exceed the limit of {MAX_INSNS}")]
    TooLong(usize),
    /// An instruction Buffet does not run (checked before PREVAIL).
    #[error("instruction {insn}: {message}")]
    Unsupported {
        /// Instruction index.
        insn: usize,
        /// Which and why.
        message: String,
    },
    /// PREVAIL could not decode the program (bad opcode, register, helper id, ...).
    #[error("{0}")]
    Malformed(String),
    /// Invalid control flow (jump out of the program, missing exit, call depth, ...).
    #[error("{0}")]
    ControlFlow(String),
    /// The abstract interpretation found a possible violation: `label: message`.
    #[error("{0}")]
    Rejected(String),
    /// Proven to terminate, but a loop may run longer than the configured budget.
    #[error("a loop may run {count} iterations per packet; the limit is {limit}")]
    LoopBudget {
        /// PREVAIL's bound.
        count: u32,
        /// The configured limit.
        limit: u32,
    },
    /// The verifier itself failed (a bug in it); the program is not accepted.
    #[error("verifier internal error: {0}")]
    Internal(String),
    /// Verification took longer than the configured budget.
    #[error(
        "verification did not finish within its time budget of {} ms; the program is \
         rejected (simplify its loops, or raise the budget)",
        budget.as_millis()
    )]
    TimeBudget {
        /// The budget.
        budget: Duration,
    },
    /// Verification needed more memory than the configured budget.
    #[error(
        "verification ran out of its memory budget of {} MiB; the program is rejected \
         (simplify it, or raise the budget)",
        budget >> 20
    )]
    MemoryBudget {
        /// The budget, in bytes.
        budget: u64,
    },
}

fn insts(image: &Image) -> Vec<EbpfInst> {
    image
        .insns
        .chunks_exact(8)
        .map(|c| EbpfInst {
            opcode: c[0],
            dst_src: c[1],
            offset: i16::from_le_bytes([c[2], c[3]]),
            imm: i32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect()
}

/// Buffet's own structural checks, before PREVAIL: instructions rbpf would run
/// differently from the model.
fn precheck(insns: &[EbpfInst]) -> Result<(), VerifyError> {
    if insns.len() > MAX_INSNS {
        return Err(VerifyError::TooLong(insns.len()));
    }
    let mut i = 0;
    while i < insns.len() {
        let ins = &insns[i];
        let src = ins.dst_src >> 4;
        let class = ins.opcode & 0x07;
        let unsupported = |message: &str| VerifyError::Unsupported {
            insn: i,
            message: message.into(),
        };
        match ins.opcode {
            0x18 => {
                if src > 1 {
                    return Err(unsupported(
                        "ld_imm64 of a map value, variable or code address is not supported \
                         (only constants and map references)",
                    ));
                }
                i += 1;
            }
            0x85 if src > 1 => {
                return Err(unsupported("kfunc calls are not supported"));
            }
            // BPF_LD with BPF_ABS / BPF_IND modes.
            op if class == 0x00 && matches!(op & 0xe0, 0x20 | 0x40) => {
                return Err(unsupported(
                    "legacy packet loads (LD_ABS/LD_IND) are not supported; read the packet \
                     through ctx->data",
                ));
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn options() -> EbpfVerifierOptions {
    EbpfVerifierOptions {
        runtime: EbpfRuntimeConfig {
            strict: false,
            // rbpf defines division by zero (0, and modulo leaves the dividend).
            allow_division_by_zero: true,
            setup_constraints: true,
            big_endian: false,
            check_for_termination: true,
            subprogram_stack_size: FRAME_SIZE,
            max_call_stack_frames: MAX_FRAMES,
            max_packet_size: VERIFIER_MAX_PACKET,
        },
        verbosity_opts: VerbosityOptions::default(),
        must_have_exit: true,
        mock_map_fds: true,
    }
}

/// SHA-256 of what a verdict depends on: the code, the maps and the loop limit.
fn verdict_key(image: &Image, cfg: &VerifierConfig) -> [u8; 32] {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    h.update(&(image.insns.len() as u64).to_le_bytes());
    h.update(&image.insns);
    for m in &image.maps {
        let kind = match m.kind {
            MapKind::Array if m.scratch => abi::MAP_SCRATCH,
            MapKind::Array => abi::MAP_ARRAY,
            MapKind::StrSet => abi::MAP_STRSET,
        };
        for w in [kind, m.key_size, m.value_size, m.max_entries] {
            h.update(&w.to_le_bytes());
        }
    }
    h.update(&cfg.max_loop_iterations.to_le_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(h.finish().as_ref());
    key
}

type Verdicts = Mutex<HashMap<[u8; 32], Result<Verified, VerifyError>>>;

/// Completed verdicts, by [`verdict_key`]. Bounded by the distinct programs loaded.
fn verdicts() -> &'static Verdicts {
    static CACHE: OnceLock<Verdicts> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The largest time and memory budgets a program was seen to exceed, by [`verdict_key`].
type Exceeded = Mutex<HashMap<[u8; 32], (Duration, u64)>>;

fn exceeded() -> &'static Exceeded {
    static CACHE: OnceLock<Exceeded> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Verdicts in the process-wide cache.
pub fn cached_verdicts() -> usize {
    verdicts().lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// Stack of the thread that forks the verifier's child (PREVAIL recurses deeply on
/// long programs); only touched pages cost memory.
const VERIFIER_STACK: usize = 64 << 20;

/// Verifies a loaded image in a child process within [`VerifierConfig::time_budget`] and
/// [`VerifierConfig::memory_budget`] (see the module documentation); a verdict already
/// reached for the same program, maps and loop limit is returned from the cache. Never
/// panics: a panic inside PREVAIL is [`VerifyError::Internal`]. When it returns, the
/// child is gone.
pub fn verify(image: &Image, cfg: &VerifierConfig) -> Result<Verified, VerifyError> {
    let key = verdict_key(image, cfg);
    if let Some(v) = verdicts()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return v.clone();
    }
    if let Some(&(time, memory)) = exceeded()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        if cfg.time_budget <= time {
            return Err(VerifyError::TimeBudget {
                budget: cfg.time_budget,
            });
        }
        if cfg.memory_budget <= memory {
            return Err(VerifyError::MemoryBudget {
                budget: cfg.memory_budget,
            });
        }
    }
    // Cheap structural checks first, in this process: no child for what they reject.
    precheck(&insts(image))?;
    let (image, cfg_copy) = (image.clone(), *cfg);
    let verdict = std::thread::Builder::new()
        .name("buffet-verify".into())
        .stack_size(VERIFIER_STACK)
        .spawn(move || {
            crate::sys::run_in_child(cfg_copy.memory_budget, cfg_copy.time_budget, || {
                wire::encode(&verify_here(&image, &cfg_copy))
            })
        })
        .map_err(|e| VerifyError::Internal(format!("cannot start the verifier thread: {e}")))?
        .join()
        .map_err(|_| VerifyError::Internal("the verifier thread panicked".into()))?
        .map_err(|e| VerifyError::Internal(format!("cannot start the verifier process: {e}")))?;
    let verdict = match verdict {
        (ChildEnd::Exited(0), bytes) => wire::decode(&bytes).unwrap_or_else(|| {
            Err(VerifyError::Internal(
                "the verifier process sent an unreadable verdict".into(),
            ))
        }),
        (ChildEnd::OverMemory, _) => Err(VerifyError::MemoryBudget {
            budget: cfg.memory_budget,
        }),
        (ChildEnd::TimedOut, _) => Err(VerifyError::TimeBudget {
            budget: cfg.time_budget,
        }),
        // Rust aborts when an allocation fails, and allocations fail at the address-space
        // limit; PREVAIL's own panics are caught and reported as verdicts.
        (ChildEnd::Signaled(libc_sigabrt), _) if libc_sigabrt == SIGABRT => {
            Err(VerifyError::MemoryBudget {
                budget: cfg.memory_budget,
            })
        }
        (ChildEnd::Signaled(sig), _) => Err(VerifyError::Internal(format!(
            "the verifier process died of signal {sig}"
        ))),
        (ChildEnd::Exited(code), _) => Err(VerifyError::Internal(format!(
            "the verifier process exited with status {code}"
        ))),
    };
    match &verdict {
        Err(VerifyError::TimeBudget { .. } | VerifyError::MemoryBudget { .. }) => {
            let mut map = exceeded().lock().unwrap_or_else(|e| e.into_inner());
            let e = map.entry(key).or_insert((Duration::ZERO, 0));
            match verdict {
                Err(VerifyError::TimeBudget { budget }) => e.0 = e.0.max(budget),
                _ => e.1 = e.1.max(cfg.memory_budget),
            }
        }
        Err(VerifyError::Internal(_)) => {}
        _ => {
            verdicts()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, verdict.clone());
        }
    }
    verdict
}

/// The signal Rust's allocation-failure handler aborts with.
const SIGABRT: i32 = 6;

/// A verdict as bytes, from the verifier's child process to its parent.
mod wire {
    use super::{Verified, VerifyError};
    use std::time::Duration;

    fn put_u64(out: &mut Vec<u8>, v: u64) {
        out.extend_from_slice(&v.to_le_bytes());
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        put_u64(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }

    pub(super) fn encode(v: &Result<Verified, VerifyError>) -> Vec<u8> {
        let mut out = Vec::new();
        match v {
            Ok(v) => {
                out.push(0);
                put_u64(&mut out, v.instructions as u64);
                put_u64(&mut out, u64::from(v.max_loop_count));
                put_str(&mut out, &v.exit_value);
            }
            Err(e) => match e {
                VerifyError::TooLong(n) => {
                    out.push(1);
                    put_u64(&mut out, *n as u64);
                }
                VerifyError::Unsupported { insn, message } => {
                    out.push(2);
                    put_u64(&mut out, *insn as u64);
                    put_str(&mut out, message);
                }
                VerifyError::Malformed(m) => {
                    out.push(3);
                    put_str(&mut out, m);
                }
                VerifyError::ControlFlow(m) => {
                    out.push(4);
                    put_str(&mut out, m);
                }
                VerifyError::Rejected(m) => {
                    out.push(5);
                    put_str(&mut out, m);
                }
                VerifyError::LoopBudget { count, limit } => {
                    out.push(6);
                    put_u64(&mut out, u64::from(*count));
                    put_u64(&mut out, u64::from(*limit));
                }
                VerifyError::Internal(m) => {
                    out.push(7);
                    put_str(&mut out, m);
                }
                VerifyError::TimeBudget { budget } => {
                    out.push(8);
                    put_u64(&mut out, budget.as_nanos() as u64);
                }
                VerifyError::MemoryBudget { budget } => {
                    out.push(9);
                    put_u64(&mut out, *budget);
                }
            },
        }
        out
    }

    struct Reader<'a>(&'a [u8]);

    impl Reader<'_> {
        fn u64(&mut self) -> Option<u64> {
            let (head, rest) = self.0.split_first_chunk::<8>()?;
            self.0 = rest;
            Some(u64::from_le_bytes(*head))
        }

        fn u32(&mut self) -> Option<u32> {
            u32::try_from(self.u64()?).ok()
        }

        fn str(&mut self) -> Option<String> {
            let n = usize::try_from(self.u64()?).ok()?;
            if n > self.0.len() {
                return None;
            }
            let (s, rest) = self.0.split_at(n);
            self.0 = rest;
            String::from_utf8(s.to_vec()).ok()
        }
    }

    /// `None` when the bytes are not a whole verdict.
    pub(super) fn decode(bytes: &[u8]) -> Option<Result<Verified, VerifyError>> {
        let (&tag, rest) = bytes.split_first()?;
        let mut r = Reader(rest);
        let v = match tag {
            0 => Ok(Verified {
                instructions: usize::try_from(r.u64()?).ok()?,
                max_loop_count: r.u32()?,
                exit_value: r.str()?,
            }),
            1 => Err(VerifyError::TooLong(usize::try_from(r.u64()?).ok()?)),
            2 => Err(VerifyError::Unsupported {
                insn: usize::try_from(r.u64()?).ok()?,
                message: r.str()?,
            }),
            3 => Err(VerifyError::Malformed(r.str()?)),
            4 => Err(VerifyError::ControlFlow(r.str()?)),
            5 => Err(VerifyError::Rejected(r.str()?)),
            6 => Err(VerifyError::LoopBudget {
                count: r.u32()?,
                limit: r.u32()?,
            }),
            7 => Err(VerifyError::Internal(r.str()?)),
            8 => Err(VerifyError::TimeBudget {
                budget: Duration::from_nanos(r.u64()?),
            }),
            9 => Err(VerifyError::MemoryBudget { budget: r.u64()? }),
            _ => return None,
        };
        r.0.is_empty().then_some(v)
    }
}

/// Verifies on the calling thread, without budget or cache.
fn verify_here(image: &Image, cfg: &VerifierConfig) -> Result<Verified, VerifyError> {
    let insns = insts(image);
    precheck(&insns)?;
    let opts = options();
    let limit = cfg.max_loop_iterations.min(PREVAIL_LOOP_LIMIT);
    let platform = BuffetPlatform::new(image);
    let outcome = catch_unwind(AssertUnwindSafe(|| run_prevail(&insns, &platform, &opts)));
    let (max_loop_count, exit_value) = match outcome {
        Ok(r) => r?,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            return Err(VerifyError::Internal(msg));
        }
    };
    if max_loop_count > limit {
        return Err(VerifyError::LoopBudget {
            count: max_loop_count,
            limit,
        });
    }
    Ok(Verified {
        instructions: insns.len(),
        max_loop_count,
        exit_value,
    })
}

/// The types PREVAIL may give register `r` in `types` (its type constraints as text:
/// `r2.type=packet`, `r2.type in {number, packet}`, `r3.type=r2.type`); `None` when
/// unconstrained (any type).
fn reg_types(types: &std::collections::BTreeSet<String>, r: u8) -> Option<Vec<String>> {
    let mut name = format!("r{r}.type");
    for _ in 0..16 {
        let mut next = None;
        for c in types {
            if let Some(rest) = c.strip_prefix(name.as_str()) {
                if let Some(set) = rest.strip_prefix(" in {").and_then(|x| x.strip_suffix('}')) {
                    return Some(set.split(", ").map(str::to_owned).collect());
                }
                if let Some(t) = rest.strip_prefix('=') {
                    if t.ends_with(".type") {
                        next = Some(t.to_owned());
                    } else {
                        return Some(vec![t.to_owned()]);
                    }
                }
            }
        }
        name = next?;
    }
    None
}

/// Rejects what lets a program observe a host address and PREVAIL accepts: a comparison
/// of a register that may hold a pointer with a register that may hold a number (its
/// outcome is a bit of the address — repeat it and the program rebuilds `ctx->data`),
/// and a 32-bit comparison of pointers (it depends on the address's low 32 bits). Every
/// other way a pointer's value could become a number PREVAIL already rejects for
/// unprivileged programs: ALU operations other than pointer ± number and same-region
/// pointer − pointer (an offset), pointers as helper arguments or return value, pointers
/// stored anywhere but the stack, partial reloads of a spilled pointer. A comparison with
/// the constant 0 (a NULL test) reveals nothing and stays allowed; comparisons of two
/// pointers into the same region compare offsets and stay allowed.
fn no_address_comparisons(
    program: &PrevailProgram,
    result: &prevail::result::AnalysisResult,
    registry: &VariableRegistry,
) -> Result<(), VerifyError> {
    for label in program.labels() {
        let cond: &Condition = match program.instruction_at(label) {
            Instruction::Jmp(j) => match &j.cond {
                Some(c) => c,
                None => continue,
            },
            Instruction::Assume(a) if !a.is_implicit => &a.cond,
            _ => continue,
        };
        let Value::Reg(right) = &cond.right else {
            continue;
        };
        let Some(inv) = result.invariants.get(label) else {
            continue;
        };
        if inv.pre.is_bottom() {
            continue;
        }
        let set = inv.pre.to_set(registry);
        let types = set.value();
        let (l, r) = (reg_types(types, cond.left.v), reg_types(types, right.v));
        let only_numbers = |t: &Option<Vec<String>>| t.as_ref().is_some_and(|t| t == &["number"]);
        let no_numbers =
            |t: &Option<Vec<String>>| t.as_ref().is_some_and(|t| !t.iter().any(|x| x == "number"));
        let describe = |t: &Option<Vec<String>>| match t {
            Some(t) => t.join(" or "),
            None => "anything".into(),
        };
        let ok = (only_numbers(&l) && only_numbers(&r))
            || (cond.is64 && no_numbers(&l) && no_numbers(&r));
        if !ok {
            return Err(VerifyError::Rejected(format!(
                "{label}: comparing r{} ({}) with r{} ({}){} could reveal a host address \
                 (compare numbers with numbers, pointers with pointers into the same \
                 packet or map element, 64-bit)",
                cond.left.v,
                describe(&l),
                right.v,
                describe(&r),
                if cond.is64 { "" } else { " in 32 bits" },
            )));
        }
    }
    Ok(())
}

/// PREVAIL's refusal of an instruction the platform lacks (`rejected: DETAIL (at
/// LABEL)`) in the form of its other findings, `LABEL: DETAIL` (the caller already says
/// the program was rejected); any other message as it is.
fn label_first(message: &str) -> String {
    message
        .strip_prefix("rejected: ")
        .and_then(|m| m.strip_suffix(')'))
        .and_then(|m| m.rsplit_once(" (at "))
        .map_or_else(
            || message.to_owned(),
            |(detail, label)| format!("{label}: {detail}"),
        )
}

fn run_prevail(
    insns: &[EbpfInst],
    platform: &BuffetPlatform,
    opts: &EbpfVerifierOptions,
) -> Result<(u32, String), VerifyError> {
    let mut info = ProgramInfo {
        map_descriptors: platform.maps.clone(),
        program_type: BuffetPlatform::program_type(),
        supported_conformance_groups: platform.supported_conformance_groups(),
        ..ProgramInfo::default()
    };
    let mut notes = Vec::new();
    let seq = unmarshal::unmarshal(insns, &mut notes, &info, platform, opts)
        .map_err(|e| VerifyError::Malformed(e.to_string()))?;
    let program = PrevailProgram::from_sequence(&seq, &mut info, platform, opts)
        .map_err(|e| VerifyError::ControlFlow(label_first(&e.to_string())))?;
    let ctx = DomainContext {
        program_info: &info,
        program: &program,
        runtime: &opts.runtime,
        options: opts,
        platform,
    };
    let mut registry = VariableRegistry::new();
    let result = fwd_analyzer::analyze(&program, &ctx, &mut registry);
    if result.failed {
        let message = result
            .find_first_error()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "verification failed".into());
        return Err(VerifyError::Rejected(message));
    }
    no_address_comparisons(&program, &result, &registry)?;
    Ok((
        u32::try_from(result.max_loop_count).unwrap_or(u32::MAX),
        result.exit_value.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_instruction_reads_like_the_other_findings() {
        assert_eq!(
            label_first("rejected: helper function is unavailable on this platform (at 6)"),
            "6: helper function is unavailable on this platform"
        );
        assert_eq!(
            label_first("rejected: kfunc prototype is unavailable on this platform: x (at 12)"),
            "12: kfunc prototype is unavailable on this platform: x"
        );
        assert_eq!(label_first("jump out of bounds"), "jump out of bounds");
    }

    #[test]
    fn verdicts_cross_the_pipe_unchanged() {
        let all: Vec<Result<Verified, VerifyError>> = vec![
            Ok(Verified {
                instructions: 42,
                max_loop_count: 7,
                exit_value: "[0, 2]".into(),
            }),
            Err(VerifyError::TooLong(40_000)),
            Err(VerifyError::Unsupported {
                insn: 3,
                message: "kfunc".into(),
            }),
            Err(VerifyError::Malformed("bad opcode".into())),
            Err(VerifyError::ControlFlow("jump out".into())),
            Err(VerifyError::Rejected("12: upper bound".into())),
            Err(VerifyError::LoopBudget {
                count: 10,
                limit: 5,
            }),
            Err(VerifyError::Internal("oops".into())),
            Err(VerifyError::TimeBudget {
                budget: Duration::from_millis(1500),
            }),
            Err(VerifyError::MemoryBudget { budget: 1 << 20 }),
        ];
        for v in all {
            let bytes = wire::encode(&v);
            assert_eq!(wire::decode(&bytes), Some(v.clone()));
            // A verdict cut short is not a verdict.
            assert_eq!(wire::decode(&bytes[..bytes.len() - 1]), None);
        }
        assert_eq!(wire::decode(&[]), None);
        assert_eq!(wire::decode(&[99]), None);
    }
}
