//! Inspection before `dlopen`: one small shared object per class of rejection, each
//! refused with a finding that names what and where — and the constructor of a refused
//! object never runs (it would end this process). The example NFs, built with the
//! documented flags, pass; the same NF built with the compiler's start files is refused
//! at the mpk level and still loads as trusted-native. Runs on every machine.

mod common;

use std::path::{Path, PathBuf};

use buffet_cnf::inspect::{inspect, ALLOWED_IMPORTS};
use buffet_cnf::{CNf, CNfLoadError, Containment, Finding, InspectError, LoadConfig};
use common::{build_nf, example_nf, test_nf, NF_CFLAGS};

/// The three functions every NF needs, for the variants below.
const BASE: &str = r#"
#include "buffet.h"
size_t buffet_mem_register(void) { return 8; }
int buffet_state_init(const char *p, void *s, size_t l, char *e, size_t el) {
    (void)p, (void)s, (void)l, (void)e, (void)el;
    return 0;
}
"#;

/// Builds `BASE` + `extra` (a `buffet_pkt_handler` and whatever else) with the documented
/// flags plus `flags`.
fn variant(name: &str, extra: &str, flags: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-nf-src");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}-{}.c", std::process::id()));
    std::fs::write(&src, format!("{BASE}\n{extra}\n")).unwrap();
    let mut all: Vec<&str> = NF_CFLAGS
        .iter()
        .copied()
        .filter(|f| *f != "-Werror")
        .collect();
    all.extend_from_slice(flags);
    build_nf(&src, &format!("inspect-{name}"), &all)
}

const HANDLER: &str = r#"
buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *s, size_t l) {
    (void)pkt, (void)s, (void)l;
    return BUFFET_PASS;
}
"#;

/// The findings of refusing `path`, after checking that loading at the mpk level (the
/// default) is refused with the same error, listing every finding.
fn refused(path: &Path) -> Vec<Finding> {
    let findings = match inspect(path) {
        Err(InspectError::Refused { findings, more, .. }) => {
            assert_eq!(more, 0);
            findings
        }
        other => panic!("{}: expected a refusal, got {other:?}", path.display()),
    };
    let e = CNf::load(path).unwrap_err();
    assert!(matches!(e, CNfLoadError::Inspect(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("refused before loading"), "{text}");
    for f in &findings {
        assert!(text.contains(&format!("\n  - {f}")), "{text}");
    }
    findings
}

#[test]
fn the_example_and_attack_nfs_pass_inspection() {
    for name in ["portblock", "flowmon", "malicious"] {
        inspect(&example_nf(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    inspect(&test_nf("attack")).unwrap();
    let nf = CNf::load(&example_nf("portblock")).unwrap();
    assert_eq!(nf.containment(), Containment::Guarded);
}

#[test]
fn wrpkru_is_refused_aligned_or_hidden_in_an_immediate() {
    let f = refused(&variant(
        "wrpkru",
        &format!(
            "{HANDLER}\nvoid open_all_keys(void) {{ __asm__ volatile(\"xor %%ecx, %%ecx\\n\\t\
             xor %%edx, %%edx\\n\\txor %%eax, %%eax\\n\\t.byte 0x0f, 0x01, 0xef\" ::: \
             \"eax\", \"ecx\", \"edx\"); }}"
        ),
        &[],
    ));
    assert!(matches!(f[..], [Finding::Wrpkru { .. }]), "{f:?}");
    // ERIM's point: b8 0f 01 ef 00 is `mov $0xef010f, %eax`, and a jump to its second
    // byte executes WRPKRU.
    let f = refused(&variant(
        "wrpkru-unaligned",
        &format!(
            "{HANDLER}\nunsigned innocent(void) {{ unsigned v; \
             __asm__ volatile(\"movl $0xef010f, %0\" : \"=r\"(v)); return v; }}"
        ),
        &[],
    ));
    assert!(matches!(f[..], [Finding::Wrpkru { .. }]), "{f:?}");
    let text = f[0].to_string();
    assert!(
        text.starts_with("WRPKRU (0f 01 ef) at file offset 0x"),
        "{text}"
    );
}

#[test]
fn every_xrstor_form_is_refused() {
    for (name, insn, form) in [
        ("xrstor", "xrstor", "XRSTOR"),
        ("xrstor64", "xrstor64", "XRSTOR"),
        ("xrstors", "xrstors", "XRSTORS"),
        ("xrstors64", "xrstors64", "XRSTORS"),
    ] {
        let f = refused(&variant(
            name,
            &format!(
                "{HANDLER}\nvoid restore(void *area) {{ __asm__ volatile(\"{insn} (%0)\" :: \
                 \"r\"(area), \"a\"(-1), \"d\"(-1) : \"memory\"); }}"
            ),
            &[],
        ));
        assert!(
            matches!(f[..], [Finding::Xrstor { form: got, .. }] if got == form),
            "{name}: {f:?}"
        );
    }
}

#[test]
fn an_authors_constructor_never_runs_and_every_initialiser_is_refused() {
    // The constructor would end this process: that the test finishes proves it never ran.
    let ctor = variant(
        "constructor",
        &format!(
            "{HANDLER}\n__attribute__((constructor)) static void end_it(void) {{ \
             __asm__ volatile(\"syscall\" :: \"a\"(231), \"D\"(42)); }}"
        ),
        &[],
    );
    let f = refused(&ctor);
    assert!(
        matches!(
            f[..],
            [Finding::Initialiser {
                tag: "DT_INIT_ARRAY",
                entries: 1,
                ..
            }]
        ),
        "{f:?}"
    );
    let f = refused(&variant(
        "destructor",
        &format!(
            "{HANDLER}\nvolatile int left;\n\
             __attribute__((destructor)) static void later(void) {{ left = 1; }}"
        ),
        &[],
    ));
    assert!(
        matches!(
            f[..],
            [Finding::Initialiser {
                tag: "DT_FINI_ARRAY",
                ..
            }]
        ),
        "{f:?}"
    );
    let f = refused(&variant(
        "dt-init",
        &format!("{HANDLER}\nvoid my_init(void) {{}}"),
        &["-Wl,-init,my_init"],
    ));
    assert!(
        matches!(f[..], [Finding::Initialiser { tag: "DT_INIT", .. }]),
        "{f:?}"
    );
    assert!(
        f[0].to_string().contains("link with -nostartfiles"),
        "{}",
        f[0]
    );
}

/// Without -nostartfiles the compiler links crti/crtbegin: their `_init`, `frame_dummy`
/// and `__do_global_dtors_aux`, and weak imports of `__cxa_finalize`, `__gmon_start__`,
/// `_ITM_*`. Refused at the mpk level (the message says which flag avoids them); the
/// trusted-native level loads it and runs it.
#[test]
fn the_compilers_start_files_are_refused_at_mpk_and_load_as_trusted_native() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/c-nf/portblock.c");
    let path = build_nf(
        &src,
        "portblock-startfiles",
        &["-O2", "-fPIC", "-shared", "-fno-stack-protector"],
    );
    let f = refused(&path);
    let tags: Vec<&str> = f
        .iter()
        .filter_map(|f| match f {
            Finding::Initialiser { tag, .. } => Some(*tag),
            _ => None,
        })
        .collect();
    assert_eq!(
        tags,
        ["DT_INIT", "DT_FINI", "DT_INIT_ARRAY", "DT_FINI_ARRAY"],
        "{f:?}"
    );
    assert!(f.contains(&Finding::Import {
        symbol: "__cxa_finalize".into()
    }));
    let nf = CNf::load_with(&path, Containment::AnyFault).unwrap();
    assert_eq!(buffet_sdk::NetworkFunction::name(&nf), "portblock");
    // An operator may also switch inspection off explicitly.
    let cfg = LoadConfig {
        inspect: false,
        ..LoadConfig::default()
    };
    CNf::load_config(&path, cfg).unwrap();
}

#[test]
fn imports_outside_the_allowlist_are_refused_one_per_line() {
    let f = refused(&variant(
        "imports",
        r#"
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
static void *nothing(void *a) { return a; }
buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *s, size_t l) {
    (void)s, (void)l;
    switch (pkt->len) {
    case 1: exit(1);
    case 2: abort();
    case 3: _exit(3);
    case 4: { pthread_t t; pthread_create(&t, 0, nothing, 0); break; }
    case 5: mprotect(s, 4096, 7); break;
    case 6: syscall(60, 0);  break;
    case 7: signal(SIGSEGV, SIG_IGN); break;
    case 8: dlopen("x", 0); break;
    case 9: fork(); break;
    }
    return BUFFET_PASS;
}
"#,
        &[],
    ));
    let mut got: Vec<String> = f
        .iter()
        .map(|f| match f {
            Finding::Import { symbol } => symbol.clone(),
            other => panic!("{other}"),
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "_exit",
            "abort",
            "dlopen",
            "exit",
            "fork",
            "mprotect",
            "pthread_create",
            "signal",
            "syscall"
        ]
    );
    assert_eq!(
        f.iter()
            .find(|f| matches!(f, Finding::Import { symbol } if symbol == "exit"))
            .unwrap()
            .to_string(),
        "import `exit` is not on the allowlist (buffet_cnf::inspect::ALLOWED_IMPORTS)"
    );
}

/// Memory: a tenant's region is its memory. No allocator is on the allowlist, so an NF
/// that would obtain memory any other way is refused before it runs.
#[test]
fn an_nf_cannot_import_a_way_to_more_memory() {
    let f = refused(&variant(
        "memory",
        r#"
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
static void *keep[8];
buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *s, size_t l) {
    (void)s, (void)l;
    keep[0] = malloc(pkt->len);
    keep[1] = calloc(pkt->len, 2);
    keep[2] = realloc(keep[2], pkt->len);
    keep[3] = mmap(0, 1 << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    keep[4] = sbrk(1 << 20);
    if (posix_memalign(&keep[5], 64, 4096) == 0) { keep[6] = aligned_alloc(64, 4096); }
    keep[7] = mremap(keep[3], 1 << 30, 1 << 31, MREMAP_MAYMOVE);
    return BUFFET_PASS;
}
"#,
        &["-D_GNU_SOURCE"],
    ));
    let mut got: Vec<String> = f.iter().map(ToString::to_string).collect();
    got.sort();
    for sym in [
        "aligned_alloc",
        "calloc",
        "malloc",
        "mmap",
        "mremap",
        "posix_memalign",
        "realloc",
        "sbrk",
    ] {
        assert!(!ALLOWED_IMPORTS.contains(&sym));
        assert!(
            got.iter().any(|l| l.contains(&format!("`{sym}`"))),
            "{sym}: {got:?}"
        );
    }
}

#[test]
fn writable_executable_segments_and_executable_stacks_are_refused() {
    let f = refused(&variant(
        "wx",
        &format!(
            "{HANDLER}\n__attribute__((section(\".wxdata,\\\"awx\\\",@progbits#\"))) \
             unsigned char patchable[64] = {{0xc3}};"
        ),
        &[],
    ));
    assert!(
        f.iter()
            .any(|f| matches!(f, Finding::WritableExecutable { .. })),
        "{f:?}"
    );
    let f = refused(&variant("execstack", HANDLER, &["-Wl,-z,execstack"]));
    assert_eq!(f, [Finding::ExecutableStack { missing: false }]);
}

#[test]
fn thread_local_storage_ifuncs_and_other_libraries_are_refused() {
    let f = refused(&variant(
        "tls",
        r#"
static __thread unsigned long seen;
buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *s, size_t l) {
    (void)s, (void)l;
    seen += pkt->len;
    return BUFFET_PASS;
}
"#,
        &[],
    ));
    assert!(f.iter().any(|f| matches!(f, Finding::Tls { .. })), "{f:?}");
    let f = refused(&variant(
        "ifunc",
        r#"
static buffet_verdict pass(struct buffet_pkt *p, void *s, size_t l) {
    (void)p, (void)s, (void)l;
    return BUFFET_PASS;
}
typedef buffet_verdict (*handler)(struct buffet_pkt *, void *, size_t);
static handler choose(void) { return pass; }
buffet_verdict buffet_pkt_handler(struct buffet_pkt *, void *, size_t)
    __attribute__((ifunc("choose")));
"#,
        &[],
    ));
    assert!(
        f.contains(&Finding::Ifunc {
            symbol: "buffet_pkt_handler".into()
        }),
        "{f:?}"
    );
    let f = refused(&variant(
        "libm",
        r#"
#include <math.h>
buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *s, size_t l) {
    (void)s, (void)l;
    return cbrt((double)pkt->len) > 2.0 ? BUFFET_PASS : BUFFET_DROP_POLICY;
}
"#,
        &["-Wl,--no-as-needed", "-lm"],
    ));
    assert!(
        f.contains(&Finding::Library {
            tag: "DT_NEEDED",
            name: "libm.so.6".into()
        }),
        "{f:?}"
    );
    assert!(f.contains(&Finding::Import {
        symbol: "cbrt".into()
    }));
}

#[test]
fn a_file_that_is_not_a_shared_object_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nf.so");
    std::fs::write(&p, b"#!/bin/sh\necho not an NF\n").unwrap();
    let e = CNf::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("is not a shared object (not an ELF file)"),
        "{e}"
    );
    let e = inspect(Path::new("/nonexistent/nf.so"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot load C NF /nonexistent/nf.so: "),
        "{e}"
    );
}

/// The loader maps whole pages: bytes after an executable segment's end on its last page
/// (padding no section claims) are executable too, and are scanned. Plants WRPKRU there
/// in a copy of an accepted NF.
#[test]
fn wrpkru_in_the_padding_of_an_executable_page_is_refused() {
    let mut elf = std::fs::read(example_nf("portblock")).unwrap();
    let word = |at: usize, n: usize| {
        elf[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b))
    };
    let (phoff, phentsize, phnum) = (
        word(0x20, 8) as usize,
        word(0x36, 2) as usize,
        word(0x38, 2) as usize,
    );
    let exec = (0..phnum)
        .map(|i| phoff + i * phentsize)
        .find(|&ph| word(ph, 4) == 1 && word(ph + 4, 4) & 1 != 0)
        .expect("an executable PT_LOAD");
    let end = (word(exec + 8, 8) + word(exec + 32, 8)) as usize;
    let page_end = (end + 4095) & !4095;
    assert!(page_end - end >= 3, "no padding after the code to plant in");
    assert!(elf[end..end + 3].iter().all(|&b| b == 0));
    elf[end..end + 3].copy_from_slice(&[0x0f, 0x01, 0xef]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("padded.so");
    std::fs::write(&path, &elf).unwrap();
    let f = refused(&path);
    assert_eq!(f, [Finding::Wrpkru { offset: end as u64 }]);
}
