//! An eBPF tenant over its per-packet cost budget is quarantined through the pipeline,
//! and the fault event says what the packet cost (instructions and helper work) and what
//! the budget was; the other tenants on the same program lose nothing.

use std::sync::Arc;

use buffet_dispatch::{DispatcherConfig, SchedulerConfig};
use buffet_ebpf::abi::{helper, ret};
use buffet_ebpf::elf::Image;
use buffet_ebpf::{EbpfNf, EbpfPolicy, LoadOptions, Program};
use buffet_sdk::TenantId;
use buffet_worker::{Pipeline, PipelineConfig, TenantSpec, WorkerEvent};

mod common;
use common::{plain_frame, spec_with};

fn ins(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = op;
    b[1] = dst | (src << 4);
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

/// 50 iterations of `counter_add(0, 1)`, then PASS: about 50 × (16 + 6) units a packet.
fn program() -> Arc<Program> {
    let code = [
        ins(0xb7, 6, 0, 0, 0), // r6 = 0
        ins(0xb7, 1, 0, 0, 0), // loop: r1 = 0 (counter)
        ins(0xb7, 2, 0, 0, 1), // r2 = 1
        ins(0x85, 0, 0, 0, helper::COUNTER_ADD),
        ins(0x07, 6, 0, 0, 1),   // r6 += 1
        ins(0xa5, 6, 0, -5, 50), // if r6 < 50 goto loop
        ins(0xb7, 0, 0, 0, ret::PASS as i32),
        ins(0x95, 0, 0, 0, 0),
    ];
    let image = Image {
        section: "buffet".into(),
        function: "cost".into(),
        insns: code.iter().flatten().copied().collect(),
        maps: Vec::new(),
        counter_names: vec!["calls".into()],
    };
    Arc::new(Program::from_image(image, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}")))
}

/// An eBPF tenant (see [`spec_with`]) with `cost_budget`.
fn spec(tenant: u32, cost_budget: Option<u64>) -> TenantSpec<EbpfPolicy> {
    spec_with(
        tenant,
        EbpfPolicy {
            cost_budget,
            ..EbpfPolicy::default()
        },
    )
}

#[test]
fn the_fault_event_carries_the_cost_and_the_budget() {
    let nf = EbpfNf::with_program(program(), LoadOptions::default());
    let cfg = PipelineConfig {
        workers: 2,
        pin: false,
        ring_size: 64,
        burst: 16,
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: 30,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = Pipeline::new(nf, cfg).unwrap();
    p.admit(spec(1, Some(100))).unwrap();
    for t in 2..=4 {
        p.admit(spec(t, None)).unwrap();
    }
    let rounds = 200u64;
    for r in 0..rounds {
        for t in 1..=4 {
            p.push(r, 0, &plain_frame(t));
        }
    }
    let report = p.finish();
    let faults: Vec<&WorkerEvent> = report
        .events
        .iter()
        .filter(|e| matches!(e, WorkerEvent::Fault { .. }))
        .collect();
    assert_eq!(faults.len(), 1, "{faults:?}");
    let WorkerEvent::Fault {
        tenant, message, ..
    } = faults[0]
    else {
        unreachable!()
    };
    assert_eq!(*tenant, TenantId(1));
    assert!(
        message.contains("cost budget exceeded: at least")
            && message.contains("units spent (instructions and helper work), the budget is 100"),
        "{message}"
    );
    let spent: u64 = message
        .split("at least ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(spent > 100, "{message}");
    for t in &report.tenants {
        assert_eq!(t.packets, rounds, "tenant {}", t.id);
        if t.id == TenantId(1) {
            assert!(t.quarantined);
            assert_eq!(t.passed, 0);
            assert_eq!(t.drops.get("quarantined"), Some(&rounds));
        } else {
            assert!(!t.quarantined);
            assert_eq!(t.passed, rounds, "tenant {}", t.id);
        }
    }
    println!("{message}");
}
