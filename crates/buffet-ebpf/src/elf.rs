//! Loading clang's BPF objects: find the program, link its bpf-to-bpf calls, resolve its
//! map references.
//!
//! Input: a relocatable ELF64 little-endian object for `EM_BPF` (`clang -target bpf -c`).
//! Output: an [`Image`] — one flat instruction stream starting at the entry point, with
//!
//! * every `call` to a function in another section (clang's `R_BPF_64_32` relocation)
//!   rewritten to a pc-relative bpf-to-bpf call, the called section appended once;
//! * every `ld_imm64` of a map (`R_BPF_64_64` against a symbol of section `maps`)
//!   rewritten to `BPF_PSEUDO_MAP_FD` with the map's index as its `imm`, which is what
//!   the verifier tracks and what the helpers receive at run time.
//!
//! Refused, with the offending symbol: global variables and string literals
//! (`.data`, `.bss`, `.rodata*` — a tenant has no copy of them), BTF-defined maps
//! (`.maps`), calls to undefined functions, and any other relocation in code.

use std::collections::HashMap;

use object::{
    Architecture, BinaryFormat, Object, ObjectKind, ObjectSection, ObjectSymbol, RelocationTarget,
    SectionIndex, SectionKind, SymbolKind, SymbolSection,
};

/// The section the program is looked for in when none is named.
pub const DEFAULT_SECTION: &str = "buffet";
/// The section of legacy map definitions (`struct buffet_map_def`).
pub const MAPS_SECTION: &str = "maps";
/// The section of counter names (NUL-separated).
pub const COUNTERS_SECTION: &str = ".buffet.counters";

const INSN: usize = 8;
const OP_LDDW: u8 = 0x18;
const OP_CALL: u8 = 0x85;
const MAP_DEF_SIZE: u64 = 20;

/// Why an object could not be loaded. Nothing is loaded when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    /// Not an ELF object the `object` crate can read.
    #[error("not a readable ELF object: {0}")]
    Parse(String),
    /// An ELF object, but not a relocatable 64-bit little-endian BPF one.
    #[error("not a BPF object (`clang -target bpf -c`): {0}")]
    NotBpf(String),
    /// No section of that name, or several candidates.
    #[error("{0}")]
    NoProgram(String),
    /// The section is not a whole number of instructions or is empty.
    #[error("section `{section}`: {message}")]
    BadSection {
        /// The section.
        section: String,
        /// What is wrong.
        message: String,
    },
    /// A map definition that cannot be used.
    #[error("map `{map}`: {message}")]
    Map {
        /// The map's symbol.
        map: String,
        /// What is wrong.
        message: String,
    },
    /// A relocation the loader does not support.
    #[error("instruction {insn} of section `{section}`: {message}")]
    Relocation {
        /// The section holding the instruction.
        section: String,
        /// Its index in that section.
        insn: u64,
        /// What is wrong (names the symbol).
        message: String,
    },
}

/// What kind of map a definition declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// `BUFFET_MAP_ARRAY`.
    Array,
    /// `BUFFET_MAP_STRSET`.
    StrSet,
}

/// One map, as declared in section `maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDef {
    /// The symbol's name (how policies refer to it).
    pub name: String,
    /// Array or string set.
    pub kind: MapKind,
    /// Array: 4. String set: the longest string.
    pub key_size: u32,
    /// Array: bytes per element. String set: 0.
    pub value_size: u32,
    /// Array: elements. String set: strings.
    pub max_entries: u32,
    /// `BUFFET_MAP_SCRATCH`: an ARRAY of one element that is zeroed before every packet
    /// (per-invocation scratch memory; no policy can fill it).
    pub scratch: bool,
}

/// A loaded, linked program, not yet verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The section the entry point came from.
    pub section: String,
    /// The entry point's symbol name (empty if it has none).
    pub function: String,
    /// Instructions, 8 bytes each, entry point first.
    pub insns: Vec<u8>,
    /// Maps, indexed by the `imm` of their `ld_imm64`.
    pub maps: Vec<MapDef>,
    /// Names of counters 0, 1, ... (from `.buffet.counters`).
    pub counter_names: Vec<String>,
}

impl Image {
    /// Number of instructions (an `ld_imm64` counts as two).
    pub fn len(&self) -> usize {
        self.insns.len() / INSN
    }

    /// True for an empty program.
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }
}

/// Loads the program in `section` (default [`DEFAULT_SECTION`]) from an object file's
/// bytes.
pub fn load(bytes: &[u8], section: Option<&str>) -> Result<Image, ElfError> {
    let file = object::File::parse(bytes).map_err(|e| ElfError::Parse(e.to_string()))?;
    if file.format() != BinaryFormat::Elf {
        return Err(ElfError::NotBpf(format!("{:?} format", file.format())));
    }
    if file.architecture() != Architecture::Bpf {
        return Err(ElfError::NotBpf(format!(
            "architecture {:?}",
            file.architecture()
        )));
    }
    if !file.is_little_endian() || !file.is_64() {
        return Err(ElfError::NotBpf("not 64-bit little-endian".into()));
    }
    if file.kind() != ObjectKind::Relocatable {
        return Err(ElfError::NotBpf(format!(
            "{:?}, not relocatable",
            file.kind()
        )));
    }
    if file.section_by_name(".maps").is_some() {
        return Err(ElfError::Map {
            map: ".maps".into(),
            message: "BTF-defined maps are not supported; declare maps with BUFFET_ARRAY / \
                      BUFFET_STRSET (section `maps`)"
                .into(),
        });
    }
    let maps = Maps::read(&file)?;
    let counter_names = match file.section_by_name(COUNTERS_SECTION) {
        Some(s) => {
            let data = s.data().map_err(|e| ElfError::Parse(e.to_string()))?;
            data.split(|&b| b == 0)
                .filter(|n| !n.is_empty())
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect()
        }
        None => Vec::new(),
    };

    let wanted = section.unwrap_or(DEFAULT_SECTION);
    let prog = file.section_by_name(wanted).ok_or_else(|| {
        let candidates: Vec<String> = file
            .sections()
            .filter(|s| s.kind() == SectionKind::Text && s.size() > 0)
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect();
        ElfError::NoProgram(format!(
            "no section `{wanted}` in the object; code sections: {}",
            if candidates.is_empty() {
                "none".to_owned()
            } else {
                candidates.join(", ")
            }
        ))
    })?;
    let function = file
        .symbols()
        .filter(|s| s.section() == SymbolSection::Section(prog.index()))
        .filter(|s| s.kind() == SymbolKind::Text)
        .find(|s| s.address() == 0)
        .and_then(|s| s.name().ok().map(str::to_owned))
        .unwrap_or_default();

    let mut linker = Linker {
        file: &file,
        maps: &maps,
        out: Vec::new(),
        placed: HashMap::new(),
        queue: Vec::new(),
    };
    linker.place(prog.index())?;
    while let Some(index) = linker.queue.pop() {
        linker.relocate(index)?;
    }
    Ok(Image {
        section: wanted.to_owned(),
        function,
        insns: linker.out,
        maps: maps.defs,
        counter_names,
    })
}

/// The map definitions and where each sits in section `maps`.
struct Maps {
    section: Option<SectionIndex>,
    defs: Vec<MapDef>,
    /// Offset in section `maps` -> map index.
    by_offset: HashMap<u64, usize>,
}

impl Maps {
    fn read(file: &object::File<'_>) -> Result<Maps, ElfError> {
        let Some(section) = file.section_by_name(MAPS_SECTION) else {
            return Ok(Maps {
                section: None,
                defs: Vec::new(),
                by_offset: HashMap::new(),
            });
        };
        let data = section.data().map_err(|e| ElfError::Parse(e.to_string()))?;
        let mut symbols: Vec<(u64, String)> = file
            .symbols()
            .filter(|s| s.section() == SymbolSection::Section(section.index()))
            .filter(|s| s.kind() != SymbolKind::Section)
            .map(|s| (s.address(), s.name().unwrap_or("?").to_owned()))
            .collect();
        symbols.sort();
        let mut defs = Vec::with_capacity(symbols.len());
        let mut by_offset = HashMap::new();
        for (offset, name) in symbols {
            let err = |message: String| ElfError::Map {
                map: name.clone(),
                message,
            };
            let raw = usize::try_from(offset)
                .ok()
                .and_then(|o| data.get(o..o + MAP_DEF_SIZE as usize))
                .ok_or_else(|| err("definition outside section `maps`".into()))?;
            let word = |i: usize| u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
            let (ty, key_size, value_size, max_entries, flags) =
                (word(0), word(4), word(8), word(12), word(16));
            let kind = match ty {
                crate::abi::MAP_ARRAY => MapKind::Array,
                crate::abi::MAP_STRSET => MapKind::StrSet,
                crate::abi::MAP_SCRATCH => MapKind::Array,
                t => {
                    return Err(err(format!(
                        "type {t} is not BUFFET_MAP_ARRAY ({}), BUFFET_MAP_STRSET ({}) or \
                         BUFFET_MAP_SCRATCH ({})",
                        crate::abi::MAP_ARRAY,
                        crate::abi::MAP_STRSET,
                        crate::abi::MAP_SCRATCH
                    )))
                }
            };
            if flags != 0 {
                return Err(err(format!("flags must be 0, not {flags}")));
            }
            by_offset.insert(offset, defs.len());
            defs.push(MapDef {
                name,
                kind,
                key_size,
                value_size,
                max_entries,
                scratch: ty == crate::abi::MAP_SCRATCH,
            });
        }
        Ok(Maps {
            section: Some(section.index()),
            defs,
            by_offset,
        })
    }
}

struct Linker<'a, 'data> {
    file: &'a object::File<'data>,
    maps: &'a Maps,
    out: Vec<u8>,
    /// Code section -> index of its first instruction in `out`.
    placed: HashMap<SectionIndex, usize>,
    /// Placed sections whose relocations are not applied yet.
    queue: Vec<SectionIndex>,
}

impl Linker<'_, '_> {
    fn section_name(&self, index: SectionIndex) -> String {
        self.file
            .section_by_index(index)
            .ok()
            .and_then(|s| s.name().ok().map(str::to_owned))
            .unwrap_or_else(|| format!("#{}", index.0))
    }

    /// Appends a code section to the output; its first instruction's index.
    fn place(&mut self, index: SectionIndex) -> Result<usize, ElfError> {
        if let Some(&base) = self.placed.get(&index) {
            return Ok(base);
        }
        let name = self.section_name(index);
        let bad = |message: &str| ElfError::BadSection {
            section: name.clone(),
            message: message.into(),
        };
        let section = self
            .file
            .section_by_index(index)
            .map_err(|e| bad(&e.to_string()))?;
        if section.kind() != SectionKind::Text {
            return Err(bad("not a code section"));
        }
        let data = section.data().map_err(|e| bad(&e.to_string()))?;
        if data.is_empty() {
            return Err(bad("empty"));
        }
        if data.len() % INSN != 0 {
            return Err(bad("size is not a multiple of 8 bytes"));
        }
        let base = self.out.len() / INSN;
        self.out.extend_from_slice(data);
        self.placed.insert(index, base);
        self.queue.push(index);
        Ok(base)
    }

    fn relocate(&mut self, index: SectionIndex) -> Result<(), ElfError> {
        let base = self.placed[&index];
        let section = self
            .file
            .section_by_index(index)
            .map_err(|e| ElfError::Parse(e.to_string()))?;
        let section_name = self.section_name(index);
        let section_len = section.size() / INSN as u64;
        for (offset, rel) in section.relocations() {
            let insn_in_section = offset / INSN as u64;
            let err = |message: String| ElfError::Relocation {
                section: section_name.clone(),
                insn: insn_in_section,
                message,
            };
            if offset % INSN as u64 != 0 || insn_in_section >= section_len {
                return Err(err(format!("relocation at unaligned offset {offset}")));
            }
            let RelocationTarget::Symbol(sym_index) = rel.target() else {
                return Err(err("relocation without a symbol".into()));
            };
            let sym = self
                .file
                .symbol_by_index(sym_index)
                .map_err(|e| err(e.to_string()))?;
            let sym_name = match sym.kind() {
                SymbolKind::Section => sym
                    .section_index()
                    .map(|s| self.section_name(s))
                    .unwrap_or_default(),
                _ => sym.name().unwrap_or("?").to_owned(),
            };
            let at = (base + insn_in_section as usize) * INSN;
            let opcode = self.out[at];
            let imm = i32::from_le_bytes(self.out[at + 4..at + 8].try_into().expect("4 bytes"));
            match opcode {
                OP_LDDW => {
                    let in_maps =
                        self.maps.section.is_some() && sym.section_index() == self.maps.section;
                    if !in_maps {
                        let target = sym
                            .section_index()
                            .map(|s| self.section_name(s))
                            .unwrap_or_else(|| "an undefined section".into());
                        return Err(err(format!(
                            "`{sym_name}` is global data in `{target}`; Buffet loads no global \
                             variables or string literals — keep per-tenant state in maps and \
                             compare bytes with character constants"
                        )));
                    }
                    let map_offset = sym.address().wrapping_add(imm as i64 as u64);
                    let map = *self.maps.by_offset.get(&map_offset).ok_or_else(|| {
                        err(format!(
                            "`{sym_name}`+{imm} is not the start of a map definition"
                        ))
                    })?;
                    if at + 2 * INSN > self.out.len() {
                        return Err(err("truncated ld_imm64".into()));
                    }
                    // src_reg = BPF_PSEUDO_MAP_FD (1), imm = map index, second half zero.
                    self.out[at + 1] = (self.out[at + 1] & 0x0f) | (1 << 4);
                    self.out[at + 4..at + 8].copy_from_slice(&(map as i32).to_le_bytes());
                    self.out[at + INSN + 4..at + 2 * INSN].copy_from_slice(&[0; 4]);
                }
                OP_CALL => {
                    let Some(target_section) = sym.section_index() else {
                        return Err(err(format!(
                            "call to undefined function `{sym_name}`; helpers are called by \
                             number (see buffet_ebpf.h)"
                        )));
                    };
                    let target_base = self.place(target_section)?;
                    let target =
                        target_base as i64 + (sym.address() / INSN as u64) as i64 + imm as i64 + 1;
                    let here = (base as u64 + insn_in_section) as i64;
                    let rel = i32::try_from(target - (here + 1))
                        .map_err(|_| err("call offset out of range".into()))?;
                    // src_reg = BPF_PSEUDO_CALL (1).
                    self.out[at + 1] = (self.out[at + 1] & 0x0f) | (1 << 4);
                    self.out[at + 4..at + 8].copy_from_slice(&rel.to_le_bytes());
                }
                op => {
                    return Err(err(format!(
                        "relocation against `{sym_name}` on opcode {op:#04x} is not supported"
                    )))
                }
            }
        }
        Ok(())
    }
}
