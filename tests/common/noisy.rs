//! The noisy-neighbour run (docs/robustness.md, "Noisy neighbours"), shared by
//! `tests/noisy.rs` and `benches/noisy.rs`: 8 tenants on 2 workers, each a one-stage
//! chain of the tenants file, fed at a fixed offered load by a live, paced port that
//! also measures each packet's latency (from its due time to its transmission).
//!
//! * tenants 1, 2, 6, 7, 8: well-behaved (monitor or firewall, 2,000 packets/s each,
//!   64-byte payloads);
//! * tenant 3 floods: 10× its MAX_NB per timeslot (policed by the Packet Dispatcher);
//! * tenant 4 runs the IDS with 1,024 signatures (its registered maximum) over 1,400-byte payloads (half the
//!   signatures `nocase`, so both of its automata scan);
//! * tenant 5 runs a verified eBPF program (`examples/ebpf/loops.c`, JIT) that walks every
//!   byte of its 1,400-byte payloads, with a cost budget 5 % above what one of its packets
//!   spends (found by bisection on the program itself before the run).
//!
//! Tenants are placed alternately (1, 3, 5, 7 on worker 0; 2, 4, 6, 8 on worker 1), so
//! each worker has two noisy tenants and two or three well-behaved ones. "Alone" is the
//! same configuration, the same tenants admitted, with only the well-behaved tenants
//! sending.
//!
//! This module runs nothing by itself; it needs clang to build the eBPF program (the
//! callers skip without it).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use buffet::config::chain::{self, Chain};
use buffet::config::tenants::{self, Format};
use buffet::dispatch::{DispatcherConfig, SchedulerConfig, TenantSlot};
use buffet::ebpf::{EbpfNf, EbpfPolicy, EbpfState, Engine, LoadOptions};
use buffet::io::{HeapPool, Outcome as FrameOutcome, PacketBuf, Port, PortError, PortStats, Rx};
use buffet::sdk::{NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{Pipeline, PipelineConfig, Report};
use etherparse::PacketBuilder;

/// The well-behaved tenants.
pub const WELL: [u32; 5] = [1, 2, 6, 7, 8];
/// The tenant that floods at 10× its MAX_NB.
pub const FLOOD: u32 = 3;
/// The tenant running the IDS with thousands of signatures.
pub const IDS: u32 = 4;
/// The tenant running a verified eBPF program at its cost budget.
pub const EBPF: u32 = 5;

/// Timeslot shift: 2^24 ns, about 16.8 ms.
pub const SHIFT: u32 = 24;
/// The flooder's MAX_NB per timeslot.
pub const FLOOD_MAX_NB: u64 = 20;
/// Packets per second of each well-behaved tenant.
pub const WELL_PPS: u64 = 2_000;
/// The IDS tenant's packets per second.
pub const IDS_PPS: u64 = 2_000;
/// The eBPF tenant's packets per second.
pub const EBPF_PPS: u64 = 1_000;
/// IDS signatures: the most the IDS registers.
pub const SIGNATURES: usize = 1_024;

/// The flooder's packets per second: 10× what its MAX_NB lets through.
pub fn flood_pps() -> u64 {
    10 * FLOOD_MAX_NB * 1_000_000_000 / (1u64 << SHIFT)
}

/// Everything a run needs: the tenants file and the eBPF tenant's budget.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    pub text: String,
    /// The least budget at which one packet of the eBPF tenant runs to the end.
    pub ebpf_cost: u64,
    /// The budget the eBPF tenant gets.
    pub ebpf_budget: u64,
}

/// One tenant's frame: UDP to 10.0.t.1, `payload` bytes of text.
pub fn frame(t: u32, payload: usize) -> Vec<u8> {
    let body: Vec<u8> = (0..payload)
        .map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789 /.-"[(i * 7 + t as usize) % 40])
        .collect();
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([192, 168, 0, 1], [10, 0, t as u8, 1], 64)
        .udp(1000 + t as u16, 5000)
        .write(&mut v, &body)
        .unwrap();
    v
}

fn payload(t: u32) -> usize {
    if t == IDS || t == EBPF {
        1400
    } else {
        64
    }
}

/// Compiles `examples/ebpf/loops.c` into `dir`; `Err` when clang is missing or fails.
fn compile_loops(dir: &Path) -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join("loops.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let r = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-I",
        ])
        .arg(root.join("crates/buffet-ebpf/include"))
        .arg("-c")
        .arg(root.join("examples/ebpf/loops.c"))
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("cannot run `{clang}`: {e}"))?;
    if !r.status.success() {
        return Err(String::from_utf8_lossy(&r.stderr).into_owned());
    }
    Ok(out)
}

/// Whether one packet of the eBPF tenant runs to the end within `budget`.
fn fits(nf: &EbpfNf, budget: u64) -> bool {
    let p = EbpfPolicy {
        cost_budget: Some(budget),
        ..EbpfPolicy::default()
    };
    let mut st = EbpfState::default();
    nf.init(&p, &mut st).unwrap();
    let mut b = frame(EBPF, payload(EBPF));
    let meta = PacketMeta {
        tenant: TenantId(EBPF),
        ..PacketMeta::default()
    };
    nf.handle(&mut Packet::parse(&mut b, meta).unwrap(), &mut st) != Verdict::Fault
}

/// Builds the eBPF program, finds its cost per packet and writes the tenants file; `Err`
/// names what is missing (clang).
pub fn setup() -> Result<Setup, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let obj = compile_loops(dir.path())?;
    let nf = EbpfNf::from_file(
        &obj,
        LoadOptions {
            engine: Engine::Jit,
            ..LoadOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    // Bisection: the least budget a packet fits in.
    let (mut lo, mut hi) = (1u64, 1u64 << 24);
    assert!(fits(&nf, hi), "loops.c does not fit in {hi} units");
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(&nf, mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let ebpf_cost = lo;
    let ebpf_budget = ebpf_cost + ebpf_cost / 20;
    let rules: String = (0..SIGNATURES)
        .map(|i| {
            format!(
                "alert udp any any (msg:\"s{i}\"; content:\"sig{i:05}-evil\";{} sid:{};)\n",
                if i % 2 == 0 { " nocase;" } else { "" },
                i + 1
            )
        })
        .collect();
    let rule = |t: u32| format!("rules = [ {{ dst_ip = \"10.0.{t}.0/24\" }} ]");
    let mut text = String::new();
    for t in 1..=8u32 {
        text += &format!("[[tenant]]\nid = {t}\nname = \"t{t}\"\n{}\n", rule(t));
        if t == FLOOD {
            text += &format!("max_nb = {FLOOD_MAX_NB}\n");
        }
        text += "[[tenant.chain]]\n";
        match t {
            FLOOD | 1 | 6 | 8 => text += "nf = \"monitor\"\n",
            2 | 7 => {
                text += "nf = \"firewall\"\n\
                         policy = { default = \"allow\", rules = [ { action = \"deny\", proto = \"tcp\", dst_port = 23 } ] }\n"
            }
            IDS => text += &format!("nf = \"ids\"\n[tenant.chain.policy]\nrules = '''\n{rules}'''\n"),
            EBPF => {
                text += &format!(
                    "nf = \"ebpf+jit:{}\"\npolicy = {{ cost_budget = {ebpf_budget} }}\n",
                    obj.display()
                )
            }
            _ => unreachable!(),
        }
        text += "\n";
    }
    let file = dir.path().join("noisy.toml");
    std::fs::write(&file, &text).map_err(|e| e.to_string())?;
    Ok(Setup {
        dir,
        file,
        text,
        ebpf_cost,
        ebpf_budget,
    })
}

/// The pipeline configuration of both runs.
pub fn config() -> PipelineConfig {
    PipelineConfig {
        workers: 2,
        pin: false,
        ring_size: 4096,
        burst: 64,
        flush_packets: 32,
        flush_ns: 50_000,
        dispatcher: DispatcherConfig {
            sched: SchedulerConfig {
                shift: SHIFT,
                threshold: 3,
            },
            ..DispatcherConfig::default()
        },
        ..PipelineConfig::default()
    }
}

/// What a run measured.
pub struct Outcome {
    pub report: Report,
    /// Packets the port offered, by tenant.
    pub offered: BTreeMap<u32, u64>,
    /// Latencies (ns) of the packets transmitted, by tenant.
    pub latencies: BTreeMap<u32, Vec<u64>>,
    /// Seconds the run took.
    pub secs: f64,
}

impl Outcome {
    /// Packets of tenant `t` its NF passed.
    pub fn passed(&self, t: u32) -> u64 {
        self.tenant(t).passed
    }

    /// Tenant `t`'s line of the report.
    pub fn tenant(&self, t: u32) -> &buffet::worker::TenantReport {
        self.report
            .tenants
            .iter()
            .find(|r| r.id.0 == t)
            .expect("every tenant is reported")
    }

    /// The `q` quantile (0..=1) of the latencies of `tenants`' packets, in µs.
    pub fn latency_us(&self, tenants: &[u32], q: f64) -> f64 {
        let mut all: Vec<u64> = tenants
            .iter()
            .flat_map(|t| self.latencies.get(t).into_iter().flatten().copied())
            .collect();
        all.sort_unstable();
        if all.is_empty() {
            return 0.0;
        }
        let i = ((all.len() - 1) as f64 * q).round() as usize;
        all[i] as f64 / 1e3
    }

    /// Cycles per packet of tenant `t`'s NF work.
    pub fn cycles_per_packet(&self, t: u32) -> f64 {
        let r = self.tenant(t);
        r.cycles as f64 / r.packets.max(1) as f64
    }
}

/// Runs the 8 tenants for `secs` seconds of offered load: with `noisy`, every tenant
/// sends; without, only the well-behaved ones.
pub fn run(setup: &Setup, noisy: bool, secs: f64) -> Outcome {
    let tenants = tenants::parse(Format::Toml, &setup.file, &setup.text).unwrap();
    let level = chain::resolve_level(None, None, &tenants, &setup.file).unwrap();
    let c = Chain::new()
        .load_stages(&tenants, level, &setup.file)
        .unwrap();
    c.check_tenants(&tenants, &setup.file).unwrap();
    let chained = chain::chained_tenants(&tenants);
    let mut p = Pipeline::new(c, config()).unwrap();
    buffet::cli::run::admit_all(&mut p, &chained, &setup.file).unwrap();
    let mut flows: Vec<Flow> = WELL.iter().map(|&t| Flow::new(t, WELL_PPS)).collect();
    if noisy {
        flows.push(Flow::new(FLOOD, flood_pps()));
        flows.push(Flow::new(IDS, IDS_PPS));
        flows.push(Flow::new(EBPF, EBPF_PPS));
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t0 = Instant::now();
    p.add_port(Box::new(Paced {
        origin: Instant::now(),
        end_ns: (secs * 1e9) as u64,
        flows,
        tally: tally.clone(),
        stats: PortStats::default(),
    }));
    p.run(|_| {}).unwrap();
    let report = p.finish();
    let secs = t0.elapsed().as_secs_f64();
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    Outcome {
        report,
        offered: tally.offered,
        latencies: tally.latencies,
        secs,
    }
}

struct Flow {
    tenant: u32,
    frame: Vec<u8>,
    pps: u64,
    sent: u64,
}

impl Flow {
    fn new(tenant: u32, pps: u64) -> Flow {
        Flow {
            tenant,
            frame: frame(tenant, payload(tenant)),
            pps,
            sent: 0,
        }
    }

    /// When packet `k` of this flow is due (ns from the start).
    fn due(&self, k: u64) -> u64 {
        k * 1_000_000_000 / self.pps
    }
}

#[derive(Default)]
struct Tally {
    offered: BTreeMap<u32, u64>,
    latencies: BTreeMap<u32, Vec<u64>>,
}

/// A live port that offers each flow at its rate and records, for each packet sent back
/// out, the time from when it was due to now.
struct Paced {
    origin: Instant,
    end_ns: u64,
    flows: Vec<Flow>,
    tally: Arc<Mutex<Tally>>,
    stats: PortStats,
}

impl Port for Paced {
    fn name(&self) -> String {
        "paced".into()
    }

    fn rx_burst(
        &mut self,
        pool: &mut HeapPool,
        out: &mut Vec<PacketBuf>,
        max: usize,
    ) -> Result<Rx, PortError> {
        let now = (self.origin.elapsed().as_nanos() as u64).min(self.end_ns);
        let mut n = 0;
        let mut tally = self.tally.lock().unwrap();
        loop {
            // The flow whose next packet is due first, if any is due.
            let next = self
                .flows
                .iter_mut()
                .filter(|f| f.due(f.sent) < now)
                .min_by_key(|f| f.due(f.sent));
            let Some(f) = next else { break };
            if n == max {
                break;
            }
            let due = f.due(f.sent);
            f.sent += 1;
            *tally.offered.entry(f.tenant).or_default() += 1;
            self.stats.rx += 1;
            let Some(mut m) = pool.take() else {
                self.stats.rx_dropped += 1;
                continue;
            };
            m.fill(&f.frame);
            m.ts_ns = due;
            m.in_port = 0;
            m.tenant = TenantSlot(0);
            m.outcome = FrameOutcome::Pending;
            out.push(m);
            n += 1;
        }
        let ended = now >= self.end_ns && self.flows.iter().all(|f| f.due(f.sent) >= now);
        Ok(match (n, ended) {
            (0, true) => Rx::End,
            (0, false) => Rx::Idle,
            (n, _) => Rx::Packets(n),
        })
    }

    fn tx_burst(
        &mut self,
        pkts: &mut Vec<PacketBuf>,
        pool: &mut HeapPool,
    ) -> Result<(), PortError> {
        let now = self.origin.elapsed().as_nanos() as u64;
        let mut tally = self.tally.lock().unwrap();
        for m in pkts.drain(..) {
            let t = u32::from(m.data()[32]);
            tally
                .latencies
                .entry(t)
                .or_default()
                .push(now.saturating_sub(m.ts_ns));
            self.stats.tx += 1;
            pool.give(m);
        }
        Ok(())
    }

    fn is_live(&self) -> bool {
        true
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
