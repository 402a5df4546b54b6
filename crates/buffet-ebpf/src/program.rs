//! A verified program, ready to run: its tenant-region layout and its rbpf VM.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::abi::{self, CtxFields, MAPS_OFFSET};
use crate::elf::{self, ElfError, Image, MapDef, MapKind};
use crate::helpers::{self, MapSlot, METER, RUN};
use crate::sys::{self, Area};
use crate::verify::{self, Verified, VerifierConfig, VerifyError};

/// Largest tenant region a program may declare (context, counters and maps).
pub const MAX_REGION_BYTES: u64 = 64 << 20;
/// Longest string a STRSET map may hold.
pub const MAX_STRSET_KEY: u32 = 4096;
/// Cost units one packet may spend unless the tenant's policy says otherwise
/// (`cost_budget`). A unit is an instruction (charged at backward jumps: the code jumped
/// back over; at bpf-to-bpf calls: the code from the callee to the end) or a byte a
/// helper scans, hashes or compares (plus 16 per helper call). 1 Mi units is far above
/// what the examples spend (the DPI: a few hundred per packet; `loops.c`'s byte loops about
/// 35 per byte of a 1,500-byte frame) and milliseconds of work at most.
pub const DEFAULT_COST_BUDGET: u64 = 1 << 20;

/// How programs are executed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Engine {
    /// rbpf's interpreter: every load and store is also checked at run time against the
    /// packet, the tenant region and the stack (a second line of defence behind the
    /// verifier; a failed check faults the tenant).
    #[default]
    Interpreter,
    /// rbpf's x86-64 JIT (Buffet-patched, see `third_party/rbpf/BUFFET.md`): native code
    /// without run-time bounds checks, safe as far as the verifier's proof is.
    Jit,
}

impl Engine {
    /// `interpreter` or `jit`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Interpreter => "interpreter",
            Engine::Jit => "jit",
        }
    }
}

/// How a program is loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The ELF section holding the program (default `buffet`).
    pub section: Option<String>,
    /// The engine.
    pub engine: Engine,
    /// Verifier settings.
    pub verifier: VerifierConfig,
}

/// Why a program cannot be used. Nothing was loaded when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// The object could not be read or linked.
    #[error(transparent)]
    Load(#[from] ElfError),
    /// The verifier rejected the program.
    #[error("rejected by the verifier: {0}")]
    Verify(#[from] VerifyError),
    /// A map declaration Buffet cannot lay out.
    #[error("map `{map}`: {message}")]
    Map {
        /// The map.
        map: String,
        /// What is wrong.
        message: String,
    },
    /// rbpf refused the program or could not compile it.
    #[error("{engine}: {message}")]
    Vm {
        /// The engine.
        engine: &'static str,
        /// rbpf's message.
        message: String,
    },
}

/// Why one run failed. The tenant is faulted; the message says where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The region is not this program's (the tenant was not initialised for it).
    #[error("tenant region of {got} bytes, the program needs {want}")]
    Region {
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// rbpf stopped the program (out-of-bounds access caught by the interpreter, too
    /// deep a call chain, ...).
    #[error("{0}")]
    Vm(String),
    /// The packet's work (instructions and helper work) went over its cost budget: the
    /// engine stopped the program at the first backward jump or call past it, and the
    /// helpers refused to work from the charge that crossed it on.
    #[error(
        "cost budget exceeded: at least {spent} units spent (instructions and helper work), \
         the budget is {budget}"
    )]
    Budget {
        /// Units charged (including the charge that crossed the budget).
        spent: u64,
        /// The budget.
        budget: u64,
    },
}

/// A program that passed the ELF loader, the verifier and rbpf, shared by every tenant
/// that runs it. `Sync`: workers run it concurrently, each on its own tenant region.
pub struct Program {
    id: u64,
    image: Image,
    verified: Verified,
    maps: Vec<MapSlot>,
    /// Byte ranges of the scratch maps in a tenant region, zeroed before every run.
    scratch: Vec<std::ops::Range<usize>>,
    /// What zeroing them costs each packet, in units of the cost budget.
    scratch_cost: u64,
    region_len: usize,
    counter_names: Vec<&'static str>,
    engine: Engine,
    /// Whether a run can call a helper in the host ([`calls_host_helpers`]): only then
    /// does each packet's area go into the thread's run context.
    host_helpers: bool,
    vm: rbpf::EbpfVmMbuff<'static>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("section", &self.image.section)
            .field("function", &self.image.function)
            .field("instructions", &self.verified.instructions)
            .field("maps", &self.image.maps)
            .field("region_len", &self.region_len)
            .field("engine", &self.engine)
            .finish()
    }
}

/// What [`check`] reports about an acceptable object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The linked program.
    pub image: Image,
    /// What the verifier proved.
    pub verified: Verified,
    /// Bytes of one tenant's region.
    pub region_len: usize,
}

/// Loads, links and verifies an object without preparing it to run: what `buffet nf
/// check` prints.
pub fn check(bytes: &[u8], opts: &LoadOptions) -> Result<CheckReport, ProgramError> {
    let image = elf::load(bytes, opts.section.as_deref())?;
    let (_, region_len) = layout(&image.maps)?;
    let verified = verify::verify(&image, &opts.verifier)?;
    // rbpf's own structural checks (the VM borrows the bytes only for this call).
    rbpf::EbpfVmMbuff::new(Some(&image.insns)).map_err(|e| ProgramError::Vm {
        engine: opts.engine.name(),
        message: e.to_string(),
    })?;
    Ok(CheckReport {
        image,
        verified,
        region_len,
    })
}

/// Lays the maps out after the context and the counters; (slots, region bytes).
fn layout(maps: &[MapDef]) -> Result<(Vec<MapSlot>, usize), ProgramError> {
    let mut offset = MAPS_OFFSET as u64;
    let mut slots = Vec::with_capacity(maps.len());
    let mut scratch = 0u64;
    for m in maps {
        let err = |message: String| ProgramError::Map {
            map: m.name.clone(),
            message,
        };
        let (elem, entries) = (u64::from(m.value_size), u64::from(m.max_entries));
        if entries == 0 {
            return Err(err("max_entries is 0".into()));
        }
        let slot = match m.kind {
            MapKind::Array => {
                if m.scratch && (entries != 1 || m.value_size > abi::MAX_SCRATCH_BYTES) {
                    return Err(err(format!(
                        "a SCRATCH map is one element of at most {} bytes, not {entries} x {}",
                        abi::MAX_SCRATCH_BYTES,
                        m.value_size
                    )));
                }
                if m.scratch {
                    scratch += elem;
                    if scratch > u64::from(abi::MAX_SCRATCH_BYTES) {
                        return Err(err(format!(
                            "the program's SCRATCH maps hold {scratch} bytes with this one; \
                             at most {} in all (they are zeroed before every packet)",
                            abi::MAX_SCRATCH_BYTES
                        )));
                    }
                }
                if m.key_size != 4 {
                    return Err(err(format!(
                        "an ARRAY map has 4-byte keys, not {}",
                        m.key_size
                    )));
                }
                if elem == 0 {
                    return Err(err("value_size is 0".into()));
                }
                MapSlot {
                    strset: false,
                    offset,
                    elem,
                    entries,
                    slots: 0,
                    len: elem.saturating_mul(entries),
                }
            }
            MapKind::StrSet => {
                if m.key_size == 0 || m.key_size > MAX_STRSET_KEY {
                    return Err(err(format!(
                        "a STRSET map's key_size (longest string) must be 1..={MAX_STRSET_KEY}, not {}",
                        m.key_size
                    )));
                }
                if m.value_size != 0 {
                    return Err(err("a STRSET map has no values (value_size 0)".into()));
                }
                if entries > u64::from(u16::MAX) {
                    return Err(err(format!(
                        "a STRSET map holds at most {} strings, not {entries}",
                        u16::MAX
                    )));
                }
                let key = u64::from(m.key_size);
                let hash_slots = (entries * 2).next_power_of_two();
                MapSlot {
                    strset: true,
                    offset,
                    elem: key,
                    entries,
                    slots: hash_slots,
                    len: helpers::strset_bytes(hash_slots, entries, key),
                }
            }
        };
        offset = offset.saturating_add(slot.len);
        if offset > MAX_REGION_BYTES {
            return Err(err(format!(
                "the maps need more than {MAX_REGION_BYTES} bytes per tenant"
            )));
        }
        offset = offset.div_ceil(8) * 8;
        slots.push(slot);
    }
    Ok((slots, offset as usize))
}

/// The helpers the JIT emits inline instead of calling: `buffet_counter_add` and
/// `buffet_map_lookup`, the calls every small NF makes per packet. The inline code does
/// what [`helpers::counter_add`] and [`helpers::map_lookup`] do, checks included (the
/// counter index and the element index against the layout, the map index against the
/// program's maps, [`HELPER_CALL_COST`](helpers::HELPER_CALL_COST) charged to the meter
/// first, nothing done once the budget is spent), on the tenant region the run was given:
/// [`Program::begin_group`] only runs a region of this program's length, which holds
/// every counter and map. The interpreter keeps calling the helpers.
fn inline_helpers(maps: &[MapSlot]) -> Vec<(u32, rbpf::ebpf::InlineHelper)> {
    let cost = helpers::HELPER_CALL_COST as u32;
    let arrays = maps
        .iter()
        .map(|s| {
            // Offsets and sizes are below MAX_REGION_BYTES (64 MiB) by `layout`.
            (!s.strset).then_some((s.offset as u32, s.elem as u32, s.entries as u32))
        })
        .collect();
    vec![
        (
            abi::helper::COUNTER_ADD as u32,
            rbpf::ebpf::InlineHelper::MbuffCounterAdd {
                base: abi::COUNTERS_OFFSET as u32,
                count: abi::MAX_COUNTERS as u32,
                cost,
            },
        ),
        (
            abi::helper::MAP_LOOKUP as u32,
            rbpf::ebpf::InlineHelper::MbuffArrayLookup { arrays, cost },
        ),
    ]
}

/// Whether running `insns` on `engine` can call a helper function in the host: a helper
/// `call` (`0x85` with source 0) whose id the engine does not emit inline (the JIT inlines
/// [`inline_helpers`]; the interpreter calls every helper). Every 8-byte slot is looked
/// at, so the second half of a `lddw` (opcode 0) never counts and nothing is missed.
fn calls_host_helpers(insns: &[u8], engine: Engine) -> bool {
    insns.chunks_exact(8).any(|insn| {
        let (opc, src) = (insn[0], insn[1] >> 4);
        let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        opc == 0x85
            && src == 0
            && match engine {
                Engine::Interpreter => true,
                Engine::Jit => imm != abi::helper::COUNTER_ADD && imm != abi::helper::MAP_LOOKUP,
            }
    })
}

/// The bytecode of every program ever made runnable, one copy per distinct program: rbpf's
/// VM borrows its code for `'static`. Bounded by the number of distinct programs loaded.
fn intern(code: &[u8]) -> &'static [u8] {
    static CODE: OnceLock<Mutex<HashMap<Vec<u8>, &'static [u8]>>> = OnceLock::new();
    let mut all = CODE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&c) = all.get(code) {
        return c;
    }
    let leaked: &'static [u8] = Box::leak(code.to_vec().into_boxed_slice());
    all.insert(code.to_vec(), leaked);
    leaked
}

/// A counter name as `&'static str`, leaked once per distinct name.
fn intern_name(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashMap<String, &'static str>>> = OnceLock::new();
    let mut all = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&n) = all.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    all.insert(name.to_owned(), leaked);
    leaked
}

impl Program {
    /// Loads, links, verifies and prepares the program of an object file's bytes.
    pub fn load(bytes: &[u8], opts: &LoadOptions) -> Result<Program, ProgramError> {
        let CheckReport {
            image,
            verified,
            region_len,
        } = check(bytes, opts)?;
        Self::prepare(image, verified, region_len, opts.engine)
    }

    /// Verifies and prepares an already linked image (tests build images by hand).
    pub fn from_image(image: Image, opts: &LoadOptions) -> Result<Program, ProgramError> {
        let (_, region_len) = layout(&image.maps)?;
        let verified = verify::verify(&image, &opts.verifier)?;
        Self::prepare(image, verified, region_len, opts.engine)
    }

    fn prepare(
        image: Image,
        verified: Verified,
        region_len: usize,
        engine: Engine,
    ) -> Result<Program, ProgramError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let (maps, _) = layout(&image.maps)?;
        let vm_err = |e: std::io::Error| ProgramError::Vm {
            engine: engine.name(),
            message: e.to_string(),
        };
        let mut vm = rbpf::EbpfVmMbuff::new(Some(intern(&image.insns))).map_err(vm_err)?;
        for (id, f) in helpers::TABLE {
            vm.register_helper(id, f).map_err(vm_err)?;
        }
        if engine == Engine::Jit {
            if !cfg!(all(target_arch = "x86_64", unix)) {
                return Err(ProgramError::Vm {
                    engine: engine.name(),
                    message: "rbpf's JIT emits x86-64 code only".into(),
                });
            }
            vm.jit_compile_metered_inline(&inline_helpers(&maps))
                .map_err(vm_err)?;
        }
        let scratch = image
            .maps
            .iter()
            .zip(&maps)
            .filter(|(def, _)| def.scratch)
            .map(|(_, s)| s.offset as usize..(s.offset + s.len) as usize)
            .collect::<Vec<_>>();
        let scratch_cost = scratch
            .iter()
            .map(|r| (r.len() as u64).div_ceil(abi::SCRATCH_BYTES_PER_UNIT))
            .sum();
        let counter_names = image
            .counter_names
            .iter()
            .take(abi::MAX_COUNTERS)
            .map(|n| intern_name(n))
            .collect();
        let host_helpers = calls_host_helpers(&image.insns, engine);
        Ok(Program {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            image,
            verified,
            maps,
            scratch,
            scratch_cost,
            region_len,
            counter_names,
            engine,
            host_helpers,
            vm,
        })
    }

    /// The linked program.
    pub fn image(&self) -> &Image {
        &self.image
    }

    /// What the verifier proved.
    pub fn verified(&self) -> &Verified {
        &self.verified
    }

    /// Units of the cost budget each packet spends before the program starts: zeroing
    /// its SCRATCH maps, one unit per [`abi::SCRATCH_BYTES_PER_UNIT`] bytes.
    pub fn scratch_cost(&self) -> u64 {
        self.scratch_cost
    }

    /// Bytes of one tenant's region (context, counters, maps).
    pub fn region_len(&self) -> usize {
        self.region_len
    }

    /// The engine it runs on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Names of the counters the program declared (index order).
    pub fn counter_names(&self) -> &[&'static str] {
        &self.counter_names
    }

    /// The map named `name`: (its definition, its byte range in a tenant region).
    pub fn map(&self, name: &str) -> Option<(&MapDef, std::ops::Range<usize>)> {
        let i = self.image.maps.iter().position(|m| m.name == name)?;
        let s = &self.maps[i];
        Some((
            &self.image.maps[i],
            s.offset as usize..(s.offset + s.len) as usize,
        ))
    }

    pub(crate) fn slot(&self, name: &str) -> Option<&MapSlot> {
        let i = self.image.maps.iter().position(|m| m.name == name)?;
        self.maps.get(i)
    }

    /// Runs the program once with [`DEFAULT_COST_BUDGET`]: see [`Program::run_with_budget`].
    pub fn run(
        &self,
        packet: &mut [u8],
        region: &mut [u8],
        ctx: &CtxFields,
    ) -> Result<u64, RunError> {
        self.run_with_budget(packet, region, ctx, DEFAULT_COST_BUDGET)
    }

    /// Runs the program once: `region` is the tenant's region (this program's layout),
    /// `packet` the frame. Zeroes the scratch maps, writes the context (with
    /// `data`/`data_end` pointing at `packet`) and returns `r0`. Helper work beyond
    /// `budget` cost units is [`RunError::Budget`], whatever the program returned.
    pub fn run_with_budget(
        &self,
        packet: &mut [u8],
        region: &mut [u8],
        ctx: &CtxFields,
        budget: u64,
    ) -> Result<u64, RunError> {
        self.begin_group(region)?.run(packet, ctx, budget)
    }

    /// Starts running the program over a group of one tenant's packets: the thread's
    /// run context (this program's maps, the tenant's `region`) is set up once here
    /// instead of once per packet; [`GroupRun::run`] then runs one packet. The helpers
    /// see the run until the `GroupRun` is dropped (also when it unwinds).
    pub fn begin_group<'p, 'r>(
        &'p self,
        region: &'r mut [u8],
    ) -> Result<GroupRun<'p, 'r>, RunError> {
        if region.len() != self.region_len {
            return Err(RunError::Region {
                got: region.len(),
                want: self.region_len,
            });
        }
        let region_area = Area::of(region);
        RUN.with(|r| {
            let mut run = r.borrow_mut();
            if run.program != self.id {
                run.maps.clear();
                run.maps.extend_from_slice(&self.maps);
                run.program = self.id;
            }
            run.region = region_area;
            run.packet = Area::default();
            run.active = true;
        });
        Ok(GroupRun {
            program: self,
            region,
            _active: Deactivate,
        })
    }
}

/// A program running over one tenant's group of packets ([`Program::begin_group`]).
pub struct GroupRun<'p, 'r> {
    program: &'p Program,
    region: &'r mut [u8],
    _active: Deactivate,
}

impl GroupRun<'_, '_> {
    /// Runs the program on `packet`: zeroes the scratch maps, writes the context (with
    /// `data`/`data_end` pointing at `packet`) and returns `r0`. Helper work beyond
    /// `budget` cost units is [`RunError::Budget`], whatever the program returned.
    ///
    /// Inlined into the caller, so that the context goes from the caller's fields
    /// straight into the region: handed over through memory, its fields were stored and
    /// reloaded with different widths, and the reloads stalled on store forwarding.
    #[inline(always)]
    pub fn run(
        &mut self,
        packet: &mut [u8],
        ctx: &CtxFields,
        budget: u64,
    ) -> Result<u64, RunError> {
        let program = self.program;
        let region = &mut *self.region;
        let pkt_area = Area::of(packet);
        let fields = CtxFields {
            data: pkt_area.start,
            data_end: pkt_area.start + pkt_area.len,
            ..*ctx
        };
        fields.write_to(region);
        for r in &program.scratch {
            region[r.clone()].fill(0);
        }
        // Only a helper called in the host reads the packet's area; a run whose helpers
        // are all inline (or that calls none) leaves the thread's run context alone.
        if program.host_helpers {
            RUN.with(|r| r.borrow_mut().packet = pkt_area);
        }
        // Zeroing the scratch maps is the packet's first work: it is charged like any.
        let start = i64::try_from(budget)
            .unwrap_or(i64::MAX)
            .saturating_sub(program.scratch_cost as i64);
        let (r, left) = METER.with(|meter| {
            meter.set([start, 0]);
            let r = match program.engine {
                Engine::Interpreter => {
                    let words: &std::cell::Cell<[i64]> = meter;
                    let left = &words.as_slice_of_cells()[0];
                    program.vm.execute_program_metered(packet, region, left)
                }
                Engine::Jit => sys::run_jit(&program.vm, packet, region, meter),
            };
            (r, meter.get()[0])
        });
        if left < 0 {
            return Err(RunError::Budget {
                spent: budget.saturating_add(left.unsigned_abs()),
                budget,
            });
        }
        r.map_err(|e| RunError::Vm(e.to_string()))
    }
}

/// Ends the helpers' view of a run, also when the run unwinds.
struct Deactivate;

impl Drop for Deactivate {
    fn drop(&mut self) {
        let _ = RUN.try_with(|r| {
            if let Ok(mut run) = r.try_borrow_mut() {
                run.active = false;
                run.packet = Area::default();
                run.region = Area::default();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One instruction: opcode, registers (dst low nibble, src high), offset, immediate.
    fn insn(opc: u8, regs: u8, imm: i32) -> [u8; 8] {
        let i = imm.to_le_bytes();
        [opc, regs, 0, 0, i[0], i[1], i[2], i[3]]
    }

    fn prog(insns: &[[u8; 8]]) -> Vec<u8> {
        insns.concat()
    }

    #[test]
    fn host_helpers_are_the_calls_the_engine_does_not_inline() {
        let exit = insn(0x95, 0, 0);
        let call = |id: i32| insn(0x85, 0, id);
        let inline_only = prog(&[
            call(abi::helper::COUNTER_ADD),
            call(abi::helper::MAP_LOOKUP),
            exit,
        ]);
        assert!(!calls_host_helpers(&inline_only, Engine::Jit));
        assert!(calls_host_helpers(&inline_only, Engine::Interpreter));
        for id in [abi::helper::PKT_FIND, abi::helper::CSUM_REPLACE] {
            let p = prog(&[call(abi::helper::COUNTER_ADD), call(id), exit]);
            assert!(calls_host_helpers(&p, Engine::Jit), "helper {id}");
        }
        // A bpf-to-bpf call (source 1) calls no helper.
        let local = prog(&[insn(0x85, 0x10, 1), exit, exit]);
        assert!(!calls_host_helpers(&local, Engine::Interpreter));
        // A `lddw` whose immediate halves look like anything is not a call.
        let lddw = prog(&[
            insn(0x18, 0x01, 0x85),
            insn(0, 0, abi::helper::PKT_FIND),
            exit,
        ]);
        assert!(!calls_host_helpers(&lddw, Engine::Interpreter));
        assert!(!calls_host_helpers(&prog(&[exit]), Engine::Interpreter));
    }
}
