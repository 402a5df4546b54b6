//! C network functions for Buffet.
//!
//! [`CNf`] loads a shared object that implements `include/buffet.h` — the paper's
//! `buffet_mem_register`, `buffet_state_init` and `buffet_pkt_handler` — and is a
//! [`NetworkFunction`] like any Rust NF: a [`Pipeline`](https://docs.rs/buffet-worker)
//! runs it for thousands of tenants, each with its own state region.
//!
//! * **State.** A tenant's C state is its region's untyped bytes, past a small Rust header
//!   ([`CState`], 64 bytes) in the MPK domain, a page region of their own between guard
//!   pages outside it (the header is then packed with the other tenants'):
//!   `buffet_state_init(policy_json, state, len, …)` builds it there at admission and
//!   every `buffet_pkt_handler(pkt, state, len)` gets the same bytes. The policy is the
//!   tenant's policy table as JSON text.
//! * **Isolation.** Run the pipeline with `Domain::Mpk`: each region then carries an Intel
//!   protection key that only the worker running that tenant has open, so a C NF that
//!   reads or writes outside its region hits a closed key (or a guard page) and faults.
//!   On a CPU without protection keys, the *trusted-native* level runs the pipeline with
//!   `Domain::None` and loads the NF with [`Containment::AnyFault`]: guard pages between
//!   regions and fault containment, no hardware isolation (a stray write that lands in
//!   another tenant's region is not stopped).
//! * **Inspection.** Before `dlopen` runs anything of it, the object is read from disk
//!   ([`inspect`]) and refused for `WRPKRU`/`XRSTOR` bytes at any offset of its code,
//!   initialisers, IFUNCs, imports outside [`inspect::ALLOWED_IMPORTS`] (no allocator: a
//!   tenant's region is its memory), other libraries, writable code, an executable stack
//!   or thread-local storage — each finding naming what and where ([`InspectError`]). At
//!   the `mpk` level ([`Containment::Guarded`]) always; trusted-native loads any object
//!   the operator vouches for ([`LoadConfig`]).
//! * **Fault containment.** Every call into the NF goes through a small C shim
//!   (`csrc/guard.c`): a setjmp, the call — for packets, one call per chunk of up to 32
//!   packets of a tenant's group ([`NetworkFunction::handle_group`]), the shim looping
//!   over `buffet_pkt_handler` in C — on the thread's own NF stack (1 MiB, above a 64 MiB
//!   guard), and signal handlers that resume the shim when the thread is inside an NF
//!   call and the fault is a tenant's: a protection-key fault (`SEGV_PKUERR`), a hit in a
//!   tenant arena (guard page), a stack overflow into the NF stack's guard, a system call
//!   the thread's seccomp filter traps ([`confine_nf_thread`]), or the watchdog (a call
//!   that ran past its CPU-time budget, [`LoadConfig::watchdog`]). The PKRU the call
//!   started with is restored, the faulting packet gets [`Verdict::Fault`], the worker
//!   quarantines that tenant and keeps running. Every other SIGSEGV, SIGBUS, SIGFPE or
//!   SIGILL raised inside an NF call (a NULL write, a division by zero) is contained the
//!   same way; in `buffet_state_init` every fault fails the admission and changes
//!   nothing else. A fault outside any NF call is the framework's own and still crashes
//!   the process. [`CNf::faults`] lists what happened (tenant, address, key).
//!
//! [`CNf::load`] takes a path as the command line does: a bare file name (`nf.so`) is the
//! file in the current directory, not a search of the library path.
//!
//! What this does not do: resize frames (ABI v1 rewrites in place), give C NFs helpers, or
//! close key-0 memory (the framework's, other tenants' packets) while an NF runs — that
//! takes protection keys on the NF stack and packets. Neither inspection nor the seccomp
//! filter's caller check sees a jump into libc's code at an address the NF computed (from
//! there it could block or disarm its watchdog, or end its thread). A fault or watchdog
//! interrupt inside libc while it holds a lock leaves that lock held: C NFs should not
//! call into libc on the packet path beyond the pure allowlisted functions.
//!
//! All `unsafe` code is in the private `sys` module, each block with a `// SAFETY:` comment.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod inspect;
#[allow(unsafe_code)]
mod sys;

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use arrayvec::ArrayVec;
use buffet_sdk::{
    DropCause, InitError, L3Kind, MemorySpec, NetworkFunction, Packet, TenantId, Verdict,
    WorkerThreadError, GROUP_CHUNK,
};

pub use inspect::{Finding, InspectError};
pub use sys::buffet_cnf_in_arena;
use sys::CallMode;

/// The ABI version of `include/buffet.h` this crate implements.
pub const ABI_VERSION: u32 = 1;

/// How many fault records [`CNf::faults`] keeps (the first ones).
const MAX_FAULT_RECORDS: usize = 1024;

/// Most counters one `buffet_summary` call may write.
pub(crate) const SUMMARY_MAX: usize = 32;

/// Most distinct counter names one NF's summaries may use; a counter with a new name past
/// these is left out (each distinct name is kept for the life of the process).
const MAX_COUNTER_NAMES: usize = 1024;

/// Most bytes of a name the NF hands over (a counter's, `buffet_nf_name`'s), without its
/// NUL: a longer one is the NF's error.
pub const MAX_NAME_BYTES: usize = sys::NAME_CAP - 1;

/// `si_code` of a protection-key fault.
const SEGV_PKUERR: i32 = 4;
/// `si_code` of an access to a mapped page whose protection forbids it.
const SEGV_ACCERR: i32 = 2;
/// `si_code` of a SIGSYS raised by a seccomp filter.
const SYS_SECCOMP: i32 = 1;
/// `RawFault::place`: in a tenant arena (guard page or free space).
const PLACE_ARENA: i32 = 1;
/// `RawFault::place`: in the guard below the worker's NF stack.
const PLACE_NF_STACK: i32 = 2;
/// `RawFault::place`: the watchdog interrupted the call.
const PLACE_WATCHDOG: i32 = 3;

/// The watchdog's default budget for one call into a C NF.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_millis(10);

/// The environment variable that replaces [`DEFAULT_WATCHDOG`] for the NFs
/// [`CNf::load`] and [`CNf::load_with`] load guarded: the budget in whole milliseconds,
/// 1 to 60,000. For slow or emulated CPUs, where an honest call can take more than 10 ms
/// of CPU time (under QEMU's emulated CPU, examples/c-nf/portblock.c's
/// `buffet_state_init` did).
pub const WATCHDOG_ENV: &str = "BUFFET_CNF_WATCHDOG_MS";

/// The watchdog's budget for guarded NFs: [`WATCHDOG_ENV`] when set, else
/// [`DEFAULT_WATCHDOG`]. A value that is not a whole number of milliseconds from 1 to
/// 60,000 is an error that says so.
pub fn watchdog_budget() -> Result<Duration, CNfLoadError> {
    match std::env::var_os(WATCHDOG_ENV) {
        None => Ok(DEFAULT_WATCHDOG),
        Some(v) => parse_watchdog(&v.to_string_lossy()),
    }
}

fn parse_watchdog(value: &str) -> Result<Duration, CNfLoadError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| (1..=60_000).contains(ms))
        .map(Duration::from_millis)
        .ok_or_else(|| CNfLoadError::Watchdog {
            value: value.to_owned(),
        })
}

/// Why a C NF could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CNfLoadError {
    /// `dlopen` failed.
    #[error("cannot load C NF {path}: {reason}")]
    Open {
        /// The shared object.
        path: PathBuf,
        /// The loader's reason, without the path the loader puts in front of it.
        reason: String,
    },
    /// The file is not a shared object at all: an eBPF object, a relocatable object, or
    /// not ELF ([`not_shared_object`]). Said before inspection or `dlopen` read it, whose
    /// messages (`cannot open shared object file`, `invalid ELF header`) would not.
    #[error("cannot load C NF {path}: {what}")]
    NotSharedObject {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        what: NotSharedObject,
    },
    /// A required function is not exported.
    #[error("the C NF does not export `{symbol}` (see include/buffet.h): {source}")]
    Missing {
        /// The function.
        symbol: &'static str,
        /// The loader's reason.
        source: libloading::Error,
    },
    /// The NF was built against another ABI version.
    #[error(
        "the C NF was built for buffet.h ABI version {found}, this Buffet implements {ABI_VERSION}"
    )]
    Abi {
        /// What `buffet_abi_version()` returned.
        found: u32,
    },
    /// The signal handler for fault containment could not be installed.
    #[error("cannot install the fault-containment signal handler: {0}")]
    Guard(std::io::Error),
    /// Inspection of the object on disk refused it (or could not read it).
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// A function the NF answers at load (`buffet_mem_register`, `buffet_nf_name`,
    /// `buffet_abi_version`) crashed, ran past the watchdog's budget, or returned a name
    /// that cannot be read.
    #[error("the C NF's `{symbol}` {what}: not loaded")]
    Call {
        /// The function.
        symbol: &'static str,
        /// What went wrong, in words.
        what: String,
    },
    /// [`WATCHDOG_ENV`] holds no budget.
    #[error(
        "{WATCHDOG_ENV}={value:?}: expected the watchdog's budget per C NF call in whole \
         milliseconds, 1 to 60000"
    )]
    Watchdog {
        /// What the variable held.
        value: String,
    },
}

/// What a file given as a C NF is, when it is not a shared object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotSharedObject {
    /// An ELF object for the BPF machine (`clang -target bpf`): an eBPF NF.
    #[error(
        "it is an eBPF object (ELF machine BPF), not a shared object: load eBPF NFs with \
         --nf-ebpf (`nf_ebpf` in a tenants file or buffetd's config)"
    )]
    Ebpf,
    /// A relocatable ELF object (`cc -c`), not linked into a shared object.
    #[error(
        "it is a relocatable object (ELF type REL), not a shared object: link it with \
         `cc -shared -fPIC -nostartfiles` (docs/nf-authors.md)"
    )]
    Relocatable,
    /// Not an ELF file.
    #[error("it is not a shared object (not an ELF file)")]
    NotElf,
}

/// ELF machine number of BPF (`EM_BPF`).
const EM_BPF: u16 = 247;
/// ELF type of a relocatable object (`ET_REL`).
const ET_REL: u16 = 1;

/// What the file at `path` is, when its first bytes show it is not a shared object; `None`
/// when it may be one (then `dlopen` decides), or cannot be read (then `dlopen` says why).
pub fn not_shared_object(path: &Path) -> Option<NotSharedObject> {
    use std::io::Read;
    let mut head = [0u8; 20];
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = 0;
    while len < head.len() {
        match file.read(&mut head[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    elf_kind(&head[..len])
}

/// [`not_shared_object`] over the file's first (up to 20) bytes.
fn elf_kind(head: &[u8]) -> Option<NotSharedObject> {
    if !head.starts_with(b"\x7fELF") {
        return Some(NotSharedObject::NotElf);
    }
    let (Some(&data), Some(e_type), Some(e_machine)) =
        (head.get(5), head.get(16..18), head.get(18..20))
    else {
        // Too short to say more: `dlopen` explains.
        return None;
    };
    let half = |b: &[u8]| match data {
        2 => u16::from_be_bytes([b[0], b[1]]),
        _ => u16::from_le_bytes([b[0], b[1]]),
    };
    if half(e_machine) == EM_BPF {
        Some(NotSharedObject::Ebpf)
    } else if half(e_type) == ET_REL {
        Some(NotSharedObject::Relocatable)
    } else {
        None
    }
}

/// Why a thread could not be confined for running C NFs ([`confine_nf_thread`]).
#[derive(Debug, thiserror::Error)]
#[error("cannot confine the thread with the C NF seccomp filter: {0}")]
pub struct ConfineError(std::io::Error);

/// How [`CNf::load_config`] loads and runs a C NF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadConfig {
    /// Which faults the NF's calls contain.
    pub containment: Containment,
    /// Whether the object is inspected on disk before `dlopen` ([`inspect`]): refused for
    /// `WRPKRU`/`XRSTOR` bytes, initialisers, imports outside the allowlist, writable
    /// executable segments, thread-local storage.
    pub inspect: bool,
    /// The watchdog's budget for one call into the NF (a chunk of up to 32 packets of one
    /// tenant's group, one `buffet_state_init`, one `buffet_summary`), in CPU time of the
    /// calling thread: a call still running after between one and two budgets is
    /// interrupted and its tenant quarantined. `None`: no watchdog. Ignored when
    /// unguarded.
    pub watchdog: Option<Duration>,
}

impl LoadConfig {
    /// The configuration of a containment level: [`Containment::Guarded`] (the `mpk`
    /// level, untrusted native code) is inspected; trusted-native
    /// ([`Containment::AnyFault`]) loads any object the operator vouches for, and
    /// [`Containment::Unguarded`] (measurements) too. Both guarded levels have the
    /// [`DEFAULT_WATCHDOG`].
    pub fn for_containment(containment: Containment) -> LoadConfig {
        LoadConfig {
            containment,
            inspect: containment == Containment::Guarded,
            watchdog: match containment {
                Containment::Unguarded => None,
                _ => Some(DEFAULT_WATCHDOG),
            },
        }
    }
}

impl Default for LoadConfig {
    /// [`LoadConfig::for_containment`] of [`Containment::Guarded`].
    fn default() -> LoadConfig {
        LoadConfig::for_containment(Containment::Guarded)
    }
}

/// Confines the calling thread with the seccomp filter for running C NFs (thread-level:
/// other threads are not affected): `mmap`/`mprotect`/`pkey_mprotect` with `PROT_EXEC`,
/// `pkey_alloc`/`pkey_free`, `clone`/`clone3`/`fork`/`vfork`/`execve`/`execveat`,
/// `kill`/`tkill`/`tgkill`/`exit_group`, `ptrace`, `process_vm_readv`/`writev`,
/// `rt_sigaction` and x32 calls trap with SIGSYS, and so does every other system call
/// whose `syscall` instruction is not in libc's or the vDSO's code (an NF's raw
/// `syscall`): inside an NF call the tenant is quarantined ([`FaultKind::Syscall`]),
/// outside one the process is killed. Also sets up the thread's NF stack and watchdog
/// timer. Call it on a worker thread before its first NF call; afterwards the thread must
/// not start threads or processes, and makes its system calls through libc (as Rust's std
/// does). Irreversible for the thread.
pub fn confine_nf_thread() -> Result<(), ConfineError> {
    sys::install_guard().map_err(ConfineError)?;
    sys::seccomp_confine().map_err(ConfineError)
}

/// Whether NF calls run inside the fault-containment shim, and which faults it contains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containment {
    /// Through the shim, with the object inspected before loading (the default, for
    /// `mpk`): every fault of the NF's code during a call — a closed protection key, a
    /// guard page, a stack overflow into the NF stack's guard, a system call the thread's
    /// seccomp filter traps, a call past the watchdog's budget, and any other SIGSEGV,
    /// SIGBUS, SIGFPE or SIGILL (a NULL write) — quarantines the tenant (in
    /// `buffet_state_init` it fails the admission). [`CNf::faults`] tells the kinds apart.
    Guarded,
    /// Through the shim, every fault contained as under [`Containment::Guarded`], but the
    /// object is not inspected (any object the operator vouches for loads): the
    /// trusted-native level, where no hardware confines the code. Stray accesses that do
    /// not fault are not caught.
    AnyFault,
    /// Direct calls: any fault kills the process. Only for measuring the shim's cost.
    Unguarded,
}

/// What kind of fault a tenant's C code caused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// An access to a region whose protection key this thread had closed: another
    /// tenant's region (or a parked one).
    ProtectionKey {
        /// The key the page carried.
        pkey: i32,
    },
    /// An access to a page of a tenant arena that is not open to anyone: a guard page
    /// between regions, or free arena space.
    GuardPage,
    /// The handler returned a value that is not a verdict of include/buffet.h.
    BadVerdict(i32),
    /// A stack overflow: an access to the guard below the worker's NF stack (unbounded
    /// recursion, a huge `alloca`). Contained at every guarded level.
    StackOverflow,
    /// The watchdog interrupted a call that ran past its budget (an endless loop).
    Watchdog {
        /// The budget.
        budget: Duration,
    },
    /// A system call the thread's seccomp filter forbids ([`confine_nf_thread`]).
    Syscall {
        /// Its number.
        nr: i32,
    },
    /// `buffet_summary` wrote a counter whose name is no string Buffet takes: not
    /// NUL-terminated within [`MAX_NAME_BYTES`] bytes. (A name pointer that cannot be read
    /// at all is a fault of the call, like any other.)
    BadName {
        /// The counter's index in what the call wrote.
        index: usize,
        /// What is wrong with it, in words.
        problem: &'static str,
    },
    /// Any other crash of the NF's code, contained at every guarded level: a SIGSEGV
    /// outside the tenant arenas (a NULL or wild pointer), SIGBUS, SIGFPE or SIGILL.
    Signal {
        /// The signal number.
        signal: i32,
        /// Its `si_code`.
        code: i32,
    },
}

/// A signal's name and what its `si_code` says, for [`FaultKind::Signal`].
fn describe_signal(signal: i32, code: i32) -> (&'static str, String) {
    let name = match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "a signal",
    };
    let what = match (signal, code) {
        (libc::SIGSEGV, 1) => "address not mapped".to_owned(),
        (libc::SIGSEGV, 2) => "access not permitted".to_owned(),
        (libc::SIGFPE, 1) => "integer divide by zero".to_owned(),
        (libc::SIGFPE, 2) => "integer overflow".to_owned(),
        (libc::SIGILL, _) => "illegal instruction".to_owned(),
        (libc::SIGBUS, 2) => "nonexistent physical address".to_owned(),
        _ => format!("si_code {code}"),
    };
    (name, what)
}

/// One contained fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CFault {
    /// The tenant whose code faulted.
    pub tenant: TenantId,
    /// The NF function that was running (`buffet_pkt_handler`, …).
    pub during: &'static str,
    /// What happened.
    pub kind: FaultKind,
    /// The faulting address (0 for [`FaultKind::BadVerdict`] and
    /// [`FaultKind::Watchdog`]; the system call instruction's for [`FaultKind::Syscall`]).
    pub addr: u64,
    /// The thread's PKRU right after the fault was contained, back in Rust (`None` on a
    /// CPU without protection keys): the PKRU the NF call started with.
    pub pkru_after: Option<u32>,
}

impl CFault {
    /// What happened, without the tenant: `buffet_pkt_handler touched 0x…, …` (the
    /// [`Display`](std::fmt::Display) form is `tenant <id>: ` and this).
    pub fn describe(&self) -> String {
        let (during, addr) = (self.during, self.addr);
        match self.kind {
            FaultKind::ProtectionKey { pkey } => format!(
                "{during} touched {addr:#x}, a region it may not access (protection key {pkey})"
            ),
            FaultKind::GuardPage => format!(
                "{during} touched {addr:#x}, a guard page or unused part of the tenant arena"
            ),
            FaultKind::BadVerdict(v) => {
                format!("{during} returned {v}, which is not a buffet.h verdict")
            }
            FaultKind::StackOverflow => {
                format!("{during} overflowed its stack (touched {addr:#x}, the NF stack's guard)")
            }
            FaultKind::Watchdog { budget } => {
                format!("{during} ran past the watchdog's budget of {budget:?} and was interrupted")
            }
            FaultKind::Syscall { nr } => format!(
                "{during} made system call {nr} at {addr:#x}, which the NF seccomp filter \
                 forbids"
            ),
            FaultKind::BadName { index, problem } => {
                format!("{during} returned counter {index} with a name that {problem}")
            }
            FaultKind::Signal { signal, code } => {
                let (name, what) = describe_signal(signal, code);
                let why = match during {
                    "buffet_state_init" => "a crash in buffet_state_init refuses the admission",
                    "buffet_mem_register" | "buffet_nf_name" | "buffet_abi_version" => {
                        "a crash while loading refuses the NF"
                    }
                    _ => "trusted-native: fault containment without hardware isolation",
                };
                format!("{during} raised {name} at {addr:#x} ({what}), contained ({why})")
            }
        }
    }
}

impl std::fmt::Display for CFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tenant {}: {}", self.tenant, self.describe())
    }
}

/// The packet descriptor of include/buffet.h (`struct buffet_pkt`).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct CPacket {
    data: *mut u8,
    len: u32,
    tenant: u32,
    ts_ns: u64,
    in_port: u16,
    l3_off: u16,
    l4_off: u16,
    payload_off: u16,
    src_port: u16,
    dst_port: u16,
    ip_proto: u8,
    l3_kind: u8,
    reserved: [u8; 2],
}

/// `struct buffet_counter`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counter {
    name: *const c_char,
    value: u64,
}

/// What the shim reports about a recovered fault (`struct buffet_fault` in guard.c).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawFault {
    signo: i32,
    code: i32,
    /// The protection key of a SEGV_PKUERR, the system call number of a SIGSYS.
    aux: i32,
    /// Where: `PLACE_*` (0: elsewhere).
    place: i32,
    addr: u64,
}

/// A tenant's state as Buffet sees it: a handle to the C state, which is the rest of the
/// tenant's region. Set by `buffet_state_init` at admission.
#[derive(Debug, Default)]
pub struct CState {
    region: Option<sys::RegionPtr>,
    /// The tenant whose packets the state handled (from its first packet call on).
    tenant: Option<TenantId>,
    /// A fault of `buffet_summary` (a crash, an unreadable or overlong counter name):
    /// the tenant's summaries stay empty, and its next packet call is a fault, which
    /// quarantines it. Boxed: the state stays within its 64 bytes.
    summary_fault: Mutex<Option<Box<SummaryFault>>>,
}

/// A fault of `buffet_summary`, and whether [`CNf::faults`] has it yet (not before the
/// tenant is known).
#[derive(Debug)]
struct SummaryFault {
    fault: CFault,
    recorded: bool,
}

impl CState {
    /// Bytes of C state (the `len` the NF's functions get); 0 before admission.
    pub fn len(&self) -> usize {
        self.region.map_or(0, |r| r.len())
    }

    /// Whether the state is not set up yet.
    pub fn is_empty(&self) -> bool {
        self.region.is_none()
    }
}

/// A C NF loaded from a shared object.
pub struct CNf {
    lib: sys::Loaded,
    path: PathBuf,
    name: &'static str,
    state_bytes: usize,
    /// Whether NF calls go through the fault-containment shim, and what it contains.
    containment: Containment,
    /// The watchdog's budget per call, in ns (0: none).
    budget_ns: u64,
    faults: Mutex<Vec<CFault>>,
    counter_names: Mutex<HashMap<String, &'static str>>,
}

impl std::fmt::Debug for CNf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CNf")
            .field("path", &self.path)
            .field("name", &self.name)
            .field("state_bytes", &self.state_bytes)
            .field("containment", &self.containment)
            .finish_non_exhaustive()
    }
}

impl CNf {
    /// Loads `path` with fault containment ([`Containment::Guarded`]). A bare file name
    /// (`nf.so`) is the file in the current directory.
    pub fn load(path: &Path) -> Result<CNf, CNfLoadError> {
        CNf::load_with(path, Containment::Guarded)
    }

    /// Loads `path` with [`LoadConfig::for_containment`]: inspected before loading when
    /// [`Containment::Guarded`] (the `mpk` level); when guarded, the watchdog's budget is
    /// [`watchdog_budget`] ([`WATCHDOG_ENV`] or the default).
    pub fn load_with(path: &Path, containment: Containment) -> Result<CNf, CNfLoadError> {
        let mut config = LoadConfig::for_containment(containment);
        if config.watchdog.is_some() {
            config.watchdog = Some(watchdog_budget()?);
        }
        CNf::load_config(path, config)
    }

    /// Loads `path`: inspects it on disk (if `config.inspect`), `dlopen`s it, resolves the
    /// NF's functions, checks its ABI version, asks `buffet_mem_register` for the state
    /// size and (guarded) installs the fault and watchdog handlers.
    pub fn load_config(path: &Path, config: LoadConfig) -> Result<CNf, CNfLoadError> {
        let containment = config.containment;
        if let Some(what) = not_shared_object(path) {
            return Err(CNfLoadError::NotSharedObject {
                path: path.to_owned(),
                what,
            });
        }
        if config.inspect {
            inspect::inspect(path)?;
        }
        let lib = sys::Loaded::open(path)?;
        let guarded = containment != Containment::Unguarded;
        if guarded {
            sys::install_guard().map_err(CNfLoadError::Guard)?;
        }
        let budget_ns = match containment {
            Containment::Unguarded => 0,
            _ => config.watchdog.map_or(0, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
            }),
        };
        // Each call runs the NF's code through the shim, as every later call does: a crash
        // (or an endless loop) refuses the NF with an error naming the function.
        let load_fault = |symbol: &'static str, raw: RawFault| CNfLoadError::Call {
            symbol,
            what: load_fault_text(symbol, raw),
        };
        let abi = lib
            .abi_version(guarded, budget_ns)
            .map_err(|raw| load_fault("buffet_abi_version", raw))?;
        if let Some(found) = abi.filter(|&v| v != ABI_VERSION) {
            return Err(CNfLoadError::Abi { found });
        }
        let name = match lib
            .nf_name(guarded, budget_ns)
            .map_err(|raw| load_fault("buffet_nf_name", raw))?
        {
            Some(sys::NfName::Name(name)) => name,
            Some(sys::NfName::TooLong) => {
                return Err(CNfLoadError::Call {
                    symbol: "buffet_nf_name",
                    what: format!(
                        "returned a name that is not NUL-terminated within \
                         {MAX_NAME_BYTES} bytes"
                    ),
                })
            }
            None | Some(sys::NfName::Null) => path
                .file_stem()
                .map_or_else(|| "c-nf".into(), |s| s.to_string_lossy().into_owned()),
        };
        let state_bytes = lib
            .mem_register(guarded, budget_ns)
            .map_err(|raw| load_fault("buffet_mem_register", raw))?;
        Ok(CNf {
            lib,
            path: path.to_owned(),
            // One leak per load: `NetworkFunction::name` wants a static string.
            name: Box::leak(name.into_boxed_str()),
            state_bytes,
            containment,
            budget_ns,
            faults: Mutex::new(Vec::new()),
            counter_names: Mutex::new(HashMap::new()),
        })
    }

    /// The shared object it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of state per tenant, as `buffet_mem_register` said.
    pub fn state_bytes(&self) -> usize {
        self.state_bytes
    }

    /// Which faults the NF's calls contain.
    pub fn containment(&self) -> Containment {
        self.containment
    }

    /// The watchdog's budget per call, if any.
    pub fn watchdog(&self) -> Option<Duration> {
        (self.budget_ns != 0).then(|| Duration::from_nanos(self.budget_ns))
    }

    /// How packet calls are made.
    fn pkt_mode(&self) -> CallMode {
        match self.containment {
            Containment::Unguarded => CallMode::Direct,
            Containment::Guarded | Containment::AnyFault => CallMode::Guarded {
                // Every fault inside a guarded call is the tenant's (faults of the
                // framework's own code are outside any call and still crash).
                all: true,
                budget_ns: self.budget_ns,
            },
        }
    }

    /// Faults contained so far (the first 1024), in order.
    pub fn faults(&self) -> Vec<CFault> {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, tenant: TenantId, during: &'static str, kind: FaultKind, addr: u64) {
        let pkru_after = buffet_memory::current_pkru();
        let mut f = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
        if f.len() < MAX_FAULT_RECORDS {
            f.push(CFault {
                tenant,
                during,
                kind,
                addr,
                pkru_after,
            });
        }
    }

    fn record_raw(&self, tenant: TenantId, during: &'static str, raw: RawFault) -> CFault {
        let (addr, kind) = fault_kind(raw);
        self.record(tenant, during, kind, addr);
        CFault {
            tenant,
            during,
            kind,
            addr,
            pkru_after: buffet_memory::current_pkru(),
        }
    }

    /// `None` once the NF has used [`MAX_COUNTER_NAMES`] distinct names and this is a new
    /// one.
    fn intern(&self, name: String) -> Option<&'static str> {
        let mut names = self
            .counter_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(&s) = names.get(&name) {
            return Some(s);
        }
        if names.len() >= MAX_COUNTER_NAMES {
            return None;
        }
        // One leak per distinct counter name (a handful per NF).
        let s: &'static str = Box::leak(name.clone().into_boxed_str());
        names.insert(name, s);
        Some(s)
    }

    /// Takes a fault of `buffet_summary` in `state`: recorded now if the tenant is known
    /// (it has had a packet call), else at its next packet call, which is a fault.
    fn summary_fault(&self, state: &CState, kind: FaultKind, addr: u64) {
        let fault = CFault {
            tenant: state.tenant.unwrap_or(TenantId(0)),
            during: "buffet_summary",
            kind,
            addr,
            pkru_after: buffet_memory::current_pkru(),
        };
        let recorded = state.tenant.is_some();
        if recorded {
            self.record(fault.tenant, fault.during, kind, addr);
        }
        *state
            .summary_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            Some(Box::new(SummaryFault { fault, recorded }));
    }

    /// At a packet call: whether an earlier `buffet_summary` of the tenant faulted (the
    /// call is then a fault instead), recording that fault under `tenant` if it is not
    /// yet. Remembers the tenant for later summaries.
    #[inline]
    fn summary_faulted(&self, state: &mut CState, tenant: TenantId) -> bool {
        state.tenant = Some(tenant);
        let pending = state
            .summary_fault
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(p) = pending else {
            return false;
        };
        if !p.recorded {
            p.recorded = true;
            p.fault.tenant = tenant;
            self.record(tenant, p.fault.during, p.fault.kind, p.fault.addr);
        }
        true
    }
}

/// What the shim recorded, as the fault's address and kind.
fn fault_kind(raw: RawFault) -> (u64, FaultKind) {
    let kind = match (raw.signo, raw.code, raw.place) {
        (_, _, PLACE_WATCHDOG) => FaultKind::Watchdog {
            budget: Duration::from_nanos(raw.addr),
        },
        (libc::SIGSEGV, _, PLACE_NF_STACK) => FaultKind::StackOverflow,
        (libc::SIGSEGV, SEGV_PKUERR, _) => FaultKind::ProtectionKey { pkey: raw.aux },
        (libc::SIGSEGV, SEGV_ACCERR, PLACE_ARENA) => FaultKind::GuardPage,
        (libc::SIGSYS, SYS_SECCOMP, _) => FaultKind::Syscall { nr: raw.aux },
        // Recovered only under `Containment::AnyFault`, or in `buffet_state_init`.
        (signal, code, _) => FaultKind::Signal { signal, code },
    };
    let addr = match kind {
        FaultKind::Watchdog { .. } => 0,
        _ => raw.addr,
    };
    (addr, kind)
}

/// What a fault of `symbol` at load was, in words, without the function's name (the
/// error names it) and without a tenant (none is involved).
fn load_fault_text(symbol: &'static str, raw: RawFault) -> String {
    let (addr, kind) = fault_kind(raw);
    let text = CFault {
        tenant: TenantId(0),
        during: symbol,
        kind,
        addr,
        pkru_after: None,
    }
    .describe();
    match text.strip_prefix(symbol) {
        Some(rest) => rest.trim_start().to_owned(),
        None => text,
    }
}

/// [`FaultKind::BadName`]'s problem for a name without a NUL within [`MAX_NAME_BYTES`].
const NAME_TOO_LONG: &str = "is not NUL-terminated within 63 bytes";
const _: () = assert!(MAX_NAME_BYTES == 63);

/// A buffet.h verdict as a [`Verdict`]; `None` for values the header does not define.
fn decode_verdict(v: i32) -> Option<Verdict> {
    Some(match v {
        0 => Verdict::Pass,
        1 => Verdict::Tx,
        2 => Verdict::Drop(DropCause::Policy),
        3 => Verdict::Drop(DropCause::Malformed),
        4 => Verdict::Drop(DropCause::RateLimited),
        5 => Verdict::Drop(DropCause::Integrity),
        6 => Verdict::Drop(DropCause::Replay),
        7 => Verdict::Drop(DropCause::TableFull),
        v if v & !0xffff == 0x10000 => Verdict::Forward((v & 0xffff) as u16),
        _ => return None,
    })
}

fn offset(o: usize) -> u16 {
    u16::try_from(o).unwrap_or(0xffff)
}

/// The `struct buffet_pkt` of a parsed packet; `data` points to its frame, which stays
/// exclusively borrowed (through `pkt`) for as long as the caller keeps `pkt` borrowed.
#[inline]
fn describe(pkt: &mut Packet<'_>) -> CPacket {
    let meta = pkt.meta();
    let (src_port, dst_port) = pkt.ports().unwrap_or((0, 0));
    let mut c = CPacket {
        data: std::ptr::null_mut(),
        len: 0,
        tenant: meta.tenant.0,
        ts_ns: meta.ts_ns,
        in_port: meta.in_port,
        l3_off: offset(pkt.l3_offset()),
        l4_off: offset(pkt.l4_offset()),
        payload_off: offset(pkt.payload_offset()),
        src_port,
        dst_port,
        ip_proto: pkt.ip_proto(),
        l3_kind: match pkt.l3_kind() {
            L3Kind::Ipv4 => 4,
            L3Kind::Ipv6 => 6,
        },
        reserved: [0; 2],
    };
    let data = pkt.data_mut();
    c.data = data.as_mut_ptr();
    c.len = data.len() as u32;
    c
}

impl NetworkFunction for CNf {
    type State = CState;
    /// The tenant's policy table, handed to `buffet_state_init` as JSON text.
    type Policy = serde_json::Value;

    fn name(&self) -> &'static str {
        self.name
    }

    fn register(&self) -> MemorySpec {
        MemorySpec {
            bytes: buffet_memory::region_tail_offset::<CState>().saturating_add(self.state_bytes),
        }
    }

    /// At the `mpk` level ([`Containment::Guarded`]) every worker thread is confined
    /// before it runs the NF ([`confine_nf_thread`]: the seccomp filter, the NF stack and
    /// the watchdog timer); the trusted levels leave threads as they are.
    fn prepare_worker_thread(&self) -> Result<(), WorkerThreadError> {
        if self.containment != Containment::Guarded {
            return Ok(());
        }
        confine_nf_thread().map_err(|e| WorkerThreadError(e.to_string()))
    }

    fn init(&self, _policy: &Self::Policy, _state: &mut CState) -> Result<(), InitError> {
        Err(InitError::invalid(
            "(nf)",
            "a C NF builds its state in the tenant's region: admit tenants through a \
             Pipeline (or TenantTable::admit_with and init_in_region)",
        ))
    }

    fn init_in_region(
        &self,
        policy: &Self::Policy,
        state: &mut CState,
        region: &mut [u8],
    ) -> Result<(), InitError> {
        if region.len() < self.state_bytes {
            return Err(InitError::OutOfMemory {
                needed: self.state_bytes,
                available: region.len(),
            });
        }
        let json = match policy {
            serde_json::Value::Null => "{}".to_owned(),
            p => p.to_string(),
        };
        let json = CString::new(json)
            .map_err(|_| InitError::invalid("(policy)", "contains a NUL character"))?;
        let handle = sys::RegionPtr::new(region)
            .ok_or_else(|| InitError::invalid("(region)", "empty tenant region"))?;
        // A crash in init is always contained (the admission fails, nothing else
        // changes), whatever the level: no tenant is running yet whose fault it could be
        // mistaken for.
        let mode = match self.pkt_mode() {
            CallMode::Direct => CallMode::Direct,
            CallMode::Guarded { budget_ns, .. } => CallMode::Guarded {
                all: true,
                budget_ns,
            },
        };
        match self.lib.state_init(&json, region, mode) {
            Ok(Ok(())) => {
                state.region = Some(handle);
                Ok(())
            }
            Ok(Err(message)) => Err(InitError::invalid("(policy)", message)),
            Err(raw) => {
                // The tenant is not admitted; which one it would have been is not known
                // here, so the record carries id 0, and the message leaves the tenant to
                // the caller, which names it.
                let f = self.record_raw(TenantId(0), "buffet_state_init", raw);
                Err(InitError::invalid(
                    "(state)",
                    format!("fault contained: {}", f.describe()),
                ))
            }
        }
    }

    #[inline]
    fn handle(&self, pkt: &mut Packet<'_>, state: &mut CState) -> Verdict {
        let Some(region) = state.region else {
            return Verdict::Fault;
        };
        let tenant = pkt.tenant();
        if self.summary_faulted(state, tenant) {
            return Verdict::Fault;
        }
        let mut c = describe(pkt);
        let mut v = 0;
        match self.lib.pkt_batch(
            std::slice::from_mut(&mut c),
            region,
            std::slice::from_mut(&mut v),
            self.pkt_mode(),
        ) {
            Ok(()) => decode_verdict(v).unwrap_or_else(|| {
                self.record(tenant, "buffet_pkt_handler", FaultKind::BadVerdict(v), 0);
                Verdict::Fault
            }),
            Err((_, raw)) => {
                self.record_raw(tenant, "buffet_pkt_handler", raw);
                Verdict::Fault
            }
        }
    }

    /// The whole chunk in one call into the shim: one setjmp per chunk, not per packet.
    #[inline]
    fn handle_group(&self, pkts: &mut [Packet<'_>], state: &mut CState, verdicts: &mut [Verdict]) {
        let Some(region) = state.region else {
            verdicts.fill(Verdict::Fault);
            return;
        };
        let Some(tenant) = pkts.first().map(Packet::tenant) else {
            return;
        };
        if self.summary_faulted(state, tenant) {
            if let Some(v) = verdicts.first_mut() {
                *v = Verdict::Fault;
            }
            return;
        }
        let mut descs: ArrayVec<CPacket, GROUP_CHUNK> = ArrayVec::new();
        for p in pkts.iter_mut().take(GROUP_CHUNK) {
            descs.push(describe(p));
        }
        let n = descs.len().min(verdicts.len());
        let mut raw = [0i32; GROUP_CHUNK];
        let handled =
            match self
                .lib
                .pkt_batch(&mut descs[..n], region, &mut raw[..n], self.pkt_mode())
            {
                Ok(()) => n,
                Err((at, fault)) => {
                    self.record_raw(tenant, "buffet_pkt_handler", fault);
                    if let Some(v) = verdicts.get_mut(at) {
                        *v = Verdict::Fault;
                    }
                    at
                }
            };
        for (v, &r) in verdicts.iter_mut().zip(&raw[..handled]) {
            match decode_verdict(r) {
                Some(d) => *v = d,
                None => {
                    self.record(tenant, "buffet_pkt_handler", FaultKind::BadVerdict(r), 0);
                    *v = Verdict::Fault;
                    return;
                }
            }
        }
    }

    /// A fault of the NF's `buffet_summary` — a crash, or a counter name that cannot be
    /// read (it is copied inside the guarded call, never read by Buffet) or is not
    /// NUL-terminated within [`MAX_NAME_BYTES`] bytes — leaves the tenant's summaries
    /// empty from then on, and makes its next packet call a fault, which quarantines it
    /// ([`NetworkFunction::fault_reason`] says why). A null name leaves that counter out.
    fn summary(&self, state: &CState) -> Vec<(&'static str, u64)> {
        let Some(region) = state.region else {
            return Vec::new();
        };
        if state
            .summary_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            return Vec::new();
        }
        let mut out = [Counter {
            name: std::ptr::null(),
            value: 0,
        }; SUMMARY_MAX];
        let guarded = self.containment != Containment::Unguarded;
        let counters = match self.lib.summary(region, &mut out, guarded, self.budget_ns) {
            Ok(counters) => counters,
            Err(raw) => {
                let (addr, kind) = fault_kind(raw);
                self.summary_fault(state, kind, addr);
                return Vec::new();
            }
        };
        if let Some(index) = counters
            .iter()
            .position(|(name, _)| *name == sys::NfName::TooLong)
        {
            let kind = FaultKind::BadName {
                index,
                problem: NAME_TOO_LONG,
            };
            self.summary_fault(state, kind, 0);
            return Vec::new();
        }
        counters
            .into_iter()
            .filter_map(|(name, value)| match name {
                sys::NfName::Name(name) => Some((self.intern(name)?, value)),
                _ => None,
            })
            .collect()
    }

    /// Why the tenant was quarantined, when it was for a fault of its `buffet_summary`.
    fn fault_reason(&self, state: &CState) -> Option<String> {
        state
            .summary_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|p| format!("earlier, {}", p.fault.describe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first 20 bytes of an ELF header: 64-bit, `data` (1 little-, 2 big-endian),
    /// `e_type`, `e_machine`.
    fn elf_head(data: u8, e_type: u16, e_machine: u16) -> Vec<u8> {
        let mut h = b"\x7fELF".to_vec();
        h.extend([2, data, 1, 0]);
        h.extend([0; 8]);
        let half = |v: u16| match data {
            2 => v.to_be_bytes(),
            _ => v.to_le_bytes(),
        };
        h.extend(half(e_type));
        h.extend(half(e_machine));
        h
    }

    #[test]
    fn a_file_that_is_no_shared_object_says_what_it_is() {
        const ET_DYN: u16 = 3;
        const EM_X86_64: u16 = 62;
        assert_eq!(
            elf_kind(&elf_head(1, ET_REL, EM_BPF)),
            Some(NotSharedObject::Ebpf)
        );
        assert_eq!(
            elf_kind(&elf_head(2, ET_REL, EM_BPF)),
            Some(NotSharedObject::Ebpf)
        );
        assert_eq!(
            elf_kind(&elf_head(1, ET_REL, EM_X86_64)),
            Some(NotSharedObject::Relocatable)
        );
        assert_eq!(elf_kind(&elf_head(1, ET_DYN, EM_X86_64)), None);
        assert_eq!(elf_kind(b"#!/bin/sh\n"), Some(NotSharedObject::NotElf));
        assert_eq!(elf_kind(b""), Some(NotSharedObject::NotElf));
        // A header too short to read the machine: the loader explains.
        assert_eq!(elf_kind(b"\x7fELF\x02\x01"), None);

        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("nf.so");
        std::fs::write(&text, "int x;\n").unwrap();
        let bpf = dir.path().join("nf.o");
        std::fs::write(&bpf, elf_head(1, ET_REL, EM_BPF)).unwrap();
        for containment in [Containment::Guarded, Containment::AnyFault] {
            let config = LoadConfig::for_containment(containment);
            let e = CNf::load_config(&text, config).unwrap_err().to_string();
            assert!(
                e.ends_with("nf.so: it is not a shared object (not an ELF file)"),
                "{e}"
            );
            let e = CNf::load_config(&bpf, config).unwrap_err().to_string();
            assert!(
                e.contains(
                    "nf.o: it is an eBPF object (ELF machine BPF), not a shared object: \
                     load eBPF NFs with --nf-ebpf"
                ),
                "{e}"
            );
        }
        // A missing file is still the loader's error.
        let e = CNf::load_config(
            &dir.path().join("none.so"),
            LoadConfig::for_containment(Containment::AnyFault),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("No such file"), "{e}");
    }

    #[test]
    fn the_watchdog_budget_takes_whole_milliseconds_and_refuses_the_rest() {
        assert_eq!(parse_watchdog("200").unwrap(), Duration::from_millis(200));
        assert_eq!(parse_watchdog(" 1 ").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_watchdog("60000").unwrap(), Duration::from_secs(60));
        for bad in ["0", "60001", "-5", "1.5", "10ms", "", "ten"] {
            let e = parse_watchdog(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("BUFFET_CNF_WATCHDOG_MS={bad:?}:"))
                    && e.contains("whole milliseconds, 1 to 60000"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn verdicts_decode_as_the_header_says() {
        assert_eq!(decode_verdict(0), Some(Verdict::Pass));
        assert_eq!(decode_verdict(1), Some(Verdict::Tx));
        assert_eq!(decode_verdict(2), Some(Verdict::Drop(DropCause::Policy)));
        assert_eq!(decode_verdict(7), Some(Verdict::Drop(DropCause::TableFull)));
        assert_eq!(decode_verdict(0x10000 | 3), Some(Verdict::Forward(3)));
        assert_eq!(decode_verdict(0x1ffff), Some(Verdict::Forward(0xffff)));
        for bad in [8, -1, 0x20000, 0x30005, i32::MIN] {
            assert_eq!(decode_verdict(bad), None, "{bad:#x}");
        }
    }

    #[test]
    fn descriptor_layout_matches_the_header() {
        // struct buffet_pkt: 8 (data) + 4 + 4 + 8 + 6*2 + 1 + 1 + 2 = 40 bytes.
        assert_eq!(std::mem::size_of::<CPacket>(), 40);
        assert_eq!(std::mem::size_of::<Counter>(), 16);
        // struct buffet_fault: 4 * 4 + 8 = 24 bytes.
        assert_eq!(std::mem::size_of::<RawFault>(), 24);
        assert!(
            std::mem::size_of::<CState>() <= 64,
            "the header fits the tail offset"
        );
    }
}
