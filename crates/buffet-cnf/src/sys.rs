//! Every `unsafe` operation of buffet-cnf: loading the shared object, calling its three
//! functions (through the fault-containment shim `csrc/guard.c`, or directly when
//! unguarded), confining a thread with the shim's seccomp filter, and the pointer into the
//! tenant region that a [`RegionPtr`] keeps.
//!
//! The invariants the safe code relies on:
//! * a [`Loaded`] keeps the library mapped for as long as its function pointers exist;
//! * a [`RegionPtr`] is only created from the `&mut [u8]` of a tenant region that stays in
//!   place for the tenant's lifetime, and only dereferenced (by C) while the caller holds
//!   that tenant's state guard (which is how a `&mut CState` is reached);
//! * a guarded call never lets C unwind or jump over a Rust frame: the shim's trampolines
//!   are the only frames between `sigsetjmp` and the NF's code.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

use crate::{CNfLoadError, CPacket, Counter, RawFault, ABI_VERSION, SUMMARY_MAX};

type MemRegisterFn = unsafe extern "C" fn() -> usize;
type StateInitFn =
    unsafe extern "C" fn(*const c_char, *mut c_void, usize, *mut c_char, usize) -> c_int;
type PktHandlerFn = unsafe extern "C" fn(*mut CPacket, *mut c_void, usize) -> i32;
type NameFn = unsafe extern "C" fn() -> *const c_char;
type AbiFn = unsafe extern "C" fn() -> u32;
type SummaryFn = unsafe extern "C" fn(*const c_void, usize, *mut Counter, usize) -> usize;

extern "C" {
    fn buffet_guard_install() -> c_int;
    fn buffet_guard_prepare_thread() -> c_int;
    fn buffet_seccomp_confine() -> c_int;
    fn buffet_guard_batch(
        all: c_int,
        budget_ns: u64,
        f: PktHandlerFn,
        pkts: *mut CPacket,
        n: usize,
        state: *mut c_void,
        len: usize,
        verdicts: *mut i32,
        done: *mut usize,
    ) -> c_int;
    fn buffet_guard_init(
        all: c_int,
        budget_ns: u64,
        f: StateInitFn,
        policy: *const c_char,
        state: *mut c_void,
        len: usize,
        err: *mut c_char,
        errlen: usize,
        rc: *mut c_int,
    ) -> c_int;
    fn buffet_guard_summary(
        all: c_int,
        budget_ns: u64,
        f: SummaryFn,
        state: *const c_void,
        len: usize,
        out: *mut Counter,
        max: usize,
        n: *mut usize,
        name_buf: *mut c_char,
        name_cap: usize,
        name_lens: *mut i32,
    ) -> c_int;
    fn buffet_guard_size(all: c_int, budget_ns: u64, f: MemRegisterFn, out: *mut usize) -> c_int;
    fn buffet_guard_u32(all: c_int, budget_ns: u64, f: AbiFn, out: *mut u32) -> c_int;
    fn buffet_guard_name(
        all: c_int,
        budget_ns: u64,
        f: NameFn,
        buf: *mut c_char,
        cap: usize,
        len: *mut i32,
    ) -> c_int;
    fn buffet_guard_last_fault(out: *mut RawFault);
}

/// What the shim's handler recorded about the last fault it recovered on this thread.
fn last_fault() -> RawFault {
    let mut f = RawFault::default();
    // SAFETY: writes one `struct buffet_fault` (same layout as `RawFault`) into `f`.
    unsafe { buffet_guard_last_fault(&mut f) };
    f
}

/// For the shim's SIGSEGV handler: does `addr` lie in a tenant arena? Atomic loads only,
/// so callable from a signal handler; never panics.
#[no_mangle]
pub extern "C" fn buffet_cnf_in_arena(addr: usize) -> c_int {
    c_int::from(buffet_memory::in_tenant_arena(addr))
}

/// How a call into the NF is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallMode {
    /// Directly: any fault kills the process, nothing interrupts a loop.
    Direct,
    /// Through the shim, on the thread's NF stack.
    Guarded {
        /// Recover from every fault of the call, not only a tenant's.
        all: bool,
        /// The watchdog's budget for the call in ns (0: none).
        budget_ns: u64,
    },
}

/// Gives the calling thread its NF stack, alternate signal stack and watchdog timer now
/// (the first guarded call on a thread does it otherwise), then confines it with the NF
/// seccomp filter of `csrc/guard.c`.
pub(crate) fn seccomp_confine() -> Result<(), std::io::Error> {
    // SAFETY: the shim's functions take no arguments; they set up thread-local state, set
    // PR_SET_NO_NEW_PRIVS and install a seccomp filter on the calling thread only.
    unsafe {
        buffet_guard_prepare_thread();
        match buffet_seccomp_confine() {
            0 => Ok(()),
            errno => Err(std::io::Error::from_raw_os_error(errno)),
        }
    }
}

/// Installs the shim's fault and watchdog handlers (once per process).
pub(crate) fn install_guard() -> Result<(), std::io::Error> {
    // SAFETY: the shim's install function takes no arguments, runs at most once
    // (pthread_once) and only calls sigaction / pthread_key_create.
    match unsafe { buffet_guard_install() } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// Bytes a name the NF hands over (a counter's, `buffet_nf_name`'s) may take, its NUL
/// included: a longer one is the NF's error.
pub(crate) const NAME_CAP: usize = 64;

/// A string the NF handed over, copied inside the guarded call ([`NAME_CAP`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NfName {
    /// A null pointer.
    Null,
    /// No NUL within [`NAME_CAP`] bytes.
    TooLong,
    /// The string (lossily UTF-8).
    Name(String),
}

impl NfName {
    /// From the shim's copy: `len` as `copy_name` returned it, the bytes in `buf`.
    fn from_copy(len: i32, buf: &[c_char]) -> NfName {
        match usize::try_from(len) {
            Ok(n) if n < buf.len() => {
                let bytes: Vec<u8> = buf[..n].iter().map(|&c| c as u8).collect();
                NfName::Name(String::from_utf8_lossy(&bytes).into_owned())
            }
            _ if len == -1 => NfName::Null,
            _ => NfName::TooLong,
        }
    }
}

/// A loaded C NF: the library and the function pointers taken from it.
pub(crate) struct Loaded {
    mem_register: MemRegisterFn,
    state_init: StateInitFn,
    pkt_handler: PktHandlerFn,
    summary: Option<SummaryFn>,
    name: Option<NameFn>,
    abi: Option<AbiFn>,
    /// Keeps the code of the pointers above mapped; dropped last.
    _lib: libloading::Library,
}

impl Loaded {
    /// `dlopen`s `path` and resolves the three required functions and the optional ones
    /// (none of them is called here).
    pub(crate) fn open(path: &Path) -> Result<Loaded, CNfLoadError> {
        // dlopen searches the library path for a name without a slash: a bare file name
        // means the file in the current directory, as everywhere else on the command line.
        let bare = path.components().count() == 1
            && matches!(
                path.components().next(),
                Some(std::path::Component::Normal(_))
            );
        let local;
        let open_path = if bare {
            local = Path::new(".").join(path);
            local.as_path()
        } else {
            path
        };
        // SAFETY: loading a shared object runs its initialisers: the operator chose to
        // run this native NF in the process (that is what `--nf-lib` means), and the
        // library is not unloaded while any pointer into it exists (`_lib` lives as
        // long as the pointers, which never leave `Loaded`).
        // RTLD_NOW: every import is bound here, so no lazy binding (the dynamic linker's
        // own code and lock) ever runs inside an NF call, where a fault or the watchdog
        // could interrupt it. RTLD_LOCAL: the NF's symbols interpose nothing.
        let lib: libloading::Library = unsafe {
            libloading::os::unix::Library::open(
                Some(open_path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|source| CNfLoadError::Open {
            path: path.to_owned(),
            reason: dl_reason(&source.to_string(), open_path),
        })?
        .into();
        // SAFETY: for each symbol below, the type is the one include/buffet.h declares for
        // that name; a library exporting the name with another type violates the ABI it
        // links against. The pointers are copied out of the `Symbol`s and used only while
        // `lib` is alive (it moves into the same `Loaded`).
        unsafe {
            let mem_register = *required::<MemRegisterFn>(&lib, "buffet_mem_register")?;
            let state_init = *required::<StateInitFn>(&lib, "buffet_state_init")?;
            let pkt_handler = *required::<PktHandlerFn>(&lib, "buffet_pkt_handler")?;
            let summary = lib.get::<SummaryFn>(b"buffet_summary\0").ok().map(|s| *s);
            let name = lib.get::<NameFn>(b"buffet_nf_name\0").ok().map(|s| *s);
            let abi = lib.get::<AbiFn>(b"buffet_abi_version\0").ok().map(|s| *s);
            Ok(Loaded {
                mem_register,
                state_init,
                pkt_handler,
                summary,
                name,
                abi,
                _lib: lib,
            })
        }
    }

    /// `buffet_mem_register()` through the shim (`all`: every fault contained,
    /// `budget_ns`: the watchdog's budget, 0 for none).
    pub(crate) fn mem_register(&self, all: bool, budget_ns: u64) -> Result<usize, RawFault> {
        let mut out = 0usize;
        // SAFETY: a function of the ABI without arguments, called by the shim between its
        // setjmp and the jump target; `out` is a local.
        let faulted =
            unsafe { buffet_guard_size(c_int::from(all), budget_ns, self.mem_register, &mut out) };
        if faulted != 0 {
            Err(last_fault())
        } else {
            Ok(out)
        }
    }

    /// `buffet_abi_version()` through the shim, if the NF exports it.
    pub(crate) fn abi_version(&self, all: bool, budget_ns: u64) -> Result<Option<u32>, RawFault> {
        let Some(f) = self.abi else {
            return Ok(None);
        };
        let mut out = 0u32;
        // SAFETY: as for `mem_register`.
        let faulted = unsafe { buffet_guard_u32(c_int::from(all), budget_ns, f, &mut out) };
        if faulted != 0 {
            Err(last_fault())
        } else {
            Ok(Some(out))
        }
    }

    /// `buffet_nf_name()` through the shim, if the NF exports it: the string it points to
    /// is copied inside the guarded call, so a pointer that cannot be read is a contained
    /// fault, never a read by the framework.
    pub(crate) fn nf_name(&self, all: bool, budget_ns: u64) -> Result<Option<NfName>, RawFault> {
        let Some(f) = self.name else {
            return Ok(None);
        };
        let mut buf = [0 as c_char; NAME_CAP];
        let mut len = 0i32;
        // SAFETY: as for `mem_register`; `buf` is a local of `NAME_CAP` bytes, the length
        // the shim is given, and `len` a local.
        let faulted = unsafe {
            buffet_guard_name(
                c_int::from(all),
                budget_ns,
                f,
                buf.as_mut_ptr(),
                buf.len(),
                &mut len,
            )
        };
        if faulted != 0 {
            Err(last_fault())
        } else {
            Ok(Some(NfName::from_copy(len, &buf)))
        }
    }

    /// `buffet_state_init(policy, region, err)`, guarded or not.
    pub(crate) fn state_init(
        &self,
        policy: &CString,
        region: &mut [u8],
        mode: CallMode,
    ) -> Result<Result<(), String>, RawFault> {
        let mut err = [0 as c_char; 256];
        let mut rc: c_int = 0;
        let (state, len) = (region.as_mut_ptr().cast::<c_void>(), region.len());
        let faulted = match mode {
            // SAFETY: all pointers are valid for the call: `policy` is NUL-terminated,
            // `region` is the tenant's exclusively borrowed bytes, `err` and `rc` are
            // locals. The shim calls `state_init` between its setjmp and the jump target,
            // with no Rust frame in between.
            CallMode::Guarded { all, budget_ns } => unsafe {
                buffet_guard_init(
                    c_int::from(all),
                    budget_ns,
                    self.state_init,
                    policy.as_ptr(),
                    state,
                    len,
                    err.as_mut_ptr(),
                    err.len(),
                    &mut rc,
                ) != 0
            },
            // SAFETY: as above, called directly (unguarded: a fault kills the process).
            CallMode::Direct => unsafe {
                rc = (self.state_init)(policy.as_ptr(), state, len, err.as_mut_ptr(), err.len());
                false
            },
        };
        if faulted {
            return Err(last_fault());
        }
        if rc == 0 {
            return Ok(Ok(()));
        }
        err[err.len() - 1] = 0;
        // SAFETY: `err` is NUL-terminated (its last byte was just set to 0).
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
        Ok(Err(if msg.is_empty() {
            format!("buffet_state_init returned {rc}")
        } else {
            msg.into_owned()
        }))
    }

    /// `buffet_pkt_handler` over a chunk of one tenant's packets (one packet is a chunk
    /// of one), `verdicts[i]` for `pkts[i]`; guarded: one setjmp for the whole chunk. On a
    /// contained fault, the index of the faulting packet (verdicts before it are valid)
    /// and the fault.
    #[inline]
    pub(crate) fn pkt_batch(
        &self,
        pkts: &mut [CPacket],
        region: RegionPtr,
        verdicts: &mut [i32],
        mode: CallMode,
    ) -> Result<(), (usize, RawFault)> {
        let n = pkts.len().min(verdicts.len());
        let CallMode::Guarded { all, budget_ns } = mode else {
            for (p, v) in pkts.iter_mut().zip(verdicts.iter_mut()) {
                // SAFETY: as below, called directly (unguarded: a fault kills the
                // process).
                *v = unsafe { (self.pkt_handler)(p, region.ptr.as_ptr().cast(), region.len) };
            }
            return Ok(());
        };
        let mut done = 0usize;
        // SAFETY: `pkts` and `verdicts` are exclusively borrowed arrays of at least `n`
        // elements whose packet descriptors point to the packets' exclusively borrowed
        // frames; `region` is the tenant's region, reachable because the caller holds
        // the tenant's state guard; `done` is a local. The shim's trampolines are the only
        // frames between the setjmp and the NF.
        let faulted = unsafe {
            buffet_guard_batch(
                c_int::from(all),
                budget_ns,
                self.pkt_handler,
                pkts.as_mut_ptr(),
                n,
                region.ptr.as_ptr().cast(),
                region.len,
                verdicts.as_mut_ptr(),
                &mut done,
            )
        };
        if faulted != 0 {
            Err((done, last_fault()))
        } else {
            Ok(())
        }
    }

    /// `buffet_summary(state, out)`, always through the shim; empty without the symbol.
    /// Each counter's value with its name, which the shim copied inside the guarded call
    /// (a name pointer that cannot be read is a contained fault).
    pub(crate) fn summary(
        &self,
        region: RegionPtr,
        out: &mut [Counter; SUMMARY_MAX],
        all: bool,
        budget_ns: u64,
    ) -> Result<Vec<(NfName, u64)>, RawFault> {
        let Some(f) = self.summary else {
            return Ok(Vec::new());
        };
        let mut n = 0usize;
        let mut names = [0 as c_char; SUMMARY_MAX * NAME_CAP];
        let mut lens = [0i32; SUMMARY_MAX];
        // SAFETY: as for the packet handler; `out` is a local array of `out.len()`
        // counters the NF may fill, `names` holds `NAME_CAP` bytes for each of them and
        // `lens` one length each, the sizes the shim is given.
        let faulted = unsafe {
            buffet_guard_summary(
                c_int::from(all),
                budget_ns,
                f,
                region.ptr.as_ptr().cast_const().cast(),
                region.len,
                out.as_mut_ptr(),
                out.len(),
                &mut n,
                names.as_mut_ptr(),
                NAME_CAP,
                lens.as_mut_ptr(),
            )
        };
        if faulted != 0 {
            return Err(last_fault());
        }
        let n = n.min(out.len());
        Ok((0..n)
            .map(|i| {
                let buf = &names[i * NAME_CAP..(i + 1) * NAME_CAP];
                (NfName::from_copy(lens[i], buf), out[i].value)
            })
            .collect())
    }
}

/// Looks a required symbol up.
///
/// # Safety
/// `T` must be the symbol's real type (see `Loaded::open`).
unsafe fn required<'l, T>(
    lib: &'l libloading::Library,
    name: &'static str,
) -> Result<libloading::Symbol<'l, T>, CNfLoadError> {
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: forwarded to the caller: `T` is the symbol's type.
    unsafe { lib.get::<T>(&cname) }.map_err(|source| CNfLoadError::Missing {
        symbol: name,
        source,
    })
}

/// Where a tenant's C state lives: the bytes of its region past the `CState` header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegionPtr {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RegionPtr is only reachable through the tenant's `CState`, i.e. through its
// state guard, which serialises every use across threads (exactly like the `&mut [u8]` it
// was made from, which is Send).
unsafe impl Send for RegionPtr {}

impl RegionPtr {
    /// Remembers the tenant region's bytes for later calls; they stay in place for the
    /// tenant's lifetime (regions never move) and are used only under its state guard.
    pub(crate) fn new(region: &mut [u8]) -> Option<RegionPtr> {
        Some(RegionPtr {
            ptr: NonNull::new(region.as_mut_ptr())?,
            len: region.len(),
        })
    }

    /// Bytes of C state.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// `ABI_VERSION` is re-checked here so the header and this module cannot drift apart
/// silently: the shim includes include/buffet.h.
const _: () = assert!(ABI_VERSION == 1);

/// The dynamic loader's message without the path it starts with (`x.so: cannot open
/// shared object file: ...`): the error names the path once, itself.
fn dl_reason(message: &str, opened: &Path) -> String {
    let opened = opened.to_string_lossy();
    match message.strip_prefix(opened.as_ref()) {
        Some(rest) if rest.starts_with(": ") => rest[2..].to_owned(),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_reason_drops_the_path_it_repeats() {
        let p = Path::new("/tmp/x.so");
        assert_eq!(
            dl_reason(
                "/tmp/x.so: cannot open shared object file: No such file or directory",
                p
            ),
            "cannot open shared object file: No such file or directory"
        );
        // Another path, or no path at all: the message as the loader gave it.
        assert_eq!(dl_reason("/tmp/y.so: bad ELF", p), "/tmp/y.so: bad ELF");
        assert_eq!(dl_reason("/tmp/x.sox: bad", p), "/tmp/x.sox: bad");
    }
}
