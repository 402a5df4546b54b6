//! Fuzz target: buffet-ebpf's ELF loader and verifier over arbitrary objects.
//!
//! The input is an object file. `buffet_ebpf::check` reads it (section `buffet`), links
//! its bpf-to-bpf calls and maps and runs PREVAIL on it within a one-second budget; a
//! program it accepts is then run, by the interpreter and by the JIT, over a few frames
//! as one tenant's NF. Every bad object must be an `Err`; nothing may panic or crash.
//!
//! Inputs above 8 KiB are skipped: PREVAIL's time grows much faster than the program's
//! length, and the per-input budget keeps libFuzzer's throughput at small programs.
//! A panic inside PREVAIL is contained by the verifier's own thread (it becomes
//! `VerifyError::Internal`); the panic hook lets that one unwind, and aborts on every
//! other panic as libFuzzer's does.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use buffet_ebpf::verify::VerifierConfig;
use buffet_ebpf::{check, EbpfNf, EbpfPolicy, Engine, LoadOptions, Program};
use buffet_sdk::{NetworkFunction, Packet, PacketMeta, TenantId};
use libfuzzer_sys::fuzz_target;

const MAX_INPUT: usize = 8 * 1024;

fn frames() -> Vec<Vec<u8>> {
    let mut udp = vec![0u8; 14 + 20 + 8 + 16];
    udp[12..14].copy_from_slice(&[0x08, 0x00]);
    udp[14..24].copy_from_slice(&[0x45, 0, 0, 44, 0, 0, 0, 0, 64, 17]);
    udp[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 1, 0, 2]);
    udp[34..42].copy_from_slice(&[0x30, 0x39, 0, 53, 0, 24, 0, 0]);
    let mut tcp = vec![0u8; 14 + 20 + 20];
    tcp[12..14].copy_from_slice(&[0x08, 0x00]);
    tcp[14..24].copy_from_slice(&[0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6]);
    tcp[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 1, 0, 2]);
    tcp[34..38].copy_from_slice(&[0x30, 0x39, 0, 80]);
    tcp[46] = 0x50;
    vec![udp, tcp, vec![0xff; 60]]
}

fuzz_target!(
    init: {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some("buffet-verify") {
                eprintln!("contained verifier panic: {info}");
            } else {
                abort(info);
            }
        }));
    },
    |data: &[u8]| {
        if data.len() > MAX_INPUT {
            return;
        }
        for engine in [Engine::Interpreter, Engine::Jit] {
            let opts = LoadOptions {
                section: None,
                engine,
                verifier: VerifierConfig {
                    time_budget: Duration::from_secs(1),
                    ..VerifierConfig::default()
                },
            };
            let Ok(report) = check(data, &opts) else {
                return;
            };
            assert!(report.image.len() == report.verified.instructions);
            let Ok(program) = Program::from_image(report.image, &opts) else {
                return;
            };
            let nf = EbpfNf::with_program(Arc::new(program), opts);
            let mut state = <EbpfNf as NetworkFunction>::State::default();
            if nf.init(&EbpfPolicy::default(), &mut state).is_err() {
                return;
            }
            for (i, mut frame) in frames().into_iter().enumerate() {
                let meta = PacketMeta {
                    in_port: 0,
                    ts_ns: i as u64,
                    tenant: TenantId(1),
                };
                if let Ok(mut pkt) = Packet::parse(&mut frame, meta) {
                    let _ = nf.handle(&mut pkt, &mut state);
                }
            }
        }
    }
);
