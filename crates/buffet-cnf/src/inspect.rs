//! Inspection of a C NF's shared object on disk, before `dlopen` runs any of it.
//!
//! `dlopen` runs code of the object before Buffet calls any of its functions: its
//! initialisers, the resolvers of its IFUNC symbols, and the initialisers of every library
//! it names. And once mapped, native code can open every protection key with one
//! instruction (`WRPKRU`, or `XRSTOR` of a crafted PKRU state). [`inspect`] reads the
//! file as the dynamic loader will — program headers and the dynamic section, not the
//! section headers, which the loader ignores and an attacker may forge — and refuses it
//! for any of these, each a [`Finding`] that names what and where:
//!
//! * `WRPKRU` (`0f 01 ef`), `XRSTOR`/`XRSTOR64` (`0f ae /5`, memory operand) and
//!   `XRSTORS`/`XRSTORS64` (`0f c7 /3`, memory operand) byte sequences at **any** offset of
//!   an executable segment, unaligned ones too (ERIM's rule: code can jump into the middle
//!   of an instruction);
//! * initialisers and finalisers: `DT_INIT`, `DT_FINI`, and non-empty `DT_INIT_ARRAY`,
//!   `DT_FINI_ARRAY`, `DT_PREINIT_ARRAY`. A compiler driver links its own start files
//!   (crti's `_init`, crtbegin's `frame_dummy` and `__do_global_dtors_aux`) into every
//!   shared object unless told not to: NFs are linked with `-nostartfiles`, and then an
//!   initialiser is always the author's (`__attribute__((constructor))`);
//! * IFUNC symbols and `R_X86_64_IRELATIVE` relocations (their resolvers run at load
//!   time, or inside `dlsym`);
//! * undefined symbols outside [`ALLOWED_IMPORTS`] (pure libc functions: no allocation,
//!   no locks, no system calls) and needed libraries other than `libc.so.6` (a library
//!   brings its own initialisers); `DT_AUXILIARY` / `DT_FILTER` likewise;
//! * segments that are writable and executable, an executable stack (`PT_GNU_STACK` with
//!   `PF_X`, or missing: the loader would make every thread's stack executable), text
//!   relocations (the loader would make code writable), and thread-local storage (state
//!   outside the tenant's region, shared by every tenant the worker runs).
//!
//! What it does not do: prove anything about code that *is* accepted. A raw `syscall`
//! instruction passes inspection (seccomp on the worker thread is what stops the calls
//! that matter); a jump into libc at an address the NF computed is not seen. Inspection
//! closes the doors a loader opens; the fault shim, the watchdog and seccomp watch what
//! the code does.

use std::fmt;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader, Rela, Sym};
use object::{Endian, Endianness, ReadRef};

/// The functions a C NF may import: pure libc functions that neither allocate, nor lock,
/// nor make a system call. Everything a C NF needs beyond them lives in its tenant's
/// region; in particular no `malloc` family — a tenant's region is its memory.
///
/// `snprintf` and `vsnprintf` format into the caller's buffer (portblock reports policy
/// errors with them); glibc may allocate a temporary work buffer for very large field
/// widths, freed before they return. NFs should keep them to `buffet_state_init`.
pub const ALLOWED_IMPORTS: &[&str] = &[
    // memory
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "memchr",
    "memrchr",
    "bcmp",
    // strings
    "strlen",
    "strnlen",
    "strcmp",
    "strncmp",
    "strcasecmp",
    "strncasecmp",
    "strchr",
    "strrchr",
    "strstr",
    "strspn",
    "strcspn",
    "strpbrk",
    "strcpy",
    "strncpy",
    "stpcpy",
    "strcat",
    "strncat",
    // numbers
    "strtol",
    "strtoul",
    "strtoll",
    "strtoull",
    "atoi",
    "atol",
    "atoll",
    "abs",
    "labs",
    "llabs",
    // formatting into the caller's buffer
    "snprintf",
    "vsnprintf",
    // character classes (thread-local table pointers)
    "__ctype_b_loc",
    "__ctype_tolower_loc",
    "__ctype_toupper_loc",
    "tolower",
    "toupper",
    // byte order
    "htonl",
    "htons",
    "ntohl",
    "ntohs",
    // a constant of the process (no system call)
    "getpagesize",
];

/// The only library a C NF may name in `DT_NEEDED`: libc, which every Buffet process has
/// loaded already (so naming it runs nothing new).
pub const ALLOWED_LIBRARIES: &[&str] = &["libc.so.6"];

/// At most this many findings are listed (the rest are counted).
const MAX_FINDINGS: usize = 64;

const R_X86_64_IRELATIVE: u32 = 37;
/// The page size the loader maps segments with (x86-64).
const PAGE: u64 = 4096;
const DT_FLAGS_TEXTREL: u64 = 0x4;

/// One reason to refuse a shared object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// `WRPKRU` bytes in an executable segment.
    Wrpkru {
        /// File offset of the first byte.
        offset: u64,
    },
    /// `XRSTOR`-family bytes in an executable segment.
    Xrstor {
        /// `XRSTOR` (`0f ae /5`) or `XRSTORS` (`0f c7 /3`); a REX.W prefix makes either
        /// the 64-bit form and is not needed to match.
        form: &'static str,
        /// File offset of the `0f`.
        offset: u64,
    },
    /// An initialiser or finaliser.
    Initialiser {
        /// The dynamic tag (`DT_INIT`, `DT_INIT_ARRAY`, …).
        tag: &'static str,
        /// Functions it names.
        entries: u64,
        /// Their virtual address (`DT_INIT`) or the array's.
        addr: u64,
    },
    /// An IFUNC symbol (its resolver runs at load time or in `dlsym`).
    Ifunc {
        /// The symbol.
        symbol: String,
    },
    /// An `R_X86_64_IRELATIVE` relocation (runs a resolver at load time).
    Irelative {
        /// Where it applies (virtual address).
        addr: u64,
    },
    /// An undefined symbol outside [`ALLOWED_IMPORTS`].
    Import {
        /// The symbol.
        symbol: String,
    },
    /// A library the loader would load (and initialise) with the NF.
    Library {
        /// `DT_NEEDED`, `DT_AUXILIARY` or `DT_FILTER`.
        tag: &'static str,
        /// Its name.
        name: String,
    },
    /// A loadable segment both writable and executable.
    WritableExecutable {
        /// Program header index.
        segment: usize,
        /// File offset.
        offset: u64,
    },
    /// An executable stack requested (`PT_GNU_STACK` with `PF_X`) or implied (none).
    ExecutableStack {
        /// Whether `PT_GNU_STACK` is missing.
        missing: bool,
    },
    /// Text relocations (`DT_TEXTREL` or `DF_TEXTREL`).
    TextRelocations,
    /// Thread-local storage.
    Tls {
        /// Program header index.
        segment: usize,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Wrpkru { offset } => write!(
                f,
                "WRPKRU (0f 01 ef) at file offset {offset:#x} of an executable segment"
            ),
            Finding::Xrstor { form, offset } => write!(
                f,
                "{form} (may load PKRU) at file offset {offset:#x} of an executable segment"
            ),
            Finding::Initialiser { tag, entries, addr } => write!(
                f,
                "initialiser: {tag} names {entries} function(s) at {addr:#x}, run by dlopen \
                 (no constructors or destructors; link with -nostartfiles)"
            ),
            Finding::Ifunc { symbol } => {
                write!(f, "IFUNC symbol `{symbol}`: its resolver runs at load time")
            }
            Finding::Irelative { addr } => write!(
                f,
                "R_X86_64_IRELATIVE relocation at {addr:#x}: runs a resolver at load time"
            ),
            Finding::Import { symbol } => write!(
                f,
                "import `{symbol}` is not on the allowlist (buffet_cnf::inspect::ALLOWED_IMPORTS)"
            ),
            Finding::Library { tag, name } => write!(
                f,
                "{tag} `{name}`: only libc.so.6 may be linked (a library runs its own initialisers)"
            ),
            Finding::WritableExecutable { segment, offset } => write!(
                f,
                "segment {segment} (file offset {offset:#x}) is writable and executable"
            ),
            Finding::ExecutableStack { missing: true } => f.write_str(
                "no PT_GNU_STACK: the loader would make every thread's stack executable",
            ),
            Finding::ExecutableStack { missing: false } => {
                f.write_str("PT_GNU_STACK asks for an executable stack (-z execstack)")
            }
            Finding::TextRelocations => {
                f.write_str("text relocations: the loader would make code writable")
            }
            Finding::Tls { segment } => write!(
                f,
                "segment {segment} is thread-local storage: state outside the tenant's region"
            ),
        }
    }
}

/// Why inspection refused (or could not read) a shared object.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The file could not be read.
    #[error("cannot load C NF {path}: {source}")]
    Read {
        /// The shared object.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not an x86-64 ELF shared object the inspection can follow.
    #[error("C NF {path} is not an x86-64 ELF shared object inspection can read: {reason}")]
    Malformed {
        /// The shared object.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The object does something an untrusted NF may not.
    #[error("C NF {path} refused before loading:{}", list(findings, *more))]
    Refused {
        /// The shared object.
        path: PathBuf,
        /// What was found, in file order per kind (at most 64).
        findings: Vec<Finding>,
        /// Findings beyond those listed.
        more: usize,
    },
}

fn list(findings: &[Finding], more: usize) -> String {
    let mut s = String::new();
    for f in findings {
        s.push_str("\n  - ");
        s.push_str(&f.to_string());
    }
    if more > 0 {
        s.push_str(&format!("\n  - … and {more} more"));
    }
    s
}

/// Reads `path` and inspects it: `Ok` when nothing was found.
pub fn inspect(path: &Path) -> Result<(), InspectError> {
    let data = std::fs::read(path).map_err(|source| InspectError::Read {
        path: path.to_owned(),
        source,
    })?;
    let findings = inspect_bytes(&data).map_err(|reason| InspectError::Malformed {
        path: path.to_owned(),
        reason,
    })?;
    if findings.is_empty() {
        return Ok(());
    }
    let more = findings.len().saturating_sub(MAX_FINDINGS);
    let mut findings = findings;
    findings.truncate(MAX_FINDINGS);
    Err(InspectError::Refused {
        path: path.to_owned(),
        findings,
        more,
    })
}

/// The findings of an ELF image, all of them; `Err` when it cannot be followed.
pub fn inspect_bytes(data: &[u8]) -> Result<Vec<Finding>, String> {
    let header = elf::FileHeader64::<Endianness>::parse(data).map_err(|e| e.to_string())?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    if !endian.is_little_endian() || header.e_machine(endian) != elf::EM_X86_64 {
        return Err("not little-endian x86-64".into());
    }
    if header.e_type(endian) != elf::ET_DYN {
        return Err("not a shared object (ET_DYN)".into());
    }
    let phdrs = header
        .program_headers(endian, data)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut gnu_stack = false;
    let mut dynamic = None;
    for (i, ph) in phdrs.iter().enumerate() {
        let flags = ph.p_flags(endian);
        match ph.p_type(endian) {
            elf::PT_LOAD if flags & elf::PF_X != 0 => {
                if flags & elf::PF_W != 0 {
                    out.push(Finding::WritableExecutable {
                        segment: i,
                        offset: ph.p_offset(endian),
                    });
                }
                // The loader maps whole pages: the file bytes before and after the
                // segment on its first and last page are executable too.
                let (off, size) = (ph.p_offset(endian), ph.p_filesz(endian));
                let end = off
                    .checked_add(size)
                    .filter(|&e| e <= data.len() as u64)
                    .ok_or_else(|| format!("segment {i} lies outside the file"))?;
                let start = off & !(PAGE - 1);
                let end = end.saturating_add(PAGE - 1) & !(PAGE - 1);
                let end = end.min(data.len() as u64);
                scan_code(&data[start as usize..end as usize], start, &mut out);
            }
            elf::PT_GNU_STACK => {
                gnu_stack = true;
                if flags & elf::PF_X != 0 {
                    out.push(Finding::ExecutableStack { missing: false });
                }
            }
            elf::PT_TLS => out.push(Finding::Tls { segment: i }),
            elf::PT_DYNAMIC => {
                dynamic = Some(
                    ph.data_as_array::<elf::Dyn64<Endianness>, _>(endian, data)
                        .map_err(|()| "PT_DYNAMIC lies outside the file".to_owned())?,
                )
            }
            _ => {}
        }
    }
    if !gnu_stack {
        out.push(Finding::ExecutableStack { missing: true });
    }
    let Some(dynamic) = dynamic else {
        return Err("no PT_DYNAMIC: not a dynamically loadable object".into());
    };
    let image = Image {
        data,
        endian,
        loads: phdrs
            .iter()
            .filter(|p| p.p_type(endian) == elf::PT_LOAD)
            .map(|p| (p.p_vaddr(endian), p.p_offset(endian), p.p_filesz(endian)))
            .collect(),
    };
    inspect_dynamic(&image, dynamic, &mut out)?;
    Ok(out)
}

/// Finds `WRPKRU` and `XRSTOR(S)` at every byte offset of `code` (file offset `base`).
fn scan_code(code: &[u8], base: u64, out: &mut Vec<Finding>) {
    for (i, w) in code.windows(3).enumerate() {
        if w[0] != 0x0f {
            continue;
        }
        let offset = base + i as u64;
        let (modrm_mod, reg) = (w[2] >> 6, (w[2] >> 3) & 7);
        match (w[1], w[2]) {
            (0x01, 0xef) => out.push(Finding::Wrpkru { offset }),
            // 0f ae /5 with a register operand is LFENCE.
            (0xae, _) if reg == 5 && modrm_mod != 3 => out.push(Finding::Xrstor {
                form: "XRSTOR",
                offset,
            }),
            (0xc7, _) if reg == 3 && modrm_mod != 3 => out.push(Finding::Xrstor {
                form: "XRSTORS",
                offset,
            }),
            _ => {}
        }
    }
}

/// The file as the loader maps it.
struct Image<'d> {
    data: &'d [u8],
    endian: Endianness,
    /// (vaddr, file offset, file size) of each PT_LOAD.
    loads: Vec<(u64, u64, u64)>,
}

impl Image<'_> {
    /// The file offset of virtual address `addr`, when the file backs it.
    fn offset(&self, addr: u64) -> Result<u64, String> {
        self.loads
            .iter()
            .find(|&&(v, _, size)| addr >= v && addr - v < size)
            .map(|&(v, off, _)| addr - v + off)
            .ok_or_else(|| format!("address {addr:#x} is not in the file"))
    }

    fn slice<T: object::Pod>(&self, addr: u64, count: usize) -> Result<&[T], String> {
        let off = self.offset(addr)?;
        self.data
            .read_slice_at::<T>(off, count)
            .map_err(|()| format!("{count} entries at {addr:#x} run past the file"))
    }

    fn string(&self, strtab: u64, at: u64) -> Result<String, String> {
        let off = self.offset(strtab)? + at;
        let bytes = self
            .data
            .read_bytes_at_until(off..self.data.len() as u64, 0)
            .map_err(|()| format!("string at {off:#x} is not terminated"))?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
}

fn inspect_dynamic(
    img: &Image<'_>,
    dynamic: &[elf::Dyn64<Endianness>],
    out: &mut Vec<Finding>,
) -> Result<(), String> {
    let e = img.endian;
    let mut get = std::collections::HashMap::new();
    let mut libraries = Vec::new();
    for d in dynamic {
        let (tag, val) = (d.d_tag(e) as u32, d.d_val(e));
        match tag {
            elf::DT_NULL => break,
            elf::DT_NEEDED => libraries.push(("DT_NEEDED", val)),
            elf::DT_AUXILIARY => libraries.push(("DT_AUXILIARY", val)),
            elf::DT_FILTER => libraries.push(("DT_FILTER", val)),
            elf::DT_TEXTREL => out.push(Finding::TextRelocations),
            elf::DT_FLAGS if val & DT_FLAGS_TEXTREL != 0 => out.push(Finding::TextRelocations),
            _ => {
                get.insert(tag, val);
            }
        }
    }
    for (tag, addr) in [("DT_INIT", elf::DT_INIT), ("DT_FINI", elf::DT_FINI)] {
        if let Some(&a) = get.get(&addr) {
            out.push(Finding::Initialiser {
                tag,
                entries: 1,
                addr: a,
            });
        }
    }
    for (tag, arr, sz) in [
        (
            "DT_PREINIT_ARRAY",
            elf::DT_PREINIT_ARRAY,
            elf::DT_PREINIT_ARRAYSZ,
        ),
        ("DT_INIT_ARRAY", elf::DT_INIT_ARRAY, elf::DT_INIT_ARRAYSZ),
        ("DT_FINI_ARRAY", elf::DT_FINI_ARRAY, elf::DT_FINI_ARRAYSZ),
    ] {
        let entries = get.get(&sz).copied().unwrap_or(0) / 8;
        if let (Some(&a), true) = (get.get(&arr), entries > 0) {
            out.push(Finding::Initialiser {
                tag,
                entries,
                addr: a,
            });
        }
    }
    let strtab = *get.get(&elf::DT_STRTAB).ok_or("no DT_STRTAB")?;
    for (tag, at) in libraries {
        let name = img.string(strtab, at)?;
        if tag != "DT_NEEDED" || !ALLOWED_LIBRARIES.contains(&name.as_str()) {
            out.push(Finding::Library { tag, name });
        }
    }
    if get.contains_key(&elf::DT_REL) {
        return Err("DT_REL relocations (x86-64 objects use DT_RELA)".into());
    }
    // Every dynamic symbol the hash table counts (what dlsym can find) and every symbol a
    // relocation names (what the loader binds, wherever it lies in the table): undefined
    // ones are imports, IFUNCs run resolvers.
    let symtab = *get.get(&elf::DT_SYMTAB).ok_or("no DT_SYMTAB")?;
    let count = symbol_count(img, &get)?;
    let mut indices: Vec<usize> = (1..count).collect();
    // Relocations the loader applies: IRELATIVE ones run a resolver.
    for (table, size) in [
        (elf::DT_RELA, elf::DT_RELASZ),
        (elf::DT_JMPREL, elf::DT_PLTRELSZ),
    ] {
        if let Some(&addr) = get.get(&table) {
            let n = get.get(&size).copied().unwrap_or(0) as usize / 24;
            for r in img.slice::<elf::Rela64<Endianness>>(addr, n)? {
                if r.r_type(e, false) == R_X86_64_IRELATIVE {
                    out.push(Finding::Irelative {
                        addr: r.r_offset(e),
                    });
                }
                let sym = r.r_sym(e, false) as usize;
                if sym >= count {
                    indices.push(sym);
                }
            }
        }
    }
    indices.sort_unstable();
    indices.dedup();
    for i in indices {
        let sym = &img.slice::<elf::Sym64<Endianness>>(symtab + 24 * i as u64, 1)?[0];
        if sym.st_name(e) == 0 {
            continue;
        }
        let name = img.string(strtab, u64::from(sym.st_name(e)))?;
        if sym.st_type() == elf::STT_GNU_IFUNC {
            out.push(Finding::Ifunc { symbol: name });
        } else if sym.st_shndx(e) == elf::SHN_UNDEF && !ALLOWED_IMPORTS.contains(&name.as_str()) {
            out.push(Finding::Import { symbol: name });
        }
    }
    Ok(())
}

/// How many dynamic symbols there are, from the hash table the loader uses.
fn symbol_count(
    img: &Image<'_>,
    get: &std::collections::HashMap<u32, u64>,
) -> Result<usize, String> {
    if let Some(&hash) = get.get(&elf::DT_HASH) {
        // nbucket, nchain: one chain entry per symbol.
        let words = img.slice::<object::U32<Endianness>>(hash, 2)?;
        return Ok(words[1].get(img.endian) as usize);
    }
    let Some(&gnu) = get.get(&elf::DT_GNU_HASH) else {
        return Err("neither DT_HASH nor DT_GNU_HASH".into());
    };
    let e = img.endian;
    let head = img.slice::<object::U32<Endianness>>(gnu, 4)?;
    let (nbuckets, symoffset, bloom) = (
        head[0].get(e) as u64,
        head[1].get(e) as u64,
        head[2].get(e) as u64,
    );
    let buckets_at = gnu + 16 + bloom * 8;
    let buckets = img.slice::<object::U32<Endianness>>(buckets_at, nbuckets as usize)?;
    let Some(last) = buckets.iter().map(|b| u64::from(b.get(e))).max() else {
        return Ok(symoffset as usize);
    };
    if last < symoffset {
        return Ok(symoffset as usize);
    }
    // Walk the last chain to its end (the entry with bit 0 set).
    let chains_at = buckets_at + nbuckets * 4;
    let mut i = last;
    loop {
        let v = img.slice::<object::U32<Endianness>>(chains_at + (i - symoffset) * 4, 1)?[0];
        if v.get(e) & 1 != 0 {
            return Ok(i as usize + 1);
        }
        i += 1;
        if i > 1 << 24 {
            return Err("DT_GNU_HASH chain does not end".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_unaligned_sequences_and_tells_lfence_from_xrstor() {
        let mut out = Vec::new();
        // mov $0xef010f, %eax: WRPKRU inside an immediate; xrstor (%rdi); xrstor64 (%rdi);
        // lfence (0f ae e8) is fine; xrstors (%rdi); cmpxchg16b (%rdi) (0f c7 /1) is fine.
        let code = [
            0xb8, 0x0f, 0x01, 0xef, 0x00, // mov
            0x0f, 0xae, 0x2f, // xrstor
            0x48, 0x0f, 0xae, 0x2f, // xrstor64
            0x0f, 0xae, 0xe8, // lfence
            0x0f, 0xc7, 0x1f, // xrstors
            0x48, 0x0f, 0xc7, 0x0f, // cmpxchg16b
        ];
        scan_code(&code, 0x1000, &mut out);
        assert_eq!(
            out,
            vec![
                Finding::Wrpkru { offset: 0x1001 },
                Finding::Xrstor {
                    form: "XRSTOR",
                    offset: 0x1005
                },
                Finding::Xrstor {
                    form: "XRSTOR",
                    offset: 0x1009
                },
                Finding::Xrstor {
                    form: "XRSTORS",
                    offset: 0x100f
                },
            ]
        );
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert!(inspect_bytes(b"").is_err());
        assert!(inspect_bytes(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).is_err());
    }
}
