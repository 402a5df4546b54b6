//! The authoring examples (`examples/ebpf/`): compiled with clang, verified, and run on
//! both engines with the same results — the loop shapes PREVAIL accepts, the programs it
//! rejects with the message an author sees, the DNS blocklist (DNS-name lookup, scratch
//! memory, STRSET normalisation), and the cost-budget attack.
//!
//! Without clang these tests print `skipped: ...` and pass, unless `CI=true` or
//! `BUFFET_REQUIRE_PRIVILEGED=1`: then a missing clang is a failure.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet_ebpf::{EbpfNf, EbpfPolicy, EbpfState, Engine, LoadOptions, MapInit, Program};
use buffet_sdk::{NetworkFunction, Packet, PacketMeta, TenantId, Verdict};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The object of `examples/ebpf/<name>.c`; `None` (test skipped) without clang.
fn object(name: &str) -> Option<Vec<u8>> {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ebpf-examples");
    std::fs::create_dir_all(&dir).unwrap();
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = dir.join(format!("{name}.{}.{seq}.o", std::process::id()));
    let r = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-I",
        ])
        .arg(root().join("crates/buffet-ebpf/include"))
        .arg("-c")
        .arg(root().join(format!("examples/ebpf/{name}.c")))
        .arg("-o")
        .arg(&out)
        .output();
    match r {
        Ok(r) if r.status.success() => {
            let bytes = std::fs::read(&out).unwrap();
            let _ = std::fs::remove_file(&out);
            Some(bytes)
        }
        Ok(r) => panic!(
            "{clang} failed on {name}.c:\n{}",
            String::from_utf8_lossy(&r.stderr)
        ),
        Err(e) => {
            let required = std::env::var("CI").is_ok_and(|v| v == "true")
                || std::env::var("BUFFET_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
            assert!(!required, "cannot run `{clang}`: {e}");
            eprintln!("skipped: cannot run `{clang}`: {e}");
            None
        }
    }
}

/// The object of `examples/ebpf/<name>.c` as a file, for a policy's `program`; `None`
/// (test skipped) without clang.
fn object_file(name: &str) -> Option<PathBuf> {
    let bytes = object(name)?;
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("ebpf-examples")
        .join(format!("{name}.{}.policy.o", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    Some(path)
}

fn engines() -> Vec<Engine> {
    if cfg!(all(target_arch = "x86_64", unix)) {
        vec![Engine::Interpreter, Engine::Jit]
    } else {
        vec![Engine::Interpreter]
    }
}

fn nf(obj: &[u8], engine: Engine) -> EbpfNf {
    let opts = LoadOptions {
        engine,
        ..LoadOptions::default()
    };
    EbpfNf::from_elf(obj, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn tenant(nf: &EbpfNf, policy: &EbpfPolicy) -> EbpfState {
    let mut st = EbpfState::default();
    nf.init(policy, &mut st).unwrap_or_else(|e| panic!("{e}"));
    st
}

fn run(nf: &EbpfNf, st: &mut EbpfState, frame: &[u8], tenant: u32) -> Verdict {
    let mut b = frame.to_vec();
    let meta = PacketMeta {
        tenant: TenantId(tenant),
        ..PacketMeta::default()
    };
    nf.handle(&mut Packet::parse(&mut b, meta).unwrap(), st)
}

fn udp(dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .udp(4000, dst_port)
        .write(&mut v, payload)
        .unwrap();
    v
}

/// A DNS query for `name` (presentation form), or with the raw name bytes given.
fn dns_query_raw(qname: &[u8]) -> Vec<u8> {
    let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(qname);
    p.extend_from_slice(&[0, 1, 0, 1]);
    udp(53, &p)
}

fn dns_query(name: &str) -> Vec<u8> {
    let mut q = Vec::new();
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    dns_query_raw(&q)
}

fn counters(nf: &EbpfNf, st: &EbpfState) -> Vec<(&'static str, u64)> {
    nf.summary(st)
}

#[test]
fn every_loop_shape_in_the_docs_verifies_and_counts_alike_on_both_engines() {
    let Some(obj) = object("loops") else { return };
    let mut frame = udp(9, &[0x45; 40]);
    frame[0] = 0x45;
    let want_total = frame.iter().filter(|&&b| b == 0x45).count() as u64;
    let want_64 = frame[..64].iter().filter(|&&b| b == 0x45).count() as u64;
    let want_16 = frame[..16].iter().filter(|&&b| b == 0x45).count() as u64;
    for engine in engines() {
        let nf = nf(&obj, engine);
        let v = nf.program().verified();
        assert!(v.max_loop_count <= 65_536, "{v:?}");
        let mut st = tenant(&nf, &EbpfPolicy::default());
        assert_eq!(run(&nf, &mut st, &frame, 1), Verdict::Pass);
        assert_eq!(
            counters(&nf, &st),
            vec![
                ("counted", want_64),
                ("to_end", want_total),
                ("unrolled", want_16),
                ("helper", 1),
                ("faults", 0)
            ],
            "{engine:?}"
        );
    }
}

fn rejected(name: &str) -> Option<String> {
    let obj = object(name)?;
    Some(
        Program::load(&obj, &LoadOptions::default())
            .expect_err("the verifier must reject it")
            .to_string(),
    )
}

#[test]
fn what_authors_hit_is_rejected_with_the_documented_message() {
    let Some(stack) = rejected("reject_stack") else {
        return;
    };
    println!("reject_stack: {stack}");
    let Some(unbounded) = rejected("reject_loop") else {
        return;
    };
    assert!(
        stack.contains("Lower bound must be at least r10.stack_offset - subprogram_stack_size"),
        "{stack}"
    );
    assert!(
        unbounded.contains("Loop counter is too large"),
        "{unbounded}"
    );
}

fn blocklist_policy(names: &[&str]) -> EbpfPolicy {
    let mut p = EbpfPolicy::default();
    p.maps.insert(
        "blocked".into(),
        MapInit {
            strings: Some(names.iter().map(|s| s.to_string()).collect()),
            ..MapInit::default()
        },
    );
    p
}

#[test]
fn the_dns_blocklist_verifies_and_blocks_names_and_subdomains_on_both_engines() {
    let Some(obj) = object("dns_blocklist") else {
        return;
    };
    let cases: [(Vec<u8>, Verdict); 9] = [
        (
            dns_query("ads.example"),
            Verdict::Drop(buffet_sdk::DropCause::Policy),
        ),
        (
            dns_query("x.y.ADS.example"),
            Verdict::Drop(buffet_sdk::DropCause::Policy),
        ),
        (
            dns_query("tracker.net"),
            Verdict::Drop(buffet_sdk::DropCause::Policy),
        ),
        (dns_query("notads.example"), Verdict::Pass),
        (dns_query("example"), Verdict::Pass),
        (dns_query_raw(&[0]), Verdict::Pass),
        (
            dns_query_raw(&[0xc0, 0x0c]),
            Verdict::Drop(buffet_sdk::DropCause::Malformed),
        ),
        (
            dns_query_raw(&[9, b'a']),
            Verdict::Drop(buffet_sdk::DropCause::Malformed),
        ),
        (
            udp(
                54,
                b"\x00\x00\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03ads\x07example\x00",
            ),
            Verdict::Pass,
        ),
    ];
    let mut results = Vec::new();
    for engine in engines() {
        let nf = nf(&obj, engine);
        // Stored as the native NFs compare names: case and one trailing dot ignored.
        let mut st = tenant(&nf, &blocklist_policy(&["ADS.example.", "Tracker.NET"]));
        let got: Vec<Verdict> = cases.iter().map(|(f, _)| run(&nf, &mut st, f, 1)).collect();
        let want: Vec<Verdict> = cases.iter().map(|(_, v)| *v).collect();
        assert_eq!(got, want, "{engine:?}");
        let c = counters(&nf, &st);
        assert_eq!(
            c,
            vec![
                ("queries", 8),
                ("blocked", 3),
                ("malformed", 2),
                ("faults", 0)
            ],
            "{engine:?}"
        );
        let hits = nf.map_bytes(&st, "hits").unwrap();
        let hit = |i: usize| u64::from_le_bytes(hits[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!((hit(0), hit(1)), (2, 1), "{engine:?}");
        results.push((got, c));
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn scratch_memory_is_zeroed_before_every_packet_and_no_policy_fills_it() {
    let Some(obj) = object("dns_blocklist") else {
        return;
    };
    let nf = nf(&obj, Engine::Interpreter);
    let mut st = tenant(&nf, &blocklist_policy(&["a.b"]));
    run(&nf, &mut st, &dns_query("x.a.b"), 1);
    // The program copied the DNS header into scratch; the next run starts from zeros.
    assert!(nf.map_bytes(&st, "tmp").unwrap()[..12]
        .iter()
        .any(|&b| b != 0));
    let mut p = blocklist_policy(&["a.b"]);
    p.maps.insert(
        "tmp".into(),
        MapInit {
            u8: Some(vec![1]),
            ..MapInit::default()
        },
    );
    let mut st2 = EbpfState::default();
    let e = nf.init(&p, &mut st2).unwrap_err().to_string();
    assert!(e.contains("SCRATCH"), "{e}");
}

#[test]
fn cost_amplification_is_stopped_by_the_budget_on_both_engines_and_victims_carry_on() {
    let Some(attack) = object("cost_attack") else {
        return;
    };
    let Some(dns) = object("dns_blocklist") else {
        return;
    };
    let mut big = vec![b'a'; 2000];
    for i in (0..2000).step_by(2) {
        big[i] = b'.';
    }
    // Dots make every lookup expensive (one probe per suffix): stopped at the first.
    // Without dots a lookup is cheap: about 250 iterations run before the budget is spent.
    let frames = [udp(9, &big), udp(9, &[b'a'; 2000])];
    for engine in engines() {
        let attacker = nf(&attack, engine);
        let mut names = EbpfPolicy::default();
        names.maps.insert(
            "names".into(),
            MapInit {
                strings: Some(vec!["zzz".into()]),
                ..MapInit::default()
            },
        );
        let mut evil = tenant(&attacker, &names);
        let victim_nf = nf(&dns, engine);
        let mut victims: Vec<EbpfState> = (0..3)
            .map(|_| tenant(&victim_nf, &blocklist_policy(&["ads.example"])))
            .collect();
        let t = Instant::now();
        for round in 0..6 {
            assert_eq!(
                run(&attacker, &mut evil, &frames[round % 2], 9),
                Verdict::Fault,
                "{engine:?}"
            );
            for (i, v) in victims.iter_mut().enumerate() {
                assert_eq!(
                    run(&victim_nf, v, &dns_query("ads.example"), i as u32),
                    Verdict::Drop(buffet_sdk::DropCause::Policy),
                    "{engine:?} round {round}"
                );
            }
        }
        let took = t.elapsed();
        assert!(took < Duration::from_secs(5), "{engine:?}: {took:?}");
        let fault = evil.last_fault().unwrap().to_owned();
        assert!(fault.contains("cost budget exceeded"), "{fault}");
        assert_eq!(evil.faults(), 6);
        for v in &victims {
            assert_eq!(
                counters(&victim_nf, v),
                vec![
                    ("queries", 6),
                    ("blocked", 6),
                    ("malformed", 0),
                    ("faults", 0)
                ]
            );
        }
        println!("{engine:?}: 6 attack packets + 18 victim packets in {took:?}; {fault}");
        // A tenant may choose a smaller budget; 0 is refused.
        let mut tiny = names.clone();
        tiny.cost_budget = Some(1);
        let mut st = tenant(&attacker, &tiny);
        assert_eq!(st.cost_budget(), 1);
        assert_eq!(run(&attacker, &mut st, &udp(9, b"x"), 9), Verdict::Fault);
        tiny.cost_budget = Some(0);
        assert!(attacker.init(&tiny, &mut EbpfState::default()).is_err());
    }
    let _ = Arc::new(());
}

#[test]
fn verification_runs_off_the_calling_thread_within_its_time_budget() {
    use buffet_ebpf::verify::{VerifierConfig, VerifyError};
    let Some(slow) = object("loops") else { return };
    let Some(dns) = object("dns_blocklist") else {
        return;
    };
    let victim = nf(&dns, Engine::Interpreter);
    let mut st = tenant(&victim, &blocklist_policy(&["ads.example"]));
    // An admission with a budget far below what this program needs (loops up to 65,535).
    let budget = Duration::from_millis(5);
    let admission = std::thread::spawn(move || {
        let opts = LoadOptions {
            verifier: VerifierConfig {
                time_budget: budget,
                // Part of the verdict's cache key: not the settings other tests verify
                // this program with, so this verification is not served from the cache.
                max_loop_iterations: 99_999,
                ..VerifierConfig::default()
            },
            ..LoadOptions::default()
        };
        let t = Instant::now();
        let r = Program::load(&slow, &opts);
        (r.map(|_| ()), t.elapsed())
    });
    // Meanwhile another tenant's packets keep being processed.
    let mut served = 0u64;
    while !admission.is_finished() {
        assert_eq!(
            run(&victim, &mut st, &dns_query("ads.example"), 1),
            Verdict::Drop(buffet_sdk::DropCause::Policy)
        );
        served += 1;
    }
    let (r, took) = admission.join().unwrap();
    let e = r.expect_err("over its time budget");
    assert!(
        matches!(
            e,
            buffet_ebpf::ProgramError::Verify(VerifyError::TimeBudget { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("time budget of 5 ms"), "{e}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(served > 0);
    // With the default budget it verifies; the verdict is then cached by program hash.
    let Some(slow) = object("loops") else { return };
    let t = Instant::now();
    Program::load(&slow, &LoadOptions::default()).unwrap();
    let first = t.elapsed();
    let t = Instant::now();
    Program::load(&slow, &LoadOptions::default()).unwrap();
    let second = t.elapsed();
    assert!(buffet_ebpf::verify::cached_verdicts() >= 1);
    println!("verified in {first:?}, then from the cache in {second:?}; {served} packets served meanwhile");
}

#[test]
fn instructions_count_against_the_budget_alike_on_both_engines() {
    let Some(obj) = object("loops") else { return };
    // A full-size frame: loop 1 runs once per byte, with no helper call in it.
    let frame = udp(9, &[0x45; 1400]);
    let mut seen = Vec::new();
    for budget in [50u64, 500, 5_000, 1_000_000] {
        let mut per_engine = Vec::new();
        for engine in engines() {
            let nf = nf(&obj, engine);
            let p = EbpfPolicy {
                cost_budget: Some(budget),
                ..EbpfPolicy::default()
            };
            let mut st = tenant(&nf, &p);
            let v = run(&nf, &mut st, &frame, 1);
            let fault = st.last_fault().map(str::to_owned);
            per_engine.push((v, counters(&nf, &st), fault));
        }
        assert!(
            per_engine.windows(2).all(|w| w[0] == w[1]),
            "budget {budget}: {per_engine:#?}"
        );
        seen.push(per_engine.remove(0));
    }
    // Small budgets stop the program inside its loops; a large one lets it finish.
    assert_eq!(seen[0].0, Verdict::Fault);
    assert!(seen[0]
        .2
        .as_deref()
        .unwrap()
        .contains("cost budget exceeded"));
    assert_eq!(seen[3].0, Verdict::Pass, "{:?}", seen[3]);
    // Counters written before the stop are the same on both engines (checked above)
    // and grow with the budget.
    let done =
        |s: &(Verdict, Vec<(&str, u64)>, Option<String>)| s.1.iter().filter(|c| c.1 != 0).count();
    assert!(done(&seen[0]) <= done(&seen[3]));
}

/// A tenant's region is a heap buffer the size of its program's region, bounded by the
/// Memory Manager only through the bytes the NF reserves per tenant: its own program's
/// region. A tenant program that needs more is refused at admission with both sizes, its
/// state untouched; one that needs no more is admitted.
#[test]
fn a_tenant_program_needing_more_than_the_nf_reserves_is_refused() {
    let (Some(counter), Some(dpi), Some(fault)) =
        (object("counter"), object_file("dpi"), object_file("fault"))
    else {
        return;
    };
    let nf = nf(&counter, Engine::Interpreter);
    let reserved = nf.program().region_len();
    assert_eq!(
        nf.register().bytes,
        std::mem::size_of::<EbpfState>() + reserved
    );
    let big = EbpfNf::from_file(&dpi, LoadOptions::default())
        .unwrap()
        .program()
        .region_len();
    assert!(big > reserved, "dpi.o: {big} bytes, counter.o: {reserved}");

    let mut st = EbpfState::default();
    let e = nf
        .init(
            &EbpfPolicy {
                program: Some(dpi),
                ..EbpfPolicy::default()
            },
            &mut st,
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("invalid policy field `program`: ")
            && msg.contains(&format!("needs {big} bytes per tenant"))
            && msg.contains(&format!("the {reserved} bytes the NF reserves")),
        "{msg}"
    );
    assert!(st.region().is_empty() && st.cost_budget() == 0);

    let st = tenant(
        &nf,
        &EbpfPolicy {
            program: Some(fault),
            ..EbpfPolicy::default()
        },
    );
    assert!(!st.region().is_empty() && st.region().len() <= reserved);
}
