//! [`EbpfNf`]: an eBPF program as a Buffet [`NetworkFunction`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use buffet_sdk::{
    DropCause, InitError, L3Kind, L4Kind, MemorySpec, NetworkFunction, Packet, TenantId, Verdict,
};
use serde::Deserialize;

use crate::abi::{self, CtxFields, MAX_COUNTERS};
use crate::elf::MapKind;
use crate::helpers;
use crate::program::{LoadOptions, Program, ProgramError, DEFAULT_COST_BUDGET};

/// Initial contents of one map, written into each tenant's copy at admission.
///
/// An ARRAY map takes exactly one of `u8`, `u16`, `u32`, `u64` — values written
/// little-endian one after the other from byte `offset` of the map (spanning elements)
/// — and a STRSET map takes `strings`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapInit {
    /// Where the values start, in bytes from the map's first element (ARRAY only).
    #[serde(default)]
    pub offset: u64,
    /// Bytes.
    pub u8: Option<Vec<u8>>,
    /// 16-bit values.
    pub u16: Option<Vec<u16>>,
    /// 32-bit values.
    pub u32: Option<Vec<u32>>,
    /// 64-bit values.
    pub u64: Option<Vec<u64>>,
    /// Strings of a STRSET map (ASCII case is ignored; duplicates are stored once).
    pub strings: Option<Vec<String>>,
}

/// A tenant's policy for an eBPF NF (TOML):
///
/// ```toml
/// [tenant.policy]
/// program = "dpi.o"            # optional: this tenant's own program instead of the NF's
/// [tenant.policy.maps]
/// blacklist = { strings = ["example.com", "ads.tracker.net"] }
/// ports = { u16 = [80, 8080] }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EbpfPolicy {
    /// A clang BPF object this tenant runs instead of the NF's program; it is loaded and
    /// verified at admission (a rejection is an admission error).
    pub program: Option<PathBuf>,
    /// The section of `program` (default `buffet`).
    pub section: Option<String>,
    /// Initial map contents, by map name.
    #[serde(default)]
    pub maps: BTreeMap<String, MapInit>,
    /// Cost units one packet of this tenant may spend in helpers (bytes scanned, hashed
    /// or compared, plus 16 per call); over it the packet is a fault and the tenant is
    /// quarantined. Default [`DEFAULT_COST_BUDGET`]; at least 1.
    pub cost_budget: Option<u64>,
}

/// One tenant's state: its region (context, counters, maps) and fault bookkeeping.
///
/// The region is a heap buffer owned by the state (the Memory Manager's region holds
/// this struct); it is sized by the program at admission and zeroed before the policy
/// fills the maps. It is never larger than the bytes the Memory Manager reserved past
/// the state ([`EbpfNf`]'s `register`), so the arena bounds it: a tenant's own program
/// whose region would be larger is refused at admission.
#[derive(Debug, Default)]
pub struct EbpfState {
    /// The tenant's own program, when its policy names one.
    program: Option<Arc<Program>>,
    region: Box<[u8]>,
    /// Cost units one packet may spend in helpers.
    cost_budget: u64,
    faults: u64,
    last_fault: Option<String>,
}

impl EbpfState {
    /// Value of counter `index` (0 beyond the counters or before init).
    pub fn counter(&self, index: usize) -> u64 {
        let at = abi::COUNTERS_OFFSET + 8 * index;
        match self.region.get(at..at + 8) {
            Some(b) if index < MAX_COUNTERS => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            _ => 0,
        }
    }

    /// Faults so far (run-time errors and invalid return values).
    pub fn faults(&self) -> u64 {
        self.faults
    }

    /// The last fault's message.
    pub fn last_fault(&self) -> Option<&str> {
        self.last_fault.as_deref()
    }

    /// Cost units one packet of this tenant may spend in helpers.
    pub fn cost_budget(&self) -> u64 {
        self.cost_budget
    }

    /// The tenant's region (context, counters, maps).
    pub fn region(&self) -> &[u8] {
        &self.region
    }

    fn fault(&mut self, message: String) -> Verdict {
        self.faults += 1;
        self.last_fault = Some(message);
        Verdict::Fault
    }
}

/// A fault: a tenant's program failed at run time or returned a value outside the ABI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbpfFault {
    /// The tenant (quarantined by the worker).
    pub tenant: TenantId,
    /// What happened.
    pub message: String,
}

impl std::fmt::Display for EbpfFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tenant {}: {}", self.tenant, self.message)
    }
}

/// Faults kept by [`EbpfNf::faults`]; later ones are only counted in the tenant's state.
const FAULT_LOG: usize = 1024;

/// An eBPF program (clang `-target bpf`) run for every tenant: one verified program shared
/// by all tenants, each with its own region.
#[derive(Debug, Clone)]
pub struct EbpfNf {
    program: Arc<Program>,
    opts: LoadOptions,
    faults: Arc<Mutex<Vec<EbpfFault>>>,
}

impl EbpfNf {
    /// The NF running the program of an object file's bytes.
    pub fn from_elf(bytes: &[u8], opts: LoadOptions) -> Result<Self, ProgramError> {
        let program = Arc::new(Program::load(bytes, &opts)?);
        Ok(Self::with_program(program, opts))
    }

    /// The NF running the program of an object file.
    pub fn from_file(path: &std::path::Path, opts: LoadOptions) -> Result<Self, EbpfFileError> {
        let bytes = std::fs::read(path).map_err(|e| EbpfFileError::Read {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::from_elf(&bytes, opts).map_err(|source| EbpfFileError::Program {
            path: path.to_owned(),
            source,
        })
    }

    /// The NF running an already prepared program.
    pub fn with_program(program: Arc<Program>, opts: LoadOptions) -> Self {
        EbpfNf {
            program,
            opts,
            faults: Arc::default(),
        }
    }

    /// The faults so far, in order (the first 1,024), across tenants.
    pub fn faults(&self) -> Vec<EbpfFault> {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn log_fault(&self, tenant: TenantId, state: &mut EbpfState, message: String) -> Verdict {
        let mut log = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() < FAULT_LOG {
            log.push(EbpfFault {
                tenant,
                message: message.clone(),
            });
        }
        state.fault(message)
    }

    /// The NF's program.
    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// The program a tenant runs (its own or the NF's).
    pub fn program_of<'a>(&'a self, state: &'a EbpfState) -> &'a Program {
        state.program.as_deref().unwrap_or(&self.program)
    }

    /// The bytes of map `name` in a tenant's region.
    pub fn map_bytes<'s>(&self, state: &'s EbpfState, name: &str) -> Option<&'s [u8]> {
        let (_, range) = self.program_of(state).map(name)?;
        state.region.get(range)
    }
}

/// Why [`EbpfNf::from_file`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EbpfFileError {
    /// The file could not be read.
    #[error("{}: {message}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The program could not be used.
    #[error("{}: {source}", path.display())]
    Program {
        /// The file.
        path: PathBuf,
        /// Why.
        source: ProgramError,
    },
}

/// The context fields of `pkt` other than `data`/`data_end` (which the run fills in).
#[inline(always)]
fn ctx_fields(pkt: &Packet<'_>) -> CtxFields {
    let meta = pkt.meta();
    CtxFields {
        data: 0,
        data_end: 0,
        ts_ns: meta.ts_ns,
        tenant: meta.tenant.0,
        in_port: meta.in_port,
        l3_kind: match pkt.l3_kind() {
            L3Kind::Ipv4 => 4,
            L3Kind::Ipv6 => 6,
        },
        l4_kind: match pkt.l4_kind() {
            L4Kind::Tcp => 6,
            L4Kind::Udp => 17,
            L4Kind::Sctp => 132,
            L4Kind::Other => 0,
        },
        l3_off: pkt.l3_offset() as u16,
        l4_off: pkt.l4_offset() as u16,
        payload_off: pkt.payload_offset() as u16,
        ip_end: pkt.ip_end() as u16,
        ip_proto: pkt.ip_proto(),
    }
}

fn write_values(
    dst: &mut [u8],
    field: &str,
    offset: u64,
    values: impl ExactSizeIterator<Item = Vec<u8>>,
    width: usize,
) -> Result<(), InitError> {
    let need = offset.saturating_add((values.len() * width) as u64);
    if need > dst.len() as u64 {
        return Err(InitError::invalid(
            field,
            format!(
                "{} values of {width} bytes at offset {offset} need {need} bytes; the map has {}",
                values.len(),
                dst.len()
            ),
        ));
    }
    let mut at = offset as usize;
    for v in values {
        dst[at..at + width].copy_from_slice(&v);
        at += width;
    }
    Ok(())
}

fn apply_map(
    program: &Program,
    region: &mut [u8],
    name: &str,
    init: &MapInit,
) -> Result<(), InitError> {
    let field = format!("maps.{name}");
    let Some((def, range)) = program.map(name) else {
        let names: Vec<&str> = program
            .image()
            .maps
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        return Err(InitError::invalid(
            field,
            format!(
                "the program declares no map `{name}` (its maps: {})",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
        ));
    };
    let given = [
        init.u8.is_some(),
        init.u16.is_some(),
        init.u32.is_some(),
        init.u64.is_some(),
        init.strings.is_some(),
    ]
    .iter()
    .filter(|&&g| g)
    .count();
    if given != 1 {
        return Err(InitError::invalid(
            field,
            "give exactly one of u8, u16, u32, u64 (ARRAY) or strings (STRSET)",
        ));
    }
    if def.scratch {
        return Err(InitError::invalid(
            field,
            "a SCRATCH map is zeroed before every packet; a policy cannot fill it",
        ));
    }
    let storage = &mut region[range];
    match def.kind {
        MapKind::Array => {
            if init.strings.is_some() {
                return Err(InitError::invalid(
                    field,
                    "an ARRAY map takes u8/u16/u32/u64 values, not strings",
                ));
            }
            let o = init.offset;
            if let Some(v) = &init.u8 {
                write_values(
                    storage,
                    &field,
                    o,
                    v.iter().map(|x| x.to_le_bytes().to_vec()),
                    1,
                )
            } else if let Some(v) = &init.u16 {
                write_values(
                    storage,
                    &field,
                    o,
                    v.iter().map(|x| x.to_le_bytes().to_vec()),
                    2,
                )
            } else if let Some(v) = &init.u32 {
                write_values(
                    storage,
                    &field,
                    o,
                    v.iter().map(|x| x.to_le_bytes().to_vec()),
                    4,
                )
            } else if let Some(v) = &init.u64 {
                write_values(
                    storage,
                    &field,
                    o,
                    v.iter().map(|x| x.to_le_bytes().to_vec()),
                    8,
                )
            } else {
                Ok(())
            }
        }
        MapKind::StrSet => {
            let Some(strings) = &init.strings else {
                return Err(InitError::invalid(field, "a STRSET map takes `strings`"));
            };
            if init.offset != 0 {
                return Err(InitError::invalid(
                    field,
                    "`offset` applies to ARRAY maps only",
                ));
            }
            if strings.len() > def.max_entries as usize {
                return Err(InitError::invalid(
                    field,
                    format!(
                        "{} strings exceed the map's {} entries",
                        strings.len(),
                        def.max_entries
                    ),
                ));
            }
            for (i, s) in strings.iter().enumerate() {
                // Stored as the native NFs compare names: blanks and one trailing dot
                // removed, ASCII case ignored.
                let n = helpers::normalise_name(s.as_bytes()).len();
                if n == 0 || n > def.key_size as usize {
                    return Err(InitError::invalid(
                        format!("{field}.strings[{i}]"),
                        format!(
                            "{n} bytes without blanks and trailing dot; the map holds \
                             strings of 1 to {} bytes",
                            def.key_size
                        ),
                    ));
                }
            }
            let slot = program.slot(name).expect("the map exists");
            let keys: Vec<Vec<u8>> = strings.iter().map(|s| s.as_bytes().to_vec()).collect();
            helpers::strset_build(storage, slot, &keys);
            Ok(())
        }
    }
}

/// Names for unnamed counters in `summary()`.
const COUNTER_NAMES: [&str; MAX_COUNTERS] = [
    "counter[0]",
    "counter[1]",
    "counter[2]",
    "counter[3]",
    "counter[4]",
    "counter[5]",
    "counter[6]",
    "counter[7]",
    "counter[8]",
    "counter[9]",
    "counter[10]",
    "counter[11]",
    "counter[12]",
    "counter[13]",
    "counter[14]",
    "counter[15]",
];

impl NetworkFunction for EbpfNf {
    type State = EbpfState;
    type Policy = EbpfPolicy;

    fn name(&self) -> &'static str {
        "ebpf"
    }

    /// The state and, past it, as many bytes as the NF's program's region: the Memory
    /// Manager reserves them for each tenant, which is what bounds the tenant's region (a
    /// heap buffer of at most that many bytes, see [`EbpfState`]).
    fn register(&self) -> MemorySpec {
        MemorySpec::with_extra::<EbpfState>(self.program.region_len())
    }

    /// Refuses a tenant's own program whose region is larger than the NF's program's:
    /// [`register`](Self::register) reserved only that many bytes per tenant, and a larger
    /// heap buffer would be memory the Memory Manager's arena never counts.
    fn init(&self, policy: &EbpfPolicy, state: &mut EbpfState) -> Result<(), InitError> {
        let own = match &policy.program {
            Some(path) => {
                let opts = LoadOptions {
                    section: policy.section.clone(),
                    ..self.opts.clone()
                };
                let nf = EbpfNf::from_file(path, opts)
                    .map_err(|e| InitError::invalid("program", e.to_string()))?;
                Some(nf.program)
            }
            None if policy.section.is_some() => {
                return Err(InitError::invalid("section", "only with `program`"));
            }
            None => None,
        };
        let cost_budget = match policy.cost_budget {
            Some(0) => return Err(InitError::invalid("cost_budget", "must be at least 1")),
            Some(b) => b,
            None => DEFAULT_COST_BUDGET,
        };
        let program = own.as_deref().unwrap_or(&self.program);
        if program.region_len() > self.program.region_len() {
            return Err(InitError::invalid(
                "program",
                format!(
                    "its region (context, counters and maps) needs {} bytes per tenant, \
                     more than the {} bytes the NF reserves for each tenant (the size of \
                     the NF's own program's region); load the NF with a program whose maps \
                     are at least as large",
                    program.region_len(),
                    self.program.region_len()
                ),
            ));
        }
        if cost_budget < program.scratch_cost() {
            return Err(InitError::invalid(
                "cost_budget",
                format!(
                    "{cost_budget} is less than the {} units zeroing the program's SCRATCH \
                     maps costs every packet",
                    program.scratch_cost()
                ),
            ));
        }
        let mut region = vec![0u8; program.region_len()].into_boxed_slice();
        for (name, init) in &policy.maps {
            apply_map(program, &mut region, name, init)?;
        }
        *state = EbpfState {
            program: own,
            region,
            cost_budget,
            faults: 0,
            last_fault: None,
        };
        Ok(())
    }

    fn handle(&self, pkt: &mut Packet<'_>, state: &mut EbpfState) -> Verdict {
        let mut verdict = [Verdict::Fault];
        self.handle_group(std::slice::from_mut(pkt), state, &mut verdict);
        verdict[0]
    }

    /// One run context per group ([`Program::begin_group`]): the program's maps and the
    /// tenant's region are handed to the helpers once, then each packet only gets its
    /// context and scratch maps written.
    fn handle_group(
        &self,
        pkts: &mut [Packet<'_>],
        state: &mut EbpfState,
        verdicts: &mut [Verdict],
    ) {
        let tenant = match pkts.first() {
            Some(p) => p.meta().tenant,
            None => return,
        };
        let EbpfState {
            program,
            region,
            cost_budget,
            ..
        } = state;
        let program = program.as_deref().unwrap_or(&self.program);
        let budget = *cost_budget;
        let failed = match program.begin_group(region) {
            Ok(mut run) => {
                let mut failed = None;
                for (i, (pkt, v)) in pkts.iter_mut().zip(verdicts.iter_mut()).enumerate() {
                    if pkt.len() > crate::verify::MAX_FRAME_LEN {
                        *v = Verdict::Drop(DropCause::Malformed);
                        continue;
                    }
                    let ctx = ctx_fields(pkt);
                    match run.run(pkt.data_mut(), &ctx, budget) {
                        Ok(r0) => match abi::verdict_of(r0) {
                            Some(verdict) => *v = verdict,
                            None => {
                                failed =
                                    Some((i, format!("return value {r0:#x} is not a verdict")));
                                break;
                            }
                        },
                        Err(e) => {
                            failed = Some((i, e.to_string()));
                            break;
                        }
                    }
                }
                failed
            }
            Err(e) => Some((0, e.to_string())),
        };
        // The run context is released before the fault is logged (`run` dropped above).
        if let Some((i, message)) = failed {
            verdicts[i] = self.log_fault(tenant, state, message);
        }
    }

    fn fault_reason(&self, state: &EbpfState) -> Option<String> {
        state.last_fault.clone()
    }

    fn summary(&self, state: &EbpfState) -> Vec<(&'static str, u64)> {
        let names = self.program_of(state).counter_names();
        let mut v: Vec<(&'static str, u64)> = (0..MAX_COUNTERS)
            .filter_map(|i| {
                let value = state.counter(i);
                match names.get(i) {
                    Some(&n) => Some((n, value)),
                    None if value != 0 => Some((COUNTER_NAMES[i], value)),
                    None => None,
                }
            })
            .collect();
        v.push(("faults", state.faults));
        v
    }
}
